"""Which ranks of an MPI communicator share a node, and the node's shmcoll
communicator among them.

The node's shared memory is never named: its local rank 0 creates the
job's segment (unlinked at once, as every shmcoll segment), sends (its
pid, the fd, the plan) over the node's MPI communicator, and the others
map it through /proc/<pid>/fd (as init() does under another launcher, and
communicators do).  So there is no window in which a name could be left
in /dev/shm, and nothing stale to sweep."""
import os

import numpy as np

from .. import segment
from ..comm import Comm
from ..device import Device
from ..segment import Segment
from .specs import mpi


def virtual_nodes(size, env=os.environ):
    """SHMCOLL_VIRTUAL_NODES=3,1: the sizes of consecutive groups of
    COMM_WORLD's ranks taken as nodes (in place of the hostname), or None."""
    text = env.get("SHMCOLL_VIRTUAL_NODES", "").strip()
    if not text:
        return None
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"SHMCOLL_VIRTUAL_NODES={text!r}: not comma-separated rank counts") from None
    if min(sizes) < 1 or sum(sizes) != size:
        raise ValueError(f"SHMCOLL_VIRTUAL_NODES={text!r}: node sizes must be positive and add up to "
                         f"COMM_WORLD's {size} ranks")
    return sizes


def virtual_node(rank, sizes):
    """(node, its first rank) of rank, nodes being consecutive groups of sizes."""
    ends = np.cumsum(sizes)
    node = int(np.searchsorted(ends, rank, side="right"))
    return node, int(ends[node] - sizes[node])


def node_split(comm):
    """(comm's ranks on this rank's node (virtual or real), in comm's
    order; whether the machine's ranks outnumber the CPUs they may run on;
    whether comm's ranks are all on this machine)."""
    MPI = mpi()
    sizes = virtual_nodes(MPI.COMM_WORLD.Get_size())
    machine = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    cpus = machine.allgather(sorted(os.sched_getaffinity(0)))
    crowded = machine.Get_size() > len(set().union(*map(set, cpus)))
    one = machine.Get_size() == comm.Get_size()
    if sizes is None:
        return machine, crowded, one
    machine.Free()
    node, _ = virtual_node(MPI.COMM_WORLD.Get_rank(), sizes)
    return comm.Split(node, comm.Get_rank()), crowded, one


def node_comm(node_mpi, options=None, crowded=False):
    """The shmcoll communicator of node_mpi's ranks.  A failure on any of
    them (no memory for the segment, a policy refusing /proc/<pid>/fd)
    raises on every one.  crowded: more ranks on this machine than CPUs
    (virtual nodes on a small one), which the node's ranks alone do not
    show: waits hand the CPU over at once, as shmcoll's do when it sees
    oversubscription itself, unless the options or SHMCOLL_SPIN_NS say."""
    from ..launcher import Job
    if crowded and "SHMCOLL_SPIN_NS" not in os.environ:
        options = {"spin_ns": 0, **(options or {})}
    err = record = dev = None
    if node_mpi.Get_rank() == 0:
        try:
            job = Job(node_mpi.Get_size(), bind="none", options=options)
            dev = job.device.as_rank(0)
            dev.job = job                   # the segment's fd lives as long as the communicator
            record = (os.getpid(), job.device.segment.fd, job.plan)
        except (OSError, ValueError, RuntimeError) as e:
            err = e
    record = node_mpi.bcast(record if err is None else None, root=0)
    if node_mpi.Get_rank() != 0 and record is not None:
        try:
            dev = Device(record[2], node_mpi.Get_rank(), Segment.open_proc(record[0], record[1], record[2].size))
        except OSError as e:
            err = e
    if dev is not None:
        dev.register(os.getpid(), 0)
    failed = node_mpi.allgather(None if err is None else f"{type(err).__name__}: {err}")
    bad = [(r, m) for r, m in enumerate(failed) if m]
    if bad:
        if dev is not None:
            dev.close()
        raise RuntimeError(f"node-local rank {bad[0][0]} could not set up the node's shared memory: {bad[0][1]}")
    return Comm(dev)


def close_node(comm):
    """Unmap a freed node communicator's segment: node_comm's is a world,
    whose Free leaves it mapped (a launcher's world is the rank's own
    until it exits), and a hierarchical communicator's Free must not."""
    dev = comm._dev
    dev.close()
    job = getattr(dev, "job", None)
    if job is not None:             # names its ranks' communicators may have left (a rank killed mid-Dup)
        segment.sweep(job.plan.job)
