/* Rows of f32 to and from the wire dtypes (wire_rows.h). This is the hot
 * part of encoding and decoding, so the loops are written for the compiler to
 * vectorise, and f16 uses the F16C instructions when the CPU has them.
 * Results are the same on every path (round to nearest even). Then the
 * expert boundary's rounding through them: a distributed run sends expert
 * inputs in the wire dtype, gates as f16, and gets results back in the wire
 * dtype; the local executor rounds at the same places with the same
 * conversions, so `--local` and hub + workers compute the same function. */
#include "common/wire_rows.h"

#include "common/le.h"

#include <math.h>

#include "common/types.h"

#if defined(__x86_64__) && defined(__GNUC__) && MOEX_HOST_LE
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_F16C_PATH 1

__attribute__((target("avx,f16c"))) static uint32_t f16_from_f32_f16c(const float *x, uint32_t n, uint8_t *dst) {
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + 2 * i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    return i;
}

__attribute__((target("avx,f16c"))) static uint32_t f16_to_f32_f16c(const uint8_t *src, uint32_t n, float *dst) {
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 2 * i))));
    return i;
}

/* Whether the CPU and OS support AVX and F16C: a property of the machine,
 * found once when the library loads and only read afterwards. (cpuid
 * directly, as clang's __builtin_cpu_supports does not know "f16c".) */
static int cpu_f16c;

__attribute__((constructor)) static void detect_f16c(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    if (!(c & bit_OSXSAVE) || !(c & bit_AVX) || !(c & bit_F16C)) return;
    unsigned xcr0_lo, xcr0_hi;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    cpu_f16c = (xcr0_lo & 6) == 6; /* the OS saves SSE and AVX state */
}

static int cpu_has_f16c(void) {
    return cpu_f16c;
}
#else
#define HAVE_F16C_PATH 0
#endif

static void f16_from_f32(const float *x, uint32_t n, uint8_t *dst) {
    uint32_t i = 0;
#if HAVE_F16C_PATH
    if (cpu_has_f16c()) i = f16_from_f32_f16c(x, n, dst);
#endif
    for (; i < n; i++) moex_put_u16(dst + 2 * i, moex_f32_to_f16(x[i]));
}

static void f16_to_f32(const uint8_t *src, uint32_t n, float *dst) {
    uint32_t i = 0;
#if HAVE_F16C_PATH
    if (cpu_has_f16c()) i = f16_to_f32_f16c(src, n, dst);
#endif
    for (; i < n; i++) dst[i] = moex_f16_to_f32(moex_get_u16(src + 2 * i));
}

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Branch-free form of moex_f32_to_bf16 (same results). Works through a
 * native array in chunks so that the compiler vectorises the loop. */
#define CHUNK 256
static void bf16_from_f32(const float *x, uint32_t n, uint8_t *dst) {
    uint16_t tmp[CHUNK];
    for (uint32_t base = 0; base < n; base += CHUNK) {
        uint32_t m = n - base < CHUNK ? n - base : CHUNK;
        for (uint32_t i = 0; i < m; i++) {
            uint32_t u = f32_bits(x[base + i]);
            uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
            uint32_t quiet_nan = (u >> 16) | 64u;
            tmp[i] = (uint16_t)((int32_t)(u & 0x7fffffffu) > 0x7f800000 ? quiet_nan : rounded);
        }
        moex_put_u16_array(dst + 2 * (size_t)base, tmp, m);
    }
}

static void bf16_to_f32(const uint8_t *src, uint32_t n, float *dst) {
    uint16_t tmp[CHUNK];
    for (uint32_t base = 0; base < n; base += CHUNK) {
        uint32_t m = n - base < CHUNK ? n - base : CHUNK;
        moex_get_u16_array(tmp, src + 2 * (size_t)base, m);
        for (uint32_t i = 0; i < m; i++) {
            uint32_t u = (uint32_t)tmp[i] << 16;
            memcpy(dst + base + i, &u, 4);
        }
    }
}

/* Below this, an int8 row is sent as zeros: 127 / amax would overflow. */
#define INT8_MIN_AMAX 1e-30f

/* max |x| as bits: for non-negative floats integer order is float order, and
 * inf / NaN compare above every finite value, so one integer max finds both. */
static uint32_t abs_max_bits(const float *x, uint32_t n) {
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t a = f32_bits(x[i]) & 0x7fffffffu;
        m = a > m ? a : m;
    }
    return m;
}

static int int8_from_f32(const float *x, uint32_t n, uint8_t *dst, uint8_t *scale_dst) {
    uint32_t mbits = abs_max_bits(x, n);
    if (mbits >= 0x7f800000u) return -1;
    float amax;
    memcpy(&amax, &mbits, 4);
    if (amax < INT8_MIN_AMAX) {
        memset(dst, 0, n);
        moex_put_f32(scale_dst, 0.0f);
        return 0;
    }
    const float inv = 127.0f / amax;
    for (uint32_t i = 0; i < n; i++) {
        /* |x| <= amax, so |v| <= 127 within rounding and needs no clamp; adding
         * 1.5 * 2^23 rounds to nearest even into the low mantissa bits */
        float v = x[i] * inv;
        dst[i] = (uint8_t)(int8_t)((int32_t)f32_bits(v + 12582912.0f) - 0x4b400000);
    }
    moex_put_f32(scale_dst, amax / 127.0f);
    return 0;
}

static void int8_to_f32(const uint8_t *src, const uint8_t *scale, uint32_t n, float *dst) {
    const float s = moex_get_f32(scale);
    for (uint32_t i = 0; i < n; i++) dst[i] = (float)(int8_t)src[i] * s;
}

static void f32_from_f32(const float *x, uint32_t n, uint8_t *dst) {
#if MOEX_HOST_LE
    memcpy(dst, x, 4 * (size_t)n);
#else
    for (uint32_t i = 0; i < n; i++) moex_put_f32(dst + 4 * i, x[i]);
#endif
}

static void f32_to_f32(const uint8_t *src, uint32_t n, float *dst) {
#if MOEX_HOST_LE
    memcpy(dst, src, 4 * (size_t)n);
#else
    for (uint32_t i = 0; i < n; i++) dst[i] = moex_get_f32(src + 4 * i);
#endif
}

int moex_row_from_f32(int dtype, const float *x, uint32_t n, uint8_t *dst, uint8_t *scale) {
    switch (dtype) {
    case MOEX_DT_F16: f16_from_f32(x, n, dst); return 0;
    case MOEX_DT_BF16: bf16_from_f32(x, n, dst); return 0;
    case MOEX_DT_F32: f32_from_f32(x, n, dst); return 0;
    case MOEX_DT_INT8: return int8_from_f32(x, n, dst, scale);
    default: return -1;
    }
}

void moex_row_to_f32(int dtype, const uint8_t *src, const uint8_t *scale, uint32_t n, float *dst) {
    switch (dtype) {
    case MOEX_DT_F16: f16_to_f32(src, n, dst); break;
    case MOEX_DT_BF16: bf16_to_f32(src, n, dst); break;
    case MOEX_DT_F32: f32_to_f32(src, n, dst); break;
    case MOEX_DT_INT8: int8_to_f32(src, scale, n, dst); break;
    default: memset(dst, 0, sizeof *dst * n);
    }
}

void moex_wire_round_rows(int wire_dtype, float *rows, int64_t n_rows, int64_t dim, uint8_t *tmp) {
    if (wire_dtype == MOEX_WIRE_EXACT) return;
    uint8_t scale[4];
    for (int64_t r = 0; r < n_rows; r++) {
        float *x = rows + r * dim;
        if (moex_row_from_f32(wire_dtype, x, (uint32_t)dim, tmp, scale)) continue; /* int8 of inf/nan: leave */
        moex_row_to_f32(wire_dtype, tmp, scale, (uint32_t)dim, x);
    }
}

void moex_wire_round_gates(int wire_dtype, float *gates, int64_t n) {
    if (wire_dtype == MOEX_WIRE_EXACT) return;
    for (int64_t i = 0; i < n; i++) gates[i] = moex_f16_to_f32(moex_f32_to_f16(gates[i]));
}

size_t moex_wire_tmp_bytes(int64_t dim) { return (size_t)dim * 4 + 16; }
