"""1-D heat equation with a halo exchange: Sendrecv with each neighbour.

The rod's cells are split in blocks; each step every rank swaps its edge cells
with its neighbours' ghost cells (PROC_NULL past the ends, whose ghosts stay
at the fixed boundary temperature), then updates its block.  Rank 0 gathers
the rod with Gatherv and prints it: the same numbers at any rank count.
"""
import importlib
import os

import numpy as np

MPI = importlib.import_module(os.environ.get("MPI_MODULE", "shmcoll.MPI"))  # or: from mpi4py import MPI

N, STEPS, ALPHA = 60, 200, 0.25
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
counts = [N // size + (r < N % size) for r in range(size)]
displs = [sum(counts[:r]) for r in range(size)]
left = rank - 1 if rank > 0 else MPI.PROC_NULL
right = rank + 1 if rank < size - 1 else MPI.PROC_NULL

x = np.arange(N, dtype=float)
u = np.zeros(counts[rank] + 2)                   # u[0], u[-1]: ghost cells
u[1:-1] = np.sin(np.pi * x[displs[rank]:displs[rank] + counts[rank]] / (N - 1)) * 100
u[0] = u[-1] = 0.0                               # the boundary, kept where the neighbour is PROC_NULL
for _ in range(STEPS):
    comm.Sendrecv([u[1:2], MPI.DOUBLE], dest=left, sendtag=1, recvbuf=[u[-1:], MPI.DOUBLE], source=right, recvtag=1)
    comm.Sendrecv([u[-2:-1], MPI.DOUBLE], dest=right, sendtag=2, recvbuf=[u[:1], MPI.DOUBLE], source=left, recvtag=2)
    u[1:-1] = u[1:-1] + ALPHA * (u[:-2] - 2 * u[1:-1] + u[2:])
rod = np.empty(N) if rank == 0 else None
comm.Gatherv([u[1:-1], MPI.DOUBLE], [rod, (counts, displs), MPI.DOUBLE] if rank == 0 else None, root=0)
if rank == 0:
    for i in range(0, N, 10):
        print(" ".join(f"{v:8.4f}" for v in rod[i:i + 10]))
