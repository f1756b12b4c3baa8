/* The transformer forward pass, read top to bottom: embeddings, then per
 * layer attention and FFN (dense or MoE through the expert executor), then the
 * output head. A call evaluates a batch of tokens; decode is a batch of one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

struct moex_state {
    const moex_model *m;
    moex_pool *pool;
    moex_expert_executor exec;
    int64_t n_ctx, n_batch;    /* n_ctx: positions per slot */
    int n_seq;                 /* KV slots */
    float *k_cache, *v_cache;  /* [layer][slot][n_ctx][kv_dim] */
    float *k_new, *v_new;      /* a forward's new K and V, n_batch x kv_dim, before they go to their rows */
    int32_t *seq, *pos;        /* n_batch: moex_forward's tokens as a batch (slot 0, consecutive positions) */
    bool *want;
    float *x;                  /* residual stream, n_batch x n_embd */
    float *xn;                 /* normed input of a block */
    float *q, *att;            /* n_batch x q_dim */
    float *proj;               /* block output, n_batch x n_embd */
    float *ff_g, *ff_u;        /* dense FFN, n_batch x n_ff */
    float *router;             /* n_batch x n_expert */
    int32_t *topk_ids;         /* n_batch x k */
    float *topk_w;
};

static int64_t q_dim(const moex_hparams *hp) { return (int64_t)hp->n_head * hp->head_dim; }
static int64_t kv_dim(const moex_hparams *hp) { return (int64_t)hp->n_head_kv * hp->head_dim; }

moex_state *moex_state_create(const moex_model *m, int64_t n_ctx, int64_t n_batch, moex_pool *pool,
                              moex_expert_executor exec, moex_error *err) {
    return moex_state_create_multi(m, n_ctx, n_batch, 1, pool, exec, err);
}

moex_state *moex_state_create_multi(const moex_model *m, int64_t n_ctx, int64_t n_batch, int n_seq, moex_pool *pool,
                                    moex_expert_executor exec, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    if (n_ctx <= 0 || n_batch <= 0 || n_seq <= 0) {
        moex_fail(err, "context (%lld), batch (%lld) and slots (%d) must be positive", (long long)n_ctx,
                  (long long)n_batch, n_seq);
        return NULL;
    }
    if (n_batch > n_ctx * n_seq) n_batch = n_ctx * n_seq;
    moex_state *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->m = m;
    s->pool = pool;
    s->exec = exec;
    s->n_ctx = n_ctx;
    s->n_batch = n_batch;
    s->n_seq = n_seq;
    const size_t cache = (size_t)hp->n_layer * (size_t)n_seq * (size_t)n_ctx * (size_t)kv_dim(hp);
    const size_t nb = (size_t)n_batch, d = (size_t)hp->n_embd;
    s->k_cache = calloc(cache, sizeof(float));
    s->v_cache = calloc(cache, sizeof(float));
    s->k_new = malloc(nb * (size_t)kv_dim(hp) * sizeof(float));
    s->v_new = malloc(nb * (size_t)kv_dim(hp) * sizeof(float));
    s->seq = malloc(nb * sizeof *s->seq);
    s->pos = malloc(nb * sizeof *s->pos);
    s->want = malloc(nb * sizeof *s->want);
    if (!s->k_new || !s->v_new || !s->seq || !s->pos || !s->want) goto oom;
    s->x = malloc(nb * d * sizeof(float));
    s->xn = malloc(nb * d * sizeof(float));
    s->q = malloc(nb * (size_t)q_dim(hp) * sizeof(float));
    s->att = malloc(nb * (size_t)q_dim(hp) * sizeof(float));
    s->proj = malloc(nb * d * sizeof(float));
    if (!s->k_cache || !s->v_cache || !s->x || !s->xn || !s->q || !s->att || !s->proj) goto oom;
    if (moex_hparams_is_moe(hp)) {
        s->router = malloc(nb * (size_t)hp->n_expert * sizeof(float));
        s->topk_ids = malloc(nb * (size_t)hp->n_expert_used * sizeof(int32_t));
        s->topk_w = malloc(nb * (size_t)hp->n_expert_used * sizeof(float));
        if (!s->router || !s->topk_ids || !s->topk_w) goto oom;
    } else {
        s->ff_g = malloc(nb * (size_t)hp->n_ff * sizeof(float));
        s->ff_u = malloc(nb * (size_t)hp->n_ff * sizeof(float));
        if (!s->ff_g || !s->ff_u) goto oom;
    }
    return s;
oom:
    moex_fail(err, "out of memory for %d slot(s) of %lld positions (try a smaller --ctx or fewer slots)", n_seq,
              (long long)n_ctx);
    moex_state_free(s);
    return NULL;
}

void moex_state_free(moex_state *s) {
    if (!s) return;
    free(s->k_cache);
    free(s->v_cache);
    free(s->k_new);
    free(s->v_new);
    free(s->seq);
    free(s->pos);
    free(s->want);
    free(s->x);
    free(s->xn);
    free(s->q);
    free(s->att);
    free(s->proj);
    free(s->ff_g);
    free(s->ff_u);
    free(s->router);
    free(s->topk_ids);
    free(s->topk_w);
    free(s);
}

int64_t moex_state_n_ctx(const moex_state *s) { return s->n_ctx; }
int64_t moex_state_n_batch(const moex_state *s) { return s->n_batch; }

static void rmsnorm_rows(float *out, const float *x, const float *w, int64_t n_rows, int64_t dim, float eps) {
    for (int64_t t = 0; t < n_rows; t++) moex_rmsnorm(out + t * dim, x + t * dim, w, dim, eps);
}

static void add_rows(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

static int embed_tokens(const moex_model *m, moex_state *s, const int32_t *tokens, int64_t n, moex_error *err) {
    const moex_matrix *e = &m->tok_embd;
    for (int64_t t = 0; t < n; t++)
        if (moex_dequantize_row(e->type, (const uint8_t *)e->data + (size_t)tokens[t] * e->row_bytes,
                                s->x + t * e->cols, e->cols, err))
            return -1;
    return 0;
}

/* Layer il's K and V cache of one slot: [n_ctx][kv_dim] each. */
static float *cache_of(const moex_state *s, float *cache, int il, int seq) {
    const size_t per_slot = (size_t)s->n_ctx * (size_t)kv_dim(&s->m->hp);
    return cache + ((size_t)il * (size_t)s->n_seq + (size_t)seq) * per_slot;
}

/* Self-attention of layer il for the batch's n tokens; result in s->proj.
 * Every token's K and V go to its slot's row first; then each run of
 * consecutive tokens of one slot at consecutive positions attends (causally)
 * over that slot's cache. */
static int attention_block(const moex_model *m, moex_state *s, int il, const moex_batch *b, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    const moex_layer *L = &m->layers[il];
    const int64_t kvd = kv_dim(hp), hd = hp->head_dim, qd = q_dim(hp), n = b->n;
    const moex_matrix w[3] = {L->wq, L->wk, L->wv};
    float *ys[3] = {s->q, s->k_new, s->v_new};

    rmsnorm_rows(s->xn, s->x, L->attn_norm, n, hp->n_embd, hp->rms_eps);
    if (moex_matmul_multi(s->pool, w, 3, s->xn, n, ys, err)) return moex_error_prefix(err, "q/k/v");
    for (int64_t t = 0; t < n; t++) {
        float *qt = s->q + t * qd, *kt = s->k_new + t * kvd;
        if (hp->qk_norm) {
            rmsnorm_rows(qt, qt, L->q_norm, hp->n_head, hd, hp->rms_eps);
            rmsnorm_rows(kt, kt, L->k_norm, hp->n_head_kv, hd, hp->rms_eps);
        }
        moex_rope(qt, hp->n_head, (int)hd, hp->rope_dim, b->pos[t], hp->rope_freq_base, hp->rope_neox);
        moex_rope(kt, hp->n_head_kv, (int)hd, hp->rope_dim, b->pos[t], hp->rope_freq_base, hp->rope_neox);
        const size_t row = (size_t)b->pos[t] * (size_t)kvd;
        memcpy(cache_of(s, s->k_cache, il, b->seq[t]) + row, kt, (size_t)kvd * sizeof(float));
        memcpy(cache_of(s, s->v_cache, il, b->seq[t]) + row, s->v_new + t * kvd, (size_t)kvd * sizeof(float));
    }
    for (int64_t t0 = 0, t1; t0 < n; t0 = t1) {
        for (t1 = t0 + 1; t1 < n && b->seq[t1] == b->seq[t0] && b->pos[t1] == b->pos[t1 - 1] + 1; t1++) {}
        if (moex_attention(s->pool, s->q + t0 * qd, cache_of(s, s->k_cache, il, b->seq[t0]),
                           cache_of(s, s->v_cache, il, b->seq[t0]), s->att + t0 * qd, t1 - t0, b->pos[t0],
                           hp->n_head, hp->n_head_kv, (int)hd, 1.0f / sqrtf((float)hd), err))
            return -1;
    }
    if (moex_matmul(s->pool, &L->wo, s->att, n, s->proj, err)) return moex_error_prefix(err, "output projection");
    return 0;
}

static int dense_ffn_block(const moex_model *m, moex_state *s, int il, int64_t n, moex_error *err) {
    const moex_layer *L = &m->layers[il];
    const moex_matrix w[2] = {L->ffn_gate, L->ffn_up};
    float *ys[2] = {s->ff_g, s->ff_u};
    if (moex_matmul_multi(s->pool, w, 2, s->xn, n, ys, err)) return moex_error_prefix(err, "gate/up");
    moex_swiglu(s->ff_g, s->ff_g, s->ff_u, n * m->hp.n_ff);
    if (moex_matmul(s->pool, &L->ffn_down, s->ff_g, n, s->proj, err)) return moex_error_prefix(err, "down");
    return 0;
}

/* Router: softmax over all experts (in place), keep the k largest (ties: lower
 * id), renormalise them to sum 1. -1 when the scores are not finite: no
 * expert can be chosen from them (the hidden state went bad upstream). */
static int route_token(float *probs, int n_expert, int k, bool norm, int32_t *ids, float *w) {
    for (int e = 0; e < n_expert; e++)
        if (!isfinite(probs[e])) return -1;
    moex_softmax(probs, n_expert);
    float sum = 0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n_expert; e++)
            if (probs[e] >= 0 && (best < 0 || probs[e] > probs[best])) best = e;
        if (best < 0) return -1;
        ids[j] = best;
        w[j] = probs[best];
        sum += w[j];
        probs[best] = -1.0f; /* taken */
    }
    if (norm)
        for (int j = 0; j < k; j++) w[j] /= sum;
    return 0;
}

static int moe_ffn_block(const moex_model *m, moex_state *s, int il, int64_t n, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    const int k = hp->n_expert_used;
    if (moex_matmul(s->pool, &m->layers[il].router, s->xn, n, s->router, err))
        return moex_error_prefix(err, "layer %d router", il);
    for (int64_t t = 0; t < n; t++)
        if (route_token(s->router + t * hp->n_expert, hp->n_expert, k, hp->norm_topk, s->topk_ids + t * k,
                        s->topk_w + t * k))
            return moex_fail(err, "layer %d: the router's scores for token %lld are not finite", il, (long long)t);
    moex_moe_request req = {.layer = il, .n_tokens = n, .n_used = k, .expert_ids = s->topk_ids,
                            .gate_weights = s->topk_w, .x = s->xn, .out = s->proj};
    return s->exec.run(s->exec.ctx, &req, err);   /* executors name the layer themselves */
}

/* Logits of the wanted tokens, one row each in batch order. */
static int output_head(const moex_model *m, moex_state *s, const moex_batch *b, float *logits, moex_error *err) {
    const int64_t d = m->hp.n_embd;
    int64_t rows = 0;
    for (int64_t t = 0; t < b->n; t++)
        if (b->want_logits[t]) moex_rmsnorm(s->xn + rows++ * d, s->x + t * d, m->output_norm, d, m->hp.rms_eps);
    return rows ? moex_matmul(s->pool, &m->output, s->xn, rows, logits, err) : 0;
}

int moex_forward_check(const moex_model *m, int64_t n_batch, int64_t n_ctx, const int32_t *tokens, int64_t n,
                       int64_t pos, moex_error *err) {
    if (n <= 0 || n > n_batch) return moex_fail(err, "batch of %lld tokens (limit %lld)", (long long)n, (long long)n_batch);
    if (pos < 0 || pos + n > n_ctx)
        return moex_fail(err, "positions %lld..%lld exceed the context of %lld (use a larger --ctx)", (long long)pos,
                         (long long)(pos + n - 1), (long long)n_ctx);
    for (int64_t t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= m->hp.n_vocab)
            return moex_fail(err, "token id %d at index %lld is outside the vocabulary (0..%d)", tokens[t],
                             (long long)t, m->hp.n_vocab - 1);
    return 0;
}

/* The batch's checks, before anything changes: size, slots, positions
 * (within the context, increasing within a slot), token ids. */
static int batch_check(const moex_model *m, const moex_state *s, const moex_batch *b, moex_error *err) {
    if (b->n <= 0 || b->n > s->n_batch)
        return moex_fail(err, "batch of %lld tokens (limit %lld)", (long long)b->n, (long long)s->n_batch);
    for (int64_t t = 0; t < b->n; t++) {
        if (b->seq[t] < 0 || b->seq[t] >= s->n_seq)
            return moex_fail(err, "token %lld names slot %d; the state has %d", (long long)t, b->seq[t], s->n_seq);
        if (b->pos[t] < 0 || b->pos[t] >= s->n_ctx)
            return moex_fail(err, "token %lld is at position %d, outside the context of %lld (use a larger --ctx)",
                             (long long)t, b->pos[t], (long long)s->n_ctx);
        if (b->tokens[t] < 0 || b->tokens[t] >= m->hp.n_vocab)
            return moex_fail(err, "token id %d at index %lld is outside the vocabulary (0..%d)", b->tokens[t],
                             (long long)t, m->hp.n_vocab - 1);
        for (int64_t u = t + 1; u < b->n; u++)
            if (b->seq[u] == b->seq[t] && b->pos[u] <= b->pos[t])
                return moex_fail(err, "slot %d: position %d follows position %d (a slot's tokens come in position "
                                 "order)", b->seq[t], b->pos[u], b->pos[t]);
    }
    return 0;
}

static int forward_run(const moex_model *m, moex_state *s, const moex_batch *b, float *logits, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    const int64_t n = b->n;
    if (embed_tokens(m, s, b->tokens, n, err)) return moex_error_prefix(err, "token embedding");
    const int64_t nd = n * hp->n_embd;
    for (int il = 0; il < hp->n_layer; il++) {
        if (attention_block(m, s, il, b, err)) return moex_error_prefix(err, "layer %d attention", il);
        add_rows(s->x, s->proj, nd);
        rmsnorm_rows(s->xn, s->x, m->layers[il].ffn_norm, n, hp->n_embd, hp->rms_eps);
        if (moex_hparams_is_moe(hp)) {
            if (moe_ffn_block(m, s, il, n, err)) return -1;
        } else if (dense_ffn_block(m, s, il, n, err)) {
            return moex_error_prefix(err, "layer %d feed-forward", il);
        }
        add_rows(s->x, s->proj, nd);
    }
    if (output_head(m, s, b, logits, err)) return moex_error_prefix(err, "output head");
    return 0;
}

int moex_forward_batch(const moex_model *m, moex_state *s, const moex_batch *b, float *logits, moex_error *err) {
    if (batch_check(m, s, b, err)) return -1;
    return forward_run(m, s, b, logits, err);
}

int moex_forward(const moex_model *m, moex_state *s, const int32_t *tokens, int64_t n, int64_t pos,
                 bool all_logits, float *logits, moex_error *err) {
    if (moex_forward_check(m, s->n_batch, s->n_ctx, tokens, n, pos, err)) return -1;
    for (int64_t t = 0; t < n; t++) {
        s->seq[t] = 0;
        s->pos[t] = (int32_t)(pos + t);
        s->want[t] = all_logits || t == n - 1;
    }
    const moex_batch b = {.n = n, .tokens = tokens, .seq = s->seq, .pos = s->pos, .want_logits = s->want};
    return forward_run(m, s, &b, logits, err);
}

static int cpu_forward(void *ctx, const int32_t *tokens, int64_t n, int64_t pos, bool all_logits, float *logits,
                       moex_error *err) {
    moex_state *s = ctx;
    return moex_forward(s->m, s, tokens, n, pos, all_logits, logits, err);
}

static int cpu_forward_batch(void *ctx, const moex_batch *b, float *logits, moex_error *err) {
    moex_state *s = ctx;
    return moex_forward_batch(s->m, s, b, logits, err);
}

/* moex_engine.copy_rows: slot from's K and V rows [0, n) into slot to, every layer. */
static int cpu_copy_rows(void *ctx, int from, int to, int64_t n, moex_error *err) {
    moex_state *s = ctx;
    if (from < 0 || to < 0 || from >= s->n_seq || to >= s->n_seq || n < 0 || n > s->n_ctx)
        return moex_fail(err, "copying KV rows: slots %d -> %d of %d, %lld rows of %lld", from, to, s->n_seq,
                         (long long)n, (long long)s->n_ctx);
    const size_t bytes = (size_t)n * (size_t)kv_dim(&s->m->hp) * sizeof(float);
    for (int il = 0; il < s->m->hp.n_layer && from != to; il++) {
        memcpy(cache_of(s, s->k_cache, il, to), cache_of(s, s->k_cache, il, from), bytes);
        memcpy(cache_of(s, s->v_cache, il, to), cache_of(s, s->v_cache, il, from), bytes);
    }
    return 0;
}

moex_engine moex_engine_cpu(moex_state *s) {
    return (moex_engine){.ctx = s, .forward = cpu_forward, .n_ctx = s->n_ctx, .n_batch = s->n_batch,
                         .n_seq = s->n_seq, .forward_batch = cpu_forward_batch,
                         .copy_rows = s->n_seq > 1 ? cpu_copy_rows : NULL};
}
