"""shmcoll.model.network: the network string, the hierarchical Alltoall
reducing to paper 002's (2) and (4) by hand where the node costs nothing,
contention growing with the injection rate, the derived rate being the
closed loop's fixed point, and `shmcoll model --nodes`."""
import json
import subprocess
import sys

import pytest

from shmcoll import model
from shmcoll.model import Machine, network
from shmcoll.model.network import Network, hierarchical_alltoall, parse

NET = "alpha=1.5us,beta=12.5GB/s,hops=3,radix=48"
A, B, H, R, PK = 1.5e-6, 8e-11, 3, 48, 4096


def free():
    """A node whose legs cost nothing: what is left is the network's."""
    zero = [[64, 0.0], [1 << 30, 0.0]]
    return Machine(description={"name": "free", "fingerprint": None, "topology": "1x64"}, call=0.0, switch=0.0,
                   alpha={lv: 0.0 for lv in model.LEVELS}, beta={lv: zero for lv in model.LEVELS}, copy=zero,
                   fold=zero, contention=[[64, [1.0] * 64]])


def wait_by_hand(rho, tick=PK * B):
    """(3) in cycles, times a cycle's seconds."""
    return (1 - 1 / R) * rho / (2 * (1 - rho)) * tick


# -- the network string -----------------------------------------------------------

@pytest.mark.parametrize("field, text, value", [
    ("alpha", "1.5us", 1.5e-6), ("alpha", "1500ns", 1.5e-6), ("alpha", "0.0015ms", 1.5e-6), ("alpha", "2e-6", 2e-6),
    ("alpha", "1.5µs", 1.5e-6),
    ("beta", "12.5GB/s", 8e-11), ("beta", "100Gb/s", 8e-11), ("beta", "1GiB/s", 1 / (1 << 30)),
    ("beta", "0.08ns/B", 8e-11), ("beta", "8e-11", 8e-11),
    ("packet", "4K", 4096), ("packet", "32B", 32), ("packet", "2KiB", 2048), ("packet", "256", 256),
    ("cycle", "3.2ns", 3.2e-9), ("rho", "0.25", 0.25)])
def test_units(field, text, value):
    base = dict(x.split("=") for x in NET.split(","))
    net = parse(",".join(f"{k}={v}" for k, v in {**base, field: text}.items()))
    assert getattr(net, field) == pytest.approx(value, rel=1e-12)


def test_defaults_and_wait():
    net = parse(NET)
    assert (net.alpha, net.hops, net.radix, net.packet) == (pytest.approx(A), H, R, PK)
    assert net.tick == pytest.approx(PK * B)             # one packet's time on a link
    assert parse("alpha=1us,beta=1GB/s,hops=2,wait=5ns").wait == pytest.approx(5e-9)    # no radix needed


@pytest.mark.parametrize("text, field", [
    ("alpha=fast,beta=1GB/s,hops=1,radix=8", "alpha"), ("alpha=1us,beta=1XB/s,hops=1,radix=8", "beta"),
    ("alpha=1us,beta=1GB/s,hops=three,radix=8", "hops"), ("alpha=1us,beta=1GB/s,hops=1", "radix"),
    ("beta=1GB/s,hops=1,radix=8", "alpha"), ("alpha=1us,beta=1GB/s,hops=1,radix=8,colour=red", "colour"),
    ("alpha=1us,beta=1GB/s,hops=1,radix=8,rho=1.5", "rho"), ("alpha=1us,beta=1GB/s,hops=1,radix=1", "radix"),
    ("alpha=1us,beta=1GB/s,hops=1,radix=8,packet=0", "packet"),
    ("alpha=1us,beta=1GB/s,hops=1,radix=8,packet", "packet"),
    ("alpha=1us,alpha=2us,beta=1GB/s,hops=1,radix=8", "alpha"), ("alpha=-1us,beta=1GB/s,hops=1,radix=8", "alpha")])
def test_bad_strings_name_the_field(text, field):
    with pytest.raises(ValueError, match=f"network: .*{field}"):
        parse(text)


def test_rho_and_wait_exclude_each_other():
    with pytest.raises(ValueError, match="rho and wait"):
        parse(NET + ",rho=0.1,wait=1ns")


# -- the limits: paper 002's equations, by hand ----------------------------------

@pytest.mark.parametrize("rho", [0.0, 0.3])
def test_one_rank_per_node_is_equation_4(rho):
    """P = 1 on a free node: both strategies are (4) of p = N, and (2)
    where nothing waits (rho = 0)."""
    n, k = 8, 1 << 16
    got = hierarchical_alltoall(n, 1, k, free(), parse(NET + f",rho={rho}"))
    by_hand = (n - 1) * (A + k * B + k / PK * H * wait_by_hand(rho))
    assert got["direct"]["total"] == pytest.approx(by_hand, rel=1e-12)
    assert got["leader"]["total"] == pytest.approx(by_hand, rel=1e-12)
    if rho == 0:
        assert by_hand == pytest.approx((n - 1) * (A + k * B))


def test_free_node_leaves_the_network_legs():
    """P = 32 on a free node: direct is (N - 1) P steps of P blocks through
    one link, each rank's block waiting its own packets' waits; leader is
    N - 1 steps of one P * P-block message."""
    n, p, k, rho = 8, 32, 4096, 0.4
    got = hierarchical_alltoall(n, p, k, free(), parse(NET + f",rho={rho}"))
    w = wait_by_hand(rho)
    assert got["direct"]["total"] == pytest.approx((n - 1) * p * (A + p * k * B + k / PK * H * w), rel=1e-12)
    assert got["leader"]["total"] == pytest.approx((n - 1) * (A + p * p * k * B + p * p * k / PK * H * w), rel=1e-12)
    assert got["leader"]["gather"]["time"] == got["leader"]["scatter"]["time"] == 0.0
    leg = got["direct"]["network"]
    assert leg["latency"] + leg["bandwidth"] + leg["contention"] == pytest.approx(leg["time"], rel=1e-12)


def test_a_given_wait_replaces_the_queue():
    got = hierarchical_alltoall(4, 2, 8192, free(), parse("alpha=1us,beta=1GB/s,hops=2,wait=10ns"))
    assert got["direct"]["total"] == pytest.approx(3 * 2 * (1e-6 + 2 * 8192e-9 + 2 * 2 * 10e-9), rel=1e-12)
    assert got["direct"]["network"]["rho"] is None


def test_contention_grows_with_rho():
    times = [hierarchical_alltoall(4, 4, 1 << 14, free(), parse(NET + f",rho={r}"))
             for r in (0.0, 0.2, 0.5, 0.8, 0.95)]
    for name in ("direct", "leader"):
        totals = [t[name]["total"] for t in times]
        assert all(a < b for a, b in zip(totals, totals[1:])), (name, totals)


@pytest.mark.parametrize("streams, msg", [(32, 4096), (1, 32 * 32 * 4096), (8, 8), (32, 1 << 20)])
def test_derived_rho_is_the_closed_loop_fixed_point(streams, msg):
    """rho = the link's packets per cycle over a step that the waits at
    that rho lengthen: rho = streams msg beta / (alpha + streams msg beta
    + msg beta hops w(rho)) (a cycle is a packet's time on the link)."""
    rho = network.rho_of(parse(NET), msg, streams)
    step = A + streams * msg * B + msg / PK * H * wait_by_hand(rho)
    assert 0 < rho < 1 and rho == pytest.approx(streams * msg * B / step, rel=1e-9)


# -- the example machine, and the command -----------------------------------------

def test_leader_wins_small_blocks_direct_large():
    """8 nodes of 32 ranks on the example machine: gathering to a leader
    saves (N - 1)(P - 1) network latencies, which small blocks are made
    of; large blocks pay the leader's long messages' waits under (4) and
    the gather and scatter."""
    net = parse(NET)
    small, large = (hierarchical_alltoall(8, 32, k, model.EXAMPLE, net) for k in (8, 1 << 20))
    assert small["winner"] == "leader" and large["winner"] == "direct"
    for got in (small, large):
        for name in ("direct", "leader"):
            s = got[name]
            assert s["total"] == pytest.approx(sum(leg["time"] for key, leg in s.items() if key != "total"))
            assert s["intra"]["time"] > 0


def _model(*args):
    return subprocess.run([sys.executable, "-m", "shmcoll", "model", "--nodes", "8", "--ppn", "32", "--params",
                           "example", "--network", NET, "--sizes", "8,64K", *args], capture_output=True, text=True,
                          timeout=100)


@pytest.mark.timeout(120)
def test_cli_prints_the_table():
    out = _model()
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("# hierarchical Alltoall, 8 nodes x 32 ranks")
    rows = [line.split() for line in lines if line.split()[:1] in (["8"], ["64K"])]
    assert [r[:2] for r in rows] == [["8", "direct"], ["8", "leader"], ["64K", "direct"], ["64K", "leader"]]
    assert all(len(r) == 10 for r in rows)
    assert sum(line.lstrip().startswith("-> ") for line in lines) == 2


@pytest.mark.timeout(120)
def test_cli_json():
    out = _model("--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["network"]["hops"] == 3 and doc["network"]["beta"] == pytest.approx(B)
    assert [r["k"] for r in doc["rows"]] == [8, 65536]
    for r in doc["rows"]:
        assert (r["nodes"], r["ppn"]) == (8, 32)
        assert r["winner"] == min(("direct", "leader"), key=lambda s: r[s]["total"])
        assert set(r["leader"]) == {"intra", "gather", "network", "scatter", "total"}


def test_cli_needs_a_network():
    out = subprocess.run([sys.executable, "-m", "shmcoll", "model", "--nodes", "2", "--params", "example"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--network" in out.stderr
