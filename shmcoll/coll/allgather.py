"""Allgather (paper 000): every rank's block lands at block r of every
rank's recvbuf.  The four algorithms of the paper, as schedules in its
sense (who sends which blocks to whom at step k), and the one a shared
node allows:

  ring                p - 1 steps: send the block received last step
                      to rank + 1
  recursive_doubling  ceil(log p) steps with partner rank ^ 2^k, the held
                      range doubling (any p: see the function)
  bruck               ceil(log p) steps into a rotated scratch (step k:
                      2^k blocks to rank - 2^k), then the local rotation
  neighbor_exchange   p/2 steps of pairs with alternating neighbours; odd
                      p: p - 1 hands its block to p - 2 first and gets
                      everything from it last ((p + 3) / 2 steps)
  all_at_once         one step: every rank deposits its block once and
                      every rank reads all others (big blocks: straight
                      from each writer's sendbuf; at two ranks each
                      writer pushes its block into both recvbufs)

Moves that forward data read the writer's recvbuf, filled by earlier
steps; big blocks travel by single copy when ranks may read each other.
"""
from ..sched import Copy, Move, Step
from .gather import pushed, via


def _via(call):
    return via(call, call.nbytes)


def _own(call):
    b = call.nbytes
    return [Copy(r, "send", 0, "recv", r * b, b) for r in range(call.nranks)]


def _runs(blocks):
    """Sorted block indices -> [(first, count)] of consecutive runs."""
    out = []
    for i in sorted(blocks):
        if out and out[-1][0] + out[-1][1] == i:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((i, 1))
    return out


def _send(call, src, dst, blocks, via):
    """src forwards the blocks it holds (in its recvbuf) to the ranks dst."""
    b = call.nbytes
    parts = tuple((i * b, i * b, n * b) for i, n in _runs(blocks))
    return Move(src, tuple(dst), parts, sbuf="recv", via=via)


def _first(call, steps):
    """The own block goes into recvbuf before anything is forwarded."""
    return [Step(copies=_own(call))] + steps


def ring(call):
    p, via = call.nranks, _via(call)
    steps = [Step([_send(call, r, ((r + 1) % p,), [(r - s) % p], via) for r in range(p)]) for s in range(p - 1)]
    return _first(call, steps)


def recursive_doubling(call):
    """Step k: rank r and r ^ 2^k exchange the 2^k blocks of their halves.
    For p not a power of two, a rank whose partner does not exist (but
    whose partner's half does) reads that half from the rank that sends
    it to r's half anyway: one deposit, two readers, so no step is added
    and the paper's bound of 2 floor(log p) steps holds with ceil(log p)."""
    p, via = call.nranks, _via(call)
    steps, mask = [], 1
    while mask < p:
        group = lambda r: range(r & ~(mask - 1), min((r & ~(mask - 1)) + mask, p))
        readers = {r: [r ^ mask] for r in range(p) if r ^ mask < p}
        for r in range(p):
            root = (r ^ mask) & ~(mask - 1)
            if r ^ mask >= p and root < p:
                readers[root + ((r ^ mask) - root) % (p - root)].append(r)
        steps.append(Step([_send(call, r, dst, group(r), via) for r, dst in sorted(readers.items())]))
        mask <<= 1
    return _first(call, steps)


def bruck(call):
    """Scratch block i holds rank (r + i)'s block; step k sends the first
    min(2^k, p - 2^k) to rank r - 2^k, which stores them from 2^k on."""
    p, b = call.nranks, call.nbytes
    steps = [Step(copies=[Copy(r, "send", 0, "tmp", 0, b) for r in range(p)])]
    d = 1
    while d < p:
        n = min(d, p - d) * b
        steps.append(Step([Move(r, ((r - d) % p,), ((0, d * b, n),), sbuf="tmp", dbuf="tmp") for r in range(p)]))
        d <<= 1
    steps.append(Step(copies=[Copy(r, "tmp", i * b, "recv", (r + i) % p * b, b) for r in range(p) for i in range(p)]))
    return steps, p * b


def neighbor_exchange(call):
    """Even p (the paper's figure 1): step 0 pairs (2i, 2i + 1) swap their
    blocks; then even ranks exchange with the left and right neighbour in
    turn (odd ranks the other way), forwarding the pair received last.
    Odd p (figure 2): the even algorithm over ranks 0..p-2, with rank p-2
    carrying block p-1 as part of its own."""
    p, via = call.nranks, _via(call)
    q = p - (p % 2)
    if q < 2:
        return [Step(copies=_own(call))]
    real = lambda vs: [i for v in vs for i in ([v, p - 1] if p % 2 and v == q - 1 else [v])]
    steps = []
    if p % 2:
        steps.append(Step([_send(call, p - 1, (p - 2,), [p - 1], via)]))
    steps.append(Step([_send(call, r, (r ^ 1,), real([r]), via) for r in range(q)]))
    last = {r: [r & ~1, (r & ~1) + 1] for r in range(q)}      # pair each rank holds since step 0
    for k in range(1, q // 2):
        nb = {r: (r - 1 if (r % 2 == 0) == (k % 2 == 1) else r + 1) % q for r in range(q)}
        steps.append(Step([_send(call, r, (nb[r],), real(last[r]), via) for r in range(q)]))
        last = {r: last[nb[r]] for r in range(q)}
    if p % 2:
        steps.append(Step([_send(call, p - 2, (p - 1,), range(p - 1), via)]))
    return _first(call, steps)


def all_at_once(call):
    p, b, via = call.nranks, call.nbytes, pushed(call, _via(call))
    moves = [Move(r, tuple((r + j) % p for j in range(1, p)), ((0, r * b, b),), via=via) for r in range(p)]
    order = {r: [(r - s) % p for s in range(1, p)] for r in range(p)}     # reader r reads r - 1 first
    return [Step(moves, copies=_own(call), order=order)]


#: Comm checks sendbuf and recvbuf apart (IN_PLACE: the own block is copied out first)
APART = True

ALGORITHMS = {"ring": ring, "recursive_doubling": recursive_doubling, "bruck": bruck,
              "neighbor_exchange": neighbor_exchange, "all_at_once": all_at_once}


def footprint(call):
    return 2 * call.nranks * call.nranks * call.nbytes


def choose(call):
    """One step, on a shared node at every size: it waits on each writer
    once and copies each block once per reader, where the multi-step
    algorithms wait once per step and forward blocks through
    intermediate ranks."""
    return "all_at_once"
