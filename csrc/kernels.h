/* Reduction kernels of one instruction set, included by reduce.c once per
 * set with ISA naming it (base, avx2, avx512) and the matching
 * `#pragma GCC target` around: plain loops the compiler vectorises for
 * that set.  Every kernel works element by element (no reassociation, no
 * contraction: -ffp-contract=off), so each set gives the same bits. */
#define CAT2(a, b) a##_##b
#define CAT(a, b) CAT2(a, b)
#define FN(name) CAT(name, ISA)

/* d = a op b and d op= b over n elements of T; EXPR combines x and y. */
#define KERN(name, T, EXPR)                                                                      \
    static void FN(name##_s)(char *restrict d_, const char *restrict a_, const char *restrict b_, \
                             int64_t n)                                                          \
    {                                                                                            \
        T *restrict d = (T *)d_;                                                                 \
        const T *restrict a = (const T *)a_, *restrict b = (const T *)b_;                        \
        for (int64_t i = 0; i < n; i++) { T x = a[i], y = b[i]; d[i] = EXPR; }                  \
    }                                                                                            \
    static void FN(name##_i)(char *restrict d_, const char *a_, const char *restrict b_, int64_t n) \
    {                                                                                            \
        T *restrict d = (T *)d_;                                                                 \
        const T *restrict b = (const T *)b_;                                                     \
        (void)a_;                                                                                \
        for (int64_t i = 0; i < n; i++) { T x = d[i], y = b[i]; d[i] = EXPR; }                  \
    }

/* Half types: d(f32) = a op b and d(f32) op= b, EXPR on floats. */
#define KERNH(name, T, TOF, EXPR)                                                                \
    static void FN(name##_w)(char *restrict d_, const char *restrict a_, const char *restrict b_, \
                             int64_t n)                                                          \
    {                                                                                            \
        float *restrict d = (float *)d_;                                                         \
        const T *restrict a = (const T *)a_, *restrict b = (const T *)b_;                        \
        for (int64_t i = 0; i < n; i++) { float x = TOF(a[i]), y = TOF(b[i]); d[i] = EXPR; }    \
    }                                                                                            \
    static void FN(name##_a)(char *restrict d_, const char *a_, const char *restrict b_, int64_t n) \
    {                                                                                            \
        float *restrict d = (float *)d_;                                                         \
        const T *restrict b = (const T *)b_;                                                     \
        (void)a_;                                                                                \
        for (int64_t i = 0; i < n; i++) { float x = d[i], y = TOF(b[i]); d[i] = EXPR; }         \
    }

#define ISUM(T, W) (T)((W)x + (W)y)
#define IPROD(T, W) (T)((W)x * (W)y)
/* As numpy's float32/float64 minimum/maximum: a NaN on either side wins
 * and a tie (+0 against -0) gives y, the later rank's (x != x is false
 * for integers and folds away) */
#define MIN_ ((x < y || x != x) ? x : y)
#define MAX_ ((x > y || x != x) ? x : y)
#define LAND_(T) (T)((x != 0) & (y != 0))
#define LOR_(T) (T)((x != 0) | (y != 0))
#define LXOR_(T) (T)((x != 0) ^ (y != 0))

#define INTEGER(tag, T, W)                 \
    KERN(sum_##tag, T, ISUM(T, W))         \
    KERN(prod_##tag, T, IPROD(T, W))       \
    KERN(min_##tag, T, MIN_)               \
    KERN(max_##tag, T, MAX_)               \
    KERN(land_##tag, T, LAND_(T))          \
    KERN(lor_##tag, T, LOR_(T))            \
    KERN(lxor_##tag, T, LXOR_(T))          \
    KERN(band_##tag, T, (T)(x & y))        \
    KERN(bor_##tag, T, (T)(x | y))         \
    KERN(bxor_##tag, T, (T)(x ^ y))
INTEGER(i8, int8_t, uint32_t)
INTEGER(i16, int16_t, uint32_t)
INTEGER(i32, int32_t, uint32_t)
INTEGER(i64, int64_t, uint64_t)
INTEGER(u8, uint8_t, uint32_t)
INTEGER(u16, uint16_t, uint32_t)
INTEGER(u32, uint32_t, uint32_t)
INTEGER(u64, uint64_t, uint64_t)

#define REAL(tag, T)                 \
    KERN(sum_##tag, T, x + y)        \
    KERN(prod_##tag, T, x * y)       \
    KERN(min_##tag, T, MIN_)         \
    KERN(max_##tag, T, MAX_)
REAL(f32, float)
REAL(f64, double)
REAL(ld, long double)

#define COMPLEX(tag, T)                                                                  \
    KERN(sum_##tag, T, ((T){ x.re + y.re, x.im + y.im }))                                \
    KERN(prod_##tag, T, ((T){ x.re * y.re - x.im * y.im, x.re * y.im + x.im * y.re }))
COMPLEX(c64, sc_c64)
COMPLEX(c128, sc_c128)
COMPLEX(cld, sc_cld)

/* bool: 0 or 1 in a byte; min is and, max is or */
KERN(land_b, uint8_t, LAND_(uint8_t))
KERN(lor_b, uint8_t, LOR_(uint8_t))
KERN(lxor_b, uint8_t, LXOR_(uint8_t))
KERN(band_b, uint8_t, (uint8_t)(x & y))
KERN(bor_b, uint8_t, (uint8_t)(x | y))
KERN(bxor_b, uint8_t, (uint8_t)(x ^ y))

#define HALF(tag, TOF)                       \
    KERNH(SUM_##tag, uint16_t, TOF, x + y)   \
    KERNH(PROD_##tag, uint16_t, TOF, x * y)  \
    KERNH(MIN_##tag, uint16_t, TOF, MIN_)    \
    KERNH(MAX_##tag, uint16_t, TOF, MAX_)
HALF(f16, h2f)
HALF(bf16, bf2f)

static void FN(narrow_f16)(char *restrict d_, const char *restrict a_, const char *b_, int64_t n)
{
    uint16_t *restrict d = (uint16_t *)d_;
    const float *restrict a = (const float *)a_;
    (void)b_;
    for (int64_t i = 0; i < n; i++) d[i] = f2h(a[i]);
}

static void FN(narrow_bf16)(char *restrict d_, const char *restrict a_, const char *b_, int64_t n)
{
    uint16_t *restrict d = (uint16_t *)d_;
    const float *restrict a = (const float *)a_;
    (void)b_;
    for (int64_t i = 0; i < n; i++) d[i] = f2bf(a[i]);
}

#define PUT(op, t, tag) (k[SC_R_##op][SC_T_##t][SC_F_SAME] = FN(tag##_s), k[SC_R_##op][SC_T_##t][SC_F_INTO] = FN(tag##_i))
#define PUTH(op, t, h) (k[SC_R_##op][SC_T_##t][SC_F_WIDEN] = FN(op##_##h##_w), k[SC_R_##op][SC_T_##t][SC_F_ACC] = FN(op##_##h##_a), \
                        k[SC_R_##op][SC_T_##t][SC_F_NARROW] = FN(narrow_##h))
#define PUT_INT(t, tag) (PUT(SUM, t, sum_##tag), PUT(PROD, t, prod_##tag), PUT(MIN, t, min_##tag), PUT(MAX, t, max_##tag), \
                         PUT(LAND, t, land_##tag), PUT(LOR, t, lor_##tag), PUT(LXOR, t, lxor_##tag),                     \
                         PUT(BAND, t, band_##tag), PUT(BOR, t, bor_##tag), PUT(BXOR, t, bxor_##tag))
#define PUT_REAL(t, tag) (PUT(SUM, t, sum_##tag), PUT(PROD, t, prod_##tag), PUT(MIN, t, min_##tag), PUT(MAX, t, max_##tag))

static void FN(fill)(sc_kernel_t k[SC_R_NOPS][SC_T_NTYPES][SC_F_N])
{
    PUT_INT(I8, i8); PUT_INT(I16, i16); PUT_INT(I32, i32); PUT_INT(I64, i64);
    PUT_INT(U8, u8); PUT_INT(U16, u16); PUT_INT(U32, u32); PUT_INT(U64, u64);
    PUT_REAL(F32, f32); PUT_REAL(F64, f64); PUT_REAL(LD, ld);
    PUT(SUM, C64, sum_c64); PUT(PROD, C64, prod_c64);
    PUT(SUM, C128, sum_c128); PUT(PROD, C128, prod_c128);
    PUT(SUM, CLD, sum_cld); PUT(PROD, CLD, prod_cld);
    PUT(LAND, BOOL, land_b); PUT(LOR, BOOL, lor_b); PUT(LXOR, BOOL, lxor_b);
    PUT(BAND, BOOL, band_b); PUT(BOR, BOOL, bor_b); PUT(BXOR, BOOL, bxor_b);
    PUT(MIN, BOOL, band_b); PUT(MAX, BOOL, bor_b);
    PUTH(SUM, F16, f16); PUTH(PROD, F16, f16); PUTH(MIN, F16, f16); PUTH(MAX, F16, f16);
    PUTH(SUM, BF16, bf16); PUTH(PROD, BF16, bf16); PUTH(MIN, BF16, bf16); PUTH(MAX, BF16, bf16);
}

#undef KERN
#undef KERNH
#undef INTEGER
#undef REAL
#undef COMPLEX
#undef HALF
#undef PUT
#undef PUTH
#undef PUT_INT
#undef PUT_REAL
#undef FN
#undef CAT
#undef CAT2
