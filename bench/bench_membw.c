/* The machine's memory floor for experts kept in RAM: how fast every core
 * together reads a buffer far larger than the caches (what the CPU expert
 * tier does with the weights of a token's experts), and a copy for
 * comparison. Prints "membw_read_gb_s X" (best of -r runs), "membw_copy_gb_s Y"
 * (bytes read + written).
 * usage: bench_membw [-g GiB (4)] [-t threads (all)] [-r reps (5)] */
#include <stdint.h>
#include <string.h>

#include "common/common.h"

#include "bench/bench_util.h"

typedef struct job {
    const uint64_t *src;
    uint64_t *dst;
    size_t words;
    uint64_t sums[256 * 8];   /* one cache line per thread */
} job;

static void slice(const job *j, int ith, int nth, size_t *a, size_t *b) {
    *a = j->words / (size_t)nth * (size_t)ith;
    *b = ith == nth - 1 ? j->words : j->words / (size_t)nth * (size_t)(ith + 1);
}

/* Four independent sums so the loads are not serialised on one add chain. */
static void read_task(void *ctx, int ith, int nth) {
    job *j = ctx;
    size_t a, b;
    slice(j, ith, nth, &a, &b);
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = a; i + 4 <= b; i += 4) {
        s0 += j->src[i];
        s1 += j->src[i + 1];
        s2 += j->src[i + 2];
        s3 += j->src[i + 3];
    }
    j->sums[(ith % 256) * 8] = s0 + s1 + s2 + s3;
}

static void copy_task(void *ctx, int ith, int nth) {
    job *j = ctx;
    size_t a, b;
    slice(j, ith, nth, &a, &b);
    memcpy(j->dst + a, j->src + a, (b - a) * sizeof *j->src);
}

static void touch_task(void *ctx, int ith, int nth) {
    job *j = ctx;
    size_t a, b;
    slice(j, ith, nth, &a, &b);
    uint64_t *src = (uint64_t *)j->src;
    for (size_t i = a; i < b; i++) src[i] = i * 0x9E3779B97F4A7C15ull, j->dst[i] = 0;
}

static double best_gb_s(moex_pool *pool, moex_task_fn fn, job *j, double bytes, int reps) {
    double best = 0;
    for (int r = 0; r < reps; r++) {
        const double t0 = moex_time_s();
        moex_pool_run(pool, fn, j);
        const double gb_s = bytes / (moex_time_s() - t0) / 1e9;
        if (gb_s > best) best = gb_s;
    }
    return best;
}

int main(int argc, char **argv) {
    double gib = 4;
    int threads = 0, reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-g")) gib = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-t")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r")) reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_membw [-g GiB] [-t threads] [-r reps]\n");
            return 2;
        }
    }
    if (gib <= 0 || gib > 256 || reps < 1) return 2;
    moex_pool *pool = moex_pool_create(threads);
    job *j = calloc(1, sizeof *j);
    j->words = (size_t)(gib * (double)(1u << 30)) / sizeof(uint64_t) / 4 * 4;
    j->src = aligned_alloc(64, j->words * sizeof(uint64_t));
    j->dst = aligned_alloc(64, j->words * sizeof(uint64_t));
    if (!pool || !j->src || !j->dst) {
        fprintf(stderr, "bench_membw: cannot allocate 2 x %.1f GiB\n", gib);
        return 1;
    }
    moex_pool_run(pool, touch_task, j);   /* pages in, written once */
    const double bytes = (double)j->words * sizeof(uint64_t);
    printf("membw_threads %d\nmembw_gib %.1f\n", moex_pool_size(pool), gib);
    printf("membw_read_gb_s %.1f\n", best_gb_s(pool, read_task, j, bytes, reps));
    printf("membw_copy_gb_s %.1f\n", best_gb_s(pool, copy_task, j, 2 * bytes, reps));
    free((void *)j->src);
    free(j->dst);
    free(j);
    moex_pool_destroy(pool);
    return 0;
}
