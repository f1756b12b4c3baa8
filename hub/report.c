/* The hub's side of /metrics and of the status page (hub.h): its dispatch
 * counters, each worker's record and the placement's coverage, read from the
 * registry and the counters the network thread and the executor update. */
#include <stddef.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "hub/hub.h"
#include "hub/metrics.h"
#include "hub/registry.h"
#include "proto/proto.h"

static unsigned long long counter_at(hub_metrics *m, size_t off) {
    return (unsigned long long)atomic_load_explicit((atomic_uint_fast64_t *)((char *)m + off), memory_order_relaxed);
}

static void hub_counters(moex_text *t, hub_metrics *m) {
    static const struct {
        const char *name, *help;
        size_t off;
    } c[] = {
        {"moex_hub_dispatches_total", "Expert tasks sent to workers (hedges and re-dispatches included).",
         offsetof(hub_metrics, dispatches)},
        {"moex_hub_messages_out_total", "Messages sent to workers.",
         offsetof(hub_metrics, messages_out)},
        {"moex_hub_hedges_sent_total", "Extra replicas a task was sent to.", offsetof(hub_metrics, hedges_sent)},
        {"moex_hub_hedges_won_total", "Tasks a hedge answered first.", offsetof(hub_metrics, hedges_won)},
        {"moex_hub_cancels_total", "CANCELs sent to losing replicas.", offsetof(hub_metrics, cancels)},
        {"moex_hub_timeouts_total", "Tasks past their deadline.", offsetof(hub_metrics, timeouts)},
        {"moex_hub_redispatches_total", "Tasks sent again after a failure.", offsetof(hub_metrics, redispatches)},
        {"moex_hub_fallbacks_total", "Tasks computed on the hub (no live replica).", offsetof(hub_metrics, fallbacks)},
        {"moex_hub_verified_total", "Results recomputed here (--verify).", offsetof(hub_metrics, verified)},
        {"moex_hub_verify_mismatches_total", "Verified results that disagreed.", offsetof(hub_metrics, verify_mismatches)},
        {"moex_hub_evictions_total", "Workers evicted.", offsetof(hub_metrics, evictions)},
        {"moex_hub_refused_total", "Connections and requests refused (bad token, bad path).", offsetof(hub_metrics, refused)},
        {"moex_hub_bad_frames_total", "Frames that did not decode.", offsetof(hub_metrics, bad_frames)},
        {"moex_hub_bad_results_total", "Results that did not fit their request.", offsetof(hub_metrics, bad_results)},
        {"moex_hub_joins_total", "Workers that joined.", offsetof(hub_metrics, joins)},
        {"moex_hub_rebalances_total", "Placements installed.", offsetof(hub_metrics, rebalances)},
        {"moex_hub_bytes_in_total", "Bytes received from workers.", offsetof(hub_metrics, bytes_in)},
        {"moex_hub_bytes_out_total", "Bytes sent to workers.", offsetof(hub_metrics, bytes_out)},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        moex_prom_counter(t, c[i].name, c[i].help, counter_at(m, c[i].off));
}

/* One sample per worker: name{worker="..."} value. */
static void worker_samples(moex_text *t, const char *name, const char *type, const char *help, const hub_worker_info *w,
                           int n, int which) {
    moex_prom_family(t, name, type, help);
    for (int i = 0; i < n; i++) {
        moex_text_printf(t, "%s{worker=\"", name);
        moex_prom_label(t, w[i].name);
        switch (which) {
        case 0: moex_text_printf(t, "\",state=\"%s\"} 1\n", w[i].state); break;
        case 1: moex_text_printf(t, "\"} %u\n", w[i].experts_assigned); break;
        case 2: moex_text_printf(t, "\"} %u\n", w[i].experts_ready); break;
        case 3: moex_text_printf(t, "\"} %llu\n", (unsigned long long)w[i].dispatched); break;
        case 4: moex_text_printf(t, "\"} %llu\n", (unsigned long long)w[i].won); break;
        case 5: moex_text_printf(t, "\"} %llu\n", (unsigned long long)w[i].timeouts); break;
        case 6: moex_text_printf(t, "\"} %.17g\n", w[i].rtt_ms >= 0 ? w[i].rtt_ms / 1000.0 : 0.0); break;
        case 7: moex_text_printf(t, "\"} %llu\n", (unsigned long long)w[i].lost); break;
        }
    }
}

static void worker_latency(moex_text *t, const hub_worker_info *w, int n) {
    moex_prom_family(t, "moex_worker_latency_seconds", "gauge",
           "Round trips of a worker's winning results: percentiles of its last 1024.");
    for (int i = 0; i < n; i++) {
        const float q[3] = {w[i].lat_p50_ms, w[i].lat_p95_ms, w[i].lat_p99_ms};
        const char *qn[3] = {"0.5", "0.95", "0.99"};
        for (int k = 0; k < 3; k++) {
            if (q[k] < 0) continue;
            moex_text_printf(t, "moex_worker_latency_seconds{worker=\"");
            moex_prom_label(t, w[i].name);
            moex_text_printf(t, "\",quantile=\"%s\"} %.17g\n", qn[k], q[k] / 1000.0);
        }
    }
}

static void worker_metrics(moex_text *t, hub_registry *reg) {
    hub_worker_info *w = malloc(HUB_MAX_WORKERS * sizeof *w);
    if (!w) {
        t->oom = true;
        return;
    }
    int n = hub_registry_workers(reg, w, HUB_MAX_WORKERS);
    if (n > HUB_MAX_WORKERS) n = HUB_MAX_WORKERS;
    worker_samples(t, "moex_worker_state", "gauge", "Each worker that joined, by its state (1).", w, n, 0);
    worker_samples(t, "moex_worker_experts", "gauge", "Experts the placement gives the worker.", w, n, 1);
    worker_samples(t, "moex_worker_experts_ready", "gauge", "Of those, loaded and usable.", w, n, 2);
    worker_samples(t, "moex_worker_dispatches_total", "counter", "Expert tasks sent to the worker.", w, n, 3);
    worker_samples(t, "moex_worker_won_total", "counter", "Its results that were used.", w, n, 4);
    worker_samples(t, "moex_worker_timeouts_total", "counter", "Its tasks past their deadline.", w, n, 5);
    worker_samples(t, "moex_worker_lost_total", "counter", "Its tasks another replica (a hedge) answered first.", w,
                   n, 7);
    worker_samples(t, "moex_worker_rtt_seconds", "gauge", "Heartbeat round trip.", w, n, 6);
    worker_latency(t, w, n);
    free(w);
    hub_coverage c;
    hub_registry_coverage(reg, &c);
    moex_prom_gauge(t, "moex_experts", "Routed experts in the model (layers x experts).", (double)c.experts);
    moex_prom_gauge(t, "moex_expert_coverage_ratio", "Experts with at least one ready replica, as a fraction of all.",
          c.experts ? (double)c.covered / (double)c.experts : 0.0);
    moex_prom_gauge(t, "moex_expert_replicas_ready", "Ready (worker, expert) pairs.", (double)c.replicas_ready);
    moex_prom_gauge(t, "moex_expert_replicas_wanted", "Replicas per expert (--replicas).", c.replicas);
}

static void add_worker(cJSON *arr, const hub_worker_info *w) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", w->name);
    cJSON_AddNumberToObject(o, "id", w->id);
    cJSON_AddStringToObject(o, "state", w->state);
    cJSON_AddStringToObject(o, "peer", w->peer);
    cJSON_AddStringToObject(o, "backend", w->backend == MOEX_BACKEND_CPU      ? "cpu"
                                          : w->backend == MOEX_BACKEND_VULKAN ? "vulkan"
                                          : w->backend == MOEX_BACKEND_WEBGPU ? "webgpu"
                                                                              : "other");
    cJSON_AddNumberToObject(o, "experts", w->experts_assigned);
    cJSON_AddNumberToObject(o, "experts_ready", w->experts_ready);
    cJSON_AddNumberToObject(o, "latency_p50_ms", w->lat_p50_ms);
    cJSON_AddNumberToObject(o, "latency_p95_ms", w->lat_p95_ms);
    cJSON_AddNumberToObject(o, "latency_ewma_ms", w->lat_ewma_ms[HUB_SMALL]);         /* decode dispatches */
    cJSON_AddNumberToObject(o, "latency_ewma_prompt_ms", w->lat_ewma_ms[HUB_LARGE]);  /* prompt dispatches */
    cJSON_AddNumberToObject(o, "rtt_ms", w->rtt_ms);
    cJSON_AddNumberToObject(o, "dispatched", (double)w->dispatched);
    cJSON_AddNumberToObject(o, "won", (double)w->won);
    cJSON_AddNumberToObject(o, "timeouts", (double)w->timeouts);
    cJSON_AddNumberToObject(o, "lost", (double)w->lost);
    cJSON_AddItemToArray(arr, o);
}

static void add_workers(cJSON *root, hub_registry *reg) {
    cJSON *arr = cJSON_AddArrayToObject(root, "workers");
    hub_worker_info *w = malloc(HUB_MAX_WORKERS * sizeof *w);
    if (!w) return;
    int n = hub_registry_workers(reg, w, HUB_MAX_WORKERS);
    for (int i = 0; i < n && i < HUB_MAX_WORKERS; i++) add_worker(arr, &w[i]);
    free(w);
    hub_coverage c;
    hub_registry_coverage(reg, &c);
    cJSON *cov = cJSON_AddObjectToObject(root, "coverage");
    cJSON_AddNumberToObject(cov, "experts", (double)c.experts);
    cJSON_AddNumberToObject(cov, "covered", (double)c.covered);
    cJSON_AddNumberToObject(cov, "replicas_ready", (double)c.replicas_ready);
    cJSON_AddNumberToObject(cov, "replicas", c.replicas);
}

void moex_hub_metrics_text(moex_hub *hub, moex_text *t) {
    hub_counters(t, moex_hub_counters(hub));
    worker_metrics(t, moex_hub_registry(hub));
}

void moex_hub_status_add(moex_hub *hub, cJSON *root) { add_workers(root, moex_hub_registry(hub)); }
