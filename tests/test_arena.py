"""Ranks' arrays in a shared arena (csrc/pages.c, csrc/peers.c): a rank's
numpy arrays from huge_slot_bytes on live in a memfd its peers map, so
collectives copy from and into them, and fold them, with plain loads and
stores; fork gives a child its own copy, as private memory would; freed
arrays give their memory back; buffers elsewhere still go by single copy."""
import os

import numpy as np
import pytest

import shmcoll
from conftest import pattern, run_ranks

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
ARENA = "/memfd:shmcoll-arrays"

try:
    from numpy._core import multiarray
except ImportError:
    from numpy.core import multiarray


need_handler = pytest.mark.skipif(np.lib.NumpyVersion(np.__version__) < "1.22.0",
                                  reason="numpy without NEP 49 allocation handlers")


def _mapping_of(addr):
    """The name of the mapping holding addr ('' if anonymous)."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return parts[5].strip() if len(parts) > 5 else ""
    return None


def _rss_shmem_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssShmem:"))


def _where(comm, sizes):
    arrays = [np.ones(n, np.uint8) for n in sizes]
    return [_mapping_of(a.ctypes.data) for a in arrays]


@need_handler
def test_arrays_from_the_slot_size_live_in_the_arena():
    for rank in run_ranks(_where, 2, [1000, 64 << 10, 300 << 10, 2 * MIB, 40 * MIB]):
        small, *big = rank
        assert not small.startswith(ARENA)
        assert all(b.startswith(ARENA) for b in big), big


@need_handler
def test_huge_bytes_zero_makes_no_arena():
    for rank in run_ranks(_where, 1, [8 * MIB], options={"huge_bytes": 0}):
        assert not rank[0].startswith(ARENA)


def _collectives(comm, n):
    """Allreduce, Allgather, Alltoall, Bcast and Reduce_scatter_block of
    n-byte float64 inputs against numpy; the bytes moved in place
    (comm._dev.c.direct) around each."""
    p, r, k = comm.size, comm.rank, n // 8
    out, moved = [], []

    def run(f):
        before = comm._dev.c.direct
        out.append(f())
        moved.append(comm._dev.c.direct - before)
    x = pattern(k, np.float64, r)
    ref = sum(pattern(k, np.float64, q) for q in range(p))
    y = np.empty(k)
    run(lambda: (comm.Allreduce(x, y), np.array_equal(y, ref))[1])
    g = np.empty(k * p)
    run(lambda: (comm.Allgather(x, g), np.array_equal(g, np.concatenate([pattern(k, np.float64, q)
                                                                           for q in range(p)])))[1])
    s = pattern(k * p, np.float64, r, 1)
    a = np.empty(k * p)
    run(lambda: (comm.Alltoall(s, a), np.array_equal(a.reshape(p, k), np.stack(
        [pattern(k * p, np.float64, q, 1).reshape(p, k)[r] for q in range(p)])))[1])
    b = pattern(k, np.float64, 7) if r == 0 else np.empty(k)
    run(lambda: (comm.Bcast(b, root=0), np.array_equal(b, pattern(k, np.float64, 7)))[1])
    rs = np.empty(k // p)
    xs = pattern(k // p * p, np.float64, r, 2)
    run(lambda: (comm.Reduce_scatter_block(xs, rs), np.array_equal(
        rs, sum(pattern(k // p * p, np.float64, q, 2) for q in range(p)).reshape(p, -1)[r]))[1])
    return out, moved


@need_handler
@pytest.mark.parametrize("n", [3])
def test_collectives_on_arena_arrays_move_them_in_place(n):
    """16 MiB inputs: every collective's result against numpy, and the
    reductions' and gathers' single copies went by plain copies and folds
    where the inputs lie."""
    for ok, moved in run_ranks(_collectives, n, 16 * MIB):
        assert all(ok), ok
        assert moved[0] >= 16 * MIB * (n - 1) // n and moved[1] >= 16 * MIB, moved


@need_handler
def test_without_the_arena_the_same_collectives_go_by_single_copy():
    for ok, moved in run_ranks(_collectives, 3, 16 * MIB, options={"huge_bytes": 0}):
        assert all(ok) and not any(moved), (ok, moved)


def _foreign(comm):
    """Buffers outside the arena (a bytearray's, a numpy array from
    another thread, numpy's handler): single copies, same results."""
    import threading
    k, p = 2 * MIB, comm.size
    box = []
    t = threading.Thread(target=lambda: box.append(pattern(k, np.float64, comm.rank)))
    t.start()
    t.join()
    x = box[0]
    mem = bytearray(8 * k * p)
    before = comm._dev.c.direct
    comm.Allgather(x, np.frombuffer(mem, np.float64))
    got = np.frombuffer(mem, np.float64)
    want = np.concatenate([pattern(k, np.float64, q) for q in range(p)])
    return _mapping_of(x.ctypes.data).startswith(ARENA), comm._dev.c.direct - before, np.array_equal(got, want)


@need_handler
def test_buffers_outside_the_arena_go_by_single_copy():
    for in_arena, moved, ok in run_ranks(_foreign, 2):
        assert ok and not in_arena and moved == 0


def _forked(comm):
    """A child forked from a rank gets the arena's arrays as they were at
    fork, its own: the parent's later writes do not show in it, nor its in
    the parent's; it makes and frees its own large arrays."""
    a = np.full(4 * MIB, 1.0)
    s = np.full(100 << 10, 5, np.uint8)             # a slot
    comm.Allreduce(a.copy(), np.empty_like(a))      # the peer's arena mapped here
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.read(go_r, 1)                             # the parent has written 3.0 and 6 by now
        ok = bool((a == 1.0).all() and (s == 5).all())
        a[:] = 2.0
        s[:] = 9
        b = np.zeros(8 * MIB)
        ok &= not b.any() and not _mapping_of(b.ctypes.data).startswith(ARENA)    # no arena of its own
        ok &= _arenas_mapped() == 0                  # nor the peers' (not inherited)
        del b
        os.write(done_w, b"\1" if ok else b"\0")
        os._exit(0)
    os.close(go_r)
    a[:] = 3.0
    s[:] = 6
    os.write(go_w, b"x")
    child_ok = os.read(done_r, 1) == b"\1"
    _, status = os.waitpid(pid, 0)
    mine = bool((a == 3.0).all() and (s == 6).all())
    y = np.empty_like(a)
    comm.Allreduce(a, y)                             # the arena still serves the parent's collectives
    return child_ok, status, mine, bool((y == 3.0 * comm.size).all()), _mapping_of(a.ctypes.data).startswith(ARENA)


@need_handler
def test_a_forked_child_gets_its_own_copy_of_the_arena():
    for child_ok, status, mine, reduced, in_arena in run_ranks(_forked, 2):
        assert child_ok and status == 0 and mine and reduced and in_arena


def _arenas_mapped():
    with open("/proc/self/maps") as f:
        return sum(ARENA in line for line in f)


def _system_shmem_mib():
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Shmem:")) >> 10


def _fork_untouched(comm):
    """The child copies only what holds data: a never-touched 2 GiB
    array costs it (and the parent) nothing; reading the arena's holes
    would have filled them."""
    z = np.zeros(2 << 30, np.uint8)
    before = _system_shmem_mib()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if z[:4096].sum() == 0 else 1)
    _, status = os.waitpid(pid, 0)
    return status, _system_shmem_mib() - before


@need_handler
def test_fork_copies_only_what_holds_data():
    for status, grown in run_ranks(_fork_untouched, 1):
        assert status == 0 and grown < 64, grown


def _left(comm):
    x = np.ones(4 * MIB // 8)
    comm.Allreduce(x, np.empty_like(x))
    mapped = _arenas_mapped()
    comm.Free()                                      # the launcher's own Free finds it done
    return mapped, _arenas_mapped()


@need_handler
def test_leaving_unmaps_the_peers_arenas():
    """Each rank maps its own arena and its peer's; once it leaves the
    communicator, only its own: a peer that exits leaves no memory behind."""
    assert run_ranks(_left, 2) == [(2, 1), (2, 1)]


def _given_back(comm):
    a = np.ones(64 * MIB, np.uint8)                  # above what is kept for reuse: given back at once
    held = _rss_shmem_kib()
    del a
    return held - _rss_shmem_kib()


@need_handler
def test_freed_arena_arrays_give_their_memory_back():
    for freed_kib in run_ranks(_given_back, 1):
        assert freed_kib >= 60 * 1024, freed_kib
