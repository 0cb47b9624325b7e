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
import signal
import subprocess
import sys
import threading
import time
import traceback

from .comm import Comm
from .device import MAX_RANKS, Device, make_plan
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
_world = None


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

    def __init__(self, nprocs, bind="core", map="compact", topology=None, options=None):
        if bind not in BINDS:
            raise ValueError(f"bind must be one of {', '.join(BINDS)}, not {bind!r}")
        topo = _topology(topology)
        self.bind = bind
        self.plan = make_plan(nprocs, topo, topo.placement(nprocs, bind, map), options)
        self.device = Device.create(self.plan)

    def close(self):
        self.device.close()


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


def _rank_main(job, rank, fn, args, out, parent):
    global _world
    code, dev = 0, None
    try:
        dev = job.device.for_rank(rank)
        _register(dev, parent)
        _world = Comm(dev)
        payload = (True, fn(_world, *args), None)
        _world.Free()     # a clean exit, not a death, for peers still finishing
    except BaseException as e:
        if dev is not None:
            dev.abort(rank, 1)
        payload, code = (False, e, traceback.format_exc()), 1
    try:
        data = pickle.dumps(payload)
    except Exception as e:
        data = pickle.dumps((False, RuntimeError(f"rank {rank}: result not picklable: {e!r}"), None))
        code = 1
    with os.fdopen(out, "wb") as f:
        f.write(data)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launch(fn, nprocs, args=(), *, bind="core", map="compact", topology=None, timeout=None, options=None):
    """Run fn(comm, *args) on nprocs forked, pinned ranks; return their
    results in rank order.  A rank's exception is re-raised here with its
    rank (exc.rank) and remote traceback; on timeout every rank is killed."""
    nprocs, timeout = _check_nprocs(nprocs), _check_timeout(timeout)
    job = Job(nprocs, bind, map, topology, options)
    parent, procs = os.getpid(), {}
    try:
        for rank in range(nprocs):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(r)
                    for fd in procs.values():
                        os.close(fd[1])
                    _die_with_parent(parent)
                    _pin(job, rank)
                finally:
                    _rank_main(job, rank, fn, args, w, parent)
            os.close(w)
            procs[pid] = (rank, r)
        return _collect(job, procs, timeout)
    finally:
        for pid in procs:
            _kill(pid)
        job.close()


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
    what an atexit handler raises."""
    try:
        comm.Free()
    except ShmcollError:
        traceback.print_exc()
        dev.abort(dev.rank, 1)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def init():
    """The world communicator of this process: the job's when started by
    `shmcoll run`, else a one-rank world (like an MPI singleton)."""
    global _world
    if _world is not None:
        return _world
    plan_fd = os.environ.get("SHMCOLL_PLAN_FD")
    if plan_fd:
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
    _register(dev, tracer)
    _world = Comm(dev)
    atexit.register(_leave, _world, dev)
    hook = sys.excepthook

    def abort_then_report(*exc):
        dev.abort(dev.rank, 1)
        hook(*exc)
    sys.excepthook = abort_then_report
    return _world


def run(nprocs, cmd, *, bind="core", map="compact", topology=None, timeout=None, options=None, grace=3.0):
    """mpiexec: run cmd on every rank; return the first failing rank's exit
    status (128 + signal for a signal), 0 if all succeed, 124 on timeout."""
    nprocs, timeout = _check_nprocs(nprocs), _check_timeout(timeout)
    job = Job(nprocs, bind, map, topology, options)
    if cmd and (cmd[0] in ("-m", "-c") or cmd[0].endswith(".py")):
        cmd = [sys.executable] + list(cmd)
    parent, procs, forwarders = os.getpid(), [], []
    first, plan_fd = None, -1
    sel = selectors.DefaultSelector()   # not select(): pidfds may be past FD_SETSIZE
    try:
        plan_fd = _plan_fd(job.plan)
        env = dict(os.environ, SHMCOLL_SIZE=str(nprocs), SHMCOLL_FD=str(job.device.segment.fd),
                   SHMCOLL_PLAN_FD=str(plan_fd), SHMCOLL_LAUNCHER_PID=str(parent))
        for rank in range(nprocs):
            def prep(rank=rank):
                _die_with_parent(parent)
                _pin(job, rank)
            procs.append(subprocess.Popen(cmd, env=dict(env, SHMCOLL_RANK=str(rank)), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, pass_fds=(job.device.segment.fd, plan_fd),
                                          preexec_fn=prep))
            for src, dst in ((procs[-1].stdout, sys.stdout), (procs[-1].stderr, sys.stderr)):
                forwarders.append(threading.Thread(target=_forward, args=(src, dst), daemon=True))
                forwarders[-1].start()
        job.device.segment.close_fd()
        os.close(plan_fd)
        plan_fd = -1
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
                if code and first is None:
                    first = (rank, 128 - code if code < 0 else code)
                _ended(job, rank, code < 0, code)
        return 0 if first is None else first[1]
    except KeyboardInterrupt:
        return 130
    finally:
        for key in list(sel.get_map().values()):
            sel.unregister(key.fd)
            os.close(key.fd)
        sel.close()
        if plan_fd >= 0:
            os.close(plan_fd)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for t in forwarders:
            t.join(timeout=1)
        job.close()


def _forward(src, dst):
    """Copy a rank's output to ours a whole line at a time, as mpiexec does,
    so lines of different ranks never interleave."""
    out = getattr(dst, "buffer", dst)
    for line in iter(src.readline, b""):
        out.write(line)
        out.flush()
    src.close()
