/* `moex-gguf gen`: random-weight models in llama.cpp's GGUF layout.
 * Private to the tool. The parts:
 *   tool_gen.c        command line, presets, the overall flow
 *   tool_gen_plan.c   which tensors (names, shapes, types, init) and metadata
 *   tool_gen_fill.c   deterministic weights: counter-based PRNG, quantization
 *   tool_gen_write.c  parallel generation streamed through the GGUF writer */
#ifndef MOEX_HUB_TOOL_GEN_H
#define MOEX_HUB_TOOL_GEN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/common.h"

typedef enum gen_arch { GEN_QWEN3MOE, GEN_QWEN3, GEN_LLAMA, GEN_MIXTRAL } gen_arch;

/* How --type maps to per-tensor types. */
typedef enum gen_type_mode {
    GEN_TYPES_UNIFORM,   /* every 2D/3D weight in one type */
    GEN_TYPES_Q4_K_M,    /* llama.cpp's Q4_K_M mix (see gen_plan_build) */
    GEN_TYPES_MIXED,     /* cycle through every weight type */
    GEN_TYPES_MXFP4_MOE, /* llama.cpp's MXFP4_MOE (gpt-oss's files): experts MXFP4, other weights Q8_0 */
} gen_type_mode;

/* How quantized weights are produced. */
typedef enum gen_weights_mode {
    GEN_WEIGHTS_AUTO,    /* FLOAT for small models, BLOCKS for big ones */
    GEN_WEIGHTS_FLOAT,   /* draw floats, quantize them with moex_quantize_row */
    GEN_WEIGHTS_BLOCKS,  /* draw quantized blocks directly (fast, for huge models) */
} gen_weights_mode;

typedef struct gen_config {
    gen_arch arch;
    const char *preset;
    int64_t n_layer, n_embd, n_head, n_head_kv, head_dim;
    int64_t n_ff;          /* dense FFN (qwen3moe also records it in metadata) */
    int64_t n_expert, n_expert_used, n_ff_exp;
    int64_t n_ctx;
    int64_t n_vocab;       /* from the vocab file */
    float rope_base, rms_eps;
    bool tied;             /* no output.weight: logits use token_embd */
    gen_type_mode type_mode;
    moex_type type;        /* the uniform type (or the base for Q4_K_M) */
    gen_weights_mode weights;
    uint64_t seed;
    int threads;
    bool quiet;
    bool dry_run;          /* list the tensors and sizes, write nothing */
} gen_config;

/* How a tensor's values are drawn. */
typedef enum gen_init {
    GEN_INIT_NORMAL,     /* approx. normal, mean 0, std `scale` */
    GEN_INIT_NORM,       /* uniform in 1 +- `scale` (RMSNorm weights) */
} gen_init;

typedef struct gen_tensor {
    char name[64];
    moex_type type;
    uint32_t n_dims;
    int64_t ne[3];
    gen_init init;
    float scale;
    bool fell_back;      /* the requested type did not fit ne[0] */
    moex_type requested;
} gen_tensor;

typedef struct gen_plan {
    gen_tensor *tensors;
    int n_tensors;
    uint64_t data_bytes;     /* sum of tensor sizes (without padding) */
    int64_t n_params;
} gen_plan;

/* Lists every tensor with its shape, type and init. 0 or -1. */
int gen_plan_build(const gen_config *cfg, gen_plan *plan, moex_error *err);
void gen_plan_free(gen_plan *plan);
/* Metadata (all keys but the tokenizer's) for cfg. 0 or -1 (the writer holds the error). */
int gen_plan_write_metadata(const gen_config *cfg, moex_gguf_writer *w);
/* "qwen3moe", "llama" (for mixtral too): general.architecture. */
const char *gen_arch_gguf_name(gen_arch a);
const char *gen_arch_name(gen_arch a);
/* llama.cpp's general.file_type for the config; -1 when there is none (mixed). */
int gen_file_type(const gen_config *cfg);

/* ---- weights ---- */
/* Fills rows [row0, row0+n_rows) of tensor `t` (the tensor_index-th in the plan)
 * into dst, in t->type's layout. `scratch` holds ne[0] floats. Values depend
 * only on (seed, tensor_index, element index), never on the chunking. */
int gen_fill_rows(const gen_tensor *t, int tensor_index, uint64_t seed, bool blocks, int64_t row0, int64_t n_rows,
                  void *dst, float *scratch, moex_error *err);
/* The k-th value of the normal-ish stream (Irwin-Hall of 4 uniforms: exact
 * integer arithmetic, so every machine draws the same numbers). Exposed for tests. */
float gen_normal(uint64_t key, uint64_t k);
uint64_t gen_tensor_key(uint64_t seed, int tensor_index);

/* ---- output ---- */
/* Streams all tensor data through w using cfg->threads workers. */
int gen_write_tensors(const gen_config *cfg, const gen_plan *plan, moex_gguf_writer *w, moex_error *err);

#endif
