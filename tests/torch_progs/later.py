"""Works that complete after their calls return (shmcoll.torch.ASYNC
forced on: on a machine without spare CPUs it is off), against numpy:
several allreduce, broadcast, all_gather_into_tensor and
reduce_scatter_tensor calls of 1 MiB outstanding at once, waited for in
reverse order, a small blocking call among them, futures and their
callbacks, the tensors moved into the arena at their second call; then a
mismatch (rank 0 reduces more than the others) raises from every rank's
wait.  Each rank prints "ok RANK"."""
import os, numpy as np, torch, torch.distributed as dist
import shmcoll.torch

shmcoll.torch.ASYNC = True
dist.init_process_group("shmcoll")
r, n = dist.get_rank(), dist.get_world_size()
N = 1 << 18                                     # float32: 1 MiB
base = np.arange(N, dtype=np.float32) % 1000


def inputs():
    return (torch.from_numpy(base * (r + 1)).clone(), torch.full((N,), float(r)),
            torch.from_numpy(base[:N // n] + r).clone(), torch.from_numpy(base * (r + 2)).clone())


want_sum = base * (n * (n + 1) // 2)
want_avg = base * sum(k + 2 for k in range(n)) / n
want_ag = np.concatenate([base[:N // n] + k for k in range(n)])
later = 0
for step in range(3):                           # the second and third find the storages moved
    a, b, g, s = inputs()
    ag, rs, called = torch.empty(N // n * n), torch.empty(N // n), []
    works = [dist.all_reduce(a, async_op=True), dist.broadcast(b, n - 1, async_op=True),
             dist.all_gather_into_tensor(ag, g, async_op=True),
             dist.reduce_scatter_tensor(rs, s[:N // n * n], dist.ReduceOp.AVG, async_op=True)]
    works[0].get_future().then(lambda f: called.append(f.value()[0] is a))
    later += sum(type(w) is shmcoll.torch._Later for w in works)
    small = torch.ones(4) * (r + 1)
    dist.all_reduce(small)                      # blocking, behind the four
    for w in reversed(works):
        assert w.wait()
        assert w.is_completed()
    assert small.tolist() == [n * (n + 1) / 2] * 4
    assert np.array_equal(a.numpy(), want_sum), step
    assert bool((b == n - 1).all())
    assert np.array_equal(ag.numpy(), want_ag)
    assert np.allclose(rs.numpy(), want_avg[r * (N // n):(r + 1) * (N // n)], rtol=1e-6)
    assert called == [True], called
    assert [tuple(x.shape) for x in works[2].get_future().wait()] == [(N // n,)] * n
assert later, "every call ended in its start: nothing was left to the completion thread"
# in place: this rank's block of the output is the input (FSDP's pattern)
out = torch.empty(N // n * n)
out[r * (N // n):(r + 1) * (N // n)] = torch.from_numpy(base[:N // n] + r)
dist.all_gather_into_tensor(out, out[r * (N // n):(r + 1) * (N // n)], async_op=True).wait()
assert np.array_equal(out.numpy(), want_ag)
# a callback on the completion thread that waits for a later Work (queued behind it: it hung)
# (rank 0's peers join only once its callback is attached: it runs on the thread, not in then())
inner, token = [], torch.zeros(1)
if r:
    dist.recv(token, 0)
first = dist.all_reduce(torch.ones(N), async_op=True)
done = first.get_future().then(lambda f: inner.append(dist.all_reduce(torch.ones(N) * 2, async_op=True).wait()))
if r == 0:
    for k in range(1, n):
        dist.send(token, k)
done.wait()
assert inner == [True] and first.is_success()
# a new_group's Works, then the group destroyed (its communicator freed), the world going on
g = dist.new_group(list(range(n)))
w = dist.all_reduce(torch.ones(N), group=g, async_op=True)
dist.destroy_process_group(g)
assert w.is_completed() and w.is_success()
# a mismatch: rank 0 reduces twice the bytes; every rank's wait raises, none hangs
bad = torch.ones(2 * N if r == 0 else N)
work = dist.all_reduce(bad, async_op=True)
try:
    work.wait()
except shmcoll.MismatchError as e:
    assert "byte count" in str(e), e
    assert not work.is_success() and work.exception() is e
else:
    raise AssertionError("a mismatched allreduce completed")
os.write(1, f"ok {r}\n".encode())
