"""The call counter started next to 2^31, 2^32 and 2^64 (option call_base /
SHMCOLL_CALL_BASE): barrier semantics and Bcast / Alltoall data of every
algorithm must be unchanged when the counter crosses those values.

One launch runs at least 40 calls mixing the three collectives (every
Barrier algorithm, Bcast of every algorithm from every root, Alltoall of
every algorithm) with sizes from 0 to beyond the 8 KiB test ring, so the
counter crosses the boundary 8 calls in, in the middle of the mix.

Barrier: the call's late rank is held until every other rank has written
to a pipe just before calling Barrier; it then marks its arrival in a
shared array and enters.  Every rank must see the mark once it leaves: a
barrier that lets anyone through before the late rank arrives fails."""
import os
import time

import numpy as np
import pytest

import shmcoll
from conftest import SMALL, pattern, poison, run_ranks, shared_array

pytestmark = pytest.mark.timeout(120)

BASES = [2**31 - 8, 2**32 - 8, 2**64 - 8]
BARRIER = ["original", "padded", "hierarchical", "all_to_all"]
BCAST = ["binomial", "original", "limited", "numa"]
ALLTOALL = ["bruck", "all_at_once", "pairwise", "tiled"]
SIZES = [0, 8, 97, 1500, 9005, 64, 3000]     # bytes (per block for Alltoall)
DTYPES = [np.int8, np.float64, np.int32]


def plan(n, calls=40):
    """[(op, algorithm, nbytes, root)], the three lists taken round-robin."""
    lists = [[("barrier", a, 0, 0) for a in BARRIER],
             [("bcast", a, None, root) for a in BCAST for root in range(n)],
             [("alltoall", a, None, 0) for a in ALLTOALL]]
    mixed = []
    for i in range(max(len(x) for x in lists)):
        mixed += [x[i] for x in lists if i < len(x)]
    out = []
    for i in range(max(calls, len(mixed))):
        op, alg, nb, root = mixed[i % len(mixed)]
        out.append((op, alg, SIZES[i % len(SIZES)] if nb is None else nb, root))
    return out


def _job(comm, calls, mark, arrive):
    n, me = comm.size, comm.rank
    bad = []
    for i, (op, alg, nbytes, root) in enumerate(calls):
        dtype = np.dtype(DTYPES[i % len(DTYPES)])
        count = nbytes // dtype.itemsize
        if op == "barrier":
            late = i % n
            if n > 1 and me == late:
                got = 0
                while got < n - 1:                       # every other rank is at its Barrier call
                    got += len(os.read(arrive[0], n - 1 - got))
                time.sleep(0.005)                        # give them time to block (not relied on)
                mark[0] = i
            elif n > 1:
                os.write(arrive[1], b"x")
            else:
                mark[0] = i
            comm.Barrier(alg)
            if mark[0] != i:
                bad.append(f"rank {me}: call {i} Barrier {alg} let it through before rank {late} arrived "
                           f"(mark {mark[0]})")
        elif op == "bcast":
            want = pattern(count, dtype, i, root)
            buf = want.copy() if me == root else poison(count, dtype)
            comm.Bcast(buf, root=root, algorithm=alg)
            if buf.tobytes() != want.tobytes():
                bad.append(f"rank {me}: call {i} Bcast {alg} root {root} {count} x {dtype}: wrong data")
        else:
            send = pattern(n * count, dtype, i, me).reshape(n, count)
            recv = poison(n * count, dtype).reshape(n, count)
            comm.Alltoall(send, recv, algorithm=alg)
            want = np.stack([pattern(n * count, dtype, i, j).reshape(n, count)[me] for j in range(n)])
            if recv.tobytes() != want.tobytes():
                rows = [j for j in range(n) if recv[j].tobytes() != want[j].tobytes()]
                bad.append(f"rank {me}: call {i} Alltoall {alg} {count} x {dtype}: blocks from {rows} wrong")
    return bad


def check(n, base, how="option", monkeypatch=None):
    mark = shared_array(1, np.int64, fill=-1)
    arrive = os.pipe()
    kw = {"options": dict(SMALL, call_base=base)}
    if how == "env":
        monkeypatch.setenv("SHMCOLL_CALL_BASE", str(base))
        kw = {"options": SMALL}
    try:
        got = run_ranks(_job, n, plan(n), mark, arrive, timeout=60, **kw)
    finally:
        os.close(arrive[0])
        os.close(arrive[1])
    failures = [f for r in got for f in r]
    assert failures == [], "\n".join(failures[:20])


def covers_everything(calls, n):
    """The mix really has every algorithm (and, for Bcast, every root), and
    barriers on both sides of the crossing (8 calls in)."""
    assert len(calls) >= 40
    assert {a for op, a, _, _ in calls if op == "barrier"} == set(BARRIER)
    assert {(a, r) for op, a, _, r in calls if op == "bcast"} == {(a, r) for a in BCAST for r in range(n)}
    assert {a for op, a, _, _ in calls if op == "alltoall"} == set(ALLTOALL)
    assert any(op == "barrier" for op, *_ in calls[:8]) and any(op == "barrier" for op, *_ in calls[8:16])


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("base", BASES, ids=["2^31-8", "2^32-8", "2^64-8"])
def test_call_base_mixed_calls(base, n):
    covers_everything(plan(n), n)
    check(n, base)


@pytest.mark.parametrize("base", [2**31 - 8, 2**64 - 8], ids=["2^31-8", "2^64-8"])
def test_call_base_from_environment(base, monkeypatch):
    from shmcoll import options
    monkeypatch.setenv("SHMCOLL_CALL_BASE", str(base))
    assert options.resolve()["call_base"] == (base, "environment")
    check(3, base, "env", monkeypatch)


def test_call_base_range():
    """2^64 - 1 is the largest start; 2^64 and -1 are rejected, naming the option."""
    assert run_ranks(lambda comm: comm.Barrier() or comm.rank, 2, options={"call_base": 2**64 - 1}, timeout=30) == [0, 1]
    for bad in (2**64, -1):
        with pytest.raises(ValueError, match="call_base") as ei:
            shmcoll.launch(lambda comm: comm.Barrier(), 2, options={"call_base": bad}, timeout=30)
        assert "unknown" not in str(ei.value), ei.value


@pytest.mark.parametrize("call", [5, 2**31, 2**63 - 1, 2**63 + 3, 2**64 - 2])
def test_a_stamp_being_rewritten_is_not_reached(call):
    """An inline slot's stamp reads call ^ 2^63 while its writer rewrites
    it (exec.c stamp_open).  A STAMPED wait at call must not take an older
    call's rewrite, 2^63 minus a few past it, for a post: by signed
    difference it was reached, and a reader two calls ahead of a slow
    writer read the slot's old bytes (scatter binomial at 5 ranks)."""
    from shmcoll._core import lib
    m = 1 << 64
    for older in (1, 2, 4, 7):
        assert not lib.sc_word_reached((call - older) % m ^ 1 << 63, call)
        assert not lib.sc_word_reached((call - older) % m, call)
    assert not lib.sc_word_reached(call ^ 1 << 63, call)
    assert lib.sc_word_reached(call, call)
    assert lib.sc_word_reached((call + 3) % m, call)
