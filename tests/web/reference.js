// Float64 references for the browser worker's kernels, and the activation
// rounding the CPU kernels apply (kernels/quant.c), emulated in f32 with
// Math.fround, so that a reference can take exactly the inputs the kernels see.
'use strict';

// xorshift-based PRNG with a printed seed (fresh inputs each run; ?seed=N repeats one).
function makeRng(seed) {
  let s = BigInt.asUintN(64, BigInt(seed) * 0x9e3779b97f4a7c15n + 1n);
  const next = () => {
    s ^= s << 13n; s = BigInt.asUintN(64, s); s ^= s >> 7n; s ^= s << 17n; s = BigInt.asUintN(64, s);
    return Number(s >> 11n) / 9007199254740992;
  };
  return {
    uniform: next,
    gauss() { let u = 0; while (u === 0) u = next(); return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * next()); },
  };
}

const fr = Math.fround;
const roundEven = (x) => { const r = Math.round(x); return (Math.abs(x % 1) === 0.5 && r % 2 !== 0) ? r - 1 : r; };
const roundAway = (x) => Math.sign(x) * Math.floor(Math.abs(x) + 0.5);

// The activation values a kernel multiplies with: x rounded to Q8_K (mode 0,
// per 256), Q8_0 (mode 1, per 32, f16 scale) or kept (mode 2).
function roundActivations(x, mode) {
  if (mode === 2) return Float64Array.from(x, fr);
  const n = x.length, out = new Float64Array(n), B = mode === 0 ? 256 : 32;
  for (let b = 0; b < n; b += B) {
    let amax = 0, max = 0;
    for (let j = b; j < b + B; j++) { const a = Math.abs(fr(x[j])); if (a > amax) { amax = a; max = fr(x[j]); } }
    if (mode === 0) {
      if (amax === 0) continue;
      const iscale = fr(-127 / max), d = fr(1 / iscale);
      for (let j = b; j < b + B; j++) out[j] = Math.min(127, roundEven(fr(iscale * fr(x[j])))) * d;
    } else {
      const d = fr(amax / 127), id = d ? fr(1 / d) : 0, ds = Math.f16round(d);
      for (let j = b; j < b + B; j++) out[j] = roundAway(fr(fr(x[j]) * id)) * ds;
    }
  }
  return out;
}

// Where the rounding of x to mode's integers is a near thing: for each element
// whose scaled value lies within eps of a rounding boundary, what the
// activation would change by had it rounded the other way (0 elsewhere).
// The reference computes the FFN's intermediate in float64 where a kernel
// uses f32 and WGSL's exp and division (3 + 2|x| and 2.5 ulp), so such an
// element may legitimately round the other way there: up to ~1e-6 relative,
// 1.3e-4 of a step at 127 steps, so eps leaves a margin of eight.
function nearTies(x, mode, eps = 1e-3) {
  const n = x.length, delta = new Float64Array(n), B = mode === 0 ? 256 : 32;
  if (mode === 2) return delta;
  for (let b = 0; b < n; b += B) {
    let amax = 0, max = 0;
    for (let j = b; j < b + B; j++) { const a = Math.abs(fr(x[j])); if (a > amax) { amax = a; max = fr(x[j]); } }
    if (amax === 0) continue;
    let inv, d;
    if (mode === 0) { inv = fr(-127 / max); d = fr(1 / inv); }
    else { const s = fr(amax / 127); inv = s ? fr(1 / s) : 0; d = Math.f16round(s); }
    for (let j = b; j < b + B; j++) {
      const v = fr(inv * fr(x[j])), q = mode === 0 ? Math.min(127, roundEven(v)) : roundAway(v);
      if (Math.abs(Math.abs(v - q) - 0.5) < eps) delta[j] = (v > q ? 1 : -1) * d;
    }
  }
  return delta;
}

// y[r] = sum_c W[r][c] x[c] in float64 (W: rows x cols, row-major Float32Array).
function matvec64(W, rows, cols, x) {
  const y = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    let s = 0;
    const o = r * cols;
    for (let c = 0; c < cols; c++) s += W[o + c] * x[c];
    y[r] = s;
  }
  return y;
}

// The expert FFN of one token in float64: gate * down(silu(G x) * U x).
// actMode: [modes for gate's, up's and down's inputs] to round them as the
// kernels do, or null for exact f32 activations. With actMode, y.flips lists
// how y would move ({at: 0, v}) for each intermediate element whose rounding
// is a near thing (nearTies): a kernel may have rounded any of them the other way.
function expertRef(w, x, gate, actMode) {
  const xg = actMode ? roundActivations(x, actMode[0]) : Float64Array.from(x);
  const xu = actMode ? roundActivations(x, actMode[1]) : xg;
  const g = matvec64(w.gate, w.nFF, w.hidden, xg), u = matvec64(w.up, w.nFF, w.hidden, xu);
  const h = new Float64Array(w.nFF);
  for (let i = 0; i < w.nFF; i++) h[i] = g[i] / (1 + Math.exp(-g[i])) * u[i];
  const ha = actMode ? roundActivations(Float32Array.from(h), actMode[2]) : h;
  const y = matvec64(w.down, w.hidden, w.nFF, ha);
  for (let i = 0; i < y.length; i++) y[i] *= gate;
  y.flips = [];
  if (actMode) {
    const delta = nearTies(Float32Array.from(h), actMode[2]);
    for (let c = 0; c < w.nFF; c++) {
      if (!delta[c]) continue;
      const f = new Float64Array(w.hidden);
      for (let r = 0; r < w.hidden; r++) f[r] = w.down[r * w.nFF + c] * delta[c] * gate;
      y.flips.push({ at: 0, v: f });
    }
  }
  return y;
}

function relL2(a, ref) {
  let num = 0, den = 0;
  for (let i = 0; i < ref.length; i++) { num += (a[i] - ref[i]) ** 2; den += ref[i] ** 2; }
  return Math.sqrt(num / Math.max(den, 1e-300));
}

// relL2 of a against ref once the near-tie roundings that a rounded the
// other way are taken out of the difference: ref.flips (expertRef's, each
// with its offset .at in ref) are applied, one by one, where that brings ref
// closer to a. Returns {err, flipped}.
function relL2Flips(a, ref) {
  const diff = Float64Array.from(ref, (v, i) => a[i] - v);
  let flipped = 0;
  for (const f of ref.flips || []) {
    let gain = 0;
    for (let r = 0; r < f.v.length; r++) gain += diff[f.at + r] ** 2 - (diff[f.at + r] - f.v[r]) ** 2;
    if (gain <= 0) continue;
    for (let r = 0; r < f.v.length; r++) diff[f.at + r] -= f.v[r];
    flipped++;
  }
  let num = 0, den = 0;
  for (let i = 0; i < ref.length; i++) { num += diff[i] ** 2; den += ref[i] ** 2; }
  return { err: Math.sqrt(num / Math.max(den, 1e-300)), flipped };
}

self.makeRng = makeRng;
self.roundActivations = roundActivations;
self.expertRef = expertRef;
self.relL2 = relL2;
self.relL2Flips = relL2Flips;
