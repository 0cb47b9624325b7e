"""Reduce: x0 op x1 op ... op x(p-1), folded in rank order (coll/fold.py),
into the root's recvbuf.

  flat                  one step: every rank deposits its input once and
                        the root folds all p (one hand-off)
  reduce_scatter_gather rank s folds slice s of every input (the
                        arithmetic spread over all ranks) block by block,
                        and writes it into the root's recvbuf
  numa                  when ranks span NUMA nodes: Allreduce's node-by-node
                        chain (coll/allreduce.py), then the root reads the
                        last run's folded slices
"""
from ..sched import Copy, Move, Step
from ..topology import oversubscribed
from .fold import blocks, by_node, chain, chained, deposit, fold, owner, place, scatter_fold
from .gather import via


def flat(call):
    """In place (the root only), the root's input goes to scratch first:
    its fold overwrites recvbuf."""
    p, n, root = call.nranks, call.nbytes, call.root
    if (p == 1 and call.inplace) or not n:
        return []
    own, pre = ("send", 0), []
    if call.inplace:
        own, pre = ("tmp", 0), [Step(copies=[Copy(root, "send", 0, "tmp", 0, n)])]
    moves = [deposit(call, r, (root,), 0, n, "send") for r in range(p) if r != root]
    index = {(m.src, root): i for i, m in enumerate(moves)}
    return pre + [Step(moves, reduces=[fold(root, range(p), index, own, "recv", 0, n)])], n if call.inplace else 0


def reduce_scatter_gather(call):
    """Block by block (reduce_block_bytes, as Allreduce): rank s folds
    slice s of the block, the root into recvbuf, the others into scratch,
    from where each writes it into the root's recvbuf itself (push) at the
    start of the next block's step, while it is still in its cache: the
    root copies nothing and no folded slice goes through memory twice.
    Pushing (where the root's inputs, one reader's blocks, go by single
    copy: gather.via), a non-root does more than the root, which folds a
    larger slice (ROOT_SHARE).  The root waits for the pushes only at the
    end (compile.settle), so it folds on.  Without single copies the slices are
    staged from alternate halves of scratch, leaving chunk by chunk while
    the next block is folded.  In place (the root only), the root's own
    slice goes to scratch first; only the root's own instructions depend
    on it, which the other ranks do not know."""
    root, p = call.root, call.nranks
    push = _pushes(call)
    cut = blocks(call, p, tuple(ROOT_SHARE[0] if s == root else ROOT_SHARE[1] for s in range(p)) if push else None)
    if not cut:
        return []
    big = max(k for _, k in cut[0])
    steps, last = [], []
    for b, sl in enumerate(cut):
        at = b % 2 * big
        dbufs = [("recv", off) if s == root else ("tmp", at) for s, (off, _) in enumerate(sl)]
        own = None
        if call.inplace:
            own = [("send", off) for off, _ in sl]
            own[root] = ("tmp", 0)
            steps.append(Step(copies=[Copy(root, "send", sl[root][0], "tmp", 0, sl[root][1])]))
        step = scatter_fold(call, sl, "send", dbufs, own, "direct" if push else "auto")
        step.moves += last
        steps.append(step)
        last = [Move(s, (root,), ((at, off, n),), sbuf="tmp", via="push" if push else "auto")
                for s, (off, n) in enumerate(sl) if s != root and n]
    if last:
        steps.append(Step(last))
    return steps, min(len(cut), 2) * big


def _pushes(call):
    """Whether reduce_scatter_gather's slices go by single copy: where the
    root's inputs, one reader's blocks (its equal slices' worth), would."""
    cut = blocks(call, call.nranks)
    return bool(cut) and via(call, max(k for _, k in cut[0]),
                             call.nbytes - sum(sl[call.root][1] for sl in cut)) == "direct"


# The root's slice against another rank's, 3 : 2, where the others push
# theirs: a pushing rank copies its folded slice into the root's recvbuf
# besides folding it, while the root's lands there as it folds, so the
# root takes the larger share (bench/README.md, "Figures moved out of
# coll/*.py").
ROOT_SHARE = (3, 2)


def numa(call):
    """Partials and the last run's results in scratch, but the root's
    result in recvbuf; in place, the root's own slices go to scratch
    first.  Each block's results go to the root len(runs) - 1 blocks
    later, as in Allreduce, so the runs pipeline; scratch holds that many
    blocks' results."""
    groups, root = chained(call), call.root
    if not groups:
        return reduce_scatter_gather(call)
    last = len(groups) - 1
    cut = blocks(call, max(map(len, groups)))
    big = max(k for _, k in cut[0])
    room = place(groups, 0, 0, big)[1]          # a rank's slices of one block
    steps, pending = [], []
    for b, sl in enumerate(cut):

        def at(g, s, b=b):
            return (b % len(groups)) * room + place(groups, g, s, big)[0]

        def dst(g, s, sl=sl, at=at):
            return ("recv", sl[s][0]) if g == last and owner(groups, g, s) == root else ("tmp", at(g, s))

        def own(g, s, sl=sl):
            if call.inplace and owner(groups, g, s) == root:
                return "tmp", len(groups) * room + place(groups, g, s, big)[0]
            return "send", sl[s][0]
        if call.inplace:
            steps.append(Step(copies=[Copy(root, "send", off, "tmp", own(g, s)[1], k) for g in range(len(groups))
                                      for s, (off, k) in enumerate(sl) if k and owner(groups, g, s) == root]))
        steps += chain(call, groups, sl, "send", own, dst)
        pending.append([Move(owner(groups, last, s), (root,), ((at(last, s), off, k),), sbuf="tmp")
                        for s, (off, k) in enumerate(sl) if k and owner(groups, last, s) != root])
        if len(pending) == len(groups):
            steps.append(Step(pending.pop(0)))
    steps += [Step(m) for m in pending]
    return [s for s in steps if s.moves or s.copies or s.reduces], (len(groups) + 1) * room


ALGORITHMS = {"flat": flat, "reduce_scatter_gather": reduce_scatter_gather, "numa": numa}


def footprint(call):
    return 2 * call.nranks * call.nbytes


def choose(call):
    """The root alone folds p inputs while that is cheap; beyond, everyone
    folds a slice, node by node when the ranks fill nodes one after
    another.  Sooner where each rank has a CPU and the slices go by single
    copy: the folds then run on every CPU at once and the slices are not
    staged, so spreading them pays from a smaller input (bench/README.md,
    "Figures moved out of coll/*.py")."""
    small = call.nbytes * (call.nranks - 1) <= call.params["reduce_small_bytes"]
    if small and (oversubscribed(call.slots) or not _pushes(call)):
        return "flat"
    return "numa" if by_node(call) else "reduce_scatter_gather"
