/* Elementwise kernels and attention against float64 references written here.
 * Inputs are random per run (seed printed; MOEX_TEST_SEED=<n> replays one).
 * Bounds are relative L2 errors ||got - ref|| / ||ref||; f32 kernels land
 * around 1e-7, so 1e-5 leaves room for unlucky draws while still catching
 * any real mistake (a wrong pair, sign or index gives errors ~1). */
#include "kernels/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/test_util.h"

/* ---- random inputs ---- */

static rng g_rng;

/* Uniform in [lo, hi). */
static float rand_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(rng_next(&g_rng) >> 11) * 0x1.0p-53);
}

/* Approximately N(0, 1) (sum of 4 uniforms), enough for test data. */
static float rand_normal(void) {
    float s = 0.0f;
    for (int i = 0; i < 4; i++) s += rand_uniform(-1.0f, 1.0f);
    return s * 0.8660254f;
}

static float *rand_vec(int64_t n, float scale) {
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = scale * rand_normal();
    return v;
}

/* ---- rmsnorm ---- */

static void ref_rmsnorm(double *out, const float *x, const float *w, int64_t n, double eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv * (w ? w[i] : 1.0);
}

static void test_rmsnorm(void) {
    const int64_t sizes[] = {1, 7, 8, 63, 896, 2048, 5120};
    double worst = 0.0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int64_t n = sizes[si];
        float *x = rand_vec(n, rand_uniform(0.01f, 50.0f));
        float *w = rand_vec(n, 1.0f);
        float *out = malloc((size_t)n * sizeof *out);
        double *ref = malloc((size_t)n * sizeof *ref);
        for (int with_w = 0; with_w < 2; with_w++) {
            const float *wp = with_w ? w : NULL;
            ref_rmsnorm(ref, x, wp, n, 1e-6);
            moex_rmsnorm(out, x, wp, n, 1e-6f);
            const double e = rel_l2(out, ref, n);
            worst = e > worst ? e : worst;
            CHECK(e < 1e-5, "rmsnorm n=%lld w=%d rel err %.3g", (long long)n, with_w, e);
        }
        /* in place: out aliases x */
        moex_rmsnorm(x, x, w, n, 1e-6f);
        const double e = rel_l2(x, ref, n);
        CHECK(e < 1e-5, "rmsnorm in place n=%lld rel err %.3g", (long long)n, e);
        free(x), free(w), free(out), free(ref);
    }
    printf("rmsnorm: worst rel L2 %.2e (bound 1e-5)\n", worst);
}

/* ---- softmax ---- */

static void test_softmax(void) {
    const int64_t sizes[] = {1, 5, 8, 100, 1000, 32000};
    double worst = 0.0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int64_t n = sizes[si];
        float *x = rand_vec(n, rand_uniform(0.1f, 10.0f));
        const float offset = 300.0f;   /* shift invariance; expf(300) overflows without max subtraction */
        for (int64_t i = 0; i < n; i++) x[i] += offset;
        double *ref = malloc((size_t)n * sizeof *ref);
        double m = -INFINITY, z = 0.0;
        for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
        for (int64_t i = 0; i < n; i++) z += exp((double)x[i] - m);
        for (int64_t i = 0; i < n; i++) ref[i] = exp((double)x[i] - m) / z;
        moex_softmax(x, n);
        const double e = rel_l2(x, ref, n);
        worst = e > worst ? e : worst;
        CHECK(e < 1e-5, "softmax n=%lld rel err %.3g", (long long)n, e);
        free(x), free(ref);
    }
    float masked[3] = {-INFINITY, -INFINITY, -INFINITY};
    moex_softmax(masked, 3);
    CHECK(fabsf(masked[0] - 1.0f / 3) < 1e-6f, "softmax of all -inf should be uniform, got %g", masked[0]);
    printf("softmax: worst rel L2 %.2e (bound 1e-5)\n", worst);
}

/* ---- swiglu ---- */

static void test_swiglu(void) {
    const int64_t n = 4099;
    float *g = rand_vec(n, 4.0f), *u = rand_vec(n, 2.0f);
    g[0] = -200.0f, g[1] = 200.0f, g[2] = 0.0f;   /* saturation ends */
    float *out = malloc((size_t)n * sizeof *out);
    double *ref = malloc((size_t)n * sizeof *ref);
    for (int64_t i = 0; i < n; i++) ref[i] = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
    moex_swiglu(out, g, u, n);
    double e = rel_l2(out, ref, n);
    CHECK(e < 1e-5, "swiglu rel err %.3g", e);
    CHECK(isfinite(out[0]) && fabs(out[0]) < 1e-30, "swiglu(-200) should be ~0, got %g", out[0]);
    moex_swiglu(g, g, u, n);   /* out aliases g */
    const double e2 = rel_l2(g, ref, n);
    CHECK(e2 < 1e-5, "swiglu in place rel err %.3g", e2);
    printf("swiglu: rel L2 %.2e (bound 1e-5)\n", e);
    free(g), free(u), free(out), free(ref);
}

/* ---- rope ---- */

/* Angle of pair i. Exact: pos * base^(-2i/rope_dim) in double. ggml: float
 * theta_scale = powf(base, -2/rope_dim), theta multiplied by it once per
 * pair, as llama.cpp computes it (written out here independently). */
static double rope_angle(int64_t pos, int i, int rope_dim, float base, int exact) {
    if (exact) return (double)pos * pow(base, -2.0 * i / rope_dim);
    const float scale = powf(base, -2.0f / (float)rope_dim);
    float theta = (float)pos;
    for (int k = 0; k < i; k++) theta *= scale;
    return theta;
}

static void ref_rope(double *x, int n_heads, int head_dim, int rope_dim, int64_t pos, float base, int neox,
                     int exact) {
    const int half = rope_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        double *hd = x + (int64_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            const double theta = rope_angle(pos, i, rope_dim, base, exact);
            const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
            const double a = hd[i0], b = hd[i1];
            hd[i0] = a * cos(theta) - b * sin(theta);
            hd[i1] = a * sin(theta) + b * cos(theta);
        }
    }
}

/* Vs exact angles the error grows with pos: the float angle of pair i has
 * relative error ~ i * 2^-24 on a value up to pos. Measured worst (both
 * styles, bases 1e4..1e6): ~1e-7 at pos <= 1, ~1e-5 at pos 1000, ~4e-4 at
 * pos 30000; the bound allows ~2x over that. Vs ggml's float angles the
 * rotation itself must be f32-exact at any pos. */
static double rope_bound_exact(int64_t pos) { return 1e-5 + 3e-8 * (double)pos; }
static const double ROPE_BOUND_GGML = 1e-6;

static void test_rope(void) {
    struct { int n_heads, head_dim, rope_dim; float base; } shapes[] = {
        {4, 64, 64, 10000.0f}, {2, 128, 128, 1000000.0f}, {3, 128, 64, 10000.0f}, {2, 80, 32, 500000.0f},
    };
    const int64_t positions[] = {0, 1, 37, 1000, 30000};
    double worst_exact[5] = {0}, worst_ggml = 0.0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int nh = shapes[s].n_heads, hd = shapes[s].head_dim, rd = shapes[s].rope_dim;
        const int64_t n = (int64_t)nh * hd;
        for (int neox = 0; neox < 2; neox++) {
            for (size_t pi = 0; pi < sizeof positions / sizeof *positions; pi++) {
                const int64_t pos = positions[pi];
                float *x = rand_vec(n, 1.0f);
                float *orig = malloc((size_t)n * sizeof *orig);
                double *exact = malloc((size_t)n * sizeof *exact), *ggml = malloc((size_t)n * sizeof *ggml);
                memcpy(orig, x, (size_t)n * sizeof *x);
                for (int64_t i = 0; i < n; i++) exact[i] = ggml[i] = x[i];
                ref_rope(exact, nh, hd, rd, pos, shapes[s].base, neox, 1);
                ref_rope(ggml, nh, hd, rd, pos, shapes[s].base, neox, 0);
                moex_rope(x, nh, hd, rd, pos, shapes[s].base, neox);
                const double e = rel_l2(x, exact, n), eg = rel_l2(x, ggml, n);
                worst_exact[pi] = e > worst_exact[pi] ? e : worst_exact[pi];
                worst_ggml = eg > worst_ggml ? eg : worst_ggml;
                CHECK(e < rope_bound_exact(pos),
                      "rope heads=%d hd=%d rd=%d neox=%d pos=%lld rel err vs exact %.3g (bound %.3g)", nh, hd, rd,
                      neox, (long long)pos, e, rope_bound_exact(pos));
                CHECK(eg < ROPE_BOUND_GGML, "rope heads=%d hd=%d rd=%d neox=%d pos=%lld rel err vs ggml angles %.3g",
                      nh, hd, rd, neox, (long long)pos, eg);
                int untouched = 1;
                for (int h = 0; h < nh; h++)
                    for (int i = rd; i < hd; i++) untouched &= x[h * hd + i] == orig[h * hd + i];
                CHECK(untouched, "rope changed dims beyond rope_dim (rd=%d hd=%d)", rd, hd);
                free(x), free(orig), free(exact), free(ggml);
            }
        }
    }
    for (size_t pi = 0; pi < sizeof positions / sizeof *positions; pi++)
        printf("rope: pos %5lld worst rel L2 vs exact angles %.2e (bound %.1e)\n", (long long)positions[pi],
               worst_exact[pi], rope_bound_exact(positions[pi]));
    printf("rope: worst rel L2 vs ggml float angles %.2e (bound %.0e)\n", worst_ggml, ROPE_BOUND_GGML);
    /* A known rotation: pos 1, pair 0 has theta = 1 rad in both styles. */
    float v[4] = {1.0f, 0.0f, 0.0f, 0.0f};
    moex_rope(v, 1, 4, 4, 1, 10000.0f, false);
    CHECK(fabsf(v[0] - cosf(1.0f)) < 1e-6f && fabsf(v[1] - sinf(1.0f)) < 1e-6f, "normal rope pair (0,1) wrong");
    float w[4] = {1.0f, 0.0f, 0.0f, 0.0f};
    moex_rope(w, 1, 4, 4, 1, 10000.0f, true);
    CHECK(fabsf(w[0] - cosf(1.0f)) < 1e-6f && fabsf(w[2] - sinf(1.0f)) < 1e-6f && w[1] == 0.0f,
          "neox rope pair (0,2) wrong");
}

/* ---- attention ---- */

static void ref_attention(double *out, const float *q, const float *k, const float *v, int64_t n, int64_t pos0,
                          int n_head, int n_head_kv, int hd, double scale) {
    const int group = n_head / n_head_kv;
    double *s = malloc((size_t)(pos0 + n) * sizeof *s);
    for (int64_t t = 0; t < n; t++)
        for (int h = 0; h < n_head; h++) {
            const float *qh = q + (t * n_head + h) * hd;
            const int kvh = h / group;
            const int64_t n_ctx = pos0 + t + 1;
            double m = -INFINITY, z = 0.0;
            for (int64_t j = 0; j < n_ctx; j++) {
                const float *kj = k + (j * n_head_kv + kvh) * hd;
                double d = 0.0;
                for (int i = 0; i < hd; i++) d += (double)qh[i] * kj[i];
                s[j] = scale * d;
                m = s[j] > m ? s[j] : m;
            }
            for (int64_t j = 0; j < n_ctx; j++) z += (s[j] = exp(s[j] - m));
            double *o = out + (t * n_head + h) * hd;
            for (int i = 0; i < hd; i++) o[i] = 0.0;
            for (int64_t j = 0; j < n_ctx; j++) {
                const float *vj = v + (j * n_head_kv + kvh) * hd;
                for (int i = 0; i < hd; i++) o[i] += s[j] / z * vj[i];
            }
        }
    free(s);
}

static double g_attn_worst;

/* pools[i] runs with 2 and 4 threads; the 4-thread pool also forces smaller
 * head blocks, so equality covers the blocking too. */
static void check_attention(moex_pool *pools[2], int64_t n, int64_t pos0, int n_head, int n_head_kv, int hd) {
    const int64_t n_pos = pos0 + n;
    const int64_t nq = n * n_head * hd, nkv = n_pos * n_head_kv * hd;
    /* Scores of a few units so the softmax is neither flat nor one-hot. */
    float *q = rand_vec(nq, 1.5f), *k = rand_vec(nkv, 1.5f), *v = rand_vec(nkv, 1.0f);
    float *out1 = malloc((size_t)nq * sizeof *out1), *outp = malloc((size_t)nq * sizeof *outp);
    double *ref = malloc((size_t)nq * sizeof *ref);
    const float scale = 1.0f / sqrtf((float)hd);
    ref_attention(ref, q, k, v, n, pos0, n_head, n_head_kv, hd, scale);
    CHECK(moex_attention(NULL, q, k, v, out1, n, pos0, n_head, n_head_kv, hd, scale, NULL) == 0, "attention failed");
    const double e = rel_l2(out1, ref, nq);
    g_attn_worst = e > g_attn_worst ? e : g_attn_worst;
    CHECK(e < 1e-5, "attention n=%lld pos0=%lld heads=%d/%d hd=%d rel err %.3g", (long long)n, (long long)pos0,
          n_head, n_head_kv, hd, e);
    for (int p = 0; p < 2; p++) {
        CHECK(moex_attention(pools[p], q, k, v, outp, n, pos0, n_head, n_head_kv, hd, scale, NULL) == 0, "attention failed");
        CHECK(memcmp(out1, outp, (size_t)nq * sizeof *out1) == 0,
              "attention n=%lld pos0=%lld heads=%d/%d hd=%d: 1 and %d threads differ", (long long)n, (long long)pos0,
              n_head, n_head_kv, hd, moex_pool_size(pools[p]));
    }
    free(q), free(k), free(v), free(out1), free(outp), free(ref);
}

static void test_attention(void) {
    moex_pool *pools[2] = {moex_pool_create(2), moex_pool_create(4)};
    CHECK(pools[0] && pools[1], "pool create failed");
    if (!pools[0] || !pools[1]) return;
    const int ratios[] = {1, 4, 8}, dims[] = {64, 128};
    for (size_t ri = 0; ri < 3; ri++)
        for (size_t di = 0; di < 2; di++) {
            const int n_head_kv = 2, n_head = n_head_kv * ratios[ri], hd = dims[di];
            const int64_t decode_pos[] = {0, 1, 37, 1000};
            for (size_t pi = 0; pi < 4; pi++) check_attention(pools, 1, decode_pos[pi], n_head, n_head_kv, hd);
            check_attention(pools, 17, 0, n_head, n_head_kv, hd);   /* prefill */
            check_attention(pools, 17, 5, n_head, n_head_kv, hd);   /* prefill after a prompt chunk */
        }
    /* Odd head_dim exercises the scalar tails of the vector loops. */
    check_attention(pools, 3, 70, 6, 3, 72);
    printf("attention: worst rel L2 %.2e (bound 1e-5), 1, 2 and 4 threads bit-identical\n", g_attn_worst);

    /* Bad shapes are refused, not crashed on, with an error that names the
     * cause; the output is left as it was. */
    static const struct { int n_head, n_head_kv, head_dim; int64_t pos0; const char *cause; } bad[] = {
        {3, 2, 4, 0, "3 query heads are not a multiple of 2 KV heads"},
        {2, 1, 4096, 0, "head_dim 4096 exceeds the 512"},
        {2, 1, 4, -1, "first position -1"},
    };
    float dummy[8] = {0}, o[8];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        moex_error e = {{0}};
        for (int j = 0; j < 8; j++) o[j] = 3.0f;
        const int rc = moex_attention(NULL, dummy, dummy, dummy, o, 1, bad[i].pos0, bad[i].n_head, bad[i].n_head_kv,
                                      bad[i].head_dim, 1.0f, &e);
        CHECK(rc == -1 && strstr(e.msg, bad[i].cause), "bad attention shape %zu: rc %d, error '%s' (want '%s')", i, rc,
              e.msg, bad[i].cause);
        int changed = 0;
        for (int j = 0; j < 8; j++) changed += o[j] != 3.0f;
        CHECK(changed == 0, "bad attention shape %zu: output changed", i);
    }
    moex_pool_destroy(pools[0]);
    moex_pool_destroy(pools[1]);
}

int main(void) {
    g_rng = test_rng("test_ops");
    test_rmsnorm();
    test_softmax();
    test_swiglu();
    test_rope();
    test_attention();
    if (g_failures) {
        fprintf(stderr, "%d check(s) failed (replay with the seed printed first)\n", g_failures);
        return 1;
    }
    printf("all ops tests passed\n");
    return 0;
}
