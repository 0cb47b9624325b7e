"""Rank 1 fails ($FAIL_HOW: raise | exit7 | kill); the others wait in a
Barrier and must fail too instead of hanging."""
import os
import sys

import shmcoll

comm = shmcoll.init()
how = os.environ.get("FAIL_HOW", "raise")
if comm.rank == 1:
    if how == "raise":
        raise RuntimeError("rank 1 fails on purpose")
    if how == "exit7":
        sys.exit(7)
    if how == "kill":
        os.kill(os.getpid(), 9)
comm.Barrier()
print(f"rank {comm.rank} passed a barrier it should not have", flush=True)
