"""Run under mpiexec with SHMCOLL_VIRTUAL_NODES that do not add up: every
rank must refuse alike (a ValueError), none wait for the others."""
from mpi4py import MPI

import shmcoll

try:
    shmcoll.from_mpi(MPI.COMM_WORLD)
except ValueError as e:
    assert "SHMCOLL_VIRTUAL_NODES" in str(e), e
    refused = True
else:
    refused = False
every = MPI.COMM_WORLD.gather(refused)
if MPI.COMM_WORLD.Get_rank() == 0:
    print("refused on", sum(every), "of", len(every), flush=True)
