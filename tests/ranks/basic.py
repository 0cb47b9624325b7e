"""A well-behaved rank for `shmcoll run`: checks its identity, its pinning
($EXPECT_AFFINITY: JSON list of CPU lists, one per rank) and a few
collectives, then prints one line."""
import json
import os

import numpy as np

import shmcoll

comm = shmcoll.init()
rank, size = int(os.environ["SHMCOLL_RANK"]), int(os.environ["SHMCOLL_SIZE"])
assert (comm.rank, comm.size) == (rank, size), (comm.rank, comm.size, rank, size)
assert (comm.Get_rank(), comm.Get_size()) == (rank, size)
assert shmcoll.init() is comm

expect = json.loads(os.environ.get("EXPECT_AFFINITY", "null"))
if expect is not None:
    got = sorted(os.sched_getaffinity(0))
    assert got == expect[rank], f"rank {rank} pinned to {got}, expected {expect[rank]}"

n = 5000
buf = np.arange(n, dtype=np.float64) * 3 + 1 if rank == 0 else np.zeros(n)
comm.Bcast(buf, root=0)
assert (buf == np.arange(n) * 3 + 1).all()
comm.Barrier()
send = np.array([[rank * 100 + d] * 7 for d in range(size)], np.int32)
recv = np.empty_like(send)
comm.Alltoall(send, recv)
assert (recv == np.array([[s * 100 + rank] * 7 for s in range(size)])).all()
assert comm.bcast({"from": size - 1}, root=size - 1) == {"from": size - 1}
comm.Barrier()
os.write(1, f"rank {rank} of {size} ok\n".encode())     # one write: lines never interleave
