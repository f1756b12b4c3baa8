// Times one Qwen3-30B-A3B expert (hidden 2048, ffn 768) on one token: the
// WASM CPU path (SIMD) and WebGPU (the whole run(): upload, four dispatches,
// read-back), and a decode layer's 8 experts in one WebGPU batch; then OPFS
// write / read and XXH3 speeds in a Worker (bench_worker.js). Results in
// window.__result.bench (tests/web/bench_web.py prints them).
'use strict';

(async () => {
  const out = {};
  const median = (a) => a.slice().sort((x, y) => x - y)[a.length >> 1];
  try {
    const rng = makeRng(12345);
    const M = await MoexWasm.load('/');
    const wasm = new MoexWasm(M);
    const T = MOEX.TYPE, H = 2048, F = 768;
    const gauss = (n, s = 1) => Float32Array.from({ length: n }, () => s * rng.gauss());
    const expert = (types) => {
      const parts = [[types[0], F * H], [types[1], F * H], [types[2], H * F]].map(([t, n]) => wasm.quantizeRow(t, gauss(n, 0.02)));
      const all = new Uint8Array(parts.reduce((s, p) => s + p.length, 0));
      let o = 0;
      for (const p of parts) { all.set(p, o); o += p.length; }
      return { bytes: all, layout: { types, hidden: H, nFF: F, bytes: parts.map((p) => p.length) } };
    };
    const x = gauss(H), g = Float32Array.of(0.5);
    for (const [label, types] of [['q4_K_M (q4_K/q4_K/q6_K)', [T.q4_K, T.q4_K, T.q6_K]], ['q8_0', [T.q8_0, T.q8_0, T.q8_0]]]) {
      const ex = expert(types);
      // WASM: V8 starts in its baseline tier, so warm up; time 10 calls at a time (coarse clock).
      const wp = wasm.stageWeights(ex.bytes);
      for (let i = 0; i < 30; i++) wasm.expertFFN(wp, types, H, F, x, g);
      const tw = [];
      for (let r = 0; r < 15; r++) {
        const t0 = performance.now();
        for (let i = 0; i < 10; i++) wasm.expertFFN(wp, types, H, F, x, g);
        tw.push((performance.now() - t0) / 10);
      }
      M._moex_wasm_free(wp);
      out[`wasm ${label} ms`] = median(tw);
    }
    const flavours = { default: {}, 'no dot4': { noDot4: true }, 'no subgroups, no dot4': { noSubgroups: true, noDot4: true } };
    for (const [fname, fl] of Object.entries(flavours)) {
    let gpu;
    try { gpu = await GpuExperts.create({ base: '/', ...fl }); } catch (e) { out.webgpu = String(e); }
    if (gpu && fname !== 'default') {
      gpu.configure(3 * H * F * 4);
      const ex = expert([T.q4_K, T.q4_K, T.q6_K]);
      await gpu.hold(0, 0, ex.bytes, ex.layout);
      const one = [{ layer: 0, expert: 0, x, gates: g }];
      for (let i = 0; i < 5; i++) await gpu.run(one);
      const t1 = [];
      for (let r = 0; r < 9; r++) { const t0 = performance.now(); await gpu.run(one); t1.push(performance.now() - t0); }
      out[`webgpu q4_K_M 1 expert ms (${fname})`] = median(t1);
      gpu.destroy();
      continue;
    }
    if (gpu) {
      out.adapter = gpu.capabilities();
      gpu.configure(3 * H * F * 4);
      for (const [label, types] of [['q4_K_M (q4_K/q4_K/q6_K)', [T.q4_K, T.q4_K, T.q6_K]], ['q8_0', [T.q8_0, T.q8_0, T.q8_0]]]) {
        const exs = [];
        for (let e = 0; e < 8; e++) { exs.push(expert(types)); await gpu.hold(0, e, exs[e].bytes, exs[e].layout); }
        const one = [{ layer: 0, expert: 0, x, gates: g }];
        const eight = exs.map((_, e) => ({ layer: 0, expert: e, x, gates: g }));
        for (let i = 0; i < 5; i++) { await gpu.run(one); await gpu.run(eight); }
        const t1 = [], t8 = [];
        for (let r = 0; r < 15; r++) {
          let t0 = performance.now(); await gpu.run(one); t1.push(performance.now() - t0);
          t0 = performance.now(); await gpu.run(eight); t8.push(performance.now() - t0);
        }
        out[`webgpu ${label} 1 expert ms`] = median(t1);
        out[`webgpu ${label} 8 experts in one batch ms`] = median(t8);
        for (let e = 0; e < 8; e++) gpu.drop(0, e);
      }
      gpu.destroy();
    }
    }
    const w = new Worker('/tests/bench_worker.js');
    out.opfs = await new Promise((res) => { w.onmessage = (ev) => res(ev.data); w.postMessage('go'); });
  } catch (e) {
    out.error = e.stack || String(e);
  }
  console.log(JSON.stringify(out));
  window.__result = { passed: out.error ? 0 : 1, failed: out.error ? 1 : 0, bench: out };
})();
