// One 32-element unit of a quantized weight row, unpacked to signed bytes for
// packed int8 dot products against the Q8 activations (act.wgsl):
//   dot(unit, a) = a.scale * (d0 * sum_{k<4} dp4(q[k], a[k]) + d1 * sum_{k>=4} dp4(q[k], a[k]) + m * a.sum)
// d1 differs from d0 only for Q6_K (16-element sub-blocks); m carries the
// offset or min term. load_unit(rb, u): row at byte address rb, unit u.
// One definition per type below; the engine keeps the one it needs (TYPE).
struct QUnit { q: array<u32, 8>, d0: f32, d1: f32, m: f32 }

// Spreads the low 4 bits of h to bit 4 of each of the four bytes.
fn spread4(h: u32) -> u32 {
  return ((h & 1u) << 4u) | ((h & 2u) << 11u) | ((h & 4u) << 18u) | ((h & 8u) << 25u);
}

//#if q4_0
// block_q4_0: f16 d, 16 bytes of nibbles (elements 0..15 low, 16..31 high); x = d (q - 8)
fn load_unit(rb: u32, u: u32) -> QUnit {
  let b = rb + u * Q4_0_BYTES;
  let d = f16at(b + Q4_0_D);
  var r: QUnit;
  for (var k = 0u; k < 4u; k++) {
    let w = ld32(b + Q4_0_QS + 4u * k);
    r.q[k] = w & 0x0f0f0f0fu;
    r.q[k + 4u] = (w >> 4u) & 0x0f0f0f0fu;
  }
  r.d0 = d; r.d1 = d; r.m = -8.0 * d;
  return r;
}
//#endif
//#if q5_0
// block_q5_0: f16 d, u32 qh (bit j: 5th bit of element j), 16 bytes of nibbles; x = d (q - 16)
fn load_unit(rb: u32, u: u32) -> QUnit {
  let b = rb + u * Q5_0_BYTES;
  let d = f16at(b + Q5_0_D);
  let qh = ld32(b + Q5_0_QH);
  var r: QUnit;
  for (var k = 0u; k < 4u; k++) {
    let w = ld32(b + Q5_0_QS + 4u * k);
    r.q[k] = (w & 0x0f0f0f0fu) | spread4(qh >> (4u * k));
    r.q[k + 4u] = ((w >> 4u) & 0x0f0f0f0fu) | spread4(qh >> (16u + 4u * k));
  }
  r.d0 = d; r.d1 = d; r.m = -16.0 * d;
  return r;
}
//#endif
//#if q8_0
// block_q8_0: f16 d, 32 int8; x = d q
fn load_unit(rb: u32, u: u32) -> QUnit {
  let b = rb + u * Q8_0_BYTES;
  let d = f16at(b + Q8_0_D);
  var r: QUnit;
  for (var k = 0u; k < 8u; k++) { r.q[k] = ld32(b + Q8_0_QS + 4u * k); }
  r.d0 = d; r.d1 = d; r.m = 0.0;
  return r;
}
//#endif
//#if q4_K
// block_q4_K (256 elements, 8 units): f16 d, f16 dmin, 12 bytes of 6-bit scales/mins,
// 128 bytes of nibbles (unit 2g low, 2g+1 high nibbles of bytes 32g..32g+31); x = d sc q - dmin m
fn load_unit(rb: u32, u: u32) -> QUnit {
  let b = rb + (u >> 3u) * Q4_K_BYTES;
  let j = u & 7u;
  let sm = k4_scale_min(b + Q4_K_SCALES, j);
  let shift = (j & 1u) * 4u;
  var r: QUnit;
  for (var k = 0u; k < 8u; k++) { r.q[k] = (ld32(b + Q4_K_QS + 32u * (j >> 1u) + 4u * k) >> shift) & 0x0f0f0f0fu; }
  r.d0 = f16at(b + Q4_K_D) * sm.x; r.d1 = r.d0; r.m = -f16at(b + Q4_K_DMIN) * sm.y;
  return r;
}
//#endif
//#if q5_K
// block_q5_K: f16 d, f16 dmin, 12 scale bytes, 32 bytes qh (bit j of byte l: 5th bit of
// element l of unit j), 128 bytes of nibbles as in Q4_K
fn load_unit(rb: u32, u: u32) -> QUnit {
  let b = rb + (u >> 3u) * Q5_K_BYTES;
  let j = u & 7u;
  let sm = k4_scale_min(b + Q5_K_SCALES, j);
  let shift = (j & 1u) * 4u;
  var r: QUnit;
  for (var k = 0u; k < 8u; k++) {
    let lo = (ld32(b + Q5_K_QS + 32u * (j >> 1u) + 4u * k) >> shift) & 0x0f0f0f0fu;
    let hi = ((ld32(b + Q5_K_QH + 4u * k) >> j) & 0x01010101u) << 4u;
    r.q[k] = lo | hi;
  }
  r.d0 = f16at(b + Q5_K_D) * sm.x; r.d1 = r.d0; r.m = -f16at(b + Q5_K_DMIN) * sm.y;
  return r;
}
//#endif
//#if q6_K
// block_q6_K: 128 bytes ql (low nibbles), 64 bytes qh (2 high bits), 16 int8 scales
// (one per 16 elements), f16 d; x = d sc (q - 32). Unit j: half h = j / 4, quarter j % 4.
fn i8at(a: u32) -> f32 { return f32(i32(ld8(a) << 24u) >> 24u); }
fn load_unit(rb: u32, u: u32) -> QUnit {
  let b = rb + (u >> 3u) * Q6_K_BYTES;
  let j = u & 7u;
  let h = j >> 2u;
  let kq = j & 3u;
  let nib_shift = (kq >> 1u) * 4u;
  var r: QUnit;
  for (var k = 0u; k < 8u; k++) {
    let lo = (ld32(b + Q6_K_QL + 64u * h + 32u * (kq & 1u) + 4u * k) >> nib_shift) & 0x0f0f0f0fu;
    let hi = ((ld32(b + Q6_K_QH + 32u * h + 4u * k) >> (2u * kq)) & 0x03030303u) << 4u;
    let q = lo | hi;                       // 0..63 per byte
    let t = (~q) & 0x20202020u;            // bytes below 32
    r.q[k] = (q ^ 0x20202020u) | (t << 1u) | (t << 2u);   // q - 32 as signed bytes
  }
  let d = f16at(b + Q6_K_D);
  r.d0 = d * i8at(b + Q6_K_SCALES + 8u * h + 2u * kq);
  r.d1 = d * i8at(b + Q6_K_SCALES + 8u * h + 2u * kq + 1u);
  r.m = 0.0;
  return r;
}
//#endif
