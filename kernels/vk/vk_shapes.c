/* The workgroup shapes and tiles each kernel takes on this device, from its
 * capabilities (subgroup size, shared memory, the matrix unit) and the tuning
 * switches (vk->tune, vk->ex_shape). vk_pipeline.c turns them into
 * specialization constants, the ops into their grids: both read them here,
 * so a shader and its dispatch always agree. */
#include "kernels/vk/vk_internal.h"

/* ---- mv.comp ---- */

int vk_mv_rpt(const moex_vk *vk, int mode) {
    if ((mode & 3) == 0) return 2;
    if ((mode & 3) == 3) return 1;
    return vk->tune.mv_rpt ? vk->tune.mv_rpt : VK_MV_RPT_STAGED;
}

int vk_mv_row_groups(const moex_vk *vk, int mode) {
    if ((mode & 3) != 1 && (mode & 3) != 2) return VK_MV_GROUPS;
    int g = vk->tune.mv_groups ? vk->tune.mv_groups : VK_MV_GROUPS_STAGED;
    while (g > 1 && g * vk->tpr > 1024) g /= 2;   /* workgroups of at most 1024 threads (desktop GPUs, lavapipe) */
    return g;
}

/* XMAX-wide rows of x the stage of mode (VK_MV_TOKENS) on type holds. f32 x:
 * two (~36 KiB) where the device has 48 KiB of shared memory, else one. int8 x
 * (VK_MV_IDOT, _mvunit.comp): 1.5 bytes a value (chunks, their padding, the
 * groups' scales and sums), Q6_K 1.75 (its chunks' sums too), as many as fit
 * beside the workgroup's reduction arrays (mv.comp's red, am_v, am_i: 12 bytes
 * a thread). */
int vk_mv_stage_copies(const moex_vk *vk, moex_type type, int mode) {
    if (!(mode & VK_MV_IDOT)) return vk->info.shared_mem >= 49152 ? 2 : 1;
    const int64_t per = type == MOEX_TYPE_Q6_K ? VK_MV_XMAX * 7 / 4 : VK_MV_XMAX * 3 / 2,
                  spare = (int64_t)vk->info.shared_mem - 12 * vk->tpr * vk_mv_row_groups(vk, mode) - 64,
                  copies = spare / per;
    return copies < 1 ? 1 : (int)copies;
}

uint32_t vk_mv_groups(const moex_vk *vk, int64_t rows, int mode) {
    return vk_ceil_div(rows, vk_mv_row_groups(vk, mode) * vk_mv_rpt(vk, mode));
}

bool vk_idot(const moex_vk *vk) {
    const int want = vk->tune.idot;
    return vk->info.int_dot && (want > 0 || (want < 0 && vk->info.int_dot_fast)) && !vk->actq;
}

/* ---- experts_mv.comp ---- */

/* One token: 8 rows per gate+up workgroup and down workgroups of 192
 * threads; a batch over many experts: 2 rows per workgroup, both loaded at
 * once (docs/PERF.md: inside a token the workgroup count weighs more than
 * the bytes). Few positions (a worker's row: one expert's 768 down inputs
 * are 24 Q4_K or 48 Q6_K positions, for 192 threads): one subgroup of 32
 * threads and 8 rows, so that a workgroup has work for its threads. */
const vk_ex_shape vk_ex_default_shapes[2][3] = {
    {{64, 8, 2}, {64, 2, 2}, {32, 8, 2}},    /* gate+up: one token, a batch, few positions */
    {{192, 4, 2}, {96, 2, 2}, {32, 8, 2}},   /* down */
};

/* One token whose positions would leave more than half of its workgroup's
 * threads idle takes the few-positions shape. The kind depends on the
 * weights and k alone, never on the batch, so a token's sums are the same in
 * any batch. */
int vk_ex_kind(const moex_vk *vk, int half, bool many, int64_t npos) {
    if (many) return VK_EX_BATCH;
    return npos < vk->ex_shape[half][VK_EX_ONE].wg / 2 ? VK_EX_FEW : VK_EX_ONE;
}

bool vk_ex_shape_ok(const moex_vk *vk, int half, vk_ex_shape s) {
    const int64_t nv = half == 0 ? 2 * s.rt : s.rt;   /* experts_mv.comp's red[NV * WG] */
    return s.wg >= 1 && s.wg <= 1024 && s.ru >= 1 && s.rt >= s.ru && s.rt <= s.wg && s.rt % s.ru == 0 &&
           nv * s.wg * 4 <= (int64_t)vk->info.shared_mem;
}

/* ---- experts_gu.comp ---- */

/* 32 rows per workgroup in row lanes of 256 threads at most (4 lanes of 64
 * positions for d = 2048, 8 rows a thread, 2 loaded at a time): small
 * workgroups, each with enough rows to amortise staging x and the final
 * reduction, suit one token's 8 experts and a batch's ~50 alike (docs/PERF.md,
 * "The gate+up's workgroup shape"). Rows per thread stay a power of two where a
 * row lane allows (the butterfly halves them); one row lane otherwise, whose
 * 2 ch sums outnumber any subgroup. A row's sum does not depend on the shape:
 * each thread dots one position, and the reduction's order is fixed by the
 * positions alone. */
vk_gu_shape vk_gu_shape_of(const moex_vk *vk, int npos) {
    const int target = vk->tune.gu_wg ? vk->tune.gu_wg : 256, ch = vk->tune.gu_ch ? vk->tune.gu_ch : 32;
    int rl = target / npos < ch ? target / npos : ch;
    while (rl > 1 && (ch % rl || ((ch / rl) & (ch / rl - 1)))) rl--;
    if (rl < 1) rl = 1;
    vk_gu_shape s = {.npos = npos, .rl = rl, .wg = npos * rl, .ch = ch, .ru = vk->tune.gu_ru ? vk->tune.gu_ru : 2};
    if (s.ru > ch / rl) s.ru = ch / rl;
    while ((ch / rl) % s.ru) s.ru--;
    s.subgroup = vk->use_subgroup && npos % vk->tpr == 0;
    return s;
}

size_t vk_gu_shared_bytes(const moex_vk *vk, vk_gu_shape s) {   /* experts_gu.comp's red[] and sums[] */
    const size_t nv = 2 * (size_t)s.ch / (size_t)s.rl, rv = nv < 4 ? nv : 4;
    return 4 * (s.subgroup ? (size_t)(s.wg / vk->tpr) * nv : rv * (size_t)s.wg + 2 * (size_t)s.ch);
}

/* ---- mm_coop.comp ---- */

/* Single shared tiles (two barriers per step) by default, double-buffered
 * (one barrier per step) with --vk-tune coop_nbuf=2 where the device's shared
 * memory holds two of each (docs/PERF.md: more shared memory costs workgroups
 * per SM); gate+up (two weight tiles) never fits two. */
int vk_coop_nbuf(const moex_vk *vk, int mode, int bk, int bn) {
    const uint32_t tile = (uint32_t)(bk / 8 + 1) * 16u;   /* one shared row, bytes */
    const uint32_t rows = (uint32_t)vk->tune.coop_bm * (mode == 1 ? 2u : 1u) + (uint32_t)bn;
    const uint32_t rest = 4u * vk->info.coop_m * vk->info.coop_n * 4u + (uint32_t)bn * 4u;   /* staging, row map */
    return vk->tune.coop_nbuf == 2 && 2u * rows * tile + rest <= vk->info.shared_mem ? 2 : 1;
}

/* ---- attn_coop.comp ---- */

/* Its shared memory: the K and V tiles (f16, rows of HDMAX + 8 halfs; Q
 * passes through them, or has its own rows under emulation), the scores
 * (f32) and P (f16) of every query row, and a factor per row. */
static size_t attn_coop_shared(uint32_t hdmax, uint32_t warps, uint32_t bc, bool emu) {
    const size_t br = 16 * warps, ldh = hdmax + 8, kv_rows = emu ? 2 * bc + br : (2 * bc > br ? 2 * bc : br);
    return kv_rows * ldh * 2 + br * (bc + 4) * 4 + br * (bc + 8) * 2 + br * 4;
}

/* Tiles (warps, keys) in order of preference: 64 rows (8 tokens x 8 q heads
 * for GQA 8) and 32 keys where the memory allows (48 KiB; docs/PERF.md),
 * smaller ones for emulation on 32 KiB. */
static const uint32_t coop_tiles[][2] = {{4, 32}, {2, 32}, {4, 16}, {2, 16}};

int vk_attn_coop_config(const moex_vk *vk, int mode, uint32_t *warps, uint32_t *bc) {
    for (int i = 0; i < 4; i++)
        if (attn_coop_shared(64u << mode, coop_tiles[i][0], coop_tiles[i][1], vk->info.coop != 1) <=
            vk->info.shared_mem) {
            *warps = coop_tiles[i][0];
            *bc = coop_tiles[i][1];
            return 0;
        }
    return -1;
}
