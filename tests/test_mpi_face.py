"""`from shmcoll import MPI`: mpi4py's module surface.  Where mpi4py with
MPICH is installed (/tmp/peer-mpich), constants, datatypes and whole
programs are compared with what it does, at test time."""
import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import ROOT, cli, run_ranks
import shmcoll
from shmcoll import MPI, errors

PEER = "/tmp/peer-mpich"
PEER_PY, PEER_MPIEXEC = f"{PEER}/bin/python", f"{PEER}/bin/mpiexec"
need_peer = pytest.mark.skipif(not os.path.exists(PEER_PY), reason="mpi4py with MPICH not installed in " + PEER)

CONSTANTS = ["ANY_SOURCE", "ANY_TAG", "PROC_NULL", "ROOT", "UNDEFINED", "TAG_UB", "SUCCESS", "IDENT", "CONGRUENT",
             "SIMILAR", "UNEQUAL", "COMM_TYPE_SHARED", "THREAD_SINGLE", "THREAD_FUNNELED", "THREAD_SERIALIZED",
             "THREAD_MULTIPLE", "MAX_PROCESSOR_NAME", "MAX_ERROR_STRING", "BSEND_OVERHEAD", "COMM_TYPE_HW_GUIDED",
             "COMM_TYPE_HW_UNGUIDED", "COMM_TYPE_RESOURCE_GUIDED", "ORDER_C", "ORDER_F", "ORDER_FORTRAN",
             "DISTRIBUTE_BLOCK", "DISTRIBUTE_CYCLIC", "DISTRIBUTE_NONE", "DISTRIBUTE_DFLT_DARG", "TYPECLASS_REAL",
             "TYPECLASS_INTEGER", "TYPECLASS_COMPLEX"] + \
    [n for n in dir(MPI) if n.startswith("COMBINER_")]
PAIRS = {"FLOAT_INT", "DOUBLE_INT", "LONG_INT", "TWOINT", "SHORT_INT", "LONG_DOUBLE_INT", "INT_INT"}
TYPES = sorted(k for k, v in vars(MPI).items() if isinstance(v, MPI.Datatype) and v and not k[0].isdigit())
NULL_TYPES = sorted(k for k, v in vars(MPI).items() if isinstance(v, MPI.Datatype) and not v)


def peer(code):
    """What a Python snippet run by mpi4py+MPICH's interpreter prints as JSON."""
    p = subprocess.run([PEER_PY, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def describe(t):
    return [list(t.Get_extent()), list(t.Get_true_extent()), t.Get_name(), list(t.Get_envelope()), t.typechar,
            t.typestr, t.Get_size()]


@need_peer
def test_constants_are_mpich_values():
    names = CONSTANTS + [n for n in dir(MPI) if n.startswith("ERR_")]
    theirs = peer(f"from mpi4py import MPI; import json; print(json.dumps({{n: getattr(MPI, n, None) for n in "
                  f"{names!r}}}))")
    assert {n: getattr(MPI, n) for n in names} == theirs
    # every error class MPICH has is here, and no other, with its string
    ours = {n for n in dir(MPI) if n.startswith("ERR_")}
    codes = peer("from mpi4py import MPI; import json; print(json.dumps({n: [getattr(MPI, n), "
                 "MPI.Get_error_string(getattr(MPI, n)) if getattr(MPI, n) < 100 else ''] for n in dir(MPI) "
                 "if n.startswith('ERR_')}))")
    assert set(codes) == ours
    for name, (code, string) in codes.items():
        if code >= 100 or MPI.Get_error_string(code).startswith("Error class"):
            continue            # classes of uncovered features: a generic string
        assert MPI.Get_error_string(code) == string, name


@need_peer
def test_datatypes_as_mpich_maps_them():
    theirs = peer(f"""
        from mpi4py import MPI; import json
        def d(t): return [list(t.Get_extent()), list(t.Get_true_extent()), t.Get_name(), list(t.Get_envelope()),
                          t.typechar, t.typestr, t.Get_size()]
        print(json.dumps({{n: d(getattr(MPI, n)) for n in {TYPES!r}}}))""")
    for name in TYPES:
        ours, ref = describe(getattr(MPI, name)), theirs[name]
        if name in PAIRS:
            # the contract: Get_size is the bytes an item spans in memory (its extent), where MPI's
            # counts the data bytes only (docs/mpi.md)
            assert ours[-1] == ours[0][1] and ours[:-1] == ref[:-1], name
        else:
            assert ours == ref, name


@need_peer
def test_null_datatypes_as_mpich():
    """The types MPICH lacks here (BFLOAT16_T, LOGICAL1, ...) are DATATYPE_NULL, and only those."""
    names = sorted(k for k, v in vars(MPI).items() if isinstance(v, MPI.Datatype))
    theirs = peer(f"from mpi4py import MPI; import json; print(json.dumps([n for n in {names!r} "
                  f"if not getattr(MPI, n)]))")
    assert NULL_TYPES == theirs


@need_peer
def test_typedict_and_contiguous_as_mpi4py():
    theirs = peer("""
        from mpi4py import MPI; import json
        t = MPI.DOUBLE.Create_contiguous(3); u = t.Create_contiguous(2); z = MPI.INT.Create_contiguous(0)
        print(json.dumps({"dict": [{k: v.Get_name() for k, v in d.items()}
                                   for d in (MPI._typedict, MPI._typedict_c, MPI._typedict_f)],
                          "c": [t.Get_size(), list(t.Get_extent()), list(t.Get_envelope()), t.typestr, t.combiner],
                          "cc": [u.Get_size(), list(u.Get_extent()), list(u.Get_envelope()), u.typestr],
                          "z": [z.Get_size(), list(z.Get_extent())],
                          "pair": [list(MPI.DOUBLE_INT.Create_contiguous(2).Get_true_extent())],
                          "decode": [[d.decode()[1], d.decode()[2], d.typechar, d.true_lb, d.true_ub]
                                     for d in (MPI.INT, MPI.INT.Dup().Dup(), MPI.INT.Create_contiguous(4))],
                          "eq": [MPI.DOUBLE.Dup() == MPI.DOUBLE, MPI.Datatype.fromcode("d") == MPI.DOUBLE,
                                 MPI.UNSIGNED_INT == MPI.UNSIGNED, MPI.INT32_T == MPI.INT,
                                 MPI.Datatype(MPI.INT) == MPI.INT, MPI.Datatype(MPI.INT) is MPI.INT]}))""")
    assert [{k: v.Get_name() for k, v in d.items()}
            for d in (MPI._typedict, MPI._typedict_c, MPI._typedict_f)] == theirs["dict"]
    t = MPI.DOUBLE.Create_contiguous(3)
    u = t.Create_contiguous(2)
    z = MPI.INT.Create_contiguous(0)
    assert [t.Get_size(), list(t.Get_extent()), list(t.Get_envelope()), t.typestr, t.combiner] == theirs["c"]
    assert [u.Get_size(), list(u.Get_extent()), list(u.Get_envelope()), u.typestr] == theirs["cc"]
    assert [z.Get_size(), list(z.Get_extent())] == theirs["z"]
    assert [list(MPI.DOUBLE_INT.Create_contiguous(2).Get_true_extent())] == theirs["pair"]
    assert [[d.decode()[1], d.decode()[2], d.typechar, d.true_lb, d.true_ub]
            for d in (MPI.INT, MPI.INT.Dup().Dup(), MPI.INT.Create_contiguous(4))] == theirs["decode"]
    assert [MPI.DOUBLE.Dup() == MPI.DOUBLE, MPI.Datatype.fromcode("d") == MPI.DOUBLE,
            MPI.UNSIGNED_INT == MPI.UNSIGNED, MPI.INT32_T == MPI.INT,
            MPI.Datatype(MPI.INT) == MPI.INT, MPI.Datatype(MPI.INT) is MPI.INT] == theirs["eq"]


@pytest.mark.parametrize("name", TYPES)
def test_datatype_contract(name):
    """.base and .count say what a spec of it holds, against numpy."""
    t = getattr(MPI, name)
    assert t.count == 1 and t.Get_size() == t.base.itemsize == np.dtype(t.base).itemsize
    if name not in PAIRS and t.typechar != "V":
        assert np.dtype(t.typestr).itemsize == t.Get_size() and np.dtype(t.typestr) == t.base
    c = t.Create_contiguous(5).Commit()
    assert (c.base, c.count, c.Get_size()) == (t.base, 5, 5 * t.Get_size())
    assert pickle.loads(pickle.dumps(t)) == t
    assert pickle.loads(pickle.dumps(c)).Get_size() == c.Get_size()
    with pytest.raises(MPI.Exception) as ei:
        t.Free()
    assert ei.value.Get_error_class() == MPI.ERR_TYPE
    c.Free()
    assert not c and c == MPI.DATATYPE_NULL
    with pytest.raises(MPI.Exception):
        c.Get_size()


def test_pair_types_reduce_as_minloc():
    """MINLOC/MAXLOC on the pair types give numpy's argmin/argmax."""
    rng = np.random.default_rng(5)
    for name in ("FLOAT_INT", "DOUBLE_INT", "LONG_INT", "TWOINT", "SHORT_INT", "LONG_DOUBLE_INT"):
        t = getattr(MPI, name)
        a = np.zeros(4, t.base)
        a["value"] = rng.integers(-50, 50, 4)
        a["index"] = np.arange(4)
        out = np.zeros_like(a)
        MPI.COMM_WORLD.Allreduce([a, t], [out, t], op=MPI.MINLOC)
        assert np.array_equal(out, a), name


STATUS = """
s = MPI.Status(); c = MPI.DOUBLE.Create_contiguous(3).Commit(); out = []
for t, n in ((MPI.BYTE, 56), (MPI.BYTE, 48), (c, 5), (MPI.DOUBLE_INT, 2), (MPI.INT, 0)):
    s.Set_elements(t, n)
    out.append([s.Get_count(MPI.BYTE), s.Get_count(c), s.Get_elements(c), s.Get_count(MPI.DOUBLE),
                s.Get_elements(MPI.DOUBLE), s.Get_count(MPI.INT)])
"""


def test_status_counts_by_datatype():
    """Counts (items) and elements (of a contiguous type's element type)."""
    scope = {"MPI": MPI}
    exec(STATUS, scope)
    d = np.dtype(np.float64).itemsize
    assert scope["out"][:3] == [[56, MPI.UNDEFINED, 56 // d, 56 // d, 56 // d, 56 // 4],
                                [48, 48 // (3 * d), 48 // d, 48 // d, 48 // d, 48 // 4],
                                [5 * d, MPI.UNDEFINED, 5, 5, 5, 5 * d // 4]]


@need_peer
def test_status_counts_as_mpich():
    """As MPICH's, but for a pair type's bytes (its size here is its extent)."""
    scope = {"MPI": MPI}
    exec(STATUS, scope)
    theirs = peer("from mpi4py import MPI; import json" + STATUS + "print(json.dumps(out))")
    assert [o for i, o in enumerate(scope["out"]) if i != 3] == [o for i, o in enumerate(theirs) if i != 3]


def test_wtime_monotonic():
    stamps = [MPI.Wtime() for _ in range(10000)]
    assert all(b >= a for a, b in zip(stamps, stamps[1:]))
    assert 0 < MPI.Wtick() < 1e-3


def test_environment():
    assert MPI.Is_initialized() and not MPI.Is_finalized() and MPI.Is_thread_main()
    assert MPI.Query_thread() in (MPI.THREAD_SERIALIZED, MPI.THREAD_MULTIPLE)
    assert MPI.Get_version() >= (3, 1) and "shmcoll" in MPI.Get_library_version()
    with pytest.raises(MPI.Exception):
        MPI.Init()
    assert MPI.Exception is errors.MPIError
    assert MPI.Get_processor_name() == os.uname().nodename
    m = MPI.Alloc_mem(64)
    assert len(m) == 64
    MPI.Free_mem(m)
    assert MPI.COMM_WORLD.Get_size() == 1 and isinstance(MPI.COMM_WORLD, MPI.Intracomm)
    assert MPI.COMM_SELF.Get_size() == 1 and MPI.COMM_SELF is not MPI.COMM_WORLD
    assert not MPI.COMM_NULL and isinstance(MPI.COMM_NULL, MPI.Comm)
    assert MPI.Intracomm(MPI.COMM_WORLD) == MPI.COMM_WORLD and isinstance(MPI.COMM_SELF, MPI.Comm)
    assert MPI.Intracomm(MPI.COMM_WORLD) is not MPI.COMM_WORLD      # another handle (mpi4py)
    assert MPI.Intracomm(MPI.COMM_NULL) == MPI.COMM_NULL == MPI.Comm() and not MPI.Comm()
    assert issubclass(MPI.Intracomm, MPI.Comm) and MPI.Comm.Bcast is shmcoll.Comm.Bcast
    with pytest.raises(TypeError):
        MPI.Comm(3)
    with pytest.raises(MPI.Exception):
        MPI.COMM_NULL.Barrier()


def test_buffer_as_mpi4py():
    """MPI.buffer is mpi4py's class: it knows its address and object, casts,
    tobytes takes (and ignores) an order, and a message takes it as bytes."""
    import array
    obj = array.array("i", [0, 1, 2, 3])
    buf = MPI.buffer.frombuffer(obj)
    assert type(buf) is MPI.buffer and buf.obj is obj and buf.nbytes == 16 and not buf.readonly
    assert buf.address == obj.buffer_info()[0] and list(buf.cast("i")) == [0, 1, 2, 3]
    assert buf.tobytes("i") == obj.tobytes() and buf.format == "B" and buf.itemsize == 1
    buf[4] = 9
    assert obj[1] == 9
    mem = MPI.Alloc_mem(32)
    assert type(mem) is MPI.buffer and mem.nbytes == 32 and MPI.buffer.fromaddress(mem.address, 32).address == mem.address
    ro = MPI.buffer.frombuffer(b"abc", readonly=True)
    assert ro.readonly and ro.tobytes() == b"abc"
    with pytest.raises(BufferError):
        MPI.buffer.frombuffer(b"abc")
    MPI.COMM_SELF.Sendrecv(np.arange(32, dtype=np.uint8), 0, 1, mem, 0, 1)
    assert np.array_equal(np.frombuffer(mem, np.uint8), np.arange(32))
    MPI.Free_mem(mem)


def test_message_checks_as_mpi4py():
    """mpi4py's exceptions for what a message may not be: a foreign byte
    order without a datatype (BufferError; with one it goes), a null
    datatype (ValueError), float counts (TypeError), a read-only receive
    (BufferError), two datatypes in a reduction (ValueError); and
    Alltoallw's [buf, datatypes], one item each."""
    self_ = MPI.COMM_SELF
    s, r = np.arange(3, dtype=">i4"), np.zeros(3, ">i4")
    with pytest.raises(BufferError, match="byte order"):
        self_.Sendrecv(s, 0, 0, r, 0, 0)
    self_.Sendrecv([s, MPI.INT], 0, 0, [r, MPI.INT], 0, 0)
    assert np.array_equal(r, s)
    with pytest.raises(ValueError, match="DATATYPE_NULL"):
        self_.Sendrecv([np.zeros(4), 0, 1, MPI.DATATYPE_NULL], 0, 0, [None, 0, "B"], 0, 0)
    with pytest.raises(TypeError):
        self_.Alltoallv([bytearray(3), np.array([3.1])], [bytearray(4), (3, np.array([1.1]))])
    with pytest.raises(BufferError, match="read-only"):
        self_.Sendrecv(np.zeros(2), 0, 0, b"ab" * 8, 0, 0)
    with pytest.raises(ValueError, match="dtype"):
        self_.Reduce([np.zeros(1, np.int32), 1, MPI.INT], [np.zeros(1, np.float32), 1, MPI.FLOAT])
    sbuf, rbuf = bytearray(b"abc"), bytearray(3)
    self_.Alltoallw([sbuf, None, None, [MPI.CHAR]], [rbuf, [MPI.CHAR]])
    assert rbuf == bytearray(b"a\0\0")
    with pytest.raises(ValueError, match="BOTTOM"):
        self_.Alltoallw([MPI.BOTTOM, None, [0], [MPI.BYTE]], [rbuf, [0], [0], [MPI.BYTE]])


def test_iflush_buffer():
    """Comm.Iflush_buffer (MPI-4.1): complete once the buffered sends in
    flight when it was made are delivered, not before."""
    comm = MPI.COMM_SELF.Dup()
    comm.Attach_buffer(MPI.Alloc_mem((1 << 21) + MPI.BSEND_OVERHEAD))
    comm.Bsend(np.arange(1 << 17, dtype=np.float64), 0, 3)     # 1 MiB: a rendezvous, pending till received
    flush = comm.Iflush_buffer()
    assert not flush.Test()
    got = np.zeros(1 << 17)
    comm.Recv(got, 0, 3)
    flush.Wait()
    assert np.array_equal(got, np.arange(1 << 17)) and MPI.Iflush_buffer().Test()
    comm.Detach_buffer()
    comm.Free()


def test_request_handles_as_mpi4py():
    """Request(req), Prequest(preq) and fromhandle give other handles of
    exactly that class, equal to the request and acting on it."""
    preq = MPI.COMM_SELF.Send_init(b"", MPI.PROC_NULL, 0)
    for dupe in (MPI.Prequest(preq), MPI.Prequest.fromhandle(preq.handle), MPI.Request(preq)):
        assert dupe == preq and hash(dupe) == hash(preq) and dupe is not preq
    assert type(MPI.Prequest(preq)) is MPI.Prequest and type(MPI.Request(preq)) is MPI.Request
    with pytest.raises(TypeError):
        MPI.Grequest(preq)
    MPI.Prequest(preq).Start()
    MPI.Request(preq).Wait()
    assert preq.Test()
    req = MPI.COMM_SELF.Irecv(np.zeros(2), 0, 7)
    MPI.COMM_SELF.Send(np.arange(2.0), 0, 7)
    st = MPI.Status()
    MPI.Request.fromhandle(req.handle).Wait(st)
    assert st.Get_tag() == 7 and req == MPI.REQUEST_NULL and not req
    preq.Free()
    assert not MPI.Request(preq) and MPI.Request(MPI.REQUEST_NULL) == MPI.REQUEST_NULL
    with pytest.raises(TypeError):
        MPI.Request(3)


@pytest.mark.parametrize("call", [lambda: MPI.Win.Create(None), lambda: MPI.File.Open(None, "x"),
                                  lambda: MPI.Cartcomm(), lambda: MPI.DOUBLE.Create_vector(2, 1, 2),
                                  lambda: MPI.DOUBLE.Create_struct([1], [0], [MPI.INT]),
                                  lambda: MPI.DOUBLE.Create_subarray([4], [2], [0]), lambda: MPI.Open_port(),
                                  lambda: MPI.Intercomm(), lambda: MPI.COMM_SELF.Bcast(MPI.BOTTOM)])
def test_uncovered_raise_naming_the_call(call):
    with pytest.raises(NotImplementedError, match="not covered"):
        call()


def test_object_reductions_with_replace_and_no_op():
    """mpi4py's meaning as a reduction's op: REPLACE the later operand, NO_OP the earlier."""
    assert MPI.REPLACE(1, 2) == 2 and MPI.NO_OP(1, 2) == 1
    assert not MPI.REPLACE.Is_commutative() and not MPI.NO_OP.Is_commutative()
    assert MPI.pickle.loads(MPI.pickle.dumps({"a": [1, 2]})) == {"a": [1, 2]}


def test_star_import_gives_mpi_names_only():
    scope = {}
    exec("from shmcoll.MPI import *", scope)
    assert scope["COMM_WORLD"] is MPI.COMM_WORLD and scope["DOUBLE"] is MPI.DOUBLE and "np" not in scope


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError):
        MPI.NO_SUCH_THING


PROGRAM = """\
from mpi4py import MPI
import numpy as np
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
buf = np.arange(5, dtype="d") * (rank + 1) if rank == 0 else np.zeros(5)
comm.Bcast([buf, MPI.DOUBLE], root=0)
total = np.zeros(5)
comm.Allreduce(np.arange(5.0) + rank, total, op=MPI.SUM)
mine = np.full(2, rank * 10, dtype="i")
got = np.zeros(2 * size, dtype="i") if rank == 0 else None
comm.Gather([mine, 2, MPI.INT], [got, 2, MPI.INT] if rank == 0 else None, root=0)
pair = np.zeros(1, np.dtype([("v", "d"), ("i", "i")], align=True))
pair[0] = ((rank - 1.5) ** 2, rank)
best = np.zeros_like(pair)
comm.Allreduce([pair, MPI.DOUBLE_INT], [best, MPI.DOUBLE_INT], op=MPI.MINLOC)
objs = comm.allgather({"rank": rank})
rows = comm.gather((rank, buf.tolist(), total.tolist(), best[0].tolist(), objs), root=0)
if rank == 0:       # one process prints: mpiexec may split lines that several write at once
    for row in rows:
        print(*row)
    print("gathered", got.tolist())
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [2, 3])
def test_mpi4py_program_runs_unchanged(tmp_path, n):
    """An mpi4py program with only its import changed gives, under `shmcoll
    run`, the output it gives under MPICH's mpiexec."""
    ours = tmp_path / "ours.py"
    ours.write_text(PROGRAM.replace("from mpi4py import MPI", "from shmcoll import MPI"))
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run(cli("run", "-n", str(n), "--", str(ours)), capture_output=True, text=True, timeout=150,
                       env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    lines = sorted(p.stdout.splitlines())
    assert len(lines) == n + 1
    if not os.path.exists(PEER_MPIEXEC):
        pytest.skip("no MPICH mpiexec to compare with")
    theirs = tmp_path / "theirs.py"
    theirs.write_text(PROGRAM)
    q = subprocess.run([PEER_MPIEXEC, "-n", str(n), PEER_PY, str(theirs)], capture_output=True, text=True,
                       timeout=150)
    assert q.returncode == 0, q.stderr
    assert lines == sorted(q.stdout.splitlines())


def test_comm_lock_table_as_mpi4py():
    """mpi4py's private lock table: a lower-case collective adds its lock, by name."""
    import threading
    comm = MPI.COMM_SELF.Dup()
    table = MPI._comm_lock_table(comm)
    assert "bcast" not in table
    assert comm.bcast({"x": 1}, root=0) == {"x": 1}
    assert isinstance(table["bcast"], type(threading.Lock())) and not table["bcast"].locked()
    comm.Free()



def _handles(comm):
    """MPI.Comm(comm) as mpi4py's: another object, equal, the same state."""
    other = MPI.Intracomm(comm)
    got = np.zeros(3)
    other.Allreduce(np.full(3, comm.rank + 1.0), got, op=MPI.SUM)        # runs on comm's state
    return (other is not comm and other == comm and hash(other) == hash(comm)
            and other.Compare(comm) == MPI.IDENT and comm.Compare(other) == MPI.IDENT
            and got.tolist() == [sum(range(1, comm.size + 1))] * 3)


@pytest.mark.parametrize("n", [1, 3])
def test_comm_of_a_comm_is_another_handle(n):
    assert run_ranks(lambda c: _handles(c) and _handles(c.Dup()), n) == [True] * n


def test_a_handle_to_comm_self_pickles_as_another_handle():
    other = MPI.Comm(MPI.COMM_SELF)
    assert pickle.loads(pickle.dumps(MPI.COMM_SELF)) is MPI.COMM_SELF
    back = pickle.loads(pickle.dumps(other))
    assert back is not MPI.COMM_SELF and back == MPI.COMM_SELF
