"""Communicator and group calls whose results mpi4py+MPICH and shmcoll
must agree on: run under mpiexec with argument "mpi4py", under `shmcoll
run` with "shmcoll"; rank 0 prints every rank's lines (tests/test_comms.py)."""
import sys

if sys.argv[1] == "mpi4py":
    from mpi4py import MPI as M
    comm, Group = M.COMM_WORLD, M.Group
else:
    import shmcoll
    from shmcoll import comms as M
    comm, Group = shmcoll.init(), M.Group
NAMES = {getattr(M, k): k for k in ("IDENT", "CONGRUENT", "SIMILAR", "UNEQUAL")}
me, n = comm.Get_rank(), comm.Get_size()
out = []
for color, key in ((me % 2, -me), (me // 2, me % 3), (0, -me), (M.UNDEFINED, 0)):
    sub = comm.Split(color, key)
    if sub == M.COMM_NULL:
        out.append("null")
        continue
    g = sub.Get_group()
    out.append(f"split rank {sub.Get_rank()} size {sub.Get_size()} compare {NAMES[sub.Compare(comm)]} "
               f"name {sub.Get_name()!r} world {g.Translate_ranks(list(range(g.Get_size())), comm.Get_group())}")
    sub.Free()
dup = comm.Dup()
shared = comm.Split_type(M.COMM_TYPE_SHARED, key=-me)
out.append(f"dup {NAMES[dup.Compare(comm)]} {dup.Get_name()!r} {comm.Get_name()!r} shared {shared.Get_rank()} "
           f"{shared.Get_size()} {NAMES[shared.Compare(comm)]} {dup.Is_inter()} {dup.Get_topology()}")
wg = comm.Get_group()
a, b = wg.Incl(list(range(0, n, 2))), wg.Excl([n - 1])
ev = comm.Create(a)
out.append(f"create {'null' if ev == M.COMM_NULL else (ev.Get_rank(), ev.Get_size())}")
for name, g in (("incl", a), ("excl", b), ("union", Group.Union(a, b)), ("inter", Group.Intersection(b, a)),
                ("diff", Group.Difference(b, a)), ("range", wg.Range_incl([(n - 1, 0, -2)]))):
    out.append(f"{name} size {g.Get_size()} rank {g.Get_rank()} in-world "
               f"{g.Translate_ranks(list(range(g.Get_size())), wg)} from-world {wg.Translate_ranks(list(range(n)), g)} "
               f"{NAMES[g.Compare(wg)]}")
dup.Free()
out.append(f"freed {dup == M.COMM_NULL}")
every = comm.gather(out, root=0)          # one printer: mpiexec may merge the ranks' lines
if me == 0:
    print("\n".join(f"{r}: {line}" for r, lines in enumerate(every) for line in lines), flush=True)
