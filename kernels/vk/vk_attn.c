/* Recording attention: QK-norm + RoPE + KV append, the split-K decode step
 * (attn_dec.comp, fused) and the prompt-batch attention (attn_coop.comp on
 * cooperative matrices, the f32 tiled modes, or the split-K path with its
 * merge); each for one sequence (positions params[0] + t) or, the *_tokens
 * and *_runs ops, for tokens of several sequences (a (pos, base) pair each). */

#include <stdlib.h>

#include "kernels/vk/vk_internal.h"

static int check_attn_shape(const moex_vk_attn_shape *sh, moex_error *err) {
    if (sh->n_head <= 0 || sh->n_head_kv <= 0 || sh->n_head % sh->n_head_kv || sh->head_dim <= 0 ||
        sh->head_dim > 512 || sh->head_dim % 4 || sh->rope_dim > sh->head_dim || sh->rope_dim % 2 || sh->n_ctx <= 0)
        return moex_fail(err, "vulkan: attention shape heads %d/%d x %d (rope %d) is not supported "
                         "(head_dim a multiple of 4, <= 512)", sh->n_head, sh->n_head_kv, sh->head_dim, sh->rope_dim);
    return 0;
}

/* tokens: params holds a (pos, base) pair per token (VK_ATTN_TOKENS), else params[0] is the first position. */
static int qk_rope(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k, moex_vk_ptr v,
                   moex_vk_ptr k_cache, moex_vk_ptr v_cache, moex_vk_ptr q_norm, moex_vk_ptr k_norm, moex_vk_ptr params,
                   int64_t n, bool tokens, moex_error *err) {
    if (check_attn_shape(sh, err) || vk_check_grid(n, sh->n_head + sh->n_head_kv, 1, err)) return -1;
    if (sh->qk_norm && (!q_norm || !k_norm)) return moex_fail(err, "vulkan: QK-norm needs q_norm and k_norm weights");
    const vk_pipe *p = vk_pipeline(c->vk, VK_K_QKROPE, 0, 0, err);
    if (!p) return -1;
    vk_pc pc = {.p = {q, k, v, k_cache, v_cache, params, q_norm, k_norm},
                .u = {(uint32_t)sh->n_head, (uint32_t)sh->n_head_kv, (uint32_t)sh->head_dim, (uint32_t)sh->rope_dim,
                      (sh->qk_norm ? 1u : 0u) | (sh->neox ? 2u : 0u) | (tokens ? VK_ATTN_TOKENS : 0u),
                      vk_fbits(sh->rope_base), vk_fbits(sh->rms_eps)}};
    if (n > 0) vk_dispatch(c, p, &pc, (uint32_t)n, (uint32_t)(sh->n_head + sh->n_head_kv), 1);
    return 0;
}

int moex_vk_op_qk_rope(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k, moex_vk_ptr v,
                       moex_vk_ptr k_cache, moex_vk_ptr v_cache, moex_vk_ptr q_norm, moex_vk_ptr k_norm,
                       moex_vk_ptr params, int64_t n, moex_error *err) {
    return qk_rope(c, sh, q, k, v, k_cache, v_cache, q_norm, k_norm, params, n, false, err);
}

int moex_vk_op_qk_rope_tokens(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k,
                              moex_vk_ptr v, moex_vk_ptr k_cache, moex_vk_ptr v_cache, moex_vk_ptr q_norm,
                              moex_vk_ptr k_norm, moex_vk_ptr tokpos, int64_t n, moex_error *err) {
    return qk_rope(c, sh, q, k, v, k_cache, v_cache, q_norm, k_norm, tokpos, n, true, err);
}

/* Splits of the key positions: decode gives each workgroup a short serial
 * chain of keys (the splits fill the GPU), at most MAX_SPLITS. The context's
 * splits of CTX_KEYS size the scratch and the direct dispatch; a long context
 * (more than DIRECT_SPLITS of them) dispatches instead the splits of about
 * POS_KEYS the position needs; a short context runs all its splits, the
 * empty ones exiting at once (docs/PERF.md has the split sizes compared).
 * attn_dec.comp's merge gets VK_ATTN_MAX_SPLITS as MAX_SPLITS. */
enum { CTX_KEYS = 64, POS_KEYS = VK_ATTN_POS_KEYS, MAX_SPLITS = VK_ATTN_MAX_SPLITS, DIRECT_SPLITS = 16 };

/* The head_dim class of the f32 tiles and of attn_dec.comp: head_dim <= 64 << class. */
static int head_dim_class(const moex_vk_attn_shape *sh) {
    int cls = 0;
    while ((64 << cls) < sh->head_dim) cls++;
    return cls;
}

static int64_t splits_for(int64_t keys, int64_t per) {
    const int64_t s = (keys + per - 1) / per;
    return s < 1 ? 1 : s > MAX_SPLITS ? MAX_SPLITS : s;
}
static int64_t attn_splits(const moex_vk_attn_shape *sh, int64_t n) {
    return n > 1 ? 1 : splits_for(sh->n_ctx, CTX_KEYS);
}

size_t moex_vk_attention_scratch(const moex_vk_attn_shape *sh, int64_t n) {
    return (size_t)n * (size_t)sh->n_head * (size_t)attn_splits(sh, n) * (size_t)(sh->head_dim + 2);
}

/* The tiled prompt-batch attention (attn.comp modes 2..5 by head_dim class
 * HDMAX = 64 << (mode - 2), R = 4096 / HDMAX query rows and BK keys a tile;
 * modes 6..9 the same with half the rows, for 32 KiB of shared memory).
 * Returns 0 where it does not apply: one token, vk->tune.attn_simple (the
 * split-K path, kept for comparison), or too little shared memory. */
static int attn_tiled_mode(const moex_vk *vk, const moex_vk_attn_shape *sh, int64_t n, uint32_t *rows) {
    if (n <= 1 || vk->tune.attn_simple) return 0;
    const int cls = head_dim_class(sh);
    const uint32_t hdmax = 64u << cls, st = hdmax / 4 + 1, bk = hdmax <= 128 ? 32 : 4096 / hdmax;
    for (int half = 0; half < 2; half++) {
        const uint32_t r = (half ? 2048 : 4096) / hdmax;
        if ((size_t)(r + bk) * st * 16 + (size_t)r * bk * 4 + r * 4 <= vk->info.shared_mem) {
            *rows = r;
            return 2 + cls + 4 * half;
        }
    }
    return 0;
}

/* The prompt attention on cooperative matrices: its mode (the head_dim
 * class, 0: <= 64, 1: <= 128) and rows per workgroup, or -1 where it does not
 * apply: no cooperative matrices of 16 x 16 x 16, head_dim over 128, a V cache
 * not 16-byte aligned. */
static int attn_coop_mode(const moex_vk *vk, const moex_vk_attn_shape *sh, moex_vk_ptr v_cache, uint32_t *rows) {
    const moex_vk_info *in = &vk->info;
    uint32_t warps, bc;
    if (!in->coop || in->coop_m != 16 || in->coop_n != 16 || in->coop_k != 16 || sh->head_dim > 128 ||
        v_cache % 16)
        return -1;
    const int mode = sh->head_dim > 64;
    if (vk_attn_coop_config(vk, mode, &warps, &bc)) return -1;
    *rows = 16 * warps;
    return mode;
}

/* The prompt attention's kernel: the f32 tiles (tiled: attn.comp's mode) or
 * the matrix unit (coop >= 0: attn_coop.comp's), rows query rows a
 * workgroup, or neither (tiled 0: the split-K path). runs: tokens of several
 * sequences, where nothing may depend on n (a token's arithmetic must not
 * depend on what shares its batch): the tiles and the matrix unit wherever
 * they apply, and the split-K path with one split. */
typedef struct attn_kind {
    int tiled, coop;
    uint32_t rows;
    int64_t splits;
} attn_kind;

static attn_kind attn_kind_of(const moex_vk *vk, const moex_vk_attn_shape *sh, moex_vk_ptr v_cache, int64_t n,
                              bool runs) {
    attn_kind k = {.coop = -1};
    k.tiled = attn_tiled_mode(vk, sh, runs ? 2 : n, &k.rows);
    if (k.tiled && (runs || n >= VK_ATTN_COOP_MIN)) k.coop = attn_coop_mode(vk, sh, v_cache, &k.rows);
    k.splits = runs ? 1 : attn_splits(sh, n);
    return k;
}

/* The split-K path: partials of (head, token, split), then their merge. */
static int attention_split(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k_cache,
                           moex_vk_ptr v_cache, moex_vk_ptr out, moex_vk_ptr scratch, moex_vk_ptr params, int64_t n,
                           int64_t ns, bool tokens, moex_error *err) {
    const int64_t chunk = (sh->n_ctx + ns - 1) / ns;
    const vk_pipe *pa = vk_pipeline(c->vk, VK_K_ATTN, 0, 0, err), *pm = vk_pipeline(c->vk, VK_K_ATTN_MERGE, 0, 0, err);
    if (!pa || !pm) return -1;
    if (n <= 0) return 0;
    vk_pc pc = {.p = {q, k_cache, v_cache, scratch, params},
                .u = {(uint32_t)sh->n_head, (uint32_t)sh->n_head_kv, (uint32_t)sh->head_dim, (uint32_t)ns,
                      (uint32_t)chunk, vk_fbits(sh->scale), tokens ? VK_ATTN_TOKENS : 0u}};
    vk_dispatch(c, pa, &pc, (uint32_t)sh->n_head, (uint32_t)n, (uint32_t)ns);
    moex_vk_barrier(c);
    vk_pc pm_pc = {.p = {scratch, out}, .u = {(uint32_t)sh->n_head, (uint32_t)sh->head_dim, (uint32_t)ns}};
    vk_dispatch(c, pm, &pm_pc, (uint32_t)sh->n_head, (uint32_t)n, 1);
    return 0;
}

static const vk_pipe *attn_tiled_pipeline(moex_vk_cmd *c, const attn_kind *k, moex_error *err) {
    return k->coop >= 0 ? vk_pipeline(c->vk, VK_K_ATTN_COOP, 0, k->coop, err) : vk_pipeline(c->vk, VK_K_ATTN, 0, k->tiled, err);
}

static int check_attention(const moex_vk_attn_shape *sh, moex_vk_ptr k_cache, int64_t n, int64_t ns, moex_error *err) {
    if (check_attn_shape(sh, err) || vk_check_grid(sh->n_head, n, ns, err)) return -1;
    if (k_cache % 16) return moex_fail(err, "vulkan: the K cache must be 16-byte aligned on the GPU");
    return 0;
}

int moex_vk_op_attention(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k_cache,
                         moex_vk_ptr v_cache, moex_vk_ptr out, moex_vk_ptr scratch, moex_vk_ptr params, int64_t n,
                         moex_error *err) {
    const attn_kind k = attn_kind_of(c->vk, sh, v_cache, n, false);
    if (check_attention(sh, k_cache, n, k.splits, err)) return -1;
    if (!k.tiled) return attention_split(c, sh, q, k_cache, v_cache, out, scratch, params, n, k.splits, false, err);
    /* workgroup = rows (token, q head) pairs of one KV group; writes out directly (coop: same grid and push constants) */
    const int64_t gx = (n * (sh->n_head / sh->n_head_kv) + k.rows - 1) / k.rows;
    if (vk_check_grid(gx, sh->n_head_kv, 1, err)) return -1;
    const vk_pipe *p = attn_tiled_pipeline(c, &k, err);
    if (!p) return -1;
    vk_pc pc = {.p = {q, k_cache, v_cache, out, params},
                .u = {(uint32_t)sh->n_head, (uint32_t)sh->n_head_kv, (uint32_t)sh->head_dim, (uint32_t)n,
                      vk_fbits(sh->scale)}};
    vk_dispatch(c, p, &pc, (uint32_t)gx, (uint32_t)sh->n_head_kv, 1);
    return 0;
}

/* ---- several sequences: runs of one sequence's consecutive positions ---- */

size_t moex_vk_attention_runs_blocks(const moex_vk *vk, const moex_vk_attn_shape *sh, moex_vk_ptr v_cache, int64_t n) {
    const attn_kind k = attn_kind_of(vk, sh, v_cache, n, true);
    if (!k.tiled || n <= 0) return 0;
    /* a run of len tokens takes ceil(len group / rows) blocks: at most len group / rows + 1 */
    return (size_t)((n * (sh->n_head / sh->n_head_kv) + k.rows - 1) / k.rows + n);
}

/* A block is 4 words (attn.comp, attn_coop.comp): its run's first token,
 * the run's length, the block's first row in the run, and (for the order
 * only) the keys its last row reads. */
static int by_keys_desc(const void *a, const void *b) {
    const int32_t x = ((const int32_t *)a)[3], y = ((const int32_t *)b)[3];
    return (y > x) - (y < x);
}

int64_t moex_vk_attention_runs_plan(const moex_vk *vk, const moex_vk_attn_shape *sh, moex_vk_ptr v_cache,
                                    const int32_t *tokpos, int64_t n, int32_t *blocks, uint32_t grid[3]) {
    const attn_kind k = attn_kind_of(vk, sh, v_cache, n, true);
    const int64_t group = sh->n_head / sh->n_head_kv;
    grid[0] = 0;
    grid[1] = (uint32_t)sh->n_head_kv;
    grid[2] = 1;
    if (!k.tiled) return 0;
    int64_t nb = 0;
    for (int64_t t0 = 0, t1; t0 < n; t0 = t1) {
        for (t1 = t0 + 1; t1 < n && tokpos[2 * t1 + 1] == tokpos[2 * t0 + 1] && tokpos[2 * t1] == tokpos[2 * t1 - 2] + 1;
             t1++) {}
        const int64_t rows = (t1 - t0) * group;
        for (int64_t f0 = 0; f0 < rows; f0 += k.rows) {
            const int64_t last = (f0 + k.rows < rows ? f0 + k.rows : rows) - 1;
            int32_t *b = blocks + 4 * nb++;
            b[0] = (int32_t)t0;
            b[1] = (int32_t)(t1 - t0);
            b[2] = (int32_t)f0;
            b[3] = (int32_t)(tokpos[2 * t0] + last / group + 1);
        }
    }
    /* the blocks with the most keys first, so the short ones fill the tail */
    qsort(blocks, (size_t)nb, 4 * sizeof *blocks, by_keys_desc);
    grid[0] = (uint32_t)nb;
    return nb;
}

int moex_vk_op_attention_runs(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k_cache,
                              moex_vk_ptr v_cache, moex_vk_ptr out, moex_vk_ptr scratch, moex_vk_ptr tokpos,
                              moex_vk_ptr blocks, moex_vk_buffer *grid, size_t grid_off, int64_t n, moex_error *err) {
    const attn_kind k = attn_kind_of(c->vk, sh, v_cache, n, true);
    if (check_attention(sh, k_cache, n, k.splits, err)) return -1;
    if (!k.tiled) return attention_split(c, sh, q, k_cache, v_cache, out, scratch, tokpos, n, 1, true, err);
    if (!blocks || blocks % 4 || !grid || grid_off % 4 || grid_off + 12 > grid->size)
        return moex_fail(err, "vulkan: attention over runs needs its block table and a 12-byte grid at a 4-byte offset");
    const vk_pipe *p = attn_tiled_pipeline(c, &k, err);
    if (!p) return -1;
    if (n <= 0) return 0;
    vk_pc pc = {.p = {q, k_cache, v_cache, out, tokpos, blocks},
                .u = {(uint32_t)sh->n_head, (uint32_t)sh->n_head_kv, (uint32_t)sh->head_dim, (uint32_t)n,
                      vk_fbits(sh->scale), VK_ATTN_TOKENS}};
    vk_dispatch_indirect(c, p, &pc, grid, grid_off);
    return 0;
}

/* Indirect: the splits the position's keys 0..pos need, each of
 * ceil((pos + 1) / splits) keys (attn_dec.comp computes the same chunk). */
void moex_vk_attention_decode_grid(const moex_vk_attn_shape *sh, int64_t pos, uint32_t grid[3]) {
    moex_vk_attention_decode_grid_tokens(sh, pos, 1, grid);
}

void moex_vk_attention_decode_grid_tokens(const moex_vk_attn_shape *sh, int64_t max_pos, int64_t n, uint32_t grid[3]) {
    const int64_t used = splits_for(max_pos + 1, POS_KEYS), ns = attn_splits(sh, 1);
    grid[0] = (uint32_t)sh->n_head;
    grid[1] = (uint32_t)n;
    grid[2] = (uint32_t)(used < ns ? used : ns);
}

/* A token's partials, whole vec4s (attn_dec.comp rounds each token's share up the same way). */
size_t moex_vk_attention_decode_scratch(const moex_vk_attn_shape *sh, int64_t n) {
    return (size_t)n * ((moex_vk_attention_scratch(sh, 1) + 3) & ~(size_t)3);
}

static int attention_decode(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k, moex_vk_ptr v,
                            moex_vk_ptr k_cache, moex_vk_ptr v_cache, moex_vk_ptr q_norm, moex_vk_ptr k_norm,
                            moex_vk_ptr scratch, moex_vk_ptr counters, moex_vk_ptr params, int64_t n, uint32_t tokens,
                            moex_vk_buffer *grid, size_t grid_off, moex_error *err) {
    const int64_t ns = attn_splits(sh, 1), chunk = (sh->n_ctx + ns - 1) / ns;
    if (check_attn_shape(sh, err) || vk_check_grid(sh->n_head, n, ns, err)) return -1;
    if (k_cache % 16) return moex_fail(err, "vulkan: the K cache must be 16-byte aligned on the GPU");
    if (sh->qk_norm && (!q_norm || !k_norm)) return moex_fail(err, "vulkan: QK-norm needs q_norm and k_norm weights");
    if (!counters || counters % 4) return moex_fail(err, "vulkan: the fused attention needs n_head zeroed counters");
    if (grid && (grid_off % 4 || grid_off + 12 > grid->size || !grid->map))
        return moex_fail(err, "vulkan: the decode attention's grid needs 12 host-visible bytes at a 4-byte offset");
    if (v_cache % 16 || scratch % 16)
        return moex_fail(err, "vulkan: the V cache and the decode attention's scratch must be 16-byte aligned");
    const bool indirect = grid && ns > DIRECT_SPLITS;
    const vk_pipe *p = vk_pipeline(c->vk, VK_K_ATTN_DEC, 0, head_dim_class(sh), err);
    if (!p) return -1;
    if (n <= 0) return 0;
    vk_pc pc = {.p = {q, k_cache, v_cache, scratch, params, k, v, counters},
                .u = {(uint32_t)sh->n_head | (uint32_t)sh->n_head_kv << 16,
                      (uint32_t)sh->head_dim | (uint32_t)sh->rope_dim << 16, (uint32_t)ns, (uint32_t)chunk,
                      vk_fbits(sh->scale), vk_fbits(sh->rope_base), vk_fbits(sh->rms_eps),
                      (sh->qk_norm ? 1u : 0u) | (sh->neox ? 2u : 0u) | (indirect ? 4u : 0u) |
                          tokens,
                      (uint32_t)q_norm, (uint32_t)(q_norm >> 32), (uint32_t)k_norm, (uint32_t)(k_norm >> 32)}};
    if (indirect) vk_dispatch_indirect(c, p, &pc, grid, grid_off);
    else vk_dispatch(c, p, &pc, (uint32_t)sh->n_head, (uint32_t)n, (uint32_t)ns);
    return 0;
}

int moex_vk_op_attention_decode(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k,
                                moex_vk_ptr v, moex_vk_ptr k_cache, moex_vk_ptr v_cache, moex_vk_ptr q_norm,
                                moex_vk_ptr k_norm, moex_vk_ptr scratch, moex_vk_ptr counters, moex_vk_ptr params,
                                moex_vk_buffer *grid, size_t grid_off, moex_error *err) {
    return attention_decode(c, sh, q, k, v, k_cache, v_cache, q_norm, k_norm, scratch, counters, params, 1, 0u, grid,
                            grid_off, err);
}

int moex_vk_op_attention_decode_tokens(moex_vk_cmd *c, const moex_vk_attn_shape *sh, moex_vk_ptr q, moex_vk_ptr k,
                                       moex_vk_ptr v, moex_vk_ptr k_cache, moex_vk_ptr v_cache, moex_vk_ptr q_norm,
                                       moex_vk_ptr k_norm, moex_vk_ptr scratch, moex_vk_ptr counters,
                                       moex_vk_ptr tokpos, int64_t n, bool same_seq, moex_vk_buffer *grid,
                                       size_t grid_off, moex_error *err) {
    if (!same_seq)
        return attention_decode(c, sh, q, k, v, k_cache, v_cache, q_norm, k_norm, scratch, counters, tokpos, n,
                                VK_ATTN_TOKENS, grid, grid_off, err);
    if (attention_decode(c, sh, q, k, v, k_cache, v_cache, q_norm, k_norm, scratch, counters, tokpos, n,
                         VK_ATTN_TOKENS | VK_ATTN_APPEND_ONLY, grid, grid_off, err))
        return -1;
    moex_vk_barrier(c);
    return attention_decode(c, sh, q, k, v, k_cache, v_cache, q_norm, k_norm, scratch, counters, tokpos, n,
                            VK_ATTN_TOKENS | VK_ATTN_NO_APPEND, grid, grid_off, err);
}
