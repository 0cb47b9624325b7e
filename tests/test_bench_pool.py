"""`shmcoll bench pool` runs end to end, times every pool that imports, and
its checks against Python and numpy pass (a wrong result fails the run)."""
import json
import subprocess
import sys

import pytest


@pytest.mark.timeout(300)
def test_bench_pool_quick(tmp_path):
    out = tmp_path / "pool.json"
    run = subprocess.run([sys.executable, "-m", "shmcoll", "bench", "pool", "-n", "2", "--rounds", "1", "--quick",
                          "--columns", "shmcoll,ppe,mp", "--json", str(out)],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    assert doc["columns"] == ["shmcoll", "ppe", "mp"]
    for m in ("rtt", "map100k", "array64m"):
        assert m in run.stdout
        times = doc["results"]["2"][m]
        assert set(times) == {"shmcoll", "ppe", "mp"}
        assert all(len(v) == 1 and v[0] > 0 for v in times.values())


def test_bench_pool_refuses_bad_arguments():
    for bad in (["--measures", "latency"], ["--columns", "ray"], ["-n", "0"]):
        run = subprocess.run([sys.executable, "-m", "shmcoll", "bench", "pool", *bad], capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 2 and "error" in run.stderr
