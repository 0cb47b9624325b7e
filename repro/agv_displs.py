"""Allgatherv whose displacements differ by rank (MPI: each rank lays out its own recvbuf)."""
import numpy as np
from mpi4py import MPI
import shmcoll
w = MPI.COMM_WORLD
h = shmcoll.from_mpi(w, flat_below=0)
p, me = w.Get_size(), w.Get_rank()
counts = [(r * 5 + 2) % 4 for r in range(p)]
if me % 2:
    displs = [sum(counts[r + 1:]) + 2 * (p - 1 - r) for r in range(p)]        # reversed, gaps
else:
    displs = list(np.concatenate(([0], np.cumsum(counts)[:-1])))             # packed
n = max(d + c for d, c in zip(displs, counts)) + 1
x = (np.arange(counts[me]) + 10 * me).astype(np.int32)
for inplace in (False, True):
    g1, g2 = np.full(n, -1, np.int32), np.full(n, -1, np.int32)
    if inplace:
        g1[displs[me]:displs[me] + counts[me]] = x; g2[:] = g1
    h.Allgatherv(MPI.IN_PLACE if inplace else x, [g1, (counts, displs), MPI.INT])
    w.Allgatherv(MPI.IN_PLACE if inplace else x, [g2, (counts, displs), MPI.INT])
    assert np.array_equal(g1, g2), (me, inplace, g1, g2)
print(f"rank {me} ok", flush=True)
