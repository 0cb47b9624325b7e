"""`from shmcoll import MPI`: mpi4py.MPI's module surface over shmcoll, so
an mpi4py program moves here by changing its import (docs/mpi.md has the
table of what is and is not covered).

Constants have MPICH's values, so a program prints what it would under
MPICH.  COMM_WORLD is made on first use: the job's world inside `shmcoll
run` (or launch), else a one-rank world, as mpi4py's singleton init.  A
known MPI name shmcoll does not cover (windows, files, topologies, dynamic
processes, derived datatypes beyond contiguous) is there, and raises
NotImplementedError naming itself when called; an unknown name raises
AttributeError."""
import pickle as _pickle
import socket
import threading
import time

import numpy as np

from . import __version__, comms, launcher, ops, p2p
from .info import INFO_ENV, INFO_NULL, MAX_INFO_KEY, MAX_INFO_VAL, Info  # noqa: F401
from .sendmodes import (BSEND_OVERHEAD, BUFFER_AUTOMATIC, Attach_buffer, Detach_buffer, Flush_buffer,  # noqa: F401
                        Iflush_buffer)
from .buffers import BOTTOM, IN_PLACE
from .comm import Comm as _Comm
from .datatype import COMBINERS, PREDEFINED, Datatype
from .datatype import _typedict, _typedict_c, _typedict_f  # noqa: F401  (mpi4py's names, used by its tests)
from .errors import ERR_CLASSES as _CLASSES, MPIError
from .errors import ERRHANDLER_NULL, ERRORS_ABORT, ERRORS_ARE_FATAL, ERRORS_RETURN, Errhandler  # noqa: F401
from .request import ANY_SOURCE, ANY_TAG, PROC_NULL, REQUEST_NULL, SUCCESS, UNDEFINED, Prequest, Request, Status

globals().update(PREDEFINED)
globals().update(COMBINERS)

Exception = MPIError
Op = ops.Op
SUM, PROD, MAX, MIN, LAND, LOR, LXOR, BAND, BOR, BXOR, MINLOC, MAXLOC = (
    ops.SUM, ops.PROD, ops.MAX, ops.MIN, ops.LAND, ops.LOR, ops.LXOR, ops.BAND, ops.BOR, ops.BXOR, ops.MINLOC,
    ops.MAXLOC)
OP_NULL = ops.Op("OP_NULL")
# one-sided accumulate's ops; as a reduction's op, mpi4py's meaning: the later operand, the earlier
REPLACE = ops.Op.Create(lambda a, b: b, commute=False)
NO_OP = ops.Op.Create(lambda a, b: a, commute=False)
REPLACE.name, NO_OP.name = "REPLACE", "NO_OP"

ROOT = -3
TAG_UB = 1681915905                 # the attribute's key (Comm.Get_attr(TAG_UB)), MPICH's
IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3
COMM_TYPE_SHARED, COMM_TYPE_HW_GUIDED, COMM_TYPE_HW_UNGUIDED, COMM_TYPE_RESOURCE_GUIDED = 1, 2, 3, 4
ORDER_C, ORDER_F, ORDER_FORTRAN = 56, 57, 57
TYPECLASS_REAL, TYPECLASS_INTEGER, TYPECLASS_COMPLEX = 1, 2, 3
DISTRIBUTE_BLOCK, DISTRIBUTE_CYCLIC, DISTRIBUTE_NONE, DISTRIBUTE_DFLT_DARG = 121, 122, 123, -49767
MAX_PROCESSOR_NAME, MAX_ERROR_STRING = 128, 512
THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
# Calls on one communicator from several threads at once are refused
# (SC_EBUSY), not serialized for the caller: one communicator per thread
# (Dup) is what shmcoll supports, so it promises SERIALIZED, not MULTIPLE.
_THREAD_LEVEL = THREAD_SERIALIZED
VERSION, SUBVERSION = 4, 0          # the MPI standard whose calls the covered subset follows

# MPICH's error classes (errors.ERR_CLASSES holds the ones shmcoll raises) and their strings
_ERRORS = {"ERR_ACCESS": 20, "ERR_AMODE": 21, "ERR_ASSERT": 53, "ERR_BAD_FILE": 22, "ERR_BASE": 46,
           "ERR_CONVERSION": 23, "ERR_DISP": 52, "ERR_DUP_DATAREP": 24, "ERR_ERRHANDLER": 80, "ERR_FILE": 27,
           "ERR_FILE_EXISTS": 25, "ERR_FILE_IN_USE": 26, "ERR_INFO": 28, "ERR_INFO_KEY": 29, "ERR_INFO_NOKEY": 31,
           "ERR_INFO_VALUE": 30, "ERR_IO": 32, "ERR_KEYVAL": 48, "ERR_LASTCODE": 1073741823, "ERR_ABI": 1073741823,
           "ERR_LOCKTYPE": 47, "ERR_NAME": 33, "ERR_NOT_SAME": 35, "ERR_NO_MEM": 34, "ERR_NO_SPACE": 36,
           "ERR_NO_SUCH_FILE": 37, "ERR_PORT": 38, "ERR_PROC_ABORTED": 76, "ERR_PROC_FAILED": 13,
           "ERR_PROC_FAILED_PENDING": 13, "ERR_QUOTA": 39, "ERR_READ_ONLY": 40, "ERR_REVOKED": 13,
           "ERR_RMA_ATTACH": 56, "ERR_RMA_CONFLICT": 49, "ERR_RMA_FLAVOR": 58, "ERR_RMA_RANGE": 55,
           "ERR_RMA_SHARED": 57, "ERR_RMA_SYNC": 50, "ERR_SERVICE": 41, "ERR_SESSION": 75, "ERR_SIZE": 51,
           "ERR_SPAWN": 42, "ERR_UNSUPPORTED_DATAREP": 43, "ERR_UNSUPPORTED_OPERATION": 44,
           "ERR_VALUE_TOO_LARGE": 77, "ERR_WIN": 45,
           **{k: v for k, v in _CLASSES.items() if k != "ERR_NOT_SUPPORTED"}}     # not an MPI name
globals().update(_ERRORS)
_STRINGS = {
    0: "No MPI error", 1: "Invalid buffer pointer", 2: "Invalid count", 3: "Invalid datatype", 4: "Invalid tag",
    5: "Invalid communicator", 6: "Invalid rank", 7: "Invalid root", 8: "Invalid group", 9: "Invalid MPI_Op",
    10: "Invalid topology", 11: "Invalid dimension argument", 12: "Invalid argument",
    13: "Unknown error.  Please file a bug report.", 14: "Message truncated", 15: "Other MPI error",
    16: "Internal MPI error!", 17: "See the MPI_ERROR field in MPI_Status for the error code",
    18: "Pending request (no error)", 19: "Invalid MPI_Request", 34: "Unable to allocate memory for MPI_Alloc_mem",
    35: "Inconsistent arguments to collective routine ", 45: "Invalid MPI_Win", 48: "Invalid keyval",
    51: "Invalid size argument in RMA call", 76: "Process was aborted", 80: "Invalid errhandler"}


def Get_error_string(errorcode):
    return _STRINGS.get(errorcode, f"Error class {errorcode} (see MPI.ERR_*)")


def Get_error_class(errorcode):
    return errorcode


# -- the communicators ------------------------------------------------------------
class _Face(type):
    """Every shmcoll communicator is an MPI.Comm and an MPI.Intracomm
    (isinstance), and the class's attributes are shmcoll.Comm's."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, _Comm)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, _Comm) or type.__subclasscheck__(cls, sub)

    def __getattr__(cls, name):
        return getattr(_Comm, name)


class Comm(metaclass=_Face):
    """MPI.Comm(comm): another handle to comm (mpi4py's), equal to it and
    sharing its state; MPI.Comm() and MPI.Comm(COMM_NULL) a null
    communicator, equal to COMM_NULL."""

    def __new__(cls, comm=None):
        if comm is None or isinstance(comm, _NullComm):
            return _NullComm()
        if not isinstance(comm, _Comm):
            raise TypeError(f"{cls.__name__}() takes a communicator, not {type(comm).__name__}")
        return comm._handle()


class Intracomm(Comm):
    __doc__ = Comm.__doc__


class _NullComm(_Comm):
    """COMM_NULL: a Comm that is false and refuses every call."""

    def __init__(self):
        pass

    def __bool__(self):
        return False

    def __eq__(self, other):        # a freed communicator is null too (MPI sets its handle to COMM_NULL)
        return isinstance(other, _NullComm) or isinstance(other, _Comm) and not other

    __hash__ = object.__hash__

    def __getattribute__(self, name):
        if name[:1].isalpha() and name not in ("Get_name",):
            raise MPIError(ERR_COMM, f"COMM_NULL.{name}: the communicator is COMM_NULL")
        return object.__getattribute__(self, name)

    def Get_name(self):
        return "MPI_COMM_NULL"

    def __reduce__(self):
        return _null, (self is COMM_NULL,)

    def __repr__(self):
        return "<shmcoll.MPI.COMM_NULL>"


COMM_NULL = _NullComm()


def _null(same):
    return COMM_NULL if same else _NullComm()

_lock = threading.RLock()
_comms = {}


def _self():
    """A one-rank communicator of this process only (COMM_SELF)."""
    return comms.comm_self(_comm("COMM_WORLD"))


def _comm_handle(name):
    """An unpickled handle to COMM_WORLD or COMM_SELF other than themselves."""
    return _comm(name)._handle()


def _comm(name):
    with _lock:
        if name not in _comms:
            comm = _comms[name] = launcher.init() if name == "COMM_WORLD" else _self()
            comm.Set_name("MPI_" + name)
            comm.Set_errhandler(ERRORS_RETURN)      # mpi4py's default: errors raise, the communicator goes on
        return _comms[name]


def __getattr__(name):
    if name in ("COMM_WORLD", "COMM_SELF"):
        return _comm(name)
    raise AttributeError(f"module 'shmcoll.MPI' has no attribute {name!r}")


# -- buffers ----------------------------------------------------------------------


class buffer(np.ndarray):
    """mpi4py's MPI.buffer: bytes of memory (an object's, an address's or
    new ones) that know their address; a 1-D uint8 array underneath, so
    that it exports the buffer protocol and a message takes it as bytes."""

    def __new__(cls, obj=None):
        from .buffers import array
        if obj is None:
            obj = bytearray()
        mem = memoryview(array(obj))        # DLPack, CUDA array interface: the memory they describe
        if not mem.contiguous:
            raise BufferError("MPI.buffer: the object's memory is not contiguous")
        out = np.frombuffer(mem.cast("B") if mem.ndim != 1 or mem.format != "B" else mem, np.uint8).view(cls)
        out._obj = obj
        # a CUDA array interface is device memory by contract: as mpi4py, no host access through the buffer
        out._device = hasattr(obj, "__cuda_array_interface__") and not isinstance(obj, np.ndarray)
        return out

    def __array_finalize__(self, parent):
        self._obj = getattr(parent, "_obj", None)
        self._device = getattr(parent, "_device", False)

    def _host(self, what):
        if self._device:
            raise BufferError(f"MPI.buffer.{what}: the memory is a device's (CUDA array interface)")

    def __getitem__(self, index):
        self._host("__getitem__")
        return super().__getitem__(index)

    def __setitem__(self, index, value):
        self._host("__setitem__")
        super().__setitem__(index, value)

    @staticmethod
    def allocate(nbytes, clear=False):
        return buffer(np.zeros(int(nbytes), np.uint8) if clear else np.empty(int(nbytes), np.uint8))

    @staticmethod
    def frombuffer(obj, readonly=False):
        """obj's memory as bytes (BufferError if it is read-only and readonly is false)."""
        out = buffer(obj)
        if not readonly and out.readonly:
            raise BufferError("buffer.frombuffer: the object is read-only (pass readonly=True)")
        return out.toreadonly() if readonly else out

    @staticmethod
    def fromaddress(address, nbytes, readonly=False):
        """The nbytes of memory at address, as bytes."""
        import ctypes
        if nbytes and not address:
            raise ValueError("buffer.fromaddress: a null address with nbytes > 0")
        out = buffer((ctypes.c_char * int(nbytes)).from_address(address) if nbytes else None)
        return out.toreadonly() if readonly else out

    @property
    def address(self):
        return self.ctypes.data

    @property
    def obj(self):
        return self._obj

    @property
    def readonly(self):
        return not self.flags.writeable

    @property
    def format(self):
        return "B"

    def tobytes(self, order=None):
        self._host("tobytes")
        return bytes(memoryview(self))

    def toreadonly(self):
        out = self.view()
        out.flags.writeable = False
        return out

    def cast(self, format, shape=None):
        self._host("cast")
        mem = memoryview(self)
        return mem.cast(format) if shape is None else mem.cast(format, shape)

    def release(self):
        """Nothing to let go: the memory lives as long as its object (numpy holds it)."""


def _comm_lock_table(comm):
    """mpi4py's: the locks its lower-case collectives take on comm, by name (comm.locked)."""
    return comm.__dict__.setdefault("_locks", {})


def Aint_add(base, disp):
    return base + disp


def Aint_diff(addr1, addr2):
    return addr1 - addr2


def Get_address(location):
    """The address of a buffer's first byte (any buffer a message takes)."""
    from .buffers import address, view
    return address(view(location, "location", writable=False)[0])


memory = buffer


def Alloc_mem(size, info=None):
    """size bytes of memory (numpy's allocator), as an MPI.buffer."""
    return buffer.allocate(size)


def Free_mem(mem):
    """Nothing to do: the memory goes with its last reference."""


# -- the environment ----------------------------------------------------------------
_state = {"initialized": True, "finalized": False, "main": threading.main_thread()}


def Init():
    """shmcoll.MPI initializes at import, as mpi4py does, so a second Init
    raises as MPI's does."""
    raise MPIError(ERR_OTHER, "MPI.Init: cannot call MPI_INIT or MPI_INIT_THREAD more than once "
                   "(shmcoll.MPI initializes at import, as mpi4py does)")


def Init_thread(required=THREAD_MULTIPLE):
    Init()


def Finalize():
    """Marks the job finalized; the world is left at exit (shmcoll.init's
    atexit handler), where every rank has finished its calls."""
    _state["finalized"] = True


def Is_initialized():
    return _state["initialized"]


def Is_finalized():
    return _state["finalized"]


def Query_thread():
    return _THREAD_LEVEL


def Is_thread_main():
    return threading.current_thread() is _state["main"]


def Get_version():
    return VERSION, SUBVERSION


def Get_library_version():
    return (f"shmcoll {__version__}: shared-memory collectives and point-to-point for processes on one node; "
            f"MPI-{VERSION}.{SUBVERSION} calls for the subset in docs/mpi.md")


def get_vendor():
    """(name, version) of the library underneath, as mpi4py's."""
    return "shmcoll", tuple(int(x) for x in __version__.split(".")[:3])


def Get_abi_version():
    """(-1, -1): not the MPI ABI, as mpi4py with MPICH reports."""
    return -1, -1


class Pickle:
    """mpi4py's MPI.pickle: how the lower-case calls serialize objects."""
    PROTOCOL = _pickle.HIGHEST_PROTOCOL
    THRESHOLD = 262144

    def dumps(self, obj):
        return _pickle.dumps(obj, self.PROTOCOL)

    def loads(self, data):
        return _pickle.loads(data)


pickle = Pickle()


def Get_processor_name():
    return socket.gethostname()


def Wtime():
    """Seconds on a monotonic clock (time.perf_counter)."""
    return time.perf_counter()


def Wtick():
    return time.get_clock_info("perf_counter").resolution


def Pcontrol(level):
    """Profiling control: no profiler listens, so nothing to do."""


# -- not covered ------------------------------------------------------------------
def _uncovered(call):
    def refuse(*args, **kw):
        raise NotImplementedError(f"shmcoll.MPI: {call} is not covered (see docs/mpi.md)")
    refuse.__name__ = refuse.__qualname__ = call.rsplit(".", 1)[-1]
    return refuse


class _Uncovered:
    """A class of MPI's that shmcoll does not cover: making one, or calling
    any of its class methods, raises NotImplementedError naming it."""

    def __new__(cls, *args, **kw):
        raise NotImplementedError(f"shmcoll.MPI: {cls.__name__} is not covered (see docs/mpi.md)")

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        for call in getattr(cls, "_calls", ()):
            setattr(cls, call, staticmethod(_uncovered(f"{cls.__name__}.{call}")))


class Win(_Uncovered):
    _calls = ("Create", "Allocate", "Allocate_shared", "Create_dynamic")


class File(_Uncovered):
    _calls = ("Open", "Delete", "Get_errhandler")


class Intercomm(_Uncovered):
    _calls = ()


class Topocomm(_Uncovered):
    _calls = ()


class Cartcomm(_Uncovered):
    _calls = ()


class Graphcomm(_Uncovered):
    _calls = ()


class Distgraphcomm(_Uncovered):
    _calls = ()


class Session(_Uncovered):
    _calls = ("Init",)


class Grequest(_Uncovered):
    _calls = ("Start",)

    def __new__(cls, *args, **kw):
        if args and isinstance(args[0], Request):      # mpi4py: only a generalized request converts
            raise TypeError(f"Grequest({type(args[0]).__name__}): not a generalized request")
        return super().__new__(cls, *args, **kw)


WIN_NULL = None
for _call in ("Open_port", "Close_port", "Publish_name", "Unpublish_name", "Lookup_name",
              "Compute_dims", "Add_error_class", "Add_error_code", "Add_error_string", "Remove_error_class",
              "Remove_error_code", "Remove_error_string", "Register_datarep", "Get_hw_resource_info"):
    globals()[_call] = _uncovered(_call)

Group, GROUP_NULL, GROUP_EMPTY = comms.Group, comms.GROUP_NULL, comms.GROUP_EMPTY
Message, MESSAGE_NULL, MESSAGE_NO_PROC = p2p.Message, p2p.MESSAGE_NULL, p2p.MESSAGE_NO_PROC

del _call
# `from shmcoll.MPI import *`: MPI's names (COMM_WORLD and COMM_SELF made then), not this module's imports
__all__ = sorted([n for n in globals() if n[:1].isupper()] + ["COMM_WORLD", "COMM_SELF", "buffer", "memory", "pickle",
                                                             "get_vendor"])

# A job whose ranks are on several nodes (or virtual nodes): this module is
# mpi4py's own MPI, its COMM_WORLD hierarchical (multinode/face.py).
from .multinode import face as _face  # noqa: E402
if _face.spans_nodes():
    import sys as _sys
    _sys.modules[__name__] = _face.module(__name__)
