"""Writes its pid to $SHMCOLL_TEST_DIR/rank<r>.pid, then hangs: rank 0
sleeps, the others wait for it in a Barrier.  $SHMCOLL_TEST_HOLD: bytes
rank 0 holds (touched), so that its death takes long to be reported."""
import os
import time

import shmcoll

comm = shmcoll.init()
if comm.rank == 0:
    held = bytearray(int(os.environ.get("SHMCOLL_TEST_HOLD", "0")))
d = os.environ["SHMCOLL_TEST_DIR"]
tmp = os.path.join(d, f".rank{comm.rank}.tmp")
with open(tmp, "w") as f:
    f.write(str(os.getpid()))
os.rename(tmp, os.path.join(d, f"rank{comm.rank}.pid"))
if comm.rank == 0:
    time.sleep(600)
comm.Barrier()
