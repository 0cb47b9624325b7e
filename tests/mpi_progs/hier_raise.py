"""Run under mpiexec: rank 1 raises between two collectives; the job must
end (from_mpi's abort on an uncaught exception), not hang in the second."""
import numpy as np
from mpi4py import MPI

import shmcoll

h = shmcoll.from_mpi(MPI.COMM_WORLD)
x = np.ones(10)
h.Allreduce(MPI.IN_PLACE, x)
if h.Get_rank() == 1:
    raise ValueError("rank 1 gives up")
h.Allreduce(MPI.IN_PLACE, x)
