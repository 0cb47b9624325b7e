"""shmcoll inside an MPI job that spans nodes: shared memory within each
node, MPI between them (docs/multinode.md)."""
import os
import sys
import traceback

import numpy as np

from .hier import Hier, flat_given, flat_table
from .layout import close_node, node_comm, node_split, virtual_nodes
from .specs import mpi

__all__ = ["Hier", "from_mpi", "virtual_nodes"]


def from_mpi(comm=None, *, options=None, abort_on_error=True, flat_below=None, network=None):
    """A hierarchical communicator over the mpi4py communicator comm
    (default COMM_WORLD); collective over comm.  Its ranks on one node
    (COMM_TYPE_SHARED, or SHMCOLL_VIRTUAL_NODES) share a shmcoll
    communicator; their local rank 0s form the MPI communicator between
    nodes.  abort_on_error: an exception that ends this rank's program
    aborts the whole MPI job (as `python -m mpi4py` does), so no rank
    waits forever for it.  flat_below: bytes (an int, or a dict by
    collective) below which a call is the MPI library's own on comm
    (default: hier.FLAT_BELOW's row for the library; 0: always the legs).
    network: whether the MPI legs cross a network (default: when comm's
    ranks are on several machines), where each byte should cross once."""
    MPI = mpi()
    flat_below = flat_given(flat_below)     # bad flat_below raises here, before anything is made
    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"shmcoll.from_mpi(): an mpi4py intracommunicator, not {comm!r}")
    hier = build(comm.Dup(), options, flat_below, network)     # MPI's own calls, and the user's, on the duplicate
    if abort_on_error and hier.size > 1:
        _abort_on_error(hier)
    return hier


def build(own, options, flat_below, network, inherited=(False, False)):
    """The hierarchical communicator over own, an MPI communicator it then
    owns (frees with itself); collective over own.  Where a node cannot
    set up its shared memory, every rank of own raises (and what was made
    is freed, own too).  inherited: the communicator it is made from's
    (this machine crowded, some machine crowded), which a subset of its
    ranks does not show."""
    MPI = mpi()
    node_mpi, crowded, one_machine = node_split(own)
    crowded = crowded or inherited[0]
    p2p = own.Split(0, own.Get_rank())          # the legs' point-to-point (a Dup would copy the user's attributes)
    local = node_mpi.Get_rank()
    leaders = own.Split(0 if local == 0 else MPI.UNDEFINED, own.Get_rank())
    up = own.Split(local, own.Get_rank())       # each node's local rank l, over the nodes: HAN's "up" level
    index = node_mpi.bcast(leaders.Get_rank() if local == 0 else None, root=0)
    got = own.allgather((index, local, crowded))
    where = np.array([g[:2] for g in got], np.int64).reshape(-1, 2)
    # one choice on every rank (each call's path must agree): crowded if any machine is
    anywhere = any(g[2] for g in got) or inherited[1]
    flat = flat_table(MPI.Get_library_version(), flat_below, crowded=anywhere)
    node = err = None
    try:
        node = node_comm(node_mpi, options, crowded)
    except (OSError, RuntimeError, ValueError) as e:
        err = f"{type(e).__name__}: {e}"
    failed = [(r, m) for r, m in enumerate(own.allgather(err)) if m]
    if failed:
        if node is not None:
            node.Free()
            close_node(node)
        for c in (leaders, up, node_mpi, p2p, own):
            if c != MPI.COMM_NULL:
                c.Free()
        raise RuntimeError(f"shmcoll: no hierarchical communicator: on rank {failed[0][0]} of its "
                           f"{len(where)}, {failed[0][1]}")
    return Hier(own, node_mpi, leaders if local == 0 else None, up, node, where[:, 0], where[:, 1], flat, p2p,
                not one_machine if network is None else bool(network), options, flat_below, (crowded, anywhere))


def _abort_on_error(hier):
    hook = sys.excepthook

    def abort(*exc):
        if hook is sys.__excepthook__:
            _report(*exc)
        else:
            hook(*exc)
        sys.stderr.flush()
        hier.mpi.Abort(1)
    sys.excepthook = abort


def _report(*exc):
    """The traceback in one write: mpiexec forwards a rank's stderr in the
    pieces it reads, and Open MPI's notice of the abort that follows has
    been seen between "ValueError" and ": rank 1 gives up" when the default
    hook wrote them separately."""
    text = "".join(traceback.format_exception(*exc)).encode(errors="backslashreplace")
    sys.stderr.flush()
    try:
        while text:
            text = text[os.write(2, text):]
    except OSError:
        pass

