"""Reductions (Allreduce, Reduce, Reduce_scatter_block, Reduce_scatter,
Scan, Exscan and the object forms) against numpy folding the same inputs
in rank order, x0 op x1 op ... op x(p-1): every algorithm, 1-8 and 16
ranks, sizes around the inline slot and a fold chunk, every meaningful
(op, dtype) pair, IN_PLACE, every root; bit-identical results across
ranks, algorithms and placements; bad input raising on every rank."""
import hashlib

import numpy as np
import pytest

import shmcoll
from conftest import SMALL, assert_killed_mid, need_cma, planned, run_cases, run_ranks
from shmcoll import ops
from shmcoll.coll import select
from shmcoll.topology import topology as machine

try:
    import ml_dtypes
except ImportError:     # the test extra installs it; without it bfloat16 cases are skipped
    ml_dtypes = None

KINDS = {"allreduce": ["all_at_once", "reduce_scatter_allgather", "numa", None], "reduce": ["flat", "reduce_scatter_gather", "numa", None],
         "reduce_scatter_block": [None], "reduce_scatter": [None], "scan": [None], "exscan": [None]}
CHUNK = SMALL["chunk_bytes"]
ITEMS = [0, 1, 7, 31, 32, 33, CHUNK // 4 - 1, CHUNK // 4, CHUNK // 4 + 1, 3001]     # float32: around 128 B and a chunk
INT = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOAT = ["float16", "float32", "float64", "longdouble"] + (["bfloat16"] if ml_dtypes else [])
COMPLEX = ["complex64", "complex128", "clongdouble"]
NP = {"SUM": np.add, "PROD": np.multiply, "MIN": np.minimum, "MAX": np.maximum, "LAND": np.logical_and,
      "LOR": np.logical_or, "LXOR": np.logical_xor, "BAND": np.bitwise_and, "BOR": np.bitwise_or,
      "BXOR": np.bitwise_xor}


def dtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def pairs():
    """Every (op, dtype) that makes sense."""
    out = [(op, t) for t in INT for op in NP]
    out += [(op, t) for t in FLOAT for op in ("SUM", "PROD", "MIN", "MAX")]
    out += [(op, t) for t in COMPLEX for op in ("SUM", "PROD")]
    out += [(op, "bool") for op in ("LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR", "MIN", "MAX")]
    return out


def data(seq, rank, count, dt, op="SUM"):
    """Rank's input of call seq: random, small where products would
    overflow; float32 SUM inputs are far from exact, so order shows."""
    rng = np.random.default_rng([seq, rank])
    if dt.kind == "b":
        return rng.integers(0, 2, count).astype(dt)
    if op == "PROD":
        v = rng.choice([1, 1, 1, 2, -1] if dt.kind != "u" else [1, 1, 2, 3], count)
    elif dt.kind in "iu":
        v = rng.integers(0 if dt.kind == "u" else -100, 100, count)
    else:
        v = rng.standard_normal(count) * 100
    if dt.kind == "c":
        v = v + 1j * (rng.standard_normal(count) if op != "PROD" else rng.choice([0, 1, -1], count))
    return np.asarray(v).astype(dt)


def fold(xs, op, dt):
    """numpy's rank-order fold; half types in float32, rounded once."""
    half = dt.itemsize == 2 and dt.kind == "f" or (ml_dtypes and dt == dtype("bfloat16"))
    acc = xs[0].astype(np.float32) if half else xs[0].copy()
    for x in xs[1:]:
        acc = NP[op](acc, x.astype(np.float32) if half else x).astype(np.float32 if half else dt)
    return acc.astype(dt)


def expected(kind, op, dt, seq, p, r, count, root):
    """What rank r's recvbuf holds after call seq, or None: untouched."""
    xs = [data(seq, q, count, dt, op) for q in range(p)]
    if kind == "scan":
        return fold(xs[:r + 1], op, dt)
    if kind == "exscan":
        return fold(xs[:r], op, dt) if r else None
    full = fold(xs, op, dt)
    if kind == "reduce":
        return full if r == root else None
    if kind == "reduce_scatter_block":
        b = count // p
        return full[r * b:(r + 1) * b]
    if kind == "reduce_scatter":
        lo, hi = sum(_counts(count, p)[:r]), sum(_counts(count, p)[:r + 1])
        return full[lo:hi]
    return full


def _counts(count, p):
    """Uneven recvcounts for Reduce_scatter: rank r gets (r + 1) parts."""
    w = [q + 1 for q in range(p)]
    c = [count * x // sum(w) for x in w]
    c[-1] += count - sum(c)
    return c


def call(comm, kind, op, send, recv, root, alg, inplace):
    o = ops.BUILTINS[op] if isinstance(op, str) else op
    s = shmcoll.IN_PLACE if inplace else send
    if inplace:
        recv[:send.size] = send
    if kind == "allreduce":
        comm.Allreduce(s, recv, o, algorithm=alg)
    elif kind == "reduce":
        comm.Reduce(s if comm.rank == root else send, recv, o, root, algorithm=alg)
    elif kind == "reduce_scatter_block":
        comm.Reduce_scatter_block(s, recv, o, algorithm=alg)
    elif kind == "reduce_scatter":
        comm.Reduce_scatter(s, recv, _counts(send.size, comm.size), o, algorithm=alg)
    elif kind == "scan":
        comm.Scan(s, recv, o, algorithm=alg)
    else:
        comm.Exscan(s, recv, o, algorithm=alg)


def _job(comm, cases, forms=False):
    """cases: (kind, alg, op, dtype name, count, root, in place); every
    rank checks its recvbuf and returns its failures, then the hash of
    every result (for the determinism tests)."""
    p, me, bad, hashes = comm.size, comm.rank, [], []
    for seq, (kind, alg, op, tname, count, root, inplace) in enumerate(cases):
        dt = dtype(tname)
        if kind == "reduce_scatter_block":
            count -= count % p
        send = data(seq, me, count, dt, op)
        keep = send.tobytes()
        inplace = inplace and not (kind == "reduce" and me != root)
        rcount = count if kind not in ("reduce_scatter_block", "reduce_scatter") or inplace else \
            (count // p if kind == "reduce_scatter_block" else _counts(count, p)[me])
        recv = np.zeros(rcount, dt)
        recv.view(np.uint8)[:] = 0xA5
        before = recv.tobytes()
        call(comm, kind, op, send, recv, root % p, alg, inplace)
        want = expected(kind, op, dt, seq, p, me, count, root % p)
        got = recv[:0 if want is None else want.size]
        what = f"rank {me}: call {seq} {kind}/{alg} {op} {tname} x{count} root {root % p} inplace={inplace}"
        if want is None:
            if not inplace and recv.tobytes() != before:
                bad.append(f"{what}: recvbuf written where nothing is due")
        elif not same(got, want):
            wrong = np.flatnonzero(got.view(np.uint8) != want.view(np.uint8))
            bad.append(f"{what}: {wrong.size} bytes differ from the rank-order fold, first at byte {wrong[0]}")
        if send.tobytes() != keep:
            bad.append(f"{what}: sendbuf was modified")
        hashes.append(hashlib.sha1(got.tobytes()).hexdigest())
    return bad if not forms else (bad, hashes)


def same(got, want):
    """Bit-identical; long double only by value (its padding bytes are
    undefined)."""
    if want.dtype in (np.dtype(np.longdouble), np.dtype(np.clongdouble)):
        return bool(np.array_equal(got, want))
    return got.tobytes() == want.tobytes()


def table(kinds, sizes, tnames=("float32",), ops_=("SUM",), inplace=(False, True), roots=(0,)):
    out = []
    for kind in kinds:
        for alg in KINDS[kind]:
            for t in tnames:
                for op in ops_:
                    for i, count in enumerate(sizes):
                        out.append((kind, alg, op, t, count, roots[i % len(roots)], inplace[i % len(inplace)]))
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 16])
def test_reductions_ranks_sizes(n):
    """Every reduction and algorithm, float32 SUM (inexact: the order of
    the arithmetic shows), sizes around the slot and the chunk, in place
    and not, roots rotating."""
    run_cases(_job, n, table(KINDS, ITEMS, roots=(0, n - 1, n // 2)), options=SMALL, timeout=300)


@pytest.mark.parametrize("n", [3, 4])
def test_every_op_and_dtype(n):
    cases = []
    for op, t in pairs():
        for kind in ("allreduce", "reduce", "reduce_scatter_block", "scan", "exscan"):
            algs = KINDS[kind]
            for i, count in enumerate([1, 129]):
                cases.append((kind, algs[i % len(algs)], op, t, count * n if kind == "reduce_scatter_block" else count,
                              i, bool(i)))
    run_cases(_job, n, cases, options=SMALL, timeout=300)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_default_inline_slots(n):
    """Built-in options: inputs around a tiny slot payload (16 B) and the
    built-in inline slot (4 KiB), folded where they land."""
    run_cases(_job, n, table(KINDS, [3, 4, 5, 1023, 1024, 1025], roots=(0, n - 1)), timeout=300)


TIGHT = {"chunk_bytes": 1024, "reduce_block_bytes": 8192}     # ring chunks under the inline slot's 4 KiB


@pytest.mark.parametrize("n", [5, 10])
def test_folds_with_writers_out_of_inline_slots(n):
    """Review of c5beaf2: where a writer's inline slots ran out midway
    through a call and chunk_bytes was under inline_bytes, one fold took
    some inputs inline (whole) and some staged (in ring chunks), and every
    rank raised AssertionError (5 ranks: a 16000 B Allreduce by
    reduce_scatter_allgather; 10 ranks: Reduce_scatter_block of 2000 B
    blocks).  A fold's inputs now travel all inline or none."""
    run_cases(_job, n, table(KINDS, [4000, 500 * n]), options=TIGHT, timeout=300)


def test_every_reduction_compiles_with_writers_out_of_inline_slots():
    """The same, planned and compiled without running, for every reduction
    and algorithm at 3 to 16 ranks (14 of 120 raised before)."""
    from shmcoll.compile import compile_schedule
    from shmcoll.device import make_plan
    from shmcoll.topology import topology
    topo = topology(None)
    for op in sorted(select.REDUCTIONS):
        for alg in select.algorithms(op):
            for p in (3, 5, 10, 16):
                params = make_plan(p, topo, topo.placement(p, "core", "compact"), TIGHT).params
                for nbytes in (1040 * p, 16000, 4096 * p):
                    s = shmcoll.schedule(op, alg, p, nbytes, options=TIGHT, dtype="float64")
                    assert len(compile_schedule(s, params, (0, 0))) == p


@pytest.mark.parametrize("n", [2, 3])
def test_16_mib_default_options(n):
    """16 MiB with the built-in channel and chunk sizes."""
    count = (16 << 20) // 4
    run_cases(_job, n, table(["allreduce", "reduce", "reduce_scatter_block"], [count], inplace=(False,)), timeout=300)


STREAM_PAIRS = [("SUM", "float64"), ("SUM", "float32"), ("BXOR", "int8"), ("PROD", "complex128"),
                ("MAX", "longdouble"), ("SUM", "clongdouble"), ("SUM", "float16")] + \
    ([("MAX", "bfloat16")] if ml_dtypes else [])


GUARD = 0x5A


def _streamed(comm, cases, forms=False):
    """cases: (kind, alg, op, dtype name, count, recvbuf's byte offset from
    a cache line, in place); recvbufs lie between guard bytes.  Failures
    as _job's."""
    p, me, bad = comm.size, comm.rank, []
    for seq, (kind, alg, op, tname, count, off, inplace) in enumerate(cases):
        dt = dtype(tname)
        count -= count % p if kind == "reduce_scatter_block" else 0
        send = data(seq, me, count, dt, op)
        keep = send.tobytes()
        inplace = inplace and not (kind == "reduce" and me != 0)
        rcount = count // p if kind == "reduce_scatter_block" and not inplace else count
        raw = np.full(rcount * dt.itemsize + 192, GUARD, np.uint8)
        at = -raw.ctypes.data % 64 + 64 + off
        recv = raw[at:at + rcount * dt.itemsize].view(dt)
        call(comm, kind, op, send, recv, 0, alg, inplace)
        want = expected(kind, op, dt, seq, p, me, count, 0)
        what = f"rank {me}: {kind}/{alg} {op} {tname} x{count} at line + {off} inplace={inplace}"
        if want is not None and not same(recv[:want.size], want):
            bad.append(f"{what}: differs from the rank-order fold")
        if (raw[:at] != GUARD).any() or (raw[at + recv.nbytes:] != GUARD).any():
            bad.append(f"{what}: wrote outside recvbuf")
        if send.tobytes() != keep:
            bad.append(f"{what}: sendbuf was modified")
    return bad


STREAMED = {"nt_bytes": 1}     # every call streams
STREAM_KINDS = ("allreduce", "reduce", "reduce_scatter_block", "scan", "exscan")


@pytest.mark.parametrize("cma", [0, 1])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_streamed_folds(n, cma):
    """Folds whose results stream past the cache (SAME at 2 ranks, the
    last INTO at more, the narrowing of half types) give the rank-order
    fold's bits, write nothing outside recvbuf, at any alignment: 1 to 3
    tiles (4 KiB) and one element either side, recvbufs on a line, on an
    element, on neither.  With single copy, Allreduce's
    reduce_scatter_allgather streams too (its ranks no longer stage their
    folded slices themselves)."""
    if cma:
        need_cma(n)
    cases = [(kind, alg, op, t, count, off, bool(i % 2)) for kind in STREAM_KINDS for alg in KINDS[kind]
             for op, t in STREAM_PAIRS for i, (off, count) in
             enumerate((off, c) for off in (0, 8, 48, 1) for c in (1, 511, 513, 1537, 12289))]
    run_cases(_streamed, n, cases, options=dict(STREAMED, cma_bytes=cma), timeout=300)


def _padding(comm):
    """The padding bytes of streamed long double results, recvbuf zeroed."""
    out = []
    for t in (np.longdouble, np.clongdouble):
        send = (np.arange(4096) + comm.rank).astype(t)
        recv = np.zeros_like(send)
        comm.Allreduce(send, recv, shmcoll.SUM, algorithm="reduce_scatter_allgather")
        parts = recv.view(np.uint8).reshape(-1, 16)
        out.append(int(np.count_nonzero(parts[:, 10:])))
    return out


def test_streamed_long_double_padding_is_zero():
    """Review of 9489a65: streamed long double results carried the L1
    tile's old stack bytes in their padding (pointer fragments, different
    on every rank and run); they go out as zeros."""
    if np.finfo(np.longdouble).nmant != 63:
        pytest.skip("long double is not x87's 80 bits in 16 here")
    need_cma(2)
    assert run_ranks(_padding, 2, options=dict(STREAMED, cma_bytes=1)) == [[0, 0], [0, 0]]


def _flagged(op, alg, p, nbytes, dt, opts):
    """(REDUCE instructions, those with the streamed bit) of every rank's
    program, and the schedule."""
    from shmcoll._core import lib
    from shmcoll.compile import compile_schedule
    from shmcoll.device import make_plan
    from shmcoll.topology import topology
    topo = topology(None)
    params = make_plan(p, topo, topo.placement(p, "core", "compact"), opts).params
    s = shmcoll.schedule(op, alg, p, nbytes, options=opts, dtype=dt, cma=True)
    out = []
    for prog in compile_schedule(s, params, (0, 0)):
        ins = prog[8:].reshape(-1, 8)
        red = ins[ins[:, 0] & 0xff == lib.SC_OP_REDUCE]
        out.append((red, red[red[:, 0] >> 29 & 1 == 1]))
    return out, s


@pytest.mark.parametrize("dt", ["float64", "float16"])
@pytest.mark.parametrize("p", [2, 3, 4])
def test_streamed_bit_on_the_last_kernel_into_recvbuf(p, dt):
    """Allreduce's folded slices, which the others read by single copy,
    stream: the bit is on the last kernel of each fold into recvbuf
    (SAME for 2 inputs, the last INTO for more, NARROW for halves), on no
    other; a schedule that does not stream sets none."""
    from shmcoll._core import lib
    last = lib.SC_F_NARROW if dt == "float16" else lib.SC_F_SAME if p == 2 else lib.SC_F_INTO
    kernels = p if dt == "float16" else p - 1        # per fold
    n = 3001 * 8 * p
    progs, s = _flagged("allreduce", "reduce_scatter_allgather", p, n, dt, dict(STREAMED, cma_bytes=1))
    assert s.stream_folds
    for red, flagged in progs:
        ends = red[kernels - 1::kernels]                # each fold's last kernel
        assert len(red) == kernels * len(flagged) and len(ends) == len(flagged) and (flagged == ends).all()
        assert (ends[:, 1] & 0xff == lib.SC_RECV).all() and (ends[:, 0] >> 24 & 0xf == last).all()
    progs, s = _flagged("allreduce", "reduce_scatter_allgather", p, n, dt, dict(SMALL, nt_bytes=1 << 40, cma_bytes=1))
    assert not s.stream and all(len(f) == 0 for _, f in progs)


@pytest.mark.parametrize("op,alg", [("allreduce", "all_at_once"), ("reduce_scatter_block", None), ("reduce", "flat"),
                                    ("reduce", "reduce_scatter_gather"), ("scan", None)])
def test_results_nobody_reads_in_the_call_stay_cached(op, alg):
    """A fold's result that no rank reads later in the call (a Reduce's at
    the root, Reduce_scatter_block's, every rank's all_at_once result)
    does not stream: measured, it gained nothing (bench/README.md)."""
    for p in (2, 3):
        progs, s = _flagged(op, alg, p, 3001 * 8 * p, "float64", dict(STREAMED, cma_bytes=1))
        assert s.stream_folds and sum(len(r) for r, _ in progs) and all(len(f) == 0 for _, f in progs)


def test_folds_stream_from_twice_the_footprint_copies_do():
    """Copies into recvbuf stream once a call's footprint reaches nt_bytes,
    folds' results only from twice that (2-rank Allreduce: footprint 6 x
    its bytes)."""
    n = 3001 * 8 * 2
    for nt, folds in ((4 * n, False), (3 * n, True)):
        progs, s = _flagged("allreduce", "reduce_scatter_allgather", 2, n, "float64", {"nt_bytes": nt, "cma_bytes": 1})
        assert s.stream and s.stream_folds == folds
        assert all(len(r) and len(f) == (len(r) if folds else 0) for r, f in progs)


def test_folds_their_rank_stages_again_do_not_stream():
    """A folded slice its own rank then copies into its ring (staged
    allgather) stays in cache: the copy would read it back from memory;
    read by single copy instead, it streams (16 MiB Allreduce; nt_bytes
    set, as the shared cache it defaults to held the call on a host with
    260 MiB of L3)."""
    opts = {"nt_bytes": 16 << 20}
    staged, s = _flagged("allreduce", "reduce_scatter_allgather", 3, 16 << 20, "float64", dict(opts, cma_bytes=0))
    assert s.stream and all(len(r) and not len(f) for r, f in staged)
    direct, _ = _flagged("allreduce", "reduce_scatter_allgather", 3, 16 << 20, "float64", dict(opts, cma_bytes=1))
    assert all(len(f) == len(r) // 2 for r, f in direct)


def test_minloc_pairs_never_carry_the_streamed_bit():
    """Review of 9489a65: MINLOC/MAXLOC pairs (a scalar loop) do not
    stream, and their words no longer say they do."""
    pdt = np.dtype([("v", "f8"), ("i", "i8")])
    progs, s = _flagged("allreduce", "all_at_once", 2, 3001 * 16, pdt, dict(STREAMED, cma_bytes=1))
    assert s.stream and all(len(r) and not len(f) for r, f in progs)


def _hand(steps, n):
    """Rank 0's REDUCE words of a hand-made streaming float64 SUM schedule,
    ending with rank 1 reading rank 0's recvbuf by single copy."""
    from shmcoll._core import lib
    from shmcoll.compile import compile_schedule
    from shmcoll.device import make_plan
    from shmcoll.sched import Move, Schedule, Step
    from shmcoll.topology import topology
    topo = topology(None)
    params = make_plan(2, topo, topo.placement(2, "core", "compact"), STREAMED).params
    steps = steps + [Step([Move(0, (1,), ((0, 0, n),), sbuf="recv", via="direct")])]
    s = Schedule("allreduce", "hand", 2, n, 0, steps, tmp=n, stream=True, stream_folds=True,
                 kernel=ops.kernel(ops.SUM, np.dtype("f8")))
    ins = compile_schedule(s, params, (0, 0))[0][8:].reshape(-1, 8)
    return ins[ins[:, 0] & 0xff == lib.SC_OP_REDUCE]


def test_reread_counts_later_folds_and_only_later_reads():
    """Review of 9489a65: a fold's result that a later fold of its rank
    reads back stays in cache, where it streamed; a read of recvbuf
    before the fold (a copy out of it a step earlier) no longer keeps a
    result only others read again from streaming."""
    from shmcoll.sched import Copy, Reduce, Step
    n = 1 << 16
    red = _hand([Step(reduces=[Reduce(0, (("send", 0), ("send", 0)), "recv", 0, n)]),
                 Step(reduces=[Reduce(0, (("recv", 0), ("send", 0)), "tmp", 0, n)])], n)
    assert len(red) and not (red[:, 0] >> 29 & 1).any()
    red = _hand([Step(copies=[Copy(0, "recv", 0, "tmp", 0, n)]),
                 Step(reduces=[Reduce(0, (("send", 0), ("tmp", 0)), "recv", 0, n)])], n)
    assert len(red) and (red[:, 0] >> 29 & 1).all()
    red = _hand([Step(reduces=[Reduce(0, (("send", 0), ("send", 0)), "recv", 0, n)],
                      copies=[Copy(0, "recv", 0, "tmp", 0, n)])], n)
    assert len(red) and not (red[:, 0] >> 29 & 1).any()      # a copy runs after its step's folds


def _determinism(comm, count):
    """float32 SUM of random data by every algorithm, in place and not:
    the hashes of the results."""
    out = []
    for inplace in (False, True):
        for alg in KINDS["allreduce"]:
            send = data(99, comm.rank, count, np.dtype(np.float32))
            recv = send.copy() if inplace else np.empty_like(send)
            comm.Allreduce(shmcoll.IN_PLACE if inplace else send, recv, algorithm=alg)
            out.append(hashlib.sha1(recv.tobytes()).hexdigest())
        for alg in KINDS["reduce"]:
            send = data(99, comm.rank, count, np.dtype(np.float32))
            recv = np.empty_like(send)
            comm.Reduce(send, recv, root=comm.size - 1, algorithm=alg)
            if comm.rank == comm.size - 1:
                out.append(hashlib.sha1(recv.tobytes()).hexdigest())
    return out


@pytest.mark.parametrize("count", [33, 100003])
def test_bit_identical_across_ranks_algorithms_placements(count):
    """One hash for every rank, algorithm and run, under two placements
    (a flat node and a virtual two-socket one, ranks spread over it)."""
    seen = set()
    for topo, mp in ((None, "compact"), ("2x2", "scatter"), (None, "compact")):
        for h in run_ranks(_determinism, 4, count, topology=topo, map=mp):
            seen.update(h)
    want = fold([data(99, q, count, np.dtype(np.float32)) for q in range(4)], "SUM", np.dtype(np.float32))
    assert seen == {hashlib.sha1(want.tobytes()).hexdigest()}


@pytest.mark.parametrize("topo,n,mp", [("2x2", 4, "compact"), ("2x3", 5, "compact"), ("3x2", 6, "compact"),
                                        ("2x2", 4, "scatter"), ("2x4x4", 8, "compact")])
def test_numa_across_nodes(topo, n, mp):
    """Allreduce and Reduce numa on virtual multi-node topologies: runs of
    equal and unequal length, three nodes, one rank per run (scattered);
    blocks small enough that several pipeline, in place and not; against
    numpy's rank-order fold, bit for bit: float32 and int64 SUM, float64
    MAX, and float16, which takes reduce_scatter_allgather."""
    sizes = [1, 7, 33, 257, 1031, 9000]
    cases = table(["allreduce", "reduce"], sizes, ("float32", "int64"), roots=(0, n - 1, 1, n // 2))
    cases = [c for c in cases if c[1] == "numa"] + [("allreduce", None, "SUM", "float32", 9000, 0, False),
                                                   ("allreduce", "numa", "MAX", "float64", 1031, 0, True),
                                                   ("allreduce", "numa", "SUM", "float16", 1031, 0, False),
                                                   ("reduce", None, "SUM", "float32", 9000, n - 1, True)]
    run_cases(_job, n, cases, topology=topo, map=mp, options=dict(SMALL, reduce_block_bytes=4096, reduce_small_bytes=0),
              timeout=240)


def test_numa_schedule_crosses_nodes_once_per_slice():
    """On 2 x 4 ranks the chain moves one partial per slice to the next
    node and one result per slice back: 2 n bytes across nodes, where
    reduce_scatter_allgather moves 8 n; the automatic choice takes it."""
    n = 8 << 20
    s = shmcoll.schedule("allreduce", None, 8, n, topology="2x4")
    assert s.algorithm == "numa"
    for alg, want in (("numa", 2 * n), ("reduce_scatter_allgather", 8 * n)):
        t = shmcoll.schedule("allreduce", alg, 8, n, topology="2x4").traffic()
        assert t[:4, 4:].sum() + t[4:, :4].sum() == want, alg
    assert shmcoll.schedule("allreduce", None, 8, n).algorithm == "reduce_scatter_allgather"
    assert shmcoll.schedule("reduce", None, 8, n, topology="2x4").algorithm == "numa"


def _pair_traffic(comm, count, pdt):
    send = np.zeros(count, pdt)
    send["i"] = np.arange(count)
    recv = np.empty_like(send)
    want = comm.schedule("allreduce", send.nbytes, algorithm="reduce_scatter_allgather", dtype=pdt).traffic()
    before = comm.traffic()
    comm.Allreduce(send, recv, shmcoll.MINLOC, algorithm="reduce_scatter_allgather")
    return comm.traffic() - before, want, comm.selected("allreduce", 8 << 20, dtype=np.float16)


def test_schedule_of_a_dtype_is_what_runs():
    """schedule(..., dtype=) plans with the dtype's element size: a packed
    6-byte (int16, int32) pair cuts slices on 192-byte units, not the
    64 bytes a plan in bytes would use; and selected(..., dtype=float16)
    on two nodes names what float16 runs (not numa)."""
    pdt = np.dtype([("v", "i2"), ("i", "i4")])
    got = run_ranks(_pair_traffic, 3, 1001, pdt, topology="2x2",
                    options=dict(SMALL, record_traffic=1, reduce_small_bytes=0))
    measured = np.stack([g[0] for g in got], axis=1)
    np.fill_diagonal(measured, 0)
    assert (measured == got[0][1]).all(), (measured, got[0][1])
    plain = shmcoll.schedule("allreduce", "reduce_scatter_allgather", 3, 1001 * 6).traffic()
    assert (plain != got[0][1]).any()
    assert got[0][2] == "reduce_scatter_allgather"
    with pytest.raises(TypeError, match="dtype"):
        shmcoll.schedule("allreduce", None, 2, 64, dtype="S4")
    with pytest.raises(ValueError, match="whole"):
        shmcoll.schedule("reduce_scatter_block", None, 3, 20, dtype=np.float64)
    assert shmcoll.schedule("bcast", None, 3, 1000, dtype="S4").traffic().sum() > 0   # not a reduction: bytes


def test_numa_tiny_chunks():
    """Found in review: with 64-byte chunks a writer's inline slots ran
    out at different moves, so one fold got one input inline and another
    staged, which compile refused (AssertionError on every rank)."""
    opts = dict(chunk_bytes=64, reduce_small_bytes=0, reduce_block_bytes=64)
    cases = [(kind, "numa", "SUM", t, 1000, 1, inplace) for kind in ("allreduce", "reduce") for t in ("int16", "float32")
             for inplace in (False, True)]
    run_cases(_job, 4, cases, topology="2x2", options=opts, timeout=60)


def test_numa_not_chosen_for_ranks_alternating_nodes():
    """Found in review: ranks scattered over 4 nodes as 0, 2, 0, 2 make one
    run per rank, fewer than the nodes; the chain is then longer and
    crosses more, so the automatic choice must not take it."""
    def job(comm):
        return comm.selected("allreduce", 8 << 20), comm.selected("reduce", 8 << 20)
    assert run_ranks(job, 4, topology="2x4x4", map="scatter")[0] == ("reduce_scatter_allgather",
                                                                     "reduce_scatter_gather")


def _allreduce_choice(comm, sizes):
    return [comm.selected("allreduce", s) for s in sizes]


# 2 ranks with a core each: both algorithms read the other's input once, and one hand-off wins while
# the 4 buffers fit the shared cache (2-vCPU EPYC guest, L3 32 MiB: 4 MiB 121 us against 351, 8 MiB 339
# against 793, 16 MiB 1091 against 720)
TWO = max(256 << 10, machine().shared_cache_size() // 4)


@pytest.mark.parametrize("topo,n,bind,limit", [(None, 2, "core", TWO),
                                                ("1x2", 4, "core", 32 << 10), ("1x2", 3, "core", 32 << 10)])
def test_allreduce_automatic_choice(topo, n, bind, limit):
    """One hand-off while (p - 1) x bytes is at most 256 KiB (at 2 ranks
    with a core each, a quarter of the shared cache if more), an eighth of
    that where ranks take turns on the cores (4 ranks on 2 cores: 64 KiB
    took 38 us by all_at_once and 25 by reduce_scatter_allgather)."""
    most = limit // (n - 1)
    want = ["all_at_once", "all_at_once", "reduce_scatter_allgather"]
    assert run_ranks(_allreduce_choice, n, [8, most, most + 1], topology=topo, bind=bind) == [want] * n


def _traffic(comm, count, alg):
    send = data(5, comm.rank, count, np.dtype(np.float32))
    recv = np.empty_like(send)
    want = comm.schedule("allreduce", send.nbytes, algorithm=alg, dtype=send.dtype).traffic()
    before = comm.traffic()
    comm.Allreduce(send, recv, algorithm=alg)
    return comm.traffic() - before, want


def test_numa_traffic_is_the_schedules():
    """What the executor moved between ranks (column per reader) is what
    the numa schedule says, on a virtual 2 x 2 node."""
    got = run_ranks(_traffic, 4, 3000, "numa", topology="2x2",
                    options=dict(SMALL, record_traffic=1, reduce_block_bytes=4096, reduce_small_bytes=0))
    measured = np.stack([g[0] for g in got], axis=1)
    np.fill_diagonal(measured, 0)
    assert (measured == got[0][1]).all(), (measured, got[0][1])


@pytest.mark.parametrize("n", [2, 3, 5])
def test_single_copy_folds(n):
    """From cma_bytes up, a reader copies each input in sendbuf by single
    copy into its scratch, a chunk at a time (4 KiB here), and folds it
    from there.  Forced down to one byte: every reduction and algorithm,
    sizes around the chunk, in place and not, roots rotating."""
    need_cma(n)
    sizes = ITEMS + [1023, 1024, 1025, 2049, 5000]
    run_cases(_job, n, table(KINDS, sizes, roots=(0, n - 1, n // 2)), options=dict(SMALL, cma_bytes=1), timeout=300)


@pytest.mark.parametrize("alg", ["all_at_once", "reduce_scatter_allgather"])
def test_single_copy_fold_traffic_is_the_schedules(alg):
    """A single-copy input is counted once, by the copy that reads it."""
    need_cma(3)
    got = run_ranks(_traffic, 3, 5000, alg, options=dict(SMALL, record_traffic=1, cma_bytes=1))
    assert any(m.via == "direct" for st in shmcoll.schedule("allreduce", alg, 3, 20000, options={"cma_bytes": 1},
                                                             cma=True, dtype="float32").steps for m in st.moves)
    measured = np.stack([g[0] for g in got], axis=1)
    np.fill_diagonal(measured, 0)
    assert (measured == got[0][1]).all(), (measured, got[0][1])


def _without_cma(comm, *args):
    """_job with single copies off on every rank (as where ptrace is not
    permitted), so staged moves replace them."""
    comm._c.cma = 0
    comm._dev.clear_programs()
    return _job(comm, *args)


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("single", [True, False])
def test_reduce_scatter_gather_blocks(n, single):
    """Reduce's slices are folded and sent to the root block by block: each
    non-root's folded slice of block b reaches the root's recvbuf during
    block b + 1 (pushed by single copy, or staged from alternate halves of
    its scratch) while it folds the next.  4 KiB blocks, so several blocks
    and a short last one; in place and not, roots rotating."""
    if single:
        need_cma(n)
    opts = dict(SMALL, reduce_block_bytes=4096, reduce_small_bytes=0, cma_bytes=1)
    moves = [m for st in shmcoll.schedule("reduce", "reduce_scatter_gather", n, 36000, options=opts, cma=single,
                                          dtype="float32").steps for m in st.moves if m.sbuf == "tmp"]
    block = 4096 // (256 * n) * 256 * n         # whole 64-float slices per rank
    assert len(moves) == -(-36000 // block) * (n - 1) and {m.via for m in moves} == {"push" if single else "auto"}
    sizes = [1, 1023, 1024, 1025, 3001, 9000]
    run_cases(_job if single else _without_cma, n, table(["reduce"], sizes, roots=(0, n - 1, n // 2)),
              options=opts, timeout=240)


def _push_counts(comm, count):
    send = data(5, comm.rank, count, np.dtype(np.float32))
    recv = np.empty_like(send)
    sched = comm.schedule("reduce", send.nbytes, algorithm="reduce_scatter_gather", dtype=send.dtype)
    before = comm.traffic(), comm.messages()
    comm.Reduce(send, recv, algorithm="reduce_scatter_gather")
    return comm.traffic() - before[0], comm.messages() - before[1], sched


def test_reduce_push_traffic_is_the_schedules():
    """Every folded slice pushed to the root is counted, bytes and
    messages, as the schedule says (review of ea3baaa: the root's late
    waits kept one push per writer, and messages() counted 7 of 12)."""
    need_cma(3)
    got = run_ranks(_push_counts, 3, 5000, options=dict(SMALL, record_traffic=1, cma_bytes=1, reduce_block_bytes=4096))
    sched = got[0][2]
    assert sum(m.via == "push" for st in sched.steps for m in st.moves) == 12
    count = np.zeros((3, 3), np.int64)
    for src, dst, _ in sched.messages():
        count[src, dst] += 1
    for k, want in ((0, sched.traffic()), (1, count)):
        measured = np.stack([g[k] for g in got], axis=1)
        np.fill_diagonal(measured, 0)
        assert (measured == want).all(), (k, measured, want)


def test_reduce_spreads_the_folds_sooner_where_slices_are_pushed():
    """Two ranks on CPUs of their own fold slices from 64 KiB (pushed, by
    single copy) where the root alone folded up to 256 KiB; ranks sharing
    CPUs, smaller calls and more ranks keep flat."""
    def alg(p, cpus, n):
        return select.pick("reduce", select.typed("reduce", planned(p, cpus, n), "float64"), None, None)
    assert alg(2, 2, 64 << 10) == alg(2, 2, 256 << 10) == "reduce_scatter_gather"
    assert alg(2, 2, 48 << 10) == alg(2, 1, 64 << 10) == alg(3, 3, 64 << 10) == "flat"


def test_reduce_pushes_only_from_cma_bytes():
    """Slices go by single copy (push) only where cma_bytes says, as every
    other block with one reader (gather.via: the root's inputs together,
    with a CPU per rank; review of ea3baaa: cma_bytes=0 still pushed, and
    8 ranks pushed 8 KiB slices under the 1 MiB default)."""
    def vias(p, cpus, n, **opts):
        call = select.typed("reduce", planned(p, cpus, n), "float64")
        call.params.update(dict(reduce_block_bytes=2 << 20), **opts)   # whatever the host's cache makes it
        return {m.via for st in select.plan("reduce", "reduce_scatter_gather", call).steps for m in st.moves
                if m.sbuf == "tmp"}
    assert vias(3, 3, 3 << 20) == {"push"}
    assert vias(3, 3, 3 << 20, cma_bytes=0) == {"auto"}
    assert vias(8, 8, 64 << 10) == {"auto"}
    assert vias(3, 2, 3 << 20) == {"auto"}      # 3 ranks on 2 CPUs: only slices of 1 MiB and more
    assert vias(2, 2, 3 << 20) == {"push"}      # 2 ranks: from 32 KiB


def _nan_minmax(comm, tnames):
    out = []
    for seq, t in enumerate(tnames):
        x = data(seq, comm.rank, 1000, dtype(t))
        rng = np.random.default_rng([seq, comm.rank, 7])
        for v in (np.nan, -np.nan, 0.0, -0.0, np.inf, -np.inf):
            x[rng.integers(0, 1000, 40)] = v
        r = np.empty_like(x)
        for name in ("MIN", "MAX"):
            comm.Allreduce(x, r, ops.BUILTINS[name])
            out.append((t, name, x, r.copy()))
    return out


def test_min_max_propagate_nan_like_numpy():
    """Float MIN/MAX follow np.minimum/np.maximum: a NaN on any rank gives
    NaN there (it used to be lost when it came from a lower rank), and +0
    against -0 gives the later rank's, as numpy's float32/float64 do (bit
    for bit there; by value, NaN where NaN, for the others)."""
    tnames = ["float16", "float32", "float64", "longdouble"] + (["bfloat16"] if ml_dtypes else [])
    got = run_ranks(_nan_minmax, 3, tnames)
    for i, (t, name, _, r) in enumerate(got[0]):
        want = fold([g[i][2] for g in got], name, dtype(t))
        assert np.isnan(want.astype(np.float64)).any()
        if t in ("float32", "float64"):
            assert r.tobytes() == want.tobytes(), (t, name)
        assert np.array_equal(r.astype(np.float64), want.astype(np.float64), equal_nan=True), (t, name)
        assert all(np.array_equal(g[i][3], r, equal_nan=True) for g in got), (t, name)   # long double: padding


# -- MINLOC / MAXLOC -------------------------------------------------------------

PAIRS = [np.dtype([("v", "f8"), ("i", "i4")]), np.dtype([("v", "f4"), ("i", "i4")], align=True),
         np.dtype([("v", "i4"), ("i", "i8")]), np.dtype([("v", "i8"), ("i", "i8")]), np.dtype([("v", "i2"), ("i", "i4")])]


def _loc(comm, pdt):
    """Values with many ties; rank r's index is 10 * r + j, so a tie must
    keep the lower rank's."""
    p, me, out = comm.size, comm.rank, []
    j = np.arange(50)
    mk = lambda r: np.array([((j_ * (r + 1)) % 3, 10 * r + j_) for j_ in j], pdt)
    for name, better in (("MINLOC", np.less), ("MAXLOC", np.greater)):
        want = mk(0)
        for r in range(1, p):
            x = mk(r)
            take = better(x["v"], want["v"]) | ((x["v"] == want["v"]) & (x["i"] < want["i"]))
            want = np.where(take, x, want)
        for alg in KINDS["allreduce"]:
            recv = np.zeros(50, pdt)
            comm.Allreduce(mk(me), recv, ops.BUILTINS[name], algorithm=alg)
            out.append(recv.tobytes() == want.tobytes())
        obj = comm.allreduce((float(mk(me)["v"][7]), me), ops.BUILTINS[name])
        out.append(obj == (float(want["v"][7]), int(want["i"][7]) // 10))
    return out


@pytest.mark.parametrize("pdt", PAIRS, ids=lambda d: d.str + str(d.itemsize))
def test_minloc_maxloc_ties_lowest_index(pdt):
    assert all(all(r) for r in run_ranks(_loc, 3, pdt, options=SMALL)), pdt


# -- user ops and objects --------------------------------------------------------

def _user(comm):
    p, me, out = comm.size, comm.rank, []
    x = np.arange(40, dtype=np.int64) + me * 7
    xs = [np.arange(40, dtype=np.int64) + q * 7 for q in range(p)]

    def left(a, b):             # neither commutative nor associative: the order is all that matters
        return 2 * a - b

    def mpi_style(invec, inoutvec, datatype):
        inoutvec[:] = invec * 3 + inoutvec

    for op, ref in ((shmcoll.Op.Create(np.add), lambda a, b: a + b),
                    (shmcoll.Op.Create(left, commute=False), left),
                    (shmcoll.Op.Create(mpi_style, commute=False), lambda a, b: a * 3 + b)):
        want = xs[0]
        for y in xs[1:]:
            want = ref(want, y)
        recv = np.zeros(40, np.int64)
        comm.Allreduce(x, recv, op)
        out.append(recv.tolist() == want.tolist())
        recv[:] = 0
        comm.Reduce(x, recv, op, root=p - 1)
        out.append(recv.tolist() == want.tolist() if me == p - 1 else not recv.any())
        recv[:] = 0
        comm.Scan(x, recv, op)
        pre = xs[0]
        for y in xs[1:me + 1]:
            pre = ref(pre, y)
        out.append(recv.tolist() == pre.tolist())
        blk = np.zeros(40 // p if 40 % p == 0 else 0, np.int64)
        if blk.size:
            comm.Reduce_scatter_block(x, blk, op)
            out.append(blk.tolist() == want[me * blk.size:(me + 1) * blk.size].tolist())
    return out


def test_user_ops_commutative_and_not():
    for n in (2, 4):
        got = run_ranks(_user, n, options=SMALL)
        assert all(all(r) for r in got), got


def _objects(comm):
    me = comm.rank
    return [comm.allreduce(me + 1), comm.allreduce(str(me), shmcoll.SUM), comm.reduce([me], root=1),
            comm.scan(me + 1, shmcoll.PROD), comm.exscan(me + 1), comm.allreduce(me, shmcoll.MAX)]


def test_object_reductions():
    got = run_ranks(_objects, 4)
    for r, g in enumerate(got):
        assert g[0] == 10 and g[1] == "0123" and g[2] == ([0, 1, 2, 3] if r == 1 else None), g
        assert g[3] == [1, 2, 6, 24][r] and g[4] == [None, 1, 3, 6][r] and g[5] == 3, g


# -- buffers -----------------------------------------------------------------------

def _forms(comm):
    """[buf, count, dtype] specs, a bytearray-backed memoryview, and the
    fast entry's second call (same arrays) agreeing with the first."""
    p, out = comm.size, []
    x = np.arange(10, dtype=np.float64) * (comm.rank + 1)
    want = np.arange(10, dtype=np.float64) * (p * (p + 1) // 2)
    r = np.zeros(10)
    comm.Allreduce([x, 10, np.float64], [r, np.float64])
    out.append(r.tolist() == want.tolist())
    for _ in range(3):
        r[:] = 0
        comm.Allreduce(x, r)
        out.append(r.tolist() == want.tolist())
    r[:] = x
    comm.Allreduce(shmcoll.IN_PLACE, r, shmcoll.SUM)
    out.append(r.tolist() == want.tolist())
    b = bytearray(8)
    comm.Allreduce(memoryview(np.array([comm.rank + 1], np.int64)), memoryview(b).cast("B").cast("q"))
    out.append(int(np.frombuffer(b, np.int64)[0]) == p * (p + 1) // 2)
    return out


def test_buffer_forms_and_fast_entry():
    got = run_ranks(_forms, 3)
    assert all(all(r) for r in got), got


def test_torch_tensor_through_dlpack():
    torch = pytest.importorskip("torch")

    def job(comm):
        t = torch.arange(6, dtype=torch.float32) * (comm.rank + 1)
        out = torch.zeros(6, dtype=torch.float32)
        comm.Allreduce(t, out)
        comm.Allreduce(shmcoll.IN_PLACE, t)
        return out.tolist(), t.tolist()
    for out, t in run_ranks(job, 2):
        assert out == t == [3.0 * i for i in range(6)]


# -- bad input: raises on every rank, never hangs --------------------------------

def _bad(comm, case):
    me = comm.rank
    x, r = np.ones(8, np.float64), np.zeros(8, np.float64)
    try:
        if case == "op_for_dtype":
            comm.Allreduce(np.ones(8, np.float32), np.zeros(8, np.float32), shmcoll.BAND)
        elif case == "op_on_one_rank":
            comm.Allreduce(x, r, shmcoll.MAX if me == 1 else shmcoll.SUM)
        elif case == "dtype_on_one_rank":
            dt = np.float32 if me == 1 else np.int32
            comm.Allreduce(np.ones(8, dt), np.zeros(8, dt))
        elif case == "count_on_one_rank":
            k = 9 if me == 1 else 8
            comm.Allreduce(np.ones(k), np.zeros(k))
        elif case == "recvcounts_sum":
            comm.Reduce_scatter(np.ones(9), np.zeros(3), [3, 3, 2])
        elif case == "root":
            comm.Reduce(x, r, root=3)
        elif case == "inplace_off_root":
            comm.Reduce(shmcoll.IN_PLACE, r, root=0)
        elif case == "inplace_recvbuf":
            comm.Allreduce(x, shmcoll.IN_PLACE)
        elif case == "dtypes_differ":
            comm.Allreduce(np.ones(8, np.float32), np.zeros(4, np.float64))
        elif case == "not_an_op":
            comm.Allreduce(x, r, np.add)
        elif case == "inplace_on_one_rank":
            comm.Allreduce(shmcoll.IN_PLACE if me == 1 else x, r)
        comm.Barrier()
    except Exception as e:
        return type(e).__name__, str(e), getattr(e, "rank", None)
    return None


BAD = {"op_for_dtype": ("TypeError", "BAND"), "op_on_one_rank": ("MismatchError", "op"),
       "dtype_on_one_rank": ("MismatchError", "dtype"), "count_on_one_rank": ("MismatchError", "byte"),
       "recvcounts_sum": ("ValueError", "recvcounts"), "root": ("ArgumentError", "root"),
       "inplace_off_root": ("ValueError", "IN_PLACE"), "inplace_recvbuf": ("ValueError", "IN_PLACE"),
       "dtypes_differ": ("ValueError", "dtype"), "not_an_op": ("TypeError", "shmcoll.Op"),
       "inplace_on_one_rank": ("MismatchError", "SUM with IN_PLACE")}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_raises_on_every_rank(case):
    got = run_ranks(_bad, 3, case, options=SMALL, timeout=30)
    etype, word = BAD[case]
    assert all(g is not None for g in got), got
    named = [g for g in got if g[0] == etype]
    assert named and all(word in g[1] for g in named), got
    assert all(g[0] in (etype, "PeerAborted", "MismatchError") for g in got), got


def test_killed_rank_mid_allreduce():
    """A rank that dies while its peers wait in Allreduce makes them raise
    PeerDied within 2 s."""
    assert_killed_mid(lambda comm: comm.Allreduce(np.ones(1 << 20), np.zeros(1 << 20)))


# -- found in review -------------------------------------------------------------

def test_reduce_scatter_zero_count_small_channel():
    """A rank with nothing to receive sends one deposit more than the
    others, so its ring's chunks were smaller: the fold's inputs were cut
    differently and compiling failed."""
    def job(comm):
        counts = [0, 1000, 1000]
        x = np.arange(2000, dtype=np.float64) * (comm.rank + 1)
        r = np.zeros(counts[comm.rank])
        comm.Reduce_scatter(x, r, counts)
        lo = sum(counts[:comm.rank])
        return r.tolist() == (np.arange(2000.0) * 6)[lo:lo + counts[comm.rank]].tolist()
    assert run_ranks(job, 3, options={"chan_bytes": 8192}) == [True] * 3


def test_reduce_scatter_fast_entry_keys_its_counts():
    """Reduce_scatter's C entry keys the recvcounts (their fingerprint,
    then the exact counts): rank 1's buffers are alike in every call
    here, while its piece starts at 2 or 6 items; each call, repeated so
    that it runs from the cache, must land rank 1's own piece, and the
    last of each runs no Python function of shmcoll's."""
    import array
    from test_specs import _python_frames

    def job(comm):
        out = []
        x = np.arange(12, dtype=np.float64) * (comm.rank + 1)
        for counts in ([2, 4, 6], [6, 4, 2], array.array("i", [2, 4, 6]), np.array([6, 4, 2], np.int32)):
            for _ in range(3):
                r = np.full(counts[comm.rank], -1.0)
                frames = _python_frames(lambda: comm.Reduce_scatter(x, r, counts))
                lo = int(sum(counts[:comm.rank]))
                out.append(r.tolist() == (np.arange(12.0) * 6)[lo:lo + int(counts[comm.rank])].tolist())
            out.append(frames)
        return out
    assert run_ranks(job, 3, timeout=30) == [([True] * 3 + [[]]) * 4] * 3


def test_fast_entry_refuses_other_recv_dtype():
    """After a float32 Allreduce, the same call with an int32 recvbuf of the
    same item size ran the float32 program from the C entry's cache."""
    def job(comm):
        x, r = np.ones(4, np.float32), np.zeros(4, np.float32)
        comm.Allreduce(x, r)
        comm.Allreduce(x, r)
        try:
            comm.Allreduce(x, np.zeros(4, np.int32))
        except ValueError as e:
            return "dtype" in str(e)
        except shmcoll.PeerFailure:
            return True
        return False
    assert run_ranks(job, 2) == [True, True]


def test_user_op_arity_and_objects():
    """A function with a defaulted third parameter is a plain fn(a, b); an
    mpi4py-style op on objects returns Python objects."""
    def add(a, b, out=None):
        return np.add(a, b)

    def inout(invec, inoutvec, datatype):
        inoutvec[:] = invec + inoutvec

    def job(comm):
        r = np.zeros(3, np.int64)
        comm.Allreduce(np.full(3, comm.rank + 1, np.int64), r, shmcoll.Op.Create(add))
        obj = comm.allreduce(float(comm.rank + 1), shmcoll.Op.Create(inout))
        ex = comm.exscan(float(comm.rank + 1), shmcoll.Op.Create(inout))
        return r.tolist(), obj, type(obj).__name__, ex
    got = run_ranks(job, 3)
    for rank, (r, obj, kind, ex) in enumerate(got):
        assert r == [6, 6, 6] and obj == 6.0 and kind == "float" and ex == [None, 1.0, 3.0][rank], got


def _program_length(counts, rank):
    from shmcoll.coll import select
    from shmcoll.compile import compile_schedule
    from shmcoll.device import make_plan
    from shmcoll.sched import Call
    from shmcoll.topology import topology
    topo = topology(None)
    plan = make_plan(2, topo, topo.placement(2, "core", "compact"), {"cma_bytes": 1})
    call = select.typed("reduce_scatter", Call(2, 8 * sum(counts), 0, plan.params, plan.slots, 1, True), "float64")
    call.counts = ((8 * counts[0], 0), (8 * counts[1], 8 * counts[0]))
    return int(compile_schedule(select.plan("reduce_scatter", "all_at_once", call), plan.params, (0, 0))[rank][0])


def test_single_copy_fold_chunk_not_cut_by_a_small_input():
    """Review of ca17ea4: Reduce_scatter with recvcounts [1, 10**6] cut
    rank 1's 8 MB fold into 8-byte rounds (the small slice's size capped
    the step's common chunk): 4,000,001 instructions, 0.7 s a call.  Rank
    1 folds what it folds with [10**6, 10**6], in as many instructions."""
    assert _program_length((1, 10 ** 6), 1) <= _program_length((10 ** 6, 10 ** 6), 1)


def _mismatch_big(comm):
    x = np.arange(1 << 18, dtype=np.float64)
    try:
        comm.Allreduce(x, np.zeros_like(x), shmcoll.MAX if comm.rank == comm.size - 1 else shmcoll.SUM,
                       algorithm="all_at_once")
        return None
    except shmcoll.ShmcollError as e:
        return type(e).__name__


def test_single_copy_reader_of_a_rank_that_raised_and_left_says_aborted():
    """Review of ca17ea4: a rank reading a peer by single copy while that
    peer raised MismatchError and exited found the process gone (ESRCH)
    and said PeerDied (about 1 result in 6 at 4 ranks); the job was
    aborted first, so the reader says so."""
    need_cma(4)
    seen = set()
    for _ in range(12):
        seen.update(run_ranks(_mismatch_big, 4, timeout=60))
    assert seen <= {"MismatchError", "PeerAborted"}, seen
