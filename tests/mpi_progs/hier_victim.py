"""Run under mpiexec: a hierarchical collective (argv[1]) in a loop of
1 MiB calls; rank argv[2] kills itself (SIGKILL) at call argv[3], having
written the time and its pid to argv[4].  The job must end.  argv[5]
"reversed": the communicator is a Split of the hierarchical world in
reverse rank order (argv[2] is then a rank of COMM_WORLD)."""
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import shmcoll

h = shmcoll.from_mpi(MPI.COMM_WORLD, flat_below=0)
op, victim, at, note = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if sys.argv[5:] == ["reversed"]:
    victim = h.Get_size() - 1 - victim
    h = h.Split(0, -h.Get_rank())
p, k = h.Get_size(), 1 << 14
x, y = np.ones(k * p), np.empty(k * p)
calls = {"bcast": lambda: h.Bcast(x[:k], root=p - 1), "allreduce": lambda: h.Allreduce(x[:k], y[:k]),
         "reduce": lambda: h.Reduce(x[:k], y[:k], root=1 % p), "allgather": lambda: h.Allgather(x[:k], y),
         "gather": lambda: h.Gather(x[:k], y, root=0), "scatter": lambda: h.Scatter(x, y[:k], root=p - 1),
         "alltoall": lambda: h.Alltoall(x, y), "barrier": h.Barrier,
         "reduce_scatter_block": lambda: h.Reduce_scatter_block(x, y[:k])}
call = calls[op]
for i in range(10 ** 7):
    if i == at and h.Get_rank() == victim:
        with open(note, "w") as f:
            f.write(f"{time.time()} {os.getpid()}")
        os.kill(os.getpid(), signal.SIGKILL)
    call()
