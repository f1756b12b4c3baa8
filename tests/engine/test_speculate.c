/* Speculative decoding's parts that need no model (engine/speculate.c):
 *
 * - The acceptance rule with temperature leaves the output's distribution
 *   that of the sampler alone: a small vocabulary whose next-token
 *   distribution depends on the previous token (a Markov chain, fresh random
 *   tables each run), drafts drawn from another such chain, two drafts a
 *   verify; the first two generated tokens' joint frequencies over 40,000
 *   runs against the exact joint probabilities (chi-square, p > 0.01; a
 *   right rule fails that one run in a hundred, so a second, independent run
 *   decides then: one in 10^4). The
 *   same test fails a deliberately wrong rule (a rejected draft replaced by a
 *   draw from p rather than from max(p - q, 0)), so it can tell.
 * - Deterministic drafters (q a point mass) under the same test.
 * - Greedy on the engine's argmax: the accepted prefix and the next token.
 * - Prompt lookup: the latest match of the longest n-gram, a loop's
 *   continuation through its own drafts, nothing without a match. */
#include <math.h>
#include <string.h>

#include "engine/engine.h"
#include "tests/test_util.h"

enum { V = 6, RUNS = 40000 };

/* P(chi2_dof >= x): the regularized upper incomplete gamma Q(dof/2, x/2). */
static double chi2_sf(double x, int dof) {
    const double a = dof / 2.0, z = x / 2.0;
    if (z <= 0) return 1.0;
    const double lg = lgamma(a);
    if (z < a + 1.0) {   /* series for P, then 1 - P */
        double sum = 1.0 / a, term = sum;
        for (int n = 1; n < 500; n++) {
            term *= z / (a + n);
            sum += term;
            if (term < sum * 1e-15) break;
        }
        return 1.0 - sum * exp(-z + a * log(z) - lg);
    }
    /* continued fraction for Q (Lentz) */
    double b = z + 1.0 - a, c = 1e300, d = 1.0 / b, h = d;
    for (int i = 1; i < 500; i++) {
        const double an = -i * (i - a);
        b += 2.0;
        d = an * d + b;
        if (fabs(d) < 1e-300) d = 1e-300;
        c = b + an / c;
        if (fabs(c) < 1e-300) c = 1e-300;
        d = 1.0 / d;
        h *= d * c;
        if (fabs(d * c - 1.0) < 1e-15) break;
    }
    return exp(-z + a * log(z) - lg) * h;
}

typedef struct chain {
    float p[V + 1][V];   /* p[prev][next]; row V: after the context */
} chain;

static void random_chain(rng *r, chain *c, double peak) {
    for (int i = 0; i <= V; i++) {
        double z = 0;
        for (int j = 0; j < V; j++) z += c->p[i][j] = (float)exp(peak * rng_gauss(r));
        for (int j = 0; j < V; j++) c->p[i][j] = (float)(c->p[i][j] / z);
    }
}

static int32_t draw_row(rng *r, const float *p) {
    const double u = rng_uniform(r);
    double cum = 0;
    for (int j = 0; j < V; j++)
        if (u < (cum += p[j])) return j;
    return V - 1;
}

/* The wrong rule: a rejected draft replaced by a draw from p itself. */
static int wrong_accept(moex_sampler *smp, const float *logits, const int32_t *draft, int n_draft, const float *q,
                        float *p, int32_t *next) {
    for (int a = 0; a < n_draft; a++) {
        moex_sampler_dist(smp, logits + a * V, p);
        const float qx = q ? q[a * V + draft[a]] : 1.0f;
        if (moex_sampler_uniform(smp) * qx < p[draft[a]]) continue;
        *next = moex_sampler_draw(smp, p);
        return a;
    }
    *next = moex_sampler_sample(smp, logits + n_draft * V);
    return n_draft;
}

/* Runs the verify step RUNS times (two drafts from dr, or always the tokens
 * `fixed` when dr is NULL) and returns the chi-square p-value of the first two
 * generated tokens' frequencies against the target chain's joint law. */
static double run_rule(rng *r, const chain *tg, const chain *dr, const int32_t *fixed, bool wrong) {
    moex_sampler *smp = moex_sampler_create(&(moex_sampler_params){.temp = 1.0f, .top_p = 1.0f, .seed = rng_next(r)}, V);
    static long long counts[V][V];
    memset(counts, 0, sizeof counts);
    float logits[3 * V], q[2 * V], scratch[V];
    for (int run = 0; run < RUNS; run++) {
        int32_t d[2];
        if (dr) {
            d[0] = draw_row(r, dr->p[V]);
            d[1] = draw_row(r, dr->p[d[0]]);
            memcpy(q, dr->p[V], sizeof(float) * V);
            memcpy(q + V, dr->p[d[0]], sizeof(float) * V);
        } else {
            d[0] = fixed[0], d[1] = fixed[1];
        }
        /* row 0: after the context; row 1: after d0; row 2: after d1 */
        const int prev[3] = {V, d[0], d[1]};
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < V; j++) logits[i * V + j] = logf(tg->p[prev[i]][j]);
        int32_t next;
        const int a = wrong ? wrong_accept(smp, logits, d, 2, dr ? q : NULL, scratch, &next)
                            : moex_spec_accept(smp, V, logits, NULL, d, 2, dr ? q : NULL, scratch, &next);
        int32_t x1, x2;
        if (a == 0) { /* the second token would come from the next step: p given x1 */
            x1 = next;
            float row[V];
            for (int j = 0; j < V; j++) row[j] = logf(tg->p[x1][j]);
            x2 = moex_sampler_sample(smp, row);
        } else {
            x1 = d[0];
            x2 = a == 1 ? next : d[1];
        }
        counts[x1][x2]++;
    }
    moex_sampler_free(smp);
    double chi2 = 0;
    for (int i = 0; i < V; i++)
        for (int j = 0; j < V; j++) {
            const double e = (double)RUNS * tg->p[V][i] * tg->p[i][j];
            chi2 += (counts[i][j] - e) * (counts[i][j] - e) / e;
        }
    return chi2_sf(chi2, V * V - 1);
}

/* The right rule's p-value: a second run when the first is below 0.01. */
static double right_rule_p(rng *r, const chain *tg, const chain *dr, const int32_t *fixed) {
    const double p = run_rule(r, tg, dr, fixed, false);
    return p > 0.01 ? p : run_rule(r, tg, dr, fixed, false);
}

static void check_sampling(rng *r) {
    chain tg, dr;
    random_chain(r, &tg, 0.7);
    random_chain(r, &dr, 0.7);
    const double pv = right_rule_p(r, &tg, &dr, NULL);
    CHECK(pv > 0.01, "draft model rule: chi-square p = %.2g (the output's law moved)", pv);
    const double pw = run_rule(r, &tg, &dr, NULL, true);
    CHECK(pw < 1e-6, "the wrong rule is caught: p = %.2g", pw);
    const int32_t fixed[2] = {(int32_t)(rng_next(r) % V), (int32_t)(rng_next(r) % V)};
    const double pl = right_rule_p(r, &tg, NULL, fixed);
    CHECK(pl > 0.01, "deterministic drafts: chi-square p = %.2g", pl);
    const double plw = run_rule(r, &tg, NULL, fixed, true);
    CHECK(plw < 1e-6, "the wrong rule with deterministic drafts is caught: p = %.2g", plw);
    printf("  sampling: p = %.3f (draft model), %.3f (fixed drafts); the wrong rule p = %.1e, %.1e\n", pv, pl, pw, plw);
}

static void check_greedy(void) {
    const int32_t draft[4] = {5, 7, 9, 11};
    const int32_t all[5] = {5, 7, 9, 11, 13}, some[5] = {5, 7, 2, 11, 13}, none[5] = {4, 7, 9, 11, 13};
    int32_t next;
    CHECK(moex_spec_accept(NULL, 16, NULL, all, draft, 4, NULL, NULL, &next) == 4 && next == 13, "all accepted");
    CHECK(moex_spec_accept(NULL, 16, NULL, some, draft, 4, NULL, NULL, &next) == 2 && next == 2, "two accepted");
    CHECK(moex_spec_accept(NULL, 16, NULL, none, draft, 4, NULL, NULL, &next) == 0 && next == 4, "none accepted");
    CHECK(moex_spec_accept(NULL, 16, NULL, all, draft, 0, NULL, NULL, &next) == 0 && next == 5, "no draft");
}

/* Prompt lookup over 1- to 3-grams; returns the drafts' count. */
static int lookup(const int32_t *seq, int64_t n, int max, int32_t *out) {
    moex_drafter *d = moex_drafter_lookup(1, 3);
    bool sampled = true;
    const int k = moex_drafter_propose(d, seq, n, max, out, NULL, &sampled, NULL);
    CHECK(!sampled, "lookup drafts are deterministic");
    moex_drafter_free(d);
    return k;
}

static void check_lookup(void) {
    int32_t out[8];
    /* "a b c d a b" -> the 2-gram "a b" last seen at 0: "c d a b c d ..." (its own drafts past the end) */
    const int32_t s1[] = {1, 2, 3, 4, 1, 2};
    CHECK(lookup(s1, 6, 6, out) == 6 && out[0] == 3 && out[1] == 4 && out[2] == 1 && out[3] == 2 && out[4] == 3 &&
              out[5] == 4,
          "a loop continues through its drafts: %d %d %d %d %d %d", out[0], out[1], out[2], out[3], out[4], out[5]);
    /* the longest n-gram wins over a later shorter one: "7 8 9 | 5 ... 8 9 | 6 ... 7 8 9" */
    const int32_t s2[] = {7, 8, 9, 5, 0, 8, 9, 6, 0, 7, 8, 9};
    CHECK(lookup(s2, 12, 2, out) == 2 && out[0] == 5 && out[1] == 0, "the 3-gram's continuation: %d %d", out[0],
          out[1]);
    const int32_t s3[] = {1, 2, 3, 4};
    CHECK(lookup(s3, 4, 4, out) == 0, "no earlier occurrence: no draft");
    const int32_t s4[] = {9};
    CHECK(lookup(s4, 1, 4, out) == 0, "a one-token sequence: no draft");
}

int main(void) {
    rng r = test_rng("test_speculate");
    check_greedy();
    check_lookup();
    check_sampling(&r);
    if (g_failures) {
        fprintf(stderr, "test_speculate: %d failure(s)\n", g_failures);
        return 1;
    }
    printf("test_speculate: ok\n");
    return 0;
}
