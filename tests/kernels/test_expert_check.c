/* moex_expert_check_token and moex_expert_result_max (kernels/expert_check.c),
 * the hub's definition of an honest expert result, against real and
 * emulated backends on fresh random experts of every weight type:
 *
 *  - honest: every SIMD table of this CPU (portable, AVX2, AVX-512 VNNI), each
 *    running the chain a CPU worker runs (quantize, dot products, silu,
 *    quantize, dot products, gate) from its own table; moex_experts_run
 *    itself; and two float-order backends standing for GPUs (every product
 *    summed in f32, forward and pairwise, silu with exp off by a few ulp),
 *    one of them as sloppy as the bound allows (its sums moved by half their
 *    rounding bound) so that near ties flip often: every element of every
 *    result within the bound, and within the largest-result limit;
 *  - near ties happen: the sloppy backend lands a step away from the exact
 *    chain somewhere, and passes;
 *  - the bound catches wrong results: uniform noise of a fraction of the
 *    row's RMS and a single moved element; the smallest fractions caught in
 *    every trial are printed (docs/PROTOCOL.md quotes them).
 *
 * usage: test_expert_check [seed] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/kernels/test_quant_util.h"

#define HIDDEN 256
#define NFF 256

typedef struct expert {
    moex_expert_weights w;
    float *wg, *wu, *wd;           /* dequantized */
} expert;

static expert make_expert(rng *r, moex_type tg, moex_type tu, moex_type td) {
    expert e;
    float *w = malloc(sizeof(float) * HIDDEN * NFF);
    fill_weights(r, w, NFF, HIDDEN);
    e.w.gate = make_matrix(tg, w, NFF, HIDDEN);
    fill_weights(r, w, NFF, HIDDEN);
    e.w.up = make_matrix(tu, w, NFF, HIDDEN);
    fill_weights(r, w, HIDDEN, NFF);
    e.w.down = make_matrix(td, w, HIDDEN, NFF);
    free(w);
    e.wg = dequantized(&e.w.gate);
    e.wu = dequantized(&e.w.up);
    e.wd = dequantized(&e.w.down);
    return e;
}

static void free_expert(expert *e) {
    free((void *)e->w.gate.data);
    free((void *)e->w.up.data);
    free((void *)e->w.down.data);
    free(e->wg);
    free(e->wu);
    free(e->wd);
}

/* ---- backends ---- */

/* The chain as a CPU worker runs it, on one SIMD table. */
static void chain_on_table(const moex_simd_table *tb, const moex_expert_weights *w, const float *x, float gate,
                           float *y) {
    const int ax = moex_vec_dot_type(w->gate.type), ah = moex_vec_dot_type(w->down.type);
    static uint8_t xq[HIDDEN * 2], hq[NFF * 2];
    static float g[NFF], u[NFF];
    const void *xa = x;
    if (ax != MOEX_TYPE_F32) tb->quantize_act[ax](x, xq, HIDDEN), xa = xq;
    for (int k = 0; k < NFF; k++) {
        tb->vec_dot[w->gate.type](HIDDEN, (const uint8_t *)w->gate.data + k * w->gate.row_bytes, xa, &g[k]);
        tb->vec_dot[w->up.type](HIDDEN, (const uint8_t *)w->up.data + k * w->up.row_bytes, xa, &u[k]);
    }
    moex_swiglu(g, g, u, NFF);
    const void *ha = g;
    if (ah != MOEX_TYPE_F32) tb->quantize_act[ah](g, hq, NFF), ha = hq;
    for (int i = 0; i < HIDDEN; i++) {
        tb->vec_dot[w->down.type](NFF, (const uint8_t *)w->down.data + i * w->down.row_bytes, ha, &y[i]);
        y[i] *= gate;
    }
}

/* An activation row as the products read it: the dequantized values of its quantization. */
static void activation_values(int at, const float *v, int64_t n, float *out) {
    static uint8_t q[NFF * 2 + HIDDEN * 2];
    if (at == MOEX_TYPE_F32) {
        memcpy(out, v, (size_t)n * sizeof *out);
        return;
    }
    moex_simd_portable()->quantize_act[at](v, q, n);
    for (int64_t b = 0; b < n / (at == MOEX_TYPE_Q8_K ? 256 : 32); b++) {
        if (at == MOEX_TYPE_Q8_K) {
            const moex_block_q8_K *k = (const moex_block_q8_K *)q + b;
            for (int j = 0; j < 256; j++) out[b * 256 + j] = k->qs[j] * k->d;
        } else if (at == MOEX_TYPE_Q8_0) {
            const moex_block_q8_0 *k = (const moex_block_q8_0 *)q + b;
            for (int j = 0; j < 32; j++) out[b * 32 + j] = k->qs[j] * moex_f16_to_f32(k->d);
        }
    }
}

static float sum_forward(const float *w, const float *a, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += w[i] * a[i];
    return s;
}

static float sum_pairwise(const float *w, const float *a, int64_t n) {
    if (n <= 4) return sum_forward(w, a, n);
    return sum_pairwise(w, a, n / 2) + sum_pairwise(w + n / 2, a + n / 2, n - n / 2);
}

/* silu with exp off by up to 4 ulp (GPU precision) */
static float silu_gpu(float g, rng *r) {
    const float e = expf(-g) * (1.0f + (float)((rng_uniform(r) * 2 - 1) * 4 * 0x1p-24));
    return g / (1.0f + e);
}

/* A GPU-like backend: dequantized weights times the activations' values in
 * f32, in one of two orders; sloppy: each sum moved by up to half the
 * rounding an honest f32 sum may have (what the bound allows), so near ties
 * flip as often as an honest backend can make them. */
static void chain_float(const expert *e, const float *x, float gate, bool pairwise, bool sloppy, rng *r, float *y) {
    const int ax = moex_vec_dot_type(e->w.gate.type), ah = moex_vec_dot_type(e->w.down.type);
    float xa[HIDDEN], h[NFF], ha[NFF];
    activation_values(ax, x, HIDDEN, xa);
    for (int k = 0; k < NFF; k++) {
        const float *rg = e->wg + k * HIDDEN, *ru = e->wu + k * HIDDEN;
        float g = pairwise ? sum_pairwise(rg, xa, HIDDEN) : sum_forward(rg, xa, HIDDEN);
        float u = pairwise ? sum_pairwise(ru, xa, HIDDEN) : sum_forward(ru, xa, HIDDEN);
        if (sloppy) {
            double sg = 0, su = 0;
            for (int j = 0; j < HIDDEN; j++) sg += fabs(rg[j] * xa[j]), su += fabs(ru[j] * xa[j]);
            const double eps = ldexp(8.0 * sqrt(HIDDEN) + HIDDEN / 32.0 + 16.0, -24); /* expert_check.c's dot_eps */
            g += (float)((rng_uniform(r) * 2 - 1) * 0.5 * eps * sg);
            u += (float)((rng_uniform(r) * 2 - 1) * 0.5 * eps * su);
        }
        h[k] = silu_gpu(g, r) * u;
    }
    activation_values(ah, h, NFF, ha);
    for (int i = 0; i < HIDDEN; i++) {
        const float *rd = e->wd + i * NFF;
        y[i] = (pairwise ? sum_pairwise(rd, ha, NFF) : sum_forward(rd, ha, NFF)) * gate;
    }
}

/* ---- checks ---- */

typedef struct tally {
    long results, elements;
    double worst;                   /* largest |y - ref| / tol */
    long beyond_half;               /* elements using over half the bound: near ties that flipped */
} tally;

/* The largest share of its bound an element of y uses in variant v (> 1: outside). */
static double worst_share(const float *y, const double *ref, const double *tol) {
    double w = 0;
    for (int i = 0; i < HIDDEN; i++) {
        const double off = fabs((double)y[i] - ref[i]), share = tol[i] > 0 ? off / tol[i] : (off > 0 ? INFINITY : 0);
        if (!(share <= w)) w = isnan(share) ? INFINITY : share;
    }
    return w;
}

/* The variant y is closest to, and its share. */
static double best_share(const float *y, const double *ref, const double *tol, int n_var, int *which) {
    double best = INFINITY;
    for (int v = 0; v < n_var; v++) {
        const double w = worst_share(y, ref + v * HIDDEN, tol + v * HIDDEN);
        if (w < best) best = w, *which = v;
    }
    return best;
}

static void check_result(const char *who, const float *y, const double *ref, const double *tol, int n_var, double limit,
                         tally *t) {
    t->results++;
    int v = 0;
    const double share = best_share(y, ref, tol, n_var, &v);
    if (share > t->worst) t->worst = share;
    double m = 0;
    for (int i = 0; i < HIDDEN; i++) {
        const double s = tol[v * HIDDEN + i] > 0 ? fabs((double)y[i] - ref[v * HIDDEN + i]) / tol[v * HIDDEN + i] : 0;
        t->elements++;
        t->beyond_half += s > 0.5;
        m = fmax(m, fabs(y[i]));
    }
    CHECK(share <= 1, "%s: outside the bound (%.3f of it)", who, share);
    CHECK(m <= limit, "%s: largest |value| %.6g above the result limit %.6g", who, m, limit);
}

static bool caught(const float *y, const double *ref, const double *tol, int n_var) {
    int v;
    return !(best_share(y, ref, tol, n_var, &v) <= 1);
}

typedef struct weights_case {
    moex_type g, u, d;
} weights_case;

int main(int argc, char **argv) {
    rng r = {seed_from_args(argc, argv)};
    const weights_case cases[] = {
        {MOEX_TYPE_Q8_0, MOEX_TYPE_Q8_0, MOEX_TYPE_Q8_0}, {MOEX_TYPE_Q4_K, MOEX_TYPE_Q4_K, MOEX_TYPE_Q6_K},
        {MOEX_TYPE_Q5_K, MOEX_TYPE_Q5_K, MOEX_TYPE_Q4_K}, {MOEX_TYPE_Q4_0, MOEX_TYPE_Q4_0, MOEX_TYPE_Q5_0},
        {MOEX_TYPE_Q4_1, MOEX_TYPE_Q4_1, MOEX_TYPE_Q5_1}, {MOEX_TYPE_F16, MOEX_TYPE_F16, MOEX_TYPE_BF16},
        {MOEX_TYPE_F32, MOEX_TYPE_F32, MOEX_TYPE_Q8_0},   {MOEX_TYPE_MXFP4, MOEX_TYPE_MXFP4, MOEX_TYPE_MXFP4},
    };
    const moex_simd_table *tables[3] = {moex_simd_portable(), moex_simd_avx2(), moex_simd_vnni()};
    const int tokens = 60;
    moex_expert_check *chk = moex_expert_check_create();
    moex_pool *pool = moex_pool_create(2);
    double ref[MOEX_EXPERT_CHECK_VARIANTS * HIDDEN], tol[MOEX_EXPERT_CHECK_VARIANTS * HIDDEN];
    long variants_seen = 0;
    float x[HIDDEN], y[HIDDEN], bad[HIDDEN];
    tally honest = {0}, sloppy = {0};
    /* the smallest noise fractions (of the row's RMS) caught in every trial, per kind */
    const double amps[] = {1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4};
    enum { N_AMPS = sizeof amps / sizeof amps[0] };
    long missed_all[N_AMPS] = {0}, missed_one[N_AMPS] = {0}, trials = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        expert e = make_expert(&r, cases[c].g, cases[c].u, cases[c].d);
        moex_expert_norms norms;
        moex_error err = {{0}};
        CHECK(moex_expert_norms_of(&e.w, &norms, &err) == 0, "norms: %s", err.msg);
        for (int t = 0; t < tokens; t++) {
            const float scale = (float)(0.3 + 3 * rng_uniform(&r)), gate = (float)(0.05 + rng_uniform(&r));
            fill_gauss(&r, x, HIDDEN, scale);
            if (t % 4 == 0) x[t % HIDDEN] *= 20; /* an outlier, as real hidden states have */
            const int n_var = moex_expert_check_token(chk, &e.w, x, gate, ref, tol, &err);
            if (n_var < 1) {
                CHECK(0, "check_token: %s", err.msg);
                break;
            }
            variants_seen += n_var > 1;
            float xmax = 0;
            for (int i = 0; i < HIDDEN; i++) xmax = fmaxf(xmax, fabsf(x[i]));
            const double limit = moex_expert_result_max(&norms, xmax, gate);
            char who[96];
            for (int k = 0; k < 3; k++) {
                if (!tables[k]) continue;
                chain_on_table(tables[k], &e.w, x, gate, y);
                snprintf(who, sizeof who, "case %zu token %d, %s table", c, t, tables[k]->name);
                check_result(who, y, ref, tol, n_var, limit, &honest);
            }
            const int32_t row0 = 0;
            moex_expert_job job = {.w = &e.w, .n_tokens = 1, .rows = &row0, .gates = &gate, .out = y};
            CHECK(moex_experts_run(pool, &job, 1, x, HIDDEN, &err) == 0, "experts_run: %s", err.msg);
            snprintf(who, sizeof who, "case %zu token %d, moex_experts_run", c, t);
            check_result(who, y, ref, tol, n_var, limit, &honest);
            if (moex_vec_dot_type(cases[c].u) != MOEX_TYPE_Q8_1) { /* the float backends do not model Q8_1's sum */
                for (int k = 0; k < 4; k++) {
                    chain_float(&e, x, gate, k & 1, k >= 2, &r, y);
                    snprintf(who, sizeof who, "case %zu token %d, f32 %s%s", c, t, k & 1 ? "pairwise" : "forward",
                             k >= 2 ? ", sloppy" : "");
                    check_result(who, y, ref, tol, n_var, limit, k >= 2 ? &sloppy : &honest);
                }
            }
            /* wrong results: noise on every value, or one value moved, by a fraction of the row's RMS (not
             * for Q4_1 / Q5_1, whose bound is wider: their f16 block sums, docs/PROTOCOL.md) */
            if (moex_vec_dot_type(cases[c].u) == MOEX_TYPE_Q8_1 || moex_vec_dot_type(cases[c].d) == MOEX_TYPE_Q8_1)
                continue;
            chain_on_table(tables[0], &e.w, x, gate, y);
            double ss = 0;
            for (int i = 0; i < HIDDEN; i++) ss += (double)y[i] * y[i];
            const double rms = sqrt(ss / HIDDEN);
            trials++;
            for (int a = 0; a < N_AMPS; a++) {
                for (int i = 0; i < HIDDEN; i++) bad[i] = y[i] + (float)((rng_uniform(&r) * 2 - 1) * amps[a] * rms);
                missed_all[a] += !caught(bad, ref, tol, n_var);
                memcpy(bad, y, sizeof bad);
                const int i = (int)(rng_next(&r) % HIDDEN);
                bad[i] += (float)((rng_uniform(&r) < 0.5 ? -1 : 1) * amps[a] * rms);
                missed_one[a] += !caught(bad, ref, tol, n_var);
            }
        }
        free_expert(&e);
    }
    printf("honest backends: %ld results, worst share of the bound %.3f, %ld elements over half of it; %ld tokens "
           "with near ties in x (branches)\n", honest.results, honest.worst, honest.beyond_half, variants_seen);
    printf("sloppy backends: %ld results, worst share %.3f, %ld elements over half of it (near ties flipped)\n",
           sloppy.results, sloppy.worst, sloppy.beyond_half);
    CHECK(sloppy.beyond_half > 0, "the sloppy backend never landed a step away: the test does not exercise near ties");
    double smallest_all = -1, smallest_one = -1; /* amps fall: the last of the unbroken run of no misses */
    bool all_run = true, one_run = true;
    for (int a = 0; a < N_AMPS; a++) {
        printf("noise %.0e x RMS: missed %ld of %ld on every value, %ld of %ld on one value\n", amps[a], missed_all[a],
               trials, missed_one[a], trials);
        if ((all_run &= missed_all[a] == 0)) smallest_all = amps[a];
        if ((one_run &= missed_one[a] == 0)) smallest_one = amps[a];
    }
    printf("smallest corruption caught in every trial: noise of %.0e x RMS on every value, %.0e x RMS on one value\n",
           smallest_all, smallest_one);
    CHECK(missed_all[0] == 0 && missed_one[0] == 0, "noise of 0.1 x RMS not always caught");
    CHECK(smallest_all > 0 && smallest_all <= 3e-2, "noise on every value of 3e-2 x RMS not always caught");
    moex_expert_check_free(chk);
    moex_pool_destroy(pool);
    if (g_failures) {
        printf("%d failure(s)\n", g_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
