"""Rank 0 makes one Bcast more than the others, as root (it waits on no
one): the job must not end as a success."""
import numpy as np

import shmcoll

comm = shmcoll.init()
x = np.arange(4.0) if comm.rank == 0 else np.zeros(4)
for _ in range(2 + (comm.rank == 0)):
    comm.Bcast(x, root=0)
