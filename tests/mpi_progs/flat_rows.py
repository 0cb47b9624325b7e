"""The sizes below which each collective is MPI's own, on from_mpi's
communicator and on a Dup of it (which must choose alike): rank 0 prints
"rows (ROWS, ROWS)", each {collective: bytes, None for never}."""
from mpi4py import MPI

import shmcoll


def rows(c):
    return {k: None if v == float("inf") else v for k, v in c._below.items()}


h = shmcoll.from_mpi(MPI.COMM_WORLD)
d = h.Dup()
got = (rows(h), rows(d))
if MPI.COMM_WORLD.Get_rank() == 0:
    print("rows", repr(got), flush=True)
d.Free()
h.Free()
