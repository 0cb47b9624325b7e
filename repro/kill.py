"""rank argv[1] SIGKILLs itself at call argv[2] of a loop of collective argv[3]."""
import os, signal, sys
import numpy as np
from mpi4py import MPI
import shmcoll

h = shmcoll.from_mpi(MPI.COMM_WORLD, flat_below=0)
victim, at, call = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
p, me = h.Get_size(), h.Get_rank()
x, y = np.ones(1 << 14), np.empty((1 << 14) * p)
for i in range(100000):
    if i == at and me == victim:
        os.kill(os.getpid(), int(sys.argv[4]) if len(sys.argv) > 4 else signal.SIGKILL)
    if call == "Gather": h.Gather(x, y, root=i % p)
    elif call == "Scatterv": h.Scatterv([y, [1 << 14] * p], x, root=(i + 1) % p)
    elif call == "Alltoall": h.Alltoall(y, y.copy())
    elif call == "Bcast": h.Bcast(x, root=i % p)
    elif call == "Barrier": h.Barrier()
    elif call == "RS": h.Reduce_scatter(y, x, [1 << 14] * p)
