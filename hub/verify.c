/* Honest results (verify.h). */
#include <math.h>
#include <string.h>

#include "hub/verify.h"
#include "proto/proto.h"

/* Half a step of the wire's rounding at magnitude v: what rounding an
 * honest value there to the wire dtype may move it by. */
static double wire_half_step(int dtype, double v) {
    int e;
    frexp(v, &e); /* v = m 2^e, m in [0.5, 1): the ulp of a p-bit significand is 2^(e - p) */
    switch (dtype) {
    case MOEX_DT_F16: return v < 0x1p-14 ? 0x1p-25 : ldexp(1.0, e - 12);
    case MOEX_DT_BF16: return ldexp(1.0, e - 9);
    default: return 0;
    }
}

bool hub_result_honest(const float *row, const double *ref, const double *tol, int64_t n, int wire_dtype,
                       double *worst) {
    /* int8 rows share one scale, amax / 127, from the worker's own largest value */
    double int8_half_step = 0;
    if (wire_dtype == MOEX_DT_INT8) {
        for (int64_t i = 0; i < n; i++) int8_half_step = fmax(int8_half_step, fabs(ref[i]) + tol[i]);
        int8_half_step = int8_half_step / 254 * (1 + 0x1p-20);
    }
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        const double wire = int8_half_step + wire_half_step(wire_dtype, fabs(ref[i]) + tol[i]);
        const double beyond = fabs((double)row[i] - ref[i]) - wire; /* what the computation itself is off by */
        const double r = beyond <= 0 ? 0 : tol[i] > 0 ? beyond / tol[i] : INFINITY;
        if (!(r <= w)) w = isnan(r) ? INFINITY : r;
    }
    *worst = w;
    return w <= 1;
}

bool hub_result_honest_any(const float *row, const double *ref, const double *tol, int n_var, int64_t n,
                           int wire_dtype, double *worst) {
    double best = INFINITY;
    for (int v = 0; v < n_var; v++) {
        double w;
        hub_result_honest(row, ref + v * n, tol + v * n, n, wire_dtype, &w);
        if (w < best) best = w;
    }
    *worst = best;
    return best <= 1;
}

bool hub_rows_sane(const float *rows, int64_t n, int64_t d, const double *limits) {
    uint32_t not_finite = 0;
    for (int64_t i = 0; i < n * d; i++) { /* an exponent of all ones: inf or NaN, branch-free so it vectorises */
        uint32_t u;
        memcpy(&u, rows + i, 4);
        not_finite |= (u & 0x7f800000u) == 0x7f800000u;
    }
    if (not_finite) return false;
    for (int64_t t = 0; limits && t < n; t++) {
        float m = 0;
        for (int64_t i = 0; i < d; i++) m = fmaxf(m, fabsf(rows[t * d + i]));
        if (m > limits[t]) return false;
    }
    return true;
}
