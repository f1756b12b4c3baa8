// Groups a batch's (token, slot) pairs by expert for the tiled expert
// products: meta = counts[E], offsets[E], list[n*k] (pair indices, grouped by
// expert; the order inside a group does not matter: every pair's result is
// written to its own row). One workgroup.
#version 450
#include "vk_variants.h"
#include "_common.comp"
layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
    I32 ids; I32 meta; U32 p2; U32 p3; U32 p4; U32 p5; U32 p6; U32 p7;
    uint n_pairs, n_expert;
} pc;
shared uint cnt[MAXE];
shared uint cur[MAXE];
void main() {
    const uint tid = gl_LocalInvocationID.x, E = pc.n_expert;
    for (uint e = tid; e < E; e += 256u) cnt[e] = 0u;
    barrier();
    for (uint p = tid; p < pc.n_pairs; p += 256u) atomicAdd(cnt[uint(pc.ids.v[p])], 1u);
    barrier();
    if (tid == 0u) {
        uint off = 0u;
        for (uint e = 0u; e < E; e++) {
            pc.meta.v[e] = int(cnt[e]);
            pc.meta.v[E + e] = int(off);
            cur[e] = off;
            off += cnt[e];
        }
    }
    barrier();
    for (uint p = tid; p < pc.n_pairs; p += 256u) {
        const uint slot = atomicAdd(cur[uint(pc.ids.v[p])], 1u);
        pc.meta.v[2u * E + slot] = int(p);
    }
}
