/* Diff of two placements: per worker, the experts to load and to drop. */
#include "placement/placement.h"

#include <stdlib.h>

#include "placement/placement_internal.h"

static int contains(const uint32_t *ids, uint32_t n, uint32_t id) {
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] == id) return 1;
    return 0;
}

/* Sorted union of both placements' worker ids into d->workers. */
static int collect_workers(const moex_placement *a, const moex_placement *b, moex_placement_diff *d) {
    d->workers = calloc((size_t)a->n_workers + b->n_workers, sizeof *d->workers);
    if (!d->workers) return -1;
    uint32_t i = 0, j = 0, n = 0;
    while (i < a->n_workers || j < b->n_workers) {
        uint32_t id;
        if (j == b->n_workers || (i < a->n_workers && a->workers[i].id < b->workers[j].id)) id = a->workers[i++].id;
        else if (i == a->n_workers || b->workers[j].id < a->workers[i].id) id = b->workers[j++].id;
        else id = a->workers[i++].id, j++;
        d->workers[n++].worker_id = id;
    }
    d->n_workers = n;
    return 0;
}

static moex_placement_change *change_of(moex_placement_diff *d, uint32_t id) {
    uint32_t lo = 0, hi = d->n_workers;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (d->workers[mid].worker_id < id) lo = mid + 1;
        else hi = mid;
    }
    return &d->workers[lo]; /* every id of both placements is present */
}

/* One pass over all experts: counts when fill is 0, records when 1. */
static void walk(const moex_placement *a, const moex_placement *b, moex_placement_diff *d, int fill) {
    for (uint32_t l = 0; l < a->n_layers; l++)
        for (uint32_t e = 0; e < a->n_experts; e++) {
            const uint32_t *ra = moex_placement_lookup(a, l, e), *rb = moex_placement_lookup(b, l, e);
            moex_expert_ref ref = {(uint16_t)l, (uint16_t)e};
            for (uint32_t k = 0; k < b->replicas; k++)
                if (!contains(ra, a->replicas, rb[k])) {
                    moex_placement_change *c = change_of(d, rb[k]);
                    if (fill) c->load[c->n_load] = ref;
                    c->n_load++;
                }
            for (uint32_t k = 0; k < a->replicas; k++)
                if (!contains(rb, b->replicas, ra[k])) {
                    moex_placement_change *c = change_of(d, ra[k]);
                    if (fill) c->drop[c->n_drop] = ref;
                    c->n_drop++;
                }
        }
}

int moex_placement_diff_build(const moex_placement *from, const moex_placement *to, moex_placement_diff *out,
                              moex_error *err) {
    *out = (moex_placement_diff){0};
    if (from->n_layers != to->n_layers || from->n_experts != to->n_experts)
        return moex_fail(err, "placement diff: %u x %u experts vs %u x %u", from->n_layers, from->n_experts,
                         to->n_layers, to->n_experts);
    if (collect_workers(from, to, out)) return moex_fail(err, "placement diff: out of memory");
    walk(from, to, out, 0);
    size_t total = 0;
    for (uint32_t i = 0; i < out->n_workers; i++) total += out->workers[i].n_load + out->workers[i].n_drop;
    out->storage = malloc(sizeof *out->storage * (total ? total : 1));
    if (!out->storage) {
        moex_placement_diff_free(out);
        return moex_fail(err, "placement diff: out of memory for %zu changes", total);
    }
    moex_expert_ref *next = out->storage;
    for (uint32_t i = 0; i < out->n_workers; i++) {
        moex_placement_change *c = &out->workers[i];
        out->moved += c->n_load;
        c->load = next;
        next += c->n_load;
        c->drop = next;
        next += c->n_drop;
        c->n_load = c->n_drop = 0; /* recounted while filling */
    }
    walk(from, to, out, 1);
    return 0;
}

void moex_placement_diff_free(moex_placement_diff *d) {
    if (!d) return;
    free(d->workers);
    free(d->storage);
    *d = (moex_placement_diff){0};
}
