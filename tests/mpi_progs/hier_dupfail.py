"""Run under mpiexec on 2+2 virtual nodes: a Dup of the face's COMM_WORLD
whose node shared memory cannot be made on one rank (no space, made to
fail on rank 0) raises on every rank, not only on that node's (the
others would wait in their next call for ranks that have none), and the
world goes on.  Rank 0 prints "ok"."""
import numpy as np

import shmcoll.launcher
from shmcoll import MPI

world = MPI.COMM_WORLD
me = world.Get_rank()
if me == 0:
    class Full:
        def __init__(self, *args, **kw):
            raise OSError(28, "No space left on device")
    shmcoll.launcher.Job = Full
try:
    world.Dup()
    raised = ""
except RuntimeError as e:
    raised = str(e)
every = world.allgather(raised)
assert all("rank 0 of its 4" in r and "No space left" in r for r in every), every
x = np.full(3, float(me))
world.Allreduce(MPI.IN_PLACE, x)
assert list(x) == [6.0] * 3, x
if me == 0:
    print("ok", flush=True)
