"""Predicted time of a collective: the algorithm's own schedule (planned
here, no rank launched) walked step by step, each move costed by the
protocol the compiler gives it, on the machine's parameters.

Every rank runs its program in order: a call's fixed cost, then per step
its writes, its reads (each waits for its writer's post plus the hand-off
latency of the level between the two), its folds, its local copies.  A
copy of n bytes costs n x (seconds per byte at n, for the level it
crosses) x the slowdown of the c copies running at once from one socket's
memory.  Ranks on one CPU take turns: the simulated CPU runs one rank's
work at a time, and handing it to another costs a switch.  Three calls
are simulated back to back, as a timing loop runs them (a Bcast root runs
ahead, a writer waits for the acks of its single copies before it
leaves), and the time per call is the steady one between the first call's
end and the last's, or the busiest CPU's work per call where that is
more.

For pairwise and Bruck Alltoall on a machine of one latency and one
bandwidth this is paper 002's (2) and (1) (tests/test_model.py); with
the contention slowdown, (4)."""
import functools
from dataclasses import dataclass, field

import numpy as np

from .. import planning
from ..coll import select
from ..compile import move_protocols
from ..topology import read_sysfs

CALLS = 3


@functools.lru_cache(maxsize=1)
def _real():
    """This machine's topology (read once): where a virtual topology's ranks really run."""
    return read_sysfs()


class Where:
    """Where each rank runs, as the costs see it: the CPU it takes turns on,
    its socket, and the level between two ranks (machine.LEVELS)."""

    def __init__(self, slots, here):
        if here:                            # the real CPUs the launcher pins each rank to
            real = _real()
            core_of = {c: (core.index, core.socket) for core in real.cores for c in core.cpus}
            self.cpu = [frozenset(s.cpus) for s in slots]
            self.core = [core_of.get(min(s.cpus), (s.core, s.socket))[0] for s in slots]
            self.socket = [core_of.get(min(s.cpus), (s.core, s.socket))[1] for s in slots]
        else:                               # another machine: the topology's cores, each a CPU
            self.cpu = [s.core for s in slots]
            self.core = [s.core for s in slots]
            self.socket = [s.socket for s in slots]

    def level(self, a, b):
        if self.cpu[a] == self.cpu[b]:
            return "cpu"
        if self.core[a] == self.core[b]:
            return "core"
        return "socket" if self.socket[a] == self.socket[b] else "machine"

    def cpus(self):
        return len(set(self.cpu))


@dataclass
class _Task:
    """cost seconds of one rank's CPU, once every (key, delay) of `after`
    is known, from the latest key + delay; the end at least every `until`
    key + delay; then `marks` record (key, offset from the start, or None:
    the end)."""
    cost: float
    after: list = field(default_factory=list)
    until: list = field(default_factory=list)
    marks: list = field(default_factory=list)


def predict(op, algorithm, nranks, nbytes, machine, *, topology=None, root=0, dtype=None, options=None):
    """Seconds per call of `algorithm` of collective `op` (None: the
    automatic choice) on nranks ranks for nbytes (counted as
    shmcoll.schedule counts them), on `machine` (a model.Machine), placed
    on `topology` as the launcher places them (None: the real machine for
    this machine's parameters, else the parameters' own topology)."""
    here = machine.here()
    topology = topology or (None if here else machine.description.get("topology"))
    dtype = np.float64 if dtype is None and op in select.REDUCTIONS else dtype
    topo, slots = planning.placed(nranks, topology, own_cpus=not here)
    sched, params = planning.planned(op, algorithm, nranks, nbytes, root, topology=topo, options=options,
                                     cma=machine.cma, dtype=dtype, own_cpus=not here)
    return schedule_time(sched, params, machine, Where(slots, here))


def schedule_time(sched, params, machine, where, calls=CALLS):
    """Seconds per call of a planned schedule: the steady time of `calls`
    calls back to back (calls=1: one call's, from all ranks starting
    together to the last leaving)."""
    protos = [[pr for pr, _ in step] for step in move_protocols(sched, params)]
    tasks = [[] for _ in range(sched.nranks)]
    sized = _Sized(machine, working_set(sched, where))
    for k in range(calls):
        _call(tasks, k, sched, protos, params, sized, where)
    at, busy = _run(tasks, machine, where)
    ends = [max(at["end", k, r] for r in range(sched.nranks)) for k in range(calls)]
    return ends[0] if calls == 1 else max((ends[-1] - ends[0]) / (calls - 1), busy / calls)


def working_set(sched, where=None):
    """The most distinct bytes one CPU touches in a call (the buffer
    ranges its ranks write, read, copy and fold): a timing loop finds
    them in its caches while they fit, so every copy in the call costs as
    a copy of that many bytes.  Ranks taking turns on one CPU share its
    caches, and bytes two of them read count once."""
    cpu = (lambda r: where.cpu[r]) if where else (lambda r: r)
    spans = {}                              # (cpu, rank, buffer) -> [(lo, hi), ...]

    def touch(c, r, buf, lo, n):
        if n:
            spans.setdefault((c, r, buf), []).append((lo, lo + n))
    for st in sched.steps:
        folded = {(red.rank, i) for red in st.reduces for i in red.inputs if isinstance(i, int)}
        for i, m in enumerate(st.moves):
            for so, do, n in m.parts:
                for r in (m.src, *m.dst):
                    touch(cpu(r), m.src, m.sbuf, so, n)
                for d in m.dst:
                    if (d, i) not in folded:
                        touch(cpu(d), d, m.dbuf, do, n)
        for cp in st.copies:
            touch(cpu(cp.rank), cp.rank, cp.sbuf, cp.soff, cp.n)
            touch(cpu(cp.rank), cp.rank, cp.dbuf, cp.doff, cp.n)
        for red in st.reduces:
            touch(cpu(red.rank), red.rank, red.dbuf, red.doff, red.n)
            for b, off in (x for x in red.inputs if not isinstance(x, int)):
                touch(cpu(red.rank), red.rank, b, off, red.n)
    per = {}
    for (c, _, _), ranges in spans.items():
        end = 0
        for lo, hi in sorted(ranges):
            per[c] = per.get(c, 0) + max(hi - max(lo, end), 0)
            end = max(end, hi)
    return max(per.values(), default=0)


class _Sized:
    """A Machine whose costs per byte are read at the call's working set
    when that is larger than the copy (a move of 4 KiB in a call of
    16 MiB comes from memory, not from the cache)."""

    def __init__(self, machine, ws):
        self.machine, self.ws = machine, ws

    def __getattr__(self, name):
        return getattr(self.machine, name)

    def per_byte(self, curve, n):
        return self.machine.per_byte(curve, max(n, self.ws))


def _run(tasks, machine, where):
    """Each rank's tasks in order, each CPU running one at a time: the
    task that can start first runs next.  Returns the times marked and
    the busiest CPU's busy time (no loop of calls runs faster than that
    CPU works: the first call's end, against which the others are
    timed, can come late where ranks of two calls share a CPU)."""
    p = len(tasks)
    at, t, nxt = {}, [0.0] * p, [0] * p
    free, last, busy = {}, {}, {}
    while True:
        best = None
        for r in range(p):
            if nxt[r] == len(tasks[r]):
                continue
            task = tasks[r][nxt[r]]
            if any(key not in at for key, _ in task.after + task.until):
                continue
            cpu = where.cpu[r]
            start = max([t[r], free.get(cpu, 0.0)] + [at[key] + d for key, d in task.after])
            if last.get(cpu, r) != r:
                start += machine.switch
            if best is None or start < best[0]:
                best = (start, r)
        if best is None:
            if any(nxt[r] < len(tasks[r]) for r in range(p)):
                raise AssertionError("the model's tasks wait on each other: a schedule it cannot order")
            return at, max(busy.values(), default=0.0)
        start, r = best
        task = tasks[r][nxt[r]]
        end = max([start + task.cost] + [at[key] + d for key, d in task.until])
        for key, off in task.marks:
            at[key] = end if off is None else start + off
        cpu = where.cpu[r]
        busy[cpu] = busy.get(cpu, 0.0) + task.cost + (machine.switch if last.get(cpu, r) != r else 0.0)
        t[r] = free[cpu] = end
        last[cpu] = r
        nxt[r] += 1


def _staged_chunk(m, pr, params, nstaged):
    """The chunk a staged move is cut in (compile.py's), its first one posted before the rest."""
    if pr == "stripe":
        return min(m.chunk or params["chunk_bytes"], params["stripe_bytes"] // params["stripe_slots"])
    return min(m.chunk or params["chunk_bytes"], max(params["chan_bytes"] // (2 * nstaged) & ~63, 64))


def _slowdowns(st, protos, where, machine):
    """A function (rank whose memory is read, bytes) -> slowdown: c copies
    at once read one socket's memory, c the CPUs copying from it in this
    step (ranks on one CPU copy one after another)."""
    busy = {}
    for m, pr in zip(st.moves, protos):
        if m.nbytes and pr not in ("signal", "queue"):
            copiers = (m.src,) if pr in ("inline", "staged", "stripe", "push") else ()
            copiers += m.dst if pr != "push" else ()
            busy.setdefault(where.socket[m.src], set()).update(where.cpu[r] for r in copiers)
    for item in st.copies + st.reduces:
        busy.setdefault(where.socket[item.rank], set()).add(where.cpu[item.rank])
    return lambda owner, n: machine.slowdown(len(busy.get(where.socket[owner], ())), n)


def _call(tasks, k, sched, protos, params, machine, where):
    """Call k's tasks, appended to each rank's."""
    p, mc = sched.nranks, machine
    for r in range(p):
        tasks[r].append(_Task(mc.call))
    acks = [[] for _ in range(p)]           # writer -> (key, delay) of the reads it waits for before leaving
    for s, (st, pr) in enumerate(zip(sched.steps, protos)):
        slow = _slowdowns(st, pr, where, mc)
        nstaged = [sum(1 for m, x in zip(st.moves, pr) if m.src == w and x == "staged") for w in range(p)]
        folded = {(red.rank, i) for red in st.reduces for i in red.inputs if isinstance(i, int)}
        late = [[] for _ in range(p)]       # reader -> tasks after its reads (shared parts, pushes landed)
        for i, (m, x) in enumerate(zip(st.moves, pr)):
            tasks[m.src].append(_write(k, s, i, m, x, params, mc, where, slow, nstaged))
            if x in ("direct", "shared"):
                acks[m.src] += [(("r", k, s, i, d), mc.alpha[where.level(d, m.src)]) for d in m.dst]
            if x == "shared":
                part = m.nbytes / 2 * mc.per_byte(_source(mc, m, x, where.level(m.src, m.dst[0])), m.nbytes)
                late[m.src].append(_Task(part * slow(m.src, m.nbytes), marks=[(("part", k, s, i), None)]))
                late[m.dst[0]].append(_Task(0.0, after=[(("part", k, s, i), mc.alpha[where.level(m.src, m.dst[0])])]))
            if x == "push":
                for d in m.dst:
                    late[d].append(_Task(0.0, after=[(("w", k, s, i), mc.alpha[where.level(m.src, d)])]))
        fetched = [set() for _ in st.moves]     # move -> CPUs whose caches hold its bytes, read there already
        for r in range(p):
            mine = st.order[r] if st.order and r in st.order else [i for i, m in enumerate(st.moves) if r in m.dst]
            for i in mine:
                if pr[i] != "push":
                    warm = where.cpu[r] in fetched[i]
                    fetched[i].add(where.cpu[r])
                    tasks[r].append(_read(k, s, i, r, st.moves[i], pr[i], (r, i) in folded, params, mc, where, slow,
                                          nstaged, warm))
            tasks[r] += late[r]
            for red in (x for x in st.reduces if x.rank == r):
                per = mc.per_byte(mc.fold, red.n) if len(red.inputs) > 1 else mc.per_byte(mc.copy, red.n)
                tasks[r].append(_Task(max(len(red.inputs) - 1, 1) * red.n * per * slow(r, red.n)))
            for cp in (x for x in st.copies if x.rank == r):
                tasks[r].append(_Task(cp.n * mc.per_byte(mc.copy, cp.n) * slow(r, cp.n)))
    for r in range(p):
        tasks[r].append(_Task(0.0, after=acks[r], marks=[(("end", k, r), None)]))


def _write(k, s, i, m, pr, params, mc, where, slow, nstaged):
    """The writer's part of move i of step s: staging copies into its ring
    or slot (the first chunk posted before the rest), pushes into every
    reader's buffer, or nothing (a single copy its readers make)."""
    n, key = m.nbytes, ("w", k, s, i)
    if pr in ("inline", "staged", "stripe"):
        per = mc.per_byte(mc.copy, n) * slow(m.src, n)
        first = n if pr == "inline" else min(_staged_chunk(m, pr, params, nstaged[m.src]), n)
        reuse = [(("r", k - 1, s, i, d), mc.alpha[where.level(d, m.src)]) for d in m.dst] if k and pr != "inline" else []
        return _Task(n * per, after=reuse, marks=[(key, first * per), (("wend", k, s, i), None)])
    if pr == "push":
        cost = sum(n * mc.per_byte(_source(mc, m, pr, where.level(m.src, d)), n) for d in m.dst) * slow(m.src, n)
        return _Task(cost, marks=[(key, None)])
    return _Task(0.0, marks=[(key, None)])      # direct, shared (its part after its reads), signal, queue


def _read(k, s, i, r, m, pr, folded, params, mc, where, slow, nstaged, warm=False):
    """Reader r's part of move i: wait for the post, then copy (a whole
    single copy, half of a shared one; one it folds is folded where it
    landed, not copied: a staged one in the ring, a direct one in the
    writer's arena, where the ranks' arrays lie), never ending before the
    writer's last chunk has come and been copied.  warm: a rank sharing
    r's CPU has read these bytes already, so r finds them in that CPU's
    caches (the cost of a copy of its own bytes)."""
    n, level = m.nbytes, where.level(m.src, r)
    alpha, per = mc.alpha[level], mc.per_byte(mc.copy if warm else _source(mc, m, pr, level), n) * slow(m.src, n)
    if folded:                  # the fold pulls the bytes from where they lie: what that costs over one's own
        per = max(per - mc.per_byte(mc.copy, n) * slow(m.src, n), 0.0)
    copied = 0 if pr in ("signal", "queue") else n / 2 if pr == "shared" else n
    until = []
    if pr in ("staged", "stripe"):
        last = n - (-(-n // (c := _staged_chunk(m, pr, params, nstaged[m.src]))) - 1) * c
        until = [(("wend", k, s, i), alpha + last * per * (copied > 0))]
    return _Task(copied * per, after=[(("w", k, s, i), alpha)], until=until, marks=[(("r", k, s, i, r), None)])


def _source(mc, m, pr, level):
    """The curve a copy of m's bytes costs by: a single copy out of the
    writer's sendbuf (or a push of them) reads bytes nobody rewrote since the last call, so
    they sit in the reader's cache as its own would (a timing loop, an
    iterative solver); staged bytes, and bytes written earlier in the call
    (recvbuf, scratch), come fresh from the writer's cache, at the level's
    cost."""
    return mc.copy if pr in ("direct", "shared", "push") and m.sbuf == "send" else mc.beta[level]
