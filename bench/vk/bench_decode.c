/* Decode ops of one layer (layer 0 of a model file) and the head, each timed
 * alone (its dispatches plus one barrier, median of 3 x reps in one submit),
 * in the fused form the decode recording uses and in the unfused form.
 * usage: bench_decode MODEL.gguf [--ctx 512] [--reps 200]. Prints "key us" lines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/vk/engine_vk.h"
#define BENCH_NAME "bench_decode"
#include "../bench_util.h"

static moex_error err;
typedef struct ctx {
    const moex_hparams *hp;
    moex_vk_matrix wq, wk, wv, wo, router, head;
    moex_vk_attn_shape sh;
    moex_vk_ptr x, xn, nw, q, k, v, att, kc, vc, qn, kn, scratch, params, sync, logits, ids, gw, rl, cnt, am;
    moex_vk_buffer *bufs[8];   /* the weights' and activations' buffers, freed at the end */
    int n_bufs;
} ctx;

typedef int (*record_fn)(moex_vk_cmd *c, ctx *b);

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double time_op(moex_vk *vk, record_fn record, ctx *b, int reps) {
    moex_vk_cmd *c = moex_vk_cmd_create(vk, &err);
    MUST(!c);
    double t[4];
    for (int pass = 0; pass < 4; pass++) {   /* pass 0: compile and warm up */
        MUST(moex_vk_cmd_begin(c, &err));
        for (int i = 0; i < (pass ? reps : 1); i++) {
            MUST(record(c, b));
            moex_vk_barrier(c);
        }
        MUST(moex_vk_cmd_end(c, &err));
        double t0 = moex_time_s();
        MUST(moex_vk_cmd_run(c, &err));
        t[pass] = (moex_time_s() - t0) / reps * 1e6;
    }
    moex_vk_cmd_free(c);
    qsort(t + 1, 3, sizeof *t, cmp_double);
    return t[2];
}

static int qkv_fused(moex_vk_cmd *c, ctx *b) {
    const float eps = b->hp->rms_eps;
    return moex_vk_op_norm_matmul(c, &b->wq, b->x, b->nw, eps, b->q, 0, &err) ||
           moex_vk_op_norm_matmul(c, &b->wk, b->x, b->nw, eps, b->k, 0, &err) ||
           moex_vk_op_norm_matmul(c, &b->wv, b->x, b->nw, eps, b->v, 0, &err);
}
static int qkv_plain(moex_vk_cmd *c, ctx *b) {
    if (moex_vk_op_rmsnorm(c, b->xn, b->x, b->nw, 1, b->hp->n_embd, b->hp->rms_eps, &err)) return -1;
    moex_vk_barrier(c);
    return moex_vk_op_matmul(c, &b->wq, b->xn, 1, b->q, 0, &err) || moex_vk_op_matmul(c, &b->wk, b->xn, 1, b->k, 0, &err) ||
           moex_vk_op_matmul(c, &b->wv, b->xn, 1, b->v, 0, &err);
}
static int qkv_shared(moex_vk_cmd *c, ctx *b) {   /* the decode recording now: q, k, v (one type) in one dispatch, norm fused */
    const moex_vk_matrix *w[3] = {&b->wq, &b->wk, &b->wv};
    const moex_vk_ptr y[3] = {b->q, b->k, b->v};
    return moex_vk_op_norm_matmul_multi(c, 3, w, y, b->x, b->nw, b->hp->rms_eps, &err);
}
static int q_only(moex_vk_cmd *c, ctx *b) { return moex_vk_op_matmul(c, &b->wq, b->xn, 1, b->q, 0, &err); }
static int attn_fused(moex_vk_cmd *c, ctx *b) {
    return moex_vk_op_attention_decode(c, &b->sh, b->q, b->k, b->v, b->kc, b->vc, b->qn, b->kn, b->scratch, b->sync,
                                       b->params, NULL, 0, &err);
}
static int attn_plain(moex_vk_cmd *c, ctx *b) {
    if (moex_vk_op_qk_rope(c, &b->sh, b->q, b->k, b->v, b->kc, b->vc, b->qn, b->kn, b->params, 1, &err)) return -1;
    moex_vk_barrier(c);
    return moex_vk_op_attention(c, &b->sh, b->q, b->kc, b->vc, b->att, b->scratch, b->params, 1, &err);
}
static int wo(moex_vk_cmd *c, ctx *b) { return moex_vk_op_matmul(c, &b->wo, b->att, 1, b->x, b->x, &err); }
static int router_fused(moex_vk_cmd *c, ctx *b) {
    return moex_vk_op_norm_router(c, &b->router, b->x, b->nw, b->hp->rms_eps, b->hp->n_expert_used, true, b->rl, b->cnt,
                                  b->ids, b->gw, b->xn, &err);
}
static int router_plain(moex_vk_cmd *c, ctx *b) {
    if (moex_vk_op_rmsnorm(c, b->xn, b->x, b->nw, 1, b->hp->n_embd, b->hp->rms_eps, &err)) return -1;
    moex_vk_barrier(c);
    return moex_vk_op_router(c, &b->router, b->xn, 1, b->hp->n_expert_used, true, b->rl, b->cnt, b->ids, b->gw, &err);
}
static int head_plain(moex_vk_cmd *c, ctx *b) {   /* the previous decode head: norm, product, argmax pass */
    if (moex_vk_op_rmsnorm(c, b->xn, b->x, b->nw, 1, b->hp->n_embd, b->hp->rms_eps, &err)) return -1;
    moex_vk_barrier(c);
    if (moex_vk_op_matmul(c, &b->head, b->xn, 1, b->logits, 0, &err)) return -1;
    moex_vk_barrier(c);
    return moex_vk_op_argmax(c, b->logits, 1, b->head.rows, b->head.rows, b->am, &err);
}
static int head_product(moex_vk_cmd *c, ctx *b) { return moex_vk_op_matmul(c, &b->head, b->xn, 1, b->logits, 0, &err); }
static int head_argmax(moex_vk_cmd *c, ctx *b) {   /* the decode head now: norm, product with the argmax */
    if (moex_vk_op_rmsnorm(c, b->xn, b->x, b->nw, 1, b->hp->n_embd, b->hp->rms_eps, &err)) return -1;
    moex_vk_barrier(c);
    return moex_vk_op_matmul_argmax(c, &b->head, b->xn, 0, 0, b->logits, b->am, b->sync, 60000, &err);
}
static int head_norm_argmax(moex_vk_cmd *c, ctx *b) {   /* everything in one dispatch */
    return moex_vk_op_matmul_argmax(c, &b->head, b->x, b->nw, b->hp->rms_eps, b->logits, b->am, b->sync, 60000, &err);
}

static moex_vk_buffer *keep(ctx *b, moex_vk_buffer *buf) {
    MUST(!buf || b->n_bufs == (int)(sizeof b->bufs / sizeof b->bufs[0]));
    return b->bufs[b->n_bufs++] = buf;
}

static moex_vk_matrix upload(moex_vk *vk, ctx *b, const moex_matrix *m) {
    const size_t bytes = (size_t)m->rows * m->row_bytes;
    moex_vk_buffer *buf = keep(b, moex_vk_buffer_create(vk, bytes, MOEX_VK_MEM_DEVICE, &err));
    MUST(moex_vk_upload(vk, buf, 0, m->data, bytes, &err));
    return (moex_vk_matrix){.type = m->type, .rows = m->rows, .cols = m->cols, .row_bytes = m->row_bytes,
                            .data = moex_vk_buffer_ptr(buf)};
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_decode MODEL.gguf [--ctx 512] [--reps 200]\n");
        return 2;
    }
    int pos = 512, reps = 200;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--ctx")) pos = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    }
    moex_model *m = moex_model_load(argv[1], &err);
    MUST(!m);
    moex_vk_options o = {.device = -1};
    moex_vk *vk = moex_vk_create(&o, &err);
    MUST(!vk);
    const moex_hparams *hp = &m->hp;
    const moex_layer *L = &m->layers[0];
    ctx b = {.hp = hp};
    b.wq = upload(vk, &b, &L->wq);
    b.wk = upload(vk, &b, &L->wk);
    b.wv = upload(vk, &b, &L->wv);
    b.wo = upload(vk, &b, &L->wo);
    b.head = upload(vk, &b, &m->output);
    const bool moe = moex_hparams_is_moe(hp);
    if (moe) b.router = upload(vk, &b, &L->router);
    b.sh = (moex_vk_attn_shape){.n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                                .rope_dim = hp->rope_dim, .rope_base = hp->rope_freq_base, .rms_eps = hp->rms_eps,
                                .scale = 0.088f, .neox = hp->rope_neox, .qk_norm = hp->qk_norm, .n_ctx = pos + 136};
    const size_t kvb = (size_t)b.sh.n_ctx * hp->n_head_kv * hp->head_dim * 4, MB = (size_t)1 << 20;
    moex_vk_buffer *act = keep(&b, moex_vk_buffer_create(vk, 64 * MB + 2 * kvb, MOEX_VK_MEM_DEVICE, &err));
    /* random-ish activations: x = a smooth ramp, weights 1 (values only matter for exp/overflow) */
    float *h = malloc(16 * MB);
    MUST(!h);
    for (size_t i = 0; i < 4 * MB; i++) h[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    MUST(moex_vk_upload(vk, act, 0, h, 16 * MB, &err));
    for (size_t i = 0; i < 4096; i++) h[i] = 1.0f;
    const moex_vk_ptr a = moex_vk_buffer_ptr(act);
    b.x = a;
    b.q = a + 1 * MB;
    b.k = a + 2 * MB;
    b.v = a + 3 * MB;
    b.att = a + 4 * MB;
    b.xn = a + 5 * MB;
    b.rl = a + 6 * MB;
    b.ids = b.rl + 65536;
    b.gw = b.rl + 2 * 65536;
    b.scratch = a + 8 * MB;
    b.nw = a + 16 * MB;
    b.qn = b.nw + 65536;
    b.kn = b.nw + 2 * 65536;
    MUST(moex_vk_upload(vk, act, 16 * MB, h, 3 * 65536, &err));
    b.sync = a + 20 * MB;   /* zeros */
    b.cnt = a + 21 * MB;
    b.params = a + 22 * MB;
    b.am = b.params + 64;
    b.logits = a + 24 * MB;   /* 151936 floats fit in 40 MB */
    b.kc = a + 64 * MB;
    b.vc = b.kc + kvb;
    void *z = calloc(1, 4 * MB);
    MUST(!z);
    MUST(moex_vk_upload(vk, act, 20 * MB, z, 2 * MB, &err));
    free(z);
    int32_t p = pos;
    MUST(moex_vk_upload(vk, act, 22 * MB, &p, 4, &err));
    free(h);
    char desc[256];
    moex_model_describe(m, desc, sizeof desc);
    printf("model %s\ndevice %s\nctx %d\n", desc, moex_vk_get_info(vk)->name, pos);
    struct { const char *name; record_fn f; bool moe; } ops[] = {
        {"qkv_shared_norm_fused", qkv_shared, false}, {"qkv_norm_fused", qkv_fused, false}, {"qkv_norm_then_products", qkv_plain, false}, {"q_product", q_only, false},
        {"attention_fused", attn_fused, false}, {"attention_rope_attn_merge", attn_plain, false}, {"wo_resid", wo, false},
        {"router_norm_fused", router_fused, true}, {"router_norm_then_router", router_plain, true},
        {"head_norm_product_argmax_3ops", head_plain, false}, {"head_product_only", head_product, false},
        {"head_norm_then_product_argmax", head_argmax, false}, {"head_all_fused", head_norm_argmax, false}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        if (ops[i].moe && !moe) continue;
        const int r = !strncmp(ops[i].name, "head", 4) ? reps / 4 : reps;
        printf("%-32s %8.2f us\n", ops[i].name, time_op(vk, ops[i].f, &b, r));
    }
    printf("head_bytes %zu\n", (size_t)b.head.rows * b.head.row_bytes);
    for (int i = 0; i < b.n_bufs; i++) moex_vk_buffer_free(b.bufs[i]);
    moex_vk_free(vk);
    moex_model_free(m);
    return 0;
}
