/* Sampler: greedy, determinism, the sampled distribution (chi-square against
 * softmax(logits / temp) computed here in double) and the filters' allowed
 * sets (derived here independently by sorting). Random logits per run; the
 * seed is printed and MOEX_TEST_SEED=<n> replays it. */
#include "common/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/test_util.h"

static rng g_rng;

static float rand_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(rng_next(&g_rng) >> 11) * 0x1.0p-53);
}

static float *rand_logits(int32_t n, float lo, float hi) {
    float *l = malloc((size_t)n * sizeof *l);
    for (int32_t i = 0; i < n; i++) l[i] = rand_uniform(lo, hi);
    return l;
}

static moex_sampler *make(float temp, int top_k, float top_p, float min_p, uint64_t seed, int32_t n_vocab) {
    const moex_sampler_params p = {temp, top_k, top_p, min_p, seed};
    moex_sampler *s = moex_sampler_create(&p, n_vocab);
    if (!s) {
        fprintf(stderr, "sampler create failed\n");
        exit(1);
    }
    return s;
}

static int32_t ref_argmax(const float *l, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

/* ---- greedy and determinism ---- */

static void test_greedy(void) {
    const int32_t n = 5000;
    for (int rep = 0; rep < 20; rep++) {
        float *l = rand_logits(n, -20.0f, 20.0f);
        const int32_t want = ref_argmax(l, n);
        moex_sampler *g0 = make(0.0f, 0, 1.0f, 0.0f, 1, n), *gneg = make(-1.0f, 40, 0.9f, 0.1f, 1, n);
        CHECK(moex_sampler_sample(g0, l) == want, "temp 0 is not argmax");
        CHECK(moex_sampler_sample(gneg, l) == want, "temp < 0 is not argmax");
        const float temps[] = {0.3f, 1.0f, 7.0f};
        for (int t = 0; t < 3; t++) {
            moex_sampler *k1 = make(temps[t], 1, 0.9f, 0.0f, rng_next(&g_rng), n);
            CHECK(moex_sampler_sample(k1, l) == want, "top_k=1 at temp %g is not greedy", temps[t]);
            moex_sampler_free(k1);
        }
        /* ties go to the lowest index, in greedy and in top_k = 1 */
        l[4000] = l[want] + 1.0f;
        l[123] = l[4000];
        moex_sampler *k1 = make(2.0f, 1, 1.0f, 0.0f, 7, n);
        CHECK(moex_sampler_sample(g0, l) == 123, "greedy tie should pick lowest index");
        CHECK(moex_sampler_sample(k1, l) == 123, "top_k=1 tie should pick lowest index");
        /* temperatures too small to divide by (or NaN) fall back to greedy */
        moex_sampler *tiny = make(1e-40f, 0, 1.0f, 0.0f, 3, n), *tnan = make(NAN, 0, 1.0f, 0.0f, 3, n);
        CHECK(moex_sampler_sample(tiny, l) == 123, "denormal temp is not greedy");
        CHECK(moex_sampler_sample(tnan, l) == 123, "NaN temp is not greedy");
        /* is_greedy says so exactly where every pick is the argmax (an engine then picks on its device) */
        CHECK(moex_sampler_is_greedy(g0) && moex_sampler_is_greedy(gneg) && moex_sampler_is_greedy(tiny) &&
                  moex_sampler_is_greedy(tnan), "a greedy sampler not reported greedy");
        moex_sampler *warm = make(0.3f, 1, 1.0f, 0.0f, 3, n);
        CHECK(!moex_sampler_is_greedy(warm), "temp 0.3 reported greedy (top_k = 1 picks the argmax, but it is "
                                             "a sampler's filter, not its temperature)");
        moex_sampler_free(warm);
        moex_sampler_free(tiny), moex_sampler_free(tnan);
        moex_sampler_free(k1), moex_sampler_free(g0), moex_sampler_free(gneg);
        free(l);
    }
    /* NaN and -inf never win. */
    float odd[4] = {NAN, -INFINITY, -3.0f, NAN};
    moex_sampler *g = make(0.0f, 0, 1.0f, 0.0f, 1, 4), *t = make(1.0f, 0, 1.0f, 0.0f, 1, 4);
    CHECK(moex_sampler_sample(g, odd) == 2, "greedy picked NaN/-inf");
    for (int i = 0; i < 100; i++) CHECK(moex_sampler_sample(t, odd) == 2, "sampling picked NaN/-inf");
    moex_sampler_free(g), moex_sampler_free(t);
    const moex_sampler_params p = {1.0f, 0, 1.0f, 0.0f, 0};
    CHECK(moex_sampler_create(&p, 0) == NULL, "n_vocab 0 accepted");
    CHECK(moex_sampler_create(NULL, 10) == NULL, "NULL params accepted");
}

static void test_determinism(void) {
    enum { N = 64, DRAWS = 1000 };
    float *l = rand_logits(N, -2.0f, 2.0f);
    const uint64_t seed = rng_next(&g_rng);
    moex_sampler *a = make(1.0f, 0, 1.0f, 0.0f, seed, N), *b = make(1.0f, 0, 1.0f, 0.0f, seed, N);
    moex_sampler *c = make(1.0f, 0, 1.0f, 0.0f, seed + 1, N);
    int same_ab = 1, same_ac = 1;
    for (int i = 0; i < DRAWS; i++) {
        const int32_t ta = moex_sampler_sample(a, l), tb = moex_sampler_sample(b, l), tc = moex_sampler_sample(c, l);
        same_ab &= ta == tb;
        same_ac &= ta == tc;
    }
    CHECK(same_ab, "same seed gave different sequences");
    CHECK(!same_ac, "seeds %llu and %llu gave the same %d draws", (unsigned long long)seed,
          (unsigned long long)seed + 1, DRAWS);
    moex_sampler_free(a), moex_sampler_free(b), moex_sampler_free(c);
    free(l);
}

/* ---- distribution ---- */

/* Chi-square critical value with tail probability ~1e-6 (Wilson-Hilferty,
 * z = 4.75): a correct sampler fails about once in a million runs. */
static double chi2_critical(int df) {
    const double a = 2.0 / (9.0 * df);
    const double c = 1.0 - a + 4.75 * sqrt(a);
    return df * c * c * c;
}

/* Draws `draws` tokens and compares counts with `expected` probabilities;
 * tokens with expected 0 must never appear. */
static void check_distribution(moex_sampler *s, const float *l, int32_t n, const double *expected, int draws,
                               const char *what) {
    long *count = calloc((size_t)n, sizeof *count);
    for (int i = 0; i < draws; i++) {
        const int32_t t = moex_sampler_sample(s, l);
        if (t < 0 || t >= n) {
            CHECK(0, "%s: token %d out of range", what, t);
            free(count);
            return;
        }
        count[t]++;
    }
    double chi2 = 0.0;
    int df = -1;
    for (int32_t i = 0; i < n; i++) {
        if (expected[i] == 0.0) {
            CHECK(count[i] == 0, "%s: token %d is outside the allowed set but drawn %ld times", what, i, count[i]);
            continue;
        }
        const double e = expected[i] * draws;
        chi2 += (count[i] - e) * (count[i] - e) / e;
        df++;
    }
    if (df > 0) {
        CHECK(chi2 < chi2_critical(df), "%s: chi2 %.1f over %d dof exceeds %.1f", what, chi2, df, chi2_critical(df));
        printf("distribution %-22s chi2 %6.2f (df %d, limit %.1f)\n", what, chi2, df, chi2_critical(df));
    }
    free(count);
}

/* softmax(l / temp) restricted to the tokens with keep[i]. */
static void ref_probs(double *p, const float *l, const bool *keep, int32_t n, double temp) {
    double m = -INFINITY, z = 0.0;
    for (int32_t i = 0; i < n; i++)
        if (keep[i] && l[i] > m) m = l[i];
    for (int32_t i = 0; i < n; i++) z += p[i] = keep[i] ? exp((l[i] - m) / temp) : 0.0;
    for (int32_t i = 0; i < n; i++) p[i] /= z;
}

static void test_distribution(void) {
    enum { N = 8, DRAWS = 200000 };
    float l[N];
    for (int i = 0; i < N; i++) l[i] = rand_uniform(-2.0f, 2.0f);
    bool all[N], top3[N];
    double p[N];
    for (int i = 0; i < N; i++) all[i] = true;
    const float temps[] = {0.7f, 1.0f, 1.8f};
    for (int t = 0; t < 3; t++) {
        char what[64];
        snprintf(what, sizeof what, "temp %.1f", temps[t]);
        ref_probs(p, l, all, N, temps[t]);
        moex_sampler *s = make(temps[t], 0, 1.0f, 0.0f, rng_next(&g_rng), N);
        check_distribution(s, l, N, p, DRAWS, what);
        moex_sampler_free(s);
    }
    /* top-k then temperature: softmax(l / T) over the 3 best */
    int order[N];
    for (int i = 0; i < N; i++) order[i] = i;
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++)
            if (l[order[j]] > l[order[i]]) {
                const int tmp = order[i];
                order[i] = order[j], order[j] = tmp;
            }
    for (int i = 0; i < N; i++) top3[order[i]] = i < 3;
    ref_probs(p, l, top3, N, 1.5);
    moex_sampler *s = make(1.5f, 3, 1.0f, 0.0f, rng_next(&g_rng), N);
    check_distribution(s, l, N, p, DRAWS, "top_k 3, temp 1.5");
    moex_sampler_free(s);
}

/* ---- filters' allowed sets ---- */

typedef struct ranked {
    float logit;
    int32_t id;
} ranked;

static int cmp_ranked(const void *pa, const void *pb) {
    const ranked *a = pa, *b = pb;
    if (a->logit != b->logit) return a->logit > b->logit ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* The allowed set, by the book: sort everything, cut the top k, then the
 * shortest prefix reaching top_p (probabilities at temperature 1 over the
 * top-k survivors), then p >= min_p * p_max. Returns its size. */
static int32_t ref_allowed(bool *keep, const float *l, int32_t n, int top_k, float top_p, float min_p) {
    ranked *r = malloc((size_t)n * sizeof *r);
    for (int32_t i = 0; i < n; i++) r[i] = (ranked){l[i], i};
    qsort(r, (size_t)n, sizeof *r, cmp_ranked);
    int32_t m = top_k > 0 && top_k < n ? top_k : n;
    if (top_p < 1.0f) {
        double z = 0.0, cum = 0.0;
        for (int32_t i = 0; i < m; i++) z += exp((double)r[i].logit - r[0].logit);
        for (int32_t i = 0; i < m; i++) {
            cum += exp((double)r[i].logit - r[0].logit);
            if (cum >= (double)top_p * z) {
                m = i + 1;
                break;
            }
        }
    }
    int32_t kept = 0;
    for (int32_t i = 0; i < n; i++) keep[i] = false;
    for (int32_t i = 0; i < m; i++)
        if (min_p <= 0.0f || exp((double)r[i].logit - r[0].logit) >= min_p) keep[r[i].id] = true, kept++;
    free(r);
    return kept;
}

/* top_p placed mid-way between two cumulative sums so that rounding cannot
 * move the cut: the prefix of `want` tokens is the allowed set. */
static float top_p_between(const float *l, int32_t n, int32_t want) {
    ranked *r = malloc((size_t)n * sizeof *r);
    for (int32_t i = 0; i < n; i++) r[i] = (ranked){l[i], i};
    qsort(r, (size_t)n, sizeof *r, cmp_ranked);
    double z = 0.0, below = 0.0, at = 0.0;
    for (int32_t i = 0; i < n; i++) {
        const double e = exp((double)r[i].logit - r[0].logit);
        z += e;
        if (i < want - 1) below += e;
        if (i < want) at += e;
    }
    free(r);
    return (float)((below + at) / 2.0 / z);
}

/* Draws at a high temperature (so rare allowed tokens show up) and checks
 * every draw lies in the allowed set, and that small sets are fully reached. */
static void check_allowed(const char *what, const float *l, int32_t n, int top_k, float top_p, float min_p,
                          int32_t expect_size, int draws) {
    bool *keep = malloc((size_t)n * sizeof *keep), *seen = calloc((size_t)n, sizeof *seen);
    const int32_t size = ref_allowed(keep, l, n, top_k, top_p, min_p);
    CHECK(expect_size < 0 || size == expect_size, "%s: reference allowed set %d, constructed for %d", what, size,
          expect_size);
    const float temp = 4.0f;
    moex_sampler *s = make(temp, top_k, top_p, min_p, rng_next(&g_rng), n);
    int outside = 0, distinct = 0;
    for (int i = 0; i < draws; i++) {
        const int32_t t = moex_sampler_sample(s, l);
        if (t < 0 || t >= n || !keep[t]) outside++;
        else if (!seen[t]) seen[t] = true, distinct++;
    }
    CHECK(outside == 0, "%s: %d of %d draws outside the allowed set of %d", what, outside, draws, size);
    if (size <= 16) CHECK(distinct == size, "%s: only %d of %d allowed tokens drawn", what, distinct, size);
    printf("allowed set %-34s size %6d, %d distinct drawn, none outside\n", what, size, distinct);
    moex_sampler_free(s);
    free(keep), free(seen);
}

static void test_filters(void) {
    /* top-p on a peaked large vocab: the set is the first chunk. */
    {
        const int32_t n = 32000;
        float *l = rand_logits(n, -10.0f, 0.0f);
        for (int i = 0; i < 10; i++) l[rng_next(&g_rng) % n] = 8.0f + (float)i * 0.3f;
        check_allowed("top_p, peaked, 32000", l, n, 0, top_p_between(l, n, 6), 0.0f, 6, 2000);
        free(l);
    }
    /* top-p on a flat large vocab: needs thousands of tokens, so several
     * doubling rounds of partial sorting. */
    {
        const int32_t n = 50000;
        float *l = rand_logits(n, -1.0f, 1.0f);
        check_allowed("top_p, flat, 50000", l, n, 0, top_p_between(l, n, 3000), 0.0f, 3000, 400);
        free(l);
    }
    /* min-p: logits in two bands with a gap around the threshold ln(min_p). */
    {
        const int32_t n = 20000;
        const float min_p = 0.05f, cut = logf(min_p);   /* about -3.0 */
        float *l = malloc((size_t)n * sizeof *l);
        int32_t inside = 0;
        for (int32_t i = 0; i < n; i++) {
            const bool in = rng_next(&g_rng) % 1000 == 0;
            l[i] = in ? rand_uniform(cut + 0.2f, 0.0f) : rand_uniform(-12.0f, cut - 0.2f);
            inside += in;
        }
        const int32_t top = (int32_t)(rng_next(&g_rng) % n);
        if (l[top] < cut) inside++;
        l[top] = 0.0f;   /* the maximum, so the threshold sits at ln(min_p) */
        check_allowed("min_p 0.05, 20000", l, n, 0, 1.0f, min_p, inside, 2000);
        free(l);
    }
    /* all three chained, on a realistic vocab size */
    {
        const int32_t n = 151936;
        float *l = rand_logits(n, -15.0f, 5.0f);
        for (int i = 0; i < 30; i++) l[rng_next(&g_rng) % n] = rand_uniform(5.0f, 12.0f);
        check_allowed("top_k 40, top_p 0.9, min_p 0.01", l, n, 40, 0.9f, 0.01f, -1, 1000);
        check_allowed("top_k 20, top_p 0.5", l, n, 20, 0.5f, 0.0f, -1, 1000);
        free(l);
    }
}

/* Reported, not asserted: the machine is shared. */
static void report_speed(void) {
    const int32_t n = 151936;
    float *l = rand_logits(n, -15.0f, 5.0f);
    const struct { const char *what; int k; float p; } cfg[] = {{"top_k 40 top_p 0.95", 40, 0.95f},
                                                                {"top_p 0.95 (no top_k)", 0, 0.95f}};
    for (int c = 0; c < 2; c++) {
        moex_sampler *s = make(0.8f, cfg[c].k, cfg[c].p, 0.05f, 1, n);
        const clock_t t0 = clock();
        for (int i = 0; i < 20; i++) (void)moex_sampler_sample(s, l);
        printf("speed: %s over %d logits: %.2f ms/sample\n", cfg[c].what, n,
               (double)(clock() - t0) / CLOCKS_PER_SEC * 1000.0 / 20);
        moex_sampler_free(s);
    }
    free(l);
}

/* moex_logits_apply against a direct float64 transcription of each rule, on fresh random tokens. */
static void test_logit_rules(void) {
    const int32_t n = 300;
    for (int trial = 0; trial < 20; trial++) {
        float *l = rand_logits(n, -6.0f, 6.0f), *got = malloc(n * sizeof *got);
        int32_t seen[64], recent[32], ids[5], *counts = calloc((size_t)n, sizeof *counts);
        float bias[5];
        for (int i = 0; i < 64; i++) seen[i] = (int32_t)(rng_next(&g_rng) % 40);   /* repeats */
        for (int i = 0; i < 32; i++) recent[i] = (int32_t)(rng_next(&g_rng) % 60);
        for (int i = 0; i < 5; i++) ids[i] = (int32_t)(rng_next(&g_rng) % (uint64_t)n), bias[i] = rand_uniform(-5, 5);
        const moex_logit_rules r = {.presence = rand_uniform(-2, 2), .frequency = rand_uniform(-2, 2),
                                    .repeat = rand_uniform(0.5f, 2.0f), .bias_id = ids, .bias = bias, .n_bias = 5};
        memcpy(got, l, n * sizeof *got);
        moex_logits_apply(got, n, &r, seen, 64, recent, 32, counts);
        int worst_ok = 1, clean = 1;
        for (int32_t t = 0; t < n; t++) {
            double want = l[t];
            int c = 0, in_recent = 0;
            for (int i = 0; i < 64; i++) c += seen[i] == t;
            for (int i = 0; i < 32; i++) in_recent |= recent[i] == t;
            if (in_recent) want = want > 0 ? want / r.repeat : want * r.repeat;
            if (c) want -= r.presence + c * (double)r.frequency;
            for (int i = 0; i < 5; i++)
                if (ids[i] == t) want += bias[i];
            worst_ok &= fabs(got[t] - want) <= 1e-5 * (1 + fabs(want));
            clean &= counts[t] == 0;
        }
        CHECK(worst_ok, "logit rules: presence, frequency, repeat and bias as defined (trial %d)", trial);
        CHECK(clean, "logit rules: the counts scratch is zero again");
        free(l), free(got), free(counts);
    }
}

int main(void) {
    g_rng = test_rng("test_sampler");
    test_logit_rules();
    test_greedy();
    test_determinism();
    test_distribution();
    test_filters();
    report_speed();
    if (g_failures) {
        fprintf(stderr, "%d check(s) failed (replay with the seed printed first)\n", g_failures);
        return 1;
    }
    printf("all sampler tests passed\n");
    return 0;
}
