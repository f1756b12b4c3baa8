// The browser worker's kernels against float64 references on fresh random
// inputs: every WGSL expert kernel (each weight type, several shapes, several
// experts and tokens in one batch, with and without subgroups / packed dot
// products) and the WASM CPU path (and its SIMD dot products against the
// portable ones, which must agree bit for bit). Sets window.__result.
'use strict';

(async () => {
  let passed = 0, failed = 0;
  const check = (name, ok, detail = '') => {
    console.log(`${ok ? 'ok  ' : 'FAIL'} ${name} ${detail}`);
    if (ok) passed++; else failed++;
  };
  try {
    const q = new URLSearchParams(location.search);
    const seed = q.has('seed') ? +q.get('seed') : Math.floor(Math.random() * 1e9);
    console.log(`seed ${seed} (repeat with ?seed=${seed})`);
    const rng = makeRng(seed);
    const M = await MoexWasm.load('/');
    const wasm = new MoexWasm(M);
    const T = MOEX.TYPE;
    const name = Object.fromEntries(Object.entries(T).map(([k, v]) => [v, k]));
    const ACT = { 0: 2, 1: 2, 30: 2, 2: 1, 6: 1, 8: 1, 12: 0, 13: 0, 14: 0 };   // act.wgsl mode per weight type
    const gauss = (n, s = 1) => Float32Array.from({ length: n }, () => s * rng.gauss());

    // ---- the WASM SIMD dot products are the portable ones, bit for bit ----
    console.log(`wasm dot products: ${wasm.simdName()}`);
    for (const t of [T.q4_0, T.q5_0, T.q8_0, T.q4_K, T.q5_K, T.q6_K, T.f16]) {
      let same = true, worst = '';
      for (const n of [256, 768, 2048]) {
        for (let r = 0; r < 4; r++) {
          const w = wasm.quantizeRow(t, gauss(n)), x = gauss(n, 3);
          const a = wasm.vecDot(false, t, w, x), b = wasm.vecDot(true, t, w, x);
          if (!Object.is(a, b)) { same = false; worst = `n ${n}: ${a} vs ${b}`; }
        }
      }
      check(`wasm simd dot ${name[t]} equals the portable one`, same, worst);
    }

    // f16 bits of a positive value below 65504 (round to nearest).
    function f16Bits(v) {
      if (v < 2 ** -14) return Math.round(v * 2 ** 24);   // subnormal: steps of 2^-24
      const u = new Uint32Array(new Float32Array([v]).buffer)[0];
      const e = ((u >>> 23) & 0xff) - 127 + 15, m = (u & 0x7fffff) + 0x1000;   // + half an f16 ulp
      return ((e + (m >>> 23)) << 10) | ((m & 0x7fffff) >>> 13);
    }
    // K-quant bytes of random blocks: any bytes are a valid block once its f16
    // scales are set; values spread about as a quantized N(0, sigma) matrix's.
    // The project's quantizer searches each block's scales (~1 us a value in
    // WASM: minutes for the 2048 x 768 experts); the kernels need valid
    // blocks, not well-fitted ones. null for other types.
    function randomKBytes(t, n, sigma) {
      const blockBytes = { [T.q4_K]: 144, [T.q5_K]: 176, [T.q6_K]: 210 }[t];
      if (!blockBytes) return null;
      const b = new Uint8Array((n / 256) * blockBytes);
      for (let i = 0; i < b.length; i++) b[i] = Math.floor(rng.uniform() * 256);
      const dv = new DataView(b.buffer);
      for (let o = 0; o < b.length; o += blockBytes) {
        const u = () => 0.5 + 0.5 * rng.uniform();
        if (t === T.q6_K) {   // x = d sc (q - 32): scales within +-32 keep d a normal f16
          for (let k = 0; k < 16; k++) b[o + 192 + k] = (b[o + 192 + k] & 63) - 32 & 0xff;
          dv.setUint16(o + 208, f16Bits(u() * sigma / 170), true);
        } else {
          dv.setUint16(o, f16Bits(u() * sigma / (t === T.q4_K ? 120 : 250)), true);
          dv.setUint16(o + 2, f16Bits(u() * sigma / 16), true);
        }
      }
      return b;
    }
    // An expert with random weights of the given types (quantized by the
    // project's quantizer, or random K-quant blocks); the reference takes the
    // dequantized weights.
    function makeExpert(types, hidden, nFF) {
      const mats = [[types[0], nFF, hidden], [types[1], nFF, hidden], [types[2], hidden, nFF]];
      const bytes = [], deq = [];
      for (const [t, rows, cols] of mats) {
        const b = randomKBytes(t, rows * cols, 1 / Math.sqrt(cols)) ??
                  wasm.quantizeRow(t, gauss(rows * cols, 1 / Math.sqrt(cols)));
        bytes.push(b);
        deq.push(wasm.dequantizeRow(t, b, rows * cols));
      }
      const all = new Uint8Array(bytes[0].length + bytes[1].length + bytes[2].length);
      all.set(bytes[0]); all.set(bytes[1], bytes[0].length); all.set(bytes[2], bytes[0].length + bytes[1].length);
      return {
        types, hidden, nFF, bytes: all, gate: deq[0], up: deq[1], down: deq[2],
        layout: { types, hidden, nFF, bytes: bytes.map((b) => b.length) },
      };
    }
    // The tokens' outputs one after another, with their near-tie flips (expertRef).
    function reference(ex, x, gates, exactActs) {
      const out = new Float64Array(gates.length * ex.hidden);
      out.flips = [];
      const modes = exactActs ? null : ex.types.map((t) => ACT[t]);
      for (let t = 0; t < gates.length; t++) {
        const y = expertRef(ex, x.subarray(t * ex.hidden, (t + 1) * ex.hidden), gates[t], modes);
        out.set(y, t * ex.hidden);
        for (const f of y.flips) out.flips.push({ at: t * ex.hidden + f.at, v: f.v });
      }
      return out;
    }
    // ---- act.wgsl: the int8 activations and their scales, bit for bit ----
    // The CPU's rounding (reference.js roundActivations, unit by unit):
    // mode 0 per 256 (iscale = -127 / signed max, round half to even, scale
    // 1 / iscale), mode 1 per 32 (d = amax / 127, round half away with 1 / d,
    // scale d rounded to f16), every division and the f16 rounding correctly
    // rounded. The inputs: gaussian rows, then rows built to sit on the edges
    // a GPU's own rounding would get wrong: values halfway between integers
    // after scaling, and blocks whose amax / 127 lies within a few ulp of a
    // point halfway between two f16 values (where a conversion that
    // truncates, as NVIDIA's pack2x16float does, picks the lower one).
    function actRef(x, mode) {
      const fr = Math.fround, B = mode === 0 ? 256 : 32, q = new Int8Array(x.length), scale = new Float32Array(x.length / 32);
      for (let b = 0; b < x.length; b += B) {
        let amax = 0, max = 0;
        for (let j = b; j < b + B; j++) if (Math.abs(x[j]) > amax) { amax = Math.abs(x[j]); max = x[j]; }
        let d = 0;
        if (mode === 0 && amax) {
          const iscale = fr(-127 / max);
          for (let j = b; j < b + B; j++) { const v = fr(iscale * x[j]), r = Math.round(v); q[j] = Math.min(127, (r - v === 0.5 && r % 2) ? r - 1 : r); }
          d = fr(1 / iscale);
        } else if (mode === 1) {
          const dd = fr(amax / 127), id = dd ? fr(1 / dd) : 0;
          for (let j = b; j < b + B; j++) { const v = fr(x[j] * id); q[j] = Math.sign(v) * Math.floor(Math.abs(v) + 0.5); }
          d = Math.f16round(dd);
        }
        for (let u = b / 32; u < (b + B) / 32; u++) scale[u] = d;
      }
      return { q, scale };
    }
    function edgeRows(mode, rows, cols) {
      const x = new Float32Array(rows * cols), fr = Math.fround;
      for (let r = 0; r < rows; r++) {
        for (let u = 0; u < cols / 32; u++) {
          const o = r * cols + u * 32;
          if (r % 2 === 0) {   // halves after scaling: the block's extreme 127 makes the scale 1
            for (let j = 0; j < 32; j++) x[o + j] = (Math.floor(rng.uniform() * 253) - 126) + (j % 2 ? 0.5 : 0);
            x[o + (u % 32)] = mode === 0 ? -127 : 127;
          } else {             // amax / 127 a few ulp from a halfway point between f16 values
            const e = Math.floor(rng.uniform() * 20) - 14, m = 1024 + Math.floor(rng.uniform() * 1023);
            const half = (m + 0.5) * 2 ** (e - 10);
            const ulp = 2 ** (Math.floor(Math.log2(half * 127)) - 23);
            const amax = fr(half * 127 + (Math.floor(rng.uniform() * 7) - 3) * ulp);
            for (let j = 0; j < 32; j++) x[o + j] = fr((rng.uniform() * 2 - 1) * amax);
            x[o + (u % 32)] = u % 2 ? -amax : amax;
          }
        }
      }
      return x;
    }
    async function checkActivations(gpu) {
      const rows = 8, cols = 2048;
      for (const mode of [0, 1]) {
        for (const [what, x] of [['gaussian', gauss(rows * cols, 3)], ['edge cases', edgeRows(mode, rows, cols)]]) {
          const got = await gpu.quantizeActivations(x, rows, cols, mode), want = actRef(x, mode);
          let bad = 0, first = '';
          for (let u = 0; u < rows * cols / 32; u++) {
            let sum = 0, same = Object.is(got.scaleSum[2 * u], want.scale[u]);
            for (let j = u * 32; j < u * 32 + 32; j++) { sum += want.q[j]; same = same && got.q[j] === want.q[j]; }
            same = same && got.scaleSum[2 * u + 1] === sum;
            if (!same && !bad++) first = ` (first: unit ${u}, scale ${got.scaleSum[2 * u]} vs ${want.scale[u]})`;
          }
          check(`webgpu act.wgsl mode ${mode} ${what}: ints, scales and sums equal the CPU's`, bad === 0,
                `${bad} of ${rows * cols / 32} units differ${first}`);
        }
      }
    }

    const flipNote = (n) => (n ? ` after ${n} near-tie rounding${n > 1 ? 's' : ''} taken the other way` : '');

    const combos = [
      [T.q4_K, T.q4_K, T.q6_K], [T.q4_K, T.q4_K, T.q4_K], [T.q5_K, T.q5_K, T.q5_K], [T.q6_K, T.q6_K, T.q6_K],
      [T.q8_0, T.q8_0, T.q8_0], [T.q4_0, T.q4_0, T.q4_0], [T.q5_0, T.q5_0, T.q5_0],
      [T.f16, T.f16, T.f16], [T.bf16, T.bf16, T.bf16], [T.f32, T.f32, T.f32],
      [T.q5_K, T.q8_0, T.q4_0],            // gate and up of different types and activations
      [T.q4_K, T.q5_K, T.q8_0],            // gate and up of different types, the same activations
    ];
    const shapes = [[256, 256, [1, 3]], [512, 768, [5, 1, 9]], [2048, 768, [1, 2]]];  // hidden, n_ff, tokens per expert
    const flavours = [{}, { noSubgroups: true, noDot4: true }];
    const tol = (types) => (types.every((t) => ACT[t] === 2) ? 1e-5 : 2e-3);

    // ---- the CPU path (WASM) ----
    for (const [hidden, nFF, toks] of shapes) {
      for (const types of combos) {
        if (hidden === 2048 && !(types[0] === T.q4_K || types[0] === T.q8_0)) continue;
        const ex = makeExpert(types, hidden, nFF), n = toks[0];
        const x = gauss(n * hidden), gates = Float32Array.from({ length: n }, () => 0.1 + rng.uniform());
        const wp = wasm.stageWeights(ex.bytes);
        const got = wasm.expertFFN(wp, types, hidden, nFF, x, gates);
        M._moex_wasm_free(wp);
        const e = relL2Flips(got, reference(ex, x, gates, false));
        check(`wasm cpu ${types.map((t) => name[t]).join('/')} ${hidden}x${nFF} ${n} tok`, e.err <= tol(types),
              `rel err ${e.err.toExponential(2)}${flipNote(e.flipped)}`);
      }
    }

    // ---- WebGPU ----
    for (const fl of flavours) {
      let gpu;
      try {
        gpu = await GpuExperts.create({ base: '/', ...fl });
      } catch (e) {
        check(`webgpu available (${JSON.stringify(fl)})`, false, String(e));
        continue;
      }
      const caps = gpu.capabilities();
      console.log(`webgpu ${JSON.stringify(fl)}: ${JSON.stringify(caps)}`);
      const label = `${caps.subgroups ? 'subgroups' : 'shared'}+${caps.dot4 ? 'dot4' : 'soft-dot'}`;
      if (!fl.noSubgroups) await checkActivations(gpu);
      gpu.configure(3 * 2048 * 768 * 4 + 256);
      for (const [hidden, nFF, toks] of shapes) {
        for (const types of combos) {
          if (hidden === 2048 && !(types[0] === T.q4_K || types[0] === T.q8_0 || types[0] === T.f16)) continue;
          if (fl.noSubgroups && !(types[2] === T.q6_K || types[0] === T.q5_0 || types[0] === T.f16 || types[1] === T.q8_0)) continue;
          // one expert per token count, all in one batch (one layer's dispatches)
          const experts = toks.map(() => makeExpert(types, hidden, nFF));
          const items = [];
          for (let i = 0; i < toks.length; i++) {
            if (!(await gpu.hold(0, i, experts[i].bytes, experts[i].layout))) throw new Error('no GPU room');
            items.push({ layer: 0, expert: i, x: gauss(toks[i] * hidden), gates: Float32Array.from({ length: toks[i] }, () => 0.1 + rng.uniform()) });
          }
          const outs = await gpu.run(items);
          let worst = 0, flipped = 0, worstExact = 0;
          for (let i = 0; i < items.length; i++) {
            const e = relL2Flips(outs[i], reference(experts[i], items[i].x, items[i].gates, false));
            worst = Math.max(worst, e.err);
            flipped += e.flipped;
            worstExact = Math.max(worstExact, relL2(outs[i], reference(experts[i], items[i].x, items[i].gates, true)));
          }
          const tag = `webgpu ${label} ${types.map((t) => name[t]).join('/')} ${hidden}x${nFF} tokens ${toks.join(',')}`;
          check(tag, worst <= tol(types), `rel err ${worst.toExponential(2)}${flipNote(flipped)}` +
                ` (vs exact f32 activations ${worstExact.toExponential(2)})`);
          for (let i = 0; i < toks.length; i++) gpu.drop(0, i);
        }
      }
      gpu.destroy();
    }
  } catch (e) {
    check('kernel tests ran to the end', false, e.stack || String(e));
  }
  window.__result = { passed, failed };
})();
