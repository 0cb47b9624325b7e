"""The hierarchical collectives against the same MPI library's own on the
same communicator, in the same run: `mpiexec -n 4 python -m
shmcoll.multinode.bench` (SHMCOLL_VIRTUAL_NODES=2,2 for two nodes of two
on one machine).  Per cell and round: Barrier, t0, N calls, t1; the time
per call is the maximum over ranks; hierarchical and MPI alternate within
each round, which goes first alternating between rounds; the ratio is the
median over rounds of their per-round ratio.  Rank 0 prints the table
(and --json FILE); "(MPI's own)" marks the sizes below FLAT_BELOW, where
the hierarchical call is MPI's own call (from C on plain arrays:
csrc/mpiflat.c), so its ratio shows what mpi4py's handling costs and
the noise.  SHMCOLL_FLAT_BELOW=0
times the legs at every size."""
import argparse
import json
import sys
import time

import numpy as np

OPS = ("barrier", "bcast", "reduce", "allreduce", "allgather", "gather", "scatter", "alltoall",
       "reduce_scatter_block", "pingpong", "pingpong_across")
# point-to-point through `from shmcoll import MPI` (its COMM_WORLD): rank 0
# and its node-mate (shmcoll's shared memory), rank 0 and the next node's
# first rank (MPI's, through the face's checks); the others wait
P2P = ("pingpong", "pingpong_across")
SIZES = "8,64,1K,16K,64K,256K,1M,4M,16M"


def _size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B")
    return int(t[:-1]) * units[t[-1]] if t and t[-1] in units else int(t)


def _call(comm, op, n, p, MPI, peer=1):
    """A zero-argument call of op on comm with n bytes (the whole buffer
    for Bcast and the reductions, one rank's block for the others, each
    message of a ping-pong with peer)."""
    k = max(n // 8, 1) if op != "barrier" else 0
    if op in P2P:
        me, a = comm.Get_rank(), np.ones(k)
        if me == 0:
            return lambda: (comm.Send(a, peer, 1), comm.Recv(a, peer, 1))
        if me == peer:
            return lambda: (comm.Recv(a, 0, 1), comm.Send(a, 0, 1))
        return lambda: None
    a, b = np.ones(k), np.zeros(k * p)
    if op == "barrier":
        return comm.Barrier
    if op == "bcast":
        return lambda: comm.Bcast(a, root=0)
    if op == "reduce":
        return lambda: comm.Reduce(a, b[:k], op=MPI.SUM, root=0)
    if op == "allreduce":
        return lambda: comm.Allreduce(a, b[:k], op=MPI.SUM)
    if op == "allgather":
        return lambda: comm.Allgather(a, b)
    if op == "gather":
        return lambda: comm.Gather(a, b, root=0)
    if op == "scatter":
        return lambda: comm.Scatter(b, a, root=0)
    if op == "alltoall":
        s = np.ones(k * p)
        return lambda: comm.Alltoall(s, b)
    if op == "reduce_scatter_block":
        s = np.ones(k * p)
        return lambda: comm.Reduce_scatter_block(s, a, op=MPI.SUM)
    raise ValueError(f"unknown collective {op!r}; one of {', '.join(OPS)}")


def _time(world, fn, reps):
    world.Barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t = (time.perf_counter() - t0) / reps
    return world.allreduce(t, op=_mpi().MAX)


def _mpi():
    from mpi4py import MPI
    return MPI


def _reps(world, fn, min_time):
    """Calls per timing so that one takes about min_time (agreed by all)."""
    n = 1
    while True:
        t = _time(world, fn, n)
        if t * n >= min_time / 4 or n >= 1 << 20:
            return max(1, int(min(n * min_time / max(t * n, 1e-9), 1 << 20)))
        n *= 4


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m shmcoll.multinode.bench", description=__doc__)
    ap.add_argument("ops", nargs="*", default=list(OPS))
    ap.add_argument("--sizes", default=SIZES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.05)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    MPI = _mpi()
    import shmcoll
    world = MPI.COMM_WORLD
    hier = shmcoll.from_mpi(world)
    p = world.Get_size()
    face = None
    if any(op in P2P for op in a.ops):
        from .face import module
        face = module("shmcoll.MPI").COMM_WORLD
    across = int(hier.starts[1]) if len(hier.starts) > 1 else 1
    rows = []
    for op in a.ops:
        for n in ([0] if op == "barrier" else [_size(x) for x in a.sizes.split(",")]):
            if op in P2P:
                peer = 1 if op == "pingpong" else across
                calls = {"shmcoll": _call(face, op, n, p, MPI, peer), "mpi": _call(world, op, n, p, MPI, peer)}
            else:
                calls = {"shmcoll": _call(hier, op, n, p, MPI), "mpi": _call(world, op, n, p, MPI)}
            for fn in calls.values():
                fn()
            reps = {k: _reps(world, fn, a.min_time) for k, fn in calls.items()}
            times = {k: [] for k in calls}
            for r in range(a.rounds):       # the order alternates: the call after the other's finds the caches its way
                for k, fn in (calls.items() if r % 2 == 0 else reversed(calls.items())):
                    times[k].append(_time(world, fn, reps[k]))
            ratio = float(np.median(np.array(times["shmcoll"]) / np.array(times["mpi"])))
            legs = op in P2P or n >= hier._below[op.replace("_block", "")]
            row = {"op": op, "bytes": n, "shmcoll_us": 1e6 * float(np.median(times["shmcoll"])),
                   "mpi_us": 1e6 * float(np.median(times["mpi"])), "ratio": ratio,
                   "path": ("shmcoll" if op == "pingpong" else "MPI's") if op in P2P
                   else "legs" if legs else "MPI's own"}
            rows.append(row)
            if world.Get_rank() == 0:
                print(f"{op:>21} {n:>9} B  shmcoll {row['shmcoll_us']:10.2f} us  MPI {row['mpi_us']:10.2f} us  "
                      f"ratio {ratio:5.2f}  ({row['path']})", flush=True)
    if world.Get_rank() == 0 and a.json:
        layout = [int(c) for c in hier.counts]
        with open(a.json, "w") as f:
            json.dump({"library": MPI.Get_library_version().splitlines()[0], "ranks": p, "nodes": layout,
                       "argv": sys.argv, "rows": rows}, f, indent=1)
    if face is not None:
        face.route.close()
        face.hier.Free(keep=True)
    hier.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
