// Shared by every kernel, which includes it after vk_variants.h and the
// #defines its variant derives from VARIANT (and USE_SUBGROUP, EMU, TYPE:
// variants.cmake). Buffers are reached through device addresses pushed as
// push constants, so no descriptor sets exist anywhere. The block layouts'
// sizes and offsets (Q6_K_BYTES, Q6_K_D, ...) come from blocks.glsl, which
// the build writes from common/types.h.
#include "blocks.glsl"
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_scalar_block_layout : enable
#ifdef USE_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#if defined(IDOT) && IDOT
#extension GL_EXT_spirv_intrinsics : require
#endif

layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer U32 { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer F32 { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer V4 { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer I32 { int v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer CF32 { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer CU32 { uint v[]; };

// moex_type ids (common/types.h)
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_BF16 30

#define NEG_BIG (-1.0e30)
#define MAXE VK_MAX_EXPERTS
#define NMAX VK_MV_NMAX

float silu(float g) { return g / (1.0 + exp(-g)); }

#if defined(IDOT) && IDOT
// OpSUDot (SPV_KHR_integer_dot_product; Debian 12's glslang lacks
// GL_EXT_integer_dot_product): a's four signed bytes times b's four unsigned
// ones, summed; packed_format 0 is PackedVectorFormat4x8Bit.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int sudot4_op(uint a, uint b, spirv_literal int packed_format);
int sudot4(uint a, uint b) { return sudot4_op(a, b, 0); }
// Values whose largest magnitude is a as int8 q times 2^(e-7), e the
// exponent (frexp) of a (1 + 2^-7): |v| / 2^(e-7) < 127.01, so |q| <= 127.
// A power of two, not a / 127, so v / scale is exact and a reference rounds
// bit for bit as the GPU does; ~half a bit coarser than a / 127, about the
// CPU's Q8_K over 256 values. Exponents from the float's bits (frexp and
// ldexp take several instructions a value).
float pow2(int k) { return uintBitsToFloat(uint(127 + k) << 23); }   // 2^k, -127 < k < 128
float vmax(vec4 v) { return max(max(v.x, v.y), max(v.z, v.w)); }
// The scale 2^(e-7) of values whose largest magnitude is a, and inv = 2^(7-e).
float i8_scale(float a, out float inv) {
    const int e = max(int((floatBitsToUint(a * 1.0078125) >> 23) & 255u) - 126, -100);
    inv = pow2(7 - e);
    return pow2(e - 7);
}
// v / 2^(e-7) (inv = 2^(7-e)) rounded to the nearest integers, ties to even,
// as four bytes: adding 1.5 2^23 leaves the integer in the low mantissa bits.
uint pack_i8(vec4 v, float inv) {
    const uvec4 b = floatBitsToUint(fma(v, vec4(inv), vec4(12582912.0))) & 255u;
    return b.x | (b.y << 8) | (b.z << 16) | (b.w << 24);
}
#endif
