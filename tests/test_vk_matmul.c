/* Matrix products on the GPU for every weight type, against a float64
 * reference on the exactly dequantized weights: the matrix-vector kernel
 * (1..8 tokens, with and without the residual add; subgroup and
 * shared-memory reductions) and the tiled kernel (ragged tiles). */
#include "tests/vk/vk_test_util.h"

static double check_product(moex_vk *vk, rng *r, moex_type t, int64_t rows, int64_t cols, int64_t n, bool resid) {
    test_matrix m = make_matrix(r, t, rows, cols);
    float *x = malloc((size_t)(n * cols) * 4), *res = malloc((size_t)(n * rows) * 4), *y = malloc((size_t)(n * rows) * 4);
    double *ref = malloc((size_t)(n * rows) * 8);
    fill_gauss(r, x, (size_t)(n * cols), 1.0f);
    fill_gauss(r, res, (size_t)(n * rows), 1.0f);
    for (int64_t tk = 0; tk < n; tk++)
        for (int64_t i = 0; i < rows; i++) {
            double s = resid ? res[tk * rows + i] : 0;
            for (int64_t j = 0; j < cols; j++) s += (double)m.deq[i * cols + j] * x[tk * cols + j];
            ref[tk * rows + i] = s;
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

/* With activation rounding on, the GPU must track the CPU backend's quantized products closely. */
static double check_vs_cpu(moex_vk *vk, rng *r, moex_type t, int64_t rows, int64_t cols, int64_t n) {
    test_matrix m = make_matrix(r, t, rows, cols);
    float *x = malloc((size_t)(n * cols) * 4), *y = malloc((size_t)(n * rows) * 4), *ref = malloc((size_t)(n * rows) * 4);
    fill_gauss(r, x, (size_t)(n * cols), 1.0f);
    moex_matrix cm = {.type = t, .rows = rows, .cols = cols, .row_bytes = m.row_bytes, .data = m.data};
    MUST(moex_matmul(NULL, &cm, x, n, ref));
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

int main(int argc, char **argv) {
    const bool no_subgroup = argc > 1 && !strcmp(argv[1], "--no-subgroup");
    rng r = test_rng("test_vk_matmul");
    moex_vk *vk = test_vk(no_subgroup);
    for (int i = 0; i < N_ALL_TYPES; i++) {
        const moex_type t = k_all_types[i];
        const double e1 = check_product(vk, &r, t, 37, 512, 1, false);
        const double e3 = check_product(vk, &r, t, 64, 768, 3, true);
        const double e8 = check_product(vk, &r, t, 5, 256, 8, false);
        const double em = no_subgroup ? 0 : check_product(vk, &r, t, 100, 256, 70, true);
        printf("  %-5s mv n=1 %.2g  n=3+res %.2g  n=8 %.2g  mm n=70+res %.2g\n", moex_type_get(t)->name, e1, e3, e8, em);
        CHECK(e1 < 2e-6 && e3 < 2e-6 && e8 < 2e-6 && em < 2e-6, "%s: relative L2 error too large", moex_type_get(t)->name);
    }
    MUST(moex_vk_set_activation_rounding(vk, 70 * 512, &g_err));
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
