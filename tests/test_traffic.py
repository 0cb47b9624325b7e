"""The traffic the executor records (option record_traffic=1,
comm.traffic()) equals what the schedule it runs says (comm.schedule(...)
.traffic()), for every collective, algorithm, a few sizes and 2-4 ranks;
and schedules' traffic holds what each algorithm must move.

comm.traffic() on rank d: bytes copied into d from each source since the
communicator was created (local copies not counted).  Each rank samples it
before and after one call; the differences, stacked by receiver, give the
measured T[src, dst] of that call."""
import numpy as np
import pytest

import shmcoll
from conftest import SMALL, pattern, poison, run_ranks

pytestmark = pytest.mark.timeout(120)

ALGS = {"barrier": ["original", "padded", "hierarchical", "all_to_all", None],
        "bcast": ["binomial", "original", "limited", "numa", None],
        "alltoall": ["bruck", "all_at_once", "pairwise", "tiled", None]}
SIZES = [0, 16, 100, 4096, 5000, 300000]     # 16: in the slot header's line; 4096: the built-in inline slot


def cases(n):
    out = [("barrier", a, 0, 0) for a in ALGS["barrier"]]
    out += [("bcast", a, nb, root) for a in ALGS["bcast"] for nb in SIZES for root in range(n)]
    out += [("alltoall", a, nb, 0) for a in ALGS["alltoall"] for nb in SIZES]
    return out


def _job(comm, todo):
    """Per case: (measured column of this rank, the schedule's traffic,
    data right)."""
    n, me = comm.size, comm.rank
    out = []
    for i, (op, alg, nbytes, root) in enumerate(todo):
        sched = np.asarray(comm.schedule(op, nbytes, root=root, algorithm=alg).traffic(), np.int64)
        ok = True
        before = np.array(comm.traffic(), np.int64, copy=True)
        if op == "barrier":
            comm.Barrier(alg)
        elif op == "bcast":
            want = pattern(nbytes, np.int8, i, root)
            buf = want.copy() if me == root else poison(nbytes, np.int8)
            comm.Bcast(buf, root=root, algorithm=alg)
            ok = buf.tobytes() == want.tobytes()
        else:
            send = pattern(n * nbytes, np.int8, i, me).reshape(n, nbytes)
            recv = poison(n * nbytes, np.int8).reshape(n, nbytes)
            comm.Alltoall(send, recv, algorithm=alg)
            want = np.stack([pattern(n * nbytes, np.int8, i, j).reshape(n, nbytes)[me] for j in range(n)])
            ok = recv.tobytes() == want.tobytes()
        after = np.array(comm.traffic(), np.int64, copy=True)
        out.append((after - before, sched, bool(ok)))
    return out


def off_diagonal(a):
    a = np.array(a, np.int64, copy=True)
    np.fill_diagonal(a, 0)
    return a


@pytest.mark.parametrize("opts", [{}, SMALL], ids=["default", "small"])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_recorded_traffic_equals_schedule(n, opts):
    todo = cases(n)
    got = run_ranks(_job, n, todo, timeout=90, options=dict(opts, record_traffic=1))
    bad = []
    for i, (op, alg, nbytes, root) in enumerate(todo):
        cols = [got[d][i][0] for d in range(n)]
        assert all(c.shape == (n,) for c in cols), (op, alg, [c.shape for c in cols])
        measured = np.stack(cols, axis=1)                 # [src, dst]
        sched = got[0][i][1]
        what = f"{op} {alg or 'auto'} {nbytes} B root {root} on {n} ranks"
        for d in range(n):
            assert got[d][i][2], f"{what}: rank {d} got wrong data"
            if not np.array_equal(got[d][i][1], sched):
                bad.append(f"{what}: rank {d} plans other traffic than rank 0")
        assert sched.shape == (n, n), (what, sched.shape)
        if np.diagonal(measured).any():
            bad.append(f"{what}: local copies counted: {np.diagonal(measured).tolist()}")
        if not np.array_equal(measured, off_diagonal(sched)):
            bad.append(f"{what}: recorded\n{measured}\nschedule says\n{off_diagonal(sched)}")
        # what any correct algorithm must move
        recv = off_diagonal(sched).sum(axis=0)
        if op == "bcast":
            need = np.full(n, nbytes)
            need[root] = 0
            if (recv < need).any():
                bad.append(f"{what}: some rank receives less than the message: {recv.tolist()}")
            if off_diagonal(sched)[:, root].any():
                bad.append(f"{what}: the root receives data: {sched[:, root].tolist()}")
        elif op == "alltoall":
            if (recv < (n - 1) * nbytes).any():
                bad.append(f"{what}: some rank receives less than its {n - 1} blocks: {recv.tolist()}")
        elif off_diagonal(sched).any():
            bad.append(f"{what}: a barrier moves data: {sched.tolist()}")
    assert bad == [], "\n".join(bad[:10])


def _schedules(comm, todo):
    return [np.asarray(comm.schedule(op, nb, root=root, algorithm=alg).traffic(), np.int64)
            for op, alg, nb, root in todo]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_schedule_traffic_of_direct_algorithms(n):
    """pairwise / all_at_once: every ordered pair src != dst moves one block;
    bcast original: every non-root reads nbytes from the root, nothing else."""
    todo = [("alltoall", a, nb, 0) for a in ("pairwise", "all_at_once") for nb in SIZES]
    todo += [("bcast", "original", nb, root) for nb in SIZES for root in range(n)]
    got = run_ranks(_schedules, n, todo, timeout=60)[0]
    for (op, alg, nb, root), t in zip(todo, got):
        want = np.zeros((n, n), np.int64)
        if op == "alltoall":
            want[:] = nb
        else:
            want[root, :] = nb
        assert np.array_equal(off_diagonal(t), off_diagonal(want)), f"{op} {alg} {nb} B root {root}:\n{t}"
        # the same from the module-level planner
        m = np.asarray(shmcoll.schedule(op, alg, n, nb, root=root).traffic(), np.int64)
        assert np.array_equal(off_diagonal(m), off_diagonal(want)), f"shmcoll.schedule {op} {alg} {nb} B:\n{m}"


def steps_traffic(s, n):
    t = np.zeros((n, n), np.int64)
    for step in s.steps:
        for mv in step.moves:
            for d in mv.dst:
                if d != mv.src:
                    t[mv.src, d] += mv.nbytes
    return t


@pytest.mark.parametrize("op", ["barrier", "bcast", "alltoall"])
def test_schedule_traffic_is_the_sum_of_its_moves(op):
    """Schedule.traffic() is what its steps' moves say, for every algorithm,
    from the module-level planner; algorithm names are the documented ones."""
    names = [a for a in ALGS[op] if a]
    assert shmcoll.algorithms(op) == names
    count = 0
    for n in (1, 2, 3, 4, 5, 8):
        for alg in names:
            for nb in ([0] if op == "barrier" else SIZES):
                for root in (range(n) if op == "bcast" else [0]):
                    s = shmcoll.schedule(op, alg, n, nb, root=root)
                    t = np.asarray(s.traffic(), np.int64)
                    assert t.shape == (n, n)
                    assert np.array_equal(off_diagonal(t), steps_traffic(s, n)), f"{op} {alg} n={n} {nb} B root {root}"
                    count += 1
    assert count > 0


@pytest.mark.parametrize("op", ["barrier", "bcast", "alltoall"])
def test_module_schedule_without_algorithm_is_the_automatic_choice(op):
    """shmcoll.schedule(op, None, ...) plans what a Comm would choose (it
    raised TypeError: the name check ran before the choice)."""
    for n in (1, 2, 3, 5, 8):
        for nb in ([0] if op == "barrier" else SIZES):
            auto = shmcoll.schedule(op, None, n, nb)
            named = shmcoll.schedule(op, auto.algorithm, n, nb)
            assert auto.algorithm in shmcoll.algorithms(op)
            assert np.array_equal(auto.traffic(), named.traffic()) and len(auto.steps) == len(named.steps), \
                f"{op} n={n} {nb} B"
