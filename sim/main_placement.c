/* moex-sim placement: lay experts out with the placement module's
 * consistent-hash ring and report the load per worker and the conflicts
 * that matter for dispatch latency, or dump the whole table. */
#include "sim/main.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "placement/placement.h"

static const char *HELP =
    "usage: moex-sim placement --workers w0,w1:2.0,... [flags]\n"
    "  --workers LIST   workers as w<id> or <id>, optionally :weight (capacity, default 1)\n"
    "  --experts E      experts per layer (128)     --layers L   layers (48)\n"
    "  --replicas R     copies of each expert (2)   --k K        active experts per layer (8)\n"
    "  --vnodes V       ring points per unit weight (placement default)\n"
    "  --seed X         ring seed (0)\n"
    "  --dump           print CSV rows layer,expert,replica,worker instead of the summary\n"
    "summary: replica slots per worker against their weighted fair share, max/mean\n"
    "load (slots/weight over the weighted mean), duplicate replicas (must be 0) and\n"
    "the expected number of active-expert pairs per layer whose primaries share a\n"
    "worker (they queue behind each other at h=1), against a uniform random layout.\n";

#define MAX_WORKERS 4096

typedef struct placement_opts {
    moex_placement_config cfg;
    moex_worker_spec workers[MAX_WORKERS];
    char names[MAX_WORKERS][32];
    uint32_t n_workers;
    int k, dump;
} placement_opts;

/* "w12:2.5" -> id 12, weight 2.5, name "w12". */
static int parse_worker(const char *item, placement_opts *o, moex_error *err) {
    if (o->n_workers >= MAX_WORKERS) return moex_fail(err, "--workers: more than %d workers", MAX_WORKERS);
    char name[32];
    const char *colon = strchr(item, ':');
    size_t len = colon ? (size_t)(colon - item) : strlen(item);
    if (len == 0 || len >= sizeof name) return moex_fail(err, "--workers: bad worker '%s'", item);
    memcpy(name, item, len);
    name[len] = 0;
    long id;
    double weight = 1.0;
    if (parse_long_text(name[0] == 'w' ? name + 1 : name, "--workers id (w<id> or <id>)", 0, UINT32_MAX / 2, &id, err))
        return -1;
    if (colon && parse_double_text(colon + 1, "--workers weight", 1e-3, MOEX_PLACEMENT_MAX_WEIGHT, &weight, err))
        return -1;
    for (uint32_t i = 0; i < o->n_workers; i++)
        if (o->workers[i].id == (uint32_t)id) return moex_fail(err, "--workers: worker id %ld listed twice", id);
    o->workers[o->n_workers] = (moex_worker_spec){(uint32_t)id, (float)weight};
    strcpy(o->names[o->n_workers++], name);
    return 0;
}

static int parse_workers(args *a, placement_opts *o, moex_error *err) {
    const char *v = NULL;
    if (args_value(a, "workers", &v, err)) return -1;
    char *copy = strdup(v), *save = NULL;
    if (!copy) return moex_fail(err, "out of memory");
    int rc = 0;
    if (!*v || strstr(v, ",,") || v[strlen(v) - 1] == ',') rc = moex_fail(err, "--workers: empty item in '%s'", v);
    for (char *it = strtok_r(copy, ",", &save); it && !rc; it = strtok_r(NULL, ",", &save)) rc = parse_worker(it, o, err);
    free(copy);
    return rc;
}

static int parse(int argc, char **argv, placement_opts *o, int *help, moex_error *err) {
    memset(o, 0, sizeof *o);
    o->cfg = (moex_placement_config){.n_layers = 48, .n_experts = 128, .replicas = 2};
    o->k = 8;
    args a = {argc, 0, argv};
    const char *f;
    long v;
    while (!args_next_flag(&a, &f, err) && f) {
        int rc = 0;
        if (!strcmp(f, "help")) *help = 1;
        else if (!strcmp(f, "dump")) o->dump = 1;
        else if (!strcmp(f, "workers")) rc = parse_workers(&a, o, err);
        else if (!strcmp(f, "experts")) rc = args_int(&a, f, 1, 65535, &v, err), o->cfg.n_experts = (uint32_t)v;
        else if (!strcmp(f, "layers")) rc = args_int(&a, f, 1, 65535, &v, err), o->cfg.n_layers = (uint32_t)v;
        else if (!strcmp(f, "replicas"))
            rc = args_int(&a, f, 1, MOEX_PLACEMENT_MAX_REPLICAS, &v, err), o->cfg.replicas = (uint32_t)v;
        else if (!strcmp(f, "vnodes")) rc = args_int(&a, f, 1, 1 << 20, &v, err), o->cfg.vnodes_per_weight = (uint32_t)v;
        else if (!strcmp(f, "k")) rc = args_int(&a, f, 1, 65535, &v, err), o->k = (int)v;
        else if (!strcmp(f, "seed")) rc = args_int(&a, f, 0, LONG_MAX, &v, err), o->cfg.seed = (uint64_t)v;
        else rc = moex_fail(err, "unknown flag --%s", f);
        if (rc) return -1;
    }
    if (err->msg[0]) return -1;
    if (*help) return 0;
    if (o->n_workers == 0) return moex_fail(err, "--workers is required (e.g. --workers w0,w1,w2:2.0)");
    if (o->cfg.replicas > o->n_workers)
        return moex_fail(err, "--replicas %u needs at least as many workers (got %u)", o->cfg.replicas, o->n_workers);
    if (!o->dump && (uint32_t)o->k > o->cfg.n_experts) return moex_fail(err, "--k %d exceeds --experts %u", o->k, o->cfg.n_experts);
    return 0;
}

static const char *name_of(const placement_opts *o, uint32_t id) {
    for (uint32_t i = 0; i < o->n_workers; i++)
        if (o->workers[i].id == id) return o->names[i];
    return "?";
}

static void dump(const placement_opts *o, const moex_placement *p) {
    puts("layer,expert,replica,worker");
    for (uint32_t l = 0; l < o->cfg.n_layers; l++)
        for (uint32_t e = 0; e < o->cfg.n_experts; e++) {
            const uint32_t *ids = moex_placement_lookup(p, l, e);
            for (uint32_t r = 0; r < o->cfg.replicas; r++) printf("%u,%u,%u,%s\n", l, e, r, name_of(o, ids[r]));
        }
}

/* Index of a worker id in the placement's id order (binary search). */
static uint32_t index_of(const moex_placement *p, uint32_t id) {
    uint32_t lo = 0, hi = moex_placement_n_workers(p);
    while (lo + 1 < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (moex_placement_worker(p, mid).id <= id) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* Duplicate replicas and, per layer, pairs of experts whose primaries share
 * a worker: a pair is co-active with probability k(k-1) / (E(E-1)). */
static void conflicts(const placement_opts *o, const moex_placement *p, uint64_t *dups, double *pairs) {
    uint32_t n = o->n_workers, E = o->cfg.n_experts, R = o->cfg.replicas;
    uint64_t *per_worker = calloc(n, sizeof *per_worker), same = 0;
    *dups = 0;
    *pairs = 0;
    if (!per_worker) return;
    for (uint32_t l = 0; l < o->cfg.n_layers; l++) {
        memset(per_worker, 0, n * sizeof *per_worker);
        for (uint32_t e = 0; e < E; e++) {
            const uint32_t *ids = moex_placement_lookup(p, l, e);
            for (uint32_t i = 0; i < R; i++)
                for (uint32_t j = i + 1; j < R; j++) *dups += ids[i] == ids[j];
            per_worker[index_of(p, ids[0])]++;
        }
        for (uint32_t w = 0; w < n; w++)
            if (per_worker[w] > 1) same += per_worker[w] * (per_worker[w] - 1) / 2;
    }
    double co_active = E > 1 ? (double)o->k * (o->k - 1) / ((double)E * (E - 1)) : 0;
    *pairs = (double)same / o->cfg.n_layers * co_active;
    free(per_worker);
}

static void summary(const placement_opts *o, const moex_placement *p) {
    double total_w = 0, total_slots = (double)o->cfg.n_layers * o->cfg.n_experts * o->cfg.replicas, max_ratio = 0,
           sum_sq_w = 0;
    for (uint32_t i = 0; i < o->n_workers; i++) total_w += o->workers[i].weight;
    printf("placement: %u layers x %u experts x %u replicas on %u workers (seed %llu)\n", o->cfg.n_layers,
           o->cfg.n_experts, o->cfg.replicas, o->n_workers, (unsigned long long)o->cfg.seed);
    printf("%-10s %8s %8s %9s %9s %10s\n", "worker", "weight", "slots", "share%", "fair%", "load/fair");
    for (uint32_t i = 0; i < moex_placement_n_workers(p); i++) {
        moex_worker_spec w = moex_placement_worker(p, i);
        double slots = (double)moex_placement_load(p, w.id), fair = total_slots * w.weight / total_w;
        double ratio = slots / fair;
        if (ratio > max_ratio) max_ratio = ratio;
        printf("%-10s %8.3g %8.0f %9.3f %9.3f %10.3f\n", name_of(o, w.id), w.weight, slots, 100 * slots / total_slots,
               100 * fair / total_slots, ratio);
    }
    uint64_t dups;
    double pairs;
    conflicts(o, p, &dups, &pairs);
    /* Uniform random primaries on weighted workers: P(same worker) = sum (w_i/W)^2. */
    for (uint32_t i = 0; i < o->n_workers; i++) sum_sq_w += (o->workers[i].weight / total_w) * (o->workers[i].weight / total_w);
    printf("max/mean load (weighted): %.4f\n", max_ratio);
    printf("duplicate replicas: %llu\n", (unsigned long long)dups);
    printf("same-worker active expert pairs per layer (k=%d, primaries): %.4f (uniform random layout: %.4f)\n", o->k,
           pairs, (double)o->k * (o->k - 1) / 2 * sum_sq_w);
}

int sim_cmd_placement(int argc, char **argv) {
    placement_opts *o = malloc(sizeof *o);
    moex_error err = {{0}};
    int help = 0, rc = 0;
    if (!o) return 1;
    if (parse(argc, argv, o, &help, &err)) rc = sim_usage_error("placement", &err);
    else if (help) fputs(HELP, stdout);
    else {
        moex_placement *p = moex_placement_build(o->workers, o->n_workers, &o->cfg, &err);
        if (!p) rc = sim_usage_error("placement", &err);
        else if (o->dump) dump(o, p);
        else summary(o, p);
        moex_placement_free(p);
    }
    free(o);
    return rc;
}
