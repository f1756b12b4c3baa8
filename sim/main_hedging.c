/* moex-sim hedging: E[max over k experts of min over h replicas] for
 * log-normal worker latency, by quadrature of eq. 18 and by Monte Carlo. */
#include "sim/main.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *HELP =
    "usage: moex-sim hedging [flags]\n"
    "  --k K            active experts per layer (8)\n"
    "  --h 1,2,3,4      hedging factors (replicas each expert is sent to)\n"
    "  --median-ms M    worker latency median, ms (20)\n"
    "  --sigma S        log-normal sigma, 0..5 (0.5)\n"
    "  --trials N       Monte Carlo trials per h (200000)\n"
    "  --seed X         random seed (1)\n"
    "  --format F       table (default) or csv\n"
    "  --svg FILE       draw latency against h\n"
    "columns: analytic_ms = eq. 18 by adaptive Gauss-Kronrod; mc_ms +- mc_ci3_ms = Monte\n"
    "Carlo mean +- 3 standard errors; p50/p99 analytic (root of F_max(t) = p) and\n"
    "Monte Carlo; bw_factor = dispatches per expert = h; work_factor = replica busy\n"
    "time per expert relative to h=1 (losers run until the winner answers);\n"
    "reduction_pct = analytic latency saved relative to h=1.\n";

typedef struct hedging_opts {
    moex_hedge_model m;
    long h[MOEX_SIM_MAX_LIST];
    int n_h;
    long trials;
    uint64_t seed;
    int format;
    const char *svg;
} hedging_opts;

typedef struct hedging_row {
    int h;
    double analytic, mc, ci3, p50, p99, mc_p50, mc_p99, bw, work, reduction;
} hedging_row;

static int parse(int argc, char **argv, hedging_opts *o, int *help, moex_error *err) {
    *o = (hedging_opts){.m = {.k = 8, .h = 1, .median = 20, .sigma = 0.5},
                        .h = {1, 2, 3, 4}, .n_h = 4, .trials = 200000, .seed = 1};
    args a = {argc, 0, argv};
    const char *f;
    long v;
    while (!args_next_flag(&a, &f, err) && f) {
        if (!strcmp(f, "help")) *help = 1;
        else if (!strcmp(f, "k")) {
            if (args_int(&a, f, 1, 100000, &v, err)) return -1;
            o->m.k = (int)v;
        } else if (!strcmp(f, "h")) {
            if (args_int_list(&a, f, 1, 1000, o->h, &o->n_h, err)) return -1;
        } else if (!strcmp(f, "median-ms")) {
            if (args_double(&a, f, 1e-9, 1e9, &o->m.median, err)) return -1;
        } else if (!strcmp(f, "sigma")) {
            if (args_double(&a, f, 0, 5, &o->m.sigma, err)) return -1;
        } else if (!strcmp(f, "trials")) {
            if (args_int(&a, f, 2, 100000000, &o->trials, err)) return -1;
        } else if (!strcmp(f, "seed")) {
            if (args_int(&a, f, 0, LONG_MAX, &v, err)) return -1;
            o->seed = (uint64_t)v;
        } else if (!strcmp(f, "format")) {
            if (args_format(&a, &o->format, err)) return -1;
        } else if (!strcmp(f, "svg")) {
            if (args_value(&a, f, &o->svg, err)) return -1;
        } else return moex_fail(err, "unknown flag --%s", f);
    }
    return err->msg[0] ? -1 : 0;
}

static int compute_row(const hedging_opts *o, int h, double base, moex_rng *rng, hedging_row *r, moex_error *err) {
    moex_hedge_model m = o->m;
    m.h = h;
    moex_hedge_mc mc;
    r->h = h;
    r->bw = h;
    if (moex_hedge_expect(&m, &r->analytic, err) || moex_hedge_quantile(&m, 0.5, &r->p50, err) ||
        moex_hedge_quantile(&m, 0.99, &r->p99, err) || moex_hedge_work_factor(&m, &r->work, err) ||
        moex_hedge_monte_carlo(&m, (uint64_t)o->trials, rng, &mc, err))
        return -1;
    r->mc = mc.mean;
    r->ci3 = 3 * mc.stderr_;
    r->mc_p50 = mc.p50;
    r->mc_p99 = mc.p99;
    r->reduction = 100.0 * (1.0 - r->analytic / base);
    return 0;
}

static void print_rows(const hedging_opts *o, const hedging_row *r, int n) {
    if (o->format == FORMAT_CSV) {
        puts("h,analytic_ms,mc_ms,mc_ci3_ms,p50_ms,p99_ms,mc_p50_ms,mc_p99_ms,bw_factor,work_factor,reduction_pct");
        for (int i = 0; i < n; i++)
            printf("%d,%.9g,%.9g,%.6g,%.9g,%.9g,%.9g,%.9g,%g,%.6g,%.4f\n", r[i].h, r[i].analytic, r[i].mc, r[i].ci3,
                   r[i].p50, r[i].p99, r[i].mc_p50, r[i].mc_p99, r[i].bw, r[i].work, r[i].reduction);
        return;
    }
    printf("k=%d  median=%g ms  sigma=%g  trials=%ld  seed=%llu\n", o->m.k, o->m.median, o->m.sigma, o->trials,
           (unsigned long long)o->seed);
    printf("%4s %12s %20s %10s %10s %10s %10s %6s %8s %10s\n", "h", "analytic_ms", "mc_ms (+-3se)", "p50_ms",
           "p99_ms", "mc_p50", "mc_p99", "bw", "work", "reduction");
    for (int i = 0; i < n; i++)
        printf("%4d %12.4f %11.4f +-%6.4f %10.4f %10.4f %10.4f %10.4f %5gx %7.3fx %9.1f%%\n", r[i].h, r[i].analytic,
               r[i].mc, r[i].ci3, r[i].p50, r[i].p99, r[i].mc_p50, r[i].mc_p99, r[i].bw, r[i].work, r[i].reduction);
}

static int draw_svg(const hedging_opts *o, const hedging_row *r, int n, moex_error *err) {
    double x[MOEX_SIM_MAX_LIST], mean[MOEX_SIM_MAX_LIST], mc[MOEX_SIM_MAX_LIST], p50[MOEX_SIM_MAX_LIST],
        p99[MOEX_SIM_MAX_LIST];
    for (int i = 0; i < n; i++) x[i] = r[i].h, mean[i] = r[i].analytic, mc[i] = r[i].mc, p50[i] = r[i].p50, p99[i] = r[i].p99;
    moex_svg_series s[] = {{"E[T] (eq. 18)", x, mean, n, 0}, {"E[T] Monte Carlo", x, mc, n, 1},
                           {"p50", x, p50, n, 0}, {"p99", x, p99, n, 0}};
    char title[160];
    snprintf(title, sizeof title, "Expert-phase latency, k=%d, log-normal median %g ms, sigma %g", o->m.k, o->m.median,
             o->m.sigma);
    moex_svg_chart c = {title, "hedging factor h", "latency (ms)", 0, 0, s, 4};
    return moex_svg_save(o->svg, &c, err);
}

int sim_cmd_hedging(int argc, char **argv) {
    hedging_opts o;
    moex_error err = {{0}};
    int help = 0;
    if (parse(argc, argv, &o, &help, &err)) return sim_usage_error("hedging", &err);
    if (help) {
        fputs(HELP, stdout);
        return 0;
    }
    if (moex_hedge_check(&o.m, &err)) return sim_usage_error("hedging", &err);
    moex_rng rng;
    moex_rng_seed(&rng, o.seed);
    moex_hedge_model one = o.m;
    double base;
    if (moex_hedge_expect(&one, &base, &err)) return sim_usage_error("hedging", &err);
    hedging_row rows[MOEX_SIM_MAX_LIST];
    for (int i = 0; i < o.n_h; i++)
        if (compute_row(&o, (int)o.h[i], base, &rng, &rows[i], &err)) {
            fprintf(stderr, "moex-sim hedging: %s\n", err.msg);
            return 1;
        }
    print_rows(&o, rows, o.n_h);
    if (o.svg && draw_svg(&o, rows, o.n_h, &err)) {
        fprintf(stderr, "moex-sim hedging: %s\n", err.msg);
        return 1;
    }
    return 0;
}
