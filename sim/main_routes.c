/* moex-sim token --route-trace: measured routing instead of uniform draws.
 *
 * The trace is what `moex-hub --routing-trace` writes (engine/route_trace.c):
 * a header "layers L experts E k K tokens T" after '#' comments, then one
 * line per token of L groups of K expert ids separated by '|'. The simulator
 * replays token t's row for its t-th token (cycling), so experts that the
 * model uses more are dispatched more, to the same replicas each time.
 *
 * --place-by-load places the replicas from the trace's loads instead of at
 * random: per layer, experts by decreasing load, each copy to the worker
 * with the least load so far that does not hold the expert yet (a copy
 * carries load / replicas; ties go to the worker with fewer copies, then the
 * lower id), so hot experts are spread and cold ones fill the gaps. */
#include "sim/main.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int read_header(FILE *f, const char *path, sim_routes *r, moex_error *err) {
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        if (sscanf(line, "layers %d experts %d k %d tokens %d", &r->layers, &r->experts, &r->k, &r->tokens) != 4)
            return moex_fail(err, "--route-trace %s: expected 'layers L experts E k K tokens T', got '%.60s'", path,
                             line);
        if (r->layers < 1 || r->experts < 1 || r->k < 1 || r->k > r->experts || r->tokens < 1 || r->layers > 100000 ||
            r->experts > (1 << 20) || (double)r->tokens * r->layers * r->k > 4e8)
            return moex_fail(err, "--route-trace %s: implausible header (layers %d experts %d k %d tokens %d)", path,
                             r->layers, r->experts, r->k, r->tokens);
        return 0;
    }
    return moex_fail(err, "--route-trace %s: no header line", path);
}

int sim_read_routes(const char *path, sim_routes *r, moex_error *err) {
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "r");
    if (!f) return moex_fail(err, "--route-trace: cannot open %s: %s", path, strerror(errno));
    int rc = read_header(f, path, r, err);
    const size_t n = rc ? 0 : (size_t)r->tokens * r->layers * r->k;
    if (!rc && !(r->ids = malloc(n * sizeof *r->ids))) rc = moex_fail(err, "--route-trace: out of memory");
    for (size_t i = 0; !rc && i < n; i++) {
        int c, v;
        while ((c = fgetc(f)) == ' ' || c == '|' || c == '\n' || c == '\t' || c == '\r') {}
        if (c != EOF) ungetc(c, f);
        if (fscanf(f, "%d", &v) != 1)
            rc = moex_fail(err, "--route-trace %s: %zu of %zu expert ids (the header promises %d tokens)", path, i, n,
                           r->tokens);
        else if (v < 0 || v >= r->experts)
            rc = moex_fail(err, "--route-trace %s: expert id %d outside 0..%d", path, v, r->experts - 1);
        else
            r->ids[i] = v;
    }
    fclose(f);
    if (rc) sim_routes_free(r);
    return rc;
}

void sim_routes_free(sim_routes *r) {
    free(r->ids);
    r->ids = NULL;
}

typedef struct expert_load {
    int expert;
    long count;
} expert_load;

static int by_load_desc(const void *a, const void *b) {
    const expert_load *x = a, *y = b;
    if (x->count != y->count) return x->count < y->count ? 1 : -1;
    return x->expert - y->expert;
}

/* One layer's table [experts][replicas]. */
static void place_layer(const sim_routes *r, int layer, int workers, int replicas, expert_load *loads, double *wload,
                        int *copies, int *table) {
    for (int e = 0; e < r->experts; e++) loads[e] = (expert_load){e, 0};
    for (int t = 0; t < r->tokens; t++)
        for (int j = 0; j < r->k; j++) loads[r->ids[((size_t)t * r->layers + layer) * r->k + j]].count++;
    qsort(loads, (size_t)r->experts, sizeof *loads, by_load_desc);
    for (int w = 0; w < workers; w++) wload[w] = 0, copies[w] = 0;
    for (int i = 0; i < r->experts; i++) {
        int *row = table + (size_t)loads[i].expert * replicas;
        for (int j = 0; j < replicas; j++) {
            int best = -1;
            for (int w = 0; w < workers; w++) {
                bool taken = false;
                for (int q = 0; q < j; q++) taken |= row[q] == w;
                if (!taken && (best < 0 || wload[w] < wload[best] ||
                               (wload[w] == wload[best] && copies[w] < copies[best])))
                    best = w;
            }
            row[j] = best;
            wload[best] += (double)loads[i].count / replicas;
            copies[best]++;
        }
    }
}

int sim_place_by_load(const sim_routes *r, int workers, int replicas, int **out, moex_error *err) {
    if (replicas > workers) return moex_fail(err, "--place-by-load: %d replicas need as many workers", replicas);
    int *table = malloc((size_t)r->layers * r->experts * replicas * sizeof *table);
    expert_load *loads = malloc((size_t)r->experts * sizeof *loads);
    double *wload = malloc((size_t)workers * sizeof *wload);
    int *copies = malloc((size_t)workers * sizeof *copies);
    if (!table || !loads || !wload || !copies) {
        free(table);
        free(loads);
        free(wload);
        free(copies);
        return moex_fail(err, "--place-by-load: out of memory");
    }
    for (int l = 0; l < r->layers; l++)
        place_layer(r, l, workers, replicas, loads, wload, copies, table + (size_t)l * r->experts * replicas);
    free(loads);
    free(wload);
    free(copies);
    *out = table;
    return 0;
}
