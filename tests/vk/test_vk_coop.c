/* Prompt-batch products on cooperative matrices (mm_coop.comp): dense
 * products for every GPU weight type but f32 (ragged row and token tiles, with
 * the residual add) and the grouped expert FFN (gate+up with silu, down with
 * the gate weight; one expert with more pairs than a token tile), against a
 * float64 reference.
 *
 * Tolerances: the kernel multiplies f16 values (weights dequantized to f16,
 * activations rounded to f16) and sums in f32. Against a reference computed
 * on those same f16-rounded inputs only the f32 summation differs (~1e-7),
 * plus a rare one-ulp f16 flip where the GPU's f32 dequantization lands on a
 * rounding boundary differently from the CPU's; 3e-5 (1e-4 for the FFN, which
 * rounds h too) is far below the ~4e-4 the f16 inputs cost, so a kernel that
 * dropped or misplaced any product fails. Against the exact inputs the error
 * is that f16 cost: bounded at 3e-3.
 *
 * A device without cooperative matrices runs the same kernel with its
 * shared-memory stand-in for the matrix unit (MOEX_VK_COOP_EMULATE, asked
 * here); exit 77 when neither is available. */
#include "tests/vk/vk_test_util.h"

#include "common/types.h"

static float h16(float x) { return moex_f16_to_f32(moex_f32_to_f16(x)); }

static void round_f16(const float *a, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = h16(a[i]);
}

#define P(b) moex_vk_buffer_ptr(b)

/* y = W x (+ res) for n tokens, the weights woff bytes into their buffer (4: Q4_K off its 16-byte
 * alignment, the generic path); checks errors vs the f16-input and the exact reference. */
static void check_dense_at(moex_vk *vk, rng *r, moex_type t, int64_t rows, int64_t cols, int64_t n, bool resid,
                           size_t woff) {
    test_matrix m = make_matrix(r, t, rows, cols);
    const size_t nx = (size_t)(n * cols), ny = (size_t)(n * rows);
    float *x = malloc(nx * 4), *xh = malloc(nx * 4), *wh = malloc((size_t)(rows * cols) * 4), *res = malloc(ny * 4),
          *y = malloc(ny * 4);
    double *ref = malloc(ny * 8), *ref16 = malloc(ny * 8);
    fill_gauss(r, x, nx, 1.0f);
    fill_gauss(r, res, ny, 1.0f);
    round_f16(x, xh, nx);
    round_f16(m.deq, wh, (size_t)(rows * cols));
    for (int64_t tk = 0; tk < n; tk++)
        for (int64_t i = 0; i < rows; i++) {
            double s = resid ? res[tk * rows + i] : 0, s16 = s;
            for (int64_t j = 0; j < cols; j++) {
                s += (double)m.deq[i * cols + j] * x[tk * cols + j];
                s16 += (double)wh[i * cols + j] * xh[tk * cols + j];
            }
            ref[tk * rows + i] = s;
            ref16[tk * rows + i] = s16;
        }
    moex_vk_buffer *wb = gpu_from(vk, NULL, woff + (size_t)rows * m.row_bytes), *xb = gpu_from(vk, x, nx * 4),
                   *rb = gpu_from(vk, res, ny * 4), *yb = gpu_from(vk, NULL, ny * 4);
    MUST(moex_vk_upload(vk, wb, woff, m.data, (size_t)rows * m.row_bytes, &g_err));
    moex_vk_matrix vm = vk_matrix_of(&m, wb);
    vm.data += woff;
    moex_vk_cmd *c = cmd_begin(vk);
    MUST(moex_vk_op_matmul(c, &vm, P(xb), n, P(yb), resid ? P(rb) : 0, &g_err));
    cmd_run_free(c);
    gpu_read(vk, yb, y, ny * 4);
    const double e16 = rel_l2(y, ref16, ny), e = rel_l2(y, ref, ny);
    printf("  %-5s %lldx%lld n=%lld%s%s: vs f16 inputs %.2g, vs exact %.2g\n", moex_type_get(t)->name, (long long)rows,
           (long long)cols, (long long)n, resid ? "+res" : "", woff ? " unaligned" : "", e16, e);
    CHECK(e16 < 3e-5 && e < 3e-3, "%s %lldx%lld n=%lld: rel err %.3g (f16 inputs) / %.3g (exact)", moex_type_get(t)->name,
          (long long)rows, (long long)cols, (long long)n, e16, e);
    moex_vk_buffer_free(wb), moex_vk_buffer_free(xb), moex_vk_buffer_free(rb), moex_vk_buffer_free(yb);
    free(x), free(xh), free(wh), free(res), free(y), free(ref), free(ref16);
    free_matrix(&m);
}

static void check_dense(moex_vk *vk, rng *r, moex_type t, int64_t rows, int64_t cols, int64_t n, bool resid) {
    check_dense_at(vk, r, t, rows, cols, n, resid, 0);
}

/* One expert tensor: E matrices back to back, with their f16-rounded values. */
typedef struct expert_set {
    test_matrix m[8];
    float *wh[8];
    uint8_t *all;
    size_t stride;
} expert_set;

static expert_set make_experts(rng *r, moex_type t, int E, int64_t rows, int64_t cols) {
    expert_set s = {.stride = moex_row_bytes(t, cols) * (size_t)rows};
    s.all = malloc((size_t)E * s.stride);
    for (int e = 0; e < E; e++) {
        s.m[e] = make_matrix(r, t, rows, cols);
        s.wh[e] = malloc((size_t)(rows * cols) * 4);
        round_f16(s.m[e].deq, s.wh[e], (size_t)(rows * cols));
        memcpy(s.all + (size_t)e * s.stride, s.m[e].data, s.stride);
    }
    return s;
}

static void free_experts(expert_set *s, int E) {
    for (int e = 0; e < E; e++) free_matrix(&s->m[e]), free(s->wh[e]);
    free(s->all);
}

/* out[t] = res[t] + sum_j gw * down(silu(gate x) * up x) of expert ids[t,j]; f16 marks the rounded variant. */
static void experts_ref(expert_set *g, expert_set *u, expert_set *dn, const float *x, const float *res,
                        const int32_t *ids, const float *gw, int64_t n, int k, int64_t d, int64_t f, bool f16,
                        double *out) {
    double *h = malloc((size_t)f * 8);
    float *xr = malloc((size_t)d * 4);
    for (int64_t t = 0; t < n; t++) {
        for (int64_t c = 0; c < d; c++) xr[c] = f16 ? h16(x[t * d + c]) : x[t * d + c];
        for (int64_t r = 0; r < d; r++) out[t * d + r] = res[t * d + r];
        for (int j = 0; j < k; j++) {
            const int e = ids[t * k + j];
            const float *wg = f16 ? g->wh[e] : g->m[e].deq, *wu = f16 ? u->wh[e] : u->m[e].deq,
                        *wd = f16 ? dn->wh[e] : dn->m[e].deq;
            for (int64_t r = 0; r < f; r++) {
                double a = 0, b = 0;
                for (int64_t c = 0; c < d; c++) a += (double)wg[r * d + c] * xr[c], b += (double)wu[r * d + c] * xr[c];
                const double hv = a / (1 + exp(-a)) * b;
                h[r] = f16 ? h16((float)hv) : hv;
            }
            for (int64_t r = 0; r < d; r++) {
                double s = 0;
                for (int64_t c = 0; c < f; c++) s += (double)wd[r * f + c] * h[c];
                out[t * d + r] += gw[t * k + j] * s;
            }
        }
    }
    free(h);
    free(xr);
}

/* The grouped FFN over E experts, k per token; expert 0 is chosen by most tokens (more pairs than a tile). */
static void check_experts(moex_vk *vk, rng *r, moex_type tg, moex_type td, int64_t d, int64_t f, int64_t n) {
    enum { E = 8, K = 2 };
    expert_set g = make_experts(r, tg, E, f, d), u = make_experts(r, tg, E, f, d), dn = make_experts(r, td, E, d, f);
    float *x = malloc((size_t)(n * d) * 4), *res = malloc((size_t)(n * d) * 4), *gw = malloc((size_t)(n * K) * 4),
          *got = malloc((size_t)(n * d) * 4);
    int32_t *ids = malloc((size_t)(n * K) * 4);
    double *ref = malloc((size_t)(n * d) * 8), *ref16 = malloc((size_t)(n * d) * 8);
    fill_gauss(r, x, (size_t)(n * d), 1.0f);
    fill_gauss(r, res, (size_t)(n * d), 1.0f);
    for (int64_t t = 0; t < n; t++) {
        ids[t * K] = rng_next(r) % 4 ? 0 : (int32_t)(1 + rng_next(r) % (E - 1));
        do ids[t * K + 1] = (int32_t)(rng_next(r) % E);
        while (ids[t * K + 1] == ids[t * K]);
        gw[t * K] = (float)rng_uniform(r), gw[t * K + 1] = (float)rng_uniform(r);
    }
    experts_ref(&g, &u, &dn, x, res, ids, gw, n, K, d, f, false, ref);
    experts_ref(&g, &u, &dn, x, res, ids, gw, n, K, d, f, true, ref16);
    moex_vk_buffer *gb = gpu_from(vk, g.all, E * g.stride), *ub = gpu_from(vk, u.all, E * u.stride),
                   *db = gpu_from(vk, dn.all, E * dn.stride), *xb = gpu_from(vk, x, (size_t)(n * d) * 4),
                   *rb = gpu_from(vk, res, (size_t)(n * d) * 4), *ib = gpu_from(vk, ids, (size_t)(n * K) * 4),
                   *wb = gpu_from(vk, gw, (size_t)(n * K) * 4);
    moex_vk_experts ex = {.gate = {tg, f, d, moex_row_bytes(tg, d), P(gb), g.stride},
                          .up = {tg, f, d, moex_row_bytes(tg, d), P(ub), u.stride},
                          .down = {td, d, f, moex_row_bytes(td, f), P(db), dn.stride},
                          .n_expert = E};
    moex_vk_buffer *sb = gpu_from(vk, NULL, moex_vk_experts_scratch(&ex, n, K));
    moex_vk_cmd *c = cmd_begin(vk);
    MUST(moex_vk_op_experts(c, &ex, P(xb), n, K, P(ib), P(wb), P(rb), P(rb), P(sb), &g_err));
    cmd_run_free(c);
    gpu_read(vk, rb, got, (size_t)(n * d) * 4);
    const double e16 = rel_l2(got, ref16, (size_t)(n * d)), e = rel_l2(got, ref, (size_t)(n * d));
    printf("  experts %s/%s d=%lld f=%lld n=%lld: vs f16 inputs %.2g, vs exact %.2g\n", moex_type_get(tg)->name,
           moex_type_get(td)->name, (long long)d, (long long)f, (long long)n, e16, e);
    CHECK(e16 < 1e-4 && e < 3e-3, "experts %s/%s n=%lld: rel err %.3g (f16 inputs) / %.3g (exact)",
          moex_type_get(tg)->name, moex_type_get(td)->name, (long long)n, e16, e);
    moex_vk_buffer *all[] = {gb, ub, db, xb, rb, ib, wb, sb};
    for (int i = 0; i < 8; i++) moex_vk_buffer_free(all[i]);
    free_experts(&g, E), free_experts(&u, E), free_experts(&dn, E);
    free(x), free(res), free(gw), free(got), free(ids), free(ref), free(ref16);
}

int main(void) {
    rng r = test_rng("test_vk_coop");
    moex_vk *vk = test_vk_coop_mode(false, MOEX_VK_COOP_EMULATE);   /* the matrix unit where the device has one */
    const moex_vk_info *in = moex_vk_get_info(vk);
    if (!in->coop) {
        printf("SKIP: no cooperative matrices and no emulation (no f16 or too little shared memory)\n");
        moex_vk_free(vk);
        return 77;
    }
    printf("cooperative matrices: %s, %ux%ux%u\n", in->coop == 1 ? "VK_NV_cooperative_matrix" : "emulated", in->coop_m,
           in->coop_n, in->coop_k);
    /* Emulated (a CPU driver compiling every variant: slow), a few types cover the tiling; dq8 itself is
     * pinned per type by test_vk_layout. On the matrix unit every type. */
    const bool all = in->coop == 1;
    for (int i = 0; i < N_ALL_TYPES; i++) {
        const moex_type t = k_all_types[i];
        if (t == MOEX_TYPE_F32) continue;   /* f32 weights keep the f32 tiles */
        if (all || t == MOEX_TYPE_Q4_K || t == MOEX_TYPE_Q6_K || t == MOEX_TYPE_F16) check_dense(vk, &r, t, 200, 256, 70, true);
    }
    /* (More than 64 tokens over few rows: the 32-token tiles; up to 64: the 64-token ones.) */
    check_dense(vk, &r, MOEX_TYPE_Q4_K, 16, 512, 9, false);     /* one partial tile each way, 16 steps */
    check_dense(vk, &r, MOEX_TYPE_Q6_K, 384, 256, 130, false);  /* full tiles, a last token tile of 2 */
    check_dense(vk, &r, MOEX_TYPE_Q6_K, 130, 512, 64, true);    /* full 64-token tile */
    check_dense_at(vk, &r, MOEX_TYPE_Q4_K, 72, 256, 20, false, 4);   /* Q4_K through dq8 */
    check_experts(vk, &r, MOEX_TYPE_Q4_K, MOEX_TYPE_Q6_K, 256, all ? 512 : 256, all ? 100 : 40);
    check_experts(vk, &r, MOEX_TYPE_Q8_0, MOEX_TYPE_Q5_0, 288, 160, 90);   /* ragged rows both ways */
    moex_vk_free(vk);
    return test_finish("test_vk_coop");
}
