"""What the reductions' schedules share: slices of whole elements, the
deposits of inputs and the folds in rank order.

Every reduction folds x0 op x1 op ... op x(p-1) per element, always in
rank order (csrc/reduce.c adds no order of its own), so every algorithm,
placement and run gives the same bits.  An input travels as a move that
its reader folds straight from where it landed (the writer's slot line or
ring, chunk by chunk, while the writer fills the next chunk), never
copied out first."""
from math import gcd

from ..sched import Copy, Move, Reduce, Step


def chunk(call):
    """Fold chunks: small enough that a chunk of every input and the
    result stay in the L2 (a quarter of it is chunk_bytes), and a message
    of a few chunks still pipelines; whole elements."""
    c = min(call.pipe_chunk(), max(2 * call.params["chunk_bytes"] // (call.nranks + 1), 4096))
    return max(c // call.item, 1) * call.item


def slices(call, n=None):
    """(offset, bytes) of each rank's slice of n bytes (call.nbytes): whole
    elements, 64-byte multiples but for the last."""
    n = call.nbytes if n is None else n
    p, unit = call.nranks, call.item * 64 // gcd(call.item, 64)
    units, at, out = n // unit, 0, []
    for r in range(p):
        k = (units // p + (r < units % p)) * unit + (n - units * unit if r == p - 1 else 0)
        out.append((at, k))
        at += k
    return out


def source(call, n):
    """(buffer the inputs are read from, steps before, scratch bytes): in
    place the input is in recvbuf, which the folds overwrite, so it is
    copied to scratch first."""
    if not call.inplace:
        return "send", [], 0
    return "tmp", [Step(copies=[Copy(r, "send", 0, "tmp", 0, n) for r in range(call.nranks)])], n


def deposit(call, src, readers, off, n, sbuf):
    """Move: src's bytes [off, off + n) of sbuf, for readers to fold."""
    return Move(src, tuple(readers), ((off, 0, n),), sbuf=sbuf, chunk=chunk(call))


def fold(rank, ranks, moves, own, dbuf, doff, n):
    """Reduce: rank folds the inputs of ranks, in rank order: its own at
    own ((buf, offset)), the others from moves[(writer, rank)]."""
    return Reduce(rank, tuple(own if j == rank else moves[j, rank] for j in ranks), dbuf, doff, n)


def scatter_fold(call, sl, src, dbufs, own=None):
    """Step: every rank deposits slice s of its input (sl[s] = (offset,
    bytes)) for rank s, which folds all p into dbufs[s] = (buf, offset),
    its own slice read at own[s] (default: in src).  The reduce-scatter
    under Allreduce, Reduce and Reduce_scatter."""
    p, moves, index = call.nranks, [], {}
    own = own or [(src, off) for off, _ in sl]
    for r in range(p):
        for s in range(p):
            if s != r and sl[s][1]:
                index[r, s] = len(moves)
                moves.append(deposit(call, r, (s,), sl[s][0], sl[s][1], src))
    reduces = [fold(s, range(p), index, own[s], *dbufs[s], sl[s][1]) for s in range(p) if sl[s][1]]
    return Step(moves, reduces=reduces)
