"""Performance model of shmcoll's collectives (paper 002): the paper's
equations, a machine's measured parameters, and each algorithm's predicted
time from its own schedule; across nodes, a hierarchical Alltoall's
(network.py).  `shmcoll model` prints them against
measurements; docs/model.md."""
from .machine import EXAMPLE, LEVELS, Machine, load
from .paper import bruck_time, contention_time, contention_wait, pairwise_time
from . import measure
from .predict import predict, schedule_time
from .network import Network, hierarchical_alltoall

__all__ = ["EXAMPLE", "LEVELS", "Machine", "load", "bruck_time", "contention_time", "contention_wait",
           "pairwise_time", "predict", "schedule_time", "Network", "hierarchical_alltoall"]
