/* A rank's numpy arrays in its arena, shared with its peers.
 *
 * This NEP 49 allocation handler, installed in each rank over numpy's own,
 * puts arrays from huge_bytes (2 MiB) on a 2 MiB boundary, and mid-size
 * ones, from huge_slot_bytes (64 KiB), in power-of-two slots of 2 MiB
 * slabs (below); smaller ones go to numpy's.  Both come from the rank's
 * arena, a memfd mapped shared, which the peers map too (csrc/peers.c): a
 * peer copies from or into these arrays by plain loads and stores and
 * folds another rank's input where it lies, with no system call and no
 * copy in between (process_vm_readv pins the peer's pages one by one,
 * which dominates a large single copy: bench/README.md, "Engine
 * constants").  The arena's ranges are advised huge pages, which the kernel gives
 * shared memory where shmem_enabled allows (elsewhere small pages; a
 * large array's last 2 MiB is then a huge page whole).  Without an arena
 * (arena_fits, or the address space refused) arrays are mapped privately,
 * on aligned transparent huge pages.  fork gives the child its own copy of the
 * arena's arrays, as it would of private memory (at_fork): the parent
 * waits until the child has made it. */
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
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
static int advise = 1;              /* ask for huge pages (the kernel's and numpy's are on) */

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

/* Slabs: 2 MiB grains of the arena (else huge-page mappings), each cut in
 * slots of one power of two, for arrays from slot_min up to min_bytes (and
 * 2 MiB), so they too are shared: from the arena a peer copies them by
 * plain loads and stores; without it, a single copy of a block on small
 * pages pins every page of it.  At most SLABS slabs (128 MiB; then
 * numpy's), EMPTY of them kept empty (temporaries of a few sizes made
 * again and again would otherwise fault in a fresh huge page each time);
 * slot k of slab i is its p + k << shift. */
#define SLABS 64
#define EMPTY 8
#define SLOT_ALIGN ((size_t)64 << 10)   /* the smallest slot: other pointers are not looked up */
static struct slab { char *p; uint64_t used; int shift; } slab[SLABS];   /* p NULL: a free entry */
static size_t slot_min = SIZE_MAX;

/* The arena: ARENA bytes of address space (arena_fits: every peer maps
 * it too) over a memfd of that size (sparse:
 * only pages touched hold memory), handed out in 2 MiB grains, first fit;
 * a freed range's pages go back to the kernel (a hole punched, which
 * reads as zeros again).  arena_lock nests inside lock. */
static size_t ARENA;
static pthread_mutex_t arena_lock = PTHREAD_MUTEX_INITIALIZER;
static char *arena;                 /* NULL: none (not made yet, or given up by fork) */
static int arena_fd = -1;
static uint64_t arena_ino;
static struct hole { size_t at, n; } *holes;   /* free grains, sorted, apart */
static size_t nholes, holes_cap;

static int in_arena(const void *p) { return arena && (char *)p >= arena && (char *)p < arena + ARENA; }

/* Can this process have an arena, and how large (ARENA)?  Not under
 * strict overcommit (its pages are charged when touched: a touch past the
 * limit would be SIGBUS, not MemoryError) nor a limit on address space
 * (each peer's arena is mapped too); 4x the memory per CPU, from 4 GiB to
 * all of it (1 TiB at most): every rank maps every peer's, so 128 ranks
 * on a 1 TiB node take 4 TiB of address space, not 128; an array that
 * does not fit is mapped privately. */
static int arena_fits(void)
{
    struct rlimit as;
    char strict = '0';
    FILE *f = fopen("/proc/sys/vm/overcommit_memory", "r");
    if (f) {
        if (fread(&strict, 1, 1, f) != 1) strict = '0';
        fclose(f);
    }
    if (strict == '2' || (!getrlimit(RLIMIT_AS, &as) && as.rlim_cur != RLIM_INFINITY)) return 0;
    size_t ram = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t a = 4 * ram / (size_t)(cpus > 0 ? cpus : 1), lo = (size_t)4 << 30, hi = ram < ((size_t)1 << 40) ? ram : (size_t)1 << 40;
    ARENA = (a < lo ? lo : a > hi ? hi : a) & ~(HUGE - 1);
    return 1;
}

/* Make the arena (GIL held, once a process); 0 or -1 (then arrays are private). */
static int arena_open(void)
{
    if (arena || !arena_fits()) return arena ? 0 : -1;
    int fd = memfd_create("shmcoll-arrays", MFD_CLOEXEC);
    struct stat st;
    struct hole *h = malloc(64 * sizeof *h);
    if (fd < 0 || !h || ftruncate(fd, (off_t)ARENA) || fstat(fd, &st)) goto fail;
    char *m = mmap(NULL, ARENA + HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) goto fail;
    char *p = (char *)(((uintptr_t)m + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (p > m) munmap(m, p - m);
    munmap(p + ARENA, m + HUGE - p);
    if (mmap(p, ARENA, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE | MAP_FIXED, fd, 0) == MAP_FAILED) {
        munmap(p, ARENA);
        goto fail;
    }
    if (advise) madvise(p, ARENA, MADV_HUGEPAGE);   /* where the kernel gives shared memory huge pages */
    pthread_mutex_lock(&arena_lock);
    holes = h, holes_cap = 64, nholes = 1, holes[0] = (struct hole){0, ARENA / HUGE};
    arena_fd = fd, arena_ino = (uint64_t)st.st_ino, arena = p;
    pthread_mutex_unlock(&arena_lock);
    return 0;
fail:
    free(h);
    if (fd >= 0) close(fd);
    return -1;
}

/* n bytes at a 2 MiB boundary of the arena, zero, or NULL (none, or full). */
static char *arena_take(size_t n)
{
    size_t g = (n + HUGE - 1) / HUGE;
    char *p = NULL;
    pthread_mutex_lock(&arena_lock);
    for (size_t i = 0; arena && i < nholes && !p; i++) {
        if (holes[i].n < g) continue;
        p = arena + holes[i].at * HUGE;
        holes[i].at += g, holes[i].n -= g;
        if (!holes[i].n) memmove(&holes[i], &holes[i + 1], (--nholes - i) * sizeof *holes);
    }
    pthread_mutex_unlock(&arena_lock);
    return p;
}

/* Ranges a peer stalled mid-copy may still write into through its
 * mapping of the arena (sc_quarantine): private memory now, never given
 * back to the arena; once there is one, no new communicator publishes the
 * arena (its peers would read the memfd's pages, no longer ours there). */
static struct hole *quarantined;
static size_t nquarantined;

static int in_quarantine(const char *p, size_t n)
{
    size_t a = (size_t)(uintptr_t)p;
    for (size_t i = 0; i < nquarantined; i++)
        if (a < quarantined[i].at + quarantined[i].n && quarantined[i].at < a + n) return 1;
    return 0;
}

/* Give back [p, p + n) of an arena range (whole pages; the range's tail,
 * or all of it): its pages to the kernel, its grains past p to the holes. */
static void arena_give(char *p, size_t n)
{
    pthread_mutex_lock(&arena_lock);
    if (in_quarantine(p, n)) {                  /* its memory back, its grains never */
        madvise(p, n, MADV_DONTNEED);
        pthread_mutex_unlock(&arena_lock);
        return;
    }
    madvise(p, n, MADV_REMOVE);                 /* through the mapping: the fd may be closed by then */
    size_t at = ((size_t)(p - arena) + HUGE - 1) / HUGE, end = ((size_t)(p - arena) + n + HUGE - 1) / HUGE, i = 0;
    if (at < end) {
        while (i < nholes && holes[i].at < at) i++;
        int left = i > 0 && holes[i - 1].at + holes[i - 1].n == at, right = i < nholes && holes[i].at == end;
        if (left && right) {
            holes[i - 1].n += end - at + holes[i].n;
            memmove(&holes[i], &holes[i + 1], (--nholes - i) * sizeof *holes);
        } else if (left) {
            holes[i - 1].n += end - at;
        } else if (right) {
            holes[i].at = at, holes[i].n += end - at;
        } else {
            if (nholes == holes_cap) {          /* no room: the grains stay taken (address space, not memory) */
                struct hole *h = realloc(holes, 2 * holes_cap * sizeof *h);
                if (!h) goto out;
                holes = h, holes_cap *= 2;
            }
            memmove(&holes[i + 1], &holes[i], (nholes++ - i) * sizeof *holes);
            holes[i] = (struct hole){at, end - at};
        }
    }
out:
    pthread_mutex_unlock(&arena_lock);
}

/* Unmap (or give back to the arena) n bytes of ours at p. */
static void drop(void *p, size_t n)
{
    if (in_arena(p)) arena_give(p, n);
    else munmap(p, n);
}

/* For the torch backend (shmcoll/torch.py): whether [addr, addr + n)
 * lies in this process's arena, a range reserved once and never moved, so
 * that a storage already there is not moved again. */
int sc_arena_holds(uint64_t addr, uint64_t n)
{
    const char *p = (const char *)(uintptr_t)addr;
    return in_arena(p) && n <= (uint64_t)(arena + ARENA - p);
}

/* For a peer (csrc/peers.c): this process's arena, 0; -1 if none (or
 * one with ranges in quarantine). */
int sc_arena_of(int32_t *fd, uint64_t *base, uint64_t *len, uint64_t *ino)
{
    if (!arena || nquarantined) return -1;
    *fd = arena_fd, *base = (uintptr_t)arena, *len = ARENA, *ino = arena_ino;
    return 0;
}

/* Our call failed while a peer was still writing into our buffer at
 * addr (sc_shut: it stalled mid-copy past the timeout), through its
 * mapping of the arena, where it would go on writing whenever it runs
 * again: the buffer's whole array (its span or slab, else its grain)
 * gets private pages with what it holds, at the same address, and
 * leaves the arena for good (in_quarantine). */
void sc_quarantine(uint64_t addr)
{
    char *at = (char *)(uintptr_t)addr, *lo = NULL;
    size_t n = 0;
    if (!in_arena(at)) return;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nspans && !lo; i++)
        if (at >= spans[i].p && at < spans[i].p + spans[i].n) lo = spans[i].p, n = spans[i].n;
    if (!lo) lo = (char *)((uintptr_t)at & ~(uintptr_t)(HUGE - 1)), n = HUGE;   /* a slab's, or a grain */
    n = (n + HUGE - 1) & ~(HUGE - 1);
    pthread_mutex_lock(&arena_lock);
    struct hole *q = in_quarantine(lo, n) ? NULL : realloc(quarantined, (nquarantined + 1) * sizeof *q);
    char *m = q ? mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
    if (q) quarantined = q;
    if (m != MAP_FAILED) {
        memcpy(m, lo, n);
        if (mremap(m, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, lo) != MAP_FAILED)
            quarantined[nquarantined++] = (struct hole){(size_t)(uintptr_t)lo, n};
        else
            munmap(m, n);
    }
    pthread_mutex_unlock(&arena_lock);
    pthread_mutex_unlock(&lock);
}

/* fork: no thread holds the locks across it, so the child's lists are
 * whole.  The child copies its arrays in the arena into private memory at
 * the same addresses and leaves the arena (privatize), as fork would have
 * given it private pages; the parent's forking thread waits for that
 * (through a pipe). */
static int fork_pipe[2] = {-1, -1};

static void fork_prepare(void)
{
    pthread_mutex_lock(&lock);
    pthread_mutex_lock(&arena_lock);
    if (arena && pipe2(fork_pipe, O_CLOEXEC)) fork_pipe[0] = fork_pipe[1] = -1;
}

static void fork_parent(void)
{
    if (fork_pipe[0] >= 0) {
        char b;
        close(fork_pipe[1]);
        while (read(fork_pipe[0], &b, 1) < 0 && errno == EINTR) {}
        close(fork_pipe[0]);
        fork_pipe[0] = fork_pipe[1] = -1;
    }
    pthread_mutex_unlock(&arena_lock);
    pthread_mutex_unlock(&lock);
}

/* Into q, [p, p + n) of the arena: only the memfd's data ranges (a read
 * of a hole would fill it: a never-touched array would take memory); a
 * range in quarantine is private memory already, copied whole. */
static void copy_data(char *q, char *p, size_t n)
{
    if (in_quarantine(p, n)) {
        memcpy(q, p, n);
        return;
    }
    off_t at = p - arena, end = at + (off_t)n;
    while (at < end) {
        off_t d = lseek(arena_fd, at, SEEK_DATA), h;
        if (d < 0 || d >= end) break;
        h = lseek(arena_fd, d, SEEK_HOLE);
        if (h < 0 || h > end) h = end;
        memcpy(q + (d - (p - arena)), arena + d, (size_t)(h - d));
        at = h;
    }
}

/* The child's arrays in the arena, and its slabs with a live slot, to
 * private memory at the same addresses (what they held at the fork:
 * what other threads of the parent wrote meanwhile may show); its kept
 * ranges and empty slabs are dropped. */
static void privatize(void)
{
    size_t k = 0, most = nspans + SLABS;
    struct { char *p, *q; size_t n; } *r = malloc((most ? most : 1) * sizeof *r);
    int ok = r != NULL;
    for (size_t i = 0; ok && i < nspans + SLABS; i++) {
        char *p = i < nspans ? spans[i].p : slab[i - nspans].used ? slab[i - nspans].p : NULL;
        size_t n = i < nspans ? spans[i].n : HUGE;
        if (!p || !in_arena(p)) continue;
        char *q = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (q == MAP_FAILED) ok = 0;
        else copy_data(q, p, n), r[k++] = (__typeof__(*r)){p, q, n};
    }
    if (ok) munmap(arena, ARENA);
    for (size_t i = 0; ok && i < k; i++)
        if (mremap(r[i].q, r[i].n, r[i].n, MREMAP_MAYMOVE | MREMAP_FIXED, r[i].p) == MAP_FAILED) ok = 0;
    if (!ok) {                                  /* the child would share the parent's arrays: it may not go on */
        static const char msg[] = "shmcoll: fork could not copy the arrays of the parent's arena\n";
        if (write(2, msg, sizeof msg - 1)) {}
        _exit(70);
    }
    free(r);
    size_t keep = 0;
    for (size_t i = 0; i < nkept; i++)
        if (!in_arena(kept[i].p)) kept[keep++] = kept[i];
        else kept_bytes -= kept[i].n;
    nkept = keep;
    for (int i = 0; i < SLABS; i++)
        if (slab[i].p && !slab[i].used && in_arena(slab[i].p)) slab[i].p = NULL;
    close(arena_fd);
    arena = NULL, arena_fd = -1, nholes = 0, nquarantined = 0;
}

static void fork_child(void)
{
    if (arena) privatize();
    if (fork_pipe[0] >= 0) {
        close(fork_pipe[0]);
        if (write(fork_pipe[1], "", 1)) {}
        close(fork_pipe[1]);
        fork_pipe[0] = fork_pipe[1] = -1;
    }
    pthread_mutex_unlock(&arena_lock);
    pthread_mutex_unlock(&lock);
}

static void at_fork(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }


static void drop_kept(void)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nkept; i++) drop(kept[i].p, kept[i].n);
    nkept = kept_bytes = 0;
    for (int i = 0; i < SLABS; i++)
        if (slab[i].p && !slab[i].used) drop(slab[i].p, HUGE), slab[i].p = NULL;
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

/* n bytes (whole pages), zero, from a 2 MiB boundary: in the arena, else
 * mapped here, the whole 2 MiB ranges advised, the rest (less than one)
 * on small pages, so no memory is added. */
static char *fresh(size_t n)
{
    char *a = arena_take(n);
    if (a) return a;
    char *m = mmap(NULL, n + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)m + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (p > m) munmap(m, p - m);
    munmap(p + n, m + HUGE - p);
    if (n >= HUGE && advise) madvise(p, n & ~(HUGE - 1), MADV_HUGEPAGE);
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
        drop(p + cut, have - cut);
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
        drop(p, have);
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
        drop(s.p, s.n);
        return 1;
    }
    while (nkept == KEEP || kept_bytes + s.n > KEEP_ALL) {      /* drop the oldest */
        drop(kept[0].p, kept[0].n);
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
            if (empties > EMPTY || min_bytes == SIZE_MAX) drop(slab[i].p, HUGE), slab[i].p = NULL;
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
            drop((char *)ptr + c, had - c);
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
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "huge_arrays(_ARRAY_API, min_bytes, slot_bytes, advise)");
        return NULL;
    }
    void **api = PyCapsule_GetPointer(args[0], NULL);
    size_t at_least = PyLong_AsSize_t(args[1]), slots = PyLong_AsSize_t(args[2]);
    int huge = PyObject_IsTrue(args[3]);
    if (!api || ((at_least == (size_t)-1 || slots == (size_t)-1 || huge < 0) && PyErr_Occurred())) return NULL;
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
        advise = huge;
        arena_open();                           /* none: the arrays stay private, read by single copy */
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
