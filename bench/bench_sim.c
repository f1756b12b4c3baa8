/* Simulator throughput (single core): Monte Carlo expert dispatches per
 * second for the hedging model, and events / dispatches per second of the
 * token DES. Usage: bench_sim [trials] [tokens] */
#include "sim/sim.h"

#include <stdio.h>
#include <stdlib.h>

static double bench_mc(int k, int h, uint64_t trials) {
    moex_hedge_model m = {k, h, 20, 0.5};
    moex_hedge_mc mc;
    moex_rng rng;
    moex_error err = {{0}};
    moex_rng_seed(&rng, 1);
    double t0 = moex_time_s();
    if (moex_hedge_monte_carlo(&m, trials, &rng, &mc, &err)) {
        fprintf(stderr, "bench_sim: %s\n", err.msg);
        exit(1);
    }
    double dt = moex_time_s() - t0, rate = (double)mc.dispatches / dt;
    printf("hedging MC k=%d h=%d: %llu trials, %llu dispatches in %.3f s = %.3g dispatches/s (mean %.4f ms)\n", k, h,
           (unsigned long long)trials, (unsigned long long)mc.dispatches, dt, rate, mc.mean);
    return rate;
}

static void bench_des(int tokens, int h, double sigma) {
    moex_token_config c;
    moex_token_config_default(&c);
    c.tokens = tokens;
    c.h = h;
    c.ffn_sigma = sigma;
    moex_token_result r;
    moex_error err = {{0}};
    double t0 = moex_time_s();
    if (moex_token_simulate(&c, &r, NULL, &err)) {
        fprintf(stderr, "bench_sim: %s\n", err.msg);
        exit(1);
    }
    double dt = moex_time_s() - t0;
    printf("token DES L=48 k=8 h=%d sigma=%g: %d tokens, %llu events, %llu dispatches in %.3f s = %.3g events/s, "
           "%.3g dispatches/s, %.0f simulated tokens/s\n",
           h, sigma, tokens, (unsigned long long)r.events, (unsigned long long)r.dispatches, dt, (double)r.events / dt,
           (double)r.dispatches / dt, tokens / dt);
}

int main(int argc, char **argv) {
    uint64_t trials = argc > 1 ? strtoull(argv[1], NULL, 10) : 2000000;
    int tokens = argc > 2 ? atoi(argv[2]) : 2000;
    if (trials < 2 || tokens < 1) {
        fprintf(stderr, "usage: bench_sim [trials >= 2] [tokens >= 1]\n");
        return 2;
    }
    bench_mc(8, 1, trials);
    bench_mc(8, 2, trials);
    bench_mc(8, 4, trials);
    bench_des(tokens, 1, 0.5);
    bench_des(tokens, 2, 0.5);
    return 0;
}
