// Tiled matrix-matrix product for prompt batches: a workgroup computes a
// BM x BN tile of outputs (rows x tokens), staging BK columns of dequantized
// weights and activations in shared memory; each thread owns 4 x 4 outputs.
// MODE 0: y[t] = W x[t] (+ r[t])                  grid (rows/BM, n/BN)
// MODE 1: experts gate+up over the pair list of expert z (moe_sort):
//         y[p] = silu(Wg_z x[p/k]) * (Wu_z x[p/k])  grid (rows/BM, n/BN, n_expert)
// MODE 2: experts down: y[p] = gw[p] * Wd_z x[p]    grid as MODE 1
// TILE (BM = BN, 64, or 32 with VK_MM_SMALL): 32 gives products with few
// rows (the router's 128 experts) four times as many workgroups. VK_MM_SMALL
// (MODE 0, the router) also splits the columns over the grid's z: workgroup z
// sums its slice of them into its own copy of y, z + 1 copies of n rows past
// y's (topk.comp adds the copies up in order).
#version 450
#include "vk_variants.h"
#define MODE (VARIANT & 3)
#if (VARIANT & VK_MM_SMALL) != 0
#define TILE 32u
#define SPLITK 1
#else
#define TILE 64u
#endif
#include "_common.comp"
#include "_quant.comp"
#define BM TILE
#define BN TILE
#define BK 32
#define NT (TILE * TILE / 16u)   // threads: 4 x 4 outputs each
#define LPR (NT / BM)            // loader threads per tile row (4 or 2)
#define LCH (BK / LPR)           // columns each loads per step (8 or 16)
layout(local_size_x = NT) in;

layout(push_constant) uniform PC {
    U32 w; U32 w2; V4 x; F32 y; F32 r; I32 meta; F32 gw; U32 unused_;
    uint rows, cols, n, xs, ys, flags, k, estride, n_expert;
} pc;

shared vec4 Ws[BK * BM / 4];
#if MODE == 1
shared vec4 Us[BK * BM / 4];
#endif
shared vec4 Xs[BK * BN / 4];
shared int xrow[BN];   // activation row of each tile column, -1 past the end
shared int orow[BN];   // output row (token or pair)

void main() {
    const uint tid = gl_LocalInvocationID.x, tx = tid % (BM / 4u), ty = tid / (BM / 4u);
    const uint row0 = gl_WorkGroupID.x * BM, col0 = gl_WorkGroupID.y * BN;
#if MODE == 0
    const uint estart = 0u;
    const uint cnt = pc.n;
#ifdef SPLITK
    const uint kper = (pc.cols / gl_NumWorkGroups.z + BK - 1u) / BK * BK;   // the column slice, whole steps
    const uint kb = min(pc.cols, gl_WorkGroupID.z * kper), ke = min(pc.cols, kb + kper);
    const uint yoff = (gl_WorkGroupID.z + 1u) * pc.n * pc.ys;
#else
    const uint kb = 0u, ke = pc.cols, yoff = 0u;
#endif
#else
    const uint kb = 0u, ke = pc.cols, yoff = 0u;
    const uint e = gl_WorkGroupID.z;
    const uint cnt = uint(pc.meta.v[e]), lbase = uint(pc.meta.v[pc.n_expert + e]);
    const uint estart = e * pc.estride;
#endif
    if (col0 >= cnt) return;   // uniform: this expert has fewer pairs
    if (tid < BN) {
        const uint i = col0 + tid;
        int xr = -1, orr = -1;
        if (i < cnt) {
#if MODE == 0
            xr = int(i); orr = int(i);
#else
            const int p = pc.meta.v[2u * pc.n_expert + lbase + i];
            orr = p;
            xr = MODE == 1 ? p / int(pc.k) : p;
#endif
        }
        xrow[tid] = xr;
        orow[tid] = orr;
    }
    barrier();
    vec4 acc[4];
#if MODE == 1
    vec4 accu[4];
#endif
    for (uint i = 0u; i < 4u; i++) {
        acc[i] = vec4(0.0);
#if MODE == 1
        accu[i] = vec4(0.0);
#endif
    }
    const uint lr = tid / LPR, lc = (tid % LPR) * LCH;   // loader: tile row / token and first column
    const uint wrow = row0 + lr;
    const uint rb = estart + wrow * (pc.cols / BLK) * BLK_BYTES;
    const int lx = xrow[lr];
    for (uint k0 = kb; k0 < ke; k0 += BK) {
        for (uint c = lc; c < lc + LCH; c += 8u) {
            vec4 a = vec4(0.0), b = vec4(0.0);
            if (wrow < pc.rows) dq8(pc.w, rb, k0 + c, a, b);
            for (uint i = 0u; i < 4u; i++) {
                Ws[((c + i) * BM + lr) / 4u][lr % 4u] = a[i];
                Ws[((c + 4u + i) * BM + lr) / 4u][lr % 4u] = b[i];
            }
#if MODE == 1
            a = vec4(0.0); b = vec4(0.0);
            if (wrow < pc.rows) dq8(pc.w2, rb, k0 + c, a, b);
            for (uint i = 0u; i < 4u; i++) {
                Us[((c + i) * BM + lr) / 4u][lr % 4u] = a[i];
                Us[((c + 4u + i) * BM + lr) / 4u][lr % 4u] = b[i];
            }
#endif
            a = vec4(0.0); b = vec4(0.0);
            if (lx >= 0) {
                const uint xo = (uint(lx) * pc.xs + k0 + c) / 4u;
                a = pc.x.v[xo];
                b = pc.x.v[xo + 1u];
            }
            for (uint i = 0u; i < 4u; i++) {
                Xs[((c + i) * BN + lr) / 4u][lr % 4u] = a[i];
                Xs[((c + 4u + i) * BN + lr) / 4u][lr % 4u] = b[i];
            }
        }
        barrier();
        for (uint kk = 0u; kk < BK; kk++) {
            const vec4 wv = Ws[(kk * BM) / 4u + tx], xv = Xs[(kk * BN) / 4u + ty];
            for (uint j = 0u; j < 4u; j++) acc[j] += wv * xv[j];
#if MODE == 1
            const vec4 uv = Us[(kk * BM) / 4u + tx];
            for (uint j = 0u; j < 4u; j++) accu[j] += uv * xv[j];
#endif
        }
        barrier();
    }
    for (uint j = 0u; j < 4u; j++) {
        const int orr = orow[ty * 4u + j];
        if (orr < 0) continue;
        for (uint i = 0u; i < 4u; i++) {
            const uint row = row0 + tx * 4u + i;
            if (row >= pc.rows) continue;
            const uint o = uint(orr) * pc.ys + row;
#if MODE == 0
            float v = acc[j][i];
            if ((pc.flags & 1u) != 0u) v += pc.r.v[o];
#elif MODE == 1
            float v = silu(acc[j][i]) * accu[j][i];
#else
            float v = pc.gw.v[orr] * acc[j][i];
#endif
            pc.y.v[yoff + o] = v;
        }
    }
}
