// The decode expert FFN (SwiGLU) over many experts in one dispatch per half:
// SIDE 0, gate+up: h[p] = silu(Wg_e x[t]) * (Wu_e x[t]) for pair p = t*k + j,
//         e = ids[p]; grid (ceil(n_ff / RT), n*k).
// SIDE 1, down: y[t] = r[t] + sum_j gw[t*k+j] * Wd_e h[t*k+j]; grid (ceil(d / RT), n).
// "Column-stationary": each thread owns a few fixed positions of the input
// (a stretch of PE columns of x, or of one slot's h) held in registers, and
// walks the workgroup's RT rows, so x is read once and never re-read per row.
// Lanes of a subgroup own consecutive positions, so every weight load of a
// subgroup falls in one or two contiguous stretches of a block (coalesced,
// where units per thread would scatter 4-byte loads over many cache lines).
// Loads of RU rows are issued before any of them is used, and the next RU
// rows' loads are in flight while those are (software pipelining). The RT row sums
// are reduced once at the end (subgroup adds, then shared memory, in a fixed
// order: results do not depend on timing). IDOT: Q4_K and Q6_K positions hold
// their input as int8 and take integer dot products (vk_internal.h vk_idot).
// The workgroup's shape (vk_internal.h vk_ex_shape: the device's, or
// MOEX_VK_EX_SHAPE's) and the input positions each thread holds.
#version 450
#include "vk_variants.h"
#define SIDE (VARIANT & VK_EX_DOWN)
#define FAST ((VARIANT & VK_EX_GENERIC) == 0)
#define IDOT ((VARIANT & VK_EX_IDOT) != 0)
#define PREQ ((VARIANT & VK_EX_PREQ) != 0)   // SIDE 1, IDOT: x holds experts_xq.comp's position records
#include "_common.comp"
#include "_quant.comp"
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64u;    // threads
layout(constant_id = 1) const uint RT = 8u;     // output rows
layout(constant_id = 2) const uint RU = 2u;     // rows whose loads are issued together
layout(constant_id = 3) const uint PPT = 1u;    // input positions a thread holds in registers
const uint RP = RU * PPT;                       // weights a thread loads per step

layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer UV4 { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer RV4 { vec4 v[]; };
#if FAST && TYPE == T_Q4_K
#define WT UV4   // 16-byte loads (rows and experts 16-byte aligned)
#else
#define WT U32
#endif
#if PREQ
#define XT UV4   // position records
#else
#define XT RV4
#endif

layout(push_constant) uniform PC {
    WT w; WT w2; XT x; F32 y; F32 r; I32 ids; F32 gw; U32 unused;
    uint rows, cols, n, xs, ys, flags, k, estride;
} pc;

// ---- positions: per type, PE columns of a row and the matching x in registers ----
//   PW pload(p, rb, pos)    the weights of position pos of the row at byte rb
//   PX pxload(x, xo4, pos)  x of that position (xo4: vec4 index of x's row)
//   float pdot(w, x, pos)
#if FAST && TYPE == T_Q4_K
#include "_q4k_pos.comp"
#elif FAST && TYPE == T_Q6_K
#include "_q6k_pos.comp"
#else
// Any type: 8 consecutive elements through dq8() (4-byte alignment is enough).
#define PE 8u
struct PW { vec4 a, b; };
struct PX { vec4 lo, hi; };
PX pxload(RV4 x, uint xo4, uint pos) {
    PX r;
    r.lo = x.v[xo4 + 2u * pos];
    r.hi = x.v[xo4 + 2u * pos + 1u];
    return r;
}
PW pload(U32 p, uint rb, uint pos) {
    PW w;
    dq8(p, rb, 8u * pos, w.a, w.b);
    return w;
}
float pdot(PW w, PX x, uint pos) { return dot(w.a, x.lo) + dot(w.b, x.hi); }
#endif

// ---- the workgroup reduction of NV sums per thread ----
#if SIDE == 0
const uint NV = 2u * RT;   // gate and up of each row
#else
const uint NV = RT;
#endif
shared float red[NV * WG];

// red[v] = sum over the workgroup of acc[v], for v < NV (fixed order).
void reduce(float acc[NV]) {
    const uint tid = gl_LocalInvocationID.x;
#ifdef USE_SUBGROUP
    for (uint v = 0u; v < NV; v++) {
        const float s = subgroupAdd(acc[v]);
        if (subgroupElect()) red[v * WG + gl_SubgroupID] = s;
    }
    barrier();
    if (tid < NV) {
        float s = 0.0;
        for (uint g = 0u; g < gl_NumSubgroups; g++) s += red[tid * WG + g];
        red[tid * WG] = s;
    }
    barrier();
#else
    for (uint v = 0u; v < NV; v++) red[v * WG + tid] = acc[v];
    barrier();
    // WG need not be a power of two: fold what lies above the largest one first.
    const uint p2 = 1u << findMSB(WG);
    if (p2 < WG) {
        if (tid < WG - p2)
            for (uint v = 0u; v < NV; v++) red[v * WG + tid] += red[v * WG + tid + p2];
        barrier();
    }
    for (uint h = p2 / 2u; h > 0u; h >>= 1) {
        if (tid < h)
            for (uint v = 0u; v < NV; v++) red[v * WG + tid] += red[v * WG + tid + h];
        barrier();
    }
#endif
}

#if SIDE == 0
// Gate and up weights of rows r0 .. r0 + RU - 1 of expert eb at this thread's positions.
void gu_load(out PW wg[RP], out PW wu[RP], uint eb, uint r0, uint row_bytes, uint pp[PPT]) {
    for (uint rr = 0u; rr < RU; rr++) {
        const uint rb = eb + min(r0 + rr, pc.rows - 1u) * row_bytes;   // rows past the end: the last one, dropped
        for (uint i = 0u; i < PPT; i++) {
            wg[rr * PPT + i] = pload(pc.w, rb, pp[i]);
            wu[rr * PPT + i] = pload(pc.w2, rb, pp[i]);
        }
    }
}
#else
// Down weights of rows r0 .. r0 + RU - 1 at this thread's positions (each its slot's expert eb).
void dn_load(out PW wd[RP], uint r0, uint row_bytes, uint eb[PPT], uint pp[PPT]) {
    for (uint rr = 0u; rr < RU; rr++) {
        const uint rb = min(r0 + rr, pc.rows - 1u) * row_bytes;   // rows past the end: the last one, dropped
        for (uint i = 0u; i < PPT; i++) wd[rr * PPT + i] = pload(pc.w, eb[i] + rb, pp[i]);
    }
}
#endif

void main() {
    const uint tid = gl_LocalInvocationID.x, row0 = gl_WorkGroupID.x * RT;
    const uint row_bytes = (pc.cols / BLK) * BLK_BYTES, xs4 = pc.xs / 4u, npos = pc.cols / PE;
    float acc[NV];
    for (uint v = 0u; v < NV; v++) acc[v] = 0.0;
#if SIDE == 0
    const uint p = gl_WorkGroupID.y, tok = p / pc.k, eb = uint(pc.ids.v[p]) * pc.estride;
    for (uint c0 = 0u; c0 < npos; c0 += WG * PPT) {
        PX px[PPT];
        uint pp[PPT];
        for (uint i = 0u; i < PPT; i++) {
            pp[i] = min(c0 + tid + i * WG, npos - 1u);
            px[i] = pxload(pc.x, tok * xs4, pp[i]);
        }
        // Software pipelined: the next RU rows' loads are in flight while these are used.
        PW wgt[RP], wup[RP];
        gu_load(wgt, wup, eb, row0, row_bytes, pp);
        for (uint r = 0u; r < RT; r += RU) {
            PW ngt[RP], nup[RP];
            if (r + RU < RT) gu_load(ngt, nup, eb, row0 + r + RU, row_bytes, pp);
            for (uint rr = 0u; rr < RU; rr++)
                for (uint i = 0u; i < PPT; i++)
                    if (c0 + tid + i * WG < npos) {   // clamped repeats count 0
                        acc[2u * (r + rr)] += pdot(wgt[rr * PPT + i], px[i], pp[i]);
                        acc[2u * (r + rr) + 1u] += pdot(wup[rr * PPT + i], px[i], pp[i]);
                    }
            if (r + RU < RT)
                for (uint i = 0u; i < RP; i++) {
                    wgt[i] = ngt[i];
                    wup[i] = nup[i];
                }
        }
    }
    reduce(acc);
    if (tid < RT && row0 + tid < pc.rows)
        pc.y.v[p * pc.ys + row0 + tid] = silu(red[2u * tid * WG]) * red[(2u * tid + 1u) * WG];
#else
    // Positions q < k * npos: slot j = q / npos of token tok, position q % npos of its h row.
    const uint tok = gl_WorkGroupID.y, total = pc.k * npos;
    for (uint c0 = 0u; c0 < total; c0 += WG * PPT) {
        PX px[PPT];
        uint pp[PPT], eb[PPT];
        float g[PPT];
        for (uint i = 0u; i < PPT; i++) {
            const uint q = min(c0 + tid + i * WG, total - 1u), j = q / npos, slot = tok * pc.k + j;
            pp[i] = q - j * npos;
            eb[i] = uint(pc.ids.v[slot]) * pc.estride;
            g[i] = c0 + tid + i * WG < total ? pc.gw.v[slot] : 0.0;   // clamped repeats count 0
#if PREQ
            px[i] = px_get(pc.x, slot * npos + pp[i]);
#else
            px[i] = pxload(pc.x, slot * xs4, pp[i]);
#endif
        }
        PW wd[RP];
        dn_load(wd, row0, row_bytes, eb, pp);
        for (uint r = 0u; r < RT; r += RU) {
            PW nd[RP];
            if (r + RU < RT) dn_load(nd, row0 + r + RU, row_bytes, eb, pp);
            for (uint rr = 0u; rr < RU; rr++)
                for (uint i = 0u; i < PPT; i++) acc[r + rr] += g[i] * pdot(wd[rr * PPT + i], px[i], pp[i]);
            if (r + RU < RT)
                for (uint i = 0u; i < RP; i++) wd[i] = nd[i];
        }
    }
    reduce(acc);
    if (tid < RT && row0 + tid < pc.rows) {
        const uint o = tok * pc.ys + row0 + tid;
        pc.y.v[o] = red[tid * WG] + ((pc.flags & 1u) != 0u ? pc.r.v[o] : 0.0);
    }
#endif
}
