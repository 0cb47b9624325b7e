/* Large numpy arrays on whole transparent huge pages.
 *
 * A single copy (process_vm_readv/writev) pins the peer's pages one at a
 * time: a 2 MiB block on 4 KiB pages costs 512 pins, on a huge page one
 * (perf, 2 ranks, 2 MiB Alltoall: pinning was 15% of one rank's samples).
 * numpy advises huge pages for arrays from 4 MiB, but over malloc's
 * unaligned mapping, so only the whole aligned 2 MiB ranges inside get one
 * and which block does depends on where the allocation landed.  This NEP 49
 * allocation handler, installed in each rank over numpy's own, maps arrays
 * from huge_bytes (2 MiB) on a 2 MiB boundary and advises their whole 2 MiB
 * ranges.  Mid-size ones, from huge_slot_bytes (64 KiB), share 2 MiB huge
 * pages in slots (below); smaller ones go to numpy's. */
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "sc_internal.h"

#define HUGE ((size_t)2 << 20)

/* numpy's PyDataMemAllocator and PyDataMem_Handler (ndarraytypes.h, numpy >= 1.22) */
typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t size);
    void (*free)(void *ctx, void *ptr, size_t size);
} np_allocator;
typedef struct {
    char name[127];
    uint8_t version;
    np_allocator a;
} np_handler;
/* PyArray_API slots of PyDataMem_SetHandler and PyDataMem_GetHandler (__multiarray_api.h) */
#define API_SET_HANDLER 304
#define API_GET_HANDLER 305
#define API_DEFAULT_HANDLER 306     /* PyObject **: numpy's own handler */

static const np_allocator *base;    /* numpy's own handler, for smaller arrays */
static PyObject *base_capsule;
static size_t min_bytes = HUGE;     /* one for the process; SIZE_MAX once turned off */

/* Live mappings (start, length): a pointer handed to free or realloc that
 * is 2 MiB-aligned is looked up here; any other is the base handler's.
 * Freed mappings are kept for reuse, as malloc keeps freed heap memory
 * (up to its largest mmap threshold, 32 MiB, each): a temporary made again
 * and again would otherwise fault in and zero fresh pages every time. */
#define KEEP 8
#define KEEP_EACH ((size_t)32 << 20)
#define KEEP_ALL ((size_t)64 << 20)
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct span { char *p; size_t n; } *spans, kept[KEEP];      /* kept: oldest first */
static size_t nspans, cap, nkept, kept_bytes;

/* Slabs: 2 MiB mappings on a huge page, each cut in slots of one power of
 * two, for arrays from slot_min up to min_bytes (and 2 MiB): a single copy
 * of a 256 KiB block on small pages pins 64 of them, 14.6 us against 6.4
 * for a memcpy of it (2 ranks, 256 KiB Allgather: 19-24 us, 15-17 from
 * slots; 64 KiB: 7 us, 5).  At most SLABS slabs (128 MiB; then numpy's),
 * EMPTY of them kept empty (temporaries of three sizes made again and
 * again faulted in a fresh huge page each time with two kept: 350 us an
 * iteration against 32 by numpy's, 13 with eight); slot k of slab i is
 * its p + k << shift. */
#define SLABS 64
#define EMPTY 8
#define SLOT_ALIGN ((size_t)64 << 10)   /* the smallest slot: other pointers are not looked up */
static struct slab { char *p; uint64_t used; int shift; } slab[SLABS];   /* p NULL: a free entry */
static size_t slot_min = SIZE_MAX;

/* fork: no thread holds the lock across it, so the child's lists are whole */
static void fork_prepare(void) { pthread_mutex_lock(&lock); }
static void fork_done(void) { pthread_mutex_unlock(&lock); }
static void at_fork(void) { pthread_atfork(fork_prepare, fork_done, fork_done); }

static void drop_kept(void)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nkept; i++) munmap(kept[i].p, kept[i].n);
    nkept = kept_bytes = 0;
    for (int i = 0; i < SLABS; i++)
        if (slab[i].p && !slab[i].used) munmap(slab[i].p, HUGE), slab[i].p = NULL;
    pthread_mutex_unlock(&lock);
}

/* size rounded up to whole pages, at least one; 0 if that overflows */
static size_t pages(size_t size)
{
    size_t page = (size_t)getpagesize(), n = size ? (size + page - 1) & ~(page - 1) : page;
    return n < size || n + HUGE < n ? 0 : n;
}

static long find(const void *p)     /* lock held */
{
    for (size_t i = 0; i < nspans; i++)
        if (spans[i].p == p) return (long)i;
    return -1;
}

/* The length of our mapping at p; 0: not ours. */
static size_t length_of(const void *p)
{
    if (!p || (uintptr_t)p & (HUGE - 1)) return 0;
    pthread_mutex_lock(&lock);
    long i = find(p);
    size_t n = i < 0 ? 0 : spans[i].n;
    pthread_mutex_unlock(&lock);
    return n;
}

/* n bytes (whole pages) from a 2 MiB boundary: the whole 2 MiB ranges
 * advised, the rest (less than one) on small pages, so no memory is added. */
static char *fresh(size_t n)
{
    char *m = mmap(NULL, n + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)m + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (p > m) munmap(m, p - m);
    munmap(p + n, m + HUGE - p);
    if (n >= HUGE) madvise(p, n & ~(HUGE - 1), MADV_HUGEPAGE);
    return p;
}

/* Where a mapping of have bytes shrinks to hold n: at n in its small-page
 * tail, else at the next 2 MiB boundary: a huge page cut in two is held
 * whole by the kernel until memory runs short, unseen in RSS. */
static size_t cut_at(size_t have, size_t n)
{
    return n >= (have & ~(HUGE - 1)) ? n : (n + HUGE - 1) & ~(HUGE - 1);
}

/* A live mapping of at least n bytes: the smallest kept one that fits
 * (at most twice n), else a fresh one.  zero: clear its first size bytes. */
static void *get(size_t n, size_t size, int zero)
{
    char *p = NULL;
    size_t have = n;
    pthread_mutex_lock(&lock);
    long best = -1;
    for (size_t i = 0; i < nkept; i++)
        if (kept[i].n >= n && kept[i].n / 2 <= n && (best < 0 || kept[i].n < kept[best].n)) best = (long)i;
    if (best >= 0) {
        p = kept[best].p, have = kept[best].n;
        kept_bytes -= have;
        memmove(&kept[best], &kept[best + 1], (--nkept - best) * sizeof *kept);
    }
    pthread_mutex_unlock(&lock);
    size_t cut = cut_at(have, n);
    if (p && cut < have) {          /* only what is asked for stays with the array */
        munmap(p + cut, have - cut);
        have = cut;
    }
    if (p && zero) memset(p, 0, size);
    if (!p && !(p = fresh(n))) return NULL;
    pthread_mutex_lock(&lock);
    int room = nspans < cap;
    if (!room) {
        size_t c = cap ? 2 * cap : 64;
        struct span *s = realloc(spans, c * sizeof *s);
        if (s) spans = s, cap = c, room = 1;
    }
    if (room) spans[nspans++] = (struct span){p, have};
    pthread_mutex_unlock(&lock);
    if (!room) {
        munmap(p, have);
        return NULL;
    }
    return p;
}

/* Free our mapping at p, keeping it for reuse if a later array may want
 * it (one huge page to KEEP_EACH, while on); 0: p is not ours. */
static int release(void *p)
{
    if (!p || (uintptr_t)p & (HUGE - 1)) return 0;
    pthread_mutex_lock(&lock);
    long i = find(p);
    if (i < 0) {
        pthread_mutex_unlock(&lock);
        return 0;
    }
    struct span s = spans[i];
    spans[i] = spans[--nspans];
    if (s.n > KEEP_EACH || s.n < HUGE || min_bytes == SIZE_MAX) {
        pthread_mutex_unlock(&lock);
        munmap(s.p, s.n);
        return 1;
    }
    while (nkept == KEEP || kept_bytes + s.n > KEEP_ALL) {      /* drop the oldest */
        munmap(kept[0].p, kept[0].n);
        kept_bytes -= kept[0].n;
        memmove(&kept[0], &kept[1], --nkept * sizeof *kept);
    }
    kept[nkept++] = s;
    kept_bytes += s.n;
    pthread_mutex_unlock(&lock);
    return 1;
}

/* A slot of at least size bytes (zero: its first size bytes cleared), or
 * NULL: none free and no room for another slab. */
static void *slot_get(size_t size, int zero)
{
    int shift = __builtin_ctzll(slot_min), i, hit = -1, empty = -1, none = -1;
    while (((size_t)1 << shift) < size) shift++;
    int n = 1 << (21 - shift);
    uint64_t full = n == 64 ? ~0ULL : (1ULL << n) - 1;
    pthread_mutex_lock(&lock);
    for (i = 0; i < SLABS && hit < 0; i++) {
        if (!slab[i].p) none = none < 0 ? i : none;
        else if (slab[i].shift == shift && slab[i].used != full) hit = i;
        else if (!slab[i].used && empty < 0) empty = i;
    }
    if (hit < 0 && (hit = empty) < 0 && none >= 0) {
        char *p = fresh(HUGE);
        if (p) slab[hit = none] = (struct slab){p, 0, shift};
    }
    char *p = NULL;
    if (hit >= 0) {
        int k = __builtin_ctzll(~slab[hit].used);
        slab[hit].shift = shift;
        slab[hit].used |= 1ULL << k;
        p = slab[hit].p + ((size_t)k << shift);
    }
    pthread_mutex_unlock(&lock);
    if (p && zero) memset(p, 0, size);
    return p;
}

/* Could p be a slot?  Only then is the lock taken (every free asks). */
static int slotlike(const void *p) { return p && !((uintptr_t)p & (SLOT_ALIGN - 1)); }

/* The slab holding p (lock held), -1: none. */
static int slab_of(const void *p)
{
    char *at = (char *)((uintptr_t)p & ~(uintptr_t)(HUGE - 1));
    for (int i = 0; i < SLABS; i++)
        if (slab[i].p == at) return i;
    return -1;
}

/* Free the slot at p (a slab emptied beyond EMPTY is unmapped); 0: not a slot. */
static int slot_release(void *p)
{
    if (!slotlike(p)) return 0;
    pthread_mutex_lock(&lock);
    int i = slab_of(p), empties = 0;
    if (i >= 0) {
        slab[i].used &= ~(1ULL << (((char *)p - slab[i].p) >> slab[i].shift));
        if (!slab[i].used) {
            for (int j = 0; j < SLABS; j++) empties += slab[j].p && !slab[j].used;
            if (empties > EMPTY || min_bytes == SIZE_MAX) munmap(slab[i].p, HUGE), slab[i].p = NULL;
        }
    }
    pthread_mutex_unlock(&lock);
    return i >= 0;
}

/* Does an array of size bytes go in a slot? */
static int slotted(size_t size) { return size >= slot_min && size < min_bytes && size <= HUGE; }

static void *h_malloc(void *ctx, size_t size)
{
    void *p;
    if (slotted(size) && (p = slot_get(size, 0))) return p;
    if (size < min_bytes) return base->malloc(base->ctx, size);
    size_t n = pages(size);
    return n ? get(n, size, 0) : NULL;
}

static void *h_calloc(void *ctx, size_t nelem, size_t elsize)
{
    if (elsize && nelem > SIZE_MAX / elsize) return NULL;
    size_t size = nelem * elsize, n;
    void *p;
    if (slotted(size) && (p = slot_get(size, 1))) return p;
    if (size < min_bytes) return base->calloc(base->ctx, nelem, elsize);
    return (n = pages(size)) ? get(n, size, 1) : NULL;
}

/* Ours shrinks in place (it cannot fail, and keeps its start) and grows by
 * a copy; the base handler's stays with it (only it knows the old size). */
static void *h_realloc(void *ctx, void *ptr, size_t size)
{
    if (!ptr) return h_malloc(ctx, size);
    size_t slot = 0;
    if (slotlike(ptr)) {
        pthread_mutex_lock(&lock);
        int i = slab_of(ptr);
        slot = i < 0 ? 0 : (size_t)1 << slab[i].shift;
        pthread_mutex_unlock(&lock);
    }
    if (slot) {
        if (size <= slot) return ptr;
        void *q = h_malloc(ctx, size);
        if (q) memcpy(q, ptr, slot), slot_release(ptr);
        return q;
    }
    size_t had = length_of(ptr), n = pages(size);
    if (!had) return base->realloc(base->ctx, ptr, size);
    if (!n) return NULL;
    if (n <= had) {
        size_t c = cut_at(had, n);
        if (c < had) {
            pthread_mutex_lock(&lock);
            spans[find(ptr)].n = c;
            pthread_mutex_unlock(&lock);
            munmap((char *)ptr + c, had - c);
        }
        return ptr;
    }
    void *q = h_malloc(ctx, size);
    if (!q) return NULL;
    memcpy(q, ptr, had);
    release(ptr);
    return q;
}

static void h_free(void *ctx, void *ptr, size_t size)
{
    if (!release(ptr) && !slot_release(ptr)) base->free(base->ctx, ptr, size);
}

static np_handler handler = {"shmcoll_huge_pages", 1, {NULL, h_malloc, h_calloc, h_realloc, h_free}};

/* huge_arrays(numpy's _ARRAY_API capsule, min_bytes, slot_bytes): from
 * now on numpy arrays of min_bytes and more that this thread (context)
 * makes go on aligned huge pages, from slot_bytes (a power of two from 64
 * KiB, 0: none) in slots of shared ones (the thresholds are the
 * process's); min_bytes 0: no more (numpy's handler back).  Only numpy's
 * own handler is replaced: one the user set is left alone. */
PyObject *sc_py_huge_arrays(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "huge_arrays(_ARRAY_API, min_bytes, slot_bytes)");
        return NULL;
    }
    void **api = PyCapsule_GetPointer(args[0], NULL);
    size_t at_least = PyLong_AsSize_t(args[1]), slots = PyLong_AsSize_t(args[2]);
    if (!api || ((at_least == (size_t)-1 || slots == (size_t)-1) && PyErr_Occurred())) return NULL;
    if (slots && (slots < SLOT_ALIGN || slots > HUGE || (slots & (slots - 1)))) {
        PyErr_SetString(PyExc_ValueError, "slot_bytes: 0 or a power of two from 64 KiB to 2 MiB");
        return NULL;
    }
    PyObject *(*set_handler)(PyObject *) = (PyObject * (*)(PyObject *)) api[API_SET_HANDLER];
    PyObject *(*get_handler)(void) = (PyObject * (*)(void)) api[API_GET_HANDLER];
    PyObject *numpys = *(PyObject **)api[API_DEFAULT_HANDLER];
    np_handler *dflt = PyCapsule_GetPointer(numpys, "mem_handler");
    PyObject *cur = get_handler(), *next = NULL;
    if (!cur || !dflt) goto fail;
    np_handler *h = PyCapsule_GetPointer(cur, "mem_handler");
    if (!h) goto fail;
    if (!at_least) {
        if (base) {
            min_bytes = slot_min = SIZE_MAX;    /* our arrays, grown, go to numpy's too */
            drop_kept();
        }
        if (h == &handler) next = Py_NewRef(numpys);
    } else if (h == &handler || h == dflt) {
        if (!base) {
            static pthread_once_t once = PTHREAD_ONCE_INIT;
            pthread_once(&once, at_fork);
            base_capsule = Py_NewRef(numpys);
            base = &dflt->a;
        }
        min_bytes = at_least;
        slot_min = slots ? slots : SIZE_MAX;
        if (h == dflt && !(next = PyCapsule_New(&handler, "mem_handler", NULL))) goto fail;
    }
    if (next) {
        PyObject *old = set_handler(next);
        Py_DECREF(next);
        if (!old) goto fail;
        Py_DECREF(old);
    }
    Py_DECREF(cur);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(cur);
    return NULL;
}
