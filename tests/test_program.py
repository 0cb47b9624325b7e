"""The program printer (shmcoll.program, `shmcoll program`): golden
listings of small schedules, so that a change in the compiler shows as a
diff a reviewer can read, and the printer decodes whatever the
instruction table (shmcoll/isa.py) declares.

Regenerate the golden files after an intended compiler change with
    SHMCOLL_REGEN_GOLDEN=1 python3 -m pytest -q tests/test_program.py
and read the diff (git diff tests/golden) before committing it."""
import os
import random
import subprocess
import sys

import numpy as np
import pytest

import shmcoll
from shmcoll import isa, listing

topology_module = sys.modules["shmcoll.topology"]

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
REGEN = os.environ.get("SHMCOLL_REGEN_GOLDEN") == "1"
#: Everything the plan would otherwise take from this machine's caches
#: and /dev/shm; the virtual topology gives each rank a CPU of its own.
FIXED = {"chunk_bytes": 64 << 10, "tile_bytes": 64 << 10, "nt_bytes": 64 << 20, "cma_bytes": 1 << 20,
         "reduce_block_bytes": 2 << 20, "shm_bytes": 1 << 40}
CASES = [("bcast_limited_4", "bcast", 4, 256 << 10, "limited"),
         ("allgather_ring_3", "allgather", 3, 4096, "ring"),
         ("alltoall_pairwise_2_staged", "alltoall", 2, 64 << 10, "pairwise")]


@pytest.fixture(autouse=True)
def _no_environment_options(monkeypatch):
    """SHMCOLL_* settings of the caller would change the plan."""
    for k in list(os.environ):
        if k.startswith("SHMCOLL_"):
            monkeypatch.delenv(k)


@pytest.mark.parametrize("name,op,p,nbytes,alg", CASES, ids=[c[0] for c in CASES])
def test_golden_listing(name, op, p, nbytes, alg):
    got = shmcoll.program(op, p, nbytes, algorithm=alg, topology=f"1x{p}", options=FIXED)
    path = os.path.join(GOLDEN, name + ".txt")
    if REGEN:
        with open(path, "w") as f:
            f.write(got)
    with open(path) as f:
        want = f.read()
    assert got == want, f"{name}: the listing changed; if intended, regenerate (SHMCOLL_REGEN_GOLDEN=1) and review"


def test_listing_is_the_same_whatever_the_cpus():
    """A virtual topology's listing does not depend on the machine under
    it: the same over a recorded 2-CPU and a recorded 2-socket machine."""
    fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
    got = set()
    for tree in ("sys-1s1n", "sys-2s4n"):
        real = topology_module.read_sysfs(os.path.join(fixtures, tree))
        topo = topology_module.virtual("1x4", real)
        got.add(shmcoll.program("bcast", 4, 256 << 10, algorithm="limited", topology=topo, options=FIXED))
    assert len(got) == 1


def test_one_rank_and_its_events():
    """--rank prints that rank's program alone; its summary lists the
    events it waits on, as the instructions give them."""
    text = shmcoll.program("bcast", 4, 256 << 10, rank=2, algorithm="limited", topology="1x4", options=FIXED)
    assert [line.split(":")[0] for line in text.splitlines() if line.startswith("rank ")] == ["rank 2"]
    waits = [line for line in text.splitlines() if " WAIT " in line]
    events = sorted(int(w.split("event=")[1].split()[0]) for w in waits)
    assert events and f"waits on events rank 0: {events[0]}-{events[-1]}" in text


def test_every_opcode_and_field_decodes():
    """An instruction of every opcode in the table, with every operand
    set, prints its name and every field by name."""
    rnd = random.Random(7)
    prog = []
    for op in isa.OPS:
        vals = {f.name: 1 + rnd.randrange(min((1 << f.bits) - 1, 1000)) for f in op.fields}
        prog.append(isa.encode(op.name, **vals))
    a = np.zeros(isa.HEAD + len(prog) * isa.INSN, np.int64)
    a[0] = len(prog)
    a[isa.HEAD:] = np.array(prog, np.int64).ravel()
    lines = listing.rank_listing(0, a).splitlines()[1:1 + len(prog)]
    for op, line in zip(isa.OPS, lines):
        assert line.split()[1] == op.name
        for prev, f in zip([None] + op.fields, op.fields):
            merged = prev is not None and prev.kind == "space" and f.name.endswith("off")   # space+offset
            assert f" {f.name}=" in line or merged and f" {prev.name}=" in line, (op.name, f.name, line)


def test_a_new_opcode_prints_without_a_printer_change(monkeypatch):
    """The printer reads the table: an opcode added there shows up."""
    new = isa.Op("PROBE", 99, [isa.Field("zap", 1), isa.Field("who", 2, kind="rank")], "test")
    monkeypatch.setitem(isa.BY_CODE, 99, new)
    words = [99, 5, -1] + [0] * (isa.INSN - 3)
    assert listing.instruction(words) == "PROBE    zap=5 who=-"


def test_a_wait_nobody_satisfies_is_named():
    """The typical wait bug, a wait for an event its writer never posts,
    is named in the listing's last line."""
    from shmcoll.coll import select
    from shmcoll.compile import compile_schedule
    sched = shmcoll.schedule("bcast", "limited", 4, 256 << 10, topology="1x4", options=FIXED)
    plan_params = shmcoll.device.make_plan(4, shmcoll.topology("1x4"),
                                           shmcoll.topology("1x4").placement(4, "core", "compact"), FIXED).params
    progs = compile_schedule(sched, plan_params, (select.TABLE["bcast"][0], 0))
    assert listing.unmatched(progs) == []
    prog = progs[3]
    for i in range(prog[0]):
        w = prog[isa.HEAD + i * isa.INSN:isa.HEAD + (i + 1) * isa.INSN]
        op, v = isa.decode(w)
        if op.name == "WAIT":
            w[:] = isa.encode("WAIT", **dict(v, event=v["event"] + 100))
            bad = (3, "event", v["who"], v["event"] + 100)
            break
    assert listing.unmatched(progs) == [bad]
    assert f"rank 3 waits for rank {bad[2]}'s event {bad[3]}, never given" in listing.listing(progs)


def test_cli_sizes_and_rank():
    """`shmcoll program` takes sizes with suffixes and prints what shmcoll.program does."""
    from shmcoll.cli import _size
    assert [_size(s) for s in ("4096", "64K", "64KiB", "1M", "1m", "2G")] == [4096, 65536, 65536, 1 << 20, 1 << 20,
                                                                            2 << 30]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHMCOLL_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run([sys.executable, "-m", "shmcoll", "program", "bcast", "-n", "4", "--bytes", "256K",
                          "--rank", "1", "--algorithm", "limited", "--topology", "1x4"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == shmcoll.program("bcast", 4, 256 << 10, algorithm="limited", rank=1, topology="1x4")
    bad = subprocess.run([sys.executable, "-m", "shmcoll", "program", "bcast", "-n", "4", "--bytes", "lots"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "not a size" in bad.stderr



@pytest.mark.parametrize("kw", [{"root": 4}, {"root": -1}, {"nbytes": -5}, {"nbytes": 1.5}, {"nbytes": "1M"}])
def test_bad_root_or_size_is_named(kw):
    """A root outside the ranks or a byte count that is not a whole
    non-negative number is refused by name (it planned a schedule from
    rank -1, or one of -5 bytes, or failed deep in the planner)."""
    args = {"nbytes": 64, **kw}
    with pytest.raises(ValueError, match="root" if "root" in kw else "nbytes"):
        shmcoll.program("bcast", 4, **args)


def test_cli_bad_root_is_a_usage_error():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHMCOLL_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    bad = subprocess.run([sys.executable, "-m", "shmcoll", "program", "bcast", "-n", "4", "--bytes", "64", "--root", "4"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "root must be in 0 .. 3" in bad.stderr, bad.stderr

def _ran_and_listed(comm, nbytes):
    """This rank's listing by its communicator, and the instructions of the
    program its Bcast of nbytes ran, decoded alike."""
    buf = np.arange(nbytes, dtype=np.uint8) if comm.rank == 0 else np.zeros(nbytes, np.uint8)
    comm.Bcast(buf, 0, algorithm="limited")
    assert (buf == np.arange(nbytes, dtype=np.uint8)).all()
    (prog,) = comm._dev._programs.values()
    ran = [listing.instruction(prog[isa.HEAD + i * isa.INSN:isa.HEAD + (i + 1) * isa.INSN]) for i in range(prog[0])]
    text = comm.program("bcast", nbytes, algorithm="limited", rank=comm.rank)
    listed = [line.split(None, 1)[1] for line in text.splitlines() if line.startswith("   ")]
    return ran, listed


def test_a_communicators_listing_is_what_it_runs():
    """Comm.program (listing.of_comm) lists the very instructions the
    rank's program runs."""
    from conftest import run_ranks
    for ran, listed in run_ranks(_ran_and_listed, 3, 5000, timeout=120):
        assert ran and ran == listed


def test_docs_show_the_golden_listings_and_every_opcode():
    """docs/programs.md shows the 4-rank limited Bcast and 3-rank ring
    Allgather listings as the printer gives them, and a row per opcode."""
    with open(os.path.join(os.path.dirname(GOLDEN), "..", "docs", "programs.md")) as f:
        doc = f.read()
    for name in ("bcast_limited_4", "allgather_ring_3"):
        with open(os.path.join(GOLDEN, name + ".txt")) as f:
            assert "```\n" + f.read() + "```" in doc, f"docs/programs.md lacks the current {name} listing"
    assert {o.name for o in isa.OPS} <= {row.split("`")[1] for row in doc.splitlines() if row.startswith("| `")}


@pytest.mark.parametrize("op,held", [("bcast", False), ("alltoall", False), ("allgather", True),
                                     ("gatherv", True), ("allreduce", True)])
def test_signature_holds_a_dtype_where_calls_do(op, held):
    """The listing's signature holds the dtype where a real call's does
    (a row typed by an argument, or without a fast entry), not for Bcast
    or Alltoall, whose calls move bytes."""
    text = shmcoll.program(op, 2, 64, dtype=np.float32, topology="1x2", options=FIXED, rank=0)
    assert ("dtype=float32" if held else "dtype=-") in text.splitlines()[[l.startswith("rank 0") for l in
                                                                          text.splitlines()].index(True)]


def test_schedule_refuses_a_root_or_size_out_of_range():
    """shmcoll.schedule takes program's path, with its checks."""
    with pytest.raises(ValueError, match="root must be in 0 .. 3"):
        shmcoll.schedule("bcast", None, 4, 64, root=-1)
    with pytest.raises(ValueError, match="nbytes must be a whole number"):
        shmcoll.schedule("bcast", None, 4, -5)
