"""Point-to-point (Send/Recv and their nonblocking, synchronous, persistent,
probing and object forms) on a communicator: a mixin of Comm, with
mpi4py's signatures.  The protocols live in the device layer (csrc/p2p.c,
docs/p2p.md): a blocking call is one C call that waits there.

Nonblocking calls that cannot finish at once are kept here, in call order:
sends waiting for room in their ring (per destination, so later sends to
it queue behind them), and posted receives (matched in the order they were
posted, so a blocking receive made while some are posted queues behind
them too).  request.register'ed poll advances them from every Wait and
Test; one lock per communicator guards them, never held across a wait."""
import array
import functools
import pickle
import sys
import threading
import warnings

import numpy as np

from . import buffers, request, spec
from .coll import select
from ._core import lib
from .device import P2P, p2p_entry
from .errors import ERR_RANK, ERR_REQUEST, ERR_TAG, ERR_TRUNCATE, MPIError
from .request import ANY_SOURCE, ANY_TAG, PROC_NULL, Done as _Done, Prequest, Request, Status

TAG_UB = lib.SC_TAG_UB        # MPICH's: tags 0 .. TAG_UB
_send, _sent, _recv, _probe, _mrecv, _bell, _idle = (P2P[k] for k in ("send", "sent", "recv", "probe", "mrecv",
                                                                      "bell", "idle"))
#: id of a communicator's point-to-point state -> the communicator, while it has nonblocking calls pending
#: (_p2p_pending): held, so that its calls go on (a handle, MPI.Comm(comm), shares comm's state and equals it)
_busy = {}
SHARED_NS = 200_000           # a wait that must also advance other engines' work looks at them this often


def _busy_as(comm, pp, pending):
    """comm (its state pp) in _busy while pending, and C told whether any is (sc_p2p_busy)."""
    if pending:
        _busy[id(pp)] = comm
    else:
        _busy.pop(id(pp), None)
    lib.sc_p2p_busy(bool(_busy))


def hold(owner, pending):
    """owner (its _p2p_poll() advances work outside shmcoll: the multi-node
    face's MPI requests) has work pending that every wait here must
    advance, as a communicator's pending calls are."""
    _busy_as(owner, owner, pending)


def _poll():
    if _busy:
        for comm in list(_busy.values()):
            comm._p2p_poll()


request.register(_poll)


def _buffer(comm, buf, name, writable):
    """A contiguous buffer C reads or writes: buf itself, or a spec's or a
    Fortran-ordered array's items as a C-ordered array over its memory.  A
    bad one aborts the job, as a collective's bad argument does."""
    if (type(buf) is np.ndarray and buf.flags.c_contiguous and (buf.flags.writeable or not writable)
            and buf.dtype.isnative and not buf.dtype.hasobject):
        return buf              # the common case, as the checks below would pass it
    if buf is None:
        return None             # no buffer: an empty message
    try:
        buf = buffers.array(buf)        # DLPack, CUDA array interface: the numpy array over them
        if isinstance(buf, (list, tuple)):
            return spec.simple(buf, name, writable)
        return buffers.checked(buf, name, writable)[0]     # as a collective's buffer: the same checks
    except (TypeError, ValueError, BufferError) as e:
        comm._bad(e)


class _P2P:
    """A communicator's pending nonblocking point-to-point."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sends = {}        # dest -> [SendRequest, ...] not yet in the ring, in call order
        self.recvs = []        # posted RecvRequests, in posting order
        self.ahead = None      # (source, tag) of those not yet matched, as C reads them (_pairs)


def _truncated(x):
    """A float rank or tag as mpi4py takes it (C's int conversion
    truncates: osu_multi_lat's partner is nprocs / 2 + rank, a float)."""
    return int(x) if isinstance(x, (float, np.floating)) and np.isfinite(x) else x   # nan, inf: refused as before


def _covered(failed, source, tag):
    """Whether an unmatched receive before this one fits every message this
    one fits: this one then passes over them all (they are that one's),
    so it cannot match now either, and need not look (a window of
    receives of one source and tag looks once, not once per receive)."""
    return ((source, tag) in failed or (ANY_SOURCE, tag) in failed or (source, ANY_TAG) in failed
            or (ANY_SOURCE, ANY_TAG) in failed)


def _pairs(pairs):
    """Unmatched posted receives' (source, tag) for C: a message one fits is
    theirs, so a later receive or a probe passes it over (MPI's matching
    order, even for a message that arrived after they last looked)."""
    return array.array("i", pairs).tobytes() if pairs else None


_ENTRIES = (("Send", ("buf", "dest", "tag")), ("Recv", ("buf", "source", "tag", "status")),
            ("Sendrecv", ("sendbuf", "dest", "sendtag", "recvbuf", "source", "recvtag", "status")),
            ("Alltoallv", ("sendbuf", "recvbuf", "algorithm")), ("Isend", ("buf", "dest", "tag")),
            ("Irecv", ("buf", "source", "tag")), ("Gatherv", ("sendbuf", "recvbuf", "root", "algorithm")),
            ("Scatterv", ("sendbuf", "recvbuf", "root", "algorithm")))
_ISEND = 4                    # Isend's kind in _ENTRIES: made()'s first argument
_STATUS_FIELDS = tuple(sys.intern(f) for f in ("source", "tag", "nbytes", "error", "cancelled"))


class PointToPoint:
    """Comm's point-to-point methods."""

    def _p2p_bind(self):
        """Send, Recv, Sendrecv, Alltoallv, Gatherv, Scatterv (point-to-point underneath), Isend and Irecv of this
        instance: C entries for plain buffers (csrc/p2p.c fast()), the methods for anything else."""
        for kind, (name, names) in enumerate(_ENTRIES):
            routed = select.collective(name) in select.ROUTED
            if routed and self._forced.get(name.lower()):
                continue                # an algorithm forced by options: the method runs its schedule
            failed = self._pieces_failed if routed else self._p2p_failed
            state = (self._dev.addr, getattr(type(self), name).__get__(self),
                     functools.partial(failed, name), tuple(sys.intern(n) for n in names), Status,
                     _STATUS_FIELDS, kind, (request.Complete, _Received, self._made),
                     select.TABLE[name.lower()][0] if routed else 0)     # whose arrival program it runs
            self.__dict__[name] = p2p_entry(state)

    def _made(self, kind, buf, rank, tag, handle):
        """The request of an Isend whose rendezvous the C entry began, or of an
        Irecv it posts (handle: the sequence number; the stage of a staged
        message it matched, or None)."""
        if kind == _ISEND:
            return _SendRequest.begun(self, buf, rank, tag, handle)
        return _RecvRequest.posted(self, buf, rank, tag, handle)

    # -- checks and failures ------------------------------------------------------
    @property
    def _pp(self):
        pp = self.__dict__.get("_p2p_state")
        if pp is None:
            pp = self.__dict__.setdefault("_p2p_state", _P2P())
        return pp

    @property
    def _ctx(self):
        return self._dev.addr

    def _dest(self, dest, what):
        if type(dest) is int and 0 <= dest < self.size:
            return dest
        dest = _truncated(dest)
        if not isinstance(dest, (int, np.integer)) or not (0 <= dest < self.size or dest == PROC_NULL):
            self._bad(MPIError(ERR_RANK, f"{what}: invalid rank {dest!r} (communicator of {self.size})"))
        return int(dest)

    def _source(self, source, what):
        source = _truncated(source)
        if not isinstance(source, (int, np.integer)) or not (-2 <= source < self.size):
            self._bad(MPIError(ERR_RANK, f"{what}: invalid source rank {source!r} (communicator of {self.size})"))
        return int(source)

    def _tag(self, tag, what, any_ok):
        if type(tag) is int and 0 <= tag <= TAG_UB:
            return tag
        tag = _truncated(tag)
        if not isinstance(tag, (int, np.integer)) or not (0 <= tag <= TAG_UB or (any_ok and tag == ANY_TAG)):
            self._bad(MPIError(ERR_TAG, f"{what}: invalid tag {tag!r} (0 .. {TAG_UB}"
                                        f"{', or ANY_TAG' if any_ok else ''})"))
        return int(tag)

    def _p2p_pending(self):
        """Tell the fast entries whether nonblocking calls are pending (then they decline)."""
        pp = self._pp
        self._c.p2p_pending = (lib.SC_P2P_SENDS if pp.sends else 0) | (lib.SC_P2P_RECVS if pp.recvs else 0)
        _busy_as(self, pp, bool(pp.sends or pp.recvs))

    def _p2p_failed(self, what, rc, got):
        """A fast entry's failure: raise as the method would (the communicator
        broken first); an Irecv whose message was here but longer than its
        buffer, as MPI's, raises at its completion (its error handler
        returning)."""
        self._usable()
        if what == "Irecv" and rc == lib.SC_ETRUNCATE and self._returns():
            try:
                self._p2p_check(rc, what, got)
            except MPIError as e:
                return _RecvRequest.failed(self, e)
        self._p2p_check(rc, what, got)

    def _p2p_check(self, rc, what, got=None, status=None):
        """rc from a C entry: itself when not an error, else raise (the job
        aborted); a truncated message's source, tag and size into status,
        as MPI fills it."""
        if rc >= 0 or rc == lib.SC_EAGAIN:
            return rc
        if rc == lib.SC_ETRUNCATE:
            e = MPIError(ERR_TRUNCATE, f"{what}: message of {got[3]} bytes from rank {got[1]} (tag {got[2]}) "
                                       f"truncated: the receive buffer is shorter")
            e.found = (got[1], got[2], got[3])
            request._failed(status, e)
            self._bad(e)
        self._fail(rc, what)

    def _p2p_poll(self):
        """Advance what is pending: queued sends, then posted receives."""
        pp = self.__dict__.get("_p2p_state")
        if pp is None or not (pp.sends or pp.recvs):
            return
        if self._broken is not None or getattr(self, "_freed", False):
            _busy_as(self, pp, False)   # its pending calls stay pending: nothing will move them
            return
        with pp.lock:
            for dest in list(pp.sends):
                q = pp.sends[dest]
                while q and q[0]._push():
                    q.pop(0)
                if not q:
                    del pp.sends[dest]
            keep, pairs, failed = [], [], set()
            for r in pp.recvs:
                if r._stage is None and _covered(failed, r._source, r._tag):
                    keep.append(r)      # it would pass over every message it fits: an earlier one's
                elif not r._match(_pairs(pairs)):
                    keep.append(r)
                    if r._stage is None:
                        pairs += (r._source, r._tag)
                        failed.add((r._source, r._tag))
            pp.recvs, pp.ahead = keep, _pairs(pairs)
            self._p2p_pending()

    # -- blocking -------------------------------------------------------------------
    def _send_blocking(self, buf, dest, tag, sync, what):
        self._usable()
        dest, tag = self._dest(dest, what), self._tag(tag, what, False)
        if dest == PROC_NULL:
            return
        if _busy:                   # pending work (maybe another communicator's) may be what the peer waits for
            return _SendRequest(self, buf, dest, tag, sync, what).Wait()
        try:
            rc = _send(self._ctx, dest, tag, buf, True, sync)
        except (BufferError, TypeError, ValueError):
            rc = _send(self._ctx, dest, tag, _buffer(self, buf, what, False), True, sync)
        self._p2p_check(rc, what)

    def Send(self, buf, dest, tag=0):
        self._send_blocking(buf, dest, tag, False, "Send")

    def Ssend(self, buf, dest, tag=0):
        """Completes once a receive has taken the message."""
        self._send_blocking(buf, dest, tag, True, "Ssend")

    def Recv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        self._usable()
        source, tag = self._source(source, "Recv"), self._tag(tag, "Recv", True)
        if source == PROC_NULL:
            return _proc_null(status)
        if _busy:                   # posted receives match first; pending sends (any communicator's) need pushing
            return _RecvRequest(self, buf, source, tag, "Recv").Wait(status)
        try:
            got = _recv(self._ctx, source, tag, buf, True, None, None)
        except (BufferError, TypeError, ValueError):
            got = _recv(self._ctx, source, tag, _buffer(self, buf, "Recv", True), True, None, None)
        self._p2p_check(got[0], "Recv", got, status)
        if status is not None:
            status._found(got[1], got[2], got[3])

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE, recvtag=ANY_TAG, status=None):
        self._usable()
        recvbuf = _buffer(self, recvbuf, "Sendrecv", True)     # a bad one raises before anything is sent
        req = self.Isend(sendbuf, dest, sendtag)
        self.Recv(recvbuf, source, recvtag, status)
        req.Wait()

    def Sendrecv_replace(self, buf, dest, sendtag=0, source=ANY_SOURCE, recvtag=ANY_TAG, status=None):
        b = _buffer(self, buf, "Sendrecv_replace", True)
        self.Sendrecv(_copy(b), dest, sendtag, b, source, recvtag, status)

    # -- nonblocking and persistent ---------------------------------------------------
    def Isend(self, buf, dest, tag=0):
        return _SendRequest(self, buf, dest, tag, False, "Isend")

    def Issend(self, buf, dest, tag=0):
        return _SendRequest(self, buf, dest, tag, True, "Issend")

    def Irecv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG):
        return _RecvRequest(self, buf, source, tag, "Irecv")

    def Send_init(self, buf, dest, tag=0):
        return _Persistent(lambda: self.Isend(buf, dest, tag))

    def Ssend_init(self, buf, dest, tag=0):
        return _Persistent(lambda: self.Issend(buf, dest, tag))

    def Recv_init(self, buf, source=ANY_SOURCE, tag=ANY_TAG):
        return _Persistent(lambda: self.Irecv(buf, source, tag))

    # -- probes ---------------------------------------------------------------------------
    def _probe_c(self, source, tag, block, detach, what):
        self._usable()
        source, tag = self._source(source, what), self._tag(tag, what, True)
        if source == PROC_NULL:
            return None
        while True:
            seen = _bell(self._ctx)
            self._p2p_poll()        # posted receives match before a probe sees their messages
            pending = self._pp.recvs or self._pp.sends
            got = _probe(self._ctx, source, tag, block and not pending, detach, self._pp.ahead if self._pp.recvs else None)
            if not (block and pending and got[0] == 1):
                break
            self._p2p_check(_idle(self._ctx, seen, source if source >= 0 else -1, 0), what)
        self._p2p_check(got[0], what)
        return got

    def Probe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        got = self._probe_c(source, tag, True, False, "Probe")
        _found(status, got)
        return True

    def Iprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        got = self._probe_c(source, tag, False, False, "Iprobe")
        if got is not None and got[0] == 1:
            return False
        _found(status, got)
        return True

    def Mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        got = self._probe_c(source, tag, True, True, "Mprobe")
        _found(status, got)
        return MESSAGE_NO_PROC if got is None else Message(self, got)

    def Improbe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        got = self._probe_c(source, tag, False, True, "Improbe")
        if got is not None and got[0] == 1:
            return None
        _found(status, got)
        return MESSAGE_NO_PROC if got is None else Message(self, got)

    probe = Probe
    iprobe = Iprobe
    mprobe = Mprobe
    improbe = Improbe

    # -- objects (pickled) --------------------------------------------------------------------
    def send(self, obj, dest, tag=0):
        self.Send(_dumps(obj), dest, tag)

    def ssend(self, obj, dest, tag=0):
        self.Ssend(_dumps(obj), dest, tag)

    def isend(self, obj, dest, tag=0):
        return self.Isend(_dumps(obj), dest, tag)

    def issend(self, obj, dest, tag=0):
        return self.Issend(_dumps(obj), dest, tag)

    def recv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """The next object from source with tag (buf, mpi4py's preallocated buffer, is not needed)."""
        if buf is not None:
            warnings.warn("recv: the buf argument is not used (the message's own size is received)", UserWarning,
                          stacklevel=2)
        return self.Mprobe(source, tag, status).recv()

    def irecv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG):
        return _RecvRequest(self, None, source, tag, "irecv", obj=True)

    def sendrecv(self, sendobj, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE, recvtag=ANY_TAG, status=None):
        req = self.isend(sendobj, dest, sendtag)
        obj = self.recv(None, source, recvtag, status)
        req.Wait()
        return obj


def _loads(data):
    """An object from its pickle; an empty message is None (as mpi4py reads one)."""
    return pickle.loads(data) if len(data) else None


def _copy(buf):
    """A buffer's bytes, taken now (None: none)."""
    return b"" if buf is None else bytes(memoryview(buf).cast("B"))


def _dumps(obj):
    return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)


def _proc_null(status):
    if status is not None:
        status._found(PROC_NULL, ANY_TAG, 0)


def _found(status, got):
    if status is None:
        return
    if got is None:
        _proc_null(status)
    else:
        status._found(got[1], got[2], got[3])


class _P2PRequest(Request):
    """What both directions share: an efficient wait on this rank's doorbell."""
    _who = -1

    def _wait(self):
        comm = self._comm
        alone = len(request._engines) == 1      # else other engines' work may be what a peer needs first
        if self._test():                        # complete (an eager send, a matched receive): no doorbell pass
            if not alone:
                request.progress()              # every call advances the other engines' work
            return
        comm._usable()          # freed or broken: its error (MPIError, PeerFailure), not the C layer's
        while True:
            seen = _bell(comm._ctx)
            if alone:
                comm._p2p_poll()   # a peer's rendezvous may wait on a receive of ours posted earlier
            else:
                request.progress()
            if self._test():
                return
            comm._p2p_check(_idle(comm._ctx, seen, self._who, 0 if alone else SHARED_NS), self._what)

    def _idle(self):
        comm = self._comm
        comm._p2p_check(_idle(comm._ctx, _bell(comm._ctx), self._who, SHARED_NS), self._what)


class _SendRequest(_P2PRequest):
    @classmethod
    def begun(cls, comm, buf, dest, tag, seq):
        """The request of a rendezvous the C entry began (its checks passed
        there): buf held, as C reads its memory till the copy is done."""
        self = object.__new__(cls)
        Request.__init__(self)
        self._comm, self._what, self._dest, self._tag, self._sync, self._who = comm, "Isend", dest, tag, False, dest
        self._buf = _buffer(comm, buf, "Isend", False)     # a view (an export) held: C reads it till the copy
        self._seq, self._queued, self._done = seq, False, False
        return self

    def __init__(self, comm, buf, dest, tag, sync, what):
        super().__init__()
        comm._usable()
        self._comm, self._what = comm, what
        dest, tag = comm._dest(dest, what), comm._tag(tag, what, False)
        self._dest, self._tag, self._sync, self._who = dest, tag, sync, dest
        self._seq = 0              # a rendezvous in flight: its number
        self._queued = False
        if dest == PROC_NULL:
            self._done = True
            return
        self._buf = _buffer(comm, buf, what, False)      # held: a rendezvous reads it until complete
        self._done = False
        pp = comm._pp
        with pp.lock:
            if pp.sends.get(dest) or not self._push():
                self._queued = True
                pp.sends.setdefault(dest, []).append(self)
                comm._p2p_pending()

    def _push(self):
        """Put it in the ring if there is room (under the lock): True once there."""
        rc = self._comm._p2p_check(_send(self._comm._ctx, self._dest, self._tag, self._buf, False, self._sync),
                                   self._what)
        if rc == lib.SC_EAGAIN:
            return False
        self._queued = False
        if rc == 0:
            self._done = True
        else:
            self._seq = rc
        return True

    def _test(self):
        if not self._done:
            if self._queued:
                self._comm._p2p_poll()
            if self._seq and self._comm._usable() is None and self._comm._p2p_check(
                    _sent(self._comm._ctx, self._dest, self._seq, False), self._what):
                self._done = True
        if self._done:
            self._buf = None
        return self._done


class _RecvRequest(_P2PRequest):
    _obj = False
    _error = None           # this receive's own error (a truncated message), for its Wait or Test

    @classmethod
    def failed(cls, comm, e):
        """An Irecv whose message it took and truncated when made: e raises at its Wait or Test."""
        self = object.__new__(cls)
        Request.__init__(self)
        self._comm, self._what, self._source, self._tag, self._who = comm, "Irecv", e.found[0], e.found[1], -1
        self._got, self._stage, self._cancelled, self._buf, self._error = None, None, False, None, e
        return self

    @classmethod
    def posted(cls, comm, buf, source, tag, stage):
        """An Irecv the C entry checked and posts, matching nothing now (stage
        None: receives posted before it match first, or no message is here),
        or whose staged message it matched."""
        self = object.__new__(cls)
        Request.__init__(self)
        self._comm, self._what, self._source, self._tag = comm, "Irecv", source, tag
        self._who, self._got, self._stage, self._cancelled = source if source >= 0 else -1, None, stage, False
        self._buf = _buffer(comm, buf, "Irecv", True)
        pp = comm._pp
        with pp.lock:
            pp.recvs.append(self)
            if len(pp.recvs) == 1:         # the first: the communicator has receives posted from now
                comm._p2p_pending()
        return self

    def __init__(self, comm, buf, source, tag, what, obj=False):
        super().__init__()
        comm._usable()
        self._comm, self._what, self._obj = comm, what, obj
        self._source, self._tag = comm._source(source, what), comm._tag(tag, what, True)
        self._who = self._source if self._source >= 0 else -1
        self._got = None
        self._stage = None
        self._cancelled = False
        if self._source == PROC_NULL:
            self._got = (0, PROC_NULL, ANY_TAG, 0)
            return
        self._buf = None if obj else _buffer(comm, buf, what, True)
        pp = comm._pp
        with pp.lock:
            if pp.recvs or not self._match(None):
                pp.recvs.append(self)
                comm._p2p_pending()

    def _match(self, ahead):
        """Try to take its message (under the lock), passing over those the
        unmatched receives posted before it (ahead) fit: True once matched.
        A message it cannot hold is taken all the same (as MPI's is) and
        its error kept for this request's Wait or Test to raise: raised
        here, from a poll, it would reach whichever call polled and leave
        this receive posted, to take the next message in its place."""
        try:
            return self._take(ahead)
        except MPIError as e:
            self._error = e
            return True

    def _take(self, ahead):
        comm = self._comm
        if self._obj:
            got = _probe(comm._ctx, self._source, self._tag, False, True, ahead)
            if got[0] == 1:
                return False
            comm._p2p_check(got[0], self._what)
            data = bytearray(got[3])
            got = _mrecv(comm._ctx, got[4], data)
            comm._p2p_check(got[0], self._what, got)
            self._result = _loads(data)
        else:
            got = _recv(comm._ctx, self._source, self._tag, self._buf, False, self._stage, ahead)
            self._stage = got[4]        # a staged message matched: its pieces still to come
            if got[0] in (1, 2):
                return False
            comm._p2p_check(got[0], self._what, got)
        self._got = got
        return True

    def _test(self):
        if self._got is None and not self._cancelled:
            self._comm._p2p_poll()
        if self._error is not None:
            err, self._error = self._error, None
            self._active, self._null, self._buf = False, True, None
            raise err
        if self._cancelled:
            self._status = Status()
            self._status._found(ANY_SOURCE, ANY_TAG, 0)
            self._status.cancelled = True
            return True
        if self._got is None:
            return False
        self._status = Status()
        self._status._found(*self._got[1:4])
        self._buf = None
        return True

    def _cancel(self):
        pp = self._comm._pp
        with pp.lock:
            if self in pp.recvs and self._stage is None:      # not yet matched
                pp.recvs.remove(self)
                self._cancelled = True
                self._comm._p2p_pending()


class _Received(request.Complete):
    """An Irecv matched when made: the C entry set _got, (source, tag, bytes)."""
    _got = None

    def _test(self):
        if self._got is not None:
            self._status = Status()
            self._status._found(*self._got)
            self._got = None
        return True


request.Request.Waitall = staticmethod(p2p_entry((request.Complete, _Received, request.Request.Waitall,
                                                   request.progress, _RecvRequest), "Waitall"))


class _Persistent(Prequest):
    """Send_init/Recv_init: each Start makes the nonblocking call anew."""

    def __init__(self, start):
        super().__init__()
        self._make, self._req = start, None

    def _start(self):
        self._req = self._make()

    def _test(self):
        if not self._req._test():
            return False
        self._status, self._result = self._req._status, self._req._result
        return True

    def _wait(self):
        self._req._wait()
        self._status, self._result = self._req._status, self._req._result

    def _cancel(self):
        self._req._cancel()


class Message:
    """A message Mprobe took out of matching: only its Recv gets it."""

    def __init__(self, comm, got):
        self._comm, self._got = comm, got

    @classmethod
    def probe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return comm.Mprobe(source, tag, status)

    @classmethod
    def iprobe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return comm.Improbe(source, tag, status)

    def _take(self, buf, status):
        """Receive into buf (None: drop); None for MESSAGE_NO_PROC."""
        if self._got is None:
            raise MPIError(ERR_REQUEST, "Message: a null message, or one already received")
        if self._comm is None:
            _proc_null(status)
            return None
        comm, got = self._comm, self._got
        self._got = None
        out = _mrecv(comm._ctx, got[4], buf)
        comm._p2p_check(out[0], "Message.Recv", out, status)
        if status is not None:
            status._found(out[1], out[2], out[3])
        return out

    def Recv(self, buf, status=None):
        self._take(None if self._comm is None else _buffer(self._comm, buf, "Message.Recv", True), status)

    def Irecv(self, buf):
        st = Status()
        self.Recv(buf, st)
        return _Done(st)

    def recv(self, status=None):
        data = bytearray(self._got[3] if self._got is not None else 0)
        if self._take(data, status) is None:
            return None
        return _loads(data)

    def irecv(self):
        st = Status()
        return _Done(st, self.recv(st))

    def __bool__(self):
        return self._got is not None


MESSAGE_NULL = Message(None, None)
MESSAGE_NO_PROC = Message(None, (0, PROC_NULL, ANY_TAG, 0, 0))
