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
from . import gather


def chunk(call, piped=True):
    """Fold chunks: small enough that a chunk of every input and the
    result stay in the L2 (a quarter of it is chunk_bytes), and, piped
    (staged through the writer's ring), that a message of a few chunks
    still pipelines; whole elements."""
    c = max(2 * call.params["chunk_bytes"] // (call.nranks + 1), 4096)
    c = min(call.pipe_chunk(), c) if piped else c
    return max(c // call.item, 1) * call.item


def slices(call, n=None, p=None, weights=None):
    """(offset, bytes) of each of p slices (one per rank) of n bytes
    (call.nbytes): whole elements, 64-byte multiples but for the last,
    in proportion to weights (integers; default equal)."""
    n = call.nbytes if n is None else n
    p, unit = p or call.nranks, call.item * 64 // gcd(call.item, 64)
    weights = weights or (1,) * p
    units, total = n // unit, sum(weights)
    share = [units * w // total for w in weights]
    left = units - sum(share)
    at, out = 0, []
    for r in range(p):
        k = (share[r] + (r < left)) * unit + (n - units * unit if r == p - 1 else 0)
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


def deposit(call, src, readers, off, n, sbuf, via="auto"):
    """Move: src's bytes [off, off + n) of sbuf, for readers to fold.
    "auto": big inputs in sendbuf are read by single copy, chunk by chunk
    into the reader's cache, as the other big blocks are (gather.via):
    the writer copies nothing, and the reader reads memory the writer has
    not just rewritten, which a staged ring's lines always are (slow when
    the two cores are far apart)."""
    if via == "auto" and sbuf == "send":
        via = gather.via(call, n)
    return Move(src, tuple(readers), ((off, 0, n),), sbuf=sbuf, via=via, chunk=chunk(call, via != "direct"))


def fold(rank, ranks, moves, own, dbuf, doff, n):
    """Reduce: rank folds the inputs of ranks, in rank order: its own at
    own ((buf, offset)), the others from moves[(writer, rank)]."""
    return Reduce(rank, tuple(own if j == rank else moves[j, rank] for j in ranks), dbuf, doff, n)


def runs(call):
    """The ranks in maximal runs of consecutive ranks on one NUMA node
    (one run per node when ranks are placed compactly)."""
    out = []
    for r in range(call.nranks):
        if out and call.slots[r].node == call.slots[out[-1][-1]].node:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def chained(call):
    """The runs a node-by-node algorithm chains, or None where it has
    nothing to chain (one run, no bytes) or would change the bits: half
    types accumulate in float32, and a partial crossing to the next run
    would be rounded to 16 bits."""
    groups = runs(call)
    if len(groups) == 1 or not call.nbytes or (call.kernel is not None and call.kernel.half):
        return None
    return groups


def by_node(call):
    """The automatic choice chains node by node when the ranks fill the
    nodes one after another (a run per node, each on its own node)."""
    groups = chained(call)
    return call.nodes > 1 and groups is not None and \
        len({call.slots[g[0]].node for g in groups}) == len(groups) <= call.nodes


def blocks(call, width, weights=None):
    """The slices ((offset, bytes), one per owner of `width`, in proportion
    to weights) of each block: reduce_block_bytes in whole 64-byte slices
    of whole items, so a block is folded and shared while in cache.  The
    first block's slices are the largest."""
    unit = 64 * width * call.item
    size = max(call.params["reduce_block_bytes"] // unit, 1) * unit
    n = call.nbytes
    return [[(lo + off, k) for off, k in slices(call, min(size, n - lo), width, weights)]
            for lo in range(0, n, size)]


def owner(groups, g, s):
    """The rank of run g that folds slice s."""
    return groups[g][s % len(groups[g])]


def place(groups, g, s, big):
    """Where slice s goes among the scratch slots (of big bytes) of its
    owner in run g, and the bytes all of one block's slots of a rank take."""
    return s // len(groups[g]) * big, -(-max(map(len, groups)) // min(map(len, groups))) * big


def chain(call, groups, sl, src, own, dst):
    """Steps, one per run g of groups: run g's owner of slice s,
    groups[g][s % len], folds the partial that run g - 1's owner left at
    dst(g - 1, s), then the inputs of run g's ranks in rank order (its own
    at own(g, s)), into dst(g, s) = (buf, offset).  Runs are consecutive
    ranks, so this is still the rank-order fold, with one read per slice
    crossing from one run (node) to the next instead of every input.
    own and dst are called here and nowhere later.  Everything is
    staged: writers here send unlike numbers of pieces, so "auto" could
    put one input of a fold inline and another in the ring, which a fold
    cannot cut alike."""
    steps = []
    for g, ranks in enumerate(groups):
        moves, reduces = [], []
        for s, (off, k) in enumerate(sl):
            if not k:
                continue
            o, inputs = owner(groups, g, s), []
            if g:
                inputs.append(len(moves))
                moves.append(deposit(call, owner(groups, g - 1, s), (o,), dst(g - 1, s)[1], k, dst(g - 1, s)[0],
                                     "staged"))
            for r in ranks:
                inputs.append(own(g, s) if r == o else len(moves))
                if r != o:
                    moves.append(deposit(call, r, (o,), off, k, src, "staged"))
            reduces.append(Reduce(o, tuple(inputs), *dst(g, s), k))
        steps.append(Step(moves, reduces=reduces))
    return steps


def scatter_fold(call, sl, src, dbufs, own=None, via="auto"):
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
                moves.append(deposit(call, r, (s,), sl[s][0], sl[s][1], src, via))
    reduces = [fold(s, range(p), index, own[s], *dbufs[s], sl[s][1]) for s in range(p) if sl[s][1]]
    return Step(moves, reduces=reduces)
