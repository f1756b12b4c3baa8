/* Portable dot products, one per weight type, in llama.cpp's pairing with
 * the activation type. Integer sums within a block are exact, so the SIMD
 * paths differ from these only by float rounding across blocks. This is the
 * reference the AVX2 (and later WASM SIMD) tables are tested against. */
#include "kernels/kernels_internal.h"

static inline float f16(moex_f16 h) { return moex_f16_to_f32(h); }

static void dot_f32(int64_t n, const void *w, const void *a, float *out) {
    const float *x = w, *y = a;
    double sum = 0; /* double: this path is also the accuracy reference */
    for (int64_t i = 0; i < n; i++) sum += (double)x[i] * y[i];
    *out = (float)sum;
}

static void dot_f16(int64_t n, const void *w, const void *a, float *out) {
    const moex_f16 *x = w;
    const float *y = a;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)moex_f16_to_f32(x[i]) * y[i];
    *out = (float)sum;
}

static void dot_bf16(int64_t n, const void *w, const void *a, float *out) {
    const moex_bf16 *x = w;
    const float *y = a;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)moex_bf16_to_f32(x[i]) * y[i];
    *out = (float)sum;
}

/* Sum over a 32-block of q[j] * y[j] where q = nibble - offset. */
static int dot_nibbles(const uint8_t qs[16], const int8_t y[32], int offset) {
    int sum = 0;
    for (int j = 0; j < 16; j++) sum += ((qs[j] & 0xF) - offset) * y[j] + ((qs[j] >> 4) - offset) * y[j + 16];
    return sum;
}

static void dot_q4_0(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q4_0 *x = w;
    const moex_block_q8_0 *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) sum += f16(x[i].d) * f16(y[i].d) * dot_nibbles(x[i].qs, y[i].qs, 8);
    *out = sum;
}

static void dot_q4_1(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q4_1 *x = w;
    const moex_block_q8_1 *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++)
        sum += f16(x[i].d) * f16(y[i].d) * dot_nibbles(x[i].qs, y[i].qs, 0) + f16(x[i].m) * f16(y[i].s);
    *out = sum;
}

static int dot_q5(const uint8_t qh_bytes[4], const uint8_t qs[16], const int8_t y[32], int offset) {
    uint32_t qh;
    memcpy(&qh, qh_bytes, 4);
    int sum = 0;
    for (int j = 0; j < 16; j++) {
        const int q0 = (qs[j] & 0xF) | (((qh >> j) << 4) & 0x10);
        const int q1 = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
        sum += (q0 - offset) * y[j] + (q1 - offset) * y[j + 16];
    }
    return sum;
}

static void dot_q5_0(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q5_0 *x = w;
    const moex_block_q8_0 *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++)
        sum += f16(x[i].d) * f16(y[i].d) * dot_q5(x[i].qh, x[i].qs, y[i].qs, 16);
    *out = sum;
}

static void dot_q5_1(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q5_1 *x = w;
    const moex_block_q8_1 *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++)
        sum += f16(x[i].d) * f16(y[i].d) * dot_q5(x[i].qh, x[i].qs, y[i].qs, 0) + f16(x[i].m) * f16(y[i].s);
    *out = sum;
}

static void dot_q8_0(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q8_0 *x = w;
    const moex_block_q8_0 *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        int s = 0;
        for (int j = 0; j < 32; j++) s += x[i].qs[j] * y[i].qs[j];
        sum += f16(x[i].d) * f16(y[i].d) * s;
    }
    *out = sum;
}

/* MXFP4 with Q8_0: the block's integer sum over the doubled E2M1 table,
 * scaled by the halved E8M0 exponent times the activations' d (exact: a
 * power of two times an f16, barring the extreme exponents). */
static void dot_mxfp4(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_mxfp4 *x = w;
    const moex_block_q8_0 *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        int s = 0;
        for (int j = 0; j < 16; j++)
            s += moex_kvalues_mxfp4[x[i].qs[j] & 0xF] * y[i].qs[j] + moex_kvalues_mxfp4[x[i].qs[j] >> 4] * y[i].qs[j + 16];
        sum += moex_e8m0_to_f32_half(x[i].e) * f16(y[i].d) * s;
    }
    *out = sum;
}

/* Q4_K / Q5_K: sum_j sc_j * dot(q, y)_j - sum_j m_j * sum(y)_j, the mins
 * term from the Q8_K block's 16-element partial sums. */
static void dot_q4_K(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q4_K *x = w;
    const moex_block_q8_K *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / MOEX_QK_K; i++) {
        const uint8_t *q = x[i].qs;
        const int8_t *q8 = y[i].qs;
        int32_t isum = 0, imins = 0;
        for (int g = 0; g < 4; g++, q += 32, q8 += 64) {
            uint8_t sc0, m0, sc1, m1;
            moex_k4_scale_min(2 * g, x[i].scales, &sc0, &m0);
            moex_k4_scale_min(2 * g + 1, x[i].scales, &sc1, &m1);
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += (q[l] & 0xF) * q8[l];
                s1 += (q[l] >> 4) * q8[l + 32];
            }
            isum += sc0 * s0 + sc1 * s1;
            imins += m0 * (y[i].bsums[4 * g] + y[i].bsums[4 * g + 1]) + m1 * (y[i].bsums[4 * g + 2] + y[i].bsums[4 * g + 3]);
        }
        sum += y[i].d * (f16(x[i].d) * isum - f16(x[i].dmin) * imins);
    }
    *out = sum;
}

static void dot_q5_K(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q5_K *x = w;
    const moex_block_q8_K *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / MOEX_QK_K; i++) {
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const int8_t *q8 = y[i].qs;
        int32_t isum = 0, imins = 0;
        for (int g = 0; g < 4; g++, ql += 32, q8 += 64) {
            uint8_t sc0, m0, sc1, m1;
            moex_k4_scale_min(2 * g, x[i].scales, &sc0, &m0);
            moex_k4_scale_min(2 * g + 1, x[i].scales, &sc1, &m1);
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += ((ql[l] & 0xF) + (((qh[l] >> (2 * g)) & 1) << 4)) * q8[l];
                s1 += ((ql[l] >> 4) + (((qh[l] >> (2 * g + 1)) & 1) << 4)) * q8[l + 32];
            }
            isum += sc0 * s0 + sc1 * s1;
            imins += m0 * (y[i].bsums[4 * g] + y[i].bsums[4 * g + 1]) + m1 * (y[i].bsums[4 * g + 2] + y[i].bsums[4 * g + 3]);
        }
        sum += y[i].d * (f16(x[i].d) * isum - f16(x[i].dmin) * imins);
    }
    *out = sum;
}

static void dot_q6_K(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q6_K *x = w;
    const moex_block_q8_K *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / MOEX_QK_K; i++) {
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales, *q8 = y[i].qs;
        int32_t isum = 0;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, q8 += 128) {
            int32_t s[8] = {0}; /* per 16-element sub-block */
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                int q[4];
                moex_q6_K_quad(ql, qh, l, q);
                s[is + 0] += q[0] * q8[l];
                s[is + 2] += q[1] * q8[l + 32];
                s[is + 4] += q[2] * q8[l + 64];
                s[is + 6] += q[3] * q8[l + 96];
            }
            for (int j = 0; j < 8; j++) isum += sc[j] * s[j];
        }
        sum += y[i].d * f16(x[i].d) * isum;
    }
    *out = sum;
}

const moex_simd_table moex_simd_table_portable = {
    .name = "portable",
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
    .quantize_act = {
        [MOEX_TYPE_Q8_0] = moex_quantize_q8_0_ref,
        [MOEX_TYPE_Q8_1] = moex_quantize_q8_1_ref,
        [MOEX_TYPE_Q8_K] = moex_quantize_q8_K_ref,
    },
};
