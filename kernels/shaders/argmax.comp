// Index of the largest value of each row (ties: lower index): the greedy
// token without reading the logits back. grid (n_rows)
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
    for (uint i = tid; i < pc.n; i += WG) {
        const float v = pc.x.v[r * pc.stride + i];
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
