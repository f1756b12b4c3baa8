/* The compute thread: owns the core and the pool, applies assignments and
 * turns queued DISPATCH frames into RESULT (or ERROR) frames for the outbox.
 * It never touches the socket: finished frames are handed over under the
 * session mutex and the lws thread is woken with lws_cancel_service().
 *
 * --backend vulkan: assigned experts are also uploaded to the GPU core
 * (core_vk.c), and the thread takes every queued dispatch at once (the
 * backlog holds one layer's: a prefill batch) and runs them in one
 * submission. The CPU core still binds every assigned expert, as a fallback
 * for one the GPU could not take. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/session_internal.h"

typedef struct compute {
    session *s;
    moex_pool *pool;
    moex_worker_core *core;
    moex_worker_item item;       /* the dispatch being computed (buffer swapped with the backlog) */
    moex_worker_buf out;         /* the frame being built (buffer swapped with the outbox) */
    bool out_is_error;           /* out holds an ERROR, not a RESULT */
    uint8_t *scratch;
    size_t scratch_cap;
    bool *want;                  /* n_layers x n_experts: in the assignment being applied */
    moex_proto_expert *list;
    uint32_t list_cap;
    uint64_t rng;
    /* --backend vulkan (gpu NULL otherwise) */
    moex_worker_vk *gpu;
    int batch_cap;
    moex_worker_item *batch;     /* dispatches computed together (buffers swapped with the backlog) */
    moex_worker_buf *batch_out;  /* their RESULT or ERROR frames (buffers swapped with the outbox) */
    bool *batch_is_error, *batch_cancelled;
    uint32_t *batch_seq;
    int *batch_gpu;              /* index in the GPU batch, or -1 when computed another way */
    moex_proto_msg *batch_msg;   /* the decoded dispatches (only their headers stay valid: the
                                    GPU batch copied their rows, and decode reuses the scratch) */
} compute;

#define BATCH_MAX 64             /* dispatches per GPU submission */
#define BATCH_TOKENS 4096        /* tokens per GPU submission (one dispatch may exceed it alone) */

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
    }
}

/* ---- dispatches ---- */

static int build_error(compute *c, moex_worker_buf *out, uint32_t seq, int32_t code, const char *text) {
    const size_t n = strlen(text) > 1000 ? 1000 : strlen(text), need = MOEX_PROTO_HEADER_BYTES + MOEX_PROTO_ERROR_FIXED_BYTES + n;
    const size_t head = moex_worker_outbox_headroom(c->s->outbox);
    if (moex_worker_buf_reserve(out, head, need)) return -1;
    return moex_proto_encode_error(seq, code, text, (uint16_t)n, out->buf + head, need, &out->len, NULL) ? -1 : 0;
}

/* The fault injection's "large noise": each value moves by up to ten times
 * the row's RMS (plus one), far outside any numerical tolerance. */
static void corrupt(compute *c, float *v, int64_t n_tokens, int64_t hidden) {
    for (int64_t t = 0; t < n_tokens; t++) {
        float *row = v + t * hidden;
        double ss = 0;
        for (int64_t i = 0; i < hidden; i++) ss += (double)row[i] * row[i];
        const float amp = (float)(10.0 * sqrt(ss / (double)hidden) + 1.0);
        for (int64_t i = 0; i < hidden; i++) row[i] += amp * (float)(2.0 * moex_worker_rand01(&c->rng) - 1.0);
    }
}

static int decode_frame(compute *c, const moex_worker_item *item, moex_proto_msg *msg, moex_error *err) {
    moex_proto_header h;
    if (item->len < MOEX_PROTO_HEADER_BYTES) return moex_fail(err, "short frame");
    moex_proto_header_read(item->frame, &h);
    const size_t need = moex_proto_scratch_bytes(&h);
    if (need > c->scratch_cap) {
        uint8_t *p = realloc(c->scratch, need);
        if (!p) return moex_fail(err, "out of memory for %zu bytes of scratch", need);
        c->scratch = p;
        c->scratch_cap = need;
    }
    return moex_proto_decode(item->frame, item->len, &c->s->lim, c->scratch, c->scratch_cap, msg, err) ? -1 : 0;
}

static int decode_item(compute *c, moex_proto_msg *msg, moex_error *err) { return decode_frame(c, &c->item, msg, err); }

/* --inject-corrupt-prob: with that probability, noise on the values. */
static void maybe_corrupt(compute *c, uint32_t seq, float *values, const moex_proto_msg *msg) {
    const moex_worker_options *o = c->s->o;
    if (o->inject_corrupt_prob <= 0 || moex_worker_rand01(&c->rng) >= o->inject_corrupt_prob) return;
    moex_log(MOEX_LOG_DEBUG, "worker: inject: corrupting the result of dispatch %u", seq);
    corrupt(c, values, msg->h.n_tokens, msg->h.hidden);
}

/* Writes into out the RESULT of values (rc 0), or an ERROR with err's
 * reason; out->len stays 0 when neither fits in memory. Returns whether out
 * holds an ERROR. */
static bool finish_frame(compute *c, moex_worker_buf *out, uint32_t seq, const moex_proto_msg *msg,
                         const float *values, int rc, moex_error *err, double dt) {
    if (!rc) {
        const size_t head = moex_worker_outbox_headroom(c->s->outbox), need = moex_worker_result_bytes(msg);
        rc = moex_worker_buf_reserve(out, head, need) ? moex_fail(err, "out of memory for a %zu-byte result", need)
             : moex_worker_encode_result(msg, values, out->buf + head, need, &out->len, err);
    }
    if (rc) {
        moex_log(MOEX_LOG_WARN, "worker: dispatch %u failed: %s", seq, err->msg);
        if (build_error(c, out, seq, MOEX_WORKER_ERR_COMPUTE, err->msg)) out->len = 0;
    } else {
        moex_log(MOEX_LOG_DEBUG, "worker: dispatch %u: layer %u expert %u, %u tokens, %s: %.3f ms", seq, msg->h.layer,
                 msg->h.expert, msg->h.n_tokens, moex_proto_dtype_name(msg->h.dtype), dt * 1e3);
    }
    return rc != 0;
}

/* Computes the current item into c->out: a RESULT, or an ERROR saying why not.
 * Returns the compute time in seconds. */
static double process_item(compute *c) {
    moex_proto_msg msg;
    moex_error err = {{0}};
    float *values = NULL;
    const double t0 = moex_time_s();
    int rc = decode_item(c, &msg, &err);
    if (!rc) rc = moex_worker_core_run(c->core, &msg, &values, &err);
    const double dt = moex_time_s() - t0;
    if (!rc) maybe_corrupt(c, c->item.seq, values, &msg);
    c->out_is_error = finish_frame(c, &c->out, c->item.seq, &msg, values, rc, &err, dt);
    return dt;
}

/* --inject-delay-ms: waits on the condition variable so that quit interrupts it. Called with mu held. */
static void inject_delay(compute *c) {
    session *s = c->s;
    const moex_worker_options *o = s->o;
    if (o->inject_delay_prob <= 0 || moex_worker_rand01(&c->rng) >= o->inject_delay_prob) return;
    moex_log(MOEX_LOG_DEBUG, "worker: inject: delaying dispatch %u by %d ms", c->item.seq, o->inject_delay_ms);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += o->inject_delay_ms / 1000;
    until.tv_nsec += (long)(o->inject_delay_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    while (!s->quit && !s->running_cancelled)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &until) == ETIMEDOUT) break;
}

/* Called with mu held; returns with it held. */
static void run_dispatch(compute *c) {
    session *s = c->s;
    const uint32_t conn = s->conn;
    s->running = true;
    s->running_cancelled = false;
    s->running_seq = c->item.seq;
    pthread_mutex_unlock(&s->mu);
    const double dt = process_item(c);
    pthread_mutex_lock(&s->mu);
    s->busy_s += dt;
    s->stats.computed++;
    s->stats.compute_s += dt;
    inject_delay(c);
    if (s->running_cancelled) {
        s->stats.cancelled++;
    } else if (conn == s->conn && c->out.len) {
        c->out.conn = conn;
        if (moex_worker_outbox_push_swap(s->outbox, &c->out) == 0) {
            if (c->out_is_error) s->stats.errors++;
            else s->stats.results++;
        }
    }
    c->out.len = 0;
    s->running = false;
}

/* ---- dispatches on the GPU: every queued one in one submission ---- */

static uint32_t frame_tokens(const moex_worker_item *it) {
    moex_proto_header h;
    if (it->len < MOEX_PROTO_HEADER_BYTES) return 0;
    moex_proto_header_read(it->frame, &h);
    return h.n_tokens;
}

/* Called with mu held: pops the queued dispatches (up to BATCH_MAX of them
 * and about BATCH_TOKENS tokens). */
static int take_batch(compute *c) {
    int n = 0;
    uint64_t tokens = 0;
    while (n < c->batch_cap && tokens < BATCH_TOKENS && moex_worker_backlog_pop(c->s->backlog, &c->batch[n])) {
        tokens += frame_tokens(&c->batch[n]);
        c->batch_seq[n] = c->batch[n].seq;
        c->batch_cancelled[n] = false;
        n++;
    }
    return n;
}

/* Decodes dispatch i and queues it on the GPU; one the GPU does not hold is
 * computed on the CPU core right away (or answered with an ERROR). */
static void stage_dispatch(compute *c, int i) {
    moex_proto_msg *msg = &c->batch_msg[i];
    moex_error err = {{0}};
    float *values = NULL;
    c->batch_gpu[i] = -1;
    const double t0 = moex_time_s();
    int rc = decode_frame(c, &c->batch[i], msg, &err);
    if (!rc && msg->h.type == MOEX_MSG_DISPATCH && moex_worker_vk_holds(c->gpu, msg->h.layer, msg->h.expert)) {
        if (moex_worker_vk_batch_add(c->gpu, msg, &err) == 0) {
            c->batch_gpu[i] = moex_worker_vk_batch_count(c->gpu) - 1;
            return;
        }
        rc = -1;
    }
    if (!rc) rc = moex_worker_core_run(c->core, msg, &values, &err); /* the CPU fallback */
    if (!rc) maybe_corrupt(c, c->batch[i].seq, values, msg);
    c->batch_is_error[i] = finish_frame(c, &c->batch_out[i], c->batch[i].seq, msg, values, rc, &err,
                                        moex_time_s() - t0);
}

/* Computes the n taken dispatches into batch_out; returns the time taken. */
static double compute_batch(compute *c, int n) {
    const double t0 = moex_time_s();
    moex_worker_vk_batch_begin(c->gpu);
    for (int i = 0; i < n; i++) stage_dispatch(c, i);
    moex_error err = {{0}};
    const int rc = moex_worker_vk_batch_count(c->gpu) ? moex_worker_vk_batch_run(c->gpu, &err) : 0;
    const double dt = moex_time_s() - t0;
    for (int i = 0; i < n; i++) {
        if (c->batch_gpu[i] < 0) continue;
        float *values = rc ? NULL : moex_worker_vk_batch_values(c->gpu, c->batch_gpu[i]);
        if (values) maybe_corrupt(c, c->batch[i].seq, values, &c->batch_msg[i]);
        c->batch_is_error[i] = finish_frame(c, &c->batch_out[i], c->batch[i].seq, &c->batch_msg[i], values, rc, &err, dt);
    }
    if (n > 1)
        moex_log(MOEX_LOG_DEBUG, "worker: vulkan: %d dispatches in one submission: %.3f ms", n, dt * 1e3);
    return moex_time_s() - t0;
}

/* Called with mu held; returns with it held. */
static void run_batch(compute *c) {
    session *s = c->s;
    const uint32_t conn = s->conn;
    const int n = take_batch(c);
    if (n == 0) return;
    s->running = true;
    s->running_cancelled = false;
    s->running_seq = c->batch_seq[0];
    s->batch_seqs = c->batch_seq;
    s->batch_cancelled = c->batch_cancelled;
    s->batch_n = n;
    c->item.seq = c->batch_seq[0]; /* for inject_delay's message */
    pthread_mutex_unlock(&s->mu);
    const double dt = compute_batch(c, n);
    pthread_mutex_lock(&s->mu);
    s->busy_s += dt;
    s->stats.computed += (uint64_t)n;
    s->stats.compute_s += dt;
    inject_delay(c);
    for (int i = 0; i < n; i++) {
        moex_worker_buf *out = &c->batch_out[i];
        if (c->batch_cancelled[i] || (i == 0 && s->running_cancelled)) {
            s->stats.cancelled++;
        } else if (conn == s->conn && out->len) {
            out->conn = conn;
            if (moex_worker_outbox_push_swap(s->outbox, out) == 0) {
                if (c->batch_is_error[i]) s->stats.errors++;
                else s->stats.results++;
            }
        }
        out->len = 0;
    }
    s->running = false;
    s->batch_n = 0;
    s->batch_seqs = NULL;
    s->batch_cancelled = NULL;
}

static void *compute_main(void *arg) {
    compute *c = arg;
    session *s = c->s;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->quit && !s->assign_pending && moex_worker_backlog_depth(s->backlog) == 0)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->quit) break;
        if (s->assign_pending) run_assignment(c);
        else if (c->gpu) run_batch(c);
        else if (moex_worker_backlog_pop(s->backlog, &c->item)) run_dispatch(c);
        pthread_mutex_unlock(&s->mu);
        lws_cancel_service(s->ctx);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- lifetime ---- */

static void free_batch(compute *c) {
    for (int i = 0; c->batch && i < c->batch_cap; i++) free(c->batch[i].frame);
    for (int i = 0; c->batch_out && i < c->batch_cap; i++) free(c->batch_out[i].buf);
    free(c->batch);
    free(c->batch_out);
    free(c->batch_is_error);
    free(c->batch_cancelled);
    free(c->batch_seq);
    free(c->batch_gpu);
    free(c->batch_msg);
}

static void compute_free(compute *c) {
    if (!c) return;
    free_batch(c);
    moex_worker_vk_free(c->gpu);
    moex_worker_core_free(c->core);
    moex_pool_destroy(c->pool);
    free(c->item.frame);
    free(c->out.buf);
    free(c->scratch);
    free(c->want);
    free(c->list);
    free(c);
}

/* --backend vulkan: the GPU core and the batch arrays. */
static int create_gpu(compute *c, moex_error *err) {
    const moex_worker_options *o = c->s->o;
    const moex_vk_options vo = {.device = o->device};
    moex_error why;
    if (!(c->gpu = moex_worker_vk_create(c->s->m, &vo, &why))) return moex_fail(err, "--backend vulkan: %s", why.msg);
    const int n = c->batch_cap = o->backlog < BATCH_MAX ? (o->backlog > 0 ? o->backlog : 1) : BATCH_MAX;
    c->batch = calloc((size_t)n, sizeof *c->batch);
    c->batch_out = calloc((size_t)n, sizeof *c->batch_out);
    c->batch_is_error = calloc((size_t)n, sizeof *c->batch_is_error);
    c->batch_cancelled = calloc((size_t)n, sizeof *c->batch_cancelled);
    c->batch_seq = calloc((size_t)n, sizeof *c->batch_seq);
    c->batch_gpu = calloc((size_t)n, sizeof *c->batch_gpu);
    c->batch_msg = calloc((size_t)n, sizeof *c->batch_msg);
    if (!c->batch || !c->batch_out || !c->batch_is_error || !c->batch_cancelled || !c->batch_seq || !c->batch_gpu ||
        !c->batch_msg)
        return moex_fail(err, "out of memory");
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
        (s->o->backend == MOEX_BACKEND_VULKAN && create_gpu(c, err))) {
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
    if (pthread_create(th, NULL, compute_thread, c)) {
        compute_free(c);
        return moex_fail(err, "cannot start the compute thread");
    }
    return 0;
}

void moex_worker_compute_stop(session *s, pthread_t th) {
    pthread_mutex_lock(&s->mu);
    s->quit = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(th, NULL);
}
