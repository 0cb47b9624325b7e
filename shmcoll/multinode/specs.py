"""mpi4py's buffer specs, read as mpi4py reads them, into flat numpy views
of the user's memory: the hierarchical legs hand shmcoll and MPI plain
arrays.  A spec these cannot express as such a view (a derived datatype,
a user-defined op) raises Fallback before any leg starts, and the whole
call goes to MPI as given: a condition every rank meets alike, since MPI
requires the ranks' type signatures and ops to match."""
import numpy as np

from .. import buffers, ops as shm_ops, spec as spec_reader
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
    """IN_PLACE as mpi4py reads a collective's buffer: None too."""
    return x is None or x is SHM_IN_PLACE or x is mpi().IN_PLACE


def _dtype(datatype):
    MPI = mpi()
    if datatype.combiner != MPI.COMBINER_NAMED:
        raise Fallback
    from mpi4py.util.dtlib import to_numpy_dtype
    try:
        dt = to_numpy_dtype(datatype)
    except (ValueError, KeyError, TypeError):
        raise Fallback from None
    if dt.fields is not None or dt.itemsize != datatype.Get_size():
        raise Fallback      # a pair (MPI.DOUBLE_INT: padded, and no plain array's), MPI.WCHAR (numpy's '<U0')
    return dt


def _translated(spec):
    """spec with mpi4py's datatypes as numpy dtypes: what shmcoll's reader
    of mpi4py's specs (shmcoll.spec) takes."""
    if not isinstance(spec, (list, tuple)):
        return spec
    MPI = mpi()
    return [_dtype(x) if isinstance(x, MPI.Datatype) else x for x in spec]


_CARRIED = {}


def carried(a):
    """a, where the MPI legs can carry its dtype (mpi4py maps an array's
    to an MPI datatype by its buffer format); else Fallback.  The node legs
    take what they cannot (a struct, numpy's void or unicode, datetime64),
    so only the leaders would refuse it, in an MPI leg, while their node's
    ranks wait: MPI's own call refuses it (or carries it) on every rank."""
    ok = _CARRIED.get(a.dtype)
    if ok is None:
        MPI = mpi()
        try:
            ok = MPI.Datatype.fromcode(memoryview(np.empty(0, a.dtype)).format) != MPI.DATATYPE_NULL
        except (ValueError, TypeError, KeyError, BufferError, NotImplementedError):
            ok = False
        _CARRIED[a.dtype] = ok
    if not ok:
        raise Fallback
    return a


def _array(x, what, writable):
    """Any buffer shmcoll takes (the buffer protocol, DLPack, Fortran
    order) as a flat numpy array over the same memory; else Fallback:
    MPI's own call raises mpi4py's error (BufferError for a strided one)."""
    try:
        b = buffers.checked(x, what, writable)[0]
    except ValueError:
        raise Fallback from None
    return carried((b if isinstance(b, np.ndarray) else np.asarray(b)).reshape(-1))


def simple(spec, what, writable=False, blocks=0):
    """A spec of one message as a flat array of its items, read as mpi4py
    reads it ([buf, count, displ, type], ...); blocks: the spec's count is
    per block of that many (Allgather's recvbuf: one per rank)."""
    if spec is None or in_place(spec):
        return spec
    return _array(spec_reader.simple(_translated(spec), what, writable, blocks), what, writable)


def vector(spec, what, size, writable=False):
    """A v-spec ([buf, counts, displs, type], [buf, count], ...) as (the
    whole buffer's items, counts, displacements) in items."""
    raw, dt, counts, displs = spec_reader.vector(_translated(spec), what, size, writable)
    return carried(raw.view(dt)), np.array(counts, np.int64), np.array(displs, np.int64)


def offsets(counts):
    """Where each piece starts, back to back in rank order from 0, and
    where the last ends (len(counts) + 1 items)."""
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


def displacements(counts):
    """The pieces' displacements back to back in rank order from 0."""
    return offsets(counts)[:-1]


def unpack(dst, counts, displs, src, ranks):
    """The pieces of ranks, back to back in src, to their displacements in dst."""
    at = 0
    for i in ranks:
        dst[displs[i]:displs[i] + counts[i]] = src[at:at + counts[i]]
        at += counts[i]


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


_REDUCIBLE = {}


def reducible(m_op, s_op, dtype):
    """Fallback unless the node legs fold dtype with shmcoll's op s_op and
    the MPI legs with MPI's m_op (Reduce_local of one item: MPI refuses
    MAX of bool, which shmcoll folds).  A refusal would come from inside a
    leg on some ranks only: from a node leg it leaves the node's
    communicator unusable, from an MPI leg it leaves the other ranks
    waiting; MPI's own call refuses it on every rank (or folds it) and the
    communicator goes on."""
    key = (s_op.code, m_op.py2f(), dtype)
    ok = _REDUCIBLE.get(key)
    if ok is None:
        try:
            shm_ops.kernel(s_op, dtype)
            m_op.Reduce_local(np.zeros(1, dtype), np.zeros(1, dtype))
            ok = True
        except Exception:       # shmcoll's TypeError, MPI's error, mpi4py's for a type it cannot map
            ok = False
        _REDUCIBLE[key] = ok
    if not ok:
        raise Fallback
