/* Perplexity as llama.cpp's tools/perplexity defines it (its default mode):
 * the text's tokens (BOS first when the vocabulary adds one) are cut into
 * consecutive windows of n_ctx tokens; each window is evaluated from position
 * 0 with its first token replaced by BOS, and only the second half is scored:
 * the logits at positions n_ctx/2 .. n_ctx-2 predict the tokens after them.
 * PPL = exp(mean NLL) over every scored token, with llama.cpp's +/- (the
 * standard error of the NLL, times PPL). Runs on any moex_engine, so --local,
 * Vulkan and hub + workers score through the same code. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

/* Logit rows per forward call: enough for efficient products, bounded memory. */
#define PPL_MAX_BATCH 128

/* log p(tok) from one row of logits, as llama.cpp's log_softmax computes it
 * (float max and differences, the sum of exps in double). */
static double log_prob(const float *logits, int64_t n_vocab, int32_t tok) {
    float max = logits[0];
    for (int64_t i = 1; i < n_vocab; i++) max = logits[i] > max ? logits[i] : max;
    double sum = 0.0;
    for (int64_t i = 0; i < n_vocab; i++) sum += expf(logits[i] - max);
    return (double)(logits[tok] - max) - log(sum);
}

static int32_t argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

typedef struct ppl_acc {
    double nll, nll2;
    int64_t count;
} ppl_acc;

/* Evaluates one window and adds its scored positions to acc. */
static int score_window(const moex_engine *eng, int64_t n_vocab, const int32_t *win, int64_t n_ctx, int32_t bos,
                        int64_t batch, float *logits, int32_t *window_ids, ppl_acc *acc, int32_t *top1,
                        moex_error *err) {
    const int64_t first = n_ctx / 2;
    memcpy(window_ids, win, (size_t)n_ctx * sizeof *window_ids);
    if (bos >= 0) window_ids[0] = bos;
    for (int64_t pos = 0; pos < n_ctx; pos += batch) {
        const int64_t n = n_ctx - pos < batch ? n_ctx - pos : batch;
        if (eng->forward(eng->ctx, window_ids + pos, n, pos, true, logits, err)) return -1;
        for (int64_t t = 0; t < n; t++) {
            const int64_t i = pos + t;   /* position in the window; it predicts win[i + 1] */
            if (i < first || i >= n_ctx - 1) continue;
            const float *row = logits + t * n_vocab;
            const double v = -log_prob(row, n_vocab, win[i + 1]);
            if (!isfinite(v)) return moex_fail(err, "non-finite log-probability at window position %lld", (long long)i);
            acc->nll += v;
            acc->nll2 += v * v;
            acc->count++;
            if (top1) top1[i - first] = argmax(row, n_vocab);
        }
    }
    return 0;
}

int moex_perplexity(const moex_engine *eng, int64_t n_vocab, const int32_t *tokens, int64_t n_tokens,
                    const moex_ppl_params *p, moex_ppl_result *r, moex_error *err) {
    *r = (moex_ppl_result){0};
    const int64_t n_ctx = p->n_ctx;
    if (n_ctx < 4) return moex_fail(err, "a perplexity window needs at least 4 tokens (got --ctx %lld)", (long long)n_ctx);
    if (n_ctx > eng->n_ctx)
        return moex_fail(err, "windows of %lld tokens exceed the engine's context of %lld", (long long)n_ctx,
                         (long long)eng->n_ctx);
    if (n_tokens < 2 * n_ctx)
        return moex_fail(err, "the text has %lld tokens; a context of %lld needs at least %lld (use a smaller --ctx "
                              "or a longer text)", (long long)n_tokens, (long long)n_ctx, (long long)(2 * n_ctx));
    int64_t n_chunks = n_tokens / n_ctx;
    if (p->n_chunks > 0 && p->n_chunks < n_chunks) n_chunks = p->n_chunks;
    int64_t batch = eng->n_batch < PPL_MAX_BATCH ? eng->n_batch : PPL_MAX_BATCH;
    if (batch > n_ctx) batch = n_ctx;
    float *logits = malloc((size_t)batch * (size_t)n_vocab * sizeof *logits);
    int32_t *window_ids = malloc((size_t)n_ctx * sizeof *window_ids);
    int rc = 0;
    if (!logits || !window_ids) rc = moex_fail(err, "out of memory for %lld rows of logits", (long long)batch);
    ppl_acc acc = {0};
    const int64_t scored_per_chunk = n_ctx - n_ctx / 2 - 1;
    for (int64_t c = 0; !rc && c < n_chunks; c++) {
        int32_t *top1 = p->top1 ? p->top1 + c * scored_per_chunk : NULL;
        if (score_window(eng, n_vocab, tokens + c * n_ctx, n_ctx, p->bos, batch, logits, window_ids, &acc, top1, err))
            rc = -1;
        else if (p->on_chunk && p->on_chunk(p->cb_ctx, c, exp(acc.nll / (double)acc.count)))
            rc = moex_fail(err, "stopped after window %lld", (long long)c + 1);
    }
    free(logits);
    free(window_ids);
    if (rc) return -1;
    const double mean = acc.nll / (double)acc.count, var = acc.nll2 / (double)acc.count - mean * mean;
    r->n_chunks = n_chunks;
    r->n_scored = acc.count;
    r->nll = mean;
    r->ppl = exp(mean);
    r->ppl_err = var > 0 && acc.count > 1 ? sqrt(var / (double)(acc.count - 1)) * r->ppl : 0.0;
    return 0;
}

int64_t moex_perplexity_scored_per_chunk(int64_t n_ctx) { return n_ctx - n_ctx / 2 - 1; }

/* ---- moex-hub --perplexity FILE ---- */

static char *read_file(const char *path, size_t *len, moex_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        moex_fail(err, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *grown = realloc(buf, cap *= 2);
        if (!grown) {
            free(buf);
            buf = NULL;
        } else {
            buf = grown;
        }
    }
    bool failed = ferror(f);
    fclose(f);
    if (!buf || failed) {
        free(buf);
        moex_fail(err, failed ? "reading %s failed" : "out of memory reading %s", path);
        return NULL;
    }
    *len = n;
    return buf;
}

/* The text's tokens as llama.cpp's perplexity takes them: BOS first when the
 * vocabulary adds one, special tokens spelled out. */
static int64_t tokenize_text(const moex_tokenizer *tok, const char *text, size_t len, int32_t **out, moex_error *err) {
    int64_t cap = (int64_t)len + 8;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) return moex_fail(err, "out of memory for %lld tokens", (long long)cap);
    int64_t n = moex_tokenize(tok, text, len, true, false, ids, cap, err);
    if (n < 0 || n > cap) {
        free(ids);
        return n < 0 ? -1 : moex_fail(err, "the tokenizer produced more tokens than bytes");
    }
    *out = ids;
    return n;
}

/* BOS when the vocabulary adds it (llama.cpp puts it at the start of every window), else -1. */
static int32_t window_bos(const moex_tokenizer *tok) {
    int32_t ids[4];
    moex_error ignored;
    int64_t n = moex_tokenize(tok, "", 0, true, false, ids, 4, &ignored);
    return n == 1 && ids[0] == moex_tokenizer_bos(tok) ? ids[0] : -1;
}

typedef struct ppl_printer {
    FILE *out;
} ppl_printer;

static int print_running(void *ctx, int64_t chunk, double ppl) {
    ppl_printer *pp = ctx;
    fprintf(pp->out, "[%lld]%.4f,", (long long)chunk + 1, ppl);
    fflush(pp->out);
    return 0;
}

static int write_top1(const char *path, const int32_t *top1, int64_t n_chunks, int64_t per_chunk, moex_error *err) {
    FILE *f = fopen(path, "w");
    if (!f) return moex_fail(err, "cannot write %s: %s", path, strerror(errno));
    for (int64_t c = 0; c < n_chunks; c++)
        for (int64_t i = 0; i < per_chunk; i++)
            fprintf(f, i + 1 < per_chunk ? "%d " : "%d\n", top1[c * per_chunk + i]);
    return fclose(f) ? moex_fail(err, "writing %s failed", path) : 0;
}

int moex_perplexity_file(const moex_model *m, const moex_engine *eng, const moex_ppl_file_params *fp, FILE *out,
                         moex_error *err) {
    if (!m->tok) return moex_fail(err, "this model has no tokenizer: perplexity needs one to read text");
    size_t len;
    char *text = read_file(fp->path, &len, err);
    if (!text) return -1;
    int32_t *tokens = NULL, *top1 = NULL;
    int64_t n = tokenize_text(m->tok, text, len, &tokens, err);
    free(text);
    if (n < 0) return -1;
    moex_ppl_params p = {.n_ctx = fp->n_ctx, .n_chunks = fp->n_chunks, .bos = window_bos(m->tok),
                         .on_chunk = print_running};
    ppl_printer pp = {out};
    p.cb_ctx = &pp;
    const int64_t per_chunk = moex_perplexity_scored_per_chunk(fp->n_ctx);
    int64_t max_chunks = fp->n_ctx > 0 ? n / fp->n_ctx : 0;
    if (fp->top1_path && max_chunks > 0 && !(top1 = p.top1 = malloc((size_t)(max_chunks * per_chunk) * sizeof *top1))) {
        free(tokens);
        return moex_fail(err, "out of memory for the top-1 ids");
    }
    fprintf(out, "perplexity: %lld tokens, windows of %lld, scoring the second half of each\n", (long long)n,
            (long long)fp->n_ctx);
    moex_ppl_result r;
    double t0 = moex_time_s();
    int rc = moex_perplexity(eng, m->hp.n_vocab, tokens, n, &p, &r, err);
    if (!rc) {
        fprintf(out, "\nFinal estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_err);
        fprintf(out, "perplexity: %lld windows, %lld scored tokens, %.2f s\n", (long long)r.n_chunks,
                (long long)r.n_scored, moex_time_s() - t0);
        if (fp->top1_path) rc = write_top1(fp->top1_path, top1, r.n_chunks, per_chunk, err);
    }
    free(top1);
    free(tokens);
    return rc;
}
