/* The Vulkan forward-pass kernels other than the matrix products, each
 * against the CPU backend or a float64 reference on fresh random inputs.
 * One subtest per argument: norm, rope, attention, router, experts, fused,
 * decode (the fused decode attention and head), warm (pipelines created up
 * front); --no-subgroup after it runs the shared-memory reductions. */
#include "tests/vk/vk_test_util.h"

#include "common/types.h"
#include "kernels/vk/vk_testing.h"   /* VK_ATTN_COOP_MIN, the split-K prompt attention, int8 activations off */

static moex_vk *vk;
static rng R;

#define P(b) moex_vk_buffer_ptr(b)

/* RMSNorm (with and without weights), the residual add, SwiGLU and argmax. */
static void test_norm(void) {
    const int64_t rows = 5, dim = 1000, n = rows * dim;
    float *x = malloc(n * 4), *w = malloc(dim * 4), *b = malloc(n * 4), *got = malloc(n * 4), *ref = malloc(n * 4);
    fill_gauss(&R, x, n, 3.0f);
    fill_gauss(&R, w, dim, 1.0f);
    fill_gauss(&R, b, n, 1.0f);
    moex_vk_buffer *xb = gpu_from(vk, x, n * 4), *wb = gpu_from(vk, w, dim * 4), *bb = gpu_from(vk, b, n * 4),
                   *o1 = gpu_from(vk, NULL, n * 4), *o2 = gpu_from(vk, NULL, n * 4), *o3 = gpu_from(vk, NULL, n * 4),
                   *o4 = gpu_from(vk, NULL, n * 4), *am = gpu_from(vk, NULL, rows * 4);
    moex_vk_cmd *c = cmd_begin(vk);
    MUST(moex_vk_op_rmsnorm(c, P(o1), P(xb), P(wb), rows, dim, 1e-6f, &g_err));
    MUST(moex_vk_op_rmsnorm(c, P(o2), P(xb), 0, rows, dim, 1e-6f, &g_err));
    MUST(moex_vk_op_eltwise(c, 0, P(xb), P(bb), P(o3), n, &g_err));
    MUST(moex_vk_op_eltwise(c, 1, P(xb), P(bb), P(o4), n, &g_err));
    MUST(moex_vk_op_argmax(c, P(xb), rows, dim, dim, P(am), &g_err));
    cmd_run_free(c);
    for (int64_t r = 0; r < rows; r++) moex_rmsnorm(ref + r * dim, x + r * dim, w, dim, 1e-6f);
    gpu_read(vk, o1, got, n * 4);
    double e = rel_l2_f(got, ref, n);
    CHECK(e < 1e-6, "rmsnorm with weights: rel err %.3g", e);
    printf("  rmsnorm %.2g", e);
    for (int64_t r = 0; r < rows; r++) moex_rmsnorm(ref + r * dim, x + r * dim, NULL, dim, 1e-6f);
    gpu_read(vk, o2, got, n * 4);
    e = rel_l2_f(got, ref, n);
    CHECK(e < 1e-6, "rmsnorm without weights: rel err %.3g", e);
    for (int64_t i = 0; i < n; i++) ref[i] = x[i] + b[i];
    gpu_read(vk, o3, got, n * 4);
    CHECK(rel_l2_f(got, ref, n) == 0, "add must be exact");
    moex_swiglu(ref, x, b, n);
    gpu_read(vk, o4, got, n * 4);
    e = rel_l2_f(got, ref, n);
    CHECK(e < 1e-6, "swiglu: rel err %.3g", e);
    printf("  swiglu %.2g", e);
    int32_t idx[5];
    gpu_read(vk, am, idx, sizeof idx);
    for (int64_t r = 0; r < rows; r++) {
        int64_t best = 0;
        for (int64_t i = 1; i < dim; i++)
            if (x[r * dim + i] > x[r * dim + best]) best = i;
        CHECK(idx[r] == best, "argmax row %lld: %d, expected %lld", (long long)r, idx[r], (long long)best);
    }
    printf("  argmax ok\n");
    moex_vk_buffer *all[] = {xb, wb, bb, o1, o2, o3, o4, am};
    for (int i = 0; i < 8; i++) moex_vk_buffer_free(all[i]);
    free(x), free(w), free(b), free(got), free(ref);
}

/* QK-norm + RoPE (neox and adjacent pairs) + KV append against moex_rmsnorm/moex_rope. */
static void test_rope(void) {
    for (int neox = 0; neox < 2; neox++) {
        moex_vk_attn_shape sh = {.n_head = 4, .n_head_kv = 2, .head_dim = 64, .rope_dim = neox ? 64 : 48,
                                 .rope_base = 10000.0f, .rms_eps = 1e-6f, .neox = neox, .qk_norm = neox, .n_ctx = 40};
        const int64_t n = 3, pos0 = 29, qd = 4 * 64, kvd = 2 * 64, hd = 64;
        float *q = malloc(n * qd * 4), *k = malloc(n * kvd * 4), *v = malloc(n * kvd * 4), *qn = malloc(hd * 4),
              *kn = malloc(hd * 4), *kc = calloc(sh.n_ctx * kvd, 4), *vc = calloc(sh.n_ctx * kvd, 4);
        fill_gauss(&R, q, n * qd, 1.0f);
        fill_gauss(&R, k, n * kvd, 1.0f);
        fill_gauss(&R, v, n * kvd, 1.0f);
        fill_gauss(&R, qn, hd, 1.0f);
        fill_gauss(&R, kn, hd, 1.0f);
        int32_t params = (int32_t)pos0;
        moex_vk_buffer *qb = gpu_from(vk, q, n * qd * 4), *kb = gpu_from(vk, k, n * kvd * 4),
                       *vb = gpu_from(vk, v, n * kvd * 4), *qnb = gpu_from(vk, qn, hd * 4), *knb = gpu_from(vk, kn, hd * 4),
                       *kcb = gpu_from(vk, NULL, sh.n_ctx * kvd * 4), *vcb = gpu_from(vk, NULL, sh.n_ctx * kvd * 4),
                       *pb = gpu_from(vk, &params, 4);
        moex_vk_cmd *c = cmd_begin(vk);
        MUST(moex_vk_op_qk_rope(c, &sh, P(qb), P(kb), P(vb), P(kcb), P(vcb), P(qnb), P(knb), P(pb), n, &g_err));
        cmd_run_free(c);
        for (int64_t t = 0; t < n; t++) {
            float *qt = q + t * qd, *kt = k + t * kvd;
            if (sh.qk_norm) {
                for (int h = 0; h < 4; h++) moex_rmsnorm(qt + h * hd, qt + h * hd, qn, hd, 1e-6f);
                for (int h = 0; h < 2; h++) moex_rmsnorm(kt + h * hd, kt + h * hd, kn, hd, 1e-6f);
            }
            moex_rope(qt, 4, (int)hd, sh.rope_dim, pos0 + t, 10000.0f, neox);
            moex_rope(kt, 2, (int)hd, sh.rope_dim, pos0 + t, 10000.0f, neox);
            memcpy(kc + (pos0 + t) * kvd, kt, kvd * 4);
            memcpy(vc + (pos0 + t) * kvd, v + t * kvd, kvd * 4);
        }
        float *gq = malloc(n * qd * 4), *gk = malloc(sh.n_ctx * kvd * 4), *gv = malloc(sh.n_ctx * kvd * 4);
        gpu_read(vk, qb, gq, n * qd * 4);
        gpu_read(vk, kcb, gk, sh.n_ctx * kvd * 4);
        gpu_read(vk, vcb, gv, sh.n_ctx * kvd * 4);
        const double eq = rel_l2_f(gq, q, n * qd), ek = rel_l2_f(gk, kc, sh.n_ctx * kvd);
        /* angles up to 31 rad in f32 (the CPU multiplies iteratively): ~1e-6 */
        CHECK(eq < 1e-5 && ek < 1e-5, "rope (neox %d): q err %.3g, k err %.3g", neox, eq, ek);
        CHECK(rel_l2_f(gv, vc, sh.n_ctx * kvd) == 0, "v append must be an exact copy to rows %lld..", (long long)pos0);
        printf("  rope neox=%d qk_norm=%d: q %.2g k %.2g\n", neox, neox, eq, ek);
        moex_vk_buffer *all[] = {qb, kb, vb, qnb, knb, kcb, vcb, pb};
        for (int i = 0; i < 8; i++) moex_vk_buffer_free(all[i]);
        free(q), free(k), free(v), free(qn), free(kn), free(kc), free(vc), free(gq), free(gk), free(gv);
    }
}

/* Split-K decode (several splits) and a prompt batch, against moex_attention. */
static void test_attention(void) {
    const int64_t cases[][3] = {{1, 300, 600}, {37, 5, 64}, {1, 0, 16}, {3, 700, 1024}};  /* n, pos0, n_ctx */
    for (int ci = 0; ci < 4; ci++) {
        const int64_t n = cases[ci][0], pos0 = cases[ci][1];
        moex_vk_attn_shape sh = {.n_head = 8, .n_head_kv = 2, .head_dim = 128, .rope_dim = 128, .scale = 0.0883883f,
                                 .n_ctx = cases[ci][2]};
        const int64_t qd = 8 * 128, kvd = 2 * 128, npos = pos0 + n;
        float *q = malloc(n * qd * 4), *kc = malloc(sh.n_ctx * kvd * 4), *vc = malloc(sh.n_ctx * kvd * 4),
              *ref = malloc(n * qd * 4), *got = malloc(n * qd * 4);
        fill_gauss(&R, q, n * qd, 1.0f);
        fill_gauss(&R, kc, sh.n_ctx * kvd, 1.0f);
        fill_gauss(&R, vc, sh.n_ctx * kvd, 1.0f);
        int32_t params = (int32_t)pos0;
        moex_vk_buffer *qb = gpu_from(vk, q, n * qd * 4), *kb = gpu_from(vk, kc, sh.n_ctx * kvd * 4),
                       *vb = gpu_from(vk, vc, sh.n_ctx * kvd * 4), *ob = gpu_from(vk, NULL, n * qd * 4),
                       *sb = gpu_from(vk, NULL, moex_vk_attention_scratch(&sh, n) * 4), *pb = gpu_from(vk, &params, 4);
        moex_vk_cmd *c = cmd_begin(vk);
        MUST(moex_vk_op_attention(c, &sh, P(qb), P(kb), P(vb), P(ob), P(sb), P(pb), n, &g_err));
        cmd_run_free(c);
        (void)npos;
        if (ci == 0) {   /* the K cache is read 16 bytes at a time: misplaced caches are refused, not misread */
            moex_vk_cmd *bad = cmd_begin(vk);
            CHECK(moex_vk_op_attention(bad, &sh, P(qb), P(kb) + 4, P(vb), P(ob), P(sb), P(pb), n, &g_err) == -1 &&
                      strstr(g_err.msg, "aligned"), "a K cache 4 bytes off must be refused (got '%s')", g_err.msg);
            MUST(moex_vk_cmd_end(bad, &g_err));
            moex_vk_cmd_free(bad);
        }
        MUST(moex_attention(NULL, q, kc, vc, ref, n, pos0, 8, 2, 128, sh.scale, NULL));
        gpu_read(vk, ob, got, n * qd * 4);
        const double e = rel_l2_f(got, ref, n * qd);
        CHECK(e < 1e-5, "attention n=%lld pos0=%lld: rel err %.3g", (long long)n, (long long)pos0, e);
        printf("  attention n=%lld pos0=%lld ctx=%lld: %.2g\n", (long long)n, (long long)pos0, (long long)sh.n_ctx, e);
        moex_vk_buffer *all[] = {qb, kb, vb, ob, sb, pb};
        for (int i = 0; i < 6; i++) moex_vk_buffer_free(all[i]);
        free(q), free(kc), free(vc), free(ref), free(got);
    }
}

/* Causal GQA attention in float64: queries t at positions pos0 + t over keys 0 .. pos0 + t. */
static void attention_ref64(const float *q, const float *kc, const float *vc, double *out, int64_t n, int64_t pos0,
                            int H, int HK, int hd, double scale) {
    const int64_t kvd = (int64_t)HK * hd;
    double *s = malloc((size_t)(pos0 + n) * sizeof *s);
    for (int64_t t = 0; t < n; t++)
        for (int h = 0; h < H; h++) {
            const float *qr = q + (t * H + h) * hd;
            const int64_t ko = (int64_t)(h / (H / HK)) * hd, nk = pos0 + t + 1;
            double mx = -INFINITY, sum = 0;
            for (int64_t k = 0; k < nk; k++) {
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)qr[i] * kc[k * kvd + ko + i];
                s[k] = d * scale;
                mx = s[k] > mx ? s[k] : mx;
            }
            for (int64_t k = 0; k < nk; k++) sum += (s[k] = exp(s[k] - mx));
            double *o = out + (t * H + h) * hd;
            for (int i = 0; i < hd; i++) o[i] = 0;
            for (int64_t k = 0; k < nk; k++)
                for (int i = 0; i < hd; i++) o[i] += s[k] / sum * vc[k * kvd + ko + i];
        }
    free(s);
}

/* One prompt attention on device d: inputs uploaded, output read into got. */
static void prompt_attention_on(moex_vk *d, const moex_vk_attn_shape *sh, const float *q, const float *kc,
                                const float *vc, int n, int pos0, float *got) {
    const int64_t qd = (int64_t)sh->n_head * sh->head_dim, kvd = (int64_t)sh->n_head_kv * sh->head_dim;
    int32_t params = pos0;
    moex_vk_buffer *qb = gpu_from(d, q, n * qd * 4), *kb = gpu_from(d, kc, sh->n_ctx * kvd * 4),
                   *vb = gpu_from(d, vc, sh->n_ctx * kvd * 4), *ob = gpu_from(d, NULL, n * qd * 4),
                   *sb = gpu_from(d, NULL, moex_vk_attention_scratch(sh, n) * 4), *pb = gpu_from(d, &params, 4);
    moex_vk_cmd *c = cmd_begin(d);
    MUST(moex_vk_op_attention(c, sh, P(qb), P(kb), P(vb), P(ob), P(sb), P(pb), n, &g_err));
    cmd_run_free(c);
    gpu_read(d, ob, got, n * qd * 4);
    moex_vk_buffer *all[] = {qb, kb, vb, ob, sb, pb};
    for (int i = 0; i < 6; i++) moex_vk_buffer_free(all[i]);
}

static float h16(float x) { return moex_f16_to_f32(moex_f32_to_f16(x)); }

/* Prompt batches against float64: the tiled kernel and the split-K path
 * (moex_vk_testing_set_attn_simple) on the f32 device; then attn_coop.comp on a device
 * with cooperative matrices (the matrix unit, or its shared-memory stand-in
 * under emulation on CPU drivers) where head_dim <= 128 and the prompt has
 * VK_ATTN_COOP_MIN tokens or more, the tiled kernel there otherwise. Several lengths (not multiples of 16 or 64), prompts
 * continuing a cache (pos0 > 0), GQA 1, 2, 3, 8, head_dim 32 to 512 (padded
 * inside a class), partial row blocks and key tiles. The cache rows past the
 * last position hold NaN: they must not be read.
 * The coop kernel multiplies f16 Q*scale, K, V and P and sums in f32: against
 * a reference on the same f16-rounded inputs only P's rounding and the f32
 * sums differ (~1e-4); against the exact inputs the f16 inputs cost ~1e-3.
 * A dropped key, a misplaced row or a wrong rescale costs far more. */
static void test_attention_prompt(void) {
    static const int cases[][6] = {   /* n, pos0, n_head, n_head_kv, head_dim, n_ctx */
        {2, 0, 8, 2, 128, 8},     {100, 0, 8, 8, 64, 128},   {45, 17, 4, 2, 128, 80}, {70, 33, 16, 2, 128, 110},
        {33, 0, 8, 1, 64, 40},    {21, 10, 6, 3, 96, 31},    {9, 40, 4, 4, 256, 60},  {5, 3, 2, 1, 512, 9},
        {130, 70, 32, 4, 128, 200}, {67, 0, 32, 4, 128, 67}, {40, 200, 16, 2, 80, 250}, {33, 5, 4, 1, 32, 40},
        {37, 10, 6, 3, 96, 50},
    };
    moex_vk *vkc = test_vk_coop_mode(false, MOEX_VK_COOP_EMULATE);
    const moex_vk_info *ci_info = moex_vk_get_info(vkc);
    const bool has_coop = ci_info->coop && ci_info->coop_n == 16;
    if (!has_coop) printf("  (no cooperative matrices, not even emulated: the coop attention is not tested)\n");
    for (int ci = 0; ci < (int)(sizeof cases / sizeof cases[0]); ci++) {
        const int n = cases[ci][0], pos0 = cases[ci][1], H = cases[ci][2], HK = cases[ci][3], hd = cases[ci][4];
        moex_vk_attn_shape sh = {.n_head = H, .n_head_kv = HK, .head_dim = hd, .rope_dim = hd,
                                 .scale = 1.0f / sqrtf((float)hd), .n_ctx = cases[ci][5]};
        const int64_t qd = (int64_t)H * hd, kvd = (int64_t)HK * hd, used = (int64_t)(pos0 + n) * kvd;
        float *q = malloc(n * qd * 4), *kc = malloc(sh.n_ctx * kvd * 4), *vc = malloc(sh.n_ctx * kvd * 4),
              *got = malloc(n * qd * 4), *tiled = malloc(n * qd * 4);
        double *ref = malloc(n * qd * sizeof *ref);
        fill_gauss(&R, q, n * qd, 2.0f);
        fill_gauss(&R, kc, used, 1.0f);
        fill_gauss(&R, vc, used, 1.0f);
        for (int64_t i = used; i < sh.n_ctx * kvd; i++) kc[i] = vc[i] = NAN;
        attention_ref64(q, kc, vc, ref, n, pos0, H, HK, hd, sh.scale);
        for (int simple = 0; simple < 2; simple++) {
            moex_vk_testing_set_attn_simple(vk, simple);   /* the split-K path */
            prompt_attention_on(vk, &sh, q, kc, vc, n, pos0, simple ? got : tiled);
            moex_vk_testing_set_attn_simple(vk, false);
            const double e = rel_l2(simple ? got : tiled, ref, n * qd);
            CHECK(e <= 1e-5, "prompt attention (%s) n=%d pos0=%d heads %d/%d hd %d: rel err %.3g",
                  simple ? "split-K" : "tiled", n, pos0, H, HK, hd, e);
            printf("  prompt attention %s n=%d pos0=%d heads %d/%d hd=%d: %.2g\n", simple ? "split-K" : "tiled  ", n,
                   pos0, H, HK, hd, e);
        }
        /* different summation orders: identical bits would mean both runs took the same path */
        if (n * qd >= 4096) CHECK(memcmp(got, tiled, n * qd * 4), "n=%d: the tiled kernel did not run", n);
        if (has_coop) {
            const bool coop = hd <= 128 && n >= VK_ATTN_COOP_MIN;
            prompt_attention_on(vkc, &sh, q, kc, vc, n, pos0, got);
            const double e = rel_l2(got, ref, n * qd);
            double e16 = 0;
            if (coop) {   /* the reference on the kernel's f16 inputs (scale folded into q) */
                float *qh = malloc(n * qd * 4), *kh = malloc(sh.n_ctx * kvd * 4), *vh = malloc(sh.n_ctx * kvd * 4);
                for (int64_t i = 0; i < n * qd; i++) qh[i] = h16(q[i] * sh.scale);
                for (int64_t i = 0; i < sh.n_ctx * kvd; i++) kh[i] = h16(kc[i]), vh[i] = h16(vc[i]);
                double *ref16 = malloc(n * qd * sizeof *ref16);
                attention_ref64(qh, kh, vh, ref16, n, pos0, H, HK, hd, 1.0);
                e16 = rel_l2(got, ref16, n * qd);
                free(qh), free(kh), free(vh), free(ref16);
                CHECK(e16 <= 5e-4 && e <= 3e-3, "prompt attention (coop) n=%d pos0=%d heads %d/%d hd %d: rel err "
                      "%.3g vs f16 inputs, %.3g vs exact", n, pos0, H, HK, hd, e16, e);
                CHECK(memcmp(got, tiled, n * qd * 4), "n=%d: the coop kernel did not run", n);
            } else {
                CHECK(e <= 1e-5, "prompt attention (tiled on the coop device) n=%d hd %d: rel err %.3g", n, hd, e);
            }
            printf("  prompt attention %s n=%d pos0=%d heads %d/%d hd=%d: %.2g (vs f16 inputs %.2g)\n",
                   coop ? "coop   " : "tiled  ", n, pos0, H, HK, hd, e, e16);
        }
        free(q), free(kc), free(vc), free(got), free(ref), free(tiled);
    }
    moex_vk_free(vkc);
}

/* Router: one fused dispatch (small batches) and mm + top-k (large: the
 * columns in slices, several steps each), against route_token's rule in
 * float64; a large batch's logits rows the same bits as a smaller batch's. */
static void test_router(void) {
    const int64_t ns[] = {1, 5, 20};
    for (int ci = 0; ci < 3; ci++) {
        const int64_t n = ns[ci], E = 60, d = n > 8 ? 1024 : 256;
        const int k = 4;
        test_matrix m = make_matrix(&R, MOEX_TYPE_F32, E, d);
        float *x = malloc(n * d * 4);
        fill_gauss(&R, x, n * d, 1.0f);
        moex_vk_buffer *wb = gpu_from(vk, m.data, E * m.row_bytes), *xb = gpu_from(vk, x, n * d * 4),
                       *lb = gpu_from(vk, NULL, moex_vk_router_logits_bytes(n, E)), *cb = gpu_from(vk, NULL, 4),
                       *ib = gpu_from(vk, NULL, n * k * 4),
                       *gb = gpu_from(vk, NULL, n * k * 4);
        moex_vk_matrix vm = vk_matrix_of(&m, wb);
        moex_vk_cmd *c = cmd_begin(vk);
        MUST(moex_vk_op_router(c, &vm, P(xb), n, k, true, P(lb), P(cb), P(ib), P(gb), &g_err));
        moex_vk_barrier(c);   /* a second run must find the counter back at 0 */
        MUST(moex_vk_op_router(c, &vm, P(xb), n, k, true, P(lb), P(cb), P(ib), P(gb), &g_err));
        cmd_run_free(c);
        int32_t ids[20 * 4];
        float gw[20 * 4];
        uint32_t counter;
        gpu_read(vk, ib, ids, n * k * 4);
        gpu_read(vk, gb, gw, n * k * 4);
        gpu_read(vk, cb, &counter, 4);
        CHECK(counter == 0, "router counter left at %u", counter);
        double max_w = 0;
        int bad = 0;
        for (int64_t t = 0; t < n; t++) {
            double lg[60], mx = -1e300, s = 0;
            for (int e = 0; e < E; e++) {
                lg[e] = 0;
                for (int64_t j = 0; j < d; j++) lg[e] += (double)m.deq[e * d + j] * x[t * d + j];
                mx = lg[e] > mx ? lg[e] : mx;
            }
            for (int e = 0; e < E; e++) s += (lg[e] = exp(lg[e] - mx));
            double sel = 0, w[4];
            int id[4];
            for (int j = 0; j < k; j++) {
                int best = -1;
                for (int e = 0; e < E; e++)
                    if (lg[e] >= 0 && (best < 0 || lg[e] > lg[best])) best = e;
                id[j] = best;
                w[j] = lg[best] / s;
                sel += w[j];
                lg[best] = -1;
            }
            for (int j = 0; j < k; j++) {
                bad += ids[t * k + j] != id[j];
                const double err = fabs(gw[t * k + j] - w[j] / sel);
                max_w = err > max_w ? err : max_w;
            }
        }
        CHECK(bad == 0, "router n=%lld: %d expert ids differ", (long long)n, bad);
        CHECK(max_w < 1e-5, "router n=%lld: gate weight error %.3g", (long long)n, max_w);
        printf("  router n=%lld: ids ok, max weight err %.2g\n", (long long)n, max_w);
        if (n > 12) {   /* the first 12 tokens alone: a token's logits do not depend on the others */
            moex_vk_buffer *l2 = gpu_from(vk, NULL, moex_vk_router_logits_bytes(12, E));
            c = cmd_begin(vk);
            MUST(moex_vk_op_router(c, &vm, P(xb), 12, k, true, P(l2), P(cb), P(ib), P(gb), &g_err));
            cmd_run_free(c);
            float *a = malloc(12 * E * 4), *b = malloc(12 * E * 4);
            gpu_read(vk, lb, a, 12 * E * 4);
            gpu_read(vk, l2, b, 12 * E * 4);
            CHECK(!memcmp(a, b, 12 * E * 4), "router: 12 tokens' logits differ alone and among %lld", (long long)n);
            free(a), free(b);
            moex_vk_buffer_free(l2);
        }
        if (n == 5) {   /* a batch's few tiled tokens: the slices stay inside moex_vk_router_logits_bytes */
            const size_t lbytes = moex_vk_router_logits_bytes(n, E);
            uint8_t *guard = malloc(lbytes + 4096), *back = malloc(lbytes + 4096);
            memset(guard, 0x5a, lbytes + 4096);
            moex_vk_buffer *gl = gpu_from(vk, guard, lbytes + 4096);
            c = cmd_begin(vk);
            MUST(moex_vk_op_router_pick(c, MOEX_VK_TILED, &vm, P(xb), n, k, true, P(gl), P(cb), P(ib), P(gb), &g_err));
            cmd_run_free(c);
            gpu_read(vk, gl, back, lbytes + 4096);
            CHECK(!memcmp(back + lbytes, guard + lbytes, 4096), "router on the tiles, %lld tokens: wrote past its logits",
                  (long long)n);
            free(guard), free(back);
            moex_vk_buffer_free(gl);
        }
        moex_vk_buffer *all[] = {wb, xb, lb, cb, ib, gb};
        for (int i = 0; i < 6; i++) moex_vk_buffer_free(all[i]);
        free(x);
        free_matrix(&m);
    }
}

/* Expert FFN: many experts in one dispatch (mv path, n <= 8) and grouped tiles (mm path), against float64. */
static void test_experts(void) {
    const moex_type types[][2] = {{MOEX_TYPE_Q4_K, MOEX_TYPE_Q6_K}, {MOEX_TYPE_Q8_0, MOEX_TYPE_Q5_0}};
    const int64_t ns[] = {1, 3, 70};
    for (int ci = 0; ci < 3; ci++) {
        const moex_type tg = types[ci % 2][0], td = types[ci % 2][1];
        const int64_t n = ns[ci], d = 256, f = 256;
        const int E = 10, k = 3;
        test_matrix g[10], u[10], dn[10];
        const size_t sgu = moex_row_bytes(tg, d) * f, sd = moex_row_bytes(td, f) * d;
        uint8_t *gall = malloc(E * sgu), *uall = malloc(E * sgu), *dall = malloc(E * sd);
        for (int e = 0; e < E; e++) {
            g[e] = make_matrix(&R, tg, f, d);
            u[e] = make_matrix(&R, tg, f, d);
            dn[e] = make_matrix(&R, td, d, f);
            memcpy(gall + e * sgu, g[e].data, sgu);
            memcpy(uall + e * sgu, u[e].data, sgu);
            memcpy(dall + e * sd, dn[e].data, sd);
        }
        float *x = malloc(n * d * 4), *res = malloc(n * d * 4), *gw = malloc(n * k * 4), *got = malloc(n * d * 4);
        int32_t *ids = malloc(n * k * 4);
        double *ref = malloc(n * d * 8);
        fill_gauss(&R, x, n * d, 1.0f);
        fill_gauss(&R, res, n * d, 1.0f);
        for (int64_t t = 0; t < n; t++)
            for (int j = 0; j < k; j++) {   /* k distinct experts per token */
                int e;
                bool dup;
                do {
                    e = (int)(rng_next(&R) % E);
                    dup = false;
                    for (int i = 0; i < j; i++) dup |= ids[t * k + i] == e;
                } while (dup);
                ids[t * k + j] = e;
                gw[t * k + j] = (float)rng_uniform(&R);
            }
        ref_experts(g, u, dn, x, res, ids, gw, n, k, d, f, ref);
        moex_vk_buffer *gb = gpu_from(vk, gall, E * sgu), *ub = gpu_from(vk, uall, E * sgu), *db = gpu_from(vk, dall, E * sd),
                       *xb = gpu_from(vk, x, n * d * 4), *rb = gpu_from(vk, res, n * d * 4), *ib = gpu_from(vk, ids, n * k * 4),
                       *wb = gpu_from(vk, gw, n * k * 4);
        moex_vk_experts ex = {
            .gate = {tg, f, d, moex_row_bytes(tg, d), P(gb), sgu},
            .up = {tg, f, d, moex_row_bytes(tg, d), P(ub), sgu},
            .down = {td, d, f, moex_row_bytes(td, f), P(db), sd},
            .n_expert = E};
        moex_vk_buffer *sb = gpu_from(vk, NULL, moex_vk_experts_scratch(&ex, n, k));
        moex_vk_cmd *c = cmd_begin(vk);
        /* y aliases the residual, as the forward pass uses it */
        MUST(moex_vk_op_experts(c, &ex, P(xb), n, k, P(ib), P(wb), P(rb), P(rb), P(sb), &g_err));
        cmd_run_free(c);
        gpu_read(vk, rb, got, n * d * 4);
        const double e = rel_l2(got, ref, n * d);
        CHECK(e < 1e-5, "experts n=%lld (%s/%s): rel err %.3g", (long long)n, moex_type_get(tg)->name,
              moex_type_get(td)->name, e);
        printf("  experts n=%lld %s/%s: %.2g\n", (long long)n, moex_type_get(tg)->name, moex_type_get(td)->name, e);
        moex_vk_buffer *all[] = {gb, ub, db, xb, rb, ib, wb, sb};
        for (int i = 0; i < 8; i++) moex_vk_buffer_free(all[i]);
        for (int i = 0; i < E; i++) free_matrix(&g[i]), free_matrix(&u[i]), free_matrix(&dn[i]);
        free(gall), free(uall), free(dall), free(x), free(res), free(gw), free(got), free(ids), free(ref);
    }
}

/* float64 rmsnorm(x) * w of one row. */
static void norm_ref(double *out, const float *x, const float *w, int64_t d, float eps) {
    double ss = 0;
    for (int64_t i = 0; i < d; i++) ss += (double)x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / d + eps);
    for (int64_t i = 0; i < d; i++) out[i] = x[i] * inv * w[i];
}

/* Decode products with the RMSNorm fused into their prologue (every mv.comp
 * unit type, with the residual), the fused router (ids, weights, and the xn
 * it writes for the experts), and refusal where fusion does not apply. */
static void test_fused_norm(void) {
    const moex_type types[] = {MOEX_TYPE_Q4_K, MOEX_TYPE_Q6_K, MOEX_TYPE_Q8_0, MOEX_TYPE_F32, MOEX_TYPE_Q5_0};
    const int64_t d = 512, rows = 77;
    const float eps = 1e-5f;
    float *x = malloc(d * 4), *nw = malloc(d * 4), *res = malloc(rows * 4), *got = malloc(rows * 4);
    double *xn = malloc(d * sizeof *xn), *ref = malloc(rows * sizeof *ref);
    fill_gauss(&R, x, d, 4.0f);
    fill_gauss(&R, nw, d, 1.0f);
    fill_gauss(&R, res, rows, 1.0f);
    norm_ref(xn, x, nw, d, eps);
    CHECK(moex_vk_norm_fusable(vk, 1, d) && !moex_vk_norm_fusable(vk, 2, d), "fusable: one token of 512 only");
    moex_vk_buffer *xb = gpu_from(vk, x, d * 4), *wb = gpu_from(vk, nw, d * 4), *rb = gpu_from(vk, res, rows * 4),
                   *yb = gpu_from(vk, NULL, rows * 4);
    for (int ti = 0; ti < (int)(sizeof types / sizeof types[0]); ti++) {
        test_matrix m = make_matrix(&R, types[ti], rows, d);
        moex_vk_buffer *mb = gpu_from(vk, m.data, rows * m.row_bytes);
        moex_vk_matrix vm = vk_matrix_of(&m, mb);
        moex_vk_cmd *c = cmd_begin(vk);
        MUST(moex_vk_op_norm_matmul(c, &vm, P(xb), P(wb), eps, P(yb), P(rb), &g_err));
        cmd_run_free(c);
        gpu_read(vk, yb, got, rows * 4);
        for (int64_t r = 0; r < rows; r++) {
            ref[r] = res[r];
            for (int64_t j = 0; j < d; j++) ref[r] += (double)m.deq[r * d + j] * xn[j];
        }
        const double e = rel_l2(got, ref, rows);
        CHECK(e < 1e-5, "norm+matvec %s: rel err %.3g", moex_type_get(types[ti])->name, e);
        printf("  norm+matvec %s: %.2g\n", moex_type_get(types[ti])->name, e);
        moex_vk_buffer_free(mb);
        free_matrix(&m);
    }
    /* the router: logits of 60 experts, top 4, renormalised; xn for the experts */
    const int E = 60, k = 4;
    test_matrix m = make_matrix(&R, MOEX_TYPE_F32, E, d);
    moex_vk_buffer *mb = gpu_from(vk, m.data, E * m.row_bytes), *lb = gpu_from(vk, NULL, E * 4),
                   *cb = gpu_from(vk, NULL, 4), *ib = gpu_from(vk, NULL, k * 4), *gb = gpu_from(vk, NULL, k * 4),
                   *xnb = gpu_from(vk, NULL, d * 4);
    moex_vk_matrix vm = vk_matrix_of(&m, mb);
    moex_vk_cmd *c = cmd_begin(vk);
    MUST(moex_vk_op_norm_router(c, &vm, P(xb), P(wb), eps, k, true, P(lb), P(cb), P(ib), P(gb), P(xnb), &g_err));
    cmd_run_free(c);
    int32_t ids[4];
    float gw[4], *xg = malloc(d * 4);
    gpu_read(vk, ib, ids, sizeof ids);
    gpu_read(vk, gb, gw, sizeof gw);
    gpu_read(vk, xnb, xg, d * 4);
    const double exn = rel_l2(xg, xn, d);
    CHECK(exn < 1e-6, "fused router: xn rel err %.3g", exn);
    double lg[60], mx = -1e300, sel = 0, w[4];
    for (int e = 0; e < E; e++) {
        lg[e] = 0;
        for (int64_t j = 0; j < d; j++) lg[e] += (double)m.deq[e * d + j] * xn[j];
        mx = lg[e] > mx ? lg[e] : mx;
    }
    for (int e = 0; e < E; e++) lg[e] = exp(lg[e] - mx);
    int bad = 0;
    for (int j = 0; j < k; j++) {
        int best = 0;
        for (int e = 1; e < E; e++)
            if (lg[e] > lg[best]) best = e;
        bad += ids[j] != best;
        sel += (w[j] = lg[best]);
        lg[best] = -1;
    }
    double max_w = 0;
    for (int j = 0; j < k; j++) max_w = fmax(max_w, fabs(gw[j] - w[j] / sel));
    CHECK(bad == 0 && max_w < 1e-5, "fused router: %d ids differ, weight err %.3g", bad, max_w);
    printf("  fused router: ids ok, xn %.2g, weights %.2g\n", exn, max_w);
    /* x or the weight off 16-byte alignment, or no weight: refused with a message, nothing recorded */
    c = cmd_begin(vk);
    CHECK(moex_vk_op_norm_matmul(c, &vm, P(xb) + 4, P(wb), eps, P(yb), 0, &g_err) == -1 && strstr(g_err.msg, "aligned"),
          "a fused norm over a misaligned x must be refused");
    CHECK(moex_vk_op_norm_matmul(c, &vm, P(xb), 0, eps, P(yb), 0, &g_err) == -1, "a fused norm without weight");
    cmd_run_free(c);
    CHECK(moex_vk_norm_fusable(vk, 1, 1 << 16), "no shared-memory staging: any width is fusable");
    moex_vk_buffer *all[] = {xb, wb, rb, yb, mb, lb, cb, ib, gb, xnb};
    for (int i = 0; i < 10; i++) moex_vk_buffer_free(all[i]);
    free_matrix(&m);
    free(x), free(nw), free(res), free(got), free(xn), free(ref), free(xg);
}

/* float64 rows of m times one token's staged x: x, or x * nw (f32, as staged)
 * with the norm's 1 / rms applied to the sums; i8: x rounded as the int8 path
 * rounds each 32-value group (Q4_K's mins on the exact x). res: added, or NULL.
 * xw, xr: d floats of scratch. */
static void staged_ref(const test_matrix *m, const float *x, const float *nw, float eps, bool i8, const float *res,
                       float *xw, float *xr, double *ref) {
    const int64_t d = m->cols;
    double inv = 1;
    for (int64_t j = 0; j < d; j++) xw[j] = nw ? x[j] * nw[j] : x[j];
    if (nw) {
        double ss = 0;
        for (int64_t j = 0; j < d; j++) ss += (double)x[j] * x[j];
        inv = 1.0 / sqrt(ss / d + eps);
    }
    if (i8)
        for (int64_t g = 0; g < d; g += 32) {
            int64_t idx[32];
            for (int j = 0; j < 32; j++) idx[j] = g + j;
            i8_round(xw, idx, 32, xr);
        }
    float *mins = i8 && m->type == MOEX_TYPE_Q4_K ? q4k_mins(m) : NULL;
    for (int64_t r = 0; r < m->rows; r++) ref[r] = (res ? res[r] : 0) + inv * i8_dot(m, mins, r, xw, i8 ? xr : xw);
    free(mins);
}

/* A batch of sequences' products on one token's kernels (MOEX_VK_EACH): the
 * head (norm fused; up to VK_MV_TPW tokens staged in one workgroup, or
 * VK_MV_TPW_I8 with int8 x), Wo (the residual added) and q/k/v (three
 * matrices, norm fused). Each token's rows equal the one-token op's bit for
 * bit and a float64 reference (x rounded as the int8 path rounds it, where
 * idot); 2048 columns and 11 tokens put a workgroup's third and fourth token
 * past one XMAX-wide row of an f32 stage (the stage must hold them all), and
 * make workgroups of 8 and 3 int8 tokens. batch_wg >= 0: the batch's
 * workgroups in all (--vk-tune mv_batch_wg; few: each loops over several row
 * blocks), else the device's. */
static void test_batched_products(bool idot, int batch_wg) {
    const moex_type types[] = {MOEX_TYPE_Q4_K, MOEX_TYPE_Q6_K, MOEX_TYPE_Q8_0, MOEX_TYPE_F32};
    const int64_t d = 2048, rows = 77, kv = 33, n = 11;
    const float eps = 1e-5f;
    char how[64] = "";   /* batch_wg >= 0: the batch's workgroups in all, each looping over row blocks */
    if (batch_wg >= 0) snprintf(how, sizeof how, ", %d workgroups in all", batch_wg);
    const int wg_was = batch_wg >= 0 ? moex_vk_testing_set_mv_batch_wg(vk, batch_wg) : -1;
    moex_vk_testing_set_idot(vk, idot ? 1 : 0);
    if (!moex_vk_norm_each(vk, d) || (idot && !moex_vk_testing_idot(vk))) {
        printf("  products of %d tokens%s: not on this device\n", (int)n, idot ? " (int8 x)" : "");
        moex_vk_testing_set_idot(vk, 0);
        if (wg_was >= 0) moex_vk_testing_set_mv_batch_wg(vk, wg_was);
        return;
    }
    const int64_t outs = rows + 2 * kv;   /* every product's rows of one token: head/Wo rows, or q, k, v */
    float *x = malloc(n * d * 4), *nw = malloc(d * 4), *res = malloc(n * rows * 4), *got = malloc(n * outs * 4),
          *one = malloc(outs * 4), *xw = malloc(d * 4), *xr = malloc(d * 4);
    double *ref = malloc(outs * sizeof *ref);
    fill_gauss(&R, x, (size_t)(n * d), 4.0f);
    fill_gauss(&R, nw, d, 1.0f);
    fill_gauss(&R, res, (size_t)(n * rows), 1.0f);
    moex_vk_buffer *xb = gpu_from(vk, x, n * d * 4), *wb = gpu_from(vk, nw, d * 4), *yb = gpu_from(vk, NULL, n * outs * 4),
                   *y1 = gpu_from(vk, NULL, outs * 4), *rb = gpu_from(vk, NULL, n * rows * 4);
    for (int ti = 0; ti < (int)(sizeof types / sizeof types[0]); ti++) {
        const char *tn = moex_type_get(types[ti])->name;
        test_matrix m[3] = {make_matrix(&R, types[ti], rows, d), make_matrix(&R, types[ti], kv, d),
                            make_matrix(&R, types[ti], kv, d)};
        moex_vk_buffer *mb[3];
        moex_vk_matrix vm[3];
        for (int i = 0; i < 3; i++) mb[i] = gpu_from(vk, m[i].data, m[i].rows * m[i].row_bytes), vm[i] = vk_matrix_of(&m[i], mb[i]);
        const moex_vk_matrix *qkv[3] = {&vm[0], &vm[1], &vm[2]};
        for (int op = 0; op < 3; op++) {   /* 0: head (norm), 1: Wo (residual), 2: q/k/v (norm) */
            static const char *const names[] = {"norm+matvec", "matvec+residual", "norm+q/k/v"};
            const int64_t w_out = op == 2 ? outs : rows;
            /* y rows of n tokens: one buffer per matrix, as the model's q, k and v */
            const moex_vk_ptr ys[3] = {P(yb), P(yb) + (size_t)(n * rows * 4), P(yb) + (size_t)(n * (rows + kv) * 4)};
            MUST(moex_vk_upload(vk, rb, 0, res, n * rows * 4, &g_err));
            moex_vk_cmd *c = cmd_begin(vk);
            if (op == 0) MUST(moex_vk_op_norm_matmul_each(c, &vm[0], P(xb), P(wb), eps, n, P(yb), 0, &g_err));
            else if (op == 1) MUST(moex_vk_op_matmul_pick(c, MOEX_VK_EACH, &vm[0], P(xb), n, P(rb), P(rb), &g_err));
            else MUST(moex_vk_op_norm_matmul_multi_each(c, 3, qkv, ys, P(xb), P(wb), eps, n, &g_err));
            cmd_run_free(c);
            if (op == 1) gpu_read(vk, rb, got, n * rows * 4);
            else gpu_read(vk, yb, got, n * w_out * 4);
            double worst = 0;
            int differ = 0;
            for (int64_t t = 0; t < n; t++) {
                const moex_vk_ptr xt = P(xb) + (size_t)(t * d * 4);
                float *row[3];   /* token t's rows of each matrix in got */
                row[0] = got + t * rows;
                row[1] = got + n * rows + t * kv;
                row[2] = got + n * (rows + kv) + t * kv;
                const moex_vk_ptr y1s[3] = {P(y1), P(y1) + (size_t)(rows * 4), P(y1) + (size_t)((rows + kv) * 4)};
                if (op == 1) MUST(moex_vk_upload(vk, y1, 0, res + t * rows, rows * 4, &g_err));
                c = cmd_begin(vk);
                if (op == 0) MUST(moex_vk_op_norm_matmul(c, &vm[0], xt, P(wb), eps, P(y1), 0, &g_err));
                else if (op == 1) MUST(moex_vk_op_matmul(c, &vm[0], xt, 1, P(y1), P(y1), &g_err));
                else MUST(moex_vk_op_norm_matmul_multi(c, 3, qkv, y1s, xt, P(wb), eps, &g_err));
                cmd_run_free(c);
                gpu_read(vk, y1, one, w_out * 4);
                differ += memcmp(one, row[0], rows * 4) != 0 ||
                          (op == 2 && (memcmp(one + rows, row[1], kv * 4) || memcmp(one + rows + kv, row[2], kv * 4)));
                for (int i = 0; i < (op == 2 ? 3 : 1); i++) {
                    staged_ref(&m[i], x + t * d, op == 1 ? NULL : nw, eps,
                               idot && (types[ti] == MOEX_TYPE_Q4_K || types[ti] == MOEX_TYPE_Q6_K),
                               op == 1 ? res + t * rows : NULL, xw, xr, ref);
                    worst = fmax(worst, rel_l2(row[i], ref, m[i].rows));
                }
            }
            CHECK(worst < 1e-5, "%s of %d tokens %s%s%s: rel err %.3g", names[op], (int)n, tn, idot ? " (int8 x)" : "",
                  how, worst);
            CHECK(differ == 0, "%s of %d tokens %s%s%s: %d tokens' rows differ from the one-token op's", names[op], (int)n,
                  tn, idot ? " (int8 x)" : "", how, differ);
            printf("  %s of %d tokens %s%s%s: %.2g, rows as one token's\n", names[op], (int)n, tn,
                   idot ? " (int8 x)" : "", how, worst);
        }
        for (int i = 0; i < 3; i++) moex_vk_buffer_free(mb[i]), free_matrix(&m[i]);
    }
    moex_vk_buffer *all[] = {xb, wb, yb, y1, rb};
    for (int i = 0; i < 5; i++) moex_vk_buffer_free(all[i]);
    free(x), free(nw), free(res), free(got), free(one), free(xw), free(xr), free(ref);
    moex_vk_testing_set_idot(vk, 0);
    if (wg_was >= 0) moex_vk_testing_set_mv_batch_wg(vk, wg_was);
}

/* float64 RMSNorm (weight w) then RoPE of one head, as moex_rmsnorm + moex_rope do in f32. */
static void norm_rope_ref(float *hv, const float *w, int hd, int rope_dim, int64_t pos, float base, bool neox, float eps,
                          bool norm) {
    if (norm) moex_rmsnorm(hv, hv, w, hd, eps);
    moex_rope(hv, 1, hd, rope_dim, pos, base, neox);
}

/* The fused decode attention step (QK-norm + RoPE + KV append + split-K
 * attention + merge in one dispatch) against the CPU (moex_rmsnorm,
 * moex_rope, moex_attention) and against the unfused GPU ops, over two
 * consecutive tokens (the second reads the first's appended row and finds
 * the counters back at zero, and, in a context of over 16 splits, runs as
 * an indirect dispatch of only the splits its position needs), positions at
 * split edges, GQA groups of 1 to 32, head_dim 64 to 256, caches of 2048,
 * 4000 and 8192 positions. */
static void test_attention_decode(void) {
    struct { int hd, rope, neox, qkn, H, HK; int64_t pos, ctx; } cases[] = {
        {128, 128, 1, 1, 8, 2, 0, 200},    {128, 128, 1, 1, 8, 2, 63, 200},  {64, 48, 0, 0, 8, 2, 299, 600},
        {128, 128, 1, 1, 8, 2, 517, 1000}, {128, 128, 1, 1, 16, 2, 511, 600}, {96, 64, 1, 1, 6, 2, 40, 100},
        {256, 256, 0, 1, 4, 4, 31, 64},    {128, 128, 1, 1, 32, 1, 100, 300}, {128, 128, 1, 1, 16, 2, 2999, 4000},
        {128, 128, 1, 1, 8, 2, 130, 8192},    /* a long context, a short position: 3 splits of 44 run */
        {128, 128, 1, 1, 8, 2, 1998, 2048},   /* 42 splits of 48 wanted, the context's 32 of 64 run */
        {256, 256, 1, 1, 4, 2, 2300, 2400}};  /* head_dim 256 over 36 splits (the merge: 18 a thread) */
    for (int ci = 0; ci < (int)(sizeof cases / sizeof cases[0]); ci++) {
        const int hd = cases[ci].hd, H = cases[ci].H, HK = cases[ci].HK;
        moex_vk_attn_shape sh = {.n_head = H, .n_head_kv = HK, .head_dim = hd, .rope_dim = cases[ci].rope,
                                 .rope_base = 1e6f, .rms_eps = 1e-6f, .scale = 1.0f / sqrtf((float)hd),
                                 .neox = cases[ci].neox, .qk_norm = cases[ci].qkn, .n_ctx = cases[ci].ctx};
        const int64_t qd = H * hd, kvd = HK * hd, ctx = sh.n_ctx, pos0 = cases[ci].pos;
        float *q = malloc(2 * qd * 4), *k = malloc(2 * kvd * 4), *v = malloc(2 * kvd * 4), *qn = malloc(hd * 4),
              *kn = malloc(hd * 4), *kc = malloc(ctx * kvd * 4), *vc = malloc(ctx * kvd * 4), *ref = malloc(qd * 4),
              *got = malloc(qd * 4), *got2 = malloc(qd * 4), *gkc = malloc(ctx * kvd * 4), *gvc = malloc(ctx * kvd * 4);
        fill_gauss(&R, q, 2 * qd, 1.0f);
        fill_gauss(&R, k, 2 * kvd, 1.0f);
        fill_gauss(&R, v, 2 * kvd, 1.0f);
        fill_gauss(&R, qn, hd, 1.0f);
        fill_gauss(&R, kn, hd, 1.0f);
        fill_gauss(&R, kc, ctx * kvd, 1.0f);   /* rows past the position hold garbage the kernel must not read */
        fill_gauss(&R, vc, ctx * kvd, 1.0f);
        moex_vk_buffer *kcb = gpu_from(vk, kc, ctx * kvd * 4), *vcb = gpu_from(vk, vc, ctx * kvd * 4),
                       *kcb2 = gpu_from(vk, kc, ctx * kvd * 4), *vcb2 = gpu_from(vk, vc, ctx * kvd * 4),
                       *qnb = gpu_from(vk, qn, hd * 4), *knb = gpu_from(vk, kn, hd * 4),
                       *sb = gpu_from(vk, NULL, moex_vk_attention_scratch(&sh, 1) * 4), *cb = gpu_from(vk, NULL, H * 4),
                       *ob = gpu_from(vk, NULL, qd * 4);
        for (int tok = 0; tok < 2; tok++) {
            const int64_t pos = pos0 + tok;
            if (pos >= ctx) break;
            int32_t params = (int32_t)pos;
            moex_vk_buffer *qb = gpu_from(vk, q + tok * qd, qd * 4), *kb = gpu_from(vk, k + tok * kvd, kvd * 4),
                           *vb = gpu_from(vk, v + tok * kvd, kvd * 4), *qb2 = gpu_from(vk, q + tok * qd, qd * 4),
                           *pb = gpu_from(vk, &params, 4);
            /* the second token runs only the splits up to its position (an indirect dispatch) */
            uint32_t grid[3];
            moex_vk_attention_decode_grid(&sh, pos, grid);
            /* splits of 64 over the context; indirect (over 16 of them) splits of 48 up to the position */
            const int64_t ns = (ctx + 63) / 64 < 64 ? (ctx + 63) / 64 : 64,
                          want = (pos + 48) / 48 < 64 ? (pos + 48) / 48 : 64;
            const bool indirect = tok == 1 && ns > 16;
            CHECK(grid[0] == (uint32_t)H && grid[1] == 1 && grid[2] == (uint32_t)(want < ns ? want : ns),
                  "decode grid at pos %lld of %lld: %u x %u x %u", (long long)pos, (long long)ctx, grid[0], grid[1],
                  grid[2]);
            moex_vk_buffer *gridb = moex_vk_buffer_create(vk, 64, MOEX_VK_MEM_HOST, &g_err);
            MUST(!gridb);
            memcpy((char *)moex_vk_buffer_map(gridb) + 16, grid, sizeof grid);
            moex_vk_cmd *c = cmd_begin(vk);
            MUST(moex_vk_op_attention_decode(c, &sh, P(qb), P(kb), P(vb), P(kcb), P(vcb), P(qnb), P(knb), P(sb), P(cb),
                                             P(pb), tok == 1 ? gridb : NULL, 16, &g_err));
            /* the unfused ops on their own caches */
            MUST(moex_vk_op_qk_rope(c, &sh, P(qb2), P(kb), P(vb), P(kcb2), P(vcb2), P(qnb), P(knb), P(pb), 1, &g_err));
            moex_vk_barrier(c);
            MUST(moex_vk_op_attention(c, &sh, P(qb2), P(kcb2), P(vcb2), P(ob), P(sb), P(pb), 1, &g_err));
            cmd_run_free(c);
            /* CPU: the same steps in f32 */
            float *qt = q + tok * qd, *kt = k + tok * kvd;
            for (int h = 0; h < H; h++)
                norm_rope_ref(qt + h * hd, qn, hd, sh.rope_dim, pos, sh.rope_base, sh.neox, sh.rms_eps, sh.qk_norm);
            for (int h = 0; h < HK; h++)
                norm_rope_ref(kt + h * hd, kn, hd, sh.rope_dim, pos, sh.rope_base, sh.neox, sh.rms_eps, sh.qk_norm);
            memcpy(kc + pos * kvd, kt, kvd * 4);
            memcpy(vc + pos * kvd, v + tok * kvd, kvd * 4);
            MUST(moex_attention(NULL, qt, kc, vc, ref, 1, pos, H, HK, hd, sh.scale, NULL));
            gpu_read(vk, qb, got, qd * 4);
            gpu_read(vk, ob, got2, qd * 4);
            gpu_read(vk, kcb, gkc, ctx * kvd * 4);
            gpu_read(vk, vcb, gvc, ctx * kvd * 4);
            const double e = rel_l2_f(got, ref, qd), e2 = rel_l2_f(got, got2, qd),
                         ek = rel_l2_f(gkc + pos * kvd, kc + pos * kvd, kvd);
            /* vs the CPU: f32 RoPE angles of up to pos radians round differently (~pos * 6e-8);
             * vs the unfused GPU ops: the same arithmetic */
            const double tol = 1e-5 + 1e-7 * (double)pos;
            CHECK(e < tol && e2 < 1e-6, "decode attention hd %d pos %lld: err %.3g vs cpu, %.3g vs unfused", hd,
                  (long long)pos, e, e2);
            CHECK(ek < tol, "decode attention pos %lld: appended k err %.3g", (long long)pos, ek);
            CHECK(!memcmp(gvc, vc, ctx * kvd * 4), "decode attention pos %lld: v cache differs (append or stray write)",
                  (long long)pos);
            int stray = 0;   /* k rows other than those appended here are untouched */
            for (int64_t i = 0; i < ctx * kvd; i++) stray += (i / kvd < pos0 || i / kvd > pos) && gkc[i] != kc[i];
            CHECK(stray == 0, "decode attention pos %lld: %d k cache values changed outside the new row",
                  (long long)pos, stray);
            uint32_t cnt[64];
            gpu_read(vk, cb, cnt, H * 4);
            int nz = 0;
            for (int h = 0; h < H; h++) nz += cnt[h] != 0;
            CHECK(nz == 0, "decode attention: %d counters left non-zero", nz);
            printf("  decode attention hd=%d rope=%d neox=%d qk_norm=%d heads %d/%d pos=%lld ctx=%lld splits %u%s: %.2g "
                   "(unfused %.2g, k %.2g)\n", hd, sh.rope_dim, sh.neox, sh.qk_norm, H, HK, (long long)pos, (long long)ctx,
                   indirect ? grid[2] : (unsigned)ns, indirect ? " (indirect)" : "", e, e2, ek);
            moex_vk_buffer *tmp[] = {qb, kb, vb, qb2, pb, gridb};
            for (int i = 0; i < 6; i++) moex_vk_buffer_free(tmp[i]);
        }
        moex_vk_buffer *all[] = {kcb, vcb, kcb2, vcb2, qnb, knb, sb, cb, ob};
        for (int i = 0; i < 9; i++) moex_vk_buffer_free(all[i]);
        free(q), free(k), free(v), free(qn), free(kn), free(kc), free(vc), free(ref), free(got), free(got2), free(gkc),
            free(gvc);
    }
}

/* The decode head with the argmax fused (and the norm fused or not): logits
 * against float64, the index against the float64 argmax, a tie between two
 * identical rows in different blocks going to the lower, and the sync words
 * left at zero for the next run (two runs in one command buffer). */
static void test_head_argmax(void) {
    const moex_type types[] = {MOEX_TYPE_Q6_K, MOEX_TYPE_Q4_K, MOEX_TYPE_Q8_0, MOEX_TYPE_F16};
    const int64_t d = 256, rows = 20000;   /* over 2048 workgroups x 8 rows: workgroups loop over row blocks */
    const float eps = 1e-6f;
    for (int ti = 0; ti < 4; ti++) {
        const bool norm = ti % 2 == 0;
        test_matrix m = make_matrix(&R, types[ti], rows, d);
        float *x = malloc(d * 4), *nw = malloc(d * 4), *y = malloc(rows * 4);
        double *xn = malloc(d * 8), *lg = malloc(rows * 8);
        fill_gauss(&R, x, d, 2.0f);
        fill_gauss(&R, nw, d, 1.0f);
        if (norm) norm_ref(xn, x, nw, d, eps);
        else
            for (int64_t j = 0; j < d; j++) xn[j] = x[j];
        int64_t best = 0;
        for (int64_t r = 0; r < rows; r++) {
            lg[r] = 0;
            for (int64_t j = 0; j < d; j++) lg[r] += (double)m.deq[r * d + j] * xn[j];
            if (lg[r] > lg[best]) best = r;
        }
        /* a copy of the best row elsewhere (16384 rows away: the same workgroup's other
         * block; 3000: another workgroup): ties go to the lower index */
        const int64_t dist = best >= 16384 || best + 16384 < rows ? 16384 : 3000,
                      twin = ti < 2 ? (best >= dist ? best - dist : best + dist) : -1;
        if (twin >= 0) {
            memcpy(m.data + twin * m.row_bytes, m.data + best * m.row_bytes, m.row_bytes);
            lg[twin] = lg[best];
        }
        const int64_t want = twin >= 0 && twin < best ? twin : best;
        const size_t sync_bytes = moex_vk_argmax_sync_bytes(rows) + 64;
        moex_vk_buffer *mb = gpu_from(vk, m.data, rows * m.row_bytes), *xb = gpu_from(vk, x, d * 4),
                       *wb = gpu_from(vk, nw, d * 4), *yb = gpu_from(vk, NULL, rows * 4), *ob = gpu_from(vk, NULL, 8),
                       *sb = gpu_from(vk, NULL, sync_bytes);
        moex_vk_matrix vm = vk_matrix_of(&m, mb);
        moex_vk_cmd *c = cmd_begin(vk);
        for (int rep = 0; rep < 2; rep++) {
            MUST(moex_vk_op_matmul_argmax(c, &vm, P(xb), norm ? P(wb) : 0, eps, P(yb), P(ob) + 4 * rep, P(sb),
                                          sync_bytes, &g_err));
            moex_vk_barrier(c);
        }
        cmd_run_free(c);
        int32_t idx[2];
        gpu_read(vk, ob, idx, sizeof idx);
        gpu_read(vk, yb, y, rows * 4);
        const double e = rel_l2(y, lg, rows);
        CHECK(e < 1e-5, "head+argmax %s: logits rel err %.3g", moex_type_get(types[ti])->name, e);
        int64_t gbest = 0;   /* the argmax of what the GPU computed, ties to the lower index */
        for (int64_t r = 1; r < rows; r++)
            if (y[r] > y[gbest]) gbest = r;
        CHECK(idx[0] == gbest && idx[1] == gbest, "head+argmax %s: index %d/%d, the GPU logits say %lld",
              moex_type_get(types[ti])->name, idx[0], idx[1], (long long)gbest);
        CHECK(gbest == want, "head+argmax %s: argmax %lld, float64 says %lld", moex_type_get(types[ti])->name,
              (long long)gbest, (long long)want);
        uint32_t *sw = malloc(sync_bytes);
        gpu_read(vk, sb, sw, sync_bytes);
        int nz = 0;
        for (size_t i = 0; i < sync_bytes / 4; i++) nz += sw[i] != 0;
        CHECK(nz == 0, "head+argmax: %d sync words left non-zero", nz);
        printf("  head+argmax %s norm=%d: logits %.2g, index %d (tie twin %lld)\n", moex_type_get(types[ti])->name,
               norm, e, idx[0], (long long)twin);
        c = cmd_begin(vk);   /* too few sync words: refused */
        CHECK(moex_vk_op_matmul_argmax(c, &vm, P(xb), 0, eps, P(yb), P(ob), P(sb), 8, &g_err) == -1 &&
                  strstr(g_err.msg, "sync"), "head+argmax with 8 sync bytes must be refused");
        cmd_run_free(c);
        moex_vk_buffer *all[] = {mb, xb, wb, yb, ob, sb};
        for (int i = 0; i < 6; i++) moex_vk_buffer_free(all[i]);
        free_matrix(&m);
        free(x), free(nw), free(y), free(xn), free(lg), free(sw);
    }
}

/* A model's ops for a batch of n tokens: norm, a small and a tall product
 * (the tall one's tiles change from 32 to 64 tokens as n grows), the router,
 * the expert FFN and attention (the fused decode step for one token). */
typedef struct warm_model {
    moex_vk_matrix wq, wt, router;
    moex_vk_experts ex;
    moex_vk_attn_shape sh;
    moex_vk_buffer *w, *act;
} warm_model;

static void record_ops(moex_vk_cmd *c, const warm_model *m, int64_t n) {
    /* x, y (up to n x 4096 floats), q, the caches, scratch, then small words */
    const moex_vk_ptr a = P(m->act), x = a, y = a + (4 << 20), q = a + (12 << 20), kc = a + (14 << 20),
                      vc = a + (15 << 20), s = a + (16 << 20), sync = a + (28 << 20), ids = sync + 4096,
                      gw = ids + 65536, params = gw + 65536;
    MUST(moex_vk_cmd_begin(c, &g_err));
    MUST(moex_vk_op_rmsnorm(c, x, x, 0, n, 256, 1e-6f, &g_err));
    MUST(moex_vk_op_matmul(c, &m->wq, x, n, y, 0, &g_err));
    MUST(moex_vk_op_matmul(c, &m->wt, x, n, y, 0, &g_err));
    MUST(moex_vk_op_router(c, &m->router, x, n, 2, true, y, sync, ids, gw, &g_err));
    MUST(moex_vk_op_experts(c, &m->ex, x, n, 2, ids, gw, y, y, s, &g_err));
    if (n == 1)
        MUST(moex_vk_op_attention_decode(c, &m->sh, q, q + 8192, q + 16384, kc, vc, 0, 0, s, sync, params, NULL, 0,
                                         &g_err));
    else
        MUST(moex_vk_op_attention(c, &m->sh, q, kc, vc, y, s, params, n, &g_err));
    MUST(moex_vk_cmd_end(c, &g_err));
}

/* moex_vk_warm_begin / moex_vk_warm_end: recording the sizes of
 * moex_vk_warm_batch_sizes in between creates every pipeline that any batch
 * up to n_batch tokens then records (none is created later), and the
 * products then run right; the recordings in between hold no dispatches. On
 * the cooperative-matrix paths too (emulated where the device has none). */
/* The fence wait's default (docs/ARCHITECTURE.md "Settings"): 5 ms of polling
 * on a GPU, none on a CPU device, whose cores run the submit itself; spin_us
 * set wins, spin_us=0 blocks at once. */
static void test_spin_default(void) {
    const int want = strcmp(moex_vk_get_info(vk)->type, "cpu") ? 5000 : 0;
    CHECK(moex_vk_testing_spin_us(vk) == want, "default fence poll %d us on a %s device, want %d",
          moex_vk_testing_spin_us(vk), moex_vk_get_info(vk)->type, want);
    const int settings[][2] = {{300, 300}, {-1, 0}};   /* moex_vk_tuning.spin_us -> the wait's */
    for (int i = 0; i < 2; i++) {
        moex_vk_options o = test_vk_options();
        o.tune.spin_us = settings[i][0];
        moex_vk *d = moex_vk_create(&o, &g_err);
        MUST(!d);
        CHECK(moex_vk_testing_spin_us(d) == settings[i][1], "spin_us %d: the wait polls %d us, want %d",
              settings[i][0], moex_vk_testing_spin_us(d), settings[i][1]);
        moex_vk_free(d);
    }
    moex_error e;
    moex_vk_options o = {0};
    CHECK(moex_vk_options_tune(&o, "spin_us=0", &e) == 0 && o.tune.spin_us == -1, "--vk-tune spin_us=0 is not 'never'");
    CHECK(moex_vk_options_tune(&o, "spin_us=-3", &e) == -1, "--vk-tune spin_us=-3 accepted");
    printf("  fence poll: %d us by default on this %s device\n", want, moex_vk_get_info(vk)->type);
}

static void test_warm(bool no_subgroup) {
    moex_vk *d = test_vk_coop_mode(no_subgroup, MOEX_VK_COOP_EMULATE);
    const int64_t n_batch = 300, dim = 256, ff = 64, tall = 4096;
    test_matrix mq = make_matrix(&R, MOEX_TYPE_Q4_K, 96, dim), mt = make_matrix(&R, MOEX_TYPE_Q6_K, tall, dim);
    const size_t oq = 0, ot = oq + mq.rows * mq.row_bytes, orr = ot + mt.rows * mt.row_bytes, eg = orr + 8 * dim * 4,
                 egs = moex_row_bytes(MOEX_TYPE_Q4_K, dim) * ff, eds = moex_row_bytes(MOEX_TYPE_Q6_K, ff) * dim,
                 ed = eg + 2 * 8 * egs;
    warm_model m = {.w = gpu_from(d, NULL, ed + 8 * eds), .act = gpu_from(d, NULL, (size_t)32 << 20)};
    MUST(moex_vk_upload(d, m.w, oq, mq.data, mq.rows * mq.row_bytes, &g_err));
    m.wq = vk_matrix_of(&mq, m.w);
    m.wt = vk_matrix_of(&mt, m.w);
    m.wt.data += ot;
    m.router = (moex_vk_matrix){MOEX_TYPE_F32, 8, dim, dim * 4, P(m.w) + orr, 0};
    m.ex = (moex_vk_experts){.gate = {MOEX_TYPE_Q4_K, ff, dim, moex_row_bytes(MOEX_TYPE_Q4_K, dim), P(m.w) + eg, egs},
                             .up = {MOEX_TYPE_Q4_K, ff, dim, moex_row_bytes(MOEX_TYPE_Q4_K, dim), P(m.w) + eg + 8 * egs, egs},
                             .down = {MOEX_TYPE_Q6_K, dim, ff, moex_row_bytes(MOEX_TYPE_Q6_K, ff), P(m.w) + ed, eds},
                             .n_expert = 8};
    m.sh = (moex_vk_attn_shape){.n_head = 4, .n_head_kv = 2, .head_dim = 64, .rope_dim = 64, .rope_base = 1e4f,
                                .rms_eps = 1e-6f, .scale = 0.125f, .n_ctx = 512};
    CHECK(moex_vk_attention_scratch(&m.sh, n_batch) * 4 <= ((size_t)12 << 20) &&
              moex_vk_experts_scratch(&m.ex, n_batch, 2) <= ((size_t)12 << 20), "warm: scratch too small");

    int64_t sizes[8];
    const int ns = moex_vk_warm_batch_sizes(n_batch, sizes);
    CHECK(ns >= 2 && sizes[0] == 1 && sizes[ns - 1] == n_batch, "warm: batch sizes for %lld", (long long)n_batch);
    for (int i = 1; i < ns; i++) CHECK(sizes[i] > sizes[i - 1], "warm: batch sizes not increasing");
    int64_t one[8];
    CHECK(moex_vk_warm_batch_sizes(1, one) == 1 && one[0] == 1, "warm: batch sizes for one token");

    /* y's first row marked: the recording made while warming must not write it */
    float mark[256];
    for (int i = 0; i < 256; i++) mark[i] = 7.0f;
    MUST(moex_vk_upload(d, m.act, 4 << 20, mark, sizeof mark, &g_err));
    moex_vk_cmd *c = moex_vk_cmd_create(d, &g_err);
    MUST(!c);
    const int before = moex_vk_pipeline_count(d);
    moex_vk_warm_begin(d);
    for (int i = 0; i < ns; i++) record_ops(c, &m, sizes[i]);
    CHECK(moex_vk_pipeline_count(d) == before, "warm: pipelines created before moex_vk_warm_end");
    MUST(moex_vk_cmd_run(c, &g_err));   /* the last warm recording: barriers only */
    MUST(moex_vk_warm_end(d, &g_err));
    const int warmed = moex_vk_pipeline_count(d);
    float *got = malloc(n_batch * tall * 4);
    MUST(moex_vk_download(d, m.act, 4 << 20, got, sizeof mark, &g_err));
    CHECK(!memcmp(got, mark, sizeof mark), "warm: a recording made while warming wrote y");
    for (int64_t n = 1; n <= n_batch; n++) record_ops(c, &m, n);
    CHECK(moex_vk_pipeline_count(d) == warmed, "warm: %d pipelines up front, %d after recording every batch size",
          warmed, moex_vk_pipeline_count(d));
    printf("  warm: %d pipelines up front for batches of 1..%lld (%d sizes recorded)\n", warmed, (long long)n_batch, ns);

    /* the warmed pipelines compute: y = W x for 20 tokens on the tall product's 64-token coop tiles */
    const int64_t n = 20;
    float *x = malloc(n * dim * 4);
    double *ref = malloc(n * tall * 8);
    fill_gauss(&R, x, n * dim, 1.0f);
    MUST(moex_vk_upload(d, m.w, ot, mt.data, mt.rows * mt.row_bytes, &g_err));
    MUST(moex_vk_upload(d, m.act, 0, x, n * dim * 4, &g_err));
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = 0; r < tall; r++) {
            double acc = 0;
            for (int64_t k = 0; k < dim; k++) acc += (double)mt.deq[r * dim + k] * x[t * dim + k];
            ref[t * tall + r] = acc;
        }
    MUST(moex_vk_cmd_begin(c, &g_err));
    MUST(moex_vk_op_matmul(c, &m.wt, P(m.act), n, P(m.act) + (4 << 20), 0, &g_err));
    MUST(moex_vk_cmd_run(c, &g_err));
    MUST(moex_vk_download(d, m.act, 4 << 20, got, n * tall * 4, &g_err));
    const double e = rel_l2(got, ref, n * tall);
    CHECK(e < 3e-3, "warm: product after warming: rel err %.3g", e);   /* f16 inputs on the coop tiles */
    CHECK(moex_vk_pipeline_count(d) == warmed, "warm: the product created a pipeline");
    moex_vk_cmd_free(c);
    moex_vk_buffer_free(m.w);
    moex_vk_buffer_free(m.act);
    free_matrix(&mq), free_matrix(&mt);
    free(got), free(x), free(ref);
    moex_vk_free(d);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_vk_ops norm|rope|attention|router|experts|fused|decode [--no-subgroup]\n");
        return 2;
    }
    R = test_rng(argv[1]);
    /* The tiled expert products are held to f32 accuracy here; their f16
     * cooperative-matrix variant has its own test (test_vk_coop). */
    vk = test_vk_coop_mode(argc > 2 && !strcmp(argv[2], "--no-subgroup"), MOEX_VK_COOP_OFF);
    moex_vk_testing_set_idot(vk, 0);   /* f32 activations: the int8 ones are test_vk_matmul's and test_vk_experts_mv's */
    if (!strcmp(argv[1], "norm")) test_norm();
    else if (!strcmp(argv[1], "rope")) test_rope();
    else if (!strcmp(argv[1], "attention")) test_attention(), test_attention_prompt();
    else if (!strcmp(argv[1], "router")) test_router();
    else if (!strcmp(argv[1], "experts")) test_experts();
    else if (!strcmp(argv[1], "fused"))   /* the device's grid; 5 workgroups: one a token, looping over its row blocks */
        test_fused_norm(), test_batched_products(false, -1), test_batched_products(true, -1), test_batched_products(true, 5);
    else if (!strcmp(argv[1], "decode")) test_attention_decode(), test_head_argmax();
    else if (!strcmp(argv[1], "warm"))
        test_warm(argc > 2 && !strcmp(argv[2], "--no-subgroup")), test_spin_default();
    else {
        fprintf(stderr, "unknown subtest %s\n", argv[1]);
        return 2;
    }
    moex_vk_free(vk);
    return test_finish(argv[1]);
}
