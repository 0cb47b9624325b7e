"""The compiler's ring allocator (compile._Ring) against a plain model that
scans every chunk still in the ring: the same places, the same acks to
wait for, the same refusal to overwrite a chunk not yet read."""
import random

import pytest

from shmcoll.compile import _Ring


class _Model:
    def __init__(self, cap, align):
        self.cap, self.align, self.pos, self.chunks = cap, align, 0, []

    def alloc(self, slot, readers):
        n = max(-(-slot // self.align) * self.align, self.align)
        self.pos = -(-self.pos // n) * n
        if self.pos + n > self.cap:
            self.pos = 0
        off, end = self.pos, self.pos + n
        self.pos = end
        hit = [c for c in self.chunks if c["off"] < end and off < c["end"]]
        if any(len(c["acks"]) < c["readers"] for c in hit):
            raise AssertionError("unread")
        waits = {}
        for c in hit:
            for r, a in c["acks"].items():
                waits[r] = max(waits.get(r, 0), a)
        chunk = {"off": off, "end": end, "readers": readers, "acks": {}}
        self.chunks = [c for c in self.chunks if c not in hit] + [chunk]
        return chunk, waits


@pytest.mark.parametrize("seed", range(12))
def test_ring_places_chunks_and_waits_as_a_full_scan_does(seed):
    rnd = random.Random(seed)
    cap, align = rnd.choice([(1024, 64), (8192, 64), (8192, 512), (65536, 64)])
    ring, model, ack, refused = _Ring(cap, align), _Model(cap, align), 0, 0
    slot = rnd.randint(1, cap // 2)
    for i in range(3000):
        if rnd.random() < 0.05:             # a new step: another slot size
            slot = rnd.choice([rnd.randint(1, 200), rnd.randint(1, cap // 2), cap])
        readers = rnd.randint(1, 3)
        try:
            want = model.alloc(slot, readers)
        except AssertionError:
            with pytest.raises(AssertionError, match="ring too small"):
                ring.alloc(slot, readers)
            refused += 1
            break
        got = ring.alloc(slot, readers)
        assert (got[0]["off"], got[0]["end"], got[1]) == (want[0]["off"], want[0]["end"], want[1]), i
        for r in rnd.sample(range(4), readers if rnd.random() < 0.999 else readers - 1):
            ack += rnd.randint(1, 3)
            got[0]["acks"][r] = want[0]["acks"][r] = ack
    assert i > 100 or refused


class _Counted(list):
    """A list that counts the items read from it."""
    reads = 0

    def __getitem__(self, k):
        got = super().__getitem__(k)
        _Counted.reads += len(got) if isinstance(k, slice) else 1
        return got

    def __iter__(self):
        _Counted.reads += len(self)
        return super().__iter__()


class _Probe(_Ring):
    """A ring whose list of chunks counts its reads, whatever list the
    allocator puts there."""
    @property
    def live(self):
        return self._live

    @live.setter
    def live(self, chunks):
        self._live = chunks if isinstance(chunks, _Counted) else _Counted(chunks)


def test_placing_a_chunk_reads_only_the_chunks_it_overwrites():
    """A first call with a tiny chunk_bytes planned for seconds (7 s for
    a 560 KB Allreduce at 3 ranks with chunk_bytes=128): every placement
    scanned all the chunks in the ring, thousands of them.  Here a 256 KiB
    ring of 64 B chunks goes round twice, and each placement may read the
    chunk before it and the one it overwrites."""
    ring, n = _Probe(256 << 10, 64), 2 * (256 << 10) // 64
    _Counted.reads = 0
    for i in range(n):
        chunk, waits = ring.alloc(64, 1)
        assert waits == ({0: i - n // 2} if i >= n // 2 else {})
        chunk["acks"][0] = i
    assert _Counted.reads <= 2 * n


def _every_schedule():
    """(op, algorithm, nranks, nbytes, topology) over every algorithm of
    every collective, odd and even rank counts, sizes from empty to staged."""
    from shmcoll.coll import select
    for op in select.TABLE:
        for alg in select.algorithms(op):
            for p, nbytes, topo in ((3, 0, None), (4, 24, None), (5, 40 << 10, "2x3"), (7, 1 << 20, None)):
                yield op, alg, p, nbytes, topo


@pytest.mark.parametrize("case", list(_every_schedule()), ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{c[3]}")
def test_one_rank_compiled_alone_is_its_program_among_all(case):
    """A rank compiles its own program only (device.program, the first
    call at 256 ranks): the instructions of the whole compile's."""
    import numpy as np

    from shmcoll.coll import select
    from shmcoll.compile import compile_schedule
    from shmcoll.planning import planned
    op, alg, p, nbytes, topo = case
    dtype = "float64" if op in select.REDUCTIONS else None
    try:
        sched, params = planned(op, alg, p, nbytes, topology=topo, own_cpus=True, dtype=dtype)
    except ValueError:
        pytest.skip(f"{alg} does not plan {p} ranks, {nbytes} bytes")
    whole = compile_schedule(sched, params, (1, 2))
    for r in range(p):
        alone = compile_schedule(sched, params, (1, 2), only=r)
        assert np.array_equal(alone[r], whole[r])
        assert all(a is None for i, a in enumerate(alone) if i != r)


def _stamped_cases():
    """Small calls of every algorithm with inline slots of 128 bytes, so
    that roots and relays write many slots a call (up to SC_SLOTS)."""
    from shmcoll.coll import select
    for op in select.TABLE:
        for alg in select.algorithms(op):
            for p, nbytes, root in ((2, 8, 0), (5, 127, 4), (9, 100, 0), (9, 16, 3), (17, 8, 0)):
                yield op, alg, p, nbytes, root


@pytest.mark.parametrize("case", list(_stamped_cases()), ids=lambda c: "-".join(map(str, c)))
def test_a_stamped_wait_names_its_events_only_piece(case):
    """A STAMPED wait (exec.c wait_post) takes the slot's stamp for the
    writer's post: sound only if the event posts that one slot, written
    by one copy, and no other slot the writer stamps in the call lands on
    the same line (a second stamp of the call would pass for the first)."""
    from shmcoll import isa
    from shmcoll.coll import select
    from shmcoll.compile import SLOTS, compile_schedule
    from shmcoll.planning import planned
    op, alg, p, nbytes, root = case
    dtype = "int8" if op in select.REDUCTIONS else None
    try:
        sched, params = planned(op, alg, p, nbytes, root, own_cpus=True, dtype=dtype,
                                options={"inline_bytes": 128, "chan_bytes": 8192, "chunk_bytes": 1024})
    except ValueError:
        pytest.skip(f"{alg} does not plan {p} ranks, {nbytes} bytes")
    progs = compile_schedule(sched, params, (1, 2))
    slot_kinds = (isa.SPACES["SLOT"], isa.SPACES["TINY"])

    def fields(word, spec):
        return {f.name: isa.get(f, [word]) for f in spec}

    decoded = [[isa.decode(words) for words in prog[isa.HEAD:].reshape(-1, isa.INSN)] for prog in progs]
    posted, lines = [], []          # per writer: {event: [slot operands written]}, [slot lines stamped]
    for ins in decoded:
        ev, since, mine = {}, [], []
        for o, f in ins:
            if o.name == "COPY" and fields(f["dst"], isa.SPACE)["kind"] in slot_kinds:
                since.append((f["dst"], f["flags"]))
                if f["flags"] & isa.COPY_FLAGS["STAMP"]:
                    mine.append(fields(fields(f["dst"], isa.SPACE)["index"], isa.SLOT)["j"] % SLOTS)
            elif o.name == "POST":
                ev[f["event"]], since = since, []
        posted.append(ev)
        lines.append(mine)
    stamped = 0
    for ins in decoded:
        for o, f in ins:
            if o.name != "WAIT" or not f["flags"] & isa.WAIT_FLAGS["STAMPED"]:
                continue
            stamped += 1
            w, slot = f["who"], f["slot"]
            assert [d for d, _ in posted[w][f["event"]]] == [slot], (w, f)
            assert posted[w][f["event"]][0][1] & isa.COPY_FLAGS["STAMP"]
            j = fields(fields(slot, isa.SPACE)["index"], isa.SLOT)["j"]
            assert lines[w].count(j % SLOTS) == 1, (w, j, lines[w])
    if (op, alg, p) == ("allreduce", "all_at_once", 2):
        assert stamped == 2         # the test sees STAMPED waits at all
