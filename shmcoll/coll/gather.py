"""Gather and Gatherv: block r of every rank lands in the root's recvbuf
(at displacement r * block, or displs[r] for Gatherv).

  flat      one step: every rank writes its block once, the root reads
            them all (big blocks by single copy, each sender writing its
            own into the root's recvbuf)
  binomial  ceil(log p) steps up a binomial tree rooted at the root: a
            rank forwards its whole subtree's blocks, packed in scratch,
            in one message (fewer hand-offs for the root with many small
            blocks)
"""
from ..sched import Copy, Move, Step, shared
from ..topology import oversubscribed


def pieces(call):
    """(bytes, offset in the root's recvbuf) per rank."""
    if call.counts is not None:
        return call.counts
    return tuple((call.nbytes, r * call.nbytes) for r in range(call.nranks))


def largest(call):
    """The biggest block of the call (v-variants: of any rank)."""
    return max((n for n, _ in pieces(call)), default=0)


def via(call, n, total=None):
    """How a block of n bytes travels: by single copy (direct) once ranks
    may reach each other's memory and cma_bytes are at stake.  A block that
    many ranks read (allgather, a reduction's inputs) is staged once and
    read from shared memory at memcpy speed, so only its own bytes count.
    Blocks with one reader each (gather, scatter, alltoall: `total` is the
    busiest rank's sum) are copied one after another when staged, so with
    a CPU per rank they count together, each as big as it is, at most the
    sum, since the single copies then run at once on the ranks' own
    CPUs; ranks taking turns on CPUs gain nothing by it, their copies
    running one after another either way (bench/README.md, "Figures
    moved out of coll/*.py")."""
    if total is not None and not oversubscribed(call.slots):
        n = min(n * (call.nranks - 1), total)
    return "direct" if call.cma and 0 < call.params["cma_bytes"] <= n else "auto"


def single(call, how):
    """how (a via), with direct made shared between two ranks: a move of
    the writer's sendbuf with one reader, which both ends copy, piece by
    piece (sched.shared)."""
    return "shared" if how == "direct" and call.nranks == 2 else how


def pushed(call, how):
    """how, with direct made a push between two ranks, for a writer that
    also copies the block into its own recvbuf: it copies it into both in
    one pass (compile.twin_copies), reading it once where a reader's copy
    and its own read it twice.  With more ranks each reads the others
    itself: a writer pushing into p - 1 recvbufs serialises what p - 1
    readers would copy at once (bench/README.md, "Figures moved out of
    coll/*.py")."""
    return "push" if how == "direct" and call.nranks == 2 else how


def root_bytes(cnt, root):
    """The bytes the root of a gather or scatter moves to or from the others."""
    return sum(n for r, (n, _) in enumerate(cnt) if r != root)


def flat(call):
    """Big blocks by single copy: with one sender, root and sender share
    the copy, piece by piece (sched.shared); with more, every sender
    writes its own into the root's recvbuf at once, where the root alone
    would read them one after another."""
    p, root, cnt = call.nranks, call.root, pieces(call)
    moves, sent = [], root_bytes(cnt, root)
    for s in range(1, p):
        r = (root + s) % p
        n, at = cnt[r]
        if not n:
            continue
        single = via(call, n, sent) == "direct"
        if single and p == 2:
            moves += shared(r, root, 0, at, n)
        else:
            moves.append(Move(r, (root,), ((0, at, n),), via="push" if single else "auto"))
    order = {root: sorted(range(len(moves)), key=lambda i: moves[i].via == "push")}  # pushes after own reads
    return [Step(moves, copies=[Copy(root, "send", 0, "recv", cnt[root][1], cnt[root][0])], order=order)]


def tree(p, root):
    """Binomial tree over relative ranks: (step, child, parent) edges; the
    subtree of relative rank v at step k is v .. v + 2^k - 1."""
    out, m = [], 1
    while m < p:
        out.append([((v + m + root) % p, (v + root) % p) for v in range(0, p, 2 * m) if v + m < p])
        m <<= 1
    return out


def binomial(call):
    """Relative rank v packs the blocks of v .. v + size - 1 in its scratch
    in relative order; the root unpacks them into recvbuf at the end."""
    p, root, cnt = call.nranks, call.root, pieces(call)
    rel = [(root + v) % p for v in range(p)]
    at = [0] * (p + 1)                  # offset of relative rank v's block in a packed subtree
    for v in range(p):
        at[v + 1] = at[v] + cnt[rel[v]][0]
    steps = [Step(copies=[Copy(r, "send", 0, "tmp", 0, cnt[r][0]) for r in range(p)])]
    m = 1
    for edges in tree(p, root):
        moves = []
        for child, parent in edges:
            v, u = (child - root) % p, (parent - root) % p
            n = at[min(v + m, p)] - at[v]
            if n:
                moves.append(Move(child, (parent,), ((0, at[v] - at[u], n),), sbuf="tmp", dbuf="tmp"))
        steps.append(Step(moves))
        m <<= 1
    steps.append(Step(copies=[Copy(root, "tmp", at[v], "recv", cnt[rel[v]][1], cnt[rel[v]][0]) for v in range(p)]))
    return steps, at[p]


ALGORITHMS = {"flat": flat, "binomial": binomial}


def footprint(call):
    return 2 * sum(n for n, _ in pieces(call))


def choose(call):
    """Flat: the root waits on each rank once and copies each block once;
    a tree adds a copy per level for every block it forwards.  With more
    than 8 ranks, each on a CPU of its own, and blocks of at most 4 KiB,
    the root's p - 1 waits in turn cost more than log p levels; ranks
    taking turns on CPUs pay a hand-off per level, so flat stays ahead
    there (bench/README.md, "Figures moved out of coll/*.py")."""
    return "binomial" if largest(call) <= 4096 and call.nranks > 8 and not oversubscribed(call.slots) else "flat"
