/* The Vulkan engine: the forward pass with weights, KV cache and activations
 * on a GPU, and the distributed hub's GPU half (forward_vk_dist.c); the files
 * and their layers are described in forward_vk_internal.h. Built only with
 * -DMOEX_VULKAN=ON. */
#ifndef MOEX_ENGINE_VK_H
#define MOEX_ENGINE_VK_H

#include "engine/engine.h"
#include "kernels/vk/vk.h"

/* ---- Vulkan whole-model state (engine/vk/forward_vk_state.c): the weights, KV cache
 * and activations live on the GPU, allocated once; a token is one submit
 * (the recorded command buffer is reused, per-token values go through a
 * small host-visible buffer). Mirrors moex_state_create / moex_forward. ---- */

typedef struct moex_vk_state moex_vk_state;

/* opt: device choice and caches (NULL: defaults). Uploads the weights. */
moex_vk_state *moex_vk_state_create(const moex_model *m, int64_t n_ctx, int64_t n_batch, const moex_vk_options *opt,
                                    moex_error *err);
void moex_vk_state_free(moex_vk_state *s);
int64_t moex_vk_state_n_ctx(const moex_vk_state *s);
int64_t moex_vk_state_n_batch(const moex_vk_state *s);
/* Logits rows copied back to the host so far: a greedy decode on the engine
 * interface reads none (the GPU's argmax, moex_vk_last_argmax). */
int64_t moex_vk_state_logits_rows_read(const moex_vk_state *s);
moex_vk *moex_vk_state_device(moex_vk_state *s);
/* With moex_vk_options.experts_in_ram: where layer's experts' gate (which 0),
 * up (1) or down (2) weights sit in host memory, every expert in the file's
 * layout (so the CPU can compute from the same copy); else NULL. */
const void *moex_vk_state_experts_host(const moex_model *m, const moex_vk_state *s, int layer, int which);
/* As moex_forward; logits may be NULL when only the greedy token is wanted. */
int moex_vk_forward(const moex_model *m, moex_vk_state *s, const int32_t *tokens, int64_t n, int64_t pos,
                    bool all_logits, float *logits, moex_error *err);
/* Argmax of the last token's logits of the latest moex_vk_forward, computed on the GPU. */
int32_t moex_vk_last_argmax(const moex_vk_state *s);

/* ---- several sequences (moex_forward_batch's contract, engine.h) ----
 * A state of n_seq KV slots of n_ctx positions; moex_vk_forward uses slot 0.
 * moex_vk_forward_batch runs tokens of any slots in one forward (decode of N
 * sequences is one forward of N tokens; a prompt chunk is n consecutive
 * positions of one slot), one recording per batch shape, each token's slot
 * and position in the host-visible I/O words. A token's results never depend
 * on what shares its batch: a token whose logits are wanted and that is its
 * slot's last in the batch runs on the one-token decode kernels, any other on
 * the prompt kernels, whatever the batch holds (forward_vk_internal.h). So a
 * sequence decodes to the same tokens (and logits, bit for bit) alone or
 * with others, given its prompt tokens but the last run on the prompt
 * kernels; logits may differ in the last bits from moex_vk_forward's. */
moex_vk_state *moex_vk_state_create_multi(const moex_model *m, int64_t n_ctx, int64_t n_batch, int n_seq,
                                          const moex_vk_options *opt, moex_error *err);
int moex_vk_state_n_seq(const moex_vk_state *s);
/* As moex_forward_batch; logits may be NULL when no row is wanted back.
 * b->argmax is filled (the rows' argmax computed on the GPU, as
 * moex_vk_last_argmax's), and rows b->argmax_only marks are not read back. */
int moex_vk_forward_batch(const moex_model *m, moex_vk_state *s, const moex_batch *b, float *logits, moex_error *err);
/* Logits row `row` (in the order of the last moex_vk_forward_batch's wanted rows) into out (n_vocab floats):
 * a row left on the GPU (argmax_only) that turns out to be needed. Valid until the next forward. */
int moex_vk_read_logits_row(const moex_model *m, moex_vk_state *s, int64_t row, float *out, moex_error *err);
/* moex_engine.copy_rows on the GPU: slot from's K and V rows [0, n) into slot to, every layer (one submission). */
int moex_vk_state_copy_rows(const moex_model *m, moex_vk_state *s, int from, int to, int64_t n, moex_error *err);

/* The engine interface (engine.h) over a state and its model, both
 * outliving it: forward is moex_vk_forward, forward_batch moex_vk_forward_batch. */
typedef struct moex_vk_engine {
    const moex_model *m;
    moex_vk_state *s;
} moex_vk_engine;
moex_engine moex_engine_vk(moex_vk_engine *e);
/* The Vulkan state of an engine moex_engine_open opened on Vulkan, else NULL. */
moex_vk_state *moex_engine_vk_state(const moex_engine *eng);

/* The distributed hub on Vulkan (engine/vk/forward_vk_dist.c): the GPU runs the
 * embeddings, attention, norms, router and output head; every MoE layer's
 * experts go to an executor (moex_hub_executor: workers). A forward is then
 * n_layer + 1 recorded segments [add the previous layer's expert result ->
 * attention -> FFN norm + router -> read back ids, gates, xn]; between two
 * segments the host calls exec.run and writes the result where the next
 * segment reads it; each segment is one submit and fence wait. A failed
 * exec.run stops the forward; the error is returned and the state stays usable
 * (the KV rows of the failed positions are rewritten by the next call there). */

/* As moex_vk_state_create with the experts sent to exec: their weights are
 * not uploaded (the GPU holds attention, router and head only). */
moex_vk_state *moex_vk_state_create_remote(const moex_model *m, int64_t n_ctx, int64_t n_batch,
                                           const moex_vk_options *opt, moex_expert_executor exec, moex_error *err);
/* The same with n_seq KV slots for moex_vk_forward_batch: every layer's
 * segment carries all the batch's tokens, so each MoE layer is one exec.run
 * (one round of dispatches) for all of them. */
moex_vk_state *moex_vk_state_create_remote_multi(const moex_model *m, int64_t n_ctx, int64_t n_batch, int n_seq,
                                                 const moex_vk_options *opt, moex_expert_executor exec,
                                                 moex_error *err);
/* Sends the experts to exec from the next forward on; exec.run NULL returns
 * them to the GPU (an error for a state without the experts). No effect on dense models. */
int moex_vk_state_set_executor(const moex_model *m, moex_vk_state *s, moex_expert_executor exec, moex_error *err);

/* Host-side times of the distributed forwards since the last reset. */
typedef struct moex_vk_dist_stats {
    int64_t forwards;     /* distributed forwards that completed */
    int64_t segments;     /* middle segments timed in gpu_s (layers 1 .. n_layer-1 of each forward) */
    double gpu_s;         /* per middle segment: from submitting it (layer l-1's result written) until
                           * layer l's ids/gates/xn are readable on the host: GPU work (add, attention,
                           * router, readback copies) plus the submit/fence latency */
    double first_s;       /* submit -> layer 0's readback (embedding + layer 0), summed over forwards */
    double head_s;        /* last result written -> logits/argmax readable */
    double exec_s;        /* inside exec.run */
    double total_s;       /* whole distributed forwards */
} moex_vk_dist_stats;
void moex_vk_state_dist_stats(moex_vk_state *s, moex_vk_dist_stats *st, bool reset);

#endif
