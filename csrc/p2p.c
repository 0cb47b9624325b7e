/* Point-to-point in the device layer (docs/p2p.md).
 *
 * Shared (the communicator's segment, sc_layout): per rank a doorbell
 * line, bumped by whoever makes progress possible for that rank (a
 * message sent to it, space freed or a rendezvous completed in a ring it
 * writes); per ordered pair (s -> r) a single-producer single-consumer
 * ring of p2p_ring_bytes, whose records the receiver finds by the lap
 * stamped in each (record), its want line (written by s: it waits for
 * room), tail line (written by r: tail, rendezvous completions) and share
 * line (copy_rdv).  Every blocking wait is a wait on this rank's doorbell
 * through the engine's wait (core.c sc_wait_slow: spin, yield, futex
 * sleep, liveness, stall timeout, signal polls), but for a receive from
 * one rank, which first spins on that ring (recv).
 *
 * A message is a header then, eager, its payload inline; a rendezvous
 * header carries the sender's buffer address and the receiver copies once
 * from it (process_vm_readv), then stamps the sender's completion slot.
 * A long one is shared: the receiver offers its buffer in the pair's
 * share line and the sender, while it waits, writes pieces of it from
 * the back (process_vm_writev) as the receiver reads from the front.
 * Matching takes the receiver's unexpected queue first, then each
 * source's ring in order, moving a message that does not match into the
 * queue (private, bounded by p2p_queue_bytes; beyond it the ring is left
 * as it is and its sender waits): per-pair FIFO gives MPI's
 * non-overtaking order per (source, tag).
 *
 * Private state is shared by the rank's threads under one mutex, never
 * held across a wait; each thread waits through a context of its own (a
 * copy of the communicator's: its own hooks and error fields). */
#include <Python.h>
#include "sc_internal.h"
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#define HDR 32
#define PAD 3
#define EAGER 1
#define RNDV 2
#define STAGED 5                  /* a rendezvous whose sender streams it through the ring (no single copies: cma 0) */
#define DATA 6                    /* a piece of a staged message: its sequence number, its offset in addr */
#define CTS (1ULL << 62)          /* a completion slot's mark: the staged message is matched, send its pieces */
#define STAGING 2                 /* a receive matched a staged message whose pieces are still to come */
#define NDONE 15                  /* outstanding rendezvous per pair, one completion slot each (the tail line holds them) */
#define NSHADOW 64
#define LONG_COPY (64 << 10)      /* a rendezvous copy this long lets the GIL go, as a long wait does */
#define SHARE_MIN (32 << 10)      /* a rendezvous this long is copied by both ends (share) */
#define PIECE_MIN (16 << 10)      /* a shared copy's pieces: an eighth of it within these bounds, */
#define PIECE_MAX (512 << 10)     /* whole pages, at most 4095 of them (the claim word's fields) */
#define DEFER 3                   /* deliver: a rendezvous to copy once the lock is let go (rdv_t) */
#define PIPE (4 << 10)            /* an eager message of two of these or more goes in (and out) piece by piece */

typedef struct { int32_t tag, kind; int64_t n; uint64_t seq, addr; } msg_t;
_Static_assert(sizeof(msg_t) == HDR, "message header");
typedef struct { _Atomic uint64_t bell; sc_wq_t wq; _Atomic uint64_t help; char pad[SC_LINE - 24]; } bell_t;
typedef struct { _Atomic uint32_t want; char pad[SC_LINE - 4]; } head_t;    /* the sender's: it waits for room */
typedef struct { _Atomic uint64_t tail; _Atomic uint64_t done[NDONE]; char pad[SC_LINE - 8 * (NDONE + 1)]; } tail_t;
/* A pair's shared copy, written by the receiver: the claim word (tag 28
 * bits, pieces 12, taken from the back 12, from the front 12), pieces
 * finished, where the receiver's buffer and the sender's are, bytes, piece. */
typedef struct { _Atomic uint64_t claim, fin, raddr, saddr, n, piece; char pad[SC_LINE - 48]; } share_t;
_Static_assert(sizeof(bell_t) == SC_LINE && sizeof(head_t) == SC_LINE && sizeof(tail_t) == SC_LINE
               && sizeof(share_t) == SC_LINE, "p2p lines");

/* A rendezvous matched under the lock, copied after it (deliver, copy_rdv). */
typedef struct { int s; uint64_t seq, addr; int64_t n; int share; } rdv_t;

/* A staged message: the sender's, streaming; the receiver's, filling. */
typedef struct { const char *buf; int64_t n, off; uint64_t seq; } out_t;
typedef struct { char *buf; int64_t cap, n, got; uint64_t seq; int32_t src, tag, state; } in_t;  /* 1 filling, 2 full */

/* A message taken out of its ring: unexpected, or matched by Mprobe. */
typedef struct um {
    struct um *next;
    int32_t src, tag, kind;
    int64_t n;
    uint64_t seq, addr;
    char data[];
} um_t;

struct sc_p2p {
    pthread_mutex_t mu;
    uint64_t id;
    sc_comm_t *main;              /* the communicator's own context */
    uint64_t *hd, *rseq, *tl;     /* per peer: our head in its ring, our rendezvous count to it, our tail in its ring, */
    uint64_t *seen;               /* and its tail in our ring when we last read it (room) */
    int start;                    /* ANY_SOURCE scans from here, rotating */
    um_t *q, **qend;
    int64_t qbytes;
    out_t *outs;                  /* per destination, NDONE each: staged messages being sent */
    in_t *ins;                    /* per source, NDONE each: staged messages being received */
    int nout, nin;
    int nshadow;
    uint64_t help_seen;           /* the doorbell's help count when this rank last looked for shares to help */
    _Atomic int64_t helped;       /* bytes it wrote for them */
    char *sharing;                /* per source: a shared copy from it is under way (its share line is taken) */
    struct { pthread_t t; sc_comm_t *c; } shadow[NSHADOW];
};

int64_t sc_p2p_lines(int64_t p) { return p * SC_LINE + 3 * p * p * SC_LINE; }
static bell_t *bell_of(sc_comm_t *c, int r) { return (bell_t *)(c->base + c->off_p2p) + r; }
static head_t *head_of(sc_comm_t *c, int s, int r) {
    return (head_t *)(c->base + c->off_p2p + c->size * SC_LINE + (int64_t)(s * c->size + r) * 2 * SC_LINE);
}
static tail_t *tail_of(sc_comm_t *c, int s, int r) { return (tail_t *)(head_of(c, s, r) + 1); }
static share_t *share_of(sc_comm_t *c, int s, int r)
{
    return (share_t *)(c->base + c->off_p2p + c->size * SC_LINE + 2 * (int64_t)c->size * c->size * SC_LINE)
           + (int64_t)s * c->size + r;
}
static char *ring_of(sc_comm_t *c, int s, int r) {
    return c->base + c->off_p2p_ring + (int64_t)(s * c->size + r) * c->p2p_ring_bytes;
}
static int64_t rec_bytes(int64_t payload) { return HDR + (payload + HDR - 1) / HDR * HDR; }

static void ring_bell(sc_comm_t *c, int r)
{
    bell_t *b = bell_of(c, r);
    atomic_fetch_add_explicit(&b->bell, 1, memory_order_release);
    wake_sleepers(&b->wq);
}

int sc_p2p_init(sc_comm_t *c)
{
    static _Atomic uint64_t ids;
    int p = c->size;
    sc_p2p_t *s = calloc(1, sizeof *s);
    if (!s || !(s->hd = calloc(4 * (size_t)p, sizeof(uint64_t)))) {
        free(s);
        return SC_ENOMEM;
    }
    s->rseq = s->hd + p;
    s->tl = s->rseq + p;
    s->seen = s->tl + p;
    s->outs = calloc((size_t)p * NDONE, sizeof(out_t));
    s->ins = calloc((size_t)p * NDONE, sizeof(in_t));
    s->sharing = calloc((size_t)p, 1);
    if (!s->outs || !s->ins || !s->sharing) {
        free(s->outs), free(s->ins), free(s->sharing), free(s->hd), free(s);
        return SC_ENOMEM;
    }
    s->qend = &s->q;
    s->id = atomic_fetch_add(&ids, 1) + 1;
    pthread_mutex_init(&s->mu, NULL);
    s->main = c;
    c->p2p = s;
    return SC_OK;
}

void sc_p2p_free(sc_comm_t *c)
{
    sc_p2p_t *s = c->p2p;
    if (!s) return;
    c->p2p = NULL;
    for (um_t *u = s->q, *next; u; u = next) next = u->next, free(u);
    for (int i = 0; i < s->nshadow; i++) {
        sc_peers_close(s->shadow[i].c);      /* its own map of the peers' arenas */
        free(s->shadow[i].c);
    }
    free(s->hd), free(s->outs), free(s->ins), free(s->sharing);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* This thread's context over c (made on its first call). */
static sc_comm_t *mine(sc_comm_t *c)
{
    static __thread sc_comm_t *last_c, *last_sh;
    static __thread uint64_t last_id;
    sc_p2p_t *s = c->p2p;
    if (last_c == c && last_id == s->id) return last_sh;
    pthread_t me = pthread_self();
    sc_comm_t *sh = NULL;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->nshadow && !sh; i++)
        if (pthread_equal(s->shadow[i].t, me)) sh = s->shadow[i].c;
    if (!sh && s->nshadow < NSHADOW && (sh = malloc(sizeof *sh))) {
        memcpy(sh, c, sizeof *sh);
        memset(&sh->hooks, 0, sizeof sh->hooks);
        sh->gil_ns = 0, sh->busy = 0, sh->owe = 0, sh->peers = NULL, sh->traffic = NULL, sh->last = NULL;
        s->shadow[s->nshadow].t = me;
        s->shadow[s->nshadow++].c = sh;
    }
    pthread_mutex_unlock(&s->mu);
    if (!sh) return c;           /* more threads than shadows: they share the communicator's (no Ctrl-C polls) */
    last_c = c, last_sh = sh, last_id = s->id;
    return sh;
}

int64_t sc_p2p_helped(sc_comm_t *c) { return c->p2p ? atomic_load(&c->p2p->helped) : 0; }

uint64_t sc_p2p_bell(sc_comm_t *c) { return atomic_load_explicit(&bell_of(c, c->rank)->bell, memory_order_acquire); }

static int push(sc_comm_t *c);
static int drain(sc_comm_t *c);
static int help(sc_comm_t *sh);

/* Wait until this rank's doorbell has moved past seen (who: the rank
 * awaited, -1 any: only its clean exit is an error for us); for at most
 * for_ns if nonzero (a caller that must also advance other engines'
 * work), checking peers at once when it last did a liveness period ago.
 * check: a routed collective's wait, which compares who's arrival record
 * with its call's, as a schedule's waits do (routed). */
static int idle_for(sc_comm_t *sh, uint64_t seen, int who, int64_t for_ns, int check)
{
    static __thread int64_t checked;
    sc_p2p_t *p = sh->p2p;
    if (help(sh)) return SC_OK;
    if (p->nout || p->nin) {             /* staged messages move on whoever waits (cma 0) */
        pthread_mutex_lock(&p->mu);
        int moved = push(sh) | drain(sh);
        pthread_mutex_unlock(&p->mu);
        if (moved) return SC_OK;         /* the caller looks again before it waits */
    }
    bell_t *b = bell_of(sh, sh->rank);
    sc_wait_t w = { .word = &b->bell, .wq = &b->wq, .call = seen + 1, .who = who, .nocheck = !check || who < 0,
                    .spin_ns = sh->spin_ns, .anyabort = 1 };
    if (aborted_at(sh, sh->call + (1ULL << 62))) return SC_EABORT;
    if (for_ns) {
        int64_t t = sc_now_ns();
        if (t - checked >= sh->liveness_ns) {
            checked = t;
            int rc = sc_health(sh, who);
            if (rc) return rc;
        }
        w.until = t + for_ns;
    }
    return wait_for(sh, &w);
}

int sc_p2p_idle(sc_comm_t *sh, uint64_t seen, int who) { return idle_for(sh, seen, who, 0, 0); }

/* -- sending ------------------------------------------------------------------ */

/* Room for a record of `need` bytes at our head in the ring to r, and
 * the header after it (record), after a pad to its start if they would
 * wrap; on no room, ask r to ring our bell when it frees some.  need is
 * at most half the ring less a header (device.py checks the eager
 * limit), so pad and record fit once the ring has drained. */
static int room(sc_comm_t *c, int r, int64_t need, int64_t *pad)
{
    sc_p2p_t *s = c->p2p;
    need += HDR;
    int64_t R = c->p2p_ring_bytes, off = (int64_t)(s->hd[r] % (uint64_t)R);
    *pad = off + need > R ? R - off : 0;
    if ((int64_t)(s->hd[r] + *pad + need - s->seen[r]) <= R) return 1;   /* the tail line stays the receiver's */
    head_t *h = head_of(c, c->rank, r);
    tail_t *t = tail_of(c, c->rank, r);
    for (int tries = 0; tries < 2; tries++) {
        uint64_t tail = s->seen[r] = atomic_load_explicit(&t->tail, memory_order_acquire);
        if ((int64_t)(s->hd[r] + *pad + need - tail) <= R) {
            if (atomic_load_explicit(&h->want, memory_order_relaxed))
                atomic_store_explicit(&h->want, 0, memory_order_relaxed);
            return 1;
        }
        atomic_store_explicit(&h->want, 1, memory_order_relaxed);
        atomic_thread_fence(memory_order_seq_cst);     /* pairs with the receiver's tail store, then want load */
    }
    return 0;
}

/* A record's kind word carries, above the kind's 8 bits, the lap of the
 * ring on which it starts at pos (1 on the first): the receiver finds the
 * next record by its stamp, with no head line to read first.  What lies
 * where the next record will start may be an older record's payload,
 * whose bytes could read as that stamp; so the writer clears that kind
 * word before it stamps a record (room keeps one header past each record
 * free for it): a reader that sees a stamp then finds, where that record
 * ends, either nothing or the next record. */
static uint32_t lap(uint64_t pos, uint64_t R) { return (uint32_t)((pos / R) % 0xffffff + 1) << 8; }
static _Atomic int32_t *kind_word(char *at) { return (_Atomic int32_t *)(at + offsetof(msg_t, kind)); }

/* An eager record's payload bytes written so far (its header's addr):
 * a long one is stamped first and written PIPE bytes at a time, so that
 * a receiver already waiting copies each piece out while the next goes
 * in (the two copies overlap, where they followed one another). */
static _Atomic uint64_t *ready_word(const char *at) { return (_Atomic uint64_t *)(at + offsetof(msg_t, addr)); }

/* Write a record of len bytes at pos: payload, header, the next one's
 * kind word cleared, then its stamped kind (release: a reader that sees
 * the stamp sees the rest); a long eager one's payload after its stamp,
 * counted in its ready word (an eager header's addr holds n otherwise). */
static void record(char *ring, uint64_t R, uint64_t pos, int64_t len, const msg_t *m, const char *buf, int64_t n)
{
    char *at = ring + pos % R;
    int piped = m->kind == EAGER && n >= 2 * PIPE;
    if (n && !piped) memcpy(at + HDR, buf, (size_t)n);
    atomic_store_explicit(kind_word(ring + (pos + (uint64_t)len) % R), 0, memory_order_relaxed);
    memcpy(at, &m->tag, sizeof m->tag);
    memcpy(at + offsetof(msg_t, n), &m->n, HDR - offsetof(msg_t, n));
    if (piped) atomic_store_explicit(ready_word(at), 0, memory_order_relaxed);
    atomic_store_explicit(kind_word(at), (int32_t)(lap(pos, R) | (uint32_t)m->kind), memory_order_release);
    for (int64_t off = 0, k; piped && off < n; off += k) {
        k = n - off < PIPE ? n - off : PIPE;
        memcpy(at + HDR + off, buf + off, (size_t)k);
        atomic_store_explicit(ready_word(at), (uint64_t)(off + k), memory_order_release);
    }
}

/* Wait, holding the lock, for s to have written want bytes of the eager
 * record at `at` (it writes them now: a bare spin, yielding after a
 * while, with no way up to Python); an error if s died meanwhile. */
static int written(sc_comm_t *c, int s, const char *at, uint64_t want)
{
    int64_t t0 = 0;
    for (int i = 0; atomic_load_explicit(ready_word(at), memory_order_acquire) < want; i++) {
        if (i < 1024) {
            cpu_relax();
            continue;
        }
        sched_yield();
        int64_t t = sc_now_ns();
        if (!t0) t0 = t;
        if (t - t0 >= c->liveness_ns) {
            int rc = sc_health(c, s);
            if (rc) return rc;
            t0 = t;
        }
    }
    return SC_OK;
}

static void put(sc_comm_t *c, int r, int64_t pad, const msg_t *m, const char *buf, int64_t n)
{
    sc_p2p_t *s = c->p2p;
    uint64_t R = (uint64_t)c->p2p_ring_bytes;
    char *ring = ring_of(c, c->rank, r);
    if (pad) {
        msg_t p = { .kind = PAD, .n = pad };
        record(ring, R, s->hd[r], pad, &p, NULL, 0);
        s->hd[r] += (uint64_t)pad;
    }
    record(ring, R, s->hd[r], rec_bytes(n), m, buf, n);
    s->hd[r] += (uint64_t)rec_bytes(n);
    ring_bell(c, r);
}

static int slot_free(sc_comm_t *c, int r, uint64_t seq)
{
    uint64_t prev = seq > NDONE ? seq - NDONE : 0;
    return atomic_load_explicit(&tail_of(c, c->rank, r)->done[seq % NDONE], memory_order_acquire) == prev;
}

/* One try: SC_OK sent and complete (eager), a positive sequence number
 * (a rendezvous to wait for with sc_p2p_sent), SC_EAGAIN no room now. */
static int64_t try_send(sc_comm_t *c, int r, int tag, const char *buf, int64_t n, int sync)
{
    sc_p2p_t *s = c->p2p;
    int64_t pad, rc = SC_EAGAIN;
    pthread_mutex_lock(&s->mu);
    if (!sync && n <= c->p2p_eager_bytes) {
        if (room(c, r, rec_bytes(n), &pad)) {
            msg_t m = { .tag = tag, .kind = EAGER, .n = n, .addr = (uint64_t)n };
            put(c, r, pad, &m, buf, n);
            rc = SC_OK;
        }
    } else if (slot_free(c, r, s->rseq[r] + 1) && room(c, r, HDR, &pad)) {
        int staged = !s->main->cma && r != c->rank;
        msg_t m = { .tag = tag, .kind = staged ? STAGED : RNDV, .n = n, .seq = ++s->rseq[r], .addr = (uintptr_t)buf };
        if (staged) {
            s->outs[r * NDONE + m.seq % NDONE] = (out_t){ buf, n, 0, m.seq };
            s->nout++;
        }
        put(c, r, pad, &m, NULL, 0);
        rc = (int64_t)m.seq;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Is rendezvous seq to r complete?  Its slot holds the one before it
 * (seq - NDONE), seq | CTS while staged, then seq, and later ones (sent
 * only once this completed, maybe by another thread before this one
 * looked). */
static int done(sc_comm_t *c, int r, uint64_t seq)
{
    uint64_t v = atomic_load_explicit(&tail_of(c, c->rank, r)->done[seq % NDONE], memory_order_acquire);
    return v == seq || (int64_t)((v & ~CTS) - seq) > 0;
}

/* Stream the staged messages whose receivers have matched them, as far
 * as the rings have room (under the lock).  1 if anything moved. */
static int push(sc_comm_t *c)
{
    sc_p2p_t *p = c->p2p;
    int64_t chunk = c->p2p_ring_bytes / 2 - 2 * HDR, pad;     /* a record of half the ring at most (room) */
    int moved = 0;
    for (int i = 0; p->nout && i < c->size * NDONE; i++) {
        out_t *o = &p->outs[i];
        int r = i / NDONE;
        if (!o->seq || atomic_load_explicit(&tail_of(c, c->rank, r)->done[o->seq % NDONE], memory_order_acquire)
                       != (o->seq | CTS))
            continue;
        while (o->off < o->n) {
            int64_t k = o->n - o->off < chunk ? o->n - o->off : chunk;
            if (!room(c, r, rec_bytes(k), &pad)) break;
            msg_t m = { .kind = DATA, .n = k, .seq = o->seq, .addr = (uint64_t)o->off };
            put(c, r, pad, &m, o->buf + o->off, k);
            o->off += k;
            moved = 1;
        }
        if (o->off == o->n) {
            o->seq = 0;
            p->nout--;
            moved = 1;
        }
    }
    return moved;
}

int sc_p2p_sent(sc_comm_t *c, int r, uint64_t seq, int block)
{
    sc_comm_t *sh = mine(c);
    for (;;) {
        uint64_t seen = sc_p2p_bell(c);
        if (done(c, r, seq)) return 1;
        if (!block) {
            if (help(sh)) continue;
            if (c->p2p->nout) {
                pthread_mutex_lock(&c->p2p->mu);
                push(c);
                pthread_mutex_unlock(&c->p2p->mu);
            }
            return done(c, r, seq);
        }
        int rc = sc_p2p_idle(sh, seen, r);
        if (rc) return rc;
    }
}

/* Send n bytes at buf to r.  block: wait for room and for a rendezvous'
 * copy; else as try_send.  sync: a rendezvous whatever n (Ssend). */
int64_t sc_p2p_send(sc_comm_t *c, int r, int tag, const char *buf, int64_t n, int block, int sync)
{
    sc_comm_t *sh = mine(c);
    for (;;) {
        uint64_t seen = sc_p2p_bell(c);
        int64_t rc = try_send(c, r, tag, buf, n, sync);
        if (rc != SC_EAGAIN || !block) {
            if (rc <= 0 || !block) return rc;
            int w = sc_p2p_sent(c, r, (uint64_t)rc, 1);
            return w < 0 ? w : SC_OK;
        }
        int w = sc_p2p_idle(sh, seen, r);
        if (w) return w;
    }
}

/* -- shared copies of long rendezvous ------------------------------------------
 * The receiver claims pieces from the front of the claim word, the
 * sender from the back, so each copies what the other has not reached;
 * both count finished pieces in fin, and the receiver stamps the
 * rendezvous complete only once fin has them all (the sender may be
 * writing one into its buffer till then).  A sender busy elsewhere
 * leaves the receiver all of it. */

/* The next piece on claim word w: from the front, or (back) the back;
 * -1 when none is left.  tag: the share's, or 0 for whatever share w holds. */
static int64_t claim_piece(_Atomic uint64_t *w, uint64_t tag, int back)
{
    uint64_t v = atomic_load_explicit(w, memory_order_acquire);
    for (;;) {
        uint64_t k = v >> 24 & 0xfff, b = v >> 12 & 0xfff, f = v & 0xfff;
        if (!(v >> 36) || (tag && v >> 36 != tag) || f + b >= k) return -1;
        uint64_t next = back ? v + (1 << 12) : v + 1;
        if (atomic_compare_exchange_weak_explicit(w, &v, next, memory_order_acquire, memory_order_acquire))
            return back ? (int64_t)(k - 1 - b) : (int64_t)f;
    }
}

/* Let the GIL go before a long copy, as a long wait does (arm's hooks; never the communicator's own context). */
static void long_copy(sc_comm_t *sh, int64_t n)
{
    if (n >= LONG_COPY && sh != sh->p2p->main && sh->hooks.release && !sh->hooks.saved)
        sh->hooks.saved = sh->hooks.release();
}

/* Write the pieces this rank can take of the shares its receivers
 * offered (their shutters looked at before each, as a collective's
 * pushes do: sc_shut).  1 if it copied any. */
static int help(sc_comm_t *sh)
{
    sc_p2p_t *p = sh->p2p;
    uint64_t asked = atomic_load_explicit(&bell_of(sh, sh->rank)->help, memory_order_acquire);
    if (asked == p->help_seen) return 0;
    p->help_seen = asked;
    int copied = 0;
    _Atomic int32_t *mine = &rank_rec(sh, sh->rank)->pushing;
    for (int r = 0; r < sh->size; r++) {
        share_t *x = share_of(sh, sh->rank, r);
        int64_t i;
        while (r != sh->rank && (i = claim_piece(&x->claim, 0, 1)) >= 0) {
            int64_t q = (int64_t)x->piece, n = (int64_t)x->n, off = i * q, len = n - off < q ? n - off : q;
            uint64_t at = x->raddr + (uint64_t)off;
            long_copy(sh, len);
            atomic_store_explicit(mine, r + 1, memory_order_seq_cst);
            int err = sc_vm_move(rank_rec(sh, r)->pid, (char *)(uintptr_t)(x->saddr + (uint64_t)off), at, len,
                                 &rank_rec(sh, r)->shut, sc_peer_ptr(sh, r, at, len), 0);
            atomic_store_explicit(mine, 0, memory_order_release);
            if (err) break;               /* r failed (it shut its door) or is gone: its wait says so */
            copied = 1;
            atomic_fetch_add_explicit(&p->helped, len, memory_order_relaxed);
            uint64_t k = atomic_load_explicit(&x->claim, memory_order_relaxed) >> 24 & 0xfff;
            if (atomic_fetch_add_explicit(&x->fin, 1, memory_order_acq_rel) + 1 == k) ring_bell(sh, r);
        }
    }
    return copied;
}

/* Copy rendezvous d into buf (k bytes of it), shared with its sender if
 * d->share, then stamp it complete: SC_OK or an error. */
static int copy_rdv(sc_comm_t *sh, const rdv_t *d, char *buf, int64_t k)
{
    int s = d->s, err = 0, rc = SC_OK;
    int32_t pid = rank_rec(sh, s)->pid;
    long_copy(sh, k);
    if (!d->share) {
        err = sc_vm_move(pid, buf, d->addr, k, NULL, sc_peer_ptr(sh, s, d->addr, k), 0);
    } else {
        share_t *x = share_of(sh, s, sh->rank);
        int64_t q = (k / 8 + 4095) & ~(int64_t)4095, i;
        q = q < PIECE_MIN ? PIECE_MIN : q > PIECE_MAX ? PIECE_MAX : q;
        if ((k + q - 1) / q > 4095) q = ((k + 4094) / 4095 + 4095) & ~(int64_t)4095;
        uint64_t pieces = (uint64_t)((k + q - 1) / q), tag = d->seq % ((1 << 28) - 1) + 1;
        atomic_store_explicit(&x->fin, 0, memory_order_relaxed);
        atomic_store_explicit(&x->raddr, (uintptr_t)buf, memory_order_relaxed);
        atomic_store_explicit(&x->saddr, d->addr, memory_order_relaxed);
        atomic_store_explicit(&x->n, (uint64_t)k, memory_order_relaxed);
        atomic_store_explicit(&x->piece, (uint64_t)q, memory_order_relaxed);
        atomic_store_explicit(&x->claim, tag << 36 | pieces << 24, memory_order_release);
        atomic_fetch_add_explicit(&bell_of(sh, s)->help, 1, memory_order_release);
        ring_bell(sh, s);
        if (sh->side_n) {
            memmove(sh->side_dst, sh->side_src, (size_t)sh->side_n);
            sh->side_n = 0;
        }
        while (!err && (i = claim_piece(&x->claim, tag, 0)) >= 0) {
            int64_t off = i * q, len = k - off < q ? k - off : q;
            err = sc_vm_move(pid, buf + off, d->addr + (uint64_t)off, len, NULL, sc_peer_ptr(sh, s, d->addr + off, len), 0);
            if (!err) atomic_fetch_add_explicit(&x->fin, 1, memory_order_acq_rel);
        }
        if (err) {  /* no more claims; the sender's piece in flight lands before we return, none after */
            atomic_store_explicit(&x->claim, tag << 36 | pieces << 24 | 0xfffULL << 12 | 0xfff, memory_order_release);
            sc_shut(sh, (uintptr_t)buf);
        }
        for (;;) {
            uint64_t seen = sc_p2p_bell(sh);
            if (err || atomic_load_explicit(&x->fin, memory_order_acquire) >= pieces) break;
            if ((rc = idle_for(sh, seen, s, 0, 0))) {
                sc_shut(sh, (uintptr_t)buf);
                break;
            }
        }
        pthread_mutex_lock(&sh->p2p->mu);
        sh->p2p->sharing[s] = 0;
        pthread_mutex_unlock(&sh->p2p->mu);
        if (rc) return rc;
    }
    if (err) return sc_fail(sh, SC_ECMA, s, 0, err);
    atomic_store_explicit(&tail_of(sh, s, sh->rank)->done[d->seq % NDONE], d->seq, memory_order_release);
    ring_bell(sh, s);
    return d->n > k ? SC_ETRUNCATE : SC_OK;
}

/* -- receiving ---------------------------------------------------------------- */

/* ANY_TAG (-1) matches the user's tags, never a collective's own (below -1: coll_tag). */
static int matches(int src, int tag, int s, int t) { return (src < 0 || src == s) && (tag == -1 ? t >= 0 : tag == t); }

/* Receives posted before this one and not yet matched, as (source, tag)
 * pairs: a message one of them matches is theirs (MPI matches a message
 * to the first posted receive it fits), whatever arrived since they looked. */
typedef struct { const int32_t *p; int n; } ahead_t;
static int taken(const ahead_t *a, int s, int t)
{
    for (int i = 0; a && i < a->n; i++)
        if (matches(a->p[2 * i], a->p[2 * i + 1], s, t)) return 1;
    return 0;
}

/* The receiver's tail in s's ring moved: publish it, and ring s's bell if it waits for room. */
static void freed(sc_comm_t *c, int s)
{
    atomic_store_explicit(&tail_of(c, s, c->rank)->tail, c->p2p->tl[s], memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&head_of(c, s, c->rank)->want, memory_order_relaxed)) ring_bell(c, s);
}

/* A staged receive has all its pieces; its sender's rendezvous completes
 * when the receive is finished (finish): till then the sender sends no
 * later staged message that would take its place. */
static void full(sc_comm_t *c, in_t *e)
{
    e->state = 2;
    c->p2p->nin--;
}

/* A piece of a staged message into its receive's buffer (what passes its end is dropped: a truncation). */
static void fill(sc_comm_t *c, int s, const msg_t *m, const char *data)
{
    in_t *e = &c->p2p->ins[s * NDONE + m->seq % NDONE];
    int64_t at = (int64_t)m->addr, k = at >= e->cap ? 0 : e->cap - at < m->n ? e->cap - at : m->n;
    if (k) memcpy(e->buf + at, data, (size_t)k);
    if ((e->got += m->n) == e->n) full(c, e);
}

/* The next message in s's ring past pads (its header in *m, where its
 * payload is in *data), or 0 if the ring is empty. */
static int peek(sc_comm_t *c, int s, msg_t *m, char **data)
{
    sc_p2p_t *p = c->p2p;
    uint64_t R = (uint64_t)c->p2p_ring_bytes;
    char *ring = ring_of(c, s, c->rank);
    for (;;) {
        char *at = ring + p->tl[s] % R;
        uint32_t k = (uint32_t)atomic_load_explicit(kind_word(at), memory_order_acquire);
        if ((k & ~0xffu) != lap(p->tl[s], R)) return 0;
        memcpy(m, at, HDR);
        m->kind = (int32_t)(k & 0xff);
        if (m->kind == DATA) {               /* never matched: it goes where its staged receive said */
            fill(c, s, m, ring + p->tl[s] % R + HDR);
            p->tl[s] += (uint64_t)rec_bytes(m->n);
            freed(c, s);
            continue;
        }
        if (m->kind != PAD) {
            *data = ring + p->tl[s] % R + HDR;
            return 1;
        }
        p->tl[s] += (uint64_t)m->n;
    }
}

/* Take s's front message out of its ring into a queue entry (NULL: no memory). */
static um_t *lift(sc_comm_t *c, int s, const msg_t *m, const char *data)
{
    int64_t n = m->kind == EAGER ? m->n : 0;
    if (n && written(c, s, data - HDR, (uint64_t)n)) return NULL;    /* its sender died: the waits say so */
    um_t *u = malloc(sizeof *u + (size_t)n);
    if (!u) return NULL;
    *u = (um_t){ .src = s, .tag = m->tag, .kind = m->kind, .n = m->n, .seq = m->seq, .addr = m->addr };
    memcpy(u->data, data, (size_t)n);
    c->p2p->tl[s] += (uint64_t)rec_bytes(n);
    freed(c, s);
    return u;
}

/* s's front message into the unexpected queue: 0 if it is full (the ring waits) or memory is short. */
static int enqueue(sc_comm_t *c, int s, const msg_t *m, const char *data)
{
    sc_p2p_t *p = c->p2p;
    int64_t size = (m->kind == EAGER ? m->n : 0) + (int64_t)sizeof(um_t);
    um_t *u = p->qbytes + size > c->p2p_queue_bytes ? NULL : lift(c, s, m, data);
    if (!u) return 0;
    p->qbytes += size;
    *p->qend = u;
    p->qend = &u->next;
    return 1;
}

/* Take in the pieces of the staged messages this rank receives, reading
 * their rings past what comes before them (into the unexpected queue).
 * Under the lock; 1 if anything moved. */
static int drain(sc_comm_t *c)
{
    sc_p2p_t *p = c->p2p;
    int moved = 0;
    for (int s = 0; p->nin && s < c->size; s++) {
        int filling = 0;
        for (int j = 0; j < NDONE && !filling; j++) filling = p->ins[s * NDONE + j].state == 1;
        if (!filling) continue;
        uint64_t before = p->tl[s];
        msg_t m;
        char *data;
        while (peek(c, s, &m, &data) && enqueue(c, s, &m, data))
            ;
        moved |= p->tl[s] != before;
    }
    return moved;
}

/* What matches (src, tag) first and no receive ahead: a queue entry
 * (*prev its link), else a ring's front message (its source returned,
 * header in *m), moving what it does not take into the queue.  -1:
 * nothing yet. */
static int find(sc_comm_t *c, int src, int tag, const ahead_t *ahead, um_t ***prev, msg_t *m, char **data)
{
    sc_p2p_t *p = c->p2p;
    *prev = NULL;
    for (um_t **u = &p->q; *u; u = &(*u)->next)
        if (matches(src, tag, (*u)->src, (*u)->tag) && !taken(ahead, (*u)->src, (*u)->tag)) {
            *prev = u;
            return (*u)->src;
        }
    int n = src < 0 ? c->size : 1;
    for (int i = 0; i < n; i++) {
        int s = src < 0 ? (p->start + i) % c->size : src;
        while (peek(c, s, m, data)) {
            if (matches(src, tag, s, m->tag) && !taken(ahead, s, m->tag)) {
                if (src < 0) p->start = (s + 1) % c->size;
                return s;
            }
            if (!enqueue(c, s, m, *data)) break;
        }
    }
    return -1;
}

static void unlink_entry(sc_p2p_t *p, um_t **prev)
{
    um_t *u = *prev;
    *prev = u->next;
    if (p->qend == &u->next) p->qend = prev;
    p->qbytes -= (u->kind == EAGER ? u->n : 0) + (int64_t)sizeof(um_t);
}

/* Deliver message (source s, header m, eager payload at data) into buf of
 * cap bytes, c the calling thread's context (its map of the peers'
 * arenas is its own); a staged one only starts (STAGING, *stage its
 * receive); a rendezvous from another rank is left to copy_rdv once the
 * lock is let go (DEFER, *later): SC_ETRUNCATE if it is longer (cap
 * bytes delivered, the rendezvous completed all the same, so the sender
 * never hangs).  Under the lock. */
static int deliver(sc_comm_t *c, int s, const msg_t *m, const char *data, int ring, char *buf, int64_t cap,
                   in_t **stage, rdv_t *later)
{
    int64_t k = m->n < cap ? m->n : cap;
    if (m->kind == STAGED) {             /* matched: clear its sender to stream the pieces (fill takes them) */
        in_t *e = *stage = &c->p2p->ins[s * NDONE + m->seq % NDONE];
        *e = (in_t){ buf, cap, m->n, 0, m->seq, s, m->tag, 1 };
        c->p2p->nin++;
        if (!m->n) {
            full(c, e);
        } else {
            atomic_store_explicit(&tail_of(c, s, c->rank)->done[m->seq % NDONE], m->seq | CTS, memory_order_release);
            ring_bell(c, s);
        }
        return STAGING;
    }
    if (m->kind == EAGER) {
        for (int64_t got = 0, upto; got < k || (ring && got < m->n); got = upto) {    /* ring: as it is written */
            int rc = ring ? written(c, s, data - HDR, (uint64_t)got + 1) : SC_OK;
            if (rc) return rc;
            upto = ring ? (int64_t)atomic_load_explicit(ready_word(data - HDR), memory_order_acquire) : m->n;
            if (got < k) memcpy(buf + got, data + got, (size_t)((upto < k ? upto : k) - got));
        }
    } else if (k && s != c->rank) {
        int share = k >= SHARE_MIN && !c->p2p->sharing[s];
        if (share) c->p2p->sharing[s] = 1;
        *later = (rdv_t){ s, m->seq, m->addr, m->n, share };
        return DEFER;
    } else {
        if (k) memcpy(buf, (const char *)(uintptr_t)m->addr, (size_t)k);
        atomic_store_explicit(&tail_of(c, s, c->rank)->done[m->seq % NDONE], m->seq, memory_order_release);
        ring_bell(c, s);
    }
    return m->n > cap ? SC_ETRUNCATE : SC_OK;
}

/* One try at a receive of (src, tag) into buf: SC_OK (out: source, tag,
 * bytes), 1 nothing matches yet, or an error. */
static int try_recv(sc_comm_t *c, sc_comm_t *sh, int src, int tag, const ahead_t *ahead, char *buf, int64_t cap,
                    int64_t *out, in_t **stage)
{
    sc_p2p_t *p = c->p2p;
    um_t **prev;
    msg_t m;
    char *data;
    rdv_t later;
    pthread_mutex_lock(&p->mu);
    int s = find(c, src, tag, ahead, &prev, &m, &data), rc = 1;
    if (s >= 0) {
        if (prev) {
            um_t *u = *prev;
            unlink_entry(p, prev);
            m = (msg_t){ .tag = u->tag, .kind = u->kind, .n = u->n, .seq = u->seq, .addr = u->addr };
            rc = deliver(sh, s, &m, u->data, 0, buf, cap, stage, &later);
            free(u);
        } else {
            rc = deliver(sh, s, &m, data, 1, buf, cap, stage, &later);
            if (m.kind == EAGER) {
                p->tl[s] += (uint64_t)rec_bytes(m.n);
            } else {
                p->tl[s] += HDR;
            }
            freed(c, s);
        }
        out[0] = s, out[1] = m.tag, out[2] = m.n;
    }
    pthread_mutex_unlock(&p->mu);
    return rc == DEFER ? copy_rdv(sh, &later, buf, m.n < cap ? m.n : cap) : rc;
}

/* A staged receive's end: SC_OK or SC_ETRUNCATE once full (out: source,
 * tag, bytes; the receive is let go), 1 while pieces are to come. */
static int finish(sc_comm_t *c, in_t *e, int64_t *out)
{
    pthread_mutex_lock(&c->p2p->mu);
    int rc = e->state == 2 ? (e->n > e->cap ? SC_ETRUNCATE : SC_OK) : 1;
    if (rc != 1) {
        out[0] = e->src, out[1] = e->tag, out[2] = e->n;
        e->state = 0;
        atomic_store_explicit(&tail_of(c, e->src, c->rank)->done[e->seq % NDONE], e->seq, memory_order_release);
        ring_bell(c, e->src);
    }
    pthread_mutex_unlock(&c->p2p->mu);
    return rc;
}

/* Receive (src, tag) into buf: SC_OK, 1 nothing matches yet (block 0),
 * or an error.  stage (block 0 only, may be NULL): a staged receive to go
 * on with, and where one that is matched but not full is left (STAGING).
 * check: a routed collective's receive (idle_for). */
static int recv_checked(sc_comm_t *c, int src, int tag, const ahead_t *ahead, char *buf, int64_t cap, int block,
                        int64_t *out, void **stage, int check)
{
    sc_comm_t *sh = mine(c);
    in_t *st = stage ? *stage : NULL;
    /* A blocking receive from one other rank first spins on that ring
     * alone, for half the spin time: the message's own line is then all
     * that crosses between the CPUs, where a wait on the doorbell reads
     * the doorbell's line first. */
    int64_t direct = block && !st && src >= 0 && src != c->rank && sh->spin_ns > 0 ? sc_now_ns() + sh->spin_ns / 2 : 0;
    for (;;) {
        uint64_t seen = direct ? 0 : sc_p2p_bell(c);
        int rc = st ? finish(c, st, out) : try_recv(c, sh, src, tag, ahead, buf, cap, out, &st);
        if (rc == STAGING) rc = finish(c, st, out);
        if (rc != 1 || !block) {
            if (stage) *stage = rc == 1 ? st : NULL;
            return rc == 1 && st ? STAGING : rc;
        }
        if (direct) {
            if (st || sc_now_ns() >= direct) direct = 0;
            cpu_relax();
            continue;
        }
        if ((rc = idle_for(sh, seen, st ? st->src : src < 0 ? -1 : src, 0, check))) return rc;
    }
}

static int recv(sc_comm_t *c, int src, int tag, const ahead_t *ahead, char *buf, int64_t cap, int block, int64_t *out,
                void **stage)
{
    return recv_checked(c, src, tag, ahead, buf, cap, block, out, stage, 0);
}

/* Send to dest and receive from src together, each advanced as the other
 * waits, so ranks in a ring of Sendrecv never wait on one another's sends
 * (check: a routed collective's, idle_for). */
static int sendrecv(sc_comm_t *c, int dest, int stag, const char *sbuf, int64_t sn, int src, int rtag, char *rbuf,
                    int64_t rcap, int64_t *out, int check)
{
    sc_comm_t *sh = mine(c);
    int64_t seq = -1;             /* -1 not yet in the ring, 0 complete, else a rendezvous in flight */
    int got = 0;
    in_t *st = NULL;
    for (;;) {
        uint64_t seen = sc_p2p_bell(c);
        if (seq < 0) {
            int64_t r = try_send(c, dest, stag, sbuf, sn, 0);
            if (r != SC_EAGAIN) seq = r;
        }
        if (seq > 0 && done(c, dest, (uint64_t)seq)) seq = 0;
        if (!got) {
            int rc = st ? finish(c, st, out) : try_recv(c, sh, src, rtag, NULL, rbuf, rcap, out, &st);
            if (rc == STAGING) rc = finish(c, st, out);
            if (rc < 0) return rc;
            got = !rc;
        }
        if (got && !seq) return SC_OK;
        int rc = idle_for(sh, seen, got ? dest : st ? st->src : src < 0 ? -1 : src, 0, check);
        if (rc) return rc;
    }
}

int sc_p2p_sendrecv(sc_comm_t *c, int dest, int stag, const char *sbuf, int64_t sn, int src, int rtag, char *rbuf,
                    int64_t rcap, int64_t *out)
{
    return sendrecv(c, dest, stag, sbuf, sn, src, rtag, rbuf, rcap, out, 0);
}

/* A failure's fields (Python's message reads them: device.failure), from
 * one context of the communicator to another. */
static void failure_to(sc_comm_t *to, const sc_comm_t *from)
{
    to->err_rank = from->err_rank, to->err_code = from->err_code, to->err_when = from->err_when;
    to->err_call = from->err_call, to->err_a = from->err_a, to->err_b = from->err_b;
}

/* The collectives routed by point-to-point (Alltoallv/w, Gatherv,
 * Scatterv) are calls of the engine too: each first runs its arrival, a
 * program of no step (routed), which numbers the call and publishes its
 * arrival record as a schedule's call does, and then sends on tags below
 * -1, which no user receive matches: one per kind and call number.  So a
 * piece left over from a call that failed on one rank (an error handler
 * that returns), or that ranks disagreed on (their roots), is never taken
 * for a later call's (it waits in the queue, unmatched); and their waits
 * compare the awaited rank's record with the call's, as a schedule's do. */
static int coll_tag(int kind, uint64_t call)
{
    return -2 - (int)(kind + SC_ROUTED_KINDS * (call & ((1u << 28) - 1)));
}

/* A piece that arrived other than its receiver expects: out = the
 * sender, the bytes it sent, the bytes expected. */
static int mismatch(int64_t *out, int64_t who, int64_t sent, int64_t wanted)
{
    out[0] = who, out[1] = sent, out[2] = wanted;
    return SC_EMISMATCH;
}

/* Alltoallv over point-to-point: row holds, in bytes, what this rank
 * sends each rank, where from, what it receives from each, where to.  At
 * step k it sends to rank + k and receives from rank - k together
 * (Sendrecv), on its call's tag (coll_tag); its own piece is a copy.
 * A piece that arrives other than its receiver expects is SC_EMISMATCH,
 * out: the sender, the bytes it sent, the bytes expected. */
static int alltoallv(sc_comm_t *c, uint64_t call, const char *sbuf, char *rbuf, const int64_t *row, int64_t *out,
                     int check)
{
    int p = c->size, r = c->rank, tag = coll_tag(SC_ROUTED_ALLTOALLV, call);
    const int64_t *sn = row, *sd = row + p, *rn = row + 2 * p, *rd = row + 3 * p;
    if (sn[r] != rn[r]) return mismatch(out, r, sn[r], rn[r]);
    if (sn[r]) memmove(rbuf + rd[r], sbuf + sd[r], (size_t)sn[r]);
    for (int k = 1; k < p; k++) {
        int dest = (r + k) % p, src = (r - k + p) % p;
        int64_t got[3] = { 0, 0, 0 };
        int rc = sendrecv(c, dest, tag, sbuf + sd[dest], sn[dest], src, tag, rbuf + rd[src], rn[src], got, check);
        if (rc == SC_ETRUNCATE || (!rc && got[2] != rn[src])) return mismatch(out, src, got[2], rn[src]);
        if (rc) return rc;
    }
    return SC_OK;
}

/* Gatherv and Scatterv over point-to-point, on their call's tag
 * (coll_tag): every rank's piece goes straight between it and the root, so
 * no rank needs the root's counts first (a schedule's planning does).
 * row (the root's): bytes per rank, then byte displacements in rbuf
 * (Gatherv) or sbuf (Scatterv); n: this rank's own bytes (sendbuf's,
 * recvbuf's).  The root takes or sends every other piece as its peer gets
 * there, whatever their order.  A piece that arrives other than its
 * receiver expects is SC_EMISMATCH, out as alltoallv's. */
#define ROOTED_MAX 1024

static int gatherv(sc_comm_t *c, uint64_t call, int root, const char *sbuf, int64_t n, char *rbuf, const int64_t *row,
                   int64_t *out, int check)
{
    int p = c->size, r = c->rank, left = p - 1, tag = coll_tag(SC_ROUTED_GATHERV, call);
    if (r != root) {
        int64_t rc = sc_p2p_send(c, root, tag, sbuf, n, 1, 0);
        return rc < 0 ? (int)rc : SC_OK;
    }
    const int64_t *rn = row, *rd = row + p;
    if (n != rn[r]) return mismatch(out, r, n, rn[r]);
    /* the own piece is copied while a sender writes its share (copy_rdv), else once nothing moves */
    sc_comm_t *sh = mine(c);
    sh->side_n = n && sbuf != rbuf + rd[r] ? n : 0, sh->side_dst = rbuf + rd[r], sh->side_src = sbuf;
    void *st[ROOTED_MAX] = { NULL };
    char fin[ROOTED_MAX] = { 0 };
    while (left) {
        uint64_t seen = sc_p2p_bell(c);
        int moved = 0, first = -1;
        for (int k = 1; k < p; k++) {
            int s = (r + k) % p;
            if (fin[s]) continue;
            int64_t got[3] = { 0, 0, 0 };
            int rc = recv(c, s, tag, NULL, rbuf + rd[s], rn[s], 0, got, &st[s]);
            if (rc == 1 || rc == STAGING) {
                if (first < 0) first = s;
                continue;
            }
            if (rc == SC_ETRUNCATE || (!rc && got[2] != rn[s])) rc = mismatch(out, s, got[2], rn[s]);
            if (rc) {
                sh->side_n = 0;
                return rc;
            }
            fin[s] = 1, left--, moved = 1;
        }
        if (sh->side_n && !moved) {
            memmove(sh->side_dst, sbuf, (size_t)n);
            sh->side_n = 0;
            continue;
        }
        int rc = left && !moved ? idle_for(sh, seen, first, 0, check) : SC_OK;
        if (rc) {
            sh->side_n = 0;
            return rc;
        }
    }
    if (sh->side_n) memmove(sh->side_dst, sbuf, (size_t)n);
    sh->side_n = 0;
    return SC_OK;
}

static int scatterv(sc_comm_t *c, uint64_t call, int root, const char *sbuf, const int64_t *row, char *rbuf, int64_t n,
                    int64_t *out, int check)
{
    int p = c->size, r = c->rank, left = p - 1, tag = coll_tag(SC_ROUTED_SCATTERV, call);
    if (r != root) {
        int64_t got[3] = { 0, 0, 0 };
        int rc = recv_checked(c, root, tag, NULL, rbuf, n, 1, got, NULL, check);
        if (rc == SC_ETRUNCATE || (!rc && got[2] != n)) return mismatch(out, root, got[2], n);
        return rc;
    }
    const int64_t *sn = row, *sd = row + p;
    if (n != sn[r]) return mismatch(out, r, sn[r], n);
    int own = n && rbuf != sbuf + sd[r];        /* copied once nothing else moves, as in gatherv */
    int64_t seq[ROOTED_MAX];        /* -1 not yet sent, 0 complete, else a rendezvous in flight */
    for (int d = 0; d < p; d++) seq[d] = d == r ? 0 : -1;
    while (left) {
        uint64_t seen = sc_p2p_bell(c);
        int moved = 0, first = -1;
        for (int k = 1; k < p; k++) {
            int d = (r + k) % p;
            if (seq[d] < 0) {
                int64_t x = try_send(c, d, tag, sbuf + sd[d], sn[d], 0);
                if (x == SC_EAGAIN) {
                    if (first < 0) first = d;
                    continue;
                }
                if (x < 0) return (int)x;
                seq[d] = x, moved = 1, left -= !x;
            } else if (seq[d] > 0) {
                if (!done(c, d, (uint64_t)seq[d])) {
                    if (first < 0) first = d;
                    continue;
                }
                seq[d] = 0, moved = 1, left--;
            }
        }
        if (own && !moved) {
            memmove(rbuf, sbuf + sd[r], (size_t)n);
            own = 0;
            continue;
        }
        int rc = left && !moved ? idle_for(mine(c), seen, first, 0, check) : SC_OK;
        if (rc) return rc;
    }
    if (own) memmove(rbuf, sbuf + sd[r], (size_t)n);
    return SC_OK;
}

/* A routed collective (kind: SC_ROUTED_*): its arrival (a program of no step,
 * of the call's signature), then its pieces, on the call's tag.  Owned by
 * this thread for its length as a schedule's call is (pyfast.c run): a
 * second thread's collective on the communicator meanwhile gets SC_EBUSY.
 * The thread's context takes the call's number and record (as they were
 * during the arrival: its end made them the previous call's), so that its
 * waits compare the awaited rank's record with them.  out[0] -1: the
 * failure is not a piece's (SC_EMISMATCH: the records differ). */
static int routed(sc_comm_t *c, int kind, const int64_t *arrival, int root, const char *sbuf, char *rbuf, int64_t n,
                  const int64_t *row, int64_t *out)
{
    out[0] = -1;
    if (sc_own(c)) return SC_EBUSY;
    uint64_t prev[2] = { c->prev[0], c->prev[1] }, hist = c->hist;
    sc_comm_t *sh = mine(c);
    /* the arrival runs on the communicator's context (it may wait: a rank
     * past its records' ring, the check option): it lets the GIL go and
     * polls signals as the thread's context does (arm), and takes the GIL
     * back before the pieces go */
    c->gil_ns = sh->gil_ns, c->hooks.release = sh->hooks.release, c->hooks.poll = sh->hooks.poll;
    int rc = sc_exec_owned(c, arrival, NULL, NULL);
    if (sh != c) {
        if (c->hooks.saved) PyEval_RestoreThread(c->hooks.saved);
        memset(&c->hooks, 0, sizeof c->hooks);
    }
    if (rc && sh != c) failure_to(sh, c);       /* where resume() reads them */
    /* a thread past the shadows shares the communicator's context, whose
     * record fields moved on with the arrival's end: its waits check nothing */
    int check = sh != c;
    if (!rc && check) {
        sh->call = c->call, sh->sig[0] = c->sig[0], sh->sig[1] = c->sig[1];
        sh->prev[0] = prev[0], sh->prev[1] = prev[1], sh->hist = hist;
    }
    if (!rc)
        rc = kind == SC_ROUTED_ALLTOALLV ? alltoallv(c, c->call, sbuf, rbuf, row, out, check)
           : kind == SC_ROUTED_GATHERV ? gatherv(c, c->call, root, sbuf, n, rbuf, row, out, check)
           : scatterv(c, c->call, root, sbuf, row, rbuf, n, out, check);
    sc_disown(c);
    return rc;
}

/* The arrival program the communicator's C cache holds for a routed call
 * of collective cid (select.TABLE's id) and root, NULL if none yet (the
 * Python method compiles it: Comm._arrival). */
const int64_t *sc_cache_get(sc_comm_t *c, const int64_t *key);
static const int64_t *arrival(sc_comm_t *c, int64_t cid, int64_t root)
{
    int64_t key[SC_KEY] = { cid, SC_ROUTED_ALG, root, 0, 0, 0, 0 };
    return sc_cache_get(c, key);
}

/* Probe (src, tag): out = source, tag, bytes; detach: the message leaves
 * matching and *handle holds it for sc_p2p_mrecv (Mprobe).  SC_OK found,
 * 1 not yet (non-blocking), or an error. */
static int probe(sc_comm_t *c, int src, int tag, const ahead_t *ahead, int block, int detach, int64_t *out,
                 void **handle)
{
    sc_comm_t *sh = mine(c);
    sc_p2p_t *p = c->p2p;
    for (;;) {
        uint64_t seen = sc_p2p_bell(c);
        um_t **prev;
        msg_t m;
        char *data;
        int rc = 1;
        pthread_mutex_lock(&p->mu);
        int s = find(c, src, tag, ahead, &prev, &m, &data);
        if (s >= 0) {
            um_t *u = prev ? *prev : NULL;
            if (u) m = (msg_t){ .tag = u->tag, .n = u->n };
            out[0] = s, out[1] = m.tag, out[2] = m.n;
            rc = SC_OK;
            if (detach) {
                if (u) unlink_entry(p, prev);
                else if (!(u = lift(c, s, &m, data))) rc = SC_ENOMEM;
                *handle = u;
            }
        }
        pthread_mutex_unlock(&p->mu);
        if (rc != 1 || !block) return rc;
        if ((rc = sc_p2p_idle(sh, seen, src < 0 ? -1 : src))) return rc;
    }
}

/* Receive a message Mprobe detached (buf NULL: drop it, completing a rendezvous). */
int sc_p2p_mrecv(sc_comm_t *c, void *handle, char *buf, int64_t cap, int64_t *out)
{
    um_t *u = handle;
    msg_t m = { .tag = u->tag, .kind = u->kind, .n = u->n, .seq = u->seq, .addr = u->addr };
    out[0] = u->src, out[1] = u->tag, out[2] = u->n;
    sc_comm_t *sh = mine(c);
    in_t *st = NULL;
    rdv_t later;
    int64_t k = buf ? (m.n < cap ? m.n : cap) : 0;
    pthread_mutex_lock(&c->p2p->mu);
    int rc = deliver(sh, u->src, &m, u->data, 0, buf, buf ? cap : 0, &st, &later);
    pthread_mutex_unlock(&c->p2p->mu);
    free(u);
    if (rc == DEFER) rc = copy_rdv(sh, &later, buf, k);
    while (rc == STAGING) {
        uint64_t seen = sc_p2p_bell(c);
        if ((rc = finish(c, st, out)) == 1 && !(rc = sc_p2p_idle(sh, seen, st->src))) rc = STAGING;
    }
    return buf ? rc : SC_OK;
}

/* -- Python entries (CPython builtins, as pyfast.c's: no cffi GIL round trip) -- */
void *sc_py_release(void);               /* pyfast.c */
int sc_py_poll(sc_comm_t *c);

/* This thread's context, its waits letting the GIL go and polling
 * signals: as pyfast.c's arm, after SC_GIL_NS with no other thread in the
 * interpreter, else at once. */
static sc_comm_t *arm(sc_comm_t *c)
{
    sc_comm_t *sh = mine(c);
    if (sh == c) return sh;
    PyThreadState *me = PyThreadState_Get();
    sh->gil_ns = PyInterpreterState_ThreadHead(PyThreadState_GetInterpreter(me)) == me && !PyThreadState_Next(me)
                 ? SC_GIL_NS : 0;
    sh->hooks.release = sc_py_release, sh->hooks.poll = sc_py_poll;
    return sh;
}

/* Take the GIL back; a failure's fields go to the communicator's context,
 * where Python's message reads them (device.failure). */
static void resume(sc_comm_t *sh, int64_t rc)
{
    if (sh->hooks.saved) PyEval_RestoreThread(sh->hooks.saved);
    memset(&sh->hooks, 0, sizeof sh->hooks);
    if (rc < 0 && rc != SC_EAGAIN && rc != SC_ETRUNCATE && sh->p2p && sh->p2p->main != sh)
        failure_to(sh->p2p->main, sh);
}

/* rc back to Python: an int, or NULL if a signal handler raised. */
static PyObject *result(sc_comm_t *sh, int64_t rc)
{
    resume(sh, rc);
    if (rc == SC_EINTR && PyErr_Occurred()) return NULL;
    return PyLong_FromLongLong(rc);
}

static int args(const char *what, Py_ssize_t n, Py_ssize_t want, PyObject *const *a, sc_comm_t **c)
{
    if (n != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", what, want);
        return 0;
    }
    *c = PyLong_AsVoidPtr(a[0]);
    if (*c && !(*c)->p2p) PyErr_SetString(PyExc_RuntimeError, "point-to-point on a closed communicator");
    else if (!*c && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "no context");
    return *c && (*c)->p2p;
}

int sc_py_plain(const Py_buffer *b);      /* pyfast.c */

/* A C-contiguous buffer of plain data in this machine's byte order; else
 * an exception, on which Python's checks (p2p._buffer) name the problem. */
static int buffer(PyObject *v, Py_buffer *b, int writable)
{
    if (v == Py_None) {
        memset(b, 0, sizeof *b);
        return 1;
    }
    if (PyObject_GetBuffer(v, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0))) return 0;
    if (sc_py_plain(b)) return 1;
    PyBuffer_Release(b);
    PyErr_SetString(PyExc_TypeError, "not plain data in this machine's byte order");
    return 0;
}

static void release(Py_buffer *b)
{
    if (b->obj) PyBuffer_Release(b);
    b->obj = NULL;
}

/* send(ctx, dest, tag, buf, block, sync) -> 0, a rendezvous' sequence number, or SC_E* */
static PyObject *py_send(PyObject *m, PyObject *const *a, Py_ssize_t n)
{
    sc_comm_t *c;
    Py_buffer b;
    if (!args("send", n, 6, a, &c) || !buffer(a[3], &b, 0)) return NULL;
    int dest = PyLong_AsLong(a[1]), tag = PyLong_AsLong(a[2]);
    int block = PyObject_IsTrue(a[4]), sync = PyObject_IsTrue(a[5]);
    if (PyErr_Occurred()) { release(&b); return NULL; }
    sc_comm_t *sh = arm(c);
    int64_t rc = sc_p2p_send(c, dest, tag, b.buf, b.len, block, sync);
    PyObject *r = result(sh, rc);
    release(&b);
    return r;
}

/* sent(ctx, dest, seq, block) -> 1 complete, 0 not yet, or SC_E* */
static PyObject *py_sent(PyObject *m, PyObject *const *a, Py_ssize_t n)
{
    sc_comm_t *c;
    if (!args("sent", n, 4, a, &c)) return NULL;
    int dest = PyLong_AsLong(a[1]), block = PyObject_IsTrue(a[3]);
    uint64_t seq = PyLong_AsUnsignedLongLong(a[2]);
    if (PyErr_Occurred()) return NULL;
    sc_comm_t *sh = arm(c);
    return result(sh, sc_p2p_sent(c, dest, seq, block));
}

static PyObject *status(sc_comm_t *sh, int rc, const int64_t *out, PyObject *extra)
{
    resume(sh, rc);         /* first: no Python object is made or freed without the GIL */
    if (rc == SC_EINTR && PyErr_Occurred()) return NULL;
    if (extra) return Py_BuildValue("(iLLLO)", rc, (long long)out[0], (long long)out[1], (long long)out[2], extra);
    return Py_BuildValue("(iLLL)", rc, (long long)out[0], (long long)out[1], (long long)out[2]);
}

/* ahead: None, or a buffer of int32 (source, tag) pairs: the posted receives still unmatched before this call */
static int ahead_of(PyObject *v, Py_buffer *b, ahead_t *a)
{
    *a = (ahead_t){ NULL, 0 };
    if (!buffer(v, b, 0)) return 0;
    if (b->len % 8) {
        release(b);
        PyErr_SetString(PyExc_ValueError, "ahead: (source, tag) pairs of int32");
        return 0;
    }
    *a = (ahead_t){ b->buf, (int)(b->len / 8) };
    return 1;
}

/* recv(ctx, source, tag, buf, block, staged, ahead) -> (rc, source, tag, bytes, staged): rc 1 nothing yet,
 * 2 a staged message matched, its pieces to come: call again with staged (the handle) until rc is not 2 */
static PyObject *py_recv(PyObject *m, PyObject *const *a, Py_ssize_t n)
{
    sc_comm_t *c;
    Py_buffer b, ab;
    ahead_t ah;
    int64_t out[3] = { 0, 0, 0 };
    if (!args("recv", n, 7, a, &c) || !ahead_of(a[6], &ab, &ah)) return NULL;
    if (!buffer(a[3], &b, 1)) { release(&ab); return NULL; }
    int src = PyLong_AsLong(a[1]), tag = PyLong_AsLong(a[2]), block = PyObject_IsTrue(a[4]);
    void *st = a[5] == Py_None ? NULL : PyLong_AsVoidPtr(a[5]);
    if (PyErr_Occurred()) { release(&b); release(&ab); return NULL; }
    sc_comm_t *sh = arm(c);
    int rc = recv(c, src, tag, &ah, b.buf, b.len, block, out, block ? NULL : &st);
    resume(sh, rc);
    PyObject *hv = rc == STAGING ? PyLong_FromVoidPtr(st) : Py_NewRef(Py_None);
    PyObject *r = hv ? status(sh, rc, out, hv) : NULL;
    Py_XDECREF(hv);
    release(&b);
    release(&ab);
    return r;
}

/* probe(ctx, source, tag, block, detach, ahead) -> (rc, source, tag, bytes, handle) */
static PyObject *py_probe(PyObject *m, PyObject *const *a, Py_ssize_t n)
{
    sc_comm_t *c;
    Py_buffer ab;
    ahead_t ah;
    int64_t out[3] = { 0, 0, 0 };
    void *h = NULL;
    if (!args("probe", n, 6, a, &c) || !ahead_of(a[5], &ab, &ah)) return NULL;
    int src = PyLong_AsLong(a[1]), tag = PyLong_AsLong(a[2]);
    int block = PyObject_IsTrue(a[3]), detach = PyObject_IsTrue(a[4]);
    if (PyErr_Occurred()) { release(&ab); return NULL; }
    sc_comm_t *sh = arm(c);
    int rc = probe(c, src, tag, &ah, block, detach, out, &h);
    resume(sh, rc);
    PyObject *hv = PyLong_FromVoidPtr(h), *r = hv ? status(sh, rc, out, hv) : NULL;
    Py_XDECREF(hv);
    release(&ab);
    return r;
}

/* mrecv(ctx, handle, buf or None) -> (rc, source, tag, bytes); None drops the message */
static PyObject *py_mrecv(PyObject *m, PyObject *const *a, Py_ssize_t n)
{
    sc_comm_t *c;
    Py_buffer b;
    int64_t out[3] = { 0, 0, 0 };
    if (!args("mrecv", n, 3, a, &c)) return NULL;
    void *h = PyLong_AsVoidPtr(a[1]);
    if (!h || !buffer(a[2], &b, 1)) return NULL;
    sc_comm_t *sh = arm(c);
    int rc = sc_p2p_mrecv(c, h, a[2] == Py_None ? NULL : b.buf, b.len, out);
    PyObject *r = status(sh, rc, out, NULL);
    release(&b);
    return r;
}

/* routed(ctx, kind, arrival, root, send address, recv address, bytes, row) -> (rc, rank, bytes sent,
 * bytes expected): a routed call of kind SC_ROUTED_* (Alltoallv, Gatherv, Scatterv) whose arrival program
 * is at address arrival; bytes this rank's own piece (Gatherv, Scatterv); row an int64 buffer, 4 *
 * size for alltoallv, 2 * size on a Gatherv/Scatterv root (gatherv, scatterv), None elsewhere; the
 * addresses those of buffers the caller holds, checked against row by Python */
static PyObject *py_routed(PyObject *m, PyObject *const *a, Py_ssize_t n)
{
    sc_comm_t *c;
    Py_buffer row = { 0 };
    int64_t out[3] = { 0, 0, 0 };
    if (!args("routed", n, 8, a, &c) || !buffer(a[7], &row, 0)) return NULL;
    int kind = PyLong_AsLong(a[1]), root = PyLong_AsLong(a[3]);
    const int64_t *prog = PyLong_AsVoidPtr(a[2]);
    char *sbuf = PyLong_AsVoidPtr(a[4]), *rbuf = PyLong_AsVoidPtr(a[5]);
    int64_t bytes = PyLong_AsLongLong(a[6]);
    int64_t want = kind == SC_ROUTED_ALLTOALLV ? 4 * c->size : root == c->rank ? 2 * c->size : 0;
    if (!PyErr_Occurred() && (kind < 0 || kind >= SC_ROUTED_KINDS || c->size > ROOTED_MAX || root < 0
                              || root >= c->size || (want && row.len != want * (Py_ssize_t)sizeof(int64_t))))
        PyErr_SetString(PyExc_ValueError, "routed: a kind, a root in range, and the kind's row of int64");
    if (PyErr_Occurred()) {
        release(&row);
        return NULL;
    }
    sc_comm_t *sh = arm(c);
    int rc = routed(c, kind, prog, root, sbuf, rbuf, bytes, row.buf, out);
    resume(sh, rc);
    release(&row);
    if (rc == SC_EINTR && PyErr_Occurred()) return NULL;
    return Py_BuildValue("(iLLL)", rc, (long long)out[0], (long long)out[1], (long long)out[2]);
}

/* bell(ctx) -> this rank's doorbell now; idle(ctx, seen, who, for_ns) -> rc once it moved past seen,
 * or for_ns (nonzero) passed */
static PyObject *py_bell(PyObject *m, PyObject *const *a, Py_ssize_t n)
{
    sc_comm_t *c;
    if (!args("bell", n, 1, a, &c)) return NULL;
    return PyLong_FromUnsignedLongLong(sc_p2p_bell(c));
}

static PyObject *py_idle(PyObject *m, PyObject *const *a, Py_ssize_t n)
{
    sc_comm_t *c;
    if (!args("idle", n, 4, a, &c)) return NULL;
    uint64_t seen = PyLong_AsUnsignedLongLong(a[1]);
    int who = PyLong_AsLong(a[2]);
    int64_t for_ns = PyLong_AsLongLong(a[3]);
    if (PyErr_Occurred()) return NULL;
    sc_comm_t *sh = arm(c);
    return result(sh, idle_for(sh, seen, who, for_ns, 0));
}

/* -- the fast entries: Send, Recv and Sendrecv of one communicator ---------------
 * Bound per communicator as pyfast.c's collectives are: self = (context,
 * the checked Python method, the error handler, argument names, Status,
 * the status fields' names, kind: FAST_SEND, _RECV, _SENDRECV, ..., for
 * Isend and Irecv made = (the class of a send complete when made, that of
 * a receive matched when made, made(kind, buf, rank, tag, handle) for one
 * in flight), and for the routed collectives the collective's id, whose
 * arrival program they look up (arrival)).  A plain contiguous buffer,
 * an exact int rank and tag in range, no status or a Status, and nothing
 * pending on the communicator:
 * one C call; anything else goes to the Python method, failures to the
 * handler (rc, (rc, source, tag, bytes)). */
enum { FAST_SEND, FAST_RECV, FAST_SENDRECV, FAST_ALLTOALLV, FAST_ISEND, FAST_IRECV, FAST_GATHERV, FAST_SCATTERV };

/* Some communicator of this process has nonblocking point-to-point
 * pending (p2p.py's _busy): a call that would wait in C, where nothing
 * moves those, goes to Python, whose waits advance them. */
static int busy_anywhere;
void sc_p2p_busy(int on) { busy_anywhere = on; }
int sc_py_parse(PyObject *const *args, size_t nargsf, PyObject *kw, PyObject *names, PyObject **out);
int sc_py_buffer(PyObject *v, int writable, Py_buffer *b);
int sc_py_vbuffer(PyObject *v, int n, int writable, int64_t *vec, Py_buffer *b, Py_ssize_t *isz);

static PyObject *decline(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    return PyObject_Vectorcall(PyTuple_GET_ITEM(self, 1), args, nargsf, kw);
}

/* A fast entry's failure to its handler: handler(rc, (rc, out[0], out[1], out[2])). */
static PyObject *failed(PyObject *self, int64_t rc, const int64_t *out)
{
    PyObject *r = Py_BuildValue("(L(LLLL))", (long long)rc, (long long)rc, (long long)out[0], (long long)out[1],
                                (long long)out[2]);
    PyObject *res = r ? PyObject_CallObject(PyTuple_GET_ITEM(self, 2), r) : NULL;
    Py_XDECREF(r);
    return res;
}

/* An exact int (or float, truncated) in lo..hi into *v (absent: dflt). */
static int int_in(PyObject *o, long dflt, long lo, long hi, long *v)
{
    if (!o) {
        *v = dflt;
        return 1;
    }
    if (PyFloat_CheckExact(o)) {         /* truncated, as mpi4py's C int arguments take a float */
        double d = PyFloat_AS_DOUBLE(o);
        if (!(d > lo - 1.0 && d < hi + 1.0)) return 0;
        *v = (long)d;
        return *v >= lo && *v <= hi;
    }
    if (!PyLong_CheckExact(o)) return 0;
    int overflow;
    *v = PyLong_AsLongAndOverflow(o, &overflow);
    return !overflow && *v >= lo && *v <= hi;
}

/* The receive side's arguments, a[0] buffer, a[1] source, a[2] tag,
 * a[3] status: 0 if not the fast path's. */
static int recv_args(PyObject *self, sc_comm_t *c, PyObject **a, long *src, long *tag, PyObject **st)
{
    *st = a[3] && a[3] != Py_None ? a[3] : NULL;
    return a[0] && (!*st || Py_TYPE(*st) == (PyTypeObject *)PyTuple_GET_ITEM(self, 4))
           && int_in(a[1], -2, -2, c->size - 1, src) && *src != -1 && int_in(a[2], -1, -1, SC_TAG_UB, tag);
}

static int send_args(sc_comm_t *c, PyObject **a, long *dest, long *tag)
{
    return a[0] && a[1] && int_in(a[1], 0, 0, c->size - 1, dest) && int_in(a[2], 0, 0, SC_TAG_UB, tag);
}

/* count items at displacement displ (both >= 0) of size bytes inside a
 * buffer of len bytes, compared without products that could wrap. */
static int inside(int64_t count, int64_t displ, Py_ssize_t size, Py_ssize_t len)
{
    return size > 0 && displ <= len / size && count <= len / size - displ;
}

#define A2AV_MAX 1024
/* Pieces written (n bytes at d, per rank, p at most A2AV_MAX) apart, as
 * spec.ranges checks them (Python refuses pieces that overlap): in rank
 * order at once, else sorted by displacement, empty ones left out. */
static int by_start(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int apart_pieces(const int64_t *n, const int64_t *d, int p)
{
    int i = 0, k = 0;
    while (i + 1 < p && d[i] + n[i] <= d[i + 1]) i++;
    if (i + 1 >= p) return 1;
    int64_t live[2 * A2AV_MAX];
    for (i = 0; i < p; i++)
        if (n[i]) live[2 * k] = d[i], live[2 * k++ + 1] = n[i];
    qsort(live, (size_t)k, 2 * sizeof *live, by_start);
    for (i = 0; i + 1 < k; i++)
        if (live[2 * i] + live[2 * i + 1] > live[2 * i + 2]) return 0;
    return 1;
}

/* Two buffers that share no byte (an empty one shares none). */
static int apart(const Py_buffer *a, const Py_buffer *b)
{
    return (char *)a->buf + a->len <= (char *)b->buf || (char *)b->buf + b->len <= (char *)a->buf || !a->len || !b->len;
}

/* Alltoallv(sendbuf, recvbuf) of v-specs of plain buffers, each piece
 * inside its buffer and the received ones apart (apart_pieces), the two
 * buffers apart, no algorithm named: one C call (alltoallv); anything
 * else goes to the Python method, failures to the handler (rc, (rc,
 * rank, bytes sent, bytes expected)). */
static PyObject *fast_alltoallv(PyObject *self, sc_comm_t *c, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    PyObject *a[8] = { NULL };
    int p = c->size, ok = 0;
    int64_t vs[2 * A2AV_MAX], vr[2 * A2AV_MAX], row[4 * A2AV_MAX], out[3] = { 0, 0, 0 };
    Py_buffer sb = { 0 }, rb = { 0 };
    Py_ssize_t si = 0, ri = 0;
    const int64_t *prog = arrival(c, PyLong_AsLongLong(PyTuple_GET_ITEM(self, 8)), 0);
    if (prog && p <= A2AV_MAX && sc_py_parse(args, nargsf, kw, PyTuple_GET_ITEM(self, 3), a) && a[0] && a[1]
        && (!a[2] || a[2] == Py_None) && sc_py_vbuffer(a[0], p, 0, vs, &sb, &si)) {
        ok = sc_py_vbuffer(a[1], p, 1, vr, &rb, &ri);
        for (int i = 0; ok && i < p; i++) {
            ok = inside(vs[i], vs[p + i], si, sb.len) && inside(vr[i], vr[p + i], ri, rb.len);
            row[i] = vs[i] * si, row[p + i] = vs[p + i] * si, row[2 * p + i] = vr[i] * ri, row[3 * p + i] = vr[p + i] * ri;
        }
        ok = ok && apart_pieces(row + 2 * p, row + 3 * p, p) && apart(&sb, &rb);
    }
    if (!ok) {
        release(&sb), release(&rb);
        return decline(self, args, nargsf, kw);
    }
    sc_comm_t *sh = arm(c);
    int rc = routed(c, SC_ROUTED_ALLTOALLV, prog, 0, sb.buf, rb.buf, 0, row, out);
    resume(sh, rc);
    release(&sb), release(&rb);
    if (rc == SC_EINTR && PyErr_Occurred()) return NULL;
    if (!rc) Py_RETURN_NONE;
    return failed(self, rc, out);
}


/* Gatherv(sendbuf, recvbuf, root) and Scatterv(sendbuf, recvbuf, root):
 * this rank's buffer plain, the root's a v-spec of plain data (read on the
 * root only) whose pieces lie inside it (Gatherv's apart: apart_pieces),
 * its own piece as long as its count says and apart from it, no
 * algorithm named: one C call (gatherv, scatterv); anything else goes to
 * the Python method (IN_PLACE included), failures to the handler as
 * alltoallv's. */
static PyObject *fast_rooted(PyObject *self, sc_comm_t *c, int scatter, PyObject *const *args, size_t nargsf,
                             PyObject *kw)
{
    PyObject *a[8] = { NULL };
    int p = c->size, ok = 0;
    long root = 0;
    int64_t vec[2 * ROOTED_MAX], row[2 * ROOTED_MAX], out[3] = { 0, 0, 0 };
    Py_buffer ob = { 0 }, vb = { 0 };       /* this rank's own buffer; the root's v-spec's */
    Py_ssize_t isz = 0;
    const int64_t *prog = NULL;
    if (p <= ROOTED_MAX && sc_py_parse(args, nargsf, kw, PyTuple_GET_ITEM(self, 3), a) && a[0]
        && (!a[3] || a[3] == Py_None) && int_in(a[2], 0, 0, p - 1, &root)
        && (prog = arrival(c, PyLong_AsLongLong(PyTuple_GET_ITEM(self, 8)), root))
        && sc_py_buffer(a[scatter], scatter, &ob)) {
        ok = root != c->rank;
        if (!ok && a[!scatter] && sc_py_vbuffer(a[!scatter], p, !scatter, vec, &vb, &isz)) {
            ok = 1;
            for (int i = 0; ok && i < p; i++) {
                ok = inside(vec[i], vec[p + i], isz, vb.len);
                row[i] = vec[i] * isz, row[p + i] = vec[p + i] * isz;
            }
            ok = ok && row[root] == ob.len && (scatter || apart_pieces(row, row + p, p)) && apart(&ob, &vb);
        }
    }
    if (!ok) {
        release(&ob), release(&vb);
        return decline(self, args, nargsf, kw);
    }
    sc_comm_t *sh = arm(c);
    int rc = scatter ? routed(c, SC_ROUTED_SCATTERV, prog, (int)root, vb.buf, ob.buf, ob.len, row, out)
                     : routed(c, SC_ROUTED_GATHERV, prog, (int)root, ob.buf, vb.buf, ob.len, row, out);
    resume(sh, rc);
    release(&ob), release(&vb);
    if (rc == SC_EINTR && PyErr_Occurred()) return NULL;
    if (!rc) Py_RETURN_NONE;
    return failed(self, rc, out);
}

static PyObject *s_got, *s_active, *s_null, *s_wait, *s_buf, *s_cancelled;     /* interned names */

/* A request of class cls made without its __init__: its class holds what
 * a complete one's fields read; a receive's (source, tag, bytes) go in _got. */
static PyObject *made_now(PyObject *cls, const int64_t *got)
{
    PyTypeObject *t = (PyTypeObject *)cls;
    PyObject *r = t->tp_alloc(t, 0);
    if (!r || !got) return r;
    PyObject *v = Py_BuildValue("(LLL)", (long long)got[0], (long long)got[1], (long long)got[2]);
    if (!v || (!s_got && !(s_got = PyUnicode_InternFromString("_got"))) || PyObject_SetAttr(r, s_got, v)) Py_CLEAR(r);
    Py_XDECREF(v);
    return r;
}

/* Isend(buf, dest, tag) and Irecv(buf, source, tag): an eager send that
 * fits its ring, or a receive whose message is here, complete in this one
 * call (made_now); a rendezvous begun, a staged message matched, or a
 * receive behind receives posted before it (they match first) is handed
 * to made() to keep in flight; anything else to the Python method. */
static PyObject *fast_nonblocking(PyObject *self, sc_comm_t *c, long kind, PyObject *const *args, size_t nargsf,
                                  PyObject *kw)
{
    PyObject *a[8] = { NULL }, *st = NULL, *made = PyTuple_GET_ITEM(self, 7);
    Py_buffer b = { 0 };
    long rank = 0, tag = 0;
    /* neither waits: sends queued stop an Isend (they go first), receives posted make an Irecv post too */
    int posted = kind == FAST_IRECV && c->p2p_pending & SC_P2P_RECVS;
    if (c->closed || !c->p2p || (kind == FAST_ISEND && c->p2p_pending & SC_P2P_SENDS)
        || !sc_py_parse(args, nargsf, kw, PyTuple_GET_ITEM(self, 3), a)
        || !(kind == FAST_ISEND ? send_args(c, a, &rank, &tag) : recv_args(self, c, a, &rank, &tag, &st))
        || !sc_py_buffer(a[0], kind == FAST_IRECV, &b))
        return decline(self, args, nargsf, kw);
    sc_comm_t *sh = arm(c);
    int64_t out[3] = { 0, 0, 0 }, rc;
    void *stage = NULL;
    if (kind == FAST_ISEND) rc = sc_p2p_send(c, (int)rank, (int)tag, b.buf, b.len, 0, 0);
    else rc = posted ? 1 : recv(c, (int)rank, (int)tag, NULL, b.buf, b.len, 0, out, &stage);
    resume(sh, rc);
    release(&b);
    if (rc == SC_EINTR && PyErr_Occurred()) return NULL;
    /* no room; or no message and none posted before: the Python method, whose own look a moment later
     * often finds it (a window of Irecvs ahead of its sends then posts none; posting at once, it posted all) */
    if (rc == SC_EAGAIN || (kind == FAST_IRECV && rc == 1 && !posted)) return decline(self, args, nargsf, kw);
    if (rc == SC_OK) return made_now(PyTuple_GET_ITEM(made, kind == FAST_IRECV), kind == FAST_IRECV ? out : NULL);
    if (rc < 0) return failed(self, rc, out);
    PyObject *h = kind == FAST_ISEND ? PyLong_FromLongLong(rc) : rc == 1 ? Py_NewRef(Py_None) : PyLong_FromVoidPtr(stage);
    PyObject *r = h ? PyObject_CallFunction(PyTuple_GET_ITEM(made, 2), "lOllO", kind, a[0], rank, tag, h) : NULL;
    Py_XDECREF(h);
    return r;
}

static PyObject *fast(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    sc_comm_t *c = PyLong_AsVoidPtr(PyTuple_GET_ITEM(self, 0));
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(self, 6)), dest = 0, stag = 0, src = 0, rtag = 0;
    if (kind == FAST_ALLTOALLV || kind >= FAST_GATHERV) {
        if (c->closed || !c->p2p) return decline(self, args, nargsf, kw);
        return kind == FAST_ALLTOALLV ? fast_alltoallv(self, c, args, nargsf, kw)
                                      : fast_rooted(self, c, kind == FAST_SCATTERV, args, nargsf, kw);
    }
    if (kind >= FAST_ISEND) return fast_nonblocking(self, c, kind, args, nargsf, kw);
    PyObject *a[8] = { NULL }, *st = NULL;
    Py_buffer sb = { 0 }, rb = { 0 };
    if (c->closed || !c->p2p || c->p2p_pending || busy_anywhere || !sc_py_parse(args, nargsf, kw, PyTuple_GET_ITEM(self, 3), a))
        return decline(self, args, nargsf, kw);
    int ok = kind == FAST_SEND ? send_args(c, a, &dest, &stag) && sc_py_buffer(a[0], 0, &sb)
           : kind == FAST_RECV ? recv_args(self, c, a, &src, &rtag, &st) && sc_py_buffer(a[0], 1, &rb)
           : send_args(c, a, &dest, &stag) && recv_args(self, c, a + 3, &src, &rtag, &st)
             && sc_py_buffer(a[0], 0, &sb) && (sc_py_buffer(a[3], 1, &rb) || (release(&sb), 0));
    if (!ok) return decline(self, args, nargsf, kw);
    sc_comm_t *sh = arm(c);
    int64_t out[3] = { 0, 0, 0 }, rc;
    if (kind == FAST_SEND) rc = sc_p2p_send(c, (int)dest, (int)stag, sb.buf, sb.len, 1, 0);
    else if (kind == FAST_RECV) rc = recv(c, (int)src, (int)rtag, NULL, rb.buf, rb.len, 1, out, NULL);
    else rc = sc_p2p_sendrecv(c, (int)dest, (int)stag, sb.buf, sb.len, (int)src, (int)rtag, rb.buf, rb.len, out);
    resume(sh, rc);
    release(&sb);
    release(&rb);
    if (rc == SC_EINTR && PyErr_Occurred()) return NULL;
    if (rc && rc != SC_ETRUNCATE) return failed(self, rc, out);
    if (st) {       /* a truncated message's too, as MPI fills it: its source, tag and size */
        PyObject *names = PyTuple_GET_ITEM(self, 5), *v[5] = { PyLong_FromLongLong(out[0]), PyLong_FromLongLong(out[1]),
                                                                PyLong_FromLongLong(out[2]), PyLong_FromLong(0),
                                                                Py_NewRef(Py_False) };
        int bad = 0;
        for (int i = 0; i < 5; i++) {
            bad = bad || !v[i] || PyObject_SetAttr(st, PyTuple_GET_ITEM(names, i), v[i]);
            Py_XDECREF(v[i]);
        }
        if (bad) return NULL;
    }
    if (rc) return failed(self, rc, out);
    Py_RETURN_NONE;
}

/* Request.Waitall(requests, statuses=None), bound to (the class of a call
 * complete when made, that of a receive matched when made, the Python
 * Waitall, request.progress, the class of a posted receive): the engines'
 * pending work advanced once (progress: every call advances it), then
 * the first two, and posted receives matched by now (_got set, not
 * cancelled), complete here as their Wait would (inactive, null; a
 * receive lets its buffer go); any other request's Wait is called;
 * statuses asked for: the Python one. */
static int done_here(PyObject *self, PyObject *r)
{
    PyTypeObject *t = Py_TYPE(r);
    if (t == (PyTypeObject *)PyTuple_GET_ITEM(self, 0) || t == (PyTypeObject *)PyTuple_GET_ITEM(self, 1)) return 1;
    if (t != (PyTypeObject *)PyTuple_GET_ITEM(self, 4)) return 0;
    PyObject *got = PyObject_GetAttr(r, s_got), *cancelled = got ? PyObject_GetAttr(r, s_cancelled) : NULL;
    int here = got && cancelled && got != Py_None && cancelled == Py_False && PyObject_SetAttr(r, s_buf, Py_None) == 0;
    Py_XDECREF(got);
    Py_XDECREF(cancelled);
    return PyErr_Occurred() ? -1 : here;
}

static PyObject *waitall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    if (kw || PyVectorcall_NARGS(nargsf) != 1
        || (!s_active && !((s_active = PyUnicode_InternFromString("_active"))
                           && (s_null = PyUnicode_InternFromString("_null"))
                           && (s_wait = PyUnicode_InternFromString("Wait"))
                           && (s_buf = PyUnicode_InternFromString("_buf"))
                           && (s_cancelled = PyUnicode_InternFromString("_cancelled"))
                           && (s_got || (s_got = PyUnicode_InternFromString("_got"))))))
        return PyErr_Occurred() ? NULL : PyObject_Vectorcall(PyTuple_GET_ITEM(self, 2), args, nargsf, kw);
    PyObject *seq = PySequence_Tuple(args[0]);      /* a copy: a Wait called below may change the caller's list */
    if (!seq) return NULL;
    PyObject *res = PyObject_CallNoArgs(PyTuple_GET_ITEM(self, 3));
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(seq); res && i < n; i++) {
        PyObject *r = PyTuple_GET_ITEM(seq, i);
        Py_DECREF(res);
        int here = done_here(self, r);
        res = here < 0 ? NULL
            : here ? (PyObject_SetAttr(r, s_active, Py_False) || PyObject_SetAttr(r, s_null, Py_True) ? NULL
                      : Py_NewRef(Py_True))
            : PyObject_CallMethodNoArgs(r, s_wait);
    }
    Py_DECREF(seq);
    if (!res) return NULL;
    Py_DECREF(res);
    Py_RETURN_TRUE;
}

#define FAST(name, f) {name, (PyCFunction)(void (*)(void))f, METH_FASTCALL, NULL}
static PyMethodDef defs[] = {
    FAST("send", py_send), FAST("sent", py_sent), FAST("recv", py_recv), FAST("probe", py_probe),
    FAST("mrecv", py_mrecv), FAST("bell", py_bell), FAST("idle", py_idle), FAST("routed", py_routed),
    {"entry", (PyCFunction)(void (*)(void))fast, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"Waitall", (PyCFunction)(void (*)(void))waitall, METH_FASTCALL | METH_KEYWORDS, NULL}, {NULL, NULL, 0, NULL},
};

/* Method definition i (NULL past the last), for Python to bind with PyCFunction_NewEx. */
void *sc_py_p2p(int i) { return i >= 0 && i < (int)(sizeof defs / sizeof defs[0]) - 1 ? &defs[i] : NULL; }
