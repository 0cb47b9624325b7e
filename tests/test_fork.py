"""Only the rank process is the rank: a rank never returns from launch()
into the caller's code, whatever is raised while it reports, and a process
forked inside a rank (os.fork, multiprocessing) ends without touching the
job: not its results, not its exit status, not its peers."""
import os
import subprocess
import sys

import pytest

from conftest import RANKS_DIR, ROOT, cli, run_ranks

# The caller: launch() then one line that must print exactly once, from
# the caller's own process.
CALLER = """
import os, signal, sys, shmcoll

class Reduces:
    def __init__(self, how):
        self.how = how
    def __reduce__(self):
        if self.how == "sigint":            # a Ctrl-C arriving while the result is pickled
            os.kill(os.getpid(), signal.SIGINT)
            return (str, ("sigint survived",))
        raise {"KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit}[self.how]("from __reduce__")

class Unpicklable(Exception):
    def __reduce__(self):
        raise KeyboardInterrupt("from the exception's __reduce__")

def job(comm, how):
    comm.Barrier()
    if comm.rank != 1:
        return comm.rank
    if how == "raise":
        raise Unpicklable("rank 1 fails")
    return Reduces(how)

print("caller", os.getpid(), flush=True)
try:
    print("result", shmcoll.launch(job, 3, args=(sys.argv[1],), timeout=60), flush=True)
except BaseException as e:
    print("error", type(e).__name__, getattr(e, "rank", None), str(e).replace(chr(10), " "), flush=True)
print("after", os.getpid(), flush=True)
"""


def _caller(how):
    p = subprocess.run([sys.executable, "-c", CALLER, how], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    lines = p.stdout.splitlines()
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr[-3000:])
    caller, rest = lines[0].split(), lines[1:]
    assert caller[0] == "caller" and [line for line in rest if line.startswith("after")] == [f"after {caller[1]}"], \
        (lines, p.stderr[-3000:])
    return [line for line in rest if not line.startswith("after")]


@pytest.mark.parametrize("how", ["KeyboardInterrupt", "SystemExit"])
def test_rank_raising_while_pickling_its_result_stays_in_launch(how):
    """The caller gets the exception the rank's pickling raised, from rank 1."""
    (line,) = _caller(how)
    assert line.startswith(f"error {how} 1 "), line
    assert "from __reduce__" in line, line


def test_rank_whose_exception_cannot_be_pickled_stays_in_launch():
    (line,) = _caller("raise")
    assert line.startswith("error RuntimeError 1 "), line
    assert "Unpicklable" in line and "rank 1 fails" in line and "KeyboardInterrupt" in line, line


def test_signal_while_a_rank_writes_its_result_waits_until_it_is_written():
    """A Ctrl-C to a rank reporting its result is held off: the job's result
    arrives whole and the caller's code runs once."""
    assert _caller("sigint") == ["result [0, 'sigint survived', 2]"]


# -- processes forked inside a rank ------------------------------------------

def _forking_job(comm, how):
    """Every rank forks a child that leaves as `how` says, waits for it,
    then runs a collective: only then the rank's own result counts."""
    if how == "multiprocessing":
        import multiprocessing
        p = multiprocessing.get_context("fork").Process(target=sys.exit, args=(0,))
        p.start()
        p.join()
        status = p.exitcode
    else:
        pid = os.fork()
        if pid == 0:
            if how == "exit":
                sys.exit(0)
            if how == "exit5":
                sys.exit(5)
            if how == "raise":
                raise RuntimeError("the child fails")
            if how == "return":
                return "child"
            os._exit(0)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    got = comm.allreduce(comm.rank)
    return comm.rank, status, got


@pytest.mark.parametrize("how,status", [("exit", 0), ("exit5", 5), ("raise", 1), ("return", 0),
                                        ("_exit", 0), ("multiprocessing", 0)])
def test_launch_rank_forking_a_child(how, status):
    n = 3
    assert run_ranks(_forking_job, n, how, timeout=60) == [(r, status, sum(range(n))) for r in range(n)]


def test_launch_ignores_a_forked_child_that_outlives_its_rank():
    """A helper the rank forked may keep the result pipe open: the job ends
    with its rank all the same."""
    r, w = os.pipe()

    def job(comm):
        if os.fork() == 0:
            os.close(w)
            os.read(r, 1)               # until the test lets it go (closes w)
            os._exit(0)
        return comm.rank
    try:
        assert run_ranks(job, 2, timeout=60) == [0, 1]
    finally:
        os.close(w)
        os.close(r)


@pytest.mark.parametrize("how", ["exit", "raise", "multiprocessing"])
def test_run_rank_forking_a_child(how):
    """Under `shmcoll run` the child's exit (atexit's Free, the excepthook's
    abort) is not the rank's: every rank passes, status 0."""
    p = subprocess.run(cli("run", "-n", "3", "--timeout", "60", "--", os.path.join(RANKS_DIR, "fork_child.py")),
                       capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT, FORK_HOW=how))
    assert p.returncode == 0, (p.stdout, p.stderr[-3000:])
    assert sorted(p.stdout.splitlines()) == [f"rank {r} of 3 ok" for r in range(3)], p.stderr[-3000:]
