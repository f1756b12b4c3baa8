/* Private to the Vulkan backend (kernels/vk/vk_*.c): the device context, the
 * pipeline table and the push-constant block every kernel shares. */
#ifndef MOEX_VK_INTERNAL_H
#define MOEX_VK_INTERNAL_H

#include <vulkan/vulkan.h>

#include "kernels/vk/vk.h"

/* Every kernel's push constants: 8 device addresses then 12 words (floats as
 * their bits). Each shader names the slots its own way; unused ones are 0. */
typedef struct vk_pc {
    uint64_t p[8];
    uint32_t u[12];
} vk_pc;
_Static_assert(sizeof(vk_pc) == 112, "push constants must fit the 128 bytes every device has");

/* experts_mv.comp's workgroup for one half: wg threads, rt output rows, ru
 * rows whose weight loads are issued together before any is used (the next
 * ru rows' loads are in flight while these are used). vk_experts.h. */
typedef struct vk_ex_shape {
    int wg, rt, ru;
} vk_ex_shape;

typedef enum vk_kernel {
    VK_K_DEQUANT, VK_K_MV, VK_K_MM, VK_K_TOPK, VK_K_RMSNORM, VK_K_QKROPE, VK_K_ATTN, VK_K_ATTN_MERGE,
    VK_K_MOE_SORT, VK_K_MOE_COMBINE, VK_K_ELTWISE, VK_K_ARGMAX, VK_K_ACTQ,
    VK_K_EXPERTS_MV,   /* experts_mv.comp: the decode expert FFN */
    VK_K_MM_COOP,      /* mm_coop.comp: prompt-batch products on cooperative matrices */
    VK_K_ATTN_COOP,    /* attn_coop.comp: prompt-batch attention on cooperative matrices (vk_attn.c) */
    VK_K_ATTN_DEC,     /* attn_dec.comp: one decode token's whole attention step */
    VK_K_EXPERTS_GU,   /* experts_gu.comp: one decode token's expert gate+up on Q4_K */
    VK_K_COUNT
} vk_kernel;

#define VK_MODES 64         /* variants per kernel and type (experts_mv.comp uses 6 mode bits) */
#define VK_MV_NMAX 8        /* tokens per matrix-vector dispatch; more go to the tiled kernel */
#define VK_ATTN_MAX_SPLITS 64   /* key splits of the decode attention at most (vk_attn.c, attn_dec.comp's merge) */
#define VK_MV_GROUPS 4      /* row groups (of tpr threads) per mv.comp workgroup; the staged modes: below */
#define VK_MV_GENERIC 4     /* mv.comp mode flag: 8-element dq8 units (weights not 16-byte aligned) */
#define VK_MV_NORM 8        /* mv.comp mode flag: RMSNorm of x fused (sum(x^2) in the product loop; modes 0 and 3, one token) */
/* Weight rows per row group of mv.comp: plain products reuse each x load for
 * two rows (and keep both rows' loads in flight); the router (mode 3) has few
 * rows; the staged one-token modes 1 and 2 take VK_MV_RPT_STAGED rows per row
 * group and VK_MV_GROUPS_STAGED row groups per workgroup (MOEX_VK_MV_RPT=1..8
 * and MOEX_VK_MV_GROUPS=1..32 override them, for tuning). One row per group,
 * 8 groups: decode 8 % faster on an H200 than 2 x 4 (docs/PERF.md, session 5),
 * although the q product alone is slower (7.6 against 5.8 µs). */
#define VK_MV_RPT_STAGED 1
#define VK_MV_GROUPS_STAGED 8
int vk_mv_rpt(const moex_vk *vk, int mode);
int vk_mv_row_groups(const moex_vk *vk, int mode);   /* row groups per workgroup of mv.comp's mode */
#define VK_MV_XMAX 4096     /* widest x mv.comp stages in shared memory (modes 1, 2); wider takes mode 0 */
#define VK_MV_STAGE 16      /* mv.comp mode flag: the router (mode 3, one token) on the staged loop of mode 1 */
#define VK_MV_IDOT 32       /* mv.comp mode flag: modes 1 and 2 on Q4_K stage x as int8 (vk_idot) */
_Static_assert(VK_MODES > (3 | VK_MV_GENERIC | VK_MV_NORM | VK_MV_STAGE | VK_MV_IDOT), "mv.comp modes fit the pipeline table");
#define VK_MV_PERSIST 1024  /* most workgroups of the staged modes (they loop over row blocks) */
#define VK_MAX_EXPERTS 512  /* shared-memory arrays of the router and the expert grouping */
#define VK_TYPE_SLOTS 32    /* moex_type ids fit below this after vk_type_slot() */
#define VK_MM_SMALL 4       /* mm.comp mode flag: 32 x 32 tiles (products with few rows) */
/* mm_coop.comp: a workgroup of 4 warps computes coop_bm (struct moex_vk:
 * VK_COOP_BM, or 128 with MOEX_VK_COOP_BM=128) weight rows x VK_COOP_BN
 * tokens, VK_COOP_BK columns per step (vk_mm.c sizes the grids). 64 rows keep
 * the gate+up variant at 8 accumulators per warp: more workgroups per SM to
 * hide the dequantization's load latency. 64 columns per step: one Q4_K
 * group, half as many barriers as 32. */
#define VK_COOP_BM 64
#define VK_COOP_BN 64
#define VK_COOP_BK 64
#define VK_COOP_GENERIC 4   /* mm_coop.comp mode flag: Q4_K weights not 16-byte aligned, read through dq8 */
#define VK_COOP_NARROW 8    /* mm_coop.comp mode flag: 32-token tiles, for dense products with few row tiles */
#define VK_COOP_FEW 256     /* dense products with fewer 64 x 64 tiles than this take the 32-token tiles */

/* Embedded GLSL sources (generated from kernels/vk/shaders/ by CMake). */
typedef struct vk_shader_src {
    const char *name, *text;
} vk_shader_src;
extern const vk_shader_src moex_vk_shader_sources[];
extern const int moex_vk_shader_source_count;

/* Switches for comparing kernel variants (docs/PERF.md), read from the
 * environment once when the device is created (vk_device.c read_tuning). */
typedef struct vk_tuning {
    bool attn_simple;    /* MOEX_VK_ATTN_SIMPLE=1: prompt attention on the split-K path */
    bool attn_no_coop;   /* MOEX_VK_ATTN_NO_COOP=1: prompt attention on f32 tiles */
    bool coop_wide;      /* MOEX_VK_COOP_NARROW=0: dense coop products keep 64-token tiles */
    int coop_bk;         /* MOEX_VK_COOP_BK: mm_coop.comp columns per step, VK_COOP_BK or 32 */
    int coop_nbuf;       /* MOEX_VK_COOP_NBUF: 2 asks for double-buffered coop tiles, else 1 */
    int mv_rpt;          /* MOEX_VK_MV_RPT: rows per thread of the staged one-token products (1-8), 0: default */
    int mv_groups;       /* MOEX_VK_MV_GROUPS: row groups per workgroup of those products (1-32), 0: default */
    bool gu_off;         /* MOEX_VK_GU=0: one token's Q4_K gate+up on experts_mv.comp instead of experts_gu.comp */
    int gu_wg, gu_ru;    /* MOEX_VK_GU_WG (64-1024), MOEX_VK_GU_RU (1-16): experts_gu.comp's shape, 0: default */
    int gu_ch;           /* MOEX_VK_GU_CH (16, 32, 48, 64): experts_gu.comp's rows per workgroup, 0: default */
    int idot;            /* MOEX_VK_IDOT: the decode products' int8 activations (vk_idot): 0 off, 1 wherever the
                          * device has integer dot products, unset (-1) where it has them in hardware */
} vk_tuning;

typedef struct moex_vk_buffer {
    moex_vk *vk;
    VkBuffer buf;
    VkDeviceMemory mem;
    VkDeviceAddress addr;
    size_t size;
    void *map;            /* host pointer when the memory is host visible */
} moex_vk_buffer;

struct moex_vk {
    VkInstance inst;
    VkPhysicalDevice pd;
    VkDevice dev;
    VkQueue queue;
    uint32_t qfam;
    VkCommandPool pool;
    VkPipelineLayout layout;
    VkPipelineCache pcache;
    VkPhysicalDeviceMemoryProperties memprops;
    moex_vk_info info;
    uint32_t api_version;
    int tpr;                      /* threads per row in mv.comp */
    bool use_subgroup;
    int coop_bm;                  /* mm_coop.comp tile rows (info.coop != 0) */
    vk_ex_shape ex_shape[2][2];   /* experts_mv.comp's workgroups (vk_experts.h) */
    vk_tuning tune;
    char cache_dir[512];          /* "" when caching is off */
    void *shaderc;                /* shaderc_compiler_t, created on first compile */
    VkPipeline pipes[VK_K_COUNT][VK_TYPE_SLOTS][VK_MODES];
    moex_vk_buffer *actq;         /* activation rounding: regions for Q8_0, Q8_K, Q8_1 of actq_floats each */
    size_t actq_floats;
    bool profile;                 /* MOEX_VK_PROFILE set and timestamps supported: recordings time their ops */
    double ts_period;             /* ns per timestamp tick */
    moex_vk_buffer *staging;      /* uploads/downloads through it when memory is not mappable */
    VkCommandBuffer xfer_cmd;
    VkFence xfer_fence;
    int verbose;
};

typedef struct vk_prof vk_prof;

struct moex_vk_cmd {
    moex_vk *vk;
    vk_prof *prof;                 /* NULL unless profiling */
    const char *label;             /* names the ops recorded next (moex_vk_cmd_label) */
    VkCommandBuffer cb;
    VkFence fence;
    VkPipeline bound;
    bool recording, pending;
    bool transfer_since_barrier;   /* a copy or fill since the last moex_vk_barrier: the next one covers transfers */
};

/* vk_device.c */
int vk_check(VkResult r, const char *what, moex_error *err);
int vk_submit_wait(moex_vk *vk, VkCommandBuffer cb, VkFence fence, moex_error *err);
bool vk_env_on(const char *name);   /* an environment switch set to anything but "" or "0" (device creation only) */

/* vk_prof.c: timestamps around every op when MOEX_VK_PROFILE is set */
bool vk_prof_wanted(void);
vk_prof *vk_prof_create(moex_vk *vk);
void vk_prof_begin(moex_vk_cmd *c);
void vk_prof_mark(moex_vk_cmd *c, VkPipeline pipe);   /* after an op; pipe is VK_NULL_HANDLE for transfers */
void vk_prof_submitted(moex_vk_cmd *c);
void vk_prof_collect(moex_vk_cmd *c);
void vk_prof_free(moex_vk_cmd *c);                   /* prints the table */

/* vk_pipeline.c */
int vk_type_slot(moex_type t);   /* -1 for types the GPU kernels do not read */
VkPipeline vk_pipeline(moex_vk *vk, vk_kernel k, moex_type type, int mode, moex_error *err);
void vk_pipelines_free(moex_vk *vk);
int vk_pipeline_cache_open(moex_vk *vk);
void vk_pipeline_cache_save(moex_vk *vk);

/* vk_ops.c: the ops and the helpers every op file shares */
void vk_dispatch(moex_vk_cmd *c, VkPipeline p, const vk_pc *pc, uint32_t gx, uint32_t gy, uint32_t gz);
/* The same with the grid read from 3 words at off in b when the work runs. */
void vk_dispatch_indirect(moex_vk_cmd *c, VkPipeline p, const vk_pc *pc, moex_vk_buffer *b, size_t off);
uint32_t vk_fbits(float f);                /* a float's bits, for push constants */
uint32_t vk_ceil_div(int64_t a, int64_t b);
int vk_mv_mode(int mode, const moex_vk_matrix *w);   /* mode | VK_MV_GENERIC when unaligned */
/* int8 activations for the decode products that hold their input per thread
 * (experts_mv.comp, experts_gu.comp: Q4_K and Q6_K positions of 32 or 16
 * values) or staged in shared memory (mv.comp modes 1 and 2 on Q4_K: groups of
 * 32): x (or h) rounded to int8 with one power-of-two scale per position or
 * group, multiplied into the weights' nibbles by 4-byte integer dot products
 * (OpSUDot), about a third of the instructions of the f32 path. On an H200
 * one token x 8 experts 23.2 -> 16.7 us, 64 distinct experts 116 -> 93 us,
 * decode after 512 tokens +11-14 % from the experts and +4.6 % more from the
 * staged products (docs/PERF.md, session 8). On where the device has the
 * integer dot product in hardware (MOEX_VK_IDOT=1: wherever it has it, =0:
 * never), unless activations are rounded to the CPU's grid (vk->actq). */
bool vk_idot(const moex_vk *vk);
uint32_t vk_mv_groups(const moex_vk *vk, int64_t rows, int mode);           /* mv.comp workgroups along the rows */
int vk_check_grid(int64_t gx, int64_t gy, int64_t gz, moex_error *err);
int vk_check_matrix(const moex_vk_matrix *w, moex_error *err);
/* x, or x rounded to the partner type of weight type t when rounding is on. */
int vk_round_input(moex_vk_cmd *c, moex_type t, moex_vk_ptr x, int64_t rows, int64_t cols, moex_vk_ptr *out,
                   moex_error *err);
/* mv.comp / mm.comp push constants: w w2 x y r ids gw counter | rows cols n xs ys flags k estride n_expert. */
vk_pc vk_mat_pc(const moex_vk_matrix *w, moex_vk_ptr x, int64_t n, int64_t xs, moex_vk_ptr y, int64_t ys,
                moex_vk_ptr resid);

/* vk_attn.c: attn_coop.comp's tile for head_dim class mode (HDMAX = 64 << mode) on this
 * device: warps (16 query rows each) and keys per tile; -1 when it does not fit. */
int vk_attn_coop_config(const moex_vk *vk, int mode, uint32_t *warps, uint32_t *bc);
/* Prompts of fewer tokens keep the f32 tiles: their attention costs little,
 * and f16 Q, K, V and P move the logits off the CPU backend's by as much as
 * its 8-bit activation rounding (test_vk_forward's 20-token prompt: relative
 * error 0.013 against 0.007 with the f32 tiles). */
#define VK_ATTN_COOP_MIN 32

/* vk_experts.c: scratch regions of the expert FFN */
size_t vk_experts_h_bytes(const moex_vk_experts *e, int64_t n, int k);
size_t vk_experts_po_bytes(const moex_vk_experts *e, int64_t n, int k);

/* vk_mm.c: the tiled products for more than VK_MV_NMAX tokens (pc from vk_mat_pc) */
int vk_router_tiled(moex_vk_cmd *c, const moex_vk_matrix *w, const vk_pc *pc, int64_t n, moex_error *err);
int vk_matmul_tiled(moex_vk_cmd *c, const moex_vk_matrix *w, const vk_pc *pc, int64_t n, moex_error *err);
int vk_experts_tiled(moex_vk_cmd *c, const moex_vk_experts *e, moex_vk_ptr x, int64_t n, int k, moex_vk_ptr ids,
                     moex_vk_ptr weights, moex_vk_ptr resid, moex_vk_ptr y, moex_vk_ptr scratch, moex_error *err);

#endif
