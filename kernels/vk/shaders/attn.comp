// Causal GQA attention, split-K (flash-decoding): workgroup (head, token,
// split) runs an online softmax over its slice of key positions and writes
// (max, sum, acc[hd]) to part; attn_merge combines the splits. Decode has
// n_split slices per head to fill the GPU; a prompt batch gets its
// parallelism from the tokens. Keys beyond the token's position are skipped.
// A thread owns one key for the scores and one dimension for the values.
// (One decode token runs attn_dec.comp instead: the whole step in one dispatch.)
// MODE 2..5 (prompt batches, n > 1): tiled flash attention. A workgroup owns
// R consecutive (token, q head) rows of one KV group, rows ordered token-major
// (row f = t * group + g), so each K/V tile staged in shared memory serves
// every q head of the group and several tokens. Per tile of BK keys: scores
// (a thread 4 keys x SR rows), online softmax (a thread per row), then P*V
// (a thread one vec4 column x 8 rows). Tiles past the block's last query are
// never loaded; keys past each row's position are masked. The mode picks the
// head_dim class HDMAX = 64 << ((MODE - 2) % 4); R * HDMAX = 4096 keeps the
// shared memory (Q, one K/V tile, P) under 40 KiB and the accumulators at
// 8 vec4; MODE 6..9 halve R for devices with 32 KiB (4 vec4 accumulators).
// Several sequences in one batch (VK_ATTN_TOKENS in flags): a workgroup's rows
// come from blocks[4 * gl_WorkGroupID.x ..]: (t0, n_run, f0), rows f0 .. of the
// run of n_run tokens from t0 at consecutive positions of one sequence, whose
// position and first cache row params[2 t0], params[2 t0 + 1] give (a block
// never spans two runs); the split-K path reads each token's pair.
#version 450
#include "vk_variants.h"
#define MODE VARIANT
#include "_common.comp"
#if MODE >= 2
layout(local_size_x = 128) in;
layout(push_constant) uniform PC {
    F32 q; V4 kc; F32 vc; F32 o; I32 params; I32 blocks; U32 p6; U32 p7;
    uint n_head, n_head_kv, hd, n, scale_bits, flags;
} pc;
const uint HDMAX = 64u << ((MODE - 2) % 4), H4 = HDMAX / 4u, ST = H4 + 1u;   // ST: padded row stride (vec4), no bank conflicts
const uint R = (MODE >= 6 ? 2048u : 4096u) / HDMAX, BK = HDMAX <= 128u ? 32u : 4096u / HDMAX;   // rows, keys per tile
const uint SR = R / 16u > 0u ? R / 16u : 1u, SK = BK / 8u;                   // scores per thread: SR rows x SK keys
const uint RSTEP = 128u / H4, NACC = R / RSTEP;                              // P*V: rows tr + RSTEP * j
shared vec4 sq[R * ST];
shared vec4 skv[BK * ST];
shared float sp[R * BK];
shared float scorr[R];
void main() {
    const uint tid = gl_LocalInvocationID.x, kvh = gl_WorkGroupID.y;
    const uint hd = pc.hd, hd4 = hd / 4u, n_head = pc.n_head, group = n_head / pc.n_head_kv, kvd = pc.n_head_kv * hd;
    // The block: rows f0 .. f0 + R - 1 of a run (t0: its first token), the last row blocks (most keys) first,
    // so the short ones fill the tail; or the host's block (several sequences, ordered the same way).
    uint t0 = 0u, n_run = pc.n, pos0, base = 0u, f0 = (gl_NumWorkGroups.x - 1u - gl_WorkGroupID.x) * R;
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
    // Q rows, pre-scaled; rows past the run are zero.
    for (uint e = tid; e < R * H4; e += 128u) {
        const uint r = e / H4, c = e % H4, f = f0 + r;
        vec4 x = vec4(0.0);
        if (f < rows && c < hd4) {
            const uint qo = ((t0 + f / group) * n_head + kvh * group + f % group) * hd + 4u * c;
            x = vec4(pc.q.v[qo], pc.q.v[qo + 1u], pc.q.v[qo + 2u], pc.q.v[qo + 3u]) * scale;
        }
        sq[r * ST + c] = x;
    }
    const uint t_last = min(f0 + R, rows) - 1u;
    const uint kend = pos0 + t_last / group + 1u;   // keys 0 .. the block's last query position
    const uint tx = tid % 8u, ty = tid / 8u, tc = tid % H4, tr = tid / H4;
    float m = NEG_BIG, l = 0.0;   // the softmax state of row tid (tid < R)
    const uint my_pos = pos0 + (f0 + tid) / group;
    vec4 acc[NACC];
    for (uint j = 0u; j < NACC; j++) acc[j] = vec4(0.0);
    for (uint k0 = 0u; k0 < kend; k0 += BK) {
        const uint nk = min(BK, kend - k0);
        barrier();   // the previous tile's P*V is done with skv and sp
        for (uint e = tid; e < BK * H4; e += 128u) {
            const uint k = e / H4, c = e % H4;
            skv[k * ST + c] = k < nk && c < hd4 ? pc.kc.v[((base + k0 + k) * kvd + kvh * hd) / 4u + c] : vec4(0.0);
        }
        barrier();
        if (ty < R) {   // scores: rows ty + 16 i, keys tx + 8 j
            float s[SR][SK];
            for (uint i = 0u; i < SR; i++)
                for (uint j = 0u; j < SK; j++) s[i][j] = 0.0;
            for (uint c = 0u; c < hd4; c++) {
                vec4 kv[SK];
                for (uint j = 0u; j < SK; j++) kv[j] = skv[(tx + 8u * j) * ST + c];
                for (uint i = 0u; i < SR; i++) {
                    const vec4 qv = sq[(ty + 16u * i) * ST + c];
                    for (uint j = 0u; j < SK; j++) s[i][j] += dot(qv, kv[j]);
                }
            }
            for (uint i = 0u; i < SR; i++)
                for (uint j = 0u; j < SK; j++) sp[(ty + 16u * i) * BK + tx + 8u * j] = s[i][j];
        }
        barrier();
        if (tid < R) {   // online softmax of row tid; masked keys get p = 0
            float mx = m;
            for (uint k = 0u; k < nk && k0 + k <= my_pos; k++) mx = max(mx, sp[tid * BK + k]);
            float sum = 0.0;
            for (uint k = 0u; k < BK; k++) {
                const float p = k < nk && k0 + k <= my_pos ? exp(sp[tid * BK + k] - mx) : 0.0;
                sp[tid * BK + k] = p;
                sum += p;
            }
            const float corr = exp(m - mx);
            l = l * corr + sum;
            m = mx;
            scorr[tid] = corr;
        }
        // V tile over the K tile (the scores are done with it), beside the softmax.
        for (uint e = tid; e < BK * HDMAX; e += 128u) {
            const uint k = e / HDMAX, d = e % HDMAX;
            skv[k * ST + d / 4u][d % 4u] = k < nk && d < hd ? pc.vc.v[(base + k0 + k) * kvd + kvh * hd + d] : 0.0;
        }
        barrier();
        if (tc < hd4) {
            for (uint j = 0u; j < NACC; j++) {
                const uint r = tr + RSTEP * j;
                vec4 a = acc[j] * scorr[r];
                for (uint k = 0u; k < nk; k++) a += sp[r * BK + k] * skv[k * ST + tc];
                acc[j] = a;
            }
        }
    }
    barrier();
    if (tid < R) scorr[tid] = l;
    barrier();
    if (tc < hd4) {
        for (uint j = 0u; j < NACC; j++) {
            const uint r = tr + RSTEP * j, f = f0 + r;
            if (f >= rows) break;
            const uint oo = ((t0 + f / group) * n_head + kvh * group + f % group) * hd + 4u * tc;
            const vec4 x = acc[j] / scorr[r];
            pc.o.v[oo] = x.x;
            pc.o.v[oo + 1u] = x.y;
            pc.o.v[oo + 2u] = x.z;
            pc.o.v[oo + 3u] = x.w;
        }
    }
}
#else
layout(local_size_x = 128) in;
layout(push_constant) uniform PC {
    F32 q; V4 kc; F32 vc; F32 part; I32 params; U32 p5; U32 p6; U32 p7;
    uint n_head, n_head_kv, hd, n_split, chunk, scale_bits, flags;
} pc;
shared vec4 qv[128];
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
// q . K[key] over the head: each thread one key, 16-byte loads, 4 partial sums in flight.
float key_dot(uint ko4, uint hd4) {
    vec4 s0 = vec4(0.0), s1 = vec4(0.0), s2 = vec4(0.0), s3 = vec4(0.0);
    uint i = 0u;
    for (; i + 4u <= hd4; i += 4u) {
        s0 += qv[i] * pc.kc.v[ko4 + i];
        s1 += qv[i + 1u] * pc.kc.v[ko4 + i + 1u];
        s2 += qv[i + 2u] * pc.kc.v[ko4 + i + 2u];
        s3 += qv[i + 3u] * pc.kc.v[ko4 + i + 3u];
    }
    for (; i < hd4; i++) s0 += qv[i] * pc.kc.v[ko4 + i];
    const vec4 s = (s0 + s1) + (s2 + s3);
    return (s.x + s.y) + (s.z + s.w);
}
void main() {
    const uint tid = gl_LocalInvocationID.x, h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, sp = gl_WorkGroupID.z;
    const uint hd = pc.hd, hd4 = hd / 4u, kvd = pc.n_head_kv * hd, kvh = h / (pc.n_head / pc.n_head_kv);
    const bool tokens = (pc.flags & VK_ATTN_TOKENS) != 0u;
    const uint qpos = tokens ? uint(pc.params.v[2u * t]) : uint(pc.params.v[0]) + t;
    const uint base = tokens ? uint(pc.params.v[2u * t + 1u]) * kvd : 0u;   // the sequence's first cache float
    const uint start = sp * pc.chunk, end = min(start + pc.chunk, qpos + 1u);
    const float scale = uintBitsToFloat(pc.scale_bits);
    const uint qo = (t * pc.n_head + h) * hd;
    for (uint i = tid; i < hd4; i += 128u)
        qv[i] = vec4(pc.q.v[qo + 4u * i], pc.q.v[qo + 4u * i + 1u], pc.q.v[qo + 4u * i + 2u], pc.q.v[qo + 4u * i + 3u]);
    barrier();
    float m = NEG_BIG, l = 0.0, acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
    for (uint c0 = start; c0 < end; c0 += 128u) {
        const uint key = c0 + tid;
        const float s = key < end ? key_dot((base + key * kvd + kvh * hd) / 4u, hd4) * scale : NEG_BIG;
        const float nm = max(m, wg_reduce(s, true));
        const float p = key < end ? exp(s - nm) : 0.0;
        sc[tid] = p;
        const float ps = wg_reduce(p, false);   // its barriers also publish sc[]
        const float corr = exp(m - nm);
        l = l * corr + ps;
        const uint nk = min(128u, end - c0), vo = base + c0 * kvd + kvh * hd;
        for (uint j = 0u; j < 4u; j++) {   // thread = dimension; 4 keys per step, independent loads
            const uint d = tid + 128u * j;
            if (d >= hd) break;
            float a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
            uint i = 0u;
            for (; i + 4u <= nk; i += 4u) {
                a0 += sc[i] * pc.vc.v[vo + i * kvd + d];
                a1 += sc[i + 1u] * pc.vc.v[vo + (i + 1u) * kvd + d];
                a2 += sc[i + 2u] * pc.vc.v[vo + (i + 2u) * kvd + d];
                a3 += sc[i + 3u] * pc.vc.v[vo + (i + 3u) * kvd + d];
            }
            for (; i < nk; i++) a0 += sc[i] * pc.vc.v[vo + i * kvd + d];
            acc[j] = acc[j] * corr + ((a0 + a1) + (a2 + a3));
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
#endif
