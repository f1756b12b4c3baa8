// Prompt-batch products on cooperative matrices (tensor cores): mm.comp's
// push constants and MODEs with a BM x BN tile (weight rows x tokens) per
// workgroup of 4 warps of 32 invocations, BK columns per step.
// MODE 0: y[t] = W x[t] (+ r[t])                                grid (rows/BM, n/BN)
// MODE 1: experts gate+up over the pair list of expert z (moe_sort):
//         y[p] = silu(Wg_z x[p/k]) * (Wu_z x[p/k])              grid (rows/BM, n/BN, n_expert)
// MODE 2: experts down: y[p] = gw[p] * Wd_z x[p]                grid as MODE 1
// Each step: the next step's raw weight bytes and activations are loaded into
// registers, the current step's tiles (f16 in shared memory) go through the
// matrix unit, then the registers are dequantized / converted into the other
// shared buffer (NBUF 2: one barrier per step) or into the same one after a
// second barrier (NBUF 1: half the shared memory, more workgroups per SM).
// A weight unit is 16 consecutive elements of one row: Q4_K and Q6_K read
// whole 16-byte runs of their blocks (FASTQ), other types go through dq8().
// Shared tiles are uvec4 arrays (8 halfs each) so every store is 16 bytes.
// Warp w owns tile rows w*WR .. w*WR+WR-1 and all BN columns: FM x FN
// accumulators of CM x CN; fragments past an expert's last pair are skipped.
// EMU=1 (a variant of its own) stands a shared-memory model in for the matrix unit (same loads, layouts and
// epilogue), so devices without cooperative matrices (lavapipe in CI) test
// the rest of the kernel.
#version 450
#include "vk_variants.h"
#define MODE (VARIANT & 3)
#define FASTQ ((VARIANT & VK_COOP_GENERIC) == 0)
#include "_common.comp"
#include "_quant.comp"
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : enable
#if !EMU
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#endif

// The tile (vk_pipeline.c: BM from VK_COOP_BM or MOEX_VK_COOP_BM, BN 32
// for VK_COOP_NARROW, BK from VK_COOP_BK or MOEX_VK_COOP_BK), the matrix
// unit's shape and the shared buffers (NBUF, from MOEX_VK_COOP_NBUF where
// the device's shared memory holds two).
layout(constant_id = 0) const uint BM = 64u;
layout(constant_id = 1) const uint BN = 64u;
layout(constant_id = 2) const uint BK = 64u;
#if EMU
const uint CM = 16u, CN = 16u, CK = 16u;   // the stand-in's shape (vk_device.c read_coop)
#else
layout(constant_id = 3) const uint CM = 16u;
layout(constant_id = 4) const uint CN = 16u;
layout(constant_id = 5) const uint CK = 16u;
#endif
layout(constant_id = 6) const uint NBUF = 1u;
#define WARPS 4u
const uint WR = BM / WARPS;           // tile rows per warp
const uint FM = WR / CM;              // accumulators along the rows
const uint FN = BN / CN;              // along the tokens
const uint NACC = FM * FN;
const uint LDV = BK / 8u + 1u;        // shared row stride in uvec4: one of padding keeps fragment loads conflict-free
const uint NE = CM * CN / 32u;        // accumulator elements per invocation in the epilogue
const uint UPR = BK / 16u;            // weight units per tile row
const uint NU = BM * UPR / 128u;      // weight units each invocation loads per step
const uint XPR = BK / 8u;             // 8-activation pieces per token per step
const uint NX = BN * XPR / 128u;      // pieces each invocation converts per step
const uint TPP = 128u / XPR;          // tokens per pass of the workgroup over the pieces
const uint WTILE = BM * LDV;          // one buffer of a weight tile, in uvec4
const uint XTILE = BN * LDV;
layout(local_size_x = 128) in;

layout(push_constant) uniform PC {
    U32 w; U32 w2; V4 x; F32 y; F32 r; I32 meta; F32 gw; U32 unused_;
    uint rows, cols, n, xs, ys, flags, k, estride, n_expert;
} pc;

shared uvec4 Ws[NBUF * WTILE];
#if MODE == 1
shared uvec4 Us[NBUF * WTILE];
#endif
shared uvec4 Xs[NBUF * XTILE];
shared float Cs[WARPS * CM * CN];   // each warp's accumulator staging for the epilogue
shared int orow[BN];                // output row (token or pair) of each tile column, -1 past the end

#if EMU
#define UNROLL [[dont_unroll]]   // rolled loops keep the stand-in quick to compile on CPU drivers
// Element e of an accumulator lives at tile index e*32 + lane, column-major in CM x CN.
struct acc_t { float v[NE]; };
#define ACC acc_t
#define FRAG_A uint
#define FRAG_B uint
#define ACC_LEN int(NE)
#define ACC_AT(a, e) (a).v[e]
#define LOAD_A(f, arr, off) f = (off) * 8u
#define LOAD_B(f, off) f = (off) * 8u
#define MMA_W(c, a, b) c = emu_mma(false, a, b, c)
#define MMA_U(c, a, b) c = emu_mma(true, a, b, c)
#define HALF(arr, i) unpackHalf2x16(arr[(i) >> 3][((i) >> 1) & 3u])[(i) & 1u]
acc_t acc_zero() {
    acc_t z;
    UNROLL for (uint e = 0u; e < NE; e++) z.v[e] = 0.0;
    return z;
}
// A: CM x CK row-major at half ao (row stride 8*LDV) of Ws or Us; B: CK x CN column-major at half bo of Xs.
acc_t emu_mma(bool u, uint ao, uint bo, acc_t c) {
    const uint lane = gl_LocalInvocationIndex % 32u;
    UNROLL for (uint e = 0u; e < NE; e++) {
        const uint idx = e * 32u + lane, r = idx % CM, col = idx / CM;
        float s = c.v[e];
        UNROLL for (uint q = 0u; q < CK; q++) {
            const uint ai = ao + r * 8u * LDV + q;
#if MODE == 1
            const float a = u ? HALF(Us, ai) : HALF(Ws, ai);
#else
            const float a = HALF(Ws, ai);
#endif
            s += a * HALF(Xs, bo + col * 8u * LDV + q);
        }
        c.v[e] = s;
    }
    return c;
}
void store_c(acc_t c, uint base) {
    const uint lane = gl_LocalInvocationIndex % 32u;
    UNROLL for (uint e = 0u; e < NE; e++) Cs[base + e * 32u + lane] = c.v[e];
}
#define STORE_C(c, base) store_c(c, base)
#else
#define UNROLL [[unroll]]   // accumulators are registers only once their indices are constants
#define ACC fcoopmatNV<32, gl_ScopeSubgroup, CM, CN>
#define FRAG_A fcoopmatNV<16, gl_ScopeSubgroup, CM, CK>
#define FRAG_B fcoopmatNV<16, gl_ScopeSubgroup, CK, CN>
#define ACC_LEN acc[0].length()
#define ACC_AT(a, e) (a)[e]
// offsets and strides in uvec4 of the shared arrays; the matrix unit reads their bytes as halfs
#define LOAD_A(f, arr, off) coopMatLoadNV(f, arr, off, LDV, false)
#define LOAD_B(f, off) coopMatLoadNV(f, Xs, off, LDV, true)
#define MMA_W(c, a, b) c = coopMatMulAddNV(a, b, c)
#define MMA_U(c, a, b) c = coopMatMulAddNV(a, b, c)
ACC acc_zero() { return ACC(0.0); }
#define STORE_C(c, base) coopMatStoreNV(c, Cs, base, CM, true)
#endif

// ---- Weight units: fetch() loads a unit's raw bytes (no arithmetic on them,
// so the loads stay in flight across the matrix products), put() turns them
// into 16 halfs. Layouts as common/types.h (views in _quant.comp / _mvunit.comp).

// field(), bytes4() and funnel(): _quant.comp.
uvec2 pack4(vec4 v) { return uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw)); }

#if FASTQ && TYPE == T_Q4_K
// 144-byte blocks, 16-byte aligned (the host checks): d, dmin, scales[12], qs[128].
// Elements 64g + 32hi + l of a block: nibble hi of qs[32g + l], sub-block 2g + hi.
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer QV4 { uvec4 v[]; };
struct WRaw { uvec4 h, q; };   // the block's first 16 bytes, the unit's 16 bytes of qs
WRaw wzero() { return WRaw(uvec4(0u), uvec4(0u)); }
WRaw fetch_w(U32 p, uint rb, uint e) {
    const uint bi = (rb >> 4) + (e >> 8) * 9u, w = e & 255u;
    QV4 q = QV4(p);
    return WRaw(q.v[bi], q.v[bi + 1u + 2u * (w >> 6) + ((w >> 4) & 1u)]);
}
void put_w(WRaw r, uint e, out uvec4 lo, out uvec4 hi) {
    const uint w = e & 255u, hb = (w >> 5) & 1u, j = 2u * (w >> 6) + hb, s = 4u * hb;
    uint sc, m;   // ggml's get_scale_min_k4(j)
    if (j < 4u) {
        sc = (r.h.y >> (8u * j)) & 63u;
        m = (r.h.z >> (8u * j)) & 63u;
    } else {
        const uint b = 8u * (j - 4u);
        sc = ((r.h.w >> b) & 15u) | (((r.h.y >> (b + 6u)) & 3u) << 4);
        m = ((r.h.w >> (b + 4u)) & 15u) | (((r.h.z >> (b + 6u)) & 3u) << 4);
    }
    const vec2 dm = unpackHalf2x16(r.h.x);
    const float d = dm.x * float(sc), mn = dm.y * float(m);
    uvec2 o[4];
    UNROLL for (uint i = 0u; i < 4u; i++) {
        const uint q = r.q[i], q2 = q >> 16;
        const vec4 v = vec4(field(q, 15u, s, 0.0), field(q, 15u, s + 8u, 0.0), field(q2, 15u, s, 0.0), field(q2, 15u, s + 8u, 0.0));
        o[i] = pack4(d * v - mn);
    }
    lo = uvec4(o[0], o[1]);
    hi = uvec4(o[2], o[3]);
}

#elif FASTQ && TYPE == T_Q6_K
// 210-byte blocks, 2-byte aligned: ql[128], qh[64], scales[16] (int8), d. Element
// 128hf + 32run + l: low 4 bits from nibble run/2 of ql[64hf + 32(run&1) + l],
// high 2 from bits 2run of qh[32hf + l], scale scales[8hf + l/16 + 2run].
// The unit's 16 ql and 16 qh bytes come as 5 words each, funnel-shifted in put_w.
struct WRaw { uint a[5], h[5], sw, dw; };
WRaw wzero() { return WRaw(uint[5](0u, 0u, 0u, 0u, 0u), uint[5](0u, 0u, 0u, 0u, 0u), 0u, 0u); }
WRaw fetch_w(U32 p, uint rb, uint e) {
    const uint bo = rb + (e >> 8) * Q6_K_BYTES, w = e & 255u, hf = w >> 7, run = (w >> 5) & 3u, l0 = w & 16u;
    const uint ia = (bo + Q6_K_QL + 64u * hf + 32u * (run & 1u) + l0) >> 2, ih = (bo + Q6_K_QH + 32u * hf + l0) >> 2;
    WRaw r;
    UNROLL for (uint i = 0u; i < 5u; i++) {   // the 5th word may reach 2 bytes past the run, inside the block
        r.a[i] = p.v[ia + i];
        r.h[i] = p.v[ih + i];
    }
    r.sw = p.v[(bo + Q6_K_SCALES + 8u * hf + (l0 >> 4) + 2u * run) >> 2];
    r.dw = p.v[(bo + Q6_K_D) >> 2];
    return r;
}
void put_w(WRaw r, uint rb, uint e, out uvec4 lo, out uvec4 hi) {
    const uint bo = rb + (e >> 8) * Q6_K_BYTES, w = e & 255u, hf = w >> 7, run = (w >> 5) & 3u, l0 = w & 16u;
    const uint sh = (bo & 2u) * 8u, ns = 4u * (run >> 1), hs = 2u * run;   // the runs share bo's alignment
    const uint so = bo + Q6_K_SCALES + 8u * hf + (l0 >> 4) + 2u * run;
    const float d = unpackHalf2x16(r.dw >> sh).x * float(bitfieldExtract(int(r.sw >> ((so & 3u) * 8u)), 0, 8));
    uvec2 o[4];
    UNROLL for (uint i = 0u; i < 4u; i++) {
        const uint a = funnel(r.a[i], r.a[i + 1u], sh), h = funnel(r.h[i], r.h[i + 1u], sh);
        const uint q = ((a >> ns) & 0x0f0f0f0fu) | (((h >> hs) & 0x03030303u) << 4);
        o[i] = pack4(d * bytes4(q, 63u, 32.0));
    }
    lo = uvec4(o[0], o[1]);
    hi = uvec4(o[2], o[3]);
}
#define PUT_RB 1   // put_w needs the row's byte offset (the block alignment)

#else
// Any type: dq8() twice, converted at once (the generic path waits for its loads).
struct WRaw { uvec4 lo, hi; };
WRaw wzero() { return WRaw(uvec4(0u), uvec4(0u)); }
WRaw fetch_w(U32 p, uint rb, uint e) {
    vec4 a, b, c, d;
    dq8(p, rb, e, a, b);
    dq8(p, rb, e + 8u, c, d);
    return WRaw(uvec4(pack4(a), pack4(b)), uvec4(pack4(c), pack4(d)));
}
void put_w(WRaw r, uint e, out uvec4 lo, out uvec4 hi) {
    lo = r.lo;
    hi = r.hi;
}
#endif

#ifdef PUT_RB
#define PUT_W(r, rb, e, lo, hi) put_w(r, rb, e, lo, hi)
#else
#define PUT_W(r, rb, e, lo, hi) put_w(r, e, lo, hi)
#endif

// Registers between a step's global loads and its shared-memory stores.
WRaw wreg[NU];
#if MODE == 1
WRaw ureg[NU];
#endif
vec4 xreg[2u * NX];

// Unit i of this invocation: tile row tid / UPR + (128 / UPR) i, columns 16 (tid % UPR) .. + 15 of the step.
uint unit_row(uint i) { return gl_LocalInvocationIndex / UPR + (128u / UPR) * i; }

void fetch(uint k0, uint estart, uint rowbytes, int xr[NX]) {
    const uint e = k0 + 16u * (gl_LocalInvocationIndex % UPR);
    UNROLL for (uint i = 0u; i < NU; i++) {
        const uint row = gl_WorkGroupID.x * BM + unit_row(i);
        const bool live = row < pc.rows && e < pc.cols;
        const uint rb = estart + row * rowbytes;
        wreg[i] = wzero();   // an if, not ?:, so no load is issued for a row past the end
#if MODE == 1
        ureg[i] = wzero();
#endif
        if (live) {
            wreg[i] = fetch_w(pc.w, rb, e);
#if MODE == 1
            ureg[i] = fetch_w(pc.w2, rb, e);
#endif
        }
    }
    // (clamped to f16's range in stash: an activation beyond it would become inf and poison the whole output row)
    const uint c = k0 + 8u * (gl_LocalInvocationIndex % XPR);
    UNROLL for (uint i = 0u; i < NX; i++) {
        const bool live = xr[i] >= 0 && c < pc.cols;
        const uint o = live ? (uint(xr[i]) * pc.xs + c) / 4u : 0u;
        xreg[2u * i] = live ? pc.x.v[o] : vec4(0.0);
        xreg[2u * i + 1u] = live ? pc.x.v[o + 1u] : vec4(0.0);
    }
}

void stash(uint k0, uint buf, uint estart, uint rowbytes) {
    const uint cu = gl_LocalInvocationIndex % UPR, e = k0 + 16u * cu;
    UNROLL for (uint i = 0u; i < NU; i++) {
        const uint lr = unit_row(i), o = buf * WTILE + lr * LDV + 2u * cu;
        const uint rb = estart + (gl_WorkGroupID.x * BM + lr) * rowbytes;
        uvec4 lo, hi;
        PUT_W(wreg[i], rb, e, lo, hi);
        Ws[o] = lo;
        Ws[o + 1u] = hi;
#if MODE == 1
        PUT_W(ureg[i], rb, e, lo, hi);
        Us[o] = lo;
        Us[o + 1u] = hi;
#endif
    }
    const uint c8 = gl_LocalInvocationIndex % XPR;
    UNROLL for (uint i = 0u; i < NX; i++) {
        const uint t = gl_LocalInvocationIndex / XPR + TPP * i;
        const vec4 a = clamp(xreg[2u * i], vec4(-65504.0), vec4(65504.0));
        const vec4 b = clamp(xreg[2u * i + 1u], vec4(-65504.0), vec4(65504.0));
        Xs[buf * XTILE + t * LDV + c8] = uvec4(pack4(a), pack4(b));
    }
}

void main() {
    const uint tid = gl_LocalInvocationIndex, warp = tid / 32u, lane = tid % 32u;
    const uint row0 = gl_WorkGroupID.x * BM, col0 = gl_WorkGroupID.y * BN;
#if MODE == 0
    const uint estart = 0u;
    const uint cnt = pc.n;
#else
    const uint e = gl_WorkGroupID.z;
    const uint cnt = uint(pc.meta.v[e]), lbase = uint(pc.meta.v[pc.n_expert + e]);
    const uint estart = e * pc.estride;
#endif
    if (col0 >= cnt) return;   // uniform: this expert has fewer pairs
    if (tid < BN) {
        const uint i = col0 + tid;
        int orr = -1;
        if (i < cnt) {
#if MODE == 0
            orr = int(i);
#else
            orr = pc.meta.v[2u * pc.n_expert + lbase + i];
#endif
        }
        orow[tid] = orr;
    }
    barrier();
    int xr[NX];   // activation row of each token this invocation converts, -1 past the end
    UNROLL for (uint i = 0u; i < NX; i++) {
        const int orr = orow[tid / XPR + TPP * i];
        xr[i] = MODE == 1 && orr >= 0 ? orr / int(pc.k) : orr;
    }
    const uint nf = min(FN, (cnt - col0 + CN - 1u) / CN);   // accumulators with a live token
    const uint rowbytes = (pc.cols / BLK) * BLK_BYTES, steps = (pc.cols + BK - 1u) / BK;
    ACC acc[NACC];
#if MODE == 1
    ACC accu[NACC];
#endif
    UNROLL for (uint i = 0u; i < NACC; i++) {
        acc[i] = acc_zero();
#if MODE == 1
        accu[i] = acc_zero();
#endif
    }
    fetch(0u, estart, rowbytes, xr);
    stash(0u, 0u, estart, rowbytes);
    barrier();
    for (uint s = 0u; s < steps; s++) {
        const uint cur = s % NBUF, k1 = (s + 1u) * BK;
        if (s + 1u < steps) fetch(k1, estart, rowbytes, xr);
        UNROLL for (uint kk = 0u; kk < BK / 8u; kk += CK / 8u) {
            FRAG_A a[FM];
#if MODE == 1
            FRAG_A au[FM];
#endif
            UNROLL for (uint i = 0u; i < FM; i++) {
                LOAD_A(a[i], Ws, cur * WTILE + (warp * WR + i * CM) * LDV + kk);
#if MODE == 1
                LOAD_A(au[i], Us, cur * WTILE + (warp * WR + i * CM) * LDV + kk);
#endif
            }
            UNROLL for (uint j = 0u; j < FN; j++) {
                if (j < nf) {   // uniform
                    FRAG_B b;
                    LOAD_B(b, cur * XTILE + j * CN * LDV + kk);
                    UNROLL for (uint i = 0u; i < FM; i++) {
                        MMA_W(acc[i * FN + j], a[i], b);
#if MODE == 1
                        MMA_U(accu[i * FN + j], au[i], b);
#endif
                    }
                }
            }
        }
        if (NBUF == 1u) barrier();   // every warp is done with the tiles before they are overwritten
        if (s + 1u < steps) stash(k1, (s + 1u) % NBUF, estart, rowbytes);
        barrier();
    }
    // Epilogue: each accumulator through the warp's staging area, then bounds,
    // residual / silu / gate weight and the scatter to the output row.
    const uint sbase = warp * CM * CN;
    UNROLL for (uint i = 0u; i < FM; i++)
        UNROLL for (uint j = 0u; j < FN; j++) {
#if MODE == 1
            UNROLL for (int q = 0; q < ACC_LEN; q++)
                ACC_AT(acc[i * FN + j], q) = silu(ACC_AT(acc[i * FN + j], q)) * ACC_AT(accu[i * FN + j], q);
#endif
            STORE_C(acc[i * FN + j], sbase);
            barrier();
            UNROLL for (uint q = 0u; q < NE; q++) {
                const uint idx = q * 32u + lane, row = row0 + warp * WR + i * CM + idx % CM;
                const int orr = orow[j * CN + idx / CM];
                if (row >= pc.rows || orr < 0) continue;
                const uint o = uint(orr) * pc.ys + row;
                float v = Cs[sbase + idx];
#if MODE == 0
                if ((pc.flags & 1u) != 0u) v += pc.r.v[o];
#elif MODE == 2
                v *= pc.gw.v[orr];
#endif
                pc.y.v[o] = v;
            }
            barrier();
        }
}
