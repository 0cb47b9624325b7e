"""launch() / `shmcoll run` / init(): results, errors, peer failure
detection, pinning, timeouts and cleanup however a job ends."""
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import shmcoll
from conftest import RANKS_DIR, ROOT, SMALL, cli, expected_affinity, run_ranks, shared_array, taking_turns

DETECT_S = 2.0


def alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_gone(pids, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


# -- launch(): results and arguments -----------------------------------------

def _ident(comm, a, b=None):
    return comm.rank, comm.size, comm.Get_rank(), comm.Get_size(), a, b, repr(comm)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_launch_returns_results_in_rank_order(n):
    got = run_ranks(_ident, n, "x", [1, 2])
    assert got == [(r, n, r, n, "x", [1, 2], f"<shmcoll.Comm rank {r} of {n}>") for r in range(n)]


def test_launch_keyword_args_and_large_results():
    def job(comm, k):
        return np.full(1 << 20, comm.rank * k, np.int64)       # 8 MiB through the result pipe
    got = shmcoll.launch(job, 2, args=(3,), timeout=60)
    for r, a in enumerate(got):
        assert a.shape == (1 << 20,) and (a == r * 3).all()


@pytest.mark.parametrize("kw,words", [({"bind": "cpu"}, ["bind", "cpu"]), ({"map": "diagonal"}, ["map", "diagonal"]),
                                      ({"topology": "2y4"}, ["topology", "2y4"]),
                                      ({"options": {"chunk_size": 1}}, ["chunk_size"])])
def test_launch_rejects_bad_arguments(kw, words):
    with pytest.raises(ValueError) as ei:
        shmcoll.launch(_ident, 2, args=(0,), timeout=30, **kw)
    for w in words:
        assert w in str(ei.value)


@pytest.mark.parametrize("n", [0, -1])
def test_launch_rejects_bad_nprocs(n):
    with pytest.raises(ValueError, match=f"n(procs|ranks).*{n}"):
        shmcoll.launch(_ident, n, args=(0,), timeout=30)


def test_result_not_picklable():
    def job(comm):
        return (lambda: 0) if comm.rank == 1 else comm.rank
    with pytest.raises(RuntimeError, match="picklable") as ei:
        run_ranks(job, 2)
    assert ei.value.rank == 1


def test_rank_exits_without_result():
    def job(comm):
        if comm.rank == 1:
            os._exit(3)
        return comm.rank
    with pytest.raises(shmcoll.PeerFailure) as ei:
        run_ranks(job, 3)
    assert ei.value.rank == 1 and "3" in str(ei.value)


def test_launch_timeout_kills_every_rank():
    pids = shared_array(3, np.int64)

    def job(comm):
        pids[comm.rank] = os.getpid()
        if comm.rank == 0:
            time.sleep(300)
        comm.Barrier()
    t = time.monotonic()
    with pytest.raises(TimeoutError):
        shmcoll.launch(job, 3, timeout=1.5)
    assert time.monotonic() - t < 10
    assert all(pids), pids
    assert wait_gone(pids.tolist(), 5) == []


def test_launch_back_to_back_jobs():
    for i in range(20):
        assert run_ranks(lambda c, i: (c.rank, i), 2, i) == [(0, i), (1, i)]


# -- an exception in one rank ------------------------------------------------------

def _raise_job(comm, out, what):
    if comm.rank == 1:
        if what == "raise":
            raise KeyError("rank 1 fails on purpose")
        return "left early"                  # returns while the others wait
    t = time.monotonic()
    try:
        comm.Barrier()
        out[comm.rank] = (1, -1, time.monotonic() - t)
    except shmcoll.PeerDied as e:
        out[comm.rank] = (2, e.rank, time.monotonic() - t)
        raise
    except shmcoll.PeerAborted as e:
        out[comm.rank] = (3, e.rank, time.monotonic() - t)
        raise
    except Exception:
        out[comm.rank] = (4, -1, time.monotonic() - t)
        raise


@pytest.mark.parametrize("n", [2, 4])
def test_exception_in_one_rank_is_reraised(n):
    out = shared_array((n, 3), np.float64, fill=-9)
    with pytest.raises(KeyError, match="fails on purpose") as ei:
        run_ranks(_raise_job, n, out, "raise")
    assert ei.value.rank == 1
    assert "rank 1 fails on purpose" in str(ei.value.__cause__)     # the remote traceback
    for r in range(n):
        if r != 1:
            code, who, dt = out[r]
            assert code in (2, 3) and who == 1, f"rank {r}: {out[r]}"
            assert code == 3, f"rank {r}: a raising peer should read as PeerAborted, got PeerDied"
            assert dt < DETECT_S


@pytest.mark.parametrize("n", [2, 3])
def test_rank_returning_early_is_a_peer_failure(n):
    out = shared_array((n, 3), np.float64, fill=-9)
    with pytest.raises(shmcoll.PeerFailure):
        run_ranks(_raise_job, n, out, "return")
    for r in range(n):
        if r != 1:
            code, who, dt = out[r]
            assert code in (2, 3) and who == 1 and dt < DETECT_S, f"rank {r}: {out[r]}"


# -- a rank killed with SIGKILL -------------------------------------------------------

def _victim_job(comm, out, op, victim, when):
    """`victim` is SIGKILLed just before (when=before) or while blocked in
    (when=inside) the collective; the others time the collective."""
    n, me = comm.size, comm.rank
    big = 20 * SMALL["chunk_bytes"] + 5          # more chunks than the ring holds
    root = victim if when == "before" else 0
    if op == "Bcast":
        buf = np.zeros(big, np.uint8) if me != root else np.arange(big, dtype=np.int64).astype(np.uint8)
    send = np.zeros((n, 3000), np.uint8)
    recv = np.empty_like(send)
    comm.Barrier()
    if me == victim:
        if when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Timer(0.15, os.kill, (os.getpid(), signal.SIGKILL)).start()
    elif when == "inside" and me == (victim + 1) % n:
        time.sleep(0.4)                          # keep the victim blocked in the collective
    t = time.monotonic()
    try:
        if op == "Barrier":
            comm.Barrier()
        elif op == "Bcast":
            comm.Bcast(buf, root=root)
        else:
            comm.Alltoall(send, recv)
        if me == victim:
            time.sleep(5)                        # the timer fires during this
        out[me] = (1, -1, time.monotonic() - t)
        # a collective that completed is fine only if the victim could not be needed;
        # the next one must fail
        t = time.monotonic()
        comm.Barrier()
        out[me] = (5, -1, time.monotonic() - t)
    except shmcoll.PeerDied as e:
        out[me] = (2, e.rank, time.monotonic() - t)
        raise
    except shmcoll.PeerFailure as e:
        out[me] = (3, e.rank, time.monotonic() - t)
        raise


OPS = ["Barrier", "Bcast", "Alltoall"]


@pytest.mark.parametrize("when", ["before", "inside"])
@pytest.mark.parametrize("n,victim", [(2, 1), (3, 1), (4, 2), (3, 0)])
@pytest.mark.parametrize("op", OPS)
def test_sigkilled_rank_is_detected(op, n, victim, when):
    out = shared_array((n, 3), np.float64, fill=-9)
    t = time.monotonic()
    with pytest.raises(shmcoll.PeerFailure):
        run_ranks(_victim_job, n, out, op, victim, when, options=SMALL)
    assert time.monotonic() - t < 30
    for r in range(n):
        if r == victim:
            continue
        code, who, dt = out[r]
        assert code in (2, 3), f"rank {r} did not raise PeerFailure: {out[r].tolist()}"
        assert who == victim, f"rank {r} blames rank {who}, not the killed rank {victim}"
        assert dt < DETECT_S, f"rank {r} took {dt:.2f} s to notice"
        assert code == 2, f"rank {r}: a SIGKILLed peer should read as PeerDied: {out[r].tolist()}"


@pytest.mark.parametrize("n,victim", [(2, 1), (3, 1), (3, 2), (3, 0)])
@pytest.mark.parametrize("op", OPS)
def test_launch_blames_the_killed_rank(op, n, victim):
    """launch() re-raises the root cause: the killed rank, not a survivor
    that reported its death."""
    out = shared_array((n, 3), np.float64, fill=-9)
    with pytest.raises(shmcoll.PeerFailure) as ei:
        run_ranks(_victim_job, n, out, op, victim, "before", options=SMALL)
    assert ei.value.rank == victim, f"launch() blamed rank {ei.value.rank}: {ei.value!r}"


# -- pinning under launch() ----------------------------------------------------------

def _affinity(comm):
    return sorted(os.sched_getaffinity(0))


PIN = [("core", None, 2), ("core", None, 3), ("socket", None, 3), ("numa", None, 2), ("none", None, 3),
       ("core", "2x2", 4), ("core", "2x4", 5), ("socket", "2x2", 4), ("none", "2x2", 3)]


@pytest.mark.parametrize("bind,topo,n", PIN, ids=[f"{b}-{t or 'real'}-{n}" for b, t, n in PIN])
def test_launch_pins_ranks(bind, topo, n):
    got = run_ranks(_affinity, n, bind=bind, topology=topo)
    want = [sorted(expected_affinity(r, n, bind, topo)) for r in range(n)]
    assert got == want


def test_pinning_does_not_leak_into_the_launcher():
    before = os.sched_getaffinity(0)
    run_ranks(_affinity, 3)
    assert os.sched_getaffinity(0) == before


# -- init() outside a job -------------------------------------------------------

def test_init_outside_a_job_is_a_one_rank_world():
    code = ("import numpy as np, shmcoll; c = shmcoll.init(); assert shmcoll.init() is c; "
            "b = np.arange(5); c.Bcast(b); c.Barrier(); r = np.empty_like(b); c.Alltoall(b, r); "
            "assert (r == b).all() and c.bcast([1, {2: 3}]) == [1, {2: 3}]; print(c.rank, c.size)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHMCOLL_")}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", "1"]


# -- shmcoll run ------------------------------------------------------------------

def run_cli(args, env=None, timeout=120, cwd=ROOT):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(cli("run", *args), env=e, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def expect_env(n, bind="core", topo=None):
    return {"EXPECT_AFFINITY": json.dumps([sorted(expected_affinity(r, n, bind, topo)) for r in range(n)])}


def ok_lines(n):
    return sorted(f"rank {r} of {n} ok" for r in range(n))


@pytest.mark.parametrize("n,bind,topo", [(3, "core", None), (1, "core", None), (2, "socket", None),
                                         (3, "none", None), (4, "core", "2x2"), (5, "socket", "2x4")])
def test_run_script(n, bind, topo):
    args = ["-n", str(n), "--bind", bind] + (["--topology", topo] if topo else [])
    p = run_cli(args + ["--", os.path.join(RANKS_DIR, "basic.py")], env=expect_env(n, bind, topo))
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.split("\n")[:-1]) == ok_lines(n)


def test_run_without_double_dash():
    p = run_cli(["-n", "2", os.path.join(RANKS_DIR, "basic.py")], env=expect_env(2))
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.split("\n")[:-1]) == ok_lines(2)


def test_run_module_form():
    p = run_cli(["-n", "3", "--", "-m", "ranks.basic"], env=dict(expect_env(3), PYTHONPATH=os.path.dirname(RANKS_DIR)))
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.split("\n")[:-1]) == ok_lines(3)


def test_run_code_form():
    code = ("import numpy as np, shmcoll; c = shmcoll.init(); b = np.full(3000, c.rank, np.int32); "
            "c.Bcast(b, root=c.size - 1); assert (b == c.size - 1).all(); c.Barrier(); "
            "import os; os.write(1, f'code {c.rank} {c.size}\\n'.encode())")
    p = run_cli(["-n", "3", "--", "-c", code])
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.split("\n")[:-1]) == [f"code {r} 3" for r in range(3)]


def test_run_console_script():
    exe = shutil.which("shmcoll")
    if exe is None:
        pytest.skip("no shmcoll console script on PATH")
    p = subprocess.run([exe, "run", "-n", "2", "--", os.path.join(RANKS_DIR, "basic.py")],
                       env=dict(os.environ, **expect_env(2)), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.split("\n")[:-1]) == ok_lines(2)


def test_run_plain_program():
    p = run_cli(["-n", "2", "--bind", "none", "--", "sh", "-c", 'echo "r=$SHMCOLL_RANK s=$SHMCOLL_SIZE"'])
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.split()) == ["r=0", "r=1", "s=2", "s=2"]


@pytest.mark.parametrize("how,status", [("raise", 1), ("exit7", 7), ("kill", 128 + 9)])
@pytest.mark.parametrize("n", [2, 3])
def test_run_failing_rank(how, status, n):
    t = time.monotonic()
    p = run_cli(["-n", str(n), "--", os.path.join(RANKS_DIR, "fail.py")], env={"FAIL_HOW": how})
    assert p.returncode == status, (p.returncode, p.stderr)
    assert time.monotonic() - t < 30
    assert "should not have" not in p.stdout
    if how == "raise":
        assert "rank 1 fails on purpose" in p.stderr


def test_run_usage_errors():
    p = subprocess.run(cli("run", "-n", "2"), capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "no command" in p.stderr
    p = subprocess.run(cli("nosuchcommand"), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_command(flag):
    """`shmcoll --help` is help, not a usage error: status 0 and a line per command."""
    from shmcoll.cli import COMMANDS
    p = subprocess.run(cli(flag), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert {line.split()[0] for line in p.stdout.splitlines() if line.startswith("  ")} == set(COMMANDS)


def start_hanging(tmp_path, n=3, extra=(), hold=0):
    env = dict(os.environ, SHMCOLL_TEST_DIR=str(tmp_path), SHMCOLL_TEST_HOLD=str(hold))
    log = open(tmp_path / "launcher.log", "w")
    p = subprocess.Popen(cli("run", "-n", str(n), *extra, "--", os.path.join(RANKS_DIR, "hang.py")),
                         env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    log.close()
    deadline = time.monotonic() + 60
    files = [tmp_path / f"rank{r}.pid" for r in range(n)]
    while not all(f.exists() for f in files):
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            raise AssertionError(f"ranks did not start: {(tmp_path / 'launcher.log').read_text()}")
        time.sleep(0.02)
    time.sleep(0.2)          # the Barrier waiters are asleep by now
    return p, [int(f.read_text()) for f in files]


def test_run_timeout_kills_a_hanging_job(tmp_path):
    t = time.monotonic()
    p, pids = start_hanging(tmp_path, extra=("--timeout", "3"))
    assert p.wait(timeout=60) == 124
    assert time.monotonic() - t < 30
    assert wait_gone(pids, 5) == []
    assert "timeout" in (tmp_path / "launcher.log").read_text()


def test_sigkill_of_the_launcher_kills_the_ranks(tmp_path):
    p, pids = start_hanging(tmp_path)
    assert all(alive(x) for x in pids)
    os.kill(p.pid, signal.SIGKILL)
    assert p.wait(timeout=30) == -signal.SIGKILL
    assert wait_gone(pids, 10) == [], "ranks outlived the launcher (PR_SET_PDEATHSIG)"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_the_launcher_stops_the_job(tmp_path, sig):
    p, pids = start_hanging(tmp_path)
    os.kill(p.pid, sig)
    code = p.wait(timeout=30)
    assert code != 0
    assert wait_gone(pids, 10) == []


@pytest.mark.parametrize("hold", [0, 1 << 30])
def test_killed_rank_in_run_releases_the_others(tmp_path, hold):
    """kill -9 of one rank of a hanging job: the Barrier waiters must notice,
    the launcher must exit non-zero with the first failure's status.  A
    rank holding 1 GiB is reported dead only after it freed it, by which
    time the others, which saw it die at once, have exited with 1: the
    status is still the dead rank's."""
    p, pids = start_hanging(tmp_path, hold=hold)
    os.kill(pids[0], signal.SIGKILL)       # the sleeping rank the others wait for
    assert p.wait(timeout=30) == 128 + 9
    assert wait_gone(pids, 10) == []


def _root_leaves_early(comm):
    n = 1 << 20
    a = np.arange(n, dtype=np.uint8) if comm.rank == 0 else np.zeros(n, np.uint8)
    if comm.rank == 2:
        time.sleep(0.3)     # rank 3 (its binomial child) waits meanwhile, rank 0 has left
    comm.Bcast(a, 0, algorithm="binomial")
    return bool((a == np.arange(n, dtype=np.uint8)).all())


def test_rank_returning_first_is_a_clean_exit():
    """A root that returns and exits while others still finish its Bcast is
    no failure: launch() marks its exit clean, so no peer raises PeerDied."""
    assert run_ranks(_root_leaves_early, 4, options={"liveness_ns": 1_000_000}) == [True] * 4


def test_freed_communicator_refuses():
    def job(comm):
        comm.Free()
        try:
            comm.Barrier()
        except shmcoll.ShmcollError as e:
            return str(e)
    assert all("freed" in m for m in run_ranks(job, 2))


def test_run_forwards_whole_lines():
    """Ranks write each line in small unbuffered pieces; `shmcoll run`
    forwards whole lines, so no two ranks' lines are spliced together."""
    code = ("import os, shmcoll\n"
            "c = shmcoll.init()\n"
            "for i in range(300):\n"
            "    for piece in (f'rank={c.rank}', f' line={i}', ' ' + 'x' * 40, '\\n'):\n"
            "        os.write(1, piece.encode())\n")
    p = subprocess.run([sys.executable, "-m", "shmcoll", "run", "-n", "3", "--timeout", "60", "--", "-c", code],
                       capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 900
    pattern = re.compile(r"rank=[012] line=\d+ x{40}")
    assert all(pattern.fullmatch(l) for l in lines), [l for l in lines if not pattern.fullmatch(l)][:3]
    for r in range(3):
        assert [int(l.split()[1][5:]) for l in lines if l.startswith(f"rank={r} ")] == list(range(300))


# -- many open descriptors in the launching process ----------------------------------

@pytest.fixture
def many_fds():
    """~1100 descriptors open in this process, so every pipe and pidfd the
    launcher opens next is numbered above FD_SETSIZE (1024)."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1400
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    null = os.open(os.devnull, os.O_RDONLY)
    fds = [null] + [os.dup(null) for _ in range(1100)]
    try:
        assert max(fds) >= 1024
        yield fds
    finally:
        for fd in fds:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_launch_with_descriptors_above_1024(many_fds):
    assert run_ranks(_ident, 2, "fds") == [(r, 2, r, 2, "fds", None, f"<shmcoll.Comm rank {r} of 2>") for r in range(2)]


def test_run_with_descriptors_above_1024(many_fds, capfd):
    code = ("import shmcoll, os; c = shmcoll.init(); c.Barrier(); "
            "os.write(1, f'rank {c.rank} of {c.size} ok\\n'.encode())")
    assert shmcoll.run(2, ["-c", code], bind="none", timeout=60) == 0
    assert sorted(capfd.readouterr().out.splitlines()) == ok_lines(2)


# -- argument checking: nprocs and timeout ----------------------------------------

BAD_NPROCS = [("2", TypeError), (2.0, TypeError), (True, TypeError), (None, TypeError), ([2], TypeError),
              (0, ValueError), (-3, ValueError), (1025, ValueError)]
BAD_TIMEOUTS = [("5", TypeError), (True, TypeError), ([1], TypeError),
                (0, ValueError), (-1, ValueError), (float("nan"), ValueError), (float("inf"), ValueError)]


def _must_not_run(comm):
    raise AssertionError("a rank ran despite bad arguments")


@pytest.mark.parametrize("nprocs,exc", BAD_NPROCS, ids=[repr(v) for v, _ in BAD_NPROCS])
def test_launch_and_run_check_nprocs(nprocs, exc):
    """A clear TypeError/ValueError naming nprocs and the bad value, not a
    comparison error from the planner; nothing starts."""
    for call in (lambda: shmcoll.launch(_must_not_run, nprocs, timeout=30),
                 lambda: shmcoll.run(nprocs, ["-c", "raise SystemExit(5)"], timeout=30)):
        with pytest.raises(exc) as ei:
            call()
        assert type(ei.value) is exc
        assert "nprocs" in str(ei.value) and repr(nprocs) in str(ei.value), str(ei.value)
        assert "not supported between" not in str(ei.value)


@pytest.mark.parametrize("timeout,exc", BAD_TIMEOUTS, ids=[repr(v) for v, _ in BAD_TIMEOUTS])
def test_launch_and_run_check_timeout(timeout, exc):
    for call in (lambda: shmcoll.launch(_must_not_run, 2, timeout=timeout),
                 lambda: shmcoll.run(2, ["-c", "raise SystemExit(5)"], timeout=timeout)):
        with pytest.raises(exc) as ei:
            call()
        assert type(ei.value) is exc
        assert "timeout" in str(ei.value) and repr(timeout) in str(ei.value), str(ei.value)


def test_launch_accepts_integral_nprocs_and_timeout():
    assert shmcoll.launch(lambda c: c.size, np.int64(2), timeout=np.float64(60)) == [2, 2]
    assert shmcoll.launch(lambda c: c.size, 1, timeout=60) == [1]


@pytest.mark.parametrize("args,word", [(["-n", "0"], "nprocs"), (["-n", "1025"], "nprocs"),
                                       (["-n", "2", "--timeout", "0"], "timeout"),
                                       (["-n", "2", "--timeout", "-5"], "timeout")])
def test_run_cli_reports_bad_nprocs_and_timeout_as_usage_errors(args, word):
    p = run_cli(args + ["--", "-c", "print('should not have run')"], timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert word in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "should not have run" not in p.stdout


# -- a rank that exits without ever calling init() ----------------------------------

@pytest.mark.parametrize("n,skip", [(3, 2), (3, 0), (2, 1)])
def test_run_rank_exiting_before_init_aborts_the_job(n, skip):
    """The rank exits 0 without registering: the launcher must abort the job
    (the others' Barrier raises, naming it) instead of letting them wait."""
    t = time.monotonic()
    p = run_cli(["-n", str(n), "--bind", "none", "--timeout", "60", "--", os.path.join(RANKS_DIR, "skip_init.py")],
                env={"SKIP_RANK": str(skip)}, timeout=90)
    took = time.monotonic() - t
    assert p.returncode not in (0, 124), (p.returncode, p.stdout, p.stderr)
    assert took < 15, f"the job took {took:.1f} s to end"
    assert "should not have" not in p.stdout
    caught = sorted(l.split(":")[0] for l in p.stdout.splitlines())
    assert caught == [f"rank {r} caught PeerAborted blaming rank {skip}" for r in range(n) if r != skip], p.stdout
    assert f"rank {skip} exited" in p.stderr, p.stderr


def test_launch_rank_exiting_before_registering_aborts_the_job(monkeypatch):
    """launch(): a forked rank that exits 0 before it registers (here: while
    being pinned) must not leave the others waiting for it."""
    from shmcoll import launcher
    pin = launcher._pin

    def exit_on_rank_1(job, rank):
        if rank == 1:
            os._exit(0)
        pin(job, rank)
    monkeypatch.setattr(launcher, "_pin", exit_on_rank_1)
    out = shared_array((3, 3), np.float64, fill=-9)
    t = time.monotonic()
    with pytest.raises(shmcoll.PeerFailure) as ei:
        shmcoll.launch(_raise_job, 3, args=(out, "raise"), timeout=30)
    assert time.monotonic() - t < 15
    assert ei.value.rank == 1 and "status 0" in str(ei.value)
    for r in (0, 2):
        code, who, dt = out[r]      # -9: it failed before its Barrier, in communicator creation
        assert code == -9 or (code in (2, 3) and who == 1), f"rank {r}: {out[r].tolist()}"


# -- the plan of exec'd ranks travels in a sealed memfd, not the environment ---------

MAX_ARG_STRLEN = 32 * 4096      # the kernel's limit on one environment string


def test_run_256_ranks():
    """`shmcoll run -n 256`: the plan no longer travels in one environment
    variable (E2BIG once it passed 128 KiB).  Plain programs keep the test
    fast; each rank sees the plan's descriptor, all of the same size (big
    plans: test_run_ranks_read_a_plan_over_128_kib)."""
    script = 'stat -L -c "$SHMCOLL_RANK %s" /proc/self/fd/$SHMCOLL_PLAN_FD'
    p = run_cli(["-n", "256", "--bind", "none", "--timeout", "120", "--", "sh", "-c", script], timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    got = sorted(tuple(int(x) for x in l.split()) for l in p.stdout.splitlines())
    assert [r for r, _ in got] == list(range(256)), p.stdout[-2000:]
    assert len({size for _, size in got}) == 1 and got[0][1] > 0, got[:3]


def test_run_ranks_read_a_plan_over_128_kib():
    """Real ranks (init() and collectives) with a plan far over 128 KiB: a
    3-rank job on a virtual topology of 4096 cores."""
    code = ("import os, pickle, numpy as np, shmcoll; c = shmcoll.init(); c.Barrier(); "
            "b = np.arange(1000) if c.rank == 1 else np.zeros(1000, np.int64); c.Bcast(b, root=1); "
            "assert (b == np.arange(1000)).all(); s = np.full((3, 5), c.rank); r = np.empty_like(s); "
            "c.Alltoall(s, r); assert (r == np.arange(3)[:, None]).all(); "
            "assert 'SHMCOLL_PLAN' not in os.environ; "
            "os.write(1, f'{c.rank} {c.size} {len(pickle.dumps(c.plan))}\\n'.encode())")
    p = run_cli(["-n", "3", "--topology", "4x1024", "--timeout", "60", "--", "-c", code], timeout=90)
    assert p.returncode == 0, p.stderr[-3000:]
    got = sorted(tuple(int(x) for x in l.split()) for l in p.stdout.splitlines())
    assert [g[:2] for g in got] == [(r, 3) for r in range(3)], p.stdout
    assert all(g[2] > MAX_ARG_STRLEN for g in got), got


def test_plan_fd_round_trip_is_sealed_and_closed():
    from shmcoll import launcher
    from shmcoll.device import make_plan
    topo = shmcoll.topology("4x1024")
    plan = make_plan(3, topo, topo.placement(3, "core", "compact"))
    fd = launcher._plan_fd(plan)
    try:
        assert os.fstat(fd).st_size > MAX_ARG_STRLEN
        assert not os.get_inheritable(fd)           # only the ranks it is passed to get it
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"x", 0)                  # sealed: no rank can change the others' plan
        dup = os.dup(fd)
        got = launcher._read_plan(dup)
        with pytest.raises(OSError):
            os.fstat(dup)                           # _read_plan closed it
    finally:
        os.close(fd)
    assert pickle.dumps(got) == pickle.dumps(plan)
    with pytest.raises(RuntimeError, match="SHMCOLL_PLAN_FD"):
        launcher._read_plan(dup)


# -- result pipes are read in small chunks ------------------------------------------

def test_launch_reads_result_pipes_in_chunks_of_64_kib_at_most(monkeypatch):
    """A large read (1 MiB) allocates a block glibc serves by mmap; freeing
    it raises glibc's mmap threshold in the caller for good, and its later
    large buffers alias (4K aliasing) and slow its collectives down.  The
    launcher must never ask for more than 64 KiB, however large a result."""
    sizes, real_read = [], os.read

    def read(fd, n):
        sizes.append(n)
        return real_read(fd, n)
    monkeypatch.setattr(os, "read", read)
    got = shmcoll.launch(lambda c: np.full(3 << 20, c.rank, np.uint8), 2, timeout=60)
    monkeypatch.undo()
    assert [a.shape == (3 << 20,) and (a == r).all() for r, a in enumerate(got)] == [True, True]
    assert sizes, "launch() no longer reads results with os.read: update this test"
    assert max(sizes) <= 1 << 16, sorted(set(sizes))


MMAP_PROBE = """
import ctypes, os, re, sys, tempfile
import shmcoll
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype, libc.malloc.restype = MallInfo2, ctypes.c_void_p
libc.fdopen.restype, libc.fdopen.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_char_p]
libc.malloc_info.argtypes, libc.fclose.argtypes = [ctypes.c_int, ctypes.c_void_p], [ctypes.c_void_p]
got = shmcoll.launch(lambda c, n: b"x" * n, 2, args=(int(sys.argv[1]),), timeout=60)
assert [len(g) for g in got] == [int(sys.argv[1])] * 2
# a free chunk in the heap (bins or top) as big as the probe serves it
# whatever the threshold: take every such chunk first (malloc serves a
# request from the bins and top before it considers mmap)
def largest():
    with tempfile.TemporaryFile() as t:
        f = libc.fdopen(os.dup(t.fileno()), b"w")
        libc.malloc_info(0, f)
        libc.fclose(f)
        t.seek(0)
        main = t.read().decode().split('<heap nr="1">')[0]
    return max([int(x) for x in re.findall(r'<size from="[0-9]+" to="([0-9]+)"', main)] + [libc.mallinfo2().keepcost])
held = []
while (big := largest()) >= 512 << 10:
    held.append(libc.malloc(big - 64))
# one probe only: freeing the probe's block (if mmapped) raises the threshold itself
before = libc.mallinfo2().hblks
p = libc.malloc(512 << 10)
print("mmapped" if libc.mallinfo2().hblks > before else "heap")
"""


@pytest.mark.parametrize("nbytes", [100, 60_000])
def test_launch_leaves_the_glibc_mmap_threshold_alone(nbytes):
    """After a launch() with small results, a 512 KiB malloc in the caller
    is still served by mmap (glibc's default threshold, 128 KiB): the
    launcher freed no large mmapped block (a 1 MiB read buffer at EOF did)
    that would have raised the threshold for the rest of the process.
    (Results over 128 KiB raise it whatever the launcher does: they are such
    blocks themselves.)"""
    if not hasattr(__import__("ctypes").CDLL(None), "mallinfo2"):
        pytest.skip("no glibc mallinfo2")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    p = subprocess.run([sys.executable, "-c", MMAP_PROBE, str(nbytes)], env=env, capture_output=True, text=True,
                       timeout=90)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["mmapped"], "something in import shmcoll / launch() raised glibc's mmap threshold"


# -- init() from a thread that then exits ----------------------------------------------

@pytest.mark.parametrize("n,threaded", [(2, "0"), (3, "1"), (3, "")], ids=["2-rank0", "3-rank1", "3-all"])
def test_run_init_from_a_thread_that_exits(n, threaded):
    """A rank that calls shmcoll.init() from a threading.Thread which then
    exits stays alive to its peers: later collectives succeed (they used to
    declare it dead once that thread was gone)."""
    env = {"THREAD_RANKS": threaded, "SHMCOLL_LIVENESS_NS": str(5_000_000), "LATE_S": "0.5"}
    t = time.monotonic()
    p = run_cli(["-n", str(n), "--bind", "none", "--timeout", "60", "--", os.path.join(RANKS_DIR, "thread_init.py")],
                env=env, timeout=90)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr[-3000:])
    assert time.monotonic() - t < 60
    assert sorted(l.split(" (")[0] for l in p.stdout.splitlines()) == ok_lines(n), p.stdout


# -- the launcher talks to the engine through Device.register / Device.rank_state -------

def test_launch_registers_ranks_with_the_launcher_as_tracer(monkeypatch):
    """launch(): every rank registers through Device.register(pid, tracer)
    with the launching process as tracer, so only the job's processes may
    ptrace or process_vm_readv it (PR_SET_PTRACER), not any of the user's."""
    import inspect
    from shmcoll import device
    orig = device.Device.register
    orig_takes_tracer = len(inspect.signature(orig).parameters) >= 3
    got = shared_array((3, 2), np.int64, fill=-1)

    def register(self, pid, tracer=None):
        got[self.rank] = (pid, -2 if tracer is None else tracer)
        return orig(self, pid, tracer) if orig_takes_tracer else orig(self, pid)
    monkeypatch.setattr(device.Device, "register", register)
    pids = run_ranks(lambda c: os.getpid(), 3)
    assert got[:, 0].tolist() == pids
    assert got[:, 1].tolist() == [os.getpid()] * 3, "ranks must name the launcher as their tracer"


def test_run_registers_ranks_with_the_launcher_as_tracer():
    """`shmcoll run`: the tracer is the launcher, also when the rank's
    parent is a shell the launcher started (not the rank's parent pid)."""
    script = os.path.join(RANKS_DIR, "tracer.py")
    for cmd in ([script], ["sh", "-c", f'"{sys.executable}" "{script}"; exit $?']):
        p = subprocess.Popen(cli("run", "-n", "2", "--bind", "none", "--timeout", "60", "--", *cmd),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = p.communicate(timeout=90)
        assert p.returncode == 0, err[-3000:]
        lines = sorted(l.split() for l in out.splitlines())
        assert [(l[0], l[1], l[2], l[3]) for l in lines] == [("rank", str(r), "tracer", str(p.pid)) for r in range(2)], \
            (cmd, out)
        if cmd[0] == "sh":
            assert all(l[5] != str(p.pid) for l in lines), out      # the shell is the parent


class _FakeDevice:
    """Just what the launcher may use of a device: rank_state() and abort()."""

    def __init__(self, states):
        self.states, self.aborts = states, []

    def rank_state(self, rank):
        return self.states[rank]

    def abort(self, rank, code):
        self.aborts.append((rank, code))


class _FakeJob:
    def __init__(self, device):
        self.device = device


def test_rank_state_comes_from_device_rank_state():
    """The launcher reads a rank's state only through device.rank_state()
    (the engine's sc_rank_state: 0 none, 1 alive, 2 done, 3 dead), never
    from the segment's layout, and aborts the job (code 4) for a rank that
    exited 0 without registering, but not for one that registered."""
    from shmcoll import launcher
    dev = _FakeDevice((0, 1, 2, 3))
    assert [launcher._rank_state(dev, r) for r in range(4)] == ["none", "alive", "done", "dead"]
    job = _FakeJob(dev)
    for rank in (1, 2, 3):
        launcher._ended(job, rank, False, 0)
    assert dev.aborts == []
    launcher._ended(job, 0, False, 0)
    assert dev.aborts == [(0, 4)]


def test_run_fails_when_a_root_made_calls_its_peers_did_not():
    """Rank 0's extra Bcast reached no one: the rank leaving later (the
    atexit Free) finds the other gone after another number of calls, and
    its exit status says so (Python ignores what an atexit handler raises:
    the job exited 0 before)."""
    p = run_cli(["-n", "2", "--timeout", "60", "--", os.path.join(RANKS_DIR, "extra.py")])
    assert p.returncode != 0, p.stderr
    assert "made different numbers of calls" in p.stderr, p.stderr


def test_run_ends_promptly_when_a_root_fails_after_its_last_call():
    """Rank 0 raises right after a Bcast it was root of, while rank 1 never
    reaches that Bcast: leaving does not wait for rank 1 (44887f9's Free
    did, until the stall timeout), so the launcher's grace ends the job."""
    p = run_cli(["-n", "2", "--", os.path.join(RANKS_DIR, "root_fails.py")], timeout=60)
    assert p.returncode == 1, p.stderr
    assert "rank 0 fails after its last call" in p.stderr, p.stderr


def _stalls(comm):
    x = np.zeros(1)
    comm.Barrier()
    if comm.rank == 1:
        threading.Event().wait()        # stuck outside any collective, until the launcher kills it
    comm.Allreduce(x.copy(), x)


def test_launch_names_the_stalled_rank_not_its_own_kill():
    """Rank 1 stalls: the others raise PeerTimeout naming it, and launch()
    re-raises that, not the SIGKILL it sent rank 1 itself GRACE_S later
    ('rank 1 was killed by signal 9 without a result' before)."""
    with pytest.raises(shmcoll.PeerTimeout, match="rank 1 did not arrive"):
        shmcoll.launch(_stalls, 3, options={"timeout": 1}, timeout=60)


def _barrier_or_bcast(comm):
    if comm.rank == comm.size - 1:
        comm.Bcast(np.zeros(4), root=0)
    else:
        comm.Barrier()


@pytest.mark.parametrize("n", [3, 4])
def test_launch_raises_the_finders_mismatch_not_an_echo(n):
    """The last rank calls Bcast while the others Barrier.  It (or, now
    and then, the rank beside it) finds the mismatch; the others raise its
    echo ('...; found by rank 2, seen on rank 0').  launch() re-raised rank 0's echo before, with rank 0's
    traceback; now the finder's own error, which names its own call."""
    with pytest.raises(shmcoll.MismatchError) as info:
        shmcoll.launch(_barrier_or_bcast, n, timeout=60)
    assert "seen on rank" not in str(info.value)
    assert "(collective)" in str(info.value) and f"rank {n - 1} has bcast" in str(info.value)


class _Tagged(Exception):
    found_by = 0        # a user's attribute that happens to share the echo's name


def _raises_tagged_or_finds_and_dies(comm, case):
    if case == "tagged":
        if comm.rank == 1:
            raise _Tagged("rank 1's own error")
        comm.Barrier()
    else:
        try:
            _barrier_or_bcast(comm)
        except shmcoll.MismatchError as e:
            if "seen on rank" not in str(e):
                os._exit(3)         # the finder dies before it reports what it found
            raise


def test_launch_ranks_only_mismatch_echoes_as_echoes(monkeypatch):
    """From the review of the finder-first ranking: a user's exception with
    an attribute named found_by was taken for an echo, and launch() raised
    a peer's PeerAborted instead of it; and a finder that died before
    reporting left only 'rank 2 exited with status 3 without a result',
    where the echoes still say what differed.  One finder, so that an echo
    is left: the ranks take turns on one CPU."""
    taking_turns(monkeypatch)
    with pytest.raises(_Tagged, match="rank 1's own error"):
        shmcoll.launch(_raises_tagged_or_finds_and_dies, 3, ("tagged",), timeout=60)
    with pytest.raises(shmcoll.MismatchError, match=r"rank 2 has bcast.*found by rank \d, seen on rank"):
        shmcoll.launch(_raises_tagged_or_finds_and_dies, 3, ("dies",), timeout=60)
