"""NUMA placement tests. They run on any host (one node: multi-node checks skip with a reason) and
under a real 2-node kernel via .ci/numa_vm.sh, where every placement assertion is live.

Segments are real POSIX shm objects (posix_ipc), as shmcoll uses them, always unlinked afterwards.
"""
import glob
import mmap
import os
import secrets

import posix_ipc
import pytest

from shmcoll import numa
from shmcoll.numa import PAGE

NPAGES = 16
ENOENT = 2


def sysfs_memory_nodes():
    """Nodes with memory, from each node's meminfo (independent of the has_memory list the shim reads)."""
    found = []
    for d in glob.glob("/sys/devices/system/node/node[0-9]*"):
        with open(os.path.join(d, "meminfo")) as f:
            total = next(int(l.split()[3]) for l in f if "MemTotal" in l)
        if total > 0:
            found.append(int(os.path.basename(d)[4:]))
    return sorted(found) or [0]


NODES = sysfs_memory_nodes()
multi_node = pytest.mark.skipif(len(NODES) < 2, reason=f"needs >= 2 NUMA nodes with memory; this host has {NODES}")
needs_numa = pytest.mark.skipif(not numa.available(), reason="kernel NUMA syscalls unavailable (backend 'none')")


class Segment:
    """A fresh POSIX shm object of npages, mapped MAP_SHARED; map() gives further mappings (other 'ranks')."""

    def __init__(self, npages=NPAGES, allocate=False):
        self.size = npages * PAGE
        self.shm = posix_ipc.SharedMemory(f"/shmcoll-test-{secrets.token_hex(6)}", posix_ipc.O_CREX,
                                          mode=0o600, size=self.size)
        self.maps = []
        self.mm = self.map()

    def map(self):
        m = mmap.mmap(self.shm.fd, self.size, mmap.MAP_SHARED)
        self.maps.append(m)
        return m

    def close(self):
        for m in self.maps:
            m.close()
        self.shm.close_fd()
        self.shm.unlink()


@pytest.fixture
def seg():
    s = Segment()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(params=["libnuma", "syscall"])
def each_backend(request):
    """Run a test once per usable backend: both paths reach the same kernel calls differently."""
    default = numa.backend()
    if default == "none":
        pytest.skip("kernel NUMA syscalls unavailable (backend 'none')")
    try:
        numa._set_backend(request.param)
    except OSError:
        pytest.skip(f"backend {request.param!r} unavailable here (libnuma.so.1 missing?)")
    yield request.param
    numa._set_backend(default)


def touch(m, start=0, end=None):
    for off in range(start, len(m) if end is None else end, PAGE):
        m[off] = 1


def test_backend_reported():
    assert numa.backend() in ("libnuma", "syscall", "none")
    assert numa.available() == (numa.backend() != "none")
    if len(NODES) > 1:
        assert numa.available(), "a multi-node kernel must expose the NUMA syscalls"


def test_num_nodes_matches_sysfs():
    assert numa.nodes() == NODES
    assert numa.num_nodes() == len(NODES) >= 1


@pytest.mark.parametrize("node", NODES)
def test_bind_then_touch(seg, each_backend, node):
    lo, hi = 2 * PAGE, 10 * PAGE
    numa.bind(seg.mm, node, offset=lo, length=hi - lo)
    touch(seg.mm)
    assert numa.nodes_of_pages(seg.mm, lo, hi - lo) == [node] * 8
    assert [numa.node_of(seg.mm, off) for off in range(lo, hi, PAGE)] == [node] * 8
    if len(NODES) > 1:
        assert numa.policy_of(seg.mm, lo) == ("bind", [node])
        assert numa.policy_of(seg.mm, 0) == ("default", [])  # outside the bound range


@needs_numa
def test_raw_shim_sets_shared_policy(seg, each_backend):
    """bind() is a no-op on one node, so drive the shim directly: this checks the mbind/get_mempolicy
    plumbing even on a 1-node host, and that the policy is the shm object's (seen from a 2nd mapping)."""
    lib, ffi = numa._lib, numa._ffi
    with ffi.from_buffer(seg.mm) as p:
        assert lib.sc_numa_bind(p, 4 * PAGE, NODES[-1], 1) == 0
        assert lib.sc_numa_bind(p + 4 * PAGE, 4 * PAGE, NODES[0], 0) == 0
        assert lib.sc_numa_interleave(p + 8 * PAGE, 4 * PAGE) == 0
        assert lib.sc_numa_bind(p + 1, PAGE, 0, 1) == -22  # unaligned: -EINVAL from the kernel
    other = seg.map()
    assert numa.policy_of(other, 0) == ("bind", [NODES[-1]])
    assert numa.policy_of(other, 4 * PAGE) == ("preferred", [NODES[0]])
    assert numa.policy_of(other, 8 * PAGE) == ("interleave", NODES)
    assert numa.policy_of(other, 12 * PAGE) == ("default", [])


@needs_numa
def test_policy_outlives_the_binding_mapping():
    """Creator binds and unmaps before touching; a later mapping's first touch still follows the policy."""
    s = Segment()
    try:
        half = s.size // 2
        numa.bind(s.mm, NODES[0], 0, half)
        numa.bind(s.mm, NODES[-1], half, half)
        s.maps.remove(s.mm)
        s.mm.close()
        other = s.map()
        assert numa.nodes_of_pages(other) == [-ENOENT] * NPAGES  # nothing allocated yet
        touch(other)
        assert numa.nodes_of_pages(other) == [NODES[0]] * (NPAGES // 2) + [NODES[-1]] * (NPAGES // 2)
    finally:
        s.close()


@needs_numa
def test_fallocate_after_bind(seg, each_backend):
    """shmcoll's creation order: ftruncate, mmap, bind, posix_fallocate, then ranks map and read."""
    half = seg.size // 2
    numa.bind(seg.mm, NODES[0], 0, half)
    numa.bind(seg.mm, NODES[-1], half, half)
    os.posix_fallocate(seg.shm.fd, 0, seg.size)
    assert os.fstat(seg.shm.fd).st_blocks * 512 >= seg.size, "fallocate reserved every page"
    assert numa.nodes_of_pages(seg.mm) == [-ENOENT] * NPAGES  # allocated in page cache, not mapped here
    expect = [NODES[0]] * (NPAGES // 2) + [NODES[-1]] * (NPAGES // 2)
    if len(NODES) > 1:
        # Swap the policy now: pages fallocate already allocated must stay where they were, proving
        # the nodes below were chosen at fallocate time and not at the readers' first touch.
        numa.bind(seg.mm, NODES[-1], 0, half)
        numa.bind(seg.mm, NODES[0], half, half)
    rank = seg.map()
    assert [numa.node_of(rank, off) for off in range(0, seg.size, PAGE)] == expect
    assert numa.nodes_of_pages(rank) == expect
    assert sum(rank[off] for off in range(0, seg.size, PAGE)) == 0  # reading maps the zeroed pages


def test_bad_node_raises(seg):
    for bad in (-1, max(NODES) + 1, 1024):
        with pytest.raises(ValueError, match=f"node {bad}"):
            numa.bind(seg.mm, bad)


def test_range_and_buffer_types(seg):
    with pytest.raises(ValueError, match="outside buffer"):
        numa.bind(seg.mm, NODES[0], offset=seg.size - PAGE, length=2 * PAGE)
    with pytest.raises(TypeError):
        numa.bind(12345 * PAGE, NODES[0])  # address without length
    numa.bind(memoryview(seg.mm)[PAGE:], NODES[-1], length=PAGE)
    anon = mmap.mmap(-1, 4 * PAGE)
    numa.bind(anon, NODES[-1])
    touch(anon)
    if numa.available():
        assert numa.nodes_of_pages(anon) == [NODES[-1]] * 4
        assert numa.node_of(bytearray(PAGE), 10) in NODES  # read-only use of a heap buffer
    assert numa._pages(PAGE + 100, 10) == (PAGE, PAGE)  # widened to the page holding the range
    assert numa._pages(PAGE - 1, 2) == (0, 2 * PAGE)
    anon.close()  # the cffi views were released: the mmap can be closed


@pytest.mark.skipif(bool(os.environ.get("NUMA_VM")), reason="import numpy takes ~4 s under TCG; same buffer path as mmap")
def test_numpy_array():
    np = pytest.importorskip("numpy")
    a = np.zeros(8 * PAGE // 8)
    numa.bind(a, NODES[0], offset=PAGE, length=PAGE)
    if numa.available():
        assert numa.node_of(a, PAGE) in NODES


@multi_node
def test_interleave_spreads(seg):
    numa.interleave(seg.mm)
    touch(seg.mm)
    placed = numa.nodes_of_pages(seg.mm)
    counts = {n: placed.count(n) for n in NODES}
    assert sum(counts.values()) == NPAGES, placed
    assert min(counts.values()) >= NPAGES // len(NODES) // 2, counts
    assert numa.policy_of(seg.mm, 0) == ("interleave", NODES)


@multi_node
def test_preferred(seg):
    numa.bind(seg.mm, NODES[-1], strict=False)
    touch(seg.mm)
    assert numa.policy_of(seg.mm, 0) == ("preferred", [NODES[-1]])
    assert set(numa.nodes_of_pages(seg.mm)) == {NODES[-1]}


def test_backend_none_degrades_quietly(seg):
    """Where the kernel lacks NUMA (or seccomp blocks it), placement is a no-op and queries say -1."""
    default = numa.backend()
    numa._set_backend("none")
    try:
        assert not numa.available()
        numa.bind(seg.mm, NODES[0])
        numa.interleave(seg.mm)
        assert numa.node_of(seg.mm) == -1
        assert numa.nodes_of_pages(seg.mm, 0, 2 * PAGE) == [-1, -1]
        assert numa.policy_of(seg.mm) == ("default", [])
        with pytest.raises(ValueError):
            numa.bind(seg.mm, max(NODES) + 1)
    finally:
        numa._set_backend(default)


@pytest.mark.parametrize("spec", [None, "2x2x2", "2x2x4"])
def test_communicator_segment_placement(spec):
    """A job's segment as the launcher lays it out: every rank's channel on
    its own node, stripe slot i (the numa bcast's segment i) on node
    i mod nodes, as the kernel reports page by page.  Virtual nodes land on
    real node (i mod real nodes); on one real node everything is node 0."""
    from shmcoll.launcher import Job
    from shmcoll.topology import topology
    topo = topology(spec)
    job = Job(len(topo.cores), bind="none", topology=spec, options={"chan_bytes": 4 * PAGE})
    try:
        dev, p = job.device, job.plan.params
        mm = dev.segment.mmap
        for r, slot in enumerate(job.plan.slots):
            off = dev.c.off_chan + r * p["chan_bytes"]
            assert [numa.node_of(mm, off + k) for k in range(0, p["chan_bytes"], PAGE)] == \
                [slot.real_node] * (p["chan_bytes"] // PAGE), f"channel of rank {r}"
        for i in range(p["stripe_slots"]):
            off, width = dev.stripe_range(i)
            want = topo.real_node_of(i % len(topo.nodes))
            assert {numa.node_of(mm, off + k) for k in range(0, width, PAGE)} == {want}, f"stripe slot {i}"
    finally:
        job.close()
