/* The hub as its users see it (hub/hub.h): the pieces wired together.
 *
 *   network thread (server.c) --control frames--> registry (registry.c) <--replicas, outcomes-- executor
 *         |  \--messages with results--> inbox (inbox.c) <--departures-- registry            (executor_remote.c)
 *         \--writes what the connections queue (conn.c) <--messages-- executor, registry
 *
 * Arrows only point down: the server and the executor use the registry, the
 * inbox and the connections; none of those calls back up. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hub/executor.h"
#include "hub/hub.h"
#include "hub/reach.h"
#include "hub/server.h"

struct moex_hub {
    moex_hub_config cfg;
    hub_metrics metrics;
    hub_net *net;
    hub_inbox *inbox;
    hub_registry *reg;
    hub_executor *exec;
    hub_http http;
    hub_static *web;             /* the browser worker page (NULL: not offered) */
    hub_tls_cert tls;            /* its files when cfg.tls */
    hub_server *server;
};

void moex_hub_config_default(moex_hub_config *cfg) {
    *cfg = (moex_hub_config){.host = "127.0.0.1", .port = 8765, .replicas = 2, .hedge = 1, .timeout_ms = 500,
                             .local_fallback = true, .wire_dtype = MOEX_DT_F16, .heartbeat_ms = 1000,
                             .dead_after_ms = 3000, .seed = 1, .max_batch = 512};
}

/* What workers may send: the model's shape, a full batch of f32 rows at most. */
static moex_proto_limits worker_limits(const moex_model *m, const moex_hub_config *cfg) {
    moex_proto_limits lim = moex_proto_default_limits();
    lim.max_hidden = (uint32_t)m->hp.n_embd;
    lim.max_layers = (uint32_t)m->hp.n_layer;
    lim.max_experts = (uint32_t)m->hp.n_expert;
    lim.max_tokens = (uint32_t)cfg->max_batch;
    const uint64_t max_frame = (uint64_t)cfg->max_batch * (uint64_t)m->hp.n_embd * 4 + 64 * 1024;
    lim.max_frame_bytes = (uint32_t)(max_frame < (1u << 20) ? (1u << 20) : max_frame);
    return lim;
}

moex_hub *moex_hub_start(const moex_model *m, moex_pool *pool, const moex_hub_config *cfg, moex_error *err) {
    if (!cfg->no_workers && !moex_hparams_is_moe(&m->hp)) {
        moex_fail(err, "%s is a dense model: nothing to distribute (use --local)", m->hp.arch_name);
        return NULL;
    }
    if (!cfg->no_workers && (!cfg->token || !*cfg->token)) {
        moex_fail(err, "a hub that takes workers needs --token T (workers present it, and it guards the expert "
                       "weights); or run the whole model here with --local");
        return NULL;
    }
    if (cfg->token && strlen(cfg->token) > HUB_TOKEN_MAX) {
        moex_fail(err, "the token is %zu bytes; at most %d", strlen(cfg->token), HUB_TOKEN_MAX);
        return NULL;
    }
    moex_hub *hub = calloc(1, sizeof *hub);
    if (!hub) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    hub->cfg = *cfg;
    if (cfg->tls && hub_tls_prepare(cfg->tls_cert, cfg->tls_key, cfg->tls_dir, &hub->tls, err)) {
        free(hub);
        return NULL;
    }
    /* the page makes a browser tab a worker: useless where workers are refused */
    if (cfg->web_dir && !cfg->no_workers && !(hub->web = hub_static_create(cfg->web_dir, err))) {
        free(hub);
        return NULL;
    }
    const uint64_t model_hash = moex_gguf_identity(m->gguf);
    const moex_proto_limits lim = worker_limits(m, cfg);
    /* a layer's results for a full batch: k frames per token at most, across all workers */
    const size_t max_message = (size_t)lim.max_frame_bytes * (size_t)(m->hp.n_expert_used > 0 ? m->hp.n_expert_used : 1);
    hub_registry_config rc = {.model_hash = model_hash, .n_layers = m->hp.n_layer, .n_experts = m->hp.n_expert,
                              .replicas = cfg->replicas, .heartbeat_ms = cfg->heartbeat_ms,
                              .dead_after_ms = cfg->dead_after_ms};
    hub_executor_config xc = {.hedge = cfg->hedge, .timeout_ms = cfg->timeout_ms, .verify_p = cfg->verify_p,
                              .local_fallback = cfg->local_fallback, .wire_dtype = cfg->wire_dtype,
                              .max_batch = cfg->max_batch, .seed = cfg->seed, .split_bytes = cfg->split_bytes};
    hub->http = (hub_http){.m = m, .model_hash = model_hash, .token = cfg->token, .metrics = &hub->metrics,
                           .no_weights = cfg->no_workers};
    hub_server_config sc = {.host = cfg->host, .port = cfg->port, .token = cfg->token, .heartbeat_ms = cfg->heartbeat_ms,
                            .limits = lim, .max_message = max_message, .max_queued = 2 * max_message + (1u << 20),
                            .handler = cfg->http_handler, .refuse_workers = cfg->no_workers, .web = hub->web,
                            .tls_cert = cfg->tls ? hub->tls.cert : NULL, .tls_key = cfg->tls ? hub->tls.key : NULL,
                            .tcp_port = cfg->tcp_port};
    /* results waiting for the executor: a layer's worth, hedged copies included, many times over */
    if (!(hub->net = hub_net_create()) || !(hub->inbox = hub_inbox_create(4096, 16 * max_message)) ||
        !(hub->reg = hub_registry_create(&rc, hub->net, hub->inbox, &hub->metrics, err)) ||
        (!cfg->no_workers &&
         !(hub->exec = hub_executor_create(m, pool, &xc, hub->reg, hub->inbox, hub->net, &hub->metrics, &lim, err))) ||
        !(hub->server = hub_server_start(&sc, hub->reg, hub->inbox, hub->net, &hub->http, &hub->metrics, err))) {
        if (!err || !err->msg[0]) moex_fail(err, "out of memory");
        moex_hub_stop(hub);
        return NULL;
    }
    if (!cfg->no_workers) {
        moex_log(MOEX_LOG_INFO, "hub listening on %s://%s:%d/ws (model %016llx, r=%d, hedge %s%d, timeout %d ms)",
                 moex_hub_ws_scheme(hub), cfg->host, hub_server_port(hub->server), (unsigned long long)model_hash,
                 cfg->replicas, cfg->hedge ? "" : "auto, max ", cfg->hedge ? cfg->hedge : cfg->replicas, cfg->timeout_ms);
        if (cfg->tcp_port)
            moex_log(MOEX_LOG_INFO, "native workers also on tcp://%s:%d (the TCP transport)", cfg->host,
                     hub_server_tcp_port(hub->server));
        if (hub->web) moex_log(MOEX_LOG_INFO, "worker page: %s at /worker", hub_static_dir(hub->web));
    }
    hub_announce(cfg->host, hub_server_port(hub->server), cfg->token, cfg->tls ? &hub->tls : NULL, !cfg->no_workers,
                 hub->web != NULL);
    return hub;
}

int moex_hub_port(const moex_hub *hub) { return hub_server_port(hub->server); }
const char *moex_hub_ws_scheme(const moex_hub *hub) { return hub->cfg.tls ? "wss" : "ws"; }
const char *moex_hub_http_scheme(const moex_hub *hub) { return hub->cfg.tls ? "https" : "http"; }

int moex_hub_wait_ready(moex_hub *hub, int n, double timeout_s, const volatile sig_atomic_t *cancel, moex_error *err) {
    char how[160];
    snprintf(how, sizeof how, "start more with moex-worker --hub %s://%s:%d/ws%s", moex_hub_ws_scheme(hub), hub->cfg.host,
             moex_hub_port(hub), hub->web ? ", or open the worker page at /worker in a browser" : "");
    return hub_registry_wait_ready(hub->reg, n, timeout_s, cancel, how, err);
}

bool moex_hub_can_serve(moex_hub *hub, char *why, size_t cap) {
    if (hub->cfg.no_workers || hub->cfg.local_fallback) return true;
    hub_coverage c;
    hub_registry_coverage(hub->reg, &c);
    if (c.covered == c.experts) return true;
    snprintf(why, cap, "%llu of the %llu experts have no ready worker and --no-local-fallback is set: start workers "
                       "(moex-worker --hub %s://HUB:%d/ws)", (unsigned long long)(c.experts - c.covered),
             (unsigned long long)c.experts, moex_hub_ws_scheme(hub), moex_hub_port(hub));
    return false;
}

moex_expert_executor moex_hub_executor(moex_hub *hub) { return hub_executor_iface(hub->exec); }

hub_registry *moex_hub_registry(moex_hub *hub) { return hub->reg; }
hub_metrics *moex_hub_counters(moex_hub *hub) { return &hub->metrics; }

void moex_hub_metrics_print(moex_hub *hub, FILE *f) {
    const hub_metrics *mt = &hub->metrics;
    fprintf(f, "hub metrics: dispatches %llu | messages %llu | hedges sent %llu won %llu | cancels %llu | "
               "timeouts %llu | re-dispatches %llu | fallbacks %llu | verified %llu (mismatches %llu) | "
               "evictions %llu | refused %llu | bad frames %llu | bad results %llu | bytes in %llu out %llu\n",
            HUB_GET(mt, dispatches), HUB_GET(mt, messages_out), HUB_GET(mt, hedges_sent), HUB_GET(mt, hedges_won),
            HUB_GET(mt, cancels), HUB_GET(mt, timeouts), HUB_GET(mt, redispatches), HUB_GET(mt, fallbacks),
            HUB_GET(mt, verified), HUB_GET(mt, verify_mismatches), HUB_GET(mt, evictions), HUB_GET(mt, refused),
            HUB_GET(mt, bad_frames), HUB_GET(mt, bad_results), HUB_GET(mt, bytes_in), HUB_GET(mt, bytes_out));
    if (hub->exec) hub_executor_print_timing(hub->exec, f);
    hub_registry_print(hub->reg, f);
}

void moex_hub_stop(moex_hub *hub) {
    if (!hub) return;
    if (hub->exec) hub_executor_stop(hub->exec);
    if (hub->reg) hub_registry_stop(hub->reg);
    hub_server_stop(hub->server); /* no more network events after this */
    hub_executor_free(hub->exec);
    hub_registry_free(hub->reg);
    hub_inbox_free(hub->inbox);
    hub_net_free(hub->net);
    hub_static_free(hub->web);
    free(hub);
}
