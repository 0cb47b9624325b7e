"""Dominant eigenvalue of a symmetric matrix by power iteration, rows split over ranks.

Each rank owns a block of rows; every step multiplies its rows by the whole
vector, then Allgatherv puts the pieces together on every rank, and Allreduce
sums the partial dot products of the Rayleigh quotient.  Run it with
`shmcoll run -n 4 -- examples/power_iteration.py` (or MPI_MODULE=mpi4py.MPI
under mpiexec).
"""
import importlib
import os

import numpy as np

MPI = importlib.import_module(os.environ.get("MPI_MODULE", "shmcoll.MPI"))  # or: from mpi4py import MPI

N, STEPS = 96, 60
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

B = np.random.default_rng(2024).standard_normal((N, N))
A = B + B.T                                     # every rank makes the same matrix; it keeps its rows
nrows = N // size + (rank < N % size)
counts = np.zeros(size, dtype=np.int64)
comm.Allgather([np.array([nrows], dtype=np.int64), MPI.INT64_T], [counts, MPI.INT64_T])
displs = np.concatenate(([0], np.cumsum(counts)[:-1]))
mine = A[displs[rank]:displs[rank] + nrows]

x = np.ones(N)
lam = np.zeros(1)
for step in range(STEPS):
    y_loc = mine @ x
    part = np.array([x[displs[rank]:displs[rank] + nrows] @ y_loc])
    comm.Allreduce([part, MPI.DOUBLE], [lam, MPI.DOUBLE], op=MPI.SUM)   # x.Ax with |x| = 1: the estimate
    y = np.empty(N)
    comm.Allgatherv([y_loc, MPI.DOUBLE], [y, (counts, displs), MPI.DOUBLE])
    x = y / np.linalg.norm(y)
    if rank == 0 and step % 20 == 19:
        print(f"step {step + 1}: eigenvalue estimate {lam[0] / (1.0 if step else N):.6f}")
if rank == 0:
    print(f"eigenvalue {lam[0]:.6f}")
    print("vector head " + " ".join(f"{v:+.5f}" for v in x[:6] * np.sign(x[0])))
