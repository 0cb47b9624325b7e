"""Alltoall (paper 001, 4.3/5.3; paper 002's selection): bruck,
all_at_once, pairwise, tiled; all in csrc/alltoall.c.  MPICH's rule
(Bruck for <= 256 B blocks at p >= 8, all-at-once up to 32 KiB, pairwise
above).  Large blocks: pairwise goes by rendezvous (one copy, straight
from the peer's sendbuf) when the ranks may read each other; measured here
it held 2.0-3.4 ms at 16 MiB blocks while every staged exchange swung
between 3.0 and 12 ms with where the host put our two vCPUs.  Without
cross-memory attach, tiled keeps the staged tiles in cache."""
ALGORITHMS = ("bruck", "all_at_once", "pairwise", "tiled")


def choose(comm, block):
    p = comm.size
    if block <= 256 and p >= 8:
        return "bruck"
    if block <= 32768 and p > 2:
        return "all_at_once"
    if comm._c.cma and 0 < comm.plan.params["cma_bytes"] <= block:
        return "pairwise"
    return "tiled" if block > comm.plan.params["tile_bytes"] else "pairwise"
