/* Private to the hub: what `moex-hub serve` shows about itself (status.c,
 * status_page.c): GET /metrics in Prometheus text format, GET /status.json
 * for the status page, and the page itself (one HTML file with its script
 * and style inline, no external assets). */
#ifndef MOEX_SERVE_STATUS_H
#define MOEX_SERVE_STATUS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "hub/hub.h"
#include "serve/scheduler.h"

/* Requests answered, by endpoint and status (written by the API on the
 * network thread, read by anyone). */
enum { SERVE_EP_CHAT, SERVE_EP_COMPLETIONS, SERVE_EP_MODELS, SERVE_EP_METRICS, SERVE_EP_STATUS, SERVE_EP_OTHER, SERVE_EP_COUNT };
enum { SERVE_CODE_200, SERVE_CODE_400, SERVE_CODE_401, SERVE_CODE_404, SERVE_CODE_405, SERVE_CODE_411, SERVE_CODE_413,
       SERVE_CODE_500, SERVE_CODE_503, SERVE_CODE_OTHER, SERVE_CODE_COUNT };
typedef struct serve_api_counters {
    atomic_uint_fast64_t requests[SERVE_EP_COUNT][SERVE_CODE_COUNT];
    atomic_uint_fast64_t disconnects;   /* clients gone before their response ended */
} serve_api_counters;
void serve_api_count(serve_api_counters *c, int endpoint, unsigned status);

/* Everything the status page and the metrics read. */
typedef struct serve_status_src {
    const moex_model *m;
    const char *model_id;        /* as /v1/models lists it */
    const char *backend;         /* "cpu (avx2)", "vulkan", ... */
    const char *chat_template;   /* its name */
    bool distributed;
    moex_hub *hub;               /* the workers' side (NULL: none) */
    serve_sched_stats *sched;
    serve_sched_config sched_cfg;
    serve_api_counters api;
    double t_start;              /* moex_time_s() at start */
} serve_status_src;

/* Prometheus text exposition format 0.0.4 (malloc'd; NULL: out of memory). */
char *serve_status_metrics(serve_status_src *s, size_t *len);
/* The status page's data (malloc'd JSON). */
char *serve_status_json(serve_status_src *s);
/* The page (static). */
const char *serve_status_page(size_t *len);

#endif
