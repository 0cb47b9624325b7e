"""Plain numpy arrays of dtypes MPI cannot map (struct, void, big-endian,
datetime, unicode): MPI's own call raises on every rank; the legs?"""
import sys
import numpy as np
from mpi4py import MPI
import shmcoll

w = MPI.COMM_WORLD
h = shmcoll.from_mpi(w, flat_below=0, abort_on_error=False)
p, me = h.Get_size(), h.Get_rank()
dt = sys.argv[1]
call = sys.argv[2]
x = np.zeros(4, dt)
try:
    if call == "Bcast":
        w.Bcast(x, root=0)
    else:
        w.Allgather(x, np.zeros(4 * p, dt))
    print(f"rank {me} MPI ok", flush=True)
except Exception as e:
    print(f"rank {me} MPI {type(e).__name__}: {e}", flush=True)
w.Barrier()
try:
    if call == "Bcast":
        h.Bcast(x, root=0)
    else:
        h.Allgather(x, np.zeros(4 * p, dt))
    print(f"rank {me} hier ok", flush=True)
except Exception as e:
    print(f"rank {me} hier {type(e).__name__}: {e}", flush=True)
h.Barrier()
print(f"rank {me} survived", flush=True)
