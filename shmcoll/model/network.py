"""Paper 002 at the network level: a hierarchical Alltoall of N nodes of P
ranks, its intra-node legs predicted from the machine's parameters
(shmcoll.model.predict) and its inter-node leg by the paper's (2)-(4),
which is where the paper's switch contention belongs.

Two ways to run the inter-node leg are compared:

  direct  every rank exchanges with each of the (N - 1) P off-node ranks
          itself: (N - 1) P steps, in each the P ranks of a node inject
          one block each at once through the node's one NIC
  leader  the node's ranks gather their off-node blocks to a leader, the
          leaders exchange P * P blocks per node pair (N - 1 steps), and
          each leader scatters what it received

Both run the intra-node Alltoall of the on-node blocks first, and the
legs one after another (an implementation that overlaps them is faster)."""
import re
from dataclasses import dataclass

from ..coll import select
from .paper import contention_time, contention_wait
from .predict import predict
from .report import _size

#: The network string's fields: name -> meaning (docs/model.md, "Across nodes").
FIELDS = {"alpha": "latency of one message (1.5us, 800ns, 0.002ms, or seconds)",
          "beta": "a link's bandwidth (12.5GB/s, 100Gb/s, 12GiB/s) or time per byte (0.08ns/B, or s/B)",
          "hops": "switches a packet crosses", "radix": "ports of a switch (its k x k)",
          "packet": "bytes of a packet (4K, 4096, 32B; default 4K)",
          "cycle": "a switch's cycle, one packet per port (default: a packet's time on a link, packet x beta)",
          "rho": "injection rate per port per cycle, in [0, 1) (default: derived from the load)",
          "wait": "a packet's wait per switch, a time (instead of rho: no queueing model)"}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9}
_PREFIX = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30,
           "Ti": 1 << 40}
_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


@dataclass(frozen=True)
class Network:
    """A switched network of the paper's kind (a multistage network of
    radix x radix switches): seconds, seconds per byte, bytes.  rho and
    wait None: the injection rate is derived from the load (rho_of)."""
    alpha: float
    beta: float
    hops: int
    radix: int = None
    packet: float = 4096
    cycle: float = None
    rho: float = None
    wait: float = None

    def __post_init__(self):
        for name, ok in (("alpha", self.alpha >= 0), ("beta", self.beta > 0), ("packet", self.packet > 0),
                         ("hops", isinstance(self.hops, int) and self.hops >= 0),
                         ("radix", self.radix is None and self.wait is not None
                          or isinstance(self.radix, int) and self.radix >= 2),
                         ("cycle", self.cycle is None or self.cycle > 0),
                         ("rho", self.rho is None or 0 <= self.rho < 1),
                         ("wait", self.wait is None or self.wait >= 0)):
            if not ok:
                raise ValueError(f"network: {name} = {getattr(self, name)!r} is out of range ({FIELDS[name]})")
        if self.rho is not None and self.wait is not None:
            raise ValueError("network: rho and wait both given: wait replaces the queueing model rho feeds")

    @property
    def tick(self):
        """Seconds of a switch cycle, in which a port passes one packet."""
        return self.cycle or self.packet * self.beta

    def text(self):
        """The network as the string parse() reads."""
        out = [f"alpha={self.alpha * 1e6:g}us", f"beta={1e-9 / self.beta:g}GB/s", f"hops={self.hops}"]
        out += [] if self.radix is None else [f"radix={self.radix}"]
        out += [f"packet={self.packet:g}"]
        out += [f"{n}={v * 1e9:g}ns" for n, v in (("cycle", self.cycle), ("wait", self.wait)) if v is not None]
        return ",".join(out + ([] if self.rho is None else [f"rho={self.rho:g}"]))


def parse(text):
    """A Network from "alpha=1.5us,beta=12.5GB/s,hops=3,radix=48[,packet=4K]
    [,cycle=..][,rho=..|wait=..]" (FIELDS); a ValueError names the field
    that is missing, unknown or unreadable."""
    got = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, eq, value = (s.strip() for s in item.partition("="))
        if not eq or name not in FIELDS:
            raise ValueError(f"network: {name!r} is no field (fields: {', '.join(FIELDS)})")
        if name in got:
            raise ValueError(f"network: {name} given twice")
        try:
            got[name] = _READ[name](value)
        except ValueError:
            raise ValueError(f"network: {name}: cannot read {value!r} ({FIELDS[name]})") from None
    needed = ["alpha", "beta", "hops"] + ([] if "wait" in got else ["radix"])     # (3) needs the radix
    missing = [n for n in needed if n not in got]
    if missing:
        raise ValueError("network: " + "; ".join(f"no {n} ({FIELDS[n]})" for n in missing))
    return Network(**got)


def _time(value):
    m = re.fullmatch(_NUM + r"\s*(s|ms|us|µs|μs|ns)?", value)
    if not m:
        raise ValueError(value)
    return float(m[1]) * _TIME[m[2] or "s"]


def _beta(value):
    """Seconds per byte, from a bandwidth (B: bytes, b: bits) or a time per byte."""
    m = re.fullmatch(_NUM + r"\s*(|k|K|M|G|T|Ki|Mi|Gi|Ti)(B|b)/s", value)
    if m:
        return (8 if m[3] == "b" else 1) / (float(m[1]) * _PREFIX[m[2]])
    if value.endswith("/B") and value[:-2].rstrip()[-1:].isalpha():
        return _time(value[:-2].rstrip())           # a time per byte: 0.08ns/B
    return _time(value)                             # a bare number: seconds per byte


def _bytes(value):
    m = re.fullmatch(_NUM + r"\s*(|K|M|G)(?:i?B)?", value)
    if not m:
        raise ValueError(value)
    return float(m[1]) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m[2]]


_READ = {"alpha": _time, "beta": _beta, "hops": int, "radix": int, "packet": _bytes, "cycle": _time,
         "rho": float, "wait": _time}


def rho_of(net, msg, streams):
    """The injection rate of a step in which `streams` messages of `msg`
    bytes leave a node at once: the packets its link carries per cycle,
    (streams msg / packet) cycle / T, where the step's time T is (4)'s
    alpha + streams msg beta + (msg / packet) hops w(rho).  A rank sends
    its next block only when the last one has arrived, so waiting slows
    the injection (a closed network, as Agarwal 1991, the paper's [17]):
    rho is the fixed point, found by bisection (the left side grows with
    rho, the right falls)."""
    load = streams * msg / net.packet * net.tick
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        wait = contention_wait(mid, net.radix) * net.tick
        step = net.alpha + streams * msg * net.beta + msg / net.packet * net.hops * wait
        lo, hi = (mid, hi) if mid * step < load else (lo, mid)
    return lo


def exchange(net, steps, msg, streams):
    """The inter-node leg: `steps` steps of (4), in each `streams` messages
    of `msg` bytes from each node sharing its link (each message gets
    1 / streams of it: beta x streams); the parts of its time and the
    injection rate and wait (seconds) it ran at."""
    if net.wait is not None:
        rho, wait = None, net.wait
    else:
        rho = net.rho if net.rho is not None else rho_of(net, msg, streams) if msg else 0.0
        wait = contention_wait(rho, net.radix) * net.tick
    beta = streams * net.beta
    total = contention_time(steps + 1, msg, net.alpha, beta, net.packet, net.hops, wait)
    return {"steps": steps, "message": msg, "streams": streams, "rho": rho, "wait": wait,
            "latency": steps * net.alpha, "bandwidth": steps * msg * beta,
            "contention": steps * msg / net.packet * net.hops * wait, "time": total}


def fastest(op, nranks, nbytes, machine, topology=None):
    """(seconds, algorithm) of op's fastest algorithm on one node, as the
    predictor has them: the schedule a tuned node would run (and no tuning
    file of this host decides it)."""
    return min((predict(op, a, nranks, nbytes, machine, topology=topology), a) for a in select.algorithms(op))


def hierarchical_alltoall(nodes, ppn, k, machine, network, topology=None):
    """The predicted time of an Alltoall of k bytes per pair over `nodes`
    nodes of `ppn` ranks, both ways (module doc): {"direct": ..., "leader":
    ..., "winner": name}, each strategy's legs in seconds and its total."""
    if nodes < 1 or ppn < 1 or k < 0:
        raise ValueError(f"nodes and ranks per node must be 1 or more, k 0 or more: not {nodes}, {ppn}, {k}")
    intra, alg = fastest("alltoall", ppn, k, machine, topology)
    off = (nodes - 1) * ppn * k             # each rank's bytes for other nodes
    direct = {"intra": {"time": intra, "algorithm": alg},
              "network": exchange(network, (nodes - 1) * ppn, k, ppn)}
    gather, scatter = ({"time": t, "algorithm": a} for t, a in
                       (fastest(op, ppn, off, machine, topology) if ppn > 1 and off else (0.0, None)
                        for op in ("gather", "scatter")))      # a node of one rank is its own leader
    leader = {"intra": direct["intra"], "gather": gather,
              "network": exchange(network, nodes - 1, ppn * ppn * k, 1), "scatter": scatter}
    for s in (direct, leader):
        s["total"] = sum(leg["time"] for leg in s.values())
    return {"nodes": nodes, "ppn": ppn, "k": k, "direct": direct, "leader": leader,
            "winner": "direct" if direct["total"] <= leader["total"] else "leader"}


def text(results, machine, network):
    """`shmcoll model --nodes`'s table: per size both strategies' legs
    (microseconds; the network leg as (4)'s three terms) and the winner."""
    r0 = results[0]
    lines = [f"# hierarchical Alltoall, {r0['nodes']} nodes x {r0['ppn']} ranks: microseconds per call; node legs "
             f"predicted on {machine.description.get('name')}, network {network.text()}",
             "# network = latency + bandwidth + contention, (4) with the wait of (3) at injection rate rho",
             f"{'size':>6}  {'strategy':<9}" + "".join(f"{c:>11}" for c in
             ("intra", "gather", "latency", "bandwidth", "contention", "scatter", "total")) + f"{'rho':>7}"]
    for r in results:
        for name in ("direct", "leader"):
            s, net = r[name], r[name]["network"]
            cells = [s["intra"]["time"], s.get("gather", {}).get("time"), net["latency"], net["bandwidth"],
                     net["contention"], s.get("scatter", {}).get("time"), s["total"]]
            rho = "-" if net["rho"] is None else f"{net['rho']:.2f}"
            lines.append(f"{_size(r['k']):>6}  {name:<9}" + "".join(
                f"{'-' if v is None else f'{v * 1e6:.2f}':>11}" for v in cells) + f"{rho:>7}")
        win, lose = r["winner"], "leader" if r["winner"] == "direct" else "direct"
        algs = ", ".join(f"{leg} {r['leader'][leg]['algorithm']}" for leg in ("intra", "gather", "scatter")
                         if r["leader"][leg]["algorithm"])
        ratio = r[lose]["total"] / r[win]["total"] if r[win]["total"] else 1.0
        verdict = f"{win}, {ratio:.2f}x faster" if ratio > 1 else "a tie"
        lines.append(f"{'':>6}  -> {verdict} ({algs})")
    return "\n".join(lines)

