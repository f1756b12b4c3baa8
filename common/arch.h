/* Model architectures: hyperparameters read from GGUF metadata and the
 * tensor names llama.cpp uses. Shared by the hub's loader, the worker (which
 * loads only its experts) and the generator of test models.
 * Part of the common module's API (common/common.h). */
#ifndef MOEX_ARCH_H
#define MOEX_ARCH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "common/gguf.h"

typedef enum moex_arch {
    MOEX_ARCH_LLAMA,     /* dense llama, or Mixtral when llama.expert_count > 0 */
    MOEX_ARCH_QWEN3,     /* dense, QK-norm */
    MOEX_ARCH_QWEN3MOE,  /* MoE, QK-norm */
} moex_arch;

typedef struct moex_hparams {
    moex_arch arch;
    char arch_name[32];      /* general.architecture */
    int32_t n_layer;
    int32_t n_embd;          /* hidden size */
    int32_t n_ff;            /* dense FFN size (0 for pure MoE) */
    int32_t n_head, n_head_kv;
    int32_t head_dim;        /* key_length; value_length must match */
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_expert, n_expert_used;  /* 0 for dense models */
    int32_t n_ff_exp;        /* expert FFN size */
    int32_t rope_dim;        /* rotated dims per head */
    float rope_freq_base;
    float rms_eps;
    bool rope_neox;          /* rotate halves (qwen) instead of adjacent pairs (llama) */
    bool qk_norm;            /* RMSNorm on q and k per head (qwen3) */
    bool norm_topk;          /* renormalise the top-k gate weights to sum 1 */
} moex_hparams;

/* Reads and checks the hyperparameters (ranges, divisibility, tensor shapes
 * that the forward pass relies on are checked by the loader). */
int moex_hparams_read(const moex_gguf *g, moex_hparams *hp, moex_error *err);
bool moex_hparams_is_moe(const moex_hparams *hp);

/* Tensor names, formatted with the layer (and expert) index. */
#define MOEX_T_TOKEN_EMBD "token_embd.weight"
#define MOEX_T_OUTPUT_NORM "output_norm.weight"
#define MOEX_T_OUTPUT "output.weight"
#define MOEX_T_ATTN_NORM "blk.%d.attn_norm.weight"
#define MOEX_T_ATTN_Q "blk.%d.attn_q.weight"
#define MOEX_T_ATTN_K "blk.%d.attn_k.weight"
#define MOEX_T_ATTN_V "blk.%d.attn_v.weight"
#define MOEX_T_ATTN_OUT "blk.%d.attn_output.weight"
#define MOEX_T_ATTN_Q_NORM "blk.%d.attn_q_norm.weight"
#define MOEX_T_ATTN_K_NORM "blk.%d.attn_k_norm.weight"
#define MOEX_T_FFN_NORM "blk.%d.ffn_norm.weight"
#define MOEX_T_FFN_GATE "blk.%d.ffn_gate.weight"
#define MOEX_T_FFN_UP "blk.%d.ffn_up.weight"
#define MOEX_T_FFN_DOWN "blk.%d.ffn_down.weight"
#define MOEX_T_FFN_ROUTER "blk.%d.ffn_gate_inp.weight"
#define MOEX_T_FFN_GATE_EXPS "blk.%d.ffn_gate_exps.weight"
#define MOEX_T_FFN_UP_EXPS "blk.%d.ffn_up_exps.weight"
#define MOEX_T_FFN_DOWN_EXPS "blk.%d.ffn_down_exps.weight"
/* Older Mixtral files keep one tensor per expert. */
#define MOEX_T_FFN_GATE_EXP "blk.%d.ffn_gate.%d.weight"
#define MOEX_T_FFN_UP_EXP "blk.%d.ffn_up.%d.weight"
#define MOEX_T_FFN_DOWN_EXP "blk.%d.ffn_down.%d.weight"

#endif
