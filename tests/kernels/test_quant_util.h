/* Shared by the kernel tests: seeded random data and float64 references
 * (rel_l2 lives in test_util.h). Header-only; each test includes it once. */
#ifndef MOEX_TEST_QUANT_UTIL_H
#define MOEX_TEST_QUANT_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/kernels.h"
#include "kernels/kernels_testing.h"
#include "tests/test_util.h"

/* Gaussian rows with a per-row scale and occasional outliers (like weights). */
static inline void fill_weights(rng *r, float *x, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; i++) {
        const float scale = (float)(0.02 * (0.5 + rng_uniform(r)));
        for (int64_t j = 0; j < cols; j++) {
            float v = rng_gauss(r) * scale;
            if (rng_uniform(r) < 0.002) v *= 8;
            x[i * cols + j] = v;
        }
    }
}

static inline void fill_gauss(rng *r, float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = rng_gauss(r) * scale;
}

static inline uint64_t seed_from_args(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    printf("seed %llu (rerun with this as argv[1] to reproduce)\n", (unsigned long long)seed);
    return seed;
}

/* MOEX_TEST_SIMD=portable|avx2: the test's kernels on that path (the
 * programs' --simd, moex_kernels_use_simd), so that every path stays tested. */
static inline void use_test_simd(void) {
    const char *simd = getenv("MOEX_TEST_SIMD");
    moex_error err;
    if (simd && moex_kernels_use_simd(simd, &err)) {
        fprintf(stderr, "MOEX_TEST_SIMD: %s\n", err.msg);
        exit(2);
    }
}

/* Quantizes rows x cols f32 into a freshly allocated matrix of type t. */
static inline moex_matrix make_matrix(moex_type t, const float *w, int64_t rows, int64_t cols) {
    moex_matrix m = {.type = t, .rows = rows, .cols = cols, .row_bytes = moex_row_bytes(t, cols)};
    uint8_t *data = malloc(m.row_bytes * (size_t)rows + 1);
    for (int64_t r = 0; r < rows; r++) moex_quantize_row(t, w + r * cols, data + r * m.row_bytes, cols, NULL);
    m.data = data;
    return m;
}

/* Dequantized copy of a matrix (what the reference multiplies with). */
static inline float *dequantized(const moex_matrix *m) {
    float *out = malloc(sizeof(float) * (size_t)(m->rows * m->cols));
    for (int64_t r = 0; r < m->rows; r++)
        moex_dequantize_row(m->type, (const uint8_t *)m->data + r * m->row_bytes, out + r * m->cols, m->cols, NULL);
    return out;
}

static const moex_type k_weight_types[] = {
    MOEX_TYPE_F32, MOEX_TYPE_F16, MOEX_TYPE_BF16, MOEX_TYPE_Q4_0, MOEX_TYPE_Q4_1, MOEX_TYPE_Q5_0,
    MOEX_TYPE_Q5_1, MOEX_TYPE_Q8_0, MOEX_TYPE_Q4_K, MOEX_TYPE_Q5_K, MOEX_TYPE_Q6_K, MOEX_TYPE_MXFP4,
};
#define N_WEIGHT_TYPES (int)(sizeof k_weight_types / sizeof k_weight_types[0])

/* Bound on ||dot - exact|| / ||exact|| for a product with this weight type,
 * with the reference on dequantized weights and exact f32 activations: the
 * activation rounding dominates. Expected: step / sqrt(12) relative to the
 * activations' rms, step = absmax / 127 per block: ~0.006 for 32-blocks
 * (Q8_0/Q8_1), ~0.0075 for 256-blocks (Q8_K); over a few dozen rows the
 * measured values spread to ~0.009 / ~0.011, hence the bounds. Float
 * weights: only f32 accumulation error (measured < 2e-7). */
static inline double dot_error_bound(moex_type t) {
    switch (moex_vec_dot_type(t)) {
    case MOEX_TYPE_F32: return 2e-6;
    case MOEX_TYPE_Q8_K: return 1.8e-2;
    default: return 1.4e-2;
    }
}

/* Random 4-bit codes for a block, each of the 16 codes once among the low
 * nibbles and once among the high ones (in random orders). */
static inline void mxfp4_all_codes(rng *r, uint8_t qs[16]) {
    uint8_t lo[16], hi[16];
    for (int j = 0; j < 16; j++) lo[j] = hi[j] = (uint8_t)j;
    for (int j = 15; j > 0; j--) {
        int k = (int)(rng_next(r) % (uint64_t)(j + 1));
        uint8_t t = lo[j]; lo[j] = lo[k]; lo[k] = t;
        k = (int)(rng_next(r) % (uint64_t)(j + 1));
        t = hi[j]; hi[j] = hi[k]; hi[k] = t;
    }
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(lo[j] | (hi[j] << 4));
}

#endif
