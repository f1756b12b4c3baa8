/* Private to the hub: its counters, updated by the network thread, the
 * registry and the executor, read by anyone (metrics print, /metrics). */
#ifndef MOEX_HUB_METRICS_H
#define MOEX_HUB_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

typedef struct hub_metrics {
    atomic_uint_fast64_t dispatches, hedges_sent, hedges_won, cancels, timeouts, redispatches, fallbacks, verified,
        verify_mismatches, evictions, bytes_in, bytes_out, refused, bad_frames, bad_results, joins, rebalances,
        messages_out, errors_in;
} hub_metrics;

#define HUB_COUNT(m, field) atomic_fetch_add_explicit(&(m)->field, 1, memory_order_relaxed)
#define HUB_ADD(m, field, n) atomic_fetch_add_explicit(&(m)->field, (uint_fast64_t)(n), memory_order_relaxed)
#define HUB_GET(m, field) ((unsigned long long)atomic_load_explicit(&(m)->field, memory_order_relaxed))

#endif
