"""Barrier (paper 001, 4.1).  C runs each algorithm in one call; here we
plan the trees from the rank placement once per communicator.

  original      dual packed queues, rank 0 gathers and releases (id 0)
  padded        one padded queue, flat tree under rank 0 (id 1)
  hierarchical  node leader <- socket leaders <- children (id 2); when
                ranks outnumber cores, the ranks pinned to the same CPUs first
                gather under a core leader, so the hand-offs on one core are
                local yields and only leaders cross cores.
"""
ALGORITHMS = ("original", "padded", "hierarchical")


def trees(slots):
    """{alg id: (parent per rank, children per rank)} for the tree barriers."""
    n = len(slots)
    flat = ([-1] + [0] * (n - 1), [list(range(1, n))] + [[] for _ in range(n - 1)])
    socket_leader, core_leader = {}, {}
    for r, s in enumerate(slots):
        socket_leader.setdefault(s.socket, r)
        core_leader.setdefault((s.socket, s.cpus), r)
    parents, children = [-1] * n, [[] for _ in range(n)]
    for r, s in enumerate(slots):
        if core_leader[s.socket, s.cpus] != r:
            up = core_leader[s.socket, s.cpus]
        elif socket_leader[s.socket] != r:
            up = socket_leader[s.socket]
        else:
            up = 0 if r else -1
        parents[r] = up
        if up >= 0:
            children[up].append(r)
    return {1: flat, 2: (parents, children)}


def choose(comm, nbytes=0):
    """Hierarchical pays off once ranks span sockets or share cores; else
    the flat padded queue is one level shorter."""
    sockets = {s.socket for s in comm.slots}
    shared = len({s.cpus for s in comm.slots}) < comm.size
    return "hierarchical" if comm.size > 2 and (len(sockets) > 1 or shared) else "padded"
