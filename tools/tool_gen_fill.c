/* Deterministic weights. Every value is a pure function of (seed, tensor
 * index, element index) through a counter-based PRNG (splitmix64), so rows
 * can be generated in any order on any number of threads and every machine
 * produces the same bytes. Normals come from integer sums (no libm), which
 * keeps them bit-identical across C libraries.
 *
 * Quantized tensors are made one of two ways: FLOAT draws floats and
 * quantizes them with the kernels' reference quantizer (realistic values,
 * for small models); BLOCKS writes random quantized blocks directly with
 * scales chosen for the target std (an order of magnitude faster, for models
 * of many GB). */
#include "tools/tool_gen.h"

#include <string.h>

#include "kernels/kernels.h"

/* Bit-exact floats everywhere: no fused multiply-add (GCC in ISO C mode
 * already keeps expressions uncontracted). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* The splitmix64 draw from state x (a copy: x is a value, not a stream). */
static inline uint64_t splitmix64_of(uint64_t x) { return moex_splitmix64(&x); }

/* The k-th 64 random bits of stream `key`: splitmix64 is counter-based, so
 * draw k is the draw from state key + k * gamma. */
static inline uint64_t rand_at(uint64_t key, uint64_t k) { return splitmix64_of(key + k * MOEX_SPLITMIX64_GAMMA); }

uint64_t gen_tensor_key(uint64_t seed, int tensor_index) {
    return splitmix64_of(splitmix64_of(seed) ^ ((uint64_t)(tensor_index + 1) * 0xD1B54A32D192ED03ull));
}

/* Irwin-Hall sum of four 16-bit uniforms: mean 0, std 1, within +-3.46. */
float gen_normal(uint64_t key, uint64_t k) {
    uint64_t r = rand_at(key, k);
    int64_t s = (int64_t)(r & 0xffff) + (int64_t)((r >> 16) & 0xffff) + (int64_t)((r >> 32) & 0xffff) +
                (int64_t)(r >> 48);
    /* 4 * 32767.5 = 131070; std of the sum = 65536 * sqrt(4/12) ~= 37837.23 */
    return (float)(s - 131070) * (1.0f / 37837.227f);
}

/* Uniform in [0, 1) with 24 bits. */
static inline float uniform01(uint64_t r) { return (float)(r >> 40) * (1.0f / 16777216.0f); }

static void fill_floats(const gen_tensor *t, uint64_t key, int64_t elem0, int64_t n, float *out) {
    if (t->init == GEN_INIT_NORM) {
        for (int64_t i = 0; i < n; i++) out[i] = 1.0f + t->scale * (2.0f * uniform01(rand_at(key, (uint64_t)(elem0 + i))) - 1.0f);
        return;
    }
    for (int64_t i = 0; i < n; i++) out[i] = t->scale * gen_normal(key, (uint64_t)(elem0 + i));
}

static int store_row(moex_type type, const float *src, void *dst, int64_t n, moex_error *err) {
    switch (type) {
    case MOEX_TYPE_F32: memcpy(dst, src, (size_t)n * 4); return 0;
    case MOEX_TYPE_F16:
        for (int64_t i = 0; i < n; i++) ((moex_f16 *)dst)[i] = moex_f32_to_f16(src[i]);
        return 0;
    case MOEX_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) ((moex_bf16 *)dst)[i] = moex_f32_to_bf16(src[i]);
        return 0;
    default:
        return moex_quantize_row(type, src, dst, n, err);
    }
}

/* ---- random blocks ----
 * Each block draws from its own counter range (64 words per block). Scales
 * make the dequantized values' std about `std` with mean about 0; the
 * quants themselves are uniform, as every bit pattern is valid. */

typedef struct block_rng {
    uint64_t key, base;
    int next;
} block_rng;

static uint64_t next_word(block_rng *r) { return rand_at(r->key, r->base + (uint64_t)r->next++); }

static void random_bytes(block_rng *r, uint8_t *dst, size_t n) {
    while (n) {
        uint64_t w = next_word(r);
        size_t k = n < 8 ? n : 8;
        memcpy(dst, &w, k);
        dst += k;
        n -= k;
    }
}

/* A factor in [0.75, 1.25): blocks differ in scale like real weights do. */
static float jitter(block_rng *r) { return 0.75f + 0.5f * uniform01(next_word(r)); }

static float random_sign(block_rng *r) { return (next_word(r) >> 63) ? -1.0f : 1.0f; }

/* RMS of a scale drawn uniformly from 32..63. */
#define K_SCALE_RMS 48.8f
/* Std of a uniform q in 0..2^b-1: sqrt((4^b - 1) / 12). */
#define STD_U4 4.610f
#define STD_U5 9.233f
#define STD_U6 18.473f
#define STD_S8 73.6f   /* int8 uniform in -127..127 */

static void k_scales(block_rng *r, uint8_t sc[8]) {
    uint64_t w = next_word(r);
    for (int j = 0; j < 8; j++) sc[j] = (uint8_t)(32 + ((w >> (8 * j)) & 31));
}

/* x = d*sc*q - dmin*m with m = sc and dmin = mid*d: each sub-block centred
 * at 0. The scale fields of a Q4_K / Q5_K block whose q (std_q, mid-point
 * mid) should give values of std std. */
static void random_k4_scales(block_rng *r, float std, float std_q, float mid, moex_f16 *d, moex_f16 *dmin,
                             uint8_t scales[MOEX_K_SCALE_SIZE]) {
    const float dv = std * jitter(r) / (std_q * K_SCALE_RMS);
    uint8_t sc[8];
    k_scales(r, sc);
    *d = moex_f32_to_f16(dv);
    *dmin = moex_f32_to_f16(mid * moex_f16_to_f32(*d));
    moex_k4_pack_scales_mins(sc, sc, scales);
}

static void random_q4_k(block_rng *r, float std, moex_block_q4_K *b) {
    random_k4_scales(r, std, STD_U4, 7.5f, &b->d, &b->dmin, b->scales);
    random_bytes(r, b->qs, sizeof b->qs);
}

static void random_q5_k(block_rng *r, float std, moex_block_q5_K *b) {
    random_k4_scales(r, std, STD_U5, 15.5f, &b->d, &b->dmin, b->scales);
    random_bytes(r, b->qh, sizeof b->qh);
    random_bytes(r, b->qs, sizeof b->qs);
}

/* RMS of the 16 E2M1 values (codes uniform): sqrt(68.5 / 8). */
#define STD_E2M1 2.926f

/* MXFP4: uniform codes (symmetric, so mean 0) under a power-of-two scale.
 * The wanted scale s = std / STD_E2M1 = m 2^k (m in [1, 2), read from the
 * float's bits: no libm, like the rest of this file) lies between 2^k and
 * 2^(k+1); the upper is taken with probability (m^2 - 1) / 3, so that the
 * values' mean square is std^2 on average. */
static void random_mxfp4(block_rng *r, float std, moex_block_mxfp4 *b) {
    const float s = std * jitter(r) / STD_E2M1;
    uint32_t bits, mbits;
    memcpy(&bits, &s, 4);
    mbits = (bits & 0x007FFFFFu) | (127u << 23);
    float m;
    memcpy(&m, &mbits, 4);
    const int biased = (int)((bits >> 23) & 0xFF);   /* k + 127; 0 for s = 0 or subnormal */
    int e = biased + (uniform01(next_word(r)) < (m * m - 1) / 3 ? 1 : 0);
    if (biased == 0) e = 0;
    b->e = (uint8_t)(e < 254 ? e : 254);
    random_bytes(r, b->qs, sizeof b->qs);
}

/* x = d*sc*(q-32); random signs on the int8 scales cancel the -0.5 bias. */
static void random_q6_k(block_rng *r, float std, moex_block_q6_K *b) {
    b->d = moex_f32_to_f16(std * jitter(r) / (STD_U6 * K_SCALE_RMS));
    uint8_t raw[16];
    random_bytes(r, raw, sizeof raw);
    for (int j = 0; j < 16; j++) {
        int mag = 32 + (raw[j] & 31);
        b->scales[j] = (int8_t)((raw[j] & 32) ? -mag : mag);
    }
    random_bytes(r, b->ql, sizeof b->ql);
    random_bytes(r, b->qh, sizeof b->qh);
}

static void random_block(moex_type type, block_rng *r, float std, void *dst) {
    switch (type) {
    case MOEX_TYPE_Q4_0: {   /* q - 8 has mean -0.5: a random sign on d cancels it */
        moex_block_q4_0 *b = dst;
        b->d = moex_f32_to_f16(random_sign(r) * std * jitter(r) / STD_U4);
        random_bytes(r, b->qs, sizeof b->qs);
        break;
    }
    case MOEX_TYPE_Q4_1: {
        moex_block_q4_1 *b = dst;
        b->d = moex_f32_to_f16(std * jitter(r) / STD_U4);
        b->m = moex_f32_to_f16(-7.5f * moex_f16_to_f32(b->d));
        random_bytes(r, b->qs, sizeof b->qs);
        break;
    }
    case MOEX_TYPE_Q5_0: {
        moex_block_q5_0 *b = dst;
        b->d = moex_f32_to_f16(random_sign(r) * std * jitter(r) / STD_U5);
        random_bytes(r, b->qh, sizeof b->qh);
        random_bytes(r, b->qs, sizeof b->qs);
        break;
    }
    case MOEX_TYPE_Q5_1: {
        moex_block_q5_1 *b = dst;
        b->d = moex_f32_to_f16(std * jitter(r) / STD_U5);
        b->m = moex_f32_to_f16(-15.5f * moex_f16_to_f32(b->d));
        random_bytes(r, b->qh, sizeof b->qh);
        random_bytes(r, b->qs, sizeof b->qs);
        break;
    }
    case MOEX_TYPE_Q8_0: {
        moex_block_q8_0 *b = dst;
        b->d = moex_f32_to_f16(std * jitter(r) / STD_S8);
        random_bytes(r, (uint8_t *)b->qs, sizeof b->qs);
        for (int i = 0; i < MOEX_QK8_0; i++)
            if (b->qs[i] == -128) b->qs[i] = -127;   /* ggml's quants stay in -127..127 */
        break;
    }
    case MOEX_TYPE_Q4_K: random_q4_k(r, std, dst); break;
    case MOEX_TYPE_Q5_K: random_q5_k(r, std, dst); break;
    case MOEX_TYPE_Q6_K: random_q6_k(r, std, dst); break;
    case MOEX_TYPE_MXFP4: random_mxfp4(r, std, dst); break;
    default: break;   /* float types never come here */
    }
}

static bool is_float_type(moex_type t) { return t == MOEX_TYPE_F32 || t == MOEX_TYPE_F16 || t == MOEX_TYPE_BF16; }

int gen_fill_rows(const gen_tensor *t, int tensor_index, uint64_t seed, bool blocks, int64_t row0, int64_t n_rows,
                  void *dst, float *scratch, moex_error *err) {
    uint64_t key = gen_tensor_key(seed, tensor_index);
    const moex_type_traits *tt = moex_type_get(t->type);
    int64_t ne0 = t->ne[0];
    size_t row_bytes = moex_row_bytes(t->type, ne0);
    uint8_t *out = dst;
    if (blocks && !is_float_type(t->type) && t->init == GEN_INIT_NORMAL) {
        int64_t nb = ne0 / tt->block_elems;
        uint64_t bkey = key ^ 0x5851F42D4C957F2Dull;   /* a stream apart from the float draws */
        for (int64_t r = 0; r < n_rows; r++)
            for (int64_t j = 0; j < nb; j++) {
                block_rng rng = {.key = bkey, .base = (uint64_t)((row0 + r) * nb + j) * 64};
                random_block(t->type, &rng, t->scale, out + (size_t)r * row_bytes + (size_t)j * tt->block_bytes);
            }
        return 0;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        fill_floats(t, key, (row0 + r) * ne0, ne0, scratch);
        if (store_row(t->type, scratch, out + (size_t)r * row_bytes, ne0, err)) return -1;
    }
    return 0;
}
