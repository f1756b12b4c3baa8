/* The MoE plan: a layer's (token, expert) pairs grouped by expert with a
 * counting sort, and the combine that sums each token's k results in slot
 * order. One implementation for every executor: the sum, and so the tokens,
 * do not depend on where the experts ran. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

static int reserve(moex_moe_plan *p, int64_t n_pairs, int n_expert) {
    if (n_expert > p->cap_experts) {
        int32_t *count = realloc(p->count, (size_t)n_expert * sizeof *count);
        int32_t *ge = realloc(p->group_expert, (size_t)n_expert * sizeof *ge);
        if (count) p->count = count;
        if (ge) p->group_expert = ge;
        int32_t *gf = realloc(p->group_first, ((size_t)n_expert + 1) * sizeof *gf);
        if (gf) p->group_first = gf;
        if (!count || !ge || !gf) return -1;
        p->cap_experts = n_expert;
    }
    if (n_pairs > p->cap_pairs) {
        const size_t n = (size_t)n_pairs;
        free(p->rows);
        free(p->gates);
        free(p->slot_of_pair);
        p->rows = malloc(n * sizeof *p->rows);
        p->gates = malloc(n * sizeof *p->gates);
        p->slot_of_pair = malloc(n * sizeof *p->slot_of_pair);
        p->cap_pairs = p->rows && p->gates && p->slot_of_pair ? n_pairs : 0;
        if (!p->cap_pairs) return -1;
    }
    return 0;
}

int moex_moe_plan_build(moex_moe_plan *p, const moex_moe_request *req, int n_expert, moex_error *err) {
    const int k = req->n_used;
    const int64_t n_pairs = req->n_tokens * k;
    for (int64_t i = 0; i < n_pairs; i++) {
        const int32_t e = req->expert_ids[i];
        if (e < 0 || e >= n_expert)
            return moex_fail(err, "layer %d: the router chose expert %d of %d", req->layer, e, n_expert);
    }
    if (reserve(p, n_pairs, n_expert))
        return moex_fail(err, "layer %d: out of memory for %lld expert pairs", req->layer, (long long)n_pairs);
    memset(p->count, 0, (size_t)n_expert * sizeof *p->count);
    for (int64_t i = 0; i < n_pairs; i++) p->count[req->expert_ids[i]]++;
    p->n_groups = 0;
    int32_t off = 0;
    for (int e = 0; e < n_expert; e++) {
        if (!p->count[e]) continue;
        p->group_expert[p->n_groups] = e;
        p->group_first[p->n_groups++] = off;
        const int32_t c = p->count[e];
        p->count[e] = off; /* now the fill cursor of e's group */
        off += c;
    }
    p->group_first[p->n_groups] = off;
    for (int64_t i = 0; i < n_pairs; i++) {
        const int32_t g = p->count[req->expert_ids[i]]++;
        p->rows[g] = (int32_t)(i / k);
        p->gates[g] = req->gate_weights[i];
        p->slot_of_pair[i] = g;
    }
    p->n_pairs = n_pairs;
    return 0;
}

void moex_moe_plan_combine(const moex_moe_plan *p, const moex_moe_request *req, const float *results, int64_t dim) {
    moex_moe_plan_combine_tokens(p, req, results, dim, 0, req->n_tokens);
}

void moex_moe_plan_combine_tokens(const moex_moe_plan *p, const moex_moe_request *req, const float *results,
                                  int64_t dim, int64_t t0, int64_t t1) {
    const int k = req->n_used;
    for (int64_t t = t0; t < t1; t++) {
        float *o = req->out + t * dim;
        memcpy(o, results + (size_t)p->slot_of_pair[t * k] * dim, (size_t)dim * sizeof(float));
        for (int j = 1; j < k; j++) {
            const float *r = results + (size_t)p->slot_of_pair[t * k + j] * dim;
            for (int64_t i = 0; i < dim; i++) o[i] += r[i];
        }
    }
}

void moex_moe_plan_free(moex_moe_plan *p) {
    free(p->group_expert);
    free(p->group_first);
    free(p->rows);
    free(p->gates);
    free(p->slot_of_pair);
    free(p->count);
    memset(p, 0, sizeof *p);
}
