"""``shmcoll bench ddp``: a DDP training step on CPU, gloo's backend against shmcoll's.

torch's DistributedDataParallel trains the same MLP on the same synthetic
data under each backend, in interleaved rounds (the host drifts; only
ratios measured side by side mean anything), the backends' order
alternating from round to round.  Each round is a fresh job of n ranks
started as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, ...), one
thread each, pinned one per CPU when they fit.  A step is zero_grad,
forward, backward (DDP's allreduce of the gradient's buckets) and SGD's
update; its time is the slowest rank's, the median over the timed steps.
The same ranks then time steps under DDP's ``no_sync`` (no allreduce: the
compute alone), so gloo's step less that is what its communication costs.
The losses of every step must agree between the backends (bit for bit at
2 ranks, where a sum of two is the same in any order).
"""
import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from shmcoll.device import MAX_RANKS

BACKENDS = ("gloo", "shmcoll")
CPUS = sorted(os.sched_getaffinity(0))


def model(width, depth):
    """An MLP of float32 layers width x 4 width x width, depth times: 8 width^2 weights each."""
    import torch
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, 4 * width), torch.nn.ReLU(), torch.nn.Linear(4 * width, width)]
    return torch.nn.Sequential(*layers)


def worker(a):
    """One rank: warm-up, timed DDP steps, then timed no_sync steps; its times and losses to a.out.RANK."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    if a.worker == "shmcoll":
        import shmcoll.torch  # noqa: F401  (registers the backend)
    dist.init_process_group(a.worker)
    rank = dist.get_rank()
    net = DDP(model(a.width, a.depth))
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1000 + rank)
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
    with open(f"{a.out}.{rank}", "w") as f:
        json.dump({"step": [t for t, _ in timed], "loss": [l for _, l in timed], "alone": alone}, f)
    dist.destroy_process_group()


def job(backend, n, cfg):
    """One job of n ranks under backend: {"step", "alone": the slowest rank's median s, "loss": rank 0's}."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times")
        cmd = [sys.executable, "-m", "shmcoll.bench_ddp", "--worker", backend, "--out", out, "--steps",
               str(cfg.steps), "--warmup", str(cfg.warmup), "--width", str(cfg.width), "--depth", str(cfg.depth),
               "--batch", str(cfg.batch)]
        procs = []
        try:
            for r in range(n):
                env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RUN_ID=f"ddp{port}",
                           OMP_NUM_THREADS="1")
                pin = (lambda c=CPUS[r]: os.sched_setaffinity(0, {c})) if n <= len(CPUS) else None
                procs.append(subprocess.Popen(cmd, env=env, preexec_fn=pin, stdin=subprocess.DEVNULL,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            end = time.monotonic() + cfg.timeout
            errs = [p.communicate(timeout=max(1.0, end - time.monotonic()))[1] for p in procs]
        finally:
            for p in procs:
                p.kill()
                p.wait()
        bad = [(r, p.returncode, e) for r, (p, e) in enumerate(zip(procs, errs)) if p.returncode]
        if bad:
            r, rc, err = bad[0]
            raise RuntimeError(f"ddp {backend} n={n}: rank {r} exit {rc}: {err.strip()[-800:]}")
        ranks = []
        for r in range(n):
            with open(f"{out}.{r}") as f:
                ranks.append(json.load(f))
    slowest = lambda key: statistics.median(max(ts) for ts in zip(*(d[key] for d in ranks)))
    return {"step": slowest("step"), "alone": slowest("alone"), "loss": ranks[0]["loss"]}


def measure(cfg, n):
    """{backend: [job() per round]} for n ranks, the backends' order alternating."""
    got = {b: [] for b in BACKENDS}
    for r in range(cfg.rounds):
        for b in (BACKENDS if r % 2 == 0 else BACKENDS[::-1]):
            got[b].append(job(b, n, cfg))
            if sys.stderr.isatty():
                print(f"\r\033[Kn={n} round {r + 1}/{cfg.rounds} {b}: {got[b][-1]['step'] * 1e3:.1f} ms per step",
                      end="", file=sys.stderr, flush=True)
    return got


def agreement(runs):
    """The largest relative difference of a step's loss between the backends, over every round."""
    worst = 0.0
    for g, s in zip(runs["gloo"], runs["shmcoll"]):
        for a, b in zip(g["loss"], s["loss"]):
            worst = max(worst, abs(a - b) / max(abs(a), 1e-300))
    return worst


def table(results):
    """Per rank count: medians over rounds (ms per step), gloo's share of its step beyond the compute, and
    gloo / shmcoll (the median of the per-round ratios, their range)."""
    head = ["ranks", "compute", "gloo", "shmcoll", "gloo comm share", "gloo/shmcoll", "loss diff"]
    rows = []
    for n, runs in results.items():
        alone = statistics.median(x["alone"] for b in BACKENDS for x in runs[b])
        gloo, ours = (statistics.median(x["step"] for x in runs[b]) for b in BACKENDS)
        speed = sorted(g["step"] / s["step"] for g, s in zip(runs["gloo"], runs["shmcoll"]))
        rows.append([str(n), f"{alone * 1e3:.1f}", f"{gloo * 1e3:.1f}", f"{ours * 1e3:.1f}",
                     f"{max(0.0, gloo - alone) / gloo:.2f}",
                     f"{statistics.median(speed):.2f} [{speed[0]:.2f}-{speed[-1]:.2f}]", f"{agreement(runs):.1e}"])
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    return "\n".join("  ".join(x.rjust(w) for x, w in zip(r, widths)) for r in [head] + rows)


def parse(argv):
    p = argparse.ArgumentParser(prog="shmcoll bench ddp", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--nprocs", default="2,4", help="comma-separated rank counts (default 2,4)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per job, and as many no_sync ones (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--width", type=int, default=1024,
                   help="the MLP's width w: each block is w x 4w x w, 8 w^2 float32 weights (default 1024)")
    p.add_argument("--depth", type=int, default=1, help="blocks (default 1: 8.4 M parameters, 32 MiB of gradient)")
    p.add_argument("--batch", type=int, default=32, help="samples per rank and step (default 32)")
    p.add_argument("--timeout", type=float, default=300, help="seconds a job may take (default 300)")
    p.add_argument("--json", metavar="FILE", help="write every round's figures here")
    p.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.nprocs = [int(x) for x in a.nprocs.split(",") if x]
    if not a.nprocs or not all(2 <= x <= MAX_RANKS for x in a.nprocs):
        p.error(f"rank counts must be between 2 and {MAX_RANKS}")
    if min(a.rounds, a.steps, a.width, a.depth, a.batch) < 1 or a.warmup < 0:
        p.error("--rounds, --steps, --width, --depth and --batch must be >= 1, --warmup >= 0")
    return a


def main(argv):
    cfg = parse(argv)
    if cfg.worker:
        return worker(cfg)
    try:
        import torch  # noqa: F401
        import shmcoll.torch  # noqa: F401
    except ImportError as e:
        print(f"shmcoll bench ddp: needs torch ({e}): pip install 'shmcoll[torch]' 'torch==2.13.0+cpu'",
              file=sys.stderr)
        return 2
    t0, results = time.monotonic(), {}
    for n in cfg.nprocs:
        results[n] = measure(cfg, n)
    if sys.stderr.isatty():
        print("\r\033[K", end="", file=sys.stderr)
    params = 8 * cfg.width ** 2 * cfg.depth + 5 * cfg.width * cfg.depth
    print(f"# shmcoll bench ddp: {platform.processor() or platform.machine()}, {len(CPUS)} CPUs, torch "
          f"{torch.__version__}, MLP of {params / 1e6:.1f} M float32 parameters, batch {cfg.batch}, {cfg.rounds} "
          f"rounds of {cfg.steps} steps, {time.monotonic() - t0:.0f} s")
    print("# ms per step (slowest rank, median); compute: the same step under no_sync; gloo/shmcoll > 1: shmcoll faster")
    print(table(results))
    if cfg.json:
        with open(cfg.json, "w") as f:
            json.dump({"argv": argv, "params": params, "torch": torch.__version__,
                       "results": {str(n): r for n, r in results.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
