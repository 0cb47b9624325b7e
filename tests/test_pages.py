"""Large numpy arrays on aligned huge pages (csrc/pages.c, option
huge_bytes): a rank's arrays from huge_bytes on start on a 2 MiB boundary
and are advised whole, smaller ones go to numpy's own allocator; every
numpy path that allocates, grows, shrinks or frees keeps the data and
gives the memory back."""
import threading

import numpy as np
import pytest

from conftest import pattern, run_ranks

pytestmark = pytest.mark.timeout(120)

HUGE = 2 << 20
MIB = 1 << 20


def _thp():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


try:
    from numpy._core.multiarray import get_handler_name as _name
except ImportError:
    from numpy.core.multiarray import get_handler_name as _name


need_thp = pytest.mark.skipif(not _thp() or np.lib.NumpyVersion(np.__version__) < "1.22.0",
                              reason="transparent huge pages off, or numpy without NEP 49 handlers")


def _vm_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))


def _huge_kib(addr):
    """AnonHugePages of the mapping holding addr."""
    lines, hit = open("/proc/self/smaps").read().splitlines(), False
    for line in lines:
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            hit = lo <= addr < hi
        elif hit and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def _placement(comm, sizes):
    out = []
    for n in sizes:
        a = np.zeros(n, np.uint8)
        a[:] = 7
        out.append((a.ctypes.data % HUGE, _name(a), _huge_kib(a.ctypes.data), int(a.sum()) == 7 * n,
                    _huge_kib(a.ctypes.data + n - 1)))
    return out


@need_thp
@pytest.mark.parametrize("huge_bytes", [None, 3 * MIB])
def test_large_arrays_start_on_a_huge_page_and_get_them(huge_bytes):
    at = huge_bytes or 2 * MIB
    sizes = [at - 1, at, 8 * MIB + 1]
    opts = {} if huge_bytes is None else {"huge_bytes": huge_bytes}
    for rank in run_ranks(_placement, 2, sizes, options=opts):
        small, exact, big = rank
        assert small[1] == exact[1] == "shmcoll_huge_pages" and all(r[3] for r in rank)
        assert exact[0] == big[0] == 0
        assert exact[2] >= 2048 and big[2] >= 8 * 1024    # whole 2 MiB pages, kernel willing
        assert big[4] == 0            # the last byte's part holds no whole 2 MiB: small pages, no memory added
        assert small[0] != 0          # numpy's own allocation (malloc's header puts it off the boundary)


@need_thp
def test_huge_bytes_zero_keeps_numpys_allocator():
    for rank in run_ranks(_placement, 2, [8 * MIB], options={"huge_bytes": 0}):
        assert rank[0][1] == "default_allocator" and rank[0][0] != 0 and rank[0][3]


def _grow_shrink(comm):
    """Every numpy path through realloc: small to large (numpy's realloc:
    it alone knows the old size), large to larger, large to small, and
    fromiter's doubling; contents against closed forms."""
    checks = []
    a = pattern(1000, np.int64, comm.rank)
    a.resize(MIB, refcheck=False)                        # 8 KB -> 8 MiB (numpy's to ours)
    checks.append((a[:1000] == pattern(1000, np.int64, comm.rank)).all() and not a[1000:].any())
    b = pattern(MIB, np.int64, comm.rank, 1)
    b.resize(3 * MIB, refcheck=False)                    # ours to ours
    checks.append((b[:MIB] == pattern(MIB, np.int64, comm.rank, 1)).all() and not b[MIB:].any())
    checks.append(b.ctypes.data % HUGE == 0)
    b.resize(100, refcheck=False)                        # ours to numpy's
    checks.append((b == pattern(100, np.int64, comm.rank, 1)).all())
    c = np.fromiter((i * 3 for i in range(2_000_000)), np.int64)
    checks.append((c == np.arange(2_000_000, dtype=np.int64) * 3).all())
    return checks


@need_thp
def test_realloc_paths_keep_the_data():
    for rank in run_ranks(_grow_shrink, 2):
        assert all(rank), rank


def _churn(comm):
    """Allocate and free 8 MiB arrays, also from another thread and across
    threads; the mappings must go back (no leak) and new ones be zero."""
    for _ in range(3):
        np.ones(MIB, np.float64).sum()
    before = _vm_kib()
    dirty = True
    for i in range(200):
        a = np.zeros(MIB + i, np.float64)
        dirty &= not a.any()
        a[:] = i
        del a
    grown = _vm_kib() - before       # before threads: each reserves a stack and a malloc arena
    kept = [np.full(MIB, 2.0)]
    t = threading.Thread(target=kept.clear)        # freed by another thread
    t.start()
    t.join()
    made = []
    t = threading.Thread(target=lambda: made.append(np.zeros(MIB)))   # a new thread: numpy's own
    t.start()
    t.join()
    return dirty, grown, _name(made[0])


@need_thp
def test_freed_arrays_give_their_mappings_back():
    for zero, grown_kib, thread_handler in run_ranks(_churn, 2):
        assert zero and grown_kib < 32 * 1024, grown_kib
        assert thread_handler == "default_allocator"


def test_negative_huge_bytes_is_refused():
    with pytest.raises(ValueError, match="huge_bytes"):
        run_ranks(_placement, 1, [8], options={"huge_bytes": -1})
