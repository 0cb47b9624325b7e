"""Gather/Scatter/Allgather(v)/Gatherv/Scatterv/Alltoall/Reduce_scatter spec forms vs MPI."""
import array, sys
import numpy as np
from mpi4py import MPI
import shmcoll

w = MPI.COMM_WORLD
h = shmcoll.from_mpi(w, flat_below=0)
p, me = h.Get_size(), h.Get_rank()
bad = []

def cmp(what, a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or not np.array_equal(a, b):
        bad.append(what)
        print(f"rank {me} MISMATCH {what}: {a.ravel()[:12]} vs {b.ravel()[:12]}", flush=True)

def both(name, mk, *args, **kw):
    """mk() -> (args...) fresh; call on h and w; return outputs for compare."""
    a1 = mk(); a2 = mk()
    getattr(h, name)(*a1, **kw); getattr(w, name)(*a2, **kw)
    return a1, a2

k = 3
for root in range(p):
    # Gather with spec forms
    x = (np.arange(k) + 10 * me).astype(np.int32)
    g1, g2 = np.zeros(k * p + 2, np.int32), np.zeros(k * p + 2, np.int32)
    h.Gather([x, MPI.INT], [g1, k, MPI.INT] if me == root else None, root=root)
    w.Gather([x, MPI.INT], [g2, k, MPI.INT] if me == root else None, root=root)
    cmp(f"Gather count-spec root {root}", g1, g2)
    g1, g2 = np.zeros(k * p + 2, np.int32), np.zeros(k * p + 2, np.int32)
    h.Gather([x, MPI.INT], [g1, (k, 2), MPI.INT] if me == root else None, root=root)
    w.Gather([x, MPI.INT], [g2, (k, 2), MPI.INT] if me == root else None, root=root)
    cmp(f"Gather (count,displ) root {root}", g1, g2)
    # Gather IN_PLACE at root
    g1 = np.zeros(k * p, np.int32); g1[k * me:k * me + k] = x if me == root else 0
    g2 = g1.copy()
    h.Gather(MPI.IN_PLACE if me == root else x, g1 if me == root else None, root=root)
    w.Gather(MPI.IN_PLACE if me == root else x, g2 if me == root else None, root=root)
    cmp(f"Gather IN_PLACE root {root}", g1, g2)
    # Gather with a read-only sendbuf, bytearray recv
    ro = x.copy(); ro.flags.writeable = False
    b1, b2 = bytearray(4 * k * p), bytearray(4 * k * p)
    h.Gather(ro, [b1, MPI.INT] if me == root else None, root=root)
    w.Gather(ro, [b2, MPI.INT] if me == root else None, root=root)
    cmp(f"Gather ro/bytearray root {root}", np.frombuffer(b1, np.uint8), np.frombuffer(b2, np.uint8))
    # Scatter
    src = (np.arange(k * p) * 3).astype(np.float64)
    ro = src.copy(); ro.flags.writeable = False
    r1, r2 = np.zeros(k), np.zeros(k)
    h.Scatter([ro, k, MPI.DOUBLE] if me == root else None, r1, root=root)
    w.Scatter([ro, k, MPI.DOUBLE] if me == root else None, r2, root=root)
    cmp(f"Scatter ro root {root}", r1, r2)
    s1 = src.copy(); s2 = src.copy()
    r1, r2 = np.zeros(k), np.zeros(k)
    h.Scatter(s1 if me == root else None, MPI.IN_PLACE if me == root else r1, root=root)
    w.Scatter(s2 if me == root else None, MPI.IN_PLACE if me == root else r2, root=root)
    cmp(f"Scatter IN_PLACE root {root}", r1, r2); cmp(f"Scatter IN_PLACE src root {root}", s1, s2)
    # Gatherv with displacements differing, IN_PLACE at root
    counts = [(r * 2 + root) % 3 for r in range(p)]
    displs = [sum(counts[r + 1:]) + (p - 1 - r) for r in range(p)]   # reversed with gaps
    n = max(d + c for d, c in zip(displs, counts))
    x = (np.arange(counts[me]) + 100 * me).astype(np.int64)
    g1, g2 = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    if me == root:
        g1[displs[me]:displs[me] + counts[me]] = x; g2[:] = g1
    h.Gatherv(MPI.IN_PLACE if me == root else x, [g1, counts, displs, MPI.INT64_T] if me == root else None, root=root)
    w.Gatherv(MPI.IN_PLACE if me == root else x, [g2, counts, displs, MPI.INT64_T] if me == root else None, root=root)
    cmp(f"Gatherv IN_PLACE rev root {root}", g1, g2)
    g1, g2 = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    h.Gatherv([x, MPI.INT64_T], [g1, (counts, displs), MPI.INT64_T] if me == root else None, root=root)
    w.Gatherv([x, MPI.INT64_T], [g2, (counts, displs), MPI.INT64_T] if me == root else None, root=root)
    cmp(f"Gatherv rev root {root}", g1, g2)
    # Scatterv
    src = np.arange(n, dtype=np.int64) * 7
    r1, r2 = np.zeros(counts[me], np.int64), np.zeros(counts[me], np.int64)
    h.Scatterv([src, counts, displs, MPI.INT64_T] if me == root else None, r1, root=root)
    w.Scatterv([src, counts, displs, MPI.INT64_T] if me == root else None, r2, root=root)
    cmp(f"Scatterv rev root {root}", r1, r2)
    # Scatterv overlapping read ranges at root
    od = [0] * p
    oc = [2] * p
    r1, r2 = np.zeros(2, np.int64), np.zeros(2, np.int64)
    h.Scatterv([src, oc, od, MPI.INT64_T] if me == root else None, r1, root=root)
    w.Scatterv([src, oc, od, MPI.INT64_T] if me == root else None, r2, root=root)
    cmp(f"Scatterv overlapping root {root}", r1, r2)
    # Scatterv IN_PLACE at root
    r1, r2 = np.zeros(counts[me], np.int64), np.zeros(counts[me], np.int64)
    h.Scatterv([src, counts, displs, MPI.INT64_T] if me == root else None, MPI.IN_PLACE if me == root else r1, root=root)
    w.Scatterv([src, counts, displs, MPI.INT64_T] if me == root else None, MPI.IN_PLACE if me == root else r2, root=root)
    cmp(f"Scatterv IN_PLACE root {root}", r1, r2)
print(f"rank {me} rooted done", flush=True)
# Allgather forms
x = (np.arange(k) + 10 * me).astype(np.int16)
g1, g2 = np.zeros(k * p, np.int16), np.zeros(k * p, np.int16)
h.Allgather([x, MPI.SHORT], [g1, MPI.SHORT]); w.Allgather([x, MPI.SHORT], [g2, MPI.SHORT]); cmp("Allgather", g1, g2)
g1, g2 = np.zeros(k * p + 3, np.int16), np.zeros(k * p + 3, np.int16)
h.Allgather([x, MPI.SHORT], [g1, (k, 1), MPI.SHORT]); w.Allgather([x, MPI.SHORT], [g2, (k, 1), MPI.SHORT]); cmp("Allgather displ", g1, g2)
f1 = np.zeros((k, p), np.int16, order="F"); f2 = f1.copy(order="F")
h.Allgather(x, f1); w.Allgather(x, f2); cmp("Allgather Fortran", f1, f2)
g1 = array.array("h", [0] * (k * p)); g2 = array.array("h", [0] * (k * p))
h.Allgather(x, g1); w.Allgather(x, g2); cmp("Allgather array.array", list(g1), list(g2))
z1, z2 = np.zeros(0), np.zeros(0)
h.Allgather(np.zeros(0), z1); w.Allgather(np.zeros(0), z2)
# Allgatherv with displacements differing per rank (only meaningful the same on all); stride form; counts scalar
counts = [r % 3 for r in range(p)]
displs = [3 * (p - 1 - r) for r in range(p)]
x = (np.arange(counts[me]) + 10 * me).astype(np.float32)
g1, g2 = np.full(3 * p, -1, np.float32), np.full(3 * p, -1, np.float32)
h.Allgatherv(x, [g1, (counts, displs), MPI.FLOAT]); w.Allgatherv(x, [g2, (counts, displs), MPI.FLOAT]); cmp("Allgatherv", g1, g2)
g1, g2 = np.full(3 * p, -1, np.float32), np.full(3 * p, -1, np.float32)
g1[displs[me]:displs[me] + counts[me]] = x; g2[:] = g1
h.Allgatherv(MPI.IN_PLACE, [g1, (counts, displs), MPI.FLOAT]); w.Allgatherv(MPI.IN_PLACE, [g2, (counts, displs), MPI.FLOAT]); cmp("Allgatherv IN_PLACE", g1, g2)
x = (np.arange(2) + 10 * me).astype(np.float32)
g1, g2 = np.full(3 * p, -1, np.float32), np.full(3 * p, -1, np.float32)
h.Allgatherv(x, [g1, (2, 3), MPI.FLOAT]); w.Allgatherv(x, [g2, (2, 3), MPI.FLOAT]); cmp("Allgatherv stride", g1, g2)
g1, g2 = np.full(2 * p, -1, np.float32), np.full(2 * p, -1, np.float32)
h.Allgatherv(x, g1); w.Allgatherv(x, g2); cmp("Allgatherv plain", g1, g2)
# Alltoall forms
x = (np.arange(k * p) + 100 * me).astype(np.uint32)
a1, a2 = np.zeros(k * p, np.uint32), np.zeros(k * p, np.uint32)
h.Alltoall([x, k, MPI.UINT32_T], [a1, k, MPI.UINT32_T]); w.Alltoall([x, k, MPI.UINT32_T], [a2, k, MPI.UINT32_T]); cmp("Alltoall", a1, a2)
a1 = x.copy(); a2 = x.copy()
h.Alltoall(MPI.IN_PLACE, a1); w.Alltoall(MPI.IN_PLACE, a2); cmp("Alltoall IN_PLACE", a1, a2)
# Reduce_scatter_block / Reduce_scatter uneven, IN_PLACE
x = (np.arange(k * p) + me).astype(np.int32)
r1, r2 = np.zeros(k, np.int32), np.zeros(k, np.int32)
h.Reduce_scatter_block([x, MPI.INT], [r1, MPI.INT], op=MPI.MAX); w.Reduce_scatter_block([x, MPI.INT], [r2, MPI.INT], op=MPI.MAX); cmp("RSB", r1, r2)
r1 = x.copy(); r2 = x.copy()
h.Reduce_scatter_block(MPI.IN_PLACE, r1, op=MPI.SUM); w.Reduce_scatter_block(MPI.IN_PLACE, r2, op=MPI.SUM); cmp("RSB IN_PLACE", r1[:k], r2[:k])
for counts in ([0, 5, 1, 2, 3][:p], [4] + [0] * (p - 1), [0] * (p - 1) + [4], [1, 2, 3, 4, 5][:p]):
    x = (np.arange(sum(counts)) * (me + 1)).astype(np.int64)
    r1, r2 = np.zeros(counts[me], np.int64), np.zeros(counts[me], np.int64)
    h.Reduce_scatter(x, r1, counts, op=MPI.SUM); w.Reduce_scatter(x, r2, counts, op=MPI.SUM); cmp(f"RS {counts}", r1, r2)
    r1, r2 = x.copy(), x.copy()
    h.Reduce_scatter(MPI.IN_PLACE, r1, counts, op=MPI.SUM); w.Reduce_scatter(MPI.IN_PLACE, r2, counts, op=MPI.SUM); cmp(f"RS IN_PLACE {counts}", r1[:counts[me]], r2[:counts[me]])
    r1, r2 = np.zeros(counts[me], np.int64), np.zeros(counts[me], np.int64)
    h.Reduce_scatter([x, MPI.INT64_T], [r1, MPI.INT64_T], counts, MPI.MIN); w.Reduce_scatter([x, MPI.INT64_T], [r2, MPI.INT64_T], counts, MPI.MIN); cmp(f"RS spec {counts}", r1, r2)
h.Barrier()
print(f"rank {me} done bad={len(bad)} fallbacks={h.fallbacks}", flush=True)
