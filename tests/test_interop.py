"""Arrays that export DLPack (legacy and versioned capsules) or the CUDA
array interface but no buffer, as mpi4py takes them: read as numpy
arrays over their memory, writable unless marked read-only, refused
naming the problem when on a device, not contiguous, or unreadable.  The
exporters here are built with ctypes, so these run without torch."""
import ctypes

import numpy as np
import pytest

from conftest import run_ranks
from shmcoll import buffers
from shmcoll.interop import _DType, _Managed, _Tensor, _Versioned

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}


class Exporter:
    """A numpy array's memory behind __dlpack__ only (versioned or not)."""

    def __init__(self, arr, versioned=False, readonly=False, device=1, lanes_complex=False, strides=None):
        self.arr, self.versioned, self.device = arr, versioned, device
        self.shape = (ctypes.c_int64 * arr.ndim)(*arr.shape)
        self.strides = None if strides is None else (ctypes.c_int64 * arr.ndim)(*strides)
        dt = _DType(CODES[arr.dtype.kind], arr.dtype.itemsize * 8, 1)
        if lanes_complex:
            dt = _DType(2, arr.dtype.itemsize * 4, 2)
        t = _Tensor(arr.ctypes.data, (device, 0), arr.ndim, dt, self.shape,
                    self.strides if self.strides is not None else None, 0)
        self.managed = _Versioned(1, 0, None, None, int(readonly), t) if versioned else _Managed(t, None, None)
        self.name = b"dltensor_versioned" if versioned else b"dltensor"

    def __dlpack__(self, stream=None, **kw):
        if kw and not self.versioned:
            raise TypeError("legacy exporter: no max_version")
        return _api.PyCapsule_New(ctypes.addressof(self.managed), self.name, None)

    def __dlpack_device__(self):
        return (self.device, 0)


class CAI:
    def __init__(self, arr, address=None, readonly=False):
        self.arr = arr
        self.__cuda_array_interface__ = {"version": 3, "data": (address or arr.ctypes.data, readonly),
                                         "typestr": arr.dtype.str, "shape": arr.shape, "strides": None}


@pytest.mark.parametrize("versioned", [False, True])
@pytest.mark.parametrize("dtype", [np.int32, np.float64, np.complex128, np.bool_, np.uint16])
def test_dlpack_reads_and_writes_the_memory(versioned, dtype):
    a = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    got = buffers.array(Exporter(a, versioned))
    assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)
    got[1, 2] = 1
    assert a[1, 2] == 1 and got.flags.writeable       # the same memory, writable: legacy imports too


def test_dlpack_complex_as_two_float_lanes():
    a = np.arange(4) + 1j * np.arange(4)
    assert np.array_equal(buffers.array(Exporter(a, lanes_complex=True)), a)


def test_dlpack_read_only_flag_device_and_strides():
    a = np.arange(6, dtype=np.int64)
    assert not buffers.array(Exporter(a, versioned=True, readonly=True)).flags.writeable
    with pytest.raises(BufferError, match="read-only"):
        buffers.checked(Exporter(a, versioned=True, readonly=True), "recvbuf", True)
    with pytest.raises(BufferError, match="device type 2"):
        buffers.array(Exporter(a, device=2))
    with pytest.raises(BufferError, match="not contiguous"):
        buffers.array(Exporter(a, strides=[2]))


def test_dlpack_as_mpi4py_reads_it():
    """mpi4py's asdlpack: a Fortran-ordered tensor is its flat bytes, a
    dtype mpi4py has no format for is bytes, a bad __dlpack_device__ is
    the TypeError or ValueError of unpacking it, a capsule that is not a
    DLPack one a BufferError."""
    a = np.arange(6, dtype=np.int32)
    ex = Exporter(a.reshape(2, 3), strides=[1, 2])              # Fortran order over the same memory
    assert np.array_equal(buffers.array(ex), a) and buffers.array(ex).ndim == 1
    ex = Exporter(a)
    ex.managed.tensor.dtype.code = 3                            # kDLOpaqueHandle: bytes
    got = buffers.array(ex)
    assert got.dtype == np.uint8 and got.tobytes() == a.tobytes()
    for device, exc in ((lambda: None, TypeError), (lambda: (None, 0), TypeError), (lambda: (1,), ValueError),
                        (None, TypeError)):
        ex = Exporter(a)
        ex.__dlpack_device__ = device
        with pytest.raises(exc):
            buffers.array(ex)
    ex = Exporter(a)
    ex.__dlpack__ = lambda *args, **kw: None
    with pytest.raises(BufferError, match="capsule"):
        buffers.array(ex)
    ex = Exporter(a)
    ex.shape[0] = -1
    with pytest.raises(BufferError, match="negative"):
        buffers.array(ex)


def test_cai_as_mpi4py_reads_it():
    """mpi4py's ascaibuf: its exceptions for each malformed interface,
    its warning for a descr that is not the typestr's, and a foreign byte
    order refused."""
    a = np.arange(4, dtype=np.float64)

    def bad(**kw):
        c = CAI(a)
        c.__cuda_array_interface__.update(kw)
        return c
    for kw, exc in (({"mask": True}, BufferError), ({"data": 0}, TypeError), ({"data": (1,)}, ValueError),
                    ({"typestr": 42}, TypeError), ({"typestr": "<fX"}, ValueError), ({"shape": 4}, TypeError),
                    ({"shape": (4, -1)}, BufferError), ({"typestr": ">f8"}, BufferError),
                    ({"typestr": "#f8"}, BufferError), ({"descr": 3}, TypeError), ({"strides": (16,)}, BufferError)):
        with pytest.raises(exc):
            buffers.array(bad(**kw))
    with pytest.warns(RuntimeWarning, match="descr"):
        buffers.array(bad(descr=[("", "<f4")] * 2))
    assert np.array_equal(buffers.array(bad(typestr="|f8", descr=[("", "|f8")])), a)


def test_cai_host_memory_and_unreadable_pointer():
    a = np.arange(5, dtype=np.float32)
    got = buffers.array(CAI(a))
    got[0] = 7
    assert a[0] == 7
    assert not buffers.array(CAI(a, readonly=True)).flags.writeable
    with pytest.raises(BufferError, match="GPU memory"):
        buffers.array(CAI(a, address=4096))         # the zero page: mapped by no process


def test_collectives_into_legacy_dlpack_and_cai():
    """An Allreduce and a Bcast whose buffers are a legacy DLPack exporter and a CAI object, against numpy."""
    def job(comm):
        out, b = np.zeros(8), np.zeros(4, np.int32)
        comm.Allreduce(Exporter(np.arange(8.0) * (comm.rank + 1)), Exporter(out))
        if comm.rank == 0:
            b[:] = [4, 3, 2, 1]
        comm.Bcast(CAI(b), root=0)
        return out.tolist(), b.tolist()
    for out, b in run_ranks(job, 3):
        assert out == (np.arange(8.0) * 6).tolist() and b == [4, 3, 2, 1]


class GradTensor(Exporter):
    """As autograd's tensors: exports nothing while it requires grad; detach() gives its data."""
    requires_grad = True

    def __dlpack__(self, stream=None, **kw):
        raise BufferError("Can't export tensors that require gradient, use tensor.detach()")

    def detach(self):
        return Exporter(self.arr, self.versioned)


def test_a_tensor_that_requires_grad_is_taken_as_its_data():
    """As torch.distributed takes it (issue 46): an Allreduce in place into its memory."""
    def job(comm):
        a = np.arange(6.0) * (comm.rank + 1)
        comm.Allreduce(buffers.IN_PLACE, GradTensor(a))
        return a.tolist()
    for got in run_ranks(job, 2):
        assert got == (np.arange(6.0) * 3).tolist()


def test_torch_bfloat16_and_grad_tensors():
    torch = pytest.importorskip("torch")

    def job(comm):
        b = torch.arange(8, dtype=torch.bfloat16) * (comm.rank + 1)
        comm.Allreduce(buffers.IN_PLACE, b)
        c = torch.full((3,), float(comm.rank), dtype=torch.bfloat16)
        comm.Bcast(c, root=1)
        g = torch.ones(4, requires_grad=True)
        comm.Allreduce(buffers.IN_PLACE, g)
        return b.float().tolist(), c.float().tolist(), g.detach().tolist(), g.requires_grad
    for b, c, g, grad in run_ranks(job, 2):
        assert b == (torch.arange(8, dtype=torch.float32) * 3).tolist() and c == [1.0] * 3
        assert g == [2.0] * 4 and grad
