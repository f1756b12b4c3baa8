/* moex-sim exchange: a decode token's time and bytes on the wire under the
 * three designs of the expert exchange (sim.h, moex_exchange_model), over
 * round trips and link speeds, for a model's shape. */
#include "sim/main.h"

#include <string.h>

static const char *HELP =
    "usage: moex-sim exchange [flags]\n"
    "  --shape S        30b (Qwen3-30B-A3B: 48 layers, hidden 2048, 128 experts, k 8; default) or\n"
    "                   235b (Qwen3-235B-A22B: 94 layers, hidden 4096, 128 experts, k 8)\n"
    "  --layers N --hidden N --experts N --k N   override the shape\n"
    "  --workers W      workers (4)\n"
    "  --rtt-ms 0.1,0.5,2   round trips\n"
    "  --gbps 1,10      link speeds (0: no cap)\n"
    "  --hub-ms X       a layer's attention + router + combine (0.25: the H200 hub's measured segment)\n"
    "  --expert-ms X    one token's expert FFN on a worker (0.05)\n"
    "  --fixed-ms X     software a round trip adds: sockets, wake-ups, framing (0.1)\n"
    "  --format F       table (default) or csv\n"
    "designs: per-expert (protocol v1: a DISPATCH and a RESULT per expert, a round trip a layer),\n"
    "token-major (the hidden state once a worker, one partial sum back), layer-ranges (a worker\n"
    "holds whole layers and their attention: one hop a range). bytes: a token's, a layer.\n";

typedef struct exchange_opts {
    moex_exchange_params p;
    double rtt[MOEX_SIM_MAX_LIST], gbps[MOEX_SIM_MAX_LIST];
    int n_rtt, n_gbps, format;
    const char *shape;
} exchange_opts;

static int set_shape(exchange_opts *o, const char *s, moex_error *err) {
    if (!strcmp(s, "30b")) o->p.layers = 48, o->p.hidden = 2048, o->p.experts = 128, o->p.k = 8;
    else if (!strcmp(s, "235b")) o->p.layers = 94, o->p.hidden = 4096, o->p.experts = 128, o->p.k = 8;
    else return moex_fail(err, "--shape: 30b or 235b, got '%s'", s);
    o->shape = s;
    return 0;
}

static int parse(int argc, char **argv, exchange_opts *o, int *help, moex_error *err) {
    *o = (exchange_opts){.p = {.workers = 4, .hub_ms = 0.25, .expert_ms = 0.05, .fixed_ms = 0.1},
                         .rtt = {0.1, 0.5, 2}, .n_rtt = 3, .gbps = {1, 10}, .n_gbps = 2};
    if (set_shape(o, "30b", err)) return -1;
    args a = {argc, 0, argv};
    const char *f, *v;
    long n;
    while (!args_next_flag(&a, &f, err) && f) {
        if (!strcmp(f, "help")) *help = 1;
        else if (!strcmp(f, "shape")) {
            if (args_value(&a, f, &v, err) || set_shape(o, v, err)) return -1;
        } else if (!strcmp(f, "layers") || !strcmp(f, "hidden") || !strcmp(f, "experts") || !strcmp(f, "k") ||
                   !strcmp(f, "workers")) {
            if (args_int(&a, f, 1, 1 << 20, &n, err)) return -1;
            int *dst = !strcmp(f, "layers") ? &o->p.layers : !strcmp(f, "hidden") ? &o->p.hidden
                     : !strcmp(f, "experts") ? &o->p.experts : !strcmp(f, "k") ? &o->p.k : &o->p.workers;
            *dst = (int)n;
            o->shape = "custom";
        } else if (!strcmp(f, "rtt-ms")) {
            if (args_double_list(&a, f, 0, 1e6, o->rtt, &o->n_rtt, err)) return -1;
        } else if (!strcmp(f, "gbps")) {
            if (args_double_list(&a, f, 0, 1e6, o->gbps, &o->n_gbps, err)) return -1;
        } else if (!strcmp(f, "hub-ms")) {
            if (args_double(&a, f, 0, 1e6, &o->p.hub_ms, err)) return -1;
        } else if (!strcmp(f, "expert-ms")) {
            if (args_double(&a, f, 0, 1e6, &o->p.expert_ms, err)) return -1;
        } else if (!strcmp(f, "fixed-ms")) {
            if (args_double(&a, f, 0, 1e6, &o->p.fixed_ms, err)) return -1;
        } else if (!strcmp(f, "format")) {
            if (args_format(&a, &o->format, err)) return -1;
        } else return moex_fail(err, "unknown flag --%s", f);
    }
    if (o->p.k > o->p.experts) return moex_fail(err, "--k %d is more than --experts %d", o->p.k, o->p.experts);
    return err->msg[0] ? -1 : 0;
}

int sim_cmd_exchange(int argc, char **argv) {
    exchange_opts o;
    moex_error err = {{0}};
    int help = 0;
    if (parse(argc, argv, &o, &help, &err)) return sim_usage_error("exchange", &err);
    if (help) {
        fputs(HELP, stdout);
        return 0;
    }
    static const char *const names[] = {"per-expert", "token-major", "layer-ranges"};
    if (o.format == FORMAT_CSV)
        puts("design,rtt_ms,gbps,ms_per_token,tok_s,bytes_out,bytes_in,workers_touched");
    else
        printf("shape %s: %d layers, hidden %d, %d experts, k %d; %d workers; hub %g ms, expert %g ms, fixed %g ms\n"
               "%-13s %7s %6s %12s %8s %10s %10s %8s\n",
               o.shape, o.p.layers, o.p.hidden, o.p.experts, o.p.k, o.p.workers, o.p.hub_ms, o.p.expert_ms,
               o.p.fixed_ms, "design", "rtt_ms", "gbps", "ms/token", "tok/s", "bytes_out", "bytes_in", "touched");
    for (int d = 0; d < 3; d++)
        for (int i = 0; i < o.n_rtt; i++)
            for (int g = 0; g < o.n_gbps; g++) {
                moex_exchange_params p = o.p;
                p.rtt_ms = o.rtt[i];
                p.gbps = o.gbps[g];
                moex_exchange_result r;
                if (moex_exchange_model((moex_sim_design)d, &p, &r, &err)) return sim_usage_error("exchange", &err);
                if (o.format == FORMAT_CSV)
                    printf("%s,%g,%g,%.6g,%.6g,%.1f,%.1f,%.4f\n", names[d], p.rtt_ms, p.gbps, r.ms_per_token,
                           1000.0 / r.ms_per_token, r.bytes_out, r.bytes_in, r.workers_touched);
                else
                    printf("%-13s %7g %6g %12.2f %8.1f %10.0f %10.0f %8.2f\n", names[d], p.rtt_ms, p.gbps,
                           r.ms_per_token, 1000.0 / r.ms_per_token, r.bytes_out, r.bytes_in, r.workers_touched);
            }
    return 0;
}
