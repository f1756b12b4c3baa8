/* Thread pool for data-parallel kernels. The calling thread is worker 0, so a
 * pool of n threads starts n-1. Workers spin briefly between jobs (a decode
 * step issues ~100 small jobs; futex wake-ups would dominate) and then sleep.
 * Part of the common module's API (common/common.h). */
#ifndef MOEX_POOL_H
#define MOEX_POOL_H

#include <stdbool.h>
#include <stddef.h>

typedef struct moex_pool moex_pool;
typedef void (*moex_task_fn)(void *ctx, int ith, int nth);

/* n_threads <= 0 picks the number of online CPUs. NULL on failure. */
moex_pool *moex_pool_create(int n_threads);
void moex_pool_destroy(moex_pool *pool);
int moex_pool_size(const moex_pool *pool);
/* Runs fn(ctx, ith, nth) on every thread, ith = 0..nth-1, and returns when
 * all have finished. Not reentrant: fn must not call moex_pool_run. */
void moex_pool_run(moex_pool *pool, moex_task_fn fn, void *ctx);
/* While held, workers spin between jobs without a deadline: for a caller
 * that issues jobs with gaps longer than the usual spin (the CPU expert tier
 * between two GPU segments of a forward), where a sleeping wake-up costs
 * more than the job. Release it when the burst ends, or the workers keep
 * their cores busy. */
void moex_pool_hold(moex_pool *pool, bool hold);
/* Workers blocked on the condition variable now (tests, diagnostics). */
int moex_pool_sleeping(const moex_pool *pool);
/* A reusable 64-byte-aligned buffer owned by the pool: grows, never shrinks;
 * contents are lost when it grows. NULL if allocation fails. For use by the
 * thread calling moex_pool_run, between runs (kernels' activation scratch). */
void *moex_pool_scratch(moex_pool *pool, size_t bytes);

#endif
