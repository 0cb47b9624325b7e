"""Node topology: sockets, cores, hardware threads, NUMA nodes and caches.

The collectives pick algorithms and buffer placement from this, so it must
work the same on a live machine (parsed from /sys), on a recorded /sys tree
(tests), and on a *virtual* topology ("2x4x4") that pretends a small box is
a big multi-socket one while still pinning ranks to CPUs that really exist.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import asdict, dataclass, field

import psutil

ENV_VAR = "SHMCOLL_TOPOLOGY"
_BINDS = ("core", "socket", "numa", "none")
_MAPS = ("compact", "scatter")
_KIB = 1024


@dataclass(frozen=True)
class Cache:
    level: int                 # 1, 2, 3
    kind: str                  # 'Data', 'Instruction', 'Unified'
    size: int                  # bytes
    cpus: tuple[int, ...]      # logical CPUs sharing this cache instance


@dataclass(frozen=True)
class Core:
    index: int                 # dense 0..ncores-1, ordered by (socket, core id)
    socket: int                # dense socket index
    node: int                  # index into Topology.nodes
    cpus: tuple[int, ...]      # logical CPUs (hardware threads) of this core


@dataclass(frozen=True)
class NumaNode:
    id: int                    # node id as in /sys (virtual: 0..n-1)
    cpus: tuple[int, ...]
    memory: int                # bytes of MemTotal, 0 if unknown/memory-less
    distances: tuple[int, ...]  # SLIT row


@dataclass(frozen=True)
class Slot:
    """Where one rank runs and where its memory should live."""
    rank: int
    core: int                  # Core.index
    socket: int
    node: int                  # index into Topology.nodes
    real_node: int             # real NUMA node id for this rank's memory
    cpus: frozenset[int]       # real CPU ids for os.sched_setaffinity


def spare_cpus(slots) -> int:
    """The CPUs the ranks may run on, all together, less the ranks (below 0: oversubscribed)."""
    return len(frozenset().union(*(s.cpus for s in slots))) - len(slots)


def oversubscribed(slots) -> bool:
    """More ranks than the CPUs they may run on, all together: some must
    take turns on a CPU, so waits should hand the CPU over, not spin."""
    return spare_cpus(slots) < 0


@dataclass(frozen=True)
class Topology:
    cores: tuple[Core, ...]
    nodes: tuple[NumaNode, ...]
    caches: tuple[Cache, ...]  # each distinct cache instance once
    spec: str | None           # virtual spec, None for a real machine
    cpu_map: dict              # logical cpu -> real cpu id
    node_map: dict = field(default_factory=dict)  # node index -> real node id (default: nodes[i].id)

    @property
    def nsockets(self) -> int:
        return len({c.socket for c in self.cores})

    @property
    def ncores(self) -> int:
        return len(self.cores)

    @property
    def ncpus(self) -> int:
        return sum(len(c.cpus) for c in self.cores)

    def real_node_of(self, node_index: int) -> int:
        return self.node_map.get(node_index, self.nodes[node_index].id)

    def _real(self, cpus) -> frozenset[int]:
        return frozenset(self.cpu_map[c] for c in cpus)

    def cache_size(self, level: int) -> int:
        """Data/unified cache of `level` as seen from the first CPU (0 if absent)."""
        first = min(self.cpu_map)
        return next((c.size for c in self.caches if c.level == level
                     and c.kind != "Instruction" and first in c.cpus), 0)

    def shared_cache_size(self) -> int:
        """Highest-level cache shared between CPUs (the one worth blocking
        collectives for); else the highest private one; 0 without caches."""
        usable = [c for c in self.caches if c.kind != "Instruction"]
        shared = [c for c in usable if len(c.cpus) > 1] or usable
        if not shared:
            return 0
        first = min(self.cpu_map)
        return max(shared, key=lambda c: (c.level, first in c.cpus, c.size)).size

    def placement(self, nranks: int, bind: str = "core", map: str = "compact") -> list[Slot]:
        """Assign ranks to cores; nranks > ncores wraps (oversubscription)."""
        if map not in _MAPS:
            raise ValueError(f"unknown map {map!r}; expected one of {_MAPS}")
        if bind not in _BINDS:
            raise ValueError(f"unknown bind {bind!r}; expected one of {_BINDS}")
        if nranks < 0:
            raise ValueError(f"nranks must be >= 0, got {nranks}")
        by_socket = [[c for c in self.cores if c.socket == s] for s in range(self.nsockets)]
        everything = self._real(self.cpu_map)
        allowed = everything & os.sched_getaffinity(0) or everything  # disjoint: a recorded tree
        slots = []
        for rank in range(nranks):
            if map == "compact":
                core = self.cores[rank % self.ncores]
            else:
                group = by_socket[rank % self.nsockets]
                core = group[(rank // self.nsockets) % len(group)]
            if bind == "core":
                cpus = self._real(core.cpus)
            elif bind == "socket":
                cpus = self._real(x for c in by_socket[core.socket] for x in c.cpus)
            elif bind == "numa":
                cpus = self._real(x for c in self.cores if c.node == core.node for x in c.cpus)
            else:
                cpus = allowed
            slots.append(Slot(rank, core.index, core.socket, core.node,
                              self.real_node_of(core.node), cpus))
        return slots

    def to_dict(self) -> dict:
        return {
            "spec": self.spec, "nsockets": self.nsockets, "ncores": self.ncores,
            "ncpus": self.ncpus,
            "cores": [asdict(c) for c in self.cores],
            "nodes": [dict(asdict(n), real_id=self.real_node_of(i))
                      for i, n in enumerate(self.nodes)],
            "caches": [asdict(c) for c in self.caches],
            "cpu_map": {str(k): v for k, v in sorted(self.cpu_map.items())},
        }

    def describe(self) -> str:
        kind = f"virtual {self.spec}" if self.spec else "real machine"
        out = [f"Topology ({kind}): {self.nsockets} socket(s), {self.ncores} core(s), "
               f"{self.ncpus} CPU(s), {len(self.nodes)} NUMA node(s)"]
        for s in range(self.nsockets):
            cores = [c for c in self.cores if c.socket == s]
            out.append(f"Socket {s}: {len(cores)} core(s)")
            for c in cores:
                real = _fmt_cpus(self._real(c.cpus))
                out.append(f"  core {c.index}: cpus {_fmt_cpus(c.cpus)} (real {real}), node {c.node}")
        out.append("NUMA nodes:")
        for i, n in enumerate(self.nodes):
            mem = f"{n.memory / 2**30:.1f} GiB" if n.memory else "unknown/none"
            out.append(f"  node {n.id} (real {self.real_node_of(i)}): cpus {_fmt_cpus(n.cpus) or '-'}, "
                       f"memory {mem}, distances {' '.join(map(str, n.distances))}")
        out.append("Caches:" if self.caches else "Caches: none found")
        groups: dict[tuple, list[Cache]] = {}
        for c in self.caches:
            groups.setdefault((c.level, c.kind, c.size, len(c.cpus)), []).append(c)
        for (level, kind, size, width), insts in sorted(groups.items()):
            sets = " ".join(f"[{_fmt_cpus(c.cpus)}]" for c in insts)
            out.append(f"  L{level} {kind:<11} {_fmt_size(size):>8} x{len(insts)}, "
                       f"each shared by {width} cpu(s): {sets}")
        return "\n".join(out)


# -- /sys parsing -------------------------------------------------------------

def _parse_list(text: str) -> tuple[int, ...]:
    """Kernel cpulist format: '0-3,8-11' (possibly empty)."""
    out: list[int] = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(out))


def _fmt_cpus(cpus) -> str:
    cpus, runs = sorted(cpus), []
    for c in cpus:
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def _fmt_size(n: int) -> str:
    for unit, div in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def _parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text)
    if not m:
        raise ValueError(f"bad cache size {text!r}")
    return int(m[1]) * {"": 1, "K": _KIB, "M": _KIB**2, "G": _KIB**3}[m[2]]


def _read(path: str, default: str | None = None) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def read_sysfs(root: str = "/sys") -> Topology:
    """Parse a live or recorded /sys tree; only online CPUs count, and on
    the live tree only those this process may run on (taskset, a cgroup's
    cpuset), as mpiexec's binding does: a rank bound to a core outside
    them could not run there.  Missing topology/node/cache files degrade
    to one socket / one node / no caches (containers and VMs often hide
    parts of /sys)."""
    cpu_dir = os.path.join(root, "devices/system/cpu")
    online_txt = _read(os.path.join(cpu_dir, "online"))
    if online_txt is not None:
        online = _parse_list(online_txt)
    else:
        online = tuple(sorted(int(d[3:]) for d in os.listdir(cpu_dir) if re.fullmatch(r"cpu\d+", d)))
    live = os.path.realpath(root) == "/sys"
    if live:
        online = tuple(c for c in online if c in os.sched_getaffinity(0)) or online
    on = set(online)

    groups: dict[tuple, list[int]] = {}   # (package id, core id, siblings) -> cpus
    cache_seen: dict[tuple, Cache] = {}
    for cpu in online:
        base = os.path.join(cpu_dir, f"cpu{cpu}")
        pkg = int(_read(f"{base}/topology/physical_package_id", "0"))
        core_id = int(_read(f"{base}/topology/core_id", str(cpu)))
        sib = tuple(c for c in _parse_list(_read(f"{base}/topology/thread_siblings_list", str(cpu))) if c in on)
        groups.setdefault((pkg, core_id, sib), []).append(cpu)
        cache_dir = f"{base}/cache"
        for idx in sorted(os.listdir(cache_dir)) if os.path.isdir(cache_dir) else ():
            d = f"{cache_dir}/{idx}"
            if not idx.startswith("index") or _read(f"{d}/size") is None:
                continue
            shared = tuple(c for c in _parse_list(_read(f"{d}/shared_cpu_list", str(cpu))) if c in on)
            cache = Cache(int(_read(f"{d}/level")), _read(f"{d}/type", "Unified"),
                          _parse_size(_read(f"{d}/size")), shared)
            cache_seen.setdefault((cache.level, cache.kind, shared), cache)

    node_dir = os.path.join(root, "devices/system/node")
    node_ids = _parse_list(_read(f"{node_dir}/online", ""))
    nodes = []
    for nid in node_ids:
        d = f"{node_dir}/node{nid}"
        m = re.search(r"MemTotal:\s*(\d+)\s*kB", _read(f"{d}/meminfo", ""))
        dist = tuple(int(x) for x in _read(f"{d}/distance", "10").split())
        nodes.append(NumaNode(nid, tuple(c for c in _parse_list(_read(f"{d}/cpulist", "")) if c in on),
                              int(m[1]) * _KIB if m else 0, dist))
    if not nodes:
        nodes = [NumaNode(0, online, psutil.virtual_memory().total if live else 0, (10,))]

    sockets = sorted({pkg for pkg, _, _ in groups})
    node_of = {cpu: i for i, n in enumerate(nodes) for cpu in n.cpus}
    ordered = sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], min(kv[1])))
    cores = tuple(Core(i, sockets.index(key[0]), node_of.get(min(cpus), 0), tuple(cpus))
                  for i, (key, cpus) in enumerate(ordered))
    caches = tuple(sorted(cache_seen.values(), key=lambda c: (c.level, c.kind, c.cpus)))
    return Topology(cores, tuple(nodes), caches, None, {c: c for c in online})


# -- virtual topologies -------------------------------------------------------

def parse_spec(spec: str) -> tuple[int, int, int]:
    """'SxC' or 'SxCxN' -> (sockets, cores per socket, NUMA nodes; N defaults
    to S).  Nodes must tile sockets (or sockets tile nodes) so every core has
    exactly one socket and one node."""
    parts = spec.strip().lower().split("x") if isinstance(spec, str) else []
    if len(parts) not in (2, 3) or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"bad topology spec {spec!r}: expected 'SxC' or 'SxCxN' (e.g. '2x4', '2x4x4')")
    s, c, n = (int(p) for p in parts) if len(parts) == 3 else (int(parts[0]), int(parts[1]), int(parts[0]))
    if min(s, c, n) < 1:
        raise ValueError(f"bad topology spec {spec!r}: all counts must be >= 1")
    if (s * c) % n or (n % s and s % n):
        raise ValueError(f"bad topology spec {spec!r}: {n} NUMA node(s) cannot evenly tile "
                         f"{s} socket(s) x {c} core(s) (need N | S*C and N a multiple or divisor of S)")
    return s, c, n


def virtual(spec: str, real: Topology) -> Topology:
    """A fake S-socket machine with S*C single-thread cores, mapped round-robin
    onto the real CPUs we may run on, with virtual nodes backed round-robin by
    real nodes and caches copied from the real machine's sizes."""
    s, c, n = parse_spec(spec)
    real_cpus = sorted(set(real.cpu_map.values()))
    affinity = os.sched_getaffinity(0)
    allowed = [x for x in real_cpus if x in affinity] or sorted(affinity)
    ncores, per_node = s * c, s * c // n
    cores = tuple(Core(v, v // c, v // per_node, (v,)) for v in range(ncores))
    node_socket = [i * per_node // c for i in range(n)]
    nodes = tuple(
        NumaNode(i, tuple(range(i * per_node, (i + 1) * per_node)),
                 real.nodes[i % len(real.nodes)].memory,
                 tuple(10 if i == j else 12 if node_socket[i] == node_socket[j] else 21 for j in range(n)))
        for i in range(n))
    caches: list[Cache] = []
    for level, kind in ((1, "Data"), (2, "Unified")):
        if size := real.cache_size(level):
            caches += [Cache(level, kind, size, (v,)) for v in range(ncores)]
    if size := real.cache_size(3):
        caches += [Cache(3, "Unified", size, tuple(range(k * c, (k + 1) * c))) for k in range(s)]
    return Topology(cores, nodes, tuple(caches), spec, {v: allowed[v % len(allowed)] for v in range(ncores)},
                    {i: real.real_node_of(i % len(real.nodes)) for i in range(n)})


@functools.lru_cache(maxsize=None)
def _cached(spec: str | None, sysfs: str) -> Topology:
    real = read_sysfs(sysfs)
    return virtual(spec, real) if spec else real


def topology(spec: str | None = None, *, sysfs: str = "/sys") -> Topology:
    """The topology to run on: explicit spec, else $SHMCOLL_TOPOLOGY, else the
    real machine.  The env var is read per call; the parse is cached.  Note
    virtual cpu maps depend on the caller's CPU affinity at first call."""
    return _cached(spec or os.environ.get(ENV_VAR) or None, sysfs)
