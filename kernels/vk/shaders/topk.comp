// Router epilogue as its own dispatch (after an mm router product on big
// batches): one workgroup per token. Same push constants as mv.comp.
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
#ifdef USE_SUBGROUP
void main() { if (gl_SubgroupID == 0u) route_token(gl_WorkGroupID.x); }
#else
void main() { route_token(gl_WorkGroupID.x); }
#endif
