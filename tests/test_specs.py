"""Buffer specs mean what they mean in mpi4py (its msgbuffer.pxi): for each
collective and each spec form mpi4py accepts, at 2 and 3 ranks, with
counts smaller than the buffers, so a count read per block or in total
shows; forms mpi4py refuses raise a clear error on every rank.

The expected values follow from mpi4py's documented meaning, written out
here: a spec's items start at displ (in items of its dtype) and number
count, or count per block where the argument holds one block per rank
(Alltoall's buffers, Allgather's and a Gather root's recvbuf, a Scatter
root's sendbuf, Reduce_scatter_block's sendbuf, and its recvbuf in
place); the rest of each buffer is left as it was."""
import numpy as np
import pytest

import shmcoll
from shmcoll import MPI
from conftest import run_ranks

SENT = -1          # what every byte outside a message holds, before and after
C, D = 3, 2        # a spec's count (per block where blocks) and displacement, in items


def data(r, n):
    """Rank r's message of n int32 items."""
    return (np.arange(n, dtype=np.int64) * 7 + 1000 * (r + 1)).astype(np.int32)


# simple forms: spec(buf, count, displ, blocks) over buf's items [displ, displ + count x blocks)
SIMPLE = {
    "[buf, dtype]": lambda b, c, d, k: [b[d:d + c * k], "i"],
    "[buf, count]": lambda b, c, d, k: [b[d:], c],
    "[buf, count, dtype]": lambda b, c, d, k: [b[d:], c, "i"],
    "[buf, (count, displ)]": lambda b, c, d, k: [b, (c, d)],
    "[buf, [count, displ], dtype]": lambda b, c, d, k: [b, [c, d], "i"],
    "[buf, (count, displ), dtype]": lambda b, c, d, k: [b, (c, d), np.int32],
    "[buf, count, displ, dtype]": lambda b, c, d, k: [b, c, d, np.dtype(np.int32)],
    "[bytes, count, displ, dtype]": lambda b, c, d, k: [b.view(np.uint8), c, d, "i"],
}


def vcounts(p):
    """Unequal counts, and displacements with gaps and out of rank order."""
    counts = [r + 1 for r in range(p)]
    order = list(range(p))[::-1]
    displs, at = [0] * p, 1
    for r in order:
        displs[r], at = at, at + counts[r] + 2
    return counts, displs, at


# v-spec forms: (spec(buf, p), the counts and displacements it means)
def _even(p, n):
    counts = [n // p + (n % p > r) for r in range(p)]
    return counts, [sum(counts[:r]) for r in range(p)]


VFORMS = {
    "[buf, counts, displs, dtype]": lambda b, p: ([b, vcounts(p)[0], vcounts(p)[1], "i"], vcounts(p)[:2]),
    "[buf, (counts, displs), dtype]": lambda b, p: ([b, tuple(vcounts(p)[:2]), "i"], vcounts(p)[:2]),
    "[buf, (counts, displs)]": lambda b, p: ([b, tuple(vcounts(p)[:2])], vcounts(p)[:2]),
    "[buf, counts, dtype]": lambda b, p: ([b, vcounts(p)[0], "i"], _even_packed(vcounts(p)[0])),
    "[buf, counts]": lambda b, p: ([b, np.array(vcounts(p)[0])], _even_packed(vcounts(p)[0])),
    "[buf, count, stride, dtype]": lambda b, p: ([b, 2, 3, "i"], ([2] * p, [3 * r for r in range(p)])),
    "[buf, (count, stride), dtype]": lambda b, p: ([b, (2, 4), "i"], ([2] * p, [4 * r for r in range(p)])),
    "[buf, dtype]": lambda b, p: ([b[:2 * p + 1], "i"], _even(p, 2 * p + 1)),
}


def _even_packed(counts):
    return counts, [sum(counts[:r]) for r in range(len(counts))]


def buffer(items, logical=None, d=D):
    """A buffer with room for `items` at d and 3 more after; logical put at d."""
    b = np.full(d + items + 3, SENT, np.int32)
    if logical is not None:
        b[d:d + len(logical)] = logical
    return b


def expect(b, want, d=D):
    out = np.full(len(b), SENT, np.int32)
    out[d:d + len(want)] = want
    return out


def check(errs, what, got, want):
    if not np.array_equal(got, want):
        errs.append(f"{what}: got {got.tolist()}, want {want.tolist()}")


def _simple_job(comm, coll, inplace):
    """Every simple form of coll on this rank: a list of what differed."""
    p, r, errs = comm.size, comm.rank, []
    for form, spec in SIMPLE.items():
        where = f"{coll} {form}{' IN_PLACE' if inplace else ''} rank {r}"
        ip = shmcoll.IN_PLACE
        if coll == "Bcast":
            root = 1 % p
            b = buffer(C, data(root, C) if r == root else None)
            comm.Bcast(spec(b, C, D, 1), root)
            check(errs, where, b, expect(b, data(root, C)))
        elif coll == "Alltoall":
            s, rb = buffer(p * C, data(r, p * C)), buffer(p * C, data(r, p * C) if inplace else None)
            comm.Alltoall(ip if inplace else spec(s, C, D, p), spec(rb, C, D, p))
            check(errs, where, rb, expect(rb, np.concatenate([data(j, p * C)[r * C:(r + 1) * C] for j in range(p)])))
        elif coll == "Allgather":
            s, rb = buffer(C, data(r, C)), buffer(p * C)
            if inplace:
                rb[D + r * C:D + (r + 1) * C] = data(r, C)
            comm.Allgather(ip if inplace else spec(s, C, D, 1), spec(rb, C, D, p))
            check(errs, where, rb, expect(rb, np.concatenate([data(j, C) for j in range(p)])))
        elif coll == "Gather":
            root = p - 1
            s, rb = buffer(C, data(r, C)), buffer(p * C)
            if inplace and r == root:
                rb[D + r * C:D + (r + 1) * C] = data(r, C)
            comm.Gather(ip if inplace and r == root else spec(s, C, D, 1), spec(rb, C, D, p), root)
            want = np.concatenate([data(j, C) for j in range(p)]) if r == root else []
            check(errs, where, rb, expect(rb, want))
        elif coll == "Scatter":
            root = 0
            s, rb = buffer(p * C, data(root, p * C) if r == root else None), buffer(C)
            comm.Scatter(spec(s, C, D, p), ip if inplace and r == root else spec(rb, C, D, 1), root)
            check(errs, where, rb, expect(rb, [] if inplace and r == root else data(root, p * C)[r * C:(r + 1) * C]))
            if r == root:
                check(errs, where + " sendbuf", s, expect(s, data(root, p * C)))
        elif coll in ("Allreduce", "Reduce", "Scan", "Exscan"):
            root = 1 % p
            upto = {"Allreduce": p, "Reduce": p, "Scan": r + 1, "Exscan": r}[coll]
            s, rb = buffer(C, data(r, C)), buffer(C, data(r, C) if inplace else None)
            send = ip if inplace and (coll != "Reduce" or r == root) else spec(s, C, D, 1)
            args = (send, spec(rb, C, D, 1)) + ((shmcoll.SUM, root) if coll == "Reduce" else ())
            getattr(comm, coll)(*args)
            if coll == "Reduce" and r != root or upto == 0:
                want = rb[D:D + C] if inplace else []       # untouched
            else:
                want = sum(data(j, C).astype(np.int64) for j in range(upto)).astype(np.int32)
            check(errs, where, rb, expect(rb, want))
        elif coll == "Reduce_scatter_block":
            total = sum(data(j, p * C).astype(np.int64) for j in range(p)).astype(np.int32)
            if inplace:     # recvbuf holds all p blocks (count per block); the result lands at its start
                rb = buffer(p * C, data(r, p * C))
                comm.Reduce_scatter_block(ip, spec(rb, C, D, p))
                check(errs, where, rb[D:D + C], total[r * C:(r + 1) * C])
                check(errs, where + " outside", rb[:D], np.full(D, SENT, np.int32))
            else:
                s, rb = buffer(p * C, data(r, p * C)), buffer(C)
                comm.Reduce_scatter_block(spec(s, C, D, p), spec(rb, C, D, 1))
                check(errs, where, rb, expect(rb, total[r * C:(r + 1) * C]))
        elif coll == "Reduce_scatter":
            rc = [C + j % 2 for j in range(p)]
            n, at = sum(rc), sum(rc[:r])
            total = sum(data(j, n).astype(np.int64) for j in range(p)).astype(np.int32)
            if inplace:
                rb = buffer(n, data(r, n))
                comm.Reduce_scatter(ip, spec(rb, n, D, 1), rc)
                check(errs, where, rb[D:D + rc[r]], total[at:at + rc[r]])
            else:
                for counts in (rc, None):       # None: each rank's recvbuf count, gathered
                    s, rb = buffer(n, data(r, n)), buffer(rc[r])
                    comm.Reduce_scatter(spec(s, n, D, 1), spec(rb, rc[r], D, 1), counts)
                    check(errs, where + f" recvcounts={counts}", rb, expect(rb, total[at:at + rc[r]]))
    return errs


def _v_job(comm, coll, inplace):
    p, r, errs = comm.size, comm.rank, []
    ip = shmcoll.IN_PLACE
    for form, vspec in VFORMS.items():
        where = f"{coll} {form}{' IN_PLACE' if inplace else ''} rank {r}"
        big = np.full(vcounts(p)[2] + 3, SENT, np.int32)
        spec, (counts, displs) = vspec(big, p)
        spec = list(spec)
        c = counts[r]
        s = buffer(c, data(r, c))
        send = [s, (c, D), "i"]
        if coll == "Allgatherv":
            if inplace:
                big[displs[r]:displs[r] + c] = data(r, c)
            comm.Allgatherv(ip if inplace else send, spec)
            want = np.full(len(big), SENT, np.int32)
            for j in range(p):
                want[displs[j]:displs[j] + counts[j]] = data(j, counts[j])
            check(errs, where, big, want)
        elif coll == "Gatherv":
            root = p - 1
            if inplace and r == root:
                big[displs[r]:displs[r] + c] = data(r, c)
            comm.Gatherv(ip if inplace and r == root else send, spec, root)
            want = np.full(len(big), SENT, np.int32)
            for j in range(p if r == root else 0):
                want[displs[j]:displs[j] + counts[j]] = data(j, counts[j])
            check(errs, where, big, want)
        elif coll == "Scatterv":
            root = 0
            if r == root:
                big[:] = data(root, len(big))
            rb = buffer(c)
            comm.Scatterv(spec, ip if inplace and r == root else [rb, (c, D), "i"], root)
            piece = data(root, len(big))[displs[r]:displs[r] + c]
            check(errs, where, rb, expect(rb, [] if inplace and r == root else piece))
    return errs


def _job(comm, coll, inplace):
    return (_v_job if coll.endswith("v") else _simple_job)(comm, coll, inplace)


COLLS = ["Bcast", "Alltoall", "Allgather", "Gather", "Scatter", "Allgatherv", "Gatherv", "Scatterv", "Allreduce",
         "Reduce", "Reduce_scatter_block", "Reduce_scatter", "Scan", "Exscan"]


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("inplace", [False, True], ids=["", "in_place"])
@pytest.mark.parametrize("coll", COLLS)
def test_every_spec_form(coll, inplace, p):
    if inplace and coll == "Bcast":
        pytest.skip("Bcast has no IN_PLACE")
    got = run_ranks(_job, p, coll, inplace, timeout=60)
    assert got == [[]] * p, "\n".join(e for g in got for e in g)


def test_alltoall_count_is_per_block_as_in_the_issue():
    """The issue's case: [s, 4, "B"] at 2 ranks moves 4 bytes per rank."""
    def job(comm):
        s = (np.arange(8) + 10 * comm.rank).astype(np.uint8)
        r = np.full(8, 255, np.uint8)
        comm.Alltoall([s, 4, "B"], [r, 4, "B"])
        return r
    got = run_ranks(job, 2)
    for me in range(2):
        want = np.concatenate([(np.arange(8) + 10 * j).astype(np.uint8)[me * 4:me * 4 + 4] for j in range(2)])
        assert np.array_equal(got[me], want), (me, got[me])



def test_tuple_counts_are_counts_and_displacements_after_a_list_call():
    """[buf, (c, s), dtype] is mpi4py's (one count, one stride), never the
    counts [c, s]: after a call with the list [c, s] installed a program
    keyed by those counts, the tuple call runs its own (the C entry
    took the tuple as counts and ran the list's program on rank 0)."""
    def job(comm):
        dt = np.dtype(np.int32)
        first = np.full(7, -1, np.int32)
        comm.Allgatherv(data(comm.rank, 3 + comm.rank), [first, [3, 4], dt])
        second = np.full(7, -1, np.int32)
        comm.Allgatherv(data(comm.rank, 3), [second, (3, 4), dt])
        return first, second
    for first, second in run_ranks(job, 2):
        assert np.array_equal(first, np.concatenate([data(0, 3), data(1, 4)]))
        want = np.full(7, -1, np.int32)
        want[0:3], want[4:7] = data(0, 3), data(1, 3)
        assert np.array_equal(second, want), second

# -- forms mpi4py refuses: a clear error on every rank ------------------------------
def _refused(comm, case):
    p = comm.size
    a, b = np.zeros(4 * p, np.int32), np.zeros(4 * p, np.int32)
    calls = {
        "five_items": lambda: comm.Allreduce([a, 1, 0, "i", None], b),
        "negative_count": lambda: comm.Bcast([a, -1, "i"]),
        "negative_displ": lambda: comm.Bcast([a, 1, -1, "i"]),
        "count_past_buffer": lambda: comm.Alltoall([a, 5, "i"], [b, 5, "i"]),
        "displ_past_buffer": lambda: comm.Bcast([a, (0, 4 * p + 1), "i"]),
        "no_split": lambda: comm.Alltoall([a[:4 * p - 1], "i"], [b[:4 * p - 1], "i"]),
        "not_a_datatype": lambda: comm.Bcast([a, 2, 3.5]),
        "count_not_int": lambda: comm.Bcast([a, 2.0, "i"]),
        "dtypes_differ": lambda: comm.Allreduce([a, 2, "i"], [b, 2, "f"]),
        "counts_differ": lambda: comm.Allreduce([a, 2, "i"], [b, 3, "i"]),
        "vcounts_past_buffer": lambda: comm.Allgatherv(a[:1], [b, [1] * (p - 1) + [4 * p], "i"]),
        "vcounts_length": lambda: comm.Allgatherv(a[:1], [b, [1] * (p + 1), "i"]),
        "in_place_reduce_scatter_no_counts": lambda: comm.Reduce_scatter(shmcoll.IN_PLACE, b),
    }
    try:
        calls[case]()
    except Exception as e:
        return type(e).__name__, str(e)
    return None


REFUSED = {
    "five_items": ("ValueError", ["2 to 4 items"]),
    "negative_count": ("ValueError", ["negative count"]),
    "negative_displ": ("ValueError", ["negative displacement"]),
    "count_past_buffer": ("ValueError", ["per rank", "bytes"]),
    "displ_past_buffer": ("ValueError", ["displacement", "past"]),
    "no_split": ("ValueError", ["split", "blocks"]),
    "not_a_datatype": ("TypeError", ["datatype"]),
    "count_not_int": ("TypeError", ["count", "integer"]),
    "dtypes_differ": ("ValueError", ["dtype"]),
    "counts_differ": ("ValueError", ["recvbuf"]),
    "vcounts_past_buffer": ("ValueError", ["past the buffer"]),
    "vcounts_length": ("ValueError", ["one per rank"]),
    "in_place_reduce_scatter_no_counts": ("ValueError", ["IN_PLACE", "recvcounts"]),
}


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_forms_raise_on_every_rank(case, p):
    got = run_ranks(_refused, p, case, timeout=30)
    etype, words = REFUSED[case]
    for r, g in enumerate(got):
        assert g is not None and g[0] == etype and all(w in g[1] for w in words), (r, got)


# -- legal uses: each rank's v-layout is its own; reads may overlap; any
# contiguous memory ----------------------------------------------------------
def _local_layout(p, me):
    """Rank me's own displacements for counts r + 1: packed from a rank-
    dependent start, in an order that turns with the rank."""
    counts = [r + 1 for r in range(p)]
    displs, at = [0] * p, me + 1
    for r in sorted(range(p), key=lambda r: (r - me) % p):
        displs[r], at = at, at + counts[r] + me % 2
    return counts, displs, at


def _expect(p, me, counts, displs, size, what):
    want = np.full(size, SENT, np.int32)
    for r in range(p):
        want[displs[r]:displs[r] + counts[r]] = what(r)
    return want


@pytest.mark.parametrize("p", [2, 3, 4])
def test_allgatherv_displacements_differ_from_rank_to_rank(p):
    """MPI: recvcounts must agree, displs are each rank's own layout."""
    def job(comm):
        out = []
        for seq, alg_bytes in enumerate([1, 30000]):       # inline-sized and single-copy-sized pieces
            counts, displs, size = _local_layout(comm.size, comm.rank)
            counts = [c * alg_bytes for c in counts]
            displs = [d * alg_bytes for d in displs]
            size *= alg_bytes
            for _ in range(2):                                # the Python path, then the C entry
                recv = np.full(size, SENT, np.int32)
                comm.Allgatherv(data(comm.rank, counts[comm.rank]), [recv, (counts, displs), "i"])
                out.append(np.array_equal(recv, _expect(comm.size, comm.rank, counts, displs, size,
                                                        lambda r: data(r, counts[r]))))
        return out
    assert run_ranks(job, p, timeout=60) == [[True] * 4] * p


@pytest.mark.parametrize("p", [2, 3])
def test_gatherv_root_layout_with_other_ranks_passing_their_own(p):
    """Only the root's recvbuf counts; the others may pass specs of their
    own layouts (not read, as in mpi4py)."""
    def job(comm):
        res = []
        for root in range(comm.size):
            counts, displs, size = _local_layout(comm.size, comm.rank)
            recv = np.full(size, SENT, np.int32)
            comm.Gatherv(data(comm.rank, counts[comm.rank]), [recv, (counts, displs), "i"], root)
            if comm.rank == root:
                res.append(np.array_equal(recv, _expect(comm.size, root, counts, displs, size,
                                                        lambda r: data(r, counts[r]))))
        return res
    assert run_ranks(job, p, timeout=60) == [[True]] * p


@pytest.mark.parametrize("p", [2, 3, 4])
def test_scatterv_overlapping_send_ranges(p):
    """A Scatterv root's sendbuf ranges may overlap (they are only read)."""
    def job(comm):
        src = data(9, 8)
        counts = [r % 3 + 2 for r in range(comm.size)]
        displs = [r % 2 for r in range(comm.size)]          # all start within the first two items
        recv = np.full(counts[comm.rank], SENT, np.int32)
        comm.Scatterv([src, (counts, displs), "i"] if comm.rank == 0 else None, recv, 0)
        d = displs[comm.rank]
        return np.array_equal(recv, src[d:d + counts[comm.rank]])
    assert run_ranks(job, p, timeout=30) == [True] * p


def test_overlapping_receive_ranges_still_refused():
    def job(comm):
        recv = np.zeros(8, np.int32)
        try:
            comm.Allgatherv(data(comm.rank, 2), [recv, ([2, 2], [0, 1]), "i"])
        except ValueError as e:
            return str(e)
    assert all("overlap" in m for m in run_ranks(job, 2, timeout=30))


@pytest.mark.parametrize("p", [1, 2, 3])
def test_fortran_ordered_arrays(p):
    """F-contiguous arrays are contiguous memory: plain and in specs, sent
    and received, their bytes in memory order (mpi4py's)."""
    def job(comm):
        n = comm.size
        a = np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4) + comm.rank)
        b = np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)) if comm.rank == 0 else \
            np.zeros((3, 4), order="F")
        comm.Bcast(b, 0)
        ok = [np.array_equal(b, np.arange(12, dtype=np.float64).reshape(3, 4))]
        g = np.zeros((n, 3, 4), order="F")
        comm.Allgather([a, "d"], [g, "d"])
        flat = g.ravel(order="K").reshape(n, 12)
        ok.append(all(np.array_equal(flat[r], (np.arange(12).reshape(3, 4) + r).ravel(order="F"))
                      for r in range(n)))
        s = np.zeros((3, 4), order="F")
        comm.Allreduce(a, s)
        ok.append(np.allclose(s, sum(np.arange(12).reshape(3, 4) + r for r in range(n))))
        return ok
    assert run_ranks(job, p, timeout=30) == [[True] * 3] * p


def test_non_contiguous_arrays_raise_naming_contiguity():
    def job(comm):
        try:
            comm.Bcast(np.zeros((4, 4))[:, 1])
        except ValueError as e:
            return str(e)
    assert "contiguous" in run_ranks(job, 1, timeout=30)[0]


# -- the C entries take the common spec forms: the same results as plain
# arrays, and no Python frame of shmcoll's on a warm call ----------------------
class MPIType:
    """An MPI datatype as shmcoll.MPI's (duck typed: .base, .count, Get_size)."""
    def __init__(self, base, count=1):
        self.base, self.count = np.dtype(base), count

    def Get_size(self):
        return self.base.itemsize * self.count


INT = MPIType(np.int32)
FAST_FORMS = {      # spec(buf, count, displ) over items [displ, displ + count x blocks)
    "[buf, MPI]": lambda b, c, d: [b[d:], INT],
    "[buf, char]": lambda b, c, d: [b[d:], "i"],
    "[buf, scalar type]": lambda b, c, d: [b[d:], np.int32],
    "[buf, count, MPI]": lambda b, c, d: [b[d:], c, INT],
    "[buf, count, displ, MPI]": lambda b, c, d: [b, c, d, INT],
    "[buf, (count, displ), dtype]": lambda b, c, d: [b, (c, d), b.dtype],
    "[buf, count]": lambda b, c, d: [b[d:], c],
}
FAST_COLLS = {      # (blocks of sendbuf, of recvbuf: 0 none, 1 one, p one per rank), call
    "Bcast": (1, 0, lambda comm, s, r: comm.Bcast(s, 1 % comm.size)),
    "Allreduce": (1, 1, lambda comm, s, r: comm.Allreduce(s, r)),
    "Alltoall": ("p", "p", lambda comm, s, r: comm.Alltoall(s, r)),
    "Allgather": (1, "p", lambda comm, s, r: comm.Allgather(s, r)),
    "Reduce_scatter_block": ("p", 1, lambda comm, s, r: comm.Reduce_scatter_block(s, r)),
    "Scan": (1, 1, lambda comm, s, r: comm.Scan(s, r)),
    "Gather": (1, "p", lambda comm, s, r: comm.Gather(s, r, 1 % comm.size)),       # recvbuf read on the root only
    "Scatter": ("p", 1, lambda comm, s, r: comm.Scatter(s, r, 1 % comm.size)),
    "Reduce": (1, 1, lambda comm, s, r: comm.Reduce(s, r, root=1 % comm.size)),
}


def _python_frames(fn):
    """fn(), and the Python functions of shmcoll that ran in it."""
    import sys
    seen = []

    def prof(frame, event, arg):
        if event == "call" and "shmcoll" in frame.f_code.co_filename:
            seen.append(frame.f_code.co_name)
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def _fast(comm, coll, form):
    """(spec and plain results equal, shmcoll's Python functions the spec
    call ran) for three calls of each."""
    p = comm.size
    sblocks, rblocks, call = FAST_COLLS[coll]
    ks = [p if x == "p" else x for x in (sblocks, rblocks)]
    spare = 2 if "count" in form else 0     # without a count the spec spans the buffer past displ
    out = []
    for _ in range(3):
        bufs = [np.full(D + C * k + spare, SENT, np.int32) if k else None for k in ks]
        bufs[0][D:D + C * ks[0]] = data(comm.rank, C * ks[0])
        plain = [b.copy() if k else None for b, k in zip(bufs, ks)]
        call(comm, *[b[D:D + C * k] if k else None for b, k in zip(plain, ks)])
        specs = [FAST_FORMS[form](b, C, D) if k else None for b, k in zip(bufs, ks)]
        frames = _python_frames(lambda: call(comm, *specs))
        out.append((all(k == 0 or np.array_equal(b, q) for b, q, k in zip(bufs, plain, ks)), frames))
    return out


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("form", list(FAST_FORMS))
@pytest.mark.parametrize("coll", list(FAST_COLLS))
def test_common_specs_take_the_c_entry(coll, form, p):
    """A spec call gives what the plain call on its slice gives; warm, it
    runs no Python function of shmcoll's (the C entry parsed it)."""
    for r, runs in enumerate(run_ranks(_fast, p, coll, form, timeout=60)):
        assert all(same for same, _ in runs), (r, runs)
        assert runs[-1][1] == [], (r, runs[-1][1])


VFAST_FORMS = {
    "[buf, (counts, displs), MPI.INT]": lambda b, c, d: [b, (c, d), MPI.INT],
    "[buf, (counts, displs)]": lambda b, c, d: [b, (c, d)],
    "[buf, counts, displs, MPI.INT]": lambda b, c, d: [b, c, d, MPI.INT],
}


def _vfast(comm, form):
    """(Allgatherv's result, shmcoll's Python functions its warm call ran),
    the recvbuf laid out by vcounts (gaps, out of rank order)."""
    counts, displs, items = vcounts(comm.size)
    out = []
    for _ in range(3):
        recv = np.full(items, SENT, np.int32)
        spec = VFAST_FORMS[form](recv, counts, displs)
        frames = _python_frames(lambda: comm.Allgatherv(data(comm.rank, counts[comm.rank]), spec))
        out.append((recv, frames))
    return out


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("form", list(VFAST_FORMS))
def test_vector_specs_take_the_c_entry(form, p):
    """mpi4py's v-specs with displacements, (counts, displs) among them, run
    in the C entry once warm, with what numpy places at each displacement."""
    counts, displs, items = vcounts(p)
    want = np.full(items, SENT, np.int32)
    for q in range(p):
        want[displs[q]:displs[q] + counts[q]] = data(q, counts[q])
    for r, runs in enumerate(run_ranks(_vfast, p, form, timeout=60)):
        assert all(np.array_equal(recv, want) for recv, _ in runs), (r, runs)
        assert runs[-1][1] == [], (r, runs[-1][1])


def _rooted_fast(comm, form):
    """(the root's Gatherv recvbuf, Scatterv's recvbuf, the Python
    functions of shmcoll's the warm calls ran), the root's buffer laid out
    by vcounts (gaps, out of rank order)."""
    counts, displs, items = vcounts(comm.size)
    root, out = comm.size - 1, []
    full = np.full(items, SENT, np.int32)
    for q in range(comm.size):
        full[displs[q]:displs[q] + counts[q]] = data(q, counts[q])
    for _ in range(3):
        recv = np.full(items, SENT, np.int32)
        spec = VFAST_FORMS[form](recv, counts, displs) if comm.rank == root else None
        mine = np.full(counts[comm.rank], SENT, np.int32)
        frames = _python_frames(lambda: comm.Gatherv(data(comm.rank, counts[comm.rank]), spec, root))
        frames += _python_frames(lambda: comm.Scatterv(VFAST_FORMS[form](full, counts, displs)
                                                       if comm.rank == root else None, mine, root))
        out.append((recv if comm.rank == root else None, mine, frames))
    return out


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("form", list(VFAST_FORMS))
def test_gatherv_scatterv_specs_take_the_c_entry(form, p):
    """The automatic Gatherv/Scatterv of mpi4py's v-specs, warm, run in
    their C entry (point-to-point; the first call compiles the arrival
    program), with numpy's placement."""
    counts, displs, items = vcounts(p)
    want = np.full(items, SENT, np.int32)
    for q in range(p):
        want[displs[q]:displs[q] + counts[q]] = data(q, counts[q])
    for r, runs in enumerate(run_ranks(_rooted_fast, p, form, timeout=60)):
        for i, (gathered, mine, frames) in enumerate(runs):
            assert np.array_equal(mine, data(r, counts[r])) and (i == 0 or frames == []), (r, mine, frames)
            assert (gathered is None) == (r != p - 1) and (gathered is None or np.array_equal(gathered, want))


@pytest.mark.parametrize("p", [1, 2, 3])
def test_contiguous_mpi_datatypes(p):
    """An MPI datatype of n items (Create_contiguous) counts n base items
    per item, displacements too; reductions fold the base elementwise."""
    PAIR, TRIPLE = MPIType(np.int32, 2), MPIType(np.int32, 3)

    def job(comm):
        a = np.arange(12, dtype=np.int32) + comm.rank
        b = np.full(12, SENT, np.int32)
        comm.Allreduce([a, 2, 1, PAIR], [b, (2, 1), PAIR])
        c = np.arange(12, dtype=np.int32) + comm.rank
        comm.Bcast([c, (1, 2), TRIPLE], 0)
        g = np.full(2 * comm.size + 2, SENT, np.int32)
        comm.Allgatherv(data(comm.rank, 2), [g, ([1] * comm.size, None), PAIR])
        return b, c, g
    for r, (b, c, g) in enumerate(run_ranks(job, p, timeout=30)):
        want = np.full(12, SENT, np.int32)
        want[2:6] = sum(np.arange(2, 6) + q for q in range(p))
        assert np.array_equal(b, want)
        want = np.arange(12, dtype=np.int32) + r
        want[6:9] = np.arange(6, 9)
        assert np.array_equal(c, want)
        assert np.array_equal(g[:2 * p], np.concatenate([data(q, 2) for q in range(p)])) and (g[2 * p:] == SENT).all()


def test_non_contiguous_datatype_refused():
    class Strided(MPIType):
        def Get_size(self):
            return 2 * self.base.itemsize * self.count

    def job(comm):
        try:
            comm.Bcast([np.zeros(8, np.int32), 1, Strided(np.int32, 2)])
        except TypeError as e:
            return str(e)
    assert "not contiguous" in run_ranks(job, 1, timeout=30)[0]


BYTE = MPIType(np.uint8)


def _bytes_specs(comm, kind):
    """osu_*.py's specs: [buf, size, MPI.BYTE] over an mmap (or over an
    int32 array: its bytes); results against numpy uint8 arrays."""
    import mmap
    p, n = comm.size, 12
    out = []
    for _ in range(3):
        if kind == "mmap":
            s, r = mmap.mmap(-1, n * p), mmap.mmap(-1, n * p)
        else:
            s, r = np.zeros(n * p // 4, np.int32), np.zeros(n * p // 4, np.int32)
        sv, rv = np.frombuffer(s, np.uint8), np.frombuffer(r, np.uint8)
        sv[:] = np.arange(n * p, dtype=np.uint8) + 16 * comm.rank
        ps, pr = sv.copy(), rv.copy()
        steps = [(lambda a, b: comm.Bcast(a[:n], 1 % p), lambda: comm.Bcast([s, n, BYTE], 1 % p)),
                 (lambda a, b: comm.Alltoall(a, b), lambda: comm.Alltoall([s, n, BYTE], [r, n, BYTE])),
                 (lambda a, b: comm.Allgather(a[:n], b), lambda: comm.Allgather([s, n, BYTE], [r, n, BYTE])),
                 (lambda a, b: comm.Gather(a[:n], b, 0), lambda: comm.Gather([s, n, BYTE], [r, n, BYTE], 0))]
        frames = []
        for plain, spec_call in steps:
            plain(ps, pr)
            frames += _python_frames(spec_call)
        out.append((np.array_equal(sv, ps) and np.array_equal(rv, pr), frames))
    return out


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("kind", ["mmap", "int32 array"])
def test_byte_specs_over_any_buffer_take_the_c_entry(kind, p):
    for r, runs in enumerate(run_ranks(_bytes_specs, p, kind, timeout=60)):
        assert all(same for same, _ in runs), (r, runs)
        assert runs[-1][1] == [], (r, runs[-1][1])


def _none_is_in_place(comm):
    """mpi4py reads a None sendbuf (a Scatter root's None recvbuf) as IN_PLACE."""
    p, r = comm.size, comm.rank
    got = {}
    b = np.full(p, -1.0)
    b[r] = r + 10
    comm.Allgather(None, b)
    got["allgather"] = b.tolist() == [s + 10.0 for s in range(p)]
    b = np.full(3, r + 1.0)
    comm.Allreduce(None, b)
    got["allreduce"] = (b == sum(range(1, p + 1))).all()
    b = np.arange(p, dtype=np.float64) + 100 * r
    comm.Alltoall(None, b)
    got["alltoall"] = b.tolist() == [100.0 * s + r for s in range(p)]
    b = np.full(2, r + 1.0)
    comm.Reduce(None if r == 0 else b, b if r == 0 else None, root=0)
    got["reduce"] = r != 0 or (b == sum(range(1, p + 1))).all()
    b = np.arange(p, dtype=np.float64) * 10
    x = np.empty(1)
    comm.Scatter(b if r == 0 else None, None if r == 0 else x, root=0)
    got["scatter"] = (b[0] == 0.0) if r == 0 else x[0] == 10.0 * r
    return {k: bool(v) for k, v in got.items()}


@pytest.mark.parametrize("n", [1, 2, 3])
def test_none_sendbuf_is_in_place_as_in_mpi4py(n):
    got = run_ranks(_none_is_in_place, n)
    assert all(all(g.values()) for g in got), got


@pytest.mark.parametrize("p", [2, 3])
def test_counts_of_any_sequence_and_a_0d_count(p):
    """Counts and displacements as array.array (mpi4py's osu_alltoallv) or
    any sequence; a 0-d numpy array is one count for every rank."""
    import array

    def job(comm):
        n, r = comm.size, comm.rank
        counts, displs = array.array("i", [2] * n), array.array("i", [3 * q for q in range(n)])
        send = np.repeat(data(r, 2)[None], n, 0).reshape(-1)
        recv = np.full(3 * n, SENT, np.int32)
        comm.Alltoallv([send, [2] * n, MPI.INT],
                       [recv, (counts, displs), MPI.INT])
        g = np.full(2 * n, SENT, np.int32)
        comm.Allgatherv(data(r, 2), [g, np.array(2), MPI.INT])
        return recv, g
    for r, (recv, g) in enumerate(run_ranks(job, p, timeout=30)):
        for q in range(p):
            assert np.array_equal(recv[3 * q:3 * q + 2], data(q, 2)) and recv[3 * q + 2] == SENT
        assert np.array_equal(g, np.concatenate([data(q, 2) for q in range(p)]))


def _inplace_fast(comm, coll, spec):
    """IN_PLACE Allgather / Gather / Scatter (root: rank 1 % p), the own
    block rewritten before each of 3 calls: (results, the Python functions
    of shmcoll's each call ran)."""
    p, r, c = comm.size, comm.rank, 3
    root = 1 % p
    out = []
    for k in range(3):
        recv = np.full(c * p, SENT, np.int32)
        mine = data(r, c) + k
        recv[r * c:(r + 1) * c] = mine
        rspec = [recv, c, MPI.INT] if spec else recv
        if coll == "Scatter":
            src = np.concatenate([data(q, c) + k for q in range(p)]) if r == root else None
            got = np.full(c, SENT, np.int32)
            if r == root:
                frames = _python_frames(lambda: comm.Scatter([src, c, MPI.INT] if spec else src, MPI.IN_PLACE, root))
                got = src[r * c:(r + 1) * c]        # the root's block stays in sendbuf
            else:
                frames = _python_frames(lambda: comm.Scatter(None, [got, MPI.INT] if spec else got, root))
            out.append((got, frames))
            continue
        if coll == "Allgather":
            frames = _python_frames(lambda: comm.Allgather(MPI.IN_PLACE, rspec))
        elif r == root:
            frames = _python_frames(lambda: comm.Gather(MPI.IN_PLACE, rspec, root))
        else:
            frames = _python_frames(lambda: comm.Gather([mine, MPI.INT] if spec else mine, None, root))
        out.append((recv if coll == "Allgather" or r == root else None, frames))
    return out


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("spec", [False, True])
@pytest.mark.parametrize("coll", ["Allgather", "Gather", "Scatter"])
def test_in_place_block_calls_take_the_c_entry(coll, spec, p):
    """mpi4py's osu_allgather/osu_gather/osu_scatter: IN_PLACE with this
    rank's (the root's) block already in place gives numpy's concatenation
    (Scatter: each rank its block) and, warm, runs in C."""
    for r, runs in enumerate(run_ranks(_inplace_fast, p, coll, spec, timeout=60)):
        for k, (recv, _) in enumerate(runs):
            if coll == "Scatter":
                assert np.array_equal(recv, data(r, 3) + k), (r, k, recv)
            elif recv is not None:
                assert np.array_equal(recv, np.concatenate([data(q, 3) + k for q in range(p)])), (r, k, recv)
        assert runs[-1][1] == [], (r, runs[-1][1])


@pytest.mark.parametrize("p", [1, 2])
def test_in_place_scatter_of_a_read_only_sendbuf(p):
    """The root's block is not copied onto a read-only sendbuf (the C
    entry would write it in place): the call still scatters."""
    def job(comm):
        src = np.concatenate([data(q, 3) for q in range(comm.size)])
        src.flags.writeable = False
        got = np.full(3, SENT, np.int32)
        for _ in range(3):
            if comm.rank == 0:
                comm.Scatter(src, MPI.IN_PLACE, 0)
            else:
                comm.Scatter(None, got, 0)
        return got
    for r, got in enumerate(run_ranks(job, p, timeout=30)):
        assert r == 0 or np.array_equal(got, data(r, 3))
