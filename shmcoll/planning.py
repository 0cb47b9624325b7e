"""Schedules without a communicator: what a job of nranks ranks, placed as
the launcher places them, would run (select.resolve, as Comm.schedule)."""
from .coll import select
from .device import make_plan
from .sched import Call
from .topology import topology as _topology


def schedule(op, algorithm, nranks, nbytes, root=0, *, topology=None, options=None, cma=False, dtype=None):
    """The Schedule `algorithm` of collective `op` runs on nranks ranks for
    nbytes (bcast: the buffer; alltoall: one block; a reduction: of dtype),
    placed as the launcher would place them (topology: e.g. "2x4"),
    without running it; algorithm None: the one the automatic choice takes
    (twins: the single-copy program's)."""
    select.algorithms(op)
    topo = _topology(topology)
    plan = make_plan(nranks, topo, topo.placement(nranks, "core", "compact"), options)
    call = select.typed(op, Call(nranks, nbytes, root, plan.params, plan.slots, len(topo.nodes), cma), dtype)
    name, call, _ = select.resolve(op, call, algorithm, select.forced(op, plan.params))
    return select.plan(op, name, call)
