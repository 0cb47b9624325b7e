"""Reduction operators: the built-in ones (reduced in C, csrc/reduce.c)
and user ops (a numpy ufunc or a Python function, run on whole blocks).

Every reduction folds in rank order, x0 op x1 op ... op x(p-1), element
by element; float16 and bfloat16 accumulate in float32 and round once.
So the same inputs give the same bits on every rank, every run, for every
algorithm and placement."""
import inspect
import operator

import numpy as np

from . import isa
from ._core import lib

_INT = "SUM PROD MIN MAX LAND LOR LXOR BAND BOR BXOR".split()
_KINDS = {"i": _INT, "u": _INT, "f": ["SUM", "PROD", "MIN", "MAX"], "c": ["SUM", "PROD"],
          "b": ["LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR", "MIN", "MAX"]}
_TYPES = {"i1": lib.SC_T_I8, "i2": lib.SC_T_I16, "i4": lib.SC_T_I32, "i8": lib.SC_T_I64,
          "u1": lib.SC_T_U8, "u2": lib.SC_T_U16, "u4": lib.SC_T_U32, "u8": lib.SC_T_U64,
          "f2": lib.SC_T_F16, "f4": lib.SC_T_F32, "f8": lib.SC_T_F64, "c8": lib.SC_T_C64, "c16": lib.SC_T_C128,
          "b1": lib.SC_T_BOOL}
_LONG = {"f": lib.SC_T_LD, "c": lib.SC_T_CLD}     # long double, its complex: 12 or 16 bytes by platform
_LOC_VALUES = {"i2": lib.SC_T_I16, "i4": lib.SC_T_I32, "i8": lib.SC_T_I64, "f4": lib.SC_T_F32, "f8": lib.SC_T_F64}
_HALF = (lib.SC_T_F16, lib.SC_T_BF16)


class Op:
    """A reduction operator.  Built-ins reduce in C; Op.Create(fn) makes a
    user op from a binary numpy ufunc, a Python function fn(a, b) -> a op b
    on arrays, or mpi4py's fn(invec, inoutvec, datatype) that leaves
    invec op inoutvec in inoutvec."""

    def __init__(self, name, code=0, fn=None, commute=True):
        self.name, self.code, self._fn, self.commute = name, code, fn, commute
        self._mpi_style = fn is not None and not isinstance(fn, np.ufunc) and _arity(fn) == 3

    @classmethod
    def Create(cls, fn, commute=True):
        if not callable(fn):
            raise TypeError(f"Op.Create needs a function or a numpy ufunc, not {type(fn).__name__}")
        if isinstance(fn, np.ufunc) and fn.nin != 2:
            raise ValueError(f"Op.Create needs a binary ufunc; {fn.__name__} takes {fn.nin} inputs")
        return cls(getattr(fn, "__name__", "user op"), 0, fn, bool(commute))

    def Is_commutative(self):
        return self.commute

    @property
    def builtin(self):
        return self.code != 0

    def __repr__(self):
        return f"shmcoll.{self.name}" if self.builtin else f"<shmcoll.Op {self.name}>"

    def __reduce__(self):       # built-ins pickle by name (object variants travel as data, ops never do)
        return (_builtin, (self.name,)) if self.builtin else super().__reduce__()

    # -- the Python side: user ops on blocks, every op on objects ---------------
    def block(self, a, b):
        """a op b on two arrays of a user op."""
        if self._mpi_style:
            out = np.array(b, copy=True)
            self._fn(a, out, a.dtype)
            return out
        out = np.asarray(self._fn(a, b))
        if out.shape != a.shape:
            raise ValueError(f"user op {self.name} returned shape {out.shape} for blocks of shape {a.shape}")
        return out.astype(a.dtype, copy=False)

    def __call__(self, a, b):
        """a op b on Python objects (the lower-case collectives)."""
        if self._mpi_style:     # as one-element vectors, the value back as a Python object
            out = self.block(np.array([a]), np.array([b]))[0]
            return out.item() if isinstance(out, np.generic) else out
        if self._fn is not None:
            return self._fn(a, b)
        if self.code in (lib.SC_R_MINLOC, lib.SC_R_MAXLOC):
            better = operator.lt if self.code == lib.SC_R_MINLOC else operator.gt
            (va, ia), (vb, ib) = a, b
            return (vb, ib) if better(vb, va) or (not better(va, vb) and ib < ia) else (va, ia)
        return _OBJ[self.name](a, b)

    def Reduce_local(self, inbuf, inoutbuf):
        """inoutbuf = inbuf op inoutbuf, element by element, on this rank
        (MPI_Reduce_local): buffers or mpi4py buffer specs of one datatype
        and count."""
        a, b = _typed(inbuf, "inbuf", False), _typed(inoutbuf, "inoutbuf", True)
        if a.dtype != b.dtype or a.size != b.size:
            raise ValueError(f"Reduce_local: inbuf has {a.size} {a.dtype} items, inoutbuf {b.size} {b.dtype}; "
                             f"they must match")
        if self._fn is not None:
            b[...] = self.block(a, b)
        elif self.name in _UFUNCS:
            b[...] = _UFUNCS[self.name](a, b)
        else:                       # MINLOC, MAXLOC on (value, index) pairs
            b[...] = [self(x, y) for x, y in zip(a.tolist(), b.tolist())]


def _typed(buf, name, writable):
    """buf (a buffer or a buffer spec) as a flat numpy array over its memory."""
    from . import buffers, spec
    x = spec.simple(buf, name, writable)
    mem = memoryview(x).cast("B")
    if writable and mem.readonly:
        raise BufferError(f"Reduce_local: {name} is read-only")
    return np.frombuffer(mem, np.uint8).view(buffers.dtype_of(x))


def _arity(fn):
    """Parameters fn needs (those without a default)."""
    try:
        return sum(q.default is q.empty and q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)
                   for q in inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return 2


_OBJ = {"SUM": operator.add, "PROD": operator.mul, "MIN": min, "MAX": max,
        "LAND": lambda a, b: bool(a) and bool(b), "LOR": lambda a, b: bool(a) or bool(b),
        "LXOR": lambda a, b: bool(a) != bool(b), "BAND": operator.and_, "BOR": operator.or_, "BXOR": operator.xor}
_UFUNCS = {"SUM": np.add, "PROD": np.multiply, "MIN": np.minimum, "MAX": np.maximum, "LAND": np.logical_and,
           "LOR": np.logical_or, "LXOR": np.logical_xor, "BAND": np.bitwise_and, "BOR": np.bitwise_or,
           "BXOR": np.bitwise_xor}
BUILTINS = {name: Op(name, getattr(lib, "SC_R_" + name)) for name in _INT + ["MINLOC", "MAXLOC"]}
SUM, PROD, MIN, MAX, LAND, LOR, LXOR, BAND, BOR, BXOR, MINLOC, MAXLOC = BUILTINS.values()


def _builtin(name):
    return BUILTINS[name]


def _bfloat16():
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


BF16 = _bfloat16()


class Kernel:
    """What the C executor needs to fold one (op, dtype): the REDUCE word's
    kernel fields (shmcoll/isa.py), the element size, and whether it
    accumulates in float32.  loc: a MINLOC/MAXLOC pair's fields (index64,
    item, index_at)."""

    def __init__(self, op, type_code, item, loc=None):
        self.fields = {"kop": op, "type": type_code, **(loc or {})}
        self.item, self.half, self.loc = item, type_code in _HALF, bool(loc)

    def word(self, form, streamed=False):
        """Word 0 of a REDUCE; streamed: d by non-temporal stores (not for MINLOC/MAXLOC pairs)."""
        return isa.encode("REDUCE", form=form, streamed=int(streamed and not self.loc), **self.fields)[0]


def kernel(op, dt):
    """The Kernel of built-in op on dtype dt; raises TypeError naming both
    when the op makes no sense for the dtype."""
    if op.code in (lib.SC_R_MINLOC, lib.SC_R_MAXLOC):
        return Kernel(op.code, *_loc_layout(op, dt))
    t = _type(dt)
    kind = "b" if dt.kind == "b" else "f" if t == lib.SC_T_BF16 else dt.kind
    if t is None or op.name not in _KINDS.get(kind, ()):
        raise TypeError(f"{op.name} is not defined for dtype {dt}" +
                        (f"; it takes {', '.join(_KINDS[kind])}" if t is not None else
                         "; reductions take numpy integer, float, complex and bool types, float16 and bfloat16, "
                         "and (value, index) pairs for MINLOC/MAXLOC"))
    return Kernel(op.code, t, dt.itemsize)


def _type(dt):
    if BF16 is not None and dt == BF16:
        return lib.SC_T_BF16
    if dt.fields is not None or dt.subdtype is not None or not dt.isnative:
        return None
    if dt.kind in "fc" and dt.itemsize > (16 if dt.kind == "c" else 8):
        return _LONG[dt.kind]
    return _TYPES.get(f"{dt.kind}{dt.itemsize}")


def _loc_layout(op, dt):
    """(value type, item bytes, the REDUCE word's pair fields) of a (value, index) pair."""
    names = dt.names or ()
    if len(names) == 2:
        v, i = (dt.fields[n] for n in names)
        vt = lib.SC_T_LD if v[0].kind == "f" and v[0].itemsize > 8 else _LOC_VALUES.get(f"{v[0].kind}{v[0].itemsize}")
        if vt and v[1] == 0 and i[0].kind == "i" and i[0].itemsize in (4, 8) and v[0].isnative and i[0].isnative \
                and v[0].itemsize <= i[1] and i[1] + i[0].itemsize <= dt.itemsize < 256:
            return vt, dt.itemsize, {"index64": int(i[0].itemsize == 8), "item": dt.itemsize, "index_at": i[1]}
    raise TypeError(f"{op.name} takes (value, index) pairs: a structured dtype of an int16/32/64 or float value "
                    f"then an int32/int64 index, not {dt}")


def check_op(op):
    if not isinstance(op, Op):
        raise TypeError(f"op must be a shmcoll.Op (shmcoll.SUM, ..., or Op.Create(fn)), not {type(op).__name__}")
    return op
