"""Master/worker task farm: the master takes results from ANY_SOURCE, tags say what a message is.

Rank 0 hands out task numbers one at a time; a worker sends back its result
with tag RESULT and gets the next task or tag STOP.  Who did which task varies
from run to run; the results, kept by task number, do not.  On one rank the
master does the tasks itself.
"""
import importlib
import os

MPI = importlib.import_module(os.environ.get("MPI_MODULE", "shmcoll.MPI"))  # or: from mpi4py import MPI

TASKS, WORK, RESULT, STOP = 40, 1, 2, 3
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def collatz_steps(n):
    steps = 0
    while n != 1:
        n = 3 * n + 1 if n % 2 else n // 2
        steps += 1
    return steps


def task(i):
    return i, max(collatz_steps(n) for n in range(100 * i + 1, 100 * i + 101))


if rank == 0:
    results, todo, status = {}, list(range(TASKS)), MPI.Status()
    if size == 1:
        results = dict(map(task, todo))
    for w in range(1, min(size, TASKS + 1)):
        comm.send(todo.pop(0), dest=w, tag=WORK)
    for w in range(TASKS + 1, size):
        comm.send(None, dest=w, tag=STOP)
    while len(results) < TASKS:
        i, steps = comm.recv(source=MPI.ANY_SOURCE, tag=RESULT, status=status)
        results[i] = steps
        if todo:
            comm.send(todo.pop(0), dest=status.Get_source(), tag=WORK)
        else:
            comm.send(None, dest=status.Get_source(), tag=STOP)
    for i in range(0, TASKS, 8):
        print(" ".join(f"{j:2d}:{results[j]:3d}" for j in range(i, i + 8)))
    print(f"total {sum(results.values())}")
else:
    status = MPI.Status()
    while True:
        i = comm.recv(source=0, tag=MPI.ANY_TAG, status=status)
        if status.Get_tag() == STOP:
            break
        comm.send(task(i), dest=0, tag=RESULT)
