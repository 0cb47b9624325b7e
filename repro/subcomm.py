"""from_mpi over a permuted Split, a sub-communicator, several at once used alternately."""
import numpy as np
from mpi4py import MPI
import shmcoll

w = MPI.COMM_WORLD
p, me = w.Get_size(), w.Get_rank()
perm = w.Split(0, (me * 3) % p if p % 3 else p - me)     # nodes hold non-consecutive ranks
sub = w.Split(0 if me != 1 else MPI.UNDEFINED, me)
hs = [(perm, shmcoll.from_mpi(perm, flat_below=0)), (w, shmcoll.from_mpi(w, flat_below=0))]
if sub != MPI.COMM_NULL:
    hs.append((sub, shmcoll.from_mpi(sub, flat_below=0)))
bad = 0
def cmp(what, a, b):
    global bad
    if not np.array_equal(a, b):
        bad += 1; print(f"rank {me} MISMATCH {what}: {a} vs {b}", flush=True)
for it in range(3):
    for ref, h in hs:
        q, r = h.Get_size(), h.Get_rank()
        assert r == ref.Get_rank()
        tag = f"it{it} size{q} "
        for root in range(q):
            x = np.arange(3, dtype=np.int64) + 10 * r
            a1, a2 = x.copy(), x.copy()
            h.Bcast(a1, root=root); ref.Bcast(a2, root=root); cmp(tag + f"Bcast {root}", a1, a2)
            a1, a2 = np.zeros(3, np.int64), np.zeros(3, np.int64)
            h.Reduce(x, a1, op=MPI.SUM, root=root); ref.Reduce(x, a2, op=MPI.SUM, root=root)
            if r == root: cmp(tag + f"Reduce {root}", a1, a2)
            g1, g2 = np.zeros(3 * q, np.int64), np.zeros(3 * q, np.int64)
            h.Gather(x, g1, root=root); ref.Gather(x, g2, root=root)
            if r == root: cmp(tag + f"Gather {root}", g1, g2)
            a1, a2 = np.zeros(3, np.int64), np.zeros(3, np.int64)
            src = np.arange(3 * q, dtype=np.int64)
            h.Scatter(src, a1, root=root); ref.Scatter(src, a2, root=root); cmp(tag + f"Scatter {root}", a1, a2)
        x = np.arange(3, dtype=np.int64) + 10 * r
        a1, a2 = np.zeros(3, np.int64), np.zeros(3, np.int64)
        h.Allreduce(x, a1, op=MPI.MAX); ref.Allreduce(x, a2, op=MPI.MAX); cmp(tag + "Allreduce", a1, a2)
        g1, g2 = np.zeros(3 * q, np.int64), np.zeros(3 * q, np.int64)
        h.Allgather(x, g1); ref.Allgather(x, g2); cmp(tag + "Allgather", g1, g2)
        src = np.arange(3 * q, dtype=np.int64) + 100 * r
        g1, g2 = np.zeros(3 * q, np.int64), np.zeros(3 * q, np.int64)
        h.Alltoall(src, g1); ref.Alltoall(src, g2); cmp(tag + "Alltoall", g1, g2)
        counts = [i % 3 + 1 for i in range(q)]
        src = np.arange(sum(counts), dtype=np.int64) * (r + 1)
        a1, a2 = np.zeros(counts[r], np.int64), np.zeros(counts[r], np.int64)
        h.Reduce_scatter(src, a1, counts, op=MPI.SUM); ref.Reduce_scatter(src, a2, counts, op=MPI.SUM); cmp(tag + "RS", a1, a2)
        h.Barrier()
print(f"rank {me} done bad={bad} " + " ".join(f"{h.Get_size()}:{h.fallbacks}:{repr(h)[35:]}" for _, h in hs), flush=True)
for _, h in hs:
    h.Free()
