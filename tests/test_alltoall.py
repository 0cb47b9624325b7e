"""Alltoall / alltoall: every algorithm, rank count, topology, block size
class and dtype, checked against closed-form data: block d of rank s's
sendbuf is pattern(seq, s, d), so rank d must receive exactly that from s."""
import os
import random

import numpy as np
import pytest

import shmcoll
from conftest import DTYPES, SMALL, attempt, need_cma, counts_for, own_cpus, pattern, planned, poison, run_cases, run_ranks

ALGS = ["bruck", "all_at_once", "pairwise", "tiled", None]
RANKS = [1, 2, 3, 4, 5, 7, 8]
TILE = SMALL["tile_bytes"]
# inline limit 96; one tile -1/0/+1; several tiles; a block larger than the 8 KiB channel
SMALL_SIZES = [0, 1, 7, 96, 97, TILE - 1, TILE, TILE + 1, 5 * TILE + 3, 20 * TILE + 5]
DEFAULT_TILE = 256 << 10      # a quarter of this box's 1 MiB L2 (see device.make_plan)
INLINE = [16, 17, 4095, 4096, 4097]      # a tiny payload in the slot header's line, the built-in inline slot
DEFAULT_SIZES = [0, 96, 97, *INLINE, DEFAULT_TILE - 1, DEFAULT_TILE, DEFAULT_TILE + 1, (1 << 20) + 3]


def alg_id(a):
    return a or "auto"


def blocks(seq, me, n, count, dtype, sending):
    """The (n, count) array rank `me` sends (sending) or must receive."""
    out = np.empty((n, count), dtype)
    for other in range(n):
        out[other] = pattern(count, dtype, seq, me, other) if sending else pattern(count, dtype, seq, other, me)
    return out


def _a2a_job(comm, cases, forms=False):
    n, me, bad = comm.size, comm.rank, []
    for seq, (alg, count, dtype) in enumerate(cases):
        send = blocks(seq, me, n, count, dtype, True)
        keep = send.copy()
        recv = poison(n * count, dtype).reshape(n, count)
        s_arg, r_arg = send, recv
        if forms and seq % 3 == 1:
            s_arg, r_arg = [send, count, dtype], [recv, count, dtype]        # mpi4py: count per block
        elif forms and seq % 3 == 2:
            s_arg, r_arg = [send.view(np.uint8), dtype], memoryview(recv.view(np.uint8).reshape(-1))
        comm.Alltoall(s_arg, r_arg, algorithm=alg)
        want = blocks(seq, me, n, count, dtype, False)
        where = f"rank {me}: call {seq} alg={alg} count={count} dtype={np.dtype(dtype)}"
        if recv.tobytes() != want.tobytes():
            wrong = [s for s in range(n) if recv[s].tobytes() != want[s].tobytes()]
            bad.append(f"{where}: wrong blocks from ranks {wrong}")
        if send.tobytes() != keep.tobytes():
            bad.append(f"{where}: sendbuf was modified")
    return bad


def check(n, cases, **kw):
    run_cases(_a2a_job, n, cases, **kw)


def table(algs, sizes, dtype=np.int8):
    return [(a, c, dtype) for a in algs for c in counts_for(sizes, dtype)]


@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("alg", ALGS, ids=alg_id)
def test_alltoall_algorithm_ranks_sizes(alg, n):
    check(n, table([alg], SMALL_SIZES), options=SMALL)


VIRTUAL = [("2x2", 3), ("2x2", 4), ("2x4", 5), ("2x4", 8), ("4x2", 7), ("4x2", 8),
           ("2x2x2", 4), ("2x4x4", 8), ("4x2x4", 7)]


@pytest.mark.parametrize("topo,n", VIRTUAL, ids=[f"{t}-{n}" for t, n in VIRTUAL])
def test_alltoall_virtual_topologies(topo, n):
    check(n, table(ALGS, SMALL_SIZES), topology=topo, options=SMALL)


@pytest.mark.parametrize("topo,n", [(None, 2), (None, 3), ("2x2x2", 4), ("2x4", 8)])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_alltoall_dtypes(dtype, topo, n):
    check(n, table(ALGS, SMALL_SIZES, dtype), topology=topo, options=SMALL)


@pytest.mark.parametrize("topo,n", [(None, 2), (None, 3), ("2x2x2", 4)])
def test_alltoall_default_options(topo, n):
    """Built-in tile and channel sizes (a 1 MiB block spans tiles and the
    2 MiB channel's halves)."""
    check(n, table(ALGS, DEFAULT_SIZES) + table(ALGS, [800], np.complex128), topology=topo)


@pytest.mark.parametrize("alg", ALGS, ids=alg_id)
def test_alltoall_16mib_blocks(alg):
    check(2, [(alg, 16 << 20, np.int8)])


@pytest.mark.parametrize("topo,n,opts", [(None, 3, SMALL), ("2x2x2", 4, SMALL), (None, 2, None),
                                         ("2x4", 8, SMALL)])
def test_alltoall_back_to_back_mixed(topo, n, opts):
    """Changing block sizes, dtypes and algorithms call after call in one job."""
    rng = random.Random(4321 + n)
    sizes = SMALL_SIZES + [2, 64, 95, 128, 4096, 4097, 9000]
    if opts is None:
        sizes += DEFAULT_SIZES
    cases = []
    for _ in range(300 if n <= 4 else 150):
        dtype = rng.choice(DTYPES)
        cases.append((rng.choice(ALGS), rng.choice(sizes) // np.dtype(dtype).itemsize, dtype))
    check(n, cases, topology=topo, options=opts)


@pytest.mark.parametrize("n", [2, 3])
def test_alltoall_buffer_forms(n):
    check(n, table(ALGS, [0, 8, 96, 800, 6000], np.float64), forms=True, options=SMALL)


def payload(src, dst, seq):
    return {"from": src, "to": dst, "seq": seq,
            "nest": [(src, [dst] * (dst + 1)), {"s": "é" * (src * 50 + dst), "none": None}],
            "blob": bytes([src % 256, dst % 256]) * ((src + 1) * (dst + 1) * 1000 * (seq % 3))}


def _obj_job(comm, rounds):
    n, me = comm.size, comm.rank
    return [comm.alltoall([payload(me, d, seq) for d in range(n)]) for seq in range(rounds)]


@pytest.mark.parametrize("n,opts", [(1, None), (2, None), (3, SMALL), (5, SMALL)])
def test_alltoall_objects(n, opts):
    results = run_ranks(_obj_job, n, 4, options=opts)
    for me, rounds in enumerate(results):
        for seq, got in enumerate(rounds):
            assert got == [payload(s, me, seq) for s in range(n)], f"rank {me} round {seq}"


def test_alltoall_object_list_of_wrong_length():
    def job(comm):
        try:
            comm.alltoall([0] * (comm.size + (comm.rank == 1)))
        except Exception as e:
            return type(e).__name__, str(e), getattr(e, "rank", None)
    got = run_ranks(job, 3)
    assert got[1][0] == "ValueError" and "one object per rank" in got[1][1], got
    for r in (0, 2):
        assert got[r] is not None and got[r][0] in ("PeerAborted", "PeerDied") and got[r][2] == 1, got


# -- bad input on one rank -------------------------------------------------------

def _one_bad(comm, bad_rank, kind):
    n, count = comm.size, 40
    send = blocks(0, comm.rank, n, count, np.int32, True)
    recv = poison(n * count, np.int32)
    s, r, alg = send, recv, None
    if comm.rank == bad_rank:
        if kind == "size":
            r = poison(n * count + 1, np.int32)
        elif kind == "split":
            s, r = np.zeros(n * count * 4 + 1, np.uint8), np.zeros(n * count * 4 + 1, np.uint8)
        elif kind == "overlap":
            both = np.zeros(n * count + 5, np.int32)
            s, r = both[:n * count], both[5:]
        elif kind == "readonly":
            r = recv.copy()
            r.setflags(write=False)
        elif kind == "noncontig":
            r = np.repeat(recv, 2)[::2]
        elif kind == "nonbuffer":
            s = 12345
        elif kind == "dtype":
            r = [recv, "no-such-type"]
        elif kind == "spec":
            s = [send]
        elif kind == "algorithm":
            alg = "no-such-alg"
    return attempt(comm, "Alltoall", lambda: comm.Alltoall(s, r, algorithm=alg))


LOCAL = {
    "size": ("ValueError", ["sendbuf", "recvbuf"]),
    "split": ("ValueError", ["sendbuf", "blocks"]),
    "overlap": ("ValueError", ["overlap"]),
    "readonly": ("BufferError", ["recvbuf", "read-only"]),
    "noncontig": ("ValueError", ["recvbuf", "contiguous"]),
    "nonbuffer": ("TypeError", ["sendbuf", "int"]),
    "dtype": ("KeyError", ["recvbuf", "no-such-type"]),     # an unknown typecode, as mpi4py
    "spec": ("ValueError", ["sendbuf", "2 to 4 items"]),
    "algorithm": ("ValueError", ["no-such-alg", "alltoall"]),
}


@pytest.mark.parametrize("n,bad_rank", [(2, 0), (3, 1), (5, 4)])
@pytest.mark.parametrize("kind", list(LOCAL))
def test_alltoall_bad_argument_on_one_rank(kind, n, bad_rank):
    got = run_ranks(_one_bad, n, bad_rank, kind)
    etype, words = LOCAL[kind]
    assert got[bad_rank] is not None and got[bad_rank][:2] == ("Alltoall", etype), got
    for w in words:
        assert w in got[bad_rank][2], got[bad_rank]
    for r in range(n):
        if r != bad_rank:
            assert got[r] is not None, f"rank {r} raised nothing: {got}"
            phase, name, msg, who = got[r]
            # everybody exchanges with the bad rank: the Alltoall itself must fail
            assert (phase, name, who) in {("Alltoall", "PeerAborted", bad_rank),
                                          ("Alltoall", "PeerDied", bad_rank)}, f"rank {r}: {got[r]}"


@pytest.mark.parametrize("alg", ALGS, ids=alg_id)
@pytest.mark.parametrize("n,bad_rank", [(2, 1), (3, 0), (4, 2)])
def test_alltoall_block_size_differs_on_one_rank(alg, n, bad_rank):
    """Each rank's buffers are consistent, but one rank's block is larger:
    the ranks that notice raise ValueError naming the byte count, the rest
    PeerFailure; nobody hangs and nobody returns normally."""
    def job(comm):
        count = 40 + 3 * (comm.rank == bad_rank)
        send = blocks(0, comm.rank, n, count, np.int32, True)
        recv = np.empty_like(send)
        try:
            comm.Alltoall(send, recv, algorithm=alg)
        except Exception as e:
            return type(e).__name__, str(e)
        return None
    got = run_ranks(job, n, options=SMALL)
    assert all(g is not None for g in got), got
    assert any(g[0] == "MismatchError" for g in got), got
    for g in got:
        assert g[0] in ("MismatchError", "PeerAborted", "PeerDied"), g
        if g[0] == "MismatchError":
            assert "byte count" in g[1], g


@pytest.mark.parametrize("n", [2, 3])
def test_alltoall_block_size_differs_with_check(n):
    def job(comm):
        count = 40 + (comm.rank == n - 1)
        send = blocks(0, comm.rank, n, count, np.int32, True)
        try:
            comm.Alltoall(send, np.empty_like(send))
        except Exception as e:
            return type(e).__name__, str(e)
        return None
    for r, g in enumerate(run_ranks(job, n, options={"check": 1})):
        assert g is not None and g[0] == "MismatchError" and "byte count" in g[1], f"rank {r}: {g}"


def test_alltoall_selected_is_an_algorithm():
    def job(comm):
        return [comm.selected("alltoall", b) for b in (0, 8, 256, 257, 32768, 32769, 1 << 20)]
    for topo, n in [(None, 2), ("2x2", 4), ("2x4", 8)]:
        for names in run_ranks(job, n, topology=topo):
            assert all(a in shmcoll.algorithms("alltoall") for a in names), names


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_alltoall_rendezvous(n):
    """Blocks from cma_bytes up go by rendezvous (process_vm_readv straight
    from the peer's sendbuf) when the ranks agreed they may; force it down
    to one byte so every size runs it, and compare with the staged path."""
    need_cma(n)
    check(n, table(["pairwise"], SMALL_SIZES + [1 << 16]), options=dict(SMALL, cma_bytes=1))
    check(n, table(["pairwise"], [1 << 16]), options=dict(SMALL, cma_bytes=0))


def test_single_copy_counts_every_block_when_each_rank_has_a_cpu():
    """With a CPU per rank, blocks from DIRECT_BLOCK (8 KiB) go pairwise by
    single copy at more than 2 ranks; below, all_at_once stages them.  A
    cma_bytes the user set holds: a rank's p - 1 blocks count together
    against it.  Ranks taking turns on CPUs stage up to 1 MiB blocks."""
    import dataclasses
    from shmcoll.coll import alltoall

    def plan(nbytes, cpus, n=16, cma=None):
        call = planned(n, cpus, nbytes)
        if cma is not None:
            call = dataclasses.replace(call, params=dict(call.params, cma_bytes=cma, cma_opt=cma))
        return alltoall.choose(call), {m.via for st in alltoall.pairwise(call) for m in st.moves}

    assert alltoall.DIRECT_BLOCK == 8 << 10
    for n in (3, 4, 16):
        assert plan(8 << 10, n, n) == plan(32 << 10, n, n) == ("pairwise", {"direct"}), n
        assert plan((8 << 10) - 1, n, n) == ("all_at_once", {"auto"}), n
    assert plan(32 << 10, 2, 16) == ("all_at_once", {"auto"})
    assert plan(128 << 10, 2, 16)[1] == {"auto"} and plan(1 << 20, 2) == ("pairwise", {"direct"})
    assert plan(8 << 10, 2, 2) == ("pairwise", {"auto"})
    least = -(-(1 << 20) // 15)
    assert plan(least, 16, cma=1 << 20) == ("pairwise", {"direct"})
    assert plan(least - 1, 16, cma=1 << 20)[1] == {"auto"}
    assert plan(4400, 16, cma=1 << 16)[0] == plan(8, 4, 4, cma=1)[0] == "all_at_once"


def test_blocks_from_8_kib_run_by_single_copy_when_each_rank_has_a_cpu(monkeypatch):
    """The automatic choice on ranks that each have a CPU, end to end: this
    host's CPUs are too few, so the placement names CPUs it does not have
    and bind='none' leaves the ranks unpinned.  8 KiB and 32 KiB blocks run
    pairwise by single copy (32 KiB as twins), 8191 B all_at_once."""
    need_cma(3)
    own_cpus(monkeypatch)
    sizes = [(8 << 10) - 1, 8 << 10, 32 << 10]

    def job(comm):
        p, r, got = comm.size, comm.rank, []
        for b in sizes:
            for call in range(2):
                send = np.concatenate([pattern(b, np.uint8, call, r, d) for d in range(p)])
                recv = np.zeros_like(send)
                comm.Alltoall(send, recv)
                want = np.concatenate([pattern(b, np.uint8, call, s, r) for s in range(p)])
                got.append((b, comm.selected("alltoall", b), bool(np.array_equal(recv, want))))
        return got

    for n in (3, 4):
        for got in run_ranks(job, n, bind="none"):
            assert all(ok for _, _, ok in got), got
            assert {b: a for b, a, _ in got} == {sizes[0]: "all_at_once", sizes[1]: "pairwise", sizes[2]: "pairwise"}


def test_tile_larger_than_channel_is_clamped():
    """A tile larger than half the channel would leave a ring of no slots;
    it is clamped, and the exchange completes correctly."""
    check(2, table(["tiled", "pairwise"], [300001]), options={"chan_bytes": 8192, "tile_bytes": 1 << 20, "cma_bytes": 0})


S2N4 = os.path.join(os.path.dirname(__file__), "fixtures", "sys-2s4n")    # 8 cores x 2 threads, L2 2 MiB a core


@pytest.mark.parametrize("n,bind,edge", [(4, "core", 512 << 10),     # 4 cores: 2 x 8 MiB = 2 * 4^2 * 512 KiB
                                         (16, "core", 64 << 10),     # two threads a core: 8 L2s, 2 x 16 MiB
                                         (3, "socket", -(-(12 << 20) // 18))])   # 3 of its 4 cores: 2 x 6 MiB
def test_copies_stream_once_the_footprint_outgrows_the_cores_l2(n, bind, edge):
    """Left to the default, Alltoall streams its copies into recvbuf (and
    its single copies, word 0's SC_OP_STREAMED) from a footprint of twice
    the L2s of the cores its ranks run on (SMT siblings share one), not
    below; a user's nt_bytes alone decides when given (0, as everywhere,
    is the default).  The fixture's 60 MiB L3 (nt_bytes) is never reached."""
    from shmcoll._core import lib
    from shmcoll.coll import select
    from shmcoll.compile import compile_schedule
    from shmcoll.device import make_plan
    from shmcoll.sched import Call
    from shmcoll.topology import read_sysfs
    t = read_sysfs(S2N4)
    slots = t.placement(n, bind, "compact")

    def plan(b, cma, options=None):
        params = make_plan(n, t, slots, options).params
        call = Call(n, b, 0, params, slots, len(t.nodes), cma)
        return select.plan("alltoall", select.pick("alltoall", call), call), params
    for b, want in ((edge - 1, False), (edge, True)):
        for cma in (False, True):
            s, params = plan(b, cma)
            assert s.stream is want, (b, cma, s.algorithm)
            ins = compile_schedule(s, params, (0, 0))[0][8:].reshape(-1, 8)
            ops = [int(w) for w in ins[:, 0]]
            single = [o for o in ops if o & 0xff in (lib.SC_OP_CMA, lib.SC_OP_SHARE)]
            assert all(bool(o & lib.SC_OP_STREAMED) is want for o in single), ops
            assert bool((ins[(ins[:, 0] & 0xff) == lib.SC_OP_COPY][:, 6] & 1).any()) is want
        assert plan(b, True, {"nt_bytes": 0})[0].stream is want
        assert plan(b, True, {"nt_bytes": 1 << 40})[0].stream is False
        assert plan(b, True, {"nt_bytes": 1})[0].stream is True
