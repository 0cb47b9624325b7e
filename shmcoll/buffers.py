"""Buffer arguments, mpi4py style: an array or any buffer-protocol object,
or a spec [buf, count, dtype] / [buf, dtype].  Returns the pointer C
needs and the byte count; every problem names the argument."""
import zlib

import numpy as np

from ._core import ffi


class _InPlace:
    """shmcoll.IN_PLACE, where mpi4py takes MPI.IN_PLACE: a reduction's
    input is recvbuf; a gather's own block is already in recvbuf; a
    scatter root's own block stays in sendbuf; Alltoall sends recvbuf."""

    def __repr__(self):
        return "shmcoll.IN_PLACE"

    def __reduce__(self):
        return "IN_PLACE"


IN_PLACE = _InPlace()


def _array(buf):
    """An object exporting DLPack but no buffer (a CPU torch tensor) as the
    numpy array over its memory; anything else as it is."""
    if type(buf) is np.ndarray or not hasattr(buf, "__dlpack__"):
        return buf
    try:
        memoryview(buf)
        return buf
    except TypeError:
        pass
    try:
        return np.from_dlpack(buf)
    except (BufferError, TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"a {type(buf).__name__} exports DLPack but numpy cannot read it: {e}") from None


def view(spec, name, writable):
    """(cdata pointer, nbytes, itemsize) for a buffer argument."""
    count = dtype = None
    buf = spec
    if spec is IN_PLACE:
        raise ValueError(f"{name}: IN_PLACE is not allowed here")
    if isinstance(spec, (list, tuple)):
        if len(spec) == 3:
            buf, count, dtype = spec
        elif len(spec) == 2:
            buf, dtype = spec
        else:
            raise TypeError(f"{name}: a buffer spec is [buf, count, dtype] or [buf, dtype], got {len(spec)} items")
    buf = _array(buf)
    if type(buf) is np.ndarray:
        if buf.dtype.hasobject:
            raise TypeError(f"{name} holds Python objects (dtype {buf.dtype}); only plain data can be "
                            f"shared between processes")
        if not buf.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous (got strides {buf.strides}); pass np.ascontiguousarray(...)")
        if writable and not buf.flags.writeable:
            raise ValueError(f"{name} is read-only but this collective writes into it")
        nbytes, itemsize = buf.nbytes, buf.itemsize
    else:
        try:
            mv = memoryview(buf)
        except TypeError:
            raise TypeError(f"{name} must be a numpy array or support the buffer protocol, "
                            f"not {type(buf).__name__}") from None
        if "O" in mv.format:
            raise TypeError(f"{name} holds Python objects (format {mv.format!r}); only plain data can be "
                            f"shared between processes")
        if not mv.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
        if writable and mv.readonly:
            raise ValueError(f"{name} is read-only but this collective writes into it")
        nbytes, itemsize = mv.nbytes, mv.itemsize
        buf = mv
    if dtype is not None:
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"{name}: {dtype!r} is not a datatype") from None
        if dt.hasobject:
            raise TypeError(f"{name}: datatype {dt} holds Python objects; only plain data can be shared")
        itemsize = dt.itemsize
        have = nbytes
        if count is None:
            if have % itemsize:
                raise ValueError(f"{name}: {have} bytes is not a whole number of {np.dtype(dtype)} items")
            count = have // itemsize
        if not isinstance(count, (int, np.integer)) or count < 0:
            raise ValueError(f"{name}: count must be a non-negative integer, not {count!r}")
        nbytes = int(count) * itemsize
        if nbytes > have:
            raise ValueError(f"{name}: {count} x {np.dtype(dtype)} needs {nbytes} bytes but the buffer has {have}")
    if itemsize == 0:
        raise ValueError(f"{name}: items of 0 bytes cannot be sent")
    if type(buf) is np.ndarray and buf.dtype.char not in np.typecodes["All"]:
        buf = buf.reshape(-1).view(np.uint8)        # a dtype the buffer protocol cannot name (bfloat16)
    return ffi.from_buffer(buf, require_writable=writable), nbytes, itemsize


def dtype_of(spec):
    """The datatype of a buffer argument view() accepted: the spec's, the
    array's, or the buffer's format (bytes when numpy knows none)."""
    if isinstance(spec, (list, tuple)):
        return np.dtype(spec[-1])
    spec = _array(spec)
    if isinstance(spec, np.ndarray):
        return spec.dtype
    try:
        return np.dtype(memoryview(spec).format)
    except (TypeError, ValueError):
        return np.dtype(np.uint8)


def dtype_code(dt):
    """8 bits for the signature's dtype field, the same in every process
    (no str hash): a checksum of the full description, byte order and
    fields included, 1..255 (distinct dtypes collide 1 time in 255)."""
    return zlib.crc32(f"{dt.str}{dt.descr}".encode()) % 255 + 1


def vspec(spec, name, nranks, writable):
    """A v-variant's buffer: [buf, counts, displs, dtype], [buf, (counts,
    displs), dtype], [buf, counts, displs], [buf, counts, dtype], [buf,
    counts] or a plain buffer.
    (pointer, bytes, itemsize, dtype, counts or None, displs or None);
    counts and displacements in items, checked against the buffer."""
    counts = displs = None
    buf, dt = spec, None
    if isinstance(spec, (list, tuple)):
        if len(spec) == 4:
            buf, counts, displs, dt = spec
        elif len(spec) == 3:
            buf, counts, dt = spec
            if isinstance(dt, (list, tuple, np.ndarray)):           # [buf, counts, displs]
                displs, dt = dt, None
            elif isinstance(counts, tuple) and len(counts) == 2 and all(isinstance(x, (list, tuple, np.ndarray))
                                                                        for x in counts):
                counts, displs = counts
        elif len(spec) == 2:
            buf, counts = spec
        else:
            raise TypeError(f"{name}: a v-buffer spec is [buf, counts, displs, dtype], got {len(spec)} items")
    ptr, nbytes, itemsize = view([buf, dt] if dt is not None else buf, name, writable)
    dtype = np.dtype(dt) if dt is not None else dtype_of(buf)
    if counts is None:
        return ptr, nbytes, itemsize, dtype, None, None
    counts = ints(counts, f"{name}: counts", nranks)
    if displs is None:
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    else:
        displs = ints(displs, f"{name}: displacements", nranks)
    ends = displs + counts
    if nranks and int(ends.max()) * itemsize > nbytes:
        r = int(ends.argmax())
        raise ValueError(f"{name}: rank {r}'s {counts[r]} items at displacement {displs[r]} end past the buffer's "
                         f"{nbytes // itemsize} items")
    live = sorted((int(d), int(c), r) for r, (d, c) in enumerate(zip(displs, counts)) if c)
    for (d0, c0, r0), (d1, _, r1) in zip(live, live[1:]):
        if d0 + c0 > d1:
            raise ValueError(f"{name}: the ranges of ranks {r0} and {r1} overlap (displacements {d0} and {d1})")
    return ptr, nbytes, itemsize, dtype, tuple(int(c) for c in counts), tuple(int(d) for d in displs)


def ints(seq, what, n):
    try:
        a = np.asarray(seq)
    except Exception:
        a = None
    if a is None or a.ndim != 1 or a.size != n or (a.size and a.dtype.kind not in "iu"):
        raise ValueError(f"{what} must be {n} integers, one per rank, not {seq!r}")
    a = a.astype(np.int64)
    if a.size and a.min() < 0:
        raise ValueError(f"{what} must not be negative: {seq!r}")
    return a


def address(ptr):
    """The integer address of a cdata pointer from view()."""
    return int(ffi.cast("uintptr_t", ptr))
