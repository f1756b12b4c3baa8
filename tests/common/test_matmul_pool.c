/* Thread pool: every run calls fn once per thread with ith = 0..nth-1 and
 * returns only after all have finished, both while workers spin (back to
 * back runs) and after they have gone to sleep; scratch is aligned and grows.
 * Prints the per-run overhead (not asserted: the machine is shared). */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"

#include "tests/test_util.h"

#define MAX_THREADS 8

typedef struct counts {
    atomic_int calls[MAX_THREADS];
    atomic_int bad_nth;
    int expected_nth;
    int64_t slow_sum[MAX_THREADS]; /* written by thread ith only */
} counts;

static void count_task(void *ctx, int ith, int nth) {
    counts *c = ctx;
    if (nth != c->expected_nth || ith < 0 || ith >= nth) atomic_fetch_add(&c->bad_nth, 1);
    else atomic_fetch_add(&c->calls[ith], 1);
}

/* Some work per thread, so "returns after all finished" is observable. */
static void slow_task(void *ctx, int ith, int nth) {
    counts *c = ctx;
    int64_t s = 0;
    for (int i = 0; i < 200000; i++) s += i % (ith + 3);
    c->slow_sum[ith] = s;
}

static void test_pool(int n_threads) {
    moex_pool *pool = moex_pool_create(n_threads);
    CHECK(pool != NULL, "pool_create(%d) failed", n_threads);
    if (!pool) return;
    const int nth = moex_pool_size(pool);
    CHECK(nth == n_threads, "pool size %d, asked %d", nth, n_threads);
    counts c;
    memset(&c, 0, sizeof c);
    c.expected_nth = nth;

    const int hot_runs = n_threads <= 2 ? 20000 : 2000; /* oversubscribed: slow by design */
    const double t0 = moex_time_s();
    for (int i = 0; i < hot_runs; i++) moex_pool_run(pool, count_task, &c);
    const double per_run_us = (moex_time_s() - t0) / hot_runs * 1e6;
    /* runs separated by sleeps longer than the spin: wake-up path */
    const int cold_runs = 20;
    for (int i = 0; i < cold_runs; i++) {
        usleep(2000);
        moex_pool_run(pool, count_task, &c);
    }
    CHECK(atomic_load(&c.bad_nth) == 0, "%d calls with a wrong ith/nth", atomic_load(&c.bad_nth));
    for (int t = 0; t < nth; t++)
        CHECK(atomic_load(&c.calls[t]) == hot_runs + cold_runs, "thread %d ran %d times, expected %d", t,
              atomic_load(&c.calls[t]), hot_runs + cold_runs);

    for (int round = 0; round < 3; round++) {
        memset(c.slow_sum, 0, sizeof c.slow_sum);
        moex_pool_run(pool, slow_task, &c);
        for (int t = 0; t < nth; t++) {
            int64_t want = 0;
            for (int i = 0; i < 200000; i++) want += i % (t + 3);
            CHECK(c.slow_sum[t] == want, "thread %d's work not finished when run returned", t);
        }
    }

    uint8_t *s1 = moex_pool_scratch(pool, 1000);
    CHECK(s1 && ((uintptr_t)s1 & 63) == 0, "scratch not 64-byte aligned");
    if (s1) memset(s1, 1, 1000);
    uint8_t *s2 = moex_pool_scratch(pool, 500);
    CHECK(s2 == s1, "smaller scratch request must reuse the buffer");
    uint8_t *s3 = moex_pool_scratch(pool, 1 << 20);
    CHECK(s3 && ((uintptr_t)s3 & 63) == 0, "grown scratch not aligned");
    if (s3) memset(s3, 2, 1 << 20); /* whole buffer writable (ASan checks) */

    printf("  pool %d threads: %.2f us per run (hot), %d hot + %d cold runs ok\n", nth, per_run_us, hot_runs, cold_runs);
    moex_pool_destroy(pool);
}

static void hold_task(void *ctx, int ith, int nth) {
    atomic_int *runs = ctx;
    if (ith >= 0 && ith < nth && nth == 3) atomic_fetch_add(&runs[ith], 1);
}

static void sleep_ms(int ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Polls up to ~2 s for the workers asleep to reach want (a loaded machine
 * may take a while to schedule them). */
static int wait_sleeping(moex_pool *pool, int want) {
    for (int i = 0; i < 400 && moex_pool_sleeping(pool) != want; i++) sleep_ms(5);
    return moex_pool_sleeping(pool);
}

/* Idle workers go to sleep; held ones keep spinning between jobs and still
 * run each job once; released, they sleep again. */
static void test_pool_hold(void) {
    moex_pool *pool = moex_pool_create(3);
    atomic_int counts[3] = {0};
    moex_pool_run(pool, hold_task, counts);
    CHECK(wait_sleeping(pool, 2) == 2, "idle workers are not asleep: %d", moex_pool_sleeping(pool));
    moex_pool_hold(pool, true);
    moex_pool_run(pool, hold_task, counts); /* wakes them; from now on they spin */
    for (int r = 0; r < 20; r++) {
        sleep_ms(2); /* a gap far beyond the usual spin */
        CHECK(moex_pool_sleeping(pool) == 0, "a held worker went to sleep (gap %d)", r);
        moex_pool_run(pool, hold_task, counts);
    }
    for (int t = 0; t < 3; t++) CHECK(atomic_load(&counts[t]) == 22, "thread %d ran %d jobs, want 22", t, atomic_load(&counts[t]));
    moex_pool_hold(pool, false);
    CHECK(wait_sleeping(pool, 2) == 2, "released workers do not sleep: %d", moex_pool_sleeping(pool));
    moex_pool_destroy(pool);
}

int main(void) {
    test_pool_hold();
    test_pool(1);
    test_pool(2);
    test_pool(3); /* more threads than cores: must still be correct */
    moex_pool_destroy(NULL);
    CHECK(moex_pool_size(NULL) == 1, "NULL pool has size 1");
    if (g_failures) {
        printf("%d failure(s)\n", g_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
