/* Matrix products and the expert FFN on the CPU.
 *
 * Every product follows the same plan: quantize the activation rows once to
 * the weight type's partner type (into pool scratch), then split the output
 * rows into chunks that threads take from a shared counter. A chunk is
 * processed in row blocks small enough to stay in L1 while every token's
 * activation row passes over them, so prefill reuses each weight row n times
 * from cache; decode (n = 1) streams the weights once.
 *
 * Each output element is one call of the type's vec_dot (or of its
 * multi-token kernel, which is bit-identical per token) with a fixed
 * summation order, whichever thread computes it, so results do not depend on
 * the number of threads or on scheduling.
 *
 * The pool's scratch buffer holds the quantized activations (and the expert
 * intermediates) during a call: callers must not keep data in it across
 * moex_matmul / moex_experts_run. Without a pool (NULL) everything runs on
 * the calling thread with a temporary allocation. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_internal.h"

#define L1_TILE_BYTES (16 * 1024)    /* weight bytes per row block (half of L1d) */
#define CHUNK_BYTES (64 * 1024)      /* weight bytes per work item */
#define CHUNKS_PER_THREAD 4          /* minimum, for load balance */
#define PARALLEL_QUANT_ELEMS (16 * 1024)
#define MAX_MULTI 16
#define MAX_JOBS 256
#define PREFETCH_BYTES 4096          /* decode: software prefetch distance (anything from 2 to 16 KB does as well) */

/* ------------------------------------------------------------------ */
/* validation and scratch                                              */
/* ------------------------------------------------------------------ */

/* A matrix the products can read, else an error naming it (`what`) and the cause. */
static int check_matrix(const moex_matrix *w, const char *what, moex_error *err) {
    if (!w) return moex_fail(err, "%s is missing", what);
    const moex_type_traits *tt = moex_type_get(w->type);
    if (!tt) return moex_fail(err, "%s has the unknown type %d", what, (int)w->type);
    if (!tt->is_weight_type || moex_vec_dot_type(w->type) < 0)
        return moex_fail(err, "%s has type %s, which the CPU kernels do not multiply", what, tt->name);
    /* a type only some SIMD tables have (MXFP4 on the WASM one, so far) */
    if (!moex_simd_active()->vec_dot[w->type])
        return moex_fail(err, "%s has type %s, which the %s kernels do not multiply yet", what, tt->name,
                         moex_simd_active()->name);
    if (!w->data) return moex_fail(err, "%s has no data", what);
    if (w->rows < 0 || w->cols <= 0)
        return moex_fail(err, "%s has the shape %lld x %lld", what, (long long)w->rows, (long long)w->cols);
    if (w->row_bytes == 0 || w->row_bytes != moex_row_bytes(w->type, w->cols))
        return moex_fail(err, "%s has rows of %zu bytes where %lld %s columns take %zu (whole blocks of %d)", what,
                         w->row_bytes, (long long)w->cols, tt->name, moex_row_bytes(w->type, w->cols),
                         tt->block_elems);
    const int at = moex_vec_dot_type(w->type);
    if (moex_row_bytes(at, w->cols) == 0)
        return moex_fail(err, "%s has %lld columns, not whole blocks of %d of its %s activations", what,
                         (long long)w->cols, moex_type_get(at)->block_elems, moex_type_get(at)->name);
    return 0;
}

/* Pool scratch, or a private allocation (freed by the caller) without a pool. */
static void *scratch_get(moex_pool *pool, size_t bytes, void **owned) {
    *owned = NULL;
    if (pool) return moex_pool_scratch(pool, bytes);
    *owned = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    return *owned;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* ------------------------------------------------------------------ */
/* activation quantization                                             */
/* ------------------------------------------------------------------ */

typedef struct quant_task {
    moex_quantize_act_fn quantize;
    const float *x;
    int64_t n_rows, cols;
    uint8_t *dst;
    size_t dst_row_bytes;
} quant_task;

static void quant_rows(const quant_task *q, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) q->quantize(q->x + r * q->cols, q->dst + r * q->dst_row_bytes, q->cols);
}

static void quant_worker(void *ctx, int ith, int nth) {
    const quant_task *q = ctx;
    quant_rows(q, q->n_rows * ith / nth, q->n_rows * (ith + 1) / nth);
}

/* Quantizes n_rows of x (cols each) to act_type; in parallel when large. */
static void quantize_activations(moex_pool *pool, const moex_simd_table *simd, int act_type, const float *x,
                                 int64_t n_rows, int64_t cols, uint8_t *dst) {
    quant_task q = {simd->quantize_act[act_type], x, n_rows, cols, dst, moex_row_bytes(act_type, cols)};
    if (n_rows > 1 && n_rows * cols >= PARALLEL_QUANT_ELEMS && moex_pool_size(pool) > 1)
        moex_pool_run(pool, quant_worker, &q);
    else
        quant_rows(&q, 0, n_rows);
}

/* ------------------------------------------------------------------ */
/* the tile: weight rows [r0, r1) x tokens                             */
/* ------------------------------------------------------------------ */

typedef struct act_rows {
    const uint8_t *data;   /* row t at data + t * row_bytes */
    size_t row_bytes;
    const int32_t *index;  /* token t uses activation row index[t]; NULL = t */
    int64_t n;
} act_rows;

static const uint8_t *act_row(const act_rows *act, int64_t t) {
    return act->data + (act->index ? act->index[t] : t) * act->row_bytes;
}

/* y[t * ldy + r] = dot(W[r], act[t]) for r in [r0, r1), t < act->n: row
 * blocks that fit in L1, each passed over every token; groups of up to
 * MOEX_DOT_MAX_TOKENS tokens share one read of the weight row when the type
 * has a multi-token kernel. */
static void dot_tile(const moex_simd_table *simd, const moex_matrix *w, int64_t r0, int64_t r1, const act_rows *act,
                     float *y, int64_t ldy) {
    const moex_vec_dot_fn dot = simd->vec_dot[w->type];
    const moex_vec_dot_multi_fn dot_multi = simd->vec_dot_multi[w->type];
    const uint8_t *wd = w->data;
    if (act->n == 1) {
        /* Decode streams the weights once: prefetch PREFETCH_BYTES ahead so
         * more cache misses are in flight than the hardware prefetcher alone
         * keeps (measurably closer to DRAM bandwidth per core). */
        const uint8_t *a = act_row(act, 0);
        const uint8_t *end = wd + (size_t)w->rows * w->row_bytes;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *row = wd + r * w->row_bytes;
            if ((size_t)(end - row) > PREFETCH_BYTES + w->row_bytes)
                for (size_t off = 0; off < w->row_bytes; off += 64) __builtin_prefetch(row + PREFETCH_BYTES + off, 0, 3);
            dot(w->cols, row, a, &y[r]);
        }
        return;
    }
    int64_t block = (int64_t)(L1_TILE_BYTES / w->row_bytes);
    if (block < 1) block = 1;
    for (int64_t rb = r0; rb < r1; rb += block) {
        const int64_t re = rb + block < r1 ? rb + block : r1;
        if (!dot_multi) {
            for (int64_t t = 0; t < act->n; t++) {
                const uint8_t *a = act_row(act, t);
                for (int64_t r = rb; r < re; r++) dot(w->cols, wd + r * w->row_bytes, a, &y[t * ldy + r]);
            }
            continue;
        }
        for (int64_t t0 = 0; t0 < act->n; t0 += MOEX_DOT_MAX_TOKENS) {
            const int nt = act->n - t0 < MOEX_DOT_MAX_TOKENS ? (int)(act->n - t0) : MOEX_DOT_MAX_TOKENS;
            const void *a[MOEX_DOT_MAX_TOKENS];
            float *out[MOEX_DOT_MAX_TOKENS];
            for (int k = 0; k < nt; k++) a[k] = act_row(act, t0 + k);
            for (int64_t r = rb; r < re; r++) {
                for (int k = 0; k < nt; k++) out[k] = &y[(t0 + k) * ldy + r];
                dot_multi(w->cols, wd + r * w->row_bytes, a, nt, out);
            }
        }
    }
}

/* Rows per work item: about CHUNK_BYTES of weights, a multiple of `align`,
 * and small enough that every thread gets several items. */
static int64_t chunk_rows(int64_t rows, size_t row_bytes, int nth, int64_t align) {
    int64_t c = (int64_t)(CHUNK_BYTES / row_bytes);
    const int64_t balanced = rows / ((int64_t)nth * CHUNKS_PER_THREAD);
    if (c > balanced) c = balanced;
    c = c / align * align;
    return c < align ? align : c;
}

/* Rows per item of one of several matrices worked on together (all_rows
 * over all of them): at most CHUNK_BYTES of weights (row_bytes per row),
 * and enough items over all of them for CHUNKS_PER_THREAD per thread. */
static int64_t chunk_rows_of(int64_t rows, int64_t all_rows, size_t row_bytes, int nth) {
    int64_t c = (int64_t)(CHUNK_BYTES / row_bytes);
    const int64_t balanced = all_rows / ((int64_t)nth * CHUNKS_PER_THREAD);
    if (c > balanced) c = balanced;
    if (c > rows) c = rows;
    return c < 1 ? 1 : c;
}

/* ------------------------------------------------------------------ */
/* matmul / matmul_multi                                               */
/* ------------------------------------------------------------------ */

typedef struct matmul_task {
    const moex_simd_table *simd;
    const moex_matrix *ws;
    int n_w;
    float **ys;
    act_rows act[MAX_MULTI];       /* per matrix (matrices may need different types) */
    int64_t chunk[MAX_MULTI];      /* rows per item, per matrix */
    int64_t first_item[MAX_MULTI + 1];
    atomic_int_fast64_t next_item;
} matmul_task;

static void matmul_worker(void *ctx, int ith, int nth) {
    matmul_task *m = ctx;
    const int64_t n_items = m->first_item[m->n_w];
    for (;;) {
        const int64_t item = atomic_fetch_add_explicit(&m->next_item, 1, memory_order_relaxed);
        if (item >= n_items) break;
        int i = 0;
        while (item >= m->first_item[i + 1]) i++;
        const moex_matrix *w = &m->ws[i];
        const int64_t r0 = (item - m->first_item[i]) * m->chunk[i];
        const int64_t r1 = r0 + m->chunk[i] < w->rows ? r0 + m->chunk[i] : w->rows;
        dot_tile(m->simd, w, r0, r1, &m->act[i], m->ys[i], w->rows);
    }
}

int moex_matmul_multi(moex_pool *pool, const moex_matrix *ws, int n_w, const float *x, int64_t n, float **ys,
                      moex_error *err) {
    if (!ws || n_w <= 0 || n_w > MAX_MULTI || !x || !ys || n < 0)
        return moex_fail(err, "bad arguments to a product (%d matrices, 1 to %d; %lld tokens; x %s, ys %s)", n_w,
                         MAX_MULTI, (long long)n, x ? "set" : "NULL", ys ? "set" : "NULL");
    for (int i = 0; i < n_w; i++) {
        char what[32];
        snprintf(what, sizeof what, n_w > 1 ? "matrix %d" : "the matrix", i);
        if (check_matrix(&ws[i], what, err)) return -1;
        if (!ys[i]) return moex_fail(err, "%s has no output", what);
        if (ws[i].cols != ws[0].cols)
            return moex_fail(err, "%s has %lld columns and matrix 0 %lld: the matrices of one pass share their input",
                             what, (long long)ws[i].cols, (long long)ws[0].cols);
    }
    if (n == 0) return 0;
    const moex_simd_table *simd = moex_simd_active();
    const int64_t cols = ws[0].cols;
    const int nth = moex_pool_size(pool);

    /* One quantized copy of x per distinct activation type. */
    int types[4], n_types = 0;
    size_t offsets[4], total = 0;
    for (int i = 0; i < n_w; i++) {
        const int at = moex_vec_dot_type(ws[i].type);
        int k = 0;
        while (k < n_types && types[k] != at) k++;
        if (k == n_types && at != MOEX_TYPE_F32) {
            types[n_types] = at;
            offsets[n_types++] = total;
            total += align64((size_t)n * moex_row_bytes(at, cols));
        }
    }
    void *owned = NULL;
    uint8_t *buf = NULL;
    if (total) {
        buf = scratch_get(pool, total, &owned);
        if (!buf)
            return moex_fail(err, "out of memory for %zu bytes of quantized activations (%lld tokens)", total,
                             (long long)n);
        for (int k = 0; k < n_types; k++) quantize_activations(pool, simd, types[k], x, n, cols, buf + offsets[k]);
    }

    matmul_task m = {.simd = simd, .ws = ws, .n_w = n_w, .ys = ys};
    atomic_init(&m.next_item, 0);
    m.first_item[0] = 0;
    for (int i = 0; i < n_w; i++) {
        const int at = moex_vec_dot_type(ws[i].type);
        m.act[i] = (act_rows){.data = (const uint8_t *)x, .row_bytes = (size_t)cols * sizeof(float), .n = n};
        for (int k = 0; k < n_types; k++)
            if (types[k] == at) m.act[i] = (act_rows){buf + offsets[k], moex_row_bytes(at, cols), NULL, n};
        m.chunk[i] = chunk_rows(ws[i].rows, ws[i].row_bytes, nth, ws[i].rows >= 4 ? 4 : 1);
        m.first_item[i + 1] = m.first_item[i] + (ws[i].rows + m.chunk[i] - 1) / m.chunk[i];
    }
    moex_pool_run(pool, matmul_worker, &m);
    free(owned);
    return 0;
}

int moex_matmul(moex_pool *pool, const moex_matrix *w, const float *x, int64_t n, float *y, moex_error *err) {
    return moex_matmul_multi(pool, w, 1, x, n, &y, err);
}

/* ------------------------------------------------------------------ */
/* experts                                                             */
/* ------------------------------------------------------------------ */

/* Per-job state in scratch. */
typedef struct job_state {
    act_rows x_gate, x_up;  /* the job's token rows of x, as gate / up need them */
    float *g, *u;           /* n_tokens x n_ff; g becomes silu(g) * u */
    uint8_t *hq;            /* n_tokens rows of g quantized for down (== g when down takes f32) */
    size_t hq_row_bytes;
    int64_t ff_chunk, hid_chunk;
    int64_t items_up, items_down;
} job_state;

typedef struct experts_task {
    const moex_simd_table *simd;
    const moex_expert_job *jobs;
    job_state *st;
    int n_jobs;
    int64_t hidden;
    int64_t first_item[2][1 + MAX_JOBS]; /* per pass: prefix sums of each job's work items */
    int64_t first_row[1 + MAX_JOBS];     /* prefix sums of each job's tokens: the rows of h to quantize */
    atomic_int_fast64_t next_item[2];
} experts_task;

/* Job and item-within-job of a flat item index. */
static int find_job(const int64_t *first, int n_jobs, int64_t item) {
    int lo = 0, hi = n_jobs; /* first[lo] <= item < first[hi] */
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (first[mid] <= item) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* gate and up rows [r0, r1) for every token of the job, then silu(g) * u.
 * Items need not cover whole activation blocks of down's type: h is
 * quantized for down after the pass (quantize_hidden), so that a decode
 * layer's few experts still split into enough items for every thread. */
static void expert_gate_up(const experts_task *e, int j, int64_t r0, int64_t r1) {
    const moex_expert_weights *w = e->jobs[j].w;
    const job_state *s = &e->st[j];
    const int64_t n_ff = w->gate.rows, n_tok = e->jobs[j].n_tokens;
    dot_tile(e->simd, &w->gate, r0, r1, &s->x_gate, s->g, n_ff);
    dot_tile(e->simd, &w->up, r0, r1, &s->x_up, s->u, n_ff);
    for (int64_t t = 0; t < n_tok; t++) {
        float *gt = s->g + t * n_ff + r0;
        moex_swiglu(gt, gt, s->u + t * n_ff + r0, r1 - r0);
    }
}

/* Rows [r0, r1) of every job's h (one row per token, jobs in order) quantized
 * for down; nothing to do for a down that takes f32 (hq is g). */
static void quantize_hidden_rows(const experts_task *e, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        const int j = find_job(e->first_row, e->n_jobs, r);
        const moex_expert_weights *w = e->jobs[j].w;
        const int at = moex_vec_dot_type(w->down.type);
        if (at == MOEX_TYPE_F32) continue;
        const job_state *s = &e->st[j];
        const int64_t t = r - e->first_row[j], n_ff = w->gate.rows;
        e->simd->quantize_act[at](s->g + t * n_ff, s->hq + t * s->hq_row_bytes, n_ff);
    }
}

static void quantize_hidden_worker(void *ctx, int ith, int nth) {
    const experts_task *e = ctx;
    const int64_t n = e->first_row[e->n_jobs];
    quantize_hidden_rows(e, n * ith / nth, n * (ith + 1) / nth);
}

/* Between the passes: on the calling thread when small (a decode layer's
 * few rows), else over the pool. */
static void quantize_hidden(moex_pool *pool, experts_task *e) {
    const int64_t n = e->first_row[e->n_jobs];
    int64_t elems = 0;
    for (int j = 0; j < e->n_jobs; j++) elems += e->jobs[j].n_tokens * e->jobs[j].w->gate.rows;
    if (elems >= PARALLEL_QUANT_ELEMS && moex_pool_size(pool) > 1) moex_pool_run(pool, quantize_hidden_worker, e);
    else quantize_hidden_rows(e, 0, n);
}

static void expert_down(const experts_task *e, int j, int64_t r0, int64_t r1) {
    const moex_expert_job *job = &e->jobs[j];
    const job_state *s = &e->st[j];
    const act_rows h = {s->hq, s->hq_row_bytes, NULL, job->n_tokens};
    dot_tile(e->simd, &job->w->down, r0, r1, &h, job->out, e->hidden);
    for (int64_t t = 0; t < job->n_tokens; t++) {
        float *o = job->out + t * e->hidden;
        for (int64_t r = r0; r < r1; r++) o[r] *= job->gates[t];
    }
}

static void experts_worker(experts_task *e, int pass) {
    const int64_t *first = e->first_item[pass];
    for (;;) {
        const int64_t item = atomic_fetch_add_explicit(&e->next_item[pass], 1, memory_order_relaxed);
        if (item >= first[e->n_jobs]) break;
        const int j = find_job(first, e->n_jobs, item);
        const job_state *s = &e->st[j];
        const int64_t k = item - first[j];
        if (pass == 0) {
            const int64_t n_ff = e->jobs[j].w->gate.rows, r0 = k * s->ff_chunk;
            expert_gate_up(e, j, r0, r0 + s->ff_chunk < n_ff ? r0 + s->ff_chunk : n_ff);
        } else {
            const int64_t r0 = k * s->hid_chunk;
            expert_down(e, j, r0, r0 + s->hid_chunk < e->hidden ? r0 + s->hid_chunk : e->hidden);
        }
    }
}

static void experts_pass0(void *ctx, int ith, int nth) { experts_worker(ctx, 0); }
static void experts_pass1(void *ctx, int ith, int nth) { experts_worker(ctx, 1); }

static int check_job(const moex_expert_job *job, int j, int64_t hidden, moex_error *err) {
    if (!job->w || job->n_tokens < 0 || (job->n_tokens > 0 && (!job->rows || !job->gates || !job->out)))
        return moex_fail(err, "expert job %d lacks weights, token rows, gates or output (%lld tokens)", j,
                         (long long)job->n_tokens);
    const moex_expert_weights *w = job->w;
    char what[3][40];
    static const char *const names[3] = {"gate", "up", "down"};
    for (int k = 0; k < 3; k++) snprintf(what[k], sizeof what[k], "expert job %d's %s", j, names[k]);
    if (check_matrix(&w->gate, what[0], err) || check_matrix(&w->up, what[1], err) ||
        check_matrix(&w->down, what[2], err))
        return -1;
    if (w->gate.cols != hidden || w->up.cols != hidden || w->down.rows != hidden || w->up.rows != w->gate.rows ||
        w->down.cols != w->gate.rows)
        return moex_fail(err, "expert job %d: shapes disagree (hidden %lld; gate %lld x %lld, up %lld x %lld, down "
                              "%lld x %lld; rows x columns)", j, (long long)hidden, (long long)w->gate.rows,
                         (long long)w->gate.cols, (long long)w->up.rows, (long long)w->up.cols,
                         (long long)w->down.rows, (long long)w->down.cols);
    for (int64_t t = 0; t < job->n_tokens; t++)
        if (job->rows[t] < 0)
            return moex_fail(err, "expert job %d: token %lld has the negative input row %d", j, (long long)t,
                             job->rows[t]);
    return 0;
}


int moex_experts_run(moex_pool *pool, const moex_expert_job *jobs, int n_jobs, const float *x, int64_t hidden,
                     moex_error *err) {
    if (n_jobs < 0 || n_jobs > MAX_JOBS || (n_jobs > 0 && (!jobs || !x)) || hidden <= 0)
        return moex_fail(err, "bad arguments to the experts (%d jobs, 0 to %d; hidden %lld; jobs %s, x %s)", n_jobs,
                         MAX_JOBS, (long long)hidden, jobs ? "set" : "NULL", x ? "set" : "NULL");
    int64_t n_x = 0; /* rows of x in use */
    for (int j = 0; j < n_jobs; j++) {
        if (check_job(&jobs[j], j, hidden, err)) return -1;
        for (int64_t t = 0; t < jobs[j].n_tokens; t++)
            if (jobs[j].rows[t] + 1 > n_x) n_x = jobs[j].rows[t] + 1;
    }
    if (n_x == 0) return 0;
    const moex_simd_table *simd = moex_simd_active();
    const int nth = moex_pool_size(pool);

    /* Scratch: job states, x quantized per distinct gate/up type, then per
     * job g, u and hq. Sized first, then carved. */
    int types[4], n_types = 0;
    size_t x_off[4], total = align64((size_t)n_jobs * sizeof(job_state));
    for (int j = 0; j < n_jobs; j++) {
        const int ats[2] = {moex_vec_dot_type(jobs[j].w->gate.type), moex_vec_dot_type(jobs[j].w->up.type)};
        for (int a = 0; a < 2; a++) {
            int k = 0;
            while (k < n_types && types[k] != ats[a]) k++;
            if (k == n_types && ats[a] != MOEX_TYPE_F32) {
                types[n_types] = ats[a];
                x_off[n_types++] = total;
                total += align64((size_t)n_x * moex_row_bytes(ats[a], hidden));
            }
        }
    }
    size_t job_off[MAX_JOBS];
    for (int j = 0; j < n_jobs; j++) {
        const int64_t n_ff = jobs[j].w->gate.rows, n_tok = jobs[j].n_tokens;
        job_off[j] = total;
        total += 2 * align64((size_t)(n_tok * n_ff) * sizeof(float));
        total += align64((size_t)n_tok * moex_row_bytes(moex_vec_dot_type(jobs[j].w->down.type), n_ff));
    }
    void *owned = NULL;
    uint8_t *buf = scratch_get(pool, total, &owned);
    if (!buf)
        return moex_fail(err, "out of memory for %zu bytes of expert scratch (%d jobs, %lld input rows)", total,
                         n_jobs, (long long)n_x);
    for (int k = 0; k < n_types; k++) quantize_activations(pool, simd, types[k], x, n_x, hidden, buf + x_off[k]);

    experts_task e = {.simd = simd, .jobs = jobs, .st = (job_state *)buf, .n_jobs = n_jobs, .hidden = hidden};
    atomic_init(&e.next_item[0], 0);
    atomic_init(&e.next_item[1], 0);
    e.first_item[0][0] = e.first_item[1][0] = e.first_row[0] = 0;
    int64_t ff_rows = 0; /* gate rows over every job: the first pass's items are sized on all of them */
    for (int j = 0; j < n_jobs; j++) ff_rows += jobs[j].n_tokens ? jobs[j].w->gate.rows : 0;
    for (int j = 0; j < n_jobs; j++) {
        const moex_expert_weights *w = jobs[j].w;
        const int64_t n_ff = w->gate.rows, n_tok = jobs[j].n_tokens;
        job_state *s = &e.st[j];
        const moex_matrix *m2[2] = {&w->gate, &w->up};
        act_rows *a2[2] = {&s->x_gate, &s->x_up};
        for (int a = 0; a < 2; a++) {
            const int at = moex_vec_dot_type(m2[a]->type);
            *a2[a] = (act_rows){(const uint8_t *)x, (size_t)hidden * sizeof(float), jobs[j].rows, n_tok};
            for (int k = 0; k < n_types; k++)
                if (types[k] == at) *a2[a] = (act_rows){buf + x_off[k], moex_row_bytes(at, hidden), jobs[j].rows, n_tok};
        }
        uint8_t *p = buf + job_off[j];
        s->g = (float *)p;
        s->u = (float *)(p + align64((size_t)(n_tok * n_ff) * sizeof(float)));
        const int down_at = moex_vec_dot_type(w->down.type);
        if (down_at == MOEX_TYPE_F32) {
            s->hq = (uint8_t *)s->g;
            s->hq_row_bytes = (size_t)n_ff * sizeof(float);
        } else {
            s->hq = p + 2 * align64((size_t)(n_tok * n_ff) * sizeof(float));
            s->hq_row_bytes = moex_row_bytes(down_at, n_ff);
        }
        s->ff_chunk = chunk_rows_of(n_ff, ff_rows, 2 * w->gate.row_bytes, nth);
        s->hid_chunk = chunk_rows(hidden, w->down.row_bytes, nth, hidden >= 4 ? 4 : 1);
        s->items_up = n_tok ? (n_ff + s->ff_chunk - 1) / s->ff_chunk : 0;
        s->items_down = n_tok ? (hidden + s->hid_chunk - 1) / s->hid_chunk : 0;
        e.first_item[0][j + 1] = e.first_item[0][j] + s->items_up;
        e.first_item[1][j + 1] = e.first_item[1][j] + s->items_down;
        e.first_row[j + 1] = e.first_row[j] + n_tok;
    }
    moex_pool_run(pool, experts_pass0, &e);
    quantize_hidden(pool, &e);
    moex_pool_run(pool, experts_pass1, &e);
    free(owned);
    return 0;
}
