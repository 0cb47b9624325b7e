"""Rank argv[1] calls sys.exit(3) between two collectives (argv[2]=mpi: plain MPI)."""
import sys
import numpy as np
from mpi4py import MPI
import shmcoll
w = MPI.COMM_WORLD
h = w if sys.argv[2:] == ["mpi"] else shmcoll.from_mpi(w)
x = np.ones(1 << 17)
h.Allreduce(MPI.IN_PLACE, x)
if h.Get_rank() == int(sys.argv[1]):
    sys.exit(3)
h.Allreduce(MPI.IN_PLACE, x)
print("finished", flush=True)
