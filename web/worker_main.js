// The browser worker's session with the hub, in a dedicated Web Worker (it
// keeps running in a background tab): connect with backoff, JOIN, ASSIGN
// (download, verify, hold), heartbeats, DISPATCH into the bounded backlog,
// CANCEL, ERROR reactions, and the computation: a layer batch on WebGPU in
// one submission, or frame by frame on the CPU (WASM). The native worker
// (worker/session.c, compute.c) is the reference for every rule here.
'use strict';

importScripts('moex_wasm.js', 'moex_constants.js', 'wasm_api.js', 'gpu.js', 'store.js');

const { HEARTBEAT_MS, HUB_SILENCE_MS } = MOEX.SESSION;   // proto/proto.h, as the native worker
const BACKOFF_MIN_S = MOEX.SESSION.BACKOFF_MIN_MS / 1000;
const BACKOFF_MAX_S = MOEX.SESSION.BACKOFF_MAX_MS / 1000;
const BACKLOG = 64;               // queued dispatches at most (--backlog)
const BATCH_MAX = 64;             // dispatches per GPU submission
const BATCH_TOKENS = 4096;        // tokens per GPU submission

const S = {
  cfg: null,                      // {ws, http, token, name, budget, forceCpu, capacity, corrupt}
  wasm: null, store: null, model: null, gpu: null, gpuFailed: '',
  ws: null, conn: 0, link: 'down', backoff: BACKOFF_MIN_S, lastRx: 0,
  peerTs: 0, g: 0, state: MOEX.STATE.STARTING, fatal: '',
  backlog: [],                    // {seq, layer, expert, frame, nTok}
  running: null,                  // {seqs: Set, cancelled: Set}
  assignGen: 0,                   // bumped by each ASSIGN: a running load stops when it changes
  assign: null,                   // {g, list, conn}
  held: new Set(),                // "l/e" held on the GPU or the CPU
  onCpu: new Set(),
  busyMs: 0, lastHb: 0,
  stats: { dispatches: 0, results: 0, cancels: 0, cancelled: 0, errors: 0, connects: 0, computed: 0,
           lat: [], gpuBatches: 0, cpuDispatches: 0, dlBytes: 0, dlTotal: 0, phase: 'starting' },
};

function log(...a) {
  console.log('moex-worker:', ...a);
  postMessage({ log: `${new Date().toISOString().slice(11, 19)} ${a.join(' ')}` });
}
const nowUs = () => Math.round((performance.timeOrigin + performance.now()) * 1000);

// ---- status to the page ----

function status() {
  const st = S.stats, lat = st.lat.slice().sort((a, b) => a - b);
  postMessage({
    status: {
      phase: S.fatal ? 'stopped' : st.phase, fatal: S.fatal, link: S.link, hub: S.cfg && S.cfg.ws,
      backend: S.gpu ? 'webgpu' : 'cpu (wasm)', gpuFailed: S.gpuFailed,
      capabilities: S.gpu ? S.gpu.capabilities() : { wasmSimd: S.wasm ? S.wasm.simdName() : '' },
      model: S.model ? { hash: S.model.model_hash, layers: S.model.n_layers, experts: S.model.n_experts, hidden: S.model.n_embd } : null,
      g: S.g, state: S.state, held: S.held.size, heldOnCpu: S.onCpu.size,
      cachedBytes: S.store ? S.store.stats.cachedBytes : 0,
      download: { done: st.dlBytes, total: st.dlTotal },
      dispatches: st.dispatches, results: st.results, errors: st.errors, cancels: st.cancels, computed: st.computed,
      gpuBatches: st.gpuBatches, cpuDispatches: st.cpuDispatches, backlog: S.backlog.length, connects: st.connects,
      latencyMs: lat.length ? { p50: lat[lat.length >> 1], p90: lat[Math.floor(lat.length * 0.9)], n: lat.length } : null,
      storeStats: S.store ? S.store.stats : null,
    },
  });
}

// ---- sending ----

function send(bytes) {
  if (S.ws && S.link === 'up' && S.ws.readyState === WebSocket.OPEN) S.ws.send(bytes);
}

function sendError(seq, code, text) {
  S.stats.errors++;
  send(S.wasm.encodeError(seq, code, text));
}

function sendHeartbeat() {
  const now = performance.now(), span = now - S.lastHb;
  const load = span > 0 ? Math.min(1, S.busyMs / span) : 0;
  S.busyMs = 0;
  S.lastHb = now;
  send(S.wasm.encodeHeartbeat(S.g, {
    timestampUs: nowUs(), echoUs: S.peerTs,
    queueDepth: S.backlog.length + (S.running ? S.running.seqs.size : 0),
    loadPermille: Math.round(1000 * load), state: S.state,
  }));
}

// ---- connecting ----

function backend() { return S.gpu ? MOEX.BACKEND.WEBGPU : MOEX.BACKEND.CPU; }

// JOIN's capacity (placement weight; a native CPU worker's default is 1.0),
// from the relative speeds in docs/BROWSER.md ("Measured"): a GPU adapter
// counts as one native worker, the WASM path as a fifth of one, a software
// (fallback) adapter as almost nothing. The page's setting overrides.
function capacity() {
  if (S.cfg.capacity > 0) return S.cfg.capacity;
  if (!S.gpu) return 0.2;
  return S.gpu.capabilities().fallbackAdapter ? 0.01 : 1.0;
}

function workerName() {
  const caps = S.gpu ? S.gpu.capabilities() : null;
  const what = caps
    ? `webgpu ${caps.adapter}${caps.fallbackAdapter ? ' (fallback adapter)' : ''}${caps.subgroups ? ' subgroups' : ''}${caps.dot4 ? ' dp4a' : ''}`
    : `wasm ${S.wasm.simdName()}`;
  return `${S.cfg.name || 'browser'} [${what}]`.replace(/[\x00-\x1f\x7f]/g, '_').slice(0, 255);
}

function scheduleReconnect(reason) {
  S.link = 'down';
  S.ws = null;
  if (S.fatal) return;
  const delay = S.backoff * (0.5 + 0.5 * Math.random());   // equal jitter
  S.backoff = Math.min(2 * S.backoff, BACKOFF_MAX_S);
  log(`hub ${S.cfg.ws}: ${reason}; retrying in ${delay.toFixed(1)} s`);
  S.stats.phase = 'connecting';
  setTimeout(connect, delay * 1000);
}

async function connect() {
  if (S.fatal) return;
  S.link = 'connecting';
  S.stats.phase = 'connecting';
  try {
    if (!S.model) await openModel();
  } catch (e) {
    if (e.lasting) return stopForGood(String(e.message || e));
    return scheduleReconnect(`GET /v1/model: ${e.message || e}`);
  }
  let ws;
  try {
    ws = new WebSocket(`${S.cfg.ws}?token=${encodeURIComponent(S.cfg.token)}`, 'moex');
  } catch (e) {
    return scheduleReconnect(String(e));
  }
  ws.binaryType = 'arraybuffer';
  const conn = ++S.conn;
  let up = false;
  ws.onopen = () => {
    if (conn !== S.conn) return;
    up = true;
    S.ws = ws;
    S.link = 'up';
    S.lastRx = S.lastHb = performance.now();
    S.g = 0;
    S.state = MOEX.STATE.STARTING;
    S.stats.connects++;
    S.stats.phase = 'joining';
    log(`connected to ${S.cfg.ws} as '${workerName()}'`);
    send(S.wasm.encodeJoin({ backend: backend(), capacity: capacity(), memoryBudget: S.cfg.budget || S.model.allBytes,
                             modelHash: S.model.model_hash, name: workerName() }));
  };
  ws.onmessage = (ev) => { if (conn === S.conn) onMessage(new Uint8Array(ev.data)); };
  ws.onclose = (ev) => {
    if (conn !== S.conn) return;
    connectionLost(up ? `connection closed (${ev.code})` : 'connection failed');
  };
}

// The connection is gone: what was queued for it is void.
function connectionLost(reason) {
  S.conn++;
  S.backlog = [];
  S.assign = null;
  S.assignGen++;
  if (S.running) for (const s of S.running.seqs) S.running.cancelled.add(s);
  scheduleReconnect(reason);
}

function closeAndReconnect(why) {
  const ws = S.ws;
  connectionLost(why);
  if (ws) ws.close(1000, 'reconnecting');
}

function stopForGood(why) {
  S.fatal = why;
  log(`stopped: ${why}`);
  const ws = S.ws;
  S.conn++;
  S.link = 'down';
  if (ws) setTimeout(() => ws.close(1000, 'worker stopped'), 200);   // let the last ERROR leave
  status();
}

// ---- receiving ----

function onMessage(bytes) {
  S.lastRx = performance.now();
  const { frames, status: bad, error } = S.wasm.splitMessage(bytes);
  for (const f of frames) onFrame(bytes.subarray(f.off, f.off + f.len));
  if (bad) {
    log(`bad message from the hub: ${error}`);
    sendError(0, bad, error);
  }
}

function onFrame(frame) {
  const m = S.wasm.decode(frame);
  if (m.status) {
    log(`bad frame from the hub (seq ${m.seq}): ${m.error}`);
    sendError(m.seq, m.status, m.error);
    return;
  }
  switch (m.type) {
    case MOEX.MSG.DISPATCH: onDispatch(m, frame); break;
    case MOEX.MSG.CANCEL: onCancel(m.seq); break;
    case MOEX.MSG.HEARTBEAT: S.peerTs = m.timestampUs; break;
    case MOEX.MSG.ASSIGN: onAssign(m); break;
    case MOEX.MSG.ERROR: onHubError(m); break;
    default: log(`ignoring a type ${m.type} message from the hub`);
  }
}

function onHubError(m) {
  const act = S.wasm.errorAction(m.code), name = S.wasm.errorName(m.code);
  log(`the hub reports error ${m.code} (${name}) for seq ${m.seq}: ${m.text}`);
  if (m.code === MOEX.ERR.MODEL_MISMATCH) {
    S.model = null;             // this worker has no model file: read the hub's again
    return closeAndReconnect('model mismatch: reading the hub\'s model again');
  }
  if (act === MOEX.ACT.EXIT) return stopForGood(`the hub says: ${name}: ${m.text}`);
  if (act === MOEX.ACT.RECONNECT) closeAndReconnect(`the hub says: ${name}`);
}

function onDispatch(m, frame) {
  S.stats.dispatches++;
  // A dispatch for another layer makes the queued ones stale (the hub has moved on).
  const stale = S.backlog.filter((it) => it.layer !== m.layer);
  if (stale.length) {
    S.backlog = S.backlog.filter((it) => it.layer === m.layer);
    for (const it of stale) sendError(it.seq, MOEX.ERR.PREEMPTED, `preempted by a dispatch for layer ${m.layer}`);
  }
  if (S.backlog.length >= BACKLOG) {
    sendError(m.seq, MOEX.ERR.BUSY, 'busy: backlog full');
    return;
  }
  S.backlog.push({ seq: m.seq, layer: m.layer, expert: m.expert, nTok: m.n_tokens, hidden: m.hidden, frame: frame.slice(), t0: performance.now() });
  kick();
}

function onCancel(seq) {
  S.stats.cancels++;
  const i = S.backlog.findIndex((it) => it.seq === seq);
  if (i >= 0) {
    S.backlog.splice(i, 1);
    S.stats.cancelled++;
  } else if (S.running && S.running.seqs.has(seq)) {
    S.running.cancelled.add(seq);
  }
}

function onAssign(m) {
  const mo = S.model;
  if (m.modelHash !== mo.model_hash || m.n_layers !== mo.n_layers || m.n_experts !== mo.n_experts) {
    const why = `model mismatch: the hub serves model ${m.modelHash} (${m.n_layers} x ${m.n_experts}), this worker read ${mo.model_hash}`;
    sendError(m.seq, MOEX.ERR.MODEL_MISMATCH, why);
    S.model = null;
    setTimeout(() => closeAndReconnect(why), 100);
    return;
  }
  log(`assignment ${m.seq}: worker id ${m.worker_id}, ${m.experts.length} experts, ${m.replicas} replicas`);
  // The backoff starts over once a hub has answered the JOIN (not merely accepted
  // the connection: a proxy whose hub is gone accepts and closes at once).
  S.backoff = BACKOFF_MIN_S;
  S.assign = { g: m.seq, list: m.experts, conn: S.conn };
  S.assignGen++;
  S.state = MOEX.STATE.LOADING;
  loadAssignment(S.assignGen);
}

// ---- assignments: download, verify, hold ----

// GPU slots change (hold, drop) only between layer batches: run() reads the
// slot table before it submits, and a slot rewritten in between would hand a
// batch another expert's weights. Downloads go on while batches run.
let gpuChain = Promise.resolve();
function withGpu(fn) {
  const p = gpuChain.then(fn);
  gpuChain = p.catch(() => {});
  return p;
}

async function openModel() {
  S.model = await S.store.fetchModel();
  log(`model ${S.model.model_hash}: ${S.model.n_layers} layers x ${S.model.n_experts} experts, hidden ${S.model.n_embd}`);
  for (const k of S.held) {
    const [l, e] = k.split('/').map(Number);
    if (S.gpu) S.gpu.drop(l, e);
    S.wasm.drop(l, e);
  }
  S.held.clear();
  S.onCpu.clear();
  if (S.wasm) S.wasm.destroy();
  S.wasm = new MoexWasm(S.module, S.model.n_layers, S.model.n_experts, S.model.n_embd);
  S.store.wasm = S.wasm;
  if (S.gpu) S.gpu.configure(S.model.maxExpertBytes);
}

// Puts an expert's verified bytes on the GPU, or in the WASM heap when the GPU
// cannot take it (no WebGPU, a type without a kernel, no room).
async function holdExpert(l, e, bytes) {
  const lay = S.model.layout(l, e), k = `${l}/${e}`;
  if (S.gpu && lay.types.every(isGpuType)) {
    try {
      if (await withGpu(() => S.gpu && S.gpu.hold(l, e, bytes, lay))) {
        S.held.add(k);
        return;
      }
      log(`expert (${l}, ${e}): no room on the GPU; it runs on the CPU`);
    } catch (err) {
      log(`expert (${l}, ${e}): the GPU refused it (${err.message || err}); it runs on the CPU`);
    }
  }
  S.wasm.hold(l, e, bytes, lay.types, lay.nFF);
  S.onCpu.add(k);
  S.held.add(k);
}

function dropExpert(l, e) {
  const k = `${l}/${e}`;
  if (S.gpu) S.gpu.drop(l, e);
  S.wasm.drop(l, e);
  S.held.delete(k);
  S.onCpu.delete(k);
}

async function loadAssignment(gen) {
  const a = S.assign, stop = () => gen !== S.assignGen;
  const want = new Set(a.list.map(([l, e]) => `${l}/${e}`));
  await withGpu(() => { for (const k of [...S.held]) if (!want.has(k)) dropExpert(...k.split('/').map(Number)); });
  const todo = a.list.filter(([l, e]) => !S.held.has(`${l}/${e}`));
  S.stats.dlTotal = todo.reduce((s, [l, e]) => s + S.model.layout(l, e).total, 0);
  S.stats.dlBytes = 0;
  S.stats.phase = todo.length ? 'downloading' : S.stats.phase;
  status();
  try {
    await S.store.prefetchHashes(todo);
    for (const [l, e] of todo) {
      if (stop()) return;
      const bytes = await S.store.get(l, e, stop);
      if (!bytes || stop()) return;
      try {
        await holdExpert(l, e, bytes);
      } catch (err) {
        // Neither the GPU nor the WASM heap takes it (out of memory): as moex-worker
        // does, go on without it; its dispatches get ERROR 4 and the hub re-dispatches.
        log(`cannot hold expert (${l}, ${e}): ${err.message || err}`);
      }
    }
    if (S.gpu) await withGpu(() => S.gpu && S.gpu.warmUp([...new Set(a.list.map(([l, e]) => JSON.stringify(S.model.layout(l, e))))].map((s) => JSON.parse(s))));
  } catch (err) {
    if (err instanceof StoreError && err.lasting) return stopForGood(err.message);
    log(`assignment ${a.g}: ${err.message || err}; waiting for the hub's next ASSIGN`);
    if (!stop()) closeAndReconnect(`loading failed: ${err.message || err}`);
    return;
  }
  if (stop() || a.conn !== S.conn) return;
  S.g = a.g;
  S.state = MOEX.STATE.READY;
  S.stats.phase = 'ready';
  log(`assignment ${a.g}: holding ${S.held.size} experts (${S.onCpu.size} on the CPU)`);
  sendHeartbeat();
  S.store.trim(want, S.cfg.budget || S.model.allBytes).catch(() => {});
  status();
}

// ---- computing ----

let computing = false;

function kick() {
  if (!computing && S.backlog.length) { computing = true; setTimeout(computeLoop, 0); }
}

async function computeLoop() {
  try {
    while (S.backlog.length) {
      const conn = S.conn;
      const batch = takeBatch();
      S.running = { seqs: new Set(batch.map((it) => it.seq)), cancelled: new Set() };
      S.stats.phase = 'computing';
      const t0 = performance.now();
      const frames = await computeBatch(batch);
      const dt = performance.now() - t0;
      S.busyMs += dt;
      S.stats.computed += batch.length;
      const out = [];
      for (let i = 0; i < batch.length; i++) {
        if (S.running.cancelled.has(batch[i].seq)) { S.stats.cancelled++; continue; }
        if (!frames[i]) continue;
        out.push(frames[i].bytes);
        if (frames[i].error) S.stats.errors++;
        else { S.stats.results++; S.stats.lat.push(performance.now() - batch[i].t0); }
      }
      if (S.stats.lat.length > 200) S.stats.lat.splice(0, S.stats.lat.length - 200);
      S.running = null;
      // One frame per message, as moex-worker sends them (PROTOCOL.md allows several
      // RESULTs in one message, but a hub that predates it reads one).
      if (conn === S.conn) for (const f of out) send(f);
      if (S.state === MOEX.STATE.READY) S.stats.phase = 'ready';
    }
  } finally {
    computing = false;
    S.running = null;
  }
}

// Every queued dispatch (one layer's: the backlog holds no other) up to the batch limits.
function takeBatch() {
  const b = [];
  let tokens = 0;
  while (S.backlog.length && b.length < (S.gpu ? BATCH_MAX : 1) && tokens < BATCH_TOKENS) {
    const it = S.backlog.shift();
    tokens += it.nTok;
    b.push(it);
  }
  return b;
}

function errorFrame(seq, text) {
  log(`dispatch ${seq} failed: ${text}`);
  return { bytes: S.wasm.encodeError(seq, MOEX.ERR.COMPUTE, text), error: true };
}

// RESULT (or ERROR) frames for a batch: the GPU's experts in one submission,
// the others on the CPU. A GPU failure never yields a result: those
// dispatches are answered on the CPU where it holds them, else with ERROR 4.
async function computeBatch(batch) {
  const frames = new Array(batch.length);
  const gpuIdx = [];
  for (let i = 0; i < batch.length; i++) {
    const it = batch[i], k = `${it.layer}/${it.expert}`;
    if (S.gpu && S.held.has(k) && !S.onCpu.has(k)) gpuIdx.push(i);
    else frames[i] = computeOnCpu(it);
  }
  if (!gpuIdx.length) return frames;
  try {
    const items = gpuIdx.map((i) => {
      const it = batch[i], d = S.wasm.dispatchF32(it.frame, it.nTok, it.hidden);
      return { layer: it.layer, expert: it.expert, x: d.x, gates: d.gates };
    });
    const outs = await withGpu(() => S.gpu.run(items));
    gpuIdx.forEach((i, j) => {
      if (corruptNow()) addNoise(outs[j], batch[i].hidden);
      frames[i] = { bytes: S.wasm.encodeResult(batch[i].frame, outs[j]) };
    });
    S.stats.gpuBatches++;
  } catch (err) {
    const why = String(err.message || err);
    for (const i of gpuIdx) frames[i] = errorFrame(batch[i].seq, `webgpu: ${why}`);
    if (S.gpu && S.gpu.lost) await gpuLost(S.gpu.lost);
  }
  return frames;
}

// &corrupt=P (tests): whether this result is to be wrong. The noise is
// moex-worker's --inject-corrupt-prob's: each value moves by up to ten times
// its row's RMS (plus one), far outside any tolerance of the hub's --verify.
function corruptNow() { return S.cfg.corrupt > 0 && Math.random() < S.cfg.corrupt; }

function addNoise(values, hidden) {
  for (let r = 0; r < values.length; r += hidden) {
    let ss = 0;
    for (let i = r; i < r + hidden; i++) ss += values[i] * values[i];
    const amp = 10 * Math.sqrt(ss / hidden) + 1;
    for (let i = r; i < r + hidden; i++) values[i] += amp * (2 * Math.random() - 1);
  }
  S.stats.corrupted = (S.stats.corrupted || 0) + 1;
}

function computeOnCpu(it) {
  if (!S.wasm.holds(it.layer, it.expert)) return errorFrame(it.seq, `expert (${it.layer}, ${it.expert}) is not held by this worker`);
  try {
    S.stats.cpuDispatches++;
    if (corruptNow()) {   // the WASM core returns an encoded RESULT: wrong values are encoded in its place
      const noise = new Float32Array(it.nTok * it.hidden);
      addNoise(noise, it.hidden);
      return { bytes: S.wasm.encodeResult(it.frame, noise) };
    }
    return { bytes: S.wasm.compute(it.frame) };
  } catch (err) {
    return errorFrame(it.seq, String(err.message || err));
  }
}

// The device is gone: every GPU expert moves to the CPU (from the verified
// cache), the hub is told what we are now (a new JOIN on a new connection).
async function gpuLost(why) {
  if (!S.gpu) return;
  log(`WebGPU device lost (${why}); continuing on the CPU`);
  S.gpuFailed = `device lost: ${why}`;
  S.gpu = null;
  for (const k of [...S.held]) if (!S.onCpu.has(k)) S.held.delete(k);   // reloaded on the CPU at the next ASSIGN
  closeAndReconnect('WebGPU lost: joining again as a CPU worker');
}

// ---- timers: heartbeats and the hub-silence check ----

setInterval(() => {
  if (S.link !== 'up' || S.fatal) return;
  const now = performance.now();
  if (now - S.lastRx > HUB_SILENCE_MS) {
    log(`nothing from the hub for ${HUB_SILENCE_MS / 1000} s; reconnecting`);
    closeAndReconnect('hub silent');
    return;
  }
  if (now - S.lastHb >= HEARTBEAT_MS - 50) sendHeartbeat();
}, 100);
setInterval(() => { if (S.cfg) status(); }, 500);

// ---- start ----

async function start(cfg) {
  S.cfg = cfg;
  S.module = await MoexWasm.load('');
  S.wasm = new MoexWasm(S.module);
  S.store = new ExpertStore(cfg.http, cfg.token, S.wasm, (n) => { S.stats.dlBytes += n; });
  if (!cfg.forceCpu) {
    try {
      S.gpu = await GpuExperts.create({ base: '' });
      S.gpu.onLost((why) => { if (S.gpu) gpuLost(why); });
      log(`WebGPU: ${JSON.stringify(S.gpu.capabilities())}`);
    } catch (e) {
      S.gpuFailed = String(e.message || e);
      log(`no WebGPU (${S.gpuFailed}); computing on the CPU (WASM ${S.wasm.simdName()})`);
    }
  } else {
    S.gpuFailed = 'CPU forced by the page';
  }
  try {
    const est = await navigator.storage.estimate();
    const byQuota = Math.floor((est.quota || 0) * 0.8);
    cfg.budget = Math.max(0, Math.min(cfg.budget || Infinity, byQuota || Infinity));
    if (!Number.isFinite(cfg.budget)) cfg.budget = 0;
  } catch (e) { /* no estimate: keep the setting */ }
  connect();
}

onmessage = (ev) => {
  const m = ev.data;
  if (m.cmd === 'start') start(m.cfg).catch((e) => stopForGood(`start failed: ${e.stack || e}`));
  if (m.cmd === 'stop') stopForGood('stopped by the page');
  // Tests: destroys the WebGPU device as a driver reset would (device.lost).
  if (m.cmd === 'lose-gpu' && S.gpu) S.gpu.device.destroy();
};
