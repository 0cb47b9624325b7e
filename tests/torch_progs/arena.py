"""The backend's move of a storage into the rank's arena (shmcoll/torch.py
_to_arena), under torchrun: a tensor that comes back moves on its second
call, keeping its values and the views taken before; one viewed by numpy
(.numpy()) and one over a numpy array's memory stay where they are and go
on sharing it; several tensors over one storage in one call, and a
storage while another thread runs, do not move; every result is numpy's.
Each rank prints "ok RANK"."""
import os, threading, numpy as np, torch, torch.distributed as dist
import shmcoll.torch
from shmcoll._core import lib

N = 1 << 16                                          # float32: 256 KiB, over MOVE_BYTES
a = np.zeros(N, np.float32)                          # made before the rank's arena: private memory
dist.init_process_group("shmcoll")
r, n = dist.get_rank(), dist.get_world_size()


def held(t):
    s = t.untyped_storage()
    return bool(lib.sc_arena_holds(s.data_ptr(), s.nbytes()))


base = np.arange(N, dtype=np.float32)
t = torch.arange(N, dtype=torch.float32) * (r + 1)
seen = torch.arange(N, dtype=torch.float32) * (r + 1)
view = t[10:20]
a[:] = base * (r + 1)
over_numpy = torch.from_numpy(a)
places, want, sees = [], base * (n * (n + 1) // 2), None
for k in range(3):
    for x in (t, seen, over_numpy):
        dist.all_reduce(x)
    places.append((held(t), held(seen), held(over_numpy)))
    sees = seen.numpy() if sees is None else sees    # a numpy view of seen, from the first call on
    assert torch.equal(t, torch.from_numpy(want)) and torch.equal(view, t[10:20]), (k, t[:4], want[:4])
    assert np.array_equal(sees, want) and np.array_equal(a, want), (k, sees[:4], a[:4], want[:4])
    want = want * n
moves = hasattr(torch.UntypedStorage, "_swap_data_ptr_")         # torch 2.11 cannot move one
assert places == [(False, False, False), (moves, False, False), (moves, False, False)], places
small = torch.ones(8) * (r + 1)
for _ in range(3):
    dist.all_reduce(small)
assert not held(small) and torch.equal(small, torch.full((8,), float(n * (n + 1) // 2 * n * n)))
# several tensors over one storage in one call (chunks, halves, in place): none moves under another's view
K = 1 << 16
for _ in range(3):
    x = torch.arange(n * K, dtype=torch.float32) + r
    out = torch.empty(K)
    dist.reduce_scatter(out, list(x.chunk(n)))
    assert torch.equal(out, torch.arange(r * K, (r + 1) * K, dtype=torch.float32) * n + n * (n - 1) // 2)
    y = torch.zeros(n * K)
    y[r * K:(r + 1) * K] = r + 1
    dist.all_gather_into_tensor(y, y[r * K:(r + 1) * K])            # in place, as FSDP gathers
    assert torch.equal(y, torch.arange(1.0, n + 1).repeat_interleave(K))
    z = torch.arange(n * K, dtype=torch.float32) + r
    dist.reduce_scatter_tensor(z[r * K:(r + 1) * K], z)               # output a block of its own input
    assert torch.equal(z[r * K:(r + 1) * K], torch.arange(r * K, (r + 1) * K, dtype=torch.float32) * n
                       + n * (n - 1) // 2)
    v = torch.arange(n * K, dtype=torch.float32) + 1000 * r
    dist.all_to_all_single(v, v)                                       # in place
    assert torch.equal(v, torch.cat([torch.arange(r * K, (r + 1) * K, dtype=torch.float32) + 1000 * q
                                     for q in range(n)]))
    w = torch.arange(2 * n * K, dtype=torch.float32) + 1000 * r
    dist.all_to_all_single(w[n * K:], w[:n * K])                       # the two halves of one storage
    assert torch.equal(w[n * K:], torch.cat([torch.arange(r * K, (r + 1) * K, dtype=torch.float32) + 1000 * q
                                             for q in range(n)]))
# another Python thread could be writing into a storage as it moves: none moves while one runs
stop = threading.Event()
other = threading.Thread(target=stop.wait)
other.start()
u = torch.ones(K)
for _ in range(3):
    dist.all_reduce(u)
stop.set()
other.join()
assert not held(u) and torch.equal(u, torch.full((K,), float(n ** 3)))
try:
    dist.all_reduce(torch._neg_view(torch.ones(K)))
except ValueError as e:
    assert "negative" in str(e)
else:
    raise AssertionError("a tensor with the negative bit was reduced")
os.write(1, f"ok {r}\n".encode())      # one write: the ranks print at once
dist.destroy_process_group()
