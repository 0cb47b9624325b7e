"""`shmcoll bench` in OSU/IMB conventions (issue 45): the framed loop's figures,
--verify, -m, CSV/JSON, the progress bar on a terminal only, peers checked
before anything runs, and the CLI's manners.  Tiny configurations: each
multi-process test has a timeout and stays within seconds."""
import csv
import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

import shmcoll
from shmcoll import _mpi_peer, bench

TREE = os.path.dirname(os.path.dirname(os.path.abspath(shmcoll.__file__)))
ENV = dict(os.environ, PYTHONPATH=TREE)
FIXED = ["-i", "20", "--reps", "1", "--peers", "none"]


def bench_cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "shmcoll", "bench", *args], env=ENV, cwd=TREE, text=True,
                          capture_output=True, timeout=kw.pop("timeout", 120), **kw)


def test_message_sizes_are_osu_powers_of_two():
    assert bench.message_sizes("0:64M") == [0] + [1 << k for k in range(27)]
    assert bench.message_sizes("3:16") == [4, 8, 16]
    assert bench.message_sizes("4K:16K") == [4096, 8192, 16384]
    assert bench.parse(["bcast", "-m", "8"]).sizes == [0, 1, 2, 4, 8]
    with pytest.raises(SystemExit):
        bench.parse(["bcast", "-m", "8", "--sizes", "8"])


def test_reductions_measure_whole_items_only():
    cfg = bench.parse(["allreduce", "-m", "0:16"])
    assert [s for s, _ in bench.sequence("allreduce", cfg)] == [0, 8, 16]
    assert [s for s, _ in bench.sequence("allreduce_f32", cfg)] == [0, 4, 8, 16]
    assert [s for s, _ in bench.sequence("bcast", cfg)] == [0, 1, 2, 4, 8, 16]


def test_small_ratios_keep_two_significant_digits():
    assert bench.number(0.96 / 766) == "0.0013" and bench.number(0.956) == "0.96" and bench.number(12.3) == "12.30"


def test_summary_is_osus_figures():
    frames = [[1e-6, 2e-6, 3e-6, 10e-6], [2e-6, 1e-6, 5e-6, 4e-6]]      # two ranks, four iterations
    s = _mpi_peer.summary(frames)
    assert s["avg_us"] == pytest.approx(3.5)
    assert (s["min_us"], s["max_us"]) == (pytest.approx(3.0), pytest.approx(4.0))        # each rank's mean
    assert s["p50_us"] == pytest.approx(2.0) and s["p99_us"] == pytest.approx(10.0)     # of 2, 2, 5, 10
    assert s["iters"] == 4


ALL_OPS = sorted(_mpi_peer.OPS)


@pytest.mark.timeout(300)
def test_every_op_and_algorithm_verifies_every_iteration(tmp_path):
    """--verify at 2 ranks: every framed iteration's result (inputs new each
    time, root rotated) is checked; JSON and CSV carry the same rows, with
    OSU's figures, iterations and bandwidth where it means something."""
    out, table = tmp_path / "b.json", tmp_path / "b.csv"
    assert bench.main([*ALL_OPS, "-n", "2", "--sizes", "0,8,4096", *FIXED, "--verify", "--off-cache", "0.01",
                       "--json", str(out), "--csv", str(table)]) == 0
    doc = json.loads(out.read_text())
    rows = doc["results"]
    assert doc["config"]["verify"] and doc["command"].startswith("shmcoll bench ")
    assert {"python", "numpy", "shmcoll"} <= set(doc["versions"]) and doc["machine"]
    assert {r["op"] for r in rows} == set(ALL_OPS)
    for op in ALL_OPS:
        coll = bench.COLLECTIVE.get(op, op)
        algs = {r["algorithm"] for r in rows if r["op"] == op}
        assert algs == set((shmcoll.algorithms(coll) if coll else []) + ["auto"]), op
    for r in rows:
        assert r["valid"] and r["error"] is None, r
        assert r["iters"] == 20 and r["calls"] == 20
        assert r["min_us"] <= r["avg_us"] <= r["max_us"] and r["p50_us"] <= r["p99_us"]
        assert (r["MBps"] is not None) == (r["size"] > 0 and r["op"] not in ("barrier", "iallreduce_overlap"))
    with open(table) as f:
        lines = [l for l in f if not l.startswith("#")]
    got = list(csv.DictReader(lines))
    assert len(got) == len(rows)
    assert {"op", "nprocs", "size", "algorithm", "us", "avg_us", "min_us", "max_us", "p50_us", "p99_us", "iters",
            "MBps", "valid"} <= set(got[0])
    assert all(g["valid"] == "True" for g in got)
    header = table.read_text().splitlines()[:6]
    assert [h.split(":")[0] for h in header] == ["# command", "# versions", "# shmcoll", "# peers", "# config",
                                                 "# machine"]


@pytest.mark.timeout(120)
def test_verify_catches_a_stale_iteration(tmp_path, monkeypatch):
    """A Bcast that skips every third call passes the one-off check (the
    first call) but not --verify, which sees an earlier iteration's bytes."""
    real = _mpi_peer.OPS["bcast"]

    def flaky(comm, nbytes, algorithm=None):   # the ranks inherit this through fork
        case = real(comm, nbytes, algorithm)
        count = [0]

        def skip(call):
            def run():
                count[0] += 1
                if count[0] % 3:
                    call()
            return run
        case.calls = [case.calls[0]] + [skip(c) for c in case.calls[1:]]
        return case

    monkeypatch.setitem(_mpi_peer.OPS, "bcast", flaky)
    out = tmp_path / "b.json"
    args = ["bcast", "-n", "2", "--sizes", "64", "--algorithms", "none", *FIXED, "--json", str(out)]
    assert bench.main(args) == 0                         # same data: a stale result is never seen
    assert bench.main([*args, "--verify"]) == 1
    assert [r["valid"] for r in json.loads(out.read_text())["results"]] == [False]


def run_on_pty(cmd, timeout):
    """cmd's output (stdout and stderr) written to a pseudo-terminal."""
    master, slave = os.openpty()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=ENV, cwd=TREE)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(master, 65536)
            except OSError:          # the terminal's other end is closed
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        p.kill() if p.poll() is None else None
        p.wait()
    return p.returncode, out.decode(errors="replace")


BAR_RUN = ["bcast", "-n", "2", "--sizes", "8,4096", "--min-time", "0.3", "--reps", "2", "--peers", "none",
           "--algorithms", "binomial"]


@pytest.mark.timeout(120)
def test_progress_bar_on_a_terminal_only():
    """On a terminal: the estimate first, then a line redrawn with \\r from
    the first second on (elapsed and time left); in a pipe: the estimate and
    the tables, no \\r."""
    rc, text = run_on_pty([sys.executable, "-m", "shmcoll", "bench", *BAR_RUN], 100)
    assert rc == 0, text
    assert text.startswith("shmcoll bench: 2 launches, 4 measurements; about ")
    bars = [b for b in text.split("\r") if b.startswith("[") and "elapsed" in b]
    if importlib.util.find_spec("tqdm"):
        bars = [b for b in text.split("\r") if "%|" in b]
    assert len(bars) >= 3, text               # redrawn twice a second over a run of a few seconds
    assert any("0:00 elapsed" in b or "00:00<" in b for b in bars)     # from the first second
    assert "took " in text
    p = bench_cli(*BAR_RUN)
    assert p.returncode == 0 and "\r" not in p.stdout + p.stderr
    assert p.stdout.startswith("shmcoll bench: 2 launches, 4 measurements; about ")
    assert "no progress bar: stderr is not a terminal" in p.stdout and "# bcast, 2 processes" in p.stdout


def test_estimate_counts_every_launch_and_size():
    cfg = bench.parse(["barrier", "bcast", "-n", "2,4", "--sizes", "8,1M", "--peers", "mp", "--rounds", "2"])
    jobs = bench.plan(cfg, {})
    algs = len(shmcoll.algorithms("barrier")) + 1 + len(shmcoll.algorithms("bcast")) + 1
    assert len(jobs) == 2 * 2 * (algs + 1)        # every column, every round, n = 2 and 4; mp for barrier
    ws = [bench.weights(j, cfg) for j in jobs]
    assert all(len(w) == len(bench.sequence(j[0], cfg)) and min(w) > 0 for j, w in zip(jobs, ws))
    quick = bench.parse(["barrier", "bcast", "-n", "2,4", "--quick", "--peers", "mp"])
    assert sum(map(sum, map(lambda j: bench.weights(j, quick), bench.plan(quick, {})))) < sum(map(sum, ws))


# --- peers -------------------------------------------------------------------

def refused(*args):
    """A bench that must stop before it runs anything: exit 2, its reason on stderr."""
    p = bench_cli("barrier", "-n", "2", *args, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "# barrier" not in p.stdout
    return p.stderr


def test_a_peer_without_an_environment_is_an_error_first(monkeypatch):
    monkeypatch.delenv("SHMCOLL_PEER_MPICH", raising=False)
    err = refused("--peers", "mpich")
    assert "--peer-env mpich=DIR" in err and "SHMCOLL_PEER_MPICH" in err and "pip install numpy mpich mpi4py" in err


def test_a_peer_that_cannot_import_mpi4py_is_an_error_first(tmp_path):
    if importlib.util.find_spec("mpi4py", None) is not None:
        pytest.skip("this interpreter has mpi4py")
    (tmp_path / "bin").mkdir()
    os.symlink(sys.executable, tmp_path / "bin" / "python")
    err = refused("--peers", "mine", "--peer-env", f"mine={tmp_path}")
    assert "cannot import numpy and mpi4py" in err and "pip install" in err
    err = refused("--peers", "mpi4py")
    assert "peer mpi4py" in err and "mpi4py" in err and "pip install mpi4py" in err


def test_plot_without_matplotlib_is_an_error_first(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert bench.main(["barrier", "--peers", "none", "--plot", "x.png"]) == 2
    captured = capsys.readouterr()
    assert "matplotlib" in captured.err and "shmcoll[plot]" in captured.err and "# barrier" not in captured.out


MPICH = os.environ.get("SHMCOLL_PEER_MPICH", "/tmp/peer-mpich")


@pytest.mark.timeout(120)
def test_mpi4py_peer_is_the_interpreters_own_with_the_mpiexec_beside_it(monkeypatch):
    """--peers mpi4py: the interpreter running the bench (here a virtualenv's
    that has mpi4py over MPICH) and the mpiexec in its bin."""
    python = os.path.join(MPICH, "bin", "python")
    if not os.access(python, os.X_OK):
        pytest.skip(f"no MPICH peer at {MPICH} (see bench/README.md)")
    monkeypatch.setattr(sys, "executable", python)
    peer = bench.find_peer("mpi4py", {})
    assert peer.python == python and peer.mpiexec == os.path.join(MPICH, "bin", "mpiexec") and not peer.ompi
    cfg = bench.parse(["bcast", "-n", "2", "--sizes", "8", *FIXED, "--verify"])
    libraries = {}
    (row,) = bench.run_mpi(peer, "bcast", 2, cfg, libraries)
    assert row["impl"] == "mpi4py" and row["valid"] and row["error"] is None and row["iters"] == 20
    assert "MPICH" in libraries["mpi4py"]


# --- the command line --------------------------------------------------------

def test_help_and_version_list_every_command():
    for flag in ("--help", "--version"):
        p = subprocess.run([sys.executable, "-m", "shmcoll", flag], env=ENV, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0 and not p.stderr
    from shmcoll.cli import COMMANDS
    p = subprocess.run([sys.executable, "-m", "shmcoll", "--help"], env=ENV, capture_output=True, text=True, timeout=60)
    for name in COMMANDS:
        assert any(l.split()[:1] == [name] and len(l.split()) > 2 for l in p.stdout.splitlines()), name
    help_text = bench_cli("--help").stdout
    for flag in ("-m", "--verify", "--data-varying", "--off-cache", "--csv", "--peer-env", "-i", "-x"):
        assert f" {flag}" in help_text, flag


@pytest.mark.timeout(120)
def test_output_piped_into_head_ends_quietly():
    """head leaves after the first line; the bench's next line finds the pipe closed and it ends, silent."""
    cmd = f"{sys.executable} -m shmcoll bench barrier bcast -n 2 {' '.join(FIXED)} | head -1; exit ${{PIPESTATUS[0]}}"
    p = subprocess.run(cmd, shell=True, executable="/bin/bash", env=ENV, capture_output=True, text=True, timeout=100)
    assert p.returncode == 0 and p.stdout.startswith("shmcoll bench: ") and p.stderr == "", p.stderr


#: An interpreter with torch: SHMCOLL_PEER_TORCH's environment, else this one (CI installs torch's CPU build).
TORCH = os.environ.get("SHMCOLL_PEER_TORCH") or sys.executable


@pytest.mark.timeout(180)
def test_gloo_peer_verifies_with_the_root_rotated(tmp_path):
    """gloo's processes run the same Cases: Reduce's root rotates, every iteration checked."""
    try:
        peer = bench.find_peer("gloo", {"gloo": TORCH})
    except bench.PeerError as e:
        pytest.skip(f"no torch at {TORCH} (see bench/README.md): {e}")
    cfg = bench.parse(["reduce", "-n", "2", "--sizes", "8,4096", *FIXED, "--verify"])
    libraries = {}
    rows = bench.run_gloo(peer, "reduce", 2, cfg, libraries)
    assert [r["size"] for r in rows] == [8, 4096]
    assert all(r["valid"] and r["error"] is None and r["iters"] == 20 for r in rows), rows
    assert libraries["gloo"].startswith("torch ")


@pytest.mark.timeout(300)
def test_bench_torch_runs_both_backends():
    """shmcoll bench torch: the calls' and DDP's tables, every cell measured, the losses equal at 2 ranks."""
    pytest.importorskip("torch")
    p = subprocess.run([sys.executable, "-m", "shmcoll", "bench", "torch", "-n", "2", "--rounds", "1", "--steps", "2",
                        "--warmup", "1", "--width", "64", "--sizes", "64K,1M"], env=ENV, capture_output=True, text=True,
                       timeout=280)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    calls = [l.split() for l in lines if l.split()[:2] in (["2", "64K"], ["2", "1M"])]
    assert len(calls) == 2 and all(float(x) > 0 for c in calls for x in c[2:5]), p.stdout
    step = next(l.split() for l in lines if l.split()[:1] == ["2"] and len(l.split()) == 8)
    assert all(float(x) > 0 for x in step[1:4]) and step[-1] == "0.0e+00", p.stdout
