"""Scan: rank r gets x0 op x1 op ... op xr, folded in rank order
(coll/fold.py).

  all_at_once   one step: every rank deposits its input once for every
                higher rank, and each folds the inputs it needs
"""
from ..sched import Step
from .fold import deposit, fold, source


def prefix(call, upto):
    """upto(r): the ranks whose inputs r folds."""
    p, n = call.nranks, call.nbytes
    if not n:
        return []
    src, pre, tmp = source(call, n)
    moves, index = [], {}
    for r in range(p):
        readers = [d for d in range(r + 1, p) if r in upto(d)]
        if readers:
            index.update({(r, d): len(moves) for d in readers})
            moves.append(deposit(call, r, readers, 0, n, src))
    reduces = [fold(r, upto(r), index, (src, 0), "recv", 0, n) for r in range(p) if upto(r)]
    return pre + [Step(moves, reduces=reduces)], tmp


def all_at_once(call):
    return prefix(call, lambda r: range(r + 1))


ALGORITHMS = {"all_at_once": all_at_once}


def footprint(call):
    return 2 * call.nranks * call.nbytes


def choose(call):
    return "all_at_once"
