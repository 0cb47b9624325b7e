"""The executor's instruction set, declared once.

A program is SC_HEAD header words then instructions of SC_INSN int64
words; word 0 of an instruction holds its opcode in bits 0-7.  Every
operand is a field: a word index and a bit range.  This table is the one
definition: csrc/isa.h is generated from it (csrc/build.py writes it at
build time; tests/test_isa.py checks the copy in the tree), so exec.c
decodes with the names declared here (SC_ARG(in, SC_WAIT_WHO) compiles to
the same load, shift and mask as a literal), compile.py encodes with
encode(), and shmcoll/listing.py prints any program through the same
fields.  Plain Python, importable without the C core (build.py loads it
by path)."""
import functools
from collections import namedtuple

INSN, HEAD = 8, 8

#: A field: name, word, first bit, bits (64: the whole word, signed), kind
#: (how the printer shows it: int, rank, event, count, space, buf, set,
#: flags, bool, signed, and rop, rtype, rform: core.h's SC_R_, SC_T_, SC_F_),
#: for flags {name: bit}, and optional (0: absent, not printed).
Field = namedtuple("Field", "name word lo bits kind flags optional", defaults=(0, 64, "int", None, False))
Op = namedtuple("Op", "name code fields doc")

WAIT_FLAGS = {"CHECK": 1, "FAR": 2, "FIRST": 4, "INSLOT": 8, "STAMPED": 16}
COPY_FLAGS = {"STREAM": 1, "STAMP": 2}
_STREAMED = Field("streamed", 0, 8, 1, "bool")     # CMA, SHARE: their plain copies (a peer's arena) stream

OPS = [
    Op("END", 0, [], "end of the program"),
    Op("POST", 1, [Field("event", 1, kind="event")], "my post line reaches (call, event)"),
    Op("WAIT", 2, [Field("who", 1, kind="rank"), Field("event", 2, kind="event"),
                   Field("flags", 3, kind="flags", flags=WAIT_FLAGS), Field("slot", 4, kind="space", optional=True)],
       "wait for who's post line to reach (call, event); CHECK: then check who's arrival record (INSLOT: the "
       "copy stamped in inline slot `slot`; STAMPED: the slot's stamp is the post, waited on instead of the line); "
       "FAR: spin long; FIRST: a message's first piece (traffic)"),
    Op("ACK", 3, [Field("count", 1, kind="count")], "my ack line reaches (call, count)"),
    Op("WAITACK", 4, [Field("who", 1, kind="rank"), Field("count", 2, kind="count"),
                      Field("flags", 3, kind="flags", flags={"FAR": 2})], "wait for who's ack line"),
    Op("COPY", 5, [Field("dst", 1, kind="space"), Field("doff", 2), Field("src", 3, kind="space"),
                   Field("soff", 4), Field("n", 5), Field("flags", 6, kind="flags", flags=COPY_FLAGS),
                   Field("source", 7, kind="rank")],
       "copy n bytes; STREAM: non-temporal stores; STAMP: stamp my arrival record in the inline slot dst first; "
       "source: the rank whose bytes these are (traffic), or -1"),
    Op("CMA", 6, [_STREAMED, Field("dst", 1, kind="space"), Field("doff", 2), Field("who", 3, kind="rank"),
                  Field("buf", 4, kind="buf"), Field("soff", 5), Field("n", 6), Field("fold", 7, optional=True)],
       "single copy: read n bytes of who's buffer buf; fold: a fold input slot + 1 (0: none), where a peer's "
       "bytes are folded where they lie"),
    Op("DRAIN", 7, [Field("set", 1, kind="set")], "wait for the readers recorded on debt set `set`, then forget them"),
    Op("DEBT", 8, [Field("set", 1, kind="set"), Field("reader", 2, kind="rank"), Field("count", 3, kind="count")],
       "before rewriting set, wait for reader's ack of count"),
    Op("QPOST", 9, [Field("queue", 1), Field("entry", 2)], "packed barrier queue (0 gather, 1 release): post entry"),
    Op("QWAIT", 10, [Field("queue", 1), Field("entry", 2), Field("who", 3, kind="rank")],
       "wait for who's entry of a packed barrier queue"),
    Op("REDUCE", 11, [Field("kop", 0, 8, 8, "rop"), Field("type", 0, 16, 8, "rtype"), Field("form", 0, 24, 4, "rform"),
                      Field("index64", 0, 28, 1, "bool"), Field("streamed", 0, 29, 1, "bool"),
                      Field("item", 0, 32, 8, optional=True), Field("index_at", 0, 40, 8, optional=True),
                      Field("dst", 1, kind="space"), Field("doff", 2), Field("a", 3, kind="space"), Field("aoff", 4),
                      Field("b", 5, kind="space"), Field("boff", 6), Field("items", 7)],
       "dst = a kop b over items (form: csrc/core.h SC_F_*); index64, item, index_at: MINLOC/MAXLOC pairs; "
       "streamed: dst by non-temporal stores"),
    Op("COUNT", 12, [Field("source", 1, kind="rank"), Field("bytes", 2)], "traffic record of a folded input"),
    Op("CMAW", 13, [Field("src", 1, kind="space"), Field("soff", 2), Field("who", 3, kind="rank"),
                    Field("buf", 4, kind="buf"), Field("doff", 5), Field("n", 6), Field("twin_stream", 7, 0, 1, "bool"),
                    Field("twin", 7, 1, 63, optional=True)],
       "single copy into who's buffer buf; twin: my recv offset + 1 (0: none) that gets the same bytes on the way, "
       "twin_stream: by non-temporal stores"),
    Op("SHARE", 14, [_STREAMED, Field("who", 1, kind="rank"), Field("writer", 2, 0, 1, "bool"),
                     Field("step", 2, 8, 4), Field("buf", 3, kind="buf"), Field("soff", 4), Field("doff", 5),
                     Field("n", 6), Field("piece", 7)],
       "single copy of n bytes of the writer's buf into the reader's recv, split by the two piece by piece"),
]
BY_NAME = {o.name: o for o in OPS}
BY_CODE = {o.code: o for o in OPS}
OPCODE = Field("opcode", 0, 0, 8)

#: Program header words.
HEADER = [Field("insns", 0), Field("sig0", 1), Field("sig1", 2), Field("first", 3, kind="event"),
          Field("scratch", 4), Field("checks", 5), Field("counts", 6), Field("twin", 7)]

#: Space operands (COPY, CMA, REDUCE, WAIT's slot): kind | rank << 8 | index << 32 (an inline slot's operand,
#: or a fold input slot + 1 for TMP).
SPACES = {"SEND": 1, "RECV": 2, "TMP": 3, "CHAN": 4, "SLOT": 5, "STRIPE": 6, "TINY": 7}
SPACE = [Field("kind", 0, 0, 8), Field("rank", 0, 8, 24), Field("index", 0, 32, 32)]
#: An inline slot operand: j | width << 8 (a writer using width slots a call, exec.c slot_index).
SLOT = [Field("j", 0, 0, 8), Field("width", 0, 8, 56)]
#: Debt sets: the ring, the stripe, SLOT + an inline slot operand.
SETS = {"RING": 0, "STRIPE": 1, "SLOT": 2}

#: The call signature, two words every rank publishes at arrival and
#: compares; ids in the order mismatch messages name the fields (what the
#: user passed before what was derived from it).
SIG = [Field("collective", 0, 0, 8), Field("root", 0, 32, 32, "signed"), Field("bytes", 1),
       Field("dtype", 0, 16, 8), Field("op", 0, 24, 8), Field("algorithm", 0, 8, 8)]
SIG_ID = {f.name: i + 1 for i, f in enumerate(SIG)}
SIG_FIELD = {f.name: f for f in SIG}
TWIN_ALG = 0x80         # in the algorithm field: a twin (the automatic choice, single copy or staged)
ROUTED_ALG = 0x40       # and the arrival of a call routed by point-to-point (csrc/p2p.c routed)
#: What csrc/p2p.c routed() runs for each collective routed by point-to-point.
ROUTED_KIND = {"alltoallv": 0, "alltoallw": 0, "gatherv": 1, "scatterv": 2}

#: The fast entries' program cache key (csrc/pyfast.c builds it from the
#: arguments, comm.py the same from the parsed ones).
KEY = ["collective", "algorithm", "root", "send", "recv", "type", "counts"]
KEY_OP_SHIFT = 8        # a reduction's built-in op code, in the collective word
KEY_NONE = -1           # algorithm: automatic; a buffer: absent
KEY_INPLACE = -2        # send: IN_PLACE

#: Constants with no field of their own.
CONSTANTS = {"SC_INSN": INSN, "SC_HEAD": HEAD, "SC_OP_STREAMED": 1 << _STREAMED.lo, "SC_KEY": len(KEY),
             "SC_KEY_OP_SHIFT": KEY_OP_SHIFT, "SC_KEY_NONE": KEY_NONE, "SC_KEY_INPLACE": KEY_INPLACE,
             "SC_ROUTED_ALG": ROUTED_ALG, "SC_ROUTED_ALLTOALLV": ROUTED_KIND["alltoallv"],
             "SC_ROUTED_GATHERV": ROUTED_KIND["gatherv"], "SC_ROUTED_SCATTERV": ROUTED_KIND["scatterv"],
             "SC_ROUTED_KINDS": len(set(ROUTED_KIND.values()))}


def _mask(f):
    return (1 << f.bits) - 1


def put(f, v):
    """v in field f, as bits of its word."""
    if f.bits == 64:
        return v
    if not 0 <= v <= _mask(f) and not (f.kind == "signed" and -(1 << f.bits - 1) <= v < 1 << f.bits - 1):
        raise ValueError(f"{v} does not fit field {f.name} ({f.bits} bits)")
    return (v & _mask(f)) << f.lo


def get(f, words):
    """Field f of words (a word sequence indexed by f.word)."""
    w = int(words[f.word])
    if f.bits == 64:
        return w
    v = (w & (1 << 64) - 1) >> f.lo & _mask(f)
    return v - (1 << f.bits) if f.kind == "signed" and v >> f.bits - 1 else v


def _signed(w):
    w &= (1 << 64) - 1
    return w - (1 << 64) if w >> 63 else w


def pack(fields, values):
    """The words of fields set to values ({name: value}; absent: 0)."""
    out = [0] * (1 + max((f.word for f in fields), default=0))
    for f in fields:
        if values.get(f.name):
            out[f.word] |= put(f, int(values[f.name]))     # a numpy integer would wrap or overflow in the shifts
    return [_signed(w) for w in out]


_ENC = {o.name: ([f for f in o.fields if f.word == 0], [f for f in o.fields if f.word]) for o in OPS}


def encode(name, **operands):
    """One instruction's INSN words: opcode name with its operands by field name."""
    word0, rest = _ENC[name]
    if set(operands) - {f.name for f in word0 + rest}:
        raise TypeError(f"{name} has no operand {sorted(set(operands) - {f.name for f in word0 + rest})}")
    words = [BY_NAME[name].code] + [0] * (INSN - 1)
    for f in word0 + rest:
        v = operands.get(f.name)
        if v:
            words[f.word] = words[f.word] | put(f, int(v)) if f.bits < 64 else int(v)
    return tuple(_signed(w) for w in words)


def decode(words):
    """(Op, {field: value}) of one instruction's words."""
    op = BY_CODE.get(int(words[0]) & 0xff)
    if op is None:
        raise ValueError(f"unknown opcode {int(words[0]) & 0xff}")
    return op, {f.name: get(f, words) for f in op.fields}


@functools.lru_cache(maxsize=4096)
def space(kind, rank=0, index=0):
    """A space operand: kind (SPACES) of rank, with index."""
    return pack(SPACE, {"kind": kind, "rank": rank, "index": index})[0]


def signature(coll, alg, root, nbytes, dtype=0, op=0):
    """(w0, w1): the call's signature words."""
    return tuple(pack(SIG, {"collective": coll, "algorithm": alg, "root": root, "bytes": nbytes, "dtype": dtype,
                            "op": op}))


def key(coll, alg, root, send, recv, kind, op=0, counts=0):
    """The fast entries' cache key of a call (KEY's order)."""
    return (coll | op << KEY_OP_SHIFT, alg, root, send, recv, kind, counts)


def _cname(*parts):
    return "_".join(("SC",) + parts).upper()


def header():
    """The text of csrc/isa.h: enums only (the file is also part of cffi's cdef)."""
    out = ["/* GENERATED from shmcoll/isa.py by csrc/build.py: edit the table there, not this file.",
           " * Opcodes, header words, space kinds, debt sets, flags; each field F as",
           " * F (its word), F_LO (first bit), F_BITS (64: the whole word), read by",
           " * SC_ARG / SC_SARG (sc_internal.h). */"]

    def enum(items):
        """items: (name, value) pairs, or lists of them that share a line."""
        lines = [it if isinstance(it, list) else [it] for it in items]
        out.append("enum {\n" + "".join("    " + " ".join(f"{n} = {v}," for n, v in ln) + "\n" for ln in lines) + "};")

    def fields(prefix, fs):
        items = []
        for f in fs:
            n = _cname(prefix, f.name)
            items.append([(n, f.word), (n + "_LO", f.lo), (n + "_BITS", f.bits)])
            if f.flags:
                items.append([(_cname(prefix, k), v) for k, v in f.flags.items()])
        return items
    enum([[("SC_OPCODE", OPCODE.word), ("SC_OPCODE_LO", OPCODE.lo), ("SC_OPCODE_BITS", OPCODE.bits)]] +
         [(_cname("op", o.name), o.code) for o in OPS])
    enum(list(CONSTANTS.items()))
    enum(fields("h", HEADER))
    enum([(_cname(k), v) for k, v in SPACES.items()] + fields("space", SPACE) + fields("slotop", SLOT))
    enum([(_cname("set", k), v) for k, v in SETS.items()])
    enum(fields("sig", SIG) + [(_cname("sf", f.name), i) for f, i in zip(SIG, SIG_ID.values())])
    enum([(_cname("k", n), i) for i, n in enumerate(KEY)])
    for o in OPS:
        if o.fields:
            enum(fields(o.name, o.fields))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(header(), end="")
