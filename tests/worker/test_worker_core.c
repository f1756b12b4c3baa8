/* The worker core (worker/core.c) against a float64 reference and against
 * the hub's own executors, plus the backlog, outbox and model identity.
 *
 * usage: test_worker_core MODEL.gguf   (a qwen3moe model, from moex-gguf gen) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "worker/worker.h"

#include "tests/test_util.h"

static rng g_rng;   /* seeded in main: fresh inputs each run */

/* ---- float64 reference: g * down(silu(gate x) * up x) from dequantized weights ---- */

static double *dequant_matrix(const moex_matrix *w) {
    double *out = malloc((size_t)(w->rows * w->cols) * sizeof *out);
    float *row = malloc((size_t)w->cols * sizeof *row);
    for (int64_t r = 0; r < w->rows; r++) {
        if (moex_dequantize_row(w->type, (const uint8_t *)w->data + r * w->row_bytes, row, w->cols, NULL)) abort();
        for (int64_t c = 0; c < w->cols; c++) out[r * w->cols + c] = row[c];
    }
    free(row);
    return out;
}

static void reference_expert(const moex_expert_weights *w, const float *x, float gate, int64_t d, double *out) {
    const int64_t f = w->gate.rows;
    double *G = dequant_matrix(&w->gate), *U = dequant_matrix(&w->up), *D = dequant_matrix(&w->down);
    double *h = malloc((size_t)f * sizeof *h);
    for (int64_t r = 0; r < f; r++) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < d; c++) g += G[r * d + c] * x[c], u += U[r * d + c] * x[c];
        h[r] = g / (1 + exp(-g)) * u;
    }
    for (int64_t r = 0; r < d; r++) {
        double s = 0;
        for (int64_t c = 0; c < f; c++) s += D[r * f + c] * h[c];
        out[r] = gate * s;
    }
    free(G), free(U), free(D), free(h);
}

/* ---- helpers ---- */

typedef struct frame {
    uint8_t *buf;
    size_t len, cap;
} frame;

static void encode_dispatch(frame *fr, uint32_t seq, int layer, int expert, int n, int hidden, int dtype,
                            const float *x, const float *gates) {
    moex_proto_tensor_msg m = {.type = MOEX_MSG_DISPATCH, .seq = seq, .layer = (uint16_t)layer,
                               .expert = (uint16_t)expert, .n_tokens = (uint32_t)n, .hidden = (uint16_t)hidden,
                               .dtype = (uint8_t)dtype};
    fr->cap = moex_proto_tensor_frame_bytes(&m);
    fr->buf = realloc(fr->buf, fr->cap);
    moex_error err;
    if (moex_proto_encode_tensor_f32(&m, x, gates, fr->buf, fr->cap, &fr->len, &err)) {
        fprintf(stderr, "encode: %s\n", err.msg);
        abort();
    }
}

static moex_proto_limits limits_for(const moex_model *m) {
    moex_proto_limits lim = moex_proto_default_limits();
    lim.max_hidden = (uint32_t)m->hp.n_embd;
    lim.max_layers = (uint32_t)m->hp.n_layer;
    lim.max_experts = (uint32_t)m->hp.n_expert;
    return lim;
}


/* ---- the core against the reference, every dtype ---- */

/* Relative L2 bounds per result dtype. The kernel quantizes its activations
 * to Q8_0 twice (x before gate/up, h before down): about 1.2% measured with
 * f32 on the wire; the result's rounding to bf16 or int8 adds up to ~0.5%.
 * A different expert is off by more than 100%. */
static double bound_for(int dtype) {
    switch (dtype) {
    case MOEX_DT_F32: return 2.5e-2;
    case MOEX_DT_F16: return 2.5e-2;
    default: return 3e-2; /* bf16, int8 */
    }
}

static void test_reference(const moex_model *m, moex_worker_core *core) {
    const int d = m->hp.n_embd, layer = 1, expert = 5;
    const int dtypes[] = {MOEX_DT_F16, MOEX_DT_BF16, MOEX_DT_F32, MOEX_DT_INT8};
    const int counts[] = {1, 7};
    const moex_proto_limits lim = limits_for(m);
    const moex_expert_weights *w = &m->layers[layer].experts[expert], *other = &m->layers[layer].experts[expert - 1];
    frame disp = {0}, res = {0};
    for (size_t di = 0; di < 4; di++) {
        for (size_t ci = 0; ci < 2; ci++) {
            const int dt = dtypes[di], n = counts[ci];
            float *x = malloc((size_t)n * d * sizeof *x), *gates = malloc((size_t)n * sizeof *gates);
            for (int i = 0; i < n * d; i++) x[i] = rng_gauss(&g_rng);
            for (int t = 0; t < n; t++) gates[t] = 0.05f + 0.9f * (float)rng_uniform(&g_rng);
            encode_dispatch(&disp, 1000 + (uint32_t)(di * 2 + ci), layer, expert, n, d, dt, x, gates);
            moex_proto_msg dm, rm;
            moex_error err;
            CHECK(moex_proto_decode(disp.buf, disp.len, &lim, NULL, 0, &dm, &err) == 0, "decode dispatch: %s", err.msg);
            res.cap = moex_worker_result_bytes(&dm);
            res.buf = realloc(res.buf, res.cap);
            int rc = moex_worker_core_compute(core, &dm, res.buf, res.cap, &res.len, &err);
            CHECK(rc == 0, "compute %s x%d: %s", moex_proto_dtype_name(dt), n, err.msg);
            if (rc) continue;
            CHECK(res.len == res.cap, "result length %zu, expected %zu", res.len, res.cap);
            CHECK(moex_proto_decode(res.buf, res.len, &lim, NULL, 0, &rm, &err) == 0, "decode result: %s", err.msg);
            CHECK(rm.h.type == MOEX_MSG_RESULT && rm.h.seq == dm.h.seq && rm.h.layer == layer && rm.h.expert == expert &&
                      rm.h.n_tokens == (uint32_t)n && rm.h.hidden == d && rm.h.dtype == dt,
                  "result header fields do not echo the dispatch");
            /* The reference sees what the worker received: x and gates after the wire. */
            float *xr = malloc((size_t)d * sizeof *xr), *got = malloc((size_t)n * d * sizeof *got);
            double *want = malloc((size_t)n * d * sizeof *want), *wrong = malloc((size_t)n * d * sizeof *wrong);
            for (int t = 0; t < n; t++) {
                moex_proto_tensor_row_f32(&dm.u.tensor, (uint32_t)t, xr);
                const float g = moex_proto_tensor_gate(&dm.u.tensor, (uint32_t)t);
                reference_expert(w, xr, g, d, want + (size_t)t * d);
                reference_expert(other, xr, g, d, wrong + (size_t)t * d);
                moex_proto_tensor_row_f32(&rm.u.tensor, (uint32_t)t, got + (size_t)t * d);
            }
            const double e = rel_l2(got, want, (size_t)n * d), e_wrong = rel_l2(got, wrong, (size_t)n * d);
            printf("dtype %-4s tokens %d: rel L2 error %.2e (bound %.0e; vs another expert %.2f)\n",
                   moex_proto_dtype_name(dt), n, e, bound_for(dt), e_wrong);
            CHECK(e < bound_for(dt), "%s x%d: relative L2 error %.3e over %.0e", moex_proto_dtype_name(dt), n, e,
                  bound_for(dt));
            CHECK(e_wrong > 0.3, "the reference cannot tell experts apart (%.3f)", e_wrong);
            free(x), free(gates), free(xr), free(got), free(want), free(wrong);
        }
    }
    free(disp.buf);
    free(res.buf);
}

/* ---- bit-identical to moex_experts_run (f32 wire) and, for every wire
 * dtype, to the hub's local executor rounding at the expert boundary ---- */

static void test_bit_identical(const moex_model *m, moex_worker_core *core, moex_pool *pool) {
    const int d = m->hp.n_embd, layer = 0, expert = 3, n = 7;
    const moex_proto_limits lim = limits_for(m);
    const int dtypes[] = {MOEX_DT_F32, MOEX_DT_F16, MOEX_DT_BF16, MOEX_DT_INT8};
    float *x = malloc((size_t)n * d * sizeof *x), *gates = malloc(n * sizeof *gates);
    float *direct = malloc((size_t)n * d * sizeof *direct), *local = malloc((size_t)n * d * sizeof *local);
    float *got = malloc((size_t)n * d * sizeof *got);
    int32_t rows[7], ids[7];
    for (int i = 0; i < n * d; i++) x[i] = rng_gauss(&g_rng);
    for (int t = 0; t < n; t++) {
        gates[t] = 0.1f + 0.8f * (float)rng_uniform(&g_rng);
        rows[t] = t;
        ids[t] = expert;
    }
    frame disp = {0}, res = {0};
    for (size_t di = 0; di < sizeof dtypes / sizeof *dtypes; di++) {
        const int dt = dtypes[di];
        encode_dispatch(&disp, 77, layer, expert, n, d, dt, x, gates);
        moex_proto_msg dm, rm;
        moex_error err;
        CHECK(moex_proto_decode(disp.buf, disp.len, &lim, NULL, 0, &dm, &err) == 0, "decode: %s", err.msg);
        res.cap = moex_worker_result_bytes(&dm);
        res.buf = realloc(res.buf, res.cap);
        CHECK(moex_worker_core_compute(core, &dm, res.buf, res.cap, &res.len, &err) == 0, "compute: %s", err.msg);
        CHECK(moex_proto_decode(res.buf, res.len, &lim, NULL, 0, &rm, &err) == 0, "decode result: %s", err.msg);
        for (int t = 0; t < n; t++) moex_proto_tensor_row_f32(&rm.u.tensor, (uint32_t)t, got + (size_t)t * d);

        if (dt == MOEX_DT_F32) { /* x travels exactly; gates as f16 */
            float g16[7];
            for (int t = 0; t < n; t++) g16[t] = moex_f16_to_f32(moex_f32_to_f16(gates[t]));
            moex_expert_job job = {.w = &m->layers[layer].experts[expert], .n_tokens = n, .rows = rows,
                                   .gates = g16, .out = direct};
            CHECK(moex_experts_run(pool, &job, 1, x, d, NULL) == 0, "moex_experts_run failed");
            CHECK(memcmp(got, direct, (size_t)n * d * sizeof *got) == 0, "f32 RESULT differs from moex_experts_run");
        }
        moex_local_executor *le = moex_local_executor_create(m, pool, dt);
        moex_expert_executor ex = moex_local_executor_iface(le);
        moex_moe_request req = {.layer = layer, .n_tokens = n, .n_used = 1, .expert_ids = ids,
                                .gate_weights = gates, .x = x, .out = local};
        CHECK(ex.run(ex.ctx, &req, &err) == 0, "local executor: %s", err.msg);
        const int same = memcmp(got, local, (size_t)n * d * sizeof *got) == 0;
        CHECK(same, "%s: RESULT differs from the hub's local executor with the same wire dtype",
              moex_proto_dtype_name(dt));
        if (same)
            printf("%s dispatch of %d tokens: bit-identical to the local executor%s\n", moex_proto_dtype_name(dt), n,
                   dt == MOEX_DT_F32 ? " and moex_experts_run" : "");
        moex_local_executor_free(le);
    }
    free(x), free(gates), free(direct), free(local), free(got), free(disp.buf), free(res.buf);
}

/* ---- batches: one moex_experts_run over several dispatches, each the
 * same bits as alone; a refused one leaves the others' indices alone ---- */

static void test_batch(const moex_model *m, moex_worker_core *core) {
    const int d = m->hp.n_embd;
    const moex_proto_limits lim = limits_for(m);
    /* (layer, expert, tokens, dtype); the fourth is not held and is refused */
    const int spec[][4] = {{1, 5, 3, MOEX_DT_F16}, {0, 3, 1, MOEX_DT_F32}, {1, 4, 9, MOEX_DT_INT8},
                           {1, 6, 2, MOEX_DT_F16}, {1, 5, 1, MOEX_DT_BF16}};
    enum { N = 5 };
    frame fr[N] = {{0}};
    moex_proto_msg dm[N];
    moex_error err;
    for (int i = 0; i < N; i++) {
        const int n = spec[i][2];
        float *x = malloc((size_t)n * d * sizeof *x), *gates = malloc((size_t)n * sizeof *gates);
        for (int k = 0; k < n * d; k++) x[k] = rng_gauss(&g_rng);
        for (int t = 0; t < n; t++) gates[t] = 0.05f + 0.9f * (float)rng_uniform(&g_rng);
        encode_dispatch(&fr[i], 300 + (uint32_t)i, spec[i][0], spec[i][1], n, d, spec[i][3], x, gates);
        CHECK(moex_proto_decode(fr[i].buf, fr[i].len, &lim, NULL, 0, &dm[i], &err) == 0, "decode: %s", err.msg);
        free(x), free(gates);
    }
    /* each alone first */
    float *alone[N] = {0};
    for (int i = 0; i < N; i++) {
        float *v;
        if (i == 3) continue;
        CHECK(moex_worker_core_run(core, &dm[i], &v, &err) == 0, "dispatch %d alone: %s", i, err.msg);
        alone[i] = malloc((size_t)spec[i][2] * d * sizeof *v);
        memcpy(alone[i], v, (size_t)spec[i][2] * d * sizeof *v);
    }
    for (int round = 0; round < 2; round++) { /* the second reuses the grown buffers */
        int idx[N];
        moex_error why[N] = {{{0}}};
        moex_worker_core_batch_begin(core);
        for (int i = 0; i < N; i++) {
            const int rc = moex_worker_core_batch_add(core, &dm[i], &why[i]);
            idx[i] = rc ? -1 : moex_worker_core_batch_count(core) - 1;
            CHECK((rc != 0) == (i == 3), "add %d: rc %d (%s)", i, rc, why[i].msg);
        }
        CHECK(idx[3] < 0 && strstr(why[3].msg, "not held"), "the refused dispatch says why: '%s'", why[3].msg);
        CHECK(moex_worker_core_batch_count(core) == N - 1, "batch count %d", moex_worker_core_batch_count(core));
        CHECK(moex_worker_core_batch_run(core, &err) == 0, "batch run: %s", err.msg);
        int same = 1;
        for (int i = 0; i < N; i++) {
            if (i == 3) continue;
            const float *v = moex_worker_core_batch_values(core, idx[i]);
            same &= v && memcmp(v, alone[i], (size_t)spec[i][2] * d * sizeof *v) == 0;
        }
        CHECK(same, "round %d: a dispatch's values in a batch differ from its values alone", round);
        CHECK(!moex_worker_core_batch_values(core, N - 1) && !moex_worker_core_batch_values(core, -1),
              "values of an index outside the batch");
    }
    moex_worker_core_batch_begin(core);
    CHECK(moex_worker_core_batch_count(core) == 0 && moex_worker_core_batch_run(core, &err) == 0, "an empty batch");
    for (int i = 0; i < N; i++) free(fr[i].buf), free(alone[i]);
}

/* ---- errors: clear messages, no crash ---- */

static void test_errors(const moex_model *m, moex_worker_core *core) {
    const int d = m->hp.n_embd;
    const moex_proto_limits lim = moex_proto_default_limits();
    moex_error err = {{0}};
    CHECK(moex_worker_core_hold(core, m->hp.n_layer, 0, &m->layers[0].experts[0], &err) != 0 && strstr(err.msg, "outside"),
          "hold of a layer out of range: '%s'", err.msg);
    CHECK(moex_worker_core_hold(core, 0, -1, &m->layers[0].experts[0], &err) != 0, "hold of expert -1 accepted");
    CHECK(moex_worker_core_hold(core, 0, 0, NULL, &err) != 0, "hold without weights accepted");
    CHECK(!moex_worker_core_holds(core, -3, 0) && !moex_worker_core_holds(core, 0, 99999), "holds() out of range");

    float x[512], g = 0.5f;
    for (int i = 0; i < 512; i++) x[i] = rng_gauss(&g_rng);
    frame fr = {0};
    moex_proto_msg dm;
    float *values;
    uint8_t out[64];
    size_t len;

    encode_dispatch(&fr, 5, 0, 7, 1, d, MOEX_DT_F16, x, &g); /* expert 7 not held */
    CHECK(moex_proto_decode(fr.buf, fr.len, &lim, NULL, 0, &dm, &err) == 0, "decode: %s", err.msg);
    err.msg[0] = 0;
    CHECK(moex_worker_core_run(core, &dm, &values, &err) != 0 && strstr(err.msg, "not held"),
          "dispatch to an expert not held: '%s'", err.msg);

    encode_dispatch(&fr, 6, 1, 5, 1, d / 2, MOEX_DT_F16, x, &g); /* hidden mismatch */
    CHECK(moex_proto_decode(fr.buf, fr.len, &lim, NULL, 0, &dm, &err) == 0, "decode: %s", err.msg);
    err.msg[0] = 0;
    CHECK(moex_worker_core_run(core, &dm, &values, &err) != 0 && strstr(err.msg, "hidden"),
          "hidden mismatch: '%s'", err.msg);

    encode_dispatch(&fr, 7, 1, 5, 1, d, MOEX_DT_F16, x, &g); /* output buffer too small */
    CHECK(moex_proto_decode(fr.buf, fr.len, &lim, NULL, 0, &dm, &err) == 0, "decode: %s", err.msg);
    CHECK(moex_worker_core_compute(core, &dm, out, sizeof out, &len, &err) != 0, "tiny output buffer accepted");

    /* Dropping an expert makes it fail; holding it again makes it work. */
    const int before = moex_worker_core_n_held(core);
    moex_worker_core_drop(core, 1, 5);
    CHECK(!moex_worker_core_holds(core, 1, 5) && moex_worker_core_n_held(core) == before - 1, "drop");
    CHECK(moex_worker_core_run(core, &dm, &values, &err) != 0, "dispatch to a dropped expert computed");
    moex_worker_core_drop(core, 1, 5); /* twice: no-op */
    CHECK(moex_worker_core_n_held(core) == before - 1, "second drop changed the count");
    CHECK(moex_worker_core_hold(core, 1, 5, &m->layers[1].experts[5], &err) == 0, "re-hold: %s", err.msg);
    CHECK(moex_worker_core_run(core, &dm, &values, &err) == 0, "after re-hold: %s", err.msg);

    /* Weights of the wrong width are refused at hold time. */
    moex_expert_weights bad = m->layers[0].experts[0];
    bad.gate.cols = d / 2;
    CHECK(moex_worker_core_hold(core, 0, 1, &bad, &err) != 0, "misshapen weights accepted");
    CHECK(moex_worker_core_create(0, 8, d, NULL, &err) == NULL, "core with 0 layers created");
    free(fr.buf);
}

/* ---- backlog: FIFO, stale-layer drop, full, cancel ---- */

static moex_worker_item item(uint32_t seq, uint16_t layer, uint16_t expert, uint64_t group) {
    moex_worker_item it = {.group = group, .owner = (void *)(uintptr_t)(1000 + group)};
    it.msg.h.type = MOEX_MSG_DISPATCH;
    it.msg.h.seq = seq;
    it.msg.h.layer = layer;
    it.msg.h.expert = expert;
    return it;
}

static void test_backlog(void) {
    moex_worker_backlog *b = moex_worker_backlog_create(4);
    moex_worker_item stale[4], it = {0}, x;
    int n_stale;
    for (uint32_t s = 1; s <= 3; s++) {
        x = item(s, 2, (uint16_t)s, s);
        CHECK(moex_worker_backlog_push(b, &x, stale, &n_stale) == 0 && n_stale == 0, "push %u", s);
    }
    CHECK(moex_worker_backlog_depth(b) == 3, "depth %d", moex_worker_backlog_depth(b));
    CHECK(moex_worker_backlog_at(b, 1) && moex_worker_backlog_at(b, 1)->msg.h.seq == 2 && !moex_worker_backlog_at(b, 3) &&
              !moex_worker_backlog_at(b, -1), "at");
    CHECK(moex_worker_backlog_cancel(b, 2, &it) && it.msg.h.seq == 2 && it.owner == (void *)1002 &&
              !moex_worker_backlog_cancel(b, 2, &it) && !moex_worker_backlog_cancel(b, 9, &it),
          "cancel hands back the removed item");
    CHECK(moex_worker_backlog_pop(b, &it) && it.msg.h.seq == 1 && it.group == 1, "pop 1");
    CHECK(moex_worker_backlog_pop(b, &it) && it.msg.h.seq == 3 && it.msg.h.expert == 3, "pop 3 (2 cancelled)");
    CHECK(!moex_worker_backlog_pop(b, &it) && !moex_worker_backlog_at(b, 0), "pop from empty");

    /* Same layer fills up; one more is refused. */
    for (uint32_t s = 10; s < 14; s++) {
        x = item(s, 5, 0, 7);
        moex_worker_backlog_push(b, &x, stale, &n_stale);
    }
    x = item(14, 5, 0, 7);
    CHECK(moex_worker_backlog_push(b, &x, stale, &n_stale) == 1 && n_stale == 0, "full not refused");
    CHECK(moex_worker_backlog_depth(b) == 4, "depth after refusal");

    /* A dispatch of another layer makes the queued ones stale, handed back in order. */
    x = item(20, 6, 0, 8);
    CHECK(moex_worker_backlog_push(b, &x, stale, &n_stale) == 0, "push of a new layer");
    CHECK(n_stale == 4 && stale[0].msg.h.seq == 10 && stale[3].msg.h.seq == 13 && stale[3].owner == (void *)1007,
          "stale: %d (first %u)", n_stale, stale[0].msg.h.seq);
    CHECK(moex_worker_backlog_depth(b) == 1 && moex_worker_backlog_pop(b, &it) && it.msg.h.seq == 20 &&
              it.msg.h.layer == 6, "the new dispatch is the only one left");
    moex_worker_backlog_free(b);
    CHECK(moex_worker_backlog_create(0) == NULL, "backlog of capacity 0");
}

/* ---- outbox: FIFO across growth, headroom, swap ---- */

static void test_outbox(void) {
    moex_worker_outbox *o = moex_worker_outbox_create(16);
    uint8_t f[40];
    for (int i = 0; i < 40; i++) {
        memset(f, i, sizeof f);
        CHECK(moex_worker_outbox_push_copy(o, 1, f, (size_t)i + 1) == 0, "push %d", i);
    }
    moex_worker_buf mine = {0};
    CHECK(moex_worker_buf_reserve(&mine, 16, 5) == 0, "reserve");
    memset(mine.buf + 16, 0xee, 5);
    mine.len = 5;
    mine.conn = 2;
    uint8_t *given = mine.buf;
    CHECK(moex_worker_outbox_push_swap(o, &mine) == 0 && mine.buf != given && mine.len == 0, "swap");
    CHECK(moex_worker_outbox_count(o) == 41, "count %d", moex_worker_outbox_count(o));
    int ok = 1;
    for (int i = 0; i < 40; i++) {
        const moex_worker_buf *b = moex_worker_outbox_peek(o);
        ok &= b && b->len == (size_t)i + 1 && b->conn == 1 && b->buf[16] == i && b->buf[16 + i] == i;
        moex_worker_outbox_pop(o);
    }
    CHECK(ok, "frames out of order or damaged across growth");
    const moex_worker_buf *b = moex_worker_outbox_peek(o);
    CHECK(b && b->buf == given && b->conn == 2 && b->len == 5 && b->buf[20] == 0xee, "swapped frame");
    /* take: the oldest message by swapping buffers, the slot gets the caller's */
    moex_worker_buf tx = {0};
    CHECK(moex_worker_outbox_take(o, &tx) && tx.buf == given && tx.len == 5 && tx.conn == 2 &&
              moex_worker_outbox_count(o) == 0 && !moex_worker_outbox_take(o, &tx), "take");
    CHECK(moex_worker_outbox_push_copy(o, 3, f, 3) == 0 && moex_worker_outbox_take(o, &tx) && tx.len == 3 &&
              tx.buf != given && tx.ready_s == 0, "take after reuse");
    free(mine.buf);
    mine = tx; /* freed below */
    moex_worker_outbox_clear(o);
    CHECK(!moex_worker_outbox_peek(o) && moex_worker_outbox_count(o) == 0, "clear");
    free(mine.buf);
    moex_worker_outbox_free(o);
}

/* ---- identity: header and metadata, not tensor data ---- */

static void test_identity(const moex_model *m) {
    const moex_gguf *g = m->gguf;
    uint8_t *copy = malloc(g->size);
    memcpy(copy, g->base, g->size);
    moex_error err;
    moex_gguf *c = moex_gguf_open_memory(copy, g->size, &err);
    CHECK(c && moex_gguf_identity(c) == moex_gguf_identity(g), "identity of an identical copy differs");
    moex_gguf_close(c);
    copy[g->size - 1] ^= 0x55; /* tensor data */
    c = moex_gguf_open_memory(copy, g->size, &err);
    CHECK(c && moex_gguf_identity(c) == moex_gguf_identity(g), "identity depends on tensor data");
    moex_gguf_close(c);
    const moex_gguf_kv *kv = moex_gguf_find(g, "general.name"); /* a metadata byte */
    CHECK(kv && kv->value.type == MOEX_GGUF_STRING, "no general.name");
    if (kv) copy[(const uint8_t *)kv->value.v.str.data - g->base] ^= 0x20;
    c = moex_gguf_open_memory(copy, g->size, &err);
    CHECK(c && moex_gguf_identity(c) != moex_gguf_identity(g), "identity ignores metadata");
    moex_gguf_close(c);
    free(copy);
}

int main(int argc, char **argv) {
    g_rng = test_rng("test_worker_core");
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    moex_error err;
    moex_model *m = moex_model_load(argv[1], &err);
    if (!m) {
        fprintf(stderr, "cannot load %s: %s\n", argv[1], err.msg);
        return 1;
    }
    moex_pool *pool = moex_pool_create(2);
    moex_worker_core *core = moex_worker_core_create(m->hp.n_layer, m->hp.n_expert, m->hp.n_embd, pool, &err);
    CHECK(core != NULL, "core: %s", err.msg);
    const int held[][2] = {{0, 3}, {1, 5}, {1, 4}};
    for (int i = 0; i < 3; i++)
        CHECK(moex_worker_core_hold(core, held[i][0], held[i][1], &m->layers[held[i][0]].experts[held[i][1]], &err) == 0,
              "hold: %s", err.msg);
    CHECK(moex_worker_core_n_held(core) == 3 && moex_worker_core_holds(core, 1, 5) && !moex_worker_core_holds(core, 1, 6),
          "held set");

    test_reference(m, core);
    test_bit_identical(m, core, pool);
    test_batch(m, core);
    test_errors(m, core);
    test_backlog();
    test_outbox();
    test_identity(m);

    moex_worker_core_free(core);
    moex_pool_destroy(pool);
    moex_model_free(m);
    if (g_failures) {
        fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    printf("all worker core checks passed\n");
    return 0;
}
