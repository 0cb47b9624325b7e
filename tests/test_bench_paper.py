"""`shmcoll bench --paper`: every comparison of the papers measured and set beside their figures."""
import io
import json
import os
import statistics
from contextlib import redirect_stdout

import pytest

from shmcoll import bench, bench_paper as paper

SEEDS = "/work/shared/SEEDS.md"
TINY = ["--paper", "--max-size", "4K", "--min-time", "0.002", "--max-iters", "200", "--reps", "2", "--rounds", "2"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One tiny run shared by the tests: the papers' sizes capped at 4 KiB, two rounds."""
    out = tmp_path_factory.mktemp("paper") / "p.json"
    text = io.StringIO()
    with redirect_stdout(text):
        code = bench.main([*TINY, "--json", str(out)])
    return code, text.getvalue(), json.loads(out.read_text())


@pytest.mark.timeout(120)
def test_every_experiment_has_its_row(run):
    code, text, doc = run
    assert code == 0
    rows = doc["paper"]["claims"]
    assert [(r["op"], r["size"], r["base"], r["variant"]) for r in rows] == \
        [(c.op, c.size, c.base, c.variant) for c in paper.CLAIMS]
    table = text[text.index("# the papers' experiments here"):]
    lines = table.splitlines()
    for i, r in enumerate(rows, 1):
        line = next(l for l in lines if l.split()[:1] == [str(i)] and " / " in l)
        paper_gain = bench.number(r["paper_gain"]) if r["paper_gain"] else "faster"
        here = bench.number(r["gain"]) + f" [{bench.number(r['gain_min'])}-{bench.number(r['gain_max'])}]"
        assert line.split()[1:5] == [r["op"], r["variant"], "/", r["base"]]
        assert f"  {paper_gain}  " in line and here in line, line
        assert f"{i}  {r['source']}: {r['said']}" in table
    ops = {c.op for c in paper.CLAIMS}
    assert ops == {"barrier", "bcast", "alltoall", "allgather"}
    for op, (algs, _) in paper.experiments().items():       # each algorithm the papers compare was measured
        assert {r["algorithm"] for r in doc["results"] if r["op"] == op} == set(algs)


@pytest.mark.timeout(120)
def test_gains_are_ratios_of_the_measured_times(run):
    _, _, doc = run
    us = {(r["op"], r["size"], r["algorithm"], r["round"]): r["us"] for r in doc["results"]}
    for r in doc["paper"]["claims"]:
        assert r["size_here"] == min(r["size"], 4096)
        for k in range(2):
            assert r["base_us"][k] == us[r["op"], r["size_here"], r["base"], k]
            assert r["variant_us"][k] == us[r["op"], r["size_here"], r["variant"], k]
        assert r["gains"] == pytest.approx([b / v for b, v in zip(r["base_us"], r["variant_us"])])
        assert r["gain"] == pytest.approx(statistics.median(r["gains"]))
        assert (r["gain_min"], r["gain_max"]) == (min(r["gains"]), max(r["gains"]))
        assert ("run at 4K" in r["note"]) == (r["size"] > 4096)


@pytest.mark.timeout(120)
def test_caveats_say_what_this_machine_is(run):
    _, text, doc = run
    from shmcoll.topology import topology
    real = topology().to_dict()
    caveats = doc["paper"]["caveats"]
    assert caveats[0].startswith(f"caveat: this machine has {real['nsockets']} socket(s)")
    assert all(line in text for line in caveats)
    if real["nsockets"] == 1:       # a virtual topology gives hierarchical barrier its sockets
        assert doc["paper"]["machine"]["topology"] == "2x2"
        assert any("is virtual" in line for line in caveats)
        assert all(not r["can_show"] and "one socket" in r["note"] for r in doc["paper"]["claims"]
                   if r["variant"] == "hierarchical")


def test_paper_figures_are_seeds():
    """The table's figures are SEEDS.md's (paper 000's 120 KB one, its original's)."""
    if not os.path.exists(SEEDS):
        pytest.skip(f"{SEEDS} is not here")
    seeds = " ".join(open(SEEDS).read().split())     # its lines wrapped
    assert "5.7 us -> 4.97 us (padded) -> 2.28 us (hierarchical), -60%" in seeds
    assert "k 16 -> 4 cut 512 KB time by 15% (16 MB: 3.5%)" in seeds
    assert "-34.6% at 128 KB, -34.58% at 16 MB (41648 us)" in seeds
    assert "+4% at 64 KB, +14% at 16 MB" in seeds
    by = {(c.op, c.size, c.base, c.variant): c for c in paper.CLAIMS}
    K, M = 1 << 10, 1 << 20
    want = {("barrier", 0, "original", "padded"): 5.7 / 4.97, ("barrier", 0, "padded", "hierarchical"): 4.97 / 2.28,
            ("barrier", 0, "original", "hierarchical"): 1 / 0.4,
            ("bcast", 512 * K, "original", "limited"): 1 / 0.85, ("bcast", 16 * M, "original", "limited"): 1 / 0.965,
            ("bcast", 128 * K, "original", "numa"): 1 / 0.654, ("bcast", 16 * M, "original", "numa"): 1 / 0.6542,
            ("alltoall", 64 * K, "pairwise", "tiled"): 1 / 0.96, ("alltoall", 16 * M, "pairwise", "tiled"): 1 / 0.86,
            ("allgather", 120 * K, "bruck", "neighbor_exchange"): 2.0}
    assert {k: c.paper_gain for k, c in by.items() if c.paper_gain} == pytest.approx(want)
    for c in paper.CLAIMS:
        if c.source.startswith("001"):
            assert c.said in seeds, c
    assert "short messages favour recursive doubling / Bruck; long messages favour neighbor exchange" in seeds


def test_paper_takes_no_ops_and_one_count():
    with pytest.raises(SystemExit):
        bench.parse(["--paper", "barrier"])
    with pytest.raises(SystemExit):
        bench.parse(["--paper", "-n", "2,4"])
    with pytest.raises(SystemExit):
        bench.parse([])
    cfg = bench.parse(["--paper"])
    assert (cfg.nprocs, cfg.rounds, cfg.min_time, cfg.peers, cfg.auto) == ([4], 3, 0.05, [], False)
    for wrong in (["--sizes", "8"], ["--algorithms", "ring"], ["--ref", "/tmp"]):
        with pytest.raises(SystemExit):
            bench.parse(["--paper", *wrong])
    with pytest.raises(SystemExit):
        bench.parse(["barrier", "--max-size", "4K"])
