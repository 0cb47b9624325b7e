"""Shared single copies (via "shared", csrc/exec.c SC_OP_SHARE): between
two ranks, a block of the writer's sendbuf goes to the reader's recvbuf
piece by piece, each end claiming the next free piece (the reader reads
it, the writer writes it).  What lands must be whole whoever copies which
piece, however late either end comes, across call numbers that wrap the
claim word's tag, and a rank that dies mid-copy must not hang the other."""
import numpy as np
import pytest

import shmcoll
from shmcoll import compile as _compile
from shmcoll._core import lib
from shmcoll.sched import Move, Schedule, Step
from shmcoll.coll.bcast import SHARED_MIN
from conftest import assert_killed_mid, need_cma, pattern, run_ranks

pytestmark = pytest.mark.timeout(180)

PIECE = 4096
#: single copy from 4 KiB, no twin timing (the shared program runs every call)
OPTS = {"cma_bytes": PIECE, "adapt": 0}
#: one piece, one byte either side of a piece, several, and past 63 pieces
#: (the claim word's count: pieces grow to fit)
SIZES = [PIECE, PIECE + 1, 3 * PIECE - 1, 7 * PIECE + 5, 100 * PIECE + 3]


@pytest.mark.parametrize("op,alg", [("alltoall", "pairwise"), ("scatter", "flat"), ("bcast", "original"),
                                    ("gather", "flat")])
def test_two_ranks_share_their_single_copies(op, alg):
    sched = shmcoll.schedule(op, alg, 2, 1 << 20, cma=True)
    assert {m.via for st in sched.steps for m in st.moves} == {"shared"}
    three = {m.via for st in shmcoll.schedule(op, alg, 3, 1 << 20, cma=True).steps for m in st.moves}
    assert ("shared" in three) == (op == "bcast")       # a Bcast root shares every reader's copy (below)
    assert "shared" not in {m.via for st in shmcoll.schedule(op, alg, 2, 1 << 20).steps for m in st.moves}


def test_a_pair_copies_its_own_blocks_before_it_shares():
    """Alltoall between two ranks: each rank's own block first (it needs
    no one), then its part of the two shared copies, then one ack."""
    sched = shmcoll.schedule("alltoall", "pairwise", 2, 1 << 20, cma=True)
    progs = _compile.compile_schedule(sched, _params(), (3, 1 << 20))
    for p in progs:
        ops = [int(p[8 + 8 * i]) & 0xff for i in range(int(p[0]))]
        assert ops[0] == _compile.COPY
        assert ops.count(_compile.SHARE) == 2 and ops.index(_compile.ACK) > max(
            i for i, o in enumerate(ops) if o == _compile.SHARE)


def _params():
    from shmcoll.device import make_plan
    from shmcoll.topology import topology
    topo = topology(None)
    return make_plan(2, topo, topo.placement(2, "core", "compact"), OPTS).params


def test_shared_moves_are_tagged_with_their_step():
    """Their claim word holds 4 bits of the step: a shared move past the
    16th step is refused, and so are two of one pair in a step (one word)."""
    moves = [Move(0, (1,), ((0, 0, 64),), via="shared")]
    sched = Schedule("alltoall", "t", 2, 64, 0, [Step() for _ in range(15)] + [Step(moves)])
    _compile.compile_schedule(sched, _params(), (3, 64))
    sched.steps.insert(0, Step())
    with pytest.raises(ValueError, match="first 16 steps"):
        _compile.compile_schedule(sched, _params(), (3, 64))
    two = [Step(moves + [Move(0, (1,), ((64, 64, 64),), via="shared")])]
    with pytest.raises(ValueError, match="one shared move per writer and reader"):
        _compile.compile_schedule(Schedule("alltoall", "t", 2, 128, 0, two), _params(), (3, 128))


def test_a_shared_move_keeps_the_writers_later_waits():
    """A writer waits before it leaves for the last ack of each reader of
    its sendbuf: a shared move's ack never lowers that wait below a
    direct move's later chunks'."""
    sched = shmcoll.schedule("allreduce", "all_at_once", 2, 1 << 20, cma=True, dtype="float64",
                             options={"chunk_bytes": 65536})
    assert {m.via for m in sched.steps[0].moves} == {"direct"}
    sched.steps[0].moves.append(Move(0, (1,), ((0, 0, 4096),), via="shared"))
    progs = _compile.compile_schedule(sched, _params(), (10, 1 << 20))
    acks = [int(progs[1][8 + 8 * i + 1]) for i in range(int(progs[1][0])) if progs[1][8 + 8 * i] == _compile.ACK]
    waits = [int(progs[0][8 + 8 * i + 2]) for i in range(int(progs[0][0])) if progs[0][8 + 8 * i] == _compile.WAITACK]
    assert max(waits) == max(acks) > 1, (waits, acks)


def _claim_word(comm, reader, writer):
    """The word reader and writer claim pieces on (csrc/sc_internal.h, claim_word)."""
    from shmcoll._core import ffi
    c = comm._c
    row = -(-c.size * 8 // lib.SC_LINE) * lib.SC_LINE
    return ffi.cast("uint64_t *", c.base + c.off_claim + reader * row + writer * 8)


def _aged(comm, age):
    """The reader's claim word as the last shared copy `age` calls ago
    left it (8 pieces claimed, step 0), then a 1 MiB Bcast from rank 0."""
    c = comm._c
    buf = np.full(1 << 20, 7, np.uint8) if comm.rank == 0 else np.zeros(1 << 20, np.uint8)
    comm.Barrier()
    if comm.rank == 1:
        word = _claim_word(comm, 1, 0)
        then = (c.call + 2 - age) & ((1 << 64) - 1)       # the Bcast is this rank's second call from here
        word[0] = ((then << 4) & ((1 << 52) - 1)) << 12 | 4 << 6 | 4
    comm.Barrier()
    comm.Bcast(buf, root=0)
    return int((buf == 7).sum())


@pytest.mark.parametrize("age", [1, 15, (1 << 39) + 1, (1 << 40) + 1, (1 << 47) + 5])
def test_a_claim_word_left_long_ago_is_stale(age):
    """A word last claimed in another call counts none of this call's
    pieces, however long ago: it once read as a later step's once 2^39
    calls old, and the copy was skipped."""
    need_cma(2)
    assert run_ranks(_aged, 2, age, options=OPTS) == [1 << 20] * 2


def _late(comm, who, k):
    """Rank who comes late to call k (a few ms of work first), the other
    rank on the next call: each end in turn finds every piece free and
    copies them all, or finds them taken."""
    if comm.rank == (who + k) % 2 and k % 3:
        np.sort(np.random.default_rng(k).random(20000 * (k % 3)))


def _job(comm, op, nbytes, base, late):
    _compile.SHARE_PIECE = PIECE                      # many pieces: both ends claim some
    me, n, bad = comm.rank, comm.size, []
    for k in range(6):
        if late:
            _late(comm, k % 2, k)
        if op == "alltoall":
            send = np.stack([pattern(nbytes, np.uint8, me, j, k) for j in range(n)])
            recv = np.zeros_like(send)
            comm.Alltoall(send, recv)
            want = np.stack([pattern(nbytes, np.uint8, j, me, k) for j in range(n)])
        elif op in ("allgather", "allgatherv"):
            send, recv = pattern(nbytes, np.uint8, me, k), np.zeros((n, nbytes), np.uint8)
            comm.Allgather(send, recv) if op == "allgather" else comm.Allgatherv(send, [recv, [nbytes] * n])
            want = np.stack([pattern(nbytes, np.uint8, j, k) for j in range(n)])
        elif op == "scatter":
            root = k % 2
            send = np.stack([pattern(nbytes, np.uint8, j, k) for j in range(n)]) if me == root else None
            recv = np.zeros(nbytes, np.uint8)
            comm.Scatter(send, recv, root=root)
            want = pattern(nbytes, np.uint8, me, k)
        elif op == "gather":
            root = k % 2
            send, recv = pattern(nbytes, np.uint8, me, k), np.zeros((n, nbytes), np.uint8)
            comm.Gather(send, recv if me == root else None, root=root)
            want = np.stack([pattern(nbytes, np.uint8, j, k) for j in range(n)]) if me == root else recv
        else:
            root = k % 2
            recv = pattern(nbytes, np.uint8, k) if me == root else np.zeros(nbytes, np.uint8)
            comm.Bcast(recv, root=root)
            want = pattern(nbytes, np.uint8, k)
        if not np.array_equal(recv, want):
            bad.append(f"{op} {nbytes} call {k} rank {me}: {np.flatnonzero(recv != want)[:5]}")
    if base is not None:
        bad += [] if comm.traffic()[1 - me] > 0 else [f"rank {me} recorded no traffic"]
    return bad


@pytest.mark.parametrize("nbytes", SIZES)
@pytest.mark.parametrize("op", ["alltoall", "allgather", "allgatherv", "scatter", "gather", "bcast"])
def test_what_lands_is_whole_whoever_copies_it(op, nbytes):
    need_cma(2)
    out = run_ranks(_job, 2, op, nbytes, None, True, options=OPTS)
    assert out == [[], []], out


@pytest.mark.parametrize("nbytes", [SHARED_MIN, SHARED_MIN + 4 * PIECE + 5])
@pytest.mark.parametrize("n", [3, 4, 5])
def test_a_bcast_root_shares_every_readers_copy(n, nbytes):
    """From 3 ranks too, the root takes part in each reader's single copy,
    one reader after another (it staged every byte through its ring, which
    every reader copied out again: 4 ranks on 2 CPUs, 16 MiB, 1.5x the
    time): what lands is whole whoever copies which piece, with ranks
    late, roots 0 and 1, and ranks outnumbering the CPUs."""
    need_cma(n)
    moves = [(m.src, m.dst, m.via) for st in shmcoll.schedule("bcast", "original", n, 1 << 20, cma=True, root=1).steps
             for m in st.moves]
    assert moves == [(1, ((1 + i) % n,), "shared") for i in range(1, n)]
    below = shmcoll.schedule("bcast", "original", n, SHARED_MIN - 1, cma=True, options=OPTS)    # its ring wins there
    assert "shared" not in {m.via for st in below.steps for m in st.moves}
    out = run_ranks(_job, n, "bcast", nbytes, None, True, options=OPTS)
    assert out == [[]] * n, out


@pytest.mark.parametrize("base", [(1 << 48) - 3, (1 << 64) - 4])
@pytest.mark.parametrize("op", ["alltoall", "bcast"])
def test_claims_hold_across_the_tag_wrapping(op, base):
    """The claim word's tag keeps 48 bits of the call number: calls
    crossing 2^48 (and 2^64) still see their own claims, never an
    earlier call's as a later one's."""
    need_cma(2)
    out = run_ranks(_job, 2, op, 7 * PIECE + 5, base, False, options=dict(OPTS, call_base=base, record_traffic=1))
    assert out == [[], []], out


@pytest.mark.parametrize("op,n", [("Alltoall", 2), ("Bcast", 2), ("Bcast", 3)])
def test_a_rank_killed_mid_share_fails_the_other(op, n, monkeypatch):
    need_cma(n)
    monkeypatch.setenv("SHMCOLL_CMA_BYTES", str(PIECE))

    def call(comm):
        _compile.SHARE_PIECE = PIECE
        b = 8 << 20
        if op == "Alltoall":
            comm.Alltoall(np.ones(2 * b, np.uint8), np.zeros(2 * b, np.uint8))
        else:
            comm.Bcast(np.ones(b, np.uint8), root=0)
    assert_killed_mid(call, n=n)


def _claims(comm, calls):
    """Pieces of the root's Bcast this (reading) rank and the root claimed
    over calls: the claim word's two counts after each call."""
    _compile.SHARE_PIECE = PIECE
    word = _claim_word(comm, comm.rank, 0)
    got, buf = [0, 0], np.zeros(7 * PIECE + 5, np.uint8)
    for _ in range(calls):
        comm.Bcast(buf, root=0)
        v = int(word[0])
        got[0], got[1] = got[0] + (v & 0x3f), got[1] + (v >> 6 & 0x3f)     # csrc/sc_internal.h, claim_word
    return got


def test_both_ends_take_pieces():
    """The reader reads pieces from the front and the root writes them
    from the back: over 20 calls of 8 pieces, both copied some."""
    need_cma(2)
    _, (reader, root) = run_ranks(_claims, 2, 20, options=OPTS)
    assert reader > 0 and root > 0 and reader + root == 20 * 8, (reader, root)
