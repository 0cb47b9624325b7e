/* Copy engine.
 *  - Large copies into user memory use non-temporal stores when the call's
 *    footprint would not stay in cache anyway: the destination is not read
 *    again soon, and skipping the write-allocate read saves a third of the
 *    memory traffic.
 *  - 4K aliasing: glibc's memcpy and the kernel's copy (process_vm_readv)
 *    use `rep movsb`, which on AMD Zen runs several times slower when the
 *    destination sits 1..63 bytes past the source modulo 4 KiB (two
 *    adjacent heap buffers: dst = src + k * 4096 + 16).  Vector loads and
 *    stores do not suffer, so such copies take the vector loop, and
 *    single copies (reads and writes) go through a bounce buffer at the
 *    peer's page offset (bench/README.md, "Engine constants"). */
#include "sc_internal.h"
#include <errno.h>
#include <stdlib.h>
#include <sys/uio.h>

#define PAGE 4096
#define BOUNCE (64 << 10)

#if defined(__x86_64__)
#include <immintrin.h>

static int has_avx2(void)
{
    static int avx2 = -1;
    if (avx2 < 0) avx2 = __builtin_cpu_supports("avx2");
    return avx2;
}

/* One loop body for both stores: nt streams past the cache. */
#define VEC_LOOP(T, W, LOAD, STORE)                                                        \
    for (; n >= 4 * W; n -= 4 * W, s += 4 * W, d += 4 * W) {                               \
        T a = LOAD((const T *)s), b = LOAD((const T *)(s + W));                            \
        T e = LOAD((const T *)(s + 2 * W)), f = LOAD((const T *)(s + 3 * W));              \
        STORE((T *)d, a);                                                                  \
        STORE((T *)(d + W), b);                                                            \
        STORE((T *)(d + 2 * W), e);                                                        \
        STORE((T *)(d + 3 * W), f);                                                        \
    }                                                                                      \
    if (n) memcpy(d, s, n);

__attribute__((target("avx2"))) static void nt_avx2(char *d, const char *s, int64_t n)
{ VEC_LOOP(__m256i, 32, _mm256_loadu_si256, _mm256_stream_si256) }
static void nt_sse2(char *d, const char *s, int64_t n)
{ VEC_LOOP(__m128i, 16, _mm_loadu_si128, _mm_stream_si128) }
__attribute__((target("avx2"))) static void vec_avx2(char *d, const char *s, int64_t n)
{ VEC_LOOP(__m256i, 32, _mm256_loadu_si256, _mm256_storeu_si256) }
static void vec_sse2(char *d, const char *s, int64_t n)
{ VEC_LOOP(__m128i, 16, _mm_loadu_si128, _mm_storeu_si128) }

static void copy_vec(char *dst, const char *src, int64_t n)
{
    (has_avx2() ? vec_avx2 : vec_sse2)(dst, src, n);
}

/* Streamed stores, unfenced (sc_stream's callers fence once at the end). */
static void stream(char *dst, const char *src, int64_t n)
{
    (has_avx2() ? nt_avx2 : nt_sse2)(dst, src, n);
}

void sc_fence(void) { _mm_sfence(); }
#else                                           /* elsewhere: plain copies (neither the aliasing nor the streaming applies) */
#define copy_vec memcpy
#define stream memcpy
void sc_fence(void) {}
#endif

static int aliased(const char *dst, const char *src)
{
    uint64_t d = ((uintptr_t)dst - (uintptr_t)src) & (PAGE - 1);
    return d && d < 64;
}

void sc_copy(char *dst, const char *src, int64_t n, int nt)
{
    if (!nt || n < 4096) {
        if (n >= 1024 && aliased(dst, src)) copy_vec(dst, src, n);
        else memcpy(dst, src, n);
        return;
    }
    sc_stream(dst, src, n);
    sc_fence();                                 /* streamed stores before the flag */
}

/* n bytes from src (in cache) to dst: whole lines by streamed stores,
 * the partial lines at either end plainly, so no line takes both kinds of
 * store (a plain store to a line being streamed makes the core read it
 * back); the caller fences (sc_fence). */
void sc_stream(char *dst, const char *src, int64_t n)
{
    int64_t head = (-(intptr_t)dst) & 63, body;
    if (head >= n) {
        memcpy(dst, src, n);
        return;
    }
    body = (n - head) & ~(int64_t)63;
    memcpy(dst, src, head);
    stream(dst + head, src + head, body);
    memcpy(dst + head + body, src + head + body, n - head - body);
}

#define PIECE (4 << 20)

/* process_vm_readv of n bytes at addr in pid into local; 0 or an errno.
 * With shut (a write: the peer's door), process_vm_writev from local, in
 * pieces, each started only while the peer's door is open: a peer whose
 * call failed shuts it and then waits for the piece in flight, so nothing
 * lands in its memory after it returned (ECANCELED).  With mapped (addr
 * is mapped here there: the peer's arena, csrc/peers.c), plain copies,
 * streamed with nt. */
static int vm_move(int32_t pid, char *local, uint64_t addr, int64_t n, _Atomic int32_t *shut, char *mapped, int nt)
{
    for (int64_t done = 0; done < n;) {
        int64_t k = shut && n - done > PIECE ? PIECE : n - done;
        struct iovec l = { local + done, (size_t)k }, r = { (void *)(uintptr_t)(addr + done), (size_t)k };
        if (shut && atomic_load_explicit(shut, memory_order_seq_cst)) return ECANCELED;
        if (mapped) {
            if (shut) sc_copy(mapped + done, local + done, k, nt);
            else sc_copy(local + done, mapped + done, k, nt);
            done += k;
            continue;
        }
        ssize_t got = shut ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (got <= 0) return got < 0 ? errno : EFAULT;
        done += got;
    }
    return 0;
}

/* Single copy between this process's local and pid's addr (a write when
 * shut is given; by plain copies when mapped: see vm_move): a system
 * call's pair whose destination sits 1..63 bytes past its source modulo 4
 * KiB goes through a bounce buffer at addr's page offset (a plain copy
 * takes the vector loop instead, sc_copy; nt: streamed, as sc_copy's). */
int sc_vm_move(int32_t pid, char *local, uint64_t addr, int64_t n, _Atomic int32_t *shut, char *mapped, int nt)
{
    static __thread char *bounce;
    const char *remote = (const char *)(uintptr_t)addr;
    int write = shut != NULL;
    if (mapped || n < PAGE || !(write ? aliased(remote, local) : aliased(local, remote)))
        return vm_move(pid, local, addr, n, shut, mapped, nt);
    if (!bounce && !(bounce = aligned_alloc(PAGE, BOUNCE + PAGE))) return vm_move(pid, local, addr, n, shut, NULL, 0);
    char *b = bounce + (addr & (PAGE - 1));
    for (int64_t done = 0; done < n; done += BOUNCE) {
        int64_t k = n - done < BOUNCE ? n - done : BOUNCE;
        if (write) copy_vec(b, local + done, k);
        int err = vm_move(pid, b, addr + done, k, shut, NULL, 0);
        if (err) return err;
        if (!write) copy_vec(local + done, b, k);
    }
    return 0;
}
