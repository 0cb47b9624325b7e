/* Layout of a communicator's segment, rank registration, failure
 * detection, and the slow path of every wait. */
#include "sc_internal.h"
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>

#define SC_MAGIC 0x5c0111u
#define PAGE 4096

static int64_t up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

int64_t sc_layout(sc_comm_t *c)
{
    int64_t p = c->size, o = SC_LINE;            /* header line first */
    c->off_state = o;  o = up(o + p * (int64_t)sizeof(sc_state_t), SC_LINE);
    c->off_mutex = o;  o = up(o + p * 64, SC_LINE);
    c->off_bar = o;    o += p * SC_LINE;
    c->off_q = o;      o = up(o + SC_LINE + 2 * p * 8, SC_LINE);   /* sleepers line, gather, release */
    c->off_post = o;   o += (p + 1) * SC_LINE;
    c->off_slot = o;   o += (p + 1) * SC_SLOTS * SC_LINE;
    c->off_ack = o;    o += p * (p + 1) * SC_LINE;
    c->off_chk = o;    o += 2 * p * SC_LINE;
    c->off_chan = o = up(o, PAGE);
    o += p * c->chan_bytes;
    c->off_stripe = o = up(o, PAGE);
    o += c->stripe_bytes;
    c->total = up(o, PAGE);
    return c->total;
}

static sc_state_t *state(sc_comm_t *c, int r) { return (sc_state_t *)(c->base + c->off_state) + r; }
static pthread_mutex_t *mutex(sc_comm_t *c, int r) { return (pthread_mutex_t *)(c->base + c->off_mutex + 64 * (int64_t)r); }

int sc_attach(sc_comm_t *c, char *base)
{
    c->base = base;
    return hdr(c)->magic == SC_MAGIC && hdr(c)->size == c->size ? SC_OK : SC_EABORT;
}

/* Run once by the segment's creator, before any rank maps it. */
int sc_init_shared(sc_comm_t *c)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    for (int r = 0; r < c->size; r++)
        if (pthread_mutex_init(mutex(c, r), &a)) return SC_ENOMEM;
    pthread_mutexattr_destroy(&a);
    hdr(c)->size = c->size;
    hdr(c)->magic = SC_MAGIC;
    return SC_OK;
}

/* A rank holds its own robust mutex for its whole life: when the process
 * dies, however it dies, the kernel marks the mutex owner-dead, which any
 * peer can see with a trylock (no pid reuse or zombie ambiguity). */
int sc_register(sc_comm_t *c, int32_t pid)
{
    int rc = pthread_mutex_lock(mutex(c, c->rank));
    if (rc == EOWNERDEAD) pthread_mutex_consistent(mutex(c, c->rank));
    else if (rc) return SC_EABORT;
    state(c, c->rank)->pid = pid;
    atomic_store(&state(c, c->rank)->state, ST_ALIVE);
    return SC_OK;
}

void sc_deregister(sc_comm_t *c)
{
    atomic_store(&state(c, c->rank)->state, ST_DONE);
    pthread_mutex_unlock(mutex(c, c->rank));
}

void sc_set_abort(sc_comm_t *c, int32_t rank, int32_t code)
{
    uint32_t zero = 0;
    atomic_compare_exchange_strong(&hdr(c)->abort_word, &zero, (uint32_t)(rank + 1) | (uint32_t)code << 16);
}


/* Record a failure for Python's message (err_code: for SC_EDEAD 2 died,
 * 4 exited, 5 unreadable with errno in err_b). */
int sc_fail(sc_comm_t *c, int code, int32_t who, int64_t a, int64_t b)
{
    c->err_code = (int32_t)a;
    c->err_rank = who;
    c->err_a = a;
    c->err_b = b;
    if (code == SC_EDEAD) sc_set_abort(c, who, a == 4 ? 4 : 2);
    return code;
}

int sc_mismatch(sc_comm_t *c, int field, int32_t who, int64_t mine, int64_t theirs)
{
    c->err_code = field;
    c->err_rank = who;
    c->err_a = mine;
    c->err_b = theirs;
    sc_set_abort(c, c->rank, 3);
    return SC_EMISMATCH;
}

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

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Job-wide health, checked between spin batches: the abort word every
 * time, peer liveness every liveness_ns.  `who` is the rank whose flag we
 * wait on: only its clean exit is an error for us (others may have left
 * legitimately); any crash anywhere is.  Nothing is published here: the
 * caller first looks once more at its flag (the peer may have posted and
 * then left). */
static int health(sc_comm_t *c, int who, int64_t t, int64_t *next_live, int *gone_rank)
{
    if (aborted(c)) return SC_EABORT;
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

/* Spin with pause for spin_ns while the peer is likely running, then yield
 * the core (cheap hand-off when ranks outnumber cores), then sleep on the
 * futex with a timeout so that health is still checked while asleep. */
int sc_wait_slow(sc_comm_t *c, _Atomic uint64_t *v, sc_wq_t *wq, uint64_t target, int who, int64_t spin_ns)
{
    int64_t t0 = now_ns(), next_live = t0 + c->liveness_ns;
    if (c->gil_release && !c->gil_saved) c->gil_saved = ((void *(*)(void))c->gil_release)();
    int batch = spin_ns ? 32 : 1;          /* oversubscribed: yield at once, the peer needs this core */
    for (;;) {
        for (int i = 0; i < batch; i++) {
            cpu_relax();
            if (reached(atomic_load_explicit(v, memory_order_acquire), target)) return SC_OK;
        }
        int64_t t = now_ns(), r = -1;
        int rc = health(c, who, t, &next_live, (int *)&r);
        if (rc) {
            if (reached(atomic_load_explicit(v, memory_order_acquire), target)) return SC_OK;
            return rc == SC_EABORT ? rc : sc_fail(c, SC_EDEAD, (int32_t)r, rc, 0);
        }
        if (t - t0 < spin_ns) continue;
        if (t - t0 < spin_ns + c->yield_ns) {
            sched_yield();
            continue;
        }
        atomic_fetch_add(&wq->sleepers, 1);
        uint32_t seen = atomic_load(&wq->posts);
        if (!reached(atomic_load(v), target)) futex_wait(&wq->posts, seen, c->sleep_ns);
        atomic_fetch_sub(&wq->sleepers, 1);
    }
}

/* Cross-rank agreement on a call's signature (SHMCOLL_CHECK): every rank
 * publishes (kind, root, nbytes), a barrier, then every rank compares all.
 * All ranks see the same table, so all raise together and the communicator
 * stays usable.  Two line sets alternate so a fast rank's next check cannot
 * overwrite a line a slow rank is still reading. */
int sc_check(sc_comm_t *c, int coll, int alg, int64_t root, int64_t nbytes)
{
    int64_t kind = coll << 4 | alg;   /* collective and algorithm must both agree */
    uint64_t op = ++c->op;
    int64_t set = (int64_t)(c->nchecks++ & 1) * c->size;   /* not op: the barrier below bumps op too */
    sc_line_t *me = line_at(c, c->off_chk, set + c->rank);
    me->meta[0] = kind;
    me->meta[1] = root;
    memcpy(me->data, &nbytes, sizeof nbytes);
    post_line_val(me, stamp(op, 1));
    int rc = sc_barrier(c, 1);
    if (rc) return rc;
    for (int r = 0; r < c->size; r++) {
        sc_line_t *l = line_at(c, c->off_chk, set + r);
        int64_t nb;
        memcpy(&nb, l->data, sizeof nb);
        int field = l->meta[0] != kind ? 1 : l->meta[1] != root ? 2 : nb != nbytes ? 3 : 0;
        if (field) {
            int64_t theirs[] = { 0, l->meta[0], l->meta[1], nb }, mine[] = { 0, kind, root, nbytes };
            c->err_code = field;
            c->err_rank = r;
            c->err_a = mine[field];
            c->err_b = theirs[field];
            return SC_EDIFFER;
        }
    }
    return SC_OK;
}

/* Rendezvous: copy n bytes at addr in rank who's memory straight into dst
 * (the kernel may copy less than asked, so loop). */
int sc_read_peer(sc_comm_t *c, int who, char *dst, uint64_t addr, int64_t n)
{
    for (int64_t done = 0; done < n;) {
        struct iovec l = { dst + done, n - done }, r = { (void *)(uintptr_t)(addr + done), n - done };
        ssize_t got = process_vm_readv(state(c, who)->pid, &l, 1, &r, 1, 0);
        if (got <= 0) return sc_fail(c, SC_EDEAD, who, 5, errno);
        done += got;
    }
    return SC_OK;
}

/* Can every rank read its peers' memory with process_vm_readv (same user,
 * ptrace rules, seccomp)?  Each rank lets any process trace it, publishes
 * the address of a known word, reads its right neighbour's, and all agree
 * on the result, so the single-copy protocol is on everywhere or nowhere.
 * Runs before any collective; the barriers keep the post lines it borrows
 * from being reused before everyone has read them. */
int sc_probe_cma(sc_comm_t *c)
{
    static const uint64_t magic = 0x5c0111c0a11ULL;
    int p = c->size, me = c->rank, rc;
    char *mine = post_line(c, me)->data;
    uint64_t addr = (uintptr_t)&magic, got = 0, ok;
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    memcpy(mine, &addr, 8);
    if ((rc = sc_barrier(c, 1))) return rc;
    int peer = (me + 1) % p;
    memcpy(&addr, post_line(c, peer)->data, 8);
    struct iovec l = { &got, 8 }, r = { (void *)(uintptr_t)addr, 8 };
    ok = process_vm_readv(state(c, peer)->pid, &l, 1, &r, 1, 0) == 8 && got == magic;
    memcpy(mine + 8, &ok, 8);
    if ((rc = sc_barrier(c, 1))) return rc;
    c->cma = 1;
    for (int q = 0; q < p; q++) {
        memcpy(&ok, post_line(c, q)->data + 8, 8);
        c->cma &= ok != 0;
    }
    return sc_barrier(c, 1);
}
