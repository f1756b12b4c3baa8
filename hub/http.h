/* Private to the hub: plain HTTP on the hub's port (http_weights.c): expert
 * weights for workers without their own copy of the model. */
#ifndef MOEX_HUB_HTTP_H
#define MOEX_HUB_HTTP_H

#include <libwebsockets.h>

#include "hub/auth.h"
#include "hub/metrics.h"
#include "model/model.h"

typedef struct hub_http {
    const moex_model *m;
    uint64_t model_hash;
    const char *token;
    hub_metrics *metrics;
    hub_log_limit refusals;   /* network thread only */
} hub_http;

/* The HTTP callbacks of one connection; *state is per-request, owned here. */
int hub_http_callback(hub_http *h, struct lws *wsi, enum lws_callback_reasons reason, void **state, void *in,
                      size_t len);

#endif
