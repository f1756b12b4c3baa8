/* Internal to the placement module: the placement's representation. */
#ifndef MOEX_PLACEMENT_INTERNAL_H
#define MOEX_PLACEMENT_INTERNAL_H

#include "placement/placement.h"

struct moex_placement {
    uint32_t n_layers, n_experts, replicas, n_workers;
    uint64_t seed;
    moex_worker_spec *workers;  /* sorted by id */
    size_t *loads;              /* replica slots per worker, same order */
    uint32_t *table;            /* [layer][expert][replica] -> worker id */
};

/* Index of a worker id in p->workers, -1 when absent. */
int moex_placement_worker_index(const moex_placement *p, uint32_t id);

#endif
