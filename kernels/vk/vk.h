/* The Vulkan backend (kernels/vk/vk_*.c, GLSL in kernels/vk/shaders/).
 * Buffers are reached by device address (moex_vk_ptr); work is recorded into
 * a moex_vk_cmd and submitted. Ops do not synchronise with each other: call
 * moex_vk_barrier between an op and the next one that reads its output.
 *
 * Built only with -DMOEX_VULKAN=ON (the default); the declarations here need
 * no Vulkan headers, so callers compile either way and guard their calls with
 * MOEX_HAVE_VULKAN. */
#ifndef MOEX_KERNELS_VK_H
#define MOEX_KERNELS_VK_H

#include "kernels/kernels.h"

typedef struct moex_vk moex_vk;
typedef struct moex_vk_buffer moex_vk_buffer;
typedef struct moex_vk_cmd moex_vk_cmd;
typedef uint64_t moex_vk_ptr;   /* device address (0: none) */

/* The backend's tuning: kernel shapes and paths that a new GPU may want
 * otherwise, and how a submit waits. Every field's zero is the default;
 * programs set it with --vk-tune KEY=VALUE,... (moex_vk_options_tune; the
 * keys and what each changes: docs/ARCHITECTURE.md "Settings"). */
typedef struct moex_vk_tuning {
    int spin_us;         /* spin_us: a submit's wait polls its fence this long before it blocks; 0: the default
                          * (5 ms, at once on a CPU device: vk_create.c), -1 at once (spin_us=0) */
    int idot;            /* idot: the decode products' int8 activations: 0 where the device has integer dot
                          * products in hardware, 1 wherever it has them, 2 never (idot=0) */
    bool each_unstaged;  /* a test hook, no key: a batch's one-token products read their weights once per 8
                          * tokens instead of staging x per token (slower at every batch size: docs/PERF.md) */
    bool coop_wide;      /* coop_narrow=0: dense cooperative products keep 64-token tiles */
    int coop_bm;         /* coop_bm=128: mm_coop.comp's tile rows (0: 64) */
    int coop_bk;         /* coop_bk=32: its columns per step (0: 64) */
    int coop_nbuf;       /* coop_nbuf=2: double-buffered tiles where shared memory allows (0: one) */
    int mv_rpt;          /* mv_rpt=1..8: rows per thread of the staged one-token products (0: default) */
    int mv_groups;       /* mv_groups=1..32: their row groups per workgroup (0: default) */
    int mv_tokens;       /* mv_tokens=1..8: tokens a workgroup of the batched head takes at most (0: 8) */
    int mv_batch_wg;     /* mv_batch_wg=N: workgroups of a batch's staged product in all (0: 1024; -1 each
                          * token's own: mv_batch_wg=0) */
    int gu_wg, gu_ru;    /* gu_wg=64..1024, gu_ru=1..16: experts_gu.comp's shape (0: default) */
    int gu_ch;           /* gu_ch=16..256 (multiples of 16): its rows per workgroup (0: default) */
    char ex_shape[128];  /* ex_shape=GWG:GRT:GRU:DWG:DRT:DRU[:...]: the expert FFN's workgroups (vk_testing.h) */
    bool profile;        /* profile=1: GPU timestamps around every op, a table per recording on stderr */
} moex_vk_tuning;


typedef struct moex_vk_options {
    int device;              /* index from moex_vk_list_devices, -1: best (discrete > integrated > virtual > CPU) */
    const char *cache_dir;   /* the pipeline cache; NULL: $MOEX_VK_CACHE or ~/.cache/moex-vk; "" = off */
    bool no_subgroup;        /* force the shared-memory reductions (tests both paths) */
    bool round_activations;  /* moex_vk_state_create: round product inputs as the CPU does (see below) */
    bool verbose;
    int coop;                /* prompt products on cooperative matrices: MOEX_VK_COOP_* */
    bool experts_in_ram;     /* moex_vk_state_create: the experts' weights in host memory the GPU reads over the
                              * bus (a model whose experts do not fit VRAM; engine/vk/forward_vk_memory.c) */
    moex_vk_tuning tune;
} moex_vk_options;
/* Parses --vk-tune's "KEY=VALUE,KEY=VALUE" into o->tune (and o->coop: the
 * key coop=auto|off|emulate); what it does not name keeps its value. */
int moex_vk_options_tune(moex_vk_options *o, const char *spec, moex_error *err);
/* MOEX_VK_COOP_AUTO: where the device has them; OFF: the f32 tiles;
 * EMULATE: the coop kernel with a shared-memory stand-in for the matrix unit
 * where the device has none (tests the kernel on CPU drivers). */
enum { MOEX_VK_COOP_AUTO, MOEX_VK_COOP_OFF, MOEX_VK_COOP_EMULATE };

typedef struct moex_vk_info {
    char name[256];
    char type[16];                /* "discrete", "integrated", "virtual", "cpu", "other" */
    uint32_t subgroup_size;
    bool subgroup_arith;          /* subgroupAdd usable in compute */
    bool f16;                     /* shaderFloat16 */
    bool int_dot;                 /* VK_KHR_shader_integer_dot_product */
    bool int_dot_fast;            /* ... its mixed-signedness 4x8-bit packed dot in hardware */
    uint32_t shared_mem;          /* bytes of shared memory per workgroup */
    uint64_t device_mem;          /* bytes of the largest device-local heap */
    /* Prompt-batch products on cooperative matrices (f16 x f16 -> f32, tiles of
     * coop_m x coop_n x coop_k): 0 no (the f32 tiles), 1 VK_NV_cooperative_matrix
     * (tensor cores), 2 emulated in shared memory (moex_vk_options.coop). */
    int coop;
    uint32_t coop_m, coop_n, coop_k;
} moex_vk_info;

/* Writes one line per device ("N: name (type)") into buf; returns the count or -1. */
int moex_vk_list_devices(char *buf, size_t cap, moex_error *err);
moex_vk *moex_vk_create(const moex_vk_options *opt, moex_error *err);
void moex_vk_free(moex_vk *vk);
const moex_vk_info *moex_vk_get_info(const moex_vk *vk);

/* Pipelines up front. The ops create each pipeline they use when they first
 * record it (the driver compiles it then, unless its pipeline cache holds
 * it); to keep that out of timed runs, record what will run between these
 * two calls: meanwhile the ops only note the pipelines they would use (the
 * recordings made then must be begun again before they run), and
 * moex_vk_warm_end creates the missing ones on several threads and waits.
 * A pipeline that fails there is created, or its error reported, when an op
 * next asks for it. */
void moex_vk_warm_begin(moex_vk *vk);
int moex_vk_warm_end(moex_vk *vk, moex_error *err);
/* Pipelines of vk that exist (created; those only noted between
 * moex_vk_warm_begin and moex_vk_warm_end not counted): a warm-up's check
 * that nothing compiles later. */
int moex_vk_pipeline_count(const moex_vk *vk);
/* The batch sizes whose recordings, together, use every pipeline that any
 * batch of 1 to n_batch tokens uses: the first size of each range of sizes
 * that picks other kernels, and n_batch. Writes at most 8; returns how many. */
int moex_vk_warm_batch_sizes(int64_t n_batch, int64_t sizes[8]);

/* MOEX_VK_MEM_HOST: host-visible, cached where possible (read back by the
 * host). MOEX_VK_MEM_UPLOAD: host-visible, in device memory where the device
 * maps some (a BAR): small words the host writes before each submit and the
 * GPU reads many times, as the command processor does an indirect grid. */
enum { MOEX_VK_MEM_DEVICE, MOEX_VK_MEM_HOST, MOEX_VK_MEM_UPLOAD };
moex_vk_buffer *moex_vk_buffer_create(moex_vk *vk, size_t bytes, int mem, moex_error *err);
void moex_vk_buffer_free(moex_vk_buffer *b);
moex_vk_ptr moex_vk_buffer_ptr(const moex_vk_buffer *b);
size_t moex_vk_buffer_size(const moex_vk_buffer *b);
void *moex_vk_buffer_map(const moex_vk_buffer *b);   /* NULL unless host visible */
/* Blocking copies between host memory and a buffer (through a staging buffer when needed). */
int moex_vk_upload(moex_vk *vk, moex_vk_buffer *b, size_t off, const void *src, size_t n, moex_error *err);
int moex_vk_download(moex_vk *vk, moex_vk_buffer *b, size_t off, void *dst, size_t n, moex_error *err);

moex_vk_cmd *moex_vk_cmd_create(moex_vk *vk, moex_error *err);
void moex_vk_cmd_free(moex_vk_cmd *c);
int moex_vk_cmd_begin(moex_vk_cmd *c, moex_error *err);    /* starts a new recording */
int moex_vk_cmd_end(moex_vk_cmd *c, moex_error *err);
/* Submits the recorded work (again, if already run) and waits for it. */
int moex_vk_cmd_run(moex_vk_cmd *c, moex_error *err);
void moex_vk_barrier(moex_vk_cmd *c);
/* Names the ops recorded next (a string that outlives c) in the --vk-tune profile=1
 * table of GPU time per op, printed to stderr when c is freed. */
void moex_vk_cmd_label(moex_vk_cmd *c, const char *label);
void moex_vk_copy(moex_vk_cmd *c, moex_vk_buffer *dst, size_t doff, moex_vk_buffer *src, size_t soff, size_t n);
/* Sets n bytes (a multiple of 4) at off to repeated value. */
void moex_vk_fill(moex_vk_cmd *c, moex_vk_buffer *b, size_t off, size_t n, uint32_t value);

/* A weight matrix on the GPU, same layout as moex_matrix. Expert tensors are
 * n_expert matrices expert_stride bytes apart. cols must be a multiple of 32. */
typedef struct moex_vk_matrix {
    moex_type type;
    int64_t rows, cols;
    size_t row_bytes;
    moex_vk_ptr data;
    size_t expert_stride;
} moex_vk_matrix;

/* Rounds the input of every matrix product to the weight type's 8-bit
 * partner (Q8_0/Q8_1/Q8_K) first, as the CPU backend does, so results track
 * it closely; max_floats bounds any product's input (rows x cols). 0: off,
 * products use the f32 activations (the default: faster, closer to float64). */
int moex_vk_set_activation_rounding(moex_vk *vk, size_t max_floats, moex_error *err);

/* Whether the GPU kernels read this type (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K). */
bool moex_vk_type_supported(moex_type t);

/* out[i] = row(ids ? ids[i] : i) of w as f32, for i < n (embedding gather). */
int moex_vk_op_dequant(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr ids, int64_t n, moex_vk_ptr out,
                       moex_error *err);
/* out = rmsnorm(x) * w per row of dim (w 0: none). */
int moex_vk_op_rmsnorm(moex_vk_cmd *c, moex_vk_ptr out, moex_vk_ptr x, moex_vk_ptr w, int64_t n_rows, int64_t dim,
                       float eps, moex_error *err);
/* y[t] = W x[t] (+ resid[t]) for t < n; x rows are w->cols floats, y rows w->rows. */
int moex_vk_op_matmul(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, int64_t n, moex_vk_ptr y,
                      moex_vk_ptr resid, moex_error *err);
/* y = a + b (op 0) or silu(a) * b (op 1), n floats. */
int moex_vk_op_eltwise(moex_vk_cmd *c, int op, moex_vk_ptr a, moex_vk_ptr b, moex_vk_ptr y, int64_t n, moex_error *err);
/* out[r] = index of the largest of n values of row r (rows stride floats apart). */
int moex_vk_op_argmax(moex_vk_cmd *c, moex_vk_ptr x, int64_t n_rows, int64_t n, int64_t stride, moex_vk_ptr out,
                      moex_error *err);

typedef struct moex_vk_attn_shape {
    int n_head, n_head_kv, head_dim, rope_dim;
    float rope_base, rms_eps, scale;
    bool neox, qk_norm;
    int64_t n_ctx;            /* positions the caches hold */
} moex_vk_attn_shape;

/* QK-norm (q_norm/k_norm when qk_norm), RoPE at positions params[0] + t, and
 * the KV append: q (n x n_head x hd) rotated in place, k and v (n x kv_dim)
 * written to the cache rows params[0] + t. params: int32 on the GPU. */
int moex_vk_op_qk_rope(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k, moex_vk_ptr v,
                       moex_vk_ptr k_cache, moex_vk_ptr v_cache, moex_vk_ptr q_norm, moex_vk_ptr k_norm,
                       moex_vk_ptr params, int64_t n, moex_error *err);
/* Floats of scratch moex_vk_op_attention needs for n tokens. */
size_t moex_vk_attention_scratch(const moex_vk_attn_shape *sh, int64_t n);
/* Causal attention of n queries at positions params[0] + t over the caches; out like q. */
int moex_vk_op_attention(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k_cache,
                         moex_vk_ptr v_cache, moex_vk_ptr out, moex_vk_ptr scratch, moex_vk_ptr params, int64_t n,
                         moex_error *err);

/* One decode token's whole attention step in one dispatch: QK-norm and RoPE
 * of q and of the new k at position params[0], the KV append (k, v: one
 * row of n_head_kv x head_dim each), split-K attention over positions
 * 0..params[0] and the merge of the splits. The result overwrites q.
 * scratch: moex_vk_attention_scratch(sh, 1) floats, 16-byte aligned like both
 * caches; counters: n_head
 * uint32 that must be 0 (left at 0). grid NULL: every split of the context
 * runs. Else 3 words at grid_off of that buffer (host-visible) hold, when the
 * work runs, moex_vk_attention_decode_grid(sh, params[0]): a long context
 * (over 1024 positions) then runs as an indirect dispatch of the splits up to
 * the position alone, so a recording made once serves every position without
 * launching the empty splits of the context. */
int moex_vk_op_attention_decode(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k,
                                moex_vk_ptr v, moex_vk_ptr k_cache, moex_vk_ptr v_cache, moex_vk_ptr q_norm,
                                moex_vk_ptr k_norm, moex_vk_ptr scratch, moex_vk_ptr counters, moex_vk_ptr params,
                                moex_vk_buffer *grid, size_t grid_off, moex_error *err);
/* The indirect grid (x, y, z workgroups) of the decode attention at position pos. */
void moex_vk_attention_decode_grid(const moex_vk_attn_shape *sh, int64_t pos, uint32_t grid[3]);

/* Router in one dispatch for small batches: logits = W x, softmax, top-k
 * (ties: lower id), renormalised when norm. ids/weights: n x k. logits:
 * moex_vk_router_logits_bytes(n, n_expert), the n x n_expert logits first (on
 * the tiles, any n, the column slices' sums follow them); counter: one
 * uint32 that must start at 0 (left at 0). */
int moex_vk_op_router(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, int64_t n, int k, bool norm,
                      moex_vk_ptr logits, moex_vk_ptr counter, moex_vk_ptr ids, moex_vk_ptr weights, moex_error *err);
size_t moex_vk_router_logits_bytes(int64_t n, int64_t n_expert);

/* Decode with the RMSNorm fused into the product (each row group sums x^2
 * as it reads x and scales its dots: one dispatch instead of rmsnorm +
 * barrier + product). x is one token's row of w->cols floats, normalised
 * with weight nw (required) and eps; x and nw 16-byte aligned.
 * moex_vk_norm_fusable says whether the fused kernels apply: n == 1,
 * activation rounding off, dim a multiple of 4. */
bool moex_vk_norm_fusable(const moex_vk *vk, int64_t n, int64_t dim);
/* y = W (rmsnorm(x) * nw) (+ resid) for one token. */
int moex_vk_op_norm_matmul(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, moex_vk_ptr nw, float eps,
                           moex_vk_ptr y, moex_vk_ptr resid, moex_error *err);
/* Products of one decode token sharing x (q, k, v): y[i] = W[i] (rmsnorm(x) *
 * nw) for n_mats (1..3) matrices (nw 0: y[i] = W[i] x). Matrices that
 * moex_vk_mv_shareable pairs (one type, width and alignment) go in one
 * dispatch, x staged once per workgroup; the others each in their own. */
bool moex_vk_mv_shareable(const moex_vk_matrix *a, const moex_vk_matrix *b);
/* Widest x the one-token products stage in shared memory (0: none on this
 * device); wider ones fall back to reading x from global memory per row group. */
int64_t moex_vk_mv_staged_cols(const moex_vk *vk);
int moex_vk_op_norm_matmul_multi(moex_vk_cmd *c, int n_mats, const moex_vk_matrix *const *w, const moex_vk_ptr *y,
                                 moex_vk_ptr x, moex_vk_ptr nw, float eps, moex_error *err);
/* moex_vk_op_router for one token of x with the norm fused; xn receives rmsnorm(x) * nw (the experts' input). */
int moex_vk_op_norm_router(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, moex_vk_ptr nw, float eps, int k,
                           bool norm, moex_vk_ptr logits, moex_vk_ptr counter, moex_vk_ptr ids, moex_vk_ptr weights,
                           moex_vk_ptr xn, moex_error *err);

/* Decode head: y = W (rmsnorm(x) * nw) (nw 0: y = W x) for one token, and the
 * index of the largest y (ties: lower) into out (int32), in one dispatch.
 * sync: moex_vk_argmax_sync_bytes(w->rows) bytes of zeros (left zero). */
size_t moex_vk_argmax_sync_bytes(int64_t rows);
int moex_vk_op_matmul_argmax(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, moex_vk_ptr nw, float eps,
                             moex_vk_ptr y, moex_vk_ptr out, moex_vk_ptr sync, size_t sync_bytes, moex_error *err);

typedef struct moex_vk_experts {
    moex_vk_matrix gate, up, down;   /* expert tensors: gate/up n_ff x d, down d x n_ff */
    int n_expert;
} moex_vk_experts;
/* Bytes of scratch moex_vk_op_experts needs for n tokens choosing k experts. */
size_t moex_vk_experts_scratch(const moex_vk_experts *e, int64_t n, int k);
/* y[t] = resid[t] + sum_j weights[t,j] * down(silu(gate x[t]) * up x[t]) of expert ids[t,j],
 * summed in slot order; y may be resid. */
int moex_vk_op_experts(moex_vk_cmd *c, const moex_vk_experts *e, moex_vk_ptr x, int64_t n, int k, moex_vk_ptr ids,
                       moex_vk_ptr weights, moex_vk_ptr resid, moex_vk_ptr y, moex_vk_ptr scratch, moex_error *err);

/* ---- tokens of several sequences in one batch (engine/vk's forward_batch) ----
 *
 * Batching must not change a token's results, so these ops pick their
 * kernels by what kind of token it is, never by how many share the dispatch:
 *   MOEX_VK_EACH   every token gets exactly the kernels and the arithmetic it
 *                  gets alone (n = 1: the decode kernels, those that stage x
 *                  run once per token, the grid's y; moex_vk_tuning.each_unstaged:
 *                  the products and routers never stage x, so their weights
 *                  are read once per 8 tokens, for comparison);
 *   MOEX_VK_TILED  the prompt-batch kernels for any n (a token's sums do not
 *                  depend on the other columns of its tile);
 *   MOEX_VK_BY_N   the plain ops' choice, the fastest kernel for n.
 * Positions and KV rows come per token from tokpos, int32 pairs (pos, base)
 * on the GPU: token t is at position pos of a sequence whose keys are the
 * cache rows base .. base + pos (base: the sequence's first row). */
typedef enum moex_vk_pick { MOEX_VK_BY_N, MOEX_VK_EACH, MOEX_VK_TILED } moex_vk_pick;

int moex_vk_op_matmul_pick(moex_vk_cmd *c, moex_vk_pick pick, const moex_vk_matrix *w, moex_vk_ptr x, int64_t n,
                           moex_vk_ptr y, moex_vk_ptr resid, moex_error *err);
int moex_vk_op_router_pick(moex_vk_cmd *c, moex_vk_pick pick, const moex_vk_matrix *w, moex_vk_ptr x, int64_t n, int k,
                           bool norm, moex_vk_ptr logits, moex_vk_ptr counter, moex_vk_ptr ids, moex_vk_ptr weights,
                           moex_error *err);
size_t moex_vk_experts_scratch_pick(const moex_vk_experts *e, moex_vk_pick pick, int64_t n, int k);
int moex_vk_op_experts_pick(moex_vk_cmd *c, moex_vk_pick pick, const moex_vk_experts *e, moex_vk_ptr x, int64_t n,
                            int k, moex_vk_ptr ids, moex_vk_ptr weights, moex_vk_ptr resid, moex_vk_ptr y,
                            moex_vk_ptr scratch, moex_error *err);

/* The fused-norm decode ops for n tokens (rows of dim floats, 16-byte
 * aligned), each token as moex_vk_op_norm_* gives it alone where x is staged;
 * moex_vk_norm_each says where that is: dim staged, no activation rounding. */
bool moex_vk_norm_each(const moex_vk *vk, int64_t dim);
int moex_vk_op_norm_matmul_each(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, moex_vk_ptr nw, float eps,
                                int64_t n, moex_vk_ptr y, moex_vk_ptr resid, moex_error *err);
int moex_vk_op_norm_matmul_multi_each(moex_vk_cmd *c, int n_mats, const moex_vk_matrix *const *w, const moex_vk_ptr *y,
                                      moex_vk_ptr x, moex_vk_ptr nw, float eps, int64_t n, moex_error *err);
int moex_vk_op_norm_router_each(moex_vk_cmd *c, const moex_vk_matrix *w, moex_vk_ptr x, moex_vk_ptr nw, float eps,
                                int64_t n, int k, bool norm, moex_vk_ptr logits, moex_vk_ptr counter, moex_vk_ptr ids,
                                moex_vk_ptr weights, moex_vk_ptr xn, moex_error *err);

/* moex_vk_op_qk_rope with each token's position and row from tokpos. */
int moex_vk_op_qk_rope_tokens(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k,
                              moex_vk_ptr v, moex_vk_ptr k_cache, moex_vk_ptr v_cache, moex_vk_ptr q_norm,
                              moex_vk_ptr k_norm, moex_vk_ptr tokpos, int64_t n, moex_error *err);
/* moex_vk_op_attention_decode for n tokens (MOEX_VK_EACH): q, k, v rows of
 * n tokens, scratch of moex_vk_attention_decode_scratch(sh, n) floats, n x
 * n_head zeroed counters; grid (when not NULL) holds
 * moex_vk_attention_decode_grid_tokens(sh, the largest position, n).
 * same_seq: some of the tokens share a sequence (a speculative verify): the
 * new keys and values are appended by a dispatch of their own first, so that
 * each token reads the earlier ones' (the same bits as one at a time). */
size_t moex_vk_attention_decode_scratch(const moex_vk_attn_shape *sh, int64_t n);
void moex_vk_attention_decode_grid_tokens(const moex_vk_attn_shape *sh, int64_t max_pos, int64_t n, uint32_t grid[3]);
int moex_vk_op_attention_decode_tokens(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k,
                                       moex_vk_ptr v, moex_vk_ptr k_cache, moex_vk_ptr v_cache, moex_vk_ptr q_norm,
                                       moex_vk_ptr k_norm, moex_vk_ptr scratch, moex_vk_ptr counters,
                                       moex_vk_ptr tokpos, int64_t n, bool same_seq, moex_vk_buffer *grid,
                                       size_t grid_off, moex_error *err);
/* Causal attention of n prompt tokens (MOEX_VK_TILED) in runs: a run is
 * consecutive tokens of one sequence at consecutive positions, each attending
 * over its sequence's keys up to its position (written before, as
 * moex_vk_op_qk_rope_tokens does). The tiled kernels take a table of blocks
 * (moex_vk_attention_runs_blocks(vk, sh, v_cache, n) of 4 int32 at most) and
 * an indirect grid, both filled on the host by moex_vk_attention_runs_plan
 * from the tokens' (pos, base) pairs (host copy) and written where the op
 * reads them before the work runs; scratch: moex_vk_attention_scratch(sh, n). */
size_t moex_vk_attention_runs_blocks(const moex_vk *vk, const moex_vk_attn_shape *sh, moex_vk_ptr v_cache, int64_t n);
int64_t moex_vk_attention_runs_plan(const moex_vk *vk, const moex_vk_attn_shape *sh, moex_vk_ptr v_cache,
                                    const int32_t *tokpos, int64_t n, int32_t *blocks, uint32_t grid[3]);
int moex_vk_op_attention_runs(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k_cache,
                              moex_vk_ptr v_cache, moex_vk_ptr out, moex_vk_ptr scratch, moex_vk_ptr tokpos,
                              moex_vk_ptr blocks, moex_vk_buffer *grid, size_t grid_off, int64_t n, moex_error *err);

#endif
