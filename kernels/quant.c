/* Row conversion between f32 and every stored type, bit-compatible with
 * ggml (dequantize_row_* and quantize_row_*_ref in ggml-quants.c). Scalar C:
 * dequantization serves embedding lookups and tests, quantization serves
 * tests and tools; the hot paths live in the dot products. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_internal.h"

#define GROUP_MAX_EPS 1e-15f

static inline float f16(moex_f16 h) { return moex_f16_to_f32(h); }
static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* ------------------------------------------------------------------ */
/* dequantization                                                      */
/* ------------------------------------------------------------------ */

static void dequant_q4_0(const moex_block_q4_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = f16(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * ((b[i].qs[j] & 0xF) - 8);
            y[j + 16] = d * ((b[i].qs[j] >> 4) - 8);
        }
    }
}

static void dequant_q4_1(const moex_block_q4_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = f16(b[i].d), m = f16(b[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (b[i].qs[j] & 0xF) + m;
            y[j + 16] = d * (b[i].qs[j] >> 4) + m;
        }
    }
}

/* 5-bit quants: low nibble in qs, bit j of qh is the 5th bit of element j. */
static void unpack_q5(const uint8_t qh_bytes[4], const uint8_t qs[16], int q[32]) {
    uint32_t qh;
    memcpy(&qh, qh_bytes, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0xF) | (((qh >> j) << 4) & 0x10);
        q[j + 16] = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
    }
}

static void dequant_q5_0(const moex_block_q5_0 *b, float *y, int64_t nb) {
    int q[32];
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = f16(b[i].d);
        unpack_q5(b[i].qh, b[i].qs, q);
        for (int j = 0; j < 32; j++) y[j] = d * (q[j] - 16);
    }
}

static void dequant_q5_1(const moex_block_q5_1 *b, float *y, int64_t nb) {
    int q[32];
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = f16(b[i].d), m = f16(b[i].m);
        unpack_q5(b[i].qh, b[i].qs, q);
        for (int j = 0; j < 32; j++) y[j] = d * q[j] + m;
    }
}

static void dequant_q8_0(const moex_block_q8_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = f16(b[i].d);
        for (int j = 0; j < 32; j++) y[j] = d * b[i].qs[j];
    }
}

static void dequant_q8_1(const moex_block_q8_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = f16(b[i].d);
        for (int j = 0; j < 32; j++) y[j] = d * b[i].qs[j];
    }
}

/* Q4_K: 4 groups of 64; each group's 32 bytes hold two 32-element sub-blocks
 * (low nibbles first). */
static void dequant_q4_K(const moex_block_q4_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = f16(b[i].d), dmin = f16(b[i].dmin);
        const uint8_t *q = b[i].qs;
        for (int g = 0; g < 4; g++, q += 32) {
            uint8_t sc0, m0, sc1, m1;
            moex_k4_scale_min(2 * g, b[i].scales, &sc0, &m0);
            moex_k4_scale_min(2 * g + 1, b[i].scales, &sc1, &m1);
            const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
            for (int l = 0; l < 32; l++) *y++ = d0 * (q[l] & 0xF) - mm0;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] >> 4) - mm1;
        }
    }
}

/* Q5_K: as Q4_K, plus qh: bit 2g of qh[l] is the 5th bit of element l of
 * group g's first sub-block, bit 2g+1 of its second. */
static void dequant_q5_K(const moex_block_q5_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = f16(b[i].d), dmin = f16(b[i].dmin);
        const uint8_t *ql = b[i].qs, *qh = b[i].qh;
        for (int g = 0; g < 4; g++, ql += 32) {
            uint8_t sc0, m0, sc1, m1;
            moex_k4_scale_min(2 * g, b[i].scales, &sc0, &m0);
            moex_k4_scale_min(2 * g + 1, b[i].scales, &sc1, &m1);
            const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
            const uint8_t u0 = (uint8_t)(1u << (2 * g)), u1 = (uint8_t)(2u << (2 * g));
            for (int l = 0; l < 32; l++) *y++ = d0 * ((ql[l] & 0xF) + (qh[l] & u0 ? 16 : 0)) - mm0;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] >> 4) + (qh[l] & u1 ? 16 : 0)) - mm1;
        }
    }
}

/* Q6_K: two halves of 128; in each, ql[0..63] low/high nibbles and qh[0..31]
 * 2-bit pairs give four runs of 32 elements; 16-element sub-blocks. */
static void dequant_q6_K(const moex_block_q6_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = f16(b[i].d);
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int h = 0; h < 2; h++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                int q[4];
                moex_q6_K_quad(ql, qh, l, q);
                y[l] = d * sc[is + 0] * q[0];
                y[l + 32] = d * sc[is + 2] * q[1];
                y[l + 64] = d * sc[is + 4] * q[2];
                y[l + 96] = d * sc[is + 6] * q[3];
            }
        }
    }
}

static void dequant_mxfp4(const moex_block_mxfp4 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = moex_e8m0_to_f32_half(b[i].e);
        for (int j = 0; j < 16; j++) {
            y[j] = moex_kvalues_mxfp4[b[i].qs[j] & 0xF] * d;
            y[j + 16] = moex_kvalues_mxfp4[b[i].qs[j] >> 4] * d;
        }
    }
}

static void dequant_q8_K(const moex_block_q8_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += MOEX_QK_K)
        for (int j = 0; j < MOEX_QK_K; j++) y[j] = b[i].d * b[i].qs[j];
}

/* The checks both row conversions make: a known type, both pointers, whole blocks. */
static int check_row(const char *what, moex_type type, const void *src, const void *dst, int64_t n,
                     moex_error *err) {
    const moex_type_traits *tt = moex_type_get(type);
    if (!tt) return moex_fail(err, "cannot %s the unknown type %d", what, (int)type);
    if (!src || !dst) return moex_fail(err, "%s: %s row without %s", what, tt->name, src ? "destination" : "source");
    if (n < 0 || n % tt->block_elems)
        return moex_fail(err, "%s: a %s row holds whole blocks of %d values, not %lld", what, tt->name,
                         tt->block_elems, (long long)n);
    return 0;
}

static int no_conversion(const char *what, moex_type type, moex_error *err) {
    return moex_fail(err, "cannot %s %s: the CPU kernels have no row conversion for it", what,
                     moex_type_get(type)->name);
}

int moex_dequantize_row(moex_type type, const void *src, float *dst, int64_t n, moex_error *err) {
    if (check_row("dequantize", type, src, dst, n, err)) return -1;
    const int64_t nb = n / moex_type_get(type)->block_elems;
    switch (type) {
    case MOEX_TYPE_F32: memmove(dst, src, (size_t)n * sizeof(float)); return 0;
    case MOEX_TYPE_F16: {
        const moex_f16 *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = moex_f16_to_f32(h[i]);
        return 0;
    }
    case MOEX_TYPE_BF16: {
        const moex_bf16 *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = moex_bf16_to_f32(h[i]);
        return 0;
    }
    case MOEX_TYPE_Q4_0: dequant_q4_0(src, dst, nb); return 0;
    case MOEX_TYPE_Q4_1: dequant_q4_1(src, dst, nb); return 0;
    case MOEX_TYPE_Q5_0: dequant_q5_0(src, dst, nb); return 0;
    case MOEX_TYPE_Q5_1: dequant_q5_1(src, dst, nb); return 0;
    case MOEX_TYPE_Q8_0: dequant_q8_0(src, dst, nb); return 0;
    case MOEX_TYPE_Q8_1: dequant_q8_1(src, dst, nb); return 0;
    case MOEX_TYPE_Q4_K: dequant_q4_K(src, dst, nb); return 0;
    case MOEX_TYPE_Q5_K: dequant_q5_K(src, dst, nb); return 0;
    case MOEX_TYPE_Q6_K: dequant_q6_K(src, dst, nb); return 0;
    case MOEX_TYPE_Q8_K: dequant_q8_K(src, dst, nb); return 0;
    case MOEX_TYPE_MXFP4: dequant_mxfp4(src, dst, nb); return 0;
    default: return no_conversion("dequantize", type, err);
    }
}

/* ------------------------------------------------------------------ */
/* 32-element block quantizers (ggml's *_ref)                          */
/* ------------------------------------------------------------------ */

/* The value of largest magnitude (keeping its sign) and that magnitude. */
static float signed_absmax(const float *x, int n, float *amax_out) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    *amax_out = amax;
    return max;
}

static void minmax(const float *x, int n, float *mn, float *mx) {
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

static void quant_q4_0(const float *x, moex_block_q4_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float amax;
        const float d = signed_absmax(x, 32, &amax) / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = moex_f32_to_f16(d);
        for (int j = 0; j < 16; j++) {
            const uint8_t q0 = (uint8_t)imin(15, (int8_t)(x[j] * id + 8.5f));
            const uint8_t q1 = (uint8_t)imin(15, (int8_t)(x[j + 16] * id + 8.5f));
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void quant_q4_1(const float *x, moex_block_q4_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float mn, mx;
        minmax(x, 32, &mn, &mx);
        const float d = (mx - mn) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = moex_f32_to_f16(d);
        y[i].m = moex_f32_to_f16(mn);
        for (int j = 0; j < 16; j++) {
            const uint8_t q0 = (uint8_t)imin(15, (int8_t)((x[j] - mn) * id + 0.5f));
            const uint8_t q1 = (uint8_t)imin(15, (int8_t)((x[j + 16] - mn) * id + 0.5f));
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* Packs 32 5-bit values into qs (low nibbles) and qh (5th bits). */
static void pack_q5(const uint8_t q[32], uint8_t qh_bytes[4], uint8_t qs[16]) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
        qh |= (uint32_t)((q[j] & 0x10) >> 4) << j;
        qh |= (uint32_t)((q[j + 16] & 0x10) >> 4) << (j + 16);
    }
    memcpy(qh_bytes, &qh, 4);
}

static void quant_q5_0(const float *x, moex_block_q5_0 *y, int64_t nb) {
    uint8_t q[32];
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float amax;
        const float d = signed_absmax(x, 32, &amax) / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = moex_f32_to_f16(d);
        for (int j = 0; j < 32; j++) q[j] = (uint8_t)imin(31, (int8_t)(x[j] * id + 16.5f));
        pack_q5(q, y[i].qh, y[i].qs);
    }
}

static void quant_q5_1(const float *x, moex_block_q5_1 *y, int64_t nb) {
    uint8_t q[32];
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float mn, mx;
        minmax(x, 32, &mn, &mx);
        const float d = (mx - mn) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = moex_f32_to_f16(d);
        y[i].m = moex_f32_to_f16(mn);
        for (int j = 0; j < 32; j++) q[j] = (uint8_t)(int8_t)((x[j] - mn) * id + 0.5f);
        pack_q5(q, y[i].qh, y[i].qs);
    }
}

void moex_quantize_q8_0_ref(const float *x, void *dst, int64_t n) {
    moex_block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float amax;
        signed_absmax(x, 32, &amax);
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = moex_f32_to_f16(d);
        for (int j = 0; j < 32; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

void moex_quantize_q8_1_ref(const float *x, void *dst, int64_t n) {
    moex_block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float amax;
        signed_absmax(x, 32, &amax);
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        int sum = 0;
        y[i].d = moex_f32_to_f16(d);
        for (int j = 0; j < 32; j++) {
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].s = moex_f32_to_f16((float)sum * d);
    }
}

/* Q8_K: d = max / -127 with the signed extreme, so it maps to -127 exactly. */
void moex_quantize_q8_K_ref(const float *x, void *dst, int64_t n) {
    moex_block_q8_K *y = dst;
    for (int64_t i = 0; i < n / MOEX_QK_K; i++, x += MOEX_QK_K) {
        float amax;
        const float max = signed_absmax(x, MOEX_QK_K, &amax);
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < MOEX_QK_K; j++) y[i].qs[j] = (int8_t)imin(127, moex_nearest_int(iscale * x[j]));
        for (int j = 0; j < MOEX_QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

/* ------------------------------------------------------------------ */
/* MXFP4 (ggml's quantize_row_mxfp4_ref)                               */
/* ------------------------------------------------------------------ */

/* The block exponent: floor(log2(amax)) - 2 + 127, so that amax lands in
 * the top E2M1 binade (4 or 6 times 2^(e-127)); 0 for an all-zero block.
 * ggml takes floor(log2f()) (not the float's exponent bits, which differ just
 * below large powers of two where log2f rounds up) and casts the float to
 * uint8_t; for amax < 2^-125 (negative) or inf that cast is out of range, and
 * x86 compilers go through int32 (inf giving INT_MIN) and keep the low byte.
 * The same here without the undefined conversion, so that the bytes match
 * llama.cpp's: a block with amax < 2^-125 wraps to a huge exponent and
 * quantizes to zeros. */
static uint8_t mxfp4_exponent(float amax) {
    if (!(amax > 0.0f)) return 0;
    const float e = floorf(log2f(amax)) - 2 + 127;
    const int32_t i = e >= -2147483648.0f && e < 2147483648.0f ? (int32_t)e : INT32_MIN;
    return (uint8_t)((uint32_t)i & 0xFF);
}

/* The code whose value (doubled table times d) lies nearest x; the first
 * such code on ties, so 0 (not -0) for zeros, as ggml's best_index_mxfp4. */
static uint8_t mxfp4_nearest(float x, float d) {
    uint8_t best = 0;
    float best_err = fabsf(moex_kvalues_mxfp4[0] * d - x);
    for (uint8_t q = 1; q < 16; q++) {
        const float e = fabsf(moex_kvalues_mxfp4[q] * d - x);
        if (e < best_err) {
            best = q;
            best_err = e;
        }
    }
    return best;
}

static void quant_mxfp4(const float *x, moex_block_mxfp4 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float amax;
        signed_absmax(x, 32, &amax);
        y[i].e = mxfp4_exponent(amax);
        const float d = moex_e8m0_to_f32_half(y[i].e);
        for (int j = 0; j < 16; j++)
            y[i].qs[j] = (uint8_t)(mxfp4_nearest(x[j], d) | (mxfp4_nearest(x[j + 16], d) << 4));
    }
}

/* ------------------------------------------------------------------ */
/* K-quant scale searches (ggml's make_qkx2_quants / make_qx_quants)    */
/* ------------------------------------------------------------------ */

/* Fits x ~ scale * L - min with L in 0..nmax, minimising the weighted squared
 * error over a small grid of candidate scales; returns scale, *the_min = min. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min,
                           uint8_t *Laux, float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0], sum_w = w[0], sum_x = w[0] * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min), scale = 1 / iscale, best = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)imax(0, imin(nmax, moex_nearest_int(iscale * (x[i] - min))));
        const float diff = scale * L[i] + min - x[i];
        best += w[i] * diff * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = imax(0, imin(nmax, moex_nearest_int(iscale * (x[i] - min))));
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D <= 0) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            const float diff = this_scale * Laux[i] + this_min - x[i];
            err += w[i] * diff * diff;
        }
        if (err < best) {
            memcpy(L, Laux, (size_t)n);
            best = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *the_min = -min;
    return scale;
}

/* Symmetric fit x ~ scale * (L - nmax), weights x^2 (ggml's make_qx_quants
 * with rmse_type 1); tries 18 scales around -nmax / max. */
static float fit_scale_symmetric(int n, int nmax, const float *x, int8_t *L) {
    float amax;
    const float max = signed_absmax(x, n, &amax);
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = imax(-nmax, imin(nmax - 1, moex_nearest_int(iscale * x[i])));
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = imax(-nmax, imin(nmax - 1, moex_nearest_int(iscale * x[i])));
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, moex_nearest_int(iscale * x[i]))));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Shared by Q4_K and Q5_K: per-sub-block scale/min search, 6-bit scale
 * quantization, then requantization of L[256] (0..nmax) against the stored
 * scales. */
static void quant_k_scales_and_levels(const float *x, int nmax, float rmin, int nstep, moex_f16 *d_out,
                                      moex_f16 *dmin_out, uint8_t scales_out[12], uint8_t L[MOEX_QK_K]) {
    uint8_t Laux[32], ls[8], lm[8];
    float w[32], mins[8], scales[8];
    float sum_x2 = 0;
    for (int l = 0; l < MOEX_QK_K; l++) sum_x2 += x[l] * x[l];
    const float av_x = sqrtf(sum_x2 / MOEX_QK_K);
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = fit_scale_min(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)imin(63, moex_nearest_int(inv_scale * scales[j]));
        lm[j] = (uint8_t)imin(63, moex_nearest_int(inv_min * mins[j]));
    }
    moex_k4_pack_scales_mins(ls, lm, scales_out);
    *d_out = moex_f32_to_f16(max_scale / 63.f);
    *dmin_out = moex_f32_to_f16(max_min / 63.f);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        moex_k4_scale_min(j, scales_out, &sc, &m);
        const float d = f16(*d_out) * sc;
        if (!d) continue;
        const float dm = f16(*dmin_out) * m;
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = (uint8_t)imax(0, imin(nmax, moex_nearest_int((x[32 * j + l] + dm) / d)));
    }
}

static void quant_q4_K(const float *x, moex_block_q4_K *y, int64_t nb) {
    uint8_t L[MOEX_QK_K];
    for (int64_t i = 0; i < nb; i++, x += MOEX_QK_K) {
        quant_k_scales_and_levels(x, 15, -1.f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < MOEX_QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

static void quant_q5_K(const float *x, moex_block_q5_K *y, int64_t nb) {
    uint8_t L[MOEX_QK_K];
    for (int64_t i = 0; i < nb; i++, x += MOEX_QK_K) {
        quant_k_scales_and_levels(x, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        memset(y[i].qh, 0, sizeof y[i].qh);
        uint8_t *ql = y[i].qs, m1 = 1, m2 = 2;
        for (int j = 0; j < MOEX_QK_K; j += 64, ql += 32, m1 <<= 2, m2 <<= 2) {
            for (int l = 0; l < 32; l++) {
                int l1 = L[j + l], l2 = L[j + l + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    y[i].qh[l] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    y[i].qh[l] |= m2;
                }
                ql[l] = (uint8_t)(l1 | (l2 << 4));
            }
        }
    }
}

static void quant_q6_K(const float *x, moex_block_q6_K *y, int64_t nb) {
    int8_t L[MOEX_QK_K];
    float scales[16];
    for (int64_t i = 0; i < nb; i++, x += MOEX_QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < 16; ib++) {
            scales[ib] = fit_scale_symmetric(16, 32, x + 16 * ib, L + 16 * ib);
            if (fabsf(scales[ib]) > max_abs_scale) {
                max_abs_scale = fabsf(scales[ib]);
                max_scale = scales[ib];
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = moex_f32_to_f16(1 / iscale);
        for (int ib = 0; ib < 16; ib++) y[i].scales[ib] = (int8_t)imin(127, moex_nearest_int(iscale * scales[ib]));
        for (int j = 0; j < 16; j++) {
            const float d = f16(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (int8_t)(imax(-32, imin(31, moex_nearest_int(x[16 * j + l] / d))) + 32);
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < MOEX_QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
                ql[l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
                ql[l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
                qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
        }
    }
}

int moex_quantize_row(moex_type type, const float *src, void *dst, int64_t n, moex_error *err) {
    if (check_row("quantize", type, src, dst, n, err)) return -1;
    const int64_t nb = n / moex_type_get(type)->block_elems;
    switch (type) {
    case MOEX_TYPE_F32: memmove(dst, src, (size_t)n * sizeof(float)); return 0;
    case MOEX_TYPE_F16: {
        moex_f16 *h = dst;
        for (int64_t i = 0; i < n; i++) h[i] = moex_f32_to_f16(src[i]);
        return 0;
    }
    case MOEX_TYPE_BF16: {
        moex_bf16 *h = dst;
        for (int64_t i = 0; i < n; i++) h[i] = moex_f32_to_bf16(src[i]);
        return 0;
    }
    case MOEX_TYPE_Q4_0: quant_q4_0(src, dst, nb); return 0;
    case MOEX_TYPE_Q4_1: quant_q4_1(src, dst, nb); return 0;
    case MOEX_TYPE_Q5_0: quant_q5_0(src, dst, nb); return 0;
    case MOEX_TYPE_Q5_1: quant_q5_1(src, dst, nb); return 0;
    case MOEX_TYPE_Q8_0: moex_quantize_q8_0_ref(src, dst, n); return 0;
    case MOEX_TYPE_Q8_1: moex_quantize_q8_1_ref(src, dst, n); return 0;
    case MOEX_TYPE_Q4_K: quant_q4_K(src, dst, nb); return 0;
    case MOEX_TYPE_Q5_K: quant_q5_K(src, dst, nb); return 0;
    case MOEX_TYPE_Q6_K: quant_q6_K(src, dst, nb); return 0;
    case MOEX_TYPE_Q8_K: moex_quantize_q8_K_ref(src, dst, n); return 0;
    case MOEX_TYPE_MXFP4: quant_mxfp4(src, dst, nb); return 0;
    default: return no_conversion("quantize", type, err);
    }
}
