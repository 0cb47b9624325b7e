/* Twin selection: which of a call's two programs runs (core.h, twins).
 * Not execution: exec.c asks, through the interface in sc_internal.h,
 * for a pick before a twin call and reports its time after; the policy
 * and the records that carry rank 0's picks to the other ranks are here. */
#include "sc_internal.h"

/* Twins (core.h): the same call as two programs, the automatic choice by
 * single copy and staged through shared memory.  Which is faster depends
 * on where the host put the CPUs, which a guest cannot see (bench/README.md,
 * "Engine constants"), so rank 0 times each (the longest any rank took),
 * picks per call, and every rank runs its pick.
 *
 * Rank 0's pick, per twin block:
 *  - Warm-up: each program in turn (by calls run, however late their
 *    times are learnt) until three calls of each are learnt.  A program's
 *    first call is not counted: it pays first touches, which would charge
 *    the program long after.
 *  - Then the current one, which gives way when the other's estimate is
 *    1/8 below its own.
 *  - Going back: what ran before a call slows both programs alike, but can
 *    make the current one lose to the other's older estimate.  So after a
 *    switch made on the current one's own times, the other's first two
 *    calls must beat by 1/8 what the old one took before its last two, or
 *    the old one is back (and kept if still slow: the next switch comes
 *    within two calls).
 *  - Trials: the other is tried again, for two calls, after the warm-up
 *    whatever its estimate (4 calls later: the warm-up's own calls count),
 *    then once the calls since its last trial took 128 times what its two
 *    calls cost over the current one: by rank 0's estimates 1/128 of the
 *    time goes to trials, 1/64 with the current one's first call after
 *    them as cold as the trial's first.
 *  - Estimates: a trial's is the lower of its two times (its first call
 *    pays for what the current one left in the caches, so a one-call trial
 *    could keep the slower program for good); the current one's is the
 *    lower of its last two (one stall does not condemn it, two slower
 *    calls in a row, as when the host moves the CPUs apart, do). */
int64_t sc_twin_estimate(const int64_t *t, int v)
{
    int64_t a = t[SC_TW_LAST + v], b = t[SC_TW_PREV + v];
    return b && b < a ? b : a;
}

static int warming(const int64_t *t) { return t[SC_TW_SEEN] < 3 || t[SC_TW_SEEN + 1] < 3; }

int sc_twin_pick(int64_t *t)
{
    if (warming(t)) return t[SC_TW_RUNS] > t[SC_TW_RUNS + 1];     /* 0, 1, 0, 1, 0, 1 */
    int cur = (int)t[SC_TW_CUR] & 1;
    int64_t a = sc_twin_estimate(t, cur), b = sc_twin_estimate(t, !cur), back = t[SC_TW_BACK];
    if (back < 0 && t[SC_TW_SINCE] >= 2) back = t[SC_TW_BACK] = 0;
    if (back > 0 && t[SC_TW_SINCE] >= 2) {      /* two calls since a switch on the old one's own times: */
        t[SC_TW_BACK] = 0;
        if (a >= back - back / 8) {             /* not better than the old one before it slowed */
            t[SC_TW_CUR] = cur = !cur;
            t[SC_TW_SINCE] = t[SC_TW_TRIAL] = 0;
            t[SC_TW_BACK] = -1;
            a = b;
        }
    } else if (b < a - a / 8) {                 /* not after a trial won, nor just after going back: */
        t[SC_TW_BACK] = t[SC_TW_LEARNT] == !cur + 1 || back < 0 ? 0 : t[SC_TW_EARLIER + cur];
        t[SC_TW_CUR] = cur = !cur;
        t[SC_TW_SINCE] = t[SC_TW_TRIAL] = 0;
        a = b;
    }
    if (t[SC_TW_TRIAL]) return !cur;            /* calls of the trial still to run (sc_twin_ran) */
    if (t[SC_TW_SINCE] >= 8 && (!t[SC_TW_CHECKED] ||
                                t[SC_TW_SINCE] * (a / 128) >= t[SC_TW_LAST + !cur] + t[SC_TW_PREV + !cur] - 2 * a)) {
        t[SC_TW_SINCE] = 0;
        t[SC_TW_TRIAL] = 2;
        t[SC_TW_CHECKED] = 1;
        return !cur;
    }
    return cur;
}

/* A call ran program v: counted, and a trial's call used up (by a call
 * that ran, so a pick promised for a call that never came costs nothing). */
void sc_twin_ran(int64_t *t, int v)
{
    t[SC_TW_RUNS + v]++;
    if (t[SC_TW_TRIAL] && v != (t[SC_TW_CUR] & 1)) t[SC_TW_TRIAL]--;
}

/* Rank 0's time (ns) of a call that ran program v (learnt a few calls
 * late, when rank 0 ran ahead: picks meanwhile go by what it knew; runs
 * of the current program count towards the next trial, so a pick made
 * for a call that never came costs nothing). */
void sc_twin_learn(int64_t *t, int v, int64_t ns)
{
    ns = ns > 0 ? ns : 1;
    int trial = !warming(t) && v != (t[SC_TW_CUR] & 1), again = trial && t[SC_TW_LEARNT] == v + 1;
    if (!t[SC_TW_SEEN + v]++) return;           /* a program's first call: its first touches, not its time */
    t[SC_TW_EARLIER + v] = t[SC_TW_BEFORE + v];
    t[SC_TW_BEFORE + v] = sc_twin_estimate(t, v);
    t[SC_TW_PREV + v] = trial && !again ? ns : t[SC_TW_LAST + v];
    t[SC_TW_LAST + v] = ns;
    t[SC_TW_LEARNT] = v + 1;
    if (!trial) t[SC_TW_SINCE]++;
}

/* A follower's program of a twin: rank 0's pick, promised at the end of
 * its last call when that was the same twin (a loop: the followers need
 * not wait for rank 0 to arrive, as a gather's senders, which stage
 * their blocks while the root still copies the last call's out), else in
 * its record of this call (it arrived: it may have gone on, never
 * SC_PAST calls, see sc_twin_bound). */
int sc_twin_follow(sc_comm_t *c, int *v)
{
    sc_line_t *l = post_line(c, 0);
    uint32_t q = atomic_load_explicit(&l->next_seq, memory_order_acquire);
    uint64_t n = l->next_call, s0 = l->next_sig[0], s1 = l->next_sig[1];
    uint32_t got = l->next_variant;
    atomic_thread_fence(memory_order_acquire);
    if (!(q & 1) && atomic_load_explicit(&l->next_seq, memory_order_relaxed) == q && n == c->call
        && s0 == c->sig[0] && s1 == c->sig[1]) {
        *v = (int)(got & 1);
        return SC_OK;
    }
    int rc = sc_wait_line(c, l, 0, c->call, 0, c->spin_ns, 0);
    if (rc) return rc;
    sc_rec_t *r = rec_of(c, 0, c->call);
    uint64_t s = atomic_load_explicit(&r->seq, memory_order_acquire), pick = r->variant;
    atomic_thread_fence(memory_order_acquire);
    if (s == 2 * c->call + 2 && atomic_load_explicit(&r->seq, memory_order_relaxed) == s) {
        *v = (int)(pick & 1);
        return SC_OK;
    }
    sc_out_of_step(c, 0);                     /* rank 0 is SC_PAST calls on */
    sc_abort_mismatch(c);
    return SC_EMISMATCH;
}

/* Rank 0, after a twin call: its pick for the next call, should that be
 * the same twin (under next_seq, odd while rewritten).  Rank 0 reads it
 * back from the same line at its next call (promised). */
static void promise(sc_comm_t *c, int64_t *twin)
{
    sc_line_t *l = post_line(c, 0);
    uint32_t q = atomic_load_explicit(&l->next_seq, memory_order_relaxed);
    atomic_store_explicit(&l->next_seq, q + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    l->next_call = c->call + 1;
    l->next_sig[0] = c->sig[0];
    l->next_sig[1] = c->sig[1];
    l->next_variant = (uint32_t)sc_twin_pick(twin);
    atomic_store_explicit(&l->next_seq, q + 2, memory_order_release);
}

/* Rank 0: whether it promised a pick for this call (made at the end of
 * the last one, whichever twin runs it now, if the signature is the one
 * promised: the followers may already run it). */
static int promised(sc_comm_t *c)
{
    sc_line_t *l = post_line(c, 0);
    return l->next_call == c->call && l->next_sig[0] == c->sig[0] && l->next_sig[1] == c->sig[1];
}

/* Rank 0's time of a twin call: the longest any rank took, read from
 * their records once all have ended it (rank 0 alone can be early: a
 * root that wrote everything staged and left), but for ranks already
 * SC_PAST calls on, whose records of it are gone. */
void sc_twin_collect(sc_comm_t *c)
{
    while (c->pend_n) {
        int i = c->pend_head;
        uint64_t m = c->pend_call[i], done = 2 * m + 2;
        int64_t worst = 0;
        for (int r = 0; r < c->size; r++) {
            sc_rec_t *rec = rec_of(c, r, m);
            uint64_t s = atomic_load_explicit(&rec->seq, memory_order_acquire);
            int64_t took = atomic_load_explicit(&rec->took, memory_order_acquire);
            if ((int64_t)(s - done) > 0) continue;             /* r is SC_PAST calls on: its time is gone */
            if (s != done || !took) return;                    /* r is still in call m: later */
            worst = took > worst ? took : worst;
        }
        if (worst > 0) sc_twin_learn(c->pend_twin[i], c->pend_variant[i], worst);
        c->pend_head = (i + 1) % SC_PAST;
        c->pend_n--;
    }
}

/* Rank 0 after a twin call: its time to learn, when every rank's is in
 * (the oldest is dropped should SC_PAST wait). */
static void pend(sc_comm_t *c, int64_t *twin, int v)
{
    if (c->pend_n == SC_PAST) {
        c->pend_head = (c->pend_head + 1) % SC_PAST;
        c->pend_n--;
    }
    int i = (c->pend_head + c->pend_n++) % SC_PAST;
    c->pend_call[i] = c->call;
    c->pend_twin[i] = twin;
    c->pend_variant[i] = v;
}

/* Rank 0 keeps its records of twin calls until every rank has read its
 * picks there: before a call that could overwrite the oldest one not
 * known to be read, it waits for every rank to have arrived past the
 * newest (they have the data of every call before this one, so nothing
 * waits on rank 0 meanwhile). */
int sc_twin_bound(sc_comm_t *c)
{
    for (int r = 1; r < c->size; r++) {
        int rc = sc_wait_line(c, post_line(c, r), r, c->twin_last + 1, 0, c->spin_ns, 0);
        if (rc) return rc;
    }
    c->twin_due = 0;
    return SC_OK;
}

/* Rank 0's pick for this call: the one it promised at the end of the
 * last call, if that was for this signature (the followers may already
 * run it), else its pick now. */
int sc_twin_choose(sc_comm_t *c, int64_t *twin)
{
    return promised(c) ? (int)post_line(c, 0)->next_variant : sc_twin_pick(twin);
}

/* After a twin call ran (t0: when it began; -1: untimed, a nonblocking
 * call that stopped between steps, which rank 0 does not learn from):
 * every rank publishes its time in its record of the call; rank 0 queues
 * the call's times to learn and promises its pick for the next call. */
void sc_twin_done(sc_comm_t *c, int64_t *twin, int v, int64_t t0)
{
    int64_t took = t0 < 0 ? -1 : sc_now_ns() - t0;
    atomic_store_explicit(&rec_of(c, c->rank, c->call)->took, took > 0 || t0 < 0 ? took : 1, memory_order_release);
    if (c->rank) return;
    if (!c->twin_due) c->twin_first = c->call;
    c->twin_last = c->call;
    c->twin_due = 1;
    pend(c, twin, v);
    promise(c, twin);
}
