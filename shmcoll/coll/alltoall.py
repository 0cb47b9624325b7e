"""Alltoall (paper 001, 4.3/5.3; paper 002's selection): bruck,
all_at_once, pairwise, tiled; all in csrc/alltoall.c.  MPICH's rule
(Bruck for <= 256 B blocks at p >= 8, all-at-once up to 32 KiB, pairwise
above) with the tiled exchange replacing pairwise for large blocks."""
ALGORITHMS = ("bruck", "all_at_once", "pairwise", "tiled")


def choose(comm, block):
    p = comm.size
    if block <= 256 and p >= 8:
        return "bruck"
    if block <= 32768 and p > 2:
        return "all_at_once"
    return "tiled" if block > comm.plan.params["tile_bytes"] else "pairwise"
