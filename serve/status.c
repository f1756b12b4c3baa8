/* /metrics (Prometheus text format 0.0.4) and /status.json (status.h):
 * the scheduler's counters and histograms, the API's requests, the hub's
 * dispatch counters, each worker's record and the placement's coverage. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve/status.h"

static const char *const endpoint_names[SERVE_EP_COUNT] = {"chat", "completions", "models", "metrics", "status",
                                                         "other"};
static const unsigned code_values[SERVE_CODE_COUNT] = {200, 400, 401, 404, 405, 411, 413, 500, 503, 0};

void serve_api_count(serve_api_counters *c, int endpoint, unsigned status) {
    int k = SERVE_CODE_OTHER;
    for (int i = 0; i < SERVE_CODE_OTHER; i++)
        if (code_values[i] == status) k = i;
    atomic_fetch_add_explicit(&c->requests[endpoint][k], 1, memory_order_relaxed);
}

#define GET(x) ((unsigned long long)atomic_load_explicit(&(x), memory_order_relaxed))

static void histogram(moex_text *t, const char *name, const char *help, serve_hist *h) {
    moex_prom_family(t, name, "histogram", help);
    unsigned long long cum = 0;
    for (int b = 0; b <= SERVE_HIST_BUCKETS; b++) {
        cum += GET(h->count[b]);
        if (b < SERVE_HIST_BUCKETS) moex_text_printf(t, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[b], cum);
        else moex_text_printf(t, "%s_bucket{le=\"+Inf\"} %llu\n", name, cum);
    }
    moex_text_printf(t, "%s_sum %.17g\n%s_count %llu\n", name, atomic_load(&h->sum), name, cum);
}

/* ---- /metrics ---- */

static void serving_metrics(moex_text *t, serve_status_src *s) {
    serve_sched_stats *st = s->sched;
    moex_prom_family(t, "moex_info", "gauge", "The model served and how (always 1).");
    moex_text_printf(t, "moex_info{model=\"");
    moex_prom_label(t, s->model_id);
    moex_text_printf(t, "\",arch=\"");
    moex_prom_label(t, s->m->hp.arch_name);
    moex_text_printf(t, "\",backend=\"");
    moex_prom_label(t, s->backend);
    moex_text_printf(t, "\",chat_template=\"");
    moex_prom_label(t, s->chat_template);
    moex_text_printf(t, "\",mode=\"%s\"} 1\n", s->distributed ? "distributed" : "local");
    moex_prom_gauge(t, "moex_uptime_seconds", "Seconds since the server started.", moex_time_s() - s->t_start);

    moex_prom_family(t, "moex_requests_total", "counter", "Requests answered, by endpoint and HTTP status.");
    for (int e = 0; e < SERVE_EP_COUNT; e++)
        for (int c = 0; c < SERVE_CODE_COUNT; c++) {
            const unsigned long long n = GET(s->api.requests[e][c]);
            if (!n) continue;
            if (c == SERVE_CODE_OTHER) moex_text_printf(t, "moex_requests_total{endpoint=\"%s\",code=\"other\"} %llu\n", endpoint_names[e], n);
            else moex_text_printf(t, "moex_requests_total{endpoint=\"%s\",code=\"%u\"} %llu\n", endpoint_names[e], code_values[c], n);
        }
    moex_prom_counter(t, "moex_client_disconnects_total", "Clients gone before their response ended (their slots freed at once).",
            GET(s->api.disconnects));
    moex_prom_family(t, "moex_completions_total", "counter", "Generations ended, by reason.");
    moex_text_printf(t, "moex_completions_total{reason=\"stop\"} %llu\n", GET(st->finished_stop));
    moex_text_printf(t, "moex_completions_total{reason=\"length\"} %llu\n", GET(st->finished_length));
    moex_text_printf(t, "moex_completions_total{reason=\"cancelled\"} %llu\n", GET(st->cancelled));
    moex_text_printf(t, "moex_completions_total{reason=\"error\"} %llu\n", GET(st->failed));
    moex_text_printf(t, "moex_completions_total{reason=\"rejected\"} %llu\n", GET(st->rejected));
    moex_prom_counter(t, "moex_prompt_tokens_total", "Prompt tokens evaluated.", GET(st->prompt_tokens));
    moex_prom_counter(t, "moex_generated_tokens_total", "Tokens generated.", GET(st->generated_tokens));
    moex_prom_counter(t, "moex_prompt_cached_tokens_total",
                      "Prompt tokens whose KV a slot held from its previous request (the prompt cache).",
                      GET(st->prompt_cached));
    moex_prom_counter(t, "moex_grammar_tokens_total", "Tokens sampled under a grammar (response_format, grammar, "
                      "forced tool calls).", GET(st->grammar_tokens));
    moex_prom_counter(t, "moex_grammar_masked_tokens_total", "Of those, the ones whose first pick the grammar "
                      "refused: the whole vocabulary was masked and sampled again.", GET(st->grammar_masks));
    moex_prom_gauge(t, "moex_slots", "KV slots (--parallel): sequences that decode together.", s->sched_cfg.n_slots);
    moex_prom_gauge(t, "moex_slots_active", "Slots holding a request now.", atomic_load(&st->active));
    moex_prom_gauge(t, "moex_queue_length", "Requests waiting for a slot.", atomic_load(&st->queued));
    moex_prom_counter(t, "moex_forward_steps_total", "Forward passes (each over every active sequence).", GET(st->steps));
    moex_prom_counter(t, "moex_forward_tokens_total", "Tokens in those forward passes.", GET(st->step_tokens));
    histogram(t, "moex_time_to_first_token_seconds", "From a request's arrival to its first token.", &st->ttft);
    histogram(t, "moex_time_per_output_token_seconds", "Between one sequence's consecutive tokens.", &st->per_token);
    histogram(t, "moex_forward_seconds", "One forward pass of the batch.", &st->step_s);
    moex_prom_counter(t, "moex_spec_drafted_total", "Speculative decoding: tokens drafted (--lookup, --draft-model).",
                      GET(st->spec_drafted));
    moex_prom_counter(t, "moex_spec_accepted_total", "Speculative decoding: drafted tokens accepted.",
                      GET(st->spec_accepted));
    moex_prom_family(t, "moex_spec_verifies_total", "counter",
                     "Speculative decoding: a sequence's drafts checked in a forward, by how many were accepted.");
    for (int a = 0; a <= MOEX_SPEC_MAX_DRAFT; a++)
        moex_text_printf(t, "moex_spec_verifies_total{accepted=\"%d\"} %llu\n", a, GET(st->spec_hist[a]));
}

char *serve_status_metrics(serve_status_src *s, size_t *len) {
    moex_text t = {0};
    serving_metrics(&t, s);
    if (s->hub && s->distributed) moex_hub_metrics_text(s->hub, &t);
    if (t.oom) {
        free(t.s);
        return NULL;
    }
    *len = t.len;
    return t.s;
}

/* ---- /status.json ---- */

static void add_model(cJSON *root, const serve_status_src *s) {
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

static void add_serving(cJSON *root, const serve_status_src *s) {
    serve_sched_stats *st = s->sched;
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

char *serve_status_json(serve_status_src *s) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddNumberToObject(root, "time", moex_time_s());
    cJSON_AddNumberToObject(root, "uptime_s", moex_time_s() - s->t_start);
    cJSON_AddStringToObject(root, "mode", s->distributed ? "distributed" : "local");
    cJSON_AddStringToObject(root, "backend", s->backend);
    cJSON_AddStringToObject(root, "worker_page", "/worker");
    add_model(root, s);
    add_serving(root, s);
    if (s->hub && s->distributed) moex_hub_status_add(s->hub, root);
    else cJSON_AddArrayToObject(root, "workers");
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return out;
}
