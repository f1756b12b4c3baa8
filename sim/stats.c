/* Sample statistics for the simulators: mean, standard error, quantiles. */
#include "sim/sim.h"

#include <math.h>
#include <stddef.h>

/* Wirth's selection: afterwards v[kth] holds the kth smallest, everything
 * left of it is <= and everything right of it is >=. */
static void select_kth(double *v, size_t n, size_t kth) {
    ptrdiff_t l = 0, m = (ptrdiff_t)n - 1, k = (ptrdiff_t)kth;
    while (l < m) {
        double x = v[k];
        ptrdiff_t i = l, j = m;
        do {
            while (v[i] < x) i++;
            while (x < v[j]) j--;
            if (i <= j) {
                double t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                j--;
            }
        } while (i <= j);
        if (j < k) l = i;
        if (k < i) m = j;
    }
}

static double min_from(const double *v, size_t from, size_t n) {
    double m = v[from];
    for (size_t i = from + 1; i < n; i++)
        if (v[i] < m) m = v[i];
    return m;
}

double moex_quantile(double *v, size_t n, double q) {
    if (n == 1) return v[0];
    if (q <= 0) q = 0;
    if (q >= 1) q = 1;
    double pos = q * (double)(n - 1);
    size_t i = (size_t)pos;
    if (i >= n - 1) i = n - 1;
    double frac = pos - (double)i;
    select_kth(v, n, i);
    double a = v[i];
    if (frac == 0.0 || i + 1 >= n) return a;
    /* After selection everything right of i is >= v[i]; the next order
     * statistic is their minimum. */
    double b = min_from(v, i + 1, n);
    return a + frac * (b - a);
}

double moex_mean(const double *v, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += v[i];
    return n ? s / (double)n : 0.0;
}

double moex_stderr(const double *v, size_t n) {
    if (n < 2) return 0.0;
    double m = moex_mean(v, n), ss = 0;
    for (size_t i = 0; i < n; i++) ss += (v[i] - m) * (v[i] - m);
    return sqrt(ss / (double)(n - 1) / (double)n);
}
