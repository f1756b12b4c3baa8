// Prompt-batch (prefill) attention on cooperative matrices: flash attention,
// causal, GQA. attn.comp's tiled modes with both products on the matrix unit
// (16x16x16 f16 x f16 -> f32). A workgroup of WARPS warps owns BR = 16 * WARPS
// consecutive (token, q head) rows of one KV group, token-major (row
// f = t * group + g), so each K/V tile serves every q head of the group; warp
// w owns rows 16w .. 16w+15. Per tile of BC keys:
//   S = Q K^T       (Q pre-scaled, f16; the warp's 16 x BC scores to shared memory)
//   online softmax  (2 invocations per row; P rounded to f16 into shared memory)
//   O = O * corr + P V   (O in accumulators; rows rescaled through a row map)
// The next tile's K/V loads are issued before this tile's products (register
// prefetch), converted to f16 when stored. Tiles past the block's last query
// are never loaded; keys past each row's position get p = 0. Rows past the
// batch compute on zeros and are not written. grid (row blocks, n_head_kv).
// VARIANT is the head_dim class: HDMAX = 64 << VARIANT (head_dim <= HDMAX,
// padded with zeros); the host picks the tile (NT threads, BC keys) that
// fits the device's shared memory. EMU=1 stands a shared-memory model in for the matrix unit
// (devices without cooperative matrices, lavapipe in CI); Q then keeps its own
// shared region instead of living in registers. Several sequences in one
// batch (VK_ATTN_TOKENS in flags): each workgroup's rows come from the host's
// block table, as in attn.comp.
#version 450
#include "vk_variants.h"
#define HDMAX (64u << VARIANT)
#include "_common.comp"
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : enable
#if !EMU
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint NT = 128u;   // invocations: 32 a warp, 2 per row in the softmax
layout(constant_id = 1) const uint BC = 32u;    // keys per tile
const uint WARPS = NT / 32u;
const uint BR = 16u * WARPS;                    // query rows per workgroup
#define H4 (HDMAX / 4u)
#define LDH (HDMAX + 8u)                        // Q/K/V row stride in halfs: 16-byte aligned, conflict-free fragment loads
const uint LDS = BC + 4u;                       // S row stride in floats
const uint LDP = BC + 8u;                       // P row stride in halfs
#define FD (HDMAX / 16u)                        // fragments along the head dimension
const uint FC = BC / 16u;                       // along the keys
const uint NKV = (BC * H4 + NT - 1u) / NT;      // vec4 of K (and of V) each invocation loads per tile
const uint VOFF = BC * LDH;                     // the V tile after the K tile
#if EMU
const uint QOFF = 2u * BC * LDH;                // Q after the K/V tiles
const uint KVN = (2u * BC + BR) * LDH;
#else
#define QOFF 0u                                 // Q passes through the K/V area into registers before the first tile
const uint KVN = (2u * BC > BR ? 2u * BC : BR) * LDH;
#endif
// Between steps that touch only the warp's own rows (S, P, the row factors):
// a subgroup barrier on the matrix unit (warp = subgroup of 32; cheaper than
// a workgroup barrier); the emulation's lanes are not a subgroup.
#if EMU
#define WARP_SYNC() barrier()
#else
#define WARP_SYNC() subgroupBarrier()
#endif

layout(push_constant) uniform PC {
    F32 q; V4 kc; V4 vc; F32 o; I32 params; I32 blocks; U32 p6; U32 p7;
    uint n_head, n_head_kv, hd, n, scale_bits, flags;
} pc;

shared float16_t KV[KVN];
shared float Ss[BR * LDS];         // scores; the row map at the start and the output staging at the end
shared float16_t Ps[BR * LDP];
shared float scorr[BR];            // per row: the tile's rescale factor, at the end 1 / l

#if EMU
#define UNROLL [[dont_unroll]]     // rolled loops keep the stand-in quick to compile on CPU drivers
// Element e of an accumulator lives at tile index e*32 + lane, column-major in 16 x 16.
struct acc_t { float v[8]; };
#define ACC acc_t
#define ACC_LEN 8
#define ACC_AT(a, e) (a).v[e]
#define ACC_ROW(e) (lane % 16u)
acc_t acc_zero() {
    acc_t z;
    UNROLL for (uint e = 0u; e < 8u; e++) z.v[e] = 0.0;
    return z;
}
// c += Q[qo: 16 x 16 row-major] * K[ko: 16 keys, column-major]
acc_t emu_qk(uint qo, uint ko, acc_t c) {
    const uint lane = gl_LocalInvocationIndex % 32u;
    UNROLL for (uint e = 0u; e < 8u; e++) {
        const uint idx = e * 32u + lane, r = idx % 16u, col = idx / 16u;
        float s = c.v[e];
        UNROLL for (uint q = 0u; q < 16u; q++) s += float(KV[qo + r * LDH + q]) * float(KV[ko + col * LDH + q]);
        c.v[e] = s;
    }
    return c;
}
// c += P[po: 16 x 16 row-major] * V[vo: 16 keys x 16 dims row-major]
acc_t emu_pv(uint po, uint vo, acc_t c) {
    const uint lane = gl_LocalInvocationIndex % 32u;
    UNROLL for (uint e = 0u; e < 8u; e++) {
        const uint idx = e * 32u + lane, r = idx % 16u, col = idx / 16u;
        float s = c.v[e];
        UNROLL for (uint q = 0u; q < 16u; q++) s += float(Ps[po + r * LDP + q]) * float(KV[vo + q * LDH + col]);
        c.v[e] = s;
    }
    return c;
}
void emu_store(acc_t c, uint base) {
    const uint lane = gl_LocalInvocationIndex % 32u;
    UNROLL for (uint e = 0u; e < 8u; e++) {
        const uint idx = e * 32u + lane;
        Ss[base + (idx % 16u) * LDS + idx / 16u] = c.v[e];
    }
}
#define STORE_S(c, base) emu_store(c, base)
#else
#define UNROLL [[unroll]]          // accumulators are registers only once their indices are constants
#define ACC fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define FRAG fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define ACC_LEN rowm.length()
#define ACC_AT(a, e) (a)[e]
#define ACC_ROW(e) uint(rowm[e])
ACC acc_zero() { return ACC(0.0); }
#define STORE_S(c, base) coopMatStoreNV(c, Ss, base, LDS, false)
#endif

void main() {
    const uint tid = gl_LocalInvocationIndex, warp = tid / 32u, lane = tid % 32u, kvh = gl_WorkGroupID.y;
    const uint hd = pc.hd, hd4 = hd / 4u, n_head = pc.n_head, group = n_head / pc.n_head_kv, kvd = pc.n_head_kv * hd;
    // The block: rows f0 .. f0 + BR - 1 of a run (t0: its first token), the last row blocks (most keys) first,
    // so the short ones fill the tail; or the host's block (several sequences, ordered the same way).
    uint t0 = 0u, n_run = pc.n, pos0, base = 0u, f0 = (gl_NumWorkGroups.x - 1u - gl_WorkGroupID.x) * BR;
    if ((pc.flags & VK_ATTN_TOKENS) != 0u) {
        t0 = uint(pc.blocks.v[4u * gl_WorkGroupID.x]);
        n_run = uint(pc.blocks.v[4u * gl_WorkGroupID.x + 1u]);
        f0 = uint(pc.blocks.v[4u * gl_WorkGroupID.x + 2u]);
        pos0 = uint(pc.params.v[2u * t0]);
        base = uint(pc.params.v[2u * t0 + 1u]);
    } else {
        pos0 = uint(pc.params.v[0]);
    }
    const uint rows = n_run * group;
    const float scale = uintBitsToFloat(pc.scale_bits);
    const uint kend = pos0 + (min(f0 + BR, rows) - 1u) / group + 1u;   // keys 0 .. the block's last query position

    // Q rows, pre-scaled, f16 (clamped: an inf would poison the row); rows past the batch and dims past hd are zero.
    for (uint e = tid; e < BR * H4; e += NT) {
        const uint r = e / H4, c = e % H4, f = f0 + r;
        vec4 x = vec4(0.0);
        if (f < rows && c < hd4) {
            const uint qo = ((t0 + f / group) * n_head + kvh * group + f % group) * hd + 4u * c;
            x = vec4(pc.q.v[qo], pc.q.v[qo + 1u], pc.q.v[qo + 2u], pc.q.v[qo + 3u]) * scale;
        }
        const f16vec4 h = f16vec4(clamp(x, vec4(-65504.0), vec4(65504.0)));
        UNROLL for (uint j = 0u; j < 4u; j++) KV[QOFF + r * LDH + 4u * c + j] = h[j];
    }
#if !EMU
    // The row of each accumulator element (the layout is the implementation's):
    // a 16 x 16 matrix whose entries are their row indices, loaded as an accumulator.
    for (uint i = tid; i < 256u; i += NT) Ss[i] = float(i / 16u);
#endif
    barrier();
#if !EMU
    ACC rowm;
    coopMatLoadNV(rowm, Ss, 0u, 16u, false);
    FRAG qf[FD];
    UNROLL for (uint d = 0u; d < FD; d++) coopMatLoadNV(qf[d], KV, QOFF + warp * 16u * LDH + d * 16u, LDH, false);
#endif
    ACC o[FD];
    UNROLL for (uint d = 0u; d < FD; d++) o[d] = acc_zero();

    // Softmax state of row sr (two invocations per row, each half the keys; both keep m, each its own part of l).
    const uint sr = tid / 2u, half_ = tid % 2u, f = f0 + sr;
    const uint my_last = min(pos0 + f / group, kend - 1u);   // this row's last key
    float m = NEG_BIG, l = 0.0;

    vec4 kreg[NKV], vreg[NKV];
    for (uint k0 = 0u; k0 < kend; k0 += BC) {
        // Loads of this tile (the first) or the next (below, before the products).
        if (k0 == 0u) {
            const uint nk = min(BC, kend);
            UNROLL for (uint i = 0u; i < NKV; i++) {
                const uint e = tid + NT * i, k = e / H4, c = e % H4;
                const bool ok = e < BC * H4 && k < nk && c < hd4;
                const uint g = ok ? ((base + k) * kvd + kvh * hd) / 4u + c : 0u;
                kreg[i] = ok ? pc.kc.v[g] : vec4(0.0);
                vreg[i] = ok ? pc.vc.v[g] : vec4(0.0);
            }
        }
        barrier();   // the previous tile's products are done with K, V and P (and Q has left the K/V area)
        UNROLL for (uint i = 0u; i < NKV; i++) {
            const uint e = tid + NT * i, k = e / H4, c = e % H4;
            if (e < BC * H4) {
                const f16vec4 kh = f16vec4(clamp(kreg[i], vec4(-65504.0), vec4(65504.0)));
                const f16vec4 vh = f16vec4(clamp(vreg[i], vec4(-65504.0), vec4(65504.0)));
                UNROLL for (uint j = 0u; j < 4u; j++) {
                    KV[k * LDH + 4u * c + j] = kh[j];
                    KV[VOFF + k * LDH + 4u * c + j] = vh[j];
                }
            }
        }
        barrier();
        const uint k1 = k0 + BC;
        if (k1 < kend) {
            const uint nk = min(BC, kend - k1);
            UNROLL for (uint i = 0u; i < NKV; i++) {
                const uint e = tid + NT * i, k = e / H4, c = e % H4;
                const bool ok = e < BC * H4 && k < nk && c < hd4;
                const uint g = ok ? ((base + k1 + k) * kvd + kvh * hd) / 4u + c : 0u;
                kreg[i] = ok ? pc.kc.v[g] : vec4(0.0);
                vreg[i] = ok ? pc.vc.v[g] : vec4(0.0);
            }
        }
        // S = Q K^T for the warp's 16 rows; the FC accumulators' chains interleave.
        ACC s[FC];
        UNROLL for (uint j = 0u; j < FC; j++) s[j] = acc_zero();
        UNROLL for (uint d = 0u; d < FD; d++)
            UNROLL for (uint j = 0u; j < FC; j++) {
#if EMU
                s[j] = emu_qk(QOFF + warp * 16u * LDH + d * 16u, j * 16u * LDH + d * 16u, s[j]);
#else
                FRAG kb;
                coopMatLoadNV(kb, KV, j * 16u * LDH + d * 16u, LDH, true);
                s[j] = coopMatMulAddNV(qf[d], kb, s[j]);
#endif
            }
        UNROLL for (uint j = 0u; j < FC; j++) STORE_S(s[j], warp * 16u * LDS + j * 16u);
        WARP_SYNC();
        // Online softmax: the max over the whole row (both halves read it), p for this half's keys.
        // Fixed trip counts with the mask as a select: the loads issue together.
        {
            const uint so = sr * LDS, po = sr * LDP;
            float mx = m;
            UNROLL for (uint k = 0u; k < BC; k++) {
                const float v = Ss[so + k];
                mx = k0 + k <= my_last ? max(mx, v) : mx;
            }
            float sum = 0.0;
            UNROLL for (uint i = 0u; i < BC / 2u; i++) {
                const uint k = 2u * i + half_;
                const float16_t p = float16_t(k0 + k <= my_last ? exp(Ss[so + k] - mx) : 0.0);
                Ps[po + k] = p;
                sum += float(p);   // l sums the rounded p that P V multiplies
            }
            const float corr = exp(m - mx);
            l = l * corr + sum;
            m = mx;
            if (half_ == 0u) scorr[sr] = corr;
        }
        WARP_SYNC();
        // O = O * corr + P V (each element's factor read once for all FD accumulators)
        UNROLL for (int e = 0; e < ACC_LEN; e++) {
            const float cr = scorr[warp * 16u + ACC_ROW(e)];
            UNROLL for (uint d = 0u; d < FD; d++) ACC_AT(o[d], e) *= cr;
        }
#if !EMU
        FRAG pa[FC];
        UNROLL for (uint j = 0u; j < FC; j++) coopMatLoadNV(pa[j], Ps, warp * 16u * LDP + j * 16u, LDP, false);
#endif
        UNROLL for (uint d = 0u; d < FD; d++)
            UNROLL for (uint j = 0u; j < FC; j++) {
#if EMU
                o[d] = emu_pv(warp * 16u * LDP + j * 16u, VOFF + j * 16u * LDH + d * 16u, o[d]);
#else
                FRAG vb;
                coopMatLoadNV(vb, KV, VOFF + j * 16u * LDH + d * 16u, LDH, false);
                o[d] = coopMatMulAddNV(pa[j], vb, o[d]);
#endif
            }
    }
    // O / l (l: the sum of both halves' parts), then through the warp's S rows to the output, BC columns at a time.
    barrier();   // the last tile's rescale is done with scorr
    if (half_ == 1u) scorr[sr] = l;
    barrier();
    if (half_ == 0u) scorr[sr] = 1.0 / (l + scorr[sr]);
    barrier();
    UNROLL for (int e = 0; e < ACC_LEN; e++) {
        const float il = scorr[warp * 16u + ACC_ROW(e)];
        UNROLL for (uint d = 0u; d < FD; d++) ACC_AT(o[d], e) *= il;
    }
    UNROLL for (uint d0 = 0u; d0 < FD; d0 += FC) {
        barrier();   // the previous chunk's writes are done with Ss
        UNROLL for (uint j = 0u; j < FC; j++) STORE_S(o[d0 + j], warp * 16u * LDS + j * 16u);
        barrier();
        for (uint i = lane; i < 16u * BC; i += 32u) {
            const uint r = i / BC, col = i % BC, fr = f0 + warp * 16u + r, dim = d0 * 16u + col;
            if (fr < rows && dim < hd)
                pc.o.v[((t0 + fr / group) * n_head + kvh * group + fr % group) * hd + dim] = Ss[(warp * 16u + r) * LDS + col];
        }
    }
}
