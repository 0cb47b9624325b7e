"""Default FLAT_BELOW: sizes just below and at each row's limit, compared with MPI."""
import numpy as np
from mpi4py import MPI
import shmcoll
from shmcoll.multinode.hier import FLAT_BELOW
w = MPI.COMM_WORLD
h = shmcoll.from_mpi(w)
p, me = w.Get_size(), w.Get_rank()
row = FLAT_BELOW["Open MPI" if MPI.Get_library_version().startswith("Open MPI") else "MPICH"]
rng = np.random.default_rng(me)
for name in ("bcast", "reduce", "allreduce", "allgather", "gather", "alltoall", "reduce_scatter", "scatter"):
    lim = row[name]
    if not lim or lim > (1 << 20):
        continue
    for nb in (lim - 8, lim):
        n = nb // 4
        x = rng.integers(0, 100, n * p).astype(np.int32)
        for root in (0, p - 1):
            if name == "bcast":
                a = x[:n].copy(); b = a.copy(); h.Bcast(a, root=root); w.Bcast(b, root=root)
            elif name == "reduce":
                a = np.zeros(n, np.int32); b = a.copy(); h.Reduce(x[:n], a, root=root); w.Reduce(x[:n], b, root=root)
            elif name == "allreduce":
                a = np.zeros(n, np.int32); b = a.copy(); h.Allreduce(x[:n], a); w.Allreduce(x[:n], b)
            elif name == "allgather":
                a = np.zeros(n * p, np.int32); b = a.copy(); h.Allgather(x[:n], a); w.Allgather(x[:n], b)
            elif name == "gather":
                a = np.zeros(n * p, np.int32); b = a.copy(); h.Gather(x[:n], a, root=root); w.Gather(x[:n], b, root=root)
            elif name == "scatter":
                a = np.zeros(n, np.int32); b = a.copy(); h.Scatter(x, a, root=root); w.Scatter(x, b, root=root)
            elif name == "alltoall":
                a = np.zeros(n * p, np.int32); b = a.copy(); h.Alltoall(x, a); w.Alltoall(x, b)
            else:
                a = np.zeros(n, np.int32); b = a.copy(); h.Reduce_scatter_block(x, a); w.Reduce_scatter_block(x, b)
            assert np.array_equal(a, b), (me, name, nb, root)
print(f"rank {me} ok fallbacks={h.fallbacks}", flush=True)
