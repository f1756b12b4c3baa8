// Per token and head: optional QK-norm (RMSNorm over the head), RoPE at
// position params[0] + t, and the KV append: q heads are rotated in place,
// k heads go to the cache row of their position, v heads are copied there.
// With VK_ATTN_TOKENS in flags, token t's position and first cache row come
// from params[2t], params[2t + 1] (several sequences in one batch); its row
// is then base + pos. grid (n_tokens, n_head + n_head_kv)
#version 450
#include "vk_variants.h"
#include "_common.comp"
layout(local_size_x = 128) in;
layout(push_constant) uniform PC {
    F32 q; F32 k; F32 v; F32 kc; F32 vc; I32 params; F32 qnw; F32 knw;
    uint n_head, n_head_kv, hd, rope_dim, flags, base_bits, eps_bits;
} pc;
shared float hv[512];
shared float red[128];
const float TWO_PI = 6.283185307179586;
void main() {
    const uint tid = gl_LocalInvocationID.x, t = gl_WorkGroupID.x, h = gl_WorkGroupID.y, hd = pc.hd;
    const bool tokens = (pc.flags & VK_ATTN_TOKENS) != 0u;
    const uint pos = tokens ? uint(pc.params.v[2u * t]) : uint(pc.params.v[0]) + t;
    const uint base = tokens ? uint(pc.params.v[2u * t + 1u]) : 0u;
    const bool is_q = h < pc.n_head;
    const uint kvd = pc.n_head_kv * hd, hk = h - pc.n_head;
    const uint src = is_q ? t * pc.n_head * hd + h * hd : t * kvd + hk * hd;
    for (uint i = tid; i < hd; i += 128u) hv[i] = is_q ? pc.q.v[src + i] : pc.k.v[src + i];
    barrier();
    if ((pc.flags & 1u) != 0u) {   // QK-norm
        float s = 0.0;
        for (uint i = tid; i < hd; i += 128u) s += hv[i] * hv[i];
        red[tid] = s;
        barrier();
        for (uint m = 64u; m > 0u; m >>= 1) {
            if (tid < m) red[tid] += red[tid + m];
            barrier();
        }
        const float inv = 1.0 / sqrt(red[0] / float(hd) + uintBitsToFloat(pc.eps_bits));
        barrier();
        for (uint i = tid; i < hd; i += 128u) hv[i] *= inv * (is_q ? pc.qnw.v[i] : pc.knw.v[i]);
        barrier();
    }
    const uint half_ = pc.rope_dim / 2u;
    const bool neox = (pc.flags & 2u) != 0u;
    float outv[4];   // hd <= 512: each thread owns up to 4 dims
    for (uint j = 0u; j < 4u; j++) {
        const uint i = tid + 128u * j;
        if (i >= hd) break;
        float o = hv[i];
        if (i < pc.rope_dim) {
            const uint pi = neox ? i % half_ : i / 2u;           // pair index
            const bool first = neox ? i < half_ : (i & 1u) == 0u;
            const uint i0 = neox ? pi : 2u * pi, i1 = neox ? pi + half_ : 2u * pi + 1u;
            const float theta = float(pos) * pow(uintBitsToFloat(pc.base_bits), -2.0 * float(pi) / float(pc.rope_dim));
            const float red_theta = theta - TWO_PI * floor(theta / TWO_PI + 0.5);
            const float c = cos(red_theta), s = sin(red_theta);
            o = first ? hv[i0] * c - hv[i1] * s : hv[i0] * s + hv[i1] * c;
        }
        outv[j] = o;
    }
    const uint dst = (base + pos) * kvd + hk * hd;
    for (uint j = 0u; j < 4u; j++) {
        const uint i = tid + 128u * j;
        if (i >= hd) break;
        if (is_q) pc.q.v[src + i] = outv[j];
        else {
            pc.kc.v[dst + i] = outv[j];
            pc.vc.v[dst + i] = pc.v.v[src + i];
        }
    }
}
