/* The engine module: a model's forward pass and generation on this machine.
 *
 * One token's path: moex_generate -> engine forward (moex_forward on the CPU,
 * engine/vk on a GPU) -> per layer attention (kernels) -> router ->
 * executor.run (the local executor: moex_experts_run; the distributed hub
 * plugs its remote executor in here) -> residual -> LM head -> sampler. */
#ifndef MOEX_ENGINE_H
#define MOEX_ENGINE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/common.h"
#include "common/wire_rows.h"   /* MOEX_WIRE_*, the expert boundary's rounding */
#include "kernels/kernels.h"
#include "kernels/vk/vk.h"
#include "model/model.h"

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

/* A MoE layer's work grouped by expert, shared by the local and the remote
 * executor so that both sum each token's k results in the same order:
 *   build:   the request's (token, expert) pairs, one group per active expert
 *            (ascending expert id), each group's pairs in token order;
 *   compute: each group's rows (results[pair * dim]) by whoever computes it;
 *   combine: out[t] = sum over j = 0..k-1 of the result of pair (t, j), in j order. */
typedef struct moex_moe_plan {
    int n_groups;              /* experts with at least one token */
    int32_t *group_expert;     /* [n_groups] expert id */
    int32_t *group_first;      /* [n_groups + 1] first pair of each group (grouped order) */
    int32_t *rows;             /* [n_pairs] grouped: the pair's token index in the request */
    float *gates;              /* [n_pairs] grouped: the pair's gate weight */
    int32_t *slot_of_pair;     /* [n_pairs] token-major pair t*k + j -> its grouped index */
    int64_t n_pairs;
    /* capacity (grown once per batch size, never per decode token) */
    int64_t cap_pairs;
    int cap_experts;
    int32_t *count;            /* [cap_experts] scratch */
} moex_moe_plan;

/* Groups req's pairs. Fails (nothing changed but the plan) when an expert id
 * is outside 0..n_expert-1 or memory runs out. */
int moex_moe_plan_build(moex_moe_plan *p, const moex_moe_request *req, int n_expert, moex_error *err);
/* req->out[t] = sum_j results[slot_of_pair[t*k + j] * dim .. + dim), in j order. */
void moex_moe_plan_combine(const moex_moe_plan *p, const moex_moe_request *req, const float *results, int64_t dim);
/* The same for tokens t0 <= t < t1 (threads may take disjoint ranges). */
void moex_moe_plan_combine_tokens(const moex_moe_plan *p, const moex_moe_request *req, const float *results,
                                  int64_t dim, int64_t t0, int64_t t1);
void moex_moe_plan_free(moex_moe_plan *p);

/* The expert boundary, on this side of the wire: jobs computed on x_wire
 * (the inputs already rounded through wire_dtype, moex_wire_round_rows) and
 * each job's results rounded as a worker's RESULT carries them. The one
 * place the local executor and the hub's own experts (fallback,
 * verification) compute experts. tmp holds moex_wire_tmp_bytes(hidden). */
int moex_experts_run_wire(moex_pool *pool, const moex_expert_job *jobs, int n_jobs, const float *x_wire, int64_t hidden,
                          int wire_dtype, uint8_t *tmp, moex_error *err);

/* The executor that computes experts from the model's own weights, rounding
 * at the expert boundary as the wire would (wire_dtype). */
typedef struct moex_local_executor moex_local_executor;
moex_local_executor *moex_local_executor_create(const moex_model *m, moex_pool *pool, int wire_dtype);
void moex_local_executor_free(moex_local_executor *le);
moex_expert_executor moex_local_executor_iface(moex_local_executor *le);

typedef struct moex_route_recorder moex_route_recorder; /* engine/route_trace.c, below */

/* ---- inference state: KV cache and activations, allocated once ---- */

typedef struct moex_state moex_state;

/* n_ctx: positions the KV cache holds; n_batch: most tokens per forward call. */
moex_state *moex_state_create(const moex_model *m, int64_t n_ctx, int64_t n_batch, moex_pool *pool,
                              moex_expert_executor exec, moex_error *err);
/* n_seq KV slots of n_ctx positions each (moex_forward_batch); moex_state_create is n_seq = 1. */
moex_state *moex_state_create_multi(const moex_model *m, int64_t n_ctx, int64_t n_batch, int n_seq, moex_pool *pool,
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

/* Tokens of several sequences in one forward: each token names its KV slot
 * and its position there; a slot's tokens come in position order. Writing a
 * slot from position 0 again simply overwrites it. Batching never changes a
 * sequence's tokens: each token's arithmetic is independent of the batch. */
typedef struct moex_batch {
    int64_t n;                 /* tokens in this forward */
    const int32_t *tokens;     /* [n] */
    const int32_t *seq;        /* [n] KV slot of each token, 0 .. n_seq-1 */
    const int32_t *pos;        /* [n] its position in that sequence */
    const bool *want_logits;   /* [n] whether its logits row is wanted */
    /* Engines with batch_argmax (moex_engine) only, else ignored: */
    int32_t *argmax;           /* NULL, or out: each wanted row's argmax (ties: the lowest id; -1: no finite
                                  maximum), in the order of the logits rows */
    const bool *argmax_only;   /* NULL, or [n]: wanted rows whose argmax is all the caller reads (a greedy
                                  sampler's): their logits rows may be left unwritten */
} moex_batch;

/* logits: one n_vocab row per wanted token, in batch order. Everything is
 * validated (sizes, slots, positions, token ids) before anything changes. */
int moex_forward_batch(const moex_model *m, moex_state *s, const moex_batch *b, float *logits, moex_error *err);

/* ---- generation ---- */

/* ---- speculative decoding (engine/speculate.c) ---- */

/* Proposes tokens that may follow a sequence; the engine then checks them all
 * in one forward and keeps the prefix its own sampling agrees with. */
typedef struct moex_drafter moex_drafter;
typedef struct moex_engine moex_engine;

/* Prompt lookup: the tokens that followed the latest earlier occurrence of the
 * sequence's last n-gram (ngram_max tokens, down to ngram_min). No model. */
moex_drafter *moex_drafter_lookup(int ngram_min, int ngram_max);
/* A draft model (the same vocabulary) on its own engine deng (the main
 * engine's context or more), in KV slot `slot` of it (a scheduler gives each
 * sequence its own drafter and slot; slot > 0 needs deng's forward_batch):
 * greedy drafts when sp is greedy, else drafts drawn from its distribution
 * under sp's filters and temperature. */
moex_drafter *moex_drafter_model(const moex_model *dm, const moex_engine *deng, int slot,
                                 const moex_sampler_params *sp);
/* first's drafts, or second's where first has none; owns both (frees them on failure too). */
moex_drafter *moex_drafter_chain(moex_drafter *first, moex_drafter *second);
void moex_drafter_free(moex_drafter *d);
/* Lets the drafter take in seq[0..n) now (a draft model's prompt, evaluated
 * with the model's), so that its first draft costs a draft; 0 or -1 (err). */
int moex_drafter_prime(moex_drafter *d, const int32_t *seq, int64_t n, moex_error *err);
/* Up to max tokens that may follow seq[0..n) into out; returns their count
 * (0: nothing to propose) or -1 (err). *sampled: the drafts were drawn from a
 * distribution, written to q (n_vocab floats a draft; q may be NULL only for
 * a drafter that never samples). */
int moex_drafter_propose(moex_drafter *d, const int32_t *seq, int64_t n, int max, int32_t *out, float *q,
                         bool *sampled, moex_error *err);

#define MOEX_SPEC_MAX_DRAFT 15

typedef struct moex_spec_params {
    moex_drafter *drafter;
    int draft_max;        /* tokens drafted per verify at most: 1 .. MOEX_SPEC_MAX_DRAFT (and the batch - 1);
                             the length adapts below it to what a step costs and what is accepted */
    int draft_min;        /* 0: draft only where it pays (the auto-off); N: ask for N at least every step, where
                             the user knows it pays (hub + workers) or wants to see drafts checked */
} moex_spec_params;

typedef struct moex_spec_stats {
    int64_t verifies;     /* forwards that checked drafts */
    int64_t drafted, accepted;
    int64_t hist[MOEX_SPEC_MAX_DRAFT + 1];   /* verifies by how many drafts they accepted */
    int64_t plain;        /* one-token forwards: nothing drafted (none found, or drafting does not pay here) */
    int64_t probes;       /* verifies of one draft while drafting did not pay, to see whether it does again */
} moex_spec_stats;

/* The acceptance rule on a verify's rows: row i holds the logits after the
 * sequence + draft[0..i) (n_draft + 1 rows). Greedy with logits NULL compares
 * argmax[i] (the engine's); else smp's distribution p of each row against the
 * drafter's q (q NULL: a deterministic drafter, q a point mass): draft[i]
 * stays with probability min(1, p/q), else the token is drawn from
 * max(p - q, 0) and the rest is dropped. Returns how many drafts stay and
 * sets *next to the token after them. scratch: n_vocab floats. */
int moex_spec_accept(moex_sampler *smp, int32_t n_vocab, const float *logits, const int32_t *argmax,
                     const int32_t *draft, int n_draft, const float *q, float *scratch, int32_t *next);
/* The next draft length (1 .. kmax) after a verify of `drafted` that kept
 * `accepted`: longer when all were kept, shorter when not. */
int moex_spec_next_length(int k_cur, int drafted, int accepted, int kmax);

typedef struct moex_gen_stats {
    double prompt_s, decode_s;    /* time in prompt evaluation / in the decode loop */
    int64_t n_prompt, n_generated;
    int64_t n_decode_evals;       /* forward passes in decode_s (one token each, or a verify's rows) */
    moex_spec_stats spec;         /* with gen params' spec */
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
    /* Speculative decoding when set (and its drafter): needs the engine's
     * forward_batch; not with on_logits. The tokens are those without it
     * (greedy: the same ids; sampling: the same distribution). */
    const moex_spec_params *spec;
} moex_gen_params;

/* What generation runs on: a forward function with the moex_forward contract
 * (the CPU state, or the Vulkan state with --backend vulkan). */
typedef struct moex_engine {
    void *ctx;
    int (*forward)(void *ctx, const int32_t *tokens, int64_t n, int64_t pos, bool all_logits, float *logits,
                   moex_error *err);
    int64_t n_ctx, n_batch;    /* n_ctx: positions per slot */
    int n_seq;                 /* KV slots (forward uses slot 0) */
    /* moex_forward_batch's contract; NULL where the engine has one slot only */
    int (*forward_batch)(void *ctx, const moex_batch *b, float *logits, moex_error *err);
    /* forward_batch fills b->argmax where the logits are computed, so that
     * greedy rows need not be read back (moex_batch.argmax_only) */
    bool batch_argmax;
    /* Optional: the argmax (ties: the lowest id) of the last forward's last
     * logits row, computed where the logits are, so that a greedy decode
     * can pass logits = NULL and read nothing back; -1 where the row has no
     * finite maximum. NULL where the engine has no such thing. */
    int32_t (*last_argmax)(void *ctx);
    /* Optional (engines with batch_argmax): copies logits row `row`, in the
     * order of the last forward_batch's wanted rows, into out (n_vocab
     * floats): a row that forward left where it was computed (argmax_only)
     * and that turns out to be needed after all (a grammar refused its
     * argmax). Valid until the next forward. */
    int (*read_row)(void *ctx, int64_t row, float *out, moex_error *err);
    /* Optional (engines with several slots): copies slot from's KV rows of
     * positions [0, n) into slot to, every layer, so that a sequence sharing
     * a prefix with another starts after it (the same bits: the rows are
     * copied, not recomputed). */
    int (*copy_rows)(void *ctx, int from, int to, int64_t n, moex_error *err);
    /* What moex_engine_open made for it (moex_engine_close frees it); NULL
     * for an engine over a state its caller owns (moex_engine_cpu). */
    struct moex_engine_parts *parts;
} moex_engine;

/* The CPU engine over a state the caller owns (moex_forward with the state's
 * model): for tests of the state itself; programs open theirs below. */
moex_engine moex_engine_cpu(moex_state *s);

/* ---- opening an engine (engine/open.c): the one place that picks the
 * backend, the device, where the experts run, the context, the KV slots and
 * the rounding at the expert boundary. Every program opens its engine here. ---- */

typedef enum moex_engine_backend { MOEX_ENGINE_CPU, MOEX_ENGINE_VULKAN } moex_engine_backend;

typedef struct moex_engine_options {
    moex_engine_backend backend;
    moex_vk_options vk;           /* Vulkan: device, pipeline cache, kernel choices (kernels/vk/vk.h) */
    int64_t n_ctx;                /* positions per KV slot */
    int64_t n_batch;              /* tokens per forward at most */
    int n_seq;                    /* KV slots (0: one) */
    bool batched;                 /* forward_batch wanted (a scheduler's): needed for n_seq > 1 */
    moex_pool *pool;              /* CPU threads: the CPU backend's forward and the experts computed here */
    int wire_dtype;               /* experts computed here round their inputs and results as this wire dtype would
                                   * (MOEX_WIRE_*), so that local tokens equal distributed ones */
    moex_expert_executor experts; /* .run set: every MoE layer's experts go there (the hub's workers) and their
                                   * weights stay off the GPU; Vulkan then rounds its products' inputs to 8 bits as
                                   * the CPU does, so hub + workers give the tokens of a CPU --local run */
    bool cpu_moe;                 /* Vulkan: the experts' weights stay in RAM and this process's threads (pool)
                                   * compute them, while the GPU runs everything else (the CPU tier, in-process:
                                   * no sockets); the threads spin between layers while a forward runs */
    bool record_routes;           /* keep each token's experts (moex_engine_routes); needs a MoE model and experts
                                   * that go through an executor (CPU backend, .cpu_moe or .experts) */
    bool warm_up;                 /* run a token through before returning (as llama.cpp's programs do): the first
                                   * request then pays no first-use costs (command buffers recorded, caches
                                   * filled); slot 0's position 0 is rewritten by the first real forward. Not
                                   * with .experts: the workers may not be there yet */
    int warm_verify;              /* with warm_up: speculative decoding's verifies of 1, 2, 4 ... up to warm_verify
                                   * drafts run through too (slot 0 from position 0, rewritten later), so that a
                                   * GPU engine records their batch shapes before the first one is timed */
} moex_engine_options;

/* Opens an engine over m (which outlives it). On failure err says why and
 * nothing is left open. */
int moex_engine_open(const moex_model *m, const moex_engine_options *o, moex_engine *eng, moex_error *err);
void moex_engine_close(moex_engine *eng);
/* The routing recorder of an engine opened with record_routes, else NULL. */
moex_route_recorder *moex_engine_routes(const moex_engine *eng);
/* Short words for logs and /metrics: "vulkan" or "cpu (avx2)". */
const char *moex_engine_backend_name(const moex_engine *eng);

int moex_generate(const moex_model *m, const moex_engine *eng, moex_sampler *smp, const int32_t *prompt,
                  int64_t n_prompt, const moex_gen_params *gp, moex_gen_stats *stats, moex_error *err);
/* moex_generate's decode loop with gp->spec, after the prompt (its last logits row given). */
int moex_generate_speculative(const moex_model *m, const moex_engine *eng, moex_sampler *smp, const int32_t *prompt,
                              int64_t n_prompt, const float *last_logits, const moex_gen_params *gp,
                              moex_gen_stats *stats, moex_error *err);

/* ---- perplexity (engine/perplexity.c): llama.cpp's definition ---- */

typedef struct moex_ppl_params {
    int64_t n_ctx;        /* window length; the second half of each window is scored */
    int64_t n_chunks;     /* windows to score; <= 0: every whole window of the text */
    int32_t bos;          /* replaces the first token of each window; < 0 keeps it */
    /* Optional: the argmax id at every scored position, n_chunks x
     * moex_perplexity_scored_per_chunk(n_ctx), for teacher-forced comparisons. */
    int32_t *top1;
    /* Called after each window with the running PPL; nonzero stops. */
    int (*on_chunk)(void *ctx, int64_t chunk, double ppl_so_far);
    void *cb_ctx;
} moex_ppl_params;

typedef struct moex_ppl_result {
    int64_t n_chunks, n_scored;
    double nll;           /* mean negative log-likelihood (nats) */
    double ppl, ppl_err;  /* exp(nll) and llama.cpp's +/- (standard error of the NLL times PPL) */
} moex_ppl_result;

/* Scores tokens[0..n_tokens) in windows of p->n_ctx (positions 0.. each) on
 * eng; needs n_tokens >= 2 n_ctx, as llama.cpp does. */
int moex_perplexity(const moex_engine *eng, int64_t n_vocab, const int32_t *tokens, int64_t n_tokens,
                    const moex_ppl_params *p, moex_ppl_result *r, moex_error *err);
/* Scored positions per window: n_ctx/2 .. n_ctx-2. */
int64_t moex_perplexity_scored_per_chunk(int64_t n_ctx);

typedef struct moex_ppl_file_params {
    const char *path;       /* UTF-8 text, tokenized by the model's tokenizer (BOS first, no special tokens) */
    int64_t n_ctx, n_chunks;
    const char *top1_path;  /* optional: one line of top-1 ids per window */
} moex_ppl_file_params;

/* moex-hub --perplexity: reads, tokenizes and scores a text file, printing
 * llama.cpp's running estimate "[1]x,[2]y,..." and "Final estimate: PPL = ...". */
int moex_perplexity_file(const moex_model *m, const moex_engine *eng, const moex_ppl_file_params *fp, FILE *out,
                         moex_error *err);

/* ---- routing traces (engine/route_trace.c) ---- */

/* An executor that records the experts chosen for every token and layer and
 * passes each request on to `inner`. NULL for a dense model or out of memory. */
moex_route_recorder *moex_route_recorder_create(moex_expert_executor inner, const moex_hparams *hp);
void moex_route_recorder_free(moex_route_recorder *r);
moex_expert_executor moex_route_recorder_iface(moex_route_recorder *r);
int64_t moex_route_recorder_tokens(const moex_route_recorder *r);
/* Text: a header line "layers L experts E k K tokens T", then per token L
 * groups of K ids separated by " | " (moex-sim token --route-trace reads it). */
int moex_route_recorder_write(const moex_route_recorder *r, const char *path, moex_error *err);

#endif
