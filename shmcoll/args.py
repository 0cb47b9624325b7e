"""Argument checking for the buffer collectives of one rank (Args: its
rank and the communicator's size): specs made plain (shmcoll.spec),
IN_PLACE turned into this rank's own block or piece, sizes, overlaps and
roots checked, so that Comm's methods only key, plan and run.  Every
problem raises here, on this rank, naming the argument."""
import contextlib
import threading

import numpy as np

from . import buffers, ops, spec
from ._core import ffi
from .buffers import IN_PLACE
from .coll import select
from .errors import ERR_ROOT, ArgumentError


def apart(s0, sbytes, r0, rbytes):
    """Refuse a send and a receive buffer that share a byte."""
    if sbytes and rbytes and s0 < r0 + rbytes and r0 < s0 + sbytes:
        raise ValueError("sendbuf and recvbuf overlap; pass distinct buffers")


_made = threading.local()      # .arrays: what own() makes while a nonblocking call is planned


@contextlib.contextmanager
def keeping():
    """Collect what own() makes meanwhile, as (array, the address it copies
    or None): a nonblocking or persistent call's program goes on reading
    and writing them after its planning returns, so its request keeps
    them (and a persistent one copies them again at each start)."""
    _made.arrays = made = []
    try:
        yield made
    finally:
        _made.arrays = None


def own(ptr, start, nbytes, dt):
    """A fresh array of nbytes of dtype dt (bytes when they are not whole
    items): a copy of ptr's bytes from start, or scratch when ptr is None."""
    raw = np.empty(nbytes, np.uint8) if ptr is None else \
        np.frombuffer(ffi.buffer(ptr + start, nbytes), np.uint8).copy()
    made = getattr(_made, "arrays", None)
    if made is not None:
        made.append((raw, None if ptr is None else buffers.address(ptr) + start))
    return raw.view(dt.base) if nbytes % dt.itemsize == 0 else raw


class Args:
    def __init__(self, rank, size):
        self.rank, self.size = rank, size

    def blocks_of(self, op, name):
        """The blocks a spec's count is per in argument name of op
        (spec.BLOCKED; 0: the count is the whole message)."""
        return self.size if name in spec.BLOCKED.get(op, ()) else 0

    def root(self, root):
        if isinstance(root, (float, np.floating)) and np.isfinite(root):
            root = int(root)        # truncated, as mpi4py's C int conversion does
        if isinstance(root, (bool, np.bool_)) or not isinstance(root, (int, np.integer)) \
                or not 0 <= root < self.size:
            raise ArgumentError(ERR_ROOT, f"root must be a rank in 0..{self.size - 1}, not {root!r}")
        return int(root)

    # -- the block collectives: (send pointer, bytes, recv pointer, bytes,
    # dtype); a pointer (None: no buffer) holds its buffer, which may be a
    # copy made here, alive
    def bcast(self, buf, root):
        """(pointer, bytes, item size) of buf."""
        buf = spec.simple(buf, "buf", self.rank != root)
        return buffers.view(buf, "buf", writable=self.rank != root)

    def alltoall(self, sendbuf, recvbuf):
        """(..., sendbuf's item size): sendbuf IN_PLACE: recvbuf's blocks, copied."""
        recvbuf = spec.simple(recvbuf, "recvbuf", True, self.blocks_of("alltoall", "recvbuf"))
        sendbuf = spec.simple(sendbuf, "sendbuf", False, self.blocks_of("alltoall", "sendbuf"))
        if sendbuf is IN_PLACE:
            ptr, nbytes, _ = buffers.view(recvbuf, "recvbuf", writable=True)
            sendbuf = own(ptr, 0, nbytes, buffers.dtype_of(recvbuf))
        sptr, sbytes, sitem = buffers.view(sendbuf, "sendbuf", writable=False)
        rptr, rbytes, ritem = buffers.view(recvbuf, "recvbuf", writable=True)
        if sbytes != rbytes:
            raise ValueError(f"sendbuf has {sbytes} bytes but recvbuf has {rbytes}; they must match")
        item = max(sitem, ritem)
        if sbytes % (self.size * item):
            raise ValueError(f"sendbuf's {sbytes} bytes do not split into {self.size} equal blocks of whole "
                             f"{item}-byte elements")
        apart(buffers.address(sptr), sbytes, buffers.address(rptr), rbytes)
        return sptr, sbytes, rptr, rbytes, sitem

    def alltoallv(self, sendbuf, recvbuf, w=False):
        """(send pointer, bytes, recv pointer, bytes, this rank's row of
        the pieces table: bytes to each rank, their byte displacements,
        bytes from each rank, theirs) of v-specs (w: Alltoallw's w-specs);
        sendbuf IN_PLACE: recvbuf's pieces, copied."""
        p = self.size
        if w:
            rraw, rn, rd = spec.wvector(recvbuf, "recvbuf", p, True)
        else:
            rraw, rdt, rc, rd = spec.vector(recvbuf, "recvbuf", p, True)
            rn, rd = [c * rdt.itemsize for c in rc], [d * rdt.itemsize for d in rd]
        if sendbuf is IN_PLACE:
            sraw, sn, sd = own(ffi.from_buffer(rraw), 0, rraw.size, np.dtype(np.uint8)), rn, rd
        elif w:
            sraw, sn, sd = spec.wvector(sendbuf, "sendbuf", p, False)
        else:
            sraw, sdt, sc, sd = spec.vector(sendbuf, "sendbuf", p, False)
            sn, sd = [c * sdt.itemsize for c in sc], [d * sdt.itemsize for d in sd]
        sptr, rptr = ffi.from_buffer(sraw), ffi.from_buffer(rraw, require_writable=True)
        apart(buffers.address(sptr), sraw.size, buffers.address(rptr), rraw.size)
        return sptr, sraw.size, rptr, rraw.size, np.array([*sn, *sd, *rn, *rd], np.int64)

    def allgather(self, sendbuf, recvbuf):
        return self._collected("Allgather", sendbuf, spec.simple(recvbuf, "recvbuf", True, self.blocks_of("allgather", "recvbuf")),
                              self.rank)

    def gather(self, sendbuf, recvbuf, root):
        recvbuf = spec.simple(spec.root_only(recvbuf, self.rank, root), "recvbuf", True,
                              self.blocks_of("gather", "recvbuf"))
        return self._collected("Gather", sendbuf, recvbuf, root)

    def _collected(self, what, sendbuf, recvbuf, root):
        """Gather's arguments, and Allgather's: every rank a root of its
        own recvbuf (root = this rank)."""
        sendbuf = spec.simple(sendbuf, "sendbuf", False)
        if sendbuf is IN_PLACE:
            sendbuf = self.own_block(what, recvbuf, root)
        sptr, sbytes, sitem = buffers.view(sendbuf, "sendbuf", writable=False)
        rptr, rbytes, ritem = self.optional(recvbuf, "recvbuf", root, True)
        if self.rank == root:
            self.blocks("recvbuf", rbytes, sbytes)
            self.distinct(sptr, sbytes, rptr, rbytes, max(sitem, ritem))
        return sptr, sbytes, rptr, rbytes, buffers.dtype_of(sendbuf)

    def scatter(self, sendbuf, recvbuf, root):
        sendbuf = spec.simple(spec.root_only(sendbuf, self.rank, root), "sendbuf", False,
                              self.blocks_of("scatter", "sendbuf"))
        recvbuf = spec.simple(recvbuf, "recvbuf", True)
        if recvbuf is IN_PLACE:
            recvbuf = self.own_block("Scatter", sendbuf, root, "sendbuf", copy=False)
        rptr, rbytes, ritem = buffers.view(recvbuf, "recvbuf", writable=True)
        sptr, sbytes, sitem = self.optional(sendbuf, "sendbuf", root, False)
        if self.rank == root:
            self.blocks("sendbuf", sbytes, rbytes)
            self.distinct(sptr, sbytes, rptr, rbytes, max(sitem, ritem), block=rbytes)
        return sptr, sbytes, rptr, rbytes, buffers.dtype_of(recvbuf)

    def reduction(self, kind, sendbuf, recvbuf, op, inputs, root=0, counts=None):
        """(op, in place, send pointer, bytes, recv pointer, bytes, dtype) of
        a reduction.  inputs(recvbuf bytes) is the input's bytes that
        recvbuf of that size implies (None: none fits); in place recvbuf
        holds the input.  A Reduce's recvbuf off the root is only keyed
        (as the C entry keys it), never used."""
        op = ops.check_op(op)
        what = select.method(kind)
        inplace = sendbuf is IN_PLACE
        unused = kind == "reduce" and self.rank != root
        blocks = self.blocks_of(kind, "sendbuf")       # of a spec's count
        recvbuf = spec.simple(spec.root_only(recvbuf, self.rank, root) if kind == "reduce" else recvbuf, "recvbuf",
                              not unused, blocks if inplace else 0)
        sendbuf = spec.simple(sendbuf, "sendbuf", False, blocks)
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
            if rdt is not None and rdt != dt:       # mpi4py: a ValueError (a mismatch of datatypes)
                raise ValueError(f"{what}: sendbuf has dtype {dt} but recvbuf {rdt}; a reduction takes one dtype")
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
        if not inplace and rptr is not None:
            apart(buffers.address(sptr), sbytes, buffers.address(rptr), rbytes)
        return op, inplace, sptr, sbytes, rptr, rbytes, dt

    # -- IN_PLACE outside reductions: this rank's own piece, copied to send
    # from (or a scratch to receive it), so every algorithm runs unchanged.
    def own_block(self, what, buf, root, name="recvbuf", copy=True):
        """Block `root` of buf's p equal blocks (on the root only)."""
        self.in_place_root(what, root, name)
        ptr, nbytes, item = buffers.view(buf, name, writable=False)
        if nbytes % (self.size * item):
            raise ValueError(f"{what}: IN_PLACE, but {name}'s {nbytes} bytes do not split into {self.size} blocks "
                             f"of whole {item}-byte items")
        block = nbytes // self.size
        return own(ptr if copy else None, root * block, block, buffers.dtype_of(buf))

    def root_spec(self, what, given, name, root):
        """(pointer, item size, dtype, counts, displacements) of the root's
        v-spec, for own_piece."""
        self.in_place_root(what, root, name)
        if given is None:
            raise ValueError(f"{what}: the root needs {name} [buf, counts, displs, dtype]")
        ptr, _, item, dt, counts, displs = spec.vspec(given, name, self.size, name == "recvbuf")
        return ptr, item, dt, counts, displs

    @staticmethod
    def own_piece(what, ptr, item, dt, counts, displs, r, copy=True):
        if counts is None:
            raise ValueError(f"{what}: IN_PLACE needs counts (the buffer holds this rank's piece at its displacement)")
        return own(ptr if copy else None, displs[r] * item, counts[r] * item, dt)

    def in_place_root(self, what, root, name):
        """IN_PLACE (in place of the buffer other than `name`) off the root: refused."""
        if self.rank != root:
            other = "sendbuf" if name == "recvbuf" else "recvbuf"
            raise ValueError(f"{what}: IN_PLACE is for the root's {other} only (rank {self.rank} is not root {root})")

    def blocks(self, name, have, block):
        """name must hold one block of `block` bytes per rank."""
        if have != block * self.size:
            other = "recvbuf" if name == "sendbuf" else "sendbuf"
            raise ValueError(f"{name} has {have} bytes but {self.size} blocks of {other}'s {block} need "
                             f"{block * self.size}")

    def optional(self, buf, name, root, writable):
        """A buffer that matters on the root only: (ptr, bytes, itemsize),
        (None, -1, 0) for None off the root."""
        if buf is None:
            if self.rank == root:
                raise ValueError(f"the root needs {name}")
            return None, -1, 0          # keyed apart from an empty buffer, as the C entry does
        return buffers.view(buf, name, writable=writable and self.rank == root)

    @staticmethod
    def distinct(sptr, sbytes, rptr, rbytes, item, block=None):
        """Two buffers must not overlap, and their blocks hold whole items."""
        block = sbytes if block is None else block
        if block % item:
            raise ValueError(f"blocks of {block} bytes are not whole {item}-byte elements")
        apart(buffers.address(sptr), sbytes, buffers.address(rptr), rbytes)
