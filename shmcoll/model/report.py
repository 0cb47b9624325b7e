"""`shmcoll model`'s table: each algorithm's predicted time beside its
measured one (when these are this machine's parameters), the relative
error, and the sizes where the fastest algorithm changes, predicted and
measured."""
import math
import statistics

import numpy as np

from .. import MPI, _mpi_peer, launcher
from ..ops import SUM
from ..coll import select
from .predict import predict

OPS = ("alltoall", "bcast", "allgather", "allreduce")


def _rank(comm, op, algorithms, sizes, min_time, reps):
    """Every rank: per (algorithm, size) its per-call seconds of each
    repetition, as shmcoll bench times them (_mpi_peer.measure)."""
    _mpi_peer.SUM, _mpi_peer.MPI = SUM, MPI       # what shmcoll bench sets: the library measured
    cell = np.zeros(1)

    def share(x):               # rank 0's calibration decides the loop for all
        cell[0] = x
        comm.Bcast(cell, 0)
        return float(cell[0])
    out = {}
    for alg in algorithms:
        for n in sizes:
            run = _mpi_peer.OPS[op](comm, n, algorithm=alg).run
            out[alg, n] = _mpi_peer.measure(run, comm.Barrier, share, min_time, 1 << 20, reps)
    return out


def measured(op, nranks, sizes, algorithms, topology=None, min_time=0.02, reps=3):
    """{(algorithm, size): seconds per call}: max over ranks, median over
    repetitions, as shmcoll bench reports (one launch for them all)."""
    ranks = launcher.launch(_rank, nranks, args=(op, algorithms, sizes, min_time, reps), topology=topology,
                            timeout=600)
    return {key: statistics.median(max(ts) for ts in zip(*(r[key] for r in ranks))) for key in ranks[0]}


def rows(op, nranks, sizes, machine, topology=None, measure=False, min_time=0.02, reps=3):
    """[{op, nranks, algorithm, size, predicted, measured, error}] (seconds;
    measured and error None where not measured)."""
    algorithms = select.algorithms(op)
    got = measured(op, nranks, sizes, algorithms, topology, min_time, reps) if measure else {}
    out = []
    for alg in algorithms:
        for n in sizes:
            pred, meas = predict(op, alg, nranks, n, machine, topology=topology), got.get((alg, n))
            out.append({"op": op, "nranks": nranks, "algorithm": alg, "size": n, "predicted": pred,
                        "measured": meas, "error": (pred - meas) / meas if meas else None})
    return out


def within(row):
    """The acceptance: within 25% from 64 KiB, within 2x below."""
    if row["error"] is None:
        return None
    ratio = row["predicted"] / row["measured"]
    return abs(ratio - 1) <= 0.25 if row["size"] >= 1 << 16 else 0.5 <= ratio <= 2


TIE = 1.1      # a fastest algorithm within this factor of the next is a tie, not a winner


def crossovers(rs, key):
    """[(from, to, size)]: where the fastest algorithm by `key` changes,
    from one clear winner (faster than every other by TIE) to the next,
    at the size where the two cross, interpolated in log size and log
    time between the two sizes around it (sizes where no algorithm wins
    clearly are skipped: noise would move a crossover between ties)."""
    sizes = sorted({r["size"] for r in rs})
    t = {(r["algorithm"], r["size"]): r[key] for r in rs}
    algs = list(dict.fromkeys(r["algorithm"] for r in rs))
    if any(v is None for v in t.values()):
        return []
    wins = []
    for n in sizes:
        first, *rest = sorted(algs, key=lambda a: t[a, n])
        if not rest or t[rest[0], n] > TIE * t[first, n]:
            wins.append(first)
        else:
            wins.append(None)
    out, last = [], None
    for j, b in enumerate(wins):
        if b is None:
            continue
        if last is not None and wins[last] != b:
            a = wins[last]
            i = next(i for i in range(last, j) if t[a, sizes[i + 1]] >= t[b, sizes[i + 1]])
            lo, hi = (math.log(t[a, n] / t[b, n]) for n in sizes[i:i + 2])
            x0, x1 = (math.log(max(n, 1)) for n in sizes[i:i + 2])
            out.append((a, b, math.exp(x0 + lo / (lo - hi) * (x1 - x0)) if lo != hi else sizes[i + 1]))
        last = j
    return out


def crossovers_agree(pred, meas):
    """The acceptance: the same changes of the fastest algorithm, each
    predicted within 2x of the size measured."""
    return len(pred) == len(meas) and all((a, b) == (c, d) and 0.5 <= x / y <= 2
                                          for (a, b, x), (c, d, y) in zip(pred, meas))


def _size(n):
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def text(rs, machine, topology):
    """The table of one (op, nranks), and its crossovers."""
    op, p = rs[0]["op"], rs[0]["nranks"]
    lines = [f"# {op}, {p} ranks{f', topology {topology}' if topology else ''}: microseconds per call, "
             f"predicted on {machine.description.get('name')}"
             + ("" if rs[0]["measured"] is None else "; measured here (max over ranks, median of reps)")]
    lines.append(f"{'algorithm':<26}{'size':>6}{'predicted':>11}{'measured':>11}{'error':>8}")
    for r in rs:
        meas = "-" if r["measured"] is None else f"{r['measured'] * 1e6:.2f}"
        err = "-" if r["error"] is None else f"{r['error'] * 100:+.0f}%" + ("" if within(r) else " !")
        lines.append(f"{r['algorithm']:<26}{_size(r['size']):>6}{r['predicted'] * 1e6:>11.2f}{meas:>11}{err:>8}")
    pred = crossovers(rs, "predicted")
    lines.append("crossovers predicted: " + (", ".join(f"{a} -> {b} at {n:.0f} B" for a, b, n in pred) or "none"))
    if rs[0]["measured"] is not None:
        meas = crossovers(rs, "measured")
        lines.append("crossovers measured:  " + (", ".join(f"{a} -> {b} at {n:.0f} B" for a, b, n in meas) or "none"))
        lines.append("crossovers agree:     " + ("yes" if crossovers_agree(pred, meas) else "no !"))
    return "\n".join(lines)
