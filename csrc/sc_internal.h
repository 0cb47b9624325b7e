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

struct sc_line {
    _Atomic uint64_t val;         /* stamp; futex waits on its low 32 bits */
    _Atomic uint32_t sleepers;    /* waiters asleep on val: the writer wakes them */
    uint32_t pad;
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
#define SC_KBITS 24
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

int sc_wait_slow(sc_comm_t *c, _Atomic uint64_t *v, _Atomic uint32_t *sleepers, uint64_t target, int who);
void sc_wake(_Atomic uint64_t *v);
int sc_fail(sc_comm_t *c, int code, int32_t who, int64_t a, int64_t b);

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Wait until *v reaches target; the fast path is one acquire load. */
static inline int wait_val(sc_comm_t *c, _Atomic uint64_t *v, _Atomic uint32_t *sl, uint64_t target, int who) {
    if (reached(atomic_load_explicit(v, memory_order_acquire), target)) return SC_OK;
    return sc_wait_slow(c, v, sl, target, who);
}
/* Wait for rank `who`'s line to reach target. */
static inline int wait_line(sc_comm_t *c, sc_line_t *l, uint64_t target, int who) {
    return wait_val(c, &l->val, &l->sleepers, target, who);
}

/* Publish: the release store orders every earlier write (payload, copies)
 * before the flag; the fence orders the flag before reading the sleeper
 * count, pairing with the waiter's increment-then-recheck (no lost wake-up). */
static inline void post_val(_Atomic uint64_t *v, _Atomic uint32_t *sl, uint64_t value) {
    atomic_store_explicit(v, value, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(sl, memory_order_relaxed)) sc_wake(v);
}
static inline void post_line_val(sc_line_t *l, uint64_t value) { post_val(&l->val, &l->sleepers, value); }

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
/* A call's signature rides in the writer's line: readers compare it with
 * their own (always on: it costs no extra hand-off). */
static inline void put_meta(sc_line_t *l, int64_t a, int64_t b) { l->meta[0] = a; l->meta[1] = b; }
static inline int check_meta(sc_comm_t *c, sc_line_t *l, int who, int64_t a, int64_t b) {
    if (l->meta[0] != a) return sc_fail(c, SC_EMISMATCH, who, a, l->meta[0]);
    if (l->meta[1] != b) return sc_fail(c, SC_EMISMATCH, who, b, l->meta[1]);
    return SC_OK;
}
/* Copies into user memory stream past the cache (non-temporal stores) only
 * when the call's whole footprint, every rank's buffers, would not stay in
 * the shared cache anyway; below that, cached stores are faster. */
static inline int streams(sc_comm_t *c, int64_t footprint) { return footprint >= c->nt_bytes; }

static inline void owe_set(sc_comm_t *c, int ch, int set, int r, uint64_t v) { debts(c, ch, set)[r] = v; }
static inline void owe(sc_comm_t *c, int ch, int r, uint64_t v) { owe_set(c, ch, SC_SLOTS, r, v); }

#endif
