// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w  (w when flags & 1). grid (n_rows)
#version 450
#include "vk_variants.h"
#include "_common.comp"
layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
    F32 x; F32 out_; F32 w; U32 p3; U32 p4; U32 p5; U32 p6; U32 p7;
    uint dim, flags, eps_bits;
} pc;
shared float red[256];
void main() {
    const uint tid = gl_LocalInvocationID.x, base = gl_WorkGroupID.x * pc.dim;
    float s = 0.0;
    for (uint i = tid; i < pc.dim; i += 256u) {
        const float v = pc.x.v[base + i];
        s += v * v;
    }
    red[tid] = s;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1) {
        if (tid < h) red[tid] += red[tid + h];
        barrier();
    }
    const float inv = 1.0 / sqrt(red[0] / float(pc.dim) + uintBitsToFloat(pc.eps_bits));
    for (uint i = tid; i < pc.dim; i += 256u) {
        float v = pc.x.v[base + i] * inv;
        if ((pc.flags & 1u) != 0u) v *= pc.w.v[i];
        pc.out_.v[base + i] = v;
    }
}
