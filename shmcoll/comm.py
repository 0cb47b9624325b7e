"""The API layer: Comm, mpi4py-like.  Upper-case methods move buffers,
lower-case ones pickled objects.  Here we check arguments and select
algorithms; the device layer's C engine moves the data.

Errors: a local argument error raises on this rank and aborts the
communicator, so every other rank raises PeerAborted instead of waiting; a
peer's death raises PeerDied.  After either, the communicator is unusable."""
import pickle

import numpy as np

from . import buffers
from ._core import ffi, lib
from .coll import select
from .errors import PeerFailure, ShmcollError

_bcast, _alltoall, _check = lib.sc_bcast, lib.sc_alltoall, lib.sc_check
_KIND = {"bcast": 1, "alltoall": 2}


class Comm:
    def __init__(self, device):
        self._dev = device
        self._c = device.c
        self.plan = device.plan
        self.rank, self.size = device.rank, device.plan.nranks
        self.slots = device.plan.slots
        self._broken = None
        self._freed = False
        if self.size > 1 and (rc := lib.sc_probe_cma(self._c)):
            self._fail(rc, "communicator creation")
        self._forced = {op: select.forced(op, self.plan.params) for op in select.MODULES}
        select.fill_table(self)
        checked = {name: getattr(Comm, name).__get__(self) for name in ("Barrier", "Bcast", "Alltoall")}
        ids = {name: select.IDS[name.lower()] for name in checked}
        self.__dict__.update(device.entries(checked, self._failed, ids))

    def Get_rank(self):
        return self.rank

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
        exc = self._dev.failure(rc, what)
        if isinstance(exc, PeerFailure) or rc == lib.SC_EMISMATCH:   # the job is aborted
            self._break(exc)
        raise exc

    def _bad(self, exc):
        """A local argument error: abort so the other ranks raise too."""
        self._dev.abort(self.rank, 3)
        self._break(exc)
        raise exc

    def _break(self, exc):
        """From now on every call takes the checked methods, which refuse
        (saved references to the C entries decline to them too)."""
        self._broken = exc
        self._c.closed = 1
        for name in ("Barrier", "Bcast", "Alltoall"):
            self.__dict__.pop(name, None)

    def _usable(self):
        if isinstance(self._broken, ShmcollError) and not isinstance(self._broken, PeerFailure):
            raise self._broken
        if self._broken is not None:
            raise PeerFailure(self._broken.rank if isinstance(self._broken, PeerFailure) else self.rank,
                              f"failed earlier on this communicator ({self._broken}); it cannot be used")

    def _pick(self, op, algorithm, nbytes):
        """C id of the named algorithm, or of the automatic choice for nbytes."""
        if algorithm is None:
            algorithm = select.selected(self, op, nbytes)
        try:
            return select.algorithm_id(op, algorithm)
        except ValueError as e:
            self._bad(e)

    def selected(self, op, nbytes):
        """The algorithm that algorithm=None uses for op at nbytes."""
        return select.selected(self, op, nbytes)

    # -- collectives ---------------------------------------------------------
    # Each instance's Barrier/Bcast/Alltoall are C entries (device.entries)
    # for the common case; they hand every other call to these methods.

    def Barrier(self, algorithm=None):
        self._usable()
        rc = lib.sc_barrier(self._c, self._pick("barrier", algorithm, 0))
        if rc:
            self._fail(rc, "Barrier")

    def barrier(self):
        self.Barrier()

    def Bcast(self, buf, root=0, algorithm=None):
        self._usable()
        try:
            ptr, nbytes, _ = buffers.view(buf, "buf", writable=True)
            self._root(root)
        except (TypeError, ValueError) as e:
            self._bad(e)
        alg = self._pick("bcast", algorithm, nbytes)
        if self._c.check and (rc := _check(self._c, _KIND["bcast"], alg, root, nbytes)):
            self._fail(rc, "Bcast")
        rc = _bcast(self._c, alg, ptr, nbytes, root)
        if rc:
            self._fail(rc, "Bcast")

    def bcast(self, obj, root=0):
        """Pickle on the root; length first (8 B, inline), then the bytes."""
        n = np.zeros(1, np.int64)
        data = None
        if self.rank == root:
            data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
            n[0] = len(data)
        self.Bcast(n, root)
        buf = bytearray(data) if self.rank == root else bytearray(int(n[0]))
        self.Bcast(buf, root)
        return obj if self.rank == root else pickle.loads(buf)

    def Alltoall(self, sendbuf, recvbuf, algorithm=None):
        self._usable()
        try:
            sptr, sbytes, _ = buffers.view(sendbuf, "sendbuf", writable=False)
            rptr, rbytes, _ = buffers.view(recvbuf, "recvbuf", writable=True)
            if sbytes != rbytes:
                raise ValueError(f"sendbuf has {sbytes} bytes but recvbuf has {rbytes}; they must match")
            if sbytes % self.size:
                raise ValueError(f"sendbuf's {sbytes} bytes do not split into {self.size} equal blocks")
            s0, r0 = int(ffi.cast("uintptr_t", sptr)), int(ffi.cast("uintptr_t", rptr))
            if sbytes and s0 < r0 + rbytes and r0 < s0 + sbytes:
                raise ValueError("sendbuf and recvbuf overlap; pass distinct buffers")
        except (TypeError, ValueError) as e:
            self._bad(e)
        block = sbytes // self.size
        alg = self._pick("alltoall", algorithm, block)
        if self._c.check and (rc := _check(self._c, _KIND["alltoall"], alg, -1, block)):
            self._fail(rc, "Alltoall")
        rc = _alltoall(self._c, alg, sptr, rptr, block)
        if rc:
            self._fail(rc, "Alltoall")

    def alltoall(self, objs):
        """objs[i] goes to rank i.  One Alltoall of every rank's size vector
        gives all ranks the same table, hence one block width for the data."""
        if len(objs) != self.size:
            self._bad(ValueError(f"alltoall needs one object per rank ({self.size}), got {len(objs)}"))
        blobs = [pickle.dumps(o, pickle.HIGHEST_PROTOCOL) for o in objs]
        sizes = np.array([len(b) for b in blobs], np.int64)
        table = np.empty((self.size, self.size), np.int64)
        self.Alltoall(np.tile(sizes, (self.size, 1)), table)
        width = int(table.max())
        send = np.zeros((self.size, width), np.uint8)
        for i, b in enumerate(blobs):
            send[i, :len(b)] = np.frombuffer(b, np.uint8)
        recv = np.empty_like(send)
        self.Alltoall(send, recv)
        return [pickle.loads(recv[i, :table[i, self.rank]].tobytes()) for i in range(self.size)]

    def _root(self, root):
        if not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            raise ValueError(f"root must be a rank in 0..{self.size - 1}, not {root!r}")

    # -- lifetime -------------------------------------------------------------
    def Free(self):
        """Leave the communicator: peers see a clean exit, and calls here raise."""
        if not self._freed:
            self._freed = True
            self._dev.deregister()
            self._break(ShmcollError(f"rank {self.rank} freed this communicator"))

