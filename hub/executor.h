/* Private to the hub: the remote expert executor (executor_remote.c). */
#ifndef MOEX_HUB_EXECUTOR_H
#define MOEX_HUB_EXECUTOR_H

#include <stdio.h>

#include "engine/engine.h"
#include "hub/conn.h"
#include "hub/inbox.h"
#include "hub/metrics.h"
#include "hub/registry.h"
#include "placement/placement.h"

typedef struct hub_executor hub_executor;

typedef struct hub_executor_config {
    int hedge;                 /* h >= 1 fixed, 0 = auto */
    int timeout_ms;            /* per-expert deadline before re-dispatch */
    double verify_p;           /* fraction of results recomputed here */
    bool local_fallback;       /* compute experts with no live replica here */
    int wire_dtype;
    int64_t max_batch;         /* most tokens per request */
    uint64_t seed;             /* verification sampling */
    int split_bytes;           /* moex_hub_config.split_bytes */
} hub_executor_config;

hub_executor *hub_executor_create(const moex_model *m, moex_pool *pool, const hub_executor_config *cfg,
                                  hub_registry *reg, hub_inbox *inbox, hub_net *net, hub_metrics *metrics,
                                  const moex_proto_limits *limits, moex_error *err);
void hub_executor_free(hub_executor *x);
moex_expert_executor hub_executor_iface(hub_executor *x);
/* Makes a running request fail soon ("hub stopping"); any thread. */
void hub_executor_stop(hub_executor *x);
/* Per-layer time breakdown (percentiles of the layers run so far). */
void hub_executor_print_timing(hub_executor *x, FILE *f);

#endif
