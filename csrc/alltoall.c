/* Alltoall, paper 001 sections 4.3 and 5.3, paper 002 for the model.
 * Every exchange goes writer's ring -> reader, with per-call stamps.
 *  bruck        ceil(log p) steps of packed blocks (small blocks).
 *  all_at_once  each rank posts a piece of every block at once, readers
 *               staggered (step s reads rank - s) so no two read one writer.
 *  pairwise     p-1 steps, XOR partner (p a power of two) or shift, big
 *               staging chunks (the large-message baseline); blocks of at
 *               least cma_bytes go by rendezvous instead (paper 004): the
 *               reader copies straight out of the writer's sendbuf with
 *               process_vm_readv, one copy instead of two.
 *  tiled        pairwise cut into tiles sized to the shared cache, so the
 *               staged tile is still in cache when the partner copies it. */
#include "sc_internal.h"
#include <stdlib.h>

enum { BRUCK, ALL_AT_ONCE, PAIRWISE, TILED };

#define A2A_ROOT 0xfff   /* alltoall has no root: the signature's root field */

/* Ring geometry of a rank's channel for pieces of `piece` bytes. */
typedef struct { char *base; int64_t stride, nslots; } ring_t;
static ring_t ring(sc_comm_t *c, int ch, int64_t piece, int64_t nslots_max)
{
    ring_t r;
    if (piece <= SC_INLINE) {
        r.base = post_line(c, ch)->data;
        r.stride = SC_INLINE;
        r.nslots = 1;
    } else {
        r.base = chan_buf(c, ch);
        r.stride = (piece + 63) & ~63LL;
        r.nslots = c->chan_bytes / r.stride;
        if (r.nslots > nslots_max) r.nslots = nslots_max;
    }
    return r;
}
static char *slot(const ring_t *r, int64_t i) { return r->base + (i % r->nslots) * r->stride; }

/* One piece from this rank's ring to `dst` as event i, then one piece
 * from `src`'s ring as its event i.  `reader_of(j)` names who read event j. */
static int put(sc_comm_t *c, uint64_t op, const ring_t *r, int64_t i, int reader_old, const char *from, int64_t n, int64_t block)
{
    int rc;
    if (i >= r->nslots && (rc = wait_line(c, ack_line(c, reader_old, c->rank), stamp(op, i - r->nslots + 1), reader_old)))
        return rc;
    if (i == 0) put_meta(c, post_line(c, c->rank), block);
    sc_copy(slot(r, i), from, n, 0);
    post_line_val(post_line(c, c->rank), stamp(op, i + 1));
    return SC_OK;
}
/* `first`: this is the first event read from src in this call, so check
 * the call's signature src posted (every source, not just the first). */
static int get(sc_comm_t *c, uint64_t op, const ring_t *r, int64_t i, int first, int src, char *to, int64_t n, int64_t block, int nt)
{
    int rc;
    if ((rc = wait_line(c, post_line(c, src), stamp(op, i + 1), src))) return rc;
    if (first && (rc = check_meta(c, post_line(c, src), src, block))) return rc;
    sc_copy(to, slot(r, i), n, nt);
    post_line_val(ack_line(c, c->rank, src), stamp(op, i + 1));
    return SC_OK;
}

/* pairwise and tiled: step s sends to dst(s), receives from src(s); each
 * block moves in `per` tiles, event i = tile i % per of step i / per + 1.
 * With two slots or more the tile after next is posted before this one is
 * copied out, so the partner always has a tile to copy while we fill ours. */
typedef struct { int p, me, pow2; int64_t block, tile, per; } sched_t;
static int peer(const sched_t *k, int64_t i, int sign)
{
    int s = (int)(i / k->per) + 1;
    return k->pow2 ? k->me ^ s : (k->me + sign * s + k->p) % k->p;
}
static int64_t toff(const sched_t *k, int64_t i) { return i % k->per * k->tile; }
static int64_t tlen(const sched_t *k, int64_t i) { int64_t n = k->block - toff(k, i); return n < k->tile ? n : k->tile; }

static int steps(sc_comm_t *c, uint64_t op, const char *sb, char *rb, int64_t block, int64_t tile)
{
    if (tile > c->chan_bytes / 2) tile = c->chan_bytes / 2;   /* the ring holds two tiles at least */
    sched_t k = { c->size, c->rank, !(c->size & (c->size - 1)), block, tile > block ? block : tile, 1 };
    if (k.tile < 1) k.tile = 1;
    if (block > k.tile) k.per = (block + k.tile - 1) / k.tile;
    int64_t events = (int64_t)(k.p - 1) * k.per;
    int rc, nt = streams(c, 2 * (int64_t)k.p * k.p * block);
    ring_t w = ring(c, k.me, k.tile, 1 << 30);
    int ahead = w.nslots >= 2;
    for (int64_t i = 0, put_next = 0; i < events; i++) {
        for (; put_next <= i + ahead && put_next < events; put_next++) {
            int64_t old = put_next - w.nslots;
            int dst = peer(&k, put_next, +1);
            if ((rc = put(c, op, &w, put_next, old >= 0 ? peer(&k, old, +1) : -1,
                          sb + dst * block + toff(&k, put_next), tlen(&k, put_next), block))) return rc;
        }
        int src = peer(&k, i, -1);
        ring_t rr = ring(c, src, k.tile, 1 << 30);
        if ((rc = get(c, op, &rr, i, i % k.per == 0, src, rb + src * block + toff(&k, i), tlen(&k, i), block, nt))) return rc;
    }
    for (int64_t s = 0; s < k.p - 1; s++)    /* each reader's last event */
        owe(c, k.me, peer(&k, s * k.per, +1), stamp(op, (s + 1) * k.per));
    return SC_OK;
}

static int rendezvous(sc_comm_t *c, uint64_t op, const char *sb, char *rb, int64_t block)
{
    int p = c->size, me = c->rank, pow2 = !(p & (p - 1)), rc;
    sc_line_t *mine = post_line(c, me);
    uint64_t addr = (uintptr_t)sb;
    put_meta(c, mine, block);
    memcpy(mine->data, &addr, 8);
    post_line_val(mine, stamp(op, 1));
    for (int s = 1; s < p; s++) {
        int src = pow2 ? me ^ s : (me - s + p) % p;
        if ((rc = wait_line(c, post_line(c, src), stamp(op, 1), src))) return rc;
        if ((rc = check_meta(c, post_line(c, src), src, block))) return rc;
        memcpy(&addr, post_line(c, src)->data, 8);
        if ((rc = sc_read_peer(c, src, rb + src * block, addr + me * block, block))) return rc;
        post_line_val(ack_line(c, me, src), stamp(op, 1));
    }
    /* sendbuf is the user's again once every reader is done with it */
    for (int j = 1; j < p; j++) {
        int d = (me + j) % p;
        if ((rc = wait_line(c, ack_line(c, d, me), stamp(op, 1), d))) return rc;
    }
    return SC_OK;
}

static int all_at_once(sc_comm_t *c, uint64_t op, const char *sb, char *rb, int64_t block)
{
    int p = c->size, me = c->rank, rc, nt = streams(c, 2 * (int64_t)p * p * block);
    int64_t half = c->chan_bytes / 2, piece = half / (p - 1) & ~63LL;
    if (piece > block) piece = block;
    if (piece < 1) piece = 1;
    int64_t rounds = block ? (block + piece - 1) / piece : 1;
    for (int64_t k = 0; k < rounds; k++) {
        int64_t off = k * piece, n = block - off < piece ? block - off : piece;
        if (n < 0) n = 0;
        if (k >= 2)
            for (int j = 1; j < p; j++) {
                int d = (me + j) % p;
                if ((rc = wait_line(c, ack_line(c, d, me), stamp(op, k - 1), d))) return rc;
            }
        char *mine = chan_buf(c, me) + (k % 2) * half;
        if (k == 0) put_meta(c, post_line(c, me), block);
        for (int j = 1; j < p; j++) sc_copy(mine + (j - 1) * piece, sb + ((me + j) % p) * block + off, n, 0);
        post_line_val(post_line(c, me), stamp(op, k + 1));
        for (int s = 1; s < p; s++) {
            int w = (me - s + p) % p;
            if ((rc = wait_line(c, post_line(c, w), stamp(op, k + 1), w))) return rc;
            if (k == 0 && (rc = check_meta(c, post_line(c, w), w, block))) return rc;
            sc_copy(rb + w * block + off, chan_buf(c, w) + (k % 2) * half + (s - 1) * piece, n, nt);
            post_line_val(ack_line(c, me, w), stamp(op, k + 1));
        }
    }
    for (int j = 1; j < p; j++) owe(c, me, (me + j) % p, stamp(op, rounds));
    return SC_OK;
}

/* Bruck: rotate so block i is bound for rank + i, then at step m move the
 * blocks whose index has bit m to rank + m; finally block i came from
 * rank - i.  Blocks too large for the ring go in column pieces. */
static int bruck(sc_comm_t *c, uint64_t op, const char *sb, char *rb, int64_t block)
{
    int p = c->size, me = c->rank, rc = SC_OK, nt = streams(c, 2 * (int64_t)p * p * block);
    int64_t most = 0, piece = block, cap = c->chan_bytes / 2;
    for (int m = 1; m < p; m <<= 1) {
        int64_t cnt = 0;
        for (int i = 0; i < p; i++) cnt += (i & m) != 0;
        if (cnt > most) most = cnt;
    }
    if (most * block > SC_INLINE && most * piece > cap) piece = (cap / most) & ~63LL;
    if (piece < 1) piece = 1;
    char *tmp = malloc(block * p + 1);
    if (!tmp) return sc_fail(c, SC_ENOMEM, me, block * p, 0);
    for (int i = 0; i < p; i++) memcpy(tmp + i * block, sb + ((me + i) % p) * block, block);
    int64_t t = 0;
    int last[1024] = {0};
    for (int64_t off = 0; off < block || (block == 0 && off == 0); off += piece) {
        int64_t n = block - off < piece ? block - off : piece;
        for (int m = 1; m < p; m <<= 1, t++) {
            int dst = (me + m) % p, src = (me - m + p) % p;
            /* one slot geometry for the whole call: slots of different steps never overlap */
            ring_t w = ring(c, me, most * piece, 2), r = ring(c, src, most * piece, 2);
            if (t >= w.nslots) {
                /* event t - nslots went to the partner of that step */
                int64_t old = t - w.nslots, steps_per = 0;
                for (int mm = 1; mm < p; mm <<= 1) steps_per++;
                int od = (me + (1 << (old % steps_per))) % p;
                if ((rc = wait_line(c, ack_line(c, od, me), stamp(op, old + 1), od))) goto out;
            }
            if (t == 0) put_meta(c, post_line(c, me), block);
            char *o = slot(&w, t);
            for (int i = 0; i < p; i++) if (i & m) { memcpy(o, tmp + i * block + off, n); o += n; }
            post_line_val(post_line(c, me), stamp(op, t + 1));
            if ((rc = wait_line(c, post_line(c, src), stamp(op, t + 1), src))) goto out;
            if (off == 0 && (rc = check_meta(c, post_line(c, src), src, block))) goto out;
            const char *in = slot(&r, t);
            for (int i = 0; i < p; i++) if (i & m) { memcpy(tmp + i * block + off, in, n); in += n; }
            post_line_val(ack_line(c, me, src), stamp(op, t + 1));
            last[dst] = (int)(t + 1);
        }
        if (block == 0) break;
    }
    for (int d = 0; d < p; d++) if (last[d]) owe(c, me, d, stamp(op, last[d]));
    for (int i = 0; i < p; i++) sc_copy(rb + ((me - i + p) % p) * block, tmp + i * block, block, nt);
out:
    free(tmp);
    return rc;
}

int sc_alltoall(sc_comm_t *c, int alg, const char *sb, char *rb, int64_t block)
{
    if (aborted(c)) return SC_EABORT;
    uint64_t op = ++c->op;
    int me = c->rank, rc = SC_OK;
    c->sig = sig(op, alg, A2A_ROOT);
    if (c->size > 1) {
        if (alg != BRUCK && (rc = drain(c, me))) return rc;
        switch (alg) {
        case BRUCK: rc = drain(c, me); if (!rc) rc = bruck(c, op, sb, rb, block); return rc;
        case ALL_AT_ONCE: rc = all_at_once(c, op, sb, rb, block); break;
        case PAIRWISE:
            rc = c->cma && c->cma_bytes > 0 && block >= c->cma_bytes ? rendezvous(c, op, sb, rb, block)
                                                 : steps(c, op, sb, rb, block, c->chan_bytes / 2);
            break;
        default: rc = steps(c, op, sb, rb, block, c->tile_bytes); break;
        }
    }
    if (!rc) sc_copy(rb + me * block, sb + me * block, block, streams(c, 2 * (int64_t)c->size * c->size * block));
    return rc;
}
