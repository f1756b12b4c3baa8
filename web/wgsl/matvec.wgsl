// Expert matrix x activations for every job (dispatch) of a layer batch:
//   Y[tok + t][y_col + row] = sum_c W_job[row][c] * act[tok + t][c]  (times GW[tok + t] for down)
// Grid: x = row groups of ROWS rows, y = job, z = token tiles of TB tokens.
// LPR lanes share a row, each taking every LPR-th 32-element unit, then
// their partial sums are added across lanes (subgroup shuffles or shared
// memory: REDUCE). QUANT: weights in blocks x Q8 activations (weights_q.wgsl,
// act.wgsl); else float weights x f32 activations (weights_f.wgsl).
struct Params {
  rows: u32,       // output rows of the matrix
  units: u32,      // 32-element units per row (columns / 32)
  row_bytes: u32,  // bytes per weight row
  which: u32,      // job field holding the matrix's byte address: 0 gate(+up), 1 up, 2 down
  y_stride: u32,   // floats per row of Y
  y_col: u32,      // first column of Y written
  use_gate: u32,   // multiply by the token's gate weight (down)
  job0: u32,       // the group's first job
}

@group(0) @binding(1) var<storage, read> AQ: array<u32>;       // QUANT: 8 words of int8 per unit; else f32 bits
@group(0) @binding(2) var<storage, read> AM: array<vec2<f32>>; // QUANT: (scale, sum of the int8) per unit
@group(0) @binding(3) var<storage, read> JOBS: array<u32>;     // per job: gate, up, down byte address, tok, n_tok, 0, 0, 0
@group(0) @binding(4) var<storage, read_write> Y: array<f32>;
@group(0) @binding(5) var<storage, read> GW: array<f32>;       // gate weight per token row
@group(0) @binding(6) var<uniform> P: Params;

const ROWS = WG / LPR;
//#if !SUBGROUPS
var<workgroup> red: array<f32, WG * TB>;
//#endif

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  let row = wid.x * ROWS + li / LPR;
  let lane = li % LPR;
  let jb = (P.job0 + wid.y) * 8u;
  let w0 = JOBS[jb + P.which];
  let tok = JOBS[jb + 3u];
  let n_tok = JOBS[jb + 4u];
  let t0 = wid.z * TB;
  var acc: array<f32, TB>;
  let live = row < P.rows && t0 < n_tok;
  if (live) {
    let rb = w0 + row * P.row_bytes;
    for (var u = lane; u < P.units; u += LPR) {
//#if QUANT
      let q = load_unit(rb, u);
      for (var t = 0u; t < TB; t++) {
        if (t0 + t < n_tok) {
          let ai = (tok + t0 + t) * P.units + u;
          let s0 = dp4(q.q[0], AQ[8u * ai]) + dp4(q.q[1], AQ[8u * ai + 1u]) + dp4(q.q[2], AQ[8u * ai + 2u]) + dp4(q.q[3], AQ[8u * ai + 3u]);
          let s1 = dp4(q.q[4], AQ[8u * ai + 4u]) + dp4(q.q[5], AQ[8u * ai + 5u]) + dp4(q.q[6], AQ[8u * ai + 6u]) + dp4(q.q[7], AQ[8u * ai + 7u]);
          let am = AM[ai];
          acc[t] += am.x * (q.d0 * f32(s0) + q.d1 * f32(s1) + q.m * am.y);
        }
      }
//#else
      for (var c = 0u; c < 8u; c++) {
        let w4 = load4(rb, 8u * u + c);
        for (var t = 0u; t < TB; t++) {
          if (t0 + t < n_tok) {
            let xi = (tok + t0 + t) * P.units * 32u + 32u * u + 4u * c;
            acc[t] += dot(w4, vec4<f32>(bitcast<f32>(AQ[xi]), bitcast<f32>(AQ[xi + 1u]), bitcast<f32>(AQ[xi + 2u]), bitcast<f32>(AQ[xi + 3u])));
          }
        }
      }
//#endif
    }
  }
//#if SUBGROUPS
  for (var o = LPR / 2u; o > 0u; o = o / 2u) {
    for (var t = 0u; t < TB; t++) { acc[t] += subgroupShuffleXor(acc[t], o); }
  }
//#else
  for (var t = 0u; t < TB; t++) { red[li * TB + t] = acc[t]; }
  workgroupBarrier();
  for (var o = LPR / 2u; o > 0u; o = o / 2u) {
    if (lane < o) {
      for (var t = 0u; t < TB; t++) { red[li * TB + t] += red[(li + o) * TB + t]; }
    }
    workgroupBarrier();
  }
  for (var t = 0u; t < TB; t++) { acc[t] = red[li * TB + t]; }
//#endif
  if (lane == 0u && live) {
    for (var t = 0u; t < TB; t++) {
      if (t0 + t < n_tok) {
        let r = tok + t0 + t;
        var v = acc[t];
        if (P.use_gate != 0u) { v = v * GW[r]; }
        Y[r * P.y_stride + P.y_col + row] = v;
      }
    }
  }
}
