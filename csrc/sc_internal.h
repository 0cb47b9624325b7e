/* Shared-memory primitives of the engine: flag lines, sequence stamps,
 * waits and posts.  Every flag is written by exactly one rank, lives alone
 * on its own SC_LINE-byte line and only grows (see stamp()). */
#ifndef SC_INTERNAL_H
#define SC_INTERNAL_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdatomic.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include "core.h"

/* Waiters asleep on a flag: the writer bumps `posts` (the futex word) and
 * wakes them.  A counter of its own, not the stamp's low half, so no later
 * stamp can look unchanged to a sleeper. */
typedef struct { _Atomic uint32_t sleepers, posts; } sc_wq_t;

struct sc_line {
    _Atomic uint64_t val;         /* stamp */
    sc_wq_t wq;
    int64_t meta[2];              /* call signature for cheap cross-rank checks */
    char data[SC_INLINE];         /* small payloads travel inside the flag line */
};
_Static_assert(sizeof(struct sc_line) == SC_LINE, "flag line size");

typedef struct {
    _Atomic uint32_t abort_word;  /* (rank + 1) | code << 16, first error wins */
    uint32_t magic;
    int32_t size;
} sc_hdr_t;

enum { ST_NONE = 0, ST_ALIVE = 1, ST_DONE = 2, ST_DEAD = 3 };
typedef struct { _Atomic int32_t state; int32_t pid; } sc_state_t;

/* A stamp names one event of one collective call: (op, k).  op counts the
 * communicator's calls (equal on every rank), k the event inside the call;
 * stamps of later calls are always larger, so a flag never needs a reset. */
#define SC_KBITS 32     /* events per call; the call count wraps, and reached() does not mind */
static inline uint64_t stamp(uint64_t op, uint64_t k) { return (op << SC_KBITS) + k; }
static inline int reached(uint64_t v, uint64_t target) { return (int64_t)(v - target) >= 0; }

static inline sc_line_t *line_at(sc_comm_t *c, int64_t off, int64_t i) {
    return (sc_line_t *)(c->base + off) + i;
}
static inline sc_hdr_t *hdr(sc_comm_t *c) { return (sc_hdr_t *)c->base; }
static inline sc_line_t *bar_line(sc_comm_t *c, int r) { return line_at(c, c->off_bar, r); }
static inline sc_line_t *post_line(sc_comm_t *c, int ch) { return line_at(c, c->off_post, ch); }
/* ack[r][ch]: how far reader r has consumed channel ch (ch == size: the stripe) */
static inline sc_line_t *ack_line(sc_comm_t *c, int r, int ch) {
    return line_at(c, c->off_ack, (int64_t)r * (c->size + 1) + ch);
}
static inline char *chan_buf(sc_comm_t *c, int r) { return c->base + c->off_chan + (int64_t)r * c->chan_bytes; }

int sc_wait_slow(sc_comm_t *c, _Atomic uint64_t *v, sc_wq_t *wq, uint64_t target, int who, int64_t spin_ns);
void sc_wake(sc_wq_t *wq);
int sc_fail(sc_comm_t *c, int code, int32_t who, int64_t a, int64_t b);
int sc_mismatch(sc_comm_t *c, int field, int32_t who, int64_t mine, int64_t theirs);
int sc_read_peer(sc_comm_t *c, int who, char *dst, uint64_t addr, int64_t n);

/* Every collective starts here: once the job is aborted, a rank that never
 * waits (a root running ahead) still fails at its next call.  The header
 * line is written once per job, so this load stays an L1 hit. */
static inline int aborted(sc_comm_t *c) {
    uint32_t w = atomic_load_explicit(&hdr(c)->abort_word, memory_order_relaxed);
    if (!w) return 0;
    c->err_rank = (int32_t)(w & 0xffff) - 1;
    c->err_a = c->err_code = (int32_t)(w >> 16);
    return SC_EABORT;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Wait until *v reaches target; the fast path is one acquire load. */
static inline int wait_spin(sc_comm_t *c, _Atomic uint64_t *v, sc_wq_t *wq, uint64_t target, int who, int64_t spin_ns) {
    if (reached(atomic_load_explicit(v, memory_order_acquire), target)) return SC_OK;
    return sc_wait_slow(c, v, wq, target, who, spin_ns);
}
static inline int wait_val(sc_comm_t *c, _Atomic uint64_t *v, sc_wq_t *wq, uint64_t target, int who) {
    return wait_spin(c, v, wq, target, who, c->spin_ns);
}
/* Wait for rank `who`'s line to reach target. */
static inline int wait_line(sc_comm_t *c, sc_line_t *l, uint64_t target, int who) {
    return wait_val(c, &l->val, &l->wq, target, who);
}

/* Publish: the release store orders every earlier write (payload, copies)
 * before the flag; the fence orders the flag before reading the sleeper
 * count, pairing with the waiter's increment-then-recheck (no lost wake-up). */
static inline void post_val(_Atomic uint64_t *v, sc_wq_t *wq, uint64_t value) {
    atomic_store_explicit(v, value, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&wq->sleepers, memory_order_relaxed)) sc_wake(wq);
}
static inline void post_line_val(sc_line_t *l, uint64_t value) { post_val(&l->val, &l->wq, value); }

/* Small bcasts rotate over SC_SLOTS lines per writer, chosen by call, so a
 * root waits only for the readers of the call that last used the same
 * slot.  The flag stays the writer's post line: its stamps only grow, and a
 * reader that sees a later one still finds its own call's data in its slot. */
static inline sc_line_t *slot_line(sc_comm_t *c, int ch, uint64_t op) {
    return line_at(c, c->off_slot, (int64_t)ch * SC_SLOTS + op % SC_SLOTS);
}

/* Debts: acks owed to writer ch before it may rewrite what they read.  Set
 * s < SC_SLOTS is inline slot s; set SC_SLOTS the post line and the ring. */
static inline uint64_t *debts(sc_comm_t *c, int ch, int set) {
    return c->pend + ((int64_t)ch * (SC_SLOTS + 1) + set) * c->size;
}

/* Wait until every reader with an outstanding debt in the set has acked
 * it, then clear the debts (lazy drain: a writer only waits for earlier
 * readers when it writes the same memory again). */
static inline int drain_set(sc_comm_t *c, int ch, int set) {
    uint64_t *p = debts(c, ch, set);
    for (int r = 0; r < c->size; r++) {
        if (p[r]) {
            int rc = wait_line(c, ack_line(c, r, ch), p[r], r);
            if (rc) return rc;
            p[r] = 0;
        }
    }
    return SC_OK;
}
static inline int drain(sc_comm_t *c, int ch) { return drain_set(c, ch, SC_SLOTS); }
/* A call's signature rides in the line its writer wrote for this call:
 * byte count, and (call number, algorithm, root).  Readers compare it with
 * their own (always on: it costs no extra hand-off).  The call number
 * makes a line left by an earlier call (a reader looking where this
 * writer's protocol did not write) a mismatch, never stale data. */
static inline int64_t sig(uint64_t op, int alg, int root) {
    return (int64_t)((op & 0xffffffffffffULL) << 16 | (uint64_t)(alg & 0xf) << 12 | (uint64_t)(root & 0xfff));
}
static inline void put_meta(sc_comm_t *c, sc_line_t *l, int64_t nbytes) { l->meta[0] = nbytes; l->meta[1] = c->sig; }
static inline int check_meta(sc_comm_t *c, sc_line_t *l, int who, int64_t nbytes) {
    int64_t n = l->meta[0], s = l->meta[1], signature = c->sig;
    if (s >> 16 != signature >> 16) return sc_mismatch(c, 1, who, signature >> 16, s >> 16);
    if ((s >> 12 & 0xf) != (signature >> 12 & 0xf)) return sc_mismatch(c, 1, who, signature >> 12 & 0xf, s >> 12 & 0xf);
    if ((s & 0xfff) != (signature & 0xfff)) return sc_mismatch(c, 2, who, signature & 0xfff, s & 0xfff);
    if (n != nbytes) return sc_mismatch(c, 3, who, nbytes, n);
    return SC_OK;
}
/* Copies into user memory stream past the cache (non-temporal stores) only
 * when the call's whole footprint, every rank's buffers, would not stay in
 * the shared cache anyway; below that, cached stores are faster. */
static inline int streams(sc_comm_t *c, int64_t footprint) { return footprint >= c->nt_bytes; }

static inline void owe_set(sc_comm_t *c, int ch, int set, int r, uint64_t v) { debts(c, ch, set)[r] = v; }
static inline void owe(sc_comm_t *c, int ch, int r, uint64_t v) { owe_set(c, ch, SC_SLOTS, r, v); }

#endif
