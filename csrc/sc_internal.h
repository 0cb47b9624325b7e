/* Shared-memory primitives of the engine: flag lines, (call, event) flags,
 * waits and posts.  Every line is written by exactly one rank and lives
 * alone on its own SC_LINE bytes. */
#ifndef SC_INTERNAL_H
#define SC_INTERNAL_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdatomic.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include "isa.h"
#include "core.h"

/* Field F of words p (an instruction, a program header, a signature):
 * isa.h declares F as its word, F##_LO its first bit and F##_BITS its
 * width, so this compiles to the load, shift and mask a literal would
 * (a 64-bit field: the word itself).  SC_SARG sign-extends. */
#define SC_ARG(p, F) ((int64_t)((uint64_t)(p)[F] >> F##_LO & ~0ULL >> (64 - F##_BITS)))
#define SC_SARG(p, F) ((int64_t)((uint64_t)(p)[F] << (64 - F##_LO - F##_BITS)) >> (64 - F##_BITS))

/* Waiters asleep on a line: the writer bumps `posts` (the futex word) and
 * wakes them.  A counter of its own, so no later value of the flag can
 * look unchanged to a sleeper. */
typedef struct { _Atomic uint32_t sleepers, posts; } sc_wq_t;

/* A flag is two words: the call number (64 bits, compared by signed
 * difference, so it cannot wrap within 2^63 calls) and the event within
 * that call.  (C, k) is reached when the line shows call C with event >= k,
 * or any later call: a writer in a later call has finished every event of
 * C.  Post lines also carry the writer's arrival record for the call: its
 * signature, the previous call's, a hash of all before, and its buffers'
 * addresses for single-copy readers, under a sequence lock (seq odd while
 * the writer rewrites record and call).  The record is also in the ring
 * below; this copy shares the flag's cache line, so a reader's first wait
 * finds the call and checks it in one line. */
struct sc_line {                  /* first 64 bytes: what a reader checks */
    _Atomic uint64_t call;
    _Atomic uint64_t event;
    _Atomic uint64_t seq;
    uint64_t sig[2];
    uint64_t prev[2];
    uint64_t hist;
    sc_wq_t wq;                   /* apart: sleepers counting in do not bounce the flag */
    uint64_t addr[2];             /* send, recv buffer of this call */
    uint64_t next_call;           /* rank 0: its twin pick for call next_call if that call's signature is */
    uint64_t next_sig[2];         /* next_sig, made before it arrives there (twins.c), */
    _Atomic uint32_t next_seq;    /* under a sequence lock (odd while rewritten) */
    uint32_t next_variant;
    char pad[SC_LINE - 120];
};
_Static_assert(sizeof(struct sc_line) == SC_LINE, "flag line size");
_Static_assert(offsetof(struct sc_line, wq) == 64, "the checked record fills the first cache line");

/* A rank's arrival record of call n, also kept for its last SC_PAST calls
 * at n % SC_PAST (seq 2n + 1 while written, 2n + 2 after): a reader may
 * check a writer that has run calls ahead, and a root its neighbours'
 * records of calls it has gone past. */
typedef struct {
    _Atomic uint64_t seq;
    uint64_t rec[5];              /* sig, prev, hist */
    uint64_t variant;             /* rank 0's: which of a twin's programs every rank runs (sc_twin_pick) */
    _Atomic int64_t took;         /* a twin call's ns on this rank, once it ended (0 before) */
} sc_rec_t;
_Static_assert(sizeof(sc_rec_t) == 64, "record size");

typedef struct {
    _Atomic uint32_t abort_word;  /* (rank + 1) | code << 16, first error wins */
    uint32_t magic;
    int32_t size;
} sc_hdr_t;

enum { ST_NONE = 0, ST_ALIVE = 1, ST_DONE = 2, ST_DEAD = 3 };
/* abort_call: the call from which this rank's abort counts (abort_at set);
 * calls before it still complete: the aborting rank finished them. */
/* mis_*: what differs, as the rank found it (err_code, err_when, err_rank,
 * err_a, err_b), when its abort is code 8 (a mismatch), for the others'
 * messages.
 * pushing: rank + 1 of the rank whose memory this one is writing into
 * (process_vm_writev, a push), else 0; shut: this rank's call failed, no
 * one may write into its buffers any more (sc_shut); waiting: rank + 1 of
 * the rank this one's slow wait waits on, else 0 (whom a stall blames). */
typedef struct {
    _Atomic int32_t state; int32_t pid; uint64_t magic_addr; uint64_t abort_call; int32_t abort_at, pad;
    _Atomic int32_t pushing, shut, waiting, pad2;
    int32_t mis_code, mis_when, mis_rank, pad3; int64_t mis_a, mis_b;
    uint64_t calls;               /* the calls it made, once it left (ST_DONE) */
    int32_t counted, arena_fd;    /* calls is comparable: it left with no failure seen; its arena's memfd */
    uint64_t arena_base, arena_len, arena_ino;   /* and where that is (len 0: no arena), csrc/peers.c */
} sc_rank_t;
void sc_publish_arena(sc_comm_t *c);
void sc_quarantine(uint64_t addr);
char *sc_peer_ptr(sc_comm_t *c, int who, uint64_t addr, int64_t n);
void sc_alias_set(sc_comm_t *c, int j, char *p, int64_t off);
char *sc_alias(sc_comm_t *c, int j);
static inline sc_rank_t *rank_rec(sc_comm_t *c, int r) { return (sc_rank_t *)(c->base + c->off_state) + r; }

static inline sc_hdr_t *hdr(sc_comm_t *c) { return (sc_hdr_t *)c->base; }
static inline sc_line_t *post_line(sc_comm_t *c, int r) { return (sc_line_t *)(c->base + c->off_post) + r; }
static inline sc_line_t *ack_line(sc_comm_t *c, int r) { return (sc_line_t *)(c->base + c->off_ack) + r; }
static inline sc_rec_t *rec_of(sc_comm_t *c, int r, uint64_t n) {
    return (sc_rec_t *)(c->base + c->off_rec) + (int64_t)r * SC_PAST + (int64_t)(n % SC_PAST);
}
/* Inline slot s of writer r: a header line (sc_slot_t, then a tiny
 * payload's SC_SLOT_TINY bytes), alone on its SC_LINE bytes (a reader's
 * adjacent-line prefetch must not take the line the writer fills next),
 * and SC_INLINE bytes of payload, apart. */
typedef struct {
    _Atomic uint64_t call;        /* the call whose record follows (top bit flipped while rewritten); before the
                                     first call, the one before it */
    uint64_t rec[5];              /* sig, prev, hist */
} sc_slot_t;
_Static_assert(sizeof(sc_slot_t) + SC_SLOT_TINY == 64, "slot header line");
_Static_assert(SC_SLOT_BYTES >= SC_INLINE, "slot size");
static inline sc_slot_t *slot_head(sc_comm_t *c, int r, uint64_t s) {
    return (sc_slot_t *)(c->base + c->off_slot + ((int64_t)r * SC_SLOTS + (int64_t)(s % SC_SLOTS)) * SC_LINE);
}
static inline char *slot_tiny(sc_comm_t *c, int r, uint64_t s) { return (char *)(slot_head(c, r, s) + 1); }
static inline char *slot_data(sc_comm_t *c, int r, uint64_t s) {
    return c->base + c->off_slot_data + ((int64_t)r * SC_SLOTS + (int64_t)(s % SC_SLOTS)) * SC_SLOT_BYTES;
}
static inline sc_wq_t *queue_wq(sc_comm_t *c) { return (sc_wq_t *)(c->base + c->off_queue); }
static inline _Atomic uint64_t *queue_word(sc_comm_t *c, int q, int i) {
    return (_Atomic uint64_t *)(c->base + c->off_queue + SC_LINE) + (int64_t)q * c->size + i;
}
/* Shared single copies (SC_OP_SHARE): the word reader and writer claim
 * pieces of writer's move to reader from: the tag of the (call, step) it
 * counts in (48 bits of the call number, 4 of the step), then 6 bits of
 * pieces claimed by the writer, 6 by the reader. */
static inline _Atomic uint64_t *claim_word(sc_comm_t *c, int reader, int writer) {
    int64_t row = (c->size * 8 + SC_LINE - 1) / SC_LINE * SC_LINE;
    return (_Atomic uint64_t *)(c->base + c->off_claim + reader * row) + writer;
}
static inline uint64_t claim_tag(uint64_t call, int step) { return (call << 4 | (uint64_t)step) & ((1ULL << 52) - 1); }
static inline char *chan_buf(sc_comm_t *c, int r) { return c->base + c->off_chan + (int64_t)r * c->chan_bytes; }

/* What a wait waits for: a line reaching (call, event), or a packed queue
 * word reaching call (event unused). */
typedef struct {
    sc_line_t *line;
    _Atomic uint64_t *word;
    sc_wq_t *wq;
    uint64_t call, event;
    int who;
    int nocheck;                  /* the check round compares records itself */
    int anyabort;                 /* any abort fails it, whatever call it counts from (point-to-point is in none) */
    int64_t until;                /* nonzero: it returns SC_OK at this time (sc_now_ns) reached or not */
    int64_t spin_ns;
} sc_wait_t;

static inline int line_reached(sc_line_t *l, uint64_t call, uint64_t ev) {
    uint64_t lc = atomic_load_explicit(&l->call, memory_order_acquire);
    if (lc == call) return atomic_load_explicit(&l->event, memory_order_acquire) >= ev;
    return (int64_t)(lc - call) > 0;
}
/* A word (a queue's, a bell, an inline slot's stamp) at call or a few
 * past it.  Not a stamp being rewritten: an older call's with the top bit
 * flipped (exec.c stamp_open) is 2^63 minus a few past this call, which a
 * signed difference would call reached. */
static inline int word_reached(uint64_t word, uint64_t call) { return word - call < 1ULL << 62; }
static inline int reached(const sc_wait_t *w) {
    if (w->line) return line_reached(w->line, w->call, w->event);
    return word_reached(atomic_load_explicit(w->word, memory_order_acquire), w->call);
}

int sc_wait_slow(sc_comm_t *c, const sc_wait_t *w);
int sc_health(sc_comm_t *c, int who);

/* Wait for line l (written by who) to reach (call, ev). */
static inline int sc_wait_line(sc_comm_t *c, sc_line_t *l, int who, uint64_t call, uint64_t ev, int64_t spin,
                               int nocheck)
{
    if (line_reached(l, call, ev)) return SC_OK;
    sc_wait_t w = { .line = l, .wq = &l->wq, .call = call, .event = ev, .who = who, .nocheck = nocheck, .spin_ns = spin };
    return sc_wait_slow(c, &w);
}
void sc_wake(sc_wq_t *wq);
int sc_fail(sc_comm_t *c, int code, int32_t who, int64_t a, int64_t b);
int sc_check_line(sc_comm_t *c, int who);
int sc_check_rec(sc_comm_t *c, int who, uint64_t n, int *seen);
int sc_check_slot(sc_comm_t *c, int who, const sc_slot_t *h);
/* A call every rank refused (the check round) leaves its signature
 * marked refused as the previous call: any rank may have refused a
 * different one, so refused calls compare equal, and hash alike. */
#define REFUSED (1ULL << 63)

/* The hash of every call before the previous, h, with sig added. */
static inline uint64_t sc_mix(uint64_t h, const uint64_t *s)
{
    uint64_t a = s[1] & REFUSED ? 0 : s[0], b = s[1] & REFUSED ? REFUSED : s[1];
    h = (h ^ a) * 0x9e3779b97f4a7c15ULL;
    h = (h ^ (h >> 29) ^ b) * 0xbf58476d1ce4e5b9ULL;
    return h ^ (h >> 32);
}
int64_t sc_now_ns(void);       /* CLOCK_MONOTONIC */
int sc_exec_owned(sc_comm_t *c, const int64_t *prog, char *sbuf, char *rbuf);
int sc_exec_step(sc_comm_t *c, sc_nbc_t *st, int nb);
_Static_assert(sizeof(sc_wait_t) <= sizeof(((sc_nbc_t *)0)->wait), "a stopped call keeps its wait");

/* Twins (csrc/twins.c): which of a twin call's two programs runs, and
 * what carries the pick from rank 0 to the others.  exec.c, per call:
 *  - rank 0, every call: sc_twin_lead (twin NULL for any other call):
 *    learn the times of earlier twin calls every rank has ended, keep
 *    its records of picks until every rank has read them (may wait), and
 *    set *v to its pick for this twin call;
 *  - the other ranks, a twin call, after arriving: sc_twin_follow, rank
 *    0's pick (promised or in its record of the call; may wait);
 *  - every rank, before running program *v: sc_twin_ran (core.h);
 *  - every rank, after a twin call ran: sc_twin_done.
 * Calls with no twin on rank 0 cost the two tests inlined here. */
void sc_twin_collect(sc_comm_t *c);
int sc_twin_bound(sc_comm_t *c);
int sc_twin_choose(sc_comm_t *c, int64_t *twin);
int sc_twin_follow(sc_comm_t *c, int *v);
void sc_twin_done(sc_comm_t *c, int64_t *twin, int v, int64_t t0);
static inline int sc_twin_lead(sc_comm_t *c, int64_t *twin, int *v)
{
    if (c->pend_n) sc_twin_collect(c);
    int rc = c->twin_due && c->call - c->twin_first >= SC_PAST - 1 ? sc_twin_bound(c) : SC_OK;
    if (twin) *v = sc_twin_choose(c, twin);
    return rc;
}
int sc_vm_move(int32_t pid, char *local, uint64_t addr, int64_t n, _Atomic int32_t *shut, char *mapped, int nt);
void sc_shut(sc_comm_t *c, uint64_t also);   /* also: a point-to-point receive's buffer, else 0 */
void sc_stream(char *dst, const char *src, int64_t n);    /* streamed stores, unfenced */
void sc_fence(void);                                      /* orders them before later stores */

/* Every call and every slow wait looks here: once the job is aborted, a
 * rank that never waits (a root running ahead) still fails at its next
 * call.  An abort stamped with a call lets every call before it finish
 * (the aborting rank had finished them), so all ranks stop at the same
 * call. */
static inline int aborted_at(sc_comm_t *c, uint64_t call)
{
    uint32_t w = atomic_load_explicit(&hdr(c)->abort_word, memory_order_acquire);
    if (!w) return 0;
    int who = (int)(w & 0xffff) - 1;
    sc_rank_t *r = rank_rec(c, who);
    if (who >= 0 && who < c->size && r->abort_at && (int64_t)(call - r->abort_call) < 0) return 0;
    c->err_rank = who;
    c->err_a = c->err_code = (int32_t)(w >> 16);
    return SC_EABORT;
}
static inline int aborted(sc_comm_t *c) { return aborted_at(c, c->call); }
void sc_abort_call(sc_comm_t *c, int32_t code, uint64_t call);
void sc_abort_mismatch(sc_comm_t *c);
void sc_out_of_step(sc_comm_t *c, int who);

static inline int wait_for(sc_comm_t *c, const sc_wait_t *w) {
    return reached(w) ? SC_OK : sc_wait_slow(c, w);
}

/* Publish: the release store orders every earlier write (payload, copies)
 * and read (an ack frees what was read) before the flag; the fence orders
 * the flag before reading the sleeper count, pairing with the waiter's
 * increment-then-recheck (no lost wake-up). */
static inline void wake_sleepers(sc_wq_t *wq) {
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&wq->sleepers, memory_order_relaxed)) sc_wake(wq);
}
/* The arrival record goes out without a fence (its wake-up check is owed,
 * c->owe): the store completes while this rank goes on to wait or copy.
 * The check is paid at the next fence (a post, an ack), before a wait
 * goes slow, and before the call returns, so a sleeper is never left
 * asleep while this rank waits or leaves. */
static inline void owed_after_fence(sc_comm_t *c, sc_line_t *mine) {
    if (c->owe) {
        c->owe = 0;
        if (atomic_load_explicit(&mine->wq.sleepers, memory_order_relaxed)) sc_wake(&mine->wq);
    }
}
static inline void settle(sc_comm_t *c, sc_line_t *mine) {
    if (c->owe) {
        atomic_thread_fence(memory_order_seq_cst);
        owed_after_fence(c, mine);
    }
}
static inline void post_event(sc_line_t *l, uint64_t ev) {
    atomic_store_explicit(&l->event, ev, memory_order_release);
    wake_sleepers(&l->wq);
}
/* An ack line is written lazily: its first ack of a call moves the call
 * word after the event, so no waiter pairs the new count with the old call. */
static inline void ack_event(sc_line_t *l, uint64_t call, uint64_t ev) {
    if (atomic_load_explicit(&l->call, memory_order_relaxed) != call) {
        atomic_store_explicit(&l->event, ev, memory_order_relaxed);
        atomic_store_explicit(&l->call, call, memory_order_release);
    } else {
        atomic_store_explicit(&l->event, ev, memory_order_release);
    }
    wake_sleepers(&l->wq);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif
