"""shmcoll.Pool: the Executor and multiprocessing.Pool interfaces against
plain Python (the reference), arrays through the rings against numpy,
and workers that die: their task raises WorkerDied, the rest complete,
the pool keeps its size and leaves no process behind."""
import concurrent.futures as cf
import ctypes
import multiprocessing
import os
import signal
import threading

import numpy as np
import pytest

import shmcoll
from shmcoll import chan, pool as pool_mod

CPUS = len(os.sched_getaffinity(0))


def square(x):
    return x * x


def add(a, b=0, *, c=0):
    return a + b + c


def pid(_=None):
    return os.getpid()


def boom(x):
    raise ValueError(f"bad {x}")


def twice(a):
    return a * 2


def echo(x):
    return x


def unpicklable_result(_):
    return threading.Lock()


def die(how, x=None):
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "segv":
        ctypes.string_at(0)
    if how == "exit":
        os._exit(7)
    return x


_state = {}


def remember(value):
    _state["v"] = value


def recall(_):
    return _state.get("v")


def alive(pids):
    out = []
    for p in pids:
        try:
            os.kill(p, 0)
            out.append(p)
        except ProcessLookupError:
            pass
    return out


@pytest.fixture
def pool():
    with shmcoll.Pool(2) as p:
        yield p


def test_submit_and_executor_map_agree_with_python(pool):
    assert pool.submit(add, 1, 2, c=3).result(30) == 6
    xs = list(range(-50, 1000))
    assert pool.map(square, xs) == [x * x for x in xs]
    assert list(pool.map(add, range(10), range(100, 107))) == [a + b for a, b in zip(range(10), range(100, 107))]
    assert pool.map(square, []) == []


@pytest.mark.parametrize("chunksize", [None, 1, 3, 7, 1000])
def test_multiprocessing_calls_agree_with_python(pool, chunksize):
    xs = list(range(101))
    want = [x * x for x in xs]
    assert pool.map(square, iter(xs), chunksize) == want
    assert pool.starmap(add, [(x, 1) for x in xs], chunksize) == [x + 1 for x in xs]
    assert list(pool.imap(square, xs, chunksize or 1)) == want
    assert sorted(pool.imap_unordered(square, xs, chunksize or 1)) == sorted(want)
    assert pool.apply(add, (2, 3), {"c": 4}) == 9


def test_bad_chunksize_raises(pool):
    with pytest.raises(ValueError, match="chunksize"):
        pool.map(square, range(4), chunksize=0)


def test_apply_async_and_callbacks(pool):
    got, errs = [], []
    done = threading.Event()
    ok = pool.apply_async(square, (12,), callback=got.append)
    bad = pool.apply_async(boom, (5,), error_callback=lambda e: (errs.append(e), done.set()))
    assert ok.get(30) == 144
    with pytest.raises(ValueError, match="bad 5"):
        bad.get(30)
    assert done.wait(30)
    assert ok.ready() and ok.successful() and not bad.successful()
    assert got == [144] and isinstance(errs[0], ValueError)


def test_exception_carries_the_remote_traceback(pool):
    fut = pool.submit(boom, 3)
    with pytest.raises(ValueError, match="bad 3") as info:
        fut.result(30)
    assert "in boom" in str(info.value.__cause__)
    assert isinstance(fut.exception(30), ValueError)
    with pytest.raises(ValueError, match="bad 1"):
        pool.map(boom, [1, 2])


def test_unpicklable_task_and_result_raise(pool):
    with pytest.raises(Exception):
        pool.submit(lambda: 1).result(30)
    with pytest.raises(RuntimeError, match="not picklable"):
        pool.submit(unpicklable_result, 0).result(30)
    assert pool.submit(square, 5).result(30) == 25      # the pool is fine after both


@pytest.mark.parametrize("dtype", [np.float64, np.int8, np.complex128, np.float32])
@pytest.mark.parametrize("n", [0, 1, 4095, (chan.CHAN // 8) + 1, (24 << 20) // 8])
def test_arrays_through_the_rings(pool, dtype, n):
    a = (np.arange(n) % 251).astype(dtype)
    b = pool.submit(twice, a).result(60)
    np.testing.assert_array_equal(b, a * 2)
    assert b.dtype == a.dtype and b.flags.writeable and b.ctypes.data % 64 == 0


def test_views_objects_and_several_arrays(pool):
    a = np.arange(30.0).reshape(5, 6)
    value = {"t": a.T, "s": a[::2, 1:], "f": np.asfortranarray(a), "x": [a, "text", 3]}
    got = pool.submit(echo, value).result(30)
    for k in ("t", "s", "f"):
        np.testing.assert_array_equal(got[k], value[k])
    np.testing.assert_array_equal(got["x"][0], a)
    assert got["x"][1:] == ["text", 3]


def test_timeouts(pool):
    import time
    slow = pool.submit(time.sleep, 0.5)
    with pytest.raises(cf.TimeoutError):
        slow.result(0.01)
    ar = pool.apply_async(time.sleep, (0.5,))
    with pytest.raises(multiprocessing.TimeoutError):
        ar.get(0.01)
    with pytest.raises(TimeoutError):
        pool.map(time.sleep, [0.5, 0.5], timeout=0.01)
    slow.result(30)


def test_initializer_runs_in_every_worker():
    with shmcoll.Pool(2, initializer=remember, initargs=("hello",)) as p:
        assert p.map(recall, range(8), 1) == ["hello"] * 8


def test_shutdown_waits_for_submitted_then_refuses():
    p = shmcoll.Pool(2)
    fs = [p.submit(square, i) for i in range(50)]
    pids = p.map(pid, range(8), 1)
    p.shutdown(wait=True)
    assert [f.result(0) for f in fs] == [i * i for i in range(50)]
    assert alive(set(pids)) == []
    with pytest.raises(RuntimeError, match="shutdown"):
        p.submit(square, 1)


def test_shutdown_cancel_futures():
    import time
    p = shmcoll.Pool(1)
    first = p.submit(time.sleep, 0.3)
    rest = [p.submit(square, i) for i in range(20)]
    p.shutdown(wait=True, cancel_futures=True)
    assert first.result(0) is None
    assert any(f.cancelled() for f in rest)
    assert all(f.cancelled() or f.result(0) == i * i for i, f in enumerate(rest))


def test_terminate_kills_workers_and_fails_pending():
    import time
    p = shmcoll.Pool(2)
    pids = set(p.map(pid, range(8), 1))
    fs = [p.submit(time.sleep, 5) for _ in range(4)]
    p.terminate()
    assert all(f.done() for f in fs)
    assert alive(pids) == []


@pytest.mark.parametrize("how", ["kill", "segv", "exit"])
def test_a_dead_worker_fails_its_task_only(how):
    with shmcoll.Pool(2) as p:
        before = set(p.map(pid, range(8), 1))
        fs = [p.submit(square, i) for i in range(20)]
        doomed = p.submit(die, how)
        more = [p.submit(square, i) for i in range(20, 40)]
        with pytest.raises(shmcoll.WorkerDied) as info:
            doomed.result(60)
        e = info.value
        assert e.pid in before
        if how == "exit":
            assert e.exitcode == 7 and e.signal is None
        else:
            assert e.signal == (signal.SIGKILL if how == "kill" else signal.SIGSEGV)
        assert [f.result(60) for f in fs + more] == [i * i for i in range(40)]
        after = set(p.map(pid, range(16), 1))
        assert len(p._core._workers) == 2 and e.pid not in after
        assert alive([e.pid]) == []


def test_many_deaths_in_a_map_keep_the_pool_whole():
    """Every task either completes or raises WorkerDied; no hang, the
    pool keeps its size."""
    with shmcoll.Pool(2) as p:
        fs = [p.submit(die, "kill" if i % 5 == 0 else "none", i) for i in range(60)]
        for i, f in enumerate(fs):
            if i % 5 == 0:
                assert isinstance(f.exception(60), shmcoll.WorkerDied)
            else:
                assert f.result(60) == i
        assert len(set(p.map(pid, range(32), 1))) <= 2
        assert p.map(square, range(100)) == [x * x for x in range(100)]


def test_concurrent_submitters(pool):
    out = {}

    def user(k):
        out[k] = [pool.submit(add, k, i).result(60) for i in range(200)]
    threads = [threading.Thread(target=user, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert out == {k: [k + i for i in range(200)] for k in range(4)}


def test_as_completed_without_result_calls(pool):
    fs = [pool.submit(square, i) for i in range(30)]
    assert sorted(f.result() for f in cf.as_completed(fs, timeout=60)) == [i * i for i in range(30)]
    done, _ = cf.wait([pool.submit(square, 3)], timeout=60)
    assert [f.result() for f in done] == [9]


@pytest.mark.parametrize("n", sorted({1, 3, CPUS + 1}))
def test_worker_counts(n):
    with shmcoll.Pool(n) as p:
        assert p.map(square, range(97)) == [x * x for x in range(97)]
        assert len(set(p.map(pid, range(8 * n), 1))) <= n


def test_bad_sizes_raise():
    with pytest.raises(ValueError):
        shmcoll.Pool(0)
    with pytest.raises(TypeError):
        shmcoll.Pool("2")


def reduce_part(comm, k):
    a = (np.arange(1000) * (comm.rank + 1) + k).astype(np.float64)
    comm.Allreduce(shmcoll.IN_PLACE, a)
    return a, id(comm), comm.rank, comm.size


def refuse(comm, who):
    if comm.rank == who:
        raise KeyError(f"rank {who} refuses")
    comm.Barrier()


def kill_in_run(comm, who):
    if comm.rank == who:
        os.kill(os.getpid(), signal.SIGKILL)
    comm.Barrier()


def stall(comm, seconds):
    import time
    if comm.rank == 0:
        time.sleep(seconds)
    comm.Barrier()


@pytest.mark.parametrize("n", [1, 2, 3])
def test_run_is_spmd_with_a_warm_communicator(n):
    with shmcoll.Pool(n) as p:
        first = p.run(reduce_part, 5)
        again = p.run(reduce_part, 7)
        for k, out in ((5, first), (7, again)):
            want = sum((np.arange(1000) * (r + 1) + k).astype(np.float64) for r in range(n))
            assert [o[2:] for o in out] == [(r, n) for r in range(n)]
            for o in out:
                np.testing.assert_array_equal(o[0], want)
        assert [o[1] for o in first] == [o[1] for o in again]     # the same Comm, kept


def test_run_raises_a_members_error_then_runs_again():
    with shmcoll.Pool(3) as p:
        with pytest.raises(KeyError, match="rank 1 refuses"):
            p.run(refuse, 1)
        assert [o[2] for o in p.run(reduce_part, 0)] == [0, 1, 2]


def test_run_with_a_killed_member_raises_peer_died_then_rebuilds():
    import time
    with shmcoll.Pool(3) as p:
        p.run(reduce_part, 0)
        pids = p.map(pid, range(12), 1)
        t = time.monotonic()
        with pytest.raises(shmcoll.PeerDied) as info:
            p.run(kill_in_run, 2)
        assert time.monotonic() - t < 5
        assert info.value.rank == 2 and isinstance(info.value.__cause__, shmcoll.WorkerDied)
        out = p.run(reduce_part, 1)
        assert [o[2] for o in out] == [0, 1, 2]
        assert len(set(p.map(pid, range(12), 1)) - set(pids)) >= 1


@pytest.mark.parametrize("seconds", [2, 600])
def test_run_timeout_aborts_the_members(seconds):
    """A member still busy GRACE_S after the abort is killed and replaced."""
    import time
    with shmcoll.Pool(2) as p:
        t = time.monotonic()
        with pytest.raises(TimeoutError, match="killed" if seconds > pool_mod.GRACE_S else "aborted$"):
            p.run(stall, seconds, timeout=0.2)
        assert time.monotonic() - t < pool_mod.GRACE_S + 10
        assert [o[2] for o in p.run(reduce_part, 0)] == [0, 1]


def resilient(comm, victims):
    """Allreduce; a victim dies first; the survivors shrink and reduce again."""
    try:
        if comm.rank in victims:
            os.kill(os.getpid(), signal.SIGKILL)
        comm.Barrier()
    except shmcoll.PeerFailure:
        comm = comm.Shrink()
    x = np.arange(64) * (comm.rank + 1.0)
    comm.Allreduce(shmcoll.IN_PLACE, x)
    return comm.rank, comm.size, x


def shrink_unasked(comm):
    return comm.Shrink()


@pytest.mark.parametrize("n,victims", [(3, {0}), (3, {2}), (4, {1}), (4, {0, 3}), (3, set())])
def test_shrink_carries_on_with_the_survivors(n, victims):
    with shmcoll.Pool(n) as p:
        out = p.run(resilient, victims, on_failure="shrink")
        alive_ranks = [r for r in range(n) if r not in victims]
        k = len(alive_ranks)
        want = sum(np.arange(64) * (r + 1.0) for r in range(k))
        for r in range(n):
            if r in victims:
                assert isinstance(out[r], shmcoll.WorkerDied) and out[r].signal == signal.SIGKILL
            else:
                rank, size, x = out[r]
                assert (rank, size) == (alive_ranks.index(r), k)
                np.testing.assert_array_equal(x, want)
        assert [o[:2] for o in p.run(resilient, set())] == [(r, n) for r in range(n)]   # whole again


def test_shrink_needs_the_shrink_run():
    with shmcoll.Pool(2) as p:
        with pytest.raises(NotImplementedError, match="on_failure='shrink'"):
            p.run(shrink_unasked)
        with pytest.raises(ValueError, match="on_failure"):
            p.run(shrink_unasked, on_failure="retry")


def test_kill_campaign():
    """Random SIGKILLs during map, submit and run (shrink and rebuild):
    every task completes or raises WorkerDied, no hang, the pool keeps
    its size; nothing is left running."""
    import random
    rng = random.Random(46)
    with shmcoll.Pool(3) as p:
        seen = set()
        for round_ in range(8):
            marks = [rng.random() < 0.1 for _ in range(40)]
            fs = [p.submit(die, "kill" if m else "none", i) for i, m in enumerate(marks)]
            for i, (m, f) in enumerate(zip(marks, fs)):
                if m:
                    assert isinstance(f.exception(60), shmcoll.WorkerDied)
                else:
                    assert f.result(60) == i
            victims = {rng.randrange(3)}
            out = p.run(resilient, victims, on_failure="shrink")
            assert sum(isinstance(o, shmcoll.WorkerDied) for o in out) == 1
            with pytest.raises(shmcoll.PeerDied):
                p.run(kill_in_run, rng.randrange(3))
            pids = set(p.map(pid, range(30), 1))
            assert len(pids) <= 3
            seen |= pids
        assert p.map(square, range(200)) == [x * x for x in range(200)]
    assert alive(seen) == []


def test_kept_blocks_never_alias_a_live_result(pool):
    """Message blocks are reused once nothing refers to them: results held,
    views of them held, and results dropped, all stay right."""
    n = (2 << 20) // 8
    held, views = [], []
    for k in range(8):
        a = np.full(n, float(k))
        out = pool.submit(twice, a).result(60)
        if k % 3 == 0:
            held.append((k, out))
        elif k % 3 == 1:
            views.append((k, out[::7]))
        del out
    for k, out in held:
        np.testing.assert_array_equal(out, np.full(n, 2.0 * k))
    for k, v in views:
        np.testing.assert_array_equal(v, np.full(len(v), 2.0 * k))


def test_shutdown_while_processes_forked_later_live():
    """Children forked after the pool (another pool's workers) inherit its
    descriptors; its shutdown must not wait for them."""
    p = shmcoll.Pool(2)
    with multiprocessing.get_context("fork").Pool(1) as other:
        assert p.submit(square, 4).result(30) == 16
        done = threading.Event()
        t = threading.Thread(target=lambda: (p.shutdown(wait=True), done.set()), daemon=True)
        t.start()
        assert done.wait(30), "shutdown hung while a later child lived"
        assert other.apply(square, (3,)) == 9


def test_a_done_callback_may_wait_on_other_tasks(pool):
    """Callbacks run in the thread that read the result; one that waits on
    another future must not wait on that thread (it hung before)."""
    got, done = [], threading.Event()

    def then(f):
        got.append(pool.submit(square, f.result() + 1).result(30))
        got.append(pool.map(square, range(4)))
        done.set()
    f = pool.submit(square, 3)
    f.add_done_callback(then)
    assert f.result(30) == 9 and done.wait(30)
    assert got == [100, [0, 1, 4, 9]]


def fork_and_return(x):
    """The child returns out of the task too, as the parent does."""
    os.fork()
    return x


def test_a_process_forked_in_a_task_leaves_quietly(pool):
    """It must not go on as a second reader of the worker's ring."""
    assert [pool.submit(fork_and_return, i).result(30) for i in range(10)] == list(range(10))
    assert pool.map(square, range(200), 1) == [x * x for x in range(200)]


class TwoArgError(Exception):
    """Pickles, but does not unpickle (its __init__ takes two arguments)."""

    def __init__(self, a, b):
        super().__init__(f"{a} {b}")


def raise_two_arg(_):
    raise TwoArgError(1, 2)


def raise_timeout(_):
    raise TimeoutError("the task's own")


def bad_init():
    raise ValueError("initializer refuses")


def test_an_error_that_does_not_unpickle_fails_its_task_only(pool):
    with pytest.raises(RuntimeError, match="could not be unpickled"):
        pool.submit(raise_two_arg, 0).result(30)
    assert pool.map(square, range(10)) == [x * x for x in range(10)]


def test_a_tasks_own_timeout_error_is_its_error(pool):
    with pytest.raises(TimeoutError, match="the task's own"):
        pool.map(raise_timeout, range(3))
    with pytest.raises(TimeoutError, match="the task's own"):
        pool.apply_async(raise_timeout, (1,)).get(30)


def test_map_zips_an_endless_iterable_with_a_finite_one(pool):
    import itertools
    assert pool.map(add, range(5), itertools.count(10)) == [a + b for a, b in zip(range(5), itertools.count(10))]


def test_an_initializer_that_raises_breaks_the_pool_instead_of_respawning():
    with shmcoll.Pool(2, initializer=bad_init) as p:
        with pytest.raises(RuntimeError, match="died before their first task"):
            p.submit(square, 1).result(60)
        with pytest.raises(RuntimeError):
            p.submit(square, 1)


def test_workers_are_watched_with_sigchld_ignored():
    old = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        with shmcoll.Pool(2) as p:
            with pytest.raises(shmcoll.WorkerDied):
                p.submit(die, "kill").result(30)
            assert p.map(square, range(20), 1) == [x * x for x in range(20)]
    finally:
        signal.signal(signal.SIGCHLD, old)


class _Interrupting:
    """chan's lib, but the main thread gets SIGINT right after the first
    piece of the next message it moves (name: the call that moves it)."""

    def __init__(self, name):
        self.real, self.name, self.armed = chan.lib, name, True

    def __getattr__(self, attr):
        call = getattr(self.real, attr)
        if attr != self.name:
            return call

        def moved(*args):
            n = call(*args)
            if self.armed and threading.current_thread() is threading.main_thread():
                self.armed = False
                os.kill(os.getpid(), signal.SIGINT)
            return n
        return moved


@pytest.mark.parametrize("where", ["result", "submit"])
def test_ctrl_c_mid_message_leaves_the_pool_working(pool, monkeypatch, where):
    """Ctrl-C lands once the message is whole: the ring is not cut (a cut
    one garbles the tasks after it, or kills the worker that reads it)."""
    pids = set(pool.map(pid, range(8), 1))
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    a = np.arange(1000.0)
    try:
        if where == "result":
            f = pool.submit(twice, a)
            monkeypatch.setattr(chan, "lib", _Interrupting("sc_chan_get"))
            with pool._core._reading:           # this thread reads the result, not the manager
                with pytest.raises(KeyboardInterrupt):
                    f.result(30)
            np.testing.assert_array_equal(f.result(30), a * 2)      # delivered, not lost
        else:
            monkeypatch.setattr(chan, "lib", _Interrupting("sc_chan_put"))
            with pytest.raises(KeyboardInterrupt):
                pool.submit(twice, a)           # a message of two parts: header and pickle, then the array
        assert not chan.lib.armed
    finally:
        monkeypatch.undo()
        signal.signal(signal.SIGINT, old)
    fs = [pool.submit(twice, a + i) for i in range(6)]
    for i, f in enumerate(fs):
        np.testing.assert_array_equal(f.result(30), (a + i) * 2)
    assert pool.map(square, range(50), 1) == [x * x for x in range(50)]
    assert set(pool.map(pid, range(8), 1)) == pids


def _shm():
    return set(os.listdir("/dev/shm"))


@pytest.mark.timeout(90)
def test_tasks_pending_at_exit_complete(tmp_path):
    """As ProcessPoolExecutor: a program that ends without shutdown waits
    for the tasks it submitted; no worker and nothing in /dev/shm stays."""
    import subprocess
    import sys
    code = f"""
import os, time, shmcoll
def slow(i):
    time.sleep(0.3)
    open(os.path.join({str(tmp_path)!r}, f"t{{i}}"), "w").close()
def wid(_=None):
    return os.getpid()
p = shmcoll.Pool(2)
p.run(wid)
print(*set(p.map(wid, range(8), 1)), flush=True)
fs = [p.submit(slow, i) for i in range(6)]
"""
    before = _shm()
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(shmcoll.__file__))))
    assert run.returncode == 0, run.stderr
    assert sorted(os.listdir(tmp_path)) == [f"t{i}" for i in range(6)]
    assert alive([int(x) for x in run.stdout.split()]) == []
    assert _shm() <= before


def _threads_end(core, timeout=30):
    for t in (core._manager, core._feeder, core._watcher):
        t.join(timeout)
        assert not t.is_alive(), t


@pytest.mark.timeout(60)
def test_a_dropped_pool_is_collected_and_its_workers_stop():
    import gc
    import weakref
    p = shmcoll.Pool(2)
    pids = set(p.map(pid, range(8), 1))
    f = p.submit(square, 7)
    core, ref = p._core, weakref.ref(p)
    del p
    gc.collect()
    assert ref() is None
    assert f.result(30) == 49           # the tasks submitted still run
    _threads_end(core)
    assert alive(pids) == []
    ref = weakref.ref(core)
    del core, f
    gc.collect()
    assert ref() is None                # nothing of it left running


@pytest.mark.timeout(60)
def test_shutdown_without_wait_ends_every_thread_once_the_work_is_done():
    p = shmcoll.Pool(2)
    pids = set(p.map(pid, range(8), 1))
    f = p.submit(square, 3)
    p.shutdown(wait=False)
    assert f.result(30) == 9
    _threads_end(p._core)
    assert alive(pids) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("drive", [True, False])
def test_a_done_callback_may_shut_the_pool_down(drive):
    """From the thread that read the result (result() here) it waits; from
    the pool's own thread (nobody waits in result()) it cannot wait for
    itself and says so, as ProcessPoolExecutor's; either way the pool
    finishes its tasks and stops (it hung)."""
    r, w = os.pipe()
    p = shmcoll.Pool(2)
    pids = set(p.map(pid, range(8), 1))
    blocked = p.submit(os.read, r, 1)   # still running when the callback waits
    first = p.submit(square, 3)
    errors, called = [], threading.Event()

    def stop(f):
        os.write(w, b"x")
        try:
            p.shutdown()
        except RuntimeError as e:
            errors.append(e)
        called.set()
    first.add_done_callback(stop)
    if drive:
        assert first.result(30) == 9
    else:
        assert cf.wait([first], 30).done == {first}
    assert called.wait(30)
    assert all("wait=False" in str(e) for e in errors) and (drive or errors)
    assert blocked.result(30) == b"x"
    p.shutdown()
    assert alive(pids) == []
    with pytest.raises(RuntimeError, match="shutdown"):
        p.submit(square, 1)


def block_on(r, w):
    os.write(w, b"s")
    return os.read(r, 1)


def stuck(comm, who):
    import time
    if comm.rank == who:
        time.sleep(600)
    comm.Barrier()


@pytest.mark.timeout(90)
def test_a_run_timeout_kills_no_unrelated_task(monkeypatch):
    """A member queued behind another task when the run times out is not
    running: its worker (and that task) live; the member fails when it
    starts; the member that runs, stuck, is killed."""
    import select
    monkeypatch.setattr(pool_mod, "GRACE_S", 1.0)
    r, w = os.pipe()
    r2, w2 = os.pipe()
    with shmcoll.Pool(2) as p:
        assert [o[2] for o in p.run(reduce_part, 0)] == [0, 1]     # a warm communicator: no attach to wait on
        other = p.submit(block_on, r, w2)
        assert select.select([r2], [], [], 30)[0] and os.read(r2, 1) == b"s"
        with pytest.raises(TimeoutError, match="1 members still running.*killed; 1 members queued"):
            p.run(stuck, 1 - p._core._tasks[other._tid].worker.index, timeout=0.2)
        os.write(w, b"x")
        assert other.result(30) == b"x"
        assert [o[2] for o in p.run(reduce_part, 0)] == [0, 1]


def test_map_async_and_starmap_async_as_multiprocessing(pool):
    got, errs, done = [], [], threading.Event()
    ok = pool.map_async(square, range(20), 3, callback=got.append)
    star = pool.starmap_async(add, [(i, 1) for i in range(5)])
    bad = pool.map_async(boom, range(4), 1, error_callback=lambda e: (errs.append(e), done.set()))
    assert ok.get(30) == [x * x for x in range(20)] and star.get(30) == [i + 1 for i in range(5)]
    ok.wait(30)
    assert ok.ready() and ok.successful() and got == [[x * x for x in range(20)]]
    with pytest.raises(ValueError, match="bad"):
        bad.get(30)
    assert done.wait(30) and isinstance(errs[0], ValueError) and not bad.successful()
    assert pool.map_async(square, []).get(30) == []
    import time
    slow = pool.map_async(time.sleep, [0.5])
    with pytest.raises(multiprocessing.TimeoutError):
        slow.get(0.01)
    with pytest.raises(ValueError, match="not ready"):
        slow.successful()
    assert slow.get(30) == [None]


def fail_at_2(x):
    if x == 2:
        raise ValueError(f"bad {x}")
    return x


def _drain(it):
    out = []
    while True:
        try:
            out.append(next(it))
        except StopIteration:
            return out
        except ValueError as e:
            out.append(str(e))


def test_imap_as_multiprocessing(pool):
    """next(timeout), and an error raised at its place, the iteration going
    on after it: what multiprocessing.Pool's imap does."""
    import time
    with multiprocessing.get_context("fork").Pool(2) as mp:
        for call in ("imap", "imap_unordered"):
            want = _drain(getattr(mp, call)(fail_at_2, range(6)))
            got = _drain(getattr(pool, call)(fail_at_2, range(6)))
            assert (got, sorted(got, key=str)) == (want, sorted(want, key=str)) if call == "imap" else \
                sorted(got, key=str) == sorted(want, key=str)
    for call in (pool.imap, pool.imap_unordered):
        it = call(time.sleep, [0.5])
        with pytest.raises(multiprocessing.TimeoutError):
            it.next(timeout=0.01)
        assert it.next(30) is None
        with pytest.raises(StopIteration):
            it.next(0)


def test_a_closed_pool_refuses_with_each_interfaces_error():
    """multiprocessing.Pool's calls raise its ValueError("Pool not
    running"); the Executor's submit its RuntimeError; map (both's) an
    error that is both."""
    for stop in ("close", "shutdown"):
        p = shmcoll.Pool(1)
        getattr(p, stop)()
        for call in (lambda: p.apply(square, (1,)), lambda: p.apply_async(square, (1,)),
                     lambda: p.map_async(square, []), lambda: p.starmap_async(add, []),
                     lambda: p.starmap(add, []), lambda: p.imap(square, []), lambda: p.imap_unordered(square, [])):
            with pytest.raises(ValueError, match="Pool not running"):
                call()
        with pytest.raises(RuntimeError, match="after shutdown"):
            p.submit(square, 1)
        with pytest.raises(RuntimeError) as info:
            p.map(square, [1])
        assert isinstance(info.value, ValueError)
        p.join()
