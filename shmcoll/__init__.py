"""shmcoll: topology-aware shared-memory collectives for Python processes
on one node.  See README.md."""
from .coll.select import algorithms
from .comm import Comm
from .errors import PeerAborted, PeerDied, PeerFailure, SegmentError, ShmcollError
from .launcher import init, launch, run
from .topology import topology

__all__ = ["Comm", "PeerAborted", "PeerDied", "PeerFailure", "SegmentError", "ShmcollError",
           "algorithms", "init", "launch", "run", "topology"]
__version__ = "0.1.0"
