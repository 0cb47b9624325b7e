"""Every torch.distributed collective on one backend (argv[1]); each rank
writes what it got to the file argv[2].RANK (tests/test_torch_backend.py
compares with gloo): lines of several KiB that two ranks print at once
interleave in torchrun's output."""
import os, sys, torch, torch.distributed as dist
backend = sys.argv[1]
if backend == "shmcoll":
    import shmcoll.torch
dist.init_process_group(backend)
r, n = dist.get_rank(), dist.get_world_size()
out = []
for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64):
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
        t = (torch.arange(6) + r + 1).to(dt); dist.all_reduce(t, op); out.append(("allreduce", str(dt), str(op), t.float().tolist()))
for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
    t = torch.arange(6) * 5 + 3 * r + 1; dist.all_reduce(t, op); out.append(("allreduce", "int64", str(op), t.tolist()))
for dt in (torch.float32, torch.float64, torch.bfloat16):
    t = (torch.arange(6) * 2 + r).to(dt)
    if backend == "gloo":       # gloo has no AVG: its SUM, divided as torch's AVG would
        dist.all_reduce(t); t.div_(n)
    else:
        dist.all_reduce(t, dist.ReduceOp.AVG)
    out.append(("allreduce", str(dt), "AVG", t.float().tolist()))
t = torch.arange(4.0) * (r + 1); dist.broadcast(t, 1); out.append(("bcast", t.tolist()))
t = torch.arange(3.0) + 10 * r; o = torch.empty(3 * n); dist.all_gather_into_tensor(o, t); out.append(("agit", o.tolist()))
ol = [torch.empty(3) for _ in range(n)]; dist.all_gather(ol, t); out.append(("ag", [x.tolist() for x in ol]))
i = torch.arange(2.0 * n) * (r + 1); o = torch.empty(2); dist.reduce_scatter_tensor(o, i); out.append(("rst", o.tolist()))
t = torch.arange(4.0) * (r + 1); dist.reduce(t, 0); out.append(("reduce", t.tolist() if r == 0 else None))
gl = [torch.empty(2) for _ in range(n)] if r == 0 else None; dist.gather(torch.full((2,), float(r)), gl, dst=0); out.append(("gather", [x.tolist() for x in gl] if r == 0 else None))
o = torch.empty(2); dist.scatter(o, [torch.full((2,), 5.0 + k) for k in range(n)] if r == 1 else None, src=1); out.append(("scatter", o.tolist()))
i = torch.arange(2.0 * n) + 100 * r; o = torch.empty(2 * n); dist.all_to_all_single(o, i); out.append(("a2a", o.tolist()))
dist.barrier()
big = torch.full((1 << 20,), float(r)); got = torch.empty(1 << 20)      # 4 MiB: past any eager limit
for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, big, (r + 1) % n), dist.P2POp(dist.irecv, got, (r - 1) % n)]):
    w.wait()
out.append(("ring", got[:2].tolist(), bool((got == got[0]).all())))
if backend == "shmcoll":         # AVG of integers: refused on every rank before anything changes (gloo sums them)
    t = torch.arange(4) + r
    try:
        dist.all_reduce(t, dist.ReduceOp.AVG)
    except ValueError:
        assert t.tolist() == [r, r + 1, r + 2, r + 3]
    else:
        raise AssertionError("AVG of integers was not refused")
futures = {"all_reduce": dist.all_reduce(torch.ones(2), async_op=True),
           "all_gather_into_tensor": dist.all_gather_into_tensor(torch.empty(2 * n), torch.ones(2), async_op=True),
           "all_gather": dist.all_gather([torch.empty(2) for _ in range(n)], torch.ones(2), async_op=True),
           "barrier": dist.barrier(async_op=True)}
out.append(("futures", [(k, [tuple(x.shape) for x in w.get_future().wait()]) for k, w in futures.items()]))
if r == 0: dist.send(torch.arange(3.0), 1)
if r == 1: t = torch.empty(3); dist.recv(t, 0); out.append(("p2p", t.tolist()))
if r == 0:      # from any source: whoever sends first; recv returns the sender
    got = []
    for _ in range(n - 1):
        t = torch.empty(3); src = dist.recv(t, tag=7); got.append((src, t.tolist()))
    out.append(("anysource", sorted(got)))
else:
    dist.send(torch.full((3,), 10.0 * r), 0, tag=7)
ins = [torch.full((3,), float(r)), torch.full((2,), r + 10.0)]
outs = [[torch.empty(3), torch.empty(2)] for _ in range(n)]
dist.all_gather_coalesced(outs, ins); out.append(("ag coalesced", [[x.tolist() for x in o] for o in outs]))
o = [torch.empty(2 * n) for _ in range(2)]
with dist._coalescing_manager():
    for k in range(2):
        dist.all_gather_into_tensor(o[k], torch.full((2,), r + 3.0 * k))
out.append(("agit coalesced", [x.tolist() for x in o]))
o = [torch.empty(2) for _ in range(2)]
with dist._coalescing_manager():
    for k in range(2):
        dist.reduce_scatter_tensor(o[k], torch.arange(2.0 * n) * (r + k + 1))
out.append(("rst coalesced", [x.tolist() for x in o]))
g = dist.new_group([0, 1]) if n > 1 else None
if r < 2:
    t = torch.ones(2) * (r + 1); dist.all_reduce(t, group=g); out.append(("group", t.tolist()))
with open(f"{sys.argv[2]}.{r}", "w") as f:
    f.write(repr(out))
dist.destroy_process_group()
