/* The expert exchange's time and bytes per token under the three designs of
 * sim.h (moex_exchange_model): closed forms in expectation, the one expected
 * maximum (the busiest worker's experts) by Monte Carlo. Message sizes follow
 * docs/PROTOCOL.md (f16 on the wire): a DISPATCH of one token is the 28-byte
 * header, hidden f16 values and an f16 gate; its RESULT the header and the
 * values. The token-major message (not in the protocol yet) is the header,
 * the hidden state once and 4 bytes an expert (u16 id, f16 gate); its answer
 * the header and one partial sum. */
#include <math.h>

#include "sim/sim.h"

#define HEADER 28.0

double moex_exchange_dispatch_bytes(int hidden) { return HEADER + 2.0 * hidden + 2.0; }
double moex_exchange_result_bytes(int hidden) { return HEADER + 2.0 * hidden; }

double moex_exchange_max_load(int k, int workers, uint64_t seed) {
    enum { TRIALS = 20000, MAX_W = 4096 };
    if (workers <= 1 || k <= 1) return k < 1 ? 0 : (workers <= 1 ? k : 1);
    int load[MAX_W];
    const int w = workers < MAX_W ? workers : MAX_W;
    moex_rng r;
    moex_rng_seed(&r, seed);
    double sum = 0;
    for (int t = 0; t < TRIALS; t++) {
        for (int i = 0; i < w; i++) load[i] = 0;
        int most = 0;
        for (int e = 0; e < k; e++) {
            const int at = (int)moex_rng_below(&r, (uint32_t)w);
            if (++load[at] > most) most = load[at];
        }
        sum += most;
    }
    return sum / TRIALS;
}

/* Seconds on a link of gbps for n bytes, in ms (no cap: 0). */
static double wire_ms(double bytes, double gbps) { return gbps > 0 ? bytes * 8.0 / (gbps * 1e9) * 1e3 : 0.0; }

int moex_exchange_model(moex_sim_design d, const moex_exchange_params *p, moex_exchange_result *out, moex_error *err) {
    if (p->layers < 1 || p->hidden < 1 || p->experts < 1 || p->k < 1 || p->k > p->experts || p->workers < 1 ||
        p->rtt_ms < 0 || p->hub_ms < 0 || p->expert_ms < 0 || p->fixed_ms < 0)
        return moex_fail(err, "exchange model: bad parameters (layers %d, hidden %d, experts %d, k %d, workers %d)",
                         p->layers, p->hidden, p->experts, p->k, p->workers);
    const double W = p->workers, k = p->k, H = p->hidden;
    *out = (moex_exchange_result){0};
    out->workers_touched = W * (1.0 - pow(1.0 - 1.0 / W, k));
    out->max_experts_on_one = moex_exchange_max_load(p->k, p->workers, 1);
    const double compute = out->max_experts_on_one * p->expert_ms;   /* the busiest worker's experts */
    switch (d) {
    case MOEX_SIM_PER_EXPERT:
        out->bytes_out = k * moex_exchange_dispatch_bytes(p->hidden);
        out->bytes_in = k * moex_exchange_result_bytes(p->hidden);
        break;
    case MOEX_SIM_TOKEN_MAJOR:
        out->bytes_out = out->workers_touched * (HEADER + 2.0 * H) + 4.0 * k;
        out->bytes_in = out->workers_touched * (HEADER + 2.0 * H);
        break;
    case MOEX_SIM_LAYER_RANGES: {
        /* W + 1 hops of one hidden state; each range computes its layers' attention and experts in a row */
        const double hop = HEADER + 2.0 * H, hops = W + 1;
        out->workers_touched = W;
        out->bytes_out = out->bytes_in = hops * hop / p->layers / 2.0;
        out->ms_per_token = p->layers * (p->hub_ms + k * p->expert_ms) +
                            hops * (p->rtt_ms / 2.0 + wire_ms(hop, p->gbps) + p->fixed_ms / 2.0);
        return 0;
    }
    }
    /* a layer: the hub's work, its messages out over its link, the round trip, the busiest worker, the answers in */
    const double layer = p->hub_ms + wire_ms(out->bytes_out, p->gbps) + p->rtt_ms + compute +
                         wire_ms(out->bytes_in, p->gbps) + p->fixed_ms;
    out->ms_per_token = p->layers * layer;
    return 0;
}
