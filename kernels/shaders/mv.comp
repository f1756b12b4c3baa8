// Matrix-vector products for decode and small batches: each group of TPR
// threads owns one output row, walks the row 8 elements at a time with the
// weights dequantized in registers, and accumulates in f32.
// MODE 0: y[t] = W x[t] (+ r[t])             grid (rows/RPW, ceil(n/NMAX))
// MODE 1: experts gate+up: y[p] = silu(Wg_e x[p/k]) * (Wu_e x[p/k]),  e = ids[p]; grid (.., n*k)
// MODE 2: experts down + combine: y[t] = r[t] + sum_j gw[t*k+j] * Wd_e x[t*k+j]; grid (.., n)
// MODE 3: router: MODE 0 into y, then the last workgroup does softmax + top-k.
layout(local_size_x = TPR * RPW) in;

layout(push_constant) uniform PC {
    U32 w; U32 w2; V4 x; CF32 y; F32 r; I32 ids; F32 gw; CU32 counter;
    uint rows, cols, n, xs, ys, flags, k, estride, n_expert;
} pc;

#if MODE == 1
#define NV 2
#elif MODE == 2
#define NV 1
#else
#define NV NMAX
#endif

shared float red[NV][TPR * RPW];
shared bool last_group;

float row_reduce(float v, uint i) {
#ifdef USE_SUBGROUP
    return subgroupAdd(v);
#else
    const uint tid = gl_LocalInvocationID.x, lane = tid % TPR;
    red[i][tid] = v;
    barrier();
    for (uint s = TPR / 2u; s > 0u; s >>= 1) {
        if (lane < s) red[i][tid] += red[i][tid + s];
        barrier();
    }
    float out_ = red[i][tid - lane];
    barrier();
    return out_;
#endif
}

float dot8(vec4 a, vec4 b, uint xo) { return dot(a, pc.x.v[xo]) + dot(b, pc.x.v[xo + 1u]); }

#if MODE == 3
#include "_topk.comp"
#endif

void main() {
    const uint tid = gl_LocalInvocationID.x, lane = tid % TPR;
    const uint row = gl_WorkGroupID.x * RPW + tid / TPR;
    const bool live = row < pc.rows;
    const uint units = pc.cols / 8u, xs4 = pc.xs / 4u;
    float acc[NV];
    for (uint i = 0u; i < NV; i++) acc[i] = 0.0;
#if MODE == 0 || MODE == 3
    const uint t0 = gl_WorkGroupID.y * NMAX, nt = min(NMAX, pc.n - t0);
    const uint rb = row * (pc.cols / BLK) * BLK_BYTES;
    if (live)
        for (uint u = lane; u < units; u += TPR) {
            vec4 a, b;
            dq8(pc.w, rb, u * 8u, a, b);
            for (uint t = 0u; t < NMAX; t++)
                if (t < nt) acc[t] += dot8(a, b, (t0 + t) * xs4 + u * 2u);
        }
    for (uint t = 0u; t < NMAX; t++) {
        float s = row_reduce(acc[t], t);
        if (live && lane == 0u && t < nt) {
            if ((pc.flags & 1u) != 0u) s += pc.r.v[(t0 + t) * pc.ys + row];
            pc.y.v[(t0 + t) * pc.ys + row] = s;
        }
    }
#elif MODE == 1
    const uint p = gl_WorkGroupID.y, tok = p / pc.k, e = uint(pc.ids.v[p]);
    const uint rb = e * pc.estride + row * (pc.cols / BLK) * BLK_BYTES;
    if (live)
        for (uint u = lane; u < units; u += TPR) {
            vec4 a, b;
            const uint xo = tok * xs4 + u * 2u;
            dq8(pc.w, rb, u * 8u, a, b);
            acc[0] += dot8(a, b, xo);
            dq8(pc.w2, rb, u * 8u, a, b);
            acc[1] += dot8(a, b, xo);
        }
    float g = row_reduce(acc[0], 0u), up = row_reduce(acc[1], 1u);
    if (live && lane == 0u) pc.y.v[p * pc.ys + row] = silu(g) * up;
#else
    const uint tok = gl_WorkGroupID.y;
    const uint rrow = row * (pc.cols / BLK) * BLK_BYTES;
    for (uint j = 0u; j < pc.k; j++) {
        const uint p = tok * pc.k + j, rb = uint(pc.ids.v[p]) * pc.estride + rrow;
        float part = 0.0;
        if (live)
            for (uint u = lane; u < units; u += TPR) {
                vec4 a, b;
                dq8(pc.w, rb, u * 8u, a, b);
                part += dot8(a, b, p * xs4 + u * 2u);
            }
        acc[0] += pc.gw.v[p] * part;
    }
    float s = row_reduce(acc[0], 0u);
    if (live && lane == 0u) {
        if ((pc.flags & 1u) != 0u) s += pc.r.v[tok * pc.ys + row];
        pc.y.v[tok * pc.ys + row] = s;
    }
#endif
#if MODE == 3
    // The last workgroup to finish routes every token (one dispatch for the whole router).
    memoryBarrierBuffer();
    barrier();
    if (tid == 0u) last_group = atomicAdd(pc.counter.v[0], 1u) == gl_NumWorkGroups.x * gl_NumWorkGroups.y - 1u;
    barrier();
    if (last_group) {
        memoryBarrierBuffer();
        for (uint t = 0u; t < pc.n; t++) route_token(t);
        if (tid == 0u) pc.counter.v[0] = 0u;
    }
#endif
}
