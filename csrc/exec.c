/* The schedule executor: runs one rank's compiled program for one call.
 *
 * Python plans every algorithm as a schedule (which bytes move from which
 * rank to which, step by step) and compiles it per rank into a program of
 * fixed-size instructions (shmcoll/compile.py; their fields: isa.h,
 * generated from shmcoll/isa.py) with every ring offset, event number and
 * ack count resolved.  Here a call is: arrive (publish the call's
 * signature and buffers), optionally agree on signatures with every rank,
 * then run the instructions: post and wait on (call, event) flags, copy,
 * single-copy read a peer's buffer or write into it, ack, and drain or
 * record the readers a writer must wait for before it rewrites its ring,
 * its inline slots or the stripe (lazily: only when it writes the same
 * memory again); after it, check the records of neighbours it did not
 * wait on (recheck).  Which of a twin's two programs runs is twins.c's. */
#include "sc_internal.h"
#include <errno.h>

/* A writer using w inline slots a call (w a power of two) gives call C
 * the lines C * w .. C * w + w - 1 (mod SC_SLOTS): a line comes back
 * SC_SLOTS / w calls later, so a root writing to several readers is not
 * held to the readers of its previous call.  Operand u: slot j, width w. */
static uint64_t slot_index(uint64_t call, uint64_t u)
{
    return call * (uint64_t)SC_ARG(&u, SC_SLOTOP_WIDTH) + (uint64_t)SC_ARG(&u, SC_SLOTOP_J);
}

static int space_rank(int64_t sp) { return (int)SC_ARG(&sp, SC_SPACE_RANK); }
static uint64_t space_index(int64_t sp) { return (uint64_t)SC_ARG(&sp, SC_SPACE_INDEX); }

/* The header of the inline slot that space word sp names in call n. */
static sc_slot_t *slot_of_call(sc_comm_t *c, int64_t sp, uint64_t n)
{
    return slot_head(c, space_rank(sp), slot_index(n, space_index(sp)));
}

static sc_slot_t *slot_of(sc_comm_t *c, int64_t sp) { return slot_of_call(c, sp, c->call); }

/* Ask for line p in the exclusive state, to be written soon.  For a
 * writer of one slot a call, the line the next call of the same program
 * stamps was last read SC_SLOTS calls ago and may still sit in its
 * readers' caches; taking it now, while the caller is between calls,
 * keeps that invalidation off the next call's path (its stamp's store,
 * and the fence of the post after it, would wait for it).  A wider
 * writer's next line may still be read by a reader behind: not taken. */
static inline void own_soon(const void *p)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 1, 3);
#endif
}

static char *space(sc_comm_t *c, int64_t sp, int64_t off, char *sbuf, char *rbuf)
{
    int r = space_rank(sp);
    switch (SC_ARG(&sp, SC_SPACE_KIND)) {
    case SC_SEND: return sbuf + off;
    case SC_RECV: return rbuf + off;
    case SC_TMP: {                  /* a fold's input slot (bits 32-): the peer's bytes, if its CMA left them there */
        char *a = space_index(sp) ? sc_alias(c, (int)space_index(sp) - 1) : NULL;
        return (a ? a : c->tmp) + off;
    }
    case SC_CHAN: return chan_buf(c, r) + off;
    case SC_SLOT: return slot_data(c, r, slot_index(c->call, space_index(sp))) + off;
    case SC_TINY: return slot_tiny(c, r, slot_index(c->call, space_index(sp))) + off;
    default: return c->base + c->off_stripe + off;
    }
}

/* Debt set of operand a: inline slot sets are named by the call's slot
 * operand and stored under the slot line they land on. */
static int set_of(sc_comm_t *c, int64_t a)
{
    return a < SC_SET_SLOT ? (int)a : SC_SET_SLOT + (int)(slot_index(c->call, (uint64_t)(a - SC_SET_SLOT)) % SC_SLOTS);
}

/* Acks only grow, (call, count) in that order, so what an earlier look
 * at who's ack line saw (c->acked) still holds: a debt it covers needs
 * no look now.  A drain pays the line's trip from the reader's CPU once
 * per SC_SLOTS calls, not on every call.  A look may see the call word
 * before a new call's first ack moved it, then that call's count: any
 * debt of the older call is met then all the same. */
static int wait_ack(sc_comm_t *c, int who, uint64_t call, uint64_t count, int64_t spin)
{
    uint64_t *seen = c->acked + 2 * who;
    if (seen[0] == call ? seen[1] >= count : (int64_t)(seen[0] - call) > 0) return SC_OK;
    sc_line_t *l = ack_line(c, who);
    int rc = sc_wait_line(c, l, who, call, count, spin, 0);
    if (!rc) {
        seen[0] = atomic_load_explicit(&l->call, memory_order_acquire);
        seen[1] = atomic_load_explicit(&l->event, memory_order_acquire);
    }
    return rc;
}

/* Whether a record (sig, prev, hist) is ours of this call word for word,
 * or (next) that of a rank one call on from ours: its previous call is
 * ours, its hash ours with ours added.  The common case, read from the
 * line the wait just read (oversubscribed, a barrier's peer has often
 * arrived in the next call already; the long way reads its record ring,
 * a line more from the other CPU).  Anything else goes the long way (a
 * refused call compares equal only there). */
static int ours(const sc_comm_t *c, int next, uint64_t s0, uint64_t s1, uint64_t p0, uint64_t p1, uint64_t h)
{
    if (next) return p0 == c->sig[0] && p1 == c->sig[1] && h == sc_mix(c->hist, c->prev);
    return s0 == c->sig[0] && s1 == c->sig[1] && p0 == c->prev[0] && p1 == c->prev[1] && h == c->hist;
}

static int same_record(sc_comm_t *c, int who, const sc_slot_t *h)
{
    int same;
    if (h) {
        uint64_t at = atomic_load_explicit(&h->call, memory_order_acquire);
        same = at == c->call && ours(c, 0, h->rec[0], h->rec[1], h->rec[2], h->rec[3], h->rec[4]);
        atomic_thread_fence(memory_order_acquire);
        return same && atomic_load_explicit(&h->call, memory_order_relaxed) == at;
    }
    sc_line_t *l = post_line(c, who);
    uint64_t s = atomic_load_explicit(&l->seq, memory_order_acquire), at = atomic_load_explicit(&l->call, memory_order_relaxed);
    same = at - c->call <= 1 && ours(c, at != c->call, l->sig[0], l->sig[1], l->prev[0], l->prev[1], l->hist);
    atomic_thread_fence(memory_order_acquire);
    return same && !(s & 1) && atomic_load_explicit(&l->seq, memory_order_relaxed) == s;
}

/* Compare who's arrival record with ours (stamped in slot, if given); a
 * mismatch aborts the job from this call on. */
static int check_post(sc_comm_t *c, int who, const sc_slot_t *slot)
{
    if (same_record(c, who, slot)) return SC_OK;
    int rc = slot ? sc_check_slot(c, who, slot) : sc_check_line(c, who);
    if (rc) sc_abort_mismatch(c);
    return rc;
}

/* Wait for who's post line; with check, then check its record.
 * stamped: the slot's stamp says the event is posted (the slot was its
 * only piece, written whole before the stamp), so the wait reads that
 * one line, record and payload with it, and not the post line too. */
static int wait_post(sc_comm_t *c, int who, uint64_t call, uint64_t ev, int64_t spin, int check, const sc_slot_t *slot,
                     int stamped)
{
    int rc;
    if (stamped) {
        sc_wait_t w = { .word = (_Atomic uint64_t *)&slot->call, .wq = &post_line(c, who)->wq, .call = call,
                        .who = who, .spin_ns = spin };
        rc = wait_for(c, &w);
    } else {
        rc = sc_wait_line(c, post_line(c, who), who, call, ev, spin, 0);
    }
    return !rc && check ? check_post(c, who, slot) : rc;
}

/* A writer's record of this call into the header of the inline slot it
 * fills, its call number with the top bit flipped while the record and
 * the payload are written (sc_check_slot: no reader is 2^63 calls from
 * this one): a reader that sees the call there sees both (STAMPED). */
static void stamp_open(sc_comm_t *c, sc_slot_t *h)
{
    atomic_store_explicit(&h->call, c->call ^ 1ULL << 63, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    h->rec[0] = c->sig[0], h->rec[1] = c->sig[1], h->rec[2] = c->prev[0], h->rec[3] = c->prev[1], h->rec[4] = c->hist;
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
 * the other); in who's arena, by plain copies (a writer stopped halfway
 * through a piece finishes it whenever it goes on: sc_shut).  A write
 * with a twin (this rank's own copy of the same bytes, nt: streamed)
 * goes TWIN bytes at a time, each copied into the twin first and then
 * into who while still in cache, so local is read from memory once.
 * nt: bit 0 streams the twin, bit 1 the single copy where it is a plain
 * one (SC_OP_STREAMED on a CMA or SHARE; never a CMAW push, which
 * streamed runs slower: bench/README.md, "Engine constants"). */
#define TWIN (256 << 10)
static inline int streamed(const int64_t *in) { return SC_ARG(in, SC_CMA_STREAMED) ? 2 : 0; }   /* cma's nt */
static int cma(sc_comm_t *c, int who, char *local, uint64_t addr, int64_t n, int write, char *twin, int nt)
{
    _Atomic int32_t *mine = &rank_rec(c, c->rank)->pushing, *door = write ? &rank_rec(c, who)->shut : NULL;
    int32_t pid = rank_rec(c, who)->pid;
    if (write) atomic_store_explicit(mine, who + 1, memory_order_seq_cst);
    char *p = sc_peer_ptr(c, who, addr, n);
    int err = 0;
    for (int64_t done = 0, step = twin ? TWIN : n; done < n && !err; done += step) {
        int64_t k = n - done < step ? n - done : step;
        if (twin) sc_copy(twin + done, local + done, k, nt & 1);
        err = sc_vm_move(pid, local + done, addr + (uint64_t)done, k, door, p ? p + done : NULL, nt >> 1 & 1);
    }
    if (write) atomic_store_explicit(mine, 0, memory_order_release);
    if (!err && p) c->direct += n;
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
    sc_out_of_step(c, who);                   /* no field to name */
    sc_abort_mismatch(c);
    return SC_EMISMATCH;
}

/* The next piece of k still unclaimed on word w in (call, step) tag, or
 * -1 when none is left (or a later step of this call has taken the word
 * over): the reader takes them from the front, the writer from the back,
 * so the two work apart until they meet.  A word of another call is
 * stale, however old (neither end claims in a call before the other has
 * arrived in it), but for one whose 48 bits of call number match: last
 * claimed a multiple of 2^48 calls earlier (160 days of 50 ns calls). */
static int64_t claim(_Atomic uint64_t *w, uint64_t tag, int64_t k, int back)
{
    uint64_t v = atomic_load_explicit(w, memory_order_relaxed);
    for (;;) {
        uint64_t had = v >> 12;
        int same = had == tag, later = had >> 4 == tag >> 4 && (had & 0xf) > (tag & 0xf);
        uint64_t f = same ? v & 0x3f : 0, b = same ? v >> 6 & 0x3f : 0;
        if (later || (int64_t)(f + b) >= k) return -1;
        uint64_t next = tag << 12 | (back ? (b + 1) << 6 | f : b << 6 | (f + 1));
        if (atomic_compare_exchange_weak_explicit(w, &v, next, memory_order_relaxed, memory_order_relaxed))
            return back ? k - 1 - (int64_t)b : (int64_t)f;
    }
}

/* SC_OP_SHARE: writer's n bytes to reader by single copy, split between
 * the two as they go: each claims the next piece and copies it (the
 * reader reads it, the writer writes it), so the one that ends its other
 * work first, or pins the other's pages faster (huge pages on one side
 * only, a busy CPU), takes more.  Both have waited for the other's
 * arrival; each acks once it has nothing left to claim, and the other
 * waits for that ack before it counts the copy as done. */
static int share(sc_comm_t *c, const int64_t *in, char *sbuf, char *rbuf)
{
    int who = (int)SC_ARG(in, SC_SHARE_WHO), writer = (int)SC_ARG(in, SC_SHARE_WRITER), nt = streamed(in);
    uint64_t tag = claim_tag(c->call, (int)SC_ARG(in, SC_SHARE_STEP)), at;
    _Atomic uint64_t *w = writer ? claim_word(c, who, c->rank) : claim_word(c, c->rank, who);
    int64_t n = SC_ARG(in, SC_SHARE_N), q = SC_ARG(in, SC_SHARE_PIECE), k = (n + q - 1) / q, i;
    int64_t buf = SC_ARG(in, SC_SHARE_BUF), soff = SC_ARG(in, SC_SHARE_SOFF), doff = SC_ARG(in, SC_SHARE_DOFF);
    int rc = writer ? buffer_of(c, who, SC_RECV, &at) : SC_OK;
    if (!writer) at = post_line(c, who)->addr[buf - 1];
    while (!rc && (i = claim(w, tag, k, writer)) >= 0) {
        int64_t off = i * q, len = n - off < q ? n - off : q;
        rc = writer ? cma(c, who, space(c, buf, soff + off, sbuf, rbuf), at + (uint64_t)(doff + off), len, 1, NULL, nt)
                    : cma(c, who, rbuf + doff + off, at + (uint64_t)(soff + off), len, 0, NULL, nt);
    }
    return rc;
}

/* Publish this call's arrival record and first event (a sequence lock:
 * sc_check_line trusts a record only if seq was even and unchanged
 * around its reads); variant: rank 0's pick of a twin, 0 otherwise.
 * The event goes before the call: a waiter that sees the new call sees
 * its first event. */
static void arrive(sc_comm_t *c, uint64_t first, char *sbuf, char *rbuf, uint64_t variant)
{
    sc_rec_t *r = rec_of(c, c->rank, c->call);    /* kept: before the post line shows the call */
    atomic_store_explicit(&r->seq, 2 * c->call + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    r->rec[0] = c->sig[0], r->rec[1] = c->sig[1], r->rec[2] = c->prev[0], r->rec[3] = c->prev[1], r->rec[4] = c->hist;
    r->variant = variant;
    atomic_store_explicit(&r->took, 0, memory_order_relaxed);
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
        int rc = sc_wait_line(c, post_line(c, r), r, c->call, 0, c->spin_ns, 1);
        if (rc) return rc;
        if (sc_check_line(c, r)) return SC_EDIFFER;
    }
    return SC_OK;
}

/* The program's instructions from r->pc on.  Every wait is where its
 * instruction begins, or repeats harmlessly (a drain's earlier acks are
 * reached), so a nonblocking call stopped at a wait (SC_PENDING) goes on
 * from that instruction. */
static int run(sc_comm_t *c, sc_run_t *x)
{
    uint64_t call = c->call;
    sc_line_t *me = post_line(c, c->rank);
    const int64_t *prog = x->prog, *start = prog + SC_HEAD, *end = start + SC_ARG(prog, SC_H_INSNS) * SC_INSN;
    const int64_t *in = start + (int64_t)x->pc * SC_INSN;
    char *sbuf = x->sbuf, *rbuf = x->rbuf;
    int rc = SC_OK;
    for (; in < end && !rc; in += SC_INSN) {
        switch (SC_ARG(in, SC_OPCODE)) {
        case SC_OP_POST:
            post_event(me, (uint64_t)SC_ARG(in, SC_POST_EVENT));
            c->owe = 0;                       /* the same line's sleepers: checked */
            break;
        case SC_OP_WAIT: {
            int64_t f = SC_ARG(in, SC_WAIT_FLAGS), who = SC_ARG(in, SC_WAIT_WHO);
            rc = wait_post(c, (int)who, call, (uint64_t)SC_ARG(in, SC_WAIT_EVENT),
                           f & SC_WAIT_FAR ? c->spin_far_ns : c->spin_ns, f & SC_WAIT_CHECK,
                           f & SC_WAIT_INSLOT ? slot_of(c, SC_ARG(in, SC_WAIT_SLOT)) : NULL,
                           (f & (SC_WAIT_INSLOT | SC_WAIT_STAMPED)) == (SC_WAIT_INSLOT | SC_WAIT_STAMPED));
            if (!rc && c->traffic && f & SC_WAIT_FIRST) c->traffic[c->size + who]++;    /* a message's first piece */
            break;
        }
        case SC_OP_ACK:
            ack_event(ack_line(c, c->rank), call, (uint64_t)SC_ARG(in, SC_ACK_COUNT));
            owed_after_fence(c, me);
            break;
        case SC_OP_WAITACK:
            rc = wait_ack(c, (int)SC_ARG(in, SC_WAITACK_WHO), call, (uint64_t)SC_ARG(in, SC_WAITACK_COUNT),
                          SC_ARG(in, SC_WAITACK_FLAGS) & SC_WAITACK_FAR ? c->spin_far_ns : c->spin_ns);
            break;
        case SC_OP_COPY: {
            int64_t f = SC_ARG(in, SC_COPY_FLAGS), n = SC_ARG(in, SC_COPY_N), from = SC_ARG(in, SC_COPY_SOURCE);
            sc_slot_t *h = f & SC_COPY_STAMP ? slot_of(c, SC_ARG(in, SC_COPY_DST)) : NULL;
            if (h) stamp_open(c, h);
            sc_copy(space(c, SC_ARG(in, SC_COPY_DST), SC_ARG(in, SC_COPY_DOFF), sbuf, rbuf),
                    space(c, SC_ARG(in, SC_COPY_SRC), SC_ARG(in, SC_COPY_SOFF), sbuf, rbuf), n, (int)(f & SC_COPY_STREAM));
            if (h) {
                atomic_store_explicit(&h->call, c->call, memory_order_release);
                int64_t u = (int64_t)space_index(SC_ARG(in, SC_COPY_DST));
                if (SC_ARG(&u, SC_SLOTOP_WIDTH) == 1) own_soon(slot_of_call(c, SC_ARG(in, SC_COPY_DST), call + 1));
            }
            if (c->traffic && from >= 0) c->traffic[from] += n;
            break;
        }
        case SC_OP_CMA: {
            int who = (int)SC_ARG(in, SC_CMA_WHO);
            int64_t n = SC_ARG(in, SC_CMA_N), fold = SC_ARG(in, SC_CMA_FOLD);
            uint64_t at = post_line(c, who)->addr[SC_ARG(in, SC_CMA_BUF) - 1] + (uint64_t)SC_ARG(in, SC_CMA_SOFF);
            char *p = fold ? sc_peer_ptr(c, who, at, n) : NULL;
            if (fold) sc_alias_set(c, (int)fold - 1, p, SC_ARG(in, SC_CMA_DOFF));   /* folded where it lies */
            if (p) c->direct += n;
            else rc = cma(c, who, space(c, SC_ARG(in, SC_CMA_DST), SC_ARG(in, SC_CMA_DOFF), sbuf, rbuf), at, n, 0, NULL,
                          streamed(in));
            if (!rc && c->traffic) c->traffic[who] += n;
            break;
        }
        case SC_OP_CMAW: {
            uint64_t at;
            int who = (int)SC_ARG(in, SC_CMAW_WHO);
            int64_t twin = SC_ARG(in, SC_CMAW_TWIN);
            rc = buffer_of(c, who, (int)SC_ARG(in, SC_CMAW_BUF), &at);
            if (!rc) rc = cma(c, who, space(c, SC_ARG(in, SC_CMAW_SRC), SC_ARG(in, SC_CMAW_SOFF), sbuf, rbuf),
                             at + (uint64_t)SC_ARG(in, SC_CMAW_DOFF), SC_ARG(in, SC_CMAW_N), 1,
                             twin ? rbuf + twin - 1 : NULL, (int)SC_ARG(in, SC_CMAW_TWIN_STREAM));
            break;
        }
        case SC_OP_SHARE:
            rc = share(c, in, sbuf, rbuf);
            break;
        case SC_OP_DRAIN:
            rc = drain(c, set_of(c, SC_ARG(in, SC_DRAIN_SET)));
            break;
        case SC_OP_DEBT:
            debt(c, set_of(c, SC_ARG(in, SC_DEBT_SET)), (int)SC_ARG(in, SC_DEBT_READER), (uint64_t)SC_ARG(in, SC_DEBT_COUNT));
            break;
        case SC_OP_QPOST:
            atomic_store_explicit(queue_word(c, (int)SC_ARG(in, SC_QPOST_QUEUE), (int)SC_ARG(in, SC_QPOST_ENTRY)), call,
                                  memory_order_release);
            wake_sleepers(queue_wq(c));
            owed_after_fence(c, me);
            break;
        case SC_OP_REDUCE:
            if (sc_reduce(in[0], space(c, SC_ARG(in, SC_REDUCE_DST), SC_ARG(in, SC_REDUCE_DOFF), sbuf, rbuf),
                          space(c, SC_ARG(in, SC_REDUCE_A), SC_ARG(in, SC_REDUCE_AOFF), sbuf, rbuf),
                          space(c, SC_ARG(in, SC_REDUCE_B), SC_ARG(in, SC_REDUCE_BOFF), sbuf, rbuf),
                          SC_ARG(in, SC_REDUCE_ITEMS))) {
                sc_abort_call(c, 3, call);
                rc = SC_EKERNEL;
            }
            break;
        case SC_OP_COUNT:
            if (c->traffic) c->traffic[SC_ARG(in, SC_COUNT_SOURCE)] += SC_ARG(in, SC_COUNT_BYTES);
            break;
        case SC_OP_QWAIT: {
            sc_wait_t w = { .word = queue_word(c, (int)SC_ARG(in, SC_QWAIT_QUEUE), (int)SC_ARG(in, SC_QWAIT_ENTRY)),
                            .wq = queue_wq(c), .call = call, .who = (int)SC_ARG(in, SC_QWAIT_WHO), .spin_ns = c->spin_ns };
            rc = wait_for(c, &w);
            break;
        }
        }
    }
    if (rc == SC_PENDING) x->pc = (int32_t)((in - start) / SC_INSN - 1);
    return rc;
}

/* A rank that waited on no one in a call (a bcast root) checked no one's
 * record of it.  It checks its neighbours' records (nb: a ring, or a star
 * around rank 0, the same on every rank; compile.checks) of that call
 * or a later one (the hash covers all before) against its own, which it
 * keeps for SC_PAST calls.  It looks (look) at the end of every
 * SC_LOOK-th such call and in Free (sc_last_look): each look reads a line
 * its readers write, a cache miss on a small call's critical path, and waits only
 * when the oldest unchecked call would leave its records.  So a root
 * runs up to SC_PAST - 1 calls ahead of its readers, and different roots
 * raise on every rank within SC_PAST calls; of two roots that differ
 * in a job's last call, the later raises in Free.  A look that finds the
 * hash differing names the first unchecked call whose records differ. */
static int recheck(sc_comm_t *c, int block, int look)
{
    for (int k = 0; k < c->nnb; k++) {
        if (!(c->pending >> k & 1)) continue;
        int who = c->nb[k], rc, seen, must = block && c->call - c->since[k] >= SC_PAST - 1;
        if (!must && !look) continue;
        if (must && (rc = sc_wait_line(c, post_line(c, who), who, c->since[k], 0, c->spin_ns, 1)))
            return rc;
        uint64_t at = atomic_load_explicit(&post_line(c, who)->call, memory_order_acquire);
        if ((int64_t)(at - c->since[k]) < 0) continue;
        uint64_t n = (int64_t)(at - c->call) < 0 ? at : c->call;   /* its latest record we can compare */
        if ((rc = sc_check_rec(c, who, n, &seen))) {
            for (uint64_t m = c->since[k]; m != n && !sc_check_rec(c, who, m, &seen); m++)
                ;                             /* the first that differs, named (else n's error stands) */
            sc_abort_mismatch(c);
            return rc;
        }
        /* a record covers every call before it (the hash); one unseen is
         * gone: who is SC_PAST calls past n, beyond checking */
        if (!seen || (int64_t)(n - c->due[k]) >= 0) c->pending &= ~(1 << k);
        else c->since[k] = n + 1;
    }
    return SC_OK;
}

/* Free: a last look at the neighbours not yet checked, waiting for none
 * (and none while another thread is in a call on this communicator:
 * one communicator serves one thread at a time). */
int sc_last_look(sc_comm_t *c)
{
    if (sc_own(c)) return SC_OK;
    int rc = c->pending && !aborted_at(c, c->call + 1) ? recheck(c, 0, 1) : SC_OK;
    sc_disown(c);
    return rc;
}

/* One collective call (program header: isa.h SC_H_*; a twin's block
 * picks which of two programs runs: twins.c), as stages: 0 begin the
 * call, 1 rank 0's twin pick (may wait) and arrive, 2 the check round,
 * 3 a follower's twin pick, 4 the program, 5 the recheck.  A blocking
 * call runs them straight through; a nonblocking one (c->nbc) stops at a
 * wait that would block (SC_PENDING, before anything of that stage that
 * must happen once) and goes on from x->stage.  The caller owns c->busy. */
static inline int stages(sc_comm_t *c, sc_run_t *x)
{
    int rc = SC_OK;
    int32_t checks;
    switch (x->stage) {
    case 0: {
        if ((rc = aborted_at(c, c->call + 1))) return rc;
        x->look = !c->quiet;                      /* this call ends with a look at the pending (recheck) */
        int32_t ahead = x->look ? c->pending | (int32_t)SC_ARG(x->prog, SC_H_CHECKS) : 0;
        for (int k = 0; ahead && k < c->nnb; k++)   /* their lines arrive while we work */
            if (ahead >> k & 1) __builtin_prefetch(post_line(c, c->nb[k]));
        c->call++;
        c->sig[0] = (uint64_t)SC_ARG(x->prog, SC_H_SIG0);        /* a twin's programs share it */
        c->sig[1] = (uint64_t)SC_ARG(x->prog, SC_H_SIG1);
        int64_t tw = SC_ARG(x->prog, SC_H_TWIN);
        x->twin = tw && c->size > 1 ? (int64_t *)tw : NULL;
        x->t0 = !x->twin ? 0 : sc_now_ns();      /* untimed (-1) once a step of it stops (sc_exec_step) */
        x->v = 0;
        x->stage = 1;
    }   /* fall through */
    case 1:
        if (c->rank == 0 && (rc = sc_twin_lead(c, x->twin, &x->v)) == SC_PENDING) return rc;
        if (!rc) {
            arrive(c, x->twin ? 0 : (uint64_t)SC_ARG(x->prog, SC_H_FIRST), x->sbuf, x->rbuf, (uint64_t)x->v);
            x->stage = 2;                                       /* a twin's first post waits for the pick */
        }
        /* fall through */
    case 2:
        if (!rc && c->check && c->size > 1 && (rc = agree(c)) == SC_PENDING) return rc;
        if (!rc) x->stage = 3;
        /* fall through */
    case 3:
        if (!rc && x->twin) {
            if (c->rank && (rc = sc_twin_follow(c, &x->v)) == SC_PENDING) return rc;
            if (!rc) {
                x->prog = (const int64_t *)x->twin[SC_TW_PROG + x->v];
                sc_twin_ran(x->twin, x->v);
                if (SC_ARG(x->prog, SC_H_FIRST)) {
                    post_event(post_line(c, c->rank), (uint64_t)SC_ARG(x->prog, SC_H_FIRST));
                    c->owe = 0;
                }
            }
        }
        if (!rc) x->stage = 4;
        /* fall through */
    case 4:
        if (!rc && (rc = run(c, x)) == SC_PENDING) return rc;
        if (!rc && x->twin) sc_twin_done(c, x->twin, x->v, x->t0);
        checks = (int32_t)SC_ARG(x->prog, SC_H_CHECKS);   /* of the program that ran (a twin's may differ) */
        if (!rc && checks && !c->check) {
            for (int k = 0; k < c->nnb; k++) {
                if (!(checks >> k & 1)) continue;
                if (!(c->pending >> k & 1)) c->since[k] = c->call;
                c->due[k] = c->call;
            }
            c->pending |= checks;
        }
        if (!rc) x->stage = 5;
        /* fall through */
    case 5:
        if (!rc && c->pending) {
            if ((rc = recheck(c, 1, x->look)) == SC_PENDING) return rc;
            c->quiet = (c->quiet + 1) % SC_LOOK;
        }
    }
    if (rc && rc != SC_EDIFFER) sc_shut(c, 0);
    settle(c, post_line(c, c->rank));
    c->hist = sc_mix(c->hist, c->prev);
    c->prev[0] = c->sig[0];
    c->prev[1] = c->sig[1] | (rc == SC_EDIFFER ? REFUSED : 0);
    return rc;
}

int sc_exec_owned(sc_comm_t *c, const int64_t *prog, char *sbuf, char *rbuf)
{
    sc_run_t x = { .prog = prog, .sbuf = sbuf, .rbuf = rbuf };
    return stages(c, &x);
}

/* A step of a nonblocking call: its stages, from where it stopped, until
 * done or a wait would block (SC_PENDING); blocking (nb 0): to the end.
 * Its own scratch while it runs.  The caller owns c->busy.  A call that
 * stops is untimed (a twin's pick learns nothing from it: the caller's
 * own work between steps would count), unless nb is 2: the start's spin,
 * which steps it again at once, as a blocking wait spins. */
int sc_exec_step(sc_comm_t *c, sc_nbc_t *st, int nb)
{
    char *tmp = c->tmp;
    if (st->tmp) c->tmp = st->tmp;
    c->nbc = nb ? st : NULL;
    int rc = stages(c, &st->run);
    if (rc == SC_PENDING && nb != 2) st->run.t0 = -1;
    c->nbc = NULL;
    c->tmp = tmp;
    return rc;
}

/* The Python path owns the context while it plans (it may grow the
 * scratch buffer and replace programs, which a running call uses). */
int sc_own(sc_comm_t *c) { return __atomic_exchange_n(&c->busy, 1, __ATOMIC_ACQUIRE) ? SC_EBUSY : SC_OK; }
void sc_disown(sc_comm_t *c) { __atomic_store_n(&c->busy, 0, __ATOMIC_RELEASE); }
