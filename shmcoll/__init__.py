"""shmcoll: topology-aware shared-memory collectives for Python processes
on one node.  See README.md and ARCHITECTURE.md."""
from .buffers import IN_PLACE
from .coll.select import algorithms
from .comm import Comm
from .distance import alcd
from .errors import (CMAError, MismatchError, PeerAborted, PeerDied, PeerFailure, PeerTimeout, SegmentError,
                     ShmcollError, WorkerDied)
from .launcher import init, launch, run
from .listing import program
from .multinode import from_mpi
from .ops import BAND, BOR, BXOR, LAND, LOR, LXOR, MAX, MAXLOC, MIN, MINLOC, PROD, SUM, Op
from .planning import schedule
from .pool import Pool
from .topology import topology

__all__ = ["BAND", "BOR", "BXOR", "CMAError", "Comm", "IN_PLACE", "LAND", "LOR", "LXOR", "MAX", "MAXLOC", "MIN",
           "MINLOC", "MismatchError", "Op", "PROD", "PeerAborted", "PeerDied", "PeerFailure", "PeerTimeout", "Pool",
           "SUM", "SegmentError", "ShmcollError", "WorkerDied", "alcd", "algorithms", "from_mpi", "init", "launch", "program", "run", "schedule", "topology"]
__version__ = "0.2.0"
