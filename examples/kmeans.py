"""k-means on points split over ranks: Allreduce of per-cluster sums and counts.

Every rank draws the same seeded points and keeps every size-th one; each
iteration assigns its points to the nearest centroid, and one Allreduce of the
sums and one of the counts give every rank the new centroids.
"""
import importlib
import os

import numpy as np

MPI = importlib.import_module(os.environ.get("MPI_MODULE", "shmcoll.MPI"))  # or: from mpi4py import MPI

K, NPTS, STEPS = 4, 2000, 15
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

rng = np.random.default_rng(7)
centres = rng.uniform(-10, 10, (K, 2))
pts = centres[rng.integers(0, K, NPTS)] + rng.standard_normal((NPTS, 2))
mine = pts[rank::size]
cent = pts[:K].copy()                            # the same start on every rank

sums, counts = np.empty((K, 2)), np.empty(K, dtype=np.int64)
for _ in range(STEPS):
    label = np.argmin(((mine[:, None, :] - cent[None]) ** 2).sum(-1), axis=1)
    lsum = np.zeros((K, 2))
    np.add.at(lsum, label, mine)
    lcnt = np.bincount(label, minlength=K).astype(np.int64)
    comm.Allreduce([lsum, MPI.DOUBLE], [sums, MPI.DOUBLE], op=MPI.SUM)
    comm.Allreduce([lcnt, MPI.INT64_T], [counts, MPI.INT64_T], op=MPI.SUM)
    cent = sums / np.maximum(counts, 1)[:, None]
if rank == 0:
    for c, n in sorted(zip(cent.tolist(), counts.tolist())):
        print(f"centroid ({c[0]:+.4f}, {c[1]:+.4f}) points {n}")
