// Router epilogue as its own dispatch (after an mm router product on big
// batches): one workgroup per token. Same push constants as mv.comp; estride
// > 1: the product left that many column slices' sums after the n rows of y
// (mm.comp VK_MM_SMALL), added here in order into the token's row first.
#version 450
#include "vk_variants.h"
#include "_common.comp"
#define WG 128u
layout(local_size_x = WG) in;
layout(constant_id = 0) const uint SG = 32u;   // the subgroup size, where subgroups route
layout(push_constant) uniform PC {
    U32 w; U32 w2; V4 x; CF32 y; F32 r; I32 ids; F32 gw; CU32 counter;
    uint rows, cols, n, xs, ys, flags, k, estride, n_expert;
} pc;
#include "_topk.comp"
// Token t's logits: its column slices' sums added in slice order (threads first .. count apart).
void add_slices(uint t, uint first, uint count) {
    for (uint e = first; e < pc.rows; e += count) {
        float s = 0.0;
        for (uint z = 0u; z < pc.estride; z++) s += pc.y.v[(z + 1u) * pc.n * pc.ys + t * pc.ys + e];
        pc.y.v[t * pc.ys + e] = s;
    }
}
#ifdef USE_SUBGROUP
void main() {
    if (gl_SubgroupID != 0u) return;
    // each lane adds the logits it then reads (route_token: lane + i * SG)
    if (pc.estride > 1u) add_slices(gl_WorkGroupID.x, gl_SubgroupInvocationID, gl_SubgroupSize);
    route_token(gl_WorkGroupID.x);
}
#else
void main() {
    if (pc.estride > 1u) {
        add_slices(gl_WorkGroupID.x, gl_LocalInvocationID.x, WG);
        memoryBarrierBuffer();
        barrier();
    }
    route_token(gl_WorkGroupID.x);
}
#endif
