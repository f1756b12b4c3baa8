// One decode token's attention step in one dispatch (flash-decoding), grid
// (n_head, 1, splits): workgroup (h, split) QK-norms and rotates q head h,
// runs an online softmax over its split's keys and writes (max, sum, acc) to
// part; the last of the head's splits to finish (counter[h]) merges them into
// q, in place. The split holding the new position also normalises and
// rotates the new key and takes it and the new value from the k and v rows
// (from shared memory, not the caches, which the first q head of each KV
// group appends them to in the same dispatch). Splits past the position exit
// at once and are not counted.
// With VK_ATTN_TOKENS in flags the grid's y runs over tokens (several
// sequences decoding together): token t = gl_WorkGroupID.y takes its q, k, v
// rows, counters and partials at t's offsets, and its position and first
// cache row from params[2t], params[2t + 1]; each token's splits are those
// its own position needs, so its arithmetic is the same whatever shares the
// dispatch (an indirect grid covers the batch's longest context).
// VK_ATTN_APPEND_ONLY / VK_ATTN_NO_APPEND split the append from the attention
// when several of the tokens belong to one sequence (vk_variants.h).
//
// Decode attention is latency-bound (a few hundred KB per layer), so the
// loop over keys is built for loads in flight, not for bytes: per block of KB
// keys every thread issues all its K loads (8 vec4 of one key per pass, TPK
// threads per key) and all its V loads (one vec4 column of VPT keys) before
// any of them is used, and reductions are subgroup operations plus one
// shared-memory step. MODE is the head_dim class: HDM = 64 << MODE;
// MAX_SPLITS is the most splits a head has.
#version 450
#include "vk_variants.h"
#define MODE VARIANT
#define MAX_SPLITS VK_ATTN_MAX_SPLITS
#include "_common.comp"
#extension GL_EXT_buffer_reference_uvec2 : require
layout(local_size_x = 128) in;
layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer CV4 { vec4 v[]; };
layout(push_constant) uniform PC {
    F32 q; V4 kc; V4 vc; CF32 part; I32 params; F32 k; F32 v; CU32 counter;
    uint heads, dims, n_split, chunk, scale_bits, base_bits, eps_bits, flags;   // heads: n_head | n_head_kv << 16, dims: hd | rope_dim << 16
    uvec2 qnw, knw;
} pc;

const uint HDM = 64u << MODE, H4M = HDM / 4u, EPT = (HDM + 127u) / 128u;   // EPT: head elements per thread
const uint TPK = H4M / 8u, KP = 128u / TPK;      // scores: TPK threads a key, 8 vec4 each; KP keys a pass
const uint PASSES = 2u, KB = PASSES * KP;       // keys a block
const uint G = 128u / H4M, VPT = KB / G;         // values: thread = vec4 column x key group; VPT keys each
const float TWO_PI = 6.283185307179586;

shared vec4 qs[H4M], kn[H4M], vn[H4M];   // rotated q, the new key and value
shared float hq[HDM], hk[HDM];           // norm + RoPE scratch
shared float spart[PASSES * 128u];       // partial scores
shared float sc[KB];                     // probabilities of the block's keys
shared vec4 sacc[128];
shared vec2 red[128];
shared bool last_split;

#ifdef USE_SUBGROUP
vec2 wg_sum2(vec2 x) {
    x = subgroupAdd(x);
    if (subgroupElect()) red[gl_SubgroupID] = x;
    barrier();
    vec2 r = vec2(0.0);
    for (uint i = 0u; i < gl_NumSubgroups; i++) r += red[i];
    barrier();
    return r;
}
float wg_max(float x) {
    x = subgroupMax(x);
    if (subgroupElect()) red[gl_SubgroupID].x = x;
    barrier();
    float r = NEG_BIG;
    for (uint i = 0u; i < gl_NumSubgroups; i++) r = max(r, red[i].x);
    barrier();
    return r;
}
#else
vec2 wg_tree(vec2 x, bool is_max) {
    const uint tid = gl_LocalInvocationID.x;
    red[tid] = x;
    barrier();
    for (uint s = 64u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] = is_max ? max(red[tid], red[tid + s]) : red[tid] + red[tid + s];
        barrier();
    }
    const vec2 r = red[0];
    barrier();
    return r;
}
vec2 wg_sum2(vec2 x) { return wg_tree(x, false); }
float wg_max(float x) { return wg_tree(vec2(x), true).x; }
#endif
float wg_sum(float x) { return wg_sum2(vec2(x, 0.0)).x; }

// RoPE of element i of the head in hq (or hk) at pos: the pair (i0, i1) rotated by theta.
float rope_at(uint i, uint pos, bool is_k) {
    const uint rope_dim = pc.dims >> 16, half_ = rope_dim / 2u;
    const float x = is_k ? hk[i] : hq[i];
    if (i >= rope_dim) return x;
    const bool neox = (pc.flags & 2u) != 0u;
    const uint pi = neox ? i % half_ : i / 2u;
    const uint i0 = neox ? pi : 2u * pi, i1 = neox ? pi + half_ : 2u * pi + 1u;
    const float theta = float(pos) * pow(uintBitsToFloat(pc.base_bits), -2.0 * float(pi) / float(rope_dim));
    const float rt = theta - TWO_PI * floor(theta / TWO_PI + 0.5);
    const float c = cos(rt), s = sin(rt);
    const float a = is_k ? hk[i0] : hq[i0], b = is_k ? hk[i1] : hq[i1];
    return (neox ? i < half_ : (i & 1u) == 0u) ? a * c - b * s : a * s + b * c;
}

// qs = RoPE(QK-norm(q_h)); with the new key, kn and vn too (and the cache append).
// qb, kb: the token's q and k/v rows (floats); base: its sequence's first cache row.
void rotate_q_and_new_key(uint h, uint kvh, uint qpos, uint qb, uint kb, uint base, bool has_new, bool append) {
    const uint tid = gl_LocalInvocationID.x, hd = pc.dims & 0xffffu, kvd = (pc.heads >> 16) * hd;
    float qx[EPT], kx[EPT];
    vec2 ss = vec2(0.0);
    for (uint j = 0u; j < EPT; j++) {
        const uint i = tid + 128u * j;
        qx[j] = i < hd ? pc.q.v[qb + h * hd + i] : 0.0;
        kx[j] = has_new && i < hd ? pc.k.v[kb + kvh * hd + i] : 0.0;
        if (has_new && i < hd) vn[i >> 2][i & 3u] = pc.v.v[kb + kvh * hd + i];
        ss += vec2(qx[j] * qx[j], kx[j] * kx[j]);
    }
    if ((pc.flags & 1u) != 0u) {
        const vec2 inv = 1.0 / sqrt(wg_sum2(ss) / float(hd) + uintBitsToFloat(pc.eps_bits));
        for (uint j = 0u; j < EPT; j++) {
            const uint i = tid + 128u * j;
            if (i >= hd) break;
            qx[j] *= inv.x * F32(pc.qnw).v[i];
            if (has_new) kx[j] *= inv.y * F32(pc.knw).v[i];
        }
    }
    for (uint j = 0u; j < EPT; j++) {
        const uint i = tid + 128u * j;
        if (i < hd) {
            hq[i] = qx[j];
            hk[i] = kx[j];
        }
    }
    barrier();
    for (uint j = 0u; j < EPT; j++) {
        const uint i = tid + 128u * j;
        if (i >= hd) break;
        qx[j] = rope_at(i, qpos, false);
        if (has_new) kx[j] = rope_at(i, qpos, true);
    }
    for (uint j = 0u; j < EPT; j++) {
        const uint i = tid + 128u * j;
        if (i >= hd) break;
        qs[i >> 2][i & 3u] = qx[j];
        if (has_new) {
            kn[i >> 2][i & 3u] = kx[j];
            if (append) {
                const uint dst = (base + qpos) * kvd + kvh * hd + i;
                pc.kc.v[dst >> 2][dst & 3u] = kx[j];
                pc.vc.v[dst >> 2][dst & 3u] = vn[i >> 2][i & 3u];
            }
        }
    }
    barrier();
}

void main() {
    const uint tid = gl_LocalInvocationID.x, h = gl_WorkGroupID.x, sp = gl_WorkGroupID.z;
    const uint n_head = pc.heads & 0xffffu, hd = pc.dims & 0xffffu, hd4 = hd / 4u;
    const uint kvd4 = (pc.heads >> 16) * hd4, group = n_head / (pc.heads >> 16), kvh = h / group;
    // The token: one, or (VK_ATTN_TOKENS) token t of the grid's y, its position and first cache row from params.
    const bool tokens = (pc.flags & VK_ATTN_TOKENS) != 0u;
    const uint tok = tokens ? gl_WorkGroupID.y : 0u;
    const uint qpos = uint(pc.params.v[2u * tok]), base = tokens ? uint(pc.params.v[2u * tok + 1u]) : 0u;
    // Splits: all pc.n_split over the context, pc.chunk keys each, or (flags & 4,
    // an indirect dispatch) those the keys up to the position need, cut evenly;
    // the partials keep the stride of pc.n_split. Only splits holding keys run.
    const bool indirect = (pc.flags & 4u) != 0u;
    const uint ns = indirect ? min(pc.n_split, clamp((qpos + VK_ATTN_POS_KEYS) / VK_ATTN_POS_KEYS, 1u, MAX_SPLITS))
                             : pc.n_split;
    const uint chunk = indirect ? (qpos + ns) / ns : pc.chunk;
    const uint used = min(ns, qpos / chunk + 1u), start = sp * chunk, end = min(start + chunk, qpos + 1u);
    if (sp >= used) return;
    // The token's rows: q (n_head heads), k and v (n_head_kv), its counters and
    // partials (a token's share of the scratch rounded up to whole vec4s).
    const uint qb = tok * n_head * hd, kb = tok * (kvd4 * 4u), cb = tok * n_head;
    const uint pb = tok * ((n_head * pc.n_split * (hd + 2u) + 3u) & ~3u);
    const bool has_new = sp == used - 1u;   // the new key is the context's last
    const bool appends = has_new && h % group == 0u;
    if ((pc.flags & VK_ATTN_APPEND_ONLY) != 0u) {
        if (appends) rotate_q_and_new_key(h, kvh, qpos, qb, kb, base, true, true);
        return;
    }
    rotate_q_and_new_key(h, kvh, qpos, qb, kb, base, has_new, appends && (pc.flags & VK_ATTN_NO_APPEND) == 0u);

    const float scale = uintBitsToFloat(pc.scale_bits);
    const uint slice = tid % TPK, col = tid % H4M, kg = tid / H4M, kvo = kvh * hd4;
    vec4 qr[8];
    for (uint i = 0u; i < 8u; i++) qr[i] = slice * 8u + i < hd4 ? qs[slice * 8u + i] : vec4(0.0);
    float m = NEG_BIG, lt = 0.0;   // running max; this thread's share of the running sum
    vec4 acc = vec4(0.0);
    for (uint k0 = start; k0 < end; k0 += KB) {
        // Every load of the block first: K rows (TPK threads a key), V columns.
        vec4 kv[PASSES][8], vv[VPT];
        for (uint p = 0u; p < PASSES; p++) {
            const uint key = k0 + p * KP + tid / TPK;
            for (uint i = 0u; i < 8u; i++) {
                const uint c = slice * 8u + i;
                kv[p][i] = key >= end || c >= hd4 ? vec4(0.0) : key == qpos ? kn[c] : pc.kc.v[(base + key) * kvd4 + kvo + c];
            }
        }
        for (uint i = 0u; i < VPT; i++) {
            const uint key = k0 + kg + G * i;
            vv[i] = key >= end || col >= hd4 ? vec4(0.0) : key == qpos ? vn[col] : pc.vc.v[(base + key) * kvd4 + kvo + col];
        }
        for (uint p = 0u; p < PASSES; p++) {
            vec4 s4 = vec4(0.0);
            for (uint i = 0u; i < 8u; i++) s4 += qr[i] * kv[p][i];
            spart[p * 128u + tid] = (s4.x + s4.y) + (s4.z + s4.w);
        }
        barrier();
        float s = NEG_BIG;
        if (tid < KB && k0 + tid < end) {
            const uint o = (tid / KP) * 128u + (tid % KP) * TPK;
            float d = 0.0;
            for (uint u = 0u; u < TPK; u++) d += spart[o + u];
            s = d * scale;
        }
        const float nm = max(m, wg_max(s)), corr = exp(m - nm);
        const float p = s > NEG_BIG ? exp(s - nm) : 0.0;
        if (tid < KB) sc[tid] = p;
        lt = lt * corr + p;
        m = nm;
        barrier();
        vec4 a = vec4(0.0);
        for (uint i = 0u; i < VPT; i++) a += sc[kg + G * i] * vv[i];
        acc = acc * corr + a;
        barrier();   // sc and spart are rewritten by the next block
    }
    const float l = wg_sum(lt);
    sacc[tid] = acc;
    barrier();
    // Partials: acc of (h, split) as hd4 vec4s, then (m, l) pairs after all the accs.
    const uint pi = h * pc.n_split + sp, ml = pb + n_head * pc.n_split * hd;
    if (tid < hd4) {
        vec4 t = vec4(0.0);
        for (uint g = 0u; g < G; g++) t += sacc[g * H4M + tid];
        CV4(pc.part).v[pb / 4u + pi * hd4 + tid] = t;
    }
    if (tid == 0u) {
        pc.part.v[ml + 2u * pi] = m;
        pc.part.v[ml + 2u * pi + 1u] = l;
    }
    memoryBarrierBuffer();
    barrier();
    if (tid == 0u) last_split = atomicAdd(pc.counter.v[cb + h], 1u) == used - 1u;
    barrier();
    if (!last_split) return;
    memoryBarrierBuffer();

    // The merge: out = sum_s w_s acc_s / sum_s w_s l_s, w_s = e^(m_s - M).
    const uint p0 = h * pc.n_split;
    const float ms = tid < used ? pc.part.v[ml + 2u * (p0 + tid)] : NEG_BIG;
    const float M = wg_max(ms), w = tid < used ? exp(ms - M) : 0.0;
    const float L = wg_sum(tid < used ? w * pc.part.v[ml + 2u * (p0 + tid) + 1u] : 0.0);
    red[tid].y = w;   // the split weights (KB may hold fewer than MAX_SPLITS)
    barrier();
    vec4 a = vec4(0.0);
    for (uint i = 0u; i < MAX_SPLITS / G; i++) {
        const uint s = kg + G * i;
        if (s < used && col < hd4) a += red[s].y * CV4(pc.part).v[pb / 4u + (p0 + s) * hd4 + col];
    }
    sacc[tid] = a;
    barrier();
    if (tid < hd4) {
        vec4 t = vec4(0.0);
        for (uint g = 0u; g < G; g++) t += sacc[g * H4M + tid];
        t /= L;
        const uint o = qb + h * hd + 4u * tid;
        pc.q.v[o] = t.x;
        pc.q.v[o + 1u] = t.y;
        pc.q.v[o + 2u] = t.z;
        pc.q.v[o + 3u] = t.w;
    }
    if (tid == 0u) pc.counter.v[cb + h] = 0u;
}
