"""Shared helpers for the collective tests.

* every test must leave nothing in /dev/shm (autouse fixture);
* run_ranks(): shmcoll.launch with a generous timeout, so a hang fails the
  test instead of stalling the suite (pytest-timeout is the outer net);
* shared_array(): a numpy array over an anonymous MAP_SHARED mapping made
  before launch(), so every forked rank (and the test) sees the same memory;
* closed-form data patterns, so expected values are computed, never typed in.
"""
import glob
import mmap
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

import shmcoll
from shmcoll import segment

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RANKS_DIR = os.path.join(HERE, "ranks")
LAUNCH_TIMEOUT = 90

DTYPES = [np.int8, np.int32, np.float32, np.float64, np.complex128]
# A suite started in the background by a shell without job control (`pytest &`)
# inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler:
# the Ctrl-C tests (a rank, the launcher) would fail for how the suite was started.
signal.signal(signal.SIGINT, signal.default_int_handler)
# The automatic choice under test is the built-in rules', whatever tuning
# file `shmcoll tune` left in this user's cache (tests/test_tune.py names its own).
os.environ["SHMCOLL_TUNING_FILE"] = "none"

# The test hook: tiny channels so that multi-chunk / ring-wrap paths run
# with small inputs, and inline slots of up to 128 bytes (the default is
# 4 KiB), so that staged chunks run from 129 B.
SMALL = {"chan_bytes": 8192, "chunk_bytes": 1024, "tile_bytes": 512, "inline_bytes": 128}


@pytest.fixture(autouse=True)
def no_leftover_segments():
    yield
    # A concurrent job (other engineers share the box) can own a name for
    # the microseconds between create and unlink; only a name that stays is
    # a leak.
    left = segment.leftovers()
    deadline = time.monotonic() + 2.0
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [n for n in segment.leftovers() if n in left]
    assert left == [], f"shmcoll segments left in /dev/shm: {left}"


def run_ranks(fn, n, *args, **kw):
    """shmcoll.launch(fn, n, args) under a generous timeout."""
    kw.setdefault("timeout", LAUNCH_TIMEOUT)
    return shmcoll.launch(fn, n, args=args, **kw)


def own_cpus(monkeypatch):
    """A placement that gives every rank a CPU of its own (CPUs this host
    lacks: run with bind='none'), so the ranks check each other in a ring,
    not in the star around rank 0 of ranks taking turns on CPUs."""
    import dataclasses
    from shmcoll.topology import Topology
    real = Topology.placement
    monkeypatch.setattr(Topology, "placement",
                        lambda self, *a, **k: [dataclasses.replace(s, cpus=frozenset({1000 + s.rank}))
                                               for s in real(self, *a, **k)])


def taking_turns(monkeypatch):
    """Pin every rank to one CPU of this host, however many it has: the
    ranks take turns, so they check each other in a star around rank 0,
    where one rank at a time can find a mismatch (ranks on CPUs of their
    own check in a ring, where two may find it together)."""
    import dataclasses
    from shmcoll.topology import Topology
    cpu, real = min(os.sched_getaffinity(0)), Topology.placement
    monkeypatch.setattr(Topology, "placement", lambda self, *a, **k: [dataclasses.replace(s, cpus=frozenset({cpu}))
                                                                     for s in real(self, *a, **k)])


def graph_bind(graph, monkeypatch):
    """The bind that gives the check graph asked for ('star': ranks taking
    turns on one CPU of this host; 'ring': own_cpus, unpinned)."""
    if graph == "star":
        taking_turns(monkeypatch)
        return "core"
    own_cpus(monkeypatch)
    return "none"


def cma(comm):
    """Whether this rank's communicator may single-copy (process_vm_readv/writev)."""
    return comm._c.cma


def need_cma(n):
    """Skip the test unless n ranks may single-copy from each other here."""
    if not all(run_ranks(cma, n)):
        pytest.skip("cross-memory attach is not permitted between ranks here")


def run_cases(job, n, cases, **kw):
    """Run job(comm, cases, forms) on n ranks; every rank returns its list of
    failure descriptions, and all of them must be empty."""
    forms = kw.pop("forms", False)
    results = run_ranks(job, n, cases, forms, **kw)
    failures = [f for r in results for f in r]
    assert failures == [], "\n".join(failures[:20])


def _plain(e):
    return type(e).__name__, str(e), getattr(e, "rank", None)


def attempt(comm, name, call, describe=_plain):
    """call() (the collective `name`), then a Barrier; (phase,) +
    describe(exception) of what raised (by default its type name, message
    and .rank), or None.  A bad-argument test runs this on every rank."""
    phase = name
    try:
        call()
        phase = "Barrier"
        comm.Barrier()
    except Exception as e:
        return (phase,) + describe(e)
    return None


def shared_array(shape, dtype=np.int64, fill=0):
    """An array every forked rank shares (anonymous shared mapping)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    mm = mmap.mmap(-1, max(count * dtype.itemsize, 1), flags=mmap.MAP_SHARED)
    a = np.frombuffer(mm, dtype=dtype, count=count).reshape(shape)
    a[...] = fill
    return a


def planned(n, cpus, nbytes, root=0, counts=None):
    """The Call a collective plans for n ranks placed on `cpus` CPUs (rank r
    on CPU r % cpus, whatever this machine has), ranks able to read each
    other's memory: to test choices that depend on oversubscription."""
    import dataclasses
    from shmcoll.device import make_plan
    from shmcoll.sched import Call
    topo = shmcoll.topology(f"1x{n}")
    slots = [dataclasses.replace(s, cpus=frozenset({s.rank % cpus})) for s in topo.placement(n, "core", "compact")]
    plan = make_plan(n, topo, slots)
    return Call(n, nbytes, root, plan.params, plan.slots, 1, True, counts)


def pattern(count, dtype, *salt):
    """Closed-form data: element j of the array named by salt (call index,
    root, source rank, ...) — distinct per salt so stale data is caught."""
    dtype = np.dtype(dtype)
    j = np.arange(count, dtype=np.int64)
    s = 0
    for i, x in enumerate(salt):
        s = (s * 1000003 + (int(x) + 1) * (2 * i + 3)) % (1 << 31)
    if dtype.kind in "iu":
        bits = dtype.itemsize * 8
        mod = 1 << min(bits - 1, 31)
        v = (j * 2654435761 + s * 40503 + 17) % mod
        if dtype.itemsize == 1:
            v = v - 64
        return v.astype(dtype)
    if dtype.kind == "f":
        return ((j % 4099) * 0.25 + (s % 9973) * 0.5 + 0.125).astype(dtype)
    if dtype.kind == "c":
        return ((j % 4099) * 0.25 + (s % 9973) + 1j * ((j % 613) * 0.5 - (s % 701))).astype(dtype)
    raise TypeError(dtype)


def poison(count, dtype):
    """What receivers start from: a pattern no sender ever produces."""
    a = np.empty(count, dtype)
    a.view(np.uint8)[...] = 0xA5
    return a


def counts_for(nbytes_list, dtype):
    """Element counts nearest each byte size (both sides when it is not a
    whole number of items), deduplicated, in order."""
    size = np.dtype(dtype).itemsize
    out = []
    for b in nbytes_list:
        for c in (b // size, -(-b // size)):
            if c not in out:
                out.append(c)
    return out


# -- the machine, read independently of shmcoll.topology ---------------------

def real_cores():
    """[(socket, cpus)] per core in (package, core id) order, from /sys,
    restricted to the CPUs this process may use."""
    allowed = os.sched_getaffinity(0)
    cores = {}
    for path in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology"):
        cpu = int(path.split("/")[-2][3:])
        if cpu not in allowed:
            continue
        with open(os.path.join(path, "physical_package_id")) as f:
            pkg = int(f.read())
        with open(os.path.join(path, "core_id")) as f:
            core = int(f.read())
        cores.setdefault((pkg, core), set()).add(cpu)
    return [(pkg, frozenset(c)) for (pkg, _), c in sorted(cores.items())]


def parse_cpulist(text):
    out = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def expected_affinity(rank, n, bind, topology=None):
    """The CPU set rank `rank` must be pinned to with map=compact."""
    allowed = frozenset(os.sched_getaffinity(0))
    if bind == "none":
        return allowed
    if topology is None:
        cores = real_cores()
        sock, cpus = cores[rank % len(cores)]
        if bind == "core":
            return cpus
        if bind == "socket":
            return frozenset().union(*(c for s, c in cores if s == sock))
        if bind == "numa":
            for path in glob.glob("/sys/devices/system/node/node[0-9]*/cpulist"):
                node = parse_cpulist(open(path).read())
                if cpus & node:
                    return frozenset(node & allowed)
        raise ValueError(bind)
    # virtual SxC[xN]: virtual core v runs on allowed[v % len(allowed)]
    s, c = (int(x) for x in topology.split("x")[:2])
    real = sorted(allowed)
    v = rank % (s * c)
    if bind == "core":
        return frozenset({real[v % len(real)]})
    if bind == "socket":
        sock = v // c
        return frozenset(real[w % len(real)] for w in range(sock * c, (sock + 1) * c))
    raise ValueError(bind)


def cli(*args):
    """argv for `shmcoll ...` run by this interpreter."""
    return [sys.executable, "-m", "shmcoll", *args]


def assert_killed_mid(collective, n=3):
    """Rank n - 1 dies (SIGKILL) as the others enter collective(comm): they
    must raise PeerDied naming it within 2 s."""
    import signal
    took = shared_array(n, np.float64, -1.0)
    died = shared_array(n, np.int64, 0)

    def job(comm):
        comm.Barrier()
        if comm.rank == n - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        t = time.monotonic()
        try:
            collective(comm)
        except shmcoll.PeerFailure as e:
            took[comm.rank] = time.monotonic() - t
            died[comm.rank] = e.rank == n - 1
            raise
    with pytest.raises(Exception):
        run_ranks(job, n, timeout=30)
    assert list(died[:n - 1]) == [1] * (n - 1), list(died)
    assert 0 <= took[:n - 1].max() < 2.0, list(took)


def in_threads(fn, argss):
    """fn(*args) in a thread of its own per args, all at once; the first
    exception any of them raised is raised here once all have ended."""
    errors = []

    def run(args):
        try:
            fn(*args)
        except BaseException as e:
            errors.append(e)
    threads = [threading.Thread(target=run, args=(args,)) for args in argss]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
