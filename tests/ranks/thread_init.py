"""The ranks in $THREAD_RANKS (comma-separated; default: all) call
shmcoll.init() from a threading.Thread that then exits; afterwards every
rank runs collectives with its peers, which must all succeed: the rank's
liveness must not end with the thread that registered it.  The first of
those ranks arrives late at the first collectives, so its peers wait on it
for many liveness periods ($SHMCOLL_LIVENESS_NS) and check that it lives.
Prints one line per rank."""
import os
import threading
import time

import numpy as np

import shmcoll

rank, size = int(os.environ["SHMCOLL_RANK"]), int(os.environ["SHMCOLL_SIZE"])
wanted = os.environ.get("THREAD_RANKS", "")
threaded = [int(r) for r in wanted.split(",")] if wanted else list(range(size))

if rank in threaded:
    box = []
    t = threading.Thread(target=lambda: box.append(shmcoll.init()), name="init-thread")
    t.start()
    t.join()
    assert not t.is_alive() and len(box) == 1
    comm = box[0]
    assert shmcoll.init() is comm
else:
    comm = shmcoll.init()

if rank == threaded[0]:
    # not synchronisation: keeps the peers waiting on this rank (whose init
    # thread is gone) for many liveness periods, so they check it is alive
    time.sleep(float(os.environ.get("LATE_S", "0.5")))
for i in range(3):
    comm.Barrier()
    buf = np.arange(50_000, dtype=np.int64) * (i + 1) if rank == i % size else np.zeros(50_000, np.int64)
    comm.Bcast(buf, root=i % size)
    assert (buf == np.arange(50_000) * (i + 1)).all()
    send = np.array([[rank * 100 + d + i] * 9 for d in range(size)], np.int32)
    recv = np.empty_like(send)
    comm.Alltoall(send, recv)
    assert (recv == np.array([[s * 100 + rank + i] * 9 for s in range(size)])).all()
    assert comm.bcast({"i": i}, root=size - 1) == {"i": i}
comm.Barrier()
os.write(1, f"rank {rank} of {size} ok ({'thread' if rank in threaded else 'main'} init)\n".encode())
