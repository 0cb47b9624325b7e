"""Run under mpiexec (SHMCOLL_VIRTUAL_NODES optional): every hierarchical
collective of shmcoll.from_mpi against MPI's own on COMM_WORLD, same
inputs, results compared exactly (integer-valued data, so every order of
a sum is exact), and reductions repeated to show they are the same from
call to call.  Rank 0 prints "ok <checks of each rank>" at the end."""
import hashlib
import sys

import numpy as np
from mpi4py import MPI

import shmcoll
from shmcoll.multinode import flatc

w = MPI.COMM_WORLD
# argv[2], FLAT_BELOW for every collective: 0 (the default) the legs at
# every size, never MPI's own; past the sizes, MPI's own at every size,
# reached from C (csrc/mpiflat.c) for plain arrays
FLAT = int(sys.argv[2]) if len(sys.argv) > 2 else 0
if len(sys.argv) > 3:       # argv[3]: the bytes of a piece of a large Bcast, Reduce, Allreduce (hier.PIECE)
    shmcoll.multinode.hier.PIECE = int(sys.argv[3])
h = shmcoll.from_mpi(w, flat_below=FLAT)
hn = shmcoll.from_mpi(w, flat_below=FLAT, network=True)     # its legs as across a network (Allgather's differ)
p, me = h.Get_size(), h.Get_rank()
rng = np.random.default_rng(1234 + me)
SIZES = [int(x) for x in (sys.argv[1].split(",") if len(sys.argv) > 1 else "0,1,7,1000,70000".split(","))]
in_python = []          # FLAT: the C entries' collectives that ran their Python methods (none should)


def spy(frame, event, arg):
    if event == "call" and frame.f_code.co_name in flatc.CALLS and frame.f_code.co_filename.endswith("hier.py"):
        in_python.append(frame.f_code.co_name)


if FLAT:
    sys.setprofile(spy)
DTYPES = [np.float64, np.int32, np.float32, np.uint8]
checks = 0


def data(n, dt):
    return rng.integers(0, 50, n).astype(dt)


def same(a, b, what):
    global checks
    if not np.array_equal(a, b):
        bad = np.flatnonzero(a != b)[:5]
        raise AssertionError(f"rank {me}: {what}: differs from MPI's at {bad}: {a[bad]} vs {b[bad]}")
    checks += 1


for n in SIZES:
    for dt in DTYPES:
        tag = f"n={n} {np.dtype(dt).name}"
        for root in sorted({0, p - 1, p // 2}):
            b = data(n, dt) if me == root else np.zeros(n, dt)
            ref = b.copy()
            h.Bcast(b, root=root)
            w.Bcast(ref, root=root)
            same(b, ref, f"Bcast {tag} root {root}")
            for op in (MPI.SUM, MPI.MAX, MPI.PROD):
                x = data(n, dt) % 3 + 1 if op == MPI.PROD else data(n, dt)
                got, ref = np.zeros(n, dt), np.zeros(n, dt)
                h.Reduce(x, got if me == root else None, op=op, root=root)
                w.Reduce(x, ref if me == root else None, op=op, root=root)
                same(got, ref, f"Reduce {tag} root {root} {op}")
            x = data(n, dt)
            got, ref = np.zeros(n * p, dt), np.zeros(n * p, dt)
            h.Gather(x, got if me == root else None, root=root)
            w.Gather(x, ref if me == root else None, root=root)
            same(got, ref, f"Gather {tag} root {root}")
            x = data(n * p, dt) if me == root else None
            got, ref = np.zeros(n, dt), np.zeros(n, dt)
            h.Scatter(x, got, root=root)
            w.Scatter(x, ref, root=root)
            same(got, ref, f"Scatter {tag} root {root}")
            counts = np.arange(p) % 3 + n // 4
            displs = np.concatenate(([0], np.cumsum(counts)[:-1])) + np.arange(p)   # gaps between pieces
            x = data(int(counts[me]), dt)
            got, ref = np.zeros(int(counts.sum()) + p, dt), np.zeros(int(counts.sum()) + p, dt)
            h.Gatherv(x, [got, (counts, displs)] if me == root else None, root=root)
            w.Gatherv(x, [ref, (counts, displs)] if me == root else None, root=root)
            same(got, ref, f"Gatherv {tag} root {root}")
            src = data(int(counts.sum()) + p, dt) if me == root else None
            got, ref = np.zeros(int(counts[me]), dt), np.zeros(int(counts[me]), dt)
            h.Scatterv([src, (counts, displs)] if me == root else None, got, root=root)
            w.Scatterv([src, (counts, displs)] if me == root else None, ref, root=root)
            same(got, ref, f"Scatterv {tag} root {root}")
        for op in (MPI.SUM, MPI.MAX, MPI.MIN, MPI.PROD):
            x = data(n, dt) % 3 + (op == MPI.PROD)
            got, again, ref = np.zeros(n, dt), np.zeros(n, dt), np.zeros(n, dt)
            h.Allreduce(x, got, op=op)
            h.Allreduce(x, again, op=op)
            w.Allreduce(x, ref, op=op)
            same(got, ref, f"Allreduce {tag} {op}")
            same(again, got, f"Allreduce {tag} {op} repeated")
        if np.dtype(dt).kind == "f":
            # NaNs and signed zeros: every rank gets the same bits wherever
            # MPI's own call gives them (MPICH's recursive doubling, at
            # small sizes, does not: each partner folds the other's first)
            x = np.resize(np.array([np.nan, -0.0, 2.0] if me % 2 == 0 else [1.0, 0.0, -np.nan], dt), n)
            for op in (MPI.MAX, MPI.MIN, MPI.SUM):
                kinds = []
                for c in (h, w):
                    got = np.zeros(n, dt)
                    c.Allreduce(x, got, op=op)
                    kinds.append(len(set(w.allgather(hashlib.sha1(got.tobytes()).hexdigest()))))
                if kinds[0] > kinds[1]:
                    raise AssertionError(f"rank {me}: Allreduce {tag} {op} of NaNs and signed zeros: "
                                         f"{kinds[0]} different results among the ranks, MPI's own {kinds[1]}")
                checks += 1
        x = data(n, dt)
        got = x.copy()
        h.Allreduce(MPI.IN_PLACE, got)
        w.Allreduce(MPI.IN_PLACE, x)
        same(got, x, f"Allreduce IN_PLACE {tag}")
        x = data(n, dt)
        ref = np.zeros(n * p, dt)
        w.Allgather(x, ref)
        for c, how in ((h, ""), (hn, " across a network")):
            got = np.zeros(n * p, dt)
            c.Allgather(x, got)
            same(got, ref, f"Allgather{how} {tag}")
            got[:] = 0
            got[me * n:(me + 1) * n] = x
            c.Allgather(MPI.IN_PLACE, got)
            same(got, ref, f"Allgather IN_PLACE{how} {tag}")
        counts = (np.arange(p) * 7 + n) % 5 + n // 3
        x = data(int(counts[me]), dt)
        got, ref = np.zeros(int(counts.sum()), dt), np.zeros(int(counts.sum()), dt)
        h.Allgatherv(x, [got, counts])
        w.Allgatherv(x, [ref, counts])
        same(got, ref, f"Allgatherv {tag}")
        displs = np.concatenate(([0], np.cumsum(counts)[:-1]))[::-1].copy()    # pieces in reverse order
        displs = np.concatenate(([0], np.cumsum(counts[::-1])[:-1]))[::-1].copy()
        got, ref = np.zeros(int(counts.sum()), dt), np.zeros(int(counts.sum()), dt)
        h.Allgatherv(x, [got, (counts, displs)])
        w.Allgatherv(x, [ref, (counts, displs)])
        same(got, ref, f"Allgatherv reversed {tag}")
        x = data(n * p, dt)
        got, ref = np.zeros(n * p, dt), np.zeros(n * p, dt)
        h.Alltoall(x, got)
        w.Alltoall(x, ref)
        same(got, ref, f"Alltoall {tag}")
        x = data(n * p, dt)
        got, ref = np.zeros(n, dt), np.zeros(n, dt)
        h.Reduce_scatter_block(x, got, op=MPI.SUM)
        w.Reduce_scatter_block(x, ref, op=MPI.SUM)
        same(got, ref, f"Reduce_scatter_block {tag}")
        counts = (np.arange(p) + n) % 4 + n // 2
        x = data(int(counts.sum()), dt)
        got, ref = np.zeros(int(counts[me]), dt), np.zeros(int(counts[me]), dt)
        h.Reduce_scatter(x, got, counts, op=MPI.MAX)
        w.Reduce_scatter(x, ref, counts, op=MPI.MAX)
        same(got, ref, f"Reduce_scatter {tag}")
    h.Barrier()
sys.setprofile(None)
assert not in_python, f"rank {me}: these took the Python path: {sorted(set(in_python))}"
# specs with MPI datatypes, Fortran order, and a derived datatype (MPI's own path)
f = np.asfortranarray(rng.integers(0, 9, (3, 4)).astype(np.float64))
g, ref = f.copy(order="F"), f.copy(order="F")
h.Allreduce(MPI.IN_PLACE, [g, MPI.DOUBLE])
w.Allreduce(MPI.IN_PLACE, [ref, MPI.DOUBLE])
same(g, ref, "Allreduce Fortran [buf, MPI.DOUBLE]")
v = np.zeros(10, np.int32)
v[2:6] = me + 1
h.Bcast([v, 4, 2, MPI.INT], root=p - 1)
same(v[2:6], np.full(4, p, np.int32), "Bcast [buf, count, displ, MPI.INT]")
got, ref = np.zeros(3 * p), np.zeros(3 * p)     # None as sendbuf: mpi4py's IN_PLACE
got[3 * me:3 * me + 3] = ref[3 * me:3 * me + 3] = me + 1
h.Allgather(None, got)
w.Allgather(None, ref)
same(got, ref, "Allgather(None, recvbuf)")
h.Allreduce(None, got)
w.Allreduce(None, ref)
same(got, ref, "Allreduce(None, recvbuf)")
pair = MPI.INT.Create_contiguous(2).Commit()
x = np.arange(2 * p, dtype=np.int32) + me
got, ref = np.zeros(2 * p, np.int32), np.zeros(2 * p, np.int32)
h.Allgather([x[:2], 1, pair], [got, 1, pair])
w.Allgather([x[:2], 1, pair], [ref, 1, pair])
same(got, ref, "Allgather of a derived datatype")
pair.Free()
assert FLAT or h.fallbacks == 1, f"rank {me}: {h.fallbacks} calls were MPI's own, not only the derived datatype's"
h.Free()
hn.Free()
# small calls with the default sizes: MPI's own after the explicit checks, IN_PLACE and ops as given
d = shmcoll.from_mpi(w)
for root in range(p):
    x = rng.integers(0, 9, 5).astype(np.float64)
    got, ref = x.copy(), x.copy()
    d.Reduce(MPI.IN_PLACE if me == root else got, got if me == root else None, root=root)
    w.Reduce(MPI.IN_PLACE if me == root else ref, ref if me == root else None, root=root)
    same(got, ref, f"small Reduce IN_PLACE root {root}")
    got, ref = np.zeros(3 * p), np.zeros(3 * p)
    got[3 * me:3 * me + 3] = ref[3 * me:3 * me + 3] = me + 1
    d.Gather(MPI.IN_PLACE if me == root else got[3 * me:3 * me + 3], got if me == root else None, root=root)
    w.Gather(MPI.IN_PLACE if me == root else ref[3 * me:3 * me + 3], ref if me == root else None, root=root)
    same(got if me == root else ref, ref, f"small Gather IN_PLACE root {root}")
    src = np.arange(3.0 * p)
    got, ref = (src.copy(), src.copy()) if me == root else (np.zeros(3), np.zeros(3))
    d.Scatter(got if me == root else None, MPI.IN_PLACE if me == root else got, root=root)
    w.Scatter(ref if me == root else None, MPI.IN_PLACE if me == root else ref, root=root)
    same(got, ref, f"small Scatter IN_PLACE root {root}")
x = rng.integers(0, 9, 3 * p).astype(np.int64)
got, ref = x.copy(), x.copy()
d.Reduce_scatter_block(MPI.IN_PLACE, got, op=MPI.MAX)
w.Reduce_scatter_block(MPI.IN_PLACE, ref, op=MPI.MAX)
same(got[:3], ref[:3], "small Reduce_scatter_block IN_PLACE")
got, ref = x.copy(), x.copy()
d.Allreduce(MPI.IN_PLACE, got)
w.Allreduce(MPI.IN_PLACE, ref)
same(got, ref, "small Allreduce IN_PLACE, op left out")
d.Free()
every = w.gather(checks)
if me == 0:
    print("ok", *every, flush=True)
