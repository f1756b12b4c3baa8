/* Shared by the Vulkan tests: device setup (exit 77 = skip when no Vulkan
 * device exists), seeded random data, GPU buffers from host arrays.
 * Header-only; each test includes it once. */
#ifndef MOEX_VK_TEST_UTIL_H
#define MOEX_VK_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/vk/vk.h"
#include "tests/test_util.h"

#define MUST(call)                                                                \
    do {                                                                          \
        if ((call) != 0) {                                                        \
            fprintf(stderr, "FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, g_err.msg); \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

static moex_error g_err;

static inline void fill_gauss(rng *r, float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * rng_gauss(r);
}

/* The options of a test's device: $MOEX_VK_DEVICE (else the default pick)
 * and $MOEX_VK_TEST_TUNE, --vk-tune's KEY=VALUE,... for a test run with other
 * kernel choices (tests/vk/tests.cmake, check_vkprof.py). Test settings, read
 * here in the tests: the backend reads no environment. */
static inline moex_vk_options test_vk_options(void) {
    const char *dev = getenv("MOEX_VK_DEVICE"), *tune = getenv("MOEX_VK_TEST_TUNE");
    moex_vk_options o = {.device = dev ? atoi(dev) : -1};
    if (tune && moex_vk_options_tune(&o, tune, &g_err)) {
        fprintf(stderr, "FATAL: MOEX_VK_TEST_TUNE: %s\n", g_err.msg);
        exit(1);
    }
    return o;
}

/* The device for tests (test_vk_options); exit 77 (skip) without one.
 * coop: moex_vk_options.coop (MOEX_VK_COOP_*). */
static inline moex_vk *test_vk_coop_mode(bool no_subgroup, int coop) {
    moex_vk_options o = test_vk_options();
    o.no_subgroup = no_subgroup;
    if (coop != MOEX_VK_COOP_AUTO) o.coop = coop;
    moex_vk *vk = moex_vk_create(&o, &g_err);
    if (!vk) {
        printf("SKIP: no Vulkan device: %s\n", g_err.msg);
        exit(77);
    }
    const moex_vk_info *in = moex_vk_get_info(vk);
    printf("device: %s (%s), subgroup %u, arith %d, f16 %d, int dot %d%s, shared %u\n", in->name, in->type,
           in->subgroup_size, in->subgroup_arith, in->f16, in->int_dot, in->int_dot_fast ? " (hardware)" : "",
           in->shared_mem);
    return vk;
}

static inline moex_vk *test_vk(bool no_subgroup) { return test_vk_coop_mode(no_subgroup, MOEX_VK_COOP_AUTO); }

static inline moex_vk_buffer *gpu_from(moex_vk *vk, const void *src, size_t bytes) {
    moex_vk_buffer *b = moex_vk_buffer_create(vk, bytes ? bytes : 4, MOEX_VK_MEM_DEVICE, &g_err);
    if (!b) {
        fprintf(stderr, "FATAL: %s\n", g_err.msg);
        exit(1);
    }
    if (src) MUST(moex_vk_upload(vk, b, 0, src, bytes, &g_err));
    else {
        void *z = calloc(1, bytes ? bytes : 4);
        MUST(moex_vk_upload(vk, b, 0, z, bytes, &g_err));
        free(z);
    }
    return b;
}

static inline void gpu_read(moex_vk *vk, moex_vk_buffer *b, void *dst, size_t bytes) {
    MUST(moex_vk_download(vk, b, 0, dst, bytes, &g_err));
}

/* A random rows x cols matrix of type t (quantized from gaussians; large K-quant
 * ones of random blocks) and its exact f32 values. */
typedef struct test_matrix {
    moex_type type;
    int64_t rows, cols;
    size_t row_bytes;
    uint8_t *data;
    float *deq;
} test_matrix;

/* A K-quant block of random fields: any bytes are a valid block once its f16
 * scales are set (x = d sc q - dmin m, or d sc (q - 32)); values spread about
 * as a quantized N(0, 0.5) row's. For large matrices: the reference
 * quantizer's scale search takes ~1 us a value, 30 s for eight Qwen3-30B
 * experts, and the kernels need valid blocks, not well-fitted ones (matrices
 * of 64K values or more take them). */
static inline bool random_k_block(rng *r, moex_type t, uint8_t *blk) {
    const size_t n = moex_type_get(t)->block_bytes;
    for (size_t i = 0; i < n; i++) blk[i] = (uint8_t)rng_next(r);
    const float u1 = (float)(0.5 + 0.5 * rng_uniform(r)), u2 = (float)(0.5 + 0.5 * rng_uniform(r));
    if (t == MOEX_TYPE_Q4_K || t == MOEX_TYPE_Q5_K) {
        moex_block_q4_K *b = (moex_block_q4_K *)blk; /* d, dmin, scales lead both layouts */
        b->d = moex_f32_to_f16(u1 * (t == MOEX_TYPE_Q4_K ? 4e-3f : 2e-3f));
        b->dmin = moex_f32_to_f16(u2 * 2e-2f);
        return true;
    }
    if (t == MOEX_TYPE_Q6_K) {
        ((moex_block_q6_K *)blk)->d = moex_f32_to_f16(u1 * 3e-4f);
        return true;
    }
    return false;
}

static inline test_matrix make_matrix(rng *r, moex_type t, int64_t rows, int64_t cols) {
    test_matrix m = {.type = t, .rows = rows, .cols = cols, .row_bytes = moex_row_bytes(t, cols)};
    m.data = malloc((size_t)rows * m.row_bytes);
    m.deq = malloc((size_t)rows * (size_t)cols * sizeof(float));
    float *row = malloc((size_t)cols * sizeof(float));
    const bool random_blocks = rows * cols >= (1 << 16) &&
                               (t == MOEX_TYPE_Q4_K || t == MOEX_TYPE_Q5_K || t == MOEX_TYPE_Q6_K);
    for (int64_t i = 0; i < rows; i++) {
        uint8_t *dst = m.data + (size_t)i * m.row_bytes;
        if (random_blocks) {
            for (size_t b = 0; b < m.row_bytes; b += moex_type_get(t)->block_bytes) random_k_block(r, t, dst + b);
        } else {
            fill_gauss(r, row, (size_t)cols, 0.5f);
        }
        if ((!random_blocks && moex_quantize_row(t, row, dst, cols, NULL)) ||
            moex_dequantize_row(t, dst, m.deq + (size_t)i * cols, cols, NULL)) {
            fprintf(stderr, "FATAL: quantize/dequantize %s failed\n", moex_type_get(t)->name);
            exit(1);
        }
    }
    free(row);
    return m;
}

static inline void free_matrix(test_matrix *m) {
    free(m->data);
    free(m->deq);
}

/* out[t] = res[t] + sum_j gw[t,j] * down_e(silu(gate_e x[t]) * up_e x[t]), e = ids[t,j]:
 * the expert FFN in float64 on the dequantised weights (g, u: f x d; dn: d x f per expert). */
static inline void ref_experts(const test_matrix *g, const test_matrix *u, const test_matrix *dn, const float *x,
                               const float *res, const int32_t *ids, const float *gw, int64_t n, int k, int64_t d,
                               int64_t f, double *out) {
    double *h = malloc((size_t)f * sizeof *h);
    for (int64_t t = 0; t < n; t++) {
        for (int64_t r = 0; r < d; r++) out[t * d + r] = res[t * d + r];
        for (int j = 0; j < k; j++) {
            const int e = ids[t * k + j];
            for (int64_t r = 0; r < f; r++) {
                double a = 0, b = 0;
                for (int64_t c = 0; c < d; c++) {
                    a += (double)g[e].deq[r * d + c] * x[t * d + c];
                    b += (double)u[e].deq[r * d + c] * x[t * d + c];
                }
                h[r] = a / (1 + exp(-a)) * b;
            }
            for (int64_t r = 0; r < d; r++) {
                double s = 0;
                for (int64_t c = 0; c < f; c++) s += (double)dn[e].deq[r * f + c] * h[c];
                out[t * d + r] += gw[t * k + j] * s;
            }
        }
    }
    free(h);
}

/* The int8 activation path (moex_vk_testing_idot): v's values
 * idx[0..n) rounded as _common.comp's i8_scale / pack_i8 do: q 2^(e-7),
 * e the exponent (frexp) of their largest magnitude times 1 + 2^-7, q to the
 * nearest (ties to even). Powers of two: exact in float, so bit for bit the GPU's. */
static inline void i8_round(const float *v, const int64_t *idx, int n, float *out) {
    float a = 0;
    for (int i = 0; i < n; i++) a = fmaxf(a, fabsf(v[idx[i]]));
    int e;
    frexpf(a * 1.0078125f, &e);
    if (e < -100) e = -100;
    for (int i = 0; i < n; i++) {
        const float q = rintf(ldexpf(v[idx[i]], 7 - e));
        CHECK(fabsf(q) <= 127, "int8 rounding: %g out of range", q);
        out[idx[i]] = ldexpf(q, e - 7);
    }
}

/* Q4_K's min part (-dmin m of each value's sub-block) of m's rows: the
 * int8 path applies it to the exact x, not the rounded one. Read off by
 * dequantizing the blocks with their 4-bit values zeroed. */
static inline float *q4k_mins(const test_matrix *m) {
    const size_t bytes = (size_t)m->rows * m->row_bytes;
    uint8_t *z = malloc(bytes);
    float *out = malloc((size_t)m->rows * (size_t)m->cols * sizeof *out);
    memcpy(z, m->data, bytes);
    for (size_t o = 0; o < bytes; o += 144) memset(z + o + 16, 0, 128);   /* d, dmin, scales[12], then qs[128] */
    for (int64_t r = 0; r < m->rows; r++)
        MUST(moex_dequantize_row(m->type, z + (size_t)r * m->row_bytes, out + r * m->cols, m->cols, NULL));
    free(z);
    return out;
}

/* Row r of m times x as the int8 path computes it: the dequantised weights
 * times x rounded (xr; x itself off the path), plus for Q4_K (mins) the min
 * part times what the rounding took off x. */
static inline double i8_dot(const test_matrix *m, const float *mins, int64_t r, const float *x, const float *xr) {
    const int64_t c = m->cols;
    double s = 0;
    for (int64_t i = 0; i < c; i++) s += (double)m->deq[r * c + i] * xr[i];
    if (mins && xr != x)
        for (int64_t i = 0; i < c; i++) s += (double)mins[r * c + i] * ((double)x[i] - xr[i]);
    return s;
}

static inline moex_vk_matrix vk_matrix_of(const test_matrix *m, moex_vk_buffer *b) {
    return (moex_vk_matrix){.type = m->type, .rows = m->rows, .cols = m->cols, .row_bytes = m->row_bytes,
                            .data = moex_vk_buffer_ptr(b)};
}

static const moex_type k_all_types[] = {MOEX_TYPE_F32,  MOEX_TYPE_F16,  MOEX_TYPE_BF16, MOEX_TYPE_Q8_0,
                                        MOEX_TYPE_Q4_0, MOEX_TYPE_Q4_1, MOEX_TYPE_Q5_0, MOEX_TYPE_Q5_1,
                                        MOEX_TYPE_Q4_K, MOEX_TYPE_Q5_K, MOEX_TYPE_Q6_K};
#define N_ALL_TYPES ((int)(sizeof k_all_types / sizeof k_all_types[0]))

/* A command buffer being recorded; cmd_run_free submits it, waits and frees it. */
static inline moex_vk_cmd *cmd_begin(moex_vk *vk) {
    moex_vk_cmd *c = moex_vk_cmd_create(vk, &g_err);
    MUST(!c);
    MUST(moex_vk_cmd_begin(c, &g_err));
    return c;
}

static inline void cmd_run_free(moex_vk_cmd *c) {
    MUST(moex_vk_cmd_run(c, &g_err));
    moex_vk_cmd_free(c);
}

/* Index of the largest logit (the first of equals). */
static inline int32_t argmax_of(const float *x, int64_t n) {
    int32_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = (int32_t)i;
    return b;
}

static inline int test_finish(const char *name) {
    if (g_failures) {
        fprintf(stderr, "%s: %d failure(s)\n", name, g_failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

#endif
