/* AVX-512 VNNI multi-token kernels for prefill: Q4_K, Q5_K, Q6_K (with Q8_K
 * activations) and Q8_0. This file is compiled with AVX-512 F/BW/VL/VNNI
 * flags (kernels/CMakeLists.txt); simd.c lays its table over the AVX2 one
 * only on CPUs that have them, so decode (n = 1, vec_dot) keeps the AVX2
 * one-token kernels.
 *
 * Results are bit-identical to the AVX2 kernels, so the multi-token kernels
 * here equal the AVX2 vec_dot per token and grouping never changes results:
 *  - every s32 lane holds the same exact sum of 4 consecutive products:
 *    vpdpwssd applies the sub-block scale to maddubs pairs as madd did, and
 *    vpdpbusd sums the 4 bytes maddubs + madd(1) did;
 *  - a 512-bit register holds two 32-element runs; its halves are added in
 *    s32 (exact) before the float step;
 *  - the float steps are the same lane-wise FMAs in the same order; two
 *    tokens share a 512-bit float accumulator, one per 256-bit half (a
 *    lane-wise FMA rounds the same whatever the register width), which
 *    halves the per-block conversions and FMAs. */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include "kernels/kernels_internal.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define FOR_T for (int t = 0; t < nt; t++)

_Static_assert(MOEX_DOT_MAX_TOKENS >= 1 && MOEX_DOT_MAX_TOKENS <= 8, "dispatch below covers 1..8 tokens");

/* Calls kernel(..., nt, ...) with nt a compile-time constant, so the token
 * loops unroll and the accumulators stay in registers. */
#define DISPATCH_NT(nt, call)                                                                                        \
    switch (nt) {                                                                                                    \
    case 1: call(1); break;                                                                                          \
    case 2: call(2); break;                                                                                          \
    case 3: call(3); break;                                                                                          \
    case 4: call(4); break;                                                                                          \
    case 5: call(5 <= MOEX_DOT_MAX_TOKENS ? 5 : 1); break;                                                           \
    case 6: call(6 <= MOEX_DOT_MAX_TOKENS ? 6 : 1); break;                                                           \
    case 7: call(7 <= MOEX_DOT_MAX_TOKENS ? 7 : 1); break;                                                           \
    default: call(MOEX_DOT_MAX_TOKENS); break;                                                                       \
    }

static inline float f16(moex_f16 h) { return _cvtsh_ss(h); }

/* The AVX2 kernels' horizontal sums, operation for operation. */
static inline float hsum_ps128(__m128 r) {
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline float hsum_ps(__m256 x) {
    return hsum_ps128(_mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1)));
}

/* [a.lo + a.hi | b.lo + b.hi]: each 512-bit accumulator's halves added (in
 * s32, exact) to AVX2's 8 lanes, two tokens in one vector. */
static inline __m512i fold_pair(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, 0x44), _mm512_shuffle_i64x2(a, b, 0xEE));
}

/* [a x 8 | b x 8] */
static inline __m512 pair_ps(float a, float b) {
    const __m512d lo = _mm512_castps_pd(_mm512_set1_ps(a));
    return _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(_mm256_set1_ps(b)), 1));
}

/* 256-bit half h (0, 1) of v */
static inline __m256 half_ps(__m512 v, int h) {
    return h ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)) : _mm512_castps512_ps256(v);
}

/* The 32 bytes at p in both 256-bit halves. */
static inline __m512i broadcast_256(const void *p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
}

#define HIGH_HALF_16 ((__mmask32)0xFFFF0000u) /* the upper 16 of 32 s16 */
#define LOW_HALF_16 ((__mmask32)0x0000FFFFu)

/* ---- Q4_K / Q5_K ---- */

/* vpshufb masks over 8 s16 scales repeated in each 128-bit lane: the lower
 * 256 bits broadcast scale 2g, the upper 256 bits scale 2g + 1. */
static const uint8_t k_k4_scale_pair[4][64] __attribute__((aligned(64))) = {
#define B2(k) 2 * (k), 2 * (k) + 1
#define LANE(k) B2(k), B2(k), B2(k), B2(k), B2(k), B2(k), B2(k), B2(k)
#define ROW(g) {LANE(2 * g), LANE(2 * g), LANE(2 * g + 1), LANE(2 * g + 1)}
    ROW(0), ROW(1), ROW(2), ROW(3),
#undef ROW
#undef LANE
#undef B2
};

/* Weights of sub-blocks 2g (lower half) and 2g + 1 (upper half) as bytes
 * 0..15 (0..31 with Q5_K's fifth bit from qh). */
static ALWAYS_INLINE __m512i k4_weights(const uint8_t *qs, const uint8_t *qh, int g) {
    const __m512i bits = broadcast_256(qs + 32 * g);
    __m512i q = _mm512_and_si512(_mm512_mask_srli_epi16(bits, HIGH_HALF_16, bits, 4), _mm512_set1_epi8(0xF));
    if (qh) {
        /* bit 2g of each qh byte for the lower half, bit 2g + 1 for the upper, moved to bit 4 */
        const __m512i h = broadcast_256(qh);
        const __m512i hs = _mm512_mask_srl_epi16(_mm512_srl_epi16(h, _mm_cvtsi32_si128(2 * g)), HIGH_HALF_16, h,
                                                 _mm_cvtsi32_si128(2 * g + 1));
        q = _mm512_ternarylogic_epi32(q, _mm512_slli_epi16(hs, 4), _mm512_set1_epi8(0x10), 0xF8); /* q | (hs4 & 0x10) */
    }
    return q;
}

/* Tokens go in pairs (a, b) for the float steps, one per 256-bit half of
 * 512-bit accumulators (an odd count repeats its last token in a pair).
 * Per block: sumi (AVX2's 8 s32 lanes) times y.d * xd into acc, and the mins
 * dot (AVX2's 4 s32 lanes, here in lanes 0, 2, 4, 6 of each half) times
 * y.d * -xdmin into acc_m: AVX2 computes y.d * xd and -y.d * xdmin, the same
 * roundings. The final sums follow AVX2's hsum order. */
static ALWAYS_INLINE void k4_multi(int64_t n, const uint8_t *xb, size_t block_bytes, int five_bit, const void *const *a,
                                   int nt, float *const *out) {
    enum { MAX_PAIRS = (MOEX_DOT_MAX_TOKENS + 1) / 2 };
    const int np = (nt + 1) / 2;
    const moex_block_q8_K *y[2 * MAX_PAIRS];
    __m512 acc[MAX_PAIRS], acc_m[MAX_PAIRS];
    for (int t = 0; t < 2 * np; t++) y[t] = a[t < nt ? t : nt - 1];
    for (int p = 0; p < np; p++) acc[p] = acc_m[p] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / MOEX_QK_K; i++, xb += block_bytes) {
        const moex_block_q4_K *x = (const moex_block_q4_K *)xb;
        const uint8_t *qs = five_bit ? ((const moex_block_q5_K *)xb)->qs : x->qs;
        const uint8_t *qh = five_bit ? ((const moex_block_q5_K *)xb)->qh : NULL;
        uint32_t u[4];
        moex_k4_unpack_scales_mins(x->scales, u);
        const __m512i scales = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)u[1], (int)u[0])));
        /* mins m0 m0 m1 m1 ... m7 m7 as s16: madd with bsums gives m_k * (b_2k + b_2k+1) */
        const __m128i m8 = _mm_set_epi32(0, 0, (int)u[3], (int)u[2]);
        const __m256i mins_dup = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        const __m512 xd = _mm512_set1_ps(f16(x->d)), neg_xdmin = _mm512_set1_ps(-f16(x->dmin));
        __m512i sumi[MOEX_DOT_MAX_TOKENS];
        FOR_T sumi[t] = _mm512_setzero_si512();
        for (int g = 0; g < 4; g++) {
            const __m512i q = k4_weights(qs, qh, g);
            const __m512i s = _mm512_shuffle_epi8(scales, _mm512_load_si512(k_k4_scale_pair[g]));
            FOR_T {
                const __m512i y8 = _mm512_loadu_si512(y[t][i].qs + 64 * g);
                sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(q, y8), s);
            }
        }
        for (int p = 0; p < np; p++) {
            const int ta = 2 * p, tb = 2 * p + 1 < nt ? 2 * p + 1 : 2 * p;
            const __m512 yd = pair_ps(y[ta][i].d, y[tb][i].d);
            acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(yd, xd), _mm512_cvtepi32_ps(fold_pair(sumi[ta], sumi[tb])), acc[p]);
            const __m256i ma = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[ta][i].bsums), mins_dup);
            const __m256i mb = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[tb][i].bsums), mins_dup);
            const __m512i m2 = _mm512_inserti64x4(_mm512_castsi256_si512(ma), mb, 1);
            const __m512i mins = _mm512_add_epi32(m2, _mm512_srli_epi64(m2, 32)); /* even lanes: AVX2's 4 */
            acc_m[p] = _mm512_fmadd_ps(_mm512_mul_ps(yd, neg_xdmin), _mm512_cvtepi32_ps(mins), acc_m[p]);
        }
    }
    const __m512i even = _mm512_set_epi32(0, 0, 0, 0, 14, 12, 10, 8, 0, 0, 0, 0, 6, 4, 2, 0);
    FOR_T {
        const __m512 m = _mm512_permutexvar_ps(even, acc_m[t / 2]);
        const __m128 mins = t % 2 ? _mm512_extractf32x4_ps(m, 2) : _mm512_castps512_ps128(m);
        *out[t] = hsum_ps(half_ps(acc[t / 2], t % 2)) + hsum_ps128(mins);
    }
}

static void dot_q4_K_multi(int64_t n, const void *w, const void *const *a, int nt, float *const *out) {
#define CALL(k) k4_multi(n, w, sizeof(moex_block_q4_K), 0, a, k, out)
    DISPATCH_NT(nt, CALL)
#undef CALL
}

static void dot_q5_K_multi(int64_t n, const void *w, const void *const *a, int nt, float *const *out) {
#define CALL(k) k4_multi(n, w, sizeof(moex_block_q5_K), 1, a, k, out)
    DISPATCH_NT(nt, CALL)
#undef CALL
}

/* ---- Q6_K ---- */

/* vpshufb masks over 8 s16 scales repeated in each 128-bit lane: lane j
 * broadcasts scale j (first) or 4 + j (second), one per 16 elements. */
static const uint8_t k_q6_scale_quad[2][64] __attribute__((aligned(64))) = {
#define B2(k) 2 * (k), 2 * (k) + 1
#define LANE(k) B2(k), B2(k), B2(k), B2(k), B2(k), B2(k), B2(k), B2(k)
    {LANE(0), LANE(1), LANE(2), LANE(3)},
    {LANE(4), LANE(5), LANE(6), LANE(7)},
#undef LANE
#undef B2
};

/* As AVX2: 16-element sub-blocks, q = 0..63, and the -32 offset applied
 * through the Q8_K partial sums (-32 * sum sc_k bsum_k, which seeds sumi).
 * A 512-bit register holds AVX2's runs k and k + 1 of a 128-element half. */
static ALWAYS_INLINE void q6_K_multi(int64_t n, const moex_block_q6_K *x, const void *const *a, int nt,
                                     float *const *out) {
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
    enum { MAX_PAIRS = (MOEX_DOT_MAX_TOKENS + 1) / 2 };
    const int np = (nt + 1) / 2;
    const moex_block_q8_K *y[2 * MAX_PAIRS];
    __m512 acc[MAX_PAIRS]; /* token pairs, as in k4_multi */
    for (int t = 0; t < 2 * np; t++) y[t] = a[t < nt ? t : nt - 1];
    for (int p = 0; p < np; p++) acc[p] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / MOEX_QK_K; i++) {
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const __m256i sc_m32 = _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), sc16), 5); /* fits s16 */
        __m512i sumi[MOEX_DOT_MAX_TOKENS];
        FOR_T {
            const __m256i b = _mm256_loadu_si256((const __m256i *)y[t][i].bsums);
            sumi[t] = _mm512_zextsi256_si512(_mm256_dpwssd_epi32(_mm256_setzero_si256(), sc_m32, b));
        }
        for (int h = 0; h < 2; h++) {
            const __m512i l = _mm512_loadu_si512(x[i].ql + 64 * h); /* AVX2's l0 | l1 */
            const __m512i hb = broadcast_256(x[i].qh + 32 * h);
            /* high bit pairs moved to bits 4-5: runs 0 | 1 take qh bits 0-1 | 2-3, runs 2 | 3 bits 4-5 | 6-7 */
            const __m512i h01 = _mm512_mask_slli_epi16(_mm512_slli_epi16(hb, 2), LOW_HALF_16, hb, 4);
            const __m512i h23 = _mm512_mask_srli_epi16(hb, HIGH_HALF_16, hb, 2);
            const __m512i q01 = _mm512_ternarylogic_epi32(l, m4, _mm512_and_si512(h01, m30), 0xEA); /* l & m4 | h */
            const __m512i q23 =
                _mm512_ternarylogic_epi32(_mm512_srli_epi16(l, 4), m4, _mm512_and_si512(h23, m30), 0xEA);
            const __m128i sc_h = h ? _mm256_extracti128_si256(sc16, 1) : _mm256_castsi256_si128(sc16);
            const __m512i sc4 = _mm512_broadcast_i32x4(sc_h);
            const __m512i s01 = _mm512_shuffle_epi8(sc4, _mm512_load_si512(k_q6_scale_quad[0]));
            const __m512i s23 = _mm512_shuffle_epi8(sc4, _mm512_load_si512(k_q6_scale_quad[1]));
            FOR_T {
                const int8_t *q8 = y[t][i].qs + 128 * h;
                sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(q01, _mm512_loadu_si512(q8)), s01);
                sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(q23, _mm512_loadu_si512(q8 + 64)), s23);
            }
        }
        const __m512 xd = _mm512_set1_ps(f16(x[i].d));
        for (int p = 0; p < np; p++) {
            const int ta = 2 * p, tb = 2 * p + 1 < nt ? 2 * p + 1 : 2 * p;
            const __m512 d = _mm512_mul_ps(pair_ps(y[ta][i].d, y[tb][i].d), xd);
            acc[p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(fold_pair(sumi[ta], sumi[tb])), acc[p]);
        }
    }
    FOR_T *out[t] = hsum_ps(half_ps(acc[t / 2], t % 2));
}

static void dot_q6_K_multi(int64_t n, const void *w, const void *const *a, int nt, float *const *out) {
#define CALL(k) q6_K_multi(n, w, a, k, out)
    DISPATCH_NT(nt, CALL)
#undef CALL
}

/* ---- Q8_0 ---- */

/* As AVX2 (two accumulators for alternate blocks); vpdpbusd on |x| and
 * y * sign(x) replaces maddubs + madd(1). */
static ALWAYS_INLINE void q8_0_multi(int64_t n, const moex_block_q8_0 *x, const void *const *a, int nt,
                                     float *const *out) {
    const moex_block_q8_0 *y[MOEX_DOT_MAX_TOKENS];
    __m256 acc0[MOEX_DOT_MAX_TOKENS], acc1[MOEX_DOT_MAX_TOKENS];
    FOR_T {
        y[t] = a[t];
        acc0[t] = acc1[t] = _mm256_setzero_ps();
    }
    const int64_t nb = n / 32;
    const __m256i zero = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)x[i + 1].qs);
        const __m256i ax0 = _mm256_sign_epi8(x0, x0), ax1 = _mm256_sign_epi8(x1, x1);
        const float d0 = f16(x[i].d), d1 = f16(x[i + 1].d);
        FOR_T {
            const __m256i y0 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y[t][i].qs), x0);
            const __m256i y1 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y[t][i + 1].qs), x1);
            const __m256i p0 = _mm256_dpbusd_epi32(zero, ax0, y0), p1 = _mm256_dpbusd_epi32(zero, ax1, y1);
            acc0[t] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * f16(y[t][i].d)), _mm256_cvtepi32_ps(p0), acc0[t]);
            acc1[t] = _mm256_fmadd_ps(_mm256_set1_ps(d1 * f16(y[t][i + 1].d)), _mm256_cvtepi32_ps(p1), acc1[t]);
        }
    }
    for (; i < nb; i++) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i ax0 = _mm256_sign_epi8(x0, x0);
        FOR_T {
            const __m256i y0 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y[t][i].qs), x0);
            const __m256i p = _mm256_dpbusd_epi32(zero, ax0, y0);
            acc0[t] = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * f16(y[t][i].d)), _mm256_cvtepi32_ps(p), acc0[t]);
        }
    }
    FOR_T *out[t] = hsum_ps(_mm256_add_ps(acc0[t], acc1[t]));
}

static void dot_q8_0_multi(int64_t n, const void *w, const void *const *a, int nt, float *const *out) {
#define CALL(k) q8_0_multi(n, w, a, k, out)
    DISPATCH_NT(nt, CALL)
#undef CALL
}

/* Only the multi-token kernels: simd.c fills the rest from the AVX2 table. */
const moex_simd_table moex_simd_table_vnni = {
    .name = "avx512vnni",
    .vec_dot_multi = {
        [MOEX_TYPE_Q8_0] = dot_q8_0_multi,
        [MOEX_TYPE_Q4_K] = dot_q4_K_multi,
        [MOEX_TYPE_Q5_K] = dot_q5_K_multi,
        [MOEX_TYPE_Q6_K] = dot_q6_K_multi,
    },
};

#endif
