"""``shmcoll bench``: OSU/IMB-style latency tables of shmcoll against its peers.

For each operation and process count, every shmcoll algorithm plus the automatic
choice is timed next to the peers (MPICH and Open MPI through mpi4py, and
``multiprocessing.Barrier`` for barrier, torch.distributed's gloo for the
reductions and allgather, and allreduce's memory-bandwidth floor), all
with the method of
``shmcoll._mpi_peer.measure`` so the numbers are directly comparable: the
machines are noisy, so only ratios measured in the same run mean anything.
See bench/README.md.
"""
import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile

import numpy as np

import shmcoll
from shmcoll import MPI, _mpi_peer
from shmcoll._mpi_peer import OPS, calibrate, measure, parse_list, timed

#: 8 B .. 16 MiB in steps of 8x (whole buffer for bcast, per-rank block for the others).
DEFAULT_SIZES = [8 * 8 ** i for i in range(8)]
QUICK_SIZES = [8, 4096, 1 << 20]
PEER_DIRS = {"mpich": ("SHMCOLL_PEER_MPICH", "/tmp/peer-mpich"),
             "ompi": ("SHMCOLL_PEER_OMPI", "/tmp/peer-ompi"),
             "gloo": ("SHMCOLL_PEER_TORCH", "/tmp/peer-torch")}
#: What the gloo peer (torch.distributed) runs; the floor column: allreduce's memory-bandwidth floor.
GLOO_OPS = {"allreduce", "allreduce_f32", "reduce", "reduce_scatter", "allgather", "barrier"}
FLOOR_OPS = {"allreduce", "allreduce_f32"}
CPUS = sorted(os.sched_getaffinity(0))
#: Bench operations that measure a collective under another name (a dtype, a variant).
#: The collective whose algorithms an op's columns are (None: point-to-point, no algorithms).
COLLECTIVE = {"allreduce_f32": "allreduce", "reduce_scatter": "reduce_scatter_block", "bcast_spec": "bcast",
              "allreduce_spec": "allreduce", "allgatherv_spec": "allgatherv", "pingpong": None, "bw": None,
              "allreduce_init": None, "iallreduce": None, "iallreduce_overlap": None}
_mpi_peer.SUM = shmcoll.SUM
_mpi_peer.MPI = MPI


def human(nbytes):
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def sizes_for(op, sizes):
    """Barrier has no payload: one row, recorded as size 0."""
    return [0] if op == "barrier" else sizes


def sequence(op, cfg):
    """The (size, order) pairs one job measures, in the order it measures them.

    ``up`` runs the sizes ascending, ``down`` descending, ``both`` ascending
    then descending in the same job (the largest size twice in a row), so a
    size is seen both fresh and right after the large calls.  Barrier has one
    row whatever the order.
    """
    if op == "barrier":
        return [(0, "down" if cfg.order == "down" else "up")]
    up = sorted(set(cfg.sizes))
    seq = {"up": [(s, "up") for s in up], "down": [(s, "down") for s in reversed(up)]}
    return seq["up"] + seq["down"] if cfg.order == "both" else seq[cfg.order]


def record(op, n, size, impl, algorithm, per_rank_times=None, valid=None, error=None, selected=None,
           order="up"):
    """One JSON row; ``per_rank_times[rank][rep]`` -> max over ranks, median of reps (µs)."""
    reps = [max(ts) * 1e6 for ts in zip(*per_rank_times)] if per_rank_times else None
    return {"op": op, "nprocs": n, "size": size, "order": order, "impl": impl, "algorithm": algorithm,
            "selected": selected, "us": statistics.median(reps) if reps else None,
            "reps_us": reps, "valid": valid, "error": error}


# --- shmcoll -----------------------------------------------------------------

def _shmcoll_rank(comm, op, sizes, algorithm, cfg, floor):
    """Runs in every rank: validate, then time each size; returns (size, ok,
    times, selected, copy times or None)."""
    cell = np.zeros(1)

    def share(x):  # rank 0's calibration decides N for everyone
        cell[0] = x
        comm.Bcast(cell, root=0)
        return float(cell[0])

    out = []
    for size in sizes:
        run, check = OPS[op](comm, size, algorithm=algorithm)
        ok = check()
        copies = None
        if floor:
            src, dst = np.ones(max(size, 1), np.uint8), np.zeros(max(size, 1), np.uint8)
            times, copies = measure_beside(run, lambda: np.copyto(dst, src), comm.Barrier, share, cfg)
        else:
            times = measure(run, comm.Barrier, share, cfg.min_time, cfg.max_iters, cfg.reps)
        coll = COLLECTIVE.get(op, op)
        out.append((size, ok, times, comm.selected(coll, size) if coll and algorithm is None else None, copies))
    return out


def measure_beside(run, other, sync, share, cfg):
    """Per-call seconds of run and of other, their repetitions alternating,
    so that both see the host in the same state (it drifts 2-5x within
    minutes: a floor measured a minute apart says little).  Each repetition
    follows a quarter of its calls untimed, 16 at least (or as many as it
    has): after any break, here the other's repetition, a 2-vCPU Xeon guest
    ran 16 MiB folds 2.5x slower, back to speed only after 12-15 calls
    (numpy's add alone too; copies after 3), which the peers' repetitions,
    back to back, never pay."""
    n = calibrate(run, sync, share, cfg.min_time, cfg.max_iters)
    m = calibrate(other, sync, share, cfg.min_time, cfg.max_iters)

    def rep(f, k):
        for _ in range(max(k // 4, min(k, 16))):
            f()
        return timed(f, sync, k)
    pairs = [(rep(run, n), rep(other, m)) for _ in range(cfg.reps)]
    return [a for a, _ in pairs], [b for _, b in pairs]


def run_shmcoll(op, n, algorithm, cfg):
    """One launch per algorithm, so a failing algorithm costs only its own
    column.  The automatic choice's launch also measures allreduce's
    memory-bandwidth floor, beside it: every rank copies N bytes (read N,
    write N: the machine's bandwidth for n ranks placed as shmcoll places
    them), scaled to what a rank of a reduce-scatter + allgather must move
    at least: read its N of input and the (n - 1) / n * N others folded,
    write N, i.e. (3 - 1/n) / 2 copies."""
    seq = sequence(op, cfg)
    sizes = [s for s, _ in seq]
    bind = cfg.bind if cfg.bind != "auto" else "core"   # pinned even when oversubscribed: shmcoll's best
    name = algorithm or "auto"
    floor = algorithm is None and op in FLOOR_OPS and "floor" in cfg.peers
    try:
        ranks = shmcoll.launch(_shmcoll_rank, n, args=(op, sizes, algorithm, cfg, floor), bind=bind,
                               topology=cfg.topology, timeout=cfg.timeout)
    except Exception as e:  # a rank raised or hung: report it in the table, keep going
        return [record(op, n, s, impl, name if impl == "shmcoll" else None, error=f"{type(e).__name__}: {e}",
                       order=o) for impl in ("shmcoll", "floor")[:1 + floor] for s, o in seq]
    rows = [record(op, n, size, "shmcoll", name, [r[i][2] for r in ranks],
                   valid=all(r[i][1] for r in ranks), selected=selected, order=seq[i][1])
            for i, (size, _, _, selected, _) in enumerate(ranks[0])]
    scale = (3 - 1 / n) / 2
    return rows + [record(op, n, size, "floor", None, [[t * scale for t in r[i][4]] for r in ranks], valid=True,
                          order=seq[i][1]) for i, (size, *_) in enumerate(ranks[0]) if floor]


# --- ref: another installation of shmcoll ----------------------------------

def git_version(path):
    """``git describe --always --dirty`` of the checkout holding ``path``, or None."""
    try:
        p = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(path)), "describe", "--always",
                            "--dirty", "--abbrev=12"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


#: Prints the ref's shmcoll location, then its bench's --help (to see which flags it knows).
_REF_PROBE = ("import shmcoll, sys; print(shmcoll.__file__, flush=True); "
              "from shmcoll.bench import parse; parse(['--help'])")


class Ref:
    """The ``--ref`` column: ``shmcoll bench`` (auto only) of another shmcoll installation.

    ``spec`` is an interpreter (e.g. a virtualenv's ``bin/python`` holding the
    previous commit), a virtualenv directory, or a source checkout with its C
    core built in place (``python setup.py build_ext --inplace``), which this
    interpreter runs with ``PYTHONPATH`` set to it.  The subprocess runs from an
    empty directory and without this process' ``PYTHONPATH``, so it cannot
    import this tree's shmcoll by accident.
    """

    def __init__(self, spec):
        self.spec, self.tree = spec, None
        if os.path.isdir(os.path.join(spec, "shmcoll")):
            self.python, self.tree = sys.executable, os.path.abspath(spec)
        elif os.path.isdir(spec):
            self.python = os.path.join(spec, "bin", "python")
        else:
            self.python = spec
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if self.tree:
            self.env["PYTHONPATH"] = self.tree
        self.file = self.commit = self.error = None
        self.knows_order = False

    def run(self, cmd, cwd, timeout):
        return subprocess.run(cmd, cwd=cwd, env=self.env, timeout=timeout, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True)

    def probe(self):
        """Which shmcoll the ref imports and whether its bench knows --order; False (and a note) if broken."""
        with tempfile.TemporaryDirectory() as tmp:
            try:
                p = self.run([self.python, "-c", _REF_PROBE], tmp, 120)
                if p.returncode:
                    raise RuntimeError(f"exit {p.returncode}: " + " | ".join(p.stderr.strip().splitlines()[-3:]))
            except (OSError, subprocess.TimeoutExpired, RuntimeError) as e:
                self.error = f"{self.python} cannot run shmcoll bench: {e}"
                print(f"note: ref {self.error}", flush=True)
                return False
        self.file, _, help_text = p.stdout.partition("\n")
        self.knows_order = "--order" in help_text
        self.commit = git_version(self.file)
        print(f"ref: {self.python} -> {self.file} ({self.commit or 'not a git checkout'})", flush=True)
        if os.path.realpath(self.file) == os.path.realpath(shmcoll.__file__):
            print("note: the ref imports the very shmcoll being measured", flush=True)
        return True

    def describe(self):
        return {"spec": self.spec, "python": self.python, "pythonpath": self.tree, "shmcoll": self.file,
                "commit": self.commit, "error": self.error}

    def command(self, op, n, cfg, out):
        """Only flags the bench of main before --order knows; without --order, the sizes go in
        measured order (that bench keeps the order given), so the ref's one job runs our sequence."""
        sizes = cfg.sizes if self.knows_order else [s for s, _ in sequence(op, cfg)]
        return ([self.python, "-m", "shmcoll", "bench", op, "-n", str(n),
                 "--sizes", ",".join(map(str, sizes)), "--algorithms", "none", "--peers", "none",
                 "--bind", cfg.bind, "--min-time", str(cfg.min_time), "--reps", str(cfg.reps),
                 "--max-iters", str(cfg.max_iters), "--timeout", str(cfg.timeout), "--json", out]
                + (["--order", cfg.order] if self.knows_order else [])
                + (["--topology", cfg.topology] if cfg.topology else []))

    def measure(self, op, n, cfg):
        """Rows of impl ``shmcoll-ref`` (the ref's auto), in the order of ``sequence``."""
        seq = sequence(op, cfg)
        error = lambda text: [record(op, n, s, "shmcoll-ref", "auto", error=text, order=o) for s, o in seq]
        if self.error:
            return error(self.error)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "ref.json")
            try:
                p = self.run(self.command(op, n, cfg, out), tmp, cfg.timeout + 60)
                if not os.path.exists(out):   # exit 1 with a JSON only means some result was wrong
                    raise RuntimeError(f"exit {p.returncode}: " + " | ".join(p.stderr.strip().splitlines()[-3:]))
                with open(out) as f:
                    rows = [r for r in json.load(f)["results"] if r["algorithm"] == "auto"]
                if [r["size"] for r in rows] != [s for s, _ in seq]:
                    raise RuntimeError(f"ref measured sizes {[r['size'] for r in rows]}, "
                                       f"expected {[s for s, _ in seq]}")
            except (subprocess.TimeoutExpired, OSError, ValueError, KeyError, RuntimeError) as e:
                print(f"note: ref failed for {op} n={n}: {e}", flush=True)
                return error(str(e))
        return [dict(r, impl="shmcoll-ref", order=o) for r, (_, o) in zip(rows, seq)]


# --- peers -------------------------------------------------------------------

def _mp_share(rank, bar, cell, pin):
    """Pin a forked rank (when pin) and return share(x): rank 0's x on every
    rank, through a multiprocessing barrier and shared cell."""
    if pin:
        os.sched_setaffinity(0, {CPUS[rank]})

    def share(x):
        if rank == 0:
            cell.value = x
        bar.wait()
        x = cell.value
        bar.wait()
        return x

    return share


def _mp_rank(rank, n, bar, cell, queue, cfg, pin):
    share = _mp_share(rank, bar, cell, pin)
    queue.put((rank, measure(bar.wait, bar.wait, share, cfg.min_time, cfg.max_iters, cfg.reps)))


def run_mp(op, n, cfg):
    """multiprocessing.Barrier: what a plain-Python user would reach for."""
    ctx = mp.get_context("fork")
    bar, cell, queue = ctx.Barrier(n), ctx.Value("d", lock=False), ctx.Queue()
    pin = n <= len(CPUS) and cfg.bind != "none"
    procs = [ctx.Process(target=_mp_rank, args=(r, n, bar, cell, queue, cfg, pin)) for r in range(n)]
    for p in procs:
        p.start()
    times = dict(queue.get(timeout=cfg.timeout) for _ in procs)
    for p in procs:
        p.join()
    (size, order), = sequence(op, cfg)
    return [record(op, n, size, "mp", None, [times[r] for r in range(n)], valid=True, order=order)]


def peer_venv(name):
    env, default = PEER_DIRS[name]
    venv = os.environ.get(env, default)
    ok = all(os.access(os.path.join(venv, "bin", x), os.X_OK) for x in ("python",) + (("mpiexec",) * (name != "gloo")))
    return venv if ok else None


def mpi_command(name, venv, n, op, cfg, out):
    """The peer's own mpiexec, bound one rank per core, or unbound when oversubscribed.
    The sizes go in the order ``sequence`` measures them (the script keeps it)."""
    fits = n <= len(CPUS)
    if name == "mpich":
        bind = ["-bind-to", "core" if fits else "none"]
    else:
        bind = ["--bind-to", "core"] if fits else ["--map-by", ":OVERSUBSCRIBE", "--bind-to", "none"]
    # -I: keep the shmcoll/ directory (the script's) off the peer's sys.path.
    return [os.path.join(venv, "bin", "mpiexec"), "-n", str(n), *bind,
            os.path.join(venv, "bin", "python"), "-I", _mpi_peer.__file__,
            "--ops", op, "--sizes", ",".join(str(s) for s, _ in sequence(op, cfg)), "--reps", str(cfg.reps),
            "--min-time", str(cfg.min_time), "--max-iters", str(cfg.max_iters), "--json", out]


def run_mpi(name, op, n, cfg, libraries):
    venv = peer_venv(name)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "peer.json")
        try:
            p = subprocess.run(mpi_command(name, venv, n, op, cfg, out), env=env, timeout=cfg.timeout,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if p.returncode:
                raise RuntimeError(f"exit {p.returncode}: " + " | ".join(p.stderr.strip().splitlines()[-3:]))
            with open(out) as f:
                doc = json.load(f)
        except (subprocess.TimeoutExpired, OSError, ValueError, RuntimeError) as e:
            print(f"note: peer {name} failed for {op} n={n}: {e}", flush=True)
            return [record(op, n, s, name, None, error=str(e), order=o) for s, o in sequence(op, cfg)]
    libraries[name] = doc["library"]
    return [dict(record(op, n, r["size"], name, None, valid=r["valid"], order=o), us=r["us"], reps_us=r["reps_us"])
            for r, (_, o) in zip(doc["results"], sequence(op, cfg))]


def run_gloo(op, n, cfg, libraries):
    """torch.distributed's gloo backend: n processes of the peer venv's
    python, one per core (unpinned when oversubscribed), rendezvous on a
    free local port."""
    import socket
    venv = peer_venv("gloo")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sizes = ",".join(str(s) for s, _ in sequence(op, cfg))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "peer.json")
        cmd = [os.path.join(venv, "bin", "python"), "-I", _mpi_peer.__file__, "--gloo", "--ops", op, "--sizes", sizes,
               "--reps", str(cfg.reps), "--min-time", str(cfg.min_time), "--max-iters", str(cfg.max_iters)]
        procs = []
        try:
            for r in range(n):
                env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                pin = (lambda c=CPUS[r]: os.sched_setaffinity(0, {c})) if n <= len(CPUS) else None
                procs.append(subprocess.Popen(cmd + (["--json", out] if r == 0 else []), env=env, preexec_fn=pin,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            errs = [p.communicate(timeout=cfg.timeout)[1] for p in procs]
            if any(p.returncode for p in procs):
                raise RuntimeError(" | ".join(e.strip().splitlines()[-1] for e in errs if e.strip())[:300])
            with open(out) as f:
                doc = json.load(f)
        except (subprocess.TimeoutExpired, OSError, ValueError, RuntimeError) as e:
            for p in procs:
                p.kill()
            print(f"note: peer gloo failed for {op} n={n}: {e}", flush=True)
            return [record(op, n, s, "gloo", None, error=str(e), order=o) for s, o in sequence(op, cfg)]
    libraries["gloo"] = doc["library"]
    got = {r["size"]: r for r in doc["results"]}
    return [dict(record(op, n, s, "gloo", None, valid=got[s]["valid"], order=o), us=got[s]["us"],
                 reps_us=got[s]["reps_us"]) if s in got else
            record(op, n, s, "gloo", None, error="not supported by gloo", order=o) for s, o in sequence(op, cfg)]


# --- output ------------------------------------------------------------------

def column(row):
    return {"shmcoll": row["algorithm"], "shmcoll-ref": "ref"}.get(row["impl"], row["impl"])


def cell(row):
    if row["error"]:
        return "ERROR"
    if not row["valid"]:
        return "INVALID"
    text = f"{row['us']:.2f}"
    return f"{text} ({row['selected']})" if row["selected"] else text


def key(row):
    """A table row: (size, order), in the order they were measured."""
    return row["size"], row.get("order", "up")


def ratio(rows, row_key, peers):
    """auto / the fastest of the columns ``peers`` in this table row, or None."""
    by = {(key(r), column(r)): r for r in rows}
    ok = lambda r: r is not None and r["valid"] and not r["error"]
    auto = by.get((row_key, "auto"))
    peer_us = [by[row_key, p]["us"] for p in peers if ok(by.get((row_key, p)))]
    return auto["us"] / min(peer_us) if peer_us and ok(auto) else None


def ratio_text(rounds, row_key, peers):
    """Median of the per-round ratios, with their range when there are several rounds."""
    each = [x for x in (ratio(rs, row_key, peers) for rs in rounds) if x is not None]
    text = f"{statistics.median(each):.2f}" if each else "-"
    return text + (f" [{min(each):.2f}-{max(each):.2f}]" if len(each) > 1 else "")


def merge(rounds):
    """One row per (size, order, column): the median over rounds (errors kept)."""
    out = []
    for first in rounds[0]:
        same = [r for rows in rounds for r in rows if key(r) == key(first) and column(r) == column(first)]
        good = [r["us"] for r in same if r["us"] is not None]
        out.append(dict(first, us=statistics.median(good) if good else None,
                        valid=all(r["valid"] for r in same), error=next((r["error"] for r in same if r["error"]), None)))
    return out


def table(op, n, rounds, peers):
    """Rows = (size, order), columns = algorithms, auto, ref, peers, auto / ref
    and auto / best peer (with several rounds: medians, and the median of each
    round's ratio, so the host drifting between columns of one round cannot
    fake a ratio)."""
    rows = merge(rounds)
    cols = list(dict.fromkeys(column(r) for r in rows))
    by = {(key(r), column(r)): r for r in rows}
    extra = [c for c in ("ref", "floor") if c in cols]
    header = ["size", "order"] + cols + [f"auto/{c}" for c in extra] + ["auto/best-peer"]
    lines = []
    for k in dict.fromkeys(key(r) for r in rows):    # as measured: up, then down
        lines.append(["-" if op == "barrier" else human(k[0]), k[1]]
                     + [cell(by[k, c]) if (k, c) in by else "-" for c in cols]
                     + [ratio_text(rounds, k, [c]) for c in extra] + [ratio_text(rounds, k, peers)])
    widths = [max(len(x) for x in col) for col in zip(header, *lines)]
    fmt = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))
    rounds_note = f", median of {len(rounds)} rounds" if len(rounds) > 1 else ""
    print(f"\n# {op}, {n} processes (microseconds per call, max over ranks, median of reps{rounds_note})")
    print(fmt(header))
    for line in lines:
        print(fmt(line))
    sys.stdout.flush()


def machine_info():
    """Topology from shmcoll when it works, else `lscpu` key/values."""
    try:
        from shmcoll.topology import topology
        return topology().to_dict()
    except Exception as e:
        info = {"topology_error": f"{type(e).__name__}: {e}", "platform": platform.platform(),
                "cpus": CPUS}
        try:
            text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
            info["lscpu"] = dict(l.split(":", 1) for l in text.splitlines() if ":" in l)
            info["lscpu"] = {k.strip(): v.strip() for k, v in info["lscpu"].items()}
        except OSError:
            pass
        return info


def plot(doc, path):
    """Latency vs size per algorithm/peer (log-log), one panel per (op, n); barrier vs n."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: --plot needs matplotlib (pip install matplotlib); no plot written")
        return
    good = [r for r in doc["results"] if r["us"] is not None and r["valid"] and not r["error"]]
    points = {}
    for r in good:      # one point per cell: the median over rounds
        points.setdefault((r["op"], r["nprocs"], key(r), column(r)), []).append(r)
    rows = [dict(rs[0], us=statistics.median(r["us"] for r in rs)) for rs in points.values()]
    if len({r.get("order", "up") for r in rows if r["op"] != "barrier"}) > 1:   # one line per order
        rows = [dict(r, label=f"{column(r)} ({r.get('order', 'up')})") for r in rows]
    panels = sorted({(r["op"], r["nprocs"] if r["op"] != "barrier" else 0) for r in rows})
    if not panels:
        return
    ncol = min(3, len(panels))
    fig, axes = plt.subplots(math.ceil(len(panels) / ncol), ncol, squeeze=False,
                             figsize=(5 * ncol, 4 * math.ceil(len(panels) / ncol)))
    label = lambda r: r.get("label") or column(r)
    colors = {c: f"C{i % 10}" for i, c in enumerate(dict.fromkeys(label(r) for r in rows))}
    for ax, (op, n) in zip(axes.flat, panels):
        mine = [r for r in rows if r["op"] == op and (op == "barrier" or r["nprocs"] == n)]
        for col in dict.fromkeys(label(r) for r in mine):
            pts = sorted((r["nprocs"] if op == "barrier" else r["size"], r["us"])
                         for r in mine if label(r) == col)
            ax.plot(*zip(*pts), marker="o", label=col, color=colors[col])
        ax.set(xscale="log", yscale="log", ylabel="µs", title=op if op == "barrier" else f"{op}, n={n}",
               xlabel="processes" if op == "barrier" else "bytes")
        if op == "barrier":
            ns = sorted({r["nprocs"] for r in mine})
            ax.set_xticks(ns, [str(x) for x in ns], minor=False)
            ax.set_xticks([], minor=True)
        ax.legend(fontsize="small")
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot written to {path}")


# --- main --------------------------------------------------------------------

def parse(argv):
    p = argparse.ArgumentParser(prog="shmcoll bench", description=__doc__.splitlines()[0])
    p.add_argument("ops", nargs="+", choices=sorted(OPS))
    p.add_argument("-n", "--nprocs", default="2", help="comma-separated process counts (default 2)")
    p.add_argument("--sizes", help="comma-separated bytes, K/M/G for KiB/MiB/GiB (default 8 B..16 MiB in steps of 8x)")
    p.add_argument("--order", default="up", choices=["up", "down", "both"],
                   help="sizes ascending, descending, or ascending then descending in the same job "
                        "(shows what large calls leave behind for the sizes after them)")
    p.add_argument("--algorithms", default="all", help="'all' or comma-separated names (auto always runs)")
    p.add_argument("--topology", help="topology spec passed to shmcoll.launch")
    p.add_argument("--bind", default="auto", choices=["auto", "core", "socket", "numa", "none"],
                   help="shmcoll binding; auto = core (MPI peers: core, or none when oversubscribed, as their launchers need)")
    p.add_argument("--peers", default="auto",
                   help="auto (all found) | none | comma list of mpich,ompi,mp,gloo,floor (floor: allreduce's "
                        "memory-bandwidth floor, measured in the run)")
    p.add_argument("--ref", metavar="PYTHON|DIR",
                   help="add a column 'ref': the automatic choice of another shmcoll installation (e.g. the "
                        "previous commit), measured by the same method in each round, and auto/ref; PYTHON "
                        "is an interpreter that imports it, DIR a virtualenv or a source checkout built in place")
    p.add_argument("--json", help="write every number and the machine description here")
    p.add_argument("--plot", help="write a log-log latency plot here (needs matplotlib)")
    p.add_argument("--quick", action="store_true", help="3 sizes, 0.02 s per repetition")
    p.add_argument("--min-time", type=float, help="seconds per repetition (default 0.2, quick 0.02)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat each table's columns this many times, back to back, and report medians and "
                        "the median of each round's ratio (for hosts whose speed drifts)")
    p.add_argument("--max-iters", type=int, default=1_000_000)
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed per launch")
    a = p.parse_args(argv)
    try:
        a.nprocs = parse_list(a.nprocs, int)
        a.sizes = parse_list(a.sizes, nbytes) if a.sizes else QUICK_SIZES if a.quick else DEFAULT_SIZES
    except ValueError as e:
        p.error(str(e))
    a.min_time = a.min_time or (0.02 if a.quick else 0.2)
    a.peers = {"auto": ["mpich", "ompi", "mp", "gloo", "floor"], "none": []}.get(a.peers) or parse_list(a.peers)
    return a


def nbytes(text):
    """'4096', '4K', '2M', '1G' (binary multiples) -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, re.I)
    if not m:
        raise ValueError(f"--sizes: {text!r} is not a byte count (like 4096, 4K or 2M)")
    return int(m[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[m[2].upper()]


def main(argv=None):
    """Returns 1 if any shmcoll result failed validation or raised, else 0."""
    cfg = parse(argv)
    mpi_peers, gloo = [], False
    for name in (p for p in cfg.peers if p in PEER_DIRS):
        if peer_venv(name):
            gloo = gloo or name == "gloo"
            mpi_peers += [name] if name != "gloo" else []
        else:
            print(f"note: peer {name} not found at {os.environ.get(*PEER_DIRS[name])} "
                  f"(set {PEER_DIRS[name][0]} to a venv with {'torch' if name == 'gloo' else name + ' and mpi4py'}); "
                  f"skipped")
    ref = Ref(cfg.ref) if cfg.ref else None
    if ref:
        ref.probe()
    results, libraries = [], {}
    for op in cfg.ops:
        coll = COLLECTIVE.get(op, op)
        algs = shmcoll.algorithms(coll) if coll else []
        if cfg.algorithms != "all":
            algs = [a for a in algs if a in parse_list(cfg.algorithms)]
        for n in cfg.nprocs:
            peers = mpi_peers + (["mp"] if op == "barrier" and "mp" in cfg.peers else []) \
                + (["gloo"] if gloo and op in GLOO_OPS else [])
            rounds = []
            for k in range(cfg.rounds):
                rows = []
                for alg in algs + [None]:
                    rows += run_shmcoll(op, n, alg, cfg)
                if ref:
                    rows += ref.measure(op, n, cfg)
                for name in mpi_peers:
                    rows += run_mpi(name, op, n, cfg, libraries)
                if "mp" in peers:
                    rows += run_mp(op, n, cfg)
                if "gloo" in peers:
                    rows += run_gloo(op, n, cfg, libraries)
                rows.sort(key=lambda r: r["impl"] == "floor")     # measured with auto, shown last
                rounds.append([dict(r, round=k) for r in rows])
            table(op, n, rounds, peers)
            results += [r for rows in rounds for r in rows]
    bad = [r for r in results if r["impl"] == "shmcoll" and (r["error"] or not r["valid"])]
    for r in bad:
        print(f"FAILED: shmcoll {r['op']} n={r['nprocs']} size={r['size']} algorithm={r['algorithm']}: "
              f"{r['error'] or 'result differs from numpy'}")
    doc = {"machine": machine_info(), "peers": libraries,
           "shmcoll": {"file": shmcoll.__file__, "commit": git_version(shmcoll.__file__)},
           "ref": ref.describe() if ref else None,
           "config": {k: getattr(cfg, k) for k in ("ops", "nprocs", "sizes", "algorithms", "topology",
                                                   "bind", "peers", "order", "ref", "min_time", "reps", "rounds",
                                                   "max_iters")},
           "results": results}
    if cfg.json:
        with open(cfg.json, "w") as f:
            json.dump(doc, f, indent=1)
    if cfg.plot:
        plot(doc, cfg.plot)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
