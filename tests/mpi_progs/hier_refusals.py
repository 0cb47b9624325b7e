"""Run under mpiexec with SHMCOLL_VIRTUAL_NODES=2,2: what MPI's own call
refuses on every rank (a dtype MPI cannot carry, a root that is no rank, an
op the dtype has not, MPI's or shmcoll's, send and receive buffers that do
not agree) the hierarchical call refuses on every rank with
MPI's exception, and the communicator goes on; MPI's pair types and WCHAR
in a spec give MPI's result.  Rank 0 prints "ok" at the end."""
import sys

import numpy as np
from mpi4py import MPI

import shmcoll

w = MPI.COMM_WORLD
# argv[1]: FLAT_BELOW for every collective (0: the legs; past the sizes: MPI's own, from C for plain arrays)
h = shmcoll.from_mpi(w, flat_below=int(sys.argv[1]) if len(sys.argv) > 1 else 0, abort_on_error=False)
p, me = h.Get_size(), h.Get_rank()


def refused(call):
    """The exception type call raises on w and on h (None: none)."""
    seen = []
    for c in (w, h):
        try:
            call(c)
            seen.append(None)
        except Exception as e:
            seen.append(type(e))
        x = np.ones(4)
        h.Allreduce(MPI.IN_PLACE, x)        # usable after
        assert x[0] == p
    return seen


cases = {
    "struct array": lambda c: c.Bcast(np.zeros(4, "i4,i4"), root=0),
    "void array": lambda c: c.Allgather(np.zeros(4, "V8"), np.zeros(4 * p, "V8")),
    "unicode array": lambda c: c.Gather(np.zeros(4, "U2"), np.zeros(4 * p, "U2"), root=1),
    "root -1": lambda c: c.Bcast(np.zeros(4), root=-1),
    "root p": lambda c: c.Reduce(np.zeros(4), np.zeros(4), root=p),
    "Gather root -1": lambda c: c.Gather(np.zeros(4), np.zeros(4 * p), root=-1),
    "Scatterv root -1": lambda c: c.Scatterv([np.zeros(4 * p), [4] * p], np.zeros(4), root=-1),
    "MAX of complex": lambda c: c.Allreduce(np.ones(4, complex), np.zeros(4, complex), op=MPI.MAX),
    "LAND of floats": lambda c: c.Reduce(np.ones(4), np.zeros(4), op=MPI.LAND, root=3),
    "BOR of floats": lambda c: c.Reduce_scatter_block(np.ones(4 * p), np.zeros(4), op=MPI.BOR),
    "Allreduce counts": lambda c: c.Allreduce(np.ones(10), np.zeros(5)),
    "Allreduce dtypes": lambda c: c.Allreduce(np.ones(10), np.zeros(10, np.float32)),
    "Allgather recvbuf short": lambda c: c.Allgather(np.ones(10), np.zeros(10 * p - 1)),
    "Alltoall blocks": lambda c: c.Alltoall(np.ones(10 * p + 1), np.zeros(10 * p + 1)),
    "Reduce_scatter_block counts": lambda c: c.Reduce_scatter_block(np.ones(3 * p), np.zeros(4)),
    # a buffer left out is no IN_PLACE (the C path once ran these in place, or hung the root)
    "Allreduce without sendbuf": lambda c: c.Allreduce(recvbuf=np.ones(4)),
    "Allgather without sendbuf": lambda c: c.Allgather(recvbuf=np.ones(4 * p)),
    "Alltoall without sendbuf": lambda c: c.Alltoall(recvbuf=np.ones(4 * p)),
    "Reduce_scatter_block without sendbuf": lambda c: c.Reduce_scatter_block(recvbuf=np.ones(4)),
    "Reduce without sendbuf": lambda c: c.Reduce(recvbuf=np.ones(4), root=0),
    "Gather without sendbuf": lambda c: c.Gather(recvbuf=np.ones(4 * p), root=0),
    "Scatter without recvbuf": lambda c: c.Scatter(np.ones(4 * p), root=0),
    "Bcast without buf": lambda c: c.Bcast(root=0),
    # mpi4py's default op is SUM; None is no op
    "Allreduce op None": lambda c: c.Allreduce(np.ones(4), np.zeros(4), op=None),
    "Reduce op None": lambda c: c.Reduce(np.ones(4), np.zeros(4), op=None, root=1),
    "Reduce_scatter_block op None": lambda c: c.Reduce_scatter_block(np.ones(4 * p), np.zeros(4), op=None),
    "Reduce_scatter op None": lambda c: c.Reduce_scatter(np.ones(4 * p), np.zeros(4), [4] * p, op=None),
}
for name, call in cases.items():
    mpi_exc, hier_exc = refused(call)
    assert mpi_exc is not None and hier_exc is mpi_exc, (me, name, mpi_exc, hier_exc)
# ops shmcoll folds on a dtype and MPI may not (MAX of bool: MPICH refuses
# it): the hierarchical call does what MPI's own does, on every rank (its
# MPI legs raised on the leaders that fold, and the others waited)
for op in (MPI.MAX, MPI.MIN, MPI.BAND, MPI.SUM):
    for name, call in (("Reduce", lambda c, x, y: c.Reduce(x, y, op=op, root=1)),
                       ("Allreduce", lambda c, x, y: c.Allreduce(x, y, op=op)),
                       ("Reduce_scatter_block", lambda c, x, y: c.Reduce_scatter_block(x, y[:len(x) // p], op=op))):
        seen = []
        for c in (w, h):
            x, y = np.arange(8 * p) % 3 == me % 2, np.zeros(8 * p, bool)
            try:
                call(c, x, y)
                seen.append(y[:8].tolist() if name != "Reduce" or me == 1 else None)
            except Exception as e:
                seen.append(type(e))
            x = np.ones(4)
            h.Allreduce(MPI.IN_PLACE, x)        # usable after
            assert x[0] == p
        assert seen[0] == seen[1], (me, name, op, seen)
for t in ("TWOINT", "DOUBLE_INT", "SHORT_INT", "WCHAR"):
    dt = getattr(MPI, t)
    n = 3 * dt.Get_extent()[1]
    for root in range(p):
        got = (np.arange(n) % 251).astype(np.uint8) if me == root else np.zeros(n, np.uint8)
        ref = got.copy()
        h.Bcast([got, 3, dt], root=root)
        w.Bcast([ref, 3, dt], root=root)
        assert np.array_equal(got, ref), (me, t, root)
    g, ref = np.zeros(n * p, np.uint8), np.zeros(n * p, np.uint8)
    mine = np.full(n, me, np.uint8)
    h.Allgather([mine, 3, dt], [g, 3, dt])
    w.Allgather([mine, 3, dt], [ref, 3, dt])
    assert np.array_equal(g, ref), (me, t)
# after Free, a call raises MPI's error, also through a method saved before
# (the C entries once kept the freed handle: MPICH ran the call on a newer
# communicator that reused it)
bcast = h.Bcast
h.Free()
dups = [w.Dup() for _ in range(6)]
for call in (bcast, h.Bcast):
    try:
        call(np.zeros(4), 0)
        raise AssertionError(f"rank {me}: a Bcast on the freed communicator returned")
    except MPI.Exception:
        pass
for d in dups:
    d.Free()
shmcoll.from_mpi(w, flat_below=1 << 63).Free()         # any size: MPI's own at every one
if me == 0:
    print("ok", flush=True)
