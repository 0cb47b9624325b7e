"""torch's timeouts under the shmcoll backend, 2 ranks: Work.wait(timeout)
of a receive whose message has not come raises once it passes (the
receive stays posted and completes later), and init_process_group's
timeout bounds a collective whose peer does not come (rank 1 waits for a
message that never comes): it raises, and the job's abort reaches the
other rank in its wait, as gloo's timeout ends its group.  Each rank
writes what happened to the file argv[1].RANK."""
import datetime
import sys
import time

import torch
import torch.distributed as dist

import shmcoll.torch  # noqa: F401

dist.init_process_group("shmcoll", timeout=datetime.timedelta(seconds=2))
r = dist.get_rank()
said = []


def say(*words):
    said.append(" ".join(map(str, words)))


if r == 0:
    got = torch.zeros(3)
    work = dist.irecv(got, 1, tag=5)
    try:
        work.wait(timeout=datetime.timedelta(seconds=0.5))
        say("0 wait returned")
    except RuntimeError as e:
        say("0 wait raised", "within 0.5 s" in str(e))
    dist.send(torch.zeros(1), 1, tag=7)         # now rank 1 sends tag 5
    work.wait()
    say("0 got", got.tolist())
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(2))
        say("0 all_reduce returned")
    except Exception as e:
        say("0 all_reduce raised", type(e).__name__, time.monotonic() - t0 < 10)
else:
    dist.recv(torch.zeros(1), 0, tag=7)
    dist.send(torch.full((3,), 5.0), 0, tag=5)
    try:
        dist.recv(torch.zeros(1), 0, tag=8)     # never sent
        say("1 recv returned")
    except Exception as e:
        say("1 raised", type(e).__name__)
with open(f"{sys.argv[1]}.{r}", "w") as f:
    f.write("\n".join(said) + "\n")
