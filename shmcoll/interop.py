"""Arrays that export no buffer but DLPack or the CUDA array interface
(torch tensors, mpi4py's test arrays), as numpy arrays over the same
memory, as mpi4py reads them.

Each is read as mpi4py reads it (asdlpack.pxi, ascaibuf.pxi): the flat
bytes it describes, C- or Fortran-contiguous, typed by mpi4py's format
for its dtype (bytes where mpi4py has none), with mpi4py's checks and
exceptions.  DLPack: the exporter's capsule is read, not consumed, and
kept alive by the numpy array, so its destructor frees the tensor once
the array is gone; writable unless the exporter marks it read-only
(numpy's own from_dlpack makes every legacy, unversioned import
read-only, so a receive into one would be refused).  Only CPU memory: a
device tensor is refused naming its device.  The CUDA array interface is
GPU memory by contract; shmcoll moves host memory only, so an interface
whose pointer this process cannot read (process_vm_readv on itself:
device memory is not mapped readable) is refused, and one over host
memory is read."""
import ctypes
import operator
import os
import sys
import warnings

import numpy as np

_KDLCPU, _KDLCUDAHOST = 1, 3
_ABSENT = object()
_READ_ONLY = 1


class _Device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int32), ("id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):             # DLManagedTensor (legacy, unversioned)
    _fields_ = [("tensor", _Tensor), ("ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _Versioned(ctypes.Structure):           # DLManagedTensorVersioned (DLPack 1.x)
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("tensor", _Tensor)]


_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_libc = ctypes.CDLL(None, use_errno=True)
# typed: untyped, the counts would go as 32-bit ints into 64-bit registers
# whose high halves are left as they were, and a garbage iovec count makes
# the kernel write through whatever follows our one iovec
_libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                                   ctypes.c_ulong]
_libc.process_vm_readv.restype = ctypes.c_ssize_t
# mpi4py's formats for a DLPack dtype (code, bits) and a CUDA typestr's kind (kind, bytes); anything else is bytes
_DL_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}
_BYTES = np.dtype(np.uint8)


def _format(kind, itemsize):
    """The numpy dtype of mpi4py's format for (kind, itemsize); bytes where mpi4py's format is bytes."""
    if kind == "b" and itemsize == 1:
        return np.dtype(np.bool_)
    if kind in "iuf" and itemsize in (1, 2, 4, 8) and not (kind == "f" and itemsize == 1):
        return np.dtype(f"{kind}{itemsize}")
    if kind == "f" and itemsize == np.dtype(np.longdouble).itemsize:
        return np.dtype(np.longdouble)
    if kind == "c" and itemsize in (8, 16) or kind == "c" and itemsize == np.dtype(np.clongdouble).itemsize:
        return np.dtype(f"c{itemsize}")
    return _BYTES


def _dl_format(dt):
    """The numpy dtype of a DLPack dtype as mpi4py's asdlpack reads it."""
    if dt.lanes != 1:               # a complex as two float lanes; any other vector is bytes
        two_floats = dt.code == 2 and dt.lanes == 2 and dt.bits // 8 in (4, 8, np.dtype(np.longdouble).itemsize)
        return _format("c", 2 * dt.bits // 8) if two_floats else _BYTES
    if dt.code == 4 and dt.bits == 16:        # kDLBfloat: bytes to mpi4py; bfloat16 where ml_dtypes is there
        from .ops import BF16
        return BF16 if BF16 is not None else _BYTES
    if dt.code not in _DL_KINDS or dt.bits % 8:
        return _BYTES
    return _format(_DL_KINDS[dt.code], dt.bits // 8)


def _over(ptr, nbytes, owner, readonly, dtype=_BYTES):
    """A flat array of dtype over nbytes at ptr that keeps owner alive."""
    mem = (ctypes.c_char * nbytes).from_address(ptr) if nbytes else ctypes.create_string_buffer(0)
    mem._owner = owner
    arr = np.frombuffer(mem, np.uint8)
    if readonly:
        arr.flags.writeable = False
    return arr.view(dtype) if dtype.itemsize and nbytes % dtype.itemsize == 0 else arr


def _laid(shape, strides, unit, order):
    """Whether strides (in units of `unit`) lay shape out in `order` ("C" or "F") with no gaps."""
    want = unit
    for n, s in (zip(shape, strides) if order == "F" else zip(reversed(shape), reversed(strides))):
        if n > 1 and s != want:
            return False
        want *= n
    return True


def _contiguous(shape, strides, unit):
    return _laid(shape, strides, unit, "C") or _laid(shape, strides, unit, "F")


def _device(obj):
    """(device type, id) as mpi4py unpacks __dlpack_device__(): TypeError, ValueError as its C ints do."""
    get = getattr(obj, "__dlpack_device__", _ABSENT)
    if get is _ABSENT:
        return _KDLCPU, 0
    kind, ident = get()
    return operator.index(kind), operator.index(ident)


def from_dlpack(obj):
    """A DLPack exporter as mpi4py's asdlpack reads it: the capsule's flat
    bytes (C- or Fortran-contiguous), typed by mpi4py's format for its
    dtype (bytes where it has none)."""
    kind, _ = _device(obj)
    if kind not in (_KDLCPU, _KDLCUDAHOST):
        raise BufferError(f"a {type(obj).__name__} on DLPack device type {kind}: shmcoll moves host (CPU) memory "
                          f"only")
    if getattr(obj, "requires_grad", False) is True and callable(getattr(obj, "detach", None)):
        obj = obj.detach()      # its data, as torch.distributed takes it: autograd's tensor exports none
    try:
        cap, name = obj.__dlpack__(max_version=(1, 0), copy=False), b"dltensor_versioned"
    except TypeError:
        cap, name = obj.__dlpack__(), b"dltensor"
    if not _api.PyCapsule_IsValid(cap, name):
        raise BufferError("dlpack: invalid capsule object")
    if name == b"dltensor_versioned":
        m = _Versioned.from_address(_api.PyCapsule_GetPointer(cap, name))
        if m.major < 1:
            raise BufferError("dlpack: unexpected version")
        t, readonly = m.tensor, bool(m.flags & _READ_ONLY)
    else:
        t, readonly = _Managed.from_address(_api.PyCapsule_GetPointer(cap, name)).tensor, False
    if t.device.type not in (_KDLCPU, _KDLCUDAHOST):
        raise BufferError(f"DLPack: tensor on device type {t.device.type}: shmcoll moves host (CPU) memory only")
    if t.ndim < 0:
        raise BufferError("dlpack: number of dimensions is negative")
    if t.ndim > 0 and not t.shape:
        raise BufferError("dlpack: shape is NULL")
    shape = [t.shape[i] for i in range(t.ndim)]
    strides = [t.strides[i] for i in range(t.ndim)] if t.strides else None
    if any(n < 0 for n in shape):
        raise BufferError("dlpack: shape item is negative")
    if strides is not None and any(x < 0 for x in strides):
        raise BufferError("dlpack: strides item is negative")
    if strides is not None and not _contiguous(shape, strides, 1):
        raise BufferError("dlpack: buffer is not contiguous")
    dtype = _dl_format(t.dtype)
    count = int(np.prod(shape, dtype=np.int64))
    flat = _over((t.data or 0) + t.byte_offset, count * ((t.dtype.bits * t.dtype.lanes + 7) // 8), cap, readonly,
                 dtype)
    c_order = strides is None or _laid(shape, strides, 1, "C")
    return flat.reshape(shape) if flat.size == count and c_order else flat


def _readable(ptr, nbytes):
    """Whether this process can read nbytes at ptr (host memory it maps)."""
    if not nbytes:
        return True
    one = ctypes.create_string_buffer(1)
    for at in (ptr, ptr + nbytes - 1):
        local = (ctypes.c_void_p * 2)(ctypes.addressof(one), 1)
        remote = (ctypes.c_void_p * 2)(at, 1)
        if _libc.process_vm_readv(os.getpid(), local, 1, remote, 1, 0) != 1:
            return False
    return True


def from_cai(obj):
    """A CUDA-array-interface exporter as mpi4py's ascaibuf reads it (the
    same checks, exceptions and warning), over host memory only."""
    cai = obj.__cuda_array_interface__
    if cai is not None and not isinstance(cai, dict):
        raise TypeError(f"__cuda_array_interface__ must be a dict, not {type(cai).__name__}")
    data, typestr, shape = cai["data"], cai["typestr"], cai["shape"]
    strides, descr, mask = cai.get("strides"), cai.get("descr"), cai.get("mask")
    for value, kind, what in ((data, tuple, "data"), (typestr, str, "typestr"), (shape, tuple, "shape"),
                              (strides, (tuple, type(None)), "strides"), (descr, (list, type(None)), "descr")):
        if not isinstance(value, kind):
            raise TypeError(f"__cuda_array_interface__: {what} of type {type(value).__name__}")
    ptr, readonly = data
    size = 1
    for n in shape:
        size *= operator.index(n)
    if ptr is None and size == 0:
        ptr = 0
    order, itemsize = typestr[0:1], int(typestr[2:])
    dtype = _format(typestr[1:2], itemsize)
    if order == (">" if sys.byteorder == "little" else "<"):
        raise BufferError(f"__cuda_array_interface__: typestr {typestr!r} with non-native byte order")
    if order not in "<>|" or not order:
        raise BufferError(f"__cuda_array_interface__: typestr {typestr!r} with unrecognized byte order")
    if mask is not None:
        raise BufferError("__cuda_array_interface__: cannot handle masked arrays")
    if size < 0:
        raise BufferError(f"__cuda_array_interface__: buffer with negative size (shape:{shape}, size:{size})")
    if strides is not None and not _contiguous(shape, strides, itemsize):
        raise BufferError(f"__cuda_array_interface__: buffer is not contiguous (shape:{shape}, strides:{strides}, "
                          f"itemsize:{itemsize})")
    if descr is not None and (len(descr) != 1 or descr[0] != ("", typestr)):
        warnings.warn("__cuda_array_interface__: ignoring 'descr' key", RuntimeWarning, stacklevel=3)
    nbytes = size * itemsize
    if nbytes and not ptr:
        raise BufferError("CUDA array interface: a null pointer")
    if not _readable(ptr or 0, nbytes):
        raise BufferError(f"a {type(obj).__name__} in GPU memory (CUDA array interface): shmcoll moves host "
                          f"memory only")
    return _over(ptr or 0, nbytes, obj, bool(readonly), dtype)
