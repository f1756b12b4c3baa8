/* Tiled matrix-matrix products for prompt batches (more than VK_MV_NMAX
 * tokens): dense products, the router's logits and the expert FFN grouped by
 * expert (mm_coop.comp or mm.comp), with the expert FFN's scratch layout. */
#include <stdlib.h>

#include "kernels/vk/vk_internal.h"

#define MM_TILE 64   /* BM = BN of mm.comp */
#define MM_SMALL 32  /* ... with the VK_MM_SMALL flag */
/* Column slices of the router's tiles (VK_MM_SMALL), each summed by its own
 * workgroup into its own copy of the logits: 128 experts make 4 row tiles, so
 * without them a 32-token prompt ran 4 workgroups over all 2,048 columns. */
#define ROUTER_SPLITS 8

/* The tensor-core kernel (mm_coop.comp, f16 inputs, f32 sums) where the device
 * has it, except for f32 weights (the router: expert choices stay as exact as
 * the f32 tiles make them) and with activation rounding on: that mode tracks
 * the CPU's 8-bit products to ~1e-7, and any f16 perturbation flips later
 * roundings (whole-model logits then differ at the ~1.5e-2 quantization-noise
 * level, measured on the test model). */
static bool use_coop(const moex_vk *vk, moex_type t) {
    return vk->info.coop && !vk->actq && t != MOEX_TYPE_F32;
}

/* Kernel, mode and tile of one tiled product. */
typedef struct mm_kind {
    vk_kernel k;
    int bm, bn;
} mm_kind;

static mm_kind mm_kind_of(const moex_vk *vk, moex_type t) {
    if (use_coop(vk, t)) return (mm_kind){VK_K_MM_COOP, vk->tune.coop_bm, VK_COOP_BN};
    return (mm_kind){VK_K_MM, MM_TILE, MM_TILE};
}

/* mm_coop.comp reads Q4_K blocks 16 bytes at a time: weights (each expert's
 * too) that are not 16-byte aligned take its generic path. */
static int coop_flags(moex_type t, moex_vk_ptr a, moex_vk_ptr b, size_t stride) {
    return t == MOEX_TYPE_Q4_K && (a % 16 || b % 16 || stride % 16) ? VK_COOP_GENERIC : 0;
}

/* The pipeline of mk (flags: mm_coop.comp's, ignored by the f32 tiles), or
 * (when the driver refuses the cooperative-matrix pipeline) the f32 tiles
 * from then on, with a warning. */
static const vk_pipe *mm_pipeline(moex_vk *vk, mm_kind *mk, moex_type t, int mode, int flags, moex_error *err) {
    const vk_pipe *p = vk_pipeline(vk, mk->k, t, mk->k == VK_K_MM_COOP ? mode | flags : mode, err);
    if (p || mk->k != VK_K_MM_COOP) return p;   /* (the fallback's mm_kind_of resets a narrow tile's bn) */
    moex_log(MOEX_LOG_WARN, "vulkan: %s; prompts use the f32 tiles (--vk-tune coop=off skips this attempt)", err->msg);
    vk->info.coop = 0;
    *mk = mm_kind_of(vk, t);
    return vk_pipeline(vk, mk->k, t, mode, err);
}

/* Few row tiles (k and v: 512 rows) leave most SMs idle under 64-token
 * tiles: 32-token ones double the workgroups (where there is more than one
 * 64-token tile to split). --vk-tune coop_narrow=0 keeps 64, for comparisons. */
static bool coop_narrow(const moex_vk *vk, const mm_kind *mk, int64_t rows, int64_t n) {
    if (mk->k != VK_K_MM_COOP || n <= VK_COOP_BN || vk->tune.coop_wide) return false;
    return (int64_t)vk_ceil_div(rows, mk->bm) * vk_ceil_div(n, mk->bn) < VK_COOP_FEW;
}

int vk_matmul_tiled(moex_vk_cmd *c, const moex_vk_matrix *w, const vk_pc *pc, int64_t n, moex_error *err) {
    mm_kind mk = mm_kind_of(c->vk, w->type);
    int flags = coop_flags(w->type, w->data, w->data, 0);
    if (coop_narrow(c->vk, &mk, w->rows, n)) {
        flags |= VK_COOP_NARROW;
        mk.bn = 32;
    }
    const vk_pipe *p = mm_pipeline(c->vk, &mk, w->type, 0, flags, err);
    if (!p || vk_check_grid(vk_ceil_div(w->rows, mk.bm), vk_ceil_div(n, mk.bn), 1, err)) return -1;
    vk_dispatch(c, p, pc, vk_ceil_div(w->rows, mk.bm), vk_ceil_div(n, mk.bn), 1);
    return 0;
}

/* Room for the slices whatever n: a batch's tiled tokens may be few. */
size_t moex_vk_router_logits_bytes(int64_t n, int64_t n_expert) {
    return (size_t)n * (size_t)n_expert * 4 * (1 + ROUTER_SPLITS);
}

/* The router of a batch: its logits on the f32 tiles (expert choices as exact
 * as f32 makes them) in 32 x 32 tiles, each of ROUTER_SPLITS column slices
 * summed apart (after the logits), then per token the slices' sums added in
 * order and top-k. It has few rows (128 experts): 64 x 64 tiles would leave
 * most of the GPU idle (16 workgroups for 512 tokens; docs/PERF.md). A
 * token's logits do not depend on the batch's other tokens. */
int vk_router_tiled(moex_vk_cmd *c, const moex_vk_matrix *w, const vk_pc *pc, int64_t n, moex_error *err) {
    const uint32_t gx = vk_ceil_div(w->rows, MM_SMALL), gy = vk_ceil_div(n, MM_SMALL);
    const vk_pipe *pm = vk_pipeline(c->vk, VK_K_MM, w->type, VK_MM_SMALL, err), *pt = vk_pipeline(c->vk, VK_K_TOPK, 0, 0, err);
    if (!pm || !pt || vk_check_grid(gx, gy, ROUTER_SPLITS, err) || vk_check_grid(n, 1, 1, err)) return -1;
    vk_pc ps = *pc;
    ps.u[7] = ROUTER_SPLITS;   /* estride: the slices topk.comp adds */
    vk_dispatch(c, pm, pc, gx, gy, ROUTER_SPLITS);
    moex_vk_barrier(c);
    vk_dispatch(c, pt, &ps, (uint32_t)n, 1, 1);
    return 0;
}

size_t vk_experts_h_bytes(const moex_vk_experts *e, int64_t n, int k) {
    return ((size_t)n * (size_t)k * (size_t)e->gate.rows * 4 + 255) & ~(size_t)255;
}
size_t vk_experts_po_bytes(const moex_vk_experts *e, int64_t n, int k) {
    return ((size_t)n * (size_t)k * (size_t)e->down.rows * 4 + 255) & ~(size_t)255;
}

/* Batches: group pairs by expert, tiled gate+up and down per expert, then fold the slots in order. */
int vk_experts_tiled(moex_vk_cmd *c, const moex_vk_experts *e, moex_vk_ptr x, int64_t n, int k, moex_vk_ptr ids,
                      moex_vk_ptr weights, moex_vk_ptr resid, moex_vk_ptr y, moex_vk_ptr scratch, moex_error *err) {
    const moex_vk_ptr h = scratch, po = h + vk_experts_h_bytes(e, n, k), meta = po + vk_experts_po_bytes(e, n, k);
    moex_vk_ptr hq;
    /* An expert gets at most n pairs (its tokens choose it once): n / bn tiles along the pairs. */
    mm_kind kg = mm_kind_of(c->vk, e->gate.type), kd = mm_kind_of(c->vk, e->down.type);
    const int fg = coop_flags(e->gate.type, e->gate.data, e->up.data, e->gate.expert_stride),
              fd = coop_flags(e->down.type, e->down.data, e->down.data, e->down.expert_stride);
    const vk_pipe *ps = vk_pipeline(c->vk, VK_K_MOE_SORT, 0, 0, err), *pg = mm_pipeline(c->vk, &kg, e->gate.type, 1, fg, err),
                  *pd = pg ? mm_pipeline(c->vk, &kd, e->down.type, 2, fd, err) : NULL,
                  *pc_ = vk_pipeline(c->vk, VK_K_MOE_COMBINE, 0, 0, err);
    if (!ps || !pg || !pd || !pc_ || vk_check_grid(vk_ceil_div(e->down.rows, kd.bm), vk_ceil_div(n, kd.bn), e->n_expert, err) ||
        vk_check_grid(vk_ceil_div(e->gate.rows, kg.bm), vk_ceil_div(n, kg.bn), e->n_expert, err))
        return -1;
    if (vk_round_input(c, e->gate.type, x, n, e->gate.cols, &x, err)) return -1;
    vk_pc sort = {.p = {ids, meta}, .u = {(uint32_t)(n * k), (uint32_t)e->n_expert}};
    vk_dispatch(c, ps, &sort, 1, 1, 1);
    moex_vk_barrier(c);
    vk_pc pc = vk_mat_pc(&e->gate, x, n, e->gate.cols, h, e->gate.rows, 0);
    pc.p[1] = e->up.data;
    pc.p[5] = meta;
    pc.u[6] = (uint32_t)k;
    pc.u[8] = (uint32_t)e->n_expert;
    vk_dispatch(c, pg, &pc, vk_ceil_div(e->gate.rows, kg.bm), vk_ceil_div(n, kg.bn), (uint32_t)e->n_expert);
    moex_vk_barrier(c);
    if (vk_round_input(c, e->down.type, h, n * k, e->down.cols, &hq, err)) return -1;
    pc = vk_mat_pc(&e->down, hq, n, e->down.cols, po, e->down.rows, 0);
    pc.p[5] = meta;
    pc.p[6] = weights;
    pc.u[6] = (uint32_t)k;
    pc.u[8] = (uint32_t)e->n_expert;
    vk_dispatch(c, pd, &pc, vk_ceil_div(e->down.rows, kd.bm), vk_ceil_div(n, kd.bn), (uint32_t)e->n_expert);
    moex_vk_barrier(c);
    vk_pc comb = {.p = {po, resid, y}, .u = {(uint32_t)e->down.rows, (uint32_t)k}};
    vk_dispatch(c, pc_, &comb, vk_ceil_div(e->down.rows, 256), (uint32_t)n, 1);
    return 0;
}
