/* The hub's network side: one libwebsockets port, workers on /ws. The
 * network thread owns every wsi; other threads queue frames under hub->mu and
 * wake it with lws_cancel_service(). A ticker thread sends heartbeats and
 * removes silent workers. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "hub/dist.h"

#define RX_CHUNK (64 * 1024)

typedef struct conn_data {
    hub_worker *w;       /* WebSocket connections */
    void *http;          /* HTTP requests: owned by http_weights.c */
} conn_data;

static moex_hub *hub_of(struct lws *wsi) { return lws_context_user(lws_get_context(wsi)); }

static bool token_ok(moex_hub *hub, struct lws *wsi) {
    const char *want = hub->cfg.token;
    if (!want || !*want) return true;
    char buf[512];
    /* returns a pointer into buf just past "token=" */
    const char *v = lws_get_urlarg_by_name(wsi, "token=", buf, sizeof buf);
    if (v && !strcmp(v, want)) return true;
    int n = lws_hdr_copy(wsi, buf, sizeof buf, WSI_TOKEN_HTTP_AUTHORIZATION);
    if (n > 7 && !strncmp(buf, "Bearer ", 7) && !strcmp(buf + 7, want)) return true;
    return false;
}

static void peer_name(struct lws *wsi, char *out, size_t cap) {
    char ip[64] = "?";
    lws_get_peer_simple(wsi, ip, sizeof ip);
    snprintf(out, cap, "%s", ip);
}

/* Reassembles one message; bounded by the frame limit so a peer cannot make us buffer more. */
static int on_receive(moex_hub *hub, hub_worker *w, struct lws *wsi, const void *in, size_t len) {
    if (!lws_frame_is_binary(wsi)) {
        moex_log(MOEX_LOG_WARN, "connection %s (%s): text frame refused; the protocol is binary", w->name[0] ? w->name : "-", w->peer);
        hub->metrics.bad_frames++;
        return -1;
    }
    if (w->rx_len + len > hub->limits.max_frame_bytes) {
        moex_log(MOEX_LOG_WARN, "connection %s (%s): frame over %u bytes refused", w->name[0] ? w->name : "-", w->peer,
                 hub->limits.max_frame_bytes);
        hub->metrics.bad_frames++;
        return -1;
    }
    if (w->rx_len + len > w->rx_cap) {
        size_t cap = w->rx_cap ? w->rx_cap : RX_CHUNK;
        while (cap < w->rx_len + len) cap *= 2;
        uint8_t *grown = realloc(w->rx, cap);
        if (!grown) return -1;
        w->rx = grown;
        w->rx_cap = cap;
    }
    memcpy(w->rx + w->rx_len, in, len);
    w->rx_len += len;
    w->bytes_in += len;
    hub->metrics.bytes_in += len;
    if (!lws_is_final_fragment(wsi) || lws_remaining_packet_payload(wsi)) return 0;
    size_t n = w->rx_len;
    w->rx_len = 0;
    return hub_handle_frame(hub, w, w->rx, n);
}

static int on_writeable(moex_hub *hub, hub_worker *w, struct lws *wsi) {
    if (w->closing) return -1;
    tx_frame *f = w->tx_head;
    if (!f) return 0;
    w->tx_head = f->next;
    if (!w->tx_head) w->tx_tail = NULL;
    int n = lws_write(wsi, f->buf + LWS_PRE, f->len, LWS_WRITE_BINARY);
    free(f);
    if (n < 0) return -1;
    if (w->tx_head) lws_callback_on_writable(wsi);
    return 0;
}

static int callback_moex(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len) {
    moex_hub *hub = hub_of(wsi);
    conn_data *cd = user;
    int rc = 0;
    switch (reason) {
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION: {
        char uri[256] = "", peer[64];
        lws_hdr_copy(wsi, uri, sizeof uri, WSI_TOKEN_GET_URI);
        peer_name(wsi, peer, sizeof peer);
        if (strcmp(uri, "/ws") != 0) {
            moex_log(MOEX_LOG_WARN, "refused %s: path '%s' (workers connect to /ws)", peer, uri);
            pthread_mutex_lock(&hub->mu);
            hub->metrics.refused++;
            pthread_mutex_unlock(&hub->mu);
            return 1;
        }
        if (!token_ok(hub, wsi)) {
            moex_log(MOEX_LOG_WARN, "refused %s: wrong or missing token", peer);
            pthread_mutex_lock(&hub->mu);
            hub->metrics.refused++;
            pthread_mutex_unlock(&hub->mu);
            return 1;
        }
        return 0;
    }
    case LWS_CALLBACK_ESTABLISHED:
        pthread_mutex_lock(&hub->mu);
        cd->w = hub_worker_new(hub, wsi);
        if (cd->w) peer_name(wsi, cd->w->peer, sizeof cd->w->peer);
        pthread_mutex_unlock(&hub->mu);
        if (!cd->w) {
            moex_log(MOEX_LOG_WARN, "refused a connection: %d workers already", HUB_MAX_WORKERS);
            return -1;
        }
        return 0;
    case LWS_CALLBACK_RECEIVE:
        if (!cd->w) return -1;
        pthread_mutex_lock(&hub->mu);
        rc = on_receive(hub, cd->w, wsi, in, len);
        if (rc == 0 && cd->w->tx_head) lws_callback_on_writable(wsi);
        if (cd->w->closing) lws_callback_on_writable(wsi);
        pthread_mutex_unlock(&hub->mu);
        return rc;
    case LWS_CALLBACK_SERVER_WRITEABLE:
        if (!cd->w) return -1;
        pthread_mutex_lock(&hub->mu);
        rc = on_writeable(hub, cd->w, wsi);
        pthread_mutex_unlock(&hub->mu);
        return rc;
    case LWS_CALLBACK_CLOSED:
        if (!cd->w) return 0;
        pthread_mutex_lock(&hub->mu);
        hub_worker_gone(hub, cd->w, "connection closed");
        cd->w = NULL;
        pthread_mutex_unlock(&hub->mu);
        return 0;
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
        /* Another thread queued frames or asked for a close: ask for writable callbacks. */
        pthread_mutex_lock(&hub->mu);
        for (int i = 0; i < hub->n_workers; i++) {
            hub_worker *w = hub->workers[i];
            if (w->wsi && (w->tx_head || w->closing)) lws_callback_on_writable(w->wsi);
        }
        pthread_mutex_unlock(&hub->mu);
        return 0;
    case LWS_CALLBACK_HTTP:
    case LWS_CALLBACK_HTTP_WRITEABLE:
    case LWS_CALLBACK_HTTP_BODY:
    case LWS_CALLBACK_HTTP_BODY_COMPLETION:
    case LWS_CALLBACK_CLOSED_HTTP:
    case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
        return hub_http_callback(hub, wsi, reason, cd ? &cd->http : NULL, in, len);
    default:
        return 0;
    }
}

static const struct lws_protocols protocols[] = {
    {"moex", callback_moex, sizeof(conn_data), RX_CHUNK, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

void hub_wake_net(moex_hub *hub) {
    if (hub->ctx) lws_cancel_service(hub->ctx);
}

static void *net_main(void *arg) {
    moex_hub *hub = arg;
    while (!atomic_load(&hub->stop))
        if (lws_service(hub->ctx, 0) < 0) break;
    return NULL;
}

static void *tick_main(void *arg) {
    moex_hub *hub = arg;
    const struct timespec step = {0, 50 * 1000 * 1000};
    double next = 0;
    while (!atomic_load(&hub->stop)) {
        nanosleep(&step, NULL);
        double now = moex_time_s();
        if (now < next) continue;
        next = now + hub->cfg.heartbeat_ms / 1000.0;
        pthread_mutex_lock(&hub->mu);
        hub_tick(hub, now);
        pthread_mutex_unlock(&hub->mu);
        hub_wake_net(hub);
    }
    return NULL;
}

void moex_hub_config_default(moex_hub_config *cfg) {
    *cfg = (moex_hub_config){.host = "127.0.0.1", .port = 8765, .replicas = 2, .hedge = 1, .timeout_ms = 500,
                             .local_fallback = true, .wire_dtype = MOEX_DT_F16, .heartbeat_ms = 1000,
                             .dead_after_ms = 3000, .seed = 1, .max_batch = 512};
}

/* The model's identity: header, metadata and tensor table (not the weights). */
static uint64_t model_identity(const moex_gguf *g) { return XXH3_64bits(g->base, g->data_offset); }

static void lws_log_to_moex(int level, const char *line) {
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
    moex_log(level == LLL_ERR ? MOEX_LOG_WARN : MOEX_LOG_DEBUG, "lws: %.*s", (int)n, line);
}

moex_hub *moex_hub_start(const moex_model *m, moex_pool *pool, const moex_hub_config *cfg, moex_error *err) {
    if (!moex_hparams_is_moe(&m->hp)) {
        moex_fail(err, "%s is a dense model: nothing to distribute (use --local)", m->hp.arch_name);
        return NULL;
    }
    moex_hub *hub = calloc(1, sizeof *hub);
    if (!hub) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    hub->m = m;
    hub->pool = pool;
    hub->cfg = *cfg;
    hub->n_layers = m->hp.n_layer;
    hub->n_experts = m->hp.n_expert;
    hub->model_hash = model_identity(m->gguf);
    hub->next_seq = 1;
    hub->rng = cfg->seed * 0x9E3779B97F4A7C15ull + 1;
    hub->limits = moex_proto_default_limits();
    hub->limits.max_hidden = (uint32_t)m->hp.n_embd;
    hub->limits.max_layers = (uint32_t)m->hp.n_layer;
    hub->limits.max_experts = (uint32_t)m->hp.n_expert;
    hub->limits.max_tokens = (uint32_t)cfg->max_batch;
    /* the largest RESULT a worker may send us: f32 rows for a full batch */
    uint64_t max_frame = (uint64_t)cfg->max_batch * (uint64_t)m->hp.n_embd * 4 + 64 * 1024;
    hub->limits.max_frame_bytes = (uint32_t)(max_frame < (1u << 20) ? (1u << 20) : max_frame);
    pthread_mutex_init(&hub->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&hub->cv, &ca);
    pthread_condattr_destroy(&ca);

    lws_set_log_level(LLL_ERR | LLL_WARN, lws_log_to_moex);
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    info.port = cfg->port;
    info.iface = cfg->host;
    info.protocols = protocols;
    info.user = hub;
    info.options = LWS_SERVER_OPTION_VALIDATE_UTF8;
    info.pt_serv_buf_size = 64 * 1024;
    hub->ctx = lws_create_context(&info);
    if (!hub->ctx) {
        moex_fail(err, "cannot listen on %s:%d (port in use? try another --port)", cfg->host, cfg->port);
        moex_hub_stop(hub);
        return NULL;
    }
    struct lws_vhost *vh = lws_get_vhost_by_name(hub->ctx, "default");
    hub->port = vh ? lws_get_vhost_listen_port(vh) : cfg->port;
    if (pthread_create(&hub->net_thread, NULL, net_main, hub)) {
        moex_fail(err, "cannot start the network thread");
        lws_context_destroy(hub->ctx);
        hub->ctx = NULL;
        moex_hub_stop(hub);
        return NULL;
    }
    if (pthread_create(&hub->tick_thread, NULL, tick_main, hub)) {
        moex_fail(err, "cannot start the heartbeat thread");
        moex_hub_stop(hub);
        return NULL;
    }
    moex_log(MOEX_LOG_INFO, "hub listening on ws://%s:%d/ws (model %016llx, r=%d, hedge %s%d, timeout %d ms)",
             cfg->host, hub->port, (unsigned long long)hub->model_hash, cfg->replicas, cfg->hedge ? "" : "auto, max ",
             cfg->hedge ? cfg->hedge : cfg->replicas, cfg->timeout_ms);
    return hub;
}

int moex_hub_port(const moex_hub *hub) { return hub->port; }

static bool worker_ready(const hub_worker *w) {
    return w->joined && w->wsi && !w->closing && w->ready_gen == w->assigned_gen && w->assigned_gen != 0;
}

int moex_hub_wait_ready(moex_hub *hub, int n, double timeout_s, moex_error *err) {
    double deadline = moex_time_s() + timeout_s;
    pthread_mutex_lock(&hub->mu);
    for (;;) {
        int ready = 0, joined = 0;
        for (int i = 0; i < hub->n_workers; i++) {
            const hub_worker *w = hub->workers[i];
            joined += w->joined && w->wsi && !w->closing && !w->evicted;
            ready += worker_ready(w);
        }
        /* every joined worker must be ready: a new join changes everyone's assignment */
        if (ready >= n && ready == joined) break;
        double now = moex_time_s();
        if (now >= deadline || atomic_load(&hub->stop)) {
            pthread_mutex_unlock(&hub->mu);
            return moex_fail(err, "%d of %d workers ready after %.0f s (joined %d); start more with moex-worker --hub ws://%s:%d/ws",
                             ready, n, timeout_s, joined, hub->cfg.host, hub->port);
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&hub->cv, &hub->mu, &ts);
    }
    pthread_mutex_unlock(&hub->mu);
    return 0;
}

static void print_percentiles(FILE *f, const hub_worker *w) {
    uint32_t n = w->lat_n < HUB_LAT_SAMPLES ? w->lat_n : HUB_LAT_SAMPLES;
    if (!n) {
        fprintf(f, "   -        -        -     ");
        return;
    }
    float s[HUB_LAT_SAMPLES];
    memcpy(s, w->lat_ms, n * sizeof *s);
    /* insertion sort: at most 1024 samples, once at exit */
    for (uint32_t i = 1; i < n; i++) {
        float v = s[i];
        uint32_t j = i;
        for (; j > 0 && s[j - 1] > v; j--) s[j] = s[j - 1];
        s[j] = v;
    }
    fprintf(f, "%7.2f  %7.2f  %7.2f ", s[n / 2], s[(n * 95) / 100 < n ? (n * 95) / 100 : n - 1],
            s[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1]);
}

void moex_hub_metrics_print(moex_hub *hub, FILE *f) {
    pthread_mutex_lock(&hub->mu);
    const hub_metrics *mt = &hub->metrics;
    fprintf(f, "hub metrics: dispatches %llu | hedges sent %llu won %llu | cancels %llu | timeouts %llu | "
               "re-dispatches %llu | fallbacks %llu | verified %llu (mismatches %llu) | evictions %llu | "
               "refused %llu | bad frames %llu | bytes in %llu out %llu\n",
            (unsigned long long)mt->dispatches, (unsigned long long)mt->hedges_sent, (unsigned long long)mt->hedges_won,
            (unsigned long long)mt->cancels, (unsigned long long)mt->timeouts, (unsigned long long)mt->redispatches,
            (unsigned long long)mt->fallbacks, (unsigned long long)mt->verified,
            (unsigned long long)mt->verify_mismatches, (unsigned long long)mt->evictions,
            (unsigned long long)mt->refused, (unsigned long long)mt->bad_frames, (unsigned long long)mt->bytes_in,
            (unsigned long long)mt->bytes_out);
    fprintf(f, "  worker                      p50 ms   p95 ms   p99 ms  dispatched  won  timeouts  state\n");
    for (int i = 0; i < hub->n_workers; i++) {
        const hub_worker *w = hub->workers[i];
        fprintf(f, "  %-24.24s ", w->name[0] ? w->name : w->peer);
        print_percentiles(f, w);
        fprintf(f, " %10llu %5llu %8llu  %s\n", (unsigned long long)w->n_dispatched, (unsigned long long)w->n_won,
                (unsigned long long)w->n_timeouts,
                w->evicted ? "evicted" : !w->wsi ? "gone" : w->unhealthy ? "unhealthy" : w->joined ? "ready" : "joining");
    }
    pthread_mutex_unlock(&hub->mu);
}

void moex_hub_stop(moex_hub *hub) {
    if (!hub) return;
    atomic_store(&hub->stop, true);
    if (hub->ctx) {
        lws_cancel_service(hub->ctx);
        if (hub->net_thread) pthread_join(hub->net_thread, NULL);
        if (hub->tick_thread) pthread_join(hub->tick_thread, NULL);
        lws_context_destroy(hub->ctx); /* closes connections: CLOSED callbacks free nothing we still need */
    }
    for (int i = 0; i < hub->n_workers; i++) hub_worker_free(hub->workers[i]);
    for (int i = 0; i < hub->cap_tasks; i++) {
        free(hub->tasks[i].rows);
        free(hub->tasks[i].gates);
        free(hub->tasks[i].result);
        free(hub->tasks[i].frame);
        free(hub->tasks[i].dup);
    }
    free(hub->tasks);
    free(hub->x_wire);
    free(hub->gather);
    free(hub->check);
    free(hub->tmp);
    free(hub->slot_of_pair);
    moex_placement_free(hub->placement);
    pthread_mutex_destroy(&hub->mu);
    pthread_cond_destroy(&hub->cv);
    free(hub);
}
