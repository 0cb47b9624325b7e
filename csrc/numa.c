/* NUMA placement shim for shmcoll.
 *
 * No build-time dependency on libnuma-dev: the kernel ABI (mbind, get_mempolicy, move_pages) is
 * stable and tiny, so we either call libnuma.so.1's exported wrappers found with dlopen (backend 2;
 * keeps tools that interpose libnuma working) or issue the same syscalls ourselves (backend 1).
 * libnuma's high-level numa_tonode_memory() is deliberately NOT used: it reports errors through
 * numa_error() (stderr) instead of returning them, and we want -errno.
 *
 * mbind on a MAP_SHARED mapping of a tmpfs (POSIX shm) object sets the *shared* policy of the
 * object for that page range; every later allocation of those pages (first touch through any
 * mapping, or fallocate) follows it, which is what shmcoll relies on.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "numa.h"

/* <numaif.h> values, copied so that no libnuma headers are needed. */
#define MPOL_PREFERRED 1
#define MPOL_BIND 2
#define MPOL_INTERLEAVE 3
#define MPOL_F_NODE (1 << 0)
#define MPOL_F_ADDR (1 << 1)

#define NW SC_NUMA_MASK_WORDS
#define WBITS (8 * (int)sizeof(unsigned long))
#define MAXNODE ((unsigned long)NW * WBITS + 1) /* the kernel reads maxnode-1 bits */

typedef long (*mbind_fn)(void *, unsigned long, int, const unsigned long *, unsigned long, unsigned);
typedef long (*getpol_fn)(int *, unsigned long *, unsigned long, void *, unsigned long);
typedef long (*movep_fn)(int, unsigned long, void **, const int *, int *, int);

static long sys_mbind(void *a, unsigned long l, int m, const unsigned long *nm, unsigned long mx, unsigned f)
{ return syscall(SYS_mbind, a, l, m, nm, mx, f); }
static long sys_getpol(int *p, unsigned long *nm, unsigned long mx, void *a, unsigned long f)
{ return syscall(SYS_get_mempolicy, p, nm, mx, a, f); }
static long sys_movep(int pid, unsigned long n, void **pg, const int *nd, int *st, int f)
{ return syscall(SYS_move_pages, pid, n, pg, nd, st, f); }

static struct {
    int backend, kernel_ok, have_libnuma;
    mbind_fn mbind; getpol_fn getpol; movep_fn movep;          /* active backend */
    mbind_fn ln_mbind; getpol_fn ln_getpol; movep_fn ln_movep; /* libnuma's, when loaded */
    int (*ln_max_node)(void);
} S;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void)
{
    /* ENOSYS: kernel built without CONFIG_NUMA; EPERM: seccomp (e.g. docker without CAP_SYS_NICE). */
    int mode;
    S.kernel_ok = syscall(SYS_get_mempolicy, &mode, NULL, 0UL, NULL, 0UL) == 0;
    void *h = dlopen("libnuma.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h) {
        int (*avail)(void) = (int (*)(void))dlsym(h, "numa_available");
        S.ln_mbind = (mbind_fn)dlsym(h, "mbind");
        S.ln_getpol = (getpol_fn)dlsym(h, "get_mempolicy");
        S.ln_movep = (movep_fn)dlsym(h, "move_pages");
        S.ln_max_node = (int (*)(void))dlsym(h, "numa_max_node");
        S.have_libnuma = avail && avail() >= 0 && S.ln_mbind && S.ln_getpol && S.ln_movep && S.ln_max_node;
    }
    sc_numa_set_backend(!S.kernel_ok ? 0 : S.have_libnuma ? 2 : 1);
}

int sc_numa_set_backend(int backend)
{
    if (backend == 0) { S.backend = 0; return 0; }
    if (!S.kernel_ok || (backend == 2 && !S.have_libnuma) || backend < 0 || backend > 2) return -ENOENT;
    S.backend = backend;
    S.mbind = backend == 2 ? S.ln_mbind : sys_mbind;
    S.getpol = backend == 2 ? S.ln_getpol : sys_getpol;
    S.movep = backend == 2 ? S.ln_movep : sys_movep;
    return 0;
}

int sc_numa_backend(void) { pthread_once(&once, init); return S.backend; }

/* Parse a sysfs node list such as "0-1,3\n" into mask; returns the number of nodes or -errno. */
static int read_nodelist(const char *path, unsigned long *mask)
{
    char buf[4096];
    FILE *f = fopen(path, "r");
    if (!f) return -errno;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    int count = 0;
    for (char *p = buf; *p && *p != '\n';) {
        char *e;
        long lo = strtol(p, &e, 10), hi = lo;
        if (e == p) return -EINVAL;
        if (*e == '-') { p = e + 1; hi = strtol(p, &e, 10); if (e == p) return -EINVAL; }
        for (long i = lo; i <= hi && i < NW * WBITS; i++, count++) mask[i / WBITS] |= 1UL << (i % WBITS);
        p = *e == ',' ? e + 1 : e;
    }
    return count;
}

int sc_numa_memory_nodes(unsigned long *mask, int nwords)
{
    unsigned long m[NW] = {0};
    sc_numa_backend();
    int n = read_nodelist("/sys/devices/system/node/has_memory", m);
    if (n <= 0) { memset(m, 0, sizeof m); n = read_nodelist("/sys/devices/system/node/online", m); }
    if (n <= 0) {  /* no sysfs: trust libnuma, else assume the single node 0 */
        int mx = S.have_libnuma ? S.ln_max_node() : 0;
        memset(m, 0, sizeof m);
        for (n = 0; n <= mx && n < NW * WBITS; n++) m[n / WBITS] |= 1UL << (n % WBITS);
    }
    for (int i = 0; i < nwords; i++) mask[i] = i < NW ? m[i] : 0;
    return n;
}

int sc_numa_max_node(void)
{
    unsigned long m[NW];
    sc_numa_memory_nodes(m, NW);
    for (int i = NW * WBITS - 1; i > 0; i--)
        if (m[i / WBITS] >> (i % WBITS) & 1) return i;
    return 0;
}

static int rc(long r) { return r < 0 ? -errno : (int)r; }

int sc_numa_bind(void *addr, size_t len, int node, int strict)
{
    unsigned long m[NW] = {0};
    if (!sc_numa_backend()) return -ENOSYS;
    if (node < 0 || node >= NW * WBITS) return -EINVAL;
    m[node / WBITS] = 1UL << (node % WBITS);
    return rc(S.mbind(addr, len, strict ? MPOL_BIND : MPOL_PREFERRED, m, MAXNODE, 0));
}

int sc_numa_interleave(void *addr, size_t len)
{
    unsigned long m[NW];
    if (!sc_numa_backend()) return -ENOSYS;
    sc_numa_memory_nodes(m, NW);
    return rc(S.mbind(addr, len, MPOL_INTERLEAVE, m, MAXNODE, 0));
}

int sc_numa_node_of(void *addr)
{
    int node = -1;
    if (!sc_numa_backend()) return -ENOSYS;
    long r = S.getpol(&node, NULL, 0, addr, MPOL_F_NODE | MPOL_F_ADDR);
    return r < 0 ? -errno : node;
}

int sc_numa_policy_of(void *addr, int *mode, unsigned long *mask, int nwords)
{
    unsigned long m[NW] = {0};
    if (!sc_numa_backend()) return -ENOSYS;
    if (S.getpol(mode, m, MAXNODE, addr, MPOL_F_ADDR) < 0) return -errno;
    for (int i = 0; i < nwords; i++) mask[i] = i < NW ? m[i] : 0;
    return 0;
}

int sc_numa_query_pages(void **pages, int n, int *status)
{
    if (!sc_numa_backend()) return -ENOSYS;
    return rc(S.movep(0, (unsigned long)n, pages, NULL, status, 0));
}
