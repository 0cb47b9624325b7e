"""examples/ under mpi4py+MPICH and under shmcoll run: identical output at 1-4 ranks.

The reference is each program's own output under MPICH (/tmp/peer-mpich, skipped
when absent); the shmcoll side is skipped, saying which call is missing, until
shmcoll.MPI has what the program uses."""
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PEER = Path(os.environ.get("SHMCOLL_PEER_MPICH", "/tmp/peer-mpich"))
# What each program calls beyond what every one uses (Get_rank, Get_size, DOUBLE).
NEEDS = {"power_iteration": ["Allgather", "Allgatherv", "Allreduce", "INT64_T"],
         "kmeans": ["Allreduce", "INT64_T"],
         "halo": ["Sendrecv", "Gatherv", "PROC_NULL"],
         "sample_sort": ["Allgather", "Alltoall", "Alltoallv", "Gatherv", "gather", "INT64_T"],
         "master_worker": ["send", "recv", "ANY_SOURCE", "ANY_TAG", "Status"]}
NS = [1, 2, 3, 4]


def _missing(name):
    try:
        MPI = importlib.import_module("shmcoll.MPI")
    except ImportError as e:
        return f"shmcoll.MPI cannot be imported ({e})"
    comm = type(MPI.COMM_WORLD)
    lacks = [a for a in NEEDS[name] + ["DOUBLE", "COMM_WORLD"] if not (hasattr(MPI, a) or hasattr(comm, a))]
    return f"shmcoll.MPI lacks {', '.join(lacks)}" if lacks else None


def _run(cmd, module):
    env = dict(os.environ, MPI_MODULE=module, PYTHONPATH=str(ROOT))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


def mpich(name, n):
    if not (PEER / "bin" / "mpiexec").exists():
        pytest.skip(f"no mpi4py+MPICH at {PEER}")
    return _run([str(PEER / "bin" / "mpiexec"), "-n", str(n), str(PEER / "bin" / "python"),
                 str(ROOT / "examples" / f"{name}.py")], "mpi4py.MPI")


@pytest.mark.timeout(320)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("name", sorted(NEEDS))
def test_example_same_under_shmcoll_and_mpich(name, n):
    ref = mpich(name, n)
    assert ref.strip(), "the program printed nothing under MPICH"
    why = _missing(name)
    if why:
        pytest.skip(why)
    got = _run([sys.executable, "-m", "shmcoll", "run", "-n", str(n), "--bind", "none", "--",
                str(ROOT / "examples" / f"{name}.py")], "shmcoll.MPI")
    assert got == ref


@pytest.mark.timeout(320)
@pytest.mark.parametrize("name", ["halo", "kmeans", "master_worker", "power_iteration"])
def test_example_same_at_every_rank_count(name):
    """These programs' results do not depend on the rank count (sample_sort prints the per-rank split)."""
    outs = {n: mpich(name, n) for n in (1, 3)}
    assert outs[1] == outs[3]
