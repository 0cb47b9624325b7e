"""The legs' point-to-point (Gather/Scatter, tag 7) runs on comm.mpi, the
same communicator the user's Send/Recv go to through the hierarchical
communicator: a user's message in flight across a collective is taken by
the leg (MPI: collectives never match point-to-point)."""
import numpy as np
from mpi4py import MPI
import shmcoll

h = shmcoll.from_mpi(MPI.COMM_WORLD, flat_below=0)
p, me = h.Get_size(), h.Get_rank()
leader1 = 2             # node 1's leader with SHMCOLL_VIRTUAL_NODES=2,2
user = np.full(2, -1.0)
req = None
if me == leader1:
    req = h.Isend(np.full(2, 99.0), dest=0, tag=7)          # the user's message, received after the Gather
x = np.full(1, float(me))
got = np.zeros(p) if me == 0 else None
h.Gather(x, got, root=0)
if me == 0:
    h.Recv(user, source=leader1, tag=7)
    print("gather:", got, "user message:", user, flush=True)
    assert list(got) == [0, 1, 2, 3], got
    assert list(user) == [99, 99], user
if req is not None:
    req.Wait()
h.Barrier()
if me == 0:
    print("OK")
