"""The device layer: one rank's C context over a communicator's segment.

Python plans here once per communicator (layout, sizes that fit /dev/shm,
NUMA placement of every channel, wait policy) and once per call shape
(compiling a schedule into this rank's program, cached, and installed in
the C fast entries' cache); the C executor then runs each collective in
one call.  Collectives use only Device and the C entry points, never the
segment directly."""
import ctypes
import dataclasses
import functools
import os
import sys
from dataclasses import dataclass

import numpy as np

from . import options as _options, tuning as _tuning
from ._core import ffi, lib
from . import isa
from .compile import checks, compile_schedule
from .errors import CMAError, MismatchError, PeerAborted, PeerDied, PeerTimeout
from .segment import Segment
from .topology import oversubscribed

PAGE = 4096
MAX_RANKS = 1024
MIN_CHAN = 2 * PAGE
SMALL = 256 << 10       # reduce_small_bytes' least default (bench/README.md, "Figures moved out of coll/*.py")
P2P_MIN = 1024              # a point-to-point ring's least bytes (a few headers and eager messages)
P2P_BUDGET = 16 << 20       # the n^2 rings' bytes by default, each 4 KiB - 1 MiB
ABORT_REASONS = {1: "raised an exception", 2: "died", 3: "passed bad or mismatched arguments", 4: "exited",
                 5: "timed out waiting for a peer", 6: "was interrupted (a signal: Ctrl-C, or a handler that raised)",
                 7: "could not read or write a peer's memory (single copy)",
                 8: "found that the ranks' calls differ", 9: "never joined the job (shmcoll.init under another launcher)"}
ABORT_CALLED = 0x100     # | errorcode: a rank called Comm.Abort(errorcode)
TWIN_ALG = isa.TWIN_ALG      # the signature's algorithm field of a twin (the automatic choice, single copy or staged)
#: A signature field's id (as C reports a mismatch) -> the name messages give it.
FIELDS = {i: {"bytes": "byte count"}.get(name, name) for name, i in isa.SIG_ID.items()}


@dataclass
class Plan:
    """Everything every rank must agree on, computed once by the launcher."""
    nranks: int
    params: dict
    slots: list                 # topology.Slot per rank
    topo: object                # topology.Topology
    size: int = 0
    given: dict = None          # the options as resolved (argument, environment, default), for restrict
    job: str = ""               # the job's segment-name prefix (segment.job_prefix), for named segments


def make_plan(nranks, topo, slots, options=None, environ=os.environ, agreed=None):
    """The plan of a job; agreed: a parent plan's (tuning, model), which a
    communicator made from it keeps rather than reading the files again."""
    if isinstance(nranks, bool) or not isinstance(nranks, int) or not 1 <= nranks <= MAX_RANKS:
        raise ValueError(f"nprocs must be an int between 1 and {MAX_RANKS}, not {nranks!r}")
    res = _options.resolve(options, environ)
    p = {k: v for k, (v, _) in res.items()}
    given = dict(p)
    p["chan_bytes"] = _round(max(int(p["chan_bytes"]), MIN_CHAN), PAGE)
    p["shm_bytes"] = int(p["shm_bytes"]) if p["shm_bytes"] is not None else _shm_free()
    if not 0 <= int(p["call_base"]) < 1 << 64:
        raise ValueError(f"call_base must be in 0 .. 2**64 - 1, not {p['call_base']}")
    if not 0 <= float(p["timeout"]) < 1e9:
        raise ValueError(f"timeout must be a number of seconds in [0, 1e9) (0: never), not {p['timeout']}")
    for name, low in (("p2p_ring_bytes", P2P_MIN), ("p2p_eager_bytes", 0), ("p2p_queue_bytes", 0),
                      ("chunk_bytes", 64), ("tile_bytes", 64), ("stripe_slots", 1), ("bcast_k", 1),
                      ("nt_bytes", 0), ("cma_bytes", 0), ("adapt", 0), ("reduce_block_bytes", 1)):
        if p[name] is not None and not low <= int(p[name]) < 1 << 50:
            raise ValueError(f"{name} must be at least {low}, not {p[name]}")
    if int(p["huge_bytes"]) and not 2 << 20 <= int(p["huge_bytes"]) < 1 << 50:
        raise ValueError(f"huge_bytes must be 0 (off) or from 2 MiB (one huge page) to 2**50, not {p['huge_bytes']}")
    slot = int(p["huge_slot_bytes"])
    if slot and not (64 << 10 <= slot <= 2 << 20 and slot & (slot - 1) == 0):
        raise ValueError(f"huge_slot_bytes must be 0 (off) or a power of two from 64 KiB to 2 MiB, not {slot}")
    if not 0 <= int(p["inline_bytes"]) <= lib.SC_INLINE:
        raise ValueError(f"inline_bytes must be in 0 .. {lib.SC_INLINE}, not {p['inline_bytes']}")
    if p["p2p_ring_bytes"] is None:
        # a communicator's rings take at most a 64th of the /dev/shm there was at launch (Docker's 64 MiB:
        # 1 MiB), so that its Dups fit too (restrict passes the same figure: every member plans alike)
        fit = min(P2P_BUDGET, p["shm_bytes"] // 64) // (nranks * nranks)
        p["p2p_ring_bytes"] = max(4096, min(1 << 20, 1 << max(fit.bit_length() - 1, 0)))
    _p2p(p, res)
    p["chunk_opt"], p["tile_opt"], p["cma_opt"], p["nt_opt"] = (p["chunk_bytes"], p["tile_bytes"], p["cma_bytes"],
                                                          p["nt_bytes"])
    p["small_opt"] = p["reduce_small_bytes"]
    p["k_opt"] = p["bcast_k"]
    p["tuning"], p["model"] = agreed or (_tuning.load(p["tuning_file"], environ, bool(topo.spec)),
                                         _tuning.model(p["model_params"]))
    _derive(p, nranks, topo, slots)
    plan = Plan(nranks, p, list(slots), topo, given=given)
    plan.size = Device.layout(plan)
    # a default ring shrinks first, to its least, where the segment would not fit
    while res["p2p_ring_bytes"][1] == "default" and plan.size > p["shm_bytes"] and p["p2p_ring_bytes"] > P2P_MIN:
        p["p2p_ring_bytes"] //= 2
        _p2p(p, res)
        plan.size = Device.layout(plan)
    asked = p["chan_bytes"]
    # only a default channel size shrinks: one the user asked for fails as asked
    while res["chan_bytes"][1] == "default" and plan.size > p["shm_bytes"] and p["chan_bytes"] > MIN_CHAN:
        fixed = plan.size - (nranks + 1) * p["chan_bytes"]      # lines, headers: what channels leave
        fit = (p["shm_bytes"] - fixed) // (nranks + 1) // PAGE * PAGE
        p["chan_bytes"] = max(min(fit, p["chan_bytes"] - PAGE), MIN_CHAN)
        _derive(p, nranks, topo, slots)
        plan.size = Device.layout(plan)
    if p["chan_bytes"] != asked:
        print(f"shmcoll: /dev/shm holds {p['shm_bytes'] >> 20} MiB; channels cut from {asked >> 10} KiB to "
              f"{p['chan_bytes'] >> 10} KiB per rank so {nranks} ranks fit ({plan.size >> 20} MiB)",
              file=sys.stderr)
    return plan


def _p2p(p, res):
    """Point-to-point sizes: a ring per ordered pair, the eager limit a quarter of it (16 KiB at most)."""
    ring = p["p2p_ring_bytes"] = _round(int(p["p2p_ring_bytes"]), 64)
    if res["p2p_eager_bytes"][1] == "default":
        p["p2p_eager_bytes"] = min(ring // 4, 16 << 10)
    # a record (header and payload) of at most half the ring fits behind the pad that wraps it once the ring
    # has drained, wherever the pad starts (csrc/p2p.c room)
    if not 0 <= int(p["p2p_eager_bytes"]) <= ring // 2 - 64:
        raise ValueError(f"p2p_eager_bytes must be in 0 .. p2p_ring_bytes / 2 - 64 ({ring // 2 - 64}), not "
                         f"{p['p2p_eager_bytes']}")


def restrict(plan, members):
    """The plan of a communicator of plan's ranks `members`, in that order:
    the same options (the environment is not read again: every member must
    plan alike), the same channel size and /dev/shm figure, so no member's
    view of free space can make it plan otherwise."""
    slots = [dataclasses.replace(plan.slots[m], rank=i) for i, m in enumerate(members)]
    given = dict(plan.given, chan_bytes=plan.params["chan_bytes"], shm_bytes=plan.params["shm_bytes"])
    sub = make_plan(len(members), plan.topo, slots, given, environ={},
                    agreed=(plan.params["tuning"], plan.params["model"]))
    sub.job = plan.job
    return sub


def _derive(p, nranks, topo, slots):
    """Sizes that follow from the channel and the caches."""
    l2 = topo.cache_size(2) or 1 << 20
    shared = topo.shared_cache_size() or l2
    half = p["chan_bytes"] // 2    # a ring holds two chunks or tiles at least
    p["chunk_bytes"] = min(int(p.get("chunk_opt") or max(PAGE, min(l2 // 4, half // 2))), half)
    p["tile_bytes"] = min(int(p.get("tile_opt") or max(PAGE, min(l2 // 4, shared // (2 * nranks)))), half)
    p["nt_bytes"] = int(p.get("nt_opt") or shared)
    # the L2s of the ranks' CPUs, together (one per instance: SMT siblings share theirs)
    cpus = frozenset().union(*(s.cpus for s in slots))
    l2s = {c.cpus for c in topo.caches if c.level == 2 and c.kind != "Instruction" and cpus.intersection(c.cpus)}
    p["l2_bytes"] = l2 * max(min(nranks, len(l2s) or len(cpus)), 1)
    # two ranks with a CPU each: all_at_once and reduce_scatter_allgather each read the other's input once,
    # and the one hand-off wins while both inputs and results fit the shared cache (bench/README.md, "The
    # allreduce cut-off and the L3")
    two = nranks == 2 and not oversubscribed(slots)
    given = p.get("small_opt")
    p["reduce_small_bytes"] = int(given if given is not None else max(SMALL, shared // 4) if two else SMALL)
    # a block's inputs and results, 2 x ranks x block, in a quarter of the shared cache
    p["reduce_block_bytes"] = int(p["reduce_block_bytes"] or max(2 << 20, shared // (8 * nranks)))
    # one reader at a time gains from 32 KiB (2 ranks, 32 KiB, near cores:
    # alltoall 5.5 vs 6.5 us, gather 4.7 vs 5.4; with the cores far apart a
    # staged copy is 2-4x slower, a single copy not: bench/README.md); with
    # more ranks, from about 1 MiB (of a rank's blocks together, gather.via)
    p["cma_bytes"] = int(p["cma_bytes"] if p["cma_bytes"] is not None else (1 << 15 if nranks == 2 else 1 << 20))
    per_socket = max(sum(1 for s in slots if s.socket == slots[0].socket), 1)
    p["bcast_k"] = int(p["bcast_k"] or max(1, min(4, per_socket)))
    groups = -(-max(nranks - 1, 1) // p["bcast_k"])
    nodes = len(topo.nodes)
    p["stripe_slots"] = int(p["stripe_slots"] or -(-max(8, 2 * groups) // nodes) * nodes)
    p["stripe_bytes"] = max(p["chan_bytes"] // PAGE // p["stripe_slots"], 1) * PAGE * p["stripe_slots"]
    p["spin_far_ns"] = int(p["spin_ns"] if p["spin_ns"] is not None else 50_000)
    p["spin_now_ns"] = int(p["spin_ns"] if p["spin_ns"] is not None else (0 if oversubscribed(slots) else 50_000))
    # whom a rank checks when it did not wait on them (compile.checks): with
    # ranks taking turns on CPUs, a star around rank 0, where a call rooted
    # there reads half the lines a ring does (4 ranks on 2 CPUs, Bcast 8 B:
    # 3 reads a call, not 6; each a line its writer has just rewritten)
    p["check_star"] = oversubscribed(slots) and nranks <= lib.SC_NB + 1
    p["check"] = int(p["check"])
    p["timeout_ns"] = int(float(p["timeout"]) * 1e9)
    p["call_base"] = int(p["call_base"])
    # twins wherever single copy may run (2 ranks, 256 KiB Allgather: 70 us by
    # single copy, 29 staged with the vCPUs near; far, the other way round)
    p["adapt"] = int(p["adapt"] if p["adapt"] is not None else 0 if p.get("cma_opt") is not None else 1 << 15)


def fingerprint(counts, displs):
    """A v-variant's key word: csrc/pyfast.c's sc_fingerprint, the one definition."""
    if len(counts) != len(displs):      # the C function reads as many displacements as counts
        raise ValueError(f"{len(counts)} counts but {len(displs)} displacements")
    return lib.sc_fingerprint(ffi.new("int64_t[]", list(counts) + list(displs)), len(counts))


def _shm_free():
    try:
        st = os.statvfs("/dev/shm")
        return st.f_bavail * st.f_frsize
    except OSError:
        return 1 << 62


def _round(x, a):
    return -(-x // a) * a


_new_cfunction = ctypes.pythonapi.PyCFunction_NewEx
_new_cfunction.restype = ctypes.py_object
_new_cfunction.argtypes = (ctypes.c_void_p, ctypes.py_object, ctypes.py_object)
_exec = _new_cfunction(int(ffi.cast("uintptr_t", lib.sc_py_entry(1))), None, None)
learn_dtype = _new_cfunction(int(ffi.cast("uintptr_t", lib.sc_py_entry(2))), None, None)
_huge_arrays = _new_cfunction(int(ffi.cast("uintptr_t", lib.sc_py_entry(3))), None, None)


#: point-to-point's C functions (csrc/p2p.c): send, sent, recv, probe, mrecv, bell, idle; entry and waitall (p2p_entry)
_P2P_DEFS = {}
for _i in range(16):
    _d = lib.sc_py_p2p(_i)
    if _d == ffi.NULL:
        break
    _P2P_DEFS[ffi.string(ffi.cast("char **", _d)[0]).decode()] = int(ffi.cast("uintptr_t", _d))
P2P = {name: _new_cfunction(d, None, None) for name, d in _P2P_DEFS.items() if name not in ("entry", "Waitall")}


def p2p_entry(state, name="entry"):
    """A point-to-point fast entry bound to state (csrc/p2p.c fast(), or Waitall: waitall())."""
    return _new_cfunction(_P2P_DEFS[name], state, None)


def huge_arrays(min_bytes, slot_bytes=0):
    """From now on, numpy arrays of min_bytes (one threshold per process)
    and more that this thread makes are mapped 2 MiB-aligned, and from
    slot_bytes (0: none) put in slots of 2 MiB ones, in the process's arena
    that its peers map (csrc/pages.c), advised huge pages unless the
    kernel's or numpy's are off (NUMPY_MADVISE_HUGEPAGE=0), and unless the
    user set a numpy allocation handler of their own; min_bytes 0 stops it
    (a rank forked from a rank inherits its handler).  Nothing with numpy
    before 1.22 (no NEP 49)."""
    if np.lib.NumpyVersion(np.__version__) < "1.22.0":
        return
    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:
        from numpy.core import _multiarray_umath as umath
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = "[never]" not in f.read()
    except OSError:
        thp = False
    advise = thp and getattr(umath, "_get_madvise_hugepage", lambda: True)()
    _huge_arrays(umath._ARRAY_API, int(min_bytes), int(slot_bytes), bool(advise))


FIELDS_C = {"chan_bytes": "chan_bytes", "stripe_bytes": "stripe_bytes", "stripe_slots": "stripe_slots",
            "check": "check", "spin_now_ns": "spin_ns", "spin_far_ns": "spin_far_ns", "yield_ns": "yield_ns",
            "sleep_ns": "sleep_ns", "liveness_ns": "liveness_ns", "timeout_ns": "timeout_ns",
            "call_base": "call_base", "p2p_ring_bytes": "p2p_ring_bytes", "p2p_eager_bytes": "p2p_eager_bytes",
            "p2p_queue_bytes": "p2p_queue_bytes"}


class Device:
    members = ()        # a communicator made from the world: its ranks' world ranks (comms.py)

    def __init__(self, plan, rank, segment):
        self.plan, self.rank, self.segment = plan, rank, segment
        self.c, self._keep = self._context(plan, rank)
        self.started = (plan.params["call_base"] - 1) % (1 << 64)     # the call counter's start (Comm: after start-up)
        self._base = ffi.from_buffer(segment.mmap)
        self._programs = {}
        self._twins = {}            # program key -> (twin block, the staged program, the call's bytes)
        self._tmp = None
        self.traffic = None
        if plan.params["record_traffic"]:
            self.traffic = np.zeros(2 * plan.nranks, np.int64)   # bytes, then messages, per source
            self.c.traffic = ffi.cast("int64_t *", self.traffic.ctypes.data)
        if lib.sc_attach(self.c, ffi.cast("char *", self._base)) != 0:
            raise RuntimeError("shared segment does not hold a shmcoll communicator of this size")
        if lib.sc_p2p_init(self.c) != 0:
            raise MemoryError("point-to-point state")

    @staticmethod
    def _context(plan, rank):
        c = ffi.new("sc_comm_t *")
        c.rank, c.size = rank, plan.nranks
        for name, field in FIELDS_C.items():
            setattr(c, field, plan.params[name])
        # ack debts: per set, at most one per reader (O(p), not O(p^2))
        who = np.zeros(lib.SC_NSETS * plan.nranks, np.int32)
        cnt = np.zeros(lib.SC_NSETS * plan.nranks, np.uint64)
        c.debt_who = ffi.cast("int32_t *", who.ctypes.data)
        c.debt_cnt = ffi.cast("uint64_t *", cnt.ctypes.data)
        acked = np.zeros(2 * max(plan.nranks, 1), np.uint64)
        acked[0::2] = (plan.params["call_base"] - 1) % (1 << 64)    # as the ack lines start: one call before the first
        c.acked = ffi.cast("uint64_t *", acked.ctypes.data)
        nb = checks(rank, plan.nranks, plan.params["check_star"]) if rank >= 0 else []
        c.nnb = len(nb)
        c.nb[0:len(nb)] = nb
        lib.sc_layout(c)
        return c, [who, cnt, acked]

    @staticmethod
    def layout(plan):
        return Device._context(plan, -1)[0].total

    @classmethod
    def create(cls, plan, name=None):
        """Creator side (launcher): segment placed per NUMA node and initialised
        (name: kept until the segment's unlink, see Segment.create)."""
        c = cls._context(plan, -1)[0]
        seg = Segment.create(plan.size, cls._placement(plan, c), name)
        dev = cls.__new__(cls)
        dev.plan, dev.rank, dev.segment = plan, -1, seg
        dev.c, dev._keep = cls._context(plan, 0)
        dev._base = ffi.from_buffer(seg.mmap)
        dev.c.base = ffi.cast("char *", dev._base)
        if lib.sc_init_shared(dev.c) != 0:
            raise RuntimeError("could not initialise the communicator's segment")
        return dev

    @classmethod
    def made(cls, plan, name=None):
        """A communicator made after the ranks exist: its rank 0 creates the
        segment (as create) and this is rank 0's view of it."""
        return cls.create(plan, name).as_rank(0)

    def as_rank(self, rank):
        """The creator's mapping as rank `rank`'s view, the creator's own
        view released (it makes no call), so that the view's close unmaps."""
        ffi.release(self._base)
        return Device(self.plan, rank, self.segment)

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

    # -- programs ------------------------------------------------------------
    def program(self, key, coll, alg, make, dtype=0, sigbytes=None, tail=None, op=0, alt=None):
        """This rank's compiled program for key, planned by make() ->
        Schedule on a miss.  A key of seven ints (collective, algorithm or
        -1, root, byte counts, item size or dtype, counts fingerprint or 0)
        is the fast entries' cache key, and the program is installed there;
        any other stays here.  The signature holds dtype (a code) and sigbytes (the
        schedule's byte count if None) and op (a reduction's operator
        code); tail, a v-variant's counts and
        displacements, ends the program for the fast entry to compare.
        alt = (nbytes, make): the same call staged (make() -> Schedule, of
        nbytes), made the program's twin (core.h) where it compiles to
        other instructions."""
        here = key if tail is None else key + (tuple(tail),)     # exact counts: no fingerprint collision
        prog = self._programs.get(here)
        if prog is None:
            sched = make()
            sig = isa.signature(coll, alg, sched.root, sched.nbytes if sigbytes is None else sigbytes, dtype, op)
            # twins: every rank compares all ranks' programs, so that all make the same twins
            progs = compile_schedule(sched, self.plan.params, sig, None if alt else self.rank)
            prog = progs[self.rank]
            other = None
            if alt:
                others = compile_schedule(alt[1](), self.plan.params, sig)
                if not all(map(np.array_equal, progs, others)):
                    other = others[self.rank]
            if tail is not None:
                prog = np.concatenate([prog, np.asarray(tail, np.int64)])
                prog[6] = prog.size - len(tail)
            if len(self._programs) >= 4 * lib.SC_CACHE:
                self.clear_programs()
            self._programs[here] = prog
            self._scratch(int(prog[4]))
            if other is not None:
                self._twin(here, prog, other, alt[0])
        if len(key) == lib.SC_KEY:
            self._install(key, prog)        # another key may have taken its cache slot
        return prog

    def _twin(self, here, prog, other, nbytes):
        sig0, alg = lib.SC_H_SIG0, next(f for f in isa.SIG if f.name == "algorithm")
        prog[sig0] |= isa.put(alg, TWIN_ALG)      # in the signature: a rank running this program alone raises
        other[sig0] = prog[sig0]
        t = np.zeros(lib.SC_TW_WORDS, np.int64)
        t[lib.SC_TW_PROG:lib.SC_TW_PROG + 2] = prog.ctypes.data, other.ctypes.data
        prog[7] = other[7] = t.ctypes.data
        self._twins[here] = (t, other, nbytes)
        self._scratch(int(other[4]))

    def twins(self):
        """{program key: (the call's bytes, estimated ns of the single-copy
        and the staged program (rank 0's), calls this rank ran each)}."""
        def estimates(t):
            p = ffi.cast("int64_t *", t.ctypes.data)
            return lib.sc_twin_estimate(p, 0), lib.sc_twin_estimate(p, 1)
        return {k: (n, estimates(t), tuple(int(x) for x in t[lib.SC_TW_RUNS:lib.SC_TW_RUNS + 2]))
                for k, (t, _, n) in self._twins.items()}

    def _install(self, key, prog):
        lib.sc_cache_put(self.c, ffi.new("int64_t[]", key), ffi.cast("int64_t *", prog.ctypes.data))

    def _scratch(self, n):
        if n and (self._tmp is None or self._tmp.size < n):
            self._tmp = np.empty(max(n, 2 * (self._tmp.size if self._tmp is not None else 0)), np.uint8)
            self.c.tmp = ffi.cast("char *", self._tmp.ctypes.data)
            self.c.tmp_bytes = self._tmp.size

    def clear_programs(self):
        self.c.pend_n = 0                   # the times it waits for go with their twin blocks
        self._programs.clear()
        self._twins.clear()
        ffi.memmove(self.c.cache, b"\0" * ffi.sizeof(self.c.cache), ffi.sizeof(self.c.cache))

    def execute(self, prog, saddr, raddr):
        """Run prog; rc (0 or a negative SC_E* code).  KeyboardInterrupt
        propagates from a wait that a signal interrupted."""
        return _exec(self.addr, prog.ctypes.data, saddr, raddr)

    @functools.cached_property
    def addr(self):
        return int(ffi.cast("uintptr_t", self.c))

    def entry(self, method, on_error, ids, cid, roles, desc, resolve=None):
        """The C fast entry bound to this context for one collective method:
        it declines to method (the checked Python version), raises through
        on_error(rc), names algorithms by ids, parses by roles (pyfast.c; a
        leading digit: the argument whose dtype the signature holds) and
        desc = (argument names, {built-in op: code}, IN_PLACE, SUM).
        resolve: a nonblocking call's entry, given ({program: template},
        Complete) (nonblocking.py): it runs nothing but a start it can make
        without Python (pyfast.c start_known), and otherwise gives
        (program, send address, recv address) of a call whose program it
        holds."""
        typed = int(roles[0]) if roles[:1].isdigit() else -1
        roles = roles[typed >= 0:]
        assert len(roles) == len(desc[0]) <= 8, roles      # pyfast.c's MAXARGS, and room for the NUL
        info = ffi.new("sc_info_t *", {"c": self.c, "coll": cid, "typed": typed, "reduction": "p" in roles,
                                       "roles": roles.encode()})
        return _new_cfunction(int(ffi.cast("uintptr_t", lib.sc_py_entry(0))),
                              (bytes(ffi.buffer(info)), method, on_error, ids, desc) + ((resolve,) if resolve else ()), None)

    # -- lifetime ---------------------------------------------------------------
    def register(self, pid, tracer):
        """Mark this rank alive; only the job's processes (tracer, the
        launcher, and its descendants) may read its memory."""
        huge_arrays(self.plan.params["huge_bytes"], self.plan.params["huge_slot_bytes"])   # its arena, published
        if lib.sc_register(self.c, pid, tracer) != 0:
            raise RuntimeError(f"rank {self.rank} could not register")

    def rank_state(self, rank):
        """0 not yet registered, 1 alive, 2 left, 3 dead."""
        return lib.sc_rank_state(self.c, rank)

    def deregister(self, ok=True):
        """Leave; (rank, its calls, ours) of the lowest rank that left
        before with another number of calls, or None (ok: this rank's calls
        all succeeded, so its count compares).  Calls count from the first
        after the communicator's own start-up calls (started)."""
        r = lib.sc_deregister(self.c, ok)
        lib.sc_peers_close(self.c)          # no more calls: the peers' arenas go
        base = self.started
        return None if r < 0 else (r, (lib.sc_calls_of(self.c, r) - base) % (1 << 64), (self.c.call - base) % (1 << 64))

    def close(self):
        """Unmap (the creator's or a rank's view, and the peers' arenas); the
        name is long gone.  A registered rank's liveness holder ends first."""
        lib.sc_release(self.c)
        lib.sc_peers_close(self.c)
        lib.sc_p2p_free(self.c)
        ffi.release(self._base)
        self.segment.mmap.close()
        self.segment.close_fd()

    def abort(self, rank, code):
        """Abort the job for rank's failure.  This rank's own abort lets
        peers finish the calls it finished; anyone else's counts at once."""
        if rank == self.rank:
            lib.sc_abort_self(self.c, code)
        else:
            lib.sc_set_abort(self.c, rank, code)

    def abort_code(self):
        """The abort word's code (device.ABORT_REASONS, ABORT_CALLED | errorcode), 0 if none."""
        return ffi.cast("uint32_t *", self.c.base)[0] >> 16

    def abort_rank(self):
        """The rank the abort word names (the first failure any rank or the
        launcher saw), -1 if none."""
        return (ffi.cast("uint32_t *", self.c.base)[0] & 0xffff) - 1

    def failure(self, rc, what, names=None):
        """The exception for a failed C call (rc < 0).  names(field, value, when)
        turns a signature field's value into words."""
        c, me = self.c, self.rank
        if rc == lib.SC_EABORT:
            who, code = c.err_rank, c.err_a
            if code == 8 and 0 <= who < self.plan.nranks:
                found = ffi.new("int64_t[5]")
                lib.sc_mismatch_of(c, who, found)
                exc = self.mismatch(what, who, *found, names, f"; found by rank {who}, seen on rank {me}")
                exc.found_by = who      # an echo: launch() reports the finder's own error before it
                return exc
            where = ""
            if who < 0 and c.job_abort != ffi.NULL:     # the job failed on another communicator
                word = c.job_abort[0]
                who, code = (word & 0xffff) - 1, word >> 16
                if who in self.members:
                    who = self.members.index(who)
                else:
                    where = " (a world rank, not of this communicator)"
            cls = PeerDied if code == 2 else PeerAborted
            why = f"called Abort({code & 0xff})" if code & ABORT_CALLED else ABORT_REASONS.get(code, 'aborted')
            return cls(who, f"{why}{where} (seen in {what} on rank {me})")
        if rc == lib.SC_EDEAD:
            return PeerDied(c.err_rank, f"{'exited' if c.err_code == 4 else 'died'} while rank {me} waited on "
                                        f"it in {what}")
        if rc == lib.SC_ETIMEOUT:
            on = "it" if c.err_b < 0 else f"rank {c.err_b}, which waits on it,"
            return PeerTimeout(c.err_rank, f"did not arrive for {c.err_a / 1000:.3g} s while rank {me} waited on {on} "
                                           f"in {what} (stopped, stalled, or in another call?); the job is aborted "
                                           f"(timeout option / SHMCOLL_TIMEOUT)")
        if rc == lib.SC_ECMA:
            verb = ("write into", "writev") if c.err_a else ("read", "readv")
            return CMAError(c.err_b, f"{what}: rank {me} could not {verb[0]} rank {c.err_rank}'s memory "
                                     f"(process_vm_{verb[1]}: {os.strerror(c.err_b)}); the job is aborted")
        if rc == lib.SC_ENOMEM:
            return MemoryError(f"{what}: out of memory")
        if rc == lib.SC_EINTR:
            return KeyboardInterrupt()
        if rc == lib.SC_EBUSY:
            return RuntimeError(f"{what}: another thread of rank {me}, or this one from a signal handler, is "
                                f"inside a collective on this communicator; one communicator serves one call at "
                                f"a time")
        if rc in (lib.SC_EMISMATCH, lib.SC_EDIFFER):
            return self.mismatch(what, me, c.err_code, c.err_when, c.err_rank, c.err_a, c.err_b, names)
        return RuntimeError(f"{what}: engine error {rc}")

    @staticmethod
    def mismatch(what, me, f, when, other, a, b, names, tail=""):
        """MismatchError for rank me's finding: field f (device.FIELDS)
        differs, me has a and rank other has b, `when` calls ago (3: the
        calls went out of step)."""
        if when == 3:
            return MismatchError(f"{what}: the ranks' calls went out of step in an earlier call: rank {me} and rank "
                                 f"{other} did not make the same calls{tail}")
        ago = {0: "", 1: " in the previous call", 2: " in an earlier call"}.get(when, "")
        a, b = (names(f, v, when) if names else v for v in (a, b))
        return MismatchError(f"{what}: arguments differ across ranks{ago} ({FIELDS.get(f, 'collective')}): rank {me} "
                             f"has {a}, rank {other} has {b}{tail}")
