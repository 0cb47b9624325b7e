"""shmcoll: topology-aware shared-memory collectives for Python processes
on one node.  See README.md and ARCHITECTURE.md."""
from .buffers import IN_PLACE
from .coll.select import algorithms
from .comm import Comm
from .distance import alcd
from .errors import (CMAError, MismatchError, PeerAborted, PeerDied, PeerFailure, PeerTimeout, SegmentError,
                     ShmcollError)
from .launcher import init, launch, run
from .listing import program
from .ops import BAND, BOR, BXOR, LAND, LOR, LXOR, MAX, MAXLOC, MIN, MINLOC, PROD, SUM, Op
from .topology import topology


def schedule(op, algorithm, nranks, nbytes, root=0, *, topology=None, options=None, cma=False, dtype=None):
    """The Schedule `algorithm` of collective `op` runs on nranks ranks for
    nbytes (bcast: the buffer; alltoall: one block; a reduction: of dtype),
    placed as the launcher would place them (topology: e.g. "2x4"),
    without running it; algorithm None: the one the automatic choice takes."""
    from .topology import topology as _topology
    from .coll import select
    from .device import make_plan
    from .sched import Call
    select.algorithms(op)
    topo = _topology(topology)
    plan = make_plan(nranks, topo, topo.placement(nranks, "core", "compact"), options)
    call = select.typed(op, Call(nranks, nbytes, root, plan.params, plan.slots, len(topo.nodes), cma), dtype)
    return select.plan(op, select.pick(op, call, algorithm, select.forced(op, plan.params)), call)


__all__ = ["BAND", "BOR", "BXOR", "CMAError", "Comm", "IN_PLACE", "LAND", "LOR", "LXOR", "MAX", "MAXLOC", "MIN",
           "MINLOC", "MismatchError", "Op", "PROD", "PeerAborted", "PeerDied", "PeerFailure", "PeerTimeout", "SUM",
           "SegmentError", "ShmcollError", "alcd", "algorithms", "init", "launch", "program", "run", "schedule", "topology"]
__version__ = "0.2.0"
