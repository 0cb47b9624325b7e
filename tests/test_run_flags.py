"""`shmcoll run` with the flags people type for mpiexec, each flag's effect
seen from the ranks; and init() under another launcher's job.  Where MPICH
or Open MPI is installed, their mpiexec's output is the reference."""
import os
import signal
import subprocess
import sys

import pytest

import shmcoll
from conftest import ROOT, cli, expected_affinity

MPICH = "/tmp/peer-mpich/bin/mpiexec"
OMPI = "/tmp/peer-ompi/bin/mpiexec"
OMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1"}
AFFINITY = "import os; print(os.environ['SHMCOLL_RANK'], sorted(os.sched_getaffinity(0)))"
pytestmark = pytest.mark.timeout(120)


def run(*args, env=None, timeout=90):
    e = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
    return subprocess.run(cli("run", *args), env=e, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def affinities(p):
    assert p.returncode == 0, p.stderr
    out = {}
    for line in p.stdout.splitlines():
        rank, cpus = line.split(" ", 1)
        out[int(rank)] = frozenset(eval(cpus))
    return out


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("bind", ["core", "socket", "numa", "none"])
def test_bind_to_pins(bind, n):
    """--bind-to X pins each rank as /sys says X's CPUs are (conftest reads it)."""
    got = affinities(run("-n", str(n), "--bind-to", bind, "--oversubscribe", "--", "-c", AFFINITY))
    assert got == {r: frozenset(expected_affinity(r, n, bind)) for r in range(n)}


def test_map_by_is_the_map():
    """--map-by core places as --map compact, --map-by socket as --map scatter."""
    for by, map_ in (("core", "compact"), ("socket", "scatter"), ("numa", "scatter")):
        a = affinities(run("-n", "2", "--map-by", by, "--", "-c", AFFINITY))
        b = affinities(run("-n", "2", "--map", map_, "--", "-c", AFFINITY))
        assert a == b, by
    p = run("-n", "2", "--map-by", "core", "--map", "scatter", "--", "true")
    assert p.returncode == 2 and "disagree" in p.stderr


def test_environment_flags_reach_every_rank():
    code = "import os; print(os.environ['SHMCOLL_RANK'], *(os.environ[v] for v in 'ABCD'))"
    p = run("-n", "3", "-x", "A", "-x", "B=from-x", "--env", "C=from env=with equals", "-genv", "D", "from genv",
            "--", "-c", code, env={"A": "exported", "B": "shadowed"})
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == [f"{r} exported from-x from env=with equals from genv" for r in range(3)]


def test_unset_export_is_a_usage_error():
    p = run("-n", "2", "-x", "SHMCOLL_SURELY_UNSET", "--", "true", env={})
    assert p.returncode == 2 and "SHMCOLL_SURELY_UNSET is not set" in p.stderr


TAGGED = "import sys; print('out', 1); print('line', 2); print('err', file=sys.stderr)"
# one write a line: MPICH's -l splits lines written piecewise
ONE = "import os; os.write(1, b'out 1\\n'); os.write(2, b'err\\n')"
PREFIX = {"--tag-output": "[1,{rank}]<{stream}>: ", "-l": "[{rank}] "}


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("flag", ["--tag-output", "-l"])
def test_every_line_has_its_rank_prefix(flag, n):
    p = run("-n", str(n), flag, "--", "-c", TAGGED)
    assert p.returncode == 0, p.stderr
    want = lambda stream, lines: sorted(PREFIX[flag].format(rank=r, stream=stream) + x for r in range(n) for x in lines)
    assert sorted(p.stdout.splitlines()) == want("stdout", ["out 1", "line 2"])
    assert sorted(p.stderr.splitlines()) == want("stderr", ["err"])


@pytest.mark.parametrize("flag,peer", [("--tag-output", OMPI), ("-l", MPICH)])
def test_rank_prefixes_as_mpiexec(flag, peer):
    """--tag-output prefixes as Open MPI's, -l as MPICH's -l: the same lines."""
    if not os.path.exists(peer):
        pytest.skip(f"{peer} not installed")
    p = run("-n", "2", flag, "--", "-c", ONE)
    q = subprocess.run([peer, "-n", "2", flag, sys.executable, "-c", ONE], capture_output=True, text=True,
                       timeout=90, env=dict(os.environ, **OMPI_ENV))
    assert p.returncode == q.returncode == 0, (p.stderr, q.stderr)
    assert sorted(p.stdout.splitlines()) == sorted(q.stdout.splitlines())
    assert sorted(p.stderr.splitlines()) == sorted(q.stderr.splitlines())


def test_missing_program_is_one_line(tmp_path):
    p = run("-n", "2", "--", "shmcoll-no-such-program")
    assert (p.returncode, p.stdout, p.stderr) == (127, "", "shmcoll run: shmcoll-no-such-program: command not found\n")
    f = tmp_path / "not-executable"
    f.write_text("#!/bin/sh\n")
    p = run("-n", "2", "--", str(f))
    assert p.returncode == 126 and len(p.stderr.splitlines()) == 1 and "Traceback" not in p.stderr


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_exit_status_as_open_mpi(how):
    """A rank's failure status (128 + signal for a signal) is the job's, as Open MPI's mpiexec gives."""
    code = ("import os, signal, sys\nr = int(os.environ.get('SHMCOLL_RANK', os.environ.get('OMPI_COMM_WORLD_RANK')))\n"
            "if r == 1:\n    os.kill(os.getpid(), signal.SIGKILL) if sys.argv[1] == 'kill' else sys.exit(5)\n")
    p = run("-n", "2", "--", "-c", code, how)
    assert p.returncode == (128 + signal.SIGKILL if how == "kill" else 5)
    if os.path.exists(OMPI):
        q = subprocess.run([OMPI, "-n", "2", sys.executable, "-c", code, how], capture_output=True, text=True,
                           timeout=90, env=dict(os.environ, **OMPI_ENV))
        assert p.returncode == q.returncode


@pytest.mark.parametrize("command", ["run", "topo", "bench", "options", "alcd", "program"])
def test_version_and_help_on_every_command(command):
    for flag in ("--version", "--help"):
        p = subprocess.run(cli(command, flag), env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, (flag, p.stderr)
        if flag == "--version":
            assert p.stdout.strip() == f"shmcoll {shmcoll.__version__}"


INIT = "import shmcoll; print(shmcoll.init().Get_size())"
FOREIGN = [("mpiexec (MPICH/Hydra)", {"PMI_RANK": "1", "PMI_SIZE": "2"}),
           ("mpiexec (Open MPI)", {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}),
           ("srun (Slurm)", {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_ID": "0"}),
           ("torchrun", {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}),
           ("PMIx", {"PMIX_RANK": "1", "PMIX_NAMESPACE": "job"})]


def init_under(env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI_", "SLURM_", "SHMCOLL_"))
             and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run([sys.executable, "-c", INIT], env=dict(clean, PYTHONPATH=ROOT, **env), capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("name,env", FOREIGN, ids=[f[0].split()[0] for f in FOREIGN])
def test_init_under_another_launcher_raises(name, env):
    p = init_under(env)
    assert p.returncode == 1 and "RuntimeError" in p.stderr
    assert name in p.stderr and "shmcoll run" in p.stderr
    assert all(f"{k}={v}" in p.stderr for k, v in env.items() if k != "LOCAL_RANK" or name == "torchrun")


@pytest.mark.parametrize("env", [{}, {"PMI_RANK": "0", "PMI_SIZE": "1"}, {"RANK": "0", "WORLD_SIZE": "1"},
                                 {"PMIX_RANK": "0"}])
def test_init_in_a_job_of_one_is_a_world_of_one(env):
    p = init_under(env)
    assert (p.returncode, p.stdout) == (0, "1\n"), p.stderr


@pytest.mark.skipif(not os.path.exists(MPICH), reason="MPICH's mpiexec not installed")
def test_init_under_real_mpiexec_raises_on_every_rank():
    p = subprocess.run([MPICH, "-n", "2", sys.executable, "-c", INIT], env=dict(os.environ, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=90)
    assert p.returncode != 0 and p.stdout == ""
    assert p.stderr.count("not by `shmcoll run`") == 2
    assert "PMI_RANK=0" in p.stderr and "PMI_RANK=1" in p.stderr


def test_shmcoll_run_under_a_foreign_launcher_still_runs():
    """Variables of an outer launcher do not stop `shmcoll run`'s own ranks."""
    p = run("-n", "2", "--", "-c", INIT, env={"PMI_RANK": "0", "PMI_SIZE": "2", "WORLD_SIZE": "8"})
    assert (p.returncode, sorted(p.stdout.split())) == (0, ["2", "2"]), p.stderr
