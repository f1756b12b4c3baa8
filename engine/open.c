/* moex_engine_open: the one place that turns options into a running engine.
 *
 *   backend CPU:    moex_state (engine/forward.c) with the experts computed by
 *                   the local executor on the pool, or sent to o->experts
 *   backend Vulkan: moex_vk_state (engine/vk) with the experts on the GPU; or
 *                   the GPU runs everything but the experts, which go to
 *                   o->experts (workers); or (o->cpu_moe) the experts' weights
 *                   in host memory, computed per forward by the GPU (a
 *                   prompt) or the local executor on the pool (a decode step)
 *
 * The routing recorder, when asked for, sits between the forward pass and
 * whichever executor computes the experts. */
#include <stdio.h>
#include <stdlib.h>

#include "engine/engine.h"
#if MOEX_HAVE_VULKAN
#include "engine/vk/engine_vk.h"
#endif

/* cpu_moe: the model as the CPU executor sees it, every expert view pointing
 * into the Vulkan state's host copy (one copy of the experts in RAM, read by
 * the GPU for prompts and by the CPU for decode, not a second one through
 * the file's pages). */
typedef struct ram_view {
    moex_model model;
    moex_layer *layers;
    moex_expert_weights *experts;
} ram_view;

struct moex_engine_parts {
    moex_local_executor *local;     /* the experts computed here (CPU backend or cpu_moe, without o->experts) */
    moex_engine inner;              /* cpu_moe: the Vulkan engine, wrapped to pick where a forward's experts run */
    moex_pool *pool;                /* cpu_moe: the local executor's threads, held spinning during a decode step */
    moex_expert_executor cpu_experts; /* cpu_moe: the local executor (decode) */
    ram_view ram;                   /* cpu_moe: the experts as the local executor reads them */
    moex_route_recorder *routes;
    moex_state *cpu;
#if MOEX_HAVE_VULKAN
    moex_vk_engine vk;              /* vk.s: the Vulkan state */
#endif
    char backend[64];
};

static void parts_free(struct moex_engine_parts *p) {
    if (!p) return;
    moex_state_free(p->cpu);
#if MOEX_HAVE_VULKAN
    moex_vk_state_free(p->vk.s);
#endif
    moex_route_recorder_free(p->routes);
    moex_local_executor_free(p->local);
    free(p->ram.layers);
    free(p->ram.experts);
    free(p);
}

/* The executor the forward pass calls per MoE layer: o->experts, or the
 * model's own weights on this CPU; wrapped by the routing recorder if asked. */
static int experts_of(const moex_model *m, const moex_engine_options *o, struct moex_engine_parts *p,
                      moex_expert_executor *exec, moex_error *err) {
    *exec = o->experts;
    if (!exec->run) {
        if (!(p->local = moex_local_executor_create(m, o->pool, o->wire_dtype))) return moex_fail(err, "out of memory");
        *exec = moex_local_executor_iface(p->local);
    }
    if (!o->record_routes) return 0;
    if (!(p->routes = moex_route_recorder_create(*exec, &m->hp)))
        return moex_fail(err, "recording routes needs a MoE model (or memory)");
    *exec = moex_route_recorder_iface(p->routes);
    return 0;
}

static int open_cpu(const moex_model *m, const moex_engine_options *o, int n_seq, struct moex_engine_parts *p,
                    moex_engine *eng, moex_error *err) {
    if (!o->pool) return moex_fail(err, "the CPU backend needs a thread pool");
    moex_expert_executor exec;
    if (experts_of(m, o, p, &exec, err)) return -1;
    if (!(p->cpu = moex_state_create_multi(m, o->n_ctx, o->n_batch, n_seq, o->pool, exec, err))) return -1;
    *eng = moex_engine_cpu(p->cpu);
    snprintf(p->backend, sizeof p->backend, "cpu (%s)", moex_kernels_simd_name());
    return 0;
}

#if MOEX_HAVE_VULKAN
/* cpu_moe: where a forward's experts run. The experts' weights live in host
 * memory the GPU can read over the bus. A forward of few tokens (a decode
 * step) reads each active expert's weights once per token: the CPU threads
 * read them from RAM faster than the bus carries them, so the experts go to
 * the local executor, and between two layers (the GPU working ~100 us,
 * longer than the pool's usual spin) the pool spins, since a sleeping
 * thread's wake-up would cost more than its share. A forward of many tokens
 * (a prompt) reads every expert's weights about once for all its tokens:
 * the GPU computes them, streaming the weights over the bus. */
#define CPU_MOE_GPU_FROM 32 /* tokens: llama.cpp's threshold for the same choice */

static int pick_experts(struct moex_engine_parts *p, int64_t n, moex_error *err) {
    const bool gpu = n >= CPU_MOE_GPU_FROM;
    moex_pool_hold(p->pool, !gpu);
    return moex_vk_state_set_executor(p->vk.m, p->vk.s, gpu ? (moex_expert_executor){0} : p->cpu_experts, err);
}

static int tier_forward(void *ctx, const int32_t *tokens, int64_t n, int64_t pos, bool all_logits, float *logits,
                        moex_error *err) {
    struct moex_engine_parts *p = ctx;
    int rc = pick_experts(p, n, err);
    if (!rc) rc = p->inner.forward(p->inner.ctx, tokens, n, pos, all_logits, logits, err);
    moex_pool_hold(p->pool, false);
    return rc;
}

static int tier_forward_batch(void *ctx, const moex_batch *b, float *logits, moex_error *err) {
    struct moex_engine_parts *p = ctx;
    int rc = pick_experts(p, b->n, err);
    if (!rc) rc = p->inner.forward_batch(p->inner.ctx, b, logits, err);
    moex_pool_hold(p->pool, false);
    return rc;
}

static int32_t tier_last_argmax(void *ctx) {
    struct moex_engine_parts *p = ctx;
    return p->inner.last_argmax(p->inner.ctx);
}

static int tier_read_row(void *ctx, int64_t row, float *out, moex_error *err) {
    struct moex_engine_parts *p = ctx;
    return p->inner.read_row(p->inner.ctx, row, out, err);
}

static int tier_copy_rows(void *ctx, int from, int to, int64_t n, moex_error *err) {
    struct moex_engine_parts *p = ctx;
    return p->inner.copy_rows(p->inner.ctx, from, to, n, err);
}

static moex_engine tier_engine(struct moex_engine_parts *p, moex_engine inner, moex_pool *pool) {
    p->inner = inner;
    p->pool = pool;
    moex_engine e = inner;
    e.ctx = p;
    e.forward = tier_forward;
    e.forward_batch = inner.forward_batch ? tier_forward_batch : NULL;
    e.last_argmax = inner.last_argmax ? tier_last_argmax : NULL;
    e.read_row = inner.read_row ? tier_read_row : NULL;
    e.copy_rows = inner.copy_rows ? tier_copy_rows : NULL;
    return e;
}

static int ram_view_of(const moex_model *m, const moex_vk_state *vs, ram_view *v, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    v->model = *m;
    v->layers = malloc((size_t)hp->n_layer * sizeof *v->layers);
    v->experts = malloc((size_t)hp->n_layer * (size_t)hp->n_expert * sizeof *v->experts);
    if (!v->layers || !v->experts) return moex_fail(err, "out of memory");
    for (int l = 0; l < hp->n_layer; l++) {
        v->layers[l] = m->layers[l];
        if (!m->layers[l].experts) continue;
        v->layers[l].experts = v->experts + (size_t)l * (size_t)hp->n_expert;
        for (int w = 0; w < 3; w++) {
            const uint8_t *base = moex_vk_state_experts_host(m, vs, l, w);
            if (!base) return moex_fail(err, "vulkan: layer %d's experts are not in host memory", l);
            for (int e = 0; e < hp->n_expert; e++) {
                moex_expert_weights *x = &v->layers[l].experts[e];
                if (w == 0) *x = m->layers[l].experts[e];
                moex_matrix *mat = w == 0 ? &x->gate : w == 1 ? &x->up : &x->down;
                mat->data = base + (size_t)e * (size_t)mat->rows * mat->row_bytes;
            }
        }
    }
    v->model.layers = v->layers;
    return 0;
}

static int open_vulkan(const moex_model *m, const moex_engine_options *o, int n_seq, struct moex_engine_parts *p,
                       moex_engine *eng, moex_error *err) {
    moex_vk_options vo = o->vk;
    const bool remote = o->experts.run != NULL || o->cpu_moe;
    vo.round_activations = vo.round_activations || remote;
    vo.experts_in_ram = o->cpu_moe;
    if (o->record_routes && (!remote || o->cpu_moe))
        return moex_fail(err, "recording routes on Vulkan needs the experts on workers (or the CPU backend): the GPU "
                              "computes some");
    if (o->cpu_moe && !o->pool) return moex_fail(err, "experts on the CPU need a thread pool");
    if (o->cpu_moe && o->experts.run) return moex_fail(err, "the experts go to the CPU or to the workers, not both");
    p->vk.m = m;
    if (o->cpu_moe) {   /* the experts in RAM: the whole-model state, the executor picked per forward */
        p->vk.s = o->batched ? moex_vk_state_create_multi(m, o->n_ctx, o->n_batch, n_seq, &vo, err)
                             : moex_vk_state_create(m, o->n_ctx, o->n_batch, &vo, err);
        if (!p->vk.s || ram_view_of(m, p->vk.s, &p->ram, err) ||
            experts_of(&p->ram.model, o, p, &p->cpu_experts, err) ||
            moex_vk_state_set_executor(m, p->vk.s, p->cpu_experts, err))
            return -1;
        moex_log(MOEX_LOG_INFO, "experts: 0 of %d in VRAM, all in RAM (a token uses %d); forwards of fewer than %d "
                 "tokens compute them on %d CPU threads, longer ones on the GPU from RAM",
                 m->hp.n_layer * m->hp.n_expert, m->hp.n_layer * m->hp.n_expert_used, CPU_MOE_GPU_FROM,
                 moex_pool_size(o->pool));
    } else if (remote) {
        moex_expert_executor exec;
        if (experts_of(m, o, p, &exec, err)) return -1;
        p->vk.s = o->batched ? moex_vk_state_create_remote_multi(m, o->n_ctx, o->n_batch, n_seq, &vo, exec, err)
                             : moex_vk_state_create_remote(m, o->n_ctx, o->n_batch, &vo, exec, err);
    } else {
        p->vk.s = o->batched ? moex_vk_state_create_multi(m, o->n_ctx, o->n_batch, n_seq, &vo, err)
                             : moex_vk_state_create(m, o->n_ctx, o->n_batch, &vo, err);
    }
    if (!p->vk.s) return -1;
    *eng = moex_engine_vk(&p->vk);
    if (o->cpu_moe) *eng = tier_engine(p, *eng, o->pool);
    if (o->cpu_moe) snprintf(p->backend, sizeof p->backend, "vulkan, experts on the cpu (%s)", moex_kernels_simd_name());
    else snprintf(p->backend, sizeof p->backend, "vulkan");
    return 0;
}

moex_vk_state *moex_engine_vk_state(const moex_engine *eng) { return eng->parts ? eng->parts->vk.s : NULL; }
#endif

/* One token at slot 0, position 0, as a greedy decode runs it (the argmax
 * only, nothing read back, where the engine computes it; else its logits).
 * Any token id will do: BOS where the model has one. */
static int warm_up(const moex_model *m, moex_engine *eng, moex_error *err) {
    const int32_t tok = m->tok && moex_tokenizer_bos(m->tok) >= 0 ? moex_tokenizer_bos(m->tok) : 0;
    float *logits = eng->last_argmax ? NULL : malloc((size_t)m->hp.n_vocab * sizeof *logits);
    if (!eng->last_argmax && !logits) return moex_fail(err, "out of memory");
    const int rc = eng->forward(eng->ctx, &tok, 1, 0, false, logits, err);
    free(logits);
    return rc ? moex_error_prefix(err, "warming up") : 0;
}

/* Verifies of k = 1, 2, 4, ... <= max_drafts drafts (k + 1 rows of slot 0 at
 * positions 0.., every row wanted), as speculative decoding runs them: their
 * argmax only where the engine takes it (greedy), then their logits. */
static int warm_verifies(const moex_model *m, moex_engine *eng, int max_drafts, moex_error *err) {
    enum { MAX_ROWS = MOEX_SPEC_MAX_DRAFT + 1 };
    const int32_t tok = m->tok && moex_tokenizer_bos(m->tok) >= 0 ? moex_tokenizer_bos(m->tok) : 0;
    int32_t toks[MAX_ROWS], seq[MAX_ROWS], pos[MAX_ROWS], argmax[MAX_ROWS];
    bool want[MAX_ROWS], only[MAX_ROWS];
    for (int i = 0; i < MAX_ROWS; i++) toks[i] = tok, seq[i] = 0, pos[i] = i, want[i] = only[i] = true;
    float *logits = malloc((size_t)MAX_ROWS * (size_t)m->hp.n_vocab * sizeof *logits);
    if (!logits) return moex_fail(err, "out of memory");
    int rc = 0;
    for (int k = 1; k <= max_drafts && k + 1 <= eng->n_batch && k + 1 <= eng->n_ctx && !rc; k *= 2)
        for (int greedy = eng->batch_argmax ? 1 : 0; greedy >= 0 && !rc; greedy--) {
            const moex_batch b = {.n = k + 1, .tokens = toks, .seq = seq, .pos = pos, .want_logits = want,
                                  .argmax = greedy ? argmax : NULL, .argmax_only = greedy ? only : NULL};
            rc = eng->forward_batch(eng->ctx, &b, greedy ? NULL : logits, err);
        }
    free(logits);
    return rc ? moex_error_prefix(err, "warming up the verifies") : 0;
}

int moex_engine_open(const moex_model *m, const moex_engine_options *o, moex_engine *eng, moex_error *err) {
    *eng = (moex_engine){0};
    const int n_seq = o->n_seq > 0 ? o->n_seq : 1;
    if (n_seq > 1 && !o->batched) return moex_fail(err, "%d KV slots need the batched forward (options.batched)", n_seq);
    struct moex_engine_parts *p = calloc(1, sizeof *p);
    if (!p) return moex_fail(err, "out of memory");
    int rc;
    if (o->backend == MOEX_ENGINE_VULKAN) {
#if MOEX_HAVE_VULKAN
        rc = open_vulkan(m, o, n_seq, p, eng, err);
#else
        rc = moex_fail(err, "this build has no Vulkan backend (configure with -DMOEX_VULKAN=ON)");
#endif
    } else {
        rc = open_cpu(m, o, n_seq, p, eng, err);
    }
    if (rc) {
        parts_free(p);
        *eng = (moex_engine){0};
        return -1;
    }
    eng->parts = p;
    /* not through an executor elsewhere: workers may not be there yet */
    if (o->warm_up && !o->experts.run &&
        (warm_up(m, eng, err) ||
         (o->warm_verify > 0 && eng->forward_batch && warm_verifies(m, eng, o->warm_verify, err)))) {
        moex_engine_close(eng);
        return -1;
    }
    return 0;
}

void moex_engine_close(moex_engine *eng) {
    if (!eng) return;
    parts_free(eng->parts);
    *eng = (moex_engine){0};
}

moex_route_recorder *moex_engine_routes(const moex_engine *eng) { return eng->parts ? eng->parts->routes : NULL; }

const char *moex_engine_backend_name(const moex_engine *eng) { return eng->parts ? eng->parts->backend : "cpu"; }
