"""Issue 7 defects: every mismatch raises on every rank and nothing hangs,
concurrent use from two threads, object dtypes, split Alltoall elements,
local errors abort the communicator, stall timeout (SIGSTOP), SIGINT while
blocked, read-only root buffers.

Each multi-rank case runs under a short launch timeout (the fixed engine
raises within milliseconds, so a hang fails the test as TimeoutError well
before pytest-timeout's outer limit).  Outcomes are classified inside the
ranks with isinstance, so subclasses the engine may add still count."""
import contextlib
import os
import re
import select
import signal
import threading
import time

import numpy as np
import pytest

import shmcoll
from conftest import SMALL, attempt, graph_bind, pattern, poison, run_ranks, shared_array
from shmcoll._core import lib

pytestmark = pytest.mark.timeout(120)

T = 20                      # launch timeout for cases that hung on the old engine
CHUNK = SMALL["chunk_bytes"]
MismatchError = getattr(shmcoll, "MismatchError", None)
PeerTimeout = getattr(shmcoll, "PeerTimeout", None)


def kind_of(e):
    """'mismatch' / 'timeout' / 'peer' for shmcoll's classes, else the type name."""
    if MismatchError is not None and isinstance(e, MismatchError):
        return "mismatch"
    if PeerTimeout is not None and isinstance(e, PeerTimeout):
        return "timeout"
    if isinstance(e, shmcoll.PeerFailure):
        return "peer"
    return type(e).__name__


def describe(e):
    return (kind_of(e), str(e), getattr(e, "rank", None), tuple(c.__name__ for c in type(e).__mro__))


def attempt_kind(comm, name, call):
    """conftest.attempt, classified: (phase, kind, message, .rank, names of
    the exception's classes) or None."""
    return attempt(comm, name, call, describe)


def assert_all_raise(got, field):
    """Every rank raised MismatchError or PeerFailure; at least one
    MismatchError, and every MismatchError names `field`."""
    assert all(g is not None for g in got), f"some rank raised nothing: {got}"
    assert all(g[1] in ("mismatch", "peer") for g in got), got
    mism = [g for g in got if g[1] == "mismatch"]
    assert mism, f"no rank raised MismatchError: {got}"
    for g in mism:
        assert field in g[2], f"the message should name {field!r}: {g}"


def test_error_classes():
    assert issubclass(shmcoll.MismatchError, shmcoll.ShmcollError)
    assert issubclass(shmcoll.MismatchError, ValueError)
    assert issubclass(shmcoll.PeerTimeout, shmcoll.PeerFailure)


# -- (a) different collectives on different ranks -------------------------------

def _do(comm, op):
    n, me = comm.size, comm.rank
    if op == "Barrier":
        comm.Barrier()
    elif op == "Bcast":
        want = pattern(1000, np.int8, 1, 0)
        buf = want.copy() if me == 0 else poison(1000, np.int8)
        comm.Bcast(buf, root=0)
    else:
        send = pattern(n * 64, np.int8, 2, me).reshape(n, 64)
        comm.Alltoall(send, poison(n * 64, np.int8).reshape(n, 64))


def _mixed_job(comm, ops):
    op = ops[comm.rank]
    return attempt_kind(comm, op, lambda: _do(comm, op))


MIXED = [("Barrier", "Bcast"), ("Bcast", "Barrier"), ("Barrier", "Alltoall"), ("Alltoall", "Barrier"),
         ("Bcast", "Alltoall"), ("Alltoall", "Bcast"), ("Barrier", "Bcast", "Alltoall"),
         ("Alltoall", "Barrier", "Bcast")]


@pytest.mark.parametrize("check", [0, 1])
@pytest.mark.parametrize("ops", MIXED, ids="-".join)
def test_different_collectives_raise_everywhere(ops, check):
    got = run_ranks(_mixed_job, len(ops), ops, timeout=T, options={"check": check})
    assert_all_raise(got, "collective")


def _one_differs(comm, bad, kind):
    """Rank bad's call differs (kind); how this rank's call failed, or if
    it returned, how its next Barrier did."""
    n = 40 + 3 * (comm.rank == bad)
    x = np.ones(40, np.float64)
    calls = {"alltoall": ("Alltoall", lambda: comm.Alltoall(np.ones(n * comm.size, np.int32),
                                                           np.empty(n * comm.size, np.int32))),
             "reduce": ("Reduce", lambda: comm.Reduce(np.ones(n), np.empty(n), root=0)),
             "root": ("Bcast", lambda: comm.Bcast(x, root=int(comm.rank == bad))),
             "collective": ("Bcast", lambda: comm.Bcast(x) if comm.rank == bad else comm.Allreduce(x, x * 0))}
    name, call = calls[kind]
    return attempt_kind(comm, name, call) or attempt_kind(comm, "Barrier", comm.Barrier)


@pytest.mark.parametrize("kind,field", [("alltoall", "byte count"), ("reduce", "byte count"), ("root", "root"),
                                        ("collective", "collective")])
@pytest.mark.parametrize("n,bad", [(2, 1), (5, 2), (5, 4)])
def test_every_rank_raises_the_mismatch_naming_the_field(kind, field, n, bad):
    """The ranks that never compare records with the one whose call
    differs learn of it through the abort; they raised PeerAborted ("passed
    bad or mismatched arguments") and now raise the finder's MismatchError,
    naming the field and both ranks, in the call or at their next."""
    got = run_ranks(_one_differs, n, bad, kind, timeout=T)
    assert all(g is not None and g[1] == "mismatch" and field in g[2] for g in got), got
    assert all(re.search(r"rank \d+ has .*, rank \d+ has ", g[2]) for g in got), got


def _first_call_zero(comm):
    """The first call numbered 0 (call_base 2^64 - 2: the launcher's two
    calls come first): rank 0 stages 200 B, the others expect 8 B inline."""
    return attempt_kind(comm, "Bcast", lambda: comm.Bcast(np.zeros(200 if comm.rank == 0 else 8, np.uint8), root=0))


@pytest.mark.parametrize("n", [2, 3])
def test_an_unwritten_slot_is_no_record_of_call_0(n):
    """Slot headers started zeroed, so at call 0 a slot no writer had
    stamped passed for the writer's record of that call: the reader
    compared zeros and named the collective ("rank 0 has 0")."""
    got = run_ranks(_first_call_zero, n, timeout=T, options=dict(call_base=2**64 - 2))
    assert all(g is not None and g[1] == "mismatch" and "(byte count)" in g[2] for g in got), got


def _found_late(comm, linger):
    """Call 0: Reduce to rank 2, rank 3 with MAX, the others SUM; call 1:
    Gather to rank 1; call 2: Bcast from rank 2.  Rank 3 sends in calls 0
    and 1, so it reaches call 2 first and finds the mismatch of call 0 in
    rank 2's record.  Its abort once counted from call 2 only, so rank 1,
    in call 1 waiting on ranks that had raised and went on (here: linger),
    waited until they exited or the stall timeout.  The late starts only
    make that order likely; the test holds for any order."""
    r = comm.rank
    time.sleep({0: 0.6, 1: 0.6, 2: 0.2, 3: 0.0}[r])      # not a synchronisation: see the docstring
    t = time.monotonic()
    try:
        comm.Reduce(np.ones(17), np.zeros(17) if r == 2 else None, op=shmcoll.MAX if r == 3 else shmcoll.SUM, root=2)
        comm.Gather(np.zeros(1, np.uint8), np.zeros((4, 1), np.uint8) if r == 1 else None, root=1)
        comm.Bcast(np.zeros(8, np.uint8), root=2)
        return None
    except Exception as e:
        took = time.monotonic() - t
        time.sleep(linger)                  # a rank that logs the error and carries on
        return kind_of(e), took, str(e)


def test_a_mismatch_found_calls_later_aborts_from_the_call_it_is_in():
    got = run_ranks(_found_late, 4, 5.0, timeout=60, options=dict(timeout=30))
    assert all(g is not None and g[0] in ("mismatch", "peer") and g[1] < 3.0 for g in got), got
    assert any(g[0] == "mismatch" and "(op)" in g[2] for g in got), got


# -- (b) different Barrier algorithms -----------------------------------------------

@pytest.mark.parametrize("algs", [("original", "padded", "hierarchical"), ("padded", "padded", "all_to_all"),
                                  ("all_to_all", "original", "original"), ("hierarchical", "hierarchical", "padded")],
                         ids="-".join)
def test_different_barrier_algorithms_raise(algs):
    def job(comm):
        return attempt_kind(comm, "Barrier", lambda: comm.Barrier(algs[comm.rank]))
    got = run_ranks(job, 3, timeout=T)
    assert_all_raise(got, "algorithm")


# -- (c) different roots, then more Bcasts ---------------------------------------------

# A root waits on no one: it checks the records of the ranks it checks
# (compile.checks: a ring, or a star around rank 0) of a call within
# SC_PAST calls (a root runs that far ahead of its readers), so every rank
# raises by then.
CALLS = 1 + lib.SC_PAST


def _ahead_job(comm, warm, count, odd_count, mism_roots):
    """warm Bcasts of count bytes from root 0 (the root runs ahead); then
    call `warm` differs (the last rank's byte count, or the roots), then
    SC_PAST more from root 0.  Stops at the first exception."""
    me, out = comm.rank, []
    for call in range(warm + CALLS):
        n, root = count, 0
        if call == warm:
            n = odd_count if me == comm.size - 1 and not mism_roots else count
            root = mism_roots[me] if mism_roots else 0
        want = pattern(n, np.int8, call, root)
        buf = want.copy() if me == root else poison(n, np.int8)
        try:
            comm.Bcast(buf, root=root)
            out.append(("ok", bool(buf.tobytes() == want.tobytes()), None))
        except Exception as e:
            out.append((kind_of(e), None, str(e)))
            break
    return out


@pytest.mark.parametrize("count", [64, 65536, 4 << 20])
@pytest.mark.parametrize("roots", [(0, 1), (0, 0, 1), (1, 1, 0)], ids=lambda r: "".join(map(str, r)))
def test_different_roots_raise_within_the_window(roots, count):
    got = run_ranks(_ahead_job, len(roots), 0, count, count, roots, timeout=T)
    for r, calls in enumerate(got):
        assert any(c[0] != "ok" for c in calls), \
            f"rank {r} completed all {CALLS} calls (first delivered {'right' if calls[0][1] else 'wrong'} data): {got}"
        for c in calls:
            assert c[0] in ("ok", "mismatch", "peer"), f"rank {r}: {c}"
        for c in calls[1:]:
            assert c[0] != "ok" or c[1], f"rank {r}: a later Bcast returned wrong data without raising: {got}"
    mism = [c for calls in got for c in calls if c[0] == "mismatch"]
    assert mism and any("root" in c[2] for c in mism), f"no MismatchError names the root: {got}"
    # "rank X has Y" in a first-call message must quote what rank X passed
    for calls in got:
        first = calls[0]
        if first[0] == "mismatch" and "root" in first[2]:
            for who, val in re.findall(r"rank (\d+) has (-?\d+)", first[2]):
                assert int(who) < len(roots) and roots[int(who)] == int(val), \
                    f"message misquotes rank {who}'s root: {first[2]} (roots {roots})"


def _own_root_bcast(comm):
    """Every rank a root of its own: no rank waits on another."""
    buf = np.full(4, comm.rank, np.int64)
    comm.Bcast(buf, root=comm.rank)
    return int(buf[0])


def _split_root_scatter(comm):
    """Ranks 1 and 2 name root 2, the others root 3: each reader's root
    agrees with it, so only the two roots can see the difference."""
    root = 2 if comm.rank in (1, 2) else 3
    send = np.arange(2 * comm.size, dtype=np.int64) + 100 * root
    recv = np.empty(2, np.int64)
    comm.Scatter(send if comm.rank == root else None, recv, root=root)
    return recv.tolist()


@pytest.mark.parametrize("graph", ["star", "ring"])
@pytest.mark.parametrize("job,n", [(_own_root_bcast, 2), (_own_root_bcast, 3), (_own_root_bcast, 5),
                                   (_split_root_scatter, 5)], ids=["bcast2", "bcast3", "bcast5", "scatter5"])
def test_a_mismatch_only_roots_see_raises_in_the_last_call(job, n, graph, monkeypatch):
    """A root checks its neighbours' records at the end of its call when
    they have arrived (every SC_LOOK-th call it waited on none) and in Free, so of
    two roots that differ the later one raises, even in a job's last call
    (44f19d6, which looked every 4th call only, let every rank return)."""
    bind = graph_bind(graph, monkeypatch)
    with pytest.raises(shmcoll.MismatchError, match="root"):
        run_ranks(job, n, timeout=T, bind=bind)


def _roots_then_own_root(comm, warm, roots):
    """warm Bcasts whose roots agree (roots[i % len]), then a last one from
    every rank's own root."""
    for i in range(warm + 1):
        root = roots[i % len(roots)] if i < warm else comm.rank
        buf = np.full(4, comm.rank, np.int64)
        comm.Bcast(buf, root=root)
    return int(buf[0])


@pytest.mark.parametrize("n,roots,warm", [(2, (0, 1), 2), (2, (0, 1), 3), (2, (1, 0), 4), (3, (1,), 1),
                                          (3, (1,), 2), (3, (1,), 3)])
def test_a_last_call_only_roots_see_raises_in_free(n, roots, warm):
    """A root looks at its neighbours' records every SC_LOOK-th call it
    waited on no one, so after warm calls as a root the later of two
    roots that differ in a job's last call may not look at its end: its
    Free does (without that look, every case here ended as a success)."""
    with pytest.raises(shmcoll.MismatchError, match=r"Bcast: .*\(root\)"):
        run_ranks(_roots_then_own_root, n, warm, roots, timeout=T)


def _graph_job(comm):
    return comm.plan.params["check_star"], list(comm._dev.c.nb[0:comm._dev.c.nnb])


@pytest.mark.parametrize("graph", ["star", "ring"])
def test_check_graph_follows_the_placement(graph, monkeypatch):
    """Ranks taking turns on CPUs check each other in a star around rank 0;
    ranks with a CPU each, in a ring.  The star's ranks all take one CPU of
    this host, which may have a CPU for each (graph_bind)."""
    got = run_ranks(_graph_job, 4, timeout=T, bind=graph_bind(graph, monkeypatch))
    if graph == "star":
        assert got == [(True, [1, 2, 3]), (True, [0]), (True, [0]), (True, [0])], got
    else:
        assert got == [(False, [3, 1]), (False, [0, 2]), (False, [1, 3]), (False, [2, 0])], got


@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("odd_count", [100, 200])
def test_reader_raises_in_the_call_when_the_root_ran_ahead(nranks, odd_count):
    """A reader checks the record of its own call even when the root has
    gone calls past it (it did not: the root's line showed a later call,
    and the reader returned garbage)."""
    warm = 6
    got = run_ranks(_ahead_job, nranks, warm, 64, odd_count, None, timeout=T)
    odd = got[-1]
    assert len(odd) == warm + 1 and odd[warm][0] == "mismatch" and "byte count" in odd[warm][2], got


def test_different_roots_after_the_root_ran_ahead_name_the_root():
    got = run_ranks(_ahead_job, 2, 3, 64, 64, (0, 1), timeout=T)
    for r, calls in enumerate(got):
        assert calls[-1][0] == "mismatch" and "(root)" in calls[-1][2], (r, got)
        assert all(c[1] for c in calls[3:-1]), (r, got)


# -- (d) limited / numa with a differing byte count on a late-segment reader ----

# With k = 1 on 5 ranks, reader r starts each round at segment r - 1.  A
# reader whose own (smaller) byte count gives fewer segments than that in
# its first round never reaches its first segment: the old engine checked
# the byte count only there, so it skipped the check.
@pytest.mark.parametrize("bad_rank,bad_count", [(4, 130), (3, 100), (3, 22 * CHUNK + 8)])
@pytest.mark.parametrize("alg", ["limited", "numa"])
def test_limited_numa_byte_count_differs(alg, bad_rank, bad_count):
    def job(comm):
        count = bad_count if comm.rank == bad_rank else 20 * CHUNK + 5
        buf = pattern(count, np.int8, 3, 0) if comm.rank == 0 else poison(count, np.int8)
        return attempt_kind(comm, "Bcast", lambda: comm.Bcast(buf, root=0, algorithm=alg))
    got = run_ranks(job, 5, timeout=T, options=dict(SMALL, bcast_k=1))
    assert_all_raise(got, "byte count")


# -- (e) byte counts that make the automatic choice diverge ----------------------

@pytest.mark.parametrize("first,second", [(10000, 20000), (20000, 10000)])
def test_auto_choice_diverging_on_byte_count(first, second):
    def job(comm):
        count = first if comm.rank < 5 else second
        buf = pattern(count, np.int8, 4, 0) if comm.rank == 0 else poison(count, np.int8)
        return attempt_kind(comm, "Bcast", lambda: comm.Bcast(buf, root=0, algorithm=None))
    got = run_ranks(job, 9, timeout=T)
    assert_all_raise(got, "byte count")


# -- (f) two threads of one rank on one communicator ------------------------------

def _threads_job(comm, reps, mixed):
    me = comm.rank
    log = []
    for rep in range(reps):
        start = threading.Barrier(2)
        res = [[], []]

        def worker(t):
            start.wait()
            for j in range(4):
                try:
                    if mixed and (j + t) % 2:
                        count = 1000 if t == 0 else 3000       # a cross-thread pairing is a size mismatch
                        want = pattern(count, np.int8, rep, t)
                        buf = want.copy() if me == 0 else poison(count, np.int8)
                        comm.Bcast(buf, root=0)
                        res[t].append(("ok",) if buf.tobytes() == want.tobytes() else ("wrong data",))
                    else:
                        comm.Barrier()
                        res[t].append(("ok",))
                except Exception as e:
                    k = "thread" if isinstance(e, RuntimeError) and "thread" in str(e) else \
                        "shmcoll" if isinstance(e, shmcoll.ShmcollError) else type(e).__name__
                    res[t].append((k, str(e)))
        ths = [threading.Thread(target=worker, args=(t,)) for t in (0, 1)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        log.append(res)
    return log


@pytest.mark.parametrize("mixed", [False, True], ids=["barrier", "barrier+bcast"])
def test_two_threads_on_one_comm(mixed):
    got = run_ranks(_threads_job, 2, 20, mixed, timeout=45)    # a crash or a hang fails here
    for r, log in enumerate(got):
        for rep, res in enumerate(log):
            for t, calls in enumerate(res):
                for c in calls:
                    assert c[0] in ("ok", "thread", "shmcoll"), f"rank {r} rep {rep} thread {t}: {c}"
    # Whether the threads ever overlap is up to the scheduler: the guard's
    # error itself is asserted deterministically below.


def _overlap_job(comm, fifo, second):
    """Rank 0: thread A blocks in a Barrier (rank 1 holds back on the fifo),
    thread B waits until A owns the communicator and calls `second`: B gets
    the concurrency error, which aborts the communicator: the Barrier A and
    rank 1 are in may complete (both had arrived) or raise, never hang, and
    the next call raises on both ranks."""
    def outcome(call):
        try:
            call()
            return "ok"
        except RuntimeError as e:
            return "thread" if "another thread" in str(e) else repr(e)
        except shmcoll.ShmcollError:
            return "shmcoll"

    comm.Barrier()      # warm: A's Barrier below is then one C call that owns the communicator throughout
    if comm.rank == 1:
        with open(fifo, "rb") as f:
            f.read(1)
        return [outcome(comm.Barrier), outcome(comm.Barrier)]
    got = {}

    def b():
        while not comm._dev.c.busy:     # A is inside: the guard's flag is its only witness
            pass
        got["B"] = outcome(comm.Barrier if second == "Barrier" else
                           lambda: comm.Bcast(np.zeros(3000, np.int8), root=0))
        with open(fifo, "wb") as f:
            f.write(b"x")

    tb = threading.Thread(target=b)
    tb.start()
    got["A"] = outcome(comm.Barrier)
    tb.join()
    return [got["B"], got["A"], outcome(comm.Barrier)]


@pytest.mark.parametrize("second", ["Barrier", "Bcast"])
def test_second_thread_raises(second, tmp_path):
    fifo = str(tmp_path / "go")
    os.mkfifo(fifo)
    got = run_ranks(_overlap_job, 2, fifo, second, timeout=T)
    assert got[0][0] == "thread", got
    assert got[0][1] in ("ok", "shmcoll") and got[1][0] in ("ok", "shmcoll"), got
    assert got[0][2] == got[1][1] == "shmcoll", got


def _gil_policy_job(comm):
    """How long this rank's waits hold the GIL, alone and beside a thread."""
    for _ in range(130):                  # the threads are looked at every 64th call
        comm.Barrier()
    alone = comm._dev.c.gil_ns
    go = threading.Event()
    th = threading.Thread(target=go.wait)
    th.start()
    for _ in range(130):
        comm.Barrier()
    beside = comm._dev.c.gil_ns
    go.set()
    th.join()
    for _ in range(130):
        comm.Barrier()
    return alone, beside, comm._dev.c.gil_ns


def test_waits_let_the_gil_go_at_once_beside_another_thread():
    """A rank's only thread keeps the GIL through short waits; with another
    Python thread its waits let it go at once, or that thread would run
    only every switch interval (5 ms) during a loop of small calls."""
    got = run_ranks(_gil_policy_job, 2, timeout=T)
    assert all(g == (lib.SC_GIL_NS, 0, lib.SC_GIL_NS) for g in got), got


# -- (g) object dtypes --------------------------------------------------------------

STRUCT = np.dtype([("a", np.int64), ("o", object)])


def _object_job(comm, op, kind, bad_rank):
    n, me = comm.size, comm.rank
    if op == "Bcast":
        if me == bad_rank:
            if kind == "object":
                buf = np.array([1, "x", None, 2.5] * 2, dtype=object)          # 8 x 8 B
            else:
                buf = np.zeros(4, STRUCT)                                     # 4 x 16 B
        else:
            buf = pattern(8, np.int64, 5, 0) if me == 0 else poison(8, np.int64)
        return attempt_kind(comm, "Bcast", lambda: comm.Bcast(buf, root=0))
    if me == bad_rank:
        if kind == "object":
            send = np.array([[me, "s"]] * n, dtype=object)                  # n x 16 B
            recv = np.empty((n, 2), dtype=object)
        else:
            send = np.zeros((n, 1), STRUCT)
            recv = np.zeros((n, 1), STRUCT)
    else:
        send = pattern(2 * n, np.int64, 6, me).reshape(n, 2)
        recv = poison(2 * n, np.int64).reshape(n, 2)
    return attempt_kind(comm, "Alltoall", lambda: comm.Alltoall(send, recv))


@pytest.mark.parametrize("bad_rank", [0, 2])
@pytest.mark.parametrize("kind", ["object", "struct"])
@pytest.mark.parametrize("op", ["Bcast", "Alltoall"])
def test_object_dtypes_rejected(op, kind, bad_rank):
    got = run_ranks(_object_job, 3, op, kind, bad_rank, timeout=T)
    assert got[bad_rank] is not None and got[bad_rank][:2] == (op, "TypeError"), got
    for r in range(3):
        if r != bad_rank:
            assert got[r] is not None and got[r][1] == "peer" and got[r][3] == bad_rank, f"rank {r}: {got}"


# -- (h) Alltoall blocks must hold whole elements ------------------------------------

@pytest.mark.parametrize("who", ["both", "rank0"])
def test_alltoall_blocks_split_elements(who):
    def job(comm):
        if who == "both" or comm.rank == 0:
            send, recv = np.arange(3, dtype=np.int32), np.zeros(3, np.int32)      # 6-byte blocks
        else:
            send, recv = np.arange(6, dtype=np.int16), np.zeros(6, np.int16)      # 6-byte blocks, whole int16s
        return attempt_kind(comm, "Alltoall", lambda: comm.Alltoall(send, recv))
    got = run_ranks(job, 2, timeout=T)
    assert all(g is not None for g in got), got
    bad = [0, 1] if who == "both" else [0]
    for r in range(2):
        if r in bad:
            assert got[r][0] == "Alltoall" and ("ValueError" in got[r][4] or got[r][1] == "peer"), f"rank {r}: {got}"
        else:
            assert got[r][1] == "peer" and got[r][3] == 0, f"rank {r}: {got}"
    assert any("ValueError" in got[r][4] and got[r][1] != "peer" for r in bad), got


# -- (i) any local error aborts the communicator -----------------------------------------

def _two_calls(comm, op, bad_rank, bad):
    """Call 1 (rank bad_rank does `bad` instead), then a correct call 2.
    Returns per call ('ok', data right) or (kind, message, .rank, classes)."""
    n, me = comm.size, comm.rank
    out = []
    for call in (1, 2):
        broken = me == bad_rank and call == 1
        alg = ["x"] if broken and bad == "algorithm" else None
        try:
            ok = True
            if op == "Barrier":
                comm.Barrier(alg)
            elif op == "Bcast":         # staged (past the inline slots), so the root waits for its readers
                want = pattern(3000, np.int16, call, 0)
                buf = want.copy() if me == 0 else poison(3000, np.int16)
                comm.Bcast(buf, root=0, algorithm=alg)
                ok = buf.tobytes() == want.tobytes()
            elif op == "Alltoall":
                send = pattern(n * 40, np.int16, call, me).reshape(n, 40)
                recv = poison(n * 40, np.int16).reshape(n, 40)
                comm.Alltoall(send, recv, algorithm=alg)
                want = np.stack([pattern(n * 40, np.int16, call, i).reshape(n, 40)[me] for i in range(n)])
                ok = recv.tobytes() == want.tobytes()
            else:                                       # pickled bcast, root 0
                obj = (lambda: 0) if broken else {"call": call, "data": list(range(call * 10))}
                got = comm.bcast(obj if me == 0 else None, root=0)
                ok = got == {"call": call, "data": list(range(call * 10))}
            out.append(("ok", bool(ok)))
        except Exception as e:
            out.append(describe(e))
    return out


@pytest.mark.parametrize("op,bad_rank,bad", [("Barrier", 1, "algorithm"), ("Barrier", 0, "algorithm"),
                                             ("Bcast", 1, "algorithm"), ("Bcast", 0, "algorithm"),
                                             ("Alltoall", 2, "algorithm"), ("bcast", 0, "unpicklable")])
def test_local_error_aborts_the_communicator(op, bad_rank, bad):
    got = run_ranks(_two_calls, 3, op, bad_rank, bad, timeout=T)
    first, second = got[bad_rank]
    if bad == "algorithm":
        assert first[0] == "TypeError", f"algorithm=['x'] should raise TypeError: {got}"
    else:
        assert first[0] != "ok", f"pickling a lambda should raise: {got}"
    assert second[0] != "ok", f"the erring rank's next call should raise, it returned: {got}"
    for r in range(3):
        if r == bad_rank:
            continue
        a, b = got[r]
        if a[0] == "ok":
            assert a[1], f"rank {r}: call 1 returned wrong data: {got}"
        else:
            assert a[0] == "peer" and a[2] == bad_rank, f"rank {r}: {got}"
        assert b[0] == "peer", f"rank {r}: the call after the abort should raise PeerFailure: {got}"


# -- (j) a stopped rank: stall timeout -----------------------------------------------------

def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def _stop_job(comm, out, msgs, pids, victim, alg=None, patient=-1):
    me = comm.rank
    pids[me] = os.getpid()
    if me == patient:
        comm._c.timeout_ns = 60 * 10**9              # its stall timer runs out last
    comm.Barrier()                                   # everybody is up
    if me == victim:
        os.kill(os.getpid(), signal.SIGSTOP)
    t = time.monotonic()
    try:
        comm.Barrier(alg)
        out[me] = (1, -1, time.monotonic() - t)
        return None
    except Exception as e:
        dt = time.monotonic() - t
        code = 2 if PeerTimeout is not None and isinstance(e, PeerTimeout) else \
            3 if isinstance(e, shmcoll.PeerFailure) else 4
        out[me] = (code, getattr(e, "rank", -1) if isinstance(getattr(e, "rank", None), int) else -1, dt)
        b = str(e).encode()[:255]
        msgs[me, :len(b)] = np.frombuffer(b, np.uint8)
        raise


@pytest.mark.parametrize("how", ["option", "env"])
def test_stopped_rank_times_out(how, monkeypatch):
    n, victim = 3, 1
    out = shared_array((n, 3), np.float64, fill=-9)
    msgs = shared_array((n, 256), np.uint8)
    pids = shared_array(n, np.int64)
    kw = {"options": {"timeout": 2}}
    if how == "env":
        monkeypatch.setenv("SHMCOLL_TIMEOUT", "2")
        kw = {}
    t = time.monotonic()
    with pytest.raises(Exception) as ei:
        run_ranks(_stop_job, n, out, msgs, pids, victim, timeout=40, **kw)
    took = time.monotonic() - t
    assert took < 25, f"launch took {took:.1f} s (its own timeout, not the stall timeout, ended it): {ei.value!r}"
    text = [bytes(m).rstrip(b"\0").decode(errors="replace") for m in msgs]
    others = [r for r in range(n) if r != victim]
    timed_out = [r for r in others if out[r][0] == 2]
    assert timed_out, f"no rank raised PeerTimeout: {out.tolist()} {text}"
    for r in others:
        code, who, dt = out[r]
        assert code in (2, 3), f"rank {r}: {out[r].tolist()} {text[r]}"
        assert dt < 10, f"rank {r} waited {dt:.1f} s"
        if code == 2:
            assert who == victim and re.search(rf"\b{victim}\b", text[r]), f"rank {r}: {text[r]} ({who})"
            assert dt >= 1.5, f"rank {r} timed out after {dt:.2f} s with timeout=2"
    assert all(pids), pids
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids.tolist()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids.tolist()), "a rank outlived launch()"


def test_stall_is_blamed_on_the_stopped_rank_not_on_one_waiting_for_it():
    """Padded barrier, 3 ranks: 2 waits for 0's release while 0 waits for
    stopped 1.  Rank 2's timer runs out first (rank 0's is made longer);
    it names 1, which stalls, not 0, which waits like it (on 16 cores the
    two timers ran out together and rank 2 blamed 0)."""
    n, victim = 3, 1
    out = shared_array((n, 3), np.float64, fill=-9)
    msgs = shared_array((n, 256), np.uint8)
    pids = shared_array(n, np.int64)
    with pytest.raises(Exception):
        run_ranks(_stop_job, n, out, msgs, pids, victim, "padded", 0, timeout=40, options={"timeout": 2})
    text = [bytes(m).rstrip(b"\0").decode(errors="replace") for m in msgs]
    assert out[2].tolist()[:2] == [2, victim], f"{out.tolist()} {text}"
    assert "rank 1 did not arrive" in text[2] and "waited on rank 0, which waits on it, in Barrier" in text[2], text[2]
    assert out[0].tolist()[:2] == [3, 2], f"rank 0 should see rank 2's abort: {out.tolist()} {text}"


# -- (k) SIGINT to a rank blocked in a collective ------------------------------------------

def _readable(fd, within):
    r, _, _ = select.select([fd], [], [], within)
    return bool(r)


def _sigint_job(comm, op, out, ready, report, done):
    """Ranks 0 and 1 enter `op` and wait for rank 2 (the sender; root of
    Bcast), which signals rank 1 once it is known to be waiting and joins
    only after rank 1 reported (or 5 s passed)."""
    me, n = comm.rank, comm.size
    sender, target = 2, 1
    comm.Barrier()

    def call():
        if op == "Barrier":
            comm.Barrier()
        elif op == "Bcast":
            buf = pattern(4096, np.int8, 7, sender) if me == sender else poison(4096, np.int8)
            comm.Bcast(buf, root=sender)
        else:
            send = pattern(n * 512, np.int8, 8, me).reshape(n, 512)
            comm.Alltoall(send, poison(n * 512, np.int8).reshape(n, 512))

    if me == sender:
        pid = int(os.read(ready[0], 32).decode())      # the target is about to call
        time.sleep(0.2)                                # give it time to block (not relied on)
        out[me, 1] = time.monotonic()
        os.kill(pid, signal.SIGINT)
        _readable(report[0], 5.0)                      # the old engine delivers it only after we join
    elif me == target:
        os.write(ready[1], str(os.getpid()).encode())
    t0 = time.monotonic()
    try:
        call()
        out[me, 0] = 1
    except KeyboardInterrupt:
        out[me, 0] = 5
    except shmcoll.PeerFailure:
        out[me, 0] = 3
    except Exception:
        out[me, 0] = 4
    t1 = time.monotonic()
    out[me, 2], out[me, 3] = t0, t1
    if me == target:
        os.write(report[1], b"x")
        _readable(done[0], 10.0)     # stay alive: the others' failure must come from the abort
    elif me == sender:
        os.write(done[1], b"x")
    return None


@pytest.mark.parametrize("op", ["Barrier", "Bcast", "Alltoall"])
def test_sigint_interrupts_a_blocked_rank(op):
    out = shared_array((3, 4), np.float64, fill=-9)
    pipes = [os.pipe() for _ in range(3)]
    try:
        try:
            run_ranks(_sigint_job, 3, op, out, *pipes, timeout=T)
        except KeyboardInterrupt as e:          # re-raised from rank 1, not ours
            if getattr(e, "rank", None) is None:
                raise
        except Exception:
            pass                                # launch may report the abort; the ranks' records decide
    finally:
        for r, w in pipes:
            os.close(r)
            os.close(w)
    code, _, t0, t1 = out[1]
    sent = out[2, 1]
    assert code == 5, f"rank 1 did not raise KeyboardInterrupt: {out.tolist()}"
    assert sent > 0 and t1 >= sent, f"rank 1 left its call before the signal was sent: {out.tolist()}"
    assert t1 - sent < 1.0, f"KeyboardInterrupt came {t1 - sent:.2f} s after SIGINT"
    for r in (0, 2):
        assert out[r, 0] == 3, f"rank {r} should raise PeerFailure after the abort: {out.tolist()}"


# -- (l) read-only root buffers; root=True ---------------------------------------------------

def _readonly_job(comm, form):
    bad = []
    for alg in ["binomial", "original", "limited", "numa", None]:
        for count in [1, 96, 97, 5000, 300001]:
            for root in range(comm.size):
                want = pattern(count, np.int8, count, root)
                if comm.rank == root:
                    if form == "bytes":
                        arg = want.tobytes()
                    elif form == "memoryview":
                        arg = memoryview(want.tobytes())
                    else:
                        arg = want.copy()
                        arg.setflags(write=False)
                    comm.Bcast(arg, root=root, algorithm=alg)
                    got = bytes(arg)
                else:
                    buf = poison(count, np.int8)
                    comm.Bcast(buf, root=root, algorithm=alg)
                    got = buf.tobytes()
                if got != want.tobytes():
                    bad.append((comm.rank, alg, count, root))
    return bad


@pytest.mark.parametrize("form", ["ndarray", "bytes", "memoryview"])
def test_readonly_root_buffer_accepted(form):
    got = run_ranks(_readonly_job, 3, form, timeout=60)
    assert [b for r in got for b in r] == []


@pytest.mark.parametrize("bad_rank", [0, 1])
def test_root_true_rejected(bad_rank):
    def job(comm):
        buf = pattern(100, np.int8, 9, 1) if comm.rank == 1 else poison(100, np.int8)
        root = True if comm.rank == bad_rank else 1
        return attempt_kind(comm, "Bcast", lambda: comm.Bcast(buf, root=root))
    got = run_ranks(job, 3, timeout=T)
    g = got[bad_rank]
    assert g is not None and g[0] == "Bcast" and ("ValueError" in g[4] or "TypeError" in g[4]) \
        and g[1] != "peer", got
    for r in range(3):
        if r != bad_rank:
            assert got[r] is not None and got[r][1] == "peer" and got[r][3] == bad_rank, f"rank {r}: {got}"


# -- found in review: the fast path must refuse what the Python path refuses ----------------

def refused(call, etype, word):
    """True when call() raises etype naming word; "accepted" when it returns."""
    try:
        call()
    except etype as e:
        return word in str(e)
    return "accepted"


def _fast_path_refusals(comm):
    """After one good call has cached the program, the same shapes with the
    same buffer twice, or a receive buffer of other item size, must still be
    refused (the C entry declines them to the checked method)."""
    a = np.arange(4 * comm.size, dtype=np.uint8)
    comm.Alltoall(a, np.empty_like(a))
    return [refused(lambda: comm.Alltoall(a, a), ValueError, "overlap")]


def test_fast_path_refuses_the_same_buffer_twice():
    got = run_ranks(_fast_path_refusals, 2)
    assert all(g == [True] for g in got), got


def _keywords_by_value(comm):
    """Keyword names built at run time (not interned: the C entry finds
    them by value, not identity) after warm calls by interned names; a name
    no method takes is still refused."""
    out = []
    root = "".join(["ro", "ot"])
    for r in range(comm.size):
        buf = np.full(5, comm.rank, np.int32)
        comm.Bcast(buf, root=r)
        buf = np.full(5, comm.rank + 10, np.int32)
        comm.Bcast(buf, **{root: r})
        out.append(bool(np.array_equal(buf, np.full(5, r + 10, np.int32))))
    out.append(refused(lambda: comm.Bcast(buf, **{"".join(["roo", "ts"]): 0}), TypeError, "roots"))
    return out


def test_fast_entry_takes_keywords_by_value():
    got = run_ranks(_keywords_by_value, 3)
    assert all(g == [True] * 4 for g in got), got


def _mixed_itemsize(comm):
    s = np.zeros(12, np.uint8)
    comm.Alltoall(s, np.empty_like(s))
    return refused(lambda: comm.Alltoall(s, np.empty(3, np.int32)), ValueError, "whole")


def test_fast_path_checks_whole_elements_of_the_recvbuf():
    got = run_ranks(_mixed_itemsize, 2)
    assert got == [True, True], got


def _warm_then_bad(comm, op, kind):
    """Good calls first (the C entry has the program and knows int64), then
    the same byte counts in an array the entry reads without the buffer
    protocol: each must still be refused on the bad rank."""
    n, me = comm.size, comm.rank
    good = np.zeros(2 * n, np.int64)
    for _ in range(3):
        if op == "Bcast":
            comm.Bcast(good, root=0)
        else:
            comm.Alltoall(np.ones(2 * n, np.int64), good)
    bad = np.zeros(2 * n, np.int64)
    if me == 1:
        if kind == "object":
            bad = np.array([None] * (2 * n), dtype=object)
        elif kind == "readonly":
            bad.setflags(write=False)
        elif kind == "noncontig":
            bad = np.zeros(4 * n, np.int64)[::2]
    if op == "Bcast":
        return attempt_kind(comm, op, lambda: comm.Bcast(bad, root=0))
    return attempt_kind(comm, op, lambda: comm.Alltoall(np.ones(2 * n, np.int64), bad))


@pytest.mark.parametrize("kind,etype", [("object", "TypeError"), ("readonly", "BufferError"),
                                        ("noncontig", "ValueError")])
@pytest.mark.parametrize("op", ["Bcast", "Alltoall"])
def test_fast_path_refuses_after_warm_calls(op, kind, etype):
    got = run_ranks(_warm_then_bad, 3, op, kind, timeout=T)
    assert got[1] is not None and got[1][:2] == (op, etype), got
    for r in (0, 2):
        assert got[r] is not None and got[r][1] == "peer" and got[r][3] == 1, f"rank {r}: {got}"


@pytest.mark.parametrize("name,value", [("chunk_bytes", -1), ("tile_bytes", -1), ("stripe_slots", -1),
                                        ("bcast_k", 0), ("timeout", float("inf")), ("timeout", -1)])
def test_bad_sizes_in_options_are_refused(name, value):
    with pytest.raises(ValueError, match=name.split("_")[0]):
        run_ranks(lambda comm: None, 2, options={name: value})


def _colliding(comm, sizes, rounds):
    """Call shapes whose keys share a set of the C cache, alternated: all
    stay correct (and are reinstalled, see Device.program); (wrong
    results, whether the last round's calls all ran in C)."""
    from test_specs import _python_frames
    bad, frames = 0, []
    for i in range(rounds):
        frames = []
        for n in sizes:
            want = np.arange(n, dtype=np.uint8) + i
            buf = want.copy() if comm.rank == 0 else np.zeros(n, np.uint8)
            frames += _python_frames(lambda: comm.Bcast(buf, 0))
            bad += int(not (buf == want).all())
    return bad, frames == []


def _same_set(count):
    from shmcoll._core import ffi, lib
    key = lambda n: ffi.new("int64_t[7]", (2, -1, 0, n, 0, 1, 0))
    first = lib.sc_cache_slot(key(8))
    return [8] + [n for n in range(9, 1000000) if lib.sc_cache_slot(key(n)) == first][:count - 1]


def test_cache_set_collisions_stay_correct_and_in_c():
    """As many shapes as a set has entries all stay in C (dtype hashes
    differ from process to process, so keys of a program's few shapes may
    share a set); one more is still correct, reinstalled from Python."""
    from shmcoll._core import lib
    assert run_ranks(_colliding, 2, _same_set(lib.SC_WAYS), 20) == [(0, True)] * 2
    assert [bad for bad, _ in run_ranks(_colliding, 2, _same_set(lib.SC_WAYS + 1), 20)] == [0, 0]


def test_direct_moves_read_only_the_sendbuf():
    from shmcoll.compile import compile_schedule
    from shmcoll.sched import Move, Schedule, Step
    sched = Schedule("alltoall", "custom", 2, 8, 0, [Step([Move(0, (1,), ((0, 0, 8),), sbuf="tmp", via="direct")])], 8)
    params = {"chan_bytes": 8192, "chunk_bytes": 1024, "stripe_bytes": 8192, "stripe_slots": 2}
    with pytest.raises(ValueError, match="sendbuf"):
        compile_schedule(sched, params, (0, 0))


def test_push_moves_write_only_the_recvbuf():
    """A push writes where the reader published its recvbuf at arrival;
    its scratch has no address another rank knows."""
    from shmcoll.compile import compile_schedule
    from shmcoll.sched import Move, Schedule, Step
    sched = Schedule("gather", "custom", 2, 8, 0, [Step([Move(0, (1,), ((0, 0, 8),), dbuf="tmp", via="push")])], 8)
    params = {"chan_bytes": 8192, "chunk_bytes": 1024, "stripe_bytes": 8192, "stripe_slots": 2}
    with pytest.raises(ValueError, match="recvbuf"):
        compile_schedule(sched, params, (0, 0))


@pytest.mark.parametrize("touched,first", [((0, 64), True), ((64, 128), False), ((32, 96), True)])
def test_a_push_is_waited_for_before_its_reader_touches_what_it_wrote(touched, first):
    """The reader of a push waits for it only at the end of the call (it
    works on meanwhile), unless a later step touches the bytes it writes:
    then before that step.  Here rank 0 sends on recvbuf[touched] after
    rank 1 pushed recvbuf[0:64]."""
    from shmcoll.compile import COPY, WAIT, compile_schedule
    from shmcoll.sched import Move, Schedule, Step
    lo, hi = touched
    sched = Schedule("gather", "custom", 2, 128, 0, [Step([Move(1, (0,), ((0, 0, 64),), via="push")]),
                                                     Step([Move(0, (1,), ((lo, lo, hi - lo),), sbuf="recv")])])
    params = {"chan_bytes": 8192, "chunk_bytes": 1024, "stripe_bytes": 8192, "stripe_slots": 2}
    ins = compile_schedule(sched, params, (0, 0))[0][8:].reshape(-1, 8)
    wait = next(i for i, row in enumerate(ins) if row[0] == WAIT and row[1] == 1 and row[2] > 0)
    copy = next(i for i, row in enumerate(ins) if row[0] == COPY)
    assert (wait < copy) == first, ins


@pytest.mark.parametrize("op,alg,n", [("bcast", "original", 2), ("bcast", "binomial", 5), ("allgather", "all_at_once", 3),
                                      ("gather", "flat", 4), ("reduce", "flat", 3), ("alltoall", "pairwise", 4)])
def test_a_reader_checks_a_writer_in_the_inline_slot_it_reads_first(op, alg, n):
    """A writer that ran calls ahead has moved its post line on: a reader
    checking its record there must also read the writer's record ring (a
    third cache line after the flag and the payload; 8 B Bcast at 2 ranks
    took 1.05-1.11x as long).  So a writer stamps its record into each
    inline slot it fills, and a reader whose first piece from a writer is
    inline checks it there."""
    from shmcoll.compile import CHECK, COPY, INSLOT, STAMP, WAIT, compile_schedule
    from shmcoll._core import lib

    def reads(x, w):
        """The space of writer w's shared memory that instruction x reads, else None."""
        srcs = {COPY: (3,), lib.SC_OP_REDUCE: (3, 5)}.get(x[0] & 0xff, ())
        return next((x[k] for k in srcs if x[k] & 0xff in (lib.SC_SLOT, lib.SC_TINY, lib.SC_CHAN) and x[k] >> 8 & 0xffffff == w),
                    None)

    sched = shmcoll.schedule(op, alg, n, 8, dtype=np.float64 if op == "reduce" else None)
    params = shmcoll.device.make_plan(n, shmcoll.topology(), shmcoll.topology().placement(n, "core", "compact")).params
    progs = [a[8:].reshape(-1, 8) for a in compile_schedule(sched, params, (0, 0))]
    stamped = {(w, row[1]) for w, ins in enumerate(progs) for row in ins
               if row[0] == COPY and row[1] & 0xff in (lib.SC_SLOT, lib.SC_TINY) and row[6] & STAMP}
    checked = 0
    for r, ins in enumerate(progs):
        for i, row in enumerate(ins):
            if row[0] != WAIT or not row[3] & CHECK:
                continue
            sp = next((reads(x, row[1]) for x in ins[i + 1:] if reads(x, row[1]) is not None), None)
            sp = sp if sp is not None and sp & 0xff in (lib.SC_SLOT, lib.SC_TINY) else None
            assert bool(row[3] & INSLOT) == (sp is not None), (r, ins)
            if sp is not None:
                assert row[4] == sp and (row[1], sp) in stamped, (r, ins)
                checked += 1
    assert checked, progs


@pytest.mark.parametrize("write", [0, 1])
def test_failed_single_copy_names_its_direction_and_errno(write):
    """SC_ECMA becomes CMAError naming the peer, the direction (readv or
    writev) and the errno, not a death."""
    import errno
    from types import SimpleNamespace
    from shmcoll._core import lib
    from shmcoll.device import Device
    dev = object.__new__(Device)
    dev.c, dev.rank = SimpleNamespace(err_rank=1, err_a=write, err_b=errno.EFAULT), 0
    e = dev.failure(lib.SC_ECMA, "Bcast")
    assert isinstance(e, shmcoll.CMAError) and e.errno == errno.EFAULT, e
    want = "write into rank 1's memory (process_vm_writev" if write else "read rank 1's memory (process_vm_readv"
    assert want in str(e) and os.strerror(errno.EFAULT) in str(e), str(e)


def _push_into_later_call(comm, flags):
    """Rank 2 roots 64-byte Bcasts among ranks 1-3 and runs ahead; rank 0,
    which never joins them, then gathers a 4 KiB block to rank 2.  Its push
    must not land in the Bcast buffer rank 2 offered for a later call."""
    out = {}
    guard = np.zeros(1 << 16, np.uint8)
    try:
        if comm.rank == 0:
            deadline = time.monotonic() + 30
            while flags[0] < 3 and time.monotonic() < deadline:     # rank 2 two calls ahead or more
                time.sleep(0.001)
            try:
                comm.Gather(np.full(4096, 0xAB, np.uint8), None, root=2, algorithm="flat")
            finally:
                flags[1] = 1
        else:
            for i in range(20):
                comm.Bcast(guard[:64], root=2, algorithm="limited")     # inline: original shares (cma_bytes 1)
                if comm.rank == 2:
                    flags[0] = i + 1
    except Exception as e:
        out["exc"], out["msg"] = type(e).__name__, str(e)
    if comm.rank == 2:
        deadline = time.monotonic() + 30
        while not flags[1] and time.monotonic() < deadline:         # rank 0's Gather is over
            time.sleep(0.001)
        out["stray"] = int(np.count_nonzero(guard == 0xAB))
    return out


def test_push_never_writes_into_a_later_calls_buffer():
    """A push checks that the reader's record is of this very call (a
    reader two or more calls ahead passed the arrival wait and the
    signature check, which compares only neighbouring calls)."""
    flags = shared_array(2)
    got = run_ranks(_push_into_later_call, 4, flags, timeout=T, options={"cma_bytes": 1, "timeout": 20})
    assert got[2]["stray"] == 0, got
    assert all("exc" in g for g in got), got
    assert got[0]["exc"] == "MismatchError", got
    msg = got[0]["msg"]     # the check of rank 2's record, or the push's own check of its call
    assert "rank 0 has gather, rank 2 has bcast" in msg or "out of step" in msg, msg


def _late_push(comm, flags, n, algorithm):
    """Rank 1 pushes an n-byte block into root 0 through the bounce buffer
    and is stopped mid-push; the root times out, zeroes its recvbuf and
    lets rank 1 go on: nothing may land after the root's call raised.
    Gatherv, the root's own piece one byte: it waits for the pushes at
    once, not after copying a block of its own.  algorithm None: the
    point-to-point Gatherv, where rank 1 writes its share of the
    rendezvous from the back."""
    pids = comm.allgather(os.getpid())
    out = {}
    if comm.rank != 0:
        addr = comm.bcast(None, root=0)
        send = np.full(n, 9, np.uint8)
        if comm.rank == 1:                  # 16 bytes past the root's block modulo 4 KiB: the bounce path
            base = np.full(n + 4096, 7, np.uint8)
            o = (addr + n + 16 - base.ctypes.data) % 4096
            send = base[o:o + n]
        comm.Barrier()
        try:
            comm.Gatherv(send, None, root=0, algorithm=algorithm)
        except Exception as e:
            out["exc"] = type(e).__name__
        flags[comm.rank] = 1
        return out
    recv = np.zeros(3 * n, np.uint8)
    comm.bcast(recv.ctypes.data, root=0)
    comm.Barrier()
    at = n + (1 << 20) if algorithm else 2 * n - (1 << 20)
    probe = recv[at:at + 1]

    def stop_rank_1():
        while not probe[0]:
            pass
        os.kill(pids[1], signal.SIGSTOP)
        out["stopped"] = True
    threading.Thread(target=stop_rank_1, daemon=True).start()
    try:
        comm.Gatherv(np.zeros(1, np.uint8), [recv, (1, n, n), (0, n, 2 * n), np.uint8], root=0, algorithm=algorithm)
    except Exception as e:
        out["exc"] = type(e).__name__
    recv[:] = 0
    with contextlib.suppress(ProcessLookupError):   # the push ended before the stop: rank 1 may have left
        os.kill(pids[1], signal.SIGCONT)
    deadline = time.monotonic() + 30
    while not flags[1] and time.monotonic() < deadline:            # rank 1 has left its Gather
        time.sleep(0.001)
    out["late"] = int(np.count_nonzero(recv))
    with open("/proc/self/maps") as f:          # the arena's pages the writer still maps are no longer recv's
        out["arena"] = any(int(lo, 16) <= recv.ctypes.data < int(hi, 16) and "shmcoll-arrays" in line
                           for line in f for lo, hi in [line.split()[0].split("-")])
    return out


@pytest.mark.parametrize("algorithm", ["flat", None])
def test_no_push_lands_after_the_readers_call_raised(algorithm):
    """A reader whose call fails shuts its door and waits for the write in
    flight; a writer looks at the door before each piece.  A writer stopped
    halfway through a piece, writing by plain stores into the reader's
    arena, finishes it when it goes on: the reader's buffer left the arena
    for private pages when its call gave up (sc_quarantine): the
    collective's, or the receive's whose rendezvous the sender shared."""
    flags = shared_array(3)
    got = run_ranks(_late_push, 3, flags, 64 << 20, algorithm, timeout=60, options={"cma_bytes": 1, "timeout": 2})
    if not got[0].get("stopped") or "exc" not in got[0]:
        pytest.skip("the push finished before the stop landed")
    # point-to-point: rank 2, its rendezvous waiting on the root, may time out first
    assert got[0]["exc"] in (("PeerTimeout",) if algorithm else ("PeerTimeout", "PeerAborted")), got
    assert got[0]["late"] == 0 and not got[0]["arena"], got
    assert got[1]["exc"] in ("PeerAborted", "PeerTimeout"), got


def _extra_calls(comm, kind, extra):
    """Two calls on every rank, then `extra` more on rank 0 alone, of a
    kind rank 0 finishes without waiting on anyone (a Bcast or Scatter
    root; Exscan's rank 0)."""
    x = np.arange(4.0) if comm.rank == 0 else np.zeros(4)
    for _ in range(2 + (extra if comm.rank == 0 else 0)):
        if kind == "bcast":
            comm.Bcast(x, root=0)
        elif kind == "scatter":
            comm.Scatter(np.zeros(4 * comm.size) if comm.rank == 0 else None, x, root=0)
        else:
            comm.Exscan(np.ones(4), x)
    return comm.rank


@pytest.mark.parametrize("extra", [1, 3, 7])
@pytest.mark.parametrize("kind", ["bcast", "scatter", "exscan"])
@pytest.mark.parametrize("n", [2, 3])
def test_calls_its_peers_never_made_fail_the_job(n, kind, extra):
    """A rank that ran calls its peers never made, none of which waited on
    them, does not end the job as a success: of two ranks leaving with
    different numbers of calls, the later raises (every job returned
    [0, 1, ...] before).  A root that ran so far ahead that a call of its
    own waits finds them gone there."""
    with pytest.raises((shmcoll.MismatchError, shmcoll.PeerDied),
                       match="made different numbers of calls: rank [0-9] left after [0-9]+, rank [0-9] after [0-9]+|"
                             "exited while rank 0"):
        run_ranks(_extra_calls, n, kind, extra, timeout=T)


def _extra_on_dup(comm, kind, dup):
    """On a Dup (no call of its own yet) or the world (its start-up calls
    not counted), rank 1 alone makes one call that waits on no one: a
    Bcast root's, or the automatic Gatherv's (point-to-point, a
    non-root's); then both leave."""
    d = comm.Dup() if dup else comm
    if comm.rank == 1:
        if kind == "bcast":
            d.Bcast(np.zeros(4), root=1)
        else:
            d.Gatherv(np.zeros(1), None, root=0)
    if dup:
        d.Free()


@pytest.mark.parametrize("dup", [True, False])
@pytest.mark.parametrize("kind", ["bcast", "gatherv"])
def test_free_counts_the_calls_each_rank_made(kind, dup):
    """The counts Free names are the calls the program made (a rank that
    made none read 2^64 - 1 on a Dup, 3 on the world), and a routed call
    (the automatic Gatherv) is one."""
    with pytest.raises(shmcoll.MismatchError, match="rank [01] left after [01], rank [01] after [01] "):
        run_ranks(_extra_on_dup, 2, kind, dup, timeout=T)


def _same_calls(comm, delay_rank):
    x = np.arange(4.0) if comm.rank == 0 else np.zeros(4)
    got = []
    for i in range(3):
        if comm.rank == delay_rank:
            sum(range(200000))          # work between calls, not a synchronisation
        comm.Bcast(x, root=0)
        got.append(float(x[3]))
    return got


@pytest.mark.parametrize("n", [2, 3])
def test_a_root_leaving_before_its_readers_ends_the_job_as_a_success(n):
    """The same calls on every rank, the readers behind the root: the job
    succeeds whoever leaves first."""
    assert run_ranks(_same_calls, n, n - 1, timeout=T) == [[3.0] * 3] * n
