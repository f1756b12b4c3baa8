/* Private to the hub: the worker registry. Who is connected, who joined with
 * which capacity, the placement of experts over them, their assignments and
 * readiness, their health, latency record and bans. It has its own lock and
 * calls nothing above it: the network thread tells it about connections and
 * control frames, the executor asks it for replicas and reports outcomes, and
 * it tells the executor about departures through the inbox. */
#ifndef MOEX_HUB_REGISTRY_H
#define MOEX_HUB_REGISTRY_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/common.h"
#include "hub/conn.h"
#include "hub/inbox.h"
#include "hub/metrics.h"
#include "proto/proto.h"

#define HUB_MAX_WORKERS 256     /* worker records kept, departed ones included */
#define HUB_MAX_CAPACITY 16.0f  /* a JOIN's capacity weight is clamped to this (bounds placement cost) */
#define HUB_JOINS_PER_S 20      /* JOINs over this rate are refused (each one rebuilds the placement) */
#define HUB_NAME_BYTES 256      /* a JOIN's name (at most 255 bytes), made valid UTF-8, and its NUL */

typedef struct hub_registry_config {
    uint64_t model_hash;
    int n_layers, n_experts;
    int replicas;                /* r, at most the number of workers */
    int heartbeat_ms;            /* ours, to every joined worker */
    int dead_after_ms;           /* a connection silent this long is removed */
} hub_registry_config;

typedef struct hub_registry hub_registry;
typedef struct hub_worker hub_worker;  /* a connection's record; the network thread holds it */

hub_registry *hub_registry_create(const hub_registry_config *cfg, hub_net *net, hub_inbox *inbox,
                                  hub_metrics *metrics, moex_error *err);
void hub_registry_free(hub_registry *r);

/* ---- network thread ---- */

/* A new connection's record (NULL: the table is full of live workers and bans). */
hub_worker *hub_registry_connect(hub_registry *r, hub_conn *c);
/* The connection closed; the record is forgotten (never joined) or kept for the metrics. */
void hub_registry_disconnect(hub_registry *r, hub_worker *w, const char *why);
/* Whether RESULT and ERROR frames from this connection may reach the executor
 * (the worker joined and is not evicted), and its id. */
bool hub_registry_accepts_results(hub_registry *r, hub_worker *w, uint32_t *id);
/* A JOIN or HEARTBEAT. */
void hub_registry_on_control(hub_registry *r, hub_worker *w, const moex_proto_msg *msg);
/* Something was received (resets the silence clock); bytes for the metrics. */
void hub_registry_on_receive(hub_registry *r, hub_worker *w, size_t bytes);
/* A frame that does not decode or is not allowed here: ERROR to the peer, then close. */
void hub_registry_bad_frame(hub_registry *r, hub_worker *w, uint32_t seq, int status, const char *why);
/* Every heartbeat period: heartbeats out, silent connections removed. */
void hub_registry_tick(hub_registry *r, double now);

/* ---- the executor ---- */

/* A dispatch's size: what a worker takes for a decode dispatch (a token or
 * two) says nothing about a prompt dispatch (dozens of tokens) and the other
 * way round, so each worker has a latency estimate of each. Were there one,
 * the worker that happened to carry the prompt's last big batches would
 * look slow to every decode layer after it and be left out. */
typedef enum hub_size { HUB_SMALL, HUB_LARGE } hub_size;
#define HUB_SMALL_TOKENS 4   /* tokens of a dispatch up to which it is HUB_SMALL */
static inline hub_size hub_size_of(int64_t n_tokens) { return n_tokens <= HUB_SMALL_TOKENS ? HUB_SMALL : HUB_LARGE; }

typedef struct hub_replica {
    uint32_t id;
    hub_conn *conn;          /* a reference: hub_conn_unref when done */
    float lat_ms;            /* recent round trips of the size asked (EWMA), < 0: unknown */
    double sampled_s;        /* when lat_ms last learned something (0: never) */
    uint8_t backend;
} hub_replica;

/* The usable replicas of (layer, expert): joined, ready for it, healthy, not
 * evicted, connection open; at most max, in placement order; their estimates
 * for dispatches of that size. */
int hub_registry_replicas(hub_registry *r, int layer, int expert, hub_size size, hub_replica *out, int max);
/* The median of the known workers' latency estimates for that size (0 when none). */
float hub_registry_median_ms(hub_registry *r, hub_size size);

typedef enum hub_outcome {
    HUB_WON,       /* its RESULT was used */
    HUB_LOST,      /* another replica answered first (ms: its wait so far, a lower bound) */
    HUB_TIMEOUT,   /* no answer by the deadline */
} hub_outcome;
void hub_registry_record(hub_registry *r, uint32_t id, hub_size size, float ms, hub_outcome o);
/* A worker whose result disagreed with the hub's: banned (its session key is
 * refused from now on) and disconnected. */
void hub_registry_evict(hub_registry *r, uint32_t id, const char *why);
/* A verified result of the worker: share is how much of the honest bound
 * it used (hub/verify.h; > 1 was not honest). */
void hub_registry_note_check(hub_registry *r, uint32_t id, double share);
/* A worker that sent a RESULT that does not decode or does not fit its
 * request: counted, told, disconnected. */
void hub_registry_bad_result(hub_registry *r, uint32_t id, const char *why);
/* The open connection of a worker (referenced), or NULL. */
hub_conn *hub_registry_conn(hub_registry *r, uint32_t id);
int hub_registry_backend(hub_registry *r, uint32_t id);
void hub_registry_count_dispatch(hub_registry *r, uint32_t id, int n);

/* ---- anyone ---- */

/* Waits until at least n workers are ready and every joined worker is;
 * gives up early when *cancel becomes nonzero (a signal; may be NULL). */
int hub_registry_wait_ready(hub_registry *r, int n, double timeout_s, const volatile sig_atomic_t *cancel,
                            const char *how_to_join, moex_error *err);
/* Wakes waiters (the hub is stopping). */
void hub_registry_stop(hub_registry *r);
/* Per-worker table: latency percentiles, dispatches, wins, timeouts, state. */
void hub_registry_print(hub_registry *r, FILE *f);

/* ---- read-only views for the status page and /metrics ---- */

typedef struct hub_worker_info {
    uint32_t id;
    char name[HUB_NAME_BYTES], peer[64];
    const char *state;           /* "ready", "loading", "unhealthy", "evicted" or "gone" */
    uint8_t backend;
    float capacity;
    uint32_t experts_assigned, experts_ready;
    float lat_p50_ms, lat_p95_ms, lat_p99_ms, rtt_ms;  /* < 0: no sample yet */
    float lat_ewma_ms[2];        /* by hub_size, < 0: no sample yet */
    uint64_t dispatched, won, timeouts, bytes_in;
    uint64_t lost;               /* tasks another replica (a hedge) answered first */
    uint64_t checked;            /* results verified */
    double worst_check;          /* the largest share of the honest bound a verified result used */
} hub_worker_info;

/* The workers that joined (departed ones included, as the metrics print
 * shows them): fills out[0..max) and returns how many there are. */
int hub_registry_workers(hub_registry *r, hub_worker_info *out, int max);

typedef struct hub_coverage {
    uint64_t experts;            /* layers x experts */
    uint64_t covered;            /* with at least one ready replica */
    uint64_t replicas_ready;     /* ready (worker, expert) pairs */
    int replicas;                /* r, as configured */
} hub_coverage;
void hub_registry_coverage(hub_registry *r, hub_coverage *c);

#endif
