/* Numbers shared by the Vulkan backend's C files and its shaders (plain
 * #defines that C, GLSL and kernels/vk/shaders/variants.cmake all read): the
 * limits the shaders size arrays by, and the mode bits of the kernels. A
 * kernel's mode picks its variant: the bits that change a shader's code are
 * compiled into separate SPIR-V at build time (VARIANT in the shaders,
 * variants.cmake lists the combinations), the others only choose
 * specialization constants when the pipeline is created (vk_pipeline.c). */
#ifndef MOEX_VK_VARIANTS_H
#define MOEX_VK_VARIANTS_H

#define VK_MODES 256            /* modes per kernel and weight type (the pipeline table's last index) */
#define VK_MV_NMAX 8            /* tokens per matrix-vector dispatch; more go to the tiled kernels */
#define VK_MAX_EXPERTS 512      /* shared-memory arrays of the router and the expert grouping */
#define VK_ATTN_MAX_SPLITS 64   /* key splits of the decode attention at most (vk_attn.c, attn_dec.comp's merge) */
#define VK_MV_XMAX 4096         /* widest x mv.comp stages in shared memory (modes 1, 2); wider takes mode 0 */
#define VK_ATTN_POS_KEYS 48     /* keys per split of the decode attention's indirect dispatch (vk_attn.c, attn_dec.comp) */

/* qkrope.comp, attn_dec.comp (their flags word) and attn.comp, attn_coop.comp
 * (theirs): positions and KV rows per token from a table of (pos, base)
 * pairs, base the token's sequence's first cache row, instead of params[0] + t
 * in one sequence's rows 0.. (several sequences in one batch). */
#define VK_ATTN_TOKENS 8
/* attn_dec.comp with VK_ATTN_TOKENS, when several tokens of one sequence
 * decode in one dispatch (a speculative verify): a first dispatch with
 * APPEND_ONLY writes every token's new key and value to the caches and
 * nothing else, a second with NO_APPEND attends (each token reading the
 * earlier ones' rows from the caches: the values its own fused step would
 * have appended, so the same bits as one token at a time). */
#define VK_ATTN_APPEND_ONLY 16
#define VK_ATTN_NO_APPEND 32

/* mv.comp: mode & 3 is MODE (0 products, 1 one token staged, 2 up to three
 * matrices staged, 3 the router), with these flags: */
#define VK_MV_GENERIC 4   /* 8-element dq8 units (Q4_K or f32 weights not 16-byte aligned) */
#define VK_MV_NORM 8      /* RMSNorm of x fused (modes 0 to 3, one token) */
#define VK_MV_STAGE 16    /* the router (mode 3, one token) on the staged loop of mode 1 */
#define VK_MV_IDOT 32     /* modes 1 and 2 on Q4_K and Q6_K stage x as int8 (vk_idot) */
#define VK_MV_TOKENS 64   /* mode 1 with the norm: several tokens a workgroup (vk_mv_stage_copies) */
#define VK_MV_TPW 4       /* tokens a VK_MV_TOKENS workgroup takes at most with f32 x (a 36 KiB stage) */
#define VK_MV_TPW_I8 8    /* with int8 x (VK_MV_IDOT: 3 KiB a token of 2,048 values) */

/* mm.comp: mode & 3 is MODE (0 products, 1 experts gate+up, 2 experts down); */
#define VK_MM_SMALL 4     /* 32 x 32 tiles (products with few rows) */

/* mm_coop.comp: MODE as mm.comp's; */
#define VK_COOP_GENERIC 4   /* Q4_K weights not 16-byte aligned, read through dq8 */
#define VK_COOP_NARROW 8    /* 32-token tiles, for dense products with few row tiles (a specialization only) */

/* experts_mv.comp: bit 0 the half, bit 1 generic positions (8 elements
 * through dq8: weights not 16-byte aligned), bits 2-3 positions per thread -
 * 1 and bit 4 the batch shape (specializations only), bit 5 int8 activations,
 * bit 6 (down, int8) the input as experts_xq.comp's position records, bit 7
 * the shape for few positions (a specialization only). */
#define VK_EX_DOWN 1
#define VK_EX_GENERIC 2
#define VK_EX_MANY_BIT 16
#define VK_EX_IDOT 32
#define VK_EX_PREQ 64
#define VK_EX_FEW_BIT 128

/* experts_gu.comp: bits 0-3 log2 of a row's 32-column positions (a
 * specialization only), bit 4 int8 activations. */
#define VK_GU_IDOT 16

#endif
