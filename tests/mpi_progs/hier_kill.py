"""Run under mpiexec: hierarchical Allreduce in a loop; rank argv[1]
kills itself (SIGKILL) at call argv[2].  The job must end, naming it."""
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import shmcoll

h = shmcoll.from_mpi(MPI.COMM_WORLD)
victim, at = int(sys.argv[1]), int(sys.argv[2])
x, y = np.ones(1 << 17), np.empty(1 << 17)
print(f"ready {h.Get_rank()}", flush=True)
for i in range(1000000):
    if i == at and h.Get_rank() == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    h.Allreduce(x, y)
