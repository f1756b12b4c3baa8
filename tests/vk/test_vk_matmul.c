/* Matrix products on the GPU for every weight type, against a float64
 * reference on the exactly dequantized weights: the matrix-vector kernel
 * (1..8 tokens, with and without the residual add; subgroup and
 * shared-memory reductions; weights 16-byte aligned or not) and the tiled
 * kernel (ragged tiles); one token's Q4_K and Q6_K products with x staged as int8
 * (where the device has integer dot products), against float64 on x
 * rounded exactly as the GPU rounds it; then with activation rounding, against
 * the CPU backend (inputs without rounding ties) and the reference quantizer (ties). */
#include "tests/vk/vk_test_util.h"
#include "kernels/vk/vk_testing.h"   /* VK_MV_XMAX, VK_MV_PERSIST: the staged kernel's edges; int8 activations */

/* Whether one token's product on m stages x as int8 (mv.comp modes 1 and 2 on Q4_K and Q6_K, int8 activations on). */
static bool staged_i8(moex_vk *vk, const test_matrix *m, int64_t n) {
    return n == 1 && (m->type == MOEX_TYPE_Q4_K || m->type == MOEX_TYPE_Q6_K) && m->cols <= VK_MV_XMAX &&
           moex_vk_testing_idot(vk);
}

/* The reference row dots of m with one token's staged x (xs: x, or x * nw in f32 as the kernel stages it), each
 * times scale: f32 staging exactly, int8 staging rounded as the GPU rounds it (32 values a group). */
static void ref_rows(moex_vk *vk, const test_matrix *m, const float *xs, double scale, double *out) {
    const int64_t cols = m->cols;
    float *xr = malloc((size_t)cols * 4), *mins = NULL;
    memcpy(xr, xs, (size_t)cols * 4);
    const bool i8 = staged_i8(vk, m, 1);
    if (i8) {
        int64_t idx[32];
        for (int64_t g = 0; g < cols; g += 32) {
            for (int i = 0; i < 32; i++) idx[i] = g + i;
            i8_round(xs, idx, 32, xr);
        }
        if (m->type == MOEX_TYPE_Q4_K) mins = q4k_mins(m);
    }
    for (int64_t o = 0; o < m->rows; o++) out[o] = scale * i8_dot(m, mins, o, xs, i8 ? xr : xs);
    free(xr), free(mins);
}

static double check_product(moex_vk *vk, rng *r, moex_type t, int64_t rows, int64_t cols, int64_t n, bool resid) {
    test_matrix m = make_matrix(r, t, rows, cols);
    float *x = malloc((size_t)(n * cols) * 4), *res = malloc((size_t)(n * rows) * 4), *y = malloc((size_t)(n * rows) * 4);
    double *ref = malloc((size_t)(n * rows) * 8);
    fill_gauss(r, x, (size_t)(n * cols), 1.0f);
    fill_gauss(r, res, (size_t)(n * rows), 1.0f);
    for (int64_t tk = 0; tk < n; tk++) {
        ref_rows(vk, &m, x + tk * cols, 1.0, ref + tk * rows);
        for (int64_t i = 0; i < rows && resid; i++) ref[tk * rows + i] += res[tk * rows + i];
    }
    moex_vk_buffer *wb = gpu_from(vk, m.data, (size_t)rows * m.row_bytes), *xb = gpu_from(vk, x, (size_t)(n * cols) * 4),
                   *rb = gpu_from(vk, res, (size_t)(n * rows) * 4), *yb = gpu_from(vk, NULL, (size_t)(n * rows) * 4);
    moex_vk_matrix vm = vk_matrix_of(&m, wb);
    moex_vk_cmd *c = moex_vk_cmd_create(vk, &g_err);
    MUST(!c);
    MUST(moex_vk_cmd_begin(c, &g_err));
    MUST(moex_vk_op_matmul(c, &vm, moex_vk_buffer_ptr(xb), n, moex_vk_buffer_ptr(yb), resid ? moex_vk_buffer_ptr(rb) : 0,
                           &g_err));
    MUST(moex_vk_cmd_run(c, &g_err));
    gpu_read(vk, yb, y, (size_t)(n * rows) * 4);
    double e = rel_l2(y, ref, (size_t)(n * rows));
    moex_vk_cmd_free(c);
    moex_vk_buffer_free(wb);
    moex_vk_buffer_free(xb);
    moex_vk_buffer_free(rb);
    moex_vk_buffer_free(yb);
    free(x);
    free(res);
    free(y);
    free(ref);
    free_matrix(&m);
    return e;
}

/* One decode token's products sharing x (q, k, v): the matrices of one type
 * in one dispatch, the odd type in its own, x staged once per workgroup;
 * with the RMSNorm fused (nw) or not. Against float64. */
static double check_multi(moex_vk *vk, rng *r, const moex_type *types, const int64_t *rows, int64_t cols, bool norm) {
    const float eps = 1e-6f;
    float *x = malloc((size_t)cols * 4), *nw = malloc((size_t)cols * 4), *xs = malloc((size_t)cols * 4);
    double ss = 0;
    fill_gauss(r, x, (size_t)cols, 3.0f);
    fill_gauss(r, nw, (size_t)cols, 1.0f);
    for (int64_t j = 0; j < cols; j++) ss += (double)x[j] * x[j];
    for (int64_t j = 0; j < cols; j++) xs[j] = norm ? x[j] * nw[j] : x[j];   /* staged as the kernel does, in f32 */
    const double inv = norm ? 1 / sqrt(ss / (double)cols + eps) : 1;
    moex_vk_buffer *xb = gpu_from(vk, x, (size_t)cols * 4), *nb = gpu_from(vk, nw, (size_t)cols * 4), *wb[3], *yb[3];
    test_matrix m[3];
    moex_vk_matrix vm[3];
    const moex_vk_matrix *wp[3];
    moex_vk_ptr yp[3];
    for (int i = 0; i < 3; i++) {
        m[i] = make_matrix(r, types[i], rows[i], cols);
        wb[i] = gpu_from(vk, m[i].data, (size_t)rows[i] * m[i].row_bytes);
        yb[i] = gpu_from(vk, NULL, (size_t)rows[i] * 4);
        vm[i] = vk_matrix_of(&m[i], wb[i]);
        wp[i] = &vm[i];
        yp[i] = moex_vk_buffer_ptr(yb[i]);
    }
    moex_vk_cmd *c = moex_vk_cmd_create(vk, &g_err);
    MUST(!c);
    MUST(moex_vk_cmd_begin(c, &g_err));
    MUST(moex_vk_op_norm_matmul_multi(c, 3, wp, yp, moex_vk_buffer_ptr(xb), norm ? moex_vk_buffer_ptr(nb) : 0, eps,
                                      &g_err));
    MUST(moex_vk_cmd_run(c, &g_err));
    double worst = 0;
    for (int i = 0; i < 3; i++) {
        float *y = malloc((size_t)rows[i] * 4);
        double *ref = malloc((size_t)rows[i] * 8);
        gpu_read(vk, yb[i], y, (size_t)rows[i] * 4);
        ref_rows(vk, &m[i], xs, inv, ref);
        const double e = rel_l2(y, ref, (size_t)rows[i]);
        worst = e > worst ? e : worst;
        free(y), free(ref);
        moex_vk_buffer_free(wb[i]), moex_vk_buffer_free(yb[i]);
        free_matrix(&m[i]);
    }
    moex_vk_cmd_free(c);
    moex_vk_buffer_free(xb), moex_vk_buffer_free(nb);
    free(x), free(nw), free(xs);
    return worst;
}

/* The 32-element partners (Q8_0, Q8_1) round x * (127 / amax) to an integer;
 * at an exact tie the CPU's SIMD path rounds to even where the reference
 * quantizer (and the GPU) round away from zero: a legitimate one-step
 * difference that moves a whole output row by ~1e-3. Nudges x until no
 * element of any 32-block is a tie, so the comparison stays tight. Returns
 * the number of elements nudged. */
static int remove_q8_ties(float *x, int64_t n) {
    int nudged = 0;
    for (int64_t b = 0; b < n; b += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fabsf(x[b + j]) > amax ? fabsf(x[b + j]) : amax;
        const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) {
            if (fabsf(x[b + j]) == amax) continue;   /* the extreme maps to +-127: never a tie */
            for (float p = x[b + j] * id; fabsf(p - truncf(p)) == 0.5f; p = x[b + j] * id) {
                x[b + j] = nextafterf(x[b + j], 0.0f);
                nudged++;
            }
        }
    }
    return nudged;
}

static bool q8_partner(moex_type t) {
    return t == MOEX_TYPE_Q4_0 || t == MOEX_TYPE_Q4_1 || t == MOEX_TYPE_Q5_0 || t == MOEX_TYPE_Q5_1 || t == MOEX_TYPE_Q8_0;
}

/* With activation rounding on, the GPU must track the CPU backend's quantized products closely. */
static double check_vs_cpu(moex_vk *vk, rng *r, moex_type t, int64_t rows, int64_t cols, int64_t n) {
    test_matrix m = make_matrix(r, t, rows, cols);
    float *x = malloc((size_t)(n * cols) * 4), *y = malloc((size_t)(n * rows) * 4), *ref = malloc((size_t)(n * rows) * 4);
    fill_gauss(r, x, (size_t)(n * cols), 1.0f);
    if (q8_partner(t)) remove_q8_ties(x, n * cols);
    moex_matrix cm = {.type = t, .rows = rows, .cols = cols, .row_bytes = m.row_bytes, .data = m.data};
    MUST(moex_matmul(NULL, &cm, x, n, ref, NULL));
    moex_vk_buffer *wb = gpu_from(vk, m.data, (size_t)rows * m.row_bytes), *xb = gpu_from(vk, x, (size_t)(n * cols) * 4),
                   *yb = gpu_from(vk, NULL, (size_t)(n * rows) * 4);
    moex_vk_matrix vm = vk_matrix_of(&m, wb);
    moex_vk_cmd *c = moex_vk_cmd_create(vk, &g_err);
    MUST(!c);
    MUST(moex_vk_cmd_begin(c, &g_err));
    MUST(moex_vk_op_matmul(c, &vm, moex_vk_buffer_ptr(xb), n, moex_vk_buffer_ptr(yb), 0, &g_err));
    MUST(moex_vk_cmd_run(c, &g_err));
    gpu_read(vk, yb, y, (size_t)(n * rows) * 4);
    const double e = rel_l2_f(y, ref, (size_t)(n * rows));
    moex_vk_cmd_free(c);
    moex_vk_buffer_free(wb), moex_vk_buffer_free(xb), moex_vk_buffer_free(yb);
    free(x), free(y), free(ref);
    free_matrix(&m);
    return e;
}

/* Exact ties and near-ties of the Q8_0 rounding: the GPU must round as the
 * reference quantizer does (roundf: half away from zero), in every block. */
static void check_rounding_ties(moex_vk *vk, rng *r) {
    enum { ROWS = 16, COLS = 64 };
    test_matrix m = make_matrix(r, MOEX_TYPE_Q4_0, ROWS, COLS);
    float x[COLS], xq[COLS], y[ROWS];
    /* amax 127 gives d = 1 exactly: x * id is x, so these (+-2) are ties and near-ties of the rounding */
    const float ties[] = {0.5f, -0.5f, 2.5f, -3.5f, 100.5f, -99.5f, 0.49999997f, -0.49999997f, 1.5f, 64.5f};
    for (int j = 0; j < COLS; j++) x[j] = j % 32 == 0 ? 127.0f : ties[j % 10] + (float)((j / 10) % 3 - 1) * 2.0f;
    x[40] = -127.0f;   /* the second block's extreme is negative */
    moex_block_q8_0 q[COLS / 32];
    MUST(moex_quantize_row(MOEX_TYPE_Q8_0, x, q, COLS, NULL));
    MUST(moex_dequantize_row(MOEX_TYPE_Q8_0, q, xq, COLS, NULL));
    double ref[ROWS];
    for (int i = 0; i < ROWS; i++) {
        ref[i] = 0;
        for (int j = 0; j < COLS; j++) ref[i] += (double)m.deq[i * COLS + j] * xq[j];
    }
    moex_vk_buffer *wb = gpu_from(vk, m.data, ROWS * m.row_bytes), *xb = gpu_from(vk, x, sizeof x),
                   *yb = gpu_from(vk, NULL, sizeof y);
    moex_vk_matrix vm = vk_matrix_of(&m, wb);
    moex_vk_cmd *c = moex_vk_cmd_create(vk, &g_err);
    MUST(!c);
    MUST(moex_vk_cmd_begin(c, &g_err));
    MUST(moex_vk_op_matmul(c, &vm, moex_vk_buffer_ptr(xb), 1, moex_vk_buffer_ptr(yb), 0, &g_err));
    MUST(moex_vk_cmd_run(c, &g_err));
    gpu_read(vk, yb, y, sizeof y);
    const double e = rel_l2(y, ref, ROWS);
    /* one element a step off moves the result by ~1e-3 */
    CHECK(e < 1e-5, "q8_0 rounding of exact ties differs from the reference quantizer: rel err %.3g", e);
    printf("  q8_0 rounding ties like the reference quantizer: %.2g\n", e);
    moex_vk_cmd_free(c);
    moex_vk_buffer_free(wb), moex_vk_buffer_free(xb), moex_vk_buffer_free(yb);
    free_matrix(&m);
}

/* Weights at an offset that is 4- but not 16-byte aligned take the 8-element kernel variant. */
static void check_unaligned(moex_vk *vk, rng *r, moex_type t) {
    enum { ROWS = 9, COLS = 512 };
    test_matrix m = make_matrix(r, t, ROWS, COLS);
    float x[COLS], y[ROWS];
    double ref[ROWS];
    fill_gauss(r, x, COLS, 1.0f);
    for (int i = 0; i < ROWS; i++) {
        ref[i] = 0;
        for (int j = 0; j < COLS; j++) ref[i] += (double)m.deq[i * COLS + j] * x[j];
    }
    const size_t bytes = ROWS * m.row_bytes;
    uint8_t *padded = calloc(1, bytes + 4);
    memcpy(padded + 4, m.data, bytes);
    moex_vk_buffer *wb = gpu_from(vk, padded, bytes + 4), *xb = gpu_from(vk, x, sizeof x), *yb = gpu_from(vk, NULL, sizeof y);
    moex_vk_matrix vm = vk_matrix_of(&m, wb);
    vm.data += 4;
    moex_vk_cmd *c = moex_vk_cmd_create(vk, &g_err);
    MUST(!c);
    MUST(moex_vk_cmd_begin(c, &g_err));
    MUST(moex_vk_op_matmul(c, &vm, moex_vk_buffer_ptr(xb), 1, moex_vk_buffer_ptr(yb), 0, &g_err));
    MUST(moex_vk_cmd_run(c, &g_err));
    gpu_read(vk, yb, y, sizeof y);
    const double e = rel_l2(y, ref, ROWS);
    CHECK(e < 2e-6, "%s weights at a 4-byte offset: rel err %.3g", moex_type_get(t)->name, e);
    printf("  %-5s weights at a 4-byte offset: %.2g\n", moex_type_get(t)->name, e);
    moex_vk_cmd_free(c);
    moex_vk_buffer_free(wb), moex_vk_buffer_free(xb), moex_vk_buffer_free(yb);
    free(padded);
    free_matrix(&m);
}

/* MXFP4 has CPU kernels only (so far): a product with it is refused with
 * an error that names the type, before anything is recorded. */
static void check_refuses_mxfp4(moex_vk *vk) {
    CHECK(!moex_vk_type_supported(MOEX_TYPE_MXFP4), "vulkan claims to read mxfp4");
    moex_vk_buffer *b = gpu_from(vk, NULL, 4096);
    const moex_vk_matrix vm = {.type = MOEX_TYPE_MXFP4, .rows = 4, .cols = 64,
                               .row_bytes = moex_row_bytes(MOEX_TYPE_MXFP4, 64), .data = moex_vk_buffer_ptr(b)};
    moex_vk_cmd *c = moex_vk_cmd_create(vk, &g_err);
    MUST(!c);
    MUST(moex_vk_cmd_begin(c, &g_err));
    moex_error e = {{0}};
    const int rc = moex_vk_op_matmul(c, &vm, moex_vk_buffer_ptr(b), 1, moex_vk_buffer_ptr(b) + 2048, 0, &e);
    CHECK(rc == -1 && strstr(e.msg, "no GPU kernels for tensor type mxfp4"), "mxfp4 matmul: rc %d, '%s'", rc, e.msg);
    moex_vk_cmd_free(c);
    moex_vk_buffer_free(b);
}

int main(int argc, char **argv) {
    const bool no_subgroup = argc > 1 && !strcmp(argv[1], "--no-subgroup");
    rng r = test_rng("test_vk_matmul");
    /* The f32 tiles (mm.comp) at f32 precision on every device; test_vk_coop covers the f16 tensor-core tiles. */
    moex_vk *vk = test_vk_coop_mode(no_subgroup, MOEX_VK_COOP_OFF);
    moex_vk_testing_set_idot(vk, 0);   /* f32 activations; the int8 staging of Q4_K: below */
    check_refuses_mxfp4(vk);
    for (int i = 0; i < N_ALL_TYPES; i++) {
        const moex_type t = k_all_types[i];
        const double e1 = check_product(vk, &r, t, 37, 512, 1, false);
        const double e3 = check_product(vk, &r, t, 64, 768, 3, true);
        const double e8 = check_product(vk, &r, t, 5, 256, 8, false);
        const double em = no_subgroup ? 0 : check_product(vk, &r, t, 100, 256, 70, true);
        printf("  %-5s mv n=1 %.2g  n=3+res %.2g  n=8 %.2g  mm n=70+res %.2g\n", moex_type_get(t)->name, e1, e3, e8, em);
        CHECK(e1 < 2e-6 && e3 < 2e-6 && e8 < 2e-6 && em < 2e-6, "%s: relative L2 error too large", moex_type_get(t)->name);
    }
    for (int i = 0; i < N_ALL_TYPES; i++) check_unaligned(vk, &r, k_all_types[i]);
    {   /* one token: x wider than the shared-memory stage (mode 0), exactly as wide, and
         * more row blocks than staged workgroups (each loops over several) */
        const double ew = check_product(vk, &r, MOEX_TYPE_Q4_K, 19, VK_MV_XMAX + 512, 1, true),
                     ex = check_product(vk, &r, MOEX_TYPE_Q6_K, 21, VK_MV_XMAX, 1, true),
                     el = check_product(vk, &r, MOEX_TYPE_Q8_0, VK_MV_PERSIST * 4 * 8 + 77, 64, 1, false);
        printf("  one token: x past the stage %.2g, x as wide as the stage %.2g, %d rows %.2g\n", ew, ex,
               VK_MV_PERSIST * 4 * 8 + 77, el);
        CHECK(ew < 2e-6 && ex < 2e-6 && el < 2e-6, "one-token products: relative L2 error too large");
    }
    {   /* q, k, v sharing x: one type (one dispatch), an odd v (two), norm fused or not */
        const moex_type all_q4[3] = {MOEX_TYPE_Q4_K, MOEX_TYPE_Q4_K, MOEX_TYPE_Q4_K},
                        v_q6[3] = {MOEX_TYPE_Q4_K, MOEX_TYPE_Q4_K, MOEX_TYPE_Q6_K},
                        mixed[3] = {MOEX_TYPE_Q8_0, MOEX_TYPE_F32, MOEX_TYPE_Q8_0};
        const int64_t rows[3] = {133, 35, 19}, wide[3] = {40, 8, 9};
        const double e1 = check_multi(vk, &r, all_q4, rows, 768, true), e2 = check_multi(vk, &r, v_q6, rows, 512, true),
                     e3 = check_multi(vk, &r, mixed, rows, 256, false),
                     e4 = check_multi(vk, &r, v_q6, wide, VK_MV_XMAX + 256, true);
        printf("  q,k,v shared x: q4_K x3 + norm %.2g, q4_K x2 + q6_K + norm %.2g, q8_0/f32/q8_0 %.2g, past the stage %.2g\n",
               e1, e2, e3, e4);
        CHECK(e1 < 2e-6 && e2 < 2e-6 && e3 < 2e-6 && e4 < 2e-6, "shared-x products: relative L2 error too large");
    }
    if (moex_vk_get_info(vk)->int_dot) {   /* one token's Q4_K and Q6_K products on int8 x, where the device can */
        moex_vk_testing_set_idot(vk, 1);
        const moex_type all_q4[3] = {MOEX_TYPE_Q4_K, MOEX_TYPE_Q4_K, MOEX_TYPE_Q4_K},
                        v_q6[3] = {MOEX_TYPE_Q4_K, MOEX_TYPE_Q4_K, MOEX_TYPE_Q6_K},
                        all_q6[3] = {MOEX_TYPE_Q6_K, MOEX_TYPE_Q6_K, MOEX_TYPE_Q6_K};
        const int64_t rows[3] = {133, 35, 19};
        const double e1 = check_product(vk, &r, MOEX_TYPE_Q4_K, 37, 512, 1, true),
                     e2 = check_product(vk, &r, MOEX_TYPE_Q4_K, 21, VK_MV_XMAX, 1, false),
                     e3 = check_multi(vk, &r, all_q4, rows, 768, true), e4 = check_multi(vk, &r, v_q6, rows, 2048, true),
                     e5 = check_multi(vk, &r, all_q4, rows, 256, false);
        printf("  q4_K staged as int8: n=1+res %.2g, as wide as the stage %.2g, q,k,v + norm %.2g, with a q6_K v %.2g, "
               "no norm %.2g\n", e1, e2, e3, e4, e5);
        CHECK(e1 < 2e-6 && e2 < 2e-6 && e3 < 2e-6 && e4 < 2e-6 && e5 < 2e-6, "int8-staged products: relative L2 error too large");
        const double f1 = check_product(vk, &r, MOEX_TYPE_Q6_K, 37, 512, 1, true),
                     f2 = check_product(vk, &r, MOEX_TYPE_Q6_K, 21, VK_MV_XMAX, 1, false),
                     f3 = check_multi(vk, &r, all_q6, rows, 768, true), f4 = check_multi(vk, &r, all_q6, rows, 256, false);
        printf("  q6_K staged as int8: n=1+res %.2g, as wide as the stage %.2g, q,k,v + norm %.2g, no norm %.2g\n", f1, f2,
               f3, f4);
        CHECK(f1 < 2e-6 && f2 < 2e-6 && f3 < 2e-6 && f4 < 2e-6, "int8-staged q6_K products: relative L2 error too large");
        moex_vk_testing_set_idot(vk, 0);
    }
    MUST(moex_vk_set_activation_rounding(vk, 70 * 512, &g_err));
    check_rounding_ties(vk, &r);
    for (int i = 0; i < N_ALL_TYPES; i++) {
        const moex_type t = k_all_types[i];
        const double e1 = check_vs_cpu(vk, &r, t, 40, 512, 1), e20 = no_subgroup ? 0 : check_vs_cpu(vk, &r, t, 70, 256, 20);
        printf("  %-5s rounded like the CPU: vs moex_matmul n=1 %.2g  n=20 %.2g\n", moex_type_get(t)->name, e1, e20);
        /* Q4_1/Q5_1: the CPU takes the block sum from an f16 (Q8_1.s); values cannot carry that exactly */
        const double tol = t == MOEX_TYPE_Q4_1 || t == MOEX_TYPE_Q5_1 ? 3e-3 : 1e-4;
        CHECK(e1 < tol && e20 < tol, "%s: GPU with rounding vs CPU: %.3g / %.3g", moex_type_get(t)->name, e1, e20);
    }
    moex_vk_free(vk);
    return test_finish("test_vk_matmul");
}
