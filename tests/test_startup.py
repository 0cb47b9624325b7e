"""Many ranks on few CPUs start in seconds, under launch() and `shmcoll run`,
run collectives and leave /dev/shm clean (the autouse fixture checks).
Not a timing assertion: the timeouts only keep a regression from stalling
the suite (start-up was quadratic to cubic in the ranks before).  The
collectives are named: the automatic choice for ranks taking turns on
CPUs (all_to_all Barrier, all_at_once Allreduce) has n^2 moves, whose
events and acks every rank's compile follows (to emit its own program),
too slow at 256 ranks on 2 CPUs for the suite."""
import os
import subprocess
import sys

import numpy as np
import pytest

import shmcoll
from conftest import ROOT, cli
from shmcoll.launcher import Job

# bytes a rank's process takes beyond the launcher's (its own pages: stack,
# the Python objects it writes), generously
RANK_BYTES = 64 << 20


def _available(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) << 10
    return 0


def _many():
    """256 ranks, or half as many while the job's segment and processes do
    not fit this machine's /dev/shm and memory (skip below 64)."""
    for n in (256, 128, 64):
        job = Job(n, bind="none")
        size = job.plan.size
        job.close()
        if size * 2 < _available("/dev/shm") and size + n * RANK_BYTES < _mem_available():
            return n
    pytest.skip("not enough shared or private memory here for 64 ranks")


def _barrier_allreduce(comm):
    comm.Barrier("padded")
    send = np.arange(10, dtype=np.int64) * (comm.rank + 1)
    recv = np.empty_like(send)
    comm.Allreduce(send, recv, algorithm="reduce_scatter_allgather")
    return recv


@pytest.mark.timeout(300)
def test_launch_many_ranks():
    n = _many()
    got = shmcoll.launch(_barrier_allreduce, n, timeout=240)
    want = sum(np.arange(10, dtype=np.int64) * (r + 1) for r in range(n))
    assert len(got) == n and all((g == want).all() for g in got)


RANK = """
import numpy as np, os, shmcoll
comm = shmcoll.init()
assert (comm.rank, comm.size) == (int(os.environ["SHMCOLL_RANK"]), int(os.environ["SHMCOLL_SIZE"]))
comm.Barrier("padded")
send = np.arange(10, dtype=np.int64) * (comm.rank + 1)
recv = np.empty_like(send)
comm.Allreduce(send, recv, algorithm="reduce_scatter_allgather")
assert (recv == sum(np.arange(10, dtype=np.int64) * (r + 1) for r in range(comm.size))).all()
os.write(1, f"{comm.rank} ok\\n".encode())
"""


@pytest.mark.timeout(300)
def test_run_many_ranks():
    n = _many()
    p = subprocess.run(cli("run", "-n", str(n), "--timeout", "240", "--", "-c", RANK), capture_output=True,
                       text=True, timeout=280, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(p.stdout.split("\n")[:-1]) == sorted(f"{r} ok" for r in range(n))


@pytest.mark.parametrize("how", ["script", "-m", "-c"])
def test_run_forked_ranks_see_what_python_would_give_them(how, tmp_path):
    """The ranks `shmcoll run` forks see the argv, sys.path[0] and __name__
    that `python CMD` gives, here compared with what python itself gives."""
    body = "import os, sys; print(repr((sys.argv, sys.path[0], __name__)))\n"
    (tmp_path / "probe_mod.py").write_text(body)
    cmd = {"script": [str(tmp_path / "probe_mod.py"), "a", "b"], "-m": ["-m", "probe_mod", "a"],
           "-c": ["-c", body, "a"]}[how]
    env = dict(os.environ, PYTHONPATH=ROOT)
    want = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    got = subprocess.run(cli("run", "-n", "2", "--timeout", "60", "--", *cmd), capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env=env)
    assert want.returncode == 0 and got.returncode == 0, (want.stderr, got.stderr)
    assert got.stdout.splitlines() == want.stdout.splitlines() * 2


@pytest.mark.parametrize("code,status", [("raise SystemExit(3)", 3), ("raise SystemExit('bye')", 1),
                                         ("raise ValueError('x')", 1), ("raise KeyboardInterrupt", 130)])
def test_run_forked_ranks_exit_as_python_would(code, status):
    p = subprocess.run(cli("run", "-n", "2", "--timeout", "60", "--", "-c", code), capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == status, p.stderr[-3000:]


@pytest.mark.parametrize("fresh", [False, True])
def test_run_exec_starts_fresh_interpreters(fresh):
    """`shmcoll run --exec` starts each rank as `python CMD` would, with
    nothing imported before the script (numpy's thread pools not yet made:
    OMP_NUM_THREADS set by the script still counts); by default the ranks
    are forked from the launcher, which has imported numpy."""
    code = "import sys; print('numpy' in sys.modules)"
    p = subprocess.run(cli("run", "-n", "2", "--timeout", "60", *(["--exec"] if fresh else []), "--", "-c", code),
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == [str(not fresh)] * 2
