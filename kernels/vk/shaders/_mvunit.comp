// Weight "units" of the matrix-vector kernels: the stretch of a row one
// thread reads and dots with x in one step. The hot types read whole
// blocks through wide loads (Q4_K: 16-byte loads of its 144-byte blocks;
// Q6_K and Q8_0, only 2-byte aligned, through 32-bit words shifted into
// place); the other types fall back to dq8() from _quant.comp, 8 elements
// per unit. Interface, per type:
//   WT                  the weights' buffer reference type
//   UNIT                elements per unit (a divisor of the block or a multiple of 8)
//   WU wload(p, rb, u)  unit u of the row at byte rb, in registers
//   uint ubase(u)       element of the row where unit u starts
//   void wdot(x, w[NR], xo, inout acc[NR])  acc[i] += row i's unit . x from vec4 xo
// NR (weight rows sharing one x, defined by the includer) lets gate and up,
// or several rows, reuse each x load. XV(x, i) reads vec4 i of x: from the
// buffer, or from shared memory where the includer staged a normalised x.
// XSTAGE (defined by the includer, with XMAX4): x is staged in shared memory
// xsh, one vec4 of padding after every 2^XPAD vec4s. XPAD is the log2 of the
// type's unit stretch, so the vec4s the lanes of a subgroup read together
// (lane u: unit u) fall in distinct banks instead of all in one.
#if defined(XSTAGE) && IDOT
// XSTAGE with IDOT (Q4_K, Q6_K): x staged as int8 in 16-value chunks (one
// uvec4 each, one of padding after every 4: Q4_K's lanes read units 4 apart,
// Q6_K's chunks 8 and 16 apart), each 32-value group with one power-of-two
// scale (_common.comp) and its exact f32 sum, two groups to a vec4 of xgs.
// XCOPIES tokens' stages where the includer takes several (XQB, XGB: where
// the token being staged or dotted starts in xq and xgs).
#ifdef USE_SUBGROUP
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#ifndef XCOPIES
#define XCOPIES 1u
#endif
#ifndef XQB
#define XQB 0u
#define XGB 0u
#endif
shared uvec4 xq[(XMAX4 / 4u + XMAX4 / 16u) * XCOPIES];
shared vec4 xgs[(XMAX4 / 16u) * XCOPIES];
#define XQSLOT(i) ((i) + ((i) >> 2))
#if FAST && TYPE == T_Q6_K
// Q6_K: 32 times each chunk's sum of int8 values (the weights' offset of 32),
// chunk l of group g at xz[g / 4 * 2 + l][g % 4]: a unit's four runs (chunk
// l of groups 4j .. 4j + 3) read one ivec4.
shared ivec4 xz[(XMAX4 / 16u) * XCOPIES];
#define Q6_ZSUMS 1
// Chunk l of group g: 32 times the sum of its int8 values, the sum of two halves' z8.
void stage_z(uint g, uint l, int z) { xz[XGB + (g >> 2) * 2u + l][g & 3u] = z; }
int z8(uint q0, uint q1) { return sudot4(q0, 0x20202020u) + sudot4(q1, 0x20202020u); }
#endif
// One token's stage: chunks (padded) and xgs vec4s of cols values.
uint xq_stride(uint cols) { return XQSLOT(cols / 16u); }
uint xg_stride(uint cols) { return cols / 64u; }
// The 64 values of x from value 64 u (f32 v: 16 vec4) as int8, with their groups' scales and sums.
void stage_unit(uint u, vec4 v[16]) {
    vec4 sc;
    for (uint hf = 0u; hf < 2u; hf++) {
        vec4 a = vec4(0.0), s = vec4(0.0);
        for (uint i = 0u; i < 8u; i++) {
            a = max(a, abs(v[8u * hf + i]));
            s += v[8u * hf + i];
        }
        float inv;
        sc[2u * hf] = i8_scale(vmax(a), inv);
        uint q[8];
        for (uint i = 0u; i < 8u; i++) q[i] = pack_i8(v[8u * hf + i], inv);
        xq[XQB + XQSLOT(4u * u + 2u * hf)] = uvec4(q[0], q[1], q[2], q[3]);
        xq[XQB + XQSLOT(4u * u + 2u * hf + 1u)] = uvec4(q[4], q[5], q[6], q[7]);
        sc[2u * hf + 1u] = hsum(s);
#ifdef Q6_ZSUMS
        stage_z(2u * u + hf, 0u, z8(q[0], q[1]) + z8(q[2], q[3]));
        stage_z(2u * u + hf, 1u, z8(q[4], q[5]) + z8(q[6], q[7]));
#endif
    }
    xgs[XGB + u] = sc;
}
#ifdef USE_SUBGROUP
// vec4s i and i + 1 (i even; a quarter of group i / 8, whose other quarters
// the neighbouring lanes hold): the group's largest magnitude and sum by
// shuffles, then this quarter's 8 values as int8.
void stage_quarter(uint i, vec4 v0, vec4 v1) {
    float a = vmax(max(abs(v0), abs(v1))), s = hsum(v0 + v1), inv;
    a = max(a, subgroupShuffleXor(a, 1u));
    a = max(a, subgroupShuffleXor(a, 2u));
    s += subgroupShuffleXor(s, 1u);
    s += subgroupShuffleXor(s, 2u);
    const float sx = i8_scale(a, inv);
    const uint q0 = pack_i8(v0, inv), q1 = pack_i8(v1, inv);
    xq[XQB + XQSLOT(i >> 2)][i & 3u] = q0;
    xq[XQB + XQSLOT(i >> 2)][(i & 3u) + 1u] = q1;
#ifdef Q6_ZSUMS
    int z = z8(q0, q1);   // the other half of the chunk: the neighbouring lane
    z += subgroupShuffleXor(z, 1u);
    if ((i & 3u) == 0u) stage_z(i >> 3, (i >> 2) & 1u, z);
#endif
    if ((i & 7u) == 0u) {
        const uint c = (i >> 2) & 2u;   // the group's scale and sum in its unit's vec4
        xgs[XGB + (i >> 4)][c] = sx;
        xgs[XGB + (i >> 4)][c + 1u] = s;
    }
}
#endif
#elif defined(XSTAGE)
#if FAST && TYPE == T_Q4_K
#define XPAD 4u
#elif FAST && TYPE == T_Q6_K
#define XPAD 5u   // a unit's 4 runs sit inside one 32-vec4 half block; unit bases 0, 4, 32, 36, ... spread by the pads
#elif FAST && (TYPE == T_Q8_0 || TYPE == T_F32)
#define XPAD 3u
#else
#define XPAD 1u
#endif
#ifndef XCOPIES
#define XCOPIES 1u   // XMAX-wide rows of x the stage holds (the includer's several tokens)
#endif
#ifndef XTB
#define XTB 0u       // where the x being dotted starts in the stage (the includer's several tokens)
#endif
shared vec4 xsh[(XMAX4 + (XMAX4 >> XPAD)) * XCOPIES];
#define XSLOT(i) ((i) + ((i) >> XPAD))
#define XV(x, i) xsh[XTB + XSLOT(i)]
#endif
#ifndef XV
#define XV(x, i) x.v[i]
#endif

layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer UV4 { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer RV4 { vec4 v[]; };

// 16 bytes at a 2-aligned byte offset.
uvec4 ld16B(U32 p, uint o) {
    const uint i = o >> 2, sh = (o & 2u) * 8u;
    const uint w0 = p.v[i], w1 = p.v[i + 1u], w2 = p.v[i + 2u], w3 = p.v[i + 3u], w4 = p.v[i + 4u];
    return uvec4(funnel(w0, w1, sh), funnel(w1, w2, sh), funnel(w2, w3, sh), funnel(w3, w4, sh));
}

#if FAST && TYPE == T_Q4_K
// Unit = one 64-element group g of a block: 32 bytes of qs (low nibbles
// elements 0..31 with sub-block 2g's scale, high nibbles 32..63 with 2g+1's).
#define WT UV4
#define UNIT 64u
struct WU { uvec4 q0, q1; vec4 s; };   // s: d*sc, dmin*m of sub-block 2g, then 2g+1
uint ubase(uint u) { return u * 64u; }
WU wload(UV4 p, uint rb, uint u) {
    const uint bi = (rb >> 4) + (u >> 2) * 9u, g = u & 3u;
    const uvec4 h = p.v[bi];           // d, dmin, scales[0..11]
    WU r;
    r.q0 = p.v[bi + 1u + 2u * g];
    r.q1 = p.v[bi + 2u + 2u * g];
    const vec2 dm = unpackHalf2x16(h.x);
    uvec4 sm;   // sc0, m0, sc1, m1 (ggml's get_scale_min_k4 for j = 2g, 2g + 1)
    if (g < 2u) {
        const uint sh = 16u * g;
        sm = uvec4(h.y >> sh, h.z >> sh, h.y >> (sh + 8u), h.z >> (sh + 8u)) & 63u;
    } else {
        const uint sh = 16u * (g - 2u);
        sm = uvec4(((h.w >> sh) & 15u) | (((h.y >> (sh + 6u)) & 3u) << 4),
                   ((h.w >> (sh + 4u)) & 15u) | (((h.z >> (sh + 6u)) & 3u) << 4),
                   ((h.w >> (sh + 8u)) & 15u) | (((h.y >> (sh + 14u)) & 3u) << 4),
                   ((h.w >> (sh + 12u)) & 15u) | (((h.z >> (sh + 14u)) & 3u) << 4));
    }
    r.s = vec4(dm.x * float(sm.x), dm.y * float(sm.y), dm.x * float(sm.z), dm.y * float(sm.w));
    return r;
}
#if defined(XSTAGE) && IDOT
// xo: vec4 16 u of unit u. Low nibbles meet group 2u, high ones 2u + 1.
void wdot(RV4 x, WU w[NR], uint xo, inout float acc[NR]) {
    const uint u = xo >> 4;
    const uvec4 l0 = xq[XQB + XQSLOT(4u * u)], l1 = xq[XQB + XQSLOT(4u * u + 1u)], h0 = xq[XQB + XQSLOT(4u * u + 2u)],
                h1 = xq[XQB + XQSLOT(4u * u + 3u)];
    const vec4 g = xgs[XGB + u];   // scale, sum of the low group; of the high one
    for (uint r = 0u; r < NR; r++) {
        int il = 0, ih = 0;
        for (uint i = 0u; i < 4u; i++) {
            const uint a = w[r].q0[i], b = w[r].q1[i];
            il += sudot4(l0[i], a & 0x0f0f0f0fu) + sudot4(l1[i], b & 0x0f0f0f0fu);
            ih += sudot4(h0[i], (a >> 4) & 0x0f0f0f0fu) + sudot4(h1[i], (b >> 4) & 0x0f0f0f0fu);
        }
        acc[r] += (w[r].s.x * g.x * float(il) - w[r].s.y * g.y) + (w[r].s.z * g.z * float(ih) - w[r].s.w * g.w);
    }
}
#else
void wdot(RV4 x, WU w[NR], uint xo, inout float acc[NR]) {
    vec4 xl = vec4(0.0), xh = vec4(0.0), ql[NR], qh[NR];
    for (uint r = 0u; r < NR; r++) { ql[r] = vec4(0.0); qh[r] = vec4(0.0); }
    for (uint i = 0u; i < 8u; i++) {
        const vec4 a = XV(x, xo + i), b = XV(x, xo + 8u + i);
        xl += a;
        xh += b;
        for (uint r = 0u; r < NR; r++) {
            const uint q = i < 4u ? w[r].q0[i] : w[r].q1[i - 4u], q2 = q >> 16;
            ql[r] += vec4(field(q, 15u, 0u, 0.0), field(q, 15u, 8u, 0.0), field(q2, 15u, 0u, 0.0), field(q2, 15u, 8u, 0.0)) * a;
            qh[r] += vec4(field(q, 15u, 4u, 0.0), field(q, 15u, 12u, 0.0), field(q2, 15u, 4u, 0.0), field(q2, 15u, 12u, 0.0)) * b;
        }
    }
    const float sl = hsum(xl), sh = hsum(xh);
    for (uint r = 0u; r < NR; r++)
        acc[r] += (w[r].s.x * hsum(ql[r]) - w[r].s.y * sl) + (w[r].s.z * hsum(qh[r]) - w[r].s.w * sh);
}
#endif

#elif FAST && TYPE == T_Q6_K
// Unit = 16 positions l0..l0+15 of half hf of a block: 64 elements in 4 runs
// of 16 (elements 128hf + l0 + 32k), from ql[64hf + l0], ql[64hf + 32 + l0],
// qh[32hf + l0] (16 bytes each) and the runs' 4 scales.
#define WT U32
#define UNIT 64u
struct WU { uvec4 a, b, h; vec4 s; };   // s: d * scale of runs 0..3
uint ubase(uint u) { return (u >> 2) * 256u + ((u >> 1) & 1u) * 128u + (u & 1u) * 16u; }
WU wload(U32 p, uint rb, uint u) {
    const uint bo = rb + (u >> 2) * Q6_K_BYTES, hf = (u >> 1) & 1u, l0 = (u & 1u) * 16u;
    WU r;
    r.a = ld16B(p, bo + Q6_K_QL + 64u * hf + l0);
    r.b = ld16B(p, bo + Q6_K_QL + 64u * hf + 32u + l0);
    r.h = ld16B(p, bo + Q6_K_QH + 32u * hf + l0);
    // scales[16] and d (right after them): 18 bytes from the scales (the last word may reach 2 bytes past the
    // block, as ld16 does)
    const uint i = (bo + Q6_K_SCALES) >> 2, sh = ((bo + Q6_K_SCALES) & 2u) * 8u;
    const uint w0 = p.v[i + 2u * hf], w1 = p.v[i + 2u * hf + 1u], w2 = p.v[i + 2u * hf + 2u], w4 = p.v[i + 4u];
    const uint lo = funnel(w0, w1, sh), hi = funnel(w1, w2, sh), bs = l0 >> 1;   // scales[8hf ..], [8hf + 4 ..]
    const float d = unpackHalf2x16((w4 >> sh) & 0xffffu).x;
    r.s = d * vec4(bitfieldExtract(int(lo), int(bs), 8), bitfieldExtract(int(lo), int(bs + 16u), 8),
                   bitfieldExtract(int(hi), int(bs), 8), bitfieldExtract(int(hi), int(bs + 16u), 8));
    return r;
}
#if defined(XSTAGE) && IDOT
// xo: vec4 ubase(u) / 4. Run k (elements ubase + 32k ..+15) is chunk xo / 4 +
// 2k of the stage, chunk (xo / 4) & 1 of group xo / 8 + k; its weights q - 32
// as q's bytes (0..63) dotted with x, less 32 times x's sum (xz).
void wdot(RV4 x, WU w[NR], uint xo, inout float acc[NR]) {
    const uint c = xo >> 2;
    uvec4 xr[4];
    for (uint k = 0u; k < 4u; k++) xr[k] = xq[XQB + XQSLOT(c + 2u * k)];
    const vec4 g01 = xgs[XGB + (c >> 2)], g23 = xgs[XGB + (c >> 2) + 1u];   // groups xo / 8 .. + 3: scales in x, z
    const ivec4 z = xz[XGB + (c >> 3) * 2u + (c & 1u)];
    for (uint r = 0u; r < NR; r++) {
        ivec4 is = -z;
        for (uint i = 0u; i < 4u; i++) {
            const uint a = w[r].a[i], b = w[r].b[i], h = w[r].h[i];
            is.x += sudot4(xr[0][i], (a & 0x0f0f0f0fu) | ((h << 4) & 0x30303030u));
            is.y += sudot4(xr[1][i], (b & 0x0f0f0f0fu) | ((h << 2) & 0x30303030u));
            is.z += sudot4(xr[2][i], ((a >> 4) & 0x0f0f0f0fu) | (h & 0x30303030u));
            is.w += sudot4(xr[3][i], ((b >> 4) & 0x0f0f0f0fu) | ((h >> 2) & 0x30303030u));
        }
        acc[r] += dot(w[r].s, vec4(g01.x * float(is.x), g01.z * float(is.y), g23.x * float(is.z), g23.z * float(is.w)));
    }
}
#else
void wdot(RV4 x, WU w[NR], uint xo, inout float acc[NR]) {
    vec4 qs[NR][4];
    for (uint r = 0u; r < NR; r++)
        for (uint k = 0u; k < 4u; k++) qs[r][k] = vec4(0.0);
    for (uint i = 0u; i < 4u; i++) {
        const vec4 x0 = XV(x, xo + i), x1 = XV(x, xo + 8u + i), x2 = XV(x, xo + 16u + i), x3 = XV(x, xo + 24u + i);
        for (uint r = 0u; r < NR; r++) {   // q - 32 of runs 0..3, q = 4 bits of ql | 2 bits of qh << 4
            const uint a = w[r].a[i], b = w[r].b[i], h = w[r].h[i];
            qs[r][0] += bytes4((a & 0x0f0f0f0fu) | ((h << 4) & 0x30303030u), 63u, 32.0) * x0;
            qs[r][1] += bytes4((b & 0x0f0f0f0fu) | ((h << 2) & 0x30303030u), 63u, 32.0) * x1;
            qs[r][2] += bytes4(((a >> 4) & 0x0f0f0f0fu) | (h & 0x30303030u), 63u, 32.0) * x2;
            qs[r][3] += bytes4(((b >> 4) & 0x0f0f0f0fu) | ((h >> 2) & 0x30303030u), 63u, 32.0) * x3;
        }
    }
    for (uint r = 0u; r < NR; r++)
        acc[r] += dot(w[r].s, vec4(hsum(qs[r][0]), hsum(qs[r][1]), hsum(qs[r][2]), hsum(qs[r][3])));
}
#endif

#elif FAST && TYPE == T_Q8_0
// Unit = one 34-byte block: 9 words from the block's word, shifted into place.
#define WT U32
#define UNIT 32u
struct WU { uint q[8]; float d; };
uint ubase(uint u) { return u * 32u; }
WU wload(U32 p, uint rb, uint u) {
    const uint o = rb + u * Q8_0_BYTES, i = o >> 2, sh = (o & 2u) * 8u;
    uint w[9];
    for (uint j = 0u; j < 9u; j++) w[j] = p.v[i + j];   // the 9th word may reach 2 bytes past the block
    WU r;
    r.d = unpackHalf2x16((w[0] >> sh) & 0xffffu).x;
    // qs start 2 bytes after d: a funnel shift by 16 + sh, written as shifts below 32
    for (uint j = 0u; j < 8u; j++) r.q[j] = ((w[j] >> 16u) >> sh) | (w[j + 1u] << (16u - sh));
    return r;
}
void wdot(RV4 x, WU w[NR], uint xo, inout float acc[NR]) {
    vec4 s[NR];
    for (uint r = 0u; r < NR; r++) s[r] = vec4(0.0);
    for (uint j = 0u; j < 8u; j++) {
        const vec4 xv = XV(x, xo + j);
        for (uint r = 0u; r < NR; r++) s[r] += bytes4(w[r].q[j] ^ 0x80808080u, 255u, 128.0) * xv;   // int8 = (byte ^ 0x80) - 128
    }
    for (uint r = 0u; r < NR; r++) acc[r] += w[r].d * hsum(s[r]);
}

#elif FAST && TYPE == T_F32
// Units of 32 floats: 8 loads in flight per thread (the router has few rows).
#define WT UV4
#define UNIT 32u
struct WU { vec4 v[8]; };
uint ubase(uint u) { return u * 32u; }
WU wload(UV4 p, uint rb, uint u) {
    const uint i = (rb >> 4) + 8u * u;
    WU r;
    for (uint j = 0u; j < 8u; j++) r.v[j] = uintBitsToFloat(p.v[i + j]);
    return r;
}
void wdot(RV4 x, WU w[NR], uint xo, inout float acc[NR]) {
    vec4 s[NR];
    for (uint r = 0u; r < NR; r++) s[r] = vec4(0.0);
    for (uint j = 0u; j < 8u; j++) {
        const vec4 a = XV(x, xo + j);
        for (uint r = 0u; r < NR; r++) s[r] += w[r].v[j] * a;
    }
    for (uint r = 0u; r < NR; r++) acc[r] += hsum(s[r]);
}

#else
// Any type, 8 elements per unit through dq8() (4-byte alignment is enough).
#define WT U32
#define UNIT 8u
struct WU { vec4 a, b; };
uint ubase(uint u) { return u * 8u; }
WU wload(U32 p, uint rb, uint u) {
    WU r;
    dq8(p, rb, u * 8u, r.a, r.b);
    return r;
}
void wdot(RV4 x, WU w[NR], uint xo, inout float acc[NR]) {
    const vec4 a = XV(x, xo), b = XV(x, xo + 1u);
    for (uint r = 0u; r < NR; r++) acc[r] += dot(w[r].a, a) + dot(w[r].b, b);
}
#endif
