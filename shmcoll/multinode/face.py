"""`from shmcoll import MPI` in a job that spans nodes (or virtual nodes):
mpi4py's own MPI module, whose COMM_WORLD is the hierarchical
communicator.  Between nodes the program needs the MPI library anyway, so
it gets mpi4py's whole surface (datatypes, ops, requests, statuses: one
set of objects, nothing translated), and COMM_WORLD's blocking
collectives run as shmcoll legs within each node and MPI legs between
them, as do those of the communicators made from it; their other calls
are MPI's."""
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
    from . import Hier, from_mpi, p2p

    class Intracomm(p2p.Routed, MPI.Intracomm):
        """An MPI communicator whose blocking collectives are its
        hierarchical communicator's (bound on the instance), as are the
        communicators made from it.  One made otherwise (Idup's, which
        mpi4py makes of this class) is MPI's own, and so are those made
        from it."""

        def _made(self, call, *args):
            """MPI's call on this communicator's own handle (COMM_WORLD's
            attributes copied to a Dup, say), hierarchical over it."""
            made = getattr(MPI.Intracomm, call)(self, *args)
            hier = self.__dict__.get("hier")
            return made if hier is None else face(hier._derived(made))

        def Dup(self, info=None):
            return self._made("Dup", info)

        def Dup_with_info(self, info):
            return self._made("Dup_with_info", info)

        def Clone(self):
            return self._made("Clone")

        def Split(self, color=0, key=0):
            return self._made("Split", color, key)

        def Split_type(self, split_type, key=0, info=MPI.INFO_NULL):
            return self._made("Split_type", split_type, key, info)

        def Create(self, group):
            return self._made("Create", group)

        def Create_group(self, group, tag=0):
            return self._made("Create_group", group, tag)

        def Free(self):
            """MPI's Free (COMM_WORLD's refused, as MPI refuses it), then the
            hierarchical communicator's, and the collectives are MPI's
            again: on COMM_NULL they raise MPI's error."""
            self._release(MPI.Intracomm.Free)

        def Disconnect(self):
            self._release(MPI.Intracomm.Disconnect)

        def Get_attr(self, keyval):
            """MPI's, but TAG_UB no larger than a node-mate's message may
            carry (Open MPI's 2^31 - 1 is past shmcoll's 2^29 - 1)."""
            value = MPI.Intracomm.Get_attr(self, keyval)
            if keyval == MPI.TAG_UB and value is not None and "route" in self.__dict__:
                return min(value, p2p.shm_p2p.TAG_UB)
            return value

        def __reduce__(self):
            """COMM_WORLD pickles as this module's (mpi4py pickles only the predefined communicators)."""
            return "COMM_WORLD" if self == MPI.COMM_WORLD else MPI.Intracomm.__reduce__(self)

        def _release(self, free):
            hier = self.__dict__.get("hier")
            if hier is None or hier.freed or self == MPI.COMM_WORLD:
                return free(self)
            self.__dict__["route"].close()
            hier.Free(keep=True)        # the handle this object shares is freed next, through it
            free(self)
            for call in COLLECTIVES + p2p.C_ENTRIES + ("route",):
                self.__dict__.pop(call, None)

    Intracomm.__module__ = name

    def face(hier, handle=None):
        """hier's face: an Intracomm of its MPI communicator's handle (or
        handle's, COMM_WORLD's own: its name, ==, pickling and refusals
        are MPI's), its collectives hier's."""
        if not isinstance(hier, Hier):
            return hier                 # COMM_NULL
        comm = Intracomm(hier.mpi if handle is None else handle)
        comm.hier, comm.route = hier, p2p.Route(comm, hier)
        p2p.install(comm)
        for call in COLLECTIVES:
            setattr(comm, call, getattr(hier, call))
        return comm

    world = face(from_mpi(MPI.COMM_WORLD), MPI.COMM_WORLD)
    m = _Module(name, __doc__)
    m._mpi, m.COMM_WORLD = MPI, world
    m.__dict__.update(p2p.MODULE)
    m.__all__ = [n for n in dir(MPI) if not n.startswith("_")]
    return m

