"""Each rank forks a child that ends as $FORK_HOW says (exit: sys.exit(0),
raise: an uncaught exception, multiprocessing: a fork-started Process that
exits), then sums the ranks with its peers: the child's exit is no rank's."""
import multiprocessing
import os
import sys

import shmcoll

comm = shmcoll.init()
how = os.environ["FORK_HOW"]


def child():
    if how == "raise":
        raise RuntimeError("the child fails")
    sys.exit(0)


if how == "multiprocessing":
    p = multiprocessing.get_context("fork").Process(target=child)
    p.start()
    p.join()
else:
    pid = os.fork()
    if pid == 0:
        child()
    os.waitpid(pid, 0)
assert comm.allreduce(comm.rank) == sum(range(comm.size))
os.write(1, f"rank {comm.rank} of {comm.size} ok\n".encode())     # one write: lines never interleave
