"""Paper 002's Alltoall equations (Luo, Zhang, Wei 2018), as written there,
in the Hockney model: alpha the latency of one message (s), beta the time
per byte (s/B), k the block bytes, p the processes.  shmcoll's predictor
(shmcoll.model.predict) derives its figures from the schedules instead;
these are the references it reduces to (tests/test_model.py)."""
import math


def bruck_time(p, k, alpha, beta):
    """Equation (1), Bruck: lb(p) steps of one message each, every step
    carrying half of the (p - 1) blocks: lb(p) a + (1/2) lb(p) (p - 1) k b."""
    lb = math.log2(p)
    return lb * alpha + 0.5 * lb * (p - 1) * k * beta


def pairwise_time(p, k, alpha, beta):
    """Equation (2), the long-message algorithms (pairwise exchange, or
    shift where p is not a power of two): p - 1 steps of one block each,
    (p - 1)(a + k b)."""
    return (p - 1) * (alpha + k * beta)


def contention_wait(rho, radix):
    """Equation (3): the mean wait (in switch cycles) of a packet at a
    radix x radix switch's output queue (M/G/1, Bernoulli arrivals), with
    rho the injection rate per input per cycle (0 <= rho < 1):
    (1 - 1/radix) rho / (2 (1 - rho)).  The paper writes the radix as k,
    beside the block's k of (1), (2), (4)."""
    if not 0 <= rho < 1:
        raise ValueError(f"the injection rate rho must be in [0, 1), not {rho}")
    return (1 - 1 / radix) * rho / (2 * (1 - rho))


def contention_time(p, k, alpha, beta, packet, hops, wait):
    """Equation (4): (2) with every block's packets (k / packet of them)
    each waiting `wait` seconds at each of `hops` switches:
    (p - 1)(a + k b + (k / packet) hops w).  On one node the queue is a
    memory or cache that c copies share: shmcoll.model's contention
    function, wait per byte = beta (slowdown(c) - 1) with packet = 1."""
    return (p - 1) * (alpha + k * beta + k / packet * hops * wait)
