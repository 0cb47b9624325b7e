"""torch.distributed backend "shmcoll" for CPU tensors.

``import shmcoll.torch`` registers it (Backend.register_backend); then
``torch.distributed.init_process_group("shmcoll")`` (or
``"cpu:shmcoll,cuda:nccl"``) under torchrun, or under ``shmcoll run``
with torch's usual RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, runs
torch's collectives on shmcoll's engine.  Pure Python: each call views
the tensors as numpy arrays (no copy; bfloat16 through ml_dtypes) and
makes one shmcoll call per tensor.  Where the ranks leave CPUs spare
(ASYNC), allreduce, broadcast, all_gather_into_tensor and
reduce_scatter_tensor of ASYNC_BYTES or more start nonblocking calls
and return: the group's completion thread waits for them and sets the
Work's future, so that DDP's buckets reduce while its backward pass goes
on, as gloo's threads do; other calls complete before they return.
A new_group's ranks
get a communicator of their own (Comm.Create_group, called by them
alone).  Reductions are shmcoll's: deterministic, float16 and bfloat16
accumulated in float32."""
import atexit
import functools
import os
import queue
import threading
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.futures import Future

from . import ops
from ._core import lib
from .buffers import IN_PLACE
from .request import ANY_SOURCE, Complete, Status
from .topology import spare_cpus
from .launcher import init

NAME = "shmcoll"
# (torch's, shmcoll's, whether an average): an opts.reduceOp is a ReduceOp that equals its RedOpType but
# does not hash as it
_OPS = [(dist.ReduceOp.SUM, ops.SUM, False), (dist.ReduceOp.PRODUCT, ops.PROD, False),
        (dist.ReduceOp.MIN, ops.MIN, False), (dist.ReduceOp.MAX, ops.MAX, False), (dist.ReduceOp.BAND, ops.BAND, False),
        (dist.ReduceOp.BOR, ops.BOR, False), (dist.ReduceOp.BXOR, ops.BXOR, False), (dist.ReduceOp.AVG, ops.SUM, True)]


#: From here a storage that comes back moves into the rank's arena (docs/torch.md)
MOVE_BYTES = 64 << 10
#: From here a collective's Work may complete after the call returns (_Later)
ASYNC_BYTES = 64 << 10
#: Whether they do: None where the ranks leave CPUs spare for the completion threads (with none, a thread that
#: shares its rank's CPU only slowed DDP's step: docs/torch.md), True or False to say
ASYNC = None
#: Storages seen once (data pointer -> bytes), the most recent SEEN of them: a second call moves one
SEEN = 1024
_seen = {}
#: Storages viewed by calls running now (data pointer -> views): none of them moves
_busy = {}
_lock = threading.RLock()
_local = threading.local()      # .held: the _Held of this thread's call


#: torch 2.11 has no UntypedStorage._swap_data_ptr_: there storages stay where torch put them
_SWAP = hasattr(torch.UntypedStorage, "_swap_data_ptr_")


def _to_arena(s):
    """Move storage s into this rank's arena, where peers copy it with
    plain loads and stores instead of process_vm_readv, on the second call
    that brings it: DDP's buckets come back every step, a tensor made for
    one call would pay a copy for nothing.  The storage keeps its identity,
    contents and views (as share_memory_() moves one into shared memory),
    and its old memory is freed.  Only a storage that torch allocated and
    nobody views as a numpy array: torch marks one not resizable once
    .numpy() has viewed it or when it wraps foreign memory (from_numpy);
    shared ones belong to other processes too; none that a running call
    views (_busy: another tensor of the same call); and none while the
    process runs another Python thread, which could be writing into the
    old memory as it is copied and freed (torch's ops let the GIL go);
    the completion threads aside, which touch only the tensors of their
    calls, held until their futures are set.
    Called with _lock held."""
    ptr, n = s.data_ptr(), s.nbytes()
    if not _SWAP or not s.resizable() or s.is_shared() or ptr in _busy or threading.active_count() > 1 + len(_Completer.live):
        return
    if _seen.pop(ptr, None) != n:
        _seen[ptr] = n
        if len(_seen) > SEEN:
            del _seen[next(iter(_seen))]
        return
    room = np.empty(n, np.uint8)            # a rank's numpy arrays of this size come from its arena
    if not lib.sc_arena_holds(room.ctypes.data, n):
        return                              # none in this thread (or this process)
    new = torch.from_numpy(room).untyped_storage()
    new.copy_(s)
    s._swap_data_ptr_(new)                  # new now holds the old memory, freed with it


class _Held(list):
    """The data pointers a call holds in _busy: released as it ends (its
    Work made, or completed when it is a point-to-point call still in
    flight); those of a call that raised, by the thread's next call or as
    the thread ends (its locals go)."""

    def release(self, _lock=_lock, _busy=_busy):    # bound here: at exit the module's globals are gone
        if self:
            with _lock:
                for ptr in self:
                    left = _busy.pop(ptr) - 1
                    if left:
                        _busy[ptr] = left
            self.clear()

    __del__ = release


def _held():
    held = getattr(_local, "held", None)
    if held is None:
        held = _local.held = _Held()
    return held


def _hold(s):
    """s, moved into the arena when it may be, held in _busy until this thread's call ends."""
    with _lock:
        _to_arena(s)
        ptr = s.data_ptr()
        _busy[ptr] = _busy.get(ptr, 0) + 1
    _held().append(ptr)


def _array(t):
    """A CPU tensor's memory as a numpy array (its data: autograd aside),
    valid until the call ends.  A large storage outside the arena is held
    (_hold) and viewed through DLPack, which (unlike .numpy()) leaves it
    resizable, so that _to_arena can still tell it apart."""
    if not t.is_cpu:
        raise ValueError(f"the shmcoll backend moves CPU tensors; this one is on {t.device}")
    if not t.is_contiguous():
        raise ValueError("the shmcoll backend needs contiguous tensors (.contiguous() first)")
    if t.requires_grad:
        t = t.detach()
    bf16 = t.dtype == torch.bfloat16
    if bf16:
        t = t.view(torch.int16)
    if t.nbytes < MOVE_BYTES:
        a = t.numpy()
    else:
        s = t.untyped_storage()
        if lib.sc_arena_holds(s.data_ptr(), s.nbytes()):
            a = t.numpy()
        elif t.is_neg() or t.is_conj():     # numpy would read the bits without the sign or conjugate
            raise ValueError("the shmcoll backend takes no tensors with the negative or conjugate bit set "
                             "(resolve_neg() / resolve_conj() first)")
        else:
            _hold(s)
            a = np.from_dlpack(t)
    return a.view(ops.BF16) if bf16 else a


def _dense(tensors):
    """Contiguous stand-ins for tensors (a strided one's copy, else
    itself), and the function that copies the results back into the
    strided ones (None where none is): the collectives take strided
    tensors, as gloo's do (all_to_all_single a strided output only)."""
    if len(tensors) == 1 and tensors[0].is_contiguous():
        return tensors, None
    dense = [t if t.is_contiguous() else t.contiguous() for t in tensors]

    def back():
        with torch.no_grad():           # a tensor that requires grad takes the result as its data, as gloo's
            for t, d in zip(tensors, dense):
                if d is not t:
                    t.copy_(d)
    return dense, back if any(d is not t for t, d in zip(tensors, dense)) else None


def _in(t):
    """An input tensor's array: a strided one's contiguous copy's."""
    return _array(t if t.is_contiguous() else t.contiguous())


def _fill(outputs, got):
    """Each of outputs (strided ones too) set to its block of got."""
    dense, back = _dense(outputs)
    for o, g in zip(dense, got):
        _array(o)[...] = g
    if back:
        back()


def _contiguous(t):
    """t, which point-to-point takes contiguous only, as gloo's does (its RuntimeError)."""
    if not t.is_contiguous():
        raise RuntimeError("the shmcoll backend's send and recv take contiguous tensors only, as gloo's "
                           "(input tensor has to be contiguous)")
    return t


def _raw(t):
    """_array(t) for point-to-point, which moves bytes: bfloat16's as
    int16 (a buffer cannot carry ml_dtypes' bfloat16, 'E')."""
    a = _array(t)
    return a.view(np.int16) if t.dtype == torch.bfloat16 else a


def _op(opts):
    op = opts.reduceOp
    for theirs, ours, avg in _OPS:
        if op == theirs:
            return ours, avg
    raise ValueError(f"the shmcoll backend has no reduction {getattr(op, 'op', op)} (PREMUL_SUM)")


_CHECKED = {}      # (torch's op type, dtype) -> _reduction's answer for one tensor of it


def _reduction(opts, tensors):
    """(shmcoll's op, whether to average) of opts' reduction of tensors,
    checked here, before the call, on every rank alike: a refusal inside a
    collective ends its communicator (a peer may be waiting in it), where
    gloo's refusals leave the group usable.  bool SUM and PRODUCT are
    gloo's OR and AND.  One tensor's answer is kept (what a refusal raises
    is not): the checks cost 1.6 us, a third of a 64 KiB all_reduce's."""
    if len(tensors) != 1:
        return _checked(opts, tensors)
    key = (opts.reduceOp.op, tensors[0].dtype)
    got = _CHECKED.get(key)
    if got is None:
        got = _CHECKED[key] = _checked(opts, tensors)
    return got


def _checked(opts, tensors):
    given, avg = _op(opts)
    ours = set()
    for t in tensors:
        if avg and not (t.is_floating_point() or t.is_complex()):
            raise ValueError(f"ReduceOp.AVG of {t.dtype} tensors: torch averages floating point only")
        op = {ops.SUM: ops.MAX, ops.PROD: ops.MIN}.get(given, given) if t.dtype == torch.bool else given
        dt = _numpy_dtype(t.dtype)
        if dt is not None:
            ops.kernel(op, dt)
        ours.add(op)
    if len(ours) > 1:       # one op for the call: bool's OR or AND would reduce the others
        raise ValueError(f"one {given.name} of bool and other tensors together (as gloo, which refuses tensors "
                         f"of different types in one call)")
    return ours.pop() if ours else given, avg


@functools.lru_cache(maxsize=None)
def _numpy_dtype(dtype):
    """numpy's dtype of torch's, None where numpy has none (float8, complex32: _array refuses them)."""
    if dtype == torch.bfloat16:
        return ops.BF16
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:
        return None


def _same(what, tensors, like, count=None):
    """tensors (count of them, where given) of like's dtype and number of
    elements, as gloo checks them; a ValueError before the call if not."""
    if count is not None and len(tensors) != count:
        raise ValueError(f"{what}: {len(tensors)} tensors, not one per rank ({count})")
    for t in tensors:
        if t.dtype != like.dtype or t.numel() != like.numel():
            raise ValueError(f"{what}: a tensor of {t.numel()} {t.dtype} where the input has {like.numel()} "
                             f"{like.dtype} (invalid tensor size or type)")


def _whole(what, whole, block, size):
    """whole holds size blocks of block's dtype, as gloo checks them; a
    ValueError before the call if not."""
    if whole.dtype != block.dtype or whole.numel() != block.numel() * size:
        raise ValueError(f"{what}: {whole.numel()} {whole.dtype} for {size} blocks of {block.numel()} {block.dtype} "
                         f"(invalid tensor size or type)")


def _average(tensors, size):
    with torch.no_grad():
        for t in tensors:
            t.div_(size)


def _finish(dense, back, avg, size):
    """What a reduction runs once its calls completed: AVG's division of
    the contiguous stand-ins, then the copy back into strided tensors
    (_dense); None where there is nothing to do."""
    if not (avg or back):
        return None

    def finish():
        if avg:
            _average(dense, size)
        if back:
            back()
    return finish


def _seconds(timeout):
    """A timedelta's seconds (or a number's); None or 0: no limit."""
    return timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout


class _Done(dist._Work):
    """A call's Work.  The collectives complete before they return; a
    point-to-point call (reqs: shmcoll requests) is in flight until waited
    for, so that isend / irecv pairs (batch_isend_irecv) cannot deadlock.
    Its value is what gloo's future holds: the list of tensors."""

    def __init__(self, value, reqs=()):
        super().__init__()
        self._value, self._future, self._reqs = value, None, list(reqs)
        held = _held()
        if self._reqs:                  # its views stay held until it completes
            self._held = _Held(held)
            held.clear()
        else:
            held.release()              # made as the call ends: its views are gone

    def _ended(self):
        self._reqs = []
        self._held.release()

    def wait(self, timeout=None):
        if self._reqs:
            st = self._status = Status()
            seconds = _seconds(timeout)
            if seconds:                 # as gloo's: raise once it passes (the call stays in flight)
                end = time.monotonic() + seconds
                while not all(r.Get_status() for r in self._reqs):
                    if time.monotonic() > end:
                        raise RuntimeError(f"shmcoll backend: the Work did not complete within {seconds} s")
                    os.sched_yield()
            for r in self._reqs:
                r.Wait(st)              # a receive's is the one kept: recv_anysource has no other
            self._ended()
        return True

    def is_completed(self):
        if self._reqs and all(r.Get_status() for r in self._reqs):
            self.wait()
        return not self._reqs

    def source_rank(self):
        """The rank a receive's message came from (recv_anysource)."""
        self.wait()
        st = getattr(self, "_status", None)
        if st is None or st.Get_source() < 0:
            raise ValueError("source_rank() of a Work that received nothing")
        return st.Get_source()

    _source_rank = source_rank

    def is_success(self):
        return True

    def result(self):
        self.wait()
        return self._value

    def get_future(self):
        if self._future is None:        # made when asked: a blocking call never asks
            self.wait()
            self._future = Future()
            self._future.set_result(self._value)
        return self._future


class _Later(_Done):
    """A Work whose shmcoll requests are still running when the call
    returns: the group's completion thread waits for them (in C, the GIL
    let go), runs then (AVG's division), releases the views and sets the
    future, which DDP's reducer waits on at the end of the backward pass.
    A failure (a peer dead, a mismatch) is set on the future instead, and
    raises from wait()."""

    def __init__(self, value, reqs, then, spin_ns, completer):
        super().__init__(value, reqs)
        self._then, self._spin_ns, self._completer = then, spin_ns, completer
        self._future = Future()
        self._once, self._ended, self._error = threading.Lock(), threading.Event(), None

    def _finish(self):
        """Once, by whichever thread comes first: the completion thread, or
        a callback of an earlier Work on that thread that waits for this
        one (queued behind the callback, it would wait for itself)."""
        with self._once:
            if self._ended.is_set():
                return
            try:
                for r in self._reqs:
                    if type(r) is not Complete:
                        r._drive(self._spin_ns)
                    r.Wait()
                if self._then is not None:
                    self._then()
            except BaseException as e:     # noqa: B036 (the future carries it to the waiter)
                self._error = e
            self._reqs = []
            self._ended.set()
        if self._error is not None:
            self._future.set_exception(self._error)
        else:
            self._future.set_result(self._value)   # its callbacks run here, the views still held
        self._held.release()

    def wait(self, timeout=None):
        if self._completer.runs_here():
            self._finish()
        seconds = _seconds(timeout)
        if not self._ended.wait(seconds if seconds else None):
            raise RuntimeError(f"shmcoll backend: the Work did not complete within {seconds} s")
        self._future.wait()             # raises what _finish set, once its callbacks ran
        return True

    def is_completed(self):
        return self._future.done()

    def is_success(self):
        return self._ended.is_set() and self._error is None

    def exception(self):
        return self._error

    def get_future(self):
        return self._future


class _Completer:
    """A group's completion thread: finishes its _Later Works in call order
    (the order of the shmcoll queue they wait on).  Started with the first
    (live: the completers whose threads run);
    a daemon, stopped at exit after what was queued, before shmcoll.init's
    exit hook frees the communicators (_create registers stop_all after
    init registered that one: atexit runs the later first)."""
    live = set()
    hooked = False

    def __init__(self):
        self._q = queue.SimpleQueue()
        self._thread = None

    def put(self, work):
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="shmcoll-torch-completer", daemon=True)
            self._thread.start()
            self.live.add(self)
        self._q.put(work)

    def runs_here(self):
        return self._thread is threading.current_thread()

    def _run(self):
        while (work := self._q.get()) is not None:
            work._finish()

    def stop(self):
        """Finish what was queued, then end the thread."""
        if self._thread is not None:
            self._q.put(None)
            self._thread.join()
            self._thread = None
            self.live.discard(self)

    @classmethod
    def stop_all(cls):
        for c in list(cls.live):
            c.stop()

    @classmethod
    def forget_all(cls):
        """In a forked child: the threads did not come along."""
        for c in cls.live:
            c._thread, c._q = None, queue.SimpleQueue()
        cls.live.clear()


os.register_at_fork(after_in_child=_Completer.forget_all)


class ProcessGroupShmcoll(dist.ProcessGroup):
    """torch's ProcessGroup over a shmcoll communicator."""

    def __init__(self, comm, name):
        super().__init__(comm.rank, comm.size)
        self.comm, self._name = comm, name
        self._completer = _Completer()
        # where the ranks leave CPUs spare, the completion thread has one and spins; else it shares its rank's
        self._spare = spare_cpus(comm.slots) > 0
        self._spin_ns = comm._c.spin_ns if self._spare else 0

    def getBackendName(self):
        return NAME

    def shutdown(self):
        """destroy_process_group: the Works started finish, then a
        new_group's communicator goes (the world's stays: shmcoll.init's)."""
        self._completer.stop()
        if self.comm is not init():
            self.comm.Free()

    # torch names the groups it wraps in a ProcessGroup of its own; ours, one already, it takes as it is
    group_name = property(lambda self: self._name)

    def _launch(self, value, nbytes, start, finish=None):
        """A collective's Work: from ASYNC_BYTES, where asynchronous, the
        requests start() starts, completed by the group's thread, which
        then runs finish(); otherwise start(blocking=True) runs it whole."""
        if (ASYNC if ASYNC is not None else self._spare) and nbytes >= ASYNC_BYTES:
            reqs = start(False)
            if not all(type(r) is Complete for r in reqs):     # else they ended in their starts
                work = _Later(value, reqs, finish, self._spin_ns, self._completer)
                self._completer.put(work)
                return work
        else:
            start(True)
        if finish is not None:
            finish()
        return _Done(value)

    def allreduce(self, tensors, opts):
        op, avg = _reduction(opts, tensors)
        dense, back = _dense(tensors)

        def start(blocking):
            call = self.comm.Allreduce if blocking else self.comm.Iallreduce
            return [call(IN_PLACE, _array(t), op=op) for t in dense]
        return self._launch(tensors, sum(t.nbytes for t in tensors), start, _finish(dense, back, avg, self.comm.size))

    def allreduce_coalesced(self, tensors, opts):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts):
        dense, back = _dense(tensors)

        def start(blocking):
            call = self.comm.Bcast if blocking else self.comm.Ibcast
            return [call(_array(t), root=opts.rootRank) for t in dense]
        return self._launch(tensors, sum(t.nbytes for t in tensors), start, back)

    def _allgather_base(self, output, input, opts=None):
        _whole("all_gather_into_tensor", output, input, self.comm.size)
        (dense,), back = _dense([output])
        out, inp = _array(dense), _in(input)
        if not np.may_share_memory(out, inp):
            args = (inp, out)
        elif inp.ctypes.data == out.ctypes.data + self.comm.rank * inp.nbytes and \
                out.nbytes == inp.nbytes * self.comm.size:
            args = (IN_PLACE, out)      # torch's in place: input is this rank's block of output
        else:
            args = (inp.copy(), out)

        def start(blocking):
            return [(self.comm.Allgather if blocking else self.comm.Iallgather)(*args)]
        return self._launch(list(output.chunk(self.comm.size)), out.nbytes, start, back)

    all_gather_single = _allgather_base         # torch 2.13's name for all_gather_into_tensor's call

    def allgather(self, outputs, inputs, opts=None):
        for outs, t in zip(outputs, inputs):
            _same("all_gather", outs, t, self.comm.size)
        for outs, t in zip(outputs, inputs):
            a = _in(t)
            got = np.empty((self.comm.size,) + a.shape, a.dtype)
            self.comm.Allgather(a, got)
            _fill(outs, got)
        return _Done([o for outs in outputs for o in outs])

    def _reduce_scatter_base(self, output, input, opts):
        op, avg = _reduction(opts, [output])
        _whole("reduce_scatter_tensor", input, output, self.comm.size)
        (dense,), back = _dense([output])
        inp, out = _in(input), _array(dense)
        # in place (output a block of input): MPI's IN_PLACE would put the result in the first block
        inp = inp.copy() if np.may_share_memory(inp, out) else inp

        def start(blocking):
            return [(self.comm.Reduce_scatter_block if blocking else self.comm.Ireduce_scatter_block)(inp, out, op=op)]
        return self._launch([output], inp.nbytes, start, _finish([dense], back, avg, self.comm.size))

    reduce_scatter_single = _reduce_scatter_base     # torch 2.13's name for reduce_scatter_tensor's

    # coalesced calls (all_gather_coalesced, _coalescing_manager): each
    # pair in turn, as gloo's are; the Work is done when they all are

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        for i, t in enumerate(inputs):
            self.allgather([[outs[i] for outs in output_lists]], [t], opts)
        return _Done([o for outs in output_lists for o in outs])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self._allgather_base(o, i, opts).wait()
        return _Done(list(outputs))

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts):
        for o, i in zip(outputs, inputs):
            self._reduce_scatter_base(o, i, opts).wait()
        return _Done(list(outputs))

    all_gather_single_coalesced = allgather_into_tensor_coalesced       # torch 2.13's names
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def reduce_scatter(self, outputs, inputs, opts):
        op, avg = _reduction(opts, outputs)
        for out, ins in zip(outputs, inputs):
            _same("reduce_scatter", ins, out, self.comm.size)
        dense, back = _dense(outputs)
        for out, ins in zip(dense, inputs):
            self.comm.Reduce_scatter_block(np.stack([_in(t) for t in ins]), _array(out), op=op)
        done = _finish(dense, back, avg, self.comm.size)
        if done:
            done()
        return _Done(outputs)

    def reduce(self, tensors, opts):
        op, avg = _reduction(opts, tensors)
        root = opts.rootRank
        dense, back = _dense(tensors)
        for t in dense:
            a = _array(t)
            self.comm.Reduce(IN_PLACE, a, op=op, root=root) if self.comm.rank == root else \
                self.comm.Reduce(a, None, op=op, root=root)
        done = _finish(dense, back, avg, self.comm.size)
        if done and self.comm.rank == root:
            done()
        return _Done(tensors)

    def gather(self, outputs, inputs, opts):
        root = opts.rootRank
        if self.comm.rank == root:
            for outs, t in zip(outputs, inputs):
                _same("gather", outs, t, self.comm.size)
        for i, t in enumerate(inputs):
            a = _in(t)
            got = np.empty((self.comm.size,) + a.shape, a.dtype) if self.comm.rank == root else None
            self.comm.Gather(a, got, root=root)
            if got is not None:
                _fill(outputs[i], got)
        return _Done([o for outs in outputs for o in outs])

    def scatter(self, outputs, inputs, opts):
        root = opts.rootRank
        if self.comm.rank == root:
            for t, ins in zip(outputs, inputs):
                _same("scatter", ins, t, self.comm.size)
        dense, back = _dense(outputs)
        for i, t in enumerate(dense):
            send = np.stack([_in(x) for x in inputs[i]]) if self.comm.rank == root else None
            self.comm.Scatter(send, _array(t), root=root)
        if back:
            back()
        return _Done(outputs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        p = self.comm.size
        for name, t, splits in (("input", input, input_split_sizes), ("output", output, output_split_sizes)):
            rows = t.shape[0] if t.dim() else 1
            if splits and (len(splits) != p or sum(splits) != rows or min(splits) < 0):
                raise ValueError(f"all_to_all_single: {name} split sizes {list(splits)} do not split its {rows} "
                                 f"rows among {p} ranks (split sizes doesn't match total dim 0 size)")
            if not splits and rows % p:
                raise ValueError(f"all_to_all_single: {name} of {rows} rows does not split evenly among {p} ranks")
        if output.dtype != input.dtype or not (input_split_sizes or output_split_sizes) and \
                output.numel() != input.numel():
            raise ValueError(f"all_to_all_single: an output of {output.numel()} {output.dtype} for an input of "
                             f"{input.numel()} {input.dtype}")
        if not input.is_contiguous():
            raise ValueError("all_to_all_single: the input must be contiguous, as gloo's (Tensors must be contiguous)")
        (dense,), back = _dense([output])     # gloo writes a strided output as if contiguous
        out, inp = _array(dense), _array(input)
        if np.may_share_memory(out, inp):      # in place (all_to_all_single(x, x)): send from a copy
            inp = inp.copy()
        if not output_split_sizes and not input_split_sizes:
            self.comm.Alltoall(inp, out)
        else:
            self._alltoallv(inp, out, output_split_sizes, input_split_sizes)
        if back:
            back()
        return _Done([output])

    def _alltoallv(self, inp, out, output_split_sizes, input_split_sizes):
        p = self.comm.size
        row_in = inp.size // max(inp.shape[0], 1) if inp.ndim else 1
        row_out = out.size // max(out.shape[0], 1) if out.ndim else 1
        sc = [s * row_in for s in (input_split_sizes or [inp.shape[0] // p] * p)]
        rc = [s * row_out for s in (output_split_sizes or [out.shape[0] // p] * p)]
        self.comm.Alltoallv([inp.reshape(-1), (sc, np.cumsum([0] + sc[:-1]).tolist())],
                            [out.reshape(-1), (rc, np.cumsum([0] + rc[:-1]).tolist())])

    def alltoall(self, outputs, inputs, opts=None):
        dense, back = _dense(outputs)
        for i, t in enumerate(inputs):
            t = t if t.is_contiguous() else t.contiguous()
            self.comm.Sendrecv(_raw(t), i, 0, _raw(dense[i]), i, 0) if i != self.comm.rank else \
                _array(dense[i]).__setitem__(Ellipsis, _array(t))
        if back:
            back()
        return _Done(outputs)

    def barrier(self, opts=None):
        self.comm.Barrier()
        return _Done([])

    def send(self, tensors, dst, tag):
        return _Done(tensors, [self.comm.Isend(_raw(_contiguous(t)), dst, tag) for t in tensors])

    def recv(self, tensors, src, tag):
        return _Done(tensors, [self.comm.Irecv(_raw(_contiguous(t)), src, tag) for t in tensors])

    def recv_anysource(self, tensors, tag):
        """recv without src: from whichever rank sends first; the Work's
        source_rank() names it."""
        if len(tensors) != 1:
            raise ValueError(f"recv_anysource takes one tensor, not {len(tensors)} (as gloo)")
        return _Done(tensors, [self.comm.Irecv(_raw(_contiguous(tensors[0])), ANY_SOURCE, tag)])


def _create(backend_opts, pg_opts=None):
    """The backend of a process group: the world's communicator for the
    default group (torch names no ranks for it), else one of its own for a
    new_group's ranks (made by them alone), even one of every rank, so that
    two threads can each drive one."""
    world = init()
    if not _Completer.hooked:
        atexit.register(_Completer.stop_all)
        _Completer.hooked = True
    ranks = list(backend_opts.global_ranks_in_group)
    if world.size < (max(ranks) + 1 if ranks else backend_opts.group_size):
        raise RuntimeError(f"shmcoll backend: torch's group spans {backend_opts.group_size} ranks, but shmcoll's "
                           f"node has {world.size}: shmcoll does not yet talk between nodes")
    gid = str(backend_opts.group_id)
    comm = world if not ranks else world.Create_group(world.Get_group().Incl(ranks),
                                                      tag=int(gid) if gid.isdigit() else 0)
    seconds = _seconds(getattr(backend_opts, "timeout", None))
    if seconds and "SHMCOLL_TIMEOUT" not in os.environ:      # init_process_group's, new_group's timeout=
        comm._c.timeout_ns = int(seconds * 1e9)
    return ProcessGroupShmcoll(comm, gid)


if NAME not in dist.Backend.backend_list:
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])
