import mpi4py.MPI as R
from shmcoll import MPI
w, r = MPI.COMM_WORLD, R.COMM_WORLD
if w.Get_rank() == 0:
    for a in ("TAG_UB", "IO", "WTIME_IS_GLOBAL", "APPNUM", "UNIVERSE_SIZE", "LASTUSEDCODE"):
        k = getattr(R, a)
        print(a, "face:", w.Get_attr(k), "mpi:", r.Get_attr(k))
    print("name", repr(w.Get_name()), repr(r.Get_name()))
    print("errh", w.Get_errhandler() == R.ERRORS_RETURN, r.Get_errhandler() == R.ERRORS_RETURN)
    print("topo", w.Get_topology() if hasattr(w, "Get_topology") else None, w.Is_inter(), w.Get_info().Get_nkeys())
    print("cmp", w.Compare(r) == R.CONGRUENT, w == r, w.py2f(), r.py2f())
