"""The instruction set's one definition (shmcoll/isa.py): the C header in
the tree is the table's, the C side sees the same numbers, fields do not
overlap, and what compile.py encodes decodes back field by field."""
import os
import random

import pytest

from shmcoll import device, isa
from shmcoll._core import lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_header_in_the_tree_is_the_tables():
    """csrc/isa.h is generated at build time (csrc/build.py; not in git):
    a hand edit, or a table change without a rebuild, shows here."""
    with open(os.path.join(ROOT, "csrc", "isa.h")) as f:
        assert f.read() == isa.header(), "csrc/isa.h is stale: rebuild (python3 setup.py build_ext --inplace)"


def test_the_built_library_has_the_tables_numbers():
    for op in isa.OPS:
        assert getattr(lib, f"SC_OP_{op.name}") == op.code
        for f in op.fields:
            name = f"SC_{op.name}_{f.name}".upper()
            assert (getattr(lib, name), getattr(lib, name + "_LO"), getattr(lib, name + "_BITS")) == (f.word, f.lo, f.bits)
            for flag, bit in (f.flags or {}).items():
                assert getattr(lib, f"SC_{op.name}_{flag}") == bit
    for k, v in isa.SPACES.items():
        assert getattr(lib, f"SC_{k}") == v
    assert [getattr(lib, f"SC_K_{n}".upper()) for n in isa.KEY] == list(range(lib.SC_KEY))
    assert lib.SC_INSN == isa.INSN and lib.SC_HEAD == isa.HEAD


@pytest.mark.parametrize("op", isa.OPS, ids=lambda o: o.name)
def test_fields_are_disjoint_and_round_trip(op):
    """No two fields of an instruction share a bit (word 0's opcode
    included); random operands encode and decode back."""
    used = {}
    for f in [isa.OPCODE] + list(op.fields):
        assert 0 <= f.word < isa.INSN and 0 <= f.lo and f.lo + f.bits <= 64, f
        for b in range(f.lo, f.lo + f.bits):
            assert (f.word, b) not in used, f"{op.name}.{f.name} overlaps {used[f.word, b]}"
            used[f.word, b] = f.name
    rnd = random.Random(op.code)
    for _ in range(50):
        vals = {f.name: rnd.randrange(-(1 << 40), 1 << 40) if f.bits == 64 else rnd.randrange(1 << f.bits)
                for f in op.fields}
        words = isa.encode(op.name, **vals)
        assert len(words) == isa.INSN and all(-(1 << 63) <= w < 1 << 63 for w in words)
        assert isa.decode(words) == (op, vals)


def test_a_value_that_does_not_fit_raises():
    with pytest.raises(ValueError, match="step"):
        isa.encode("SHARE", step=16)
    with pytest.raises(TypeError, match="who"):
        isa.encode("POST", who=1)


def test_signature_layout():
    """w0 = collective | algorithm << 8 | dtype << 16 | op << 24 | root << 32 (signed), w1 = bytes."""
    for coll, alg, root, n, dt, op in [(2, 3, 5, 1 << 20, 101, 7), (15, 0x80, -1, 0, 0, 0), (1, 0, 1023, 1 << 62, 255, 255)]:
        w0 = coll | alg << 8 | dt << 16 | op << 24 | (root & 0xffffffff) << 32
        assert isa.signature(coll, alg, root, n, dt, op) == (w0 - (1 << 64) if w0 >> 63 else w0, n)
        got = {f.name: isa.get(f, isa.signature(coll, alg, root, n, dt, op)) for f in isa.SIG}
        assert got == {"collective": coll, "algorithm": alg, "root": root, "bytes": n, "dtype": dt, "op": op}


def test_fingerprint_is_fnv1a_of_counts_then_displacements():
    """device.fingerprint calls the C entries' own function."""
    def fnv(words):
        h = 0xcbf29ce484222325
        for x in words:
            h = ((h ^ (x & (1 << 64) - 1)) * 0x100000001b3) & (1 << 64) - 1
        h |= 1
        return h - (1 << 64) if h >> 63 else h
    for counts, displs in [([1, 2, 3], [0, 1, 3]), ([0], [0]), ([1 << 40, 5], [7, 1 << 41])]:
        assert device.fingerprint(counts, displs) == fnv(counts + displs)


def test_a_reduce_word_is_its_kernel_through_the_table():
    """ops.Kernel builds a REDUCE's word 0 through isa's fields, so the
    printer and exec.c read back the op, type, form and pair layout it
    was made for (numpy's own field offsets for a pair)."""
    import numpy as np
    from shmcoll import ops
    pair = np.dtype([("v", "f4"), ("pad", "i4"), ("i", "i8")])[["v", "i"]]
    for op, dt in ((ops.SUM, np.dtype("f8")), (ops.BXOR, np.dtype("u2")), (ops.MINLOC, pair)):
        k = ops.kernel(op, dt)
        for form in (lib.SC_F_SAME, lib.SC_F_NARROW):
            got, v = isa.decode((k.word(form, True),) + (0,) * 7)
            assert got.name == "REDUCE" and (v["kop"], v["form"]) == (op.code, form)
            assert v["streamed"] == (op is not ops.MINLOC)
            if op is ops.MINLOC:
                assert (v["index64"], v["item"], v["index_at"]) == (1, dt.itemsize, dt.fields["i"][1])
            else:
                assert v["type"] == k.fields["type"] and not v["item"]


def test_fingerprint_of_unequal_counts_and_displacements_raises():
    """sc_fingerprint reads 2 n words: displacements fewer than counts
    would make it read past the array (it hashed whatever lay there)."""
    with pytest.raises(ValueError, match="displacements"):
        device.fingerprint([1, 2, 3], [0])
