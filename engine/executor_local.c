/* The local expert executor: groups a layer's (token, expert) pairs by
 * expert, runs all active experts in one kernel call, and combines each
 * token's k results in slot order (so the sum is the same whatever ran them). */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

struct moex_local_executor {
    const moex_model *m;
    moex_pool *pool;
    int wire_dtype;
    float *x_wire;            /* the request's x as the wire carries it */
    uint8_t *tmp;             /* one row in wire form */
    int64_t cap_pairs;        /* buffers below hold this many (token, expert) pairs */
    int32_t *count;           /* n_expert: pairs per expert */
    int32_t *first;           /* n_expert: first pair of each expert in grouped order */
    int32_t *rows;            /* grouped: token index of each pair */
    float *gates;             /* grouped: gate weight of each pair */
    int32_t *slot_of_pair;    /* token-major slot (t*k + j) -> grouped pair index */
    float *results;           /* grouped: n_embd floats per pair */
    moex_expert_job *jobs;    /* n_expert */
};

moex_local_executor *moex_local_executor_create(const moex_model *m, moex_pool *pool, int wire_dtype) {
    moex_local_executor *le = calloc(1, sizeof *le);
    if (!le) return NULL;
    le->m = m;
    le->pool = pool;
    le->wire_dtype = wire_dtype;
    le->tmp = malloc(moex_wire_tmp_bytes(m->hp.n_embd));
    const size_t ne = (size_t)(m->hp.n_expert > 0 ? m->hp.n_expert : 1);
    le->count = calloc(ne, sizeof *le->count);
    le->first = calloc(ne, sizeof *le->first);
    le->jobs = calloc(ne, sizeof *le->jobs);
    if (!le->count || !le->first || !le->jobs || !le->tmp) {
        moex_local_executor_free(le);
        return NULL;
    }
    return le;
}

void moex_local_executor_free(moex_local_executor *le) {
    if (!le) return;
    free(le->count);
    free(le->first);
    free(le->rows);
    free(le->gates);
    free(le->slot_of_pair);
    free(le->results);
    free(le->x_wire);
    free(le->tmp);
    free(le->jobs);
    free(le);
}

/* Grows the pair buffers; done once per batch size, never per decode token. */
static int reserve_pairs(moex_local_executor *le, int64_t n_pairs) {
    if (n_pairs <= le->cap_pairs) return 0;
    const size_t n = (size_t)n_pairs, d = (size_t)le->m->hp.n_embd;
    free(le->rows);
    free(le->gates);
    free(le->slot_of_pair);
    free(le->results);
    free(le->x_wire);
    le->rows = malloc(n * sizeof *le->rows);
    le->gates = malloc(n * sizeof *le->gates);
    le->slot_of_pair = malloc(n * sizeof *le->slot_of_pair);
    le->results = malloc(n * d * sizeof *le->results);
    le->x_wire = malloc(n * d * sizeof *le->x_wire); /* n_pairs >= n_tokens */
    le->cap_pairs = (le->rows && le->gates && le->slot_of_pair && le->results && le->x_wire) ? n_pairs : 0;
    return le->cap_pairs ? 0 : -1;
}

static int local_run(void *ctx, const moex_moe_request *req, moex_error *err) {
    moex_local_executor *le = ctx;
    const moex_model *m = le->m;
    const int n_expert = m->hp.n_expert, k = req->n_used;
    const int64_t n_pairs = req->n_tokens * k, d = m->hp.n_embd;
    if (reserve_pairs(le, n_pairs)) return moex_fail(err, "out of memory for %lld expert pairs", (long long)n_pairs);

    memset(le->count, 0, (size_t)n_expert * sizeof *le->count);
    for (int64_t p = 0; p < n_pairs; p++) {
        int32_t e = req->expert_ids[p];
        if (e < 0 || e >= n_expert) return moex_fail(err, "router chose expert %d of %d", e, n_expert);
        le->count[e]++;
    }
    int n_jobs = 0;
    for (int e = 0, off = 0; e < n_expert; e++) {
        le->first[e] = off;
        if (le->count[e]) {
            le->jobs[n_jobs++] = (moex_expert_job){.w = &m->layers[req->layer].experts[e], .n_tokens = le->count[e],
                                                   .rows = le->rows + off, .gates = le->gates + off,
                                                   .out = le->results + (size_t)off * d};
        }
        off += le->count[e];
        le->count[e] = 0; /* reused as a fill cursor below */
    }
    for (int64_t p = 0; p < n_pairs; p++) {
        int32_t e = req->expert_ids[p];
        int32_t g = le->first[e] + le->count[e]++;
        le->rows[g] = (int32_t)(p / k);
        le->gates[g] = req->gate_weights[p];
        le->slot_of_pair[p] = g;
    }
    const float *x = req->x;
    if (le->wire_dtype != MOEX_WIRE_EXACT) {
        memcpy(le->x_wire, req->x, (size_t)(req->n_tokens * d) * sizeof(float));
        moex_wire_round_rows(le->wire_dtype, le->x_wire, req->n_tokens, d, le->tmp);
        moex_wire_round_gates(le->wire_dtype, le->gates, n_pairs);
        x = le->x_wire;
    }
    if (moex_experts_run(le->pool, le->jobs, n_jobs, x, d, err))
        return moex_error_prefix(err, "layer %d experts", req->layer);
    moex_wire_round_rows(le->wire_dtype, le->results, n_pairs, d, le->tmp);
    for (int64_t t = 0; t < req->n_tokens; t++) {
        float *o = req->out + t * d;
        memcpy(o, le->results + (size_t)le->slot_of_pair[t * k] * d, (size_t)d * sizeof(float));
        for (int j = 1; j < k; j++) {
            const float *r = le->results + (size_t)le->slot_of_pair[t * k + j] * d;
            for (int64_t i = 0; i < d; i++) o[i] += r[i];
        }
    }
    return 0;
}

moex_expert_executor moex_local_executor_iface(moex_local_executor *le) {
    return (moex_expert_executor){.ctx = le, .run = local_run};
}
