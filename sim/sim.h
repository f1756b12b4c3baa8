/* The sim module: latency models of hedged expert dispatch (paper §4.1,
 * eqs. 5-8 and 18) and of the per-token pipeline (eqs. 10-12), both
 * analytically and as simulations. Used by the moex-sim binary.
 * Times are in milliseconds throughout. */
#ifndef MOEX_SIM_H
#define MOEX_SIM_H

#include <stdint.h>
#include <stdio.h>

#include "common/error.h"

/* ---- Random numbers (sim/rng.c) ----------------------------------------
 * xoshiro256+ seeded through splitmix64; normals by the ziggurat method
 * (Marsaglia & Tsang, Doornik's variant). The state is all in moex_rng. */
typedef struct moex_rng {
    uint64_t s[4];
} moex_rng;

void moex_rng_seed(moex_rng *r, uint64_t seed);
uint64_t moex_rng_u64(moex_rng *r);
double moex_rng_uniform(moex_rng *r);          /* [0, 1) */
uint32_t moex_rng_below(moex_rng *r, uint32_t n); /* [0, n), n > 0 */
double moex_rng_normal(moex_rng *r);           /* N(0, 1) */
/* Log-normal with the given median (= e^mu) and sigma. */
double moex_rng_lognormal(moex_rng *r, double median, double sigma);

/* ---- Statistics (sim/stats.c) ------------------------------------------ */
/* Empirical quantile (linear interpolation between order statistics,
 * "type 7"); reorders v. q in [0, 1], n > 0. */
double moex_quantile(double *v, size_t n, double q);
double moex_mean(const double *v, size_t n);
/* Standard error of the mean (sample stddev / sqrt(n)); 0 when n < 2. */
double moex_stderr(const double *v, size_t n);

/* ---- Hedged expert phase (sim/hedge.c) ---------------------------------
 * Worker latency T ~ LogNormal(ln median, sigma); expert phase
 * T_expert = max over k experts of min over h replicas (eqs. 5-8). */
typedef struct moex_hedge_model {
    int k;          /* experts per layer, >= 1 */
    int h;          /* replicas each expert is sent to, >= 1 */
    double median;  /* worker latency median (ms), > 0 */
    double sigma;   /* log-space standard deviation, >= 0 */
} moex_hedge_model;

/* Checks ranges; fills err on bad input. */
int moex_hedge_check(const moex_hedge_model *m, moex_error *err);
/* Survival 1 - F_max at t (eq. 17), computed without cancellation. */
double moex_hedge_survival(const moex_hedge_model *m, double t);
/* E[T_expert] by adaptive Gauss-Kronrod quadrature of eq. 18 in log-time. */
int moex_hedge_expect(const moex_hedge_model *m, double *out, moex_error *err);
/* Quantile p in (0,1) of T_expert: solves F_max(t) = p (bisection). */
int moex_hedge_quantile(const moex_hedge_model *m, double p, double *out, moex_error *err);

/* Expected replica busy time per expert relative to h = 1: each of the h
 * replicas works until the first one answers (cancel is instant), so this is
 * h * E[min of h] / E[T]. */
int moex_hedge_work_factor(const moex_hedge_model *m, double *out, moex_error *err);

typedef struct moex_hedge_mc {
    double mean, stderr_, p50, p99;
    uint64_t dispatches; /* samples drawn: trials * k * h */
} moex_hedge_mc;

/* Monte Carlo estimate from `trials` independent expert phases. */
int moex_hedge_monte_carlo(const moex_hedge_model *m, uint64_t trials, moex_rng *rng,
                           moex_hedge_mc *out, moex_error *err);

/* ---- Per-token discrete-event simulation (sim/des.c) -------------------- */
enum { MOEX_SELECT_RANDOM, MOEX_SELECT_FASTEST };

typedef struct moex_worker_fail {
    int worker;
    double at_ms; /* the worker dies at this simulated time */
} moex_worker_fail;

typedef struct moex_token_config {
    int layers;          /* L */
    int experts;         /* E: experts per layer to choose from */
    int k;               /* active experts per layer */
    int workers;         /* W */
    int replicas;        /* r: copies of each expert, <= workers */
    int h;               /* fixed hedging factor (the start value when adaptive) */
    int adaptive;        /* choose h per layer from the observed tail ratio */
    int h_max;           /* adaptive upper bound (<= replicas) */
    double tail_ratio;   /* adaptive: one more replica per factor of p99/p50 */
    double hub_ms;       /* hub compute per layer (attention + router + combine) */
    double rtt_ms;       /* network round trip; each way costs rtt/2 */
    double rtt_sigma;    /* log-normal jitter of each one-way trip (0: fixed) */
    double ffn_median;   /* worker FFN time median (ms) */
    double ffn_sigma;    /* worker FFN log-normal sigma */
    const double *trace; /* optional empirical FFN times (ms): sampled instead */
    int trace_len;
    const double *speed; /* optional per-worker median multiplier (NULL: all 1) */
    int queueing;        /* 1: a worker runs one dispatch at a time (FIFO);
                            0: unlimited parallelism (the i.i.d. model of eq. 18) */
    int messages;        /* 1: as the hub and workers do it (docs/PROTOCOL.md, "Messages per layer"):
                            a layer's dispatches to one worker travel in one message, the worker
                            computes them back to back as one batch, and their results leave
                            together when the batch ends; a cancel cannot stop a batch that
                            started (it drops a queued one). Needs queueing. */
    int select;          /* MOEX_SELECT_*: which h of the r replicas to use */
    double timeout_ms;   /* per-expert re-dispatch timeout (<= 0: never) */
    int unhealthy_after; /* consecutive timeouts that remove a worker from the pool */
    const moex_worker_fail *fails;
    int n_fails;
    /* Optional replica table [layers][experts][replicas] of worker ids; NULL
     * draws a random placement (r distinct workers per expert) from the seed. */
    const int *placement;
    /* Optional measured routing [route_tokens][layers][k] (moex-hub
     * --routing-trace): token t replays row t % route_tokens instead of k
     * experts drawn uniformly. */
    const int *routes;
    int route_tokens;
    int tokens;
    uint64_t seed;
} moex_token_config;

/* Fills the defaults: Qwen3-30B-A3B-like (L=48, E=128, k=8), 16 workers,
 * r=2, h=1, hub 1.5 ms, RTT 0.5 ms, FFN 0.7 ms sigma 0, queueing on,
 * timeout 500 ms, unhealthy after 3 timeouts, 200 tokens, seed 1. */
void moex_token_config_default(moex_token_config *c);
int moex_token_config_check(const moex_token_config *c, moex_error *err);

typedef struct moex_token_result {
    double mean_ms, p50_ms, p99_ms, min_ms, max_ms, tokens_per_s;
    int tokens_done;
    uint64_t events;
    uint64_t dispatches;     /* dispatch messages sent (incl. hedges, retries) */
    uint64_t cancelled;      /* dispatches cancelled before finishing */
    uint64_t timeouts;       /* expert timeouts that caused a re-dispatch */
    uint64_t lost;           /* dispatches lost to dead workers */
    uint64_t reassigned;     /* re-dispatches to a worker outside the replica set */
    double mean_h;           /* average hedging factor used */
    double queue_wait_ms;    /* mean time a dispatch waited for a busy worker */
    double wasted_work;      /* worker busy time not used by the hub / total busy */
} moex_token_result;

/* Runs the simulation; per_token (optional, tokens entries) receives each
 * token's latency. Fails (with err) only on bad config or when an expert can
 * no longer be served (every worker dead). */
int moex_token_simulate(const moex_token_config *c, moex_token_result *out,
                        double *per_token, moex_error *err);

/* ---- The expert exchange on the wire (sim/exchange.c) ------------------
 * One decode token's time and bytes under three designs (issue 34), in
 * expectation over uniform routing (k of E experts a layer, every expert on
 * one of W workers: r = 1):
 *  - PER_EXPERT (protocol v1, today): a layer sends every (token, expert)
 *    its own DISPATCH (28-byte header, the hidden state in f16, the gate) and
 *    gets a RESULT per expert back; a round trip per layer;
 *  - TOKEN_MAJOR: a layer sends each worker the token's hidden state once
 *    and its (expert id, gate) list (4 bytes an expert), and gets one
 *    gate-weighted partial sum back; a round trip per layer;
 *  - LAYER_RANGES (delegation): worker i holds every expert of layers
 *    [iL/W, (i+1)L/W) and their attention and KV cache; the hidden state goes
 *    hub -> worker 0 -> ... -> worker W-1 -> hub, one hop per range.
 * A layer's work (attention, router, combine) costs hub_ms wherever it runs;
 * an expert's FFN for one token expert_ms on its worker (a worker computes its
 * experts one after another); every message crosses its link at gbps (the
 * hub's link carries all of a layer's messages, one after another) and half
 * the round trip; each exchange adds fixed_ms of software (sockets, wake-ups,
 * framing). */
typedef enum moex_sim_design { MOEX_SIM_PER_EXPERT, MOEX_SIM_TOKEN_MAJOR, MOEX_SIM_LAYER_RANGES } moex_sim_design;

typedef struct moex_exchange_params {
    int layers, hidden, experts, k;    /* the model */
    int workers;
    double rtt_ms, gbps;               /* the network; gbps <= 0: no cap */
    double hub_ms, expert_ms, fixed_ms;
} moex_exchange_params;

typedef struct moex_exchange_result {
    double ms_per_token;
    double bytes_out, bytes_in;        /* a token's bytes a layer, hub -> workers and back (LAYER_RANGES: a token's
                                          whole trip over its hops, divided by the layers) */
    double workers_touched;            /* a layer's distinct workers (W (1 - (1 - 1/W)^k)); LAYER_RANGES: W */
    double max_experts_on_one;         /* E[the most of a layer's k experts on one worker] */
} moex_exchange_result;

/* The bytes of one f16 DISPATCH of one token (header + values + gate), and of its RESULT. */
double moex_exchange_dispatch_bytes(int hidden);
double moex_exchange_result_bytes(int hidden);
/* E[max load] of k distinct experts over W workers (each expert's worker uniform), by a seeded Monte Carlo. */
double moex_exchange_max_load(int k, int workers, uint64_t seed);
int moex_exchange_model(moex_sim_design d, const moex_exchange_params *p, moex_exchange_result *out, moex_error *err);

/* ---- SVG line charts (sim/svg.c) --------------------------------------- */
typedef struct moex_svg_series {
    const char *label;
    const double *x, *y;
    int n;
    int markers_only; /* draw points instead of a line */
} moex_svg_series;

typedef struct moex_svg_chart {
    const char *title, *xlabel, *ylabel;
    int log_x, log_y;
    const moex_svg_series *series;
    int n_series;
} moex_svg_chart;

int moex_svg_write(FILE *f, const moex_svg_chart *c, moex_error *err);
int moex_svg_save(const char *path, const moex_svg_chart *c, moex_error *err);

#endif
