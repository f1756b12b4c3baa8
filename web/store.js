// Expert weights for the browser worker: downloaded from the hub
// (GET /v1/expert/L/E, Range resume, XXH3 in X-MoEx-Hash) into the origin
// private file system (OPFS), one directory per model hash:
//   moex/<model_hash>/L-E.part while downloading, L-E.bin once its XXH3
//   (computed in WASM) equals the hub's.
// The browser may evict OPFS data (persist() can be refused), so every load
// hashes the cached bytes again against the hub's hash (asked once per
// session with Range: bytes=0-0) before they reach a GPU buffer or the CPU.
// The rules follow worker/download*.c (docs/PROTOCOL.md, "Expert download").
'use strict';

const DL_RETRIES = 5;
const DL_STALL_MS = 30000;

class StoreError extends Error {
  constructor(msg, lasting) { super(msg); this.lasting = lasting; }   // lasting: retrying cannot help
}

class ExpertStore {
  // http: "http(s)://host:port" of the hub; token: its token; wasm: a MoexWasm for hashing.
  constructor(http, token, wasm, onProgress) {
    this.http = http;
    this.token = token;
    this.wasm = wasm;
    this.onProgress = onProgress || (() => {});
    this.hubHash = new Map();     // "l/e" -> hex, as the hub said in this session
    this.stats = { downloaded: 0, cachedBytes: 0, verifiedBytes: 0, dlSeconds: 0, readSeconds: 0, readBytes: 0 };
  }

  url(path) { return `${this.http}${path}${path.includes('?') ? '&' : '?'}token=${encodeURIComponent(this.token)}`; }

  // GET /v1/model: the model as the hub describes it, with per-expert layouts.
  async fetchModel() {
    const r = await fetch(this.url('/v1/model'), { cache: 'no-store' });
    if (r.status === 403) throw new StoreError('the hub refused the token (403)', true);
    if (!r.ok) throw new StoreError(`GET /v1/model: HTTP ${r.status}`, false);
    const m = await r.json();
    const T = MOEX.TYPE;
    const typeOf = (n) => {
      if (T[n] === undefined) throw new StoreError(`the model uses type ${n}, which this worker does not know`, true);
      return T[n];
    };
    const layoutOf = (d) => ({
      types: [typeOf(d.gate.type), typeOf(d.up.type), typeOf(d.down.type)], hidden: m.n_embd, nFF: d.gate.rows,
      bytes: [d.gate.bytes, d.up.bytes, d.down.bytes], total: d.expert_bytes,
    });
    m.layout = (l, e) => {
      const L = m.layers[l];
      return L.experts ? layoutOf(L.experts[e]) : layoutOf(L);
    };
    m.maxExpertBytes = 0;
    m.allBytes = 0;
    for (let l = 0; l < m.n_layers; l++) {
      for (let e = 0; e < m.n_experts; e++) {
        const b = m.layout(l, e).total;
        m.maxExpertBytes = Math.max(m.maxExpertBytes, b);
        m.allBytes += b;
      }
    }
    this.model = m;
    this.dir = null;
    return m;
  }

  async modelDir() {
    if (!this.dir) {
      const root = await navigator.storage.getDirectory();
      const top = await root.getDirectoryHandle('moex', { create: true });
      this.dir = await top.getDirectoryHandle(this.model.model_hash, { create: true });
    }
    return this.dir;
  }

  async fileSize(name) {
    try {
      const f = await (await (await this.modelDir()).getFileHandle(name)).getFile();
      return f.size;
    } catch (e) {
      return -1;
    }
  }

  async remove(name) {
    try { await (await this.modelDir()).removeEntry(name); } catch (e) { /* absent */ }
  }

  // The hub's hash of an expert (one Range: bytes=0-0 request per session).
  async hashOf(l, e) {
    const k = `${l}/${e}`;
    if (!this.hubHash.has(k)) {
      const r = await fetch(this.url(`/v1/expert/${l}/${e}`), { headers: { Range: 'bytes=0-0' }, cache: 'no-store' });
      if (r.status === 403) throw new StoreError('the hub refused the token (403)', true);
      if (!r.ok) throw new StoreError(`GET /v1/expert/${l}/${e}: HTTP ${r.status}`, r.status === 404);
      await r.arrayBuffer();
      this.hubHash.set(k, (r.headers.get('X-MoEx-Hash') || '').toLowerCase());
    }
    return this.hubHash.get(k);
  }

  // Asks the hub for the hashes of many experts, a few requests at a time
  // (one round trip each would otherwise dominate loading a warm cache).
  async prefetchHashes(list, concurrency = 8) {
    const todo = list.filter(([l, e]) => !this.hubHash.has(`${l}/${e}`));
    const next = async () => { while (todo.length) { const [l, e] = todo.shift(); await this.hashOf(l, e); } };
    await Promise.all(Array.from({ length: Math.min(concurrency, todo.length) }, next));
  }

  // Reads a whole OPFS file (sync access handle: this runs in a Worker).
  async readFile(name) {
    const t0 = performance.now();
    const h = await (await (await this.modelDir()).getFileHandle(name)).createSyncAccessHandle();
    try {
      const buf = new Uint8Array(h.getSize());
      h.read(buf, { at: 0 });
      this.stats.readSeconds += (performance.now() - t0) / 1000;
      this.stats.readBytes += buf.length;
      return buf;
    } finally {
      h.close();
    }
  }

  // An expert's bytes, verified: from the cache when its XXH3 matches the
  // hub's, else downloaded (resuming a .part). stop() abandons between chunks.
  async get(l, e, stop) {
    const lay = this.model.layout(l, e), bin = `${l}-${e}.bin`;
    const want = await this.hashOf(l, e);
    if ((await this.fileSize(bin)) === lay.total) {
      const bytes = await this.readFile(bin);
      if (this.wasm.hash64(bytes) === want) {
        this.stats.verifiedBytes += bytes.length;
        if (!this.counted) this.stats.cachedBytes += bytes.length;
        return bytes;
      }
      await this.remove(bin);   // evicted, truncated or another model's: fetch again
    }
    for (let attempt = 0; attempt < 2; attempt++) {
      const bytes = await this.download(l, e, lay.total, stop);
      if (!bytes) return null;
      const got = this.wasm.hash64(bytes);
      if (got === want) {
        const part = await (await this.modelDir()).getFileHandle(`${l}-${e}.part`);
        await part.move(bin);
        this.stats.downloaded++;
        this.stats.cachedBytes += bytes.length;
        return bytes;
      }
      await this.remove(`${l}-${e}.part`);
      if (attempt === 1) throw new StoreError(`expert (${l}, ${e}): XXH3 ${got} twice, the hub says ${want}`, true);
    }
    return null;
  }

  // Downloads into L-E.part (resuming), retrying a failing connection; returns the bytes.
  async download(l, e, total, stop) {
    const name = `${l}-${e}.part`;
    const fh = await (await this.modelDir()).getFileHandle(name, { create: true });
    let lastErr = null;
    for (let attempt = 0; attempt <= DL_RETRIES; attempt++) {
      if (stop()) return null;
      if (attempt) await new Promise((r) => setTimeout(r, Math.min(5000, 200 * 2 ** attempt)));
      const h = await fh.createSyncAccessHandle();
      try {
        let have = h.getSize();
        if (have > total) { h.truncate(0); have = 0; }
        if (have < total) {
          const ctl = new AbortController();
          let timer = setTimeout(() => ctl.abort(), DL_STALL_MS);
          const t0 = performance.now();
          const r = await fetch(this.url(`/v1/expert/${l}/${e}`), { headers: have ? { Range: `bytes=${have}-` } : {}, signal: ctl.signal, cache: 'no-store' });
          if (r.status === 403) throw new StoreError('the hub refused the token (403)', true);
          if (r.status === 416) { h.truncate(0); throw new Error('range not satisfiable: restarting'); }
          if (r.status !== 200 && r.status !== 206) throw new StoreError(`GET /v1/expert/${l}/${e}: HTTP ${r.status}`, r.status === 404);
          if (r.status === 200 && have) { h.truncate(0); have = 0; }
          const reader = r.body.getReader();
          for (;;) {
            const { done, value } = await reader.read();
            if (done) break;
            clearTimeout(timer);
            timer = setTimeout(() => ctl.abort(), DL_STALL_MS);
            h.write(value, { at: have });
            have += value.length;
            this.onProgress(value.length);
            if (stop()) { ctl.abort(); h.flush(); return null; }
          }
          clearTimeout(timer);
          h.flush();
          this.stats.dlSeconds += (performance.now() - t0) / 1000;
        }
        if (have !== total) throw new Error(`expert (${l}, ${e}): ${have} of ${total} bytes`);
        const buf = new Uint8Array(total);
        h.read(buf, { at: 0 });
        return buf;
      } catch (err) {
        if (err instanceof StoreError && err.lasting) throw err;
        lastErr = err;
      } finally {
        h.close();
      }
    }
    throw new StoreError(`expert (${l}, ${e}): download failed ${DL_RETRIES + 1} times (${lastErr})`, false);
  }

  // Deletes cached experts outside keep while the cache exceeds budget bytes.
  async trim(keep, budget) {
    const dir = await this.modelDir();
    const files = [];
    let total = 0;
    for await (const [name, h] of dir.entries()) {
      if (!name.endsWith('.bin')) continue;
      const size = (await h.getFile()).size;
      total += size;
      files.push([name, size]);
    }
    for (const [name, size] of files) {
      if (total <= budget) break;
      if (keep.has(name.slice(0, -4).replace('-', '/'))) continue;
      await this.remove(name);
      total -= size;
    }
    this.stats.cachedBytes = total;
    this.counted = true;    // from now on the total is the directory's
  }
}

self.ExpertStore = ExpertStore;
self.StoreError = StoreError;
