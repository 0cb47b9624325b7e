"""``shmcoll bench torch``: torch.distributed on CPU, gloo's backend against shmcoll's.

Two measurements, each in interleaved rounds (the host drifts; only ratios
measured side by side mean anything), the backends' order alternating
from round to round, each round a fresh job of n ranks started as
torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, ...), one thread
each, pinned one per CPU when they fit:

- ``allreduce``: ``all_reduce`` of a float32 tensor that torch allocated,
  in place, per size: under gloo, under shmcoll's backend, and shmcoll's
  own ``Allreduce(IN_PLACE, a)`` on a numpy array in the same job,
  alternating with it; microseconds per call, the slowest rank's median
  of 5 repetitions.
- ``ddp``: torch's DistributedDataParallel trains the same MLP on the
  same synthetic data under each backend.  A step is zero_grad, forward,
  backward (DDP's allreduce of the gradient's buckets) and SGD's update;
  its time is the slowest rank's, the median over the timed steps.  The
  same ranks then time steps under DDP's ``no_sync`` (no allreduce: the
  compute alone), so gloo's step less that is what its communication
  costs.  The losses of every step must agree between the backends (bit
  for bit at 2 ranks, where a sum of two is the same in any order).
"""
import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time

from shmcoll.bench import aligned, follow, human, last_lines, nbytes, torch_ranks
from shmcoll.device import MAX_RANKS

BACKENDS = ("gloo", "shmcoll")
MEASURES = ("allreduce", "ddp")
SIZES = (64 << 10, 1 << 20, 16 << 20, 64 << 20)


def model(width, depth):
    """An MLP of float32 layers width x 4 width x width, depth times: 8 width^2 weights each."""
    import torch
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, 4 * width), torch.nn.ReLU(), torch.nn.Linear(4 * width, width)]
    return torch.nn.Sequential(*layers)


def _allreduce(a, dist, torch):
    """Per size, {column: the median of 5 repetitions' seconds per call}: under shmcoll, the backend's
    call alternating with shmcoll's own on a numpy array (zeros: the sums stay finite)."""
    import numpy as np
    out = {}
    for size in a.sizes:
        t = torch.zeros(size // 4)              # torch's memory: the backend moves it at its second call
        runs = {a.worker: lambda: dist.all_reduce(t)}
        if a.worker == "shmcoll":
            import shmcoll
            own, arr = shmcoll.init(), np.zeros(size // 4, np.float32)
            runs["own"] = lambda: own.Allreduce(shmcoll.IN_PLACE, arr)
        n = max(3, min(2000 if a.worker == "shmcoll" else 200, int((2e8 if a.worker == "shmcoll" else 2e7) // size)))
        times = {k: [] for k in runs}
        for f in runs.values():
            for _ in range(3):
                f()
        for _ in range(5):
            for k, f in runs.items():
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(n):
                    f()
                times[k].append((time.perf_counter() - t0) / n)
        out[str(size)] = {k: statistics.median(v) for k, v in times.items()}
    return out


def _ddp(a, dist, torch):
    from torch.nn.parallel import DistributedDataParallel as DDP
    net = DDP(model(a.width, a.depth), gradient_as_bucket_view=a.bucket_view)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1000 + dist.get_rank())
    x, y = torch.randn(a.batch, a.width, generator=gen), torch.randn(a.batch, a.width, generator=gen)

    def step():
        t = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        return time.perf_counter() - t, loss.item()

    for _ in range(a.warmup):
        step()
    timed = [step() for _ in range(a.steps)]
    dist.barrier()
    with net.no_sync():
        alone = [step()[0] for _ in range(a.steps)]
    return {"step": [t for t, _ in timed], "loss": [l for _, l in timed], "alone": alone}


def worker(a):
    """One rank of one measurement under one backend; its figures to a.out.RANK."""
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    if a.worker == "shmcoll":
        import shmcoll.torch  # noqa: F401  (registers the backend)
    dist.init_process_group(a.worker)
    got = (_allreduce if a.measure == "allreduce" else _ddp)(a, dist, torch)
    with open(f"{a.out}.{dist.get_rank()}", "w") as f:
        json.dump(got, f)
    # DDP's reducer sits in reference cycles: freed after its process group, gloo's threads were left
    # running as the interpreter ended ("terminate called without an active exception", now and then)
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def job(measure, backend, n, cfg):
    """One job of n ranks: every rank's figures (worker's)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "figures")
        cmd = [sys.executable, "-m", "shmcoll.bench_torch", "--worker", backend, "--measures", measure, "--out", out,
               "--steps", str(cfg.steps), "--warmup", str(cfg.warmup), "--width", str(cfg.width), "--depth",
               str(cfg.depth), "--batch", str(cfg.batch), "--sizes", ",".join(map(str, cfg.sizes))]
        cmd += ["--bucket-view"] * cfg.bucket_view
        procs, errs = [], [os.path.join(tmp, f"stderr{r}") for r in range(n)]
        try:
            torch_ranks(cmd, n, errs, procs)
            follow(procs, cfg.timeout)
        finally:
            for p in procs:
                p.kill()
                p.wait()
        bad = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode]
        if bad:
            r, rc = bad[0]
            raise RuntimeError(f"{measure} {backend} n={n}: rank {r} exit {rc}: {last_lines(errs[r])}")
        ranks = []
        for r in range(n):
            with open(f"{out}.{r}") as f:
                ranks.append(json.load(f))
    if measure == "allreduce":      # per size and column, the slowest rank's
        return {size: {k: max(d[size][k] for d in ranks) for k in ranks[0][size]} for size in ranks[0]}
    slowest = lambda key: statistics.median(max(ts) for ts in zip(*(d[key] for d in ranks)))
    return {"step": slowest("step"), "alone": slowest("alone"), "loss": ranks[0]["loss"]}


def measure(cfg, n):
    """{measure: {backend: [job() per round]}} for n ranks, the backends' order alternating."""
    got = {m: {b: [] for b in BACKENDS} for m in cfg.measures}
    for r in range(cfg.rounds):
        for m in cfg.measures:
            for b in (BACKENDS if r % 2 == 0 else BACKENDS[::-1]):
                got[m][b].append(job(m, b, n, cfg))
                if sys.stderr.isatty():
                    print(f"\r\033[Kn={n} round {r + 1}/{cfg.rounds} {m} {b}", end="", file=sys.stderr, flush=True)
    return got


def agreement(runs):
    """The largest relative difference of a step's loss between the backends, over every round."""
    worst = 0.0
    for g, s in zip(runs["gloo"], runs["shmcoll"]):
        for a, b in zip(g["loss"], s["loss"]):
            worst = max(worst, abs(a - b) / max(abs(a), 1e-300))
    return worst


def spread(xs):
    xs = sorted(xs)
    return f"{statistics.median(xs):.2f} [{xs[0]:.2f}-{xs[-1]:.2f}]"


def allreduce_table(results):
    """Per rank count and size: medians over rounds (us per call), backend / own and gloo / backend (the
    median of the per-round ratios, their range)."""
    head = ["ranks", "size", "gloo", "shmcoll backend", "shmcoll own", "backend/own", "gloo/backend"]
    rows = []
    for n, got in results.items():
        g, s = got["allreduce"]["gloo"], got["allreduce"]["shmcoll"]
        for size in s[0]:
            med = lambda runs, k: statistics.median(x[size][k] for x in runs) * 1e6
            rows.append([str(n), human(int(size)), f"{med(g, 'gloo'):.1f}", f"{med(s, 'shmcoll'):.1f}",
                         f"{med(s, 'own'):.1f}", spread(x[size]["shmcoll"] / x[size]["own"] for x in s),
                         spread(a[size]["gloo"] / b[size]["shmcoll"] for a, b in zip(g, s))])
    return aligned(head, rows)


def ddp_table(results):
    """Per rank count: medians over rounds (ms per step), gloo's share of its step beyond the compute, and
    gloo / shmcoll (the median of the per-round ratios, their range)."""
    head = ["ranks", "compute", "gloo", "shmcoll", "gloo comm share", "gloo/shmcoll", "loss diff"]
    rows = []
    for n, got in results.items():
        runs = got["ddp"]
        alone = statistics.median(x["alone"] for b in BACKENDS for x in runs[b])
        gloo, ours = (statistics.median(x["step"] for x in runs[b]) for b in BACKENDS)
        rows.append([str(n), f"{alone * 1e3:.1f}", f"{gloo * 1e3:.1f}", f"{ours * 1e3:.1f}",
                     f"{max(0.0, gloo - alone) / gloo:.2f}",
                     spread(g["step"] / s["step"] for g, s in zip(runs["gloo"], runs["shmcoll"])),
                     f"{agreement(runs):.1e}"])
    return aligned(head, rows)


def parse(argv):
    p = argparse.ArgumentParser(prog="shmcoll bench torch", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--nprocs", default="2,4", help="comma-separated rank counts (default 2,4)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--measures", default=",".join(MEASURES), help=f"comma-separated, of {', '.join(MEASURES)}")
    p.add_argument("--sizes", default=",".join(map(human, SIZES)),
                   help="allreduce: bytes per tensor, K/M/G for KiB/MiB/GiB, multiples of 4 (default 64K,1M,16M,64M)")
    p.add_argument("--steps", type=int, default=20, help="ddp: timed steps per job, and as many no_sync ones (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="ddp: untimed steps first (default 3)")
    p.add_argument("--width", type=int, default=1024,
                   help="ddp: the MLP's width w: each block is w x 4w x w, 8 w^2 float32 weights (default 1024)")
    p.add_argument("--depth", type=int, default=1, help="ddp: blocks (default 1: 8.4 M parameters, 32 MiB of gradient)")
    p.add_argument("--batch", type=int, default=2,
                   help="ddp: samples per rank and step (default 2: the gradient's allreduce is most of gloo's step)")
    p.add_argument("--bucket-view", action="store_true",
                   help="ddp: DDP's gradient_as_bucket_view=True (gradients live in the buckets: no copies in and out)")
    p.add_argument("--timeout", type=float, default=300, help="seconds a job may take (default 300)")
    p.add_argument("--json", metavar="FILE", help="write every round's figures here")
    p.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        a.nprocs = [int(x) for x in a.nprocs.split(",") if x]
        a.sizes = [nbytes(x) for x in a.sizes.split(",") if x]
    except ValueError as e:
        p.error(f"-n and --sizes: comma-separated numbers ({e})")
    if not a.nprocs or not all(2 <= x <= MAX_RANKS for x in a.nprocs):
        p.error(f"rank counts must be between 2 and {MAX_RANKS}")
    if not a.sizes or any(x < 4 or x % 4 for x in a.sizes):
        p.error("--sizes: positive multiples of 4 bytes (float32 tensors)")
    a.measures = [m for m in a.measures.split(",") if m]
    if not a.measures or set(a.measures) - set(MEASURES) or a.worker and len(a.measures) != 1:
        p.error(f"--measures: comma-separated, of {', '.join(MEASURES)}")
    a.measure = a.measures[0]
    if min(a.rounds, a.steps, a.width, a.depth, a.batch) < 1 or a.warmup < 0:
        p.error("--rounds, --steps, --width, --depth and --batch must be >= 1, --warmup >= 0")
    return a


def main(argv):
    cfg = parse(argv)
    if cfg.worker:
        return worker(cfg)
    try:
        import torch
        import shmcoll.torch  # noqa: F401
    except ImportError as e:
        print(f"shmcoll bench torch: needs torch ({e}): pip install 'shmcoll[torch]' 'torch==2.13.0+cpu'",
              file=sys.stderr)
        return 2
    t0, results = time.monotonic(), {}
    for n in cfg.nprocs:
        results[n] = measure(cfg, n)
    if sys.stderr.isatty():
        print("\r\033[K", end="", file=sys.stderr)
    params = 8 * cfg.width ** 2 * cfg.depth + 5 * cfg.width * cfg.depth
    print(f"# shmcoll bench torch: {platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} CPUs, torch "
          f"{torch.__version__}, {cfg.rounds} rounds, {time.monotonic() - t0:.0f} s")
    if "allreduce" in cfg.measures:
        print("# all_reduce of a float32 tensor torch allocated, in place (us per call, slowest rank, median of the "
              "rounds); shmcoll own: Allreduce(IN_PLACE) of a numpy array in the same jobs; ratios: per round")
        print(allreduce_table(results))
    if "ddp" in cfg.measures:
        print(f"# DDP step of an MLP of {params / 1e6:.1f} M float32 parameters, batch {cfg.batch} per rank"
              f"{', gradient_as_bucket_view' if cfg.bucket_view else ''} (ms per step, slowest rank, median); "
              "compute: the same step under no_sync; gloo/shmcoll > 1: shmcoll faster")
        print(ddp_table(results))
    if cfg.json:
        with open(cfg.json, "w") as f:
            json.dump({"argv": argv, "params": params, "torch": torch.__version__,
                       "results": {str(n): r for n, r in results.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
