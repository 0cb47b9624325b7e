"""Mismatch messages name every signature field by its name and value:
a dtype as numpy names it, an op, a collective and an algorithm by name,
a root, a byte count; never the code C compares."""
import numpy as np
import pytest

import shmcoll
from shmcoll import buffers, words
from shmcoll.coll import select
from shmcoll.device import FIELDS, TWIN_ALG
from conftest import run_ranks


def _differ(comm, case):
    me = comm.rank
    try:
        if case == "dtype":       # the same bytes, another dtype
            a = np.ones(4, np.float64) if me == 0 else np.ones(8, np.int32)
            comm.Allreduce(a, np.empty_like(a))
        else:
            a = np.ones(4)
            comm.Allreduce(a, np.empty_like(a), op=shmcoll.SUM if me == 0 else shmcoll.MAX)
    except shmcoll.ShmcollError as e:
        return type(e).__name__, str(e)
    return None


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("case,names", [("dtype", ("float64", "int32")), ("op", ("SUM", "MAX"))])
def test_mismatch_names_both_values_on_every_rank(case, names, p):
    got = run_ranks(_differ, p, case, timeout=30)
    for r, g in enumerate(got):
        assert g is not None and g[0] == "MismatchError", (r, got)
        assert f"({case})" in g[1] and all(n in g[1] for n in names), (r, g)


def test_every_numpy_dtype_is_named():
    for t in set(np.sctypeDict.values()):
        dt = np.dtype(t)
        if dt.itemsize and not dt.hasobject:
            assert dt.name in words.dtype_name(buffers.dtype_code(dt)), dt


@pytest.mark.parametrize("op", list(select.TABLE))
def test_every_field_in_words(op):
    what = select.method(op)
    assert words.field(what, 1, select.TABLE[op][0], 0) == op
    assert words.field(what, 2, 3, 0) == 3       # "(root): rank 0 has 3"
    assert words.field(what, 3, 4096, 0) == "4096 bytes"
    assert "counts and displacements" in words.field(what, 3, 5 | words.COUNTS_HASH, 0)
    assert words.field(what, 4, buffers.dtype_code(np.dtype(np.float32)), 0) == "float32"
    assert words.field(what, 5, shmcoll.MAX.code, 0) == "MAX"
    assert words.field(what, 5, shmcoll.SUM.code | words.INPLACE_OP, 0) == "SUM with IN_PLACE"
    for i, name in enumerate(select.NAMES[op]):
        assert words.field(what, 6, i, 0) == name
        assert words.field(what, 6, i | TWIN_ALG, 0).startswith(name + " (automatic")
    assert set(FIELDS) == {1, 2, 3, 4, 5, 6}
