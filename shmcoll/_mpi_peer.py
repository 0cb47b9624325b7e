"""Standalone mpi4py benchmark: the MPI peer that shmcoll is measured against.

Run it with a peer virtualenv's own launcher and interpreter, e.g.
``DIR/bin/mpiexec -n 2 -bind-to core DIR/bin/python -I
shmcoll/_mpi_peer.py --ops barrier,bcast --json out.json``.

It must never import shmcoll (the peer venv does not have it).  mpi4py is only
imported inside ``main`` so that ``shmcoll.bench`` can import this module and
reuse ``OPS`` and ``sample``: both sides then build, validate and time every
operation with literally the same code (the method of /work/shared/PEERS.md).
"""
import argparse
import functools
import json
import math
import statistics
import time

import numpy as np

OPS = {}


def op(fn):
    """Register ``fn(comm, nbytes, algorithm=None) -> Case`` under its name.

    ``algorithm`` goes to the collective when given (shmcoll's named
    columns; mpi4py never gets it).  Adding a collective is one more such
    function.
    """
    OPS[fn.__name__] = fn
    return fn


class Case:
    """One operation at one size over this rank's buffers.

    ``calls[r]`` makes the call with root r (one call for an operation
    without a root), all over the same buffers, so that a loop can rotate
    the root as OSU's does.  ``fill(i, root)`` writes iteration i's inputs:
    a closed-form pattern (every byte differs from its neighbours, so a
    misplaced block or byte is caught) shifted by i, at memory speed, so
    consecutive iterations move different data; ``clear(root)`` zeroes the
    outputs; ``ok(i, root)`` says whether this rank holds iteration i's
    result.  ``nbytes``: the buffers' bytes (for --off-cache's copies).
    """

    def __init__(self, calls, fill=None, clear=None, ok=None, nbytes=0):
        self.calls, self.run, self.nbytes = calls, calls[0], nbytes
        self.fill = fill or (lambda i, root: None)
        self.clear = clear or (lambda root: None)
        self.ok = ok or (lambda i, root: True)

    def check(self, i=0):
        """Iteration i's inputs, the outputs cleared, one call with root i mod roots: is the result right?"""
        root = i % len(self.calls)
        self.fill(i, root)
        self.clear(root)
        self.calls[root]()
        return bool(self.ok(i, root))


def pattern(nbytes, seed):
    """Deterministic bytes that differ per seed, so misplaced blocks are caught.  Byte j is
    (7 j + 31 seed + 1) mod 251: one period of 251 bytes tiled, at copy speed (computed
    per byte in int64, a 16 MiB pattern took 0.6 s, longer than its collective's timing)."""
    return np.resize(((np.arange(251) * 7 + seed * 31 + 1) % 251).astype(np.uint8), nbytes)


def shift(a, i):
    """Iteration i's offset to a's base content: bytes wrap (256 values), floats stay small exact integers."""
    return a.dtype.type(i % (256 if a.dtype == np.uint8 else 64))


def shifted(dst, base, i):
    np.add(base, shift(base, i), out=dst)


def holds(buf, want, i, times=1):
    """Whether buf is want shifted by i (times: ranks summed, each shifted by i)."""
    return bool(np.array_equal(buf, want + shift(want, i) * want.dtype.type(times)))


def bound(method, *args, algorithm=None):
    """The call the loop times: the bound method with its arguments, the
    algorithm positional and last (a partial with keywords builds a dict per
    call, ~0.1 us, which would tax the named columns only)."""
    return functools.partial(method, *args, *([algorithm] if algorithm else []))


def roots(comm, call):
    """call(root) for every root: the calls a rotating loop picks from."""
    return [call(r) for r in range(comm.Get_size())]


@op
def barrier(comm, nbytes, algorithm=None):
    return Case([bound(comm.Barrier, algorithm=algorithm)])


def broadcast(comm, nbytes, algorithm, spec=False):
    """A Bcast (spec: of [buf, MPI.BYTE]); every root sends the same base."""
    rank = comm.Get_rank()
    buf = np.zeros(nbytes, np.uint8)
    want = pattern(nbytes, 0)
    calls = roots(comm, lambda r: bound(comm.Bcast, [buf, MPI.BYTE] if spec else buf, r, algorithm=algorithm))

    def fill(i, root):
        if rank == root:
            shifted(buf, want, i)

    def clear(root):
        if rank != root:
            buf[:] = 0
    return Case(calls, fill, clear, lambda i, root: holds(buf, want, i), buf.nbytes)


@op
def bcast(comm, nbytes, algorithm=None):
    return broadcast(comm, nbytes, algorithm)


def exchange(comm, nbytes, algorithm, v):
    """nbytes from every rank to every rank: Alltoall, or (v) Alltoallv of
    mpi4py's full specs, as osu_alltoallv passes them.  Block j of rank r's
    input is pattern(r * size + j)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    send = np.zeros((size, nbytes), np.uint8)
    recv = np.zeros((size, nbytes), np.uint8)
    if v:
        counts, displs = [nbytes] * size, [nbytes * j for j in range(size)]
        run = bound(comm.Alltoallv, [send, (counts, displs), MPI.BYTE], [recv, (counts, displs), MPI.BYTE],
                    algorithm=algorithm)
    else:
        run = bound(comm.Alltoall, send, recv, algorithm=algorithm)
    base = np.array([pattern(nbytes, rank * size + j) for j in range(size)]).reshape(size, nbytes)
    want = np.array([pattern(nbytes, j * size + rank) for j in range(size)]).reshape(size, nbytes)
    return Case([run], lambda i, root: shifted(send, base, i), lambda root: recv.fill(0),
                lambda i, root: holds(recv, want, i), send.nbytes + recv.nbytes)


@op
def alltoall(comm, nbytes, algorithm=None):
    return exchange(comm, nbytes, algorithm, False)


@op
def alltoallv(comm, nbytes, algorithm=None):
    """Alltoallv of [buf, (counts, displs), MPI.BYTE] specs (osu_alltoallv's)."""
    return exchange(comm, nbytes, algorithm, True)


def every_block(comm, nbytes, call, root_only=False):
    """A collective that gives every rank (root_only: the root) every
    rank's nbytes block, pattern(rank); call(send, recv) -> the calls."""
    rank, size = comm.Get_rank(), comm.Get_size()
    send = np.zeros(nbytes, np.uint8)
    recv = np.zeros((size, nbytes), np.uint8)
    base = pattern(nbytes, rank)
    want = np.array([pattern(nbytes, j) for j in range(size)]).reshape(size, nbytes)
    gets = lambda root: not root_only or rank == root
    return Case(call(send, recv), lambda i, root: shifted(send, base, i), lambda root: recv.fill(0),
                lambda i, root: not gets(root) or holds(recv, want, i), send.nbytes + recv.nbytes)


@op
def allgather(comm, nbytes, algorithm=None):
    return every_block(comm, nbytes, lambda send, recv: [bound(comm.Allgather, send, recv, algorithm=algorithm)])


@op
def allgatherv(comm, nbytes, algorithm=None):
    """nbytes from every rank, with the counts given ([buf, counts])."""
    counts = [nbytes] * comm.Get_size()
    return every_block(comm, nbytes, lambda send, recv: [bound(comm.Allgatherv, send, [recv, counts],
                                                               algorithm=algorithm)])


@op
def gather(comm, nbytes, algorithm=None):
    """Every rank holds a receive buffer, so that the root can rotate."""
    return every_block(comm, nbytes, lambda send, recv: roots(
        comm, lambda r: bound(comm.Gather, send, recv, r, algorithm=algorithm)), root_only=True)


@op
def gatherv(comm, nbytes, algorithm=None):
    """Gather with the root's [buf, (counts, displs), MPI.BYTE] (osu_gatherv's)."""
    size = comm.Get_size()
    vec = ([nbytes] * size, [nbytes * j for j in range(size)])
    return every_block(comm, nbytes, lambda send, recv: roots(comm, lambda r: bound(
        comm.Gatherv, send, [recv, vec, MPI.BYTE], r, algorithm=algorithm)), root_only=True)


def scattered(comm, nbytes, algorithm, v):
    """Block j of the root's sendbuf is pattern(j); every rank holds one, so that the root can rotate;
    v: Scatterv of [buf, (counts, displs), MPI.BYTE] (osu_scatterv's)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    send = np.zeros((size, nbytes), np.uint8)
    recv = np.zeros(nbytes, np.uint8)
    base = np.array([pattern(nbytes, j) for j in range(size)]).reshape(size, nbytes)
    spec = [send, ([nbytes] * size, [nbytes * j for j in range(size)]), MPI.BYTE] if v else send
    calls = roots(comm, lambda r: bound(comm.Scatterv if v else comm.Scatter, spec, recv, r, algorithm=algorithm))

    def fill(i, root):
        if rank == root:
            shifted(send, base, i)
    return Case(calls, fill, lambda root: recv.fill(0), lambda i, root: holds(recv, base[rank], i),
                send.nbytes + recv.nbytes)


@op
def scatter(comm, nbytes, algorithm=None):
    return scattered(comm, nbytes, algorithm, False)


@op
def scatterv(comm, nbytes, algorithm=None):
    return scattered(comm, nbytes, algorithm, True)


#: The SUM operator of the library being measured (shmcoll.SUM or MPI.SUM): set by whoever runs OPS.
SUM = None
#: The MPI module of the library being measured (shmcoll.MPI or mpi4py's MPI): set by whoever runs OPS.
MPI = None


def reduction(comm, nbytes, method, dtype, algorithm, block=False, spec=False, runner=None):
    """A SUM reduction of nbytes of dtype per rank (block:
    Reduce_scatter_block, whose recvbuf is one rank's share; spec: of
    [buf, count, MPI.DOUBLE] specs; runner(*args) -> run: the call made
    another way, persistent or nonblocking).  Inputs are small integers,
    so every order of addition gives the same exact sum.  Reduce's root
    rotates."""
    rank, size = comm.Get_rank(), comm.Get_size()
    count = nbytes // np.dtype(dtype).itemsize
    send = np.zeros(count * (size if block else 1), dtype)
    recv = np.zeros(count, dtype)
    bufs = ([send, send.size, MPI.DOUBLE], [recv, count, MPI.DOUBLE]) if spec else (send, recv)
    if runner:
        calls = [runner(*bufs, SUM)]
    elif method == "Reduce":
        calls = roots(comm, lambda r: bound(comm.Reduce, *bufs, SUM, r, algorithm=algorithm))
    else:
        calls = [bound(getattr(comm, method), *bufs, SUM, algorithm=algorithm)]
    j = np.arange(send.size)
    base = ((j * 7 + rank) % 13).astype(dtype)
    want = sum((j * 7 + r) % 13 for r in range(size)).astype(dtype)
    if block:
        want = want[rank * count:(rank + 1) * count]
    gets = lambda root: method != "Reduce" or rank == root
    return Case(calls, lambda i, root: shifted(send, base, i), lambda root: recv.fill(0),
                lambda i, root: not gets(root) or holds(recv, want, i, size), send.nbytes + recv.nbytes)


@op
def allreduce(comm, nbytes, algorithm=None):
    """SUM over float64, nbytes per rank."""
    return reduction(comm, nbytes, "Allreduce", np.float64, algorithm)


@op
def allreduce_f32(comm, nbytes, algorithm=None):
    return reduction(comm, nbytes, "Allreduce", np.float32, algorithm)


@op
def reduce(comm, nbytes, algorithm=None):
    return reduction(comm, nbytes, "Reduce", np.float64, algorithm)


@op
def reduce_scatter(comm, nbytes, algorithm=None):
    """Reduce_scatter_block, float64: nbytes is each rank's block."""
    return reduction(comm, nbytes, "Reduce_scatter_block", np.float64, algorithm, block=True)


@op
def bcast_spec(comm, nbytes, algorithm=None):
    """Bcast of a buffer spec, [buf, MPI.BYTE]: to set beside bcast's plain array."""
    return broadcast(comm, nbytes, algorithm, spec=True)


@op
def allreduce_spec(comm, nbytes, algorithm=None):
    """Allreduce of [buf, count, MPI.DOUBLE] specs: to set beside allreduce."""
    return reduction(comm, nbytes, "Allreduce", np.float64, algorithm, spec=True)


@op
def allgatherv_spec(comm, nbytes, algorithm=None):
    """Allgatherv with mpi4py's full spec, [recv, (counts, displs), MPI.BYTE]: to set beside allgather."""
    size = comm.Get_size()
    counts, displs = [nbytes] * size, [nbytes * j for j in range(size)]
    return every_block(comm, nbytes, lambda send, recv: [bound(comm.Allgatherv, send, [recv, (counts, displs), MPI.BYTE],
                                                               algorithm=algorithm)])


def paired(comm, nbytes, even, odd):
    """An exchange between ranks 2k and 2k + 1 (osu_multi_lat's pairs; an
    odd count's last rank sits out): even(buf, other) on the even rank,
    odd(buf, other) on the odd one, which ends with the even rank's bytes
    in its buf."""
    rank, size = comm.Get_rank(), comm.Get_size()
    other = rank ^ 1
    buf = np.zeros(nbytes, np.uint8)
    if other >= size:
        return Case([lambda: None])
    want = pattern(nbytes, rank - rank % 2)

    def fill(i, root):
        if rank % 2 == 0:
            shifted(buf, want, i)

    def clear(root):
        if rank % 2:
            buf[:] = 0
    return Case([functools.partial(even if rank % 2 == 0 else odd, buf, other)], fill, clear,
                lambda i, root: holds(buf, want, i), buf.nbytes)


@op
def pingpong(comm, nbytes, algorithm=None):
    """osu_latency: a round trip of nbytes, Send then Recv on even ranks,
    Recv then Send on odd ones.  The time is the round trip; OSU prints
    half of it."""
    def even(buf, other):
        comm.Send(buf, other, 1)
        comm.Recv(buf, other, 1)

    def odd(buf, other):
        comm.Recv(buf, other, 1)
        comm.Send(buf, other, 1)
    return paired(comm, nbytes, even, odd)


WINDOW = 64


@op
def bw(comm, nbytes, algorithm=None):
    """osu_bw: a window of 64 Isends of nbytes from even ranks to the odd
    ones' 64 Irecvs (each into the same buffer, as osu_bw), Waitall, then a
    4-byte ack back.  The time is one window; the bandwidth 64 * nbytes / it."""
    ack = np.zeros(4, np.uint8)

    def even(buf, other):
        MPI.Request.Waitall([comm.Isend(buf, other, 100) for _ in range(WINDOW)])
        comm.Recv(ack, other, 101)

    def odd(buf, other):
        MPI.Request.Waitall([comm.Irecv(buf, other, 100) for _ in range(WINDOW)])
        comm.Send(ack, other, 101)
    return paired(comm, nbytes, even, odd)


@op
def allreduce_init(comm, nbytes, algorithm=None):
    """A persistent Allreduce (MPI-4 Allreduce_init once), each call Start + Wait: to set beside allreduce."""
    def runner(*args):
        req = comm.Allreduce_init(*args)

        def run():
            req.Start()
            req.Wait()
        return run
    return reduction(comm, nbytes, "Allreduce", np.float64, algorithm, runner=runner)


OVERLAP_WORK_S = 0.005


def nonblocking_allreduce(comm, nbytes, work_s):
    """Iallreduce, work_s of numpy work (wall time: OSU's dummy compute), Wait."""
    scratch = np.ones(4096)

    def runner(*args):
        def run():
            req = comm.Iallreduce(*args)
            if work_s:
                end = time.perf_counter() + work_s
                while time.perf_counter() < end:
                    np.multiply(scratch, 1.0, out=scratch)
            req.Wait()
        return run
    return reduction(comm, nbytes, "Allreduce", np.float64, None, runner=runner)


@op
def iallreduce(comm, nbytes, algorithm=None):
    """Iallreduce then Wait at once: the communication time that iallreduce_overlap hides."""
    return nonblocking_allreduce(comm, nbytes, 0)


@op
def iallreduce_overlap(comm, nbytes, algorithm=None):
    """Iallreduce, 5 ms of numpy work (wall time, as OSU's osu_iallreduce),
    then Wait.  overlap = 1 - (this - 5 ms) / iallreduce's time."""
    return nonblocking_allreduce(comm, nbytes, OVERLAP_WORK_S)


def calibrate(run, sync, share, min_time, max_iters, warmup=None):
    """Calls per repetition: N doubles until a batch lasts a quarter of
    ``min_time`` on rank 0, then scales to last ``min_time``; ``share(x)``
    returns rank 0's ``x`` on every rank, so all ranks run the same N (a
    mismatch would deadlock).  ``sync()`` is a barrier.  A warm-up of
    ``warmup`` calls follows (default N/10)."""
    n = 1
    while True:
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            run()
        dt = share(time.perf_counter() - t0)
        if dt >= min_time / 4 or n >= max_iters:
            n = int(min(max_iters, max(1, round(n * min_time / max(dt, 1e-9)))))
            break
        n = min(max_iters, n * 2)
    for _ in range(max(1, n // 10) if warmup is None else warmup):
        run()
    return n


def timed(run, sync, n):
    """Per-call seconds of one repetition of n calls."""
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        run()
    return (time.perf_counter() - t0) / n


def measure(run, sync, share, min_time, max_iters, reps):
    """This rank's per-call seconds for each of reps repetitions of the
    calibrated loop (the caller takes the max over ranks): shmcoll model's
    and tune's measure, the bench's back-to-back loop without its framed one."""
    n = calibrate(run, sync, share, min_time, max_iters)
    return [timed(run, sync, n) for _ in range(reps)]


#: The framed loop's iterations when -i does not set them: as many as a
#: repetition's calls, but at least FRAMED_MIN (a p50 and p99 of a few
#: samples mean little) and at most FRAMED (enough for a p99).
FRAMED, FRAMED_MIN = 1000, 32


def frames(n, cfg):
    return cfg.iters or min(cfg.max_iters, max(FRAMED_MIN, min(n, FRAMED)))


def sample(cases, sync, share, cfg):
    """This rank's measurement of one size.  ``reps``: each repetition's
    per-call seconds, N calls back to back (IMB's loop; N from -i, else
    calibrated to --min-time; -x calls of warm-up, else N/10); ``frames``:
    the framed loop's per-iteration seconds (OSU's), ``ok`` whether its
    checks passed."""
    run = cases[0].run
    if cfg.iters:
        n = cfg.iters
        for _ in range(n // 10 if cfg.warmup is None else cfg.warmup):
            run()
    else:
        n = calibrate(run, sync, share, cfg.min_time, cfg.max_iters, cfg.warmup)
    reps = [timed(run, sync, n) for _ in range(cfg.reps)]
    times, ok = framed(cases, sync, frames(n, cfg), cfg.data_varying, cfg.verify)
    return {"reps": reps, "n": n, "frames": times, "ok": ok}


def framed(cases, sync, iters, vary, verify):
    """OSU's loop: each call alone between barriers, timed alone, with
    iteration i's root i mod p and, for --off-cache, the next of ``cases``
    (IMB's off_cache: buffers cycled through more memory than the cache
    holds).  vary: iteration i's inputs written first (untimed; OSU's same
    data every iteration flatters shared-memory copies, as Open MPI's xhc
    authors found); verify: its result checked after (untimed; it implies
    vary, as a result left from the previous iteration would pass).  One
    untimed pass over every (buffers, root) first.  Returns this rank's
    per-iteration seconds and whether every check passed."""
    warm = len(cases) * len(cases[0].calls)
    times, good = [], True
    for i in range(1, warm + iters + 1):
        case = cases[i % len(cases)]
        root = i % len(case.calls)
        call = case.calls[root]
        if vary or verify:
            case.fill(i, root)
        sync()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
        if verify:
            good = case.ok(i, root) and good
    sync()
    return times[warm:], good


def copies(nbytes, cache):
    """--off-cache: how many sets of buffers to cycle so that together they
    pass twice ``cache`` bytes (at most 256: tiny messages stay cached)."""
    return 1 if not cache else max(1, min(256, math.ceil(2 * cache / max(nbytes, 64))))


def summary(frames):
    """OSU's figures from every rank's per-iteration seconds, in µs:
    avg/min/max over ranks of a rank's mean, and p50/p99 over iterations
    of the slowest rank's time in each; iters."""
    means = [statistics.fmean(f) * 1e6 for f in frames]
    worst = sorted(max(t) * 1e6 for t in zip(*frames))
    pick = lambda q: worst[min(len(worst) - 1, math.ceil(q * len(worst)) - 1)]
    return {"avg_us": statistics.fmean(means), "min_us": min(means), "max_us": max(means),
            "p50_us": pick(0.5), "p99_us": pick(0.99), "iters": len(worst)}


class Gloo:
    """torch.distributed's gloo backend behind the few mpi4py calls OPS and
    main use.  Reductions run in place on recvbuf (torch's all_reduce is
    in place): sendbuf is copied in first, as a user of it would."""

    def __init__(self):
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo")

    def Get_rank(self):
        return self.dist.get_rank()

    def Get_size(self):
        return self.dist.get_world_size()

    def Barrier(self):
        self.dist.barrier()

    def _inplace(self, send, recv):
        if send.size == recv.size:
            np.copyto(recv, send)
            return self.torch.from_numpy(recv)
        return self.torch.from_numpy(send.copy())

    def Allreduce(self, send, recv, op=None):
        self.dist.all_reduce(self._inplace(send, recv))

    def Reduce(self, send, recv, op=None, root=0):
        self.dist.reduce(self._inplace(send, recv), dst=root)

    def Reduce_scatter_block(self, send, recv, op=None):
        try:
            self.dist.reduce_scatter_tensor(self.torch.from_numpy(recv), self.torch.from_numpy(send))
        except RuntimeError as e:
            raise NotImplementedError(str(e).splitlines()[0]) from None

    def Allgather(self, send, recv):
        self.dist.all_gather_into_tensor(self.torch.from_numpy(recv).view(-1), self.torch.from_numpy(send))

    def bcast(self, x, root=0):
        box = [x]
        self.dist.broadcast_object_list(box, src=root)
        return box[0]

    def allreduce(self, x, op=None):
        """The logical and of x over ranks (main's only use)."""
        t = self.torch.tensor([int(x)])
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MIN)
        return bool(t.item())

    def reduce(self, x, op=None, root=0):
        """The max of x over ranks on root (main's only use)."""
        t = self.torch.tensor([float(x)], dtype=self.torch.float64)
        self.dist.reduce(t, dst=root, op=self.dist.ReduceOp.MAX)
        return t.item()


    def gather(self, x, root=0):
        """Every rank's x, in rank order, on root (None elsewhere)."""
        box = [None] * self.Get_size() if self.Get_rank() == root else None
        self.dist.gather_object(x, box, dst=root)
        return box


def parse_list(text, conv=str):
    return [conv(x) for x in text.split(",") if x]


def options(p):
    """The method's options, shared by this script and ``shmcoll bench``."""
    p.add_argument("--reps", type=int, default=3, help="timed repetitions of N calls back to back (default 3)")
    p.add_argument("--min-time", type=float, help="seconds a repetition lasts: N is calibrated to it (default 0.2)")
    p.add_argument("-i", "--iters", type=int, help="N, fixed (no calibration), and the framed loop's iterations")
    p.add_argument("-x", "--warmup", type=int, help="untimed calls before the repetitions (default N/10)")
    p.add_argument("--max-iters", type=int, default=1_000_000, help="the most N can be (default 1000000)")
    p.add_argument("--data-varying", action="store_true",
                   help="write new inputs before each framed iteration (untimed): OSU's same data flatters copies")
    p.add_argument("--verify", action="store_true",
                   help="check every framed iteration's result (untimed; implies --data-varying)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="barrier,bcast,alltoall")
    p.add_argument("--sizes", default="8,65536,16777216",
                   help="bytes: whole buffer for bcast, per-rank block for the others")
    options(p)
    p.add_argument("--off-cache", type=int, default=0, help="bytes of cache the framed loop's buffers pass")
    p.add_argument("--json")
    p.add_argument("--gloo", action="store_true", help="torch.distributed's gloo backend (RANK, WORLD_SIZE, "
                                                       "MASTER_ADDR, MASTER_PORT from the environment)")
    a = p.parse_args(argv)
    a.min_time = a.min_time or 0.2

    global SUM, MPI     # the ops' (their module globals)
    if a.gloo:
        comm = Gloo()
        library, land, most = f"torch {comm.torch.__version__} gloo", None, None
    else:
        from mpi4py import MPI
        comm, SUM, land, most = MPI.COMM_WORLD, MPI.SUM, MPI.LAND, MPI.MAX
        library = MPI.Get_library_version().splitlines()[0].strip("\0 ")
    results = []
    for name in parse_list(a.ops):
        for size in [0] if name == "barrier" else parse_list(a.sizes, int):
            try:
                case = OPS[name](comm, size)
                valid = case.check()
            except NotImplementedError as e:        # gloo lacks the operation
                print(f"{name}: {e}", flush=True)
                continue
            cases = [case] + [OPS[name](comm, size) for _ in range(copies(case.nbytes, a.off_cache) - 1)]
            got = sample(cases, comm.Barrier, lambda x: comm.bcast(x, root=0), a)
            valid = comm.allreduce(valid and got["ok"], op=land)
            worst = [comm.reduce(t, op=most, root=0) for t in got["reps"]]
            frames = comm.gather(got["frames"], root=0)
            if comm.Get_rank() == 0:
                us = statistics.median(worst) * 1e6
                results.append({"op": name, "size": size, "us": us, "valid": valid, "n": got["n"],
                                "reps_us": [t * 1e6 for t in worst], "stats": summary(frames)})
                print(f"{name:10s} {size:>10d} B {us:12.2f} us{'' if valid else '  INVALID'}", flush=True)
    if comm.Get_rank() == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump({"library": library, "nprocs": comm.Get_size(), "results": results}, f, indent=1)
    if a.gloo:      # torch aborts at exit ("terminate called ...") while a process group lives
        comm.dist.destroy_process_group()


if __name__ == "__main__":
    main()
