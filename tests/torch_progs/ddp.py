"""A DDP training loop (float64 MLP, synthetic data, small buckets) on one
backend (argv[1]); rank 0 prints the loss of each of 20 steps.  The first
layer's weight (128 KiB) has a bucket of its own, which the shmcoll backend
moves into the rank's arena at its second step (shmcoll/torch.py), and
with argv[2] "later" reduces while the backward pass goes on
(shmcoll.torch.ASYNC forced on)."""
import gc, sys, torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
backend = sys.argv[1]
if backend == "shmcoll":
    import shmcoll.torch
    shmcoll.torch.ASYNC = sys.argv[2:] == ["later"] or None
dist.init_process_group(backend)
r = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 512), nn.Tanh(), nn.Linear(512, 1)).double()
ddp = DDP(model, bucket_cap_mb=0.01)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
g = torch.Generator().manual_seed(100 + r)
X, W = torch.randn(256, 32, generator=g, dtype=torch.float64), torch.randn(32, 1, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
Y = X @ W
losses = []
for step in range(20):
    opt.zero_grad()
    loss = ((ddp(X) - Y) ** 2).mean()
    loss.backward()
    opt.step()
    t = loss.detach().clone(); dist.all_reduce(t); losses.append(t.item() / dist.get_world_size())
if r == 0:
    print(" ".join(f"{x:.17g}" for x in losses))
del ddp, opt
gc.collect()        # DDP's reducer (reference cycles) goes before its process group: gloo aborted at exit
dist.destroy_process_group()
