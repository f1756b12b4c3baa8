/* The worker registry (see registry.h): joining with session keys and bans,
 * the placement and assignments, readiness, heartbeats and silence, health
 * and the latency record the executor chooses replicas by.
 *
 * Placement is rebuilt whenever the set of live workers changes. The build
 * runs outside the lock (the executor looks up replicas under it on every
 * layer); a version number makes sure only the latest membership's build is
 * installed. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <xxhash.h>

#include "common/unicode.h"
#include "hub/registry.h"
#include "placement/placement.h"

#define LAT_SAMPLES 1024
#define MAX_BANS 64            /* evicted records kept; past this the oldest ban is forgotten */
#define MAX_REPEAT_JOINS 3     /* a connection that keeps re-sending JOIN is closed */

struct hub_worker {
    uint32_t id;                 /* placement key; kept across reconnects of one session */
    uint64_t session;            /* the secret key of this worker's ASSIGNs */
    hub_conn *conn;              /* referenced; NULL once the connection is gone */
    char name[HUB_NAME_BYTES];
    bool joined, evicted, unhealthy, gone_reported;
    bool closing;                /* refused, removed or replaced: its connection is being closed */
    int repeat_joins;
    float capacity;
    uint8_t backend;
    uint32_t assigned_gen, ready_gen;
    uint8_t *assigned, *usable;  /* bitmaps [layer][expert] */
    double last_rx_s, evicted_at;
    int consecutive_timeouts;
    float lat_ms[LAT_SAMPLES];   /* round trips of its winning results, a ring */
    uint32_t lat_n;
    float lat_ewma_ms[2];        /* by hub_size, < 0: unknown */
    double last_sample_s[2];
    float rtt_ms;                /* from heartbeats */
    uint64_t bytes_in, n_dispatched, n_won, n_lost, n_timeouts;
    uint64_t n_checked;          /* its results verified against the honest bound */
    double worst_check;          /* the largest share of that bound one of them used (> 1: evicted) */
};

struct hub_registry {
    hub_registry_config cfg;
    hub_net *net;
    hub_inbox *inbox;
    hub_metrics *metrics;
    size_t bitmap_bytes;
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* readiness changes */
    bool stopping;
    hub_worker *w[HUB_MAX_WORKERS];
    int n;
    moex_placement *placement;
    uint64_t membership;         /* bumped whenever the live set changes */
    uint32_t generation;         /* of ASSIGNs */
    double join_window_s;
    int joins_in_window;
    uint8_t ctl[512];            /* control frames are encoded here (under mu) */
};

static size_t bit_index(const hub_registry *r, int layer, int expert) {
    return (size_t)layer * (size_t)r->cfg.n_experts + (size_t)expert;
}
static bool bit_get(const uint8_t *bits, size_t i) { return bits[i >> 3] >> (i & 7) & 1; }
static void bit_set(uint8_t *bits, size_t i) { bits[i >> 3] |= (uint8_t)(1u << (i & 7)); }

static const char *label(const hub_worker *w) {
    return w->name[0] ? w->name : w->conn ? hub_conn_peer(w->conn) : "?";
}

hub_registry *hub_registry_create(const hub_registry_config *cfg, hub_net *net, hub_inbox *inbox,
                                  hub_metrics *metrics, moex_error *err) {
    hub_registry *r = calloc(1, sizeof *r);
    if (!r) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    r->cfg = *cfg;
    r->net = net;
    r->inbox = inbox;
    r->metrics = metrics;
    r->bitmap_bytes = ((size_t)cfg->n_layers * (size_t)cfg->n_experts + 7) / 8;
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    return r;
}

static void worker_free(hub_worker *w) {
    if (!w) return;
    hub_conn_unref(w->conn);
    free(w->assigned);
    free(w->usable);
    free(w);
}

void hub_registry_free(hub_registry *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) worker_free(r->w[i]);
    moex_placement_free(r->placement);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* ---- sending (under mu) ---- */

static void send_ctl(hub_registry *r, hub_worker *w, size_t len) {
    if (w->conn && hub_conn_send(w->conn, r->ctl, len)) HUB_ADD(r->metrics, bytes_out, len);
}

static void send_error(hub_registry *r, hub_worker *w, uint32_t seq, int32_t code, const char *text) {
    size_t n;
    size_t tl = strlen(text);
    if (tl > sizeof r->ctl - MOEX_PROTO_HEADER_BYTES - MOEX_PROTO_ERROR_FIXED_BYTES)
        tl = sizeof r->ctl - MOEX_PROTO_HEADER_BYTES - MOEX_PROTO_ERROR_FIXED_BYTES;
    if (!moex_proto_encode_error(seq, code, text, (uint16_t)tl, r->ctl, sizeof r->ctl, &n, NULL)) send_ctl(r, w, n);
}

/* Refuses a peer: the ERROR reaches it, then the connection closes. */
static void refuse(hub_registry *r, hub_worker *w, uint32_t seq, int32_t code, const char *text) {
    send_error(r, w, seq, code, text);
    w->closing = true;
    if (w->conn) hub_conn_close_after_flush(w->conn, moex_proto_error_info_of(code)->name);
    hub_net_wake(r->net);
}

/* ---- membership and placement ---- */

static bool is_member(const hub_worker *w) { return w->joined && w->conn && !w->evicted && !w->closing; }

/* The worker left the live set: nothing more is dispatched to it, and the
 * executor hears of it at once (its outstanding requests are lost). */
static void mark_gone(hub_registry *r, hub_worker *w) {
    memset(w->usable, 0, r->bitmap_bytes);
    if (w->joined && !w->gone_reported) {
        w->gone_reported = true;
        hub_inbox_push(r->inbox, &(hub_event){.kind = HUB_EV_WORKER_GONE, .worker = w->id});
    }
    r->membership++;
    pthread_cond_broadcast(&r->cv);
}

static void send_assign(hub_registry *r, hub_worker *w, const moex_placement *p, moex_expert_ref *held,
                        moex_proto_expert *list, uint8_t *frame, size_t frame_cap) {
    const size_t cap_experts = (size_t)r->cfg.n_layers * (size_t)r->cfg.n_experts;
    const size_t n = moex_placement_held(p, w->id, held, cap_experts);
    memset(w->assigned, 0, r->bitmap_bytes);
    for (size_t i = 0; i < n; i++) {
        list[i] = (moex_proto_expert){held[i].layer, held[i].expert};
        bit_set(w->assigned, bit_index(r, held[i].layer, held[i].expert));
    }
    /* until the worker reports READY for this generation it holds old ∩ new */
    for (size_t i = 0; i < r->bitmap_bytes; i++) w->usable[i] &= w->assigned[i];
    w->assigned_gen = ++r->generation;
    moex_proto_assign a = {.model_hash = r->cfg.model_hash, .worker_id = w->id, .n_layers = (uint16_t)r->cfg.n_layers,
                           .n_experts = (uint16_t)r->cfg.n_experts, .replicas = (uint16_t)moex_placement_replicas(p),
                           .session = w->session};
    size_t len;
    moex_error err = {0};
    if (moex_proto_encode_assign(w->assigned_gen, &a, list, (uint32_t)n, frame, frame_cap, &len, &err) == 0) {
        if (hub_conn_send(w->conn, frame, len)) HUB_ADD(r->metrics, bytes_out, len);
        moex_log(MOEX_LOG_INFO, "worker %s: assigned %zu experts (generation %u)", w->name, n, w->assigned_gen);
    } else {
        moex_log(MOEX_LOG_ERROR, "cannot encode ASSIGN: %s", err.msg);
    }
}

/* Installs a placement (under mu) and sends a new ASSIGN to each member
 * whose share changed. */
static void install(hub_registry *r, moex_placement *p) {
    moex_placement_free(r->placement);
    r->placement = p;
    HUB_COUNT(r->metrics, rebalances);
    if (!p) return;
    const size_t cap_experts = (size_t)r->cfg.n_layers * (size_t)r->cfg.n_experts;
    const size_t frame_cap = MOEX_PROTO_HEADER_BYTES + MOEX_PROTO_ASSIGN_FIXED_BYTES + 4 * cap_experts;
    moex_expert_ref *held = malloc(cap_experts * sizeof *held);
    moex_proto_expert *list = malloc(cap_experts * sizeof *list);
    uint8_t *fresh = malloc(r->bitmap_bytes), *frame = malloc(frame_cap);
    for (int i = 0; held && list && fresh && frame && i < r->n; i++) {
        hub_worker *w = r->w[i];
        if (!is_member(w)) continue;
        const size_t k = moex_placement_held(p, w->id, held, cap_experts);
        memset(fresh, 0, r->bitmap_bytes);
        for (size_t j = 0; j < k; j++) bit_set(fresh, bit_index(r, held[j].layer, held[j].expert));
        if (w->assigned_gen == 0 || memcmp(fresh, w->assigned, r->bitmap_bytes) != 0)
            send_assign(r, w, p, held, list, frame, frame_cap);
    }
    free(held);
    free(list);
    free(fresh);
    free(frame);
    hub_net_wake(r->net);
}

/* Rebuilds the placement over the live workers. Called with mu held; drops
 * it while the ring is built. */
static void rebalance(hub_registry *r) {
    moex_worker_spec specs[HUB_MAX_WORKERS];
    uint32_t n = 0;
    for (int i = 0; i < r->n; i++)
        if (is_member(r->w[i])) specs[n++] = (moex_worker_spec){r->w[i]->id, r->w[i]->capacity};
    const uint64_t version = ++r->membership;
    if (n == 0) {
        install(r, NULL);
        return;
    }
    moex_placement_config pc = {.n_layers = (uint32_t)r->cfg.n_layers, .n_experts = (uint32_t)r->cfg.n_experts,
                                .replicas = (uint32_t)(r->cfg.replicas < (int)n ? r->cfg.replicas : (int)n),
                                .seed = 0x4d6f4578};
    pthread_mutex_unlock(&r->mu);
    moex_error err = {0};
    moex_placement *p = moex_placement_build(specs, n, &pc, &err);
    pthread_mutex_lock(&r->mu);
    if (!p) {
        moex_log(MOEX_LOG_ERROR, "placement failed: %s", err.msg);
        return;
    }
    if (version != r->membership) { /* the live set changed meanwhile: its own rebalance installs */
        moex_placement_free(p);
        return;
    }
    install(r, p);
}

/* ---- connections ---- */

/* The oldest departed record that is not a ban, or the oldest ban when the
 * bans fill their quota; -1 when every record is live. */
static int reclaimable(const hub_registry *r) {
    int bans = 0, oldest_ban = -1;
    for (int i = 0; i < r->n; i++) {
        const hub_worker *w = r->w[i];
        if (w->conn) continue;
        if (!w->evicted) return i;
        if (oldest_ban < 0 || w->evicted_at < r->w[oldest_ban]->evicted_at) oldest_ban = i;
        bans++;
    }
    return bans >= MAX_BANS ? oldest_ban : -1;
}

static void remove_at(hub_registry *r, int i) {
    worker_free(r->w[i]);
    memmove(&r->w[i], &r->w[i + 1], (size_t)(r->n - i - 1) * sizeof r->w[0]);
    r->n--;
}

hub_worker *hub_registry_connect(hub_registry *r, hub_conn *c) {
    pthread_mutex_lock(&r->mu);
    int i = r->n == HUB_MAX_WORKERS ? reclaimable(r) : -1;
    if (i >= 0) remove_at(r, i);
    hub_worker *w = r->n < HUB_MAX_WORKERS ? calloc(1, sizeof *w) : NULL;
    if (w) {
        w->assigned = calloc(1, r->bitmap_bytes);
        w->usable = calloc(1, r->bitmap_bytes);
        if (!w->assigned || !w->usable) {
            worker_free(w);
            w = NULL;
        }
    }
    if (w) {
        hub_conn_ref(c);
        w->conn = c;
        w->last_rx_s = moex_time_s();
        w->lat_ewma_ms[HUB_SMALL] = w->lat_ewma_ms[HUB_LARGE] = -1;
        r->w[r->n++] = w;
    }
    pthread_mutex_unlock(&r->mu);
    return w;
}

static int index_of(const hub_registry *r, const hub_worker *w) {
    for (int i = 0; i < r->n; i++)
        if (r->w[i] == w) return i;
    return -1;
}

void hub_registry_disconnect(hub_registry *r, hub_worker *w, const char *why) {
    pthread_mutex_lock(&r->mu);
    const bool was_member = is_member(w);
    if (w->joined && !w->evicted) moex_log(MOEX_LOG_WARN, "worker %s left: %s", w->name, why);
    hub_conn_unref(w->conn);
    w->conn = NULL;
    if (!w->joined) {
        const int i = index_of(r, w);
        if (i >= 0) remove_at(r, i);
    } else {
        mark_gone(r, w);
        if (was_member && !r->stopping) rebalance(r);
    }
    pthread_mutex_unlock(&r->mu);
}

bool hub_registry_accepts_results(hub_registry *r, hub_worker *w, uint32_t *id) {
    pthread_mutex_lock(&r->mu);
    const bool ok = is_member(w);
    *id = w->id;
    pthread_mutex_unlock(&r->mu);
    return ok;
}

void hub_registry_on_receive(hub_registry *r, hub_worker *w, size_t bytes) {
    pthread_mutex_lock(&r->mu);
    w->last_rx_s = moex_time_s();
    w->bytes_in += bytes;
    pthread_mutex_unlock(&r->mu);
    HUB_ADD(r->metrics, bytes_in, bytes);
}

void hub_registry_bad_frame(hub_registry *r, hub_worker *w, uint32_t seq, int status, const char *why) {
    HUB_COUNT(r->metrics, bad_frames);
    pthread_mutex_lock(&r->mu);
    moex_log(MOEX_LOG_WARN, "connection %s: %s; closing", label(w), why);
    const bool member = is_member(w);
    refuse(r, w, seq, status < 0 ? status : MOEX_PROTO_E_FIELD, why);
    if (member) { /* it leaves now, not when the close comes: its requests go elsewhere at once */
        mark_gone(r, w);
        if (!r->stopping) rebalance(r);
    }
    pthread_mutex_unlock(&r->mu);
}

/* ---- JOIN ---- */

static uint64_t new_session_key(void) {
    uint64_t k = 0;
    while (k == 0)
        if (getrandom(&k, sizeof k, 0) != sizeof k) k = XXH3_64bits_withSeed(&k, sizeof k, (uint64_t)(moex_time_s() * 1e9));
    return k;
}

static hub_worker *by_id(const hub_registry *r, uint32_t id) {
    for (int i = 0; i < r->n; i++)
        if (r->w[i]->joined && r->w[i]->id == id) return r->w[i];
    return NULL;
}

static hub_worker *by_session(const hub_registry *r, uint64_t key, const hub_worker *except) {
    for (int i = 0; key && i < r->n; i++)
        if (r->w[i] != except && r->w[i]->joined && r->w[i]->session == key) return r->w[i];
    return NULL;
}

/* A stable id from the name, so that a worker keeps its experts across hub restarts too. */
static uint32_t id_for_name(const hub_registry *r, const char *name) {
    uint32_t id = XXH32(name, strlen(name), 0) | 1u;
    while (by_id(r, id)) id += 2;
    return id;
}

static bool join_rate_ok(hub_registry *r, double now) {
    if (now - r->join_window_s >= 1.0) {
        r->join_window_s = now;
        r->joins_in_window = 0;
    }
    return ++r->joins_in_window <= HUB_JOINS_PER_S;
}

/* Moves an earlier record's identity and record (id, statistics) onto the
 * new connection's, and forgets the earlier one. */
static void adopt(hub_registry *r, hub_worker *w, hub_worker *old) {
    if (is_member(old)) mark_gone(r, old);
    w->id = old->id;
    memcpy(w->lat_ms, old->lat_ms, sizeof w->lat_ms);
    w->lat_n = old->lat_n;
    memcpy(w->lat_ewma_ms, old->lat_ewma_ms, sizeof w->lat_ewma_ms);
    w->n_dispatched = old->n_dispatched;
    w->n_won = old->n_won;
    w->n_timeouts = old->n_timeouts;
    w->bytes_in += old->bytes_in;
    if (old->conn) { /* the old connection is half-open: the worker has moved on. Its record goes when it closes. */
        hub_conn_kill(old->conn, "replaced by the same worker's new connection");
        old->closing = true;
        old->joined = false;
        old->session = 0;
        old->id = 0;
    } else {
        const int i = index_of(r, old);
        if (i >= 0) remove_at(r, i);
    }
}

static void on_join(hub_registry *r, hub_worker *w, const moex_proto_msg *msg) {
    const moex_proto_join *j = &msg->u.join.info;
    char name[HUB_NAME_BYTES]; /* shown in logs, /status.json and metric labels: valid UTF-8 only */
    moex_utf8_sanitize(j->name, j->name_len, name, sizeof name);
    if (w->joined) { /* the name stays the first JOIN's */
        send_error(r, w, msg->h.seq, MOEX_ERR_ALREADY_JOINED, "already joined");
        if (++w->repeat_joins >= MAX_REPEAT_JOINS) {
            const bool member = is_member(w);
            refuse(r, w, msg->h.seq, MOEX_ERR_REFUSED, "JOIN repeated");
            if (member) {
                mark_gone(r, w);
                if (!r->stopping) rebalance(r);
            }
        }
        return;
    }
    snprintf(w->name, sizeof w->name, "%s", name);
    HUB_COUNT(r->metrics, joins);
    if (j->proto_min > MOEX_PROTO_VERSION || j->proto_max < MOEX_PROTO_VERSION) {
        char text[96];
        snprintf(text, sizeof text, "no common protocol version: the worker speaks %u..%u, the hub %d", j->proto_min,
                 j->proto_max, MOEX_PROTO_VERSION);
        moex_log(MOEX_LOG_WARN, "worker %s: %s; refused", w->name, text);
        refuse(r, w, msg->h.seq, MOEX_ERR_VERSION, text);
        return;
    }
    if (j->model_hash != r->cfg.model_hash) {
        char text[200];
        snprintf(text, sizeof text,
                 "model mismatch: the worker has %016llx, the hub serves %016llx; start the worker with the hub's "
                 "GGUF (--model), or without --model to download its experts",
                 (unsigned long long)j->model_hash, (unsigned long long)r->cfg.model_hash);
        moex_log(MOEX_LOG_WARN, "worker %s: %s", w->name, text);
        refuse(r, w, msg->h.seq, MOEX_ERR_MODEL_MISMATCH, text);
        return;
    }
    hub_worker *old = by_session(r, j->session, w);
    if (old && old->evicted) {
        moex_log(MOEX_LOG_WARN, "worker %s: refused, evicted earlier for wrong results", w->name);
        refuse(r, w, msg->h.seq, MOEX_ERR_EVICTED, "this worker was evicted for wrong results");
        return;
    }
    const double now = moex_time_s();
    if (!join_rate_ok(r, now)) {
        refuse(r, w, msg->h.seq, MOEX_ERR_REFUSED, "too many workers joining at once; retry in a moment");
        return;
    }
    float cap = j->capacity_centi / 100.0f;
    if (cap > HUB_MAX_CAPACITY) {
        moex_log(MOEX_LOG_WARN, "worker %s: capacity %.2f clamped to %.0f", w->name, cap, HUB_MAX_CAPACITY);
        cap = HUB_MAX_CAPACITY;
    }
    w->capacity = cap;
    w->backend = j->backend;
    if (old) {
        adopt(r, w, old);
        w->session = j->session;
    } else {
        w->id = id_for_name(r, w->name);
        w->session = new_session_key();
    }
    w->joined = true;
    moex_log(MOEX_LOG_INFO, "worker %s joined from %s (id %08x, capacity %.2f, backend %u%s)", w->name,
             hub_conn_peer(w->conn), w->id, w->capacity, j->backend, old ? ", reconnected" : "");
    rebalance(r);
    pthread_cond_broadcast(&r->cv);
}

static void on_heartbeat(hub_registry *r, hub_worker *w, const moex_proto_msg *msg) {
    const moex_proto_heartbeat *hb = &msg->u.heartbeat;
    if (hb->echo_us) {
        const double now_us = moex_time_s() * 1e6;
        const float rtt = (float)((now_us - (double)hb->echo_us) / 1000.0);
        if (rtt >= 0 && rtt < 60000) w->rtt_ms = rtt;
    }
    if (hb->state == MOEX_STATE_READY && msg->h.seq == w->assigned_gen && w->ready_gen != w->assigned_gen) {
        w->ready_gen = w->assigned_gen;
        memcpy(w->usable, w->assigned, r->bitmap_bytes);
        moex_log(MOEX_LOG_INFO, "worker %s: ready (generation %u)", w->name, w->ready_gen);
        pthread_cond_broadcast(&r->cv);
    }
    if (hb->state == MOEX_STATE_READY && w->unhealthy) { /* a good heartbeat restores it */
        w->unhealthy = false;
        w->consecutive_timeouts = 0;
        moex_log(MOEX_LOG_INFO, "worker %s: healthy again", w->name);
    }
}

void hub_registry_on_control(hub_registry *r, hub_worker *w, const moex_proto_msg *msg) {
    pthread_mutex_lock(&r->mu);
    if (msg->h.type == MOEX_MSG_JOIN) {
        on_join(r, w, msg);
    } else if (!w->joined) {
        moex_log(MOEX_LOG_WARN, "connection %s: frame type %u before JOIN; closing", label(w), msg->h.type);
        HUB_COUNT(r->metrics, bad_frames);
        refuse(r, w, msg->h.seq, MOEX_PROTO_E_FIELD, "JOIN first");
    } else if (msg->h.type == MOEX_MSG_HEARTBEAT) {
        on_heartbeat(r, w, msg);
    }
    pthread_mutex_unlock(&r->mu);
}

/* ---- the ticker ---- */

void hub_registry_tick(hub_registry *r, double now) {
    pthread_mutex_lock(&r->mu);
    bool changed = false;
    for (int i = 0; i < r->n; i++) {
        hub_worker *w = r->w[i];
        if (!w->conn || !hub_conn_open(w->conn)) continue;
        if ((now - w->last_rx_s) * 1000.0 > r->cfg.dead_after_ms) {
            moex_log(MOEX_LOG_WARN, "worker %s silent for %.1f s: removing", label(w), now - w->last_rx_s);
            hub_conn_kill(w->conn, "silent");
            const bool member = is_member(w);
            w->closing = true;
            if (member) {
                mark_gone(r, w);
                changed = true;
            }
            continue;
        }
        if (!w->joined) continue;
        /* A worker not picked for a while (it looked slow) drifts back towards
         * its network round trip, so it gets tried again and stays current. */
        for (int c = 0; c < 2; c++)
            if (w->lat_ewma_ms[c] >= 0 && now - w->last_sample_s[c] > 2.0)
                w->lat_ewma_ms[c] = 0.8f * w->lat_ewma_ms[c] + 0.2f * w->rtt_ms;
        moex_proto_heartbeat hb = {.timestamp_us = (uint64_t)(now * 1e6), .state = MOEX_STATE_READY};
        size_t len;
        if (!moex_proto_encode_heartbeat(0, &hb, r->ctl, sizeof r->ctl, &len, NULL)) send_ctl(r, w, len);
    }
    if (changed && !r->stopping) rebalance(r);
    pthread_mutex_unlock(&r->mu);
    hub_net_wake(r->net);
}

/* ---- the executor's questions ---- */

int hub_registry_replicas(hub_registry *r, int layer, int expert, hub_size size, hub_replica *out, int max) {
    int n = 0;
    pthread_mutex_lock(&r->mu);
    const uint32_t *ids = r->placement ? moex_placement_lookup(r->placement, (uint32_t)layer, (uint32_t)expert) : NULL;
    for (uint32_t i = 0; ids && i < moex_placement_replicas(r->placement) && n < max; i++) {
        hub_worker *w = by_id(r, ids[i]);
        if (!w || !is_member(w) || w->unhealthy || !bit_get(w->usable, bit_index(r, layer, expert)) ||
            !hub_conn_open(w->conn))
            continue;
        hub_conn_ref(w->conn);
        out[n++] = (hub_replica){.id = w->id, .conn = w->conn, .lat_ms = w->lat_ewma_ms[size],
                                 .sampled_s = w->last_sample_s[size], .backend = w->backend};
    }
    pthread_mutex_unlock(&r->mu);
    return n;
}

float hub_registry_median_ms(hub_registry *r, hub_size size) {
    float v[HUB_MAX_WORKERS];
    int n = 0;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++)
        if (r->w[i]->lat_ewma_ms[size] >= 0 && is_member(r->w[i])) v[n++] = r->w[i]->lat_ewma_ms[size];
    pthread_mutex_unlock(&r->mu);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            const float x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    return n ? v[n / 2] : 0.0f;
}

static void record_latency(hub_worker *w, hub_size size, float ms) {
    w->last_sample_s[size] = moex_time_s();
    w->lat_ms[w->lat_n % LAT_SAMPLES] = ms;
    w->lat_n++;
    w->lat_ewma_ms[size] = w->lat_ewma_ms[size] < 0 ? ms : 0.8f * w->lat_ewma_ms[size] + 0.2f * ms;
}

void hub_registry_record(hub_registry *r, uint32_t id, hub_size size, float ms, hub_outcome o) {
    pthread_mutex_lock(&r->mu);
    hub_worker *w = by_id(r, id);
    if (w) {
        record_latency(w, size, ms);
        if (o == HUB_WON) {
            w->n_won++;
            w->consecutive_timeouts = 0;
        } else if (o == HUB_LOST) {
            w->n_lost++;
        } else if (o == HUB_TIMEOUT) {
            w->n_timeouts++;
            if (++w->consecutive_timeouts >= 3 && !w->unhealthy) {
                w->unhealthy = true;
                moex_log(MOEX_LOG_WARN, "worker %s: 3 consecutive timeouts, unhealthy until a good heartbeat", w->name);
            }
        }
    }
    pthread_mutex_unlock(&r->mu);
}

void hub_registry_count_dispatch(hub_registry *r, uint32_t id, int n) {
    pthread_mutex_lock(&r->mu);
    hub_worker *w = by_id(r, id);
    if (w) w->n_dispatched += (uint64_t)n;
    pthread_mutex_unlock(&r->mu);
}

void hub_registry_evict(hub_registry *r, uint32_t id, const char *why) {
    pthread_mutex_lock(&r->mu);
    hub_worker *w = by_id(r, id);
    if (w && !w->evicted) {
        moex_log(MOEX_LOG_WARN, "worker %s evicted: %s", w->name, why);
        HUB_COUNT(r->metrics, evictions);
        const bool member = is_member(w);
        w->evicted = true;
        w->evicted_at = moex_time_s();
        if (member) mark_gone(r, w);
        if (w->conn && hub_conn_open(w->conn)) refuse(r, w, 0, MOEX_ERR_EVICTED, why);
        if (member && !r->stopping) rebalance(r);
    }
    pthread_mutex_unlock(&r->mu);
}

void hub_registry_note_check(hub_registry *r, uint32_t id, double share) {
    pthread_mutex_lock(&r->mu);
    hub_worker *w = by_id(r, id);
    if (w) {
        w->n_checked++;
        if (!(share <= w->worst_check)) w->worst_check = share;
    }
    pthread_mutex_unlock(&r->mu);
}

void hub_registry_bad_result(hub_registry *r, uint32_t id, const char *why) {
    HUB_COUNT(r->metrics, bad_results);
    pthread_mutex_lock(&r->mu);
    hub_worker *w = by_id(r, id);
    if (w && w->conn && hub_conn_open(w->conn)) {
        moex_log(MOEX_LOG_WARN, "worker %s: %s; closing", w->name, why);
        const bool member = is_member(w);
        refuse(r, w, 0, MOEX_PROTO_E_FIELD, why);
        if (member) {
            mark_gone(r, w);
            if (!r->stopping) rebalance(r);
        }
    }
    pthread_mutex_unlock(&r->mu);
}

hub_conn *hub_registry_conn(hub_registry *r, uint32_t id) {
    pthread_mutex_lock(&r->mu);
    hub_worker *w = by_id(r, id);
    hub_conn *c = w && w->conn ? w->conn : NULL;
    if (c) hub_conn_ref(c);
    pthread_mutex_unlock(&r->mu);
    return c;
}

int hub_registry_backend(hub_registry *r, uint32_t id) {
    pthread_mutex_lock(&r->mu);
    hub_worker *w = by_id(r, id);
    const int b = w ? w->backend : -1;
    pthread_mutex_unlock(&r->mu);
    return b;
}

/* ---- waiting and printing ---- */

static bool ready(const hub_worker *w) {
    return is_member(w) && w->ready_gen == w->assigned_gen && w->assigned_gen != 0;
}

int hub_registry_wait_ready(hub_registry *r, int n, double timeout_s, const volatile sig_atomic_t *cancel,
                            const char *how_to_join, moex_error *err) {
    const double deadline = moex_time_s() + timeout_s;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (cancel && *cancel) {
            pthread_mutex_unlock(&r->mu);
            return moex_fail(err, "interrupted while waiting for workers");
        }
        int n_ready = 0, joined = 0;
        for (int i = 0; i < r->n; i++) {
            joined += is_member(r->w[i]) && hub_conn_open(r->w[i]->conn);
            n_ready += ready(r->w[i]) && hub_conn_open(r->w[i]->conn);
        }
        /* every joined worker must be ready: a new join changes everyone's assignment */
        if (n_ready >= n && n_ready == joined) break;
        const double left = deadline - moex_time_s();
        if (left <= 0 || r->stopping) {
            pthread_mutex_unlock(&r->mu);
            return moex_fail(err, "%d of %d workers ready after %.0f s (joined %d); %s", n_ready, n, timeout_s, joined,
                             how_to_join);
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        const double at = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + (left < 0.1 ? left : 0.1);
        ts.tv_sec = (time_t)at;
        ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

void hub_registry_stop(hub_registry *r) {
    pthread_mutex_lock(&r->mu);
    r->stopping = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void print_percentiles(FILE *f, const hub_worker *w) {
    const uint32_t n = w->lat_n < LAT_SAMPLES ? w->lat_n : LAT_SAMPLES;
    if (!n) {
        fprintf(f, "   -        -        -     ");
        return;
    }
    float s[LAT_SAMPLES];
    memcpy(s, w->lat_ms, n * sizeof *s);
    const float p50 = moex_quantile_sorted_f32(s, n, 0.5);
    fprintf(f, "%7.2f  %7.2f  %7.2f ", p50, moex_quantile_of_sorted_f32(s, n, 0.95), moex_quantile_of_sorted_f32(s, n, 0.99));
}

void hub_registry_print(hub_registry *r, FILE *f) {
    pthread_mutex_lock(&r->mu);
    fprintf(f, "  worker                      p50 ms   p95 ms   p99 ms  dispatched  won  timeouts  verified (worst)"
               "  state\n");
    for (int i = 0; i < r->n; i++) {
        const hub_worker *w = r->w[i];
        if (!w->joined) continue;
        fprintf(f, "  %-24.24s ", w->name);
        print_percentiles(f, w);
        fprintf(f, " %10llu %5llu %8llu  %8llu (%.3f)  %s\n", (unsigned long long)w->n_dispatched,
                (unsigned long long)w->n_won, (unsigned long long)w->n_timeouts, (unsigned long long)w->n_checked,
                w->worst_check, w->evicted ? "evicted" : !w->conn ? "gone" : w->unhealthy ? "unhealthy" : "ready");
    }
    pthread_mutex_unlock(&r->mu);
}

/* ---- read-only views ---- */

static const char *state_of(const hub_worker *w) {
    if (w->evicted) return "evicted";
    if (!w->conn || w->closing) return "gone";
    if (w->unhealthy) return "unhealthy";
    return ready(w) ? "ready" : "loading";
}

static uint32_t count_bits(const uint8_t *bits, size_t n_bytes) {
    uint32_t n = 0;
    for (size_t i = 0; i < n_bytes; i++) n += (uint32_t)__builtin_popcount(bits[i]);
    return n;
}

static void percentiles(const hub_worker *w, hub_worker_info *o) {
    const uint32_t n = w->lat_n < LAT_SAMPLES ? w->lat_n : LAT_SAMPLES;
    o->lat_p50_ms = o->lat_p95_ms = o->lat_p99_ms = -1;
    if (!n) return;
    float s[LAT_SAMPLES];
    memcpy(s, w->lat_ms, n * sizeof *s);
    o->lat_p50_ms = moex_quantile_sorted_f32(s, n, 0.5);
    o->lat_p95_ms = moex_quantile_of_sorted_f32(s, n, 0.95);
    o->lat_p99_ms = moex_quantile_of_sorted_f32(s, n, 0.99);
}

int hub_registry_workers(hub_registry *r, hub_worker_info *out, int max) {
    int n = 0;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) {
        const hub_worker *w = r->w[i];
        if (!w->joined) continue;
        if (n < max) {
            hub_worker_info *o = &out[n];
            *o = (hub_worker_info){.id = w->id, .state = state_of(w), .backend = w->backend, .capacity = w->capacity,
                                   .lat_ewma_ms = {w->lat_ewma_ms[HUB_SMALL], w->lat_ewma_ms[HUB_LARGE]},
                                   .rtt_ms = w->rtt_ms, .dispatched = w->n_dispatched,
                                   .won = w->n_won, .lost = w->n_lost, .timeouts = w->n_timeouts,
                                   .bytes_in = w->bytes_in, .checked = w->n_checked, .worst_check = w->worst_check};
            snprintf(o->name, sizeof o->name, "%s", w->name);
            snprintf(o->peer, sizeof o->peer, "%s", w->conn ? hub_conn_peer(w->conn) : "");
            o->experts_assigned = w->assigned ? count_bits(w->assigned, r->bitmap_bytes) : 0;
            o->experts_ready = w->usable ? count_bits(w->usable, r->bitmap_bytes) : 0;
            percentiles(w, o);
        }
        n++;
    }
    pthread_mutex_unlock(&r->mu);
    return n;
}

void hub_registry_coverage(hub_registry *r, hub_coverage *c) {
    const size_t n_bits = (size_t)r->cfg.n_layers * (size_t)r->cfg.n_experts;
    *c = (hub_coverage){.experts = n_bits, .replicas = r->cfg.replicas};
    pthread_mutex_lock(&r->mu);
    for (size_t b = 0; b < n_bits; b++) {
        int held = 0;
        for (int i = 0; i < r->n; i++)
            if (r->w[i]->usable && is_member(r->w[i]) && bit_get(r->w[i]->usable, b)) held++;
        c->covered += held > 0;
        c->replicas_ready += (uint64_t)held;
    }
    pthread_mutex_unlock(&r->mu);
}
