"""Buffer-spec forms through the legs vs MPI's own call on the same data."""
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
        print(f"rank {me} MISMATCH {what}: {a.ravel()[:8]} vs {b.ravel()[:8]}", flush=True)

# Bcast: read-only root buffer, bytearray, array.array, zero-size
for root in range(p):
    x = np.arange(5, dtype=np.float64) + 10
    if me == root:
        ro = x.copy(); ro.flags.writeable = False
        h.Bcast(ro, root=root)
    else:
        y = np.zeros(5); h.Bcast(y, root=root); cmp(f"Bcast ro root {root}", y, x)
    b = bytearray(b"abcdefgh") if me == root else bytearray(8)
    h.Bcast(b, root=root); cmp(f"Bcast bytearray root {root}", np.frombuffer(b, np.uint8), np.frombuffer(b"abcdefgh", np.uint8))
    a = array.array("i", range(6)) if me == root else array.array("i", [0] * 6)
    h.Bcast(a, root=root); cmp(f"Bcast array.array root {root}", list(a), list(range(6)))
    z = np.zeros(0); h.Bcast(z, root=root)
    f = np.asfortranarray(np.arange(12.).reshape(3, 4)) if me == root else np.zeros((3, 4), order="F")
    h.Bcast(f, root=root); cmp(f"Bcast F root {root}", f, np.asfortranarray(np.arange(12.).reshape(3, 4)))
    v = np.zeros(10, np.int32); v[3:7] = 5 if me == root else 0
    h.Bcast([v, (4, 3), MPI.INT], root=root); cmp(f"Bcast (count,displ) root {root}", v[3:7], [5] * 4)
    v = np.zeros(10, np.int32); v[:] = 7 if me == root else 0
    h.Bcast([v, MPI.INT], root=root); cmp(f"Bcast [v,INT] {root}", v, [7] * 10)
    v = np.zeros(4, np.float64); v[:] = 7 if me == root else 0
    h.Bcast([v, 8, MPI.FLOAT], root=root); cmp(f"Bcast [v,8,FLOAT] {root}", v, [7.] * 4)
    v = np.zeros(4, np.float64); v[:] = 7 if me == root else 0
    h.Bcast([v, MPI.BYTE], root=root); cmp(f"Bcast [v,BYTE] {root}", v, [7.] * 4)
print(f"rank {me} bcast done", flush=True)
# Reduce/Allreduce with specs, every root, IN_PLACE root
for root in range(p):
    x = np.arange(6, dtype=np.int64) * (me + 1)
    r1, r2 = np.zeros(6, np.int64), np.zeros(6, np.int64)
    h.Reduce([x, MPI.INT64_T], [r1, MPI.INT64_T] if me == root else None, op=MPI.SUM, root=root)
    w.Reduce([x, MPI.INT64_T], [r2, MPI.INT64_T] if me == root else None, op=MPI.SUM, root=root)
    cmp(f"Reduce spec root {root}", r1, r2)
    r1, r2 = x.copy(), x.copy()
    h.Reduce(MPI.IN_PLACE if me == root else r1, r1 if me == root else None, op=MPI.MAX, root=root)
    w.Reduce(MPI.IN_PLACE if me == root else r2, r2 if me == root else None, op=MPI.MAX, root=root)
    cmp(f"Reduce IN_PLACE root {root}", r1, r2)
    ro = x.copy(); ro.flags.writeable = False
    r1, r2 = np.zeros(6, np.int64), np.zeros(6, np.int64)
    h.Reduce(ro, r1, op=MPI.PROD, root=root); w.Reduce(ro, r2, op=MPI.PROD, root=root)
    if me == root: cmp(f"Reduce ro root {root}", r1, r2)
    a1, a2 = array.array("d", [me + 1.0] * 3), array.array("d", [0.0] * 3)
    b1 = array.array("d", [0.0] * 3)
    h.Reduce(a1, b1, op=MPI.SUM, root=root); w.Reduce(a1, a2, op=MPI.SUM, root=root)
    if me == root: cmp(f"Reduce array.array root {root}", list(b1), list(a2))
x = np.arange(8, dtype=np.float32) + me
for op in (MPI.SUM, MPI.PROD, MPI.MAX, MPI.MIN):
    r1, r2 = np.zeros(8, np.float32), np.zeros(8, np.float32)
    h.Allreduce([x, 4, 2, MPI.FLOAT], [r1, 4, 2, MPI.FLOAT], op=op)
    w.Allreduce([x, 4, 2, MPI.FLOAT], [r2, 4, 2, MPI.FLOAT], op=op)
    cmp(f"Allreduce 4-spec {op}", r1, r2)
for op in (MPI.LAND, MPI.LOR, MPI.LXOR, MPI.BAND, MPI.BOR, MPI.BXOR):
    x = np.array([0, 1, 2, 3, me, me & 1], np.int32)
    r1, r2 = np.zeros(6, np.int32), np.zeros(6, np.int32)
    h.Allreduce(x, r1, op=op); w.Allreduce(x, r2, op=op)
    cmp(f"Allreduce int32 {op}", r1, r2)
x = np.array([True, False, me == 1, me > 1])
r1, r2 = np.zeros(4, bool), np.zeros(4, bool)
for op in (MPI.LAND, MPI.LOR, MPI.LXOR):
    h.Allreduce(x, r1, op=op); w.Allreduce(x, r2, op=op); cmp(f"Allreduce bool {op}", r1, r2)
for dt in (np.int8, np.uint16, np.int64, np.uint64, np.complex128, np.complex64):
    x = (np.arange(5) + me).astype(dt)
    r1, r2 = np.zeros(5, dt), np.zeros(5, dt)
    h.Allreduce(x, r1, op=MPI.SUM); w.Allreduce(x, r2, op=MPI.SUM); cmp(f"Allreduce SUM {dt}", r1, r2)
    h.Allreduce(x, r1, op=MPI.PROD); w.Allreduce(x, r2, op=MPI.PROD); cmp(f"Allreduce PROD {dt}", r1, r2)
print(f"rank {me} done bad={len(bad)}", flush=True)
