"""Two hierarchical communicators, each driven by its own thread at once (MPI_THREAD_MULTIPLE)."""
import threading
import numpy as np
from mpi4py import MPI
import shmcoll

w = MPI.COMM_WORLD
p, me = w.Get_size(), w.Get_rank()
assert MPI.Query_thread() == MPI.THREAD_MULTIPLE
h1 = shmcoll.from_mpi(w, flat_below=0)
h2 = shmcoll.from_mpi(w, flat_below=0)
errs = []
def work(h, seed):
    try:
        for i in range(200):
            x = np.full(1000, float(me + seed + i))
            r = np.empty(1000)
            h.Allreduce(x, r, op=MPI.SUM)
            assert r[0] == sum(range(p)) + p * (seed + i), (r[0], seed, i)
            g = np.empty(1000 * p)
            h.Allgather(x, g)
            assert g[1000 * (p - 1)] == p - 1 + seed + i
            b = x.copy(); h.Bcast(b, root=i % p); assert b[0] == i % p + seed + i
            h.Gather(x, g, root=(i + 1) % p)
            if me == (i + 1) % p: assert g[0] == seed + i
    except Exception as e:
        errs.append(repr(e))
ts = [threading.Thread(target=work, args=(h1, 0)), threading.Thread(target=work, args=(h2, 1000))]
[t.start() for t in ts]; [t.join() for t in ts]
print(f"rank {me} errs={errs}", flush=True)
h1.Free(); h2.Free()
