"""shmcoll.Pool: warm, pinned worker processes kept between tasks.

The interface is concurrent.futures.Executor's (submit, map, shutdown, a
context manager) with multiprocessing.Pool's common calls beside it
(imap, imap_unordered, starmap, apply, apply_async, map_async,
starmap_async, close, join, terminate).

Tasks and results travel through memory the owner maps shared and
anonymous before it forks the workers: per worker one ring each way
(csrc/chan.c), and a bell that any worker rings for the owner.  A
message is pickled with protocol 5, so a numpy array's bytes go straight
from its memory into the ring and out of it into the receiver's array:
one copy each side, no pipe, nothing named in /dev/shm.

One thread of the pool's own (the manager) forks the workers, so they
live as long as it does (a worker dies with the thread that forked it,
PR_SET_PDEATHSIG), reads the results and replaces a worker that died: the
task it was running raises WorkerDied, the tasks queued behind it go to
the others.  A watcher thread waits on the workers' pidfds and rings the
bell when one ends."""
import concurrent.futures as cf
import itertools
import multiprocessing
import os
import selectors
import signal
import _signal
import threading
import traceback
import weakref
from collections import deque
from time import monotonic as _now

from . import chan, spmd
from ._core import lib
from .errors import RemoteTraceback, WorkerDied
from .launcher import GRACE_S, Job, _check_nprocs, _die_with_parent, _forked_exit
from .topology import topology as _topology

DEPTH = 2               # tasks a worker holds at once: one running, one queued behind it
# An idle worker looks for its next task this long before it sleeps,
# yielding its CPU between looks (negative: csrc/chan.c yields): a task
# sent soon after the last result then needs no wake-up, and the owner,
# which may share the CPU, still runs.
IDLE_SPIN_NS = -300_000
EARLY = 3               # a pool whose workers die this many times its size in a row before a first task is broken


class TimeoutError(multiprocessing.TimeoutError, TimeoutError):    # noqa: A001
    """A wait ran out: both multiprocessing's and the builtin's."""


class _Closed(RuntimeError, ValueError):
    """map on a pool closed or shut down: both Executor.map's error and
    multiprocessing.Pool.map's."""


# What a call on a closed pool raises: its own interface's error.
_SHUT = (RuntimeError, "cannot schedule new futures after shutdown")     # the Executor's (submit)
_NOT_RUNNING = (ValueError, "Pool not running")                          # multiprocessing.Pool's
_EITHER = (_Closed, "Pool not running: cannot schedule new futures after shutdown")     # map: both's

_MAIN = threading.main_thread()


class _Held:
    """`with _held:` Ctrl-C waits until the block ends.  SIGINT's Python
    handler runs in the main thread between bytecodes; raised in a block
    that moves a message or changes the pool's books, its KeyboardInterrupt
    would leave half a message in a ring (the next reader misreads it), or
    a result read and never delivered.  So the handler is swapped for one
    that notes the signal, and the real one runs when the block ends."""

    def __init__(self):
        self.depth, self.real, self.got = 0, None, None

    def _note(self, *got):
        self.got = got

    def __enter__(self):
        if threading.current_thread() is not _MAIN:
            return
        if self.depth == 0:
            real = _signal.getsignal(signal.SIGINT)     # signal's own wraps each handler in an enum: 2 us a pair
            if callable(real):
                _signal.signal(signal.SIGINT, self._note)
                self.real = real
        self.depth += 1

    def __exit__(self, *exc):
        if threading.current_thread() is not _MAIN:
            return
        self.depth -= 1
        if self.depth == 0 and self.real is not None:
            real, self.real = self.real, None
            _signal.signal(signal.SIGINT, real)
            got, self.got = self.got, None
            if got is not None:
                real(*got)


_held = _Held()
_live = weakref.WeakSet()      # the pools not yet stopped


def _at_exit():
    """At exit, as ProcessPoolExecutor: the tasks submitted still run, then
    the workers stop (before daemon threads, the manager, are frozen)."""
    for core in list(_live):
        core.shutdown(wait=True)


threading._register_atexit(_at_exit)
os.register_at_fork(after_in_child=_live.clear)     # a forked child has none of the pools' threads


def _call(fn, args, kwargs):
    return fn(*args, **kwargs)


def _sliceable(iterable):
    """iterable as a sequence whose slices are chunks: a range, list or
    tuple as it is (a range's chunks are ranges: nothing to copy or
    pickle per item), anything else read into a list."""
    return iterable if isinstance(iterable, (range, list, tuple)) else list(iterable)


def _mapped(fn, *columns):
    return list(map(fn, *columns))


def _starmapped(fn, argsets):
    return list(itertools.starmap(fn, argsets))


def _worker(mem, i, initializer, initargs):
    """A worker's life: tasks in, results out, until STOP.  Never returns."""
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the owner's to handle
        tasks, results, state = mem.tasks[i], mem.results[i], mem.state(i)
        spmd._ring, me = (mem, i), os.getpid()
        if initializer is not None:
            initializer(*initargs)

        def heard(tid):     # before the arguments unpickle: a task that kills its worker there is the one named
            chan.STARTED.pack_into(mem.map, state, tid)
        while True:
            if spmd.inbox:      # what came while a run's Shrink waited
                kind, tid, obj = spmd.inbox.popleft()
                heard(tid)
            else:
                kind, tid, obj = chan.receive(tasks, lambda: True, heard, IDLE_SPIN_NS)
            if kind == chan.STOP:
                break
            if kind == chan.ERROR:      # its arguments did not unpickle here
                chan.put(results, _failure(tid, obj[0]), lambda: True)
                lib.sc_bell_ring(mem.bell)
                continue
            try:
                value = _call(*obj)
            except BaseException as e:
                if os.getpid() != me:
                    _forked_exit(e)
                out = _failure(tid, e)
            else:
                if os.getpid() != me:   # a process the task forked, leaving it: not this worker
                    _forked_exit()
                try:
                    out = chan.message(chan.RESULT, tid, value)
                except BaseException as e:
                    out = _failure(tid, RuntimeError(f"the task's result is not picklable: {e!r}"))
                del value
            del obj                 # the arguments' block may serve the next message (chan._block)
            chan.put(results, out, lambda: True)
            del out
            lib.sc_bell_ring(mem.bell)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def _failure(tid, exc):
    """An ERROR message carrying exc and its traceback, or a RuntimeError
    naming it when it does not pickle."""
    tb = traceback.format_exc()
    try:
        return chan.message(chan.ERROR, tid, (exc, tb))
    except BaseException as e:
        return chan.message(chan.ERROR, tid, (RuntimeError(f"{exc!r} (not picklable: {e!r})"), tb))


class _Task:
    __slots__ = ("future", "parts", "size", "worker", "target", "member")

    def __init__(self, future, parts, target=None, member=None):
        self.future, self.parts, self.worker, self.target = future, parts, None, target
        self.size = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
        self.member = member    # a run's part: (generation, worker)


class _Worker:
    __slots__ = ("index", "pid", "queued", "lock", "dead", "feeding")

    def __init__(self, index, pid):
        self.index, self.pid, self.queued = index, pid, deque()
        self.lock = threading.Lock()    # one writer of its task ring at a time
        self.dead = None                # its wait status, once it ended
        self.feeding = 0                # messages the feeder still writes


class _Core:
    """A pool's workers, books and threads.  Its threads and futures refer
    to it, not to the Pool the user holds, so that one can be collected
    (and then stop the workers)."""

    def __init__(self, n, bind, map, topology, initializer, initargs):
        self._n = n
        self._slots = _topology(topology).placement(n, bind, map)
        self._bind, self._map, self._topology = bind, map, topology
        self._run_lock = threading.Lock()
        self._grp, self._old, self._gen, self._broken = None, [], 0, False      # run()'s communicator
        self._init = (initializer, tuple(initargs))
        self._mem = chan.Memory(n)
        self._lock = threading.Lock()
        # held by the one thread that reads the result rings; reentrant: a done-callback run while it
        # reads may wait on another future, and then reads on
        self._reading = threading.RLock()
        self._drivers = []                   # futures whose result() reads results (_drive)
        self._later = deque()                # futures whose done-callbacks wait for _callbacks
        self._poked = threading.Event()      # a worker died: the manager's wake-up while others read
        self._pending = deque()          # tasks no worker holds yet
        self._tasks = {}                 # id -> _Task, until its future is done
        self._ids = itertools.count()
        self._workers = [None] * n
        self._closed = False
        self._stopping = False           # shutdown: stop once the submitted tasks are done
        self._killing = False            # terminate: no more replacements
        self._early = 0                  # workers that died in a row before their first task
        self._done = False               # the manager has stopped the workers
        self._feed = deque()
        self._feeder_wake = threading.Condition(self._lock)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        started, self._error = threading.Event(), None
        self._manager = threading.Thread(target=self._manage, args=(started,), name="shmcoll-pool", daemon=True)
        self._manager.start()
        started.wait()
        if self._error is not None:
            raise self._error
        self._watcher = threading.Thread(target=self._watch, name="shmcoll-pool-watch", daemon=True)
        self._watcher.start()
        self._feeder = threading.Thread(target=self._feeding, name="shmcoll-pool-feed", daemon=True)
        self._feeder.start()
        _live.add(self)

    # -- workers -------------------------------------------------------------
    def _spawn(self, i):
        """Fork worker i (from the manager thread), with fresh rings."""
        self._mem.reset(i)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                for key in list(self._sel.get_map().values()):      # the wake pipe, the other workers' pidfds
                    os.close(key.fd)
                os.close(self._sel.fileno())
                os.close(self._wake_w)
                _die_with_parent(parent)
                if self._bind != "none":
                    try:
                        os.sched_setaffinity(0, self._slots[i].cpus)
                    except OSError:
                        pass            # CPUs this host lacks (a virtual topology)
                _worker(self._mem, i, *self._init)
            finally:
                os._exit(1)
        w = _Worker(i, pid)
        fd = os.pidfd_open(pid)
        self._workers[i] = w
        self._sel.register(fd, selectors.EVENT_READ, w)
        os.write(self._wake_w, b"x")

    def _watch(self):
        """Wait on the workers' pidfds; mark the one that ended and ring the
        bell, so the manager replaces it at once."""
        while True:
            for key, _ in self._sel.select():
                w = key.data
                if w is None:
                    if b"q" in os.read(self._wake_r, 4096):     # the manager stopped every worker
                        os.close(self._wake_r)
                        self._sel.close()
                        return
                    continue
                self._sel.unregister(key.fd)
                os.close(key.fd)
                try:
                    _, status = os.waitpid(w.pid, 0)
                except ChildProcessError:       # SIGCHLD ignored: the kernel reaped it, its status is gone
                    status = signal.SIGKILL

                w.dead = status
                with self._lock:
                    self._member_over(w.index, dead=True)
                lib.sc_bell_ring(self._mem.bell)
                self._poked.set()

    def _manage(self, started):
        try:
            for i in range(self._n):
                self._spawn(i)
        except BaseException as e:
            self._error = e
            started.set()
            return
        started.set()
        try:
            self._loop()
        except BaseException as e:      # a bug here: fail every task and stop, rather than hang them
            traceback.print_exc()
            with self._lock:
                self._closed = self._stopping = self._killing = True
                for task in self._tasks.values():
                    task.future.done() or self._settle(task.future, RuntimeError(f"shmcoll.Pool's manager failed: {e!r}"))
                self._tasks.clear()
                self._pending.clear()
                for w in self._workers:
                    if w is not None and w.dead is None:
                        os.kill(w.pid, signal.SIGKILL)
            self._callbacks()
        self._stop_workers()
        # nobody need join the threads (shutdown(wait=False), a pool collected): they end here
        with self._lock:
            self._done = True
            self._feeder_wake.notify_all()
            # not EOF: a process forked after the pool was made (another pool's worker) holds the write end too
            os.write(self._wake_w, b"q")
            os.close(self._wake_w)
            self._retire()
        _live.discard(self)

    def _loop(self):
        """Read results, replace the dead, dispatch; until stopped and idle."""
        bell = self._mem.bell
        while True:
            seen = lib.sc_bell_seen(bell)
            dead = [w for w in self._workers if w.dead is not None]    # before their last results are read
            if dead:
                with self._reading:
                    busy = self._collect_all()
                    with self._lock:
                        for w in dead:
                            self._replace(w)
            else:
                busy = self._progress()
            with self._lock:
                self._dispatch()
                stop = self._stopping and not self._tasks
            self._callbacks()
            if stop:
                break
            if busy:
                continue
            if self._drivers:       # a thread in result() reads: wake only for a death, or to look again
                self._poked.wait(0.01)
                self._poked.clear()
            else:
                lib.sc_bell_wait(bell, seen, chan.SPIN_NS, chan.SLICE_NS)

    def _progress(self):
        """Read the results the workers have written, unless another thread
        is reading them now; whether there were any."""
        if not self._reading.acquire(False):
            return False
        try:
            return self._collect_all()
        finally:
            self._reading.release()

    def _collect_all(self):
        got = False
        for w in self._workers:
            got |= self._collect(w)
        return got

    def _drive(self, future, timeout):
        """Wait for future by reading results in this thread, as the
        manager would: a result then needs no second thread's wake-up."""
        bell, end = self._mem.bell, None if timeout is None else _now() + timeout
        self._drivers.append(future)        # list.append and .remove: atomic under the GIL
        try:
            self._drive_until(future, bell, end)
        finally:
            self._drivers.remove(future)

    def _drive_until(self, future, bell, end):
        while not future.done():
            seen = lib.sc_bell_seen(bell)
            if not self._reading.acquire(False):
                with self._reading:         # the manager is reading: what it reads may be ours
                    pass
                continue
            try:
                got = self._collect_all()
            finally:
                self._reading.release()
            self._callbacks()
            if got:
                continue
            left = 2e-3 if end is None else min(2e-3, end - _now())
            if left <= 0 or future.done():
                return
            lib.sc_bell_wait(bell, seen, chan.SPIN_NS, int(left * 1e9))

    def _collect(self, w):
        """Read the results worker w has written; whether there were any.
        Their futures' done-callbacks wait for _callbacks."""
        ring, got = self._mem.results[w.index], False

        def ready():
            n = lib.sc_chan_ready(ring)
            return n >= chan.HEAD.size or (n and w.dead is None)
        if not ready():
            return False
        with _held:
            while ready():
                msg = chan.receive(ring, lambda: w.dead is None)
                if msg is None:
                    break
                got = True
                self._book(w, *msg)
        return got

    def _book(self, w, kind, tid, value):
        """A message from worker w: its task's future is done."""
        with self._lock:
            if kind == chan.SHRINK:
                self._asked(w.index, value[0])
                return
            task = self._tasks.pop(tid, None)
            if w.queued and w.queued[0] == tid:
                w.queued.popleft()
            if task is not None and task.member is not None:
                self._member_over(w.index, dead=False, gen=task.member[0])
            if self._pending:
                self._dispatch()
        if task is None:
            return
        if kind == chan.RESULT:
            self._settle(task.future, value=value)
        else:
            exc, tb = value
            exc.__cause__ = RemoteTraceback(f'\n"""\n{tb}"""')
            self._settle(task.future, exc)

    def _settle(self, future, exc=None, value=None):
        """Finish future, its done-callbacks held back until _callbacks: the
        caller may hold the pool's lock or Ctrl-C, and a callback may call
        the pool (submit, wait, shut it down)."""
        future._late = True
        if exc is None:
            future.set_result(value)
        else:
            future.set_exception(exc)

    def _callbacks(self):
        """Run the done-callbacks _settle held back (no lock held)."""
        while self._later:
            f = self._later.popleft()
            f._late = False
            cf.Future._invoke_callbacks(f)

    def _replace(self, w):
        """w ended: its running task fails, the ones behind it go back to
        the queue, and a new worker takes its slot (unless stopping)."""
        running = chan.STARTED.unpack_from(self._mem.map, self._mem.state(w.index))[0]
        self._early = self._early + 1 if running < 0 else 0
        if self._early >= EARLY * self._n and not self._killing:     # the initializer fails, say: stop
            self._closed = self._killing = True
            why = RuntimeError(f"shmcoll.Pool: {self._early} workers in a row died before their first task "
                               f"(the last: {WorkerDied(w.index, w.pid, w.dead).why}); the pool is broken, "
                               f"see their stderr (does the initializer raise?)")
            for task in self._tasks.values():
                task.future.done() or self._settle(task.future, why)
            self._tasks.clear()
            self._pending.clear()
        for tid in reversed(w.queued):
            task = self._tasks.get(tid)
            if task is None:
                continue
            if tid == running:
                del self._tasks[tid]
                self._settle(task.future, WorkerDied(w.index, w.pid, w.dead))
            else:
                task.worker = None
                self._pending.appendleft(tid)
        w.queued.clear()
        if not self._killing:
            with w.lock:        # the feeder is out of its ring
                self._spawn(w.index)

    def _dispatch(self):
        """Hand pending tasks, in order, to the least-loaded live workers; a
        run()'s task to its own worker, however loaded (lock held)."""
        while self._pending:
            task = self._tasks.get(self._pending[0])
            if task is None or task.future.cancelled():
                self._tasks.pop(self._pending.popleft(), None)
                continue
            if task.target is not None:
                w = self._workers[task.target]
                if w.dead is not None:
                    return          # its replacement takes it
            else:
                w, least = None, DEPTH
                for x in self._workers:
                    if x.dead is None and len(x.queued) < least:
                        w, least = x, len(x.queued)
                if w is None:
                    return
            tid = self._pending.popleft()
            if not (task.future.running() or task.future.set_running_or_notify_cancel()):
                del self._tasks[tid]
                continue
            w.queued.append(tid)
            task.worker = w
            if not w.feeding and task.size <= chan.CHAN - lib.sc_chan_ready(self._mem.tasks[w.index]) and w.lock.acquire(False):
                try:
                    chan.put(self._mem.tasks[w.index], task.parts, lambda: True)
                finally:
                    w.lock.release()
            else:
                w.feeding += 1
                self._feed.append((w, task.parts))
                self._feeder_wake.notify()

    def _feeding(self):
        """Write the messages that do not fit their ring's free room now
        (a large array), so submit never blocks."""
        while True:
            with self._lock:
                while not self._feed and not self._done:
                    self._feeder_wake.wait()
                if not self._feed:
                    return
                w, parts = self._feed.popleft()
            with w.lock:
                if w.dead is None:
                    chan.put(self._mem.tasks[w.index], parts, lambda: w.dead is None)
            with self._lock:
                w.feeding -= 1

    def _stop_workers(self):
        """STOP to every worker, then wait until the watcher saw each end."""
        for w in self._workers:
            if w.dead is None:
                with w.lock:
                    chan.put(self._mem.tasks[w.index], chan.message(chan.STOP, -1, None), lambda: w.dead is None)
        while True:
            seen = lib.sc_bell_seen(self._mem.bell)
            if all(w.dead is not None for w in self._workers):
                return
            lib.sc_bell_wait(self._mem.bell, seen, chan.SPIN_NS, chan.SLICE_NS)

    # -- what Pool's calls do ------------------------------------------------
    def _check(self, refuse):
        if self._closed:
            raise refuse[0](refuse[1])

    def _submit(self, target, fn, args, kwargs, refuse=_SHUT, member=None):
        """A Future of fn(*args, **kwargs) on a worker (target: that one);
        refuse: what a closed pool raises (the calling interface's error)."""
        future = _Future(self)
        future._tid = tid = next(self._ids)
        parts = None
        try:
            parts = chan.message(chan.TASK, tid, (fn, args, kwargs))
        except BaseException as e:
            future.set_exception(e)
        with _held, self._lock:
            self._check(refuse)
            if parts is not None:
                self._tasks[tid] = _Task(future, parts, target, member)
                self._pending.append(tid)
                self._dispatch()
        return future

    def run(self, fn, args, timeout, on_failure):
        """Pool.run."""
        if on_failure not in ("rebuild", "shrink"):
            raise ValueError(f"on_failure must be 'rebuild' or 'shrink', not {on_failure!r}")
        with self._run_lock:
            group, owner = self._group(), os.getpid()
            group.fs = fs = [self._submit(i, spmd.member, (*group.place(i, owner), on_failure == "shrink", fn, args),
                                          {}, member=(group.gen, i))
                             for i in range(self._n)]
            end = None if timeout is None else _now() + timeout
            try:
                for f in fs:
                    f.exception(None if end is None else max(0.0, end - _now()))
            except cf.TimeoutError:
                self._abort(3)
                _, stuck = cf.wait(fs, GRACE_S)     # the abort ends every member's wait in shmcoll
                killed = self._kill_running(stuck)
                cf.wait(killed)
                queued = len(stuck) - len(killed)
                raise TimeoutError(f"pool.run: not done after {timeout} s; its communicator was aborted"
                                   + (f", and {len(killed)} members still running {GRACE_S} s later were killed"
                                      if killed else "")
                                   + (f"; {queued} members queued behind other tasks fail when they start"
                                      if queued else "")) from None
            errors = [(i, f.exception()) for i, f in enumerate(fs) if f.exception() is not None]
            if on_failure == "shrink":
                died = [(i, e) for i, e in errors if isinstance(e, WorkerDied)]
                if errors and len(died) == len(errors) and len(died) < len(fs):
                    return [f.exception() or f.result() for f in fs]
            if not errors:
                return [f.result() for f in fs]
            self._broken = True
            raise spmd.cause(errors)

    def _abort(self, code):
        """Abort the communicator of the latest run (its members raise)."""
        with self._lock:
            self._broken = True
            if self._grp is not None:
                lib.sc_set_abort(self._grp.job.device.c, -1, code)     # the owner's: counts at once, for every call

    def _kill_running(self, fs):
        """Kill the workers running these futures' tasks, but not one whose
        task of fs is still queued behind another's (that one is not this
        run's to kill); the futures of those killed."""
        killed = []
        with self._lock:
            for f in fs:
                task = self._tasks.get(f._tid)
                w = task and task.worker
                if (w is not None and w.dead is None
                        and chan.STARTED.unpack_from(self._mem.map, self._mem.state(w.index))[0] == f._tid):
                    os.kill(w.pid, signal.SIGKILL)
                    killed.append(f)
        return killed

    def _group(self):
        """The group of run's communicator, made anew (every worker in it)
        after a failed or shrunk run, or a worker's death."""
        with self._lock:
            self._check(_SHUT)
            if self._grp is None or self._broken:
                self._retire()
                self._gen += 1
                self._grp = spmd.Group(self._gen, Job(self._n, self._bind, self._map, self._topology), range(self._n))
                self._broken = False
            return self._grp

    def _retire(self):
        """Close the jobs of the groups no run uses any more, but not one
        that a member of a timed-out run, still queued behind another task,
        may yet attach to (lock held)."""
        keep = []
        for g in self._old + ([self._grp] if self._grp is not None else []):
            if all(f.done() for f in g.fs):
                g.job.close()
            else:
                keep.append(g)
        self._old, self._grp = keep, None

    def _member_over(self, worker, dead, gen=None):
        """A worker's part of the current run ended (or it died): a Shrink
        its peers wait on may now go ahead (lock held).  gen: the run's, when
        a part ended; one of an earlier, timed-out run is not this run's."""
        g = self._grp
        rank = None if g is None or gen not in (None, g.origin) else g.rank_of(worker)
        if rank is None:
            return
        if dead:
            g.job.device.abort(rank, 2)     # a run's peers stop waiting for it at once
            self._broken = True
        g.over.add(rank)
        self._shrink()

    def _asked(self, worker, gen):
        g = self._grp
        if g is not None and g.gen == gen and g.rank_of(worker) is not None:
            g.asked.add(g.rank_of(worker))
            self._shrink()

    def _shrink(self):
        """Once every member asked, ended or died: a group of the askers,
        each told its place on its task ring (lock held)."""
        g = self._grp
        if g is None or not g.shrinkable():
            return
        workers = [g.workers[r] for r in sorted(g.asked)]
        self._gen += 1
        job = Job(len(workers), self._bind, self._map, self._topology, slots=[self._slots[w] for w in workers])
        self._old.append(g)
        self._grp = new = spmd.Group(self._gen, job, workers, origin=g.origin)
        new.fs = g.fs
        self._broken = True             # the next run starts from every worker again
        for rank, w in enumerate(workers):
            target = self._workers[w]
            with target.lock:
                chan.put(self._mem.tasks[w], chan.message(chan.GROUP, -1, new.place(rank, os.getpid())),
                         lambda: target.dead is None)

    def shutdown(self, wait=True, cancel_futures=False):
        with _held, self._lock:
            self._closed = True
            if cancel_futures:
                for tid in self._pending:
                    task = self._tasks.pop(tid, None)
                    if task is not None:
                        task.future._late = True
                        task.future.cancel()
                self._pending.clear()
            self._stopping = True
            self._feeder_wake.notify_all()
        self._callbacks()
        lib.sc_bell_ring(self._mem.bell)
        if wait:
            self._join()

    def _join(self):
        """Wait for the threads; the manager ends once it stopped the workers."""
        if threading.current_thread() is self._manager:
            raise RuntimeError("shmcoll.Pool: a done-callback run by the pool's own thread cannot wait for the pool "
                               "to stop (it stops once the callback returns); call shutdown(wait=False) there")
        for t in (self._manager, self._feeder, self._watcher):
            t.join()

    def close(self):
        with self._lock:
            self._closed = True

    def terminate(self):
        with _held, self._lock:
            self._closed = self._stopping = self._killing = True
            for task in self._tasks.values():
                task.future._late = True
                task.future.cancel() or task.future.done() or task.future.set_exception(
                    RuntimeError("the pool was terminated"))
            self._tasks.clear()
            self._pending.clear()
            self._feeder_wake.notify_all()
            for w in self._workers:
                if w is not None and w.dead is None:
                    os.kill(w.pid, signal.SIGKILL)
        self._callbacks()
        lib.sc_bell_ring(self._mem.bell)
        self._join()


class Pool(cf.Executor):
    """n warm worker processes, pinned like `shmcoll run`'s ranks (bind:
    core, socket, numa or none), each running initializer(*initargs) once
    when it starts.  A pool dropped without shutdown shuts down as
    ProcessPoolExecutor's does: its workers stop once the submitted tasks
    are done (and at exit, the program waits for those)."""

    def __init__(self, n=None, *, bind="core", map="compact", topology=None, initializer=None, initargs=()):
        n = len(os.sched_getaffinity(0)) if n is None else _check_nprocs(n)
        self._n, self._core = n, _Core(n, bind, map, topology, initializer, tuple(initargs))
        weakref.finalize(self, self._core.shutdown, False).atexit = False     # at exit: _at_exit

    def submit(self, fn, /, *args, **kwargs):
        """Run fn(*args, **kwargs) on a worker; a Future of its result."""
        return self._core._submit(None, fn, args, kwargs)

    def map(self, fn, *iterables, timeout=None, chunksize=None):
        """[fn(*args) for args in zip(*iterables)], run in chunks; a list
        (multiprocessing.Pool.map's result; iterating it is
        Executor.map's).  chunksize None: about four chunks a worker, as
        multiprocessing.Pool.map; a trailing int (or None) is its chunksize."""
        if len(iterables) > 1 and (iterables[-1] is None or isinstance(iterables[-1], int)) and chunksize is None:
            *iterables, chunksize = iterables
        if not iterables:
            raise TypeError("map() needs at least one iterable")
        if len(iterables) == 1:
            return _gather(self._chunks(_mapped, fn, [_sliceable(iterables[0])], chunksize, _EITHER), timeout)
        # zip first: an endless iterable beside a finite one ends with it, as in Executor.map
        return _gather(self._chunks(_starmapped, fn, [list(zip(*iterables))], chunksize, _EITHER), timeout)

    def starmap(self, fn, iterable, chunksize=None):
        """multiprocessing.Pool.starmap: [fn(*args) for args in iterable]."""
        return _gather(self._chunks(_starmapped, fn, [_sliceable(iterable)], chunksize, _NOT_RUNNING), None)

    def map_async(self, fn, iterable, chunksize=None, callback=None, error_callback=None):
        """multiprocessing.Pool.map_async: an AsyncResult of map's list."""
        fs = self._chunks(_mapped, fn, [_sliceable(iterable)], chunksize, _NOT_RUNNING)
        return AsyncResult(_whole(fs), callback, error_callback)

    def starmap_async(self, fn, iterable, chunksize=None, callback=None, error_callback=None):
        """multiprocessing.Pool.starmap_async: an AsyncResult of starmap's list."""
        fs = self._chunks(_starmapped, fn, [_sliceable(iterable)], chunksize, _NOT_RUNNING)
        return AsyncResult(_whole(fs), callback, error_callback)

    def imap(self, fn, iterable, chunksize=1):
        """multiprocessing.Pool.imap: fn over iterable, results in order as
        they come (the iterable is read whole at once)."""
        return IMapIterator(self._chunks(_mapped, fn, [_sliceable(iterable)], chunksize, _NOT_RUNNING), True)

    def imap_unordered(self, fn, iterable, chunksize=1):
        """multiprocessing.Pool.imap_unordered: results as each chunk ends."""
        return IMapIterator(self._chunks(_mapped, fn, [_sliceable(iterable)], chunksize, _NOT_RUNNING), False)

    def _chunks(self, runner, fn, columns, chunksize, refuse):
        """Submit runner(fn, *column slices) per chunk: their futures."""
        self._core._check(refuse)
        n = len(columns[0])
        if chunksize is None:
            chunksize = max(1, -(-n // (4 * self._n)))
        elif isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
            raise ValueError(f"chunksize must be an int >= 1, not {chunksize!r}")
        return [self._core._submit(None, runner, (fn, *(c[i:i + chunksize] for c in columns)), {}, refuse)
                for i in range(0, n, chunksize)]

    def run(self, fn, *args, timeout=None, on_failure="rebuild"):
        """fn(comm, *args) on every worker at once, comm a communicator
        among them (rank i: worker i); their results in rank order.  The
        communicator stays between runs, warm.  A run that fails (a worker
        raised, died or timed out) raises the cause here, every worker's
        part ends, and the next run gets a new communicator (with the
        replacement of a dead worker).  on_failure="shrink": a member's
        death is not the run's end; the survivors see PeerDied in their
        calls, comm.Shrink() gives them a communicator of the survivors,
        and a dead member's entry in the results is its WorkerDied.  A
        worker joins when it has finished the tasks it already holds."""
        return self._core.run(fn, args, timeout, on_failure)

    def apply(self, fn, args=(), kwds={}):
        return self._core._submit(None, fn, tuple(args), dict(kwds), _NOT_RUNNING).result()

    def apply_async(self, fn, args=(), kwds={}, callback=None, error_callback=None):
        return AsyncResult(self._core._submit(None, fn, tuple(args), dict(kwds), _NOT_RUNNING), callback,
                           error_callback)

    def shutdown(self, wait=True, *, cancel_futures=False):
        """No new tasks; the workers stop once the submitted ones are done
        (cancel_futures: the ones not started are cancelled)."""
        self._core.shutdown(wait, cancel_futures)

    def close(self):
        """multiprocessing.Pool.close: no new tasks."""
        self._core.close()

    def join(self):
        """multiprocessing.Pool.join: wait for the tasks, then the workers."""
        self._core.shutdown(True)

    def terminate(self):
        """Kill the workers now; tasks not done are cancelled or fail."""
        self._core.terminate()

    def __exit__(self, *exc):
        self.shutdown(wait=True)
        return False

    def __repr__(self):
        return f"<shmcoll.Pool {self._n} workers{' (shut down)' if self._core._closed else ''}>"


def _gather(fs, timeout):
    end = None if timeout is None else _now() + timeout
    out = []
    try:
        for f in fs:
            try:
                out += f.result(None if end is None else max(0.0, end - _now()))
            except cf.TimeoutError:
                if f.done():
                    raise           # the task's own TimeoutError (cf.TimeoutError is the builtin since 3.11)
                raise TimeoutError(f"results not ready after {timeout} s") from None
    finally:
        for f in fs:
            f.cancel()
    return out


def _whole(fs):
    """A future of the chunks' results joined, done once every chunk is
    (multiprocessing's MapResult): their list, or the first error to come."""
    whole, lock, left, errors = cf.Future(), threading.Lock(), [len(fs)], []
    whole.set_running_or_notify_cancel()

    def one(f):
        with lock:
            if f.cancelled() or f.exception() is not None:
                errors.append(cf.CancelledError() if f.cancelled() else f.exception())
            left[0] -= 1
            if left[0]:
                return
        if errors:
            whole.set_exception(errors[0])
        else:
            whole.set_result([x for f in fs for x in f.result()])
    if not fs:
        whole.set_result([])
    for f in fs:
        f.add_done_callback(one)
    return whole


class _Future(cf.Future):
    """A Future whose result() and exception() read the results
    themselves (Pool._drive) while they wait."""

    def __init__(self, pool):
        super().__init__()
        self._pool, self._late = pool, False

    def result(self, timeout=None):
        end = None if timeout is None else _now() + timeout
        self._pool._drive(self, timeout)
        return super().result(None if end is None else max(0.0, end - _now()))

    def exception(self, timeout=None):
        end = None if timeout is None else _now() + timeout
        self._pool._drive(self, timeout)
        return super().exception(None if end is None else max(0.0, end - _now()))

    def _invoke_callbacks(self):
        if self._late:      # finished by _Core._settle: they run from _Core._callbacks
            self._pool._later.append(self)
        else:
            super()._invoke_callbacks()


class AsyncResult:
    """multiprocessing.pool.AsyncResult over a Future."""

    def __init__(self, future, callback=None, error_callback=None):
        self._future = future
        if callback is not None or error_callback is not None:
            def done(f):
                if f.cancelled():
                    return
                if f.exception() is None:
                    callback is None or callback(f.result())
                elif error_callback is not None:
                    error_callback(f.exception())
            future.add_done_callback(done)

    def ready(self):
        return self._future.done()

    def successful(self):
        if not self._future.done():
            raise ValueError(f"{self!r} not ready")
        return self._future.exception() is None

    def wait(self, timeout=None):
        cf.wait([self._future], timeout)

    def get(self, timeout=None):
        try:
            return self._future.result(timeout)
        except cf.TimeoutError:
            if self._future.done():
                raise               # the task's own TimeoutError
            raise TimeoutError(f"result not ready after {timeout} s") from None


class IMapIterator:
    """multiprocessing.pool.IMapIterator over the chunks' futures:
    next(timeout) raises multiprocessing's TimeoutError when no result
    came in time; a chunk that raised raises at its place, and the
    iteration goes on after it, as multiprocessing's does."""

    def __init__(self, fs, ordered):
        self._fs, self._ordered, self._i, self._items = fs, ordered, 0, deque()
        if not ordered:
            self._came, self._ready = deque(), threading.Semaphore(0)
            for f in fs:
                f.add_done_callback(self._arrived)

    def _arrived(self, f):
        self._came.append(f)
        self._ready.release()

    def __iter__(self):
        return self

    def __next__(self):
        return self.next()

    def next(self, timeout=None):
        while not self._items:
            if self._i == len(self._fs):
                raise StopIteration
            if self._ordered:
                f = self._fs[self._i]
                try:
                    f.exception(timeout)
                except cf.TimeoutError:
                    raise TimeoutError(f"no result after {timeout} s") from None
            else:
                if not self._ready.acquire(timeout=timeout):
                    raise TimeoutError(f"no result after {timeout} s")
                f = self._came.popleft()
            self._i += 1
            self._items.extend(f.result())
        return self._items.popleft()
