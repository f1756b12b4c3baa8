/* The hub module: a GGUF model bound to its weights, the forward pass, the
 * expert-executor seam where MoE layers hand work to experts (local or
 * remote), and token generation.
 *
 * One token's path: moex_generate → moex_forward → per layer
 * attention (kernels) → router → executor->run (local: moex_experts_run) →
 * residual → LM head → sampler. */
#ifndef MOEX_HUB_H
#define MOEX_HUB_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/common.h"
#include "kernels/kernels.h"

/* ---- model: weights as views into the mapped GGUF ---- */

typedef struct moex_layer {
    const float *attn_norm, *ffn_norm;   /* n_embd */
    const float *q_norm, *k_norm;        /* head_dim, qwen3 only */
    moex_matrix wq, wk, wv, wo;
    moex_matrix ffn_gate, ffn_up, ffn_down;   /* dense layers */
    moex_matrix router;                       /* MoE: n_expert x n_embd */
    moex_expert_weights *experts;             /* MoE: n_expert */
} moex_layer;

typedef struct moex_model {
    moex_hparams hp;
    moex_gguf *gguf;
    moex_tokenizer *tok;        /* NULL when the file has no tokenizer */
    moex_matrix tok_embd;       /* n_vocab x n_embd */
    moex_matrix output;         /* n_vocab x n_embd (tok_embd when tied) */
    const float *output_norm;
    moex_layer *layers;
    float *owned_f32;           /* norm vectors stored as f16/bf16, converted */
} moex_model;

moex_model *moex_model_load(const char *path, moex_error *err);
void moex_model_free(moex_model *m);
/* One line: arch, layers, hidden, experts, types, size. */
void moex_model_describe(const moex_model *m, char *buf, size_t cap);

/* ---- the expert executor: "compute these experts for these tokens with
 * these gate weights". The forward pass calls it once per MoE layer. ---- */

typedef struct moex_moe_request {
    int layer;
    int64_t n_tokens;
    int n_used;                  /* k experts per token */
    const int32_t *expert_ids;   /* n_tokens x k, best first */
    const float *gate_weights;   /* n_tokens x k, renormalised */
    const float *x;              /* n_tokens x n_embd: the FFN-normed hidden states */
    float *out;                  /* n_tokens x n_embd: sum_j gate_j * expert_j(x), summed in j order */
} moex_moe_request;

typedef struct moex_expert_executor {
    void *ctx;
    int (*run)(void *ctx, const moex_moe_request *req, moex_error *err);
} moex_expert_executor;

/* Expert boundary rounding. wire_dtype is a proto dtype (MOEX_DT_F16 = 1,
 * BF16 = 2, INT8 = 3, F32 = 5) or MOEX_WIRE_EXACT (no rounding at all). Rows
 * (expert inputs and results) round through the wire dtype; gates travel as
 * f16 whatever the dtype. tmp holds moex_wire_tmp_bytes(dim). */
#define MOEX_WIRE_EXACT 0
#define MOEX_WIRE_DEFAULT 1 /* f16, as in the paper */
void moex_wire_round_rows(int wire_dtype, float *rows, int64_t n_rows, int64_t dim, uint8_t *tmp);
void moex_wire_round_gates(int wire_dtype, float *gates, int64_t n);
size_t moex_wire_tmp_bytes(int64_t dim);

/* The executor that computes experts from the model's own weights, rounding
 * at the expert boundary as the wire would (wire_dtype). */
typedef struct moex_local_executor moex_local_executor;
moex_local_executor *moex_local_executor_create(const moex_model *m, moex_pool *pool, int wire_dtype);
void moex_local_executor_free(moex_local_executor *le);
moex_expert_executor moex_local_executor_iface(moex_local_executor *le);

/* ---- inference state: KV cache and activations, allocated once ---- */

typedef struct moex_state moex_state;

/* n_ctx: positions the KV cache holds; n_batch: most tokens per forward call. */
moex_state *moex_state_create(const moex_model *m, int64_t n_ctx, int64_t n_batch, moex_pool *pool,
                              moex_expert_executor exec, moex_error *err);
void moex_state_free(moex_state *s);
int64_t moex_state_n_ctx(const moex_state *s);
int64_t moex_state_n_batch(const moex_state *s);

/* The checks every forward makes before anything changes: batch size,
 * positions within the context, token ids within the vocabulary. */
int moex_forward_check(const moex_model *m, int64_t n_batch, int64_t n_ctx, const int32_t *tokens, int64_t n,
                       int64_t pos, moex_error *err);

/* Evaluates n tokens at positions pos .. pos+n-1 (n <= n_batch, pos+n <= n_ctx).
 * logits: n x n_vocab when all_logits, else n_vocab for the last token.
 * Tokens are validated (0 <= id < n_vocab) before anything changes. */
int moex_forward(const moex_model *m, moex_state *s, const int32_t *tokens, int64_t n, int64_t pos,
                 bool all_logits, float *logits, moex_error *err);

/* ---- generation ---- */

typedef struct moex_gen_stats {
    double prompt_s, decode_s;    /* time in prompt evaluation / in the decode loop */
    int64_t n_prompt, n_generated;
    int64_t n_decode_evals;       /* single-token forward passes in decode_s */
} moex_gen_stats;

typedef struct moex_gen_params {
    int64_t n_predict;
    bool ignore_eos;             /* keep going past end-of-generation tokens */
    /* Called with every generated token; return nonzero to stop. */
    int (*on_token)(void *ctx, int32_t id);
    /* Called with the logits of each evaluated position (prompt first) when set;
     * rows are n_vocab floats. Makes the prompt evaluate all positions' logits. */
    int (*on_logits)(void *ctx, const float *logits, int64_t n_rows);
    void *cb_ctx;
} moex_gen_params;

/* What generation runs on: a forward function with the moex_forward contract
 * (the CPU state, or the Vulkan state with --backend vulkan). */
typedef struct moex_engine {
    void *ctx;
    int (*forward)(void *ctx, const int32_t *tokens, int64_t n, int64_t pos, bool all_logits, float *logits,
                   moex_error *err);
    int64_t n_ctx, n_batch;
} moex_engine;

/* The CPU engine over a state (moex_forward with the state's model). */
moex_engine moex_engine_cpu(moex_state *s);

int moex_generate(const moex_model *m, const moex_engine *eng, moex_sampler *smp, const int32_t *prompt,
                  int64_t n_prompt, const moex_gen_params *gp, moex_gen_stats *stats, moex_error *err);

/* ---- the distributed hub: workers over WebSockets ---- */

typedef struct moex_hub_config {
    const char *host;          /* listen address (default 127.0.0.1) */
    int port;                  /* 0 picks a free port (see moex_hub_port) */
    const char *token;         /* workers must present it; NULL/"" = no auth */
    int replicas;              /* r: replicas of every expert */
    int hedge;                 /* h >= 1 fixed, or 0 = auto (paper §4.1) */
    int timeout_ms;            /* per-expert deadline before re-dispatch */
    double verify_p;           /* fraction of results recomputed on the hub */
    bool local_fallback;       /* compute experts with no live replica here */
    int wire_dtype;            /* MOEX_DT_F16 (default), BF16, INT8 or F32 */
    bool compress;             /* LZ4 frames when it pays */
    int heartbeat_ms;          /* both ways */
    int dead_after_ms;         /* a silent worker is removed after this */
    uint64_t seed;             /* for verification sampling */
    int64_t max_batch;         /* most tokens per forward: bounds frame sizes */
} moex_hub_config;

void moex_hub_config_default(moex_hub_config *cfg);

typedef struct moex_hub moex_hub;

/* Starts the server (its own network thread). m must outlive the hub. */
moex_hub *moex_hub_start(const moex_model *m, moex_pool *pool, const moex_hub_config *cfg, moex_error *err);
int moex_hub_port(const moex_hub *hub);
/* Waits until at least n workers have joined and loaded their assignment. */
int moex_hub_wait_ready(moex_hub *hub, int n, double timeout_s, moex_error *err);
/* The executor that sends experts to workers (with hedging, timeouts, fallback). */
moex_expert_executor moex_hub_executor(moex_hub *hub);
/* Metrics: per-worker latency percentiles, hedges, timeouts, re-dispatches,
 * fallbacks, evictions, bytes; one place, printed at exit. */
void moex_hub_metrics_print(moex_hub *hub, FILE *f);
void moex_hub_stop(moex_hub *hub);

/* ---- Vulkan whole-model state (hub/forward_vk.c): the weights, KV cache
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
moex_vk *moex_vk_state_device(moex_vk_state *s);
/* As moex_forward; logits may be NULL when only the greedy token is wanted. */
int moex_vk_forward(const moex_model *m, moex_vk_state *s, const int32_t *tokens, int64_t n, int64_t pos,
                    bool all_logits, float *logits, moex_error *err);
/* Argmax of the last token's logits of the latest moex_vk_forward, computed on the GPU. */
int32_t moex_vk_last_argmax(const moex_vk_state *s);

/* The distributed hub on Vulkan (hub/forward_vk_dist.c): the GPU runs the
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
