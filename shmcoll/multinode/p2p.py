"""Point-to-point on the face's hierarchical communicators (`from shmcoll
import MPI` across nodes): a message between two ranks of one node goes
through the node's shmcoll communicator, one between nodes through MPI.
The pair of ranks alone decides which, so MPI's order between two ranks
holds, whatever the calls.

A receive from a given rank waits on that rank's transport.  A receive
from any source (and one whose datatype only MPI can read, and any
receive posted while such a one waits) is queued here and matched in
posting order: each pass takes the transports' messages with their
matched probes and hands each to the first queued receive it fits, as
MPI's matching would.  Waits advance both transports: shmcoll's waits
call this module's poll while it has work (MPI's progress, the queues),
and a wait on MPI here tests while advancing shmcoll's, so a message
moves while its owner waits on the other transport (MPI's progress rule).

A derived datatype's message crosses the node as MPI packs it (MPI_PACKED
matches every type), through a private duplicate of COMM_SELF."""
import operator
import os
import sys
import threading

import numpy as np
from mpi4py import MPI

from .. import nonblocking, p2p as shm_p2p, request as shm_request, sendmodes
from .._core import ffi, lib
from ..device import _new_cfunction
from .. import errors as shm_errors
from ..errors import ERRORS_RETURN, MPIError
from ..request import Status as ShmStatus
from .specs import Fallback, simple

Intracomm, _Request, _Prequest, _Message = MPI.Intracomm, MPI.Request, MPI.Prequest, MPI.Message
ANY_SOURCE, ANY_TAG, PROC_NULL = MPI.ANY_SOURCE, MPI.ANY_TAG, MPI.PROC_NULL
LOCAL, REMOTE, ANY = "local", "remote", "any"


# -- errors, statuses, bytes -------------------------------------------------------------------
def _translated(exc):
    """shmcoll's MPIError as mpi4py's MPI.Exception of the same class (the
    codes differ: Open MPI's are not MPICH's), shmcoll's text its cause."""
    name = shm_errors._CLASS_NAMES.get(exc.error_class, "ERR_OTHER")
    out = MPI.Exception(getattr(MPI, name, MPI.ERR_OTHER))
    out.__cause__ = exc
    return out


def _raise(exc):
    raise _translated(exc) from exc


class _Translated:
    """A block whose shmcoll MPIError raises as _raise gives it."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, MPIError):
            _raise(exc)
        return False


_SHM = _Translated()


def _fill(status, source, tag, nbytes, cancelled=False):
    if status is not None:
        status.Set_source(source)
        status.Set_tag(tag)
        status.Set_error(MPI.SUCCESS)
        status.Set_elements(MPI.BYTE, nbytes)
        status.Set_cancelled(cancelled)


def _empty(status):
    """An inactive request's status, as MPI gives it."""
    _fill(status, ANY_SOURCE, ANY_TAG, 0)


def _plain(spec, writable):
    """Whether spec is a plain array C reads (or writes) as it is."""
    return (type(spec) is np.ndarray and spec.flags.c_contiguous and (spec.flags.writeable or not writable)
            and spec.dtype.isnative and not spec.dtype.hasobject)


def _flat(spec, what, writable):
    """A spec's items as a flat array over the user's memory; None where
    only MPI reads it (a derived datatype; a spec mpi4py refuses, with its
    error)."""
    if spec is None:
        return np.empty(0, np.uint8)
    if _plain(spec, writable):
        return spec         # the common case, as simple() would read it
    try:
        a = simple(spec, what, writable)
    except (Fallback, TypeError, ValueError, BufferError):
        return None
    return a.view(np.uint8)


_self, _self_lock = [], threading.Lock()


def _selfcomm():
    with _self_lock:
        if not _self:
            _self.append(MPI.COMM_SELF.Dup())
        return _self[0]


def _pack(spec):
    """The message spec as MPI's packed bytes (MPI's own type engine reads it, and raises mpi4py's error)."""
    c = _selfcomm()
    with _self_lock:
        req = c.Isend(spec, 0, 0)
        st = MPI.Status()
        c.Probe(0, 0, st)
        out = np.empty(st.Get_count(MPI.BYTE), np.uint8)
        c.Recv([out, MPI.PACKED], 0, 0)
        req.Wait()
    return out


def _unpack(data, spec):
    """Packed bytes into spec (MPI's ERR_TRUNCATE where they do not fit).
    The receive is posted first: a spec MPI refuses raises before a byte is sent."""
    c = _selfcomm()
    with _self_lock:
        req = c.Irecv(spec, 0, 0)
        c.Send([data, MPI.PACKED], 0, 0)
        req.Wait()


def _outgoing(spec, what):
    flat = _flat(spec, what, False)
    return _pack(spec) if flat is None else flat


# -- progress between the transports -------------------------------------------------------------
class _Engine:
    """What shmcoll's waits advance while this module has work: MPI's
    progress (an MPI request of the face may be what a node peer's message
    waits on) and the queued receives."""
    live = {}                   # id -> the face's MPI requests that may be pending (mpi4py's are unhashable)
    routes = set()              # routes with queued receives

    on = False                  # in shmcoll's pending work (p2p.hold)

    def _p2p_poll(self):
        for r in list(self.routes):
            r.sweep()
        if self.live:
            for k, r in list(self.live.items()):
                if _Request.__eq__(r, MPI.REQUEST_NULL):        # completed through mpi4py's own calls
                    del self.live[k]
            _kick()
        self.held()

    def held(self):
        on = bool(self.routes or self.live)
        if on != self.on:
            self.on = on
            shm_p2p.hold(self, on)


_ENGINE = _Engine()


def _shm_busy():
    """Whether a wait on MPI must advance other work: shmcoll's pending
    calls (not this module's entry in them, for its MPI requests) or
    receives queued here (a route with any is in _ENGINE.routes)."""
    return len(shm_p2p._busy) > _ENGINE.on or bool(nonblocking._busy) or bool(_ENGINE.routes)


def _kick():
    """Turn MPI's progress engine: MPI_Request_get_status of a pending
    request does in both libraries (MPICH's Iprobe on COMM_SELF does not
    reach a collective's progress)."""
    for r in _ENGINE.live.values():
        if not isinstance(r, _Prequest) and not _Request.Get_status(r):
            return          # persistent ones left out: asked so, MPICH crossed mpi4py's persistent test's messages


def _advance(spins):
    """One turn of waiting: both transports' pending work, then the CPU for others."""
    shm_request.progress()
    _kick()
    if spins > 16:
        os.sched_yield()


def _mpi_track(req):
    """req (a face request over an MPI handle) as pending work."""
    _ENGINE.live[id(req)] = req
    _ENGINE.held()
    return req


def _untrack(req):
    """req is complete (or inactive)."""
    if _ENGINE.live.pop(id(req), None) is not None and not _ENGINE.live:
        _ENGINE.held()


# -- requests ---------------------------------------------------------------------------------------------
class _Op:
    """A face request's operation that MPI's handle does not carry: poll()
    advances it (True once done), complete(status) fills status and hands
    back the received object."""
    fields = None           # (source, tag, nbytes, cancelled) once done
    result = None
    error = None

    def complete(self, status):
        _fill(status, *self.fields)
        if self.error is not None:
            if status is not None and isinstance(self.error, MPI.Exception):
                status.Set_error(self.error.Get_error_class())
            raise self.error
        return self.result

    def cancel(self):
        pass

    def block(self):
        """Wait in the transport's own wait where it has one (shmcoll's
        doorbell, not a loop of tests); it advances the others' work too."""


class _Done(_Op):
    def __init__(self, fields, result=None):
        self.fields, self.result = fields, result

    def poll(self):
        return True


class _Shm(_Op):
    """A nonblocking call on the node's communicator."""

    def __init__(self, route, inner, pickled=False):
        self.route, self.inner, self.pickled = route, inner, pickled

    def poll(self):
        if self.fields is None:
            self._run(lambda st: self.inner.test(st) if self.pickled else (self.inner.Test(st), None))
        return self.fields is not None

    def block(self):
        if self.fields is None:
            self._run(lambda st: (True, self.inner.wait(st)) if self.pickled else (self.inner.Wait(st), None))

    def _run(self, call):
        """call(status) -> (done, object): its outcome kept; its error (a
        truncation, this receive's own) raised by the wait that completes it."""
        st = ShmStatus()
        try:
            done, obj = call(st)
        except MPIError as e:
            self.error, self.fields = _translated(e), self.route.fields(st)[:2] + (0, False)
            return
        if done:
            self.fields, self.result = self.route.fields(st), obj

    def cancel(self):
        self.inner.Cancel()


class _Mpi(_Op):
    """An MPI request a queued receive began (its message's Irecv)."""

    def __init__(self, inner, pickled):
        self.inner, self.pickled = inner, pickled
        _mpi_track(inner)

    def poll(self):
        if self.fields is not None:
            return True
        st = MPI.Status()
        try:
            done, obj = self.inner.test(st) if self.pickled else (_Request.Test(self.inner, st), None)
        except MPI.Exception as e:      # this receive's own: raised by its wait
            self.error, self.fields = e, _fields(st)
            return True
        if done:
            self.fields, self.result = _fields(st), obj
        return done

    def cancel(self):
        _Request.Cancel(self.inner)


def _deliver(msg, fields, buf, pickled):
    """A node message (fields: its translated status) into buf, or its object."""
    with _SHM:
        if pickled:
            return msg.recv()
        flat = _flat(buf, "Recv", True)
        if flat is not None:
            msg.Recv(flat)
            return None
        data = np.empty(fields[2], np.uint8)     # only MPI reads the datatype: its packed bytes, unpacked
        msg.Recv(data)
    _unpack(data, buf)
    return None


class _Recv(_Op):
    """A queued receive: a sweep gives it its message, then it is that transport's."""
    bound = None

    def __init__(self, route, buf, source, tag, pickled):
        self.route, self.buf, self.source, self.tag, self.pickled = route, buf, source, tag, pickled

    def fits(self, source, tag):
        return self.source in (ANY_SOURCE, source) and self.tag in (ANY_TAG, tag)

    def take(self, kind, msg, st):
        """msg (kind: which transport holds it; st: its status there) is this receive's."""
        if kind == REMOTE:
            try:
                self.bound = _Mpi(msg.irecv() if self.pickled else msg.Irecv(self.buf), self.pickled)
            except Exception as e:      # the wait that completes this receive raises it
                self.error, self.fields = e, _fields(st)
            return
        fields = self.route.fields(st)
        try:
            self.result = _deliver(msg, fields, self.buf, self.pickled)
        except Exception as e:
            self.error = e
        self.fields = fields

    def poll(self):
        if self.fields is not None:
            return True
        if self.bound is None:
            self.route.sweep()
            if self.bound is None:
                return self.fields is not None
        if self.bound.poll():
            self.fields, self.result = self.bound.fields, self.bound.result
            return True
        return False

    def cancel(self):
        if self.bound is not None:
            self.bound.cancel()
        elif self.route.unqueue(self):
            self.fields = (ANY_SOURCE, ANY_TAG, 0, True)


class _Pair(_Op):
    """Two requests, done when both are (Isendrecv: the status is the second's)."""

    def __init__(self, first, second):
        self.reqs = [first, second]

    def poll(self):
        if self.fields is None and all(Request._poll(r) for r in self.reqs):
            st = MPI.Status()
            Request._take(self.reqs[0], None, False)
            Request._take(self.reqs[1], st, False)
            self.fields = _fields(st)
        return self.fields is not None

    def cancel(self):
        for r in self.reqs:
            r.Cancel()


class _IdleOp(_Op):
    """An inactive persistent request: done, with an empty status."""
    fields = (ANY_SOURCE, ANY_TAG, 0, False)

    def poll(self):
        return True


_IDLE = _IdleOp()


def _shm(m):
    """A message's node message; None for MPI's own handle."""
    return getattr(m, "_shm", None)


def _fields(st):
    return st.Get_source(), st.Get_tag(), st.Get_count(MPI.BYTE), st.Is_cancelled()


class _Face(type):
    """The face's Request, Prequest and Message take mpi4py's own objects
    (those of MPI's communicators: COMM_SELF's) as instances too, as the
    module's names did before the face replaced them."""

    def __instancecheck__(cls, obj):
        return type.__instancecheck__(cls, obj) or isinstance(obj, cls._base)


def _op(r):
    """A request's face operation; None for MPI's own handle (mpi4py's objects have none)."""
    return getattr(r, "_op", None)


def _active(r):
    """Whether a call on many requests waits for r (a face operation's): not null, nor an inactive persistent one."""
    return not r._null and r._op is not _IDLE


class _Handles:
    """What the face's Request and Message share: mpi4py's handle calls,
    and comparisons that are MPI's between MPI's handles, while one of the
    face's own (a null handle) equals only a null one, once it is null."""

    @classmethod
    def fromhandle(cls, handle):
        return cls(cls._base.fromhandle(handle))

    @classmethod
    def fromint(cls, value):
        return cls(cls._base.fromint(value))

    @classmethod
    def f2py(cls, value):
        return cls(cls._base.f2py(value))

    def __bool__(self):
        return self._root.__bool__(self) if self._native(self) else self._alive()

    def __eq__(self, other):
        if not isinstance(other, self._root):
            return NotImplemented
        if self is other:
            return True
        if self._native(self) and self._native(other):
            return self._root.__eq__(self, other)
        return not other and not self

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return id(self)


class Request(_Handles, _Request, metaclass=_Face):
    """mpi4py's Request, for the face's calls: MPI's own handle (a message
    between nodes), or an operation on the node's communicator or queued
    here, under a null handle MPI never sees (== REQUEST_NULL once
    complete, as MPI's).  Its Wait and Test advance both transports, as do
    the calls on many requests, which take MPI's own requests too."""
    _base = _root = _Request
    _op = None          # None: MPI's handle is the request
    _null = True
    _persistent = False

    @classmethod
    def _of(cls, op):
        self = cls()
        self._op, self._null = op, False
        return self

    @classmethod
    def _mpi(cls, req):
        return _mpi_track(cls(req))

    @staticmethod
    def _native(r):
        return _op(r) is None

    def _alive(self):
        return not self._null

    # -- one request (r: this class's or mpi4py's)
    @staticmethod
    def _poll(r):
        """Advance; whether complete (inactive counts as complete)."""
        op = _op(r)
        if op is None:
            return _Request.Get_status(r)
        return r._null or op.poll()

    @staticmethod
    def _take(r, status, lower):
        """Complete r, once _poll said so; the received object."""
        op = _op(r)
        if op is None:
            _untrack(r)
            return _Request.test(r, status)[1] if lower else _Request.Test(r, status) and None
        if r._null:
            _empty(status)
            return None
        if r._persistent:
            r._op = _IDLE
        else:
            r._null = True
        return op.complete(status)

    def _wait(self, status, lower):
        op = _op(self)
        if op is None:
            if not _shm_busy():
                _untrack(self)
                return _Request.wait(self, status) if lower else _Request.Wait(self, status) and None
            spins = 0
            while not (done := _Request.test(self, status) if lower else (_Request.Test(self, status), None))[0]:
                spins += 1          # MPI's own test, never Get_status then Test (MPICH's Iflush_buffer fails that)
                _advance(spins)
            _untrack(self)
            return done[1]
        if not self._null:
            op.block()
        spins = 0
        while not Request._poll(self):
            spins += 1
            _advance(spins)
        return Request._take(self, status, lower)

    def _test(self, status, lower):
        if _op(self) is None and not _shm_busy():
            done = _Request.test(self, status) if lower else (_Request.Test(self, status), None)
            if done[0]:         # MPI's own test alone, as in _wait: MPICH's Iflush_buffer fails Get_status then Test
                _untrack(self)
            return done
        shm_request.progress()
        if not Request._poll(self):
            return False, None
        return True, Request._take(self, status, lower)

    def Wait(self, status=None):
        Request._wait(self, status, False)
        return True

    def wait(self, status=None):
        return Request._wait(self, status, True)

    def Test(self, status=None):
        return Request._test(self, status, False)[0]

    def test(self, status=None):
        return Request._test(self, status, True)

    def Get_status(self, status=None):
        op = _op(self)
        if op is None:
            return _Request.Get_status(self, status)
        if self._null:
            _empty(status)
            return True
        if not op.poll():
            return False
        if op.error is None:
            _fill(status, *op.fields)
        return True

    def get_status(self, status=None):
        return Request.Get_status(self, status)

    def Cancel(self):
        op = _op(self)
        if op is None:
            return _Request.Cancel(self)
        if not self._null:
            op.cancel()

    cancel = Cancel

    def Free(self):
        if _op(self) is None:
            return _Request.Free(self)
        self._null = True       # a queued receive still takes its message, as MPI's freed one does

    free = Free

    # -- on many: MPI's own calls where every request is MPI's (with
    # shmcoll's work advanced between its tests while it has some)
    @staticmethod
    def _mpi_only(requests):
        return all(_op(r) is None for r in requests)

    @staticmethod
    def _statuses(statuses, n):
        if statuses is None:
            return [None] * n
        while len(statuses) < n:
            statuses.append(MPI.Status())
        return statuses

    @classmethod
    def _loop(cls, test, block, wait=None):
        """MPI's test (a call on MPI's requests) until it says done; wait: MPI's blocking call, when shmcoll has no work."""
        if wait is not None and not _shm_busy():
            return wait()
        spins = 0
        while True:
            if spins or not block:
                shm_request.progress()
            got = test()
            if not block or got[0]:
                return got[1]
            spins += 1
            _advance(spins)

    @classmethod
    def _all(cls, requests, statuses, lower, block):
        sts, spins = cls._statuses(statuses, len(requests)), 0
        if not block:
            shm_request.progress()
        else:
            for r in requests:              # shmcoll's own waits first: they advance the rest's work too
                if _op(r) is not None and not r._null:
                    r._op.block()
        while not all([cls._poll(r) for r in requests]):
            if not block:
                return False, None
            spins += 1
            _advance(spins)
        out, failed = [], False
        for r, st in zip(requests, sts):
            try:
                out.append(cls._take(r, st, lower))
            except MPI.Exception as e:          # MPI's: every request completes, the error in its status
                failed = True
                if st is not None:
                    st.Set_error(e.Get_error_class())
                out.append(None)
        if failed:
            raise MPI.Exception(MPI.ERR_IN_STATUS)
        return True, out

    @staticmethod
    def _natives(requests):
        """The indices of MPI's handles among requests, and those requests."""
        native = [i for i, r in enumerate(requests) if _op(r) is None]
        return native, [requests[i] for i in native]

    @classmethod
    def _any(cls, requests, status, lower, block):
        """The face's operations polled here, MPI's handles by MPI's Testany
        (which alone knows an inactive persistent request of mpi4py's)."""
        native, sub = cls._natives(requests)
        spins = 0
        if not block:
            shm_request.progress()
        while True:
            live = [i for i, r in enumerate(requests) if _op(r) is not None and _active(r)]
            for i in live:
                if cls._poll(requests[i]):
                    return i, True, cls._take(requests[i], status, lower)
            waiting = bool(live)
            if sub:
                if lower:
                    j, flag, obj = _Request.testany(sub, status)
                else:
                    (j, flag), obj = _Request.Testany(sub, status), None
                if flag and j != MPI.UNDEFINED:
                    _untrack(sub[j])
                    return native[j], True, obj
                waiting = waiting or not flag       # flag and UNDEFINED: each of them null or inactive
            if not waiting:
                _empty(status)
                return MPI.UNDEFINED, True, None
            if not block:
                return MPI.UNDEFINED, False, None
            spins += 1
            _advance(spins)

    @classmethod
    def _some(cls, requests, statuses, lower, block):
        native, sub = cls._natives(requests)
        spins = 0
        if not block:
            shm_request.progress()
        while True:
            live = [i for i, r in enumerate(requests) if _op(r) is not None and _active(r)]
            out = []
            for i in live:
                if cls._poll(requests[i]):
                    st = MPI.Status()
                    out.append((i, st, cls._take(requests[i], st, lower)))
            waiting = bool(live)
            if sub:
                sts = []
                done, objs = _Request.testsome(sub, sts) if lower else (_Request.Testsome(sub, sts), None)
                if done is not None:            # None: each of them null or inactive
                    waiting = True
                    for k, j in enumerate(done):
                        _untrack(sub[j])
                        out.append((native[j], sts[k], objs[k] if lower else None))
            if not waiting:
                return None, None
            if out or not block:
                out.sort(key=lambda t: t[0])
                for (_, st, _), dst in zip(out, cls._statuses(statuses, len(out))):
                    if dst is not None:
                        _fill(dst, *_fields(st))
                return [t[0] for t in out], [t[2] for t in out]
            spins += 1
            _advance(spins)

    @staticmethod
    def _node_all(requests):
        """Waitall of the node's calls alone, no status asked for (a halo
        exchange between node-mates): each one's wait in turn, as _all
        would, without its general passes; False (nothing done) where any
        request is of another kind."""
        if type(requests) not in (list, tuple):
            return False                # the general path takes (or refuses) any other sequence
        for r in requests:
            if type(r) is not Request or r._null or type(r._op) is not _Shm:
                return False
        for r in requests:
            r._op.block()               # its outcome kept (fields, error) until all are done: a wait
        failed = False                  # interrupted leaves them to a later call, as _all's
        for r in requests:
            r._null = True
            failed = failed or r._op.error is not None      # its own (a truncation)
        if failed:
            raise MPI.Exception(MPI.ERR_IN_STATUS)
        return True

    @classmethod
    def Waitall(cls, requests, statuses=None):
        if statuses is None and cls._node_all(requests):
            return True
        if cls._mpi_only(requests):
            cls._loop(lambda: (_Request.Testall(requests, statuses),) * 2, True,
                      lambda: _Request.Waitall(requests, statuses))
            for r in requests:
                _untrack(r)
            return True
        cls._all(requests, statuses, False, True)
        return True

    @classmethod
    def waitall(cls, requests, statuses=None):
        if cls._mpi_only(requests):
            return cls._loop(lambda: _Request.testall(requests, statuses), True,
                             lambda: _Request.waitall(requests, statuses))
        return cls._all(requests, statuses, True, True)[1]

    @classmethod
    def Testall(cls, requests, statuses=None):
        if cls._mpi_only(requests):
            return cls._loop(lambda: (True, _Request.Testall(requests, statuses)), False)
        return cls._all(requests, statuses, False, False)[0]

    @classmethod
    def testall(cls, requests, statuses=None):
        if cls._mpi_only(requests):
            return cls._loop(lambda: (True, _Request.testall(requests, statuses)), False)
        return cls._all(requests, statuses, True, False)

    @classmethod
    def Waitany(cls, requests, status=None):
        if cls._mpi_only(requests):
            def test():
                i, flag = _Request.Testany(requests, status)
                return flag, i
            return cls._loop(test, True, lambda: _Request.Waitany(requests, status))
        return cls._any(requests, status, False, True)[0]

    @classmethod
    def waitany(cls, requests, status=None):
        if cls._mpi_only(requests):
            def test():
                i, flag, obj = _Request.testany(requests, status)
                return flag, (i, obj)
            return cls._loop(test, True, lambda: _Request.waitany(requests, status))
        i, _, obj = cls._any(requests, status, True, True)
        return i, obj

    @classmethod
    def Testany(cls, requests, status=None):
        if cls._mpi_only(requests):
            return cls._loop(lambda: (True, _Request.Testany(requests, status)), False)
        return cls._any(requests, status, False, False)[:2]

    @classmethod
    def testany(cls, requests, status=None):
        if cls._mpi_only(requests):
            return cls._loop(lambda: (True, _Request.testany(requests, status)), False)
        return cls._any(requests, status, True, False)

    @classmethod
    def Waitsome(cls, requests, statuses=None):
        if cls._mpi_only(requests):
            def test():
                done = _Request.Testsome(requests, statuses)
                return done is None or len(done) > 0, done
            return cls._loop(test, True, lambda: _Request.Waitsome(requests, statuses))
        return cls._some(requests, statuses, False, True)[0]

    @classmethod
    def waitsome(cls, requests, statuses=None):
        if cls._mpi_only(requests):
            def test():
                done, objs = _Request.testsome(requests, statuses)
                return done is None or len(done) > 0, (done, objs)
            return cls._loop(test, True, lambda: _Request.waitsome(requests, statuses))
        return cls._some(requests, statuses, True, True)

    @classmethod
    def Testsome(cls, requests, statuses=None):
        if cls._mpi_only(requests):
            return cls._loop(lambda: (True, _Request.Testsome(requests, statuses)), False)
        return cls._some(requests, statuses, False, False)[0]

    @classmethod
    def testsome(cls, requests, statuses=None):
        if cls._mpi_only(requests):
            return cls._loop(lambda: (True, _Request.testsome(requests, statuses)), False)
        return cls._some(requests, statuses, True, False)


class _Started(_Op):
    """A persistent request's current call (a face Request)."""

    def __init__(self, req):
        self.req = req

    def poll(self):
        if self.fields is None and Request._poll(self.req):
            st = MPI.Status()
            self.result = Request._take(self.req, st, True)
            self.fields = _fields(st)
        return self.fields is not None

    def cancel(self):
        self.req.Cancel()

    def block(self):
        op = _op(self.req)
        if op is not None:
            op.block()


class Prequest(Request, _Prequest):
    """mpi4py's Prequest, for the face's persistent calls: MPI's own (a
    send between nodes), or one whose every Start makes the face's
    nonblocking call anew (so a receive takes its place in the matching)."""
    _base = _Prequest
    _persistent = True

    @classmethod
    def _made(cls, make):
        self = cls._of(_IDLE)
        self._make = make
        return self

    @classmethod
    def _mpi(cls, req):
        return cls(req)

    def Start(self):
        if _op(self) is None:
            _Prequest.Start(self)
            _mpi_track(self)
            return
        if self._null or self._op is not _IDLE:        # freed, or started and not completed
            raise MPI.Exception(MPI.ERR_REQUEST)
        self._op = _Started(self._make())

    @classmethod
    def Startall(cls, requests):
        if Request._mpi_only(requests):
            _Prequest.Startall(requests)
            for r in requests:
                if type(r) is not _Prequest:        # mpi4py's own (COMM_SELF's): MPI's alone
                    _mpi_track(r)
            return
        for r in requests:
            r.Start()


class Message(_Handles, _Message, metaclass=_Face):
    """mpi4py's Message, for the face's matched probes: MPI's own handle,
    or a message the node's communicator holds (under a null handle)."""
    _base = _root = _Message
    _shm = None

    @staticmethod
    def _native(m):
        return _shm(m) is None

    def _alive(self):
        return self._shm is not False

    @classmethod
    def _of(cls, msg, fields):
        self = cls()
        self._shm, self._fields = msg, fields
        return self

    def _recv(self, buf, status, pickled):
        if _shm(self) is None:
            return _Message.recv(self, status) if pickled else _Message.Recv(self, buf, status)
        msg, self._shm = self._shm, False       # received: null from now on
        if msg is False:
            raise MPI.Exception(MPI.ERR_REQUEST)
        obj = _deliver(msg, self._fields, buf, pickled)
        _fill(status, *self._fields)
        return obj

    def Recv(self, buf, status=None):
        Message._recv(self, buf, status, False)

    def recv(self, status=None):
        return Message._recv(self, None, status, True)

    def Irecv(self, buf):
        if _shm(self) is None:
            return Request._mpi(_Message.Irecv(self, buf))
        op = _Done(self._fields)
        try:
            self._recv(buf, None, False)
        except Exception as e:          # MPI's Irecv raises a truncation at its Wait
            op.error = e
        return Request._of(op)

    def irecv(self):
        if _shm(self) is None:
            return Request._mpi(_Message.irecv(self))
        fields = self._fields
        return Request._of(_Done(fields, self._recv(None, None, True)))

    @classmethod
    def Probe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return comm.Mprobe(source, tag, status)

    @classmethod
    def Iprobe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return comm.Improbe(source, tag, status)

    @classmethod
    def probe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return comm.mprobe(source, tag, status)

    @classmethod
    def iprobe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return comm.improbe(source, tag, status)


# -- the communicator's side ------------------------------------------------------------------------------
OTHER = "other"     # PROC_NULL, a rank out of range, not a rank: MPI's own call answers it


class Route:
    """A face communicator's point-to-point: which transport reaches each
    rank, and the receives queued for matching here."""

    def __init__(self, comm, hier):
        """Collective over comm: the node's communicator is duplicated for
        the user's messages, which raise their errors (mpi4py's way: the
        communicator goes on), where the collectives' legs abort."""
        self.comm, self.size = comm, hier.size
        self.node = hier.node.Dup()
        self.node.Set_errhandler(ERRORS_RETURN)
        self.ranks = [int(r) for r in hier.nodes[hier.me]]         # node-local rank -> rank
        self.local = {r: i for i, r in enumerate(self.ranks)}
        self.queue, self.lock, self.flip, self.prefer = [], threading.Lock(), False, None
        self.tag_ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)      # Open MPI gives it on COMM_WORLD only

    def close(self):
        """The communicator is being freed (collective; MPI lets its pending
        calls complete, these cannot): receives still queued, and calls in
        flight within the node, fail with ERR_COMM at their waits."""
        with self.lock:
            for op in self.queue:
                op.error, op.fields = MPI.Exception(MPI.ERR_COMM), (ANY_SOURCE, ANY_TAG, 0, False)
            self.queue = []
        _ENGINE.routes.discard(self)
        _ENGINE.held()
        self.node.Free()

    def where(self, rank):
        """(LOCAL, node-local rank), (REMOTE, rank), (ANY, ANY_SOURCE) or (OTHER, None)."""
        try:
            r = _int(rank)
        except TypeError:
            return OTHER, None
        if r in self.local:
            return LOCAL, self.local[r]
        if r == ANY_SOURCE:
            return ANY, r
        return (REMOTE, r) if 0 <= r < self.size else (OTHER, None)

    def fields(self, st):
        """A node status's (rank, tag, bytes, cancelled)."""
        nbytes, cancelled, src, tag = st._m[:4]         # its fields' array (shmcoll.request.Status)
        return (self.ranks[src] if 0 <= src < len(self.ranks) else src), tag, nbytes, bool(cancelled)

    # -- the queue
    def post(self, buf, source, tag, pickled):
        """A receive queued for matching here (MPI's checks of its tag first)."""
        tag = _int(tag)
        if tag != ANY_TAG and not 0 <= tag <= self.tag_ub:
            raise MPI.Exception(MPI.ERR_TAG)
        if not pickled and _flat(buf, "Irecv", True) is None:
            _checked(self.comm, "Recv_init", buf, tag)
        op = _Recv(self, buf, _int(source), tag, pickled)
        with self.lock:
            self.queue.append(op)
        _ENGINE.routes.add(self)
        _ENGINE.held()
        self.sweep()
        return op

    def unqueue(self, op):
        with self.lock:
            if op not in self.queue:
                return False
            self.queue.remove(op)
            if not self.queue:
                _ENGINE.routes.discard(self)
        _ENGINE.held()
        return True

    def _kinds(self, source):
        if source != ANY_SOURCE:
            return (LOCAL,) if source in self.local else (REMOTE,)
        if self.prefer is not None:     # a probe from any source found a message there: a receive after it takes it
            return (self.prefer, REMOTE if self.prefer == LOCAL else LOCAL)
        self.flip = not self.flip       # else neither transport's messages wait behind the other's
        return (LOCAL, REMOTE) if self.flip else (REMOTE, LOCAL)

    def _probe(self, kind, source, tag, matched, pickled=False):
        """One look in kind's transport: (found: a message or True, status) or
        (None, None).  pickled: MPI's message as mpi4py's mprobe makes it,
        which its recv() reads (it holds a buffer of the message's size)."""
        if kind == LOCAL:
            if tag > shm_p2p.TAG_UB:
                return None, None       # past shmcoll's tags (Open MPI's go to 2^31 - 1): no node message has it
            st = ShmStatus()
            s = shm_request.ANY_SOURCE if source == ANY_SOURCE else self.local[source]
            with _SHM:
                got = self.node.Improbe(s, _tag(tag), st) if matched else self.node.Iprobe(s, _tag(tag), st)
            return (got, st) if got else (None, None)
        st = MPI.Status()
        got = (getattr(Intracomm, "improbe" if pickled else "Improbe")(self.comm, source, tag, st) if matched
               else Intracomm.Iprobe(self.comm, source, tag, st))
        return (got, st) if got else (None, None)

    def _source_tag(self, kind, st):
        return self.fields(st)[:2] if kind == LOCAL else (st.Get_source(), st.Get_tag())

    def _give(self, kind, msg, st, upto):
        """msg to the first queued receive (of the first upto) it fits; whether one took it."""
        src, tag = self._source_tag(kind, st)
        for op in self.queue[:upto]:
            if op.fits(src, tag):
                self.queue.remove(op)
                self.prefer = None
                op.take(kind, msg, st)
                return True
        return False

    def sweep(self):
        """Hand the transports' messages to the queued receives, in posting order."""
        if not self.queue or not self.lock.acquire(blocking=False):
            return                      # nothing queued, or a sweep under way (this thread's, from a poll)
        try:
            found = True
            while found and self.queue:
                found = False
                for i, op in enumerate(self.queue):
                    for kind in self._kinds(op.source):
                        msg, st = self._probe(kind, op.source, op.tag, True, op.pickled)
                        if msg is not None:
                            found = self._give(kind, msg, st, i + 1)
                            break
                    if found:
                        break
            if not self.queue:
                _ENGINE.routes.discard(self)
        finally:
            self.lock.release()
        _ENGINE.held()

    def look(self, source, tag, matched, pickled):
        """One look for a message a receive posted now would take (a queued
        receive's are theirs): (found, status as the transport's) or (None, None)."""
        self.sweep()
        for kind in self._kinds(source):
            while True:
                got, st = self._probe(kind, source, tag, matched, pickled)
                if got is None:
                    break
                with self.lock:
                    src, t = self._source_tag(kind, st)
                    mine = not any(op.fits(src, t) for op in self.queue)
                    if matched and not mine:
                        self._give(kind, got, st, len(self.queue))
                if mine:
                    self.prefer = None if matched else kind
                    return kind, got, st
                if not matched:
                    break               # a queued receive's: the next sweep hands it over
        return None, None, None


def _checked(comm, init, buf, tag, rank=None):
    """MPI's checks of a call's buffer and tag, now (init: its persistent
    form, made and freed unstarted, to this rank: PROC_NULL skips the
    buffer's), for a call whose own MPI call comes later or never."""
    getattr(Intracomm, init)(comm, buf, comm.Get_rank() if rank is None else rank, tag).Free()


def _int(x):
    """A rank or tag as mpi4py reads it (a float truncates; a str is mpi4py's TypeError)."""
    return operator.index(shm_p2p._truncated(x))


def _tag(tag):
    """A tag as the node's communicator reads it (shmcoll's ANY_TAG is MPICH's; Open MPI's may differ)."""
    return shm_request.ANY_TAG if tag == ANY_TAG else tag


C_ENTRIES = ("Send", "Recv")


def install(comm):
    """comm's Send and Recv as C entries (csrc/route.c) over Routed's,
    which they call for all but the common case."""
    r = comm.route
    if ANY_TAG != shm_request.ANY_TAG:
        return                          # the entry hands a node-mate's receive MPI's ANY_TAG as it is
    for name, names, rank, tag in (("Send", ("buf", "dest", "tag"), None, 0),
                                   ("Recv", ("buf", "source", "tag", "status"), ANY_SOURCE, ANY_TAG)):
        state = (name == "Recv", tuple(sys.intern(n) for n in names), r.local, getattr(r.node, name),
                 getattr(Intracomm, name), comm, getattr(type(comm), name).__get__(comm), r.size, r.queue,
                 shm_p2p._busy, nonblocking._busy, MPIError, _raise, rank, tag)
        comm.__dict__[name] = _new_cfunction(int(ffi.cast("uintptr_t", lib.sc_py_route())), state, None)


def _route(comm):
    return comm.__dict__.get("route")


_NB = {"Send": "Isend", "Ssend": "Issend", "Rsend": "Irsend", "send": "isend", "ssend": "issend"}
_INIT = {"Send_init": "Isend", "Ssend_init": "Issend", "Bsend_init": "Ibsend", "Rsend_init": "Irsend"}
_PICKLED = {"send", "ssend", "bsend", "isend", "issend", "ibsend"}


def _send(comm, mode, buf, dest, tag):
    r = _route(comm)
    kind, ld = r.where(dest) if r is not None else (OTHER, None)
    if kind != LOCAL:
        if r is not None and mode in _NB and _shm_busy():
            Request._mpi(getattr(Intracomm, _NB[mode])(comm, buf, dest, tag)).Wait()
            return None
        return getattr(Intracomm, mode)(comm, buf, dest, tag)
    tag, data = _int(tag), buf if mode in _PICKLED else _outgoing(buf, mode)
    with _SHM:
        getattr(r.node, mode)(data, ld, tag)


def _isend(comm, mode, buf, dest, tag):
    r = comm.__dict__.get("route")
    ld = r.local.get(dest) if r is not None and type(dest) is int else None
    if ld is None:
        kind, ld = r.where(dest) if r is not None else (OTHER, None)
        if kind != LOCAL:
            req = getattr(Intracomm, mode)(comm, buf, dest, tag)
            return req if r is None else Request._mpi(req)
    if type(tag) is not int:
        tag = _int(tag)
    try:
        inner = getattr(r.node, mode)(buf if mode in _PICKLED else _outgoing(buf, mode), ld, tag)
    except MPIError as e:
        _raise(e)
    return Request._of(_Shm(r, inner))


def _send_init(comm, mode, buf, dest, tag):
    r = _route(comm)
    if r is None or r.where(dest)[0] != LOCAL:
        req = getattr(Intracomm, mode)(comm, buf, dest, tag)
        return req if r is None else Prequest._mpi(req)
    _checked(comm, mode, buf, tag)
    return Prequest._made(lambda: _isend(comm, _INIT[mode], buf, dest, tag))


def _recv(comm, buf, source, tag, status, pickled):
    r = _route(comm)
    name = "recv" if pickled else "Recv"
    if r is None:
        return getattr(Intracomm, name)(comm, buf, source, tag, status)
    kind, s = r.where(source)
    if kind == OTHER or (kind == REMOTE and not _shm_busy()):
        return getattr(Intracomm, name)(comm, buf, source, tag, status)
    if kind == LOCAL and not r.queue:
        st = ShmStatus()
        flat = None if pickled else _flat(buf, "Recv", True)
        if pickled or flat is not None:
            try:
                obj = r.node.recv(buf, s, _tag(tag), st) if pickled else r.node.Recv(flat, s, _tag(tag), st)
            except MPIError as e:       # a truncated message's status, as MPI fills it
                if e.found is not None:
                    _fill(status, r.ranks[e.found[0]], e.found[1], e.found[2])
                _raise(e)
            _fill(status, *r.fields(st))
            return obj
    if kind == REMOTE and not r.queue and not pickled:
        return Request._mpi(Intracomm.Irecv(comm, buf, source, tag)).Wait(status) and None
    return Request._of(r.post(buf, source, tag, pickled))._wait(status, True)


def _irecv(comm, buf, source, tag, pickled):
    r = comm.__dict__.get("route")
    if (r is not None and not pickled and type(source) is int and type(tag) is int and not r.queue
            and source in r.local and _plain(buf, True)):
        return _irecv_node(r, buf, r.local[source], source, tag, False)     # the common case: as _flat reads it
    name = "irecv" if pickled else "Irecv"
    if r is None:
        return getattr(Intracomm, name)(comm, buf, source, tag)
    kind, s = r.where(source)
    if kind == OTHER or (kind == REMOTE and not r.queue):
        return Request._mpi(getattr(Intracomm, name)(comm, buf, source, tag))
    if kind == LOCAL and not r.queue:
        flat = None if pickled else _flat(buf, "Irecv", True)
        if pickled or flat is not None:
            return _irecv_node(r, buf if pickled else flat, s, source, tag, pickled)
    return Request._of(r.post(buf, source, tag, pickled))


def _irecv_node(r, buf, s, source, tag, pickled):
    """The node's receive from its rank s (source in comm) into buf (its object: pickled)."""
    try:
        inner = r.node.irecv(buf, s, _tag(tag)) if pickled else r.node.Irecv(buf, s, _tag(tag))
    except MPIError as e:           # a message already here that does not fit: MPI raises at the wait
        if e.error_class != shm_errors.ERR_TRUNCATE:
            _raise(e)
        op = _Done((r.ranks[e.found[0]], e.found[1], 0, False) if e.found else (source, tag, 0, False))
        op.error = _translated(e)
        return Request._of(op)
    return Request._of(_Shm(r, inner, pickled))


def _probe(comm, name, source, tag, status):
    """Probe, Iprobe, Mprobe, Improbe."""
    r = _route(comm)
    if r is None:
        return getattr(Intracomm, name)(comm, source, tag, status)
    matched, block, pickled = name[0] in "Mm" or name[1] == "m", name[0] not in "Ii", name[0] == "m" or name[:2] == "im"
    kind, s = r.where(source)
    if kind == OTHER or (kind == REMOTE and not r.queue and not (block and _shm_busy())):
        got = getattr(Intracomm, name)(comm, source, tag, status)
        return Message(got) if matched and got is not None else got
    past = type(tag) is int and tag > shm_p2p.TAG_UB       # past shmcoll's tags: no node message has it
    if past and tag > r.tag_ub:
        raise MPI.Exception(MPI.ERR_TAG)
    if kind == LOCAL and not r.queue and not past and not (block and _ENGINE.on):    # else MPI's progress too
        st = ShmStatus()
        with _SHM:
            got = getattr(r.node, name)(s, _tag(tag), st)
        if not got:
            return got
        fields = r.fields(st)
        _fill(status, *fields)
        return Message._of(got, fields) if matched else got
    spins = 0
    while True:
        kind, got, st = r.look(source, tag, matched, pickled)
        if got is not None:
            fields = r.fields(st) if kind == LOCAL else _fields(st)
            _fill(status, *fields)
            if not matched:
                return True
            return Message._of(got, fields) if kind == LOCAL else Message(got)
        if not block:
            return None if matched else False
        spins += 1
        _advance(spins)


def _copy(buf, what):
    """The message buf holds now, as bytes of its own (a *_replace's send): MPI_PACKED matches any type."""
    return [np.array(_outgoing(buf, what), np.uint8), MPI.PACKED]


class Routed:
    """The face communicator's point-to-point (a mixin of its Intracomm):
    within the node through shmcoll, between nodes MPI's."""

    def Send(self, buf, dest, tag=0):
        r = self.__dict__.get("route")
        if r is not None and type(dest) is int and type(tag) is int:     # the common cases, as _send takes them
            ld = r.local.get(dest)
            if ld is None:
                if 0 <= dest < r.size and not _shm_busy():
                    return Intracomm.Send(self, buf, dest, tag)
            elif type(buf) is np.ndarray and buf.flags.c_contiguous:
                try:
                    return r.node.Send(buf, ld, tag)
                except MPIError as e:
                    _raise(e)
        _send(self, "Send", buf, dest, tag)

    def Recv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        r = self.__dict__.get("route")
        if r is not None and not r.queue and type(source) is int:     # the common cases, as _recv would take them
            ls = r.local.get(source)
            if ls is None:
                if 0 <= source < r.size and not _shm_busy():
                    return Intracomm.Recv(self, buf, source, tag, status)
            elif status is None and type(buf) is np.ndarray and buf.flags.c_contiguous and buf.flags.writeable:
                try:
                    return r.node.Recv(buf, ls, _tag(tag))
                except MPIError as e:
                    _raise(e)
        _recv(self, buf, source, tag, status, False)

    def recv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return _recv(self, buf, source, tag, status, True)

    def Irecv(self, buf, source=ANY_SOURCE, tag=ANY_TAG):
        return _irecv(self, buf, source, tag, False)

    def irecv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG):
        return _irecv(self, buf, source, tag, True)

    def Recv_init(self, buf, source=ANY_SOURCE, tag=ANY_TAG):
        if _route(self) is None:
            return Intracomm.Recv_init(self, buf, source, tag)
        _checked(self, "Recv_init", buf, tag, source)
        return Prequest._made(lambda: _irecv(self, buf, source, tag, False))

    def Probe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return _probe(self, "Probe", source, tag, status)

    def Iprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return _probe(self, "Iprobe", source, tag, status)

    def Mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return _probe(self, "Mprobe", source, tag, status)

    def Improbe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return _probe(self, "Improbe", source, tag, status)

    probe, iprobe = Probe, Iprobe

    def mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return _probe(self, "mprobe", source, tag, status)

    def improbe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return _probe(self, "improbe", source, tag, status)

    def _mpi_pair(self, dest, source):
        """Whether a send to dest and a receive from source are MPI's alone."""
        r = _route(self)
        return r is None or (r.where(dest)[0] in (REMOTE, OTHER) and r.where(source)[0] in (REMOTE, OTHER)
                             and not _shm_busy())

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE, recvtag=ANY_TAG, status=None):
        if self._mpi_pair(dest, source):
            return Intracomm.Sendrecv(self, sendbuf, dest, sendtag, recvbuf, source, recvtag, status)
        req = self.Isend(sendbuf, dest, sendtag)
        try:
            self.Recv(recvbuf, source, recvtag, status)
        finally:
            req.Wait()

    def sendrecv(self, sendobj, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE, recvtag=ANY_TAG, status=None):
        if self._mpi_pair(dest, source):
            return Intracomm.sendrecv(self, sendobj, dest, sendtag, recvbuf, source, recvtag, status)
        req = self.isend(sendobj, dest, sendtag)
        try:
            return self.recv(recvbuf, source, recvtag, status)
        finally:
            req.Wait()

    def Sendrecv_replace(self, buf, dest, sendtag=0, source=ANY_SOURCE, recvtag=ANY_TAG, status=None):
        if self._mpi_pair(dest, source):
            return Intracomm.Sendrecv_replace(self, buf, dest, sendtag, source, recvtag, status)
        self.Sendrecv(_copy(buf, "Sendrecv_replace"), dest, sendtag, buf, source, recvtag, status)

    def Isendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE, recvtag=ANY_TAG):
        if self._mpi_pair(dest, source):
            req = Intracomm.Isendrecv(self, sendbuf, dest, sendtag, recvbuf, source, recvtag)
            return req if _route(self) is None else Request._mpi(req)
        return Request._of(_Pair(self.Isend(sendbuf, dest, sendtag), self.Irecv(recvbuf, source, recvtag)))

    def Isendrecv_replace(self, buf, dest, sendtag=0, source=ANY_SOURCE, recvtag=ANY_TAG):
        if self._mpi_pair(dest, source):
            req = Intracomm.Isendrecv_replace(self, buf, dest, sendtag, source, recvtag)
            return req if _route(self) is None else Request._mpi(req)
        return self.Isendrecv(_copy(buf, "Isendrecv_replace"), dest, sendtag, buf, source, recvtag)

    # -- the buffered sends' buffer, attached to both transports
    def Attach_buffer(self, buf):
        Intracomm.Attach_buffer(self, buf)
        r = _route(self)
        if r is not None:
            r.node.Attach_buffer(_shm_buffer(buf))

    def Detach_buffer(self):
        got = Intracomm.Detach_buffer(self)
        r = _route(self)
        if r is not None:
            try:
                r.node.Detach_buffer()
            except MPIError:
                pass
        return got

    def Flush_buffer(self):
        Intracomm.Flush_buffer(self)
        r = _route(self)
        if r is not None:
            r.node.Flush_buffer()


def _forward(helper, mode, pickled):
    """Routed's method for a send mode: helper's call (_send, _isend, _send_init) with mode."""
    if pickled:
        def call(self, obj, dest, tag=0):
            return helper(self, mode, obj, dest, tag)
    else:
        def call(self, buf, dest, tag=0):
            return helper(self, mode, buf, dest, tag)
    call.__name__, call.__qualname__ = mode, f"Routed.{mode}"
    return call


for _helper, _modes in ((_send, ("Ssend", "Rsend", "Bsend", "send", "ssend", "bsend")),
                        (_isend, ("Isend", "Issend", "Irsend", "Ibsend", "isend", "issend", "ibsend")),
                        (_send_init, tuple(_INIT))):
    for _mode in _modes:
        setattr(Routed, _mode, _forward(_helper, _mode, _mode in _PICKLED))


# MPI's own nonblocking and persistent collectives on the face's
# communicators: their requests are tracked, so that a wait in shmcoll turns
# MPI's progress while one is out (a node-mate's message may wait on it)
_NBC = ("Ibarrier", "Ibcast", "Igather", "Igatherv", "Iscatter", "Iscatterv", "Iallgather", "Iallgatherv",
        "Ialltoall", "Ialltoallv", "Ialltoallw", "Ireduce", "Iallreduce", "Ireduce_scatter_block",
        "Ireduce_scatter", "Iscan", "Iexscan")
_PERSISTENT = tuple(n[1:] + "_init" for n in _NBC)


def _tracking(name, persistent):
    def call(self, *args, **kw):
        req = getattr(Intracomm, name)(self, *args, **kw)
        if _route(self) is None:
            return req
        return Prequest._mpi(req) if persistent else Request._mpi(req)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"MPI's {name}, its request tracked (a wait in shmcoll turns MPI's progress while it is out)."
    return call


for _name in _NBC + _PERSISTENT:
    if hasattr(Intracomm, _name):
        setattr(Routed, _name, _tracking(_name, _name in _PERSISTENT))


def _shm_buffer(buf):
    return sendmodes.BUFFER_AUTOMATIC if buf is MPI.BUFFER_AUTOMATIC else buf


def Attach_buffer(buf):
    MPI.Attach_buffer(buf)
    sendmodes.Attach_buffer(_shm_buffer(buf))


def Detach_buffer():
    """MPI's (its error, or what it hands back where none was attached), then shmcoll's, if it has one."""
    got = MPI.Detach_buffer()
    try:
        sendmodes.Detach_buffer()
    except MPIError:
        pass
    return got


def Flush_buffer():
    MPI.Flush_buffer()
    sendmodes.Flush_buffer()


def Iflush_buffer():
    """shmcoll's buffered sends flushed now, MPI's request for its own (a
    request MPICH cannot test after Get_status: waited on by itself)."""
    req = MPI.Iflush_buffer()
    with _SHM:
        sendmodes.Flush_buffer()
    return Request(req)         # not tracked: _kick's Get_status on it breaks its Test under MPICH


MODULE = {"Request": Request, "Prequest": Prequest, "Message": Message, "Attach_buffer": Attach_buffer,
          "Detach_buffer": Detach_buffer, "Flush_buffer": Flush_buffer, "Iflush_buffer": Iflush_buffer}
