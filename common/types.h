/* Tensor element types and quantization block layouts.
 *
 * This is the one definition of every block layout (ggml-compatible, so GGUF
 * files from llama.cpp load as they are). CPU, Vulkan and WASM backends all
 * take the layout from here; nothing else may redeclare a block.
 * Part of the common module's API (common/common.h). */
#ifndef MOEX_TYPES_H
#define MOEX_TYPES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Values are ggml's type ids, as stored in GGUF tensor infos. */
typedef enum moex_type {
    MOEX_TYPE_F32 = 0,
    MOEX_TYPE_F16 = 1,
    MOEX_TYPE_Q4_0 = 2,
    MOEX_TYPE_Q4_1 = 3,
    MOEX_TYPE_Q5_0 = 6,
    MOEX_TYPE_Q5_1 = 7,
    MOEX_TYPE_Q8_0 = 8,
    MOEX_TYPE_Q8_1 = 9,   /* activations only (dot products with Q4_1/Q5_1) */
    MOEX_TYPE_Q4_K = 12,
    MOEX_TYPE_Q5_K = 13,
    MOEX_TYPE_Q6_K = 14,
    MOEX_TYPE_Q8_K = 15,  /* activations only (dot products with K-quants) */
    MOEX_TYPE_BF16 = 30,
    MOEX_TYPE_MXFP4 = 39, /* OCP microscaling FP4 (gpt-oss's experts); CPU kernels only for now */
    MOEX_TYPE_COUNT = 40
} moex_type;

#define MOEX_QK4_0 32
#define MOEX_QK4_1 32
#define MOEX_QK5_0 32
#define MOEX_QK5_1 32
#define MOEX_QK8_0 32
#define MOEX_QK8_1 32
#define MOEX_QK_MXFP4 32
#define MOEX_QK_K 256
#define MOEX_K_SCALE_SIZE 12

typedef uint16_t moex_f16;   /* IEEE half, raw bits */
typedef uint16_t moex_bf16;  /* bfloat16, raw bits */

/* x = d * (q - 8), q in 0..15; low nibbles hold elements 0..15, high 16..31 */
typedef struct { moex_f16 d; uint8_t qs[MOEX_QK4_0 / 2]; } moex_block_q4_0;
/* x = d * q + m */
typedef struct { moex_f16 d, m; uint8_t qs[MOEX_QK4_1 / 2]; } moex_block_q4_1;
/* 5th bit of element j in bit j of qh; x = d * (q - 16) */
typedef struct { moex_f16 d; uint8_t qh[4]; uint8_t qs[MOEX_QK5_0 / 2]; } moex_block_q5_0;
typedef struct { moex_f16 d, m; uint8_t qh[4]; uint8_t qs[MOEX_QK5_1 / 2]; } moex_block_q5_1;
typedef struct { moex_f16 d; int8_t qs[MOEX_QK8_0]; } moex_block_q8_0;
/* x = moex_e8m0_to_f32_half(e) * moex_kvalues_mxfp4[q], q a 4-bit E2M1 code
 * (bit 3 the sign); low nibbles hold elements 0..15, high 16..31. No f16
 * field, so the block is 17 bytes with alignment 1. */
typedef struct { uint8_t e; uint8_t qs[MOEX_QK_MXFP4 / 2]; } moex_block_mxfp4;
/* s = d * sum(qs) */
typedef struct { moex_f16 d, s; int8_t qs[MOEX_QK8_1]; } moex_block_q8_1;
/* 8 sub-blocks of 32: 6-bit scales and mins packed in scales[12];
 * x = d * sc * q - dmin * m */
typedef struct {
    moex_f16 d, dmin;
    uint8_t scales[MOEX_K_SCALE_SIZE];
    uint8_t qs[MOEX_QK_K / 2];
} moex_block_q4_K;
typedef struct {
    moex_f16 d, dmin;
    uint8_t scales[MOEX_K_SCALE_SIZE];
    uint8_t qh[MOEX_QK_K / 8];
    uint8_t qs[MOEX_QK_K / 2];
} moex_block_q5_K;
/* 16 sub-blocks of 16, int8 scales; x = d * sc * (q - 32) */
typedef struct {
    uint8_t ql[MOEX_QK_K / 2];
    uint8_t qh[MOEX_QK_K / 4];
    int8_t scales[MOEX_QK_K / 16];
    moex_f16 d;
} moex_block_q6_K;
/* bsums[i] = sum of qs[16 i .. 16 i + 15] */
typedef struct {
    float d;
    int8_t qs[MOEX_QK_K];
    int16_t bsums[MOEX_QK_K / 16];
} moex_block_q8_K;

_Static_assert(sizeof(moex_block_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(moex_block_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(moex_block_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(moex_block_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(moex_block_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(moex_block_q8_1) == 36, "q8_1 layout");
_Static_assert(sizeof(moex_block_mxfp4) == 17, "mxfp4 layout");
_Static_assert(sizeof(moex_block_q4_K) == 144, "q4_K layout");
_Static_assert(sizeof(moex_block_q5_K) == 176, "q5_K layout");
_Static_assert(sizeof(moex_block_q6_K) == 210, "q6_K layout");
_Static_assert(sizeof(moex_block_q8_K) == 292, "q8_K layout");

/* ---- packed fields of the K-quant blocks, both ways ---- */

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block's
 * scales[12] (ggml's get_scale_min_k4): j < 4 in the low 6 bits of bytes j
 * and j + 4, j >= 4 in the nibbles of byte j + 4 with the top 2 bits in the
 * spare bits of bytes j - 4 and j. */
static inline void moex_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Packs 8 six-bit scales and mins into scales[12]: the inverse of moex_k4_scale_min. */
static inline void moex_k4_pack_scales_mins(const uint8_t sc[8], const uint8_t m[8], uint8_t out[MOEX_K_SCALE_SIZE]) {
    memset(out, 0, MOEX_K_SCALE_SIZE);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            out[j] = sc[j];
            out[j + 4] = m[j];
        } else {
            out[j + 4] = (uint8_t)((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
            out[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            out[j] |= (uint8_t)((m[j] >> 4) << 6);
        }
    }
}

/* The four values (-32..31) at position l (0..31) of one 128-element half of
 * a Q6_K block, whose ql points at the half's 64 low-nibble bytes and qh at
 * its 32 high-bit bytes: elements l, l + 32, l + 64 and l + 96 of the half. */
static inline void moex_q6_K_quad(const uint8_t *ql, const uint8_t *qh, int l, int q[4]) {
    q[0] = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
    q[1] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
    q[2] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
    q[3] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
}

/* ---- MXFP4 values ---- */

/* The 16 E2M1 values {0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, ...} doubled, so
 * that they are integers (ggml's kvalues_mxfp4); index = the 4-bit code. */
extern const int8_t moex_kvalues_mxfp4[16];

/* Half the value 2^(e - 127) of an E8M0 exponent (which makes up for the
 * doubled table above), as ggml's GGML_E8M0_TO_FP32_HALF: e 0 and 1 give the
 * f32 subnormals 2^-128 and 2^-127, e 255 gives 2^127 (ggml treats no E8M0
 * value as NaN). */
static inline float moex_e8m0_to_f32_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

typedef struct moex_type_traits {
    const char *name;      /* ggml's name: "f32", "q4_K", ... */
    int block_elems;       /* elements per block (1 for float types) */
    int block_bytes;       /* bytes per block */
    int is_weight_type;    /* may appear in a model file we load */
} moex_type_traits;

/* NULL for ids that are not a known type. */
const moex_type_traits *moex_type_get(int type);
/* Parses "q4_K", "Q4_K", "q4_k", "f16", ...; returns -1 when unknown. */
int moex_type_from_name(const char *name);
/* Bytes of a row of n elements; 0 when n is not a multiple of the block or the type is unknown. */
size_t moex_row_bytes(moex_type type, int64_t n);

/* f16 / bf16 <-> f32, round to nearest even. */
static inline float moex_f16_to_f32(moex_f16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 113;
            while (!(mant & 0x400)) { mant <<= 1; exp--; }
            mant &= 0x3ff;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline moex_f16 moex_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (moex_f16)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (moex_f16)(sign | 0x7c00);
    if (absx < 0x38800000u) { /* result is subnormal or zero */
        if (absx < 0x33000000u) return (moex_f16)sign;
        uint32_t e = absx >> 23, m = (absx & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (moex_f16)(sign | q);
    }
    uint32_t r = absx + 0xfff + ((absx >> 13) & 1); /* round to nearest even */
    return (moex_f16)(sign | ((r - 0x38000000u) >> 13));
}

static inline float moex_bf16_to_f32(moex_bf16 h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline moex_bf16 moex_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (moex_bf16)((x >> 16) | 64); /* quiet nan */
    return (moex_bf16)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

#endif
