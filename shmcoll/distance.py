"""Communication distance (paper 000) of the schedules shmcoll runs.

The paper's average logical communication distance (ALCD) is the sum of
|sender - receiver| over every message divided by the number of
messages; it could only guess what that means on real hardware.  Here it
is computed from the very Schedule objects the executor runs, and, given
where ranks sit (a virtual topology or slots), the share of messages and
bytes that cross a socket or a NUMA node: the physical distance."""
import math
from dataclasses import dataclass
from typing import Optional

from .planning import schedule

PAPER = ("ring", "recursive_doubling", "bruck", "neighbor_exchange")


@dataclass
class Distance:
    algorithm: str
    nranks: int
    alcd: float
    steps: int              # steps that move data
    messages: int
    cross_socket: Optional[tuple] = None    # (share of messages, share of bytes)
    cross_node: Optional[tuple] = None


def of_messages(messages):
    """ALCD of (sender, receiver, count) triples: count messages each."""
    n = sum(c for _, _, c in messages)
    return sum(abs(s - d) * c for s, d, c in messages) / n if n else 0.0


def alcd(algorithm, p, placement=None, nbytes=1, op="allgather"):
    """Distance of `algorithm` of op on p ranks (blocks of nbytes).
    placement: a virtual topology spec ("2x8"), a Topology, or slots (one
    per rank, with .socket and .node) for the physical shares."""
    # planned on the placement's topology: the numa reductions chain its nodes
    sched = schedule(op, algorithm, p, nbytes, topology=placement if isinstance(placement, str) else None)
    msgs = sched.messages()
    out = Distance(sched.algorithm, p, of_messages([(s, d, 1) for s, d, _ in msgs]),
                   sum(1 for st in sched.steps if st.moves), len(msgs))
    slots = _slots(placement, p)
    if slots is not None:
        out.cross_socket = _share(msgs, lambda s, d: slots[s].socket != slots[d].socket)
        out.cross_node = _share(msgs, lambda s, d: slots[s].node != slots[d].node)
    return out


def _share(msgs, crosses):
    far = [(s, d, n) for s, d, n in msgs if crosses(s, d)]
    total = sum(n for _, _, n in msgs)
    return (len(far) / len(msgs) if msgs else 0.0, sum(n for _, _, n in far) / total if total else 0.0)


def _slots(placement, p):
    if placement is None or isinstance(placement, (list, tuple)):
        return placement
    from .topology import topology
    topo = topology(placement) if isinstance(placement, str) else placement
    return topo.placement(p, "core", "compact")


def paper(algorithm, p):
    """Table 1 of paper 000: (ALCD, steps) in closed form, None where the
    paper gives none.  Its Bruck form holds for powers of two only (at
    p = 6 it gives 0.56, below the least distance 1); elsewhere this is the
    count its text derives the form from (step k < ceil(log p): p - 2^k
    messages at distance 2^k, 2^k at p - 2^k)."""
    L = math.ceil(math.log2(p)) if p > 1 else 0
    if algorithm == "ring":
        return 2 - 2 / p, p - 1
    if algorithm == "neighbor_exchange" and p % 2 == 0:
        return (2 - 2 / p if p % 4 == 0 else 2 - 4 / p + 4 / p ** 2), p // 2
    if algorithm == "recursive_doubling" and p & (p - 1) == 0 and p > 1:
        return (p - 1) / L, L
    if algorithm == "bruck" and p > 1:
        if p & (p - 1):     # Table 1's form sums one step too many; the paper's per-step count instead
            return sum(2 * 2 ** k * (p - 2 ** k) for k in range(L)) / (p * L), L
        return (2 * p * (2 ** (L + 1) - 1) - (2 / 3) * (4 ** (L + 1) - 1)) / (p * L), L
    return None


def table(p, placement=None, nbytes=1):
    """Text table of every allgather algorithm at p ranks."""
    from .coll.select import NAMES
    head = f"{'algorithm':20} {'ALCD':>7} {'paper':>7} {'steps':>5} {'msgs':>5}"
    if placement is not None:
        head += f" {'x-socket msgs':>13} {'x-socket bytes':>14} {'x-node msgs':>11} {'x-node bytes':>12}"
    lines = [head]
    for name in NAMES["allgather"]:
        d = alcd(name, p, placement, nbytes)
        ref = paper(name, p)
        line = f"{name:20} {d.alcd:7.3f} {ref[0] if ref else float('nan'):7.3f} {d.steps:5} {d.messages:5}"
        if placement is not None:
            line += (f" {d.cross_socket[0]:13.1%} {d.cross_socket[1]:14.1%} {d.cross_node[0]:11.1%}"
                     f" {d.cross_node[1]:12.1%}")
        lines.append(line)
    return "\n".join(lines)
