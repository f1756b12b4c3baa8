/* The routing recorder: an expert executor that notes which experts the
 * router chose for every token and layer, then hands the request on to the
 * executor it wraps (so the results are the same as without it).
 *
 * A forward pass calls the executor once per MoE layer, layers in order, for
 * the same tokens; a call for layer 0 therefore starts the next tokens.
 * The trace file (read by moex-sim token --route-trace and
 * train/routing_stats.py) is text:
 *   # moex routing trace
 *   layers L experts E k K tokens T
 *   then one line per token: L groups of K expert ids, best first, groups
 *   separated by " | ". */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

struct moex_route_recorder {
    moex_expert_executor inner;
    int n_layer, n_expert, k;
    int64_t n_tokens, cap;     /* tokens recorded / room for */
    int64_t batch_first;       /* first token of the forward pass in progress */
    int32_t *ids;              /* [token][layer][k] */
};

moex_route_recorder *moex_route_recorder_create(moex_expert_executor inner, const moex_hparams *hp) {
    if (!moex_hparams_is_moe(hp)) return NULL;
    moex_route_recorder *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    *r = (moex_route_recorder){.inner = inner, .n_layer = hp->n_layer, .n_expert = hp->n_expert,
                               .k = hp->n_expert_used};
    return r;
}

void moex_route_recorder_free(moex_route_recorder *r) {
    if (!r) return;
    free(r->ids);
    free(r);
}

static int reserve(moex_route_recorder *r, int64_t n_tokens) {
    if (n_tokens <= r->cap) return 0;
    int64_t cap = r->cap ? r->cap : 1024;
    while (cap < n_tokens) cap *= 2;
    int32_t *ids = realloc(r->ids, (size_t)cap * (size_t)r->n_layer * (size_t)r->k * sizeof *ids);
    if (!ids) return -1;
    r->ids = ids;
    r->cap = cap;
    return 0;
}

static int record_run(void *ctx, const moex_moe_request *req, moex_error *err) {
    moex_route_recorder *r = ctx;
    if (req->n_used != r->k || req->layer < 0 || req->layer >= r->n_layer)
        return moex_fail(err, "routing recorder: layer %d with %d experts per token does not fit the model",
                         req->layer, req->n_used);
    if (req->layer == 0) {
        r->batch_first = r->n_tokens;
        if (reserve(r, r->n_tokens + req->n_tokens))
            return moex_fail(err, "out of memory recording the routes of %lld tokens",
                             (long long)(r->n_tokens + req->n_tokens));
        r->n_tokens += req->n_tokens;
    } else if (r->batch_first + req->n_tokens != r->n_tokens) {
        return moex_fail(err, "routing recorder: layer %d saw %lld tokens, layer 0 saw %lld", req->layer,
                         (long long)req->n_tokens, (long long)(r->n_tokens - r->batch_first));
    }
    for (int64_t t = 0; t < req->n_tokens; t++)
        memcpy(r->ids + ((size_t)(r->batch_first + t) * r->n_layer + req->layer) * r->k, req->expert_ids + t * r->k,
               (size_t)r->k * sizeof *r->ids);
    return r->inner.run(r->inner.ctx, req, err);
}

moex_expert_executor moex_route_recorder_iface(moex_route_recorder *r) {
    return (moex_expert_executor){.ctx = r, .run = record_run};
}

int64_t moex_route_recorder_tokens(const moex_route_recorder *r) { return r->n_tokens; }

int moex_route_recorder_write(const moex_route_recorder *r, const char *path, moex_error *err) {
    FILE *f = fopen(path, "w");
    if (!f) return moex_fail(err, "cannot write %s: %s", path, strerror(errno));
    fprintf(f, "# moex routing trace\nlayers %d experts %d k %d tokens %lld\n", r->n_layer, r->n_expert, r->k,
            (long long)r->n_tokens);
    for (int64_t t = 0; t < r->n_tokens; t++)
        for (int l = 0; l < r->n_layer; l++)
            for (int j = 0; j < r->k; j++) {
                const int32_t *id = r->ids + ((size_t)t * r->n_layer + l) * r->k + j;
                fprintf(f, "%d%s", *id, j + 1 < r->k ? " " : l + 1 < r->n_layer ? " | " : "\n");
            }
    return fclose(f) ? moex_fail(err, "writing %s failed", path) : 0;
}
