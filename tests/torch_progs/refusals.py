"""What gloo refuses, and what it takes that shmcoll refused, on one
backend (argv[1]); each rank writes what happened to the file
argv[2].RANK (tests/test_torch_backend.py compares with gloo).  Every
call that gloo refuses raises, on every rank, and leaves the group
usable: the next all_reduce gives its sum (a refusal inside shmcoll's
collective ended the communicator).  bool SUM and PRODUCT reduce as
gloo's (OR, AND), a small bfloat16 tensor goes by send/recv, gather's
future holds the gathered tensors as gloo's does, and strided tensors go
into every collective but all_to_all_single (where gloo gets them right,
as gloo; elsewhere against the sums: gloo reads a strided slice as
contiguous memory)."""
import sys

import torch
import torch.distributed as dist

backend = sys.argv[1]
if backend == "shmcoll":
    import shmcoll.torch  # noqa: F401
dist.init_process_group(backend)
r, n = dist.get_rank(), dist.get_world_size()
out = []
bad = {
    "band_of_float": lambda: dist.all_reduce(torch.ones(3), dist.ReduceOp.BAND),
    "all_gather_into_larger": lambda: dist.all_gather([torch.empty(5) for _ in range(n)], torch.ones(1)),
    "all_gather_into_tensor_size": lambda: dist.all_gather_into_tensor(torch.empty(n + 1), torch.ones(1)),
    "all_gather_into_tensor_dtype": lambda: dist.all_gather_into_tensor(torch.empty(n, dtype=torch.int64),
                                                                        torch.ones(1)),
    "reduce_scatter_tensor_dtypes": lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * n, dtype=torch.int64)),
    "all_to_all_single_splits": lambda: dist.all_to_all_single(torch.empty(2 * n), torch.ones(2 * n),
                                                               [2] * n, [1] * n),
    "all_to_all_single_strided": lambda: dist.all_to_all_single(torch.empty(2 * n, 3), torch.ones(3, 2 * n).t()),
    "send_strided": lambda: dist.send(torch.ones(3, 2).t(), (r + 1) % n),
}


def coalesced_bool_and_float():           # one reduction of both: gloo refuses tensors of two types
    with dist._coalescing_manager():
        dist.all_reduce(torch.tensor([r == 0, False]))
        dist.all_reduce(torch.tensor([1.5, 2.0 + r]))


bad["coalesced_bool_and_float"] = coalesced_bool_and_float
for name, call in bad.items():
    try:
        call()
        what = "returned"
    except Exception:       # gloo's are RuntimeError or ValueError; what matters is that it raised
        what = "raised"
    t = torch.full((2,), float(r + 1))
    dist.all_reduce(t)
    out.append((name, what, t.tolist()))
for op in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MAX, dist.ReduceOp.MIN):
    t = torch.tensor([r == 0, True, False, r % 2 == 1])
    dist.all_reduce(t, op)
    out.append(("bool", str(op), t.tolist()))
    t = torch.tensor([r == 0, True, False, r % 2 == 1])
    dist.reduce(t, 0, op)
    out.append(("bool reduce", str(op), t.tolist() if r == 0 else None))
t = (torch.arange(12.0).reshape(3, 4) + r).t()         # strided: gloo reduces it right
dist.all_reduce(t)
out.append(("transposed all_reduce", t.tolist()))
# tensors that require grad take the result as their data (gloo's AVG
# raises there: its division is an in-place op on a leaf; shmcoll's is
# checked against the sums)
for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG) if backend == "shmcoll" else (dist.ReduceOp.SUM,):
    x = torch.empty_strided((4, 3), (1, 4), requires_grad=True)
    with torch.no_grad():
        x.copy_((torch.arange(12.0).reshape(3, 4) + r).t())
    dist.all_reduce(x, op)
    v = torch.ones(3, 4, requires_grad=True).t()      # a view of one
    dist.all_reduce(v, op)
    c = torch.full((4,), float(r), requires_grad=True)
    dist.all_reduce(c, op)
    if op == dist.ReduceOp.SUM:
        out.append(("requires grad", x.tolist(), v.tolist(), c.tolist()))
    else:
        k = sum(range(n)) / n
        assert torch.equal(x.detach(), (torch.arange(12.0).reshape(3, 4) + k).t()) and (v == 1).all() and \
            (c == k).all(), (x, v, c)


def tr(base=0):         # a transposed (strided) 4 x 3 tensor of this rank's
    return (torch.arange(12.0).reshape(3, 4) + 100 * r + base).t()


def zt(rows=4):
    return torch.zeros(3, rows).t()


outs = [zt() for _ in range(n)]                     # the other collectives take strided tensors too, as gloo's
dist.all_gather(outs, tr())
out.append(("transposed all_gather", [o.tolist() for o in outs]))
o = zt(4 * n)
dist.all_gather_into_tensor(o, tr())
out.append(("transposed all_gather_into_tensor", o.tolist()))
outs = [zt() for _ in range(n)] if r == 0 else None
dist.gather(tr(), outs, dst=0)
out.append(("transposed gather", [o.tolist() for o in outs] if r == 0 else None))
o = zt()
dist.scatter(o, [tr(10 * i) for i in range(n)] if r == n - 1 else None, src=n - 1)
out.append(("transposed scatter", o.tolist()))
o = zt()
dist.reduce_scatter(o, [tr(10 * i) for i in range(n)])
out.append(("transposed reduce_scatter", o.tolist()))
o = zt()
dist.reduce_scatter_tensor(o, (torch.arange(12.0 * n).reshape(3, 4 * n) + r).t())
out.append(("transposed reduce_scatter_tensor", o.tolist()))
outs = [zt() for _ in range(n)]
try:
    dist.all_to_all(outs, [tr(10 * i) for i in range(n)])
except RuntimeError as e:       # torch 2.11's gloo has none: what it must give, from rank q's tr(10 * r)
    if backend != "gloo" or "does not support alltoall" not in str(e):
        raise
    outs = [(torch.arange(12.0).reshape(3, 4) + 100 * q + 10 * r).t() for q in range(n)]
out.append(("transposed all_to_all", [o.tolist() for o in outs]))
if backend == "shmcoll":        # strided slices, which gloo reduces as if contiguous: against the sums
    base = torch.zeros(4, 6)
    t = base[:, ::2]
    t.copy_(torch.arange(12.0).reshape(4, 3) * (r + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.arange(12.0).reshape(4, 3) * sum(range(1, n + 1))) and not base[:, 1::2].any()
    base = torch.zeros(4, 6)
    t = base[1:, ::3]
    t.copy_(torch.full((3, 2), 7.0) if r == n - 1 else torch.zeros(3, 2))
    dist.broadcast(t, n - 1)
    assert (t == 7).all() and base.sum() == 42
    base = torch.zeros(4, 6)
    t = base.t()[::2]
    t.copy_(torch.ones(3, 4) * (r + 1))
    dist.reduce(t, 0, dist.ReduceOp.MAX)
    assert r != 0 or (t == n).all() and base.sum() == 12 * n
    o = torch.zeros(3, 2 * n).t()          # all_to_all_single's strided output, which gloo fills as if contiguous
    dist.all_to_all_single(o, torch.arange(6.0 * n).reshape(2 * n, 3) + 100 * r)
    assert torch.equal(o, torch.cat([torch.arange(6.0 * r, 6.0 * r + 6).reshape(2, 3) + 100 * i for i in range(n)]))
if r < 2:
    t = torch.arange(3, dtype=torch.bfloat16) + r
    if r == 0:
        dist.send(t, 1)
    else:
        dist.recv(t, 0)
    out.append(("bf16 send/recv", t.float().tolist()))
gl = [torch.empty(2) for _ in range(n)] if r == 0 else None
work = dist.gather(torch.full((2,), float(r)), gl, dst=0, async_op=True)
work.wait()
value = work.get_future().value()
out.append(("gather future", [x.tolist() for x in value] if r == 0 else None))
dist.barrier()
with open(f"{sys.argv[2]}.{r}", "w") as f:
    f.write("\n".join(map(repr, out)) + "\n")
dist.destroy_process_group()
