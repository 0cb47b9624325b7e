"""The hierarchical communicator: shmcoll legs within each node, MPI legs
between nodes (Open MPI's coll/han and MPICH's *_intra_smp, with shmcoll
as the node layer).

Every rank runs the same legs in the same order, so a leg never waits on
a rank busy in another.  Node legs go to the node's shmcoll communicator
(`node`); inter-node legs to MPI among the nodes' local rank 0s
(`leaders`), or, where fewer copies result, point-to-point between the
root and each node's leader (Gather, Scatter) or among all ranks
(Alltoall's off-node blocks).  Reductions run in a fixed order (the node's
ranks, then MPI among the leaders), so a result is the same from run to
run.  Nodes must hold consecutive ranks of the communicator for the
layouts that assume it (the usual block placement); otherwise, and for
what the legs cannot express (derived datatypes, user-defined ops), the
call is MPI's own on the whole communicator.  Communicators made from
this one (Dup, Split, ...) are hierarchical too; everything else
(point-to-point, the other communicator calls, object collectives) is the
MPI communicator's."""
import functools
import operator
import os
import sys

import numpy as np

from ..buffers import IN_PLACE as SHM_IN_PLACE
from ..errors import PeerFailure
from . import flatc
from .layout import close_node
from .specs import Fallback, displacements, in_place, mpi, offsets, op_pair, packed, reducible, simple, unpack, vector

TAG = 7                 # point-to-point legs run on a communicator of their own (p2p): any tag serves


K, M = 1 << 10, 1 << 20
# Below these sizes (bytes of the whole buffer for Bcast and the reductions,
# of one rank's block for the others) the MPI library's own call on the
# whole communicator beat the legs (4 and 8 ranks as 2 virtual nodes on 2
# vCPUs, bench/README.md "Issue 47"): the legs' fixed costs (three calls,
# one of them MPI's own) outweigh what the node legs save.  None: always
# MPI's own (the legs never won).  from_mpi(flat_below=) overrides.
FLAT_BELOW = {
    "MPICH": {"barrier": 0, "bcast": 64 * K, "reduce": 4 * K, "allreduce": 16 * K, "allgather": 16 * K,
              "gather": 16 * K, "scatter": 16 * M, "alltoall": 4 * M, "reduce_scatter": None},
    "Open MPI": {"barrier": None, "bcast": 256 * K, "reduce": M, "allreduce": 128 * K, "allgather": 64 * K,
                 "gather": 4 * M, "scatter": 256 * K, "alltoall": 256 * K, "reduce_scatter": 256 * K},
}
# Where each rank of the machine has a CPU of its own (16 ranks as 4
# virtual nodes of 4 on 16 cores, bench/README.md "Issue 47 on 16
# cores"), these rows differ: MPI's shared-memory calls run in parallel
# there, and its own Reduce (MPICH, 16 KiB-1 MiB: legs 0.94-1.22 of it),
# Allreduce (MPICH, 16 KiB: 1.11), Scatter (Open MPI, 1-16 MiB: 1.9-4.0)
# and Alltoall (Open MPI, 256 KiB-1 MiB: 1.06-1.26) beat the legs.
OWN_CPUS = {
    "MPICH": {"reduce": 4 * M, "allreduce": 64 * K},
    "Open MPI": {"scatter": None, "alltoall": 4 * M},
}


SPREAD = 16 * K       # from here an Allreduce's MPI leg is spread over the node's ranks
# A Bcast, Reduce or Allreduce from twice this runs its legs piece by
# piece: each piece's bytes are still in the L3 when its next leg reads
# them, and the MPI library's call on a piece can take a faster path
# (4 ranks as 2+2 virtual nodes, 16 MiB: MPICH's Reduce 0.92 of its own
# -> 0.23, Allreduce 0.68 -> 0.48, Bcast 0.63 -> 0.45; Open MPI's 0.71 ->
# 0.42, 0.72 -> 0.44, 0.80 -> 0.40; 1 MiB pieces measured alike, 4 MiB
# worse at 4 MiB calls; bench/README.md "Issue 47: large calls in pieces")
PIECE = 2 * M


EXCHANGE = (16 * K, 512 * K)     # the bytes of one node's part that an Allreduce's MPI leg exchanges (_allreduce_among)


SUM_ARG = object()      # an op left out: SUM, as mpi4py's default (None is refused, as mpi4py refuses it)


class Flat(Exception):
    """This call is MPI's own: the legs lose at its size."""


def flat_given(given):
    """from_mpi's flat_below, checked: None, bytes for every collective,
    or a copy of a dict of bytes (or None: never) by collective."""
    if given is None:
        return None
    if isinstance(given, dict):
        unknown = set(given) - set(FLAT_BELOW["MPICH"])
        if unknown:
            raise ValueError(f"flat_below: no collective {sorted(map(str, unknown))}; "
                             f"these are {sorted(FLAT_BELOW['MPICH'])}")
        return {k: None if v is None else _bytes(v, f"flat_below[{k!r}]") for k, v in given.items()}
    return _bytes(given, "flat_below")


def _bytes(v, what):
    if isinstance(v, bool) or not hasattr(type(v), "__index__"):
        raise TypeError(f"{what}: a number of bytes (an int), not {v!r}")
    v = operator.index(v)
    if v < 0:
        raise ValueError(f"{what}: a number of bytes, not {v}")
    return v


def flat_table(library, given=None, env=os.environ, crowded=True):
    """The sizes below which each collective is MPI's own: given (as
    flat_given returns it: an int for all, or a dict by collective), else
    SHMCOLL_FLAT_BELOW (bytes, for all), over the library's row (crowded:
    some machine's ranks outnumber its CPUs; else with OWN_CPUS's
    changes)."""
    name = "Open MPI" if library.startswith("Open MPI") else "MPICH"
    row = {**FLAT_BELOW[name], **({} if crowded else OWN_CPUS[name])}
    if given is None and env.get("SHMCOLL_FLAT_BELOW", "").strip():
        text = env["SHMCOLL_FLAT_BELOW"].strip()
        if not text.isdigit():
            raise ValueError(f"SHMCOLL_FLAT_BELOW={text!r}: a number of bytes")
        given = int(text)
    if isinstance(given, int):
        row = dict.fromkeys(row, given)
    elif given:
        row.update(given)
    return row


def _legs(fn):
    """Fall back to MPI for what the legs cannot express, or where they
    lose; a peer's failure in a node leg ends the whole job (MPI cannot
    carry on without it)."""
    name = fn.__name__.lstrip("_")

    @functools.wraps(fn)
    def method(self, *args, **kw):
        if self.freed:          # MPI's error, on every rank alike (the legs' communicators are gone)
            return getattr(self.mpi, name)(*args, **kw)
        try:
            return fn(self, *args, **kw)
        except Flat:
            return getattr(self.mpi, name)(*args, **kw)
        except Fallback:
            self.fallbacks += 1
            return getattr(self.mpi, name)(*args, **kw)
        except PeerFailure as e:
            self._abort(e)
    return method


class Hier:
    """An MPI communicator (any size, one node or many) whose collectives
    run hierarchically.  node: this node's shmcoll communicator; leaders:
    MPI among each node's local rank 0 (None on the others)."""

    def __init__(self, mpi_comm, node_mpi, leaders, up, node, node_of, local_of, flat_below, p2p, network=True,
                 options=None, given=None, crowded=(True, True)):
        self.up, self.network, self.options, self._given, self._crowded = up, network, options, given, crowded
        self._below = {k: float("inf") if v is None else v for k, v in flat_below.items()}
        self._ip, self._sum = mpi().IN_PLACE, mpi().SUM       # looked up once: the checks below are per call
        self.p2p = p2p          # a duplicate of mpi_comm: the user's Send/Recv on this one (mpi_comm's) never match it
        self._spare = {}
        self.mpi, self.node_mpi, self.leaders, self.node = mpi_comm, node_mpi, leaders, node
        self.rank, self.size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        self.node_of, self.local_of = node_of, local_of
        self.nodes = [np.flatnonzero(node_of == n) for n in range(int(node_of.max()) + 1)]
        self.me, self.local = int(node_of[self.rank]), int(local_of[self.rank])
        self.starts = np.array([m[0] for m in self.nodes], np.int64)
        self.counts = np.array([m.size for m in self.nodes], np.int64)
        self.blocked = all(np.array_equal(m, np.arange(m[0], m[0] + m.size)) for m in self.nodes) and \
            bool(np.all(np.diff(self.starts) > 0))
        self.first, self.end = int(self.starts[self.me]), int(self.starts[self.me] + self.counts[self.me])
        self.many = len(self.nodes) > 1
        # every node as many ranks, in consecutive blocks: the up level's
        # ranks (ordered by rank) are then in node order
        self.even = self.blocked and bool((self.counts == self.counts[0]).all())
        self.fallbacks = 0      # calls that were MPI's own (what the legs cannot express)
        self._flat_states = []      # the C entries' states (flatc.py)
        self.freed = False
        flatc.install(self, mpi())

    def __getattr__(self, name):
        return getattr(self.mpi, name)

    def __repr__(self):
        return (f"<shmcoll hierarchical communicator: rank {self.rank} of {self.size}, node {self.me} of "
                f"{len(self.nodes)} (local rank {self.local} of {self.counts[self.me]})>")

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def _abort(self, exc):
        """A node peer failed: name it by its rank in this communicator
        (the reason's ranks are the node's local ones), end the job."""
        who = int(self.nodes[self.me][exc.rank]) if 0 <= exc.rank < self.counts[self.me] else exc.rank
        MPI, named = mpi(), ["", ""]
        if MPI.Comm.Compare(self.mpi, MPI.COMM_WORLD) != MPI.CONGRUENT:       # a Split's, say: the world's too
            world = MPI.Group.Translate_ranks(self.mpi.Get_group(), [who, self.rank], MPI.COMM_WORLD.Get_group())
            named = [f" (COMM_WORLD rank {w})" for w in world]
        print(f"shmcoll: rank {who}{named[0]} failed: {type(exc).__name__}: {exc} (local ranks of node {self.me}, "
              f"seen by rank {self.rank}{named[1]}); aborting the MPI job", file=sys.stderr, flush=True)
        self.mpi.Abort(1)

    def _flat(self, op, nbytes):
        """Raise Flat where MPI's own call wins at nbytes (alike on every
        rank: MPI makes the sizes match)."""
        if nbytes < self._below[op]:
            raise Flat

    def _scratch(self, n, dtype, slot=0):
        """n items of dtype in a buffer kept between calls (a fresh one
        page-faults on every call: 64 MiB is 16k faults)."""
        nbytes = n * np.dtype(dtype).itemsize
        buf = self._spare.get(slot)
        if buf is None or buf.size < nbytes:
            buf = self._spare[slot] = np.empty(nbytes, np.uint8)
        return buf[:nbytes].view(dtype)

    def _exchange(self, r, sizes, starts):
        """Leaders: each node's piece of r (sizes[n] items at starts[n],
        this node's already there) to every leader.  MPICH's Allgatherv
        between two leaders took 4x its Allgather's time at 2 MiB (1134 us
        against 290), so equal pieces go by Allgather, unequal ones by a
        ring of Sendrecv (N - 1 steps, each forwarding the piece that came
        in the step before)."""
        if (sizes == sizes[0]).all() and (starts == np.arange(len(sizes)) * sizes[0]).all():
            self.leaders.Allgather(mpi().IN_PLACE, r[:int(sizes.sum())])
            return
        n, me = len(sizes), self.me
        right, left = (me + 1) % n, (me - 1) % n
        for step in range(n - 1):
            out, into = (me - step) % n, (me - step - 1) % n
            self.leaders.Sendrecv(r[starts[out]:starts[out] + sizes[out]], right, TAG,
                                  r[starts[into]:starts[into] + sizes[into]], left, TAG)

    def _root(self, root):
        """root as an int, where it names a rank of this communicator; else
        Fallback: MPI's own call refuses it on every rank (as an index, -1
        would name the last rank, and a rank past the end fail on some)."""
        if isinstance(root, (int, np.integer)) and 0 <= root < self.size:
            return int(root)
        raise Fallback

    @staticmethod
    def _alike(s, r, n, rest=0, folded=False):
        """Fallback unless sendbuf s (unless IN_PLACE) holds n items' bytes
        of recvbuf r's dtype (its dtype too where folded: a reduction) and r
        splits into whole blocks (rest 0): what mpi4py checks on every rank
        alike.  Inside a node leg the mismatch would raise on some ranks, or
        leave the node's communicator unusable; MPI's own call raises on
        every rank (or carries it) and goes on."""
        if rest or not in_place(s) and (s.nbytes != n * r.itemsize or folded and s.dtype != r.dtype):
            raise Fallback

    def _need_blocks(self):
        if not self.blocked:
            raise Fallback

    def _leader(self, n):
        return int(self.nodes[n][0])

    # -- the collectives: a call below FLAT_BELOW on plain arrays goes to
    # MPI after one check (a generic wrapper's cost, 0.4 us a call, was a
    # fifth of a small Bcast's); the rest to the legs (_Bcast, ...), which
    # parse the specs and decide to the same size

    def Barrier(self):
        if self._below["barrier"] > 0:
            return self.mpi.Barrier()
        return self._Barrier()

    def Bcast(self, buf, root=0):
        if type(buf) is np.ndarray and buf.nbytes < self._below["bcast"]:
            return self.mpi.Bcast(buf, root)
        return self._Bcast(buf, root)

    def Reduce(self, sendbuf, recvbuf=None, op=SUM_ARG, root=0):
        if op is None:                  # mpi4py's TypeError (its default is SUM; None is no op)
            return self.mpi.Reduce(sendbuf, recvbuf, op, root)
        op = self._sum if op is SUM_ARG else op
        x = recvbuf if sendbuf is self._ip or sendbuf is None else sendbuf
        if type(x) is np.ndarray and x.nbytes < self._below["reduce"]:
            return self.mpi.Reduce(sendbuf, recvbuf, op, root)
        return self._Reduce(sendbuf, recvbuf, op, root)

    def Allreduce(self, sendbuf, recvbuf, op=SUM_ARG):
        if op is None:
            return self.mpi.Allreduce(sendbuf, recvbuf, op)
        op = self._sum if op is SUM_ARG else op
        if type(recvbuf) is np.ndarray and recvbuf.nbytes < self._below["allreduce"]:
            return self.mpi.Allreduce(sendbuf, recvbuf, op)
        return self._Allreduce(sendbuf, recvbuf, op)

    def Allgather(self, sendbuf, recvbuf):
        if type(recvbuf) is np.ndarray and recvbuf.nbytes < self._below["allgather"] * self.size:
            return self.mpi.Allgather(sendbuf, recvbuf)
        return self._Allgather(sendbuf, recvbuf)

    def Alltoall(self, sendbuf, recvbuf):
        if type(recvbuf) is np.ndarray and recvbuf.nbytes < self._below["alltoall"] * self.size:
            return self.mpi.Alltoall(sendbuf, recvbuf)
        return self._Alltoall(sendbuf, recvbuf)

    def Gather(self, sendbuf, recvbuf=None, root=0):
        x = recvbuf if self.rank == root and (sendbuf is None or sendbuf is self._ip) else sendbuf
        if type(x) is np.ndarray and x.nbytes < self._below["gather"] * (self.size if x is recvbuf else 1):
            return self.mpi.Gather(sendbuf, recvbuf, root)
        return self._Gather(sendbuf, recvbuf, root)

    def Scatter(self, sendbuf, recvbuf, root=0):
        x = sendbuf if self.rank == root and (recvbuf is None or recvbuf is self._ip) else recvbuf
        if type(x) is np.ndarray and x.nbytes < self._below["scatter"] * (self.size if x is sendbuf else 1):
            return self.mpi.Scatter(sendbuf, recvbuf, root)
        return self._Scatter(sendbuf, recvbuf, root)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=SUM_ARG):
        if op is None:
            return self.mpi.Reduce_scatter_block(sendbuf, recvbuf, op)
        op = self._sum if op is SUM_ARG else op
        if type(recvbuf) is np.ndarray and \
                recvbuf.nbytes < self._below["reduce_scatter"] * (self.size if sendbuf is self._ip or sendbuf is None else 1):
            return self.mpi.Reduce_scatter_block(sendbuf, recvbuf, op)
        return self._Reduce_scatter_block(sendbuf, recvbuf, op)


    @_legs
    def _Barrier(self):
        self._flat("barrier", 0)
        self.node.Barrier()
        if self.many:
            if self.leaders is not None:
                self.leaders.Barrier()
            self.node.Barrier()

    @staticmethod
    def _pieces(n, itemsize, grain):
        """Ranges [lo, hi) that cover n items of itemsize bytes: one under
        2 PIECE bytes, else pieces of about PIECE bytes, each a multiple of
        grain items but the last (the rest).  Their legs run one piece after
        another, so a piece's bytes are still in the caches when its next
        leg reads them."""
        step = max(PIECE // itemsize // grain, 1) * grain
        if n < 2 * step:
            return [(0, n)]
        return [(lo, min(lo + step, n)) for lo in range(0, n, step)]

    @_legs
    def _Bcast(self, buf, root=0):
        root = self._root(root)
        a = simple(buf, "buf", writable=self.rank != root)
        self._flat("bcast", a.nbytes)
        P = int(self.counts[self.me])
        # HAN's where every node has as many ranks: each local rank carries
        # 1/P of the buffer to its peers on the other nodes, whose node then
        # Allgathers the parts (MPICH 2+2, same run: 0.68 of MPI's own at
        # 1 MiB, 1.07 through the leaders)
        spread = self.many and self.even and a.size % P == 0
        for lo, hi in self._pieces(a.size, a.itemsize, P if spread else 1):
            self._bcast(a[lo:hi], root, spread, P)

    def _bcast(self, a, root, spread, P):
        rn = int(self.node_of[root])
        if self.me == rn:
            self.node.Bcast(a, root=int(self.local_of[root]))
        if spread:
            part = a.size // P
            self.up.Bcast(a[self.local * part:(self.local + 1) * part], root=rn)
            if self.me != rn:
                self.node.Allgather(SHM_IN_PLACE, a)
            return
        if self.leaders is not None and self.many:
            self.leaders.Bcast(a, root=rn)
        if self.me != rn:
            self.node.Bcast(a, root=0)

    @_legs
    def _Reduce(self, sendbuf, recvbuf, op, root):
        root = self._root(root)
        m_op, s_op = op_pair(op)
        me_root = self.rank == root
        r = simple(recvbuf, "recvbuf", True) if me_root else None
        s = simple(sendbuf, "sendbuf")
        x = r if in_place(s) else s
        reducible(m_op, s_op, x.dtype)
        self._flat("reduce", x.nbytes)
        for lo, hi in self._pieces(x.size, x.itemsize, 1):
            self._reduce(s if in_place(s) else s[lo:hi], r if r is None else r[lo:hi], m_op, s_op, root)

    def _reduce(self, s, r, m_op, s_op, root):
        me_root = self.rank == root
        rn, rl = int(self.node_of[root]), int(self.local_of[root])
        if self.local == 0:
            part = r if me_root else self._scratch(s.size, s.dtype)
            self.node.Reduce(SHM_IN_PLACE if in_place(s) else s, part, op=s_op, root=0)
            if self.many:
                self._tree_reduce(part, m_op, rn)
            if self.me == rn and rl != 0:
                self.node.Send(part, dest=rl, tag=TAG)
        else:
            self.node.Reduce(r if in_place(s) else s, None, op=s_op, root=0)
            if me_root:
                self.node.Recv(r, source=0, tag=TAG)

    def _tree_reduce(self, part, m_op, rn):
        """Leaders: every node's part reduced into node rn's leader's,
        by a binomial tree of sends, each leader folding what it receives
        into its part with the MPI library's own kernel (as MPICH's
        binomial Reduce does, in its order: received op own).  MPICH's
        Reduce between two leaders took 1,414 us at 1 MiB, seven times its
        Allreduce and ten times a Send (bench/README.md "Issue 47: the
        Reduce's leaders")."""
        n = self.leaders.Get_size()
        v, mask = (self.me - rn) % n, 1
        while mask < n:
            if v & mask:
                self.leaders.Send(part, dest=(v - mask + rn) % n, tag=TAG)
                return
            if v + mask < n:
                got = self._scratch(part.size, part.dtype, slot=1)
                self.leaders.Recv(got, source=(v + mask + rn) % n, tag=TAG)
                m_op.Reduce_local(got, part)
            mask <<= 1

    @_legs
    def _Allreduce(self, sendbuf, recvbuf, op):
        m_op, s_op = op_pair(op)
        r, s = simple(recvbuf, "recvbuf", True), simple(sendbuf, "sendbuf")
        reducible(m_op, s_op, r.dtype)
        self._alike(s, r, r.size, folded=True)
        self._flat("allreduce", r.nbytes)
        if not self.many:
            return self.node.Allreduce(SHM_IN_PLACE if in_place(s) else s, r, op=s_op)
        P = int(self.counts[self.me])
        # HAN's where every node has as many ranks: node Reduce_scatter,
        # each local rank's part over the nodes, node Allgather: every rank
        # carries 1/P of the MPI leg
        spread = self.even and r.nbytes >= SPREAD and r.size % P == 0
        for lo, hi in self._pieces(r.size, r.itemsize, P if spread else 1):
            self._allreduce(s if in_place(s) else s[lo:hi], r[lo:hi], m_op, s_op, spread, P)

    def _allreduce(self, s, r, m_op, s_op, spread, P):
        if spread:
            part = self._scratch(r.size // P, r.dtype)
            self.node.Reduce_scatter_block(r if in_place(s) else s, part, op=s_op)
            self.node.Allgather(self._allreduce_among(self.up, part, m_op), r)
            return
        if self.local == 0:
            self.node.Reduce(SHM_IN_PLACE if in_place(s) else s, r, op=s_op, root=0)
            got = self._allreduce_among(self.leaders, r, m_op)
            if got is not r:
                r[...] = got
        else:
            self.node.Reduce(r if in_place(s) else s, None, op=s_op, root=0)
        self.node.Bcast(r, root=0)

    def _allreduce_among(self, comm, part, m_op):
        """part reduced over comm's ranks (one per node) into every one's
        part, or into the scratch buffer it returns (the result is where
        it returns).  Between EXCHANGE's sizes on a power of two of them, by
        recursive doubling of Sendrecvs and MPI's own Reduce_local:
        MPICH's Allreduce between two leaders took 33.4 us at 32 KiB and
        47 at 128 KiB against 21.6 and 40 for the exchange (Open MPI's
        21.7 and 34.8 against 15.4 and 29.5); at 8 and 512 KiB MPI's own
        was as fast or faster (bench/README.md "Issue 47: the
        Allreduce's exchange")."""
        n = comm.Get_size()
        if n & (n - 1) or not EXCHANGE[0] <= part.nbytes < EXCHANGE[1]:
            comm.Allreduce(mpi().IN_PLACE, part, op=m_op)
            return part
        me, mask = comm.Get_rank(), 1
        cur, other = part, self._scratch(part.size, part.dtype, slot=1)
        while mask < n:
            peer = me ^ mask
            comm.Sendrecv(cur, peer, TAG, other, peer, TAG)
            # both partners fold the lower rank's into the higher's, so
            # that every rank gets the same bits (MAX of -0.0 and 0.0, or
            # of a NaN, depends on the order, as does a NaN's sign in a SUM)
            if peer < me:
                m_op.Reduce_local(other, cur)
            else:
                m_op.Reduce_local(cur, other)
                cur, other = other, cur
            mask <<= 1
        return cur

    @_legs
    def _Allgather(self, sendbuf, recvbuf):
        """Node Allgather of the node's blocks; then, where every node has
        as many ranks, the other nodes' blocks from the peers there (HAN's
        up level); else the leaders exchange them and give them to their
        node.  Across a network each block crosses it once: each rank
        takes its peers' own blocks, and the node shares them out (one node
        Allgather per node).  Where MPI's legs are shared memory too
        (virtual nodes) each rank takes its peers' whole nodes: fewer calls
        (MPICH 2+2, 16 KiB-16 MiB: 0.74-1.06 of MPI's own, against
        0.74-1.32 block by block)."""
        self._need_blocks()
        r = simple(recvbuf, "recvbuf", True, self.size)
        k = r.size // self.size
        self._flat("allgather", k * r.itemsize)
        s = simple(sendbuf, "sendbuf")
        self._alike(s, r, k, r.size % self.size)
        mine = SHM_IN_PLACE if in_place(s) else s
        if self.many and self.even and self.network:
            got = self._scratch(k * len(self.nodes), r.dtype)
            self.up.Allgather(r[k * self.rank:k * (self.rank + 1)] if in_place(s) else s, got)
            P = int(self.counts[0])
            for n in range(len(self.nodes)):
                self.node.Allgather(mine if n == self.me else got[k * n:k * (n + 1)], r[k * n * P:k * (n + 1) * P])
            return
        self.node.Allgather(mine, r[k * self.first:k * self.end])
        if not self.many:
            return
        if self.even:
            self.up.Allgather(mpi().IN_PLACE, r[:k * self.size])
            return
        if self.local == 0:
            self._exchange(r, k * self.counts, k * self.starts)
        if self.first:
            self.node.Bcast(r[:k * self.first], root=0)
        if self.end < self.size:
            self.node.Bcast(r[k * self.end:k * self.size], root=0)

    @_legs
    def Allgatherv(self, sendbuf, recvbuf):
        self._need_blocks()
        a, counts, displs = vector(recvbuf, "recvbuf", self.size, True)
        self._flat("allgather", int(counts.max(initial=0)) * a.itemsize)
        r = a if packed(counts, displs) else np.empty(int(counts.sum()), a.dtype)
        offs = offsets(counts)
        s = simple(sendbuf, "sendbuf")
        if in_place(s):
            s = a[displs[self.rank]:displs[self.rank] + counts[self.rank]].copy()
        lo, hi = int(offs[self.first]), int(offs[self.end])
        if self.local == 0:
            c = counts[self.first:self.end]
            self.node.Gatherv(s, [r[lo:hi], (c, offs[self.first:self.end] - lo)], root=0)
            if self.many:
                self._exchange(r, offs[self.starts + self.counts] - offs[self.starts], offs[self.starts])
        else:
            self.node.Gatherv(s, None, root=0)
        self.node.Bcast(r[:int(offs[-1])], root=0)
        if r is not a:
            unpack(a, counts, displs, r, range(self.size))

    @_legs
    def _Gather(self, sendbuf, recvbuf=None, root=0):
        self._need_blocks()
        root = self._root(root)
        me_root = self.rank == root
        s = simple(sendbuf, "sendbuf")
        r = simple(recvbuf, "recvbuf", True, self.size) if me_root else None
        if me_root and r.size % self.size:
            raise Fallback              # mpi4py's ValueError, at the root
        k = r.size // self.size if me_root else s.size
        self._flat("gather", k * (r if me_root else s).itemsize)
        rn, rl = int(self.node_of[root]), int(self.local_of[root])
        if self.me == rn:
            reqs = [self.p2p.Irecv(r[k * self.starts[n]:k * (self.starts[n] + self.counts[n])],
                                   source=self._leader(n), tag=TAG)
                    for n in range(len(self.nodes)) if n != rn] if me_root else []
            self.node.Gather(SHM_IN_PLACE if in_place(s) else s, r[k * self.first:k * self.end] if me_root else None,
                             root=rl)
            mpi().Request.Waitall(reqs)
        elif self.local == 0:
            part = self._scratch(k * (self.end - self.first), s.dtype)
            self.node.Gather(s, part, root=0)
            self.p2p.Send(part, dest=root, tag=TAG)
        else:
            self.node.Gather(s, None, root=0)

    @_legs
    def _Scatter(self, sendbuf, recvbuf, root=0):
        self._need_blocks()
        root = self._root(root)
        me_root = self.rank == root
        r = simple(recvbuf, "recvbuf", True)
        s = simple(sendbuf, "sendbuf", False, self.size) if me_root else None
        if me_root and s.size % self.size:
            raise Fallback              # mpi4py's ValueError, at the root
        k = s.size // self.size if me_root else r.size
        self._flat("scatter", k * (s if me_root else r).itemsize)
        rn, rl = int(self.node_of[root]), int(self.local_of[root])
        if self.me == rn:
            reqs = [self.p2p.Isend(s[k * self.starts[n]:k * (self.starts[n] + self.counts[n])],
                                   dest=self._leader(n), tag=TAG)
                    for n in range(len(self.nodes)) if n != rn] if me_root else []
            self.node.Scatter(s[k * self.first:k * self.end] if me_root else None,
                              SHM_IN_PLACE if in_place(r) else r, root=rl)
            mpi().Request.Waitall(reqs)
        elif self.local == 0:
            part = self._scratch(k * (self.end - self.first), r.dtype)
            self.p2p.Recv(part, source=root, tag=TAG)
            self.node.Scatter(part, r, root=0)
        else:
            self.node.Scatter(None, r, root=0)

    @_legs
    def Gatherv(self, sendbuf, recvbuf=None, root=0):
        self._need_blocks()
        root = self._root(root)
        me_root = self.rank == root
        s = simple(sendbuf, "sendbuf")
        rn, rl = int(self.node_of[root]), int(self.local_of[root])
        if me_root:
            a, counts, displs = vector(recvbuf, "recvbuf", self.size, True)
            if in_place(s):
                s = a[displs[root]:displs[root] + counts[root]].copy()
        mine = np.empty(self.end - self.first, np.int64)        # the node's counts, at its leader
        self.node.Gather(np.array([s.size], np.int64), mine if self.local == 0 else None, root=0)
        if self.me == rn:
            if me_root:
                reqs, stage = [], []
                for n in range(len(self.nodes)):
                    if n == rn:
                        continue
                    lo, hi = self.starts[n], self.starts[n] + self.counts[n]
                    if packed(counts[lo:hi], displs[lo:hi] - displs[lo]):
                        buf = a[displs[lo]:displs[lo] + counts[lo:hi].sum()]
                    else:
                        buf = np.empty(int(counts[lo:hi].sum()), a.dtype)
                        stage.append((buf, lo, hi))
                    reqs.append(self.p2p.Irecv(buf, source=self._leader(n), tag=TAG))
                c = counts[self.first:self.end]
                self.node.Gatherv(s, [a, (c, displs[self.first:self.end])], root=rl)
                mpi().Request.Waitall(reqs)
                for buf, lo, hi in stage:
                    unpack(a, counts, displs, buf, range(lo, hi))
            else:
                self.node.Gatherv(s, None, root=rl)
        elif self.local == 0:
            part = np.empty(int(mine.sum()), s.dtype)
            self.node.Gatherv(s, [part, (mine, displacements(mine))], root=0)
            self.p2p.Send(part, dest=root, tag=TAG)
        else:
            self.node.Gatherv(s, None, root=0)

    @_legs
    def Scatterv(self, sendbuf, recvbuf, root=0):
        self._need_blocks()
        root = self._root(root)
        me_root = self.rank == root
        r = simple(recvbuf, "recvbuf", True)
        rn, rl = int(self.node_of[root]), int(self.local_of[root])
        if me_root:
            a, counts, displs = vector(sendbuf, "sendbuf", self.size)
        if not me_root and in_place(r):
            raise ValueError("Scatterv: recvbuf IN_PLACE is the root's only")
        if self.me == rn:
            if me_root:
                reqs = []
                for n in range(len(self.nodes)):
                    if n == rn:
                        continue
                    lo, hi = self.starts[n], self.starts[n] + self.counts[n]
                    buf = np.concatenate([a[displs[i]:displs[i] + counts[i]] for i in range(lo, hi)])
                    reqs.append(self.p2p.Isend(counts[lo:hi].copy(), dest=self._leader(n), tag=TAG))
                    reqs.append(self.p2p.Isend(buf, dest=self._leader(n), tag=TAG))
                self.node.Scatterv([a, (counts[self.first:self.end], displs[self.first:self.end])],
                                   SHM_IN_PLACE if in_place(r) else r, root=rl)
                mpi().Request.Waitall(reqs)
            else:
                self.node.Scatterv(None, r, root=rl)
        elif self.local == 0:
            c = np.empty(self.end - self.first, np.int64)
            self.p2p.Recv(c, source=root, tag=TAG)
            part = np.empty(int(c.sum()), r.dtype)
            self.p2p.Recv(part, source=root, tag=TAG)
            self.node.Scatterv([part, (c, displacements(c))], r, root=0)
        else:
            self.node.Scatterv(None, r, root=0)

    @_legs
    def _Alltoall(self, sendbuf, recvbuf):
        """Off-node blocks by MPI among all ranks (one Alltoallv, every
        node's blocks zero; point-to-point pairs were slower with MPICH),
        on-node ones by the node's Alltoall meanwhile."""
        self._need_blocks()
        r = simple(recvbuf, "recvbuf", True, self.size)
        s = simple(sendbuf, "sendbuf", False, self.size)
        self._alike(s, r, r.size, r.size % self.size)
        s = r.copy() if in_place(s) else s
        k = r.size // self.size
        self._flat("alltoall", k * r.itemsize)
        if not self.many:
            return self.node.Alltoall(s, r)
        counts = np.full(self.size, k, np.int64)
        counts[self.first:self.end] = 0
        displs = np.arange(self.size, dtype=np.int64) * k
        req = self.mpi.Ialltoallv([s, (counts, displs)], [r, (counts, displs)])
        self.node.Alltoall(s[k * self.first:k * self.end], r[k * self.first:k * self.end])
        req.Wait()

    @_legs
    def _Reduce_scatter_block(self, sendbuf, recvbuf, op):
        r = simple(recvbuf, "recvbuf", True, self.size if in_place(sendbuf) else 0)
        s = simple(sendbuf, "sendbuf", False, self.size)
        k = r.size // self.size if in_place(s) else r.size
        self._alike(s, r, k * self.size, folded=True)
        self._flat("reduce_scatter", k * r.itemsize)
        self._reduce_scatter(r.copy() if in_place(s) else s, r[:k], np.full(self.size, k, np.int64), op)

    @_legs
    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM_ARG):
        if op is None:
            raise Fallback              # MPI's own: mpi4py's TypeError
        op = self._sum if op is SUM_ARG else op
        r = simple(recvbuf, "recvbuf", True)
        s = simple(sendbuf, "sendbuf")
        if recvcounts is None:
            raise Fallback
        counts = np.asarray(recvcounts, np.int64).reshape(-1)
        if counts.size != self.size:
            raise ValueError(f"Reduce_scatter: {counts.size} recvcounts for {self.size} ranks")
        if not in_place(s) and r.size != counts[self.rank]:
            raise Fallback              # mpi4py's ValueError (mismatch in receive count), on this rank
        self._flat("reduce_scatter", int(counts.max(initial=0)) * r.itemsize)
        self._reduce_scatter(r.copy() if in_place(s) else s, r[:counts[self.rank]], counts, op)

    def _reduce_scatter(self, s, r, counts, op):
        """Where every node has as many ranks and every rank as many
        items, HAN's (below; MPICH 2+2, same run: 1.09 of MPI's own at
        1 MiB, 0.97 at 16 MiB, against 1.49 and 1.84 through the leaders);
        else node Reduce to the leader, Reduce_scatter among the leaders
        by node, node Scatter (Scatterv where the counts differ)."""
        self._need_blocks()
        m_op, s_op = op_pair(op)
        reducible(m_op, s_op, s.dtype)
        k = int(counts[0])
        if self.many and self.even and (counts == k).all():
            # HAN's: node Reduce_scatter_block (local rank l: blocks l N ..
            # l N + N - 1 of the node), a Reduce_scatter_block of those
            # among the local rank's peers on the other nodes (node n's
            # gets block l N + n), then each block to its rank
            N, P = len(self.nodes), int(self.counts[0])
            u = self._scratch(N * k, s.dtype)
            self.node.Reduce_scatter_block(s[:N * P * k], u, op=s_op)
            held = self.local * N + self.me             # the block this rank now holds
            source = (self.rank % N) * P + self.rank // N    # the rank holding this rank's block
            if held == self.rank:
                self.up.Reduce_scatter_block(u, r, op=m_op)
            else:
                t = self._scratch(k, s.dtype, 1)
                self.up.Reduce_scatter_block(u, t, op=m_op)
                self.p2p.Sendrecv(t, held, TAG, r, source, TAG)
            return
        offs = offsets(counts)
        mine = counts[self.first:self.end]
        even = bool((mine == mine[0]).all())
        if self.local == 0:
            whole = self._scratch(int(offs[-1]), s.dtype)
            self.node.Reduce(s[:whole.size], whole, op=s_op, root=0)
            if self.many:
                part = self._scratch(int(mine.sum()), s.dtype, 1)
                sizes = offs[self.starts + self.counts] - offs[self.starts]
                if (sizes == sizes[0]).all():
                    self.leaders.Reduce_scatter_block(whole, part, op=m_op)
                else:
                    self.leaders.Reduce_scatter(whole, part, sizes, op=m_op)
            else:
                part = whole[offs[self.first]:offs[self.end]]
            if even:
                self.node.Scatter(part, r, root=0)
            else:
                self.node.Scatterv([part, (mine, displacements(mine))], r, root=0)
        else:
            self.node.Reduce(s[:int(offs[-1])], None, op=s_op, root=0)
            if even:
                self.node.Scatter(None, r, root=0)
            else:
                self.node.Scatterv(None, r, root=0)

    # -- communicators made from this one are hierarchical too: MPI's call
    # makes the MPI communicator (collective over this one, as MPI's), and
    # the new one is built over it (collective over its ranks)

    def _derived(self, comm):
        if comm == mpi().COMM_NULL:
            return comm
        from . import build
        return build(comm, self.options, self._given, self.network, self._crowded)

    def Dup(self, info=None):
        return self._derived(self.mpi.Dup(info))

    def Dup_with_info(self, info):
        return self._derived(self.mpi.Dup_with_info(info))

    def Clone(self):
        return self._derived(self.mpi.Clone())

    def Split(self, color=0, key=0):
        return self._derived(self.mpi.Split(color, key))

    def Split_type(self, split_type, key=0, info=None):
        return self._derived(self.mpi.Split_type(split_type, key, mpi().INFO_NULL if info is None else info))

    def Create(self, group):
        return self._derived(self.mpi.Create(group))

    def Create_group(self, group, tag=0):
        return self._derived(self.mpi.Create_group(group, tag))

    def Free(self, keep=False):
        """Free the node's communicator and the MPI communicators made for
        this one (collective); keep: not self.mpi, whose handle a face's
        communicator shares and frees itself (then self.mpi is COMM_NULL)."""
        flatc.uninstall(self)
        self.freed = True
        try:
            self.node.Free()
        finally:
            close_node(self.node)
        for c in (self.leaders, self.up, self.node_mpi, self.p2p, None if keep else self.mpi):
            if c is not None:
                c.Free()
        self.leaders = None
        if keep:
            self.mpi = mpi().COMM_NULL

    def Disconnect(self):
        """MPI's Disconnect of an intracommunicator: its Free (pending calls
        are all blocking here)."""
        self.Free()
