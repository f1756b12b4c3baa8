/* Nearest-rank quantiles (quantile.h). */
#include "common/quantile.h"

#include <math.h>
#include <stdlib.h>

static int by_value(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

float moex_quantile_of_sorted_f32(const float *v, size_t n, double q) {
    if (n == 0) return 0;
    q = q < 0 ? 0 : q > 1 ? 1 : q;
    const size_t rank = (size_t)ceil(q * (double)n); /* 1-based */
    return v[rank < 1 ? 0 : rank > n ? n - 1 : rank - 1];
}

float moex_quantile_sorted_f32(float *v, size_t n, double q) {
    qsort(v, n, sizeof *v, by_value);
    return moex_quantile_of_sorted_f32(v, n, q);
}
