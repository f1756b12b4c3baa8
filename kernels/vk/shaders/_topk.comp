// Router epilogue for token t: softmax over the pc.rows expert logits in
// pc.y row t, keep the pc.k largest (ties: lower id), renormalise them when
// flags & 2 (as engine/forward.c route_token does). With subgroups, one
// subgroup routes a token (the caller picks which); without, the whole
// workgroup. Needs the workgroup size WG and, with subgroups, their size SG.
shared float rk_p[MAXE];
shared float rk_v[WG];
shared uint rk_i[WG];

// (value, index) max over the workgroup; ties go to the lower index.
void argmax_reduce(float v, uint i) {
    const uint tid = gl_LocalInvocationID.x;
    rk_v[tid] = v;
    rk_i[tid] = i;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (tid < s) {
            float ov = rk_v[tid + s];
            uint oi = rk_i[tid + s];
            if (ov > rk_v[tid] || (ov == rk_v[tid] && oi < rk_i[tid])) { rk_v[tid] = ov; rk_i[tid] = oi; }
        }
        barrier();
    }
}

#ifdef USE_SUBGROUP
// The calling subgroup routes the token: each lane keeps MAXE/SG
// probabilities in registers; max, sum and the k argmax picks are subgroup
// operations (no workgroup barriers), the same in whichever subgroup runs them.
const uint NPL = MAXE / SG;
void route_token(uint t) {
    const uint lane = gl_SubgroupInvocationID, E = pc.rows;
    const uint S = gl_SubgroupSize;
    float v[NPL];
    float m = NEG_BIG;
    for (uint i = 0u; i < NPL; i++) {
        const uint e = lane + i * S;
        v[i] = e < E ? pc.y.v[t * pc.ys + e] : NEG_BIG;
        m = max(m, v[i]);
    }
    m = subgroupMax(m);
    float s = 0.0;
    for (uint i = 0u; i < NPL; i++) {
        const uint e = lane + i * S;
        v[i] = e < E ? exp(v[i] - m) : -2.0;
        if (e < E) s += v[i];
    }
    const float inv = 1.0 / subgroupAdd(s);
    float sum = 0.0;
    for (uint j = 0u; j < pc.k; j++) {
        float bv = -1.5;
        uint bi = 0xffffffffu;
        for (uint i = 0u; i < NPL; i++)
            if (v[i] > bv) { bv = v[i]; bi = lane + i * S; }   // increasing ids: ties keep the lower
        const float mx = subgroupMax(bv);
        const uint best = subgroupMin(bv == mx ? bi : 0xffffffffu);
        if (lane == best % S) v[best / S] = -1.0;   // taken
        const float w = mx * inv;
        sum += w;
        if (lane == 0u) {
            pc.ids.v[t * pc.k + j] = int(best);
            pc.gw.v[t * pc.k + j] = w;
        }
    }
    if ((pc.flags & 2u) != 0u && lane == 0u)
        for (uint j = 0u; j < pc.k; j++) pc.gw.v[t * pc.k + j] /= sum;
}
#else
void route_token(uint t) {
    const uint tid = gl_LocalInvocationID.x, E = pc.rows;
    float m = NEG_BIG;
    for (uint e = tid; e < E; e += WG) {
        rk_p[e] = pc.y.v[t * pc.ys + e];
        m = max(m, rk_p[e]);
    }
    argmax_reduce(m, 0u);
    m = rk_v[0];
    barrier();
    float s = 0.0;
    for (uint e = tid; e < E; e += WG) {
        rk_p[e] = exp(rk_p[e] - m);
        s += rk_p[e];
    }
    rk_v[tid] = s;
    barrier();
    for (uint h = WG / 2u; h > 0u; h >>= 1) {
        if (tid < h) rk_v[tid] += rk_v[tid + h];
        barrier();
    }
    const float inv = 1.0 / rk_v[0];
    barrier();
    float sum = 0.0;
    for (uint j = 0u; j < pc.k; j++) {
        float bv = -1.0;
        uint bi = 0xffffffffu;
        for (uint e = tid; e < E; e += WG)
            if (rk_p[e] > bv) { bv = rk_p[e]; bi = e; }
        argmax_reduce(bv, bi);
        const uint best = rk_i[0];
        const float w = rk_v[0] * inv;
        sum += w;
        if (tid == 0u) {
            pc.ids.v[t * pc.k + j] = int(best);
            pc.gw.v[t * pc.k + j] = w;
            rk_p[best] = -1.0;
        }
        barrier();
    }
    if ((pc.flags & 2u) != 0u && tid == 0u)
        for (uint j = 0u; j < pc.k; j++) pc.gw.v[t * pc.k + j] /= sum;
    barrier();
}
#endif
