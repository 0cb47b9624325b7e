"""rank argv[1] stops itself (SIGSTOP) for argv[2] seconds mid-loop; the job must carry on with right results."""
import os, signal, subprocess, sys, time
import numpy as np
from mpi4py import MPI
import shmcoll

h = shmcoll.from_mpi(MPI.COMM_WORLD, flat_below=0)
victim, secs = int(sys.argv[1]), float(sys.argv[2])
p, me = h.Get_size(), h.Get_rank()
t0 = time.time()
for i in range(60):
    if i == 20 and me == victim:
        subprocess.Popen(["sh", "-c", f"sleep {secs}; kill -CONT {os.getpid()}"])
        os.kill(os.getpid(), signal.SIGSTOP)
    x = np.full(1 << 12, float(me + i)); r = np.empty_like(x)
    h.Allreduce(x, r); assert r[0] == sum(range(p)) + p * i, (i, r[0])
    g = np.empty(x.size * p); h.Gather(x, g, root=i % p)
    if me == i % p: assert g[-1] == p - 1 + i
    b = x.copy(); h.Bcast(b, root=(i + 1) % p); assert b[0] == (i + 1) % p + i
print(f"rank {me} ok {time.time() - t0:.1f}s", flush=True)
