// Shared by every kernel (the runtime prepends it after #version and the
// variant #defines). Buffers are reached through device addresses pushed as
// push constants, so no descriptor sets exist anywhere.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_scalar_block_layout : enable
#ifdef USE_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
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

float silu(float g) { return g / (1.0 + exp(-g)); }
