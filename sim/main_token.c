/* moex-sim token: per-token latency by discrete-event simulation, over a grid
 * of network RTTs and hedging factors, next to the closed-form eq. 12. */
#include "sim/main.h"

#include "placement/placement.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *HELP =
    "usage: moex-sim token [flags]\n"
    "  --layers L          layers (48)              --experts E   experts per layer (128)\n"
    "  --k K               active experts (8)       --workers W   workers (16)\n"
    "  --replicas R        copies of each expert (2; 3 with --table3)\n"
    "  --h 1,2,3           hedging factors to run (each <= R)\n"
    "  --adaptive          choose h per layer from the observed p99/p50 of expert\n"
    "                      latency (start at --h, at most --h-max, step per --tail-ratio)\n"
    "  --h-max H (R)       --tail-ratio X (2.0)\n"
    "  --hub-ms T          hub compute per layer: attention+router+combine (1.5)\n"
    "  --rtt-ms 0.5,2,...  network round trips to run; each way costs rtt/2 (0.5)\n"
    "  --rtt-sigma S       log-normal jitter of each one-way trip (0)\n"
    "  --ffn-ms M          worker FFN median (0.7)  --ffn-sigma S  its log-normal sigma (0)\n"
    "  --trace FILE        sample FFN times (ms, whitespace/comma separated, # comments) from FILE\n"
    "  --speed i:x,...     worker i's FFN time is multiplied by x (heterogeneous workers)\n"
    "  --fail i@ms,...     worker i dies at simulated time ms\n"
    "  --timeout-ms T      re-dispatch an expert after T ms without a result (500; 0 = never)\n"
    "  --unhealthy-after N consecutive timeouts before a worker leaves the pool (3)\n"
    "  --no-queueing       workers run any number of dispatches at once (eq. 18's i.i.d. model)\n"
    "  --messages          one message per worker per layer, computed as one batch whose results\n"
    "                      return together and which a cancel cannot stop (what moex-hub does)\n"
    "  --select P          random (default) or fastest replicas first\n"
    "  --ring              place experts with the consistent-hash ring (placement module)\n"
    "                      instead of r distinct random workers per expert\n"
    "  --route-trace FILE  replay measured routing (moex-hub --routing-trace) instead of k uniform\n"
    "                      experts per layer; sets --layers, --experts and --k from the trace\n"
    "  --place-by-load     with --route-trace: spread replicas by the trace's expert loads\n"
    "  --tokens N (200)    --seed X (1)    --format table|csv    --svg FILE\n"
    "  --table3            the paper's Table 3 grid: RTT 0.5,2,10,50 x h 1,2,3 (R=3)\n"
    "eq12_ms = L * (hub + rtt + E[max_k min_h FFN]) from eq. 18; exact without queueing,\n"
    "jitter, heterogeneity or failures.\n";

typedef struct token_opts {
    moex_token_config c;
    long h[MOEX_SIM_MAX_LIST];
    int n_h;
    double rtt[MOEX_SIM_MAX_LIST];
    int n_rtt;
    int format, table3, h_max_set, replicas_set, ring, place_by_load;
    const char *routes_path;
    sim_routes routes;
    int *placement;
    const char *svg, *trace_path;
    double *trace, *speed;
    moex_worker_fail fails[MOEX_SIM_MAX_LIST];
    char speed_spec[1024];
} token_opts;

/* ---- flag parsing ---- */

static int read_trace(const char *path, double **out, int *n, moex_error *err) {
    FILE *f = fopen(path, "r");
    if (!f) return moex_fail(err, "--trace: cannot open %s: %s", path, strerror(errno));
    int cap = 1024, len = 0, rc = 0;
    double *v = malloc((size_t)cap * sizeof *v);
    char line[512];
    for (int lineno = 1; v && !rc && fgets(line, sizeof line, f); lineno++) {
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        for (char *tok = strtok(line, " \t\r\n,"); tok && !rc; tok = strtok(NULL, " \t\r\n,")) {
            char what[600];
            snprintf(what, sizeof what, "--trace %s line %d", path, lineno);
            double x;
            if (parse_double_text(tok, what, 0, 1e9, &x, err)) rc = -1;
            else if (len == cap) {
                double *g = realloc(v, (size_t)(cap *= 2) * sizeof *v);
                if (!g) rc = moex_fail(err, "--trace: out of memory");
                else v = g;
            }
            if (!rc) v[len++] = x;
        }
    }
    fclose(f);
    if (!v) return moex_fail(err, "--trace: out of memory");
    if (!rc && len == 0) rc = moex_fail(err, "--trace: %s holds no times", path);
    if (rc) {
        free(v);
        return -1;
    }
    *out = v;
    *n = len;
    return 0;
}

/* "i:x,j:y" -> speed[i] = x ... (needs the worker count, so applied last). */
static int apply_speed(token_opts *o, moex_error *err) {
    if (!o->speed_spec[0]) return 0;
    o->speed = malloc((size_t)o->c.workers * sizeof *o->speed);
    if (!o->speed) return moex_fail(err, "out of memory");
    for (int w = 0; w < o->c.workers; w++) o->speed[w] = 1.0;
    char *save, *spec = o->speed_spec;
    for (char *it = strtok_r(spec, ",", &save); it; it = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(it, ':');
        if (!colon) return moex_fail(err, "--speed: expected worker:multiplier, got '%s'", it);
        *colon = 0;
        long w;
        double x;
        if (parse_long_text(it, "--speed worker", 0, o->c.workers - 1, &w, err) ||
            parse_double_text(colon + 1, "--speed multiplier", 1e-6, 1e6, &x, err))
            return -1;
        o->speed[w] = x;
    }
    o->c.speed = o->speed;
    return 0;
}

static int parse_fails(args *a, token_opts *o, moex_error *err) {
    const char *v = NULL;
    if (args_value(a, "fail", &v, err)) return -1;
    char buf[1024];
    if (strlen(v) >= sizeof buf) return moex_fail(err, "--fail: list too long");
    strcpy(buf, v);
    char *save;
    for (char *it = strtok_r(buf, ",", &save); it; it = strtok_r(NULL, ",", &save)) {
        char *at = strchr(it, '@');
        if (!at) return moex_fail(err, "--fail: expected worker@ms, got '%s'", it);
        if (o->c.n_fails >= MOEX_SIM_MAX_LIST) return moex_fail(err, "--fail: more than %d failures", MOEX_SIM_MAX_LIST);
        *at = 0;
        long w;
        double t;
        if (parse_long_text(it, "--fail worker", 0, INT_MAX, &w, err) ||
            parse_double_text(at + 1, "--fail time", 0, 1e12, &t, err))
            return -1;
        o->fails[o->c.n_fails++] = (moex_worker_fail){(int)w, t};
    }
    o->c.fails = o->fails;
    return 0;
}

static int parse_int_into(args *a, const char *f, long lo, long hi, int *out, moex_error *err) {
    long v;
    if (args_int(a, f, lo, hi, &v, err)) return -1;
    *out = (int)v;
    return 0;
}

static int parse_flag(args *a, const char *f, token_opts *o, int *help, moex_error *err) {
    moex_token_config *c = &o->c;
    const char *v = NULL;
    long l;
    if (!strcmp(f, "help")) *help = 1;
    else if (!strcmp(f, "layers")) return parse_int_into(a, f, 1, 100000, &c->layers, err);
    else if (!strcmp(f, "experts")) return parse_int_into(a, f, 1, 1 << 20, &c->experts, err);
    else if (!strcmp(f, "k")) return parse_int_into(a, f, 1, 1 << 20, &c->k, err);
    else if (!strcmp(f, "workers")) return parse_int_into(a, f, 1, 1 << 20, &c->workers, err);
    else if (!strcmp(f, "replicas")) return o->replicas_set = 1, parse_int_into(a, f, 1, 1 << 20, &c->replicas, err);
    else if (!strcmp(f, "h")) return args_int_list(a, f, 1, 1 << 20, o->h, &o->n_h, err);
    else if (!strcmp(f, "adaptive")) c->adaptive = 1;
    else if (!strcmp(f, "h-max")) return o->h_max_set = 1, parse_int_into(a, f, 1, 1 << 20, &c->h_max, err);
    else if (!strcmp(f, "tail-ratio")) return args_double(a, f, 1.0001, 1e6, &c->tail_ratio, err);
    else if (!strcmp(f, "hub-ms")) return args_double(a, f, 0, 1e9, &c->hub_ms, err);
    else if (!strcmp(f, "rtt-ms")) return args_double_list(a, f, 0, 1e9, o->rtt, &o->n_rtt, err);
    else if (!strcmp(f, "rtt-sigma")) return args_double(a, f, 0, 5, &c->rtt_sigma, err);
    else if (!strcmp(f, "ffn-ms")) return args_double(a, f, 1e-9, 1e9, &c->ffn_median, err);
    else if (!strcmp(f, "ffn-sigma")) return args_double(a, f, 0, 5, &c->ffn_sigma, err);
    else if (!strcmp(f, "trace")) return args_value(a, f, &o->trace_path, err);
    else if (!strcmp(f, "speed")) {
        if (args_value(a, f, &v, err)) return -1;
        if (strlen(v) >= sizeof o->speed_spec) return moex_fail(err, "--speed: list too long");
        strcpy(o->speed_spec, v);
    } else if (!strcmp(f, "fail")) return parse_fails(a, o, err);
    else if (!strcmp(f, "timeout-ms")) return args_double(a, f, 0, 1e12, &c->timeout_ms, err);
    else if (!strcmp(f, "unhealthy-after")) return parse_int_into(a, f, 1, 1000000, &c->unhealthy_after, err);
    else if (!strcmp(f, "no-queueing")) c->queueing = 0;
    else if (!strcmp(f, "messages")) c->messages = 1;
    else if (!strcmp(f, "select")) {
        if (args_value(a, f, &v, err)) return -1;
        if (!strcmp(v, "random")) c->select = MOEX_SELECT_RANDOM;
        else if (!strcmp(v, "fastest")) c->select = MOEX_SELECT_FASTEST;
        else return moex_fail(err, "--select must be random or fastest (got '%s')", v);
    } else if (!strcmp(f, "tokens")) return parse_int_into(a, f, 1, 10000000, &c->tokens, err);
    else if (!strcmp(f, "seed")) {
        if (args_int(a, f, 0, LONG_MAX, &l, err)) return -1;
        c->seed = (uint64_t)l;
    } else if (!strcmp(f, "format")) return args_format(a, &o->format, err);
    else if (!strcmp(f, "svg")) return args_value(a, f, &o->svg, err);
    else if (!strcmp(f, "table3")) o->table3 = 1;
    else if (!strcmp(f, "ring")) o->ring = 1;
    else if (!strcmp(f, "route-trace")) return args_value(a, f, &o->routes_path, err);
    else if (!strcmp(f, "place-by-load")) o->place_by_load = 1;
    else return moex_fail(err, "unknown flag --%s", f);
    return 0;
}

/* The DES's replica table from the placement module: workers 0..W-1 with
 * equal weights, the ring seeded with the simulation seed. */
static int ring_placement(token_opts *o, moex_error *err) {
    moex_token_config *c = &o->c;
    if (c->layers > 65535 || c->experts > 65535 || c->replicas > MOEX_PLACEMENT_MAX_REPLICAS)
        return moex_fail(err, "--ring supports at most 65535 layers/experts and %d replicas", MOEX_PLACEMENT_MAX_REPLICAS);
    moex_worker_spec *ws = malloc((size_t)c->workers * sizeof *ws);
    o->placement = malloc((size_t)c->layers * c->experts * c->replicas * sizeof *o->placement);
    if (!ws || !o->placement) {
        free(ws);
        return moex_fail(err, "out of memory for the placement");
    }
    for (int w = 0; w < c->workers; w++) ws[w] = (moex_worker_spec){(uint32_t)w, 1.0f};
    moex_placement_config pc = {(uint32_t)c->layers, (uint32_t)c->experts, (uint32_t)c->replicas, 0, c->seed};
    moex_placement *p = moex_placement_build(ws, (uint32_t)c->workers, &pc, err);
    free(ws);
    if (!p) return -1;
    int *t = o->placement;
    for (int l = 0; l < c->layers; l++)
        for (int e = 0; e < c->experts; e++) {
            const uint32_t *ids = moex_placement_lookup(p, (uint32_t)l, (uint32_t)e);
            for (int j = 0; j < c->replicas; j++) *t++ = (int)ids[j];
        }
    moex_placement_free(p);
    c->placement = o->placement;
    return 0;
}

static int parse(int argc, char **argv, token_opts *o, int *help, moex_error *err) {
    memset(o, 0, sizeof *o);
    moex_token_config_default(&o->c);
    o->h[0] = 1, o->n_h = 1;
    o->rtt[0] = 0.5, o->n_rtt = 1;
    args a = {argc, 0, argv};
    const char *f;
    while (!args_next_flag(&a, &f, err) && f)
        if (parse_flag(&a, f, o, help, err)) return -1;
    if (err->msg[0]) return -1;
    if (o->table3) {
        static const double rtts[] = {0.5, 2.0, 10.0, 50.0};
        memcpy(o->rtt, rtts, sizeof rtts), o->n_rtt = 4;
        o->h[0] = 1, o->h[1] = 2, o->h[2] = 3, o->n_h = 3;
        if (!o->replicas_set) o->c.replicas = 3;
    }
    if (!o->h_max_set) o->c.h_max = o->c.replicas;
    if (o->trace_path && read_trace(o->trace_path, &o->trace, &o->c.trace_len, err)) return -1;
    o->c.trace = o->trace;
    if (apply_speed(o, err)) return -1;
    if (o->place_by_load && (!o->routes_path || o->ring))
        return moex_fail(err, "--place-by-load needs --route-trace (and replaces --ring)");
    if (o->routes_path) {
        if (sim_read_routes(o->routes_path, &o->routes, err)) return -1;
        o->c.layers = o->routes.layers, o->c.experts = o->routes.experts, o->c.k = o->routes.k;
        o->c.routes = o->routes.ids, o->c.route_tokens = o->routes.tokens;
        if (o->place_by_load) {
            if (sim_place_by_load(&o->routes, o->c.workers, o->c.replicas, &o->placement, err)) return -1;
            o->c.placement = o->placement;
        }
    }
    return o->ring ? ring_placement(o, err) : 0;
}

/* ---- running and printing ---- */

typedef struct token_row {
    double rtt;
    int h;
    moex_token_result r;
    double eq12; /* NAN where eq. 12 + 18 does not describe the setup */
} token_row;

static const char *scenario_name(double rtt) {
    if (rtt == 0.5) return "LAN";
    if (rtt == 2.0) return "WiFi (home)";
    if (rtt == 10.0) return "WAN (city)";
    if (rtt == 50.0) return "WAN (cross)";
    return "";
}

static double eq12(const moex_token_config *c, moex_error *err) {
    if (c->trace || c->speed || c->adaptive || c->rtt_sigma > 0) return NAN;
    moex_hedge_model m = {c->k, c->h, c->ffn_median, c->ffn_sigma};
    double e;
    if (moex_hedge_expect(&m, &e, err)) return NAN;
    return c->layers * (c->hub_ms + c->rtt_ms + e);
}

static void print_rows(const token_opts *o, const token_row *rows, int n) {
    const moex_token_config *c = &o->c;
    if (o->format == FORMAT_CSV) {
        puts("rtt_ms,h,mean_ms,p50_ms,p99_ms,tokens_per_s,eq12_ms,mean_h,dispatches_per_expert,cancelled,timeouts,"
             "lost,reassigned,queue_wait_ms,wasted_work_pct");
        for (int i = 0; i < n; i++) {
            const moex_token_result *r = &rows[i].r;
            double per_expert = (double)r->dispatches / ((double)c->tokens * c->layers * c->k);
            printf("%g,%d,%.6f,%.6f,%.6f,%.4f,", rows[i].rtt, rows[i].h, r->mean_ms, r->p50_ms, r->p99_ms,
                   r->tokens_per_s);
            if (isnan(rows[i].eq12)) printf(",");
            else printf("%.6f,", rows[i].eq12);
            printf("%.4f,%.4f,%llu,%llu,%llu,%llu,%.6f,%.3f\n", r->mean_h, per_expert,
                   (unsigned long long)r->cancelled, (unsigned long long)r->timeouts, (unsigned long long)r->lost,
                   (unsigned long long)r->reassigned, r->queue_wait_ms, 100 * r->wasted_work);
        }
        return;
    }
    printf("L=%d E=%d k=%d W=%d R=%d hub=%g ms FFN=%s%g ms sigma %g, queueing %s, select %s, timeout %g ms, "
           "tokens=%d seed=%llu%s%s%s\n",
           c->layers, c->experts, c->k, c->workers, c->replicas, c->hub_ms, c->trace ? "trace x" : "", 
           c->trace ? 1.0 : c->ffn_median, c->ffn_sigma, c->queueing ? "on" : "off",
           c->select == MOEX_SELECT_FASTEST ? "fastest" : "random", c->timeout_ms, c->tokens,
           (unsigned long long)c->seed, c->adaptive ? ", adaptive h" : "", c->routes ? ", routing from trace" : "",
           o->place_by_load ? ", placed by load" : "");
    printf("%-12s %7s %3s %10s %10s %10s %8s %10s %6s %8s %8s %6s %6s\n", "scenario", "rtt_ms", "h", "mean_ms",
           "p50_ms", "p99_ms", "tok/s", "eq12_ms", "mean_h", "wait_ms", "cancel", "tmout", "lost");
    for (int i = 0; i < n; i++) {
        const moex_token_result *r = &rows[i].r;
        char eq[32] = "-";
        if (!isnan(rows[i].eq12)) snprintf(eq, sizeof eq, "%.1f", rows[i].eq12);
        printf("%-12s %7g %3d %10.2f %10.2f %10.2f %8.2f %10s %6.2f %8.4f %8llu %6llu %6llu\n",
               o->table3 ? scenario_name(rows[i].rtt) : "", rows[i].rtt, rows[i].h, r->mean_ms, r->p50_ms, r->p99_ms,
               r->tokens_per_s, eq, r->mean_h, r->queue_wait_ms, (unsigned long long)r->cancelled,
               (unsigned long long)r->timeouts, (unsigned long long)r->lost);
    }
}

static int draw(const token_opts *o, const token_row *rows, moex_error *err) {
    double x[MOEX_SIM_MAX_LIST], y[MOEX_SIM_MAX_LIST][MOEX_SIM_MAX_LIST];
    char labels[MOEX_SIM_MAX_LIST][32];
    moex_svg_series s[MOEX_SIM_MAX_LIST];
    for (int j = 0; j < o->n_rtt; j++) x[j] = o->rtt[j];
    for (int i = 0; i < o->n_h; i++) {
        for (int j = 0; j < o->n_rtt; j++) y[i][j] = rows[j * o->n_h + i].r.mean_ms;
        snprintf(labels[i], sizeof labels[i], o->c.adaptive ? "adaptive, start h=%ld" : "h=%ld (DES mean)", o->h[i]);
        s[i] = (moex_svg_series){labels[i], x, y[i], o->n_rtt, 0};
    }
    double lo = x[0], hi = x[0];
    for (int j = 1; j < o->n_rtt; j++) lo = fmin(lo, x[j]), hi = fmax(hi, x[j]);
    int log_axes = lo > 0 && hi / lo >= 20;
    char title[160];
    snprintf(title, sizeof title, "Per-token latency, L=%d, k=%d, hub %g ms, FFN %g ms (sigma %g)", o->c.layers,
             o->c.k, o->c.hub_ms, o->c.ffn_median, o->c.ffn_sigma);
    moex_svg_chart c = {title, "network RTT (ms)", "per-token latency (ms)", log_axes, log_axes, s, o->n_h};
    return moex_svg_save(o->svg, &c, err);
}

static int run_grid(token_opts *o, token_row *rows, moex_error *err) {
    int n = 0;
    for (int j = 0; j < o->n_rtt; j++)
        for (int i = 0; i < o->n_h; i++, n++) {
            moex_token_config c = o->c;
            c.rtt_ms = o->rtt[j];
            c.h = (int)o->h[i];
            if (c.adaptive && c.h > c.h_max) c.h_max = c.h;
            rows[n].rtt = c.rtt_ms;
            rows[n].h = c.h;
            if (moex_token_config_check(&c, err)) return 2;
            if (moex_token_simulate(&c, &rows[n].r, NULL, err)) return 1;
            rows[n].eq12 = eq12(&c, err);
        }
    return 0;
}

int sim_cmd_token(int argc, char **argv) {
    token_opts o;
    moex_error err = {{0}};
    int help = 0, rc = 0;
    token_row *rows = NULL;
    if (parse(argc, argv, &o, &help, &err)) rc = sim_usage_error("token", &err);
    else if (help) fputs(HELP, stdout);
    else if (!(rows = calloc((size_t)o.n_rtt * o.n_h, sizeof *rows))) {
        fprintf(stderr, "moex-sim token: out of memory\n");
        rc = 1;
    } else if ((rc = run_grid(&o, rows, &err))) {
        if (rc == 2) sim_usage_error("token", &err);
        else fprintf(stderr, "moex-sim token: %s\n", err.msg);
    } else {
        print_rows(&o, rows, o.n_rtt * o.n_h);
        if (o.svg && draw(&o, rows, &err)) {
            fprintf(stderr, "moex-sim token: %s\n", err.msg);
            rc = 1;
        }
    }
    free(rows);
    free(o.trace);
    free(o.speed);
    free(o.placement);
    sim_routes_free(&o.routes);
    return rc;
}
