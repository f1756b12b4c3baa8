/* The worker's session with the hub, over a libwebsockets client: connect
 * (with backoff), JOIN, heartbeats, and the outbox drained one message per
 * WRITEABLE. Messages from the hub are read in session_rx.c; the compute
 * thread (compute.c) does the work. Runs on the calling thread.
 *
 * Timers: one 100 ms tick drives reconnects, heartbeats, the hub-silence
 * check and the stop flag, so that the service loop needs nothing else; the
 * compute thread's results wake it at once (lws_cancel_service). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "worker/download_internal.h"
#include "worker/download_loader.h"
#include "worker/session_internal.h"

#define TICK_US (100 * LWS_US_PER_MS)
#define HEARTBEAT_S (MOEX_PROTO_HEARTBEAT_MS / 1000.0)
#define HUB_SILENCE_S (MOEX_PROTO_HUB_SILENCE_MS / 1000.0)
#define BACKOFF_MIN_S (MOEX_PROTO_BACKOFF_MIN_MS / 1000.0)
#define BACKOFF_MAX_S (MOEX_PROTO_BACKOFF_MAX_MS / 1000.0)
#define FATAL_FLUSH_S 1.0      /* how long a fatal ERROR may take to leave */
#define CLOSE_WAIT_S 1.0       /* how long a clean close may take on exit */
#define PROBE_S 5.0            /* how long asking the hub's HTTP side may take */
#define RX_BUFFER_BYTES 65536

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* tcp://: the connection's first frame, the hub's token (docs/PROTOCOL.md, "The TCP transport"). */
static void send_auth(session *s) {
    size_t len;
    moex_error err;
    if (moex_proto_encode_auth(0, s->hub.token, strlen(s->hub.token), s->ctl, sizeof s->ctl, &len, &err) == 0)
        worker_send_ctl(s, len);
    else
        moex_log(MOEX_LOG_ERROR, "worker: cannot send the token: %s", err.msg);
}

static void send_join(session *s) {
    const moex_worker_options *o = s->o;
    moex_proto_join j = {
        .proto_min = MOEX_PROTO_VERSION, .proto_max = MOEX_PROTO_VERSION, .backend = (uint8_t)o->backend,
        .capacity_centi = (uint16_t)lround(o->capacity * 100.0), .memory_budget = o->memory_budget,
        .model_hash = s->model_hash, .session = s->hub_session, .name = s->name,
        .name_len = (uint8_t)strlen(s->name),
    };
    if (j.capacity_centi < 1) j.capacity_centi = 1;
    size_t len;
    moex_error err;
    if (moex_proto_encode_join(0, &j, NULL, 0, s->ctl, sizeof s->ctl, &len, &err)) {
        moex_log(MOEX_LOG_ERROR, "worker: cannot encode JOIN: %s", err.msg);
        return;
    }
    worker_send_ctl(s, len);
}

static void send_heartbeat(session *s) {
    const double now = moex_time_s();
    pthread_mutex_lock(&s->mu);
    const double span = now - s->last_hb_s;
    double load = span > 0 ? s->busy_s / span : 0;
    moex_proto_heartbeat hb = {
        .timestamp_us = now_us(), .echo_us = s->peer_ts_us,
        .queue_depth = (uint32_t)moex_worker_backlog_depth(s->backlog) + (s->running ? (uint32_t)s->batch_n : 0u),
        .load_permille = (uint16_t)lround(1000.0 * (load > 1 ? 1 : load)), .state = s->state,
    };
    const uint32_t g = s->g;
    s->busy_s = 0;
    s->hb_now = false;
    pthread_mutex_unlock(&s->mu);
    s->last_hb_s = now;
    s->next_hb_s = now + HEARTBEAT_S;
    size_t len;
    if (moex_proto_encode_heartbeat(g, &hb, s->ctl, sizeof s->ctl, &len, NULL) == 0) worker_send_ctl(s, len);
}

/* ---- connecting ---- */

/* Download mode: a download that failed for good ends the worker. */
static void check_loader(session *s) {
    moex_error err;
    if (!s->fatal && dl_loader_failed(s, &err)) worker_go_fatal(s, err.msg);
}

/* After a failed attempt or a lost connection: schedule the next attempt
 * (exponential backoff with jitter) or give up after --reconnect-max-s. */
static void schedule_reconnect(session *s, const char *reason) {
    const double now = moex_time_s();
    s->link = LINK_DOWN;
    s->wsi = NULL;
    if (s->done || *s->stop) return;
    const double max = s->o->reconnect_max_s;
    if (max > 0 && now - s->down_since_s >= max) {
        char why[400];
        snprintf(why, sizeof why, "no connection to the hub %s that took this worker for %.1f s (last: %s); giving up",
                 s->o->hub_url, now - s->down_since_s, reason);
        worker_go_fatal(s, why); /* link is down: the service loop ends */
        return;
    }
    /* "equal jitter": half fixed, half random, so workers that lost the
     * same hub do not all come back in the same instant. */
    const double delay = s->backoff_s * (0.5 + 0.5 * moex_rand01(&s->jitter_rng));
    s->backoff_s = fmin(2 * s->backoff_s, BACKOFF_MAX_S);
    s->next_attempt_s = now + delay;
    moex_log(MOEX_LOG_INFO, "worker: hub %s: %s; retrying in %.1f s", s->o->hub_url, reason, delay);
}

static void connect_hub(session *s) {
    if (s->down_since_s == 0) s->down_since_s = moex_time_s();
    s->handshake_sent = false;
    struct lws_client_connect_info ci;
    worker_lws_connect_info(&ci, s->ctx, &s->hub);
    if (s->hub.tcp) { /* a plain TCP stream of frames (libwebsockets' raw socket) */
        ci.method = "RAW";
        ci.local_protocol_name = "moex-tcp";
    } else {
        ci.path = s->path;
        ci.protocol = "moex";
    }
    ci.pwsi = &s->wsi;
    s->link = LINK_CONNECTING;
    if (!lws_client_connect_via_info(&ci) && s->link == LINK_CONNECTING) schedule_reconnect(s, "cannot start a connection");
}

/* The connection is gone: everything queued for it is void (its sequence
 * ids mean nothing on the next connection). The backoff and the time without
 * a hub start again only after a connection the hub took (an ASSIGN came), so
 * that a hub refusing this worker is not asked again and again at once. */
static void connection_lost(session *s, const char *reason) {
    moex_log(MOEX_LOG_INFO, "worker: disconnected from the hub (%s)", reason);
    pthread_mutex_lock(&s->mu);
    s->conn++;
    worker_backlog_drop_all(s);
    moex_worker_outbox_clear(s->outbox);
    s->assign_pending = false;
    s->stats.disconnects++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->accepted) {
        s->backoff_s = BACKOFF_MIN_S;
        s->down_since_s = moex_time_s();
    } else {
        s->check_hub = true; /* closed before an ASSIGN: another model? */
    }
    s->accepted = false;
    moex_proto_reasm_reset(&s->reasm);
    s->close_requested = false;
    if (s->fatal) s->done = true;
    schedule_reconnect(s, reason);
}

static void connection_up(session *s) {
    const double now = moex_time_s();
    s->link = LINK_UP;
    s->accepted = false;
    s->last_rx_s = now;
    s->last_hb_s = now;
    s->next_hb_s = now + HEARTBEAT_S;
    moex_proto_reasm_reset(&s->reasm);
    s->close_requested = false;
    pthread_mutex_lock(&s->mu);
    s->conn++;
    s->g = 0;
    s->state = MOEX_STATE_STARTING;
    s->busy_s = 0;
    s->stats.connects++;
    pthread_cond_broadcast(&s->cv); /* the download thread watches conn */
    pthread_mutex_unlock(&s->mu);
    moex_log(MOEX_LOG_INFO, "worker: connected to the hub %s as '%s'", s->o->hub_url, s->name);
    if (s->hub.tcp) send_auth(s);
    send_join(s);
}

/* ---- asking the hub's HTTP side ----
 * Two refusals reach a client as a bare closed connection: a wrong token is
 * refused at the HTTP upgrade (an HTTP error, or the connection closed
 * before the upgrade), and a hub that closes the connection before any
 * ASSIGN may serve another model (its ERROR may not have left first). After
 * either, the worker asks the hub's GET /v1/model (docs/PROTOCOL.md,
 * "Expert download"): 403 means the token, another model_hash a model
 * mismatch. Runs outside the libwebsockets callbacks (its client has a
 * context of its own), bounded by PROBE_S. */

#define PROBE_JSON_MAX ((size_t)4 << 20)

typedef struct probe_ctx {
    session *s;
    char *json;
    size_t len, cap;
    double until_s;
} probe_ctx;

static bool probe_over(void *arg) {
    const probe_ctx *p = arg;
    return *p->s->stop || moex_time_s() > p->until_s;
}

static int probe_body(void *arg, const void *data, size_t len, moex_error *err) {
    probe_ctx *p = arg;
    if (len > PROBE_JSON_MAX - p->len) return moex_fail(err, "/v1/model: over %zu bytes", PROBE_JSON_MAX);
    if (p->len + len > p->cap) {
        size_t cap = p->cap ? p->cap : 16384;
        while (cap < p->len + len) cap *= 2;
        char *q = realloc(p->json, cap);
        if (!q) return moex_fail(err, "out of memory");
        p->json = q;
        p->cap = cap;
    }
    memcpy(p->json + p->len, data, len);
    p->len += len;
    return 0;
}

static void check_hub(session *s) {
    s->check_hub = false;
    if (s->fatal || s->hub.tcp) return; /* tcp://: the hub says why in an ERROR, and its HTTP is on another port */
    moex_error err = {{0}};
    if (!s->probe && !(s->probe = dl_http_create(s->o, &err))) {
        moex_log(MOEX_LOG_WARN, "worker: cannot ask the hub: %s", err.msg);
        return;
    }
    probe_ctx p = {.s = s, .until_s = moex_time_s() + PROBE_S};
    dl_request req = {.path = "/v1/model", .range_first = -1, .range_last = -1, .on_body = probe_body,
                      .stop = probe_over, .ctx = &p};
    dl_response r;
    uint64_t hash = 0;
    char why[sizeof s->fatal_err.msg];
    if (dl_http_get(s->probe, &req, &r, &err) != DL_OK) {
        moex_log(MOEX_LOG_DEBUG, "worker: GET /v1/model: %s", err.msg);
    } else if (r.status == 403 || r.status == 401) {
        snprintf(why, sizeof why, "the hub at %s refused the token (HTTP %d): check --token", dl_http_base(s->probe),
                 r.status);
        worker_go_fatal(s, why);
    } else if (r.status == 200 && dl_model_hash(p.json, p.len, &hash, &err) == 0 && hash != s->model_hash) {
        snprintf(why, sizeof why, "the hub %s serves model %016llx, this worker has %016llx from %s: %s",
                 s->o->hub_url, (unsigned long long)hash, (unsigned long long)s->model_hash,
                 s->store ? moex_worker_store_source(s->store) : s->o->model_path, worker_mismatch_advice(s));
        worker_model_mismatch(s, why);
    }
    free(p.json);
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len) {
    session *s = lws_context_user(lws_get_context(wsi));
    switch (reason) {
    case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER: {
        unsigned char **p = (unsigned char **)in, *end = (*p) + len;
        if (lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_AUTHORIZATION, (const unsigned char *)s->hub.auth,
                                         (int)strlen(s->hub.auth), p, end))
            return -1;
        s->handshake_sent = true;
        break;
    }
    case LWS_CALLBACK_CLIENT_ESTABLISHED:
        s->wsi = wsi;
        connection_up(s);
        break;
    case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
        if (s->wsi == wsi || s->link == LINK_CONNECTING) {
            char why[400];
            snprintf(why, sizeof why, "connection failed: %.*s%s", in ? (int)len : 7, in ? (const char *)in : "unknown",
                     worker_tls_hint(&s->hub, in, len));
            if (s->link == LINK_UP) {
                connection_lost(s, why);
            } else {
                s->check_hub = s->handshake_sent; /* refused at the upgrade: the token? */
                schedule_reconnect(s, why);
            }
        }
        break;
    case LWS_CALLBACK_CLIENT_CLOSED:
    case LWS_CALLBACK_RAW_CLOSE:
        if (s->link == LINK_UP) connection_lost(s, "connection closed");
        break;
    case LWS_CALLBACK_RAW_CONNECTED:
        s->wsi = wsi;
        connection_up(s);
        worker_request_write(s);
        break;
    case LWS_CALLBACK_CLIENT_RECEIVE:
        if (s->link == LINK_UP) return worker_on_receive(s, wsi, in, len);
        break;
    case LWS_CALLBACK_RAW_RX:
        if (s->link == LINK_UP) return worker_on_receive_stream(s, wsi, in, len);
        break;
    case LWS_CALLBACK_CLIENT_WRITEABLE:
    case LWS_CALLBACK_RAW_WRITEABLE:
        if (s->link == LINK_UP) return worker_on_writeable(s, wsi);
        break;
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED: {
        check_loader(s);
        pthread_mutex_lock(&s->mu);
        const bool hb = s->hb_now, pending = moex_worker_outbox_count(s->outbox) > 0;
        pthread_mutex_unlock(&s->mu);
        if (s->link == LINK_UP && hb) send_heartbeat(s);
        else if (pending) worker_request_write(s);
        break;
    }
    default: break;
    }
    return 0;
}

static const struct lws_protocols protocols[] = {
    {"moex", callback, 0, RX_BUFFER_BYTES, 0, NULL, 0},
    {"moex-tcp", callback, 0, RX_BUFFER_BYTES, 0, NULL, 1 << 20}, /* 1 MiB a send */
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

/* ---- the tick ---- */

static void on_tick(lws_sorted_usec_list_t *sul) {
    session *s = lws_container_of(sul, session, tick);
    const double now = moex_time_s();
    lws_sul_schedule(s->ctx, 0, &s->tick, on_tick, TICK_US);
    if (*s->stop) s->done = true;
    if (s->fatal && (s->link != LINK_UP || now - s->fatal_since_s > FATAL_FLUSH_S)) s->done = true;
    if (s->done) return;
    check_loader(s);
    if (s->link == LINK_DOWN && now >= s->next_attempt_s) connect_hub(s);
    if (s->link == LINK_UP) {
        if (now - s->last_rx_s > HUB_SILENCE_S && !s->close_requested) {
            moex_log(MOEX_LOG_WARN, "worker: nothing from the hub for %.0f s; reconnecting", HUB_SILENCE_S);
            s->close_requested = true;
            lws_callback_on_writable(s->wsi);
        }
        if (now >= s->next_hb_s) send_heartbeat(s);
    }
}

/* On SIGINT/SIGTERM: a WebSocket close handshake, at most CLOSE_WAIT_S. */
static void close_gracefully(session *s) {
    if (s->link != LINK_UP || !s->wsi) return;
    s->close_requested = true;
    lws_callback_on_writable(s->wsi);
    const double until = moex_time_s() + CLOSE_WAIT_S;
    while (s->link == LINK_UP && moex_time_s() < until)
        if (lws_service(s->ctx, 0) < 0) break;
}

/* ---- setup ---- */

/* Appends s percent-encoded (RFC 3986 unreserved characters kept). */
static void append_urlencoded(char *dst, size_t cap, const char *src) {
    size_t n = strlen(dst);
    for (; *src && n + 4 < cap; src++) {
        unsigned char ch = (unsigned char)*src;
        if ((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || strchr("-._~", ch))
            dst[n++] = (char)ch;
        else
            n += (size_t)snprintf(dst + n, cap - n, "%%%02X", ch);
    }
    dst[n] = 0;
}

/* ws[s]://HOST[:PORT][/PATH] -> address, port, path with ?token=, Host and Authorization values. */
static int parse_hub_url(session *s, moex_error *err) {
    const moex_worker_options *o = s->o;
    if (worker_hub_addr_parse(&s->hub, o, err)) return -1;
    const char *path = s->hub.path;
    snprintf(s->path, sizeof s->path, "/%s%stoken=", path, strchr(path, '?') ? "&" : "?");
    append_urlencoded(s->path, sizeof s->path, o->token);
    return 0;
}

static void default_name(char *buf, size_t cap) {
    char host[200] = "unknown";
    if (gethostname(host, sizeof host - 1)) strcpy(host, "unknown");
    host[sizeof host - 1] = 0;
    for (char *p = host; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '_';
    snprintf(buf, cap, "worker-%s-%d", host, (int)getpid());
}

static uint64_t all_experts_bytes(const moex_model *m) {
    uint64_t total = 0;
    for (int l = 0; l < m->hp.n_layer; l++)
        for (int e = 0; e < m->hp.n_expert; e++) total += moex_worker_expert_bytes(&m->layers[l].experts[e]);
    return total;
}

static int session_init(session *s, const moex_worker_options *o, const moex_model *m, moex_worker_store *store,
                        volatile sig_atomic_t *stop, moex_worker_options *own, moex_error *err) {
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    *own = *o;
    s->budget_given = o->memory_budget;
    if (!own->memory_budget) own->memory_budget = all_experts_bytes(m);
    s->o = own;
    s->m = m;
    s->stop = stop;
    s->store = store;
    if (!moex_hparams_is_moe(&m->hp)) return moex_fail(err, "%s is not a mixture-of-experts model", o->model_path);
    s->model_hash = store ? moex_worker_store_model_hash(store) : moex_gguf_identity(m->gguf);
    s->lim = moex_proto_default_limits();
    s->lim.max_hidden = (uint32_t)m->hp.n_embd;
    s->lim.max_layers = (uint32_t)m->hp.n_layer;
    s->lim.max_experts = (uint32_t)m->hp.n_expert;
    s->lim.max_tokens = 65536;
    if (o->name) snprintf(s->name, sizeof s->name, "%s", o->name);
    else default_name(s->name, sizeof s->name);
    s->backoff_s = BACKOFF_MIN_S;
    s->jitter_rng = o->seed ^ 0x6a09e667f3bcc909ull;
    s->down_since_s = 0;   /* set by the first attempt: start-up time (loading experts) does not count */
    s->state = MOEX_STATE_STARTING;
    s->backlog = moex_worker_backlog_create(o->backlog);
    s->outbox = moex_worker_outbox_create(LWS_PRE);
    s->stale = calloc((size_t)o->backlog, sizeof *s->stale);
    worker_rx_init(s);
    if (!s->backlog || !s->outbox || !s->stale) return moex_fail(err, "out of memory");
    return parse_hub_url(s, err);
}

static void session_free(session *s) {
    if (s->backlog) worker_backlog_drop_all(s);
    moex_worker_backlog_free(s->backlog);
    moex_worker_outbox_free(s->outbox);
    worker_rx_free_all(s);
    free(s->stale);
    free(s->assign_list);
    free(s->tx.buf);
    dl_http_free(s->probe);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
}

static struct lws_context *create_context(session *s, moex_error *err) {
    struct lws_context *ctx = worker_lws_client_context(protocols, s, &s->hub, 5, 5, 64, RX_BUFFER_BYTES);
    if (!ctx) moex_fail(err, "cannot create the libwebsockets context");
    return ctx;
}

#define SESSION_REJOIN 1 /* run_session: the hub serves another model (download mode) */

/* store: download mode (m is the store's model), else NULL. stats: the
 * counters and samples so far, carried on. Returns 0, SESSION_REJOIN or -1. */
static int run_session(const moex_worker_options *o, const moex_model *m, moex_worker_store *store,
                       volatile sig_atomic_t *stop, moex_worker_stats *stats, moex_error *err) {
    session *s = calloc(1, sizeof *s);
    moex_worker_options own;
    if (!s) return moex_fail(err, "out of memory");
    int rc = session_init(s, o, m, store, stop, &own, err);
    s->stats = *stats;
    pthread_t th;
    bool started = false;
    if (!rc && !(s->ctx = create_context(s, err))) rc = -1;
    if (!rc && !(rc = moex_worker_compute_start(s, &th, err))) started = true;
    if (!rc && store) rc = dl_loader_start(s, err);
    if (!rc) {
        moex_log(MOEX_LOG_INFO, "worker: model %016llx, %d layers x %d experts, hidden %d; hub %s",
                 (unsigned long long)s->model_hash, m->hp.n_layer, m->hp.n_expert, m->hp.n_embd, o->hub_url);
        connect_hub(s);
        lws_sul_schedule(s->ctx, 0, &s->tick, on_tick, TICK_US);
        while (!s->done && !*stop) {
            if (lws_service(s->ctx, 0) < 0) break;
            if (s->check_hub) check_hub(s); /* outside the callbacks: it runs a client of its own */
        }
        if (s->model_changed) rc = SESSION_REJOIN;
        else if (s->fatal) rc = moex_fail(err, "%s", s->fatal_err.msg);
        else close_gracefully(s);
    }
    dl_loader_stop(s);
    if (started) moex_worker_compute_stop(s, th);
    if (s->ctx) {
        lws_sul_cancel(&s->tick);
        lws_context_destroy(s->ctx);
    }
    *stats = s->stats;
    session_free(s);
    free(s);
    return rc;
}

int moex_worker_run(const moex_worker_options *o, const moex_model *m, volatile sig_atomic_t *stop,
                    moex_worker_stats *stats, moex_error *err) {
    moex_worker_stats *st = calloc(1, sizeof *st);
    if (!st) return moex_fail(err, "out of memory");
    const int rc = run_session(o, m, NULL, stop, st, err);
    if (stats) *stats = *st;
    free(st);
    return rc;
}

int moex_worker_run_store(const moex_worker_options *o, moex_worker_store *st, volatile sig_atomic_t *stop,
                          moex_worker_stats *stats, moex_error *err) {
    moex_worker_stats *acc = calloc(1, sizeof *acc);
    if (!acc) return moex_fail(err, "out of memory");
    int rc;
    while ((rc = run_session(o, moex_worker_store_model(st), st, stop, acc, err)) == SESSION_REJOIN) {
        if (moex_worker_store_reopen(st, o, stop, err)) {
            rc = *stop ? 0 : -1; /* interrupted while asking the hub: a normal stop */
            break;
        }
    }
    if (stats) *stats = *acc;
    free(acc);
    return rc;
}
