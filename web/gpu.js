// Experts on WebGPU: held experts live in slots of a few large GPU buffers
// (arenas), uploaded once from their downloaded bytes (never through the
// WASM heap); a layer batch (every DISPATCH queued for one layer: all its
// experts and tokens) runs as one chain of dispatches in one submission:
//   act(x) -> gate|up products -> act(silu(g) * u) -> down products x gate weight
// then one read-back. Kernels: wgsl/*.wgsl, specialised per weight type,
// tile and reduction flavour (subgroup shuffles where the adapter has them,
// packed int8 dot products where WGSL has them, shared memory and unpacked
// bytes otherwise). Activations are rounded to Q8 as the CPU kernels round
// them (act.wgsl), so results match the native worker's to float rounding.
'use strict';

// weight type -> [kernel flavour, activation mode of act.wgsl (0 Q8_K, 1 Q8_0, 2 f32)]; block elements and
// bytes come from the C headers (MOEX.BLOCK, moex_constants.js)
const GPU_TYPES = {
  [MOEX.TYPE.f32]: ['f32', 2], [MOEX.TYPE.f16]: ['f16', 2], [MOEX.TYPE.bf16]: ['bf16', 2],
  [MOEX.TYPE.q4_0]: ['q4_0', 1], [MOEX.TYPE.q5_0]: ['q5_0', 1], [MOEX.TYPE.q8_0]: ['q8_0', 1],
  [MOEX.TYPE.q4_K]: ['q4_K', 0], [MOEX.TYPE.q5_K]: ['q5_K', 0], [MOEX.TYPE.q6_K]: ['q6_K', 0],
};

const SLOT_ALIGN = 256;
const PARAM_SLOT = 256;         // minUniformBufferOffsetAlignment upper bound
const MAX_ARENA = 512 << 20;    // bytes per weight buffer at most

// Keeps the lines of src between //#if X and //#endif (or //#else) whose
// condition holds: X is a flag in flags, or a type name equal to type.
function preprocess(src, flags, type) {
  const out = [];
  let keep = true;
  for (const line of src.split('\n')) {
    const m = line.match(/^\s*\/\/#(if|else|endif)\s*(!?)(\w*)/);
    if (!m) { if (keep) out.push(line); continue; }
    if (m[1] === 'if') {
      const v = flags[m[3]] !== undefined ? !!flags[m[3]] : m[3] === type;
      keep = m[2] === '!' ? !v : v;
    } else if (m[1] === 'else') keep = !keep;
    else keep = true;
  }
  return out.join('\n');
}

function isGpuType(t) { return GPU_TYPES[t] !== undefined; }

class GpuExperts {
  // Opens the adapter and device; throws when WebGPU is unavailable.
  // opts.base: URL prefix of the wgsl/ files; opts.noSubgroups / noDot4: force the fallbacks (tests);
  // opts.timestamps: ask for timestamp-query where the adapter has it (benchmarks).
  static async create(opts = {}) {
    if (typeof navigator === 'undefined' || !navigator.gpu) throw new Error('this browser has no WebGPU (navigator.gpu)');
    const adapter = await navigator.gpu.requestAdapter({ powerPreference: 'high-performance' });
    if (!adapter) throw new Error('WebGPU: no adapter');
    const want = [];
    if (adapter.features.has('subgroups') && !opts.noSubgroups) want.push('subgroups');
    if (adapter.features.has('timestamp-query') && opts.timestamps) want.push('timestamp-query');
    const lim = adapter.limits;
    const device = await adapter.requestDevice({
      requiredFeatures: want,
      requiredLimits: {
        maxStorageBufferBindingSize: lim.maxStorageBufferBindingSize,
        maxBufferSize: lim.maxBufferSize,
        maxComputeWorkgroupStorageSize: lim.maxComputeWorkgroupStorageSize,
        maxStorageBuffersPerShaderStage: Math.max(6, Math.min(lim.maxStorageBuffersPerShaderStage, 8)),
      },
    });
    const g = new GpuExperts(adapter, device, opts);
    await g.loadSources(opts.base || '');
    return g;
  }

  constructor(adapter, device, opts) {
    this.adapter = adapter;
    this.device = device;
    const info = adapter.info || {};
    this.subgroups = device.features.has('subgroups');
    this.subgroupMin = info.subgroupMinSize || 0;
    this.dot4 = !opts.noDot4 && !!(navigator.gpu.wgslLanguageFeatures &&
      navigator.gpu.wgslLanguageFeatures.has('packed_4x8_integer_dot_product'));
    this.description = [info.vendor, info.architecture, info.device, info.description].filter((s) => s).join(' ') || 'unknown adapter';
    this.fallbackAdapter = !!(info.isFallbackAdapter || adapter.isFallbackAdapter);
    this.lost = null;            // the reason once the device is lost
    this.lostHandlers = [];
    device.lost.then((i) => {
      this.lost = `${i.reason || 'unknown'}: ${i.message || ''}`;
      for (const f of this.lostHandlers) f(this.lost);
    });
    this.pipelines = new Map();
    this.arenas = [];            // {buffer, bytes, free: [offsets]}
    this.slots = new Map();      // "l/e" -> {arena, offset, layout}
    this.slotBytes = 0;
    this.bufs = {};              // grow-only batch buffers
    this.maxArena = Math.min(MAX_ARENA, device.limits.maxStorageBufferBindingSize, device.limits.maxBufferSize);
  }

  onLost(f) { this.lostHandlers.push(f); }

  capabilities() {
    const l = this.device.limits;
    return {
      adapter: this.description, fallbackAdapter: this.fallbackAdapter, subgroups: this.subgroups,
      subgroupMinSize: this.subgroupMin, dot4: this.dot4,
      maxStorageBufferBindingSize: l.maxStorageBufferBindingSize, maxBufferSize: l.maxBufferSize,
      maxComputeInvocationsPerWorkgroup: l.maxComputeInvocationsPerWorkgroup,
    };
  }

  async loadSources(base) {
    const get = async (n) => {
      const r = await fetch(base + 'wgsl/' + n);
      if (!r.ok) throw new Error(`cannot load wgsl/${n}: HTTP ${r.status}`);
      return r.text();
    };
    const [common, wq, wf, mv, act] = await Promise.all(['common.wgsl', 'weights_q.wgsl', 'weights_f.wgsl',
      'matvec.wgsl', 'act.wgsl'].map(get));
    this.src = { common, wq, wf, mv, act };
  }

  // ---- pipelines ----

  // One bind group layout per kernel kind, shared by all its variants:
  // matvec: W, AQ, AM, JOBS, Y (read-write), GW, params; act: SRC, AQ, AM (read-write), params.
  layout(kind) {
    if (!this.layouts) {
      const C = GPUShaderStage.COMPUTE;
      const e = (kinds) => kinds.map((type, binding) => ({ binding, visibility: C, buffer: { type } }));
      const mk = (kinds) => {
        const bgl = this.device.createBindGroupLayout({ entries: e(kinds) });
        return { bgl, pl: this.device.createPipelineLayout({ bindGroupLayouts: [bgl] }) };
      };
      this.layouts = {
        mv: mk(['read-only-storage', 'read-only-storage', 'read-only-storage', 'read-only-storage', 'storage', 'read-only-storage', 'uniform']),
        act: mk(['read-only-storage', 'storage', 'storage', 'uniform']),
      };
    }
    return this.layouts[kind];
  }

  async pipeline(key, code) {
    let p = this.pipelines.get(key);
    if (!p) {
      const module = this.device.createShaderModule({ code, label: key });
      const layout = this.layout(key.startsWith('act') ? 'act' : 'mv').pl;
      p = this.device.createComputePipelineAsync({ layout, compute: { module, entryPoint: 'main' }, label: key });
      this.pipelines.set(key, p);
    }
    return p;
  }

  // Lanes per row for rows of `units` units: with subgroups, no more than the
  // smallest subgroup, so that the reduction needs no barrier.
  lanes(units) {
    const l = lanesPerRow(units);
    return this.subgroups && this.subgroupMin >= 1 ? Math.min(l, this.subgroupMin) : l;
  }

  // The matrix kernel for weight type t, lanes per row lpr, tb tokens per tile.
  matvecPipeline(t, lpr, tb) {
    const [name, mode] = GPU_TYPES[t];
    const sg = this.subgroups && this.subgroupMin >= lpr;
    const quant = mode !== 2;
    const flags = { SUBGROUPS: sg, QUANT: quant };
    const dp4 = this.dot4 ? 'dot4I8Packed' : 'dp4_soft';
    const code = [
      sg ? 'enable subgroups;' : '',
      `const WG = 64u; const LPR = ${lpr}u; const TB = ${tb}u;`,
      'fn dp4_soft(a: u32, b: u32) -> i32 {',
      '  var s = 0;',
      '  for (var i = 0u; i < 32u; i += 8u) { s += (i32(a << (24u - i)) >> 24u) * (i32(b << (24u - i)) >> 24u); }',
      '  return s;',
      '}',
      MOEX.WGSL_BLOCKS,   // the block layouts' sizes and offsets (Q6_K_BYTES, ...), from the C headers
      this.src.common.replace('DP4(', dp4 + '('),
      preprocess(quant ? this.src.wq : this.src.wf, {}, name),
      preprocess(this.src.mv, flags, name),
    ].join('\n');
    return this.pipeline(`mv|${name}|${lpr}|${tb}|${sg ? 'sg' : 'sh'}|${this.dot4 ? 'dp4' : 'soft'}`, code);
  }

  actPipeline() { return this.pipeline('act', this.src.act); }

  // Every pipeline the shapes need, so that the first dispatch does not wait.
  async warmUp(layouts) {
    const ps = [this.actPipeline()];
    for (const lay of layouts) {
      for (const tb of [1, 2, 4, 8]) {
        for (const [t, cols] of [[lay.types[0], lay.hidden], [lay.types[1], lay.hidden], [lay.types[2], lay.nFF]])
          ps.push(this.matvecPipeline(t, this.lanes(cols / 32), tb));
      }
    }
    await Promise.all(ps);
  }

  // ---- weights ----

  // Sizes the slots for the model's largest expert (bytes).
  configure(maxExpertBytes) {
    this.slotBytes = Math.ceil(maxExpertBytes / SLOT_ALIGN) * SLOT_ALIGN;
    if (this.slotBytes > this.maxArena) throw new Error(`an expert of ${maxExpertBytes} bytes exceeds the GPU's buffer limit ${this.maxArena}`);
  }

  holds(l, e) { return this.slots.has(`${l}/${e}`); }
  get nHeld() { return this.slots.size; }

  // A free slot, growing the arenas; null when the GPU has no room (out of memory).
  async freeSlot() {
    for (const a of this.arenas) if (a.free.length) return { arena: a, offset: a.free.pop() };
    const perArena = Math.max(1, Math.floor(this.maxArena / this.slotBytes));
    const n = Math.min(perArena, Math.max(4, this.slots.size));   // grow by at least 4 slots, doubling
    this.device.pushErrorScope('out-of-memory');
    this.device.pushErrorScope('validation');
    const buffer = this.device.createBuffer({ size: n * this.slotBytes, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST, label: `experts ${this.arenas.length}` });
    const verr = await this.device.popErrorScope();
    const oom = await this.device.popErrorScope();
    if (oom || verr) { buffer.destroy(); return null; }
    const a = { buffer, free: [] };
    for (let i = n - 1; i >= 1; i--) a.free.push(i * this.slotBytes);
    this.arenas.push(a);
    return { arena: a, offset: 0 };
  }

  // Uploads an expert (bytes: gate|up|down). Returns false when the GPU has no room.
  // layout: {types: [g, u, d], hidden, nFF, bytes: [gate, up, down]}.
  async hold(l, e, bytes, layout) {
    if (this.lost) throw new Error(`WebGPU device lost (${this.lost})`);
    for (const t of layout.types) if (!isGpuType(t)) throw new Error(`weight type ${t} has no WebGPU kernel`);
    const key = `${l}/${e}`;
    let s = this.slots.get(key);
    if (!s) {
      const free = await this.freeSlot();
      if (!free) return false;
      s = { arena: free.arena, offset: free.offset, layout };
      this.slots.set(key, s);
    }
    s.layout = layout;
    const padded = bytes.length % 4 ? bytes.length + 4 - bytes.length % 4 : bytes.length;
    if (padded !== bytes.length) { const b = new Uint8Array(padded); b.set(bytes); bytes = b; }
    this.device.queue.writeBuffer(s.arena.buffer, s.offset, bytes);
    return true;
  }

  drop(l, e) {
    const key = `${l}/${e}`, s = this.slots.get(key);
    if (!s) return;
    s.arena.free.push(s.offset);
    this.slots.delete(key);
  }

  // ---- a layer batch ----

  buffer(name, bytes, usage) {
    const b = this.bufs[name];
    if (b && b.size >= bytes) return b;
    if (b) b.destroy();
    const size = Math.max(256, Math.ceil(Math.max(bytes, (b ? b.size : 0) * 1.5) / 256) * 256);
    return (this.bufs[name] = this.device.createBuffer({ size, usage, label: name }));
  }

  // items: [{layer, expert, x: Float32Array (n x hidden), gates: Float32Array (n)}], all held.
  // Returns one Float32Array (n x hidden, gate-weighted) per item, in order.
  async run(items) {
    if (this.lost) throw new Error(`WebGPU device lost (${this.lost})`);
    const plan = this.planBatch(items);
    const bufs = this.stageBatch(plan);
    const passes = await this.chainPasses(plan, bufs);
    const all = await this.submitAndRead(passes, bufs, 4 * plan.rows * plan.hidden);
    const outs = [];
    for (const g of plan.groups) {
      for (const j of g.jobs) outs[items.indexOf(j.it)] = all.subarray(j.tok * plan.hidden, (j.tok + j.n) * plan.hidden);
    }
    return outs;
  }

  // Groups the items (those sharing an arena and a layout run in one chain),
  // each group's token rows contiguous: rows of X, GU, AQ, AM and OUT are the
  // batch's token rows, a group's from its first job's tok on.
  planBatch(items) {
    const groups = new Map();
    let maxCols = 0, maxGU = 0, hidden = 0;
    for (const it of items) {
      const s = this.slots.get(`${it.layer}/${it.expert}`);
      if (!s) throw new Error(`expert (${it.layer}, ${it.expert}) is not on the GPU`);
      const lay = s.layout;
      hidden = lay.hidden;
      const k = `${this.arenas.indexOf(s.arena)}|${lay.types.join(',')}|${lay.nFF}`;
      if (!groups.has(k)) groups.set(k, { arena: s.arena, lay, jobs: [] });
      groups.get(k).jobs.push({ it, s, tok: 0, n: it.gates.length });
      maxCols = Math.max(maxCols, lay.hidden, lay.nFF);
      maxGU = Math.max(maxGU, 2 * lay.nFF);
    }
    let rows = 0, nJobs = 0;
    for (const g of groups.values()) {
      g.jobBase = nJobs;
      nJobs += g.jobs.length;
      for (const j of g.jobs) { j.tok = rows; rows += j.n; }
    }
    return { groups: [...groups.values()], rows, maxCols, maxGU, hidden };
  }

  // The batch's buffers (grown, reused), with x, the gate weights and the job table written.
  stageBatch(plan) {
    const S = GPUBufferUsage, { rows, hidden, maxCols } = plan;
    const b = {
      X: this.buffer('x', 4 * rows * hidden, S.STORAGE | S.COPY_DST),
      GW: this.buffer('gw', 4 * rows, S.STORAGE | S.COPY_DST),
      AQ: this.buffer('aq', 4 * rows * maxCols, S.STORAGE),
      AM: this.buffer('am', 8 * rows * Math.ceil(maxCols / 32), S.STORAGE),
      GU: this.buffer('gu', 4 * rows * plan.maxGU, S.STORAGE),
      OUT: this.buffer('out', 4 * rows * hidden, S.STORAGE | S.COPY_SRC),
      READ: this.buffer('read', 4 * rows * hidden, S.MAP_READ | S.COPY_DST),
    };
    const xAll = new Float32Array(rows * hidden), gAll = new Float32Array(rows), jobWords = [];
    for (const g of plan.groups) {
      for (const j of g.jobs) {
        xAll.set(j.it.x, j.tok * hidden);
        gAll.set(j.it.gates, j.tok);
        const bytes = j.s.layout.bytes, o = j.s.offset;
        jobWords.push(o, o + bytes[0], o + bytes[0] + bytes[1], j.tok, j.n, 0, 0, 0);
      }
    }
    b.JOBS = this.buffer('jobs', 4 * jobWords.length, S.STORAGE | S.COPY_DST);
    const q = this.device.queue;
    q.writeBuffer(b.X, 0, xAll);
    q.writeBuffer(b.GW, 0, gAll);
    q.writeBuffer(b.JOBS, 0, new Uint32Array(jobWords));
    return b;
  }

  // Each group's chain, as [pipeline, params (8 u32), bindings, grid]:
  // act(x) -> gate|up -> act(silu(g) u) -> down x gate weight.
  async chainPasses(plan, b) {
    const passes = [], act = await this.actPipeline();
    for (const g of plan.groups) {
      const [tg, tu, td] = g.lay.types, H = g.lay.hidden, F = g.lay.nFF;
      const tok0 = g.jobs[0].tok, nrows = g.jobs.reduce((n, j) => n + j.n, 0);
      const maxTok = Math.max(...g.jobs.map((j) => j.n));
      const tb = maxTok >= 8 ? 8 : maxTok >= 4 ? 4 : maxTok >= 2 ? 2 : 1;
      const actPass = (src, stride, cols, mode, srcKind, nff) => {
        passes.push([act, [cols, cols / 32, mode, srcKind, nff, stride, tok0, 0],
          [{ buffer: src }, { buffer: b.AQ }, { buffer: b.AM }], [Math.ceil(cols / 256), nrows, 1]]);
      };
      const mvPass = async (t, which, nRows, cols, yBuf, yStride, yCol, useGate) => {
        const lpr = this.lanes(cols / 32);
        const p = await this.matvecPipeline(t, lpr, tb);
        passes.push([p, [nRows, cols / 32, rowBytes(t, cols), which, yStride, yCol, useGate ? 1 : 0, g.jobBase],
          [{ buffer: g.arena.buffer }, { buffer: b.AQ }, { buffer: b.AM }, { buffer: b.JOBS }, { buffer: yBuf }, { buffer: b.GW }],
          [Math.ceil(nRows / (64 / lpr)), g.jobs.length, Math.ceil(maxTok / tb)]]);
      };
      actPass(b.X, H, H, GPU_TYPES[tg][1], 0, 0);
      if (tg === tu) {
        await mvPass(tg, 0, 2 * F, H, b.GU, 2 * F, 0, false);        // gate and up are one matrix of 2 F rows
      } else {
        await mvPass(tg, 0, F, H, b.GU, 2 * F, 0, false);
        if (GPU_TYPES[tu][1] !== GPU_TYPES[tg][1]) actPass(b.X, H, H, GPU_TYPES[tu][1], 0, 0);
        await mvPass(tu, 1, F, H, b.GU, 2 * F, F, false);
      }
      actPass(b.GU, 2 * F, F, GPU_TYPES[td][1], 1, F);
      await mvPass(td, 2, H, F, b.OUT, H, 0, true);
    }
    return passes;
  }

  // One compute pass, one submission, one read-back of OUT's first `bytes`.
  async submitAndRead(passes, b, bytes) {
    const dev = this.device;
    const PARAMS = this.buffer('params', PARAM_SLOT * passes.length, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);
    const pw = new Uint32Array(passes.length * PARAM_SLOT / 4);
    passes.forEach((p, i) => pw.set(p[1], i * PARAM_SLOT / 4));
    dev.queue.writeBuffer(PARAMS, 0, pw);
    dev.pushErrorScope('validation');
    dev.pushErrorScope('out-of-memory');
    const enc = dev.createCommandEncoder();
    const cp = enc.beginComputePass();
    passes.forEach(([pipe, , binds, grid], i) => {
      const isAct = binds.length === 3;
      const entries = binds.map((r, k) => ({ binding: k, resource: r }));
      entries.push({ binding: isAct ? 3 : 6, resource: { buffer: PARAMS, offset: i * PARAM_SLOT, size: 32 } });
      cp.setPipeline(pipe);
      cp.setBindGroup(0, dev.createBindGroup({ layout: this.layout(isAct ? 'act' : 'mv').bgl, entries }));
      cp.dispatchWorkgroups(grid[0], grid[1], grid[2]);
    });
    cp.end();
    enc.copyBufferToBuffer(b.OUT, 0, b.READ, 0, bytes);
    dev.queue.submit([enc.finish()]);
    const oom = await dev.popErrorScope();
    const verr = await dev.popErrorScope();
    if (oom || verr) throw new Error(`WebGPU: ${(oom || verr).message}`);
    await b.READ.mapAsync(GPUMapMode.READ, 0, bytes);
    const all = new Float32Array(b.READ.getMappedRange(0, bytes).slice(0));
    b.READ.unmap();
    if (this.lost) throw new Error(`WebGPU device lost (${this.lost})`);
    return all;
  }

  // act.wgsl alone on rows x cols values (cols a multiple of 256) in mode 0
  // (Q8_K) or 1 (Q8_0): the int8 activations and, per 32-value unit, the
  // scale and the sum of its ints, as the products read them (the tests
  // compare them bit for bit with the CPU's rounding).
  async quantizeActivations(x, rows, cols, mode) {
    const dev = this.device, S = GPUBufferUsage, units = rows * cols / 32;
    const src = dev.createBuffer({ size: x.byteLength, usage: S.STORAGE | S.COPY_DST });
    const aq = dev.createBuffer({ size: rows * cols, usage: S.STORAGE | S.COPY_SRC });
    const am = dev.createBuffer({ size: units * 8, usage: S.STORAGE | S.COPY_SRC });
    const params = dev.createBuffer({ size: 32, usage: S.UNIFORM | S.COPY_DST });
    const read = dev.createBuffer({ size: rows * cols + units * 8, usage: S.MAP_READ | S.COPY_DST });
    dev.queue.writeBuffer(src, 0, x);
    dev.queue.writeBuffer(params, 0, new Uint32Array([cols, cols / 32, mode, 0, 0, cols, 0, 0]));
    const enc = dev.createCommandEncoder(), cp = enc.beginComputePass();
    cp.setPipeline(await this.actPipeline());
    cp.setBindGroup(0, dev.createBindGroup({ layout: this.layout('act').bgl,
      entries: [src, aq, am, params].map((buffer, binding) => ({ binding, resource: { buffer } })) }));
    cp.dispatchWorkgroups(cols / 256, rows, 1);
    cp.end();
    enc.copyBufferToBuffer(aq, 0, read, 0, rows * cols);
    enc.copyBufferToBuffer(am, 0, read, rows * cols, units * 8);
    dev.queue.submit([enc.finish()]);
    await read.mapAsync(GPUMapMode.READ);
    const bytes = read.getMappedRange().slice(0);
    read.unmap();
    for (const b of [src, aq, am, params, read]) b.destroy();
    return { q: new Int8Array(bytes, 0, rows * cols), scaleSum: new Float32Array(bytes, rows * cols, units * 2) };
  }

  destroy() {
    for (const a of this.arenas) a.buffer.destroy();
    for (const b of Object.values(this.bufs)) b.destroy();
    this.device.destroy();
  }
}

// Lanes sharing a row: enough units per lane (about 3) to amortise the reduction.
function lanesPerRow(units) {
  let l = 1;
  while (l < 16 && l * 2 * 3 <= units) l *= 2;
  return l;
}

function rowBytes(t, cols) {
  const [be, bb] = MOEX.BLOCK[t];
  return cols / be * bb;
}

self.GpuExperts = GpuExperts;
self.gpuRowBytes = rowBytes;
self.isGpuType = isGpuType;
