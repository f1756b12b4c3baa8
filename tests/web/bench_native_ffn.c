/* The native side of docs/BROWSER.md's comparison: one Qwen3-30B-A3B expert
 * (hidden 2048, ffn 768) on one token through moex_experts_run, as
 * moex-worker computes it, on one thread and on all cores. Prints the median
 * of 200 calls (after 50 to warm up) per weight mix.
 * usage: bench_web_native_ffn */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

enum { H = 2048, F = 768, RUNS = 200 };

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static moex_matrix random_matrix(moex_type t, int64_t rows, int64_t cols, uint64_t *rng) {
    float *f = malloc((size_t)(rows * cols) * sizeof *f);
    for (int64_t i = 0; i < rows * cols; i++) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        f[i] = ((float)(*rng >> 40) / (float)(1 << 24) - 0.5f) * 0.05f;
    }
    const size_t rb = moex_row_bytes(t, cols);
    void *q = malloc(rb * (size_t)rows);
    moex_quantize_row(t, f, q, rows * cols, NULL);
    free(f);
    return (moex_matrix){.type = t, .rows = rows, .cols = cols, .row_bytes = rb, .data = q};
}

static double median_ms(moex_pool *pool, const moex_expert_weights *w, const float *x) {
    static double t[RUNS];
    float gate = 0.5f, *out = malloc(H * sizeof *out);
    int32_t row = 0;
    const moex_expert_job job = {.w = w, .n_tokens = 1, .rows = &row, .gates = &gate, .out = out};
    for (int i = 0; i < 50; i++) moex_experts_run(pool, &job, 1, x, H, NULL);
    for (int i = 0; i < RUNS; i++) {
        const double t0 = moex_time_s();
        moex_experts_run(pool, &job, 1, x, H, NULL);
        t[i] = (moex_time_s() - t0) * 1e3;
    }
    free(out);
    qsort(t, RUNS, sizeof t[0], cmp);
    return t[RUNS / 2];
}

int main(void) {
    const struct { const char *name; moex_type t[3]; } mixes[] = {
        {"q4_K_M (q4_K/q4_K/q6_K)", {MOEX_TYPE_Q4_K, MOEX_TYPE_Q4_K, MOEX_TYPE_Q6_K}},
        {"q8_0", {MOEX_TYPE_Q8_0, MOEX_TYPE_Q8_0, MOEX_TYPE_Q8_0}},
    };
    moex_pool *all = moex_pool_create(0);
    uint64_t rng = 42;
    float x[H];
    for (int i = 0; i < H; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    printf("simd: %s; one expert %dx%d, one token\n", moex_kernels_simd_name(), H, F);
    for (size_t m = 0; m < sizeof mixes / sizeof mixes[0]; m++) {
        moex_expert_weights w = {random_matrix(mixes[m].t[0], F, H, &rng), random_matrix(mixes[m].t[1], F, H, &rng),
                                 random_matrix(mixes[m].t[2], H, F, &rng)};
        printf("%-26s 1 thread %.3f ms, %d threads %.3f ms\n", mixes[m].name, median_ms(NULL, &w, x),
               moex_pool_size(all), median_ms(all, &w, x));
        free((void *)w.gate.data);
        free((void *)w.up.data);
        free((void *)w.down.data);
    }
    moex_pool_destroy(all);
    return 0;
}
