// Q4_K weights as "positions" of 32 columns for the column-stationary
// decode kernels (experts_mv.comp, experts_gu.comp): a thread holds a
// position's x in registers and walks rows, reading 16 bytes of qs and the
// block's 16-byte header per row. Needs UV4 and RV4 (16-byte views) and
// 16-byte aligned rows.
// 16 bytes of a group's qs: elements 64g+16hh+(0..15) (low nibbles, sub-block
// 2g) and 64g+32+16hh+(0..15) (high nibbles, 2g+1); 8 positions per block,
// which read its 16-byte header (d, dmin, scales) too.
#define PE 32u
struct PW { uvec4 q, h; };
PW pload(UV4 p, uint rb, uint pos) {
    const uint bi = (rb >> 4) + (pos >> 3) * (Q4_K_BYTES / 16u);   // in 16-byte units: the header, then qs
    PW w;
    w.h = p.v[bi];
    w.q = p.v[bi + 1u + (pos & 7u)];
    return w;
}
// ggml's get_scale_min_k4 for all four sub-blocks of the block's half
// (g < 2: 0-3, else 4-7) as the bytes of one word: the position's two
// sub-blocks' scales in bytes 0 and 1 of sc, their mins in those of mn.
void scale_min(uvec4 h, uint pos, out uint sc, out uint mn) {
    const uint g = (pos & 7u) >> 1, sh = 16u * (g & 1u);
    const uint s4 = g >= 2u ? (h.w & 0x0f0f0f0fu) | ((h.y >> 2) & 0x30303030u) : h.y & 0x3f3f3f3fu;
    const uint m4 = g >= 2u ? ((h.w >> 4) & 0x0f0f0f0fu) | ((h.z >> 2) & 0x30303030u) : h.z & 0x3f3f3f3fu;
    sc = s4 >> sh;
    mn = m4 >> sh;
}

#if IDOT
// x as int8 with one power-of-two scale per position (x ~ sx q, _common.comp):
// a row then costs 8 integer dot products of 4 bytes instead of 32 f32
// multiply-adds, and x 11 registers instead of 34. The mins meet the exact
// f32 sums of x.
struct PX { uvec4 lo, hi; float sx, slo, shi; };
PX pxload(RV4 x, uint xo4, uint pos) {
    const uint m = pos & 7u, o = xo4 + (pos >> 3) * 64u + (m >> 1) * 16u + (m & 1u) * 4u;
    vec4 lo[4], hi[4];
    for (uint i = 0u; i < 4u; i++) {
        lo[i] = x.v[o + i];
        hi[i] = x.v[o + 8u + i];
    }
    const vec4 a = max(max(max(abs(lo[0]), abs(lo[1])), max(abs(lo[2]), abs(lo[3]))),
                       max(max(abs(hi[0]), abs(hi[1])), max(abs(hi[2]), abs(hi[3]))));
    PX r;
    float inv;
    r.sx = i8_scale(vmax(a), inv);
    for (uint i = 0u; i < 4u; i++) {
        r.lo[i] = pack_i8(lo[i], inv);
        r.hi[i] = pack_i8(hi[i], inv);
    }
    r.slo = hsum((lo[0] + lo[1]) + (lo[2] + lo[3]));
    r.shi = hsum((hi[0] + hi[1]) + (hi[2] + hi[3]));
    return r;
}
// A position's PX as a record of PX_V4 uvec4 (record rec at v[PX_V4 rec]):
// experts_xq.comp quantizes x once (px_put), the down half reads it back
// (px_get, VK_EX_PREQ) instead of quantizing it again in every workgroup.
#define PX_V4 3u
PX px_get(UV4 b, uint rec) {
    PX r;
    r.lo = b.v[PX_V4 * rec];
    r.hi = b.v[PX_V4 * rec + 1u];
    const uvec4 s = b.v[PX_V4 * rec + 2u];
    r.sx = uintBitsToFloat(s.x);
    r.slo = uintBitsToFloat(s.y);
    r.shi = uintBitsToFloat(s.z);
    return r;
}
#ifdef PX_PUT
void px_put(WV4 b, uint rec, PX r) {
    b.v[PX_V4 * rec] = r.lo;
    b.v[PX_V4 * rec + 1u] = r.hi;
    b.v[PX_V4 * rec + 2u] = uvec4(floatBitsToUint(r.sx), floatBitsToUint(r.slo), floatBitsToUint(r.shi), 0u);
}
#endif
float pdot(PW w, PX x, uint pos) {
    uint sc, mn;
    scale_min(w.h, pos, sc, mn);
    int il = 0, ih = 0;
    for (uint i = 0u; i < 4u; i++) {
        il += sudot4(x.lo[i], w.q[i] & 0x0f0f0f0fu);
        ih += sudot4(x.hi[i], (w.q[i] >> 4) & 0x0f0f0f0fu);
    }
    const vec2 dm = unpackHalf2x16(w.h.x);
    const int s = int(sc & 63u) * il + int((sc >> 8) & 63u) * ih;
    return dm.x * x.sx * float(s) - dm.y * (field(mn, 63u, 0u, 0.0) * x.slo + field(mn, 63u, 8u, 0.0) * x.shi);
}
#else
struct PX { vec4 lo[4], hi[4]; float slo, shi; };
PX pxload(RV4 x, uint xo4, uint pos) {
    const uint m = pos & 7u, o = xo4 + (pos >> 3) * 64u + (m >> 1) * 16u + (m & 1u) * 4u;
    PX r;
    for (uint i = 0u; i < 4u; i++) {
        r.lo[i] = x.v[o + i];
        r.hi[i] = x.v[o + 8u + i];
    }
    r.slo = hsum((r.lo[0] + r.lo[1]) + (r.lo[2] + r.lo[3]));
    r.shi = hsum((r.hi[0] + r.hi[1]) + (r.hi[2] + r.hi[3]));
    return r;
}
float pdot(PW w, PX x, uint pos) {
    uint sc, mn;
    scale_min(w.h, pos, sc, mn);
    const float sc0 = field(sc, 63u, 0u, 0.0), sc1 = field(sc, 63u, 8u, 0.0);
    const float m0 = field(mn, 63u, 0u, 0.0), m1 = field(mn, 63u, 8u, 0.0);
    const vec2 dm = unpackHalf2x16(w.h.x);
    vec4 sl = vec4(0.0), shh = vec4(0.0);
    for (uint i = 0u; i < 4u; i++) {
        const uint q = w.q[i], q2 = q >> 16;
        sl += vec4(field(q, 15u, 0u, 0.0), field(q, 15u, 8u, 0.0), field(q2, 15u, 0u, 0.0), field(q2, 15u, 8u, 0.0)) * x.lo[i];
        shh += vec4(field(q, 15u, 4u, 0.0), field(q, 15u, 12u, 0.0), field(q2, 15u, 4u, 0.0), field(q2, 15u, 12u, 0.0)) * x.hi[i];
    }
    return dm.x * (sc0 * hsum(sl) + sc1 * hsum(shh)) - dm.y * (m0 * x.slo + m1 * x.shi);
}
#endif
