/* What the benchmark programs share (header-only): the median of repeated
 * timings, and MUST for programs that report errors through a moex_error
 * named err (define BENCH_NAME before including to prefix its messages). */
#ifndef MOEX_BENCH_UTIL_H
#define MOEX_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v. */
static inline double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#ifdef BENCH_NAME
#define MUST(call)                                                        \
    do {                                                                  \
        if ((call) != 0) {                                                \
            fprintf(stderr, BENCH_NAME ": %s: %s\n", #call, err.msg);     \
            exit(1);                                                      \
        }                                                                 \
    } while (0)
#endif

#endif
