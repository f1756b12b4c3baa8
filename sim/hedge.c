/* The hedged expert phase T = max_k min_h T_ij with T_ij ~ LogNormal:
 * eq. 18 by quadrature, its quantiles by root finding, and Monte Carlo.
 *
 * Everything is computed in z = (ln t - mu) / sigma, where the worker CDF is
 * F = Phi(z). With t = e^(mu + sigma z), eq. 18 becomes
 *   E[T] = integral S(z) sigma e^(mu + sigma z) dz,  S = 1 - [1 - (1-F)^h]^k,
 * a smooth integrand that decays like e^(sigma z) on the left and like
 * Phi(-z)^h on the right. Below z_lo, S = 1 to double precision, so that
 * part integrates exactly to e^(mu + sigma z_lo). */
#include "sim/sim.h"

#include <math.h>
#include <stdlib.h>

#define Z_LO (-37.5) /* Phi(-37.5) ~ 1e-308: S == 1 below */
#define Z_HI 38.5    /* Phi(-38.5) underflows: S == 0 above */

int moex_hedge_check(const moex_hedge_model *m, moex_error *err) {
    if (m->k < 1 || m->k > 100000) return moex_fail(err, "k must be in [1, 100000] (got %d)", m->k);
    if (m->h < 1 || m->h > 1000) return moex_fail(err, "h must be in [1, 1000] (got %d)", m->h);
    if (!(m->median > 0) || !isfinite(m->median))
        return moex_fail(err, "median latency must be a positive number (got %g)", m->median);
    if (!(m->sigma >= 0) || m->sigma > 5)
        return moex_fail(err, "sigma must be in [0, 5] (got %g)", m->sigma);
    return 0;
}

/* ln(1 - F(z)) = ln Phi(-z), accurate in both tails. */
static double log_survival_z(double z) {
    if (z < 0) return log1p(-0.5 * erfc(-z / M_SQRT2));
    return log(0.5 * erfc(z / M_SQRT2));
}

/* S(z) = 1 - [1 - Q^h]^k with Q = 1 - F(z), avoiding 1 - (1 - tiny). */
static double survival_z(int k, int h, double z) {
    double hlq = h * log_survival_z(z); /* ln Q^h */
    double qh = exp(hlq);
    double log_g = qh < 0.5 ? log1p(-qh) : log(-expm1(hlq)); /* ln(1 - Q^h) */
    return -expm1(k * log_g);
}

double moex_hedge_survival(const moex_hedge_model *m, double t) {
    if (t <= 0) return 1.0;
    double lt = log(t), mu = log(m->median);
    if (m->sigma == 0) return lt < mu ? 1.0 : 0.0;
    return survival_z(m->k, m->h, (lt - mu) / m->sigma);
}

/* ---- Adaptive Gauss-Kronrod (7, 15) ---- */

typedef struct integrand {
    int k, h;
    double mu, sigma;
} integrand;

static double integrand_at(const integrand *f, double z) {
    return survival_z(f->k, f->h, z) * f->sigma * exp(f->mu + f->sigma * z);
}

static const double xgk[8] = {0.991455371120812639206854697526329, 0.949107912342758524526189684047851,
                              0.864864423359769072789712788640926, 0.741531185599394439863864773280788,
                              0.586087235467691130294144845693013, 0.405845151377397166906606412076961,
                              0.207784955007898467600689403773245, 0.000000000000000000000000000000000};
static const double wgk[8] = {0.022935322010529224963732008058970, 0.063092092629978553290700663189204,
                              0.104790010322250183839876322541518, 0.140653259715525918745189590510238,
                              0.169004726639267902826583426598550, 0.190350578064785409913256402421014,
                              0.204432940075298892414161999234649, 0.209482141084727828012999174891714};
static const double wg[4] = {0.129484966168869693270611432679082, 0.279705391489276667901467771423780,
                             0.381830050505118944950369775488975, 0.417959183673469387755102040816327};

/* One G7/K15 panel on [a, b]; returns the Kronrod value, *diff = |K - G|. */
static double gk15(const integrand *f, double a, double b, double *diff) {
    double c = 0.5 * (a + b), hw = 0.5 * (b - a);
    double fc = integrand_at(f, c);
    double k = fc * wgk[7], g = fc * wg[3];
    for (int j = 0; j < 7; j++) {
        double dx = hw * xgk[j];
        double fs = integrand_at(f, c - dx) + integrand_at(f, c + dx);
        k += wgk[j] * fs;
        if (j % 2 == 1) g += wg[j / 2] * fs; /* odd Kronrod nodes are the Gauss nodes */
    }
    *diff = fabs((k - g) * hw);
    return k * hw;
}

/* Bisects until the Gauss/Kronrod difference meets the panel's share of tol. */
static double adapt(const integrand *f, double a, double b, double tol, int depth) {
    double diff, v = gk15(f, a, b, &diff);
    if (diff <= tol || depth >= 40) return v;
    double c = 0.5 * (a + b);
    return adapt(f, a, c, 0.5 * tol, depth + 1) + adapt(f, c, b, 0.5 * tol, depth + 1);
}

#define PANELS 64

int moex_hedge_expect(const moex_hedge_model *m, double *out, moex_error *err) {
    if (moex_hedge_check(m, err)) return -1;
    if (m->sigma == 0) {
        *out = m->median;
        return 0;
    }
    integrand f = {m->k, m->h, log(m->median), m->sigma};
    double width = (Z_HI - Z_LO) / PANELS, coarse = 0, diff;
    for (int i = 0; i < PANELS; i++) coarse += gk15(&f, Z_LO + i * width, Z_LO + (i + 1) * width, &diff);
    double below = exp(f.mu + f.sigma * Z_LO);
    double tol = 1e-13 * (coarse + below) / PANELS;
    double sum = below;
    for (int i = 0; i < PANELS; i++) sum += adapt(&f, Z_LO + i * width, Z_LO + (i + 1) * width, tol, 0);
    *out = sum;
    return 0;
}

int moex_hedge_quantile(const moex_hedge_model *m, double p, double *out, moex_error *err) {
    if (moex_hedge_check(m, err)) return -1;
    if (!(p > 0 && p < 1)) return moex_fail(err, "quantile must be in (0, 1) (got %g)", p);
    if (m->sigma == 0) {
        *out = m->median;
        return 0;
    }
    /* F_max = [1 - Q^h]^k = p  <=>  ln Q = ln(1 - p^(1/k)) / h. */
    double target = log(-expm1(log(p) / m->k)) / m->h;
    double lo = -40, hi = 40; /* ln Q(z) is decreasing in z */
    for (int i = 0; i < 200 && hi - lo > 1e-14; i++) {
        double mid = 0.5 * (lo + hi);
        if (log_survival_z(mid) > target) lo = mid;
        else hi = mid;
    }
    *out = m->median * exp(m->sigma * 0.5 * (lo + hi));
    return 0;
}

int moex_hedge_work_factor(const moex_hedge_model *m, double *out, moex_error *err) {
    if (moex_hedge_check(m, err)) return -1;
    moex_hedge_model one = *m;
    one.k = 1;
    double e_min;
    if (moex_hedge_expect(&one, &e_min, err)) return -1;
    *out = m->h * e_min / (m->median * exp(0.5 * m->sigma * m->sigma));
    return 0;
}

/* Log-normal is monotone in its normal, so max-min is taken over the
 * normals and exponentiated once per trial. */
static double max_min_normal(int k, int h, moex_rng *rng) {
    double worst = -INFINITY;
    for (int i = 0; i < k; i++) {
        double best = INFINITY;
        for (int j = 0; j < h; j++) {
            double z = moex_rng_normal(rng);
            if (z < best) best = z;
        }
        if (best > worst) worst = best;
    }
    return worst;
}

#define MC_MAX_TRIALS 100000000ULL

int moex_hedge_monte_carlo(const moex_hedge_model *m, uint64_t trials, moex_rng *rng, moex_hedge_mc *out,
                           moex_error *err) {
    if (moex_hedge_check(m, err)) return -1;
    if (trials < 2 || trials > MC_MAX_TRIALS)
        return moex_fail(err, "trials must be in [2, %llu] (got %llu)", (unsigned long long)MC_MAX_TRIALS,
                         (unsigned long long)trials);
    double *t = malloc(trials * sizeof *t);
    if (!t) return moex_fail(err, "out of memory for %llu Monte Carlo trials", (unsigned long long)trials);
    for (uint64_t i = 0; i < trials; i++) t[i] = m->median * exp(m->sigma * max_min_normal(m->k, m->h, rng));
    out->mean = moex_mean(t, trials);
    out->stderr_ = moex_stderr(t, trials);
    out->p50 = moex_quantile(t, trials, 0.50);
    out->p99 = moex_quantile(t, trials, 0.99);
    out->dispatches = trials * (uint64_t)m->k * (uint64_t)m->h;
    free(t);
    return 0;
}
