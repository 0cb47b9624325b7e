"""The API layer: Comm, mpi4py-like.  Upper-case methods move buffers,
lower-case ones pickled objects (shmcoll/objects.py).  A method has its
arguments checked (shmcoll/args.py, buffer specs: shmcoll/spec.py), keys
the call, and _run picks the algorithm (select.resolve) and plans its
schedule; the device layer compiles it and its C executor runs it.

A call's life: the instance's C fast entry (device.entry) looks the
program up by (collective, algorithm, root, byte counts, item size) and
runs it; on a miss, or anything unusual, it hands the call to the method
below, which checks everything, plans, compiles, installs the program for
the next time, and runs it.

Errors: any error inside a collective call on this rank (bad argument,
pickling, Ctrl-C) raises here and aborts the communicator, so every other
rank raises PeerFailure instead of waiting or pairing with the wrong call;
a peer's death raises PeerDied.  After either, the communicator is unusable."""
import functools
import threading

import numpy as np

from . import buffers, isa, listing, objects, ops, spec
from .args import Args, apart
from .comms import Communicators
from ._core import ffi, lib
from .buffers import IN_PLACE
from .coll import select
from .device import P2P, fingerprint, learn_dtype
from .errors import ERR_ARG, ERR_COMM, ERRORS_ARE_FATAL, ArgumentError, Errhandler, MismatchError, MPIError, PeerFailure, ShmcollError
from .nonblocking import RESOLVED, Nonblocking
from .request import Complete
from .ops import BUILTINS, SUM
from .p2p import PointToPoint
from .sched import Call, Schedule
from .sendmodes import SendModes
from .words import COUNTS_HASH, INPLACE_OP, field


def _unresolved(*args, **kw):
    """A nonblocking call's resolver declined (Nonblocking._nonblocking): plan it in Python."""


#: The buffer that None stands for IN_PLACE in, as mpi4py reads it (its
#: collectives take a None sendbuf, and a Scatter root's None recvbuf, so).
NONE_IN_PLACE = {name: "sendbuf" for name in ("Alltoall", "Alltoallv", "Alltoallw", "Allgather", "Allgatherv",
                                             "Gather", "Gatherv", "Allreduce", "Reduce", "Reduce_scatter_block",
                                             "Reduce_scatter", "Scan", "Exscan")}
NONE_IN_PLACE.update(Scatter="recvbuf", Scatterv="recvbuf")


def collective(fn):
    """Run a Comm method so that any error it raises aborts the communicator."""
    placed = NONE_IN_PLACE.get(fn.__name__)
    at = fn.__code__.co_varnames.index(placed) - 1 if placed else None      # its place after self

    @functools.wraps(fn)
    def method(self, *args, **kw):
        self._usable()
        if placed:
            if len(args) > at and args[at] is None:
                args = args[:at] + (IN_PLACE,) + args[at + 1:]
            elif kw.get(placed, IN_PLACE) is None:
                kw[placed] = IN_PLACE
        top = not self._depth           # a collective's own inner calls (Gatherv's Bcast of counts) talk for it
        if top:
            self._talking = False
        self._depth += 1
        try:
            return fn(self, *args, **kw)
        except ArgumentError as e:
            self._bad(e)
        except ShmcollError:
            raise
        except BaseException as e:
            self._bad(e)
        finally:
            self._depth -= 1
            if top:
                self._talking = False
    return method


def locked(fn):
    """Under this communicator's lock for fn's name (mpi4py's lock table
    for its lower-case collectives, MPI._comm_lock_table): threads making
    one of them on a communicator take turns.  The thread that holds it
    calling again (from a signal handler inside the call) is refused: it
    would wait on itself for ever."""
    name = fn.__name__

    @functools.wraps(fn)
    def method(self, *args, **kw):
        lock = self.__dict__.setdefault("_locks", {}).setdefault(name, threading.Lock())
        owners, me = self.__dict__.setdefault("_lock_owners", {}), threading.get_ident()
        if owners.get(name) == me:
            raise RuntimeError(f"{name}: this thread is already inside {name} on this communicator (called "
                               f"again from a signal handler?); one communicator serves one call at a time")
        with lock:
            owners[name] = me
            try:
                return fn(self, *args, **kw)
            finally:
                owners[name] = None
    return method


OPCODES = {op: op.code for op in BUILTINS.values()}    # the C entries' built-in ops


def _addr(ptr):
    """The address C takes for a pointer from buffers.view (0: none)."""
    return 0 if ptr is None else buffers.address(ptr)


class Comm(PointToPoint, SendModes, Communicators, Nonblocking):
    """A communicator: the collectives here, point-to-point (p2p.py,
    sendmodes.py), new communicators (comms.py), nonblocking and persistent collectives
    (nonblocking.py)."""
    _errhandler = ERRORS_ARE_FATAL
    _depth = 0                      # collective methods running (one inside another)
    _talking = False                # the running one has reached other ranks (_run)

    def __init__(self, device, cma=None):
        self._dev = device
        self._c = device.c
        self.plan = device.plan
        self.rank, self.size = device.rank, device.plan.nranks
        self.slots = device.plan.slots
        self._args = Args(self.rank, self.size)
        self._broken = None
        self._freed = False
        self._forced = {op: select.forced(op, self.plan.params) for op in select.TABLE}
        if cma is None:
            self._probe_cma()
        else:                       # a communicator made from another: its verdict holds for any subset
            self._c.cma = cma
        self._dev.started = int(self._c.call)       # Free counts the calls made after these (Device.deregister)
        self._nb_resolvers, self._nb_known = {}, {}
        self._spare()
        for op, (cid, _, name, roles, argnames) in select.TABLE.items():
            if not roles:
                continue
            method = getattr(Comm, name).__get__(self)
            handler = functools.partial(self._failed, name)
            blocked = sum(1 << argnames.index(a) for a in spec.BLOCKED.get(op, ()))
            desc = (argnames, OPCODES, IN_PLACE, SUM, blocked)
            self.__dict__[name] = device.entry(method, handler, select.IDS[op], cid, roles, desc)
            if name in RESOLVED:
                self._nb_resolvers[name] = device.entry(_unresolved, handler, select.IDS[op], cid, roles, desc,
                                                           (self._nb_known, Complete))
        self._p2p_bind()

    def _probe_cma(self):
        """Single copies need every rank able to read every other: each
        tries its right neighbour once all have registered, and all learn
        every verdict, so every rank plans the same schedules.  Flat
        algorithms: every rank's compile follows each whole schedule's
        events, so at start-up, with hundreds of ranks, a schedule of n^2
        moves or n rounds costs far more than waiting on rank 0."""
        self._c.cma = 0
        if self.size == 1:
            return
        self.Barrier("padded")
        every = np.empty(self.size, np.uint8)
        self.Gather(np.full(1, lib.sc_probe_cma(self._c), np.uint8), every, 0, "flat")
        self.Bcast(every, 0, "original")
        self._c.cma = int(every.all())
        self._dev.clear_programs()

    def Get_rank(self):
        return self.rank

    def Get_errhandler(self):
        return self._errhandler

    def Set_errhandler(self, errhandler):
        """ERRORS_ARE_FATAL (shmcoll's default), ERRORS_ABORT or
        ERRORS_RETURN (mpi4py's): see errors.Errhandler."""
        if not isinstance(errhandler, Errhandler) or not errhandler:
            raise MPIError(ERR_ARG, f"Set_errhandler: {errhandler!r} is not an error handler")
        self._usable()
        self._errhandler = errhandler

    def Call_errhandler(self, errorcode):
        """Raise MPIError(errorcode) as this communicator's handler does with an error of this rank."""
        self._bad(MPIError(errorcode, f"Call_errhandler({errorcode})"))

    def Get_size(self):
        return self.size

    def __repr__(self):
        return f"<shmcoll.Comm rank {self.rank} of {self.size}>"

    # -- errors ------------------------------------------------------------
    def _failed(self, what, rc):
        """A C entry's call failed with rc: raise as the Python path would."""
        self._usable()
        self._fail(rc, what)

    def _fail(self, rc, what):
        exc = self._dev.failure(rc, what, functools.partial(field, what))
        if rc == lib.SC_EBUSY:          # the other thread's call goes on; ours is a local error
            self._bad(exc)
        if rc != lib.SC_EDIFFER:        # the job is aborted (a check-round refusal leaves it usable)
            self._break(exc)
            self._spread(exc)
        raise exc

    def _returns(self):
        """Whether a local error raises here alone: the error handler
        returns and the running call has reached no other rank."""
        return not self._errhandler.fatal and not self._talking

    def _bad(self, exc):
        """A local error: abort so the other ranks raise too, unless the
        error handler returns (_returns)."""
        if self._returns():
            raise exc
        self._dev.abort(self.rank, 3)
        self._break(exc)
        self._spread(exc)
        raise exc

    def _break(self, exc):
        """From now on every call takes the checked methods, which refuse
        (saved references to the C entries decline to them too)."""
        if self._broken is None:
            self._broken = exc
        self._c.closed = 1

    def _usable(self):
        if self._broken is None:
            return
        if isinstance(self._broken, ShmcollError) and not isinstance(self._broken, PeerFailure):
            raise self._broken
        rank = self._broken.rank if isinstance(self._broken, PeerFailure) else self.rank
        raise PeerFailure(rank, f"failed earlier on this communicator ({self._broken!r}); it cannot be used")

    # -- planning ------------------------------------------------------------
    def _call(self, nbytes, root=0):
        return Call(self.size, nbytes, root, self.plan.params, self.slots, len(self.plan.topo.nodes),
                    bool(self._c.cma))

    def _resolve(self, op, nbytes, root, algorithm, dtype):
        call = select.typed(op, self._call(nbytes, root), dtype)
        return select.resolve(op, call, algorithm, self._forced.get(op))

    def selected(self, op, nbytes, root=0, dtype=None):
        """The algorithm that algorithm=None uses for op at nbytes (a
        reduction's: of that dtype; twins: the single-copy program's;
        Alltoallv/w, Gatherv, Scatterv: select.ROUTED's, by point-to-point): a str
        whose .source (option, tuning, model, rules) and .why say where
        the choice came from (select.Selected)."""
        if op in select.ROUTED and not self._forced.get(op):
            return select.Selected(select.ROUTED[op], "rules", f"the automatic {select.method(op)}: point-to-point")
        return self._resolve(op, nbytes, root, None, dtype)[0]

    def schedule(self, op, nbytes=0, root=0, algorithm=None, dtype=None):
        """The schedule this communicator runs for op (nbytes: the buffer for
        bcast, one block for alltoall; a reduction's: of that dtype; twins:
        the single-copy program's)."""
        name, call, _ = self._resolve(op, nbytes, root, algorithm, dtype)
        return select.plan(op, name, call)

    def program(self, op, nbytes=0, root=0, algorithm=None, dtype=None, rank=None):
        """The listing of the programs this communicator compiles for op (as
        schedule() plans it): every rank's, or rank's alone."""
        return listing.of_comm(self, op, nbytes, root, algorithm, dtype, rank)

    def twins(self):
        """Calls that the automatic choice runs as twins (single copy, or
        staged: whichever rank 0 timed faster, the adapt option): a list
        of {collective, bytes (as adapt counts them), us (rank 0's
        estimates of each: single copy, staged), runs (calls this rank ran
        each)}, one per program this rank keeps (a root's apart)."""
        coll = (1 << isa.KEY_OP_SHIFT) - 1         # the key's collective, below a reduction's op
        return [{"collective": select.OPS[k[0] & coll], "bytes": n, "us": tuple(e / 1000 for e in est),
                 "runs": runs} for k, (n, est, runs) in self._dev.twins().items()]

    def traffic(self):
        """Bytes this rank's executor has read from each rank (local copies
        not counted); needs the record_traffic option."""
        return self._recorded()[:self.size].copy()

    def messages(self):
        """Messages this rank's executor has read from each rank (a message:
        one move of a schedule, however many chunks it took); needs the
        record_traffic option."""
        return self._recorded()[self.size:].copy()

    def _recorded(self):
        if self._dev.traffic is None:
            raise RuntimeError("traffic is recorded only with the record_traffic=1 option")
        return self._dev.traffic

    def _run(self, op, key, nbytes, root, algorithm, saddr=0, raddr=0, dtype=None, counts=None, tail=None,
             red=None, agreed=None):
        """Plan (cached by key), then run this rank's program.  dtype: the
        datatype the signature holds; counts: a v-variant's (bytes,
        displacement) per rank; agreed: what of them every rank must
        pass alike (default: counts), held in the signature by a hash;
        red: a reduction's (op, kernel, in place)."""
        self._talking = True
        call = self._call(nbytes, root)
        call.counts = counts
        opcode = 0
        if red is not None:
            opcode, call.kernel, call.inplace = red[0].code, red[1], red[2]
            call.item = red[1].item
            if call.inplace and op != "reduce":     # IN_PLACE on every rank or none (MPI): ranks plan alike
                opcode |= INPLACE_OP
        name, call, staged = select.resolve(op, call, algorithm, self._forced[op])
        alt = staged and (nbytes, functools.partial(select.plan, op, *staged))
        cid, what = select.TABLE[op][0], select.method(op)
        agreed = counts if agreed is None else agreed
        sigbytes = None if agreed is None else hash(agreed) & ((1 << 61) - 1) | COUNTS_HASH
        code = 0 if dtype is None else buffers.dtype_code(dtype)
        capture = self._capture == op       # a nonblocking call's program, started by nonblocking.py
        if self._pending and not capture:
            self._complete_pending()        # the nonblocking calls before this blocking one end first
        if lib.sc_own(self._c) and not self._owned(capture):     # another thread is running a call: touch
            self._fail(lib.SC_EBUSY, what)                       # nothing it uses
        try:
            prog = self._dev.program(key, cid, select.IDS[op][name], lambda: select.plan(op, name, call), code,
                                     sigbytes, tail, opcode, alt)
        finally:
            lib.sc_disown(self._c)
        if capture:
            self._capture = (prog, saddr, raddr, what, nbytes)
            return
        rc = self._dev.execute(prog, saddr, raddr)
        if rc:
            self._fail(rc, what)

    def _key(self, op, algorithm, root, len0, len1, itemsize):
        alg = isa.KEY_NONE if algorithm is None else select.IDS[op][select.check_name(op, algorithm)]
        return isa.key(select.TABLE[op][0], alg, root, len0, len1, itemsize)

    @staticmethod
    def _dkey(dt):
        """The key word naming datatype dt, as the C entry computes it for
        an array of that dtype: its hash (by value, this process's)."""
        return hash(dt)

    # -- collectives -----------------------------------------------------------
    # Each instance's Barrier/Bcast/Alltoall are C entries (device.entry)
    # for the common case; they hand every other call to these methods.

    @collective
    def Barrier(self, algorithm=None):
        self._run("barrier", self._key("barrier", algorithm, 0, 0, 0, 0), 0, 0, algorithm)

    def barrier(self):
        self.Barrier()

    @collective
    def Bcast(self, buf, root=0, algorithm=None):
        root = self._args.root(root)
        ptr, nbytes, itemsize = self._args.bcast(buf, root)
        self._run("bcast", self._key("bcast", algorithm, root, nbytes, 0, itemsize), nbytes, root, algorithm,
                  _addr(ptr), _addr(ptr))

    @collective
    def Alltoall(self, sendbuf, recvbuf, algorithm=None):
        """sendbuf IN_PLACE: recvbuf holds the blocks to send (copied first);
        a spec's count is per block."""
        s, sbytes, r, rbytes, sitem = self._args.alltoall(sendbuf, recvbuf)
        self._run("alltoall", self._key("alltoall", algorithm, 0, sbytes, rbytes, sitem), sbytes // self.size, 0,
                  algorithm, _addr(s), _addr(r))

    @collective
    def Allgather(self, sendbuf, recvbuf, algorithm=None):
        """sendbuf IN_PLACE: this rank's block is already in recvbuf;
        recvbuf's spec count is per block."""
        s, sbytes, r, rbytes, dt = self._args.allgather(sendbuf, recvbuf)
        self._run("allgather", self._key("allgather", algorithm, 0, sbytes, rbytes, self._dkey(dt)), sbytes, 0,
                  algorithm, _addr(s), _addr(r), dt)

    @collective
    def Gather(self, sendbuf, recvbuf=None, root=0, algorithm=None):
        """recvbuf matters on the root only (None elsewhere); sendbuf
        IN_PLACE on the root: its block is already in recvbuf; recvbuf's
        spec count is per block."""
        root = self._args.root(root)
        s, sbytes, r, rbytes, dt = self._args.gather(sendbuf, recvbuf, root)
        self._run("gather", self._key("gather", algorithm, root, sbytes, rbytes, self._dkey(dt)), sbytes, root,
                  algorithm, _addr(s), _addr(r), dt)

    @collective
    def Scatter(self, sendbuf, recvbuf, root=0, algorithm=None):
        """sendbuf matters on the root only (None elsewhere); recvbuf
        IN_PLACE on the root: its block stays in sendbuf; sendbuf's spec
        count is per block."""
        root = self._args.root(root)
        s, sbytes, r, rbytes, dt = self._args.scatter(sendbuf, recvbuf, root)
        self._run("scatter", self._key("scatter", algorithm, root, sbytes, rbytes, self._dkey(dt)), rbytes, root,
                  algorithm, _addr(s), _addr(r), dt)

    @collective
    def Allgatherv(self, sendbuf, recvbuf, algorithm=None):
        """recvbuf: [buf, counts, displs, dtype] (mpi4py's forms; counts and
        displacements in items, displacements packed when left out).  With
        no counts, sizes and data travel together (objects.collect) and land
        packed in rank order."""
        rptr, rbytes, ritem, dt, counts, displs = spec.vspec(recvbuf, "recvbuf", self.size, True,
                                                             derive=sendbuf is IN_PLACE)
        sendbuf = spec.simple(sendbuf, "sendbuf", False)
        if sendbuf is IN_PLACE:
            sendbuf = self._args.own_piece("Allgatherv", rptr, ritem, dt, counts, displs, self.rank)
        sptr, sbytes, sitem = buffers.view(sendbuf, "sendbuf", writable=False)
        if counts is None:
            _, pieces = objects.collect(self, np.frombuffer(ffi.buffer(sptr, sbytes), np.uint8), rbytes, ritem)
            out = np.frombuffer(ffi.buffer(rptr, rbytes), np.uint8)
            at = 0
            for piece in pieces:
                out[at:at + piece.size] = piece
                at += piece.size
            return
        self._vrun("allgatherv", algorithm, 0, sptr, sbytes, rptr, rbytes, ritem, dt, counts, displs, "sendbuf")

    @collective
    def Gatherv(self, sendbuf, recvbuf=None, root=0, algorithm=None):
        """recvbuf on the root: [buf, counts, displs, dtype].  Automatic:
        each piece straight to the root (_rooted).  A named algorithm's
        schedule: the root's counts go to every rank first (a small
        Bcast), so each checks its own and all plan the same schedule.
        sendbuf IN_PLACE on the root: its piece is already in recvbuf."""
        root = self._args.root(root)
        sendbuf = spec.simple(sendbuf, "sendbuf", False)
        if self._p2p_route("gatherv", algorithm):
            return self._rooted("Gatherv", root, sendbuf, recvbuf, "recvbuf")
        if sendbuf is IN_PLACE:
            sendbuf = self._args.own_piece("Gatherv", *self._args.root_spec("Gatherv", recvbuf, "recvbuf", root), root)
        sptr, sbytes, sitem = buffers.view(sendbuf, "sendbuf", writable=False)
        rptr, rbytes, ritem, dt, counts, displs = self._root_vspec("Gatherv", recvbuf, "recvbuf", root, True, sitem,
                                                                   buffers.dtype_of(sendbuf))
        self._vrun("gatherv", algorithm, root, sptr, sbytes, rptr, rbytes, ritem, dt, counts, displs, "sendbuf")

    @collective
    def Scatterv(self, sendbuf, recvbuf, root=0, algorithm=None):
        """sendbuf on the root: [buf, counts, displs, dtype]; the counts go
        to every rank first, as in Gatherv, but for the automatic call
        (_rooted).  recvbuf IN_PLACE on the root: its piece stays in
        sendbuf."""
        root = self._args.root(root)
        recvbuf = spec.simple(recvbuf, "recvbuf", True)
        if self._p2p_route("scatterv", algorithm):
            return self._rooted("Scatterv", root, recvbuf, sendbuf, "sendbuf")
        if recvbuf is IN_PLACE:
            recvbuf = self._args.own_piece("Scatterv", *self._args.root_spec("Scatterv", sendbuf, "sendbuf", root),
                                           root, copy=False)
        rptr, rbytes, ritem = buffers.view(recvbuf, "recvbuf", writable=True)
        sptr, sbytes, sitem, dt, counts, displs = self._root_vspec("Scatterv", sendbuf, "sendbuf", root, False, ritem,
                                                                   buffers.dtype_of(recvbuf))
        self._vrun("scatterv", algorithm, root, sptr, sbytes, rptr, rbytes, sitem, dt, counts, displs, "recvbuf")

    @collective
    def Alltoallv(self, sendbuf, recvbuf, algorithm=None):
        """sendbuf, recvbuf: mpi4py's v-specs ([buf, (counts, displs),
        datatype], ...; items of the datatype); sendbuf IN_PLACE: recvbuf's
        pieces are sent."""
        self._pieces("alltoallv", self._args.alltoallv(sendbuf, recvbuf), algorithm)

    @collective
    def Alltoallw(self, sendbuf, recvbuf, algorithm=None):
        """sendbuf, recvbuf: [buf, (counts, displs), datatypes], a
        (contiguous) datatype per rank, displacements in bytes (MPI's)."""
        self._pieces("alltoallw", self._args.alltoallv(sendbuf, recvbuf, True), algorithm)

    def _pieces(self, op, checked, algorithm):
        """Run an Alltoallv/w: every rank's row of pieces goes to every rank
        first (one Allgather), so all plan from the same table, and a piece
        whose size its two ranks disagree on raises on every rank alike."""
        sptr, sbytes, rptr, rbytes, row = checked
        if self._p2p_route(op, algorithm):
            return self._pieces_p2p(op, sptr, rptr, row)
        p = self.size
        every = np.empty((p, row.size), np.int64)
        self.Allgather(row, every)
        bad = [(i, j) for i in range(p) for j in range(p) if every[i, j] != every[j, 2 * p + i]]
        if bad:
            i, j = bad[0]
            raise MismatchError(f"{select.method(op)}: rank {i} sends rank {j} {every[i, j]} bytes but rank {j} "
                                f"receives {every[j, 2 * p + i]} from rank {i} ({len(bad)} pairs disagree)")
        table = tuple(tuple((int(every[i, j]), int(every[i, p + j]), int(every[j, 3 * p + i])) for j in range(p))
                      for i in range(p))
        alg = -1 if algorithm is None else select.IDS[op][select.check_name(op, algorithm)]
        self._run(op, (select.TABLE[op][0], alg, table), int(every[:, :p].max(initial=0)), 0, algorithm,
                  _addr(sptr), _addr(rptr), counts=table)

    def _p2p_route(self, op, algorithm):
        """Whether op (Alltoallv/w, Gatherv, Scatterv) goes by point-to-point:
        when automatic and not a nonblocking call's program.  Calls still
        pending end first; the route never depends on them, as a peer's
        may have ended already."""
        if algorithm is not None or self._forced.get(op) or self._capture == op:
            return False
        if self._pending:
            self._complete_pending()
        return True

    def _arrival(self, op, root):
        """The address of the arrival program of a call of op routed by
        point-to-point (csrc/p2p.c routed): no step, the call's signature
        (its algorithm ROUTED_ALG, no bytes: only a root knows them), so
        that it is numbered and checked as a schedule's call is; cached,
        and in the C cache, where the C entries find it."""
        cid = select.TABLE[op][0]
        key = isa.key(cid, isa.ROUTED_ALG, root, 0, 0, 0)
        if lib.sc_own(self._c):         # another thread is in a call: its program stays (as _run)
            self._fail(lib.SC_EBUSY, select.method(op))
        try:
            prog = self._dev.program(key, cid, isa.ROUTED_ALG,
                                     lambda: Schedule(op, select.ROUTED[op], self.size, 0, root, []), 0, 0)
        finally:
            lib.sc_disown(self._c)
        return prog.ctypes.data

    def _rooted(self, what, root, own, given, name):
        """The automatic Gatherv/Scatterv: one C call (csrc/p2p.c gatherv,
        scatterv) that moves each piece straight between its rank and the
        root, own being this rank's buffer and given the root's v-spec
        (name), read on the root alone: nothing goes to the other ranks
        first.  A piece whose size the root's counts and its rank disagree
        on aborts the job from the rank that receives it."""
        scatter = name == "sendbuf"
        other = "recvbuf" if scatter else "sendbuf"
        if own is IN_PLACE:
            self._args.in_place_root(what, root, name)
        row, base, keep = None, 0, None
        if self.rank == root:
            if given is None:
                raise ValueError(f"{what}: the root needs {name} [buf, counts, displs, dtype]")
            keep, total, item, _, counts, displs = spec.vspec(given, name, self.size, not scatter)
            if counts is None:
                raise ValueError(f"{what}: {name} needs counts")
            row = np.array([c * item for c in counts] + [d * item for d in displs], np.int64)
            base = _addr(keep)
        if own is IN_PLACE:
            addr, nbytes = base + int(row[self.size + root]), int(row[root])
        else:
            ptr, nbytes, _ = buffers.view(own, other, writable=scatter)
            addr = _addr(ptr)
            if row is not None:
                if nbytes != row[root]:
                    raise ValueError(f"{other} has {nbytes} bytes but the counts give rank {root} {counts[root]} "
                                     f"items of {item} bytes ({row[root]} bytes)")
                apart(addr, nbytes, base, total)
        self._talking = True
        s, r = (base, addr) if scatter else (addr, base)
        op = what.lower()
        rc, who, sent, wanted = P2P["routed"](self._ctx, isa.ROUTED_KIND[op], self._arrival(op, root), root, s, r,
                                              nbytes, row)
        if rc:
            self._pieces_failed(what, rc, (rc, who, sent, wanted))

    def _pieces_p2p(self, op, sptr, rptr, row):
        """The automatic Alltoallv/w: one C call that exchanges each pair's
        pieces by point-to-point (csrc/p2p.c alltoallv), with no table
        gathered first; a piece whose two ranks disagree on its size
        aborts the job from the rank that receives it."""
        self._talking = True
        rc, who, sent, wanted = P2P["routed"](self._ctx, isa.ROUTED_KIND[op], self._arrival(op, 0), 0, _addr(sptr),
                                              _addr(rptr), 0, row)
        if rc:
            self._pieces_failed(select.method(op), rc, (rc, who, sent, wanted))

    def _pieces_failed(self, what, rc, got):
        """A routed call's failure (Alltoallv/w, Gatherv, Scatterv; also their
        C entries'): raise, the job aborted."""
        self._usable()
        self._talking = True
        if rc == lib.SC_EMISMATCH and got[1] >= 0:     # a piece's size (else the records differ: _fail)
            _, who, sent, wanted = got
            exc = MismatchError(f"{what}: rank {who} sends rank {self.rank} {sent} bytes but rank {self.rank} "
                                f"receives {wanted} from rank {who}")
            if self.size == 1:          # found before anything moved, and no peer waits: the communicator goes on
                raise exc
            self._bad(exc)
        self._fail(rc, what)

    # -- reductions ------------------------------------------------------------
    @collective
    def Allreduce(self, sendbuf, recvbuf, op=SUM, algorithm=None):
        """recvbuf = sendbuf of rank 0 op ... op rank p-1's, element-wise;
        sendbuf IN_PLACE: the input is recvbuf."""
        self._reduction("allreduce", sendbuf, recvbuf, op, algorithm, lambda n: n)

    @collective
    def Reduce(self, sendbuf, recvbuf=None, op=SUM, root=0, algorithm=None):
        """The same into the root's recvbuf (None elsewhere); IN_PLACE on
        the root only."""
        root = self._args.root(root)
        if sendbuf is IN_PLACE and self.rank != root:
            raise ValueError(f"Reduce: IN_PLACE is for the root's sendbuf only (rank {self.rank} is not root {root})")
        self._reduction("reduce", sendbuf, recvbuf, op, algorithm, lambda n: n, root)

    @collective
    def Reduce_scatter_block(self, sendbuf, recvbuf, op=SUM, algorithm=None):
        """Rank s gets block s (recvbuf's size) of the reduction of p such
        blocks; IN_PLACE: recvbuf holds all p blocks, the result lands at
        its start."""
        self._reduction("reduce_scatter_block", sendbuf, recvbuf, op, algorithm, lambda n: n * self.size)

    @collective
    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM, algorithm=None):
        """Rank s gets recvcounts[s] items of the reduction (recvcounts: the
        same on every rank; None: each rank's recvbuf size, gathered);
        IN_PLACE: recvbuf holds the whole input, the result lands at its
        start."""
        op = ops.check_op(op)
        recvbuf = spec.simple(recvbuf, "recvbuf", True)
        rdt = buffers.dtype_of(recvbuf)
        if recvcounts is None:
            if sendbuf is IN_PLACE:
                raise ValueError("Reduce_scatter: IN_PLACE needs recvcounts (recvbuf holds the whole input)")
            _, rbytes, _ = buffers.view(recvbuf, "recvbuf", writable=True)
            every = np.empty(self.size, np.int64)
            self.Allgather(np.array([rbytes // rdt.itemsize], np.int64), every)
            recvcounts = every
        counts = [int(c) for c in buffers.ints(recvcounts, "Reduce_scatter: recvcounts", self.size)]
        displs = [int(d) for d in np.cumsum(counts) - counts]
        item = rdt.itemsize
        pieces = tuple((c * item, d * item) for c, d in zip(counts, displs))
        total = sum(n for n, _ in pieces)
        mine = pieces[self.rank][0]
        self._reduction("reduce_scatter", sendbuf, recvbuf, op, algorithm, lambda n: total if n == mine else None,
                        counts=pieces, tail=counts + displs)

    @collective
    def Scan(self, sendbuf, recvbuf, op=SUM, algorithm=None):
        """Rank r gets rank 0's op ... op rank r's input."""
        self._reduction("scan", sendbuf, recvbuf, op, algorithm, lambda n: n)

    @collective
    def Exscan(self, sendbuf, recvbuf, op=SUM, algorithm=None):
        """Rank r gets rank 0's op ... op rank r-1's input; rank 0's recvbuf
        is left as it is."""
        self._reduction("exscan", sendbuf, recvbuf, op, algorithm, lambda n: n)

    def _reduction(self, kind, sendbuf, recvbuf, op, algorithm, inputs, root=0, counts=None, tail=None):
        """Check (Args.reduction) and run a reduction; tail: Reduce_scatter's
        counts then displacements in items, which the fast entry keys by
        their fingerprint (its 'c' role)."""
        op, inplace, sptr, sbytes, rptr, rbytes, dt = self._args.reduction(kind, sendbuf, recvbuf, op, inputs, root,
                                                                           counts)
        if not op.builtin:
            return self._user_reduction(kind, op, sptr, sbytes, rptr, dt, root, counts)
        kern = ops.kernel(op, dt)
        learn_dtype(dt, dt.itemsize, np.ndarray)
        key = self._key(kind, algorithm, root, isa.KEY_INPLACE if inplace else sbytes, rbytes, self._dkey(dt))
        key = (key[0] | op.code << isa.KEY_OP_SHIFT,) + key[1:]          # the op, as the C entry keys it
        if tail is not None:
            key = key[:-1] + (fingerprint(tail[:self.size], tail[self.size:]),)
        self._run(kind, key, sbytes, root, algorithm, _addr(sptr), _addr(rptr), dt, counts, tail,
                  red=(op, kern, inplace))

    def _user_reduction(self, kind, op, sptr, sbytes, rptr, dt, root, counts):
        """A user op: every input to every rank that needs it (Allgather,
        or Gather to the root), folded here in rank order on whole blocks."""
        n = sbytes // dt.itemsize
        mine = np.frombuffer(ffi.buffer(sptr, sbytes), dt).copy()
        if kind == "reduce":
            every = np.empty((self.size, n) if self.rank == root else 0, dt)
            self.Gather(mine.view(np.uint8), every.view(np.uint8), root)
            if self.rank != root:
                return
        else:
            every = np.empty((self.size, n), dt)
            self.Allgather(mine.view(np.uint8), every.view(np.uint8))
        acc = objects.fold(every, op.block, {"scan": self.rank + 1, "exscan": self.rank}.get(kind, self.size))
        if acc is None:
            return
        if kind in ("reduce_scatter_block", "reduce_scatter"):
            b = counts or [(sbytes // self.size, r * sbytes // self.size) for r in range(self.size)]
            nb, off = b[self.rank]
            acc = acc.view(np.uint8)[off:off + nb]
        out = np.frombuffer(ffi.buffer(rptr, acc.nbytes), np.uint8)
        out[:] = np.ascontiguousarray(acc).view(np.uint8).reshape(-1)

    # -- objects (pickled: shmcoll.objects) -----------------------------------
    @locked
    @collective
    def bcast(self, obj, root=0):
        return objects.bcast(self, obj, self._args.root(root))

    @locked
    @collective
    def alltoall(self, objs):
        return objects.alltoall(self, objs)

    @locked
    @collective
    def allgather(self, obj):
        return objects.allgather(self, obj)

    @locked
    @collective
    def gather(self, obj, root=0):
        return objects.gather(self, obj, self._args.root(root))

    @locked
    @collective
    def scatter(self, objs, root=0):
        return objects.scatter(self, objs, self._args.root(root))

    @locked
    @collective
    def allreduce(self, obj, op=SUM):
        return objects.reduction(self, obj, op, self.size)

    @locked
    @collective
    def reduce(self, obj, op=SUM, root=0):
        root = self._args.root(root)
        return objects.reduction(self, obj, op, self.size, root)

    @locked
    @collective
    def scan(self, obj, op=SUM):
        return objects.reduction(self, obj, op, self.rank + 1)

    @locked
    @collective
    def exscan(self, obj, op=SUM):
        """None on rank 0."""
        return objects.reduction(self, obj, op, self.rank)

    def _root_vspec(self, what, given, name, root, writable, item, dt):
        """The root's v-spec (pointer, bytes, item size, dtype; None, None,
        item, dt elsewhere) and, on every rank, the root's counts and
        displacements."""
        ptr = nbytes = counts = displs = None
        if self.rank == root:
            if given is None:
                raise ValueError(f"{what}: the root needs {name} [buf, counts, displs, dtype]")
            ptr, nbytes, item, dt, counts, displs = spec.vspec(given, name, self.size, writable)
        counts, displs, item = self._root_counts(root, counts, displs, item)
        return ptr, nbytes, item, dt, counts, displs

    def _root_counts(self, root, counts, displs, item):
        """The root's counts, displacements and item size on every rank."""
        table = np.zeros(2 * self.size + 1, np.int64)
        if self.rank == root:
            table[:self.size], table[self.size:-1], table[-1] = counts, displs, item
        self.Bcast(table, root)
        n = self.size
        return tuple(int(c) for c in table[:n]), tuple(int(d) for d in table[n:2 * n]), int(table[-1])

    def _vrun(self, op, algorithm, root, sptr, sbytes, rptr, rbytes, item, dt, counts, displs, own):
        """Run a v-variant: counts/displs in items of item bytes, every
        rank's piece checked against its own buffer `own`."""
        mine = counts[self.rank] * item
        have = sbytes if own == "sendbuf" else rbytes
        if have != mine:
            raise ValueError(f"{own} has {have} bytes but the counts give rank {self.rank} {counts[self.rank]} "
                             f"items of {item} bytes ({mine} bytes)")
        pieces = tuple((c * item, d * item) for c, d in zip(counts, displs))
        s0, r0 = _addr(sptr), _addr(rptr)
        if sptr is not None and rptr is not None:
            apart(s0, sbytes, r0, rbytes)
        agreed = None
        if op == "allgatherv":          # the fast entry's key: this rank's counts and displacements
            tail = list(counts) + list(displs)
            key = self._key(op, algorithm, 0, sbytes, rbytes, self._dkey(dt))[:-1] + (fingerprint(counts, displs),)
            agreed = tuple(n for n, _ in pieces)    # displacements are each rank's own layout (MPI)
        else:
            alg = -1 if algorithm is None else select.IDS[op][select.check_name(op, algorithm)]
            key, tail = (select.TABLE[op][0], alg, root, buffers.dtype_code(dt), pieces), None
        self._run(op, key, sum(n for n, _ in pieces), root, algorithm, s0, r0, dt, pieces, tail, agreed=agreed)

    # -- lifetime -------------------------------------------------------------
    def Shrink(self):
        """ULFM's MPIX_Comm_shrink (mpi4py's Comm.Shrink): a new
        communicator of the ranks still alive, in their order, once every
        survivor has called it.  Only a communicator of
        pool.run(..., on_failure="shrink") can shrink (docs/pool.md)."""
        shrinker = getattr(self, "_shrinker", None)
        if shrinker is None:
            raise NotImplementedError("Shrink: only the communicator of shmcoll.Pool.run(..., on_failure='shrink') "
                                      "can shrink (docs/pool.md)")
        return shrinker()

    def Free(self):
        """Leave the communicator: peers see a clean exit, and calls here raise.
        A root's calls wait on no one, so ranks that made different numbers
        of calls may all return from theirs: of two leaving, the later
        raises MismatchError (the earlier has gone) rather than the job
        ending as a success with the extra calls read by no one.  So do
        roots whose last calls differ (the later sees the other's record
        in its last look, csrc/exec.c recheck)."""
        if self._freed:
            return
        self._freed = True
        self._free_pending()
        rc = lib.sc_last_look(self._c) if self._broken is None else 0
        other = self._dev.deregister(self._broken is None and not rc)
        self._break(MPIError(ERR_COMM, f"{self._label()} was freed on rank {self.rank}; it cannot be used"))
        try:
            self._check_free(rc, other)
        finally:
            self._release()

    def _check_free(self, rc, other):
        if rc:
            op = select.OPS.get(isa.get(isa.SIG_FIELD["collective"], self._c.prev))
            what = select.method(op) if op else "Free"
            raise self._dev.failure(rc, what, functools.partial(field, what))
        if other is not None:
            r, theirs, ours = other
            raise MismatchError(f"Free: the ranks made different numbers of calls: rank {r} left after {theirs}, "
                                f"rank {self.rank} after {ours} (calls that wait on no one, a root's or a "
                                f"point-to-point Gatherv's, reached no one)")
