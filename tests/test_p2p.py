"""Point-to-point (shmcoll/p2p.py over csrc/p2p.c): ping-pong at every
protocol's edges against numpy, Sendrecv rings, ANY_SOURCE under
contention, non-overtaking order across eager and rendezvous, probes,
Cancel, truncation, bad ranks and tags, PROC_NULL, a peer killed while
others wait.  Each rank's data is closed-form (rank, size, index), so the
expected values are computed by numpy, never stored.  The rings are forced
small (4 KiB, eager limit 1 KiB) so that ring wrap, pads, full rings and
the rendezvous all run at small sizes."""
import os
import signal
import time

import numpy as np
import pytest

import shmcoll
from shmcoll import MPI
from conftest import assert_killed_mid, in_threads, run_ranks
from shmcoll.errors import ERR_RANK, ERR_TAG, ERR_TRUNCATE, MPIError
from shmcoll.p2p import MESSAGE_NO_PROC, TAG_UB
from shmcoll.request import ANY_SOURCE, ANY_TAG, PROC_NULL, Prequest, Request, Status

pytestmark = pytest.mark.timeout(180)

RING, EAGER = 4096, 1024
SMALL = {"p2p_ring_bytes": RING, "p2p_eager_bytes": EAGER}
SIZES = [0, 1, EAGER - 1, EAGER, EAGER + 1, 3 * RING + 5, 1 << 20]
DTYPES = [np.uint8, np.int32, np.float64, np.complex128]


def data(src, dst, nbytes, dtype, salt=0):
    n = nbytes // np.dtype(dtype).itemsize
    return (np.arange(n) * 7 + src * 1000 + dst * 100 + salt).astype(dtype)


def run(fn, n, *args, options=SMALL, **kw):
    return run_ranks(fn, n, *args, options=options, **kw)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ping_pong(dtype):
    def job(comm):
        other = 1 - comm.rank
        for nbytes in SIZES:
            mine = data(comm.rank, other, nbytes, dtype)
            got = np.empty_like(mine)
            st = Status()
            if comm.rank == 0:
                comm.Send(mine, 1, tag=5)
                comm.Recv(got, 1, 6, st)
            else:
                comm.Recv(got, 0, ANY_TAG, st)
                comm.Send(mine, 0, tag=6)
            assert np.array_equal(got, data(other, comm.rank, nbytes, dtype)), nbytes
            assert (st.Get_source(), st.Get_tag(), st.Get_count(dtype)) == (other, 6 - comm.rank, mine.size)
        return True
    assert run(job, 2) == [True, True]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 9])
def test_sendrecv_ring(n):
    def job(comm):
        r, right, left = comm.rank, (comm.rank + 1) % n, (comm.rank - 1) % n
        for nbytes in (8, EAGER + 8, 5 * RING):
            got = np.empty(nbytes // 8)
            comm.Sendrecv(data(r, right, nbytes, np.float64), right, 1, got, left, 1)
            assert np.array_equal(got, data(left, r, nbytes, np.float64))
            buf = data(r, right, nbytes, np.float64, salt=3)
            comm.Sendrecv_replace(buf, right, 2, left, 2)
            assert np.array_equal(buf, data(left, r, nbytes, np.float64, salt=3))
        assert comm.sendrecv(("obj", r), right, source=left) == ("obj", left)
        return True
    assert all(run(job, n))


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_any_source_contention(n):
    """Every rank sends many messages to 0 (sizes cycling through both
    protocols); 0 receives them all with ANY_SOURCE: each source's arrive
    in the order sent."""
    count = 60

    def job(comm):
        sizes = [8, EAGER, EAGER + 8, 2 * RING]
        if comm.rank:
            for i in range(count):
                comm.Send(data(comm.rank, 0, sizes[i % 4], np.int64, salt=i), 0, tag=i % 3)
            return None
        seen = {s: 0 for s in range(1, n)}
        buf = np.empty(2 * RING // 8, np.int64)
        st = Status()
        for _ in range(count * (n - 1)):
            comm.Recv(buf, ANY_SOURCE, ANY_TAG, st)
            s, i = st.Get_source(), seen[st.Get_source()]
            k = st.Get_count(np.int64)
            assert st.Get_tag() == i % 3 and k * 8 == sizes[i % 4]
            assert np.array_equal(buf[:k], data(s, 0, sizes[i % 4], np.int64, salt=i))
            seen[s] += 1
        return seen
    assert run(job, n)[0] == {s: count for s in range(1, n)}


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_non_overtaking_mixed_tags(n):
    """Rank 1 sends eager then rendezvous messages under two tags; rank 0
    receives tag 2's first (tag 1's go to the unexpected queue), then tag
    1's: each tag's in the order sent, the bytes exact."""
    sizes = [16, 3 * RING, 8, EAGER + 1, 0, 2 * RING]

    def job(comm):
        if comm.rank == 1:
            reqs = [comm.Isend(data(1, 0, s, np.uint8, salt=i), 0, tag=1 + i % 2) for i, s in enumerate(sizes)]
            Request.Waitall(reqs)
        elif comm.rank == 0:
            for tag in (2, 1):
                for i, s in enumerate(sizes):
                    if 1 + i % 2 != tag:
                        continue
                    got = np.empty(s, np.uint8)
                    comm.Recv(got, 1, tag)
                    assert np.array_equal(got, data(1, 0, s, np.uint8, salt=i)), (tag, i)
        return True
    assert all(run(job, n))


@pytest.mark.parametrize("nbytes", [0, 24, EAGER + 8, 3 * RING])
def test_probe_and_mprobe(nbytes):
    def job(comm):
        if comm.rank == 1:
            reqs = [comm.Isend(data(1, 0, nbytes, np.float64), 0, tag=7),
                    comm.Isend(data(1, 0, nbytes, np.float64, salt=1), 0, tag=8), comm.isend({"k": nbytes}, 0, tag=9)]
            Request.Waitall(reqs)     # rendezvous sends complete only as rank 0 receives them, in its order
            return None
        st = Status()
        comm.Probe(1, 7, st)
        assert (st.Get_source(), st.Get_tag(), st.Get_count(np.float64)) == (1, 7, nbytes // 8)
        assert not comm.Iprobe(1, 11)
        msg = comm.Mprobe(ANY_SOURCE, 8, st)
        assert st.Get_count(np.float64) == nbytes // 8
        got = np.empty(nbytes // 8)
        comm.Recv(got, 1, 7)
        assert np.array_equal(got, data(1, 0, nbytes, np.float64))
        msg.Recv(got)
        assert np.array_equal(got, data(1, 0, nbytes, np.float64, salt=1))
        while (m := comm.Improbe(1, 9)) is None:
            pass
        return m.recv()
    assert run(job, 2)[0] == {"k": nbytes}


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_nonblocking_and_persistent(n):
    def job(comm):
        r = comm.rank
        right, left = (r + 1) % n, (r - 1) % n
        for nbytes in (8, 3 * RING):
            got = np.empty(nbytes // 8)
            rr = comm.Irecv(got, left, 4)
            sr = comm.Isend(data(r, right, nbytes, np.float64), right, 4)
            st = Status()
            Request.Waitall([sr, rr], [Status(), st])
            assert np.array_equal(got, data(left, r, nbytes, np.float64))
            assert st.Get_source() == left
        got = np.empty(4)
        send = comm.Send_init(data(r, right, 32, np.float64), right, 5)
        recv = comm.Recv_init(got, left, 5)
        for _ in range(3):
            Prequest.Startall([recv, send])
            Request.Waitall([send, recv])
            assert np.array_equal(got, data(left, r, 32, np.float64))
        req = comm.irecv(source=left, tag=6)
        comm.isend([r] * 3, right, 6).wait()
        assert req.wait() == [left] * 3
        rr = comm.Irecv(np.empty(1), left, 7)
        comm.Issend(np.full(1, r), right, 7).Wait()     # complete only once matched: by the Irecv above
        st = Status()
        rr.Wait(st)
        return st.Get_source() == left
    assert all(run(job, n))


@pytest.mark.parametrize("nbytes", [8, 3 * RING])
def test_posted_order_holds_for_late_arrivals(nbytes):
    """Receives A (tag 2), B (tag 3), C (tag 2) posted in that order: A
    gets the first tag-2 message even when it arrives between A's look and
    B's (forced here: A's look waits for B's message, which pulls the first
    tag-2 one out of its ring).  Before, C took A's message (CI saw it in
    test_staged_rendezvous)."""
    from shmcoll.p2p import _probe

    def job(comm):
        if comm.rank == 1:
            comm.Recv(np.empty(1), 0, 9)
            Request.Waitall([comm.Isend(data(1, 0, nbytes, np.uint8, salt=i), 0, tag)
                             for i, tag in enumerate((2, 3, 2))])
            return None
        bufs = [np.empty(nbytes, np.uint8) for _ in range(3)]
        a = comm.Irecv(bufs[0], 1, 2)
        first = a._match

        def late(ahead):         # A looks; then the messages arrive before B and C look
            if first(ahead):
                return True
            _probe(comm._ctx, 1, 3, True, False, None)
            a._match = first
            return False
        a._match = late
        b, c = comm.Irecv(bufs[1], 1, 3), comm.Irecv(bufs[2], 1, 2)
        comm.Send(np.ones(1), 1, 9)
        Request.Waitall([a, b, c])
        return [bool(np.array_equal(bufs[i], data(1, 0, nbytes, np.uint8, salt=i))) for i in range(3)]
    assert run(job, 2)[0] == [True, True, True]


def test_cancel_pending_irecv():
    def job(comm):
        if comm.rank == 0:
            req = comm.Irecv(np.empty(4), 1, 99)
            req.Cancel()
            st = Status()
            req.Wait(st)
            cancelled = st.Is_cancelled()
            got = np.empty(4)
            comm.Recv(got, 1, 98)           # the message a cancelled receive must not have taken
            return cancelled, bool(np.array_equal(got, data(1, 0, 32, np.float64)))
        comm.Send(data(1, 0, 32, np.float64), 0, 98)
        return None
    assert run(job, 2)[0] == (True, True)


@pytest.mark.parametrize("nbytes", [64, 3 * RING])
def test_truncation(nbytes):
    """The receiver raises ERR_TRUNCATE; the sender does not hang: its next
    wait raises as the job is aborted."""
    def job(comm):
        try:
            if comm.rank == 1:
                comm.Send(np.zeros(nbytes, np.uint8), 0)
                comm.Recv(np.zeros(1), 0)
                return "sender returned"
            comm.Recv(np.zeros(nbytes // 2, np.uint8), 1)
            return "receiver returned"
        except MPIError as e:
            return ("mpi", e.Get_error_class())
        except shmcoll.PeerFailure:
            return "peer"
    assert run(job, 2, timeout=30) == [("mpi", ERR_TRUNCATE), "peer"]


@pytest.mark.parametrize("nbytes", [64, 3 * RING])
def test_truncated_while_another_receive_is_pending(nbytes):
    """Under ERRORS_RETURN, a receive truncated while another receive is
    pending (so matched in a poll, not at once) raises at its own wait and
    the next receive gets the next message (it was left posted, took that
    message in the next one's place, and the next one waited forever)."""
    def job(comm):
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        if comm.rank == 1:
            comm.Send(data(1, 0, nbytes, np.uint8), 0, 4)
            comm.Send(data(1, 0, 16, np.uint8, salt=1), 0, 4)
            comm.Send(np.ones(1), 0, 99)
            return None
        pending = comm.Irecv(np.zeros(1), 1, 99)
        err = None
        try:
            comm.Recv(np.zeros(nbytes // 2, np.uint8), 1, 4)
        except MPIError as e:
            err = e.Get_error_class()
        got = np.zeros(16, np.uint8)
        comm.Recv(got, 1, 4)
        pending.Wait()
        return err, np.array_equal(got, data(1, 0, 16, np.uint8, salt=1))
    assert run(job, 2, timeout=30)[0] == (ERR_TRUNCATE, True)


@pytest.mark.parametrize("nbytes", [64, 3 * RING])
@pytest.mark.parametrize("how", ["Wait", "Test", "arrived", "Recv", "Sendrecv", "Mrecv"])
def test_a_truncated_receive_fills_its_status(nbytes, how):
    """As MPI's: the status of a receive that raises ERR_TRUNCATE names the
    message's source, tag and size (its error field is for the calls on
    many), whether the receive was posted before its message (Wait, Test)
    or made after it arrived ("arrived": the Irecv itself does not raise,
    its Wait does), blocking, or of a matched probe."""
    def job(comm):
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        if comm.rank == 1:
            comm.Recv(np.zeros(1), 0, 1)             # rank 0's receive is posted (or not needed) by now
            long = comm.Isend(np.zeros(nbytes, np.uint8), 0, 9)
            comm.Send(np.zeros(1), 0, 2)
            long.Wait()
            if how == "Sendrecv":
                comm.Recv(np.zeros(1), 0, 3)
            return None
        st, small = Status(), np.zeros(nbytes // 2, np.uint8)
        req = comm.Irecv(small, ANY_SOURCE, ANY_TAG) if how in ("Wait", "Test") else None
        comm.Send(np.zeros(1), 1, 1)
        try:
            if how == "Wait":
                req.Wait(st)
            elif how == "Test":
                while not req.Test(st):
                    pass
            elif how == "arrived":
                comm.Recv(np.zeros(1), 1, 2)         # sent after the long one: that one is here (or begun)
                req = comm.Irecv(small, 1, 9)
                req.Wait(st)
            elif how == "Recv":
                comm.Recv(small, 1, 9, st)
            elif how == "Sendrecv":
                comm.Sendrecv(np.zeros(1), 1, 3, small, 1, 9, st)
            else:
                comm.Mprobe(1, 9).Recv(small, st)
        except MPIError as e:
            return e.Get_error_class(), st.Get_source(), st.Get_tag(), st.Get_count(MPI.BYTE), st.Get_error()
        return None
    assert run(job, 2, timeout=30)[0] == (ERR_TRUNCATE, 1, 9, nbytes, MPI.SUCCESS)


@pytest.mark.parametrize("call,cls", [(lambda c: c.Send(np.zeros(1), c.size), ERR_RANK),
                                      (lambda c: c.Recv(np.zeros(1), -7), ERR_RANK),
                                      (lambda c: c.Send(np.zeros(1), 0, -1), ERR_TAG),
                                      (lambda c: c.Isend(np.zeros(1), 0, TAG_UB + 1), ERR_TAG),
                                      (lambda c: c.Recv(np.zeros(1), 0, -5), ERR_TAG),
                                      (lambda c: c.Send(np.zeros(1), float("nan")), ERR_RANK),
                                      (lambda c: c.Isend(np.zeros(1), 0, float("inf")), ERR_TAG),
                                      (lambda c: c.Send(np.zeros(1), 2.5 + c.size), ERR_RANK)])
def test_bad_rank_or_tag(call, cls):
    """Raised on the rank that made the call; the others, waiting, raise too."""
    def job(comm):
        try:
            if comm.rank == 0:
                call(comm)
            else:
                comm.Recv(np.zeros(1), 0)
        except MPIError as e:
            return ("mpi", e.Get_error_class())
        except shmcoll.PeerFailure:
            return "peer"
    assert run(job, 3, timeout=30) == [("mpi", cls), "peer", "peer"]


def test_bad_buffer_aborts():
    """A receive into a read-only buffer raises there and the peers raise too."""
    def job(comm):
        try:
            if comm.rank == 0:
                comm.Recv(b"read-only", 1)
            else:
                comm.Recv(np.zeros(1), 0)
        except shmcoll.PeerFailure:
            return "peer"
        except (BufferError, TypeError, ValueError) as e:
            return type(e).__name__
    out = run(job, 3, timeout=30)
    assert out[0] in ("BufferError", "TypeError", "ValueError") and out[1:] == ["peer", "peer"]


@pytest.mark.parametrize("buf", ["objects", "foreign"])
def test_object_or_foreign_arrays_abort(buf):
    """An array of Python objects (its buffer would send pointers) or in a
    foreign byte order is refused where it is sent, and the peers raise."""
    def job(comm):
        bad = np.array([object()] * 4) if buf == "objects" else np.arange(4, dtype=">i4")
        try:
            if comm.rank == 0:
                comm.Send(bad, 1)
            else:
                comm.Recv(np.zeros(32, np.uint8), 0)
        except shmcoll.PeerFailure:
            return "peer"
        except (BufferError, TypeError) as e:
            return type(e).__name__
    assert run(job, 2, timeout=30) == ["TypeError" if buf == "objects" else "BufferError", "peer"]


def test_proc_null():
    def job(comm):
        st = Status()
        comm.Send(np.zeros(3), PROC_NULL)
        comm.Recv(np.zeros(3), PROC_NULL, 5, st)
        a = (st.Get_source(), st.Get_tag(), st.Get_count())
        st2 = Status()
        comm.Sendrecv(np.zeros(1), PROC_NULL, recvbuf=np.zeros(1), source=PROC_NULL, status=st2)
        m = comm.Mprobe(PROC_NULL)
        req = comm.Irecv(np.zeros(1), PROC_NULL)
        return a, (st2.Get_source(), st2.Get_tag()), m is MESSAGE_NO_PROC, m.recv(), req.Test()
    assert run(job, 2) == [((PROC_NULL, ANY_TAG, 0), (PROC_NULL, ANY_TAG), True, None, True)] * 2


@pytest.mark.parametrize("wait", ["recv", "any_source", "wait", "rendezvous", "shared_wait", "waitany", "waitsome"])
def test_peer_killed_while_waiting(wait):
    """shared_wait: another engine is registered, so Wait also advances it
    (timed waits) and must still see the death."""
    n = 3

    def waits(comm):
        if wait == "shared_wait":
            from shmcoll import request
            request.register(_other_engine)
            comm.Irecv(np.zeros(1), n - 1).Wait()
        elif wait == "recv":
            comm.Recv(np.zeros(1), n - 1)
        elif wait == "any_source":
            comm.Recv(np.zeros(1), ANY_SOURCE)
        elif wait == "wait":
            comm.Irecv(np.zeros(1), n - 1).Wait()
        elif wait in ("waitany", "waitsome"):
            from shmcoll.request import Request
            getattr(Request, wait.capitalize())([comm.Irecv(np.zeros(1), n - 1), comm.Irecv(np.zeros(1), n - 1)])
        else:
            comm.Send(np.zeros(RING), n - 1)
    assert_killed_mid(waits, n)


def _other_engine():
    _other_engine.calls += 1


_other_engine.calls = 0


def test_wait_advances_other_engines():
    """With another engine registered, a p2p Wait completes and advances it."""
    def job(comm):
        from shmcoll import request
        request.register(_other_engine)
        got = np.empty(3 * RING // 8)
        if comm.rank == 0:
            comm.Isend(data(0, 1, 3 * RING, np.float64), 1).Wait()
            return True
        req = comm.Irecv(got, 0)
        req.Wait()
        return bool(np.array_equal(got, data(0, 1, 3 * RING, np.float64))) and _other_engine.calls > 0
    assert run(job, 2) == [True, True]


def test_signal_while_waiting():
    """A signal handler that raises interrupts a blocked Recv (Ctrl-C works);
    the job is aborted, so the peer waiting on this rank raises too."""
    class Interrupt(Exception):
        pass

    def job(comm):
        def handler(*_):
            raise Interrupt()
        try:
            if comm.rank == 0:
                signal.signal(signal.SIGALRM, handler)
                signal.setitimer(signal.ITIMER_REAL, 0.3)
                t = time.monotonic()
                try:
                    comm.Recv(np.zeros(1), 1)
                except Interrupt:
                    return "interrupted", time.monotonic() - t < 5
            comm.Recv(np.zeros(1), 0)
            return "returned"
        except shmcoll.PeerFailure:
            return "peer"
    assert run(job, 2, timeout=30) == [("interrupted", True), "peer"]


def test_deadlock_times_out():
    """Two ranks each waiting in Recv for the other (an unsafe program)
    raise PeerTimeout at the stall timeout instead of hanging."""
    def job(comm):
        t = time.monotonic()
        try:
            comm.Recv(np.zeros(1), 1 - comm.rank)
        except shmcoll.PeerFailure as e:
            return type(e).__name__, time.monotonic() - t < 10
    out = run(job, 2, options={**SMALL, "timeout": 1}, timeout=30)
    assert {o[1] for o in out} == {True} and "PeerTimeout" in {o[0] for o in out}, out


def test_rendezvous_sender_waits_for_copy():
    """A blocking rendezvous Send returns only once the receiver has copied:
    the sender may then overwrite its buffer."""
    def job(comm):
        big = 3 * RING // 8
        if comm.rank == 0:
            a = data(0, 1, 3 * RING, np.float64)
            comm.Send(a, 1)
            a[:] = -1
            comm.Send(a, 1)
            return True
        got = np.empty(big)
        comm.Recv(got, 0)
        ok = np.array_equal(got, data(0, 1, 3 * RING, np.float64))
        comm.Recv(got, 0)
        return ok and bool((got == -1).all())
    assert run(job, 2) == [True, True]


@pytest.mark.parametrize("eager", [RING // 2 - 64, RING // 2 - 72])
def test_largest_eager_wraps(eager):
    """The largest eager records, of half the ring, wrap at every offset
    (sizes stepping by 8 bytes) without waiting on a pad."""
    def job(comm):
        sizes = [eager - 8 * (i % 7) for i in range(60)]
        if comm.rank == 1:
            for i, s in enumerate(sizes):
                comm.Send(data(1, 0, s, np.uint8, salt=i), 0)
            return True
        for i, s in enumerate(sizes):
            got = np.empty(s, np.uint8)
            comm.Recv(got, 1)
            assert np.array_equal(got, data(1, 0, s, np.uint8, salt=i))
        return True
    assert run(job, 2, options={"p2p_ring_bytes": RING, "p2p_eager_bytes": eager}) == [True, True]


def test_eager_limit_checked():
    with pytest.raises(ValueError, match="p2p_eager_bytes"):
        run_ranks(lambda comm: None, 2, options={"p2p_ring_bytes": RING, "p2p_eager_bytes": RING // 2})


def test_default_sizes():
    def job(comm):
        p = comm.plan.params
        return p["p2p_ring_bytes"], p["p2p_eager_bytes"]
    assert run_ranks(job, 2)[0] == (1 << 20, 16 << 10)
    assert run_ranks(job, 8)[0] == (256 << 10, 16 << 10)
    # Docker's 64 MiB /dev/shm: a communicator's rings take a 64th of it, so that Dups fit beside it
    assert run_ranks(job, 4, options={"shm_bytes": 64 << 20})[0] == (64 << 10, 16 << 10)


def test_fast_entries_and_specs():
    """Send/Recv are C entries per communicator; specs, Fortran-ordered
    arrays and bytes take the Python path with the same result."""
    def job(comm):
        bound = tuple(type(comm.__dict__[m]).__name__ for m in ("Send", "Recv", "Sendrecv"))
        if comm.rank == 0:
            comm.Send([data(0, 1, 80, np.float64), "d"], 1, 1)
            comm.Send([data(0, 1, 80, np.int32), 6, "i"], 1, 2)
            comm.Send(np.asfortranarray(data(0, 1, 96, np.float64).reshape(3, 4)), 1, 3)
            comm.Send(b"bytes", 1, 4)
            return bound
        a, b, f, c = np.empty(10), np.zeros(20, np.int32), np.empty((3, 4), order="F"), bytearray(5)
        st = Status()
        comm.Recv([a, 10, "d"], 0, 1)
        comm.Recv([b, 6, 2, "i"], 0, 2, st)          # [buf, count, displ, type]: items 2..7
        comm.Recv(f, 0, 3)
        comm.Recv(c, 0, 4)
        ok = [np.array_equal(a, data(0, 1, 80, np.float64)),
              np.array_equal(b[2:8], data(0, 1, 80, np.int32)[:6]) and not b[:2].any() and not b[8:].any(),
              np.array_equal(f, np.asfortranarray(data(0, 1, 96, np.float64).reshape(3, 4))),
              bytes(c) == b"bytes", st.Get_count(np.int32) == 6]
        return bound, ok
    out = run(job, 2)
    assert out[0] == ("builtin_function_or_method",) * 3
    assert out[1][1] == [True] * 5


@pytest.mark.parametrize("n", [2, 3])
def test_two_threads(n):
    """Two threads of every rank exchange with their neighbours on the same
    communicator, under distinct tags, concurrently."""
    def job(comm):
        r, right, left = comm.rank, (comm.rank + 1) % n, (comm.rank - 1) % n

        def worker(tag):
            for i in range(50):
                nbytes = (8, EAGER + 8, 2 * RING)[i % 3]
                got = np.empty(nbytes // 8)
                req = comm.Isend(data(r, right, nbytes, np.float64, salt=tag * 100 + i), right, tag)
                comm.Recv(got, left, tag)
                req.Wait()
                assert np.array_equal(got, data(left, r, nbytes, np.float64, salt=tag * 100 + i))
        in_threads(worker, [(1,), (2,)])
        return True
    assert all(run(job, n))


def test_unexpected_queue_bound():
    """With no room for unexpected messages, the receiver leaves them in
    their ring (the sender waits, the ring full many times over) and still
    receives every one in order."""
    count = 400

    def job(comm):
        if comm.rank == 1:
            for i in range(count):
                comm.Send(data(1, 0, 64, np.uint8, salt=i), 0, tag=i % 2)
            return True
        got = np.empty(64, np.uint8)
        for i in range(count):
            comm.Recv(got, 1, i % 2)
            assert np.array_equal(got, data(1, 0, 64, np.uint8, salt=i))
        return True
    assert run(job, 2, options={**SMALL, "p2p_queue_bytes": 0}) == [True, True]


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_objects(n):
    def job(comm):
        r = comm.rank
        if r:
            comm.send({"from": r, "a": list(range(r))}, 0, tag=5)
            comm.ssend(("sync", r), 0, tag=100)
            return None
        got = {}
        st = Status()
        for _ in range(n - 1):
            obj = comm.recv(source=ANY_SOURCE, tag=5, status=st)
            got[st.Get_source()] = obj == {"from": st.Get_source(), "a": list(range(st.Get_source()))}
        reqs = [comm.irecv(source=s, tag=100) for s in range(1, n)]
        return got, [q.wait() for q in reqs]
    out = run(job, n)[0]
    assert out == ({s: True for s in range(1, n)}, [("sync", s) for s in range(1, n)])


@pytest.mark.parametrize("n", [1, 2])
def test_messages_to_self(n):
    """mpi4py's own checks on COMM_SELF: an Issend to self stays pending
    until its Recv, a rendezvous to self through a posted Irecv, more
    synchronous sends in flight than a pair's completion slots (15)."""
    def job(comm):
        r = comm.rank
        req = comm.Issend(b"", r, 123)
        st = Status()
        comm.Probe(ANY_SOURCE, ANY_TAG, st)
        first = (st.Get_source(), st.Get_tag(), bool(req), req.Test())
        comm.Recv(bytearray(0), r, 123)
        second = (req.Test(), bool(req))
        a = data(r, r, 1 << 20, np.float64)
        b = np.empty_like(a)
        rq = comm.Irecv(b, r, 5)
        comm.Send(a, r, 5)
        rq.Wait()
        reqs = [comm.issend({"k": k}, r, 0) for k in range(20)]
        got = [comm.recv(None, r, 0) for _ in range(20)]
        Request.Waitall(reqs)
        return first, second, bool(np.array_equal(a, b)), got == [{"k": k} for k in range(20)], comm.Iprobe()
    assert run(job, n) == [((r, 123, True, False), (True, False), True, True, False) for r in range(n)]


def staged(job):
    """job with single copies off (as where the kernel refuses
    process_vm_readv): rendezvous messages stream through the rings."""
    def run_staged(comm, *args):
        comm._c.cma = 0
        return job(comm, *args)
    return run_staged


@pytest.mark.parametrize("n", [2, 3, 5])
def test_staged_rendezvous(n):
    """Without single copies: ping-pong at every size, a Sendrecv ring,
    a window of Isend/Irecv, eager and staged messages of two tags
    received out of order, Mprobe, each equal to numpy's reference."""
    @staged
    def job(comm):
        r, right, left = comm.rank, (comm.rank + 1) % n, (comm.rank - 1) % n
        for nbytes in SIZES:
            got = np.empty(nbytes, np.uint8)
            comm.Sendrecv(data(r, right, nbytes, np.uint8), right, 1, got, left, 1)
            assert np.array_equal(got, data(left, r, nbytes, np.uint8)), nbytes
        sizes = [3 * RING, 16, 5 * RING + 3, EAGER + 1]
        bufs = [np.empty(s, np.uint8) for s in sizes]
        reqs = [comm.Irecv(b, left, 2 + i % 2) for i, b in enumerate(bufs)]
        sends = [comm.Isend(data(r, right, s, np.uint8, salt=i), right, 2 + i % 2) for i, s in enumerate(sizes)]
        Request.Waitall(reqs + sends)
        for i, (s, b) in enumerate(zip(sizes, bufs)):
            assert np.array_equal(b, data(left, r, s, np.uint8, salt=i)), i
        if r == 0:      # nonblocking: rank 1 takes tag 11's first, and a rendezvous Send waits for its receive
            Request.Waitall([comm.Isend(data(0, 1, s, np.uint8, salt=i), 1, 10 + i % 2) for i, s in enumerate(sizes)])
        elif r == 1:
            for tag in (11, 10):
                for i, s in enumerate(sizes):
                    if 10 + i % 2 == tag:
                        msg = comm.Mprobe(0, tag)
                        got = np.empty(s, np.uint8)
                        msg.Recv(got)
                        assert np.array_equal(got, data(0, 1, s, np.uint8, salt=i)), (tag, i)
        comm.Barrier()
        return comm._c.cma
    assert run(job, n) == [0] * n


def test_staged_truncation_and_threads():
    @staged
    def job(comm):
        other = 1 - comm.rank

        def worker(tag):
            for i in range(20):
                nbytes = (8, 3 * RING, EAGER + 8)[i % 3]
                got = np.empty(nbytes, np.uint8)
                req = comm.Isend(data(comm.rank, other, nbytes, np.uint8, salt=tag + i), other, tag)
                comm.Recv(got, other, tag)
                req.Wait()
                assert np.array_equal(got, data(other, comm.rank, nbytes, np.uint8, salt=tag + i))
        in_threads(worker, [(1,), (2,)])
        try:
            if comm.rank == 0:
                comm.Send(np.zeros(3 * RING, np.uint8), 1)
                comm.Recv(np.zeros(1), 1)
                return "sender returned"
            comm.Recv(np.zeros(RING, np.uint8), 0)
            return "receiver returned"
        except MPIError as e:
            return ("mpi", e.Get_error_class())
        except shmcoll.PeerFailure:
            return "peer"
    assert run(job, 2, timeout=60) == ["peer", ("mpi", ERR_TRUNCATE)]


def test_payload_that_reads_as_a_header():
    """The receiver finds each record by the lap stamp in its kind word.
    Payloads made of nothing but the stamp of the lap after their own, in sizes
    that shift the records' starts from lap to lap, each sent only once
    the receiver waits for it (so it looks at old payload first), must
    never pass for a record: each message arrives whole, once, in order."""
    ring = 1024
    sizes = [(7 * i) % 37 * 4 + 4 for i in range(600)]
    laps, pos = [], 0
    for nb in sizes:        # where csrc/p2p.c puts each record: its lap; the next lap's stamp goes in its payload
        rec = 32 + -(-nb // 32) * 32
        pos += ring - pos % ring if pos % ring + rec + 32 > ring else 0
        laps.append(pos // ring + 1)
        pos += rec

    def job(comm):
        for i, nb in enumerate(sizes):
            words = np.full(nb // 4, (laps[i] + 1) << 8 | 1, np.int32)
            if comm.rank == 0:
                comm.Send(words, 1, i % 3)
                comm.Recv(np.zeros(1, np.uint8), 1)
                continue
            got = np.empty(nb // 4, np.int32)
            st = Status()
            comm.Recv(got, 0, ANY_TAG, st)
            comm.Send(np.zeros(1, np.uint8), 0)
            assert st.Get_tag() == i % 3 and st.Get_count(np.int32) == nb // 4, i
            assert np.array_equal(got, words), i
        return True
    assert run(job, 2, options={"p2p_ring_bytes": ring, "p2p_eager_bytes": 256}, timeout=60) == [True, True]


SHARE = 32 << 10       # csrc/p2p.c SHARE_MIN: a rendezvous this long is copied by both ends
SHARED_SIZES = [SHARE - 1, SHARE, SHARE + 1, 9 * (16 << 10) + 5, (1 << 20) + 7, (5 << 20) + 3]


@pytest.mark.parametrize("n", [2, 3, 5])
def test_shared_rendezvous(n):
    """Long rendezvous copied by both ends (the sender writes pieces from
    the back while the receiver reads from the front): ping-pong, a
    Sendrecv ring, two sources into one rank by ANY_SOURCE, a receive
    shorter than the message, Mprobe, and two threads taking long
    messages from one source at once, each equal to numpy's reference;
    and the senders did write part of them."""
    from shmcoll._core import lib

    def job(comm):
        r, right, left = comm.rank, (comm.rank + 1) % n, (comm.rank - 1) % n
        for nbytes in SHARED_SIZES:
            got = np.empty(nbytes, np.uint8)
            if r < 2:
                for _ in range(2):
                    if r == 0:
                        comm.Send(data(0, 1, nbytes, np.uint8), 1, 1)
                        comm.Recv(got, 1, 1)
                    else:
                        comm.Recv(got, 0, 1)
                        comm.Send(data(1, 0, nbytes, np.uint8), 0, 1)
                    assert np.array_equal(got, data(1 - r, r, nbytes, np.uint8)), nbytes
            comm.Sendrecv(data(r, right, nbytes, np.uint8), right, 2, got, left, 2)
            assert np.array_equal(got, data(left, r, nbytes, np.uint8)), nbytes
        big = SHARED_SIZES[-1]
        if r == 0:
            st = Status()
            for _ in range(n - 1):
                got = np.empty(big, np.uint8)
                comm.Recv(got, ANY_SOURCE, 3, st)
                assert np.array_equal(got, data(st.Get_source(), 0, big, np.uint8)), st.Get_source()
            msg = comm.Mprobe(1, 5)
            got = np.empty(big, np.uint8)
            msg.Recv(got)
            assert np.array_equal(got, data(1, 0, big, np.uint8, salt=5))
        else:
            comm.Send(data(r, 0, big, np.uint8), 0, 3)
            if r == 1:
                comm.Send(data(1, 0, big, np.uint8, salt=5), 0, 5)

        def worker(tag):
            for i in range(6):
                got = np.empty(big, np.uint8)
                if r == 0:
                    comm.Recv(got, 1, tag)
                    assert np.array_equal(got, data(1, 0, big, np.uint8, salt=tag + i)), (tag, i)
                elif r == 1:
                    comm.Send(data(1, 0, big, np.uint8, salt=tag + i), 0, tag)
        in_threads(worker, [(10,), (20,)])
        comm.Barrier()
        return comm._c.cma, lib.sc_p2p_helped(comm._c)
    out = run(job, n, timeout=120)
    assert all(cma for cma, _ in out)
    assert sum(helped for _, helped in out) > 0


def test_shared_truncation():
    """A long message into a shorter receive: the receiver gets its first
    bytes and ERR_TRUNCATE, and neither end writes past the receive (the
    guard bytes after it keep their value); the job then aborts."""
    big = (3 << 20) + 5

    def job(comm):
        try:
            if comm.rank == 0:
                comm.Send(data(0, 1, big, np.uint8), 1)
                comm.Recv(np.zeros(1), 1)
                return "sender returned"
            space = np.full(big, 7, np.uint8)
            short = space[:big // 2 + 1]
            try:
                comm.Recv(short, 0)
            except MPIError as e:
                ok = np.array_equal(short, data(0, 1, big, np.uint8)[:short.size]) and (space[short.size:] == 7).all()
                return ("mpi", e.Get_error_class(), bool(ok))
            return "receiver returned"
        except shmcoll.PeerFailure:
            return "peer"
    assert run(job, 2, timeout=60) == ["peer", ("mpi", ERR_TRUNCATE, True)]


def test_float_ranks_tags_and_roots_truncate_as_mpi4py():
    """mpi4py's C int arguments take a float and truncate it (osu_multi_lat
    computes its partner as nprocs / 2 + rank)."""
    def job(comm):
        other = (comm.rank + 1) % 2 + 0.0            # 1.0 or 0.0
        got = np.zeros(3)
        req = comm.Isend(np.full(3, comm.rank + 5.0), other, 7.9)
        comm.Recv(got, other + 0.4, 7.0)
        req.Wait()
        b = np.full(2, comm.rank + 1.0)
        comm.Bcast(b, root=1.0)
        return got.tolist(), b.tolist()
    for r, (got, b) in enumerate(run(job, 2)):
        assert got == [(1 - r) + 5.0] * 3 and b == [2.0, 2.0]


P2P_SPECS = {
    "[buf, count, MPI.BYTE]": lambda b, n, d: [b[d:], n * 4, MPI.BYTE],
    "[buf, count, displ, MPI.INT]": lambda b, n, d: [b, n, d, MPI.INT],
    "[buf, (count, displ), MPI.INT]": lambda b, n, d: [b, (n, d), MPI.INT],
    "[buf, MPI.INT]": lambda b, n, d: [b[d:d + n], MPI.INT],
}


@pytest.mark.parametrize("form", list(P2P_SPECS))
def test_p2p_specs_take_the_c_entry(form):
    """Send/Recv/Sendrecv of mpi4py's buffer specs move the spec's items
    (numpy's slice) and, warm, run no Python function of shmcoll's."""
    import sys

    def job(comm):
        other, n, d = 1 - comm.rank, 5, 2
        frames, ok = [], True

        def prof(frame, event, arg):
            if event == "call" and "shmcoll" in frame.f_code.co_filename:
                frames.append(frame.f_code.co_name)
        for k in range(3):
            src = np.arange(10, dtype=np.int32) + 100 * comm.rank + k
            dst = np.full(10, -1, np.int32)
            frames.clear()
            sys.setprofile(prof)
            try:
                if comm.rank == 0:
                    comm.Send(P2P_SPECS[form](src, n, d), other, 3)
                    comm.Recv(P2P_SPECS[form](dst, n, d), other, 4)
                else:
                    comm.Recv(P2P_SPECS[form](dst, n, d), other, 3)
                    comm.Send(P2P_SPECS[form](src, n, d), other, 4)
                comm.Sendrecv(P2P_SPECS[form](src, n, d), other, 5, P2P_SPECS[form](dst, n, d), other, 5)
            finally:
                sys.setprofile(None)
            want = np.full(10, -1, np.int32)
            want[d:d + n] = np.arange(d, d + n) + 100 * other + k
            ok = ok and np.array_equal(dst, want)
        return ok, frames
    for ok, frames in run(job, 2):
        assert ok and frames == [], frames


@pytest.mark.parametrize("cma", [1, 0])
def test_isend_irecv_waitall_take_the_c_entries(cma):
    """A window of eager Isends, Irecvs of messages already here and their
    Waitall run no Python function of shmcoll's (the C entries and
    csrc/p2p.c waitall) but the engines' progress, once a Waitall; the
    data, the statuses (Wait's, Waitall's,
    Get_status', a Request(req) handle's) and a rendezvous or staged
    message begun in C (made()) are as numpy's reference says."""
    import sys

    def job(comm):
        comm._c.cma = cma
        other, w, big = 1 - comm.rank, 6, 3 * RING
        frames = []

        def prof(frame, event, arg):
            if event == "call" and "shmcoll" in frame.f_code.co_filename and frame.f_code.co_name != "_poll":
                frames.append(frame.f_code.co_name)
        comm.Barrier()
        if comm.rank == 1:
            msgs = [data(1, 0, 8, np.float64, salt=i) for i in range(w)]
            sys.setprofile(prof)
            try:
                Request.Waitall([comm.Isend(m, 0, 3 + i % 2) for i, m in enumerate(msgs)])
            finally:
                sys.setprofile(None)
            req = comm.Isend(data(1, 0, big, np.uint8), 0, 9)     # a rendezvous (staged without cma)
            comm.Send(np.ones(1), 0, 8)
            req.Wait()
            return frames
        comm.Probe(1, 4)
        while not comm.Iprobe(1, 3 + (w - 1) % 2):      # all of the window is here
            pass
        got = [np.empty(1) for _ in range(w)]
        sys.setprofile(prof)
        try:
            reqs = [comm.Irecv(g, 1, 3 + i % 2) for i, g in enumerate(got)]
            Request.Waitall(reqs[:-2])
        finally:
            sys.setprofile(None)
        assert all(np.array_equal(g, data(1, 0, 8, np.float64, salt=i)) for i, g in enumerate(got)), got
        st, other_st = Status(), Status()
        assert reqs[-2].Get_status(st) and (st.Get_source(), st.Get_tag(), st.Get_count()) == (1, 3 + w % 2, 8)
        assert Request(reqs[-1]).Get_status(other_st) and other_st.Get_tag() == 3 + (w - 1) % 2
        reqs[-2].Wait(st)
        assert (st.Get_source(), st.Get_tag(), st.Get_count(MPI.DOUBLE)) == (1, 3 + w % 2, 1)
        statuses = [Status()]
        Request.Waitall(reqs[-1:], statuses)
        assert statuses[0].Get_tag() == 3 + (w - 1) % 2 and not reqs[-1] and reqs[-1] == MPI.REQUEST_NULL
        reqs[-1].Wait(st)              # inactive: an empty status
        assert (st.Get_source(), st.Get_tag(), st.Get_count()) == (ANY_SOURCE, ANY_TAG, 0)
        comm.Recv(np.empty(1), 1, 8)    # the rendezvous' header is here: the Irecv matches it in C
        big_got = np.empty(big, np.uint8)
        comm.Irecv(big_got, 1, 9).Wait()
        assert np.array_equal(big_got, data(1, 0, big, np.uint8))
        return frames
    assert run(job, 2) == [["progress"], ["progress"]]


PIPED = [8191, 8192, 8193, 12 * 1024 + 5, 16 * 1024]      # eager messages written piece by piece from 8 KiB


def test_piped_eager_messages():
    """Eager messages of 8-16 KiB go into the ring 4 KiB at a time, taken
    out as they go in: ping-pongs (the receive waiting), unexpected ones
    (lifted into the queue once whole), Mprobe'd ones, a truncated one,
    each equal to numpy's reference (default rings: 16 KiB eager)."""
    def job(comm):
        other = 1 - comm.rank
        for i, nbytes in enumerate(PIPED):
            got = np.empty(nbytes, np.uint8)
            if comm.rank == 0:
                comm.Send(data(0, 1, nbytes, np.uint8, salt=i), 1, 1)
                comm.Recv(got, 1, 2)
            else:
                comm.Recv(got, 0, 1)
                comm.Send(data(1, 0, nbytes, np.uint8, salt=i), 0, 2)
            assert np.array_equal(got, data(other, comm.rank, nbytes, np.uint8, salt=i)), nbytes
        if comm.rank == 0:
            for i, nbytes in enumerate(PIPED):
                comm.Send(data(0, 1, nbytes, np.uint8, salt=10 + i), 1, 3 + i % 2)
            comm.Send(data(0, 1, PIPED[-1], np.uint8, salt=20), 1, 5)
            return comm.plan.params["p2p_eager_bytes"]
        comm.Probe(0, 5)                        # all are here: tags 3 and 4 taken out of order, so queued
        for tag in (4, 3):
            for i, nbytes in enumerate(PIPED):
                if 3 + i % 2 == tag:
                    got = np.empty(nbytes, np.uint8)
                    if tag == 4:
                        comm.Mprobe(0, tag).Recv(got)
                    else:
                        comm.Recv(got, 0, tag)
                    assert np.array_equal(got, data(0, 1, nbytes, np.uint8, salt=10 + i)), (tag, nbytes)
        with pytest.raises(MPIError) as e:
            comm.Recv(np.empty(PIPED[0], np.uint8), 0, 5)
        return e.value.Get_error_class() == ERR_TRUNCATE
    assert run(job, 2, options={}) == [16 << 10, True]


def test_waitall_survives_a_wait_that_changes_the_list():
    """Request.Waitall (C) walks a copy: a Wait that empties the caller's
    list (another thread could) must not leave it reading freed items."""
    import gc

    class Clearing:
        def __init__(self, reqs):
            self.reqs, self.waited = reqs, 0

        def Wait(self):
            self.waited += 1
            self.reqs.clear()
            gc.collect()
    reqs = []
    reqs += [Clearing(reqs) for _ in range(50)]
    items = list(reqs)
    assert Request.Waitall(reqs) is True
    assert [r.waited for r in items] == [1] * 50


def test_queued_sends_of_a_handle_made_busy_still_move():
    """A handle (MPI.Comm(comm)) shares comm's point-to-point state: with
    the handle that made it busy gone, comm's queued sends still move while
    this rank waits on another communicator (before, the registry of busy
    communicators lost comm and both ranks waited until the timeout)."""
    import gc

    def job(comm):
        r, n = comm.rank, 40
        comm2 = comm.Dup()
        if r == 0:
            h = MPI.Comm(comm)
            first = h.irecv(source=1, tag=1)            # queued on the handle: comm is busy through it
            sends = [comm.Isend(np.full(250, i, np.int32), 1, 2) for i in range(n)]   # most queued: 4 KiB ring
            comm2.Send(np.zeros(1), 1, 8)
            first.wait()
            del first, h
            gc.collect()
            comm2.Send(np.zeros(1), 1, 10)
            comm2.Recv(np.zeros(1), 1, 9)              # its progress must push comm's queued sends
            Request.Waitall(sends)
            return True
        comm2.Recv(np.zeros(1), 0, 8)
        comm.send(1, 0, 1)
        comm2.Recv(np.zeros(1), 0, 10)
        got = [np.zeros(250, np.int32) for _ in range(n)]
        for b in got:
            comm.Recv(b, 0, 2)
        comm2.Send(np.zeros(1), 0, 9)
        return all(np.array_equal(b, np.full(250, i)) for i, b in enumerate(got))
    assert run(job, 2, options=dict(SMALL, timeout=20)) == [True, True]


def test_statuses_handed_out_are_the_callers_own():
    """Waitsome/Testsome filling a growing list hand out their own Status:
    changing one (a send's empty status) must not change the empty status
    every later inactive request reports (before, the shared one went out)."""
    def job(comm):
        reqs = [comm.Isend(np.zeros(1), comm.rank, 3), comm.Irecv(np.zeros(1), comm.rank, 3)]
        statuses = []
        done = []
        while len(done) < 2:
            done += Request.Waitsome(reqs, statuses) or []
        for st in statuses:
            st.Set_source(5)
        st = Status()
        MPI.REQUEST_NULL.Wait(st)
        return st.Get_source(), st.Get_tag()
    assert run(job, 1) == [(ANY_SOURCE, ANY_TAG)]


def test_a_request_of_a_freed_communicator_raises_its_error():
    """A receive still pending when its communicator is freed: its Wait
    raises the communicator's MPIError (ERR_COMM), not the C layer's
    RuntimeError."""
    from shmcoll.errors import ERR_COMM

    def job(comm):
        d = comm.Dup()
        req = d.Irecv(np.zeros(2), 1 - comm.rank, 3)     # never sent
        d.Free()
        with pytest.raises(MPIError) as e:
            req.Wait()
        return e.value.Get_error_class() == ERR_COMM
    assert run(job, 2) == [True, True]


@pytest.mark.parametrize("how", ["send", "isend", "iprobe"])
def test_a_signal_handler_calls_point_to_point_while_its_rank_waits(how):
    """Rank 0 waits in Recv for a message that rank 1 sends only once it
    has the message rank 0's SIGALRM handler sends: the handler's call
    runs inside the wait (its signal poll) and must find the GIL held (it
    hung in PyEval_RestoreThread)."""
    def job(comm):
        if comm.rank == 0:
            seen = []

            def handler(*_):
                if how == "iprobe":
                    seen.append(comm.Iprobe(1, 99))
                if how == "isend":
                    comm.Isend(np.full(1, 7.0), 1, 50).Wait()
                else:
                    comm.send("from the handler", 1, 50)
            old = signal.signal(signal.SIGALRM, handler)
            try:
                signal.setitimer(signal.ITIMER_REAL, 0.05)
                b = np.zeros(4)
                comm.Recv(b, 1, 1)
            finally:
                signal.signal(signal.SIGALRM, old)
            return seen, b.tolist()
        got = np.zeros(1)
        if how == "isend":
            comm.Recv(got, 0, 50)
            got = got[0]
        else:
            got = comm.recv(source=0, tag=50)
        comm.Send(np.full(4, 2.0), 0, 1)
        return got
    first, second = run(job, 2, timeout=30)
    assert first == ([False] if how == "iprobe" else [], [2.0] * 4)
    assert second == (7.0 if how == "isend" else "from the handler")


def test_a_signal_handler_calling_the_lowercase_collective_its_rank_is_in_is_refused():
    """A handler's comm.allreduce while its rank waits in comm.allreduce
    waited on its own thread's lock for ever; it is refused with an error
    naming the call, and the outer call goes on (rank 1 joins it once the
    handler has told it so)."""
    def job(comm):
        if comm.rank == 0:
            seen = []

            def handler(*_):
                try:
                    comm.allreduce(5)
                except RuntimeError as e:
                    seen.append(str(e))
                comm.send("go", 1, 50)
            old = signal.signal(signal.SIGALRM, handler)
            try:
                signal.setitimer(signal.ITIMER_REAL, 0.05)
                total = comm.allreduce(1)
            finally:
                signal.signal(signal.SIGALRM, old)
            return total, seen
        comm.recv(source=0, tag=50)
        return comm.allreduce(2), []
    first, second = run(job, 2, timeout=30)
    assert first[0] == second[0] == 3
    assert len(first[1]) == 1 and "already inside allreduce" in first[1][0], first[1]
