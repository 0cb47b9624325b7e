"""Run under mpiexec -n 4 with SHMCOLL_VIRTUAL_NODES=2,2 or 3,1: the
face's point-to-point between ranks of one node goes through shmcoll
(MPI's own probe on the same communicator never sees it), between nodes
through MPI, and together they keep MPI's rules: receives from any source
match in posting order across both transports, a message from one rank
never overtakes an earlier one, a derived datatype's message arrives as
MPI would deliver it, a truncated receive raises MPI's error and the
communicator goes on, and a rank waiting on one transport lets a message
on the other move; and the defects two reviews found stay fixed (9-15).
Rank 0 prints "ok" at the end."""
import os
import sys

import numpy as np
from mpi4py import MPI as MPI4PY

from shmcoll import MPI

c = MPI.COMM_WORLD
me, p = c.Get_rank(), c.Get_size()
sizes = [int(x) for x in os.environ["SHMCOLL_VIRTUAL_NODES"].split(",")]
LOCAL, REMOTE = 1, sizes[0]           # rank 0's node-mate and the first rank of the next node
BIG = 4 << 20                         # doubles: 32 MiB, far past any eager size or ring


def check(cond, *what):
    if not cond:
        raise AssertionError(f"rank {me}: {what}")


def mpi_own_iprobe(source, tag):
    """MPI's own probe on the face's communicator (its handle): what went through MPI."""
    return MPI4PY.Intracomm.Iprobe(c, source, tag)


# 1. which transport: the node-mate's message is shmcoll's, the other node's MPI's
if me in (LOCAL, REMOTE):
    c.Send(np.full(3, float(me)), dest=0, tag=5)
if me == 0:
    st = MPI.Status()
    for src in (LOCAL, REMOTE):
        c.Probe(src, 5, st)
        check(st.Get_source() == src and st.Get_count(MPI.DOUBLE) == 3, src, st.Get_source())
        check(mpi_own_iprobe(src, 5) == (src == REMOTE), "transport of", src)
        got = np.zeros(3)
        c.Recv(got, src, 5)
        check((got == src).all(), got)
c.Barrier()

# 2. receives from any source match in posting order, whichever transport the message took
if me == LOCAL:
    c.Send(np.array([10.0]), 0, 1)
elif me == REMOTE:
    c.Send(np.array([20.0]), 0, 1)
    c.Send(np.array([21.0]), 0, 1)
elif me == 0:
    bufs = [np.zeros(1) for _ in range(3)]
    reqs = [c.Irecv(bufs[0], MPI.ANY_SOURCE, 1), c.Irecv(bufs[1], REMOTE, 1), c.Irecv(bufs[2], MPI.ANY_SOURCE, 1)]
    sts = []
    MPI.Request.Waitall(reqs, sts)
    got = [b[0] for b in bufs]
    check(sorted(got) == [10, 20, 21], got)
    remote = [v for v in got if v >= 20]
    check(remote == [20, 21], "the remote rank's messages overtook each other", got)
    check([s.Get_source() for s in sts] == [LOCAL if v == 10 else REMOTE for v in got], got)
c.Barrier()

# 3. a receive from any source posted before one from the node-mate: the node-mate's first message is its
if me == LOCAL:
    c.send("first", 0, 2)
    c.send("second", 0, 2)
elif me == 0:
    anyone = c.irecv(source=MPI.ANY_SOURCE, tag=2)
    mate = c.recv(source=LOCAL, tag=2)
    check(anyone.wait() == "first" and mate == "second", mate)
c.Barrier()

# 4. derived datatypes within the node, both ways, against numpy
vec = MPI.DOUBLE.Create_vector(3, 1, 2).Commit()
if me == LOCAL:
    c.Send([np.arange(6.0), 1, vec], 0, 3)           # items 0, 2, 4
    c.Send(np.array([7.0, 8.0, 9.0]), 0, 3)
elif me == 0:
    got = np.zeros(3)
    st = MPI.Status()
    c.Recv(got, LOCAL, 3, st)
    check(np.array_equal(got, [0.0, 2.0, 4.0]) and st.Get_count(MPI.DOUBLE) == 3, got)
    strided = np.full(6, -1.0)
    c.Recv([strided, 1, vec], MPI.ANY_SOURCE, 3)
    check(np.array_equal(strided, [7, -1, 8, -1, 9, -1]), strided)
vec.Free()
c.Barrier()

# 5. a truncated receive within the node raises MPI's error there; the communicator goes on
if me == LOCAL:
    c.Send(np.arange(4.0), 0, 4)
    c.Send(np.arange(2.0), 0, 4)
elif me == 0:
    try:
        c.Recv(np.zeros(2), LOCAL, 4)
        check(False, "no error for a truncated receive")
    except MPI.Exception as e:
        check(e.Get_error_class() == MPI.ERR_TRUNCATE, e)
    got = np.zeros(2)
    c.Recv(got, LOCAL, 4)
    check(np.array_equal(got, [0.0, 1.0]), got)
c.Barrier()

# 6. progress: rank 0 waits on MPI (a receive from the other node) while its large send to its node-mate is
# pending in shmcoll; the other node's message comes only once the node-mate has it all
big = np.arange(BIG, dtype=np.float64)
if me == 0:
    req = c.Isend(big, LOCAL, 6)
    token = np.zeros(1)
    c.Recv(token, REMOTE, 6)
    req.Wait()
    check(token[0] == 1.0, token)
elif me == LOCAL:
    got = np.empty(BIG)
    c.Recv(got, 0, 6)
    check(np.array_equal(got, big), "the large message")
    c.Send(np.ones(1), REMOTE, 6)
elif me == REMOTE:
    c.Recv(np.zeros(1), LOCAL, 6)
    c.Send(np.ones(1), 0, 6)
c.Barrier()

# 7. and the other way: rank 0 waits in shmcoll (a receive from its node-mate) while its large send to the
# other node is pending in MPI
if me == 0:
    req = c.Isend(big, REMOTE, 7)
    token = np.zeros(1)
    c.Recv(token, LOCAL, 7)
    req.Wait()
    check(token[0] == 2.0, token)
elif me == REMOTE:
    got = np.empty(BIG)
    c.Recv(got, 0, 7)
    check(np.array_equal(got, big), "the large message")
    c.Send(np.full(1, 2.0), LOCAL, 7)
elif me == LOCAL:
    token = np.zeros(1)
    c.Recv(token, REMOTE, 7)
    c.Send(token, 0, 7)
c.Barrier()

# 8. matched probes from any source, and Waitany over both transports' requests
if me in (LOCAL, REMOTE):
    c.Send(np.full(2, float(me)), 0, 8)
    c.Send(np.full(1, float(me)), 0, 9)
elif me == 0:
    seen = []
    for _ in range(2):
        st = MPI.Status()
        msg = c.Mprobe(MPI.ANY_SOURCE, 8, st)
        got = np.zeros(2)
        msg.Recv(got)
        check((got == st.Get_source()).all(), got, st.Get_source())
        seen.append(st.Get_source())
    check(sorted(seen) == [LOCAL, REMOTE], seen)
    bufs = {LOCAL: np.zeros(1), REMOTE: np.zeros(1)}
    reqs = [c.Irecv(bufs[LOCAL], LOCAL, 9), c.Irecv(bufs[REMOTE], REMOTE, 9)]
    done = set()
    for _ in range(2):
        st = MPI.Status()
        i = MPI.Request.Waitany(reqs, st)
        done.add(i)
        src = (LOCAL, REMOTE)[i]
        check(st.Get_source() == src and bufs[src][0] == src, i, st.Get_source())
    check(done == {0, 1} and MPI.Request.Waitany(reqs) == MPI.UNDEFINED, done)
c.Barrier()

# 9. a Split's receive from any source with a given tag (Open MPI gives no TAG_UB on a Split)
half = c.Split(me % 2, me)
if half.Get_rank() == 1:
    half.Send(np.full(1, 3.0), 0, 11)
if half.Get_rank() == 0:
    got = np.zeros(1)
    half.Recv(got, MPI.ANY_SOURCE, 11)
    check(got[0] == 3.0, got)
half.Free()

# 10. a receive into a buffer mpi4py refuses raises mpi4py's error and leaves the message to the next one
if me == LOCAL:
    c.Send(np.arange(4.0), 0, 12)
elif me == 0:
    for source in (LOCAL, MPI.ANY_SOURCE):
        try:
            c.Recv(np.zeros((4, 2))[:, 0], source, 12)
            check(False, "a strided buffer taken")
        except (BufferError, ValueError):
            pass
    got = np.zeros(4)
    c.Recv(got, LOCAL, 12)
    check(np.array_equal(got, np.arange(4.0)), got)
c.Barrier()

# 11. a probe from any source, then a receive from any source: the probed message, whichever transport has it
if me in (LOCAL, REMOTE):
    c.Send(np.full(me, float(me)), 0, 13)
if me == 0:
    for _ in range(2):
        st = MPI.Status()
        c.Probe(MPI.ANY_SOURCE, 13, st)
        got = np.zeros(st.Get_count(MPI.DOUBLE))
        c.Recv(got, MPI.ANY_SOURCE, 13, st)
        check(got.size == st.Get_source() and (got == st.Get_source()).all(), got, st.Get_source())
c.Barrier()

# 12. Waitany passes over an inactive persistent request of MPI's own (COMM_SELF's); a freed communicator's
# queued receive leaves the others' traffic alone; a started persistent send refuses a second Start
if me == 0:
    idle = MPI.COMM_SELF.Recv_init(np.zeros(1), 0, 1)
    got = np.zeros(1)
    reqs = [c.Irecv(got, LOCAL, 14), idle]
    check(MPI.Request.Waitany(reqs) == 0 and got[0] == 7.0, got)
    idle.Free()
    d = c.Dup()
    d.Irecv(np.zeros(1), MPI.ANY_SOURCE, 15).Free()
    d.Free()
    c.Recv(got, LOCAL, 16)
    check(got[0] == 8.0, got)
    again = c.Send_init(np.ones(1), LOCAL, 17)
    again.Start()
    try:
        again.Start()
        check(False, "a second Start taken")
    except MPI.Exception as e:
        check(e.Get_error_class() == MPI.ERR_REQUEST, e)
    again.Wait()
    again.Free()
elif me == LOCAL:
    c.Send(np.full(1, 7.0), 0, 14)
    d = c.Dup()
    d.Free()
    c.Send(np.full(1, 8.0), 0, 16)
    c.Recv(np.zeros(1), 0, 17)
else:
    c.Dup().Free()
c.Barrier()

# 13. a wait within the node turns MPI's progress for MPI's own nonblocking collective (rank 0 waits on its
# node-mate, who waits on the other node, whose message comes once its Ibarrier completes)
req = c.Ibarrier()
if me == 0:
    got = np.zeros(1)
    c.Recv(got, LOCAL, 18)
    check(got[0] == 42.0, got)
elif me == LOCAL:
    req.Wait()
    c.Recv(np.zeros(1), REMOTE, 19)
    c.Send(np.full(1, 42.0), 0, 18)
elif me == REMOTE:
    req.Wait()
    c.Send(np.zeros(1), LOCAL, 19)
req.Wait()
c.Barrier()

# 14. a blocking send to the other node sweeps a receive from any source queued before it (the node-mate's
# large message to it is what lets the other node receive); then a truncated receive in a Waitall is
# MPI's ERR_IN_STATUS, the error in its status, the other request complete
if me == 0:
    got = np.empty(BIG)
    anyone = c.Irecv(got, MPI.ANY_SOURCE, 20)
    c.Send(big, REMOTE, 21)
    anyone.Wait()
    check(np.array_equal(got, big), "the node-mate's large message")
    short, fine = np.zeros(1), np.zeros(1)
    reqs, sts = [c.Irecv(short, LOCAL, 22), c.Irecv(fine, LOCAL, 23)], []
    try:
        MPI.Request.Waitall(reqs, sts)
        check(False, "no error")
    except MPI.Exception as e:
        check(e.Get_error_class() == MPI.ERR_IN_STATUS, e)
    check(sts[0].Get_error() == MPI.ERR_TRUNCATE and fine[0] == 5.0 and not reqs[0] and not reqs[1], sts[0].Get_error())
    # the same without statuses (node-mates' requests alone: the face's shorter path), a send among them
    short, fine = np.zeros(1), np.zeros(1)
    reqs = [c.Irecv(short, LOCAL, 25), c.Isend(np.full(1, 7.0), LOCAL, 27), c.Irecv(fine, LOCAL, 26)]
    try:
        MPI.Request.Waitall(reqs)
        check(False, "no error without statuses")
    except MPI.Exception as e:
        check(e.Get_error_class() == MPI.ERR_IN_STATUS, e)
    check(fine[0] == 6.0 and not any(reqs), (fine, reqs))
elif me == LOCAL:
    c.Send(big, 0, 20)
    c.Send(np.zeros(1), REMOTE, 24)
    c.Send(np.zeros(2), 0, 22)
    c.Send(np.full(1, 5.0), 0, 23)
    got = np.zeros(1)
    c.Recv(got, 0, 27)                  # sent after 0 posted its receive of 25: the truncation is found in the wait
    check(got[0] == 7.0, got)
    c.Send(np.zeros(2), 0, 25)
    c.Send(np.full(1, 6.0), 0, 26)
elif me == REMOTE:
    c.Recv(np.zeros(1), LOCAL, 24)
    got = np.empty(BIG)
    c.Recv(got, 0, 21)
c.Barrier()

# 15. a request of MPI's own tested alone (MPICH's Iflush_buffer fails a Test after a Get_status)
MPI.Attach_buffer(bytearray(1 << 12))
try:
    flush = MPI.Iflush_buffer()
except NotImplementedError:             # Open MPI 5.0 has no MPI-4.1 buffer flush
    flush = None
while flush is not None and not flush.Test():
    pass
MPI.Detach_buffer()
c.Barrier()

# 16. a node-mate's truncated receive, posted before its message: its status names the message's source and
# tag, as MPI's; Waitall of a generator is refused as mpi4py refuses it (the face's shorter path ate it)
if me == 0:
    st = MPI.Status()
    req = c.Irecv(np.zeros(1), MPI.ANY_SOURCE, MPI.ANY_TAG)
    c.Send(np.zeros(1), LOCAL, 28)
    try:
        req.Wait(st)
        check(False, "no truncation")
    except MPI.Exception as e:
        check(e.Get_error_class() == MPI.ERR_TRUNCATE and (st.Get_source(), st.Get_tag()) == (LOCAL, 29),
              e, st.Get_source(), st.Get_tag())
    reqs = [c.Irecv(np.zeros(1), LOCAL, 30)]
    try:
        MPI.Request.Waitall(r for r in reqs)
        check(False, "a generator taken")
    except TypeError:
        pass
    c.Send(np.zeros(1), LOCAL, 31)
    reqs[0].Wait()
    st = MPI.Status()
    try:                                # a blocking receive's too
        c.Recv(np.zeros(1), MPI.ANY_SOURCE, 32, st)
        check(False, "no truncation in Recv")
    except MPI.Exception as e:
        check(e.Get_error_class() == MPI.ERR_TRUNCATE and (st.Get_source(), st.Get_tag()) == (LOCAL, 32),
              e, st.Get_source(), st.Get_tag())
elif me == LOCAL:
    c.Recv(np.zeros(1), 0, 28)
    c.Send(np.zeros(2), 0, 29)
    c.Recv(np.zeros(1), 0, 31)
    c.Send(np.zeros(1), 0, 30)
    c.Send(np.zeros(2), 0, 32)
# 17. TAG_UB is one a node-mate's message can carry (Open MPI's own is 2^31 - 1, past shmcoll's 2^29 - 1)
ub = c.Get_attr(MPI.TAG_UB)
check(32767 <= ub <= (1 << 29) - 1, ub)
if me == 0:
    c.Send(np.full(1, 3.0), LOCAL, ub)
elif me == LOCAL:
    got = np.zeros(1)
    c.Recv(got, 0, ub)
    check(got[0] == 3.0, got)
c.Barrier()
if me == 0:
    sys.stdout.write("ok\n")
