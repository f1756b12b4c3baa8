/* The ops but attention and the expert FFN (vk_attn.c, vk_experts.c): each
 * checks its arguments, picks the variant (type, mode, matrix-vector or
 * tiled: vk_mm.c) and records its dispatch (vk_record.c). The *_pick and
 * *_each ops (several sequences in one batch, vk.h) pick by the kind of
 * token instead of by n: the same kernels a token gets alone, or the tiles. */

#include "kernels/vk/vk_internal.h"

/* vk_mv_mode, and in the one-token staged modes (1, 2) Q4_K and Q6_K stage x as int8 where vk_idot. */
static int mv_mode_of(const moex_vk *vk, int mode, const moex_vk_matrix *w) {
    const int m = vk_mv_mode(mode, w);
    const bool staged = mode == 1 || mode == 2, typed = w->type == MOEX_TYPE_Q4_K || w->type == MOEX_TYPE_Q6_K;
    return staged && typed && !(m & VK_MV_GENERIC) && vk_idot(vk) ? m | VK_MV_IDOT : m;
}

/* The staged one-token variants (modes 1, 2, 3 | VK_MV_STAGE): x fits the
 * shared-memory stage (24 KiB with its bank padding) and is 16-byte aligned. */
int64_t moex_vk_mv_staged_cols(const moex_vk *vk) { return vk->info.shared_mem >= 32768 ? VK_MV_XMAX : 0; }

static bool mv_stageable(const moex_vk *vk, const moex_vk_matrix *w, moex_vk_ptr x) {
    return w->cols <= moex_vk_mv_staged_cols(vk) && x % 16 == 0;
}

/* Workgroups of a staged dispatch over row blocks: at most VK_MV_PERSIST, each looping over its blocks. */
static uint32_t staged_groups(int64_t blocks) { return blocks < VK_MV_PERSIST ? (uint32_t)blocks : VK_MV_PERSIST; }

/* Workgroups per token of a staged product over n tokens (each the grid's y):
 * for a batch, --vk-tune mv_batch_wg workgroups in all at most, so that each
 * stages its token's x once for several row blocks (the grid-stride loop)
 * where the tokens alone fill the GPU. A block's rows sum alike in any grid. */
static uint32_t staged_groups_n(const moex_vk *vk, int64_t blocks, int64_t n) {
    const uint32_t g = staged_groups(blocks);
    const int budget = vk->tune.mv_batch_wg;
    if (n < 2 || budget <= 0) return g;
    const int64_t per = budget / n < 1 ? 1 : budget / n;
    return per < g ? (uint32_t)per : g;
}

/* Workgroups of a one-token mv.comp dispatch of mode over rows: staged, or one per row block. */
static uint32_t mv_grid(const moex_vk *vk, int64_t rows, int mode, bool staged) {
    return staged ? staged_groups(vk_mv_groups(vk, rows, mode)) : vk_mv_groups(vk, rows, mode);
}

int moex_vk_op_dequant(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr ids, int64_t n, moex_vk_ptr out,
                       moex_error *err) {
    if (vk_check_matrix(w, err) || vk_check_grid(vk_ceil_div(w->cols / 8, 64), n, 1, err)) return -1;
    if (!ids && n > w->rows) return moex_fail(err, "vulkan: dequant of %lld rows of a %lld-row matrix", (long long)n,
                                              (long long)w->rows);
    const vk_pipe *p = vk_pipeline(c->vk, VK_K_DEQUANT, w->type, 0, err);
    if (!p) return -1;
    vk_pc pc = {.p = {w->data, out, ids}, .u = {(uint32_t)w->cols, ids != 0}};
    if (n > 0) vk_dispatch(c, p, &pc, vk_ceil_div(w->cols / 8, 64), (uint32_t)n, 1);
    return 0;
}

int moex_vk_op_rmsnorm(moex_vk_cmd *c, moex_vk_ptr out, moex_vk_ptr x, moex_vk_ptr w, int64_t n_rows, int64_t dim,
                       float eps, moex_error *err) {
    if (dim <= 0 || vk_check_grid(n_rows, 1, 1, err)) return dim <= 0 ? moex_fail(err, "vulkan: rmsnorm of dim %lld", (long long)dim) : -1;
    const vk_pipe *p = vk_pipeline(c->vk, VK_K_RMSNORM, 0, 0, err);
    if (!p) return -1;
    vk_pc pc = {.p = {x, out, w}, .u = {(uint32_t)dim, w != 0, vk_fbits(eps)}};
    if (n_rows > 0) vk_dispatch(c, p, &pc, (uint32_t)n_rows, 1, 1);
    return 0;
}

/* Tokens one at a time (MOEX_VK_EACH): the staged one-token product with the
 * tokens as the grid's y where x stages, else mode 0, whose tokens are
 * independent (and alike) within its groups of VK_MV_NMAX. */
static int matmul_each(moex_vk_cmd *c, const moex_vk_matrix *w, const vk_pc *pc, moex_vk_ptr x, int64_t n,
                       moex_error *err) {
    const bool staged = !c->vk->tune.each_unstaged && mv_stageable(c->vk, w, x);
    const int mode = staged ? mv_mode_of(c->vk, 1, w) : vk_mv_mode(0, w);
    const uint32_t gx = staged ? staged_groups_n(c->vk, vk_mv_groups(c->vk, w->rows, 1), n)
                               : mv_grid(c->vk, w->rows, 0, false),
                   gy = staged ? (uint32_t)n : vk_ceil_div(n, VK_MV_NMAX);
    const vk_pipe *p = vk_pipeline(c->vk, VK_K_MV, w->type, mode, err);
    if (!p || vk_check_grid(gx, gy, 1, err)) return -1;
    vk_dispatch(c, p, pc, gx, gy, 1);
    return 0;
}

int moex_vk_op_matmul_pick(moex_vk_cmd *c, moex_vk_pick pick, const moex_vk_matrix *w, moex_vk_ptr x, int64_t n,
                           moex_vk_ptr y, moex_vk_ptr resid, moex_error *err) {
    if (pick == MOEX_VK_BY_N) return moex_vk_op_matmul(c, w, x, n, y, resid, err);
    if (vk_check_matrix(w, err)) return -1;
    if (n <= 0) return 0;
    if (vk_round_input(c, w->type, x, n, w->cols, &x, err)) return -1;
    vk_pc pc = vk_mat_pc(w, x, n, w->cols, y, w->rows, resid);
    return pick == MOEX_VK_EACH ? matmul_each(c, w, &pc, x, n, err) : vk_matmul_tiled(c, w, &pc, n, err);
}

int moex_vk_op_matmul(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, int64_t n, moex_vk_ptr y,
                      moex_vk_ptr resid, moex_error *err) {
    if (vk_check_matrix(w, err)) return -1;
    if (n <= 0) return 0;
    if (vk_round_input(c, w->type, x, n, w->cols, &x, err)) return -1;
    vk_pc pc = vk_mat_pc(w, x, n, w->cols, y, w->rows, resid);
    if (n == 1 && mv_stageable(c->vk, w, x)) {
        const vk_pipe *p = vk_pipeline(c->vk, VK_K_MV, w->type, mv_mode_of(c->vk, 1, w), err);
        if (!p) return -1;
        vk_dispatch(c, p, &pc, mv_grid(c->vk, w->rows, 1, true), 1, 1);
        return 0;
    }
    if (n <= VK_MV_NMAX) {
        const vk_pipe *p = vk_pipeline(c->vk, VK_K_MV, w->type, vk_mv_mode(0, w), err);
        const uint32_t groups = vk_mv_groups(c->vk, w->rows, 0);
        if (!p || vk_check_grid(groups, 1, 1, err)) return -1;
        vk_dispatch(c, p, &pc, groups, 1, 1);
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

bool moex_vk_norm_each(const moex_vk *vk, int64_t dim) {
    return moex_vk_norm_fusable(vk, 1, dim) && dim <= moex_vk_mv_staged_cols(vk) && !vk->tune.each_unstaged;
}

/* The fused norm for n tokens: staged (so that each token's arithmetic is one token's), x 16-byte aligned rows. */
static int check_norm_each(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, moex_vk_ptr nw, int64_t n,
                           moex_error *err) {
    if (check_norm_fused(c, w, x, nw, err)) return -1;
    if (!moex_vk_norm_each(c->vk, w->cols) || !mv_stageable(c->vk, w, x))
        return moex_fail(err, "vulkan: the fused RMSNorm of %lld columns cannot stage x here (moex_vk_norm_each)",
                         (long long)w->cols);
    return vk_check_grid(1, n, 1, err);
}

/* Tokens one workgroup of mode 1 | VK_MV_TOKENS takes: as many rows of x as
 * its stage holds (vk_mv_stage_copies XMAX-wide rows), at most VK_MV_TPW
 * (f32 x) or VK_MV_TPW_I8 (int8) and --vk-tune mv_tokens; only the fast units
 * of the types variants.cmake compiles it for (their bank padding every 8 or
 * more vec4s keeps two f32 rows in ~36 KiB). 1: one token a workgroup. */
static int64_t mv_tokens_per_group(const moex_vk *vk, const moex_vk_matrix *w, int mode, int64_t n) {
    const bool typed = w->type == MOEX_TYPE_Q4_K || w->type == MOEX_TYPE_Q6_K || w->type == MOEX_TYPE_Q8_0 ||
                       w->type == MOEX_TYPE_F32;
    if (n < 2 || !typed || (mode & VK_MV_GENERIC)) return 1;
    const int64_t fit = vk_mv_stage_copies(vk, w->type, mode) * VK_MV_XMAX / w->cols,
                  most = mode & VK_MV_IDOT ? VK_MV_TPW_I8 : VK_MV_TPW,
                  want = vk->tune.mv_tokens < most ? vk->tune.mv_tokens : most;
    return fit < want ? fit : want;
}

int moex_vk_op_norm_matmul_each(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, moex_vk_ptr nw, float eps,
                                int64_t n, moex_vk_ptr y, moex_vk_ptr resid, moex_error *err) {
    if (check_norm_each(c, w, x, nw, n, err)) return -1;
    if (n <= 0) return 0;
    const int mode = mv_mode_of(c->vk, 1, w) | VK_MV_NORM;
    const int64_t tpw = mv_tokens_per_group(c->vk, w, mode | VK_MV_TOKENS, n);
    const vk_pipe *p = vk_pipeline(c->vk, VK_K_MV, w->type, tpw > 1 ? mode | VK_MV_TOKENS : mode, err);
    if (!p) return -1;
    vk_pc pc = vk_mat_pc(w, x, n, w->cols, y, w->rows, resid);
    pc.p[1] = nw;
    pc.u[6] = (uint32_t)tpw;   /* k: the tokens of each workgroup */
    pc.u[9] = vk_fbits(eps);
    const int64_t groups = vk_ceil_div(n, tpw);   /* of tpw tokens each (the grid's y) */
    vk_dispatch(c, p, &pc, staged_groups_n(c->vk, vk_mv_groups(c->vk, w->rows, 1), groups), (uint32_t)groups, 1);
    return 0;
}

int moex_vk_op_norm_matmul(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, moex_vk_ptr nw, float eps,
                           moex_vk_ptr y, moex_vk_ptr resid, moex_error *err) {
    if (check_norm_fused(c, w, x, nw, err)) return -1;
    const int mode = mv_stageable(c->vk, w, x) ? 1 : 0;
    const uint32_t groups = mv_grid(c->vk, w->rows, mode, mode == 1);
    const vk_pipe *p = vk_pipeline(c->vk, VK_K_MV, w->type, mv_mode_of(c->vk, mode, w) | VK_MV_NORM, err);
    if (!p || vk_check_grid(groups, 1, 1, err)) return -1;
    vk_pc pc = vk_mat_pc(w, x, 1, w->cols, y, w->rows, resid);
    pc.p[1] = nw;
    pc.u[9] = vk_fbits(eps);
    vk_dispatch(c, p, &pc, groups, 1, 1);
    return 0;
}

bool moex_vk_mv_shareable(const moex_vk_matrix *a, const moex_vk_matrix *b) {
    return a->type == b->type && a->cols == b->cols && vk_mv_mode(0, a) == vk_mv_mode(0, b);
}

/* One mode-2 dispatch over the matrices idx[0..n) of w (one type and width), for n_tok tokens (the grid's y). */
static int dispatch_shared(moex_vk_cmd *c, const moex_vk_matrix *const *w, const moex_vk_ptr *y, const int *idx, int n,
                           moex_vk_ptr x, moex_vk_ptr nw, float eps, int64_t n_tok, moex_error *err) {
    const moex_vk_matrix *w0 = w[idx[0]];   /* x as given: the caller sends rounded inputs elsewhere */
    const vk_pipe *p = vk_pipeline(c->vk, VK_K_MV, w0->type, mv_mode_of(c->vk, 2, w0) | (nw ? VK_MV_NORM : 0), err);
    if (!p) return -1;
    vk_pc pc = vk_mat_pc(w0, x, 1, w0->cols, y[idx[0]], w0->rows, 0);
    pc.p[1] = nw;
    pc.u[9] = vk_fbits(eps);
    int64_t blocks = vk_mv_groups(c->vk, w0->rows, 2);
    for (int i = 1; i < n; i++) {   /* w1, y1 in p[4], p[5]; w2, y2 in p[6], p[7]; their rows in u[7], u[8] */
        const moex_vk_matrix *wi = w[idx[i]];
        pc.p[2 + 2 * i] = wi->data;
        pc.p[3 + 2 * i] = y[idx[i]];
        pc.u[6 + i] = (uint32_t)wi->rows;
        blocks += vk_mv_groups(c->vk, wi->rows, 2);
    }
    vk_dispatch(c, p, &pc, staged_groups_n(c->vk, blocks, n_tok), (uint32_t)n_tok, 1);
    return 0;
}

int moex_vk_op_norm_matmul_multi(moex_vk_cmd *c, int n_mats, const moex_vk_matrix *const *w, const moex_vk_ptr *y,
                                 moex_vk_ptr x, moex_vk_ptr nw, float eps, moex_error *err) {
    if (n_mats < 1 || n_mats > 3) return moex_fail(err, "vulkan: shared-input products of %d matrices (1 to 3)", n_mats);
    bool done[3] = {false, false, false};
    for (int i = 0; i < n_mats; i++) {
        if (done[i]) continue;
        if (nw ? check_norm_fused(c, w[i], x, nw, err) : vk_check_matrix(w[i], err)) return -1;
        /* too wide to stage, or x to be rounded (its copy may sit off 16 bytes): a dispatch of its own */
        if (!mv_stageable(c->vk, w[i], x) || (!nw && c->vk->actq)) {
            done[i] = true;
            if (nw ? moex_vk_op_norm_matmul(c, w[i], x, nw, eps, y[i], 0, err) : moex_vk_op_matmul(c, w[i], x, 1, y[i], 0, err))
                return -1;
            continue;
        }
        int idx[3] = {i, 0, 0}, n = 1;
        done[i] = true;
        for (int j = i + 1; j < n_mats; j++)
            if (!done[j] && moex_vk_mv_shareable(w[i], w[j]) && !vk_check_matrix(w[j], err)) {
                idx[n++] = j;
                done[j] = true;
            }
        if (dispatch_shared(c, w, y, idx, n, x, nw, eps, 1, err)) return -1;
    }
    return 0;
}

int moex_vk_op_norm_matmul_multi_each(moex_vk_cmd *c, int n_mats, const moex_vk_matrix *const *w, const moex_vk_ptr *y,
                                      moex_vk_ptr x, moex_vk_ptr nw, float eps, int64_t n, moex_error *err) {
    if (n_mats < 1 || n_mats > 3) return moex_fail(err, "vulkan: shared-input products of %d matrices (1 to 3)", n_mats);
    for (int i = 0; i < n_mats; i++)
        if (check_norm_each(c, w[i], x, nw, n, err)) return -1;
    if (n <= 0) return 0;
    bool done[3] = {false, false, false};
    for (int i = 0; i < n_mats; i++) {   /* as moex_vk_op_norm_matmul_multi groups them for one token */
        if (done[i]) continue;
        int idx[3] = {i, 0, 0}, m = 1;
        done[i] = true;
        for (int j = i + 1; j < n_mats; j++)
            if (!done[j] && moex_vk_mv_shareable(w[i], w[j])) {
                idx[m++] = j;
                done[j] = true;
            }
        if (dispatch_shared(c, w, y, idx, m, x, nw, eps, n, err)) return -1;
    }
    return 0;
}

/* Workgroups of the head with the argmax: each loops over row blocks and
 * pays the argmax epilogue (a fence and an atomic) once; 2048 fill any GPU.
 * The sync words cover both variants: mode 0 (8 rows a block, at most 2048
 * workgroups) and the staged mode 1 (at most VK_MV_PERSIST workgroups). */
static uint32_t argmax_groups(int64_t rows) {
    const uint32_t g = vk_ceil_div(rows, VK_MV_GROUPS);
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
    const int mode = mv_stageable(c->vk, w, x) ? 1 : 0;
    const uint32_t g0 = vk_mv_groups(c->vk, w->rows, 0),
                   groups = mode ? mv_grid(c->vk, w->rows, 1, true) : g0 < 2048 ? g0 : 2048;
    const vk_pipe *p = vk_pipeline(c->vk, VK_K_MV, w->type, mv_mode_of(c->vk, mode, w) | (nw ? VK_MV_NORM : 0), err);
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
    const vk_pipe *p = vk_pipeline(c->vk, VK_K_ELTWISE, 0, op, err);
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
    const vk_pipe *p = vk_pipeline(c->vk, VK_K_ARGMAX, 0, 0, err);
    if (!p) return -1;
    vk_pc pc = {.p = {x, out}, .u = {(uint32_t)n, (uint32_t)stride}};
    if (n_rows > 0) vk_dispatch(c, p, &pc, (uint32_t)n_rows, 1, 1);
    return 0;
}

int moex_vk_op_router_pick(moex_vk_cmd *c, moex_vk_pick pick, const moex_vk_matrix *w, moex_vk_ptr x, int64_t n, int k,
                           bool norm, moex_vk_ptr logits, moex_vk_ptr counter, moex_vk_ptr ids, moex_vk_ptr weights,
                           moex_error *err) {
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
    const bool tiled = pick == MOEX_VK_TILED || (pick == MOEX_VK_BY_N && n > VK_MV_NMAX);
    if (tiled) return vk_router_tiled(c, w, &pc, n, err);
    /* one dispatch, the last workgroup routes every token: one token (or, EACH,
     * each token as the grid's y) on the staged loop where x stages, else mode
     * 3 over groups of VK_MV_NMAX tokens */
    const bool each = pick == MOEX_VK_EACH;
    const bool staged = (each ? !c->vk->tune.each_unstaged : n == 1) && mv_stageable(c->vk, w, x);
    const uint32_t gy = staged ? (uint32_t)n : vk_ceil_div(n, VK_MV_NMAX);
    const vk_pipe *p = vk_pipeline(c->vk, VK_K_MV, w->type, vk_mv_mode(3, w) | (staged ? VK_MV_STAGE : 0), err);
    if (!p || vk_check_grid(1, gy, 1, err)) return -1;
    vk_dispatch(c, p, &pc, mv_grid(c->vk, w->rows, 3, staged), gy, 1);
    return 0;
}

int moex_vk_op_router(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, int64_t n, int k, bool norm,
                      moex_vk_ptr logits, moex_vk_ptr counter, moex_vk_ptr ids, moex_vk_ptr weights, moex_error *err) {
    return moex_vk_op_router_pick(c, MOEX_VK_BY_N, w, x, n, k, norm, logits, counter, ids, weights, err);
}

/* n tokens: the staged variant, each token the grid's y (each = true), or one token staged where x stages. */
static int norm_router(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, moex_vk_ptr nw, float eps, int64_t n,
                       bool each, int k, bool norm, moex_vk_ptr logits, moex_vk_ptr counter, moex_vk_ptr ids,
                       moex_vk_ptr weights, moex_vk_ptr xn, moex_error *err) {
    if (each ? check_norm_each(c, w, x, nw, n, err) : check_norm_fused(c, w, x, nw, err)) return -1;
    if (w->rows > VK_MAX_EXPERTS || k <= 0 || k > w->rows || !xn)
        return moex_fail(err, "vulkan: router over %lld experts choosing %d (at most %d experts; xn required)",
                         (long long)w->rows, k, VK_MAX_EXPERTS);
    if (n <= 0) return 0;
    const int stage = mv_stageable(c->vk, w, x) ? VK_MV_STAGE : 0;
    const vk_pipe *p = vk_pipeline(c->vk, VK_K_MV, w->type, vk_mv_mode(3, w) | VK_MV_NORM | stage, err);
    if (!p) return -1;
    vk_pc pc = vk_mat_pc(w, x, n, w->cols, logits, w->rows, xn);
    pc.p[1] = nw;
    pc.p[5] = ids;
    pc.p[6] = weights;
    pc.p[7] = counter;
    pc.u[5] = norm ? 2u : 0u;   /* bit 0 (add r) stays off: r is the xn output here */
    pc.u[6] = (uint32_t)k;
    pc.u[9] = vk_fbits(eps);
    vk_dispatch(c, p, &pc, mv_grid(c->vk, w->rows, 3, stage != 0), (uint32_t)n, 1);
    return 0;
}

int moex_vk_op_norm_router(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, moex_vk_ptr nw, float eps, int k,
                           bool norm, moex_vk_ptr logits, moex_vk_ptr counter, moex_vk_ptr ids, moex_vk_ptr weights,
                           moex_vk_ptr xn, moex_error *err) {
    return norm_router(c, w, x, nw, eps, 1, false, k, norm, logits, counter, ids, weights, xn, err);
}

int moex_vk_op_norm_router_each(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, moex_vk_ptr nw, float eps,
                                int64_t n, int k, bool norm, moex_vk_ptr logits, moex_vk_ptr counter, moex_vk_ptr ids,
                                moex_vk_ptr weights, moex_vk_ptr xn, moex_error *err) {
    return norm_router(c, w, x, nw, eps, n, true, k, norm, logits, counter, ids, weights, xn, err);
}
