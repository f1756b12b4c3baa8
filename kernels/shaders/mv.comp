// Matrix-vector products for decode and small batches. A workgroup holds
// GROUPS row groups of TPR threads (a subgroup each, where subgroups are
// used); a row group owns NR weight rows, and each of its threads walks them
// one weight unit at a time (_mvunit.comp: whole blocks through wide loads),
// dotting each unit with x in registers and accumulating in f32. One
// reduction per output at the end; no barriers in the loop.
// MODE 0: y[t] = W x[t] (+ r[t])             grid (rows/(GROUPS*RPT), ceil(n/NMAX))
// MODE 1: experts gate+up: y[p] = silu(Wg_e x[p/k]) * (Wu_e x[p/k]),  e = ids[p]; grid (rows/GROUPS, n*k)
// MODE 2: experts down + combine: y[t] = r[t] + sum_j gw[t*k+j] * Wd_e x[t*k+j]; grid (rows/GROUPS, n)
// MODE 3: router: MODE 0 into y, then the last workgroup does softmax + top-k.
layout(local_size_x = WG) in;

#if MODE == 1
#define NR 2   // the gate row and the up row share x
#elif MODE == 2
#define NR 1
#else
#define NR RPT
#endif
#include "_mvunit.comp"

layout(push_constant) uniform PC {
    WT w; WT w2; RV4 x; CF32 y; F32 r; I32 ids; F32 gw; CU32 counter;
    uint rows, cols, n, xs, ys, flags, k, estride, n_expert;
} pc;

#if MODE == 0 || MODE == 3
#define NACC (NMAX * NR)
#else
#define NACC NR
#endif

shared float red[WG];
shared bool last_group;

// Sum over the TPR threads of a row group (every thread of the workgroup calls it).
float group_sum(float v) {
#ifdef USE_SUBGROUP
    return subgroupAdd(v);
#else
    const uint tid = gl_LocalInvocationID.x, lane = tid % TPR;
    red[tid] = v;
    barrier();
    for (uint s = TPR / 2u; s > 0u; s >>= 1) {
        if (lane < s) red[tid] += red[tid + s];
        barrier();
    }
    const float out_ = red[tid - lane];
    barrier();
    return out_;
#endif
}

#if MODE == 3
#include "_topk.comp"
#endif

void main() {
    const uint tid = gl_LocalInvocationID.x;
#ifdef USE_SUBGROUP
    const uint lane = gl_SubgroupInvocationID, grp = gl_SubgroupID;
#else
    const uint lane = tid % TPR, grp = tid / TPR;
#endif
    const uint units = pc.cols / UNIT, xs4 = pc.xs / 4u, row_bytes = (pc.cols / BLK) * BLK_BYTES;
    float acc[NACC];
    for (uint i = 0u; i < NACC; i++) acc[i] = 0.0;
#if MODE == 0 || MODE == 3
    const uint row0 = (gl_WorkGroupID.x * GROUPS + grp) * NR, t0 = gl_WorkGroupID.y * NMAX;
    const uint nt = min(NMAX, pc.n - t0);
    uint rb[NR];
    for (uint r = 0u; r < NR; r++) rb[r] = min(row0 + r, pc.rows - 1u) * row_bytes;   // past the end: read the last row, drop the result
    if (row0 < pc.rows)
        for (uint u = lane; u < units; u += TPR) {
            WU w[NR];
            for (uint r = 0u; r < NR; r++) w[r] = wload(pc.w, rb[r], u);
            const uint xo = t0 * xs4 + ubase(u) / 4u;
            for (uint t = 0u; t < NMAX; t++) {
                if (t >= nt) break;
                float a[NR];
                for (uint r = 0u; r < NR; r++) a[r] = acc[t * NR + r];
                wdot(pc.x, w, xo + t * xs4, a);
                for (uint r = 0u; r < NR; r++) acc[t * NR + r] = a[r];
            }
        }
    for (uint t = 0u; t < NMAX; t++) {
        if (t >= nt) break;   // uniform: every thread reduces the same outputs
        for (uint r = 0u; r < NR; r++) {
            float s = group_sum(acc[t * NR + r]);
            const uint row = row0 + r, o = (t0 + t) * pc.ys + row;
            if (lane == 0u && row < pc.rows) {
                if ((pc.flags & 1u) != 0u) s += pc.r.v[o];
                pc.y.v[o] = s;
            }
        }
    }
#elif MODE == 1
    const uint row = gl_WorkGroupID.x * GROUPS + grp, p = gl_WorkGroupID.y, tok = p / pc.k;
    const uint rb = uint(pc.ids.v[p]) * pc.estride + min(row, pc.rows - 1u) * row_bytes;
    if (row < pc.rows)
        for (uint u = lane; u < units; u += TPR) {
            WU w[2];
            w[0] = wload(pc.w, rb, u);
            w[1] = wload(pc.w2, rb, u);
            wdot(pc.x, w, tok * xs4 + ubase(u) / 4u, acc);
        }
    const float g = group_sum(acc[0]), up = group_sum(acc[1]);
    if (lane == 0u && row < pc.rows) pc.y.v[p * pc.ys + row] = silu(g) * up;
#else
    // The k experts' units of a row form one list, so short rows (down has
    // n_ff columns) still keep every thread busy.
    const uint row = gl_WorkGroupID.x * GROUPS + grp, tok = gl_WorkGroupID.y;
    const uint rrow = min(row, pc.rows - 1u) * row_bytes;
    if (row < pc.rows)
        for (uint i = lane; i < pc.k * units; i += TPR) {
            const uint j = i / units, u = i - j * units, p = tok * pc.k + j;
            WU w[1];
            w[0] = wload(pc.w, uint(pc.ids.v[p]) * pc.estride + rrow, u);
            float part[1];
            part[0] = 0.0;
            wdot(pc.x, w, p * xs4 + ubase(u) / 4u, part);
            acc[0] += pc.gw.v[p] * part[0];
        }
    float s = group_sum(acc[0]);
    if (lane == 0u && row < pc.rows) {
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
