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
 * grouping tokens never changes results. Optional (NULL: loop over vec_dot).
 * 8: the AVX-512 kernels unpack a weight block once for 8 tokens (~15 %
 * faster than 4); the AVX2 ones take 4 at a time (16 ymm registers). */
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
 * Q8_K for K-quants, Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, F32 for
 * float weights. -1 for types that are not weights. */
int moex_vec_dot_type(moex_type weight_type);

/* The table in use: AVX-512 VNNI when the CPU has it (and AVX2), else AVX2
 * when the CPU has AVX2+FMA+F16C, else portable. MOEX_SIMD=avx2 or
 * MOEX_SIMD=portable in the environment forces a lower path. */
const moex_simd_table *moex_simd_active(void);
const moex_simd_table *moex_simd_portable(void);
/* NULL when not built for x86 or the CPU lacks AVX2/FMA/F16C. */
const moex_simd_table *moex_simd_avx2(void);
/* The AVX2 table with the AVX-512 VNNI multi-token (prefill) kernels laid
 * over it; NULL when the CPU (or OS) lacks AVX-512 F/BW/VL/VNNI or AVX2. */
const moex_simd_table *moex_simd_vnni(void);

/* Defined by dot_portable.c and dot_avx2.c (data only, so simd.c can take
 * their address without running any AVX2 code). */
extern const moex_simd_table moex_simd_table_portable;
#if defined(__x86_64__) || defined(__i386__)
extern const moex_simd_table moex_simd_table_avx2;
/* dot_vnni.c: only the entries that differ from AVX2 (moex_simd_vnni merges). */
extern const moex_simd_table moex_simd_table_vnni;
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

/* Unpacks the 12 packed bytes of Q4_K / Q5_K scales and mins into 16
 * bytes: u[0..1] the 8 sub-block scales, u[2..3] the 8 mins (6 bits each),
 * for the SIMD kernels' byte shuffles. */
static inline void moex_k4_unpack_scales_mins(const uint8_t packed[12], uint32_t u[4]) {
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    memcpy(u, packed, 12);
    u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
    const uint32_t mins_lo = u[1] & kmask1;
    u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
    u[2] = mins_lo;
    u[0] &= kmask1;
}

#endif
