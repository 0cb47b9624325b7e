"""Schedules: what an algorithm does, as data.

A schedule is a list of steps; a step holds moves (bytes one rank writes
and a set of ranks read) and local copies.  Planning functions in
shmcoll/coll/ build them; shmcoll/compile.py turns one into each rank's
program for the C executor; ALCD and the traffic checks read the very same
objects.  Buffers are named: "send" and "recv" are the user's (one buffer
for both in Bcast), "tmp" is per-rank scratch."""
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from . import ops

VIAS = ("auto", "inline", "staged", "stripe", "direct", "push", "shared", "queue")


@dataclass(frozen=True)
class Move:
    """src writes parts ((src offset, dst offset, bytes), ...) of its sbuf;
    every rank in dst reads them into its dbuf.  via: "auto" (inline when
    small, else staged), "inline" (in the writer's slot line), "staged"
    (through the writer's ring, in chunks), "stripe" (the NUMA-striped
    buffer), "direct" (single copy by the reader from the writer's
    buffer), "push" (single copy by the writer into the readers' recv
    buffers, once they have arrived), "shared" (single copy split
    between the two as they go: one part, one reader), "queue"
    (a packed barrier queue, named by sbuf: "gather" or "release"; no
    data)."""
    src: int
    dst: tuple
    parts: tuple = ()
    sbuf: str = "send"
    dbuf: str = "recv"
    via: str = "auto"
    chunk: int = 0          # largest chunk for staged / stripe moves (0: the plan's)

    @property
    def nbytes(self):
        return sum(n for _, _, n in self.parts)


def shared(src, dst, so, do, n):
    """One rank's n bytes to another by a single copy that both make at
    once, piece by piece (via "shared"), each taking the next piece once
    it is free: the reader reads from src's sendbuf, src writes into the
    reader's recvbuf.  Two cores copy, each from memory in its own cache
    or into the other's, and the one that pins pages faster (huge pages
    on one side only) or ends its other work first takes more."""
    return [Move(src, (dst,), ((so, do, n),), via="shared")]


@dataclass(frozen=True)
class Copy:
    rank: int
    sbuf: str
    soff: int
    dbuf: str
    doff: int
    n: int


@dataclass(frozen=True)
class Reduce:
    """rank folds its inputs, element by element and in the order given,
    into dbuf[doff:doff + n]: an input is the index of a move of this step
    that rank reads (folded from where it lands, the writer's slot line or
    ring, never copied out first; every such move carries n bytes) or
    (buf, offset) in rank's own memory."""
    rank: int
    inputs: tuple
    dbuf: str
    doff: int
    n: int


@dataclass
class Step:
    moves: list = field(default_factory=list)
    copies: list = field(default_factory=list)     # run after the step's reads
    reduces: list = field(default_factory=list)    # run as each round's pieces arrive
    order: Optional[dict] = None    # reader -> indices of the moves it reads, in its order
    far: Optional[dict] = None      # reader -> writers it waits on spinning long
    batch: bool = True              # one post per round of writes (False: one per write)


@dataclass
class Schedule:
    op: str
    algorithm: str
    nranks: int
    nbytes: int
    root: int
    steps: list
    tmp: int = 0            # scratch bytes per rank
    stream: bool = False    # copies into user memory stream past the cache
    stream_folds: bool = False   # and so do the results of folds (Call.streams_folds)
    kernel: object = None   # reductions: the ops.Kernel its Reduce items fold with
    apart: bool = False     # sendbuf and recvbuf never overlap (the module's APART: Comm checks it)

    def messages(self):
        """(sender, receiver, bytes) of every message: a move read by k
        ranks is k messages."""
        return [(m.src, d, m.nbytes) for s in self.steps for m in s.moves for d in m.dst]

    def traffic(self):
        """bytes[src, dst] the schedule moves between ranks."""
        out = np.zeros((self.nranks, self.nranks), np.int64)
        for src, dst, n in self.messages():
            out[src, dst] += n
        return out

    def __str__(self):
        lines = [f"{self.op}/{self.algorithm}: {self.nranks} ranks, {self.nbytes} bytes, root {self.root}, "
                 f"{len(self.steps)} steps"]
        for i, s in enumerate(self.steps):
            moves = ", ".join(f"{m.src}->{','.join(map(str, m.dst))} {m.nbytes}B {m.via}" for m in s.moves)
            lines.append(f"  step {i}: {moves or '-'}" + (f" + {len(s.copies)} local copies" if s.copies else ""))
        return "\n".join(lines)


@dataclass
class Call:
    """What a planning function sees: the call and the communicator's plan."""
    nranks: int
    nbytes: int             # bcast: the buffer; alltoall: one block; barrier: 0
    root: int
    params: dict
    slots: list             # topology.Slot per rank
    nodes: int              # NUMA nodes
    cma: bool               # ranks may read each other's memory (single copy)
    counts: Optional[tuple] = None  # v-variants: (bytes, byte displacement) per rank
    item: int = 1           # reductions: element bytes (slices and chunks hold whole elements)
    inplace: bool = False   # reductions: the input is in recvbuf (IN_PLACE)
    kernel: object = None   # reductions: the ops.Kernel (None while only planning)

    def typed(self, dtype):
        """This call for reductions over dtype (None: bytes): the element
        size and kernel its planning sees, as the reduction itself sets
        them (SUM's kernel, or MAX's or MINLOC's where SUM is not defined:
        they plan alike)."""
        if dtype is not None:
            dt = np.dtype(dtype)
            for op in (ops.SUM, ops.MAX, ops.MINLOC):
                try:
                    self.kernel = ops.kernel(op, dt)
                    break
                except TypeError:
                    if op is ops.MINLOC:
                        raise TypeError(f"no built-in reduction is defined for dtype {dt}") from None
            self.item = self.kernel.item
            if self.nbytes % self.item:
                raise ValueError(f"{self.nbytes} bytes are not whole {dt} items")
        return self

    def pipe_chunk(self):
        """Chunks small enough that a message of a few chunks still
        pipelines (the writer fills chunk i + 1 while readers copy chunk i),
        never below 8 KiB, where a hand-off costs more than the copy it
        overlaps."""
        c = (self.nbytes // 8 + 63) & ~63
        return min(max(c, 8192), self.params["chunk_bytes"])

    def streams(self, footprint):
        """Copies into user memory bypass the cache once a call touches
        more than it holds."""
        return footprint >= self.params["nt_bytes"]

    def streams_folds(self, footprint):
        """Folds' results too from twice that: below, while the two cores
        share a cache, the reader of a folded slice finds it there, and
        writing it to memory costs more than the write-allocate reads it
        saves (bench/README.md, "Engine constants")."""
        return footprint >= 2 * self.params["nt_bytes"]
