"""Stand-in `mpi4py` package for running mpi4py's own tests on shmcoll.

tools/mpi4py_tests.py puts its parent directory first on sys.path, so the
tests' unchanged `from mpi4py import MPI` imports `shmcoll.MPI`.  It adds
nothing to shmcoll.MPI: a call shmcoll lacks fails as it would for a user.
"""
import sys
import types

from shmcoll import MPI

sys.modules[__name__ + ".MPI"] = MPI
__version__ = "4.1.2"
# mpi4py.rc's defaults, read by the tests' helpers (mpitestutil).
rc = types.SimpleNamespace(initialize=True, threads=True, thread_level="multiple", finalize=None,
                           fast_reduce=True, recv_mprobe=True, irecv_bufsz=32768, errors="exception")
