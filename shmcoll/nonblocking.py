"""Nonblocking (Ibcast, ...) and persistent (Bcast_init, ...) collectives:
a mixin of Comm.  Each checks and plans exactly as its blocking method
does (it runs that method with the program captured instead of run:
Comm._run), then starts the same compiled program as a resumable run of
the executor, queued on the communicator behind the calls started before
it (csrc/nbc.c).  A start never waits for a peer; Test steps the queue
without blocking, Wait runs it, and for calls of BACKGROUND_BYTES and
more a progress thread of the communicator steps it while the caller
computes, where the ranks leave a CPU spare for it (with none, the
thread only takes turns with its rank: an Allreduce_init of 64 KiB took
4x the blocking call at 4 ranks on 2 CPUs).  A blocking call first
completes the nonblocking ones started before it (MPI orders a
communicator's collectives alike on every rank);
the C fast entries decline to the Python path while any are pending
(bit PENDING of the closed word, one test they already make).

What runs at the start, blocking, before the nonblocking program: the
helper calls some blocking methods make (Gatherv's and Scatterv's
exchange of the root's counts, Reduce_scatter's of recvcounts when none
are given, Allgatherv's of sizes when recvbuf has no counts) and user-op
reductions, which fold in Python over blocking calls: the request is
then complete when returned.  docs/nonblocking.md."""
import functools
import os
import struct
import threading

import numpy as np

from ._core import ffi, lib
from .device import _new_cfunction
from .errors import ArgumentError, ShmcollError
from .buffers import IN_PLACE
from .args import keeping
from .request import Complete, Prequest, Request, register
from .topology import spare_cpus
from . import spec

BACKGROUND_BYTES = 64 << 10     # from here a call's run overlaps the caller's work on the progress thread
PENDING = lib.SC_CLOSED_PENDING  # the bit of sc_comm_t.closed that sends the fast entries to Python

COLLECTIVES = ("Barrier", "Bcast", "Allreduce", "Reduce", "Allgather", "Allgatherv", "Alltoall", "Alltoallv",
               "Alltoallw", "Gather", "Gatherv", "Scatter", "Scatterv", "Reduce_scatter", "Reduce_scatter_block", "Scan",
               "Exscan")

_WHOLE = object()                # _held: a call that cannot be split into checks and one program
#: id of a communicator's state -> the communicator, while it has started calls not yet collected (held, so
#: that they go on; a handle, MPI.Comm(comm), shares comm's state and equals it)
_busy = {}
#: A communicator's pending list and its PENDING bit change together under it: a request may be completed by
#: another thread than the one starting the next (the torch backend's completion thread)
_lock = threading.Lock()


def _poll():
    """request.progress: step every communicator's queue without blocking."""
    if not _busy:
        return
    for comm in list(_busy.values()):
        if comm._broken is not None:
            _busy.pop(id(comm.__dict__), None)     # nothing steps a broken communicator's calls
        else:
            last = comm._pending[-1:]       # another thread may collect the last one meanwhile
            if last:
                lib.sc_nb_test(comm._c, last[0]._st)


register(_poll)


def _spare_cpu(comm):
    """Whether comm's ranks may run on more CPUs than there are ranks (a progress thread's room)."""
    got = comm.__dict__.get("_spare_cpu")
    if got is None:
        got = comm.__dict__["_spare_cpu"] = spare_cpus(comm.slots) > 0
    return got


def _template(comm, got):
    """What every start of a captured program (prog, saddr, raddr, what,
    nbytes) shares, whatever its buffers: (the program, its twin's block,
    what, the program as C reads it, whether it runs in the background)."""
    prog, _, _, what, nbytes = got
    twin = next((t for t in comm._dev._twins.values() if t[0].ctypes.data == prog[7]), None) if prog[7] else None
    return prog, twin, what, prog.ctypes.data, nbytes >= BACKGROUND_BYTES and _spare_cpu(comm)


def _exports(args, kw):
    """Buffer exports of the arguments that are neither numpy arrays nor
    plain values (a bytearray, an array.array, a spec's buffer), held while
    the call runs: as mpi4py's, resizing one then raises BufferError
    instead of moving memory C writes to."""
    held = []
    for v in (*args, *kw.values()) if kw else args:
        if type(v) is np.ndarray:
            continue                    # the common case: numpy refuses to resize an array others hold
        if isinstance(v, (list, tuple)) and v:
            v = v[0]
        if not isinstance(v, (np.ndarray, int, float, str, type(None))):
            try:
                held.append(memoryview(v))
            except (TypeError, ValueError, BufferError):
                pass                    # not a buffer (an op, IN_PLACE, a datatype)
    return held


class _Run:
    """One started program: its C state (sc_nbc_t) and what must outlive
    it (the program, a twin's block, the scratch, the caller's buffers and
    their exports)."""

    def __init__(self, comm, template, saddr, raddr, keep, st=None):
        prog, twin, self.what, addr, background = self.template = template
        self.keep = (prog, twin, comm._dev._tmp, keep, _exports(keep[0], keep[1]))
        if st is None:
            self.st = ffi.new("sc_nbc_t *")
            lib.sc_nb_bind(comm._c, self.st, addr, saddr, raddr, background)
        else:                           # bound and started by C (pyfast.c start_known)
            self.st = st


class _Collective:
    """What a nonblocking and a persistent collective request share: run
    st on comm, and complete (collect) it once C says it is done."""

    def _bind(self, comm, run):
        self._comm, self._run, self._st = comm, run, run.st if run else None
        self._rc = None

    def _go(self):
        self._comm._usable()
        self._started(lib.sc_nb_start(self._comm._c, self._st))

    def _started(self, rc):
        """After C started st: unless it ended inline, it is pending."""
        comm = self._comm
        self._rc = None
        if rc:
            raise MemoryError(f"{self._run.what}: no memory for the progress thread or the queue")
        if self._st.fast:
            return
        with _lock:
            if not comm._pending:
                comm._pending = []
                _busy[id(comm.__dict__)] = comm
            comm._pending.append(self)
            comm._c.closed |= PENDING

    def _test(self):
        if self._st is None or self._st.fast:
            return True
        if self._rc is None:
            if not lib.sc_nb_test(self._comm._c, self._st):
                return False
            self._collect(self._st.rc)
        return self._settled()

    def _wait(self):
        if self._st is not None and not self._st.fast and self._rc is None:
            self._collect(lib.sc_nb_wait(self._comm._c, self._st))
        self._settled()

    def _drive(self, spin_ns):
        """Wait from a thread of the rank's own while the caller's thread
        goes on starting calls (sc_nb_drive: busy let go at every wait;
        spin_ns 0 when the two share a CPU); Wait() then completes it."""
        if self._st is not None and not self._st.fast and self._rc is None:
            rc = lib.sc_nb_drive(self._comm._c, self._st, spin_ns)
            if rc and self._comm._freed:    # Free stopped it: nothing of the device is there to read
                self._rc = rc
                self._comm._usable()
                raise ShmcollError(f"{self._run.what}: the communicator was freed while the call was pending")
            self._collect(rc)
        self._settled()

    def _collect(self, rc):
        """C is done with st: out of the pending list; a failure raises as
        the blocking call would (the communicator is then broken).  Once:
        two threads may wait for it at the same time."""
        comm = self._comm
        with _lock:
            if self._rc is not None:
                return
            self._rc = rc
            comm._pending.remove(self)
            if not comm._pending:
                _busy.pop(id(comm.__dict__), None)     # every call's progress() walks _busy: only those pending
                if comm._broken is None:
                    comm._c.closed &= ~PENDING
        if rc:
            st, c = self._st, comm._c
            c.err_rank, c.err_code, c.err_when = st.err_rank, st.err_code, st.err_when
            c.err_call, c.err_a, c.err_b = st.err_call, st.err_a, st.err_b
            comm._fail(rc, self._run.what)

    def _settled(self):
        if self._rc:
            self._comm._usable()        # raised at collection; any later look raises what broke it
        return True


class CollectiveRequest(_Collective, Request):
    """A started nonblocking collective."""

    def _complete(self):
        if self._run is not None:
            self._run.keep = None       # C is done: the buffers' exports go (a bytearray may be resized again)
        return Request._complete(self)

    def __init__(self, comm, run, rc=None):
        Request.__init__(self)
        self._bind(comm, run)
        if run is None:
            return                      # it ran blocking at the start (see the module's docstring)
        if rc is None:
            self._go()
        else:                           # started by the caller
            self._started(rc)


class PersistentCollective(_Collective, Prequest):
    """A persistent collective: the program compiled and its buffers bound
    at _init; each Start only runs it."""

    def __init__(self, comm, run=None):
        if run is None:             # Prequest(req) made a handle of this class (request._handle): req's state
            return
        self._bind(comm, run)
        Prequest.__init__(self)
        info = struct.pack("PP", int(ffi.cast("uintptr_t", comm._c)), int(ffi.cast("uintptr_t", run.st)))
        slow = (functools.partial(Prequest.Start, self), self._fast_pended, functools.partial(Prequest.Wait, self))
        self.Start = _new_cfunction(int(ffi.cast("uintptr_t", lib.sc_py_entry(4))), (info,) + slow[:2], None)
        if run.refresh is not None:       # a copied IN_PLACE block: copied again at each start, then started
            self.Start = functools.partial(_refreshed_start, run.refresh, self.Start)
        self.Wait = _new_cfunction(int(ffi.cast("uintptr_t", lib.sc_py_entry(5))), (info,) + slow, None)

    # active: in C, which the C Start and Wait (pyfast.c) read and set
    _active = property(lambda self: bool(self._st.active), lambda self, v: setattr(self._st, "active", int(v)))

    def _start(self):
        self._go()

    def _fast_pended(self, rc):
        """The C Start started it but it did not end inline."""
        self._started(rc)

    def Free(self):
        if self._active:
            self.Wait()
        super().Free()


class Nonblocking:
    """Comm's nonblocking and persistent collective methods."""
    _capture = None                 # Comm._run: the collective whose program to capture, then the capture
    _pending = ()                   # requests started and not yet collected, in call order
    _nb_resolvers = {}              # name -> the C entry resolving a call's program (Comm.__init__)
    _nb_known = {}                  # program address -> its template, for the calls the resolvers start (_nonblocking)

    def _spare(self):
        """A fresh spare state for the resolvers' starts (pyfast.c
        start_known); the one C took, which this communicator now holds."""
        taken = self.__dict__.get("_nb_spare")
        self._nb_spare = ffi.new("sc_nbc_t *")
        self._c.nb_spare = self._nb_spare
        return taken

    def _plan_only(self, name, args, kw):
        """Check and plan as the blocking method does; the captured program
        (None if the method ran to the end: a user op)."""
        self._usable()
        self._capture = name.lower()
        try:
            getattr(type(self), name)(self, *args, **kw)
            got = self._capture
        finally:
            self._capture = None
        return got if isinstance(got, tuple) else None

    def _prepare(self, name, args, kw):
        kw.pop("info", None)
        self._usable()
        try:
            whole = self._held(name, args, kw)
        except ShmcollError as e:
            if not isinstance(e, ArgumentError):
                raise
            self._bad(e)
        except BaseException as e:      # as the blocking method's checks: the peers raise too
            self._bad(e)
        if whole is _WHOLE:
            getattr(type(self), name)(self, *args, **kw)
            return None
        with keeping() as made:         # IN_PLACE's own blocks and pieces, copied or scratch
            got = self._plan_only(name, args, kw)
        if got is None:
            return None
        run = _Run(self, _template(self, got), got[1], got[2], (args, kw, made))
        run.refresh = _refresh(made)
        return run

    def _held(self, name, args, kw):
        """_WHOLE when the call cannot be split into checks and one program
        (Allgatherv without counts: the sizes ride with the data over
        blocking calls), else None."""
        if name == "Allgatherv":
            sendbuf = args[0] if args else kw.get("sendbuf")
            recvbuf = args[1] if len(args) > 1 else kw.get("recvbuf")
            if spec.vspec(recvbuf, "recvbuf", self.size, True, derive=sendbuf is IN_PLACE)[4] is None:
                return _WHOLE
        return None

    def _owned(self, capture):
        """Comm._run found the context owned: by our progress thread for a
        step (a nonblocking call's planning waits it out), or by another
        thread of the user's (an error).  Whether we own it now."""
        if not (capture and self._pending):
            return False
        while lib.sc_own(self._c):
            os.sched_yield()            # a step never waits for a peer; the stepping thread may share our CPU
        return True

    def _complete_pending(self):
        """Before a blocking call: wait for every started call (a failure
        raises here, as it will in its own Wait)."""
        for r in list(self._pending):
            r._wait()

    def _free_pending(self):
        """Free: the started calls end first (MPI: freeing a communicator
        with pending calls is erroneous; here they complete), then the
        progress thread."""
        try:
            if self._broken is None:
                self._complete_pending()
        finally:
            lib.sc_nb_stop(self._c)
            _busy.pop(id(self.__dict__), None)


def _refresh(made):
    """What a persistent request's Start does first when its planning copied
    this rank's IN_PLACE block or piece (args.keeping): copy them again (MPI
    reads the buffers at each start, not at _init).  None when nothing was
    copied."""
    copies = [(raw, np.frombuffer(ffi.buffer(ffi.cast("char *", at), raw.nbytes), np.uint8))
              for raw, at in made if at is not None]
    if not copies:
        return None
    return functools.partial(_copy_all, copies)


def _copy_all(copies):
    for dst, src in copies:
        np.copyto(dst, src)


def _refreshed_start(refresh, start):
    refresh()
    start()


_KNOWN = 64      # programs whose templates a communicator keeps
#: The calls a resolver (Comm._nb_resolvers) may start without Python's
#: planning: those whose planning makes no call of its own (Gatherv's and
#: Scatterv's exchange of counts, Reduce_scatter's, would be skipped on the
#: ranks that resolve, and not on the others).
RESOLVED = frozenset(("Barrier", "Bcast", "Allreduce", "Reduce", "Allgather", "Alltoall", "Gather", "Scatter",
                      "Reduce_scatter_block", "Scan", "Exscan"))


def _nonblocking(name):
    def method(self, *args, **kw):
        """A call whose program the blocking call's C entry holds, plain
        buffers and no IN_PLACE block copies (its resolver: csrc/pyfast.c)
        starts it at once: its Python planning is 25-30 us, the start a
        few; once a start made its template known, the resolver starts it
        in C (start_known)."""
        resolve = self._nb_resolvers.get(name)
        got = None if resolve is None else resolve(*args, **kw)
        if type(got) is Complete:       # C started it, and it ended there
            return got
        known = self._nb_known
        template = None if got is None else known.get(got[0])
        if got is not None and len(got) == 4:   # C started it on the spare state: pending
            return CollectiveRequest(self, _Run(self, template, got[1], got[2], (args, kw, None), self._spare()),
                                     got[3])
        if template is not None:
            self._usable()
            run = _Run(self, template, got[1], got[2], (args, kw, None))
            rc = lib.sc_nb_start(self._c, run.st)
            if not rc and run.st.fast:          # it ended in its start: nothing to keep
                return object.__new__(Complete)
            return CollectiveRequest(self, run, rc)
        run = self._prepare(name, args, kw)
        if resolve is not None and run is not None and not run.keep[3][2]:
            self._c.nb_spare = ffi.NULL     # only resolve: a template known from before would start it again
            try:
                got = resolve(*args, **kw)  # planning installed the program where the resolver finds it
            finally:
                self._c.nb_spare = self._nb_spare
            if got is not None and run.keep[0].ctypes.data == got[0]:
                if len(known) >= _KNOWN:
                    known.clear()
                known[got[0]] = run.template    # it holds the program: the address names it while kept
        return CollectiveRequest(self, run)
    method.__name__ = method.__qualname__ = "I" + name[0].lower() + name[1:]
    method.__doc__ = f"Nonblocking {name}: the same arguments; a Request, complete at Wait."
    return method


def _persistent(name):
    def method(self, *args, **kw):
        run = self._prepare(name, args, kw)
        if run is None:     # every rank ran it (the same call everywhere): the communicator is as it was
            raise NotImplementedError(f"{name}_init with a user op, or without counts: it ran once, blocking; "
                                      f"a persistent request cannot repeat it")
        return PersistentCollective(self, run)
    method.__name__ = method.__qualname__ = name + "_init"
    method.__doc__ = f"Persistent {name} (MPI-4): planned and compiled once, buffers bound; Start runs it."
    return method


for _name in COLLECTIVES:
    setattr(Nonblocking, "I" + _name[0].lower() + _name[1:], _nonblocking(_name))
    setattr(Nonblocking, _name + "_init", _persistent(_name))
