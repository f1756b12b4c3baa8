// GLSL views of the block layouts of common/types.h, read from a u32 view of
// the same bytes (blocks are only 2-byte aligned: q4_0 is 18 bytes). dq8()
// dequantizes 8 consecutive elements of a row; tests/vk/test_vk_layout.c pins
// it against the C dequantizer for every type.

// Elements and bytes of a block of TYPE: common/types.c's, which the host
// gives when it creates the pipeline (vk_pipeline.c).
layout(constant_id = 14) const uint BLK = 1u;
layout(constant_id = 15) const uint BLK_BYTES = 4u;

// 32 bits at byte offset 4*i + sh/8 of words lo, hi (sh 0 or 16); the double shift keeps every shift below 32.
uint funnel(uint lo, uint hi, uint sh) { return (lo >> sh) | ((hi << 1u) << (31u - sh)); }
float hsum(vec4 v) { return (v.x + v.y) + (v.z + v.w); }
// Small integers to floats without int-to-float conversions (a quarter-rate
// instruction on NVIDIA, enough to make the kernels ALU-bound): the field of bits
// at position s (ending below bit 23) ORed into the float 2^(23-s) gives
// exactly 2^(23-s) + field; one subtraction (of that plus an offset) leaves
// field - offset. One LOP3 and one FADD per element.
#define PBITS(s) ((150u - (s)) << 23)
float field(uint w, uint mask, uint s, float off) {
    return uintBitsToFloat((w & (mask << s)) | PBITS(s)) - (uintBitsToFloat(PBITS(s)) + off);
}
// Four bytes of w (each below 2^mbits) minus off.
vec4 bytes4(uint w, uint mask, float off) {
    const uint hi = w >> 16;
    return vec4(field(w, mask, 0u, off), field(w, mask, 8u, off), field(hi, mask, 0u, off), field(hi, mask, 8u, off));
}

// 4 bytes at a 2-aligned byte offset.
uint ld32(U32 p, uint off) {
    uint i = off >> 2;
    if ((off & 2u) == 0u) return p.v[i];
    return (p.v[i] >> 16) | (p.v[i + 1u] << 16);
}
uint ld16(U32 p, uint off) { return (p.v[off >> 2] >> ((off & 2u) * 8u)) & 0xffffu; }
uint ld8(U32 p, uint off) { return (p.v[off >> 2] >> ((off & 3u) * 8u)) & 0xffu; }
float f16at(U32 p, uint off) { return unpackHalf2x16(ld16(p, off)).x; }
vec4 nib4(uint w, uint sh) { return vec4((w >> sh) & 15u, (w >> (sh + 8u)) & 15u, (w >> (sh + 16u)) & 15u, (w >> (sh + 24u)) & 15u); }
vec4 s8x4(uint w) { return vec4(bitfieldExtract(int(w), 0, 8), bitfieldExtract(int(w), 8, 8), bitfieldExtract(int(w), 16, 8), bitfieldExtract(int(w), 24, 8)); }
// bit b of qh for 4 consecutive elements starting at e, as 0/16
vec4 hb4(uint qh, uint e) { return vec4((qh >> e) & 1u, (qh >> (e + 1u)) & 1u, (qh >> (e + 2u)) & 1u, (qh >> (e + 3u)) & 1u) * 16.0; }

// Q4_K / Q5_K 6-bit scale and min of sub-block j (ggml's get_scale_min_k4); sb = byte offset of scales[12].
vec2 k4_scale_min(U32 p, uint sb, uint j) {
    if (j < 4u) return vec2(ld8(p, sb + j) & 63u, ld8(p, sb + j + 4u) & 63u);
    uint a = ld8(p, sb + j + 4u), lo = ld8(p, sb + j - 4u), hi = ld8(p, sb + j);
    return vec2((a & 15u) | ((lo >> 6) << 4), (a >> 4) | ((hi >> 6) << 4));
}

// Elements c .. c+7 (c a multiple of 8) of the row starting at byte rb.
void dq8(U32 p, uint rb, uint c, out vec4 lo, out vec4 hi) {
#if TYPE == T_F32
    uint o = (rb >> 2) + c;
    lo = vec4(uintBitsToFloat(p.v[o]), uintBitsToFloat(p.v[o + 1u]), uintBitsToFloat(p.v[o + 2u]), uintBitsToFloat(p.v[o + 3u]));
    hi = vec4(uintBitsToFloat(p.v[o + 4u]), uintBitsToFloat(p.v[o + 5u]), uintBitsToFloat(p.v[o + 6u]), uintBitsToFloat(p.v[o + 7u]));
#elif TYPE == T_F16
    uint o = (rb >> 2) + (c >> 1);
    lo = vec4(unpackHalf2x16(p.v[o]), unpackHalf2x16(p.v[o + 1u]));
    hi = vec4(unpackHalf2x16(p.v[o + 2u]), unpackHalf2x16(p.v[o + 3u]));
#elif TYPE == T_BF16
    uint o = (rb >> 2) + (c >> 1);
    uint w0 = p.v[o], w1 = p.v[o + 1u], w2 = p.v[o + 2u], w3 = p.v[o + 3u];
    lo = vec4(uintBitsToFloat(w0 << 16), uintBitsToFloat(w0 & 0xffff0000u), uintBitsToFloat(w1 << 16), uintBitsToFloat(w1 & 0xffff0000u));
    hi = vec4(uintBitsToFloat(w2 << 16), uintBitsToFloat(w2 & 0xffff0000u), uintBitsToFloat(w3 << 16), uintBitsToFloat(w3 & 0xffff0000u));
#elif TYPE == T_Q8_0
    uint bo = rb + (c >> 5) * Q8_0_BYTES, j = c & 31u;
    float d = f16at(p, bo + Q8_0_D);
    lo = d * s8x4(ld32(p, bo + Q8_0_QS + j));
    hi = d * s8x4(ld32(p, bo + Q8_0_QS + 4u + j));
#elif TYPE == T_Q4_0 || TYPE == T_Q4_1
#if TYPE == T_Q4_0
    uint bo = rb + (c >> 5) * Q4_0_BYTES, qo = bo + Q4_0_QS;
#else
    uint bo = rb + (c >> 5) * Q4_1_BYTES, qo = bo + Q4_1_QS;
#endif
    uint j = c & 31u, sh = (j >> 4) * 4u, q = qo + (j & 15u);
    float d = f16at(p, bo);
    vec4 a = nib4(ld32(p, q), sh), b = nib4(ld32(p, q + 4u), sh);
#if TYPE == T_Q4_0
    lo = d * (a - 8.0); hi = d * (b - 8.0);
#else
    float m = f16at(p, bo + Q4_1_M);
    lo = d * a + m; hi = d * b + m;
#endif
#elif TYPE == T_Q5_0 || TYPE == T_Q5_1
#if TYPE == T_Q5_0
    uint bo = rb + (c >> 5) * Q5_0_BYTES, ho = bo + Q5_0_QH, qo = bo + Q5_0_QS;
#else
    uint bo = rb + (c >> 5) * Q5_1_BYTES, ho = bo + Q5_1_QH, qo = bo + Q5_1_QS;
#endif
    uint j = c & 31u, sh = (j >> 4) * 4u, q = qo + (j & 15u), qh = ld32(p, ho);
    float d = f16at(p, bo);
    vec4 a = nib4(ld32(p, q), sh) + hb4(qh, j), b = nib4(ld32(p, q + 4u), sh) + hb4(qh, j + 4u);
#if TYPE == T_Q5_0
    lo = d * (a - 16.0); hi = d * (b - 16.0);
#else
    float m = f16at(p, bo + Q5_1_M);
    lo = d * a + m; hi = d * b + m;
#endif
#elif TYPE == T_Q4_K || TYPE == T_Q5_K
#if TYPE == T_Q4_K
    uint bo = rb + (c >> 8) * Q4_K_BYTES, qo = bo + Q4_K_QS;
#else
    uint bo = rb + (c >> 8) * Q5_K_BYTES, qo = bo + Q5_K_QS;
#endif
    uint w = c & 255u, g = w >> 6, h = (w >> 5) & 1u, l = w & 31u;
    vec2 dm = unpackHalf2x16(p.v[bo >> 2]);
    vec2 sm = k4_scale_min(p, bo + Q4_K_SCALES, 2u * g + h);   // Q5_K's scales sit there too
    float d = dm.x * sm.x, m = dm.y * sm.y;
    uint q = qo + 32u * g + l;
    vec4 a = nib4(p.v[q >> 2], 4u * h), b = nib4(p.v[(q >> 2) + 1u], 4u * h);
#if TYPE == T_Q5_K
    uint hbit = 2u * g + h, h0 = p.v[(bo + Q5_K_QH + l) >> 2], h1 = p.v[(bo + Q5_K_QH + 4u + l) >> 2];
    a += vec4((h0 >> hbit) & 1u, (h0 >> (hbit + 8u)) & 1u, (h0 >> (hbit + 16u)) & 1u, (h0 >> (hbit + 24u)) & 1u) * 16.0;
    b += vec4((h1 >> hbit) & 1u, (h1 >> (hbit + 8u)) & 1u, (h1 >> (hbit + 16u)) & 1u, (h1 >> (hbit + 24u)) & 1u) * 16.0;
#endif
    lo = d * a - m; hi = d * b - m;
#elif TYPE == T_Q6_K
    uint bo = rb + (c >> 8) * Q6_K_BYTES;
    uint w = c & 255u, half_ = w >> 7, r = w & 127u, run = r >> 5, l = r & 31u;
    uint qlo = bo + Q6_K_QL + 64u * half_ + (run & 1u) * 32u + l, qho = bo + Q6_K_QH + 32u * half_ + l;
    uint sh = (run >> 1) * 4u, hs = 2u * run;
    uint sc = ld8(p, bo + Q6_K_SCALES + 8u * half_ + (l >> 4) + 2u * run);
    float d = f16at(p, bo + Q6_K_D) * float(bitfieldExtract(int(sc), 0, 8));
    uint ql0 = ld32(p, qlo), ql1 = ld32(p, qlo + 4u), qh0 = ld32(p, qho), qh1 = ld32(p, qho + 4u);
    vec4 a = nib4(ql0, sh) + 16.0 * vec4((qh0 >> hs) & 3u, (qh0 >> (hs + 8u)) & 3u, (qh0 >> (hs + 16u)) & 3u, (qh0 >> (hs + 24u)) & 3u);
    vec4 b = nib4(ql1, sh) + 16.0 * vec4((qh1 >> hs) & 3u, (qh1 >> (hs + 8u)) & 3u, (qh1 >> (hs + 16u)) & 3u, (qh1 >> (hs + 24u)) & 3u);
    lo = d * (a - 32.0); hi = d * (b - 32.0);
#else
#error unsupported TYPE
#endif
}
