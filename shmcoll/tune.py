"""`shmcoll tune`: time every algorithm of each collective on this node
and write the tuning file the automatic choice reads (shmcoll/tuning.py).

This machine's timings drift 2-5x over minutes, so the algorithms of one
size are timed in the same job, interleaved: each round times every
candidate once (one repetition of calls, the slowest rank's), in an order
rotated per round, and a candidate's figure is the median over rounds of
its time over the automatic choice's in the same round.  An algorithm
replaces the built-in rules at a size only where it beats them by more
than TOLERANCE; elsewhere the file says "auto", so the file can only
take a choice the rules would not, where it measured faster.

Candidates with a plan parameter (Bcast `limited`'s k, Alltoall `tiled`'s
tile) also run on a duplicate communicator planned with each other value
of it.  `--verify` times, the same way, the automatic choice with the
file against each algorithm and against the automatic choice without
it: the table the file must pass."""
import argparse
import os
import statistics
import sys

import numpy as np

from . import MPI, _mpi_peer, tuning
from ._mpi_peer import OPS, calibrate, timed
from .coll import select

#: An algorithm must beat the built-in rules by this much to replace them,
TOLERANCE = 0.03
#: and in this share of the rounds at least: a median 10% better from two
#: fast rounds of seven was noise (Alltoall tiled at 2 ranks, 8 KiB: 0.90x
#: when tuned, 1.53x when verified).
WINS = 0.75
#: `--ops` names (as _mpi_peer.OPS time them) whose byte count is the one
#: the selection sees (Comm.selected): the buffer, a rank's block, its input.
TUNABLE = ("barrier", "bcast", "alltoall", "allgather", "gather", "scatter", "allreduce", "reduce")
DEFAULT_OPS = "bcast,alltoall,allgather,allreduce"
#: Other values of a candidate's plan parameter, timed on a duplicate communicator.
VALUES = {"bcast_k": (1, 2, 4, 8), "tile_bytes": (4096, 16384, 65536, 262144)}


def sizes(top, op):
    """8 B and up in steps of 4 to top (barrier: none)."""
    return [0] if op == "barrier" else [8 << 2 * i for i in range(32) if 8 << 2 * i <= top]


def _variant(comm, given=None, tuning_=None):
    """A duplicate of comm planned with other options or another tuning
    table (every rank calls it alike): Dup plans from the parent's."""
    plan = comm.plan
    saved = dict(plan.given), plan.params["tuning"]
    plan.given.update(given or {})
    if tuning_ is not None:
        plan.params["tuning"] = tuning_
    try:
        return comm.Dup()
    finally:
        plan.given.clear()
        plan.given.update(saved[0])
        plan.params["tuning"] = saved[1]


def candidates(comm, op, tune_params, verify):
    """[(label, comm, algorithm)]: the automatic choice (in verify: with
    the job's tuning file, as "auto+file", and without it, as "auto"),
    every algorithm, and with tune_params each other value of a plan
    parameter (label "NAME k=V")."""
    out = [("auto+file" if verify else "auto", comm, None)]
    if verify:
        out.append(("auto", _variant(comm, tuning_=tuning.Tuning("-", "off", "verify")), None))
    for name in select.algorithms(op):
        out.append((name, comm, name))
        param = tuning.PARAMS.get((op, name)) if tune_params else None
        for v in VALUES.get(param, ()):         # k of n - 1 readers and more: all read at once, as the largest
            if v != comm.plan.params[param] and (param != "bcast_k" or v < comm.size - 1):
                out.append((f"{name} {param}={v}", _variant(comm, {param: v}), name))
    return out


def _share(comm):
    cell = np.zeros(1)

    def share(x):           # rank 0's calibration decides every rank's count
        cell[0] = x
        comm.Bcast(cell, 0)
        return float(cell[0])
    return share


def time_size(comm, op, nbytes, cands, cfg):
    """{label: [slowest rank's seconds per call, one per round]} of every
    candidate at nbytes, interleaved; each checked against numpy first."""
    share, runs = _share(comm), []
    for label, c, alg in cands:
        case = OPS[op](c, nbytes, alg)
        run = case.run
        if not comm.allreduce(case.check(), op=MPI.LAND):
            raise RuntimeError(f"{op} {label} at {nbytes} B gave a wrong result")
        runs.append((label, run, calibrate(run, comm.Barrier, share, cfg["min_time"], cfg["max_iters"])))
    out = {label: [] for label, _, _ in runs}
    for r in range(cfg["rounds"]):
        for label, run, n in runs[r % len(runs):] + runs[:r % len(runs)]:
            out[label].append(comm.allreduce(timed(run, comm.Barrier, n), op=MPI.MAX))
    return out


def _rank(comm, ops, top, cfg, verify):
    """A job's measurements: {op: [{bytes, us: {label: median}, ratio: {label: median over rounds of
    its time / auto's}, chosen: the automatic choice's algorithm}]} (rank 0's; every rank measures alike)."""
    _mpi_peer.SUM, _mpi_peer.MPI = MPI.SUM, MPI      # the ops' library: this one
    out = {}
    for op in ops:
        cands = candidates(comm, op, cfg["params"], verify)
        rows = out[op] = []
        for nbytes in sizes(top, op):
            t = time_size(comm, op, nbytes, cands, cfg)
            sel = comm.selected(op, nbytes)
            rows.append({"bytes": nbytes, "us": {k: statistics.median(v) * 1e6 for k, v in t.items()},
                         "ratio": {k: statistics.median(a / b for a, b in zip(v, t["auto"])) for k, v in t.items()},
                         "wins": {k: sum(a < b for a, b in zip(v, t["auto"])) / len(v) for k, v in t.items()},
                         "chosen": str(sel), "twins": sel.twins})
        for c in {id(c): c for _, c, _ in cands if c is not comm}.values():
            c.Free()
    return out


def decide(rows):
    """(bytes, (algorithm, params)) per measured row: the candidate of
    the lowest ratio to the rules, where it beats by TOLERANCE both the
    rules and the rules' own algorithm forced, and beats the rules in
    WINS of the rounds; else ("auto", {}).  Where the rules run their
    algorithm as it is forced (no twins), the two are one program and
    what they differ by is noise; where they run it as twins, the forced
    one is a program of its own, taken where it beats the rules."""
    out = []
    for row in rows:
        r, chosen = row["ratio"], row["chosen"]
        best = min(r, key=r.get)
        same = best == chosen and not row.get("twins")
        bar = 1 if best == chosen else min(1, r.get(chosen, 1))
        if best == "auto" or same or r[best] > bar / (1 + TOLERANCE) or row.get("wins", {}).get(best, 1) < WINS:
            out.append((row["bytes"], (tuning.AUTO, {})))
            continue
        name, _, setting = best.partition(" ")
        params = {setting.split("=")[0]: int(setting.split("=")[1])} if setting else {}
        out.append((row["bytes"], (name, params)))
    return out


def measure(counts, ops, top, cfg, verify=False, options=None):
    """{n: {op: rows}}: one job per rank count."""
    from .launcher import launch
    got = {}
    for n in counts:
        print(f"shmcoll tune: {n} ranks: {', '.join(ops)} up to {top} B", file=sys.stderr, flush=True)
        got[n] = launch(_rank, n, args=(ops, top, cfg, verify), timeout=cfg["timeout"], options=options)[0]
    return got


def table(got, verify):
    """The measured rows in words, one per (op, ranks, bytes)."""
    lines = [f"{'op':10} {'n':>3} {'bytes':>9}  {'fastest':28} {'x auto':>7}  " +
             ("file's choice        auto+file/best  auto+file/auto" if verify else "choice")]
    for n, by_op in got.items():
        for op, rows in by_op.items():
            chosen = {} if verify else dict(decide(rows))
            for row in rows:
                r = row["ratio"]
                best = min((k for k in r if k not in ("auto+file",)), key=r.get)
                head = f"{op:10} {n:>3} {row['bytes']:>9}  {best:28} {r[best]:7.3f}  "
                if verify:
                    lines.append(head + f"{row['chosen']:20} {r['auto+file'] / r[best]:14.3f}  {r['auto+file']:14.3f}")
                else:
                    name, params = chosen[row["bytes"]]
                    lines.append(head + name + "".join(f" {k}={v}" for k, v in params.items()))
    return "\n".join(lines)


def parse(argv):
    ap = argparse.ArgumentParser(prog="shmcoll tune", description="Time every algorithm of each collective here "
                                 "and write the tuning file the automatic choice reads (docs/tuning.md).")
    ap.add_argument("-n", "--np", default=None, dest="n", help="rank counts, comma-separated (default: 2 and "
                    "this machine's CPUs)")
    ap.add_argument("--ops", default=DEFAULT_OPS, help=f"collectives of {', '.join(TUNABLE)} (default {DEFAULT_OPS})")
    ap.add_argument("--max", default="16M", help="largest size, as shmcoll.schedule counts bytes (a Bcast's "
                    "buffer, a rank's block, a reduction's input); sizes from 8 B in steps of 4 (default 16M)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds per size (default 7; --quick 5)")
    ap.add_argument("--min-time", type=float, default=None, help="seconds per candidate per round (default "
                    "0.02; --quick 0.005)")
    ap.add_argument("--quick", action="store_true", help="sizes to 1M, fewer and shorter rounds, no parameter "
                    "values: seconds per collective, for a try or a test")
    ap.add_argument("--no-params", action="store_true", help="time each algorithm at its default parameters only")
    ap.add_argument("--output", "-o", default=None, help="the file (default: the tuning_file option, "
                    "SHMCOLL_TUNING_FILE, else $XDG_CACHE_HOME/shmcoll/tuning.json)")
    ap.add_argument("--verify", action="store_true", help="write nothing: time the automatic choice with the "
                    "file against every algorithm and against the choice without the file")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per job (default 1800)")
    return ap, ap.parse_args(argv)


def main(argv):
    from .cli import _size
    ap, a = parse(argv)
    ops = [x for x in a.ops.split(",") if x]
    bad = [x for x in ops if x not in TUNABLE]
    if bad:
        ap.error(f"--ops: cannot tune {', '.join(bad)}; choose from {', '.join(TUNABLE)}")
    try:
        counts = [int(x) for x in a.n.split(",") if x] if a.n else sorted({2, len(os.sched_getaffinity(0))})
        top = min(_size(a.max), 1 << 20) if a.quick else _size(a.max)
    except (ValueError, argparse.ArgumentTypeError) as e:
        ap.error(str(e))
    if any(n < 2 for n in counts):
        ap.error("-n: rank counts of 2 and more")
    cfg = {"rounds": a.rounds or (5 if a.quick else 7), "min_time": a.min_time or (0.005 if a.quick else 0.02),
           "max_iters": 100_000, "params": not (a.quick or a.no_params), "timeout": a.timeout}
    from .options import resolve
    path = a.output or resolve()["tuning_file"][0] or tuning.default_path()
    if str(path).lower() in tuning.OFF:
        ap.error("the tuning file is off (SHMCOLL_TUNING_FILE=none): give --output FILE")
    options = {"tuning_file": path if a.verify else "none"}
    got = measure(counts, ops, top, cfg, a.verify, options)
    print(table(got, a.verify))
    if a.verify:
        return 0
    choices = {op: {n: tuning.ranges(decide(got[n][op])) for n in counts} for op in ops}
    measured = {op: {str(n): got[n][op] for n in counts} for op in ops}
    settings = dict(cfg, ops=ops, counts=counts, max=top, tolerance=TOLERANCE)
    tuning.write(path, choices, measured, settings)
    print(f"wrote {path}")
    return 0
