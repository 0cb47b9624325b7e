/* Bcast, paper 001 sections 4.2 and 5.2.  Protocol by size (paper 004):
 * up to SC_INLINE bytes ride inside the writer's flag line, the rest goes
 * through a ring of chunks in shared memory, so the writer fills chunk i+1
 * while readers copy chunk i.  Event k of a call is chunk k-1 posted.
 *  binomial  log p tree, each inner rank forwards through its own ring.
 *  original  the root's ring (on the root's node), every rank copies out;
 *            with one reader, mid sizes and cross-memory attach, by
 *            rendezvous: the reader copies straight out of the root's
 *            buffer (process_vm_readv) and the root returns once it has.
 *  limited   chunks grouped in rounds of G = ceil((p-1)/k) segments; reader
 *            group g reads segment (g + s) mod G at step s, so at most k
 *            readers share a segment at any step.
 *  numa      limited over the striped buffer: slot i on node i mod nodes. */
#include "sc_internal.h"

enum { BINOMIAL, ORIGINAL, LIMITED, NUMA };

/* A call's view of channel ch: where its chunks go, which line carries its
 * signature, and which debt set guards that memory. */
typedef struct { char *base; int64_t chunk, stride, nslots, nchunks, nbytes; sc_line_t *meta; int set; } ring_t;

static ring_t ring(sc_comm_t *c, int ch, int64_t nbytes, int64_t chunk, uint64_t op)
{
    ring_t r = { .nbytes = nbytes, .meta = post_line(c, ch), .set = SC_SLOTS };
    if (nbytes <= SC_INLINE) {
        r.meta = slot_line(c, ch, op);
        r.set = (int)(op % SC_SLOTS);
        r.base = r.meta->data;
        r.chunk = r.stride = SC_INLINE;
        r.nslots = 1;
    } else if (ch == c->size) {
        r.base = c->base + c->off_stripe;
        r.stride = c->stripe_bytes / c->stripe_slots;
        r.chunk = chunk < r.stride ? chunk : r.stride;
        r.nslots = c->stripe_slots;
    } else {
        r.base = chan_buf(c, ch);
        r.chunk = r.stride = chunk < c->chan_bytes / 2 ? chunk : c->chan_bytes / 2;
        r.nslots = c->chan_bytes / r.chunk;
    }
    r.nchunks = nbytes ? (nbytes + r.chunk - 1) / r.chunk : 1;   /* an empty call still posts once */
    return r;
}
/* Chunks small enough that a message of a few chunks still pipelines
 * (the root fills chunk i+1 while readers copy chunk i), never below 8 KiB
 * where a hand-off would cost more than the copy it overlaps. */
static int64_t pipe_chunk(sc_comm_t *c, int64_t nbytes)
{
    int64_t ch = (nbytes / 8 + 63) & ~63LL;
    if (ch < 8192) ch = 8192;
    return ch < c->chunk_bytes ? ch : c->chunk_bytes;
}

static char *slot(const ring_t *r, int64_t i) { return r->base + (i % r->nslots) * r->stride; }
static int64_t len(const ring_t *r, int64_t i) { int64_t n = r->nbytes - i * r->chunk; return n < r->chunk ? n : r->chunk; }

/* Wait until every rank in readers[] has acked `target` on channel ch. */
static int wait_acks(sc_comm_t *c, const int *readers, int n, int ch, uint64_t target)
{
    for (int i = 0; i < n; i++) {
        int rc = wait_line(c, ack_line(c, readers[i], ch), target, readers[i]);
        if (rc) return rc;
    }
    return SC_OK;
}

static int binomial(sc_comm_t *c, uint64_t op, char *buf, int64_t nbytes, int root)
{
    int p = c->size, vr = (c->rank - root + p) % p, parent = -1, kids[64], nk = 0, rc, nt = streams(c, p * nbytes);
    int low = vr ? vr & -vr : 1 << 30;
    if (vr) parent = (vr - low + root) % p;
    for (int m = 1; m < low && vr + m < p; m <<= 1) kids[nk++] = (vr + m + root) % p;
    int64_t chunk = pipe_chunk(c, nbytes);
    ring_t me = ring(c, c->rank, nbytes, chunk, op), up = ring(c, parent < 0 ? root : parent, nbytes, chunk, op);
    if (nk && (rc = drain_set(c, c->rank, me.set))) return rc;
    for (int64_t i = 0; i < me.nchunks; i++) {
        const char *src = buf + i * me.chunk;
        if (parent >= 0) {
            if ((rc = wait_line(c, post_line(c, parent), stamp(op, i + 1), parent))) return rc;
            if (i == 0 && (rc = check_meta(c, up.meta, parent, nbytes))) return rc;
            src = slot(&up, i);
        }
        if (nk) {
            if (i >= me.nslots && (rc = wait_acks(c, kids, nk, c->rank, stamp(op, i - me.nslots + 1)))) return rc;
            if (i == 0) put_meta(c, me.meta, nbytes);
            sc_copy(slot(&me, i), src, len(&me, i), 0);
            post_line_val(post_line(c, c->rank), stamp(op, i + 1));
            src = slot(&me, i);
        }
        if (parent >= 0) {
            if (nk) post_line_val(ack_line(c, c->rank, parent), stamp(op, i + 1));
            sc_copy(buf + i * me.chunk, src, len(&me, i), nt);
            if (!nk) post_line_val(ack_line(c, c->rank, parent), stamp(op, i + 1));
        }
    }
    for (int i = 0; i < nk; i++) owe_set(c, c->rank, me.set, kids[i], stamp(op, me.nchunks));
    return SC_OK;
}

/* Root side of original/limited/numa: fill the ring in order; a slot is
 * reused once every reader has acked the round that last used it. */
static int fill(sc_comm_t *c, uint64_t op, const char *buf, const ring_t *r, int ch, int root, int64_t g)
{
    int readers[1024], n = 0, rc;
    for (int q = 0; q < c->size; q++) if (q != root) readers[n++] = q;
    if ((rc = drain_set(c, ch, r->set))) return rc;
    for (int64_t i = 0; i < r->nchunks; i++) {
        if (i >= r->nslots) {
            int64_t j = i - r->nslots, end = (j / g + 1) * g;
            if ((rc = wait_acks(c, readers, n, ch, stamp(op, end < r->nchunks ? end : r->nchunks)))) return rc;
        }
        if (i == 0) put_meta(c, r->meta, r->nbytes);
        sc_copy(slot(r, i), buf + i * r->chunk, len(r, i), 0);
        post_line_val(post_line(c, ch), stamp(op, i + 1));
    }
    return SC_OK;
}

/* Reader side: rounds of g chunks, this reader's group starting at
 * segment `first` of each round and rotating; one ack per round. */
static int drink(sc_comm_t *c, uint64_t op, char *buf, const ring_t *r, int ch, int root, int64_t g, int64_t first)
{
    int rc, nt = streams(c, c->size * r->nbytes);
    for (int64_t base = 0; base < r->nchunks; base += g) {
        int64_t n = r->nchunks - base < g ? r->nchunks - base : g;
        for (int64_t s = 0; s < g; s++) {
            int64_t i = base + (first + s) % g;
            if (i - base >= n) continue;
            if ((rc = wait_line(c, post_line(c, ch), stamp(op, i + 1), root))) return rc;
            if (base == 0 && s == 0 && (rc = check_meta(c, r->meta, root, r->nbytes))) return rc;
            sc_copy(buf + i * r->chunk, slot(r, i), len(r, i), nt);
        }
        post_line_val(ack_line(c, c->rank, ch), stamp(op, base + n));
    }
    return SC_OK;
}

static int flat(sc_comm_t *c, int alg, uint64_t op, char *buf, int64_t nbytes, int root)
{
    int p = c->size, vr = (c->rank - root + p) % p, ch = alg == NUMA ? p : root;
    int64_t k = alg == ORIGINAL || c->bcast_k < 1 ? p : c->bcast_k, g = alg == ORIGINAL ? 1 : (p - 1 + k - 1) / k;
    ring_t r = ring(c, ch, nbytes, pipe_chunk(c, nbytes), op);
    if (g > 1 && nbytes > SC_INLINE) {
        /* segments of one round must fit twice in the ring (double buffering) */
        int64_t seg = (nbytes + g - 1) / g;
        seg = (seg + 63) & ~63LL;
        if (r.nslots < 2 * g) g = r.nslots / 2 > 0 ? r.nslots / 2 : 1;
        if (seg < r.chunk) r = ring(c, ch, nbytes, seg, op);
    }
    if (nbytes <= SC_INLINE) g = 1;
    int rc = c->rank == root ? fill(c, op, buf, &r, ch, root, g)
                             : drink(c, op, buf, &r, ch, root, g, ((vr - 1) / k) % g);
    if (rc) return rc;
    /* every rank records the readers' debts: for the stripe any rank may be the next writer */
    if (c->rank == root || ch == p)
        for (int q = 0; q < p; q++)
            if (q != root) owe_set(c, ch, r.set, q, stamp(op, r.nchunks));
    return SC_OK;
}

static int rendezvous(sc_comm_t *c, uint64_t op, char *buf, int64_t nbytes, int root)
{
    sc_line_t *l = post_line(c, root);
    uint64_t addr = (uintptr_t)buf;
    int rc;
    if (c->rank == root) {
        if ((rc = drain(c, root))) return rc;
        put_meta(c, l, nbytes);
        memcpy(l->data, &addr, 8);
        post_line_val(l, stamp(op, 1));
        for (int r = 0; r < c->size; r++)
            if (r != root && (rc = wait_line(c, ack_line(c, r, root), stamp(op, 1), r))) return rc;
        return SC_OK;
    }
    if ((rc = wait_line(c, l, stamp(op, 1), root))) return rc;
    if ((rc = check_meta(c, l, root, nbytes))) return rc;
    memcpy(&addr, l->data, 8);
    if ((rc = sc_read_peer(c, root, buf, addr, nbytes))) return rc;
    post_line_val(ack_line(c, c->rank, root), stamp(op, 1));
    return SC_OK;
}

/* Rendezvous pays with one reader and mid sizes, where staged copies read
 * lines still modified in the root's cache (2 ranks, 256 KiB: 20 vs 31 us);
 * from four pipeline chunks up the pipeline wins (1 MiB: 37 vs 81 us), and
 * with more readers the root waiting for all of them loses everywhere. */
static int use_rendezvous(sc_comm_t *c, int64_t nbytes)
{
    return c->size == 2 && c->cma && c->cma_bytes > 0 && nbytes >= c->cma_bytes && nbytes < 4 * c->chunk_bytes;
}

int sc_bcast(sc_comm_t *c, int alg, char *buf, int64_t nbytes, int32_t root)
{
    if (aborted(c)) return SC_EABORT;
    uint64_t op = ++c->op;
    c->sig = sig(op, alg, root);
    if (c->size == 1) return SC_OK;
    if (alg == ORIGINAL && use_rendezvous(c, nbytes)) return rendezvous(c, op, buf, nbytes, root);
    if (alg == BINOMIAL) return binomial(c, op, buf, nbytes, root);
    return flat(c, alg, op, buf, nbytes, root);
}
