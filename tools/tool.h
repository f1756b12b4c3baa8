/* Subcommands of moex-gguf (private to the tool; argv[0] is the subcommand name).
 * Each returns the process exit code: 0 ok, 1 failure, 2 bad usage. */
#ifndef MOEX_TOOLS_TOOL_H
#define MOEX_TOOLS_TOOL_H

int moex_tool_info(int argc, char **argv);
int moex_tool_tokenize(int argc, char **argv);
int moex_tool_detokenize(int argc, char **argv);
int moex_tool_gen(int argc, char **argv);
int moex_tool_quantize(int argc, char **argv);

/* ---- the type rules gen and quantize share (tool_types.c) ---- */

#include <stdbool.h>
#include <stdint.h>

#include "common/types.h"

/* What a weight is for: what llama.cpp's type mixes look at. */
typedef enum tensor_role {
    ROLE_NORM, ROLE_ROUTER, ROLE_EMBD, ROLE_OUTPUT,
    ROLE_ATTN_Q, ROLE_ATTN_K, ROLE_ATTN_V, ROLE_ATTN_OUT,
    ROLE_FFN_GATE_UP, ROLE_FFN_DOWN,
} tensor_role;

/* llama.cpp's Q4_K_M type of a weight (llama-quant.cpp), simplified to what
 * these archs have; layer: its block, n_layer: the model's, eight_experts: a
 * Mixtral-like MoE with 8 experts. */
moex_type moex_tool_q4_k_m_type(tensor_role role, int64_t layer, int64_t n_layer, bool eight_experts);
/* llama.cpp's replacement for type t when a row of ne0 is not a whole number of its blocks. */
moex_type moex_tool_fallback_type(moex_type t, int64_t ne0);

#endif
