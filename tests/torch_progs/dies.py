"""Rank 1 dies (SIGKILL) with Works it started in flight; rank 0's next
call raises that it died, and rank 0 then exits normally: its completion
thread, still waiting, is stopped before shmcoll frees the communicator
(it read the freed queue: SIGSEGV).  Started without torchrun, which
would kill rank 0 as soon as rank 1 died."""
import os, signal, torch, torch.distributed as dist
import shmcoll.torch

shmcoll.torch.ASYNC = True
dist.init_process_group("shmcoll")
r = dist.get_rank()
works = [dist.all_reduce(torch.ones(1 << 18), async_op=True) for _ in range(20)]
if r == 1:
    os.kill(os.getpid(), signal.SIGKILL)
try:
    dist.barrier()
except shmcoll.PeerFailure as e:
    print("raised", type(e).__name__, flush=True)
