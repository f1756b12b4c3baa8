// Rows of a weight matrix to f32: out[i] = row(rows ? ids[i] : i). Used for
// the embedding gather (any weight type) and to pin the GLSL block views
// against the C dequantizer. grid (ceil(cols/8/64), n)
#version 450
#include "vk_variants.h"
#include "_common.comp"
#include "_quant.comp"
layout(local_size_x = 64) in;
layout(push_constant) uniform PC {
    U32 w; F32 out_; I32 ids; U32 p3; U32 p4; U32 p5; U32 p6; U32 p7;
    uint cols, use_ids;
} pc;
void main() {
    const uint u = gl_WorkGroupID.x * 64u + gl_LocalInvocationID.x, i = gl_WorkGroupID.y;
    if (u * 8u >= pc.cols) return;
    const uint row = pc.use_ids != 0u ? uint(pc.ids.v[i]) : i;
    vec4 a, b;
    dq8(pc.w, row * (pc.cols / BLK) * BLK_BYTES, u * 8u, a, b);
    const uint o = i * pc.cols + u * 8u;
    for (uint j = 0u; j < 4u; j++) {
        pc.out_.v[o + j] = a[j];
        pc.out_.v[o + 4u + j] = b[j];
    }
}
