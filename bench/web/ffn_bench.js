// The browser worker's WGSL expert FFN (web/gpu.js, web/wgsl/) timed on
// whatever WebGPU adapter there is: one Qwen3-30B-A3B expert (hidden 2048,
// ffn 768) as q4_K_M (gate q4_K, up q4_K, down q6_K) and q8_0, one token on
// one expert, and a decode layer's batch (8 experts, one token each). Each
// case is first checked against a float64 reference of the same weights and
// the kernels' activation rounding (tests/web/reference.js), then timed: the
// whole GpuExperts.run() (x written, four passes in one submission, one
// read-back) and, where the adapter has timestamp-query, the compute pass
// alone on the GPU's clock.
//
// A classic script for node (bench_wgsl_ffn.mjs loads it with gpu.js and
// reference.js) or a page: self.moexFfnBench(opts, log) resolves to
// {adapter, cases: [...]}; it needs GpuExperts, makeRng, expertRef, relL2Flips.
'use strict';

(() => {
  const H = 2048, F = 768;
  const TYPES = { q4_K: 12, q6_K: 14, q8_0: 8 };
  const CASES = [['q4_K_M', [TYPES.q4_K, TYPES.q4_K, TYPES.q6_K]], ['q8_0', [TYPES.q8_0, TYPES.q8_0, TYPES.q8_0]]];
  // weight type -> [block elements, block bytes, activation rounding of its input (act.wgsl's mode)]
  const BLOCK = { 12: [256, 144, 0], 14: [256, 210, 0], 8: [32, 34, 1] };
  const F16_2M10 = 0x1400, F16_2M12 = 0x0c00, F16_2M14 = 0x0400;   // 2^-10, 2^-12, 2^-14 as f16 bits

  // xorshift32: the weights' bytes (megabytes: makeRng's BigInt steps would take seconds).
  function words(state) {
    return () => { let x = state.s; x ^= x << 13; x ^= x >>> 17; x ^= x << 5; return (state.s = x >>> 0); };
  }

  // Random blocks of type t with scales that keep the weights small and finite.
  function randomMatrix(next, t, rows, cols) {
    const [be, bb] = BLOCK[t], nb = rows * cols / be, out = new Uint8Array(Math.ceil(nb * bb / 4) * 4);
    const w = new Uint32Array(out.buffer);
    for (let i = 0; i < w.length; i++) w[i] = next();
    const dv = new DataView(out.buffer);
    for (let b = 0; b < nb; b++) {
      const o = b * bb;
      if (t === TYPES.q4_K) { dv.setUint16(o, F16_2M12, true); dv.setUint16(o + 2, F16_2M14, true); }
      if (t === TYPES.q8_0) dv.setUint16(o, F16_2M10, true);
      if (t === TYPES.q6_K) {
        for (let s = 0; s < 16; s++) dv.setInt8(o + 192 + s, (next() % 33) - 16);   // int8 scales in [-16, 16]
        dv.setUint16(o + 208, F16_2M10, true);
      }
    }
    return out.subarray(0, nb * bb);
  }

  const f16 = (h) => {   // an f16 bit pattern's value (the ones above: normal numbers)
    const e = (h >> 10) & 31, m = h & 1023;
    return (h & 0x8000 ? -1 : 1) * (e ? 2 ** (e - 15) * (1 + m / 1024) : 2 ** -14 * (m / 1024));
  };
  const k4 = (q, j) => j < 4 ? [q[j] & 63, q[j + 4] & 63]
    : [(q[j + 4] & 15) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)];

  // Weights as f32 (as kernels/quant.c dequantizes them), row-major rows x cols.
  function dequantize(t, bytes, n) {
    const y = new Float32Array(n), dv = new DataView(bytes.buffer, bytes.byteOffset), fr = Math.fround;
    const [be, bb] = BLOCK[t];
    for (let b = 0; b < n / be; b++) {
      const o = b * bb, base = b * be;
      if (t === TYPES.q8_0) {
        const d = f16(dv.getUint16(o, true));
        for (let j = 0; j < 32; j++) y[base + j] = fr(d * dv.getInt8(o + 2 + j));
      } else if (t === TYPES.q4_K) {
        const d = f16(dv.getUint16(o, true)), dmin = f16(dv.getUint16(o + 2, true));
        const sc = bytes.subarray(o + 4, o + 16), q = bytes.subarray(o + 16, o + 144);
        for (let g = 0; g < 4; g++) {
          const [s0, m0] = k4(sc, 2 * g), [s1, m1] = k4(sc, 2 * g + 1);
          for (let l = 0; l < 32; l++) {
            y[base + 64 * g + l] = fr(fr(d * s0) * (q[32 * g + l] & 15) - fr(dmin * m0));
            y[base + 64 * g + 32 + l] = fr(fr(d * s1) * (q[32 * g + l] >> 4) - fr(dmin * m1));
          }
        }
      } else {   // q6_K
        const d = f16(dv.getUint16(o + 208, true));
        for (let h = 0; h < 2; h++) {
          const ql = bytes.subarray(o + 64 * h, o + 64 * h + 64), qh = bytes.subarray(o + 128 + 32 * h, o + 160 + 32 * h);
          for (let l = 0; l < 32; l++) {
            const is = (l >> 4) + 8 * h, s = (k) => dv.getInt8(o + 192 + is + k);
            const q = [((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32, ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32,
              ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32, ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32];
            for (let k = 0; k < 4; k++) y[base + 128 * h + l + 32 * k] = fr(fr(d * s(2 * k)) * q[k]);
          }
        }
      }
    }
    return y;
  }

  function makeExpert(next, types) {
    const parts = [randomMatrix(next, types[0], F, H), randomMatrix(next, types[1], F, H), randomMatrix(next, types[2], H, F)];
    const bytes = new Uint8Array(parts.reduce((s, p) => s + p.length, 0));
    let o = 0;
    for (const p of parts) { bytes.set(p, o); o += p.length; }
    return {
      bytes, layout: { types, hidden: H, nFF: F, bytes: parts.map((p) => p.length) },
      ref: () => ({ hidden: H, nFF: F, gate: dequantize(types[0], parts[0], F * H), up: dequantize(types[1], parts[1], F * H),
                    down: dequantize(types[2], parts[2], H * F) }),
    };
  }

  const quantile = (a, q) => { const s = a.slice().sort((x, y) => x - y); return s[Math.min(s.length - 1, Math.floor(q * s.length))]; };
  const stats = (a) => a.length ? { p10: quantile(a, 0.1), p50: quantile(a, 0.5), p90: quantile(a, 0.9), n: a.length } : null;

  // Timestamps around the compute pass of every submission while `on`:
  // the encoder's beginComputePass gets timestampWrites, finish() resolves
  // them into a buffer the caller reads after the run.
  function passTimer(device) {
    if (!device.features.has('timestamp-query')) return null;
    const U = GPUBufferUsage, t = { on: false, pending: false };
    t.qs = device.createQuerySet({ type: 'timestamp', count: 2 });
    t.resolve = device.createBuffer({ size: 16, usage: U.QUERY_RESOLVE | U.COPY_SRC });
    t.read = device.createBuffer({ size: 16, usage: U.MAP_READ | U.COPY_DST });
    const createEncoder = device.createCommandEncoder.bind(device);
    device.createCommandEncoder = (d) => {
      const enc = createEncoder(d);
      if (!t.on) return enc;
      const begin = enc.beginComputePass.bind(enc), finish = enc.finish.bind(enc);
      enc.beginComputePass = (pd) => {
        t.pending = true;   // this run's pass writes the timestamps
        return begin({ ...(pd || {}), timestampWrites: { querySet: t.qs, beginningOfPassWriteIndex: 0, endOfPassWriteIndex: 1 } });
      };
      enc.finish = (fd) => { enc.resolveQuerySet(t.qs, 0, 2, t.resolve, 0); enc.copyBufferToBuffer(t.resolve, 0, t.read, 0, 16); return finish(fd); };
      return enc;
    };
    t.lastUs = async () => {   // null when the run did not go through the patched encoder
      if (!t.pending) return null;
      t.pending = false;
      await t.read.mapAsync(GPUMapMode.READ);
      const v = new BigUint64Array(t.read.getMappedRange().slice(0));
      t.read.unmap();
      return Number(v[1] - v[0]) / 1000;
    };
    return t;
  }

  // Opens the adapter (GpuExperts.create throws 'WebGPU: no adapter' when there is none).
  async function open(opts, log, first) {
    const gpu = await GpuExperts.create({ base: opts.base || '', timestamps: true });
    const caps = gpu.capabilities();
    let timer = null;
    try { timer = passTimer(gpu.device); } catch (e) { if (first) log(`no GPU timestamps: ${e.message || e}`); }
    if (first) {
      log(`adapter: ${caps.adapter}${caps.fallbackAdapter ? ' (fallback adapter)' : ''}, subgroups ${caps.subgroups} ` +
          `(min ${caps.subgroupMinSize}), dot4 ${caps.dot4}, max storage binding ${caps.maxStorageBufferBindingSize}`);
      if (!timer) log('no timestamp-query: wall time only');
    }
    return { gpu, caps, timer };
  }

  self.moexFfnBench = async function moexFfnBench(opts = {}, log = console.log) {
    const reps = opts.reps || 30, seed = opts.seed || 12345, rng = makeRng(seed), next = words({ s: seed >>> 0 || 1 });
    log(`seed ${seed}, ${reps} timed runs per case`);
    const cases = [];
    let adapter = null;
    for (const [label, types] of CASES) {
      // a device per weight type: the slots are sized for one expert size
      const { gpu, caps, timer } = await open(opts, log, !adapter);
      adapter = caps;
      const experts = [];
      for (let e = 0; e < 8; e++) experts.push(makeExpert(next, types));
      gpu.configure(experts[0].bytes.length);
      for (let e = 0; e < 8; e++) if (!(await gpu.hold(0, e, experts[e].bytes, experts[e].layout))) throw new Error('the GPU has no room for 8 experts');
      await gpu.warmUp([{ types, hidden: H, nFF: F }]);
      const xs = experts.map(() => Float32Array.from({ length: H }, () => rng.gauss()));
      const item = (e) => ({ layer: 0, expert: e, x: xs[e], gates: Float32Array.of(0.5) });
      const batches = { '1 expert x 1 token': [item(0)], '8 experts x 1 token': experts.map((_, e) => item(e)) };
      const modes = types.map((t) => BLOCK[t][2]), refs = [];
      const refOf = (k) => refs[k] || (refs[k] = expertRef(experts[k].ref(), xs[k], 0.5, modes));
      for (const [shape, items] of Object.entries(batches)) {
        const outs = await gpu.run(items);
        let err = 0;
        for (let k = 0; k < items.length; k++) err = Math.max(err, relL2Flips(outs[k], refOf(k)).err);
        for (let i = 0; i < 5; i++) await gpu.run(items);
        const wall = [], pass = [];
        for (let r = 0; r < reps; r++) {
          if (timer) timer.on = true;
          const t0 = performance.now();
          await gpu.run(items);
          wall.push(performance.now() - t0);
          if (timer) {
            timer.on = false;
            const us = await timer.lastUs();
            if (us !== null) pass.push(us);
          }
        }
        const c = { type: label, shape, relL2: err, ok: err <= 2e-3, wallMs: stats(wall), gpuPassUs: stats(pass) };
        cases.push(c);
        log(`${label} ${shape}: relL2 ${err.toExponential(2)}${c.ok ? '' : ' (WRONG: above 2e-3)'}, run() p50 ${c.wallMs.p50.toFixed(3)} ms ` +
            `(p10 ${c.wallMs.p10.toFixed(3)}, p90 ${c.wallMs.p90.toFixed(3)})` +
            (c.gpuPassUs ? `, compute pass p50 ${c.gpuPassUs.p50.toFixed(1)} us (p10 ${c.gpuPassUs.p10.toFixed(1)}, p90 ${c.gpuPassUs.p90.toFixed(1)})` : ''));
      }
      gpu.destroy();
    }
    return { adapter, seed, cases };
  };
})();
