"""Requests and Status, with mpi4py's interface: one handle for whatever
completes later (a nonblocking point-to-point or collective call, a
persistent one once started).

Progress needs no thread: every Wait and Test, and every blocking call
that waits, calls progress(), which advances the pending work of every
engine registered here (point-to-point, nonblocking collectives), so a
request completes even while its owner waits on another.  An engine's
poll must be safe from any thread (it takes its own lock)."""
import array
import os
import weakref

from .errors import MPIError

PROC_NULL = -1          # MPICH's values: a program that prints them sees what it would under MPICH
ANY_SOURCE = -2
ANY_TAG = -1
UNDEFINED = -32766
SUCCESS = 0

_engines = []


def register(poll):
    """poll() -> None advances one engine's pending work without blocking."""
    if poll not in _engines:
        _engines.append(poll)


def unregister(poll):
    if poll in _engines:
        _engines.remove(poll)


def progress():
    for poll in tuple(_engines):
        poll()


def _itemsize(datatype):
    """Bytes of one item of datatype: an MPI datatype (Get_size), a numpy
    dtype or its name; None counts bytes."""
    if datatype is None:
        return 1
    if hasattr(datatype, "Get_size"):
        return datatype.Get_size()
    import numpy as np
    return np.dtype(datatype).itemsize


def _element(datatype):
    """The element type of an MPI datatype (duck-typed), else datatype."""
    return datatype.base if hasattr(datatype, "base") and hasattr(datatype, "Get_size") else datatype


class Status:
    """What a completed receive (or probe) found: source, tag, error and
    the message's size in bytes; count and elements per datatype.  The
    fields live in one array of five int64 (bytes, cancelled, source, tag,
    error), which tomemory() hands out writable, as mpi4py's does with
    MPI_Status."""
    __slots__ = ("_m",)
    _FIELDS = ("nbytes", "cancelled", "source", "tag", "error")

    def __init__(self, status=None):
        self._m = array.array("q", (0, 0, ANY_SOURCE, ANY_TAG, SUCCESS))
        if status is not None:
            if not isinstance(status, Status):
                raise TypeError(f"Status() takes a Status, not {type(status).__name__}")
            self._set(status)

    def _set(self, other):
        self._m[:] = other._m

    def _found(self, source, tag, nbytes, error=SUCCESS):
        m = self._m
        m[0], m[1], m[2], m[3], m[4] = nbytes, 0, source, tag, error

    def tomemory(self):
        return memoryview(self._m)

    def __reduce__(self):
        return _status, (tuple(self._m),)

    nbytes = property(lambda self: self._m[0], lambda self, v: self._m.__setitem__(0, v))
    count = nbytes                  # mpi4py's property: bytes
    cancelled = property(lambda self: bool(self._m[1]), lambda self, v: self._m.__setitem__(1, bool(v)))
    source = property(lambda self: self._m[2], lambda self, v: self._m.__setitem__(2, v))
    tag = property(lambda self: self._m[3], lambda self, v: self._m.__setitem__(3, v))
    error = property(lambda self: self._m[4], lambda self, v: self._m.__setitem__(4, v))

    def Get_source(self):
        return self.source

    def Set_source(self, source):
        self.source = source

    def Get_tag(self):
        return self.tag

    def Set_tag(self, tag):
        self.tag = tag

    def Get_error(self):
        return self.error

    def Set_error(self, error):
        self.error = error

    def Get_count(self, datatype=None):
        """Items of datatype in the message (default bytes); UNDEFINED when
        the bytes are not a whole number of them."""
        size = _itemsize(datatype)
        if size == 0:
            return 0 if self.nbytes == 0 else UNDEFINED
        return self.nbytes // size if self.nbytes % size == 0 else UNDEFINED

    def Get_elements(self, datatype):
        """Basic elements in the message: an MPI datatype's items hold
        .count elements of its .base each (contiguous datatypes)."""
        return self.Get_count(_element(datatype))

    def Set_elements(self, datatype, count):
        self.nbytes = count * _itemsize(_element(datatype))

    def Is_cancelled(self):
        return self.cancelled

    def Set_cancelled(self, flag):
        self.cancelled = bool(flag)

    def __eq__(self, other):
        return isinstance(other, Status) and self._m == other._m

    __hash__ = None

    def __repr__(self):
        return f"<Status source={self.source} tag={self.tag} bytes={self.nbytes} error={self.error}>"


#: An empty status (ANY_SOURCE, ANY_TAG, 0 bytes): what a send or an
#: inactive request reports.  Shared, so never handed out: _fill copies it.
_EMPTY = Status()


def _status(fields):
    st = Status()
    st._m[:] = array.array("q", fields)
    return st


def _fill(status, got):
    if status is not None and got is not None:
        status._set(got)


def _failed(status, e):
    """A receive's own error into status, as MPI's single completions fill
    it: the truncated message's source, tag and size (its error field is
    for the calls on many)."""
    if status is not None and e.found is not None:
        status._found(*e.found)


class Request:
    """A pending operation.  Subclasses implement _test() -> bool (advance
    without blocking; True once complete, self._status and self._result
    set) and may override _wait() (block until complete, raising what the
    operation raised) and _cancel().  A completed request becomes
    inactive: further Waits return at once with an empty status, as in
    MPI, and null (== REQUEST_NULL, false), as MPI sets a completed
    handle; a persistent one only when freed.  Request() is a null one;
    Request(req) and Prequest(preq) are other handles to req (mpi4py's):
    of exactly that class, equal to req, sharing its state."""
    _null = False

    def __new__(cls, *args, **kw):
        if len(args) == 1 and not kw and cls in (Request, Prequest):
            return _handle(args[0], cls)
        return object.__new__(_Null if cls is Request else cls)

    def __init__(self, *handle):
        if handle:                  # Request(req): __new__ made the handle, req's state stays as it is
            return
        self._active = True
        self._status = _EMPTY
        self._result = None

    # -- what subclasses provide ---------------------------------------------
    def _test(self):
        raise NotImplementedError

    def _wait(self):
        spins = 0
        while not self._test():
            progress()
            spins += 1
            if spins > 64:          # others' turn on the CPU while ours has nothing to do
                os.sched_yield()

    def _cancel(self):
        """Cancel if still possible; the status then reads cancelled."""

    def _idle(self):
        """Let the CPU go a moment while waiting on several requests (Waitany,
        Waitsome); an override also checks that the peers it waits on live."""
        os.sched_yield()

    # -- mpi4py's interface -------------------------------------------------------
    def _complete(self):
        """Deactivate and hand back (status, result)."""
        self._active = False
        self._null = not isinstance(self, Prequest)
        st, res = self._status, self._result
        self._status, self._result = _EMPTY, None
        return st, res

    def Wait(self, status=None):
        if self._active:
            try:
                self._wait()
            except MPIError as e:
                _failed(status, e)
                raise
            _fill(status, self._complete()[0])
        else:
            _fill(status, _EMPTY)
        return True

    def Test(self, status=None):
        return self._look(status, True)

    def Get_status(self, status=None):
        """Whether it has completed, without completing it."""
        return self._look(status, False)

    def _look(self, status, complete):
        if not self._active:
            _fill(status, _EMPTY)
            return True
        progress()
        try:
            if not self._test():
                return False
        except MPIError as e:
            _failed(status, e)
            raise
        _fill(status, self._complete()[0] if complete else self._status)
        return True

    def Cancel(self):
        if self._active:
            self._cancel()

    def Free(self):
        """Drop the handle; the operation still completes (MPI_Request_free)."""
        self._active, self._null = False, True

    def wait(self, status=None):
        """Wait and return the received object (None for a send)."""
        if not self._active:
            _fill(status, _EMPTY)
            return None
        self._wait()
        st, res = self._complete()
        _fill(status, st)
        return res

    def test(self, status=None):
        """(done, object or None)."""
        if not self._active:
            _fill(status, _EMPTY)
            return True, None
        progress()
        if not self._test():
            return False, None
        st, res = self._complete()
        _fill(status, st)
        return True, res

    def __bool__(self):
        return not self._null

    def __eq__(self, other):
        if self is other or getattr(other, "__dict__", None) is self.__dict__:
            return True
        return isinstance(other, Request) and self._null and other._null

    def __hash__(self):
        return id(self.__dict__)

    @property
    def handle(self):
        """An int naming this request while it lives (fromhandle's argument; toint and py2f give it too)."""
        key = id(self.__dict__)
        _handles[key] = self
        return key

    def toint(self):
        return self.handle

    py2f = toint

    @classmethod
    def fromhandle(cls, handle):
        """Another handle, of class cls, to the request whose handle this is."""
        req = _handles.get(handle)
        if req is None:
            raise ValueError(f"{cls.__name__}.fromhandle: {handle!r} names no live request")
        return _handle(req, cls)

    fromint = f2py = fromhandle

    # -- on many ---------------------------------------------------------------
    @staticmethod
    def Waitall(requests, statuses=None):
        for i, r in enumerate(requests):
            st = Status() if statuses is not None else None
            r.Wait(st)
            if statuses is not None:
                _store(statuses, i, st)
        return True

    @staticmethod
    def waitall(requests, statuses=None):
        out = []
        for i, r in enumerate(requests):
            st = Status() if statuses is not None else None
            out.append(r.wait(st))
            if statuses is not None:
                _store(statuses, i, st)
        return out

    @staticmethod
    def Testall(requests, statuses=None):
        if not all(r.Get_status() for r in requests):
            return False
        return Request.Waitall(requests, statuses)

    @staticmethod
    def testall(requests, statuses=None):
        if not all(r.Get_status() for r in requests):
            return False, None
        return True, Request.waitall(requests, statuses)

    @staticmethod
    def Waitany(requests, status=None):
        """Index of one completed request (UNDEFINED if none is active)."""
        return Request.waitany(requests, status)[0]

    @staticmethod
    def Testany(requests, status=None):
        """(index, True) once one completes; (UNDEFINED, True) if none is active."""
        return Request.testany(requests, status)[:2]

    @staticmethod
    def waitany(requests, status=None):
        """(index, object) of one completed request."""
        i, st, res = _until(requests, lambda: _any(requests))
        _fill(status, st)
        return i, res

    @staticmethod
    def Waitsome(requests, statuses=None):
        """Indices of the requests that completed (at least one), or None if none is active."""
        return Request.waitsome(requests, statuses)[0]

    @staticmethod
    def Testsome(requests, statuses=None):
        return Request.testsome(requests, statuses)[0]

    @staticmethod
    def Cancel_all(requests):
        for r in requests:
            r.Cancel()

    @staticmethod
    def Get_status_all(requests, statuses=None):
        """Whether all have completed, completing none (statuses: of those, once all have)."""
        got = []
        for r in requests:
            got.append(Status())
            if not r.Get_status(got[-1]):
                return False
        for i, st in enumerate(got if statuses is not None else ()):
            _store(statuses, i, st)
        return True

    @staticmethod
    def Get_status_any(requests, status=None):
        """(index, True) of one completed request, not completing it; (UNDEFINED, True) if none is active."""
        active = [i for i, r in enumerate(requests) if r._active]
        if not active:
            _fill(status, _EMPTY)
            return UNDEFINED, True
        for i in active:
            if requests[i].Get_status(status):
                return i, True
        return UNDEFINED, False

    @staticmethod
    def Get_status_some(requests, statuses=None):
        """Indices of the completed requests, not completing them; None if none is active."""
        active = [i for i, r in enumerate(requests) if r._active]
        if not active:
            return None
        done = []
        for i in active:
            st = Status()
            if requests[i].Get_status(st):
                done.append(i)
                if statuses is not None:
                    _store(statuses, i, st)
        return done

    @staticmethod
    def testany(requests, status=None):
        """(index, done, object)."""
        got = _any(requests)
        if got is _NOT_YET:
            return UNDEFINED, False, None
        _fill(status, got[1])
        return got[0], True, got[2]

    @staticmethod
    def testsome(requests, statuses=None):
        """(indices, objects) of those completed now; (None, None) if none is active."""
        active = [i for i, r in enumerate(requests) if r._active]
        if not active:
            return None, None
        progress()
        done, objs = [], []
        for i in active:
            if requests[i]._test():
                st, res = requests[i]._complete()
                done.append(i)
                objs.append(res)
                if statuses is not None:
                    _store(statuses, i, st)
        return done, objs

    @staticmethod
    def waitsome(requests, statuses=None):
        """(indices, objects) of at least one completed request; (None, None) if none is active."""
        return _until(requests, lambda: _some(Request.testsome(requests, statuses)))

    def get_status(self, status=None):
        return self.Get_status(status)

    cancel = Cancel
    get_status_all = Get_status_all
    get_status_any = Get_status_any
    get_status_some = Get_status_some


class Complete(Request):
    """A call complete when made (an eager Isend in its ring, a nonblocking
    collective that ended in its start), made without __init__ (by C, or
    object.__new__), so the class holds a fresh one's fields.
    Request.Waitall completes it in C (csrc/p2p.c waitall).  Its Wait,
    as every call, advances the engines' pending work."""
    _active, _status, _result = True, _EMPTY, None

    def _test(self):
        return True

    def Wait(self, status=None):
        progress()
        if status is not None:
            status._set(self._status if self._active and self._test() else _EMPTY)
        self._active, self._null = False, True
        return True


class Done(Request):
    """A request complete when made (a matched message's receive, a buffered send, Idup)."""

    def __init__(self, status=None, result=None):
        super().__init__()
        self._st, self._res = status or _EMPTY, result

    def _test(self):
        self._status, self._result = self._st, self._res
        return True


def _any(requests):
    """(index, status, object) of one request found complete, or
    (UNDEFINED, an empty status, None) if none is active; _NOT_YET if none is yet."""
    active = [i for i, r in enumerate(requests) if r._active]
    if not active:
        return UNDEFINED, Status(), None
    progress()
    for i in active:
        if requests[i]._test():
            return (i,) + requests[i]._complete()
    return _NOT_YET


_NOT_YET = object()


def _some(got):
    """testsome's answer as waitsome's: _NOT_YET while it found none."""
    return got if got[0] is None or got[0] else _NOT_YET


def _until(requests, poll):
    """poll() until it answers (not _NOT_YET), letting the CPU go between
    tries once they have lasted (the first active request's _idle)."""
    spins = 0
    while (got := poll()) is _NOT_YET:
        spins += 1
        if spins > 64:
            _idle(requests)
    return got


def _idle(requests):
    """The first active request's idle: a peer's death there raises."""
    next((r for r in requests if r._active), _NULL_IDLE)._idle()


def _store(statuses, i, st):
    """Into statuses[i]: a Status there is filled; a list grows to hold it (a tuple's other items stay)."""
    if i < len(statuses) and isinstance(statuses[i], Status):
        statuses[i]._set(st)
    elif isinstance(statuses, list):
        st = Status(st)             # the caller's own: st may be the shared empty one
        if i < len(statuses):
            statuses[i] = st
        else:
            statuses.append(st)


class Prequest(Request):
    """A persistent request: made inactive, started again and again
    (Start), each start complete at its Wait.  Subclasses implement
    _start()."""

    def __init__(self, *handle):
        if handle:
            return
        super().__init__()
        self._active = False

    def _start(self):
        raise NotImplementedError

    def Start(self):
        if self._active:
            raise RuntimeError("Start of a persistent request that is still active: Wait for it first")
        self._start()
        self._active = True

    @staticmethod
    def Startall(requests):
        for r in requests:
            r.Start()


class _Null(Request):
    """REQUEST_NULL: never active."""
    _null = True

    def __init__(self, *args):
        super().__init__()
        self._active = False

    def _test(self):
        return True


REQUEST_NULL = _NULL_IDLE = _Null()
_handles = weakref.WeakValueDictionary()       # handle -> a live request (Request.handle, fromhandle)


def _handle(req, cls):
    """Another handle to req, of class cls: its __dict__ is req's, with
    req's own methods (what its subclass implements) bound into it, so the
    handle acts as req does and either sees what the other did."""
    if not isinstance(req, Request):
        raise TypeError(f"{cls.__name__}(request): a request is needed, not {type(req).__name__}")
    d = req.__dict__
    if isinstance(getattr(type(req), "_active", None), property):
        cls = type(req)         # its state is C's, read through its class's properties (PersistentCollective)
    else:
        for name in ("_null", "_active", "_status", "_result"):    # a class may hold them (Complete)
            d.setdefault(name, getattr(req, name))
    for klass in type(req).__mro__:
        if klass in (Prequest, Request):
            break
        for name, f in vars(klass).items():
            if name.startswith("_") and not name.startswith("__") and callable(f) and name not in d:
                d[name] = getattr(req, name)
    other = object.__new__(cls)
    other.__dict__ = d
    return other
