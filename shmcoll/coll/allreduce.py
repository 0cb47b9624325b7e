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
  numa                      when ranks span NUMA nodes: run by run (a run:
                            consecutive ranks on one node), each slice's
                            owner in the run folds the previous run's
                            partial and its run's inputs, then the last
                            run's results cross back once per node and are
                            shared within it; blocks pipeline, so node 0
                            folds block b + 1 while node 1 folds block b
"""
from ..sched import Copy, Move, Step
from ..topology import oversubscribed
from .fold import blocks, by_node, chain, chained, deposit, fold, owner, place, scatter_fold, source
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
    p = call.nranks
    steps, tmp = [], 0
    for sl in blocks(call, p):
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


def numa(call):
    """Crossing nodes: per block and slice, one partial from each run to
    the next and one result back to each run, where reduce_scatter_allgather
    reads most inputs and results across.  A run waits only for the run
    before it, so the runs work on successive blocks at once; each block's
    results go back len(runs) - 1 blocks later, when they are ready.
    Half types, whose partials would round to 16 bits between runs (and
    change the bits), and a single run fall back to
    reduce_scatter_allgather."""
    groups = chained(call)
    if not groups:
        return reduce_scatter_allgather(call)
    cut = blocks(call, max(map(len, groups)))
    big = max(k for _, k in cut[0])
    steps, pending = [], []
    for sl in cut:

        def own(g, s, sl=sl):       # in place, the fold overwrites the owner's own input: it goes to scratch
            return ("tmp", place(groups, g, s, big)[0]) if call.inplace else ("send", sl[s][0])
        if call.inplace:
            steps.append(Step(copies=[Copy(owner(groups, g, s), "send", off, "tmp", own(g, s)[1], k)
                                      for g in range(len(groups)) for s, (off, k) in enumerate(sl) if k]))
        steps += chain(call, groups, sl, "send", own, lambda g, s, sl=sl: ("recv", sl[s][0]))
        pending.append(sl)
        if len(pending) == len(groups):
            steps += _back(call, groups, pending.pop(0))
    for sl in pending:
        steps += _back(call, groups, sl)
    return steps, place(groups, 0, 0, big)[1] if call.inplace else 0


def _back(call, groups, sl):
    """The last run's folded slices to each other run's owner of the
    slice (one read across), then to the rest of each run."""
    m = len(groups)
    cross = [Move(owner(groups, m - 1, s), tuple(owner(groups, g, s) for g in range(m - 1)), ((off, off, k),),
                  sbuf="recv", via=via(call, k)) for s, (off, k) in enumerate(sl) if k]
    within = [Move(owner(groups, g, s), tuple(r for r in groups[g] if r != owner(groups, g, s)), ((off, off, k),),
                   sbuf="recv", via=via(call, k)) for g in range(m) if len(groups[g]) > 1
              for s, (off, k) in enumerate(sl) if k]
    return [Step(cross)] + ([Step(within)] if within else [])


ALGORITHMS = {"all_at_once": all_at_once, "reduce_scatter_allgather": reduce_scatter_allgather, "numa": numa}


def footprint(call):
    return 3 * call.nranks * call.nbytes


def choose(call):
    """One hand-off while p-fold arithmetic is cheap; spread the arithmetic
    once the input outgrows a few chunks, node by node when the ranks fill
    nodes one after another.  Ranks taking turns on CPUs run every rank's
    p-fold arithmetic one after another, so there the hand-off pays for
    an eighth as much (bench/README.md, "Figures moved out of
    coll/*.py")."""
    small = call.params["reduce_small_bytes"] // (8 if oversubscribed(call.slots) else 1)
    if call.nbytes * (call.nranks - 1) <= small:
        return "all_at_once"
    return "numa" if by_node(call) else "reduce_scatter_allgather"
