/* Thread pool: the caller is thread 0, workers 1..n-1 wait for a new job
 * generation. After each job a worker spins for SPIN_US (a decode step issues
 * ~100 jobs back to back; a futex wake-up costs more than the job) and then
 * sleeps on a condition variable; while the pool is held (moex_pool_hold)
 * it spins on. A run is: publish fn/ctx, bump the
 * generation, run slice 0, spin until the workers' countdown reaches zero. */
#include "common/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_US 150
#define CACHE_LINE 64

typedef struct worker {
    moex_pool *pool;
    int ith;
    pthread_t thread;
} worker;

struct moex_pool {
    int n_threads;
    worker *workers; /* n_threads - 1 entries */

    /* Written by the caller before bumping generation, read by workers after. */
    moex_task_fn fn;
    void *ctx;

    _Alignas(CACHE_LINE) atomic_uint_fast64_t generation;
    _Alignas(CACHE_LINE) atomic_int pending;   /* workers still in the current job */
    _Alignas(CACHE_LINE) atomic_int sleepers;  /* workers blocked (or about to block) on wake */
    atomic_bool stop;
    atomic_bool hold;                          /* moex_pool_hold: spin without a deadline */

    pthread_mutex_t mutex;
    pthread_cond_t wake;

    void *scratch;
    size_t scratch_bytes;
};

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Spins up to SPIN_US for a generation other than seen; returns it, or seen. */
static uint64_t spin_for_job(moex_pool *pool, uint64_t seen) {
    uint64_t deadline = 0;
    for (unsigned i = 0;; i++) {
        uint64_t g = atomic_load_explicit(&pool->generation, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
        if ((i & 63) == 63) {
            if (atomic_load_explicit(&pool->hold, memory_order_relaxed)) {
                deadline = 0;
                continue;
            }
            uint64_t t = now_us();
            if (!deadline) deadline = t + SPIN_US;
            else if (t >= deadline) return seen;
        }
    }
}

/* Blocks until the generation moves past seen. The sleepers count and the
 * generation are both seq_cst, so either moex_pool_run sees this sleeper and
 * broadcasts under the mutex, or this thread sees the new generation. */
static uint64_t sleep_for_job(moex_pool *pool, uint64_t seen) {
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add(&pool->sleepers, 1);
    uint64_t g;
    while ((g = atomic_load(&pool->generation)) == seen) pthread_cond_wait(&pool->wake, &pool->mutex);
    atomic_fetch_sub(&pool->sleepers, 1);
    pthread_mutex_unlock(&pool->mutex);
    return g;
}

static void *worker_main(void *arg) {
    worker *w = arg;
    moex_pool *pool = w->pool;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = spin_for_job(pool, seen);
        if (g == seen) g = sleep_for_job(pool, seen);
        seen = g;
        if (atomic_load_explicit(&pool->stop, memory_order_acquire)) break;
        pool->fn(pool->ctx, w->ith, pool->n_threads);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
    }
    return NULL;
}

static void publish_generation(moex_pool *pool) {
    atomic_fetch_add(&pool->generation, 1); /* seq_cst: pairs with sleep_for_job */
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mutex);
    }
}

static void stop_workers(moex_pool *pool, int n_started) {
    atomic_store(&pool->stop, true);
    publish_generation(pool);
    for (int i = 0; i < n_started; i++) pthread_join(pool->workers[i].thread, NULL);
}

moex_pool *moex_pool_create(int n_threads) {
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    moex_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->n_threads = n_threads;
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->pending, 0);
    atomic_init(&pool->sleepers, 0);
    atomic_init(&pool->stop, false);
    atomic_init(&pool->hold, false);
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->wake, NULL);
    if (n_threads > 1) {
        pool->workers = calloc((size_t)n_threads - 1, sizeof *pool->workers);
        if (!pool->workers) goto fail;
    }
    for (int i = 0; i < n_threads - 1; i++) {
        pool->workers[i] = (worker){.pool = pool, .ith = i + 1};
        if (pthread_create(&pool->workers[i].thread, NULL, worker_main, &pool->workers[i]) != 0) {
            stop_workers(pool, i);
            goto fail;
        }
    }
    return pool;
fail:
    pthread_mutex_destroy(&pool->mutex);
    pthread_cond_destroy(&pool->wake);
    free(pool->workers);
    free(pool);
    return NULL;
}

void moex_pool_destroy(moex_pool *pool) {
    if (!pool) return;
    stop_workers(pool, pool->n_threads - 1);
    pthread_mutex_destroy(&pool->mutex);
    pthread_cond_destroy(&pool->wake);
    free(pool->workers);
    free(pool->scratch);
    free(pool);
}

int moex_pool_size(const moex_pool *pool) { return pool ? pool->n_threads : 1; }

void moex_pool_run(moex_pool *pool, moex_task_fn fn, void *ctx) {
    if (!pool || pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->pending, pool->n_threads - 1, memory_order_relaxed);
    publish_generation(pool);
    fn(ctx, 0, pool->n_threads);
    /* Yield now and then: on an oversubscribed machine a descheduled worker
     * needs this core to finish. */
    for (unsigned i = 1; atomic_load_explicit(&pool->pending, memory_order_acquire) > 0; i++) {
        cpu_relax();
        if ((i & 255) == 0) sched_yield();
    }
}

void moex_pool_hold(moex_pool *pool, bool hold) {
    if (pool) atomic_store_explicit(&pool->hold, hold, memory_order_relaxed);
}

int moex_pool_sleeping(const moex_pool *pool) { return pool ? atomic_load(&pool->sleepers) : 0; }

void *moex_pool_scratch(moex_pool *pool, size_t bytes) {
    if (!pool) return NULL;
    if (bytes <= pool->scratch_bytes && pool->scratch) return pool->scratch;
    size_t size = (bytes + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE;
    if (size == 0) size = CACHE_LINE;
    void *p = aligned_alloc(CACHE_LINE, size);
    if (!p) return NULL;
    free(pool->scratch);
    pool->scratch = p;
    pool->scratch_bytes = size;
    return p;
}
