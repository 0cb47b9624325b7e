"""A machine's parameters for the model: what one hand-off, one byte copied
and one call cost on it, per level of its topology, and how concurrent
copies slow each other.  Measured by `shmcoll model --measure`
(shmcoll.model.measure), kept as JSON, loaded with `--params FILE`."""
import bisect
import json
import math
import os
import platform
from dataclasses import asdict, dataclass, field

VERSION = 1
#: How far apart two ranks are: sharing one CPU (taking turns), the two
#: hardware threads of one core, two cores of one socket, two sockets.
LEVELS = ("cpu", "core", "socket", "machine")


@dataclass
class Machine:
    """Times in seconds; a curve is [[bytes, seconds per byte], ...] by
    size (between its points interpolated in log bytes, beyond them the
    end point), as a copy's cost per byte depends on which cache holds
    its bytes."""
    description: dict           # name, cpus, sockets, topology, fingerprint, how it was had
    call: float                 # a rank's fixed cost per call: entry, arrival record, leaving
    switch: float               # handing a shared CPU from one rank to another
    alpha: dict                 # level -> from a writer's post to its reader seeing it
    beta: dict                  # level -> curve: a reader's copy of bytes a rank at that level wrote
    copy: list                  # curve: a rank's copy of its own bytes (into its ring, a local copy)
    fold: list                  # curve: folding one more input of n bytes
    contention: list            # [[bytes, [slowdown of 1, 2, ... concurrent copies of that size]], ...]
    cma: bool = True            # ranks may read each other's memory (single copy)
    version: int = field(default=VERSION)

    @staticmethod
    def per_byte(curve, n):
        """Seconds per byte of a curve at n bytes."""
        sizes = [s for s, _ in curve]
        x = math.log2(max(n, 1))
        i = bisect.bisect_left([math.log2(s) for s in sizes], x)
        if i == 0 or i == len(curve):
            return curve[min(i, len(curve) - 1)][1]
        (s0, v0), (s1, v1) = curve[i - 1], curve[i]
        f = (x - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
        return v0 + f * (v1 - v0)

    def slowdown(self, c, n):
        """How much longer each of c concurrent copies of n bytes takes
        than one alone: interpolated in log size like a curve; past the
        c measured, growing in proportion (a shared bandwidth)."""
        if c <= 1:
            return 1.0
        per = []
        for size, s in self.contention:
            per.append([size, s[c - 1] if c <= len(s) else s[-1] * c / len(s)])
        return max(self.per_byte(per, n), 1.0)

    def here(self):
        """Whether these are this machine's own figures (then a virtual
        topology's ranks are costed by the real CPUs they run on)."""
        return self.description.get("fingerprint") == fingerprint()

    def to_json(self):
        return json.dumps(asdict(self), indent=1)

    def save(self, path):
        with open(path, "w") as f:
            f.write(self.to_json() + "\n")


def load(path):
    """A Machine from a JSON file `shmcoll model --measure` wrote."""
    with open(path) as f:
        doc = json.load(f)
    if doc.get("version") != VERSION:
        raise ValueError(f"{path}: model parameters of version {doc.get('version')}, this shmcoll reads {VERSION}")
    missing = {"alpha", "beta", "call", "switch", "copy", "fold", "contention"} - set(doc)
    if missing:
        raise ValueError(f"{path}: no {', '.join(sorted(missing))}")
    return Machine(**doc)


def fingerprint():
    """This machine, as parameters name the one they were measured on."""
    cpus = len(os.sched_getaffinity(0))
    return f"{platform.node()}|{platform.machine()}|{_cpu_model()}|{cpus} cpus"


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


def _curve(*points):
    return [[n, ns * 1e-9] for n, ns in points]


#: ILLUSTRATIVE, not measured: a 2-socket, 32-core server (two 16-core
#: sockets, one NUMA node each) of the kind shmcoll targets, with figures of
#: the usual order for one (about 0.1-0.3 us per hand-off within a socket,
#: twice that across; 10-20 GB/s per core copying, 5-8 GB/s from memory,
#: ~100 GB/s per socket's memory shared by its cores).  It shows what the
#: model predicts for a machine that is not this one; measure a real one
#: with `shmcoll model --measure --params FILE` there.
EXAMPLE = Machine(
    description={"name": "illustrative 2-socket 32-core server (not measured)", "cpus": 32, "sockets": 2,
                 "topology": "2x16", "fingerprint": None, "source": "built-in example"},
    call=0.25e-6, switch=3e-6,
    alpha={"cpu": 0.0, "core": 0.08e-6, "socket": 0.2e-6, "machine": 0.45e-6},
    beta={"cpu": _curve((4096, 0.03), (1 << 16, 0.04), (1 << 20, 0.07), (16 << 20, 0.16)),
          "core": _curve((4096, 0.04), (1 << 16, 0.05), (1 << 20, 0.08), (16 << 20, 0.16)),
          "socket": _curve((4096, 0.08), (1 << 16, 0.07), (1 << 20, 0.09), (16 << 20, 0.17)),
          "machine": _curve((4096, 0.2), (1 << 16, 0.15), (1 << 20, 0.16), (16 << 20, 0.22))},
    copy=_curve((4096, 0.03), (1 << 16, 0.04), (1 << 20, 0.07), (16 << 20, 0.16)),
    fold=_curve((4096, 0.06), (1 << 16, 0.07), (1 << 20, 0.1), (16 << 20, 0.2)),
    contention=[[1 << 16, [1.0] * 16],
                [1 << 20, [min(1.0 + 0.02 * c, 1.3) for c in range(16)]],
                [16 << 20, [max(1.0, (c + 1) * 12 / 100) for c in range(16)]]],
    cma=True)
