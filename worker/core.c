/* The worker core: a table of held experts and DISPATCH -> RESULT.
 *
 * It computes exactly what the hub's local executor does for one expert:
 * one moex_experts_run job over all the dispatch's tokens (rows 0..n-1 of
 * the decoded x) with the f16 gates as f32, so on the same machine and with
 * f32 activations the result is bit-identical. A batch runs one job per
 * dispatch in one moex_experts_run over their rows stacked; the kernel
 * quantizes each row on its own, so a dispatch's values do not depend on
 * the others in its batch. No sockets, no threads of its own (the pool is
 * the caller's): this file also builds for WASM. */
#include <stdlib.h>
#include <string.h>

#include "worker/worker.h"

#define JOBS_PER_RUN 256   /* moex_experts_run's limit on jobs per call */

struct moex_worker_core {
    int n_layers, n_experts, hidden;
    moex_pool *pool;
    const moex_expert_weights **held;  /* n_layers x n_experts, NULL when not held */
    int n_held;
    /* The batch: its rows stacked in x (f32) and gates, one job each; buffers
     * grown to the largest batch seen. rows[t] = t, so a job's rows are rows + r0. */
    int64_t n_rows, cap_rows;
    float *x, *gates, *out;
    int32_t *rows;
    moex_expert_job *jobs;       /* rows, gates and out are bound by the run (the buffers may move before) */
    int64_t *job_row0;           /* each job's first row */
    int n_jobs, cap_jobs;
};

moex_worker_core *moex_worker_core_create(int n_layers, int n_experts, int hidden, moex_pool *pool,
                                          moex_error *err) {
    if (n_layers <= 0 || n_experts <= 0 || hidden <= 0 || hidden > 65535) {
        moex_fail(err, "worker core: bad model shape (%d layers x %d experts, hidden %d)", n_layers, n_experts, hidden);
        return NULL;
    }
    moex_worker_core *c = calloc(1, sizeof *c);
    if (c) c->held = calloc((size_t)n_layers * (size_t)n_experts, sizeof *c->held);
    if (!c || !c->held) {
        free(c);
        moex_fail(err, "worker core: out of memory");
        return NULL;
    }
    c->n_layers = n_layers;
    c->n_experts = n_experts;
    c->hidden = hidden;
    c->pool = pool;
    return c;
}

void moex_worker_core_free(moex_worker_core *c) {
    if (!c) return;
    free(c->held);
    free(c->x);
    free(c->gates);
    free(c->out);
    free(c->rows);
    free(c->jobs);
    free(c->job_row0);
    free(c);
}

static bool in_range(const moex_worker_core *c, int layer, int expert) {
    return layer >= 0 && layer < c->n_layers && expert >= 0 && expert < c->n_experts;
}

static const moex_expert_weights **slot(const moex_worker_core *c, int layer, int expert) {
    return &c->held[(size_t)layer * (size_t)c->n_experts + (size_t)expert];
}

/* The kernel needs gate/up: n_ff x hidden and down: hidden x n_ff. */
static int check_expert_shape(const moex_worker_core *c, const moex_expert_weights *w, moex_error *err) {
    const int64_t d = c->hidden, f = w->gate.rows;
    if (w->gate.cols != d || w->up.cols != d || w->up.rows != f || w->down.rows != d || w->down.cols != f || f <= 0 ||
        !w->gate.data || !w->up.data || !w->down.data)
        return moex_fail(err, "expert weights do not fit hidden %lld (gate %lldx%lld, up %lldx%lld, down %lldx%lld)",
                         (long long)d, (long long)w->gate.rows, (long long)w->gate.cols, (long long)w->up.rows,
                         (long long)w->up.cols, (long long)w->down.rows, (long long)w->down.cols);
    return 0;
}

int moex_worker_core_hold(moex_worker_core *c, int layer, int expert, const moex_expert_weights *w,
                          moex_error *err) {
    if (!in_range(c, layer, expert))
        return moex_fail(err, "expert (%d, %d) outside %d layers x %d experts", layer, expert, c->n_layers,
                         c->n_experts);
    if (!w) return moex_fail(err, "expert (%d, %d): no weights", layer, expert);
    if (check_expert_shape(c, w, err)) return -1;
    const moex_expert_weights **s = slot(c, layer, expert);
    if (!*s) c->n_held++;
    *s = w;
    return 0;
}

void moex_worker_core_drop(moex_worker_core *c, int layer, int expert) {
    if (!in_range(c, layer, expert)) return;
    const moex_expert_weights **s = slot(c, layer, expert);
    if (*s) c->n_held--;
    *s = NULL;
}

bool moex_worker_core_holds(const moex_worker_core *c, int layer, int expert) {
    return in_range(c, layer, expert) && *slot(c, layer, expert) != NULL;
}

int moex_worker_core_n_held(const moex_worker_core *c) { return c->n_held; }

static moex_proto_tensor_msg result_fields(const moex_proto_msg *d) {
    return (moex_proto_tensor_msg){.type = MOEX_MSG_RESULT, .seq = d->h.seq, .layer = d->h.layer,
                                   .expert = d->h.expert, .n_tokens = d->h.n_tokens, .hidden = d->h.hidden,
                                   .dtype = d->h.dtype};
}

size_t moex_worker_result_bytes(const moex_proto_msg *dispatch) {
    if (dispatch->h.type != MOEX_MSG_DISPATCH) return 0;
    moex_proto_tensor_msg m = result_fields(dispatch);
    return moex_proto_tensor_frame_bytes(&m);
}

/* Grows the batch's row buffers to hold n rows, keeping the rows added so
 * far; on failure the batch stays as it was. A no-op once they fit. */
static int reserve_rows(moex_worker_core *c, int64_t n) {
    if (n <= c->cap_rows) return 0;
    int64_t cap = c->cap_rows ? c->cap_rows : 16;
    while (cap < n) cap *= 2;
    const size_t rows = (size_t)cap, d = (size_t)c->hidden;
    float *x = realloc(c->x, rows * d * sizeof *x);
    if (x) c->x = x;
    float *gates = realloc(c->gates, rows * sizeof *gates);
    if (gates) c->gates = gates;
    int32_t *rs = realloc(c->rows, rows * sizeof *rs);
    if (rs) c->rows = rs;
    float *out = malloc(rows * d * sizeof *out); /* written by the run only: nothing to keep */
    if (!x || !gates || !rs || !out) {
        free(out);
        return -1;
    }
    free(c->out);
    c->out = out;
    for (int64_t t = c->cap_rows; t < cap; t++) c->rows[t] = (int32_t)t;
    c->cap_rows = cap;
    return 0;
}

static int check_dispatch(const moex_worker_core *c, const moex_proto_msg *d, moex_error *err) {
    if (d->h.type != MOEX_MSG_DISPATCH) return moex_fail(err, "message type %u is not a DISPATCH", d->h.type);
    if (d->h.hidden != c->hidden)
        return moex_fail(err, "dispatch %u: hidden %u, the model's is %d", d->h.seq, d->h.hidden, c->hidden);
    if (d->h.n_tokens == 0 || d->u.tensor.n_tokens != d->h.n_tokens || !d->u.tensor.values || !d->u.tensor.gates)
        return moex_fail(err, "dispatch %u: no tokens or no gates", d->h.seq);
    if (!moex_worker_core_holds(c, d->h.layer, d->h.expert))
        return moex_fail(err, "dispatch %u: expert (%u, %u) is not held by this worker", d->h.seq, d->h.layer,
                         d->h.expert);
    return 0;
}

void moex_worker_core_batch_begin(moex_worker_core *c) {
    c->n_rows = 0;
    c->n_jobs = 0;
}

int moex_worker_core_batch_add(moex_worker_core *c, const moex_proto_msg *dispatch, moex_error *err) {
    if (check_dispatch(c, dispatch, err)) return -1;
    const moex_proto_tensor_view *v = &dispatch->u.tensor;
    const int64_t n = v->n_tokens, d = c->hidden, r0 = c->n_rows;
    if (c->n_jobs == c->cap_jobs) {
        const int cap = c->cap_jobs ? 2 * c->cap_jobs : 16;
        moex_expert_job *p = realloc(c->jobs, (size_t)cap * sizeof *p);
        if (p) c->jobs = p;
        int64_t *q = realloc(c->job_row0, (size_t)cap * sizeof *q);
        if (q) c->job_row0 = q;
        if (!p || !q) return moex_fail(err, "dispatch %u: out of memory", dispatch->h.seq);
        c->cap_jobs = cap;
    }
    if (reserve_rows(c, r0 + n))
        return moex_fail(err, "dispatch %u: out of memory for %lld tokens", dispatch->h.seq, (long long)(r0 + n));
    for (int64_t t = 0; t < n; t++) {
        moex_proto_tensor_row_f32(v, (uint32_t)t, c->x + (r0 + t) * d);
        c->gates[r0 + t] = moex_proto_tensor_gate(v, (uint32_t)t);
    }
    c->jobs[c->n_jobs] = (moex_expert_job){.w = *slot(c, dispatch->h.layer, dispatch->h.expert), .n_tokens = n};
    c->job_row0[c->n_jobs++] = r0;
    c->n_rows = r0 + n;
    return 0;
}

int moex_worker_core_batch_run(moex_worker_core *c, moex_error *err) {
    const int64_t d = c->hidden;
    for (int j = 0; j < c->n_jobs; j++) {
        moex_expert_job *job = &c->jobs[j];
        const int64_t r0 = c->job_row0[j];
        job->rows = c->rows + r0;
        job->gates = c->gates + r0;
        job->out = c->out + r0 * d;
    }
    for (int j = 0; j < c->n_jobs; j += JOBS_PER_RUN) {
        const int n = c->n_jobs - j < JOBS_PER_RUN ? c->n_jobs - j : JOBS_PER_RUN;
        if (moex_experts_run(c->pool, c->jobs + j, n, c->x, d, err))
            return moex_error_prefix(err, "a batch of %d dispatches (%lld tokens)", c->n_jobs, (long long)c->n_rows);
    }
    return 0;
}

int moex_worker_core_batch_count(const moex_worker_core *c) { return c->n_jobs; }

float *moex_worker_core_batch_values(const moex_worker_core *c, int i) {
    if (i < 0 || i >= c->n_jobs) return NULL;
    return c->out + c->job_row0[i] * c->hidden;
}

int moex_worker_core_run(moex_worker_core *c, const moex_proto_msg *dispatch, float **values, moex_error *err) {
    moex_worker_core_batch_begin(c);
    if (moex_worker_core_batch_add(c, dispatch, err)) return -1;
    if (moex_worker_core_batch_run(c, err))
        return moex_fail(err, "dispatch %u: expert (%u, %u) computation failed", dispatch->h.seq, dispatch->h.layer,
                         dispatch->h.expert);
    *values = moex_worker_core_batch_values(c, 0);
    return 0;
}

int moex_worker_encode_result(const moex_proto_msg *dispatch, const float *values, uint8_t *out, size_t cap,
                              size_t *out_len, moex_error *err) {
    moex_proto_tensor_msg m = result_fields(dispatch);
    if (moex_proto_encode_tensor_f32(&m, values, NULL, out, cap, out_len, err))
        return -1;
    return 0;
}

int moex_worker_core_compute(moex_worker_core *c, const moex_proto_msg *dispatch, uint8_t *out, size_t cap,
                             size_t *out_len, moex_error *err) {
    float *values;
    if (moex_worker_core_run(c, dispatch, &values, err)) return -1;
    return moex_worker_encode_result(dispatch, values, out, cap, out_len, err);
}
