/* The schedule executor: runs one rank's compiled program for one call.
 *
 * Python plans every algorithm as a schedule (which bytes move from which
 * rank to which, step by step) and compiles it per rank into a program of
 * fixed-size instructions (shmcoll/compile.py) with every ring offset,
 * event number and ack count resolved.  Here a call is: arrive (publish the
 * call's signature and buffers), optionally agree on signatures with every
 * rank, then run the instructions: post and wait on (call, event) flags,
 * copy, single-copy read a peer's buffer or write into it, ack, and drain or record the
 * readers a writer must wait for before it rewrites its ring, its inline
 * slots or the stripe (lazily: only when it writes the same memory again). */
#include "sc_internal.h"
#include <errno.h>

/* A writer using w inline slots a call (w a power of two) gives call C
 * the lines C * w .. C * w + w - 1 (mod SC_SLOTS): a line comes back
 * SC_SLOTS / w calls later, so a root writing to several readers is not
 * held to the readers of its previous call.  Operand u = j | w << 8. */
static uint64_t slot_index(uint64_t call, uint64_t u)
{
    return call * (u >> 8) + (u & 0xff);
}

static char *space(sc_comm_t *c, int64_t sp, int64_t off, char *sbuf, char *rbuf)
{
    int r = (int)(sp >> 8 & 0xffffff);
    switch (sp & 0xff) {
    case SC_SEND: return sbuf + off;
    case SC_RECV: return rbuf + off;
    case SC_TMP: return c->tmp + off;
    case SC_CHAN: return chan_buf(c, r) + off;
    case SC_SLOT: return slot_data(c, r, slot_index(c->call, (uint64_t)(sp >> 32))) + off;
    default: return c->base + c->off_stripe + off;
    }
}

/* Debt set of operand a: inline slot sets are named by the call's slot
 * operand and stored under the slot line they land on. */
static int set_of(sc_comm_t *c, int64_t a)
{
    return a < SC_SET_SLOT ? (int)a : SC_SET_SLOT + (int)(slot_index(c->call, (uint64_t)(a - SC_SET_SLOT)) % SC_SLOTS);
}

/* Wait for line l (written by who) to reach (call, ev). */
static int wait_line(sc_comm_t *c, sc_line_t *l, int who, uint64_t call, uint64_t ev, int64_t spin, int nocheck)
{
    sc_wait_t w = { .line = l, .wq = &l->wq, .call = call, .event = ev, .who = who, .nocheck = nocheck, .spin_ns = spin };
    return wait_for(c, &w);
}

static int wait_ack(sc_comm_t *c, int who, uint64_t call, uint64_t count, int64_t spin)
{
    return wait_line(c, ack_line(c, who), who, call, count, spin, 0);
}

/* Compare who's arrival record with ours; a mismatch aborts the job from
 * this call on. */
static int check_post(sc_comm_t *c, int who)
{
    int rc = sc_check_line(c, who);
    if (rc) sc_abort_mismatch(c, c->call);
    return rc;
}

/* Wait for who's post line; with check, then check its record. */
static int wait_post(sc_comm_t *c, int who, uint64_t call, uint64_t ev, int64_t spin, int check)
{
    int rc = wait_line(c, post_line(c, who), who, call, ev, spin, 0);
    return !rc && check ? check_post(c, who) : rc;
}

static int drain(sc_comm_t *c, int s)
{
    int32_t *who = c->debt_who + (int64_t)s * c->size;
    uint64_t *cnt = c->debt_cnt + (int64_t)s * c->size;
    for (int i = 0; i < c->debt_n[s]; i++) {
        int rc = wait_ack(c, who[i], c->debt_call[s], cnt[i], c->spin_ns);
        if (rc) return rc;
    }
    c->debt_n[s] = 0;
    return SC_OK;
}

static void debt(sc_comm_t *c, int s, int who, uint64_t count)
{
    if (c->debt_call[s] != c->call) {       /* what the set owed before was drained by its last writer */
        c->debt_call[s] = c->call;
        c->debt_n[s] = 0;
    }
    c->debt_who[(int64_t)s * c->size + c->debt_n[s]] = who;
    c->debt_cnt[(int64_t)s * c->size + c->debt_n[s]++] = count;
}

/* Single copy between local and `addr` in rank who's memory: read into
 * local, or (write) from local into who's buffer, announced in our
 * `pushing` before we look at who's door (sc_shut: one of the two sees
 * the other). */
static int cma(sc_comm_t *c, int who, char *local, uint64_t addr, int64_t n, int write)
{
    _Atomic int32_t *mine = &rank_rec(c, c->rank)->pushing;
    if (write) atomic_store_explicit(mine, who + 1, memory_order_seq_cst);
    int err = sc_vm_move(rank_rec(c, who)->pid, local, addr, n, write ? &rank_rec(c, who)->shut : NULL);
    if (write) atomic_store_explicit(mine, 0, memory_order_release);
    if (!err) return SC_OK;
    if (err == ECANCELED || err == ESRCH) {   /* who's call failed (it aborted the job first), or who */
        int rc = aborted_at(c, c->call);      /* is gone: after raising, or dead */
        return rc ? rc : sc_fail(c, SC_EDEAD, who, 2, 0);
    }
    return sc_fail(c, SC_ECMA, who, write, err);
}

/* Where rank who's buffer `which` (1 send, 2 recv) is in this call.  A
 * push waited for who's arrival, but who may have gone on: its record
 * must be this call's (a writer never writes into a buffer that who
 * offered for another call).  The address was written before the call
 * number; a rewrite for a later call makes seq odd past 2 * call before
 * it touches the address (see arrive), so a seq still at most 2 * call
 * after the read means the address is this call's.  (seq may still be odd
 * at 2 * call - 1: who has stored the call but not yet closed the lock.) */
static int buffer_of(sc_comm_t *c, int who, int which, uint64_t *addr)
{
    sc_line_t *l = post_line(c, who);
    uint64_t call = atomic_load_explicit(&l->call, memory_order_acquire);
    *addr = l->addr[which - 1];
    atomic_thread_fence(memory_order_acquire);
    uint64_t s = atomic_load_explicit(&l->seq, memory_order_relaxed);
    if (call == c->call && (int64_t)(s - 2 * c->call) <= 0) return SC_OK;
    c->err_rank = who;
    c->err_when = 3;                          /* out of step: no field to name */
    sc_abort_mismatch(c, c->call);
    return SC_EMISMATCH;
}

/* Publish this call's arrival record and first event (a sequence lock:
 * sc_check_line trusts a record only if seq was even and unchanged
 * around its reads).  The event goes before the call: a waiter that sees
 * the new call sees its first event. */
static void arrive(sc_comm_t *c, uint64_t first, char *sbuf, char *rbuf)
{
    sc_rec_t *r = rec_of(c, c->rank, c->call);    /* kept: before the post line shows the call */
    atomic_store_explicit(&r->seq, 2 * c->call + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    r->rec[0] = c->sig[0], r->rec[1] = c->sig[1], r->rec[2] = c->prev[0], r->rec[3] = c->prev[1], r->rec[4] = c->hist;
    atomic_store_explicit(&r->seq, 2 * c->call + 2, memory_order_release);
    sc_line_t *l = post_line(c, c->rank);
    uint64_t s = 2 * c->call - 2;     /* no load: even before and after each call's record, odd while written */
    atomic_store_explicit(&l->seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    l->sig[0] = c->sig[0];
    l->sig[1] = c->sig[1];
    l->prev[0] = c->prev[0];
    l->prev[1] = c->prev[1];
    l->hist = c->hist;
    if (l->addr[0] != (uintptr_t)sbuf) l->addr[0] = (uintptr_t)sbuf;   /* mostly unchanged: no store */
    if (l->addr[1] != (uintptr_t)rbuf) l->addr[1] = (uintptr_t)rbuf;
    atomic_store_explicit(&l->event, first, memory_order_release);
    atomic_store_explicit(&l->call, c->call, memory_order_release);
    atomic_store_explicit(&l->seq, s + 2, memory_order_release);
    c->owe = 1;
}

/* SHMCOLL_CHECK: every rank waits for every rank's arrival and compares
 * records; all see the same records, so all raise together (SC_EDIFFER)
 * and the communicator stays usable. */
static int agree(sc_comm_t *c)
{
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank) continue;
        int rc = wait_line(c, post_line(c, r), r, c->call, 0, c->spin_ns, 1);
        if (rc) return rc;
        if (sc_check_line(c, r)) return SC_EDIFFER;
    }
    return SC_OK;
}

static int run(sc_comm_t *c, const int64_t *prog, char *sbuf, char *rbuf)
{
    uint64_t call = c->call;
    sc_line_t *me = post_line(c, c->rank);
    const int64_t *in = prog + SC_HEAD, *end = in + prog[0] * SC_INSN;
    int rc = SC_OK;
    for (; in < end && !rc; in += SC_INSN) {
        switch (in[0] & 0xff) {
        case SC_OP_POST:
            post_event(me, (uint64_t)in[1]);
            c->owe = 0;                       /* the same line's sleepers: checked */
            break;
        case SC_OP_WAIT:
            rc = wait_post(c, (int)in[1], call, (uint64_t)in[2], in[3] & 2 ? c->spin_far_ns : c->spin_ns, in[3] & 1);
            if (!rc && c->traffic && in[3] & 4) c->traffic[c->size + in[1]]++;    /* a message's first piece */
            break;
        case SC_OP_ACK:
            ack_event(ack_line(c, c->rank), call, (uint64_t)in[1]);
            owed_after_fence(c, me);
            break;
        case SC_OP_WAITACK:
            rc = wait_ack(c, (int)in[1], call, (uint64_t)in[2], in[3] & 2 ? c->spin_far_ns : c->spin_ns);
            break;
        case SC_OP_COPY:
            sc_copy(space(c, in[1], in[2], sbuf, rbuf), space(c, in[3], in[4], sbuf, rbuf), in[5], (int)in[6]);
            if (c->traffic && in[7] >= 0) c->traffic[in[7]] += in[5];
            break;
        case SC_OP_CMA:
            rc = cma(c, (int)in[3], space(c, in[1], in[2], sbuf, rbuf),
                     post_line(c, (int)in[3])->addr[in[4] - 1] + (uint64_t)in[5], in[6], 0);
            if (!rc && c->traffic) c->traffic[in[3]] += in[6];
            break;
        case SC_OP_CMAW: {
            uint64_t at;
            rc = buffer_of(c, (int)in[3], (int)in[4], &at);
            if (!rc) rc = cma(c, (int)in[3], space(c, in[1], in[2], sbuf, rbuf), at + (uint64_t)in[5], in[6], 1);
            break;
        }
        case SC_OP_DRAIN:
            rc = drain(c, set_of(c, in[1]));
            break;
        case SC_OP_DEBT:
            debt(c, set_of(c, in[1]), (int)in[2], (uint64_t)in[3]);
            break;
        case SC_OP_QPOST:
            atomic_store_explicit(queue_word(c, (int)in[1], (int)in[2]), call, memory_order_release);
            wake_sleepers(queue_wq(c));
            owed_after_fence(c, me);
            break;
        case SC_OP_REDUCE:
            if (sc_reduce(in[0], space(c, in[1], in[2], sbuf, rbuf), space(c, in[3], in[4], sbuf, rbuf),
                          space(c, in[5], in[6], sbuf, rbuf), in[7])) {
                sc_abort_call(c, 3, call);
                rc = SC_EKERNEL;
            }
            break;
        case SC_OP_COUNT:
            if (c->traffic) c->traffic[in[1]] += in[2];
            break;
        case SC_OP_QWAIT: {
            sc_wait_t w = { .word = queue_word(c, (int)in[1], (int)in[2]), .wq = queue_wq(c), .call = call,
                            .who = (int)in[3], .spin_ns = c->spin_ns };
            rc = wait_for(c, &w);
            break;
        }
        }
    }
    return rc;
}

/* A rank that waited on no one in a call (a bcast root) checked no one's
 * record of it.  It checks its ring neighbours' records of that call or a
 * later one (the hash covers all before) against its own, which it keeps
 * for SC_PAST calls: whenever they are there, at the start and end of its
 * calls, and waiting only when the oldest unchecked call would leave its
 * records.  So a root runs up to SC_PAST - 1 calls ahead of its readers,
 * and different roots raise on every rank within that many calls. */
static int neighbour(sc_comm_t *c, int k)
{
    return (c->rank + (k ? 1 : c->size - 1)) % c->size;
}

static int recheck(sc_comm_t *c, int block)
{
    for (int k = 0; k < 2; k++) {
        if (!(c->pending >> k & 1)) continue;
        int who = neighbour(c, k), rc, seen;
        if (block && c->call - c->since[k] >= SC_PAST - 1
            && (rc = wait_line(c, post_line(c, who), who, c->since[k], 0, c->spin_ns, 1)))
            return rc;
        uint64_t at = atomic_load_explicit(&post_line(c, who)->call, memory_order_acquire);
        if ((int64_t)(at - c->since[k]) < 0) continue;
        uint64_t n = (int64_t)(at - c->call) < 0 ? at : c->call;   /* its latest record we can compare */
        if ((rc = sc_check_rec(c, who, n, &seen))) {
            sc_abort_mismatch(c, c->call);
            return rc;
        }
        /* a record covers every call before it (the hash); one unseen is
         * gone: who is SC_PAST calls past n, beyond checking */
        if (!seen || (int64_t)(n - c->due[k]) >= 0) c->pending &= ~(1 << k);
        else c->since[k] = n + 1;
    }
    return SC_OK;
}

/* One collective call: header words are [instructions, signature (2),
 * first event, scratch bytes, neighbours to check at the next call, 0, 0].
 * The caller owns c->busy. */
int sc_exec_owned(sc_comm_t *c, const int64_t *prog, char *sbuf, char *rbuf)
{
    int rc = aborted_at(c, c->call + 1);
    if (rc) return rc;
    for (int k = 0; k < 2; k++)               /* the recheck's lines arrive while we publish */
        if (c->pending >> k & 1) __builtin_prefetch(post_line(c, neighbour(c, k)));
    c->call++;
    c->sig[0] = (uint64_t)prog[1];
    c->sig[1] = (uint64_t)prog[2];
    arrive(c, (uint64_t)prog[3], sbuf, rbuf);
    if (c->check && c->size > 1) rc = agree(c);
    else if (c->pending) rc = recheck(c, 0);
    if (!rc) rc = run(c, prog, sbuf, rbuf);
    if (!rc && prog[5] && !c->check) {
        for (int k = 0; k < 2; k++) {
            if (!(prog[5] >> k & 1)) continue;
            if (!(c->pending >> k & 1)) c->since[k] = c->call;
            c->due[k] = c->call;
        }
        c->pending |= (int32_t)prog[5];
    }
    if (!rc && c->pending) rc = recheck(c, 1);
    if (rc && rc != SC_EDIFFER) sc_shut(c);
    settle(c, post_line(c, c->rank));
    c->hist = sc_mix(c->hist, c->prev);
    c->prev[0] = c->sig[0];
    c->prev[1] = c->sig[1] | (rc == SC_EDIFFER ? 1ULL << 63 : 0);   /* refused: see sc_mix */
    return rc;
}

/* The Python path owns the context while it plans (it may grow the
 * scratch buffer and replace programs, which a running call uses). */
int sc_own(sc_comm_t *c) { return __atomic_exchange_n(&c->busy, 1, __ATOMIC_ACQUIRE) ? SC_EBUSY : SC_OK; }
void sc_disown(sc_comm_t *c) { __atomic_store_n(&c->busy, 0, __ATOMIC_RELEASE); }

int sc_exec(sc_comm_t *c, const int64_t *prog, char *sbuf, char *rbuf)
{
    if (__atomic_exchange_n(&c->busy, 1, __ATOMIC_ACQUIRE)) return SC_EBUSY;
    int rc = sc_exec_owned(c, prog, sbuf, rbuf);
    __atomic_store_n(&c->busy, 0, __ATOMIC_RELEASE);
    return rc;
}
