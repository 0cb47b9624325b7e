"""Plain buffer arguments: an array or any buffer-protocol object (specs
such as [buf, count, dtype] are made plain first, by shmcoll.spec).
Returns the pointer C needs and the byte count; every problem names the
argument."""
import zlib

import numpy as np

from . import interop
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


class _Bottom:
    """BOTTOM (address zero, for absolute addresses of derived datatypes):
    not covered, so using it as a buffer raises."""

    def __int__(self):
        return 0

    def _refuse(self, *args, **kw):
        raise NotImplementedError("shmcoll.MPI: BOTTOM as a buffer (absolute addresses) is not covered")

    __buffer__ = __array__ = __len__ = _refuse
    # read where a buffer argument is taken (buffers.array) before anything else
    __dlpack__ = property(_refuse)

    def __repr__(self):
        return "BOTTOM"

    def __reduce__(self):
        return "BOTTOM"


BOTTOM = _Bottom()


def array(buf):
    """An object exporting DLPack or the CUDA array interface but no
    buffer (a CPU torch tensor) as the numpy array over its memory
    (interop.py); anything else as it is."""
    if type(buf) is np.ndarray:
        return buf
    dl, cai = hasattr(buf, "__dlpack__"), hasattr(buf, "__cuda_array_interface__")
    if not (dl or cai):
        return buf
    try:
        memoryview(buf)
        return buf
    except TypeError:
        pass
    return interop.from_dlpack(buf) if dl else interop.from_cai(buf)


def view(buf, name, writable):
    """(cdata pointer, nbytes, itemsize) for a buffer argument."""
    buf, nbytes, itemsize = checked(buf, name, writable)
    return ffi.from_buffer(buf, require_writable=writable), nbytes, itemsize


def checked(buf, name, writable, typed=False):
    """(the array or a memoryview, nbytes, itemsize) of a buffer argument
    that C can take as it is: plain data, contiguous (Fortran order too,
    as in mpi4py: made a 1-D array over the same memory), writable where
    written, in this machine's byte order unless a datatype is given
    (typed: a spec's); anything else raises, naming it."""
    if buf is IN_PLACE:
        raise ValueError(f"{name}: IN_PLACE is not allowed here")
    buf = array(buf)
    if type(buf) is np.ndarray:
        if buf.dtype.hasobject:
            raise TypeError(f"{name} holds Python objects (dtype {buf.dtype}); only plain data can be "
                            f"shared between processes")
        if not typed and not buf.dtype.isnative:      # mpi4py: no datatype for a foreign byte order
            raise BufferError(f"{name} has dtype {buf.dtype.str}, not in this machine's byte order; give its "
                              f"datatype ([buf, MPI.INT]) or pass buf.astype(buf.dtype.newbyteorder('='))")
        if not buf.flags.c_contiguous:
            if not buf.flags.f_contiguous:
                raise ValueError(f"{name} must be contiguous (got strides {buf.strides}); pass "
                                 f"np.ascontiguousarray(...)")
            buf = buf.ravel(order="K")      # Fortran order: contiguous memory, its bytes in memory order
        if writable and not buf.flags.writeable:
            raise BufferError(f"{name} is read-only but this call writes into it")      # mpi4py: BufferError
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
        if not mv.contiguous:
            raise ValueError(f"{name} must be contiguous")
        if not mv.c_contiguous:             # Fortran order: as the array over it
            return checked(np.asarray(mv), name, writable)
        if writable and mv.readonly:
            raise BufferError(f"{name} is read-only but this call writes into it")      # mpi4py: BufferError
        nbytes, itemsize = mv.nbytes, mv.itemsize
        buf = mv
    if itemsize == 0:
        raise ValueError(f"{name}: items of 0 bytes cannot be sent")
    if type(buf) is np.ndarray and buf.dtype.char not in np.typecodes["All"]:
        buf = buf.reshape(-1).view(np.uint8)        # a dtype the buffer protocol cannot name (bfloat16)
    return buf, nbytes, itemsize


def dtype_of(spec):
    """The datatype of a buffer argument view() accepted: the array's, or
    the buffer's format (bytes when numpy knows none)."""
    spec = array(spec)
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


def ints(seq, what, n):
    try:
        a = np.asarray(seq)
    except Exception:
        a = None
    if a is not None and a.size and a.dtype.kind not in "iu" and a.dtype.kind in "fcbSUV":
        raise TypeError(f"{what} must be integers, not {seq!r}")       # mpi4py: as its C ints take them
    if a is None or a.ndim != 1 or a.size != n or (a.size and a.dtype.kind not in "iu"):
        raise ValueError(f"{what} must be {n} integers, one per rank, not {seq!r}")
    a = a.astype(np.int64)
    if a.size and a.min() < 0:
        raise ValueError(f"{what} must not be negative: {seq!r}")
    return a


def address(ptr):
    """The integer address of a cdata pointer from view()."""
    return int(ffi.cast("uintptr_t", ptr))
