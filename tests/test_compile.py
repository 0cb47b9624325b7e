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
