// Shared by the expert kernels: byte-addressed reads of the weight arena.
// Block layouts (common/types.h) are packed at any byte offset (a Q6_K row of
// 768 columns is 630 bytes), so every read goes through a byte address.

@group(0) @binding(0) var<storage, read> W: array<u32>;

// The u32 at byte address a (any alignment, little-endian).
fn ld32(a: u32) -> u32 {
  let i = a >> 2u;
  let s = (a & 3u) * 8u;
  if (s == 0u) { return W[i]; }
  return (W[i] >> s) | (W[i + 1u] << (32u - s));
}

fn ld16(a: u32) -> u32 { return ld32(a) & 0xffffu; }
fn ld8(a: u32) -> u32 { return (W[a >> 2u] >> ((a & 3u) * 8u)) & 0xffu; }
fn f16at(a: u32) -> f32 { return unpack2x16float(ld16(a)).x; }

// Sum of the four signed-byte products of a and b (packed int8 x 4).
fn dp4(a: u32, b: u32) -> i32 { return DP4(a, b); }

// Unpacks the 6-bit scale (x) and min (y) of sub-block j of a Q4_K / Q5_K
// block whose 12 scale bytes start at byte address sa (ggml's get_scale_min_k4).
fn k4_scale_min(sa: u32, j: u32) -> vec2<f32> {
  if (j < 4u) {
    return vec2<f32>(f32(ld8(sa + j) & 63u), f32(ld8(sa + j + 4u) & 63u));
  }
  let sc = (ld8(sa + j + 4u) & 0xfu) | ((ld8(sa + j - 4u) >> 6u) << 4u);
  let m = (ld8(sa + j + 4u) >> 4u) | ((ld8(sa + j) >> 6u) << 4u);
  return vec2<f32>(f32(sc), f32(m));
}
