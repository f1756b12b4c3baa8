/* Unit tests of the sim module: quadrature against closed forms, quantiles,
 * Monte Carlo against its confidence interval, and properties of the
 * per-token discrete-event simulation. */
#include "proto/proto.h"
#include "sim/sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond, ...)                                              \
    do {                                                              \
        if (!(cond)) {                                                \
            failures++;                                               \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);      \
            fprintf(stderr, __VA_ARGS__);                             \
            fputc('\n', stderr);                                      \
        }                                                             \
    } while (0)

static double rel(double a, double b) { return fabs(a - b) / fabs(b); }

static double expect(int k, int h, double median, double sigma) {
    moex_hedge_model m = {k, h, median, sigma};
    moex_error err = {{0}};
    double e = NAN;
    CHECK(moex_hedge_expect(&m, &e, &err) == 0, "expect failed: %s", err.msg);
    return e;
}

static double std_normal_cdf(double x) { return 0.5 * erfc(-x / M_SQRT2); }

/* k = 1: E[T] = e^(mu + s^2/2); E[min of 2] = 2 e^(mu + s^2/2) (1 - Phi(s/sqrt2)),
 * since E[max of 2] = 2 e^(mu + s^2/2) Phi(s/sqrt2). */
static void test_closed_forms(void) {
    const double sigmas[] = {0.05, 0.3, 0.5, 1.0, 1.5, 2.5};
    for (size_t i = 0; i < sizeof sigmas / sizeof *sigmas; i++) {
        double s = sigmas[i], mean = 20 * exp(0.5 * s * s);
        double e1 = expect(1, 1, 20, s), e_min2 = expect(1, 2, 20, s), e_max2 = expect(2, 1, 20, s);
        CHECK(rel(e1, mean) < 1e-9, "k=1 h=1 sigma=%g: %.12g vs %.12g", s, e1, mean);
        double want_min2 = 2 * mean * (1 - std_normal_cdf(s / M_SQRT2));
        double want_max2 = 2 * mean * std_normal_cdf(s / M_SQRT2);
        CHECK(rel(e_min2, want_min2) < 1e-9, "min of 2, sigma=%g: %.12g vs %.12g", s, e_min2, want_min2);
        CHECK(rel(e_max2, want_max2) < 1e-9, "max of 2, sigma=%g: %.12g vs %.12g", s, e_max2, want_max2);
    }
}

static void test_limits_and_monotonicity(void) {
    CHECK(expect(8, 3, 20, 0) == 20, "sigma 0 must give the median exactly");
    CHECK(rel(expect(8, 1, 20, 1e-5), 20) < 1e-3, "sigma -> 0 must approach the median: %.9g", expect(8, 1, 20, 1e-5));
    const double sigmas[] = {0.1, 0.5, 1.5};
    for (size_t i = 0; i < 3; i++)
        for (int k = 1; k <= 64; k *= 4) {
            double prev = INFINITY;
            for (int h = 1; h <= 6; h++) {
                double e = expect(k, h, 5, sigmas[i]);
                CHECK(e < prev, "E must fall as h grows: k=%d h=%d sigma=%g %.9g >= %.9g", k, h, sigmas[i], e, prev);
                CHECK(e < expect(k * 2, h, 5, sigmas[i]), "E must grow with k: k=%d h=%d", k, h);
                prev = e;
            }
        }
}

static void test_quantiles(void) {
    moex_error err = {{0}};
    moex_hedge_model one = {1, 1, 20, 0.5};
    double q;
    CHECK(moex_hedge_quantile(&one, 0.5, &q, &err) == 0 && rel(q, 20) < 1e-12, "median of k=h=1: %.12g", q);
    CHECK(moex_hedge_quantile(&one, 0.99, &q, &err) == 0 && rel(q, 20 * exp(0.5 * 2.3263478740408408)) < 1e-10,
          "p99 of k=h=1: %.12g", q);
    const int ks[] = {1, 8, 100}, hs[] = {1, 2, 4};
    const double ps[] = {0.01, 0.5, 0.99, 0.9999};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 4; c++) {
                moex_hedge_model m = {ks[a], hs[b], 3, 1.2};
                CHECK(moex_hedge_quantile(&m, ps[c], &q, &err) == 0, "quantile: %s", err.msg);
                double s = moex_hedge_survival(&m, q);
                CHECK(fabs(s - (1 - ps[c])) < 1e-9 * fmax(1, 1 / (1 - ps[c])), "S(q_p) = 1-p: k=%d h=%d p=%g S=%.12g",
                      ks[a], hs[b], ps[c], s);
            }
    CHECK(moex_hedge_quantile(&one, 1.0, &q, &err) == -1 && strstr(err.msg, "quantile"), "p=1 must be rejected");
}

/* Monte Carlo must lie within mean +- 3 standard errors of eq. 18, and its
 * quantiles close to the analytic ones. */
static void test_monte_carlo(void) {
    const moex_hedge_model ms[] = {{8, 1, 20, 0.5}, {8, 2, 20, 0.5}, {8, 4, 20, 0.5}, {4, 3, 1, 1.5}, {32, 2, 0.7, 1.0}};
    moex_rng rng;
    moex_rng_seed(&rng, 42);
    for (size_t i = 0; i < sizeof ms / sizeof *ms; i++) {
        moex_error err = {{0}};
        moex_hedge_mc mc;
        double e = expect(ms[i].k, ms[i].h, ms[i].median, ms[i].sigma), p50, p99;
        CHECK(moex_hedge_monte_carlo(&ms[i], 400000, &rng, &mc, &err) == 0, "mc: %s", err.msg);
        CHECK(fabs(mc.mean - e) <= 3 * mc.stderr_, "MC %.6g +- %.3g (3se) vs eq.18 %.6g (k=%d h=%d s=%g)", mc.mean,
              3 * mc.stderr_, e, ms[i].k, ms[i].h, ms[i].sigma);
        CHECK(mc.dispatches == 400000ULL * ms[i].k * ms[i].h, "dispatch count");
        moex_hedge_quantile(&ms[i], 0.5, &p50, &err);
        moex_hedge_quantile(&ms[i], 0.99, &p99, &err);
        CHECK(rel(mc.p50, p50) < 0.01 && rel(mc.p99, p99) < 0.03, "MC quantiles %.5g/%.5g vs %.5g/%.5g", mc.p50, mc.p99,
              p50, p99);
    }
}

static void test_bad_input(void) {
    moex_error err = {{0}};
    double e;
    moex_hedge_model bad[] = {{0, 1, 20, 0.5}, {8, 0, 20, 0.5}, {8, 1, -1, 0.5}, {8, 1, 20, -0.1}, {8, 1, NAN, 0.5}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err.msg[0] = 0;
        CHECK(moex_hedge_expect(&bad[i], &e, &err) == -1 && err.msg[0], "bad model %zu must be rejected", i);
    }
}

static void test_stats(void) {
    double v[101];
    for (int i = 0; i < 101; i++) v[i] = (double)((i * 37) % 101); /* a permutation of 0..100 */
    CHECK(moex_quantile(v, 101, 0.5) == 50, "median of 0..100");
    CHECK(fabs(moex_quantile(v, 101, 0.99) - 99) < 1e-12, "p99 of 0..100");
    double w[4] = {4, 1, 3, 2};
    CHECK(fabs(moex_quantile(w, 4, 0.5) - 2.5) < 1e-12, "median of 1..4 interpolates");
    moex_rng r;
    moex_rng_seed(&r, 7);
    /* Normal moments and tail frequencies (the ziggurat's base strip ends at
     * 3.44: beyond it the tail sampler runs). Bounds are ~5 standard errors. */
    const int n = 2000000;
    double s = 0, ss = 0;
    int above1 = 0, above3 = 0, above4 = 0;
    for (int i = 0; i < n; i++) {
        double z = moex_rng_normal(&r);
        s += z, ss += z * z;
        above1 += z > 1, above3 += fabs(z) > 3.5, above4 += z < -4;
    }
    CHECK(fabs(s / n) < 0.004 && fabs(ss / n - 1) < 0.005, "normal moments %g %g", s / n, ss / n);
    CHECK(fabs(above1 - n * 0.15865525393145707) < 5 * sqrt(n * 0.1587 * 0.8413), "P(z>1): %d", above1);
    CHECK(fabs(above3 - n * 4.6525816e-4) < 5 * sqrt(n * 4.65e-4), "P(|z|>3.5): %d", above3);
    CHECK(fabs(above4 - n * 3.1671242e-5) < 5 * sqrt(n * 3.17e-5), "P(z<-4): %d", above4);
}

/* ---- token DES ---- */

static moex_token_config small_config(void) {
    moex_token_config c;
    moex_token_config_default(&c);
    c.layers = 12;
    c.tokens = 50;
    return c;
}

static moex_token_result simulate(const moex_token_config *c, double *per_token) {
    moex_token_result r;
    moex_error err = {{0}};
    memset(&r, 0, sizeof r);
    CHECK(moex_token_simulate(c, &r, per_token, &err) == 0, "simulate: %s", err.msg);
    return r;
}

/* Zero variance and no contention: every token takes exactly L*(hub+RTT+FFN). */
static void test_token_deterministic(void) {
    int placement[12 * 8 * 2];
    for (int l = 0; l < 12; l++)
        for (int e = 0; e < 8; e++)
            for (int j = 0; j < 2; j++) placement[(l * 8 + e) * 2 + j] = 2 * e + j; /* experts never share a worker */
    for (int h = 1; h <= 2; h++)
        for (int queueing = 0; queueing <= 1; queueing++) {
            moex_token_config c = small_config();
            c.experts = 8;
            c.h = h;
            c.queueing = queueing;
            c.placement = placement;
            c.hub_ms = 1.5, c.rtt_ms = 2.0, c.ffn_median = 0.7;
            moex_token_result r = simulate(&c, NULL);
            double want = 12 * (1.5 + 2.0 + 0.7);
            CHECK(r.tokens_done == 50, "tokens done %d", r.tokens_done);
            CHECK(rel(r.mean_ms, want) < 1e-12 && rel(r.max_ms, want) < 1e-12 && rel(r.min_ms, want) < 1e-12,
                  "h=%d queueing=%d: mean %.12g max %.12g want %.12g", h, queueing, r.mean_ms, r.max_ms, want);
            CHECK(rel(r.mean_h, h) < 1e-12 && r.dispatches == (uint64_t)50 * 12 * 8 * h, "dispatch count");
        }
    /* With random placement some experts share a worker: single-slot queueing
     * can only add time. */
    moex_token_config c = small_config();
    moex_token_result r = simulate(&c, NULL);
    double want = 12 * (1.5 + 0.5 + 0.7);
    CHECK(r.min_ms >= want - 1e-9 && r.mean_ms > want && r.queue_wait_ms > 0, "contention: %.6g vs %.6g", r.mean_ms,
          want);
}

/* Without queueing the DES is the i.i.d. model: its mean must agree with
 * L * (hub + RTT + E[max-min FFN]) within the statistical error. */
static void test_token_matches_eq18(void) {
    for (int h = 1; h <= 3; h++) {
        moex_token_config c = small_config();
        c.replicas = 3, c.h = h, c.queueing = 0, c.ffn_sigma = 0.8, c.tokens = 400;
        double per[400];
        moex_token_result r = simulate(&c, per);
        double want = c.layers * (c.hub_ms + c.rtt_ms + expect(c.k, h, c.ffn_median, c.ffn_sigma));
        double se = moex_stderr(per, 400);
        CHECK(fabs(r.mean_ms - want) < 4 * se, "h=%d: DES %.6g vs eq.12/18 %.6g (4se %.3g)", h, r.mean_ms, want, 4 * se);
    }
}

static void test_token_failures(void) {
    moex_token_config c = small_config();
    moex_worker_fail fails[] = {{0, 50}, {3, 80}, {5, 80}, {9, 400}, {15, 1000}};
    c.fails = fails, c.n_fails = 5;
    c.timeout_ms = 100;
    for (int h = 1; h <= 2; h++) {
        c.h = h;
        double per[50];
        moex_token_result r = simulate(&c, per);
        CHECK(r.tokens_done == 50, "h=%d: every token must complete despite failures (%d)", h, r.tokens_done);
        CHECK(r.lost > 0, "h=%d: dispatches to dead workers must be lost", h);
        if (h == 1) CHECK(r.timeouts > 0 && r.max_ms >= 100, "h=1 must time out and re-dispatch");
        for (int i = 0; i < 50; i++) CHECK(per[i] >= 12 * 2.7 - 1e-9, "token %d too fast: %g", i, per[i]);
    }
    /* Every worker dead: a clear error, not a hang. */
    moex_worker_fail all[16];
    for (int w = 0; w < 16; w++) all[w] = (moex_worker_fail){w, 10};
    c.fails = all, c.n_fails = 16, c.h = 1;
    moex_token_result r;
    moex_error err = {{0}};
    CHECK(moex_token_simulate(&c, &r, NULL, &err) == -1 && strstr(err.msg, "could not be served"), "all dead: '%s'",
          err.msg);
}

static void test_token_hedging_and_speed(void) {
    moex_token_config c = small_config();
    c.ffn_sigma = 1.0, c.replicas = 3;
    c.h = 1;
    moex_token_result h1 = simulate(&c, NULL);
    c.h = 2;
    moex_token_result h2 = simulate(&c, NULL);
    CHECK(h2.mean_ms < h1.mean_ms, "hedging must help at sigma 1: %g vs %g", h2.mean_ms, h1.mean_ms);
    CHECK(h2.cancelled > 0 && h1.cancelled == 0, "only hedged runs cancel");
    CHECK(h2.wasted_work > 0 && h2.wasted_work < 1 && h1.wasted_work == 0, "wasted work %g %g", h1.wasted_work,
          h2.wasted_work);

    /* Two very slow workers: latency rises; choosing the fastest replica avoids them. */
    double speed[16];
    for (int w = 0; w < 16; w++) speed[w] = w < 2 ? 20.0 : 1.0;
    moex_token_config s = small_config();
    moex_token_result base = simulate(&s, NULL);
    s.speed = speed;
    moex_token_result slow = simulate(&s, NULL);
    s.select = MOEX_SELECT_FASTEST;
    moex_token_result fast = simulate(&s, NULL);
    CHECK(slow.mean_ms > base.mean_ms + 1, "slow workers must cost time: %g vs %g", slow.mean_ms, base.mean_ms);
    CHECK(fast.mean_ms < slow.mean_ms, "fastest-first must beat random with slow workers: %g vs %g", fast.mean_ms,
          slow.mean_ms);

    /* FFN times drawn from a trace: with no contention each layer costs
     * hub + RTT + max of k trace draws, so {0.7} gives L*(hub+RTT+0.7) and
     * {0.2, 0.7} lies between the two fixed values. */
    int placement[12 * 8 * 2];
    for (int i = 0; i < 12 * 8 * 2; i++) placement[i] = i % 16;
    double trace[] = {0.7, 0.2};
    moex_token_config t = small_config();
    t.experts = 8, t.placement = placement, t.ffn_median = 123;
    t.trace = trace, t.trace_len = 1;
    moex_token_result one = simulate(&t, NULL);
    CHECK(rel(one.mean_ms, 12 * 2.7) < 1e-12, "trace {0.7}: %.12g", one.mean_ms);
    t.trace_len = 2;
    moex_token_result two = simulate(&t, NULL);
    CHECK(two.mean_ms < 12 * 2.7 && two.mean_ms > 12 * 2.2 && two.max_ms <= 12 * 2.7 + 1e-9, "trace {0.7,0.2}: %.9g",
          two.mean_ms);
}


/* --messages: a layer's dispatches to a worker travel together, run back to
 * back as one batch and return together; a cancel cannot stop a batch. */
static void test_token_messages(void) {
    /* One worker holding every expert: both models cost hub + RTT + k x FFN a layer. */
    int one[12 * 8];
    memset(one, 0, sizeof one);
    for (int messages = 0; messages <= 1; messages++) {
        moex_token_config c = small_config();
        c.experts = 8, c.k = 4, c.workers = 1, c.replicas = 1, c.placement = one, c.messages = messages;
        c.hub_ms = 1.5, c.rtt_ms = 2.0, c.ffn_median = 0.7;
        moex_token_result r = simulate(&c, NULL);
        const double want = 12 * (1.5 + 2.0 + 4 * 0.7);
        CHECK(rel(r.mean_ms, want) < 1e-12 && rel(r.max_ms, want) < 1e-12, "messages=%d one worker: %.12g want %.12g",
              messages, r.mean_ms, want);
    }
    /* Hedged on two workers, one ten times slower: per dispatch, the winner's
     * cancel stops the slow copy; as batches, nothing stops it, so the slow
     * worker does all its work and cancels only drop what is still queued. */
    double speed[2] = {1.0, 10.0};
    int both[12 * 8 * 2];
    for (int i = 0; i < 12 * 8; i++) both[2 * i] = 0, both[2 * i + 1] = 1;
    moex_token_config c = small_config();
    c.experts = 8, c.k = 2, c.workers = 2, c.replicas = 2, c.h = 2, c.placement = both, c.speed = speed;
    c.hub_ms = 0.1, c.rtt_ms = 0.2, c.ffn_median = 1.0, c.timeout_ms = 0;
    moex_token_result per_dispatch = simulate(&c, NULL);
    c.messages = 1;
    moex_token_result batched = simulate(&c, NULL);
    CHECK(per_dispatch.tokens_done == 50 && batched.tokens_done == 50, "both complete");
    CHECK(batched.wasted_work > per_dispatch.wasted_work, "a batch cannot be stopped: wasted %.3g vs %.3g",
          batched.wasted_work, per_dispatch.wasted_work);
    CHECK(batched.queue_wait_ms > per_dispatch.queue_wait_ms, "the slow worker's queue grows: %.3g vs %.3g ms",
          batched.queue_wait_ms, per_dispatch.queue_wait_ms);
    moex_token_config bad = small_config();
    bad.messages = 1, bad.queueing = 0;
    moex_token_result r;
    moex_error err = {{0}};
    CHECK(moex_token_simulate(&bad, &r, NULL, &err) == -1 && strstr(err.msg, "queueing"), "messages needs queueing: '%s'",
          err.msg);
}

static void test_token_adaptive(void) {
    moex_token_config c = small_config();
    c.adaptive = 1, c.replicas = 3, c.h_max = 3, c.queueing = 0, c.tokens = 100;
    c.ffn_sigma = 1.2, c.h = 1;
    moex_token_result noisy = simulate(&c, NULL);
    CHECK(noisy.mean_h > 1.5, "adaptive must hedge a heavy tail: mean h %g", noisy.mean_h);
    c.ffn_sigma = 0, c.h = 3;
    moex_token_result calm = simulate(&c, NULL);
    CHECK(calm.mean_h < 2.0, "adaptive must stop hedging with no tail: mean h %g", calm.mean_h);
}

static void test_token_bad_config(void) {
    moex_token_config c = small_config();
    moex_error err = {{0}};
    moex_token_result r;
    c.h = 3; /* replicas = 2 */
    CHECK(moex_token_simulate(&c, &r, NULL, &err) == -1 && strstr(err.msg, "h must be"), "h > r: '%s'", err.msg);
    c = small_config();
    c.k = 500;
    CHECK(moex_token_simulate(&c, &r, NULL, &err) == -1 && strstr(err.msg, "k must be"), "k > E: '%s'", err.msg);
    c = small_config();
    c.rtt_ms = -1;
    CHECK(moex_token_simulate(&c, &r, NULL, &err) == -1 && strstr(err.msg, "RTT"), "negative RTT: '%s'", err.msg);
    moex_worker_fail f = {99, 1};
    c = small_config();
    c.fails = &f, c.n_fails = 1;
    CHECK(moex_token_simulate(&c, &r, NULL, &err) == -1 && strstr(err.msg, "worker 99"), "bad fail: '%s'", err.msg);
}

/* The exchange model: its message sizes are the protocol's own frames (proto/ encodes them), the expected
 * distinct workers and busiest worker against counting, and the designs' limits. */
static void test_exchange(void) {
    const int hiddens[] = {256, 2048, 4096};
    for (int i = 0; i < 3; i++) {
        moex_proto_tensor_msg d = {.type = MOEX_MSG_DISPATCH, .n_tokens = 1, .hidden = (uint16_t)hiddens[i],
                                   .dtype = MOEX_DT_F16};
        moex_proto_tensor_msg r = d;
        r.type = MOEX_MSG_RESULT;
        CHECK(moex_exchange_dispatch_bytes(hiddens[i]) == (double)moex_proto_tensor_frame_bytes(&d) &&
                  moex_exchange_result_bytes(hiddens[i]) == (double)moex_proto_tensor_frame_bytes(&r),
              "exchange: one token's DISPATCH / RESULT bytes are the protocol's (hidden %d)", hiddens[i]);
    }
    /* E[max load] of 8 experts on 4 workers by exact enumeration of the 4^8 placements */
    double exact = 0;
    for (int code = 0; code < 65536; code++) {
        int load[4] = {0}, most = 0;
        for (int e = 0, c = code; e < 8; e++, c >>= 2) most = ++load[c & 3] > most ? load[c & 3] : most;
        exact += most;
    }
    exact /= 65536;
    const double mc = moex_exchange_max_load(8, 4, 7);
    CHECK(fabs(mc - exact) < 0.02, "exchange: E[max load] 8 on 4 by Monte Carlo %.4f, exactly %.4f", mc, exact);
    moex_exchange_params p = {.layers = 48, .hidden = 2048, .experts = 128, .k = 8, .workers = 4, .rtt_ms = 0.5,
                              .gbps = 0, .hub_ms = 0.25, .expert_ms = 0.05, .fixed_ms = 0.1};
    moex_exchange_result pe, tm, lr;
    moex_error err = {{0}};
    CHECK(!moex_exchange_model(MOEX_SIM_PER_EXPERT, &p, &pe, &err) && !moex_exchange_model(MOEX_SIM_TOKEN_MAJOR, &p, &tm,
                                                                                           &err) &&
              !moex_exchange_model(MOEX_SIM_LAYER_RANGES, &p, &lr, &err), "exchange: %s", err.msg);
    CHECK(fabs(pe.workers_touched - 4 * (1 - pow(0.75, 8))) < 1e-12, "exchange: distinct workers W (1 - (1 - 1/W)^k)");
    CHECK(fabs(pe.ms_per_token - tm.ms_per_token) < 1e-9, "exchange: without a bandwidth cap both round-trip designs cost "
                                                           "the same");
    CHECK(tm.bytes_out < 0.5 * pe.bytes_out && tm.bytes_in < 0.5 * pe.bytes_in,
          "exchange: token-major sends the hidden state once a worker: %.0f / %.0f bytes", tm.bytes_out, pe.bytes_out);
    const double per_layer = 0.25 + 0.5 + pe.max_experts_on_one * 0.05 + 0.1;
    CHECK(fabs(pe.ms_per_token - 48 * per_layer) < 1e-9, "exchange: per-expert = layers x (hub + rtt + busiest + fixed)");
    CHECK(fabs(lr.ms_per_token - (48 * (0.25 + 8 * 0.05) + 5 * (0.25 + 0.05))) < 1e-9,
          "exchange: layer ranges = layers x (attention + k experts) + (W + 1) hops of half a round trip");
    p.gbps = 1;
    moex_exchange_result pe1, tm1;
    moex_exchange_model(MOEX_SIM_PER_EXPERT, &p, &pe1, &err);
    moex_exchange_model(MOEX_SIM_TOKEN_MAJOR, &p, &tm1, &err);
    CHECK(fabs(pe1.ms_per_token - pe.ms_per_token - 48 * (pe.bytes_out + pe.bytes_in) * 8 / 1e9 * 1e3) < 1e-9 &&
              tm1.ms_per_token < pe1.ms_per_token, "exchange: a 1 Gb/s cap adds the bytes' time, less for token-major");
    p.k = 0;
    CHECK(moex_exchange_model(MOEX_SIM_PER_EXPERT, &p, &pe, &err) != 0, "exchange: bad parameters refused");
}

int main(void) {
    test_exchange();
    test_closed_forms();
    test_limits_and_monotonicity();
    test_quantiles();
    test_monte_carlo();
    test_bad_input();
    test_stats();
    test_token_deterministic();
    test_token_matches_eq18();
    test_token_failures();
    test_token_hedging_and_speed();
    test_token_messages();
    test_token_adaptive();
    test_token_bad_config();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    puts("test_sim: all checks passed");
    return 0;
}
