"""Barrier (paper 001, 4.1).  C runs each algorithm in one call; here we
plan the trees from the rank placement once per communicator.

  original      dual packed queues, rank 0 gathers and releases (id 0)
  padded        one padded queue, flat tree under rank 0 (id 1)
  hierarchical  node leader <- socket leaders <- children (id 2)
  all_to_all    every rank waits for every other's arrival, ranks sharing
                its CPUs first (id 3): one hand-off per CPU when oversubscribed
"""
from ..topology import oversubscribed

ALGORITHMS = ("original", "padded", "hierarchical", "all_to_all")


def plans(slots):
    """({alg id: (parent per rank, children per rank)}, mates per rank): the
    trees of padded and hierarchical, and all_to_all's wait order (as
    children) with its count of leading CPU mates."""
    n = len(slots)
    flat = ([-1] + [0] * (n - 1), [list(range(1, n))] + [[] for _ in range(n - 1)])
    leader = {}
    for r, s in enumerate(slots):
        leader.setdefault(s.socket, r)
    parents, children = [-1] * n, [[] for _ in range(n)]
    for r, s in enumerate(slots):
        up = leader[s.socket] if leader[s.socket] != r else (0 if r else -1)
        parents[r] = up
        if up >= 0:
            children[up].append(r)
    orders, mates = arrival_order(slots)
    return {1: flat, 2: (parents, children), 3: ([-1] * n, orders)}, mates


def arrival_order(slots):
    """Per rank, the ranks all_to_all waits for, and how many of them lead
    the list because they share a CPU with it: when they must take turns on
    it, they need it to arrive, so the rank yields to them; on the rest it
    spins.  Ranks with equal CPU sets share one neighbour set (planning
    stays quadratic in ints, not in set intersections)."""
    n = len(slots)
    ranks_of = {}
    for r, s in enumerate(slots):
        ranks_of.setdefault(s.cpus, set()).add(r)
    near_of = {a: set().union(*(rs for b, rs in ranks_of.items() if a & b)) for a in ranks_of}
    orders, mates = [], []
    for r, s in enumerate(slots):
        others = [(r + k) % n for k in range(1, n)]
        near = near_of[s.cpus]
        orders.append([o for o in others if o in near] + [o for o in others if o not in near])
        mates.append(len(near) - 1)
    return orders, mates


def choose(comm, nbytes=0):
    """Oversubscribed: all_to_all (one hand-off per CPU instead of two;
    measured 4 ranks on 2 cores: 2.4 vs 4.0 us padded).  Two ranks:
    all_to_all too, one cache-line hop each way instead of a gather and a
    release (0.13 vs 0.19 us).  Otherwise the paper's choice: hierarchical
    once ranks span sockets, else the padded queue (every rank reading
    every line does not scale with many running ranks)."""
    if comm.size == 2 or oversubscribed(comm.slots):
        return "all_to_all"
    return "hierarchical" if len({s.socket for s in comm.slots}) > 1 else "padded"
