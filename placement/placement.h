/* Expert placement: which workers hold each (layer, expert).
 *
 * A consistent-hash ring (XXH3): every worker owns virtual nodes in
 * proportion to its capacity weight; an expert hashes to a point on the ring
 * and its r replicas are the first r distinct workers met walking clockwise
 * from there (the first is the primary). So placements are deterministic
 * (independent of the order workers are listed in), and when a worker joins
 * or leaves only the replica slots it takes or gives up change hands. */
#ifndef MOEX_PLACEMENT_H
#define MOEX_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

typedef struct moex_worker_spec {
    uint32_t id;   /* stable and unique: the same worker keeps its id across placements */
    float weight;  /* capacity weight, > 0 and <= MOEX_PLACEMENT_MAX_WEIGHT; load is proportional to it */
} moex_worker_spec;

#define MOEX_PLACEMENT_MAX_WEIGHT 1000.0f
#define MOEX_PLACEMENT_DEFAULT_VNODES 256
#define MOEX_PLACEMENT_MAX_REPLICAS 16

typedef struct moex_placement_config {
    uint32_t n_layers, n_experts; /* each 1..65535 */
    uint32_t replicas;            /* r in 1..MOEX_PLACEMENT_MAX_REPLICAS; needs at least r workers */
    uint32_t vnodes_per_weight;   /* virtual nodes per unit of weight; 0 = MOEX_PLACEMENT_DEFAULT_VNODES */
    uint64_t seed;                /* changes the whole layout; keep it fixed for a deployment */
} moex_placement_config;

typedef struct moex_expert_ref {
    uint16_t layer, expert;
} moex_expert_ref;

typedef struct moex_placement moex_placement;

moex_placement *moex_placement_build(const moex_worker_spec *workers, uint32_t n_workers,
                                     const moex_placement_config *cfg, moex_error *err);
void moex_placement_free(moex_placement *p);

uint32_t moex_placement_replicas(const moex_placement *p);
uint32_t moex_placement_n_layers(const moex_placement *p);
uint32_t moex_placement_n_experts(const moex_placement *p);
uint32_t moex_placement_n_workers(const moex_placement *p);
/* The i-th worker in id order. */
moex_worker_spec moex_placement_worker(const moex_placement *p, uint32_t i);

/* The r worker ids holding (layer, expert), primary first, all distinct;
 * NULL when layer or expert is out of range. Valid until the placement is freed. */
const uint32_t *moex_placement_lookup(const moex_placement *p, uint32_t layer, uint32_t expert);

/* Replica slots held by a worker (0 for an unknown id). */
size_t moex_placement_load(const moex_placement *p, uint32_t worker_id);
/* The experts a worker holds, in (layer, expert) order: fills out[0..cap) and returns how many there are. */
size_t moex_placement_held(const moex_placement *p, uint32_t worker_id, moex_expert_ref *out, size_t cap);

/* What one worker must do to go from one placement to another. */
typedef struct moex_placement_change {
    uint32_t worker_id;
    uint32_t n_load, n_drop;
    moex_expert_ref *load, *drop; /* in (layer, expert) order */
} moex_placement_change;

typedef struct moex_placement_diff {
    uint32_t n_workers;               /* every worker of either placement, by id */
    moex_placement_change *workers;
    uint64_t moved;                   /* replica slots that change worker (= total loads) */
    moex_expert_ref *storage;         /* owns the load/drop lists */
} moex_placement_diff;

/* Both placements must have the same layers and experts (replicas may differ). */
int moex_placement_diff_build(const moex_placement *from, const moex_placement *to, moex_placement_diff *out,
                              moex_error *err);
void moex_placement_diff_free(moex_placement_diff *d);

#endif
