"""Run under mpiexec with SHMCOLL_VIRTUAL_NODES=2,2: the user's messages in
flight across a hierarchical Gather and Scatter (a tag the legs use, and a
receive from any source posted before the collective) reach the user, and
the collectives their blocks, as under MPI, where collectives never match
point-to-point.  Rank 0 prints "ok" at the end."""
import numpy as np
from mpi4py import MPI

import shmcoll

h = shmcoll.from_mpi(MPI.COMM_WORLD, flat_below=0)
p, me = h.Get_size(), h.Get_rank()
for tag in (0, 7, 1234):
    # node 1's leader (rank 2) sends the root a message received after the Gather
    req = h.Isend(np.full(2, 99.0), dest=0, tag=tag) if me == 2 else None
    got = np.zeros(p) if me == 0 else None
    h.Gather(np.full(1, float(me)), got, root=0)
    if me == 0:
        user = np.zeros(2)
        h.Recv(user, source=2, tag=tag)
        assert list(got) == list(range(p)) and list(user) == [99, 99], (tag, got, user)
    if req is not None:
        req.Wait()
    # node 1's leader posts a receive from any source before a Scatter from rank 0
    user = np.zeros(2)
    req = h.Irecv(user, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG) if me == 2 else None
    mine = np.zeros(1)
    h.Scatter(np.arange(p, dtype=np.float64) if me == 0 else None, mine, root=0)
    assert mine[0] == me, (tag, me, mine)
    if me == 1:
        h.Send(np.full(2, 5.0), dest=2, tag=tag)
    if req is not None:
        req.Wait()
        assert list(user) == [5, 5], (tag, user)
    h.Barrier()
h.Free()
if me == 0:
    print("ok", flush=True)
