"""Communicators made from a communicator (shmcoll/comms.py) and groups
(shmcoll/group.py): memberships and orders against Python's own sorting
and sets, collectives on them against numpy over the members, siblings and
threads running at the same time, Free, Compare, names, failures that
cross communicators, and the named fallback where /proc is refused."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import shmcoll
from conftest import cli, in_threads, run_ranks, shared_array
from shmcoll import comms
from shmcoll.comms import COMM_NULL, COMM_TYPE_SHARED, CONGRUENT, IDENT, SIMILAR, UNDEFINED, UNEQUAL, Group
from shmcoll.errors import ERR_COMM, ERR_GROUP, ERR_RANK, MPIError

pytestmark = pytest.mark.timeout(180)
RANKS = [1, 2, 3, 4, 5]


def _order(n, color, key):
    """The reference: ranks of each color, ordered by (key, rank) (MPI_Comm_split)."""
    return {c: sorted((r for r in range(n) if color(r) == c), key=lambda r: (key(r), r))
            for c in {color(r) for r in range(n)}}


def _data(world_rank, seq):
    return np.arange(5, dtype=np.float64) * (world_rank + 1) + seq


def _check(sub, members, seq):
    """Allreduce, Bcast (from every root) and Allgather on sub against numpy
    over the world ranks `members` (sub's rank order)."""
    me = members[sub.rank]
    out = np.empty(5)
    sub.Allreduce(_data(me, seq), out)
    assert np.array_equal(out, np.sum([_data(m, seq) for m in members], axis=0))
    for root in range(sub.size):
        buf = _data(me, seq) if sub.rank == root else np.zeros(5)
        sub.Bcast(buf, root)
        assert np.array_equal(buf, _data(members[root], seq))
    every = np.empty((sub.size, 5))
    sub.Allgather(_data(me, seq), every)
    assert np.array_equal(every, np.array([_data(m, seq) for m in members]))


def _splits(comm):
    n, me = comm.size, comm.rank
    out = []
    for color, key in ((lambda r: r % 2, lambda r: -r), (lambda r: r // 2, lambda r: -r)):
        want = _order(n, color, key)[color(me)]
        sub = comm.Split(color(me), key(me))
        assert (sub.rank, sub.size) == (want.index(me), len(want))
        assert sub.Get_group().members == tuple(want)
        _check(sub, want, len(out))
        # nested: the split of the split, halves by its own rank, in order
        inner_want = _order(len(want), lambda r: r // 2, lambda r: 0)[sub.rank // 2]
        inner = sub.Split(sub.rank // 2)
        inner_members = [want[r] for r in inner_want]
        assert inner.Get_group().members == tuple(inner_members)
        _check(inner, inner_members, 10 + len(out))
        inner.Free()
        sub.Free()
        out.append(want)
    return out


@pytest.mark.parametrize("n", RANKS)
def test_split_orders_members_and_runs_collectives(n):
    """Split by parity and by rank // 2, keys reversing the order: each
    rank's rank and size as MPI_Comm_split orders them, and Allreduce,
    Bcast, Allgather on it (and on a Split of it) as numpy computes them
    over its members."""
    run_ranks(_splits, n)


def _split_types(comm):
    me = comm.rank
    shared = comm.Split_type(COMM_TYPE_SHARED, key=-me)
    assert shared.Get_group().members == tuple(reversed(range(comm.size)))
    _check(shared, list(reversed(range(comm.size))), 0)
    assert comm.Split(UNDEFINED) == COMM_NULL
    assert comm.Split_type(UNDEFINED) == COMM_NULL
    odd = comm.Split(1 if me % 2 else UNDEFINED, 0)
    assert (odd == COMM_NULL) == (me % 2 == 0) and bool(odd) == (me % 2 == 1)
    return [shared.Get_name(), comm.Get_name()]


@pytest.mark.parametrize("n", [1, 3, 4])
def test_split_type_shared_and_undefined(n):
    """COMM_TYPE_SHARED: every rank (one node), ordered by key; color
    UNDEFINED: COMM_NULL; names as MPICH gives them."""
    assert run_ranks(_split_types, n) == [["", "MPI_COMM_WORLD"]] * n


def _siblings(comm, rounds):
    me, n = comm.rank, comm.size
    color = me % 2
    members = _order(n, lambda r: r % 2, lambda r: 0)[color]
    sub = comm.Split(color)
    for i in range(rounds):
        if color == 0:
            out = np.empty(64)
            sub.Allreduce(_data(me, i).repeat(13)[:64], out)
            assert np.array_equal(out, np.sum([_data(m, i).repeat(13)[:64] for m in members], axis=0))
        else:
            buf = _data(members[i % sub.size], i) if sub.rank == i % sub.size else np.zeros(5)
            sub.Bcast(buf, i % sub.size)
            assert np.array_equal(buf, _data(members[i % sub.size], i))
    comm.Barrier()
    return sub.size


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_sibling_communicators_run_different_collectives_at_once(n):
    """The even ranks loop over Allreduce while the odd ones loop over Bcast,
    each on its own communicator, at the same time."""
    assert run_ranks(_siblings, n, 200) == [len(range(r % 2, n, 2)) for r in range(n)]


def _threads(comm, rounds):
    dups = [comm.Dup(), comm.Dup()]

    def loop(t, d):
        for i in range(rounds):
            seq = 1000 * t + i
            out = np.empty(5)
            d.Allreduce(_data(d.rank, seq), out)
            assert np.array_equal(out, np.sum([_data(r, seq) for r in range(d.size)], axis=0))
            root = i % d.size
            buf = _data(root, seq) if d.rank == root else np.zeros(5)
            d.Bcast(buf, root)
            assert np.array_equal(buf, _data(root, seq))
            assert d.allgather((t, d.rank)) == [(t, r) for r in range(d.size)]
    in_threads(loop, list(enumerate(dups)))
    return [d.Compare(comm) for d in dups]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_two_threads_each_with_its_own_dup(n):
    """Each rank's two threads loop over collectives, each on its own Dup."""
    assert run_ranks(_threads, n, 100) == [[CONGRUENT, CONGRUENT]] * n


def _compare(comm):
    n, me = comm.size, comm.rank
    dup = comm.Dup()
    rev = comm.Split(0, -me)
    half = comm.Split(me % 2)
    sub = comm.Create(comm.Get_group().Incl(list(range(0, n, 2))))
    got = [comm.Compare(comm), dup.Compare(comm), rev.Compare(comm), half.Compare(comm), dup.Compare(dup),
           sub == COMM_NULL, sub.Get_group().members if sub else None, rev.Compare(dup)]
    return got


@pytest.mark.parametrize("n", RANKS)
def test_compare_and_create(n):
    """Compare by the definitions: the same object IDENT, the same ranks in
    order CONGRUENT, in another order SIMILAR, others UNEQUAL; Create of a
    group gives its members (in the group's order) and COMM_NULL elsewhere."""
    got = run_ranks(_compare, n)
    evens = tuple(range(0, n, 2))
    for r, g in enumerate(got):
        assert g[:3] == [IDENT, CONGRUENT, SIMILAR if n > 1 else CONGRUENT]
        assert g[3] == (UNEQUAL if n > 1 else CONGRUENT) and g[4] == IDENT
        assert g[5] == (r % 2 == 1) and g[6] == (evens if r % 2 == 0 else None)
        assert g[7] == (SIMILAR if n > 1 else CONGRUENT)


def _freed(comm):
    dup = comm.Dup()
    dup.Set_name("workers")
    assert dup.Get_name() == "workers"
    dup.Free()
    assert dup == COMM_NULL and not dup
    out = []
    for call in (dup.Barrier, lambda: dup.Allreduce(np.zeros(1), np.zeros(1)), dup.Dup):
        try:
            call()
        except MPIError as e:
            out.append((e.Get_error_class(), "workers" in str(e)))
    try:
        COMM_NULL.Barrier()
    except MPIError as e:
        out.append((e.Get_error_class(), "COMM_NULL" in str(e)))
    comm.Barrier()           # the world goes on
    return out


@pytest.mark.parametrize("n", [1, 3])
def test_free_then_use_raises_err_comm(n):
    """After Free, the communicator equals COMM_NULL and every call raises
    MPIError(ERR_COMM) naming it; the parent goes on."""
    assert run_ranks(_freed, n) == [[(ERR_COMM, True)] * 4] * n


def _self(comm):
    s = comms.comm_self(comm)
    out = np.empty(3)
    s.Allreduce(np.full(3, comm.rank + 1.0), out)
    got = (s.Get_name(), s.size, s.rank, s.Get_group().members, out.tolist(), s.Compare(comm))
    s.Free()
    return got


@pytest.mark.parametrize("n", [1, 2, 3])
def test_comm_self(n):
    got = run_ranks(_self, n)
    assert got == [("MPI_COMM_SELF", 1, 0, (r,), [r + 1.0] * 3, CONGRUENT if n == 1 else UNEQUAL)
                   for r in range(n)]


def test_groups_against_sets_and_lists():
    """Every Group operation against Python's lists and sets over the same ranks."""
    world = Group(range(7), me=3)
    for ranks in ([], [0], [6, 2, 4], [1, 3, 5, 0]):
        inc = world.Incl(ranks)
        assert inc.members == tuple(ranks) and inc.Get_size() == len(ranks)
        assert inc.Get_rank() == (ranks.index(3) if 3 in ranks else UNDEFINED)
        exc = world.Excl(ranks)
        assert exc.members == tuple(r for r in range(7) if r not in ranks)
        assert world.Translate_ranks(ranks, inc) == [ranks.index(r) for r in ranks]
        assert inc.Translate_ranks(None, world) == list(ranks)
        assert world.Translate_ranks(list(range(7)), inc) == [ranks.index(r) if r in ranks else UNDEFINED
                                                              for r in range(7)]
    for ranges in ([(0, 6, 2)], [(5, 1, -2), (6, 6, 1)]):
        listed = [r for f, l, s in ranges for r in range(f, l + (1 if s > 0 else -1), s)]
        assert world.Range_incl(ranges).members == tuple(listed)
        assert world.Range_excl(ranges).members == tuple(r for r in range(7) if r not in listed)
    a, b = world.Incl([5, 1, 3]), world.Incl([3, 0, 6, 1])
    assert Group.Union(a, b).members == (5, 1, 3, 0, 6)
    assert Group.Intersection(a, b).members == tuple(r for r in a.members if r in set(b.members))
    assert Group.Difference(a, b).members == tuple(r for r in a.members if r not in set(b.members))
    assert a.Compare(a.Dup()) == IDENT and a.Compare(world.Incl([1, 3, 5])) == SIMILAR
    assert a.Compare(b) == UNEQUAL and a.Dup() == a and a != b
    for bad in (lambda: world.Incl([7]), lambda: world.Excl([-1]), lambda: world.Incl([1, 1])):
        with pytest.raises(MPIError) as e:
            bad()
        assert e.value.Get_error_class() == ERR_RANK
    c = a.Dup()
    c.Free()
    assert not c and c != a and c == comms.GROUP_NULL and comms.GROUP_EMPTY.Get_size() == 0


def _killed(comm, n):
    sub = comm.Split(0, -comm.rank)          # the victim, world rank n - 1, is sub rank 0
    sub.Barrier()
    if comm.rank == n - 1:
        os.kill(os.getpid(), 9)
    t = time.monotonic()
    try:
        for _ in range(1000):
            sub.Allreduce(np.ones(4), np.empty(4))
    except shmcoll.PeerDied as e:
        return e.rank, time.monotonic() - t
    return None


@pytest.mark.parametrize("n", [2, 3, 4])
def test_rank_killed_while_others_wait_on_a_subcommunicator(n):
    """The others raise PeerDied naming the victim's rank in the
    subcommunicator within 2 s."""
    got = shared_array((n, 2), np.float64, -1.0)

    def job(comm):
        r = _killed(comm, n)
        if r is not None:
            got[comm.rank] = r
        raise RuntimeError("reported through the shared array")
    with pytest.raises(Exception):
        run_ranks(job, n, timeout=60)
    assert [int(r) for r in got[:n - 1, 0]] == [0] * (n - 1), got.tolist()
    assert 0 <= got[:n - 1, 1].max() < 2.0, got.tolist()


def _spread(comm, where):
    """Rank 0 passes a bad root on one communicator, catches it and stays;
    the others wait on another (one rank 0 never joins) and must raise."""
    dup = comm.Dup()
    bad, waited = (dup, comm) if where == "sub" else (comm, dup)
    if comm.rank == 0:
        with pytest.raises(ValueError):
            bad.Bcast(np.zeros(1), root=comm.size)
        time.sleep(4)
        return None
    t = time.monotonic()
    try:
        waited.Barrier()
    except shmcoll.PeerFailure as e:
        return e.rank, time.monotonic() - t, type(e).__name__
    return "returned"


@pytest.mark.parametrize("where", ["sub", "world"])
@pytest.mark.parametrize("n", [2, 3])
def test_failure_on_one_communicator_fails_waits_on_another(n, where):
    """A bad argument on a Dup makes the ranks waiting on the world raise
    (and one on the world those waiting on a Dup), naming rank 0, within 2 s."""
    got = shared_array((n, 2), np.float64, -1.0)

    def job(comm):
        r = _spread(comm, where)
        if isinstance(r, tuple):
            got[comm.rank] = r[:2]
        raise RuntimeError("reported through the shared array")
    with pytest.raises(Exception):
        run_ranks(job, n, timeout=60)
    assert [int(r) for r in got[1:, 0]] == [0] * (n - 1), got.tolist()
    assert 0 <= got[1:, 1].max() < 2.0, got.tolist()


def _refused(comm):
    from shmcoll.segment import Segment

    def refuse(*a):
        raise PermissionError("ptrace policy")
    Segment.open_proc = classmethod(lambda cls, *a: refuse())
    sub = comm.Split(comm.rank % 2, -comm.rank)
    members = _order(comm.size, lambda r: r % 2, lambda r: -r)[comm.rank % 2]
    _check(sub, members, 0)
    return sub.size


@pytest.mark.parametrize("n", [2, 3])
def test_named_fallback_where_proc_is_refused(n):
    """With /proc links refused, the members open a named segment of the
    job's prefix, whose name is gone at once (the autouse check)."""
    assert run_ranks(_refused, n) == [len(range(r % 2, n, 2)) for r in range(n)]


@pytest.mark.parametrize("n", [2, 3])
def test_abort_exits_shmcoll_run_with_its_errorcode(tmp_path, n):
    """Abort(7) on one rank: `shmcoll run` exits 7, as mpiexec does, and the
    others raise PeerAborted naming it instead of waiting."""
    script = tmp_path / "abort.py"
    script.write_text("import shmcoll, time\n"
                      "c = shmcoll.init()\n"
                      "d = c.Dup()\n"
                      "if c.rank == 1:\n"
                      "    d.Abort(7)\n"
                      "try:\n"
                      "    c.Barrier()\n"
                      "except shmcoll.PeerAborted as e:\n"
                      "    print('aborted by', e.rank, flush=True)\n"
                      "    raise\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(shmcoll.__file__)))
    p = subprocess.run(cli("run", "-n", str(n), "--timeout", "60", "--", sys.executable, str(script)),
                       capture_output=True, text=True, timeout=90, env=env)
    assert p.returncode == 7, (p.stdout, p.stderr)
    assert p.stdout.splitlines() == ["aborted by 1"] * (n - 1), (p.stdout, p.stderr)


MPICH = "/tmp/peer-mpich/bin"


@pytest.mark.skipif(not os.path.exists(MPICH + "/mpiexec"), reason="mpi4py with MPICH is not installed")
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_same_results_as_mpi4py_with_mpich(n):
    """Split orders, Compare, names, Split_type, Create, every Group
    operation and Translate_ranks: the same lines as mpi4py+MPICH prints."""
    script = os.path.join(os.path.dirname(__file__), "ranks", "comms_reference.py")
    ref = subprocess.run([MPICH + "/mpiexec", "-n", str(n), MPICH + "/python", script, "mpi4py"],
                         capture_output=True, text=True, timeout=120)
    assert ref.returncode == 0, ref.stderr
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(shmcoll.__file__)))
    got = subprocess.run(cli("run", "-n", str(n), "--timeout", "60", "--", sys.executable, script, "shmcoll"),
                         capture_output=True, text=True, timeout=120, env=env)
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines() == ref.stdout.splitlines() and len(ref.stdout.splitlines()) == 13 * n


def _dup_free(comm, times):
    tasks = lambda: len(os.listdir("/proc/self/task"))      # noqa: E731  (native threads too)
    comm.Dup().Free()
    before = tasks()
    for _ in range(times):
        d = comm.Dup()
        d.Barrier()
        d.Free()
    return tasks() - before


@pytest.mark.parametrize("n", [1, 3])
def test_free_ends_the_liveness_holder(n):
    """A freed communicator's liveness thread ends with it: Dup and Free in
    a loop leave as many threads as before."""
    assert run_ranks(_dup_free, n, 20) == [0] * n


def _extra_call(comm):
    dup = comm.Dup()
    dup.Barrier()
    if comm.rank == 0:
        dup.Bcast(np.zeros(4), root=0)        # a root waits on no one: read by no one
    return "done"


@pytest.mark.parametrize("n", [2, 3])
def test_calls_peers_never_made_on_a_dup_fail_at_the_end(n):
    """Communicators left unfreed are freed with the world at the rank's
    end, so a root's call that no peer made raises MismatchError there, as
    on the world."""
    with pytest.raises((shmcoll.MismatchError, shmcoll.PeerFailure)):
        run_ranks(_extra_call, n)


def _create_group(comm):
    """Evens and odds each make their communicator, called by its own ranks
    only, twice with one tag (the second a new communicator of its own);
    then a group of everyone in reverse order."""
    me, n = comm.rank, comm.size
    mine = list(range(me % 2, n, 2))
    out = []
    for seq in range(2):
        sub = comm.Create_group(comm.Get_group().Incl(mine), tag=7)
        assert sub.Get_group().members == tuple(mine) and sub.Compare(comm) == (CONGRUENT if n == 1 else UNEQUAL)
        _check(sub, mine, seq)
        out.append(sub)
    _check(out[0], mine, 5)                  # the first still works beside the second
    rev = comm.Create_group(comm.Get_group().Incl(list(reversed(range(n)))))
    _check(rev, list(reversed(range(n))), 9)
    for c in out + [rev]:
        c.Free()
    try:
        comm.Create_group(comm.Get_group().Excl([me]))
    except MPIError as e:
        return e.Get_error_class()


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_create_group_called_by_its_members_only(n):
    """Create_group by the group's ranks alone (no collective of the
    parent), two disjoint groups at once, repeated, in another order; a
    rank outside the group that calls it gets ERR_GROUP."""
    assert run_ranks(_create_group, n) == [ERR_GROUP] * n


def _create_then_leave(comm):
    """Members make their part of Create_group, then free the parent at
    once; rank 0, the creator, sees them leave the parent only after it
    last looked for their part (its look at the parent held until then)."""
    parent = comm.Dup()
    if comm.rank == 0:
        real = parent._dev.rank_state
        seen = set()

        def late(r):
            if r and r not in seen:
                seen.add(r)
                while real(r) < 2:      # until r has registered in the new one and left the parent
                    pass
            return real(r)
        parent._dev.rank_state = late
    sub = parent.Create_group(parent.Get_group())
    if comm.rank:
        parent.Free()
    out = sub.allgather(comm.rank)
    sub.Free()
    if comm.rank == 0:
        parent.Free()
    return out


def test_create_group_members_that_leave_the_parent_at_once():
    """Before: the creator raised PeerDied for a member that had done its
    part and freed the parent while the creator was still looking."""
    assert run_ranks(_create_then_leave, 3) == [[0, 1, 2]] * 3


def _full(comm):
    from shmcoll.device import Device
    if comm.rank == comm.size - 1:
        def full(*a, **k):
            raise shmcoll.SegmentError(28, "no space left in /dev/shm")
        Device.made = classmethod(full)
    t = time.monotonic()
    try:
        comm.Split(0, -comm.rank)               # the last rank is the new rank 0: it creates
    except shmcoll.ShmcollError as e:
        took = time.monotonic() - t
        if comm.rank == comm.size - 1:
            time.sleep(3)                       # caught, and lingering: only the abort tells the others
        return type(e).__name__, took


@pytest.mark.parametrize("n", [2, 3])
def test_segment_that_cannot_be_made_fails_every_rank(n):
    """The creator's SegmentError aborts the parent: the others raise
    instead of waiting in the exchange."""
    got = shared_array((n,), np.float64, -1.0)

    def job(comm):
        r = _full(comm)
        got[comm.rank] = r[1] if r else -2
        raise RuntimeError("reported through the shared array")
    with pytest.raises(Exception):
        run_ranks(job, n, timeout=60)
    assert 0 <= got.max() < 2.0 and got.min() >= 0, got.tolist()
