"""Communicators made from a communicator (Dup, Split, Create, ...) and
Groups: a mixin of Comm.

Each new communicator is a Device of its own over a segment of its own
(device.restrict: the parent's plan for its members), so its flags, rings,
records and programs are its own: sibling communicators run collectives at
the same time, and one thread per communicator works.  Its rank 0 creates
the segment, placed per NUMA node and unlinked at once; the others open it
through /proc/<pid>/fd/<fd> (the read access the ranks grant each other),
or, where a policy refuses that, through a name with the job's prefix that
lives until every member has it open and that the launcher sweeps if a
rank dies first.  The (pid, fd) pairs travel by the parent's Allgather.

A failure on any communicator aborts the job: it is spread to the world's
abort word and to every other communicator of this process, and a slow
wait on any communicator of any rank watches the world's word."""
import functools
import hashlib
import os
import secrets
import time
import weakref

import numpy as np

from ._core import ffi, lib
from .device import ABORT_CALLED, Device, restrict
from .errors import (ERR_ARG, ERR_COMM, ERR_GROUP, MPIError, PeerAborted, PeerDied, PeerFailure, PeerTimeout,
                     SegmentError)
from .group import CONGRUENT, GROUP_EMPTY, GROUP_NULL, IDENT, SIMILAR, UNEQUAL, Group
from .info import Info, checked
from .request import UNDEFINED, Done as _done
from .segment import Segment

COMM_TYPE_SHARED, COMM_TYPE_HW_GUIDED, COMM_TYPE_HW_UNGUIDED, COMM_TYPE_RESOURCE_GUIDED = 1, 2, 3, 4  # MPICH's
__all__ = ["COMM_NULL", "COMM_TYPE_HW_GUIDED", "COMM_TYPE_HW_UNGUIDED", "COMM_TYPE_RESOURCE_GUIDED",
           "COMM_TYPE_SHARED", "CONGRUENT", "GROUP_EMPTY", "GROUP_NULL", "Group", "IDENT", "SIMILAR", "UNDEFINED",
           "UNEQUAL", "comm_self"]

_live = weakref.WeakSet()       # this process's communicators made here, not yet freed


def _collective(fn):
    """comm.collective (an error aborts the parent, so its peers raise),
    looked up at call time: comm imports this module."""
    @functools.wraps(fn)
    def method(self, *args, **kw):
        from .comm import collective
        return collective(fn)(self, *args, **kw)
    return method


class Communicators:
    """Comm's methods that make, compare, name and free communicators."""
    _job = None          # the world this communicator was made from (None: it is the world)
    _members = None      # its ranks' world ranks in rank order (None: the world's own)
    _name = None
    _cname = "w"           # names this communicator alike on every member (Create_group's segment names)
    _spawned = 0         # communicators made from this one by its collectives

    # -- identity ---------------------------------------------------------------
    @property
    def _world(self):
        return self._job or self

    def _ranks(self):
        return self._members if self._members is not None else tuple(range(self.size))

    def Get_group(self):
        self._alive("Get_group")
        return Group(self._ranks(), self._ranks()[self.rank])

    def Get_name(self):
        if self._name is not None:
            return self._name
        return "MPI_COMM_WORLD" if self._job is None else ""

    def Set_name(self, name):
        self._alive("Set_name")
        self._name = str(name)

    name = property(lambda self: self.Get_name(), lambda self, name: self.Set_name(name))
    group = property(lambda self: self.Get_group())
    is_inter = property(lambda self: False)
    is_intra = property(lambda self: True)
    topology = property(lambda self: UNDEFINED)
    info = property(lambda self: self.Get_info(), lambda self, info: self.Set_info(info))

    def Get_info(self):
        """The hints in use: none (shmcoll reads none; MPI hands back only those it uses)."""
        self._alive("Get_info")
        return Info()

    def Set_info(self, info):
        self._alive("Set_info")
        checked(info, "Set_info")

    def Is_inter(self):
        return False

    def Is_intra(self):
        return True

    def Get_topology(self):
        return UNDEFINED

    def Compare(self, comm):
        """IDENT (the same communicator), CONGRUENT (the same ranks in the
        same order), SIMILAR (the same ranks), UNEQUAL (mpi4py's Comm.Compare)."""
        self._alive("Compare")
        if self == comm:
            return IDENT
        same = Group(self._ranks()).Compare(comm.Get_group())
        return {IDENT: CONGRUENT, SIMILAR: SIMILAR}.get(same, UNEQUAL)

    def __eq__(self, other):
        if self is other or getattr(other, "__dict__", None) is self.__dict__:     # another handle to it
            return True
        return not self and (other is COMM_NULL or isinstance(other, Communicators) and not other)

    def __hash__(self):
        return id(self.__dict__)

    def _handle(self):
        """Another handle to this communicator (mpi4py's Comm(comm)): a
        distinct object, equal to it, whose state (and C entries) are its."""
        other = object.__new__(type(self))
        other.__dict__ = self.__dict__
        return other

    def __bool__(self):
        return not self._freed

    def __reduce__(self):
        """COMM_WORLD and COMM_SELF unpickle as themselves (mpi4py's rule); any other communicator is this
        process's alone."""
        from . import MPI
        for name in ("COMM_WORLD", "COMM_SELF"):
            if MPI._comms.get(name) is self:
                return MPI._comm, (name,)
            if MPI._comms.get(name) == self:
                return MPI._comm_handle, (name,)
        raise ValueError(f"cannot pickle {self._label()}: only COMM_WORLD, COMM_SELF and COMM_NULL pickle")

    def _label(self):
        name = self.Get_name()
        return repr(name) if name else f"the communicator of world ranks {list(self._ranks())}"

    def _alive(self, what):
        if self._freed:
            raise MPIError(ERR_COMM, f"{what}: {self._label()} was freed on rank {self.rank}")

    # -- making ---------------------------------------------------------------------
    @_collective
    def Dup(self, info=None):
        """The same ranks in the same order, a communicator of their own
        (info: hints, none of which shmcoll reads)."""
        checked(info, "Dup")
        return self._spawn(tuple(range(self.size)))

    def Clone(self):
        return self.Dup()

    def Dup_with_info(self, info):
        return self.Dup(info)

    def Idup(self, info=None):
        """(communicator, request): made at once (a collective of this
        communicator's ranks, in call order with the others), the request complete."""
        return self.Dup(info), _done()

    def Idup_with_info(self, info):
        return self.Dup_with_info(info), _done()

    @_collective
    def Split(self, color=0, key=0):
        """Ranks of one color together, ordered by (key, parent rank); color
        UNDEFINED gives COMM_NULL."""
        color, key = _int(color, "color"), _int(key, "key")
        if color < 0 and color != UNDEFINED:
            self._bad(MPIError(ERR_ARG, f"Split: color must be >= 0 or UNDEFINED, not {color}"))
        every = np.empty((self.size, 2), np.int64)
        self.Allgather(np.array([color, key], np.int64), every)
        if color == UNDEFINED:
            return self._spawn(None)
        return self._spawn(tuple(sorted((r for r in range(self.size) if every[r, 0] == color),
                                        key=lambda r: (every[r, 1], r))))

    def Split_type(self, split_type, key=0, info=None):
        """COMM_TYPE_SHARED: every rank shares this node's memory, so one
        communicator of all, ordered by key; UNDEFINED: COMM_NULL."""
        if split_type not in (COMM_TYPE_SHARED, UNDEFINED):
            self._alive("Split_type")
            self._bad(NotImplementedError(f"Split_type: split_type {split_type} (only COMM_TYPE_SHARED and "
                                          f"UNDEFINED)"))
        return self.Split(0 if split_type == COMM_TYPE_SHARED else UNDEFINED, key)

    @_collective
    def Create(self, group):
        """The ranks of group (a subset of this communicator's, called by all
        of its ranks) in group's order; COMM_NULL on the others."""
        try:
            order = self._order(group, "Create")
        except MPIError as e:       # the parent's other ranks are in the call: they raise too
            self._bad(e)
        return self._spawn(order)

    @_collective
    def Create_group(self, group, tag=0):
        """The ranks of group in its order, called by them alone (no
        collective of this communicator): the group's rank 0 creates the
        segment under a name every member derives (this communicator's
        context, the group, tag, and how many such calls came before), the
        members open it by name and register, and the name goes once all
        have (the launcher sweeps it if a rank dies first)."""
        order = self._order(group, "Create_group")
        if order is None:
            raise MPIError(ERR_GROUP, f"Create_group: rank {self.rank} is not in the group; only its ranks call it")
        key = f"{self._cname}|{group.members}|{int(tag)}"
        made = self.__dict__.setdefault("_groups_made", {})
        made[key] = made.get(key, 0) + 1
        ctx = hashlib.sha1(f"{key}|{made[key]}".encode()).hexdigest()[:24]
        plan = restrict(self.plan, order)
        name = f"{plan.job or '/shmcoll-'}g{ctx}"
        if order[0] == self.rank:
            dev = Device.made(plan, name)
            try:
                dev.register(os.getpid(), 0)
                self._await("Create_group", order, lambda: all(dev.rank_state(r) for r in range(len(order))),
                            lambda r: dev.rank_state(order.index(r)) >= 1)
            except BaseException:
                dev.close()
                raise
            finally:
                dev.segment.unlink()
        else:
            dev = _registered(self._await("Create_group", order[:1],
                                          lambda: _opened(plan, order.index(self.rank), name)))
        dev.segment.close_fd()
        return self._adopt(dev, tuple(self._ranks()[r] for r in order), "g" + ctx)

    def _await(self, what, ranks, done, did=None):
        """Poll done() until it returns something true, raising if any of
        this communicator's ranks `ranks` dies or leaves before did(rank)
        says it has done its part, the job aborts, or the timeout option
        passes."""
        timeout = float(self.plan.params["timeout"])
        t0, pause = time.monotonic(), 1e-4
        while True:
            got = done()
            if got:
                return got
            for r in ranks:
                if self._dev.rank_state(r) >= 2 and not (did and did(r)):     # left having done its part: fine
                    raise PeerDied(r, f"left or died while rank {self.rank} waited on it in {what}")
            word = ffi.cast("uint32_t *", self._world._c.base)[0]
            if word:
                raise PeerAborted((word & 0xffff) - 1, f"aborted the job (world rank; code {word >> 16}) while "
                                                       f"rank {self.rank} waited in {what}")
            if timeout and time.monotonic() - t0 > timeout:
                raise PeerTimeout(ranks[0], f"did not arrive for {timeout:.3g} s in {what} (timeout option)")
            time.sleep(pause)
            pause = min(2 * pause, 0.01)

    def _order(self, group, what):
        if not isinstance(group, Group):
            raise TypeError(f"{what}: group must be a Group, not {type(group).__name__}")
        ranks = self._ranks()
        missing = [m for m in group.members if m not in ranks]
        if missing:
            raise MPIError(ERR_GROUP, f"{what}: world ranks {missing} of the group are not in this communicator")
        mine = ranks[self.rank]
        return tuple(ranks.index(m) for m in group.members) if mine in group.members else None

    def _spawn(self, order):
        """The communicator of parent ranks `order` (its rank order), or
        COMM_NULL where order is None; every parent rank calls it."""
        self._spawned += 1          # every rank of this communicator counts alike: a context for names
        me = None if order is None else order.index(self.rank)
        plan = None if order is None else restrict(self.plan, order)
        dev = None
        try:
            dev = Device.made(plan) if me == 0 else None
            dev, ok = self._exchange(order, me, plan, dev)
            if not all(ok):             # some communicator's ranks cannot open /proc links: names
                dev = self._named(order, me, plan, dev, order is not None and not all(ok[r] for r in order))
            if dev is not None:
                dev.segment.close_fd()  # every member has it mapped (the parent's Allgather said so)
                dev.register(os.getpid(), 0)
        except BaseException as e:
            if dev is not None:
                dev.close()
            if isinstance(e, PeerFailure):
                raise
            self._bad(e)            # a full /dev/shm here, say: the parent's other ranks must not wait
        if dev is None:
            return COMM_NULL
        return self._adopt(dev, tuple(self._ranks()[r] for r in order), f"{self._spawned}.{self._ranks()[order[0]]}")

    def _exchange(self, order, me, plan, dev):
        """Each member maps its rank 0's segment through /proc; (its device
        or None, every parent rank's success)."""
        table = np.empty((self.size, 2), np.int64)
        self.Allgather(np.array([os.getpid(), dev.segment.fd] if me == 0 else [-1, -1], np.int64), table)
        ok = 1
        if me:
            try:
                dev = Device(plan, me, Segment.open_proc(*(int(x) for x in table[order[0]]), plan.size))
            except PermissionError:
                ok = 0
        oks = np.empty(self.size, np.int64)
        self.Allgather(np.array([ok], np.int64), oks)
        return dev, oks

    def _named(self, order, me, plan, dev, need):
        """The fallback where need (a member of ours could not open the
        link; every parent rank takes part): rank 0 makes the segment again
        under a name with the job's prefix, the members open it, then the
        name goes."""
        prefix = (plan.job if plan is not None else "") or "/shmcoll-"
        token = 0
        if need and me == 0:
            dev.close()
            dev = None
            token = secrets.randbits(62)
            dev = Device.made(plan, f"{prefix}{token:016x}")
        tokens = np.empty(self.size, np.int64)
        self.Allgather(np.array([token], np.int64), tokens)
        if need and me:
            if dev is not None:
                dev.close()
                dev = None
            dev = Device(plan, me, Segment.open_named(f"{prefix}{int(tokens[order[0]]):016x}", plan.size))
        self.Barrier()
        if need and me == 0:
            dev.segment.unlink()
        return dev

    def _adopt(self, dev, members, ctx):
        """A Comm over dev, of world ranks members, part of this job, ctx
        naming it the same on every member: the CMA verdict is the
        parent's (every rank could read every other)."""
        dev.c.job_abort = ffi.cast("uint32_t *", self._world._c.base)
        dev.members = members
        comm = type(self)(dev, cma=int(self._c.cma))
        comm._job, comm._members, comm._cname = self._world, members, f"{self._cname}.{ctx}"
        comm._errhandler = self._errhandler     # MPI: a new communicator inherits its parent's
        _live.add(comm)
        return comm

    # -- lifetime -------------------------------------------------------------------
    def _release(self):
        """After Free: a communicator made here unmaps its segment (the
        world's belongs to the launcher); the world's Free (the rank's end)
        frees those made from it first, so their peers see a clean exit and
        calls their peers never made raise, as on the world."""
        if self in _live:
            _live.discard(self)
            self._dev.close()
            return
        first = None
        for comm in [c for c in list(_live) if c._job is self]:
            try:
                comm.Free()
            except Exception as e:
                first = first or e
        if first is not None:
            raise first

    def _spread(self, exc):
        """This communicator failed (exc): abort the world and every other
        communicator of this process, so every rank waiting anywhere raises."""
        culprit = self._ranks()[self.rank]
        code = 1
        if isinstance(exc, PeerFailure) and 0 <= exc.rank < self.size:
            culprit, code = self._ranks()[exc.rank], 2 if isinstance(exc, PeerDied) else 1
        _abort_all(self._world, culprit, code, self)

    def Abort(self, errorcode=0):
        """Abort the job: every rank raises (PeerAborted naming this one) and
        this process exits with errorcode, which `shmcoll run` returns."""
        import sys
        errorcode = int(errorcode) & 0xff
        _abort_all(self._world, self._ranks()[self.rank], ABORT_CALLED | errorcode, None)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(errorcode)


def _abort_all(world, culprit, code, but):
    """Set the abort word of the world (culprit: a world rank) and of this
    process's other communicators (-1 where culprit is not a member: their
    failure names the world's)."""
    lib.sc_set_abort(world._c, culprit, code)
    for comm in list(_live):
        if comm is not but and not comm._freed:
            ranks = comm._ranks()
            lib.sc_set_abort(comm._c, ranks.index(culprit) if culprit in ranks else -1, code)


def _opened(plan, rank, name):
    """rank's device over the named segment once its creator has made it
    whole (the right size, initialised), else None."""
    try:
        seg = Segment.open_named(name, plan.size)
    except (FileNotFoundError, SegmentError):
        return None
    try:
        return Device(plan, rank, seg)
    except RuntimeError:            # not yet initialised
        pass
    seg.mmap.close()                # here, not in the except: its traceback held the device's view
    seg.close_fd()
    return None


def _int(x, what):
    try:
        return int(x)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be an int, not {type(x).__name__}") from None


def _registered(dev):
    """dev with this process registered as its rank (liveness), or closed."""
    try:
        dev.register(os.getpid(), 0)
    except BaseException:
        dev.close()
        raise
    return dev


def comm_self(world):
    """This rank's one-rank communicator (COMM_SELF), with no exchange: a
    private device over a segment of its own."""
    rank = world._ranks()[world.rank]
    dev = _registered(Device.made(restrict(world._world.plan, [rank])))
    dev.segment.close_fd()
    comm = world._adopt(dev, (rank,), "self")
    comm._name = "MPI_COMM_SELF"
    return comm


class _NullComm:
    """COMM_NULL: what a rank outside a Split's colors gets; any call raises."""

    def __bool__(self):
        return False

    def __eq__(self, other):
        return other is self or isinstance(other, Communicators) and not other

    __hash__ = object.__hash__

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise MPIError(ERR_COMM, f"{name}: COMM_NULL is not a communicator")

    def __repr__(self):
        return "<shmcoll.COMM_NULL>"


COMM_NULL = _NullComm()
