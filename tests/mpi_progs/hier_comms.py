"""Run under mpiexec on virtual nodes, SHMCOLL_FLAT_BELOW=0 (the legs at
every size): under `from shmcoll import MPI`, the communicators made from
COMM_WORLD (Dup, Clone, Split, Split_type, Create, Create_group, and a Dup
of a Split) are hierarchical, their collectives give what MPI's own give
on the same group, their point-to-point is MPI's, Free makes them
COMM_NULL and their collectives then raise MPI's error (Disconnect too),
a Dup and Free in a loop leaves no descriptor or mapping behind, a
communicator from Idup (MPI's own) still Dups, and COMM_WORLD is MPI's
own handle (its name, ==, pickling, attributes a Dup copies; Free refused).  Rank 0
prints "ok" and, per communicator made, the node sizes of each rank's."""
import os
import pickle

import numpy as np
from mpi4py import MPI as plain

from shmcoll import MPI
from shmcoll.multinode import Hier

world = MPI.COMM_WORLD
me, p = world.Get_rank(), world.Get_size()
evens = world.Get_group().Incl(list(range(0, p, 2)))


def made():
    """(name, the face's communicator, MPI's own over the same ranks)."""
    w = plain.COMM_WORLD
    yield "Dup", world.Dup(), w.Dup()
    yield "Clone", world.Clone(), w.Clone()
    yield "Split", world.Split(me % 2, -me), w.Split(me % 2, -me)
    yield "Split_undefined", world.Split(0 if me else MPI.UNDEFINED), w.Split(0 if me else plain.UNDEFINED)
    yield "Split_type", world.Split_type(MPI.COMM_TYPE_SHARED), w.Split_type(plain.COMM_TYPE_SHARED)
    yield "Create", world.Create(evens), w.Create(evens)
    if me % 2 == 0:
        yield "Create_group", world.Create_group(evens), w.Create_group(evens)
    half = world.Split(me < p // 2 + 1)
    yield "Dup_of_Split", half.Dup(), w.Split(me < p // 2 + 1)
    half.Free()


def check(name, c, ref):
    if ref == plain.COMM_NULL:
        assert c == MPI.COMM_NULL, name
        return None
    assert isinstance(c, plain.Intracomm) and isinstance(c.hier, Hier), (name, c)
    n, r = ref.Get_size(), ref.Get_rank()
    assert (c.Get_size(), c.Get_rank()) == (n, r), (name, c.Get_size(), c.Get_rank(), n, r)
    rng = np.random.default_rng(7 * me + 1)
    for k in (1, 3000):
        for root in range(n):
            got = rng.integers(0, 99, k).astype(np.float64) if r == root else np.zeros(k)
            want = got.copy()
            c.Bcast(got, root=root)
            ref.Bcast(want, root=root)
            assert np.array_equal(got, want), (name, "Bcast", k, root)
            x = rng.integers(0, 99, k)
            got, want = np.zeros(k, np.int64), np.zeros(k, np.int64)
            c.Reduce(x, got, op=MPI.MAX, root=root)
            ref.Reduce(x, want, op=plain.MAX, root=root)
            assert r != root or np.array_equal(got, want), (name, "Reduce", k, root)
            got, want = np.zeros(k * n, np.int64), np.zeros(k * n, np.int64)
            c.Gather(x, got, root=root)
            ref.Gather(x, want, root=root)
            assert r != root or np.array_equal(got, want), (name, "Gather", k, root)
        x = rng.integers(0, 99, k * n)
        for call in ("Allreduce", "Allgather", "Alltoall"):
            src = x[:k] if call == "Allgather" else x
            got, want = np.zeros(k * n, np.int64), np.zeros(k * n, np.int64)
            getattr(c, call)(src, got)
            getattr(ref, call)(src, want)
            assert np.array_equal(got, want), (name, call, k)
    c.Barrier()
    right, left = (r + 1) % n, (r - 1) % n
    got = np.zeros(2)
    c.Sendrecv(np.full(2, float(r)), right, 5, got, left, 5)
    assert list(got) == [left, left], (name, "Sendrecv", got)
    counts = [int(x) for x in c.hier.counts]
    (c.Disconnect if name == "Clone" else c.Free)()
    assert c == MPI.COMM_NULL and c.hier.freed, name
    try:
        c.Bcast(np.zeros(1), root=0)
    except plain.Exception as e:
        assert e.Get_error_class() == plain.ERR_COMM, (name, e)
    else:
        raise AssertionError(f"{name}: a collective on a freed communicator did not raise")
    ref.Free()
    return counts


def held():
    """This process's descriptors, and its mappings of shared memory (the
    heap's anonymous ones may grow)."""
    with open("/proc/self/maps") as f:
        return len(os.listdir("/proc/self/fd")), sum("/dev/shm" in line or "/memfd:" in line for line in f)


seen = {}
for name, c, ref in made():
    seen[name] = check(name, c, ref)
try:
    world.Free()
except plain.Exception:
    pass
else:
    raise AssertionError("COMM_WORLD.Free() did not raise")
assert world == plain.COMM_WORLD and world.Get_name() == "MPI_COMM_WORLD", world.Get_name()
assert pickle.loads(pickle.dumps(world)) is world
key = MPI.Comm.Create_keyval(copy_fn=lambda o, k, v: v)     # COMM_WORLD's attributes go to its Dup, as MPI's
world.Set_attr(key, "copied")
c = world.Dup()
assert c.Get_attr(key) == "copied" and hasattr(c, "hier"), c.Get_attr(key)
c.Free()
world.Delete_attr(key)
MPI.Comm.Free_keyval(key)
before = held()
for _ in range(10):
    c = world.Split(me % 2)
    c.Barrier()
    c.Free()
assert held() == before, (before, held())
c, req = world.Idup()
req.Wait()
d = c.Dup()
assert not hasattr(d, "hier") and d.Get_size() == p, d
d.Free()
c.Free()
b = np.full(4, float(me))
world.Bcast(b, root=p - 1)
assert list(b) == [p - 1] * 4, b
every = world.gather(seen)
if me == 0:
    print("ok", repr(every), flush=True)
