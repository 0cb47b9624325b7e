"""tools/mpi4py_tests.py: its skip list, its counting, and mpi4py's tests on shmcoll.

The machinery is checked against mpi4py itself: unswitched under MPICH it must
report what mpi4py's own test/main.py reports.  The whole 13-file run at 1-4
ranks is CI's (.ci/run); here a quick part of it."""
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import mpi4py_tests as tool  # noqa: E402

PEER = Path(os.environ.get("SHMCOLL_PEER_MPICH", "/tmp/peer-mpich"))
CACHE = os.environ.get("SHMCOLL_CACHE", "~/.cache/shmcoll")
TOOL = [sys.executable, str(ROOT / "tools" / "mpi4py_tests.py"), "--cache", CACHE]


@pytest.fixture(scope="module")
def sdist():
    try:
        return tool.fetch(CACHE)
    except (tool.FetchError, OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"mpi4py {tool.VERSION}'s sdist is not available: {e}")


def _shmcoll_mpi():
    try:
        importlib.import_module("shmcoll.MPI")
    except ImportError as e:
        return str(e)


def _run(args, timeout):
    return subprocess.run(TOOL + args, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_every_skip_names_a_test_of_the_sdist(sdist):
    for glob, reason in tool.load_skips(tool.SKIPS):
        mod, cls, meth = glob.split(".")
        src = (sdist / "test" / f"{mod}.py").read_text()
        assert mod + ".py" in tool.FILES, glob
        pat = re.escape(meth).replace(r"\*", r"\w*").replace(r"\?", r"\w")
        assert re.search(rf"def {pat}\(", src), f"{glob}: no such test ({reason})"
        if "*" not in cls:
            assert f"class {cls}" in src, glob


def test_skip_without_reason_is_refused(tmp_path):
    (tmp_path / "s.txt").write_text("test_comm.*.testSize\n")
    with pytest.raises(ValueError, match="needs a reason"):
        tool.load_skips(tmp_path / "s.txt")


def test_tally_passes_only_what_passed_on_every_rank(tmp_path):
    events = {0: [("a", "pass"), ("b", "pass"), ("c", "skip"), ("d", "start")],
              1: [("a", "pass"), ("b", "fail"), ("c", "skip")]}
    for r, evs in events.items():
        (tmp_path / f"rank{r}.jsonl").write_text(
            "".join(json.dumps({"test": t, "outcome": o, "detail": "x"}) + "\n" for t, o in evs))
    res = tool.tally(tmp_path, 2, "timeout")
    assert {t: o for t, (o, _) in res.items()} == {"a": "pass", "b": "fail", "c": "skip", "d": "fail"}
    assert "no result on rank 0" in res["d"][1]


@pytest.mark.timeout(300)
def test_counts_match_mpi4py_main_under_mpich(sdist, tmp_path):
    if not (PEER / "bin" / "mpiexec").exists():
        pytest.skip(f"no mpi4py+MPICH at {PEER}")
    p = _run(["--peer", str(PEER), "--no-skips", "--check-main", "-n", "1,3", "--out", str(tmp_path),
              "test_status.py", "test_request.py"], 280)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count(" same") == 4 and "DIFFERENT" not in p.stdout


@pytest.mark.timeout(120)
def test_says_skip_while_shmcoll_mpi_is_missing():
    if _shmcoll_mpi() is None:
        pytest.skip("shmcoll.MPI exists")
    p = _run(["-n", "1"], 100)
    assert p.returncode == 0 and "SKIP: shmcoll.MPI" in p.stdout


@pytest.mark.skip(reason="issue 44 open: mpi4py's tests do not pass on shmcoll yet (a bad argument aborts the "
                         "communicator where mpi4py raises MPI.Exception and goes on; Bsend, Info, Status and "
                         "Request extras missing): docs/mpi4py-tests.md has the counts")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("files", [["test_status.py", "test_request.py"], ["test_cco_obj.py", "test_p2p_obj.py"]])
def test_mpi4py_tests_pass_on_shmcoll(sdist, tmp_path, files):
    why = _shmcoll_mpi()
    if why:
        pytest.skip(f"shmcoll.MPI cannot be imported ({why})")
    p = _run(["-n", "1,2,3,4", "-v", "--out", str(tmp_path), "--timeout", "120"] + files, 580)
    assert p.returncode == 0, p.stdout + p.stderr
