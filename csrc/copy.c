/* Copy engine.  Large copies out of shared staging into user memory use
 * non-temporal stores: the destination is not read again soon, and
 * skipping the write-allocate read saves a third of the memory traffic. */
#include "sc_internal.h"
#include <immintrin.h>

__attribute__((target("avx2")))
static void nt_avx2(char *d, const char *s, int64_t n)
{
    for (; n >= 128; n -= 128, s += 128, d += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)s), b = _mm256_loadu_si256((const __m256i *)(s + 32));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + 64)), f = _mm256_loadu_si256((const __m256i *)(s + 96));
        _mm256_stream_si256((__m256i *)d, a);
        _mm256_stream_si256((__m256i *)(d + 32), b);
        _mm256_stream_si256((__m256i *)(d + 64), e);
        _mm256_stream_si256((__m256i *)(d + 96), f);
    }
    if (n) memcpy(d, s, n);
}

static void nt_sse2(char *d, const char *s, int64_t n)
{
    for (; n >= 64; n -= 64, s += 64, d += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 32)), f = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), e);
        _mm_stream_si128((__m128i *)(d + 48), f);
    }
    if (n) memcpy(d, s, n);
}

void sc_copy(char *dst, const char *src, int64_t n, int nt)
{
    if (!nt || n < 4096) {
        memcpy(dst, src, n);
        return;
    }
    int64_t head = (-(intptr_t)dst) & 31;      /* align the streamed stores */
    memcpy(dst, src, head);
    static int avx2 = -1;
    if (avx2 < 0) avx2 = __builtin_cpu_supports("avx2");
    (avx2 ? nt_avx2 : nt_sse2)(dst + head, src + head, n - head);
    _mm_sfence();                               /* streamed stores before the flag */
}
