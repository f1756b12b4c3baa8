/* Private to the hub: what `moex-hub serve` shows about itself (status.c,
 * status_page.c): GET /metrics in Prometheus text format, GET /status.json
 * for the status page, and the page itself (one HTML file with its script
 * and style inline, no external assets). */
#ifndef MOEX_HUB_STATUS_H
#define MOEX_HUB_STATUS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "hub/hub.h"
#include "hub/scheduler.h"

/* Requests answered, by endpoint and status (written by the API on the
 * network thread, read by anyone). */
enum { HUB_EP_CHAT, HUB_EP_COMPLETIONS, HUB_EP_MODELS, HUB_EP_METRICS, HUB_EP_STATUS, HUB_EP_OTHER, HUB_EP_COUNT };
enum { HUB_CODE_200, HUB_CODE_400, HUB_CODE_401, HUB_CODE_404, HUB_CODE_405, HUB_CODE_411, HUB_CODE_413,
       HUB_CODE_500, HUB_CODE_503, HUB_CODE_OTHER, HUB_CODE_COUNT };
typedef struct hub_api_counters {
    atomic_uint_fast64_t requests[HUB_EP_COUNT][HUB_CODE_COUNT];
    atomic_uint_fast64_t disconnects;   /* clients gone before their response ended */
} hub_api_counters;
void hub_api_count(hub_api_counters *c, int endpoint, unsigned status);

/* Everything the status page and the metrics read. */
typedef struct hub_status_src {
    const moex_model *m;
    const char *model_id;        /* as /v1/models lists it */
    const char *backend;         /* "cpu (avx2)", "vulkan", ... */
    const char *chat_template;   /* its name */
    bool distributed;
    moex_hub *hub;               /* the workers' side (NULL: none) */
    hub_sched_stats *sched;
    hub_sched_config sched_cfg;
    hub_api_counters api;
    double t_start;              /* moex_time_s() at start */
} hub_status_src;

/* Prometheus text exposition format 0.0.4 (malloc'd; NULL: out of memory). */
char *hub_status_metrics(hub_status_src *s, size_t *len);
/* The status page's data (malloc'd JSON). */
char *hub_status_json(hub_status_src *s);
/* The page (static). */
const char *hub_status_page(size_t *len);

#endif
