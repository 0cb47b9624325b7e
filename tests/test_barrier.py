"""Barrier: no rank may leave barrier i before every rank has entered it.

Each rank, in iteration i, writes i into its own slot of a shared array,
calls Barrier, then checks that every slot holds exactly i.  Two arrays
alternate, so slot values of iteration i can only be overwritten (with
i + 2) after the barrier of iteration i + 1, which needs this rank's check to
be over: with a correct barrier the check never sees anything but i."""
import os
import time
import types

import numpy as np
import pytest

import shmcoll
from shmcoll.coll import barrier
from shmcoll.topology import read_sysfs
from conftest import run_ranks, shared_array

NAMED = ["original", "padded", "hierarchical", "all_to_all"]
ALGS = NAMED + [None]
RANKS = [1, 2, 3, 4, 5, 8, 16]


def iterations(n):
    # thousands where ranks have their own core, hundreds when oversubscribed
    return 5000 if n <= 2 else 2000 if n <= 5 else 600 if n <= 8 else 400


def _ordering_job(comm, flags, iters, algs):
    me, n = comm.rank, comm.size
    bad = []
    for i in range(1, iters + 1):
        alg = algs[i % len(algs)]
        a = flags[i % 2]
        a[me] = i
        comm.Barrier(alg)
        if not (a == i).all() and len(bad) < 5:
            bad.append((i, alg, a.tolist()))
    # the last write of every rank is visible once everybody is through
    comm.Barrier(algs[0])
    last = flags[iters % 2]
    assert (last == iters).all(), last.tolist()
    return bad


def check_ordering(n, algs, iters, **kw):
    flags = shared_array((2, n), np.int64, fill=0)
    results = run_ranks(_ordering_job, n, flags, iters, algs, **kw)
    assert len(results) == n
    violations = {r: v for r, v in enumerate(results) if v}
    assert violations == {}, f"ranks left a barrier early (iteration, alg, slots): {violations}"


@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("alg", ALGS, ids=lambda a: a or "auto")
def test_barrier_real_topology(alg, n):
    check_ordering(n, [alg], iterations(n))


VIRTUAL = [("2x2", 3), ("2x2", 4), ("2x4", 5), ("2x4", 8), ("4x2", 8), ("4x2", 7),
           ("2x2x4", 4), ("2x2x4", 5), ("4x4", 16), ("2x8x4", 16), ("2x2", 2), ("2x4", 1)]


@pytest.mark.parametrize("topo,n", VIRTUAL, ids=[f"{t}-{n}" for t, n in VIRTUAL])
@pytest.mark.parametrize("alg", ALGS, ids=lambda a: a or "auto")
def test_barrier_virtual_topology(alg, topo, n):
    check_ordering(n, [alg], iterations(n), topology=topo)


@pytest.mark.parametrize("topo,n", [(None, 2), (None, 5), ("2x4", 8), ("4x4", 16)])
def test_barrier_algorithms_interleaved(topo, n):
    """Changing the algorithm from one call to the next (stamps of one
    algorithm's lines must never satisfy another's waits)."""
    check_ordering(n, ["original", "all_to_all", "padded", "hierarchical", None, "all_to_all", "original"],
                   iterations(n), topology=topo)


@pytest.mark.parametrize("bind,map", [("socket", "compact"), ("none", "compact"), ("core", "scatter")])
def test_barrier_bind_and_map(bind, map):
    check_ordering(4, ALGS, 600, topology="2x2", bind=bind, map=map)


def _late_job(comm, delay, alg):
    comm.Barrier(alg)                     # everybody is up
    if comm.rank == comm.size - 1:
        time.sleep(delay)
    t = time.monotonic()
    comm.Barrier(alg)
    return time.monotonic() - t


@pytest.mark.parametrize("alg", ALGS, ids=lambda a: a or "auto")
def test_barrier_waits_for_a_late_rank(alg):
    delay = 0.3
    waited = run_ranks(_late_job, 3, delay, alg)
    # everybody but the late rank must have waited (close to) the delay
    for r, w in enumerate(waited[:-1]):
        assert w >= delay * 0.8, f"rank {r} left after {w:.3f} s, the late rank slept {delay} s"


# -- selection ---------------------------------------------------------------

def _bar_id(comm):
    return comm.selected("barrier", 0)


def test_barrier_algorithm_names():
    assert shmcoll.algorithms("barrier") == NAMED


@pytest.mark.parametrize("alg", NAMED)
def test_barrier_algorithm_from_env(alg, monkeypatch):
    monkeypatch.setenv("SHMCOLL_BARRIER_ALGORITHM", alg)
    got = run_ranks(_bar_id, 3, topology="2x2")
    assert got == [alg] * 3
    check_ordering(3, [None], 300, topology="2x2")


@pytest.mark.parametrize("alg", NAMED)
def test_barrier_algorithm_from_options(alg, monkeypatch):
    other = "original" if alg != "original" else "padded"
    monkeypatch.setenv("SHMCOLL_BARRIER_ALGORITHM", other)
    got = run_ranks(_bar_id, 3, topology="2x2", options={"barrier_algorithm": alg})
    assert got == [alg] * 3          # argument beats environment


@pytest.mark.parametrize("topo,n", [(None, 2), (None, 4), ("2x2", 2), ("2x2", 3), ("2x4", 8), ("1x4", 4)])
def test_barrier_automatic_choice(topo, n, monkeypatch):
    """The automatic choice (policy tuned in coll/barrier.py) is a real
    algorithm and the same on every rank."""
    monkeypatch.delenv("SHMCOLL_BARRIER_ALGORITHM", raising=False)
    got = run_ranks(_bar_id, n, topology=topo)
    assert got[0] in shmcoll.algorithms("barrier") and got == [got[0]] * n


@pytest.mark.parametrize("topo,n,bind", [(None, 2, "core"), ("1x2", 3, "core"), ("1x2", 4, "core"),
                                         ("2x2", 5, "core"), ("1x2", 3, "socket")])
def test_barrier_automatic_choice_when_oversubscribed(topo, n, bind, monkeypatch):
    """Two ranks, or more ranks than CPUs (the virtual cores map onto at
    most as many real CPUs on any host): all_to_all."""
    monkeypatch.delenv("SHMCOLL_BARRIER_ALGORITHM", raising=False)
    assert run_ranks(_bar_id, n, topology=topo, bind=bind) == ["all_to_all"] * n


S2N4 = read_sysfs(os.path.join(os.path.dirname(__file__), "fixtures", "sys-2s4n"))


@pytest.mark.parametrize("n,bind,want", [(8, "core", "hierarchical"), (16, "socket", "hierarchical"),
                                         (4, "core", "padded"),
                                         (17, "core", "all_to_all"), (2, "core", "all_to_all")])
def test_barrier_choice_on_the_recorded_two_socket_machine(n, bind, want):
    """One rank per CPU or fewer, sharing sets (bind=socket) or not: the
    paper's trees, flat within one socket; more ranks than CPUs: all_to_all."""
    slots = S2N4.placement(n, bind=bind, map="scatter" if want == "hierarchical" else "compact")
    assert barrier.choose(types.SimpleNamespace(nranks=n, slots=slots)) == want


@pytest.mark.parametrize("spec,n,bind", [("2x2", 4, "core"), ("2x2", 7, "core"), ("2x4", 8, "socket"),
                                         ("2x4", 5, "none"), ("1x2", 2, "core")])
def test_all_to_all_waits_for_cpu_mates_first(spec, n, bind):
    """Each rank's wait list is every other rank once, those whose CPUs
    overlap its own first (it must yield to them), counted in mates."""
    topo = shmcoll.topology(spec)
    slots = topo.placement(n, bind=bind)
    orders, mates = barrier.arrival_order(slots)
    for r, (order, m) in enumerate(zip(orders, mates)):
        assert sorted(order) == [o for o in range(n) if o != r]
        near = {o for o in range(n) if o != r and slots[o].cpus & slots[r].cpus}
        assert set(order[:m]) == near and not near & set(order[m:])


def test_barrier_bad_algorithm_name_from_env(monkeypatch):
    monkeypatch.setenv("SHMCOLL_BARRIER_ALGORITHM", "bogus")
    with pytest.raises(ValueError, match="bogus"):
        run_ranks(_bar_id, 2)


def test_barrier_bad_algorithm_name_from_options():
    with pytest.raises(ValueError, match="bogus"):
        run_ranks(_bar_id, 2, options={"barrier_algorithm": "bogus"})


def _bad_call(comm):
    try:
        comm.Barrier(algorithm="bogus" if comm.rank == 1 else None)
    except Exception as e:
        return type(e).__name__, str(e), getattr(e, "rank", None), isinstance(e, shmcoll.PeerFailure)
    return None


@pytest.mark.parametrize("n", [2, 4])
def test_barrier_bad_algorithm_argument_on_one_rank(n):
    got = run_ranks(_bad_call, n)
    name, msg, _, _ = got[1]
    assert name == "ValueError" and "bogus" in msg and "barrier" in msg
    for r in range(n):
        if r != 1:
            assert got[r] is not None and got[r][3], f"rank {r}: {got[r]}"
            assert got[r][2] == 1, f"rank {r} blames rank {got[r][2]}: {got[r]}"


def test_barrier_environment_reaches_ranks_once(monkeypatch):
    """The plan is made at launch: changing the environment inside a rank
    afterwards does not change the communicator's algorithm."""
    monkeypatch.setenv("SHMCOLL_BARRIER_ALGORITHM", "original")

    def job(comm):
        os.environ["SHMCOLL_BARRIER_ALGORITHM"] = "padded"
        return comm.selected("barrier", 0)
    assert run_ranks(job, 2) == ["original"] * 2
