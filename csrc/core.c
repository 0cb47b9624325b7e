/* Layout of a communicator's segment, rank registration and liveness,
 * failure detection, signature checks, and the slow path of every wait. */
#include "sc_internal.h"
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>

#define SC_MAGIC 0x5c0112u
#define PAGE 4096
#define POLL_NS 10000000LL       /* signals are polled this often while a wait is slow */
#define CHECK_NS 1000000LL       /* and the awaited rank's arrival record this often */
_Static_assert(SC_GIL_NS < POLL_NS, "a wait polls signals only once it has let the GIL go");

static int64_t up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

int64_t sc_layout(sc_comm_t *c)
{
    int64_t p = c->size, o = SC_LINE;            /* header line first */
    c->off_state = o;  o = up(o + p * (int64_t)sizeof(sc_rank_t), SC_LINE);
    c->off_mutex = o;  o = up(o + p * 64, SC_LINE);
    c->off_post = o;   o += p * SC_LINE;
    c->off_ack = o;    o += p * SC_LINE;
    c->off_slot = o;   o += p * SC_SLOTS * SC_LINE;               /* headers: a line each, alone in its pair */
    c->off_rec = o;    o += p * SC_PAST * 64;
    c->off_queue = o;  o = up(o + SC_LINE + 2 * p * 8, SC_LINE);   /* sleepers line, gather, release */
    c->off_claim = o;  o += p * up(p * 8, SC_LINE);                /* a row of claim words per reader */
    c->off_chan = o = up(o, PAGE);
    o += p * c->chan_bytes;
    c->off_stripe = o = up(o, PAGE);
    o += c->stripe_bytes;
    c->off_slot_data = o = up(o, PAGE);                          /* inline payloads */
    o += p * SC_SLOTS * SC_SLOT_BYTES;
    c->off_p2p = o = up(o, PAGE);                                /* point-to-point: lines, then rings */
    o += sc_p2p_lines(p);
    c->off_p2p_ring = o = up(o, PAGE);
    o += p * p * c->p2p_ring_bytes;
    c->total = up(o, PAGE);
    return c->total;
}

static sc_rank_t *state(sc_comm_t *c, int r) { return rank_rec(c, r); }
static pthread_mutex_t *mutex(sc_comm_t *c, int r) { return (pthread_mutex_t *)(c->base + c->off_mutex + 64 * (int64_t)r); }

int sc_attach(sc_comm_t *c, char *base)
{
    c->base = base;
    c->call = c->call_base - 1;
    return hdr(c)->magic == SC_MAGIC && hdr(c)->size == c->size ? SC_OK : SC_EABORT;
}

/* Run once by the segment's creator, before any rank maps it.  Every flag
 * starts one call before the first, whatever call_base is, so no line
 * looks reached (or far ahead) to the first call. */
int sc_init_shared(sc_comm_t *c)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    for (int r = 0; r < c->size; r++)
        if (pthread_mutex_init(mutex(c, r), &a)) return SC_ENOMEM;
    pthread_mutexattr_destroy(&a);
    uint64_t before = c->call_base - 1;
    for (int r = 0; r < c->size; r++) {
        atomic_store(&post_line(c, r)->call, before);
        atomic_store(&ack_line(c, r)->call, before);
        for (int q = 0; q < 2; q++) atomic_store(queue_word(c, q, r), before);
        for (int s = 0; s < SC_SLOTS; s++) atomic_store(&slot_head(c, r, (uint64_t)s)->call, before);
        for (int w = 0; w < c->size; w++) atomic_store(claim_word(c, r, w), claim_tag(before, 0) << 12);
    }
    hdr(c)->size = c->size;
    hdr(c)->magic = SC_MAGIC;
    return SC_OK;
}

/* A rank's liveness is a robust mutex held by a thread of its own that
 * lives as long as the process, or until the communicator is freed
 * (sc_release), not by whichever thread registered, which may end first:
 * when the process dies, however it dies, the kernel marks the mutex
 * owner-dead, which any peer sees with a trylock.  rc: 0 starting, -1
 * holding, -2 let go (the holder touches nothing after), else the lock's
 * error. */
typedef struct { pthread_mutex_t *m; _Atomic int rc; _Atomic uint32_t stop; } holder_t;

static void *hold(void *arg)
{
    holder_t *h = arg;
    pthread_mutex_t *m = h->m;
    int rc = pthread_mutex_lock(m);
    if (rc == EOWNERDEAD) rc = pthread_mutex_consistent(m);
    atomic_store(&h->rc, rc ? rc : -1);
    if (rc) return NULL;
    while (!atomic_load(&h->stop))
        syscall(SYS_futex, &h->stop, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
    pthread_mutex_unlock(m);
    atomic_store(&h->rc, -2);
    return NULL;
}

static const uint64_t cma_magic = 0x5c0111c0a11ULL;

int sc_register(sc_comm_t *c, int32_t pid, int32_t tracer)
{
    pthread_t t;
    pthread_attr_t a;
    sigset_t all, old;
    holder_t *h = calloc(1, sizeof *h);
    if (!h) return SC_ENOMEM;
    h->m = mutex(c, c->rank);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);       /* signals stay with the rank's own threads */
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, 64 << 10);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &a, hold, h);
    pthread_attr_destroy(&a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        free(h);
        return SC_EABORT;
    }
    while (!atomic_load(&h->rc)) sched_yield();
    if (atomic_load(&h->rc) != -1) {
        free(h);                                    /* the holder returned without holding */
        return SC_EABORT;
    }
    c->holder = h;
    if (tracer > 0) prctl(PR_SET_PTRACER, (unsigned long)tracer, 0, 0, 0);
    state(c, c->rank)->pid = pid;
    state(c, c->rank)->magic_addr = (uintptr_t)&cma_magic;
    sc_publish_arena(c);
    atomic_store(&state(c, c->rank)->state, ST_ALIVE);
    return SC_OK;
}

/* Leave: a clean exit for the peers.  Returns the lowest rank that left
 * before with another number of calls, else -1.  A root's last calls wait
 * on no one, so ranks that made different numbers of calls (a root's
 * extra Bcasts, read by no one) may each return from all of theirs; of
 * two ranks leaving, the later sees the earlier's count (each publishes
 * its own before it reads the others': at least one sees the other).
 * Counts are compared only while no rank has failed (ok: this rank's
 * calls all succeeded; a failed call counts on some ranks only). */
int sc_deregister(sc_comm_t *c, int ok)
{
    sc_rank_t *me = state(c, c->rank);
    ok = ok && !atomic_load(&hdr(c)->abort_word);
    me->calls = c->call;
    me->counted = ok;
    atomic_store(&me->state, ST_DONE);
    for (int r = 0; ok && r < c->size; r++) {
        sc_rank_t *o = state(c, r);
        if (r != c->rank && atomic_load(&o->state) == ST_DONE && o->counted && o->calls != c->call)
            return r;
    }
    return -1;
}

/* A freed communicator's holder lets its mutex go and ends (after
 * sc_deregister: peers read the state, not the mutex); returns once the
 * mutex is let go, so the segment may then be unmapped. */
void sc_release(sc_comm_t *c)
{
    holder_t *h = c->holder;
    if (!h) return;
    c->holder = NULL;
    atomic_store(&h->stop, 1);
    syscall(SYS_futex, &h->stop, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    while (atomic_load(&h->rc) != -2) sched_yield();
    free(h);
}

uint64_t sc_calls_of(sc_comm_t *c, int32_t r) { return state(c, r)->calls; }

/* Is rank r gone?  Dead (owner-dead mutex) or finished (deregistered). */
static int gone(sc_comm_t *c, int r)
{
    int st = atomic_load(&state(c, r)->state);
    if (st == ST_DONE || st == ST_DEAD) return 1;
    if (st != ST_ALIVE) return 0;
    int rc = pthread_mutex_trylock(mutex(c, r));
    if (rc == EBUSY) return 0;
    if (rc == EOWNERDEAD) {
        pthread_mutex_consistent(mutex(c, r));
        atomic_store(&state(c, r)->state, ST_DEAD);
    }
    if (rc == 0 || rc == EOWNERDEAD) pthread_mutex_unlock(mutex(c, r));
    return 1;
}

int sc_word_reached(uint64_t word, uint64_t call) { return word_reached(word, call); }

int sc_rank_state(sc_comm_t *c, int32_t r)
{
    gone(c, r);
    return atomic_load(&state(c, r)->state);
}

/* This rank aborts from `call` on (first abort wins). */
void sc_abort_call(sc_comm_t *c, int32_t code, uint64_t call)
{
    uint32_t zero = 0;
    sc_rank_t *r = rank_rec(c, c->rank);
    if (atomic_load(&hdr(c)->abort_word)) return;
    r->abort_call = call;
    r->abort_at = 1;
    if (!atomic_compare_exchange_strong(&hdr(c)->abort_word, &zero, (uint32_t)(c->rank + 1) | (uint32_t)code << 16))
        r->abort_at = 0;
}

/* A mismatch this rank found (c->err_*) aborts the job from the call it
 * is in (err_call: a rank that ran ahead may find it calls later, while
 * others still wait in that call for a rank that raised), code 8, with
 * what differs left in its record: every rank raises MismatchError
 * naming it, not only those that compared the records. */
void sc_abort_mismatch(sc_comm_t *c)
{
    sc_rank_t *r = rank_rec(c, c->rank);
    if (atomic_load(&hdr(c)->abort_word)) return;
    r->mis_code = c->err_code, r->mis_when = c->err_when, r->mis_rank = c->err_rank;
    r->mis_a = c->err_a, r->mis_b = c->err_b;
    sc_abort_call(c, 8, c->err_call);   /* its CAS publishes the fields */
}

/* What rank's code-8 abort found: (field, when, other rank, its value, theirs). */
void sc_mismatch_of(sc_comm_t *c, int32_t rank, int64_t *out)
{
    sc_rank_t *r = rank_rec(c, rank);
    out[0] = r->mis_code, out[1] = r->mis_when, out[2] = r->mis_rank, out[3] = r->mis_a, out[4] = r->mis_b;
}

/* Python's abort of this rank, between calls: it counts from the call
 * the rank did not make. */
void sc_abort_self(sc_comm_t *c, int32_t code)
{
    sc_abort_call(c, code, c->call + 1);
}

/* An abort that counts at once (the launcher's, for a rank that died). */
void sc_set_abort(sc_comm_t *c, int32_t rank, int32_t code)
{
    uint32_t zero = 0;
    atomic_compare_exchange_strong(&hdr(c)->abort_word, &zero, (uint32_t)(rank + 1) | (uint32_t)code << 16);
}


/* Record a failure for Python's message; deaths, timeouts and failed
 * single copies abort the job (codes as device.ABORT_REASONS). */
int sc_fail(sc_comm_t *c, int code, int32_t who, int64_t a, int64_t b)
{
    c->err_code = (int32_t)a;
    c->err_rank = who;
    c->err_a = a;
    c->err_b = b;
    if (code == SC_EDEAD) sc_set_abort(c, who, a == 4 ? 4 : 2);
    if (code == SC_ETIMEOUT) sc_abort_call(c, 5, c->call);
    if (code == SC_ECMA) sc_abort_call(c, 7, c->call);
    if (code == SC_EINTR) sc_abort_call(c, 6, c->call);
    return code;
}

/* A finding of calls out of step may date from any earlier call: the
 * abort it makes covers every call a rank may still be in. */
void sc_out_of_step(sc_comm_t *c, int who)
{
    c->err_when = 3;
    c->err_rank = who;
    c->err_call = c->call - (1ULL << 62);
}

/* A signature's field f (isa.h SC_SF_*: ids in the order messages name
 * them, what the user passed before what was derived from it). */
static int64_t field(const uint64_t *s, int f)
{
    switch (f) {
    case SC_SF_COLLECTIVE: return SC_ARG(s, SC_SIG_COLLECTIVE);
    case SC_SF_ROOT: return SC_SARG(s, SC_SIG_ROOT);
    case SC_SF_BYTES: return SC_ARG(s, SC_SIG_BYTES);
    case SC_SF_DTYPE: return SC_ARG(s, SC_SIG_DTYPE);
    case SC_SF_OP: return SC_ARG(s, SC_SIG_OP);
    default: return SC_ARG(s, SC_SIG_ALGORITHM);
    }
}

static int differ(sc_comm_t *c, int who, const uint64_t *mine, const uint64_t *theirs, int when)
{
    if (mine[0] == theirs[0] && mine[1] == theirs[1]) return SC_OK;
    int f = SC_SF_COLLECTIVE;
    while (f < SC_SF_ALGORITHM && field(mine, f) == field(theirs, f)) f++;
    c->err_code = f;
    c->err_when = when;
    c->err_rank = who;
    c->err_a = field(mine, f);
    c->err_b = field(theirs, f);
    return SC_EMISMATCH;
}

static int differ_prev(sc_comm_t *c, int who, const uint64_t *mine, const uint64_t *theirs, int when)
{
    if ((mine[1] & REFUSED) && (theirs[1] & REFUSED)) return SC_OK;
    return differ(c, who, mine, theirs, when);
}

/* who's arrival record of call n into out (sig, prev, hist): from its
 * post line if that still shows n, else from its record of n.  0 if
 * neither is n's (not yet written, or rewritten for a later call). */
static int record(sc_comm_t *c, int who, uint64_t n, uint64_t *out)
{
    sc_line_t *l = post_line(c, who);
    uint64_t s = atomic_load_explicit(&l->seq, memory_order_acquire);
    uint64_t at = atomic_load_explicit(&l->call, memory_order_relaxed);
    out[0] = l->sig[0], out[1] = l->sig[1], out[2] = l->prev[0], out[3] = l->prev[1], out[4] = l->hist;
    atomic_thread_fence(memory_order_acquire);
    if (at == n && !(s & 1) && atomic_load_explicit(&l->seq, memory_order_relaxed) == s) return 1;
    sc_rec_t *r = rec_of(c, who, n);
    s = atomic_load_explicit(&r->seq, memory_order_acquire);
    memcpy(out, r->rec, sizeof r->rec);
    atomic_thread_fence(memory_order_acquire);
    return s == 2 * n + 2 && atomic_load_explicit(&r->seq, memory_order_relaxed) == s;
}

/* Compare who's arrival record of call n, one of our last SC_PAST, with
 * ours: the signatures name what differs, the hash of all before catches
 * calls out of step.  *seen = 0 if who's record of n is not there.
 * Returns SC_EMISMATCH (not yet aborting) or SC_OK. */
static int compare(sc_comm_t *c, int who, uint64_t n, const uint64_t *theirs)
{
    const uint64_t *mine = rec_of(c, c->rank, n)->rec;    /* ours, kept as long */
    if (mine[0] == theirs[0] && mine[1] == theirs[1] && mine[2] == theirs[2] && mine[3] == theirs[3]
        && mine[4] == theirs[4])
        return SC_OK;                                       /* the common case */
    uint64_t back = c->call - n;
    int when = back < 2 ? (int)back : 2, rc;
    /* the oldest call that differs: one the hash covers, the previous, or n */
    int early = mine[4] != theirs[4];
    int prev = !((mine[3] & REFUSED) && (theirs[3] & REFUSED)) && (mine[2] != theirs[2] || mine[3] != theirs[3]);
    c->err_call = early ? c->call - (1ULL << 62) : prev ? n - 1 : n;
    if ((rc = differ(c, who, mine, theirs, when)) || (rc = differ_prev(c, who, mine + 2, theirs + 2, when < 2 ? when + 1 : 2)))
        return rc;
    if (!early) return SC_OK;
    sc_out_of_step(c, who);
    return SC_EMISMATCH;
}

int sc_check_rec(sc_comm_t *c, int who, uint64_t n, int *seen)
{
    uint64_t theirs[5];
    *seen = c->call - n < SC_PAST && record(c, who, n, theirs);
    return *seen ? compare(c, who, n, theirs) : SC_OK;
}

/* A reader's check of a writer whose inline slot it is about to read:
 * the writer stamped its record of the call there, in the line the
 * payload starts in, so a writer that has run calls ahead costs no read
 * of its record ring.  A slot not stamped for this call (the writer made
 * another call, or is rewriting the slot for another) sends the check to
 * the post line and ring. */
int sc_check_slot(sc_comm_t *c, int who, const sc_slot_t *h)
{
    uint64_t theirs[5], at = atomic_load_explicit(&h->call, memory_order_acquire);
    memcpy(theirs, h->rec, sizeof theirs);
    atomic_thread_fence(memory_order_acquire);
    if (at == c->call && atomic_load_explicit(&h->call, memory_order_relaxed) == at) return compare(c, who, at, theirs);
    return sc_check_line(c, who);
}

/* What a wait can check: who's record of this call, or of its last if it
 * is behind. */
int sc_check_line(sc_comm_t *c, int who)
{
    uint64_t at = atomic_load_explicit(&post_line(c, who)->call, memory_order_acquire);
    int seen;
    return sc_check_rec(c, who, (int64_t)(at - c->call) < 0 ? at : c->call, &seen);
}

int64_t sc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Job-wide health, checked between spin batches: the abort word every
 * time, peer liveness every liveness_ns.  `who` is the rank we wait on:
 * only its clean exit is an error for us (others may have left
 * legitimately); any crash anywhere is. */
static int health(sc_comm_t *c, int who, int any, int64_t t, int64_t *next_live, int *gone_rank)
{
    if (aborted_at(c, any ? c->call + (1ULL << 62) : c->call)) return SC_EABORT;
    if (c->job_abort && atomic_load((_Atomic uint32_t *)c->job_abort)) {
        /* the job failed elsewhere: abort here too (rank -1: the world's word
         * names who), so this communicator's other ranks fail at their next call */
        sc_set_abort(c, -1, (int32_t)(atomic_load((_Atomic uint32_t *)c->job_abort) >> 16));
        return aborted_at(c, c->call + (1ULL << 62)) ? SC_EABORT : SC_OK;   /* sets who and why from the word */
    }
    if (t < *next_live) return SC_OK;
    *next_live = t + c->liveness_ns;
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank || !gone(c, r)) continue;
        int dead = atomic_load(&state(c, r)->state) == ST_DEAD;
        if (r == who || dead) {
            *gone_rank = r;
            return dead ? 2 : 4;
        }
    }
    return SC_OK;
}

/* The same checks at once, for a caller whose waits are too short to
 * reach a liveness check (a timed wait, until): SC_EABORT or SC_EDEAD. */
int sc_health(sc_comm_t *c, int who)
{
    int64_t next = 0;
    int r = -1, rc = health(c, who, 1, sc_now_ns(), &next, &r);
    return rc == SC_EABORT || !rc ? rc : sc_fail(c, SC_EDEAD, r, rc, 0);
}

static void futex_wait(_Atomic uint32_t *word, uint32_t expect, int64_t ns)
{
    struct timespec ts = { ns / 1000000000LL, ns % 1000000000LL };
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expect, &ts, NULL, 0);
}

/* Bumping `posts` only when someone sleeps is enough: a waiter counts
 * itself in before it reads `posts` and the flag, the writer stores the
 * flag before it reads the count (both fenced), so either the waiter sees
 * the flag or the writer sees the waiter. */
void sc_wake(sc_wq_t *wq)
{
    atomic_fetch_add(&wq->posts, 1);
    syscall(SYS_futex, (uint32_t *)&wq->posts, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Is the process stopped (SIGSTOP, a debugger)?  Only asked once a wait
 * has timed out. */
static int stopped(int pid)
{
    char path[32], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *end = strrchr(buf, ')');          /* the name may hold spaces and parentheses */
    return end && end[1] == ' ' && (end[2] == 'T' || end[2] == 't');
}

/* The rank a stall is on: from the rank we waited on, follow whom each
 * waits on to one that waits on no one, or is stopped.  Ranks waiting on
 * a stalled rank are not to blame: with 2 waiting for 0's release while
 * 0 waits for stopped 1, whichever timer runs out first names 1.  A cycle
 * of waits (ranks in different calls) names the rank we waited on. */
static int stalled_rank(sc_comm_t *c, int who)
{
    if (who < 0 || who >= c->size) return who;
    for (int r = who, hops = 0; hops < c->size; hops++) {
        int next = atomic_load(&state(c, r)->waiting) - 1;
        if (next == c->rank) return who;                                  /* a cycle through us */
        if (next < 0 || next >= c->size || stopped(state(c, r)->pid)) return r;
        r = next;
    }
    return who;
}

/* Other Python threads of this rank may run from now (core.h, sc_hooks_t). */
static void let_go(sc_comm_t *c)
{
    if (c->hooks.release && !c->hooks.saved) c->hooks.saved = c->hooks.release();
}

/* Spin with pause while the peer is likely running, then yield the core
 * (cheap hand-off when ranks outnumber cores), then sleep on the futex with
 * a timeout so that health is still checked while asleep.  Once slow, the
 * awaited rank's arrival record is compared with ours (a rank in another
 * collective, or with other arguments, never arrives where we wait),
 * signals are polled (Ctrl-C) and the stall timeout runs. */
/* What a wait checks when it looks at the clock: the abort word and
 * liveness (health), the awaited rank's record every CHECK_NS.  SC_OK: go
 * on waiting; 1: the wait was reached meanwhile; else the error to return. */
static int look(sc_comm_t *c, const sc_wait_t *w, int64_t t, int64_t *next_live, int64_t *next_check)
{
    int r = -1, rc = health(c, w->who, w->anyabort, t, next_live, &r);
    if (!rc && !w->nocheck && t >= *next_check) {
        *next_check = t + CHECK_NS;
        if (sc_check_line(c, w->who)) rc = SC_EMISMATCH;
    }
    if (!rc) return SC_OK;
    if (reached(w)) return 1;
    if (rc == SC_EMISMATCH) {
        sc_abort_mismatch(c);
        return rc;
    }
    return rc == SC_EABORT ? rc : sc_fail(c, SC_EDEAD, r, rc, 0);
}

/* A nonblocking call's wait (c->nbc) that is not reached: no waiting.
 * What a slow wait checks is checked here on each step that stops at it
 * (liveness every liveness_ns, the awaited record every CHECK_NS, the
 * stall timeout from the first step that stopped at this wait); the wait
 * is kept for whoever parks on it (nbc.c), and SC_PENDING returned. */
static int nb_pending(sc_comm_t *c, const sc_wait_t *w)
{
    sc_nbc_t *st = c->nbc;
    int64_t t = sc_now_ns();
    int fresh = memcmp(st->wait, w, sizeof *w) != 0;
    if (fresh) {                               /* a wait further on: its stall and checks count from now */
        memcpy(st->wait, w, sizeof *w);
        st->since = t;
        st->next_live = t + c->liveness_ns;
        st->next_check = t + CHECK_NS;
    }
    int rc = look(c, w, t, &st->next_live, &st->next_check);
    if (rc) return rc > 0 ? SC_OK : rc;
    if (!fresh && c->timeout_ns > 0 && t - st->since > c->timeout_ns) {
        int s = stalled_rank(c, w->who);
        return sc_fail(c, SC_ETIMEOUT, s, (t - st->since) / 1000000, s == w->who ? -1 : w->who);
    }
    return SC_PENDING;
}

static int wait_slow(sc_comm_t *c, const sc_wait_t *w)
{
    settle(c, post_line(c, c->rank));        /* no one may sleep on us while we wait */
    if (c->nbc) return reached(w) ? SC_OK : nb_pending(c, w);
    int64_t t0 = sc_now_ns(), next_live = t0 + c->liveness_ns, next_poll = t0 + POLL_NS, next_check = t0 + CHECK_NS;
    if (!c->gil_ns) let_go(c);
    int batch = w->spin_ns ? 32 : 1;          /* oversubscribed: yield at once, the peer needs this core */
    for (;;) {
        for (int i = 0; i < batch; i++) {
            cpu_relax();
            if (reached(w)) return SC_OK;
        }
        int64_t t = sc_now_ns();
        if (t - t0 >= c->gil_ns || t - t0 >= w->spin_ns + c->yield_ns) let_go(c);   /* long, or about to sleep */
        int rc = look(c, w, t, &next_live, &next_check);
        if (rc) return rc > 0 ? SC_OK : rc;
        if (w->until && t >= w->until) return SC_OK;
        if (c->hooks.poll && t >= next_poll) {
            next_poll = t + POLL_NS;
            if (c->hooks.poll(c)) return sc_fail(c, SC_EINTR, c->rank, 0, 0);
        }
        if (c->timeout_ns > 0 && t - t0 > c->timeout_ns) {
            int r = stalled_rank(c, w->who);
            return sc_fail(c, SC_ETIMEOUT, r, (t - t0) / 1000000, r == w->who ? -1 : w->who);
        }
        if (t - t0 < w->spin_ns) continue;
        if (t - t0 < w->spin_ns + c->yield_ns) {
            sched_yield();
            continue;
        }
        atomic_fetch_add(&w->wq->sleepers, 1);
        uint32_t seen = atomic_load(&w->wq->posts);
        if (!reached(w)) futex_wait(&w->wq->posts, seen, c->sleep_ns < POLL_NS ? c->sleep_ns : POLL_NS);
        atomic_fetch_sub(&w->wq->sleepers, 1);
    }
}

/* The slow wait, published: whom it waits on is what a stall timeout
 * follows (stalled_rank). */
int sc_wait_slow(sc_comm_t *c, const sc_wait_t *w)
{
    _Atomic int32_t *waiting = &state(c, c->rank)->waiting;
    atomic_store_explicit(waiting, w->who + 1, memory_order_relaxed);
    int rc = wait_slow(c, w);
    atomic_store_explicit(waiting, 0, memory_order_relaxed);
    return rc;
}

/* This rank's call failed: shut the door on pushes (no peer starts a
 * write into our buffers after this) and wait for the writes in flight,
 * so that none lands after we return.  A writer that is gone writes no
 * more; one stalled past the timeout is given up on (it looks at the
 * door again before each piece), and our buffers (the call's, and also,
 * a receive's that a sender was writing its share of), if in our arena,
 * which it may be writing into by plain stores, leave it (sc_quarantine). */
void sc_shut(sc_comm_t *c, uint64_t also)
{
    atomic_store_explicit(&state(c, c->rank)->shut, 1, memory_order_seq_cst);
    int64_t t0 = sc_now_ns();
    for (int r = 0; r < c->size; r++)
        while (atomic_load_explicit(&state(c, r)->pushing, memory_order_seq_cst) == c->rank + 1 && !gone(c, r)) {
            if (c->timeout_ns > 0 && sc_now_ns() - t0 > c->timeout_ns) {
                sc_quarantine(post_line(c, c->rank)->addr[0]);
                sc_quarantine(post_line(c, c->rank)->addr[1]);
                if (also) sc_quarantine(also);
                return;
            }
            let_go(c);
            sched_yield();
        }
}

/* Can this rank read its right neighbour with process_vm_readv?  Only
 * ranks of this job may: each named the launcher, whose descendants the
 * ranks are, as its ptracer (Yama) when it registered, and published
 * where its known word lives.  Call once every rank has registered. */
int sc_probe_cma(sc_comm_t *c)
{
    int peer = (c->rank + 1) % c->size;
    uint64_t got = 0;
    struct iovec l = { &got, 8 }, r = { (void *)(uintptr_t)state(c, peer)->magic_addr, 8 };
    return process_vm_readv(state(c, peer)->pid, &l, 1, &r, 1, 0) == 8 && got == cma_magic;
}
