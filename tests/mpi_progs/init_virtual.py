"""Run under mpiexec with SHMCOLL_VIRTUAL_NODES: shmcoll.init() gives each
rank its virtual node's ranks (an Allreduce among them), saying that the
job spans nodes.  Rank 0 prints every rank's (node size, local rank, sum)."""
import warnings

import numpy as np
from mpi4py import MPI

import shmcoll

with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    c = shmcoll.init()
x = np.full(1, MPI.COMM_WORLD.Get_rank() + 1.0)
c.Allreduce(shmcoll.IN_PLACE, x)
told = any("spans several nodes" in str(w.message) for w in said)
every = MPI.COMM_WORLD.gather((c.Get_size(), c.Get_rank(), int(x[0]), told))
if MPI.COMM_WORLD.Get_rank() == 0:
    print("init", every, flush=True)
