// Causal GQA attention, split-K (flash-decoding): workgroup (head, token,
// split) runs an online softmax over its slice of key positions and writes
// (max, sum, acc[hd]) to part; attn_merge combines the splits. Decode has
// n_split slices per head to fill the GPU; a prompt batch gets its
// parallelism from the tokens. Keys beyond the token's position are skipped.
// A thread owns one key for the scores and one dimension for the values.
layout(local_size_x = 128) in;
layout(push_constant) uniform PC {
    F32 q; V4 kc; F32 vc; F32 part; I32 params; U32 p5; U32 p6; U32 p7;
    uint n_head, n_head_kv, hd, n_split, chunk, scale_bits;
} pc;
shared vec4 qv[128];
shared float sc[128];
shared float red[128];
float wg_reduce(float v, bool is_max) {
    const uint tid = gl_LocalInvocationID.x;
    red[tid] = v;
    barrier();
    for (uint m = 64u; m > 0u; m >>= 1) {
        if (tid < m) red[tid] = is_max ? max(red[tid], red[tid + m]) : red[tid] + red[tid + m];
        barrier();
    }
    const float r = red[0];
    barrier();
    return r;
}
// q . K[key] over the head: each thread one key, 16-byte loads, 4 partial sums in flight.
float key_dot(uint ko4, uint hd4) {
    vec4 s0 = vec4(0.0), s1 = vec4(0.0), s2 = vec4(0.0), s3 = vec4(0.0);
    uint i = 0u;
    for (; i + 4u <= hd4; i += 4u) {
        s0 += qv[i] * pc.kc.v[ko4 + i];
        s1 += qv[i + 1u] * pc.kc.v[ko4 + i + 1u];
        s2 += qv[i + 2u] * pc.kc.v[ko4 + i + 2u];
        s3 += qv[i + 3u] * pc.kc.v[ko4 + i + 3u];
    }
    for (; i < hd4; i++) s0 += qv[i] * pc.kc.v[ko4 + i];
    const vec4 s = (s0 + s1) + (s2 + s3);
    return (s.x + s.y) + (s.z + s.w);
}
void main() {
    const uint tid = gl_LocalInvocationID.x, h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, sp = gl_WorkGroupID.z;
    const uint hd = pc.hd, hd4 = hd / 4u, kvd = pc.n_head_kv * hd, kvh = h / (pc.n_head / pc.n_head_kv);
    const uint qpos = uint(pc.params.v[0]) + t;
    const uint start = sp * pc.chunk, end = min(start + pc.chunk, qpos + 1u);
    const float scale = uintBitsToFloat(pc.scale_bits);
    const uint qo = (t * pc.n_head + h) * hd;
    for (uint i = tid; i < hd4; i += 128u)
        qv[i] = vec4(pc.q.v[qo + 4u * i], pc.q.v[qo + 4u * i + 1u], pc.q.v[qo + 4u * i + 2u], pc.q.v[qo + 4u * i + 3u]);
    barrier();
    float m = NEG_BIG, l = 0.0, acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
    for (uint c0 = start; c0 < end; c0 += 128u) {
        const uint key = c0 + tid;
        const float s = key < end ? key_dot((key * kvd + kvh * hd) / 4u, hd4) * scale : NEG_BIG;
        const float nm = max(m, wg_reduce(s, true));
        const float p = key < end ? exp(s - nm) : 0.0;
        sc[tid] = p;
        const float ps = wg_reduce(p, false);   // its barriers also publish sc[]
        const float corr = exp(m - nm);
        l = l * corr + ps;
        const uint nk = min(128u, end - c0), vo = c0 * kvd + kvh * hd;
        for (uint j = 0u; j < 4u; j++) {   // thread = dimension; 4 keys per step, independent loads
            const uint d = tid + 128u * j;
            if (d >= hd) break;
            float a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
            uint i = 0u;
            for (; i + 4u <= nk; i += 4u) {
                a0 += sc[i] * pc.vc.v[vo + i * kvd + d];
                a1 += sc[i + 1u] * pc.vc.v[vo + (i + 1u) * kvd + d];
                a2 += sc[i + 2u] * pc.vc.v[vo + (i + 2u) * kvd + d];
                a3 += sc[i + 3u] * pc.vc.v[vo + (i + 3u) * kvd + d];
            }
            for (; i < nk; i++) a0 += sc[i] * pc.vc.v[vo + i * kvd + d];
            acc[j] = acc[j] * corr + ((a0 + a1) + (a2 + a3));
        }
        m = nm;
        barrier();
    }
    const uint o = ((t * pc.n_head + h) * pc.n_split + sp) * (hd + 2u);
    if (tid == 0u) {
        pc.part.v[o] = m;
        pc.part.v[o + 1u] = l;
    }
    for (uint j = 0u; j < 4u; j++) {
        const uint d = tid + 128u * j;
        if (d < hd) pc.part.v[o + 2u + d] = acc[j];
    }
}
