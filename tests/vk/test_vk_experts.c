/* The decode expert FFN (experts_mv.comp through moex_vk_op_experts, n <=
 * VK_MV_NMAX) against a float64 reference on fresh random inputs: the hot
 * types (Q4_K gate/up with Q6_K down), Q8_0, Q5_K, F16, Q4_K weights that are
 * not 16-byte aligned (the generic positions), one and several tokens,
 * repeated experts, and shapes that need the outer loop over positions; then
 * the same with other workgroup shapes (threads not a power of two or larger,
 * more rows) than the defaults. One token's Q4_K gate+up runs on
 * experts_gu.comp where it applies: it is checked to apply, and its cases run
 * in other shapes and with it switched off (experts_mv.comp, moex_vk_testing_set_gu).
 * One expert a token (a worker's rows) runs the down half on the shape for
 * few positions. Where the device has integer dot products Q4_K and Q6_K positions take
 * int8 activations: each half is then checked against float64 on
 * its own input rounded exactly as the GPU rounds it (h read back from the
 * scratch for the down half), and the f32 path of those cases runs too.
 * usage: test_vk_experts_mv [--no-subgroup] */
#include "kernels/vk/vk_testing.h"   /* int8 activations, the experts' workgroup shapes, experts_gu.comp */
#include "tests/vk/vk_test_util.h"

static moex_vk *vk;
static rng R;

#define P(b) moex_vk_buffer_ptr(b)

typedef struct ex_case {
    moex_type tg, td;
    int64_t d, f, n;
    int E, k;
    size_t misalign;   /* bytes every weight tensor starts past a 16-byte boundary */
    bool dup;          /* a token may choose the same expert twice */
} ex_case;

/* n x k expert ids (distinct per token unless dup) and gate weights. */
static void pick(const ex_case *t, int32_t *ids, float *gw) {
    for (int64_t i = 0; i < t->n; i++)
        for (int j = 0; j < t->k; j++) {
            int e;
            bool again;
            do {
                e = (int)(rng_next(&R) % (uint64_t)t->E);
                again = false;
                for (int q = 0; q < j && !t->dup; q++) again |= ids[i * t->k + q] == e;
            } while (again);
            ids[i * t->k + j] = e;
            gw[i * t->k + j] = (float)rng_uniform(&R);
        }
}

/* E matrices back to back, misalign bytes into a fresh buffer. */
static moex_vk_buffer *upload_experts(test_matrix *m, int E, size_t misalign, moex_vk_matrix *out) {
    const size_t one = (size_t)m[0].rows * m[0].row_bytes;
    uint8_t *all = calloc(1, misalign + (size_t)E * one);
    for (int e = 0; e < E; e++) memcpy(all + misalign + (size_t)e * one, m[e].data, one);
    moex_vk_buffer *b = gpu_from(vk, all, misalign + (size_t)E * one);
    free(all);
    *out = vk_matrix_of(&m[0], b);
    out->data += misalign;
    out->expert_stride = one;
    return b;
}

/* ---- the int8 activation path: its rounding, exactly ---- */

/* Whether a half with weights of type t takes int8 activations. */
static bool idot_half(moex_type t, size_t misalign) {
    return moex_vk_testing_idot(vk) && (t == MOEX_TYPE_Q6_K || (t == MOEX_TYPE_Q4_K && misalign % 16 == 0));
}

/* A row of cols values (a multiple of 256) rounded position by position:
 * Q4_K's 32-value positions (_q4k_pos.comp: 16 values of sub-block 2g and
 * 16 of 2g + 1), Q6_K's 16-value ones (experts_mv.comp: 8 values and the 8
 * at +64). */
static void round_positions(moex_type t, const float *v, int64_t cols, float *out) {
    int64_t idx[32];
    for (int64_t b = 0; b < cols; b += 256) {
        if (t == MOEX_TYPE_Q4_K)
            for (int m = 0; m < 8; m++) {
                for (int i = 0; i < 16; i++) {
                    idx[i] = b + 64 * (m >> 1) + 16 * (m & 1) + i;
                    idx[16 + i] = idx[i] + 32;
                }
                i8_round(v, idx, 32, out);
            }
        else
            for (int m = 0; m < 16; m++) {
                for (int i = 0; i < 8; i++) {
                    idx[i] = b + 128 * (m >> 3) + 8 * (m & 7) + i;
                    idx[8 + i] = idx[i] + 64;
                }
                i8_round(v, idx, 16, out);
            }
    }
}

/* Each half against float64 on its own input as the GPU had it: h (n k x f)
 * from x, and y from the GPU's h (h_gpu); returns the larger relative error. */
static double check_halves(const ex_case *t, const test_matrix *g, const test_matrix *u, const test_matrix *dn,
                           const float *x, const float *res, const int32_t *ids, const float *gw, const float *h_gpu,
                           const float *y_gpu) {
    const int64_t d = t->d, f = t->f, n = t->n, E = t->E;
    const int k = t->k;
    const bool gi = idot_half(t->tg, t->misalign), di = idot_half(t->td, t->misalign);
    float **gm = calloc((size_t)E, sizeof *gm), **um = calloc((size_t)E, sizeof *um), **dm = calloc((size_t)E, sizeof *dm);
    for (int64_t e = 0; e < E; e++)
        if (t->tg == MOEX_TYPE_Q4_K && gi) gm[e] = q4k_mins(&g[e]), um[e] = q4k_mins(&u[e]);
    for (int64_t e = 0; e < E; e++)
        if (t->td == MOEX_TYPE_Q4_K && di) dm[e] = q4k_mins(&dn[e]);
    float *xr = malloc((size_t)(d > f ? d : f) * sizeof *xr);
    double *h = malloc((size_t)(n * k * f) * sizeof *h), *y = malloc((size_t)(n * d) * sizeof *y);
    for (int64_t tok = 0; tok < n; tok++)
        for (int j = 0; j < k; j++) {
            const int e = ids[tok * k + j];
            const float *xt = x + tok * d;
            if (gi) round_positions(t->tg, xt, d, xr);
            for (int64_t r = 0; r < f; r++) {
                const double a = i8_dot(&g[e], gm[e], r, xt, gi ? xr : xt), b = i8_dot(&u[e], um[e], r, xt, gi ? xr : xt);
                h[(tok * k + j) * f + r] = a / (1 + exp(-a)) * b;
            }
        }
    for (int64_t tok = 0; tok < n; tok++) {
        for (int64_t r = 0; r < d; r++) y[tok * d + r] = res[tok * d + r];
        for (int j = 0; j < k; j++) {
            const int e = ids[tok * k + j];
            const float *ht = h_gpu + (tok * k + j) * f;
            if (di) round_positions(t->td, ht, f, xr);
            for (int64_t r = 0; r < d; r++) y[tok * d + r] += gw[tok * k + j] * i8_dot(&dn[e], dm[e], r, ht, di ? xr : ht);
        }
    }
    const double eh = rel_l2(h_gpu, h, n * k * f), ey = rel_l2(y_gpu, y, n * d);
    for (int64_t e = 0; e < E; e++) free(gm[e]), free(um[e]), free(dm[e]);
    free(gm), free(um), free(dm), free(xr), free(h), free(y);
    return eh > ey ? eh : ey;
}

static void run_case(const ex_case *t) {
    const int64_t d = t->d, f = t->f, n = t->n;
    const int E = t->E, k = t->k;
    test_matrix *g = malloc(E * sizeof *g), *u = malloc(E * sizeof *u), *dn = malloc(E * sizeof *dn);
    for (int e = 0; e < E; e++) {
        g[e] = make_matrix(&R, t->tg, f, d);
        u[e] = make_matrix(&R, t->tg, f, d);
        dn[e] = make_matrix(&R, t->td, d, f);
    }
    float *x = malloc(n * d * 4), *res = malloc(n * d * 4), *gw = malloc(n * k * 4), *got = malloc(n * d * 4);
    int32_t *ids = malloc(n * k * 4);
    double *ref = malloc(n * d * 8);
    fill_gauss(&R, x, n * d, 1.0f);
    fill_gauss(&R, res, n * d, 1.0f);
    pick(t, ids, gw);
    ref_experts(g, u, dn, x, res, ids, gw, t->n, t->k, t->d, t->f, ref);

    moex_vk_experts ex = {.n_expert = E};
    moex_vk_buffer *gb = upload_experts(g, E, t->misalign, &ex.gate), *ub = upload_experts(u, E, t->misalign, &ex.up),
                   *db = upload_experts(dn, E, t->misalign, &ex.down);
    moex_vk_buffer *xb = gpu_from(vk, x, n * d * 4), *rb = gpu_from(vk, res, n * d * 4), *ib = gpu_from(vk, ids, n * k * 4),
                   *wb = gpu_from(vk, gw, n * k * 4), *sb = gpu_from(vk, NULL, moex_vk_experts_scratch(&ex, n, k)),
                   *yb = gpu_from(vk, NULL, n * d * 4);
    moex_vk_cmd *c = moex_vk_cmd_create(vk, &g_err);
    MUST(!c);
    MUST(moex_vk_cmd_begin(c, &g_err));
    MUST(moex_vk_op_experts(c, &ex, P(xb), n, k, P(ib), P(wb), P(rb), P(yb), P(sb), &g_err));
    moex_vk_barrier(c);
    /* the forward pass's way: y aliases the residual */
    MUST(moex_vk_op_experts(c, &ex, P(xb), n, k, P(ib), P(wb), P(rb), P(rb), P(sb), &g_err));
    MUST(moex_vk_cmd_end(c, &g_err));
    MUST(moex_vk_cmd_run(c, &g_err));
    moex_vk_cmd_free(c);
    char what[128];
    snprintf(what, sizeof what, "n=%lld k=%d d=%lld f=%lld %s/%s%s%s", (long long)n, k, (long long)d, (long long)f,
             moex_type_get(t->tg)->name, moex_type_get(t->td)->name, t->misalign ? " unaligned" : "",
             t->dup ? " repeated experts" : "");
    gpu_read(vk, yb, got, n * d * 4);
    /* the down half's int8 input quantized once (experts_xq.comp) or in every workgroup: the same bits */
    const bool xq = idot_half(t->td, t->misalign);
    float *other[2] = {malloc(n * d * 4), malloc(n * d * 4)};
    const int preq_was = moex_vk_testing_set_ex_preq(vk, 0);
    for (int preq = 0; xq && preq < 2; preq++) {
        moex_vk_buffer *rb0 = gpu_from(vk, res, n * d * 4);   /* rb holds y now */
        moex_vk_testing_set_ex_preq(vk, preq);
        MUST(!(c = moex_vk_cmd_create(vk, &g_err)));
        MUST(moex_vk_cmd_begin(c, &g_err));
        MUST(moex_vk_op_experts(c, &ex, P(xb), n, k, P(ib), P(wb), P(rb0), P(yb), P(sb), &g_err));
        MUST(moex_vk_cmd_end(c, &g_err));
        MUST(moex_vk_cmd_run(c, &g_err));
        moex_vk_cmd_free(c);
        gpu_read(vk, yb, other[preq], n * d * 4);
        moex_vk_buffer_free(rb0);
    }
    moex_vk_testing_set_ex_preq(vk, preq_was);
    float *h_gpu = malloc(n * k * f * 4);
    gpu_read(vk, sb, h_gpu, n * k * f * 4);   /* h: the scratch's first n k x f floats */
    const double e1 = check_halves(t, g, u, dn, x, res, ids, gw, h_gpu, got);
    /* against the unrounded FFN: int8 activations move these random experts' outputs by a few % (up to ~7 %
     * with two experts, 10.4 % seen with four: seed 1795634538), about what the CPU backend's Q8_K rounding does */
    const bool idot = idot_half(t->tg, t->misalign) || idot_half(t->td, t->misalign);
    const double e0 = rel_l2(got, ref, n * d);
    float *again = malloc(n * d * 4);
    gpu_read(vk, rb, again, n * d * 4);
    for (int preq = 0; xq && preq < 2; preq++)
        CHECK(!memcmp(got, other[preq], n * d * 4), "experts %s: ex_preq %d (the down half's input quantized "
              "%s) gives other bits", what, preq, preq ? "once" : "in every workgroup");
    CHECK(e1 <= 1e-5, "experts %s: rel err %.3g (each half on the GPU's input)", what, e1);
    CHECK(e0 <= (idot ? 1.5e-1 : 1e-5), "experts %s: rel err %.3g against the unrounded FFN", what, e0);
    CHECK(!memcmp(got, again, n * d * 4), "experts %s: y aliasing the residual gives another result", what);
    /* the result must depend on every input: a wrong slot, weight or token would show */
    double moved = 0, den = 0;
    for (int64_t i = 0; i < n * d; i++) moved += (ref[i] - res[i]) * (ref[i] - res[i]), den += ref[i] * ref[i];
    CHECK(moved > 1e-4 * den, "experts %s: the experts add too little to the residual to test anything", what);
    printf("  experts %s%s: rel err %.2g, %.2g against the unrounded FFN%s\n", what, idot ? " (int8 activations)" : "",
           e1, e0, xq ? "; the same bits with the down input quantized once or per workgroup" : "");
    moex_vk_buffer *all[] = {gb, ub, db, xb, rb, ib, wb, sb, yb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) moex_vk_buffer_free(all[i]);
    for (int e = 0; e < E; e++) free_matrix(&g[e]), free_matrix(&u[e]), free_matrix(&dn[e]);
    free(g), free(u), free(dn), free(x), free(res), free(gw), free(got), free(again), free(other[0]), free(other[1]), free(ids), free(ref), free(h_gpu);
}

/* One token's Q4_K gate+up (experts_gu.comp where it applies) in other
 * shapes (target threads, rows loaded together, rows per workgroup; 64 threads
 * for 32 rows: one row lane, a thread writing several rows; 1024 for 48: 12
 * row lanes) and switched off
 * (experts_mv.comp's); Qwen3-30B-A3B's shape in the default one. */
static void check_gu(void) {
    const ex_case cases[] = {
        {MOEX_TYPE_Q4_K, MOEX_TYPE_Q6_K, 2048, 768, 1, 8, 8, 0, false},
        {MOEX_TYPE_Q4_K, MOEX_TYPE_Q6_K, 512, 512, 1, 8, 4, 0, false},
        {MOEX_TYPE_Q4_K, MOEX_TYPE_Q8_0, 1024, 320, 1, 6, 2, 0, true},   /* rows past the last 48 or 64: clamped, dropped */
    };
    /* target threads, rows loaded together, rows per workgroup; off */
    const struct { int wg, ru, ch; bool off; } shapes[] = {{0, 0, 0, false},   {64, 1, 0, false}, {256, 2, 64, false},
                                                          {128, 16, 64, false}, {1024, 4, 16, false}, {1024, 2, 48, false},
                                                          {0, 0, 0, true}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        moex_vk_testing_set_gu(vk, shapes[s].wg, shapes[s].ru, shapes[s].ch, shapes[s].off);
        if (shapes[s].off) printf("  gate+up on experts_mv.comp (moex_vk_testing_set_gu)\n");
        else {
            const moex_vk_gu_shape g = moex_vk_testing_gu_shape(vk, 2048 / 32);
            printf("  experts_gu.comp, d 2048: %d rows, %d threads, %d row lanes, %d rows loaded together%s\n", g.ch, g.wg,
                   g.rl, g.ru, g.subgroup ? ", subgroups" : "");
        }
        for (size_t i = s == 0 ? 0 : 1; i < sizeof cases / sizeof *cases; i++) {
            const ex_case *t = &cases[i];
            moex_vk_experts ex = {.n_expert = t->E};
            const size_t rb = moex_row_bytes(t->tg, t->d);
            ex.gate = ex.up = (moex_vk_matrix){t->tg, t->f, t->d, rb, 4096, rb * (size_t)t->f};   /* only looked at */
            CHECK(moex_vk_testing_gu_applies(vk, &ex, 1) == !shapes[s].off, "experts_gu.comp %s for d=%lld",
                  shapes[s].off ? "not switched off" : "not taken", (long long)t->d);
            CHECK(!moex_vk_testing_gu_applies(vk, &ex, 2), "experts_gu.comp taken for two tokens");
            ex.gate.data += 4;
            CHECK(!moex_vk_testing_gu_applies(vk, &ex, 1), "experts_gu.comp taken for gate weights off 16 bytes");
            run_case(t);
        }
    }
    moex_vk_testing_set_gu(vk, 0, 0, 0, false);
}

/* --vk-tune ex_shape, read when a device is created: six numbers set the
 * one-token shapes, twelve the batches' too, eighteen the few-positions
 * shapes too; anything else (a shape the kernel cannot run, a wrong count,
 * trailing text) leaves the defaults. */
static void check_shape_env(void) {
    /* n: how many shapes the setting gives (gate+up, down; then the batches'; then few positions), 0: refused */
    static const struct { const char *env; int n; moex_vk_ex_shape s[6]; } cs[] = {
        {"64:4:2:96:8:4", 2, {{64, 4, 2}, {96, 8, 4}}},
        {"32:8:4:192:2:2:128:8:2:64:4:4", 4, {{32, 8, 4}, {192, 2, 2}, {128, 8, 2}, {64, 4, 4}}},
        {"32:8:4:192:2:2:128:8:2:64:4:4:64:16:2:32:4:2", 6,
         {{32, 8, 4}, {192, 2, 2}, {128, 8, 2}, {64, 4, 4}, {64, 16, 2}, {32, 4, 2}}},
        {"64:8:3:192:4:2", 0, {{0}}},   /* 3 does not divide 8 */
        {"64:8:2:192:4", 0, {{0}}},
        {"64:8:2:192:4:2:64", 0, {{0}}},
        {"64:8:2:192:4:2x", 0, {{0}}},
        {"64:8:2:192:4:2:", 0, {{0}}},
        {"64:8:2:192:4:2:64:2:2:96:2:2:1", 0, {{0}}},
        {"64:8:2:192:4:2:64:2:2:96:2:2:32:8:2", 0, {{0}}},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        moex_vk_options o = test_vk_options();
        snprintf(o.tune.ex_shape, sizeof o.tune.ex_shape, "%s", cs[i].env);
        moex_vk *d = moex_vk_create(&o, &g_err);
        MUST(!d);
        for (int k = 0; k < 6; k++) {
            const int h = k % 2, b = k / 2;
            const moex_vk_ex_shape g = moex_vk_testing_ex_shape(d, h, b),
                                   w = k < cs[i].n ? cs[i].s[k] : moex_vk_testing_ex_default(h, b);
            CHECK(g.wg == w.wg && g.rt == w.rt && g.ru == w.ru, "ex_shape=%s: shape [%d][%d] %d.%d.%d",
                  cs[i].env, h, b, g.wg, g.rt, g.ru);
        }
        moex_vk_free(d);
    }
    printf("  ex_shape: %zu settings read as meant\n", sizeof cs / sizeof *cs);
}

int main(int argc, char **argv) {
    const bool no_sg = argc > 1 && !strcmp(argv[1], "--no-subgroup");
    R = test_rng("test_vk_experts");
    vk = test_vk(no_sg);
    moex_vk_testing_set_idot(vk, 1);   /* int8 activations wherever the device has integer dot products (lavapipe emulates them) */
    const moex_type Q4K = MOEX_TYPE_Q4_K, Q6K = MOEX_TYPE_Q6_K, Q8 = MOEX_TYPE_Q8_0, Q5K = MOEX_TYPE_Q5_K,
                    F16 = MOEX_TYPE_F16;
    const ex_case cases[] = {
        {Q4K, Q6K, 512, 768, 1, 16, 8, 0, false},    /* the Q4_K_M mix, one token (Qwen3-MoE-like ff) */
        {Q4K, Q6K, 512, 256, 8, 12, 4, 0, false},    /* a full batch: tokens share experts */
        {Q4K, Q6K, 256, 256, 3, 6, 3, 0, true},      /* a token choosing one expert twice */
        {Q8, Q8, 256, 320, 1, 10, 4, 0, false},
        {Q8, Q8, 256, 320, 5, 10, 4, 0, false},
        {Q5K, Q5K, 512, 256, 2, 8, 3, 0, false},
        {F16, F16, 2304, 64, 2, 4, 2, 0, false},     /* gate/up: more positions than threads x 4 (outer loop) */
        {Q8, Q8, 64, 2304, 1, 6, 4, 0, false},       /* down: k x positions over threads x 4 (outer loop) */
        {Q4K, Q4K, 512, 256, 1, 8, 3, 4, false},     /* Q4_K not 16-byte aligned: generic positions */
        {Q4K, Q6K, 256, 512, 4, 8, 2, 4, false},     /* unaligned gate/up with Q6_K down */
        {Q4K, Q4K, 512, 512, 3, 8, 4, 0, false},     /* Q4_K down (half of a Q4_K_M file's layers) */
        {Q6K, Q6K, 256, 256, 2, 6, 3, 0, false},     /* Q6_K gate/up */
        {Q4K, Q6K, 512, 768, 3, 16, 1, 0, false},    /* one expert a token (a worker's rows): the down half's few positions */
        {Q4K, Q4K, 512, 768, 1, 16, 1, 0, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
    if (moex_vk_testing_idot(vk)) {   /* the f32 path of the cases that took int8 activations */
        printf("  f32 activations (idot=0)\n");
        moex_vk_testing_set_idot(vk, 0);
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            if (i == 0 || i == 1 || i >= 10) run_case(&cases[i]);   /* one token, a batch, Q4_K down, Q6_K gate/up, k 1 */
        moex_vk_testing_set_idot(vk, 1);
    }
    /* one expert's 768 down inputs (a worker's row: 24 Q4_K or 48 Q6_K positions) take the few-positions
     * shape, eight experts' do not, nor a batch's, nor a token's 2048 gate+up inputs (64 Q4_K positions) */
    CHECK(moex_vk_testing_ex_kind(vk, 1, false, 24) == 2 && moex_vk_testing_ex_kind(vk, 1, false, 48) == 2,
          "one expert's down half does not take the few-positions shape");
    CHECK(moex_vk_testing_ex_kind(vk, 1, false, 8 * 24) == 0 && moex_vk_testing_ex_kind(vk, 1, true, 24) == 1 &&
              moex_vk_testing_ex_kind(vk, 0, false, 64) == 0,
          "eight experts' down half, a batch or a token's gate+up took the few-positions shape");
    /* the defaults fit this device; shapes the kernel cannot run are refused (--vk-tune ex_shape's check) */
    for (int h = 0; h < 2; h++)
        for (int b = 0; b < 3; b++)
            CHECK(moex_vk_testing_ex_shape_ok(vk, h, moex_vk_testing_ex_default(h, b)), "default expert shape [%d][%d] refused",
                  h, b);
    const moex_vk_ex_shape bad[] = {{64, 8, 3}, {16, 32, 2}, {2048, 4, 2}, {64, 0, 0}, {0, 1, 1}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(!moex_vk_testing_ex_shape_ok(vk, (int)(i % 2), bad[i]), "expert shape %d.%d.%d accepted", bad[i].wg, bad[i].rt,
              bad[i].ru);
    /* other shapes: each replaces all three kinds of its half */
    const moex_vk_ex_shape other[][2] = {
        {{32, 8, 4}, {256, 2, 2}},   /* the shapes before the H200 sweep (docs/PERF.md), down and gate+up wider */
        {{64, 16, 2}, {384, 8, 4}},
        {{20, 4, 2}, {36, 4, 4}},    /* not multiples of any subgroup size: the shared-memory reductions */
    };
    for (size_t s = 0; s < sizeof other / sizeof *other; s++) {
        printf("  shapes: gate+up %d.%d.%d, down %d.%d.%d\n", other[s][0].wg, other[s][0].rt, other[s][0].ru,
               other[s][1].wg, other[s][1].rt, other[s][1].ru);
        for (int h = 0; h < 2; h++)
            for (int kind = 0; kind < 3; kind++) moex_vk_testing_set_ex_shape(vk, h, kind, other[s][h]);
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            if (i == 0 || i == 7 || i == 12 || (s < 2 && (i < 3 || i == 8 || i == 10 || i == 13)))
                run_case(&cases[i]);   /* hot mix, outer loop, one expert a token (, unaligned, Q4_K down) */
    }
    check_gu();
    moex_vk_free(vk);
    check_shape_env();
    return test_finish("test_vk_experts");
}
