/* Benchmark of placement (figures for docs/PERF.md; not a test):
 * build time, lookup rate, diff time and balance for a few cluster sizes.
 *
 *   bench_placement [layers experts replicas] */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "placement/placement.h"

static volatile uint32_t sink;

int main(int argc, char **argv) {
    uint32_t layers = 48, experts = 128, r = 2;
    if (argc == 4) layers = (uint32_t)atoi(argv[1]), experts = (uint32_t)atoi(argv[2]), r = (uint32_t)atoi(argv[3]);
    printf("%u layers x %u experts, r=%u\n", layers, experts, r);
    printf("%8s %10s %12s %10s %10s %12s\n", "workers", "build ms", "lookup ns", "max/mean", "diff ms", "join moves");
    static const uint32_t sizes[] = {4, 16, 64, 256};
    for (int s = 0; s < 4; s++) {
        uint32_t n = sizes[s];
        if (n < r) continue;
        moex_worker_spec *w = malloc(sizeof *w * (n + 1));
        for (uint32_t i = 0; i <= n; i++) w[i] = (moex_worker_spec){1000 + i, 1.0f};
        moex_placement_config cfg = {.n_layers = layers, .n_experts = experts, .replicas = r};
        moex_error err;
        double t0 = moex_time_s();
        moex_placement *p = moex_placement_build(w, n, &cfg, &err);
        double t_build = moex_time_s() - t0;
        if (!p) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        long lookups = 0;
        t0 = moex_time_s();
        for (int rep = 0; rep < 20; rep++)
            for (uint32_t l = 0; l < layers; l++)
                for (uint32_t e = 0; e < experts; e++, lookups++) sink = moex_placement_lookup(p, l, e)[0];
        double t_look = (moex_time_s() - t0) / lookups;
        double mx = 0, sum = 0;
        for (uint32_t i = 0; i < n; i++) {
            double ld = (double)moex_placement_load(p, w[i].id);
            sum += ld;
            if (ld > mx) mx = ld;
        }
        moex_placement *q = moex_placement_build(w, n + 1, &cfg, &err);
        moex_placement_diff d;
        t0 = moex_time_s();
        moex_placement_diff_build(p, q, &d, &err);
        double t_diff = moex_time_s() - t0;
        printf("%8u %10.2f %12.1f %10.3f %10.2f %11.2f%%\n", n, t_build * 1e3, t_look * 1e9, mx / (sum / n),
               t_diff * 1e3, 100.0 * d.moved / ((double)layers * experts * r));
        moex_placement_diff_free(&d);
        moex_placement_free(p);
        moex_placement_free(q);
        free(w);
    }
    return 0;
}
