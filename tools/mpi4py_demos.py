#!/usr/bin/env python3
"""Run mpi4py 4.1.2's demo programs (helloworld, osu_*) under shmcoll run and under the peers' mpiexec.

    python3 tools/mpi4py_demos.py [-n 2] [--peer /tmp/peer-mpich --peer /tmp/peer-ompi] [DEMO ...]

The demos come from the sdist that tools/mpi4py_tests.py fetches; on shmcoll
their `from mpi4py import MPI` is switched by the same stand-in package
(tools/mpi4py_shim).  Each run's output is compared with the first peer's:
the same number of lines and the same results once timings are taken out
(numbers with a decimal point, and the column widths that follow them;
helloworld's lines in any order).  The
timings are printed side by side, a column per MPI.  Exit status 1 when a
run fails or its results differ.
"""
import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mpi4py_tests as common  # noqa: E402

DEMOS = ["helloworld.py", "osu_allgather.py", "osu_alltoall.py", "osu_alltoallv.py", "osu_barrier.py",
         "osu_bcast.py", "osu_bibw.py", "osu_bw.py", "osu_gather.py", "osu_latency.py", "osu_multi_lat.py",
         "osu_scatter.py"]
TIMING = re.compile(r"\d+\.\d*(?:[eE][-+]?\d+)?")


def command(who, n, demo):
    """(argv, env) that runs demo on n ranks of who ('shmcoll' or a peer venv)."""
    env = dict(os.environ)
    if who == "shmcoll":
        env["PYTHONPATH"] = os.pathsep.join([str(common.SHIM), env.get("PYTHONPATH", "")])
        return [sys.executable, "-m", "shmcoll", "run", "-n", str(n), "--bind", "none", "--", str(demo)], env
    peer = Path(who)
    cmd = [str(peer / "bin" / "mpiexec"), "-n", str(n)]
    if (peer / "bin" / "ompi_info").exists():
        cmd.append("--oversubscribe")
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return cmd + [str(peer / "bin" / "python"), str(demo)], env


def results(text, demo):
    """The output without its timings: what must be the same under every MPI."""
    lines = [" ".join(TIMING.sub("<t>", line).split()) for line in text.splitlines()]
    return sorted(lines) if demo.startswith("helloworld") else lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("demos", nargs="*", help="demo files (default: helloworld and the eleven osu_*)")
    ap.add_argument("-n", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--peer", action="append", type=str, help="peer venv(s) (default /tmp/peer-mpich, /tmp/peer-ompi)")
    ap.add_argument("--cache", default="~/.cache/shmcoll")
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args(argv)
    peers = [p for p in (a.peer or ["/tmp/peer-mpich", "/tmp/peer-ompi"]) if (Path(p) / "bin" / "mpiexec").exists()]
    whos = list(peers)
    try:
        import shmcoll.MPI  # noqa: F401
        whos.append("shmcoll")
    except ImportError as e:
        print(f"mpi4py_demos: shmcoll.MPI cannot be imported ({e}): peers only")
    try:
        demodir = common.fetch(a.cache) / "demo"
    except (common.FetchError, OSError) as e:
        print(f"mpi4py_demos: SKIP: no sdist: {e}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="mpi4py_demos."))
    bad = 0
    for demo in a.demos or DEMOS:
        outs = {}
        for who in whos:
            cmd, env = command(who, a.n, demodir / demo)
            log = work / f"{demo}.{Path(who).name}.log"
            rc, secs = common.run_logged(cmd, log, a.timeout, env)
            outs[who] = (rc, log.read_text())
        ref = outs[whos[0]][1] if whos else ""
        verdicts = []
        for who, (rc, text) in outs.items():
            ok = rc == 0 and results(text, demo) == results(ref, demo)
            bad += not ok
            verdicts.append(f"{Path(who).name}: {'same' if ok else f'DIFFERENT (exit {rc})'}, "
                            f"{len(text.splitlines())} lines")
        print(f"== {demo} -n {a.n}: " + "; ".join(verdicts))
        cols = {who: text.splitlines() for who, (_, text) in outs.items()}
        print("   " + " | ".join(f"{Path(w).name:>34}" for w in cols))
        for i in range(max(map(len, cols.values()), default=0)):
            print("   " + " | ".join(f"{(c[i] if i < len(c) else '')[:34]:>34}" for c in cols.values()))
    print(f"logs in {work}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
