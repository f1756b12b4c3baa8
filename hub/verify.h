/* Private to the hub: what the remote executor accepts as an honest result
 * (verify.c, docs/PROTOCOL.md "Verification"). A result row is honest when
 * each value lies within the bound kernels/expert_check.c gives around the
 * exact chain, widened by what the wire's rounding of the worker's own value
 * can add. */
#ifndef MOEX_HUB_VERIFY_H
#define MOEX_HUB_VERIFY_H

#include <stdbool.h>
#include <stdint.h>

/* Whether row (as decoded from the wire) is an honest result for ref within
 * tol (moex_expert_check_token's), its values sent as wire_dtype: each value
 * within tol of ref once the wire's rounding is taken off. *worst: the
 * largest share of tol a value used (0: no more than the wire's rounding;
 * > 1: not honest; NaN counts as infinite). */
bool hub_result_honest(const float *row, const double *ref, const double *tol, int64_t n, int wire_dtype,
                       double *worst);
/* The same against each of n_var variants (ref and tol hold n_var rows of
 * n: moex_expert_check_token's): honest when some variant takes it; *worst
 * is the smallest of their worst shares. */
bool hub_result_honest_any(const float *row, const double *ref, const double *tol, int n_var, int64_t n,
                           int wire_dtype, double *worst);

/* Whether every value of n rows of d is finite and each row's largest
 * |value| is at most its limit (limits[i]; NULL: no limit): a result that
 * is not can be no honest worker's (moex_expert_result_max). */
bool hub_rows_sane(const float *rows, int64_t n, int64_t d, const double *limits);

#endif
