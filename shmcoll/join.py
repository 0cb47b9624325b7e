"""shmcoll.init() in a job another launcher started: mpiexec (MPICH's
Hydra, Open MPI's prterun), srun or torchrun.

The ranks on one node agree on the job's shared memory without the
launcher's help: local rank 0 makes the segment (unlinked at once, as
every segment) and publishes where it holds it (its pid, the fd, the
plan) under a name in /dev/shm that every local rank derives alike from
the launcher's job id and their common parent (the launcher's per-node
daemon); the others map the segment through /proc/<pid>/fd.  Rank 0
unlinks the name as soon as every local rank has registered, or when one
has not within the join timeout, which it then names.  Where the job spans
several nodes, each node's ranks get a communicator of their own and
init() says so (issue 47 builds the rest)."""
import hashlib
import os
import pickle
import time
import warnings
from dataclasses import dataclass

from . import segment
from .device import Device
from .segment import Segment

TIMEOUT_S = 60.0    # SHMCOLL_JOIN_TIMEOUT: how long a local rank may take to arrive


@dataclass
class Found:
    """One rank of another launcher's job, as its environment tells."""
    launcher: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    job: str            # the launcher's job id, where it gives one

    def key(self):
        """The node-local job's name: the same for every local rank (same
        user, job id and parent: the launcher's daemon on this node)."""
        text = f"{os.getuid()}:{self.launcher}:{self.job}:{os.getppid()}:{self.size}:{self.local_size}"
        return segment.PREFIX + "join-" + hashlib.sha256(text.encode()).hexdigest()[:20]


def _int(env, name):
    return int(env[name]) if env.get(name, "").strip().isdigit() else None


def _slurm_local_size(env):
    """This node's task count from SLURM_STEP_TASKS_PER_NODE ("4(x2),3")."""
    node, counts = _int(env, "SLURM_NODEID"), []
    for part in env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "")).split(","):
        n, _, times = part.partition("(x")
        if n.strip().isdigit():
            counts += [int(n)] * (int(times.rstrip(")")) if times else 1)
    return counts[node] if node is not None and node < len(counts) else None


def found(env=os.environ):
    """The launcher this process is a rank of (a job of several), or None."""
    table = (
        ("mpiexec (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_NAMESPACE"),
        ("mpiexec (MPICH/Hydra)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", None),
        ("srun (Slurm)", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", None, "SLURM_JOB_ID"),
        ("torchrun (torch.distributed)", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
         "TORCHELASTIC_RUN_ID"),
    )
    for name, rank, size, lrank, lsize, job in table:
        r, s = _int(env, rank), _int(env, size)
        if r is None or s is None or s <= 1:
            continue
        lr = _int(env, lrank)
        ls = _slurm_local_size(env) if name.startswith("srun") else _int(env, lsize)
        if lr is None or ls is None:
            if s is not None and lr is None and ls is None:
                lr, ls = r, s       # no local view given: one node (a bare launcher's job)
            else:
                lacks = [v for v, x in ((lrank, lr), (lsize or "SLURM_NODEID/SLURM_STEP_TASKS_PER_NODE", ls)) if x is None]
                raise RuntimeError(f"shmcoll.init(): a rank of {name} ({rank}={r}, {size}={s}) without "
                                   f"{' or '.join(lacks)}: cannot tell which ranks share this node")
        jobid = env.get(job, "") if job else ""
        if name.startswith("srun"):
            jobid += "." + env.get("SLURM_STEP_ID", "")
        return _virtual(Found(name, r, s, lr, ls, jobid), env)
    return None


def _virtual(f, env):
    """f on the virtual node that SHMCOLL_VIRTUAL_NODES puts its rank on
    (consecutive ranks in groups of the given sizes, in place of the
    hostname: docs/multinode.md), where it is set."""
    from .multinode.layout import virtual_node, virtual_nodes
    sizes = virtual_nodes(f.size, env)
    if sizes is None:
        return f
    node, start = virtual_node(f.rank, sizes)
    return Found(f.launcher, f.rank, f.size, f.rank - start, sizes[node], f"{f.job}:node{node}")


def join(f, options=None, timeout=None):
    """This rank's Device in the node-local job of f's launcher."""
    from .launcher import Job
    timeout = float(os.environ.get("SHMCOLL_JOIN_TIMEOUT", TIMEOUT_S)) if timeout is None else timeout
    name = f.key()
    if f.local_size < f.size:
        warnings.warn(f"shmcoll.init(): this {f.launcher} job of {f.size} ranks spans several nodes; shmcoll's "
                      f"communicator is this node's {f.local_size} ranks (this rank is {f.local_rank} of them)",
                      stacklevel=3)
    if f.local_rank == 0:
        job = Job(f.local_size, bind="none", options=options)
        dev = job.device.for_rank(0)
        dev.job = job                   # the segment's fd lives as long as the rank does
        _publish(name, job)
        try:
            dev.register(os.getpid(), 0)
            _wait_all(dev, f, timeout)
        finally:
            _unlink(name)
        return dev
    pid, fd, plan = _find(name, f, timeout)
    dev = Device(plan, f.local_rank, Segment.open_proc(pid, fd, plan.size))
    dev.register(os.getpid(), 0)
    return dev


def _publish(name, job):
    """Write the record under a temporary name, then link it in place
    (atomic, and refused if a record is there: a stale one, whose rank 0
    is gone, is removed first)."""
    path = "/dev/shm" + name
    data = pickle.dumps((os.getpid(), job.device.segment.fd, job.plan))
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "wb") as out:
        out.write(data)
    try:
        for _ in range(2):
            try:
                os.link(tmp, path)
                return
            except FileExistsError:
                if _alive(_read(path)):
                    raise RuntimeError(f"shmcoll.init(): another job's rank 0 (pid {_read(path)[0]}) holds {path}; "
                                       "two jobs of the same launcher and parent on this node?") from None
                _unlink(name)
    finally:
        os.unlink(tmp)


def _read(path):
    try:
        with open(path, "rb") as f:
            return pickle.loads(f.read())
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def _alive(record):
    if record is None:
        return False
    try:
        os.kill(record[0], 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _unlink(name):
    try:
        os.unlink("/dev/shm" + name)
    except FileNotFoundError:
        pass


def _find(name, f, timeout):
    """Local rank 0's record, once it is there and its writer lives."""
    def missing():
        raise TimeoutError(f"shmcoll.init(): local rank 0 of this node's {f.local_size} ranks ({f.launcher}) did not "
                           f"publish the job within {timeout:g} s (SHMCOLL_JOIN_TIMEOUT); it never started, or died")
    def published():
        record = _read("/dev/shm" + name)
        return record if _alive(record) else None
    return _poll(published, timeout, missing)


def _wait_all(dev, f, timeout):
    """Every local rank registered, or the job aborted and a TimeoutError
    naming those that did not."""
    def absent():
        return [r for r in range(f.local_size) if dev.rank_state(r) == 0]

    def missing():
        late = absent()
        dev.abort(late[0], 9)
        raise TimeoutError(f"shmcoll.init(): local ranks {late} of this node's {f.local_size} "
                           f"({f.launcher}) did not join within {timeout:g} s (SHMCOLL_JOIN_TIMEOUT)")
    _poll(lambda: not absent(), timeout, missing)


def _poll(ready, timeout, missing):
    """ready()'s first true value, looked for with growing pauses (start-up
    only: nothing to wake on before the others exist); missing() raises
    once timeout seconds have passed."""
    end, delay = time.monotonic() + timeout, 1e-3
    while True:
        got = ready()
        if got:
            return got
        if time.monotonic() > end:
            missing()
        time.sleep(delay)
        delay = min(2 * delay, 0.05)
