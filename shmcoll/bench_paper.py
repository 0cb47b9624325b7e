"""``shmcoll bench --paper``: the papers' comparisons, timed here, beside the papers' own figures.

Each comparison a paper makes (padded against original barrier, limited
against original bcast at large sizes, tiled against pairwise alltoall, the
allgather algorithms against each other) is measured by the bench's method:
its columns interleaved in every round, the time per call the slowest
rank's, median of the repetitions.  A gain is the baseline's time over the
variant's in the same round (above 1: the variant is faster), reported as
the median over rounds with their range, since only ratios taken together
mean anything on a shared host.  The papers ran 16 processes on 4 sockets of
4 cores (001) and one process per cluster node (000); the caveat lines say
what this machine can show of that.
"""
import argparse
import math
import statistics
from typing import NamedTuple, Optional

from shmcoll import bench
from shmcoll.bench import Progress, announce, document, echo, failures, human, plan, save, weights

K, M = 1 << 10, 1 << 20


def cut(fraction):
    """A paper's "time cut by x%" (its "性能提升 x%", e.g. 5.7 -> 2.28 us is its 60%) as a speedup."""
    return 1 / (1 - fraction)


class Claim(NamedTuple):
    """One comparison a paper makes: ``variant`` is the one it found faster than ``base``."""
    op: str
    size: int           # bytes as the bench counts them (bcast: the buffer; alltoall, allgather: a block)
    base: str
    variant: str
    paper_gain: Optional[float]     # the paper's base time over variant time; None: said, no figure
    said: str           # the paper's figure, in SEEDS.md's words where it has them
    source: str         # paper (SEEDS.md's numbering), section, figure
    needs: str          # what the gain comes from: a key of NEEDS


#: The papers' experiments (/work/shared/SEEDS.md; originals in /work/shared/seeds/).  001: 16
#: processes, IMB 3.2, 4 x 4-core AMD Barcelona, MVAPICH-1.1.  000: one process per node, blocks
#: of 8 B, 8 KB and 120 KB for short, medium and long messages (its section 5).
CLAIMS = [
    Claim("barrier", 0, "original", "padded", 5.7 / 4.97, "5.7 us -> 4.97 us (padded)", "001 5.1, Fig. 4", "lines"),
    Claim("barrier", 0, "padded", "hierarchical", 4.97 / 2.28, "4.97 us (padded) -> 2.28 us (hierarchical)",
          "001 5.1, Fig. 4", "sockets"),
    Claim("barrier", 0, "original", "hierarchical", cut(0.60), "-60%", "001 5.1, Fig. 4", "sockets"),
    Claim("bcast", 512 * K, "original", "limited", cut(0.15), "k 16 -> 4 cut 512 KB time by 15%",
          "001 5.2, Fig. 5", "contention"),
    Claim("bcast", 16 * M, "original", "limited", cut(0.035), "16 MB: 3.5%", "001 5.2, Fig. 5", "contention"),
    Claim("bcast", 128 * K, "original", "numa", cut(0.346), "-34.6% at 128 KB", "001 5.2, Fig. 5", "nodes"),
    Claim("bcast", 16 * M, "original", "numa", cut(0.3458), "-34.58% at 16 MB (41648 us)", "001 5.2, Fig. 5",
          "nodes"),
    Claim("alltoall", 64 * K, "pairwise", "tiled", cut(0.04), "+4% at 64 KB", "001 5.3, Fig. 6", "cache"),
    Claim("alltoall", 16 * M, "pairwise", "tiled", cut(0.14), "+14% at 16 MB", "001 5.3, Fig. 6", "cache"),
    Claim("allgather", 8, "ring", "recursive_doubling", None, "short messages favour recursive doubling",
          "000 5, Figs. 3, 6, 7", "steps"),
    Claim("allgather", 8, "neighbor_exchange", "bruck", None, "short messages favour Bruck",
          "000 5, Figs. 3, 6, 7", "steps"),
    Claim("allgather", 8 * K, "neighbor_exchange", "ring", None, "8 KB: ring steady, neighbor exchange not "
          "(Ethernet)", "000 5.2, Figs. 8, 9", "network"),
    Claim("allgather", 120 * K, "bruck", "neighbor_exchange", 2.0, "120 KB: about half of Bruck's time "
          "(Dawning 4000A, Ethernet)", "000 5.2, Fig. 11", "network"),
    Claim("allgather", 120 * K, "ring", "neighbor_exchange", None, "long messages favour neighbor exchange "
          "(locality)", "000 5.1, Figs. 4, 5", "network"),
]

#: What each kind of gain needs of the machine: (whether it has it, the table's note where not, why).
NEEDS = {
    "lines": (lambda m: m["n"] <= m["cpus"], "cores shared",
              "ranks take turns on the cores, so a barrier's time is mostly the scheduler's, not its cache lines'"),
    "sockets": (lambda m: m["sockets"] > 1, "one socket", "no cross-socket traffic to save"),
    "nodes": (lambda m: m["nodes"] > 1, "one NUMA node", "no memory controller to add"),
    "contention": (lambda m: m["readers"] > 4, "few readers",
                   "at most {readers} ranks read at once (the paper's limit is 4): little contention to limit"),
    "cache": (lambda m: True, "", ""),
    "steps": (lambda m: m["n"] > 2, "two ranks", "at two ranks every allgather algorithm is one exchange"),
    "network": (lambda m: False, "no network", "shared memory has no hops: a rank's distance costs nothing here"),
}


def experiments():
    """{op: (algorithms, sizes)}, in CLAIMS' order: what the run measures."""
    out = {}
    for c in CLAIMS:
        algs, sizes = out.setdefault(c.op, ([], []))
        algs += [a for a in (c.base, c.variant) if a not in algs]
        sizes += [c.size] * (c.size not in sizes)
    return out


def capped(size, cfg):
    return min(size, cfg.max_size) if cfg.max_size else size


def machine(cfg):
    """This machine's shape as NEEDS tests it, and the run's placement."""
    from shmcoll.topology import topology
    real = topology().to_dict()
    n = cfg.nprocs[0]
    return {"sockets": real["nsockets"], "cores": real["ncores"], "cpus": len(bench.CPUS),
            "nodes": len(real["nodes"]), "n": n, "readers": min(n, len(bench.CPUS)), "topology": cfg.topology}


def placement(cfg, m):
    """The topology the ranks run on: the one given, the real one when it has sockets for a hierarchy
    and a CPU per rank, else a virtual one of two sockets, so hierarchical and numa run their code."""
    if cfg.topology or (m["sockets"] > 1 and m["n"] <= m["cpus"]):
        return cfg.topology
    return f"2x{math.ceil(m['n'] / 2)}"


def groups(cfg):
    """One bench configuration per collective: its algorithms and (capped) sizes."""
    return [argparse.Namespace(**dict(vars(cfg), ops=[op], algorithms=",".join(algs),
                                      sizes=sorted({capped(s, cfg) for s in sizes})))
            for op, (algs, sizes) in experiments().items()]


def main(cfg, argv, peers):
    """Measure every claim's columns, print the bench's tables and the gains, save the JSON."""
    m = machine(cfg)
    cfg.topology = placement(cfg, m)
    m["topology"] = cfg.topology
    runs = [(g, plan(g, peers)) for g in groups(cfg)]
    cfg.ops, cfg.sizes = [g.ops[0] for g, _ in runs], sorted({s for g, _ in runs for s in g.sizes})
    cfg.algorithms = ",".join(dict.fromkeys(a for g, _ in runs for a in g.algorithms.split(",")))
    total = sum(sum(weights(j, g)) for g, jobs in runs for j in jobs)
    announce(f"the papers' experiments, {m['n']} processes" + (f" on topology {cfg.topology}" if cfg.topology
             else "") + f", {cfg.rounds} round{'s' * (cfg.rounds > 1)}, {sum(len(jobs) for _, jobs in runs)} launches", total, cfg)
    results, libraries = measure(runs, peers, total)
    bad = failures(results)
    rows = [gain(c, results, cfg, m) for c in CLAIMS]
    notes = caveats(m)
    echo(report(rows, cfg) + "\n" + "\n".join(notes))
    doc = document(argv, cfg, peers, libraries, results)
    doc["paper"] = {"machine": m, "claims": rows, "caveats": notes}
    save(doc, cfg)
    return 1 if bad else 0


def measure(runs, peers, total):
    """Every collective's jobs, under one progress bar: the bench's rows and the peers' libraries."""
    bench.PROGRESS = Progress(total)
    results, libraries = [], {}
    try:
        for g, jobs in runs:
            got, libs = bench.run(jobs, g, peers, None)
            results += got
            libraries.update(libs)
    finally:
        bench.PROGRESS.close()
        bench.PROGRESS = None
    return results, libraries


def gain(claim, results, cfg, m):
    """The claim's row: both columns' time per round, their ratio per round, its median and range."""
    size = capped(claim.size, cfg)
    us = {(r["algorithm"], r["round"]): r["us"] for r in results
          if r["op"] == claim.op and r["size"] == size and r["impl"] == "shmcoll" and r["valid"] and not r["error"]}
    rounds = range(cfg.rounds)
    base, variant = [us.get((claim.base, k)) for k in rounds], [us.get((claim.variant, k)) for k in rounds]
    each = [b / v for b, v in zip(base, variant) if b and v]
    ok, short, _ = NEEDS[claim.needs]
    note = ", ".join(filter(None, [f"run at {human(size)}" if size != claim.size else "",
                                   "" if ok(m) else short, "" if each else "not measured"]))
    return {**claim._asdict(), "size_here": size, "nprocs": m["n"],
            "topology": m["topology"], "base_us": base, "variant_us": variant, "gains": each,
            "gain": statistics.median(each) if each else None, "gain_min": min(each, default=None),
            "gain_max": max(each, default=None), "can_show": ok(m), "note": note}


def title(row):
    return f"{row['op']} {row['variant']} / {row['base']}"


def report(rows, cfg):
    """The table: experiment, size, the paper's gain, the gain here [range], a note; then what the paper says."""
    here = lambda r: "-" if r["gain"] is None else bench.number(r["gain"]) + (
        f" [{bench.number(r['gain_min'])}-{bench.number(r['gain_max'])}]" if len(r["gains"]) > 1 else "")
    header = ["", "experiment", "size", "paper", "here", "note"]
    lines = [[str(i), title(r), "-" if r["op"] == "barrier" else human(r["size"]),
              bench.number(r["paper_gain"]) if r["paper_gain"] else "faster", here(r), r["note"]]
             for i, r in enumerate(rows, 1)]
    widths = [max(len(x) for x in col) for col in zip(header, *lines)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    said = [f"{i:>{widths[0]}}  {r['source']}: {r['said']}" for i, r in enumerate(rows, 1)]
    rounds = f"median of {cfg.rounds} rounds [range]" if cfg.rounds > 1 else "one round"
    return (f"\n# the papers' experiments here, {rows[0]['nprocs']} processes: gain = the base's time / the variant's "
            f"(above 1: the variant is faster), {rounds}\n"
            + "\n".join(fmt(line) for line in [header] + lines)
            + "\n# what the papers say, on their machines (paper, section, figure: figure)\n" + "\n".join(said))


def caveats(m):
    """What this machine can and cannot show, from its real topology and the run's placement; then the notes."""
    out = [f"caveat: this machine has {m['sockets']} socket(s), {m['cores']} cores, {m['cpus']} CPUs for the ranks "
           f"and {m['nodes']} NUMA node(s); paper 001 ran 16 processes on 4 sockets x 4 cores (AMD Barcelona, 4 "
           f"NUMA nodes), paper 000 one process per node of a cluster (QsNET, Fast Ethernet)"]
    if m["topology"]:
        out.append(f"caveat: topology {m['topology']} is virtual: its sockets and NUMA nodes are {m['sockets']} real "
                   f"socket(s) and {m['nodes']} real node(s), so hierarchical barrier and numa bcast run their code "
                   f"but what they save is not there to save: their timings mean little")
    if m["n"] > m["cpus"]:
        out.append(f"caveat: {m['n']} ranks on {m['cpus']} CPUs: oversubscribed, ranks take turns on the cores and "
                   f"wait through the scheduler; no row measures the papers' contention")
    out.append("caveat: the host is shared and drifts: only ratios within a round mean anything, and the range "
               "says how far the rounds disagree")
    used = {c.needs for c in CLAIMS}
    return out + [f"note '{short}': {why.format(**m)}" for need, (ok, short, why) in NEEDS.items()
                  if need in used and not ok(m)]
