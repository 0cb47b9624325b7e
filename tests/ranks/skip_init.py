"""Rank $SKIP_RANK (default: the last) exits with status 0 at once, without
ever calling shmcoll.init(); the others init and wait in a Barrier; either
must raise PeerFailure naming that rank instead of waiting forever.  Each
waiting rank prints one line saying what it caught, then re-raises."""
import os

skip = int(os.environ.get("SKIP_RANK", int(os.environ["SHMCOLL_SIZE"]) - 1))
if int(os.environ["SHMCOLL_RANK"]) == skip:
    raise SystemExit(0)

import shmcoll  # noqa: E402

rank = int(os.environ["SHMCOLL_RANK"])
try:
    comm = shmcoll.init()       # can see the abort already
    comm.Barrier()
except shmcoll.PeerFailure as e:
    os.write(1, f"rank {rank} caught {type(e).__name__} blaming rank {e.rank}: {e}\n".encode())
    raise
os.write(1, f"rank {rank} passed a barrier it should not have\n".encode())
