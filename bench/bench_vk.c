/* Vulkan backend speed on a model file: pp (one prompt batch), tg (greedy
 * decode from an empty context and after the prompt), and the achieved
 * bandwidth of the main kernels on the model's own layer-0 weights against
 * the device's buffer-copy bandwidth. Prints "key value" lines.
 * usage: bench_vk MODEL.gguf [--device N] [-p 512] [-n 128] [-r 3] [--ctx N] [--exact|--round]
 *        [--streams N,...]: only the batched decode of N sequences (bench_streams) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "engine/vk/engine_vk.h"
#include "kernels/vk/vk_testing.h"
#define BENCH_NAME "bench_vk"
#include "bench_util.h"

static moex_error err;

/* Seconds per repetition of record(), timed over reps repetitions in one submit. */
typedef int (*record_fn)(moex_vk_cmd *c, void *ctx);
static double time_op(moex_vk *vk, record_fn record, void *ctx, int reps) {
    moex_vk_cmd *c = moex_vk_cmd_create(vk, &err);
    MUST(!c);
    for (int pass = 0; pass < 2; pass++) { /* first pass: compile + warm up */
        MUST(moex_vk_cmd_begin(c, &err));
        for (int i = 0; i < (pass ? reps : 1); i++) {
            MUST(record(c, ctx));
            moex_vk_barrier(c);
        }
        MUST(moex_vk_cmd_end(c, &err));
        double t0 = moex_time_s();
        MUST(moex_vk_cmd_run(c, &err));
        if (pass) {
            double t = (moex_time_s() - t0) / reps;
            moex_vk_cmd_free(c);
            return t;
        }
    }
    return 0;
}

typedef struct copy_ctx {
    moex_vk_buffer *a, *b;
    size_t n;
} copy_ctx;
static int rec_copy(moex_vk_cmd *c, void *p) {
    copy_ctx *x = p;
    moex_vk_copy(c, x->b, 0, x->a, 0, x->n);
    return 0;
}

typedef struct add_ctx {
    moex_vk_ptr a, b, y;
    int64_t n;
} add_ctx;
static int rec_add(moex_vk_cmd *c, void *p) {
    add_ctx *x = p;
    return moex_vk_op_eltwise(c, 0, x->a, x->b, x->y, x->n, &err);
}

typedef struct mat_ctx {
    const moex_vk_matrix *w;
    moex_vk_ptr x, y;
    int64_t n;
} mat_ctx;
static int rec_matmul(moex_vk_cmd *c, void *p) {
    mat_ctx *m = p;
    return moex_vk_op_matmul(c, m->w, m->x, m->n, m->y, 0, &err);
}

typedef struct norm_ctx {
    moex_vk_ptr x, y;
    int64_t rows, dim;
} norm_ctx;
static int rec_norm(moex_vk_cmd *c, void *p) {
    norm_ctx *x = p;
    return moex_vk_op_rmsnorm(c, x->y, x->x, 0, x->rows, x->dim, 1e-6f, &err);
}

typedef struct router_ctx {
    const moex_vk_matrix *w;
    moex_vk_ptr x, logits, counter, ids, gw;
    int k;
} router_ctx;
static int rec_router(moex_vk_cmd *c, void *p) {
    router_ctx *r = p;
    return moex_vk_op_router(c, r->w, r->x, 1, r->k, true, r->logits, r->counter, r->ids, r->gw, &err);
}

typedef struct attn_ctx {
    moex_vk_attn_shape sh;
    moex_vk_ptr q, kc, vc, out, scratch, params;
} attn_ctx;
static int rec_attn(moex_vk_cmd *c, void *p) {
    attn_ctx *a = p;
    return moex_vk_op_attention(c, &a->sh, a->q, a->kc, a->vc, a->out, a->scratch, a->params, 1, &err);
}
/* The fused step decode runs: QK-norm, RoPE, KV append, attention, merge
 * (out: the norm weights, counters after them), over the caches of layer
 * i % layers (48 layers: they come from DRAM, as in a model's token). */
typedef struct attn_dec_ctx {
    attn_ctx a;
    size_t layer_bytes;
    int layers, i;
} attn_dec_ctx;
static int rec_attn_dec(moex_vk_cmd *c, void *p) {
    attn_dec_ctx *d = p;
    const attn_ctx *a = &d->a;
    const size_t off = (size_t)(d->i++ % d->layers) * d->layer_bytes;
    return moex_vk_op_attention_decode(c, &a->sh, a->q, a->q + 65536, a->q + 2 * 65536, a->kc + off, a->vc + off,
                                       a->out, a->out + 4096, a->scratch, a->out + 8192, a->params, NULL, 0, &err);
}
/* Decode attention at position 575 of a 648-token cache (bench_vk's own
 * -p 512 -n 128 midway), random q, k, v and caches, QK-norm weights 1:
 * the caches of one layer (in L2 after the first pass) and of 48; then the
 * unfused split-K + merge (prompt batches' fallback) on one layer's. */
static void bench_attn_decode(const moex_hparams *hp, moex_vk *vk, moex_vk_ptr a0, moex_vk_buffer *act) {
    attn_dec_ctx d = {.a.sh = {.n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                               .rope_dim = hp->rope_dim, .rope_base = 1e6f, .rms_eps = 1e-6f,
                               .scale = 1.0f / sqrtf((float)hp->head_dim), .neox = true, .qk_norm = true,
                               .n_ctx = 648}};
    const size_t kvb = (size_t)d.a.sh.n_ctx * hp->n_head_kv * hp->head_dim * 4, nf = 48 * kvb / 4;   /* half the caches */
    d.layer_bytes = 2 * kvb;
    moex_vk_buffer *kv = moex_vk_buffer_create(vk, 48 * 2 * kvb + 4096, MOEX_VK_MEM_DEVICE, &err);
    float *h = malloc(nf * 4);
    MUST(!kv || !h);
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < nf; i++) {   /* uniform in [-1, 1) */
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (float)((int32_t)(st >> 32)) / 2147483648.0f;
    }
    MUST(moex_vk_upload(vk, kv, 0, h, nf * 4, &err) || moex_vk_upload(vk, kv, nf * 4, h, nf * 4, &err));
    MUST(moex_vk_upload(vk, act, 0, h, (size_t)3 * 65536, &err));   /* q, k, v */
    for (int i = 0; i < 2048; i++) h[i] = 1.0f;   /* q_norm at out, k_norm 4 KiB on, then zeroed counters */
    memset(h + 2048, 0, 4096 * 4);
    MUST(moex_vk_upload(vk, act, (size_t)3 << 20, h, (2048 + 4096) * 4, &err));
    int32_t pos = 575;
    MUST(moex_vk_upload(vk, kv, 48 * 2 * kvb, &pos, 4, &err));
    d.a.kc = moex_vk_buffer_ptr(kv);
    d.a.vc = d.a.kc + kvb;
    d.a.params = d.a.kc + 48 * 2 * kvb;
    d.a.q = a0;
    d.a.scratch = a0 + ((size_t)2 << 20);
    d.a.out = a0 + ((size_t)3 << 20);
    for (int cold = 0; cold < 2; cold++) {
        d.layers = cold ? 48 : 1;
        printf("kernel_attn_decode_ctx576_%s_us %.2f\n", cold ? "48_layers" : "1_layer",
               time_op(vk, rec_attn_dec, &d, 192) * 1e6);
    }
    attn_ctx split = d.a;
    split.out = a0 + ((size_t)1 << 20);
    printf("kernel_attn_splitk_merge_ctx576_us %.2f\n", time_op(vk, rec_attn, &split, 192) * 1e6);
    free(h);
    moex_vk_buffer_free(kv);
}

typedef struct ex_ctx {
    moex_vk_experts e;
    moex_vk_ptr x, ids, y, scratch;   /* ids: the first id set */
    int64_t n;
    int k;
    int path;      /* 0 moex_vk_op_experts, 1 gate+up alone, 2 down alone */
    bool each;     /* MOEX_VK_EACH: every token on one token's kernels (a batch of sequences) */
    int sets, i;   /* call i uses id set i % sets (EX_SET_BYTES apart) */
} ex_ctx;
#define EX_SET_BYTES 8192   /* an id set: the ids, then their routing weights 4 KiB on */
static int rec_experts(moex_vk_cmd *c, void *p) {
    ex_ctx *e = p;
    const moex_vk_ptr ids = e->ids + (size_t)(e->i++ % e->sets) * EX_SET_BYTES, w = ids + 4096;
    if (e->path)
        return moex_vk_testing_experts_halves(c, &e->e, e->x, e->n, e->k, ids, w, e->y, e->y, e->scratch, e->path,
                                              e->each, &err);
    return moex_vk_op_experts_pick(c, e->each ? MOEX_VK_EACH : MOEX_VK_BY_N, &e->e, e->x, e->n, e->k, ids, w, e->y, e->y,
                                   e->scratch, &err);
}

/* E / k sets of k ids that together name each of E experts once (37 does
 * not divide E): the first k are one token's experts, the first n * k (n
 * <= E / k) n tokens' all distinct ones, all the sets rotate through every
 * expert (weights from DRAM). */
static void fill_spread_ids(int32_t *ids, int E, int k) {
    for (int i = 0; i < E / k * k; i++) ids[i] = (int32_t)((i * 37 + 11) % E);
}

/* The decode expert FFN on n tokens choosing ex->k experts each (ids: sets
 * of n x k, one set per call in turn: sets that name different experts keep
 * the weights out of L2, as a model's tokens do). Bytes counted: the weights
 * of the distinct experts named by the first set, each once (what a kernel
 * that reads each expert once must stream). Prints the kernel (both halves,
 * and each alone without the barrier) and the share of the streaming ceiling. */
static void bench_experts_mv(moex_vk *vk, ex_ctx *ex, moex_vk_buffer *act, size_t ids_off, const int32_t *ids, int n,
                             int sets, const char *name, double copy_bw) {
    const int k = ex->k, np = n * k;
    float w[VK_MV_NMAX * 64];
    int distinct = 0;
    for (int i = 0; i < np; i++) {
        w[i] = 1.0f / (float)k;
        bool seen = false;
        for (int q = 0; q < i; q++) seen |= ids[q] == ids[i];
        distinct += !seen;
    }
    for (int st = 0; st < sets; st++) {
        MUST(moex_vk_upload(vk, act, ids_off + (size_t)st * EX_SET_BYTES, ids + (size_t)st * np, (size_t)np * 4, &err));
        MUST(moex_vk_upload(vk, act, ids_off + (size_t)st * EX_SET_BYTES + 4096, w, (size_t)np * 4, &err));
    }
    ex->ids = moex_vk_buffer_ptr(act) + ids_off;
    ex->sets = sets;
    ex->n = n;
    const double gb = 1e9, gu = 2.0 * (double)ex->e.gate.expert_stride * distinct,
                 dn = (double)ex->e.down.expert_stride * distinct, bytes = gu + dn;
    double t[3];
    for (int path = 0; path < 3; path++) {
        ex->path = path;
        t[path] = time_op(vk, rec_experts, ex, 200);
    }
    ex->path = 0;
    printf("kernel_experts_%s_pairs %d\nkernel_experts_%s_distinct_experts %d\nkernel_experts_%s_bytes %.0f\n", name, np,
           name, distinct, name, bytes);
    printf("kernel_experts_%s_us %.2f\nkernel_experts_%s_GBps %.1f\nkernel_experts_%s_vs_copy %.3f\n", name, t[0] * 1e6,
           name, bytes / t[0] / gb, name, bytes / t[0] / gb / copy_bw);
    printf("kernel_experts_%s_gateup_us %.2f\nkernel_experts_%s_gateup_GBps %.1f\n", name, t[1] * 1e6, name,
           gu / t[1] / gb);
    printf("kernel_experts_%s_down_us %.2f\nkernel_experts_%s_down_GBps %.1f\n", name, t[2] * 1e6, name, dn / t[2] / gb);
}

static moex_vk_matrix upload_matrix(moex_vk *vk, const moex_matrix *m, int n_mats, moex_vk_buffer **keep) {
    const size_t bytes = (size_t)m->rows * m->row_bytes * (size_t)n_mats;
    *keep = moex_vk_buffer_create(vk, bytes, MOEX_VK_MEM_DEVICE, &err);
    MUST(!*keep);
    MUST(moex_vk_upload(vk, *keep, 0, m->data, bytes, &err));
    return (moex_vk_matrix){.type = m->type, .rows = m->rows, .cols = m->cols, .row_bytes = m->row_bytes,
                            .data = moex_vk_buffer_ptr(*keep), .expert_stride = (size_t)m->rows * m->row_bytes};
}

/* MOEX_VK_EX_SWEEP="GWG.GRT.GRU/DWG.DRT.DRU,..." times experts_mv.comp with each
 * listed shape (gate+up / down: threads, rows, rows loaded together; for one token
 * and for batches alike) on layer 0 and on the first layer whose down has another
 * type: keys kernel_experts_s<i>[_L<layer>]_<case>_*. */
static void bench_experts_sweep(const moex_model *m, moex_vk *vk, moex_vk_buffer *act, double copy_bw, bool always) {
    char cur[96];
    const char *spec = getenv("MOEX_VK_EX_SWEEP");
    if (!spec || !*spec) {   /* --only-experts without a list: the current shapes (one token's) */
        if (!always) return;
        const moex_vk_ex_shape g = moex_vk_testing_ex_shape(vk, 0, false), d = moex_vk_testing_ex_shape(vk, 1, false);
        snprintf(cur, sizeof cur, "%d.%d.%d/%d.%d.%d", g.wg, g.rt, g.ru, d.wg, d.rt, d.ru);
        spec = cur;
    }
    const moex_hparams *hp = &m->hp;
    const int E = hp->n_expert, k = hp->n_expert_used;
    if (k > 64 || VK_MV_NMAX * k > E) return;
    int layers[2] = {0, -1};
    for (int l = 1; l < hp->n_layer && layers[1] < 0; l++)
        if (m->layers[l].experts[0].down.type != m->layers[0].experts[0].down.type) layers[1] = l;
    moex_vk_ex_shape saved[2][2];
    for (int h = 0; h < 2; h++)
        for (int b = 0; b < 2; b++) saved[h][b] = moex_vk_testing_ex_shape(vk, h, b);
    int32_t ids[VK_MAX_EXPERTS];
    fill_spread_ids(ids, E, k);
    for (int li = 0; li < 2 && layers[li] >= 0; li++) {
        const moex_layer *L = &m->layers[layers[li]];
        moex_vk_buffer *keep[3];
        const moex_vk_ptr a0 = moex_vk_buffer_ptr(act);
        ex_ctx ex = {.n = 1, .k = k, .x = a0, .y = a0 + ((size_t)8 << 20), .scratch = a0 + ((size_t)32 << 20)};
        ex.e.gate = upload_matrix(vk, &L->experts[0].gate, E, &keep[0]);
        ex.e.up = upload_matrix(vk, &L->experts[0].up, E, &keep[1]);
        ex.e.down = upload_matrix(vk, &L->experts[0].down, E, &keep[2]);
        ex.e.n_expert = E;
        printf("kernel_experts_sweep_layer%d_down_type %s\n", layers[li], moex_type_get(ex.e.down.type)->name);
        int i = 0;
        for (const char *p = spec; *p; i++) {
            moex_vk_ex_shape g, d;
            int used = 0;
            if (sscanf(p, "%d.%d.%d/%d.%d.%d%n", &g.wg, &g.rt, &g.ru, &d.wg, &d.rt, &d.ru, &used) != 6 ||
                !moex_vk_testing_ex_shape_ok(vk, 0, g) || !moex_vk_testing_ex_shape_ok(vk, 1, d))
                break;
            p += used + (p[used] == ',');
            printf("kernel_experts_s%d_shape gu=%d.%d.%d dn=%d.%d.%d\n", i, g.wg, g.rt, g.ru, d.wg, d.rt, d.ru);
            for (int b = 0; b < 2; b++) {
                moex_vk_testing_set_ex_shape(vk, 0, b, g);
                moex_vk_testing_set_ex_shape(vk, 1, b, d);
            }
            char name[64];
            snprintf(name, sizeof name, "s%d_L%d_k8", i, layers[li]);
            bench_experts_mv(vk, &ex, act, (size_t)12 << 20, ids, 1, 1, name, copy_bw);
            snprintf(name, sizeof name, "s%d_L%d_k8_cold", i, layers[li]);
            bench_experts_mv(vk, &ex, act, (size_t)12 << 20, ids, 1, E / k, name, copy_bw);
            snprintf(name, sizeof name, "s%d_L%d_n8_distinct", i, layers[li]);
            bench_experts_mv(vk, &ex, act, (size_t)12 << 20, ids, VK_MV_NMAX, 1, name, copy_bw);
        }
        for (int j = 0; j < 3; j++) moex_vk_buffer_free(keep[j]);
    }
    for (int h = 0; h < 2; h++)
        for (int b = 0; b < 2; b++) moex_vk_testing_set_ex_shape(vk, h, b, saved[h][b]);
}

/* The bandwidth ceiling the kernels are measured against (GB/s): a shader
 * streaming y = a + b over 1 GiB (read 2, write 1); vkCmdCopyBuffer beside it. */
static double bench_ceiling(moex_vk *vk) {
    const double gb = 1e9;
    copy_ctx cc = {.n = (size_t)1 << 30};
    cc.a = moex_vk_buffer_create(vk, cc.n, MOEX_VK_MEM_DEVICE, &err);
    cc.b = moex_vk_buffer_create(vk, cc.n, MOEX_VK_MEM_DEVICE, &err);
    MUST(!cc.a || !cc.b);
    moex_vk_buffer *cy = moex_vk_buffer_create(vk, cc.n, MOEX_VK_MEM_DEVICE, &err);
    MUST(!cy);
    add_ctx ac = {moex_vk_buffer_ptr(cc.a), moex_vk_buffer_ptr(cc.b), moex_vk_buffer_ptr(cy), (int64_t)(cc.n / 4)};
    /* an idle GPU runs its SMs at a fraction of their clock (345 of 1980 MHz on
     * the H200) until it has been busy a while: stream for a second first */
    for (const double t0 = moex_time_s(); moex_time_s() - t0 < 1.0;) time_op(vk, rec_add, &ac, 10);
    const double tc = time_op(vk, rec_copy, &cc, 10);
    printf("vkCmdCopyBuffer_GBps %.1f\n", 2.0 * cc.n / tc / gb);
    const double ta = time_op(vk, rec_add, &ac, 10), copy_bw = 3.0 * cc.n / ta / gb;
    printf("copy_GBps %.1f\n", copy_bw);
    moex_vk_buffer_free(cy);
    moex_vk_buffer_free(cc.a);
    moex_vk_buffer_free(cc.b);
    return copy_bw;
}

/* Kernel bandwidths on layer 0: attn_q matvec, the decode expert FFN (one token, and batches of
 * VK_MV_NMAX tokens), the output head, the expert FFN of a 64-token batch. */
static void bench_kernels(const moex_model *m, moex_vk *vk) {
    const moex_hparams *hp = &m->hp;
    const double gb = 1e9, copy_bw = bench_ceiling(vk);

    moex_vk_buffer *act = moex_vk_buffer_create(vk, (size_t)64 << 20, MOEX_VK_MEM_DEVICE, &err), *keep[4];
    MUST(!act);
    const moex_vk_ptr a0 = moex_vk_buffer_ptr(act);
    const moex_layer *L = &m->layers[0];
    MUST(moex_vk_upload(vk, act, 0, (float[4]){0}, 16, &err));
    /* What one tiny dispatch plus the barrier after it costs: the floor under every op of a token. */
    norm_ctx nc = {a0, a0 + ((size_t)1 << 20), 1, hp->n_embd};
    const double tn = time_op(vk, rec_norm, &nc, 500);
    printf("dispatch_barrier_us %.2f\n", tn * 1e6);
    bench_attn_decode(hp, vk, a0, act);
    if (moex_hparams_is_moe(hp)) {
        moex_vk_buffer *rk;
        moex_vk_matrix rw = upload_matrix(vk, &L->router, 1, &rk);
        router_ctx rc = {&rw, a0, a0 + ((size_t)1 << 20), a0 + ((size_t)2 << 20), a0 + ((size_t)2 << 20) + 256,
                         a0 + ((size_t)2 << 20) + 4096, hp->n_expert_used};
        MUST(moex_vk_upload(vk, act, (size_t)2 << 20, (uint32_t[1]){0}, 4, &err));
        const double tr = time_op(vk, rec_router, &rc, 200);
        printf("kernel_router_us %.2f\nkernel_router_GBps %.1f\n", tr * 1e6, rw.rows * rw.row_bytes / tr / gb);
        moex_vk_buffer_free(rk);
    }
    moex_vk_matrix wq = upload_matrix(vk, &L->wq, 1, &keep[0]);
    mat_ctx mq = {&wq, a0, a0 + ((size_t)16 << 20), 1};
    const double tq = time_op(vk, rec_matmul, &mq, 200);
    printf("kernel_attn_q_matvec_us %.2f\nkernel_attn_q_matvec_GBps %.1f\n", tq * 1e6,
           wq.rows * wq.row_bytes / tq / gb);
    /* a big matrix: the output head (n_vocab rows) */
    moex_vk_buffer *hk;
    moex_vk_matrix head = upload_matrix(vk, &m->output, 1, &hk);
    moex_vk_buffer *hy = moex_vk_buffer_create(vk, (size_t)head.rows * 4, MOEX_VK_MEM_DEVICE, &err);
    MUST(!hy);
    mat_ctx mh = {&head, a0, moex_vk_buffer_ptr(hy), 1};
    const double th = time_op(vk, rec_matmul, &mh, 50);
    printf("kernel_output_matvec_us %.2f\nkernel_output_matvec_GBps %.1f\nkernel_output_matvec_vs_copy %.2f\n", th * 1e6,
           head.rows * head.row_bytes / th / gb, head.rows * head.row_bytes / th / gb / copy_bw);
    moex_vk_buffer_free(hy);
    moex_vk_buffer_free(hk);
    if (moex_hparams_is_moe(hp)) {
        ex_ctx ex = {.n = 1, .k = hp->n_expert_used, .x = a0, .y = a0 + ((size_t)8 << 20)};
        ex.e.gate = upload_matrix(vk, &L->experts[0].gate, hp->n_expert, &keep[1]);
        ex.e.up = upload_matrix(vk, &L->experts[0].up, hp->n_expert, &keep[2]);
        ex.e.down = upload_matrix(vk, &L->experts[0].down, hp->n_expert, &keep[3]);
        ex.e.n_expert = hp->n_expert;
        ex.scratch = a0 + ((size_t)32 << 20);
        const int E = hp->n_expert, k = ex.k;
        if (k <= 64) {
            /* one token choosing k experts; a worker's batch of VK_MV_NMAX tokens whose n*k
             * experts are all distinct (up to 64 of them), or drawn from 24 (tokens share them) */
            int32_t spread[VK_MAX_EXPERTS], ids[VK_MV_NMAX * 64];
            fill_spread_ids(spread, E, k);
            bench_experts_mv(vk, &ex, act, (size_t)12 << 20, spread, 1, 1, "k8", copy_bw);
            /* the same over E / k sets that together name every expert: each call's weights come from DRAM */
            bench_experts_mv(vk, &ex, act, (size_t)12 << 20, spread, 1, E / k, "k8_cold", copy_bw);
            if (VK_MV_NMAX * k <= E)
                bench_experts_mv(vk, &ex, act, (size_t)12 << 20, spread, VK_MV_NMAX, 1, "n8_distinct", copy_bw);
            if (k <= 24 && E >= 24) {
                for (int t = 0; t < VK_MV_NMAX; t++)
                    for (int j = 0; j < k; j++) ids[t * k + j] = (int32_t)((t * 3 + j * 5) % 24);
                bench_experts_mv(vk, &ex, act, (size_t)12 << 20, ids, VK_MV_NMAX, 1, "n8_shared24", copy_bw);
            }
            /* The server's batch of 8 sequences (MOEX_VK_EACH): distinct experts, uniformly drawn ones (a
             * random-weight model's router: ~52 distinct of 128), and every token the same k */
            ex.each = true;
            if (VK_MV_NMAX * k <= E)
                bench_experts_mv(vk, &ex, act, (size_t)12 << 20, spread, VK_MV_NMAX, 1, "each8_distinct", copy_bw);
            uint64_t rng = 1;   /* a fixed draw: runs compare */
            for (int t = 0; t < VK_MV_NMAX; t++)
                for (int j = 0; j < k; j++) {
                    bool dup;
                    do {   /* k distinct experts a token, as top-k gives */
                        ids[t * k + j] = (int32_t)(moex_splitmix64(&rng) % (uint64_t)E);
                        dup = false;
                        for (int q = 0; q < j; q++) dup |= ids[t * k + q] == ids[t * k + j];
                    } while (dup);
                }
            bench_experts_mv(vk, &ex, act, (size_t)12 << 20, ids, VK_MV_NMAX, 1, "each8_uniform", copy_bw);
            for (int t = 0; t < VK_MV_NMAX; t++)
                for (int j = 0; j < k; j++) ids[t * k + j] = spread[j];
            bench_experts_mv(vk, &ex, act, (size_t)12 << 20, ids, VK_MV_NMAX, 1, "each8_same", copy_bw);
            ex.each = false;
        }
        /* The same FFN over every expert at once (a 64-token batch on the tiled path): its weights once, compute-bound. */
        enum { NT = 64 };
        int32_t bids[NT * 64];
        float bw[NT * 64];
        for (int t = 0; t < NT; t++)
            for (int j = 0; j < ex.k && j < 64; j++)
                bids[t * ex.k + j] = (int32_t)((t * 7 + j * 37 + 11) % hp->n_expert), bw[t * ex.k + j] = 1.0f / ex.k;
        MUST(NT * ex.k * 4 > 4096);   /* one id set (EX_SET_BYTES): the ids, their weights 4 KiB on */
        MUST(moex_vk_upload(vk, act, (size_t)12 << 20, bids, (size_t)(NT * ex.k) * 4, &err));
        MUST(moex_vk_upload(vk, act, ((size_t)12 << 20) + 4096, bw, (size_t)(NT * ex.k) * 4, &err));
        ex.ids = a0 + ((size_t)12 << 20);
        ex.sets = 1;
        ex.n = NT;
        const double tb = time_op(vk, rec_experts, &ex, 20);
        const double flops = 2.0 * NT * ex.k * 3.0 * (double)ex.e.gate.rows * ex.e.gate.cols;
        printf("kernel_experts_batch%d_us %.2f\nkernel_experts_batch%d_TFLOPs %.2f\n", NT, tb * 1e6, NT, flops / tb / 1e12);
        for (int i = 1; i < 4; i++) moex_vk_buffer_free(keep[i]);
        bench_experts_sweep(m, vk, act, copy_bw, false);
    }
    moex_vk_buffer_free(keep[0]);
    moex_vk_buffer_free(act);
}

/* Decode of n_streams sequences at once through moex_vk_forward_batch (what
 * `moex-hub serve --parallel` runs for greedy requests): each slot's 32-token
 * prompt, then n_g steps of one token per slot, each row's token its argmax
 * taken on the GPU (argmax_only: no logits read back). Prints
 * streams<N>_step_ms (median step) and the aggregate tok/s.
 * --vk-tune profile=1 adds the GPU's per-op table. */
static void bench_streams(const moex_model *m, const moex_vk_options *o, int n_streams, int n_g) {
    const int P = 32;
    const int64_t V = m->hp.n_vocab, n_ctx = P + n_g + 8;
    moex_engine eng;
    MUST(moex_engine_open(m, &(moex_engine_options){.backend = MOEX_ENGINE_VULKAN, .vk = *o, .n_ctx = n_ctx,
                                                    .n_batch = P > n_streams ? P : n_streams, .n_seq = n_streams,
                                                    .batched = true}, &eng, &err));
    moex_vk_state *s = moex_engine_vk_state(&eng);
    const size_t nt = (size_t)(P + n_streams);
    int32_t *tok = malloc(nt * sizeof *tok), *seq = malloc(nt * sizeof *seq), *pos = malloc(nt * sizeof *pos);
    bool *want = malloc(nt * sizeof *want);
    float *logits = malloc((size_t)n_streams * (size_t)V * sizeof *logits);
    int32_t *next = malloc((size_t)n_streams * sizeof *next);
    bool *only = malloc((size_t)n_streams * sizeof *only);
    MUST(!tok || !seq || !pos || !want || !logits || !next || !only);
    for (int q = 0; q < n_streams; q++) only[q] = true;
    for (int q = 0; q < n_streams; q++) {   /* each slot's prompt: distinct tokens */
        for (int i = 0; i < P; i++) {
            tok[i] = (int32_t)((1 + 7919 * (int64_t)(q * P + i)) % V);
            seq[i] = q, pos[i] = i, want[i] = i == P - 1;
        }
        const moex_batch prompt = {.n = P, .tokens = tok, .seq = seq, .pos = pos, .want_logits = want};
        MUST(moex_vk_forward_batch(m, s, &prompt, logits, &err));
        next[q] = 0;
        for (int64_t v = 1; v < V; v++) if (logits[v] > logits[next[q]]) next[q] = (int32_t)v;
    }
    double *step = malloc((size_t)n_g * sizeof *step);
    MUST(!step);
    const double t_all = moex_time_s();
    for (int i = 0; i < n_g; i++) {
        for (int q = 0; q < n_streams; q++) tok[q] = next[q], seq[q] = q, pos[q] = P + i, want[q] = true;
        const double t0 = moex_time_s();
        MUST(moex_vk_forward_batch(m, s, &(moex_batch){.n = n_streams, .tokens = tok, .seq = seq, .pos = pos,
                                                        .want_logits = want, .argmax = next, .argmax_only = only},
                                   logits, &err));
        step[i] = moex_time_s() - t0;
    }
    const double wall = moex_time_s() - t_all;
    printf("streams%d_step_ms %.3f\nstreams%d_tok_s %.1f\n", n_streams, 1e3 * median(step, n_g), n_streams,
           n_streams * n_g / wall);
    free(step), free(tok), free(seq), free(pos), free(want), free(logits), free(next), free(only);
    moex_engine_close(&eng);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_vk MODEL.gguf [--device N] [--vk-tune K=V,...] [-p 512] [-n 128] [-r 3] [--ctx N] [--round] "
                        "[--no-kernels|--only-kernels|--only-experts|--streams N,...]\n");
        return 2;
    }
    int n_p = 512, n_g = 128, reps = 3;
    bool kernels = true, only_kernels = false;   /* --only-kernels: skip pp/tg (compare kernel variants) */
    bool only_experts = false;   /* --only-experts: the expert shapes of MOEX_VK_EX_SWEEP alone */
    int n_ctx = 0;   /* --ctx: the state's context (default: the prompt, the decode and 8) */
    const char *streams = NULL;   /* --streams 1,8: only the batched decode of that many sequences (bench_streams) */
    moex_vk_options o = {.device = -1, .verbose = true};
    for (int i = 2; i < argc; i++) {
        const bool has = i + 1 < argc;
        if (!strcmp(argv[i], "--device") && has) o.device = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--vk-tune") && has) MUST(moex_vk_options_tune(&o, argv[++i], &err));
        else if (!strcmp(argv[i], "-p") && has) n_p = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && has) n_g = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && has) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ctx") && has) n_ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--round")) o.round_activations = true;
        else if (!strcmp(argv[i], "--no-kernels")) kernels = false;
        else if (!strcmp(argv[i], "--only-kernels")) only_kernels = true;
        else if (!strcmp(argv[i], "--only-experts")) only_experts = true;
        else if (!strcmp(argv[i], "--streams") && has) streams = argv[++i];
        else {
            fprintf(stderr, "bench_vk: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (n_p < 1 || n_g < 1 || reps < 1 || reps > 64) return 2;
    if (n_ctx < n_p + n_g + 8) n_ctx = n_p + n_g + 8;
    double t0 = moex_time_s();
    moex_model *m = moex_model_load(argv[1], &err);
    MUST(!m);
    char desc[256];
    moex_model_describe(m, desc, sizeof desc);
    printf("model %s\n", desc);
    if (streams) {
        for (const char *p = streams; *p;) {
            char *end;
            const long n = strtol(p, &end, 10);
            if (end == p || n < 1 || n > 256) {
                fprintf(stderr, "bench_vk: --streams takes counts 1..256, comma-separated\n");
                return 2;
            }
            bench_streams(m, &o, (int)n, n_g);
            p = *end == ',' ? end + 1 : end;
        }
        moex_model_free(m);
        return 0;
    }
    moex_engine eng;
    MUST(moex_engine_open(m, &(moex_engine_options){.backend = MOEX_ENGINE_VULKAN, .vk = o, .n_ctx = n_ctx,
                                                    .n_batch = n_p}, &eng, &err));
    moex_vk_state *s = moex_engine_vk_state(&eng);
    printf("device %s\nload_s %.2f\n", moex_vk_get_info(moex_vk_state_device(s))->name, moex_time_s() - t0);
    if (only_experts && moex_hparams_is_moe(&m->hp)) {
        moex_vk *vk = moex_vk_state_device(s);
        moex_vk_buffer *act = moex_vk_buffer_create(vk, (size_t)64 << 20, MOEX_VK_MEM_DEVICE, &err);
        MUST(!act);
        bench_experts_sweep(m, vk, act, bench_ceiling(vk), true);
        moex_vk_buffer_free(act);
    }
    if (only_kernels || only_experts) {
        if (!only_experts) bench_kernels(m, moex_vk_state_device(s));
        moex_engine_close(&eng);
        moex_model_free(m);
        return 0;
    }
    const int64_t V = m->hp.n_vocab;
    int32_t *toks = malloc((size_t)n_p * sizeof *toks);
    for (int i = 0; i < n_p; i++) toks[i] = (int32_t)((i * 7919 + 13) % V); /* like llama-bench */
    double pp[64], tg0[64], tgd[64];
    /* The decoded tokens after the prompt, hashed (FNV-1a): equal in every
     * repetition (the kernels reduce in a fixed order), and a run with a
     * tuning switch set (--vk-tune ex_shape, mv_groups) must print the
     * same hash. */
    uint32_t tok_hash[64];
    /* warm-up: compiles every variant used below */
    MUST(moex_vk_forward(m, s, toks, n_p, 0, false, NULL, &err));
    MUST(moex_vk_forward(m, s, toks, 1, 0, false, NULL, &err));
    for (int r = 0; r < reps; r++) {
        double t = moex_time_s();
        int32_t tok = toks[0];
        for (int i = 0; i < n_g; i++) {   /* decode from an empty context */
            MUST(moex_vk_forward(m, s, &tok, 1, i, false, NULL, &err));
            tok = moex_vk_last_argmax(s);
        }
        tg0[r] = n_g / (moex_time_s() - t);
        t = moex_time_s();
        MUST(moex_vk_forward(m, s, toks, n_p, 0, false, NULL, &err));
        pp[r] = n_p / (moex_time_s() - t);
        tok = moex_vk_last_argmax(s);
        t = moex_time_s();
        uint32_t h = 2166136261u;
        for (int i = 0; i < n_g; i++) {   /* decode after the prompt */
            MUST(moex_vk_forward(m, s, &tok, 1, n_p + i, false, NULL, &err));
            tok = moex_vk_last_argmax(s);
            h = (h ^ (uint32_t)tok) * 16777619u;
        }
        tgd[r] = n_g / (moex_time_s() - t);
        tok_hash[r] = h;
        fprintf(stderr, "bench_vk: rep %d: pp%d %.1f tok/s, tg%d %.1f tok/s, tg%d@%d %.1f tok/s\n", r + 1, n_p, pp[r],
                n_g, tg0[r], n_g, n_p, tgd[r]);
    }
    printf("pp%d_tok_s %.2f\ntg%d_tok_s %.2f\ntg%d_after_pp%d_tok_s %.2f\n", n_p, median(pp, reps), n_g,
           median(tg0, reps), n_g, n_p, median(tgd, reps));
    bool same = true;
    for (int r = 1; r < reps; r++) same = same && tok_hash[r] == tok_hash[0];
    printf("tg_after_pp_tokens_fnv %08x\ntg_tokens_repeat %s\n", tok_hash[0], same ? "yes" : "NO");
    if (!same) fprintf(stderr, "bench_vk: the decoded tokens differ between repetitions\n");
    if (kernels) bench_kernels(m, moex_vk_state_device(s));
    free(toks);
    moex_engine_close(&eng);
    moex_model_free(m);
    return 0;
}
