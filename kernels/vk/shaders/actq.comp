// Activation rounding, to match the CPU backend bit-closely: the CPU
// quantizes a matrix product's input to the weight type's partner (Q8_0 /
// Q8_1 for 32-element blocks, Q8_K for K-quants) before its dot products.
// y = dequant(quant(x)) in f32, one thread per element, grid (cols/256, rows).
// MODE 0: Q8_0/Q8_1 (d = amax/127 stored as f16, round half away from zero)
// MODE 1: Q8_K (d = max/-127 with the signed extreme, round half to even)
// MODE 2: Q8_1: as Q8_0, and the CPU's dot takes the block sum from the f16
//         s = sum(q) * d; the difference is spread over the block's values.
#version 450
#include "vk_variants.h"
#define MODE VARIANT
#include "_common.comp"
layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
    F32 x; F32 y; U32 p2; U32 p3; U32 p4; U32 p5; U32 p6; U32 p7;
    uint cols;
} pc;
// GPU division may be off by an ulp or two (Vulkan allows 2.5 ulp) and
// packHalf2x16 need not round to nearest: both would move values across a
// rounding step, so do them the way the CPU does (correctly rounded). fma()
// need not be fused in Vulkan, so exact products use Dekker's split (f32
// add, sub and mul are correctly rounded; `precise` forbids contraction).
vec2 two_prod(float a, float b) {   // a * b = p + e exactly
    precise float p = a * b, ca = 4097.0 * a, cb = 4097.0 * b;
    precise float ah = ca - (ca - a), al = a - ah, bh = cb - (cb - b), bl = b - bh;
    precise float e = ((ah * bh - p) + ah * bl + al * bh) + al * bl;
    return vec2(p, e);
}
float remainder_of(float a, float b, float q) {   // a - q * b, exact enough to compare neighbours
    const vec2 pe = two_prod(q, b);
    precise float r = (a - pe.x) - pe.y;
    return r;
}
float div_rn(float a, float b) {
    if (a == 0.0) return a / b;
    float q = a / b;
    q += remainder_of(a, b, q) / b;   // now within an ulp
    // of q and its two neighbours, the one leaving the smallest remainder is the rounded quotient
    const uint u = floatBitsToUint(q);
    float best = q, rb = abs(remainder_of(a, b, q));
    for (int k = -1; k <= 1; k += 2) {
        const float c = uintBitsToFloat(uint(int(u) + k)), rc = abs(remainder_of(a, b, c));
        if (rc < rb) {
            best = c;
            rb = rc;
        }
    }
    return best;
}
float f16_rne(float x) {   // nearest f16 value, ties to even (moex_f32_to_f16)
    uint h = packHalf2x16(vec2(x, 0.0)) & 0xffffu;
    float best = unpackHalf2x16(h).x;
    const uint h0 = h;
    for (int k = -1; k <= 1; k += 2) {
        const uint h2 = uint(int(h0) + k) & 0xffffu;
        const float v = unpackHalf2x16(h2).x, e1 = abs(v - x), e0 = abs(best - x);
        if (e1 < e0 || (e1 == e0 && (h2 & 1u) == 0u && (h & 1u) != 0u)) {
            best = v;
            h = h2;
        }
    }
    return best;
}
shared float va[256];
shared float vs[256];   // the signed value with that magnitude
shared float qsum[256];
void main() {
    const uint tid = gl_LocalInvocationID.x, c = gl_WorkGroupID.x * 256u + tid, r = gl_WorkGroupID.y;
    const uint seg = MODE == 1 ? 256u : 32u, lane = tid % seg;
    const bool live = c < pc.cols;   // 32-block rows need not fill the workgroup
    const float v = live ? pc.x.v[r * pc.cols + c] : 0.0;
    va[tid] = abs(v);
    vs[tid] = v;
    barrier();
    for (uint s = seg / 2u; s > 0u; s >>= 1) {
        if (lane < s && va[tid + s] > va[tid]) {   // first maximum wins, as the CPU's scan
            va[tid] = va[tid + s];
            vs[tid] = vs[tid + s];
        }
        barrier();
    }
    const uint head = tid - lane;
#if MODE != 1
    const float d = div_rn(va[head], 127.0), id = d != 0.0 ? div_rn(1.0, d) : 0.0;
    // roundf (half away from zero), exactly: floor(|p| + 0.5) rounds 0.49999997 up
    const float p = v * id, tp = trunc(p), q = tp + (abs(p - tp) >= 0.5 ? sign(p) : 0.0);
    const float d16 = f16_rne(d);
#if MODE == 2
    qsum[tid] = q;
    barrier();
    for (uint s = 16u; s > 0u; s >>= 1) {
        if (lane < s) qsum[tid] += qsum[tid + s];
        barrier();
    }
    const float sum = qsum[head], s16 = f16_rne(sum * d);
    if (live) pc.y.v[r * pc.cols + c] = d16 * q + (s16 - d16 * sum) / 32.0;
#else
    if (live) pc.y.v[r * pc.cols + c] = d16 * q;
#endif
#else
    const float mx = vs[head];
    if (!live) return;
    if (va[head] == 0.0) {
        pc.y.v[r * pc.cols + c] = 0.0;
        return;
    }
    const float iscale = div_rn(-127.0, mx);
    const float q = min(127.0, roundEven(iscale * v));
    pc.y.v[r * pc.cols + c] = div_rn(1.0, iscale) * q;
#endif
}
