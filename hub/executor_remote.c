/* The remote expert executor: one DISPATCH per active expert of a layer, sent
 * to h replicas chosen by observed latency; the first valid RESULT wins and
 * the others are cancelled. Deadlines re-dispatch to another replica; an
 * expert with no live replica is computed here from the hub's own weights, so
 * no token is ever lost. Results are combined in the same slot order as the
 * local executor, with the same rounding, so the output equals --local. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hub/dist.h"

/* ---- scratch, grown once per batch size ---- */

static int reserve(moex_hub *hub, int64_t n_tokens, int64_t n_pairs, int n_tasks) {
    const size_t d = (size_t)hub->m->hp.n_embd;
    if (n_pairs > hub->cap_pairs) {
        free(hub->x_wire);
        free(hub->gather);
        free(hub->check);
        free(hub->slot_of_pair);
        hub->x_wire = malloc((size_t)n_pairs * d * sizeof(float));
        hub->gather = malloc((size_t)n_pairs * d * sizeof(float));
        hub->check = malloc((size_t)n_pairs * d * sizeof(float));
        hub->slot_of_pair = malloc((size_t)n_pairs * 2 * sizeof(int32_t));
        if (!hub->tmp) hub->tmp = malloc(moex_wire_tmp_bytes((int64_t)d));
        hub->cap_pairs = hub->x_wire && hub->gather && hub->check && hub->slot_of_pair && hub->tmp ? n_pairs : 0;
        if (!hub->cap_pairs) return -1;
    }
    (void)n_tokens;
    if (n_tasks > hub->cap_tasks) {
        hub_task *grown = realloc(hub->tasks, (size_t)n_tasks * sizeof *grown);
        if (!grown) return -1;
        memset(grown + hub->cap_tasks, 0, (size_t)(n_tasks - hub->cap_tasks) * sizeof *grown);
        hub->tasks = grown;
        hub->cap_tasks = n_tasks;
    }
    return 0;
}

/* Per-task buffers, sized for n tokens; kept across layers. */
static int task_reserve(hub_task *t, int64_t n, size_t d, size_t frame_bytes) {
    free(t->rows);
    free(t->gates);
    free(t->result);
    free(t->dup);
    free(t->frame);
    t->rows = malloc((size_t)n * sizeof *t->rows);
    t->gates = malloc((size_t)n * sizeof *t->gates);
    t->result = malloc((size_t)n * d * sizeof *t->result);
    t->dup = malloc((size_t)n * d * sizeof *t->dup);
    t->frame = malloc(frame_bytes);
    return t->rows && t->gates && t->result && t->dup && t->frame ? 0 : -1;
}

/* ---- choosing replicas ---- */

static uint64_t next_random(moex_hub *hub) {
    uint64_t z = (hub->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Expected wait for one more dispatch: its typical round trip times the work
 * already queued on it in this layer, so a prefill layer's many experts
 * spread over the replicas instead of piling onto the fastest. */
static float estimate_ms(const hub_worker *w) {
    float lat = w->lat_ewma_ms < 0 ? 0.0f : w->lat_ewma_ms;
    return (lat + 0.05f) * (float)(1 + w->inflight);
}

static bool already_sent(const hub_task *t, uint32_t id) {
    for (int i = 0; i < t->n_sent; i++)
        if (t->sent_to[i] == id) return true;
    return false;
}

/* Usable replicas of (layer, expert) not yet tried, fastest first. */
static int candidates(moex_hub *hub, int layer, const hub_task *t, hub_worker **out) {
    if (!hub->placement) return 0;
    const uint32_t *ids = moex_placement_lookup(hub->placement, (uint32_t)layer, (uint32_t)t->expert);
    if (!ids) return 0;
    int n = 0;
    for (uint32_t i = 0; i < moex_placement_replicas(hub->placement); i++) {
        hub_worker *w = hub_worker_by_id(hub, ids[i]);
        if (!hub_worker_usable(hub, w, layer, t->expert) || already_sent(t, w->id)) continue;
        int j = n++;
        for (; j > 0 && estimate_ms(out[j - 1]) > estimate_ms(w); j--) out[j] = out[j - 1];
        out[j] = w;
    }
    return n;
}

/* The pool's typical latency: the median of the workers' estimates (0 when none known). */
static float pool_median_ms(const moex_hub *hub) {
    float v[HUB_MAX_WORKERS];
    int n = 0;
    for (int i = 0; i < hub->n_workers; i++)
        if (hub->workers[i]->lat_ewma_ms >= 0 && hub->workers[i]->wsi) v[n++] = hub->workers[i]->lat_ewma_ms;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            float x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    return n ? v[n / 2] : 0.0f;
}

static void send_to(moex_hub *hub, hub_task *t, hub_worker *w, double now) {
    int i = t->n_sent++;
    t->sent_to[i] = w->id;
    t->sent_at[i] = now;
    t->send_failed[i] = false;
    w->inflight++;
    w->n_dispatched++;
    hub->metrics.dispatches++;
    hub_send(hub, w, t->frame, t->frame_len);
}

/* Paper §4.1, adaptive: one replica while the fastest is as fast as the pool;
 * two at once when its recent latency is well above the pool's; and, like
 * Dean & Barroso's hedged requests, a deferred second copy when the answer is
 * late against the primary's own history. */
static int auto_hedge_now(moex_hub *hub, const hub_worker *primary, float median) {
    if (primary->lat_ewma_ms >= 0 && median > 0 && primary->lat_ewma_ms > 2.0f * median + 2.0f) return 2;
    return 1;
}

static double auto_hedge_delay_s(const hub_worker *primary, float median) {
    float base = primary->lat_ewma_ms >= 0 ? primary->lat_ewma_ms : (median > 0 ? median : 5.0f);
    float ms = 3.0f * base + 2.0f;
    return ms / 1000.0;
}

/* Sends a task to its first replicas; no replica: computed here. */
static void dispatch_task(moex_hub *hub, int layer, hub_task *t, double now) {
    hub_worker *c[MOEX_PLACEMENT_MAX_REPLICAS];
    int n = candidates(hub, layer, t, c);
    t->hedge_at_s = INFINITY;
    if (n == 0) {
        t->local = true;
        hub->metrics.fallbacks++;
        return;
    }
    int h = hub->cfg.hedge;
    if (h == 0) {
        float median = pool_median_ms(hub);
        h = auto_hedge_now(hub, c[0], median);
        if (n > h) t->hedge_at_s = now + auto_hedge_delay_s(c[0], median);
    }
    if (h > n) h = n;
    for (int i = 0; i < h; i++) send_to(hub, t, c[i], now);
    hub->metrics.hedges_sent += (uint64_t)(h - 1);
    t->deadline_s = now + hub->cfg.timeout_ms / 1000.0;
}

/* The task's sends all failed or timed out: another replica, else here. */
static int redispatch(moex_hub *hub, int layer, hub_task *t, double now, moex_error *err) {
    hub_worker *c[MOEX_PLACEMENT_MAX_REPLICAS];
    int n = t->n_sent < HUB_MAX_SENDS ? candidates(hub, layer, t, c) : 0;
    if (n > 0) {
        send_to(hub, t, c[0], now);
        hub->metrics.redispatches++;
        t->deadline_s = now + hub->cfg.timeout_ms / 1000.0;
        t->hedge_at_s = INFINITY;
        return 0;
    }
    if (!hub->cfg.local_fallback)
        return moex_fail(err, "expert %d of layer %d has no live replica and --no-local-fallback is set", t->expert, layer);
    t->local = true;
    hub->metrics.fallbacks++;
    return 0;
}

static bool send_outstanding(moex_hub *hub, const hub_task *t, int i) {
    if (t->send_failed[i]) return false;
    const hub_worker *w = hub_worker_by_id(hub, t->sent_to[i]);
    return w && w->wsi && !w->closing;
}

/* Checks deadlines; returns the next time something is due. */
static double service_tasks(moex_hub *hub, int layer, double now, int *rc, moex_error *err) {
    double next = INFINITY;
    for (int i = 0; i < hub->n_tasks && *rc == 0; i++) {
        hub_task *t = &hub->tasks[i];
        if (t->done || t->local) continue;
        int outstanding = 0;
        for (int s = 0; s < t->n_sent; s++) outstanding += send_outstanding(hub, t, s);
        if (outstanding == 0) { /* every copy failed or its worker left: no need to wait */
            *rc = redispatch(hub, layer, t, now, err);
        } else if (now >= t->deadline_s) {
            for (int s = 0; s < t->n_sent; s++) {
                if (!send_outstanding(hub, t, s)) continue;
                hub_worker *w = hub_worker_by_id(hub, t->sent_to[s]);
                t->send_failed[s] = true;
                hub_record_latency(w, (float)hub->cfg.timeout_ms);
                w->n_timeouts++;
                hub->metrics.timeouts++;
                if (++w->consecutive_timeouts >= 3 && !w->unhealthy) {
                    w->unhealthy = true;
                    moex_log(MOEX_LOG_WARN, "worker %s: 3 consecutive timeouts, unhealthy until a good heartbeat", w->name);
                }
            }
            *rc = redispatch(hub, layer, t, now, err);
        } else if (now >= t->hedge_at_s) {
            hub_worker *c[MOEX_PLACEMENT_MAX_REPLICAS];
            if (t->n_sent < HUB_MAX_SENDS && candidates(hub, layer, t, c) > 0) {
                send_to(hub, t, c[0], now);
                hub->metrics.hedges_sent++;
            }
            t->hedge_at_s = INFINITY;
        }
        if (!t->done && !t->local) {
            if (t->deadline_s < next) next = t->deadline_s;
            if (t->hedge_at_s < next) next = t->hedge_at_s;
        }
    }
    return next;
}

static void wait_until(moex_hub *hub, double until) {
    double now = moex_time_s();
    double dt = until - now;
    if (dt > 0.05) dt = 0.05; /* re-check liveness regularly */
    if (dt <= 0) return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long ns = ts.tv_nsec + (long)(dt * 1e9);
    ts.tv_sec += ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    pthread_cond_timedwait(&hub->cv, &hub->mu, &ts);
}

/* ---- computing on the hub: fallback and verification ---- */

static int compute_here(moex_hub *hub, int layer, const hub_task *t, float *out) {
    moex_expert_job job = {.w = &hub->m->layers[layer].experts[t->expert], .n_tokens = t->n_tokens, .rows = t->rows,
                           .gates = t->gates, .out = out};
    if (moex_experts_run(hub->pool, &job, 1, hub->x_wire, hub->m->hp.n_embd, NULL)) return -1;
    moex_wire_round_rows(hub->cfg.wire_dtype, out, t->n_tokens, hub->m->hp.n_embd, hub->tmp);
    return 0;
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (!isfinite(num)) return INFINITY;
    return sqrt(num / (den > 0 ? den : 1e-30));
}

/* A CPU worker runs the hub's own kernels on the same inputs: its results are
 * bit-identical on the same SIMD path, so anything above float noise is wrong.
 * Other backends (GPU) sum in a different order and may land one 8-bit
 * activation step away (~1e-2); corruption is orders of magnitude larger. */
static double verify_tolerance(const hub_worker *w) {
    return !w || w->backend == MOEX_BACKEND_CPU ? 1e-3 : 3e-2;
}

/* Recomputes a result here; a worker that disagrees is evicted and the hub's answer used. */
static int verify_task(moex_hub *hub, int layer, hub_task *t) {
    const size_t n = (size_t)t->n_tokens * (size_t)hub->m->hp.n_embd;
    if (compute_here(hub, layer, t, hub->check)) return -1;
    pthread_mutex_lock(&hub->mu);
    hub->metrics.verified++;
    hub_worker *winner = hub_worker_by_id(hub, t->winner);
    double e = rel_l2(t->result, hub->check, n);
    if (e > verify_tolerance(winner)) {
        hub->metrics.verify_mismatches++;
        char why[128];
        snprintf(why, sizeof why, "result of layer %d expert %d differs from the hub's (relative error %.3g)", layer,
                 t->expert, e);
        if (winner) hub_evict(hub, winner, why);
        memcpy(t->result, hub->check, n * sizeof(float));
    }
    hub_worker *second = t->dup_seen ? hub_worker_by_id(hub, t->dup_from) : NULL;
    if (t->dup_seen && rel_l2(t->dup, hub->check, n) > verify_tolerance(second)) {
        hub->metrics.verify_mismatches++;
        if (second) hub_evict(hub, second, "a hedged duplicate differs from the hub's result");
    }
    pthread_mutex_unlock(&hub->mu);
    return 0;
}

/* ---- the executor ---- */

/* Groups (token, expert) pairs into one task per active expert; records
 * where each pair's result lives. Touches only tasks the network thread
 * cannot see (hub->n_tasks is 0 meanwhile). */
static int build_tasks(moex_hub *hub, const moex_moe_request *req, int *n_tasks_out) {
    const int k = req->n_used, n_expert = hub->n_experts;
    const int64_t n_pairs = req->n_tokens * k;
    int32_t task_of_expert[4096];
    int64_t counts[4096];
    if (n_expert > 4096) return -1; /* the protocol's expert limit */
    for (int e = 0; e < n_expert; e++) task_of_expert[e] = -1;
    int n_tasks = 0;
    for (int64_t p = 0; p < n_pairs; p++) {
        int e = req->expert_ids[p];
        if (e < 0 || e >= n_expert) return -1;
        if (task_of_expert[e] < 0) {
            task_of_expert[e] = n_tasks;
            counts[n_tasks++] = 0;
        }
        counts[task_of_expert[e]]++;
    }
    if (reserve(hub, req->n_tokens, n_pairs, n_tasks)) return -1;
    const size_t d = (size_t)hub->m->hp.n_embd;
    for (int i = 0; i < n_tasks; i++) {
        hub_task *t = &hub->tasks[i];
        moex_proto_tensor_msg m = {.type = MOEX_MSG_DISPATCH, .n_tokens = (uint32_t)counts[i], .hidden = (uint16_t)d,
                                   .dtype = (uint8_t)hub->cfg.wire_dtype};
        size_t fb = moex_proto_tensor_frame_bytes(&m);
        if (counts[i] > t->cap_tokens || fb > t->cap_frame) {
            if (task_reserve(t, counts[i], d, fb)) return -1;
            t->cap_tokens = counts[i];
            t->cap_frame = fb;
        }
        t->frame_len = fb;
        t->n_tokens = 0;
    }
    for (int64_t p = 0; p < n_pairs; p++) {
        int ti = task_of_expert[req->expert_ids[p]];
        hub_task *t = &hub->tasks[ti];
        t->expert = req->expert_ids[p];
        t->rows[t->n_tokens] = (int32_t)(p / k);
        t->gates[t->n_tokens] = req->gate_weights[p];
        hub->slot_of_pair[2 * p] = ti;
        hub->slot_of_pair[2 * p + 1] = (int32_t)t->n_tokens++;
    }
    *n_tasks_out = n_tasks;
    return 0;
}

static int encode_task(moex_hub *hub, int layer, hub_task *t, moex_error *err) {
    const int64_t d = hub->m->hp.n_embd;
    moex_wire_round_gates(hub->cfg.wire_dtype, t->gates, t->n_tokens);
    for (int64_t i = 0; i < t->n_tokens; i++)
        memcpy(hub->gather + i * d, hub->x_wire + (int64_t)t->rows[i] * d, (size_t)d * sizeof(float));
    moex_proto_tensor_msg m = {.type = MOEX_MSG_DISPATCH, .seq = t->seq, .layer = (uint16_t)layer,
                               .expert = (uint16_t)t->expert, .n_tokens = (uint32_t)t->n_tokens, .hidden = (uint16_t)d,
                               .dtype = (uint8_t)hub->cfg.wire_dtype};
    size_t len;
    if (moex_proto_encode_tensor_f32(&m, hub->gather, t->gates, t->frame, t->frame_len, &len, err)) return -1;
    t->frame_len = len;
    return 0;
}

static void reset_task(hub_task *t, uint32_t seq) {
    t->seq = seq;
    t->n_sent = 0;
    t->done = t->local = t->dup_pending = t->dup_seen = t->verify = false;
    t->deadline_s = t->hedge_at_s = INFINITY;
}

static int remote_run(void *ctx, const moex_moe_request *req, moex_error *err) {
    moex_hub *hub = ctx;
    const int layer = req->layer, k = req->n_used;
    const int64_t d = hub->m->hp.n_embd;
    if (req->n_tokens > hub->cfg.max_batch)
        return moex_fail(err, "batch of %lld tokens over the hub's --batch %lld", (long long)req->n_tokens,
                         (long long)hub->cfg.max_batch);
    pthread_mutex_lock(&hub->mu); /* late answers to the previous layer now find no task */
    hub->n_tasks = 0;
    pthread_mutex_unlock(&hub->mu);
    int n_tasks = 0;
    if (reserve(hub, req->n_tokens, req->n_tokens * k, 1) || build_tasks(hub, req, &n_tasks))
        return moex_fail(err, "out of memory (or a bad expert id) in layer %d", layer);
    memcpy(hub->x_wire, req->x, (size_t)(req->n_tokens * d) * sizeof(float));
    moex_wire_round_rows(hub->cfg.wire_dtype, hub->x_wire, req->n_tokens, d, hub->tmp);
    uint32_t seq0;
    pthread_mutex_lock(&hub->mu);
    seq0 = hub->next_seq;
    hub->next_seq += (uint32_t)n_tasks;
    pthread_mutex_unlock(&hub->mu);
    int rc = 0;
    for (int i = 0; i < n_tasks && rc == 0; i++) {
        reset_task(&hub->tasks[i], seq0 + (uint32_t)i);
        rc = encode_task(hub, layer, &hub->tasks[i], err);
    }
    if (rc) return rc;

    pthread_mutex_lock(&hub->mu);
    hub->task_layer = layer;
    hub->task_seq0 = seq0;
    hub->n_tasks = n_tasks;
    for (int i = 0; i < hub->n_workers; i++) hub->workers[i]->inflight = 0;
    double now = moex_time_s();
    for (int i = 0; i < n_tasks; i++) dispatch_task(hub, layer, &hub->tasks[i], now);
    hub_wake_net(hub);
    while (rc == 0) {
        hub_task *local = NULL;
        int pending = 0;
        for (int i = 0; i < n_tasks; i++) {
            hub_task *t = &hub->tasks[i];
            if (t->done) continue;
            pending++;
            if (t->local && !local) local = t;
        }
        if (!pending) break;
        if (atomic_load(&hub->stop)) {
            rc = moex_fail(err, "hub stopping");
            break;
        }
        if (local) { /* compute while the network works */
            pthread_mutex_unlock(&hub->mu);
            if (compute_here(hub, layer, local, local->result)) rc = moex_fail(err, "expert computation failed");
            pthread_mutex_lock(&hub->mu);
            local->done = true;
            continue;
        }
        double next = service_tasks(hub, layer, moex_time_s(), &rc, err);
        hub_wake_net(hub);
        if (rc == 0) wait_until(hub, next);
    }
    for (int i = 0; i < n_tasks; i++) {
        hub_task *t = &hub->tasks[i];
        t->verify = !t->local && hub->cfg.verify_p > 0 && (next_random(hub) >> 11) * 0x1.0p-53 < hub->cfg.verify_p;
        t->dup_seen = !t->local && t->dup_pending; /* its dup buffer no longer changes */
    }
    pthread_mutex_unlock(&hub->mu);
    if (rc) return rc;

    /* Sampled results are recomputed here; two replicas that disagree are settled here too. */
    const size_t d_sz = (size_t)d;
    for (int i = 0; i < n_tasks; i++) {
        hub_task *t = &hub->tasks[i];
        bool disagree = false;
        if (t->dup_seen) {
            pthread_mutex_lock(&hub->mu);
            double tol = fmax(verify_tolerance(hub_worker_by_id(hub, t->winner)),
                              verify_tolerance(hub_worker_by_id(hub, t->dup_from)));
            pthread_mutex_unlock(&hub->mu);
            disagree = rel_l2(t->dup, t->result, (size_t)t->n_tokens * d_sz) > tol;
        }
        if ((t->verify || disagree) && verify_task(hub, layer, t)) return moex_fail(err, "verification failed to compute");
    }
    for (int64_t tok = 0; tok < req->n_tokens; tok++) {
        float *o = req->out + tok * d;
        for (int j = 0; j < k; j++) {
            const int64_t p = tok * k + j;
            const hub_task *t = &hub->tasks[hub->slot_of_pair[2 * p]];
            const float *r = t->result + (int64_t)hub->slot_of_pair[2 * p + 1] * d;
            if (j == 0) memcpy(o, r, (size_t)d * sizeof(float));
            else
                for (int64_t i = 0; i < d; i++) o[i] += r[i];
        }
    }
    return 0;
}

moex_expert_executor moex_hub_executor(moex_hub *hub) {
    return (moex_expert_executor){.ctx = hub, .run = remote_run};
}

/* ---- called by the network thread, under mu ---- */

static hub_task *task_for(moex_hub *hub, uint32_t seq) {
    uint32_t i = seq - hub->task_seq0;
    return i < (uint32_t)hub->n_tasks ? &hub->tasks[i] : NULL;
}

static int send_index(const hub_task *t, uint32_t worker_id) {
    for (int i = 0; i < t->n_sent; i++)
        if (t->sent_to[i] == worker_id) return i;
    return -1;
}

void hub_task_result(moex_hub *hub, hub_worker *w, const moex_proto_msg *msg) {
    hub_task *t = task_for(hub, msg->h.seq);
    if (!t) return; /* a straggler from an earlier layer: already answered */
    int s = send_index(t, w->id);
    const moex_proto_tensor_view *v = &msg->u.tensor;
    if (s < 0 || msg->h.layer != hub->task_layer || msg->h.expert != t->expert || v->n_tokens != t->n_tokens ||
        v->hidden != hub->m->hp.n_embd) {
        hub->metrics.bad_frames++;
        moex_log(MOEX_LOG_WARN, "worker %s: RESULT seq %u does not match its DISPATCH; ignored", w->name, msg->h.seq);
        return;
    }
    if (t->local) return; /* being computed here after its replicas failed */
    double now = moex_time_s();
    hub_record_latency(w, (float)((now - t->sent_at[s]) * 1000.0));
    w->consecutive_timeouts = 0;
    const size_t d = (size_t)hub->m->hp.n_embd;
    if (t->done) {
        if (!t->local && !t->dup_pending && t->winner != w->id) { /* a hedged duplicate: compared after the layer */
            for (uint32_t i = 0; i < v->n_tokens; i++) moex_proto_tensor_row_f32(v, i, t->dup + i * d);
            t->dup_from = w->id;
            t->dup_pending = true;
        }
        return;
    }
    for (uint32_t i = 0; i < v->n_tokens; i++) moex_proto_tensor_row_f32(v, i, t->result + i * d);
    t->done = true;
    t->winner = w->id;
    w->n_won++;
    if (s != 0) hub->metrics.hedges_won++;
    for (int i = 0; i < t->n_sent; i++) { /* cancel the stragglers */
        if (i == s || !send_outstanding(hub, t, i)) continue;
        /* Their answer will not come: what they took so far is a lower bound
         * of their latency, so a slow replica stops being picked first. */
        hub_worker *loser = hub_worker_by_id(hub, t->sent_to[i]);
        hub_record_latency(loser, (float)((now - t->sent_at[i]) * 1000.0));
        uint8_t buf[64];
        size_t n;
        if (!moex_proto_encode_cancel(t->seq, (uint16_t)hub->task_layer, (uint16_t)t->expert, buf, sizeof buf, &n, NULL)) {
            hub_send(hub, hub_worker_by_id(hub, t->sent_to[i]), buf, n);
            hub->metrics.cancels++;
        }
    }
    pthread_cond_broadcast(&hub->cv);
}

void hub_task_error(moex_hub *hub, hub_worker *w, uint32_t seq) {
    hub_task *t = task_for(hub, seq);
    if (!t || t->done) return;
    int s = send_index(t, w->id);
    if (s < 0) return;
    t->send_failed[s] = true;
    pthread_cond_broadcast(&hub->cv);
}
