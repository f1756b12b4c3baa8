/* The expert FFN of MoE layers: many experts in one dispatch, indexed by the
 * router's expert ids. Decode (a few tokens) runs the matrix-vector kernels
 * here; prompt batches take the tiled path in vk_mm.c. Several sequences'
 * tokens (moex_vk_op_experts_pick) take one token's kernels each, or the tiles. */
#include "kernels/vk/vk_internal.h"

static int check_experts(const moex_vk_experts *e, int k, moex_error *err) {
    if (vk_check_matrix(&e->gate, err) || vk_check_matrix(&e->up, err) || vk_check_matrix(&e->down, err)) return -1;
    if (e->gate.type != e->up.type || e->gate.rows != e->up.rows || e->gate.cols != e->up.cols ||
        e->gate.expert_stride != e->up.expert_stride || e->down.cols != e->gate.rows || e->down.rows != e->gate.cols)
        return moex_fail(err, "vulkan: expert gate/up/down shapes or types do not match");
    if (e->n_expert <= 0 || e->n_expert > VK_MAX_EXPERTS || k <= 0 || k > e->n_expert)
        return moex_fail(err, "vulkan: %d experts choosing %d (at most %d experts)", e->n_expert, k, VK_MAX_EXPERTS);
    if ((uint64_t)e->gate.expert_stride * (uint64_t)e->n_expert > UINT32_MAX ||
        (uint64_t)e->down.expert_stride * (uint64_t)e->n_expert > UINT32_MAX)
        return moex_fail(err, "vulkan: an expert tensor is over 4 GiB");
    return 0;
}

/* Input columns per position of experts_mv.comp (its PE). */
static int64_t ex_pe(moex_type t, bool generic) {
    return t == MOEX_TYPE_Q4_K && !generic ? 32 : t == MOEX_TYPE_Q6_K ? 16 : 8;
}

/* experts_xq.comp's records for the down half's input: uvec4s a position
 * (its PX_V4) by the down weights' type; 0 where the down half quantizes its
 * input itself. */
static int xq_v4(moex_type t) { return t == MOEX_TYPE_Q4_K ? 3 : t == MOEX_TYPE_Q6_K ? 2 : 0; }
static size_t xq_bytes(const moex_vk_experts *e, int64_t n, int k) {
    const moex_type t = e->down.type;
    return (size_t)n * (size_t)k * (size_t)(e->down.cols / ex_pe(t, false)) * (size_t)xq_v4(t) * 16;
}

size_t moex_vk_experts_scratch_pick(const moex_vk_experts *e, moex_vk_pick pick, int64_t n, int k) {
    size_t s = vk_experts_h_bytes(e, n, k);
    const bool tiled = pick == MOEX_VK_TILED || (pick == MOEX_VK_BY_N && n > VK_MV_NMAX);
    if (tiled) s += vk_experts_po_bytes(e, n, k) + ((size_t)(2 * e->n_expert) + (size_t)n * (size_t)k) * 4;
    else s += xq_bytes(e, n, k);
    return s;
}

size_t moex_vk_experts_scratch(const moex_vk_experts *e, int64_t n, int k) {
    return moex_vk_experts_scratch_pick(e, MOEX_VK_BY_N, n, k);
}

/* experts_mv.comp's mode bit for int8 activations: where its positions are Q4_K's or Q6_K's. */
static int ex_idot(const moex_vk *vk, moex_type t, bool generic) {
    return vk_idot(vk) && ex_pe(t, generic) != 8 ? VK_EX_IDOT : 0;
}

/* Positions per thread for npos positions over wg threads (more than the maximum: an outer loop). */
static int ex_ppt(int64_t npos, int wg) {
    const int64_t p = (npos + wg - 1) / wg;
    return p < 1 ? 1 : p > VK_EX_PPT_MAX ? VK_EX_PPT_MAX : (int)p;
}

/* ---- one token's Q4_K gate+up on experts_gu.comp ---- */

/* log2 of v >= 1, rounded down. */
static int log2_floor(int64_t v) {
    int l = 0;
    while (v >> (l + 1)) l++;
    return l;
}

/* experts_gu.comp fits these experts (for any number of tokens, each with one token's arithmetic). */
static bool gu_fits(const moex_vk *vk, const moex_vk_experts *e) {
    const moex_vk_matrix *g = &e->gate, *u = &e->up;
    const int64_t npos = g->cols / 32;
    if (vk->actq || vk->tune.gu_off || g->type != MOEX_TYPE_Q4_K || g->data % 16 || u->data % 16 ||
        g->expert_stride % 16 || npos > 1024 || (npos & (npos - 1)))
        return false;
    /* wg <= 1024 follows: npos * rl stays within the target (<= 1024), or rl is 1 */
    return vk_gu_shared_bytes(vk, vk_gu_shape_of(vk, (int)npos)) <= vk->info.shared_mem;
}

bool vk_gu_applies(const moex_vk *vk, const moex_vk_experts *e, int64_t n) { return n == 1 && gu_fits(vk, e); }

/* n tokens' pairs as the grid's y (pair p = t k + j), each with one token's arithmetic. */
static int dispatch_gu(moex_vk_cmd *c, const moex_vk_experts *e, moex_vk_ptr x, int64_t n, int k, moex_vk_ptr ids,
                       moex_vk_ptr h, moex_error *err) {
    const int lp = log2_floor(e->gate.cols / 32);   /* the positions: a power of two */
    const int mode = lp | (vk_idot(c->vk) ? VK_GU_IDOT : 0);
    const uint32_t gx = vk_ceil_div(e->gate.rows, vk_gu_shape_of(c->vk, 1 << lp).ch);
    if (vk_check_grid(gx, n * k, 1, err)) return -1;
    const vk_pipe *p = vk_pipeline(c->vk, VK_K_EXPERTS_GU, e->gate.type, mode, err);
    if (!p) return -1;
    vk_pc pc = {.p = {e->gate.data, e->up.data, x, h, ids},
                .u = {(uint32_t)e->gate.rows, (uint32_t)e->gate.cols, (uint32_t)e->gate.expert_stride, (uint32_t)k}};
    vk_dispatch(c, p, &pc, gx, (uint32_t)(n * k), 1);
    return 0;
}

/* The down half's input h (n k rows) quantized once into position records
 * (experts_xq.comp), where the down half takes int8 positions (VK_EX_IDOT)
 * of Q4_K or Q6_K: for batches of tokens with several experts each, whose
 * d / RT workgroups a token would each quantize its k n_ff inputs again; one
 * token's down half is faster without the extra dispatch (docs/PERF.md), and
 * a worker's rows (k = 1) quantize little each. ex_preq 0 never, 1
 * always. */
static bool xq_applies(const moex_vk *vk, const moex_vk_matrix *d, bool dgen, int64_t n, int k) {
    const int want = vk->tune.ex_preq;
    return (want > 0 || (want < 0 && n > 1 && k > 1)) && xq_v4(d->type) && !dgen && vk_idot(vk);
}

static int dispatch_xq(moex_vk_cmd *c, const moex_vk_matrix *d, moex_vk_ptr h, int64_t rows, moex_vk_ptr xq,
                       moex_error *err) {
    const int64_t npos = d->cols / ex_pe(d->type, false), records = rows * npos;
    if (vk_check_grid(vk_ceil_div(records, 64), 1, 1, err)) return -1;
    const vk_pipe *p = vk_pipeline(c->vk, VK_K_EXPERTS_XQ, d->type, 0, err);
    if (!p) return -1;
    vk_pc pc = {.p = {h, xq}, .u = {(uint32_t)records, (uint32_t)npos, (uint32_t)d->cols}};
    vk_dispatch(c, p, &pc, vk_ceil_div(records, 64), 1, 1);
    return 0;
}

/* Decode (n <= VK_MV_NMAX): experts_mv.comp's gate+up over every (token, slot)
 * pair (one token's Q4_K on experts_gu.comp where it applies), then its down
 * with the slot sum and the residual fused. halves: 1 gate+up, 2 down, 3 both
 * (one alone only to time it). each: any n, every token with one token's
 * kernels and workgroup shapes (batches of several sequences). */
int vk_experts_mv_halves(moex_vk_cmd *c, const moex_vk_experts *e, moex_vk_ptr x, int64_t n, int k, moex_vk_ptr ids,
                         moex_vk_ptr weights, moex_vk_ptr resid, moex_vk_ptr y, moex_vk_ptr h, int halves, bool each,
                         moex_error *err) {
    const moex_vk_matrix *g = &e->gate, *d = &e->down;
    /* 16-byte loads of Q4_K need the rows and every expert 16-byte aligned */
    const bool gq = g->type == MOEX_TYPE_Q4_K, dq = d->type == MOEX_TYPE_Q4_K;
    const bool ggen = gq && (g->data % 16 || e->up.data % 16 || g->expert_stride % 16);
    const bool dgen = dq && (d->data % 16 || d->expert_stride % 16);
    const bool many = !each && n >= VK_EX_MANY;
    const int64_t gpos = g->cols / ex_pe(g->type, ggen), dpos = (int64_t)k * (d->cols / ex_pe(d->type, dgen));
    const int gkind = vk_ex_kind(c->vk, 0, many, gpos), dkind = vk_ex_kind(c->vk, 1, many, dpos);
    const vk_ex_shape *gs = &c->vk->ex_shape[0][gkind], *ds = &c->vk->ex_shape[1][dkind];
    const int gppt = ex_ppt(gpos, gs->wg), dppt = ex_ppt(dpos, ds->wg);
    const uint32_t ggx = vk_ceil_div(g->rows, gs->rt), dgx = vk_ceil_div(d->rows, ds->rt);
    if (vk_check_grid(ggx, n * k, 1, err) || vk_check_grid(dgx, n, 1, err)) return -1;
    const bool gu = (halves & 1) && (each ? gu_fits(c->vk, e) : vk_gu_applies(c->vk, e, n));   /* experts_gu.comp */
    const bool xq = xq_applies(c->vk, d, dgen, n, k);
    const vk_pipe *pg = gu ? NULL
                           : vk_pipeline(c->vk, VK_K_EXPERTS_MV, g->type,
                                         VK_EX_MODE(0, ggen, gppt, gkind) | ex_idot(c->vk, g->type, ggen), err),
                  *pd = vk_pipeline(c->vk, VK_K_EXPERTS_MV, d->type,
                                    VK_EX_MODE(1, dgen, dppt, dkind) | ex_idot(c->vk, d->type, dgen) |
                                        (xq ? VK_EX_PREQ : 0),
                                    err);
    if ((!gu && !pg) || !pd) return -1;
    if (gu) {
        if (dispatch_gu(c, e, x, n, k, ids, h, err)) return -1;
    } else if (halves & 1) {
        if (vk_round_input(c, g->type, x, n, g->cols, &x, err)) return -1;
        vk_pc pc = vk_mat_pc(g, x, n, g->cols, h, g->rows, 0);
        pc.p[1] = e->up.data;
        pc.p[5] = ids;
        pc.u[6] = (uint32_t)k;
        vk_dispatch(c, pg, &pc, ggx, (uint32_t)(n * k), 1);
    }
    if (halves == 3) moex_vk_barrier(c);
    if (halves & 2) {
        moex_vk_ptr hq;
        if (xq) {   /* h's int8 positions once, not in each of the down half's workgroups */
            hq = h + vk_experts_h_bytes(e, n, k);
            if (dispatch_xq(c, d, h, n * k, hq, err)) return -1;
            moex_vk_barrier(c);
        } else if (vk_round_input(c, d->type, h, n * k, d->cols, &hq, err)) {
            return -1;
        }
        vk_pc pc = vk_mat_pc(d, hq, n, d->cols, y, d->rows, resid);
        pc.p[5] = ids;
        pc.p[6] = weights;
        pc.u[6] = (uint32_t)k;
        vk_dispatch(c, pd, &pc, dgx, (uint32_t)n, 1);
    }
    return 0;
}

int moex_vk_op_experts_pick(moex_vk_cmd *c, moex_vk_pick pick, const moex_vk_experts *e, moex_vk_ptr x, int64_t n,
                            int k, moex_vk_ptr ids, moex_vk_ptr weights, moex_vk_ptr resid, moex_vk_ptr y,
                            moex_vk_ptr scratch, moex_error *err) {
    if (check_experts(e, k, err)) return -1;   /* each path checks its own dispatch grid */
    if (!resid) return moex_fail(err, "vulkan: the expert FFN adds into a residual stream (resid required)");
    if (x % 16 || scratch % 16)   /* the kernels read x and h as vec4 */
        return moex_fail(err, "vulkan: the expert FFN's input and scratch must be 16-byte aligned on the GPU");
    if (n <= 0) return 0;
    const bool tiled = pick == MOEX_VK_TILED || (pick == MOEX_VK_BY_N && n > VK_MV_NMAX);
    if (!tiled) return vk_experts_mv_halves(c, e, x, n, k, ids, weights, resid, y, scratch, 3, pick == MOEX_VK_EACH, err);
    return vk_experts_tiled(c, e, x, n, k, ids, weights, resid, y, scratch, err);
}

int moex_vk_op_experts(moex_vk_cmd *c, const moex_vk_experts *e, moex_vk_ptr x, int64_t n, int k, moex_vk_ptr ids,
                       moex_vk_ptr weights, moex_vk_ptr resid, moex_vk_ptr y, moex_vk_ptr scratch, moex_error *err) {
    return moex_vk_op_experts_pick(c, MOEX_VK_BY_N, e, x, n, k, ids, weights, resid, y, scratch, err);
}
