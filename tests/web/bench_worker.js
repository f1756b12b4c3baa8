// OPFS through a sync access handle (as web/store.js uses it) and XXH3 in
// WASM, in a dedicated Worker: MiB/s for writing, reading and hashing 64 MiB.
'use strict';
importScripts('/moex_wasm.js', '/moex_constants.js', '/wasm_api.js');

onmessage = async () => {
  const MiB = 1 << 20, N = 64;
  const res = {};
  try {
    const dir = await navigator.storage.getDirectory();
    const fh = await dir.getFileHandle('bench.bin', { create: true });
    const h = await fh.createSyncAccessHandle();
    const chunk = new Uint8Array(MiB);
    for (let i = 0; i < MiB; i++) chunk[i] = (i * 2654435761) >>> 24;
    let t0 = performance.now();
    for (let i = 0; i < N; i++) h.write(chunk, { at: i * MiB });
    h.flush();
    res.writeMiBs = N / ((performance.now() - t0) / 1000);
    const all = new Uint8Array(N * MiB);
    t0 = performance.now();
    h.read(all, { at: 0 });
    res.readMiBs = N / ((performance.now() - t0) / 1000);
    h.close();
    await dir.removeEntry('bench.bin');
    const wasm = new MoexWasm(await MoexWasm.load('/'));
    wasm.hash64(all.subarray(0, 4 * MiB));
    t0 = performance.now();
    wasm.hash64(all);
    res.xxh3MiBs = N / ((performance.now() - t0) / 1000);
  } catch (e) {
    res.error = String(e);
  }
  postMessage(res);
};
