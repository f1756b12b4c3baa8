// The JavaScript side of the WASM module (wasm/moex_wasm.c): frames, hashes
// and the CPU path, one call across the boundary per frame or per batch.
// A classic script (importScripts in the Web Worker, <script> in test pages),
// after moex_constants.js (the protocol's numbers, generated from the C
// headers): it defines self.MoexWasm.
'use strict';

function hex64(lo, hi) {
  return (hi >>> 0).toString(16).padStart(8, '0') + (lo >>> 0).toString(16).padStart(8, '0');
}

class MoexWasm {
  // Loads moex_wasm.js / .wasm (beside this script) once; returns the module.
  static async load(base = '') {
    if (!MoexWasm.modulePromise) {
      if (typeof createMoexWasm === 'undefined') {
        if (typeof importScripts === 'function') importScripts(base + 'moex_wasm.js');
        else throw new Error('moex_wasm.js is not loaded');
      }
      MoexWasm.modulePromise = createMoexWasm({ locateFile: (p) => base + p });
    }
    return MoexWasm.modulePromise;
  }

  // A handle for a model of nLayers x nExperts experts of width hidden
  // (0, 0, 0: frames and hashes only, no CPU path).
  constructor(M, nLayers = 0, nExperts = 0, hidden = 0) {
    this.M = M;
    this.h = M._moex_wasm_create(nLayers, nExperts, hidden);
    if (!this.h) throw new Error('moex_wasm_create failed (out of memory or bad shape)');
    this.buf = 0;      // a heap buffer for frames coming in, grown on demand
    this.bufCap = 0;
    this.tmp = M._moex_wasm_malloc(16);
  }

  destroy() {
    this.M._moex_wasm_free(this.buf);
    this.M._moex_wasm_free(this.tmp);
    this.M._moex_wasm_destroy(this.h);
    this.h = 0;
  }

  get heap() { return this.M.HEAPU8; }
  error() { return this.M.UTF8ToString(this.M._moex_wasm_error(this.h)); }

  // Copies bytes into the handle's input buffer; returns its address.
  stage(bytes) {
    if (bytes.length > this.bufCap) {
      this.M._moex_wasm_free(this.buf);
      this.bufCap = Math.max(bytes.length, 2 * this.bufCap, 65536);
      this.buf = this.M._moex_wasm_malloc(this.bufCap);
      if (!this.buf) throw new Error(`out of WASM memory for ${this.bufCap} bytes`);
    }
    this.heap.set(bytes, this.buf);
    return this.buf;
  }

  // The last encoded frame, copied out of the heap.
  outFrame(n) {
    if (n < 0) throw new Error(this.error());
    const p = this.M._moex_wasm_out(this.h);
    return this.heap.slice(p, p + n);
  }

  // Splits a message into frames: [{off, len}], or {status, error} when the
  // rest of the message is not a valid frame.
  splitMessage(bytes) {
    const p = this.stage(bytes);
    const frames = [];
    for (let off = 0; ;) {
      const n = this.M._moex_wasm_next_frame(this.h, p, bytes.length, off);
      if (n === 0) return { frames };
      if (n < 0) return { frames, status: n, error: this.error() };
      frames.push({ off, len: n });
      off += n;
    }
  }

  // Decodes one frame: {status, error?, type, seq, ...} (see MSG_FIELDS);
  // ASSIGN adds experts [[layer, expert]...] and modelHash (hex), ERROR text.
  decode(frame) {
    const p = this.stage(frame);
    const status = this.M._moex_wasm_decode(this.h, p, frame.length);
    const m = this.M._moex_wasm_msg_ptr(this.h);
    const dv = new DataView(this.heap.buffer, m, MOEX.MSG_BYTES);
    const out = { status };
    for (const [k, off] of Object.entries(MOEX.MSG_FIELDS)) out[k] = k === 'code' ? dv.getInt32(off, true) : dv.getUint32(off, true);
    if (status) { out.error = this.error(); return out; }
    if (out.type === MOEX.MSG.ERROR) out.text = new TextDecoder().decode(this.heap.subarray(p + out.text_off, p + out.text_off + out.text_len));
    if (out.type === MOEX.MSG.ASSIGN) {
      out.modelHash = hex64(out.hash_lo, out.hash_hi);
      const l = new DataView(this.heap.buffer, p + out.list_off, 4 * out.list_count);
      out.experts = [];
      for (let i = 0; i < out.list_count; i++) out.experts.push([l.getUint16(4 * i, true), l.getUint16(4 * i + 2, true)]);
    }
    if (out.type === MOEX.MSG.HEARTBEAT) out.timestampUs = out.ts_hi * 4294967296 + out.ts_lo;
    return out;
  }

  // A DISPATCH's rows and gates as f32: {x: Float32Array(n*hidden), gates}.
  dispatchF32(frame, nTokens, hidden) {
    const p = this.stage(frame);
    const xp = this.M._moex_wasm_malloc(4 * nTokens * hidden), gp = this.M._moex_wasm_malloc(4 * nTokens);
    try {
      const rc = this.M._moex_wasm_dispatch_f32(this.h, p, frame.length, xp, gp);
      if (rc) throw new Error(this.error());
      return {
        x: new Float32Array(this.heap.buffer.slice(xp, xp + 4 * nTokens * hidden)),
        gates: new Float32Array(this.heap.buffer.slice(gp, gp + 4 * nTokens)),
      };
    } finally {
      this.M._moex_wasm_free(xp);
      this.M._moex_wasm_free(gp);
    }
  }

  // The RESULT frame answering a DISPATCH (its first 28 bytes: header) for
  // values (Float32Array, n_tokens x hidden), in the DISPATCH's dtype.
  encodeResult(header, values) {
    const hp = this.M._moex_wasm_malloc(28), vp = this.M._moex_wasm_malloc(4 * values.length);
    try {
      this.heap.set(header.subarray(0, 28), hp);
      new Float32Array(this.heap.buffer, vp, values.length).set(values);
      return this.outFrame(this.M._moex_wasm_encode_result(this.h, hp, vp));
    } finally {
      this.M._moex_wasm_free(hp);
      this.M._moex_wasm_free(vp);
    }
  }

  withString(s, fn) {
    const bytes = new TextEncoder().encode(s);
    const p = this.M._moex_wasm_malloc(bytes.length + 1);
    this.heap.set(bytes, p);
    try { return fn(p, bytes.length); } finally { this.M._moex_wasm_free(p); }
  }

  encodeJoin({ backend, capacity, memoryBudget, modelHash, name }) {
    const lo = parseInt(modelHash.slice(8), 16) >>> 0, hi = parseInt(modelHash.slice(0, 8), 16) >>> 0;
    return this.withString(name, (p, n) => this.outFrame(this.M._moex_wasm_encode_join(
      this.h, backend, Math.round(capacity * 100), memoryBudget, lo, hi, p, Math.min(n, 255))));
  }

  encodeHeartbeat(seq, { timestampUs, echoUs, queueDepth, loadPermille, state }) {
    return this.outFrame(this.M._moex_wasm_encode_heartbeat(this.h, seq >>> 0, timestampUs, echoUs, queueDepth,
      loadPermille, state));
  }

  encodeError(seq, code, text) {
    return this.withString(text, (p, n) => this.outFrame(this.M._moex_wasm_encode_error(this.h, seq >>> 0, code, p, n)));
  }

  errorAction(code) { return this.M._moex_wasm_error_action(code); }
  errorName(code) { return this.M.UTF8ToString(this.M._moex_wasm_error_name(code)); }

  // ---- the CPU path ----

  // Holds an expert from its bytes (gate|up|down) in the heap. Throws on error.
  hold(layer, expert, bytes, types, nFF) {
    const p = this.M._moex_wasm_malloc(bytes.length);
    if (!p) throw new Error(`out of WASM memory for expert (${layer}, ${expert})`);
    this.heap.set(bytes, p);
    if (this.M._moex_wasm_hold(this.h, layer, expert, p, bytes.length, types[0], types[1], types[2], nFF)) {
      this.M._moex_wasm_free(p);
      throw new Error(this.error());
    }
  }
  drop(layer, expert) { this.M._moex_wasm_drop(this.h, layer, expert); }
  holds(layer, expert) { return !!this.M._moex_wasm_holds(this.h, layer, expert); }

  // DISPATCH frame -> RESULT frame on the CPU; throws with the reason.
  compute(frame) {
    const p = this.stage(frame);
    return this.outFrame(this.M._moex_wasm_compute(this.h, p, frame.length));
  }

  // ---- XXH3-64 ----
  hashReset() { this.M._moex_wasm_hash_reset(this.h); }
  hashUpdate(bytes) {
    for (let off = 0; off < bytes.length; off += 1 << 22) {
      const chunk = bytes.subarray(off, Math.min(bytes.length, off + (1 << 22)));
      this.M._moex_wasm_hash_update(this.h, this.stage(chunk), chunk.length);
    }
  }
  hashDigest() {
    this.M._moex_wasm_hash_digest(this.h, this.tmp);
    const dv = new DataView(this.heap.buffer, this.tmp, 8);
    return hex64(dv.getUint32(0, true), dv.getUint32(4, true));
  }
  hash64(bytes) { this.hashReset(); this.hashUpdate(bytes); return this.hashDigest(); }

  // ---- kernels (tests, benchmarks) ----
  rowBytes(type, n) { return this.M._moex_wasm_row_bytes(type, n); }
  quantizeRow(type, f32) {
    const n = f32.length, sp = this.M._moex_wasm_malloc(4 * n), nb = this.rowBytes(type, n), dp = this.M._moex_wasm_malloc(nb);
    new Float32Array(this.heap.buffer, sp, n).set(f32);
    const rc = this.M._moex_wasm_quantize_row(type, sp, dp, n);
    const out = this.heap.slice(dp, dp + nb);
    this.M._moex_wasm_free(sp); this.M._moex_wasm_free(dp);
    if (rc) throw new Error(`cannot quantize to type ${type}`);
    return out;
  }
  dequantizeRow(type, bytes, n) {
    const sp = this.M._moex_wasm_malloc(bytes.length), dp = this.M._moex_wasm_malloc(4 * n);
    this.heap.set(bytes, sp);
    const rc = this.M._moex_wasm_dequantize_row(type, sp, dp, n);
    const out = new Float32Array(this.heap.buffer.slice(dp, dp + 4 * n));
    this.M._moex_wasm_free(sp); this.M._moex_wasm_free(dp);
    if (rc) throw new Error(`cannot dequantize type ${type}`);
    return out;
  }
  simdName() { return this.M.UTF8ToString(this.M._moex_wasm_simd_name()); }
  // dot of one weight row with f32 x by the active table (portable=false) or the portable one.
  vecDot(portable, type, wrow, x) {
    const wp = this.M._moex_wasm_malloc(wrow.length), xp = this.M._moex_wasm_malloc(4 * x.length);
    this.heap.set(wrow, wp);
    new Float32Array(this.heap.buffer, xp, x.length).set(x);
    const rc = this.M._moex_wasm_vec_dot(portable ? 1 : 0, type, x.length, wp, xp, this.tmp);
    const v = new Float32Array(this.heap.buffer, this.tmp, 1)[0];
    this.M._moex_wasm_free(wp); this.M._moex_wasm_free(xp);
    if (rc) throw new Error(`vec_dot: type ${type} not supported`);
    return v;
  }
  // One expert FFN on the CPU: bytes gate|up|down, x (nTok x hidden), gates -> Float32Array.
  // Stages the weights once per call unless given a heap pointer (prepared by stageWeights).
  stageWeights(bytes) {
    const p = this.M._moex_wasm_malloc(bytes.length);
    this.heap.set(bytes, p);
    return p;
  }
  expertFFN(wp, types, hidden, nFF, x, gates) {
    const n = gates.length, xp = this.M._moex_wasm_malloc(4 * x.length), gp = this.M._moex_wasm_malloc(4 * n),
      op = this.M._moex_wasm_malloc(4 * n * hidden);
    new Float32Array(this.heap.buffer, xp, x.length).set(x);
    new Float32Array(this.heap.buffer, gp, n).set(gates);
    const rc = this.M._moex_wasm_expert_ffn(this.h, wp, types[0], types[1], types[2], hidden, nFF, xp, gp, n, op);
    const out = new Float32Array(this.heap.buffer.slice(op, op + 4 * n * hidden));
    this.M._moex_wasm_free(xp); this.M._moex_wasm_free(gp); this.M._moex_wasm_free(op);
    if (rc) throw new Error(this.error());
    return out;
  }
}

self.MoexWasm = MoexWasm;
