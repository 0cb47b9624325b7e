"""Two threads, one on the default group and one on a new_group of every
rank, reduce at the same time under the shmcoll backend: each group is a
communicator of its own, so neither thread finds the other inside a
collective; every result is the sum.  Each rank prints "ok RANK"."""
import os, threading, torch, torch.distributed as dist
import shmcoll.torch

dist.init_process_group("shmcoll")
r, n = dist.get_rank(), dist.get_world_size()
everyone = dist.new_group(list(range(n)))
errors = []


def work(group, scale):
    try:
        for _ in range(100):
            v = torch.full((1 << 12,), float(r + 1) * scale)
            dist.all_reduce(v, group=group)
            if not bool((v == scale * n * (n + 1) // 2).all()):
                errors.append(("wrong", scale, v[:2].tolist()))
    except Exception as e:
        errors.append(repr(e)[:200])


other = threading.Thread(target=work, args=(everyone, 10))
other.start()
work(None, 1)
other.join()
assert not errors, errors
os.write(1, f"ok {r}\n".encode())
dist.destroy_process_group()
