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
# A lone rank of a job of several, whose peers never come: it waits the join
# timeout, then names who did not come.
LONE = [("mpiexec (MPICH/Hydra)", {"PMI_RANK": "1", "PMI_SIZE": "2"}, "local rank 0 "),
        ("mpiexec (Open MPI)", {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}, "local ranks [1, 2, 3]"),
        ("srun (Slurm)", {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_ID": "0"}, "local ranks [1]"),
        ("torchrun", {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}, "local ranks [1]")]
LAUNCHER_VARS = ("PMI", "OMPI_", "SLURM_", "SHMCOLL_", "MPI_LOCAL", "PMIX_", "TORCHELASTIC_")


def clean_env(**env):
    base = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    return dict(base, PYTHONPATH=ROOT, **env)


def init_under(env, code=INIT):
    return subprocess.run([sys.executable, "-c", code], env=clean_env(SHMCOLL_JOIN_TIMEOUT="1", **env),
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name,env,missing", LONE, ids=[f[0].split()[0] for f in LONE])
def test_init_of_a_lone_rank_names_who_never_came(name, env, missing):
    p = init_under(env)
    assert p.returncode == 1 and "TimeoutError" in p.stderr, p.stderr
    assert name in p.stderr and missing in p.stderr and "SHMCOLL_JOIN_TIMEOUT" in p.stderr
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("shmcoll-join")]


@pytest.mark.parametrize("env,why", [({"PMIX_RANK": "1", "PMIX_NAMESPACE": "job"}, "PMIx"),
                                     ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "LOCAL_WORLD_SIZE")])
def test_init_in_a_job_that_cannot_be_joined_raises(env, why):
    p = init_under(env)
    assert p.returncode == 1 and "RuntimeError" in p.stderr and why in p.stderr, p.stderr


@pytest.mark.parametrize("env", [{}, {"PMI_RANK": "0", "PMI_SIZE": "1"}, {"RANK": "0", "WORLD_SIZE": "1"},
                                 {"PMIX_RANK": "0"}])
def test_init_in_a_job_of_one_is_a_world_of_one(env):
    p = init_under(env)
    assert (p.returncode, p.stdout) == (0, "1\n"), p.stderr


# What each rank prints: its rank, the size, an Allreduce and an allgather
# of ranks, checked against the closed forms in compare().
JOINED = """
import numpy as np, shmcoll
comm = shmcoll.init()
x = np.arange(16.0) * (comm.rank + 1)
comm.Allreduce(shmcoll.IN_PLACE, x)
lines = comm.gather(f"{comm.rank} {comm.size} {x.sum()} {sum(comm.allgather(comm.rank))}")
if comm.rank == 0:
    print("\\n".join(lines), flush=True)
"""


def compare(stdout, n, size=None):
    size = size or n
    want = {f"{r} {size} {120.0 * size * (size + 1) / 2} {size * (size - 1) // 2}" for r in range(size)}
    assert sorted(stdout.split("\n")[:-1]) == sorted(want) and len(stdout.split("\n")) == size + 1, stdout


def fake_launch(n, env_of):
    """Start n ranks with a launcher's variables, as its daemon would (one parent)."""
    ps = [subprocess.Popen([sys.executable, "-c", JOINED], env=clean_env(**env_of(r)), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for r in range(n)]
    outs = [p.communicate(timeout=90) for p in ps]
    assert [p.returncode for p in ps] == [0] * n, [e for _, e in outs]
    return "".join(o for o, _ in outs)


FAKE = {"torchrun": lambda n: lambda r: {"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r),
                                         "LOCAL_WORLD_SIZE": str(n), "TORCHELASTIC_RUN_ID": "t"},
        "ompi": lambda n: lambda r: {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": str(n),
                                     "OMPI_COMM_WORLD_LOCAL_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_SIZE": str(n),
                                     "PMIX_NAMESPACE": "job"},
        "srun": lambda n: lambda r: {"SLURM_PROCID": str(r), "SLURM_STEP_NUM_TASKS": str(n), "SLURM_LOCALID": str(r),
                                     "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": f"{n}", "SLURM_JOB_ID": "7",
                                     "SLURM_STEP_ID": "0"},
        "mpich": lambda n: lambda r: {"PMI_RANK": str(r), "PMI_SIZE": str(n), "MPI_LOCALRANKID": str(r),
                                      "MPI_LOCALNRANKS": str(n)}}


@pytest.mark.parametrize("launcher", sorted(FAKE))
@pytest.mark.parametrize("n", [2, 3])
def test_ranks_of_another_launcher_join_one_job(launcher, n):
    """The same program gives the same results as under `shmcoll run`."""
    compare(fake_launch(n, FAKE[launcher](n)), n)
    p = run("-n", str(n), "--", "-c", JOINED)
    assert p.returncode == 0, p.stderr
    compare(p.stdout, n)
    assert not [x for x in os.listdir("/dev/shm") if x.startswith("shmcoll-join")]


def test_a_rank_that_never_comes_is_named_and_the_others_raise():
    """Local ranks 0 and 1 of 3 start; 2 never does."""
    code = ("import shmcoll\ntry:\n    shmcoll.init().Barrier()\nexcept Exception as e:\n"
            "    print(type(e).__name__, e)\n")
    env_of = FAKE["torchrun"](3)
    ps = [subprocess.Popen([sys.executable, "-c", code], env=clean_env(SHMCOLL_JOIN_TIMEOUT="1", **env_of(r)),
                           stdout=subprocess.PIPE, text=True) for r in range(2)]
    first, second = (p.communicate(timeout=60)[0] for p in ps)
    assert first.startswith("TimeoutError") and "local ranks [2] of this node's 3" in first
    assert second.startswith("PeerAborted rank 2 never joined")
    assert not [x for x in os.listdir("/dev/shm") if x.startswith("shmcoll-join")]


def test_a_job_across_nodes_gives_this_nodes_ranks_and_says_so():
    """Ranks 4, 5 of 6 on this node (torchrun's second node of three)."""
    def env_of(r):
        return {"RANK": str(4 + r), "WORLD_SIZE": "6", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
                "TORCHELASTIC_RUN_ID": "t", "PYTHONWARNINGS": "always"}
    ps = [subprocess.Popen([sys.executable, "-c", JOINED], env=clean_env(**env_of(r)), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=90) for p in ps]
    assert [p.returncode for p in ps] == [0, 0]
    compare("".join(o for o, _ in outs), 2)
    assert all("spans several nodes" in e and "6 ranks" in e for _, e in outs)


@pytest.mark.skipif(not os.path.exists(MPICH), reason="MPICH's mpiexec not installed")
def test_init_under_real_mpiexec_joins():
    p = subprocess.run([MPICH, "-n", "3", sys.executable, "-c", JOINED], env=dict(os.environ, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr
    compare(p.stdout, 3)


def test_init_under_real_torchrun_joins(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "joined.py"
    script.write_text(JOINED)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", str(script)],
                       env=clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    compare(p.stdout, 3)


@pytest.mark.skipif(not os.path.exists(OMPI), reason="Open MPI's mpiexec not installed")
def test_init_under_real_open_mpi_joins():
    p = subprocess.run([OMPI, "--oversubscribe", "-n", "3", sys.executable, "-c", JOINED],
                       env=dict(os.environ, PYTHONPATH=ROOT, **OMPI_ENV), capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr
    compare(p.stdout, 3)


def test_shmcoll_run_under_a_foreign_launcher_still_runs():
    """Variables of an outer launcher do not stop `shmcoll run`'s own ranks."""
    p = run("-n", "2", "--", "-c", INIT, env={"PMI_RANK": "0", "PMI_SIZE": "2", "WORLD_SIZE": "8"})
    assert (p.returncode, sorted(p.stdout.split())) == (0, ["2", "2"]), p.stderr
