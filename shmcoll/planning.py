"""Schedules without a communicator: what a job of nranks ranks, placed as
the launcher places them, would run (select.resolve, as Comm.schedule)."""
import dataclasses

import numpy as np

from .coll import select
from .device import MAX_RANKS, make_plan
from .sched import Call
from .topology import topology as _topology


def schedule(op, algorithm, nranks, nbytes, root=0, *, topology=None, options=None, cma=False, dtype=None):
    """The Schedule `algorithm` of collective `op` runs on nranks ranks for
    nbytes (bcast: the buffer; alltoall: one block; a reduction: of dtype),
    placed as the launcher would place them (topology: e.g. "2x4"),
    without running it; algorithm None: the one the automatic choice takes
    (twins: the single-copy program's)."""
    return planned(op, algorithm, nranks, nbytes, root, topology=topology, options=options, cma=cma,
                   dtype=dtype)[0]


def placed(nranks, topology=None, own_cpus=False):
    """(Topology, slots) of nranks ranks as the launcher places them
    (topology: a spec or a Topology); own_cpus: a virtual topology's ranks
    each on a CPU of their own (slot.cpus = {its virtual core}), so that
    nothing depends on this machine's CPUs."""
    topo = topology if hasattr(topology, "placement") else _topology(topology)
    slots = topo.placement(nranks, "core", "compact")
    if own_cpus and topo.spec:
        slots = [dataclasses.replace(s, cpus=frozenset({s.core})) for s in slots]
    return topo, slots


def planned(op, algorithm, nranks, nbytes, root=0, *, topology=None, options=None, cma=False, dtype=None,
            own_cpus=False):
    """(schedule, plan parameters) as schedule() makes them.  topology: a
    spec or a Topology; own_cpus: a virtual topology's ranks each on a CPU
    of their own, so that nothing depends on this machine's CPUs."""
    select.algorithms(op)
    if isinstance(nranks, bool) or not isinstance(nranks, int) or not 1 <= nranks <= MAX_RANKS:
        raise ValueError(f"nprocs must be an int between 1 and {MAX_RANKS}, not {nranks!r}")
    if isinstance(root, bool) or not (isinstance(root, int) and 0 <= root < nranks):
        raise ValueError(f"root must be in 0 .. {nranks - 1}, not {root!r}")
    if isinstance(nbytes, bool) or not (isinstance(nbytes, (int, np.integer)) and nbytes >= 0):
        raise ValueError(f"nbytes must be a whole number of bytes, 0 or more, not {nbytes!r}")
    topo, slots = placed(nranks, topology, own_cpus)
    plan = make_plan(nranks, topo, slots, options)
    call = select.typed(op, Call(nranks, int(nbytes), root, plan.params, plan.slots, len(topo.nodes), cma), dtype)
    name, call, _ = select.resolve(op, call, algorithm, select.forced(op, plan.params))
    return select.plan(op, name, call), plan.params
