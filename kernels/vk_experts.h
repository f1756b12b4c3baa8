/* Private to the Vulkan backend: the shape of experts_mv.comp's dispatches,
 * shared by vk_experts.c (grids) and vk_pipeline.c (the shader's #defines). */
#ifndef MOEX_VK_EXPERTS_H
#define MOEX_VK_EXPERTS_H

#include "kernels/kernels.h"

/* Threads and output rows per workgroup of the gate+up (GU) and down (DN)
 * halves; RU rows have their loads issued before any is used. Overridable at
 * build time to compare variants on a GPU. */
#ifndef VK_EX_GU_WG
#define VK_EX_GU_WG 64
#endif
#ifndef VK_EX_GU_RT
#define VK_EX_GU_RT 4
#endif
#ifndef VK_EX_DN_WG
#define VK_EX_DN_WG 256
#endif
#ifndef VK_EX_DN_RT
#define VK_EX_DN_RT 2
#endif
#ifndef VK_EX_RU
#define VK_EX_RU 2
#endif
#define VK_EX_PPT_MAX 4   /* input positions a thread holds in registers (more: an outer loop) */

/* experts_mv.comp modes: bit 0 the half, bit 1 generic positions (8 elements
 * through dq8: weights not 16-byte aligned), bits 2-3 positions per thread - 1. */
#define VK_EX_DOWN 1
#define VK_EX_GENERIC 2
#define VK_EX_MODE(down, generic, ppt) ((down) | ((generic) ? VK_EX_GENERIC : 0) | (((ppt) - 1) << 2))

/* The decode path of moex_vk_op_experts (n <= VK_MV_NMAX, arguments checked
 * by it); halves: 1 gate+up only, 2 down only (each alone to time it), 3 both. */
int vk_experts_mv_halves(moex_vk_cmd *c, const moex_vk_experts *e, moex_vk_ptr x, int64_t n, int k, moex_vk_ptr ids,
                         moex_vk_ptr weights, moex_vk_ptr resid, moex_vk_ptr y, moex_vk_ptr h, int halves,
                         moex_error *err);

#endif
