/* Hooks into the Vulkan backend's choices of kernel and workgroup shape, for
 * its tests (tests/vk) and benchmarks (bench/), not for the engine: the edges
 * the tests probe, the switches the environment sets when a device is
 * created (here per device, at any time), and the expert FFN's workgroup
 * shapes. A setter drops the pipelines its setting changes (after waiting
 * for the device), so the next recording creates them anew. */
#ifndef MOEX_VK_TESTING_H
#define MOEX_VK_TESTING_H

#include "kernels/vk/vk.h"
#include "kernels/vk/vk_variants.h"   /* VK_MV_NMAX, VK_MV_XMAX, VK_MAX_EXPERTS */

/* mv.comp's staged one-token modes run at most this many workgroups, each looping over row blocks. */
#define VK_MV_PERSIST 1024
/* Prompts of fewer tokens keep their attention on the f32 tiles: their
 * attention costs little, and f16 Q, K, V and P move the logits off the CPU
 * backend's by as much as its 8-bit activation rounding (test_vk_forward's
 * 20-token prompt: relative error 0.013 against 0.007 with the f32 tiles). */
#define VK_ATTN_COOP_MIN 32

/* The decode products' int8 activations (vk_internal.h vk_idot): whether they
 * are taken now, and their switch (--vk-tune idot): 1 wherever the device has
 * integer dot products, 0 never, -1 where it has them in hardware. */
bool moex_vk_testing_idot(const moex_vk *vk);
/* How long a submit's wait polls its fence (us) as the options resolved on this device. */
int moex_vk_testing_spin_us(const moex_vk *vk);
void moex_vk_testing_set_idot(moex_vk *vk, int idot);
/* The expert down half's int8 input: quantized once by experts_xq.comp (1
 * always, -1 the default: batches of several tokens of several experts) or
 * in every workgroup (0); returns the setting it
 * replaces. */
int moex_vk_testing_set_ex_preq(moex_vk *vk, int preq);
/* The workgroups of a batch's staged products in all (--vk-tune mv_batch_wg; 0:
 * each token's own); returns the setting it replaces. */
int moex_vk_testing_set_mv_batch_wg(moex_vk *vk, int wg);
/* Prompt attention on the split-K path instead of the tiles (the tests). */
void moex_vk_testing_set_attn_simple(moex_vk *vk, bool on);

/* experts_mv.comp's workgroup for one half: wg threads, rt output rows, ru
 * rows whose weight loads are issued together. Each half has three kinds: 0
 * a token's, 1 a batch's (at least 4 tokens), 2 a token's with few positions
 * (fewer than half the threads of kind 0: one expert's down half, as a
 * worker's rows); --vk-tune ex_shape sets them. */
typedef struct moex_vk_ex_shape {
    int wg, rt, ru;
} moex_vk_ex_shape;
moex_vk_ex_shape moex_vk_testing_ex_default(int half, int kind);   /* half: 0 gate+up, 1 down */
moex_vk_ex_shape moex_vk_testing_ex_shape(const moex_vk *vk, int half, int kind);
/* The kind a half takes for npos positions (k experts x a row's positions). */
int moex_vk_testing_ex_kind(const moex_vk *vk, int half, bool many, int64_t npos);
/* s fits experts_mv.comp on vk: rows divide into load groups, no more rows
 * than threads, the reduction in shared memory. */
bool moex_vk_testing_ex_shape_ok(const moex_vk *vk, int half, moex_vk_ex_shape s);
void moex_vk_testing_set_ex_shape(moex_vk *vk, int half, int kind, moex_vk_ex_shape s);

/* experts_gu.comp's workgroup for rows of npos 32-column positions: ch rows in
 * rl row lanes of npos threads (wg = npos * rl), ru rows a thread loads
 * together, subgroup sums where a subgroup lies within a row lane. */
typedef struct moex_vk_gu_shape {
    int npos, rl, wg, ru, ch;
    bool subgroup;
} moex_vk_gu_shape;
moex_vk_gu_shape moex_vk_testing_gu_shape(const moex_vk *vk, int npos);
/* Whether experts_gu.comp takes e's gate+up for n tokens (one token of 16-byte aligned Q4_K). */
bool moex_vk_testing_gu_applies(const moex_vk *vk, const moex_vk_experts *e, int64_t n);
/* Its tuning (--vk-tune gu_wg, gu_ru, gu_ch; 0: the default) and
 * off (the gate+up on experts_mv.comp). */
void moex_vk_testing_set_gu(moex_vk *vk, int wg, int ru, int ch, bool off);

/* The decode path of moex_vk_op_experts (n <= VK_MV_NMAX) with only some of
 * its halves, to time each alone: 1 gate+up, 2 down, 3 both; each: every
 * token on one token's kernels (MOEX_VK_EACH, a batch of sequences). */
int moex_vk_testing_experts_halves(moex_vk_cmd *c, const moex_vk_experts *e, moex_vk_ptr x, int64_t n, int k,
                                   moex_vk_ptr ids, moex_vk_ptr weights, moex_vk_ptr resid, moex_vk_ptr y,
                                   moex_vk_ptr scratch, int halves, bool each, moex_error *err);

#endif
