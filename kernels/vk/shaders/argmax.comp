// Index of the largest value of each row (ties: lower index): the greedy
// token without reading the logits back. grid (n_rows)
#version 450
#include "vk_variants.h"
#define WG 512u
#include "_common.comp"
layout(local_size_x = WG) in;
layout(push_constant) uniform PC {
    F32 x; I32 out_; U32 p2; U32 p3; U32 p4; U32 p5; U32 p6; U32 p7;
    uint n, stride;
} pc;
shared float rv[WG];
shared uint ri[WG];
void main() {
    const uint tid = gl_LocalInvocationID.x, r = gl_WorkGroupID.x;
    float bv = -3.4e38;
    uint bi = 0xffffffffu;
    // Four loads in flight per thread (one workgroup streams the whole row,
    // latency-bound with one load at a time). Each thread still visits its
    // indices in increasing order, so ties keep the lowest.
    const uint base = r * pc.stride;
    uint i = tid;
    for (; i + 3u * WG < pc.n; i += 4u * WG) {
        const float v0 = pc.x.v[base + i], v1 = pc.x.v[base + i + WG], v2 = pc.x.v[base + i + 2u * WG],
                    v3 = pc.x.v[base + i + 3u * WG];
        if (v0 > bv) { bv = v0; bi = i; }
        if (v1 > bv) { bv = v1; bi = i + WG; }
        if (v2 > bv) { bv = v2; bi = i + 2u * WG; }
        if (v3 > bv) { bv = v3; bi = i + 3u * WG; }
    }
    for (; i < pc.n; i += WG) {
        const float v = pc.x.v[base + i];
        if (v > bv) { bv = v; bi = i; }
    }
    rv[tid] = bv;
    ri[tid] = bi;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (tid < s && (rv[tid + s] > rv[tid] || (rv[tid + s] == rv[tid] && ri[tid + s] < ri[tid]))) {
            rv[tid] = rv[tid + s];
            ri[tid] = ri[tid + s];
        }
        barrier();
    }
    if (tid == 0u) pc.out_.v[r] = int(ri[0]);
}
