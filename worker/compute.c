/* The compute thread: owns the core and the pool, applies assignments and
 * turns queued DISPATCHes into RESULT (or ERROR) frames for the outbox. It
 * never touches the socket: finished messages are handed over under the
 * session mutex and the lws thread is woken with lws_cancel_service(); it
 * sleeps on the session's condition variable until work arrives.
 *
 * The lws thread runs run_batch itself for a small message while this
 * thread is parked waiting for work (worker_compute_inline): s->running
 * keeps the two apart.
 *
 * A batch is every dispatch queued when the thread takes work (whole
 * received messages: the backlog holds one layer's, a prefill or a hub's
 * per-layer message sends several), computed together: on the CPU in one
 * moex_experts_run, on Vulkan (--backend vulkan) in one submission with the
 * dispatches of experts the GPU does not hold on the CPU beside it. The
 * RESULTs of one received message leave as one message, frames back to
 * back; a dispatch cancelled meanwhile is left out.
 *
 * --backend vulkan: assigned experts are also uploaded to the GPU core
 * (core_vk.c). The CPU core still binds every assigned expert, as a
 * fallback for one the GPU could not take. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/session_internal.h"

/* One dispatch of the batch being computed. */
typedef struct batch_item {
    moex_worker_item it;         /* the decoded dispatch; holds a reference to its message */
    int gpu, cpu;                /* its index in the GPU / CPU batch, or -1 */
    bool failed;                 /* refused or failed: answered with ERROR err */
    moex_error err;
    float *values;               /* n_tokens x hidden, once computed */
    bool cancelled;              /* seen cancelled when its frame was encoded */
    size_t off, len;             /* its frame in its message's buffer */
} batch_item;

typedef struct compute {
    session *s;
    moex_pool *pool;
    moex_worker_core *core;
    bool *want;                  /* n_layers x n_experts: in the assignment being applied */
    moex_proto_expert *list;
    uint32_t list_cap;
    uint64_t rng;
    moex_worker_vk *gpu;         /* --backend vulkan, else NULL */
    int cap;                     /* dispatches per batch at most: the backlog's capacity */
    batch_item *items;
    uint32_t *seqs;              /* shared with the lws thread (CANCEL) while running */
    bool *cancelled;
    moex_worker_buf *out;        /* one message per received message of the batch (buffers swapped with the outbox) */
} compute;

#define BATCH_TOKENS 4096        /* tokens per batch (one received message may exceed it alone) */

/* ---- assignments ---- */

static const moex_expert_weights *model_expert(const moex_model *m, int layer, int expert) {
    return &m->layers[layer].experts[expert];
}

/* --backend vulkan: GPU slots for n experts. With --memory-budget the one
 * allocation is sized from the budget (so later assignments fit without
 * moving), else from the assignment; an assignment over the budget still
 * gets its slots, with a warning. */
static void reserve_gpu_slots(compute *c, int n, uint32_t g) {
    const moex_hparams *hp = &c->s->m->hp;
    const uint64_t budget = c->s->budget_given, slot = moex_worker_vk_slot_bytes(c->gpu);
    const int64_t all = (int64_t)hp->n_layer * hp->n_expert, by_budget = budget ? (int64_t)(budget / slot) : 0;
    int64_t target = by_budget > n ? (by_budget < all ? by_budget : all) : n;
    if (target <= moex_worker_vk_capacity(c->gpu)) return;
    moex_error err;
    if (!moex_worker_vk_reserve(c->gpu, (int)target, &err)) return;
    if (target > n && n > moex_worker_vk_capacity(c->gpu) && !moex_worker_vk_reserve(c->gpu, n, &err)) return;
    moex_log(MOEX_LOG_WARN, "worker: assignment %u: no GPU room for %d experts (%s); the others run on the CPU", g, n,
             err.msg);
}

typedef struct load_progress {
    int done, total;
    size_t bytes, total_bytes;
    double t0, next_log;
} load_progress;

static void log_progress(const load_progress *p, bool last) {
    const double dt = moex_time_s() - p->t0;
    moex_log(MOEX_LOG_INFO, "worker: vulkan: %s experts %d/%d (%.1f of %.1f MiB, %.1f MiB/s)", last ? "loaded" : "loading",
             p->done, p->total, (double)p->bytes / (1 << 20), (double)p->total_bytes / (1 << 20),
             dt > 0 ? (double)p->bytes / (1 << 20) / dt : 0.0);
}

/* Uploads one expert to the GPU; its host pages are then left to the kernel
 * (the CPU fallback refaults them if it ever needs them). */
static void load_on_gpu(compute *c, int l, int e, const moex_expert_weights *w, load_progress *p) {
    moex_error err;
    if (moex_worker_vk_hold(c->gpu, l, e, w, &err)) {
        moex_log(MOEX_LOG_WARN, "worker: expert (%d, %d) stays on the CPU: %s", l, e, err.msg);
        return;
    }
    moex_worker_release(w);
    p->done++;
    p->bytes += moex_worker_expert_bytes(w);
    if (moex_time_s() >= p->next_log) {
        log_progress(p, false);
        p->next_log = moex_time_s() + 1.0;
    }
}

/* Holds exactly the experts in c->list: drops (and releases the pages of)
 * the others, binds and prefaults the new ones (uploads them, on Vulkan). */
static void apply_assignment(compute *c, uint32_t n, uint32_t g) {
    const moex_model *m = c->s->m;
    const int nl = m->hp.n_layer, ne = m->hp.n_expert;
    memset(c->want, 0, (size_t)nl * (size_t)ne * sizeof *c->want);
    for (uint32_t i = 0; i < n; i++) c->want[(size_t)c->list[i].layer * ne + c->list[i].expert] = true;
    int added = 0, dropped = 0, n_want = 0;
    size_t bytes = 0;
    load_progress lp = {.t0 = moex_time_s(), .next_log = moex_time_s() + 1.0};
    for (int l = 0; l < nl; l++) {
        for (int e = 0; e < ne; e++) {
            const moex_expert_weights *w = model_expert(m, l, e);
            const bool want = c->want[(size_t)l * ne + e];
            if (moex_worker_core_holds(c->core, l, e) && !want) {
                moex_worker_core_drop(c->core, l, e);
                if (c->gpu) moex_worker_vk_drop(c->gpu, l, e);
                moex_worker_release(w);
                dropped++;
            }
            if (want) {
                n_want++;
                bytes += moex_worker_expert_bytes(w);
                if (c->gpu && !moex_worker_vk_holds(c->gpu, l, e)) {
                    lp.total++;
                    lp.total_bytes += moex_worker_expert_bytes(w);
                }
            }
        }
    }
    if (c->gpu) reserve_gpu_slots(c, n_want, g);
    for (int l = 0; l < nl; l++) {
        for (int e = 0; e < ne; e++) {
            const moex_expert_weights *w = model_expert(m, l, e);
            if (!c->want[(size_t)l * ne + e]) continue;
            if (!moex_worker_core_holds(c->core, l, e)) {
                moex_error err;
                if (moex_worker_core_hold(c->core, l, e, w, &err)) {
                    moex_log(MOEX_LOG_ERROR, "worker: cannot hold expert (%d, %d): %s", l, e, err.msg);
                    continue;
                }
                if (!c->gpu) moex_worker_prefault(w);
                added++;
            }
            if (c->gpu && !moex_worker_vk_holds(c->gpu, l, e)) load_on_gpu(c, l, e, w, &lp);
        }
    }
    if (lp.total) {
        log_progress(&lp, true);
        moex_error err;
        if (moex_worker_vk_warm_up(c->gpu, &err)) moex_log(MOEX_LOG_WARN, "worker: vulkan: warm-up failed: %s", err.msg);
    }
    moex_log(MOEX_LOG_INFO, "worker: assignment %u: holding %d experts (%.1f MiB), %d added, %d dropped", g,
             moex_worker_core_n_held(c->core), (double)bytes / (1 << 20), added, dropped);
    if (c->gpu)
        moex_log(MOEX_LOG_INFO, "worker: vulkan: %d experts resident in %d slots of %.2f MiB", moex_worker_vk_n_held(c->gpu),
                 moex_worker_vk_capacity(c->gpu), (double)moex_worker_vk_slot_bytes(c->gpu) / (1 << 20));
    const uint64_t budget = c->s->o->memory_budget;
    if (budget && bytes > budget)
        moex_log(MOEX_LOG_WARN, "worker: assignment %u needs %.1f MiB, over the memory budget of %.1f MiB", g,
                 (double)bytes / (1 << 20), (double)budget / (1 << 20));
}

/* Called with mu held: takes the pending assignment's list. */
static int take_assignment(compute *c, uint32_t *n, uint32_t *g) {
    session *s = c->s;
    if (s->assign_n > c->list_cap) {
        moex_proto_expert *p = realloc(c->list, s->assign_n * sizeof *p);
        if (!p) return -1;
        c->list = p;
        c->list_cap = s->assign_n;
    }
    memcpy(c->list, s->assign_list, s->assign_n * sizeof *c->list);
    *n = s->assign_n;
    *g = s->assign_g;
    s->assign_pending = false;
    return 0;
}

static void run_assignment(compute *c) {
    session *s = c->s;
    uint32_t n = 0, g = 0;
    const uint32_t conn = s->conn, want_n = s->assign_n;
    const int rc = take_assignment(c, &n, &g);
    pthread_mutex_unlock(&s->mu);
    if (rc) moex_log(MOEX_LOG_ERROR, "worker: out of memory for an assignment of %u experts", want_n);
    else apply_assignment(c, n, g);
    pthread_mutex_lock(&s->mu);
    if (!rc && conn == s->conn && !s->assign_pending) {
        s->g = g;
        s->state = MOEX_STATE_READY;
        s->hb_now = true;
        pthread_cond_broadcast(&s->cv); /* the download thread waits for it */
    }
}

/* ---- dispatches ---- */

/* The fault injection's noise: each value moves by up to scale times the
 * row's RMS (by default ten: far outside any numerical tolerance; smaller
 * scales find the smallest corruption --verify catches). */
static void corrupt(compute *c, float *v, int64_t n_tokens, int64_t hidden, double scale) {
    for (int64_t t = 0; t < n_tokens; t++) {
        float *row = v + t * hidden;
        double ss = 0;
        for (int64_t i = 0; i < hidden; i++) ss += (double)row[i] * row[i];
        const float amp = (float)(scale * (sqrt(ss / (double)hidden) + 1e-3));
        for (int64_t i = 0; i < hidden; i++) row[i] += amp * (float)(2.0 * moex_rand01(&c->rng) - 1.0);
    }
}

/* --inject-corrupt-prob: with that probability, noise on the values. */
static void maybe_corrupt(compute *c, batch_item *b) {
    const moex_worker_options *o = c->s->o;
    if (o->inject_corrupt_prob <= 0 || moex_rand01(&c->rng) >= o->inject_corrupt_prob) return;
    moex_log(MOEX_LOG_DEBUG, "worker: inject: corrupting the result of dispatch %u", b->it.msg.h.seq);
    corrupt(c, b->values, b->it.msg.h.n_tokens, b->it.msg.h.hidden, o->inject_corrupt_scale);
}

/* Called with mu held: whether the oldest queued message has been read whole. */
static bool work_ready(const session *s) {
    const moex_worker_item *head = moex_worker_backlog_at(s->backlog, 0);
    return head && ((const rx_msg *)head->owner)->sealed;
}

/* Called with mu held: the dispatches of the oldest queued message (adjacent in the backlog). */
static int head_group_size(const session *s) {
    const moex_worker_item *head = moex_worker_backlog_at(s->backlog, 0), *it;
    int k = 0;
    while ((it = moex_worker_backlog_at(s->backlog, k)) && it->group == head->group) k++;
    return k;
}

/* Called with mu held: pops whole received messages, up to the batch's
 * capacity and about BATCH_TOKENS tokens, and marks them running. */
static int take_batch(compute *c) {
    session *s = c->s;
    int n = 0;
    uint64_t tokens = 0;
    while (tokens < BATCH_TOKENS && work_ready(s)) {
        const int k = head_group_size(s);
        if (n + k > c->cap) break; /* k <= cap: the backlog holds no more */
        for (int i = 0; i < k; i++, n++) {
            batch_item *b = &c->items[n];
            moex_worker_backlog_pop(s->backlog, &b->it);
            c->seqs[n] = b->it.msg.h.seq;
            c->cancelled[n] = false;
            tokens += b->it.msg.h.n_tokens;
        }
    }
    s->running = n > 0;
    s->batch_seqs = c->seqs;
    s->batch_cancelled = c->cancelled;
    s->batch_n = n;
    return n;
}

/* Adds a dispatch to the GPU batch when the GPU holds its expert, else to the CPU's. */
static void stage(compute *c, batch_item *b) {
    const moex_proto_msg *msg = &b->it.msg;
    b->gpu = b->cpu = -1;
    b->failed = false;
    b->values = NULL;
    if (c->gpu && moex_worker_vk_holds(c->gpu, msg->h.layer, msg->h.expert)) {
        if (moex_worker_vk_batch_add(c->gpu, msg, &b->err) == 0) b->gpu = moex_worker_vk_batch_count(c->gpu) - 1;
        else b->failed = true;
        return;
    }
    if (moex_worker_core_batch_add(c->core, msg, &b->err) == 0) b->cpu = moex_worker_core_batch_count(c->core) - 1;
    else b->failed = true;
}

/* One batch's stage times (seconds), recorded once the lock is held again. */
typedef struct batch_times {
    double receive, queued, compute, vk_stage, vk_gpu, encode;
    bool vk;
    bool large; /* over MOEX_WORKER_SMALL_ROWS rows */
} batch_times;

/* Computes the n taken dispatches: each gets values, or failed with a reason. */
static void compute_batch(compute *c, int n, batch_times *bt) {
    const double t0 = moex_time_s();
    if (c->gpu) moex_worker_vk_batch_begin(c->gpu);
    moex_worker_core_batch_begin(c->core);
    for (int i = 0; i < n; i++) stage(c, &c->items[i]);
    moex_error gpu_err = {{0}}, cpu_err = {{0}};
    bt->vk = c->gpu && moex_worker_vk_batch_count(c->gpu);
    const int gpu_rc = bt->vk ? moex_worker_vk_batch_run(c->gpu, &gpu_err) : 0;
    const int cpu_rc = moex_worker_core_batch_count(c->core) ? moex_worker_core_batch_run(c->core, &cpu_err) : 0;
    for (int i = 0; i < n; i++) {
        batch_item *b = &c->items[i];
        if (b->failed) continue;
        const int rc = b->gpu >= 0 ? gpu_rc : cpu_rc;
        b->values = rc ? NULL
                       : b->gpu >= 0 ? moex_worker_vk_batch_values(c->gpu, b->gpu)
                                     : moex_worker_core_batch_values(c->core, b->cpu);
        if (!b->values) {
            b->failed = true;
            b->err = b->gpu >= 0 ? gpu_err : cpu_err;
            continue;
        }
        maybe_corrupt(c, b);
    }
    const double t1 = moex_time_s();
    bt->receive = c->items[0].it.rx_s - c->items[0].it.rx_first_s; /* the batch's oldest message */
    bt->queued = t0 - c->items[0].it.rx_s;
    uint64_t rows = 0;
    for (int i = 0; i < n; i++) rows += c->items[i].it.msg.h.n_tokens;
    bt->large = rows > MOEX_WORKER_SMALL_ROWS;
    bt->compute = t1 - t0;
    if (bt->vk) moex_worker_vk_batch_times(c->gpu, &bt->vk_stage, &bt->vk_gpu);
    const int n_gpu = bt->vk ? moex_worker_vk_batch_count(c->gpu) : 0;
    if (n_gpu > 1)
        moex_log(MOEX_LOG_DEBUG, "worker: vulkan: %d dispatches in one submission: %.3f ms", n_gpu, (t1 - t0) * 1e3);
    else if (n > 1)
        moex_log(MOEX_LOG_DEBUG, "worker: %d dispatches of layer %u in one batch: %.3f ms", n, c->items[0].it.msg.h.layer,
                 (t1 - t0) * 1e3);
}

/* Called with mu held. */
static void record_times(session *s, const batch_times *bt) {
    moex_worker_stats *st = &s->stats;
    moex_worker_timing_record(st, MOEX_WT_RECEIVE, bt->large, bt->receive);
    moex_worker_timing_record(st, MOEX_WT_QUEUED, bt->large, bt->queued);
    moex_worker_timing_record(st, MOEX_WT_COMPUTE, bt->large, bt->compute);
    moex_worker_timing_record(st, MOEX_WT_ENCODE, bt->large, bt->encode);
    if (bt->vk) {
        moex_worker_timing_record(st, MOEX_WT_VK_STAGE, bt->large, bt->vk_stage);
        moex_worker_timing_record(st, MOEX_WT_VK_GPU, bt->large, bt->vk_gpu);
    }
    if (bt->large) st->large_batches++;
    s->busy_s += bt->compute;
    s->stats.compute_s += bt->compute;
}

/* --inject-delay-ms: waits on the condition variable so that quit, or a
 * CANCEL of the whole batch, interrupts it. Called with mu held. */
static void inject_delay(compute *c, int n) {
    session *s = c->s;
    const moex_worker_options *o = s->o;
    if (o->inject_delay_prob <= 0 || moex_rand01(&c->rng) >= o->inject_delay_prob) return;
    moex_log(MOEX_LOG_DEBUG, "worker: inject: delaying dispatch %u by %d ms", c->seqs[0], o->inject_delay_ms);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += o->inject_delay_ms / 1000;
    until.tv_nsec += (long)(o->inject_delay_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    for (;;) {
        int live = 0;
        for (int i = 0; i < n; i++) live += !c->cancelled[i];
        if (s->quit || !live || pthread_cond_timedwait(&s->cv, &s->mu, &until) == ETIMEDOUT) break;
    }
}

#define ERROR_TEXT_MAX 1000
#define ERROR_FRAME_MAX (MOEX_PROTO_HEADER_BYTES + MOEX_PROTO_ERROR_FIXED_BYTES + ERROR_TEXT_MAX)

/* Room for dispatch b's answer: its RESULT, or an ERROR with its reason
 * (should encoding the RESULT fail). */
static size_t answer_room(const batch_item *b) {
    const size_t result = b->failed ? 0 : moex_worker_result_bytes(&b->it.msg);
    return result > ERROR_FRAME_MAX ? result : ERROR_FRAME_MAX;
}

/* Writes dispatch b's answer at dst (answer_room bytes) and its length in b->len. */
static void encode_answer(batch_item *b, uint8_t *dst) {
    const size_t cap = answer_room(b);
    if (!b->failed && moex_worker_encode_result(&b->it.msg, b->values, dst, cap, &b->len, &b->err) == 0) return;
    b->failed = true;
    moex_log(MOEX_LOG_WARN, "worker: dispatch %u failed: %s", b->it.msg.h.seq, b->err.msg);
    const size_t n = strlen(b->err.msg) > ERROR_TEXT_MAX ? ERROR_TEXT_MAX : strlen(b->err.msg);
    if (moex_proto_encode_error(b->it.msg.h.seq, MOEX_ERR_COMPUTE, b->err.msg, (uint16_t)n, dst, cap, &b->len, NULL))
        b->len = 0;
}

/* Encodes the answers of items [i0, i1) (one received message), leaving out
 * those cancelled, back to back into out. */
static void encode_message(compute *c, int i0, int i1, moex_worker_buf *out) {
    const size_t head = moex_worker_outbox_headroom(c->s->outbox);
    size_t total = 0;
    for (int i = i0; i < i1; i++)
        if (!c->items[i].cancelled) total += answer_room(&c->items[i]);
    out->len = 0;
    if (!total) return;
    if (moex_worker_buf_reserve(out, head, total)) {
        moex_log(MOEX_LOG_ERROR, "worker: out of memory for a %zu-byte message of results", total);
        return;
    }
    for (int i = i0; i < i1; i++) {
        batch_item *b = &c->items[i];
        b->len = 0;
        if (b->cancelled) continue;
        b->off = out->len;
        encode_answer(b, out->buf + head + out->len);
        out->len += b->len;
    }
}

/* Called with mu held: takes out of message [i0, i1)'s buffer the answers
 * cancelled while it was encoded (rare: a CANCEL in that short window). */
static void drop_late_cancels(compute *c, int i0, int i1, moex_worker_buf *out) {
    size_t w = 0;
    for (int i = i0; i < i1; i++) {
        batch_item *b = &c->items[i];
        if (c->cancelled[i]) b->cancelled = true;
        if (b->cancelled || !b->len) continue;
        uint8_t *base = out->buf + moex_worker_outbox_headroom(c->s->outbox);
        if (w != b->off) memmove(base + w, base + b->off, b->len);
        b->off = w;
        w += b->len;
    }
    out->len = w;
}

/* The end of the received message that item i0 starts. */
static int message_end(const compute *c, int i0, int n) {
    int i1 = i0 + 1;
    while (i1 < n && c->items[i1].it.group == c->items[i0].it.group) i1++;
    return i1;
}

/* Called with mu held: queues message [i0, i1)'s answers for the connection
 * they were computed for (dropped if it is gone) and counts them. */
static void queue_message(compute *c, int i0, int i1, moex_worker_buf *out, uint32_t conn, double ready_s,
                          bool large) {
    session *s = c->s;
    drop_late_cancels(c, i0, i1, out);
    const bool live = conn == s->conn && out->len;
    for (int i = i0; i < i1; i++) {
        const batch_item *b = &c->items[i];
        if (b->cancelled) s->stats.cancelled++;
        else if (live && b->len && b->failed) s->stats.errors++;
        else if (live && b->len) s->stats.results++;
    }
    if (live) {
        out->conn = conn;
        out->ready_s = ready_s;
        out->large = large;
        if (moex_worker_outbox_push_swap(s->outbox, out))
            moex_log(MOEX_LOG_ERROR, "worker: out of memory queueing %d results", i1 - i0);
    }
    out->len = 0;
}

/* Called with mu held; returns with it held. Computes a batch and queues
 * one message per received message. */
static void run_batch(compute *c) {
    session *s = c->s;
    const uint32_t conn = s->conn;
    const int n = take_batch(c);
    if (n == 0) return;
    pthread_mutex_unlock(&s->mu);
    batch_times bt = {0};
    compute_batch(c, n, &bt);
    pthread_mutex_lock(&s->mu);
    inject_delay(c, n);
    for (int i = 0; i < n; i++) c->items[i].cancelled = c->cancelled[i];
    pthread_mutex_unlock(&s->mu);

    const double t0 = moex_time_s();
    for (int i0 = 0, m = 0; i0 < n; i0 = message_end(c, i0, n), m++)
        encode_message(c, i0, message_end(c, i0, n), &c->out[m]);
    const double ready = moex_time_s();
    bt.encode = ready - t0;

    pthread_mutex_lock(&s->mu);
    record_times(s, &bt);
    s->stats.computed += (uint64_t)n;
    s->stats.batches++;
    for (int i0 = 0, m = 0; i0 < n; i0 = message_end(c, i0, n), m++)
        queue_message(c, i0, message_end(c, i0, n), &c->out[m], conn, ready, bt.large);
    for (int i = 0; i < n; i++) worker_rx_release(s, c->items[i].it.owner);
    s->running = false;
    s->batch_n = 0;
}

/* ---- small messages on the lws thread ---- */

/* A received message of at most MOEX_WORKER_SMALL_ROWS rows (tokens, summed
 * over its dispatches) is computed by the lws thread itself when the compute
 * thread is idle: a decode layer's message then costs no hand-off to the
 * compute thread and back (two thread wake-ups, most of a round trip on a loaded
 * machine). Larger ones go to the compute thread, so that the lws thread
 * stays free for CANCELs and heartbeats during long batches (docs/PERF.md
 * measured it against handing every message over). */
#define INLINE_ROWS MOEX_WORKER_SMALL_ROWS

/* Called with mu held: whether the queued work is whole messages of at most
 * s->inline_rows rows in all. */
static bool small_work(const session *s) {
    uint64_t rows = 0;
    const moex_worker_item *it;
    for (int i = 0; (it = moex_worker_backlog_at(s->backlog, i)); i++) {
        if (!((const rx_msg *)it->owner)->sealed) return false;
        rows += it->msg.h.n_tokens;
        if (rows > (uint64_t)s->inline_rows) return false;
    }
    return rows > 0;
}

bool worker_compute_inline(session *s) {
    compute *c = s->compute;
    if (!c || !s->compute_parked || s->quit || s->running || s->assign_pending || s->o->inject_delay_prob > 0 ||
        !small_work(s))
        return false;
    run_batch(c);
    s->stats.inline_batches++;
    if (s->assign_pending || work_ready(s)) pthread_cond_broadcast(&s->cv); /* the compute thread waited for it */
    return true;
}

static void *compute_main(void *arg) {
    compute *c = arg;
    session *s = c->s;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        /* running: the lws thread computes a small message (worker_compute_inline) */
        s->compute_parked = true;
        while (!s->quit && (s->running || (!s->assign_pending && !work_ready(s)))) pthread_cond_wait(&s->cv, &s->mu);
        s->compute_parked = false;
        if (s->quit) break;
        if (s->assign_pending) run_assignment(c);
        else run_batch(c);
        pthread_mutex_unlock(&s->mu);
        lws_cancel_service(s->ctx);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- lifetime ---- */

static void compute_free(compute *c) {
    if (!c) return;
    for (int i = 0; c->out && i < c->cap; i++) free(c->out[i].buf);
    free(c->out);
    free(c->items);
    free(c->seqs);
    free(c->cancelled);
    moex_worker_vk_free(c->gpu);
    moex_worker_core_free(c->core);
    moex_pool_destroy(c->pool);
    free(c->want);
    free(c->list);
    free(c);
}

/* --backend vulkan: the GPU core. */
static int create_gpu(compute *c, moex_error *err) {
    moex_error why;
    if (!(c->gpu = moex_worker_vk_create(c->s->m, &c->s->o->vk, MOEX_WORKER_VK_EACH_ALWAYS, &why))) return moex_fail(err, "--backend vulkan: %s", why.msg);
    return 0;
}

/* The batch arrays: a batch holds at most the backlog's capacity. */
static int create_batch(compute *c, moex_error *err) {
    const int n = c->cap = c->s->o->backlog > 0 ? c->s->o->backlog : 1;
    c->items = calloc((size_t)n, sizeof *c->items);
    c->seqs = calloc((size_t)n, sizeof *c->seqs);
    c->cancelled = calloc((size_t)n, sizeof *c->cancelled);
    c->out = calloc((size_t)n, sizeof *c->out);
    if (!c->items || !c->seqs || !c->cancelled || !c->out) return moex_fail(err, "out of memory");
    return 0;
}

static compute *compute_create(session *s, moex_error *err) {
    const moex_hparams *hp = &s->m->hp;
    compute *c = calloc(1, sizeof *c);
    if (!c) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    c->s = s;
    c->rng = s->o->seed;
    c->pool = moex_pool_create(s->o->threads);
    c->want = calloc((size_t)hp->n_layer * (size_t)hp->n_expert, sizeof *c->want);
    if (!c->pool || !c->want) {
        moex_fail(err, "cannot create the compute pool of %d threads", s->o->threads);
        compute_free(c);
        return NULL;
    }
    if (!(c->core = moex_worker_core_create(hp->n_layer, hp->n_expert, hp->n_embd, c->pool, err)) ||
        create_batch(c, err) || (s->o->backend == MOEX_BACKEND_VULKAN && create_gpu(c, err))) {
        compute_free(c);
        return NULL;
    }
    return c;
}

/* The thread frees its context when it ends. */
static void *compute_thread(void *arg) {
    compute_main(arg);
    compute_free(arg);
    return NULL;
}

int moex_worker_compute_start(session *s, pthread_t *th, moex_error *err) {
    compute *c = compute_create(s, err);
    if (!c) return -1;
    if (c->gpu)
        moex_log(MOEX_LOG_INFO, "worker: computing on %s (vulkan), expert slots of %.2f MiB; CPU fallback: %d threads",
                 moex_worker_vk_device_name(c->gpu), (double)moex_worker_vk_slot_bytes(c->gpu) / (1 << 20),
                 moex_pool_size(c->pool));
    else
        moex_log(MOEX_LOG_INFO, "worker: compute pool of %d threads (%s kernels)", moex_pool_size(c->pool),
                 moex_kernels_simd_name());
    s->inline_rows = INLINE_ROWS;
    pthread_mutex_lock(&s->mu);
    s->compute = c;
    pthread_mutex_unlock(&s->mu);
    if (pthread_create(th, NULL, compute_thread, c)) {
        pthread_mutex_lock(&s->mu);
        s->compute = NULL;
        pthread_mutex_unlock(&s->mu);
        compute_free(c);
        return moex_fail(err, "cannot start the compute thread");
    }
    return 0;
}

void moex_worker_compute_stop(session *s, pthread_t th) {
    pthread_mutex_lock(&s->mu);
    s->quit = true;
    s->compute = NULL;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(th, NULL);
}
