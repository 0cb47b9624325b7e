"""The tuning file: loaded when good; corrupt, stale, unreadable or
missing files reported once and ignored; precedence argument > option >
file > rules, with selected() naming the source; every rank and every
communicator of a job choosing alike; a real `shmcoll tune` writing a
file that the next job uses."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import shmcoll
from shmcoll import planning, tuning
from shmcoll.coll import select
from shmcoll.device import make_plan
from shmcoll.sched import Call
from conftest import ROOT, run_ranks


def write(path, choices, **changes):
    """A tuning file of these choices ({op: {n: [(lo, hi, algorithm, params)]}}), this machine's."""
    tuning.write(str(path), {op: {n: [{"lo": lo, "hi": hi, "algorithm": a, "params": p} for lo, hi, a, p in rs]
                                  for n, rs in by_n.items()} for op, by_n in choices.items()}, {}, {})
    if changes:
        doc = json.loads(path.read_text())
        for k, v in changes.items():
            doc[k] = dict(doc[k], **v) if isinstance(v, dict) else v
        path.write_text(json.dumps(doc))
    return str(path)


GOOD = {"bcast": {2: [(0, 1024, "original", {}), (1024, 1 << 20, "auto", {})]},
        "alltoall": {2: [(0, 1 << 30, "tiled", {"tile_bytes": 8192})]}}


@pytest.fixture
def good(tmp_path):
    return write(tmp_path / "tuning.json", GOOD)


def test_good_file_loads_and_looks_up(good):
    t = tuning.load(good)
    assert t.status == "loaded", t.describe()
    r, why = t.lookup("bcast", 2, 100)
    assert r["algorithm"] == "original" and "original" in why and good in why
    assert t.lookup("bcast", 2, 4096)[0]["algorithm"] == "auto"
    assert t.lookup("bcast", 2, 1 << 20)[0] is None            # beyond the sizes measured
    assert t.lookup("bcast", 3, 8)[0] is None                  # no table for 3 ranks
    assert t.lookup("allgather", 2, 8)[0] is None


def _bad_files(tmp_path):
    """(path, what the report says) of each kind of unusable file."""
    p = tmp_path
    (p / "notjson.json").write_text("{ not json")
    (p / "dir.json").mkdir()
    return [
        (str(p / "notjson.json"), "corrupt"),
        (write(p / "badalg.json", {"bcast": {2: [(0, 8, "nonesuch", {})]}}), "corrupt"),
        (write(p / "badop.json", {"nonesuch": {2: [(0, 8, "x", {})]}}), "corrupt"),
        (write(p / "order.json", {"bcast": {2: [(8, 16, "original", {}), (0, 8, "original", {})]}}), "corrupt"),
        (write(p / "param.json", {"bcast": {2: [(0, 8, "original", {"bcast_k": 2})]}}), "corrupt"),
        (write(p / "version.json", GOOD, machine={"shmcoll": "0.0.1"}), "stale"),
        (write(p / "cpu.json", GOOD, machine={"cpu": "another CPU"}), "stale"),
        (write(p / "format.json", GOOD, format=99), "stale"),
        (str(p / "dir.json"), "unreadable"),
        (str(p / "missing.json"), "no such file"),
    ]


def test_unusable_files_are_reported_once_and_ignored(tmp_path, capfd):
    for path, what in _bad_files(tmp_path):
        t = tuning.load(path)
        assert t.status == "ignored" and t.lookup("bcast", 2, 8)[0] is None, path
        err = capfd.readouterr().err
        assert path in err and what in err, (path, err)
        tuning.load(path)
        assert capfd.readouterr().err == "", "reported twice"


def test_default_place_and_off(tmp_path, capfd):
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    assert tuning.default_path(env) == str(tmp_path / "shmcoll" / "tuning.json")
    assert tuning.load(None, env).status == "absent"
    assert tuning.load("none").status == "off"
    assert capfd.readouterr().err == ""         # no file where none was asked for: nothing to report
    write(tmp_path / "shmcoll" / "tuning.json", GOOD)
    assert tuning.load(None, env).status == "loaded"
    assert tuning.load(None, env, virtual=True).status == "off"


def test_ranges_meet_at_geometric_midpoints_and_merge():
    a, b = ("a", {}), ("b", {"bcast_k": 2})
    got = tuning.ranges([(8, a), (32, a), (128, b), (512, a)])
    assert [(r["lo"], r["hi"], r["algorithm"]) for r in got] == [(0, 64, "a"), (64, 256, "b"), (256, 1024, "a")]
    assert got[1]["params"] == {"bcast_k": 2}
    assert tuning.ranges([(0, a)]) == [{"lo": 0, "hi": 1, "algorithm": "a", "params": {}}]


def _resolve(op, nbytes, options):
    topo, slots = planning.placed(2)
    plan = make_plan(2, topo, slots, options)
    call = Call(2, nbytes, 0, plan.params, plan.slots, len(topo.nodes), False)
    return select.resolve(op, call, None, select.forced(op, plan.params))


def test_precedence_and_parameters(good):
    name, call, _ = _resolve("bcast", 100, {"tuning_file": good})
    assert (name, name.source) == ("original", "tuning") and good in name.why
    name, _, _ = _resolve("bcast", 100, {"tuning_file": good, "bcast_algorithm": "binomial"})
    assert (name, name.source) == ("binomial", "option")
    name, _, _ = _resolve("bcast", 4096, {"tuning_file": good})    # the file found the rules fastest
    assert name.source == "rules" and "built-in rules" in name.why
    name, call, _ = _resolve("alltoall", 1 << 16, {"tuning_file": good})
    assert (name, call.params["tile_bytes"]) == ("tiled", 8192)
    name, call, _ = _resolve("alltoall", 1 << 16, {"tuning_file": good, "tile_bytes": 4096})
    assert (name, call.params["tile_bytes"]) == ("tiled", 4096)    # an option the user set wins
    name, _, _ = _resolve("bcast", 100, {"tuning_file": "none"})
    assert name.source == "rules"


def _job(comm, path):
    """Each rank's choices, from the world and from a duplicate made after
    rank 0 removed the file: the plan carries the table."""
    world = comm.selected("bcast", 100), comm.selected("bcast", 1000)
    if comm.rank == 0:
        os.unlink(path)
    comm.Barrier()
    dup = comm.Dup()
    out = [(str(s), s.source) for s in (*world, dup.selected("bcast", 100), dup.selected("alltoall", 64))]
    buf = np.arange(100, dtype=np.uint8) if comm.rank == 0 else np.zeros(100, np.uint8)
    dup.Bcast(buf, 0)
    dup.Free()
    return out, bool((buf == np.arange(100, dtype=np.uint8)).all())


def test_ranks_and_communicators_agree(good):
    got = run_ranks(_job, 2, good, options={"tuning_file": good})
    assert got[0] == got[1]
    assert got[0] == ([("original", "tuning")] * 3 + [("tiled", "tuning")], True)


def test_options_command_shows_the_file(good):
    p = subprocess.run([sys.executable, "-m", "shmcoll", "options"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, SHMCOLL_TUNING_FILE=good, SHMCOLL_TOPOLOGY=""))
    assert p.returncode == 0, p.stderr
    assert f"tuning file in use: {good} (loaded" in p.stdout


def _use(comm, path):
    """The automatic choice at the file's sizes, and each call's result against numpy."""
    doc = json.load(open(path))
    out = []
    for op, run in (("bcast", _bcast), ("allreduce", _allreduce)):
        for r in doc["choices"][op]["2"]:
            n = r["lo"] + 8 - r["lo"] % 8
            s = comm.selected(op, n, dtype=np.float64 if op == "allreduce" else None)
            out.append((op, n, r["algorithm"], str(s), s.source, run(comm, n)))
    return out


def _bcast(comm, n):
    want = np.arange(n, dtype=np.uint8)
    buf = want.copy() if comm.rank == 0 else np.zeros(n, np.uint8)
    comm.Bcast(buf, 0)
    return bool(np.array_equal(buf, want))


def _allreduce(comm, n):
    x = np.arange(n // 8, dtype=np.float64) + comm.rank
    out = np.empty_like(x)
    comm.Allreduce(x, out)
    return bool(np.array_equal(out, 2 * np.arange(n // 8) + 1))


def test_tune_writes_a_file_the_next_job_uses(tmp_path):
    path = str(tmp_path / "tuning.json")
    p = subprocess.run([sys.executable, "-m", "shmcoll", "tune", "-n", "2", "--ops", "bcast,allreduce", "--max",
                        "128", "--quick", "--rounds", "3", "-o", path], capture_output=True, text=True, timeout=240,
                       cwd=ROOT, env=dict(os.environ, SHMCOLL_TOPOLOGY=""))
    assert p.returncode == 0, p.stderr
    assert f"wrote {path}" in p.stdout and tuning.load(path).status == "loaded"
    doc = json.load(open(path))
    assert [r["bytes"] for r in doc["measured"]["bcast"]["2"]] == [8, 32, 128]
    got = run_ranks(_use, 2, path, options={"tuning_file": path})
    assert got[0] == got[1]
    for op, n, algorithm, chosen, source, ok in got[0]:
        assert ok, (op, n)
        assert source == ("rules" if algorithm == "auto" else "tuning"), (op, n, source)
        assert algorithm in ("auto", chosen), (op, n, algorithm, chosen)


def test_model_where_the_file_says_nothing(tmp_path, good, capfd):
    from shmcoll import model
    from shmcoll.model.machine import fingerprint
    mine = str(tmp_path / "model.json")
    model.Machine(**dict(vars(model.EXAMPLE), description=dict(model.EXAMPLE.description,
                                                               fingerprint=fingerprint()))).save(mine)
    name, _, _ = _resolve("allgather", 4096, {"tuning_file": good, "model_params": mine})
    assert name.source == "model" and name in shmcoll.algorithms("allgather") and "model" in name.why
    name, _, _ = _resolve("bcast", 100, {"tuning_file": good, "model_params": mine})
    assert name.source == "tuning"                      # the file first
    other = str(tmp_path / "other.json")
    model.EXAMPLE.save(other)                           # not this machine's: reported, not asked
    name, _, _ = _resolve("allgather", 4096, {"tuning_file": good, "model_params": other})
    assert name.source == "rules" and "another machine" in capfd.readouterr().err


def test_decide_takes_a_forced_algorithm_only_where_it_is_another_program():
    """The rules' own algorithm forced is the rules' program unless they
    run it as twins: then, measured faster by more than the tolerance, it
    is taken; as one program, the gap is noise and the file says auto.
    Another algorithm must beat both the rules and their algorithm forced."""
    from shmcoll import tune

    def row(ratio, chosen="pairwise", twins=False):
        return {"bytes": 64, "ratio": dict(ratio, auto=1.0), "chosen": chosen, "twins": twins}
    rows = [row({"pairwise": 0.9}), row({"pairwise": 0.9}, twins=True), row({"pairwise": 0.99}, twins=True),
            row({"pairwise": 0.95, "bruck": 0.9}), row({"pairwise": 0.9, "bruck": 0.89})]
    assert [choice for _, (choice, _) in tune.decide(rows)] == ["auto", "pairwise", "auto", "bruck", "auto"]
    lucky = dict(row({"pairwise": 0.95, "bruck": 0.9}), wins={"bruck": 3 / 7})    # a median from a few fast rounds
    assert tune.decide([lucky]) == [(64, ("auto", {}))]
