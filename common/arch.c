/* Hyperparameters from GGUF metadata, with the defaults llama.cpp applies. */
#include "common/arch.h"

#include <stdio.h>
#include <string.h>

#define MAX_DIM (1 << 20)  /* far beyond any real model; keeps products in int64 */

static int read_u32(const moex_gguf *g, const char *arch, const char *suffix, int32_t *out,
                    bool required, moex_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!moex_gguf_find(g, key)) {
        if (required) return moex_fail(err, "missing metadata key %s", key);
        return 0;
    }
    uint32_t v;
    if (moex_gguf_get_u32(g, key, &v, err)) return -1;
    if (v > MAX_DIM) return moex_fail(err, "metadata %s = %u is out of range", key, v);
    *out = (int32_t)v;
    return 0;
}

static int read_f32(const moex_gguf *g, const char *arch, const char *suffix, float *out, moex_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!moex_gguf_find(g, key)) return 0;
    return moex_gguf_get_f32(g, key, out, err);
}

static int check_shape(const moex_hparams *hp, moex_error *err) {
    if (hp->n_layer <= 0 || hp->n_embd <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0)
        return moex_fail(err, "model has an empty dimension (layers %d, hidden %d, heads %d/%d)",
                         hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv);
    if (hp->n_head % hp->n_head_kv)
        return moex_fail(err, "head_count %d is not a multiple of head_count_kv %d", hp->n_head, hp->n_head_kv);
    if (hp->head_dim <= 0 || hp->head_dim % 2 || hp->rope_dim <= 0 || hp->rope_dim > hp->head_dim || hp->rope_dim % 2)
        return moex_fail(err, "bad head/rope dimensions (head_dim %d, rope_dim %d)", hp->head_dim, hp->rope_dim);
    if (hp->n_expert < 0 || hp->n_expert_used < 0 || hp->n_expert_used > hp->n_expert)
        return moex_fail(err, "bad expert counts (%d used of %d)", hp->n_expert_used, hp->n_expert);
    if (hp->n_expert > 0 && (hp->n_expert_used == 0 || hp->n_ff_exp <= 0))
        return moex_fail(err, "MoE model without expert_used_count or expert FFN size");
    if (hp->n_expert == 0 && hp->n_ff <= 0)
        return moex_fail(err, "dense model without feed_forward_length");
    if (hp->n_vocab <= 0) return moex_fail(err, "model has no vocabulary");
    if (!(hp->rms_eps > 0 && hp->rms_eps < 1)) return moex_fail(err, "bad rms epsilon %g", hp->rms_eps);
    if (!(hp->rope_freq_base > 0)) return moex_fail(err, "bad rope freq_base %g", hp->rope_freq_base);
    return 0;
}

int moex_hparams_read(const moex_gguf *g, moex_hparams *hp, moex_error *err) {
    memset(hp, 0, sizeof *hp);
    if (moex_gguf_get_str(g, "general.architecture", hp->arch_name, sizeof hp->arch_name, err)) return -1;
    const char *a = hp->arch_name;
    if (!strcmp(a, "llama")) {
        hp->arch = MOEX_ARCH_LLAMA;
    } else if (!strcmp(a, "qwen3")) {
        hp->arch = MOEX_ARCH_QWEN3;
        hp->rope_neox = hp->qk_norm = true;
    } else if (!strcmp(a, "qwen3moe")) {
        hp->arch = MOEX_ARCH_QWEN3MOE;
        hp->rope_neox = hp->qk_norm = true;
    } else {
        return moex_fail(err, "unsupported architecture '%s' (supported: llama, qwen3, qwen3moe)", a);
    }
    hp->rope_freq_base = 10000.0f;
    hp->rms_eps = 1e-5f;
    if (read_u32(g, a, "block_count", &hp->n_layer, true, err) ||
        read_u32(g, a, "embedding_length", &hp->n_embd, true, err) ||
        read_u32(g, a, "attention.head_count", &hp->n_head, true, err) ||
        read_u32(g, a, "feed_forward_length", &hp->n_ff, false, err) ||
        read_u32(g, a, "context_length", &hp->n_ctx_train, false, err) ||
        read_u32(g, a, "expert_count", &hp->n_expert, false, err) ||
        read_u32(g, a, "expert_used_count", &hp->n_expert_used, false, err) ||
        read_u32(g, a, "expert_feed_forward_length", &hp->n_ff_exp, false, err) ||
        read_f32(g, a, "rope.freq_base", &hp->rope_freq_base, err) ||
        read_f32(g, a, "attention.layer_norm_rms_epsilon", &hp->rms_eps, err))
        return -1;
    hp->n_head_kv = hp->n_head;
    if (read_u32(g, a, "attention.head_count_kv", &hp->n_head_kv, false, err)) return -1;
    hp->head_dim = hp->n_head ? hp->n_embd / hp->n_head : 0;
    if (read_u32(g, a, "attention.key_length", &hp->head_dim, false, err)) return -1;
    int32_t vlen = hp->head_dim;
    if (read_u32(g, a, "attention.value_length", &vlen, false, err)) return -1;
    if (vlen != hp->head_dim)
        return moex_fail(err, "key_length %d != value_length %d is not supported", hp->head_dim, vlen);
    hp->rope_dim = hp->head_dim;
    if (read_u32(g, a, "rope.dimension_count", &hp->rope_dim, false, err)) return -1;
    /* Mixtral-style llama: experts share ffn size with the dense key. */
    if (hp->n_expert > 0 && hp->n_ff_exp == 0) hp->n_ff_exp = hp->n_ff;
    /* qwen3moe renormalises top-k (norm_topk_prob); Mixtral's softmax over the
     * top-k is the same as renormalising the full softmax's top-k. */
    hp->norm_topk = true;
    const moex_gguf_tensor *emb = moex_gguf_find_tensor(g, MOEX_T_TOKEN_EMBD);
    if (!emb) return moex_fail(err, "missing tensor %s", MOEX_T_TOKEN_EMBD);
    if (emb->n_dims != 2 || emb->ne[0] != hp->n_embd || emb->ne[1] <= 0 || emb->ne[1] > (1 << 24))
        return moex_fail(err, "%s has shape [%lld, %lld], expected [%d, n_vocab]", MOEX_T_TOKEN_EMBD,
                         (long long)emb->ne[0], (long long)emb->ne[1], hp->n_embd);
    hp->n_vocab = (int32_t)emb->ne[1];
    return check_shape(hp, err);
}

bool moex_hparams_is_moe(const moex_hparams *hp) { return hp->n_expert > 0; }
