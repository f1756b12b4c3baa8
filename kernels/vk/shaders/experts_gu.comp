// The gate+up half of one decode token's expert FFN, Q4_K weights on 16-byte
// aligned rows: h[j][r] = silu(Wg_e x . row r) * (Wu_e x . row r), e = ids[j],
// grid (ceil(n_ff / CH), k), or for n tokens (ceil(n_ff / CH), n k): pair
// p = t k + j of token t (x row t, h row p), each with one token's arithmetic. Like experts_mv.comp's SIDE 0 each thread holds one
// 32-column position of x in registers (as int8 where IDOT, _q4k_pos.comp) and
// walks rows, but a workgroup covers CH rows with RL row lanes of NPOS
// threads (WG = NPOS * RL; CH / RL rows a thread, vk_shapes.c picks them),
// and each thread issues the loads of RU of its rows together: more rows in
// flight per workgroup than experts_mv.comp's gate+up, whose workgroups hold
// one row lane (docs/PERF.md compares the shapes).
// Row sums: a butterfly over each subgroup (NPOS a multiple of SG), then the
// subgroups of a row lane from shared memory; without subgroups, shared memory.
// The workgroup's shape (vk_internal.h vk_gu_shape: the device's, or
// MOEX_VK_GU_*'s) and the subgroup size SG, where subgroups reduce.
#version 450
#include "vk_variants.h"
#define IDOT ((VARIANT & VK_GU_IDOT) != 0)
#include "_common.comp"
#include "_quant.comp"
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 768u;
layout(constant_id = 1) const uint NPOS = 64u;
layout(constant_id = 2) const uint RL = 12u;
layout(constant_id = 3) const uint RU = 2u;
layout(constant_id = 4) const uint CH = 48u;
layout(constant_id = 5) const uint SG = 32u;

layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer UV4 { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer RV4 { vec4 v[]; };
#ifdef USE_SUBGROUP
#extension GL_KHR_shader_subgroup_shuffle : require
#endif

layout(push_constant) uniform PC {
    UV4 wg; UV4 wu; RV4 x; F32 h; I32 ids; U32 unused0; U32 unused1; U32 unused2;   // vk_pc: 8 addresses, then words
    uint nff, d, estride, k;   // estride: bytes per expert; k: experts per token
} pc;

#include "_q4k_pos.comp"

const uint NR = CH / RL;   // rows per thread (each gate and up)
const uint NV = 2u * NR;   // sums per thread

#ifdef USE_SUBGROUP
shared float red[(WG / SG) * NV];
#else
const uint RV = NV < 4u ? NV : 4u;   // sums per round of the shared-memory reduction
shared float red[RV * WG];
shared float sums[2u * CH];
#endif

void gu_load(out PW g[RU], out PW u[RU], uint eb, uint rowb, uint r0, uint pos) {
    for (uint r = 0u; r < RU; r++) {
        const uint rb = eb + min(r0 + RL * r, pc.nff - 1u) * rowb;   // rows past n_ff: the last, dropped
        g[r] = pload(pc.wg, rb, pos);
        u[r] = pload(pc.wu, rb, pos);
    }
}

// h of the workgroup's CH rows from every thread's sums (acc[2i], acc[2i+1]:
// gate and up of row lane rl's row rl + RL i); a workgroup of fewer threads
// than rows writes several.
void write_h(float acc[NV], uint c, uint slot) {
    const uint tid = gl_LocalInvocationID.x;
#ifdef USE_SUBGROUP
    // butterfly: lane l ends with the subgroup's sum of value b N + l % N for each batch b
    const uint lane = gl_SubgroupInvocationID, N = NV < SG ? NV : SG;
    for (uint s = SG / 2u; s >= N && s > 0u; s >>= 1)   // a subgroup wider than the values: plain sums first
        for (uint v = 0u; v < NV; v++) acc[v] += subgroupShuffleXor(acc[v], s);
    for (uint s = N / 2u; s > 0u; s >>= 1) {
        const bool up = (lane & s) != 0u;
        for (uint b = 0u; b < NV / N; b++)
            for (uint v = 0u; v < s; v++) {
                const float lo = acc[b * N + v], hi = acc[b * N + v + s];
                acc[b * N + v] = (up ? hi : lo) + subgroupShuffleXor(up ? lo : hi, s);
            }
    }
    if (lane < N)
        for (uint b = 0u; b < NV / N; b++) red[gl_SubgroupID * NV + b * N + lane] = acc[b * N];
    barrier();
    for (uint i = tid; i < CH && c * CH + i < pc.nff; i += WG) {   // row i: row lane i % RL, sums 2 (i / RL) and + 1
        const uint v = 2u * (i / RL), sg0 = (i % RL) * (NPOS / SG);
        float g = 0.0, u = 0.0;
        for (uint s = 0u; s < NPOS / SG; s++) {
            g += red[(sg0 + s) * NV + v];
            u += red[(sg0 + s) * NV + v + 1u];
        }
        pc.h.v[slot * pc.nff + c * CH + i] = silu(g) * u;
    }
#else
    // RV sums a round: thread (row lane, sum) adds up its row lane's NPOS threads
    for (uint r0 = 0u; r0 < NV; r0 += RV) {
        for (uint v = 0u; v < RV; v++) red[v * WG + tid] = acc[r0 + v];
        barrier();
        if (tid < RL * RV) {
            const uint rl = tid / RV, v = tid % RV;
            float s = 0.0;
            for (uint p = 0u; p < NPOS; p++) s += red[v * WG + rl * NPOS + p];
            sums[2u * (rl + RL * ((r0 + v) >> 1)) + ((r0 + v) & 1u)] = s;
        }
        barrier();
    }
    for (uint i = tid; i < CH && c * CH + i < pc.nff; i += WG) pc.h.v[slot * pc.nff + c * CH + i] = silu(sums[2u * i]) * sums[2u * i + 1u];
#endif
}

void main() {
    const uint tid = gl_LocalInvocationID.x, pos = tid % NPOS, rl = tid / NPOS;
    const uint c = gl_WorkGroupID.x, slot = gl_WorkGroupID.y;
    const uint rowb = (pc.d / Q4_K_ELEMS) * Q4_K_BYTES, eb = uint(pc.ids.v[slot]) * pc.estride, r0 = c * CH + rl;
    const PX px = pxload(pc.x, (slot / pc.k) * (pc.d / 4u), pos);
    float acc[NV];
    for (uint v = 0u; v < NV; v++) acc[v] = 0.0;
    // software pipelined: the next RU rows' loads are in flight while these are used
    PW g[RU], u[RU];
    gu_load(g, u, eb, rowb, r0, pos);
    for (uint i = 0u; i < NR; i += RU) {
        PW ng[RU], nu[RU];
        if (i + RU < NR) gu_load(ng, nu, eb, rowb, r0 + RL * (i + RU), pos);
        for (uint r = 0u; r < RU; r++) {
            acc[2u * (i + r)] += pdot(g[r], px, pos);
            acc[2u * (i + r) + 1u] += pdot(u[r], px, pos);
        }
        if (i + RU < NR)
            for (uint r = 0u; r < RU; r++) {
                g[r] = ng[r];
                u[r] = nu[r];
            }
    }
    write_h(acc, c, slot);
}
