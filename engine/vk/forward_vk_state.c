/* The Vulkan state's public face, the top layer of the Vulkan forward pass
 * (see forward_vk_internal.h): creation wires the layers below together
 * (check the model, the device, the memory plan, the distributed path's
 * executor), moex_vk_forward and moex_vk_forward_batch pick the local or the
 * distributed path, and free takes it all down in reverse. */
#include <math.h>
#include <stdlib.h>

#include "engine/vk/forward_vk_internal.h"

static int check_model(const moex_model *m, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    if (hp->n_embd % 32 || (moex_hparams_is_moe(hp) ? hp->n_ff_exp : hp->n_ff) % 32)
        return moex_fail(err, "vulkan: hidden and FFN sizes must be multiples of 32");
    if (hp->head_dim > 512 || hp->head_dim % 4) return moex_fail(err, "vulkan: head_dim %d is not supported", hp->head_dim);
    if (moex_hparams_is_moe(hp) && hp->n_expert > 512)
        return moex_fail(err, "vulkan: %d experts (the GPU router handles up to 512)", hp->n_expert);
    return 0;
}

/* Rounding buffer for the largest product input of a batch. */
static int set_rounding(const moex_model *m, moex_vk_state *s, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    int64_t w = hp->n_embd;
    const int64_t cand[3] = {(int64_t)hp->n_head * hp->head_dim, hp->n_ff, (int64_t)hp->n_expert_used * hp->n_ff_exp};
    for (int i = 0; i < 3; i++) w = cand[i] > w ? cand[i] : w;
    return moex_vk_set_activation_rounding(s->vk, (size_t)(s->n_batch * w), err);
}

/* The local path's pipelines and recordings, timed. */
static int warm(const moex_model *m, moex_vk_state *s, bool batches, moex_error *err) {
    const double t0 = moex_time_s();
    if (vk_local_warm(m, s, batches, err)) return -1;
    moex_log(MOEX_LOG_INFO, "vulkan: pipelines ready in %.2f s", moex_time_s() - t0);
    return 0;
}

/* experts_remote: the experts' weights stay off the GPU (an executor runs them).
 * batches: made for moex_vk_forward_batch (its pipelines created up front too). */
static moex_vk_state *create_state(const moex_model *m, int64_t n_ctx, int64_t n_batch, int n_seq,
                                   const moex_vk_options *opt, bool experts_remote, bool batches, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    if (n_ctx <= 0 || n_batch <= 0 || n_seq <= 0) {
        moex_fail(err, "context (%lld), batch (%lld) and sequences (%d) must be positive", (long long)n_ctx,
                  (long long)n_batch, n_seq);
        return NULL;
    }
    /* the kernels index a layer's cache (and rows) in 32 bits */
    if ((uint64_t)n_seq * (uint64_t)n_ctx * (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim > UINT32_MAX) {
        moex_fail(err, "vulkan: %d sequences of %lld positions exceed what the kernels address per layer "
                  "(use fewer --parallel or a smaller --ctx)", n_seq, (long long)n_ctx);
        return NULL;
    }
    if (check_model(m, err)) return NULL;
    if (n_batch > n_ctx * n_seq) n_batch = n_ctx * n_seq;   /* more tokens than the slots hold: never a valid batch */
    moex_vk_state *s = calloc(1, sizeof *s);
    if (!s || !(s->layers = calloc((size_t)hp->n_layer, sizeof *s->layers))) {
        free(s);
        moex_fail(err, "out of memory");
        return NULL;
    }
    s->n_ctx = n_ctx;
    s->n_batch = n_batch;
    s->n_seq = n_seq;
    s->experts_remote = experts_remote && moex_hparams_is_moe(hp);
    s->experts_in_ram = !s->experts_remote && opt && opt->experts_in_ram && moex_hparams_is_moe(hp);
    s->sh = (moex_vk_attn_shape){.n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                                 .rope_dim = hp->rope_dim, .rope_base = hp->rope_freq_base, .rms_eps = hp->rms_eps,
                                 .scale = 1.0f / sqrtf((float)hp->head_dim), .neox = hp->rope_neox,
                                 .qk_norm = hp->qk_norm, .n_ctx = n_ctx};
    if (!(s->vk = moex_vk_create(opt, err)) || vk_memory_create(m, s, err) ||
        (opt && opt->round_activations && set_rounding(m, s, err)) || (!s->experts_remote && warm(m, s, batches, err))) {
        moex_vk_state_free(s);
        return NULL;
    }
    return s;
}

moex_vk_state *moex_vk_state_create(const moex_model *m, int64_t n_ctx, int64_t n_batch, const moex_vk_options *opt,
                                    moex_error *err) {
    return create_state(m, n_ctx, n_batch, 1, opt, false, false, err);
}

moex_vk_state *moex_vk_state_create_multi(const moex_model *m, int64_t n_ctx, int64_t n_batch, int n_seq,
                                          const moex_vk_options *opt, moex_error *err) {
    return create_state(m, n_ctx, n_batch, n_seq, opt, false, true, err);
}

static moex_vk_state *create_remote(const moex_model *m, int64_t n_ctx, int64_t n_batch, int n_seq, bool batches,
                                    const moex_vk_options *opt, moex_expert_executor exec, moex_error *err) {
    if (!exec.run) {
        moex_fail(err, "vulkan: a state without the experts needs an expert executor");
        return NULL;
    }
    moex_vk_state *s = create_state(m, n_ctx, n_batch, n_seq, opt, true, batches, err);
    if (s && (moex_vk_state_set_executor(m, s, exec, err) || (vk_dist_active(s) && vk_dist_warm(m, s, batches, err)))) {
        moex_vk_state_free(s);
        return NULL;
    }
    return s;
}

moex_vk_state *moex_vk_state_create_remote(const moex_model *m, int64_t n_ctx, int64_t n_batch,
                                           const moex_vk_options *opt, moex_expert_executor exec, moex_error *err) {
    return create_remote(m, n_ctx, n_batch, 1, false, opt, exec, err);
}

moex_vk_state *moex_vk_state_create_remote_multi(const moex_model *m, int64_t n_ctx, int64_t n_batch, int n_seq,
                                                 const moex_vk_options *opt, moex_expert_executor exec,
                                                 moex_error *err) {
    return create_remote(m, n_ctx, n_batch, n_seq, true, opt, exec, err);
}

void moex_vk_state_free(moex_vk_state *s) {
    if (!s) return;
    vk_batch_free(s);
    vk_dist_free(s);
    vk_local_free(s);
    vk_memory_free(s);
    free(s->layers);
    moex_vk_free(s->vk);
    free(s);
}

/* The logit buffers hold `rows`; both paths' recordings point at them, so
 * growing them (when a larger all-logits batch first appears) sends both to
 * record again. */
static int reserve_logits(const moex_model *m, moex_vk_state *s, int64_t rows, moex_error *err) {
    if (rows <= s->logit_rows) return 0;
    vk_local_invalidate(s);
    vk_dist_invalidate(s);
    return vk_logits_alloc(m, s, rows, err);
}

int moex_vk_forward(const moex_model *m, moex_vk_state *s, const int32_t *tokens, int64_t n, int64_t pos,
                    bool all_logits, float *logits, moex_error *err) {
    if (moex_forward_check(m, s->n_batch, s->n_ctx, tokens, n, pos, err)) return -1;
    if (reserve_logits(m, s, all_logits ? n : 1, err)) return -1;
    if (vk_dist_active(s)) return vk_dist_forward(m, s, tokens, n, pos, all_logits, logits, err);
    return vk_local_forward(m, s, tokens, n, pos, all_logits, logits, err);
}

/* Whether any wanted row's logits are read back (not only its argmax). */
static bool reads_rows(const moex_batch *b, const float *logits) {
    if (!logits) return false;
    for (int64_t t = 0; t < b->n; t++)
        if (b->want_logits[t] && !vk_argmax_only(b, t)) return true;
    return false;
}

int moex_vk_forward_batch(const moex_model *m, moex_vk_state *s, const moex_batch *b, float *logits, moex_error *err) {
    rec_key k;
    if (vk_batch_prepare(m, s, b, reads_rows(b, logits), &k, err) || reserve_logits(m, s, k.rows, err)) return -1;
    if (vk_dist_active(s) ? vk_dist_forward_batch(m, s, &k, err) : vk_local_forward_batch(m, s, &k, err)) return -1;
    vk_batch_take_outputs(m, s, b, logits);
    return 0;
}

static int engine_forward(void *ctx, const int32_t *tokens, int64_t n, int64_t pos, bool all_logits, float *logits,
                          moex_error *err) {
    moex_vk_engine *e = ctx;
    return moex_vk_forward(e->m, e->s, tokens, n, pos, all_logits, logits, err);
}

static int engine_forward_batch(void *ctx, const moex_batch *b, float *logits, moex_error *err) {
    moex_vk_engine *e = ctx;
    return moex_vk_forward_batch(e->m, e->s, b, logits, err);
}

static int engine_copy_rows(void *ctx, int from, int to, int64_t n, moex_error *err) {
    moex_vk_engine *e = ctx;
    return moex_vk_state_copy_rows(e->m, e->s, from, to, n, err);
}

static int engine_read_row(void *ctx, int64_t row, float *out, moex_error *err) {
    moex_vk_engine *e = ctx;
    return moex_vk_read_logits_row(e->m, e->s, row, out, err);
}

static int32_t engine_last_argmax(void *ctx) {
    moex_vk_engine *e = ctx;
    return moex_vk_last_argmax(e->s);
}

moex_engine moex_engine_vk(moex_vk_engine *e) {
    return (moex_engine){.ctx = e, .forward = engine_forward, .n_ctx = e->s->n_ctx, .n_batch = e->s->n_batch,
                         .n_seq = e->s->n_seq, .forward_batch = engine_forward_batch, .batch_argmax = true,
                         .last_argmax = engine_last_argmax, .read_row = engine_read_row,
                         .copy_rows = e->s->n_seq > 1 ? engine_copy_rows : NULL};
}

int32_t moex_vk_last_argmax(const moex_vk_state *s) { return s->last_argmax; }
int moex_vk_state_n_seq(const moex_vk_state *s) { return s->n_seq; }
int64_t moex_vk_state_n_ctx(const moex_vk_state *s) { return s->n_ctx; }
int64_t moex_vk_state_logits_rows_read(const moex_vk_state *s) { return s->logits_rows_read; }
int64_t moex_vk_state_n_batch(const moex_vk_state *s) { return s->n_batch; }
const void *moex_vk_state_experts_host(const moex_model *m, const moex_vk_state *s, int layer, int which) {
    if (!s->experts_in_ram || layer < 0 || layer >= m->hp.n_layer || which < 0 || which > 2) return NULL;
    return s->layers[layer].experts_host[which];
}
moex_vk *moex_vk_state_device(moex_vk_state *s) { return s->vk; }
