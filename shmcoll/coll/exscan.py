"""Exscan: rank r gets x0 op ... op x(r-1), folded in rank order
(coll/fold.py); rank 0's recvbuf is left as it is.

  all_at_once   one step: every rank deposits its input once for every
                higher rank, and each folds the inputs it needs
"""
from . import scan
from .scan import prefix

footprint = scan.footprint


def all_at_once(call):
    return prefix(call, lambda r: range(r))


ALGORITHMS = {"all_at_once": all_at_once}


def choose(call):
    return "all_at_once"
