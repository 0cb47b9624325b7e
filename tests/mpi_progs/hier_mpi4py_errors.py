"""Run under mpiexec with SHMCOLL_VIRTUAL_NODES=2,2 and
SHMCOLL_FLAT_BELOW=0, argv[1] one of the cases below: arguments mpi4py
refuses raise mpi4py's exception on the same ranks under the
hierarchical world (they went through the legs: a Gather or Scatter
root's buffer of no whole blocks, a Reduce_scatter recvbuf of another
count than its rank's, both taken; a strided buffer raised ValueError,
not mpi4py's BufferError).  Each call runs, on MPI's own communicator
and then on the face's, on the ranks that refuse it only (the others
would wait for them, as in MPI's own Scatter), and the world goes on.
Every rank prints "ok RANK"."""
import sys

import numpy as np
from mpi4py import MPI as plain

from shmcoll import MPI

world, w = MPI.COMM_WORLD, plain.COMM_WORLD.Dup()
me, p = world.Get_rank(), world.Get_size()
assert hasattr(world, "hier")
counts = [1, 2] * (p // 2)
a = np.arange(8 * p, dtype="f8")
CASES = {   # the call, and the ranks mpi4py refuses it on
    "gather": (lambda c: c.Gather(np.full(2, me, "i8"), np.zeros(2 * p + 1, "i8") if me == 0 else None, root=0),
               [0], ValueError),
    "scatter": (lambda c: c.Scatter(np.zeros(2 * p + 1, "i8") if me == 1 else None, np.zeros(2, "i8"), root=1),
                [1], ValueError),
    "reduce_scatter": (lambda c: c.Reduce_scatter(np.ones(sum(counts)), np.zeros(2), counts),
                       [r for r in range(p) if counts[r] != 2], ValueError),
    "strided": (lambda c: c.Bcast(a[::2], root=0), list(range(p)), BufferError),
    "strided recvbuf": (lambda c: c.Allreduce(a[::2].copy(), a[::2]), list(range(p)), BufferError),
}
call, refusing, exc = CASES[sys.argv[1]]
seen = []
for c in (w, world):
    try:
        call(c) if me in refusing else None     # the others would wait for them (MPI's own Scatter does)
        seen.append(None)
    except Exception as e:
        seen.append(type(e))
want = exc if me in refusing else None
assert seen == [want, want], (me, sys.argv[1], seen)
x = np.ones(4)
world.Allreduce(MPI.IN_PLACE, x)        # the refusal raised before any leg: the world goes on
assert x[0] == p, (me, x)
sys.stdout.write(f"ok {me}\n")      # one write: the ranks' lines do not interleave
