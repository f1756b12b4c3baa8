/* moex_matmul, moex_matmul_multi and moex_experts_run against float64
 * references computed from the dequantized weights and exact activations;
 * 1 and 2 threads (and no pool) must give bit-identical results.
 * Runs on the SIMD path of this CPU, or the portable one with
 * MOEX_TEST_SIMD=portable (--simd). Usage: test_matmul [seed] */
#include <string.h>

#include "test_quant_util.h"

/* rc is -1, err->msg contains `cause`, and out[0..n) still holds `sentinel`. */
static void expect_error(int rc, const moex_error *err, const float *out, int64_t n, float sentinel, const char *cause,
                         const char *label) {
    CHECK(rc == -1, "%s: accepted", label);
    CHECK(rc != -1 || strstr(err->msg, cause), "%s: error '%s' does not say '%s'", label, err->msg, cause);
    int64_t changed = 0;
    for (int64_t i = 0; i < n; i++) changed += out[i] != sentinel;
    CHECK(changed == 0, "%s: %lld output values changed by a refused call", label, (long long)changed);
}

#define COLS 512
#define MAX_TOK 64

/* y_ref[t][r] = sum_c Wd[r][c] * x[t][c] in double. */
static void reference_matmul(const float *wd, int64_t rows, int64_t cols, const float *x, int64_t n, double *y) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            double s = 0;
            for (int64_t c = 0; c < cols; c++) s += (double)wd[r * cols + c] * x[t * cols + c];
            y[t * rows + r] = s;
        }
}

static void test_matmul_types(rng *r, moex_pool *p1, moex_pool *p2) {
    const int64_t rows = 67; /* not a multiple of any tile or chunk */
    static const int64_t ns[] = {1, 3, 17, 64};
    float *w = malloc(sizeof(float) * rows * COLS), *x = malloc(sizeof(float) * MAX_TOK * COLS);
    float *y1 = malloc(sizeof(float) * rows * MAX_TOK), *y2 = malloc(sizeof(float) * rows * MAX_TOK);
    float *y0 = malloc(sizeof(float) * rows * MAX_TOK);
    double *ref = malloc(sizeof(double) * rows * MAX_TOK);
    fill_weights(r, w, rows, COLS);
    fill_gauss(r, x, MAX_TOK * COLS, 1.0f);
    for (int k = 0; k < N_WEIGHT_TYPES; k++) {
        const moex_type t = k_weight_types[k];
        moex_matrix m = make_matrix(t, w, rows, COLS);
        float *wd = dequantized(&m);
        double worst = 0;
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            const int64_t n = ns[i];
            memset(y1, 0xff, sizeof(float) * rows * n); /* NaN: unwritten outputs show */
            memset(y2, 0, sizeof(float) * rows * n);
            const int rc = moex_matmul(p1, &m, x, n, y1, NULL) | moex_matmul(p2, &m, x, n, y2, NULL) | moex_matmul(NULL, &m, x, n, y0, NULL);
            CHECK(rc == 0, "%s matmul n=%lld failed", moex_type_get(t)->name, (long long)n);
            CHECK(memcmp(y1, y2, sizeof(float) * rows * n) == 0, "%s n=%lld: 1 and 2 threads differ",
                  moex_type_get(t)->name, (long long)n);
            CHECK(memcmp(y1, y0, sizeof(float) * rows * n) == 0, "%s n=%lld: no-pool result differs",
                  moex_type_get(t)->name, (long long)n);
            reference_matmul(wd, rows, COLS, x, n, ref);
            const double err = rel_l2(y2, ref, rows * n);
            if (err > worst || err != err) worst = err;
            CHECK(err <= dot_error_bound(t), "%s matmul n=%lld: rel L2 %.4g > %.4g", moex_type_get(t)->name,
                  (long long)n, err, dot_error_bound(t));
        }
        printf("  matmul %-5s worst rel L2 over n=1,3,17,64: %.3g (bound %.3g)\n", moex_type_get(t)->name, worst,
               dot_error_bound(t));
        free(wd);
        free((void *)m.data);
    }
    free(w);
    free(x);
    free(y0);
    free(y1);
    free(y2);
    free(ref);
}

/* matmul_multi over matrices of different types = separate matmuls, bit for bit. */
static void test_matmul_multi(rng *r, moex_pool *pool) {
    const moex_type types[3] = {MOEX_TYPE_Q4_K, MOEX_TYPE_Q8_0, MOEX_TYPE_F16};
    const int64_t rows[3] = {67, 40, 33}, n = 5;
    moex_matrix ms[3];
    float *x = malloc(sizeof(float) * n * COLS), *ys[3], *single = malloc(sizeof(float) * 67 * n);
    fill_gauss(r, x, n * COLS, 1.0f);
    for (int i = 0; i < 3; i++) {
        float *w = malloc(sizeof(float) * rows[i] * COLS);
        fill_weights(r, w, rows[i], COLS);
        ms[i] = make_matrix(types[i], w, rows[i], COLS);
        ys[i] = malloc(sizeof(float) * rows[i] * n);
        free(w);
    }
    CHECK(moex_matmul_multi(pool, ms, 3, x, n, ys, NULL) == 0, "matmul_multi failed");
    for (int i = 0; i < 3; i++) {
        moex_matmul(pool, &ms[i], x, n, single, NULL);
        CHECK(memcmp(single, ys[i], sizeof(float) * rows[i] * n) == 0, "matmul_multi matrix %d differs from matmul", i);
        free(ys[i]);
        free((void *)ms[i].data);
    }
    free(x);
    free(single);
}

/* ---- experts ---- */

typedef struct expert_case {
    moex_type gate, up, down;
    int n_tokens;
    int32_t rows[9];
} expert_case;

static double silu(double v) { return v / (1 + exp(-v)); }

/* out[i] = gates[i] * down(silu(gate x) * up x) in double on dequantized weights. */
static void reference_expert(const float *gd, const float *ud, const float *dd, int64_t hidden, int64_t n_ff,
                             const float *x, const moex_expert_job *job, double *out) {
    double *h = malloc(sizeof(double) * n_ff);
    for (int64_t i = 0; i < job->n_tokens; i++) {
        const float *xt = x + job->rows[i] * hidden;
        for (int64_t f = 0; f < n_ff; f++) {
            double g = 0, u = 0;
            for (int64_t c = 0; c < hidden; c++) {
                g += (double)gd[f * hidden + c] * xt[c];
                u += (double)ud[f * hidden + c] * xt[c];
            }
            h[f] = silu(g) * u;
        }
        for (int64_t o = 0; o < hidden; o++) {
            double s = 0;
            for (int64_t f = 0; f < n_ff; f++) s += (double)dd[o * n_ff + f] * h[f];
            out[i * hidden + o] = job->gates[i] * s;
        }
    }
    free(h);
}

static int is_float_type(moex_type t) { return moex_vec_dot_type(t) == MOEX_TYPE_F32; }

static void test_experts(rng *r, moex_pool *p1, moex_pool *p2) {
    const int64_t hidden = 512, n_ff = 768, n_x = 9;
    static const expert_case cases[] = {
        {MOEX_TYPE_Q4_K, MOEX_TYPE_Q4_K, MOEX_TYPE_Q6_K, 4, {0, 2, 3, 7}},
        {MOEX_TYPE_Q8_0, MOEX_TYPE_Q8_0, MOEX_TYPE_Q4_0, 2, {1, 2}},
        {MOEX_TYPE_F16, MOEX_TYPE_F16, MOEX_TYPE_F32, 1, {5}},
        {MOEX_TYPE_Q5_K, MOEX_TYPE_Q4_1, MOEX_TYPE_Q5_1, 9, {0, 1, 2, 3, 4, 5, 6, 7, 8}},
        {MOEX_TYPE_BF16, MOEX_TYPE_Q5_0, MOEX_TYPE_Q8_0, 3, {8, 0, 4}},
        {MOEX_TYPE_Q6_K, MOEX_TYPE_Q6_K, MOEX_TYPE_Q4_K, 0, {0}},
        {MOEX_TYPE_MXFP4, MOEX_TYPE_MXFP4, MOEX_TYPE_MXFP4, 5, {6, 1, 3, 8, 2}}, /* gpt-oss's experts */
    };
    enum { N_CASES = sizeof cases / sizeof cases[0] };
    float *x = malloc(sizeof(float) * n_x * hidden);
    fill_gauss(r, x, n_x * hidden, 1.0f);
    float *w = malloc(sizeof(float) * n_ff * hidden);
    moex_expert_weights ew[N_CASES];
    moex_expert_job jobs[N_CASES], jobs2[N_CASES];
    float *deq[N_CASES][3], gates[N_CASES][9];
    for (int c = 0; c < N_CASES; c++) {
        fill_weights(r, w, n_ff, hidden);
        ew[c].gate = make_matrix(cases[c].gate, w, n_ff, hidden);
        fill_weights(r, w, n_ff, hidden);
        ew[c].up = make_matrix(cases[c].up, w, n_ff, hidden);
        fill_weights(r, w, hidden, n_ff);
        ew[c].down = make_matrix(cases[c].down, w, hidden, n_ff);
        deq[c][0] = dequantized(&ew[c].gate);
        deq[c][1] = dequantized(&ew[c].up);
        deq[c][2] = dequantized(&ew[c].down);
        for (int i = 0; i < 9; i++) gates[c][i] = (float)(0.1 + rng_uniform(r));
        jobs[c] = (moex_expert_job){&ew[c], cases[c].n_tokens, cases[c].rows, gates[c],
                                    malloc(sizeof(float) * hidden * (cases[c].n_tokens + 1))};
        jobs2[c] = jobs[c];
        jobs2[c].out = malloc(sizeof(float) * hidden * (cases[c].n_tokens + 1));
    }
    moex_error e = {{0}};
    CHECK(moex_experts_run(p1, jobs, N_CASES, x, hidden, &e) == 0, "experts_run (1 thread): %s", e.msg);
    CHECK(moex_experts_run(p2, jobs2, N_CASES, x, hidden, &e) == 0, "experts_run (2 threads): %s", e.msg);
    double *ref = malloc(sizeof(double) * hidden * 9);
    for (int c = 0; c < N_CASES; c++) {
        const int64_t n = cases[c].n_tokens;
        CHECK(memcmp(jobs[c].out, jobs2[c].out, sizeof(float) * hidden * n) == 0,
              "expert case %d: 1 and 2 threads differ", c);
        if (n == 0) continue;
        reference_expert(deq[c][0], deq[c][1], deq[c][2], hidden, n_ff, x, &jobs[c], ref);
        const double err = rel_l2(jobs2[c].out, ref, hidden * n);
        /* float weights: no activation rounding. Else x and h are both rounded
         * to 8 bits; h = silu(g) * u is heavy-tailed, so its 256-blocks (Q8_K)
         * round coarser: worst over 12 seeds 1.4 % for 32-block chains, 2.5 %
         * with Q8_K */
        const int exact = is_float_type(cases[c].gate) && is_float_type(cases[c].up) && is_float_type(cases[c].down);
        const double bound = exact ? 1e-5 : 3.5e-2;
        printf("  experts %s/%s/%s x%lld tokens: rel L2 %.3g (bound %.3g)\n", moex_type_get(cases[c].gate)->name,
               moex_type_get(cases[c].up)->name, moex_type_get(cases[c].down)->name, (long long)n, err, bound);
        CHECK(err <= bound, "expert case %d: rel L2 %.4g > %.4g", c, err, bound);
    }

    /* decode shape: top-8 experts on one token, all jobs share x row 0 */
    moex_expert_job dec[8], dec2[8];
    const int32_t row0 = 0;
    for (int j = 0; j < 8; j++) {
        dec[j] = (moex_expert_job){&ew[j % 2 ? 0 : 3], 1, &row0, &gates[0][j], malloc(sizeof(float) * hidden)};
        dec2[j] = dec[j];
        dec2[j].out = malloc(sizeof(float) * hidden);
    }
    CHECK(moex_experts_run(p2, dec, 8, x, hidden, NULL) == 0, "decode experts_run failed");
    CHECK(moex_experts_run(NULL, dec2, 8, x, hidden, NULL) == 0, "decode experts_run without pool failed");
    for (int j = 0; j < 8; j++) {
        CHECK(memcmp(dec[j].out, dec2[j].out, sizeof(float) * hidden) == 0, "decode job %d: pool/no pool differ", j);
        const int c = j % 2 ? 0 : 3;
        reference_expert(deq[c][0], deq[c][1], deq[c][2], hidden, n_ff, x, &dec[j], ref);
        const double err = rel_l2(dec[j].out, ref, hidden);
        CHECK(err <= 3.5e-2, "decode job %d: rel L2 %.4g", j, err);
        free(dec[j].out);
        free(dec2[j].out);
    }

    /* bad input: shapes that disagree, negative token rows, a non-weight type;
     * the error names the job and the cause, the output stays untouched */
    moex_expert_weights bad = ew[0];
    bad.down.rows = hidden - 256;
    moex_expert_job bj[2] = {jobs[1], jobs[0]};
    bj[1].w = &bad;
    const float sentinel = 12345.0f;
    for (int64_t i = 0; i < hidden; i++) bj[0].out[i] = sentinel;
    expect_error(moex_experts_run(p2, bj, 2, x, hidden, &e), &e, bj[0].out, hidden, sentinel, "expert job 1: shapes disagree",
                 "mismatched down shape");
    const int32_t neg = -1;
    bj[1] = jobs[0];
    bj[1].n_tokens = 1;
    bj[1].rows = &neg;
    expect_error(moex_experts_run(p2, bj, 2, x, hidden, &e), &e, bj[0].out, hidden, sentinel, "negative input row -1",
                 "negative token row");
    bad = ew[0];
    bad.up.type = MOEX_TYPE_Q8_K;
    bj[1] = jobs[0];
    bj[1].w = &bad;
    expect_error(moex_experts_run(p2, bj, 2, x, hidden, &e), &e, bj[0].out, hidden, sentinel,
                 "expert job 1's up has type q8_K, which the CPU kernels do not multiply", "activation type as expert weights");

    for (int c = 0; c < N_CASES; c++) {
        for (int k = 0; k < 3; k++) free(deq[c][k]);
        free((void *)ew[c].gate.data);
        free((void *)ew[c].up.data);
        free((void *)ew[c].down.data);
        free(jobs[c].out);
        free(jobs2[c].out);
    }
    free(ref);
    free(w);
    free(x);
}

/* Bad matrices are refused with an error that names the cause, and y is left as it was. */
static void test_bad_matrices(moex_pool *pool) {
    float x[256] = {0}, y[4], y2[4];
    uint8_t data[4 * 144] = {0};
    moex_error e;
    moex_matrix m = {MOEX_TYPE_Q4_K, 4, 256, 144, data};
    CHECK(moex_matmul(pool, &m, x, 1, y, &e) == 0, "valid q4_K matrix rejected: %s", e.msg);
    const float sentinel = -7.0f;
    for (int i = 0; i < 4; i++) y[i] = y2[i] = sentinel;
    m.row_bytes = 140;
    expect_error(moex_matmul(pool, &m, x, 1, y, &e), &e, y, 4, sentinel, "rows of 140 bytes where 256 q4_K columns take 144",
                 "wrong row_bytes");
    m = (moex_matrix){MOEX_TYPE_Q8_K, 4, 256, 292, data};
    expect_error(moex_matmul(pool, &m, x, 1, y, &e), &e, y, 4, sentinel, "has type q8_K, which the CPU kernels do not multiply", "q8_K weights");
    m = (moex_matrix){(moex_type)4, 4, 256, 144, data};
    expect_error(moex_matmul(pool, &m, x, 1, y, &e), &e, y, 4, sentinel, "the unknown type 4", "unknown type");
    m = (moex_matrix){MOEX_TYPE_Q4_K, 4, 256, 144, NULL};
    expect_error(moex_matmul(pool, &m, x, 1, y, &e), &e, y, 4, sentinel, "has no data", "NULL data");
    /* one pass, one input: matrices with different column counts are refused before any is computed */
    static float w0[4 * 256], w1[4 * 128];
    const moex_matrix ms[2] = {{MOEX_TYPE_F32, 4, 256, 1024, w0}, {MOEX_TYPE_F32, 4, 128, 512, w1}};
    float *ys[2] = {y, y2};
    expect_error(moex_matmul_multi(pool, ms, 2, x, 1, ys, &e), &e, y, 4, sentinel,
                 "matrix 1 has 128 columns and matrix 0 256", "matmul_multi column mismatch");
    CHECK(!memcmp(y, y2, sizeof y), "matmul_multi wrote its second output before failing");
}

int main(int argc, char **argv) {
    rng r = {seed_from_args(argc, argv)};
    use_test_simd();
    printf("simd path in use: %s\n", moex_kernels_simd_name());
    moex_pool *p1 = moex_pool_create(1), *p2 = moex_pool_create(2);
    CHECK(p1 && p2, "pool creation failed");
    if (!p1 || !p2) return 1;
    test_matmul_types(&r, p1, p2);
    test_matmul_multi(&r, p2);
    test_experts(&r, p1, p2);
    test_bad_matrices(p2);
    moex_pool_destroy(p1);
    moex_pool_destroy(p2);
    if (g_failures) {
        printf("%d failure(s)\n", g_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
