/* Building a placement: the ring of virtual nodes and the table of replicas
 * it implies for every (layer, expert). The table is computed once, so
 * lookups on the dispatch path are an array read. */
#include "placement/placement.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "placement/placement_internal.h"

/* Keys and ring points hash in different domains, so that an expert's key
 * never equals a virtual node's point by construction. */
#define KEY_DOMAIN 0x6b65797355ull   /* "Usyek" */
#define MAX_RING_POINTS (1u << 24) /* checked before building, so counts fit in uint32_t */

typedef struct ring_point {
    uint64_t hash;
    uint32_t worker;  /* index in p->workers */
    uint32_t vnode;
} ring_point;

static uint64_t hash_pair(uint32_t a, uint32_t b, uint64_t seed) {
    uint8_t buf[8];
    for (int i = 0; i < 4; i++) {
        buf[i] = (uint8_t)(a >> (8 * i));
        buf[4 + i] = (uint8_t)(b >> (8 * i));
    }
    return XXH3_64bits_withSeed(buf, sizeof buf, seed);
}

static int cmp_point(const void *a, const void *b) {
    const ring_point *x = a, *y = b;
    if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
    if (x->worker != y->worker) return x->worker < y->worker ? -1 : 1;
    return (x->vnode > y->vnode) - (x->vnode < y->vnode);
}

static int cmp_worker(const void *a, const void *b) {
    const moex_worker_spec *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* Virtual nodes of one worker: its weight's share, at least one. */
static uint64_t vnodes_of(float weight, uint32_t per_weight) {
    double v = floor((double)weight * per_weight + 0.5);
    return v < 1 ? 1 : (uint64_t)v; /* weight <= 1000, so v < 2^42 */
}

static int check_config(const moex_worker_spec *w, uint32_t n, const moex_placement_config *cfg, moex_error *err) {
    if (!cfg || cfg->n_layers < 1 || cfg->n_layers > 65535 || cfg->n_experts < 1 || cfg->n_experts > 65535)
        return moex_fail(err, "placement: layers and experts must be in 1..65535");
    if (cfg->replicas < 1 || cfg->replicas > MOEX_PLACEMENT_MAX_REPLICAS)
        return moex_fail(err, "placement: replicas must be in 1..%d, got %u", MOEX_PLACEMENT_MAX_REPLICAS, cfg->replicas);
    if (n < cfg->replicas)
        return moex_fail(err, "placement: %u replicas need at least %u workers, have %u", cfg->replicas,
                         cfg->replicas, n);
    if (!w) return moex_fail(err, "placement: no worker list");
    uint32_t per = cfg->vnodes_per_weight ? cfg->vnodes_per_weight : MOEX_PLACEMENT_DEFAULT_VNODES;
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!(w[i].weight > 0.0f && w[i].weight <= MOEX_PLACEMENT_MAX_WEIGHT))
            return moex_fail(err, "placement: worker %u has weight %g, need (0, %g]", w[i].id, (double)w[i].weight,
                             (double)MOEX_PLACEMENT_MAX_WEIGHT);
        total += vnodes_of(w[i].weight, per);
        if (total > MAX_RING_POINTS)
            return moex_fail(err, "placement: more than %u virtual nodes; lower vnodes_per_weight", MAX_RING_POINTS);
    }
    return 0;
}

static ring_point *build_ring(const moex_placement *p, uint32_t per_weight, uint32_t *n_points) {
    uint32_t total = 0;
    for (uint32_t i = 0; i < p->n_workers; i++) total += (uint32_t)vnodes_of(p->workers[i].weight, per_weight);
    ring_point *ring = malloc(sizeof *ring * total);
    if (!ring) return NULL;
    uint32_t k = 0;
    for (uint32_t i = 0; i < p->n_workers; i++) {
        uint32_t nv = (uint32_t)vnodes_of(p->workers[i].weight, per_weight);
        for (uint32_t v = 0; v < nv; v++)
            ring[k++] = (ring_point){hash_pair(p->workers[i].id, v, p->seed), i, v};
    }
    qsort(ring, total, sizeof *ring, cmp_point);
    *n_points = total;
    return ring;
}

/* First point with hash >= h (wrapping to 0). */
static uint32_t ring_successor(const ring_point *ring, uint32_t n, uint64_t h) {
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (ring[mid].hash < h) lo = mid + 1;
        else hi = mid;
    }
    return lo == n ? 0 : lo;
}

/* The first r distinct workers clockwise from the key's point. */
static void place_key(moex_placement *p, const ring_point *ring, uint32_t n_points, uint32_t layer,
                      uint32_t expert, uint32_t *out_idx) {
    uint32_t pos = ring_successor(ring, n_points, hash_pair(layer, expert, p->seed ^ KEY_DOMAIN)), found = 0;
    for (uint32_t step = 0; step < n_points && found < p->replicas; step++) {
        uint32_t w = ring[(pos + step) % n_points].worker, seen = 0;
        for (uint32_t j = 0; j < found; j++) seen |= out_idx[j] == w;
        if (!seen) out_idx[found++] = w;
    }
}

static void fill_table(moex_placement *p, const ring_point *ring, uint32_t n_points) {
    uint32_t idx[p->replicas];
    for (uint32_t l = 0; l < p->n_layers; l++)
        for (uint32_t e = 0; e < p->n_experts; e++) {
            place_key(p, ring, n_points, l, e, idx);
            uint32_t *slot = p->table + ((size_t)l * p->n_experts + e) * p->replicas;
            for (uint32_t j = 0; j < p->replicas; j++) {
                slot[j] = p->workers[idx[j]].id;
                p->loads[idx[j]]++;
            }
        }
}

moex_placement *moex_placement_build(const moex_worker_spec *workers, uint32_t n_workers,
                                     const moex_placement_config *cfg, moex_error *err) {
    if (check_config(workers, n_workers, cfg, err)) return NULL;
    moex_placement *p = calloc(1, sizeof *p);
    if (!p) return moex_fail(err, "placement: out of memory"), NULL;
    p->n_layers = cfg->n_layers;
    p->n_experts = cfg->n_experts;
    p->replicas = cfg->replicas;
    p->seed = cfg->seed;
    p->n_workers = n_workers;
    size_t slots = (size_t)cfg->n_layers * cfg->n_experts * cfg->replicas;
    p->workers = malloc(sizeof *p->workers * n_workers);
    p->loads = calloc(n_workers, sizeof *p->loads);
    p->table = malloc(sizeof *p->table * slots);
    if (!p->workers || !p->loads || !p->table) {
        moex_placement_free(p);
        return moex_fail(err, "placement: out of memory for %zu replica slots", slots), NULL;
    }
    memcpy(p->workers, workers, sizeof *workers * n_workers);
    qsort(p->workers, n_workers, sizeof *p->workers, cmp_worker);
    for (uint32_t i = 1; i < n_workers; i++)
        if (p->workers[i].id == p->workers[i - 1].id) {
            moex_fail(err, "placement: worker id %u appears twice", p->workers[i].id);
            moex_placement_free(p);
            return NULL;
        }
    uint32_t n_points;
    ring_point *ring = build_ring(p, cfg->vnodes_per_weight ? cfg->vnodes_per_weight : MOEX_PLACEMENT_DEFAULT_VNODES,
                                  &n_points);
    if (!ring) {
        moex_placement_free(p);
        return moex_fail(err, "placement: out of memory for the ring"), NULL;
    }
    fill_table(p, ring, n_points);
    free(ring);
    return p;
}

void moex_placement_free(moex_placement *p) {
    if (!p) return;
    free(p->workers);
    free(p->loads);
    free(p->table);
    free(p);
}

uint32_t moex_placement_replicas(const moex_placement *p) { return p->replicas; }
uint32_t moex_placement_n_layers(const moex_placement *p) { return p->n_layers; }
uint32_t moex_placement_n_experts(const moex_placement *p) { return p->n_experts; }
uint32_t moex_placement_n_workers(const moex_placement *p) { return p->n_workers; }

moex_worker_spec moex_placement_worker(const moex_placement *p, uint32_t i) {
    return i < p->n_workers ? p->workers[i] : (moex_worker_spec){0, 0.0f};
}

const uint32_t *moex_placement_lookup(const moex_placement *p, uint32_t layer, uint32_t expert) {
    if (layer >= p->n_layers || expert >= p->n_experts) return NULL;
    return p->table + ((size_t)layer * p->n_experts + expert) * p->replicas;
}

int moex_placement_worker_index(const moex_placement *p, uint32_t id) {
    uint32_t lo = 0, hi = p->n_workers;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (p->workers[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < p->n_workers && p->workers[lo].id == id ? (int)lo : -1;
}

size_t moex_placement_load(const moex_placement *p, uint32_t worker_id) {
    int i = moex_placement_worker_index(p, worker_id);
    return i < 0 ? 0 : p->loads[i];
}

size_t moex_placement_held(const moex_placement *p, uint32_t worker_id, moex_expert_ref *out, size_t cap) {
    size_t n = 0;
    for (uint32_t l = 0; l < p->n_layers; l++)
        for (uint32_t e = 0; e < p->n_experts; e++) {
            const uint32_t *r = moex_placement_lookup(p, l, e);
            for (uint32_t j = 0; j < p->replicas; j++)
                if (r[j] == worker_id) {
                    if (n < cap) out[n] = (moex_expert_ref){(uint16_t)l, (uint16_t)e};
                    n++;
                }
        }
    return n;
}
