"""shmcoll.model: paper 002's equations against hand-computed values; the
schedule-walking predictor against them (a machine of one latency and one
bandwidth); oversubscription; parameters as JSON; `shmcoll model`."""
import json
import math
import subprocess
import sys

import pytest

from shmcoll import model, planning
from shmcoll.model import Machine, predict, report
from shmcoll.model.predict import Where, schedule_time

A, B, K = 1e-6, 1e-9, 64 << 10


def hockney(alpha=A, beta=B, copy=None, slowdown=(1.0,) * 16, fingerprint=None):
    """A machine of one latency and one cost per byte everywhere (copy:
    a rank's own copies, staging included), no call or switch cost."""
    flat = lambda v: [[64, v], [1 << 30, v]]
    return Machine(description={"name": "hockney", "fingerprint": fingerprint, "topology": "1x16"}, call=0.0,
                   switch=0.0, alpha={lv: alpha for lv in model.LEVELS}, beta={lv: flat(beta) for lv in model.LEVELS},
                   copy=flat(beta if copy is None else copy), fold=flat(beta),
                   contention=[[64, list(slowdown)], [1 << 30, list(slowdown)]])


# -- the paper's equations, by hand ---------------------------------------------

def test_bruck_time_by_hand():
    # 3 steps of 1 us; half of 7 blocks of 1024 B per step at 1 ns/B: 3 * 3.5 * 1.024 us
    assert model.bruck_time(8, 1024, 1e-6, 1e-9) == pytest.approx(3e-6 + 10.752e-6)


def test_pairwise_time_by_hand():
    assert model.pairwise_time(8, 1024, 1e-6, 1e-9) == pytest.approx(7 * 2.024e-6)


def test_contention_wait_by_hand():
    assert model.contention_wait(0.5, 16) == pytest.approx(15 / 16 * 0.5 / 1.0)
    assert model.contention_wait(0.0, 16) == 0
    with pytest.raises(ValueError):
        model.contention_wait(1.0, 16)


def test_contention_time_by_hand():
    # (2)'s 2.024 us per step plus 32 packets x 3 hops x 2 ns of waiting
    assert model.contention_time(8, 1024, 1e-6, 1e-9, 32, 3, 2e-9) == pytest.approx(7 * 2.216e-6)


# -- the predictor reduces to them ----------------------------------------------

@pytest.mark.parametrize("p", [4, 8, 16])
def test_pairwise_schedule_is_equation_2(p):
    """Pairwise by single copy: p - 1 steps of one hand-off and one block,
    plus what (2) leaves out: the own block's local copy and the writer's
    wait for the last reader's ack before it leaves."""
    got = predict("alltoall", "pairwise", p, K, hockney(), topology="1x16")
    assert got == pytest.approx(model.pairwise_time(p, K, A, B) + K * B + A)


@pytest.mark.parametrize("p", [4, 8, 16])
def test_bruck_schedule_is_equation_1(p):
    """Bruck staged, its own copies free: lb p steps of one hand-off and
    p / 2 blocks, where (1) counts (p - 1) / 2: (1) of blocks p / (p - 1)
    as big."""
    got = predict("alltoall", "bruck", p, 1024, hockney(copy=0.0), topology="1x16")
    assert got == pytest.approx(model.bruck_time(p, 1024 * p / (p - 1), A, B))


def test_contended_pairwise_is_equation_4():
    """p copies at once each slowed s(p) times: (4) with one hop of packets
    of one byte each waiting beta (s(p) - 1) (and, as for (2), the own
    block's copy, slowed alike, and the closing ack)."""
    p, s = 8, [1.0 + 0.25 * c for c in range(16)]
    got = predict("alltoall", "pairwise", p, K, hockney(slowdown=s), topology="1x16")
    assert got == pytest.approx(model.contention_time(p, K, A, B, 1, 1, B * (s[p - 1] - 1)) + K * B * s[p - 1] + A)


def test_ranks_sharing_cpus_take_turns():
    """Copy-bound, free hand-offs: four ranks on two CPUs take twice as
    long as on four."""
    sched, params = planning.planned("alltoall", "pairwise", 4, 1 << 20, topology="1x4", cma=True, own_cpus=True)
    _, slots = planning.placed(4, "1x4", own_cpus=True)
    own, shared = Where(slots, here=False), Where(slots, here=False)
    shared.cpu = [0, 1, 0, 1]
    mc = hockney(alpha=0.0)
    assert schedule_time(sched, params, mc, shared) == pytest.approx(2 * schedule_time(sched, params, mc, own))


def test_levels_of_a_virtual_machine():
    _, slots = planning.placed(32, "2x16", own_cpus=True)
    where = Where(slots, here=False)
    assert [where.level(0, r) for r in (0, 1, 15, 16, 31)] == ["cpu", "socket", "socket", "machine", "machine"]
    assert where.cpus() == 32


def test_far_hand_offs_cost_more():
    """On the example machine a socket's ranks hand off faster than the
    two sockets': a Bcast of 32 ranks costs more than of 16."""
    assert predict("bcast", "binomial", 32, 8, model.EXAMPLE) > predict("bcast", "binomial", 16, 8, model.EXAMPLE)


# -- parameters ----------------------------------------------------------------

def test_parameters_round_trip(tmp_path):
    path = tmp_path / "m.json"
    model.EXAMPLE.save(path)
    assert model.load(path) == model.EXAMPLE
    doc = json.loads(path.read_text())
    path.write_text(json.dumps(dict(doc, version=0)))
    with pytest.raises(ValueError, match="version"):
        model.load(path)


def test_curves_interpolate_in_log_size():
    mc = hockney()
    mc.copy = [[1024, 1.0], [4096, 3.0]]
    assert [mc.per_byte(mc.copy, n) for n in (1, 1024, 2048, 4096, 1 << 20)] == [1.0, 1.0, 2.0, 3.0, 3.0]
    mc.contention = [[1024, [1.0, 1.5]]]
    assert (mc.slowdown(1, 1024), mc.slowdown(2, 1024), mc.slowdown(4, 1024)) == (1.0, 1.5, 3.0)


def test_crossovers_interpolate():
    rows = [{"algorithm": a, "size": n, "predicted": t} for a, n, t in
            [("x", 1, 1.0), ("x", 100, 100.0), ("y", 1, 10.0), ("y", 100, 10.0)]]
    (a, b, at), = report.crossovers(rows, "predicted")
    assert (a, b) == ("x", "y") and at == pytest.approx(10.0)


def test_crossovers_skip_ties():
    """A size where two algorithms run within 10% of each other names no
    winner, so noise between ties makes no crossover; the change from x
    to y is placed between the clear winners around it."""
    def rows(times):
        return [{"algorithm": a, "size": n, "predicted": t[i]} for a, t in times.items()
                for i, n in enumerate((1, 10, 100))]
    (a, b, at), = report.crossovers(rows({"x": (1.0, 1.0, 100.0), "y": (2.0, 1.05, 10.0), "z": (5.0, 5.0, 50.0)}),
                                    "predicted")
    assert (a, b) == ("x", "y") and at == pytest.approx(10 * 10 ** (math.log(1.05) / math.log(10 * 1.05)))
    assert report.crossovers(rows({"x": (1.0, 1.0, 1.0), "y": (1.05, 0.99, 1.02)}), "predicted") == []
    assert report.crossovers_agree([("x", "y", 10.0)], [("x", "y", 19.0)])
    assert not report.crossovers_agree([("x", "y", 10.0)], [("x", "y", 21.0)])
    assert not report.crossovers_agree([("x", "y", 10.0)], [])


# -- measured, here ----------------------------------------------------------------

@pytest.mark.timeout(120)
def test_measured_parameters_and_a_prediction_here():
    """This machine's parameters cover every level, and a prediction from
    them lands within 4x of a measurement (loose: the host is shared)."""
    mc = model.measure.machine(min_time=0.005)
    assert mc.here() and set(mc.alpha) == set(mc.beta) == set(model.LEVELS)
    assert mc.call > 0 and all(v > 0 for _, v in mc.copy)
    row, = report.rows("bcast", 2, [1 << 16], mc, measure=True, min_time=0.005, reps=3)[:1]
    assert 0.25 < row["predicted"] / row["measured"] < 4


@pytest.mark.timeout(60)
def test_cli_predicts_another_machine():
    out = subprocess.run([sys.executable, "-m", "shmcoll", "model", "--params", "example", "--op", "alltoall",
                          "--sizes", "8,4K,64K", "-n", "32", "--json"], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert {r["algorithm"] for r in doc["rows"]} == {"bruck", "all_at_once", "pairwise", "tiled"}
    assert all(r["measured"] is None and r["predicted"] > 0 for r in doc["rows"])
    assert not math.isnan(sum(r["predicted"] for r in doc["rows"]))
