/* The distributed hub's Vulkan path in-process (engine/vk/forward_vk_dist.c): the
 * GPU runs attention, router and head, the experts go to an executor (here
 * the CPU's moex_local_executor) between layer segments.
 *
 * Checks, on a generated qwen3moe model with activation rounding on (as
 * test_vk_forward):
 *  1. a 20-token prompt (all logits) and 12 decode steps teacher-forced on
 *     the local GPU path's tokens: the distributed state (experts never
 *     uploaded) against moex_vk_forward with the experts on the GPU:
 *     relative logit error over all rows <= 1e-2 and top-1 >= 0.98, as
 *     test_vk_forward (the experts run in different kernels, GPU and CPU
 *     round differently: one flipped rounding moves a row to ~1e-2);
 *  2. greedy tokens of the distributed state = the CPU backend's for 12 steps
 *     (both executors round the expert boundary to f16, as the wire does);
 *  3. an executor that fails in layer 1 mid-token (prompt batch and decode):
 *     the forward returns its error, and the next forward at the same
 *     position gives the logits of an undisturbed run (<= 1e-6), and so does
 *     the step after it;
 *  4. moex_vk_state_set_executor on a full state switches to the executor and
 *     back; a state without experts refuses to go back; stats count layers.
 * usage: test_vk_dist MODEL.gguf */
#include "engine/vk/engine_vk.h"
#include "tests/vk/vk_test_util.h"

#define N_PROMPT 20
#define N_GEN 12

/* An executor that forwards to another and fails once, in layer fail_layer, when armed. */
typedef struct flaky {
    moex_expert_executor inner;
    int fail_layer;
    bool armed;
    int calls, failures;
} flaky;

static int flaky_run(void *ctx, const moex_moe_request *req, moex_error *err) {
    flaky *f = ctx;
    f->calls++;
    if (f->armed && req->layer == f->fail_layer) {
        f->armed = false;
        f->failures++;
        memset(req->out, 0xff, (size_t)req->n_tokens * 4);   /* half-written garbage, as a dying executor may leave */
        return moex_fail(err, "injected expert failure in layer %d", req->layer);
    }
    return f->inner.run(f->inner.ctx, req, err);
}

/* Worst per-row relative error and top-1 agreement of rows of a against b. */
static void compare(const float *a, const float *b, int64_t rows, int64_t V, double *worst, int *top1, int *n_rows) {
    for (int64_t r = 0; r < rows; r++) {
        if (getenv("MOEX_VK_VERBOSE")) printf("  row %d: rel err %.3g\n", *n_rows, rel_l2_f(a + r * V, b + r * V, V));
        const double e = rel_l2_f(a + r * V, b + r * V, V);
        *worst = e > *worst ? e : *worst;
        *top1 += argmax_of(a + r * V, V) == argmax_of(b + r * V, V);
        ++*n_rows;
    }
}

/* Prompt + teacher-forced decode on one engine state; logits into out (N_PROMPT + N_GEN rows). */
typedef int (*fwd_fn)(void *ctx, const moex_model *m, const int32_t *t, int64_t n, int64_t pos, bool all, float *lg);

static int vk_fwd(void *ctx, const moex_model *m, const int32_t *t, int64_t n, int64_t pos, bool all, float *lg) {
    return moex_vk_forward(m, ctx, t, n, pos, all, lg, &g_err);
}

static void run_sequence(fwd_fn f, void *ctx, const moex_model *m, const int32_t *prompt, const int32_t *forced,
                         float *out) {
    const int64_t V = m->hp.n_vocab;
    MUST(f(ctx, m, prompt, N_PROMPT, 0, true, out));
    for (int i = 0; i < N_GEN; i++) MUST(f(ctx, m, &forced[i], 1, N_PROMPT + i, false, out + (N_PROMPT + i) * V));
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_vk_dist MODEL.gguf\n");
        return 2;
    }
    if (!getenv("MOEX_TEST_SEED")) setenv("MOEX_TEST_SEED", "1", 1);   /* fixed prompt: see test_vk_forward */
    rng r = test_rng("test_vk_dist");
    moex_model *m = moex_model_load(argv[1], &g_err);
    if (!m) {
        fprintf(stderr, "FATAL: %s\n", g_err.msg);
        return 1;
    }
    const int64_t V = m->hp.n_vocab, n_ctx = 64, ROWS = N_PROMPT + N_GEN;
    moex_pool *pool = moex_pool_create(2);
    moex_local_executor *le_exact = moex_local_executor_create(m, pool, MOEX_WIRE_EXACT);
    moex_local_executor *le_f16 = moex_local_executor_create(m, pool, MOEX_WIRE_DEFAULT);
    flaky fl = {.inner = moex_local_executor_iface(le_exact), .fail_layer = 1};
    const moex_expert_executor flaky_exec = {.ctx = &fl, .run = flaky_run};
    moex_vk_options o = test_vk_options();
    o.round_activations = true;
    moex_vk_state *full = moex_vk_state_create(m, n_ctx, 32, &o, &g_err);
    if (!full) {
        printf("SKIP: %s\n", g_err.msg);
        return strstr(g_err.msg, "no device") || strstr(g_err.msg, "loader") ? 77 : 1;
    }
    moex_vk_state *dist = moex_vk_state_create_remote(m, n_ctx, 32, &o, flaky_exec, &g_err);
    MUST(!dist);
    moex_vk_dist_stats st;
    moex_vk_state_dist_stats(dist, &st, true);
    printf("device: %s\n", moex_vk_get_info(moex_vk_state_device(full))->name);

    int32_t prompt[N_PROMPT], forced[N_GEN];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)(rng_next(&r) % (uint64_t)V);
    float *ref = malloc((size_t)(ROWS * V) * 4), *got = malloc((size_t)(ROWS * V) * 4),
          *fence = malloc((size_t)(ROWS * V) * 4), *one = malloc((size_t)(N_PROMPT * V) * 4);

    /* 1. the local GPU path (experts on the GPU) picks the forced tokens; the distributed state follows them */
    MUST(moex_vk_forward(m, full, prompt, N_PROMPT, 0, true, ref, &g_err));
    for (int i = 0; i < N_GEN; i++) {
        forced[i] = moex_vk_last_argmax(full);
        MUST(moex_vk_forward(m, full, &forced[i], 1, N_PROMPT + i, false, ref + (N_PROMPT + i) * V, &g_err));
    }
    run_sequence(vk_fwd, dist, m, prompt, forced, got);
    double worst = 0;
    int top1 = 0, rows = 0;
    compare(got, ref, ROWS, V, &worst, &top1, &rows);
    const double all = rel_l2_f(got, ref, (size_t)(ROWS * V));
    printf("distributed vs local GPU: top-1 %d of %d, relative logit error %.3g (worst row %.3g)\n", top1, rows, all,
           worst);
    CHECK(all <= 1e-2, "distributed vs local GPU logits: relative error %.3g > 1e-2", all);
    CHECK(top1 >= 0.98 * rows, "distributed vs local GPU: top-1 %d of %d", top1, rows);
    moex_vk_state_dist_stats(dist, &st, false);
    CHECK(st.forwards == 1 + N_GEN && st.segments == (1 + N_GEN) * (int64_t)(m->hp.n_layer - 1),
          "stats: %lld forwards, %lld middle segments", (long long)st.forwards, (long long)st.segments);
    CHECK(fl.calls == (1 + N_GEN) * m->hp.n_layer, "executor called %d times, want one per MoE layer", fl.calls);

    /* 3. a failing executor: error out, then the same position again is undisturbed */
    {
        const char *name = "distributed";
        fl.armed = true;
        g_err.msg[0] = 0;
        CHECK(moex_vk_forward(m, dist, prompt, N_PROMPT, 0, true, one, &g_err) == -1 && strstr(g_err.msg, "injected"),
              "%s: a failing executor in the prompt must fail the forward (got '%s')", name, g_err.msg);
        MUST(moex_vk_forward(m, dist, prompt, N_PROMPT, 0, true, one, &g_err));
        worst = 0, top1 = 0, rows = 0;
        compare(one, got, N_PROMPT, V, &worst, &top1, &rows);
        CHECK(worst <= 1e-6, "%s: prompt retried after a failure: error %.3g", name, worst);
        for (int i = 0; i < 4; i++) {   /* the failure lands on step 2; steps 2 and 3 are checked */
            fl.armed = i == 2;
            const int rc = moex_vk_forward(m, dist, &forced[i], 1, N_PROMPT + i, false, one, &g_err);
            if (i == 2) {
                CHECK(rc == -1, "%s: a failing executor in decode must fail the forward", name);
                MUST(moex_vk_forward(m, dist, &forced[i], 1, N_PROMPT + i, false, one, &g_err));
            } else {
                MUST(rc);
            }
            const double e = rel_l2_f(one, got + (N_PROMPT + i) * V, V);
            CHECK(e <= 1e-6, "%s: decode step %d after a failure: error %.3g", name, i, e);
        }
    }
    CHECK(fl.failures == 2, "the executor failed %d times, want 2", fl.failures);

    /* 2. greedy tokens: distributed (f16 at the expert boundary) = the CPU backend (the same rounding) */
    moex_state *cs = moex_state_create(m, n_ctx, 32, pool, moex_local_executor_iface(le_f16), &g_err);
    MUST(!cs);
    MUST(moex_vk_state_set_executor(m, dist, moex_local_executor_iface(le_f16), &g_err));
    MUST(moex_forward(m, cs, prompt, N_PROMPT, 0, true, fence, &g_err));
    MUST(moex_vk_forward(m, dist, prompt, N_PROMPT, 0, false, NULL, &g_err));
    int32_t ct = argmax_of(fence + (N_PROMPT - 1) * V, V), gt = moex_vk_last_argmax(dist);
    int same = 0;
    for (int i = 0; i < N_GEN; i++) {
        same += ct == gt;
        MUST(moex_forward(m, cs, &ct, 1, N_PROMPT + i, false, fence, &g_err));
        MUST(moex_vk_forward(m, dist, &gt, 1, N_PROMPT + i, false, NULL, &g_err));
        ct = argmax_of(fence, V);
        gt = moex_vk_last_argmax(dist);
    }
    printf("greedy tokens, distributed vulkan vs cpu (f16 expert boundary): %d of %d identical\n", same, N_GEN);
    CHECK(same == N_GEN, "greedy tokens: %d of %d identical", same, N_GEN);

    /* 4. switching a full state to an executor and back */
    fl.calls = 0;
    MUST(moex_vk_state_set_executor(m, full, flaky_exec, &g_err));
    MUST(moex_vk_forward(m, full, prompt, N_PROMPT, 0, true, one, &g_err));
    worst = 0, top1 = 0, rows = 0;
    compare(one, got, N_PROMPT, V, &worst, &top1, &rows);
    CHECK(fl.calls == m->hp.n_layer && worst <= 1e-6, "full state with an executor: %d calls, error %.3g vs the "
          "distributed state", fl.calls, worst);
    MUST(moex_vk_state_set_executor(m, full, (moex_expert_executor){0}, &g_err));
    MUST(moex_vk_forward(m, full, prompt, N_PROMPT, 0, true, one, &g_err));
    worst = 0, top1 = 0, rows = 0;
    compare(one, ref, N_PROMPT, V, &worst, &top1, &rows);
    CHECK(fl.calls == m->hp.n_layer && worst <= 1e-6, "back on the GPU's experts: error %.3g", worst);
    CHECK(moex_vk_state_set_executor(m, dist, (moex_expert_executor){0}, &g_err) == -1,
          "a state without experts must refuse to run them itself");
    moex_vk_state_dist_stats(dist, &st, true);
    const double layers = (double)(st.segments + st.forwards);   /* each forward: n_layer - 1 middle segments + 1 */
    printf("stats: %lld forwards, %.1f us per middle segment, %.1f us in the executor per layer\n",
           (long long)st.forwards, 1e6 * st.gpu_s / (double)(st.segments ? st.segments : 1),
           1e6 * st.exec_s / (layers > 0 ? layers : 1));

    free(ref), free(got), free(fence), free(one);
    moex_state_free(cs);
    moex_vk_state_free(dist);
    moex_vk_state_free(full);
    moex_local_executor_free(le_exact);
    moex_local_executor_free(le_f16);
    moex_pool_destroy(pool);
    moex_model_free(m);
    return test_finish("test_vk_dist");
}
