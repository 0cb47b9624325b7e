"""Allgatherv, the store-and-forward Collect of paper 003: every rank
deposits its range (its piece and where it goes) once, and every rank
reads every other piece once, in one step, with no round to exchange
sizes when the counts are given (Comm.Allgatherv).  Big pieces are read
straight from the writer's sendbuf.  The displacements (call.counts) are
the planning rank's own: each rank's recvbuf layout is its own (MPI), so
only readers write into a recvbuf (never a writer's push into another's)
and every rank's program is right for its own layout."""
from ..sched import Copy, Move, Step
from .gather import pieces, via


def store_and_forward(call):
    p, cnt = call.nranks, pieces(call)
    moves = [Move(r, tuple((r + j) % p for j in range(1, p)), ((0, cnt[r][1], cnt[r][0]),),
                  via=via(call, cnt[r][0])) for r in range(p) if cnt[r][0] and p > 1]
    index = {m.src: i for i, m in enumerate(moves)}
    order = {r: [index[(r - s) % p] for s in range(1, p) if (r - s) % p in index] for r in range(p)}
    return [Step(moves, copies=[Copy(r, "send", 0, "recv", cnt[r][1], cnt[r][0]) for r in range(p)], order=order)]


#: Comm checks sendbuf and recvbuf apart (IN_PLACE: the own block is copied out first)
APART = True

ALGORITHMS = {"store_and_forward": store_and_forward}


def footprint(call):
    return 2 * call.nranks * sum(n for n, _ in pieces(call))


def choose(call):
    return "store_and_forward"
