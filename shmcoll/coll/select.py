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
SHMCOLL_<OP>_ALGORITHM > the collective's choose()."""
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
    "reduce_scatter": (13, reduce_scatter, "Reduce_scatter", "",
                       ("sendbuf", "recvbuf", "recvcounts", "op", "algorithm")),
    "scan": (14, scan, "Scan", "0iopa", ("sendbuf", "recvbuf", "op", "algorithm")),
    "exscan": (15, exscan, "Exscan", "0iopa", ("sendbuf", "recvbuf", "op", "algorithm")),
    "alltoallv": (16, alltoallv, "Alltoallv", "", ("sendbuf", "recvbuf", "algorithm")),
    "alltoallw": (17, alltoallv, "Alltoallw", "", ("sendbuf", "recvbuf", "algorithm")),
}
NAMES = {op: list(row[1].ALGORITHMS) for op, row in TABLE.items()}
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
    p = call.params
    twin = algorithm is None and forced_name is None and call.cma and 0 < p["adapt"] <= call.nbytes
    if twin and p["cma_opt"] is None and p["cma_bytes"] > p["adapt"]:
        call = dataclasses.replace(call, params=dict(p, cma_bytes=p["adapt"]))
    staged = None
    if twin:
        alone = dataclasses.replace(call, cma=False)
        staged = pick(op, alone), alone
    return pick(op, call, algorithm, forced_name), call, staged


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
