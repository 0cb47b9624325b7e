"""Smoke test of an installed shmcoll (CI runs it from a fresh virtualenv
holding only the wheel and its dependencies, from a directory outside the
source tree).  Public API only: shmcoll.launch, shmcoll.algorithms and the
communicator's collectives.

On 2 and 3 ranks, every algorithm of every collective (and the automatic
choice) against numpy references: Barrier (no rank leaves before all have
arrived, seen through marker files), Bcast of 0 B, 1 B, 100 KB and 3 MB from
every root, Alltoall blocks of 0 B to 1 MB, Allgather / Gather / Scatter blocks of 0 B
to 1 MB + 3 from every root, Allgatherv, and the pickled objects.
Finally nothing may be left in /dev/shm.  Exit status 0 when all pass."""
import os
import sys
import tempfile
import time

import numpy as np

import shmcoll

TREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BCAST_BYTES = [0, 1, 100_000, 3_000_000]
ALLTOALL_BYTES = [0, 1, 1000, 100_000, 1_000_000]     # per block
GATHER_BYTES = [0, 7, 100_000, 1_000_003]             # per block
TIMEOUT = 600


def ref(nbytes, *salt):
    """The data named by salt (root, source, destination, ...)."""
    return np.random.default_rng([nbytes, *salt]).integers(0, 256, nbytes, dtype=np.uint8)


def algs(op):
    return [None] + shmcoll.algorithms(op)       # None: the automatic choice


def job(comm, markers):
    n, me, bad = comm.size, comm.rank, []

    # Barrier: each rank leaves a marker and must see every rank's after it
    for alg in algs("barrier"):
        for rnd in range(3):
            if me == rnd % n:
                time.sleep(0.05)                 # arrive late: the others must wait for it
            open(os.path.join(markers, f"{alg}.{rnd}.{me}"), "w").close()
            comm.Barrier(algorithm=alg)
            missing = [r for r in range(n) if not os.path.exists(os.path.join(markers, f"{alg}.{rnd}.{r}"))]
            if missing:
                bad.append(f"Barrier {alg} round {rnd}: rank {me} left before ranks {missing} arrived")

    # Bcast: every size, every root, every algorithm; also as float64
    for alg in algs("bcast"):
        for nbytes in BCAST_BYTES:
            for root in range(n):
                want = ref(nbytes, root, 1)
                buf = want.copy() if me == root else np.full(nbytes, 0xA5, np.uint8)
                comm.Bcast(buf, root=root, algorithm=alg)
                if not np.array_equal(buf, want):
                    bad.append(f"Bcast {alg} {nbytes} B root {root}: rank {me} got wrong data "
                               f"(first difference at byte {int(np.argmax(buf != want))})")
        want = np.linspace(-1, 1, 12_345)
        buf = want.copy() if me == n - 1 else np.zeros_like(want)
        comm.Bcast(buf, root=n - 1, algorithm=alg)
        if not np.array_equal(buf, want):
            bad.append(f"Bcast {alg} float64 root {n - 1}: rank {me} got wrong data")

    # Alltoall: block i of my send goes to rank i; block i of my receive came from rank i
    for alg in algs("alltoall"):
        for nbytes in ALLTOALL_BYTES:
            send = np.stack([ref(nbytes, me, dst, 2) for dst in range(n)])
            recv = np.full_like(send, 0xA5)
            comm.Alltoall(send, recv, algorithm=alg)
            want = np.stack([ref(nbytes, src, me, 2) for src in range(n)])
            if not np.array_equal(recv, want):
                rows = [s for s in range(n) if not np.array_equal(recv[s], want[s])]
                bad.append(f"Alltoall {alg} {nbytes} B blocks: rank {me} got wrong blocks from ranks {rows}")
        send = np.arange(n * 7, dtype=np.int32).reshape(n, 7) + 1000 * me
        recv = np.empty_like(send)
        comm.Alltoall(send, recv, algorithm=alg)
        want = np.stack([np.arange(7, dtype=np.int32) + 7 * me + 1000 * src for src in range(n)])
        if not np.array_equal(recv, want):
            bad.append(f"Alltoall {alg} int32: rank {me} got wrong data")

    # Allgather / Gather / Scatter: block r is rank r's, every algorithm and root
    for nbytes in GATHER_BYTES:
        for alg in algs("allgather"):
            recv = np.full((n, nbytes), 0xA5, np.uint8)
            comm.Allgather(ref(nbytes, me, 5), recv, algorithm=alg)
            if not all(np.array_equal(recv[q], ref(nbytes, q, 5)) for q in range(n)):
                bad.append(f"Allgather {alg} {nbytes} B: rank {me} got wrong blocks")
        for root in range(n):
            for alg in algs("gather"):
                recv = np.full((n, nbytes), 0xA5, np.uint8) if me == root else None
                comm.Gather(ref(nbytes, me, root, 6), recv, root, algorithm=alg)
                if me == root and not all(np.array_equal(recv[q], ref(nbytes, q, root, 6)) for q in range(n)):
                    bad.append(f"Gather {alg} {nbytes} B root {root}: wrong blocks")
            for alg in algs("scatter"):
                send = np.stack([ref(nbytes, q, root, 7) for q in range(n)]) if me == root else None
                recv = np.full(nbytes, 0xA5, np.uint8)
                comm.Scatter(send, recv, root, algorithm=alg)
                if not np.array_equal(recv, ref(nbytes, me, root, 7)):
                    bad.append(f"Scatter {alg} {nbytes} B root {root}: rank {me} got a wrong block")
    counts = [3 * q + 1 for q in range(n)]
    recv = np.zeros(sum(counts), np.int32)
    comm.Allgatherv(np.full(counts[me], me, np.int32), [recv, counts, np.int32])
    if not np.array_equal(recv, np.repeat(np.arange(n, dtype=np.int32), counts)):
        bad.append(f"Allgatherv: rank {me} got {recv}")
    if comm.allgather(("x", me)) != [("x", q) for q in range(n)]:
        bad.append(f"allgather: rank {me} got wrong objects")

    # reductions: the C kernels of the wheel, every algorithm, against numpy
    for count in (1, 1000, 300000):
        x = np.arange(count, dtype=np.float64) * (me + 1)
        want = np.arange(count, dtype=np.float64) * (n * (n + 1) // 2)
        for alg in algs("allreduce"):
            recv = np.zeros(count)
            comm.Allreduce(x, recv, shmcoll.SUM, algorithm=alg)
            if not np.array_equal(recv, want):
                bad.append(f"Allreduce {alg} x{count}: rank {me} got wrong sums")
        for alg in algs("reduce"):
            recv = np.zeros(count)
            comm.Reduce(x, recv, shmcoll.SUM, n - 1, algorithm=alg)
            if me == n - 1 and not np.array_equal(recv, want):
                bad.append(f"Reduce {alg} x{count}: wrong sums")
        recv = np.zeros(count, np.int32)
        comm.Scan(np.full(count, me + 1, np.int32), recv, shmcoll.MAX)
        if not (recv == me + 1).all():
            bad.append(f"Scan MAX x{count}: rank {me} got wrong maxima")
    if comm.allreduce(me, shmcoll.SUM) != n * (n - 1) // 2:
        bad.append(f"allreduce: rank {me} got a wrong sum")

    # pickled objects
    for root in range(n):
        want = {"root": root, "list": [1, 2.5, "three"], "array": ref(5000, root, 3)}
        got = comm.bcast(want if me == root else None, root=root)
        if not (got["root"] == root and got["list"] == want["list"] and np.array_equal(got["array"], want["array"])):
            bad.append(f"bcast root {root}: rank {me} got {got!r:.200}")
    objs = [{"from": me, "to": dst, "data": ref(100 * (dst + 1), me, dst, 4)} for dst in range(n)]
    got = comm.alltoall(objs)
    for src, o in enumerate(got):
        if not (o["from"] == src and o["to"] == me and np.array_equal(o["data"], ref(100 * (me + 1), src, me, 4))):
            bad.append(f"alltoall: rank {me} got a wrong object from rank {src}")

    comm.Barrier()
    return bad


def shm():
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def doubled(a):
    return a * 2


def pool_failures():
    """shmcoll.Pool from the wheel: tasks, an array through the rings, a run."""
    a = np.arange(1 << 20, dtype=np.float64)
    with shmcoll.Pool(2) as pool:
        out = [] if pool.map(abs, range(-500, 500)) == [abs(x) for x in range(-500, 500)] else ["Pool.map"]
        out += [] if np.array_equal(pool.submit(doubled, a).result(TIMEOUT), a * 2) else ["Pool.submit array"]
        out += [] if pool.run(total, 5) == [11, 11] else ["Pool.run"]  # (0 + 5) + (1 + 5)
    print(f"Pool: {len(out)} failures", flush=True)
    return out


def total(comm, k):
    return comm.allreduce(comm.rank + k)


def main():
    where = os.path.dirname(os.path.abspath(shmcoll.__file__))
    print(f"shmcoll {shmcoll.__version__} from {where}", flush=True)
    if where.startswith(TREE + os.sep):
        print(f"FAIL: shmcoll was imported from the source tree {TREE}, not an installed wheel")
        return 1
    before, failures = shm(), []
    for n in (2, 3):
        t = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="shmcoll-smoke-") as markers:
            results = shmcoll.launch(job, n, args=(markers,), timeout=TIMEOUT)
        failures += [f"{n} ranks: {f}" for bad in results for f in bad]
        print(f"{n} ranks: {sum(map(len, results))} failures in {time.monotonic() - t:.1f} s", flush=True)
    failures += pool_failures()
    left = shm() - before
    deadline = time.monotonic() + 2
    while left and time.monotonic() < deadline:    # only a name that stays is a leak
        time.sleep(0.05)
        left &= shm()
    if left:
        failures.append(f"left in /dev/shm: {sorted(left)}")
    for f in failures:
        print("FAIL:", f)
    print("wheel smoke test:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
