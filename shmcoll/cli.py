"""`shmcoll run | topo | bench | options | alcd | program`."""
import argparse
import sys


def _run(argv):
    ap = argparse.ArgumentParser(prog="shmcoll run", description="Run CMD on N pinned ranks (like mpiexec).")
    ap.add_argument("-n", "--np", type=int, required=True, dest="n")
    ap.add_argument("--bind", default="core", choices=["core", "socket", "numa", "none"])
    ap.add_argument("--map", default="compact", choices=["compact", "scatter"])
    ap.add_argument("--topology", default=None, help="virtual topology SxC[xN], e.g. 2x4")
    ap.add_argument("--timeout", type=float, default=None)
    ap.add_argument("--exec", action="store_true", dest="fresh",
                    help="start each Python rank as a fresh interpreter, as mpiexec does, instead of forking it "
                         "from this launcher (which has imported numpy and shmcoll): slower to start, for a "
                         "script that must act before numpy is imported (e.g. set OMP_NUM_THREADS)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- script.py | -m module | -c code | program")
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command given (shmcoll run -n 4 -- script.py)")
    from .launcher import _check_nprocs, _check_timeout, run
    try:
        _check_nprocs(a.n)
        _check_timeout(a.timeout)
    except (TypeError, ValueError) as e:
        ap.error(str(e))
    return run(a.n, cmd, bind=a.bind, map=a.map, topology=a.topology, timeout=a.timeout, fork=not a.fresh)


def _topo(argv):
    ap = argparse.ArgumentParser(prog="shmcoll topo", description="Print the node's (or a virtual) topology.")
    ap.add_argument("--topology", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from .topology import topology
    t = topology(a.topology)
    if a.json:
        import json
        print(json.dumps(t.to_dict(), indent=1))
    else:
        print(t.describe())
    return 0


def _options(argv):
    from . import options
    print(options.describe(options.resolve()))
    return 0


def _alcd(argv):
    ap = argparse.ArgumentParser(prog="shmcoll alcd", description="Communication distance of every allgather "
                                 "algorithm's schedule (paper 000), logical and, with a topology, physical.")
    ap.add_argument("-p", "--np", type=int, required=True, dest="p")
    ap.add_argument("--topology", default=None, help="where ranks sit: a virtual topology SxC[xN] or 'real'")
    ap.add_argument("--bytes", type=int, default=1, help="block size, for the byte shares")
    a = ap.parse_args(argv)
    if a.p < 1:
        ap.error("-p must be at least 1")
    from .distance import table
    from .topology import topology
    placement = topology() if a.topology == "real" else a.topology
    print(f"allgather on {a.p} ranks" + (f", placed on {a.topology}" if a.topology else "") +
          " (paper: Table 1 of paper 000; Bruck at p not a power of two: the paper's per-step count, as its "
          "closed form is wrong there)")
    print(table(a.p, placement, a.bytes))
    return 0


def _size(text):
    """Bytes from 1048576, 64K, 1M, 2G, 64KiB (powers of 1024)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        n = int(t[:-1] if scale > 1 else t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4096, 64K, 1M)") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"a size is not negative: {text!r}")
    return n


def _program(argv):
    ap = argparse.ArgumentParser(prog="shmcoll program", description="Print each rank's compiled program for a "
                                 "collective (planned and compiled here, no rank launched).")
    ap.add_argument("op", help="collective, e.g. bcast, allgather, alltoall")
    ap.add_argument("-n", "--np", type=int, required=True, dest="n")
    ap.add_argument("--bytes", type=_size, default=0, help="as shmcoll.schedule counts them (bcast: the buffer, "
                    "alltoall / allgather: one block); suffixes K, M, G")
    ap.add_argument("--rank", type=int, default=None, help="this rank's program only")
    ap.add_argument("--algorithm", default=None)
    ap.add_argument("--root", type=int, default=0)
    ap.add_argument("--topology", default=None, help="virtual topology SxC[xN], e.g. 1x4")
    ap.add_argument("--cma", action="store_true", help="plan as with single copy between ranks")
    ap.add_argument("--dtype", default=None, help="a reduction's numpy dtype (default float64)")
    a = ap.parse_args(argv)
    from .listing import program
    try:
        print(program(a.op, a.n, a.bytes, a.root, a.algorithm, rank=a.rank, topology=a.topology, cma=a.cma,
                      dtype=a.dtype), end="")
    except (TypeError, ValueError) as e:
        ap.error(str(e))
    return 0


def _bench(argv):
    from .bench import main
    return main(argv)


COMMANDS = {"run": _run, "topo": _topo, "bench": _bench, "options": _options, "alcd": _alcd, "program": _program}


HELP = {"run": "run a program on N pinned ranks, like mpiexec", "topo": "the node's sockets, cores, NUMA nodes, caches",
        "bench": "latency of every collective and algorithm, beside MPI", "options": "every tunable and its source",
        "alcd": "each Allgather algorithm's communication distance", "program": "each rank's compiled program"}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    usage = f"usage: shmcoll {{{','.join(COMMANDS)}}} ...  (shmcoll COMMAND --help for its options)"
    if argv[:1] in (["-h"], ["--help"]):
        print(usage + "\n\n" + "\n".join(f"  {c:8} {HELP[c]}" for c in COMMANDS))
        return 0
    if not argv or argv[0] not in COMMANDS:
        print(usage, file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
