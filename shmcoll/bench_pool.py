"""``shmcoll bench pool``: shmcoll.Pool against the pools Python users have.

Three measurements, each for every pool in the same run, in interleaved
rounds (the host drifts; only ratios measured side by side mean
anything):

- ``rtt``: the round trip of a trivial task, ``submit(f, 1).result()``
  (``apply_async(f, (1,)).get()`` for multiprocessing.Pool), microseconds;
- ``map100k``: ``map(f, range(100000))`` with each pool's own default
  chunks (multiprocessing.Pool's automatic chunksize, Executor.map's 1),
  seconds per call;
- ``array64m``: a task taking and returning a 64 MiB float64 array,
  milliseconds.

The anchors: concurrent.futures.ProcessPoolExecutor, multiprocessing.Pool
(fork), loky's reusable executor and mpi4py.futures' MPIPoolExecutor when
they import.  Each pool is made once per worker count and warmed up
before any timing.  Every result is checked against Python or numpy.
"""
import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time

import numpy as np

import shmcoll
from shmcoll.device import MAX_RANKS

MEASURES = ("rtt", "map100k", "array64m")
UNITS = {"rtt": "us per task", "map100k": "s per call", "array64m": "ms per task"}
SCALE = {"rtt": 1e6, "map100k": 1.0, "array64m": 1e3}
MAP_N = 100_000
ARRAY_BYTES = 64 << 20


def trivial(x):
    return x


def doubled(a):
    return a * 2


def _shmcoll(n):
    return shmcoll.Pool(n)


def _ppe(n):
    return cf.ProcessPoolExecutor(n, mp_context=mp.get_context("fork"))


def _mp(n):
    return mp.get_context("fork").Pool(n)


def _loky(n):
    import loky
    return loky.get_reusable_executor(max_workers=n, reuse=False)


def _mpi4py(n):
    from mpi4py.futures import MPIPoolExecutor
    return MPIPoolExecutor(n)


MAKERS = {"shmcoll": _shmcoll, "ppe": _ppe, "mp": _mp, "loky": _loky, "mpi4py": _mpi4py}
NAMES = {"shmcoll": "shmcoll.Pool", "ppe": "ProcessPoolExecutor", "mp": "multiprocessing.Pool",
         "loky": "loky", "mpi4py": "mpi4py.futures"}


def available(columns):
    """The columns whose library imports here, and a note for the others."""
    out, notes = [], []
    for c in columns:
        try:
            if c == "loky":
                import loky  # noqa: F401
            elif c == "mpi4py":
                import mpi4py.futures  # noqa: F401
            out.append(c)
        except ImportError as e:
            notes.append(f"{NAMES[c]} skipped: {e}")
    return out, notes


def call(pool, column, fn, arg):
    """One task's result, the way each library's users ask for it."""
    if column == "mp":
        return pool.apply_async(fn, (arg,)).get()
    return pool.submit(fn, arg).result()


def rtt(pool, column, reps):
    t = time.perf_counter()
    for _ in range(reps):
        if call(pool, column, trivial, 1) != 1:
            raise AssertionError(f"{column}: trivial task returned a wrong result")
    return (time.perf_counter() - t) / reps


def map100k(pool, column, n):
    t = time.perf_counter()
    out = pool.map(trivial, range(n)) if column in ("shmcoll", "mp") else list(pool.map(trivial, range(n)))
    dt = time.perf_counter() - t
    if out != list(range(n)):
        raise AssertionError(f"{column}: map returned wrong results")
    return dt * MAP_N / n           # per 100,000 tasks


def array64m(pool, column, a, want):
    t = time.perf_counter()
    out = call(pool, column, doubled, a)
    dt = time.perf_counter() - t
    if not np.array_equal(out, want):
        raise AssertionError(f"{column}: the 64 MiB array came back wrong")
    return dt


def measure(cfg, n, columns):
    """{measure: {column: [one time per round]}} for n workers."""
    a = np.random.default_rng(n).random(ARRAY_BYTES // 8)
    want = a * 2
    pools, times = {}, {m: {c: [] for c in columns} for m in cfg.measures}
    try:
        for c in columns:
            pools[c] = MAKERS[c](n)
            for _ in range(3):
                call(pools[c], c, trivial, 1)
            if "array64m" in cfg.measures:
                for _ in range(cfg.warm_arrays):
                    call(pools[c], c, doubled, a)
        for r in range(cfg.rounds):
            for m in cfg.measures:
                for c in columns:
                    if m == "rtt":
                        t = rtt(pools[c], c, cfg.reps)
                    elif m == "map100k":
                        t = map100k(pools[c], c, cfg.ppe_map if c in ("ppe", "loky", "mpi4py") else MAP_N)
                    else:
                        t = array64m(pools[c], c, a, want)
                    times[m][c].append(t)
                    _progress(f"n={n} round {r + 1}/{cfg.rounds} {m} {c}: {t * SCALE[m]:.4g} {UNITS[m]}")
    finally:
        for p in pools.values():
            if isinstance(p, cf.Executor):
                p.shutdown(wait=True)
            else:
                p.terminate()
                p.join()
    return times


def _progress(text):
    if sys.stderr.isatty():
        print(f"\r\033[K{text}", end="", file=sys.stderr, flush=True)


def table(m, results, columns):
    """One measurement's text table: per worker count the median of the
    rounds per pool, then shmcoll's time over each anchor's (the median of
    the per-round ratios, their range in brackets)."""
    anchors = [c for c in columns if c != "shmcoll"]
    head = ["n"] + [NAMES[c] for c in columns] + [f"shmcoll/{c}" for c in anchors]
    rows = []
    for n, times in results.items():
        t = times[m]
        row = [str(n)] + [f"{statistics.median(t[c]) * SCALE[m]:.4g}" for c in columns]
        for c in anchors:
            if "shmcoll" in t:
                ratios = sorted(s / x for s, x in zip(t["shmcoll"], t[c]))
                row.append(f"{statistics.median(ratios):.3f} [{ratios[0]:.3f}-{ratios[-1]:.3f}]")
        rows.append(row)
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    lines = [f"# {m} ({UNITS[m]}, median of {len(next(iter(next(iter(results.values()))[m].values())))} rounds; "
             "ratio < 1: shmcoll faster)"]
    lines += ["  ".join(x.rjust(w) for x, w in zip(r, widths)) for r in [head] + rows]
    return "\n".join(lines)


def parse(argv):
    p = argparse.ArgumentParser(prog="shmcoll bench pool", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--nprocs", default="2,4", help="comma-separated worker counts (default 2,4)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--measures", default=",".join(MEASURES), help=f"comma-separated, of {', '.join(MEASURES)}")
    p.add_argument("--columns", default="shmcoll,ppe,mp,loky,mpi4py", help="pools to time (default: all that import)")
    p.add_argument("--reps", type=int, default=2000, help="rtt: tasks per round (default 2000)")
    p.add_argument("--quick", action="store_true",
                   help="fewer tasks: rtt 300, the Executors' map of 10,000 items (scaled to 100,000), one array "
                        "warm-up")
    p.add_argument("--json", metavar="FILE", help="write every round's times here")
    a = p.parse_args(argv)
    a.nprocs = [int(x) for x in a.nprocs.split(",")]
    if not all(1 <= x <= MAX_RANKS for x in a.nprocs):
        p.error(f"worker counts must be between 1 and {MAX_RANKS}")
    a.measures = [m for m in a.measures.split(",") if m]
    if not a.measures or set(a.measures) - set(MEASURES):
        p.error(f"--measures: comma-separated, of {', '.join(MEASURES)}")
    a.columns = [c for c in a.columns.split(",") if c]
    if set(a.columns) - set(MAKERS):
        p.error(f"--columns: comma-separated, of {', '.join(MAKERS)}")
    if a.rounds < 1 or a.reps < 1:
        p.error("--rounds and --reps must be >= 1")
    a.reps = 300 if a.quick else a.reps
    # ProcessPoolExecutor.map's chunks of one take ~14 s for 100,000 tasks on 2 vCPUs
    a.ppe_map = 10_000 if a.quick else MAP_N
    a.warm_arrays = 1 if a.quick else 3
    return a


def main(argv):
    cfg = parse(argv)
    columns, notes = available(cfg.columns)
    for note in notes:
        print(f"# {note}")
    results = {}
    t0 = time.monotonic()
    for n in cfg.nprocs:
        results[n] = measure(cfg, n, columns)
    if sys.stderr.isatty():
        print("\r\033[K", end="", file=sys.stderr)
    print(f"# shmcoll bench pool: {platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} CPUs, "
          f"{cfg.rounds} rounds, {time.monotonic() - t0:.0f} s")
    for m in cfg.measures:
        print(table(m, results, columns))
    if cfg.json:
        doc = {"argv": argv, "columns": columns, "notes": notes, "units": {m: UNITS[m] for m in cfg.measures},
               "results": {str(n): {m: {c: v for c, v in t.items()} for m, t in r.items()} for n, r in
                           results.items()}, "map_items": {c: cfg.ppe_map if c in ("ppe", "loky", "mpi4py")
                                                          else MAP_N for c in columns}}
        with open(cfg.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0
