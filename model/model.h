/* The model module: a GGUF file bound to its weights. Every tensor becomes a
 * view (type, shape, row bytes, data pointer) into the read-only mapping;
 * nothing is copied but the norm vectors stored as f16/bf16. The engine, the
 * worker and the tools all read models through it. */
#ifndef MOEX_MODEL_H
#define MOEX_MODEL_H

#include <stdbool.h>
#include <stddef.h>

#include "common/common.h"
#include "kernels/kernels.h"

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
/* Reads the weights the engine computes with into memory (the mapping is
 * otherwise read lazily, page by page, by the first requests): every matrix
 * but the experts', and the experts' too when experts is set. Logs progress
 * for large models. Returns the bytes touched. */
size_t moex_model_page_in(const moex_model *m, bool experts);
/* One line: arch, layers, hidden, experts, types, size. */
void moex_model_describe(const moex_model *m, char *buf, size_t cap);

#endif
