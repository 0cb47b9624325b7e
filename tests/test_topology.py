"""Tests for shmcoll.topology: live /sys, recorded fixtures, virtual specs, placement."""
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

import importlib

T = importlib.import_module("shmcoll.topology")  # the package exports the function topology()

FIX = Path(__file__).parent / "fixtures"
S2N4 = str(FIX / "sys-2s4n")
S1N1 = str(FIX / "sys-1s1n")
K, M = 1024, 1024 * 1024
AFFINITY = {2, 3, 4, 5, 6, 99}   # pretend affinity; 99 exists in no fixture
ALLOWED = [2, 3, 4, 5, 6]         # AFFINITY & real cpus of sys-2s4n, sorted


@pytest.fixture(autouse=True)
def _fresh_cache():
    T._cached.cache_clear()
    yield
    T._cached.cache_clear()


@pytest.fixture
def pinned(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(AFFINITY))


@pytest.fixture(scope="module")
def big():
    return T.read_sysfs(S2N4)


def _partition(groups, universe):
    flat = [c for g in groups for c in g]
    return len(flat) == len(set(flat)) and set(flat) == set(universe)


# -- live machine -------------------------------------------------------------

def test_live_matches_os():
    t = T.read_sysfs()
    cpus = sorted(t.cpu_map)
    assert t.spec is None and set(cpus) == os.sched_getaffinity(0)
    assert t.cpu_map == {c: c for c in cpus}
    physical = psutil.cpu_count(logical=False)
    if physical is not None and len(cpus) == os.cpu_count():
        assert t.ncores == physical
    assert _partition([c.cpus for c in t.cores], cpus)
    assert _partition([n.cpus for n in t.nodes], cpus)
    assert [c.index for c in t.cores] == list(range(t.ncores))
    assert sorted({c.socket for c in t.cores}) == list(range(t.nsockets))
    assert any(n.id == 0 for n in t.nodes)
    assert sum(n.memory for n in t.nodes) > 0
    assert all(len(n.distances) == len(t.nodes) for n in t.nodes)
    if t.cache_size(3):
        assert t.cache_size(3) > t.cache_size(2) > 0
    if t.caches:
        assert t.shared_cache_size() >= t.cache_size(1) > 0


def test_live_default_and_cached(monkeypatch):
    monkeypatch.delenv(T.ENV_VAR, raising=False)
    t = T.topology()
    assert t == T.read_sysfs() and t is T.topology()
    assert len(t.placement(t.ncores)) == t.ncores


# -- recorded 2-socket / 4-node fixture ----------------------------------------

def test_fixture_counts(big):
    assert (big.nsockets, big.ncores, big.ncpus, len(big.nodes)) == (2, 8, 16, 4)
    assert big.spec is None and big.cpu_map == {c: c for c in range(16)}


@pytest.mark.parametrize("index,socket,node,cpus", [
    (0, 0, 0, (0, 8)), (1, 0, 0, (1, 9)), (2, 0, 1, (2, 10)), (3, 0, 1, (3, 11)),
    (4, 1, 2, (4, 12)), (5, 1, 2, (5, 13)), (6, 1, 3, (6, 14)), (7, 1, 3, (7, 15)),
])
def test_fixture_cores(big, index, socket, node, cpus):
    assert big.cores[index] == T.Core(index, socket, node, cpus)


@pytest.mark.parametrize("nid,cpus,gib,dist", [
    (0, (0, 1, 8, 9), 16, (10, 12, 21, 21)),
    (1, (2, 3, 10, 11), 16, (12, 10, 21, 21)),
    (2, (4, 5, 12, 13), 8, (21, 21, 10, 12)),
    (3, (6, 7, 14, 15), 8, (21, 21, 12, 10)),
])
def test_fixture_nodes(big, nid, cpus, gib, dist):
    assert big.nodes[nid] == T.NumaNode(nid, cpus, gib * 1024 * M, dist)
    assert big.real_node_of(nid) == nid


@pytest.mark.parametrize("level,kind,size,count,width", [
    (1, "Data", 48 * K, 8, 2), (1, "Instruction", 32 * K, 8, 2),
    (2, "Unified", 2 * M, 8, 2), (3, "Unified", 60 * M, 2, 8),
])
def test_fixture_caches(big, level, kind, size, count, width):
    found = [c for c in big.caches if (c.level, c.kind) == (level, kind)]
    assert len(found) == count
    assert all(c.size == size and len(c.cpus) == width for c in found)
    assert _partition([c.cpus for c in found], range(16))
    if width == 2:
        assert {c.cpus for c in found} == {core.cpus for core in big.cores}


def test_fixture_l3_per_socket(big):
    l3 = {c.cpus for c in big.caches if c.level == 3}
    assert l3 == {(0, 1, 2, 3, 8, 9, 10, 11), (4, 5, 6, 7, 12, 13, 14, 15)}


@pytest.mark.parametrize("level,size", [(1, 48 * K), (2, 2 * M), (3, 60 * M), (4, 0)])
def test_fixture_cache_size(big, level, size):
    assert big.cache_size(level) == size


def test_fixture_shared_cache(big):
    assert big.shared_cache_size() == 60 * M


def test_fixture_describe_and_dict(big):
    text = big.describe()
    for nid in range(4):
        assert f"node {nid} " in text
    for needle in ("2 socket", "8 core", "16 CPU", "60 MiB", "48 KiB", "2 MiB",
                   "cpus 0-1,8-9", "21 21 12 10", "16.0 GiB", "shared by 8"):
        assert needle in text
    d = json.loads(json.dumps(big.to_dict()))
    assert (d["nsockets"], d["ncores"], d["ncpus"]) == (2, 8, 16)
    assert [n["cpus"] for n in d["nodes"]][1] == [2, 3, 10, 11]
    assert d["cpu_map"]["15"] == 15


@pytest.mark.parametrize("bind,expected", [
    ("core", {1, 9}), ("socket", {0, 1, 2, 3, 8, 9, 10, 11}), ("numa", {0, 1, 8, 9}),
    ("none", {2, 3, 4, 5, 6}),
])
def test_fixture_bind(big, pinned, bind, expected):
    slot = big.placement(2, bind=bind)[1]
    assert (slot.core, slot.socket, slot.node, slot.real_node) == (1, 0, 0, 0)
    assert slot.cpus == frozenset(expected)


@pytest.mark.parametrize("map,cores", [
    ("compact", [0, 1, 2, 3, 4, 5, 6, 7]), ("scatter", [0, 4, 1, 5, 2, 6, 3, 7]),
])
def test_fixture_map(big, map, cores):
    slots = big.placement(8, map=map)
    assert [s.core for s in slots] == cores and [s.rank for s in slots] == list(range(8))
    assert [s.real_node for s in slots] == [big.cores[c].node for c in cores]
    assert [s.cpus for s in slots] == [frozenset(big.cores[c].cpus) for c in cores]


# -- degraded fixtures -------------------------------------------------------

def test_small_fixture_offline_and_no_nodes():
    t = T.read_sysfs(S1N1)
    assert (t.nsockets, t.ncores, t.ncpus) == (1, 4, 7)
    assert [c.cpus for c in t.cores] == [(0, 1), (2, 3), (4, 5), (6,)]
    assert t.nodes == (T.NumaNode(0, tuple(range(7)), 0, (10,)),)
    assert 7 not in t.cpu_map and all(7 not in c.cpus for c in t.caches)
    assert (t.cache_size(1), t.cache_size(2), t.cache_size(3)) == (32 * K, 512 * K, 0)
    assert t.shared_cache_size() == 512 * K      # L2 shared by SMT pairs
    assert "unknown/none" in t.describe()


def _write(root, rel, text):
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text + "\n")


def test_bare_tree_no_topology_no_caches(tmp_path):
    _write(tmp_path, "devices/system/cpu/online", "0-2")
    t = T.read_sysfs(str(tmp_path))
    assert [c.cpus for c in t.cores] == [(0,), (1,), (2,)] and t.nsockets == 1
    assert t.caches == () and t.cache_size(1) == 0 and t.shared_cache_size() == 0
    assert "none found" in t.describe()


def test_private_caches_only_fall_back_to_highest_level(tmp_path):
    """No shared cache: report the highest private level as cpu 0 sees it
    (cpu 1's bigger L2, as on hybrid P/E-core parts, must not win)."""
    _write(tmp_path, "devices/system/cpu/online", "0-1")
    for cpu in (0, 1):
        for i, (level, kind, size) in enumerate([(1, "Data", "32K"), (2, "Unified", f"{cpu + 1}M")]):
            d = f"devices/system/cpu/cpu{cpu}/cache/index{i}"
            for name, val in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", cpu)):
                _write(tmp_path, f"{d}/{name}", str(val))
    t = T.read_sysfs(str(tmp_path))
    assert len(t.caches) == 4 and t.shared_cache_size() == M


# -- specs ----------------------------------------------------------------------

@pytest.mark.parametrize("spec,expected", [
    ("2x4", (2, 4, 2)), ("2x4x4", (2, 4, 4)), ("4x2x2", (4, 2, 2)), ("2x2x4", (2, 2, 4)),
    ("1x1", (1, 1, 1)), ("4x8x1", (4, 8, 1)), (" 2X4 ", (2, 4, 2)), ("1x6x3", (1, 6, 3)),
])
def test_parse_spec_good(spec, expected):
    assert T.parse_spec(spec) == expected


@pytest.mark.parametrize("spec", [
    "", "2", "2x", "x4", "2x4x3", "2x0", "0x4", "2x4x0", "2x3x4", "3x4x2",
    "2x4x8x1", "axb", "-2x4", "2.5x4", "2x2x8",
])
def test_parse_spec_bad(spec):
    with pytest.raises(ValueError, match="spec " + repr(spec).replace(".", r"\.")):
        T.parse_spec(spec)


VSPECS = {   # spec -> (core sockets, core nodes)
    "2x4": ([0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1]),
    "2x4x4": ([0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 2, 2, 3, 3]),
    "4x2x2": ([0, 0, 1, 1, 2, 2, 3, 3], [0, 0, 0, 0, 1, 1, 1, 1]),
    "2x2x4": ([0, 0, 1, 1], [0, 1, 2, 3]),
}


@pytest.mark.parametrize("spec", VSPECS)
def test_virtual_shape(big, pinned, spec):
    sockets, nodes = VSPECS[spec]
    s, c, n = T.parse_spec(spec)
    v = T.virtual(spec, big)
    assert (v.spec, v.nsockets, v.ncores, v.ncpus, len(v.nodes)) == (spec, s, s * c, s * c, n)
    assert [core.socket for core in v.cores] == sockets
    assert [core.node for core in v.cores] == nodes
    assert all(core.cpus == (core.index,) for core in v.cores)
    assert v.cpu_map == {i: ALLOWED[i % len(ALLOWED)] for i in range(s * c)}
    for i, node in enumerate(v.nodes):
        assert node.id == i and node.cpus == tuple(k for k, x in enumerate(nodes) if x == i)
        assert v.real_node_of(i) == i % 4 and node.memory == big.nodes[i % 4].memory
        for j, d in enumerate(node.distances):
            same = sockets[nodes.index(i)] == sockets[nodes.index(j)]
            assert d == (10 if i == j else 12 if same else 21)


@pytest.mark.parametrize("spec", VSPECS)
def test_virtual_caches(big, spec):
    s, c, _ = T.parse_spec(spec)
    v = T.virtual(spec, big)
    by_level = {lvl: [x for x in v.caches if x.level == lvl] for lvl in (1, 2, 3)}
    assert [(x.kind, x.size, x.cpus) for x in by_level[1]] == [("Data", 48 * K, (i,)) for i in range(s * c)]
    assert [(x.size, x.cpus) for x in by_level[2]] == [(2 * M, (i,)) for i in range(s * c)]
    assert [(x.size, x.cpus) for x in by_level[3]] == [(60 * M, tuple(range(k * c, k * c + c))) for k in range(s)]
    assert v.cache_size(3) == v.shared_cache_size() == 60 * M
    assert "virtual " + spec in v.describe()


def test_virtual_without_l3_or_numa():
    v = T.virtual("2x4x4", T.read_sysfs(S1N1))
    assert {x.level for x in v.caches} == {1, 2} and v.cache_size(3) == 0
    assert [v.real_node_of(i) for i in range(4)] == [0, 0, 0, 0]
    assert {s.real_node for s in v.placement(8)} == {0}


def test_virtual_live_wraps_onto_affinity():
    allowed = sorted(os.sched_getaffinity(0))
    v = T.virtual("4x8x8", T.read_sysfs())
    assert set(v.cpu_map.values()) == set(allowed[:32])
    assert [v.cpu_map[i] for i in range(32)] == [allowed[i % len(allowed)] for i in range(32)]


# -- placement on virtual topologies ----------------------------------------------

@pytest.mark.parametrize("spec,map,nranks,cores", [
    ("2x4x4", "compact", 8, [0, 1, 2, 3, 4, 5, 6, 7]),
    ("2x4x4", "compact", 16, [0, 1, 2, 3, 4, 5, 6, 7] * 2),
    ("2x4x4", "scatter", 8, [0, 4, 1, 5, 2, 6, 3, 7]),
    ("2x4x4", "scatter", 16, [0, 4, 1, 5, 2, 6, 3, 7] * 2),
    ("4x2x2", "scatter", 8, [0, 2, 4, 6, 1, 3, 5, 7]),
    ("4x2x2", "scatter", 16, [0, 2, 4, 6, 1, 3, 5, 7] * 2),
    ("2x2x4", "compact", 8, [0, 1, 2, 3] * 2),
    ("2x2x4", "scatter", 8, [0, 2, 1, 3] * 2),
    ("2x4", "scatter", 3, [0, 4, 1]),
])
def test_virtual_map(big, pinned, spec, map, nranks, cores):
    v = T.virtual(spec, big)
    slots = v.placement(nranks, map=map)
    assert [s.rank for s in slots] == list(range(nranks))
    assert [s.core for s in slots] == cores
    assert [(s.socket, s.node) for s in slots] == [(v.cores[c].socket, v.cores[c].node) for c in cores]
    assert [s.real_node for s in slots] == [v.cores[c].node % 4 for c in cores]
    assert [s.cpus for s in slots] == [frozenset({ALLOWED[c % 5]}) for c in cores]


@pytest.mark.parametrize("spec,bind,rank,expected", [
    ("2x4x4", "core", 5, {2}),
    ("2x4x4", "socket", 0, {2, 3, 4, 5}),
    ("2x4x4", "socket", 7, {6, 2, 3, 4}),
    ("2x4x4", "numa", 2, {4, 5}),
    ("2x4x4", "numa", 6, {3, 4}),
    ("2x4x4", "none", 3, {2, 3, 4, 5, 6}),
    ("2x2x4", "none", 0, {2, 3, 4, 5}),
    ("2x2x4", "numa", 3, {5}),
    ("4x2x2", "numa", 5, {2, 3, 4, 6}),
    ("4x2x2", "socket", 2, {4, 5}),
])
def test_virtual_bind(big, pinned, spec, bind, rank, expected):
    slot = T.virtual(spec, big).placement(8, bind=bind)[rank]
    assert slot.cpus == frozenset(expected)


@pytest.mark.parametrize("kwargs,name", [
    ({"bind": "thread"}, "thread"), ({"map": "spread"}, "spread"), ({"bind": "Core"}, "Core"),
])
def test_placement_rejects_unknown(big, kwargs, name):
    with pytest.raises(ValueError, match=name):
        big.placement(4, **kwargs)


def test_placement_edge_counts(big):
    assert big.placement(0) == []
    with pytest.raises(ValueError):
        big.placement(-1)


# -- topology() / environment ---------------------------------------------------

def test_env_selects_virtual(monkeypatch, pinned):
    monkeypatch.setenv(T.ENV_VAR, "2x2x4")
    t = T.topology(sysfs=S2N4)
    assert (t.spec, t.ncores, len(t.nodes)) == ("2x2x4", 4, 4)
    assert T.topology("2x4", sysfs=S2N4).spec == "2x4"          # explicit spec wins
    monkeypatch.setenv(T.ENV_VAR, "")
    assert T.topology(sysfs=S2N4) == T.read_sysfs(S2N4)         # empty -> real
    monkeypatch.setenv(T.ENV_VAR, "2x3x4")
    with pytest.raises(ValueError, match="2x3x4"):
        T.topology(sysfs=S2N4)


def test_topology_cached_per_key(pinned):
    a = T.topology("2x4", sysfs=S2N4)
    assert a is T.topology("2x4", sysfs=S2N4) and a is not T.topology("2x4x4", sysfs=S2N4)


def test_live_topology_keeps_to_the_cpus_this_process_may_use():
    """Under taskset or a cgroup's cpuset only the allowed CPUs are cores
    (as mpiexec binds): here one CPU, so 3 ranks bound by core all run on
    it, where before rank 1 was bound to a CPU it may not use."""
    code = ("import os, importlib; T = importlib.import_module('shmcoll.topology'); "
            "cpu = min(os.sched_getaffinity(0)); os.sched_setaffinity(0, {cpu}); t = T.read_sysfs(); print(cpu, sorted(t.cpu_map), t.ncores, "
            "[sorted(s.cpus) for s in t.placement(3, 'core')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    cpu = int(out.split()[0])
    assert out.split(" ", 1)[1].strip() == f"[{cpu}] 1 [[{cpu}], [{cpu}], [{cpu}]]"
