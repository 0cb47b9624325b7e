"""Bcast / bcast: every algorithm, rank count, topology, size class, dtype
and root, checked against the root's closed-form data.

Many cases run inside one launch() (process start-up would dominate
otherwise); each case gets its own data (salted with its call index), so a
reader that picks up a previous call's bytes fails."""
import random
import time

import numpy as np
import pytest

import shmcoll
from conftest import DTYPES, SMALL, attempt, counts_for, need_cma, pattern, poison, run_cases, run_ranks

ALGS = ["binomial", "original", "limited", "numa", None]
RANKS = [1, 2, 3, 4, 5, 7, 8]
CHUNK = SMALL["chunk_bytes"]
# inline limit 96; one chunk -1/0/+1; several chunks; more than the 8 KiB ring
SMALL_SIZES = [0, 1, 7, 96, 97, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5, 20 * CHUNK + 5]
DEFAULT_CHUNK = 256 << 10     # a quarter of this box's 1 MiB L2 (see device.make_plan)
INLINE = [16, 17, 4095, 4096, 4097]      # a tiny payload in the slot header's line, the built-in inline slot
DEFAULT_SIZES = [0, 96, 97, *INLINE, DEFAULT_CHUNK - 1, DEFAULT_CHUNK, DEFAULT_CHUNK + 1, (5 << 20) + 3]
MIB16 = 16 << 20


def alg_id(a):
    return a or "auto"


def _bcast_job(comm, cases, forms=False):
    """cases: [(algorithm, count, dtype, root)].  Returns the failures."""
    bad = []
    for seq, (alg, count, dtype, root) in enumerate(cases):
        want = pattern(count, dtype, seq, root)
        buf = want.copy() if comm.rank == root else poison(count, dtype)
        arg = buf
        if forms and seq % 3 == 1:
            arg = [buf, count, dtype]
        elif forms and seq % 3 == 2:
            arg = [buf.view(np.uint8), dtype]
        # numpy roots and buffer specs take the checked Python path, plain
        # arrays with int roots the fast C entry: both must agree
        comm.Bcast(arg, root=np.int64(root) if forms and seq % 2 else root, algorithm=alg)
        if buf.tobytes() != want.tobytes():
            diff = np.flatnonzero(buf.view(np.uint8) != want.view(np.uint8))
            bad.append(f"rank {comm.rank}: call {seq} alg={alg} count={count} dtype={np.dtype(dtype)} "
                       f"root={root}: {diff.size} bytes differ, first at byte {diff[0]}")
    return bad


def check(n, cases, **kw):
    run_cases(_bcast_job, n, cases, **kw)


def all_roots(n, algs, sizes, dtype=np.int8):
    return [(a, c, dtype, root) for a in algs for c in counts_for(sizes, dtype) for root in range(n)]


@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("alg", ALGS, ids=alg_id)
def test_bcast_algorithm_ranks_sizes_roots(alg, n):
    """Real topology, tiny channels: every size class, every root."""
    check(n, all_roots(n, [alg], SMALL_SIZES), options=SMALL)


VIRTUAL = [("2x2", 3), ("2x2", 4), ("2x4", 5), ("2x4", 8), ("4x2", 7), ("4x2", 8),
           ("2x2x2", 4), ("2x2x2", 3), ("2x4x4", 8), ("2x4x4", 5), ("4x2x4", 8), ("4x2x4", 7)]


@pytest.mark.parametrize("topo,n", VIRTUAL, ids=[f"{t}-{n}" for t, n in VIRTUAL])
def test_bcast_virtual_topologies(topo, n):
    """Every algorithm on virtual sockets / NUMA nodes (numa striping over
    2 and 4 nodes, limited groups per socket)."""
    sizes = [0, 7, 96, 97, CHUNK - 1, CHUNK + 1, 3 * CHUNK + 5, 20 * CHUNK + 5]
    check(n, all_roots(n, ALGS, sizes), topology=topo, options=SMALL)


@pytest.mark.parametrize("topo,n", [(None, 2), (None, 3), ("2x2x2", 4), ("2x4", 8), ("4x2x4", 7)])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_bcast_dtypes(dtype, topo, n):
    check(n, all_roots(n, ALGS, SMALL_SIZES, dtype), topology=topo, options=SMALL)


@pytest.mark.parametrize("topo,n", [(None, 2), (None, 4), ("2x2x2", 4)])
def test_bcast_default_options(topo, n):
    """Built-in chunk and channel sizes (2 MiB channels; 5 MiB wraps them)."""
    cases = [(a, c, np.int8, root) for a in ALGS for c in DEFAULT_SIZES
             for root in (sorted({0, n - 1}) if c < 1 << 20 else [n - 1])]
    cases += [(a, 1000, np.float64, 1 % n) for a in ALGS]
    check(n, cases, topology=topo)


BIG = [("original", 2, None, None), ("binomial", 3, None, SMALL), ("limited", 4, "2x2", None),
       ("numa", 4, "2x2x2", SMALL), (None, 2, None, None), (None, 5, "2x4x4", None)]


@pytest.mark.parametrize("alg,n,topo,opts", BIG, ids=[f"{alg_id(a)}-{n}-{t or 'real'}-{'small' if o else 'default'}"
                                                     for a, n, t, o in BIG])
def test_bcast_16mib(alg, n, topo, opts):
    cases = [(alg, MIB16, np.int8, n - 1), (alg, MIB16 // 8, np.float64, 0)]
    check(n, cases, topology=topo, options=opts)


@pytest.mark.parametrize("topo,n,opts", [(None, 3, SMALL), ("2x2x2", 4, SMALL), (None, 2, None),
                                         ("4x2x4", 8, SMALL)])
def test_bcast_back_to_back_mixed(topo, n, opts):
    """One job, calls of changing size, root, dtype and algorithm in a
    seeded random order: stale data from any earlier call must never be read."""
    rng = random.Random(1234 + n)
    sizes = SMALL_SIZES + [2, 95, 200, 4096, 8191, 8192, 8193, 50000]
    if opts is None:
        sizes += DEFAULT_SIZES
    cases = []
    for _ in range(400 if n <= 4 else 200):
        dtype = rng.choice(DTYPES)
        count = rng.choice(sizes) // np.dtype(dtype).itemsize
        cases.append((rng.choice(ALGS), count, dtype, rng.randrange(n)))
    check(n, cases, topology=topo, options=opts)


@pytest.mark.parametrize("n", [2, 3])
def test_bcast_buffer_forms(n):
    """[buf, count, dtype] and [buf, dtype] specs as well as plain arrays."""
    check(n, all_roots(n, ALGS, [0, 7, 97, 3000, 9000], np.float64), forms=True, options=SMALL)


def _prefix_job(comm):
    """[buf, count, dtype] with count < len(buf): only the prefix moves."""
    buf = np.arange(100, dtype=np.int32) if comm.rank == 0 else np.full(100, -1, np.int32)
    comm.Bcast([buf, 40, np.int32], root=0)
    raw = bytearray(b"xyz" * 50) if comm.rank == 0 else bytearray(150)
    comm.Bcast(raw, root=0)
    return buf.tolist(), bytes(raw)


def test_bcast_count_prefix_and_bytearray():
    out = run_ranks(_prefix_job, 3)
    for r, (buf, raw) in enumerate(out):
        want = list(range(100)) if r == 0 else list(range(40)) + [-1] * 60
        assert buf == want
        assert raw == b"xyz" * 50


def nested(seq, root, big):
    return {
        "seq": seq, "root": root,
        "list": [seq, (root, seq * 1.5), {"k": [None, True, "x" * (seq % 7)]}],
        "set": frozenset(range(seq % 5)),
        "bytes": bytes(range(seq % 256)) * (big // 256 + 1),
        "array": np.arange(seq + 3, dtype=np.float32) * root,
        "text": "é∑" * (big // 2),
    }


def _obj_job(comm, plan):
    out = []
    for seq, (root, big) in enumerate(plan):
        obj = nested(seq, root, big) if comm.rank == root else None
        out.append(comm.bcast(obj, root=root))
    return out


@pytest.mark.parametrize("n,opts", [(1, None), (2, None), (3, SMALL), (5, SMALL)])
def test_bcast_objects(n, opts):
    plan = [(seq % n, big) for seq, big in enumerate([0, 10, 100, 3000, 70000, 5, 300000])]
    results = run_ranks(_obj_job, n, plan, options=opts)
    for rank, got in enumerate(results):
        for seq, ((root, big), o) in enumerate(zip(plan, got)):
            want = nested(seq, root, big)
            arr, warr = o.pop("array"), want.pop("array")
            assert o == want, f"rank {rank} call {seq}"
            np.testing.assert_array_equal(arr, warr)


def _selected(comm, sizes):
    return [comm.selected("bcast", s) for s in sizes]


def test_bcast_selected_is_an_algorithm():
    sizes = [0, 96, 97, 16384, 16385, 1 << 20]
    for topo, n in [(None, 2), ("2x2x2", 4), ("2x4", 8)]:
        for names in run_ranks(_selected, n, sizes, topology=topo):
            assert all(a in shmcoll.algorithms("bcast") for a in names), names


# -- bad input on one rank -----------------------------------------------------

def _one_bad(comm, bad_rank, root, kind, options_check):
    """Rank bad_rank passes a bad argument; everyone then joins a Barrier.
    Returns (phase, exception type, message, exc.rank) or None."""
    count = 300
    buf = pattern(count, np.int32, 0, root) if comm.rank == root else poison(count, np.int32)
    arg, r, alg = buf, root, None
    if comm.rank == bad_rank:
        if kind == "short":
            arg = buf[:-1]
        elif kind == "long":
            arg = np.concatenate([buf, buf])
        elif kind == "dtype":
            arg = [buf, "no-such-type"]
        elif kind == "count":
            arg = [buf, count * 2, np.int32]
        elif kind == "noncontig":
            arg = np.repeat(buf, 2)[::2]
        elif kind == "readonly":
            arg = buf.copy()
            arg.setflags(write=False)
        elif kind == "bytes":
            arg = buf.tobytes()
        elif kind == "nonbuffer":
            arg = {"not": "a buffer"}
        elif kind == "root":
            r = comm.size
        elif kind == "negroot":
            r = -1
        elif kind == "algorithm":
            alg = "no-such-alg"
    return attempt(comm, "Bcast", lambda: comm.Bcast(arg, root=r, algorithm=alg))


LOCAL = {  # kind -> (exception type, words the message must contain)
    "dtype": ("KeyError", ["buf", "no-such-type"]),     # an unknown typecode, as mpi4py
    "count": ("ValueError", ["buf", "bytes"]),
    "noncontig": ("ValueError", ["buf", "contiguous"]),
    "readonly": ("BufferError", ["buf", "read-only"]),
    "bytes": ("BufferError", ["buf", "read-only"]),
    "nonbuffer": ("TypeError", ["buf", "dict"]),
    "root": ("ArgumentError", ["root"]),        # a ValueError with MPI class ERR_ROOT
    "negroot": ("ArgumentError", ["root"]),
    "algorithm": ("ValueError", ["no-such-alg", "bcast"]),
}
PEER = ("PeerAborted", "PeerDied")


@pytest.mark.parametrize("n,bad_rank,root", [(2, 1, 0), (3, 0, 0), (4, 2, 1)])
@pytest.mark.parametrize("kind", list(LOCAL))
def test_bcast_bad_argument_on_one_rank(kind, n, bad_rank, root):
    got = run_ranks(_one_bad, n, bad_rank, root, kind, 0)
    if kind in ("readonly", "bytes") and bad_rank == root:
        assert got == [None] * n, f"the root only reads its buffer: read-only must do ({got})"
        return
    etype, words = LOCAL[kind]
    assert got[bad_rank] is not None and got[bad_rank][:2] == ("Bcast", etype), got
    for w in words:
        assert w in got[bad_rank][2], got[bad_rank]
    for r in range(n):
        if r == bad_rank:
            continue
        assert got[r] is not None, f"rank {r} raised nothing (all: {got})"
        phase, name, msg, who = got[r]
        assert name in PEER and who == bad_rank, f"rank {r}: {got[r]}"
        if bad_rank == root:
            assert phase == "Bcast", f"rank {r} waited on the bad root but finished its Bcast: {got[r]}"


@pytest.mark.parametrize("alg", ALGS, ids=alg_id)
@pytest.mark.parametrize("n,bad_rank,root", [(2, 1, 0), (2, 0, 0), (3, 2, 0), (4, 0, 0), (4, 3, 1)])
@pytest.mark.parametrize("kind", ["short", "long"])
def test_bcast_size_mismatch_on_one_rank(kind, n, bad_rank, root, alg):
    def job(comm):
        count = 300
        buf = pattern(count, np.int32, 0, root) if comm.rank == root else poison(count, np.int32)
        if comm.rank == bad_rank:
            buf = buf[:-1] if kind == "short" else np.concatenate([buf, buf])
        return attempt(comm, "Bcast", lambda: comm.Bcast(buf, root=root, algorithm=alg))
    got = run_ranks(job, n, options=SMALL)
    assert all(g is not None for g in got), f"some rank raised nothing: {got}"
    detecting = [g for g in got if g[1] == "MismatchError"]
    assert detecting, f"no rank raised MismatchError: {got}"
    for g in detecting:
        assert "byte count" in g[2], g
    for g in got:
        assert g[1] in ("MismatchError",) + PEER, g


def _roots_differ(comm, then):
    buf = np.zeros(10, np.int64)
    try:
        comm.Bcast(buf, root=comm.rank % 2)
        err = None
    except Exception as e:
        err = (type(e).__name__, str(e))
    if not then:
        return err, True
    # a checked mismatch leaves the communicator usable ("all ranks see the
    # same table, so all raise together"): a correct call must still work
    ok = pattern(50, np.int64, 7, 0) if comm.rank == 0 else poison(50, np.int64)
    comm.Bcast(ok, root=0)
    return err, ok.tobytes() == pattern(50, np.int64, 7, 0).tobytes()


@pytest.mark.parametrize("how", ["option", "env"])
@pytest.mark.parametrize("n", [2, 3, 5])
def test_bcast_different_roots_with_check(n, how, monkeypatch):
    kw = {}
    if how == "option":
        kw["options"] = {"check": 1}
    else:
        monkeypatch.setenv("SHMCOLL_CHECK", "1")
    got = run_ranks(_roots_differ, n, False, **kw)
    for r, (err, _) in enumerate(got):
        assert err is not None and err[0] == "MismatchError" and "root" in err[1], f"rank {r}: {err}"


@pytest.mark.parametrize("n", [2, 3, 5])
def test_bcast_checked_mismatch_leaves_comm_usable(n):
    got = run_ranks(_roots_differ, n, True, options={"check": 1})
    for r, (err, ok) in enumerate(got):
        assert err is not None and err[0] == "MismatchError" and "root" in err[1], f"rank {r}: {err}"
        assert ok, f"rank {r}: Bcast after the checked mismatch delivered wrong data"


@pytest.mark.parametrize("n", [2, 4])
def test_bcast_different_sizes_with_check(n):
    def job(comm):
        buf = np.zeros(10 + (comm.rank == n - 1), np.int64)
        try:
            comm.Bcast(buf, root=0)
        except Exception as e:
            return type(e).__name__, str(e)
        return None
    got = run_ranks(job, n, options={"check": 1})
    for r, err in enumerate(got):
        assert err is not None and err[0] == "MismatchError" and "byte count" in err[1], f"rank {r}: {err}"


def test_bcast_rendezvous_two_ranks():
    """With one reader, big messages go by a single copy that both make
    (the reader reads the first pages out of the root's buffer while the
    root writes the rest into the reader's); force it down to one byte,
    every root, sizes around the page the halves are cut at, and compare."""
    need_cma(2)
    sizes = [1, 7, 96, 97, 4095, 4096, 4097, 5000, 8193, 65536, 300001]
    check(2, all_roots(2, ["original", None], sizes), options={"cma_bytes": 1})


def _protocols_differ(comm, second):
    """Call 1 agrees; in call 2 the root broadcasts 50 bytes (inline slot)
    while the other rank does `second` (a 1000-byte ring bcast or an
    alltoall): the other rank must see a mismatch, never stale data."""
    a = np.arange(1000, dtype=np.uint8) if comm.rank == 0 else np.zeros(1000, np.uint8)
    if second == "alltoall":
        s = np.arange(16, dtype=np.uint8).reshape(2, 8)
        comm.Alltoall(s, np.zeros_like(s))
    else:
        comm.Bcast(a, 0)
    try:
        if comm.rank == 0:
            comm.Bcast(np.full(50, 7, np.uint8), 0)
        elif second == "alltoall":
            s = np.arange(16, dtype=np.uint8).reshape(2, 8)
            comm.Alltoall(s, np.zeros_like(s))
        else:
            comm.Bcast(np.zeros(1000, np.uint8), 0)
        comm.Barrier()
    except Exception as e:
        return type(e).__name__, str(e)
    return None


@pytest.mark.parametrize("second", ["bcast", "alltoall"])
def test_mismatched_protocols_never_read_stale_data(second):
    got = run_ranks(_protocols_differ, 2, second, options={"cma_bytes": 0})
    assert all(g is not None and g[0] in ("PeerAborted", "MismatchError") for g in got), got
    assert any(g[0] == "MismatchError" and "differ" in g[1] for g in got), got


def _gil_hammer(comm, n):
    """Rank 1 waits slowly (the GIL is released) while another thread of it
    churns references to the very buffer being broadcast."""
    import sys
    import threading
    sys.setswitchinterval(1e-5)
    buf = np.zeros(8, np.uint8)
    if comm.rank == 0:
        for _ in range(n):
            t = time.perf_counter() + 30e-6
            while time.perf_counter() < t:
                pass
            comm.Bcast(buf, 0)
        return None
    stop = []
    def churn():
        while not stop:
            refs = [buf] * 2000
            del refs
    base = sys.getrefcount(buf)
    th = threading.Thread(target=churn)
    th.start()
    for _ in range(n):
        comm.Bcast(buf, 0)
    stop.append(1)
    th.join()
    return base, sys.getrefcount(buf)


def test_buffers_released_under_the_gil():
    """The fast entry retakes the GIL before releasing the caller's buffer."""
    _, (before, after) = run_ranks(_gil_hammer, 2, 20000, options={"spin_ns": 0, "yield_ns": 0}, bind="none")
    assert before == after


def _streamed_copies(comm, cases, forms):
    """Bcast, Alltoall and Allgather into recvbufs at every line offset,
    with every copy into user memory streamed (nt_bytes=1): the root's /
    senders' bytes exactly, nothing written outside recvbuf."""
    n, me, bad = comm.size, comm.rank, []
    for seq, (kind, off, count) in enumerate(cases):
        send = np.stack([pattern(count, np.uint8, seq, me, d) for d in range(n)])
        raw = np.full(n * count + off + 64, 0xA5, np.uint8)
        recv = raw[off:off + n * count]
        if kind == "bcast":
            recv = recv[:count]
            recv[:] = send[0] if me == 0 else 0
            comm.Bcast(recv, root=0)
            want = pattern(count, np.uint8, seq, 0, 0)
        elif kind == "alltoall":
            comm.Alltoall(send, recv)
            want = np.concatenate([pattern(count, np.uint8, seq, s, me) for s in range(n)])
        else:
            comm.Allgather(send[0], recv)
            want = np.concatenate([pattern(count, np.uint8, seq, s, 0) for s in range(n)])
        if not np.array_equal(recv, want):
            bad.append(f"{kind} off {off} count {count}: rank {me} got wrong bytes")
        if (raw[:off] != 0xA5).any() or (raw[off + recv.nbytes:] != 0xA5).any():
            bad.append(f"{kind} off {off} count {count}: rank {me} wrote outside recvbuf")
    return bad


@pytest.mark.parametrize("cma", [0, 1])
@pytest.mark.parametrize("n", [2, 3])
def test_streamed_copies_any_alignment(n, cma):
    """Copies into recvbuf streamed past the cache (sc_copy's nt path: whole
    lines streamed, partial lines at either end stored plainly) at line
    offsets 0, 1, 16, 33, 63 and sizes below, at and around the 4 KiB where
    streaming starts, and over several pages with a partial last line;
    with cma, Alltoall's single copies out of and into the peer's arena
    too (SC_OP_STREAMED), in several pieces at 1 MiB blocks."""
    if cma:
        need_cma(n)
    cases = [(kind, off, count) for kind in ("bcast", "alltoall", "allgather") for off in (0, 1, 16, 33, 63)
             for count in (63, 4095, 4096, 4097, 3 * 4096 + 33, (64 << 10) + 1)]
    cases += [("alltoall", off, (1 << 20) + 33) for off in (0, 33)]     # single copies in several pieces
    run_cases(_streamed_copies, n, cases, options={"nt_bytes": 1, "cma_bytes": cma}, timeout=300)
