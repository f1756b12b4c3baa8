/* AVX2 + FMA + F16C dot products and activation quantizers. This file is
 * compiled with -mavx2 -mfma -mf16c (kernels/CMakeLists.txt) and only its
 * table is referenced from outside, after simd.c has checked the CPU.
 *
 * Integer products use maddubs (u8 x s8 -> s16 pairs) then madd (-> s32),
 * as ggml does; block scales are applied in f32 with FMA. */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include "kernels/kernels_internal.h"

static inline float f16(moex_f16 h) { return _cvtsh_ss(h); }

static inline float hsum_ps(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline float hsum_ps128(__m128 r) {
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* 16 s16 pairs -> 8 s32 sums */
static inline __m256i sum_pairs_i16(__m256i x) { return _mm256_madd_epi16(_mm256_set1_epi16(1), x); }

/* Sums of 4 consecutive s8 * s8 products, as 8 s32. */
static inline __m256i dot_i8(__m256i x, __m256i y) {
    return sum_pairs_i16(_mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)));
}

/* Same for unsigned x (0..127). */
static inline __m256i dot_u8_i8(__m256i x, __m256i y) { return sum_pairs_i16(_mm256_maddubs_epi16(x, y)); }

/* 16 bytes of nibbles -> 32 bytes: low nibbles first, then high nibbles. */
static inline __m256i nibbles_32(const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set1_epi8(0x0F), _mm256_set_m128i(_mm_srli_epi16(t, 4), t));
}

/* 32 bits -> 32 bytes, 0xFF where the bit is set. */
static inline __m256i bits_to_bytes_32(const uint8_t *p) {
    uint32_t x32;
    memcpy(&x32, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x32), shuf);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

/* ---- float weights with f32 activations ---- */

static void dot_f32(int64_t n, const void *w, const void *a, float *out) {
    const float *x = w, *y = a;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * k), _mm256_loadu_ps(y + i + 8 * k), acc[k]);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) sum += x[i] * y[i];
    *out = sum;
}

static void dot_f16(int64_t n, const void *w, const void *a, float *out) {
    const moex_f16 *x = w;
    const float *y = a;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) {
            const __m256 wx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i + 8 * k)));
            acc[k] = _mm256_fmadd_ps(wx, _mm256_loadu_ps(y + i + 8 * k), acc[k]);
        }
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) sum += f16(x[i]) * y[i];
    *out = sum;
}

static void dot_bf16(int64_t n, const void *w, const void *a, float *out) {
    const moex_bf16 *x = w;
    const float *y = a;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) {
            const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i + 8 * k)));
            const __m256 wx = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
            acc[k] = _mm256_fmadd_ps(wx, _mm256_loadu_ps(y + i + 8 * k), acc[k]);
        }
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) sum += moex_bf16_to_f32(x[i]) * y[i];
    *out = sum;
}

/* ---- 32-element blocks ---- */

static void dot_q4_0(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q4_0 *x = w;
    const moex_block_q8_0 *y = a;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i qx = _mm256_sub_epi8(nibbles_32(x[i].qs), _mm256_set1_epi8(8));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256 d = _mm256_set1_ps(f16(x[i].d) * f16(y[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(qx, qy)), acc);
    }
    *out = hsum_ps(acc);
}

static void dot_q4_1(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q4_1 *x = w;
    const moex_block_q8_1 *y = a;
    __m256 acc = _mm256_setzero_ps();
    float mins = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        mins += f16(x[i].m) * f16(y[i].s);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256 d = _mm256_set1_ps(f16(x[i].d) * f16(y[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_u8_i8(nibbles_32(x[i].qs), qy)), acc);
    }
    *out = hsum_ps(acc) + mins;
}

static void dot_q5_0(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q5_0 *x = w;
    const moex_block_q8_0 *y = a;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++) {
        /* q - 16 as s8: OR 0xF0 into elements whose 5th bit is clear */
        const __m256i hi = _mm256_andnot_si256(bits_to_bytes_32(x[i].qh), _mm256_set1_epi8((char)0xF0));
        const __m256i qx = _mm256_or_si256(nibbles_32(x[i].qs), hi);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256 d = _mm256_set1_ps(f16(x[i].d) * f16(y[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(qx, qy)), acc);
    }
    *out = hsum_ps(acc);
}

static void dot_q5_1(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q5_1 *x = w;
    const moex_block_q8_1 *y = a;
    __m256 acc = _mm256_setzero_ps();
    float mins = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        mins += f16(x[i].m) * f16(y[i].s);
        const __m256i hi = _mm256_and_si256(bits_to_bytes_32(x[i].qh), _mm256_set1_epi8(0x10));
        const __m256i qx = _mm256_or_si256(nibbles_32(x[i].qs), hi);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256 d = _mm256_set1_ps(f16(x[i].d) * f16(y[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_u8_i8(qx, qy)), acc);
    }
    *out = hsum_ps(acc) + mins;
}

/* Up to MOEX_DOT_MAX_TOKENS activation rows against one weight row: the
 * weight block is loaded (and unpacked) once for all of them. The float
 * operations per token are exactly those of the one-token kernel, so results
 * do not depend on how tokens are grouped. */
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define FOR_T for (int t = 0; t < nt; t++)
/* Tokens per kernel call: the accumulators of 4 fill the 16 ymm registers. */
#define AVX2_TOKENS 4
_Static_assert(MOEX_DOT_MAX_TOKENS <= 2 * AVX2_TOKENS, "multi kernels below split nt into at most two groups");

/* Runs call(a, nt, out) over groups of at most AVX2_TOKENS tokens (each
 * token's result does not depend on its group). */
#define SPLIT_TOKENS(nt, a, out, call)                                                                               \
    do {                                                                                                             \
        if ((nt) > AVX2_TOKENS) {                                                                                    \
            call((a), AVX2_TOKENS, (out));                                                                           \
            call((a) + AVX2_TOKENS, (nt) - AVX2_TOKENS, (out) + AVX2_TOKENS);                                        \
        } else {                                                                                                     \
            call((a), (nt), (out));                                                                                  \
        }                                                                                                            \
    } while (0)

/* 32-value blocks of signed 8-bit values with one scale, dotted with Q8_0:
 * Q8_0 itself, and MXFP4, whose codes become their doubled E2M1 values
 * (-12..12) through one byte shuffle of ggml's table, with the scale
 * e8m0_half(e). `kind` is a constant at each caller, so each type compiles to
 * its own loop. */
enum { I8_Q8_0, I8_MXFP4 };

static ALWAYS_INLINE __m256i i8_values(const void *x, int64_t i, int kind, __m256i table) {
    if (kind == I8_MXFP4) return _mm256_shuffle_epi8(table, nibbles_32(((const moex_block_mxfp4 *)x)[i].qs));
    return _mm256_loadu_si256((const __m256i *)((const moex_block_q8_0 *)x)[i].qs);
}

static ALWAYS_INLINE float i8_scale(const void *x, int64_t i, int kind) {
    if (kind == I8_MXFP4) return moex_e8m0_to_f32_half(((const moex_block_mxfp4 *)x)[i].e);
    return f16(((const moex_block_q8_0 *)x)[i].d);
}

/* Two blocks a step into two accumulators per token. */
static ALWAYS_INLINE void i8_multi(int64_t n, const void *x, int kind, const void *const *a, int nt,
                                   float *const *out) {
    const __m256i table = kind == I8_MXFP4
                              ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)moex_kvalues_mxfp4))
                              : _mm256_setzero_si256();
    const moex_block_q8_0 *y[MOEX_DOT_MAX_TOKENS];
    __m256 acc0[MOEX_DOT_MAX_TOKENS], acc1[MOEX_DOT_MAX_TOKENS];
    FOR_T {
        y[t] = a[t];
        acc0[t] = acc1[t] = _mm256_setzero_ps();
    }
    const int64_t nb = n / 32;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m256i x0 = i8_values(x, i, kind, table), x1 = i8_values(x, i + 1, kind, table);
        const __m256i ax0 = _mm256_sign_epi8(x0, x0), ax1 = _mm256_sign_epi8(x1, x1);
        const float d0 = i8_scale(x, i, kind), d1 = i8_scale(x, i + 1, kind);
        FOR_T {
            const __m256i y0 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y[t][i].qs), x0);
            const __m256i y1 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y[t][i + 1].qs), x1);
            const __m256i p0 = sum_pairs_i16(_mm256_maddubs_epi16(ax0, y0));
            const __m256i p1 = sum_pairs_i16(_mm256_maddubs_epi16(ax1, y1));
            acc0[t] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * f16(y[t][i].d)), _mm256_cvtepi32_ps(p0), acc0[t]);
            acc1[t] = _mm256_fmadd_ps(_mm256_set1_ps(d1 * f16(y[t][i + 1].d)), _mm256_cvtepi32_ps(p1), acc1[t]);
        }
    }
    for (; i < nb; i++) {
        const __m256i x0 = i8_values(x, i, kind, table);
        const float d0 = i8_scale(x, i, kind);
        FOR_T {
            const __m256i p = dot_i8(x0, _mm256_loadu_si256((const __m256i *)y[t][i].qs));
            acc0[t] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * f16(y[t][i].d)), _mm256_cvtepi32_ps(p), acc0[t]);
        }
    }
    FOR_T *out[t] = hsum_ps(_mm256_add_ps(acc0[t], acc1[t]));
}

/* dot_NAME, dot_NAME_multi (any number of tokens, in groups of up to 4, each group's count a constant). */
#define I8_DOTS(name, kind)                                                                                          \
    static void dot_##name(int64_t n, const void *w, const void *a, float *out) { i8_multi(n, w, kind, &a, 1, &out); } \
    static void dot_##name##_multi_upto4(int64_t n, const void *w, const void *const *a, int nt, float *const *out) { \
        switch (nt) {                                                                                                \
        case 1: i8_multi(n, w, kind, a, 1, out); break;                                                              \
        case 2: i8_multi(n, w, kind, a, 2, out); break;                                                              \
        case 3: i8_multi(n, w, kind, a, 3, out); break;                                                              \
        default: i8_multi(n, w, kind, a, 4, out); break;                                                             \
        }                                                                                                            \
    }                                                                                                                \
    static void dot_##name##_multi(int64_t n, const void *w, const void *const *a, int nt, float *const *out) {     \
        SPLIT_TOKENS(nt, a, out, CALL_##name);                                                                       \
    }
#define CALL_q8_0(a_, nt_, out_) dot_q8_0_multi_upto4(n, w, a_, nt_, out_)
#define CALL_mxfp4(a_, nt_, out_) dot_mxfp4_multi_upto4(n, w, a_, nt_, out_)
I8_DOTS(q8_0, I8_Q8_0)
I8_DOTS(mxfp4, I8_MXFP4)
#undef CALL_q8_0
#undef CALL_mxfp4
#undef I8_DOTS

/* ---- K-quants with Q8_K ---- */

/* sum_j mins[j] * (bsums[2j] + bsums[2j+1]) as 4 s32 (mins in the high half of
 * the 16 s16 scales_mins). */
static inline __m128i k4_mins_dot(__m256i scales_mins, const int16_t bsums[16]) {
    const __m256i b = _mm256_loadu_si256((const __m256i *)bsums);
    const __m128i pair_sums = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    return _mm_madd_epi16(_mm256_extracti128_si256(scales_mins, 1), pair_sums);
}

/* vpshufb masks broadcasting the s16 at index k of a 128-bit lane. */
static const uint8_t k_broadcast_s16[8][32] __attribute__((aligned(32))) = {
#define B2(k) 2 * k, 2 * k + 1
#define ROW(k) {B2(k), B2(k), B2(k), B2(k), B2(k), B2(k), B2(k), B2(k), B2(k), B2(k), B2(k), B2(k), B2(k), B2(k), B2(k), B2(k)}
    ROW(0), ROW(1), ROW(2), ROW(3), ROW(4), ROW(5), ROW(6), ROW(7),
#undef ROW
#undef B2
};

static inline __m256i broadcast_s16(__m256i v, int k) {
    return _mm256_shuffle_epi8(v, _mm256_load_si256((const __m256i *)k_broadcast_s16[k]));
}

/* Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins. The mins
 * term, sum_j m_j * (bsums[2j] + bsums[2j+1]), comes from the Q8_K partial
 * sums; five_bit adds qh's bit per element (Q5_K). */
static ALWAYS_INLINE void k4_multi(int64_t n, const uint8_t *xb, size_t block_bytes, int five_bit, const void *const *a,
                                   int nt, float *const *out) {
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    const moex_block_q8_K *y[MOEX_DOT_MAX_TOKENS];
    __m256 acc[MOEX_DOT_MAX_TOKENS];
    __m128 acc_m[MOEX_DOT_MAX_TOKENS];
    FOR_T {
        y[t] = a[t];
        acc[t] = _mm256_setzero_ps();
        acc_m[t] = _mm_setzero_ps();
    }
    for (int64_t i = 0; i < n / MOEX_QK_K; i++, xb += block_bytes) {
        /* Q4_K and Q5_K share d, dmin, scales; then Q5_K has qh before qs */
        const moex_block_q4_K *x = (const moex_block_q4_K *)xb;
        const uint8_t *qs = five_bit ? ((const moex_block_q5_K *)xb)->qs : x->qs;
        uint32_t u[4];
        moex_k4_unpack_scales_mins(x->scales, u);
        /* from registers, not memory: a 16-byte load of four 4-byte stores stalls */
        const __m256i scales_mins = _mm256_cvtepu8_epi16(_mm_set_epi32((int)u[3], (int)u[2], (int)u[1], (int)u[0]));
        const __m256i scales = _mm256_permute2x128_si256(scales_mins, scales_mins, 0x00);
        const __m256i hbits = five_bit ? _mm256_loadu_si256((const __m256i *)((const moex_block_q5_K *)xb)->qh)
                                       : _mm256_setzero_si256();
        __m256i sumi[MOEX_DOT_MAX_TOKENS];
        FOR_T sumi[t] = _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
            __m256i lo = _mm256_and_si256(bits, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            if (five_bit) {
                const __m256i h_lo = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * g)), one);
                const __m256i h_hi = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * g + 1)), one);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(h_lo, 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(h_hi, 4));
            }
            const __m256i s_lo = broadcast_s16(scales, 2 * g), s_hi = broadcast_s16(scales, 2 * g + 1);
            FOR_T {
                const int8_t *q8 = y[t][i].qs + 64 * g;
                const __m256i p_lo = _mm256_madd_epi16(s_lo, _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8)));
                const __m256i p_hi =
                    _mm256_madd_epi16(s_hi, _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32))));
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p_lo, p_hi));
            }
        }
        const float xd = f16(x->d), xdmin = f16(x->dmin);
        FOR_T {
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(y[t][i].d * xd), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            const __m128i mins = k4_mins_dot(scales_mins, y[t][i].bsums);
            acc_m[t] = _mm_fmadd_ps(_mm_set1_ps(-y[t][i].d * xdmin), _mm_cvtepi32_ps(mins), acc_m[t]);
        }
    }
    FOR_T *out[t] = hsum_ps(acc[t]) + hsum_ps128(acc_m[t]);
}

static void dot_q4_K(int64_t n, const void *w, const void *a, float *out) {
    k4_multi(n, w, sizeof(moex_block_q4_K), 0, &a, 1, &out);
}

static void dot_q5_K(int64_t n, const void *w, const void *a, float *out) {
    k4_multi(n, w, sizeof(moex_block_q5_K), 1, &a, 1, &out);
}

static void dot_q4_K_multi_upto4(int64_t n, const void *w, const void *const *a, int nt, float *const *out) {
    switch (nt) {
    case 1: k4_multi(n, w, sizeof(moex_block_q4_K), 0, a, 1, out); break;
    case 2: k4_multi(n, w, sizeof(moex_block_q4_K), 0, a, 2, out); break;
    case 3: k4_multi(n, w, sizeof(moex_block_q4_K), 0, a, 3, out); break;
    default: k4_multi(n, w, sizeof(moex_block_q4_K), 0, a, 4, out); break;
    }
}

static void dot_q4_K_multi(int64_t n, const void *w, const void *const *a, int nt, float *const *out) {
#define CALL(a_, nt_, out_) dot_q4_K_multi_upto4(n, w, a_, nt_, out_)
    SPLIT_TOKENS(nt, a, out, CALL);
#undef CALL
}

static void dot_q5_K_multi_upto4(int64_t n, const void *w, const void *const *a, int nt, float *const *out) {
    switch (nt) {
    case 1: k4_multi(n, w, sizeof(moex_block_q5_K), 1, a, 1, out); break;
    case 2: k4_multi(n, w, sizeof(moex_block_q5_K), 1, a, 2, out); break;
    case 3: k4_multi(n, w, sizeof(moex_block_q5_K), 1, a, 3, out); break;
    default: k4_multi(n, w, sizeof(moex_block_q5_K), 1, a, 4, out); break;
    }
}

static void dot_q5_K_multi(int64_t n, const void *w, const void *const *a, int nt, float *const *out) {
#define CALL(a_, nt_, out_) dot_q5_K_multi_upto4(n, w, a_, nt_, out_)
    SPLIT_TOKENS(nt, a, out, CALL);
#undef CALL
}

/* vpshufb masks for Q6_K: low lane broadcasts s16 2k, high lane s16 2k+1. */
static const uint8_t k_q6_scale_pair[4][32] __attribute__((aligned(32))) = {
#define B2(k) 2 * (k), 2 * (k) + 1
#define HALF(k) B2(k), B2(k), B2(k), B2(k), B2(k), B2(k), B2(k), B2(k)
#define ROW(k) {HALF(2 * k), HALF(2 * k + 1)}
    ROW(0), ROW(1), ROW(2), ROW(3),
#undef ROW
#undef HALF
#undef B2
};

/* Q6_K: each half of 128 elements gives four runs of 32 (q values 0..63);
 * 16-element sub-blocks, so the low 128 bits of a run use one scale and the
 * high 128 bits the next. The -32 offset is applied once per block through
 * the Q8_K partial sums: sum sc_k * (q - 32) y = sum sc_k q y - 32 sum sc_k bsum_k. */
static ALWAYS_INLINE void q6_K_multi(int64_t n, const moex_block_q6_K *x, const void *const *a, int nt,
                                     float *const *out) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
    const moex_block_q8_K *y[MOEX_DOT_MAX_TOKENS];
    __m256 acc[MOEX_DOT_MAX_TOKENS];
    FOR_T {
        y[t] = a[t];
        acc[t] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < n / MOEX_QK_K; i++) {
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        __m256i sumi[MOEX_DOT_MAX_TOKENS];
        FOR_T {
            const __m256i offs = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)y[t][i].bsums));
            sumi[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offs, 5));
        }
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const __m256i sc_h = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11) /* immediates even at -O0 */
                                  : _mm256_permute2x128_si256(sc16, sc16, 0x00);
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
            for (int k = 0; k < 4; k++) {
                const __m256i s = _mm256_shuffle_epi8(sc_h, _mm256_load_si256((const __m256i *)k_q6_scale_pair[k]));
                FOR_T {
                    const __m256i y8 = _mm256_loadu_si256((const __m256i *)(y[t][i].qs + 128 * h + 32 * k));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(s, _mm256_maddubs_epi16(q[k], y8)));
                }
            }
        }
        const float xd = f16(x[i].d);
        FOR_T acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(y[t][i].d * xd), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
    }
    FOR_T *out[t] = hsum_ps(acc[t]);
}

static void dot_q6_K(int64_t n, const void *w, const void *a, float *out) { q6_K_multi(n, w, &a, 1, &out); }

static void dot_q6_K_multi_upto4(int64_t n, const void *w, const void *const *a, int nt, float *const *out) {
    switch (nt) {
    case 1: q6_K_multi(n, w, a, 1, out); break;
    case 2: q6_K_multi(n, w, a, 2, out); break;
    case 3: q6_K_multi(n, w, a, 3, out); break;
    default: q6_K_multi(n, w, a, 4, out); break;
    }
}

static void dot_q6_K_multi(int64_t n, const void *w, const void *const *a, int nt, float *const *out) {
#define CALL(a_, nt_, out_) dot_q6_K_multi_upto4(n, w, a_, nt_, out_)
    SPLIT_TOKENS(nt, a, out, CALL);
#undef CALL
}

/* ---- activation quantizers ---- */

static inline float hmax_ps(__m256 v) {
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline float hmin_ps(__m256 v) {
    __m128 r = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_min_ps(r, _mm_movehl_ps(r, r));
    r = _mm_min_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* 32 floats * scale, rounded to nearest even, saturated to s8. */
static inline __m256i round_to_i8_32(const float *x, __m256 scale) {
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), scale));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), scale));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), scale));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), scale));
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    /* the packs interleave 128-bit lanes; restore element order */
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static float absmax_32(const float *x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_andnot_ps(sign, _mm256_loadu_ps(x));
    for (int k = 8; k < 32; k += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));
    return hmax_ps(m);
}

/* Same d as the reference; rounds ties to even where the reference uses roundf. */
static void quantize_q8_0(const float *x, void *dst, int64_t n) {
    moex_block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        const float d = absmax_32(x) / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = moex_f32_to_f16(d);
        _mm256_storeu_si256((__m256i *)y[i].qs, round_to_i8_32(x, _mm256_set1_ps(id)));
    }
}

static void quantize_q8_1(const float *x, void *dst, int64_t n) {
    moex_block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        const float d = absmax_32(x) / 127;
        const float id = d ? 1.0f / d : 0.0f;
        const __m256i q = round_to_i8_32(x, _mm256_set1_ps(id));
        _mm256_storeu_si256((__m256i *)y[i].qs, q);
        const __m256i s32 = sum_pairs_i16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q));
        const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
        const __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        const int sum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
        y[i].d = moex_f32_to_f16(d);
        y[i].s = moex_f32_to_f16((float)sum * d);
    }
}

/* Matches moex_quantize_q8_K_ref bit for bit, except which sign d takes when
 * +a and -a are both the extreme (the products are then identical). */
static void quantize_q8_K(const float *x, void *dst, int64_t n) {
    moex_block_q8_K *y = dst;
    for (int64_t i = 0; i < n / MOEX_QK_K; i++, x += MOEX_QK_K) {
        __m256 vmax = _mm256_loadu_ps(x), vmin = vmax;
        for (int k = 8; k < MOEX_QK_K; k += 8) {
            const __m256 v = _mm256_loadu_ps(x + k);
            vmax = _mm256_max_ps(vmax, v);
            vmin = _mm256_min_ps(vmin, v);
        }
        const float hi = hmax_ps(vmax), lo = hmin_ps(vmin);
        const float max = hi >= -lo ? hi : lo;
        if (max == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        const __m256 s = _mm256_set1_ps(iscale);
        for (int k = 0; k < MOEX_QK_K; k += 32) {
            const __m256i q = round_to_i8_32(x + k, s);
            _mm256_storeu_si256((__m256i *)(y[i].qs + k), q);
            /* 16-element sums: pairs -> quads (s32) -> two s16 sums via hadd */
            const __m256i quads = sum_pairs_i16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q));
            const __m256i oct = _mm256_hadd_epi32(quads, quads); /* lane: q0+q1, q2+q3 | q4+q5, q6+q7 */
            const __m256i hex = _mm256_hadd_epi32(oct, oct);
            y[i].bsums[k / 16] = (int16_t)_mm256_extract_epi32(hex, 0);
            y[i].bsums[k / 16 + 1] = (int16_t)_mm256_extract_epi32(hex, 4);
        }
        y[i].d = 1 / iscale;
    }
}

const moex_simd_table moex_simd_table_avx2 = {
    .name = "avx2",
    .vec_dot = {
        [MOEX_TYPE_F32] = dot_f32,
        [MOEX_TYPE_F16] = dot_f16,
        [MOEX_TYPE_BF16] = dot_bf16,
        [MOEX_TYPE_Q4_0] = dot_q4_0,
        [MOEX_TYPE_Q4_1] = dot_q4_1,
        [MOEX_TYPE_Q5_0] = dot_q5_0,
        [MOEX_TYPE_Q5_1] = dot_q5_1,
        [MOEX_TYPE_Q8_0] = dot_q8_0,
        [MOEX_TYPE_Q4_K] = dot_q4_K,
        [MOEX_TYPE_Q5_K] = dot_q5_K,
        [MOEX_TYPE_Q6_K] = dot_q6_K,
        [MOEX_TYPE_MXFP4] = dot_mxfp4,
    },
    .vec_dot_multi = {
        [MOEX_TYPE_Q8_0] = dot_q8_0_multi,
        [MOEX_TYPE_MXFP4] = dot_mxfp4_multi,
        [MOEX_TYPE_Q4_K] = dot_q4_K_multi,
        [MOEX_TYPE_Q5_K] = dot_q5_K_multi,
        [MOEX_TYPE_Q6_K] = dot_q6_K_multi,
    },
    .quantize_act = {
        [MOEX_TYPE_Q8_0] = quantize_q8_0,
        [MOEX_TYPE_Q8_1] = quantize_q8_1,
        [MOEX_TYPE_Q8_K] = quantize_q8_K,
    },
};

#endif
