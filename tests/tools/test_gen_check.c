/* Checks a model written by `moex-gguf gen` against what the command line
 * asked for, with expectations written out here independently of the
 * generator: llama.cpp's tensor names and GGUF shapes for the architecture,
 * the weight types for --type, the hyperparameters our loader reads, the
 * copied tokenizer, and (with --stats) that the weights are numerically
 * healthy: dequantized std near 1/sqrt(fan_in), norms in 1 +- 0.1.
 *
 *   test_gen_check MODEL --arch A --type T --layers N --hidden N --heads N
 *       --kv-heads N --head-dim N --ff N --experts N --experts-used N
 *       --expert-ff N --vocab-size N [--tied] [--stats]
 * Exit 0 when everything matches, 1 with the list of mismatches. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/common.h"
#include "kernels/kernels.h"

typedef struct expect {
    const char *arch, *type;
    long layers, hidden, heads, kv_heads, head_dim, ff, experts, experts_used, expert_ff, vocab;
    int tied, stats;
} expect;

static int failures;

#define CHECK(cond, ...)                        \
    do {                                        \
        if (!(cond)) {                          \
            fprintf(stderr, "FAIL: " __VA_ARGS__); \
            fputc('\n', stderr);                \
            failures++;                         \
        }                                       \
    } while (0)

static int is_moe(const expect *e) { return !strcmp(e->arch, "qwen3moe") || !strcmp(e->arch, "mixtral"); }
static int has_qk_norm(const expect *e) { return !strcmp(e->arch, "qwen3moe") || !strcmp(e->arch, "qwen3"); }

/* One expected tensor. */
typedef struct want {
    char name[64];
    int n_dims;
    int64_t ne[3];
    int is_f32_param;   /* norm or router: always f32 */
    double std;         /* expected std of values (0: a norm, 1 +- 0.1) */
} want;

typedef struct want_list {
    want w[4096];
    int n;
} want_list;

static void add(want_list *l, int n_dims, int64_t ne0, int64_t ne1, int64_t ne2, int f32, double std, const char *fmt,
                int layer) {
    want *w = &l->w[l->n++];
    snprintf(w->name, sizeof w->name, fmt, layer);
    w->n_dims = n_dims;
    w->ne[0] = ne0;
    w->ne[1] = ne1;
    w->ne[2] = ne2;
    w->is_f32_param = f32;
    w->std = std;
}

/* llama.cpp's layout (src/models/{llama,qwen3,qwen3moe}.cpp), ne[0] = input dim. */
static void expected_tensors(const expect *e, want_list *l) {
    int64_t E = e->hidden, q = e->heads * e->head_dim, kv = e->kv_heads * e->head_dim;
    double out_std = 3.0 / sqrt((double)E);
    add(l, 2, E, e->vocab, 1, 0, e->tied ? out_std : 1.0, "token_embd.weight", 0);
    add(l, 1, E, 1, 1, 1, 0, "output_norm.weight", 0);
    if (!e->tied) add(l, 2, E, e->vocab, 1, 0, out_std, "output.weight", 0);
    for (int i = 0; i < e->layers; i++) {
        add(l, 1, E, 1, 1, 1, 0, "blk.%d.attn_norm.weight", i);
        add(l, 2, E, q, 1, 0, 1 / sqrt((double)E), "blk.%d.attn_q.weight", i);
        add(l, 2, E, kv, 1, 0, 1 / sqrt((double)E), "blk.%d.attn_k.weight", i);
        add(l, 2, E, kv, 1, 0, 1 / sqrt((double)E), "blk.%d.attn_v.weight", i);
        add(l, 2, q, E, 1, 0, 1 / sqrt((double)q), "blk.%d.attn_output.weight", i);
        if (has_qk_norm(e)) {
            add(l, 1, e->head_dim, 1, 1, 1, 0, "blk.%d.attn_q_norm.weight", i);
            add(l, 1, e->head_dim, 1, 1, 1, 0, "blk.%d.attn_k_norm.weight", i);
        }
        add(l, 1, E, 1, 1, 1, 0, "blk.%d.ffn_norm.weight", i);
        if (is_moe(e)) {
            int64_t f = e->expert_ff, X = e->experts;
            add(l, 2, E, X, 1, 1, 1.5 / sqrt((double)E), "blk.%d.ffn_gate_inp.weight", i);
            add(l, 3, E, f, X, 0, 1 / sqrt((double)E), "blk.%d.ffn_gate_exps.weight", i);
            add(l, 3, E, f, X, 0, 1 / sqrt((double)E), "blk.%d.ffn_up_exps.weight", i);
            add(l, 3, f, E, X, 0, 1 / sqrt((double)f), "blk.%d.ffn_down_exps.weight", i);
        } else {
            add(l, 2, E, e->ff, 1, 0, 1 / sqrt((double)E), "blk.%d.ffn_gate.weight", i);
            add(l, 2, E, e->ff, 1, 0, 1 / sqrt((double)E), "blk.%d.ffn_up.weight", i);
            add(l, 2, e->ff, E, 1, 0, 1 / sqrt((double)e->ff), "blk.%d.ffn_down.weight", i);
        }
    }
}

/* --type T for a row of ne0: T, or llama.cpp's fallback (llama-quant.cpp
 * tensor_type_fallback) when ne0 is not a multiple of T's block. */
static moex_type uniform_type(const char *name, int64_t ne0) {
    moex_type t = (moex_type)moex_type_from_name(name);
    if (ne0 % moex_type_get(t)->block_elems == 0) return t;
    moex_type f = t == MOEX_TYPE_Q4_K ? MOEX_TYPE_Q5_0 : t == MOEX_TYPE_Q5_K ? MOEX_TYPE_Q5_1
                : t == MOEX_TYPE_Q6_K ? MOEX_TYPE_Q8_0 : t;
    return ne0 % moex_type_get(f)->block_elems ? MOEX_TYPE_F16 : f;
}

/* Types: uniform -> exactly that type; q4_K_M -> llama.cpp's picks for the
 * tensors whose choice does not depend on the layer; mixed -> checked as a set. */
static void check_type(const expect *e, const want *w, const moex_gguf_tensor *t) {
    const char *tn = moex_type_get(t->type) ? moex_type_get(t->type)->name : "?";
    if (w->is_f32_param) {
        CHECK(t->type == MOEX_TYPE_F32, "%s: type %s, want f32 (norms and routers stay f32)", w->name, tn);
        return;
    }
    if (!strcmp(e->type, "mixed")) return;
    if (!strcasecmp(e->type, "mxfp4_moe")) {   /* llama.cpp's MXFP4_MOE: experts mxfp4, the rest q8_0 */
        const moex_type want = w->n_dims == 3 ? MOEX_TYPE_MXFP4 : uniform_type("q8_0", w->ne[0]);
        CHECK(t->type == want, "%s: %s, want %s in mxfp4_moe", w->name, tn, moex_type_get(want)->name);
        return;
    }
    if (!strcasecmp(e->type, "q4_K_M")) {
        int eight = is_moe(e) && e->experts == 8;
        if (!strcmp(w->name, "output.weight"))
            CHECK(t->type == MOEX_TYPE_Q6_K, "%s: %s, want q6_K in q4_K_M", w->name, tn);
        else if (strstr(w->name, "attn_v") || strstr(w->name, "attn_k.") || strstr(w->name, "ffn_down"))
            CHECK(t->type == MOEX_TYPE_Q4_K || t->type == MOEX_TYPE_Q6_K || (eight && t->type == MOEX_TYPE_Q8_0),
                  "%s: %s, not a q4_K_M choice", w->name, tn);
        else if (strstr(w->name, "attn_output"))
            CHECK(t->type == (eight ? MOEX_TYPE_Q5_K : MOEX_TYPE_Q4_K), "%s: %s in q4_K_M", w->name, tn);
        else
            CHECK(t->type == MOEX_TYPE_Q4_K, "%s: %s, want q4_K in q4_K_M", w->name, tn);
        return;
    }
    CHECK(t->type == uniform_type(e->type, w->ne[0]), "%s: type %s, want %s", w->name, tn,
          moex_type_get(uniform_type(e->type, w->ne[0]))->name);
}

/* Mean and std of all values (dequantized). */
static int tensor_stats(const moex_gguf_tensor *t, double *mean, double *std, double *lo, double *hi) {
    int64_t ne0 = t->ne[0], rows = t->n_elements / ne0;
    size_t rb = moex_row_bytes(t->type, ne0);
    float *row = malloc((size_t)ne0 * sizeof *row);
    if (!row) return -1;
    double s = 0, s2 = 0;
    *lo = INFINITY, *hi = -INFINITY;
    for (int64_t r = 0; r < rows; r++) {
        if (moex_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * rb, row, ne0, NULL)) {
            free(row);
            return -1;
        }
        for (int64_t i = 0; i < ne0; i++) {
            double v = row[i];
            s += v;
            s2 += v * v;
            if (v < *lo) *lo = v;
            if (v > *hi) *hi = v;
        }
    }
    free(row);
    double n = (double)t->n_elements;
    *mean = s / n;
    *std = sqrt(fmax(s2 / n - *mean * *mean, 0));
    return 0;
}

static void check_stats(const want *w, const moex_gguf_tensor *t) {
    double mean, std, lo, hi;
    if (tensor_stats(t, &mean, &std, &lo, &hi)) {
        CHECK(0, "%s: cannot dequantize", w->name);
        return;
    }
    CHECK(isfinite(mean) && isfinite(std) && isfinite(lo) && isfinite(hi), "%s: non-finite values", w->name);
    if (w->std == 0) {   /* norm weights: 1 +- 0.1 (f32 exactly) */
        CHECK(lo >= 0.9 - 1e-6 && hi <= 1.1 + 1e-6 && fabs(mean - 1) < 0.05, "%s: norm weights in [%g, %g], mean %g",
              w->name, lo, hi, mean);
        return;
    }
    /* Quantization (and the random-block generator's scale choices) keep the
     * std within ~10% of the target; 25% leaves room without hiding a wrong scale. */
    CHECK(fabs(std / w->std - 1) < 0.25, "%s: std %.4g, want %.4g", w->name, std, w->std);
    CHECK(fabs(mean) < 0.1 * w->std + 1e-6, "%s: mean %.4g is off-centre (std %.4g)", w->name, mean, w->std);
}

static int parse_args(int argc, char **argv, expect *e) {
    memset(e, 0, sizeof *e);
    struct { const char *flag; long *v; } nums[] = {
        {"--layers", &e->layers}, {"--hidden", &e->hidden}, {"--heads", &e->heads}, {"--kv-heads", &e->kv_heads},
        {"--head-dim", &e->head_dim}, {"--ff", &e->ff}, {"--experts", &e->experts},
        {"--experts-used", &e->experts_used}, {"--expert-ff", &e->expert_ff}, {"--vocab-size", &e->vocab},
    };
    for (int i = 2; i < argc; i++) {
        int used = 0;
        if (!strcmp(argv[i], "--tied")) { e->tied = used = 1; }
        else if (!strcmp(argv[i], "--stats")) { e->stats = used = 1; }
        else if (i + 1 < argc && !strcmp(argv[i], "--arch")) { e->arch = argv[++i]; used = 1; }
        else if (i + 1 < argc && !strcmp(argv[i], "--type")) { e->type = argv[++i]; used = 1; }
        for (size_t k = 0; !used && k < sizeof nums / sizeof nums[0]; k++)
            if (i + 1 < argc && !strcmp(argv[i], nums[k].flag)) {
                *nums[k].v = atol(argv[++i]);
                used = 1;
            }
        if (!used) {
            fprintf(stderr, "test_gen_check: bad argument '%s'\n", argv[i]);
            return -1;
        }
    }
    if (!e->arch || !e->type || e->layers <= 0 || e->hidden <= 0 || e->vocab <= 0) {
        fprintf(stderr, "test_gen_check: --arch, --type, --layers, --hidden, --vocab-size are required\n");
        return -1;
    }
    return 0;
}

static void check_hparams(const expect *e, const moex_gguf *g) {
    moex_hparams hp;
    moex_error err = {{0}};
    if (moex_hparams_read(g, &hp, &err)) {
        CHECK(0, "our loader rejects the model: %s", err.msg);
        return;
    }
    CHECK(!strcmp(hp.arch_name, strcmp(e->arch, "mixtral") ? e->arch : "llama"), "general.architecture %s for %s",
          hp.arch_name, e->arch);
    CHECK(hp.n_layer == e->layers && hp.n_embd == e->hidden && hp.n_head == e->heads && hp.n_head_kv == e->kv_heads &&
              hp.head_dim == e->head_dim && hp.n_vocab == e->vocab,
          "hparams: layers %d hidden %d heads %d/%d head_dim %d vocab %d", hp.n_layer, hp.n_embd, hp.n_head,
          hp.n_head_kv, hp.head_dim, hp.n_vocab);
    if (is_moe(e))
        CHECK(hp.n_expert == e->experts && hp.n_expert_used == e->experts_used && hp.n_ff_exp == e->expert_ff,
              "experts %d/%d ff %d", hp.n_expert_used, hp.n_expert, hp.n_ff_exp);
    else
        CHECK(hp.n_expert == 0 && hp.n_ff == e->ff, "dense: experts %d, ff %d", hp.n_expert, hp.n_ff);
    CHECK(hp.rope_dim == e->head_dim, "rope_dim %d", hp.rope_dim);
    const moex_gguf_value *toks = moex_gguf_get_array(g, "tokenizer.ggml.tokens", MOEX_GGUF_STRING, &err);
    CHECK(toks && (long)toks->v.arr.n == e->vocab, "tokenizer.ggml.tokens missing or not %ld long", e->vocab);
    CHECK(moex_gguf_find(g, "tokenizer.ggml.model") != NULL, "tokenizer.ggml.model not copied");
    const char *a = strcmp(e->arch, "mixtral") ? e->arch : "llama";
    char key[96];
    snprintf(key, sizeof key, "%s.context_length", a);
    CHECK(moex_gguf_find(g, key) != NULL, "%s missing (llama.cpp requires it)", key);
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a);
    CHECK(moex_gguf_find(g, key) != NULL, "%s missing (llama.cpp requires it)", key);
}

int main(int argc, char **argv) {
    expect e;
    if (argc < 2 || parse_args(argc, argv, &e)) return 2;
    moex_error err = {{0}};
    moex_gguf *g = moex_gguf_open(argv[1], &err);
    if (!g) {
        fprintf(stderr, "FAIL: cannot open %s: %s\n", argv[1], err.msg);
        return 1;
    }
    check_hparams(&e, g);
    static want_list l;
    expected_tensors(&e, &l);
    CHECK((int)g->n_tensors == l.n, "%llu tensors, want %d", (unsigned long long)g->n_tensors, l.n);
    int seen[MOEX_TYPE_COUNT] = {0};
    for (int i = 0; i < l.n; i++) {
        const want *w = &l.w[i];
        const moex_gguf_tensor *t = moex_gguf_find_tensor(g, w->name);
        if (!t) {
            CHECK(0, "missing tensor %s", w->name);
            continue;
        }
        CHECK((int)t->n_dims == w->n_dims && t->ne[0] == w->ne[0] && t->ne[1] == w->ne[1] && t->ne[2] == w->ne[2],
              "%s: shape [%lld %lld %lld] (%u dims), want [%lld %lld %lld] (%d dims)", w->name, (long long)t->ne[0],
              (long long)t->ne[1], (long long)t->ne[2], t->n_dims, (long long)w->ne[0], (long long)w->ne[1],
              (long long)w->ne[2], w->n_dims);
        check_type(&e, w, t);
        if (!w->is_f32_param) seen[t->type]++;
        if (e.stats) check_stats(w, t);
    }
    if (!strcmp(e.type, "mixed")) {
        for (int t = 0; t < MOEX_TYPE_COUNT; t++) {
            const moex_type_traits *tt = moex_type_get(t);
            /* mixed leaves out MXFP4 while only the CPU has kernels for it (the Vulkan tests run mixed models) */
            if (tt && tt->is_weight_type && t != MOEX_TYPE_MXFP4)
                CHECK(seen[t] > 0, "mixed: no tensor of type %s", tt->name);
        }
    }
    moex_gguf_close(g);
    if (failures) {
        fprintf(stderr, "%d check(s) failed for %s\n", failures, argv[1]);
        return 1;
    }
    printf("ok %s: %d tensors\n", argv[1], l.n);
    return 0;
}
