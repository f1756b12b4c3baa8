/* Private to the kernels module: the per-type dot-product table that each
 * SIMD path (portable, AVX2, later WASM SIMD) fills in, and the pairing of
 * weight types with activation types. Tests include it to check the paths
 * against each other. */
#ifndef MOEX_KERNELS_INTERNAL_H
#define MOEX_KERNELS_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "common/types.h"

/* *out = dot(weight row w, activation row a) over n elements; a is stored in
 * moex_vec_dot_type(weight type). */
typedef void (*moex_vec_dot_fn)(int64_t n, const void *w, const void *a, float *out);
/* The same for nt (1..MOEX_DOT_MAX_TOKENS) activation rows a[t] against one
 * weight row, *out[t] = dot(w, a[t]); bit-identical to vec_dot per token, so
 * grouping tokens never changes results. Optional (NULL: loop over vec_dot). */
#define MOEX_DOT_MAX_TOKENS 4
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
 * Q8_K for K-quants, Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, F32 for
 * float weights. -1 for types that are not weights. */
int moex_vec_dot_type(moex_type weight_type);

/* The table in use: AVX2 when the CPU has AVX2+FMA+F16C, else portable;
 * MOEX_SIMD=portable in the environment forces the portable path. */
const moex_simd_table *moex_simd_active(void);
const moex_simd_table *moex_simd_portable(void);
/* NULL when not built for x86 or the CPU lacks AVX2/FMA/F16C. */
const moex_simd_table *moex_simd_avx2(void);

/* Defined by dot_portable.c and dot_avx2.c (data only, so simd.c can take
 * their address without running any AVX2 code). */
extern const moex_simd_table moex_simd_table_portable;
#if defined(__x86_64__) || defined(__i386__)
extern const moex_simd_table moex_simd_table_avx2;
#endif

/* Reference activation quantizers (quant.c); the portable table uses them. */
void moex_quantize_q8_0_ref(const float *x, void *dst, int64_t n);
void moex_quantize_q8_1_ref(const float *x, void *dst, int64_t n);
void moex_quantize_q8_K_ref(const float *x, void *dst, int64_t n);

/* ggml's round-to-nearest (ties to even) for |x| < 2^22. */
static inline int moex_nearest_int(float x) {
    float v = x + 12582912.f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* Unpacks the 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K
 * block (ggml's get_scale_min_k4). */
static inline void moex_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

#endif
