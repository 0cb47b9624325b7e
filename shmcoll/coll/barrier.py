"""Barrier (paper 001, 4.1): a gather phase up a tree, a release phase down
it, as signals (moves of no bytes).

  original      MVAPICH-1.1's dual packed queues: rank 0 polls every gather
                entry (false sharing included), then writes every release
  padded        one line per rank; flat tree under rank 0
  hierarchical  children -> socket leader -> rank 0, and back
  all_to_all    no tree: every rank signals its arrival and waits for all
                others', ranks sharing its CPUs first
"""
from ..sched import Move, Step
from ..topology import oversubscribed


def original(call):
    p = call.nranks
    return [Step([Move(r, (0,), via="queue", sbuf="gather") for r in range(1, p)]),
            Step([Move(0, tuple(range(1, p)), via="queue", sbuf="release")] if p > 1 else [])]


def padded(call):
    p = call.nranks
    return [Step([Move(r, (0,)) for r in range(1, p)]),
            Step([Move(0, tuple(range(1, p)))] if p > 1 else [])]


def hierarchical(call):
    """Rank 0 leads its socket and the leaders of the others."""
    leader = {}
    for r, s in enumerate(call.slots):
        leader.setdefault(s.socket, r)
    leader[call.slots[0].socket] = 0
    kids = {l: tuple(r for r, s in enumerate(call.slots) if leader[s.socket] == l and r != l)
            for l in leader.values()}
    heads = tuple(l for l in sorted(leader.values()) if l)
    return [Step([Move(r, (leader[s.socket],)) for r, s in enumerate(call.slots) if r != leader[s.socket]]),
            Step([Move(l, (0,)) for l in heads]),
            Step([Move(0, heads)] if heads else []),
            Step([Move(l, k) for l, k in kids.items() if k])]


def all_to_all(call):
    """With two ranks per CPU a tree costs each CPU two hand-offs per
    barrier; here whoever arrives last on a CPU sees everything itself.
    Waits go to the ranks sharing our CPUs first (they need the CPU to
    arrive, so we yield to them), then to the others, spinning long: by
    then no rank of ours needs this CPU.  No release phase: a rank already
    in a later call counts as arrived."""
    p = call.nranks
    orders, mates = arrival_order(call.slots)
    return [Step([Move(r, tuple(o for o in range(p) if o != r)) for r in range(p)],
                 order={r: orders[r] for r in range(p)},
                 far={r: frozenset(orders[r][mates[r]:]) for r in range(p)})]


ALGORITHMS = {"original": original, "padded": padded, "hierarchical": hierarchical, "all_to_all": all_to_all}


def arrival_order(slots):
    """Per rank, the ranks it waits for, and how many of them lead the
    list because they share a CPU with it.  Ranks with equal CPU sets share
    one neighbour set (planning stays quadratic in ints, not in set
    intersections)."""
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


def choose(call):
    """Oversubscribed: all_to_all (one hand-off per CPU instead of a
    tree's two; bench/README.md, "Figures moved out of coll/*.py").  Two
    ranks: all_to_all too, one cache-line hop each way instead of a
    gather and a release.  Otherwise the paper's choice: hierarchical
    once ranks span sockets, else the padded queue."""
    if call.nranks == 2 or oversubscribed(call.slots):
        return "all_to_all"
    return "hierarchical" if len({s.socket for s in call.slots}) > 1 else "padded"
