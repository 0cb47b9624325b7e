"""Bcast (paper 001, 4.2/5.2).  The root's buffer is "send", everyone
else's "recv".  Up to inline_bytes (4 KiB) travel inline in a slot, the
rest staged in chunks through a ring, so the writer fills chunk i + 1
while readers copy chunk i.  Algorithms are shaped for TINY messages (a
few lines, which a tree's forwarding costs more than it saves) apart.

  binomial  log p tree; inner ranks forward from their buffer
  original  every rank copies out of the root's ring; with cross-memory
            attach, from cma_bytes / 2 (16 KiB at 2 ranks, else 512 KiB, and
            past 2 ranks never below SHARED_MIN; the automatic choice times
            both from the adapt bytes, as twins, where they differ) each
            reader's copy is a single copy that the root shares, reader
            after reader (paper 004's rendezvous; sched.shared): no staging
            pass, and the root's CPU copies too, so with 2 ranks per CPU
            each CPU copies 1.5 buffers, not 2.  Staged, a reader copies
            lines the root has just written, which costs several times
            more when the host has put the cores far apart; a single copy
            reads a buffer the root has not just rewritten
            (bench/README.md, "Bcast past two ranks")
  limited   chunks go in rounds of G segments; reader group g (k readers)
            reads segment (g + s) mod G at sub-step s, so at most k readers
            share a segment at a time
  numa      limited over the striped buffer: segment i on node i mod nodes
"""
from ..sched import Move, Step, shared

TINY = 128
#: past 2 ranks, a root shares its readers' copies from here: it serves
#: them one after another, so for a small buffer the ring, which all read
#: at once, wins, and timing both as twins there costs more than sharing
#: could gain (bench/README.md, "Bcast past two ranks")
SHARED_MIN = 1 << 16


def _readers(call):
    p, root = call.nranks, call.root
    return tuple((root + i) % p for i in range(1, p))


def original(call):
    n, par = call.nbytes, call.params
    if call.nranks == 1:
        return []
    if call.cma and 0 < par["cma_bytes"] <= 2 * n and (call.nranks == 2 or n >= SHARED_MIN):
        return [Step([m for r in _readers(call) for m in shared(call.root, r, 0, 0, n)])]
    return [Step([Move(call.root, _readers(call), ((0, 0, n),), chunk=call.pipe_chunk())])]


def binomial(call):
    """Step s: every virtual rank that is a multiple of 2d (d = 2^(L-1-s))
    sends to the one d above it."""
    p, n, root = call.nranks, call.nbytes, call.root
    steps, d = [], 1 << max(p - 1, 0).bit_length() >> 1
    while d >= 1:
        moves = [Move((v + root) % p, ((v + d + root) % p,), ((0, 0, n),), sbuf="send" if v == 0 else "recv",
                      chunk=call.pipe_chunk()) for v in range(0, p - d, 2 * d)]
        steps.append(Step(moves))
        d >>= 1
    return steps


def _grouped(call, via):
    n, par, readers = call.nbytes, call.params, _readers(call)
    k = max(par["bcast_k"], 1)
    groups = -(-len(readers) // k)
    if not readers:
        return []
    if n <= TINY:
        return [Step([Move(call.root, readers, ((0, 0, n),), via="auto" if via == "staged" else via)])]
    seg = min(call.pipe_chunk(), (-(-n // groups) + 63) & ~63)
    if via == "stripe":
        seg = min(seg, par["stripe_bytes"] // par["stripe_slots"])
        room = par["stripe_slots"] // 2
    else:
        room = par["chan_bytes"] // (2 * seg)
    g = max(min(groups, room), 1)          # a round's segments fit twice in the ring
    offs = list(range(0, n, seg))
    steps = []
    for t in range(0, len(offs), g):
        moves = [Move(call.root, readers, ((o, o, min(seg, n - o)),), via=via, chunk=seg) for o in offs[t:t + g]]
        order = {r: [(i // k + s) % len(moves) for s in range(len(moves))] for i, r in enumerate(readers)}
        steps.append(Step(moves, order=order, batch=False))
    return steps


def limited(call):
    return _grouped(call, "staged")


def numa(call):
    return _grouped(call, "stripe")


ALGORITHMS = {"binomial": binomial, "original": original, "limited": limited, "numa": numa}


def footprint(call):
    return call.nranks * call.nbytes


def choose(call):
    """Tiny messages go inline in one line, where a binomial tree's
    forwarding costs more than everyone reading the root's; big ones split
    readers into groups of k (and across NUMA nodes)."""
    p, n = call.nranks, call.nbytes
    if n <= TINY or p <= 2:
        return "original"
    if n <= 16384:
        return "binomial" if p > 8 else "original"
    if call.nodes > 1:
        return "numa"
    return "limited" if p - 1 > call.params["bcast_k"] else "original"
