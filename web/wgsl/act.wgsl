// Activations for the expert products, rounded as the CPU kernels round them
// (kernels/quant.c), so that the GPU computes what the native worker does:
//   mode 0: Q8_K (K-quant weights): per 256 elements d = max / -127 with the signed
//           extreme, q = min(127, round_even(x / d));
//   mode 1: Q8_0 (Q4_0, Q5_0, Q8_0 weights): per 32, d = f16(amax / 127),
//           q = round_away(x / d) with 1/d from the unrounded d;
//   mode 2: f32 as it is (float weights).
// src 0: rows of X; src 1: silu(g) * u from the gate|up output (the down input).
// Output per 32-element unit: 8 words of packed int8 (AQ) and (scale, sum of q) (AM);
// mode 2 writes the f32 bits to AQ. Grid: x = 256-element blocks, y = rows from row0.
struct AParams { cols: u32, units: u32, mode: u32, src: u32, n_ff: u32, src_stride: u32, row0: u32, pad: u32 }

@group(0) @binding(0) var<storage, read> SRC: array<f32>;
@group(0) @binding(1) var<storage, read_write> AQ: array<u32>;
@group(0) @binding(2) var<storage, read_write> AM: array<vec2<f32>>;
@group(0) @binding(3) var<uniform> A: AParams;

var<workgroup> s_amax: array<f32, 32>;
var<workgroup> s_max: array<f32, 32>;
var<workgroup> s_sum: array<i32, 32>;

// WGSL lets division be off by 2.5 ulp and pack2x16float round either way
// (NVIDIA's rounds toward zero), and either moves values across an int8
// rounding step: the scales are computed here in integers, correctly rounded
// as the CPU computes them.

// a / b rounded to nearest for a, b > 0: 24 quotient bits of the mantissas
// by restoring division, then the remainder decides the rounding (ties to
// even). Subnormal operands (which GPUs may flush) keep the plain division.
fn div_rn(a: f32, b: f32) -> f32 {
  let ua = bitcast<u32>(a);
  let ub = bitcast<u32>(b);
  if ((ua >> 23u) == 0u || (ub >> 23u) == 0u) { return a / b; }
  let mb = (ub & 0x7fffffu) | 0x800000u;
  var r = (ua & 0x7fffffu) | 0x800000u;
  var e = i32(ua >> 23u) - i32(ub >> 23u);
  if (r < mb) { r = r << 1u; e = e - 1; }
  var q = 0u;
  for (var i = 0u; i < 24u; i++) {
    q = q << 1u;
    if (r >= mb) { q = q | 1u; r = r - mb; }
    r = r << 1u;
  }
  if (r > mb || (r == mb && (q & 1u) == 1u)) { q = q + 1u; }
  return ldexp(f32(q), e - 23);
}

// The f16 nearest to x >= 0 (ties to even), as an f32.
fn f16_rne(x: f32) -> f32 {
  if (x < 6.103515625e-05) { return round(x * 16777216.0) * 5.9604644775390625e-08; }   // f16 subnormals: steps of 2^-24
  let u = bitcast<u32>(x);
  var keep = u >> 13u;
  let rest = u & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (keep & 1u) == 1u)) { keep = keep + 1u; }
  return bitcast<f32>(keep << 13u);
}

fn pack4(a: i32, b: i32, c: i32, d: i32) -> u32 {
  return (u32(a) & 0xffu) | ((u32(b) & 0xffu) << 8u) | ((u32(c) & 0xffu) << 16u) | ((u32(d) & 0xffu) << 24u);
}

@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  let r = A.row0 + wid.y;
  let base = wid.x * 256u + li * 8u;
  var v: array<f32, 8>;
  var amax = 0.0;
  var mx = 0.0;
  for (var i = 0u; i < 8u; i++) {
    let c = base + i;
    var x = 0.0;
    if (c < A.cols) {
      if (A.src == 0u) {
        x = SRC[r * A.src_stride + c];
      } else {
        let g = SRC[r * A.src_stride + c];
        x = g / (1.0 + exp(-g)) * SRC[r * A.src_stride + A.n_ff + c];
      }
    }
    v[i] = x;
    if (abs(x) > amax) { amax = abs(x); mx = x; }
  }
  if (A.mode == 2u) {
    for (var i = 0u; i < 8u; i++) {
      if (base + i < A.cols) { AQ[r * A.cols + base + i] = bitcast<u32>(v[i]); }
    }
    return;
  }
  // The signed extreme of each group (32 threads for Q8_K, 4 for Q8_0),
  // the first one on ties, as the CPU's scan finds it.
  s_amax[li] = amax;
  s_max[li] = mx;
  workgroupBarrier();
  let g = select(4u, 32u, A.mode == 0u);
  for (var o = 1u; o < g; o = o * 2u) {
    if (li % (2u * o) == 0u && s_amax[li + o] > s_amax[li]) {
      s_amax[li] = s_amax[li + o];
      s_max[li] = s_max[li + o];
    }
    workgroupBarrier();
  }
  let lead = li - li % g;
  let am = s_amax[lead];
  let m = s_max[lead];
  var q: array<i32, 8>;
  var scale = 0.0;
  if (A.mode == 0u) {
    if (am != 0.0) {
      let iscale = -sign(m) * div_rn(127.0, abs(m));
      for (var i = 0u; i < 8u; i++) { q[i] = min(127, i32(round(iscale * v[i]))); }
      scale = sign(iscale) * div_rn(1.0, abs(iscale));
    }
  } else {
    let d = select(0.0, div_rn(am, 127.0), am != 0.0);
    let id = select(0.0, div_rn(1.0, d), d != 0.0);
    for (var i = 0u; i < 8u; i++) {
      let y = v[i] * id;
      q[i] = i32(sign(y) * floor(abs(y) + 0.5));
    }
    scale = f16_rne(d);
  }
  s_sum[li] = q[0] + q[1] + q[2] + q[3] + q[4] + q[5] + q[6] + q[7];
  workgroupBarrier();
  if (base < A.cols) {
    let u = base / 32u;
    let wi = (r * A.units + u) * 8u + (li % 4u) * 2u;
    AQ[wi] = pack4(q[0], q[1], q[2], q[3]);
    AQ[wi + 1u] = pack4(q[4], q[5], q[6], q[7]);
    if (li % 4u == 0u) {
      AM[r * A.units + u] = vec2<f32>(scale, f32(s_sum[li] + s_sum[li + 1u] + s_sum[li + 2u] + s_sum[li + 3u]));
    }
  }
}
