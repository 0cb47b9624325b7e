"""Signature fields in words, for mismatch messages: every field by its
name and value (a collective, an algorithm and an op by name, a dtype
as numpy names it), never by the code C compares."""
import functools

import numpy as np

from .buffers import dtype_code
from .coll import select
from .device import TWIN_ALG
from .isa import ROUTED_ALG
from .ops import BUILTINS

#: In a reduction's signature, the op of a rank that passed IN_PLACE: a
#: rank in place plans its inputs' moves differently, so ranks must agree.
INPLACE_OP = 0x80
#: In a signature's byte count, the mark of a hash of counts and
#: displacements (a v-variant's, Reduce_scatter's): no byte count reaches it.
COUNTS_HASH = 1 << 61


@functools.lru_cache(maxsize=None)
def _dtypes():
    """{signature code: names} of numpy's dtypes of whole bytes, in either
    byte order; made on the first message only (codes are checksums)."""
    out = {}
    for t in set(np.sctypeDict.values()):
        dt = np.dtype(t)
        if dt.itemsize == 0 or dt.hasobject:
            continue
        for d in {dt, dt.newbyteorder("<"), dt.newbyteorder(">")}:
            name = d.name if d.isnative else f"{d.name} ({'big' if d.byteorder == '>' else 'little'}-endian)"
            out.setdefault(dtype_code(d), set()).add(name)
    return out


def dtype_name(code):
    names = sorted(_dtypes().get(code, ()))
    if not names:
        return f"a dtype that is no numpy built-in (code {code})"
    return names[0] if len(names) == 1 else "one of " + ", ".join(names)


def field(what, f, value, when):
    """Field f (device.FIELDS) of a signature, whose value is value, in a
    call of method `what` (when > 0: an earlier call's, whose collective
    need not be what's)."""
    if f == 1:
        return select.OPS.get(value, f"collective id {value}")
    if f == 3:
        if value & COUNTS_HASH:
            return f"counts and displacements #{value & COUNTS_HASH - 1:x}"
        return f"{value} bytes"
    if f == 4:
        return dtype_name(value)
    if f == 5:
        name = next((o.name for o in BUILTINS.values() if o.code == value & ~INPLACE_OP), f"op code {value}")
        return name + " with IN_PLACE" * bool(value & INPLACE_OP)
    if f == 6:
        op = select.collective(what)
        if when or op is None:      # an earlier call's collective names the ids
            return f"algorithm id {value}"
        if value == ROUTED_ALG:
            return select.ROUTED.get(op, "point-to-point")
        names, alg = select.NAMES[op], value & ~TWIN_ALG
        name = names[alg] if 0 <= alg < len(names) else f"algorithm id {alg}"
        return f"{name} (automatic: single copy or staged, as timed)" if value & TWIN_ALG else name
    return value
