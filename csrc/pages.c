/* Large numpy arrays on whole transparent huge pages.
 *
 * A single copy (process_vm_readv/writev) pins the peer's pages one at a
 * time: a 2 MiB block on 4 KiB pages costs 512 pins, on a huge page one
 * (perf, 2 ranks, 2 MiB Alltoall: pinning was 15% of one rank's samples).
 * numpy advises huge pages for arrays from 4 MiB, but over malloc's
 * unaligned mapping, so only the whole aligned 2 MiB ranges inside get one
 * and which block does depends on where the allocation landed.  This NEP 49
 * allocation handler, installed in each rank, maps arrays from huge_bytes
 * (2 MiB) on a 2 MiB boundary and advises their whole 2 MiB ranges; smaller
 * ones go to the handler it replaced. */
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

static const np_allocator *base;    /* the handler replaced, for smaller arrays */
static PyObject *base_capsule;      /* keeps it alive */
static size_t min_bytes;

/* Our mappings (address, length): freed pointers that are 2 MiB-aligned
 * are looked up here; others are the base handler's. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct span { char *p; size_t n; } *spans;
static size_t nspans, cap;

static int remember(char *p, size_t n)
{
    pthread_mutex_lock(&lock);
    if (nspans == cap) {
        size_t c = cap ? 2 * cap : 64;
        struct span *s = realloc(spans, c * sizeof *s);
        if (!s) {
            pthread_mutex_unlock(&lock);
            return 0;
        }
        spans = s, cap = c;
    }
    spans[nspans++] = (struct span){p, n};
    pthread_mutex_unlock(&lock);
    return 1;
}

/* The length of our mapping at p (0: not ours); forget it when take. */
static size_t lookup(void *p, int take)
{
    if (!p || (uintptr_t)p & (HUGE - 1)) return 0;
    size_t n = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nspans; i++)
        if (spans[i].p == p) {
            n = spans[i].n;
            if (take) spans[i] = spans[--nspans];
            break;
        }
    pthread_mutex_unlock(&lock);
    return n;
}

/* size bytes from a 2 MiB boundary: the whole 2 MiB ranges advised, the
 * rest (less than one) on small pages, so no memory is added. */
static void *huge_map(size_t size)
{
    size_t page = (size_t)getpagesize(), n = (size + page - 1) & ~(page - 1), span = n + HUGE;
    if (n < size || span < n) return NULL;
    char *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)m + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (p > m) munmap(m, p - m);
    munmap(p + n, m + span - (p + n));
    if (n >= HUGE) madvise(p, n & ~(HUGE - 1), MADV_HUGEPAGE);
    if (!remember(p, n)) {
        munmap(p, n);
        return NULL;
    }
    return p;
}

static void *h_malloc(void *ctx, size_t size)
{
    return size >= min_bytes ? huge_map(size) : base->malloc(base->ctx, size);
}

static void *h_calloc(void *ctx, size_t nelem, size_t elsize)
{
    if (elsize && nelem > SIZE_MAX / elsize) return NULL;
    return nelem * elsize >= min_bytes ? huge_map(nelem * elsize) : base->calloc(base->ctx, nelem, elsize);
}

static void *h_realloc(void *ctx, void *ptr, size_t size)
{
    if (!ptr) return h_malloc(ctx, size);
    size_t had = lookup(ptr, 0);
    if (!had) return base->realloc(base->ctx, ptr, size);
    void *q = h_malloc(ctx, size);
    if (!q) return NULL;
    memcpy(q, ptr, size < had ? size : had);
    munmap(ptr, lookup(ptr, 1));
    return q;
}

static void h_free(void *ctx, void *ptr, size_t size)
{
    size_t n = lookup(ptr, 1);
    if (n) munmap(ptr, n);
    else base->free(base->ctx, ptr, size);
}

static np_handler handler = {"shmcoll_huge_pages", 1, {NULL, h_malloc, h_calloc, h_realloc, h_free}};

/* huge_arrays(numpy's _ARRAY_API capsule, min_bytes): allocate this
 * thread's (context's) numpy arrays of min_bytes and more on aligned huge
 * pages from now on. */
PyObject *sc_py_huge_arrays(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "huge_arrays(_ARRAY_API, min_bytes)");
        return NULL;
    }
    void **api = PyCapsule_GetPointer(args[0], NULL);
    size_t at_least = PyLong_AsSize_t(args[1]);
    if (!api || (at_least == (size_t)-1 && PyErr_Occurred())) return NULL;
    if (!at_least) {
        PyErr_SetString(PyExc_ValueError, "huge_arrays: min_bytes must be positive");
        return NULL;
    }
    PyObject *(*set_handler)(PyObject *) = (PyObject * (*)(PyObject *)) api[API_SET_HANDLER];
    PyObject *(*get_handler)(void) = (PyObject * (*)(void)) api[API_GET_HANDLER];
    PyObject *cur = get_handler();
    if (!cur) return NULL;
    np_handler *h = PyCapsule_GetPointer(cur, "mem_handler");
    if (!h) {
        Py_DECREF(cur);
        return NULL;
    }
    if (h == &handler) {        /* already ours (a forked rank of a rank) */
        Py_DECREF(cur);
        min_bytes = at_least;
        Py_RETURN_NONE;
    }
    if (base_capsule && h != (np_handler *)PyCapsule_GetPointer(base_capsule, "mem_handler")) {
        Py_DECREF(cur);
        PyErr_SetString(PyExc_RuntimeError, "huge_arrays: another numpy allocation handler was set since");
        return NULL;
    }
    Py_XSETREF(base_capsule, cur);
    base = &h->a;
    min_bytes = at_least;
    PyObject *mine = PyCapsule_New(&handler, "mem_handler", NULL);
    if (!mine) return NULL;
    PyObject *old = set_handler(mine);
    Py_DECREF(mine);
    if (!old) return NULL;
    Py_DECREF(old);
    Py_RETURN_NONE;
}
