/* The one definition of a percentile of measured times that the hub, the
 * workers and their reports use: the nearest rank (the smallest sample with
 * at least q of the samples at or below it). The simulators' statistics
 * interpolate instead (sim/stats.c). Part of the common module's API. */
#ifndef MOEX_QUANTILE_H
#define MOEX_QUANTILE_H

#include <stddef.h>

/* Sorts v[0..n) ascending and returns its q-quantile (q in [0, 1], clamped);
 * 0 when n is 0. */
float moex_quantile_sorted_f32(float *v, size_t n, double q);
/* The same on a sorted array, for several quantiles of one sort. */
float moex_quantile_of_sorted_f32(const float *v, size_t n, double q);

#endif
