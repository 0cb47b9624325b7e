/* Nonblocking and persistent collectives: each started call is a
 * resumable run of the executor (exec.c stages), queued on its
 * communicator and run one at a time in call order (MPI: every rank
 * starts its collectives in the same order).  Whoever owns c->busy steps
 * the queue's head: a start tries it at once (a small call whose peers
 * are there ends inline), Test steps it without blocking, Wait runs it
 * blocking, and a progress thread of the communicator (made on the first
 * background call, a large one) steps it while the caller computes,
 * parking on the flag its step stopped at.  The thread never holds busy
 * across a wait, so a start or a blocking call of the caller's waits for
 * it one step at most. */
#include "sc_internal.h"
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PARK_NS 1000000LL        /* a parked thread steps again at least this often (liveness, timeouts) */
#define IDLE_NS 100000000LL      /* an idle thread looks at its stop flag this often */
#define START_YIELDS 4           /* ranks sharing CPUs (no spin): a start lets the CPU go this often for its peers */

struct sc_nbq {
    pthread_mutex_t lock;        /* head, tail */
    sc_nbc_t *head, *tail;
    _Atomic uint32_t gen;        /* bumped by a background start and at stop: the idle thread sleeps on it */
    _Atomic int32_t stop;
    int32_t started;
    pthread_t thread;
};

static void futex_wait(void *word, uint32_t expect, int64_t ns)
{
    struct timespec ts = { ns / 1000000000LL, ns % 1000000000LL };
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expect, &ts, NULL, 0);
}

static void futex_wake(void *word) { syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

static sc_nbc_t *head(sc_nbq_t *q)
{
    pthread_mutex_lock(&q->lock);
    sc_nbc_t *h = q->head;
    pthread_mutex_unlock(&q->lock);
    return h;
}

/* The head ended with rc: its outcome kept, out of the queue.  Its done
 * flag is set once busy is let go (done), so a caller that sees it done
 * finds the communicator free, and no one touches it after. */
static void enqueue(sc_nbq_t *q, sc_nbc_t *st)
{
    pthread_mutex_lock(&q->lock);
    if (q->tail) q->tail->next = st;
    else q->head = st;
    q->tail = st;
    pthread_mutex_unlock(&q->lock);
}

/* queued: st is the head, taken out (a start that ended inline never was in) */
static void finish(sc_comm_t *c, sc_nbc_t *st, int rc, int queued)
{
    st->rc = rc;
    if (rc) {
        st->err_rank = c->err_rank, st->err_code = c->err_code, st->err_when = c->err_when;
        st->err_call = c->err_call, st->err_a = c->err_a, st->err_b = c->err_b;
    }
    if (!queued) return;
    sc_nbq_t *q = c->nbq;
    pthread_mutex_lock(&q->lock);
    q->head = st->next;
    if (!q->head) q->tail = NULL;
    pthread_mutex_unlock(&q->lock);
}

static void done(sc_nbc_t *st)
{
    if (__atomic_exchange_n(&st->done, 1, __ATOMIC_RELEASE) == 2) futex_wake(&st->done);
}

static int is_done(sc_nbc_t *st) { return __atomic_load_n(&st->done, __ATOMIC_ACQUIRE) == 1; }

/* Sleep until st is done (at most ns): a sleeper marks it first, so done
 * wakes only where one sleeps. */
static void sleep_on(sc_nbc_t *st, int64_t ns)
{
    uint32_t zero = 0;
    if (__atomic_compare_exchange_n(&st->done, &zero, 2, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) || zero == 2)
        futex_wait(&st->done, 2, ns);
}

/* Step the queue without blocking until st is done or a step stops;
 * the caller owns busy, which this lets go.  Whether st is done. */
static int advance(sc_comm_t *c, sc_nbc_t *st)
{
    for (;;) {
        sc_nbc_t *h = head(c->nbq);
        int rc = h ? sc_exec_step(c, h, 1) : SC_PENDING;
        if (rc == SC_PENDING) {
            sc_disown(c);
            return is_done(st);
        }
        finish(c, h, rc, 1);
        sc_disown(c);
        done(h);
        if (h == st || sc_own(c)) return is_done(st);
    }
}

/* Wait until w is reached (spinning up to spin_ns while the peer is
 * likely running, then asleep on its futex), or PARK_NS passed. */
static void park(const sc_wait_t *w, int64_t spin_ns)
{
    int64_t t0 = sc_now_ns();
    while (!reached(w)) {
        int64_t t = sc_now_ns() - t0;
        if (t >= PARK_NS) return;
        if (t < spin_ns) {
            for (int i = 0; i < 32; i++) cpu_relax();
            continue;
        }
        atomic_fetch_add(&w->wq->sleepers, 1);
        uint32_t seen = atomic_load(&w->wq->posts);
        if (!reached(w)) futex_wait(&w->wq->posts, seen, PARK_NS - t);
        atomic_fetch_sub(&w->wq->sleepers, 1);
    }
}

/* One step of the queue's head by the owner of busy, which this lets
 * go: the head finished, or parked on the wait its step stopped at. */
static void step_head(sc_comm_t *c, int64_t spin_ns)
{
    sc_nbc_t *h = head(c->nbq);
    int rc = h ? sc_exec_step(c, h, 1) : SC_PENDING;
    if (h && rc != SC_PENDING) {
        finish(c, h, rc, 1);
        sc_disown(c);
        done(h);
        return;
    }
    sc_wait_t w;
    if (h) memcpy(&w, h->wait, sizeof w);
    sc_disown(c);
    if (h) park(&w, spin_ns);
}

/* The progress thread: steps the head while the queue holds calls,
 * parked between steps on the wait its last step stopped at; asleep
 * while the queue is empty. */
static void *progress(void *arg)
{
    sc_comm_t *c = arg;
    sc_nbq_t *q = c->nbq;
    while (!atomic_load(&q->stop)) {
        uint32_t g = atomic_load(&q->gen);
        if (!head(q)) {
            futex_wait(&q->gen, g, IDLE_NS);
            continue;
        }
        if (sc_own(c)) {                       /* the caller steps it (Test, Wait, a start) */
            struct timespec ts = { 0, 20000 };
            nanosleep(&ts, NULL);
            continue;
        }
        step_head(c, c->spin_ns);
    }
    return NULL;
}

static int start_thread(sc_comm_t *c)
{
    sc_nbq_t *q = c->nbq;
    sigset_t all, old;
    pthread_attr_t a;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);       /* signals stay with the rank's own threads */
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, 256 << 10);
    int rc = pthread_create(&q->thread, &a, progress, c);
    pthread_attr_destroy(&a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    q->started = !rc;
    return rc ? SC_ENOMEM : SC_OK;
}

/* Start st (Python filled prog, sbuf, rbuf, tmp, background): queued
 * behind the calls started before it.  A small one with none before it
 * runs here at once, without blocking: it goes on while its peers arrive
 * within the wait policy's spin (c->spin_ns, as a blocking wait spins
 * before it yields), so a loop of them ends inline, as blocking calls
 * would, while a peer that is late leaves it queued.  Never waits for a
 * peer longer than that spin, or, ranks sharing CPUs (no spin), than
 * START_YIELDS turns of the CPU's other tasks. */
/* Bind st to a program and the buffers' addresses (Python holds all
 * three), the scratch this rank has now, and whether it runs in the
 * background: one call from Python, not five casts. */
void sc_nb_bind(sc_comm_t *c, sc_nbc_t *st, uintptr_t prog, uintptr_t sbuf, uintptr_t rbuf, int background)
{
    st->prog = (const int64_t *)prog, st->sbuf = (char *)sbuf, st->rbuf = (char *)rbuf;
    st->tmp = c->tmp;
    st->background = background;
}

int sc_nb_start(sc_comm_t *c, sc_nbc_t *st)
{
    if (!c->nbq) {
        sc_nbq_t *q = calloc(1, sizeof *q);
        if (!q) return SC_ENOMEM;
        pthread_mutex_init(&q->lock, NULL);
        c->nbq = q;
    }
    sc_nbq_t *q = c->nbq;
    sc_run_t fresh = { .prog = st->prog, .sbuf = st->sbuf, .rbuf = st->rbuf };
    st->run = fresh;
    st->next = NULL;
    st->rc = 0;
    st->since = st->next_live = st->next_check = 0;
    memset(st->wait, 0, sizeof st->wait);
    st->fast = 0;
    __atomic_store_n(&st->done, 0, __ATOMIC_RELAXED);
    int rc = SC_PENDING;
    /* owned, the queue stays as it is: only an owner takes from it; a
     * background call is the thread's from the start, so that the caller
     * computes at once (a first step with its peers there ran the whole
     * call here) */
    if (!st->background && !head(q) && !sc_own(c)) {
        if (!head(q)) {
            int64_t t0 = 0;
            int yields = c->spin_ns ? 0 : START_YIELDS;
            while ((rc = sc_exec_step(c, st, 2)) == SC_PENDING) {
                int64_t t = sc_now_ns();
                if (!t0) t0 = t;
                else if (t - t0 >= c->spin_ns && !yields--) break;
                sc_wait_t w;
                memcpy(&w, st->wait, sizeof w);
                if (!c->spin_ns) sched_yield();     /* ranks share CPUs: the peer we wait on may be the one to run */
                else for (int i = 0; i < 64 && !reached(&w); i++) cpu_relax();
            }
            if (rc != SC_PENDING) {
                st->next = NULL;
                finish(c, st, rc, 0);
                st->fast = !rc;
                sc_disown(c);
                done(st);
                return SC_OK;
            }
            st->run.t0 = -1;                    /* left to later steps: untimed */
        }
        enqueue(q, st);
        sc_disown(c);
    } else {
        enqueue(q, st);
    }
    if (!st->background) return SC_OK;
    if (!q->started && start_thread(c)) return SC_ENOMEM;
    atomic_fetch_add(&q->gen, 1);
    futex_wake(&q->gen);
    return SC_OK;
}

/* Whether st is done, after stepping the queue without blocking (unless
 * another thread steps it now). */
int sc_nb_test(sc_comm_t *c, sc_nbc_t *st)
{
    if (is_done(st)) return 1;
    return sc_own(c) ? 0 : advance(c, st);
}

/* Until st is done: the calls before it and st run blocking here (their
 * waits as a blocking call's: liveness, records, the stall timeout),
 * unless the progress thread is in a step (then a moment's sleep).
 * st's rc. */
int sc_nb_wait(sc_comm_t *c, sc_nbc_t *st)
{
    while (!is_done(st)) {
        if (sc_own(c)) {
            sleep_on(st, 50000);
            continue;
        }
        sc_nbc_t *h = head(c->nbq);
        if (!h) {                             /* st ended between the look and the own */
            sc_disown(c);
            continue;
        }
        int rc = sc_exec_step(c, h, 0);
        finish(c, h, rc, 1);
        sc_disown(c);
        done(h);
    }
    return st->rc;
}

/* Until st is done, as the progress thread steps: never holding busy
 * across a wait (parked between steps on the wait the last one stopped
 * at, spinning up to spin_ns first), so that the caller's thread, which
 * goes on starting and planning calls meanwhile, waits one step at most.
 * For a thread of the rank's own that completes its calls (the torch
 * backend's); spin_ns 0 where it shares its CPU with the caller.  st's rc. */
int sc_nb_drive(sc_comm_t *c, sc_nbc_t *st, int64_t spin_ns)
{
    /* counted before it looks at stopping: sc_nb_stop either waits for it
     * or was seen stopping, and then the queue is never touched */
    __atomic_add_fetch(&c->nb_drivers, 1, __ATOMIC_SEQ_CST);
    while (!is_done(st) && !__atomic_load_n(&c->nb_stopping, __ATOMIC_SEQ_CST)) {
        if (sc_own(c)) {
            sleep_on(st, 50000);
            continue;
        }
        step_head(c, spin_ns);
    }
    int rc = is_done(st) ? st->rc : SC_EABORT;  /* stopped under us: the communicator was freed */
    __atomic_sub_fetch(&c->nb_drivers, 1, __ATOMIC_SEQ_CST);
    return rc;
}

/* No more calls on c: the thread ends (after its step) and the queue goes. */
void sc_nb_stop(sc_comm_t *c)
{
    sc_nbq_t *q = c->nbq;
    if (!q) return;
    atomic_store(&q->stop, 1);
    atomic_fetch_add(&q->gen, 1);
    futex_wake(&q->gen);
    if (q->started) pthread_join(q->thread, NULL);
    __atomic_store_n(&c->nb_stopping, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&c->nb_drivers, __ATOMIC_SEQ_CST)) {    /* each leaves within a park */
        struct timespec ts = { 0, 100000 };
        nanosleep(&ts, NULL);
    }
    pthread_mutex_destroy(&q->lock);
    free(q);
    c->nbq = NULL;
}
