"""Scatter and Scatterv: block r of the root's sendbuf (at r * block, or
displs[r]) lands in rank r's recvbuf.

  flat      one step: the root writes every block once, each rank reads
            its own (big blocks straight from the root's sendbuf)
  binomial  ceil(log p) steps down a binomial tree: a rank passes on its
            subtree's blocks, packed in scratch, in one message
"""
from ..sched import Copy, Move, Step
from ..topology import oversubscribed
from .gather import largest, pieces, root_bytes, single, tree, via


def flat(call):
    p, root, cnt = call.nranks, call.root, pieces(call)
    sent = root_bytes(cnt, root)
    moves = [Move(root, (r,), ((cnt[r][1], 0, cnt[r][0]),), via=single(call, via(call, cnt[r][0], sent)))
             for r in range(p) if r != root and cnt[r][0]]
    return [Step(moves, copies=[Copy(root, "send", cnt[root][1], "recv", 0, cnt[root][0])])]


def binomial(call):
    """The root packs all blocks in relative order in its scratch; each
    step hands a child the packed blocks of its subtree."""
    p, root, cnt = call.nranks, call.root, pieces(call)
    rel = [(root + v) % p for v in range(p)]
    at = [0] * (p + 1)
    for v in range(p):
        at[v + 1] = at[v] + cnt[rel[v]][0]
    steps = [Step(copies=[Copy(root, "send", cnt[rel[v]][1], "tmp", at[v], cnt[rel[v]][0]) for v in range(p)])]
    levels = tree(p, root)
    m = 1 << len(levels)
    for edges in reversed(levels):
        m >>= 1
        moves = []
        for child, parent in edges:
            v, u = (child - root) % p, (parent - root) % p
            n = at[min(v + m, p)] - at[v]
            if n:
                moves.append(Move(parent, (child,), ((at[v] - at[u], 0, n),), sbuf="tmp", dbuf="tmp"))
        steps.append(Step(moves))
    steps.append(Step(copies=[Copy(r, "tmp", 0, "recv", 0, cnt[r][0]) for r in range(p)]))
    return steps, at[p]


ALGORITHMS = {"flat": flat, "binomial": binomial}


def footprint(call):
    return 2 * sum(n for n, _ in pieces(call))


def fan(p):
    """The most blocks one message of the binomial tree carries: relative
    rank v's subtree, min(lowest set bit of v, p - v) ranks."""
    return max((min(v & -v, p - v) for v in range(1, p)), default=0)


def choose(call):
    """Flat: each rank waits on the root once and copies its block once.
    With ranks taking turns on the cores, down the binomial tree while its
    messages fit an inline slot: the root hands over a few messages in
    place of p - 1 blocks, so it yields its core less.  A message staged
    through a ring costs more than the turns it saves.  With a CPU per
    rank the root's blocks are read at once, so flat wins (bench/README.md,
    "Figures moved out of coll/*.py")."""
    fits = largest(call) * fan(call.nranks) <= call.params["inline_bytes"]
    return "binomial" if fits and oversubscribed(call.slots) else "flat"
