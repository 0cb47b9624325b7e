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
 * ranges; smaller ones go to numpy's. */
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

/* fork: no thread holds the lock across it, so the child's lists are whole */
static void fork_prepare(void) { pthread_mutex_lock(&lock); }
static void fork_done(void) { pthread_mutex_unlock(&lock); }
static void at_fork(void) { pthread_atfork(fork_prepare, fork_done, fork_done); }

static void drop_kept(void)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nkept; i++) munmap(kept[i].p, kept[i].n);
    nkept = kept_bytes = 0;
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

static void *h_malloc(void *ctx, size_t size)
{
    if (size < min_bytes) return base->malloc(base->ctx, size);
    size_t n = pages(size);
    return n ? get(n, size, 0) : NULL;
}

static void *h_calloc(void *ctx, size_t nelem, size_t elsize)
{
    if (elsize && nelem > SIZE_MAX / elsize) return NULL;
    size_t size = nelem * elsize, n;
    if (size < min_bytes) return base->calloc(base->ctx, nelem, elsize);
    return (n = pages(size)) ? get(n, size, 1) : NULL;
}

/* Ours shrinks in place (it cannot fail, and keeps its start) and grows by
 * a copy; the base handler's stays with it (only it knows the old size). */
static void *h_realloc(void *ctx, void *ptr, size_t size)
{
    if (!ptr) return h_malloc(ctx, size);
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
    if (!release(ptr)) base->free(base->ctx, ptr, size);
}

static np_handler handler = {"shmcoll_huge_pages", 1, {NULL, h_malloc, h_calloc, h_realloc, h_free}};

/* huge_arrays(numpy's _ARRAY_API capsule, min_bytes): from now on
 * numpy arrays of min_bytes and more that this thread (context) makes go
 * on aligned huge pages (the threshold is the process's); 0: no more
 * (numpy's handler back).  Only numpy's own handler is replaced: one the
 * user set is left alone. */
PyObject *sc_py_huge_arrays(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "huge_arrays(_ARRAY_API, min_bytes)");
        return NULL;
    }
    void **api = PyCapsule_GetPointer(args[0], NULL);
    size_t at_least = PyLong_AsSize_t(args[1]);
    if (!api || (at_least == (size_t)-1 && PyErr_Occurred())) return NULL;
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
            min_bytes = SIZE_MAX;               /* our arrays, grown, go to numpy's too */
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
