/* WASM SIMD (simd128) dot products for the browser worker's CPU path.
 *
 * clang leaves the portable Q6_K, Q8_0 and Q4_0 products scalar under
 * -msimd128 (llvm-objdump shows no v128 ops in them), so the quantized
 * types the model files use get hand-vectorised kernels here: int8 x int8
 * products widen to i16 (extmul) and pair-add into i32 lanes, so every
 * block's integer sum is exact and the float steps across blocks are the
 * portable ones, in the same order: results are bit-identical to
 * kernels/dot_portable.c (tests/web checks it).
 *
 * The kernels module has no WASM entry in its table chooser yet
 * (kernels/simd.c picks the portable table off x86), so this file stands
 * in for dot_portable.c in the WASM link: it includes it (for the types it
 * does not vectorise) and defines moex_simd_table_portable itself. Once
 * simd.c selects a moex_simd_table_wasm under __wasm_simd128__, this file
 * moves to kernels/ unchanged but for the table's name. */
#include <wasm_simd128.h>

#define moex_simd_table_portable moex_simd_table_portable_c
#include "kernels/dot_portable.c"
#undef moex_simd_table_portable

/* Four i32 partial sums of the 16 int8 x int8 products of a and b. */
static inline v128_t dot_i8x16(v128_t a, v128_t b) {
    const v128_t lo = wasm_i16x8_extmul_low_i8x16(a, b), hi = wasm_i16x8_extmul_high_i8x16(a, b);
    return wasm_i32x4_add(wasm_i32x4_extadd_pairwise_i16x8(lo), wasm_i32x4_extadd_pairwise_i16x8(hi));
}

static inline int32_t hsum_i32x4(v128_t v) {
    return wasm_i32x4_extract_lane(v, 0) + wasm_i32x4_extract_lane(v, 1) + wasm_i32x4_extract_lane(v, 2) +
           wasm_i32x4_extract_lane(v, 3);
}

static void dot_q4_0_wasm(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q4_0 *x = w;
    const moex_block_q8_0 *y = a;
    const v128_t m4 = wasm_i8x16_splat(0xF), eight = wasm_i8x16_splat(8);
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const v128_t q = wasm_v128_load(x[i].qs);
        const v128_t lo = wasm_i8x16_sub(wasm_v128_and(q, m4), eight);
        const v128_t hi = wasm_i8x16_sub(wasm_u8x16_shr(q, 4), eight);
        const v128_t acc = wasm_i32x4_add(dot_i8x16(lo, wasm_v128_load(y[i].qs)), dot_i8x16(hi, wasm_v128_load(y[i].qs + 16)));
        sum += f16(x[i].d) * f16(y[i].d) * hsum_i32x4(acc);
    }
    *out = sum;
}

static void dot_q8_0_wasm(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q8_0 *x = w;
    const moex_block_q8_0 *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const v128_t acc = wasm_i32x4_add(dot_i8x16(wasm_v128_load(x[i].qs), wasm_v128_load(y[i].qs)),
                                          dot_i8x16(wasm_v128_load(x[i].qs + 16), wasm_v128_load(y[i].qs + 16)));
        sum += f16(x[i].d) * f16(y[i].d) * hsum_i32x4(acc);
    }
    *out = sum;
}

/* Q4_K / Q5_K: the scale-weighted sums in i32 lanes, the mins term from
 * the Q8_K block's bsums as in the portable kernel. hbit: Q5_K's high-bit
 * bytes (NULL for Q4_K). */
static void dot_k4_block(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh, const moex_block_q8_K *y,
                         int32_t *isum_out, int32_t *imins_out) {
    const v128_t m4 = wasm_i8x16_splat(0xF), zero = wasm_i8x16_splat(0), k16 = wasm_i8x16_splat(16);
    v128_t acc = wasm_i32x4_splat(0);
    int32_t imins = 0;
    const int8_t *q8 = y->qs;
    for (int g = 0; g < 4; g++, qs += 32, q8 += 64) {
        uint8_t sc0, m0, sc1, m1;
        moex_k4_scale_min(2 * g, scales, &sc0, &m0);
        moex_k4_scale_min(2 * g + 1, scales, &sc1, &m1);
        const v128_t bit_lo = wasm_i8x16_splat((int8_t)(1 << (2 * g))), bit_hi = wasm_i8x16_splat((int8_t)(1 << (2 * g + 1)));
        v128_t s0 = wasm_i32x4_splat(0), s1 = wasm_i32x4_splat(0);
        for (int k = 0; k < 2; k++) {
            const v128_t q = wasm_v128_load(qs + 16 * k);
            v128_t lo = wasm_v128_and(q, m4), hi = wasm_u8x16_shr(q, 4);
            if (qh) { /* bit j of each qh byte -> 16; compares, not shifts by g (clang 14 scalarises those) */
                const v128_t h = wasm_v128_load(qh + 16 * k);
                lo = wasm_v128_or(lo, wasm_v128_and(wasm_i8x16_ne(wasm_v128_and(h, bit_lo), zero), k16));
                hi = wasm_v128_or(hi, wasm_v128_and(wasm_i8x16_ne(wasm_v128_and(h, bit_hi), zero), k16));
            }
            s0 = wasm_i32x4_add(s0, dot_i8x16(lo, wasm_v128_load(q8 + 16 * k)));
            s1 = wasm_i32x4_add(s1, dot_i8x16(hi, wasm_v128_load(q8 + 32 + 16 * k)));
        }
        acc = wasm_i32x4_add(acc, wasm_i32x4_add(wasm_i32x4_mul(s0, wasm_i32x4_splat(sc0)),
                                                 wasm_i32x4_mul(s1, wasm_i32x4_splat(sc1))));
        imins += m0 * (y->bsums[4 * g] + y->bsums[4 * g + 1]) + m1 * (y->bsums[4 * g + 2] + y->bsums[4 * g + 3]);
    }
    *isum_out = hsum_i32x4(acc);
    *imins_out = imins;
}

static void dot_q4_K_wasm(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q4_K *x = w;
    const moex_block_q8_K *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / MOEX_QK_K; i++) {
        int32_t isum, imins;
        dot_k4_block(x[i].scales, x[i].qs, NULL, &y[i], &isum, &imins);
        sum += y[i].d * (f16(x[i].d) * isum - f16(x[i].dmin) * imins);
    }
    *out = sum;
}

static void dot_q5_K_wasm(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q5_K *x = w;
    const moex_block_q8_K *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / MOEX_QK_K; i++) {
        int32_t isum, imins;
        dot_k4_block(x[i].scales, x[i].qs, x[i].qh, &y[i], &isum, &imins);
        sum += y[i].d * (f16(x[i].d) * isum - f16(x[i].dmin) * imins);
    }
    *out = sum;
}

/* Q6_K: each 16-byte vector is one 16-element sub-block, so its integer
 * sum takes one scale. */
static void dot_q6_K_wasm(int64_t n, const void *w, const void *a, float *out) {
    const moex_block_q6_K *x = w;
    const moex_block_q8_K *y = a;
    const v128_t m4 = wasm_i8x16_splat(0xF), m3 = wasm_i8x16_splat(3), k32 = wasm_i8x16_splat(32);
    float sum = 0;
    for (int64_t i = 0; i < n / MOEX_QK_K; i++) {
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales, *q8 = y[i].qs;
        v128_t acc = wasm_i32x4_splat(0);
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, q8 += 128) {
            for (int is = 0; is < 2; is++) {
                const v128_t l0 = wasm_v128_load(ql + 16 * is), l1 = wasm_v128_load(ql + 32 + 16 * is);
                const v128_t hb = wasm_v128_load(qh + 16 * is);
                const v128_t q[4] = {
                    wasm_v128_or(wasm_v128_and(l0, m4), wasm_i8x16_shl(wasm_v128_and(hb, m3), 4)),
                    wasm_v128_or(wasm_v128_and(l1, m4), wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(hb, 2), m3), 4)),
                    wasm_v128_or(wasm_u8x16_shr(l0, 4), wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(hb, 4), m3), 4)),
                    wasm_v128_or(wasm_u8x16_shr(l1, 4), wasm_i8x16_shl(wasm_u8x16_shr(hb, 6), 4)),
                };
                for (int k = 0; k < 4; k++) {
                    const v128_t d = dot_i8x16(wasm_i8x16_sub(q[k], k32), wasm_v128_load(q8 + 32 * k + 16 * is));
                    acc = wasm_i32x4_add(acc, wasm_i32x4_mul(d, wasm_i32x4_splat(sc[is + 2 * k])));
                }
            }
        }
        sum += y[i].d * f16(x[i].d) * hsum_i32x4(acc);
    }
    *out = sum;
}

const moex_simd_table moex_simd_table_portable = {
    .name = "wasm-simd128",
    .vec_dot = {
        [MOEX_TYPE_F32] = dot_f32,
        [MOEX_TYPE_F16] = dot_f16,
        [MOEX_TYPE_BF16] = dot_bf16,
        [MOEX_TYPE_Q4_0] = dot_q4_0_wasm,
        [MOEX_TYPE_Q4_1] = dot_q4_1,
        [MOEX_TYPE_Q5_0] = dot_q5_0,
        [MOEX_TYPE_Q5_1] = dot_q5_1,
        [MOEX_TYPE_Q8_0] = dot_q8_0_wasm,
        [MOEX_TYPE_Q4_K] = dot_q4_K_wasm,
        [MOEX_TYPE_Q5_K] = dot_q5_K_wasm,
        [MOEX_TYPE_Q6_K] = dot_q6_K_wasm,
    },
    .quantize_act = {
        [MOEX_TYPE_Q8_0] = moex_quantize_q8_0_ref,
        [MOEX_TYPE_Q8_1] = moex_quantize_q8_1_ref,
        [MOEX_TYPE_Q8_K] = moex_quantize_q8_K_ref,
    },
};

/* The portable table under its own name, for tests that compare the two. */
const moex_simd_table *moex_wasm_portable_table(void) { return &moex_simd_table_portable_c; }
