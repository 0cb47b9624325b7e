"""The sizes below which each collective is MPI's own, on from_mpi's
communicator, a Dup and a Split of it (which must choose alike): rank 0
prints "rows (ROWS, ROWS, ROWS)", each {collective: bytes, None for
never}.  With argv[1] "mixed", the ranks from the middle on report their
machine crowded and the others not (machines that differ): every rank
must still choose alike, and a 32 KiB Allreduce (between MPICH's two
rows) gives the sum.  With "args", from_mpi's bad flat_below values
raise before anything is made: rank 0 prints "refused N"."""
import sys

import numpy as np
from mpi4py import MPI

import shmcoll
import shmcoll.multinode as mn

world, how = MPI.COMM_WORLD, sys.argv[1] if len(sys.argv) > 1 else ""
me, p = world.Get_rank(), world.Get_size()


def rows(c):
    return {k: None if v == float("inf") else v for k, v in c._below.items()}


if how == "args":
    refused = 0
    for bad in (True, 2.5, "1000", [("allreduce", 10)], {"allreduce": "big"}, {"allreduce": -5}, {"nope": 1},
                {"allreduce": 1.5e9}, -1):
        try:
            shmcoll.from_mpi(world, flat_below=bad).Free()
        except (TypeError, ValueError):
            refused += 1
    given = {"allreduce": np.int64(1000)}
    h = shmcoll.from_mpi(world, flat_below=given)
    given["allreduce"] = 5          # the communicator keeps its own copy: its derived ones too
    d = h.Dup()
    ok = h._below["allreduce"] == d._below["allreduce"] == 1000 and shmcoll.from_mpi(
        world, flat_below=np.int64(7))._below["bcast"] == 7
    d.Free()
    h.Free()
    if me == 0:
        print("refused", refused, "kept" if ok else "changed", flush=True)
    sys.exit(0)
if how == "mixed":
    real = mn.node_split
    mn.node_split = lambda comm: (lambda got: (got[0], world.Get_rank() >= p // 2, got[2]))(real(comm))
h = shmcoll.from_mpi(world)
d = h.Dup()
s = h.Split(me % 2, me)
got = world.allgather((rows(h), rows(d), rows(s)))
x, y = np.full(4096, me + 1.0), np.empty(4096)
h.Allreduce(x, y)
if me == 0:
    print("rows", repr(got[0]), "agree" if all(g == got[0] for g in got) else "differ",
          "sum" if (y == p * (p + 1) / 2).all() else "wrong", flush=True)
s.Free()
d.Free()
h.Free()
