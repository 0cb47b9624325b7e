"""Compiled programs as readable listings: one instruction a line, decoded
through the instruction set's one table (shmcoll/isa.py), so a new
opcode or field prints without a change here.  A wait bug (a rank that
waits for an event nobody posts, or posts one too few) shows in the
summary of the events each rank posts and waits on."""
import numpy as np

from . import isa
from ._core import lib

_SPACE_NAMES = {v: k.lower() for k, v in isa.SPACES.items()}
_SET_NAMES = {v: k.lower() for k, v in isa.SETS.items()}


def _names(prefix):
    """{code: name} of the C enums SC_<prefix>_* (core.h: reduction ops, types, forms)."""
    return {getattr(lib, n): n[len(prefix) + 4:].lower() for n in dir(lib)
            if n.startswith(f"SC_{prefix}_") and n[len(prefix) + 4:] not in ("NOPS", "NTYPES", "N")}


_KINDS = {"rop": _names("R"), "rtype": _names("T"), "rform": _names("F")}


def _slot(u):
    """An inline slot operand: j/width (slot j of the width a writer uses per call)."""
    s = {f.name: isa.get(f, [u]) for f in isa.SLOT}
    return f"{s['j']}/{s['width']}"


def space(sp):
    """A space operand: send, recv, tmp (fold input k), chan[r], slot[r].j/width, tiny[r].j/width, stripe."""
    s = {f.name: isa.get(f, [sp]) for f in isa.SPACE}
    kind = _SPACE_NAMES.get(s["kind"], f"space{s['kind']}")
    if kind in ("send", "recv"):
        return kind
    if kind == "tmp":
        return f"tmp(fold {s['index'] - 1})" if s["index"] else "tmp"
    if kind == "stripe":
        return kind
    return f"{kind}[{s['rank']}]" + (f".{_slot(s['index'])}" if kind in ("slot", "tiny") else "")


def _value(f, v):
    if f.kind == "space":
        return space(v)
    if f.kind == "buf":
        return _SPACE_NAMES.get(v, str(v))
    if f.kind == "set":
        return _SET_NAMES[v] if v < isa.SETS["SLOT"] else f"slot.{_slot(v - isa.SETS['SLOT'])}"
    if f.kind == "flags":
        rest = v & ~sum(f.flags.values())
        return "|".join([n for n, b in f.flags.items() if v & b] + ([f"{rest:#x}"] if rest else []))
    if f.kind == "rank" and v < 0:
        return "-"
    if f.kind in _KINDS:
        return _KINDS[f.kind].get(v, str(v))
    return str(v)


def instruction(words):
    """One instruction as text: its opcode and its operands by field name
    (a space followed by its offset as space+offset; zero flags, booleans
    and absent options left out)."""
    op, vals = isa.decode(words)
    out, fields = [], list(op.fields)
    i = 0
    while i < len(fields):
        f, v = fields[i], vals[fields[i].name]
        nxt = fields[i + 1] if i + 1 < len(fields) else None
        if f.kind == "space" and nxt is not None and nxt.name.endswith("off"):
            out.append(f"{f.name}={space(v)}+{vals[nxt.name]}")
            i += 2
            continue
        if not (v == 0 and (f.kind in ("bool", "flags") or f.optional)):
            out.append(f"{f.name}={_value(f, v)}")
        i += 1
    return f"{op.name:<8} " + " ".join(out)


def _ranges(xs):
    """1 2 3 5 -> '1-3 5'."""
    out, xs = [], sorted(set(xs))
    for x in xs:
        if out and out[-1][1] == x - 1:
            out[-1][1] = x
        else:
            out.append([x, x])
    return " ".join(str(a) if a == b else f"{a}-{b}" for a, b in out) or "-"


def _per_rank(pairs):
    by = {}
    for who, x in pairs:
        by.setdefault(who, []).append(x)
    return "; ".join(f"rank {w}: {_ranges(xs)}" for w, xs in sorted(by.items())) or "-"


def rank_listing(rank, prog):
    """One rank's program: its header, its instructions, then the events it
    posts and waits on and the acks it gives and waits for."""
    prog = np.asarray(prog, np.int64)
    h = {f.name: isa.get(f, prog) for f in isa.HEADER}
    sig = _signature({f.name: isa.get(f, [h["sig0"], h["sig1"]]) for f in isa.SIG})
    lines = [f"rank {rank}: {h['insns']} instructions, signature "
             + " ".join(f"{k}={v}" for k, v in sig.items())
             + f", scratch {h['scratch']} B, checks mask {h['checks']:#x}"
             + (f", first event {h['first']} posted at arrival" if h["first"] else "")]
    for i in range(h["insns"]):
        lines.append(f"  {i:4d}  {instruction(prog[isa.HEAD + i * isa.INSN:isa.HEAD + (i + 1) * isa.INSN])}")
    posts, waits, acks, waitacks = _events(prog)
    lines += [f"  posts events {_ranges(posts)}; waits on events {_per_rank(waits)}",
              f"  acks {_ranges(acks)}; waits for acks (debts included) {_per_rank(waitacks)}"]
    return "\n".join(lines)


def _signature(sig):
    """The signature's fields in words, as mismatch messages name them
    (0: no dtype, no op)."""
    from . import words
    from .coll import select
    op = select.OPS.get(sig["collective"])
    if op is not None:
        alg, names = sig["algorithm"] & ~isa.TWIN_ALG, select.NAMES[op]
        sig = dict(sig, collective=op, algorithm=(names[alg] if alg < len(names) else alg)
                   + "+twin" * bool(sig["algorithm"] & isa.TWIN_ALG))
    return dict(sig, dtype=words.dtype_name(sig["dtype"]) if sig["dtype"] else "-",
                op=words.field("", 5, sig["op"], 0) if sig["op"] else "-")


def _events(prog):
    """(posts, waits, acks, waitacks) of one program: the events it posts
    (the header's first included) and its acks; (who, event) it waits on
    and (who, count) of the acks it waits for."""
    prog = np.asarray(prog, np.int64)
    first = isa.get(isa.HEADER[3], prog)
    posts, waits, acks, waitacks = [first] if first else [], [], [], []
    for i in range(isa.get(isa.HEADER[0], prog)):
        op, v = isa.decode(prog[isa.HEAD + i * isa.INSN:isa.HEAD + (i + 1) * isa.INSN])
        if op.name == "POST":
            posts.append(v["event"])
        elif op.name == "WAIT":
            waits.append((v["who"], v["event"]))
        elif op.name == "ACK":
            acks.append(v["count"])
        elif op.name in ("WAITACK", "DEBT"):
            waitacks.append((v["who" if op.name == "WAITACK" else "reader"], v["count"]))
    return posts, waits, acks, waitacks


def unmatched(progs):
    """The waits no program satisfies: (rank, "event" or "ack", who, n)
    where who never posts event n (or acks n times) in this call.  Event 0
    is the arrival, which every rank posts."""
    ev = [_events(p) for p in progs]
    out = []
    for r, (_, waits, _, waitacks) in enumerate(ev):
        out += [(r, "event", w, e) for w, e in waits if e and e > max(ev[w][0], default=0)]
        out += [(r, "ack", w, n) for w, n in waitacks if n > max(ev[w][2], default=0)]
    return out


def listing(progs, sched=None, rank=None):
    """Every rank's program (or rank's alone), after the schedule they
    came from, and the waits that nothing satisfies (a hang)."""
    out = [str(sched)] if sched is not None else []
    out += [rank_listing(r, p) for r, p in enumerate(progs) if rank is None or r == rank]
    bad = unmatched(progs)
    out.append("unmatched waits: " + ("; ".join(f"rank {r} waits for rank {w}'s {what} {n}, never given"
                                                for r, what, w, n in bad) or "none"))
    return "\n".join(out) + "\n"


def program(op, nranks, nbytes, root=0, algorithm=None, *, rank=None, topology=None, options=None, cma=False,
            dtype=None):
    """The listing of collective op's compiled programs on nranks ranks for
    nbytes (as shmcoll.schedule counts them), planned and compiled here,
    no rank launched: the schedule, then each rank's program (rank: that
    one's alone).  topology: as shmcoll.schedule's, or a Topology (a virtual one, e.g.
    "1x4", gives each rank a CPU of its own, so the listing does not depend
    on this machine's CPUs; fix chunk_bytes, tile_bytes, nt_bytes and
    cma_bytes in options for one that does not depend on its caches
    either).  algorithm None: the automatic choice (of a twin, the
    single-copy program)."""
    from .planning import planned
    if rank is not None and (isinstance(rank, bool) or not (isinstance(rank, int) and 0 <= rank < nranks)):
        raise ValueError(f"rank must be in 0 .. {nranks - 1}, not {rank!r}")
    dtype = _dtype(op, dtype)
    sched, params = planned(op, algorithm, nranks, nbytes, root, topology=topology, options=options, cma=cma,
                            dtype=dtype, own_cpus=True)
    return _compiled(op, sched, params, dtype, rank)


def of_comm(comm, op, nbytes=0, root=0, algorithm=None, dtype=None, rank=None):
    """The listing of what communicator comm runs for op (its plan, its
    forced algorithms; as comm.schedule plans it), every rank's program
    or rank's alone (Comm.program)."""
    dtype = _dtype(op, dtype)
    return _compiled(op, comm.schedule(op, nbytes, root, algorithm, dtype), comm.plan.params, dtype, rank)


def _dtype(op, dtype):
    """The dtype a listing plans op for: a reduction's default is float64."""
    from .coll import select
    return np.float64 if dtype is None and op in select.REDUCTIONS else dtype


def _compiled(op, sched, params, dtype, rank):
    """sched compiled with params under the signature a call of dtype (a
    reduction's: with SUM) gives it, listed."""
    from . import buffers, ops
    from .coll import select
    from .compile import compile_schedule
    code = buffers.dtype_code(np.dtype(dtype)) if dtype is not None and select.dtyped(op) else 0
    sig = isa.signature(select.TABLE[op][0], select.IDS[op][sched.algorithm], sched.root, sched.nbytes, code,
                        ops.SUM.code if op in select.REDUCTIONS else 0)
    return listing(compile_schedule(sched, params, sig), sched, rank)
