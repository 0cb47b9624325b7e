"""Arrays that export no buffer but DLPack or the CUDA array interface
(torch tensors, mpi4py's test arrays), as numpy arrays over the same
memory, as mpi4py reads them.

DLPack: the exporter's capsule is read, not consumed, and kept alive by
the numpy array, so its destructor frees the tensor once the array is
gone; writable unless the exporter marks it read-only (numpy's own
from_dlpack makes every legacy, unversioned import read-only, so a
receive into one would be refused).  Only CPU memory: a device tensor is
refused naming its device.  The CUDA array interface is GPU memory by
contract; shmcoll moves host memory only, so an interface whose pointer
this process cannot read (process_vm_readv on itself: device memory is
not mapped readable) is refused, and one over host memory is read."""
import ctypes
import os

import numpy as np

_KDLCPU, _KDLCUDAHOST = 1, 3
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
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_libc = ctypes.CDLL(None, use_errno=True)
# typed: untyped, the counts would go as 32-bit ints into 64-bit registers
# whose high halves are left as they were, and a garbage iovec count makes
# the kernel write through whatever follows our one iovec
_libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                                   ctypes.c_ulong]
_libc.process_vm_readv.restype = ctypes.c_ssize_t
_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}


def _dtype(dt):
    if dt.lanes == 2 and dt.code == 2:        # a complex as two floats (complex long double, as mpi4py exports it)
        return np.dtype(f"c{2 * dt.bits // 8}")
    if dt.lanes != 1:
        raise BufferError(f"DLPack: vector dtypes (lanes {dt.lanes}) are not supported")
    if dt.code == 4 and dt.bits == 16:        # kDLBfloat
        from .ops import BF16
        if BF16 is None:
            raise BufferError("DLPack: bfloat16 needs the ml_dtypes package (pip install ml_dtypes)")
        return BF16
    if dt.code not in _KINDS or dt.bits % 8:
        raise BufferError(f"DLPack: unsupported dtype (code {dt.code}, {dt.bits} bits)")
    return np.dtype(f"{_KINDS[dt.code]}{dt.bits // 8}")


def _over(ptr, nbytes, owner, readonly):
    """A flat uint8 array over nbytes at ptr that keeps owner alive."""
    mem = (ctypes.c_char * nbytes).from_address(ptr) if nbytes else ctypes.create_string_buffer(0)
    mem._owner = owner
    arr = np.frombuffer(mem, np.uint8)
    if readonly:
        arr.flags.writeable = False
    return arr


def _contiguous(shape, strides, itemsize):
    """Whether (shape, strides in items) lay items out in C order with no gaps."""
    want = 1
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != want:
            return False
        want *= n
    return True


def _device(obj):
    get = getattr(obj, "__dlpack_device__", None)
    if get is None:
        return _KDLCPU
    dev = get()
    if not isinstance(dev, tuple):
        raise TypeError(f"__dlpack_device__ must return a tuple, not {type(dev).__name__}")
    if len(dev) != 2:
        raise ValueError(f"__dlpack_device__ must return (device_type, device_id), got {len(dev)} items")
    if not all(isinstance(x, int) for x in dev):
        raise TypeError("__dlpack_device__ must return two ints")
    return dev[0]


def from_dlpack(obj):
    kind = _device(obj)
    if kind not in (_KDLCPU, _KDLCUDAHOST):
        raise BufferError(f"a {type(obj).__name__} on DLPack device type {kind}: shmcoll moves host (CPU) memory "
                          f"only")
    try:
        cap = obj.__dlpack__(max_version=(1, 0))
    except TypeError:
        cap = obj.__dlpack__()
    name = _api.PyCapsule_GetName(cap)
    if name == b"dltensor_versioned":
        m = _Versioned.from_address(_api.PyCapsule_GetPointer(cap, name))
        if m.major != 1:
            raise BufferError(f"DLPack: version {m.major}.{m.minor} is not supported (1.x is)")
        t, readonly = m.tensor, bool(m.flags & _READ_ONLY)
    elif name == b"dltensor":
        t, readonly = _Managed.from_address(_api.PyCapsule_GetPointer(cap, name)).tensor, False
    else:
        raise BufferError(f"DLPack: a capsule named {name!r} (already consumed?)")
    if t.device.type not in (_KDLCPU, _KDLCUDAHOST):
        raise BufferError(f"DLPack: tensor on device type {t.device.type}: shmcoll moves host (CPU) memory only")
    dt = _dtype(t.dtype)
    shape = [t.shape[i] for i in range(t.ndim)]
    if t.strides and not _contiguous(shape, [t.strides[i] for i in range(t.ndim)], dt.itemsize):
        raise BufferError("DLPack: the tensor is not contiguous")
    n = int(np.prod(shape, dtype=np.int64))
    raw = _over((t.data or 0) + t.byte_offset, n * dt.itemsize, cap, readonly)
    return raw.view(dt).reshape(shape)


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
    cai = obj.__cuda_array_interface__
    ptr, readonly = cai["data"]
    dt = np.dtype(cai["typestr"])
    shape = tuple(cai["shape"])
    strides = cai.get("strides")
    if strides is not None and not _contiguous(shape, [s // dt.itemsize for s in strides], dt.itemsize):
        raise BufferError("CUDA array interface: the array is not contiguous")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if nbytes and not ptr:
        raise BufferError("CUDA array interface: a null pointer")
    if not _readable(ptr or 0, nbytes):
        raise BufferError(f"a {type(obj).__name__} in GPU memory (CUDA array interface): shmcoll moves host "
                          f"memory only")
    return _over(ptr or 0, nbytes, obj, readonly).view(dt).reshape(shape)
