/* The browser worker's byte-level half, compiled to WebAssembly.
 *
 * JavaScript owns WebGPU and all I/O (WebSocket, fetch, OPFS); this module
 * owns every byte-level job so that the browser worker speaks exactly the
 * native worker's protocol with the project's own C:
 *  - frames: splitting a message (moex_proto_next_frame), decoding and
 *    validating each frame, encoding JOIN / HEARTBEAT / ERROR / RESULT (proto/);
 *  - DISPATCH rows to f32 for the GPU path (any wire dtype, LZ4 included);
 *  - XXH3-64 of downloaded and cached experts (xxhash);
 *  - the CPU path when WebGPU is missing or fails: the worker core
 *    (worker/core.c) on the kernels' portable dot products, vectorised with
 *    WASM SIMD where dot_wasm.c has a kernel;
 *  - test helpers: quantize / dequantize rows (kernels/quant.c).
 *
 * Everything lives in one handle (moex_wasm) that JavaScript creates per
 * model; no global state. One call per frame or per batch crosses the
 * boundary. Pointers are wasm32 addresses into the module's heap; 64-bit
 * values cross as (lo, hi) u32 pairs or doubles (timestamps < 2^53 us). */
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kernels/kernels.h"
#include "kernels/kernels_internal.h"
#include "proto/proto.h"
#include "worker/worker.h"
#include "web/wasm/moex_wasm.h"

/* Exported to JavaScript. Natively (tests/web/test_wasm_api.c runs this file
 * under the sanitizers) an ordinary function. */
#ifdef __EMSCRIPTEN__
#include <emscripten/emscripten.h>
#define API EMSCRIPTEN_KEEPALIVE
#else
#define API
#endif

struct moex_wasm {
    int n_layers, n_experts, hidden;
    moex_proto_limits lim;
    moex_worker_core *core;             /* the CPU path */
    moex_expert_weights *weights;       /* n_layers x n_experts; bound ones point into owned[] */
    uint8_t **owned;                    /* expert bytes held for the CPU path (gate|up|down) */
    uint8_t *scratch;                   /* decompression */
    size_t scratch_cap;
    uint8_t *out;                       /* the last encoded frame */
    size_t out_len, out_cap;
    moex_wasm_msg msg;
    moex_error err;
    XXH3_state_t hash;
    uint64_t session;                   /* the key of the hub's last ASSIGN: presented in the next JOIN */
};

API void *moex_wasm_malloc(size_t n) { return malloc(n ? n : 1); }
API void moex_wasm_free(void *p) { free(p); }

/* ---- handle ---- */

API moex_wasm *moex_wasm_create(int n_layers, int n_experts, int hidden) {
    moex_wasm *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->n_layers = n_layers;
    w->n_experts = n_experts;
    w->hidden = hidden;
    w->lim = moex_proto_default_limits();
    if (n_layers > 0 && n_experts > 0 && hidden > 0) {
        w->lim.max_hidden = (uint32_t)hidden;
        w->lim.max_layers = (uint32_t)n_layers;
        w->lim.max_experts = (uint32_t)n_experts;
        const size_t n = (size_t)n_layers * (size_t)n_experts;
        w->weights = calloc(n, sizeof *w->weights);
        w->owned = calloc(n, sizeof *w->owned);
        w->core = moex_worker_core_create(n_layers, n_experts, hidden, NULL, &w->err);
        if (!w->weights || !w->owned || !w->core) {
            moex_worker_core_free(w->core);
            free(w->weights);
            free(w->owned);
            free(w);
            return NULL;
        }
    }
    XXH3_64bits_reset(&w->hash);
    return w;
}

API void moex_wasm_destroy(moex_wasm *w) {
    if (!w) return;
    if (w->owned)
        for (size_t i = 0; i < (size_t)w->n_layers * (size_t)w->n_experts; i++) free(w->owned[i]);
    moex_worker_core_free(w->core);
    free(w->weights);
    free(w->owned);
    free(w->scratch);
    free(w->out);
    free(w);
}

API const char *moex_wasm_error(moex_wasm *w) { return w->err.msg; }
API const uint8_t *moex_wasm_out(moex_wasm *w) { return w->out; }
API uint32_t moex_wasm_out_len(moex_wasm *w) { return (uint32_t)w->out_len; }
API const moex_wasm_msg *moex_wasm_msg_ptr(moex_wasm *w) { return &w->msg; }

static int reserve_out(moex_wasm *w, size_t n) {
    if (n <= w->out_cap) return 0;
    uint8_t *p = realloc(w->out, n);
    if (!p) return moex_fail(&w->err, "out of memory for a %zu-byte frame", n);
    w->out = p;
    w->out_cap = n;
    return 0;
}

/* ---- frames in ---- */

/* The length of the frame at msg[off], 0 at the end of the message, or a
 * negative moex_proto_status (the rest of the message is unusable). */
API int moex_wasm_next_frame(moex_wasm *w, const uint8_t *msg, uint32_t len, uint32_t off) {
    size_t o = off, frame_len = 0;
    int rc = moex_proto_next_frame(msg, len, &o, &w->lim, &frame_len, &w->err);
    if (rc < 0) return rc;
    return rc == 0 ? 0 : (int)frame_len;
}

static int decode(moex_wasm *w, const uint8_t *frame, uint32_t len, moex_proto_msg *m) {
    memset(&w->msg, 0, sizeof w->msg);
    w->err.msg[0] = 0;
    size_t frame_bytes;
    int rc = moex_proto_frame_size(frame, len, &w->lim, &frame_bytes, &w->err);
    if (rc) return rc;
    moex_proto_header h;
    moex_proto_header_read(frame, &h);
    const size_t need = moex_proto_scratch_bytes(&h);
    if (need > w->scratch_cap) {
        uint8_t *p = realloc(w->scratch, need);
        if (!p) return moex_fail(&w->err, "out of memory for %zu bytes of scratch", need), MOEX_PROTO_E_SCRATCH;
        w->scratch = p;
        w->scratch_cap = need;
    }
    return moex_proto_decode(frame, len, &w->lim, w->scratch, w->scratch_cap, m, &w->err);
}

/* Decodes one frame into moex_wasm_msg_ptr(w); 0 or a negative status (the
 * header fields are still filled in when the header could be read). */
API int moex_wasm_decode(moex_wasm *w, const uint8_t *frame, uint32_t len) {
    moex_proto_msg m;
    const int rc = decode(w, frame, len, &m);
    moex_wasm_msg *o = &w->msg;
    moex_proto_header h;
    if (len >= MOEX_PROTO_HEADER_BYTES) {
        moex_proto_header_read(frame, &h);
        *o = (moex_wasm_msg){.type = h.type, .seq = h.seq, .layer = h.layer, .expert = h.expert,
                             .n_tokens = h.n_tokens, .hidden = h.hidden, .dtype = h.dtype, .flags = h.flags};
    }
    if (rc) return rc;
    switch (m.h.type) {
    case MOEX_MSG_ERROR:
        o->code = m.u.error.code;
        o->text_off = (uint32_t)((const uint8_t *)m.u.error.text - frame);
        o->text_len = m.u.error.text_len;
        break;
    case MOEX_MSG_ASSIGN:
        o->list_off = (uint32_t)(m.u.assign.experts.bytes - frame);
        o->list_count = m.u.assign.experts.count;
        o->worker_id = m.u.assign.info.worker_id;
        o->n_layers = m.u.assign.info.n_layers;
        o->n_experts = m.u.assign.info.n_experts;
        o->replicas = m.u.assign.info.replicas;
        o->hash_lo = (uint32_t)m.u.assign.info.model_hash;
        o->hash_hi = (uint32_t)(m.u.assign.info.model_hash >> 32);
        w->session = m.u.assign.info.session; /* a reconnect presents it: same worker, same experts */
        break;
    case MOEX_MSG_HEARTBEAT:
        o->ts_lo = (uint32_t)m.u.heartbeat.timestamp_us;
        o->ts_hi = (uint32_t)(m.u.heartbeat.timestamp_us >> 32);
        break;
    default: break;
    }
    return 0;
}

/* A DISPATCH's rows as f32 into x (n_tokens x hidden) and its gates into
 * gates (n_tokens): what the GPU path uploads. 0 or a negative status. */
API int moex_wasm_dispatch_f32(moex_wasm *w, const uint8_t *frame, uint32_t len, float *x, float *gates) {
    moex_proto_msg m;
    int rc = decode(w, frame, len, &m);
    if (rc) return rc;
    if (m.h.type != MOEX_MSG_DISPATCH) return moex_fail(&w->err, "frame type %u is not a DISPATCH", m.h.type), MOEX_PROTO_E_TYPE;
    const moex_proto_tensor_view *v = &m.u.tensor;
    for (uint32_t t = 0; t < v->n_tokens; t++) {
        moex_proto_tensor_row_f32(v, t, x + (size_t)t * v->hidden);
        gates[t] = moex_proto_tensor_gate(v, t);
    }
    return 0;
}

/* ---- frames out (into moex_wasm_out) ---- */

/* The RESULT answering the DISPATCH whose 28 header bytes are at header:
 * values are its n_tokens x hidden gate-weighted outputs, sent in the
 * DISPATCH's dtype. Returns the frame's length or -1 (moex_wasm_error). */
API int moex_wasm_encode_result(moex_wasm *w, const uint8_t *header, const float *values) {
    moex_proto_header h;
    moex_proto_header_read(header, &h);
    const moex_proto_tensor_msg m = {.type = MOEX_MSG_RESULT, .seq = h.seq, .layer = h.layer, .expert = h.expert,
                                     .n_tokens = h.n_tokens, .hidden = h.hidden, .dtype = h.dtype};
    const size_t need = moex_proto_tensor_frame_bytes(&m);
    if (!need) return moex_fail(&w->err, "no RESULT for %u tokens x %u hidden, dtype %u", h.n_tokens, h.hidden, h.dtype);
    if (reserve_out(w, need)) return -1;
    if (moex_proto_encode_tensor_f32(&m, values, NULL, w->out, w->out_cap, &w->out_len, &w->err)) return -1;
    return (int)w->out_len;
}

API int moex_wasm_encode_join(moex_wasm *w, int backend, int capacity_centi, double memory_budget, uint32_t hash_lo,
                              uint32_t hash_hi, const char *name, int name_len) {
    const moex_proto_join j = {
        .proto_min = MOEX_PROTO_VERSION, .proto_max = MOEX_PROTO_VERSION, .backend = (uint8_t)backend,
        .capacity_centi = (uint16_t)(capacity_centi < 1 ? 1 : capacity_centi > 65535 ? 65535 : capacity_centi),
        .memory_budget = (uint64_t)memory_budget, .model_hash = (uint64_t)hash_hi << 32 | hash_lo,
        .session = w->session, .name = name,
        .name_len = (uint8_t)(name_len > 255 ? 255 : name_len),
    };
    if (reserve_out(w, MOEX_PROTO_HEADER_BYTES + MOEX_PROTO_JOIN_FIXED_BYTES + 255)) return -1;
    if (moex_proto_encode_join(0, &j, NULL, 0, w->out, w->out_cap, &w->out_len, &w->err)) return -1;
    return (int)w->out_len;
}

API int moex_wasm_encode_heartbeat(moex_wasm *w, uint32_t seq, double timestamp_us, double echo_us,
                                   uint32_t queue_depth, int load_permille, int state) {
    const moex_proto_heartbeat hb = {.timestamp_us = (uint64_t)timestamp_us, .echo_us = (uint64_t)echo_us,
                                     .queue_depth = queue_depth,
                                     .load_permille = (uint16_t)(load_permille < 0 ? 0 : load_permille > 1000 ? 1000 : load_permille),
                                     .state = (uint8_t)state};
    if (reserve_out(w, MOEX_PROTO_HEADER_BYTES + MOEX_PROTO_HEARTBEAT_BYTES)) return -1;
    if (moex_proto_encode_heartbeat(seq, &hb, w->out, w->out_cap, &w->out_len, &w->err)) return -1;
    return (int)w->out_len;
}

API int moex_wasm_encode_error(moex_wasm *w, uint32_t seq, int code, const char *text, int text_len) {
    const uint16_t n = (uint16_t)(text_len < 0 ? 0 : text_len > 1000 ? 1000 : text_len);
    if (reserve_out(w, MOEX_PROTO_HEADER_BYTES + MOEX_PROTO_ERROR_FIXED_BYTES + n)) return -1;
    if (moex_proto_encode_error(seq, code, text, n, w->out, w->out_cap, &w->out_len, &w->err)) return -1;
    return (int)w->out_len;
}

/* What an ERROR code makes a worker do (moex_proto_error_action), and its name. */
API int moex_wasm_error_action(int code) {
    const moex_proto_error_info *i = moex_proto_error_info_of(code);
    return i ? (int)i->on_worker : -1;
}
API const char *moex_wasm_error_name(int code) {
    const moex_proto_error_info *i = moex_proto_error_info_of(code);
    return i ? i->name : "unknown";
}
API const char *moex_wasm_strerror(int status) { return moex_proto_strerror(status); }

/* ---- the CPU path: experts in the heap, the worker core ---- */

static moex_matrix matrix_at(int type, int64_t rows, int64_t cols, const uint8_t *data) {
    return (moex_matrix){.type = (moex_type)type, .rows = rows, .cols = cols,
                         .row_bytes = moex_row_bytes((moex_type)type, cols), .data = data};
}

/* Holds an expert whose gate|up|down bytes (as /v1/expert sends them) are at
 * data, a moex_wasm_malloc'ed buffer the handle now owns. 0 or -1. */
API int moex_wasm_hold(moex_wasm *w, int layer, int expert, uint8_t *data, uint32_t len, int gate_type,
                       int up_type, int down_type, int n_ff) {
    if (!w->core) return moex_fail(&w->err, "this handle has no model shape");
    if (layer < 0 || layer >= w->n_layers || expert < 0 || expert >= w->n_experts)
        return moex_fail(&w->err, "expert (%d, %d) outside %d x %d", layer, expert, w->n_layers, w->n_experts);
    const size_t i = (size_t)layer * w->n_experts + expert;
    moex_expert_weights ew = {
        .gate = matrix_at(gate_type, n_ff, w->hidden, data),
        .up = matrix_at(up_type, n_ff, w->hidden, NULL),
        .down = matrix_at(down_type, w->hidden, n_ff, NULL),
    };
    const size_t gb = ew.gate.row_bytes * (size_t)n_ff, ub = ew.up.row_bytes * (size_t)n_ff,
                 db = ew.down.row_bytes * (size_t)w->hidden;
    if (!ew.gate.row_bytes || !ew.up.row_bytes || !ew.down.row_bytes || gb + ub + db != len)
        return moex_fail(&w->err, "expert (%d, %d): %u bytes, types %d/%d/%d with n_ff %d need %zu", layer, expert, len,
                         gate_type, up_type, down_type, n_ff, gb + ub + db);
    ew.up.data = data + gb;
    ew.down.data = data + gb + ub;
    moex_worker_core_drop(w->core, layer, expert);
    free(w->owned[i]);
    w->owned[i] = data;
    w->weights[i] = ew;
    if (moex_worker_core_hold(w->core, layer, expert, &w->weights[i], &w->err)) {
        w->owned[i] = NULL;
        return -1;
    }
    return 0;
}

API void moex_wasm_drop(moex_wasm *w, int layer, int expert) {
    if (!w->core || layer < 0 || layer >= w->n_layers || expert < 0 || expert >= w->n_experts) return;
    const size_t i = (size_t)layer * w->n_experts + expert;
    moex_worker_core_drop(w->core, layer, expert);
    free(w->owned[i]);
    w->owned[i] = NULL;
}

API int moex_wasm_holds(moex_wasm *w, int layer, int expert) {
    return w->core && moex_worker_core_holds(w->core, layer, expert);
}

/* DISPATCH -> RESULT on the CPU. The frame's length, or -1 (moex_wasm_error:
 * expert not held, bad shape, a bad frame). */
API int moex_wasm_compute(moex_wasm *w, const uint8_t *frame, uint32_t len) {
    moex_proto_msg m;
    if (!w->core) return moex_fail(&w->err, "this handle has no model shape");
    if (decode(w, frame, len, &m)) return -1;
    const size_t need = moex_worker_result_bytes(&m);
    if (!need) return moex_fail(&w->err, "frame %u is not a valid DISPATCH", m.h.seq);
    if (reserve_out(w, need)) return -1;
    if (moex_worker_core_compute(w->core, &m, w->out, w->out_cap, &w->out_len, &w->err)) return -1;
    return (int)w->out_len;
}

/* ---- XXH3-64 (seed 0), streaming: one hash in flight per handle ---- */

API void moex_wasm_hash_reset(moex_wasm *w) { XXH3_64bits_reset(&w->hash); }
API void moex_wasm_hash_update(moex_wasm *w, const void *data, uint32_t len) { XXH3_64bits_update(&w->hash, data, len); }
API void moex_wasm_hash_digest(moex_wasm *w, uint32_t out[2]) {
    const uint64_t h = XXH3_64bits_digest(&w->hash);
    out[0] = (uint32_t)h;
    out[1] = (uint32_t)(h >> 32);
}

/* ---- kernels, for tests and benchmarks ---- */

API uint32_t moex_wasm_row_bytes(int type, int n) { return (uint32_t)moex_row_bytes((moex_type)type, n); }
API int moex_wasm_quantize_row(int type, const float *src, void *dst, int n) {
    return moex_quantize_row((moex_type)type, src, dst, n, NULL);
}
API int moex_wasm_dequantize_row(int type, const void *src, float *dst, int n) {
    return moex_dequantize_row((moex_type)type, src, dst, n, NULL);
}
API const char *moex_wasm_simd_name(void) { return moex_kernels_simd_name(); }

#ifdef __wasm_simd128__
const moex_simd_table *moex_wasm_portable_table(void); /* dot_wasm.c */
#else
static const moex_simd_table *moex_wasm_portable_table(void) { return moex_simd_portable(); }
#endif

/* One dot product of a weight row of type with n f32 activations (rounded
 * to the type's partner type as the kernels do), by the table in use
 * (use_portable 0) or the portable one (1): tests check they agree. */
API int moex_wasm_vec_dot(int use_portable, int type, int n, const void *wrow, const float *x, float *out) {
    const moex_simd_table *t = use_portable ? moex_wasm_portable_table() : moex_simd_active();
    const int at = moex_vec_dot_type((moex_type)type);
    if (at < 0 || !t->vec_dot[type] || !moex_row_bytes((moex_type)type, n)) return -1;
    if (at == MOEX_TYPE_F32) {
        t->vec_dot[type](n, wrow, x, out);
        return 0;
    }
    void *q = malloc(moex_row_bytes((moex_type)at, n));
    if (!q) return -1;
    t->quantize_act[at](x, q, n);
    t->vec_dot[type](n, wrow, q, out);
    free(q);
    return 0;
}

/* One expert on n_tokens rows of x (f32, n_tokens x hidden) with gates:
 * out = gates[t] * down(silu(gate x) * up x), as the CPU core computes it.
 * data: gate|up|down bytes (not taken over). 0 or -1. */
API int moex_wasm_expert_ffn(moex_wasm *w, const uint8_t *data, int gate_type, int up_type, int down_type, int hidden,
                             int n_ff, const float *x, const float *gates, int n_tokens, float *out) {
    moex_expert_weights ew = {
        .gate = matrix_at(gate_type, n_ff, hidden, data),
        .up = matrix_at(up_type, n_ff, hidden, NULL),
        .down = matrix_at(down_type, hidden, n_ff, NULL),
    };
    if (!ew.gate.row_bytes || !ew.up.row_bytes || !ew.down.row_bytes || n_tokens <= 0)
        return moex_fail(&w->err, "expert_ffn: types %d/%d/%d do not fit hidden %d, n_ff %d", gate_type, up_type,
                         down_type, hidden, n_ff);
    ew.up.data = data + ew.gate.row_bytes * (size_t)n_ff;
    ew.down.data = (const uint8_t *)ew.up.data + ew.up.row_bytes * (size_t)n_ff;
    int32_t *rows = malloc((size_t)n_tokens * sizeof *rows);
    if (!rows) return moex_fail(&w->err, "out of memory");
    for (int t = 0; t < n_tokens; t++) rows[t] = t;
    const moex_expert_job job = {.w = &ew, .n_tokens = n_tokens, .rows = rows, .gates = gates, .out = out};
    const int rc = moex_experts_run(NULL, &job, 1, x, hidden, NULL);
    free(rows);
    return rc ? moex_fail(&w->err, "expert_ffn failed") : 0;
}
