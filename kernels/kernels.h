/* Compute kernels, CPU backend. Every kernel here has a float64 reference
 * test; the CPU backend is the reference the Vulkan and WASM backends are
 * checked against.
 *
 * Conventions: a weight matrix has `rows` output features, each a contiguous
 * row of `cols` input features stored in its type's blocks (GGUF ne[0] = cols,
 * ne[1] = rows). Activations are f32, row-major, one row per token.
 * Quantized products quantize the activations to the partner type (Q8_K for
 * K-quants, Q8_0 / Q8_1 for the 32-blocks), as llama.cpp does, and accumulate
 * in f32. SIMD: AVX2+FMA when the CPU has it (checked at run time), else a
 * portable path; the per-type dot products sit behind one function table so a
 * WASM SIMD path plugs in beside them.
 *
 * Kernels that can fail return 0 or -1 and fill err (may be NULL) with the
 * cause: the operand and what is wrong with it (an unsupported type, shapes
 * that disagree, no memory for scratch). They log nothing; the caller says
 * where, with moex_error_prefix ("layer 3 attention: q/k/v: " + "matrix 1
 * has type q8_K, which the CPU kernels do not multiply"). */
#ifndef MOEX_KERNELS_H
#define MOEX_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

typedef struct moex_matrix {
    moex_type type;
    int64_t rows, cols;
    size_t row_bytes;   /* moex_row_bytes(type, cols) */
    const void *data;
} moex_matrix;

/* ---- rows: conversion between f32 and stored types ---- */
/* dst[0..n) = values of src; n a multiple of the block size. */
int moex_dequantize_row(moex_type type, const void *src, float *dst, int64_t n, moex_error *err);
/* Reference quantizer (round-to-nearest with the usual scale search for
 * K-quants); writes moex_row_bytes(type, n) bytes. */
int moex_quantize_row(moex_type type, const float *src, void *dst, int64_t n, moex_error *err);
/* Name of the SIMD path in use ("avx2", "portable"). */
const char *moex_kernels_simd_name(void);
/* --simd: the kernels of this process on a lower path than the CPU's best
 * ("portable", "avx2"; "avx512vnni" = the best), to compare or test them.
 * Call before the first kernel runs; -1 for another name or once they run. */
int moex_kernels_use_simd(const char *name, moex_error *err);

/* ---- matrix products ---- */
/* y[t][r] = sum_c W[r][c] * x[t][c] for t < n. x: n x cols, y: n x rows. */
int moex_matmul(moex_pool *pool, const moex_matrix *w, const float *x, int64_t n, float *y, moex_error *err);
/* Several matrices applied to the same x in one parallel pass (q/k/v, gate/up):
 * ys[i] is n x ws[i].rows. All ws must have the same cols. */
int moex_matmul_multi(moex_pool *pool, const moex_matrix *ws, int n_w, const float *x, int64_t n, float **ys,
                      moex_error *err);

/* ---- expert FFN (SwiGLU) ---- */
typedef struct moex_expert_weights {
    moex_matrix gate, up, down;   /* gate/up: n_ff x hidden; down: hidden x n_ff */
} moex_expert_weights;

/* One expert applied to some tokens: out[i] = gates[i] * down(silu(gate x) * up x)
 * for x = the row rows[i] of the shared input. out is n_tokens x hidden,
 * overwritten (the caller combines experts in a fixed order, so results do
 * not depend on thread timing). */
typedef struct moex_expert_job {
    const moex_expert_weights *w;
    int64_t n_tokens;
    const int32_t *rows;     /* token indices into x */
    const float *gates;      /* one gate weight per token */
    float *out;
} moex_expert_job;

/* Runs all jobs, sharing the pool across experts (decode has top-k tiny jobs). */
int moex_experts_run(moex_pool *pool, const moex_expert_job *jobs, int n_jobs, const float *x, int64_t hidden,
                     moex_error *err);

/* ---- checking expert results computed elsewhere (expert_check.c) ----
 *
 * A worker's result is honest when every element lies within the bound
 * moex_expert_check_token gives around the exact value of the chain all
 * backends compute (x rounded to 8 bits, gate/up, silu, h rounded to 8
 * bits, down, the gate weight): the float rounding any summation order can
 * make, and one 8-bit step wherever a rounding input lies close enough to a
 * half step for that to flip it (docs/PROTOCOL.md, "Verification"). */
typedef struct moex_expert_check moex_expert_check;
moex_expert_check *moex_expert_check_create(void);
void moex_expert_check_free(moex_expert_check *c);
/* One token: ref the chain's exact value, tol how far an honest f32 result
 * may lie from it (before any wire rounding), for each way x's near ties
 * may round (a variant each: ref and tol hold MOEX_EXPERT_CHECK_VARIANTS x
 * hidden values; a result is honest when it is within some variant's
 * bound). Returns the number of variants (>= 1), or -1. Keeps the weights'
 * dequantized rows while the same expert is checked. */
#define MOEX_EXPERT_CHECK_VARIANTS 4
int moex_expert_check_token(moex_expert_check *c, const moex_expert_weights *w, const float *x, float gate,
                            double *ref, double *tol, moex_error *err);

/* The largest row L1 norms (sums of |w|) of an expert's matrices. */
typedef struct moex_expert_norms {
    double gate, up, down;
} moex_expert_norms;
int moex_expert_norms_of(const moex_expert_weights *w, moex_expert_norms *out, moex_error *err);
/* The largest |value| any element of one token's honest result can have,
 * for an input whose largest |value| is x_absmax: what bounds a result
 * that is never recomputed. */
double moex_expert_result_max(const moex_expert_norms *n, double x_absmax, double gate);

/* ---- elementwise and attention ---- */
/* out = x / sqrt(mean(x^2) + eps) * w (w may be NULL). out may alias x. */
void moex_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
/* Rotates the first rope_dim dims of each of n_heads heads (head_dim apart)
 * for position pos. neox: pairs (i, i + rope_dim/2); else pairs (2i, 2i+1). */
void moex_rope(float *x, int n_heads, int head_dim, int rope_dim, int64_t pos, float freq_base, bool neox);
void moex_softmax(float *x, int64_t n);
/* out[i] = silu(g[i]) * u[i]; out may alias g. */
void moex_swiglu(float *out, const float *g, const float *u, int64_t n);

/* Causal GQA attention for n new query tokens at positions pos0 .. pos0+n-1.
 * q: n x n_head x head_dim. k_cache, v_cache: [position][n_head_kv][head_dim]
 * holding positions 0 .. pos0+n-1. out: n x n_head x head_dim.
 * Parallel over (token, head). */
int moex_attention(moex_pool *pool, const float *q, const float *k_cache, const float *v_cache, float *out,
                   int64_t n, int64_t pos0, int n_head, int n_head_kv, int head_dim, float scale, moex_error *err);

#endif
