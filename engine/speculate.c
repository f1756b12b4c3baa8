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
    /* Optional: takes in seq[0..n) ahead of the first draft (a draft model's prompt) */
    int (*prime)(moex_drafter *d, const int32_t *seq, int64_t n, moex_error *err);
};

void moex_drafter_free(moex_drafter *d) {
    if (d) d->free(d);
}

int moex_drafter_prime(moex_drafter *d, const int32_t *seq, int64_t n, moex_error *err) {
    return d->prime && n > 0 ? d->prime(d, seq, n, err) : 0;
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
    *ld = (lookup_drafter){{lookup_draft, lookup_free, NULL}, ngram_min, ngram_max};
    return &ld->base;
}

/* ---- a draft model ---- */

typedef struct model_drafter {
    moex_drafter base;
    const moex_model *m;
    const moex_engine *eng;
    int slot;
    moex_sampler *smp;       /* its own generator: the main sampler's draws stay the main sampler's */
    int64_t first;           /* the sequence's index at the draft's position 0 (a window, after a long gap) */
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

/* Tokens the draft model takes in at most to catch up: after a longer gap
 * (no drafts while drafting did not pay) it starts afresh on the sequence's last
 * CATCH_UP tokens, so that a draft never costs a prompt's worth of forwards
 * (drafts lean on the recent context). The first draft takes in the whole
 * prompt, once. */
#define CATCH_UP 64

/* Brings the draft engine's KV to seq[first..n) (re-using the common prefix)
 * and leaves the logits after seq[n-1]. */
static int draft_catch_up(model_drafter *md, const int32_t *seq, int64_t n, moex_error *err) {
    int64_t from = 0;
    while (from < md->kv_n && md->first + from < n && md->kv_tok[from] == seq[md->first + from]) from++;
    if (md->kv_n > 0 && n - md->first - from > CATCH_UP) {   /* a window of the last CATCH_UP tokens at positions 0.. */
        md->first = n - CATCH_UP;
        md->kv_n = from = 0;
    }
    const int64_t len = n - md->first;      /* the draft's positions 0 .. len-1 */
    if (from == len) from = len - 1;       /* its logits are wanted again */
    for (int64_t pos = from; pos < len; pos += md->eng->n_batch) {
        const int64_t c = len - pos < md->eng->n_batch ? len - pos : md->eng->n_batch;
        if (draft_forward(md, seq + md->first + pos, c, pos, err)) return moex_error_prefix(err, "draft model");
    }
    memcpy(md->kv_tok + from, seq + md->first + from, (size_t)(len - from) * sizeof *seq);
    md->kv_n = len;
    return 0;
}

static int model_draft(moex_drafter *d, const int32_t *seq, int64_t n, int max, int32_t *out, float *q,
                       bool *sampled, moex_error *err) {
    model_drafter *md = (model_drafter *)d;
    const int32_t V = md->m->hp.n_vocab;
    *sampled = !moex_sampler_is_greedy(md->smp);
    if (draft_catch_up(md, seq, n, err)) return -1;
    const int64_t len = n - md->first;   /* the draft's position of the first draft */
    if (len + max > md->eng->n_ctx) max = (int)(md->eng->n_ctx - len);
    if (max <= 0) return 0;
    for (int j = 0; j < max; j++) {
        if (*sampled) {
            moex_sampler_dist(md->smp, md->logits, q + (size_t)j * (size_t)V);
            out[j] = moex_sampler_draw(md->smp, q + (size_t)j * (size_t)V);
        } else {
            out[j] = moex_sampler_sample(md->smp, md->logits);
        }
        if (out[j] < 0) return j;   /* no finite logit: propose what there is */
        if (j + 1 == max) break;    /* the last draft needs no forward */
        if (draft_forward(md, &out[j], 1, len + j, err)) return moex_error_prefix(err, "draft model");
        md->kv_tok[len + j] = out[j];
        md->kv_n = len + j + 1;
    }
    return max;
}

static int model_prime(moex_drafter *d, const int32_t *seq, int64_t n, moex_error *err) {
    return draft_catch_up((model_drafter *)d, seq, n, err);
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
    md->base = (moex_drafter){model_draft, model_free, model_prime};
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

static int chain_prime(moex_drafter *d, const int32_t *seq, int64_t n, moex_error *err) {
    chain_drafter *cd = (chain_drafter *)d;
    return moex_drafter_prime(cd->first, seq, n, err) ? -1 : moex_drafter_prime(cd->second, seq, n, err);
}

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
    *cd = (chain_drafter){{chain_draft, chain_free, chain_prime}, first, second};
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

#define PLAIN_KEPT 5

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
    /* what a step costs (the auto-off, below): the last one-token steps'
     * seconds; drafting, seconds a drafted token; verifying, seconds a row
     * beyond a one-token step; drafts accepted and rejected (decaying) */
    double plain_s[PLAIN_KEPT], draft_s[PLAIN_KEPT], row_s[PLAIN_KEPT], hits, misses;
    int n_plain, n_verify, since_plain, probe_in, probe_gap;
} spec_run;

/* One forward of rows[0..m) at positions n-1 .. n-1+m-1 of slot 0, every row
 * wanted. A single row (nothing drafted) takes the engine's one-token path, as
 * generation without speculation does (the batched path's per-step host work
 * costs a fast GPU a tenth of a step): the same one-token kernels, so the same
 * bits. */
static int verify_forward(spec_run *r, int m, moex_error *err) {
    if (m == 1 && (!r->greedy_on_device || r->eng->last_argmax)) {
        if (r->eng->forward(r->eng->ctx, r->rows, 1, r->n - 1, false, r->greedy_on_device ? NULL : r->logits, err))
            return -1;
        if (r->greedy_on_device) r->argmax[0] = r->eng->last_argmax(r->eng->ctx);
        return 0;
    }
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

/* Auto-off, from what a step costs here. A verify of k drafts yields
 * (1 - a^(k+1)) / (1 - a) tokens when each draft is accepted with probability
 * a, and costs a one-token step plus k x (a drafted token + a verify row
 * beyond the first). Where round trips dominate (hub + workers) a row costs
 * next to nothing and speculation pays with any acceptance; where the
 * arithmetic does (a small model on this CPU or GPU) a row costs a good part
 * of a step, and a draft model's token as much as the model's own. Each step
 * drafts the k that yields the most tokens a second, or none when no k beats
 * a one-token step by 3 %; then a probe (1 draft) now and then keeps the
 * figures current, at gaps doubling from 32 steps to 1024, or 1024 at once
 * when not even drafts that are always right would pay (a draft model's
 * token costing as much as the model's). The first verify asks for one draft
 * (it costs the least where nothing pays). The first two steps and one in
 * every PLAIN_EVERY run plain to know a step's cost. Each cost is the median
 * of its last PLAIN_KEPT samples, the lower one of an even count (the first
 * step is cold, a new batch shape is recorded on first use, a busy machine
 * has outliers). k is a power of two, so that a GPU engine records few
 * verify shapes. */
#define PLAIN_EVERY 32
#define PROBE_GAP_MIN 32
#define PROBE_GAP_MAX 1024
#define PROBE_DRAFTS 1   /* the first verify's length too: one verify shape while off */

static void note_plain(spec_run *r, double dt) {
    r->plain_s[r->n_plain++ % PLAIN_KEPT] = dt;
    r->since_plain = 0;
}

/* The lower median of the last min(count, PLAIN_KEPT) samples of a ring. */
static double median_of(const double *ring, int count) {
    const int n = count < PLAIN_KEPT ? count : PLAIN_KEPT;
    double t[PLAIN_KEPT] = {0};
    for (int i = 0; i < n; i++) {   /* insertion sort of at most PLAIN_KEPT */
        int j = i;
        for (; j > 0 && t[j - 1] > ring[i]; j--) t[j] = t[j - 1];
        t[j] = ring[i];
    }
    return n ? t[(n - 1) / 2] : 0.0;
}

static double t_plain(const spec_run *r) { return median_of(r->plain_s, r->n_plain); }

/* The number of drafts worth asking for (up to kmax), 0 for none; -1 before
 * any verify (nothing known yet). The acceptance starts from one accepted and
 * one rejected draft pretended, so that one unlucky verify does not decide. */
static int best_length(const spec_run *r, int kmax, bool *never) {
    if (r->n_verify == 0) return -1;
    double a = (r->hits + 1.0) / (r->hits + r->misses + 2.0);
    if (a > 0.99) a = 0.99;
    const double t1 = t_plain(r);
    const double per_draft = median_of(r->draft_s, r->n_verify) + median_of(r->row_s, r->n_verify);
    int best = 0;
    double best_rate = 1.03 / t1;   /* a one-token step's, with the margin */
    *never = true;
    for (int k = 1; k <= kmax; k *= 2) {
        const double rate = (1.0 - pow(a, k + 1)) / (1.0 - a) / (t1 + k * per_draft);
        if (rate > best_rate) best_rate = rate, best = k;
        if ((k + 1) / (t1 + k * per_draft) > 1.03 / t1) *never = false;
    }
    return best;
}

/* How many drafts this step asks for: 0 for a one-token step. */
static int drafts_wanted(spec_run *r, int kmax) {
    if (kmax <= 0) return 0;
    const int floor = r->sp->draft_min < kmax ? r->sp->draft_min : kmax;
    if (r->n_plain < 2 || r->since_plain >= PLAIN_EVERY) return floor;
    bool never = false;
    const int k = best_length(r, kmax, &never);
    if (floor > 0) return k > floor ? k : floor;
    if (k < 0) return PROBE_DRAFTS;   /* the first verify: the cheapest way to learn what a draft and a row cost */
    if (k > 0) {
        r->probe_gap = 0;
        return k;
    }
    if (r->probe_in > 0) {
        r->probe_in--;
        return 0;
    }
    r->probe_gap = never ? PROBE_GAP_MAX
                 : r->probe_gap ? (r->probe_gap < PROBE_GAP_MAX ? 2 * r->probe_gap : PROBE_GAP_MAX)
                                : PROBE_GAP_MIN;
    r->probe_in = r->probe_gap;
    r->stats->spec.probes++;
    return kmax < PROBE_DRAFTS ? kmax : PROBE_DRAFTS;
}

/* A verify's costs and outcome into the figures (moving averages). */
static void note_verify(spec_run *r, int nd, int a, double draft_dt, double verify_dt) {
    const double row = (verify_dt - t_plain(r)) / nd;
    r->draft_s[r->n_verify % PLAIN_KEPT] = draft_dt / nd;
    r->row_s[r->n_verify % PLAIN_KEPT] = row > 0 ? row : 0;
    r->n_verify++;
    r->hits = 0.9 * r->hits + a;
    r->misses = 0.9 * r->misses + (a < nd);
}

int moex_spec_next_length(int k_cur, int drafted, int accepted, int kmax) {
    if (accepted == drafted) return k_cur + 2 < kmax ? k_cur + 2 : kmax;
    return k_cur > 1 ? k_cur - 1 : 1;
}

/* One step: draft, verify, keep. Returns 1 when generation ended, 0 to go on, -1 on error. */
static int spec_step(spec_run *r, int32_t *next, moex_error *err) {
    const int64_t left = r->gp->n_predict - r->stats->n_generated;   /* tokens still to produce after *next */
    int kmax = r->sp->draft_max;
    if (kmax > left) kmax = (int)left;
    if (kmax > r->eng->n_ctx - r->n) kmax = (int)(r->eng->n_ctx - r->n);
    const double t0 = moex_time_s();
    bool sampled = false;
    int nd = 0;
    const int want = drafts_wanted(r, kmax);
    if (want > 0) {
        nd = moex_drafter_propose(r->sp->drafter, r->seq, r->n, want, r->rows + 1, r->q, &sampled, err);
        if (nd < 0) return -1;
    }
    const double t1 = moex_time_s();
    r->rows[0] = r->seq[r->n - 1];
    if (verify_forward(r, nd + 1, err)) return -1;
    r->stats->n_decode_evals++;
    const double t2 = moex_time_s();
    const int a = moex_spec_accept(r->smp, r->m->hp.n_vocab, r->greedy_on_device ? NULL : r->logits, r->argmax,
                                   r->rows + 1, nd, sampled ? r->q : NULL, r->p, next);
    moex_spec_stats *st = &r->stats->spec;
    if (nd == 0) {
        st->plain++;
        note_plain(r, moex_time_s() - t1);
    } else {
        r->since_plain++;
        st->verifies++;
        st->drafted += nd;
        st->accepted += a;
        st->hist[a]++;
        note_verify(r, nd, a, t1 - t0, t2 - t1);
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
    spec_run r = {.m = m, .eng = eng, .smp = smp, .gp = gp, .sp = sp, .stats = stats, .n = n_prompt,
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
