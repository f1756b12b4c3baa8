/* Pins the GLSL block views (kernels/vk/shaders/_quant.comp) to common/types.h:
 * the GPU dequantizes random rows of every weight type, directly and as an
 * embedding gather by token id, and must reproduce moex_dequantize_row. */
#include "tests/vk/vk_test_util.h"

static void check_type(moex_vk *vk, rng *r, moex_type t) {
    const int64_t rows = 7, cols = 512, n_ids = 5;
    test_matrix m = make_matrix(r, t, rows, cols);
    /* Odd row offsets and the 2-byte alignment of q4_0/q5_0/q8_0/q6_K blocks are exercised by the row count. */
    moex_vk_buffer *w = gpu_from(vk, m.data, (size_t)rows * m.row_bytes);
    int32_t ids[5];
    for (int i = 0; i < n_ids; i++) ids[i] = (int32_t)(rng_next(r) % (uint64_t)rows);
    moex_vk_buffer *idb = gpu_from(vk, ids, sizeof ids);
    moex_vk_buffer *out = gpu_from(vk, NULL, (size_t)rows * cols * 4);
    moex_vk_buffer *gat = gpu_from(vk, NULL, (size_t)n_ids * cols * 4);
    moex_vk_matrix vm = vk_matrix_of(&m, w);
    moex_vk_cmd *c = moex_vk_cmd_create(vk, &g_err);
    MUST(!c);
    MUST(moex_vk_cmd_begin(c, &g_err));
    MUST(moex_vk_op_dequant(c, &vm, 0, rows, moex_vk_buffer_ptr(out), &g_err));
    MUST(moex_vk_op_dequant(c, &vm, moex_vk_buffer_ptr(idb), n_ids, moex_vk_buffer_ptr(gat), &g_err));
    MUST(moex_vk_cmd_run(c, &g_err));
    float *got = malloc((size_t)rows * cols * 4), *g2 = malloc((size_t)n_ids * cols * 4);
    gpu_read(vk, out, got, (size_t)rows * cols * 4);
    gpu_read(vk, gat, g2, (size_t)n_ids * cols * 4);
    double max_err = 0;
    for (int64_t i = 0; i < rows * cols; i++) {
        double e = fabs((double)got[i] - m.deq[i]) / (fabs(m.deq[i]) + 1e-6);
        if (e > max_err) max_err = e;
    }
    /* f16 scales are converted by unpackHalf2x16 and products are f32: exact up to rounding. */
    CHECK(max_err < 1e-5, "%s: dequant max relative error %.3g", moex_type_get(t)->name, max_err);
    int gather_bad = 0;
    for (int i = 0; i < n_ids; i++)
        for (int64_t j = 0; j < cols; j++)
            if (fabsf(g2[i * cols + j] - got[ids[i] * cols + j]) > 0) gather_bad++;
    CHECK(gather_bad == 0, "%s: embedding gather differs from the rows in %d places", moex_type_get(t)->name, gather_bad);
    printf("  %-5s max rel err %.2g\n", moex_type_get(t)->name, max_err);
    free(got);
    free(g2);
    moex_vk_cmd_free(c);
    moex_vk_buffer_free(w);
    moex_vk_buffer_free(idb);
    moex_vk_buffer_free(out);
    moex_vk_buffer_free(gat);
    free_matrix(&m);
}

int main(void) {
    rng r = test_rng("test_vk_layout");
    moex_vk *vk = test_vk(false);
    for (int i = 0; i < N_ALL_TYPES; i++) check_type(vk, &r, k_all_types[i]);
    /* Bad input is an error, not a crash. */
    moex_vk_cmd *c = moex_vk_cmd_create(vk, &g_err);
    MUST(moex_vk_cmd_begin(c, &g_err));
    moex_vk_matrix bad = {.type = MOEX_TYPE_Q8_K, .rows = 1, .cols = 256, .row_bytes = 292, .data = 16};
    CHECK(moex_vk_op_dequant(c, &bad, 0, 1, 16, &g_err) == -1 && strstr(g_err.msg, "q8_K"),
          "q8_K weights must be refused (got '%s')", g_err.msg);
    moex_vk_matrix odd = {.type = MOEX_TYPE_F32, .rows = 1, .cols = 20, .row_bytes = 80, .data = 16};
    CHECK(moex_vk_op_dequant(c, &odd, 0, 1, 16, &g_err) == -1, "20 columns must be refused");
    MUST(moex_vk_cmd_end(c, &g_err));
    moex_vk_cmd_free(c);
    moex_vk_free(vk);
    return test_finish("test_vk_layout");
}
