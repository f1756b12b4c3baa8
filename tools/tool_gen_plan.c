/* The tensors of a generated model: names and shapes as llama.cpp's loader
 * expects them for each architecture (see llama.cpp src/models/<arch>.cpp),
 * the type of each under --type, and how its values are drawn. */
#include "tools/tool.h"
#include "tools/tool_gen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a tensor is, for the type choice. */

/* Every weight type, in the order --type mixed hands them out; not MXFP4
 * while only the CPU reads it (the Vulkan tests run mixed models). */
static const moex_type mixed_cycle[] = {
    MOEX_TYPE_Q4_K, MOEX_TYPE_Q5_K, MOEX_TYPE_Q6_K, MOEX_TYPE_Q8_0, MOEX_TYPE_Q4_0, MOEX_TYPE_Q4_1,
    MOEX_TYPE_Q5_0, MOEX_TYPE_Q5_1, MOEX_TYPE_F16,  MOEX_TYPE_BF16, MOEX_TYPE_F32,
};
#define N_MIXED ((int)(sizeof mixed_cycle / sizeof mixed_cycle[0]))

const char *gen_arch_name(gen_arch a) {
    switch (a) {
    case GEN_QWEN3MOE: return "qwen3moe";
    case GEN_QWEN3: return "qwen3";
    case GEN_LLAMA: return "llama";
    case GEN_MIXTRAL: return "mixtral";
    }
    return "?";
}

/* Mixtral is llama with experts as far as GGUF is concerned. */
const char *gen_arch_gguf_name(gen_arch a) { return a == GEN_MIXTRAL ? "llama" : gen_arch_name(a); }

static bool arch_is_moe(gen_arch a) { return a == GEN_QWEN3MOE || a == GEN_MIXTRAL; }
static bool arch_has_qk_norm(gen_arch a) { return a == GEN_QWEN3MOE || a == GEN_QWEN3; }

typedef struct plan_builder {
    const gen_config *cfg;
    gen_plan *plan;
    int cap;
    int n_weights;   /* 2D/3D weights so far: the position in the mixed cycle */
} plan_builder;

static moex_type pick_type(plan_builder *b, tensor_role role, int64_t layer, uint32_t n_dims) {
    const gen_config *cfg = b->cfg;
    if (role == ROLE_NORM || role == ROLE_ROUTER) return MOEX_TYPE_F32;  /* llama.cpp keeps these f32 */
    int k = b->n_weights++;
    switch (cfg->type_mode) {
    case GEN_TYPES_MIXED: return mixed_cycle[k % N_MIXED];
    case GEN_TYPES_MXFP4_MOE: return n_dims == 3 ? MOEX_TYPE_MXFP4 : MOEX_TYPE_Q8_0; /* 3D: the experts */
    case GEN_TYPES_Q4_K_M:
        return moex_tool_q4_k_m_type(role, layer, cfg->n_layer, cfg->n_expert == 8 && arch_is_moe(cfg->arch));
    default: return cfg->type;
    }
}

static int add_tensor(plan_builder *b, const char *name, tensor_role role, int64_t layer, uint32_t n_dims,
                      int64_t ne0, int64_t ne1, int64_t ne2, gen_init init, float scale, moex_error *err) {
    gen_plan *p = b->plan;
    if (p->n_tensors == b->cap) {
        int cap = b->cap ? b->cap * 2 : 64;
        gen_tensor *t = realloc(p->tensors, (size_t)cap * sizeof *t);
        if (!t) return moex_fail(err, "out of memory");
        p->tensors = t;
        b->cap = cap;
    }
    gen_tensor *t = &p->tensors[p->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = n_dims > 1 ? ne1 : 1;
    t->ne[2] = n_dims > 2 ? ne2 : 1;
    t->init = init;
    t->scale = scale;
    t->requested = pick_type(b, role, layer, n_dims);
    t->type = t->requested;
    if (ne0 % moex_type_get(t->type)->block_elems) {
        t->type = moex_tool_fallback_type(t->type, ne0);
        t->fell_back = true;
    }
    int64_t n = ne0 * t->ne[1] * t->ne[2];
    p->n_params += n;
    p->data_bytes += (uint64_t)moex_row_bytes(t->type, ne0) * (uint64_t)(t->ne[1] * t->ne[2]);
    return 0;
}

static int add_norm(plan_builder *b, const char *name, int64_t n, moex_error *err) {
    return add_tensor(b, name, ROLE_NORM, -1, 1, n, 1, 1, GEN_INIT_NORM, 0.1f, err);
}

static int add_matrix(plan_builder *b, const char *name, tensor_role role, int64_t layer, int64_t n_in, int64_t n_out,
                      float gain, moex_error *err) {
    return add_tensor(b, name, role, layer, 2, n_in, n_out, 1, GEN_INIT_NORMAL, gain / sqrtf((float)n_in), err);
}

static int add_experts(plan_builder *b, const char *name, tensor_role role, int64_t layer, int64_t n_in,
                       int64_t n_out, moex_error *err) {
    return add_tensor(b, name, role, layer, 3, n_in, n_out, b->cfg->n_expert, GEN_INIT_NORMAL,
                      1.0f / sqrtf((float)n_in), err);
}

#define LNAME(buf, fmt, il) (snprintf(buf, sizeof buf, fmt, (int)(il)), buf)

static int add_attention(plan_builder *b, int64_t il, moex_error *err) {
    const gen_config *c = b->cfg;
    char n[64];
    int64_t q_dim = c->n_head * c->head_dim, kv_dim = c->n_head_kv * c->head_dim;
    if (add_norm(b, LNAME(n, MOEX_T_ATTN_NORM, il), c->n_embd, err) ||
        add_matrix(b, LNAME(n, MOEX_T_ATTN_Q, il), ROLE_ATTN_Q, il, c->n_embd, q_dim, 1, err) ||
        add_matrix(b, LNAME(n, MOEX_T_ATTN_K, il), ROLE_ATTN_K, il, c->n_embd, kv_dim, 1, err) ||
        add_matrix(b, LNAME(n, MOEX_T_ATTN_V, il), ROLE_ATTN_V, il, c->n_embd, kv_dim, 1, err) ||
        add_matrix(b, LNAME(n, MOEX_T_ATTN_OUT, il), ROLE_ATTN_OUT, il, q_dim, c->n_embd, 1, err))
        return -1;
    if (!arch_has_qk_norm(c->arch)) return 0;
    return add_norm(b, LNAME(n, MOEX_T_ATTN_Q_NORM, il), c->head_dim, err) ||
           add_norm(b, LNAME(n, MOEX_T_ATTN_K_NORM, il), c->head_dim, err);
}

static int add_ffn(plan_builder *b, int64_t il, moex_error *err) {
    const gen_config *c = b->cfg;
    char n[64];
    if (add_norm(b, LNAME(n, MOEX_T_FFN_NORM, il), c->n_embd, err)) return -1;
    if (!arch_is_moe(c->arch))
        return add_matrix(b, LNAME(n, MOEX_T_FFN_GATE, il), ROLE_FFN_GATE_UP, il, c->n_embd, c->n_ff, 1, err) ||
               add_matrix(b, LNAME(n, MOEX_T_FFN_UP, il), ROLE_FFN_GATE_UP, il, c->n_embd, c->n_ff, 1, err) ||
               add_matrix(b, LNAME(n, MOEX_T_FFN_DOWN, il), ROLE_FFN_DOWN, il, c->n_ff, c->n_embd, 1, err);
    /* Router: f32; std 1.5/sqrt(n_embd) gives router logits of std ~1.5, so
     * routing is neither uniform nor stuck on one expert. */
    int64_t ff = c->n_ff_exp;
    return add_matrix(b, LNAME(n, MOEX_T_FFN_ROUTER, il), ROLE_ROUTER, il, c->n_embd, c->n_expert, 1.5f, err) ||
           add_experts(b, LNAME(n, MOEX_T_FFN_GATE_EXPS, il), ROLE_FFN_GATE_UP, il, c->n_embd, ff, err) ||
           add_experts(b, LNAME(n, MOEX_T_FFN_UP_EXPS, il), ROLE_FFN_GATE_UP, il, c->n_embd, ff, err) ||
           add_experts(b, LNAME(n, MOEX_T_FFN_DOWN_EXPS, il), ROLE_FFN_DOWN, il, ff, c->n_embd, err);
}

/* Scales: projections std 1/sqrt(fan_in) keep activations at unit scale
 * through RMSNorm'd layers; embeddings std 1; the output projection
 * 3/sqrt(n_embd) gives logits of std ~3 (clear greedy winners, no overflow).
 * Tied models read logits through token_embd, so it takes the output scale. */
int gen_plan_build(const gen_config *cfg, gen_plan *plan, moex_error *err) {
    memset(plan, 0, sizeof *plan);
    plan_builder b = {.cfg = cfg, .plan = plan};
    float out_std = 3.0f / sqrtf((float)cfg->n_embd);
    if (add_tensor(&b, MOEX_T_TOKEN_EMBD, ROLE_EMBD, -1, 2, cfg->n_embd, cfg->n_vocab, 1, GEN_INIT_NORMAL,
                   cfg->tied ? out_std : 1.0f, err))
        goto fail;
    for (int64_t il = 0; il < cfg->n_layer; il++)
        if (add_attention(&b, il, err) || add_ffn(&b, il, err)) goto fail;
    if (add_norm(&b, MOEX_T_OUTPUT_NORM, cfg->n_embd, err)) goto fail;
    if (!cfg->tied && add_tensor(&b, MOEX_T_OUTPUT, ROLE_OUTPUT, -1, 2, cfg->n_embd, cfg->n_vocab, 1, GEN_INIT_NORMAL,
                                 out_std, err))
        goto fail;
    return 0;
fail:
    gen_plan_free(plan);
    return -1;
}

void gen_plan_free(gen_plan *plan) {
    free(plan->tensors);
    memset(plan, 0, sizeof *plan);
}

int gen_file_type(const gen_config *cfg) {
    if (cfg->type_mode == GEN_TYPES_MIXED) return -1;
    if (cfg->type_mode == GEN_TYPES_Q4_K_M) return MOEX_GGUF_FTYPE_Q4_K_M;
    if (cfg->type_mode == GEN_TYPES_MXFP4_MOE) return moex_gguf_file_type_of(MOEX_TYPE_MXFP4);
    return moex_gguf_file_type_of(cfg->type);
}

static int kv_u32(moex_gguf_writer *w, const char *arch, const char *suffix, int64_t v) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return moex_gguf_writer_kv_u32(w, key, (uint32_t)v);
}

static int kv_f32(moex_gguf_writer *w, const char *arch, const char *suffix, float v) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return moex_gguf_writer_kv_f32(w, key, v);
}

/* The keys common/arch.c reads, plus what llama.cpp needs: it requires
 * context_length and the rms epsilon, and qwen3moe's expert_feed_forward_length. */
int gen_plan_write_metadata(const gen_config *cfg, moex_gguf_writer *w) {
    const char *a = gen_arch_gguf_name(cfg->arch);
    char name[128];
    snprintf(name, sizeof name, "moex-gen %s %s seed %llu", cfg->preset, gen_arch_name(cfg->arch),
             (unsigned long long)cfg->seed);
    bool moe = arch_is_moe(cfg->arch);
    /* Mixtral's experts are sized by feed_forward_length. */
    int64_t ff = cfg->arch == GEN_MIXTRAL ? cfg->n_ff_exp : cfg->n_ff;
    int ftype = gen_file_type(cfg);
    if (moex_gguf_writer_kv_str(w, "general.architecture", a) || moex_gguf_writer_kv_str(w, "general.name", name) ||
        (ftype >= 0 && moex_gguf_writer_kv_u32(w, "general.file_type", (uint32_t)ftype)) ||
        moex_gguf_writer_kv_u32(w, "general.quantization_version", 2) ||
        kv_u32(w, a, "block_count", cfg->n_layer) || kv_u32(w, a, "context_length", cfg->n_ctx) ||
        kv_u32(w, a, "embedding_length", cfg->n_embd) || kv_u32(w, a, "feed_forward_length", ff) ||
        kv_u32(w, a, "attention.head_count", cfg->n_head) || kv_u32(w, a, "attention.head_count_kv", cfg->n_head_kv) ||
        kv_u32(w, a, "attention.key_length", cfg->head_dim) || kv_u32(w, a, "attention.value_length", cfg->head_dim) ||
        kv_u32(w, a, "rope.dimension_count", cfg->head_dim) || kv_f32(w, a, "rope.freq_base", cfg->rope_base) ||
        kv_f32(w, a, "attention.layer_norm_rms_epsilon", cfg->rms_eps) || kv_u32(w, a, "vocab_size", cfg->n_vocab))
        return -1;
    if (!moe) return 0;
    if (kv_u32(w, a, "expert_count", cfg->n_expert) || kv_u32(w, a, "expert_used_count", cfg->n_expert_used))
        return -1;
    if (cfg->arch == GEN_QWEN3MOE && kv_u32(w, a, "expert_feed_forward_length", cfg->n_ff_exp)) return -1;
    return 0;
}
