/* Peers' arenas (csrc/pages.c): a rank maps a peer's arena, whose memfd
 * it opens through /proc (the same permission as a single copy), on first
 * use, so a single copy from or into an array there is a plain copy and
 * a fold reads a peer's input where it lies.  One mapping per peer
 * process, shared by the communicators that use it, unmapped when the
 * last is closed.  Memory elsewhere (a buffer numpy did not make through
 * the handler, or with huge_bytes 0) still goes by process_vm_readv/writev. */
#include "sc_internal.h"
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int sc_arena_of(int32_t *fd, uint64_t *base, uint64_t *len, uint64_t *ino);

typedef struct { int32_t pid; uint64_t ino, len; char *p; int refs; } mapping_t;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static mapping_t *maps;
static int nmaps, cap;

/* A forked child inherits no peer's arena (MADV_DONTFORK: it would keep a
 * dead peer's memory alive, and could write into it): its communicators
 * see a new generation and map again if ever used. */
static int generation;
static void fork_prepare(void) { pthread_mutex_lock(&lock); }
static void fork_parent(void) { pthread_mutex_unlock(&lock); }
static void fork_child(void)
{
    nmaps = 0, generation++;
    pthread_mutex_unlock(&lock);
}

typedef struct { char *p; uint64_t base, len; int state; } sc_peer_t;  /* state 0 not tried, 1 mapped, -1 none */
struct sc_peers {
    int n, generation;
    char **alias;                /* per fold input slot: the peer's bytes a CMA left in place, less its offset */
    sc_peer_t m[];
};

/* Publish this process's arena in our rank record (at registration). */
void sc_publish_arena(sc_comm_t *c)
{
    sc_rank_t *me = rank_rec(c, c->rank);
    if (sc_arena_of(&me->arena_fd, &me->arena_base, &me->arena_len, &me->arena_ino)) me->arena_len = 0;
}

static void at_fork(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

static sc_peers_t *peers(sc_comm_t *c)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    if (c->peers && c->peers->generation != generation) {     /* forked since: nothing is mapped here */
        for (int i = 0; i < c->peers->n; i++) c->peers->m[i].state = 0;
        c->peers->generation = generation;
    }
    if (!c->peers && (c->peers = calloc(1, sizeof(sc_peers_t) + c->size * sizeof(sc_peer_t)))) {
        pthread_once(&once, at_fork);           /* before anything is mapped */
        c->peers->n = c->size, c->peers->generation = generation;
        if (!(c->peers->alias = calloc((size_t)c->size, sizeof(char *)))) {
            free(c->peers);
            c->peers = NULL;
        }
    }
    return c->peers;
}

/* The process-wide mapping of (pid, ino), one more user; NULL: none. */
static char *hold(int32_t pid, int32_t fd, uint64_t ino, uint64_t len)
{
    char *p = NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nmaps && !p; i++)
        if (maps[i].pid == pid && maps[i].ino == ino && maps[i].len == len) maps[i].refs++, p = maps[i].p;
    if (!p && nmaps == cap) {
        mapping_t *more = realloc(maps, (cap ? 2 * cap : 16) * sizeof *maps);
        if (more) maps = more, cap = cap ? 2 * cap : 16;
    }
    if (!p && nmaps < cap) {
        char path[64];
        struct stat st;
        snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, (int)fd);
        int f = open(path, O_RDWR | O_CLOEXEC);
        void *m = MAP_FAILED;
        if (f >= 0 && !fstat(f, &st) && (uint64_t)st.st_ino == ino && (uint64_t)st.st_size >= len)
            m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, f, 0);
        if (f >= 0) close(f);
        if (m != MAP_FAILED) {
            madvise(m, len, MADV_DONTFORK);
            maps[nmaps++] = (mapping_t){pid, ino, len, p = m, 1};
        }
    }
    pthread_mutex_unlock(&lock);
    return p;
}

static void let_go(char *p)
{
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nmaps; i++)
        if (maps[i].p == p && !--maps[i].refs) {
            munmap(p, maps[i].len);
            maps[i] = maps[--nmaps];
            break;
        }
    pthread_mutex_unlock(&lock);
}

static int map_peer(sc_comm_t *c, int who, sc_peer_t *m)
{
    sc_rank_t *r = rank_rec(c, who);
    if (!r->arena_len) return -1;
    m->base = r->arena_base, m->len = r->arena_len;
    if (who == c->rank) m->p = (char *)(uintptr_t)r->arena_base;
    else if (!(m->p = hold(r->pid, r->arena_fd, r->arena_ino, r->arena_len))) return -1;
    return 1;
}

/* Our address of n bytes at addr in who's memory, or NULL: not all in its arena. */
char *sc_peer_ptr(sc_comm_t *c, int who, uint64_t addr, int64_t n)
{
    sc_peers_t *ps = peers(c);
    if (!ps || n <= 0) return NULL;
    sc_peer_t *m = &ps->m[who];
    if (!m->state) m->state = map_peer(c, who, m);
    uint64_t at = addr - m->base;
    if (m->state < 0 || addr < m->base || at >= m->len || (uint64_t)n > m->len - at) return NULL;
    return m->p + at;
}

/* Fold input slot j: the peer's bytes at p stand for scratch from off on (p NULL: scratch itself). */
void sc_alias_set(sc_comm_t *c, int j, char *p, int64_t off)
{
    if (c->peers && j < c->peers->n) c->peers->alias[j] = p ? p - off : NULL;
}

char *sc_alias(sc_comm_t *c, int j)
{
    return c->peers && j < c->peers->n ? c->peers->alias[j] : NULL;
}

/* The communicator is left or closed: its peers' mappings lose a user
 * (a peer's arena is unmapped once no communicator uses it: a peer that
 * exited leaves no memory behind). */
void sc_peers_close(sc_comm_t *c)
{
    sc_peers_t *ps = c->peers;
    if (!ps) return;
    c->peers = NULL;
    for (int i = 0; i < ps->n; i++)
        if (ps->m[i].state > 0 && i != c->rank && ps->generation == generation) let_go(ps->m[i].p);
    free(ps->alias);
    free(ps);
}
