"""Plain arrays of many dtypes and named MPI datatypes in specs, through the legs vs MPI."""
import sys
import numpy as np
from mpi4py import MPI
import shmcoll

w = MPI.COMM_WORLD
h = shmcoll.from_mpi(w, flat_below=0)
p, me = h.Get_size(), h.Get_rank()

def attempt(what, f1, f2, out1, out2):
    e1 = e2 = None
    try: f2()
    except Exception as e: e2 = e
    if e2 is not None:
        if me == 0: print(f"mpi-refuses {what}: {type(e2).__name__}", flush=True)
        return
    try: f1()
    except Exception as e: e1 = e
    if (e1 is None) != (e2 is None):
        print(f"rank {me} DIFF {what}: hier {type(e1).__name__ if e1 else 'ok'}: {e1} | mpi {type(e2).__name__ if e2 else 'ok'}: {e2}", flush=True)
    elif e1 is None and out1.tobytes() != out2.tobytes():
        print(f"rank {me} MISMATCH {what}: {out1[:4]} vs {out2[:4]}", flush=True)
    h.Barrier()

for dt in ("e", "g", "G", "F", "D", "?", "b", "B", "h", "H", "i", "I", "l", "L", "q", "Q", "f", "d", "c8"):
    for op in (MPI.SUM, MPI.MAX, MPI.LAND, MPI.BAND):
        x = (np.arange(4) % 3 + me).astype(dt)
        r1, r2 = np.zeros(4, dt), np.zeros(4, dt)
        attempt(f"Allreduce {np.dtype(dt)} {op.Get_name() if hasattr(op,'Get_name') else op}", lambda: h.Allreduce(x, r1, op=op), lambda: w.Allreduce(x, r2, op=op), r1, r2)
    b1 = (np.arange(4) + 1).astype(dt) if me == 0 else np.zeros(4, dt)
    b2 = b1.copy()
    attempt(f"Bcast {np.dtype(dt)}", lambda: h.Bcast(b1, root=0), lambda: w.Bcast(b2, root=0), b1, b2)
names = ["LONG_DOUBLE", "C_LONG_DOUBLE_COMPLEX", "CHAR", "WCHAR", "SIGNED_CHAR", "UNSIGNED_CHAR", "BYTE", "PACKED",
         "TWOINT", "SHORT_INT", "LONG_INT", "FLOAT_INT", "DOUBLE_INT", "LONG_DOUBLE_INT", "C_BOOL", "AINT", "OFFSET", "COUNT",
         "CXX_BOOL", "CXX_FLOAT_COMPLEX", "LOGICAL", "INTEGER", "REAL", "DOUBLE_PRECISION", "COMPLEX", "DOUBLE_COMPLEX",
         "INT8_T", "WCHAR", "UB", "LB"]
for name in names:
    t = getattr(MPI, name, None)
    if t is None or t == MPI.DATATYPE_NULL:
        continue
    try:
        ext = t.Get_extent()[1]
    except Exception:
        continue
    buf1 = np.zeros(4 * max(ext, 1), np.uint8); buf2 = buf1.copy()
    if me == 1:
        buf1[:] = np.arange(buf1.size) % 251; buf2[:] = buf1
    attempt(f"Bcast {name}", lambda: h.Bcast([buf1, 4, t], root=1), lambda: w.Bcast([buf2, 4, t], root=1), buf1, buf2)
    x = np.zeros(4 * max(ext, 1), np.uint8)
    x[::max(ext, 1)] = me + 1
    r1, r2 = np.zeros_like(x), np.zeros_like(x)
    attempt(f"Allreduce SUM {name}", lambda: h.Allreduce([x, 4, t], [r1, 4, t], op=MPI.SUM), lambda: w.Allreduce([x, 4, t], [r2, 4, t], op=MPI.SUM), r1, r2)
    r1, r2 = np.zeros_like(x), np.zeros_like(x)
    attempt(f"Allreduce MAX {name}", lambda: h.Allreduce([x, 4, t], [r1, 4, t], op=MPI.MAX), lambda: w.Allreduce([x, 4, t], [r2, 4, t], op=MPI.MAX), r1, r2)
    g1, g2 = np.zeros(p * x.size, np.uint8), np.zeros(p * x.size, np.uint8)
    attempt(f"Allgather {name}", lambda: h.Allgather([x, 4, t], [g1, 4, t]), lambda: w.Allgather([x, 4, t], [g2, 4, t]), g1, g2)
print(f"rank {me} done fallbacks={h.fallbacks}", flush=True)
