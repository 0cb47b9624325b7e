"""root=-1 (MPI: an invalid root, MPI_ERR_ROOT on every rank): the hierarchical call?"""
import sys
import numpy as np
from mpi4py import MPI
import shmcoll
w = MPI.COMM_WORLD
h = shmcoll.from_mpi(w, flat_below=0, abort_on_error=False)
p, me = w.Get_size(), w.Get_rank()
call = sys.argv[1]
def f(c):
    x = np.full(4, float(me))
    if call == "Bcast": c.Bcast(x, root=-1)
    elif call == "Reduce": c.Reduce(x, np.empty(4), root=-1)
    elif call == "Gather": c.Gather(x, np.empty(4 * p), root=-1)
    elif call == "Scatter": c.Scatter(np.zeros(4 * p), x, root=-1)
    elif call == "Gatherv": c.Gatherv(x, [np.empty(4 * p), [4] * p], root=-1)
    return x
for name, c in (("mpi", w), ("hier", h)):
    try:
        r = f(c); print(f"rank {me} {name}: returned {r[0]}", flush=True)
    except Exception as e:
        print(f"rank {me} {name}: {type(e).__name__}: {str(e)[:80]}", flush=True)
    w.Barrier()
