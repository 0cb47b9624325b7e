"""Odd buffer objects on every rank: MPI vs the legs (result, or the same exception and usable after)."""
import array
import numpy as np
from mpi4py import MPI
import shmcoll
w = MPI.COMM_WORLD
h = shmcoll.from_mpi(w, flat_below=0, abort_on_error=False)
p, me = w.Get_size(), w.Get_rank()
def out(c):
    return np.zeros(8 * p, np.uint8)
cases = {
  "strided send": lambda c, r: c.Allgather(np.arange(16, dtype=np.uint8)[::2], r),
  "0-d send": lambda c, r: c.Allgather(np.array(me, np.uint64), r),
  "bytes send": lambda c, r: c.Allgather(bytes(range(me, me + 8)), r),
  "memoryview send": lambda c, r: c.Allgather(memoryview(bytearray(range(me, me + 8))), r),
  "memoryview strided": lambda c, r: c.Allgather(memoryview(bytearray(range(16)))[::2], r),
  "2d C slice noncontig": lambda c, r: c.Allgather(np.zeros((4, 4), np.uint8)[:, :2], r),
  "bytes recv": lambda c, r: c.Allgather(bytes(8), bytes(8 * p)),
  "array.array recv": lambda c, r: c.Allgather(array.array("B", range(8)), array.array("B", [0] * 8 * p)),
  "None send": lambda c, r: c.Allgather(None, r),
  "list send": lambda c, r: c.Allgather([1, 2, 3], r),
  "int root": lambda c, r: c.Bcast(r, root=np.int64(1)),
  "float root": lambda c, r: c.Bcast(r, root=1.0),
  "str root": lambda c, r: c.Bcast(r, root="1"),
}
for name, f in cases.items():
    res = []
    for c in (w, h):
        r = np.zeros(8 * p, np.uint8)
        try:
            f(c, r); res.append(("ok", r.tobytes()))
        except Exception as e:
            res.append((type(e).__name__, str(e)[:70]))
        x = np.ones(2); h.Allreduce(MPI.IN_PLACE, x); assert x[0] == p
    if res[0][0] != res[1][0] or (res[0][0] == "ok" and res[0][1] != res[1][1]):
        print(f"rank {me} {name}: mpi {res[0]} | hier {res[1]}", flush=True)
print(f"rank {me} done", flush=True)
