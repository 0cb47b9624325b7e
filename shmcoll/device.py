"""The device layer: one rank's C context over a communicator's segment.

Python plans here once per communicator (layout, NUMA placement of every
channel, wait policy, barrier trees); the C engine then runs each
collective phase in one call.  Collectives use only Device and the C entry
points, never the segment directly."""
import ctypes
import os
import functools
from dataclasses import dataclass, field

from . import options as _options
from ._core import ffi, lib
from .errors import PeerAborted, PeerDied
from .segment import Segment
from .topology import oversubscribed

PAGE = 4096
MAX_RANKS = 1024
ABORT_REASONS = {1: "raised an exception", 2: "died", 3: "passed bad or mismatched arguments", 4: "exited"}


@dataclass
class Plan:
    """Everything every rank must agree on, computed once by the launcher."""
    nranks: int
    params: dict
    slots: list                 # topology.Slot per rank
    topo: object                # topology.Topology
    trees: dict = field(default_factory=dict)   # barrier alg id -> (parents, children or wait order)
    mates: list = field(default_factory=list)   # per rank: how many others share its CPUs (all_to_all)
    size: int = 0


def make_plan(nranks, topo, slots, options=None):
    from .coll import barrier
    if not 1 <= nranks <= MAX_RANKS:
        raise ValueError(f"nprocs must be between 1 and {MAX_RANKS}, not {nranks}")
    res = _options.resolve(options)
    p = {k: v for k, (v, _) in res.items()}
    l2 = topo.cache_size(2) or 1 << 20
    shared = topo.shared_cache_size() or l2
    p["chan_bytes"] = _round(max(int(p["chan_bytes"]), 2 * PAGE), PAGE)
    half = p["chan_bytes"] // 2    # a ring holds two chunks or tiles at least
    p["chunk_bytes"] = min(int(p["chunk_bytes"] or max(PAGE, min(l2 // 4, p["chan_bytes"] // 4))), half)
    p["tile_bytes"] = min(int(p["tile_bytes"] or max(PAGE, min(l2 // 4, shared // (2 * nranks)))), half)
    p["nt_bytes"] = int(p["nt_bytes"] or shared)
    # one reader at a time gains from 64 KiB (2 ranks, 256 KiB alltoall: 29 vs
    # 35 us); with more ranks sharing the cores, only from about 1 MiB
    p["cma_bytes"] = int(p["cma_bytes"] if p["cma_bytes"] is not None else (1 << 16 if nranks == 2 else 1 << 20))
    per_socket = max(sum(1 for s in slots if s.socket == slots[0].socket), 1)
    p["bcast_k"] = int(p["bcast_k"] or max(1, min(4, per_socket)))
    groups = -(-max(nranks - 1, 1) // p["bcast_k"])
    nodes = len(topo.nodes)
    p["stripe_slots"] = int(p["stripe_slots"] or -(-max(8, 2 * groups) // nodes) * nodes)
    p["stripe_bytes"] = max(p["chan_bytes"] // PAGE // p["stripe_slots"], 1) * PAGE * p["stripe_slots"]
    p["spin_far_ns"] = int(p["spin_ns"] if p["spin_ns"] is not None else 50_000)
    p["spin_ns"] = int(p["spin_ns"] if p["spin_ns"] is not None else (0 if oversubscribed(slots) else 50_000))
    p["check"] = int(p["check"])
    trees, mates = barrier.plans(slots)
    plan = Plan(nranks, p, list(slots), topo, trees, mates)
    plan.size = Device.layout(plan)
    return plan


def _round(x, a):
    return -(-x // a) * a


_new_cfunction = ctypes.pythonapi.PyCFunction_NewEx
_new_cfunction.restype = ctypes.py_object
_new_cfunction.argtypes = (ctypes.c_void_p, ctypes.py_object, ctypes.py_object)

INT_FIELDS = ("chan_bytes", "chunk_bytes", "tile_bytes", "stripe_bytes", "stripe_slots", "bcast_k",
              "nt_bytes", "check", "cma_bytes", "spin_ns", "spin_far_ns", "yield_ns", "sleep_ns", "liveness_ns")


class Device:
    def __init__(self, plan, rank, segment):
        self.plan, self.rank, self.segment = plan, rank, segment
        c, self._keep = self._context(plan, rank)
        self.c = c
        self._base = ffi.from_buffer(segment.mmap)
        if lib.sc_attach(c, ffi.cast("char *", self._base)) != 0:
            raise RuntimeError("shared segment does not hold a shmcoll communicator of this size")

    @staticmethod
    def _context(plan, rank):
        c = ffi.new("sc_comm_t *")
        c.rank, c.size = rank, plan.nranks
        for name in INT_FIELDS:
            setattr(c, name, plan.params[name])
        keep = []
        for alg, (parents, children) in plan.trees.items():
            kids = ffi.new("int32_t[]", children[rank] or [0]) if rank >= 0 else ffi.NULL
            keep.append(kids)
            c.bar_parent[alg] = parents[rank] if rank >= 0 else -1
            c.bar_nchild[alg] = len(children[rank]) if rank >= 0 else 0
            c.bar_child[alg] = kids
        c.bar_mates = plan.mates[rank] if rank >= 0 else 0
        pend = ffi.new("uint64_t[]", (plan.nranks + 1) * (lib.SC_SLOTS + 1) * plan.nranks)
        keep.append(pend)
        c.pend = pend
        lib.sc_layout(c)
        return c, keep

    @staticmethod
    def layout(plan):
        return Device._context(plan, -1)[0].total

    @classmethod
    def create(cls, plan):
        """Creator side (launcher): segment placed per NUMA node and initialised."""
        seg = Segment.create(plan.size, cls._placement(plan, cls._context(plan, -1)[0]))
        dev = cls.__new__(cls)
        dev.plan, dev.rank, dev.segment = plan, -1, seg
        dev.c, dev._keep = cls._context(plan, 0)
        dev._base = ffi.from_buffer(seg.mmap)
        dev.c.base = ffi.cast("char *", dev._base)
        lib.sc_init_shared(dev.c)
        return dev

    @staticmethod
    def _placement(plan, c):
        """Each rank's channel on its own node; stripe slot i on node i mod nodes."""
        p = plan.params
        out = [(c.off_chan + r * p["chan_bytes"], p["chan_bytes"], s.real_node) for r, s in enumerate(plan.slots)]
        width = p["stripe_bytes"] // p["stripe_slots"]
        nodes = len(plan.topo.nodes)
        out += [(c.off_stripe + i * width, width, plan.topo.real_node_of(i % nodes)) for i in range(p["stripe_slots"])]
        return out

    def for_rank(self, rank):
        """The view of rank `rank` over the same mapping (after fork)."""
        return Device(self.plan, rank, self.segment)

    def stripe_range(self, i):
        width = self.plan.params["stripe_bytes"] // self.plan.params["stripe_slots"]
        return self.c.off_stripe + i * width, width

    def entries(self, methods, on_error, ids):
        """The C fast entries bound to this context, each declining to
        methods[name] (the checked Python version), raising through
        on_error(name, rc) and naming algorithms by ids[name]:
        {"Barrier": fn, "Bcast": fn, "Alltoall": fn}."""
        addr = int(ffi.cast("uintptr_t", self.c))
        out = {}
        for i, name in enumerate(("Barrier", "Bcast", "Alltoall")):
            handler = functools.partial(on_error, name)
            out[name] = _new_cfunction(int(ffi.cast("uintptr_t", lib.sc_py_entry(i))),
                                       (addr, methods[name], handler, ids[name]), None)
        return out

    def register(self, pid):
        if lib.sc_register(self.c, pid) != 0:
            raise RuntimeError(f"rank {self.rank} could not register")

    def deregister(self):
        lib.sc_deregister(self.c)

    def close(self):
        """Unmap (the creator's or a rank's view); the name is long gone."""
        ffi.release(self._base)
        self.segment.mmap.close()
        self.segment.close_fd()

    def abort(self, rank, code):
        lib.sc_set_abort(self.c, rank, code)

    def failure(self, rc, what):
        """The exception for a failed C call (rc < 0)."""
        c = self.c
        if rc == lib.SC_EABORT:
            who, code = c.err_rank, c.err_a
            cls = PeerDied if code == 2 else PeerAborted
            return cls(who, f"{ABORT_REASONS.get(code, 'aborted')} (seen in {what} on rank {self.rank})")
        if rc == lib.SC_EDEAD:
            reason = {4: "exited", 5: f"could not be read ({os.strerror(c.err_b)})"}.get(c.err_code, "died")
            return PeerDied(c.err_rank, f"{reason} while rank {self.rank} waited on it in {what}")
        if rc == lib.SC_ENOMEM:
            return MemoryError(f"{what}: out of memory for {c.err_a} bytes of scratch")
        if c.err_code == 1:
            return ValueError(f"{what}: arguments differ across ranks (collective or algorithm): rank "
                              f"{self.rank} and rank {c.err_rank} are not in the same call")
        field = {2: "root", 3: "byte count"}[c.err_code]
        return ValueError(f"{what}: arguments differ across ranks ({field}): rank {self.rank} has "
                          f"{c.err_a}, rank {c.err_rank} has {c.err_b}")
