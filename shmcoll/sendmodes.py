"""Buffered sends (Bsend, Ibsend, Bsend_init and their buffer: MPI's
Attach_buffer/Detach_buffer, process-wide or, MPI-4.1, per communicator),
ready sends, and Isendrecv(_replace): a mixin of Comm over p2p.py.

A buffered send completes at once, whatever the receiver does: it copies
the message and sends the copy as a nonblocking send.  The copies count
against the attached buffer as MPI's do (the message's bytes plus
BSEND_OVERHEAD each, until delivered), so a program that would overflow
its buffer under MPI gets ERR_BUFFER here too; BUFFER_AUTOMATIC (MPI-4.1)
has no bound.  A ready send is a standard send: MPI lets an
implementation do so."""
import threading

from . import buffers, p2p
from .errors import ERR_BUFFER, MPIError
from .request import PROC_NULL, Done, Request

BSEND_OVERHEAD = 96          # MPICH's, so programs size their buffers as they would there


class _Automatic:
    """BUFFER_AUTOMATIC: buffered sends take what memory they need."""

    def __repr__(self):
        return "<shmcoll.MPI.BUFFER_AUTOMATIC>"


BUFFER_AUTOMATIC = _Automatic()


class _Attached:
    """An attached buffer: its object, its size, the buffered sends in flight."""

    def __init__(self, buf):
        self.buf = buf
        self.size = None if buf is BUFFER_AUTOMATIC else memoryview(buffers.array(buf)).nbytes
        self.sends = []           # (request, bytes it holds)
        self.lock = threading.Lock()

    def take(self, nbytes, what):
        """Room for a copy of nbytes, or ERR_BUFFER (delivered copies give theirs back first)."""
        with self.lock:
            self.sends = [(q, n) for q, n in self.sends if not q._test()]
            used = sum(n for _, n in self.sends)
            if self.size is not None and used + nbytes + BSEND_OVERHEAD > self.size:
                raise MPIError(ERR_BUFFER, f"{what}: the attached buffer ({self.size} bytes, {used} in use) has no room "
                                           f"for {nbytes} bytes + BSEND_OVERHEAD ({BSEND_OVERHEAD}); attach a larger one")

    def pending(self):
        with self.lock:
            return [q for q, _ in self.sends]

    def flush(self):
        """Wait until every buffered send from it is delivered."""
        with self.lock:
            sends, self.sends = self.sends, []
        for q, _ in sends:
            q.Wait()


_process = [None]             # the process's attached buffer (MPI.Attach_buffer)


def _attach(slot, buf, where):
    if buf is None:
        raise MPIError(ERR_BUFFER, f"{where}Attach_buffer: no buffer (MPI.BUFFER_AUTOMATIC for one without bound)")
    if slot[0] is not None:
        raise MPIError(ERR_BUFFER, f"{where}Attach_buffer: a buffer is attached already; Detach_buffer it first")
    slot[0] = _Attached(buf)


def _detach(slot, where):
    """Deliver what the attached buffer holds, then hand it back (MPI's Detach_buffer blocks so)."""
    att = slot[0]
    if att is None:
        raise MPIError(ERR_BUFFER, f"{where}Detach_buffer: no buffer is attached")
    att.flush()
    slot[0] = None
    return att.buf


def _flush(slot):
    if slot[0] is not None:
        slot[0].flush()


class _Flush(Request):
    """Iflush_buffer: complete once the buffered sends in flight when it
    was made are delivered (those made later are not waited for)."""

    def __init__(self, slot):
        super().__init__()
        self._sends = slot[0].pending() if slot[0] is not None else []

    def _test(self):
        self._sends = [q for q in self._sends if not q._test()]
        return not self._sends

    def _idle(self):
        if self._sends:
            self._sends[0]._idle()


def Iflush_buffer():
    return _Flush(_process)


def Attach_buffer(buf):
    _attach(_process, buf, "")


def Detach_buffer():
    return _detach(_process, "")


def Flush_buffer():
    _flush(_process)


class _Pair(Request):
    """Isendrecv: a send and a receive, complete when both are; the
    receive's status and result."""

    def __init__(self, send, recv, keep=None):
        super().__init__()
        self._s, self._r, self._keep = send, recv, keep

    def _test(self):
        s, r = self._s._test(), self._r._test()
        if not (s and r):
            return False
        self._status, self._result, self._keep = self._r._status, self._r._result, None
        return True

    def _wait(self):
        self._s._wait()
        self._r._wait()
        self._test()

    def _idle(self):
        self._r._idle()


class SendModes:
    """Comm's buffered and ready sends and Isendrecv (p2p.PointToPoint sends them)."""

    def _attached(self):
        slot = self.__dict__.get("_bsend_slot")
        return slot[0] if slot and slot[0] is not None else _process[0]

    def Attach_buffer(self, buf):
        """MPI-4.1: a buffer for this communicator's buffered sends, used before the process's."""
        _attach(self.__dict__.setdefault("_bsend_slot", [None]), buf, "Comm.")

    def Detach_buffer(self):
        return _detach(self.__dict__.setdefault("_bsend_slot", [None]), "Comm.")

    def Flush_buffer(self):
        _flush(self.__dict__.setdefault("_bsend_slot", [None]))

    def Iflush_buffer(self):
        """MPI-4.1: a request complete once this communicator's buffered sends in flight are delivered."""
        return _Flush(self.__dict__.setdefault("_bsend_slot", [None]))

    def Ibsend(self, buf, dest, tag=0):
        """Complete when made: the message is copied into the attached buffer's room."""
        self._usable()
        dest = self._dest(dest, "Ibsend")
        if dest == PROC_NULL:
            return Done()
        copy = p2p._copy(p2p._buffer(self, buf, "Ibsend", False))
        att = self._attached()
        if att is None:
            raise MPIError(ERR_BUFFER, "Bsend: no buffer is attached (MPI.Attach_buffer)")
        att.take(len(copy), "Bsend")
        q = self.Isend(copy, dest, tag)
        with att.lock:
            att.sends.append((q, len(copy) + BSEND_OVERHEAD))
        return Done()

    def Bsend(self, buf, dest, tag=0):
        self.Ibsend(buf, dest, tag)

    def Bsend_init(self, buf, dest, tag=0):
        return p2p._Persistent(lambda: self.Ibsend(buf, dest, tag))

    def bsend(self, obj, dest, tag=0):
        self.Ibsend(p2p._dumps(obj), dest, tag)

    def ibsend(self, obj, dest, tag=0):
        return self.Ibsend(p2p._dumps(obj), dest, tag)

    def Rsend(self, buf, dest, tag=0):
        self.Send(buf, dest, tag)

    def Irsend(self, buf, dest, tag=0):
        return self.Isend(buf, dest, tag)

    def Rsend_init(self, buf, dest, tag=0):
        return self.Send_init(buf, dest, tag)

    def Isendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=p2p.ANY_SOURCE, recvtag=p2p.ANY_TAG):
        recv = self.Irecv(recvbuf, source, recvtag)
        return _Pair(self.Isend(sendbuf, dest, sendtag), recv)

    def Isendrecv_replace(self, buf, dest, sendtag=0, source=p2p.ANY_SOURCE, recvtag=p2p.ANY_TAG):
        copy = p2p._copy(p2p._buffer(self, buf, "Isendrecv_replace", True))
        recv = self.Irecv(buf, source, recvtag)
        return _Pair(self.Isend(copy, dest, sendtag), recv, copy)
