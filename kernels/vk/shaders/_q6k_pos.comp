// Q6_K weights as "positions" of 16 columns for experts_mv.comp (the
// column-stationary decode kernel, see _q4k_pos.comp): a thread holds a
// position's x in registers and walks rows. Needs RV4 (16-byte view of x).
// Words 2m, 2m+1 of a block's ql (m = pos % 16): elements E..E+7 (low
// nibbles) and E+64..E+71 (high), E = 128(m/8) + 8(m%8), with qh words
// 8(m/8) + 2(m%4) (+1) (bit pairs 0/4, or 2/6 when m%8 >= 4), one
// sub-block scale for each eight and d. 16 positions per block; blocks are
// only 2-byte aligned, so words are shifted into place.
#define PE 16u
struct PW { uvec2 ql, qh; float slo, shi; };
// 8 bytes at a 2-aligned byte offset.
uvec2 ld64(U32 p, uint off) {
    const uint i = off >> 2;
    if ((off & 2u) == 0u) return uvec2(p.v[i], p.v[i + 1u]);
    const uint w1 = p.v[i + 1u];
    return uvec2((p.v[i] >> 16) | (w1 << 16), (w1 >> 16) | (p.v[i + 2u] << 16));
}
PW pload(U32 p, uint rb, uint pos) {
    const uint o = rb + (pos >> 4) * Q6_K_BYTES, m = pos & 15u, sb = o + Q6_K_SCALES + 8u * (m >> 3) + ((m & 7u) >> 1);
    PW w;
    w.ql = ld64(p, o + Q6_K_QL + 8u * m);
    w.qh = ld64(p, o + Q6_K_QH + 4u * (8u * (m >> 3) + 2u * (m & 3u)));
    const float d = f16at(p, o + Q6_K_D);
    w.slo = d * field(ld8(p, sb) ^ 0x80u, 255u, 0u, 128.0);   // int8 scales
    w.shi = d * field(ld8(p, sb + 4u) ^ 0x80u, 255u, 0u, 128.0);
    return w;
}
// The position's 16 weights as bytes 0..63 (q + 32): elements E.. (lo) and E+64.. (hi).
void q6_bytes(PW w, uint pos, out uvec2 lo, out uvec2 hi) {
    const uvec2 qh = (pos & 4u) != 0u ? w.qh >> 2 : w.qh;
    lo = (w.ql & 0x0f0f0f0fu) | ((qh << 4) & 0x30303030u);
    hi = ((w.ql >> 4) & 0x0f0f0f0fu) | (qh & 0x30303030u);
}
#if IDOT
// x as int8 with one scale per position (see _q4k_pos.comp); zlo, zhi: 32 times
// the sums of its int8 values, the weights' offset of 32.
struct PX { uvec2 lo, hi; float sx; int zlo, zhi; };
PX pxload(RV4 x, uint xo4, uint pos) {
    const uint m = pos & 15u, o = xo4 + (pos >> 4) * 64u + (m >> 3) * 32u + (m & 7u) * 2u;
    const vec4 l0 = x.v[o], l1 = x.v[o + 1u], h0 = x.v[o + 16u], h1 = x.v[o + 17u];
    const vec4 a = max(max(abs(l0), abs(l1)), max(abs(h0), abs(h1)));
    PX r;
    float inv;
    r.sx = i8_scale(vmax(a), inv);
    r.lo = uvec2(pack_i8(l0, inv), pack_i8(l1, inv));
    r.hi = uvec2(pack_i8(h0, inv), pack_i8(h1, inv));
    r.zlo = 32 * (sudot4(r.lo.x, 0x01010101u) + sudot4(r.lo.y, 0x01010101u));
    r.zhi = 32 * (sudot4(r.hi.x, 0x01010101u) + sudot4(r.hi.y, 0x01010101u));
    return r;
}
// A position's PX as a record of PX_V4 uvec4 (as _q4k_pos.comp's).
#define PX_V4 2u
PX px_get(UV4 b, uint rec) {
    const uvec4 q = b.v[PX_V4 * rec], s = b.v[PX_V4 * rec + 1u];
    PX r;
    r.lo = q.xy;
    r.hi = q.zw;
    r.sx = uintBitsToFloat(s.x);
    r.zlo = int(s.y);
    r.zhi = int(s.z);
    return r;
}
#ifdef PX_PUT
void px_put(WV4 b, uint rec, PX r) {
    b.v[PX_V4 * rec] = uvec4(r.lo, r.hi);
    b.v[PX_V4 * rec + 1u] = uvec4(floatBitsToUint(r.sx), uint(r.zlo), uint(r.zhi), 0u);
}
#endif
float pdot(PW w, PX x, uint pos) {
    uvec2 lo, hi;
    q6_bytes(w, pos, lo, hi);
    const int il = sudot4(x.lo.x, lo.x) + sudot4(x.lo.y, lo.y) - x.zlo;
    const int ih = sudot4(x.hi.x, hi.x) + sudot4(x.hi.y, hi.y) - x.zhi;
    return x.sx * (w.slo * float(il) + w.shi * float(ih));
}
#else
struct PX { vec4 lo0, lo1, hi0, hi1; };
PX pxload(RV4 x, uint xo4, uint pos) {
    const uint m = pos & 15u, o = xo4 + (pos >> 4) * 64u + (m >> 3) * 32u + (m & 7u) * 2u;
    PX r;
    r.lo0 = x.v[o];
    r.lo1 = x.v[o + 1u];
    r.hi0 = x.v[o + 16u];
    r.hi1 = x.v[o + 17u];
    return r;
}
float pdot(PW w, PX x, uint pos) {
    uvec2 lo, hi;
    q6_bytes(w, pos, lo, hi);
    return w.slo * (dot(bytes4(lo.x, 63u, 32.0), x.lo0) + dot(bytes4(lo.y, 63u, 32.0), x.lo1)) +
           w.shi * (dot(bytes4(hi.x, 63u, 32.0), x.hi0) + dot(bytes4(hi.y, 63u, 32.0), x.hi1));
}
#endif

