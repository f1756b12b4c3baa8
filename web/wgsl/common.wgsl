// Shared by the expert kernels: byte-addressed reads of the weight arena.
// Block layouts (common/types.h) are packed at any byte offset (a Q6_K row of
// 768 columns is 630 bytes), so every read goes through a byte address.

@group(0) @binding(0) var<storage, read> W: array<u32>;

// The u32 at byte address a (any alignment, little-endian).
fn ld32(a: u32) -> u32 {
  let i = a >> 2u;
  let s = (a & 3u) * 8u;
  let lo = W[i];
  // Branch-free: for s = 0 the shift by 32 - s would be by 32 (taken mod 32), so select lo.
  return select((lo >> s) | (W[i + 1u] << (32u - s)), lo, s == 0u);
}

fn ld16(a: u32) -> u32 { return ld32(a) & 0xffffu; }
fn ld8(a: u32) -> u32 { return (W[a >> 2u] >> ((a & 3u) * 8u)) & 0xffu; }
fn f16at(a: u32) -> f32 { return unpack2x16float(ld16(a)).x; }

// Sum of the four signed-byte products of a and b (packed int8 x 4).
fn dp4(a: u32, b: u32) -> i32 { return DP4(a, b); }

// Unpacks the 6-bit scale (x) and min (y) of sub-block j of a Q4_K / Q5_K
// block whose 12 scale bytes q[0..11] start at byte address sa (ggml's
// get_scale_min_k4), branch-free from three words:
//   j < 4: sc = q[j] & 63, m = q[j + 4] & 63
//   else:  sc = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4, m = q[j + 4] >> 4 | (q[j] >> 6) << 4
fn k4_scale_min(sa: u32, j: u32) -> vec2<f32> {
  let w0 = ld32(sa);
  let w1 = ld32(sa + 4u);
  let w2 = ld32(sa + 8u);
  let sh = (j & 3u) * 8u;
  let lo = j < 4u;
  let qj = (select(w1, w0, lo) >> sh) & 0xffu;
  let qj4 = (select(w2, w1, lo) >> sh) & 0xffu;
  let qjm4 = (w0 >> sh) & 0xffu;
  let sc = select((qj4 & 0xfu) | ((qjm4 >> 6u) << 4u), qj & 63u, lo);
  let m = select((qj4 >> 4u) | ((qj >> 6u) << 4u), qj4 & 63u, lo);
  return vec2<f32>(f32(sc), f32(m));
}
