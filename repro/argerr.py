"""The same bad arguments on every rank: MPI raises on every rank and the communicator goes on;
and the hierarchical one? (then a good call on it)"""
import sys
import numpy as np
from mpi4py import MPI
import shmcoll
w = MPI.COMM_WORLD
h = shmcoll.from_mpi(w, flat_below=0, abort_on_error=False)
p, me = w.Get_size(), w.Get_rank()
cases = {
  "Allreduce sizes": lambda c: c.Allreduce(np.ones(10), np.empty(5)),
  "Allreduce dtypes": lambda c: c.Allreduce(np.ones(10), np.empty(10, np.float32)),
  "Allreduce MAX complex": lambda c: c.Allreduce(np.ones(10, complex), np.empty(10, complex), op=MPI.MAX),
  "Allreduce LAND float": lambda c: c.Allreduce(np.ones(10), np.empty(10), op=MPI.LAND),
  "Reduce root out of range": lambda c: c.Reduce(np.ones(10), np.empty(10), root=p),
  "Bcast root out of range": lambda c: c.Bcast(np.ones(10), root=-5),
  "Allgather recv too small": lambda c: c.Allgather(np.ones(10), np.empty(10 * p - 1)),
  "Alltoall not divisible": lambda c: c.Alltoall(np.ones(10 * p + 1), np.empty(10 * p + 1)),
  "Gather dtype": lambda c: c.Gather(np.ones(10), np.empty(10 * p, np.int64), root=0),
}
which = sys.argv[1]
f = cases[which]
try:
    f(w); res = "ok"
except Exception as e:
    res = f"{type(e).__name__}"
w.Barrier()
try:
    f(h); res2 = "ok"
except Exception as e:
    res2 = f"{type(e).__name__}: {str(e)[:90]}"
print(f"rank {me} mpi: {res} hier: {res2}", flush=True)
x = np.ones(4)
h.Allreduce(MPI.IN_PLACE, x)
print(f"rank {me} hier still usable {x[0]}", flush=True)
