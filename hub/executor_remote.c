/* The remote expert executor: a MoE layer's experts computed by workers.
 *
 * One layer, on the engine's thread:
 *   plan      the engine's MoE plan groups the (token, expert) pairs: one task per active expert
 *   encode    x rounded to the wire dtype once; one DISPATCH frame per task
 *   choose    replicas from the registry (placement, ready, healthy), fastest first by the latency record
 *   send      each worker gets ONE message holding all its frames of the layer; one wake of the network thread
 *   wait      on the inbox: RESULT messages (the first valid answer per task wins, the other replicas get a
 *             CANCEL), ERRORs and departures (re-dispatch at once), deadlines (time out, re-dispatch), deferred
 *             hedges; an expert with no replica left is computed here while the network works
 *   verify    a sampled fraction checked here against what an honest backend can give (hub/verify.h); a
 *             worker outside it is evicted, the hub's answer used; so is one whose result holds non-finite
 *             values or values beyond what the expert can produce (checked on every result)
 *   combine   the plan sums each token's k results in slot order, as the local executor does
 *
 * Everything here belongs to the engine's thread: the network thread only
 * hands messages over through the inbox, so tasks need no lock. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "hub/executor.h"
#include "hub/verify.h"

#define MAX_SENDS 8              /* replicas one task may be sent to, re-dispatches included */
#define TIMING_LAYERS 4096       /* layers kept for the time breakdown */
#define PROBE_AFTER_S 0.5        /* a replica whose estimate is older than this ... */
#define PROBE_ONE_IN 16          /* ... goes first for one task in this many */
/* Values to convert at which the pool helps (encode, decode): below it the
 * threads' wake-up costs more than they save (an 8-stream decode layer's
 * 64 rows x 2048 encode alone in ~30 us, against ~240 on the pool). */
#define PARALLEL_ELEMENTS (1 << 20)
enum { NORMS_UNKNOWN, NORMS_KNOWN, NORMS_FAILED };

typedef struct hub_send {
    uint32_t worker;
    hub_conn *conn;              /* referenced until the layer ends */
    double at;
    bool failed;                 /* errored, timed out, bad result or its worker left */
    bool hedge;                  /* a second copy beside a live one (not a re-dispatch) */
} hub_send;

typedef struct hub_task {
    uint32_t seq;
    int group;                   /* in the plan */
    int expert;
    int64_t n_tokens;
    uint8_t *frame;              /* the encoded DISPATCH */
    size_t frame_len, frame_cap;
    hub_send sends[MAX_SENDS];
    int n_sent;
    double deadline_s, hedge_at_s;
    bool done, local;
    bool claimed;                /* a RESULT of the message being handled writes its rows */
    bool dup_sane;               /* the duplicate passed hub_rows_sane */
    bool limits_ready;           /* x->pair_max holds this task's pairs */
    bool suspect;                /* a replica sent values no honest worker can: computed here to confirm */
    uint32_t suspect_from;
    uint32_t winner;
    float *dup;                  /* a hedged duplicate's rows, compared after the layer */
    size_t dup_cap;
    uint32_t dup_from;
    bool dup_seen;
} hub_task;

/* The message being built for one worker in this round of sends. */
typedef struct outgoing {
    uint32_t worker;
    hub_conn *conn;              /* referenced */
    uint8_t *buf;                /* hub_conn_buffer: headroom, then the frames */
    size_t len, cap;
    int frames;
} outgoing;

/* A RESULT of the message being handled, between its two passes. */
typedef struct pending_result {
    moex_proto_tensor_view view;
    uint32_t seq;
    struct hub_task *task;       /* NULL: nothing to do with it */
    int send;
    float *dst;                  /* where its rows go */
    const double *limits;        /* each token's largest honest |value| (x->pair_max from the task's first pair) */
    bool duplicate, mismatch, sane;
} pending_result;

typedef struct worker_count {
    uint32_t worker;
    int n;
} worker_count;

/* A worker's message of this round is sent once it holds this many bytes,
 * and the rest of its frames follow in further messages: a prompt's layer
 * (megabytes a worker) then flows as a pipeline — the network thread writes
 * the first part while the executor queues the next, the worker computes
 * one part while it receives the next — instead of each side waiting for
 * the whole. A decode layer's message (a few rows) stays one message.
 * moex_hub_config.split_bytes (--split-bytes) overrides it (tests split every
 * frame apart). */
#define MESSAGE_SPLIT_BYTES (256 * 1024)

/* Per-layer times (µs), a ring; n_tokens tells a prompt's layers from a decode's. */
typedef struct layer_times {
    float plan_encode, send, wait, decode, combine;
    float round;   /* send + wait: the first byte handed to a socket to the last result in (the round trip) */
    int64_t n_tokens;
} layer_times;

/* Layers of more tokens than this (a prompt's batches) get a timing line of their own. */
#define TIMING_SMALL_TOKENS 16

struct hub_executor {
    const moex_model *m;
    moex_pool *pool;
    hub_executor_config cfg;
    hub_registry *reg;
    hub_inbox *inbox;
    hub_net *net;
    hub_metrics *metrics;
    moex_proto_limits limits;
    atomic_bool stopping;
    int64_t d;                   /* n_embd */

    moex_moe_plan plan;
    hub_task *tasks;
    int n_tasks, cap_tasks;
    uint32_t next_seq, seq0;
    int layer;

    float *x_wire;               /* [cap_tokens x d] */
    float *x_absmax;             /* [cap_tokens]: each token's largest |x| */
    double *pair_max;            /* [cap_pairs]: each pair's largest honest |result| value */
    moex_expert_norms *norms;    /* [layers x experts], computed on first use (learn_norms) */
    uint8_t *norms_state;        /* NORMS_UNKNOWN, NORMS_KNOWN or NORMS_FAILED (a type without a dequantizer) */
    moex_expert_check *checker;  /* verification: the exact chain and its bound */
    double *ref, *tol;           /* [MOEX_EXPERT_CHECK_VARIANTS x d] */
    float *results;              /* [cap_pairs x d] grouped, as the plan orders pairs */
    int64_t cap_tokens, cap_pairs;
    uint8_t *tmp;                /* one row in wire form */
    uint8_t *scratch;            /* decompressing RESULT frames */
    size_t scratch_cap;

    pending_result *pending;     /* the RESULTs of one message */
    int cap_pending;
    float *gather;               /* [pool threads x cap_gather x d]: one task's rows per encoding thread */
    int64_t cap_gather;          /* rows of each thread's part */
    const float *req_x;          /* the request's x: rounded into x_wire only when computed here */
    int64_t n_req_tokens;
    bool x_wire_ready;
    outgoing out[HUB_MAX_WORKERS];
    int n_out;
    size_t split_bytes;          /* MESSAGE_SPLIT_BYTES, or cfg->split_bytes */
    worker_count inflight[HUB_MAX_WORKERS];  /* sends of this layer per worker */
    int n_inflight;
    uint64_t rng;

    layer_times times[TIMING_LAYERS];
    uint64_t n_times;
    double decode_s;             /* this layer's RESULT decoding so far */
};

/* ---- set-up ---- */

hub_executor *hub_executor_create(const moex_model *m, moex_pool *pool, const hub_executor_config *cfg,
                                  hub_registry *reg, hub_inbox *inbox, hub_net *net, hub_metrics *metrics,
                                  const moex_proto_limits *limits, moex_error *err) {
    hub_executor *x = calloc(1, sizeof *x);
    const size_t n_experts = (size_t)m->hp.n_layer * (size_t)m->hp.n_expert;
    if (!x || !(x->tmp = malloc(moex_wire_tmp_bytes(m->hp.n_embd))) ||
        !(x->norms = calloc(n_experts, sizeof *x->norms)) || !(x->norms_state = calloc(n_experts, 1)) ||
        !(x->checker = moex_expert_check_create()) ||
        !(x->ref = malloc(MOEX_EXPERT_CHECK_VARIANTS * (size_t)m->hp.n_embd * sizeof(double))) ||
        !(x->tol = malloc(MOEX_EXPERT_CHECK_VARIANTS * (size_t)m->hp.n_embd * sizeof(double)))) {
        hub_executor_free(x);
        moex_fail(err, "out of memory");
        return NULL;
    }
    x->m = m;
    x->pool = pool;
    x->cfg = *cfg;
    x->reg = reg;
    x->inbox = inbox;
    x->net = net;
    x->metrics = metrics;
    x->limits = *limits;
    x->d = m->hp.n_embd;
    x->next_seq = 1;
    x->rng = cfg->seed * 0x9E3779B97F4A7C15ull + 1;
    x->split_bytes = cfg->split_bytes > 0 ? (size_t)cfg->split_bytes : MESSAGE_SPLIT_BYTES;
    atomic_init(&x->stopping, false);
    return x;
}

static void release_sends(hub_executor *x) {
    for (int i = 0; i < x->n_tasks; i++) {
        hub_task *t = &x->tasks[i];
        for (int s = 0; s < t->n_sent; s++) hub_conn_unref(t->sends[s].conn);
        t->n_sent = 0;
    }
}

void hub_executor_free(hub_executor *x) {
    if (!x) return;
    release_sends(x);
    free(x->x_absmax);
    free(x->pair_max);
    free(x->norms);
    free(x->norms_state);
    moex_expert_check_free(x->checker);
    free(x->ref);
    free(x->tol);
    for (int i = 0; i < x->cap_tasks; i++) {
        free(x->tasks[i].frame);
        free(x->tasks[i].dup);
    }
    free(x->tasks);
    moex_moe_plan_free(&x->plan);
    free(x->x_wire);
    free(x->results);
    free(x->gather);
    free(x->pending);
    free(x->tmp);
    free(x->scratch);
    free(x);
}

void hub_executor_stop(hub_executor *x) {
    atomic_store(&x->stopping, true);
    hub_inbox_push(x->inbox, &(hub_event){.kind = HUB_EV_WAKE});
}

/* Grows a float buffer of rows x d; once per batch size, never per decode token. */
static int grow_rows(float **buf, int64_t *cap, int64_t rows, int64_t d) {
    if (rows <= *cap) return 0;
    free(*buf);
    *buf = malloc((size_t)rows * (size_t)d * sizeof **buf);
    *cap = *buf ? rows : 0;
    return *buf ? 0 : -1;
}

static int reserve(hub_executor *x, int64_t n_tokens) {
    const moex_moe_plan *p = &x->plan;
    int64_t max_group = 0;
    for (int g = 0; g < p->n_groups; g++)
        if (p->group_first[g + 1] - p->group_first[g] > max_group) max_group = p->group_first[g + 1] - p->group_first[g];
    const int nth = moex_pool_size(x->pool);
    if (max_group > x->cap_gather) {
        free(x->gather);
        x->gather = malloc((size_t)nth * (size_t)max_group * (size_t)x->d * sizeof *x->gather);
        x->cap_gather = x->gather ? max_group : 0;
    }
    if (n_tokens > x->cap_tokens) {
        free(x->x_absmax);
        if (!(x->x_absmax = malloc((size_t)n_tokens * sizeof *x->x_absmax))) return -1;
    }
    if (p->n_pairs > x->cap_pairs) {
        free(x->pair_max);
        if (!(x->pair_max = malloc((size_t)p->n_pairs * sizeof *x->pair_max))) return -1;
    }
    if (!x->gather || grow_rows(&x->x_wire, &x->cap_tokens, n_tokens, x->d) ||
        grow_rows(&x->results, &x->cap_pairs, p->n_pairs, x->d))
        return -1;
    if (p->n_groups > x->cap_tasks) {
        hub_task *grown = realloc(x->tasks, (size_t)p->n_groups * sizeof *grown);
        if (!grown) return -1;
        memset(grown + x->cap_tasks, 0, (size_t)(p->n_groups - x->cap_tasks) * sizeof *grown);
        x->tasks = grown;
        x->cap_tasks = p->n_groups;
    }
    return 0;
}

static int grow_pending(hub_executor *x) {
    const int cap = x->cap_pending ? 2 * x->cap_pending : 64;
    pending_result *grown = realloc(x->pending, (size_t)cap * sizeof *grown);
    if (!grown) return -1;
    x->pending = grown;
    x->cap_pending = cap;
    return 0;
}


/* ---- encoding ---- */

/* The task's DISPATCH, from the request's x (the encoder rounds it to the
 * wire dtype, as the worker will see it). gather: this thread's rows. */
static int encode_task(hub_executor *x, hub_task *t, float *gather, moex_error *err) {
    const moex_moe_plan *p = &x->plan;
    const int32_t first = p->group_first[t->group];
    for (int64_t i = 0; i < t->n_tokens; i++)
        memcpy(gather + i * x->d, x->req_x + (int64_t)p->rows[first + i] * x->d, (size_t)x->d * sizeof(float));
    moex_proto_tensor_msg m = {.type = MOEX_MSG_DISPATCH, .seq = t->seq, .layer = (uint16_t)x->layer,
                               .expert = (uint16_t)t->expert, .n_tokens = (uint32_t)t->n_tokens,
                               .hidden = (uint16_t)x->d, .dtype = (uint8_t)x->cfg.wire_dtype};
    const size_t need = moex_proto_tensor_frame_bytes(&m);
    if (need > t->frame_cap) {
        free(t->frame);
        t->frame = malloc(need);
        t->frame_cap = t->frame ? need : 0;
        if (!t->frame) return moex_fail(err, "out of memory for a %zu-byte DISPATCH", need);
    }
    return moex_proto_encode_tensor_f32(&m, gather, p->gates + first, t->frame, t->frame_cap, &t->frame_len, err);
}

typedef struct encode_job {
    hub_executor *x;
    int *rc;                     /* [n_tasks] */
    moex_error *err;             /* the first failure's (thread 0 reports it) */
} encode_job;

static void encode_tasks(void *ctx, int ith, int nth) {
    encode_job *j = ctx;
    hub_executor *x = j->x;
    float *gather = x->gather + (size_t)ith * (size_t)x->cap_gather * (size_t)x->d;
    for (int i = ith; i < x->n_tasks; i += nth) j->rc[i] = encode_task(x, &x->tasks[i], gather, ith == 0 ? j->err : NULL);
}

/* ---- choosing replicas and sending ---- */

static int *inflight_of(hub_executor *x, uint32_t worker) {
    for (int i = 0; i < x->n_inflight; i++)
        if (x->inflight[i].worker == worker) return &x->inflight[i].n;
    if (x->n_inflight == HUB_MAX_WORKERS) return NULL;
    x->inflight[x->n_inflight] = (worker_count){.worker = worker, .n = 0};
    return &x->inflight[x->n_inflight++].n;
}

/* Expected wait for one more dispatch: its typical round trip times the work
 * already sent to it in this layer, so a prefill layer's many experts spread
 * over the replicas instead of piling onto the fastest. */
static float estimate_ms(hub_executor *x, const hub_replica *r) {
    const float lat = r->lat_ms < 0 ? 0.0f : r->lat_ms;
    const int *n = inflight_of(x, r->id);
    return (lat + 0.05f) * (float)(1 + (n ? *n : 0));
}

static bool already_sent(const hub_task *t, uint32_t worker) {
    for (int i = 0; i < t->n_sent; i++)
        if (t->sends[i].worker == worker) return true;
    return false;
}

/* Usable replicas not yet tried, fastest first (references to release).
 * Now and then a replica whose estimate has not learned anything for a
 * while goes first instead: one slow patch (a page-faulting first dispatch,
 * a busy moment) must not keep a worker out of the rotation on a stale
 * number while its peers carry all the load. */
static int candidates(hub_executor *x, const hub_task *t, hub_replica *out) {
    hub_replica all[MOEX_PLACEMENT_MAX_REPLICAS];
    const int n_all = hub_registry_replicas(x->reg, x->layer, t->expert, hub_size_of(t->n_tokens), all,
                                            MOEX_PLACEMENT_MAX_REPLICAS);
    int n = 0;
    for (int i = 0; i < n_all; i++) {
        if (already_sent(t, all[i].id)) {
            hub_conn_unref(all[i].conn);
            continue;
        }
        int j = n++;
        const float e = estimate_ms(x, &all[i]);
        for (; j > 0 && estimate_ms(x, &out[j - 1]) > e; j--) out[j] = out[j - 1];
        out[j] = all[i];
    }
    const double now = moex_time_s();
    for (int i = 1; i < n; i++)
        if (now - out[i].sampled_s > PROBE_AFTER_S && moex_splitmix64(&x->rng) % PROBE_ONE_IN == 0) {
            const hub_replica probe = out[i];
            memmove(&out[1], &out[0], (size_t)i * sizeof *out);
            out[0] = probe;
            break;
        }
    return n;
}

static void release_candidates(hub_replica *c, int from, int n) {
    for (int i = from; i < n; i++) hub_conn_unref(c[i].conn);
}

/* A TCP stream has no message boundaries: every frame but the message's
 * last says MORE, so that the worker computes the layer's dispatches
 * together however its reads cut them (docs/PROTOCOL.md). */
static void mark_message(uint8_t *msg, size_t len) {
    size_t off = 0;
    while (len - off > MOEX_PROTO_HEADER_BYTES) {
        moex_proto_header h;
        moex_proto_header_read(msg + off, &h);
        const size_t n = MOEX_PROTO_HEADER_BYTES + (size_t)h.payload_len;
        if (off + n >= len) break; /* the last frame */
        msg[off + MOEX_PROTO_FLAGS_AT] |= MOEX_FLAG_MORE;
        off += n;
    }
}

/* Hands the worker's message so far to its connection; the buffer is the connection's now. */
static void send_outgoing(hub_executor *x, outgoing *o) {
    if (o->buf && hub_conn_is_raw(o->conn)) mark_message(o->buf + LWS_PRE, o->len);
    if (o->buf && hub_conn_send_owned(o->conn, o->buf, o->len)) {
        HUB_ADD(x->metrics, bytes_out, o->len);
        HUB_COUNT(x->metrics, messages_out);
    }
    hub_registry_count_dispatch(x->reg, o->worker, o->frames);
    o->buf = NULL;
    o->len = o->cap = 0;
    o->frames = 0;
}

/* Appends the task's frame to the worker's message of this round; a full
 * message leaves at once (MESSAGE_SPLIT_BYTES). */
static bool queue_frame(hub_executor *x, const hub_replica *r, const uint8_t *frame, size_t len) {
    outgoing *o = NULL;
    for (int i = 0; i < x->n_out && !o; i++)
        if (x->out[i].worker == r->id) o = &x->out[i];
    if (!o) {
        if (x->n_out == HUB_MAX_WORKERS) return false; /* cannot happen: one per worker; the deadline would catch it */
        o = &x->out[x->n_out++];
        hub_conn_ref(r->conn);
        *o = (outgoing){.worker = r->id, .conn = r->conn};
    }
    if (o->len && o->len + len > x->split_bytes) {
        send_outgoing(x, o);
        hub_net_wake(x->net);
    }
    if (o->len + len > o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 4 * len;
        while (cap < o->len + len) cap *= 2;
        uint8_t *buf = hub_conn_buffer(cap);
        if (!buf) return false; /* the send fails at its deadline */
        if (o->buf) memcpy(buf + LWS_PRE, o->buf + LWS_PRE, o->len);
        free(o->buf);
        o->buf = buf;
        o->cap = cap;
    }
    memcpy(o->buf + LWS_PRE + o->len, frame, len);
    o->len += len;
    o->frames++;
    return true;
}

/* Sends every worker the rest of its message of this round, then wakes the
 * network thread once if a connection needs it (on TCP a decode layer's
 * messages have left by then). */
static void flush_round(hub_executor *x) {
    for (int i = 0; i < x->n_out; i++) {
        outgoing *o = &x->out[i];
        if (o->len) send_outgoing(x, o);
        hub_conn_unref(o->conn);
    }
    if (x->n_out) hub_net_wake(x->net);
    x->n_out = 0;
}

/* One copy of the task to a replica; a hedge is counted once its frame is queued. */
static void send_to(hub_executor *x, hub_task *t, const hub_replica *r, double now, bool hedge) {
    hub_conn_ref(r->conn);
    t->sends[t->n_sent++] = (hub_send){.worker = r->id, .conn = r->conn, .at = now, .hedge = hedge};
    int *n = inflight_of(x, r->id);
    if (n) (*n)++;
    HUB_COUNT(x->metrics, dispatches);
    if (!queue_frame(x, r, t->frame, t->frame_len)) return;
    if (hedge) HUB_COUNT(x->metrics, hedges_sent);
}

/* Paper §4.1, adaptive: one replica while the fastest is as fast as the pool;
 * two at once when its recent latency is well above the pool's; and, like
 * Dean & Barroso's hedged requests, a deferred second copy when the answer is
 * late against the primary's own history. */
static int auto_hedge_now(const hub_replica *primary, float median) {
    return primary->lat_ms >= 0 && median > 0 && primary->lat_ms > 2.0f * median + 2.0f ? 2 : 1;
}

static double auto_hedge_delay_s(const hub_replica *primary, float median) {
    const float base = primary->lat_ms >= 0 ? primary->lat_ms : (median > 0 ? median : 5.0f);
    return (3.0f * base + 2.0f) / 1000.0;
}

/* No replica can take the task: computed here, or (--no-local-fallback) the
 * layer fails. */
static int fall_back(hub_executor *x, hub_task *t, moex_error *err) {
    if (!x->cfg.local_fallback)
        return moex_fail(err, "expert %d of layer %d has no live replica and --no-local-fallback is set", t->expert,
                         x->layer);
    t->local = true;
    HUB_COUNT(x->metrics, fallbacks);
    return 0;
}

/* The task's first sends: h replicas (or one plus a deferred hedge). */
static int dispatch_task(hub_executor *x, hub_task *t, const float median_of[2], double now, moex_error *err) {
    const float median = median_of[hub_size_of(t->n_tokens)];
    hub_replica c[MOEX_PLACEMENT_MAX_REPLICAS];
    const int n = candidates(x, t, c);
    t->hedge_at_s = INFINITY;
    t->deadline_s = now + x->cfg.timeout_ms / 1000.0;
    if (n == 0) return fall_back(x, t, err);
    int h = x->cfg.hedge;
    if (h == 0) {
        h = auto_hedge_now(&c[0], median);
        if (n > h) t->hedge_at_s = now + auto_hedge_delay_s(&c[0], median);
    }
    if (h > n) h = n;
    for (int i = 0; i < h; i++) send_to(x, t, &c[i], now, i > 0);
    release_candidates(c, 0, n);
    return 0;
}

/* Every copy of the task failed: another replica, else here. */
static int redispatch(hub_executor *x, hub_task *t, double now, moex_error *err) {
    hub_replica c[MOEX_PLACEMENT_MAX_REPLICAS];
    const int n = t->n_sent < MAX_SENDS ? candidates(x, t, c) : 0;
    t->hedge_at_s = INFINITY;
    if (n == 0) return fall_back(x, t, err);
    send_to(x, t, &c[0], now, false);
    release_candidates(c, 0, n);
    HUB_COUNT(x->metrics, redispatches);
    t->deadline_s = now + x->cfg.timeout_ms / 1000.0;
    return 0;
}

static int outstanding(const hub_task *t) {
    int n = 0;
    for (int s = 0; s < t->n_sent; s++) n += !t->sends[s].failed;
    return n;
}

/* Deadlines, hedges and tasks whose every copy failed. Returns the next time
 * something is due (INFINITY: nothing). */
static double service(hub_executor *x, double now, int *rc, moex_error *err) {
    double next = INFINITY;
    for (int i = 0; i < x->n_tasks && *rc == 0; i++) {
        hub_task *t = &x->tasks[i];
        if (t->done || t->local) continue;
        if (outstanding(t) == 0) {
            *rc = redispatch(x, t, now, err);
        } else if (now >= t->deadline_s) {
            for (int s = 0; s < t->n_sent; s++) {
                if (t->sends[s].failed) continue;
                t->sends[s].failed = true;
                hub_registry_record(x->reg, t->sends[s].worker, hub_size_of(t->n_tokens), (float)x->cfg.timeout_ms,
                                    HUB_TIMEOUT);
                HUB_COUNT(x->metrics, timeouts);
            }
            *rc = redispatch(x, t, now, err);
        } else if (now >= t->hedge_at_s) {
            hub_replica c[MOEX_PLACEMENT_MAX_REPLICAS];
            const int n = t->n_sent < MAX_SENDS ? candidates(x, t, c) : 0;
            if (n > 0) send_to(x, t, &c[0], now, true);
            release_candidates(c, 0, n);
            t->hedge_at_s = INFINITY;
        }
        if (!t->done && !t->local) {
            if (t->deadline_s < next) next = t->deadline_s;
            if (t->hedge_at_s < next) next = t->hedge_at_s;
        }
    }
    flush_round(x);
    return next;
}

/* ---- receiving ---- */

static hub_task *task_for(hub_executor *x, uint32_t seq) {
    const uint32_t i = seq - x->seq0;
    return i < (uint32_t)x->n_tasks ? &x->tasks[i] : NULL;
}

static int send_index(const hub_task *t, uint32_t worker) {
    for (int i = 0; i < t->n_sent; i++)
        if (t->sends[i].worker == worker) return i;
    return -1;
}

static void fail_sends_of(hub_executor *x, uint32_t worker) {
    for (int i = 0; i < x->n_tasks; i++) {
        const int s = send_index(&x->tasks[i], worker);
        if (s >= 0) x->tasks[i].sends[s].failed = true;
    }
}

/* Rows of a RESULT as f32 into dst; false when a value is inf or NaN or
 * beyond what the expert can produce from its input (an overflowing, broken
 * or hostile worker: such a result must never reach the combine). */
static bool read_rows(const moex_proto_tensor_view *v, float *dst, int64_t d, const double *limits) {
    for (uint32_t i = 0; i < v->n_tokens; i++) moex_proto_tensor_row_f32(v, i, dst + i * d);
    return hub_rows_sane(dst, v->n_tokens, d, limits);
}

/* Where this layer's expert keeps its norms (x->norms, x->norms_state). */
static size_t norms_slot(const hub_executor *x, int expert) {
    return (size_t)x->layer * (size_t)x->m->hp.n_expert + (size_t)expert;
}

/* The largest honest |value| of each pair's result, from the expert's
 * weights (their norms, learn_norms) and the token's input: x's wire
 * rounding and the result's add at most 1 % each. -1: no bound for it. */
static int expert_limits(hub_executor *x, const hub_task *t) {
    const size_t e = norms_slot(x, t->expert);
    if (x->norms_state[e] != NORMS_KNOWN) return -1;
    const moex_moe_plan *p = &x->plan;
    for (int32_t i = p->group_first[t->group]; i < p->group_first[t->group + 1]; i++)
        x->pair_max[i] = moex_expert_result_max(&x->norms[e], 1.01 * x->x_absmax[p->rows[i]], p->gates[i]) * 1.01;
    return 0;
}

static void cancel_losers(hub_executor *x, hub_task *t, int winner, double now) {
    for (int i = 0; i < t->n_sent; i++) {
        hub_send *s = &t->sends[i];
        if (i == winner || s->failed) continue;
        /* their answer will not come: what they took so far is a lower bound
         * of their latency, so a slow replica stops being picked first */
        hub_registry_record(x->reg, s->worker, hub_size_of(t->n_tokens), (float)((now - s->at) * 1000.0), HUB_LOST);
        uint8_t buf[64];
        size_t n;
        if (!moex_proto_encode_cancel(t->seq, (uint16_t)x->layer, (uint16_t)t->expert, buf, sizeof buf, &n, NULL) &&
            hub_conn_send(s->conn, buf, n))
            HUB_COUNT(x->metrics, cancels);
        s->failed = true; /* no longer outstanding */
    }
}

/* A RESULT's first pass (serial): does it answer a task of this layer, and
 * where do its rows go (the winner's place in the results, a duplicate's
 * buffer, or nowhere). Rows are converted afterwards, in parallel. */
static void claim_result(hub_executor *x, uint32_t worker, const moex_proto_msg *msg, pending_result *pr) {
    *pr = (pending_result){.view = msg->u.tensor, .seq = msg->h.seq};
    hub_task *t = task_for(x, msg->h.seq);
    if (!t) return; /* a straggler from an earlier layer: already answered */
    const int s = send_index(t, worker);
    const moex_proto_tensor_view *v = &msg->u.tensor;
    if (s < 0 || msg->h.layer != x->layer || msg->h.expert != t->expert || v->n_tokens != t->n_tokens ||
        v->hidden != x->d) {
        pr->mismatch = true;
        return;
    }
    if (t->local || t->claimed) return; /* computed here after its replicas failed; or answered twice */
    pr->task = t;
    pr->send = s;
    if (!t->limits_ready) t->limits_ready = expert_limits(x, t) == 0;
    pr->limits = t->limits_ready ? x->pair_max + x->plan.group_first[t->group] : NULL;
    if (!t->done) {
        pr->dst = x->results + (size_t)x->plan.group_first[t->group] * (size_t)x->d;
        t->claimed = true;
    } else if (!t->dup_seen && t->winner != worker) { /* a hedged duplicate: compared after the layer */
        const size_t need = (size_t)t->n_tokens * (size_t)x->d;
        if (need > t->dup_cap) {
            free(t->dup);
            t->dup = malloc(need * sizeof *t->dup);
            t->dup_cap = t->dup ? need : 0;
        }
        pr->dst = t->dup;
        pr->duplicate = t->dup != NULL;
        t->claimed = pr->duplicate;
    }
}

/* The second pass, after the rows were converted (pr->sane). A duplicate
 * is kept for the check after the layer, whatever it holds. A winner with
 * values no honest worker can send is not used: the task is computed here,
 * and the worker evicted unless the hub's own values are as bad (an
 * expert whose result overflows the wire dtype). */
static void finish_result(hub_executor *x, uint32_t worker, pending_result *pr, double t_rx) {
    hub_task *t = pr->task;
    if (!t || !pr->dst) return;
    t->claimed = false;
    if (pr->duplicate) {
        t->dup_from = worker;
        t->dup_seen = true;
        t->dup_sane = pr->sane;
        return;
    }
    const float ms = (float)((t_rx - t->sends[pr->send].at) * 1000.0);
    if (!pr->sane) {
        t->sends[pr->send].failed = true;
        HUB_COUNT(x->metrics, bad_results);
        hub_registry_record(x->reg, worker, hub_size_of(t->n_tokens), ms, HUB_TIMEOUT);
        t->local = t->suspect = true;
        t->suspect_from = worker;
        return;
    }
    t->done = true;
    t->winner = worker;
    hub_registry_record(x->reg, worker, hub_size_of(t->n_tokens), ms, HUB_WON);
    if (t->sends[pr->send].hedge) HUB_COUNT(x->metrics, hedges_won);
    cancel_losers(x, t, pr->send, t_rx);
}

typedef struct convert_job {
    pending_result *pr;
    int n;
    int64_t d;
} convert_job;

static void convert_rows(void *ctx, int ith, int nth) {
    convert_job *j = ctx;
    for (int i = ith; i < j->n; i += nth)
        if (j->pr[i].dst) j->pr[i].sane = read_rows(&j->pr[i].view, j->pr[i].dst, j->d, j->pr[i].limits);
}

static void on_error(hub_executor *x, uint32_t worker, const moex_proto_msg *msg) {
    HUB_COUNT(x->metrics, errors_in);
    const moex_proto_error_info *e = moex_proto_error_info_of(msg->u.error.code);
    moex_log(MOEX_LOG_DEBUG, "worker %08x: error %d (%s) for seq %u: %.*s", worker, msg->u.error.code,
             e ? e->name : "unknown", msg->h.seq, (int)msg->u.error.text_len, msg->u.error.text);
    if (!e || e->on_hub != MOEX_ERR_ACT_REDISPATCH) return;
    hub_task *t = task_for(x, msg->h.seq);
    const int s = t ? send_index(t, worker) : -1;
    if (s >= 0) t->sends[s].failed = true;
}

/* A message from a worker: its RESULT and ERROR frames (the network thread
 * handled the rest and checked every header). A message with many results (a
 * prompt batch) has its rows converted on the pool. */
static void on_message(hub_executor *x, const hub_event *ev) {
    const double t0 = moex_time_s();
    size_t off = 0, len = 0;
    int n = 0;
    int64_t elements = 0;
    bool bad = false;
    while (!bad && moex_proto_next_frame(ev->data, ev->len, &off, &x->limits, &len, NULL) == 1) {
        const uint8_t *f = ev->data + off;
        off += len;
        moex_proto_header h;
        moex_proto_header_read(f, &h);
        if (h.type != MOEX_MSG_RESULT && h.type != MOEX_MSG_ERROR) continue;
        if (h.flags & MOEX_FLAG_COMPRESSED) { /* decompressed into the shared scratch: one at a time */
            convert_job job = {.pr = x->pending, .n = n, .d = x->d};
            convert_rows(&job, 0, 1);
            for (int i = 0; i < n; i++) finish_result(x, ev->worker, &x->pending[i], ev->t_rx);
            n = 0;
        }
        const size_t need = moex_proto_scratch_bytes(&h);
        if (need > x->scratch_cap) {
            uint8_t *grown = realloc(x->scratch, need);
            if (!grown) continue;
            x->scratch = grown;
            x->scratch_cap = need;
        }
        moex_proto_msg msg;
        moex_error err = {0};
        if (moex_proto_decode(f, len, &x->limits, x->scratch, x->scratch_cap, &msg, &err)) {
            fail_sends_of(x, ev->worker);
            hub_registry_bad_result(x->reg, ev->worker, err.msg);
            bad = true;
        } else if (h.type == MOEX_MSG_ERROR) {
            on_error(x, ev->worker, &msg);
        } else if (n < x->cap_pending || grow_pending(x) == 0) {
            claim_result(x, ev->worker, &msg, &x->pending[n]);
            if (x->pending[n].mismatch) {
                fail_sends_of(x, ev->worker);
                hub_registry_bad_result(x->reg, ev->worker, "a RESULT that does not match its DISPATCH");
                bad = true;
            }
            elements += (int64_t)msg.u.tensor.n_tokens * msg.u.tensor.hidden;
            n++;
        }
    }
    convert_job job = {.pr = x->pending, .n = n, .d = x->d};
    if (elements >= PARALLEL_ELEMENTS && n > 1) moex_pool_run(x->pool, convert_rows, &job);
    else convert_rows(&job, 0, 1);
    for (int i = 0; i < n; i++) {
        pending_result *pr = &x->pending[i];
        if (bad && pr->task) { /* a worker that sent a bad frame is dropped, with everything it sent */
            pr->task->claimed = false;
            pr->dst = NULL;
        }
        finish_result(x, ev->worker, pr, ev->t_rx);
    }
    x->decode_s += moex_time_s() - t0;
}

static void on_event(hub_executor *x, const hub_event *ev) {
    if (ev->kind == HUB_EV_MESSAGE) on_message(x, ev);
    else if (ev->kind == HUB_EV_WORKER_GONE) fail_sends_of(x, ev->worker);
    free(ev->data);
}

/* ---- computing here: fallback and verification ---- */

/* x as the workers receive it (decoded from the wire), made on first need. */
static void ensure_x_wire(hub_executor *x, int64_t n_tokens) {
    if (x->x_wire_ready) return;
    memcpy(x->x_wire, x->req_x, (size_t)(n_tokens * x->d) * sizeof(float));
    moex_wire_round_rows(x->cfg.wire_dtype, x->x_wire, n_tokens, x->d, x->tmp);
    x->x_wire_ready = true;
}

static int compute_here(hub_executor *x, const hub_task *t, float *out, moex_error *err) {
    const moex_moe_plan *p = &x->plan;
    ensure_x_wire(x, x->n_req_tokens);
    const int32_t first = p->group_first[t->group];
    moex_expert_job job = {.w = &x->m->layers[x->layer].experts[t->expert], .n_tokens = t->n_tokens,
                           .rows = p->rows + first, .gates = p->gates + first, .out = out};
    if (moex_experts_run_wire(x->pool, &job, 1, x->x_wire, x->d, x->cfg.wire_dtype, x->tmp, err))
        return moex_error_prefix(err, "layer %d expert %d, computed here", x->layer, t->expert);
    return 0;
}

/* Checks the task's result, and a hedged duplicate's, token by token
 * against what an honest backend can give (hub/verify.h); a worker outside
 * it is evicted and the hub's own answer used. The check recomputes the
 * expert exactly (double): a few times the cost of computing it. */
static int verify_task(hub_executor *x, hub_task *t, moex_error *err) {
    const moex_moe_plan *p = &x->plan;
    const int32_t first = p->group_first[t->group];
    const moex_expert_weights *w = &x->m->layers[x->layer].experts[t->expert];
    float *result = x->results + (size_t)first * (size_t)x->d;
    ensure_x_wire(x, x->n_req_tokens);
    double worst = 0, worst_dup = 0;
    bool ok = true, dup_ok = true;
    for (int64_t i = 0; i < t->n_tokens; i++) {
        double wi, wd;
        const int n_var = moex_expert_check_token(x->checker, w, x->x_wire + (int64_t)p->rows[first + i] * x->d,
                                                  p->gates[first + i], x->ref, x->tol, err);
        if (n_var < 1) return moex_error_prefix(err, "layer %d expert %d, verified here", x->layer, t->expert);
        ok &= hub_result_honest_any(result + i * x->d, x->ref, x->tol, n_var, x->d, x->cfg.wire_dtype, &wi);
        worst = fmax(worst, wi);
        if (t->dup_seen) {
            dup_ok &= hub_result_honest_any(t->dup + i * x->d, x->ref, x->tol, n_var, x->d, x->cfg.wire_dtype, &wd);
            worst_dup = fmax(worst_dup, wd);
        }
    }
    HUB_COUNT(x->metrics, verified);
    hub_registry_note_check(x->reg, t->winner, worst);
    if (!ok) {
        HUB_COUNT(x->metrics, verify_mismatches);
        char why[160];
        snprintf(why, sizeof why, "result of layer %d expert %d is %.3g times as far from the exact value as an honest "
                                  "backend's can be", x->layer, t->expert, worst);
        hub_registry_evict(x->reg, t->winner, why);
        if (compute_here(x, t, result, err)) return -1;
    }
    if (t->dup_seen) {
        hub_registry_note_check(x->reg, t->dup_from, worst_dup);
        if (!dup_ok) {
            HUB_COUNT(x->metrics, verify_mismatches);
            hub_registry_evict(x->reg, t->dup_from, "a hedged duplicate is not what an honest backend can give");
        }
    }
    return 0;
}

/* Whether two results differ by more than a wire step anywhere: honest ones
 * from the same code path are equal, from others close, so only a real
 * difference costs a check. */
static bool differ(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (fabsf(a[i] - b[i]) > fmaxf(fabsf(a[i]), fabsf(b[i])) * 0x1p-9f + 1e-30f) return true;
    return false;
}

static int verify_layer(hub_executor *x, moex_error *err) {
    for (int i = 0; i < x->n_tasks; i++) {
        hub_task *t = &x->tasks[i];
        if (t->local) continue;
        const bool sampled = x->cfg.verify_p > 0 && moex_rand01(&x->rng) < x->cfg.verify_p;
        const float *result = x->results + (size_t)x->plan.group_first[t->group] * (size_t)x->d;
        const bool disagree =
            t->dup_seen && (!t->dup_sane || differ(t->dup, result, t->n_tokens * x->d));
        if ((sampled || disagree) && verify_task(x, t, err)) return -1;
    }
    return 0;
}

/* A task whose replica sent values no honest worker can: computed here; the
 * worker is evicted unless the hub's own values are no better (then the
 * expert itself overflows the wire dtype, and the result stands as
 * --local's would). */
static int confirm_suspect(hub_executor *x, hub_task *t, float *out, moex_error *err) {
    if (compute_here(x, t, out, err)) return -1;
    const double *limits = t->limits_ready ? x->pair_max + x->plan.group_first[t->group] : NULL;
    if (!hub_rows_sane(out, t->n_tokens, x->d, limits)) {
        moex_log(MOEX_LOG_WARN, "layer %d expert %d: its result is not finite here either (the model overflows the "
                                "wire dtype)", x->layer, t->expert);
        return 0;
    }
    HUB_COUNT(x->metrics, verify_mismatches);
    char why[160];
    snprintf(why, sizeof why, "result of layer %d expert %d holds non-finite values or values beyond what the expert "
                              "can produce", x->layer, t->expert);
    hub_registry_evict(x->reg, t->suspect_from, why);
    return 0;
}

/* ---- the layer ---- */

typedef struct combine_job {
    hub_executor *x;
    const moex_moe_request *req;
} combine_job;

static void combine_tokens(void *ctx, int ith, int nth) {
    const combine_job *j = ctx;
    const int64_t n = j->req->n_tokens, t0 = n * ith / nth, t1 = n * (ith + 1) / nth;
    moex_moe_plan_combine_tokens(&j->x->plan, j->req, j->x->results, j->x->d, t0, t1);
}

/* Each token's k results summed into req->out, on the pool for a prompt's batch. */
static void combine(hub_executor *x, const moex_moe_request *req) {
    combine_job job = {.x = x, .req = req};
    if (req->n_tokens * req->n_used * x->d >= PARALLEL_ELEMENTS) moex_pool_run(x->pool, combine_tokens, &job);
    else combine_tokens(&job, 0, 1);
}

static int prepare(hub_executor *x, const moex_moe_request *req, moex_error *err) {
    moex_moe_plan *p = &x->plan;
    if (moex_moe_plan_build(p, req, x->m->hp.n_expert, err)) return -1;
    if (reserve(x, req->n_tokens))
        return moex_fail(err, "layer %d: out of memory for %lld expert pairs", req->layer, (long long)p->n_pairs);
    x->req_x = req->x;
    x->n_req_tokens = req->n_tokens;
    x->x_wire_ready = false;
    for (int64_t i = 0; i < req->n_tokens; i++) {
        float m = 0;
        for (int64_t j = 0; j < x->d; j++) m = fmaxf(m, fabsf(req->x[i * x->d + j]));
        x->x_absmax[i] = m;
    }
    moex_wire_round_gates(x->cfg.wire_dtype, p->gates, p->n_pairs);
    x->layer = req->layer;
    x->seq0 = x->next_seq;
    x->next_seq += (uint32_t)p->n_groups;
    x->n_tasks = p->n_groups;
    for (int g = 0; g < p->n_groups; g++) {
        hub_task *t = &x->tasks[g];
        t->seq = x->seq0 + (uint32_t)g;
        t->group = g;
        t->expert = p->group_expert[g];
        t->n_tokens = p->group_first[g + 1] - p->group_first[g];
        t->n_sent = 0;
        t->done = t->local = t->dup_seen = t->claimed = t->suspect = t->limits_ready = false;
        t->deadline_s = t->hedge_at_s = INFINITY;
    }
    int rc_one[64], *rc = x->n_tasks <= 64 ? rc_one : calloc((size_t)x->n_tasks, sizeof *rc);
    if (!rc) return moex_fail(err, "out of memory");
    encode_job job = {.x = x, .rc = rc, .err = err};
    if (p->n_pairs * x->d >= PARALLEL_ELEMENTS && x->n_tasks > 1) moex_pool_run(x->pool, encode_tasks, &job);
    else encode_tasks(&job, 0, 1);
    int failed = 0;
    for (int i = 0; i < x->n_tasks; i++) failed |= rc[i];
    if (rc != rc_one) free(rc);
    if (failed && err && !err->msg[0]) moex_fail(err, "layer %d: encoding a DISPATCH failed", x->layer);
    return failed ? -1 : 0;
}

static int send_layer(hub_executor *x, moex_error *err) {
    x->n_inflight = 0;
    const float median[2] = {x->cfg.hedge == 0 ? hub_registry_median_ms(x->reg, HUB_SMALL) : 0.0f,
                             x->cfg.hedge == 0 ? hub_registry_median_ms(x->reg, HUB_LARGE) : 0.0f};
    const double now = moex_time_s();
    int rc = 0;
    for (int i = 0; i < x->n_tasks && rc == 0; i++) rc = dispatch_task(x, &x->tasks[i], median, now, err);
    flush_round(x);
    return rc;
}

/* Until every task has its result: events, deadlines, and local work. */
static int wait_layer(hub_executor *x, moex_error *err) {
    int rc = 0;
    double next = 0;
    while (rc == 0) {
        hub_task *local = NULL;
        int pending = 0;
        for (int i = 0; i < x->n_tasks; i++) {
            hub_task *t = &x->tasks[i];
            if (t->done) continue;
            pending++;
            if (t->local && !local) local = t;
        }
        if (!pending) break;
        if (atomic_load(&x->stopping)) return moex_fail(err, "hub stopping");
        if (local) { /* computed while the network works */
            float *out = x->results + (size_t)x->plan.group_first[local->group] * (size_t)x->d;
            if (local->suspect ? confirm_suspect(x, local, out, err) : compute_here(x, local, out, err)) return -1;
            local->done = true;
            continue;
        }
        hub_event ev;
        if (hub_inbox_pop(x->inbox, &ev, next)) {
            on_event(x, &ev);
            while (hub_inbox_pop(x->inbox, &ev, 0)) on_event(x, &ev); /* everything already there */
        }
        next = service(x, moex_time_s(), &rc, err);
    }
    return rc;
}

static void record_times(hub_executor *x, int layer, double t0, double t1, double t2, double t3, double t4) {
    layer_times *lt = &x->times[x->n_times++ % TIMING_LAYERS];
    *lt = (layer_times){.plan_encode = (float)((t1 - t0) * 1e6), .send = (float)((t2 - t1) * 1e6),
                        .wait = (float)((t3 - t2 - x->decode_s) * 1e6), .decode = (float)(x->decode_s * 1e6),
                        .combine = (float)((t4 - t3) * 1e6), .round = (float)((t3 - t1 - x->decode_s) * 1e6),
                        .n_tokens = x->n_req_tokens};
    moex_log(MOEX_LOG_DEBUG, "hub layer %d: %lld tokens, plan+encode %.0f send %.0f wait %.0f decode %.0f combine %.0f us",
             layer, (long long)lt->n_tokens, lt->plan_encode, lt->send, lt->wait, lt->decode, lt->combine);
}

/* The norms of this layer's experts not seen before, on the pool while the
 * workers compute: each expert's matrices are read whole once (a prompt's
 * first layers touch every expert, which one thread took seconds for). A
 * layer has one task per expert, so threads taking tasks ith, ith + nth, ...
 * never write the same slot; the pool wakes only when two or more are new. */
static void learn_norms_part(void *ctx, int ith, int nth) {
    hub_executor *x = ctx;
    for (int i = ith; i < x->n_tasks; i += nth) {
        const int expert = x->tasks[i].expert;
        const size_t e = norms_slot(x, expert);
        if (x->norms_state[e] != NORMS_UNKNOWN) continue;
        x->norms_state[e] = moex_expert_norms_of(&x->m->layers[x->layer].experts[expert], &x->norms[e], NULL)
                                ? NORMS_FAILED : NORMS_KNOWN;
    }
}

static void learn_norms(hub_executor *x) {
    int unknown = 0;
    for (int i = 0; i < x->n_tasks && unknown < 2; i++)
        unknown += x->norms_state[norms_slot(x, x->tasks[i].expert)] == NORMS_UNKNOWN;
    if (unknown > 1) moex_pool_run(x->pool, learn_norms_part, x);
    else if (unknown == 1) learn_norms_part(x, 0, 1);
}

static int remote_run(void *ctx, const moex_moe_request *req, moex_error *err) {
    hub_executor *x = ctx;
    if (req->n_tokens > x->cfg.max_batch)
        return moex_fail(err, "batch of %lld tokens over the hub's --batch %lld", (long long)req->n_tokens,
                         (long long)x->cfg.max_batch);
    const double t0 = moex_time_s();
    x->decode_s = 0;
    x->n_tasks = 0; /* late answers to the previous layer now find no task */
    int rc = prepare(x, req, err);
    const double t1 = moex_time_s();
    if (rc == 0) rc = send_layer(x, err);
    const double t2 = moex_time_s();
    if (rc == 0) learn_norms(x); /* while the workers compute */
    if (rc == 0) rc = wait_layer(x, err);
    const double t3 = moex_time_s();
    if (rc == 0) rc = verify_layer(x, err);
    if (rc == 0) combine(x, req);
    release_sends(x);
    if (rc == 0) record_times(x, req->layer, t0, t1, t2, t3, moex_time_s());
    return rc;
}

moex_expert_executor hub_executor_iface(hub_executor *x) {
    return (moex_expert_executor){.ctx = x, .run = remote_run};
}

/* ---- the time breakdown ---- */

static void percentiles(float *v, size_t n, float *p50, float *p99) {
    *p50 = moex_quantile_sorted_f32(v, n, 0.5);
    *p99 = moex_quantile_of_sorted_f32(v, n, 0.99);
}

/* Appends " plan+encode P50/P99 send ... send+wait P50/P99" over the held
 * layers of at least min_tokens tokens; returns how many there were. v: room
 * for them all. */
static size_t append_phases(const hub_executor *x, int64_t min_tokens, float *v, char *buf, size_t *len, size_t cap) {
    static const char *const names[] = {"plan+encode", "send", "wait", "decode", "combine", "send+wait"};
    const size_t held = x->n_times < TIMING_LAYERS ? (size_t)x->n_times : TIMING_LAYERS;
    size_t n = 0;
    for (int k = 0; k < 6; k++) {
        n = 0;
        for (size_t i = 0; i < held; i++)
            if (x->times[i].n_tokens >= min_tokens) v[n++] = ((const float *)&x->times[i])[k];
        if (!n) return 0;
        float p50, p99;
        percentiles(v, n, &p50, &p99);
        if (*len < cap) *len += (size_t)snprintf(buf + *len, cap - *len, " %s %.0f/%.0f", names[k], p50, p99);
    }
    return n;
}

/* One write, so that another thread's log line cannot land inside it. */
void hub_executor_print_timing(hub_executor *x, FILE *f) {
    const size_t held = x->n_times < TIMING_LAYERS ? (size_t)x->n_times : TIMING_LAYERS;
    if (!held) return;
    float *v = malloc(held * sizeof *v);
    if (!v) return;
    char line[640] = "", phases[256];
    size_t len = 0, n;
    if ((n = append_phases(x, 0, v, phases, &len, sizeof phases)))
        snprintf(line, sizeof line, "hub layer timing (us, p50/p99 over %zu layers):%s\n", n, phases);
    len = 0;
    if ((n = append_phases(x, TIMING_SMALL_TOKENS + 1, v, phases, &len, sizeof phases))) {
        const size_t used = strlen(line);
        snprintf(line + used, sizeof line - used, "hub layer timing, layers of over %d tokens (us, p50/p99 over %zu):%s\n",
                 TIMING_SMALL_TOKENS, n, phases);
    }
    fputs(line, f);
    free(v);
}
