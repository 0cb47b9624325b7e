"""Buffer specs as mpi4py reads them (its msgbuffer.pxi), made plain.

A spec names part of a buffer: [buf, dtype], [buf, count], [buf, count,
dtype], [buf, (count, displ)], [buf, (count, displ), dtype] or [buf, count,
displ, dtype]; count and displ in items of dtype (the buffer's own when
left out).  Where a collective's argument holds one block per rank (an
Alltoall's two buffers, an Allgather's or a Gather root's recvbuf, a
Scatter root's sendbuf, a Reduce_scatter_block's sendbuf), count is per
block and the spec spans blocks x count items; elsewhere count is the whole
message.  A count left out is what the buffer holds past displ, split into
the blocks.  simple() turns a spec into a numpy array over exactly those
items, so the collectives see one form and plain arrays never come here.

A v-spec (Allgatherv's recvbuf, a Gatherv root's recvbuf, a Scatterv
root's sendbuf): [buf, counts], [buf, dtype], [buf, counts, dtype], [buf,
(counts, displs)], [buf, (counts, displs), dtype] or [buf, counts, displs,
dtype]; counts one int per rank or one int for every rank (None: the
buffer split as evenly as it goes, the lower ranks one more), displs one
per rank, one stride (rank r at r x stride) or None (packed).  [buf,
counts, displs] is refused, as mpi4py refuses it.  A w-spec (Alltoallw):
[buf, (counts, displs), types] or [buf, counts, displs, types], counts in
items of each rank's datatype, displacements in bytes (MPI's).

A datatype is an MPI datatype (.base, .count, Get_size: contiguous ones)
or anything numpy names a dtype by."""
import itertools
import operator

import numpy as np

from . import buffers
from ._core import ffi
from .buffers import BOTTOM, IN_PLACE
from .device import learn_dtype


#: the arguments that hold one block per rank, where a spec's count is per
#: block (and Reduce_scatter_block's recvbuf with IN_PLACE, which the C
#: entries leave to Python): args.py reads them so, and so do the C
#: entries (Comm passes them, csrc/pyfast.c simple_spec)
BLOCKED = {"alltoall": ("sendbuf", "recvbuf"), "allgather": ("recvbuf",), "gather": ("recvbuf",),
           "scatter": ("sendbuf",), "reduce_scatter_block": ("sendbuf",)}


def is_datatype(x):
    """What mpi4py takes as the datatype of a spec: an MPI datatype (duck
    typed: .base, .count, Get_size), or anything numpy names a dtype by
    (a typecode string, a dtype, a scalar type)."""
    return isinstance(x, (str, np.dtype, type)) or hasattr(x, "base") and hasattr(x, "Get_size")


def datatype(x, name):
    """The numpy dtype of a spec's datatype: an MPI datatype of count
    items of its base (Create_contiguous) as a subarray dtype, whose
    arrays are plain arrays of the base, count items per element."""
    if hasattr(x, "base") and hasattr(x, "Get_size"):
        if x.base is None:                  # mpi4py: a null datatype in a message is a ValueError
            raise ValueError(f"{name}: the datatype is DATATYPE_NULL")
        base, count = np.dtype(x.base), int(getattr(x, "count", 1))
        dt = base if count == 1 else np.dtype((base, (count,)))
        if dt.itemsize != x.Get_size():
            raise TypeError(f"{name}: datatype {x!r} is not contiguous ({x.Get_size()} bytes, {dt.itemsize} of data)")
    else:
        try:
            if isinstance(x, str) and not x.isprintable():
                raise TypeError(x)          # numpy reads '\0' as bool
            dt = np.dtype(x)
        except TypeError:
            if isinstance(x, str):          # mpi4py looks typecodes up in a table: an unknown one is a KeyError
                raise KeyError(f"{name}: {x!r} is not a typecode") from None
            raise TypeError(f"{name}: {x!r} is not a datatype") from None
    if dt.hasobject or dt.itemsize == 0:
        raise TypeError(f"{name}: datatype {dt} is not plain data of whole bytes")
    if dt.subdtype is None:
        learn_dtype(dt, dt.itemsize, np.ndarray)   # the C entries take specs of it from now on
    return dt


def _index(x, name, what):
    try:
        n = operator.index(x)
    except TypeError:
        raise TypeError(f"{name}: the {what} must be an integer, not {x!r}") from None
    if n < 0:
        raise ValueError(f"{name}: negative {what} {n}")
    return n


def _pair(x, name, what):
    if len(x) != 2:
        raise ValueError(f"{name}: ({what}) must be 2 items, got {len(x)}")
    return x[0], x[1]


def _raw(buf, dtype, name, writable):
    """The whole buffer as bytes (a uint8 array), and the spec's dtype."""
    if buf is None:
        raw = np.empty(0, np.uint8)
    else:
        b = buffers.checked(buf, name, writable, dtype is not None)[0]  # contiguous, plain, writable where written
        raw = np.asarray(b).reshape(-1).view(np.uint8) if isinstance(b, np.ndarray) else np.frombuffer(b, np.uint8)
    if dtype is None:
        return raw, buffers.dtype_of(buf) if buf is not None else np.dtype(np.uint8)
    return raw, datatype(dtype, name)


def _simple_items(spec, name):
    n = len(spec)
    count = displ = dtype = None
    if n == 2:
        buf, count = spec
        if is_datatype(count):
            count, dtype = None, count
        elif isinstance(count, (list, tuple)):
            count, displ = _pair(count, name, "count, displacement")
    elif n == 3:
        buf, count, dtype = spec
        if isinstance(count, (list, tuple)):
            count, displ = _pair(count, name, "count, displacement")
    elif n == 4:
        buf, count, displ, dtype = spec
    else:
        raise ValueError(f"{name}: a buffer spec is 2 to 4 items ([buf, count, dtype], [buf, count, displ, dtype], "
                         f"...), got {n}")
    return buf, count, displ, dtype


def simple(spec, name, writable, blocks=0):
    """spec as a plain array (anything but a list or tuple as it is);
    blocks > 1: the argument holds that many blocks, count is per block."""
    if not isinstance(spec, (list, tuple)):
        return spec
    buf, count, displ, dtype = _simple_items(spec, name)
    raw, dt = _raw(buf, dtype, name, writable)
    ext = dt.itemsize
    at = 0 if displ is None else _index(displ, name, "displacement") * ext
    if at > raw.size:
        raise ValueError(f"{name}: displacement {at // ext} is past the buffer's {raw.size // ext} {dt} items")
    length = raw.size - at
    per = f" per rank ({blocks} blocks)" if blocks > 1 else ""
    if count is None:
        if length % ext:
            raise ValueError(f"{name}: cannot infer the count: {length} bytes are not whole {dt} items")
        if blocks > 1 and length // ext % blocks:
            raise ValueError(f"{name}: cannot infer the count: {length // ext} {dt} items do not split into "
                             f"{blocks} blocks, one per rank")
        nbytes = length
    else:
        nbytes = _index(count, name, "count") * ext * max(blocks, 1)
        if nbytes > length:
            raise ValueError(f"{name}: {count} {dt} items{per} need {nbytes} bytes but the buffer has {length}"
                             + (f" past displacement {at // ext}" if at else ""))
        if nbytes and buf is None:
            raise ValueError(f"{name}: the buffer is None but the count is {count}")
    return raw[at:at + nbytes].view(dt.base)       # a contiguous type's items: its base's


def vector(spec, name, nranks, writable, derive=True):
    """A v-spec: (its bytes, dtype, counts, displacements), counts and
    displacements tuples of items per rank, checked against the buffer;
    None and None for no counts and no displacements when not derive."""
    counts = displs = dtype = None
    buf = spec
    if isinstance(spec, (list, tuple)):
        n = len(spec)
        if n == 2:
            buf, counts = spec
            if is_datatype(counts):
                counts, dtype = None, counts
            elif isinstance(counts, tuple):
                counts, displs = _pair(counts, name, "counts, displacements")
        elif n == 3:
            buf, counts, dtype = spec
            if isinstance(counts, tuple):
                counts, displs = _pair(counts, name, "counts, displacements")
            if dtype is not None and not is_datatype(dtype):        # [buf, counts, displs]: mpi4py's TypeError
                raise TypeError(f"{name}: the third item of [buf, counts, datatype] must be a datatype, not "
                                f"{dtype!r} (displacements go in [buf, (counts, displs), datatype])")
        elif n == 4:
            buf, counts, displs, dtype = spec
        else:
            raise ValueError(f"{name}: a v-buffer spec is 2 to 4 items ([buf, counts, displs, dtype], ...), got {n}")
    if buf is IN_PLACE:
        raise ValueError(f"{name}: IN_PLACE is not allowed here")
    raw, dt = _raw(buf, dtype, name, writable)
    ext = dt.itemsize
    items = raw.size // ext
    raw = raw[:items * ext]
    if counts is None and displs is None and not derive:
        return raw, dt, None, None
    if counts is None:
        if raw.size % ext:
            raise ValueError(f"{name}: cannot infer the counts: {raw.size} bytes are not whole {dt} items")
        counts = [items // nranks + (items % nranks > r) for r in range(nranks)]
    elif not _sequence(counts):
        counts = [_index(counts, name, "count")] * nranks
    counts = _per_rank(counts, f"{name}: counts", nranks)
    if displs is None:
        displs = list(itertools.accumulate(counts[:-1], initial=0))
    elif not _sequence(displs):
        stride = _index(displs, name, "displacement stride")
        displs = [r * stride for r in range(nranks)]
    else:
        displs = _per_rank(displs, f"{name}: displacements", nranks)
    ranges(name, counts, displs, items, dt, writable)
    return raw, dt, tuple(counts), tuple(displs)


def ranges(name, counts, displs, size, unit, writable):
    """Every rank's range (counts[r] at displs[r]) within the buffer's
    size (in items of dtype unit, or bytes); ranges written must not
    overlap (MPI's rule for receive buffers; ranges only read may, as a
    Scatterv root's)."""
    ends = [d + c for d, c in zip(displs, counts)]
    if ends and max(ends) > size:
        r = ends.index(max(ends))
        raise ValueError(f"{name}: rank {r}'s {counts[r]} at displacement {displs[r]} end past the buffer's "
                         f"{size} {unit if isinstance(unit, str) else f'{unit} items'}")
    if not writable or all(e <= d for e, d in zip(ends, displs[1:])):    # in rank order, apart: the usual
        return
    live = sorted((d, c, r) for r, (d, c) in enumerate(zip(displs, counts)) if c)
    for (d0, c0, r0), (d1, _, r1) in zip(live, live[1:]):
        if d0 + c0 > d1:
            raise ValueError(f"{name}: the ranges of ranks {r0} and {r1} overlap (displacements {d0} and {d1})")


def _sequence(x):
    """Whether counts or displacements are one per rank (any sequence:
    a list, a tuple, an array, array.array as mpi4py's demos pass), not one
    integer for all."""
    if isinstance(x, np.ndarray):
        return x.ndim > 0               # a 0-d array is one integer
    return hasattr(x, "__len__") and hasattr(x, "__getitem__") and not isinstance(x, (str, bytes))


def _per_rank(seq, what, n):
    """n non-negative ints, one per rank, as a list of Python ints."""
    if isinstance(seq, np.ndarray):
        if seq.ndim == 1 and seq.size == n and seq.dtype.kind in "iu":    # the usual: one check, no copies
            out = seq.tolist()
            if out and min(out) < 0:
                raise ValueError(f"{what} must not be negative: {seq!r}")
            return out
        return [int(x) for x in buffers.ints(seq, what, n)]
    try:
        out = [operator.index(x) for x in seq]
    except TypeError:
        out = None
    if out is None or len(out) != n:
        raise ValueError(f"{what} must be {n} integers, one per rank, not {seq!r}")
    if out and min(out) < 0:
        raise ValueError(f"{what} must not be negative: {seq!r}")
    return out


def vspec(spec, name, nranks, writable, derive=True):
    """vector()'s, as the collectives take it: (pointer, bytes, item size,
    dtype, counts, displacements)."""
    raw, dt, counts, displs = vector(spec, name, nranks, writable, derive)
    return ffi.from_buffer(raw, require_writable=writable), raw.size, dt.itemsize, dt, counts, displs


def root_only(spec, rank, root):
    """An argument that counts on the root only: a spec elsewhere is not
    read (mpi4py's), so it is taken as absent."""
    return None if rank != root and isinstance(spec, (list, tuple)) else spec


def wvector(spec, name, nranks, writable):
    """A w-spec: (the whole buffer as bytes, bytes per rank, byte
    displacements per rank), checked against the buffer."""
    if spec is IN_PLACE:
        raise ValueError(f"{name}: IN_PLACE is not allowed here")
    if not isinstance(spec, (list, tuple)) or len(spec) not in (2, 3, 4):
        raise ValueError(f"{name}: Alltoallw takes [buf, datatypes], [buf, (counts, displs), datatypes] or "
                         f"[buf, counts, displs, datatypes], not {spec!r}")
    if len(spec) == 2:
        (buf, types), counts, displs = spec, None, None
    elif len(spec) == 3:
        buf, (counts, displs), types = spec[0], _pair(spec[1], name, "counts, displacements"), spec[2]
    else:
        buf, counts, displs, types = spec
    if buf is BOTTOM and (counts is None or displs is None):
        raise ValueError(f"{name}: BOTTOM requires counts and displacements")
    if counts is None and displs is None:   # mpi4py: one item of each datatype per rank, all at the start
        counts, displs = [1] * nranks, [0] * nranks
    raw = _raw(buf, None, name, writable)[0]
    if is_datatype(types):
        types = [types] * nranks
    if not isinstance(types, (list, tuple)) or len(types) != nranks:
        raise ValueError(f"{name}: datatypes must be {nranks}, one per rank, not {types!r}")
    sizes = [datatype(t, name).itemsize for t in types]
    counts = _per_rank(counts, f"{name}: counts", nranks)
    nbytes = [c * z for c, z in zip(counts, sizes)]
    displs = _per_rank(displs, f"{name}: displacements (bytes)", nranks)
    ranges(name, nbytes, displs, raw.size, "bytes", writable)
    return raw, tuple(nbytes), tuple(displs)
