/* The engine's interface to Python (also the cffi cdef: plain declarations
 * only).  One sc_comm_t per rank per communicator: Python fills the plan
 * fields once, C owns the shared layout and runs every collective as one
 * compiled program (sc_exec_owned; opcodes below, built by shmcoll/compile.py). */
#define SC_LINE 128
#define SC_INLINE 4096   /* inline payload of a slot: a writer's slots rotate over SC_SLOTS calls, so it runs
                            that many calls ahead of its readers (a staged ring waits for the last call's) */
#define SC_SLOT_TINY 16  /* a slot's header line holds its writer's arrival record of the call that filled it
                            (a reader's check finds it there) and a payload of up to this many bytes; larger
                            payloads go in the slot's own SC_INLINE bytes, apart */
#define SC_SLOT_BYTES 4160 /* a slot's payload stride: SC_INLINE and a line, so slots sit at different page offsets */
#define SC_SLOTS 8       /* inline slot lines per writer: a root may run this many calls ahead */
#define SC_PAST 8        /* arrival records kept per rank: a rank that waited on no one checks its neighbours within this many calls */
#define SC_LOOK 4        /* ... looking at their records every this many such calls (exec.c, recheck) */
/* Twins: one call's two programs (the automatic choice by single copy and
 * its staged alternative), header word 7 of both pointing at this block of
 * int64 words, one per rank (Python-owned): rank 0 picks a program per
 * call from the times it measured, publishes its pick in its arrival
 * record, and every rank runs it (csrc/twins.c). */
enum { SC_TW_PROG = 0, SC_TW_LAST = 2, SC_TW_PREV = 4, SC_TW_RUNS = 6, SC_TW_CUR = 8, SC_TW_SINCE = 9, SC_TW_TRIAL = 10,
       SC_TW_LEARNT = 11, SC_TW_SEEN = 12, SC_TW_CHECKED = 14, SC_TW_BEFORE = 15, SC_TW_EARLIER = 17, SC_TW_BACK = 19,
       SC_TW_WORDS = 20 };

#define SC_OK 0
#define SC_EABORT -1     /* the job was aborted: abort word says who and why */
#define SC_EDEAD -2      /* a peer process died or exited (err_code 2 died, 4 exited) */
#define SC_EMISMATCH -3  /* a peer's call differs (err_code field, err_when call, err_a ours, err_b theirs) */
#define SC_ENOMEM -4
#define SC_EDIFFER -5    /* the same, found by the check round on every rank: the communicator stays usable */
#define SC_EBUSY -6      /* another thread of this rank is inside a collective on this communicator */
#define SC_ETIMEOUT -7   /* waited longer than timeout_ns for rank err_rank */
#define SC_EINTR -8      /* a signal handler raised (KeyboardInterrupt) while waiting */
#define SC_ECMA -9       /* process_vm_readv (err_a 0) or _writev (1) with err_rank failed with errno err_b */
#define SC_EKERNEL -10  /* no reduction kernel for a program's op and type (a planning bug): the job is aborted */
#define SC_ETRUNCATE -11 /* a receive buffer shorter than its message (point-to-point) */
#define SC_EAGAIN -12    /* a point-to-point send found no room in its ring yet */
#define SC_PENDING -13   /* a nonblocking call's wait would block: its state is kept, resume it later (csrc/nbc.c) */
#define SC_FALLBACK -100 /* fast entry declined: take the checked Python path */
#define SC_TAG_UB 536870911  /* point-to-point tags 0 .. this (MPICH's) */

/* The instruction set (opcodes, operand fields, flags, spaces, debt sets,
 * program header, signature, fast key): isa.h, generated from shmcoll/isa.py. */
/* Reduction kernels (csrc/reduce.c), named by word 0 of SC_OP_REDUCE
 * (isa.h SC_REDUCE_KOP, _TYPE, _FORM; INDEX64, ITEM and INDEX_AT for
 * MINLOC/MAXLOC pairs, whose type is the value's; STREAMED for the
 * others: d is written by non-temporal stores (d = a op b, d op= b and
 * the narrowing of half types). */
enum { SC_R_SUM = 1, SC_R_PROD, SC_R_MIN, SC_R_MAX, SC_R_LAND, SC_R_LOR, SC_R_LXOR, SC_R_BAND, SC_R_BOR, SC_R_BXOR,
       SC_R_MINLOC, SC_R_MAXLOC, SC_R_NOPS };
enum { SC_T_I8 = 1, SC_T_I16, SC_T_I32, SC_T_I64, SC_T_U8, SC_T_U16, SC_T_U32, SC_T_U64, SC_T_F32, SC_T_F64,
       SC_T_LD, SC_T_C64, SC_T_C128, SC_T_CLD, SC_T_BOOL, SC_T_F16, SC_T_BF16, SC_T_NTYPES };
/* Forms: d = a op b; d op= b; half types accumulate in float32:
 * d(f32) = a op b, d(f32) op= b, then d = a(f32) rounded to nearest even. */
enum { SC_F_SAME = 0, SC_F_INTO = 1, SC_F_WIDEN = 2, SC_F_ACC = 3, SC_F_NARROW = 4, SC_F_N = 5 };
/* Debt sets (isa.h SC_SET_*): the ring, the stripe, one per inline slot line. */
enum { SC_NSETS = SC_SET_SLOT + SC_SLOTS };

typedef struct sc_line sc_line_t;

/* The fast entries' program cache, keyed as isa.h SC_K_* lays out:
 * collective (| a built-in op << SC_KEY_OP_SHIFT), algorithm or
 * SC_KEY_NONE for automatic, root, bytes of the first and second buffer,
 * item size or dtype, sc_fingerprint of a v-variant's counts and
 * displacements or 0.  A v-variant's program ends with its counts and
 * displacements (header word SC_H_COUNTS: where), which the entry
 * compares exactly before running it. */
#define SC_CACHE 256
#define SC_WAYS 4        /* entries per set of the cache (pyfast.c sc_cache_slot) */
#define SC_GIL_NS 20000
#define SC_NB 16         /* neighbours a rank may check: a star's centre up to 17 ranks */
typedef struct { int64_t key[SC_KEY]; const int64_t *prog; } sc_entry_t;

typedef struct sc_peers sc_peers_t;
typedef struct sc_comm sc_comm_t;
typedef struct sc_p2p sc_p2p_t;   /* a rank's private point-to-point state (csrc/p2p.c) */

/* One call's run through the executor's stages (exec.c), kept between
 * steps when it is nonblocking: the program, its buffers, the stage and
 * instruction to go on from, and what the stages carry (a twin's block,
 * pick and start time; whether the call ends with a look). */
typedef struct {
    const int64_t *prog;
    char *sbuf, *rbuf;
    int64_t *twin;
    int64_t t0;
    int32_t stage, pc, v, look;
} sc_run_t;

/* A nonblocking or persistent collective (csrc/nbc.c): its program,
 * buffers and scratch (c->tmp while it runs), set by Python; a link in its
 * communicator's queue (one program at a time, in call order), its run,
 * and once done its rc and the failure's fields (as sc_comm_t's err_*).  wait: the sc_wait_t it last
 * stopped at, since: when it first stopped there (the stall timeout),
 * next_live/next_check: when a stopped step next checks liveness and the
 * awaited record.  Python owns the memory until done. */
typedef struct sc_nbc sc_nbc_t;
struct sc_nbc {
    const int64_t *prog;         /* the program as started (a twin's run goes on with its pick) */
    char *sbuf, *rbuf, *tmp;
    int32_t background;          /* start the progress thread for it (a large call: it overlaps the caller's work) */
    uint32_t done;               /* 1 once done (2: not yet, and a waiter sleeps on it) */
    int32_t fast;                /* it ended inline in its start, with no error: nothing else to collect */
    int32_t active;              /* a persistent request's: started and not yet completed (pyfast.c pstart) */
    sc_nbc_t *next;
    sc_run_t run;
    int32_t rc;
    int32_t err_rank, err_code, err_when;
    uint64_t err_call;
    int64_t err_a, err_b;
    int64_t since, next_live, next_check;
    int64_t wait[10];
};
typedef struct sc_nbq sc_nbq_t;

/* The one way up from the engine's waits into the Python layer
 * (csrc/core.c wait_slow calls it; csrc/pyfast.c sets it for the length
 * of a call and clears it after; all NULL outside a Python entry, and a
 * wait then neither lets the GIL go nor polls).  A wait that has lasted
 * the comm's gil_ns, or is about to sleep, calls release() once and keeps
 * what it returns in saved: the GIL is let go.  While it waits it calls
 * poll(c) every 10 ms, which runs Python's signal handlers (taking the GIL
 * back from saved and letting it go again) and returns nonzero when one
 * raised: the wait fails with SC_EINTR.  pyfast.c takes the GIL back from
 * saved before it touches a Python object again. */
typedef struct {
    void *(*release)(void);
    int (*poll)(sc_comm_t *c);
    void *saved;
} sc_hooks_t;

/* One rank's context over a communicator, by concern (anonymous groups:
 * the fields keep their names).  The executor's per-call fields (the call
 * state, then the plan's and the layout's it reads) come before the cache,
 * the twins' and the errors' state, which it touches only on their paths. */
struct sc_comm {
    struct {                 /* plan, set by Python before sc_layout */
        int32_t rank;
        int32_t size;
        int64_t chan_bytes;      /* per-rank channel: the staging ring */
        int64_t stripe_bytes;    /* NUMA-striped bcast buffer */
        int32_t stripe_slots;    /* its segments; slot i lives on node i mod nodes */
        int32_t check;           /* cross-rank agreement round on every call (SHMCOLL_CHECK) */
        int32_t cma;             /* every rank can read its peers' memory (sc_probe_cma) */
        int32_t closed;          /* set by Python when the communicator may not be used: fast entries decline */
#define SC_CLOSED_PENDING 2      /* closed's bit for nonblocking calls started and not collected (nonblocking.py) */
        uint64_t call_base;      /* the first call's number (SHMCOLL_CALL_BASE) */
        /* wait policy (ns): spin, then sched_yield, then futex sleep */
        int64_t spin_ns;
        int64_t spin_far_ns;     /* waits flagged "spin long": ranks on other CPUs once ours need none */
        int64_t yield_ns;
        int64_t sleep_ns;
        int64_t liveness_ns;
        int64_t timeout_ns;      /* a wait longer than this raises SC_ETIMEOUT (0: never) */
    };
    struct {                 /* shared memory layout, computed by sc_layout, and where it is mapped */
        int64_t off_state;
        int64_t off_mutex;
        int64_t off_post;
        int64_t off_ack;
        int64_t off_slot, off_slot_data;
        int64_t off_rec;
        int64_t off_queue;
        int64_t off_claim;
        int64_t off_chan;
        int64_t off_stripe;
        int64_t total;
        char *base;
    };
    struct {                 /* Python-owned memory: scratch (grown by the planner), debts (SC_NSETS x size), acks seen */
        char *tmp;
        int64_t tmp_bytes;
        int32_t *debt_who;
        uint64_t *debt_cnt;
        uint64_t *acked;         /* per rank: the (call, count) its ack line was last seen at (exec.c wait_ack) */
        uint64_t debt_call[SC_NSETS];
        int32_t debt_n[SC_NSETS];
        /* traffic record: bytes this rank read from each source, then the
         * messages it read from each (NULL: off) */
        int64_t *traffic;
    };
    struct {                 /* this rank's calls: the executor's per-call state */
        uint64_t call;           /* this call's number: 64 bits, compared by signed difference */
        uint64_t sig[2];         /* this call's signature (isa.h SC_SIG_*) */
        uint64_t prev[2];        /* the previous call's */
        uint64_t hist;           /* a hash of every call's before the previous */
        int32_t pending;         /* neighbours with unchecked calls (bit k: nb[k]) */
        int32_t quiet;           /* calls with pending since the last look, mod SC_LOOK (a look when 0) */
        int32_t busy;
        int32_t owe;             /* this rank's post line went out unfenced: its sleepers are still to be checked */
        sc_peers_t *peers;       /* the peers' arenas as mapped here (csrc/peers.c), made on first use */
        int64_t direct;          /* bytes moved to or from peers' arenas by plain copies, or folded where they lie */
    };
    struct {                 /* records to recheck (exec.c recheck) */
        uint64_t due[SC_NB];     /* per neighbour to check (nb), if pending: the last call whose record of it is unchecked */
        uint64_t since[SC_NB];   /* ... and the first */
        int32_t nb[SC_NB];       /* the ranks this one checks when it did not wait on them (compile.checks) */
        int32_t nnb;
    };
    struct {                 /* the way up into Python (sc_hooks_t) */
        sc_hooks_t hooks;
        int64_t gil_ns;          /* let the GIL go once a wait lasted this (SC_GIL_NS: the rank has one thread, else 0) */
    };
    struct {                 /* rank 0's twins (twins.c) */
        /* twin_first..twin_last, if twin_due, the twin calls not yet
         * known to be past every rank; the twin calls whose ranks' times
         * are still to be read (a ring: pend_n from pend_head; Python
         * empties it with the programs) */
        uint64_t twin_first, twin_last;
        int32_t twin_due, pend_head, pend_n, pend_pad;
        uint64_t pend_call[SC_PAST];
        int64_t *pend_twin[SC_PAST];
        int32_t pend_variant[SC_PAST];
    };
    struct {                 /* the last failure, for Python to name (device.failure) */
        int32_t err_rank;
        int32_t err_code;
        int32_t err_when;        /* mismatches: 0 this call, 1 the previous call, 2 an earlier one, 3 calls out of step */
        uint64_t err_call;       /* ... and the oldest call it may be in: the job is aborted from there */
        int64_t err_a;
        int64_t err_b;
    };
    struct {                 /* point-to-point (csrc/p2p.c): set by Python before sc_layout, then laid out */
        int64_t p2p_ring_bytes;  /* each ordered pair's ring */
        int64_t p2p_eager_bytes; /* messages up to this go inline in the ring, larger by rendezvous */
        int64_t p2p_queue_bytes; /* unexpected messages a receiver keeps before it stops draining a ring */
        int64_t off_p2p;         /* doorbells, then each pair's head and tail lines */
        int64_t off_p2p_ring;
        sc_p2p_t *p2p;
        int32_t p2p_pending;     /* Python keeps nonblocking calls pending (sends queued, receives posted) */
#define SC_P2P_SENDS 1           /* p2p_pending's bit of queued sends: the fast entries decline (Irecv: posts) */
#define SC_P2P_RECVS 2           /* its bit of posted receives */
        int32_t p2p_pad;
        char *side_dst;          /* a copy this thread makes once it has offered a shared copy (p2p.c gatherv's own */
        const char *side_src;    /* piece: made while the sender writes), then clears; side_n 0: none */
        int64_t side_n;
    };
    struct {                 /* the fast entries' program cache (pyfast.c) */
        sc_entry_t cache[SC_CACHE];
        sc_entry_t *last;        /* the entry the last fast call found (pyfast.c lookup) */
        uint32_t cache_turn;     /* which entry of a full set the next install takes */
        sc_nbc_t *nb_spare;      /* Python's: the state a nonblocking call's C start takes (NULL: none free) */
    };
    struct {                 /* lifetime, after everything a call reads, so no per-call field moves */
        /* the world's abort word, for a communicator made from it (NULL:
         * this is the world): a slow wait here fails once the job is aborted */
        uint32_t *job_abort;
        void *holder;            /* the thread that holds this rank's liveness mutex (sc_register, sc_release) */
    };
    struct {                 /* nonblocking collectives (nbc.c) */
        sc_nbc_t *nbc;           /* the call a step runs without blocking: a wait that would block stops it */
        sc_nbq_t *nbq;           /* the queue of started calls and the progress thread, made on first use */
        int32_t nb_drivers;      /* threads in sc_nb_drive, which sc_nb_stop waits out before the queue goes */
        int32_t nb_stopping;     /* set by sc_nb_stop before it waits them out: a driver that sees it leaves */
    };
};

int64_t sc_layout(sc_comm_t *c);
int sc_attach(sc_comm_t *c, char *base);
int sc_init_shared(sc_comm_t *c);
int sc_register(sc_comm_t *c, int32_t pid, int32_t tracer);
int sc_deregister(sc_comm_t *c, int ok);
void sc_release(sc_comm_t *c);
void sc_peers_close(sc_comm_t *c);
uint64_t sc_calls_of(sc_comm_t *c, int32_t r);
int sc_rank_state(sc_comm_t *c, int32_t rank);
int sc_word_reached(uint64_t word, uint64_t call);   /* a word wait's test (sc_internal.h), for the tests */
void sc_set_abort(sc_comm_t *c, int32_t rank, int32_t code);
void sc_abort_self(sc_comm_t *c, int32_t code);
void sc_mismatch_of(sc_comm_t *c, int32_t rank, int64_t *out);
int sc_probe_cma(sc_comm_t *c);

int sc_last_look(sc_comm_t *c);
void sc_p2p_busy(int on);
void sc_nb_bind(sc_comm_t *c, sc_nbc_t *st, uintptr_t prog, uintptr_t sbuf, uintptr_t rbuf, int background);
int sc_nb_start(sc_comm_t *c, sc_nbc_t *st);
int sc_nb_test(sc_comm_t *c, sc_nbc_t *st);
int sc_nb_wait(sc_comm_t *c, sc_nbc_t *st);
int sc_nb_drive(sc_comm_t *c, sc_nbc_t *st, int64_t spin_ns);
void sc_nb_stop(sc_comm_t *c);
int sc_own(sc_comm_t *c);
void sc_disown(sc_comm_t *c);

int sc_arena_holds(uint64_t addr, uint64_t n);      /* [addr, addr + n) in this process's arena (pages.c) */
void sc_copy(char *dst, const char *src, int64_t n, int nt);
int sc_reduce(int64_t word, char *d, const char *a, const char *b, int64_t n);

int sc_twin_pick(int64_t *t);
int64_t sc_twin_estimate(const int64_t *t, int v);
void sc_twin_learn(int64_t *t, int v, int64_t ns);
void sc_twin_ran(int64_t *t, int v);

int sc_cache_slot(const int64_t *key);
void sc_cache_put(sc_comm_t *c, const int64_t *key, const int64_t *prog);
int64_t sc_fingerprint(const int64_t *vec, int n);
/* What a fast entry reads in place on every call (csrc/pyfast.c): its
 * communicator, collective id, the argument whose dtype the signature
 * holds (-1: none), whether it takes a reduction op, and one role
 * character per argument (NUL-terminated). */
typedef struct {
    sc_comm_t *c;
    int64_t coll;
    int32_t typed, reduction;
    char roles[16];
} sc_info_t;
void *sc_py_entry(int i);

int64_t sc_p2p_lines(int64_t p);
int sc_p2p_init(sc_comm_t *c);
void sc_p2p_free(sc_comm_t *c);
int64_t sc_p2p_helped(sc_comm_t *c);   /* bytes this rank wrote into its receivers' buffers (shared rendezvous) */
void *sc_py_p2p(int i);
void *sc_py_flat(void);
void *sc_py_route(void);
/* A small collective of the hierarchical communicator straight to MPI
 * (csrc/mpiflat.c), as shmcoll/multinode/flatc.py fills it: the MPI
 * function, the communicator's, MPI_BYTE's and MPI_IN_PLACE's handles
 * (ints or pointers: wide), FLAT_BELOW's bytes (0 once freed: every call
 * declines), the call's kind, this rank and the size. */
typedef struct {
    void *fn;
    intptr_t comm, byte, in_place;
    int64_t below;
    int32_t kind, wide, rank, size;
} sc_flat_t;

/* pool channels and the owner's bell (csrc/chan.c) */
int64_t sc_chan_size(int64_t cap);
void sc_chan_init(char *ch, int64_t cap);
int64_t sc_chan_put(char *ch, const char *src, int64_t n, int64_t spin_ns, int64_t wait_ns);
int64_t sc_chan_get(char *ch, char *dst, int64_t n, int64_t spin_ns, int64_t wait_ns);
int64_t sc_chan_ready(char *ch);
uint64_t sc_bell_seen(char *b);
void sc_bell_ring(char *b);
int sc_bell_wait(char *b, uint64_t seen, int64_t spin_ns, int64_t wait_ns);
