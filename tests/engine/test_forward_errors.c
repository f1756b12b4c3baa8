/* The CPU forward pass says where a kernel failed and why: a tiny model built
 * in memory (llama shapes, f32 weights) gets one bad tensor at a time, and
 * moex_forward's error must read "<where>: <the kernel's cause>" (token
 * embedding, layer N attention, layer N feed-forward, layer N router, output
 * head; the executor's own message for the experts). After each refusal the
 * tensor is restored and the same forward must give the logits of a clean
 * run bit for bit: a failed call leaves the state usable. */
#include <string.h>

#include "engine/engine.h"

#include "tests/test_util.h"

enum { N_LAYER = 2, EMBD = 64, FF = 128, N_HEAD = 4, N_HEAD_KV = 2, HEAD_DIM = 16, VOCAB = 32, N_EXPERT = 4,
       N_CTX = 8 };

typedef struct tiny {
    moex_model m;
    moex_layer layers[N_LAYER];
    moex_expert_weights experts[N_LAYER][N_EXPERT];
    float *ones;
    float *blobs[64];
    int n_blobs;
} tiny;

static moex_matrix f32_matrix(tiny *t, rng *r, int64_t rows, int64_t cols) {
    float *w = malloc(sizeof(float) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++) w[i] = 0.2f * rng_gauss(r);
    t->blobs[t->n_blobs++] = w;
    return (moex_matrix){MOEX_TYPE_F32, rows, cols, moex_row_bytes(MOEX_TYPE_F32, cols), w};
}

static void tiny_init(tiny *t, rng *r, bool moe) {
    memset(t, 0, sizeof *t);
    t->ones = malloc(sizeof(float) * EMBD);
    for (int i = 0; i < EMBD; i++) t->ones[i] = 1.0f;
    moex_hparams *hp = &t->m.hp;
    *hp = (moex_hparams){.arch = MOEX_ARCH_LLAMA, .n_layer = N_LAYER, .n_embd = EMBD, .n_ff = moe ? 0 : FF,
                         .n_head = N_HEAD, .n_head_kv = N_HEAD_KV, .head_dim = HEAD_DIM, .n_vocab = VOCAB,
                         .n_ctx_train = N_CTX, .n_expert = moe ? N_EXPERT : 0, .n_expert_used = moe ? 2 : 0,
                         .n_ff_exp = moe ? FF : 0, .rope_dim = HEAD_DIM, .rope_freq_base = 10000.0f,
                         .rms_eps = 1e-5f, .norm_topk = true};
    strcpy(hp->arch_name, "llama");
    t->m.tok_embd = f32_matrix(t, r, VOCAB, EMBD);
    t->m.output = f32_matrix(t, r, VOCAB, EMBD);
    t->m.output_norm = t->ones;
    t->m.layers = t->layers;
    for (int il = 0; il < N_LAYER; il++) {
        moex_layer *L = &t->layers[il];
        L->attn_norm = L->ffn_norm = t->ones;
        L->wq = f32_matrix(t, r, N_HEAD * HEAD_DIM, EMBD);
        L->wk = f32_matrix(t, r, N_HEAD_KV * HEAD_DIM, EMBD);
        L->wv = f32_matrix(t, r, N_HEAD_KV * HEAD_DIM, EMBD);
        L->wo = f32_matrix(t, r, EMBD, N_HEAD * HEAD_DIM);
        if (!moe) {
            L->ffn_gate = f32_matrix(t, r, FF, EMBD);
            L->ffn_up = f32_matrix(t, r, FF, EMBD);
            L->ffn_down = f32_matrix(t, r, EMBD, FF);
            continue;
        }
        L->router = f32_matrix(t, r, N_EXPERT, EMBD);
        L->experts = t->experts[il];
        /* the experts share three matrices: the errors, not the values, are under test */
        const moex_matrix g = f32_matrix(t, r, FF, EMBD), u = f32_matrix(t, r, FF, EMBD), d = f32_matrix(t, r, EMBD, FF);
        for (int e = 0; e < N_EXPERT; e++) L->experts[e] = (moex_expert_weights){g, u, d};
    }
}

static void tiny_free(tiny *t) {
    for (int i = 0; i < t->n_blobs; i++) free(t->blobs[i]);
    free(t->ones);
}

static const int32_t k_tokens[3] = {3, 17, 29};

/* A forward of k_tokens at position 0 on a fresh state; 0 or -1 with err. */
static int run(const tiny *t, moex_state *s, float *logits, moex_error *err) {
    return moex_forward(&t->m, s, k_tokens, 3, 0, true, logits, err);
}

/* Breaks *slot (by swapping in `bad`), expects `want` as the whole message
 * prefix and `cause` inside it, restores it and checks the clean logits. */
static void expect(const tiny *t, moex_state *s, moex_matrix *slot, moex_matrix bad, const char *want,
                   const char *cause, const float *clean) {
    const moex_matrix good = *slot;
    float logits[3 * VOCAB];
    moex_error err = {{0}};
    *slot = bad;
    const int rc = run(t, s, logits, &err);
    *slot = good;
    CHECK(rc == -1, "%s: accepted", want);
    CHECK(!strncmp(err.msg, want, strlen(want)) && strstr(err.msg, cause), "error '%s' (want '%s...%s')", err.msg,
          want, cause);
    printf("  %s\n", err.msg);
    CHECK(run(t, s, logits, &err) == 0, "%s: the state is not usable after the refusal: %s", want, err.msg);
    CHECK(!memcmp(logits, clean, sizeof logits), "%s: logits after the refusal differ from a clean run", want);
}

static moex_matrix retyped(moex_matrix m, moex_type type) {
    m.type = type;
    return m;
}

static void test_dense(rng *r) {
    tiny t;
    tiny_init(&t, r, false);
    moex_error err = {{0}};
    moex_state *s = moex_state_create(&t.m, N_CTX, 4, NULL, (moex_expert_executor){0}, &err);
    CHECK(s != NULL, "state: %s", err.msg);
    if (!s) return;
    float clean[3 * VOCAB];
    CHECK(run(&t, s, clean, &err) == 0, "clean forward: %s", err.msg);
    const char *not_multiplied = "has type q8_K, which the CPU kernels do not multiply";
    expect(&t, s, &t.m.tok_embd, retyped(t.m.tok_embd, (moex_type)4), "token embedding: ", "the unknown type 4",
           clean);
    expect(&t, s, &t.layers[1].wk, retyped(t.layers[1].wk, MOEX_TYPE_Q8_K), "layer 1 attention: q/k/v: matrix 1 ",
           not_multiplied, clean);
    moex_matrix short_rows = t.layers[0].wo;
    short_rows.row_bytes -= 4;
    expect(&t, s, &t.layers[0].wo, short_rows, "layer 0 attention: output projection: the matrix ",
           "rows of 252 bytes where 64 f32 columns take 256", clean);
    expect(&t, s, &t.layers[1].ffn_down, retyped(t.layers[1].ffn_down, MOEX_TYPE_Q8_K),
           "layer 1 feed-forward: down: ", not_multiplied, clean);
    moex_matrix no_data = t.layers[0].ffn_up;
    no_data.data = NULL;
    expect(&t, s, &t.layers[0].ffn_up, no_data, "layer 0 feed-forward: gate/up: matrix 1 ", "has no data", clean);
    expect(&t, s, &t.m.output, retyped(t.m.output, MOEX_TYPE_Q8_K), "output head: the matrix ", not_multiplied, clean);
    moex_state_free(s);
    tiny_free(&t);
}

static int failing_run(void *ctx, const moex_moe_request *req, moex_error *err) {
    return moex_fail(err, "stub executor: layer %d refused", req->layer);
}

static void test_moe(rng *r) {
    tiny t;
    tiny_init(&t, r, true);
    moex_error err = {{0}};
    moex_local_executor *le = moex_local_executor_create(&t.m, NULL, MOEX_WIRE_EXACT);
    moex_state *s = le ? moex_state_create(&t.m, N_CTX, 4, NULL, moex_local_executor_iface(le), &err) : NULL;
    CHECK(s != NULL, "MoE state: %s", le ? err.msg : "no executor");
    if (!s) return;
    float clean[3 * VOCAB];
    CHECK(run(&t, s, clean, &err) == 0, "clean MoE forward: %s", err.msg);
    expect(&t, s, &t.layers[1].router, retyped(t.layers[1].router, MOEX_TYPE_Q8_K), "layer 1 router: the matrix ",
           "has type q8_K", clean);
    /* the local executor's experts: every expert of layer 0 shares one up matrix */
    moex_expert_weights saved = t.layers[0].experts[0];
    for (int e = 0; e < N_EXPERT; e++) t.layers[0].experts[e].up.type = MOEX_TYPE_Q8_K;
    float logits[3 * VOCAB];
    CHECK(run(&t, s, logits, &err) == -1 && !strncmp(err.msg, "layer 0 experts: expert job ", 28) &&
              strstr(err.msg, "'s up has type q8_K"),
          "bad expert weights: '%s'", err.msg);
    printf("  %s\n", err.msg);
    for (int e = 0; e < N_EXPERT; e++) t.layers[0].experts[e] = saved;
    moex_state_free(s);

    /* an executor's own error comes through as it wrote it */
    s = moex_state_create(&t.m, N_CTX, 4, NULL, (moex_expert_executor){.run = failing_run}, &err);
    CHECK(s && run(&t, s, logits, &err) == -1 && !strcmp(err.msg, "stub executor: layer 0 refused"),
          "executor error: '%s'", err.msg);
    moex_state_free(s);
    moex_local_executor_free(le);
    tiny_free(&t);
}

int main(void) {
    rng r = test_rng("test_forward_errors");
    test_dense(&r);
    test_moe(&r);
    if (g_failures) fprintf(stderr, "%d failure(s)\n", g_failures);
    return g_failures ? 1 : 0;
}
