/* The hub module: the distributed hub. One libwebsockets port serves workers
 * (WebSocket, the binary protocol of proto/) and HTTP (expert weights); the
 * remote executor plugs into the engine's executor seam and sends each MoE
 * layer's experts to the workers that placement gives them. */
#ifndef MOEX_HUB_H
#define MOEX_HUB_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/engine.h"

typedef struct moex_hub_config {
    const char *host;          /* listen address (default 127.0.0.1) */
    int port;                  /* 0 picks a free port (see moex_hub_port) */
    const char *token;         /* workers present it, and it guards the expert weights; required unless no_workers */
    int replicas;              /* r: replicas of every expert */
    int hedge;                 /* h >= 1 fixed, or 0 = auto (paper §4.1) */
    int timeout_ms;            /* per-expert deadline before re-dispatch */
    double verify_p;           /* fraction of results recomputed on the hub */
    bool local_fallback;       /* compute experts with no live replica here */
    int wire_dtype;            /* MOEX_DT_F16 (default), BF16, INT8 or F32 */
    int heartbeat_ms;          /* both ways */
    int dead_after_ms;         /* a silent worker is removed after this */
    uint64_t seed;             /* for verification sampling */
    int64_t max_batch;         /* most tokens per forward: bounds frame sizes */
    int split_bytes;           /* a message to a worker is cut after this many bytes of frames (0: 256 KiB; tests: 1) */
    /* moex-hub serve: the API's HTTP handler, offered every request first;
     * no_workers: the model runs in this process (--local), /ws is refused */
    const struct hub_http_handler *http_handler;
    bool no_workers;
    /* the browser worker page (<build>/web), served at /worker without a
     * token (it holds no secret); NULL: not offered */
    const char *web_dir;
    /* HTTPS and WSS on the port: tls_cert and tls_key (PEM files), or, both
     * NULL, a self-signed pair the hub makes in tls_dir (NULL: the default,
     * $XDG_CACHE_HOME/moex/tls or ~/.cache/moex/tls) and reuses */
    bool tls;
    const char *tls_cert, *tls_key, *tls_dir;
    /* > 0: native workers may also join over plain TCP on this port
     * (moex-worker --hub tcp://HOST:PORT): no WebSocket framing, so a
     * prompt's megabytes cost a copy; in the clear, so not with tls */
    int tcp_port;
} moex_hub_config;

void moex_hub_config_default(moex_hub_config *cfg);

typedef struct moex_hub moex_hub;

/* Starts the server (its own network thread). m must outlive the hub. */
moex_hub *moex_hub_start(const moex_model *m, moex_pool *pool, const moex_hub_config *cfg, moex_error *err);
int moex_hub_port(const moex_hub *hub);
/* "ws" or "wss", "http" or "https": how workers and browsers reach it. */
const char *moex_hub_ws_scheme(const moex_hub *hub);
const char *moex_hub_http_scheme(const moex_hub *hub);
/* Waits until at least n workers have joined and loaded their assignment,
 * or *cancel (set by a signal handler; may be NULL) becomes nonzero. */
int moex_hub_wait_ready(moex_hub *hub, int n, double timeout_s, const volatile sig_atomic_t *cancel, moex_error *err);
/* Whether every expert can be computed now: by a ready worker, or here (the
 * local fallback, --local). false: why, for /health. */
bool moex_hub_can_serve(moex_hub *hub, char *why, size_t cap);
/* The executor that sends experts to workers (with hedging, timeouts, fallback). */
moex_expert_executor moex_hub_executor(moex_hub *hub);
/* Metrics: per-worker latency percentiles, hedges, timeouts, re-dispatches,
 * fallbacks, evictions, bytes; one place, printed at exit. */
void moex_hub_metrics_print(moex_hub *hub, FILE *f);
void moex_hub_stop(moex_hub *hub);

/* The hub's side of /metrics and of a status page (hub/report.c): its
 * dispatch counters, each worker's record and the placement's coverage, as
 * Prometheus lines appended to t, and as "workers" (an array) and "coverage"
 * added to root (a cJSON object). */
void moex_hub_metrics_text(moex_hub *hub, moex_text *t);
struct cJSON;
void moex_hub_status_add(moex_hub *hub, struct cJSON *root);

/* Inside the hub (hub/report.c): its registry and counters. */
struct hub_registry *moex_hub_registry(moex_hub *hub);
struct hub_metrics *moex_hub_counters(moex_hub *hub);

#endif
