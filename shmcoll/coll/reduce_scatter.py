"""Reduce_scatter_block and Reduce_scatter: rank s gets slice s of
x0 op x1 op ... op x(p-1), folded in rank order (coll/fold.py), at the
start of its recvbuf.

  all_at_once   one step: every rank deposits slice s of its input for
                rank s, which folds all p (each rank 1/p of the work)
"""
from .fold import scatter_fold, source


def pieces(call):
    """(offset in the input, bytes) of each rank's slice."""
    if call.counts is not None:
        return [(d, n) for n, d in call.counts]
    b = call.nbytes // call.nranks
    return [(r * b, b) for r in range(call.nranks)]


def all_at_once(call):
    src, pre, tmp = source(call, call.nbytes)
    return pre + [scatter_fold(call, pieces(call), src, [("recv", 0)] * call.nranks)], tmp


ALGORITHMS = {"all_at_once": all_at_once}


def footprint(call):
    return 2 * call.nbytes


def choose(call):
    return "all_at_once"
