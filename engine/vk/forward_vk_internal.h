/* Private to engine/vk: the Vulkan forward pass, in layers. A file uses only
 * the layers below its own (and this header), never one beside or above:
 *
 *   3  forward_vk_state.c     the public moex_vk_state: creation wires the
 *                             layers below together, moex_vk_forward and
 *                             moex_vk_forward_batch pick a path, free takes
 *                             it all down
 *   2  forward_vk_local.c     one recording per batch shape, a token one submit
 *      forward_vk_dist.c      one recording per layer segment, the experts run
 *                             by an executor between segments (distributed hub)
 *   1  forward_vk_record.c    each piece of a forward pass (embedding,
 *                             attention, router, experts, FFN, head) recorded
 *                             into a command buffer
 *      forward_vk_batch.c     a batch of several sequences: its checks, the
 *                             order its tokens run in and their I/O words
 *      forward_vk_memory.c    the memory plan (weights, KV cache, activations,
 *                             logits, the I/O words) and what both paths
 *                             share: the recording cache, a forward's inputs
 *                             and outputs
 *   0  this header            the state, the layout constants and each
 *                             layer's functions, lowest first
 *
 * So where a byte lives is answered in forward_vk_memory.c, which kernels run
 * in what order in forward_vk_record.c, and when what is submitted in the two
 * paths' files.
 *
 * Two kinds of forward share all of it. moex_vk_forward: n tokens of one
 * sequence (KV slot 0), each op picking the fastest kernels for n.
 * moex_vk_forward_batch: tokens of several sequences (KV slots of n_ctx rows
 * each), where batching must not change any token's results: each token runs
 * on kernels picked by what it is, never by what shares the batch. A token
 * whose logits are wanted and that is its sequence's last in the batch (a
 * decode token, or a prompt's last) runs on the one-token decode kernels
 * (MOEX_VK_EACH, the "each" tokens); every other token (prompt tokens) on
 * the tiled prompt kernels (MOEX_VK_TILED), in runs of one sequence's
 * consecutive positions. The batch runs reordered: each tokens first, then
 * the tiled tokens whose logits are wanted, then the rest. A sequence may
 * want several rows at once (a speculative verify: every row wanted): those
 * run on the one-token kernels too while the batch's each tokens stay within
 * vk_each_cap, so a verify's rows are the bits of one token at a time. */
#ifndef MOEX_FORWARD_VK_INTERNAL_H
#define MOEX_FORWARD_VK_INTERNAL_H

#include "engine/vk/engine_vk.h"

#define N_RECORDINGS 8
#define SYNC_BYTES ((size_t)64 << 10)

typedef struct vk_dist vk_dist;   /* forward_vk_dist.c */

typedef struct vk_layer {
    moex_vk_ptr attn_norm, ffn_norm, q_norm, k_norm;
    moex_vk_matrix wq, wk, wv, wo, ffn_gate, ffn_up, ffn_down, router;
    moex_vk_experts experts;
    const void *experts_host[3];   /* experts_in_ram: where gate, up and down (every expert, the file's layout)
                                    * sit in host memory, for the CPU to read too */
} vk_layer;

/* Which recordings exist, by batch shape: the local path's whole-token
 * recordings and the distributed path's segment sets each keep one, its slot i
 * indexing their own command buffers. A shape: n tokens of one sequence
 * (logits of all or of the last), or (batch) a batch of several sequences:
 * tokens [0, each) on the one-token kernels, [each, n) tiled, logits rows for
 * the first `rows` tokens (the each tokens, then the wanted tiled ones). */
typedef struct rec_key {
    int64_t n;
    bool all_logits, copy_logits;
    bool batch;
    int64_t each, rows;
    bool each_same_seq;    /* some slot has several each tokens (a speculative verify) */
} rec_key;
typedef struct rec_lru {
    rec_key key[N_RECORDINGS];
    bool valid[N_RECORDINGS];
    uint64_t last_use[N_RECORDINGS], clock;
} rec_lru;

/* Offsets (bytes) into the activation buffer. each_scratch, each_sync: the
 * decode attention of a batch's each tokens (at most vk_each_cap of them). */
typedef struct act_plan {
    size_t x, xn, q, k, v, att, attn_scratch, router_logits, counter, ids, gw, ex_scratch, ff_g, ff_u, argmax;
    size_t each_scratch, each_sync;
    /* SYNC_BYTES of zeros for kernels' completion counters (last-workgroup
     * patterns); a kernel that uses a counter resets it to 0 before it ends. */
    size_t sync;
    size_t total;
} act_plan;

typedef struct vk_batch vk_batch;   /* forward_vk_batch.c */

struct moex_vk_state {
    moex_vk *vk;
    int64_t n_ctx, n_batch;
    int n_seq;                        /* KV slots of n_ctx positions each; moex_vk_forward uses slot 0 */
    /* Memory (forward_vk_memory.c). */
    moex_vk_buffer **chunks;
    int n_chunks;
    moex_vk_buffer *kv, *act, *io, *logits_dev, *logits_host;
    moex_vk_buffer *grid;             /* indirect grids (device memory the host writes, a BAR): GRID_* */
    size_t io_tokpos, io_blocks;      /* I/O words of a batch: (pos, base) per token, the attention's run blocks */
    size_t io_rows_argmax;            /* I/O words: each logits row's argmax, one per row (batches) */
    int64_t logit_rows;               /* rows logits_dev/logits_host hold */
    act_plan a;
    moex_vk_attn_shape sh;
    vk_layer *layers;
    moex_vk_matrix tok_embd, output;
    moex_vk_ptr output_norm;
    bool experts_remote;              /* created without the experts' weights on the GPU */
    bool experts_in_ram;              /* the experts' weights in host memory the GPU reads over the bus */
    size_t weights_vram, experts_ram; /* bytes of weights in device memory, of experts in host memory */
    int32_t last_argmax;
    int64_t logits_rows_read;         /* logits rows copied to the caller since the state was made */
    /* Local path (forward_vk_local.c): whole-token recordings, slots of rec_lru. */
    moex_vk_cmd *rec[N_RECORDINGS];
    rec_lru rec_lru;
    /* Distributed path (forward_vk_dist.c): experts through an executor; NULL until one is set. */
    vk_dist *dist;
    /* Batches of several sequences (forward_vk_batch.c): the latest batch's order; NULL until the first. */
    vk_batch *batch;
};

/* I/O buffer layout (int32 words): params[4] (params[0] = position of the
 * first token, params[1] = 0: its KV rows' base), argmax, tokens[n_batch],
 * then (at s->io_tokpos) a batch's (pos, base) pairs [n_batch][2], (at
 * s->io_rows_argmax) its logits rows' argmax [n_batch] and (at s->io_blocks)
 * its attention blocks. */
enum { IO_PARAMS = 0, IO_ARGMAX = 4, IO_TOKENS = 8 };
/* Byte offsets of the indirect grids in s->grid: one sequence's decode
 * attention, a batch's decode attention of its each tokens, and its prompt
 * attention over runs. */
enum { GRID_ONE = 0, GRID_EACH = 16, GRID_RUNS = 32, GRID_BYTES = 48 };

#define ACT(field) (moex_vk_buffer_ptr(s->act) + s->a.field)
#define IO(word) (moex_vk_buffer_ptr(s->io) + (word) * 4)

/* ---- forward_vk_memory.c: the memory plan and what both paths share ---- */

/* Uploads the weights (s->layers, s->experts_remote and s->sh set) and
 * allocates the KV cache, activations, I/O words and one row of logits. */
int vk_memory_create(const moex_model *m, moex_vk_state *s, moex_error *err);
/* (Re)allocates the logit buffers for rows rows; the recordings that point at
 * the old ones must be recorded again. */
int vk_logits_alloc(const moex_model *m, moex_vk_state *s, int64_t rows, moex_error *err);
void vk_memory_free(moex_vk_state *s);
/* Writes the I/O words a forward pass of tokens[0..n) at pos reads, and the
 * decode attention's grid at pos in s->grid; returns the words. */
int32_t *vk_io_set(moex_vk_state *s, const int32_t *tokens, int64_t n, int64_t pos);
/* After a forward's last submit: the argmax from the I/O words, and `rows`
 * rows of logits when logits is not NULL. */
void vk_take_outputs(const moex_model *m, moex_vk_state *s, const int32_t *io, int64_t rows, float *logits);
/* The KV cache of layer il (K, and V after all layers' K): slots of n_ctx rows. */
moex_vk_ptr vk_k_cache(const moex_model *m, const moex_vk_state *s, int il);
moex_vk_ptr vk_v_cache(const moex_model *m, const moex_vk_state *s, int il);
/* The slot recorded for k (*hit true), else the least recently used one,
 * marked invalid until vk_rec_recorded says its new recording is complete. */
int vk_rec_find(rec_lru *l, rec_key k, bool *hit);
void vk_rec_recorded(rec_lru *l, int slot, rec_key k);
/* Every slot invalid (the buffers the recordings point at changed). */
void vk_rec_invalidate(rec_lru *l);
/* Records one forward of shape k into c (the local path's whole forward, or the distributed path's segments). */
typedef int (*vk_record_fn)(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, const rec_key *k, moex_error *err);
/* Creates every pipeline the state's forwards use now (in parallel) rather
 * than when a timed token first records it: record makes, into one command
 * buffer thrown away, the shapes where the ops switch kernels (one
 * sequence's sizes, with batches also theirs). */
int vk_warm(const moex_model *m, moex_vk_state *s, bool batches, vk_record_fn record, moex_error *err);

/* ---- forward_vk_batch.c: a batch of several sequences ---- */

/* Checks b (sizes, slots, positions in order within a slot, token ids) before
 * anything changes, orders its tokens (forward_vk_internal.h: each tokens,
 * wanted tiled ones, the rest), writes their I/O words and grids and returns
 * the recording's shape in *k (k->copy_logits: logits wanted and not NULL). */
int vk_batch_prepare(const moex_model *m, moex_vk_state *s, const moex_batch *b, bool want_rows, rec_key *k,
                     moex_error *err);
/* The most each tokens a batch runs: one per slot, plus a verify's rows. */
static inline int64_t vk_each_cap(const moex_vk_state *s) {
    const int64_t cap = (int64_t)s->n_seq + MOEX_SPEC_MAX_DRAFT;
    return cap < s->n_batch ? cap : s->n_batch;
}
/* Whether batch token t's row is wanted for its argmax alone (not read back). */
static inline bool vk_argmax_only(const moex_batch *b, int64_t t) {
    return b->argmax && b->argmax_only && b->argmax_only[t];
}
/* After the forward: the wanted rows' argmax into b->argmax (when asked) and
 * their logits from logits_host into logits (when not NULL), in batch order;
 * rows b->argmax_only marks are not copied. */
void vk_batch_take_outputs(const moex_model *m, moex_vk_state *s, const moex_batch *b, float *logits);
void vk_batch_free(moex_vk_state *s);

/* ---- forward_vk_record.c: each appends its ops (and the barrier after them) to c ---- */

int vk_record_embed(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int64_t n, moex_error *err);
/* Attention of layer il: x += Wo attention(norm(x)). */
int vk_record_attention(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, const rec_key *k,
                        moex_error *err);
/* MoE layers: xn = norm(x), then ids, gw = top-k of the router over xn. */
int vk_record_router(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, const rec_key *k, moex_error *err);
/* MoE layers: x += experts(xn) over ids and gw (the experts on this GPU). */
int vk_record_experts(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, const rec_key *k,
                      moex_error *err);
/* The FFN of layer il: router + experts, or the dense FFN. */
int vk_record_ffn(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, const rec_key *k, moex_error *err);
/* Output norm and head into logits_dev: over the last token (or all when
 * all_logits), argmax into the I/O buffer; a batch: its k->rows first tokens. */
int vk_record_head(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, const rec_key *k, moex_error *err);
/* The head's logits rows into the host-visible logits_host. */
void vk_record_logits_copy(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, const rec_key *k);
/* Logits rows a recording of shape k computes. */
int64_t vk_rec_rows(const rec_key *k);

/* ---- forward_vk_local.c: the forward pass as one recording per batch shape ---- */

int vk_local_forward(const moex_model *m, moex_vk_state *s, const int32_t *tokens, int64_t n, int64_t pos,
                     bool all_logits, float *logits, moex_error *err);
/* A batch's forward (its I/O words written by vk_batch_prepare); logits rows stay in logits_host. */
int vk_local_forward_batch(const moex_model *m, moex_vk_state *s, const rec_key *k, moex_error *err);
void vk_local_invalidate(moex_vk_state *s);   /* the logit buffers moved: record again */
/* vk_warm with the local path's recordings. */
int vk_local_warm(const moex_model *m, moex_vk_state *s, bool batches, moex_error *err);
void vk_local_free(moex_vk_state *s);

/* ---- forward_vk_dist.c: the forward pass as layer segments with the experts run by s->dist's executor ---- */

bool vk_dist_active(const moex_vk_state *s);
int vk_dist_forward(const moex_model *m, moex_vk_state *s, const int32_t *tokens, int64_t n, int64_t pos,
                    bool all_logits, float *logits, moex_error *err);
int vk_dist_forward_batch(const moex_model *m, moex_vk_state *s, const rec_key *k, moex_error *err);
void vk_dist_invalidate(moex_vk_state *s);   /* the logit buffers moved: record the head segments again */
/* The same for the segments (after an executor is set). */
int vk_dist_warm(const moex_model *m, moex_vk_state *s, bool batches, moex_error *err);
void vk_dist_free(moex_vk_state *s);
/* moex_vk_state_set_executor and moex_vk_state_dist_stats (engine_vk.h) live there too. */

#endif
