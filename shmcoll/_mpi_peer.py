"""Standalone mpi4py benchmark: the MPI peer that shmcoll is measured against.

Run it with a peer virtualenv's own launcher and interpreter, e.g.
``/tmp/peer-mpich/bin/mpiexec -n 2 -bind-to core /tmp/peer-mpich/bin/python -I
shmcoll/_mpi_peer.py --ops barrier,bcast --json out.json``.

It must never import shmcoll (the peer venv does not have it).  mpi4py is only
imported inside ``main`` so that ``shmcoll.bench`` can import this module and
reuse ``OPS`` and ``measure``: both sides then build, validate and time every
operation with literally the same code (the method of /work/shared/PEERS.md).
"""
import argparse
import functools
import json
import statistics
import time

import numpy as np

OPS = {}


def op(fn):
    """Register ``fn(comm, nbytes, algorithm=None) -> (run, check)`` under its name.

    ``run()`` performs the collective once on preallocated buffers; ``check()``
    runs it once on a known pattern and returns whether this rank's result
    matches numpy's.  ``algorithm`` goes to the collective when given (shmcoll's
    named columns; mpi4py never gets it).  Adding a collective is one more
    such function.
    """
    OPS[fn.__name__] = fn
    return fn


def pattern(nbytes, seed):
    """Deterministic bytes that differ per seed, so misplaced blocks are caught."""
    return ((np.arange(nbytes, dtype=np.int64) * 7 + seed * 31 + 1) % 251).astype(np.uint8)


def bound(method, *args, algorithm=None):
    """The call the loop times: the bound method with its arguments, the
    algorithm positional and last (a partial with keywords builds a dict per
    call, ~0.1 us, which would tax the named columns only)."""
    return functools.partial(method, *args, *([algorithm] if algorithm else []))


@op
def barrier(comm, nbytes, algorithm=None):
    return bound(comm.Barrier, algorithm=algorithm), (lambda: True)


def broadcast(comm, nbytes, algorithm, spec=False):
    """(run, check) of a Bcast from rank 0 (spec: of [buf, MPI.BYTE])."""
    buf = np.zeros(nbytes, np.uint8)
    want = pattern(nbytes, 0)
    run = bound(comm.Bcast, [buf, MPI.BYTE] if spec else buf, 0, algorithm=algorithm)

    def check():
        buf[:] = want if comm.Get_rank() == 0 else 0
        run()
        return bool(np.array_equal(buf, want))

    return run, check


@op
def bcast(comm, nbytes, algorithm=None):
    return broadcast(comm, nbytes, algorithm)


def exchange(comm, nbytes, algorithm, v):
    """(run, check) of nbytes from every rank to every rank: Alltoall, or
    (v) Alltoallv of mpi4py's full specs, as osu_alltoallv passes them."""
    rank, size = comm.Get_rank(), comm.Get_size()
    send = np.zeros((size, nbytes), np.uint8)
    recv = np.zeros((size, nbytes), np.uint8)
    if v:
        counts, displs = [nbytes] * size, [nbytes * j for j in range(size)]
        run = bound(comm.Alltoallv, [send, (counts, displs), MPI.BYTE], [recv, (counts, displs), MPI.BYTE],
                    algorithm=algorithm)
    else:
        run = bound(comm.Alltoall, send, recv, algorithm=algorithm)

    def check():
        for j in range(size):  # block j goes to rank j; seed encodes (src, dst)
            send[j] = pattern(nbytes, rank * size + j)
        recv[:] = 0
        run()
        return all(np.array_equal(recv[j], pattern(nbytes, j * size + rank)) for j in range(size))

    return run, check


@op
def alltoall(comm, nbytes, algorithm=None):
    return exchange(comm, nbytes, algorithm, False)


@op
def alltoallv(comm, nbytes, algorithm=None):
    """Alltoallv of [buf, (counts, displs), MPI.BYTE] specs (osu_alltoallv's)."""
    return exchange(comm, nbytes, algorithm, True)


def every_block(comm, nbytes, method, recv_spec, algorithm):
    """(run, check) of a collective that gives every rank every rank's
    nbytes block; recv_spec(recv) is the receive argument."""
    rank, size = comm.Get_rank(), comm.Get_size()
    send = np.zeros(nbytes, np.uint8)
    recv = np.zeros((size, nbytes), np.uint8)
    run = bound(method, send, recv_spec(recv), algorithm=algorithm)

    def check():
        send[:] = pattern(nbytes, rank)
        recv[:] = 0
        run()
        return all(np.array_equal(recv[j], pattern(nbytes, j)) for j in range(size))

    return run, check


@op
def allgather(comm, nbytes, algorithm=None):
    return every_block(comm, nbytes, comm.Allgather, lambda recv: recv, algorithm)


@op
def allgatherv(comm, nbytes, algorithm=None):
    """nbytes from every rank, with the counts given ([buf, counts])."""
    return every_block(comm, nbytes, comm.Allgatherv, lambda recv: [recv, [nbytes] * comm.Get_size()], algorithm)


@op
def gather(comm, nbytes, algorithm=None):
    rank, size = comm.Get_rank(), comm.Get_size()
    send = np.zeros(nbytes, np.uint8)
    recv = np.zeros((size, nbytes), np.uint8) if rank == 0 else None
    run = bound(comm.Gather, send, recv, 0, algorithm=algorithm)

    def check():
        send[:] = pattern(nbytes, rank)
        run()
        return rank != 0 or all(np.array_equal(recv[j], pattern(nbytes, j)) for j in range(size))

    return run, check


@op
def scatter(comm, nbytes, algorithm=None):
    rank, size = comm.Get_rank(), comm.Get_size()
    send = np.zeros((size, nbytes), np.uint8) if rank == 0 else None
    recv = np.zeros(nbytes, np.uint8)
    run = bound(comm.Scatter, send, recv, 0, algorithm=algorithm)

    def check():
        if rank == 0:
            for j in range(size):
                send[j] = pattern(nbytes, j)
        recv[:] = 0
        run()
        return bool(np.array_equal(recv, pattern(nbytes, rank)))

    return run, check


#: The SUM operator of the library being measured (shmcoll.SUM or MPI.SUM): set by whoever runs OPS.
SUM = None
#: The MPI module of the library being measured (shmcoll.MPI or mpi4py's MPI): set by whoever runs OPS.
MPI = None


def reduction(comm, nbytes, method, dtype, algorithm, block=False, spec=False, runner=None):
    """(run, check) of a SUM reduction of nbytes of dtype per rank (block:
    Reduce_scatter_block, whose recvbuf is one rank's share; spec: of
    [buf, count, MPI.DOUBLE] specs; runner(*args) -> run: the call made
    another way, persistent or nonblocking).  Inputs are small integers,
    so every order of addition gives the same exact sum."""
    rank, size = comm.Get_rank(), comm.Get_size()
    count = nbytes // np.dtype(dtype).itemsize
    send = np.zeros(count * (size if block else 1), dtype)
    recv = np.zeros(count, dtype)
    bufs = ([send, send.size, MPI.DOUBLE], [recv, count, MPI.DOUBLE]) if spec else (send, recv)
    args = bufs + (SUM,) + ((0,) if method == "Reduce" else ())
    run = runner(*args) if runner else bound(getattr(comm, method), *args, algorithm=algorithm)

    def check():
        j = np.arange(send.size)
        send[:] = (j * 7 + rank) % 13
        run()
        want = sum((j * 7 + r) % 13 for r in range(size)).astype(dtype)
        if block:
            want = want[rank * count:(rank + 1) * count]
        return (method == "Reduce" and rank != 0) or bool(np.array_equal(recv, want))

    return run, check


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
    return every_block(comm, nbytes, comm.Allgatherv, lambda recv: [recv, (counts, displs), MPI.BYTE], algorithm)


def paired(comm, nbytes, even, odd):
    """(run, check) of an exchange between ranks 2k and 2k + 1 (osu_multi_lat's
    pairs; an odd count's last rank sits out): even(buf, other) on the even
    rank, odd(buf, other) on the odd one, which ends with the even rank's
    bytes in its buf."""
    rank, size = comm.Get_rank(), comm.Get_size()
    other = rank ^ 1
    buf = np.zeros(nbytes, np.uint8)
    if other >= size:
        return (lambda: None), (lambda: True)
    run = functools.partial(even if rank % 2 == 0 else odd, buf, other)

    def check():
        buf[:] = pattern(nbytes, rank) if rank % 2 == 0 else 0
        run()
        return bool(np.array_equal(buf, pattern(nbytes, rank - rank % 2)))

    return run, check


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


def calibrate(run, sync, share, min_time, max_iters):
    """Calls per repetition: N doubles until a batch lasts a quarter of
    ``min_time`` on rank 0, then scales to last ``min_time``; ``share(x)``
    returns rank 0's ``x`` on every rank, so all ranks run the same N (a
    mismatch would deadlock).  ``sync()`` is a barrier.  A warm-up of N/10
    calls follows."""
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
    for _ in range(max(1, n // 10)):
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
    """This rank's per-call seconds for each repetition (the caller takes the max over ranks)."""
    n = calibrate(run, sync, share, min_time, max_iters)
    return [timed(run, sync, n) for _ in range(reps)]


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


def parse_list(text, conv=str):
    return [conv(x) for x in text.split(",") if x]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="barrier,bcast,alltoall")
    p.add_argument("--sizes", default="8,65536,16777216",
                   help="bytes: whole buffer for bcast, per-rank block for the others")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--min-time", type=float, default=0.2, help="seconds per repetition")
    p.add_argument("--max-iters", type=int, default=1_000_000)
    p.add_argument("--json")
    p.add_argument("--gloo", action="store_true", help="torch.distributed's gloo backend (RANK, WORLD_SIZE, "
                                                       "MASTER_ADDR, MASTER_PORT from the environment)")
    a = p.parse_args(argv)

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
                run, check = OPS[name](comm, size)
                valid = comm.allreduce(check(), op=land)
            except NotImplementedError as e:        # gloo lacks the operation
                print(f"{name}: {e}", flush=True)
                continue
            times = measure(run, comm.Barrier, lambda x: comm.bcast(x, root=0),
                            a.min_time, a.max_iters, a.reps)
            worst = [comm.reduce(t, op=most, root=0) for t in times]
            if comm.Get_rank() == 0:
                us = statistics.median(worst) * 1e6
                results.append({"op": name, "size": size, "us": us, "valid": valid,
                                "reps_us": [t * 1e6 for t in worst]})
                print(f"{name:10s} {size:>10d} B {us:12.2f} us{'' if valid else '  INVALID'}", flush=True)
    if comm.Get_rank() == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump({"library": library, "nprocs": comm.Get_size(), "results": results}, f, indent=1)
    if a.gloo:      # torch aborts at exit ("terminate called ...") while a process group lives
        comm.dist.destroy_process_group()


if __name__ == "__main__":
    main()
