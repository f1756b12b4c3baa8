/* Private to the Vulkan backend: the shape of experts_mv.comp's dispatches,
 * shared by vk_experts.c (grids) and vk_pipeline.c (the shader's #defines). */
#ifndef MOEX_VK_EXPERTS_H
#define MOEX_VK_EXPERTS_H

#include "kernels/vk/vk_internal.h"

/* Shapes (vk_ex_shape, vk_internal.h) by [half (0 gate+up, 1 down)][batch of
 * at least VK_EX_MANY tokens], measured rather than derived: on an H200 one
 * token wants fewer, wider workgroups than the bytes suggest, a batch over
 * many experts short ones of 2 rows. Each device starts from these defaults,
 * the best measured on an H200 (docs/PERF.md); tests change a device's ex_shape to compare variants, then
 * call vk_experts_forget(). */
#define VK_EX_MANY 4
extern const vk_ex_shape vk_ex_default_shapes[2][2];
/* s fits experts_mv.comp on vk for half (0 gate+up, 1 down): rows divide
 * into load groups, no more rows than threads, the reduction in shared memory. */
bool vk_ex_shape_ok(const moex_vk *vk, int half, vk_ex_shape s);
#define VK_EX_PPT_MAX 4   /* input positions a thread holds in registers (more: an outer loop) */

/* experts_mv.comp modes: bit 0 the half, bit 1 generic positions (8 elements
 * through dq8: weights not 16-byte aligned), bits 2-3 positions per thread - 1,
 * bit 4 the batch shape (ex_shape[half][1]), bit 5 int8 activations (IDOT). */
#define VK_EX_DOWN 1
#define VK_EX_GENERIC 2
#define VK_EX_MANY_BIT 16
#define VK_EX_IDOT 32
_Static_assert(VK_MODES > (VK_EX_IDOT | VK_EX_MANY_BIT | 15), "experts_mv.comp modes fit the pipeline table");
#define VK_EX_MODE(down, generic, ppt, many) \
    ((down) | ((generic) ? VK_EX_GENERIC : 0) | (((ppt) - 1) << 2) | ((many) ? VK_EX_MANY_BIT : 0))
#define VK_EX_MODE_SHAPE(vk, mode) (&(vk)->ex_shape[(mode) & VK_EX_DOWN][((mode) & VK_EX_MANY_BIT) != 0])

/* The decode path of moex_vk_op_experts (n <= VK_MV_NMAX, arguments checked
 * by it); halves: 1 gate+up only, 2 down only (each alone to time it), 3 both. */
int vk_experts_mv_halves(moex_vk_cmd *c, const moex_vk_experts *e, moex_vk_ptr x, int64_t n, int k, moex_vk_ptr ids,
                         moex_vk_ptr weights, moex_vk_ptr resid, moex_vk_ptr y, moex_vk_ptr h, int halves,
                         moex_error *err);

/* experts_gu.comp's modes: bits 0-3 log2 of a row's 32-column positions, bit
 * 4 int8 activations (IDOT). */
#define VK_GU_IDOT 16
_Static_assert(VK_MODES > (VK_GU_IDOT | 15), "experts_gu.comp modes fit the pipeline table");
/* experts_gu.comp's workgroup for rows of npos 32-column positions: ch rows in rl row lanes of npos threads (wg
 * = npos * rl, ch / rl rows a thread), ru rows a thread loads together,
 * subgroup sums where a subgroup lies within a row lane. */
typedef struct vk_gu_shape {
    int npos, rl, wg, ru, ch;
    bool subgroup;
} vk_gu_shape;
vk_gu_shape vk_gu_shape_of(const moex_vk *vk, int npos);
/* experts_gu.comp takes n tokens' gate+up: one token, Q4_K on 16-byte aligned
 * rows, a power-of-two count of positions that fits a workgroup, activation
 * rounding off (h is written unrounded; the down half rounds it). */
bool vk_gu_applies(const moex_vk *vk, const moex_vk_experts *e, int64_t n);

/* Drops this device's experts_mv and experts_gu pipelines (after its ex_shape
 * or gu tuning changed; waits for the device). */
void vk_experts_forget(moex_vk *vk);

#endif
