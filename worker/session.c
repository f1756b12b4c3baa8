/* The worker's session with the hub, over a libwebsockets client: connect
 * (with backoff), JOIN, ASSIGN, heartbeats, DISPATCH into the backlog,
 * CANCEL, and the outbox drained one frame per WRITEABLE. Runs on the
 * calling thread; the compute thread (compute.c) does the work.
 *
 * Timers: one 100 ms tick drives reconnects, heartbeats, the hub-silence
 * check and the stop flag, so that the service loop needs nothing else. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "worker/download_loader.h"
#include "worker/session_internal.h"

#define TICK_US (100 * LWS_US_PER_MS)
#define HEARTBEAT_S 1.0
#define HUB_SILENCE_S 5.0
#define BACKOFF_MIN_S 0.2
#define BACKOFF_MAX_S 5.0
#define FATAL_FLUSH_S 1.0      /* how long a fatal ERROR may take to leave */
#define CLOSE_WAIT_S 1.0       /* how long a clean close may take on exit */
#define RX_BUFFER_BYTES 65536

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void request_write(session *s) {
    if (s->wsi && s->link == LINK_UP) lws_callback_on_writable(s->wsi);
}

/* Queues a control frame from s->ctl for the current connection. */
static void send_ctl(session *s, size_t len) {
    pthread_mutex_lock(&s->mu);
    int rc = moex_worker_outbox_push_copy(s->outbox, s->conn, s->ctl, len);
    pthread_mutex_unlock(&s->mu);
    if (rc) moex_log(MOEX_LOG_ERROR, "worker: out of memory queueing a frame");
    request_write(s);
}

static void send_error(session *s, uint32_t seq, int32_t code, const char *text) {
    size_t n = strlen(text), len;
    if (n > sizeof s->ctl - MOEX_PROTO_HEADER_BYTES - MOEX_PROTO_ERROR_FIXED_BYTES)
        n = sizeof s->ctl - MOEX_PROTO_HEADER_BYTES - MOEX_PROTO_ERROR_FIXED_BYTES;
    if (moex_proto_encode_error(seq, code, text, (uint16_t)n, s->ctl, sizeof s->ctl, &len, NULL)) return;
    pthread_mutex_lock(&s->mu);
    s->stats.errors++;
    pthread_mutex_unlock(&s->mu);
    send_ctl(s, len);
}

static void send_join(session *s) {
    const moex_worker_options *o = s->o;
    moex_proto_join j = {
        .proto_min = MOEX_PROTO_VERSION, .proto_max = MOEX_PROTO_VERSION, .backend = (uint8_t)o->backend,
        .capacity_centi = (uint16_t)lround(o->capacity * 100.0), .memory_budget = o->memory_budget,
        .model_hash = s->model_hash, .name = s->name, .name_len = (uint8_t)strlen(s->name),
    };
    if (j.capacity_centi < 1) j.capacity_centi = 1;
    size_t len;
    moex_error err;
    if (moex_proto_encode_join(0, &j, NULL, 0, s->ctl, sizeof s->ctl, &len, &err)) {
        moex_log(MOEX_LOG_ERROR, "worker: cannot encode JOIN: %s", err.msg);
        return;
    }
    send_ctl(s, len);
}

static void send_heartbeat(session *s) {
    const double now = moex_time_s();
    pthread_mutex_lock(&s->mu);
    const double span = now - s->last_hb_s;
    double load = span > 0 ? s->busy_s / span : 0;
    moex_proto_heartbeat hb = {
        .timestamp_us = now_us(), .echo_us = s->peer_ts_us,
        .queue_depth = (uint32_t)moex_worker_backlog_depth(s->backlog) +
                       (s->running ? (s->batch_n > 1 ? (uint32_t)s->batch_n : 1u) : 0u),
        .load_permille = (uint16_t)lround(1000.0 * (load > 1 ? 1 : load)), .state = s->state,
    };
    const uint32_t g = s->g;
    s->busy_s = 0;
    s->hb_now = false;
    pthread_mutex_unlock(&s->mu);
    s->last_hb_s = now;
    s->next_hb_s = now + HEARTBEAT_S;
    size_t len;
    if (moex_proto_encode_heartbeat(g, &hb, s->ctl, sizeof s->ctl, &len, NULL) == 0) send_ctl(s, len);
}

/* ---- connecting ---- */

static void go_fatal(session *s, const char *why) {
    moex_fail(&s->fatal_err, "%s", why);
    s->fatal = true;
    s->fatal_since_s = moex_time_s();
    request_write(s);
    if (s->link != LINK_UP) s->done = true;
}

/* Download mode: a download that failed for good ends the worker. */
static void check_loader(session *s) {
    moex_error err;
    if (!s->fatal && dl_loader_failed(s, &err)) go_fatal(s, err.msg);
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
        snprintf(why, sizeof why, "no connection to the hub %s for %.1f s (last: %s); giving up", s->o->hub_url,
                 now - s->down_since_s, reason);
        go_fatal(s, why); /* link is down: the service loop ends */
        return;
    }
    /* "equal jitter": half fixed, half random, so workers that lost the
     * same hub do not all come back in the same instant. */
    const double delay = s->backoff_s * (0.5 + 0.5 * moex_worker_rand01(&s->jitter_rng));
    s->backoff_s = fmin(2 * s->backoff_s, BACKOFF_MAX_S);
    s->next_attempt_s = now + delay;
    moex_log(MOEX_LOG_INFO, "worker: hub %s: %s; retrying in %.1f s", s->o->hub_url, reason, delay);
}

static void connect_hub(session *s) {
    if (s->down_since_s == 0) s->down_since_s = moex_time_s();
    struct lws_client_connect_info ci;
    worker_lws_connect_info(&ci, s->ctx, &s->hub);
    ci.path = s->path;
    ci.protocol = "moex";
    ci.pwsi = &s->wsi;
    s->link = LINK_CONNECTING;
    if (!lws_client_connect_via_info(&ci) && s->link == LINK_CONNECTING) schedule_reconnect(s, "cannot start a connection");
}

/* The connection is gone: everything queued for it is void (its sequence
 * ids mean nothing on the next connection). */
static void connection_lost(session *s, const char *reason) {
    moex_log(MOEX_LOG_INFO, "worker: disconnected from the hub (%s)", reason);
    pthread_mutex_lock(&s->mu);
    s->conn++;
    moex_worker_backlog_clear(s->backlog);
    moex_worker_outbox_clear(s->outbox);
    s->assign_pending = false;
    s->stats.disconnects++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    s->down_since_s = moex_time_s();
    s->rx_len = 0;
    s->close_requested = false;
    if (s->fatal) s->done = true;
    schedule_reconnect(s, reason);
}

static void connection_up(session *s) {
    const double now = moex_time_s();
    s->link = LINK_UP;
    s->backoff_s = BACKOFF_MIN_S;
    s->last_rx_s = now;
    s->last_hb_s = now;
    s->next_hb_s = now + HEARTBEAT_S;
    s->rx_len = 0;
    s->close_requested = false;
    pthread_mutex_lock(&s->mu);
    s->conn++;
    s->g = 0;
    s->state = MOEX_STATE_STARTING;
    s->busy_s = 0;
    s->stats.connects++;
    pthread_mutex_unlock(&s->mu);
    moex_log(MOEX_LOG_INFO, "worker: connected to the hub %s as '%s'", s->o->hub_url, s->name);
    send_join(s);
}

/* ---- receiving ---- */

static void on_assign(session *s, const moex_proto_msg *msg) {
    const moex_proto_assign *a = &msg->u.assign.info;
    const moex_hparams *hp = &s->m->hp;
    if (a->model_hash != s->model_hash || a->n_layers != hp->n_layer || a->n_experts != hp->n_expert) {
        char why[400];
        snprintf(why, sizeof why,
                 "model mismatch: the hub serves model %016llx (%u layers x %u experts), this worker has %016llx "
                 "(%d x %d) from %s%s",
                 (unsigned long long)a->model_hash, a->n_layers, a->n_experts, (unsigned long long)s->model_hash,
                 hp->n_layer, hp->n_expert, s->store ? "the hub at " : "",
                 s->store ? moex_worker_store_source(s->store) : s->o->model_path);
        send_error(s, msg->h.seq, MOEX_WORKER_ERR_MODEL_MISMATCH, why);
        go_fatal(s, why);
        return;
    }
    const uint32_t n = msg->u.assign.experts.count;
    moex_log(MOEX_LOG_INFO, "worker: assignment %u from the hub: worker id %u, %u experts, %u replicas", msg->h.seq,
             a->worker_id, n, a->replicas);
    pthread_mutex_lock(&s->mu);
    if (n > s->assign_cap) {
        moex_proto_expert *p = realloc(s->assign_list, n * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&s->mu);
            moex_log(MOEX_LOG_ERROR, "worker: out of memory for an assignment of %u experts", n);
            return;
        }
        s->assign_list = p;
        s->assign_cap = n;
    }
    for (uint32_t i = 0; i < n; i++) s->assign_list[i] = moex_proto_expert_at(&msg->u.assign.experts, i);
    s->assign_n = n;
    s->assign_g = msg->h.seq;
    if (s->loader) dl_loader_post(s); /* downloads first; the loader hands it on */
    else s->assign_pending = true;
    s->state = MOEX_STATE_LOADING;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void on_dispatch(session *s, const moex_proto_msg *msg, const uint8_t *frame, size_t len) {
    const long exit_after = s->o->inject_exit_after;
    if (exit_after > 0 && ++s->n_dispatch_rx >= (uint64_t)exit_after) {
        moex_log(MOEX_LOG_WARN, "worker: inject: exiting abruptly on dispatch %ld", exit_after);
        _exit(3);
    }
    int n_stale = 0;
    pthread_mutex_lock(&s->mu);
    s->stats.dispatches++;
    const int rc = moex_worker_backlog_push(s->backlog, msg->h.seq, msg->h.layer, msg->h.expert, frame, len, s->stale,
                                            &n_stale);
    if (rc == 0) pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    char text[96];
    for (int i = 0; i < n_stale; i++) {
        snprintf(text, sizeof text, "preempted by a dispatch for layer %u", msg->h.layer);
        send_error(s, s->stale[i], MOEX_WORKER_ERR_PREEMPTED, text);
    }
    if (rc == 1) send_error(s, msg->h.seq, MOEX_WORKER_ERR_BUSY, "busy: backlog full");
    if (rc < 0) send_error(s, msg->h.seq, MOEX_WORKER_ERR_BUSY, "busy: out of memory");
}

static void on_cancel(session *s, uint32_t seq) {
    pthread_mutex_lock(&s->mu);
    s->stats.cancels++;
    if (moex_worker_backlog_cancel(s->backlog, seq)) {
        s->stats.cancelled++;
    } else if (s->running && s->running_seq == seq) {
        s->running_cancelled = true; /* counted when its result is discarded */
        pthread_cond_broadcast(&s->cv);
    } else if (s->running) {
        for (int i = 1; i < s->batch_n; i++)
            if (s->batch_seqs[i] == seq) s->batch_cancelled[i] = true;
    }
    pthread_mutex_unlock(&s->mu);
}

static void on_frame(session *s, const uint8_t *frame, size_t len) {
    moex_error err = {{0}};
    moex_proto_msg msg;
    size_t frame_bytes;
    int rc = moex_proto_frame_size(frame, len, &s->lim, &frame_bytes, &err);
    if (!rc) {
        moex_proto_header h;
        moex_proto_header_read(frame, &h);
        const size_t need = moex_proto_scratch_bytes(&h);
        if (need > s->scratch_cap) {
            uint8_t *p = realloc(s->scratch, need);
            if (p) s->scratch = p, s->scratch_cap = need;
        }
        rc = moex_proto_decode(frame, len, &s->lim, s->scratch, s->scratch_cap, &msg, &err);
    }
    if (rc) {
        moex_proto_header h = {0};
        if (len >= MOEX_PROTO_HEADER_BYTES) moex_proto_header_read(frame, &h);
        moex_log(MOEX_LOG_WARN, "worker: bad frame from the hub (seq %u): %s", h.seq, err.msg);
        send_error(s, h.seq, rc, err.msg);
        return;
    }
    switch (msg.h.type) {
    case MOEX_MSG_DISPATCH: on_dispatch(s, &msg, frame, len); break;
    case MOEX_MSG_CANCEL: on_cancel(s, msg.h.seq); break;
    case MOEX_MSG_HEARTBEAT: s->peer_ts_us = msg.u.heartbeat.timestamp_us; break;
    case MOEX_MSG_ASSIGN: on_assign(s, &msg); break;
    case MOEX_MSG_ERROR:
        moex_log(MOEX_LOG_WARN, "worker: the hub reports error %d for seq %u: %.*s", msg.u.error.code, msg.h.seq,
                 (int)msg.u.error.text_len, msg.u.error.text);
        break;
    default: moex_log(MOEX_LOG_WARN, "worker: ignoring a %u message from the hub", msg.h.type); break;
    }
}

/* Reassembles a WebSocket message from its fragments. -1: close the connection. */
static int on_receive(session *s, struct lws *wsi, const void *in, size_t len) {
    s->last_rx_s = moex_time_s();
    if (s->rx_len + len > s->lim.max_frame_bytes) {
        moex_log(MOEX_LOG_ERROR, "worker: message from the hub exceeds %u bytes; closing", s->lim.max_frame_bytes);
        return -1;
    }
    if (s->rx_len + len > s->rx_cap) {
        size_t cap = s->rx_cap ? s->rx_cap : RX_BUFFER_BYTES;
        while (cap < s->rx_len + len) cap *= 2;
        uint8_t *p = realloc(s->rx, cap);
        if (!p) return -1;
        s->rx = p;
        s->rx_cap = cap;
    }
    memcpy(s->rx + s->rx_len, in, len);
    s->rx_len += len;
    if (!lws_is_final_fragment(wsi) || lws_remaining_packet_payload(wsi) != 0) return 0;
    const size_t n = s->rx_len;
    s->rx_len = 0;
    if (!lws_frame_is_binary(wsi)) {
        moex_log(MOEX_LOG_WARN, "worker: ignoring a text message from the hub");
        return 0;
    }
    on_frame(s, s->rx, n);
    return 0;
}

/* ---- sending ---- */

/* Writes the oldest frame of the current connection. -1: close. */
static int on_writeable(session *s, struct lws *wsi) {
    if (s->close_requested) {
        lws_close_reason(wsi, LWS_CLOSE_STATUS_GOINGAWAY, NULL, 0);
        return -1;
    }
    pthread_mutex_lock(&s->mu);
    const moex_worker_buf *b;
    while ((b = moex_worker_outbox_peek(s->outbox)) && b->conn != s->conn) moex_worker_outbox_pop(s->outbox);
    int rc = 0;
    if (b) {
        uint8_t *frame = b->buf + moex_worker_outbox_headroom(s->outbox);
        if (lws_write(wsi, frame, b->len, LWS_WRITE_BINARY) < (int)b->len) rc = -1;
        moex_worker_outbox_pop(s->outbox);
    }
    const int left = moex_worker_outbox_count(s->outbox);
    pthread_mutex_unlock(&s->mu);
    if (rc) {
        moex_log(MOEX_LOG_WARN, "worker: write to the hub failed");
        return -1;
    }
    if (left) {
        lws_callback_on_writable(wsi);
    } else if (s->fatal) { /* the fatal ERROR has left */
        lws_close_reason(wsi, LWS_CLOSE_STATUS_GOINGAWAY, NULL, 0);
        return -1;
    }
    return 0;
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len) {
    session *s = lws_context_user(lws_get_context(wsi));
    switch (reason) {
    case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER: {
        unsigned char **p = (unsigned char **)in, *end = (*p) + len;
        if (lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_AUTHORIZATION, (const unsigned char *)s->hub.auth,
                                         (int)strlen(s->hub.auth), p, end))
            return -1;
        break;
    }
    case LWS_CALLBACK_CLIENT_ESTABLISHED:
        s->wsi = wsi;
        connection_up(s);
        break;
    case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
        if (s->wsi == wsi || s->link == LINK_CONNECTING) {
            char why[200];
            snprintf(why, sizeof why, "connection failed: %.*s", in ? (int)len : 7, in ? (const char *)in : "unknown");
            if (s->link == LINK_UP) connection_lost(s, why);
            else schedule_reconnect(s, why);
        }
        break;
    case LWS_CALLBACK_CLIENT_CLOSED:
        if (s->link == LINK_UP) connection_lost(s, "connection closed");
        break;
    case LWS_CALLBACK_CLIENT_RECEIVE:
        if (s->link == LINK_UP) return on_receive(s, wsi, in, len);
        break;
    case LWS_CALLBACK_CLIENT_WRITEABLE:
        if (s->link == LINK_UP) return on_writeable(s, wsi);
        break;
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED: {
        check_loader(s);
        pthread_mutex_lock(&s->mu);
        const bool hb = s->hb_now, pending = moex_worker_outbox_count(s->outbox) > 0;
        pthread_mutex_unlock(&s->mu);
        if (s->link == LINK_UP && hb) send_heartbeat(s);
        else if (pending) request_write(s);
        break;
    }
    default: break;
    }
    return 0;
}

static const struct lws_protocols protocols[] = {
    {"moex", callback, 0, RX_BUFFER_BYTES, 0, NULL, 0},
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
    if (worker_hub_addr_parse(&s->hub, o->hub_url, o->token, err)) return -1;
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
    if (!s->backlog || !s->outbox || !s->stale) return moex_fail(err, "out of memory");
    return parse_hub_url(s, err);
}

static void session_free(session *s) {
    moex_worker_backlog_free(s->backlog);
    moex_worker_outbox_free(s->outbox);
    free(s->stale);
    free(s->assign_list);
    free(s->rx);
    free(s->scratch);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
}

static struct lws_context *create_context(session *s, moex_error *err) {
    struct lws_context *ctx = worker_lws_client_context(protocols, s, s->hub.tls, 5, 5, 64, 0);
    if (!ctx) moex_fail(err, "cannot create the libwebsockets context");
    return ctx;
}

/* store: download mode (m is the store's model), else NULL. */
static int run_session(const moex_worker_options *o, const moex_model *m, moex_worker_store *store,
                       volatile sig_atomic_t *stop, moex_worker_stats *stats, moex_error *err) {
    session *s = calloc(1, sizeof *s);
    moex_worker_options own;
    if (!s) return moex_fail(err, "out of memory");
    int rc = session_init(s, o, m, store, stop, &own, err);
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
        while (!s->done && !*stop)
            if (lws_service(s->ctx, 0) < 0) break;
        if (s->fatal) rc = moex_fail(err, "%s", s->fatal_err.msg);
        else close_gracefully(s);
    }
    dl_loader_stop(s);
    if (started) moex_worker_compute_stop(s, th);
    if (s->ctx) {
        lws_sul_cancel(&s->tick);
        lws_context_destroy(s->ctx);
    }
    if (stats) *stats = s->stats;
    session_free(s);
    free(s);
    return rc;
}

int moex_worker_run(const moex_worker_options *o, const moex_model *m, volatile sig_atomic_t *stop,
                    moex_worker_stats *stats, moex_error *err) {
    return run_session(o, m, NULL, stop, stats, err);
}

int moex_worker_run_store(const moex_worker_options *o, moex_worker_store *st, volatile sig_atomic_t *stop,
                          moex_worker_stats *stats, moex_error *err) {
    return run_session(o, moex_worker_store_model(st), st, stop, stats, err);
}
