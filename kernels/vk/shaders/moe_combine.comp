// y[t] = r[t] + sum_j po[t*k + j] (slot order), the k expert outputs of
// each token folded into the residual stream. grid (ceil(d/256), n)
#version 450
#include "vk_variants.h"
#include "_common.comp"
layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
    F32 po; F32 r; F32 y; U32 p3; U32 p4; U32 p5; U32 p6; U32 p7;
    uint d, k;
} pc;
void main() {
    const uint i = gl_WorkGroupID.x * 256u + gl_LocalInvocationID.x, t = gl_WorkGroupID.y;
    if (i >= pc.d) return;
    float s = 0.0;
    for (uint j = 0u; j < pc.k; j++) s += pc.po.v[(t * pc.k + j) * pc.d + i];
    pc.y.v[t * pc.d + i] = pc.r.v[t * pc.d + i] + s;
}
