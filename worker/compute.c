/* The compute thread: owns the core and the pool, applies assignments and
 * turns queued DISPATCH frames into RESULT (or ERROR) frames for the outbox.
 * It never touches the socket: finished frames are handed over under the
 * session mutex and the lws thread is woken with lws_cancel_service(). */
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
} compute;

/* ---- assignments ---- */

static const moex_expert_weights *model_expert(const moex_model *m, int layer, int expert) {
    return &m->layers[layer].experts[expert];
}

/* Holds exactly the experts in c->list: drops (and releases the pages of)
 * the others, binds and prefaults the new ones. */
static void apply_assignment(compute *c, uint32_t n, uint32_t g) {
    const moex_model *m = c->s->m;
    const int nl = m->hp.n_layer, ne = m->hp.n_expert;
    memset(c->want, 0, (size_t)nl * (size_t)ne * sizeof *c->want);
    for (uint32_t i = 0; i < n; i++) c->want[(size_t)c->list[i].layer * ne + c->list[i].expert] = true;
    int added = 0, dropped = 0;
    size_t bytes = 0;
    for (int l = 0; l < nl; l++) {
        for (int e = 0; e < ne; e++) {
            const moex_expert_weights *w = model_expert(m, l, e);
            const bool want = c->want[(size_t)l * ne + e], has = moex_worker_core_holds(c->core, l, e);
            if (has && !want) {
                moex_worker_core_drop(c->core, l, e);
                moex_worker_release(w);
                dropped++;
            } else if (want && !has) {
                moex_error err;
                if (moex_worker_core_hold(c->core, l, e, w, &err)) {
                    moex_log(MOEX_LOG_ERROR, "worker: cannot hold expert (%d, %d): %s", l, e, err.msg);
                    continue;
                }
                moex_worker_prefault(w);
                added++;
            }
            if (want) bytes += moex_worker_expert_bytes(w);
        }
    }
    moex_log(MOEX_LOG_INFO, "worker: assignment %u: holding %d experts (%.1f MiB), %d added, %d dropped", g,
             moex_worker_core_n_held(c->core), (double)bytes / (1 << 20), added, dropped);
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

static int build_error(compute *c, uint32_t seq, int32_t code, const char *text) {
    const size_t n = strlen(text) > 1000 ? 1000 : strlen(text), need = MOEX_PROTO_HEADER_BYTES + MOEX_PROTO_ERROR_FIXED_BYTES + n;
    const size_t head = moex_worker_outbox_headroom(c->s->outbox);
    if (moex_worker_buf_reserve(&c->out, head, need)) return -1;
    return moex_proto_encode_error(seq, code, text, (uint16_t)n, c->out.buf + head, need, &c->out.len, NULL) ? -1 : 0;
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

static int decode_item(compute *c, moex_proto_msg *msg, moex_error *err) {
    moex_proto_header h;
    if (c->item.len < MOEX_PROTO_HEADER_BYTES) return moex_fail(err, "short frame");
    moex_proto_header_read(c->item.frame, &h);
    const size_t need = moex_proto_scratch_bytes(&h);
    if (need > c->scratch_cap) {
        uint8_t *p = realloc(c->scratch, need);
        if (!p) return moex_fail(err, "out of memory for %zu bytes of scratch", need);
        c->scratch = p;
        c->scratch_cap = need;
    }
    return moex_proto_decode(c->item.frame, c->item.len, &c->s->lim, c->scratch, c->scratch_cap, msg, err) ? -1 : 0;
}

/* Computes the current item into c->out: a RESULT, or an ERROR saying why not.
 * Returns the compute time in seconds. */
static double process_item(compute *c) {
    const moex_worker_options *o = c->s->o;
    moex_proto_msg msg;
    moex_error err = {{0}};
    float *values = NULL;
    const double t0 = moex_time_s();
    int rc = decode_item(c, &msg, &err);
    if (!rc) rc = moex_worker_core_run(c->core, &msg, &values, &err);
    const double dt = moex_time_s() - t0;
    if (!rc && o->inject_corrupt_prob > 0 && moex_worker_rand01(&c->rng) < o->inject_corrupt_prob) {
        moex_log(MOEX_LOG_DEBUG, "worker: inject: corrupting the result of dispatch %u", c->item.seq);
        corrupt(c, values, msg.h.n_tokens, msg.h.hidden);
    }
    if (!rc) {
        const size_t head = moex_worker_outbox_headroom(c->s->outbox), need = moex_worker_result_bytes(&msg);
        rc = moex_worker_buf_reserve(&c->out, head, need) ? moex_fail(&err, "out of memory for a %zu-byte result", need)
             : moex_worker_encode_result(&msg, values, c->out.buf + head, need, &c->out.len, &err);
    }
    c->out_is_error = rc != 0;
    if (rc) {
        moex_log(MOEX_LOG_WARN, "worker: dispatch %u failed: %s", c->item.seq, err.msg);
        if (build_error(c, c->item.seq, MOEX_WORKER_ERR_COMPUTE, err.msg)) c->out.len = 0;
    } else {
        moex_log(MOEX_LOG_DEBUG, "worker: dispatch %u: layer %u expert %u, %u tokens, %s: %.3f ms", c->item.seq,
                 msg.h.layer, msg.h.expert, msg.h.n_tokens, moex_proto_dtype_name(msg.h.dtype), dt * 1e3);
    }
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

static void *compute_main(void *arg) {
    compute *c = arg;
    session *s = c->s;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->quit && !s->assign_pending && moex_worker_backlog_depth(s->backlog) == 0)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->quit) break;
        if (s->assign_pending) run_assignment(c);
        else if (moex_worker_backlog_pop(s->backlog, &c->item)) run_dispatch(c);
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
    moex_worker_core_free(c->core);
    moex_pool_destroy(c->pool);
    free(c->item.frame);
    free(c->out.buf);
    free(c->scratch);
    free(c->want);
    free(c->list);
    free(c);
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
    if (!(c->core = moex_worker_core_create(hp->n_layer, hp->n_expert, hp->n_embd, c->pool, err))) {
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
