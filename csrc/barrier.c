/* Barrier, paper 001 section 4.1: a gather phase up a tree, a release
 * phase down it.
 *  original      MVAPICH-1.1 dual queue: packed gather and release queues,
 *                rank 0 polls every entry (false sharing included).
 *  padded        one queue, one line per rank, used for gather (k = 1) and
 *                release (k = 2); flat tree under rank 0.
 *  hierarchical  the same queue over a node leader / socket leaders /
 *                children tree planned by Python from the topology.
 *  all_to_all    no tree: every rank posts its arrival and waits for all
 *                others' (for ranks that share CPUs, see all_to_all()). */
#include "sc_internal.h"

static int original(sc_comm_t *c, uint64_t op)
{
    sc_line_t *q = line_at(c, c->off_q, 0);
    _Atomic uint64_t *gq = (_Atomic uint64_t *)(c->base + c->off_q + SC_LINE), *rq = gq + c->size;
    uint64_t s = stamp(op, 1);
    int rc;
    if (c->rank) {
        post_val(&gq[c->rank], &q->wq, s);
        return wait_val(c, &rq[c->rank], &q->wq, s, 0);
    }
    for (int r = 1; r < c->size; r++)
        if ((rc = wait_val(c, &gq[r], &q->wq, s, r))) return rc;
    for (int r = 1; r < c->size; r++) post_val(&rq[r], &q->wq, s);
    return SC_OK;
}

static int tree(sc_comm_t *c, int alg, uint64_t op)
{
    int parent = c->bar_parent[alg], n = c->bar_nchild[alg], rc;
    const int32_t *child = c->bar_child[alg];
    sc_line_t *me = bar_line(c, c->rank);
    for (int i = 0; i < n; i++)
        if ((rc = wait_line(c, bar_line(c, child[i]), stamp(op, 1), child[i]))) return rc;
    if (parent >= 0) {
        post_line_val(me, stamp(op, 1));
        if ((rc = wait_line(c, bar_line(c, parent), stamp(op, 2), parent))) return rc;
    }
    if (n) post_line_val(me, stamp(op, 2));
    return SC_OK;
}

/* With two ranks per CPU a tree costs each CPU two hand-offs per barrier:
 * the child arrives and must give the CPU back to its parent, who alone can
 * see the other CPU's arrivals.  Here whoever arrives last on a CPU sees
 * everything itself.  Python orders the waits: the bar_mates ranks sharing
 * our CPUs first, with the normal policy (when oversubscribed: yield at
 * once, they need the CPU to arrive), then the others, spinning for
 * spin_far_ns: by then no rank of ours needs this CPU, so one hand-off per
 * CPU per barrier remains.  No release phase is needed: stamps only grow,
 * so a rank already posting in a later call still counts as arrived. */
static int all_to_all(sc_comm_t *c, uint64_t op)
{
    const int32_t *order = c->bar_child[3];
    uint64_t s = stamp(op, 1);
    post_line_val(bar_line(c, c->rank), s);
    for (int i = 0; i < c->bar_nchild[3]; i++) {
        sc_line_t *l = bar_line(c, order[i]);
        int rc = wait_spin(c, &l->val, &l->wq, s, order[i], i < c->bar_mates ? c->spin_ns : c->spin_far_ns);
        if (rc) return rc;
    }
    return SC_OK;
}

int sc_barrier(sc_comm_t *c, int alg)
{
    if (aborted(c)) return SC_EABORT;
    uint64_t op = ++c->op;
    if (c->size == 1) return SC_OK;
    return alg == 0 ? original(c, op) : alg == 3 ? all_to_all(c, op) : tree(c, alg, op);
}
