/* Quantization formats and dot products:
 *  - hand-built Q4_K / Q5_K / Q6_K blocks dequantize to ggml's formula
 *    (expected values computed here from the documented layout);
 *  - dequantize(quantize(x)) error per type;
 *  - AVX2 activation quantizers agree with the reference ones;
 *  - vec_dot of every type on every SIMD path vs a float64 reference on the
 *    dequantized weights and exact activations, and AVX2 vs portable on
 *    identical quantized inputs;
 *  - multi-token kernels equal vec_dot bit for bit on each path, and the
 *    AVX-512 VNNI ones equal the AVX2 vec_dot bit for bit, also on blocks of
 *    random bits and saturated activations (the integer extremes);
 *  - MXFP4: every (exponent, code) pair dequantizes to the OCP MX value
 *    (computed here from the E2M1 / E8M0 bit layouts, not from a table),
 *    dots at the exponent edges against float64 on every path, the paths
 *    equal bit for bit where every float step is exact, representable blocks
 *    round-trip exactly and ggml's rounding rule (ties to the lower code);
 *  - MOEX_SIMD picks the path it names.
 * Usage: test_quant [seed] */
#include <stddef.h>
#include <string.h>

#include "test_quant_util.h"

/* ---- hand-built blocks ---- */

/* Packs 6-bit scales/mins as ggml documents it: j < 4 in the low 6 bits of
 * bytes j (scale) and j+4 (min); j >= 4 split into a nibble in byte j+4 and
 * two high bits on top of bytes j-4 (scale) and j (min). */
static void pack_scales_by_spec(const int sc[8], const int mn[8], uint8_t out[12]) {
    memset(out, 0, 12);
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        out[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
    }
}

static void test_q4_K_layout(rng *r) {
    moex_block_q4_K b;
    int sc[8], mn[8], q[256];
    for (int j = 0; j < 8; j++) {
        sc[j] = (int)(rng_next(r) % 64);
        mn[j] = (int)(rng_next(r) % 64);
    }
    sc[5] = 63; mn[6] = 63; sc[7] = 0; /* extremes of the 6-bit range */
    for (int e = 0; e < 256; e++) q[e] = (int)(rng_next(r) % 16);
    const float d = 0.0123f, dmin = 0.0031f;
    b.d = moex_f32_to_f16(d);
    b.dmin = moex_f32_to_f16(dmin);
    pack_scales_by_spec(sc, mn, b.scales);
    /* element e: 64-group g = e / 64; first 32 in low nibbles of qs[32g..], next 32 in high nibbles */
    memset(b.qs, 0, sizeof b.qs);
    for (int e = 0; e < 256; e++) {
        const int g = e / 64, l = e % 64;
        b.qs[32 * g + l % 32] |= (uint8_t)(l < 32 ? q[e] : q[e] << 4);
    }
    float out[256];
    CHECK(moex_dequantize_row(MOEX_TYPE_Q4_K, &b, out, 256, NULL) == 0, "q4_K dequantize failed");
    const float dd = moex_f16_to_f32(b.d), dm = moex_f16_to_f32(b.dmin);
    int bad = 0;
    for (int e = 0; e < 256; e++) {
        const int s = e / 32;
        const float want = dd * sc[s] * q[e] - dm * mn[s];
        if (fabsf(out[e] - want) > 1e-6f * (1 + fabsf(want))) bad++;
    }
    CHECK(bad == 0, "q4_K hand-built block: %d of 256 values differ from ggml's formula", bad);
}

static void test_q5_K_layout(rng *r) {
    moex_block_q5_K b;
    int sc[8], mn[8], q[256];
    for (int j = 0; j < 8; j++) {
        sc[j] = (int)(rng_next(r) % 64);
        mn[j] = (int)(rng_next(r) % 64);
    }
    for (int e = 0; e < 256; e++) q[e] = (int)(rng_next(r) % 32);
    b.d = moex_f32_to_f16(0.02f);
    b.dmin = moex_f32_to_f16(0.005f);
    pack_scales_by_spec(sc, mn, b.scales);
    memset(b.qs, 0, sizeof b.qs);
    memset(b.qh, 0, sizeof b.qh);
    /* 5th bit of element e (sub-block s = e / 32, position l = e % 32) is bit s of qh[l] */
    for (int e = 0; e < 256; e++) {
        const int g = e / 64, l = e % 64, s = e / 32;
        b.qs[32 * g + l % 32] |= (uint8_t)(l < 32 ? (q[e] & 0xF) : (q[e] & 0xF) << 4);
        if (q[e] & 16) b.qh[e % 32] |= (uint8_t)(1u << s);
    }
    float out[256];
    CHECK(moex_dequantize_row(MOEX_TYPE_Q5_K, &b, out, 256, NULL) == 0, "q5_K dequantize failed");
    const float dd = moex_f16_to_f32(b.d), dm = moex_f16_to_f32(b.dmin);
    int bad = 0;
    for (int e = 0; e < 256; e++) {
        const float want = dd * sc[e / 32] * q[e] - dm * mn[e / 32];
        if (fabsf(out[e] - want) > 1e-6f * (1 + fabsf(want))) bad++;
    }
    CHECK(bad == 0, "q5_K hand-built block: %d of 256 values differ from ggml's formula", bad);
}

static void test_q6_K_layout(rng *r) {
    moex_block_q6_K b;
    int q[256];
    for (int j = 0; j < 16; j++) b.scales[j] = (int8_t)((int)(rng_next(r) % 256) - 128);
    for (int e = 0; e < 256; e++) q[e] = (int)(rng_next(r) % 64);
    b.d = moex_f32_to_f16(0.0007f);
    memset(b.ql, 0, sizeof b.ql);
    memset(b.qh, 0, sizeof b.qh);
    /* half h = e / 128, run k = (e % 128) / 32, position l = e % 32:
     * low 4 bits in ql[64h + l + 32 (k & 1)], nibble k / 2; high 2 bits in qh[32h + l] at bit 2k */
    for (int e = 0; e < 256; e++) {
        const int h = e / 128, k = (e % 128) / 32, l = e % 32;
        b.ql[64 * h + l + 32 * (k & 1)] |= (uint8_t)((q[e] & 0xF) << (4 * (k / 2)));
        b.qh[32 * h + l] |= (uint8_t)((q[e] >> 4) << (2 * k));
    }
    float out[256];
    CHECK(moex_dequantize_row(MOEX_TYPE_Q6_K, &b, out, 256, NULL) == 0, "q6_K dequantize failed");
    const float dd = moex_f16_to_f32(b.d);
    int bad = 0;
    for (int e = 0; e < 256; e++) {
        const float want = dd * b.scales[e / 16] * (q[e] - 32);
        if (fabsf(out[e] - want) > 1e-6f * (1 + fabsf(want))) bad++;
    }
    CHECK(bad == 0, "q6_K hand-built block: %d of 256 values differ from ggml's formula", bad);
}

/* Q4_0 / Q5_0 / Q8_0 spot checks of the 32-block layouts. */
static void test_block32_layouts(void) {
    moex_block_q5_0 b;
    b.d = moex_f32_to_f16(0.5f);
    int q[32];
    uint32_t qh = 0;
    for (int j = 0; j < 32; j++) q[j] = (j * 7 + 3) % 32;
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    for (int j = 0; j < 32; j++) qh |= (uint32_t)(q[j] >> 4) << j;
    memcpy(b.qh, &qh, 4);
    float out[32];
    moex_dequantize_row(MOEX_TYPE_Q5_0, &b, out, 32, NULL);
    int bad = 0;
    for (int j = 0; j < 32; j++) bad += out[j] != 0.5f * (q[j] - 16);
    CHECK(bad == 0, "q5_0 layout: %d values wrong", bad);

    moex_block_q4_1 c;
    c.d = moex_f32_to_f16(0.25f);
    c.m = moex_f32_to_f16(-1.0f);
    for (int j = 0; j < 16; j++) c.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    moex_dequantize_row(MOEX_TYPE_Q4_1, &c, out, 32, NULL);
    bad = 0;
    for (int j = 0; j < 16; j++) bad += (out[j] != 0.25f * j - 1.0f) + (out[j + 16] != 0.25f * (15 - j) - 1.0f);
    CHECK(bad == 0, "q4_1 layout: %d values wrong", bad);
}

/* portable, AVX2, AVX-512 VNNI (the SIMD ones NULL where the CPU lacks them) */
#define N_PATHS 3

/* ---- MXFP4 ---- */

/* An E2M1 code's value from its bits (sign, 2 exponent bits with bias 1, 1
 * mantissa bit; exponent 0 is subnormal), as the OCP MX spec defines it. */
static double e2m1_value(int code) {
    const int exp = (code >> 1) & 3, man = code & 1;
    const double mag = exp == 0 ? 0.5 * man : ldexp(1.0 + 0.5 * man, exp - 1);
    return code & 8 ? -mag : mag;
}

/* An E8M0 exponent's value 2^(e - 127); ggml gives 255 no NaN meaning. */
static double e8m0_value(int e) { return ldexp(1.0, e - 127); }

/* One row of 256 blocks, exponent e in block e: every (e, code) pair,
 * including 0 and 1 (f32 subnormal scales) and 254, 255 (whose large codes
 * overflow to inf in f32, as in ggml). */
static void test_mxfp4_dequant(rng *r) {
    moex_block_mxfp4 *b = malloc(sizeof(moex_block_mxfp4) * 256);
    float *out = malloc(sizeof(float) * 256 * 32);
    for (int e = 0; e < 256; e++) {
        b[e].e = (uint8_t)e;
        mxfp4_all_codes(r, b[e].qs);
    }
    CHECK(moex_dequantize_row(MOEX_TYPE_MXFP4, b, out, 256 * 32, NULL) == 0, "mxfp4 dequantize failed");
    int bad = 0;
    for (int e = 0; e < 256; e++)
        for (int j = 0; j < 32; j++) {
            const int code = j < 16 ? b[e].qs[j] & 0xF : b[e].qs[j - 16] >> 4;
            const float want = (float)(e2m1_value(code) * e8m0_value(e)); /* exact, or inf past FLT_MAX */
            if (!(out[32 * e + j] == want)) {
                if (bad++ < 5) printf("  mxfp4 e %d code %d: %.9g, want %.9g\n", e, code, out[32 * e + j], want);
            }
        }
    CHECK(bad == 0, "mxfp4: %d of 8192 (exponent, code) values differ from the OCP MX value", bad);
    free(b);
    free(out);
}

/* Raw Q8_0 activations: d and every qs in -127..127 (ggml's quantizer never
 * writes -128). */
static void fill_q8_0_raw(rng *r, moex_block_q8_0 *y, int64_t nb, float d, int saturate) {
    for (int64_t i = 0; i < nb; i++) {
        y[i].d = moex_f32_to_f16(d);
        for (int j = 0; j < 32; j++)
            y[i].qs[j] = (int8_t)(saturate ? (saturate > 0 ? 127 : -127) : (int)(rng_next(r) % 255) - 127);
    }
}

/* Dots at the exponent edges on every path against float64 from the spec's
 * values: the activations' scale keeps d(x) * d(y) a normal f32 (e 0, 1) or
 * the sums finite (e 254, 255), as it is in real use; blocks take the edge
 * exponent or one up to 2 away. */
static void test_mxfp4_dot_edges(rng *r) {
    const moex_simd_table *paths[N_PATHS] = {moex_simd_portable(), moex_simd_avx2(), moex_simd_vnni()};
    static const int edges[] = {0, 1, 127, 254, 255};
    const int64_t cols = 32 * 9, nb = cols / 32, rows = 24;
    moex_block_mxfp4 *w = malloc(sizeof(moex_block_mxfp4) * (size_t)(nb * rows));
    float *x = malloc(sizeof(float) * cols), *got = malloc(sizeof(float) * rows);
    double *want = malloc(sizeof(double) * rows);
    moex_block_q8_0 *a = malloc(sizeof(moex_block_q8_0) * (size_t)nb);
    for (size_t k = 0; k < sizeof edges / sizeof edges[0]; k++) {
        const int edge = edges[k];
        fill_gauss(r, x, cols, edge <= 1 ? 2e4f : edge >= 254 ? 1e-3f : 1.0f);
        moex_quantize_row(MOEX_TYPE_Q8_0, x, a, cols, NULL);
        for (int64_t row = 0; row < rows; row++) {
            double s = 0;
            for (int64_t i = 0; i < nb; i++) {
                moex_block_mxfp4 *b = &w[row * nb + i];
                int e = edge + (int)(rng_next(r) % 5) - 2;
                b->e = (uint8_t)(e < 0 ? 0 : e > 255 ? 255 : e);
                mxfp4_all_codes(r, b->qs);
                for (int j = 0; j < 32; j++) {
                    const int code = j < 16 ? b->qs[j] & 0xF : b->qs[j - 16] >> 4;
                    s += e2m1_value(code) * e8m0_value(b->e) * moex_f16_to_f32(a[i].d) * a[i].qs[j];
                }
            }
            want[row] = s;
        }
        for (int p = 0; p < N_PATHS; p++) {
            if (!paths[p]) continue;
            for (int64_t row = 0; row < rows; row++) paths[p]->vec_dot[MOEX_TYPE_MXFP4](cols, w + row * nb, a, &got[row]);
            const double err = rel_l2(got, want, rows);
            CHECK(err <= 1e-5, "%s mxfp4 dot at exponent %d: rel L2 %.3g vs float64", paths[p]->name, edge, err);
            CHECK(isfinite(got[0]) && got[0] != 0, "%s mxfp4 dot at exponent %d: %g", paths[p]->name, edge, got[0]);
            if (p == 0) printf("  mxfp4 dot, exponents around %3d: rel L2 vs f64 %.2g (row 0: %.6g)\n", edge, err, got[0]);
        }
    }
    free(w);
    free(x);
    free(got);
    free(want);
    free(a);
}

/* Where every float step is exact (exponents 126..128, activations with d 1,
 * 16 blocks: all partial sums are multiples of 1/4 below 2^20), every path's
 * vec_dot and multi-token kernel must give the exact integer result, bit for
 * bit; random and saturated (all +-12 x +-127) rows. */
static void test_mxfp4_paths_exact(rng *r) {
    const moex_simd_table *paths[N_PATHS] = {moex_simd_portable(), moex_simd_avx2(), moex_simd_vnni()};
    const int64_t cols = 32 * 16, nb = cols / 32, nt_max = MOEX_DOT_MAX_TOKENS;
    moex_block_mxfp4 w[16];
    moex_block_q8_0 a[MOEX_DOT_MAX_TOKENS][16];
    int checked = 0;
    for (int row = 0; row < 12; row++) {
        const int kind = row % 3; /* random, saturated with equal signs, saturated with opposite signs */
        for (int64_t i = 0; i < nb; i++) {
            w[i].e = (uint8_t)(126 + rng_next(r) % 3);
            if (kind) memset(w[i].qs, kind == 1 ? 0x77 : 0xFF, 16); /* code 7: +6, code 15: -6 */
            else mxfp4_all_codes(r, w[i].qs);
        }
        for (int t = 0; t < nt_max; t++) fill_q8_0_raw(r, a[t], nb, 1.0f, t == 0 && kind ? 1 : 0);
        double exact[MOEX_DOT_MAX_TOKENS];
        for (int t = 0; t < nt_max; t++) {
            exact[t] = 0;
            for (int64_t i = 0; i < nb; i++)
                for (int j = 0; j < 32; j++) {
                    const int code = j < 16 ? w[i].qs[j] & 0xF : w[i].qs[j - 16] >> 4;
                    exact[t] += e2m1_value(code) * e8m0_value(w[i].e) * a[t][i].qs[j];
                }
        }
        for (int p = 0; p < N_PATHS; p++) {
            if (!paths[p]) continue;
            for (int t = 0; t < nt_max; t++) {
                float got;
                paths[p]->vec_dot[MOEX_TYPE_MXFP4](cols, w, a[t], &got);
                CHECK(got == exact[t], "%s mxfp4 row %d token %d: %.9g, exact %.9g", paths[p]->name, row, t, got,
                      exact[t]);
                checked++;
            }
            if (!paths[p]->vec_dot_multi[MOEX_TYPE_MXFP4]) continue;
            for (int nt = 1; nt <= nt_max; nt++) {
                const void *ap[MOEX_DOT_MAX_TOKENS];
                float got[MOEX_DOT_MAX_TOKENS], *out[MOEX_DOT_MAX_TOKENS];
                for (int t = 0; t < nt; t++) {
                    ap[t] = a[t];
                    out[t] = &got[t];
                }
                paths[p]->vec_dot_multi[MOEX_TYPE_MXFP4](cols, w, ap, nt, out);
                for (int t = 0; t < nt; t++)
                    CHECK(got[t] == exact[t], "%s mxfp4 %d-token kernel, token %d: %.9g, exact %.9g", paths[p]->name,
                          nt, t, got[t], exact[t]);
                checked++;
            }
        }
    }
    printf("  mxfp4 exact dots, all paths bit for bit: %d\n", checked);
}

/* Blocks whose values are all representable, with a top-binade code (|v| 4
 * or 6) so that the block's exponent is the one ggml's rule picks, quantize
 * back to the same bytes (-0 becomes +0's code); and ggml's nearest-value
 * rule on hand-picked values: ties go to the lower code, above 6 clips. */
static void test_mxfp4_quantize(rng *r) {
    enum { NB = 64 };
    moex_block_mxfp4 b[NB], q[NB];
    float v[NB * 32];
    for (int i = 0; i < NB; i++) {
        b[i].e = (uint8_t)(rng_next(r) % 253); /* 253+: 6 * 2^126 and up overflow f32 */
        for (int j = 0; j < 16; j++) {
            uint8_t lo = (uint8_t)(rng_next(r) % 16), hi = (uint8_t)(rng_next(r) % 16);
            if (lo == 8) lo = 0;
            if (hi == 8) hi = 0;
            b[i].qs[j] = (uint8_t)(lo | (hi << 4));
        }
        b[i].qs[rng_next(r) % 16] = (uint8_t)(6 + rng_next(r) % 2 + (rng_next(r) % 2 ? 8 : 0)); /* +-4 or +-6 */
    }
    moex_dequantize_row(MOEX_TYPE_MXFP4, b, v, NB * 32, NULL);
    moex_quantize_row(MOEX_TYPE_MXFP4, v, q, NB * 32, NULL);
    int bad = 0;
    for (int i = 0; i < NB; i++) bad += memcmp(&b[i], &q[i], sizeof b[i]) != 0;
    CHECK(bad == 0, "mxfp4: %d of %d representable blocks do not quantize back to themselves", bad, NB);

    /* amax 7.9: e 127 (values E2M1 * 1); 2.5 is halfway between codes 4 (2)
     * and 5 (3), 0.25 between 0 and .5, -0.25 between 0 and -.5 */
    const float x[32] = {6.0f, 2.5f, -2.5f, 0.25f, -0.25f, 7.9f, -0.0f, 1.2f, -5.1f, 0.7f};
    const uint8_t want[32] = {7, 4, 12, 0, 0, 7, 0, 2, 15, 1};
    moex_block_mxfp4 one;
    moex_quantize_row(MOEX_TYPE_MXFP4, x, &one, 32, NULL);
    CHECK(one.e == 127, "mxfp4: amax 7.9 gives exponent %d, want 127", one.e);
    bad = 0;
    for (int j = 0; j < 32; j++) {
        const int code = j < 16 ? one.qs[j] & 0xF : one.qs[j - 16] >> 4;
        if (code != want[j]) {
            bad++;
            printf("  mxfp4 quantize %g: code %d, want %d\n", x[j], code, want[j]);
        }
    }
    CHECK(bad == 0, "mxfp4: %d hand-picked values quantize to the wrong code", bad);
    /* the exponent follows floor(log2(amax)): 4 -> 127, 3.99 -> 126, 1e-30 -> 25 */
    const float amaxes[] = {4.0f, 3.99f, 1e6f, 1e-30f};
    const int want_e[] = {127, 126, 144, 25};
    for (int k = 0; k < 4; k++) {
        float y[32] = {0};
        y[5] = -amaxes[k];
        moex_quantize_row(MOEX_TYPE_MXFP4, y, &one, 32, NULL);
        CHECK(one.e == want_e[k], "mxfp4: amax %g gives exponent %d, want %d", amaxes[k], one.e, want_e[k]);
    }
}

/* ---- round trips ---- */

/* Bound on ||dequantize(quantize(x)) - x|| / ||x|| for the weight-like test
 * data (Gaussian rows, 0.2 % outliers x8). Worst over 40 seeds: f16 2.3e-4,
 * bf16 1.8e-3, q4_0 .13, q4_1 .094, q5_0 .063, q5_1 .045, q8_0 .0078,
 * q4_K .085, q5_K .044, q6_K .023, q8_K .017, mxfp4 .144 (power-of-two scales
 * and 3 bits of magnitude); bounds are ~1.4x those. */
static double roundtrip_bound(moex_type t) {
    switch (t) {
    case MOEX_TYPE_F32: return 0;
    case MOEX_TYPE_F16: return 4e-4;
    case MOEX_TYPE_BF16: return 3e-3;
    case MOEX_TYPE_Q4_0: return 0.18;
    case MOEX_TYPE_Q4_1: return 0.13;
    case MOEX_TYPE_Q5_0: return 0.09;
    case MOEX_TYPE_Q5_1: return 0.065;
    case MOEX_TYPE_Q8_0: return 0.012;
    case MOEX_TYPE_Q8_1: return 0.012;
    case MOEX_TYPE_Q4_K: return 0.12;
    case MOEX_TYPE_Q5_K: return 0.062;
    case MOEX_TYPE_Q6_K: return 0.032;
    case MOEX_TYPE_Q8_K: return 0.025;
    case MOEX_TYPE_MXFP4: return 0.2;
    default: return 0;
    }
}

static void test_roundtrips(rng *r) {
    static const moex_type types[] = {MOEX_TYPE_F32,  MOEX_TYPE_F16,  MOEX_TYPE_BF16, MOEX_TYPE_Q4_0, MOEX_TYPE_Q4_1,
                                      MOEX_TYPE_Q5_0, MOEX_TYPE_Q5_1, MOEX_TYPE_Q8_0, MOEX_TYPE_Q8_1, MOEX_TYPE_Q4_K,
                                      MOEX_TYPE_Q5_K, MOEX_TYPE_Q6_K, MOEX_TYPE_Q8_K, MOEX_TYPE_MXFP4};
    const int64_t n = 8192;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    double *xd = malloc(sizeof(double) * n);
    void *q = malloc(moex_row_bytes(MOEX_TYPE_F32, n));
    fill_weights(r, x, 8, n / 8);
    for (int64_t i = 0; i < n; i++) xd[i] = x[i];
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const moex_type t = types[k];
        memset(y, 0, sizeof(float) * n);
        int rc = moex_quantize_row(t, x, q, n, NULL) | moex_dequantize_row(t, q, y, n, NULL);
        const double err = rel_l2(y, xd, n);
        printf("  roundtrip %-5s rel L2 %.3g (bound %.3g)\n", moex_type_get(t)->name, err, roundtrip_bound(t));
        CHECK(rc == 0 && err <= roundtrip_bound(t), "%s roundtrip error %.4g > %.4g", moex_type_get(t)->name, err,
              roundtrip_bound(t));
    }
    /* all-zero input must stay zero (no 0/0) */
    memset(x, 0, sizeof(float) * 512);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        moex_quantize_row(types[k], x, q, 512, NULL);
        moex_dequantize_row(types[k], q, y, 512, NULL);
        int nonzero = 0;
        for (int i = 0; i < 512; i++) nonzero += y[i] != 0;
        CHECK(nonzero == 0, "%s: zeros do not round-trip", moex_type_get(types[k])->name);
    }
    /* bad arguments */
    moex_error e = {{0}};
    CHECK(moex_quantize_row(MOEX_TYPE_Q4_K, x, q, 100, &e) == -1 && strstr(e.msg, "whole blocks of 256 values, not 100"),
          "q4_K of 100 elements: '%s'", e.msg);
    CHECK(moex_dequantize_row(MOEX_TYPE_MXFP4, q, y, 48, &e) == -1 && strstr(e.msg, "mxfp4 row holds whole blocks of 32 values, not 48"),
          "mxfp4 of 48 elements: '%s'", e.msg);
    CHECK(moex_dequantize_row((moex_type)5, q, y, 32, &e) == -1 && strstr(e.msg, "the unknown type 5"),
          "unknown type: '%s'", e.msg);
    CHECK(moex_dequantize_row(MOEX_TYPE_Q8_0, NULL, y, 32, &e) == -1 && strstr(e.msg, "without source"),
          "NULL source: '%s'", e.msg);
    free(x);
    free(y);
    free(xd);
    free(q);
}

/* ---- activation quantizers: AVX2 vs reference ---- */

static void test_act_quantizers(rng *r) {
    const moex_simd_table *avx2 = moex_simd_avx2(), *ref = moex_simd_portable();
    if (!avx2) {
        printf("  (no AVX2 on this CPU: activation quantizer comparison skipped)\n");
        return;
    }
    const int64_t n = 4096;
    float *x = malloc(sizeof(float) * n);
    fill_gauss(r, x, n, 3.0f);
    static const moex_type acts[] = {MOEX_TYPE_Q8_0, MOEX_TYPE_Q8_1, MOEX_TYPE_Q8_K};
    for (int k = 0; k < 3; k++) {
        const moex_type t = acts[k];
        const size_t bytes = moex_row_bytes(t, n);
        uint8_t *a = malloc(bytes), *b = malloc(bytes);
        avx2->quantize_act[t](x, a, n);
        ref->quantize_act[t](x, b, n);
        float *fa = malloc(sizeof(float) * n), *fb = malloc(sizeof(float) * n);
        moex_dequantize_row(t, a, fa, n, NULL);
        moex_dequantize_row(t, b, fb, n, NULL);
        /* Q8_K must match exactly (including bsums); Q8_0/Q8_1 may differ by
         * one step at exact .5 ties (round-half-even vs roundf). */
        if (t == MOEX_TYPE_Q8_K) {
            CHECK(memcmp(a, b, bytes) == 0, "avx2 q8_K quantizer differs from the reference");
        } else {
            int off_by_more = 0;
            for (int64_t blk = 0; blk < n / 32; blk++) {
                const int8_t *qa = (const int8_t *)(a + blk * (bytes / (n / 32))) + (t == MOEX_TYPE_Q8_0 ? 2 : 4);
                const int8_t *qb = (const int8_t *)(b + blk * (bytes / (n / 32))) + (t == MOEX_TYPE_Q8_0 ? 2 : 4);
                for (int j = 0; j < 32; j++) off_by_more += abs(qa[j] - qb[j]) > 1;
                off_by_more += memcmp(a + blk * (bytes / (n / 32)), b + blk * (bytes / (n / 32)), 2) != 0;
            }
            const double err = rel_l2_f(fa, fb, n);
            CHECK(off_by_more == 0 && err < 1e-3, "avx2 %s quantizer: %d mismatches, rel diff %.3g",
                  moex_type_get(t)->name, off_by_more, err);
        }
        free(a);
        free(b);
        free(fa);
        free(fb);
    }
    free(x);
}

/* ---- dot products ---- */

static void test_vec_dots(rng *r) {
    const moex_simd_table *paths[N_PATHS] = {moex_simd_portable(), moex_simd_avx2(), moex_simd_vnni()};
    const int64_t rows = 64, cols = 1024 + 512; /* 6 K-blocks: exercises odd block counts per unroll */
    float *w = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * cols);
    double *want = malloc(sizeof(double) * rows);
    float *got[N_PATHS] = {malloc(sizeof(float) * rows), malloc(sizeof(float) * rows), malloc(sizeof(float) * rows)};
    fill_weights(r, w, rows, cols);
    fill_gauss(r, x, cols, 1.0f);
    for (int k = 0; k < N_WEIGHT_TYPES; k++) {
        const moex_type t = k_weight_types[k];
        const int at = moex_vec_dot_type(t);
        moex_matrix m = make_matrix(t, w, rows, cols);
        float *wd = dequantized(&m);
        for (int64_t i = 0; i < rows; i++) {
            double s = 0;
            for (int64_t j = 0; j < cols; j++) s += (double)wd[i * cols + j] * x[j];
            want[i] = s;
        }
        /* the same quantized activations for both paths (the reference quantizer) */
        void *xq = x;
        if (at != MOEX_TYPE_F32) {
            xq = malloc(moex_row_bytes(at, cols));
            moex_quantize_row(at, x, xq, cols, NULL);
        }
        for (int p = 0; p < N_PATHS; p++) {
            if (!paths[p]) continue;
            CHECK(paths[p]->vec_dot[t] != NULL, "%s path lacks vec_dot for %s", paths[p]->name, moex_type_get(t)->name);
            if (!paths[p]->vec_dot[t]) continue;
            for (int64_t i = 0; i < rows; i++)
                paths[p]->vec_dot[t](cols, (const uint8_t *)m.data + i * m.row_bytes, xq, &got[p][i]);
            const double err = rel_l2(got[p], want, rows);
            printf("  vec_dot %-8s %-5s rel L2 vs f64 %.3g (bound %.3g)\n", paths[p]->name, moex_type_get(t)->name, err,
                   dot_error_bound(t));
            CHECK(err <= dot_error_bound(t), "%s vec_dot %s error %.4g > %.4g", paths[p]->name, moex_type_get(t)->name,
                  err, dot_error_bound(t));
        }
        for (int p = 1; p < N_PATHS; p++) {
            if (!paths[p] || !paths[p]->vec_dot[t]) continue;
            const double diff = rel_l2_f(got[p], got[0], rows);
            CHECK(diff <= 1e-5, "%s: %s and portable differ by %.3g (relative L2)", moex_type_get(t)->name,
                  paths[p]->name, diff);
        }
        if (xq != x) free(xq);
        free(wd);
        free((void *)m.data);
    }
    free(w);
    free(x);
    free(want);
    for (int p = 0; p < N_PATHS; p++) free(got[p]);
}

/* Multi-token kernels must equal the one-token kernel bit for bit, for every
 * group size (matmul groups tokens by 4 with a remainder). */
static void test_vec_dot_multi(rng *r) {
    const moex_simd_table *paths[N_PATHS] = {moex_simd_portable(), moex_simd_avx2(), moex_simd_vnni()};
    const int64_t cols = 1024 + 256, nt_max = MOEX_DOT_MAX_TOKENS;
    float *w = malloc(sizeof(float) * cols), *x = malloc(sizeof(float) * cols * nt_max);
    fill_weights(r, w, 1, cols);
    fill_gauss(r, x, cols * nt_max, 1.0f);
    int tested = 0;
    for (int p = 0; p < N_PATHS; p++) {
        if (!paths[p]) continue;
        for (int k = 0; k < N_WEIGHT_TYPES; k++) {
            const moex_type t = k_weight_types[k];
            if (!paths[p]->vec_dot_multi[t]) continue;
            const int at = moex_vec_dot_type(t);
            const size_t arb = at == MOEX_TYPE_F32 ? sizeof(float) * cols : moex_row_bytes(at, cols);
            moex_matrix m = make_matrix(t, w, 1, cols);
            uint8_t *xq = malloc(arb * nt_max);
            for (int i = 0; i < nt_max; i++) moex_quantize_row(at, x + i * cols, xq + i * arb, cols, NULL);
            for (int nt = 1; nt <= nt_max; nt++) {
                const void *a[MOEX_DOT_MAX_TOKENS];
                float got[MOEX_DOT_MAX_TOKENS], want[MOEX_DOT_MAX_TOKENS], *out[MOEX_DOT_MAX_TOKENS];
                for (int i = 0; i < nt; i++) {
                    a[i] = xq + (nt_max - 1 - i) * arb; /* any order */
                    out[i] = &got[i];
                    paths[p]->vec_dot[t](cols, m.data, a[i], &want[i]);
                }
                paths[p]->vec_dot_multi[t](cols, m.data, a, nt, out);
                CHECK(memcmp(got, want, sizeof(float) * nt) == 0, "%s %s: %d-token kernel differs from vec_dot",
                      paths[p]->name, moex_type_get(t)->name, nt);
            }
            tested++;
            free(xq);
            free((void *)m.data);
        }
    }
    printf("  multi-token kernels checked against vec_dot: %d\n", tested);
    free(w);
    free(x);
}

/* ---- AVX-512 VNNI kernels vs AVX2 at the integer extremes ---- */

/* A weight row of random bytes (every nibble, 6-bit scale and min, Q6_K
 * scale -128..127 and Q8_0 value -128..127 occurs) with sane f16 scales. */
static void fill_random_blocks(rng *r, moex_type t, uint8_t *row, int64_t cols) {
    const moex_type_traits *tt = moex_type_get(t);
    const int64_t nb = cols / tt->block_elems;
    for (int64_t i = 0; i < nb * tt->block_bytes; i++) row[i] = (uint8_t)rng_next(r);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = row + b * tt->block_bytes;
        const moex_f16 d = moex_f32_to_f16((float)(1e-3 * (1 + rng_uniform(r))));
        const moex_f16 dmin = moex_f32_to_f16((float)(1e-3 * (1 + rng_uniform(r))));
        switch (t) {
        case MOEX_TYPE_Q4_K:
        case MOEX_TYPE_Q5_K:
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &dmin, 2);
            break;
        case MOEX_TYPE_Q6_K: memcpy(blk + offsetof(moex_block_q6_K, d), &d, 2); break;
        default: memcpy(blk, &d, 2); break; /* Q8_0: d first */
        }
    }
}

/* Activation row k of 4 kinds: gaussian, saturated (every |value| 127),
 * saturated with all signs equal, and gaussian with zero blocks. */
static void fill_activation_kind(rng *r, int kind, float *x, int64_t cols) {
    for (int64_t j = 0; j < cols; j++) {
        switch (kind % 4) {
        case 0: x[j] = rng_gauss(r); break;
        case 1: x[j] = rng_uniform(r) < 0.5 ? -2.0f : 2.0f; break;
        case 2: x[j] = kind & 4 ? -2.0f : 2.0f; break;
        default: x[j] = (j / 256) % 2 ? 0.0f : rng_gauss(r); break;
        }
    }
}

/* The multi-token VNNI kernels must equal the AVX2 one-token kernel bit for
 * bit (same exact integer lanes, same float steps), for every group size. */
static void test_vnni_matches_avx2(rng *r) {
    const moex_simd_table *vnni = moex_simd_vnni(), *avx2 = moex_simd_avx2(), *ref = moex_simd_portable();
    if (!vnni) {
        printf("  (no AVX-512 VNNI on this CPU: VNNI kernels not tested)\n");
        return;
    }
    CHECK(avx2 != NULL, "VNNI without AVX2");
    if (!avx2) return;
    static const moex_type types[] = {MOEX_TYPE_Q4_K, MOEX_TYPE_Q5_K, MOEX_TYPE_Q6_K, MOEX_TYPE_Q8_0};
    const int64_t cols = 256 * 5, n_rows = 8, nt_max = MOEX_DOT_MAX_TOKENS;
    float *x = malloc(sizeof(float) * cols);
    int checked = 0;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const moex_type t = types[k];
        const int at = moex_vec_dot_type(t);
        const size_t wrb = moex_row_bytes(t, cols), arb = moex_row_bytes(at, cols);
        CHECK(vnni->vec_dot_multi[t] != NULL, "VNNI table lacks a multi-token %s kernel", moex_type_get(t)->name);
        if (!vnni->vec_dot_multi[t]) continue;
        uint8_t *w = malloc(wrb), *aq = malloc(arb * nt_max);
        double num = 0, den = 0; /* L2 of VNNI - portable, of portable */
        for (int64_t row = 0; row < n_rows; row++) {
            if (row % 2) fill_random_blocks(r, t, w, cols);
            else {
                fill_weights(r, x, 1, cols);
                moex_quantize_row(t, x, w, cols, NULL);
            }
            for (int i = 0; i < nt_max; i++) {
                fill_activation_kind(r, (int)(row * nt_max + i), x, cols);
                moex_quantize_row(at, x, aq + i * arb, cols, NULL);
            }
            for (int nt = 1; nt <= nt_max; nt++) {
                const void *a[MOEX_DOT_MAX_TOKENS];
                float got[MOEX_DOT_MAX_TOKENS], want[MOEX_DOT_MAX_TOKENS], exact[MOEX_DOT_MAX_TOKENS];
                float *out[MOEX_DOT_MAX_TOKENS];
                for (int i = 0; i < nt; i++) {
                    a[i] = aq + ((i + nt) % nt_max) * arb;
                    out[i] = &got[i];
                    avx2->vec_dot[t](cols, w, a[i], &want[i]);
                    ref->vec_dot[t](cols, w, a[i], &exact[i]);
                }
                vnni->vec_dot_multi[t](cols, w, a, nt, out);
                for (int i = 0; i < nt; i++) {
                    CHECK(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                          "%s row %lld, %d tokens, token %d: VNNI %.9g != AVX2 %.9g", moex_type_get(t)->name,
                          (long long)row, nt, i, got[i], want[i]);
                    num += ((double)got[i] - exact[i]) * ((double)got[i] - exact[i]);
                    den += (double)exact[i] * exact[i];
                }
                checked++;
            }
        }
        /* integer sums are exact on both (a saturating s16 step would show
         * here): only the float summation order differs from portable */
        const double diff = sqrt(num / den);
        CHECK(diff < 2e-6, "%s: VNNI vs portable relative L2 difference %.3g", moex_type_get(t)->name, diff);
        printf("  vnni %-5s multi == avx2 vec_dot bit for bit (random bits, saturated rows); vs portable %.2g\n",
               moex_type_get(t)->name, diff);
        free(w);
        free(aq);
    }
    printf("  VNNI groups checked: %d\n", checked);
    free(x);
}

/* The active path is the best of this CPU unless --simd (MOEX_TEST_SIMD
 * here) names a lower one. */
static void test_path_choice(void) {
    const char *forced = getenv("MOEX_TEST_SIMD");
    const char *name = moex_kernels_simd_name();
    const moex_simd_table *best = moex_simd_vnni() ? moex_simd_vnni() : moex_simd_avx2();
    const char *want = best ? best->name : "portable";
    if (forced && !strcmp(forced, "portable")) want = "portable";
    if (forced && !strcmp(forced, "avx2")) want = moex_simd_avx2() ? "avx2" : "portable";
    CHECK(!strcmp(name, want), "--simd %s: path %s, expected %s", forced ? forced : "(unset)", name, want);
    CHECK(moex_simd_active() == (!strcmp(want, "portable") ? moex_simd_portable()
                                 : !strcmp(want, "avx2") ? moex_simd_avx2() : moex_simd_vnni()),
          "moex_simd_active is not the table named %s", want);
}

int main(int argc, char **argv) {
    rng r = {seed_from_args(argc, argv)};
    use_test_simd();
    printf("simd path in use: %s\n", moex_kernels_simd_name());
    moex_error err;
    CHECK(moex_kernels_use_simd("sse9", &err) == -1 && strstr(err.msg, "portable, avx2 or avx512vnni"),
          "--simd sse9 accepted");
    test_q4_K_layout(&r);
    test_q5_K_layout(&r);
    test_q6_K_layout(&r);
    test_block32_layouts();
    test_mxfp4_dequant(&r);
    test_mxfp4_quantize(&r);
    test_roundtrips(&r);
    test_act_quantizers(&r);
    test_vec_dots(&r);
    test_vec_dot_multi(&r);
    test_vnni_matches_avx2(&r);
    test_mxfp4_dot_edges(&r);
    test_mxfp4_paths_exact(&r);
    test_path_choice();
    if (g_failures) {
        printf("%d failure(s)\n", g_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
