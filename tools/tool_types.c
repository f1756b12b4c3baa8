/* The weight-type rules moex-gguf's gen and quantize share (tool.h):
 * llama.cpp's Q4_K_M mix and its fallback for rows that are not a whole
 * number of blocks, so that both write the files llama.cpp would. */
#include "tools/tool.h"

/* llama.cpp's choice of layers that get more bits in the _M mixes. */
static bool use_more_bits(int64_t layer, int64_t n_layer) {
    return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

/* output Q6_K; attn_v and ffn_down(_exps) Q6_K on use_more_bits layers;
 * 8-expert models take attn_k/attn_v in Q8_0 and attn_output in Q5_K;
 * everything else, token_embd included, Q4_K. */
moex_type moex_tool_q4_k_m_type(tensor_role role, int64_t layer, int64_t n_layer, bool eight_experts) {
    switch (role) {
    case ROLE_OUTPUT: return MOEX_TYPE_Q6_K;
    case ROLE_ATTN_K: return eight_experts ? MOEX_TYPE_Q8_0 : MOEX_TYPE_Q4_K;
    case ROLE_ATTN_V:
        if (eight_experts) return MOEX_TYPE_Q8_0;
        return use_more_bits(layer, n_layer) ? MOEX_TYPE_Q6_K : MOEX_TYPE_Q4_K;
    case ROLE_ATTN_OUT: return eight_experts ? MOEX_TYPE_Q5_K : MOEX_TYPE_Q4_K;
    case ROLE_FFN_DOWN: return use_more_bits(layer, n_layer) ? MOEX_TYPE_Q6_K : MOEX_TYPE_Q4_K;
    default: return MOEX_TYPE_Q4_K;
    }
}

moex_type moex_tool_fallback_type(moex_type t, int64_t ne0) {
    moex_type f = t;
    if (t == MOEX_TYPE_Q4_K) f = MOEX_TYPE_Q5_0;
    else if (t == MOEX_TYPE_Q5_K) f = MOEX_TYPE_Q5_1;
    else if (t == MOEX_TYPE_Q6_K) f = MOEX_TYPE_Q8_0;
    if (ne0 % moex_type_get(f)->block_elems) f = MOEX_TYPE_F16;
    return f;
}
