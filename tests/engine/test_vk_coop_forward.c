/* The whole model with its prompt batch on the cooperative-matrix products
 * (f16 inputs) against the same GPU backend on the f32 tiles (MOEX_VK_COOP_OFF),
 * both with f32 activations (with activation rounding on the coop kernels are
 * not used; the int8 decode activations of vk_idot are switched off here).
 * The CPU backend is no reference here: it
 * rounds activations to 8 bits, which alone puts the logits ~5e-2 apart on a
 * random-weight model. Thresholds as test_vk_forward's: top-1 >= 0.98 over the
 * prompt rows, relative logit error <= 1e-2, 12 greedy tokens identical.
 * Exit 77 without a Vulkan device or cooperative matrices (emulated ones count:
 * moex_vk_options.coop = MOEX_VK_COOP_EMULATE). usage: test_vk_coop_forward MODEL.gguf */
#include "engine/vk/engine_vk.h"
#include "tests/vk/vk_test_util.h"

enum { N_PROMPT = 40, N_GEN = 12 };

static moex_vk_state *make_state(const moex_model *m, bool coop) {
    moex_vk_options o = test_vk_options();
    o.coop = coop ? MOEX_VK_COOP_EMULATE : MOEX_VK_COOP_OFF;
    o.tune.idot = 2;   /* f32 decode activations: see main */
    moex_vk_state *s = moex_vk_state_create(m, 64, N_PROMPT, &o, &g_err);
    if (!s) {
        printf("SKIP: %s\n", g_err.msg);
        exit(strstr(g_err.msg, "no device") || strstr(g_err.msg, "loader") ? 77 : 1);
    }
    return s;
}

/* Prompt logits (all rows), then N_GEN greedy tokens. */
static void run(const moex_model *m, moex_vk_state *s, const int32_t *prompt, float *logits, int32_t *gen) {
    MUST(moex_vk_forward(m, s, prompt, N_PROMPT, 0, true, logits, &g_err));
    int32_t t = moex_vk_last_argmax(s);
    for (int i = 0; i < N_GEN; i++) {
        gen[i] = t;
        MUST(moex_vk_forward(m, s, &t, 1, N_PROMPT + i, false, NULL, &g_err));
        t = moex_vk_last_argmax(s);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_vk_coop_forward MODEL.gguf\n");
        return 2;
    }
    if (!getenv("MOEX_TEST_SEED")) setenv("MOEX_TEST_SEED", "1", 1);   /* a fixed prompt: see test_vk_forward */
    /* Both runs decode on the same kernels from caches the prompt paths left a
     * little apart; int8 activations (vk_idot, a GPU with integer dot products)
     * would turn that into rounding flips that decide this random model's
     * near-tied greedy tokens. The comparison is of the prompt paths: f32 decode
     * (make_state: idot=0). */
    rng r = test_rng("test_vk_coop_forward");
    moex_model *m = moex_model_load(argv[1], &g_err);
    MUST(!m);
    moex_vk_state *sc = make_state(m, true);
    const moex_vk_info *in = moex_vk_get_info(moex_vk_state_device(sc));
    if (!in->coop) {
        printf("SKIP: no cooperative matrices\n");
        moex_vk_state_free(sc);
        moex_model_free(m);
        return 77;
    }
    printf("device: %s, cooperative matrices %s\n", in->name, in->coop == 1 ? "VK_NV_cooperative_matrix" : "emulated");
    const int64_t V = m->hp.n_vocab;
    int32_t prompt[N_PROMPT], gc[N_GEN], gf[N_GEN];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)(rng_next(&r) % (uint64_t)V);
    float *lc = malloc((size_t)(N_PROMPT * V) * 4), *lf = malloc((size_t)(N_PROMPT * V) * 4);
    run(m, sc, prompt, lc, gc);
    moex_vk_state_free(sc);
    moex_vk_state *sf = make_state(m, false);
    run(m, sf, prompt, lf, gf);
    moex_vk_state_free(sf);
    int top1 = 0, same = 0;
    double worst = 0;
    for (int i = 0; i < N_PROMPT; i++) {
        top1 += argmax_of(lc + i * V, V) == argmax_of(lf + i * V, V);
        const double e = rel_l2_f(lc + i * V, lf + i * V, (size_t)V);
        worst = e > worst ? e : worst;
    }
    for (int i = 0; i < N_GEN; i++) same += gc[i] == gf[i];
    const double err = rel_l2_f(lc, lf, (size_t)(N_PROMPT * V));
    printf("prompt of %d on coop vs f32 tiles: top-1 %.3f, relative logit error %.3g (worst row %.3g); greedy %d of %d\n",
           N_PROMPT, (double)top1 / N_PROMPT, err, worst, same, N_GEN);
    CHECK(top1 >= 0.98 * N_PROMPT, "top-1 agreement %d of %d", top1, N_PROMPT);
    CHECK(err <= 1e-2, "relative logit error %.3g > 1e-2", err);
    CHECK(same == N_GEN, "greedy tokens: %d of %d identical", same, N_GEN);
    free(lc), free(lf);
    moex_model_free(m);
    return test_finish("test_vk_coop_forward");
}
