"""MPI datatypes as numpy sees them (MPI.DOUBLE, MPI.INT, ...).

A Datatype is `count` consecutive elements of one numpy dtype, `base`;
Get_size() = base.itemsize x count is the bytes one item spans in memory,
which is what every spec and message counts by.  Predefined types map to
the numpy types mpi4py maps them to with MPICH on this platform; the pair
types of MINLOC/MAXLOC (DOUBLE_INT, ...) are aligned structured dtypes with
C's layout, as shmcoll.ops reduces them.  Beyond Create_contiguous, derived
types (vector, struct, subarray, ...) are not covered: they raise
NotImplementedError naming the call."""
import numpy as np

from .errors import ERR_TYPE, MPIError

# MPICH's combiners; the ones past CONTIGUOUS name derived types not covered
COMBINERS = {"COMBINER_NAMED": 1, "COMBINER_DUP": 2, "COMBINER_CONTIGUOUS": 3, "COMBINER_VECTOR": 4,
             "COMBINER_HVECTOR": 6, "COMBINER_INDEXED": 7, "COMBINER_HINDEXED": 9, "COMBINER_INDEXED_BLOCK": 10,
             "COMBINER_STRUCT": 12, "COMBINER_SUBARRAY": 13, "COMBINER_DARRAY": 14, "COMBINER_F90_REAL": 15,
             "COMBINER_F90_COMPLEX": 16, "COMBINER_F90_INTEGER": 17, "COMBINER_RESIZED": 18,
             "COMBINER_HINDEXED_BLOCK": 19, "COMBINER_VALUE_INDEX": 20}
COMBINER_NAMED, COMBINER_DUP, COMBINER_CONTIGUOUS = 1, 2, 3


class Datatype:
    """An MPI datatype: `count` elements of numpy dtype `base`."""

    def __init__(self, datatype=None):
        """Datatype(other): another Python object for the same type, equal
        to it (mpi4py's: the same handle)."""
        self.base, self.count, self._name, self._combiner, self._parent = None, 1, "", COMBINER_NAMED, None
        self._predefined, self._handle = False, self
        if datatype is not None:
            if not isinstance(datatype, Datatype):
                raise TypeError(f"Datatype() takes a Datatype, not {type(datatype).__name__}")
            self.__dict__.update(datatype.__dict__)

    @classmethod
    def _make(cls, base, count=1, name="", combiner=COMBINER_NAMED, parent=None, predefined=False):
        t = cls()
        t.base, t.count, t._name, t._combiner, t._parent = base, count, name, combiner, parent
        t._predefined = predefined
        return t

    def _live(self, call):
        if self.base is None:
            raise MPIError(ERR_TYPE, f"Datatype.{call}: the datatype is DATATYPE_NULL (never made, or freed)")
        return self

    # -- sizes -------------------------------------------------------------------
    def Get_size(self):
        return self._live("Get_size").base.itemsize * self.count

    def Get_extent(self):
        """(lower bound, extent) in bytes: an item's stride in memory."""
        return 0, self._live("Get_extent").Get_size()

    def Get_true_extent(self):
        """(lower bound, bytes from the first to the end of the last byte
        holding data): short of the extent by a pair type's tail padding."""
        self._live("Get_true_extent")
        tail = self.base.itemsize
        if self.base.names:
            tail = max(off + dt.itemsize for dt, off, *_ in self.base.fields.values())
        return 0, self.base.itemsize * (self.count - 1) + tail if self.count else 0

    size = property(Get_size)
    true_lb = property(lambda self: self.Get_true_extent()[0])
    true_ub = property(lambda self: sum(self.Get_true_extent()))
    extent = property(lambda self: self.Get_extent()[1])
    lb = property(lambda self: 0)
    ub = property(lambda self: self.Get_extent()[1])
    true_extent = property(lambda self: self.Get_true_extent()[1])

    # -- names and kinds -----------------------------------------------------------
    def Get_name(self):
        return self._name

    def Set_name(self, name):
        self._name = str(name)

    name = property(Get_name, Set_name)

    def Get_envelope(self):
        """(integers, addresses, large counts, datatypes, combiner), as
        MPI-4's MPI_Type_get_envelope_c."""
        self._live("Get_envelope")
        return {COMBINER_NAMED: (0, 0, 0, 0, COMBINER_NAMED), COMBINER_DUP: (0, 0, 0, 1, COMBINER_DUP),
                COMBINER_CONTIGUOUS: (0, 0, 1, 1, COMBINER_CONTIGUOUS)}[self._combiner]

    envelope = property(Get_envelope)
    combiner = property(lambda self: self.Get_envelope()[4])

    def Get_contents(self):
        """(integers, addresses, large counts, datatypes) that made it."""
        if self._combiner == COMBINER_NAMED:
            raise MPIError(ERR_TYPE, "Datatype.Get_contents: a named (predefined) datatype has no contents")
        counts = [self.count // self._parent.count] if self._combiner == COMBINER_CONTIGUOUS else []
        return [], [], counts, [self._parent]

    contents = property(Get_contents)

    def decode(self):
        """(the type it was made from, the combiner's name, its parameters), as mpi4py's."""
        self._live("decode")
        if self._combiner == COMBINER_NAMED:
            return self, "NAMED", {}
        if self._combiner == COMBINER_DUP:
            return self._parent, "DUP", {}
        return self._parent, "CONTIGUOUS", {"count": self.Get_contents()[2][0]}
    is_named = property(lambda self: self._combiner == COMBINER_NAMED and self.base is not None)
    is_predefined = property(lambda self: self._predefined or self.base is None)

    @property
    def typechar(self):
        """numpy's character for the type ('d' for DOUBLE), 'V' for a
        derived or pair type."""
        if self.base is None:
            return ""
        if self._combiner == COMBINER_DUP:
            return self._parent.typechar
        if not self.is_named or self.base.names:
            return "V"
        return _CHARS.get(self._name, self.base.char)

    @property
    def typestr(self):
        """numpy's type string ('f8' for DOUBLE, 'V24' for three of them)."""
        if self.base is None:
            return ""
        if self.typechar == "V":
            return f"V{self.Get_size()}"
        return self.base.str.lstrip("<>|=")

    def tocode(self):
        if self.typechar in ("", "V"):
            raise ValueError(f"cannot map datatype {self._name or self!r} to a typecode")
        return self.typechar

    @classmethod
    def fromcode(cls, code):
        """The predefined datatype of a numpy/struct typecode ('d', 'f8', 'i')."""
        try:
            return _typedict[code]
        except KeyError:
            raise ValueError(f"cannot map typecode {code!r} to a datatype") from None

    # -- life ----------------------------------------------------------------------
    def Create_contiguous(self, count):
        """count items of this type, one after the other."""
        count = int(count)
        if count < 0:
            raise MPIError(ERR_TYPE, f"Datatype.Create_contiguous: negative count {count}")
        self._live("Create_contiguous")
        return Datatype._make(self.base, self.count * count, "", COMBINER_CONTIGUOUS, self)

    def Dup(self):
        self._live("Dup")
        return Datatype._make(self.base, self.count, self._name, COMBINER_DUP, self)

    Create_dup = Dup

    def Commit(self):
        self._live("Commit")
        return self

    def Free(self):
        if self._predefined:
            raise MPIError(ERR_TYPE, f"Datatype.Free: cannot free the predefined datatype {self._name}")
        self.base, self._parent = None, None

    def __bool__(self):
        return self.base is not None

    def __reduce__(self):
        """A predefined type unpickles as itself, so `==` still holds."""
        if self._predefined:        # a copy (Datatype(MPI.INT)) unpickles as another copy
            return (_predefined, (self._name,)) if self is self._handle else (Datatype, (self._handle,))
        if self.base is None:
            return _predefined, ("MPI_DATATYPE_NULL",)
        return Datatype._make, (self.base, self.count, self._name, self._combiner, self._parent)

    def __eq__(self, other):
        if not isinstance(other, Datatype):
            return NotImplemented
        return self._handle is other._handle or (self.base is None and other.base is None)

    def __hash__(self):
        return id(self._handle)

    def __repr__(self):
        return f"<shmcoll.MPI.Datatype {self._name or self.typestr or 'DATATYPE_NULL'}>"


def _uncovered(call):
    def method(self, *args, **kw):
        raise NotImplementedError(f"shmcoll.MPI: Datatype.{call} is not covered (contiguous datatypes only: "
                                  "Create_contiguous; see docs/mpi.md)")
    method.__name__ = call
    return method


for _call in ("Create_vector", "Create_hvector", "Create_indexed", "Create_hindexed", "Create_indexed_block",
              "Create_hindexed_block", "Create_struct", "Create_subarray", "Create_darray", "Create_resized",
              "Resized", "Pack", "Unpack", "Pack_size", "Pack_external", "Unpack_external", "Pack_external_size",
              "Create_f90_integer", "Create_f90_real", "Create_f90_complex", "Match_size", "Get_value_index"):
    setattr(Datatype, _call, _uncovered(_call))


def _pair(value):
    """A (value, int) pair of MINLOC/MAXLOC with C's layout and padding."""
    return np.dtype([("value", value), ("index", np.intc)], align=True)


# (MPICH's name, attributes that hold it, numpy dtype) as mpi4py maps them with MPICH on this platform
_TABLE = [
    ("MPI_DATATYPE_NULL", ["DATATYPE_NULL", "BFLOAT16_T", "INTEGER16", "REAL2", "COMPLEX4", "LOGICAL1", "LOGICAL2",
                           "LOGICAL4", "LOGICAL8", "LOGICAL16"], None),    # types MPICH does not have here
    ("MPI_PACKED", ["PACKED"], np.uint8),
    ("MPI_BYTE", ["BYTE"], np.uint8),
    ("MPI_AINT", ["AINT"], np.intp),
    ("MPI_OFFSET", ["OFFSET"], np.int64),
    ("MPI_COUNT", ["COUNT"], np.int64),
    ("MPI_CHAR", ["CHAR"], "S1"),
    ("MPI_WCHAR", ["WCHAR"], "U1"),
    ("MPI_SIGNED_CHAR", ["SIGNED_CHAR"], np.byte),
    ("MPI_SHORT", ["SHORT", "SIGNED_SHORT"], np.short),
    ("MPI_INT", ["INT", "SIGNED_INT"], np.intc),
    ("MPI_LONG", ["LONG", "SIGNED_LONG"], np.dtype("l")),
    ("MPI_LONG_LONG_INT", ["LONG_LONG", "SIGNED_LONG_LONG"], np.longlong),
    ("MPI_UNSIGNED_CHAR", ["UNSIGNED_CHAR"], np.ubyte),
    ("MPI_UNSIGNED_SHORT", ["UNSIGNED_SHORT"], np.ushort),
    ("MPI_UNSIGNED", ["UNSIGNED", "UNSIGNED_INT"], np.uintc),
    ("MPI_UNSIGNED_LONG", ["UNSIGNED_LONG"], np.dtype("L")),
    ("MPI_UNSIGNED_LONG_LONG", ["UNSIGNED_LONG_LONG"], np.ulonglong),
    ("MPI_FLOAT", ["FLOAT", "FLOAT32_T"], np.float32),
    ("MPI_DOUBLE", ["DOUBLE", "FLOAT64_T"], np.float64),
    ("MPI_LONG_DOUBLE", ["LONG_DOUBLE"], np.longdouble),
    ("MPI_C_BOOL", ["C_BOOL", "BOOL"], np.bool_),
    ("MPI_INT8_T", ["INT8_T"], np.int8),
    ("MPI_INT16_T", ["INT16_T"], np.int16),
    ("MPI_INT32_T", ["INT32_T"], np.int32),
    ("MPI_INT64_T", ["INT64_T"], np.int64),
    ("MPI_UINT8_T", ["UINT8_T"], np.uint8),
    ("MPI_UINT16_T", ["UINT16_T"], np.uint16),
    ("MPI_UINT32_T", ["UINT32_T"], np.uint32),
    ("MPI_UINT64_T", ["UINT64_T"], np.uint64),
    ("MPIX_C_FLOAT16", ["FLOAT16_T"], np.float16),
    ("MPI_C_COMPLEX", ["C_COMPLEX", "C_FLOAT_COMPLEX"], np.complex64),
    ("MPI_C_DOUBLE_COMPLEX", ["C_DOUBLE_COMPLEX"], np.complex128),
    ("MPI_C_LONG_DOUBLE_COMPLEX", ["C_LONG_DOUBLE_COMPLEX"], np.clongdouble),
    ("MPI_CXX_BOOL", ["CXX_BOOL"], np.bool_),
    ("MPI_CXX_FLOAT_COMPLEX", ["CXX_FLOAT_COMPLEX"], np.complex64),
    ("MPI_CXX_DOUBLE_COMPLEX", ["CXX_DOUBLE_COMPLEX"], np.complex128),
    ("MPI_CXX_LONG_DOUBLE_COMPLEX", ["CXX_LONG_DOUBLE_COMPLEX"], np.clongdouble),
    ("MPI_CHARACTER", ["CHARACTER"], "S1"),
    ("MPI_LOGICAL", ["LOGICAL", "F_BOOL"], np.int32),
    ("MPI_INTEGER", ["INTEGER", "F_INT"], np.int32),
    ("MPI_REAL", ["REAL", "F_FLOAT"], np.float32),
    ("MPI_DOUBLE_PRECISION", ["DOUBLE_PRECISION", "F_DOUBLE"], np.float64),
    ("MPI_COMPLEX", ["COMPLEX", "F_COMPLEX", "F_FLOAT_COMPLEX"], np.complex64),
    ("MPI_DOUBLE_COMPLEX", ["DOUBLE_COMPLEX", "F_DOUBLE_COMPLEX"], np.complex128),
    ("MPI_INTEGER1", ["INTEGER1"], np.int8),
    ("MPI_INTEGER2", ["INTEGER2"], np.int16),
    ("MPI_INTEGER4", ["INTEGER4"], np.int32),
    ("MPI_INTEGER8", ["INTEGER8"], np.int64),
    ("MPI_REAL4", ["REAL4"], np.float32),
    ("MPI_REAL8", ["REAL8"], np.float64),
    ("MPI_REAL16", ["REAL16"], np.longdouble),
    ("MPI_COMPLEX8", ["COMPLEX8"], np.complex64),
    ("MPI_COMPLEX16", ["COMPLEX16"], np.complex128),
    ("MPI_COMPLEX32", ["COMPLEX32"], np.clongdouble),
    ("MPI_SHORT_INT", ["SHORT_INT"], _pair(np.short)),
    ("MPI_2INT", ["TWOINT", "INT_INT"], _pair(np.intc)),
    ("MPI_LONG_INT", ["LONG_INT"], _pair(np.dtype("l"))),
    ("MPI_FLOAT_INT", ["FLOAT_INT"], _pair(np.float32)),
    ("MPI_DOUBLE_INT", ["DOUBLE_INT"], _pair(np.float64)),
    ("MPI_LONG_DOUBLE_INT", ["LONG_DOUBLE_INT"], _pair(np.longdouble)),
]
_CHARS = {"MPI_AINT": "p", "MPI_OFFSET": "p", "MPI_COUNT": "p", "MPI_CHAR": "c", "MPI_CHARACTER": "c"}
PREDEFINED = {}     # attribute name -> Datatype
_BY_NAME = {}       # MPICH's name -> Datatype
for _name, _attrs, _dt in _TABLE:
    _t = Datatype._make(None if _dt is None else np.dtype(_dt), 1, _name, predefined=True)
    _BY_NAME[_name] = _t
    PREDEFINED.update(dict.fromkeys(_attrs, _t))


def _predefined(name):
    return _BY_NAME[name]


# numpy and struct typecodes -> datatype, as mpi4py's MPI._typedict
_CODES = {"?": "C_BOOL", "b": "SIGNED_CHAR", "h": "SHORT", "i": "INT", "l": "LONG", "q": "LONG_LONG",
          "B": "UNSIGNED_CHAR", "H": "UNSIGNED_SHORT", "I": "UNSIGNED", "L": "UNSIGNED_LONG", "Q": "UNSIGNED_LONG_LONG",
          "f": "FLOAT", "d": "DOUBLE", "g": "LONG_DOUBLE", "Zf": "C_FLOAT_COMPLEX", "Zd": "C_DOUBLE_COMPLEX",
          "F": "C_FLOAT_COMPLEX", "D": "C_DOUBLE_COMPLEX", "Zg": "C_LONG_DOUBLE_COMPLEX", "G": "C_LONG_DOUBLE_COMPLEX",
          "i1": "INT8_T", "i2": "INT16_T", "i4": "INT32_T", "i8": "INT64_T", "u1": "UINT8_T", "u2": "UINT16_T",
          "u4": "UINT32_T", "u8": "UINT64_T", "f4": "FLOAT", "f8": "DOUBLE", "f16": "LONG_DOUBLE",
          "c8": "C_FLOAT_COMPLEX", "c16": "C_DOUBLE_COMPLEX", "c32": "C_LONG_DOUBLE_COMPLEX", "b1": "C_BOOL",
          "n": "COUNT", "N": "UNSIGNED_LONG", "p": "AINT", "P": "UNSIGNED_LONG", "c": "CHAR", "a": "CHAR", "S": "CHAR",
          "S1": "CHAR", "s": "CHAR", "1s": "CHAR", "U": "WCHAR", "U1": "WCHAR", "u": "UINT16_T", "1u": "UINT16_T",
          "w": "WCHAR", "1w": "WCHAR", "M": "INT64_T", "M8": "INT64_T", "m": "INT64_T", "m8": "INT64_T"}
_typedict = {code: PREDEFINED[name] for code, name in _CODES.items()}
_typedict["e"] = _typedict["f2"] = _BY_NAME["MPIX_C_FLOAT16"]
_typedict_c = {k: v for k, v in _typedict.items() if k in "? b h i l q B H I L Q f d g F D G".split()
               or k[:1] in "ifucb" and k[1:].isdigit()}
# Fortran's typecodes, as mpi4py's MPI._typedict_f
_typedict_f = {code: PREDEFINED[name] for code, name in {
    "l": "LOGICAL", "i": "INTEGER", "r": "REAL", "s": "REAL", "d": "DOUBLE_PRECISION", "c": "COMPLEX",
    "z": "DOUBLE_COMPLEX", "i1": "INTEGER1", "i2": "INTEGER2", "i4": "INTEGER4", "i8": "INTEGER8", "r4": "REAL4",
    "r8": "REAL8", "r16": "REAL16", "c8": "COMPLEX8", "c16": "COMPLEX16", "c32": "COMPLEX32"}.items()}
