"""shmcoll.from_mpi under real mpiexec: MPICH's and Open MPI's, each from
a virtualenv that holds an MPI wheel and mpi4py and sees this shmcoll
(`python3 -m venv --system-site-packages DIR && DIR/bin/pip install mpich
mpi4py`; .ci/mpi_envs.sh makes them).  SHMCOLL_TEST_MPI lists those
directories, comma-separated; without it these tests skip.  Nodes are
virtual (SHMCOLL_VIRTUAL_NODES), so one machine runs 2+2, 3+1, 2+1."""
import os
import subprocess
import sys
import time

import pytest

from shmcoll.multinode import virtual_nodes

PROGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_progs")
ENVS = [d for d in os.environ.get("SHMCOLL_TEST_MPI", "").split(",") if d.strip()]


def _library(env):
    out = subprocess.run([os.path.join(env, "bin", "python"), "-c",
                          "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
                          "print(MPI.Get_library_version().split()[0])"],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip() if out.returncode == 0 else None


LIBS = {env: _library(env) for env in ENVS}


def mpiexec(env, n, prog, *args, nodes="", timeout=120, flags=(), extra=None):
    """Run prog on n ranks of env's mpiexec; (returncode, output, seconds).
    MPICH leaves its own /dev/shm/mpich_shm_* behind when a rank is killed
    (under plain MPI too): those this run made are removed."""
    before = set(os.listdir("/dev/shm"))
    var = dict(os.environ, SHMCOLL_VIRTUAL_NODES=nodes, OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1", **(extra or {}))
    launcher = [os.path.join(env, "bin", "mpiexec")]
    if LIBS[env] == "Open":
        launcher += ["--oversubscribe", "-x", "SHMCOLL_VIRTUAL_NODES"]
    cmd = launcher + list(flags) + ["-n", str(n), os.path.join(env, "bin", "python"),
                                    os.path.join(PROGS, prog)] + [str(a) for a in args]
    if LIBS[env] == "Open":
        for name in extra or ():
            cmd[1:1] = ["-x", name]
    t0 = time.monotonic()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=var, cwd=PROGS)
    finally:
        for name in set(os.listdir("/dev/shm")) - before:
            if name.startswith("mpich_shm_"):
                os.unlink(os.path.join("/dev/shm", name))
    return out.returncode, out.stdout + out.stderr, time.monotonic() - t0


def envs():
    if not ENVS:
        return [pytest.param(None, marks=pytest.mark.skip(reason="SHMCOLL_TEST_MPI names no MPI virtualenv"))]
    return [pytest.param(e, id=os.path.basename(e.rstrip("/")),
                         marks=[pytest.mark.skipif(LIBS[e] is None, reason=f"no mpi4py in {e}")]) for e in ENVS]


def test_virtual_nodes_parse():
    assert virtual_nodes(4, {"SHMCOLL_VIRTUAL_NODES": "3,1"}) == [3, 1]
    assert virtual_nodes(4, {}) is None
    for bad in ("2,3", "4,0", "two,2"):
        with pytest.raises(ValueError, match="SHMCOLL_VIRTUAL_NODES"):
            virtual_nodes(4, {"SHMCOLL_VIRTUAL_NODES": bad})


@pytest.mark.parametrize("env", envs())
@pytest.mark.parametrize("nodes,n", [("2,2", 4), ("3,1", 4), ("1,2", 3), ("2,2,2", 6), ("1,1,1,1", 4), ("", 3)])
def test_collectives_match_mpi(env, nodes, n):
    """Every hierarchical collective gives MPI's own result, on every rank."""
    rc, out, _ = mpiexec(env, n, "hier_collectives.py", "0,1,7,1000,70000", nodes=nodes, timeout=300)
    assert rc == 0, out[-3000:]
    counts = [line.split()[1:] for line in out.splitlines() if line.startswith("ok ")]
    assert len(counts) == 1 and len(counts[0]) == n and len(set(counts[0])) == 1, out[-3000:]


@pytest.mark.parametrize("env", envs())
@pytest.mark.parametrize("nodes,n", [("2,2", 4), ("1,2", 3)])
def test_large_calls_in_pieces_match_mpi(env, nodes, n):
    """A Bcast, Reduce or Allreduce from twice hier.PIECE runs its legs
    piece by piece (here pieces of 1000 bytes, of the node's rank count's
    multiple of items where the node's ranks share the MPI leg, the last
    the rest): MPI's results."""
    rc, out, _ = mpiexec(env, n, "hier_collectives.py", "1,7,1000,70000", 0, 1000, nodes=nodes, timeout=300)
    assert rc == 0, out[-3000:]
    counts = [line.split()[1:] for line in out.splitlines() if line.startswith("ok ")]
    assert len(counts) == 1 and len(counts[0]) == n and len(set(counts[0])) == 1, out[-3000:]


@pytest.mark.parametrize("env", envs())
@pytest.mark.parametrize("nodes,n", [("2,2", 4), ("3,1", 4)])
def test_small_collectives_from_c_match_mpi(env, nodes, n):
    """MPI's own call reached from C (csrc/mpiflat.c: every size below
    FLAT_BELOW, here all): MPI's results for every collective, dtype,
    root, op, IN_PLACE and None, and none of the plain arrays' calls went
    through Python."""
    rc, out, _ = mpiexec(env, n, "hier_collectives.py", "0,1,7,1000,70000", 1 << 30, nodes=nodes, timeout=300)
    assert rc == 0, out[-3000:]
    counts = [line.split()[1:] for line in out.splitlines() if line.startswith("ok ")]
    assert len(counts) == 1 and len(counts[0]) == n and len(set(counts[0])) == 1, out[-3000:]


@pytest.mark.parametrize("env", envs())
def test_nodes_that_interleave_the_ranks(env):
    """A communicator whose ranks interleave the nodes: the up level would
    put the nodes out of order (a Bcast from the wrong root), so it is not
    used; every collective still gives MPI's result."""
    rc, out, _ = mpiexec(env, 4, "hier_permuted.py", nodes="2,2")
    assert rc == 0 and "ok " in out, out[-3000:]


@pytest.mark.parametrize("env", envs())
def test_user_messages_never_match_the_legs(env):
    """The legs' point-to-point (Gather, Scatter) is on a communicator of
    its own: a user's message in flight across a collective, or a receive
    from any source posted before it, is the user's, as under MPI."""
    rc, out, _ = mpiexec(env, 4, "hier_p2p.py", nodes="2,2", timeout=60)
    assert rc == 0 and "ok" in out.split(), out[-3000:]


@pytest.mark.parametrize("env", envs())
@pytest.mark.parametrize("nodes", ["2,2", "3,1"])
def test_face_point_to_point_within_a_node_is_shmcolls(env, nodes):
    """Under `from shmcoll import MPI`, node-mates' messages go through
    shmcoll (MPI's own probe never sees them), others' through MPI, and
    together they keep MPI's rules: receives from any source in posting
    order across both, no overtaking, derived datatypes as MPI delivers
    them, a truncated receive raising MPI's error with the communicator
    going on, and a rank waiting on one transport letting the other's
    large message move (tests/mpi_progs/face_p2p.py)."""
    rc, out, _ = mpiexec(env, 4, "face_p2p.py", nodes=nodes, timeout=90)
    assert rc == 0 and "ok" in out.split(), out[-3000:]


@pytest.mark.parametrize("env", envs())
@pytest.mark.parametrize("nodes,split,undefined,dup_of_split", [
    ("2,2", [[1, 1]] * 4, [None, [1, 2], [1, 2], [1, 2]], [[2, 1], [2, 1], [2, 1], [1]]),
    ("3,1", [[2], [1, 1], [2], [1, 1]], [None, [2, 1], [2, 1], [2, 1]], [[3], [3], [3], [1]])])
def test_communicators_made_from_the_face_world_are_hierarchical(env, nodes, split, undefined, dup_of_split):
    """Under `from shmcoll import MPI`, COMM_WORLD's Dup, Clone, Split,
    Split_type, Create and Create_group (and a Dup of a Split) are
    hierarchical over the nodes their ranks are on, give MPI's results,
    and Free as MPI's do (they were MPI's own, every collective flat)."""
    rc, out, _ = mpiexec(env, 4, "hier_comms.py", nodes=nodes, extra={"SHMCOLL_FLAT_BELOW": "0"}, timeout=180)
    assert rc == 0, out[-3000:]
    line = [x for x in out.splitlines() if x.startswith("ok ")]
    assert line, out[-3000:]
    seen = eval(line[0][3:])
    whole = [int(x) for x in nodes.split(",")]
    for rank, got in enumerate(seen):
        assert got["Dup"] == got["Clone"] == got["Split_type"] == whole, got
        assert (got["Split"], got["Split_undefined"], got["Dup_of_Split"]) == \
            (split[rank], undefined[rank], dup_of_split[rank]), (rank, got)
        assert got["Create"] == (split[rank] if rank % 2 == 0 else None), (rank, got)
        assert got.get("Create_group") == (split[rank] if rank % 2 == 0 else None), (rank, got)


@pytest.mark.parametrize("env", envs())
def test_a_node_that_cannot_make_its_memory_fails_the_dup_everywhere(env):
    rc, out, _ = mpiexec(env, 4, "hier_dupfail.py", nodes="2,2", timeout=90)
    assert rc == 0 and "ok" in out.split(), out[-3000:]


@pytest.mark.parametrize("env", envs())
def test_what_mpi_refuses_is_refused_on_every_rank(env):
    """A dtype the MPI legs cannot carry (a struct, void or unicode array),
    a root that names no rank, an op the dtype has not, send and receive
    buffers that disagree: the call is MPI's
    own, which raises MPI's exception on every rank and leaves the
    communicator usable (the legs raised on some ranks only, or from inside
    a node leg, and hung or ended the job); MPI's pair types and WCHAR in a
    spec give MPI's result."""
    for flat in (0, 1 << 30):           # the legs; MPI's own from C
        rc, out, _ = mpiexec(env, 4, "hier_refusals.py", flat, nodes="2,2", timeout=90)
        assert rc == 0 and "ok" in out.split(), (flat, out[-3000:])


@pytest.mark.parametrize("env", envs())
def test_what_mpi4py_refuses_on_some_ranks_raises_there(env):
    """Under the hierarchical world, a Gather or Scatter root's buffer of
    no whole blocks and a Reduce_scatter recvbuf of another count than
    its rank's raise mpi4py's ValueError on those ranks (the legs took
    them), before any leg; a strided buffer raises mpi4py's BufferError
    (it was ValueError); the world goes on."""
    for case in ("gather", "scatter", "reduce_scatter", "strided", "strided recvbuf"):
        rc, out, _ = mpiexec(env, 4, "hier_mpi4py_errors.py", case, nodes="2,2", extra={"SHMCOLL_FLAT_BELOW": "0"},
                             timeout=90)
        assert rc == 0 and sorted(x for x in out.split("\n") if x.startswith("ok ")) == [f"ok {r}" for r in range(4)], \
            (case, out[-3000:])


@pytest.mark.parametrize("env", envs())
def test_init_gives_the_virtual_node(env):
    """shmcoll.init() under mpiexec takes SHMCOLL_VIRTUAL_NODES as from_mpi
    does: 3+1 gives a communicator of 3 and one of 1, and says the job
    spans nodes."""
    rc, out, _ = mpiexec(env, 4, "init_virtual.py", nodes="3,1")
    assert rc == 0, out[-3000:]
    line = [x for x in out.splitlines() if x.startswith("init ")]
    assert line and eval(line[0][5:]) == [(3, 0, 6, True), (3, 1, 6, True), (3, 2, 6, True), (1, 0, 4, True)], out


EXAMPLES = os.path.join(os.path.dirname(PROGS), "..", "examples")


@pytest.mark.parametrize("env", envs())
@pytest.mark.parametrize("n,nodes,how", [(2, "1,1", ""), (4, "2,2", ""), (4, "2,2", "mixed"), (3, "2,1", "mixed")])
def test_flat_rows_follow_the_machine(env, n, nodes, how):
    """Where some machine's ranks outnumber its CPUs (4 ranks here on 2, or
    half the ranks made to say so: machines that differ) a call is MPI's
    own below FLAT_BELOW's row; where each has a CPU of its own, below
    that row with OWN_CPUS's changes.  Every rank, and a Dup and a Split,
    choose alike (they differed: a hang)."""
    from shmcoll.multinode.hier import FLAT_BELOW, OWN_CPUS
    rc, out, _ = mpiexec(env, n, "flat_rows.py", *([how] if how else []), nodes=nodes)
    assert rc == 0, out[-3000:]
    line = [x for x in out.splitlines() if x.startswith("rows ")]
    assert line, out[-3000:]
    name = "Open MPI" if LIBS[env] == "Open" else "MPICH"
    want = dict(FLAT_BELOW[name])
    if n <= len(os.sched_getaffinity(0)) and not how:
        want.update(OWN_CPUS[name])
    assert line[0] == f"rows {(want, want, want)!r} agree sum"


@pytest.mark.parametrize("env", envs())
def test_flat_below_is_checked_and_kept(env):
    """from_mpi(flat_below=) takes bytes (an int or numpy integer) or a dict
    of them by collective, refuses anything else before it makes anything,
    and keeps a copy of a dict (a later change to the caller's does not
    reach the communicator or those made from it)."""
    rc, out, _ = mpiexec(env, 2, "flat_rows.py", "args", nodes="1,1")
    assert rc == 0, out[-3000:]
    assert "refused 9 kept" in out, out[-3000:]


@pytest.mark.parametrize("env", envs())
@pytest.mark.parametrize("nodes,n", [("2,2", 4), ("3,1", 4)])
@pytest.mark.parametrize("name", ["halo", "kmeans", "master_worker", "power_iteration", "sample_sort"])
def test_examples_same_under_mpi_and_the_hierarchical_world(env, nodes, n, name):
    """examples/ print the same under plain mpi4py and under `from shmcoll
    import MPI` across virtual nodes, its legs forced at every size."""
    prog = os.path.abspath(os.path.join(EXAMPLES, f"{name}.py"))
    rc, ref, _ = mpiexec(env, n, prog, nodes=nodes, extra={"MPI_MODULE": "mpi4py.MPI"})
    assert rc == 0 and ref.strip(), ref[-3000:]
    rc, got, _ = mpiexec(env, n, prog, nodes=nodes, extra={"MPI_MODULE": "shmcoll.MPI", "SHMCOLL_FLAT_BELOW": "0"})
    assert rc == 0, got[-3000:]
    assert sorted(got.splitlines()) == sorted(ref.splitlines())


@pytest.mark.parametrize("env", envs())
def test_bad_virtual_nodes_raise_on_every_rank(env):
    rc, out, _ = mpiexec(env, 3, "hier_bad_nodes.py", nodes="2,2")
    assert rc == 0, out[-3000:]
    assert "refused on 3 of 3" in out, out[-3000:]


@pytest.mark.parametrize("env", envs())
@pytest.mark.parametrize("victim", [0, 1, 3])
def test_kill_ends_the_job(env, victim, tmp_path):
    """A rank killed mid-collective ends the whole job at once; nothing of
    shmcoll's is left in /dev/shm (the autouse fixture checks)."""
    rc, out, took = mpiexec(env, 4, "hier_victim.py", "allreduce", victim, 50, tmp_path / "note", nodes="2,2",
                            timeout=60)
    assert rc != 0 and took < 30, out[-3000:]


@pytest.mark.parametrize("env", envs())
def test_a_node_peer_death_is_named_when_mpiexec_waits(env, tmp_path):
    """Under MPICH's -disable-auto-cleanup the launcher leaves the others
    running: shmcoll sees the death in a node leg, names the rank (in the
    communicator's numbering, and the world's where they differ: a Split
    of the hierarchical world) and aborts the MPI job."""
    if LIBS[env] != "MPICH":
        pytest.skip("MPICH's Hydra flag")
    # a non-leader in Barrier: only its node's leader waits on it, in a node
    # leg (a rank an MPI leg waits on may be MPICH's to notice first).
    # Hydra sometimes loses the ranks' last output as the job ends (it
    # reports only the killed rank, or fails itself: "control_cb ... assert
    # (!closed) failed"; every time with other work on the CPUs, now and
    # then without): the run is tried up to 3 times for the line
    for order, victim, named in (("", 1, "rank 1 failed"), ("reversed", 0, "rank 3 (COMM_WORLD rank 0) failed")):
        for _ in range(3):
            rc, out, took = mpiexec(env, 4, "hier_victim.py", "barrier", victim, 50, tmp_path / "note", order,
                                    nodes="2,2", timeout=60, flags=["-disable-auto-cleanup"])
            assert rc != 0 and took < 30, out[-3000:]
            if "shmcoll: rank" in out:
                break
        assert f"shmcoll: {named}: PeerDied" in out, out[-3000:]


@pytest.mark.parametrize("env", envs())
def test_an_exception_on_one_rank_aborts_the_job(env):
    """An exception that ends one rank's program ends the job, instead of
    the others waiting for it in the next collective."""
    rc, out, took = mpiexec(env, 4, "hier_raise.py", nodes="3,1", timeout=60)
    assert rc != 0 and took < 30, out[-3000:]
    assert "ValueError: rank 1 gives up" in out, out[-3000:]


def test_the_abort_hook_reports_in_one_write(monkeypatch):
    """mpiexec forwards stderr in the pieces it reads: the traceback goes in
    one write, before the abort, so the library's notice of the abort cannot
    split its last line (seen under Open MPI with PYTHONUNBUFFERED)."""
    from shmcoll import multinode

    writes, events = [], []
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append((fd, bytes(data))) or len(data))
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)

    class Mpi:
        def Abort(self, code):
            events.append(("abort", code, len(writes)))

    class FakeHier:
        mpi = Mpi()

    multinode._abort_on_error(FakeHier())
    try:
        raise ValueError("rank 1 gives up")
    except ValueError as e:
        sys.excepthook(type(e), e, e.__traceback__)
    assert [fd for fd, _ in writes] == [2], writes
    text = writes[0][1].decode()
    assert text.startswith("Traceback") and text.endswith("ValueError: rank 1 gives up\n"), text
    assert events == [("abort", 1, 1)]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
