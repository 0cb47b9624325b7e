"""Parallel sample sort: Allgather of samples, Alltoall of counts, Alltoallv of the keys.

Each rank sorts its keys and offers size-1 regular samples; all samples give the
same splitters on every rank; each rank sends each bucket to its owner
(Alltoall of the bucket sizes, then Alltoallv of the keys) and sorts what it
gets.  Rank 0 gathers the result and prints what each rank held and a checksum.
"""
import importlib
import os

import numpy as np

MPI = importlib.import_module(os.environ.get("MPI_MODULE", "shmcoll.MPI"))  # or: from mpi4py import MPI

NKEYS = 5000
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

keys = np.random.default_rng(11).integers(0, 1_000_000, NKEYS, dtype=np.int64)
mine = np.sort(keys[rank::size])
samples = mine[np.linspace(0, len(mine), size + 1, dtype=int)[1:-1]]
allsamples = np.empty((size - 1) * size, dtype=np.int64)
comm.Allgather([samples, MPI.INT64_T], [allsamples, MPI.INT64_T])
allsamples.sort()
splitters = allsamples[size - 1::size][:size - 1] if size > 1 else allsamples
cuts = np.searchsorted(mine, splitters, side="right")
scounts = np.diff(np.concatenate(([0], cuts, [len(mine)]))).astype(np.int64)
rcounts = np.empty(size, dtype=np.int64)
comm.Alltoall([scounts, MPI.INT64_T], [rcounts, MPI.INT64_T])
sdispl = np.concatenate(([0], np.cumsum(scounts)[:-1]))
rdispl = np.concatenate(([0], np.cumsum(rcounts)[:-1]))
got = np.empty(rcounts.sum(), dtype=np.int64)
comm.Alltoallv([mine, (scounts, sdispl), MPI.INT64_T], [got, (rcounts, rdispl), MPI.INT64_T])
got.sort()
held = comm.gather(len(got), root=0)
out = np.empty(NKEYS, dtype=np.int64) if rank == 0 else None
comm.Gatherv([got, MPI.INT64_T], [out, (held, None), MPI.INT64_T] if rank == 0 else None, root=0)
if rank == 0:
    print(f"keys per rank {held}")
    print(f"sorted {bool(np.all(out[:-1] <= out[1:]))} same keys {np.array_equal(out, np.sort(keys))}")
    print(f"min {out[0]} median {out[NKEYS // 2]} max {out[-1]} checksum {int((out * np.arange(NKEYS)).sum())}")
