/* Reduction kernels: one loop per (op, type, form), built for the
 * baseline and, on x86-64, again for AVX2 and AVX-512 (kernels.h included
 * once per instruction set); the set is chosen once, at the first call,
 * from what the CPU has.  The executor's SC_OP_REDUCE calls sc_reduce,
 * which folds n elements: d = a op b, d op= b, or, for float16 and
 * bfloat16, the same into a float32 accumulator and a final rounding to
 * nearest even (training code's convention).  MINLOC/MAXLOC pairs run a
 * scalar loop over (value, index) items of any layout.  Elements never
 * combine with their neighbours, so the result does not depend on the
 * instruction set: the executor's order of operands is the only order. */
#include "sc_internal.h"
#include <stdlib.h>

typedef struct { float re, im; } sc_c64;
typedef struct { double re, im; } sc_c128;
typedef struct { long double re, im; } sc_cld;
#define TILE 4096             /* streamed folds: bytes of d per kernel call, in L1 */
typedef void (*sc_kernel_t)(char *restrict d, const char *a, const char *restrict b, int64_t n);

static inline float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* IEEE half <-> float, exact one way and round-to-nearest-even the other
 * (as numpy's astype(float16)); NaNs stay quiet NaNs. */
static inline float h2f(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = h >> 10 & 0x1f, m = h & 0x3ffu;
    if (e == 31) return bits_f(s | 0x7f800000u | m << 13);
    if (e) return bits_f(s | (e + 112) << 23 | m << 13);
    float f = (float)m * 0x1p-24f;                  /* subnormal or zero: exact */
    return s ? -f : f;
}

static inline uint16_t f2h(float f)
{
    uint32_t u = f_bits(f), s = u >> 16 & 0x8000u;
    u &= 0x7fffffffu;
    if (u >= 0x47800000u) return (uint16_t)(s | (u > 0x7f800000u ? 0x7e00u : 0x7c00u));  /* >= 2^16: inf, NaN */
    if (u < 0x38800000u) {                          /* below 2^-14: a subnormal half, rounded by the FPU */
        float a = bits_f(u) + 0.5f;
        return (uint16_t)(s | (f_bits(a) - 0x3f000000u));
    }
    u += 0xc8000fffu + (u >> 13 & 1);               /* rebias the exponent, round to nearest even */
    return (uint16_t)(s | u >> 13);
}

static inline float bf2f(uint16_t h) { return bits_f((uint32_t)h << 16); }

static inline uint16_t f2bf(float f)
{
    uint32_t u = f_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(u >> 16 | 0x40);
    return (uint16_t)((u + 0x7fffu + (u >> 16 & 1)) >> 16);
}

#define ISA base
#include "kernels.h"
#undef ISA
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx2")
#define ISA avx2
#include "kernels.h"
#undef ISA
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#define ISA avx512
#include "kernels.h"
#undef ISA
#pragma GCC pop_options
#define SETS 3
#else
#define SETS 1
#endif

static sc_kernel_t table[SC_R_NOPS][SC_T_NTYPES][SC_F_N];
static int picked;          /* table filled for this CPU */

static void pick(void)
{
    int set = 0;
#if SETS == 3
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && !getenv("SHMCOLL_NO_AVX512"))
        set = 2;
    else if (__builtin_cpu_supports("avx2"))
        set = 1;
    if (set == 2) fill_avx512(table);
    else if (set == 1) fill_avx2(table);
    else
#endif
        fill_base(table);
    (void)set;
    __atomic_store_n(&picked, 1, __ATOMIC_RELEASE);
}

/* MINLOC / MAXLOC on (value V, index I) items of `item` bytes, the index
 * at byte `at`: the better value wins, a tie the lower index (MPI). */
#define LOC(name, V, I, BETTER)                                                            \
    static void name(char *d, const char *a, const char *b, int64_t n, int item, int at) \
    {                                                                                    \
        for (int64_t i = 0; i < n; i++, d += item, a += item, b += item) {               \
            V va, vb;                                                                    \
            I ia, ib;                                                                    \
            memcpy(&va, a, sizeof va); memcpy(&vb, b, sizeof vb);                        \
            memcpy(&ia, a + at, sizeof ia); memcpy(&ib, b + at, sizeof ib);              \
            int take_b = BETTER(vb, va) || (!BETTER(va, vb) && ib < ia);                 \
            V v = take_b ? vb : va;                                                      \
            I x = take_b ? ib : ia;                                                      \
            memcpy(d, &v, sizeof v);                                                     \
            memcpy(d + at, &x, sizeof x);                                                \
        }                                                                                \
    }
#define LESS(p, q) ((p) < (q))
#define MORE(p, q) ((p) > (q))
#define LOCS(tag, V)                        \
    LOC(minloc_##tag##_32, V, int32_t, LESS) \
    LOC(minloc_##tag##_64, V, int64_t, LESS) \
    LOC(maxloc_##tag##_32, V, int32_t, MORE) \
    LOC(maxloc_##tag##_64, V, int64_t, MORE)
LOCS(i16, int16_t)
LOCS(i32, int32_t)
LOCS(i64, int64_t)
LOCS(f32, float)
LOCS(f64, double)
LOCS(ld, long double)

typedef void (*sc_loc_t)(char *, const char *, const char *, int64_t, int, int);
#define LOCROW(tag) { { minloc_##tag##_32, minloc_##tag##_64 }, { maxloc_##tag##_32, maxloc_##tag##_64 } }

static sc_loc_t loc_kernel(int op, int type, int wide)
{
    static const sc_loc_t k[][2][2] = { LOCROW(i16), LOCROW(i32), LOCROW(i64), LOCROW(f32), LOCROW(f64), LOCROW(ld) };
    int row;
    switch (type) {
    case SC_T_I16: row = 0; break;
    case SC_T_I32: row = 1; break;
    case SC_T_I64: row = 2; break;
    case SC_T_F32: row = 3; break;
    case SC_T_F64: row = 4; break;
    case SC_T_LD: row = 5; break;
    default: return NULL;
    }
    return k[row][op == SC_R_MAXLOC][wide];
}

/* Bytes of one element of each type (SC_T_*), for streamed folds. */
static const int type_size[SC_T_NTYPES] = {
    [SC_T_I8] = 1, [SC_T_I16] = 2, [SC_T_I32] = 4, [SC_T_I64] = 8, [SC_T_U8] = 1, [SC_T_U16] = 2, [SC_T_U32] = 4,
    [SC_T_U64] = 8, [SC_T_F32] = 4, [SC_T_F64] = 8, [SC_T_LD] = sizeof(long double), [SC_T_C64] = sizeof(sc_c64),
    [SC_T_C128] = sizeof(sc_c128), [SC_T_CLD] = sizeof(sc_cld), [SC_T_BOOL] = 1, [SC_T_F16] = 2, [SC_T_BF16] = 2,
};

/* f over n elements with d written by streamed stores (the call's result
 * would not stay in cache, and skipping the write-allocate read of d
 * saves a third of the fold's memory traffic): f fills a tile in L1,
 * streamed out from there (sc_stream: whole lines only).  d op= b runs
 * as d = d op b, so f is the two-operand kernel; narrowing reads 4-byte
 * floats and writes halves.  Long double's padding bytes, which no
 * kernel writes, go out as zeros, not as the stack's old contents. */
static void streamed(sc_kernel_t f, int form, int type, char *d, const char *a, const char *b, int64_t n)
{
    _Alignas(64) char tile[TILE];
    int item = type_size[type], in = form == SC_F_NARROW ? 4 : item;
    int64_t per = TILE / item, lead = (-(intptr_t)d) & 63, head = lead % item ? 0 : lead / item;
    if (type == SC_T_LD || type == SC_T_CLD) memset(tile, 0, sizeof tile);
    if (form == SC_F_INTO) a = d;
    for (int64_t i = 0, k; i < n; i += k) {     /* the first tile ends on a line where elements allow */
        k = i ? per : head ? head : per;
        k = n - i < k ? n - i : k;
        f(tile, a + i * in, b + i * item, k);
        sc_stream(d + i * item, tile, k * item);
    }
    sc_fence();
}

/* Fold n elements as word (isa.h SC_REDUCE_*) says; -1 for a kernel that does not
 * exist (Python never plans one). */
int sc_reduce(int64_t word, char *d, const char *a, const char *b, int64_t n)
{
    int op = (int)SC_ARG(&word, SC_REDUCE_KOP), type = (int)SC_ARG(&word, SC_REDUCE_TYPE);
    int form = (int)SC_ARG(&word, SC_REDUCE_FORM);
    if (op >= SC_R_MINLOC) {
        sc_loc_t f = op < SC_R_NOPS ? loc_kernel(op, type, (int)SC_ARG(&word, SC_REDUCE_INDEX64)) : NULL;
        if (!f || form > SC_F_INTO) return -1;
        f(d, form == SC_F_INTO ? d : a, b, n, (int)SC_ARG(&word, SC_REDUCE_ITEM), (int)SC_ARG(&word, SC_REDUCE_INDEX_AT));
        return 0;
    }
    if (!__atomic_load_n(&picked, __ATOMIC_ACQUIRE)) pick();
    sc_kernel_t f = op > 0 && type > 0 && type < SC_T_NTYPES && form < SC_F_N ? table[op][type][form] : NULL;
    if (!f) return -1;
#if defined(__x86_64__)                    /* elsewhere sc_stream is a plain copy: nothing to gain */
    if (SC_ARG(&word, SC_REDUCE_STREAMED) && form != SC_F_WIDEN && form != SC_F_ACC) {
        streamed(form == SC_F_INTO ? table[op][type][SC_F_SAME] : f, form, type, d, a, b, n);
        return 0;
    }
#endif
    f(d, a, b, n);
    return 0;
}
