"""The one selection table.  A row per collective: its id in signatures,
its module (ALGORITHMS: name -> planning function, choose(call) -> name,
footprint(call) -> bytes touched), its Comm method, that method's
argument roles for its C fast entry (empty: none, as for Gatherv/Scatterv,
whose counts only the root has; device.entry, csrc/pyfast.c: a leading k
when argument k's dtype is in the signature, x in-out buffer, i input (or
IN_PLACE), b input (or IN_PLACE: this rank's, the root's, block of the
output), o output (q: or IN_PLACE, the root's block of the input), I/O optional, v an output with counts, r root, p
reduction op, a algorithm) and its argument names (a reduction's include
op).  Adding a collective is a module, a row here and the Comm method;
its options row and SHMCOLL_<OP>_ALGORITHM follow from the row
(options.DEFAULTS), and tests/test_options.py checks the docs' table.

Precedence of the algorithm: algorithm= argument > options /
SHMCOLL_<OP>_ALGORITHM > the tuning file (shmcoll/tuning.py) > the model,
when its parameters are given (model_params) > the collective's choose(),
the built-in rules.  resolve() names the source and the reason
(Selected), so Comm.selected can say them."""
import dataclasses

from . import allgather, allgatherv, allreduce, alltoall, alltoallv, barrier, bcast, exscan, gather, reduce, reduce_scatter, scan, scatter

TABLE = {
    "barrier": (1, barrier, "Barrier", "a", ("algorithm",)),
    "bcast": (2, bcast, "Bcast", "xra", ("buf", "root", "algorithm")),
    "alltoall": (3, alltoall, "Alltoall", "ioa", ("sendbuf", "recvbuf", "algorithm")),
    "allgather": (4, allgather, "Allgather", "0boa", ("sendbuf", "recvbuf", "algorithm")),
    "allgatherv": (5, allgatherv, "Allgatherv", "1iva", ("sendbuf", "recvbuf", "algorithm")),
    "gather": (6, gather, "Gather", "0bOra", ("sendbuf", "recvbuf", "root", "algorithm")),
    "gatherv": (7, gather, "Gatherv", "", ("sendbuf", "recvbuf", "root", "algorithm")),
    "scatter": (8, scatter, "Scatter", "1Iqra", ("sendbuf", "recvbuf", "root", "algorithm")),
    "scatterv": (9, scatter, "Scatterv", "", ("sendbuf", "recvbuf", "root", "algorithm")),
    "allreduce": (10, allreduce, "Allreduce", "0iopa", ("sendbuf", "recvbuf", "op", "algorithm")),
    "reduce": (11, reduce, "Reduce", "0iOpra", ("sendbuf", "recvbuf", "op", "root", "algorithm")),
    "reduce_scatter_block": (12, reduce_scatter, "Reduce_scatter_block", "0iopa",
                             ("sendbuf", "recvbuf", "op", "algorithm")),
    "reduce_scatter": (13, reduce_scatter, "Reduce_scatter", "0iocpa",
                       ("sendbuf", "recvbuf", "recvcounts", "op", "algorithm")),
    "scan": (14, scan, "Scan", "0iopa", ("sendbuf", "recvbuf", "op", "algorithm")),
    "exscan": (15, exscan, "Exscan", "0iopa", ("sendbuf", "recvbuf", "op", "algorithm")),
    "alltoallv": (16, alltoallv, "Alltoallv", "", ("sendbuf", "recvbuf", "algorithm")),
    "alltoallw": (17, alltoallv, "Alltoallw", "", ("sendbuf", "recvbuf", "algorithm")),
}
NAMES = {op: list(row[1].ALGORITHMS) for op, row in TABLE.items()}
#: The automatic calls that are no schedule but point-to-point in one C call
#: (comm.py, csrc/p2p.c routed), as selected() and messages name them.
ROUTED = {"alltoallv": "sendrecv (point-to-point)", "alltoallw": "sendrecv (point-to-point)",
          "gatherv": "linear (point-to-point)", "scatterv": "linear (point-to-point)"}
IDS = {op: {name: i for i, name in enumerate(names)} for op, names in NAMES.items()}
OPS = {row[0]: op for op, row in TABLE.items()}
_BY_METHOD = {row[2]: op for op, row in TABLE.items()}


def method(op):
    """The Comm method of collective op (messages name it so)."""
    return TABLE[op][2]


def collective(name):
    """The collective of Comm method `name` (None: no collective's)."""
    return _BY_METHOD.get(name)


REDUCTIONS = {op for op, row in TABLE.items() if "op" in row[4]}      # the collectives that take an op


def typed(op, call, dtype):
    """call as a reduction of dtype plans it; other collectives move bytes
    and ignore dtype."""
    return call.typed(dtype) if op in REDUCTIONS else call


def dtyped(op):
    """Whether op's signature holds the datatype: a row whose roles start
    with an argument's index, and the rows without a fast entry (their
    Python path passes it)."""
    roles = TABLE[op][3]
    return not roles or roles[0].isdigit()


def algorithms(op):
    """Algorithm names of collective op."""
    try:
        return list(NAMES[op])
    except KeyError:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(TABLE)}") from None


def check_name(op, name):
    if not isinstance(name, str):
        raise TypeError(f"{op} algorithm must be a name (str) or None, not {type(name).__name__}")
    if name not in IDS[op]:
        raise ValueError(f"unknown {op} algorithm {name!r}; choose from {', '.join(IDS[op])}")
    return name


def forced(op, params):
    """The algorithm fixed by options/environment for op, validated, or None."""
    name = params.get(f"{op}_algorithm")
    return None if name in (None, "", "auto") else check_name(op, name)


class Selected(str):
    """An algorithm's name that also says where it came from: source
    (argument, option, tuning, model, rules), why (in words), params
    (the plan parameters a tuning file's range sets) and twins (the rules
    run it as twins: single copy or staged, as rank 0 times them)."""

    def __new__(cls, name, source, why, params=None, twins=False):
        self = super().__new__(cls, name)
        self.source, self.why, self.params, self.twins = source, why, dict(params or {}), twins
        return self

    def __reduce__(self):
        return Selected, (str(self), self.source, self.why, self.params, self.twins)


def choice(op, call, algorithm=None, forced_name=None):
    """The Selected of the argument, the option, the tuning file or the
    model, in that order; else (None, why): the rules choose, once
    resolve has set the call up for twins."""
    if algorithm is not None:
        return Selected(check_name(op, algorithm), "argument", "the call's algorithm= argument")
    if forced_name:
        return Selected(forced_name, "option", f"the {op}_algorithm option (options= or SHMCOLL_{op.upper()}_ALGORITHM)")
    p = call.params
    tuned, why = p["tuning"].lookup(op, call.nranks, call.nbytes) if p.get("tuning") else (None, "no tuning file")
    if tuned is not None and tuned["algorithm"] != "auto":
        return Selected(tuned["algorithm"], "tuning", why, _settable(p, tuned["params"]))
    if tuned is None and p.get("model") is not None:
        return _modelled(op, call, why)
    return None, why


def _settable(p, params):
    """A range's parameters less those the user set (options win over the file)."""
    mine = {"bcast_k": p.get("k_opt"), "tile_bytes": p.get("tile_opt")}
    out = {k: v for k, v in params.items() if mine.get(k) is None}
    if "tile_bytes" in out:                 # as make_plan bounds it: two tiles fit the ring
        out["tile_bytes"] = min(out["tile_bytes"], p["chan_bytes"] // 2)
    return out


def _modelled(op, call, why):
    """The model's fastest algorithm for call (planned with this call's
    parameters; one that cannot plan it is left out)."""
    from ..model.predict import Where, schedule_time
    times = {}
    for name in NAMES[op]:
        try:
            times[name] = schedule_time(plan(op, name, call), call.params, call.params["model"],
                                        Where(call.slots, True))
        except (ValueError, NotImplementedError):
            continue
    best = min(times, key=times.get)
    return Selected(best, "model", f"{why}; the model (model_params) predicts {best} fastest, "
                                   f"{times[best] * 1e6:.3g} us")


def pick(op, call, algorithm=None, forced_name=None):
    """The algorithm's name: given, forced, or chosen for this call."""
    if algorithm is not None:
        return check_name(op, algorithm)
    return forced_name or TABLE[op][1].choose(call)


def resolve(op, call, algorithm=None, forced_name=None):
    """The one path from a call to its algorithm: (name, the call it
    plans, staged), staged the (name, call) of its staged twin where the
    automatic choice runs it as twins (adapt: the single copy from the
    adapt bytes, whatever the default cma_bytes rule says; a cma_bytes the
    user set stays), else None."""
    algorithms(op)
    name = choice(op, call, algorithm, forced_name)
    if isinstance(name, Selected):
        if name.params:
            call = dataclasses.replace(call, params=dict(call.params, **name.params))
        return name, call, None
    why = name[1]
    p = call.params
    twin = call.cma and 0 < p["adapt"] <= call.nbytes
    if twin and p["cma_opt"] is None and p["cma_bytes"] > p["adapt"]:
        call = dataclasses.replace(call, params=dict(p, cma_bytes=p["adapt"]))
    staged = None
    if twin:
        alone = dataclasses.replace(call, cma=False)
        staged = pick(op, alone), alone
        why += "; the built-in rules, run as twins (single copy or staged, as rank 0 times them)"
    else:
        why += "; the built-in rules"
    return Selected(pick(op, call), "rules", why, twins=twin), call, staged


def plan(op, name, call):
    """The Schedule algorithm `name` of op runs for call."""
    from ..sched import Schedule
    module = TABLE[op][1]
    out = module.ALGORITHMS[name](call)
    steps, tmp = out if isinstance(out, tuple) else (out, 0)
    fp = module.footprint(call) if hasattr(module, "footprint") else 0
    stream = module.streams(call) if hasattr(module, "streams") else bool(fp) and call.streams(fp)
    return Schedule(op, name, call.nranks, call.nbytes, call.root, steps, tmp, stream,
                    bool(fp) and call.streams_folds(fp), kernel=call.kernel, apart=getattr(module, "APART", False))
