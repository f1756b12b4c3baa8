// Causal GQA attention, split-K (flash-decoding): workgroup (head, token,
// split) runs an online softmax over its slice of key positions and writes
// (max, sum, acc[hd]) to part; attn_merge combines the splits. Decode has
// n_split slices per head to fill the GPU; a prompt batch gets its
// parallelism from the tokens. Keys beyond the token's position are skipped.
layout(local_size_x = 128) in;
layout(push_constant) uniform PC {
    F32 q; F32 kc; F32 vc; F32 part; I32 params; U32 p5; U32 p6; U32 p7;
    uint n_head, n_head_kv, hd, n_split, chunk, scale_bits;
} pc;
shared float qv[512];
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
void main() {
    const uint tid = gl_LocalInvocationID.x, h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, sp = gl_WorkGroupID.z;
    const uint hd = pc.hd, kvd = pc.n_head_kv * hd, kvh = h / (pc.n_head / pc.n_head_kv);
    const uint qpos = uint(pc.params.v[0]) + t;
    const uint start = sp * pc.chunk, end = min(start + pc.chunk, qpos + 1u);
    const float scale = uintBitsToFloat(pc.scale_bits);
    for (uint i = tid; i < hd; i += 128u) qv[i] = pc.q.v[(t * pc.n_head + h) * hd + i];
    barrier();
    float m = NEG_BIG, l = 0.0, acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
    for (uint c0 = start; c0 < end; c0 += 128u) {
        const uint key = c0 + tid;
        float s = NEG_BIG;
#ifdef USE_SUBGROUP
        {   // a subgroup per SG keys, lanes across the head: coalesced K reads
            const uint S = gl_SubgroupSize, lane = gl_SubgroupInvocationID, k0 = c0 + gl_SubgroupID * S;
            for (uint kk = 0u; kk < S; kk++) {
                const uint kj = k0 + kk;
                if (kj >= end) break;   // uniform in the subgroup
                const uint ko = kj * kvd + kvh * hd;
                float part = 0.0;
                for (uint i = lane; i < hd; i += S) part += qv[i] * pc.kc.v[ko + i];
                part = subgroupAdd(part);
                if (lane == kk) s = part * scale;
            }
        }
#else
        if (key < end) {
            s = 0.0;
            const uint ko = key * kvd + kvh * hd;
            for (uint i = 0u; i < hd; i++) s += qv[i] * pc.kc.v[ko + i];
            s *= scale;
        }
#endif
        const float nm = max(m, wg_reduce(s, true));
        const float p = key < end ? exp(s - nm) : 0.0;
        sc[tid] = p;
        const float ps = wg_reduce(p, false);   // its barriers also publish sc[]
        const float corr = exp(m - nm);
        l = l * corr + ps;
        const uint nk = min(128u, end - c0);
        for (uint j = 0u; j < 4u; j++) {
            const uint d = tid + 128u * j;
            if (d >= hd) break;
            float a = acc[j] * corr;
            for (uint i = 0u; i < nk; i++) a += sc[i] * pc.vc.v[(c0 + i) * kvd + kvh * hd + d];
            acc[j] = a;
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
