// The expert down half's input positions as int8, once: h (n k rows of n_ff
// floats) quantized per position exactly as experts_mv.comp's SIDE 1 would
// quantize it in each of its workgroups (pxload of _q4k_pos.comp or
// _q6k_pos.comp, the same function), stored as records (px_put) that the
// down half then reads (VK_EX_PREQ): a batch's down half has d / RT
// workgroups per token, and each would otherwise load and quantize all of its
// token's k n_ff inputs again. Record q = slot npos + pos; one thread a
// record, grid (ceil(n k npos / 64)).
#version 450
#include "vk_variants.h"
#define IDOT 1
#define PX_PUT
#include "_common.comp"
#include "_quant.comp"
layout(local_size_x = 64) in;

layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer UV4 { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer RV4 { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) writeonly buffer WV4 { uvec4 v[]; };

layout(push_constant) uniform PC {
    RV4 x; WV4 o; U32 unused2; U32 unused3; U32 unused4; U32 unused5; U32 unused6; U32 unused7;
    uint records, npos, xs;   // records: n k npos; xs: floats per row of x
} pc;

#if TYPE == T_Q4_K
#include "_q4k_pos.comp"
#elif TYPE == T_Q6_K
#include "_q6k_pos.comp"
#endif

void main() {
    const uint q = gl_GlobalInvocationID.x;
    if (q >= pc.records) return;
    const uint slot = q / pc.npos;
    px_put(pc.o, q, pxload(pc.x, slot * (pc.xs / 4u), q - slot * pc.npos));
}
