"""Smoke tests of `shmcoll bench`: tiny configs, so the whole file stays well under 20 s."""
import json
import os
import subprocess
import sys

import pytest

import shmcoll
from shmcoll import _mpi_peer, bench

TINY = ["-n", "2", "--sizes", "8,4096", "--min-time", "0.005", "--max-iters", "2000"]


@pytest.mark.timeout(60)
def test_quick_run_writes_every_number(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert bench.main(["barrier", "bcast", "alltoall", *TINY, "--peers", "mp", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {"machine", "peers", "config", "results"} <= set(doc)
    rows = doc["results"]
    for op in ("barrier", "bcast", "alltoall"):
        sizes = [0] if op == "barrier" else [8, 4096]
        for alg in shmcoll.algorithms(op) + ["auto"]:
            got = {r["size"]: r for r in rows if r["op"] == op and r["algorithm"] == alg}
            assert sorted(got) == sizes, (op, alg)
            for r in got.values():
                assert r["valid"] and r["error"] is None and r["us"] > 0 and len(r["reps_us"]) == 3
                assert (r["selected"] in shmcoll.algorithms(op)) == (alg == "auto")
    assert [(r["impl"], r["op"]) for r in rows if r["impl"] != "shmcoll"] == [("mp", "barrier")]
    assert "auto/best-peer" in capsys.readouterr().out


@pytest.mark.timeout(60)
def test_validation_failure_is_reported(tmp_path, monkeypatch, capsys):
    real = _mpi_peer.OPS["bcast"]

    def wrong(comm, nbytes, algorithm=None):  # the ranks inherit this through fork
        case = real(comm, nbytes, algorithm)
        case.ok = lambda i, root: False
        return case

    monkeypatch.setitem(_mpi_peer.OPS, "bcast", wrong)
    out = tmp_path / "b.json"
    assert bench.main(["bcast", *TINY, "--algorithms", "none", "--peers", "none", "--json", str(out)]) == 1
    rows = json.loads(out.read_text())["results"]
    assert rows and all(r["valid"] is False for r in rows)
    text = capsys.readouterr().out
    assert "INVALID" in text and "FAILED: shmcoll bcast" in text


P2P_OPS = ["pingpong", "bw", "bcast_spec", "allreduce_spec", "allgatherv_spec", "allreduce_init", "iallreduce",
           "iallreduce_overlap"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_point_to_point_spec_and_request_ops_check_out(tmp_path, n):
    """The issue-44 ops (osu_latency/osu_bw pairs, a spec beside each plain
    call, persistent and nonblocking Allreduce) run and their results match
    numpy's pattern, also with an odd rank sitting out of the pairs."""
    out = tmp_path / "b.json"
    tiny = ["-n", str(n), "--sizes", "8,4096", "--min-time", "0.002", "--max-iters", "50", "--peers", "none"]
    assert bench.main([*P2P_OPS, *tiny, "--algorithms", "none", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert sorted({r["op"] for r in rows}) == sorted(P2P_OPS)
    assert all(r["valid"] and r["error"] is None and r["us"] > 0 for r in rows)
    overlap = [r["us"] for r in rows if r["op"] == "iallreduce_overlap"]
    assert min(overlap) >= _mpi_peer.OVERLAP_WORK_S * 1e6     # its work is part of every call


#: Where PEERS.md installs the MPI peers (the bench itself only looks where it is told).
PEER_DIRS = {name: os.environ.get(var, f"/tmp/peer-{name}") for name, var in bench.PEER_VARS.items()}


def installed(name):
    try:
        return bench.find_peer(name, PEER_DIRS)
    except bench.PeerError as e:
        pytest.skip(f"peer {name} not installed (see bench/README.md): {e}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["mpich", "ompi"])
def test_mpi_peer_runs_same_method(name):
    peer = installed(name)
    assert peer.ompi == (name == "ompi")
    cfg = bench.parse(["barrier", *TINY])
    libraries = {}
    (row,) = bench.run_mpi(peer, "barrier", 2, cfg, libraries)
    assert row["error"] is None and row["valid"] and row["us"] > 0
    assert row["iters"] > 0 and row["p50_us"] <= row["p99_us"] and row["min_us"] <= row["avg_us"] <= row["max_us"]
    assert libraries[name]


# --- --order -------------------------------------------------------------------

def measured(rows, impl="shmcoll", op="alltoall"):
    """(size, order) of one column's rows, in the order they were measured."""
    return [(r["size"], r["order"]) for r in rows if r["impl"] == impl and r["op"] == op
            and r["algorithm"] in ("auto", None)]


@pytest.mark.parametrize("order, want", [
    ("up", [(8, "up"), (4096, "up")]),
    ("down", [(4096, "down"), (8, "down")]),
    ("both", [(8, "up"), (4096, "up"), (4096, "down"), (8, "down")])])
def test_order_sequence_and_peer_command(order, want):
    cfg = bench.parse(["alltoall", *TINY[:2], "--sizes", "4096,8,4096", "--order", order])
    assert bench.sequence("alltoall", cfg) == want
    assert bench.sequence("barrier", cfg) == [(0, "down" if order == "down" else "up")]
    cmd = bench.mpi_command(bench.Peer("mpich", "/venv/bin/python", "/venv/bin/mpiexec", "MPICH Hydra"), 2,
                            "alltoall", cfg, "out.json")
    assert cmd[:5] == ["/venv/bin/mpiexec", "-n", "2", "-bind-to", "core"]
    assert cmd[cmd.index("--sizes") + 1] == ",".join(str(s) for s, _ in want)   # the peer keeps it
    assert bench.parse(["barrier"]).order == "up"


@pytest.mark.timeout(60)
def test_order_both_measures_each_size_both_ways_in_one_job(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert bench.main(["barrier", "alltoall", *TINY, "--order", "both", "--rounds", "1", "--algorithms", "pairwise",
                       "--peers", "mp", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = doc["results"]
    assert doc["config"]["order"] == "both"
    assert measured(rows) == [(8, "up"), (4096, "up"), (4096, "down"), (8, "down")]
    assert [(r["size"], r["order"]) for r in rows if r["algorithm"] == "pairwise"] == measured(rows)
    assert measured(rows, op="barrier") == [(0, "up")] and measured(rows, "mp", "barrier") == [(0, "up")]
    assert all(r["valid"] and r["us"] > 0 for r in rows)
    text = main_table(capsys.readouterr().out, "alltoall")
    lines = [l.split() for l in text.splitlines() if l.split()[:1] in (["8"], ["4K"])]
    assert [l[:2] for l in lines] == [["8", "up"], ["4K", "up"], ["4K", "down"], ["8", "down"]]
    assert " order " in text


def main_table(text, op):
    """The lines of op's latency table (up to the framed loop's table after it)."""
    return text.split(f"# {op}, ")[1].split("\n#")[0]


# --- --ref ---------------------------------------------------------------------

TREE = os.path.dirname(os.path.dirname(os.path.abspath(shmcoll.__file__)))


def test_ref_spec_forms(tmp_path):
    py = bench.Ref(sys.executable)
    assert py.python == sys.executable and py.tree is None and "PYTHONPATH" not in py.env
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    assert bench.Ref(str(tmp_path / "venv")).python == str(tmp_path / "venv" / "bin" / "python")
    tree = bench.Ref(TREE)
    assert tree.python == sys.executable and tree.env["PYTHONPATH"] == TREE


#: Every option of `shmcoll bench` before --order and --ref (main at 52ca25f): a ref
#: still at that version must understand every flag it is given.
OLD_FLAGS = {"-n", "--nprocs", "--sizes", "--algorithms", "--topology", "--bind", "--peers", "--json", "--plot",
             "--quick", "--min-time", "--reps", "--rounds", "--max-iters", "--timeout"}


@pytest.mark.parametrize("knows_order", [False, True])
def test_ref_command_fits_the_refs_cli(knows_order):
    cfg = bench.parse(["alltoall", *TINY, "--order", "both", "--topology", "1x2"])
    ref = bench.Ref(sys.executable)
    ref.knows_order = knows_order
    cmd = ref.command("alltoall", 2, cfg, "out.json")
    assert cmd[:5] == [sys.executable, "-m", "shmcoll", "bench", "alltoall"]
    flags = {x for x in cmd[5:] if x.startswith("-")}
    if knows_order:
        assert cmd[cmd.index("--order") + 1] == "both" and cmd[cmd.index("--sizes") + 1] == "8,4096"
    else:
        assert flags <= OLD_FLAGS
        assert cmd[cmd.index("--sizes") + 1] == "8,4096,4096,8"   # measured order, spelled out
    assert cmd[cmd.index("--algorithms") + 1] == "none" and cmd[cmd.index("--peers") + 1] == "none"


def run_ref(tmp_path, ref, extra=()):
    out = tmp_path / "b.json"
    assert bench.main(["bcast", *TINY, "--order", "both", "--rounds", "2", "--algorithms", "none",
                       "--peers", "none", "--ref", ref, "--json", str(out), *extra]) == 0
    return json.loads(out.read_text())


@pytest.mark.timeout(120)
def test_ref_column_interleaved_and_same_method(tmp_path, capsys):
    """This very tree as the ref, run by this interpreter: a column 'ref' beside auto in every round."""
    doc = run_ref(tmp_path, TREE)
    assert doc["ref"]["python"] == sys.executable and doc["ref"]["error"] is None
    assert os.path.realpath(doc["ref"]["shmcoll"]) == os.path.realpath(shmcoll.__file__)
    assert doc["config"]["ref"] == TREE
    rows = doc["results"]
    seq = [(8, "up"), (4096, "up"), (4096, "down"), (8, "down")]
    for k in (0, 1):   # each round: auto's job, then the ref's, both the whole sequence
        mine = [r for r in rows if r["round"] == k]
        assert [(r["impl"], r["size"], r["order"]) for r in mine] == \
            [("shmcoll", *s) for s in seq] + [("shmcoll-ref", *s) for s in seq]
    for r in (r for r in rows if r["impl"] == "shmcoll-ref"):
        assert r["algorithm"] == "auto" and r["selected"] in shmcoll.algorithms("bcast")
        assert r["valid"] and r["error"] is None and r["us"] > 0 and len(r["reps_us"]) == 3
    text = capsys.readouterr().out
    header = next(l for l in text.splitlines() if l.startswith("size"))
    assert header.split() == ["size", "order", "auto", "ref", "auto/ref", "auto/best-peer"]


def old_bench_sources():
    """shmcoll/bench.py and the _mpi_peer.py beside it as they were before --order, from git history, or None."""
    git = lambda *a: subprocess.run(["git", "-C", TREE, *a], capture_output=True, text=True)
    log = git("log", "--format=%H", "-n", "30", "--", "shmcoll/bench.py")
    for commit in log.stdout.split() if log.returncode == 0 else []:
        text = git("show", f"{commit}:shmcoll/bench.py").stdout
        if text and '"--order"' not in text:
            return {name: git("show", f"{commit}:shmcoll/{name}").stdout for name in ("bench.py", "_mpi_peer.py")}
    return None


@pytest.mark.timeout(120)
def test_ref_with_the_old_bench_cli(tmp_path):
    """A ref whose bench predates --order (this package with the old bench.py) still runs both orders."""
    old = old_bench_sources()
    if old is None:
        pytest.skip("no git history with the bench before --order")
    pkg = tmp_path / "old" / "shmcoll"
    pkg.mkdir(parents=True)
    src = os.path.dirname(os.path.abspath(shmcoll.__file__))
    for name in os.listdir(src):
        if name not in (*old, "__pycache__"):
            os.symlink(os.path.join(src, name), pkg / name)
    for name, text in old.items():
        (pkg / name).write_text(text)
    ref = bench.Ref(str(tmp_path / "old"))
    assert ref.probe() and not ref.knows_order
    doc = run_ref(tmp_path, str(tmp_path / "old"))
    got = [(r["size"], r["order"]) for r in doc["results"] if r["impl"] == "shmcoll-ref" and r["round"] == 0]
    assert got == [(8, "up"), (4096, "up"), (4096, "down"), (8, "down")]
    assert all(r["valid"] and r["us"] > 0 for r in doc["results"])


@pytest.mark.timeout(60)
def test_broken_ref_is_an_error_column_not_a_failure(tmp_path, capsys):
    doc = run_ref(tmp_path, str(tmp_path / "no-such-python"))
    refs = [r for r in doc["results"] if r["impl"] == "shmcoll-ref"]
    assert refs and all(r["error"] and r["us"] is None for r in refs)
    assert doc["ref"]["error"]
    assert "ERROR" in capsys.readouterr().out


def test_sizes_take_binary_suffixes_and_refuse_the_rest(capsys):
    assert bench.parse(["bcast", "--sizes", "8,4K,2MiB,1g"]).sizes == [8, 4096, 2 << 20, 1 << 30]
    with pytest.raises(SystemExit):
        bench.parse(["bcast", "--sizes", "8,4Q"])
    assert "'4Q' is not a byte count" in capsys.readouterr().err


# --- the floor -------------------------------------------------------------

def test_floor_is_measured_beside_auto_and_scaled(tmp_path, monkeypatch, capsys):
    """The floor column comes from the automatic choice's own launch: each
    rank's copy times, scaled to (3 - 1/n) / 2 copies, max over ranks; only
    for allreduce, shown after the peers, with auto/floor."""
    rank, real = [None], bench._shmcoll_rank

    def rank_known(comm, *args):                 # the ranks inherit these through fork
        rank[0] = comm.rank
        return real(comm, *args)

    def fake(run, other, sync, share, cfg):
        run(), other()
        return [1e-6] * cfg.reps, [2e-6 * (1 + (rank[0] == 1))] * cfg.reps, 5
    monkeypatch.setattr(bench, "_shmcoll_rank", rank_known)
    monkeypatch.setattr(bench, "measure_beside", fake)
    out = tmp_path / "b.json"
    assert bench.main(["allreduce", "bcast", *TINY, "-n", "3", "--rounds", "1", "--algorithms", "none",
                       "--peers", "floor", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    floor = [r for r in rows if r["impl"] == "floor"]
    assert [(r["op"], r["size"]) for r in floor] == [("allreduce", 8), ("allreduce", 4096)]
    assert all(r["us"] == pytest.approx(4 * (3 - 1 / 3) / 2) for r in floor)       # rank 1's 4 us, scaled
    assert [r["us"] for r in rows if r["op"] == "allreduce" and r["impl"] == "shmcoll"] == [1, 1]
    assert rows.index(floor[0]) > max(i for i, r in enumerate(rows) if r["impl"] == "shmcoll" and r["op"] == "allreduce")
    assert "auto/floor" in capsys.readouterr().out


def test_measure_beside_alternates_repetitions():
    seen = []
    cfg = bench.parse(["allreduce", "--min-time", "0.001", "--max-iters", "2", "--reps", "4"])
    a, b, n = bench.measure_beside(lambda: seen.append("a"), lambda: seen.append("b"), lambda: seen.append("|"),
                                lambda x: x, cfg)
    assert len(a) == len(b) == 4 and n == 2
    timed_part = "".join(seen)[-40:]            # after calibration: 4 x (2 calls untimed, a sync, 2 timed), same for b
    assert timed_part == "aa|aabb|bb" * 4


@pytest.mark.parametrize("iters, warm", [(40, 16), (100, 25)])
def test_measure_beside_warms_up_16_calls_or_a_quarter(iters, warm):
    """A fold slowed by a break takes 12-15 calls back to speed, whatever
    the repetition's length."""
    seen = []
    cfg = bench.parse(["allreduce", "--min-time", "1000", "--max-iters", str(iters), "--reps", "2"])
    bench.measure_beside(lambda: seen.append("a"), lambda: seen.append("b"), lambda: seen.append("|"), lambda x: x, cfg)
    assert "".join(seen).endswith(("a" * warm + "|" + "a" * iters + "b" * warm + "|" + "b" * iters) * 2)
