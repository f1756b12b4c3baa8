/* Binds a GGUF file's tensors to the model's weights, checking every shape
 * the forward pass relies on. Weights stay in the mapping; only norm vectors
 * stored in a half type are converted to f32. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model/model.h"

typedef struct binder {
    const moex_gguf *g;
    float *owned;        /* converted norm vectors */
    size_t owned_used, owned_cap;
    moex_error *err;
} binder;

static const moex_gguf_tensor *find_tensor(binder *b, const char *fmt, int layer, int expert, bool required) {
    char name[96];
    snprintf(name, sizeof name, fmt, layer, expert);
    const moex_gguf_tensor *t = moex_gguf_find_tensor(b->g, name);
    if (!t && required) moex_fail(b->err, "missing tensor %s", name);
    return t;
}

static int bind_matrix_view(binder *b, const moex_gguf_tensor *t, int64_t cols, int64_t rows, int64_t slice,
                            moex_matrix *out) {
    size_t row_bytes = moex_row_bytes(t->type, cols);
    const moex_type_traits *tt = moex_type_get(t->type);
    if (!tt || !tt->is_weight_type || row_bytes == 0)
        return moex_fail(b->err, "tensor %.*s: type %s cannot be used as a matrix with %lld columns",
                         (int)t->name.len, t->name.data, tt ? tt->name : "?", (long long)cols);
    out->type = t->type;
    out->rows = rows;
    out->cols = cols;
    out->row_bytes = row_bytes;
    out->data = (const uint8_t *)t->data + (size_t)slice * (size_t)rows * row_bytes;
    return 0;
}

/* A 2D weight [cols, rows]. */
static int bind_matrix(binder *b, const char *fmt, int layer, int expert, int64_t cols, int64_t rows,
                       moex_matrix *out) {
    const moex_gguf_tensor *t = find_tensor(b, fmt, layer, expert, true);
    if (!t) return -1;
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1)
        return moex_fail(b->err, "tensor %.*s has shape [%lld, %lld, %lld], expected [%lld, %lld]",
                         (int)t->name.len, t->name.data, (long long)t->ne[0], (long long)t->ne[1],
                         (long long)t->ne[2], (long long)cols, (long long)rows);
    return bind_matrix_view(b, t, cols, rows, 0, out);
}

/* A 3D expert tensor [cols, rows, n_expert]: one matrix per expert. */
static int bind_expert_matrices(binder *b, const char *fmt, int layer, int64_t cols, int64_t rows,
                                int n_expert, moex_expert_weights *experts, size_t field_offset) {
    const moex_gguf_tensor *t = find_tensor(b, fmt, layer, 0, true);
    if (!t) return -1;
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != n_expert || t->ne[3] != 1)
        return moex_fail(b->err, "tensor %.*s has shape [%lld, %lld, %lld], expected [%lld, %lld, %d]",
                         (int)t->name.len, t->name.data, (long long)t->ne[0], (long long)t->ne[1],
                         (long long)t->ne[2], (long long)cols, (long long)rows, n_expert);
    for (int e = 0; e < n_expert; e++)
        if (bind_matrix_view(b, t, cols, rows, e, (moex_matrix *)((char *)&experts[e] + field_offset))) return -1;
    return 0;
}

static const float *bind_vector(binder *b, const char *fmt, int layer, int64_t n) {
    const moex_gguf_tensor *t = find_tensor(b, fmt, layer, 0, true);
    if (!t) return NULL;
    if (t->ne[0] != n || t->n_elements != n) {
        moex_fail(b->err, "tensor %.*s has %lld elements, expected %lld", (int)t->name.len, t->name.data,
                  (long long)t->n_elements, (long long)n);
        return NULL;
    }
    if (t->type == MOEX_TYPE_F32) {
        if (((uintptr_t)t->data & 3) == 0) return t->data;
    } else if (t->type != MOEX_TYPE_F16 && t->type != MOEX_TYPE_BF16) {
        moex_fail(b->err, "tensor %.*s: norm weights must be f32, f16 or bf16", (int)t->name.len, t->name.data);
        return NULL;
    }
    if (b->owned_used + (size_t)n > b->owned_cap) {
        moex_fail(b->err, "internal: norm buffer too small");
        return NULL;
    }
    float *dst = b->owned + b->owned_used;
    b->owned_used += (size_t)n;
    if (t->type == MOEX_TYPE_F32) { /* unaligned in the file */
        memcpy(dst, t->data, (size_t)n * sizeof(float));
        return dst;
    }
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, (const uint8_t *)t->data + 2 * i, 2);
        dst[i] = t->type == MOEX_TYPE_F16 ? moex_f16_to_f32(h) : moex_bf16_to_f32(h);
    }
    return dst;
}

static int bind_moe(binder *b, const moex_hparams *hp, int il, moex_layer *L) {
    const int64_t d = hp->n_embd, f = hp->n_ff_exp;
    if (bind_matrix(b, MOEX_T_FFN_ROUTER, il, 0, d, hp->n_expert, &L->router)) return -1;
    L->experts = calloc((size_t)hp->n_expert, sizeof *L->experts);
    if (!L->experts) return moex_fail(b->err, "out of memory");
    if (find_tensor(b, MOEX_T_FFN_GATE_EXPS, il, 0, false)) {
        return bind_expert_matrices(b, MOEX_T_FFN_GATE_EXPS, il, d, f, hp->n_expert, L->experts,
                                    offsetof(moex_expert_weights, gate)) ||
               bind_expert_matrices(b, MOEX_T_FFN_UP_EXPS, il, d, f, hp->n_expert, L->experts,
                                    offsetof(moex_expert_weights, up)) ||
               bind_expert_matrices(b, MOEX_T_FFN_DOWN_EXPS, il, f, d, hp->n_expert, L->experts,
                                    offsetof(moex_expert_weights, down))
                   ? -1 : 0;
    }
    for (int e = 0; e < hp->n_expert; e++) { /* older Mixtral files: one tensor per expert */
        moex_expert_weights *x = &L->experts[e];
        if (bind_matrix(b, MOEX_T_FFN_GATE_EXP, il, e, d, f, &x->gate) ||
            bind_matrix(b, MOEX_T_FFN_UP_EXP, il, e, d, f, &x->up) ||
            bind_matrix(b, MOEX_T_FFN_DOWN_EXP, il, e, f, d, &x->down))
            return -1;
    }
    return 0;
}

static int bind_layer(binder *b, const moex_hparams *hp, int il, moex_layer *L) {
    const int64_t d = hp->n_embd, q_dim = (int64_t)hp->n_head * hp->head_dim,
                  kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    if (!(L->attn_norm = bind_vector(b, MOEX_T_ATTN_NORM, il, d))) return -1;
    if (!(L->ffn_norm = bind_vector(b, MOEX_T_FFN_NORM, il, d))) return -1;
    if (hp->qk_norm && (!(L->q_norm = bind_vector(b, MOEX_T_ATTN_Q_NORM, il, hp->head_dim)) ||
                        !(L->k_norm = bind_vector(b, MOEX_T_ATTN_K_NORM, il, hp->head_dim))))
        return -1;
    if (bind_matrix(b, MOEX_T_ATTN_Q, il, 0, d, q_dim, &L->wq) || bind_matrix(b, MOEX_T_ATTN_K, il, 0, d, kv_dim, &L->wk) ||
        bind_matrix(b, MOEX_T_ATTN_V, il, 0, d, kv_dim, &L->wv) || bind_matrix(b, MOEX_T_ATTN_OUT, il, 0, q_dim, d, &L->wo))
        return -1;
    if (moex_hparams_is_moe(hp)) return bind_moe(b, hp, il, L);
    return bind_matrix(b, MOEX_T_FFN_GATE, il, 0, d, hp->n_ff, &L->ffn_gate) ||
                   bind_matrix(b, MOEX_T_FFN_UP, il, 0, d, hp->n_ff, &L->ffn_up) ||
                   bind_matrix(b, MOEX_T_FFN_DOWN, il, 0, hp->n_ff, d, &L->ffn_down)
               ? -1 : 0;
}

static int bind_model(binder *b, moex_model *m) {
    const moex_hparams *hp = &m->hp;
    if (bind_matrix(b, MOEX_T_TOKEN_EMBD, 0, 0, hp->n_embd, hp->n_vocab, &m->tok_embd)) return -1;
    if (!(m->output_norm = bind_vector(b, MOEX_T_OUTPUT_NORM, 0, hp->n_embd))) return -1;
    if (moex_gguf_find_tensor(b->g, MOEX_T_OUTPUT)) {
        if (bind_matrix(b, MOEX_T_OUTPUT, 0, 0, hp->n_embd, hp->n_vocab, &m->output)) return -1;
    } else {
        m->output = m->tok_embd; /* tied embeddings */
    }
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return moex_fail(b->err, "out of memory");
    for (int il = 0; il < hp->n_layer; il++)
        if (bind_layer(b, hp, il, &m->layers[il])) return -1;
    return 0;
}

moex_model *moex_model_load(const char *path, moex_error *err) {
    moex_model *m = calloc(1, sizeof *m);
    if (!m) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    if (!(m->gguf = moex_gguf_open(path, err)) || moex_hparams_read(m->gguf, &m->hp, err)) goto fail;
    const moex_hparams *hp = &m->hp;
    /* Room for every norm vector in case all are stored as halves. */
    size_t cap = (size_t)hp->n_embd * (2 * (size_t)hp->n_layer + 1) + 2 * (size_t)hp->head_dim * hp->n_layer;
    binder b = {.g = m->gguf, .owned = malloc(cap * sizeof(float)), .owned_cap = cap, .err = err};
    m->owned_f32 = b.owned;
    if (!b.owned) {
        moex_fail(err, "out of memory");
        goto fail;
    }
    if (bind_model(&b, m)) goto fail;
    if (moex_gguf_find(m->gguf, "tokenizer.ggml.model")) {
        if (!(m->tok = moex_tokenizer_load(m->gguf, err))) goto fail;
        if (moex_tokenizer_n_vocab(m->tok) > hp->n_vocab) {
            moex_fail(err, "tokenizer has %d tokens but the model only %d", moex_tokenizer_n_vocab(m->tok), hp->n_vocab);
            goto fail;
        }
    }
    return m;
fail:
    moex_model_free(m);
    return NULL;
}

void moex_model_free(moex_model *m) {
    if (!m) return;
    if (m->layers)
        for (int il = 0; il < m->hp.n_layer; il++) free(m->layers[il].experts);
    free(m->layers);
    free(m->owned_f32);
    moex_tokenizer_free(m->tok);
    moex_gguf_close(m->gguf);
    free(m);
}

void moex_model_describe(const moex_model *m, char *buf, size_t cap) {
    const moex_hparams *hp = &m->hp;
    const moex_type_traits *et = moex_type_get(moex_hparams_is_moe(hp) ? m->layers[0].experts[0].down.type
                                                                       : m->layers[0].ffn_down.type);
    snprintf(buf, cap, "%s: %d layers, hidden %d, heads %d/%d x %d, vocab %d, %s%d experts (top %d, ff %d)%s, ffn %s, %.2f GB",
             hp->arch_name, hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_vocab,
             moex_hparams_is_moe(hp) ? "" : "dense, ", hp->n_expert, hp->n_expert_used, hp->n_ff_exp,
             m->output.data == m->tok_embd.data ? ", tied output" : "", et ? et->name : "?",
             (double)m->gguf->size / 1e9);
}

/* ---- reading the weights in ---- */

typedef struct page_in {
    size_t total, done, next_report, page;
    double t0;
    volatile uint8_t sink;
} page_in;

static void touch_matrix(page_in *p, const moex_matrix *w) {
    if (!w->data || w->rows <= 0) return;
    const size_t n = (size_t)w->rows * w->row_bytes;
    const uintptr_t start = (uintptr_t)w->data & ~(uintptr_t)(p->page - 1);
    madvise((void *)start, n + ((uintptr_t)w->data - start), MADV_WILLNEED);
    const uint8_t *b = w->data;
    uint8_t acc = 0;
    for (size_t off = 0; off < n; off += p->page) acc ^= b[off];
    acc ^= b[n - 1];
    p->sink ^= acc;
    p->done += n;
    if (p->done >= p->next_report) {
        moex_log(MOEX_LOG_INFO, "reading the weights: %.1f of %.1f GB (%.0f s)", (double)p->done / 1e9,
                 (double)p->total / 1e9, moex_time_s() - p->t0);
        p->next_report += p->total / 10;
    }
}

/* Calls f on every matrix of m (the experts' when experts). */
static void each_matrix(const moex_model *m, bool experts, void (*f)(page_in *, const moex_matrix *), page_in *p) {
    f(p, &m->tok_embd);
    if (m->output.data != m->tok_embd.data) f(p, &m->output);
    for (int l = 0; l < m->hp.n_layer; l++) {
        const moex_layer *L = &m->layers[l];
        const moex_matrix *own[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->ffn_gate, &L->ffn_up, &L->ffn_down, &L->router};
        for (size_t i = 0; i < sizeof own / sizeof *own; i++) f(p, own[i]);
        for (int e = 0; experts && L->experts && e < m->hp.n_expert; e++) {
            f(p, &L->experts[e].gate);
            f(p, &L->experts[e].up);
            f(p, &L->experts[e].down);
        }
    }
}

static void add_size(page_in *p, const moex_matrix *w) {
    if (w->data && w->rows > 0) p->total += (size_t)w->rows * w->row_bytes;
}

size_t moex_model_page_in(const moex_model *m, bool experts) {
    const long page = sysconf(_SC_PAGESIZE);
    page_in p = {.page = page > 0 ? (size_t)page : 4096, .t0 = moex_time_s()};
    each_matrix(m, experts, add_size, &p);
    p.next_report = p.total >= (1u << 30) ? p.total / 10 : SIZE_MAX; /* progress only where it takes a while */
    each_matrix(m, experts, touch_matrix, &p);
    return p.done;
}
