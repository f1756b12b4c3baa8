/* Private to the kernels module: the tables each SIMD path fills in (their
 * type and the choice between them are in kernels_testing.h, the part tests
 * see), the reference activation quantizers and the helpers the SIMD paths
 * share (the blocks' packed fields are read and written by common/types.h). */
#ifndef MOEX_KERNELS_INTERNAL_H
#define MOEX_KERNELS_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "common/types.h"
#include "kernels/kernels_testing.h"

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
