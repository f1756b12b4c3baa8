// Combines the split-K partials of attn.comp: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
// grid (n_head, n_tokens)
#version 450
#include "vk_variants.h"
#include "_common.comp"
layout(local_size_x = 128) in;
layout(push_constant) uniform PC {
    F32 part; F32 out_; U32 p2; U32 p3; U32 p4; U32 p5; U32 p6; U32 p7;
    uint n_head, hd, n_split;
} pc;
void main() {
    const uint tid = gl_LocalInvocationID.x, h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, hd = pc.hd;
    const uint base = (t * pc.n_head + h) * pc.n_split * (hd + 2u);
    float M = NEG_BIG;
    for (uint s = 0u; s < pc.n_split; s++) M = max(M, pc.part.v[base + s * (hd + 2u)]);
    float L = 0.0;
    for (uint s = 0u; s < pc.n_split; s++) {
        const uint o = base + s * (hd + 2u);
        L += exp(pc.part.v[o] - M) * pc.part.v[o + 1u];
    }
    for (uint d = tid; d < hd; d += 128u) {
        float a = 0.0;
        for (uint s = 0u; s < pc.n_split; s++) {
            const uint o = base + s * (hd + 2u);
            a += exp(pc.part.v[o] - M) * pc.part.v[o + 2u + d];
        }
        pc.out_.v[(t * pc.n_head + h) * hd + d] = a / L;
    }
}
