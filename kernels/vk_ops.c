/* Recording the kernels: each op checks its arguments, picks the variant
 * (type, mode, matrix-vector or tiled) and dispatches it. The expert FFN is
 * in vk_experts.c, the tiled (prompt batch) products in vk_mm.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/vk_internal.h"

uint32_t vk_fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

uint32_t vk_ceil_div(int64_t a, int64_t b) { return (uint32_t)((a + b - 1) / b); }

/* mv.comp reads Q4_K and f32 rows through 16-byte loads; weights placed at
 * other offsets take the 8-element variant of the same mode. */
int vk_mv_mode(int mode, const moex_vk_matrix *w) {
    const bool wide = w->type == MOEX_TYPE_Q4_K || w->type == MOEX_TYPE_F32;
    return wide && w->data % 16 ? mode | VK_MV_GENERIC : mode;
}

/* Workgroups of mv.comp along the rows. */
uint32_t vk_mv_groups(int64_t rows, int mode) { return vk_ceil_div(rows, VK_MV_GROUPS * VK_MV_RPT(mode)); }

void vk_dispatch(moex_vk_cmd *c, VkPipeline p, const vk_pc *pc, uint32_t gx, uint32_t gy, uint32_t gz) {
    if (c->bound != p) {
        vkCmdBindPipeline(c->cb, VK_PIPELINE_BIND_POINT_COMPUTE, p);
        c->bound = p;
    }
    vkCmdPushConstants(c->cb, c->vk->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof *pc, pc);
    vkCmdDispatch(c->cb, gx, gy, gz);
    if (c->prof) vk_prof_mark(c, p);
}

/* Dispatches must stay under the 65535 workgroups per dimension every device has. */
int vk_check_grid(int64_t gx, int64_t gy, int64_t gz, moex_error *err) {
    if (gx > 65535 || gy > 65535 || gz > 65535)
        return moex_fail(err, "vulkan: dispatch of %lldx%lldx%lld workgroups is too large (split the batch)",
                         (long long)gx, (long long)gy, (long long)gz);
    return 0;
}

int vk_check_matrix(const moex_vk_matrix *w, moex_error *err) {
    if (!moex_vk_type_supported(w->type)) {
        const moex_type_traits *tt = moex_type_get(w->type);
        return moex_fail(err, "vulkan: no GPU kernels for tensor type %s", tt ? tt->name : "?");
    }
    if (w->rows <= 0 || w->cols <= 0 || w->cols % 32)
        return moex_fail(err, "vulkan: matrix %lldx%lld: columns must be a positive multiple of 32",
                         (long long)w->rows, (long long)w->cols);
    if (w->row_bytes != moex_row_bytes(w->type, w->cols) || w->rows * w->row_bytes > UINT32_MAX ||
        (w->expert_stride && w->expert_stride % 4))
        return moex_fail(err, "vulkan: matrix %lldx%lld has an inconsistent row size or is over 4 GiB",
                         (long long)w->rows, (long long)w->cols);
    if (!w->data || w->data % 4) return moex_fail(err, "vulkan: matrix data must be 4-byte aligned on the GPU");
    return 0;
}

int moex_vk_set_activation_rounding(moex_vk *vk, size_t max_floats, moex_error *err) {
    moex_vk_buffer_free(vk->actq);
    vk->actq = NULL;
    vk->actq_floats = 0;
    if (max_floats == 0) return 0;
    if (!(vk->actq = moex_vk_buffer_create(vk, 3 * max_floats * 4, MOEX_VK_MEM_DEVICE, err))) return -1;
    vk->actq_floats = max_floats;
    return 0;
}

/* The input a product of weight type t reads: x itself, or x rounded to the
 * partner type (when rounding is on) in its region of the rounding buffer.
 * Barriers on both sides: the region may still be read by the previous product. */
int vk_round_input(moex_vk_cmd *c, moex_type t, moex_vk_ptr x, int64_t rows, int64_t cols, moex_vk_ptr *out,
                       moex_error *err) {
    moex_vk *vk = c->vk;
    *out = x;
    if (!vk->actq || t == MOEX_TYPE_F32 || t == MOEX_TYPE_F16 || t == MOEX_TYPE_BF16 || rows <= 0) return 0;
    const int kq = t == MOEX_TYPE_Q4_K || t == MOEX_TYPE_Q5_K || t == MOEX_TYPE_Q6_K ? 1
                   : t == MOEX_TYPE_Q4_1 || t == MOEX_TYPE_Q5_1                     ? 2 : 0;
    if ((size_t)(rows * cols) > vk->actq_floats)
        return moex_fail(err, "vulkan: activation rounding buffer holds %zu floats, a product needs %lld", vk->actq_floats,
                         (long long)(rows * cols));
    if (rows > 65535) return moex_fail(err, "vulkan: activation rounding of %lld rows", (long long)rows);
    VkPipeline p = vk_pipeline(vk, VK_K_ACTQ, 0, kq, err);
    if (!p) return -1;
    *out = moex_vk_buffer_ptr(vk->actq) + (size_t)kq * vk->actq_floats * 4;
    vk_pc pc = {.p = {x, *out}, .u = {(uint32_t)cols}};
    moex_vk_barrier(c);
    vk_dispatch(c, p, &pc, (uint32_t)((cols + 255) / 256), (uint32_t)rows, 1);
    moex_vk_barrier(c);
    return 0;
}

int moex_vk_op_dequant(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr ids, int64_t n, moex_vk_ptr out,
                       moex_error *err) {
    if (vk_check_matrix(w, err) || vk_check_grid(vk_ceil_div(w->cols / 8, 64), n, 1, err)) return -1;
    if (!ids && n > w->rows) return moex_fail(err, "vulkan: dequant of %lld rows of a %lld-row matrix", (long long)n,
                                              (long long)w->rows);
    VkPipeline p = vk_pipeline(c->vk, VK_K_DEQUANT, w->type, 0, err);
    if (!p) return -1;
    vk_pc pc = {.p = {w->data, out, ids}, .u = {(uint32_t)w->cols, ids != 0}};
    if (n > 0) vk_dispatch(c, p, &pc, vk_ceil_div(w->cols / 8, 64), (uint32_t)n, 1);
    return 0;
}

int moex_vk_op_rmsnorm(moex_vk_cmd *c, moex_vk_ptr out, moex_vk_ptr x, moex_vk_ptr w, int64_t n_rows, int64_t dim,
                       float eps, moex_error *err) {
    if (dim <= 0 || vk_check_grid(n_rows, 1, 1, err)) return dim <= 0 ? moex_fail(err, "vulkan: rmsnorm of dim %lld", (long long)dim) : -1;
    VkPipeline p = vk_pipeline(c->vk, VK_K_RMSNORM, 0, 0, err);
    if (!p) return -1;
    vk_pc pc = {.p = {x, out, w}, .u = {(uint32_t)dim, w != 0, vk_fbits(eps)}};
    if (n_rows > 0) vk_dispatch(c, p, &pc, (uint32_t)n_rows, 1, 1);
    return 0;
}

/* mv.comp / mm.comp push constants: w w2 x y r ids gw counter | rows cols n xs ys flags k estride n_expert. */
vk_pc vk_mat_pc(const moex_vk_matrix *w, moex_vk_ptr x, int64_t n, int64_t xs, moex_vk_ptr y, int64_t ys,
                    moex_vk_ptr resid) {
    vk_pc pc = {.p = {w->data, 0, x, y, resid}};
    pc.u[0] = (uint32_t)w->rows;
    pc.u[1] = (uint32_t)w->cols;
    pc.u[2] = (uint32_t)n;
    pc.u[3] = (uint32_t)xs;
    pc.u[4] = (uint32_t)ys;
    pc.u[5] = resid != 0;
    pc.u[7] = (uint32_t)w->expert_stride;
    return pc;
}

int moex_vk_op_matmul(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, int64_t n, moex_vk_ptr y,
                      moex_vk_ptr resid, moex_error *err) {
    if (vk_check_matrix(w, err)) return -1;
    if (n <= 0) return 0;
    if (vk_round_input(c, w->type, x, n, w->cols, &x, err)) return -1;
    vk_pc pc = vk_mat_pc(w, x, n, w->cols, y, w->rows, resid);
    if (n <= VK_MV_NMAX) {
        VkPipeline p = vk_pipeline(c->vk, VK_K_MV, w->type, vk_mv_mode(0, w), err);
        if (!p || vk_check_grid(vk_mv_groups(w->rows, 0), 1, 1, err)) return -1;
        vk_dispatch(c, p, &pc, vk_mv_groups(w->rows, 0), 1, 1);
        return 0;
    }
    return vk_matmul_tiled(c, w, &pc, n, err);
}

/* The fused norm needs no shared memory (each row group sums x^2 as it
 * reads x), so any width qualifies; x and nw are read 16 bytes at a time. */
bool moex_vk_norm_fusable(const moex_vk *vk, int64_t n, int64_t dim) {
    return n == 1 && !vk->actq && dim % 4 == 0;
}

static int check_norm_fused(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, moex_vk_ptr nw, moex_error *err) {
    if (vk_check_matrix(w, err)) return -1;
    if (!nw) return moex_fail(err, "vulkan: the fused RMSNorm needs its weight");
    if (!moex_vk_norm_fusable(c->vk, 1, w->cols))
        return moex_fail(err, "vulkan: RMSNorm of %lld columns cannot be fused here (activation rounding is on)",
                         (long long)w->cols);
    if (x % 16 || nw % 16) return moex_fail(err, "vulkan: the fused RMSNorm needs x and its weight 16-byte aligned");
    return 0;
}

int moex_vk_op_norm_matmul(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, moex_vk_ptr nw, float eps,
                           moex_vk_ptr y, moex_vk_ptr resid, moex_error *err) {
    if (check_norm_fused(c, w, x, nw, err)) return -1;
    VkPipeline p = vk_pipeline(c->vk, VK_K_MV, w->type, vk_mv_mode(0, w) | VK_MV_NORM, err);
    if (!p || vk_check_grid(vk_mv_groups(w->rows, 0), 1, 1, err)) return -1;
    vk_pc pc = vk_mat_pc(w, x, 1, w->cols, y, w->rows, resid);
    pc.p[1] = nw;
    pc.u[9] = vk_fbits(eps);
    vk_dispatch(c, p, &pc, vk_mv_groups(w->rows, 0), 1, 1);
    return 0;
}

/* Workgroups of the head with the argmax: each loops over row blocks and
 * pays the argmax epilogue (a fence and an atomic) once; 2048 fill any GPU. */
static uint32_t argmax_groups(int64_t rows) {
    const uint32_t g = vk_mv_groups(rows, 0);
    return g < 2048 ? g : 2048;
}

size_t moex_vk_argmax_sync_bytes(int64_t rows) { return (1 + 2 * (size_t)argmax_groups(rows)) * 4; }

int moex_vk_op_matmul_argmax(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, moex_vk_ptr nw, float eps,
                             moex_vk_ptr y, moex_vk_ptr out, moex_vk_ptr sync, size_t sync_bytes, moex_error *err) {
    if (nw ? check_norm_fused(c, w, x, nw, err) : vk_check_matrix(w, err)) return -1;
    if (!out || out % 4) return moex_fail(err, "vulkan: the fused argmax needs a 4-byte aligned output word");
    if (!sync || sync % 4 || sync_bytes < moex_vk_argmax_sync_bytes(w->rows))
        return moex_fail(err, "vulkan: the fused argmax of %lld rows needs %zu bytes of zeroed sync words (got %zu)",
                         (long long)w->rows, moex_vk_argmax_sync_bytes(w->rows), sync_bytes);
    if (!nw && vk_round_input(c, w->type, x, 1, w->cols, &x, err)) return -1;
    const uint32_t groups = argmax_groups(w->rows);
    VkPipeline p = vk_pipeline(c->vk, VK_K_MV, w->type, vk_mv_mode(0, w) | (nw ? VK_MV_NORM : 0), err);
    if (!p || vk_check_grid(groups, 1, 1, err)) return -1;
    vk_pc pc = vk_mat_pc(w, x, 1, w->cols, y, w->rows, 0);
    pc.p[1] = nw;
    pc.p[5] = out;
    pc.p[7] = sync;
    pc.u[5] = 4u;   /* the argmax epilogue */
    pc.u[9] = vk_fbits(eps);
    vk_dispatch(c, p, &pc, groups, 1, 1);
    return 0;
}

int moex_vk_op_eltwise(moex_vk_cmd *c, int op, moex_vk_ptr a, moex_vk_ptr b, moex_vk_ptr y, int64_t n, moex_error *err) {
    if (op != 0 && op != 1) return moex_fail(err, "vulkan: unknown elementwise op %d", op);
    if (n <= 0) return 0;
    if (n > UINT32_MAX) return moex_fail(err, "vulkan: elementwise op over %lld floats", (long long)n);
    VkPipeline p = vk_pipeline(c->vk, VK_K_ELTWISE, 0, op, err);
    if (!p) return -1;
    vk_pc pc = {.p = {a, b, y}, .u = {(uint32_t)n}};
    const uint32_t groups = vk_ceil_div(n, 256), gx = groups < 65535 ? groups : 65535;
    vk_dispatch(c, p, &pc, gx, vk_ceil_div(groups, gx), 1);
    return 0;
}

int moex_vk_op_argmax(moex_vk_cmd *c, moex_vk_ptr x, int64_t n_rows, int64_t n, int64_t stride, moex_vk_ptr out,
                      moex_error *err) {
    if (n <= 0 || stride < n || vk_check_grid(n_rows, 1, 1, err))
        return moex_fail(err, "vulkan: argmax over rows of %lld (stride %lld)", (long long)n, (long long)stride);
    VkPipeline p = vk_pipeline(c->vk, VK_K_ARGMAX, 0, 0, err);
    if (!p) return -1;
    vk_pc pc = {.p = {x, out}, .u = {(uint32_t)n, (uint32_t)stride}};
    if (n_rows > 0) vk_dispatch(c, p, &pc, (uint32_t)n_rows, 1, 1);
    return 0;
}

static int check_attn_shape(const moex_vk_attn_shape *sh, moex_error *err) {
    if (sh->n_head <= 0 || sh->n_head_kv <= 0 || sh->n_head % sh->n_head_kv || sh->head_dim <= 0 ||
        sh->head_dim > 512 || sh->head_dim % 4 || sh->rope_dim > sh->head_dim || sh->rope_dim % 2 || sh->n_ctx <= 0)
        return moex_fail(err, "vulkan: attention shape heads %d/%d x %d (rope %d) is not supported "
                         "(head_dim a multiple of 4, <= 512)", sh->n_head, sh->n_head_kv, sh->head_dim, sh->rope_dim);
    return 0;
}

int moex_vk_op_qk_rope(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k, moex_vk_ptr v,
                       moex_vk_ptr k_cache, moex_vk_ptr v_cache, moex_vk_ptr q_norm, moex_vk_ptr k_norm,
                       moex_vk_ptr params, int64_t n, moex_error *err) {
    if (check_attn_shape(sh, err) || vk_check_grid(n, sh->n_head + sh->n_head_kv, 1, err)) return -1;
    if (sh->qk_norm && (!q_norm || !k_norm)) return moex_fail(err, "vulkan: QK-norm needs q_norm and k_norm weights");
    VkPipeline p = vk_pipeline(c->vk, VK_K_QKROPE, 0, 0, err);
    if (!p) return -1;
    vk_pc pc = {.p = {q, k, v, k_cache, v_cache, params, q_norm, k_norm},
                .u = {(uint32_t)sh->n_head, (uint32_t)sh->n_head_kv, (uint32_t)sh->head_dim, (uint32_t)sh->rope_dim,
                      (sh->qk_norm ? 1u : 0u) | (sh->neox ? 2u : 0u), vk_fbits(sh->rope_base), vk_fbits(sh->rms_eps)}};
    if (n > 0) vk_dispatch(c, p, &pc, (uint32_t)n, (uint32_t)(sh->n_head + sh->n_head_kv), 1);
    return 0;
}

/* Splits of the key positions: decode gives each workgroup about 64 keys
 * (short serial chains fill the GPU; empty splits past the position exit at once). */
static int64_t attn_splits(const moex_vk_attn_shape *sh, int64_t n) {
    if (n > 1) return 1;
    int64_t s = (sh->n_ctx + 63) / 64;
    return s < 1 ? 1 : s > 64 ? 64 : s;
}

size_t moex_vk_attention_scratch(const moex_vk_attn_shape *sh, int64_t n) {
    return (size_t)n * (size_t)sh->n_head * (size_t)attn_splits(sh, n) * (size_t)(sh->head_dim + 2);
}

/* The tiled prompt-batch attention (attn.comp modes 2..5 by head_dim class
 * HDMAX = 64 << (mode - 2), R = 4096 / HDMAX query rows and BK keys a tile;
 * modes 6..9 the same with half the rows, for 32 KiB of shared memory).
 * Returns 0 where it does not apply: one token, MOEX_VK_ATTN_SIMPLE=1 (the
 * split-K path, kept for comparison), or too little shared memory. */
static int attn_tiled_mode(const moex_vk *vk, const moex_vk_attn_shape *sh, int64_t n, uint32_t *rows) {
    const char *simple = getenv("MOEX_VK_ATTN_SIMPLE");
    if (n <= 1 || (simple && *simple && strcmp(simple, "0"))) return 0;
    int cls = 0;
    while ((64 << cls) < sh->head_dim) cls++;
    const uint32_t hdmax = 64u << cls, st = hdmax / 4 + 1, bk = hdmax <= 128 ? 32 : 4096 / hdmax;
    for (int half = 0; half < 2; half++) {
        const uint32_t r = (half ? 2048 : 4096) / hdmax;
        if ((size_t)(r + bk) * st * 16 + (size_t)r * bk * 4 + r * 4 <= vk->info.shared_mem) {
            *rows = r;
            return 2 + cls + 4 * half;
        }
    }
    return 0;
}

int moex_vk_op_attention(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k_cache,
                         moex_vk_ptr v_cache, moex_vk_ptr out, moex_vk_ptr scratch, moex_vk_ptr params, int64_t n,
                         moex_error *err) {
    const int64_t ns = attn_splits(sh, n), chunk = (sh->n_ctx + ns - 1) / ns;
    if (check_attn_shape(sh, err) || vk_check_grid(sh->n_head, n, ns, err)) return -1;
    if (k_cache % 16) return moex_fail(err, "vulkan: the K cache must be 16-byte aligned on the GPU");
    uint32_t rows = 0;
    const int tiled = attn_tiled_mode(c->vk, sh, n, &rows);
    if (tiled) {   /* workgroup = rows (token, q head) pairs of one KV group; writes out directly */
        const int64_t gx = (n * (sh->n_head / sh->n_head_kv) + rows - 1) / rows;
        if (vk_check_grid(gx, sh->n_head_kv, 1, err)) return -1;
        VkPipeline p = vk_pipeline(c->vk, VK_K_ATTN, 0, tiled, err);
        if (!p) return -1;
        vk_pc pc = {.p = {q, k_cache, v_cache, out, params},
                    .u = {(uint32_t)sh->n_head, (uint32_t)sh->n_head_kv, (uint32_t)sh->head_dim, (uint32_t)n,
                          vk_fbits(sh->scale)}};
        vk_dispatch(c, p, &pc, (uint32_t)gx, (uint32_t)sh->n_head_kv, 1);
        return 0;
    }
    VkPipeline pa = vk_pipeline(c->vk, VK_K_ATTN, 0, 0, err), pm = vk_pipeline(c->vk, VK_K_ATTN_MERGE, 0, 0, err);
    if (!pa || !pm) return -1;
    if (n <= 0) return 0;
    vk_pc pc = {.p = {q, k_cache, v_cache, scratch, params},
                .u = {(uint32_t)sh->n_head, (uint32_t)sh->n_head_kv, (uint32_t)sh->head_dim, (uint32_t)ns,
                      (uint32_t)chunk, vk_fbits(sh->scale)}};
    vk_dispatch(c, pa, &pc, (uint32_t)sh->n_head, (uint32_t)n, (uint32_t)ns);
    moex_vk_barrier(c);
    vk_pc pm_pc = {.p = {scratch, out}, .u = {(uint32_t)sh->n_head, (uint32_t)sh->head_dim, (uint32_t)ns}};
    vk_dispatch(c, pm, &pm_pc, (uint32_t)sh->n_head, (uint32_t)n, 1);
    return 0;
}

int moex_vk_op_attention_decode(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k,
                                moex_vk_ptr v, moex_vk_ptr k_cache, moex_vk_ptr v_cache, moex_vk_ptr q_norm,
                                moex_vk_ptr k_norm, moex_vk_ptr scratch, moex_vk_ptr counters, moex_vk_ptr params,
                                moex_error *err) {
    const int64_t ns = attn_splits(sh, 1), chunk = (sh->n_ctx + ns - 1) / ns;
    if (check_attn_shape(sh, err) || vk_check_grid(sh->n_head, 1, ns, err)) return -1;
    if (k_cache % 16) return moex_fail(err, "vulkan: the K cache must be 16-byte aligned on the GPU");
    if (sh->qk_norm && (!q_norm || !k_norm)) return moex_fail(err, "vulkan: QK-norm needs q_norm and k_norm weights");
    if (!counters || counters % 4) return moex_fail(err, "vulkan: the fused attention needs n_head zeroed counters");
    VkPipeline p = vk_pipeline(c->vk, VK_K_ATTN, 0, 1, err);
    if (!p) return -1;
    vk_pc pc = {.p = {q, k_cache, v_cache, scratch, params, k, v, counters},
                .u = {(uint32_t)sh->n_head | (uint32_t)sh->n_head_kv << 16,
                      (uint32_t)sh->head_dim | (uint32_t)sh->rope_dim << 16, (uint32_t)ns, (uint32_t)chunk,
                      vk_fbits(sh->scale), vk_fbits(sh->rope_base), vk_fbits(sh->rms_eps),
                      (sh->qk_norm ? 1u : 0u) | (sh->neox ? 2u : 0u), (uint32_t)q_norm, (uint32_t)(q_norm >> 32),
                      (uint32_t)k_norm, (uint32_t)(k_norm >> 32)}};
    vk_dispatch(c, p, &pc, (uint32_t)sh->n_head, 1, (uint32_t)ns);
    return 0;
}

int moex_vk_op_router(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, int64_t n, int k, bool norm,
                      moex_vk_ptr logits, moex_vk_ptr counter, moex_vk_ptr ids, moex_vk_ptr weights, moex_error *err) {
    if (vk_check_matrix(w, err)) return -1;
    if (w->rows > VK_MAX_EXPERTS || k <= 0 || k > w->rows)
        return moex_fail(err, "vulkan: router over %lld experts choosing %d (at most %d experts)", (long long)w->rows, k,
                         VK_MAX_EXPERTS);
    if (n <= 0) return 0;
    if (vk_round_input(c, w->type, x, n, w->cols, &x, err)) return -1;
    vk_pc pc = vk_mat_pc(w, x, n, w->cols, logits, w->rows, 0);
    pc.p[5] = ids;
    pc.p[6] = weights;
    pc.p[7] = counter;
    pc.u[5] = norm ? 2u : 0u;
    pc.u[6] = (uint32_t)k;
    if (n <= VK_MV_NMAX) {   /* one dispatch: the last workgroup routes */
        VkPipeline p = vk_pipeline(c->vk, VK_K_MV, w->type, vk_mv_mode(3, w), err);
        if (!p) return -1;
        vk_dispatch(c, p, &pc, vk_mv_groups(w->rows, 3), 1, 1);
        return 0;
    }
    return vk_router_tiled(c, w, &pc, n, err);
}

int moex_vk_op_norm_router(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, moex_vk_ptr nw, float eps, int k,
                           bool norm, moex_vk_ptr logits, moex_vk_ptr counter, moex_vk_ptr ids, moex_vk_ptr weights,
                           moex_vk_ptr xn, moex_error *err) {
    if (check_norm_fused(c, w, x, nw, err)) return -1;
    if (w->rows > VK_MAX_EXPERTS || k <= 0 || k > w->rows || !xn)
        return moex_fail(err, "vulkan: router over %lld experts choosing %d (at most %d experts; xn required)",
                         (long long)w->rows, k, VK_MAX_EXPERTS);
    VkPipeline p = vk_pipeline(c->vk, VK_K_MV, w->type, vk_mv_mode(3, w) | VK_MV_NORM, err);
    if (!p) return -1;
    vk_pc pc = vk_mat_pc(w, x, 1, w->cols, logits, w->rows, xn);
    pc.p[1] = nw;
    pc.p[5] = ids;
    pc.p[6] = weights;
    pc.p[7] = counter;
    pc.u[5] = norm ? 2u : 0u;   /* bit 0 (add r) stays off: r is the xn output here */
    pc.u[6] = (uint32_t)k;
    pc.u[9] = vk_fbits(eps);
    vk_dispatch(c, p, &pc, vk_mv_groups(w->rows, 3), 1, 1);
    return 0;
}
