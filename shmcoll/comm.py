"""The API layer: Comm, mpi4py-like.  Upper-case methods move buffers,
lower-case ones pickled objects.  Here we check arguments, select the
algorithm and plan its schedule; the device layer compiles it and its C
executor runs it.

A call's life: the instance's C fast entry (device.entry) looks the
program up by (collective, algorithm, root, byte counts, item size) and
runs it; on a miss, or anything unusual, it hands the call to the method
below, which checks everything, plans, compiles, installs the program for
the next time, and runs it.

Errors: any error inside a collective call on this rank (bad argument,
pickling, Ctrl-C) raises here and aborts the communicator, so every other
rank raises PeerFailure instead of waiting or pairing with the wrong call;
a peer's death raises PeerDied.  After either, the communicator is unusable."""
import dataclasses
import functools
import pickle

import numpy as np

from . import buffers, ops
from ._core import ffi, lib
from .buffers import IN_PLACE
from .coll import select
from .device import TWIN_ALG, fingerprint, learn_dtype
from .errors import MismatchError, PeerFailure, ShmcollError
from .ops import BUILTINS, SUM
from .sched import Call

#: In a reduction's signature, the op of a rank that passed IN_PLACE: a
#: rank in place plans its inputs' moves differently, so ranks must agree.
INPLACE_OP = 0x80


def collective(fn):
    """Run a Comm method so that any error it raises aborts the communicator."""
    @functools.wraps(fn)
    def method(self, *args, **kw):
        self._usable()
        try:
            return fn(self, *args, **kw)
        except ShmcollError:
            raise
        except BaseException as e:
            self._bad(e)
    return method


OPCODES = {op: op.code for op in BUILTINS.values()}    # the C entries' built-in ops
COMBINED = 1024     # bytes a rank deposits when sizes are unknown: size, capacity (24) and up to 1000 of data


def _pickled(obj):
    return np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), np.uint8)


def _displs(sizes):
    return tuple(int(d) for d in np.concatenate([[0], np.cumsum(sizes)[:-1]]))


def _unpickled(buf, sizes):
    at = np.concatenate([[0], np.cumsum(sizes)])
    return [pickle.loads(buf[at[i]:at[i + 1]].tobytes()) for i in range(len(sizes))]


def _apart(s0, sbytes, r0, rbytes):
    """Refuse a send and a receive buffer that share a byte."""
    if sbytes and rbytes and s0 < r0 + rbytes and r0 < s0 + sbytes:
        raise ValueError("sendbuf and recvbuf overlap; pass distinct buffers")


def _own(ptr, start, nbytes, dt):
    """A fresh array of nbytes of dtype dt (bytes when they are not whole
    items): a copy of ptr's bytes from start, or scratch when ptr is None."""
    raw = np.empty(nbytes, np.uint8) if ptr is None else \
        np.frombuffer(ffi.buffer(ptr + start, nbytes), np.uint8).copy()
    return raw.view(dt) if nbytes % dt.itemsize == 0 else raw


def _what(op):
    """The method name messages use for op."""
    return select.TABLE[op][2] or op.capitalize()


class Comm:
    def __init__(self, device):
        self._dev = device
        self._c = device.c
        self.plan = device.plan
        self.rank, self.size = device.rank, device.plan.nranks
        self.slots = device.plan.slots
        self._broken = None
        self._freed = False
        self._forced = {op: select.forced(op, self.plan.params) for op in select.TABLE}
        self._probe_cma()
        for op, (cid, _, name, roles, argnames) in select.TABLE.items():
            if name is None:
                continue
            method = getattr(Comm, name).__get__(self)
            handler = functools.partial(self._failed, name)
            self.__dict__[name] = device.entry(method, handler, select.IDS[op], cid, roles,
                                               (argnames, OPCODES, IN_PLACE, SUM))

    def _probe_cma(self):
        """Single copies need every rank able to read every other: each
        tries its right neighbour once all have registered, and all learn
        every verdict, so every rank plans the same schedules.  Flat
        algorithms: every rank compiles each whole schedule, so at start-up,
        with hundreds of ranks, a schedule of n^2 moves or n rounds costs
        far more than waiting on rank 0."""
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
        exc = self._dev.failure(rc, what, functools.partial(self._words, what))
        if rc == lib.SC_EBUSY:          # the other thread's call goes on; ours is a local error
            self._bad(exc)
        if rc != lib.SC_EDIFFER:        # the job is aborted (a check-round refusal leaves it usable)
            self._break(exc)
        raise exc

    def _words(self, what, field, value, when):
        if field == 1:
            return select.OPS.get(value, value)
        if field == 3 and (what.endswith("v") or what == "Reduce_scatter"):
            return f"counts and displacements #{value:x}"
        if field == 5:
            name = next((o.name for o in BUILTINS.values() if o.code == value & ~INPLACE_OP), f"op {value}")
            return name + " with IN_PLACE" * bool(value & INPLACE_OP)
        if field == 6 and when == 0:                 # this call's collective names the ids
            names, alg = select.NAMES[what.lower()], value & ~TWIN_ALG
            name = names[alg] if 0 <= alg < len(names) else alg
            return f"{name} (automatic: single copy or staged, as timed)" if value & TWIN_ALG else name
        return f"algorithm id {value}" if field == 6 else value

    def _bad(self, exc):
        """A local error: abort so the other ranks raise too."""
        self._dev.abort(self.rank, 3)
        self._break(exc)
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

    def _twinned(self, op, call, nbytes, algorithm=None):
        """Whether the automatic choice runs call as twins (adapt), and the
        call its single-copy program plans: single copy wherever it might
        win (the default cma_bytes rule lowered to adapt; a cma_bytes the
        user set stays)."""
        p = self.plan.params
        if algorithm is not None or self._forced[op] is not None or not call.cma or not 0 < p["adapt"] <= nbytes:
            return False, call
        if p["cma_opt"] is None and call.params["cma_bytes"] > p["adapt"]:
            call = dataclasses.replace(call, params=dict(call.params, cma_bytes=p["adapt"]))
        return True, call

    def selected(self, op, nbytes, root=0, dtype=None):
        """The algorithm that algorithm=None uses for op at nbytes (a
        reduction's: of that dtype; twins: the single-copy program's)."""
        select.algorithms(op)
        call = self._twinned(op, select.typed(op, self._call(nbytes, root), dtype), nbytes)[1]
        return select.pick(op, call, None, self._forced[op])

    def schedule(self, op, nbytes=0, root=0, algorithm=None, dtype=None):
        """The schedule this communicator runs for op (nbytes: the buffer for
        bcast, one block for alltoall; a reduction's: of that dtype; twins:
        the single-copy program's)."""
        select.algorithms(op)
        call = self._twinned(op, select.typed(op, self._call(nbytes, root), dtype), nbytes, algorithm)[1]
        return select.plan(op, select.pick(op, call, algorithm, self._forced[op]), call)

    def twins(self):
        """Calls that the automatic choice runs as twins (single copy, or
        staged: whichever rank 0 timed faster, the adapt option): a list
        of {collective, bytes (as adapt counts them), us (rank 0's
        estimates of each: single copy, staged), runs (calls this rank ran
        each)}, one per program this rank keeps (a root's apart)."""
        return [{"collective": select.OPS[k[0] & 0xff], "bytes": n, "us": tuple(e / 1000 for e in est),
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
             red=None):
        """Plan (cached by key), then run this rank's program.  dtype: the
        datatype the signature holds; counts: a v-variant's (bytes,
        displacement) per rank, held in the signature by a hash; red: a
        reduction's (op, kernel, in place)."""
        call = self._call(nbytes, root)
        call.counts = counts
        opcode = 0
        if red is not None:
            opcode, call.kernel, call.inplace = red[0].code, red[1], red[2]
            call.item = red[1].item
            if call.inplace and op != "reduce":     # IN_PLACE on every rank or none (MPI): ranks plan alike
                opcode |= INPLACE_OP
        alt = None
        twin, call = self._twinned(op, call, nbytes, algorithm)
        if twin:
            staged = dataclasses.replace(call, cma=False)       # its twin: what runs without single copy
            alt = (nbytes, functools.partial(select.plan, op, select.pick(op, staged), staged))
        name = select.pick(op, call, algorithm, self._forced[op])
        cid, what = select.TABLE[op][0], _what(op)
        sigbytes = None if counts is None else hash(counts) & ((1 << 62) - 1)
        code = 0 if dtype is None else buffers.dtype_code(dtype)
        if lib.sc_own(self._c):     # another thread is running a call: touch nothing it uses
            self._fail(lib.SC_EBUSY, what)
        try:
            prog = self._dev.program(key, cid, select.IDS[op][name], lambda: select.plan(op, name, call), code,
                                     sigbytes, tail, opcode, alt)
        finally:
            lib.sc_disown(self._c)
        rc = self._dev.execute(prog, saddr, raddr)
        if rc:
            self._fail(rc, what)

    def _key(self, op, algorithm, root, len0, len1, itemsize):
        alg = -1 if algorithm is None else select.IDS[op][select.check_name(op, algorithm)]
        return (select.TABLE[op][0], alg, root, len0, len1, itemsize, 0)

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
        self._root(root)
        root = int(root)
        ptr, nbytes, itemsize = buffers.view(buf, "buf", writable=self.rank != root)
        addr = buffers.address(ptr)
        self._run("bcast", self._key("bcast", algorithm, root, nbytes, 0, itemsize), nbytes, root, algorithm,
                  addr, addr)

    @collective
    def bcast(self, obj, root=0):
        """Pickle on the root; length first (8 B, inline), then the bytes."""
        self._root(root)
        n = np.zeros(1, np.int64)
        data = None
        if self.rank == root:
            data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
            n[0] = len(data)
        self.Bcast(n, root)
        buf = bytearray(data) if self.rank == root else bytearray(int(n[0]))
        self.Bcast(buf, root)
        return obj if self.rank == root else pickle.loads(buf)

    @collective
    def Alltoall(self, sendbuf, recvbuf, algorithm=None):
        """sendbuf IN_PLACE: recvbuf holds the blocks to send (copied first)."""
        if sendbuf is IN_PLACE:
            ptr, nbytes, _ = buffers.view(recvbuf, "recvbuf", writable=True)
            sendbuf = _own(ptr, 0, nbytes, buffers.dtype_of(recvbuf))
        sptr, sbytes, sitem = buffers.view(sendbuf, "sendbuf", writable=False)
        rptr, rbytes, ritem = buffers.view(recvbuf, "recvbuf", writable=True)
        if sbytes != rbytes:
            raise ValueError(f"sendbuf has {sbytes} bytes but recvbuf has {rbytes}; they must match")
        item = max(sitem, ritem)
        if sbytes % (self.size * item):
            raise ValueError(f"sendbuf's {sbytes} bytes do not split into {self.size} equal blocks of whole "
                             f"{item}-byte elements")
        s0, r0 = buffers.address(sptr), buffers.address(rptr)
        _apart(s0, sbytes, r0, rbytes)
        block = sbytes // self.size
        self._run("alltoall", self._key("alltoall", algorithm, 0, sbytes, rbytes, sitem), block, 0, algorithm,
                  s0, r0)

    @collective
    def alltoall(self, objs):
        """objs[i] goes to rank i.  One Alltoall of every rank's size vector
        gives all ranks the same table, hence one block width for the data."""
        if len(objs) != self.size:
            raise ValueError(f"alltoall needs one object per rank ({self.size}), got {len(objs)}")
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

    @collective
    def Allgather(self, sendbuf, recvbuf, algorithm=None):
        """sendbuf IN_PLACE: this rank's block is already in recvbuf."""
        if sendbuf is IN_PLACE:
            sendbuf = self._own_block("Allgather", recvbuf, self.rank)
        sptr, sbytes, sitem = buffers.view(sendbuf, "sendbuf", writable=False)
        rptr, rbytes, ritem = buffers.view(recvbuf, "recvbuf", writable=True)
        self._blocks("recvbuf", rbytes, sbytes)
        s0, r0 = self._distinct(sptr, sbytes, rptr, rbytes, max(sitem, ritem))
        dt = buffers.dtype_of(sendbuf)
        self._run("allgather", self._key("allgather", algorithm, 0, sbytes, rbytes, self._dkey(dt)), sbytes, 0,
                  algorithm, s0, r0, dt)

    @collective
    def Gather(self, sendbuf, recvbuf=None, root=0, algorithm=None):
        """recvbuf matters on the root only (None elsewhere); sendbuf
        IN_PLACE on the root: its block is already in recvbuf."""
        root = self._root(root)
        if sendbuf is IN_PLACE:
            sendbuf = self._own_block("Gather", recvbuf, root)
        sptr, sbytes, sitem = buffers.view(sendbuf, "sendbuf", writable=False)
        rptr, rbytes, ritem = self._optional(recvbuf, "recvbuf", root, True)
        s0 = buffers.address(sptr)
        if self.rank == root:
            self._blocks("recvbuf", rbytes, sbytes)
            s0, _ = self._distinct(sptr, sbytes, rptr, rbytes, max(sitem, ritem))
        dt = buffers.dtype_of(sendbuf)
        self._run("gather", self._key("gather", algorithm, root, sbytes, rbytes, self._dkey(dt)), sbytes, root,
                  algorithm, s0, buffers.address(rptr) if rptr is not None else 0, dt)

    @collective
    def Scatter(self, sendbuf, recvbuf, root=0, algorithm=None):
        """sendbuf matters on the root only (None elsewhere); recvbuf
        IN_PLACE on the root: its block stays in sendbuf."""
        root = self._root(root)
        if recvbuf is IN_PLACE:
            recvbuf = self._own_block("Scatter", sendbuf, root, "sendbuf", copy=False)
        rptr, rbytes, ritem = buffers.view(recvbuf, "recvbuf", writable=True)
        sptr, sbytes, sitem = self._optional(sendbuf, "sendbuf", root, False)
        r0 = buffers.address(rptr)
        if self.rank == root:
            self._blocks("sendbuf", sbytes, rbytes)
            _, r0 = self._distinct(sptr, sbytes, rptr, rbytes, max(sitem, ritem), block=rbytes)
        dt = buffers.dtype_of(recvbuf)
        self._run("scatter", self._key("scatter", algorithm, root, sbytes, rbytes, self._dkey(dt)), rbytes, root,
                  algorithm, buffers.address(sptr) if sptr is not None else 0, r0, dt)

    @collective
    def Allgatherv(self, sendbuf, recvbuf, algorithm=None):
        """recvbuf: [buf, counts, displs, dtype] (mpi4py's forms; counts and
        displacements in items, displacements packed when left out).  With
        no counts, sizes and data travel together (see _collect) and land
        packed in rank order."""
        rptr, rbytes, ritem, dt, counts, displs = buffers.vspec(recvbuf, "recvbuf", self.size, True)
        if sendbuf is IN_PLACE:
            sendbuf = self._own_piece("Allgatherv", rptr, ritem, dt, counts, displs, self.rank)
        sptr, sbytes, sitem = buffers.view(sendbuf, "sendbuf", writable=False)
        if counts is None:
            _, pieces = self._collect(np.frombuffer(ffi.buffer(sptr, sbytes), np.uint8), rbytes, ritem)
            out = np.frombuffer(ffi.buffer(rptr, rbytes), np.uint8)
            at = 0
            for piece in pieces:
                out[at:at + piece.size] = piece
                at += piece.size
            return
        self._vrun("allgatherv", algorithm, 0, sptr, sbytes, rptr, rbytes, ritem, dt, counts, displs, "sendbuf")

    def _collect(self, data, capacity=-1, item=1):
        """Every rank's bytes (uint8 arrays) in rank order, and their sizes,
        without knowing the sizes up front: paper 003's store-and-forward
        Collect, each rank's size riding with its data in one round; a
        second round of exactly the sizes only when a piece exceeds the
        combined block.  Each rank's receive capacity (bytes, item size;
        -1: any) rides along too, so every rank refuses a too-small one."""
        block = np.zeros(COMBINED, np.uint8)
        block[:24].view(np.int64)[:] = (data.size, capacity, item)
        if data.size <= COMBINED - 24:
            block[24:24 + data.size] = data
        got = np.empty((self.size, COMBINED), np.uint8)
        self.Allgather(block, got)
        head = got[:, :24].copy().view(np.int64).reshape(self.size, 3)
        sizes = head[:, 0]
        for r, (_, cap, it) in enumerate(head):
            if cap >= 0 and (sizes.sum() > cap or (sizes % it).any()):
                raise ValueError(f"rank {r}'s recvbuf holds {cap // it} items of {it} bytes but the ranks sent "
                                 f"{[int(n) for n in sizes]} bytes")
        if sizes.max() <= COMBINED - 24:
            return sizes, [got[r, 24:24 + sizes[r]] for r in range(self.size)]
        recv = np.empty(int(sizes.sum()), np.uint8)
        self.Allgatherv(data, [recv, [int(n) for n in sizes]])
        at = np.concatenate([[0], np.cumsum(sizes)])
        return sizes, [recv[at[r]:at[r + 1]] for r in range(self.size)]

    @collective
    def Gatherv(self, sendbuf, recvbuf=None, root=0, algorithm=None):
        """recvbuf on the root: [buf, counts, displs, dtype].  The root's
        counts go to every rank first (a small Bcast), so each checks its
        own and all plan the same schedule.  sendbuf IN_PLACE on the root:
        its piece is already in recvbuf."""
        root = self._root(root)
        if sendbuf is IN_PLACE:
            sendbuf = self._own_piece("Gatherv", *self._root_spec("Gatherv", recvbuf, "recvbuf", root), root)
        sptr, sbytes, sitem = buffers.view(sendbuf, "sendbuf", writable=False)
        rptr, rbytes, ritem, dt, counts, displs = self._root_vspec("Gatherv", recvbuf, "recvbuf", root, True, sitem,
                                                                   buffers.dtype_of(sendbuf))
        self._vrun("gatherv", algorithm, root, sptr, sbytes, rptr, rbytes, ritem, dt, counts, displs, "sendbuf")

    @collective
    def Scatterv(self, sendbuf, recvbuf, root=0, algorithm=None):
        """sendbuf on the root: [buf, counts, displs, dtype]; the counts go
        to every rank first, as in Gatherv.  recvbuf IN_PLACE on the root:
        its piece stays in sendbuf."""
        root = self._root(root)
        if recvbuf is IN_PLACE:
            recvbuf = self._own_piece("Scatterv", *self._root_spec("Scatterv", sendbuf, "sendbuf", root), root,
                                      copy=False)
        rptr, rbytes, ritem = buffers.view(recvbuf, "recvbuf", writable=True)
        sptr, sbytes, sitem, dt, counts, displs = self._root_vspec("Scatterv", sendbuf, "sendbuf", root, False, ritem,
                                                                   buffers.dtype_of(recvbuf))
        self._vrun("scatterv", algorithm, root, sptr, sbytes, rptr, rbytes, sitem, dt, counts, displs, "recvbuf")

    @collective
    def allgather(self, obj):
        """Every rank's object, in rank order: sizes and pickles together,
        in one round when each fits the combined block (_collect)."""
        _, pieces = self._collect(_pickled(obj))
        return [pickle.loads(p.tobytes()) for p in pieces]

    @collective
    def gather(self, obj, root=0):
        """Every rank's object on the root (a list), None elsewhere."""
        root = self._root(root)
        data = _pickled(obj)
        sizes = np.empty(self.size, np.int64)
        self.Allgather(np.array([data.size], np.int64), sizes)
        recv = np.empty(int(sizes.sum()) if self.rank == root else 0, np.uint8)
        self._vrun("gatherv", None, root, *self._bytes(data), *self._bytes(recv), 1, recv.dtype, tuple(sizes),
                   _displs(sizes), "sendbuf")
        return _unpickled(recv, sizes) if self.rank == root else None

    @collective
    def scatter(self, objs, root=0):
        """objs[i] (a sequence on the root) goes to rank i."""
        root = self._root(root)
        sizes = np.zeros(self.size, np.int64)
        send = np.zeros(0, np.uint8)
        if self.rank == root:
            if objs is None or len(objs) != self.size:
                raise ValueError(f"scatter needs one object per rank ({self.size}) on the root")
            blobs = [_pickled(o) for o in objs]
            sizes[:] = [b.size for b in blobs]
            send = np.concatenate(blobs)
        self.Bcast(sizes, root)
        recv = np.empty(int(sizes[self.rank]), np.uint8)
        self._vrun("scatterv", None, root, *self._bytes(send), *self._bytes(recv), 1, recv.dtype, tuple(sizes),
                   _displs(sizes), "recvbuf")
        return pickle.loads(recv.tobytes())

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
        root = self._root(root)
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
        rdt = buffers.dtype_of(recvbuf)
        if recvcounts is None:
            if sendbuf is IN_PLACE:
                raise ValueError("Reduce_scatter: IN_PLACE needs recvcounts (recvbuf holds the whole input)")
            _, rbytes, _ = buffers.view(recvbuf, "recvbuf", writable=True)
            every = np.empty(self.size, np.int64)
            self.Allgather(np.array([rbytes // rdt.itemsize], np.int64), every)
            recvcounts = every
        counts = buffers.ints(recvcounts, "Reduce_scatter: recvcounts", self.size)
        item = rdt.itemsize
        pieces = tuple((int(c) * item, int(d) * item) for c, d in zip(counts, np.cumsum(counts) - counts))
        total = sum(n for n, _ in pieces)
        mine = pieces[self.rank][0]
        self._reduction("reduce_scatter", sendbuf, recvbuf, op, algorithm, lambda n: total if n == mine else None,
                        counts=pieces)

    @collective
    def Scan(self, sendbuf, recvbuf, op=SUM, algorithm=None):
        """Rank r gets rank 0's op ... op rank r's input."""
        self._reduction("scan", sendbuf, recvbuf, op, algorithm, lambda n: n)

    @collective
    def Exscan(self, sendbuf, recvbuf, op=SUM, algorithm=None):
        """Rank r gets rank 0's op ... op rank r-1's input; rank 0's recvbuf
        is left as it is."""
        self._reduction("exscan", sendbuf, recvbuf, op, algorithm, lambda n: n)

    def _reduction(self, kind, sendbuf, recvbuf, op, algorithm, inputs, root=0, counts=None):
        """Check and run a reduction.  inputs(recvbuf bytes) is the input's
        bytes that recvbuf of that size implies (None: none fits); in place
        recvbuf holds the input.  A Reduce's recvbuf off the root is only
        keyed (as the C entry keys it), never used."""
        op = ops.check_op(op)
        what = _what(kind)
        inplace = sendbuf is IN_PLACE
        unused = kind == "reduce" and self.rank != root
        rptr, rbytes, _ = (None, -1, 0) if recvbuf is None else buffers.view(recvbuf, "recvbuf", writable=not unused)
        if unused:
            rptr = None
        elif rptr is None:
            raise ValueError(f"{what}: recvbuf is needed" + (" on the root" if kind == "reduce" else ""))
        rdt = buffers.dtype_of(recvbuf) if rptr is not None else None
        if inplace:
            sptr, sbytes, dt = rptr, rbytes, rdt
        else:
            sptr, sbytes, _ = buffers.view(sendbuf, "sendbuf", writable=False)
            dt = buffers.dtype_of(sendbuf)
            if rdt is not None and rdt != dt:
                raise TypeError(f"{what}: sendbuf has dtype {dt} but recvbuf {rdt}; a reduction takes one dtype")
        if dt.hasobject:
            raise TypeError(f"{what}: dtype {dt} holds Python objects")
        if counts is not None and sum(n for n, _ in counts) != sbytes:
            raise ValueError(f"{what}: recvcounts sum to {sum(n for n, _ in counts) // dt.itemsize} items but the "
                             f"input has {sbytes // dt.itemsize}")
        if rptr is not None and not inplace and inputs(rbytes) != sbytes:
            raise ValueError(f"{what}: recvbuf has {rbytes} bytes, which does not fit sendbuf's {sbytes}"
                             + (f" ({self.size} blocks of recvbuf's size)" if kind == "reduce_scatter_block" else "")
                             + (f" (this rank's recvcount: {counts[self.rank][0]} bytes)" if counts else ""))
        if kind == "reduce_scatter_block" and sbytes % (self.size * dt.itemsize):
            raise ValueError(f"{what}: {sbytes} bytes do not split into {self.size} blocks of whole {dt} items")
        if sbytes % dt.itemsize:
            raise ValueError(f"{what}: {sbytes} bytes are not whole {dt} items")
        s0 = buffers.address(sptr)
        r0 = buffers.address(rptr) if rptr is not None else 0
        if not inplace and rptr is not None:
            _apart(s0, sbytes, r0, rbytes)
        if not op.builtin:
            return self._user_reduction(kind, op, sptr, sbytes, rptr, dt, root, counts)
        kern = ops.kernel(op, dt)
        learn_dtype(dt, dt.itemsize, np.ndarray)
        key = self._key(kind, algorithm, root, -2 if inplace else sbytes, rbytes, self._dkey(dt))
        key = (key[0] | op.code << 8,) + key[1:]          # the op, as the C entry keys it
        if counts is not None:
            key = key + (counts,)        # Python-only: not a C entry key
        self._run(kind, key, sbytes, root, algorithm, s0, r0, dt, counts, red=(op, kern, inplace))

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
        acc = self._fold(every, op.block, {"scan": self.rank + 1, "exscan": self.rank}.get(kind, self.size))
        if acc is None:
            return
        if kind in ("reduce_scatter_block", "reduce_scatter"):
            b = counts or [(sbytes // self.size, r * sbytes // self.size) for r in range(self.size)]
            nb, off = b[self.rank]
            acc = acc.view(np.uint8)[off:off + nb]
        out = np.frombuffer(ffi.buffer(rptr, acc.nbytes), np.uint8)
        out[:] = np.ascontiguousarray(acc).view(np.uint8).reshape(-1)

    @collective
    def allreduce(self, obj, op=SUM):
        ops.check_op(op)
        return self._fold(self.allgather(obj), op, self.size)

    @collective
    def reduce(self, obj, op=SUM, root=0):
        ops.check_op(op)
        objs = self.gather(obj, self._root(root))
        return self._fold(objs, op, self.size) if self.rank == root else None

    @collective
    def scan(self, obj, op=SUM):
        ops.check_op(op)
        return self._fold(self.allgather(obj), op, self.rank + 1)

    @collective
    def exscan(self, obj, op=SUM):
        """None on rank 0."""
        ops.check_op(op)
        return self._fold(self.allgather(obj), op, self.rank)

    @staticmethod
    def _fold(objs, op, upto):
        """objs[0] op ... op objs[upto - 1], in rank order (None if upto is 0):
        objects, or a user op's blocks (op: Op.block)."""
        if upto == 0:
            return None
        acc = objs[0]
        for o in objs[1:upto]:
            acc = op(acc, o)
        return acc

    def _bytes(self, a):
        ptr, n, _ = buffers.view(a, "buffer", writable=False)
        return ptr, n

    def _root_vspec(self, what, spec, name, root, writable, item, dt):
        """The root's v-spec (pointer, bytes, item size, dtype; None, None,
        item, dt elsewhere) and, on every rank, the root's counts and
        displacements."""
        ptr = nbytes = counts = displs = None
        if self.rank == root:
            if spec is None:
                raise ValueError(f"{what}: the root needs {name} [buf, counts, displs, dtype]")
            ptr, nbytes, item, dt, counts, displs = buffers.vspec(spec, name, self.size, writable)
            if counts is None:
                raise ValueError(f"{what}: {name} on the root must give counts: [buf, counts, displs, dtype]")
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
        s0 = buffers.address(sptr) if sptr is not None else 0
        r0 = buffers.address(rptr) if rptr is not None else 0
        if sptr is not None and rptr is not None:
            _apart(s0, sbytes, r0, rbytes)
        if op == "allgatherv":          # the fast entry's key: it has the same counts on every rank
            tail = list(counts) + list(displs)
            key = self._key(op, algorithm, 0, sbytes, rbytes, self._dkey(dt))[:-1] + (fingerprint(counts, displs),)
        else:
            alg = -1 if algorithm is None else select.IDS[op][select.check_name(op, algorithm)]
            key, tail = (select.TABLE[op][0], alg, root, buffers.dtype_code(dt), pieces), None
        self._run(op, key, sum(n for n, _ in pieces), root, algorithm, s0, r0, dt, pieces, tail)

    # -- IN_PLACE outside reductions: this rank's own piece, copied to send
    # from (or a scratch to receive it), so every algorithm runs unchanged.
    def _own_block(self, what, spec, root, name="recvbuf", copy=True):
        """Block `root` of spec's p equal blocks (on the root only)."""
        self._in_place_root(what, root, name)
        ptr, nbytes, item = buffers.view(spec, name, writable=False)
        if nbytes % (self.size * item):
            raise ValueError(f"{what}: IN_PLACE, but {name}'s {nbytes} bytes do not split into {self.size} blocks "
                             f"of whole {item}-byte items")
        block = nbytes // self.size
        return _own(ptr if copy else None, root * block, block, buffers.dtype_of(spec))

    def _root_spec(self, what, spec, name, root):
        """(pointer, item size, dtype, counts, displacements) of the root's
        v-spec, for _own_piece."""
        self._in_place_root(what, root, name)
        if spec is None:
            raise ValueError(f"{what}: the root needs {name} [buf, counts, displs, dtype]")
        ptr, _, item, dt, counts, displs = buffers.vspec(spec, name, self.size, name == "recvbuf")
        return ptr, item, dt, counts, displs

    def _own_piece(self, what, ptr, item, dt, counts, displs, r, copy=True):
        if counts is None:
            raise ValueError(f"{what}: IN_PLACE needs counts (the buffer holds this rank's piece at its displacement)")
        return _own(ptr if copy else None, displs[r] * item, counts[r] * item, dt)

    def _in_place_root(self, what, root, name):
        """IN_PLACE (in place of the buffer other than `name`) off the root: refused."""
        if self.rank != root:
            other = "sendbuf" if name == "recvbuf" else "recvbuf"
            raise ValueError(f"{what}: IN_PLACE is for the root's {other} only (rank {self.rank} is not root {root})")

    def _blocks(self, name, have, block):
        """name must hold one block of `block` bytes per rank."""
        if have != block * self.size:
            other = "recvbuf" if name == "sendbuf" else "sendbuf"
            raise ValueError(f"{name} has {have} bytes but {self.size} blocks of {other}'s {block} need "
                             f"{block * self.size}")

    def _optional(self, buf, name, root, writable):
        """A buffer that matters on the root only: (ptr, bytes, itemsize),
        (None, 0, 0) for None off the root."""
        if buf is None:
            if self.rank == root:
                raise ValueError(f"the root needs {name}")
            return None, -1, 0          # keyed apart from an empty buffer, as the C entry does
        return buffers.view(buf, name, writable=writable and self.rank == root)

    def _distinct(self, sptr, sbytes, rptr, rbytes, item, block=None):
        """Addresses of two buffers that do not overlap and whose blocks
        hold whole items."""
        block = sbytes if block is None else block
        if block % item:
            raise ValueError(f"blocks of {block} bytes are not whole {item}-byte elements")
        s0, r0 = buffers.address(sptr), buffers.address(rptr)
        _apart(s0, sbytes, r0, rbytes)
        return s0, r0

    def _root(self, root):
        if isinstance(root, (bool, np.bool_)) or not isinstance(root, (int, np.integer)) \
                or not 0 <= root < self.size:
            raise ValueError(f"root must be a rank in 0..{self.size - 1}, not {root!r}")
        return int(root)

    # -- lifetime -------------------------------------------------------------
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
        rc = lib.sc_last_look(self._c) if self._broken is None else 0
        other = self._dev.deregister(self._broken is None and not rc)
        self._break(ShmcollError(f"rank {self.rank} freed this communicator"))
        if rc:
            op = select.OPS.get(self._c.prev[0] & 0xff)
            what = _what(op) if op else "Free"
            raise self._dev.failure(rc, what, functools.partial(self._words, what))
        if other is not None:
            r, theirs, ours = other
            raise MismatchError(f"Free: the ranks made different numbers of calls: rank {r} left after {theirs}, "
                                f"rank {self.rank} after {ours} (a root's calls wait on no one, so one's extra "
                                f"calls reached no one)")
