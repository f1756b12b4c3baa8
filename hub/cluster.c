/* The hub's worker registry: joining, assignments from the placement,
 * heartbeats, health, eviction. Runs under hub->mu, from the network and
 * ticker threads (and the executor for evictions). */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "hub/dist.h"

#define FRAME_BUF 256

static size_t bitmap_bytes(const moex_hub *hub) { return ((size_t)hub->n_layers * hub->n_experts + 7) / 8; }

void hub_worker_free(hub_worker *w) {
    for (tx_frame *f = w->tx_head, *next; f; f = next) {
        next = f->next;
        free(f);
    }
    free(w->rx);
    free(w->assigned);
    free(w->usable);
    free(w);
}

/* Departed workers stay listed for the metrics; when the table is full the
 * oldest departed one (not an evicted one: its name stays banned) makes room. */
static bool reclaim_departed(moex_hub *hub) {
    for (int i = 0; i < hub->n_workers; i++) {
        hub_worker *w = hub->workers[i];
        if (!w->wsi && !w->evicted) {
            hub_worker_free(w);
            memmove(&hub->workers[i], &hub->workers[i + 1], (size_t)(hub->n_workers - i - 1) * sizeof w);
            hub->n_workers--;
            return true;
        }
    }
    return false;
}

hub_worker *hub_worker_new(moex_hub *hub, struct lws *wsi) {
    if (hub->n_workers == HUB_MAX_WORKERS && !reclaim_departed(hub)) return NULL;
    hub_worker *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->assigned = calloc(1, bitmap_bytes(hub));
    w->usable = calloc(1, bitmap_bytes(hub));
    if (!w->assigned || !w->usable) {
        free(w->assigned);
        free(w->usable);
        free(w);
        return NULL;
    }
    w->wsi = wsi;
    w->last_rx_s = moex_time_s();
    w->lat_ewma_ms = -1;
    hub->workers[hub->n_workers++] = w;
    return w;
}

hub_worker *hub_worker_by_id(moex_hub *hub, uint32_t id) {
    for (int i = 0; i < hub->n_workers; i++)
        if (hub->workers[i]->id == id && hub->workers[i]->joined) return hub->workers[i];
    return NULL;
}

void hub_send(moex_hub *hub, hub_worker *w, const uint8_t *frame, size_t len) {
    if (!w->wsi || w->closing) return;
    tx_frame *f = malloc(sizeof *f + LWS_PRE + len);
    if (!f) return; /* the task times out and is re-dispatched */
    f->next = NULL;
    f->len = len;
    memcpy(f->buf + LWS_PRE, frame, len);
    if (w->tx_tail) w->tx_tail->next = f;
    else w->tx_head = f;
    w->tx_tail = f;
    w->bytes_out += len;
    hub->metrics.bytes_out += len;
}

static void send_error(moex_hub *hub, hub_worker *w, uint32_t seq, int32_t code, const char *text) {
    uint8_t buf[FRAME_BUF + 256];
    size_t n;
    if (!moex_proto_encode_error(seq, code, text, (uint16_t)strlen(text), buf, sizeof buf, &n, NULL))
        hub_send(hub, w, buf, n);
}

/* Live workers that take experts, in a stable order for the placement. */
static int placement_members(moex_hub *hub, moex_worker_spec *specs) {
    int n = 0;
    for (int i = 0; i < hub->n_workers; i++) {
        const hub_worker *w = hub->workers[i];
        if (w->joined && w->wsi && !w->closing && !w->evicted) specs[n++] = (moex_worker_spec){w->id, w->capacity};
    }
    return n;
}

static void send_assign(moex_hub *hub, hub_worker *w, const moex_placement *p) {
    size_t cap_experts = (size_t)hub->n_layers * hub->n_experts;
    moex_expert_ref *held = malloc(cap_experts * sizeof *held);
    moex_proto_expert *list = malloc(cap_experts * sizeof *list);
    size_t bytes = MOEX_PROTO_HEADER_BYTES + MOEX_PROTO_ASSIGN_FIXED_BYTES + 4 * cap_experts;
    uint8_t *frame = malloc(bytes);
    if (!held || !list || !frame) goto done;
    size_t n = moex_placement_held(p, w->id, held, cap_experts);
    memset(w->assigned, 0, bitmap_bytes(hub));
    for (size_t i = 0; i < n; i++) {
        list[i] = (moex_proto_expert){held[i].layer, held[i].expert};
        hub_bit_set(w->assigned, hub_bit_index(hub, held[i].layer, held[i].expert), true);
    }
    /* Until the worker reports READY for this generation it holds old ∩ new. */
    for (size_t i = 0; i < bitmap_bytes(hub); i++) w->usable[i] &= w->assigned[i];
    w->assigned_gen = ++hub->generation;
    moex_proto_assign a = {.model_hash = hub->model_hash, .worker_id = w->id, .n_layers = (uint16_t)hub->n_layers,
                           .n_experts = (uint16_t)hub->n_experts, .replicas = (uint16_t)moex_placement_replicas(p)};
    size_t len;
    moex_error err = {0};
    if (moex_proto_encode_assign(w->assigned_gen, &a, list, (uint32_t)n, frame, bytes, &len, &err) == 0) {
        hub_send(hub, w, frame, len);
        moex_log(MOEX_LOG_INFO, "worker %s: assigned %zu experts (generation %u)", w->name, n, w->assigned_gen);
    } else {
        moex_log(MOEX_LOG_ERROR, "cannot encode ASSIGN: %s", err.msg);
    }
done:
    free(held);
    free(list);
    free(frame);
}

/* Recomputes the placement over the live workers and re-assigns those whose share changed. */
static void rebalance(moex_hub *hub) {
    moex_worker_spec specs[HUB_MAX_WORKERS];
    int n = placement_members(hub, specs);
    moex_placement_free(hub->placement);
    hub->placement = NULL;
    if (n == 0) return;
    int r = hub->cfg.replicas < n ? hub->cfg.replicas : n;
    moex_placement_config pc = {.n_layers = (uint32_t)hub->n_layers, .n_experts = (uint32_t)hub->n_experts,
                                .replicas = (uint32_t)r, .seed = 0x4d6f4578};
    moex_error err = {0};
    hub->placement = moex_placement_build(specs, (uint32_t)n, &pc, &err);
    if (!hub->placement) {
        moex_log(MOEX_LOG_ERROR, "placement failed: %s", err.msg);
        return;
    }
    uint8_t *fresh = malloc(bitmap_bytes(hub));
    moex_expert_ref *held = malloc((size_t)hub->n_layers * hub->n_experts * sizeof *held);
    for (int i = 0; fresh && held && i < hub->n_workers; i++) {
        hub_worker *w = hub->workers[i];
        if (!w->joined || !w->wsi || w->closing || w->evicted) continue;
        size_t k = moex_placement_held(hub->placement, w->id, held, (size_t)hub->n_layers * hub->n_experts);
        memset(fresh, 0, bitmap_bytes(hub));
        for (size_t j = 0; j < k; j++) hub_bit_set(fresh, hub_bit_index(hub, held[j].layer, held[j].expert), true);
        if (w->assigned_gen == 0 || memcmp(fresh, w->assigned, bitmap_bytes(hub)) != 0)
            send_assign(hub, w, hub->placement);
    }
    free(fresh);
    free(held);
}

/* Stable id from the name, so a worker that reconnects gets its experts back. */
static uint32_t id_for_name(moex_hub *hub, const char *name) {
    uint32_t id = XXH32(name, strlen(name), 0) | 1u;
    while (hub_worker_by_id(hub, id)) id++;
    return id;
}

static int handle_join(moex_hub *hub, hub_worker *w, const moex_proto_msg *msg) {
    const moex_proto_join *j = &msg->u.join.info;
    snprintf(w->name, sizeof w->name, "%.*s", (int)j->name_len, j->name);
    for (char *c = w->name; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    if (w->joined) {
        send_error(hub, w, msg->h.seq, 3, "already joined");
        return 0;
    }
    if (j->proto_min > MOEX_PROTO_VERSION || j->proto_max < MOEX_PROTO_VERSION) {
        send_error(hub, w, msg->h.seq, 4, "no common protocol version (hub speaks 1)");
        moex_log(MOEX_LOG_WARN, "worker %s: speaks protocol %u..%u, hub 1: refused", w->name, j->proto_min, j->proto_max);
        return -1;
    }
    if (j->model_hash != hub->model_hash) {
        char text[160];
        snprintf(text, sizeof text, "model mismatch: worker has %016llx, hub serves %016llx; start the worker with the hub's GGUF (--model)",
                 (unsigned long long)j->model_hash, (unsigned long long)hub->model_hash);
        send_error(hub, w, msg->h.seq, 1, text);
        moex_log(MOEX_LOG_WARN, "worker %s: %s", w->name, text);
        w->closing = true;
        return 0;
    }
    for (int i = 0; i < hub->n_workers; i++)
        if (hub->workers[i]->evicted && !strcmp(hub->workers[i]->name, w->name)) {
            send_error(hub, w, msg->h.seq, 5, "this worker was evicted for wrong results");
            moex_log(MOEX_LOG_WARN, "worker %s: refused, evicted earlier for wrong results", w->name);
            w->closing = true;
            return 0;
        }
    w->capacity = j->capacity_centi / 100.0f;
    w->backend = j->backend;
    w->id = id_for_name(hub, w->name);
    w->joined = true;
    moex_log(MOEX_LOG_INFO, "worker %s joined from %s (id %08x, capacity %.2f, backend %u)", w->name, w->peer, w->id,
             w->capacity, j->backend);
    rebalance(hub);
    pthread_cond_broadcast(&hub->cv);
    return 0;
}

static void handle_heartbeat(moex_hub *hub, hub_worker *w, const moex_proto_msg *msg) {
    const moex_proto_heartbeat *hb = &msg->u.heartbeat;
    if (hb->echo_us) {
        double now_us = moex_time_s() * 1e6;
        float rtt = (float)((now_us - (double)hb->echo_us) / 1000.0);
        if (rtt >= 0 && rtt < 60000) w->rtt_ms = rtt;
    }
    if (hb->state == MOEX_STATE_READY && msg->h.seq == w->assigned_gen && w->ready_gen != w->assigned_gen) {
        w->ready_gen = w->assigned_gen;
        memcpy(w->usable, w->assigned, bitmap_bytes(hub));
        moex_log(MOEX_LOG_INFO, "worker %s: ready (generation %u)", w->name, w->ready_gen);
        pthread_cond_broadcast(&hub->cv);
    }
    if (hb->state == MOEX_STATE_READY && w->unhealthy) { /* a good heartbeat restores it */
        w->unhealthy = false;
        w->consecutive_timeouts = 0;
        moex_log(MOEX_LOG_INFO, "worker %s: healthy again", w->name);
    }
}

int hub_handle_frame(moex_hub *hub, hub_worker *w, const uint8_t *frame, size_t len) {
    moex_proto_msg msg;
    moex_error err = {0};
    /* Workers send no compressed frames larger than the limits; scratch for them is the task's result. */
    static _Thread_local uint8_t *scratch;
    static _Thread_local size_t scratch_cap;
    moex_proto_header h = {0};
    if (len >= MOEX_PROTO_HEADER_BYTES) {
        moex_proto_header_read(frame, &h);
        size_t need = moex_proto_header_check(&h, &hub->limits, NULL) == 0 ? moex_proto_scratch_bytes(&h) : 0;
        if (need > scratch_cap) {
            uint8_t *grown = realloc(scratch, need);
            if (grown) {
                scratch = grown;
                scratch_cap = need;
            }
        }
    }
    int rc = moex_proto_decode(frame, len, &hub->limits, scratch, scratch_cap, &msg, &err);
    w->last_rx_s = moex_time_s();
    if (rc) {
        hub->metrics.bad_frames++;
        moex_log(MOEX_LOG_WARN, "worker %s (%s): bad frame (%s): %s; closing", w->name[0] ? w->name : "?", w->peer,
                 moex_proto_strerror(rc), err.msg);
        send_error(hub, w, h.seq, rc, moex_proto_strerror(rc));
        return -1;
    }
    if (!w->joined && msg.h.type != MOEX_MSG_JOIN) {
        hub->metrics.bad_frames++;
        moex_log(MOEX_LOG_WARN, "connection %s: %u frame before JOIN; closing", w->peer, msg.h.type);
        return -1;
    }
    switch (msg.h.type) {
    case MOEX_MSG_JOIN: return handle_join(hub, w, &msg);
    case MOEX_MSG_HEARTBEAT: handle_heartbeat(hub, w, &msg); return 0;
    case MOEX_MSG_RESULT: hub_task_result(hub, w, &msg); return 0;
    case MOEX_MSG_ERROR:
        moex_log(MOEX_LOG_DEBUG, "worker %s: error %d for seq %u: %.*s", w->name, msg.u.error.code, msg.h.seq,
                 (int)msg.u.error.text_len, msg.u.error.text);
        hub_task_error(hub, w, msg.h.seq);
        return 0;
    default:
        hub->metrics.bad_frames++;
        moex_log(MOEX_LOG_WARN, "worker %s: unexpected %u frame; closing", w->name, msg.h.type);
        return -1;
    }
}

void hub_worker_gone(moex_hub *hub, hub_worker *w, const char *why) {
    bool was_member = w->joined && !w->closing && !w->evicted;
    if (w->joined) moex_log(MOEX_LOG_WARN, "worker %s left: %s", w->name, why);
    w->wsi = NULL;
    w->closing = true;
    for (tx_frame *f = w->tx_head, *next; f; f = next) {
        next = f->next;
        free(f);
    }
    w->tx_head = w->tx_tail = NULL;
    memset(w->usable, 0, bitmap_bytes(hub));
    if (!w->joined) { /* never joined: forget it */
        for (int i = 0; i < hub->n_workers; i++)
            if (hub->workers[i] == w) {
                hub->workers[i] = hub->workers[--hub->n_workers];
                break;
            }
        hub_worker_free(w);
        return;
    }
    if ((was_member || w->evicted) && !atomic_load(&hub->stop)) rebalance(hub);
    pthread_cond_broadcast(&hub->cv);
}

void hub_evict(moex_hub *hub, hub_worker *w, const char *why) {
    if (w->evicted) return;
    moex_log(MOEX_LOG_WARN, "worker %s evicted: %s", w->name, why);
    w->evicted = true;
    w->closing = true;
    hub->metrics.evictions++;
    memset(w->usable, 0, bitmap_bytes(hub));
    rebalance(hub);
    hub_wake_net(hub);
}

bool hub_worker_usable(const moex_hub *hub, const hub_worker *w, int layer, int expert) {
    return w && w->wsi && w->joined && !w->closing && !w->evicted && !w->unhealthy &&
           hub_bit_get(w->usable, hub_bit_index(hub, layer, expert));
}

void hub_record_latency(hub_worker *w, float ms) {
    w->last_sample_s = moex_time_s();
    w->lat_ms[w->lat_n % HUB_LAT_SAMPLES] = ms;
    w->lat_n++;
    w->lat_ewma_ms = w->lat_ewma_ms < 0 ? ms : 0.8f * w->lat_ewma_ms + 0.2f * ms;
}

/* Every heartbeat period: send ours, drop workers that went silent. */
void hub_tick(moex_hub *hub, double now) {
    uint8_t buf[FRAME_BUF];
    for (int i = 0; i < hub->n_workers; i++) {
        hub_worker *w = hub->workers[i];
        if (!w->wsi || w->closing) continue;
        if ((now - w->last_rx_s) * 1000.0 > hub->cfg.dead_after_ms) {
            moex_log(MOEX_LOG_WARN, "worker %s silent for %.1f s: removing", w->name[0] ? w->name : w->peer,
                     now - w->last_rx_s);
            w->closing = true;
            if (w->joined) {
                memset(w->usable, 0, bitmap_bytes(hub));
                rebalance(hub);
            }
            pthread_cond_broadcast(&hub->cv);
            continue;
        }
        if (!w->joined) continue;
        /* A worker not picked for a while (it looked slow) drifts back towards its
         * network round trip, so it gets tried again and its estimate stays current. */
        if (w->lat_ewma_ms >= 0 && now - w->last_sample_s > 2.0)
            w->lat_ewma_ms = 0.8f * w->lat_ewma_ms + 0.2f * w->rtt_ms;
        moex_proto_heartbeat hb = {.timestamp_us = (uint64_t)(now * 1e6), .state = MOEX_STATE_READY};
        size_t n;
        if (!moex_proto_encode_heartbeat(0, &hb, buf, sizeof buf, &n, NULL)) hub_send(hub, w, buf, n);
    }
}
