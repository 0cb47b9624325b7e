"""Bcast (paper 001, 4.2/5.2): binomial, original, limited, numa; all in
csrc/bcast.c.  Choice: tiny messages go inline in one flag line, where a
binomial tree's forwarding costs more than everyone reading the root's
line; big ones split readers into groups of k (and across NUMA nodes)."""
from .._core import lib

ALGORITHMS = ("binomial", "original", "limited", "numa")


def choose(comm, nbytes):
    p = comm.size
    if nbytes <= lib.SC_INLINE or p <= 2:
        return "original"
    if nbytes <= 16384:
        return "binomial" if p > 8 else "original"
    if len(comm.plan.topo.nodes) > 1:
        return "numa"
    return "limited" if p - 1 > comm.plan.params["bcast_k"] else "original"
