"""One rank passes a different argument (argv[1] kind, argv[2] rank, argv[3] collective); argv[4]=mpi: plain MPI."""
import sys
import numpy as np
from mpi4py import MPI
import shmcoll

kind, odd, call = sys.argv[1], int(sys.argv[2]), sys.argv[3]
plain = len(sys.argv) > 4 and sys.argv[4] == "mpi"
h = MPI.COMM_WORLD if plain else shmcoll.from_mpi(MPI.COMM_WORLD, flat_below=0)
p, me = h.Get_size(), h.Get_rank()
n = 1000
m = n // 2 if (kind == "count" and me == odd) else n
root = (1 if me == odd else 0) if kind == "root" else 0
op = (MPI.MAX if me == odd else MPI.SUM) if kind == "op" else MPI.SUM
x = np.ones(m)
if call == "Allreduce": h.Allreduce(x, np.empty(m), op=op)
elif call == "Reduce": h.Reduce(x, np.empty(m), op=op, root=root)
elif call == "Bcast": h.Bcast(x, root=root)
elif call == "Gather": h.Gather(x, np.empty(m * p), root=root)
elif call == "Allgather": h.Allgather(x, np.empty(m * p))
elif call == "Scatter": h.Scatter(np.ones(m * p), x, root=root)
elif call == "Alltoall": h.Alltoall(np.ones(m * p), np.empty(m * p))
h.Barrier()
print(f"rank {me} finished", flush=True)
