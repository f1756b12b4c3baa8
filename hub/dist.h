/* Private to the hub module: the state shared by the network thread
 * (server.c), the worker registry (cluster.c) and the remote executor
 * (executor_remote.c). Everything below `mu` is guarded by it. */
#ifndef MOEX_HUB_DIST_H
#define MOEX_HUB_DIST_H

#include <pthread.h>
#include <stdatomic.h>

#include <libwebsockets.h>

#include "hub/hub.h"
#include "placement/placement.h"
#include "proto/proto.h"

#define HUB_MAX_WORKERS 256
#define HUB_LAT_SAMPLES 1024
#define HUB_MAX_SENDS 8          /* replicas one task may be sent to, re-dispatches included */

/* A frame waiting in a connection's send queue (LWS_PRE bytes of headroom first). */
typedef struct tx_frame {
    struct tx_frame *next;
    size_t len;
    uint8_t buf[];
} tx_frame;

typedef struct hub_worker {
    uint32_t id;                 /* placement key; from the name, so a reconnecting worker gets its experts back */
    struct lws *wsi;             /* NULL once the connection is gone */
    char name[64];
    char peer[64];               /* address, for logs */
    bool joined, closing, evicted;
    float capacity;
    uint8_t backend;             /* moex_proto_backend from JOIN */
    uint32_t assigned_gen;       /* generation of the last ASSIGN sent */
    uint32_t ready_gen;          /* generation the worker reported READY for */
    uint8_t *assigned;           /* bitmap [layer][expert]: current assignment */
    uint8_t *usable;             /* bitmap: experts it holds now (loaded and still assigned) */
    double last_rx_s;
    int consecutive_timeouts;
    bool unhealthy;
    float lat_ms[HUB_LAT_SAMPLES];  /* dispatch round trips (winners), ring */
    uint32_t lat_n;
    float lat_ewma_ms;           /* < 0: unknown */
    double last_sample_s;        /* when lat_ewma_ms last learned something */
    float rtt_ms;                /* from heartbeats */
    int inflight;                /* dispatches of the current layer sent to it (executor only) */
    uint8_t *rx;                 /* message being reassembled */
    size_t rx_len, rx_cap;
    tx_frame *tx_head, *tx_tail;
    uint64_t bytes_in, bytes_out, n_dispatched, n_won, n_timeouts;
} hub_worker;

/* One expert's work in the layer being computed. */
typedef struct hub_task {
    uint32_t seq;
    int expert;
    int64_t n_tokens, cap_tokens;
    size_t cap_frame;
    int32_t *rows;               /* token indices into the request */
    float *gates;                /* f16-rounded gate weights */
    float *result;               /* n_tokens x n_embd, filled by the winner */
    uint8_t *frame;              /* the encoded DISPATCH (LWS_PRE headroom before it) */
    size_t frame_len;
    uint32_t sent_to[HUB_MAX_SENDS];
    double sent_at[HUB_MAX_SENDS];
    bool send_failed[HUB_MAX_SENDS];
    int n_sent;
    double deadline_s, hedge_at_s;   /* timeout, and (auto) when to add a replica */
    bool done, local, failed_all;
    uint32_t winner;
    float *dup;                  /* a hedged duplicate to compare (verify) */
    uint32_t dup_from;
    bool dup_pending;
    bool verify;                 /* recompute on the hub after the layer */
    bool dup_seen;               /* dup_pending as of the layer's end */
} hub_task;

typedef struct hub_metrics {
    uint64_t dispatches, hedges_sent, hedges_won, cancels, timeouts, redispatches, fallbacks,
        verified, verify_mismatches, evictions, bytes_in, bytes_out, refused, bad_frames;
} hub_metrics;

struct moex_hub {
    const moex_model *m;
    moex_pool *pool;
    moex_hub_config cfg;
    uint64_t model_hash;
    moex_proto_limits limits;
    int n_layers, n_experts;

    struct lws_context *ctx;
    pthread_t net_thread, tick_thread;
    atomic_bool stop;
    int port;

    pthread_mutex_t mu;
    pthread_cond_t cv;           /* results, joins, readiness, closes */
    hub_worker *workers[HUB_MAX_WORKERS];
    int n_workers;
    moex_placement *placement;
    uint32_t generation;
    uint32_t next_seq;
    hub_metrics metrics;

    /* the layer in flight (executor_remote.c) */
    hub_task *tasks;
    int n_tasks, cap_tasks;
    uint32_t task_seq0;
    int task_layer;

    /* executor scratch (main thread only) */
    int64_t cap_pairs;
    float *x_wire, *gather, *check;
    uint8_t *tmp;
    int32_t *slot_of_pair;
    uint64_t rng;
};

/* cluster.c */
hub_worker *hub_worker_new(moex_hub *hub, struct lws *wsi);
void hub_worker_gone(moex_hub *hub, hub_worker *w, const char *why);
void hub_worker_free(hub_worker *w);
hub_worker *hub_worker_by_id(moex_hub *hub, uint32_t id);
int hub_handle_frame(moex_hub *hub, hub_worker *w, const uint8_t *frame, size_t len);
void hub_send(moex_hub *hub, hub_worker *w, const uint8_t *frame, size_t len);
void hub_tick(moex_hub *hub, double now);
bool hub_worker_usable(const moex_hub *hub, const hub_worker *w, int layer, int expert);
void hub_evict(moex_hub *hub, hub_worker *w, const char *why);
void hub_record_latency(hub_worker *w, float ms);

/* executor_remote.c: a RESULT or ERROR for a task arrived (under mu). */
void hub_task_result(moex_hub *hub, hub_worker *w, const moex_proto_msg *msg);
void hub_task_error(moex_hub *hub, hub_worker *w, uint32_t seq);
/* http_weights.c: plain HTTP on the hub's port (expert weights for workers
 * without their own copy of the model). *state is per-request, owned there. */
int hub_http_callback(moex_hub *hub, struct lws *wsi, enum lws_callback_reasons reason, void **state, void *in,
                      size_t len);
/* server.c: wakes the network thread to flush send queues. */
void hub_wake_net(moex_hub *hub);

static inline size_t hub_bit_index(const moex_hub *hub, int layer, int expert) {
    return (size_t)layer * (size_t)hub->n_experts + (size_t)expert;
}
static inline bool hub_bit_get(const uint8_t *bits, size_t i) { return bits[i >> 3] >> (i & 7) & 1; }
static inline void hub_bit_set(uint8_t *bits, size_t i, bool v) {
    if (v) bits[i >> 3] |= (uint8_t)(1u << (i & 7));
    else bits[i >> 3] &= (uint8_t)~(1u << (i & 7));
}

#endif
