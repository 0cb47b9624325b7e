"""Reduce: x0 op x1 op ... op x(p-1), folded in rank order (coll/fold.py),
into the root's recvbuf.

  flat                  one step: every rank deposits its input once and
                        the root folds all p (one hand-off)
  reduce_scatter_gather rank s folds slice s of every input (the
                        arithmetic spread over all ranks), then the root
                        reads the folded slices
"""
from ..sched import Copy, Move, Step
from .fold import deposit, fold, scatter_fold, slices


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
    """Non-roots fold their slice into scratch; the root folds its own into
    recvbuf (in place: reading its own slice from scratch).  Only the
    root's own instructions depend on whether it is in place, which the
    other ranks do not know."""
    root = call.root
    sl = slices(call)
    big = max(n for _, n in sl)
    dbufs = [("recv", off) if s == root else ("tmp", 0) for s, (off, _) in enumerate(sl)]
    own, steps = None, []
    if call.inplace:
        own = [("send", off) for off, _ in sl]
        own[root] = ("tmp", big)
        steps.append(Step(copies=[Copy(root, "send", sl[root][0], "tmp", big, sl[root][1])]))
    steps.append(scatter_fold(call, sl, "send", dbufs, own))
    moves = [Move(s, (root,), ((0, off, n),), sbuf="tmp") for s, (off, n) in enumerate(sl) if s != root and n]
    if moves:
        steps.append(Step(moves))
    return steps, 2 * big


ALGORITHMS = {"flat": flat, "reduce_scatter_gather": reduce_scatter_gather}


def footprint(call):
    return 2 * call.nranks * call.nbytes


def choose(call):
    """The root alone folds p inputs while that is cheap; beyond, everyone
    folds a slice."""
    return "flat" if call.nbytes * (call.nranks - 1) <= call.params["reduce_small_bytes"] \
        else "reduce_scatter_gather"
