/* Generation: evaluate the prompt in batches, then sample and feed back one
 * token at a time until n_predict tokens or an end-of-generation token. */
#include <stdlib.h>

#include "engine/engine.h"

/* Logit rows kept at once when every position's logits are wanted. */
#define ALL_LOGITS_CHUNK 32

static int eval_prompt(const moex_model *m, const moex_engine *eng, const int32_t *prompt, int64_t n_prompt,
                       const moex_gen_params *gp, float *logits, const float **last, moex_error *err) {
    const int64_t vocab = m->hp.n_vocab;
    const bool all = gp->on_logits != NULL;
    int64_t chunk = eng->n_batch;
    if (all && chunk > ALL_LOGITS_CHUNK) chunk = ALL_LOGITS_CHUNK;
    for (int64_t pos = 0; pos < n_prompt; pos += chunk) {
        int64_t n = n_prompt - pos < chunk ? n_prompt - pos : chunk;
        if (eng->forward(eng->ctx, prompt + pos, n, pos, all, logits, err)) return -1;
        if (all && gp->on_logits(gp->cb_ctx, logits, n)) return moex_fail(err, "writing logits failed");
        *last = all ? logits + (n - 1) * vocab : logits;
    }
    return 0;
}

int moex_generate(const moex_model *m, const moex_engine *eng, moex_sampler *smp, const int32_t *prompt,
                  int64_t n_prompt, const moex_gen_params *gp, moex_gen_stats *stats, moex_error *err) {
    *stats = (moex_gen_stats){0};
    if (n_prompt <= 0) return moex_fail(err, "the prompt is empty: nothing to continue from");
    const int64_t need = n_prompt + (gp->n_predict > 0 ? gp->n_predict - 1 : 0);
    if (need > eng->n_ctx)
        return moex_fail(err, "prompt (%lld) + generated tokens need %lld positions, the context holds %lld (raise --ctx)",
                         (long long)n_prompt, (long long)need, (long long)eng->n_ctx);
    const int64_t rows = gp->on_logits ? ALL_LOGITS_CHUNK : 1;
    float *logits = malloc((size_t)rows * (size_t)m->hp.n_vocab * sizeof(float));
    if (!logits) return moex_fail(err, "out of memory for logits");
    int rc = -1;
    const float *last = logits;
    double t0 = moex_time_s();
    if (eval_prompt(m, eng, prompt, n_prompt, gp, logits, &last, err)) goto done;
    if (gp->spec && gp->spec->drafter && moex_drafter_prime(gp->spec->drafter, prompt, n_prompt, err)) goto done;
    stats->n_prompt = n_prompt;
    stats->prompt_s = moex_time_s() - t0;

    if (gp->spec && gp->spec->drafter && gp->n_predict > 0) {
        rc = moex_generate_speculative(m, eng, smp, prompt, n_prompt, last, gp, stats, err);
        goto done;
    }
    /* Greedy without a logits consumer: the engine's own argmax, the logits left where they are. */
    const bool on_device = eng->last_argmax && !gp->on_logits && moex_sampler_is_greedy(smp);
    t0 = moex_time_s();
    for (int64_t i = 0, pos = n_prompt; i < gp->n_predict; i++, pos++) {
        int32_t id = i > 0 && on_device ? eng->last_argmax(eng->ctx) : moex_sampler_sample(smp, last);
        if (id < 0 || id >= m->hp.n_vocab) {
            moex_fail(err, "the logits after position %lld have no finite maximum (a broken model?)", (long long)pos);
            goto done;
        }
        stats->n_generated++;
        if (gp->on_token && gp->on_token(gp->cb_ctx, id)) break;
        if (!gp->ignore_eos && m->tok && moex_tokenizer_is_eog(m->tok, id)) break;
        if (i + 1 == gp->n_predict) break; /* the last token needs no forward */
        if (eng->forward(eng->ctx, &id, 1, pos, gp->on_logits != NULL, on_device ? NULL : logits, err)) goto done;
        stats->n_decode_evals++;
        if (gp->on_logits && gp->on_logits(gp->cb_ctx, logits, 1)) {
            moex_fail(err, "writing logits failed");
            goto done;
        }
        last = logits;
    }
    stats->decode_s = moex_time_s() - t0;
    rc = 0;
done:
    free(logits);
    return rc;
}
