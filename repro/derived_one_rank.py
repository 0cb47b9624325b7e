"""Rank 0 describes its Allgather blocks with a contiguous datatype of 2 ints, the others as 2 plain ints:
the same type signature, a valid MPI call (argv[1]=mpi: on MPI's own communicator)."""
import sys
import numpy as np
from mpi4py import MPI
import shmcoll

w = MPI.COMM_WORLD
h = w if sys.argv[1:] == ["mpi"] else shmcoll.from_mpi(w, flat_below=0)
p, me = w.Get_size(), w.Get_rank()
pair = MPI.INT.Create_contiguous(2).Commit()
x = np.array([me, -me], np.int32)
got = np.zeros(2 * p, np.int32)
if me == 0:
    h.Allgather([x, 1, pair], [got, 1, pair])
else:
    h.Allgather(x, got)
print(f"rank {me} {got.tolist()}", flush=True)
