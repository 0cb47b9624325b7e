"""This machine's model parameters, measured in seconds (`shmcoll model
--measure`): ping-pongs through the collective engine for each level's
hand-off, a call's fixed cost and the cost per byte of bytes another rank
has just written; one process's own copies and folds; and 1..C processes
copying at once for the contention.  Every figure is the median of
several repetitions: the hosts are shared and drift."""
import multiprocessing as mp
import os
import statistics
import time

import numpy as np

from .. import launcher
from .._core import ffi, lib
from .._mpi_peer import measure as _timed_reps
from ..topology import read_sysfs
from .machine import LEVELS, Machine, _cpu_model, fingerprint

#: working sets (bytes a call touches) the curves are measured at, a
#: curve read at a call's.  Sixteen times apart: a call's working set is
#: a rough guide to which cache holds its bytes (ranks reuse each other's
#: lines, the prefetcher runs ahead), and points at the caches' edges
#: (256 KiB, 4 MiB here) made the predictions worse, not better (bench/README.md)
SIZES = (4096, 1 << 16, 1 << 20, 16 << 20)
CONTENDED = (1 << 16, 1 << 20, 16 << 20)
PINGPONGS = SIZES           # messages; their curve points are at 2n, the bytes a ping-pong touches
REPS = 7
WINDOW = 1 << 18            # bytes copied per timed window at least (small copies in a row)
#: sc_reduce's instruction word for float64 sums out of place (csrc/isa.h REDUCE's kop, type, form)
FOLD_WORD = lib.SC_R_SUM << 8 | lib.SC_T_F64 << 16 | lib.SC_F_SAME << 24


# -- hand-offs and fresh bytes through the engine ------------------------------

def _pingpong(comm, sizes, min_time):
    """{n: (per call from rank 0 alone, per call from either rank in
    turn)} of Bcast "original" of n bytes: from one root the root runs
    ahead and a call costs a reader's own work; in turn every call is one
    hand-off of n bytes the other rank has just written (a ping-pong)."""
    cell, out = np.zeros(1), {}

    def share(x):
        cell[0] = x
        comm.Bcast(cell, 0)
        return float(cell[0])
    for n in sizes:
        buf, turn = np.zeros(n, np.uint8), [0]

        def pingpong():
            turn[0] ^= 1
            comm.Bcast(buf, turn[0], "original")
        out[n] = [statistics.median(_timed_reps(f, comm.Barrier, share, min_time, 1 << 20, REPS))
                  for f in (lambda: comm.Bcast(buf, 0, "original"), pingpong)]
    return out


def pingpongs(topo, sizes, min_time=0.02):
    """{level: {n: (call, ping-pong)}} for the levels two launched ranks
    can be put at: one CPU (a one-core virtual topology: 8 bytes only, its
    switch), two cores of a socket (compact), two sockets (scatter);
    staged, no single copy, so a reader copies what the writer has just
    put in its ring.  The max over the two ranks, as shmcoll bench's."""
    ways = {"cpu": dict(topology="1x1")}
    if any(sum(c.socket == s for c in topo.cores) > 1 for s in range(topo.nsockets)):
        ways["socket"] = {}
    if topo.nsockets > 1:
        ways["machine"] = dict(map="scatter")
    out = {}
    for level, kw in ways.items():
        ranks = launcher.launch(_pingpong, 2, args=(sizes if level != "cpu" else sizes[:1], min_time), timeout=120,
                                options={"cma_bytes": 0}, **kw)
        out[level] = {n: tuple(max(t) for t in zip(*(r[n] for r in ranks))) for n in ranks[0]}
    return out


def _first_chunk(n):
    """The chunk a Bcast "original" of n bytes posts first (Call.pipe_chunk at the default chunk_bytes)."""
    return min(max(-(-n // 8) + 63 & ~63, 8192), 512 << 10, n)


def _fresh(pp, copy):
    """A level's curve of a reader's cost per byte of bytes another rank
    has just written, from its ping-pongs: what n bytes add to the
    8-byte hand-off, less the writer's first chunk (the reader copies
    the rest while the writer stages it), as model.predict costs a
    staged move; never below a copy of one's own bytes.  A ping-pong of
    n bytes touches 2n (the writer's buffer and the reader's), the
    working set the curve is read at."""
    return [[2 * n, max((pp[n][1] - pp[8][1] - _first_chunk(n) * own) / n, own)]
            for n, own in ((n, Machine.per_byte(copy, 2 * n)) for n in PINGPONGS)]


# -- one process's copies and folds, several at once ---------------------------

def _forked(cpus, body):
    """body(i, barrier) -> value in one process per CPU of cpus, pinned
    there; their values in order."""
    ctx = mp.get_context("fork")
    bar, queue = ctx.Barrier(len(cpus)), ctx.Queue()

    def main(i, cpu):
        os.sched_setaffinity(0, {cpu})
        queue.put((i, body(i, bar)))
    procs = [ctx.Process(target=main, args=(i, c)) for i, c in enumerate(cpus)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join()
    return [got[i] for i in range(len(cpus))]


def _per_byte(kernel, ws, nbufs):
    """Median seconds per byte of kernel(*bufs) on nbufs float64 buffers
    of ws/nbufs bytes each, so the bytes it touches are ws, the call's
    working set at which model.predict reads the curve; repeated to
    WINDOW bytes a timed window, less the cost of a call on 64 bytes (the
    Python around the kernel, which the engine does not pay)."""
    def window(m):
        k = max(WINDOW // m, 8)
        bufs = [np.zeros(m // 8) for _ in range(nbufs)]
        ptrs = [ffi.from_buffer(b) for b in bufs]
        times = []
        for rep in range(REPS):
            bufs[0].fill(rep + 1)
            t0 = time.perf_counter()
            for _ in range(k):
                kernel(m, *ptrs)
            times.append((time.perf_counter() - t0) / k)
        return statistics.median(times)
    m = max(ws // nbufs & ~63, 128)
    return max(window(m) - window(64), 0.0) / m


def _engine_copy(n, src, dst):
    lib.sc_copy(dst, src, n, 0)


def _engine_fold(n, a, b, d):
    lib.sc_reduce(FOLD_WORD, d, a, b, n // 8)


def _curve(kernel, nbufs, sizes):
    """[[size, seconds per byte], ...]; a size too small to see past a
    call's own cost takes the next size's figure (a bound)."""
    out = [[n, _per_byte(kernel, n, nbufs)] for n in sizes]
    for i in range(len(out) - 2, -1, -1):
        if out[i][1] <= 0:
            out[i][1] = out[i + 1][1]
    return out


def copy_curve(cpu, sizes=SIZES):
    """Seconds per byte of a rank copying bytes it has just written (into
    its ring, a local copy), per size: the engine's own copy."""
    return _forked([cpu], lambda i, bar: _curve(_engine_copy, 2, sizes))[0]


def fold_curve(cpu, sizes=SIZES):
    """Seconds per byte of folding two float64 inputs into a third (the
    engine's sum kernel, as a reduce folds its inputs), per size."""
    return _forked([cpu], lambda i, bar: _curve(_engine_fold, 3, sizes))[0]


def contention(cpus, sizes=CONTENDED):
    """[[n, [slowdown of 1, 2, ... len(cpus) processes each copying n bytes
    of its own at once]], ...]: the slowest one's time over the first's
    alone, each repetition timing both back to back (the host drifts
    between runs far more than within one), the median of the ratios."""
    out = []
    for n in sizes:
        loops = max(4 * WINDOW // n, 2)

        def body(i, bar):
            src, dst, times = np.ones(n, np.uint8), np.zeros(n, np.uint8), []
            ptrs = ffi.from_buffer(src), ffi.from_buffer(dst)

            def timed():
                t0 = time.perf_counter()
                for _ in range(loops):
                    _engine_copy(n, *ptrs)
                return time.perf_counter() - t0
            for _ in range(REPS):
                bar.wait()
                alone = timed() if i == 0 else None
                bar.wait()
                times.append((alone, timed()))
            return times
        row = [1.0]
        for c in range(2, len(cpus) + 1):
            each = _forked(cpus[:c], body)
            row.append(max(statistics.median(max(t for _, t in reps) / reps[0][0] for reps in zip(*each)), 1.0))
        out.append([n, row])
    return out


def machine(min_time=0.02):
    """This machine's Machine, measured now (a few seconds)."""
    topo = read_sysfs()
    cpus = [c.cpus[0] for c in topo.cores]
    copy = copy_curve(cpus[0])
    pp = pingpongs(topo, (8,) + PINGPONGS, min_time)
    two = pp.get("socket") or pp.get("machine")
    call = two[8][0] if two else pp["cpu"][8][0] / 2
    alpha = {level: max(pp[level][8][1] - call, 0.0) for level in ("socket", "machine") if level in pp}
    alpha["cpu"] = 0.0
    beta = {level: _fresh(pp[level], copy) for level in ("socket", "machine") if level in pp}
    beta["cpu"] = copy
    _fill(alpha, beta)
    return Machine(description={"name": f"{_cpu_model() or 'unknown CPU'}, {topo.nsockets} socket(s), "
                                        f"{topo.ncores} core(s)",
                                "cpus": topo.ncpus, "sockets": topo.nsockets,
                                "topology": f"{topo.nsockets}x{topo.ncores // topo.nsockets}",
                                "fingerprint": fingerprint(), "source": "measured by shmcoll model --measure",
                                "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
                                "pingpong_us": {level: {n: [round(x * 1e6, 3) for x in v] for n, v in t.items()}
                                                for level, t in pp.items()}},
                   call=call, switch=max(pp["cpu"][8][1] - call, 0.0), alpha=alpha, beta=beta, copy=copy,
                   fold=fold_curve(cpus[0]), contention=contention(cpus), cma=True)


def _fill(alpha, beta):
    """Levels this machine lacks take the nearest one it has (a core's
    threads the socket's: the launcher cannot place two ranks on one
    core's two threads), so parameters cover every level."""
    for table in (alpha, beta):
        for i, level in enumerate(LEVELS):
            if level not in table:
                near = sorted((lv for lv in table if lv != "cpu"), key=lambda lv: abs(LEVELS.index(lv) - i))
                table[level] = table[near[0] if near else "cpu"]
