"""`from shmcoll import MPI` in a job that spans nodes (or virtual nodes):
mpi4py's own MPI module, whose COMM_WORLD is the hierarchical
communicator.  Between nodes the program needs the MPI library anyway, so
it gets mpi4py's whole surface (datatypes, ops, requests, statuses: one
set of objects, nothing translated), and COMM_WORLD's blocking
collectives run as shmcoll legs within each node and MPI legs between
them; its other calls are MPI's on a duplicate of MPI's COMM_WORLD."""
import os
import types

from ..join import found
from .layout import virtual_nodes

# Hier's collectives, which the face's COMM_WORLD takes over from MPI's
COLLECTIVES = ("Barrier", "Bcast", "Reduce", "Allreduce", "Allgather", "Allgatherv", "Gather", "Gatherv", "Scatter",
               "Scatterv", "Alltoall", "Reduce_scatter_block", "Reduce_scatter")


def spans_nodes(env=os.environ):
    """Whether this process is a rank of another launcher's job whose ranks
    are on several nodes, as the launcher or SHMCOLL_VIRTUAL_NODES tells."""
    if env.get("SHMCOLL_PLAN_FD"):
        return False            # a rank of `shmcoll run`: one node
    f = found(env)
    if f is None:
        return False
    if env.get("SHMCOLL_VIRTUAL_NODES", "").strip():
        return len(virtual_nodes(f.size, env)) > 1
    return f.local_size < f.size


class _Module(types.ModuleType):
    """mpi4py.MPI with a COMM_WORLD of its own."""

    def __getattr__(self, name):
        return getattr(self._mpi, name)

    def __dir__(self):
        return sorted(set(dir(self._mpi)) | set(self.__dict__))


def module(name):
    """The module `shmcoll.MPI` becomes: made on every rank at import, as
    mpi4py initializes MPI at import (from_mpi is collective)."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError(f"shmcoll.MPI: this job's ranks are on several nodes, and between nodes shmcoll runs "
                          f"through the job's MPI library: install mpi4py built against it (pip install mpi4py; "
                          f"docs/multinode.md) ({e})") from None
    from . import from_mpi
    hier = from_mpi(MPI.COMM_WORLD)

    class Intracomm(MPI.Intracomm):
        """MPI's COMM_WORLD, its blocking collectives hierarchical (bound
        on the instance: what Dup or Split make of it, mpi4py makes of
        this class, and those are MPI's own)."""

    world = Intracomm(hier.mpi)
    world.hier = hier
    for call in COLLECTIVES:
        setattr(world, call, getattr(hier, call))
    m = _Module(name, __doc__)
    m._mpi, m.COMM_WORLD = MPI, world
    m.__all__ = [n for n in dir(MPI) if not n.startswith("_")]
    return m

