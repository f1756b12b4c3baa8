/* libFuzzer target for the hub's frame handling as a whole: the registry and
 * the remote executor, driven by arbitrary sequences of frames from up to
 * four fake workers (JOIN, HEARTBEAT, RESULT, ERROR, raw bytes, in any order,
 * connecting and leaving), through the network thread's own routing
 * (hub_route_message) while MoE layers run.
 *
 * One thread plays everything: the fake workers live on detached
 * connections (conn.c: no socket; what the hub sends them waits in their
 * queues, which they read), and the inbox's wait hook hands control to the
 * input whenever the executor would wait for the network. Deadlines are
 * 1 ms, so a timeout costs a millisecond. Checked besides ASan/UBSan and
 * leaks: every layer completes (local fallback is on) and its output is
 * finite whatever the workers sent.
 *
 * The model is a tiny generated GGUF named by MOEX_FUZZ_HUB_MODEL
 * (tests/hub/tests.cmake generates it; see docs/PROTOCOL.md, Fuzzing). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hub/executor.h"
#include "hub/server.h"

#define FAKES 4
#define MAX_SEEN 16          /* DISPATCHes each fake remembers, to answer */
#define MAX_WAITS 8          /* deadlines an input may let pass (1 ms each) */
#define MAX_TOKENS 4

typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader;

static uint8_t u8(reader *r) {
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}
/* Little-endian, low byte read first. */
static uint16_t u16(reader *r) {
    const uint16_t lo = u8(r);
    return (uint16_t)(lo | u8(r) << 8);
}
static uint32_t u32(reader *r) {
    const uint32_t lo = u16(r);
    return lo | (uint32_t)u16(r) << 16;
}
static uint64_t u64(reader *r) {
    const uint64_t lo = u32(r);
    return lo | (uint64_t)u32(r) << 32;
}

typedef struct fake {
    hub_conn *conn;          /* the "network thread's" reference; NULL: not connected */
    hub_worker *w;
    uint32_t gen;            /* seq of its last ASSIGN */
    uint64_t session;        /* its key */
    moex_proto_header seen[MAX_SEEN];
    int n_seen;
} fake;

typedef struct world {
    const moex_model *m;
    moex_proto_limits lim;
    hub_net *net;
    hub_inbox *inbox;
    hub_registry *reg;
    hub_executor *exec;
    hub_metrics metrics;
    fake f[FAKES];
    reader in;
    bool in_layer;
    int waits, idle_wakes;
    uint8_t frame[64 * 1024];
    float values[MAX_TOKENS * 1024];
} world;

static struct {
    moex_model *m;
    moex_pool *pool;
    bool stats;              /* MOEX_FUZZ_HUB_STATS: print each input's hub counters */
} g;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *path = getenv("MOEX_FUZZ_HUB_MODEL");
    setenv("MOEX_LOG", "error", 0); /* every refused frame is a warning: quiet */
    moex_error err = {0};
    if (!path || !(g.m = moex_model_load(path, &err))) {
        fprintf(stderr, "fuzz_hub: set MOEX_FUZZ_HUB_MODEL to a small MoE GGUF (%s)\n", path ? err.msg : "unset");
        exit(2);
    }
    if (g.m->hp.n_embd > 1024 || !moex_hparams_is_moe(&g.m->hp)) {
        fprintf(stderr, "fuzz_hub: the model must be a MoE with n_embd <= 1024\n");
        exit(2);
    }
    g.pool = moex_pool_create(1);
    g.stats = getenv("MOEX_FUZZ_HUB_STATS") != NULL;
    return 0;
}

/* ---- what a fake worker reads ---- */

static void remember_dispatch(fake *f, const moex_proto_header *h) {
    if (f->n_seen == MAX_SEEN) memmove(f->seen, f->seen + 1, (MAX_SEEN - 1) * sizeof f->seen[0]), f->n_seen--;
    f->seen[f->n_seen++] = *h;
}

/* Reads everything the hub queued for the fake: ASSIGNs (generation, key), DISPATCHes. */
static void drain(world *wd, fake *f) {
    size_t len;
    uint8_t *buf;
    while (f->conn && (buf = hub_conn_pop(f->conn, &len))) {
        const uint8_t *msg = buf + LWS_PRE;
        size_t off = 0, n;
        while (moex_proto_next_frame(msg, len, &off, NULL, &n, NULL) == 1) {
            moex_proto_header h;
            moex_proto_header_read(msg + off, &h);
            if (h.type == MOEX_MSG_DISPATCH) {
                remember_dispatch(f, &h);
            } else if (h.type == MOEX_MSG_ASSIGN) {
                moex_proto_msg m;
                if (!moex_proto_decode(msg + off, n, NULL, NULL, 0, &m, NULL)) {
                    f->gen = h.seq;
                    f->session = m.u.assign.info.session;
                }
            }
            off += n;
        }
        free(buf);
    }
    (void)wd;
}

/* ---- what a fake worker sends ---- */

/* The network thread's handling of one message from the fake's connection. */
static void deliver(world *wd, fake *f, const uint8_t *msg, size_t len) {
    if (!f->conn || !f->w || !hub_conn_open(f->conn)) return; /* closing: what it sends is dropped */
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return;
    memcpy(buf, msg, len);
    hub_route_message(wd->reg, wd->inbox, &wd->lim, f->w, &buf, len);
    free(buf); /* NULL when the inbox took it */
}

static void op_connect(world *wd, fake *f) {
    if (f->conn) return;
    f->conn = hub_conn_create_detached(wd->net, 64 * 1024, "fuzz");
    if (!f->conn) return;
    f->w = hub_registry_connect(wd->reg, f->conn);
    if (!f->w) { /* refused: lws would close it */
        hub_conn_closed(f->conn);
        hub_conn_unref(f->conn);
        f->conn = NULL;
    }
    f->n_seen = 0;
}

static void op_disconnect(world *wd, fake *f) {
    if (!f->conn) return;
    hub_conn_closed(f->conn);
    hub_registry_disconnect(wd->reg, f->w, "fuzz: closed");
    hub_conn_unref(f->conn);
    f->conn = NULL;
    f->w = NULL;
}

static uint64_t pick_session(world *wd, fake *f) {
    switch (u8(&wd->in) % 4) {
    case 0: return 0;
    case 1: return f->session;                          /* its own key: a reconnect */
    case 2: return wd->f[u8(&wd->in) % FAKES].session;  /* someone else's */
    default: return u64(&wd->in);
    }
}

static void op_join(world *wd, fake *f) {
    static const char *const names[] = {"w0", "w1", "w0", "impostor"};
    reader *in = &wd->in;
    /* one read per statement: the input is consumed in a defined order */
    const uint8_t flags = u8(in);
    const char *name = names[flags & 3];
    moex_proto_join j = {.proto_min = 1, .proto_max = (flags & 4) ? 3 : 1, .name = name,
                         .name_len = (uint8_t)strlen(name)};
    j.backend = (uint8_t)(u8(in) % 4);
    /* mostly small weights (placement's ring is 256 points a unit: large ones make every input slow);
     * the whole range, up to the clamp and past it, when asked */
    j.capacity_centi = (flags & 16) ? u16(in) : (uint16_t)(1 + u8(in));
    if (!j.capacity_centi) j.capacity_centi = 1;
    j.memory_budget = u64(in);
    j.model_hash = (flags & 8) ? u64(in) : moex_gguf_identity(wd->m->gguf);
    j.session = pick_session(wd, f);
    const uint32_t seq = u8(in);
    size_t len;
    if (!moex_proto_encode_join(seq, &j, NULL, 0, wd->frame, sizeof wd->frame, &len, NULL))
        deliver(wd, f, wd->frame, len);
}

static size_t heartbeat_frame(world *wd, fake *f, uint8_t *out, size_t cap) {
    reader *in = &wd->in;
    const uint8_t s = u8(in);
    moex_proto_heartbeat hb = {.state = (uint8_t)(s % 4)};
    hb.timestamp_us = u64(in);
    hb.echo_us = (s & 8) ? u64(in) : 0;
    hb.queue_depth = u8(in);
    hb.load_permille = (uint16_t)(u16(in) % 1001);
    size_t len = 0;
    const uint32_t seq = (s & 16) ? u32(in) : f->gen; /* READY for its generation, mostly */
    if (moex_proto_encode_heartbeat(seq, &hb, out, cap, &len, NULL)) return 0;
    return len;
}

/* A RESULT for one of the DISPATCHes the fake saw: right shape or not,
 * values ordinary, zero, NaN, Inf or huge, in any wire dtype. */
static size_t result_frame(world *wd, fake *f, uint8_t *out, size_t cap) {
    reader *in = &wd->in;
    if (!f->n_seen) return 0;
    const moex_proto_header *d = &f->seen[u8(in) % f->n_seen];
    const uint8_t how = u8(in);
    static const uint8_t dtypes[] = {MOEX_DT_F16, MOEX_DT_BF16, MOEX_DT_INT8, MOEX_DT_F32};
    moex_proto_tensor_msg m = {.type = MOEX_MSG_RESULT, .seq = d->seq, .layer = d->layer, .expert = d->expert,
                               .n_tokens = d->n_tokens, .hidden = d->hidden, .dtype = dtypes[how & 3]};
    if (how & 0x40) { /* a shape that does not match its DISPATCH */
        const uint8_t which = u8(in);
        if (which & 1) m.n_tokens = 1 + u8(in) % MAX_TOKENS;
        if (which & 2) m.expert = (uint16_t)(u8(in) % wd->lim.max_experts);
        if (which & 4) m.layer = (uint16_t)(u8(in) % wd->lim.max_layers);
        if (which & 8) m.seq = u32(in);
    }
    if (m.n_tokens > MAX_TOKENS || (size_t)m.n_tokens * m.hidden > sizeof wd->values / sizeof wd->values[0]) return 0;
    const size_t n = (size_t)m.n_tokens * m.hidden;
    const int kind = (how >> 2) % 6;
    for (size_t i = 0; i < n; i++) {
        float v;
        switch (kind) {
        case 0: v = 0.0f; break;
        case 1: v = (float)((int)(wd->in.n ? wd->in.p[i % wd->in.n] : 0) - 128) / 64.0f; break;
        case 2: v = i % 7 == 0 ? NAN : 0.5f; break;
        case 3: v = i % 5 == 0 ? -INFINITY : 1.0f; break;
        case 4: v = 6.0e4f; break;                  /* near f16's largest */
        default: v = i % 3 ? 1.0e30f : -1.0e30f; break; /* f16 rounds it to Inf */
        }
        wd->values[i] = v;
    }
    size_t len = 0;
    if (!moex_proto_encode_tensor_f32(&m, wd->values, NULL, out, cap, &len, NULL)) return len;
    /* int8 cannot carry non-finite rows: send the bytes with a NaN scale instead */
    moex_proto_tensor_layout lay;
    if (m.dtype != MOEX_DT_INT8 || moex_proto_compute_layout(MOEX_MSG_RESULT, m.dtype, m.n_tokens, m.hidden, &lay))
        return 0;
    static uint8_t q[MAX_TOKENS * 1024];
    float scales[MAX_TOKENS];
    memset(q, 1, n);
    for (uint32_t t = 0; t < m.n_tokens; t++) scales[t] = NAN;
    if (moex_proto_encode_tensor_raw(&m, q, scales, NULL, out, cap, &len, NULL)) return 0;
    return len;
}

static size_t error_frame(world *wd, fake *f, uint8_t *out, size_t cap) {
    reader *in = &wd->in;
    const uint32_t seq = f->n_seen ? f->seen[u8(in) % f->n_seen].seq : u32(in);
    const int32_t code = (int32_t)(u8(in) % 26) - 16; /* statuses, unknown, 1..9 */
    size_t len = 0;
    if (moex_proto_encode_error(seq, code, "fuzz", 4, out, cap, &len, NULL)) return 0;
    return len;
}

/* One message of up to four frames (results, errors, heartbeats), or raw bytes. */
static void op_message(world *wd, fake *f, int kind) {
    size_t len = 0;
    if (kind == 3) { /* raw */
        const size_t n = u8(&wd->in);
        for (size_t i = 0; i < n && wd->in.n; i++) wd->frame[len++] = u8(&wd->in);
        deliver(wd, f, wd->frame, len);
        return;
    }
    const int frames = 1 + u8(&wd->in) % 4;
    for (int i = 0; i < frames; i++) {
        uint8_t *at = wd->frame + len;
        const size_t cap = sizeof wd->frame - len;
        const int what = i == 0 ? kind : u8(&wd->in) % 3;
        len += what == 0 ? result_frame(wd, f, at, cap) : what == 1 ? error_frame(wd, f, at, cap)
                                                                    : heartbeat_frame(wd, f, at, cap);
    }
    if (len) deliver(wd, f, wd->frame, len);
}

/* ---- the layers ---- */

static void run_layer(world *wd) {
    reader *in = &wd->in;
    const moex_hparams *hp = &wd->m->hp;
    const int k = hp->n_expert_used, d = (int)hp->n_embd;
    const int64_t n = 1 + u8(in) % MAX_TOKENS;
    int32_t ids[MAX_TOKENS * 8];
    float gates[MAX_TOKENS * 8];
    static float x[MAX_TOKENS * 1024], out[MAX_TOKENS * 1024];
    for (int64_t i = 0; i < n * k; i++) {
        ids[i] = u8(in) % hp->n_expert;
        gates[i] = 1.0f / (float)k;
    }
    for (int64_t i = 0; i < n * d; i++) x[i] = (float)((int)((i * 37 + n) % 17) - 8) / 8.0f;
    const int layer = u8(in) % hp->n_layer;
    moex_moe_request req = {.layer = layer, .n_tokens = n, .n_used = k, .expert_ids = ids, .gate_weights = gates,
                            .x = x, .out = out};
    const moex_expert_executor ex = hub_executor_iface(wd->exec);
    moex_error err = {0};
    wd->in_layer = true;
    const int rc = ex.run(ex.ctx, &req, &err);
    wd->in_layer = false;
    if (rc) {
        fprintf(stderr, "fuzz_hub: a layer failed with local fallback on: %s\n", err.msg);
        abort();
    }
    for (int64_t i = 0; i < n * d; i++)
        if (!isfinite(out[i])) {
            fprintf(stderr, "fuzz_hub: a non-finite output reached the layer's result (token %lld)\n",
                    (long long)(i / d));
            abort();
        }
}

/* One step of the input. Returns false at its end. */
static bool step(world *wd) {
    reader *in = &wd->in;
    if (!in->n) return false;
    const uint8_t op = u8(in);
    fake *f = &wd->f[(op >> 4) % FAKES];
    drain(wd, f); /* it reads what it was sent before it acts */
    switch (op & 15) {
    case 0: op_connect(wd, f); break;
    case 1: op_disconnect(wd, f); break;
    case 2: case 3: op_join(wd, f); break;
    case 4: op_message(wd, f, 2); break;           /* heartbeat */
    case 5: case 6: case 7: op_message(wd, f, 0); break; /* results */
    case 8: op_message(wd, f, 1); break;           /* errors */
    case 9: op_message(wd, f, 3); break;           /* raw bytes */
    case 10: /* a text message: the network thread refuses it */
        if (f->w && hub_conn_open(f->conn))
            hub_registry_bad_frame(wd->reg, f->w, 0, MOEX_PROTO_E_TYPE, "a text message");
        break;
    case 11: hub_registry_tick(wd->reg, moex_time_s() + u8(in) / 20.0); break; /* up to 12.7 s ahead */
    case 12: case 13:
        if (!wd->in_layer) run_layer(wd);
        break;
    case 14: /* let a deadline pass */
        if (wd->in_layer && wd->waits < MAX_WAITS) wd->waits++;
        break;
    default: op_connect(wd, f), op_join(wd, f); break;
    }
    return true;
}

/* The inbox is empty and the executor would wait: the input acts instead.
 * (A pop that would not wait, the executor draining what is there, is left alone.) */
static void on_wait(void *ctx, double deadline) {
    world *wd = ctx;
    if (!wd->in_layer || deadline <= moex_time_s()) return;
    const int waits = wd->waits;
    if (step(wd)) {
        if (wd->waits == waits) hub_inbox_push(wd->inbox, &(hub_event){.kind = HUB_EV_WAKE});
        return;
    }
    /* the input is spent: the workers leave, the hub finishes the layer itself */
    for (int i = 0; i < FAKES; i++) op_disconnect(wd, &wd->f[i]);
    if (isinf(deadline) || ++wd->idle_wakes < 10000) hub_inbox_push(wd->inbox, &(hub_event){.kind = HUB_EV_WAKE});
}

static moex_proto_limits limits_of(const moex_model *m) {
    moex_proto_limits lim = moex_proto_default_limits();
    lim.max_hidden = (uint32_t)m->hp.n_embd;
    lim.max_layers = (uint32_t)m->hp.n_layer;
    lim.max_experts = (uint32_t)m->hp.n_expert;
    lim.max_tokens = MAX_TOKENS;
    lim.max_frame_bytes = 1u << 20;
    return lim;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static world wd;
    memset(&wd, 0, sizeof wd);
    wd.m = g.m;
    wd.in = (reader){data, size};
    wd.lim = limits_of(g.m);
    reader *in = &wd.in;
    const uint8_t cfg = u8(in);
    static const int dtypes[] = {MOEX_DT_F16, MOEX_DT_BF16, MOEX_DT_INT8, MOEX_DT_F32};
    hub_registry_config rc = {.model_hash = moex_gguf_identity(g.m->gguf), .n_layers = g.m->hp.n_layer,
                              .n_experts = g.m->hp.n_expert, .replicas = 1 + cfg % 3, .heartbeat_ms = 1000,
                              .dead_after_ms = 3000};
    hub_executor_config xc = {.hedge = (cfg >> 2) % 3, .timeout_ms = 1, .verify_p = (cfg & 0x10) ? 1.0 : 0.0,
                              .local_fallback = true, .wire_dtype = dtypes[(cfg >> 5) & 3], .max_batch = MAX_TOKENS,
                              .seed = 1};
    moex_error err = {0};
    wd.net = hub_net_create();
    wd.inbox = hub_inbox_create(16, 64 * 1024); /* small bounds: floods of results reach them */
    wd.reg = wd.net && wd.inbox ? hub_registry_create(&rc, wd.net, wd.inbox, &wd.metrics, &err) : NULL;
    wd.exec = wd.reg ? hub_executor_create(g.m, g.pool, &xc, wd.reg, wd.inbox, wd.net, &wd.metrics, &wd.lim, &err)
                     : NULL;
    if (wd.exec) {
        hub_inbox_set_wait_hook(wd.inbox, on_wait, &wd);
        while (step(&wd)) {
        }
    }
    if (g.stats) /* what the input reached, for seed and corpus triage */
        fprintf(stderr, "fuzz_hub: idle wakes %d, dispatches %llu, fallbacks %llu, timeouts %llu, re-dispatches %llu, "
                        "hedges %llu, bad results %llu, bad frames %llu, evictions %llu, verified %llu, errors %llu\n",
                wd.idle_wakes,
                HUB_GET(&wd.metrics, dispatches), HUB_GET(&wd.metrics, fallbacks), HUB_GET(&wd.metrics, timeouts),
                HUB_GET(&wd.metrics, redispatches), HUB_GET(&wd.metrics, hedges_sent),
                HUB_GET(&wd.metrics, bad_results), HUB_GET(&wd.metrics, bad_frames), HUB_GET(&wd.metrics, evictions),
                HUB_GET(&wd.metrics, verified), HUB_GET(&wd.metrics, errors_in));
    /* as moex_hub_stop: the executor and registry stop, then the sockets close */
    if (wd.exec) hub_executor_stop(wd.exec);
    if (wd.reg) hub_registry_stop(wd.reg);
    for (int i = 0; i < FAKES; i++) op_disconnect(&wd, &wd.f[i]);
    hub_executor_free(wd.exec);
    hub_registry_free(wd.reg);
    hub_inbox_free(wd.inbox);
    hub_net_free(wd.net);
    return 0;
}
