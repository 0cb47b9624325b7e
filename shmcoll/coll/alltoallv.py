"""Alltoallv and Alltoallw (paper 001, 4.3; MPICH's alltoallv): rank i's
piece for rank j (bytes, offset in i's sendbuf, offset in j's recvbuf)
lands in j's recvbuf.  Every rank plans from the whole p x p table of
pieces (call.counts[i][j]), which Comm.Alltoallv gathers and checks first,
so all plan the same schedule; pieces of no bytes move nothing.

  pairwise     p - 1 steps, rank r writes to r + s and reads from r - s
               (MPICH's pairwise exchange); big pieces by a single copy
               out of the writer's sendbuf, as Alltoall's
  all_at_once  one step: every rank writes all its pieces, readers
               staggered (rank r reads r - 1, r - 2, ...), MPICH's
               "scattered" isend/irecv burst
"""
from ..sched import Copy, Move, Step
from . import gather

#: Comm checks sendbuf and recvbuf apart (IN_PLACE: recvbuf is copied first)
APART = True


def table(call):
    """call.counts, or without them (a schedule planned from a size
    alone) Alltoall's: nbytes from every rank to every rank."""
    if call.counts is not None:
        return call.counts
    p, b = call.nranks, call.nbytes
    return tuple(tuple((b, j * b, i * b) for j in range(p)) for i in range(p))


def _own(t):
    return [Copy(r, "send", so, "recv", do, n) for r in range(len(t)) for n, so, do in (t[r][r],) if n]


def _busiest(t):
    """The most bytes any rank reads from the others (gather.via's total)."""
    p = len(t)
    return max((sum(t[i][j][0] for i in range(p) if i != j) for j in range(p)), default=0)


def _move(t, i, j, how):
    n, so, do = t[i][j]
    return Move(i, (j,), ((so, do, n),), via=how(n))


def pairwise(call):
    p, t = call.nranks, table(call)
    total = _busiest(t)

    def how(n):
        return gather.single(call, gather.via(call, n, total))
    steps = [Step([_move(t, r, (r + s) % p, how) for r in range(p) if t[r][(r + s) % p][0]]) for s in range(1, p)]
    if steps:
        steps[0].copies = _own(t)
    return steps or [Step(copies=_own(t))]


def all_at_once(call):
    p, t = call.nranks, table(call)
    total = _busiest(t)

    def how(n):
        return "direct" if gather.via(call, n, total) == "direct" else "auto"
    moves, index = [], {}
    for i in range(p):
        for j in range(p):
            if i != j and t[i][j][0]:
                index[i, j] = len(moves)
                moves.append(_move(t, i, j, how))
    order = {r: [index[(r - s) % p, r] for s in range(1, p) if ((r - s) % p, r) in index] for r in range(p)}
    return [Step(moves, copies=_own(t), order=order)]


ALGORITHMS = {"pairwise": pairwise, "all_at_once": all_at_once}


def footprint(call):
    return 2 * sum(n for row in table(call) for n, _, _ in row)


def choose(call):
    """Alltoall's rule without Bruck (its packing needs equal blocks):
    one step while the largest piece is at most 32 KiB past 2 ranks,
    pairwise above (call.nbytes: the largest piece)."""
    return "all_at_once" if call.nbytes <= 32768 and call.nranks > 2 else "pairwise"
