"""The face: from shmcoll import MPI / from shmcoll.MPI import * across virtual nodes."""
import numpy as np
from shmcoll.MPI import *
from shmcoll import MPI as M
import mpi4py.MPI as R

w = COMM_WORLD
print("types", type(w).__name__, w is M.COMM_WORLD, hasattr(w, "hier"), M.IN_PLACE is R.IN_PLACE, M.SUM is R.SUM, flush=True)
p, me = w.Get_size(), w.Get_rank()
x = np.arange(4.0) + me
r1, r2 = np.zeros(4), np.zeros(4)
w.Allreduce(x, r1, op=SUM); R.COMM_WORLD.Allreduce(x, r2, op=R.SUM)
assert np.array_equal(r1, r2)
d = w.Dup()
print("dup", type(d).__name__, hasattr(d, "hier"), d.Get_size(), flush=True)
d.Allreduce(x, r1, op=MAX); R.COMM_WORLD.Allreduce(x, r2, op=R.MAX); assert np.array_equal(r1, r2)
s = w.Split(me % 2, -me)
print("split", type(s).__name__, s.Get_rank(), s.Get_size(), flush=True)
g1, g2 = np.zeros(4 * s.Get_size()), np.zeros(4 * s.Get_size())
s.Allgather(x, g1)
ref = R.COMM_WORLD.Split(me % 2, -me); ref.Allgather(x, g2); assert np.array_equal(g1, g2)
# object collectives, nonblocking on the face world
assert w.allreduce(me) == sum(range(p))
assert w.bcast("hi" if me == 1 else None, root=1) == "hi"
req = w.Iallreduce(x, r1); req.Wait(); R.COMM_WORLD.Allreduce(x, r2); assert np.array_equal(r1, r2)
# Scan/Exscan/Alltoallv on the face
w.Scan(x, r1); R.COMM_WORLD.Scan(x, r2); assert np.array_equal(r1, r2)
# user-defined op and MINLOC on the face world
def myop(a, b, dt):
    aa = np.frombuffer(a, np.float64); bb = np.frombuffer(b, np.float64); bb[:] = aa * 2 + bb
op = M.Op.Create(myop, commute=False)
w.Allreduce(x, r1, op=op); R.COMM_WORLD.Allreduce(x, r2, op=op); assert np.array_equal(r1, r2), (r1, r2)
pair = np.zeros(1, dtype=np.dtype([("v", "f8"), ("i", "i4")], align=True)); pair["v"] = (me * 7) % 3; pair["i"] = me
out1 = np.zeros_like(pair); out2 = np.zeros_like(pair)
w.Allreduce([pair, DOUBLE_INT], [out1, DOUBLE_INT], op=MINLOC); R.COMM_WORLD.Allreduce([pair, R.DOUBLE_INT], [out2, R.DOUBLE_INT], op=R.MINLOC)
assert out1["v"] == out2["v"] and out1["i"] == out2["i"], (out1, out2)
print(f"rank {me} ok; Is_initialized={Is_initialized()} wtime={type(Wtime()).__name__}", flush=True)
d.Free(); s.Free(); op.Free()
