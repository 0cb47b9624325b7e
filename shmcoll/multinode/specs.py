"""mpi4py's buffer specs, read as mpi4py reads them, into flat numpy views
of the user's memory: the hierarchical legs hand shmcoll and MPI plain
arrays.  A spec these cannot express as such a view (a derived datatype,
a user-defined op) raises Fallback before any leg starts, and the whole
call goes to MPI as given: a condition every rank meets alike, since MPI
requires the ranks' type signatures and ops to match."""
import numpy as np

from .. import ops as shm_ops
from ..buffers import IN_PLACE as SHM_IN_PLACE


class Fallback(Exception):
    """This call is plain MPI's."""


_MPI = []


def mpi():
    """mpi4py's MPI module, imported on first use (shmcoll does not need it)."""
    if not _MPI:
        from mpi4py import MPI
        _MPI.append(MPI)
    return _MPI[0]


def in_place(x):
    return x is SHM_IN_PLACE or x is mpi().IN_PLACE


def _dtype(datatype):
    MPI = mpi()
    if datatype.combiner != MPI.COMBINER_NAMED:
        raise Fallback
    from mpi4py.util.dtlib import to_numpy_dtype
    try:
        return to_numpy_dtype(datatype)
    except (ValueError, KeyError, TypeError):
        raise Fallback from None


def _flat(buf, dtype, what):
    """buf's memory as a flat array in memory order (C or Fortran), of
    dtype where the spec names one."""
    a = buf if isinstance(buf, np.ndarray) else np.asarray(memoryview(buf))
    if not (a.flags.c_contiguous or a.flags.f_contiguous):
        raise ValueError(f"{what}: the buffer is not contiguous (mpi4py takes contiguous buffers only)")
    a = a.ravel(order="K")
    if dtype is not None and a.dtype != dtype:
        a = a.view(np.uint8).view(dtype)
    return a


def _split(spec, what):
    """(buffer, the middle items, dtype or None) of a list/tuple spec."""
    if not isinstance(spec, (list, tuple)):
        return spec, [], None
    if not spec:
        raise ValueError(f"{what}: an empty buffer spec")
    buf, *rest = spec
    dt = _dtype(rest.pop()) if rest and isinstance(rest[-1], mpi().Datatype) else None
    return buf, rest, dt


def simple(spec, what):
    """[buf], [buf, type], [buf, count, type], [buf, (count, displ), type],
    [buf, count, displ, type]: the view of count items from displ."""
    if spec is None or in_place(spec):
        return spec
    buf, rest, dt = _split(spec, what)
    a = _flat(buf, dt, what)
    if len(rest) == 1 and isinstance(rest[0], tuple):
        rest = list(rest[0])
    if len(rest) > 2:
        raise ValueError(f"{what}: a buffer spec of {len(spec)} items")
    count = rest[0] if rest else None
    displ = rest[1] if len(rest) > 1 else 0
    if count is None:
        return a[displ:]
    if displ + count > a.size:
        raise ValueError(f"{what}: {count} items from {displ} overrun the buffer's {a.size}")
    return a[displ:displ + count]


def vector(spec, what, size):
    """[buf, counts, displs, type], [buf, (counts, displs), type],
    [buf, counts, type]: (whole flat array, counts, displs), displacements
    packed in rank order where none are given."""
    buf, rest, dt = _split(spec, what)
    a = _flat(buf, dt, what)
    if len(rest) == 1 and isinstance(rest[0], tuple) and len(rest[0]) == 2 and not np.isscalar(rest[0][0]):
        rest = list(rest[0])
    if not rest:
        raise ValueError(f"{what}: a v-collective's spec needs counts ([buf, counts, displs, type])")
    counts = np.asarray(rest[0], np.int64).reshape(-1)
    if counts.size != size:
        raise ValueError(f"{what}: {counts.size} counts for {size} ranks")
    displs = (np.asarray(rest[1], np.int64).reshape(-1) if len(rest) > 1 and rest[1] is not None
              else displacements(counts))
    if displs.size != size:
        raise ValueError(f"{what}: {displs.size} displacements for {size} ranks")
    if size and ((counts < 0).any() or (displs < 0).any() or (displs + counts).max() > a.size):
        raise ValueError(f"{what}: counts and displacements reach past the buffer's {a.size} items")
    return a, counts, displs


def displacements(counts):
    """The pieces' displacements back to back in rank order from 0."""
    return np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)


def packed(counts, displs):
    """Whether the pieces lie back to back in rank order from 0."""
    return bool(np.array_equal(displs, displacements(counts)))


_OPS = ("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR")


def op_pair(op):
    """(mpi4py's op, shmcoll's) for a predefined op given as either."""
    MPI = mpi()
    for name in _OPS:
        m, s = getattr(MPI, name), getattr(shm_ops, name)
        if op is s or (isinstance(op, MPI.Op) and op == m):
            return m, s
    raise Fallback
