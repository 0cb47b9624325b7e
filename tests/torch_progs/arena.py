"""The backend's move of a storage into the rank's arena (shmcoll/torch.py
_to_arena), under torchrun: a tensor that comes back moves on its second
call, keeping its values and the views taken before; one viewed by numpy
(.numpy()) and one over a numpy array's memory stay where they are and go
on sharing it; every result is numpy's.  Each rank prints "ok RANK"."""
import os, numpy as np, torch, torch.distributed as dist
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
assert places == [(False, False, False), (True, False, False), (True, False, False)], places
small = torch.ones(8) * (r + 1)
for _ in range(3):
    dist.all_reduce(small)
assert not held(small) and torch.equal(small, torch.full((8,), float(n * (n + 1) // 2 * n * n)))
os.write(1, f"ok {r}\n".encode())      # one write: the ranks print at once
dist.destroy_process_group()
