"""The torch.distributed backend (shmcoll/torch.py) against gloo, torch's
own CPU backend, as the independent reference: every collective, op and
dtype of tests/torch_progs/collectives.py gives gloo's results, and a DDP
training loop gives gloo's loss curve bit for bit, under a real torchrun.
Skipped where torch is not installed."""
import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(300)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def torchrun(prog, n, backend, *args):
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
                        os.path.join(HERE, "torch_progs", prog), backend, *map(str, args)],
                       env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    return sorted(p.stdout.splitlines())


@pytest.mark.parametrize("n", [2, 3])
def test_collectives_give_gloos_results(n, tmp_path):
    got = {}
    for backend in ("shmcoll", "gloo"):
        torchrun("collectives.py", n, backend, tmp_path / backend)
        got[backend] = [(tmp_path / f"{backend}.{r}").read_text() for r in range(n)]
    assert got["shmcoll"] == got["gloo"]


@pytest.mark.parametrize("n", [2, 3])
def test_refusals_and_edge_dtypes_as_gloos(n, tmp_path):
    """What gloo refuses raises on every rank and leaves the group usable
    (shmcoll's communicator ended); bool SUM/PRODUCT, a small bfloat16
    send/recv, gather's future and strided tensors in every collective as
    gloo's."""
    got = {}
    for backend in ("shmcoll", "gloo"):
        torchrun("refusals.py", n, backend, tmp_path / backend)
        got[backend] = [(tmp_path / f"{backend}.{r}").read_text() for r in range(n)]
    assert got["shmcoll"] == got["gloo"]
    assert got["gloo"][0].count("'raised'") == 9, got["gloo"][0]


def test_the_default_init_under_shmcoll_run(tmp_path):
    """`shmcoll run` gives its ranks torchrun's variables (RANK, WORLD_SIZE,
    MASTER_ADDR, a free MASTER_PORT, ...), so dist.init_process_group()
    with no arguments works there as under torchrun: gloo's results."""
    p = subprocess.run([sys.executable, "-m", "shmcoll", "run", "-n", "2", sys.executable,
                        os.path.join(HERE, "torch_progs", "collectives.py"), "shmcoll", tmp_path / "shmcoll"],
                       env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    torchrun("collectives.py", 2, "gloo", tmp_path / "gloo")
    for r in range(2):
        assert (tmp_path / f"shmcoll.{r}").read_text() == (tmp_path / f"gloo.{r}").read_text()


def test_torchs_timeouts(tmp_path):
    """Work.wait(timeout) raises once it passes, the receive still posted;
    init_process_group's timeout bounds a collective whose peer never
    comes (it waited for SHMCOLL_TIMEOUT's 1800 s)."""
    torchrun("timeouts.py", 2, tmp_path / "t")
    assert (tmp_path / "t.0").read_text().split("\n")[:3] == ["0 wait raised True", "0 got [5.0, 5.0, 5.0]",
                                                              "0 all_reduce raised PeerTimeout True"]
    assert (tmp_path / "t.1").read_text() == "1 raised PeerAborted\n"


@pytest.mark.parametrize("n", [2, 3])
def test_storages_that_come_back_move_into_the_arena(n):
    assert torchrun("arena.py", n, "shmcoll") == [f"ok {r}" for r in range(n)]


@pytest.mark.parametrize("n", [2, 3])
def test_two_threads_on_two_groups_of_every_rank(n):
    assert torchrun("threads.py", n, "shmcoll") == [f"ok {r}" for r in range(n)]


def test_ddp_loss_curve_is_gloos_bit_for_bit():
    ours = torchrun("ddp.py", 2, "shmcoll")
    assert ours == torchrun("ddp.py", 2, "gloo") and len(ours[0].split()) == 20
    assert ours == torchrun("ddp.py", 2, "shmcoll")        # and the same on every run
    assert ours == torchrun("ddp.py", 2, "shmcoll", "later")   # and with buckets reduced during backward


@pytest.mark.parametrize("n", [2, 3])
def test_works_that_complete_later(n):
    assert torchrun("later.py", n, "shmcoll") == [f"ok {r}" for r in range(n)]


def test_a_rank_that_exits_with_works_in_flight_after_a_peer_died():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "torch_progs", "dies.py")],
                              env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", RANK=str(r), WORLD_SIZE="2",
                                       LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=str(port), TORCHELASTIC_RUN_ID=f"dies{port}"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    out, err = procs[0].communicate(timeout=120)
    procs[1].wait(timeout=30)
    assert procs[1].returncode == -9
    assert procs[0].returncode == 0 and out.split() == ["raised", "PeerDied"], (procs[0].returncode, out, err[-2000:])
