/* Kernel benchmark: matvec bandwidth (decode), prefill matmul throughput and
 * pool overhead, against a read-bandwidth baseline measured in the same run.
 *
 *   bench_kernels           full table (LM head 151936x1024 and 2048x1024)
 *   bench_kernels --quick   tiny sizes, one pass (ctest smoke run)
 *   bench_kernels --prefill only the prefill table (--simd portable|avx2: another path)
 *
 * Weights are random bytes with sane block scales: speed does not depend on
 * the values, and quantizing 150M elements properly would take minutes. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "kernels/kernels.h"

typedef struct bench_cfg {
    int quick, prefill_only;
    double min_seconds; /* per measurement */
} bench_cfg;

static uint64_t rng_state = 0x1234567;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Random block contents; every f16 field that scales a block set to a small
 * normal value (no NaN/denormal slow paths). */
static void *make_weights(moex_type t, int64_t rows, int64_t cols, size_t *row_bytes) {
    *row_bytes = moex_row_bytes(t, cols);
    const size_t total = *row_bytes * (size_t)rows;
    uint8_t *p = aligned_alloc(64, (total + 63) / 64 * 64);
    if (!p) return NULL;
    for (size_t i = 0; i + 8 <= total; i += 8) {
        uint64_t v = rnd();
        memcpy(p + i, &v, 8);
    }
    const moex_f16 small = moex_f32_to_f16(0.01f);
    const size_t nb = total / (size_t)moex_type_get(t)->block_bytes;
    for (size_t b = 0; b < nb; b++) {
        uint8_t *blk = p + b * (size_t)moex_type_get(t)->block_bytes;
        switch (t) {
        case MOEX_TYPE_Q4_K:
        case MOEX_TYPE_Q5_K:
            memcpy(blk, &small, 2);
            memcpy(blk + 2, &small, 2);
            break;
        case MOEX_TYPE_Q8_0:
        case MOEX_TYPE_Q4_0: memcpy(blk, &small, 2); break;
        case MOEX_TYPE_MXFP4: blk[0] = 120; break;   /* E8M0 2^-7: finite values */
        case MOEX_TYPE_Q6_K: memcpy(blk + 208, &small, 2); break;
        case MOEX_TYPE_F16: {
            const moex_f16 h = moex_f32_to_f16((float)((int)(rnd() % 2001) - 1000) * 1e-5f);
            memcpy(blk, &h, 2);
            break;
        }
        default: break;
        }
    }
    return p;
}

/* ---- read bandwidth baseline ---- */

typedef struct read_task {
    const uint64_t *data;
    size_t n;
    uint64_t sink[16];
} read_task;

/* Reads a cache line per iteration with the same software prefetch distance as the
 * decode kernels, so the baseline is what a core can stream, not what a
 * naive loop gets. */
static void read_worker(void *ctx, int ith, int nth) {
    read_task *r = ctx;
    const size_t lo = r->n * ith / nth / 8 * 8, hi = r->n * (ith + 1) / nth / 8 * 8;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = lo; i < hi; i += 8) {
        if (i + 512 < hi) __builtin_prefetch(&r->data[i + 512], 0, 3); /* 4 KB ahead */
        a ^= r->data[i] ^ r->data[i + 4];
        b ^= r->data[i + 1] ^ r->data[i + 5];
        c ^= r->data[i + 2] ^ r->data[i + 6];
        d ^= r->data[i + 3] ^ r->data[i + 7];
    }
    r->sink[ith] = a ^ b ^ c ^ d;
}

static double best_seconds(const bench_cfg *cfg, void (*fn)(void *), void *arg) {
    double best = 1e30, spent = 0;
    int iters = 0;
    fn(arg); /* warm up */
    while (iters < 3 || (spent < cfg->min_seconds && iters < 1000)) {
        const double t0 = moex_time_s();
        fn(arg);
        const double dt = moex_time_s() - t0;
        if (dt < best) best = dt;
        spent += dt;
        iters++;
        if (cfg->quick) break;
    }
    return best;
}

typedef struct run_read {
    moex_pool *pool;
    read_task task;
} run_read;
static void do_read(void *arg) {
    run_read *r = arg;
    moex_pool_run(r->pool, read_worker, &r->task);
}

static double read_bandwidth(const bench_cfg *cfg, moex_pool *pool, size_t bytes) {
    uint64_t *buf = aligned_alloc(64, bytes);
    if (!buf) return 0;
    memset(buf, 1, bytes);
    run_read r = {pool, {buf, bytes / 8, {0}}};
    const double t = best_seconds(cfg, do_read, &r);
    free(buf);
    return (double)bytes / t / 1e9;
}

static double memcpy_bandwidth(const bench_cfg *cfg, size_t bytes) {
    uint8_t *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 1e30;
    for (int i = 0; i < (cfg->quick ? 1 : 5); i++) {
        const double t0 = moex_time_s();
        memcpy(b, a, bytes);
        const double dt = moex_time_s() - t0;
        if (dt < best) best = dt;
    }
    free(a);
    free(b);
    return 2.0 * (double)bytes / best / 1e9; /* read + write */
}

/* ---- matmul ---- */

typedef struct run_mm {
    moex_pool *pool;
    moex_matrix m;
    const float *x;
    int64_t n;
    float *y;
} run_mm;
static void do_mm(void *arg) {
    run_mm *r = arg;
    moex_matmul(r->pool, &r->m, r->x, r->n, r->y, NULL);
}

static double bench_matmul(const bench_cfg *cfg, moex_pool *pool, moex_type t, int64_t rows, int64_t cols, int64_t n,
                           double *gbs) {
    size_t rb;
    void *w = make_weights(t, rows, cols, &rb);
    float *x = malloc(sizeof(float) * (size_t)(n * cols)), *y = malloc(sizeof(float) * (size_t)(n * rows));
    if (!w || !x || !y) {
        free(w);
        free(x);
        free(y);
        return 0;
    }
    for (int64_t i = 0; i < n * cols; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
    run_mm r = {pool, {t, rows, cols, rb, w}, x, n, y};
    const double s = best_seconds(cfg, do_mm, &r);
    *gbs = (double)rb * (double)rows / s / 1e9;
    free(w);
    free(x);
    free(y);
    return s;
}

/* ---- pool overhead ---- */

static void empty_task(void *ctx, int ith, int nth) {}

static double pool_overhead_us(moex_pool *pool, int runs) {
    for (int i = 0; i < 1000; i++) moex_pool_run(pool, empty_task, NULL);
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        const double t0 = moex_time_s();
        for (int i = 0; i < runs; i++) moex_pool_run(pool, empty_task, NULL);
        const double dt = (moex_time_s() - t0) / runs * 1e6;
        if (dt < best) best = dt;
    }
    return best;
}

/* ---- tables ---- */

static const moex_type k_types[] = {MOEX_TYPE_Q4_K, MOEX_TYPE_Q6_K, MOEX_TYPE_Q8_0, MOEX_TYPE_Q4_0, MOEX_TYPE_MXFP4,
                                    MOEX_TYPE_F16};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

/* Read bandwidth baseline, then matvecs (n = 1) on an LM head and a layer. */
static void bench_decode_table(const bench_cfg *cfg, moex_pool *pools[2]) {
    const size_t bw_bytes = cfg->quick ? (1u << 20) : (size_t)256 << 20;
    double read_bw[2];
    for (int p = 0; p < 2; p++) read_bw[p] = read_bandwidth(cfg, pools[p], bw_bytes);
    printf("baseline: read %.1f GB/s (1 thread), %.1f GB/s (2 threads); memcpy %.1f GB/s (read+write, 1 thread)\n",
           read_bw[0], read_bw[1], memcpy_bandwidth(cfg, bw_bytes));
    const int64_t shapes[2][2] = {{cfg->quick ? 1024 : 151936, 1024}, {cfg->quick ? 256 : 2048, 1024}};
    printf("\nmatvec (n = 1): weight GB/s, %% of read bandwidth, ms per call\n");
    printf("%-6s %-12s %22s %22s\n", "type", "shape", "1 thread", "2 threads");
    for (size_t k = 0; k < N_TYPES; k++) {
        for (int s = 0; s < 2; s++) {
            printf("%-6s %6lldx%-5lld", moex_type_get(k_types[k])->name, (long long)shapes[s][0], (long long)shapes[s][1]);
            for (int p = 0; p < 2; p++) {
                double gbs;
                const double sec = bench_matmul(cfg, pools[p], k_types[k], shapes[s][0], shapes[s][1], 1, &gbs);
                printf("   %6.1f GB/s %3.0f%% %6.3f ms", gbs, 100 * gbs / read_bw[p], sec * 1e3);
            }
            printf("\n");
        }
    }
}

/* Prefill: 64 tokens through a 2048 x 1024 matrix (the multi-token kernels). */
static void bench_prefill_table(const bench_cfg *cfg, moex_pool *pools[2]) {
    static const moex_type types[] = {MOEX_TYPE_Q4_K, MOEX_TYPE_Q5_K, MOEX_TYPE_Q6_K, MOEX_TYPE_Q8_0,
                                      MOEX_TYPE_Q4_0, MOEX_TYPE_MXFP4, MOEX_TYPE_F16};
    const int64_t rows = cfg->quick ? 256 : 2048, cols = 1024, n = cfg->quick ? 4 : 64;
    printf("\nprefill matmul (n = %lld, %lldx%lld): GFLOP/s\n", (long long)n, (long long)rows, (long long)cols);
    printf("%-6s %12s %12s\n", "type", "1 thread", "2 threads");
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        printf("%-6s", moex_type_get(types[k])->name);
        for (int p = 0; p < 2; p++) {
            double gbs;
            const double sec = bench_matmul(cfg, pools[p], types[k], rows, cols, n, &gbs);
            printf(" %12.1f", 2.0 * (double)rows * (double)cols * (double)n / sec / 1e9);
        }
        printf("\n");
    }
}

int main(int argc, char **argv) {
    bench_cfg cfg = {0, 0, 0.4};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) cfg.quick = 1, cfg.min_seconds = 0;
        else if (!strcmp(argv[i], "--prefill")) cfg.prefill_only = 1;
        else if (!strcmp(argv[i], "--simd") && i + 1 < argc) {
            moex_error err;
            if (moex_kernels_use_simd(argv[++i], &err)) {
                fprintf(stderr, "bench_kernels: %s\n", err.msg);
                return 2;
            }
        }
        else {
            fprintf(stderr, "usage: %s [--quick] [--prefill]\n", argv[0]);
            return 2;
        }
    }
    moex_pool *pools[2] = {moex_pool_create(1), moex_pool_create(2)};
    if (!pools[0] || !pools[1]) {
        fprintf(stderr, "bench: cannot create thread pools\n");
        return 1;
    }
    printf("simd: %s\n", moex_kernels_simd_name());

    if (!cfg.prefill_only) bench_decode_table(&cfg, pools);
    bench_prefill_table(&cfg, pools);
    if (!cfg.prefill_only) {
        const int runs = cfg.quick ? 100 : 100000;
        printf("\npool_run overhead (empty task): %.3f us (1 thread), %.3f us (2 threads)\n",
               pool_overhead_us(pools[0], runs), pool_overhead_us(pools[1], runs));
    }
    moex_pool_destroy(pools[0]);
    moex_pool_destroy(pools[1]);
    return 0;
}
