"""Alltoallv / Alltoallw: every algorithm, 1-5 ranks, counts with zeros
and uneven ones, displacements with gaps and out of order, against a
numpy reference: rank s's piece for rank d is pattern(seq, s, d) of
count(s, d) items, so rank d knows exactly what it must receive."""
import numpy as np
import pytest

from conftest import SMALL, attempt, pattern, poison, run_cases, run_ranks

ALGS = ["pairwise", "all_at_once", None]
RANKS = [1, 2, 3, 4, 5]
DTYPES = [np.int8, np.int32, np.float64, np.complex128]
pytestmark = pytest.mark.timeout(240)


def count(seq, s, d, scale):
    """Items rank s sends rank d in call seq: some zero, all uneven."""
    return 0 if (s + 2 * d + seq) % 4 == 3 else ((s * 7 + d * 3 + seq) % 5) * scale + (s + d) % 3


def layout(counts, seq, me):
    """Displacements with gaps, in an order that is not the ranks' (the
    last rank first), and the buffer's total items."""
    at, displs = 2, [0] * len(counts)
    for r in sorted(range(len(counts)), key=lambda r: -((r + me + seq) % len(counts))):
        displs[r] = at
        at += counts[r] + 1 + r % 2
    return displs, at + 3


def _job(comm, cases, forms):
    n, me, bad = comm.size, comm.rank, []
    for seq, (alg, scale, dtype) in enumerate(cases):
        sc = [count(seq, me, d, scale) for d in range(n)]
        rc = [count(seq, s, me, scale) for s in range(n)]
        sd, stotal = layout(sc, seq, me)
        rd, rtotal = layout(rc, seq + 1, me)
        send = poison(stotal, dtype)
        for d in range(n):
            send[sd[d]:sd[d] + sc[d]] = pattern(sc[d], dtype, seq, me, d)
        keep = send.copy()
        recv = poison(rtotal, dtype)
        want = recv.copy()
        for s in range(n):
            want[rd[s]:rd[s] + rc[s]] = pattern(rc[s], dtype, seq, s, me)
        form = seq % 3 if forms is True else 0
        if forms == "nonblocking":
            comm.Ialltoallv([send, (sc, sd), dtype], [recv, (rc, rd), dtype], algorithm=alg).Wait()
        elif forms == "persistent":
            req = comm.Alltoallv_init([send, (sc, sd), dtype], [recv, (rc, rd), dtype], algorithm=alg)
            for _ in range(2):
                recv[:] = poison(rtotal, dtype)
                req.Start()
                req.Wait()
        elif form == 0:
            comm.Alltoallv([send, (sc, sd), dtype], [recv, (rc, rd), dtype], algorithm=alg)
        elif form == 1:
            comm.Alltoallv([send, sc, sd, np.dtype(dtype).char], [recv, rc, rd, np.dtype(dtype).char],
                           algorithm=alg)
        else:
            z = np.dtype(dtype).itemsize
            comm.Alltoallw([send, (sc, [d * z for d in sd]), [dtype] * n],
                           [recv, rc, [d * z for d in rd], [dtype] * n], algorithm=alg)
        where = f"rank {me}: call {seq} alg={alg} scale={scale} dtype={np.dtype(dtype)} form={form}"
        if recv.tobytes() != want.tobytes():
            wrong = [s for s in range(n) if recv[rd[s]:rd[s] + rc[s]].tobytes() != want[rd[s]:rd[s] + rc[s]].tobytes()]
            bad.append(f"{where}: wrong pieces from ranks {wrong} (or a gap written)")
        if send.tobytes() != keep.tobytes():
            bad.append(f"{where}: sendbuf was modified")
    return bad


@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("alg", ALGS, ids=lambda a: a or "auto")
def test_alltoallv_against_numpy(n, alg):
    cases = [(alg, scale, dt) for scale in (0, 1, 40, 3000) for dt in DTYPES[:2]] + \
            [(alg, 257, dt) for dt in DTYPES[2:]]
    run_cases(_job, n, cases, forms=True, options=SMALL)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("how", ["nonblocking", "persistent"])
def test_ialltoallv_and_alltoallv_init_against_numpy(n, how):
    """Ialltoallv and Alltoallv_init (started twice) run the blocking call's program."""
    cases = [(alg, scale, np.int32) for alg in ALGS for scale in (0, 1, 40, 3000)]
    run_cases(_job, n, cases, forms=how, options=SMALL)


@pytest.mark.parametrize("n", [2, 3])
def test_alltoallv_default_options_big_pieces(n):
    """Pieces past cma_bytes and adapt: single copies and twins."""
    run_cases(_job, n, [(alg, 40000, np.float64) for alg in ALGS] * 2, forms=True)


def _in_place(comm):
    n, me = comm.size, comm.rank
    counts = [me + d + 1 for d in range(n)]         # symmetric: what I send d is what d sends me
    displs = list(np.cumsum(counts) - counts)
    buf = np.concatenate([pattern(counts[d], np.int32, me, d) for d in range(n)])
    from shmcoll import IN_PLACE
    comm.Alltoallv(IN_PLACE, [buf, (counts, displs), "i"])
    want = np.concatenate([pattern(counts[s], np.int32, s, me) for s in range(n)])
    return bool((buf == want).all())


@pytest.mark.parametrize("n", [1, 3, 4])
def test_alltoallv_in_place(n):
    assert run_ranks(_in_place, n) == [True] * n


def _pending_on_one_rank(comm):
    """Rank 0 keeps an Ibarrier pending over an Alltoallv that the others
    make after waiting for theirs: a valid MPI program."""
    n, me = comm.size, comm.rank
    counts = [me + q + 1 for q in range(n)]                 # rank me sends rank q me + q + 1 items
    send = pattern(sum(counts), np.float64, 3, me)
    recv = poison(sum(q + me + 1 for q in range(n)), np.float64)
    if me == 0:
        req = comm.Ibarrier()           # started before any other's: it cannot end at its start
        for q in range(1, n):
            comm.Send(np.zeros(1), q, 5)
    else:
        comm.Recv(np.zeros(1), 0, 5)
        req = comm.Ibarrier()
        req.Wait()
    comm.Alltoallv([send, counts], [recv, [q + me + 1 for q in range(n)]])
    if me == 0:
        req.Wait()
    want = np.concatenate([pattern(sum(q + r + 1 for r in range(n)), np.float64, 3, q)[
        sum(q + r + 1 for r in range(me)):][:q + me + 1] for q in range(n)])
    return recv.tobytes() == want.tobytes()


@pytest.mark.parametrize("n", [2, 3])
def test_a_pending_call_on_one_rank_changes_no_route(n):
    """The automatic Alltoallv went by schedule on a rank with calls
    pending and by point-to-point elsewhere: each waited for the other."""
    assert run_ranks(_pending_on_one_rank, n, timeout=60) == [True] * n


def _mismatch(comm, algorithm):
    n, me = comm.size, comm.rank
    sc = [2] * n
    rc = [2] * n
    if me == n - 1:
        rc[0] = 3           # expects one item more from rank 0 than it sends
    send, recv = np.zeros(2 * n), np.zeros(sum(rc))
    out = attempt(comm, "Alltoallv", lambda: comm.Alltoallv([send, sc], [recv, rc], algorithm=algorithm))
    if algorithm is None:
        return out, None
    again = attempt(comm, "Alltoallv", lambda: comm.Alltoallv([send, [2] * n], [np.zeros(2 * n), [2] * n],
                                                              algorithm=algorithm))
    return out, again


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("algorithm", [None, "pairwise"])
def test_alltoallv_mismatched_counts_raise_on_every_rank(n, algorithm):
    """Never wrong data, never a hang.  The automatic Alltoallv (point-to-
    point, no table gathered first): the rank that receives the bad piece
    raises MismatchError naming the pair and aborts the job, so every
    other rank raises PeerFailure, in the call or in its Barrier.  A named
    schedule gathers the table first: every rank raises MismatchError and
    the communicator stays usable."""
    for rank, (out, again) in enumerate(run_ranks(_mismatch, n, algorithm)):
        if algorithm is None and rank != n - 1:
            assert out[0] in ("Alltoallv", "Barrier") and out[1] in ("PeerAborted", "PeerDied"), out
            continue
        assert out[0] == "Alltoallv" and out[1] == "MismatchError", out
        assert f"rank 0 sends rank {n - 1} 16 bytes but rank {n - 1} receives 24" in out[2]
        assert algorithm is None or again is None


class Contig:
    """An MPI datatype as the face's Datatype looks (duck typed): count
    items of base."""
    def __init__(self, base, count):
        self.base, self.count = np.dtype(base), count

    def Get_size(self):
        return self.base.itemsize * self.count


def _w_types(comm):
    """Per-peer datatypes: rank s sends rank d (d + 1) items of a type of
    (s + d) % 3 + 1 float64s, the receiver names the same type."""
    n, me = comm.size, comm.rank
    def typ(s, d):
        return Contig(np.float64, (s + d) % 3 + 1)
    stypes, rtypes = [typ(me, d) for d in range(n)], [typ(s, me) for s in range(n)]
    sc, rc = [d + 1 for d in range(n)], [me + 1] * n
    sbytes = [c * t.Get_size() for c, t in zip(sc, stypes)]
    rbytes = [c * t.Get_size() for c, t in zip(rc, rtypes)]
    sd = [sum(sbytes[d + 1:]) for d in range(n)]          # the last rank's piece first
    rd = [sum(rbytes[:s]) + 8 * s for s in range(n)]        # an 8-byte gap after each piece
    send = np.zeros(sum(sbytes) // 8)
    for d in range(n):
        send[sd[d] // 8:(sd[d] + sbytes[d]) // 8] = pattern(sbytes[d] // 8, np.float64, me, d)
    recv = poison((rd[-1] + rbytes[-1]) // 8, np.float64)
    comm.Alltoallw([send, (sc, sd), stypes], [recv, (rc, rd), rtypes])
    want = recv.copy()
    for s in range(n):
        want[rd[s] // 8:(rd[s] + rbytes[s]) // 8] = pattern(rbytes[s] // 8, np.float64, s, me)
    return recv.tobytes() == want.tobytes()


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_alltoallw_per_peer_types(n):
    assert run_ranks(_w_types, n) == [True] * n


def _refused(comm, form):
    s, r = np.zeros(4 * comm.size), np.zeros(4 * comm.size)
    p = comm.size
    call = {"no type": lambda: comm.Alltoallv([s, [1] * p, [0] * p], [r, [1] * p]),
            "strided": lambda: comm.Alltoallv(s[::2], r[::2])}[form]
    return attempt(comm, "Alltoallv", call)[1:3]


@pytest.mark.parametrize("form,error,says", [("no type", "TypeError", "datatype"),
                                              ("strided", "ValueError", "contiguous")])
def test_forms_mpi4py_refuses_are_refused(form, error, says):
    """[buf, counts, displs] without a datatype: mpi4py raises TypeError;
    a non-contiguous array: an error naming contiguity."""
    (got, message), = run_ranks(_refused, 1, form)
    assert got == error and says in message


def _fast_and_apart(comm):
    """Warm Alltoallv calls of mpi4py's forms (counts and displacements as
    lists, array.array, numpy arrays) run no Python function of shmcoll's;
    a user's ANY_SOURCE/ANY_TAG receive posted before them is not matched
    by their messages, and gets the user's message after."""
    import array
    from test_specs import _python_frames
    from shmcoll.request import ANY_SOURCE, ANY_TAG
    n, me = comm.size, comm.rank
    counts = [me + d + 1 for d in range(n)]
    displs = list(np.cumsum(counts) - counts)
    rcounts = [s + me + 1 for s in range(n)]
    rdispls = list(np.cumsum(rcounts) - rcounts)
    send = np.concatenate([pattern(counts[d], np.int32, me, d) for d in range(n)])
    want = np.concatenate([pattern(rcounts[s], np.int32, s, me) for s in range(n)])
    pending = comm.Irecv(np.zeros(1, np.int64), ANY_SOURCE, ANY_TAG)
    forms = [lambda c: c, lambda c: array.array("i", c), lambda c: np.array(c, np.int64)]
    ok, frames = True, []
    for form in forms:
        for _ in range(3):
            recv = np.full(sum(rcounts), -1, np.int32)
            frames = _python_frames(lambda: comm.Alltoallv([send, (form(counts), form(displs)), "i"],
                                                           [recv, (form(rcounts), form(rdispls)), "i"]))
            ok = ok and bool((recv == want).all())
    early = pending.Test()
    comm.Barrier()              # no rank's own message below is sent before every rank looked
    comm.Send(np.full(1, me, np.int64), (me + 1) % n, 9)
    pending.Wait()
    return ok, frames, early


@pytest.mark.parametrize("n", [2, 3, 4])
def test_alltoallv_takes_the_c_entry_apart_from_user_receives(n):
    for ok, frames, early in run_ranks(_fast_and_apart, n):
        assert ok and frames == [] and not early, (ok, frames, early)


def test_one_rank_mismatch_leaves_the_communicator_usable():
    """At one rank the automatic Alltoallv finds a mismatch before anything
    moves and no peer waits: MismatchError (a ValueError, as mpi4py's
    tests expect), and the next call works (mpi4py's test_msgspec)."""
    def job(comm):
        try:
            comm.Alltoallv([np.zeros(1, np.int32), [1]], [np.zeros(1, np.int32), [0]])
            return None
        except ValueError as e:
            got = type(e).__name__
        out = np.zeros(2, np.int32)
        comm.Alltoallv([np.arange(2, dtype=np.int32), [2]], [out, [2]])
        return got, out.tolist()
    assert run_ranks(job, 1) == [("MismatchError", [0, 1])]


def _byte_specs(comm):
    """osu_alltoallv's specs: [mmap, (array.array counts, displs), MPI.BYTE]; warm, all C."""
    import mmap
    from array import array
    from shmcoll import MPI
    from test_specs import _python_frames
    n, me, k = comm.size, comm.rank, 12
    counts, displs = array("i", [k] * n), array("i", [k * j for j in range(n)])
    s, r = mmap.mmap(-1, k * n), mmap.mmap(-1, k * n)
    np.frombuffer(s, np.uint8)[:] = np.arange(k * n, dtype=np.uint8) + 50 * me
    frames = []
    for _ in range(3):
        frames = _python_frames(lambda: comm.Alltoallv([s, (counts, displs), MPI.BYTE], [r, (counts, displs), MPI.BYTE]))
    want = np.concatenate([np.arange(k * me, k * me + k, dtype=np.uint8) + 50 * j for j in range(n)])
    return bool((np.frombuffer(r, np.uint8) == want).all()), frames


@pytest.mark.parametrize("n", [1, 2, 3])
def test_osu_byte_specs_over_mmap_take_the_c_entry(n):
    assert run_ranks(_byte_specs, n) == [(True, [])] * n
