"""pool.run's communicators: the owner's side (Group) and the workers'
(member, and Shrink's request and reply through the pool's rings).

A group is a Job (a segment and its plan) whose ranks are some of the
pool's workers, in rank order.  A worker attaches to the owner's segment
through /proc/<owner>/fd on its first run of a generation and keeps the
communicator for the runs after.  Shrink (ULFM's MPIX_Comm_shrink): each
survivor asks the owner on its result ring; once every member of the
group has asked, ended its part or died, the owner makes a group of the
askers, where they already run, and sends each its place on its task
ring."""
import os
from collections import deque

from . import chan
from ._core import lib
from .comm import Comm
from .device import Device
from .errors import PeerDied, PeerFailure, WorkerDied
from .segment import Segment


class Group:
    """A run's communicator as the owner sees it: its job, generation and
    the workers that are its ranks; who asked to shrink, whose part is
    over (ended or died); the generation its run began with (origin: a
    shrunk group's is its parent's) and that run's futures (fs)."""

    def __init__(self, gen, job, workers, origin=None):
        self.gen, self.job, self.workers = gen, job, list(workers)
        self.origin, self.fs = gen if origin is None else origin, ()
        self.asked, self.over = set(), set()

    def rank_of(self, worker):
        return self.workers.index(worker) if worker in self.workers else None

    def shrinkable(self):
        return bool(self.asked) and len(self.asked | self.over) == len(self.workers)

    def place(self, rank, owner):
        """What worker `rank` attaches with (member's first arguments)."""
        return self.gen, owner, self.job.device.segment.fd, self.job.plan, rank


# A worker's side.
_group = None      # (generation, communicator, device) of its latest run
_ring = None       # (pool memory, worker index): where Shrink asks and hears
inbox = deque()    # messages that came while Shrink waited for its reply


def member(gen, owner, fd, plan, rank, shrinkable, fn, args):
    """A worker's part of a run: fn(comm, *args) on the communicator of
    generation gen (attached on first use, kept for the runs after)."""
    comm, dev = _attach(gen, owner, fd, plan, rank, shrinkable)
    try:
        return fn(comm, *args)
    except BaseException:
        dev.abort(dev.rank, 1)
        raise


def _attach(gen, owner, fd, plan, rank, shrinkable):
    global _group
    if _group is None or _group[0] != gen:
        if _group is not None:
            _group[2].close()
            _group = None
        dev = Device(plan, rank, Segment.open_proc(owner, fd, plan.size))
        dev.register(os.getpid(), owner)
        _group = (gen, Comm(dev), dev)
    comm = _group[1]
    comm._shrinker = (lambda: _shrink(gen, rank)) if shrinkable else None
    return comm, _group[2]


def _shrink(gen, rank):
    """Ask the owner for the survivors' communicator; wait for it.  What
    else comes on the task ring meanwhile waits in inbox."""
    mem, i = _ring
    chan.put(mem.results[i], chan.message(chan.SHRINK, -1, (gen, rank)), lambda: True)
    lib.sc_bell_ring(mem.bell)
    while True:
        kind, tid, obj = chan.receive(mem.tasks[i], lambda: True)
        if kind == chan.GROUP:
            return _attach(*obj, True)[0]
        inbox.append((kind, tid, obj))


def cause(errors):
    """The exception a failed run raises: a death first (as PeerDied),
    then a worker's own error, then what its peers saw of it."""
    for rank, e in errors:
        if isinstance(e, WorkerDied):
            err = PeerDied(rank, f"(pool worker {e.worker}, pid {e.pid}) {e.why} in pool.run")
            err.__cause__ = e
            return err
    rank, e = min(errors, key=lambda x: (isinstance(x[1], PeerFailure), x[0]))
    if hasattr(e, "add_note"):
        e.add_note(f"(raised on rank {rank} of pool.run)")
    return e
