"""Alltoall (paper 001, 4.3/5.3; paper 002's selection).  Block i of rank
r's sendbuf goes to block r of rank i's recvbuf; one block stays local.

  pairwise     p - 1 steps, XOR partner (p a power of two) or shift; big
               blocks by a single direct copy out of the peer's sendbuf
               when ranks may read each other (paper 004), else staged
               through the ring in half-ring chunks
  tiled        pairwise in tiles sized to the shared cache, so a staged
               tile is still in cache when the partner copies it
  all_at_once  one step: every rank writes a piece of every block, readers
               staggered (rank r reads r - 1, r - 2, ...)
  bruck        rotate, ceil(log p) steps of packed blocks through scratch,
               rotate back (small blocks, many ranks)
"""
from ..sched import Copy, Move, Step
from ..topology import oversubscribed
from . import gather


def _own(call):
    b = call.nbytes
    return [Copy(r, "send", r * b, "recv", r * b, b) for r in range(call.nranks)]


def _pairs(call, via, chunk):
    p, b = call.nranks, call.nbytes
    pow2 = not p & (p - 1)
    steps = []
    for s in range(1, p):
        dst = [(r ^ s) if pow2 else (r + s) % p for r in range(p)]
        steps.append(Step([Move(r, (d,), ((d * b, r * b, b),), via=via, chunk=chunk) for r, d in enumerate(dst)]))
    if steps:
        steps[0].copies = _own(call)
    return steps or [Step(copies=_own(call))]


#: With a CPU per rank, blocks from here go by single copy: each rank's
#: p - 1 reads run at once on p CPUs, where staged every block is copied
#: twice; below it the one step of all_at_once costs less than p - 1
#: pairwise steps (bench/README.md, the 16-core Alltoall rule).
DIRECT_BLOCK = 8 << 10


def _spread(call):
    """Single copy from DIRECT_BLOCK: more than two ranks, each on a CPU
    of its own, that may read each other, and cma_bytes left to its
    default (one the user set holds as gather.via reads it)."""
    return (call.cma and call.params["cma_opt"] is None and call.nranks > 2 and call.nbytes >= DIRECT_BLOCK
            and not oversubscribed(call.slots))


def _via(call):
    """Every block has one reader: direct from DIRECT_BLOCK where _spread,
    else as gather.via says for p - 1 of them."""
    return "direct" if _spread(call) else gather.via(call, call.nbytes, (call.nranks - 1) * call.nbytes)


def pairwise(call):
    return _pairs(call, gather.single(call, _via(call)), call.params["chan_bytes"] // 2)


def tiled(call):
    return _pairs(call, "auto", call.params["tile_bytes"])


def all_at_once(call):
    p, b = call.nranks, call.nbytes
    moves = [Move(r, ((r + j) % p,), (((r + j) % p * b, r * b, b),)) for r in range(p) for j in range(1, p)]
    # move r * (p - 1) + j - 1 goes from r to r + j: reader r reads r - s first
    order = {r: [((r - s) % p) * (p - 1) + s - 1 for s in range(1, p)] for r in range(p)}
    return [Step(moves, copies=_own(call), order=order)]


def bruck(call):
    """Block i of the rotated scratch is bound for rank + i; step m sends
    the blocks whose index has bit m to rank + m; at the end block i came
    from rank - i."""
    p, b = call.nranks, call.nbytes
    steps = [Step(copies=[Copy(r, "send", (r + i) % p * b, "tmp", i * b, b) for r in range(p) for i in range(p)])]
    m = 1
    while m < p:
        parts = tuple((i * b, i * b, b) for i in range(p) if i & m)
        steps.append(Step([Move(r, ((r + m) % p,), parts, sbuf="tmp", dbuf="tmp") for r in range(p)]))
        m <<= 1
    steps.append(Step(copies=[Copy(r, "tmp", i * b, "recv", (r - i) % p * b, b) for r in range(p) for i in range(p)]))
    return steps, p * b


ALGORITHMS = {"bruck": bruck, "all_at_once": all_at_once, "pairwise": pairwise, "tiled": tiled}


def footprint(call):
    return 2 * call.nranks * call.nranks * call.nbytes


def streams(call):
    """Copies into recvbuf stream from nt_bytes of footprint, as every
    collective's, and, nt_bytes left to its default, from twice the L2s
    of the cores its ranks run on (device: l2_bytes): every byte an
    Alltoall copies is a different one, read once and written once, so
    past the cores' own caches it comes from and goes to memory anyway,
    where streamed stores skip the write-allocate reads; and a virtual
    machine's L3, which is its host's, is mostly not its own.  Below that
    edge the copies still fit the cores' caches and streaming loses
    (bench/README.md, "Alltoall: streamed past the cores' L2")."""
    fp = footprint(call)
    return call.streams(fp) or not call.params["nt_opt"] and fp >= 2 * call.params["l2_bytes"]


def choose(call):
    """MPICH's rule (Bruck for <= 256 B blocks at p >= 8, all-at-once up to
    32 KiB, pairwise above), with pairwise by single copy from DIRECT_BLOCK
    where _spread.  Above 32 KiB, blocks go direct when _via says so;
    without that, tiled keeps staged tiles in cache."""
    p, b = call.nranks, call.nbytes
    if b <= 256 and p >= 8:
        return "bruck"
    if _spread(call):
        return "pairwise"
    if b <= 32768 and p > 2:
        return "all_at_once"
    if _via(call) == "direct":
        return "pairwise"
    return "tiled" if b > call.params["tile_bytes"] else "pairwise"
