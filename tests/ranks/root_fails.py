"""Rank 0 raises right after a Bcast it is root of; rank 1 never reaches
that Bcast (stuck until the launcher ends the job)."""
import threading

import numpy as np

import shmcoll

comm = shmcoll.init()
x = np.arange(4.0)
if comm.rank == 0:
    comm.Bcast(x, root=0)
    raise RuntimeError("rank 0 fails after its last call")
threading.Event().wait()
