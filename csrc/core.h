/* The collective engine's interface to Python (also the cffi cdef: plain
 * declarations only).  One sc_comm_t per rank per communicator: Python fills
 * the plan fields once, C owns the shared layout and runs every phase. */
#define SC_LINE 128
#define SC_INLINE 96
#define SC_SLOTS 8       /* inline bcast slots per writer: a root may run this many calls ahead */

#define SC_OK 0
#define SC_EABORT -1     /* a peer raised or erred: abort word says who */
#define SC_EDEAD -2      /* a peer process died */
#define SC_EMISMATCH -3  /* a peer's call differs (err_code: 1 collective/algorithm, 2 root, 3 bytes; err_a
                            ours, err_b theirs); seen on one side, so the job is aborted */
#define SC_EDIFFER -5    /* the same, found by sc_check on every rank: the communicator stays usable */
#define SC_ENOMEM -4
#define SC_FALLBACK -100 /* fast entry declined: take the checked Python path */
#define SC_NCLASS 65     /* size classes: bit length of the byte count */

typedef struct sc_line sc_line_t;

typedef struct sc_comm {
    /* plan, set by Python before sc_layout */
    int32_t rank;
    int32_t size;
    int64_t chan_bytes;      /* per-rank channel: eager buffer and chunk ring */
    int64_t chunk_bytes;     /* pipeline chunk (bcast, pairwise) */
    int64_t tile_bytes;      /* alltoall tile (cache-sized) */
    int64_t stripe_bytes;    /* NUMA-striped bcast buffer */
    int32_t stripe_slots;    /* its segments; slot i lives on node i mod nodes */
    int32_t bcast_k;         /* limited bcast: readers per segment */
    int64_t nt_bytes;        /* calls whose buffers, all ranks together, exceed this stream past the cache */
    int32_t check;           /* cross-rank argument check on every call */
    int64_t cma_bytes;       /* alltoall blocks this large: single copy (if cma) */
    int32_t cma;             /* every rank can read its peers' memory (sc_probe_cma) */
    int32_t closed;          /* set by Python when the communicator may not be used: fast entries decline */
    /* wait policy (ns): spin, then sched_yield, then futex sleep */
    int64_t spin_ns;
    int64_t spin_far_ns;     /* spin for a rank on other CPUs once ours need none (all_to_all barrier) */
    int64_t yield_ns;
    int64_t sleep_ns;
    int64_t liveness_ns;
    /* barrier plans, index = algorithm: trees (1 padded, 2 hierarchical), and
     * for all_to_all (3) the ranks to wait for, the bar_mates sharing our CPUs first */
    int32_t bar_parent[4];
    int32_t bar_nchild[4];
    int32_t *bar_child[4];
    int32_t bar_mates;
    /* layout, computed by sc_layout */
    int64_t off_state;
    int64_t off_mutex;
    int64_t off_bar;
    int64_t off_q;
    int64_t off_post;
    int64_t off_slot;
    int64_t off_ack;
    int64_t off_chk;
    int64_t off_chan;
    int64_t off_stripe;
    int64_t total;
    /* attached */
    char *base;
    /* automatic choice per collective (0 barrier, 1 bcast, 2 alltoall) and size class */
    int8_t auto_alg[195];
    /* set by the Python fast entries: release the GIL once a wait goes slow */
    void *gil_release;
    void *gil_saved;
    /* private state */
    uint64_t op;
    uint64_t nchecks;        /* sc_check calls: picks its line set */
    int64_t sig;             /* this call's signature (sig() in sc_internal.h) */
    uint64_t *pend;          /* [(size + 1) * (SC_SLOTS + 1) * size] acks owed before reuse */
    int32_t err_rank;
    int32_t err_code;
    int64_t err_a;
    int64_t err_b;
} sc_comm_t;

int64_t sc_layout(sc_comm_t *c);
int sc_attach(sc_comm_t *c, char *base);
int sc_init_shared(sc_comm_t *c);
int sc_register(sc_comm_t *c, int32_t pid);
void sc_deregister(sc_comm_t *c);
void sc_set_abort(sc_comm_t *c, int32_t rank, int32_t code);
int sc_probe_cma(sc_comm_t *c);

int sc_barrier(sc_comm_t *c, int alg);

int sc_check(sc_comm_t *c, int coll, int alg, int64_t root, int64_t nbytes);
int sc_bcast(sc_comm_t *c, int alg, char *buf, int64_t nbytes, int32_t root);
int sc_alltoall(sc_comm_t *c, int alg, const char *sbuf, char *rbuf, int64_t block);

void sc_copy(char *dst, const char *src, int64_t n, int nt);

void *sc_py_entry(int i);
