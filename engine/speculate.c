/* Speculative decoding: a drafter proposes the tokens that may come next, one
 * forward of the engine computes the logits after each of them, and the
 * prefix the engine's own sampling agrees with is kept. A distributed token
 * costs a round trip per MoE layer whatever its batch holds, so every drafted
 * token that is accepted saves a whole token's round trips.
 *
 * Exact: a verify forward is one batch of one KV slot whose rows are all
 * wanted, and each wanted row runs on the one-token kernels (engine.h,
 * moex_batch), so its logits are the bits a one-token step would compute.
 * Greedy keeps the drafts that equal each row's argmax; with temperature, the
 * rule of Leviathan et al. / Chen et al. (accept x with probability
 * min(1, p(x) / q(x)), else draw from max(p - q, 0)) leaves the output's
 * distribution that of the sampler alone. A rejected row's KV entries stay
 * behind the sequence's end and the next forward writes over them.
 *
 * Drafters (struct moex_drafter): prompt lookup (the tokens that followed the
 * latest earlier occurrence of the sequence's last n-gram: no model, strong
 * where the output repeats its input) and a draft model on its own engine. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

struct moex_drafter {
    /* Up to max tokens that may follow seq[0..n) into out; returns their
     * count (0: nothing to propose) or -1 (err). When the drafts are drawn
     * from a distribution (a sampling draft model), q gets it, n_vocab floats
     * a draft, and *sampled is set. */
    int (*draft)(moex_drafter *d, const int32_t *seq, int64_t n, int max, int32_t *out, float *q, bool *sampled,
                 moex_error *err);
    void (*free)(moex_drafter *d);
};

void moex_drafter_free(moex_drafter *d) {
    if (d) d->free(d);
}

int moex_drafter_propose(moex_drafter *d, const int32_t *seq, int64_t n, int max, int32_t *out, float *q,
                         bool *sampled, moex_error *err) {
    *sampled = false;
    return max > 0 && n > 0 ? d->draft(d, seq, n, max, out, q, sampled, err) : 0;
}

/* ---- prompt lookup ---- */

typedef struct lookup_drafter {
    moex_drafter base;
    int ngram_min, ngram_max;
} lookup_drafter;

/* The latest j < n - g with seq[j .. j+g) == seq[n-g .. n), or -1. */
static int64_t latest_match(const int32_t *seq, int64_t n, int g) {
    const int32_t *suffix = seq + n - g;
    for (int64_t j = n - g - 1; j >= 0; j--)
        if (seq[j] == suffix[0] && memcmp(seq + j, suffix, (size_t)g * sizeof *seq) == 0) return j;
    return -1;
}

static int lookup_draft(moex_drafter *d, const int32_t *seq, int64_t n, int max, int32_t *out, float *q,
                        bool *sampled, moex_error *err) {
    (void)q, (void)err;
    const lookup_drafter *ld = (const lookup_drafter *)d;
    *sampled = false;
    for (int g = ld->ngram_max; g >= ld->ngram_min; g--) {
        if (g >= n) continue;
        const int64_t j = latest_match(seq, n, g);
        if (j < 0) continue;
        /* past the sequence's end the continuation reads its own drafts, so a
         * loop of period p (j = n - g - p) drafts max tokens, not p */
        for (int k = 0; k < max; k++) {
            const int64_t i = j + g + k;
            out[k] = i < n ? seq[i] : out[i - n];
        }
        return max;
    }
    return 0;
}

static void lookup_free(moex_drafter *d) { free(d); }

moex_drafter *moex_drafter_lookup(int ngram_min, int ngram_max) {
    if (ngram_min < 1 || ngram_max < ngram_min) return NULL;
    lookup_drafter *ld = calloc(1, sizeof *ld);
    if (!ld) return NULL;
    *ld = (lookup_drafter){{lookup_draft, lookup_free}, ngram_min, ngram_max};
    return &ld->base;
}

/* ---- a draft model ---- */

typedef struct model_drafter {
    moex_drafter base;
    const moex_model *m;
    const moex_engine *eng;
    int slot;
    moex_sampler *smp;       /* its own generator: the main sampler's draws stay the main sampler's */
    int32_t *kv_tok;         /* the tokens whose KV entries the draft engine holds, in position order */
    int64_t kv_n;
    float *logits;           /* n_vocab: the last row */
} model_drafter;

/* n tokens at pos.. of the drafter's slot; logits of the last. */
static int draft_forward(model_drafter *md, const int32_t *tokens, int64_t n, int64_t pos, moex_error *err) {
    if (!md->eng->forward_batch || md->eng->n_seq <= 1)
        return md->eng->forward(md->eng->ctx, tokens, n, pos, false, md->logits, err);
    int32_t seq[64], p[64];
    bool want[64];
    for (int64_t done = 0; done < n; done += 64) {
        const int64_t c = n - done < 64 ? n - done : 64;
        for (int64_t i = 0; i < c; i++) seq[i] = md->slot, p[i] = (int32_t)(pos + done + i), want[i] = done + i == n - 1;
        moex_batch b = {.n = c, .tokens = tokens + done, .seq = seq, .pos = p, .want_logits = want};
        if (md->eng->forward_batch(md->eng->ctx, &b, md->logits, err)) return -1;
    }
    return 0;
}

/* Brings the draft engine's KV to seq[0..n) (re-using the common prefix) and
 * leaves the logits after seq[n-1]. */
static int draft_catch_up(model_drafter *md, const int32_t *seq, int64_t n, moex_error *err) {
    int64_t from = 0;
    while (from < md->kv_n && from < n && md->kv_tok[from] == seq[from]) from++;
    if (from == n) from = n - 1;   /* its logits are wanted again */
    for (int64_t pos = from; pos < n; pos += md->eng->n_batch) {
        const int64_t c = n - pos < md->eng->n_batch ? n - pos : md->eng->n_batch;
        if (draft_forward(md, seq + pos, c, pos, err)) return moex_error_prefix(err, "draft model");
    }
    memcpy(md->kv_tok + from, seq + from, (size_t)(n - from) * sizeof *seq);
    md->kv_n = n;
    return 0;
}

static int model_draft(moex_drafter *d, const int32_t *seq, int64_t n, int max, int32_t *out, float *q,
                       bool *sampled, moex_error *err) {
    model_drafter *md = (model_drafter *)d;
    const int32_t V = md->m->hp.n_vocab;
    *sampled = !moex_sampler_is_greedy(md->smp);
    if (n + max > md->eng->n_ctx) max = (int)(md->eng->n_ctx - n);
    if (max <= 0) return 0;
    if (draft_catch_up(md, seq, n, err)) return -1;
    for (int j = 0; j < max; j++) {
        if (*sampled) {
            moex_sampler_dist(md->smp, md->logits, q + (size_t)j * (size_t)V);
            out[j] = moex_sampler_draw(md->smp, q + (size_t)j * (size_t)V);
        } else {
            out[j] = moex_sampler_sample(md->smp, md->logits);
        }
        if (out[j] < 0) return j;   /* no finite logit: propose what there is */
        if (j + 1 == max) break;    /* the last draft needs no forward */
        if (draft_forward(md, &out[j], 1, n + j, err)) return moex_error_prefix(err, "draft model");
        md->kv_tok[n + j] = out[j];
        md->kv_n = n + j + 1;
    }
    return max;
}

static void model_free(moex_drafter *d) {
    model_drafter *md = (model_drafter *)d;
    moex_sampler_free(md->smp);
    free(md->kv_tok);
    free(md->logits);
    free(md);
}

moex_drafter *moex_drafter_model(const moex_model *dm, const moex_engine *deng, int slot,
                                 const moex_sampler_params *sp) {
    if (slot < 0 || slot >= (deng->n_seq > 0 ? deng->n_seq : 1) || (slot > 0 && !deng->forward_batch)) return NULL;
    model_drafter *md = calloc(1, sizeof *md);
    if (!md) return NULL;
    md->base = (moex_drafter){model_draft, model_free};
    md->m = dm;
    md->eng = deng;
    md->slot = slot;
    moex_sampler_params p = *sp;
    p.seed = sp->seed ^ 0x9e3779b97f4a7c15ull;   /* a stream apart from the main sampler's */
    md->smp = moex_sampler_create(&p, dm->hp.n_vocab);
    md->kv_tok = malloc((size_t)deng->n_ctx * sizeof *md->kv_tok);
    md->logits = malloc((size_t)dm->hp.n_vocab * sizeof *md->logits);
    if (!md->smp || !md->kv_tok || !md->logits) {
        model_free(&md->base);
        return NULL;
    }
    return &md->base;
}

/* ---- lookup first, the draft model where the lookup finds nothing ---- */

typedef struct chain_drafter {
    moex_drafter base;
    moex_drafter *first, *second;
} chain_drafter;

static int chain_draft(moex_drafter *d, const int32_t *seq, int64_t n, int max, int32_t *out, float *q, bool *sampled,
                       moex_error *err) {
    chain_drafter *cd = (chain_drafter *)d;
    const int k = cd->first->draft(cd->first, seq, n, max, out, q, sampled, err);
    return k != 0 ? k : cd->second->draft(cd->second, seq, n, max, out, q, sampled, err);
}

static void chain_free(moex_drafter *d) {
    chain_drafter *cd = (chain_drafter *)d;
    moex_drafter_free(cd->first);
    moex_drafter_free(cd->second);
    free(cd);
}

moex_drafter *moex_drafter_chain(moex_drafter *first, moex_drafter *second) {
    chain_drafter *cd = first && second ? calloc(1, sizeof *cd) : NULL;
    if (!cd) {
        moex_drafter_free(first);
        moex_drafter_free(second);
        return NULL;
    }
    *cd = (chain_drafter){{chain_draft, chain_free}, first, second};
    return &cd->base;
}

/* ---- the acceptance rule ---- */

int moex_spec_accept(moex_sampler *smp, int32_t n_vocab, const float *logits, const int32_t *argmax,
                     const int32_t *draft, int n_draft, const float *q, float *scratch, int32_t *next) {
    if (!logits) {   /* greedy on the engine's argmax */
        int a = 0;
        while (a < n_draft && argmax[a] == draft[a]) a++;
        *next = argmax[a];
        return a;
    }
    const size_t V = (size_t)n_vocab;
    for (int a = 0; a < n_draft; a++) {
        float *p = scratch;
        moex_sampler_dist(smp, logits + (size_t)a * V, p);
        const int32_t x = draft[a];
        const float qx = q ? q[(size_t)a * V + (size_t)x] : 1.0f;
        if (qx > 0.0f && moex_sampler_uniform(smp) * qx < p[x]) continue;
        /* rejected: the residual max(p - q, 0), q a point mass at x when the drafter is deterministic */
        for (size_t i = 0; i < V; i++) {
            const float qi = q ? q[(size_t)a * V + i] : (int32_t)i == x ? 1.0f : 0.0f;
            p[i] = p[i] > qi ? p[i] - qi : 0.0f;
        }
        *next = moex_sampler_draw(smp, p);
        /* p <= q everywhere only when p == q up to rounding: then x was due; draw from p itself */
        if (*next < 0) *next = moex_sampler_sample(smp, logits + (size_t)a * V);
        return a;
    }
    *next = moex_sampler_sample(smp, logits + (size_t)n_draft * V);
    return n_draft;
}

/* ---- the decode loop ---- */

#define PLAIN_KEPT 4

typedef struct spec_run {
    const moex_model *m;
    const moex_engine *eng;
    moex_sampler *smp;
    const moex_gen_params *gp;
    const moex_spec_params *sp;
    moex_gen_stats *stats;
    bool greedy_on_device;      /* argmax per row where the logits are, nothing read back */
    int32_t *seq;               /* prompt + generated, n_prompt + n_predict */
    int64_t n;                  /* tokens in seq */
    float *logits, *q, *p;      /* (K+1) x V, K x V, V */
    int32_t *rows, *argmax, *pos, *slot;
    bool *want, *only;
    int k_cur;                  /* the adaptive draft length */
    /* auto-off: the last one-token steps' seconds; a speculated token's
     * seconds (drafting + verifying) as a moving average; steps left while
     * paused; spec steps since the last one-token step */
    double plain_s[PLAIN_KEPT], spec_s, spec_tokens;
    int n_plain, pause, pause_len, since_plain;
} spec_run;

/* One forward of rows[0..m) at positions n-1 .. n-1+m-1 of slot 0, every row wanted. */
static int verify_forward(spec_run *r, int m, moex_error *err) {
    for (int i = 0; i < m; i++) {
        r->pos[i] = (int32_t)(r->n - 1 + i);
        r->slot[i] = 0;
        r->want[i] = true;
        r->only[i] = r->greedy_on_device;
    }
    moex_batch b = {.n = m, .tokens = r->rows, .seq = r->slot, .pos = r->pos, .want_logits = r->want,
                    .argmax = r->greedy_on_device ? r->argmax : NULL, .argmax_only = r->greedy_on_device ? r->only : NULL};
    return r->eng->forward_batch(r->eng->ctx, &b, r->greedy_on_device ? NULL : r->logits, err);
}

/* Hands one generated token on; 1 when generation ends with it. */
static int emit(spec_run *r, int32_t id, moex_error *err) {
    if (id < 0 || id >= r->m->hp.n_vocab)
        return moex_fail(err, "the logits at position %lld have no finite maximum (a broken model?)", (long long)r->n);
    r->seq[r->n++] = id;
    r->stats->n_generated++;
    if (r->gp->on_token && r->gp->on_token(r->gp->cb_ctx, id)) return 1;
    if (!r->gp->ignore_eos && r->m->tok && moex_tokenizer_is_eog(r->m->tok, id)) return 1;
    return r->stats->n_generated == r->gp->n_predict;
}

/* Auto-off. Speculation pays when a token costs less than a one-token step
 * (a verify of k rows costs about one step where the round trips dominate,
 * the distributed hub's case, and up to k steps where the arithmetic does, a
 * small model on a CPU). The first two decode steps and one in every
 * PLAIN_EVERY run plain to know a step's cost, the least of the last
 * PLAIN_KEPT (a step's time is noisy upwards: the first is cold, the machine
 * busy); when a speculated token costs more (3 % margin) speculation pauses,
 * for 16 steps, then twice as long each time it still does not pay (up to
 * 1024), so that where it never pays the probes cost a few per cent. */
#define PLAIN_EVERY 32
#define PAUSE_MAX 1024

static bool plain_due(const spec_run *r) { return r->pause > 0 || r->n_plain < 2 || r->since_plain >= PLAIN_EVERY; }

static void note_plain(spec_run *r, double dt) {
    r->plain_s[r->n_plain++ % PLAIN_KEPT] = dt;
    r->since_plain = 0;
}

static double t_plain(const spec_run *r) {
    const int n = r->n_plain < PLAIN_KEPT ? r->n_plain : PLAIN_KEPT;
    double t = r->plain_s[0];
    for (int i = 1; i < n; i++) t = r->plain_s[i] < t ? r->plain_s[i] : t;
    return t;
}

static void judge(spec_run *r) {
    if (r->spec_tokens < 6.0) return;
    if (r->spec_s / r->spec_tokens <= t_plain(r) * 1.03) {
        r->pause_len = 0;
        return;
    }
    r->pause_len = r->pause_len ? (r->pause_len < PAUSE_MAX ? 2 * r->pause_len : PAUSE_MAX) : 16;
    r->pause = r->pause_len;
    r->spec_s = r->spec_tokens = 0.0;
    r->stats->spec.paused++;
}

int moex_spec_next_length(int k_cur, int drafted, int accepted, int kmax) {
    if (accepted == drafted) return k_cur + 2 < kmax ? k_cur + 2 : kmax;
    return k_cur > 1 ? k_cur - 1 : 1;
}

/* One step: draft, verify, keep. Returns 1 when generation ended, 0 to go on, -1 on error. */
static int spec_step(spec_run *r, int32_t *next, moex_error *err) {
    const int64_t left = r->gp->n_predict - r->stats->n_generated;   /* tokens still to produce after *next */
    int kmax = r->k_cur;
    if (kmax > left) kmax = (int)left;
    if (kmax > r->eng->n_ctx - r->n) kmax = (int)(r->eng->n_ctx - r->n);
    const double t0 = moex_time_s();
    bool sampled = false;
    int nd = 0;
    if (kmax > 0 && !plain_due(r)) {
        nd = moex_drafter_propose(r->sp->drafter, r->seq, r->n, kmax, r->rows + 1, r->q, &sampled, err);
        if (nd < 0) return -1;
    }
    if (r->pause > 0) r->pause--;
    r->rows[0] = r->seq[r->n - 1];
    if (verify_forward(r, nd + 1, err)) return -1;
    r->stats->n_decode_evals++;
    const int a = moex_spec_accept(r->smp, r->m->hp.n_vocab, r->greedy_on_device ? NULL : r->logits, r->argmax,
                                   r->rows + 1, nd, sampled ? r->q : NULL, r->p, next);
    const double dt = moex_time_s() - t0;
    moex_spec_stats *st = &r->stats->spec;
    if (nd == 0) {
        st->plain++;
        note_plain(r, dt);
    } else {
        r->since_plain++;
        st->verifies++;
        st->drafted += nd;
        st->accepted += a;
        st->hist[a]++;
        r->spec_s = 0.8 * r->spec_s + dt;
        r->spec_tokens = 0.8 * r->spec_tokens + (a + 1);
        r->k_cur = moex_spec_next_length(r->k_cur, nd, a, r->sp->draft_max);
        judge(r);
    }
    for (int i = 0; i < a; i++) {
        const int rc = emit(r, r->rows[1 + i], err);
        if (rc) return rc;
    }
    return 0;
}

static int spec_alloc(spec_run *r, int K) {
    const size_t V = (size_t)r->m->hp.n_vocab, rows = (size_t)K + 1;
    r->seq = malloc((size_t)(r->n + r->gp->n_predict) * sizeof *r->seq);
    r->logits = r->greedy_on_device ? NULL : malloc(rows * V * sizeof *r->logits);
    r->q = malloc((size_t)K * V * sizeof *r->q);
    r->p = malloc(V * sizeof *r->p);
    r->rows = malloc(rows * sizeof *r->rows);
    r->argmax = malloc(rows * sizeof *r->argmax);
    r->pos = malloc(rows * sizeof *r->pos);
    r->slot = malloc(rows * sizeof *r->slot);
    r->want = malloc(rows * sizeof *r->want);
    r->only = malloc(rows * sizeof *r->only);
    return r->seq && (r->greedy_on_device || r->logits) && r->q && r->p && r->rows && r->argmax && r->pos &&
                   r->slot && r->want && r->only
               ? 0
               : -1;
}

static void spec_release(spec_run *r) {
    free(r->seq);
    free(r->logits);
    free(r->q);
    free(r->p);
    free(r->rows);
    free(r->argmax);
    free(r->pos);
    free(r->slot);
    free(r->want);
    free(r->only);
}

int moex_generate_speculative(const moex_model *m, const moex_engine *eng, moex_sampler *smp, const int32_t *prompt,
                              int64_t n_prompt, const float *last_logits, const moex_gen_params *gp,
                              moex_gen_stats *stats, moex_error *err) {
    const moex_spec_params *sp = gp->spec;
    if (!eng->forward_batch)
        return moex_fail(err, "speculative decoding needs the engine's batched forward (opened with batched)");
    if (gp->on_logits) return moex_fail(err, "speculative decoding does not write every position's logits");
    int K = sp->draft_max;
    if (K > MOEX_SPEC_MAX_DRAFT) K = MOEX_SPEC_MAX_DRAFT;
    if (K > eng->n_batch - 1) K = (int)eng->n_batch - 1;
    if (K < 1) return moex_fail(err, "speculative decoding needs room for a draft (--draft-max >= 1, --batch >= 2)");
    spec_run r = {.m = m, .eng = eng, .smp = smp, .gp = gp, .sp = sp, .stats = stats, .n = n_prompt, .k_cur = K,
                  .greedy_on_device = eng->batch_argmax && moex_sampler_is_greedy(smp)};
    moex_spec_params clamped = *sp;
    clamped.draft_max = K;
    r.sp = &clamped;
    int rc = -1;
    if (spec_alloc(&r, K)) {
        moex_fail(err, "out of memory for speculative decoding");
        goto done;
    }
    memcpy(r.seq, prompt, (size_t)n_prompt * sizeof *prompt);
    const double t0 = moex_time_s();
    int32_t next = moex_sampler_sample(smp, last_logits);
    for (;;) {
        int e = emit(&r, next, err);
        if (e < 0) goto done;
        if (e) break;
        e = spec_step(&r, &next, err);
        if (e < 0) goto done;
        if (e) break;
    }
    stats->decode_s = moex_time_s() - t0;
    rc = 0;
done:
    spec_release(&r);
    return rc;
}
