"""Smoke tests of `shmcoll bench`: tiny configs, so the whole file stays well under 20 s."""
import json

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
        run, _ = real(comm, nbytes, algorithm)
        return run, lambda: False

    monkeypatch.setitem(_mpi_peer.OPS, "bcast", wrong)
    out = tmp_path / "b.json"
    assert bench.main(["bcast", *TINY, "--algorithms", "none", "--peers", "none", "--json", str(out)]) == 1
    rows = json.loads(out.read_text())["results"]
    assert rows and all(r["valid"] is False for r in rows)
    text = capsys.readouterr().out
    assert "INVALID" in text and "FAILED: shmcoll bcast" in text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("peer", ["mpich", "ompi"])
def test_mpi_peer_runs_same_method(peer):
    if not bench.peer_venv(peer):
        pytest.skip(f"peer {peer} not installed (see bench/README.md)")
    cfg = bench.parse(["barrier", *TINY])
    libraries = {}
    (row,) = bench.run_mpi(peer, "barrier", 2, cfg, libraries)
    assert row["error"] is None and row["valid"] and row["us"] > 0
    assert libraries[peer]
