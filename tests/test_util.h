/* What every C test shares: the failure counter and CHECK, and a seeded
 * splitmix64 generator with uniform and Gaussian draws, seeded fresh per run, and the relative L2
 * error every numeric check uses. Header-only. */
#ifndef MOEX_TEST_UTIL_H
#define MOEX_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/rng.h"

static int g_failures;

#define CHECK(cond, ...)                                         \
    do {                                                         \
        if (!(cond)) {                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fprintf(stderr, "\n");                               \
            g_failures++;                                        \
        }                                                        \
    } while (0)

typedef struct rng {
    uint64_t s;
} rng;

static inline uint64_t rng_next(rng *r) { return moex_splitmix64(&r->s); }

/* Uniform in [0, 1). */
static inline double rng_uniform(rng *r) { return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

/* Standard normal (Box-Muller). */
static inline float rng_gauss(rng *r) {
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* ||a - ref|| / ||ref|| in float64 (||a - ref|| where ref is all zeros). */
static inline double rel_l2(const float *a, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The same against a float reference. */
static inline double rel_l2_f(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Seed from MOEX_TEST_SEED or the clock, printed so a failure can be replayed. */
static inline rng test_rng(const char *name) {
    const char *env = getenv("MOEX_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    printf("%s: seed %llu (MOEX_TEST_SEED to replay)\n", name, (unsigned long long)seed);
    return (rng){seed};
}

#endif
