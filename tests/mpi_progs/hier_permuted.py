"""Run under mpiexec with 4 ranks on 2 virtual nodes of 2: from_mpi of a
communicator whose ranks interleave the nodes (Split with a permuting
key), every collective against MPI's own on it, legs forced."""
import numpy as np
from mpi4py import MPI

import shmcoll

w = MPI.COMM_WORLD
comm = w.Split(0, key=[0, 3, 1, 2][w.Get_rank()])      # node 0 = world 0, 1; node 1 = world 2, 3
h = shmcoll.from_mpi(comm, flat_below=0)
assert not h.blocked, h.nodes
p, me = comm.Get_size(), comm.Get_rank()
rng = np.random.default_rng(me)
for n in (1, 6, 20000):
    for root in range(p):
        b = rng.integers(0, 9, n).astype(np.float64) if me == root else np.zeros(n)
        ref = b.copy()
        h.Bcast(b, root=root)
        comm.Bcast(ref, root=root)
        assert np.array_equal(b, ref), ("Bcast", n, root)
        x = rng.integers(0, 9, n).astype(np.int64)
        got, want = np.zeros(n, np.int64), np.zeros(n, np.int64)
        h.Reduce(x, got, root=root)
        comm.Reduce(x, want, root=root)
        assert me != root or np.array_equal(got, want), ("Reduce", n, root)
    x = rng.integers(0, 9, n).astype(np.int64)
    got, want = np.zeros(n, np.int64), np.zeros(n, np.int64)
    h.Allreduce(x, got)
    comm.Allreduce(x, want)
    assert np.array_equal(got, want), ("Allreduce", n)
    got, want = np.zeros(n * p, np.int64), np.zeros(n * p, np.int64)
    h.Allgather(x, got)
    comm.Allgather(x, want)
    assert np.array_equal(got, want), ("Allgather", n)
h.Barrier()
every = comm.gather(h.fallbacks)
if me == 0:
    print("ok", *every, flush=True)
