"""Barrier (paper 001, 4.1).  C runs each algorithm in one call; here we
plan the trees from the rank placement once per communicator.

  original      dual packed queues, rank 0 gathers and releases (id 0)
  padded        one padded queue, flat tree under rank 0 (id 1)
  hierarchical  node leader <- socket leaders <- children (id 2)
  all_to_all    every rank waits for every other's arrival, ranks sharing
                its CPUs first (id 3): one hand-off per CPU when oversubscribed
"""
ALGORITHMS = ("original", "padded", "hierarchical", "all_to_all")


def trees(slots):
    """{alg id: (parent per rank, children per rank)} for the tree barriers."""
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
    return {1: flat, 2: (parents, children), 3: ([-1] * n, arrival_order(slots)[0])}


def arrival_order(slots):
    """Per rank, the ranks all_to_all waits for, and how many of them lead
    the list because they share a CPU with it (they need the CPU to arrive,
    so it yields to them; it spins on the rest)."""
    orders, mates = [], []
    n = len(slots)
    for r, s in enumerate(slots):
        others = [(r + k) % n for k in range(1, n)]
        near = [o for o in others if slots[o].cpus & s.cpus]
        orders.append(near + [o for o in others if o not in near])
        mates.append(len(near))
    return orders, mates


def choose(comm, nbytes=0):
    """Ranks sharing CPUs: all_to_all (one hand-off per CPU instead of two;
    measured 4 ranks on 2 cores: 2.4-2.9 vs 4.2 us padded).  Two ranks:
    all_to_all too, one cache-line hop each way instead of a gather and a
    release.  Otherwise the paper's choice: hierarchical once ranks span
    sockets, else the padded queue."""
    sockets = {s.socket for s in comm.slots}
    shared = len({s.cpus for s in comm.slots}) < comm.size
    if shared or comm.size == 2:
        return "all_to_all"
    return "hierarchical" if comm.size > 2 and len(sockets) > 1 else "padded"
