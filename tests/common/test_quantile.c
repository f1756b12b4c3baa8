/* moex_quantile_sorted_f32, the one percentile of the hub's and workers'
 * reports: on fresh random samples (with ties), the nearest rank's defining
 * property for q in a grid: at least ceil(q n) samples are <= the answer,
 * fewer than ceil(q n) are below it; and the edges (n = 0, 1, q outside [0, 1]). */
#include <math.h>

#include "common/common.h"

#include "tests/test_util.h"

static void property(rng *r) {
    float v[257], w[257];
    for (int trial = 0; trial < 200; trial++) {
        const size_t n = 1 + rng_next(r) % 257;
        for (size_t i = 0; i < n; i++) v[i] = (float)(rng_next(r) % 50); /* ties on purpose */
        for (int k = 0; k <= 100; k++) {
            const double q = k / 100.0;
            for (size_t i = 0; i < n; i++) w[i] = v[i];
            const float a = moex_quantile_sorted_f32(w, n, q);
            size_t le = 0, lt = 0;
            for (size_t i = 0; i < n; i++) le += v[i] <= a, lt += v[i] < a;
            size_t need = (size_t)ceil(q * (double)n);
            if (need < 1) need = 1;
            CHECK(le >= need && lt < need, "n %zu q %.2f: answer %g has %zu <= and %zu < (rank %zu)", n, q, a, le, lt,
                  need);
            for (size_t i = 1; i < n; i++) CHECK(w[i - 1] <= w[i], "not sorted at %zu", i);
        }
    }
}

int main(void) {
    rng r = test_rng("test_quantile");
    property(&r);
    float one = 3.5f, none = 0;
    CHECK(moex_quantile_sorted_f32(&none, 0, 0.5) == 0, "n = 0");
    CHECK(moex_quantile_sorted_f32(&one, 1, 0.99) == 3.5f, "n = 1");
    float v[4] = {4, 1, 3, 2};
    CHECK(moex_quantile_sorted_f32(v, 4, -1) == 1 && moex_quantile_of_sorted_f32(v, 4, 2) == 4, "q clamped");
    CHECK(moex_quantile_of_sorted_f32(v, 4, 0.5) == 2 && moex_quantile_of_sorted_f32(v, 4, 0.99) == 4,
          "p50 of 1..4 is 2, p99 is 4");
    if (g_failures) return 1;
    printf("test_quantile: ok\n");
    return 0;
}
