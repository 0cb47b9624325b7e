"""The one selection table: algorithm names per collective, their C ids,
and the automatic choice.  Precedence: algorithm= argument > options /
SHMCOLL_<OP>_ALGORITHM > the collective's choose()."""
from . import alltoall, barrier, bcast

MODULES = {"barrier": barrier, "bcast": bcast, "alltoall": alltoall}
IDS = {op: {name: i for i, name in enumerate(m.ALGORITHMS)} for op, m in MODULES.items()}


def algorithms(op):
    try:
        return list(MODULES[op].ALGORITHMS)
    except KeyError:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(MODULES)}") from None


def algorithm_id(op, name):
    try:
        return IDS[op][name]
    except KeyError:
        raise ValueError(f"unknown {op} algorithm {name!r}; choose from {', '.join(IDS[op])}") from None


def forced(op, params):
    """The algorithm fixed by options/environment for op, validated, or None."""
    name = params.get(f"{op}_algorithm")
    if name in (None, "", "auto"):
        return None
    algorithm_id(op, name)
    return name


OPS = ("barrier", "bcast", "alltoall")   # row order of the C table
NCLASS = 65


def size_class(nbytes):
    return int(nbytes).bit_length()


def fill_table(comm):
    """Decide once per communicator and size class (bit length of the byte
    count, judged at the class's largest size); C reads the table per call."""
    for row, op in enumerate(OPS):
        for k in range(NCLASS):
            name = comm._forced.get(op) or MODULES[op].choose(comm, (1 << k) - 1)
            comm._c.auto_alg[row * NCLASS + k] = IDS[op][name]


def selected(comm, op, nbytes):
    algorithms(op)
    return MODULES[op].ALGORITHMS[comm._c.auto_alg[OPS.index(op) * NCLASS + size_class(nbytes)]]
