/* Test hooks into the kernels module, for tests/kernels (not part of the
 * module's API, kernels/kernels.h): the per-type dot-product table that each
 * SIMD path (portable, AVX2, AVX-512 VNNI, later WASM SIMD) fills in, the
 * choice between the tables, and the pairing of weight types with activation
 * types, so the tests can check the paths against each other and against a
 * float64 reference. */
#ifndef MOEX_KERNELS_TESTING_H
#define MOEX_KERNELS_TESTING_H

#include <stdint.h>

#include "common/types.h"

/* *out = dot(weight row w, activation row a) over n elements; a is stored in
 * moex_vec_dot_type(weight type). */
typedef void (*moex_vec_dot_fn)(int64_t n, const void *w, const void *a, float *out);
/* The same for nt (1..MOEX_DOT_MAX_TOKENS) activation rows a[t] against one
 * weight row, *out[t] = dot(w, a[t]); bit-identical to vec_dot per token, so
 * grouping tokens never changes results. Optional (NULL: loop over vec_dot).
 * 8: the AVX-512 kernels unpack a weight block once for 8 tokens (fewer
 * unpacks per token than 4); the AVX2 ones take 4 at a time (16 ymm registers). */
#define MOEX_DOT_MAX_TOKENS 8
typedef void (*moex_vec_dot_multi_fn)(int64_t n, const void *w, const void *const *a, int nt, float *const *out);
/* Converts n f32 activations to an activation type (Q8_K, Q8_0, Q8_1). */
typedef void (*moex_quantize_act_fn)(const float *x, void *dst, int64_t n);

typedef struct moex_simd_table {
    const char *name;
    moex_vec_dot_fn vec_dot[MOEX_TYPE_COUNT];           /* by weight type */
    moex_vec_dot_multi_fn vec_dot_multi[MOEX_TYPE_COUNT]; /* by weight type, optional */
    moex_quantize_act_fn quantize_act[MOEX_TYPE_COUNT]; /* by activation type; F32 needs none */
} moex_simd_table;

/* The activation type a weight type is multiplied with (llama.cpp's pairing):
 * Q8_K for K-quants, Q8_0 for Q4_0/Q5_0/Q8_0/MXFP4, Q8_1 for Q4_1/Q5_1, F32 for
 * float weights. -1 for types that are not weights. */
int moex_vec_dot_type(moex_type weight_type);

/* The table in use: AVX-512 VNNI when the CPU has it (and AVX2), else AVX2
 * when the CPU has AVX2+FMA+F16C, else portable. moex_kernels_use_simd
 * (--simd avx2 or portable) forces a lower path. */
const moex_simd_table *moex_simd_active(void);
const moex_simd_table *moex_simd_portable(void);
/* NULL when not built for x86 or the CPU lacks AVX2/FMA/F16C. */
const moex_simd_table *moex_simd_avx2(void);
/* The AVX2 table with the AVX-512 VNNI multi-token (prefill) kernels laid
 * over it; NULL when the CPU (or OS) lacks AVX-512 F/BW/VL/VNNI or AVX2. */
const moex_simd_table *moex_simd_vnni(void);

#endif
