/* Token sampler. Chain order as llama.cpp's default: top-k -> top-p -> min-p
 * -> temperature -> draw. Every filter keeps the best tokens by logit, so the
 * candidate set is always a prefix of the tokens ordered by (logit desc,
 * id asc); that total order also makes ties deterministic and top_k = 1
 * identical to greedy.
 *
 * Cost is O(n_vocab) typical: top-k is one pass against a k-entry heap;
 * top-p first drops tokens provably outside its prefix, then sorts only as
 * many leading candidates as it needs (doubling quickselects); min-p is one
 * filter pass. Candidate storage is allocated once in create. */
#include "common/sampler.h"
#include "common/rng.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

typedef struct candidate {
    float logit;
    float e;       /* exp((logit - max) / t) for the filter or draw at hand */
    int32_t id;
} candidate;

struct moex_sampler {
    moex_sampler_params p;
    int32_t n_vocab;
    uint64_t rng[4];   /* xoshiro256** state */
    candidate *cand;   /* n_vocab entries */
};

enum { TOP_P_FIRST_CHUNK = 64 };

/* ---- PRNG: xoshiro256** (common/rng.h) ---- */

/* Uniform in [0, 1) with 53 random bits. */
static double uniform01(uint64_t s[4]) { return (double)(moex_xoshiro256ss(s) >> 11) * 0x1.0p-53; }

/* ---- ordering and selection ---- */

static bool better(const candidate *a, const candidate *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static void swap_cand(candidate *a, candidate *b) {
    const candidate t = *a;
    *a = *b;
    *b = t;
}

static int cmp_cand(const void *pa, const void *pb) {
    const candidate *a = pa, *b = pb;
    return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

/* Lomuto partition of c[lo..hi] around a median-of-three pivot; returns the
 * pivot's final index. Entries before it are better than it. */
static int64_t partition(candidate *c, int64_t lo, int64_t hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (better(&c[mid], &c[lo])) swap_cand(&c[mid], &c[lo]);
    if (better(&c[hi], &c[lo])) swap_cand(&c[hi], &c[lo]);
    if (better(&c[mid], &c[hi])) swap_cand(&c[mid], &c[hi]);
    /* c[hi] is now the median of the three */
    int64_t store = lo;
    for (int64_t i = lo; i < hi; i++)
        if (better(&c[i], &c[hi])) swap_cand(&c[i], &c[store++]);
    swap_cand(&c[store], &c[hi]);
    return store;
}

/* Reorders c[0..n) so that its k best entries come first (in any order). */
static void select_best(candidate *c, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const int64_t p = partition(c, lo, hi);
        if (p == k - 1 || p == k) return;
        if (p < k) lo = p + 1;
        else hi = p - 1;
    }
}

/* Sorts the k best of c[0..n) into c[0..k), best first. */
static void sort_best(candidate *c, int64_t n, int64_t k) {
    if (k < n) select_best(c, n, k);
    qsort(c, (size_t)k, sizeof *c, cmp_cand);
}

/* ---- filters: each returns the new candidate count ---- */

/* Restores the min-heap property (worst candidate at the root) below i. */
static void sift_down(candidate *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t worst = i;
        const int64_t l = 2 * i + 1, r = l + 1;
        if (l < n && better(&h[worst], &h[l])) worst = l;
        if (r < n && better(&h[worst], &h[r])) worst = r;
        if (worst == i) return;
        swap_cand(&h[i], &h[worst]);
        i = worst;
    }
}

/* The top_k best finite logits into c[0..top_k), in heap order. One pass
 * that mostly just compares against the heap's worst entry: much cheaper
 * than copying and partitioning the whole vocabulary. */
static int64_t gather_top_k(candidate *c, const float *logits, int32_t n_vocab, int64_t top_k) {
    int64_t n = 0;
    int32_t i = 0;
    for (; i < n_vocab && n < top_k; i++)
        if (logits[i] > -INFINITY) c[n++] = (candidate){logits[i], 0.0f, i};
    for (int64_t j = n / 2 - 1; j >= 0; j--) sift_down(c, n, j);
    /* Ids only grow from here, so a tie with the worst kept entry never
     * wins: a strict > decides (and rejects NaN and -inf). */
    for (; i < n_vocab; i++)
        if (logits[i] > c[0].logit) {
            c[0] = (candidate){logits[i], 0.0f, i};
            sift_down(c, n, 0);
        }
    return n;
}

/* Every finite logit (drops -inf and NaN). */
static int64_t gather_all(candidate *c, const float *logits, int32_t n_vocab) {
    int64_t n = 0;
    for (int32_t i = 0; i < n_vocab; i++)
        if (logits[i] > -INFINITY) c[n++] = (candidate){logits[i], 0.0f, i};
    return n;
}

/* Sets each e = exp((logit - max) / temp) and returns their sum (kept in
 * double: a vocabulary-sized f32 sum would drift). */
static double set_weights(candidate *c, int64_t n, float max_logit, float temp) {
    const float inv_t = 1.0f / temp;
    double z = 0.0;
    for (int64_t i = 0; i < n; i++) z += c[i].e = expf((c[i].logit - max_logit) * inv_t);
    return z;
}

/* Drops tokens that cannot be in the top-p prefix: if e_i < (1-p) z / n, the
 * tokens from i on carry less than (1-p) z together, so the prefix is
 * complete before reaching i. Keeps a peaked 150k vocabulary to a few
 * hundred candidates before any sorting. Order is preserved. */
static int64_t drop_top_p_tail(candidate *c, int64_t n, double top_p, double z) {
    const double floor_e = (1.0 - top_p) * z / (double)n;
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++)
        if (c[i].e >= floor_e) c[kept++] = c[i];
    return kept;
}

/* Keeps the smallest best-first prefix whose probability (temperature 1,
 * normalised over the current candidates) reaches top_p. Sorts in doubling
 * chunks so only as much as needed is ever ordered. */
static int64_t apply_top_p(candidate *c, int64_t n, float top_p, float max_logit) {
    if (!(top_p < 1.0f) || n <= 1) return n;   /* off, or NaN */
    const double z = set_weights(c, n, max_logit, 1.0f);
    n = drop_top_p_tail(c, n, top_p, z);
    const double target = (double)top_p * z;
    double cum = 0.0;
    int64_t sorted = 0;
    for (int64_t chunk = TOP_P_FIRST_CHUNK;; chunk *= 2) {
        const int64_t want = n - sorted < chunk ? n - sorted : chunk;
        sort_best(c + sorted, n - sorted, want);
        for (int64_t i = sorted; i < sorted + want; i++) {
            cum += c[i].e;
            if (cum >= target) return i + 1;
        }
        sorted += want;
        if (sorted == n) return n;
    }
}

/* Keeps tokens with p >= min_p * p_max, i.e. logit >= max + log(min_p);
 * the best token always survives. Order is preserved. */
static int64_t apply_min_p(candidate *c, int64_t n, float min_p, float max_logit) {
    if (!(min_p > 0.0f)) return n;   /* off, or NaN */
    const float threshold = max_logit + logf(min_p);
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++)
        if (c[i].logit >= threshold || c[i].logit == max_logit) c[kept++] = c[i];
    return kept;
}

/* Draws from softmax(logit / temp) over the candidates. */
static int32_t draw(candidate *c, int64_t n, float temp, float max_logit, uint64_t rng[4]) {
    const double u = uniform01(rng) * set_weights(c, n, max_logit, temp);
    double cum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        cum += c[i].e;
        if (u < cum) return c[i].id;
    }
    return c[n - 1].id;   /* u landed in the rounding slack at the very end */
}

/* Greedy pick: NaN never wins, ties go to the lowest id. Index 0 when no
 * logit beats -inf. */
static int32_t argmax(const float *logits, int32_t n) {
    int32_t best = 0;
    float best_logit = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (logits[i] > best_logit) best_logit = logits[i], best = i;
    return best;
}

/* ---- public API ---- */

moex_sampler *moex_sampler_create(const moex_sampler_params *p, int32_t n_vocab) {
    if (!p || n_vocab <= 0) return NULL;
    moex_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    if (!s->cand) {
        free(s);
        return NULL;
    }
    s->p = *p;
    s->n_vocab = n_vocab;
    moex_xoshiro256_seed(s->rng, p->seed);
    return s;
}

void moex_sampler_free(moex_sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s);
}

/* Temperatures too small (or NaN) to divide by act as 0. */
static bool greedy_temp(float temp) { return !(temp > 0.0f) || !isfinite(1.0f / temp); }

bool moex_sampler_is_greedy(const moex_sampler *s) { return greedy_temp(s->p.temp); }

int32_t moex_sampler_sample(moex_sampler *s, const float *logits) {
    const int32_t greedy = argmax(logits, s->n_vocab);
    const float max_logit = logits[greedy];
    /* Greedy also covers degenerate rows (all -inf or NaN, or a +inf logit)
     * where probabilities are undefined, and temperatures too small (or NaN)
     * to divide by. */
    const float temp = s->p.temp;
    if (greedy_temp(temp) || !isfinite(max_logit)) return greedy;

    candidate *c = s->cand;
    const bool use_top_k = s->p.top_k > 0 && s->p.top_k < s->n_vocab;
    int64_t n = use_top_k ? gather_top_k(c, logits, s->n_vocab, s->p.top_k) : gather_all(c, logits, s->n_vocab);
    n = apply_top_p(c, n, s->p.top_p, max_logit);
    n = apply_min_p(c, n, s->p.min_p, max_logit);
    return draw(c, n, temp, max_logit, s->rng);
}

void moex_sampler_dist(moex_sampler *s, const float *logits, float *probs) {
    for (int32_t i = 0; i < s->n_vocab; i++) probs[i] = 0.0f;
    const int32_t greedy = argmax(logits, s->n_vocab);
    const float max_logit = logits[greedy], temp = s->p.temp;
    if (greedy_temp(temp) || !isfinite(max_logit)) {
        probs[greedy] = 1.0f;
        return;
    }
    candidate *c = s->cand;
    const bool use_top_k = s->p.top_k > 0 && s->p.top_k < s->n_vocab;
    int64_t n = use_top_k ? gather_top_k(c, logits, s->n_vocab, s->p.top_k) : gather_all(c, logits, s->n_vocab);
    n = apply_top_p(c, n, s->p.top_p, max_logit);
    n = apply_min_p(c, n, s->p.min_p, max_logit);
    const double z = set_weights(c, n, max_logit, temp);
    for (int64_t i = 0; i < n; i++) probs[c[i].id] = (float)(c[i].e / z);
}

double moex_sampler_uniform(moex_sampler *s) { return uniform01(s->rng); }

int32_t moex_sampler_draw(moex_sampler *s, const float *weights) {
    double z = 0.0;
    int32_t last = -1;
    for (int32_t i = 0; i < s->n_vocab; i++)
        if (weights[i] > 0.0f) z += weights[i], last = i;
    if (last < 0) return -1;
    const double u = uniform01(s->rng) * z;
    double cum = 0.0;
    for (int32_t i = 0; i < s->n_vocab; i++) {
        if (!(weights[i] > 0.0f)) continue;
        cum += weights[i];
        if (u < cum) return i;
    }
    return last;   /* u landed in the rounding slack at the very end */
}

void moex_logits_apply(float *logits, int32_t n_vocab, const moex_logit_rules *r, const int32_t *seen, int64_t n_seen,
                       const int32_t *recent, int64_t n_recent, int32_t *counts) {
    /* llama.cpp's order: the repeat penalty, then presence and frequency, then the biases */
    if (r->repeat != 1.0f && r->repeat > 0.0f) {
        for (int64_t i = 0; i < n_recent; i++) {
            const int32_t t = recent[i];
            if (t < 0 || t >= n_vocab || counts[t]) continue;   /* each recent token once */
            counts[t] = 1;
            logits[t] = logits[t] > 0.0f ? logits[t] / r->repeat : logits[t] * r->repeat;
        }
        for (int64_t i = 0; i < n_recent; i++)
            if (recent[i] >= 0 && recent[i] < n_vocab) counts[recent[i]] = 0;
    }
    if (r->presence != 0.0f || r->frequency != 0.0f) {
        for (int64_t i = 0; i < n_seen; i++)
            if (seen[i] >= 0 && seen[i] < n_vocab) counts[seen[i]]++;
        for (int64_t i = 0; i < n_seen; i++) {
            const int32_t t = seen[i];
            if (t < 0 || t >= n_vocab || !counts[t]) continue;   /* each seen token once */
            logits[t] -= r->presence + (float)counts[t] * r->frequency;
            counts[t] = 0;
        }
    }
    for (int i = 0; i < r->n_bias; i++)
        if (r->bias_id[i] >= 0 && r->bias_id[i] < n_vocab) logits[r->bias_id[i]] += r->bias[i];
}
