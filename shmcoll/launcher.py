"""One node's launcher and worker pool.

launch(fn, n) forks n pinned ranks from ordinary Python and returns their
results; `shmcoll run -n N -- CMD` execs CMD per rank like mpiexec.  The
parent is the watchdog: a rank that dies or raises sets the job's abort
word so every other rank raises within the liveness period instead of
waiting; ranks die with the launcher (PR_SET_PDEATHSIG), and the segment's
name was unlinked before any rank started, so nothing is ever left in
/dev/shm."""
import atexit
import ctypes
import fcntl
import math
import numbers
import os
import pickle
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback

from . import forkrun, join, segment
from .comm import Comm
from .device import ABORT_CALLED, MAX_RANKS, Device, make_plan
from .errors import MismatchError, PeerAborted, PeerDied, PeerFailure, RemoteTraceback, ShmcollError
from .topology import topology as _topology

BINDS = ("core", "socket", "numa", "none")
# Result pipes are read at most this much at a time (a pipe holds 64 KiB).
# Not more: os.read(fd, 1 MiB) allocates a buffer glibc serves by mmap, and
# freeing it (at the latest at EOF, where the read returns b"") raises
# glibc's mmap threshold for the rest of the caller's life, so its later
# large buffers come from the heap, where they alias (4K aliasing) and
# slow its collectives down.
GRACE_S = 5.0     # after a rank fails, how long the others may take to finish
PIPE_CHUNK = 1 << 16
# Blocked while a rank writes its result; the synchronous ones are not
# asynchronous, and SIGKILL and SIGSTOP cannot be blocked.
_ASYNC = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
                                   signal.SIGILL, signal.SIGTRAP, signal.SIGSYS, signal.SIGABRT}
_world = None
_rank_pid = None      # the pid of this process's rank: a process forked inside it has another


def _check_nprocs(nprocs):
    """nprocs as an int, or a TypeError/ValueError naming it (not a
    comparison error from deep inside the planner)."""
    if isinstance(nprocs, bool) or not isinstance(nprocs, numbers.Integral):
        raise TypeError(f"nprocs must be an int, not {type(nprocs).__name__} ({nprocs!r})")
    if not 1 <= nprocs <= MAX_RANKS:
        raise ValueError(f"nprocs must be between 1 and {MAX_RANKS}, not {nprocs}")
    return int(nprocs)


def _check_timeout(timeout):
    """timeout in seconds as a float (or None: no limit), or a
    TypeError/ValueError naming it."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, not {type(timeout).__name__} ({timeout!r})")
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a finite number of seconds > 0 (or None for no limit), not {timeout!r}")
    return float(timeout)


class Job:
    """A job's plan and segment, owned by the launching process."""

    def __init__(self, nprocs, bind="core", map="compact", topology=None, options=None, slots=None):
        """slots: where the ranks already are (a pool's survivors), instead of placing them."""
        if bind not in BINDS:
            raise ValueError(f"bind must be one of {', '.join(BINDS)}, not {bind!r}")
        topo = _topology(topology)
        self.bind = bind
        self.plan = make_plan(nprocs, topo, slots or topo.placement(nprocs, bind, map), options)
        self.plan.job = segment.job_prefix()
        self.device = Device.create(self.plan)

    def close(self):
        """Unmap, and sweep the names the ranks' communicators may have left
        (a rank killed between creating a named segment and unlinking it)."""
        self.device.close()
        segment.sweep(self.plan.job)


_STATES = ("none", "alive", "done", "dead")     # device.rank_state()'s 0..3


def _rank_state(device, rank):
    """Rank `rank`'s registration state: "none" (never registered),
    "alive", "done" (left cleanly) or "dead"."""
    return _STATES[device.rank_state(rank)]


def _register(device, tracer):
    """Register this process as its rank.  tracer: the launcher's pid; only
    it and its descendants (the job's ranks) may then ptrace this process
    or read its memory with process_vm_readv (PR_SET_PTRACER), not every
    process of the user."""
    device.register(os.getpid(), tracer)


def _ended(job, rank, signalled, code):
    """A rank's process ended: abort the job if that strands the others.
    A crash or a failure status always does; a clean exit does when the
    rank never registered (it never called init(), or exited before), since
    the others would wait for it forever.  Clean exits of plain programs
    that never use shmcoll abort nothing that anyone waits on."""
    if signalled:
        job.device.abort(rank, 2)
    elif code:
        job.device.abort(rank, 1)
    elif _rank_state(job.device, rank) == "none":
        job.device.abort(rank, 4)


def _plan_fd(plan):
    """A sealed memfd holding the pickled plan, for exec'd ranks.  Not an
    environment variable: for a few hundred ranks the plan outgrows the
    kernel's 128 KiB limit on one (execve fails with E2BIG)."""
    fd = os.memfd_create("shmcoll-plan", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        data = memoryview(pickle.dumps(plan))
        while data:
            data = data[os.write(fd, data):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _read_plan(fd):
    """The plan from _plan_fd's descriptor, which is then closed.  pread:
    every rank shares the one file offset."""
    try:
        size, data = os.fstat(fd).st_size, bytearray()
    except OSError as e:
        raise RuntimeError(f"shmcoll.init(): SHMCOLL_PLAN_FD={fd} is not open in this process ({e.strerror}); "
                           "was it started by `shmcoll run`?") from None
    try:
        while len(data) < size:
            chunk = os.pread(fd, size - len(data), len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    return pickle.loads(data)


def _die_with_parent(parent):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)           # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _pin(job, rank):
    if job.bind != "none":
        os.sched_setaffinity(0, job.plan.slots[rank].cpus)


def _block_signals():
    """Block the asynchronous signals and run the Python handlers already
    pending, dropping what they raise: from here on no signal raises in
    this process.  pthread_sigmask sets the mask before it runs pending
    handlers, and a handler that raises leaves the rest pending, so each
    try runs at least one of them."""
    for _ in range(signal.NSIG):
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, _ASYNC)
            return
        except BaseException:
            pass


def _is_rank():
    """Whether this process is the job's rank, not a process forked inside it."""
    return os.getpid() == _rank_pid


def _forked_exit(exc=None):
    """End a process forked inside a rank that returned (exc None) or raised
    out of the rank's code as Python ends a script, touching nothing of the
    job: no result, no abort, no Free.  Never returns."""
    code = 0
    try:
        if isinstance(exc, SystemExit):
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
            if code and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        elif exc is not None:
            code = 1
            traceback.print_exception(type(exc), exc, exc.__traceback__)
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(int(code) & 0xff)


def _rank_process(job, rank, fn, args, out, closing, parent, mask, gate):
    """The whole life of a forked rank.  It never returns (into launch's
    caller), whatever is raised where: it ends in os._exit."""
    global _rank_pid
    code = 1
    try:
        try:
            _rank_pid = os.getpid()
            for fd in closing:
                os.close(fd)
            _die_with_parent(parent)
            try:
                _pin(job, rank)
            except OSError:
                pass                        # CPUs this host lacks (a virtual topology): run unpinned
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            code = _rank_main(job, rank, fn, args, out, parent, gate)
        finally:
            _block_signals()
    finally:
        os._exit(code)


def _rank_main(job, rank, fn, args, out, parent, gate):
    """Run fn as rank `rank` and write (ok, result or exception, traceback)
    to out; the exit status.  A process fn forked that leaves fn ends in
    _forked_exit.  The result is written with the asynchronous signals
    blocked, so a Ctrl-C cannot cut it short."""
    global _world
    code, dev = 0, None
    try:
        dev = job.device.for_rank(rank)
        _register(dev, parent)
        _wait_gate(gate)
        _world = Comm(dev)
        value = fn(_world, *args)
        if not _is_rank():
            _forked_exit()
        payload = (True, value, None)
        _world.Free()     # a clean exit, not a death, for peers still finishing
    except BaseException as e:
        if not _is_rank():
            _forked_exit(e)
        if dev is not None:
            dev.abort(rank, 1)
        payload, code = (False, e, traceback.format_exc()), 1
    _block_signals()
    ok, data = _pickled(rank, payload)
    if data is None:
        return 1
    code = code or int(not ok)
    with os.fdopen(out, "wb") as f:
        f.write(data)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _wait_gate(fd):
    """Block until the launcher has started every rank (it closes the gate
    pipe's write end): ranks that went on into init's first collective
    would wait, and their waits take CPU time from the starting of the
    rest, which makes start-up quadratic in the ranks on few CPUs."""
    try:
        while os.read(fd, 1):
            pass
    finally:
        os.close(fd)


def _pickled(rank, payload):
    """(ok, bytes): payload pickled (ok), or else the exception that stopped
    it (which may be a KeyboardInterrupt or SystemExit raised by a
    __reduce__), or else a RuntimeError naming it; bytes None if not even
    that pickles."""
    ok, value, tb = payload
    try:
        return True, pickle.dumps(payload)
    except BaseException as e:
        why, tb = e, traceback.format_exc()
    if ok and isinstance(why, Exception):
        why = RuntimeError(f"rank {rank}: result not picklable: {why!r}")
    elif not ok:
        why = RuntimeError(f"rank {rank}: its exception {value!r} is not picklable ({why!r}); "
                           f"its traceback:\n{payload[2]}")
    for failure in (why, RuntimeError(f"rank {rank}: {why!r}")):
        try:
            return False, pickle.dumps((False, failure, tb))
        except BaseException:
            pass
    return False, None


def launch(fn, nprocs, args=(), *, bind="core", map="compact", topology=None, timeout=None, options=None):
    """Run fn(comm, *args) on nprocs forked, pinned ranks; return their
    results in rank order.  A rank's exception is re-raised here with its
    rank (exc.rank) and remote traceback; on timeout every rank is killed."""
    nprocs, timeout = _check_nprocs(nprocs), _check_timeout(timeout)
    job = Job(nprocs, bind, map, topology, options)
    parent, procs = os.getpid(), {}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    gate, gate_w = os.pipe()
    try:
        for rank in range(nprocs):
            r, w = os.pipe()
            # blocked across fork: a signal then would raise in the child
            # before it is inside _rank_process (the child unblocks them there)
            signal.pthread_sigmask(signal.SIG_BLOCK, _ASYNC)
            try:
                pid = os.fork()
            except BaseException:
                os.close(r)
                os.close(w)
                raise
            if pid == 0:
                _rank_process(job, rank, fn, args, w, [r, gate_w] + [fd for _, fd in procs.values()], parent, mask,
                              gate)
            procs[pid] = (rank, r)
            os.close(w)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(gate_w)
        gate_w = -1
        return _collect(job, procs, timeout)
    finally:
        try:
            os.close(gate)
            if gate_w >= 0:
                os.close(gate_w)
            for pid in procs:
                _kill(pid)
            job.close()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _collect(job, procs, timeout):
    """Read every rank's result while watching for deaths (pidfds).  A
    selector, not select(): descriptors past FD_SETSIZE (many ranks, or a
    caller holding many files) are fine."""
    n = len(procs)
    data, status = {r: bytearray() for r, _ in procs.values()}, {}
    deadline = None if timeout is None else time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        try:
            for rank, fd in procs.values():
                sel.register(fd, selectors.EVENT_READ, (None, rank))
            for pid, (rank, _) in list(procs.items()):
                fd = os.pidfd_open(pid)
                try:
                    sel.register(fd, selectors.EVENT_READ, (pid, rank))
                except BaseException:
                    os.close(fd)
                    raise
            failed = None       # when the first rank failed: the rest get GRACE_S to finish
            killed = set()      # ranks still running then, killed here
            while sel.get_map():
                now = time.monotonic()
                if failed is not None and now > failed + GRACE_S:
                    for pid, (rank, _) in procs.items():    # stopped or stuck outside a collective: the job is over
                        os.kill(pid, signal.SIGKILL)
                        killed.add(rank)
                    failed = float("inf")
                left = None if deadline is None else deadline - now
                if failed is not None and failed != float("inf"):
                    left = failed + GRACE_S - now if left is None else min(left, failed + GRACE_S - now)
                    left = max(left, 0.01)
                if deadline is not None and now >= deadline:
                    running = sorted(r for p, r in (k.data for k in sel.get_map().values()) if p is not None)
                    raise TimeoutError(f"shmcoll.launch: ranks {running} still running after {timeout} s; killed")
                for key, _ in sel.select(left):
                    if key.fd not in sel.get_map():
                        continue            # a result pipe _drain closed in this round
                    pid, rank = key.data
                    if pid is None:
                        chunk = os.read(key.fd, PIPE_CHUNK)
                        if chunk:
                            data[rank] += chunk
                            continue
                        sel.unregister(key.fd)
                        os.close(key.fd)
                        continue
                    sel.unregister(key.fd)
                    os.close(key.fd)
                    _, st = os.waitpid(pid, 0)
                    _drain(sel, procs[pid][1], data[rank])
                    del procs[pid]
                    status[rank] = st
                    _ended(job, rank, os.WIFSIGNALED(st), st)
                    if st and failed is None:
                        failed = time.monotonic()
        finally:
            for key in list(sel.get_map().values()):
                sel.unregister(key.fd)
                os.close(key.fd)
    return _results(n, data, status, killed)


def _drain(sel, fd, data):
    """Read what an ended rank left in its result pipe, and stop watching it.
    Not up to EOF: a process the rank forked may hold the pipe open."""
    if fd not in sel.get_map():
        return
    os.set_blocking(fd, False)
    try:
        while chunk := os.read(fd, PIPE_CHUNK):
            data += chunk
    except BlockingIOError:
        pass
    sel.unregister(fd)
    os.close(fd)


def _results(n, data, status, killed):
    out, errors = [None] * n, []
    for rank in range(n):
        if data[rank]:
            ok, value, tb = pickle.loads(bytes(data[rank]))
            if ok:
                out[rank] = value
                continue
            # another rank's finding, which that rank reports itself (if it can)
            finder = getattr(value, "found_by", rank) if isinstance(value, MismatchError) else rank
            echo = isinstance(value, PeerAborted) or (finder != rank and bool(data[finder]))
            errors.append((2 if echo else int(isinstance(value, PeerFailure)), rank, value, tb))
        elif rank in killed:
            errors.append((3, rank, PeerDied(rank, f"was still running {GRACE_S} s after another rank failed, "
                                                   f"and was killed"), None))
        else:
            st = status.get(rank, 0)
            why = f"was killed by signal {os.WTERMSIG(st)}" if os.WIFSIGNALED(st) else \
                f"exited with status {os.waitstatus_to_exitcode(st)}"
            errors.append((0, rank, PeerDied(rank, why + " without a result"), None))
    if errors:
        # the cause, not its echoes: a rank's own error or death, then what
        # a rank saw of a peer (died, timed out) before the aborts it caused
        # in the others (and their echoes of a mismatch another rank found),
        # and those before the kills of ranks still running
        # after them (a stalled rank: the PeerTimeout that names it)
        _, rank, exc, tb = min(errors, key=lambda e: e[:2])
        if not isinstance(exc, PeerFailure):
            exc.rank = rank
        if hasattr(exc, "add_note"):
            exc.add_note(f"(raised on shmcoll rank {rank} of {n})")
        if tb:
            raise exc from RemoteTraceback(f"\n--- rank {rank} ---\n{tb}")
        raise exc
    return out


def _leave(comm, dev):
    """At exit: Free.  Its failure (calls of this rank's that its peers
    never made) becomes the exit status, which Python does not make of
    what an atexit handler raises.  A process forked inside the rank
    inherits this handler, and its exit is not the rank's."""
    if not _is_rank():
        return
    try:
        comm.Free()
    except ShmcollError:
        traceback.print_exc()
        dev.abort(dev.rank, 1)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


# Another launcher's job: (its name, the variables that give size and rank
# away).  Bare PMIx (PMIX_RANK) tells no size, so only its ranks past 0 know.
_FOREIGN = (("mpiexec (MPICH/Hydra)", "PMI_SIZE", ("PMI_RANK", "PMI_SIZE")),
            ("mpiexec (Open MPI)", "OMPI_COMM_WORLD_SIZE", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")),
            ("srun (Slurm)", "SLURM_STEP_NUM_TASKS", ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_ID")),
            ("torchrun (torch.distributed)", "WORLD_SIZE", ("RANK", "WORLD_SIZE", "LOCAL_RANK")),
            ("a PMIx launcher (prterun, srun --mpi=pmix)", None, ("PMIX_RANK", "PMIX_NAMESPACE")))


def _foreign_launcher(env):
    """A RuntimeError naming the launcher, when env is that of one rank of
    a job of several that another launcher started; else None."""
    for name, size, shown in _FOREIGN:
        try:
            several = int(env[size]) > 1 if size else int(env[shown[0]]) > 0
        except (KeyError, ValueError):
            continue
        if several:
            found = ", ".join(f"{v}={env[v]}" for v in shown if v in env)
            n = env.get(size, "N") if size else "N"
            return RuntimeError(
                f"shmcoll.init(): this process is one rank of a job started by {name} ({found}), not by "
                f"`shmcoll run`; shmcoll cannot join another launcher's job, and each process would be a world "
                f"of one.  Start the program with `shmcoll run -n {n} ...` instead (it takes mpiexec's -n, "
                f"--bind-to, --map-by, -x, --env, --tag-output).")
    return None


def init():
    """The world communicator of this process: the job's when started by
    `shmcoll run`; the node's ranks of a job started by mpiexec (MPICH,
    Open MPI), srun or torchrun, which join through /dev/shm (join.py);
    else a one-rank world (like an MPI singleton).  A rank of another
    launcher's job that cannot be joined raises RuntimeError."""
    global _world, _rank_pid
    if _world is not None:
        return _world
    plan_fd = os.environ.get("SHMCOLL_PLAN_FD")
    joining = None if plan_fd else join.found(os.environ)
    if not plan_fd and joining is None and (foreign := _foreign_launcher(os.environ)) is not None:
        raise foreign
    if joining is not None:
        dev = join.join(joining)
    elif plan_fd:
        from .segment import Segment
        rank, fd, plan = int(os.environ["SHMCOLL_RANK"]), int(os.environ["SHMCOLL_FD"]), _read_plan(int(plan_fd))
        dev = Device(plan, rank, Segment.from_fd(fd, plan.size))
        # the launcher, not our parent: a rank may be started by a shell or
        # wrapper that `shmcoll run` started
        tracer = int(os.environ.get("SHMCOLL_LAUNCHER_PID") or os.getppid())
    else:
        job = Job(1, bind="none")
        dev = job.device.for_rank(0)
        tracer = os.getpid()
    if joining is None:
        _register(dev, tracer)      # a joining rank registered in join(), before rank 0 stops waiting
    _world, _rank_pid = Comm(dev), os.getpid()
    atexit.register(_leave, _world, dev)
    hook = sys.excepthook

    def abort_then_report(*exc):
        if _is_rank():
            dev.abort(dev.rank, 1)
        hook(*exc)
    sys.excepthook = abort_then_report
    return _world


def _torch_env(nprocs, given):
    """The variables torchrun gives its ranks (RANK and LOCAL_RANK are each
    rank's), so that torch.distributed's default init_process_group()
    works under `shmcoll run` as under torchrun; MASTER_ADDR and
    MASTER_PORT where neither the environment nor the caller gives them (a
    free port of this machine, as torchrun's standalone mode takes one)."""
    env = {"WORLD_SIZE": str(nprocs), "LOCAL_WORLD_SIZE": str(nprocs)}
    have = {**os.environ, **(given or {})}
    if "MASTER_ADDR" not in have:
        env["MASTER_ADDR"] = "127.0.0.1"
    if "MASTER_PORT" not in have:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            env["MASTER_PORT"] = str(s.getsockname()[1])
    return env


def run(nprocs, cmd, *, bind="core", map="compact", topology=None, timeout=None, options=None, grace=3.0,
        fork=False, env=None, tag=None):
    """mpiexec: run cmd on every rank; return the first failing rank's exit
    status (128 + signal for a signal, as Open MPI's mpiexec), 0 if all
    succeed, 124 on timeout, 127 (126) when cmd is not found (not
    executable), said in one line and no rank started.  fork: Python
    commands (script.py, -m, -c) run in ranks forked from this process
    (forkrun), which must then hold no other threads or foreign state: the
    CLI's choice.  env: variables added to every rank's environment.  tag:
    a prefix for each line a rank writes, formatted with its rank and
    stream ("stdout" or "stderr")."""
    nprocs, timeout = _check_nprocs(nprocs), _check_timeout(timeout)
    missing = None if forkrun.is_python(cmd) else _unrunnable(cmd[0])
    if missing:
        print(f"shmcoll run: {missing[1]}", file=sys.stderr)
        return missing[0]
    job = Job(nprocs, bind, map, topology, options)
    fork = fork and forkrun.is_python(cmd)
    if not fork and forkrun.is_python(cmd):
        cmd = [sys.executable] + list(cmd)
    parent, procs, forwarders, codes = os.getpid(), [], [], {}
    first, plan_fd, gate, gate_w = None, -1, -1, -1
    sel = selectors.DefaultSelector()   # not select(): pidfds may be past FD_SETSIZE
    try:
        plan_fd = _plan_fd(job.plan)
        env = dict(os.environ, **(env or {}), SHMCOLL_SIZE=str(nprocs), SHMCOLL_FD=str(job.device.segment.fd),
                   SHMCOLL_PLAN_FD=str(plan_fd), SHMCOLL_LAUNCHER_PID=str(parent), **_torch_env(nprocs, env))
        if fork:
            gate, gate_w = os.pipe()    # the ranks start once all are forked (see _wait_gate)
        for rank in range(nprocs):
            def prep(rank=rank):
                _die_with_parent(parent)
                _pin(job, rank)
            mine = dict(env, SHMCOLL_RANK=str(rank), RANK=str(rank), LOCAL_RANK=str(rank))
            if fork:
                closing = [gate_w] + [f.fileno() for p in procs for f in (p.stdout, p.stderr)]
                procs.append(forkrun.start(list(cmd), mine, prep, gate, closing))
            else:
                procs.append(subprocess.Popen(cmd, env=mine, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, pass_fds=(job.device.segment.fd, plan_fd),
                                              preexec_fn=prep))
        # forwarders only now: a fork while one held sys.stdout's lock would
        # leave the lock held in the child
        for rank, p in enumerate(procs):
            for src, dst, stream in ((p.stdout, sys.stdout, "stdout"), (p.stderr, sys.stderr, "stderr")):
                prefix = tag.format(rank=rank, stream=stream).encode() if tag else b""
                forwarders.append(threading.Thread(target=_forward, args=(src, dst, prefix), daemon=True))
                forwarders[-1].start()
        job.device.segment.close_fd()
        os.close(plan_fd)
        plan_fd = -1
        if fork:
            os.close(gate_w)
            gate_w = -1
        for rank, p in enumerate(procs):
            fd = os.pidfd_open(p.pid)
            try:
                sel.register(fd, selectors.EVENT_READ, rank)
            except BaseException:
                os.close(fd)
                raise
        deadline = None if timeout is None else time.monotonic() + timeout
        while sel.get_map():
            left = None if deadline is None else max(deadline - time.monotonic(), 0)
            if first is not None:
                left = grace if left is None else min(left, grace)
            ready = sel.select(left)
            if not ready:
                if first is None:
                    print(f"shmcoll run: timeout after {timeout} s; killing ranks "
                          f"{sorted(k.data for k in sel.get_map().values())}", file=sys.stderr)
                    first = (None, 124)
                break
            for key, _ in ready:
                rank = key.data
                sel.unregister(key.fd)
                os.close(key.fd)
                code = procs[rank].wait()
                codes[rank] = 128 - code if code < 0 else code
                if code and first is None:
                    first = (rank, codes[rank])
                _ended(job, rank, code < 0, code)
        called, cause = job.device.abort_code(), job.device.abort_rank()
        if called & ABORT_CALLED:       # Comm.Abort(errorcode): mpiexec's status is the errorcode
            return called & 0xff
        if codes.get(cause):
            # the abort word names the first failure: a rank that saw a peer
            # die may exit before that peer's exit is reported (a dying
            # process frees its memory after its robust mutex is released)
            return codes[cause]
        return 0 if first is None else first[1]
    except KeyboardInterrupt:
        return 130
    finally:
        for key in list(sel.get_map().values()):
            sel.unregister(key.fd)
            os.close(key.fd)
        sel.close()
        for fd in (plan_fd, gate, gate_w):
            if fd >= 0:
                os.close(fd)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for t in forwarders:
            t.join(timeout=1)
        job.close()


def _unrunnable(program):
    """(exit status, one line) when program cannot be started: 127 not
    found, 126 not executable, as a shell says; else None."""
    path = program if os.sep in program else shutil.which(program)
    if path is None or not os.path.exists(path):
        return 127, f"{program}: command not found" if os.sep not in program else f"{program}: no such file"
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        return 126, f"{program}: not an executable file (permission denied)"
    return None


def _forward(src, dst, prefix=b""):
    """Copy a rank's output to ours a whole line at a time, as mpiexec does,
    so lines of different ranks never interleave; prefix: --tag-output's."""
    out = getattr(dst, "buffer", dst)
    for line in iter(src.readline, b""):
        out.write(prefix + line)
        out.flush()
    src.close()
