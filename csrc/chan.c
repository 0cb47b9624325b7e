/* Pool channels (shmcoll/pool.py): a single-producer single-consumer byte
 * ring per direction per worker, and a bell (a count) that any worker
 * rings to wake the pool's owner.  They live in memory the owner mapped
 * shared and anonymous before it forked its workers, so nothing is named
 * in /dev/shm and nothing outlives the processes that map it.
 *
 * head (bytes written) is stored only by the producer, tail (bytes read)
 * only by the consumer, each on a line of its own; a side that must wait
 * spins, then counts itself asleep and sleeps on the futex of the other's
 * word (its low half: every store moves it by 1 .. cap < 2^32 bytes, so
 * it changes).  A side that moves its word wakes the other only when it
 * is counted asleep: the sleeper counts itself before it rereads the
 * word, the mover stores the word before it reads the count (both
 * fenced), so one of them sees the other.
 *
 * A put or get moves what it can and waits while it can move nothing, at
 * most wait_ns: the caller (Python) then checks that its peer lives and
 * calls again.  The GIL is let go around every call (cffi). */
#include "sc_internal.h"
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "a futex on a word's low half");

#define PIECE (256 << 10)   /* a large message is published in pieces, so the reader copies behind the writer */

typedef struct {
    _Atomic uint64_t head; _Atomic uint32_t rsleep; char pad0[SC_LINE - 12];
    _Atomic uint64_t tail; _Atomic uint32_t wsleep; char pad1[SC_LINE - 12];
    int64_t cap; char pad2[SC_LINE - 8];
    char data[];
} chan_t;

typedef struct { _Atomic uint64_t count; _Atomic uint32_t sleepers; } bell_t;

int64_t sc_chan_size(int64_t cap) { return (int64_t)sizeof(chan_t) + cap; }

void sc_chan_init(char *ch, int64_t cap)
{
    chan_t *c = (chan_t *)ch;
    memset(c, 0, sizeof *c);
    c->cap = cap;
}

/* Wait until *word (its low half) is no longer seen, or wait_ns passed:
 * 1 if it moved.  sleep: the count of sleepers this side joins.  It
 * spins |spin_ns| first, yielding the CPU between looks when spin_ns < 0
 * (a waiter that may share its CPU with the one it waits for). */
static int wait_moved(_Atomic uint64_t *word, uint64_t seen, _Atomic uint32_t *sleep, int64_t spin_ns,
                      int64_t wait_ns)
{
    int64_t t0 = sc_now_ns(), now = t0, spin = spin_ns < 0 ? -spin_ns : spin_ns;
    for (int i = 0; atomic_load_explicit(word, memory_order_acquire) == seen; i++) {
        if ((i & 63) == 0 && (now = sc_now_ns()) - t0 >= spin) break;
        if (spin_ns < 0) sched_yield();
        else cpu_relax();
    }
    while (atomic_load_explicit(word, memory_order_acquire) == seen) {
        int64_t left = t0 + wait_ns - now;
        if (left <= 0) return 0;
        atomic_fetch_add(sleep, 1);
        atomic_thread_fence(memory_order_seq_cst);
        if (atomic_load(word) == seen) {
            struct timespec ts = { left / 1000000000LL, left % 1000000000LL };
            syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, (uint32_t)seen, &ts, NULL, 0);
        }
        atomic_fetch_sub(sleep, 1);
        now = sc_now_ns();
    }
    return 1;
}

static void wake(_Atomic uint64_t *word, _Atomic uint32_t *sleep)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(sleep, memory_order_relaxed))
        syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void moved(_Atomic uint64_t *word, uint64_t to, _Atomic uint32_t *sleep)
{
    atomic_store_explicit(word, to, memory_order_release);
    wake(word, sleep);
}

/* Move up to n bytes between buf and the ring: the producer's side (put:
 * its word is head, it waits for the consumer's tail to free room) or the
 * consumer's (its word is tail, it waits for head to bring bytes). */
static int64_t move(chan_t *c, char *buf, int64_t n, int put, int64_t spin_ns, int64_t wait_ns)
{
    _Atomic uint64_t *mine = put ? &c->head : &c->tail, *theirs = put ? &c->tail : &c->head;
    _Atomic uint32_t *my_sleep = put ? &c->wsleep : &c->rsleep, *their_sleep = put ? &c->rsleep : &c->wsleep;
    int64_t done = 0;
    uint64_t pos = atomic_load_explicit(mine, memory_order_relaxed);
    while (done < n) {
        uint64_t other = atomic_load_explicit(theirs, memory_order_acquire);
        int64_t can = put ? c->cap - (int64_t)(pos - other) : (int64_t)(other - pos);   /* room, or bytes ready */
        if (can == 0) {
            if (!wait_moved(theirs, other, my_sleep, spin_ns, wait_ns)) break;
            continue;
        }
        int64_t at = (int64_t)(pos % (uint64_t)c->cap), k = n - done;
        if (k > can) k = can;
        if (k > c->cap - at) k = c->cap - at;
        if (k > PIECE) k = PIECE;
        if (put) sc_copy(c->data + at, buf + done, k, 0);
        else sc_copy(buf + done, c->data + at, k, 0);
        done += k;
        pos += (uint64_t)k;
        moved(mine, pos, their_sleep);
    }
    return done;
}

int64_t sc_chan_put(char *ch, const char *src, int64_t n, int64_t spin_ns, int64_t wait_ns)
{
    return move((chan_t *)ch, (char *)src, n, 1, spin_ns, wait_ns);
}

int64_t sc_chan_get(char *ch, char *dst, int64_t n, int64_t spin_ns, int64_t wait_ns)
{
    return move((chan_t *)ch, dst, n, 0, spin_ns, wait_ns);
}

int64_t sc_chan_ready(char *ch)
{
    chan_t *c = (chan_t *)ch;
    return (int64_t)(atomic_load_explicit(&c->head, memory_order_acquire)
                     - atomic_load_explicit(&c->tail, memory_order_relaxed));
}

uint64_t sc_bell_seen(char *b) { return atomic_load_explicit(&((bell_t *)b)->count, memory_order_acquire); }

void sc_bell_ring(char *b)
{
    bell_t *bell = (bell_t *)b;
    atomic_fetch_add(&bell->count, 1);
    wake(&bell->count, &bell->sleepers);
}

/* 1 once the bell rang past seen, 0 after wait_ns. */
int sc_bell_wait(char *b, uint64_t seen, int64_t spin_ns, int64_t wait_ns)
{
    bell_t *bell = (bell_t *)b;
    return wait_moved(&bell->count, seen, &bell->sleepers, spin_ns, wait_ns);
}
