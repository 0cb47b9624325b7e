"""`shmcoll run | topo | bench | options | alcd | program | model | tune`."""
import argparse
import os
import shutil
import sys


# mpiexec's --map-by objects as shmcoll's maps: by core fills a socket first
# (compact), by socket or NUMA node deals ranks round-robin across them (scatter)
MAP_BY = {"core": "compact", "hwthread": "compact", "slot": "compact", "node": "compact", "socket": "scatter",
          "package": "scatter", "numa": "scatter"}
BIND_TO = {"core": "core", "hwthread": "core", "socket": "socket", "package": "socket", "numa": "numa",
           "none": "none"}
TAGS = {"tag": "[1,{rank}]<{stream}>: ", "rank": "[{rank}] "}    # Open MPI's --tag-output, MPICH's -prepend-rank


def _version():
    from . import __version__
    return f"shmcoll {__version__}"


def _parser(prog, description):
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--version", action="version", version=_version())
    return ap


def _run(argv):
    ap = _parser("shmcoll run", "Run CMD on N pinned ranks, like mpiexec (and with mpiexec's flags).")
    ap.add_argument("-n", "-np", "--np", type=int, required=True, dest="n", help="number of ranks")
    ap.add_argument("--bind", "--bind-to", "-bind-to", default="core", choices=list(BIND_TO), dest="bind",
                    help="pin each rank to its core (default), its socket or NUMA node, or not at all")
    ap.add_argument("--map", default=None, choices=["compact", "scatter"], help="compact: fill a socket first; "
                    "scatter: deal ranks round-robin across sockets")
    ap.add_argument("--map-by", "-map-by", default=None, choices=list(MAP_BY), dest="map_by",
                    help="mpiexec's: core (compact), socket or numa (scatter)")
    ap.add_argument("-x", action="append", default=[], metavar="VAR[=VALUE]",
                    help="export VAR from this environment (or set it to VALUE) to every rank (Open MPI's -x)")
    ap.add_argument("--env", "-env", action="append", default=[], metavar="VAR=VALUE",
                    help="set VAR to VALUE in every rank's environment")
    ap.add_argument("-genv", "--genv", nargs=2, action="append", default=[], metavar=("VAR", "VALUE"),
                    help="MPICH's: set VAR to VALUE in every rank's environment")
    ap.add_argument("--tag-output", "-tag-output", action="store_const", const="tag", dest="tag",
                    help="prefix each output line with its rank, as Open MPI's: [1,RANK]<stdout>: ")
    ap.add_argument("-l", "--prepend-rank", "-prepend-rank", action="store_const", const="rank", dest="tag",
                    help="prefix each output line with its rank, as MPICH's: [RANK] ")
    ap.add_argument("--oversubscribe", "-oversubscribe", action="store_true",
                    help="accepted, for mpiexec's command lines: more ranks than cores always run (cores are "
                         "shared round-robin)")
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
    if a.map and a.map_by and a.map != MAP_BY[a.map_by]:
        ap.error(f"--map {a.map} and --map-by {a.map_by} disagree")
    from .launcher import _check_nprocs, _check_timeout, run
    try:
        _check_nprocs(a.n)
        _check_timeout(a.timeout)
        env = _environment(a.x, a.env, a.genv)
    except (TypeError, ValueError) as e:
        ap.error(str(e))
    return run(a.n, cmd, bind=BIND_TO[a.bind], map=a.map or MAP_BY.get(a.map_by, "compact"), topology=a.topology,
               timeout=a.timeout, fork=not a.fresh, env=env, tag=TAGS.get(a.tag))


def _environment(exports, settings, pairs):
    """The variables -x, --env and -genv give every rank."""
    env = {}
    for var in exports:
        name, eq, value = var.partition("=")
        if not eq:
            if name not in os.environ:
                raise ValueError(f"-x {name}: {name} is not set in this environment")
            value = os.environ[name]
        env[name] = value
    for setting in settings:
        name, eq, value = setting.partition("=")
        if not eq or not name:
            raise ValueError(f"--env takes VAR=VALUE, not {setting!r}")
        env[name] = value
    env.update(dict(pairs))
    return env


def _topo(argv):
    ap = _parser("shmcoll topo", description="Print the node's (or a virtual) topology.")
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
    ap = _parser("shmcoll options", "Every tunable: its value, unit, built-in default, where the value came from "
                 "(argument, environment SHMCOLL_<NAME>, default) and its meaning; then the tuning file and model "
                 "the automatic choice reads.")
    ap.add_argument("--json", action="store_true", help="the same as JSON")
    a = ap.parse_args(argv)
    from . import options, tuning
    res = options.resolve()
    t = tuning.load(res["tuning_file"][0], virtual=bool(os.environ.get("SHMCOLL_TOPOLOGY")))
    model = tuning.model(res["model_params"][0])
    if a.json:
        import json
        print(json.dumps({"options": options.rows(res), "tuning_file": {"path": t.path, "status": t.describe()},
                          "model": {"params": res["model_params"][0], "asked": bool(model)}}, indent=1), flush=True)
        return 0
    width = shutil.get_terminal_size().columns - 1 if sys.stdout.isatty() else None
    print(options.describe(res, width), flush=True)
    print(f"tuning file in use: {t.path} ({t.describe()})")
    print("model: " + (f"{res['model_params'][0]} (asked where the tuning file has no range)" if model else
                       "not asked (model_params unset or unusable)"), flush=True)
    return 0


def _alcd(argv):
    ap = _parser("shmcoll alcd", description="Communication distance of every allgather "
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
    ap = _parser("shmcoll program", description="Print each rank's compiled program for a "
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


def _model(argv):
    ap = _parser("shmcoll model", description="Each algorithm's time predicted from its schedule (paper 002's "
                 "model) beside the time measured here, the error, and the sizes where the fastest changes.")
    ap.add_argument("-n", "--np", type=int, default=None, dest="n",
                    help="ranks (default: this machine's CPUs, or the cores of --params' machine)")
    ap.add_argument("--topology", default=None, help="virtual topology SxC[xN] the ranks are placed on")
    ap.add_argument("--op", action="append", choices=["alltoall", "bcast", "allgather", "allreduce"],
                    help="collective (repeatable; default all four)")
    ap.add_argument("--sizes", default="8,4K,64K,1M", help="comma-separated bytes, as shmcoll.schedule counts "
                    "them (default 8,4K,64K,1M)")
    ap.add_argument("--params", default=None, help="the machine's parameters: a JSON file (--measure writes it), "
                    "or 'example' for the built-in illustrative 2-socket 32-core machine; default: measured now")
    ap.add_argument("--measure", action="store_true", help="measure this machine's parameters (into --params "
                    "FILE when given) before predicting")
    ap.add_argument("--no-run", action="store_true", help="predictions only: launch no collective")
    ap.add_argument("--min-time", type=float, default=0.05, help="seconds per timed repetition (default 0.05)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--nodes", type=int, default=None, help="predict a hierarchical Alltoall over this many nodes "
                    "(no collective is run): the node legs on --params' machine, the network leg by paper 002's "
                    "(2)-(4) on --network, run directly by every rank and through a leader per node")
    ap.add_argument("--ppn", type=int, default=None, help="ranks per node with --nodes (default: as -n)")
    ap.add_argument("--network", default=None, help="with --nodes: 'alpha=1.5us,beta=12.5GB/s,hops=3,radix=48"
                    "[,packet=4K][,cycle=T][,rho=R|wait=T]' (docs/model.md, \"Across nodes\")")
    a = ap.parse_args(argv)
    from . import model
    from .model import network, report
    if a.nodes is None and (a.ppn or a.network):
        ap.error("--ppn and --network go with --nodes")
    if a.nodes is not None and (a.network is None or (a.op or ["alltoall"]) != ["alltoall"]):
        ap.error("--nodes needs --network, and predicts Alltoall only")
    if a.nodes is not None and (a.nodes < 1 or (a.ppn if a.ppn is not None else 1) < 1):
        ap.error("--nodes and --ppn count 1 or more")
    try:
        sizes = [_size(x) for x in a.sizes.split(",") if x.strip()]
        if a.measure or a.params is None:
            from .model.measure import machine
            mc = machine()
            if a.params:
                mc.save(a.params)
        else:
            mc = model.EXAMPLE if a.params == "example" else model.load(a.params)
        net = network.parse(a.network) if a.nodes is not None else None
    except (argparse.ArgumentTypeError, OSError, ValueError) as e:
        ap.error(str(e))
    if net:
        return _model_nodes(a, sizes, mc, net)
    here = mc.here()
    n = a.n or (len(os.sched_getaffinity(0)) if here else mc.description.get("cpus", 2))
    runs = here and not a.no_run
    out = []
    for op in a.op or report.OPS:
        rs = report.rows(op, n, sizes, mc, a.topology, runs, a.min_time, a.reps)
        out += rs
        if not a.json:
            print(report.text(rs, mc, a.topology) + "\n", flush=True)
    if a.json:
        import json
        print(json.dumps({"machine": mc.description, "rows": out}, indent=1))
    return 0


def _model_nodes(a, sizes, mc, net):
    """`shmcoll model --nodes`: pure prediction, both strategies per size."""
    from .model import network
    ppn = a.ppn or a.n or (len(os.sched_getaffinity(0)) if mc.here() else mc.description.get("cpus", 2))
    rs = [network.hierarchical_alltoall(a.nodes, ppn, n, mc, net, a.topology) for n in sizes]
    if a.json:
        import dataclasses
        import json
        print(json.dumps({"machine": mc.description, "network": dict(dataclasses.asdict(net), text=net.text()),
                          "rows": rs}, indent=1))
    else:
        print(network.text(rs, mc, net))
    return 0


def _bench(argv):
    if argv[:1] == ["--version"]:
        print(_version())
        return 0
    from .bench import main
    return main(argv)


def _tune(argv):
    from .tune import main
    return main(argv)


COMMANDS = {"run": _run, "topo": _topo, "bench": _bench, "options": _options, "alcd": _alcd, "program": _program,
            "model": _model, "tune": _tune}


HELP = {"run": "run a program on N pinned ranks, like mpiexec", "topo": "the node's sockets, cores, NUMA nodes, caches",
        "bench": "OSU/IMB-style latency (and bandwidth) of every collective and algorithm, beside MPI peers",
        "options": "every tunable: value, unit, default, source, meaning",
        "alcd": "each Allgather algorithm's communication distance", "program": "each rank's compiled program",
        "model": "each algorithm's predicted time (paper 002) against the measured one",
        "tune": "time every algorithm here and write the tuning file the automatic choice reads"}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    usage = f"usage: shmcoll {{{','.join(COMMANDS)}}} ...  (shmcoll COMMAND --help for its options)"
    if argv[:1] == ["--version"]:
        print(_version())
        return 0
    if argv[:1] in (["-h"], ["--help"]):
        print(usage + "\n\n" + "\n".join(f"  {c:8} {HELP[c]}" for c in COMMANDS)
              + "\n\nshmcoll --version: the version; shmcoll COMMAND --help: the command's options")
        return 0
    if not argv or argv[0] not in COMMANDS:
        print(usage, file=sys.stderr)
        return 2
    try:
        return COMMANDS[argv[0]](argv[1:]) or 0
    except BrokenPipeError:
        # the reader (`| head`) left: end quietly, and keep Python's flush at exit from saying so again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
