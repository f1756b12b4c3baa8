/* Private to the Vulkan backend (kernels/vk/vk_*.c). Its files are layers,
 * each calling only into the layers below it (never up, never in a circle):
 *
 *   vk_create.c    moex_vk_create / moex_vk_free: reads the environment (the
 *                  tuning switches, the cache directory, profiling) and wires
 *                  the device, the pipeline cache and the profiler together
 *   vk_testing.c   the hooks of vk_testing.h (tests, benchmarks)
 *   vk_tune.c      --vk-tune's keys into moex_vk_tuning, and its defaults filled in
 *   vk_ops.c       the ops: products, norms, router, elementwise, argmax
 *   vk_experts.c   the expert FFN
 *   vk_attn.c      attention
 *   vk_mm.c        the tiled prompt-batch products (called by vk_ops.c and vk_experts.c)
 *   vk_record.c    what every op shares: dispatches, argument checks, push
 *                  constants, activation rounding
 *   vk_pipeline.c  the embedded SPIR-V variants, their specialization, the
 *                  pipeline table and cache, pipelines created up front
 *   vk_shapes.c    the workgroup shapes and tiles each kernel takes on this
 *                  device (its capabilities and tuning switches)
 *   vk_cmd.c       command buffers, barriers, copies
 *   vk_prof.c      GPU timestamps per op (--vk-tune profile)
 *   vk_device.c    instance, device, capabilities, memory, buffers, transfers
 *
 * This header follows the same order from the bottom up. */
#ifndef MOEX_VK_INTERNAL_H
#define MOEX_VK_INTERNAL_H

#include <string.h>
#include <vulkan/vulkan.h>

#include "kernels/vk/vk.h"
#include "kernels/vk/vk_testing.h"
#include "kernels/vk/vk_variants.h"

/* ---- vk_device.c: the device and its memory ---- */

/* Every kernel's push constants: 8 device addresses then 12 words (floats as
 * their bits). Each shader names the slots its own way; unused ones are 0. */
typedef struct vk_pc {
    uint64_t p[8];
    uint32_t u[12];
} vk_pc;
_Static_assert(sizeof(vk_pc) == 112, "push constants must fit the 128 bytes every device has");

typedef moex_vk_ex_shape vk_ex_shape;   /* vk_testing.h: experts_mv.comp's workgroup for one half */
typedef moex_vk_gu_shape vk_gu_shape;   /* vk_testing.h: experts_gu.comp's workgroup */

typedef enum vk_kernel {
    VK_K_DEQUANT, VK_K_MV, VK_K_MM, VK_K_TOPK, VK_K_RMSNORM, VK_K_QKROPE, VK_K_ATTN, VK_K_ATTN_MERGE,
    VK_K_MOE_SORT, VK_K_MOE_COMBINE, VK_K_ELTWISE, VK_K_ARGMAX, VK_K_ACTQ,
    VK_K_EXPERTS_MV,   /* experts_mv.comp: the decode expert FFN */
    VK_K_MM_COOP,      /* mm_coop.comp: prompt-batch products on cooperative matrices */
    VK_K_ATTN_COOP,    /* attn_coop.comp: prompt-batch attention on cooperative matrices (vk_attn.c) */
    VK_K_ATTN_DEC,     /* attn_dec.comp: one decode token's whole attention step */
    VK_K_EXPERTS_GU,   /* experts_gu.comp: one decode token's expert gate+up on Q4_K */
    VK_K_EXPERTS_XQ,   /* experts_xq.comp: the expert down half's input as int8 positions */
    VK_K_COUNT
} vk_kernel;
#define VK_TYPE_SLOTS 32   /* moex_type ids fit below this after vk_type_slot() */

/* The tuning as the kernels read it: moex_vk_tuning (vk.h, --vk-tune) with
 * each default filled in (vk_tune.c vk_tuning_resolve). */
typedef struct vk_tuning {
    bool attn_simple;    /* prompt attention on the split-K path (tests: moex_vk_testing_set_attn_simple) */
    bool coop_wide;      /* dense coop products keep 64-token tiles */
    int coop_bm;         /* mm_coop.comp tile rows, VK_COOP_BM or 128 */
    int coop_bk;         /* mm_coop.comp columns per step, VK_COOP_BK or 32 */
    int coop_nbuf;       /* 2 asks for double-buffered coop tiles, else 1 */
    int mv_rpt;          /* rows per thread of the staged one-token products (1-8), 0: default */
    int mv_groups;       /* row groups per workgroup of those products (1-32), 0: default */
    int mv_tokens;       /* tokens a workgroup of the batched head takes at most (1: one) */
    int mv_batch_wg;     /* workgroups of a batch's staged product in all, at most (VK_MV_BATCH_WG; 0: each
                          * token's own, up to VK_MV_PERSIST) */
    bool gu_off;         /* one token's Q4_K gate+up on experts_mv.comp instead of experts_gu.comp (tests:
                          * moex_vk_testing_set_gu) */
    int gu_wg, gu_ru;    /* experts_gu.comp's shape (64-1024 threads, 1-16 rows loaded together), 0: default */
    int gu_ch;           /* experts_gu.comp's rows per workgroup (16 to 256, multiples of 16), 0: default */
    int idot;            /* the decode products' int8 activations (vk_idot): 0 off, 1 wherever the device has
                          * integer dot products, -1 where it has them in hardware */
    int spin_us;         /* how long a submit's wait polls its fence before it blocks (0: at once); the
                          * default VK_SPIN_US_DEFAULT, or 0 on a CPU device (vk_create.c) */
    int ex_preq;         /* the expert down half's int8 input quantized once (experts_xq.comp) for 0 never, 1
                          * every batch, -1 batches of several tokens of several experts; else in every
                          * workgroup of the down half (tests: moex_vk_testing_set_ex_preq) */
    bool each_unstaged;  /* a batch's one-token products and routers on mode 0 (the weights read once per
                          * VK_MV_NMAX tokens, norms apart) instead of staging x once per token */
} vk_tuning;
void vk_tuning_resolve(const moex_vk_tuning *t, vk_tuning *out);
#define VK_SPIN_US_DEFAULT 5000   /* covers a whole-model decode token's wait (~2.7 ms on the H200) */

typedef struct moex_vk_buffer {
    moex_vk *vk;
    VkBuffer buf;
    VkDeviceMemory mem;
    VkDeviceAddress addr;
    size_t size;
    void *map;            /* host pointer when the memory is host visible */
} moex_vk_buffer;

typedef struct vk_pipe vk_pipe;

struct moex_vk {
    VkInstance inst;
    VkPhysicalDevice pd;
    VkDevice dev;
    VkQueue queue;
    uint32_t qfam;
    VkCommandPool pool;
    VkPipelineLayout layout;      /* the one push-constant block, no descriptor sets */
    VkPhysicalDeviceMemoryProperties memprops;
    moex_vk_info info;
    uint32_t api_version;
    int tpr;                      /* threads per row in mv.comp: the subgroup size where use_subgroup */
    bool use_subgroup;
    bool profile;                 /* tune.profile and timestamps supported: recordings time their ops */
    double ts_period;             /* ns per timestamp tick */
    moex_vk_buffer *staging;      /* uploads/downloads through it when memory is not mappable */
    VkCommandBuffer xfer_cmd;
    VkFence xfer_fence;
    int verbose;
    /* vk_shapes.c, vk_create.c */
    vk_tuning tune;
    vk_ex_shape ex_shape[2][3];   /* experts_mv.comp's workgroups [half][VK_EX_ONE, VK_EX_BATCH, VK_EX_FEW] */
    /* vk_pipeline.c */
    VkPipelineCache pcache;
    char cache_dir[512];          /* "" when caching is off */
    vk_pipe *pipes[VK_K_COUNT][VK_TYPE_SLOTS][VK_MODES];
    bool warming;                 /* between moex_vk_warm_begin and moex_vk_warm_end */
    /* vk_record.c */
    moex_vk_buffer *actq;         /* activation rounding: regions for Q8_0, Q8_K, Q8_1 of actq_floats each */
    size_t actq_floats;
};

int vk_check(VkResult r, const char *what, moex_error *err);
int vk_submit_wait(moex_vk *vk, VkCommandBuffer cb, VkFence fence, moex_error *err);
/* Picks the device (opt->device), reads its capabilities into vk->info and
 * creates it with a queue, a command pool and the pipeline layout. coop:
 * MOEX_VK_COOP_* as resolved by the caller; vk->tune.coop_bm and vk->profile
 * must be set (profiling is turned off where the queue has no timestamps). */
int vk_device_open(moex_vk *vk, const moex_vk_options *opt, int coop, moex_error *err);
void vk_device_close(moex_vk *vk);   /* waits for the device; frees what vk_device_open made */

/* ---- vk_prof.c: timestamps around every op when vk->profile ---- */
typedef struct vk_prof vk_prof;
vk_prof *vk_prof_create(moex_vk *vk);
void vk_prof_begin(moex_vk_cmd *c);
/* After an op: pipe and kernel ("mv/q4_K/m9") name its row; VK_NULL_HANDLE for transfers. */
void vk_prof_mark(moex_vk_cmd *c, VkPipeline pipe, const char *kernel);
void vk_prof_submitted(moex_vk_cmd *c);
void vk_prof_collect(moex_vk_cmd *c);
void vk_prof_free(moex_vk_cmd *c);   /* prints the table */

/* ---- vk_cmd.c: command buffers ---- */
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

/* ---- vk_shapes.c: each kernel's workgroup shape and tile on this device ---- */

/* mv.comp: row groups of tpr threads, rows per row group and row groups per
 * workgroup by mode. Plain products reuse each x load for two rows (and keep
 * both rows' loads in flight); the router (mode 3) has few rows; the staged
 * one-token modes 1 and 2 take VK_MV_RPT_STAGED rows per row group and
 * VK_MV_GROUPS_STAGED row groups (--vk-tune mv_rpt=1..8 and
 * mv_groups=1..32 override them, for tuning; docs/PERF.md). */
#define VK_MV_GROUPS 4
#define VK_MV_RPT_STAGED 1
#define VK_MV_GROUPS_STAGED 8
/* A batch's staged products (several tokens as the grid's y) run this many
 * workgroups in all at most: with the tokens filling the GPU, a workgroup
 * stages its token's x once for several row blocks instead of once for one
 * (docs/PERF.md: q/k/v and Wo of 8 tokens ~20 % faster). */
#define VK_MV_BATCH_WG 1024
int vk_mv_rpt(const moex_vk *vk, int mode);
int vk_mv_row_groups(const moex_vk *vk, int mode);
/* XMAX-wide rows of x a VK_MV_TOKENS stage of mode on type holds */
int vk_mv_stage_copies(const moex_vk *vk, moex_type type, int mode);
uint32_t vk_mv_groups(const moex_vk *vk, int64_t rows, int mode);   /* mv.comp workgroups along the rows */
/* int8 activations for the decode products that hold their input per thread
 * (experts_mv.comp, experts_gu.comp: Q4_K and Q6_K positions of 32 or 16
 * values) or staged in shared memory (mv.comp modes 1 and 2 on Q4_K and
 * Q6_K: groups of 32): x (or h) rounded to int8 with one power-of-two scale
 * per position or group, multiplied into the weights' nibbles by 4-byte
 * integer dot products (OpSUDot), about a third of the instructions of the
 * f32 path (docs/PERF.md).
 * On where the device has the integer dot product in hardware
 * (idot=1: wherever it has it, =0: never), unless activations are
 * rounded to the CPU's grid (vk->actq). */
bool vk_idot(const moex_vk *vk);

/* experts_mv.comp's shapes by [half (0 gate+up, 1 down)][kind], measured
 * rather than derived (docs/PERF.md); each device starts from these,
 * --vk-tune ex_shape changes them. Kinds: one token's, a batch's (at least
 * VK_EX_MANY tokens over many experts), and one token's where its positions
 * (k experts x a row's positions) would leave more than half of the
 * one-token workgroup idle (a worker's rows, each with its one expert). */
#define VK_EX_MANY 4
#define VK_EX_PPT_MAX 4   /* input positions a thread holds in registers (more: an outer loop) */
enum { VK_EX_ONE, VK_EX_BATCH, VK_EX_FEW };
extern const vk_ex_shape vk_ex_default_shapes[2][3];
bool vk_ex_shape_ok(const moex_vk *vk, int half, vk_ex_shape s);
int vk_ex_kind(const moex_vk *vk, int half, bool many, int64_t npos);   /* a half's kind for npos positions */
#define VK_EX_MODE(down, generic, ppt, kind)                                                           \
    ((down) | ((generic) ? VK_EX_GENERIC : 0) | (((ppt) - 1) << 2) |                                   \
     ((kind) == VK_EX_BATCH ? VK_EX_MANY_BIT : (kind) == VK_EX_FEW ? VK_EX_FEW_BIT : 0))
#define VK_EX_MODE_KIND(mode) \
    ((mode) & VK_EX_MANY_BIT ? VK_EX_BATCH : (mode) & VK_EX_FEW_BIT ? VK_EX_FEW : VK_EX_ONE)
#define VK_EX_MODE_SHAPE(vk, mode) (&(vk)->ex_shape[(mode) & VK_EX_DOWN][VK_EX_MODE_KIND(mode)])

vk_gu_shape vk_gu_shape_of(const moex_vk *vk, int npos);
size_t vk_gu_shared_bytes(const moex_vk *vk, vk_gu_shape s);   /* experts_gu.comp's reduction */

/* mm_coop.comp: a workgroup of 4 warps computes coop_bm (vk->tune: VK_COOP_BM,
 * or 128 with --vk-tune coop_bm=128) weight rows x VK_COOP_BN tokens,
 * VK_COOP_BK columns per step (vk_mm.c sizes the grids). 64 rows keep the
 * gate+up variant at 8 accumulators per warp: more workgroups per SM to hide
 * the dequantization's load latency. 64 columns per step: one Q4_K group,
 * half as many barriers as 32. */
#define VK_COOP_BM 64
#define VK_COOP_BN 64
#define VK_COOP_BK 64
#define VK_COOP_FEW 256   /* dense products with fewer 64 x 64 tiles than this take the 32-token tiles */
/* mm_coop.comp's shared buffers for mode and tile (1 or 2, vk->tune.coop_nbuf where they fit). */
int vk_coop_nbuf(const moex_vk *vk, int mode, int bk, int bn);
/* attn_coop.comp's tile for head_dim class mode (HDMAX = 64 << mode) on this
 * device: warps (16 query rows each) and keys per tile; -1 when it does not fit. */
int vk_attn_coop_config(const moex_vk *vk, int mode, uint32_t *warps, uint32_t *bc);

/* ---- vk_pipeline.c: SPIR-V variants, pipelines ---- */

/* SPIR-V compiled at build time (shaders/variants.cmake): per kernel the
 * variants by weight type (0 for kernels that read none), mode bits and flags. */
enum { VK_SPIRV_SUBGROUP = 1, VK_SPIRV_EMU = 2 };
typedef struct vk_spirv {
    int type, mode, flags;
    const uint32_t *code;
    size_t words;
} vk_spirv;
typedef struct vk_spirv_table {
    const vk_spirv *rows;
    int n;
} vk_spirv_table;
extern const vk_spirv_table *const vk_spirv_tables[VK_K_COUNT];

/* A pipeline of the table: one (kernel, type, mode) on this device. */
struct vk_pipe {
    VkPipeline handle;   /* VK_NULL_HANDLE until created (moex_vk_warm_end creates it) */
    vk_kernel kernel;
    moex_type type;
    int mode;
    bool failed;         /* moex_vk_warm_end could not create it */
    char name[32];       /* "mv/q4_K/m41": its row in the profile table */
};
int vk_type_slot(moex_type t);   /* -1 for types the GPU kernels do not read */
/* The pipeline of kernel k for a weight type (ignored by kernels that read
 * none) and mode, created on first use. Between moex_vk_warm_begin and
 * moex_vk_warm_end it is only noted: its handle stays VK_NULL_HANDLE. */
const vk_pipe *vk_pipeline(moex_vk *vk, vk_kernel k, moex_type type, int mode, moex_error *err);
/* Drops kernel k's pipelines (after a shape or switch they read changed); waits for the device. */
void vk_pipelines_forget(moex_vk *vk, vk_kernel k);
void vk_pipelines_free(moex_vk *vk);
/* The VkPipelineCache, from and to vk->cache_dir. */
void vk_pipeline_cache_open(moex_vk *vk);
void vk_pipeline_cache_close(moex_vk *vk);   /* saves and destroys it */

/* ---- vk_record.c: what every op shares ---- */
static inline uint32_t vk_fbits(float f) {   /* a float's bits, for push constants */
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline uint32_t vk_ceil_div(int64_t a, int64_t b) { return (uint32_t)((a + b - 1) / b); }
/* Binds p and records its dispatch (nothing while p is only noted: moex_vk_warm_begin). */
void vk_dispatch(moex_vk_cmd *c, const vk_pipe *p, const vk_pc *pc, uint32_t gx, uint32_t gy, uint32_t gz);
/* The same with the grid read from 3 words at off in b when the work runs. */
void vk_dispatch_indirect(moex_vk_cmd *c, const vk_pipe *p, const vk_pc *pc, moex_vk_buffer *b, size_t off);
int vk_check_grid(int64_t gx, int64_t gy, int64_t gz, moex_error *err);
int vk_check_matrix(const moex_vk_matrix *w, moex_error *err);
int vk_mv_mode(int mode, const moex_vk_matrix *w);   /* mode | VK_MV_GENERIC when unaligned */
/* x, or x rounded to the partner type of weight type t when rounding is on. */
int vk_round_input(moex_vk_cmd *c, moex_type t, moex_vk_ptr x, int64_t rows, int64_t cols, moex_vk_ptr *out,
                   moex_error *err);
/* mv.comp / mm.comp push constants: w w2 x y r ids gw counter | rows cols n xs ys flags k estride n_expert. */
vk_pc vk_mat_pc(const moex_vk_matrix *w, moex_vk_ptr x, int64_t n, int64_t xs, moex_vk_ptr y, int64_t ys,
                moex_vk_ptr resid);

/* ---- vk_mm.c: the tiled products for more than VK_MV_NMAX tokens (pc from vk_mat_pc) ---- */
int vk_router_tiled(moex_vk_cmd *c, const moex_vk_matrix *w, const vk_pc *pc, int64_t n, moex_error *err);
int vk_matmul_tiled(moex_vk_cmd *c, const moex_vk_matrix *w, const vk_pc *pc, int64_t n, moex_error *err);
/* Scratch of the expert FFN: h (n*k x n_ff floats), then for batches on the
 * tiled path the per-pair outputs (n*k x d) and the grouping (2E + n*k ints). */
size_t vk_experts_h_bytes(const moex_vk_experts *e, int64_t n, int k);
size_t vk_experts_po_bytes(const moex_vk_experts *e, int64_t n, int k);
int vk_experts_tiled(moex_vk_cmd *c, const moex_vk_experts *e, moex_vk_ptr x, int64_t n, int k, moex_vk_ptr ids,
                     moex_vk_ptr weights, moex_vk_ptr resid, moex_vk_ptr y, moex_vk_ptr scratch, moex_error *err);

/* ---- vk_experts.c: the expert FFN ---- */
/* experts_gu.comp takes n tokens' gate+up: one token, Q4_K on 16-byte aligned
 * rows, a power-of-two count of positions that fits a workgroup, activation
 * rounding off (h is written unrounded; the down half rounds it). */
bool vk_gu_applies(const moex_vk *vk, const moex_vk_experts *e, int64_t n);
/* The decode path of moex_vk_op_experts (n <= VK_MV_NMAX, arguments checked
 * by it); halves: 1 gate+up only, 2 down only (each alone to time it), 3 both;
 * each: any n, each token with the kernels and shapes of one (MOEX_VK_EACH). */
int vk_experts_mv_halves(moex_vk_cmd *c, const moex_vk_experts *e, moex_vk_ptr x, int64_t n, int k, moex_vk_ptr ids,
                         moex_vk_ptr weights, moex_vk_ptr resid, moex_vk_ptr y, moex_vk_ptr h, int halves, bool each,
                         moex_error *err);

#endif
