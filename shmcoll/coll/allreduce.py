"""Allreduce: every rank gets x0 op x1 op ... op x(p-1), folded in rank
order (coll/fold.py), so all ranks hold the same bits.

  all_at_once               one step: every rank deposits its input once
                            (inline in its slot line when small) and every
                            rank folds all p: one hand-off, p-fold arithmetic
  reduce_scatter_allgather  rank s folds slice s of every input (each rank
                            a 1/p share of the arithmetic and reads), then
                            every rank reads the folded slices (DeepSpeed's
                            large-message scheme, paper 004's Rabenseifner
                            shape without its recursive halving)
"""
from ..sched import Copy, Move, Step
from .fold import deposit, fold, scatter_fold, slices, source
from .gather import via


def all_at_once(call):
    p, n = call.nranks, call.nbytes
    if not n or (p == 1 and call.inplace):
        return []
    if p == 1:
        return [Step(reduces=[fold(0, [0], {}, ("send", 0), "recv", 0, n)])]
    src, pre, tmp = source(call, n)
    moves = [deposit(call, r, [(r + j) % p for j in range(1, p)], 0, n, src) for r in range(p)]
    index = {(r, d): r for r in range(p) for d in range(p) if d != r}
    return pre + [Step(moves, reduces=[fold(r, range(p), index, (src, 0), "recv", 0, n) for r in range(p)])], tmp


def reduce_scatter_allgather(call):
    """Block by block (reduce_block_bytes, so a block's inputs, folded
    slices and results are still in cache when the allgather reads them):
    rank s folds slice s of the block, then every rank reads the others'.
    In place, only the own slice (which the fold overwrites) goes to
    scratch first; the others are read before the allgather rewrites them."""
    p, n = call.nranks, call.nbytes
    size = max(call.params["reduce_block_bytes"] // (64 * p * call.item), 1) * 64 * p * call.item
    steps, tmp = [], 0
    for lo in range(0, n, size):
        sl = [(lo + off, k) for off, k in slices(call, min(size, n - lo))]
        own = None
        if call.inplace:
            own = [("tmp", 0)] * p
            steps.append(Step(copies=[Copy(r, "send", off, "tmp", 0, k) for r, (off, k) in enumerate(sl)]))
            tmp = max(tmp, max(k for _, k in sl))
        steps.append(scatter_fold(call, sl, "send", [("recv", off) for off, _ in sl], own))
        moves = [Move(s, tuple((s + j) % p for j in range(1, p)), ((off, off, k),), sbuf="recv",
                      via=via(call, k)) for s, (off, k) in enumerate(sl) if k]
        if moves:
            index = {m.src: i for i, m in enumerate(moves)}
            order = {r: [index[(r - j) % p] for j in range(1, p) if (r - j) % p in index] for r in range(p)}
            steps.append(Step(moves, order=order))
    return steps, tmp


ALGORITHMS = {"all_at_once": all_at_once, "reduce_scatter_allgather": reduce_scatter_allgather}


def footprint(call):
    return 3 * call.nranks * call.nbytes


def choose(call):
    """One hand-off while p-fold arithmetic is cheap; spread the arithmetic
    once the input outgrows a few chunks."""
    return "all_at_once" if call.nbytes * (call.nranks - 1) <= call.params["reduce_small_bytes"] \
        else "reduce_scatter_allgather"
