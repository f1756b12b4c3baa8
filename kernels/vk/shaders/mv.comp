// Matrix-vector products for decode and small batches. A workgroup holds
// GROUPS row groups of TPR threads (a subgroup each, where subgroups are
// used); a row group owns NR weight rows, and each of its threads walks them
// one weight unit at a time (_mvunit.comp: whole blocks through wide loads),
// dotting each unit with x in registers and accumulating in f32. One
// reduction per output at the end; no barriers in the loop. Loads of several
// rows (or units) are issued together before their dots: decode is
// latency-bound, so each thread keeps several loads in flight.
// MODE 0: y[t] = W x[t] (+ r[t])             grid (rows/(GROUPS*RPT), ceil(n/NMAX))
// MODE 3: router: MODE 0 into y, then the last workgroup does softmax + top-k.
// NORM (MODE 0 and 3, one token): y = W (rmsnorm(x) * nw). A row's dot
// with rmsnorm(x) * nw is inv_rms * (row . (x * nw)), and every row group
// reads all of x across its lanes, so each thread sums x^2 over the x it
// reads and the group scales its dots after the reduction: no staging, no
// barriers, no extra pass. MODE 3 also writes the normalised row to r (the
// experts' input). Saves the norm's dispatch and barrier. (One token with x
// at most XMAX4 vec4s wide takes the staged modes below instead: every lane
// of a row group reading its own stretch of x from global memory makes the
// loads L1-bound.)
// MODE 0 (and 1), flags & 4 (one token): also the argmax of y (ties: lower
// row) into ids[0]: workgroups loop over row blocks keeping their best output,
// write it to counter[] (zeros on entry, left at zero), and the last one to
// finish reduces them: one epilogue per workgroup, not per row block.
// MODE 1: one token, x staged once per workgroup in shared memory (XMAX4
// vec4s at most; with NORM as rmsnorm(x) * nw, sum(x^2) summed while
// staging), so the loop reads only weights from global memory; workgroups
// loop over row blocks (grid-stride), each step's weight loads issued before
// the previous step's dots (the first before the staging). Flags as MODE 0.
// MODE 2: MODE 1 over up to three matrices of one type and width (q, k, v):
// row blocks of w, then of w1, then of w2; one dispatch, no norm pass.
// MODE 3 with STAGE (one token): the router on MODE 1's staged loop, then
// MODE 3's epilogue (xn written by workgroup 0, the last workgroup routes).
// The staged modes take several tokens as the grid's y (token t: x row t, y
// row t, and in MODE 2 each matrix's row t), each with exactly the arithmetic
// of one token alone: batches of several sequences (the argmax stays one token's).
// TOKENS (mode 1 with NORM): a workgroup takes pc.k tokens (at most
// VK_MV_TPW with f32 x, VK_MV_TPW_I8 with int8; the grid's y counts groups of
// them), stages each one's x in its own stretch of the stage and dots every
// weight unit it loads with all of them, so a batch reads and unpacks each
// row once instead of once per token (the output head of several sequences,
// whose weights do not stay in the cache between tokens). Each token's
// staging, norm, sums and reductions are those of the token alone, in the
// same order.
// IDOT (modes 1 and 2 on Q4_K and Q6_K, vk_idot): x staged as int8 in groups
// of 32 values (_mvunit.comp), each thread rounding 8 of them (4 lanes share a
// group's scale through shuffles; without subgroups a thread rounds a unit's
// 64), and the rows' dots taken as 4-byte integer dot products.
// The device's numbers (vk_pipeline.c): TPR the subgroup size where
// subgroups reduce; GROUPS and NR from the mode (and MOEX_VK_MV_GROUPS,
// MOEX_VK_MV_RPT); WG = TPR * GROUPS.
#version 450
#include "vk_variants.h"
#define MODE (VARIANT & 3)
#if (VARIANT & VK_MV_NORM) != 0
#define NORM 1
#endif
#if (VARIANT & VK_MV_STAGE) != 0
#define STAGE 1
#endif
#define IDOT ((VARIANT & VK_MV_IDOT) != 0)
#define FAST ((VARIANT & VK_MV_GENERIC) == 0)
#if (VARIANT & VK_MV_TOKENS) != 0
#define TOKENS 1
#define TPW (IDOT ? VK_MV_TPW_I8 : VK_MV_TPW)
// XMAX-wide rows of x the stage holds (vk_mv_stage_copies). A macro naming the
// constant, so that _mvunit.comp sizes its stage by it and does not fall back to one row.
layout(constant_id = 4) const uint XCOPIES_SPEC = 1u;
#define XCOPIES XCOPIES_SPEC
uint xtb = 0u;   // the stretch of xsh of the token being staged or dotted (f32 x)
uint xqb = 0u, xgb = 0u;   // of xq and xgs (int8 x)
#define XTB xtb
#define XQB xqb
#define XGB xgb
#else
#define TPW 1u
#endif
#include "_common.comp"
#include "_quant.comp"
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256u;
layout(constant_id = 1) const uint TPR = 32u;
layout(constant_id = 2) const uint GROUPS = 8u;
layout(constant_id = 3) const uint NR = 1u;   // weight rows per row group
#define SG TPR
#define XMAX4 (VK_MV_XMAX / 4)
#if MODE == 1 || MODE == 2 || defined(STAGE)
#define XSTAGE 1
#elif defined(NORM)
vec4 xnorm(uint i);
#define XV(x, i) xnorm(i)
float ssq = 0.0;   // this thread's sum of x^2 over the x it has read
#endif
#include "_mvunit.comp"

layout(push_constant) uniform PC {
#if MODE == 2
    WT w; RV4 nw; RV4 x; CF32 y; WT w1; CF32 y1; WT w2; CF32 y2;
    uint rows, cols, n, xs, ys, flags, k, rows1, rows2, eps_bits;
#else
#ifdef NORM
    WT w; RV4 nw; RV4 x; CF32 y; F32 r; I32 ids; F32 gw; CU32 counter;
#else
    WT w; U32 unused_; RV4 x; CF32 y; F32 r; I32 ids; F32 gw; CU32 counter;
#endif
    uint rows, cols, n, xs, ys, flags, k, estride, n_expert, eps_bits;
#endif
} pc;

const uint NACC = NMAX * NR;

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

#if defined(NORM) && !defined(XSTAGE)
// vec4 i of x * nw (one token: i indexes x and nw alike), counting x^2.
vec4 xnorm(uint i) {
    const vec4 v = pc.x.v[i];
    ssq += dot(v, v);
    return v * pc.nw.v[i];
}
#endif

#if MODE == 0 || MODE == 1
shared float am_v[WG];
shared uint am_i[WG];
// (value, index) max over the workgroup into am_v[0], am_i[0]; ties: lower index.
void am_reduce(float v, uint i) {
    const uint tid = gl_LocalInvocationID.x;
    am_v[tid] = v;
    am_i[tid] = i;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (tid < s && (am_v[tid + s] > am_v[tid] || (am_v[tid + s] == am_v[tid] && am_i[tid + s] < am_i[tid]))) {
            am_v[tid] = am_v[tid + s];
            am_i[tid] = am_i[tid + s];
        }
        barrier();
    }
}
// Argmax epilogue (whole workgroup): this workgroup's best (value, row)
// into counter[1 + 2g ..], then the last workgroup (counter[0]) reduces them.
void argmax_epilogue(float bv, uint bi) {
    const uint tid = gl_LocalInvocationID.x, g = gl_WorkGroupID.x, ng = gl_NumWorkGroups.x;
    am_reduce(bv, bi);
    if (tid == 0u) {
        pc.counter.v[1u + 2u * g] = floatBitsToUint(am_v[0]);
        pc.counter.v[2u + 2u * g] = am_i[0];
        memoryBarrierBuffer();
        last_group = atomicAdd(pc.counter.v[0], 1u) == ng - 1u;
    }
    barrier();
    if (!last_group) return;
    memoryBarrierBuffer();
    bv = -3.4e38;
    bi = 0xffffffffu;
    for (uint j = tid; j < ng; j += WG) {   // increasing j, increasing rows: ties keep the lower
        const float v = uintBitsToFloat(pc.counter.v[1u + 2u * j]);
        const uint i = pc.counter.v[2u + 2u * j];
        if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
    }
    am_reduce(bv, bi);
    for (uint j = tid; j < 2u * ng; j += WG) pc.counter.v[1u + j] = 0u;
    if (tid == 0u) {
        pc.ids.v[0] = int(am_i[0]);
        pc.counter.v[0] = 0u;
    }
}
#endif

#if MODE == 3
#include "_topk.comp"
// The last workgroup to finish routes every token (one dispatch for the whole
// router), a token per subgroup where subgroups route (each token's
// arithmetic that of one token alone); it leaves the counter at zero for the
// next dispatch.
void route_when_last() {
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationID.x == 0u)
        last_group = atomicAdd(pc.counter.v[0], 1u) == gl_NumWorkGroups.x * gl_NumWorkGroups.y - 1u;
    barrier();
    if (!last_group) return;
    memoryBarrierBuffer();
#ifdef USE_SUBGROUP
    for (uint t = gl_SubgroupID; t < pc.n; t += gl_NumSubgroups) route_token(t);
#else
    for (uint t = 0u; t < pc.n; t++) route_token(t);
#endif
    if (gl_LocalInvocationID.x == 0u) pc.counter.v[0] = 0u;
}
#endif

#ifndef XSTAGE
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
    // Row blocks: one per workgroup, or (argmax, flags & 4) a grid-stride loop
    // so that each workgroup pays the argmax epilogue once.
    const bool amx = MODE == 0 && (pc.flags & 4u) != 0u;
    const uint nblk = amx ? (pc.rows + GROUPS * NR - 1u) / (GROUPS * NR) : gl_NumWorkGroups.x;
    float bv = -3.4e38;   // argmax: this thread's best output so far (lane 0 of each row group)
    uint bi = 0xffffffffu;
    for (uint blk = gl_WorkGroupID.x; blk < nblk; blk += gl_NumWorkGroups.x) {
        for (uint i = 0u; i < NACC; i++) acc[i] = 0.0;
#ifdef NORM
        ssq = 0.0;
#endif
        const uint row0 = (blk * GROUPS + grp) * NR, t0 = gl_WorkGroupID.y * NMAX;
        const uint nt = min(NMAX, pc.n - t0);
        uint rb[NR];
        // past the end: read the last row, drop the result
        for (uint r = 0u; r < NR; r++) rb[r] = min(row0 + r, pc.rows - 1u) * row_bytes;
        // Two units per step (each row's unit u and u + TPR), both loaded before either is used.
        if (row0 < pc.rows)
            for (uint u = lane; u < units; u += 2u * TPR) {
                const bool two = u + TPR < units;
                const uint u2 = two ? u + TPR : u;
                WU w[NR], w2[NR];
                for (uint r = 0u; r < NR; r++) {
                    w[r] = wload(pc.w, rb[r], u);
                    if (two) w2[r] = wload(pc.w, rb[r], u2);
                }
                const uint xo = t0 * xs4 + ubase(u) / 4u, xo2 = t0 * xs4 + ubase(u2) / 4u;
                for (uint t = 0u; t < NMAX; t++) {
                    if (t >= nt) break;
                    float a[NR];
                    for (uint r = 0u; r < NR; r++) a[r] = acc[t * NR + r];
                    wdot(pc.x, w, xo + t * xs4, a);
                    if (two) wdot(pc.x, w2, xo2 + t * xs4, a);
                    for (uint r = 0u; r < NR; r++) acc[t * NR + r] = a[r];
                }
            }
#ifdef NORM
        const float inv = 1.0 / sqrt(group_sum(ssq) / float(pc.cols) + uintBitsToFloat(pc.eps_bits));
#if MODE == 3
        if (blk == 0u && grp == 0u)   // row group 0 of the first block writes xn for the experts
            for (uint i = lane; i < pc.cols / 4u; i += TPR) {
                const vec4 v = pc.x.v[i] * inv * pc.nw.v[i];
                pc.r.v[4u * i] = v.x; pc.r.v[4u * i + 1u] = v.y; pc.r.v[4u * i + 2u] = v.z; pc.r.v[4u * i + 3u] = v.w;
            }
#endif
#else
        const float inv = 1.0;
#endif
        for (uint t = 0u; t < NMAX; t++) {
            if (t >= nt) break;   // uniform: every thread reduces the same outputs
            for (uint r = 0u; r < NR; r++) {
                float s = group_sum(acc[t * NR + r]) * inv;
                const uint row = row0 + r, o = (t0 + t) * pc.ys + row;
                if (lane == 0u && row < pc.rows) {
                    if ((pc.flags & 1u) != 0u) s += pc.r.v[o];
                    pc.y.v[o] = s;
                    if (s > bv) { bv = s; bi = row; }   // rows increase: ties keep the lower
                }
            }
        }
    }
#if MODE == 0
    if (amx) argmax_epilogue(bv, bi);
#endif
#endif
#if MODE == 3
    route_when_last();
#endif
}
#endif

#ifdef XSTAGE
// Sum over the whole workgroup (every thread calls it): once per dispatch, the norm's sum(x^2).
float wg_sum(float v) {
#ifdef USE_SUBGROUP
    v = subgroupAdd(v);
    if (gl_SubgroupInvocationID == 0u) red[gl_SubgroupID] = v;
    barrier();
    float s = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; i++) s += red[i];
    barrier();
    return s;
#else
    const uint tid = gl_LocalInvocationID.x;
    red[tid] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        barrier();
    }
    const float out_ = red[0];
    barrier();
    return out_;
#endif
}

// Row block b (GROUPS * NR rows) of the dispatch: its matrix (0..2), its
// first row in that matrix and the matrix's rows.
uvec3 block_of(uint b) {
    const uint rpb = GROUPS * NR;
#if MODE == 2
    const uint nb0 = (pc.rows + rpb - 1u) / rpb, nb1 = (pc.rows1 + rpb - 1u) / rpb;
    if (b >= nb0 + nb1) return uvec3(2u, (b - nb0 - nb1) * rpb, pc.rows2);
    if (b >= nb0) return uvec3(1u, (b - nb0) * rpb, pc.rows1);
#endif
    return uvec3(0u, b * rpb, pc.rows);
}

// Weights of the row group's NR rows (past a matrix's end: its last row) at unit u, when u < units.
void load_rows(uint b, uint grp, uint u, uint units, uint row_bytes, inout WU w[NR]) {
    if (u >= units) return;
    const uvec3 m = block_of(b);
    WT p = pc.w;
#if MODE == 2
    if (m.x == 1u) p = pc.w1;
    else if (m.x == 2u) p = pc.w2;
#endif
    const uint row0 = m.y + grp * NR;
    for (uint r = 0u; r < NR; r++) w[r] = wload(p, min(row0 + r, m.z - 1u) * row_bytes, u);
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
#ifdef USE_SUBGROUP
    const uint lane = gl_SubgroupInvocationID, grp = gl_SubgroupID;
#else
    const uint lane = tid % TPR, grp = tid / TPR;
#endif
    const uint units = pc.cols / UNIT, row_bytes = (pc.cols / BLK) * BLK_BYTES, ng = gl_NumWorkGroups.x;
    const uint nsteps = (units + TPR - 1u) / TPR, rpb = GROUPS * NR;
#ifdef TOKENS
    const uint tok = gl_WorkGroupID.y * pc.k, ntok = min(pc.k, pc.n - tok);   // this workgroup's first token, count
#if IDOT
    const uint xstride = 0u, qstride = xq_stride(pc.cols), gstride = xg_stride(pc.cols);   // one token's stage
#else
    const uint xstride = XSLOT(pc.cols / 4u);   // one token's stretch of xsh
#endif
#else
    const uint tok = gl_WorkGroupID.y, ntok = 1u, xstride = 0u;
#endif
    const uint xb = tok * (pc.xs / 4u);   // the (first) token's x row (vec4s)
#if MODE == 2
    const uint nblk = (pc.rows + rpb - 1u) / rpb + (pc.rows1 + rpb - 1u) / rpb + (pc.rows2 + rpb - 1u) / rpb;
#else
    const uint nblk = (pc.rows + rpb - 1u) / rpb;
    const bool amx = MODE == 1 && (pc.flags & 4u) != 0u;
#endif
    // The first step's weight loads go out before x is staged: their latency overlaps the staging.
    uint b = gl_WorkGroupID.x, s = 0u;
    WU cur[NR], nxt[NR];
    if (b < nblk) load_rows(b, grp, lane, units, row_bytes, cur);
    float ss[TPW];   // each token's sum of x^2 over the x this thread stages
    for (uint t = 0u; t < TPW; t++) ss[t] = 0.0;
#if IDOT
    for (uint t = 0u; t < TPW; t++) {   // each token of the workgroup into its own stage
        if (t >= ntok) break;   // uniform
        const uint xt = xb + t * (pc.xs / 4u);
#ifdef TOKENS
        xqb = t * qstride;
        xgb = t * gstride;
#endif
#ifdef USE_SUBGROUP
        // 8 values a thread, 4 neighbouring lanes a 32-value group (whole groups drop out of the loop together)
        for (uint i = 2u * tid; i < pc.cols / 4u; i += 2u * WG) {
            vec4 v0 = pc.x.v[xt + i], v1 = pc.x.v[xt + i + 1u];
#ifdef NORM
            ss[t] += dot(v0, v0) + dot(v1, v1);
            v0 *= pc.nw.v[i];
            v1 *= pc.nw.v[i + 1u];
#endif
            stage_quarter(i, v0, v1);
        }
#else
        for (uint u = tid; u < pc.cols / 64u; u += WG) {   // a thread per 64-value unit: its two int8 groups
            vec4 v[16];
            for (uint i = 0u; i < 16u; i++) v[i] = pc.x.v[xt + 16u * u + i];
#ifdef NORM
            for (uint i = 0u; i < 16u; i++) {
                ss[t] += dot(v[i], v[i]);
                v[i] *= pc.nw.v[16u * u + i];
            }
#endif
            stage_unit(u, v);
        }
#endif
    }
#else
    for (uint t = 0u; t < TPW; t++) {
        if (t >= ntok) break;   // uniform
        for (uint i = tid; i < pc.cols / 4u; i += WG) {
            vec4 v = pc.x.v[xb + t * (pc.xs / 4u) + i];
#ifdef NORM
            ss[t] += dot(v, v);
            v *= pc.nw.v[i];
#endif
            xsh[t * xstride + XSLOT(i)] = v;
        }
    }
#endif
    float invs[TPW];   // each token's 1 / rms (1: no norm)
    for (uint t = 0u; t < TPW; t++) invs[t] = 1.0;
#ifdef NORM
    for (uint t = 0u; t < TPW; t++) {
        if (t >= ntok) break;   // uniform: wg_sum's barriers
        invs[t] = 1.0 / sqrt(wg_sum(ss[t]) / float(pc.cols) + uintBitsToFloat(pc.eps_bits));
    }
#else
    barrier();
#endif
    const float inv = invs[0];
    float acc[TPW * NR];   // token t's rows at t * NR
    for (uint i = 0u; i < TPW * NR; i++) acc[i] = 0.0;
    float bv = -3.4e38;   // argmax: this thread's best output so far
    uint bi = 0xffffffffu;
    while (b < nblk) {   // uniform over the workgroup: every row group walks the same (block, step)
        uint s2 = s + 1u, b2 = b;
        if (s2 == nsteps) { s2 = 0u; b2 += ng; }
        if (b2 < nblk) load_rows(b2, grp, s2 * TPR + lane, units, row_bytes, nxt);
        const uint u = s * TPR + lane;
        if (u < units)
            for (uint t = 0u; t < TPW; t++) {   // the unit's weights, loaded once, dotted with each token's x
                if (t >= ntok) break;
#ifdef TOKENS
                xtb = t * xstride;
#if IDOT
                xqb = t * qstride;
                xgb = t * gstride;
#endif
#endif
                float a[NR];
                for (uint r = 0u; r < NR; r++) a[r] = acc[t * NR + r];
                wdot(pc.x, cur, ubase(u) / 4u, a);
                for (uint r = 0u; r < NR; r++) acc[t * NR + r] = a[r];
            }
        if (s2 == 0u) {   // the block's last step: reduce and write its rows
            const uvec3 m = block_of(b);
            CF32 y = pc.y;
            uint yb = tok * pc.ys;   // the token's output row
#if MODE == 2
            if (m.x == 1u) { y = pc.y1; yb = tok * pc.rows1; }
            else if (m.x == 2u) { y = pc.y2; yb = tok * pc.rows2; }
#endif
            const uint row0 = m.y + grp * NR;
            for (uint t = 0u; t < TPW; t++) {
                if (t >= ntok) break;   // uniform: group_sum
                for (uint r = 0u; r < NR; r++) {
                    float v = group_sum(acc[t * NR + r]) * invs[t];
                    acc[t * NR + r] = 0.0;
                    const uint row = row0 + r, yo = yb + t * pc.ys + row;   // token tok + t (one token but TOKENS)
                    if (lane == r % TPR && row < m.z) {
#if MODE == 1
                        if ((pc.flags & 1u) != 0u) v += pc.r.v[yo];
                        if (v > bv) { bv = v; bi = row; }   // a lane's rows increase: ties keep the lower
#endif
                        y.v[yo] = v;
                    }
                }
            }
        }
        for (uint r = 0u; r < NR; r++) cur[r] = nxt[r];
        s = s2;
        b = b2;
    }
#if MODE == 1
    if (amx) argmax_epilogue(bv, bi);
#elif MODE == 3
#ifdef NORM
    if (gl_WorkGroupID.x == 0u)   // xn for the experts
        for (uint i = tid; i < pc.cols / 4u; i += WG) {
            const vec4 v = xsh[XSLOT(i)] * inv;
            const uint o = 4u * (xb + i);
            pc.r.v[o] = v.x; pc.r.v[o + 1u] = v.y; pc.r.v[o + 2u] = v.z; pc.r.v[o + 3u] = v.w;
        }
#endif
    route_when_last();   // pc.n: the tokens of the grid's y
#endif
}
#endif
