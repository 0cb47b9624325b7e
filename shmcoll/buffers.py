"""Buffer arguments, mpi4py style: an array or any buffer-protocol object,
or a spec [buf, count, dtype] / [buf, dtype].  Returns the pointer C
needs and the byte count; every problem names the argument."""
import numpy as np

from ._core import ffi


def view(spec, name, writable):
    """(cdata pointer, nbytes, itemsize) for a buffer argument."""
    count = dtype = None
    buf = spec
    if isinstance(spec, (list, tuple)):
        if len(spec) == 3:
            buf, count, dtype = spec
        elif len(spec) == 2:
            buf, dtype = spec
        else:
            raise TypeError(f"{name}: a buffer spec is [buf, count, dtype] or [buf, dtype], got {len(spec)} items")
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
    return ffi.from_buffer(buf, require_writable=writable), nbytes, itemsize


def address(ptr):
    """The integer address of a cdata pointer from view()."""
    return int(ffi.cast("uintptr_t", ptr))
