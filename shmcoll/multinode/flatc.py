"""The hierarchical communicator's small collectives from C (csrc/mpiflat.c):
below FLAT_BELOW the call is the MPI library's own, and reaching it
through mpi4py and a Python size check cost more than the library's
whole 8 B Bcast between ranks taking turns on CPUs.  Each entry takes
plain numpy arrays and built-in ops and calls MPI's C function; anything
else goes to the Python method it shadows, which makes the same size
check, so every rank calls the same collective."""
import ctypes
import sys

import numpy as np

from .._core import ffi, lib
from ..device import _new_cfunction

# collective -> (csrc/mpiflat.c kind, MPI function, argument names, FLAT_BELOW's row)
CALLS = {
    "Barrier": (0, "MPI_Barrier", (), "barrier"),
    "Bcast": (1, "MPI_Bcast", ("buf", "root"), "bcast"),
    "Reduce": (2, "MPI_Reduce", ("sendbuf", "recvbuf", "op", "root"), "reduce"),
    "Allreduce": (3, "MPI_Allreduce", ("sendbuf", "recvbuf", "op"), "allreduce"),
    "Allgather": (4, "MPI_Allgather", ("sendbuf", "recvbuf"), "allgather"),
    "Alltoall": (5, "MPI_Alltoall", ("sendbuf", "recvbuf"), "alltoall"),
    "Gather": (6, "MPI_Gather", ("sendbuf", "recvbuf", "root"), "gather"),
    "Scatter": (7, "MPI_Scatter", ("sendbuf", "recvbuf", "root"), "scatter"),
    "Reduce_scatter_block": (8, "MPI_Reduce_scatter_block", ("sendbuf", "recvbuf", "op"), "reduce_scatter"),
}
OPS = ("SUM", "PROD", "MAX", "MIN", "LAND", "BAND", "LOR", "BOR", "LXOR", "BXOR")     # SUM first: an absent op
BIG = 1 << 31           # "always MPI's own" (None, or any size past the C path's int counts): below * ranks fits


def install(hier, MPI):
    """Shadow hier's collective methods by C entries on its MPI communicator."""
    try:
        lib_mpi = ctypes.CDLL(MPI.__file__)     # its dependencies hold the library's symbols
        fns = {name: ctypes.cast(getattr(lib_mpi, call[1]), ctypes.c_void_p).value for name, call in CALLS.items()}
        wide = int(MPI._sizeof(MPI.Comm) > 4)
    except (OSError, AttributeError):
        return                                  # an mpi4py whose library this cannot reach: the Python methods
    types = {}
    for char, t in MPI._typedict.items():
        try:
            dt = np.dtype(char)
        except TypeError:
            continue
        if t.Get_size() == dt.itemsize:
            types.setdefault(dt, (_signed(MPI._handleof(t)), dt.itemsize))
    ops = tuple(getattr(MPI, name) for name in OPS)
    common = (types, ops, tuple(_signed(MPI._handleof(o)) for o in ops), MPI.Exception, MPI.IN_PLACE)
    rank, size = hier.mpi.Get_rank(), hier.mpi.Get_size()
    comm, byte, in_place = (_signed(MPI._handleof(hier.mpi)), _signed(MPI._handleof(MPI.BYTE)),
                            _signed(int(MPI.IN_PLACE)))
    for name, (kind, _, names, row) in CALLS.items():
        below = hier._below[row]
        state = bytearray(ffi.buffer(ffi.new("sc_flat_t *", {
            "fn": ffi.cast("void *", fns[name]), "comm": comm, "byte": byte, "in_place": in_place,
            "below": BIG if below >= BIG else int(below), "kind": kind, "wide": wide, "rank": rank, "size": size})))
        method = getattr(type(hier), name).__get__(hier)
        hier._flat_states.append(state)
        hier.__dict__[name] = _new_cfunction(int(ffi.cast("uintptr_t", lib.sc_py_flat())),
                                             (state, method, tuple(sys.intern(n) for n in names)) + common, None)


def uninstall(hier):
    """hier's MPI communicator is freed: its C entries (and references to
    them kept elsewhere) decline every call from now on, to the Python
    methods, which raise as mpi4py does on a freed communicator."""
    for state in hier._flat_states:
        ffi.from_buffer("sc_flat_t *", state).below = 0      # no size is under it
    for name in CALLS:
        hier.__dict__.pop(name, None)


def _signed(address):
    """A handle or address as intptr_t holds it: mpi4py gives MPICH's int
    handles of communicators it made (0x84000000, ...) sign-extended, unsigned."""
    return address - (1 << 64) if address >= 1 << 63 else address
