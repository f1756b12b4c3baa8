/* The local expert executor: a layer's experts computed in this process, in
 * one moex_experts_run call over every active expert, rounded at the expert
 * boundary as the wire would (so --local prints what hub + workers print),
 * and combined through the shared MoE plan. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

struct moex_local_executor {
    const moex_model *m;
    moex_pool *pool;
    int wire_dtype;
    moex_moe_plan plan;
    float *x_wire;            /* [cap_tokens x n_embd] the request's x as the wire carries it */
    float *results;           /* [cap_pairs x n_embd] grouped results */
    int64_t cap_tokens, cap_pairs;
    uint8_t *tmp;             /* one row in wire form */
    moex_expert_job *jobs;    /* [n_expert] */
};

moex_local_executor *moex_local_executor_create(const moex_model *m, moex_pool *pool, int wire_dtype) {
    moex_local_executor *le = calloc(1, sizeof *le);
    if (!le) return NULL;
    le->m = m;
    le->pool = pool;
    le->wire_dtype = wire_dtype;
    le->tmp = malloc(moex_wire_tmp_bytes(m->hp.n_embd));
    le->jobs = calloc((size_t)(m->hp.n_expert > 0 ? m->hp.n_expert : 1), sizeof *le->jobs);
    if (!le->tmp || !le->jobs) {
        moex_local_executor_free(le);
        return NULL;
    }
    return le;
}

void moex_local_executor_free(moex_local_executor *le) {
    if (!le) return;
    moex_moe_plan_free(&le->plan);
    free(le->x_wire);
    free(le->results);
    free(le->tmp);
    free(le->jobs);
    free(le);
}

/* Grows the activation buffers; once per batch size, never per decode token. */
static int reserve(moex_local_executor *le, int64_t n_tokens, int64_t n_pairs) {
    const size_t d = (size_t)le->m->hp.n_embd;
    if (n_tokens > le->cap_tokens) {
        free(le->x_wire);
        le->x_wire = malloc((size_t)n_tokens * d * sizeof *le->x_wire);
        le->cap_tokens = le->x_wire ? n_tokens : 0;
    }
    if (n_pairs > le->cap_pairs) {
        free(le->results);
        le->results = malloc((size_t)n_pairs * d * sizeof *le->results);
        le->cap_pairs = le->results ? n_pairs : 0;
    }
    return le->x_wire && le->results ? 0 : -1;
}

int moex_experts_run_wire(moex_pool *pool, const moex_expert_job *jobs, int n_jobs, const float *x_wire, int64_t hidden,
                          int wire_dtype, uint8_t *tmp, moex_error *err) {
    if (moex_experts_run(pool, jobs, n_jobs, x_wire, hidden, err)) return -1;
    for (int j = 0; j < n_jobs; j++) moex_wire_round_rows(wire_dtype, jobs[j].out, jobs[j].n_tokens, hidden, tmp);
    return 0;
}

static int local_run(void *ctx, const moex_moe_request *req, moex_error *err) {
    moex_local_executor *le = ctx;
    const int64_t d = le->m->hp.n_embd;
    moex_moe_plan *p = &le->plan;
    if (moex_moe_plan_build(p, req, le->m->hp.n_expert, err)) return -1;
    if (reserve(le, req->n_tokens, p->n_pairs))
        return moex_fail(err, "layer %d: out of memory for %lld expert pairs", req->layer, (long long)p->n_pairs);
    const float *x = req->x;
    if (le->wire_dtype != MOEX_WIRE_EXACT) {
        memcpy(le->x_wire, req->x, (size_t)(req->n_tokens * d) * sizeof(float));
        moex_wire_round_rows(le->wire_dtype, le->x_wire, req->n_tokens, d, le->tmp);
        moex_wire_round_gates(le->wire_dtype, p->gates, p->n_pairs);
        x = le->x_wire;
    }
    for (int g = 0; g < p->n_groups; g++) {
        const int32_t first = p->group_first[g];
        le->jobs[g] = (moex_expert_job){.w = &le->m->layers[req->layer].experts[p->group_expert[g]],
                                        .n_tokens = p->group_first[g + 1] - first, .rows = p->rows + first,
                                        .gates = p->gates + first, .out = le->results + (size_t)first * d};
    }
    if (moex_experts_run_wire(le->pool, le->jobs, p->n_groups, x, d, le->wire_dtype, le->tmp, err))
        return moex_error_prefix(err, "layer %d experts", req->layer);
    moex_moe_plan_combine(p, req, le->results, d);
    return 0;
}

moex_expert_executor moex_local_executor_iface(moex_local_executor *le) {
    return (moex_expert_executor){.ctx = le, .run = local_run};
}
