/* /metrics (Prometheus text format 0.0.4) and /status.json (status.h):
 * the scheduler's counters and histograms, the API's requests, the hub's
 * dispatch counters, each worker's record and the placement's coverage. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "hub/registry.h"
#include "hub/status.h"

static const char *const endpoint_names[HUB_EP_COUNT] = {"chat", "completions", "models", "metrics", "status",
                                                         "other"};
static const unsigned code_values[HUB_CODE_COUNT] = {200, 400, 401, 404, 405, 411, 413, 500, 503, 0};

void hub_api_count(hub_api_counters *c, int endpoint, unsigned status) {
    int k = HUB_CODE_OTHER;
    for (int i = 0; i < HUB_CODE_OTHER; i++)
        if (code_values[i] == status) k = i;
    atomic_fetch_add_explicit(&c->requests[endpoint][k], 1, memory_order_relaxed);
}

#define GET(x) ((unsigned long long)atomic_load_explicit(&(x), memory_order_relaxed))

/* ---- a growing text buffer ---- */

typedef struct text {
    char *s;
    size_t len, cap;
    bool oom;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    for (int attempt = 0; attempt < 2 && !t->oom; attempt++) {
        va_list ap;
        va_start(ap, fmt);
        const int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->oom = true;
            return;
        }
        if (t->s && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap ? t->cap : 4096;
        while (cap <= t->len + (size_t)n) cap *= 2;
        char *grown = realloc(t->s, cap);
        if (!grown) t->oom = true;
        else t->s = grown, t->cap = cap;
    }
}

/* A label value: backslash, double quote and newline escaped. */
static void put_label(text *t, const char *v) {
    for (; *v; v++) {
        if (*v == '\\') put(t, "\\\\");
        else if (*v == '"') put(t, "\\\"");
        else if (*v == '\n') put(t, "\\n");
        else put(t, "%c", *v);
    }
}

static void family(text *t, const char *name, const char *type, const char *help) {
    put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void counter(text *t, const char *name, const char *help, unsigned long long v) {
    family(t, name, "counter", help);
    put(t, "%s %llu\n", name, v);
}

static void gauge(text *t, const char *name, const char *help, double v) {
    family(t, name, "gauge", help);
    put(t, "%s %.17g\n", name, v);
}

static void histogram(text *t, const char *name, const char *help, hub_hist *h) {
    family(t, name, "histogram", help);
    unsigned long long cum = 0;
    for (int b = 0; b <= HUB_HIST_BUCKETS; b++) {
        cum += GET(h->count[b]);
        if (b < HUB_HIST_BUCKETS) put(t, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[b], cum);
        else put(t, "%s_bucket{le=\"+Inf\"} %llu\n", name, cum);
    }
    put(t, "%s_sum %.17g\n%s_count %llu\n", name, atomic_load(&h->sum), name, cum);
}

/* ---- /metrics ---- */

static void serving_metrics(text *t, hub_status_src *s) {
    hub_sched_stats *st = s->sched;
    family(t, "moex_info", "gauge", "The model served and how (always 1).");
    put(t, "moex_info{model=\"");
    put_label(t, s->model_id);
    put(t, "\",arch=\"");
    put_label(t, s->m->hp.arch_name);
    put(t, "\",backend=\"");
    put_label(t, s->backend);
    put(t, "\",chat_template=\"");
    put_label(t, s->chat_template);
    put(t, "\",mode=\"%s\"} 1\n", s->distributed ? "distributed" : "local");
    gauge(t, "moex_uptime_seconds", "Seconds since the server started.", moex_time_s() - s->t_start);

    family(t, "moex_requests_total", "counter", "Requests answered, by endpoint and HTTP status.");
    for (int e = 0; e < HUB_EP_COUNT; e++)
        for (int c = 0; c < HUB_CODE_COUNT; c++) {
            const unsigned long long n = GET(s->api.requests[e][c]);
            if (!n) continue;
            if (c == HUB_CODE_OTHER) put(t, "moex_requests_total{endpoint=\"%s\",code=\"other\"} %llu\n", endpoint_names[e], n);
            else put(t, "moex_requests_total{endpoint=\"%s\",code=\"%u\"} %llu\n", endpoint_names[e], code_values[c], n);
        }
    counter(t, "moex_client_disconnects_total", "Clients gone before their response ended (their slots freed at once).",
            GET(s->api.disconnects));
    family(t, "moex_completions_total", "counter", "Generations ended, by reason.");
    put(t, "moex_completions_total{reason=\"stop\"} %llu\n", GET(st->finished_stop));
    put(t, "moex_completions_total{reason=\"length\"} %llu\n", GET(st->finished_length));
    put(t, "moex_completions_total{reason=\"cancelled\"} %llu\n", GET(st->cancelled));
    put(t, "moex_completions_total{reason=\"error\"} %llu\n", GET(st->failed));
    put(t, "moex_completions_total{reason=\"rejected\"} %llu\n", GET(st->rejected));
    counter(t, "moex_prompt_tokens_total", "Prompt tokens evaluated.", GET(st->prompt_tokens));
    counter(t, "moex_generated_tokens_total", "Tokens generated.", GET(st->generated_tokens));
    gauge(t, "moex_slots", "KV slots (--parallel): sequences that decode together.", s->sched_cfg.n_slots);
    gauge(t, "moex_slots_active", "Slots holding a request now.", atomic_load(&st->active));
    gauge(t, "moex_queue_length", "Requests waiting for a slot.", atomic_load(&st->queued));
    counter(t, "moex_forward_steps_total", "Forward passes (each over every active sequence).", GET(st->steps));
    counter(t, "moex_forward_tokens_total", "Tokens in those forward passes.", GET(st->step_tokens));
    histogram(t, "moex_time_to_first_token_seconds", "From a request's arrival to its first token.", &st->ttft);
    histogram(t, "moex_time_per_output_token_seconds", "Between one sequence's consecutive tokens.", &st->per_token);
    histogram(t, "moex_forward_seconds", "One forward pass of the batch.", &st->step_s);
}

static void hub_counters(text *t, hub_metrics *m) {
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
        counter(t, c[i].name, c[i].help, GET(*(atomic_uint_fast64_t *)((char *)m + c[i].off)));
}

/* One sample per worker: name{worker="..."} value. */
static void worker_samples(text *t, const char *name, const char *type, const char *help, const hub_worker_info *w,
                           int n, int which) {
    family(t, name, type, help);
    for (int i = 0; i < n; i++) {
        put(t, "%s{worker=\"", name);
        put_label(t, w[i].name);
        switch (which) {
        case 0: put(t, "\",state=\"%s\"} 1\n", w[i].state); break;
        case 1: put(t, "\"} %u\n", w[i].experts_assigned); break;
        case 2: put(t, "\"} %u\n", w[i].experts_ready); break;
        case 3: put(t, "\"} %llu\n", (unsigned long long)w[i].dispatched); break;
        case 4: put(t, "\"} %llu\n", (unsigned long long)w[i].won); break;
        case 5: put(t, "\"} %llu\n", (unsigned long long)w[i].timeouts); break;
        case 6: put(t, "\"} %.17g\n", w[i].rtt_ms >= 0 ? w[i].rtt_ms / 1000.0 : 0.0); break;
        case 7: put(t, "\"} %llu\n", (unsigned long long)w[i].lost); break;
        }
    }
}

static void worker_latency(text *t, const hub_worker_info *w, int n) {
    family(t, "moex_worker_latency_seconds", "gauge",
           "Round trips of a worker's winning results: percentiles of its last 1024.");
    for (int i = 0; i < n; i++) {
        const float q[3] = {w[i].lat_p50_ms, w[i].lat_p95_ms, w[i].lat_p99_ms};
        const char *qn[3] = {"0.5", "0.95", "0.99"};
        for (int k = 0; k < 3; k++) {
            if (q[k] < 0) continue;
            put(t, "moex_worker_latency_seconds{worker=\"");
            put_label(t, w[i].name);
            put(t, "\",quantile=\"%s\"} %.17g\n", qn[k], q[k] / 1000.0);
        }
    }
}

static void worker_metrics(text *t, hub_registry *reg) {
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
    gauge(t, "moex_experts", "Routed experts in the model (layers x experts).", (double)c.experts);
    gauge(t, "moex_expert_coverage_ratio", "Experts with at least one ready replica, as a fraction of all.",
          c.experts ? (double)c.covered / (double)c.experts : 0.0);
    gauge(t, "moex_expert_replicas_ready", "Ready (worker, expert) pairs.", (double)c.replicas_ready);
    gauge(t, "moex_expert_replicas_wanted", "Replicas per expert (--replicas).", c.replicas);
}

char *hub_status_metrics(hub_status_src *s, size_t *len) {
    text t = {0};
    serving_metrics(&t, s);
    if (s->hub && s->distributed) {
        hub_counters(&t, moex_hub_counters(s->hub));
        worker_metrics(&t, moex_hub_registry(s->hub));
    }
    if (t.oom) {
        free(t.s);
        return NULL;
    }
    *len = t.len;
    return t.s;
}

/* ---- /status.json ---- */

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

static void add_model(cJSON *root, const hub_status_src *s) {
    const moex_hparams *hp = &s->m->hp;
    char desc[512];
    moex_model_describe(s->m, desc, sizeof desc);
    cJSON *m = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(m, "id", s->model_id);
    cJSON_AddStringToObject(m, "arch", hp->arch_name);
    cJSON_AddStringToObject(m, "description", desc);
    cJSON_AddStringToObject(m, "chat_template", s->chat_template);
    cJSON_AddNumberToObject(m, "layers", hp->n_layer);
    cJSON_AddNumberToObject(m, "experts", hp->n_expert);
    cJSON_AddNumberToObject(m, "experts_used", hp->n_expert_used);
    cJSON_AddNumberToObject(m, "vocab", hp->n_vocab);
}

static void add_serving(cJSON *root, const hub_status_src *s) {
    hub_sched_stats *st = s->sched;
    cJSON *o = cJSON_AddObjectToObject(root, "serving");
    cJSON_AddNumberToObject(o, "slots", s->sched_cfg.n_slots);
    cJSON_AddNumberToObject(o, "active", atomic_load(&st->active));
    cJSON_AddNumberToObject(o, "queued", atomic_load(&st->queued));
    cJSON_AddNumberToObject(o, "ctx_per_slot", (double)s->sched_cfg.n_ctx);
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)GET(st->prompt_tokens));
    cJSON_AddNumberToObject(o, "generated_tokens", (double)GET(st->generated_tokens));
    cJSON_AddNumberToObject(o, "completions", (double)(GET(st->finished_stop) + GET(st->finished_length)));
    cJSON_AddNumberToObject(o, "cancelled", (double)GET(st->cancelled));
}

char *hub_status_json(hub_status_src *s) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddNumberToObject(root, "time", moex_time_s());
    cJSON_AddNumberToObject(root, "uptime_s", moex_time_s() - s->t_start);
    cJSON_AddStringToObject(root, "mode", s->distributed ? "distributed" : "local");
    cJSON_AddStringToObject(root, "backend", s->backend);
    cJSON_AddStringToObject(root, "worker_page", "/worker");
    add_model(root, s);
    add_serving(root, s);
    if (s->hub && s->distributed) add_workers(root, moex_hub_registry(s->hub));
    else cJSON_AddArrayToObject(root, "workers");
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return out;
}
