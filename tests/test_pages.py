"""Large numpy arrays on aligned huge pages (csrc/pages.c, option
huge_bytes): a rank's arrays from huge_bytes on start on a 2 MiB boundary
and are advised whole, smaller ones go to numpy's own allocator; every
numpy path that allocates, grows, shrinks or frees keeps the data and
gives the memory back."""
import ctypes
import os
import resource
import subprocess
import sys
import threading

import numpy as np
import pytest

import shmcoll
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
    from numpy._core import multiarray
except ImportError:
    from numpy.core import multiarray
_name = multiarray.get_handler_name


need_thp = pytest.mark.skipif(not _thp() or np.lib.NumpyVersion(np.__version__) < "1.22.0",
                              reason="transparent huge pages off, or numpy without NEP 49 handlers")


def _status_kib(key):
    """VmSize, VmRSS, ... of this process, KiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def _shared_thp():
    """Does the kernel give shared memory (the arena, a memfd) huge pages
    when asked (madvise)?  Where not, arena arrays sit on small pages."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            return f.read().split("[")[1].split("]")[0] in ("always", "within_size", "advise", "force")
    except (OSError, IndexError):
        return False


def _huge_kib(addr):
    """Huge pages (KiB) of the mapping holding addr (anonymous, or shared
    memory mapped by whole huge pages), and whether it is the arena."""
    lines, hit, kib, arena = open("/proc/self/smaps").read().splitlines(), False, 0, False
    for line in lines:
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            hit = lo <= addr < hi
            arena = arena or hit and "/memfd:shmcoll-arrays" in line
        elif hit and line.split()[0] in ("AnonHugePages:", "ShmemPmdMapped:", "FilePmdMapped:"):
            kib += int(line.split()[1])
    return kib, arena


def _whole(kib_arena, kib):
    """At least kib KiB on huge pages, where the kernel gives the memory
    any: the arena's only where shared memory gets them (_shared_thp)."""
    got, arena = kib_arena
    return got >= kib or arena and not _shared_thp()


def _placement(comm, sizes):
    out = []
    for n in sizes:
        a = np.zeros(n, np.uint8)
        a[:] = 7
        out.append((a.ctypes.data % HUGE, _name(a), _huge_kib(a.ctypes.data), int(a.sum()) == 7 * n))
    return out


@need_thp
@pytest.mark.parametrize("huge_bytes", [None, 3 * MIB])
def test_large_arrays_start_on_a_huge_page_and_get_them(huge_bytes):
    at = huge_bytes or 2 * MIB
    sizes = [at - 1, at, 8 * MIB + 1]
    opts = {} if huge_bytes is None else {"huge_bytes": huge_bytes}
    for rank in run_ranks(_placement, 2, sizes, options=opts):
        below, exact, big = rank
        assert below[1] == exact[1] == "shmcoll_huge_pages" and all(r[3] for r in rank)
        assert exact[0] == big[0] == 0
        assert exact[2][1] and big[2][1] and below[2][1] == (huge_bytes is None)    # in the arena
        assert _whole(exact[2], 2048) and _whole(big[2], 8 * 1024)    # whole 2 MiB pages, kernel willing
        if huge_bytes is None:        # 2 MiB - 1: a slot of 2 MiB, a huge page of its own
            assert below[0] == 0 and _whole(below[2], 2048)
        else:                         # 3 MiB - 1: above the slots, numpy's (malloc's header: off the boundary)
            assert below[0] != 0


def _slots(comm, sizes):
    """Per size: offset in its 2 MiB page, huge KiB there, contents kept;
    then the same after all are freed and made again."""
    out = []
    for _ in range(2):
        arrays = [pattern(n, np.uint8, comm.rank) for n in sizes]
        out.append([(a.ctypes.data % HUGE, a.ctypes.data % max(64 << 10, 1 << (n - 1).bit_length()),
                     _huge_kib(a.ctypes.data), bool((a == pattern(n, np.uint8, comm.rank)).all()))
                    for a, n in zip(arrays, sizes)])
        zeros = [np.zeros(n, np.uint8) for n in sizes]
        out[-1].append(all(not z.any() for z in zeros))
        del arrays, zeros
    return out


@need_thp
def test_mid_size_arrays_share_huge_pages_in_slots():
    """From huge_slot_bytes (64 KiB) to 2 MiB, arrays sit in slots of a
    power of two (aligned to it) on shared huge pages: a single copy pins
    one page, not one per 4 KiB.  Below, numpy's; made again after a free,
    they reuse the slots, and np.zeros from a reused slot is zero."""
    sizes = [(64 << 10) - 1, 64 << 10, (64 << 10) + 1, 256 << 10, 300 << 10, MIB, MIB + 1]
    for rank in run_ranks(_slots, 2, sizes):
        for made in rank:
            small, *slotted, zero = made
            assert all(r[3] for r in made[:-1]) and zero
            assert small[0] != 0          # numpy's own allocation (malloc's header puts it off the boundary)
            assert all(at == 0 for _, at, _, _ in slotted), slotted
            assert all(kib[1] and _whole(kib, 2048) for _, _, kib, _ in slotted), slotted


@need_thp
def test_huge_slot_bytes_zero_leaves_mid_size_arrays_to_numpy():
    for rank in run_ranks(_slots, 1, [256 << 10], options={"huge_slot_bytes": 0}):
        assert rank[0][0][1] != 0 and rank[0][0][3]


def _slot_churn(comm):
    """Many arrays of mixed mid sizes made, kept, grown (within the slot
    sizes: no large mapping is kept beside) and freed in a shuffled order:
    contents hold, and the slabs go back."""
    rng = np.random.default_rng(comm.rank)
    before, live, ok = _status_kib("VmRSS"), {}, True
    for i in range(3000):
        if live and rng.random() < 0.5:
            k = list(live)[int(rng.integers(len(live)))]
            a, n = live.pop(k)
            ok &= bool((a[:n] == k % 251).all())
            if rng.random() < 0.3:
                a.resize(min(n + int(rng.integers(1, MIB)), 2 * MIB - 1), refcheck=False)   # realloc, out of its slot
                ok &= bool((a[:n] == k % 251).all())
            del a
        else:
            n = int(rng.integers(64 << 10, 3 * MIB // 2))
            live[i] = (np.full(n, i % 251, np.uint8), n)
    live.clear()
    return ok, _status_kib("VmRSS") - before


@need_thp
def test_slots_keep_data_through_churn_and_give_slabs_back():
    for ok, grown_kib in run_ranks(_slot_churn, 2):
        assert ok
        assert grown_kib < 24 * 1024, grown_kib      # 8 empty slabs kept, and malloc's own (peak: about 64 MiB)


def _temporaries_of_three_sizes(comm):
    """Page faults of 50 rounds of three temporaries in three slot sizes,
    alone in their slabs."""
    def three():
        return np.ones(8 << 10), np.ones(100 << 7), np.ones(200 << 7)       # 64, 100, 200 KiB
    three()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        three()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@need_thp
def test_temporaries_in_slots_reuse_their_slabs():
    """With two empty slabs kept, the third emptied was unmapped each round
    and the next round faulted in (and zeroed) a fresh huge page: 350 us a
    round against 32 by numpy's allocator."""
    for faults in run_ranks(_temporaries_of_three_sizes, 1):
        assert faults < 10, faults


def _zeros_on_dirty_slots(comm):
    dirty = 0
    for n in (64 << 10, 100 << 10, 300 << 10, MIB + 1):
        a = np.full(n, 0xAB, np.uint8)
        at = a.ctypes.data
        del a
        z = np.zeros(n, np.uint8)
        dirty += z.ctypes.data != at or bool(z.any())
    return dirty


@need_thp
def test_zeros_in_a_reused_slot_are_zero():
    assert run_ranks(_zeros_on_dirty_slots, 2) == [0, 0]


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
    at = b.ctypes.data
    b.resize(MIB // 2, refcheck=False)                   # ours, smaller: in place (it cannot fail then)
    checks.append(b.ctypes.data == at and (b == pattern(MIB // 2, np.int64, comm.rank, 1)).all())
    b.resize(100, refcheck=False)
    checks.append(b.ctypes.data == at and (b == pattern(100, np.int64, comm.rank, 1)).all())
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
    before = _status_kib("VmSize")
    dirty = True
    for i in range(200):
        a = np.zeros(MIB + i, np.float64)
        dirty &= not a.any()
        a[:] = i
        del a
    grown = _status_kib("VmSize") - before       # before threads: each reserves a stack and a malloc arena
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


def _temporaries(comm, n):
    """Page faults of 50 temporaries of n bytes made and dropped."""
    a, b = np.ones(n // 8), np.ones(n // 8)
    (a + b).sum()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        c = a + b
        del c
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@need_thp
@pytest.mark.parametrize("nbytes", [3 * MIB, 8 * MIB])
def test_temporaries_reuse_their_mappings(nbytes):
    """A freed mapping is kept for the next array that fits, as malloc
    keeps its heap: fresh ones fault in every page again (3 MiB: 12,800
    faults for 50 temporaries)."""
    for faults in run_ranks(_temporaries, 2, nbytes):
        assert faults < 200, faults


def _handlers(comm, huge_bytes, user):
    if user:
        _user_handler()
    inner = shmcoll.launch(_placement, 1, ([8 * MIB],), options={"huge_bytes": huge_bytes})
    return _name(np.zeros(8 * MIB, np.uint8)), inner[0][0][1]


@need_thp
def test_a_rank_of_a_rank_follows_its_own_option():
    """A nested job's ranks inherit the handler by fork; huge_bytes=0
    there puts numpy's back, and the default keeps ours."""
    assert run_ranks(_handlers, 1, 0, False) == [("shmcoll_huge_pages", "default_allocator")]
    assert run_ranks(_handlers, 1, 2 * MIB, False) == [("shmcoll_huge_pages", "shmcoll_huge_pages")]


@need_thp
def test_a_users_own_allocation_handler_is_left_alone():
    """A handler the user set wins: nested ranks start, and keep it."""
    assert run_ranks(_handlers, 1, 2 * MIB, True) == [("user_malloc", "user_malloc")]


def _grow_inherited(comm, a):
    a.resize(5 * MIB, refcheck=False)
    return a.ctypes.data % HUGE, bool((a[:3 * MIB] == 3).all() and not a[3 * MIB:].any())


def _inherit(comm):
    a = np.full(3 * MIB, 3, np.uint8)
    return shmcoll.launch(_grow_inherited, 1, (a,), options={"huge_bytes": 0})[0], a.ctypes.data % HUGE


@need_thp
def test_off_in_a_rank_of_a_rank_holds_for_inherited_arrays():
    """An array the outer rank made on our handler, grown in a nested rank
    with huge_bytes=0, goes to numpy's allocator (malloc: off the boundary)."""
    (inner_at, kept), outer_at = run_ranks(_inherit, 1)[0]
    assert outer_at == 0 and inner_at != 0 and kept


def _reuse_rss(comm):
    live, before = [], _status_kib("VmRSS")
    for _ in range(10):
        big = np.ones(16 * MIB, np.uint8)
        del big
        live.append(np.zeros(8 * MIB + 4096, np.uint8))
        live[-1][:] = 1
    return _status_kib("VmRSS") - before


@need_thp
def test_a_reused_mapping_keeps_only_what_the_array_needs():
    """A kept 16 MiB mapping given to an 8 MiB array gives back the rest:
    10 such arrays held 160 MiB before, 80 plus the last 16 MiB kept now."""
    for grown in run_ranks(_reuse_rss, 1):
        assert grown < 120 * 1024, grown


def _cut(comm):
    big = np.ones(16 * MIB, np.uint8)
    del big
    a = np.zeros(8 * MIB + 4096, np.uint8)
    return _huge_kib(a.ctypes.data), a.ctypes.data % HUGE, not a.any()


@need_thp
def test_a_reused_mapping_is_cut_at_a_huge_page_boundary():
    """Cut at 8 MiB + 4 KiB, a huge page would be split, its cut-off part
    held by the kernel until memory runs short; at 10 MiB all five stay whole."""
    for huge_kib, at, zero in run_ranks(_cut, 1):
        assert _whole(huge_kib, 10 * 1024) and at == 0 and zero, huge_kib


def _turned_off(comm):
    from shmcoll.device import huge_arrays
    for _ in range(4):
        a = np.ones(8 * MIB, np.uint8)
        b = np.ones(8 * MIB, np.uint8)
        del a, b
    held = _status_kib("VmRSS")
    huge_arrays(0)
    return held - _status_kib("VmRSS")


@need_thp
def test_turning_it_off_gives_the_kept_mappings_back():
    for freed_kib in run_ranks(_turned_off, 1):
        assert freed_kib >= 12 * 1024, freed_kib


@need_thp
def test_a_handler_set_before_the_first_rank_is_left_alone():
    """In a fresh process: the user's handler, then a job; its ranks keep it."""
    code = ("import os, sys, numpy as np, shmcoll; sys.path.insert(0, %r); import test_pages as t; "
            "t._user_handler(); r = shmcoll.launch(t._numpy_says_no, 1, timeout=60); "
            "print(r[0][0], flush=True); os._exit(0)" % os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert out.stdout.split() == ["user_malloc"], out.stderr


def _numpy_says_no(comm):
    a = np.ones(8 * MIB, np.uint8)
    return _name(a), _huge_kib(a.ctypes.data)


@need_thp
def test_numpys_own_switch_turns_huge_pages_off(monkeypatch):
    """NUMPY_MADVISE_HUGEPAGE=0 (numpy's _set_madvise_hugepage) holds for
    us too: arrays still go to the arena, but nothing is advised."""
    was = multiarray._set_madvise_hugepage(False)
    try:
        assert run_ranks(_numpy_says_no, 2) == [("shmcoll_huge_pages", (0, True))] * 2
    finally:
        multiarray._set_madvise_hugepage(was)


@pytest.mark.parametrize("value", [-1, 1, 32 << 10, 96 << 10, 4 << 20])
def test_huge_slot_bytes_is_zero_or_a_power_of_two_to_a_huge_page(value):
    with pytest.raises(ValueError, match="huge_slot_bytes must be 0 .off. or a power of two from 64 KiB to 2 MiB"):
        run_ranks(_placement, 1, [8], options={"huge_slot_bytes": value})


@pytest.mark.parametrize("value", [-1, 1, (2 << 20) - 1, 1 << 62])
def test_huge_bytes_is_zero_or_at_least_a_huge_page(value):
    with pytest.raises(ValueError, match="huge_bytes must be 0 .off. or from 2 MiB"):
        run_ranks(_placement, 1, [8], options={"huge_bytes": value})


def _user_handler():
    """Set a NEP 49 handler of the user's (plain malloc, through ctypes)."""
    libc = ctypes.CDLL(None)
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    for f, res, args in (("malloc", vp, (sz,)), ("calloc", vp, (sz, sz)), ("realloc", vp, (vp, sz)),
                         ("free", None, (vp,))):
        getattr(libc, f).restype, getattr(libc, f).argtypes = res, args
    kinds = (ctypes.CFUNCTYPE(vp, vp, sz), ctypes.CFUNCTYPE(vp, vp, sz, sz), ctypes.CFUNCTYPE(vp, vp, vp, sz),
             ctypes.CFUNCTYPE(None, vp, vp, sz))

    class Handler(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char * 127), ("version", ctypes.c_uint8), ("ctx", vp),
                    ("malloc", kinds[0]), ("calloc", kinds[1]), ("realloc", kinds[2]), ("free", kinds[3])]
    h = Handler(b"user_malloc", 1, None, kinds[0](lambda c, n: libc.malloc(n)),
                kinds[1](lambda c, a, b: libc.calloc(a, b)), kinds[2](lambda c, p, n: libc.realloc(p, n)),
                kinds[3](lambda c, p, n: libc.free(p)))
    _user_handler.keep = h
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype, api.PyCapsule_GetPointer.argtypes = vp, (ctypes.py_object, ctypes.c_char_p)
    api.PyCapsule_New.restype, api.PyCapsule_New.argtypes = ctypes.py_object, (vp, ctypes.c_char_p, vp)
    table = ctypes.cast(api.PyCapsule_GetPointer(multiarray._ARRAY_API, None), ctypes.POINTER(vp))
    set_handler = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)(table[304])
    set_handler(api.PyCapsule_New(ctypes.addressof(h), b"mem_handler", None))
