#!/usr/bin/env python3
"""Kill campaign for shmcoll.from_mpi: N trials, each a random collective,
victim rank, call index, virtual-node layout and MPI library; checks that
the job ends within 5 s of the kill, that the output names the victim
(Open MPI: its rank; MPICH's Hydra: its pid), and that nothing of
shmcoll's is left in /dev/shm.

    python3 tools/multinode_kills.py --envs /tmp/mn-mpich,/tmp/mn-openmpi -n 50
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile
import time

PROG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "mpi_progs", "hier_victim.py")
OPS = ("bcast", "allreduce", "reduce", "allgather", "gather", "scatter", "alltoall", "barrier",
       "reduce_scatter_block")
LAYOUTS = ("2,2", "3,1", "1,3", "2,1")


def trial(env, op, nodes, victim, at, note):
    n = sum(int(x) for x in nodes.split(","))
    ompi = os.path.exists(os.path.join(env, "bin", "ompi_info"))
    cmd = [os.path.join(env, "bin", "mpiexec")] + (["--oversubscribe", "-x", "SHMCOLL_VIRTUAL_NODES"] if ompi else [])
    cmd += ["-n", str(n), os.path.join(env, "bin", "python"), PROG, op, str(victim), str(at), note]
    var = dict(os.environ, SHMCOLL_VIRTUAL_NODES=nodes, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    before = set(os.listdir("/dev/shm"))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=var)
    end = time.time()
    killed_at, pid = open(note).read().split()
    after = set(os.listdir("/dev/shm")) - before
    ours = [x for x in after if x.startswith("shmcoll")]
    for x in after:                 # the MPI libraries' own leftovers (under plain MPI too)
        if x.startswith(("mpich_shm_", "sm_segment")):
            os.unlink(os.path.join("/dev/shm", x))
    text = out.stdout + out.stderr
    named = (f"rank {victim}" in text) if ompi else (f"PID {pid}" in text or f"rank {victim} failed" in text)
    return dict(rc=out.returncode, seconds=end - float(killed_at), named=named, leaked=ours,
                library="Open MPI" if ompi else "MPICH")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", required=True, help="MPI virtualenvs, comma-separated")
    ap.add_argument("-n", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    envs = a.envs.split(",")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.n):
            env, op, nodes = rng.choice(envs), rng.choice(OPS), rng.choice(LAYOUTS)
            victim = rng.randrange(sum(int(x) for x in nodes.split(",")))
            r = trial(env, op, nodes, victim, rng.randrange(1, 200), os.path.join(tmp, f"note{i}"))
            ok = r["rc"] != 0 and r["seconds"] < 5 and r["named"] and not r["leaked"]
            bad += not ok
            print(f"{i:3d} {r['library']:8} {op:21} nodes {nodes} victim {victim}: rc {r['rc']}, ended "
                  f"{r['seconds']:.2f} s after the kill, named {r['named']}, leaked {r['leaked'] or 'nothing'}"
                  f"{'' if ok else '  FAIL'}", flush=True)
    print(f"{a.n - bad} of {a.n} trials held")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
