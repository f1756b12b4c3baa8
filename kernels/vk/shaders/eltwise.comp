// Elementwise ops over n floats. OP 0: y = a + b (residual add); OP 1: y = silu(a) * b (SwiGLU).
#version 450
#include "vk_variants.h"
#define OP VARIANT
#include "_common.comp"
layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
    F32 a; F32 b; F32 y; U32 p3; U32 p4; U32 p5; U32 p6; U32 p7;
    uint n;
} pc;
void main() {
    const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    if (i >= pc.n) return;
#if OP == 0
    pc.y.v[i] = pc.a.v[i] + pc.b.v[i];
#else
    pc.y.v[i] = silu(pc.a.v[i]) * pc.b.v[i];
#endif
}
