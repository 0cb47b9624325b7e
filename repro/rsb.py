import numpy as np
from mpi4py import MPI
import shmcoll
w = MPI.COMM_WORLD
h = shmcoll.from_mpi(w, flat_below=0)
p, me = w.Get_size(), w.Get_rank()
k = 3
def run(c, f):
    try:
        f(c); return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"
cases = {
 "IN_PLACE [r, k, INT]": lambda c, r: c.Reduce_scatter_block(MPI.IN_PLACE, [r, k, MPI.INT], op=MPI.SUM),
 "IN_PLACE [r, INT]": lambda c, r: c.Reduce_scatter_block(MPI.IN_PLACE, [r, MPI.INT], op=MPI.SUM),
 "IN_PLACE [r, k*p, INT]": lambda c, r: c.Reduce_scatter_block(MPI.IN_PLACE, [r, k * p, MPI.INT], op=MPI.SUM),
 "IN_PLACE [r, (k,1), INT]": lambda c, r: c.Reduce_scatter_block(MPI.IN_PLACE, [r, (k, 1), MPI.INT], op=MPI.SUM),
 "RS IN_PLACE [r,INT] counts": lambda c, r: c.Reduce_scatter(MPI.IN_PLACE, [r, MPI.INT], [k] * p, op=MPI.SUM),
 "RS IN_PLACE r counts=None": lambda c, r: c.Reduce_scatter(MPI.IN_PLACE, r, None, op=MPI.SUM),
 "RS x r recvcounts None": lambda c, r: c.Reduce_scatter(np.arange(k * p, dtype=np.int32), r[:k], op=MPI.SUM),
 "RS counts as np": lambda c, r: c.Reduce_scatter(np.arange(k * p, dtype=np.int32), r[:k], np.full(p, k), op=MPI.SUM),
 "RS big recvbuf": lambda c, r: c.Reduce_scatter(np.arange(k * p, dtype=np.int32), r, [k] * p, op=MPI.SUM),
 "RSB big recvbuf": lambda c, r: c.Reduce_scatter_block(np.arange(k * p, dtype=np.int32), r, op=MPI.SUM),
 "RSB [x,k,INT] big": lambda c, r: c.Reduce_scatter_block([np.arange(k * p + 5, dtype=np.int32), k, MPI.INT], [r, k, MPI.INT], op=MPI.SUM),
}
for name, f in cases.items():
    r1 = (np.arange(k * p + 2) + me).astype(np.int32); r2 = r1.copy()
    e2 = run(w, lambda c: f(c, r2))
    w.Barrier()
    if e2:
        if me == 0: print(f"{name}: MPI refuses: {e2}", flush=True)
        continue
    e1 = run(h, lambda c: f(c, r1))
    if e1 or not np.array_equal(r1, r2):
        print(f"rank {me} {name}: hier {e1 or ''} {r1.tolist()} vs mpi {r2.tolist()}", flush=True)
    h.Barrier()
print(f"rank {me} done", flush=True)
