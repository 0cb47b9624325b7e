"""Schedule -> per-rank programs for the C executor (csrc/exec.c).

Here every move gets its protocol (a bare signal, inline in a slot line,
staged in chunks through the writer's ring or the NUMA stripe, a single
copy read by the reader (direct) or written by the writer (push), or a
packed barrier queue), staged moves are cut into chunks
and laid out in their rings, and every post event and every ack is
numbered.  All ranks are compiled together: a writer about to reuse ring
memory must know which ack of which reader frees it.

A rank runs each step as rounds: it writes round 0, then for every round k
writes round k + 1 before it reads round k (its readers copy chunk k while
it fills chunk k + 1), then runs the step's local copies.  A writer's ring
holds two rounds of its chunks, so a write waits only for reads of an
earlier round: no rank waits on an event that a later one produces."""
import bisect

import numpy as np

from . import isa
from ._core import lib
from .sched import Step

SLOTS, TINY = lib.SC_SLOTS, lib.SC_SLOT_TINY
SP = isa.SPACES
BUF = {"send": SP["SEND"], "recv": SP["RECV"], "tmp": SP["TMP"]}
QUEUES = {"gather": 0, "release": 1}
RING, STRIPE, SLOT = isa.SETS["RING"], isa.SETS["STRIPE"], isa.SETS["SLOT"]
CHECK, FAR, FIRST, INSLOT, STAMPED = (isa.WAIT_FLAGS[f] for f in ("CHECK", "FAR", "FIRST", "INSLOT", "STAMPED"))
STREAM, STAMP = isa.COPY_FLAGS["STREAM"], isa.COPY_FLAGS["STAMP"]
#: Opcode numbers by name (isa.OPS), for code that reads programs word by word.
POST, WAIT, ACK, WAITACK, COPY, CMA, CMAW, SHARE = (isa.BY_NAME[n].code for n in
                                                    ("POST", "WAIT", "ACK", "WAITACK", "COPY", "CMA", "CMAW", "SHARE"))


def _up(n, a=64):
    """n rounded up to a multiple of a."""
    return -(-n // a) * a


space = isa.space


class _Ring:
    """One call's allocator over a ring (a writer's channel or the stripe):
    chunks go round it in order; reusing bytes means waiting for every
    reader of the chunks that held them.  The chunks not yet overwritten
    are kept disjoint and sorted by offset, so finding the ones a new chunk
    covers is a bisection, not a scan (a 2 MiB ring holds 16384 chunks of
    128 B)."""

    def __init__(self, cap, align):
        self.cap, self.align, self.pos, self.live, self.offs = cap, align, 0, [], []

    def alloc(self, slot, readers):
        """A slot of `slot` bytes (a step's largest chunk: equal slots,
        so a ring of two rounds never loses room to wrapping)."""
        n = max(_up(slot, self.align), self.align)
        self.pos = _up(self.pos, n)
        if self.pos + n > self.cap:
            self.pos = 0
        off, end = self.pos, self.pos + n
        self.pos = end
        lo = bisect.bisect_right(self.offs, off)
        if lo and self.live[lo - 1]["end"] > off:
            lo -= 1
        hi = bisect.bisect_left(self.offs, end, lo)
        waits = {}
        for chunk in self.live[lo:hi]:
            if len(chunk["acks"]) < chunk["readers"]:
                raise AssertionError("ring too small: a chunk would overwrite one not yet read")
            for r, a in chunk["acks"].items():
                waits[r] = max(waits.get(r, 0), a)
        chunk = {"off": off, "end": end, "readers": readers, "acks": {}}
        self.live[lo:hi], self.offs[lo:hi] = [chunk], [off]
        return chunk, waits


def _segments(parts, a, n):
    """(src offset, dst offset, bytes, offset in chunk) of the packed bytes
    [a, a + n) of a move's parts."""
    out, pos = [], 0
    for so, do, ln in parts:
        lo, hi = max(a, pos), min(a + n, pos + ln)
        if lo < hi:
            out.append((so + lo - pos, do + lo - pos, hi - lo, lo - a))
        pos += ln
    return out


#: A shared copy's pieces: at most this, so that the two ends even out;
#: more, smaller pieces cost more than they even out (bench/README.md,
#: "Engine constants").
SHARE_PIECE = 512 << 10


def _piece(n, paired):
    """Bytes per piece of a shared move of n bytes: halves where only one
    end has a move to copy, so both copy at once; whole moves up to
    SHARE_PIECE where each end reads one of a pair (an Alltoall between
    two ranks), as both copy anyway and halves only add claims; at most 63 pieces (6 bits of the claim word count each
    end's), whole pages past 63 of SHARE_PIECE, so that the two ends
    never pin the same page."""
    half = -(-n // 2) + 4095 & ~4095
    return max(min(n if paired else half, SHARE_PIECE), -(-n // 63) + 4095 & ~4095, 1)


def _protocol(m, slot_used, inline):
    """(how m travels, its inline slot index or None); moves of up to
    `inline` bytes go in the writer's inline slots while it has any."""
    if m.via == "queue":
        return "queue", None
    if m.nbytes == 0:
        return "signal", None
    if m.via in ("direct", "stripe", "push", "shared"):
        return m.via, None
    if m.via in ("auto", "inline") and m.nbytes <= inline and slot_used[m.src] < SLOTS:
        slot_used[m.src] += 1
        return "inline", slot_used[m.src] - 1
    return "staged", None


def _protocols(st, slot_used, inline):
    """Protocols of step st's moves (_protocol), where the inputs one reduce
    folds travel all inline or none: a fold cuts its inputs in one chunk,
    an inline one is whole, a staged one a ring chunk (writers out of slots
    midway through a call, chunk_bytes under inline_bytes)."""
    group = list(range(len(st.moves)))          # moves folded together, as a union-find

    def top(i):
        while group[i] != i:
            i = group[i]
        return i
    for red in st.reduces:
        ins = [i for i in red.inputs if isinstance(i, int)]
        for i in ins[1:]:
            group[top(i)] = top(ins[0])
    members = {}
    for i in range(len(st.moves)):
        members.setdefault(top(i), []).append(i)
    out = [None] * len(st.moves)
    for i, m in enumerate(st.moves):
        if out[i] is not None:
            continue
        mine = members[top(i)]
        if len(mine) == 1:
            out[i] = _protocol(m, slot_used, inline)
            continue
        trial = list(slot_used)
        tried = [_protocol(st.moves[k], trial, inline) for k in mine]
        if all(pr == "inline" for pr, _ in tried) or not any(pr == "inline" for pr, _ in tried):
            slot_used[:] = trial
        else:
            tried = [("staged", None) if pr == "inline" else (pr, j) for pr, j in tried]
        for k, t in zip(mine, tried):
            out[k] = t
    return out


def move_protocols(sched, params, slots=None):
    """Every step's [(protocol, inline slot or None)] per move, in call
    order (a writer's inline slots run out over the whole call); slots:
    the inline slots each writer uses, counted up here.  The compiler's
    choice, and what shmcoll.model costs a move by."""
    slots = [0] * sched.nranks if slots is None else slots
    inline = params.get("inline_bytes", lib.SC_INLINE)
    return [_protocols(st, slots, inline) for st in sched.steps]


class _Ranges:
    """Disjoint [start, end) byte ranges, sorted: what a rank's pending
    pushes write, asked for overlaps once per step (blocks × ranks of them
    in a big Reduce)."""

    def __init__(self):
        self.starts, self.ends = [], []

    def add(self, a, b):
        i = bisect.bisect_left(self.ends, a)            # the first range ending at or after a
        j = bisect.bisect_right(self.starts, b)         # past the last range starting at or before b
        if i < j:
            a, b = min(a, self.starts[i]), max(b, self.ends[j - 1])
        self.starts[i:j], self.ends[i:j] = [a], [b]

    def meets(self, a, b):
        i = bisect.bisect_right(self.ends, a)           # the first range ending past a
        return a < b and i < len(self.starts) and self.starts[i] < b


def _touches(st, r):
    """(start, end) of the user memory that rank r reads or writes in step
    st, or that others read from it or write into it.  sendbuf and recvbuf
    count as one buffer at the same offsets, as a reduction's are in place
    (a Gather root's sendbuf in place sits at its displacement instead:
    flat Gather moves in its one and only step, so only early_copies asks,
    which then keeps a root's copy in place, a little later than it could)."""
    user = ("send", "recv")
    for m in st.moves:
        if m.src == r and m.sbuf in user:
            yield from ((so, so + ln) for so, _, ln in m.parts)
        if r in m.dst and m.dbuf in user:
            yield from ((do, do + ln) for _, do, ln in m.parts)
    for cp in st.copies:
        if cp.rank == r:
            yield from [(o, o + cp.n) for b, o in ((cp.sbuf, cp.soff), (cp.dbuf, cp.doff)) if b in user]
    for red in st.reduces:
        if red.rank == r:
            yield from [(i[1], i[1] + red.n) for i in red.inputs + ((red.dbuf, red.doff),)
                        if isinstance(i, tuple) and i[0] in user]


class _Compiler:
    def __init__(self, sched, params, only=None):
        p = self.p = sched.nranks
        self.sched, self.params, self.only = sched, params, only
        self.prog = [[] for _ in range(p)]
        self.event = [0] * p          # last event each writer posted
        self.acks = [0] * p           # acks each reader gave
        slots = [0] * p               # inline slots each writer uses
        # every move's protocol up front: a writer's slot lines depend on how
        # many slots it uses in the whole call (csrc/exec.c's slot_index)
        self.protos = move_protocols(sched, params, slots)
        self.width = [1 << max(u - 1, 0).bit_length() for u in slots]
        self.slots = {}               # (j, width) -> a slot operand
        self.pending = [[] for _ in range(p)]   # written, not yet posted
        self.rings = {}
        self.stripe = _Ring(params["stripe_bytes"], params["stripe_bytes"] // params["stripe_slots"])
        self.drained = set()
        self.checked = set()
        self.owed = [{} for _ in range(p)]      # writer -> {(set, reader): ack} recorded as debts
        self.stripe_owed = {}
        self.direct_owed = [{} for _ in range(p)]
        self.late = [[] for _ in range(p)]             # reader -> pushes and shared copies it has not waited for yet
        self.helping = [[] for _ in range(p)]          # writer -> its shared moves of this step
        self.acked_by = [{} for _ in range(p)]         # rank -> {rank: the ack it last waited for}
        self.landing = [_Ranges() for _ in range(p)]    # reader -> the bytes of its recvbuf they write
        # scratch after the schedule's own: chunks of folded direct inputs,
        # copied in to be folded from cache, then the float32 accumulator
        # of half-type reductions
        self.stage_at = _up(sched.tmp)
        self.acc = 0
        self.acc_at = self.stage_at + max(map(self.staged_in, sched.steps, self.protos), default=0)
        # rank -> (step, start, end) of its recvbuf read later (streamed_fold):
        # reread by the rank itself (moves it writes from there but by single
        # copy, its folds from there, its copies, which run after their own
        # step's folds, so count in the next step); pulled by others' single
        # copies
        self.at, self.reread, self.pulled = -1, [[] for _ in range(p)], [[] for _ in range(p)]
        for i, (st, protocols) in enumerate(zip(sched.steps, self.protos)):
            for m, (proto, _) in zip(st.moves, protocols):
                if m.sbuf == "recv":
                    (self.pulled if proto == "direct" else self.reread)[m.src] += [(i, so, so + n)
                                                                                    for so, _, n in m.parts]
            for red in st.reduces:
                self.reread[red.rank] += [(i, off, off + red.n) for b, off in
                                          (x for x in red.inputs if not isinstance(x, int)) if b == "recv"]
            for cp in st.copies:
                if cp.sbuf == "recv":
                    self.reread[cp.rank].append((i + 1, cp.soff, cp.soff + cp.n))

    def staged_in(self, st, protocols):
        """Scratch bytes the folded direct inputs of st take on one rank
        at most: a chunk each (chunks are at most the move's own)."""
        per = [0] * self.p
        for red in st.reduces:
            for i in red.inputs:
                if isinstance(i, int) and protocols[i][0] == "direct":
                    m = st.moves[i]
                    per[red.rank] += _up(min(m.chunk or self.params["chunk_bytes"], m.nbytes))
        return max(per)

    def emit(self, rank, op, **operands):
        """Append instruction op (isa.OPS) with its operands by name to
        rank's program (when it is one compiled: every rank's bookkeeping,
        events and acks, runs either way)."""
        if self.only is None or rank == self.only:
            self.prog[rank].append(isa.encode(op, **operands))

    def drain(self, w, s):
        if (w, s) not in self.drained:
            self.drained.add((w, s))
            self.emit(w, "DRAIN", set=s)

    def settle(self, r, st=None):
        """Reader r waits for the pushes into its recvbuf once it is about
        to touch what they write (st: the next step), or at the end of the
        call: until then it works on, as pushes need nothing from it."""
        if st is not None and not any(self.landing[r].meets(a, b) for a, b in _touches(st, r)):
            return
        for w, piece, far, first in self.late[r]:
            if piece is None:           # a shared copy: the writer's ack (far) says it ended its part
                self.emit(r, "WAITACK", who=w, count=far)
                self.acked_by[r][w] = far
            else:
                self.wait(r, w, piece, far, first)
        self.late[r], self.landing[r] = [], _Ranges()

    def post(self, w):
        if self.pending[w]:
            self.event[w] += 1
            self.emit(w, "POST", event=self.event[w])
            for piece in self.pending[w]:
                piece["event"] = self.event[w]
                piece["alone"] = len(self.pending[w]) == 1
            self.pending[w] = []

    # -- one step ----------------------------------------------------------
    def slot(self, w, j):
        """Operand of writer w's inline slot j: j and the writer's width."""
        key = (j, self.width[w])
        if key not in self.slots:
            self.slots[key] = isa.pack(isa.SLOT, {"j": j, "width": key[1]})[0]
        return self.slots[key]

    def step(self, st, protocols):
        p, par = self.p, self.params
        self.at += 1
        for r in range(p):
            if self.late[r]:
                self.settle(r, st)
        moves = st.moves
        protos, slot_j = zip(*protocols) if moves else ((), ())
        nstaged = [0] * p
        for m, pr in zip(moves, protos):
            nstaged[m.src] += pr == "staged"
        folded = {(red.rank, i) for red in st.reduces for i in red.inputs if isinstance(i, int)}
        fed = {i for i, pr in enumerate(protos)
               if pr in ("staged", "direct") and any((d, i) in folded for d in moves[i].dst)}
        chunks = []
        for i, (m, pr) in enumerate(zip(moves, protos)):
            if pr == "staged":
                cap = max(par["chan_bytes"] // (2 * nstaged[m.src]) & ~63, 64)
                c = min(m.chunk or par["chunk_bytes"], cap)
            elif pr == "stripe":
                c = min(m.chunk or par["chunk_bytes"], self.stripe.align)
            elif pr == "direct" and i in fed:
                c = m.chunk or par["chunk_bytes"]       # not cut to its size: the step's smallest would cut all
            else:
                c = max(m.nbytes, 1)
            chunks.append(c)
        if fed:                 # a fold's inputs are cut alike, whichever writer's ring is tighter, in whole items
            c = min(chunks[i] for i in fed)
            c -= c % self.sched.kernel.item
            for i in fed:
                chunks[i] = c
        nch = [max(-(-m.nbytes // c), 1) for m, c in zip(moves, chunks)]
        slot = [0] * p
        for m, pr, c in zip(moves, protos, chunks):
            if pr == "staged":
                slot[m.src] = max(slot[m.src], c)
        pieces = [[None] * n for n in nch]
        outs = [[] for _ in range(p)]
        for i, m in enumerate(moves):
            outs[m.src].append(i)
        ins = [[] for _ in range(p)]
        for i, m in enumerate(moves):
            for d in m.dst:
                ins[d].append(i)
        if st.order:
            for r, order in st.order.items():
                ins[r] = list(order)
        far = st.far or {}
        rounds = max(nch, default=0)

        def write(k):
            for w in range(p):
                for i in outs[w]:
                    if k < nch[i]:
                        pieces[i][k] = self.write(w, moves[i], protos[i], slot_j[i], k, chunks[i], slot[w])
                        if not st.batch:
                            self.post(w)
                self.post(w)

        remote = [red for red in st.reduces if any(isinstance(i, int) for i in red.inputs)]
        reduces = [[(red, self.cut(red, moves, protos, chunks), self.streamed_fold(red)) for red in remote
                    if red.rank == r] for r in range(p)]

        def read(k):
            for r in range(p):
                held, landed, stage = [], {}, [self.stage_at]
                for i in ins[r]:
                    if k < nch[i]:
                        far_w, first = moves[i].src in far.get(r, ()), k == 0
                        if (r, i) in folded:
                            self.wait(r, moves[i].src, pieces[i][k], far_w, first,
                                      protos[i] == "inline" and pieces[i][k]["segs"])
                            landed[i] = self.land(r, moves[i], protos[i], pieces[i][k], stage, len(held))
                            held.append(i)
                        else:
                            self.read(r, moves[i], protos[i], slot_j[i], pieces[i][k], far_w, first)
                for red, c, nt in reduces[r]:
                    self.fold_round(red, k, c, nt, moves, protos, landed)
                if k == 0:
                    self.share_out(r)
                if held:
                    self.acks[r] += 1
                    self.emit(r, "ACK", count=self.acks[r])
                    for i in held:
                        self.acked(r, moves[i].src, protos[i], slot_j[i], pieces[i][k], self.acks[r])

        self.sharers = {r for m, pr in zip(moves, protos) if pr == "shared" for r in (m.src, *m.dst)}
        shared = [(m.src, m.dst[0]) for m, pr in zip(moves, protos) if pr == "shared"]
        if len(set(shared)) < len(shared):
            raise ValueError("one shared move per writer and reader in a step: they claim on one word")
        self.pairs = {(a, b) for a, b in shared if (b, a) in shared}
        self.share_ack = [None] * p
        early = self.early_copies(st, protos)
        self.twins = self.twin_copies(st, protos)
        later = [cp for cp in st.copies if cp not in early and cp not in self.twins.values()]
        for cp in early:
            self.copy(cp)
        if rounds:
            write(0)
        for k in range(rounds):
            if k + 1 < rounds:
                write(k + 1)
            read(k)
        self.shared_done(st, protos)
        for red in st.reduces:
            if red not in remote:
                self.fold_local(red)
        for cp in list(self.twins.values()) + later:      # twins no push took: as copies
            self.copy(cp)

    def copy(self, cp):
        self.emit(cp.rank, "COPY", dst=space(BUF[cp.dbuf]), doff=cp.doff, src=space(BUF[cp.sbuf]), soff=cp.soff,
                  n=cp.n, flags=STREAM * self.streamed(cp.dbuf), source=-1)

    def early_copies(self, st, protos):
        """A step with shared copies and no folds runs each rank's first
        local copies first, while they stay in user memory and touch
        nothing its moves do: fixed work before the work that the two ends
        split, which then evens out whatever the fixed work and a late
        arrival left uneven."""
        if "shared" not in protos or st.reduces:
            return []
        out, stopped, touched, moves = [], set(), {}, Step(st.moves)
        for cp in st.copies:
            if cp.rank not in touched:              # what the rank's moves touch, once per rank
                touched[cp.rank] = _Ranges()
                for a, b in _touches(moves, cp.rank):
                    touched[cp.rank].add(a, b)
            mine = touched[cp.rank]
            user = cp.sbuf in ("send", "recv") and cp.dbuf in ("send", "recv")
            if cp.rank in stopped or not user or mine.meets(cp.soff, cp.soff + cp.n) or \
                    mine.meets(cp.doff, cp.doff + cp.n):
                stopped.add(cp.rank)
            else:
                out.append(cp)
        return out

    def twin_copies(self, st, protos):
        """{(rank, sbuf, offset, bytes): copy} of the local copies that go
        with a push of the same bytes by the same rank (an Allgather
        writer's own block), piece by piece, so the source is read once
        (csrc/exec.c cma): from sendbuf into recvbuf, in a step without
        folds of a schedule whose sendbuf and recvbuf are apart.  The copy
        now runs during the push instead of after the step's reads, so
        nothing else the step does on its rank may touch what it writes,
        nor write what it reads."""
        if not self.sched.apart or "push" not in protos or st.reduces:
            return {}
        pushed = {(m.src, m.sbuf, so, n) for m, pr in zip(st.moves, protos) if pr == "push" and m.dst
                  for so, _, n in m.parts}
        out = {}
        for cp in st.copies:
            key = (cp.rank, cp.sbuf, cp.soff, cp.n)
            if key in out or key not in pushed or (cp.sbuf, cp.dbuf) != ("send", "recv"):
                continue
            near = {"send": _Ranges(), "recv": _Ranges()}    # what else reads or writes there
            for m in st.moves:
                for so, do, ln in m.parts:
                    if cp.rank in m.dst and m.dbuf in near:
                        near[m.dbuf].add(do, do + ln)
                    if m.src == cp.rank and m.sbuf == "recv":
                        near["recv"].add(so, so + ln)
            for o in st.copies:
                for b, off in ((o.sbuf, o.soff), (o.dbuf, o.doff)):
                    if o is not cp and o.rank == cp.rank and b in near:
                        near[b].add(off, off + o.n)
            if not (near["recv"].meets(cp.doff, cp.doff + cp.n) or near["send"].meets(cp.soff, cp.soff + cp.n)):
                out[key] = cp
        return out

    def share_out(self, w):
        """After its reads of a step, writer w takes its part of its own
        shared moves, then acks once: it has ended its part of every
        shared copy of the step."""
        for m in self.helping[w]:
            (so, do, n), = m.parts
            self.emit(w, "SHARE", streamed=self.streamed(m.dbuf), who=m.dst[0], writer=1, step=self.at,
                      buf=BUF[m.sbuf], soff=so, doff=do, n=n, piece=_piece(n, (m.dst[0], w) in self.pairs))
        if w in self.sharers:
            self.acks[w] += 1
            self.emit(w, "ACK", count=self.acks[w])
            self.share_ack[w] = self.acks[w]
        self.helping[w] = []

    def shared_done(self, st, protos):
        """Who waits for whose ack after a step's shared copies: the
        writer, before it leaves (its sendbuf is read), for the reader's;
        the reader, before it touches what lands or leaves, for the
        writer's."""
        for m, pr in zip(st.moves, protos):
            if pr != "shared":
                continue
            (so, do, n), r = m.parts[0], m.dst[0]
            self.direct_owed[m.src][r] = max(self.direct_owed[m.src].get(r, 0), self.share_ack[r])
            self.late[r].append((m.src, None, self.share_ack[m.src], False))
            self.landing[r].add(do, do + n)

    def streamed(self, dbuf):
        """1: copies into dbuf use non-temporal stores (user memory of a
        call whose footprint would not stay in cache)."""
        return int(self.sched.stream and dbuf == "recv")

    def streamed_fold(self, red):
        """Whether red's result streams past the cache (the schedule's
        stream_folds): where other ranks read it later by single copy (so
        from memory, not out of this core's cache, which is slow when the
        cores are far apart), and its own rank does not (to stage or push
        it, or fold it: it would read it back from memory).  A result that
        nobody reads in the call stays cached, as streaming it only
        slows the call (bench/README.md, "Engine constants")."""
        a, b = red.doff, red.doff + red.n

        def later(spans):
            return any(i > self.at and lo < b and a < hi for i, lo, hi in spans)
        return self.sched.stream_folds and red.dbuf == "recv" and later(self.pulled[red.rank]) and \
            not later(self.reread[red.rank])

    def write(self, w, m, proto, j, k, chunk, slot):
        n = min(chunk, m.nbytes - k * chunk) if m.nbytes else 0
        piece = {"event": 0, "segs": _segments(m.parts, k * chunk, n)}
        if proto == "queue":
            q = QUEUES[m.sbuf]
            for entry in ([w] if q == 0 else m.dst):
                self.emit(w, "QPOST", queue=q, entry=entry)
            return piece
        if proto == "direct":           # readers copy from the user's buffer, its address published at arrival
            if m.sbuf == "recv":        # filled by earlier steps: a post says it is there
                self.pending[w].append(piece)
            elif m.sbuf != "send":
                raise ValueError(f"a direct move reads the writer's sendbuf or recvbuf, not {m.sbuf!r}")
            return piece
        if proto == "signal":
            self.pending[w].append(piece)
            return piece
        if proto == "shared":           # w's part comes after its reads (share_out)
            if len(m.dst) != 1 or len(m.parts) != 1 or m.sbuf != "send" or m.dbuf != "recv":
                raise ValueError("a shared move is one part of the writer's sendbuf into one reader's recvbuf")
            if self.at > 0xf:
                raise ValueError("shared moves are tagged with their step: only in the first 16 steps")
            if (w, m.dst[0]) not in self.checked:
                self.wait(w, m.dst[0], {"event": 0}, False, False)
            self.helping[w].append(m)
            return piece
        if proto == "push":             # into each reader's recvbuf, its address published at arrival
            if m.dbuf != "recv":
                raise ValueError(f"a push move writes the reader's recvbuf, not {m.dbuf!r}")
            for r in m.dst:
                if (w, r) not in self.checked:  # w has not yet waited on r this call: wait for its arrival
                    self.wait(w, r, {"event": 0}, False, False)
                for so, do, ln, _ in piece["segs"]:
                    cp = self.twins.pop((w, m.sbuf, so, ln), None)
                    self.emit(w, "CMAW", src=space(BUF[m.sbuf]), soff=so, who=r, buf=BUF[m.dbuf], doff=do, n=ln,
                              twin=cp.doff + 1 if cp else 0, twin_stream=self.streamed(cp.dbuf) if cp else 0)
            self.pending[w].append(piece)
            return piece
        if proto == "inline":
            u = self.slot(w, j)
            self.drain(w, SLOT + u)
            dst = space(SP["TINY"] if m.nbytes <= TINY else SP["SLOT"], w, u)    # tiny: in the header's line
            piece["space"], piece["off"] = dst, 0
        else:
            ring = self.stripe if proto == "stripe" else self.rings.setdefault(w, _Ring(self.params["chan_bytes"], 64))
            self.drain(w, STRIPE if proto == "stripe" else RING)
            alloc, waits = ring.alloc(chunk if proto == "stripe" else slot, len(m.dst))
            for r, a in sorted(waits.items()):
                self.emit(w, "WAITACK", who=r, count=a)
            dst = space(SP["STRIPE"] if proto == "stripe" else SP["CHAN"], w)
            piece["space"], piece["off"], piece["alloc"] = dst, alloc["off"], alloc
        for i, (so, _, ln, at) in enumerate(piece["segs"]):
            self.emit(w, "COPY", dst=dst, doff=piece["off"] + at, src=space(BUF[m.sbuf]), soff=so, n=ln,
                      flags=STAMP if proto == "inline" and not i else 0, source=-1)
        self.pending[w].append(piece)
        return piece

    def wait(self, r, w, piece, far, first, inslot=False):
        """inslot: the piece is an inline slot; its stamp is the event's
        post when the event posts it alone, written by one copy (and no
        other stamp of the call lands on its line: move_protocols gives a
        writer at most SLOTS slots a call)."""
        flags = (CHECK if (r, w) not in self.checked else 0) | (FAR if far else 0) | (FIRST if first else 0)
        self.checked.add((r, w))
        stamped = inslot and piece["alone"] and len(piece["segs"]) == 1
        if stamped or inslot and flags & CHECK:
            self.emit(r, "WAIT", who=w, event=piece["event"], flags=flags | INSLOT | STAMPED * stamped,
                      slot=piece["space"])
        else:
            self.emit(r, "WAIT", who=w, event=piece["event"], flags=flags)

    def read(self, r, m, proto, j, piece, far, first):
        w = m.src
        if proto == "queue":
            q = QUEUES[m.sbuf]
            self.emit(r, "QWAIT", queue=q, entry=w if q == 0 else r, who=w)
            return
        if proto == "push":             # lands by itself: waited for late, nothing to copy or free
            self.late[r].append((w, piece, far, first))
            for _, do, ln, _ in piece["segs"]:
                self.landing[r].add(do, do + ln)
            if self.params.get("record_traffic"):
                self.emit(r, "COUNT", source=w, bytes=sum(ln for _, _, ln, _ in piece["segs"]))
            return
        self.wait(r, w, piece, far, first, proto == "inline" and piece["segs"])
        if proto == "signal":
            return
        nt = self.streamed(m.dbuf)
        if proto == "shared":           # r's part first; r's ack comes after its part of its own moves
            (so, do, n), = m.parts
            self.emit(r, "SHARE", streamed=nt, who=w, writer=0, step=self.at, buf=BUF[m.sbuf], soff=so, doff=do,
                      n=n, piece=_piece(n, (w, r) in self.pairs))
            if self.params.get("record_traffic"):
                self.emit(r, "COUNT", source=w, bytes=n)
            return
        if proto == "direct":
            for so, do, ln, _ in piece["segs"]:
                self.emit(r, "CMA", streamed=nt, dst=space(BUF[m.dbuf]), doff=do, who=w, buf=BUF[m.sbuf], soff=so, n=ln)
        else:
            for so, do, ln, at in piece["segs"]:
                self.emit(r, "COPY", dst=space(BUF[m.dbuf]), doff=do, src=piece["space"], soff=piece["off"] + at, n=ln,
                          flags=STREAM * nt, source=w)
        self.acks[r] += 1
        self.emit(r, "ACK", count=self.acks[r])
        self.acked(r, w, proto, j, piece, self.acks[r])

    def acked(self, r, w, proto, j, piece, a):
        """Reader r's ack a frees piece: record who waits for it."""
        if proto == "direct":
            self.direct_owed[w][r] = a
        elif proto == "inline":
            self.owed[w][(SLOT + self.slot(w, j), r)] = a
        elif proto == "stripe":
            piece["alloc"]["acks"][r] = a
            self.stripe_owed[r] = a
        else:
            piece["alloc"]["acks"][r] = a
            self.owed[w][(RING, r)] = a

    # -- reductions ----------------------------------------------------------
    @staticmethod
    def cut(red, moves, protos, chunks):
        """The chunk every move red folds is cut in (one round each)."""
        mine = [i for i in red.inputs if isinstance(i, int)]
        c = {min(chunks[i], red.n) for i in mine}
        if len({moves[i].nbytes for i in mine} | {red.n}) != 1 or len(c) != 1 \
                or any(protos[i] not in ("inline", "staged", "direct") for i in mine):
            raise AssertionError("a reduce folds moves of its own size, inline, staged or direct, cut alike")
        return c.pop()

    def land(self, r, m, proto, piece, stage, j):
        """Where reader r folds piece of m, its j-th input of the round,
        from: where it was written (slot line or ring), or, read directly,
        the copy r makes of it at stage[0] in its scratch (moved past it),
        folded from cache; or, one piece in the writer's arena, where it
        lies (exec.c: the CMA leaves it there, fold input slot j)."""
        if proto != "direct":
            return piece["space"], piece["off"]
        at, segs = stage[0], piece["segs"]
        j = j + 1 if len(segs) == 1 and j < self.p else 0
        for so, _, ln, pos in segs:
            self.emit(r, "CMA", dst=space(BUF["tmp"]), doff=at + pos, who=m.src, buf=BUF[m.sbuf], soff=so, n=ln, fold=j)
        stage[0] += _up(sum(ln for _, _, ln, _ in segs))
        return space(BUF["tmp"], 0, j), at

    def fold_round(self, red, k, c, nt, moves, protos, landed):
        """Round k of red: its inputs' chunk k (of c bytes), folded where
        they landed (nt: streamed_fold(red))."""
        lo = k * c
        if lo >= red.n:
            return
        n, srcs = min(c, red.n - lo), []
        for i in red.inputs:
            if isinstance(i, int):
                srcs.append(landed[i])
                if self.params.get("record_traffic") and protos[i] != "direct":   # a CMA counts its own
                    self.emit(red.rank, "COUNT", source=moves[i].src, bytes=n)
            else:
                srcs.append((space(BUF[i[0]]), i[1] + lo))
        self.fold(red.rank, srcs, (space(BUF[red.dbuf]), red.doff + lo), n, nt)

    def fold_local(self, red):
        """A reduce of local inputs only, in cache-sized chunks."""
        item = self.sched.kernel.item
        c, nt = max(self.params["chunk_bytes"] // item, 1) * item, self.streamed_fold(red)
        for lo in range(0, red.n, c):
            srcs = [(space(BUF[b]), off + lo) for b, off in red.inputs]
            self.fold(red.rank, srcs, (space(BUF[red.dbuf]), red.doff + lo), min(c, red.n - lo), nt)

    def fold(self, r, srcs, dst, n, nt):
        """dst = srcs[0] op srcs[1] op ... over n bytes (one input: a copy);
        half types through a float32 accumulator in scratch, rounded once.
        nt: the last kernel, which writes the result, streams it past the
        cache (the earlier ones write dst only to read it back)."""
        if len(srcs) == 1:
            if srcs[0] != dst:
                self.emit(r, "COPY", dst=dst[0], doff=dst[1], src=srcs[0][0], soff=srcs[0][1], n=n, flags=STREAM * nt,
                          source=-1)
            return
        kern = self.sched.kernel
        items = n // kern.item
        if kern.half:
            self.acc = max(self.acc, 4 * items)
        if self.only is not None and r != self.only:
            return
        if not kern.half:
            self.reduce(r, kern.word(lib.SC_F_SAME, nt and len(srcs) == 2), dst, srcs[0], srcs[1], items)
            for i, s in enumerate(srcs[2:], 3):
                self.reduce(r, kern.word(lib.SC_F_INTO, nt and i == len(srcs)), dst, dst, s, items)
            return
        acc = (space(BUF["tmp"]), self.acc_at)
        self.reduce(r, kern.word(lib.SC_F_WIDEN), acc, srcs[0], srcs[1], items)
        for s in srcs[2:]:
            self.reduce(r, kern.word(lib.SC_F_ACC), acc, acc, s, items)
        self.reduce(r, kern.word(lib.SC_F_NARROW, nt), dst, acc, acc, items)

    def reduce(self, r, word, dst, a, b, items):
        """A REDUCE: word 0 is the kernel's (ops.Kernel.word: opcode and kernel fields), operands by name."""
        if self.only is None or r == self.only:
            ins = isa.encode("REDUCE", dst=dst[0], doff=dst[1], a=a[0], aoff=a[1], b=b[0], boff=b[1], items=items)
            self.prog[r].append((word,) + ins[1:])

    def finish(self, sig, tmp):
        """Each rank's program: header, then instructions (see core.h);
        None for the ranks not compiled."""
        out = []
        for r in range(self.p):
            self.settle(r)
        for w in range(self.p):
            if self.only is not None and w != self.only:
                out.append(None)
                continue
            for r, a in sorted(self.direct_owed[w].items()):
                if self.acked_by[w].get(r, 0) < a:
                    self.emit(w, "WAITACK", who=r, count=a)
            for (s, r), a in sorted(self.owed[w].items()):
                self.emit(w, "DEBT", set=s, reader=r, count=a)
            for r, a in sorted(self.stripe_owed.items()):
                self.emit(w, "DEBT", set=STRIPE, reader=r, count=a)
            ins = self.prog[w]
            first = 0
            if ins and ins[0][0] == POST:       # a leading post rides on the arrival
                first, ins = isa.decode(ins[0])[1]["event"], ins[1:]
            mask = sum(1 << k for k, nb in enumerate(checks(w, self.p, self.params.get("check_star")))
                       if (w, nb) not in self.checked)
            a = np.zeros(isa.HEAD + len(ins) * isa.INSN, np.int64)
            a[:isa.HEAD] = isa.pack(isa.HEADER, {"insns": len(ins), "sig0": sig[0], "sig1": sig[1], "first": first,
                                                 "scratch": max(tmp, self.acc_at + self.acc), "checks": mask})
            if ins:
                a[8:] = np.array(ins, dtype=np.int64).ravel()
            out.append(a)
        return out


def checks(w, p, star):
    """The ranks w checks the records of, each by its wait on it or, when
    its program has none, at the end of every SC_LOOK-th such call and in
    Free (exec.c, recheck): every rank its neighbours, in a ring, or in a
    star around rank 0.  Each link is checked from both ends by a graph
    that depends on the plan alone, so ranks running different programs
    still check each other, and the later of two that differ sees the
    other's record even in a job's last call (in its Free)."""
    if star:
        return list(range(1, p)) if w == 0 else [0][:p > 1]
    return list(dict.fromkeys(r for r in ((w - 1) % p, (w + 1) % p) if r != w))


def compile_schedule(sched, params, sig, only=None):
    """Every rank's program for sched, or rank only's alone (the others
    None); sig = the call's signature words."""
    c = _Compiler(sched, params, only)
    for st, protocols in zip(sched.steps, c.protos):
        c.step(st, protocols)
    return c.finish(sig, sched.tmp)

