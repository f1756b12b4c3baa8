/* The worker's latency samples (moex_worker_timing, worker.h): fixed rings
 * of the latest samples, summarized at exit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "worker/worker.h"

void moex_worker_timing_add(moex_worker_timing *t, double seconds) {
    t->ms[t->n % MOEX_WORKER_TIMING_SAMPLES] = (float)(seconds * 1e3);
    t->n++;
}

double moex_worker_timing_quantile(const moex_worker_timing *t, double q) {
    const size_t n = t->n < MOEX_WORKER_TIMING_SAMPLES ? (size_t)t->n : MOEX_WORKER_TIMING_SAMPLES;
    float sorted[MOEX_WORKER_TIMING_SAMPLES];
    memcpy(sorted, t->ms, n * sizeof *sorted);
    return moex_quantile_sorted_f32(sorted, n, q);
}

void moex_worker_timing_record(moex_worker_stats *st, moex_worker_timer k, bool large, double seconds) {
    moex_worker_timing_add(&st->timing[k], seconds);
    if (large) moex_worker_timing_add(&st->timing_large[k], seconds);
}

const char *moex_worker_timer_name(moex_worker_timer k) {
    static const char *const names[MOEX_WT_COUNT] = {"receive", "queued", "compute", "vk-stage",
                                                     "vk-gpu",  "encode", "outbox"};
    return k >= 0 && k < MOEX_WT_COUNT ? names[k] : "?";
}

/* Appends "stage p50 X p99 Y ms, ..." of each timer with samples; returns the new length. */
static size_t append_stages(const moex_worker_timing *timing, char *buf, size_t n, size_t cap) {
    bool any = false;
    for (int k = 0; k < MOEX_WT_COUNT && n < cap; k++) {
        const moex_worker_timing *t = &timing[k];
        if (!t->n) continue;
        n += (size_t)snprintf(buf + n, cap - n, "%s %s p50 %.3f p99 %.3f ms", any ? "," : "", moex_worker_timer_name(k),
                              moex_worker_timing_quantile(t, 0.5), moex_worker_timing_quantile(t, 0.99));
        any = true;
    }
    if (!any && n < cap) n += (size_t)snprintf(buf + n, cap - n, " no samples");
    return n;
}

void moex_worker_timing_line(const moex_worker_stats *st, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "worker timing:");
    n = append_stages(st->timing, buf, n, cap);
    if (n < cap)
        n += (size_t)snprintf(buf + n, cap - n, " (%llu batches, %llu on the socket thread, %llu messages written)",
                              (unsigned long long)st->batches, (unsigned long long)st->inline_batches,
                              (unsigned long long)st->messages_out);
    if (!st->large_batches || n >= cap) return;
    n += (size_t)snprintf(buf + n, cap - n, "\nworker timing, batches over %d rows:", MOEX_WORKER_SMALL_ROWS);
    n = append_stages(st->timing_large, buf, n, cap);
    if (n < cap) snprintf(buf + n, cap - n, " (%llu batches)", (unsigned long long)st->large_batches);
}
