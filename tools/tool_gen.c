/* moex-gguf gen: writes a random-weight model that both our engine and
 * llama.cpp load: a preset shape (overridable dim by dim), the tokenizer of
 * a vocab GGUF, weights drawn deterministically from --seed. */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/statvfs.h>

#include "tools/tool.h"
#include "tools/tool_gen.h"

typedef struct gen_preset {
    const char *name;
    int arch;   /* the preset's architecture, or -1 when --arch must say */
    int64_t layers, hidden, heads, kv_heads, head_dim, ff, experts, experts_used, expert_ff, ctx;
    float rope_base, rms_eps;   /* 0: the architecture's usual value */
    const char *about;
} gen_preset;

static const gen_preset presets[] = {
    {"test", -1, 2, 256, 4, 2, 64, 512, 8, 2, 256, 2048, 0, 0, "tiny, for the test suite (any arch)"},
    {"bench-moe", GEN_QWEN3MOE, 8, 1024, 16, 4, 64, 3072, 32, 4, 768, 4096, 1e6f, 1e-6f,
     "qwen3moe of ~1B params for speed comparisons"},
    {"qwen3-30b-a3b", GEN_QWEN3MOE, 48, 2048, 32, 4, 128, 6144, 128, 8, 768, 40960, 1e6f, 1e-6f,
     "Qwen3-30B-A3B's shape (use the qwen2 vocab)"},
    {"qwen3-235b-a22b", GEN_QWEN3MOE, 94, 4096, 64, 4, 128, 12288, 128, 8, 1536, 40960, 1e6f, 1e-6f,
     "Qwen3-235B-A22B's shape (use the qwen2 vocab; 142 GB as q4_K_M)"},
    {"mixtral-8x7b", GEN_MIXTRAL, 32, 4096, 32, 8, 128, 14336, 8, 2, 14336, 32768, 1e6f, 1e-5f,
     "Mixtral-8x7B's shape (use a 32000-token llama vocab)"},
    {"qwen3-0.6b", GEN_QWEN3, 28, 1024, 16, 8, 128, 3072, 0, 0, 0, 40960, 1e6f, 1e-6f, "Qwen3-0.6B's shape"},
    {"llama-1b", GEN_LLAMA, 16, 2048, 32, 8, 64, 8192, 0, 0, 0, 131072, 5e5f, 1e-5f, "Llama-3.2-1B's shape"},
};
#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

static void usage(FILE *f) {
    fprintf(f,
            "usage: moex-gguf gen --arch A --preset P --vocab VOCAB.gguf [--type T] [--seed S] -o OUT.gguf [options]\n"
            "  --arch      qwen3moe | qwen3 | llama | mixtral (default: the preset's)\n"
            "  --vocab     GGUF whose tokenizer.* keys are copied; its size is n_vocab\n"
            "  --type      f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_K q5_K q6_K mxfp4 (all 2D/3D weights),\n"
            "              q4_K_M (llama.cpp's mix: output Q6_K, attn_v and ffn_down(_exps) Q6_K on the\n"
            "              layers llama.cpp picks, 8-expert models attn_k/v Q8_0 and attn_output Q5_K,\n"
            "              the rest Q4_K), mxfp4_moe (llama.cpp's MXFP4_MOE, as gpt-oss ships: expert\n"
            "              tensors mxfp4, other weights q8_0) or mixed (cycles through every type but\n"
            "              mxfp4). Default f16.\n"
            "              Norms and routers stay f32; a type whose block does not divide a tensor's\n"
            "              rows falls back as llama.cpp does (q4_K->q5_0, q5_K->q5_1, q6_K->q8_0, else f16).\n"
            "  --seed S    weights are a pure function of the seed (default 0)\n"
            "  overrides:  --layers --hidden --heads --kv-heads --head-dim --ff --experts --experts-used\n"
            "              --expert-ff --ctx N, --rope-base X, --rms-eps X\n"
            "  --tied      no output.weight (logits through token_embd)\n"
            "  --weights   auto | float | blocks: quantize drawn floats, or draw quantized blocks directly\n"
            "              (fast; auto uses it above 134 M params)\n"
            "  --threads N generator threads (default: all cores)   --quiet  no progress\n"
            "  --dry-run   list the tensors (name, type, shape) and the size; write nothing\n"
            "presets (layers hidden heads/kv head_dim ff experts/used expert_ff ctx):\n");
    for (int i = 0; i < N_PRESETS; i++) {
        const gen_preset *p = &presets[i];
        fprintf(f, "  %-14s %-9s %2" PRId64 " %5" PRId64 " %2" PRId64 "/%-2" PRId64 " %3" PRId64 " %5" PRId64
                   " %3" PRId64 "/%-2" PRId64 " %5" PRId64 " %6" PRId64 "  %s\n",
                p->name, p->arch < 0 ? "(any)" : gen_arch_name((gen_arch)p->arch), p->layers, p->hidden, p->heads,
                p->kv_heads, p->head_dim, p->ff, p->experts, p->experts_used, p->expert_ff, p->ctx, p->about);
    }
}

static int parse_arch(const char *s) {
    for (int a = GEN_QWEN3MOE; a <= GEN_MIXTRAL; a++)
        if (!strcmp(s, gen_arch_name((gen_arch)a))) return a;
    return -1;
}

static const gen_preset *find_preset(const char *s) {
    for (int i = 0; i < N_PRESETS; i++)
        if (!strcmp(s, presets[i].name)) return &presets[i];
    return NULL;
}

/* A whole decimal number in [lo, hi]. */
static int parse_int(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "gen: %s wants a whole number in %" PRId64 "..%" PRId64 ", not '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *flag, const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (!*s || *end || errno || !(v > 0) || v > 1e12f) {
        fprintf(stderr, "gen: %s wants a positive number, not '%s'\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_seed(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (*s == '-') s = "";   /* strtoull would wrap negatives */
    unsigned long long v = strtoull(s, &end, 0);
    if (!*s || *end || errno) {
        fprintf(stderr, "gen: --seed wants a non-negative integer, not '%s'\n", s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_type(const char *s, gen_config *cfg) {
    if (!strcasecmp(s, "mixed")) {
        cfg->type_mode = GEN_TYPES_MIXED;
        return 0;
    }
    if (!strcasecmp(s, "mxfp4_moe")) {
        cfg->type_mode = GEN_TYPES_MXFP4_MOE;
        cfg->type = MOEX_TYPE_MXFP4;
        return 0;
    }
    if (!strcasecmp(s, "q4_K_M")) {
        cfg->type_mode = GEN_TYPES_Q4_K_M;
        cfg->type = MOEX_TYPE_Q4_K;
        return 0;
    }
    int t = moex_type_from_name(s);
    const moex_type_traits *tt = moex_type_get(t);
    if (!tt || !tt->is_weight_type) {
        fprintf(stderr, "gen: unknown --type '%s' (see gen --help)\n", s);
        return -1;
    }
    cfg->type_mode = GEN_TYPES_UNIFORM;
    cfg->type = (moex_type)t;
    return 0;
}

/* The dimension overrides: flag, field, limit. */
typedef struct dim_flag {
    const char *flag;
    size_t offset;
    int64_t max;
} dim_flag;

#define MAX_DIM (1 << 20)
static const dim_flag dim_flags[] = {
    {"--layers", offsetof(gen_config, n_layer), 512},
    {"--hidden", offsetof(gen_config, n_embd), MAX_DIM},
    {"--heads", offsetof(gen_config, n_head), 4096},
    {"--kv-heads", offsetof(gen_config, n_head_kv), 4096},
    {"--head-dim", offsetof(gen_config, head_dim), 4096},
    {"--ff", offsetof(gen_config, n_ff), MAX_DIM},
    {"--experts", offsetof(gen_config, n_expert), 512},
    {"--experts-used", offsetof(gen_config, n_expert_used), 512},
    {"--expert-ff", offsetof(gen_config, n_ff_exp), MAX_DIM},
    {"--ctx", offsetof(gen_config, n_ctx), 1 << 24},
};
#define N_DIM_FLAGS ((int)(sizeof dim_flags / sizeof dim_flags[0]))

typedef struct gen_args {
    const char *arch, *preset, *vocab, *type, *out;
    const char *dims[N_DIM_FLAGS];
    const char *rope_base, *rms_eps, *seed, *weights, *threads;
    bool tied, quiet, help, dry_run;
} gen_args;

/* Collects flags; values are checked once the preset is known. 0, or 2 for bad usage. */
static int collect_args(int argc, char **argv, gen_args *a) {
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { a->help = true; continue; }
        if (!strcmp(f, "--tied")) { a->tied = true; continue; }
        if (!strcmp(f, "--quiet") || !strcmp(f, "-q")) { a->quiet = true; continue; }
        if (!strcmp(f, "--dry-run")) { a->dry_run = true; continue; }
        const char **slot = NULL;
        if (!strcmp(f, "--arch")) slot = &a->arch;
        else if (!strcmp(f, "--preset")) slot = &a->preset;
        else if (!strcmp(f, "--vocab")) slot = &a->vocab;
        else if (!strcmp(f, "--type")) slot = &a->type;
        else if (!strcmp(f, "-o") || !strcmp(f, "--output")) slot = &a->out;
        else if (!strcmp(f, "--seed")) slot = &a->seed;
        else if (!strcmp(f, "--rope-base")) slot = &a->rope_base;
        else if (!strcmp(f, "--rms-eps")) slot = &a->rms_eps;
        else if (!strcmp(f, "--weights")) slot = &a->weights;
        else if (!strcmp(f, "--threads")) slot = &a->threads;
        for (int d = 0; !slot && d < N_DIM_FLAGS; d++)
            if (!strcmp(f, dim_flags[d].flag)) slot = &a->dims[d];
        if (!slot) {
            fprintf(stderr, "gen: unknown option '%s' (see gen --help)\n", f);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "gen: %s needs a value\n", f);
            return 2;
        }
        *slot = argv[++i];
    }
    return 0;
}

static void apply_preset(const gen_preset *p, gen_config *c) {
    c->preset = p->name;
    c->n_layer = p->layers;
    c->n_embd = p->hidden;
    c->n_head = p->heads;
    c->n_head_kv = p->kv_heads;
    c->head_dim = p->head_dim;
    c->n_ff = p->ff;
    c->n_expert = p->experts;
    c->n_expert_used = p->experts_used;
    c->n_ff_exp = p->expert_ff;
    c->n_ctx = p->ctx;
    bool qwen = c->arch == GEN_QWEN3 || c->arch == GEN_QWEN3MOE;
    c->rope_base = p->rope_base > 0 ? p->rope_base : qwen || c->arch == GEN_MIXTRAL ? 1e6f : 1e4f;
    c->rms_eps = p->rms_eps > 0 ? p->rms_eps : qwen ? 1e-6f : 1e-5f;
}

/* Shape rules of both loaders (common/arch.c and llama.cpp). */
static int check_config(gen_config *c) {
    bool moe = c->arch == GEN_QWEN3MOE || c->arch == GEN_MIXTRAL;
    if (!moe) c->n_expert = c->n_expert_used = c->n_ff_exp = 0;
    const char *why = NULL;
    if (c->n_head % c->n_head_kv) why = "--heads must be a multiple of --kv-heads";
    else if (c->head_dim % 2) why = "--head-dim must be even (rope rotates pairs)";
    else if (moe && (c->n_expert < 1 || c->n_expert_used < 1 || c->n_ff_exp < 1))
        why = "a MoE architecture needs --experts, --experts-used and --expert-ff (this preset has no experts)";
    else if (moe && c->n_expert_used > c->n_expert) why = "--experts-used exceeds --experts";
    else if (!moe && c->n_ff < 1) why = "a dense architecture needs --ff";
    if (why) {
        fprintf(stderr, "gen: %s\n", why);
        return -1;
    }
    return 0;
}

static int config_from_args(const gen_args *a, gen_config *c) {
    memset(c, 0, sizeof *c);
    if (!a->preset || !a->vocab || !a->out) {
        fprintf(stderr, "gen: --preset, --vocab and -o are required (see gen --help)\n");
        return -1;
    }
    const gen_preset *p = find_preset(a->preset);
    if (!p) {
        fprintf(stderr, "gen: unknown preset '%s' (see gen --help)\n", a->preset);
        return -1;
    }
    int arch = a->arch ? parse_arch(a->arch) : p->arch;
    if (a->arch && arch < 0) {
        fprintf(stderr, "gen: unknown --arch '%s' (qwen3moe, qwen3, llama, mixtral)\n", a->arch);
        return -1;
    }
    if (arch < 0) {
        fprintf(stderr, "gen: preset '%s' needs --arch (qwen3moe, qwen3, llama, mixtral)\n", p->name);
        return -1;
    }
    c->arch = (gen_arch)arch;
    apply_preset(p, c);
    for (int d = 0; d < N_DIM_FLAGS; d++) {
        if (!a->dims[d]) continue;
        int64_t *field = (int64_t *)((char *)c + dim_flags[d].offset);
        if (parse_int(dim_flags[d].flag, a->dims[d], 1, dim_flags[d].max, field)) return -1;
    }
    c->type = MOEX_TYPE_F16;
    if ((a->type && parse_type(a->type, c)) || (a->seed && parse_seed(a->seed, &c->seed)) ||
        (a->rope_base && parse_float("--rope-base", a->rope_base, &c->rope_base)) ||
        (a->rms_eps && parse_float("--rms-eps", a->rms_eps, &c->rms_eps)))
        return -1;
    if (a->rms_eps && c->rms_eps >= 1) {
        fprintf(stderr, "gen: --rms-eps must be below 1\n");
        return -1;
    }
    int64_t threads = 0;
    if (a->threads && parse_int("--threads", a->threads, 1, 256, &threads)) return -1;
    c->threads = (int)threads;
    if (a->weights) {
        if (!strcmp(a->weights, "auto")) c->weights = GEN_WEIGHTS_AUTO;
        else if (!strcmp(a->weights, "float")) c->weights = GEN_WEIGHTS_FLOAT;
        else if (!strcmp(a->weights, "blocks")) c->weights = GEN_WEIGHTS_BLOCKS;
        else {
            fprintf(stderr, "gen: --weights is auto, float or blocks, not '%s'\n", a->weights);
            return -1;
        }
    }
    c->tied = a->tied;
    c->quiet = a->quiet;
    c->dry_run = a->dry_run;
    return check_config(c);
}

/* ---- the vocabulary ---- */

static int vocab_size(const moex_gguf *v, const char *path, int64_t *n, moex_error *err) {
    moex_error why = {{0}};
    const moex_gguf_value *tokens = moex_gguf_get_array(v, "tokenizer.ggml.tokens", MOEX_GGUF_STRING, &why);
    if (!tokens) return moex_fail(err, "%s has no usable tokenizer (tokenizer.ggml.tokens): %s", path, why.msg);
    if (tokens->v.arr.n < 1 || tokens->v.arr.n > (1 << 24))
        return moex_fail(err, "%s: %llu tokens is not a usable vocabulary", path, (unsigned long long)tokens->v.arr.n);
    *n = (int64_t)tokens->v.arr.n;
    return 0;
}

static int copy_tokenizer(const moex_gguf *v, moex_gguf_writer *w) {
    for (uint64_t i = 0; i < v->n_kv; i++) {
        const moex_gguf_kv *kv = &v->kvs[i];
        if (kv->key.len > 10 && !memcmp(kv->key.data, "tokenizer.", 10) && moex_gguf_writer_kv_copy(w, kv)) return -1;
    }
    return 0;
}

/* ---- output ---- */

static int check_disk_space(const char *out, uint64_t need, moex_error *err) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", out);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    struct statvfs st;
    if (statvfs(dir, &st)) return moex_fail(err, "cannot create %s: %s: %s", out, dir, strerror(errno));
    uint64_t avail = (uint64_t)st.f_bavail * (uint64_t)st.f_frsize;
    uint64_t margin = (64u << 20) + need / 100;   /* keep the disk from filling to the last byte */
    if (need + margin > avail)
        return moex_fail(err, "the model needs %.2f GB but only %.2f GB are free in %s; free space or pick a smaller "
                              "preset/type",
                         (double)need / 1e9, (double)avail / 1e9, dir);
    return 0;
}

static void note_fallbacks(const gen_plan *plan, bool quiet) {
    for (int i = 0; i < plan->n_tensors && !quiet; i++) {
        const gen_tensor *t = &plan->tensors[i];
        if (t->fell_back)
            fprintf(stderr, "gen: note: %s has rows of %lld, not a multiple of %s's block; using %s\n", t->name,
                    (long long)t->ne[0], moex_type_get(t->requested)->name, moex_type_get(t->type)->name);
    }
}

static void print_plan(const gen_config *c, const gen_plan *plan) {
    for (int i = 0; i < plan->n_tensors; i++) {
        const gen_tensor *t = &plan->tensors[i];
        printf("%-32s %-5s [%lld", t->name, moex_type_get(t->type)->name, (long long)t->ne[0]);
        for (uint32_t d = 1; d < t->n_dims; d++) printf(", %lld", (long long)t->ne[d]);
        printf("]\n");
    }
    printf("%s %s: %d tensors, %.3f B params, %.2f GB of tensor data, vocab %lld\n", gen_arch_name(c->arch), c->preset,
           plan->n_tensors, (double)plan->n_params / 1e9, (double)plan->data_bytes / 1e9, (long long)c->n_vocab);
}

static int write_model(const gen_config *cfg, const moex_gguf *vocab, const gen_plan *plan, const char *path,
                       moex_error *err) {
    moex_gguf_writer *w = moex_gguf_writer_open(path, err);
    if (!w) return -1;
    int rc = 0;
    if (gen_plan_write_metadata(cfg, w) || copy_tokenizer(vocab, w)) rc = -1;
    for (int i = 0; !rc && i < plan->n_tensors; i++) {
        const gen_tensor *t = &plan->tensors[i];
        if (moex_gguf_writer_tensor(w, t->name, t->type, t->n_dims, t->ne)) rc = -1;
    }
    if (!rc && moex_gguf_writer_begin_data(w)) rc = -1;
    if (!rc && gen_write_tensors(cfg, plan, w, err)) {
        /* The generator's error is the cause; the writer would only add that
         * tensors are incomplete. close() still removes the partial file. */
        moex_error ignored;
        moex_gguf_writer_close(w, &ignored);
        return -1;
    }
    /* close() reports the writer's own error (and removes the partial file). */
    return moex_gguf_writer_close(w, err);
}

static int generate(const gen_config *cfg, const char *vocab_path, const char *out, moex_error *err) {
    moex_gguf *vocab = moex_gguf_open(vocab_path, err);
    if (!vocab) return -1;
    gen_config c = *cfg;
    gen_plan plan;
    int rc = -1;
    char tmp[4096];
    if (vocab_size(vocab, vocab_path, &c.n_vocab, err) || gen_plan_build(&c, &plan, err)) goto out_vocab;
    note_fallbacks(&plan, c.quiet);
    if (c.dry_run) {
        print_plan(&c, &plan);
        rc = 0;
        goto out_plan;
    }
    if (check_disk_space(out, plan.data_bytes + vocab->size + (uint64_t)plan.n_tensors * 128, err)) goto out_plan;
    /* Write beside the target, rename when complete: an interrupted run never
     * leaves a file that looks like a finished model. */
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.partial", out) >= sizeof tmp) {
        moex_fail(err, "output path too long");
        goto out_plan;
    }
    double t0 = moex_time_s();
    if (write_model(&c, vocab, &plan, tmp, err)) goto out_plan;
    if (rename(tmp, out)) {
        moex_fail(err, "cannot rename %s to %s: %s", tmp, out, strerror(errno));
        remove(tmp);
        goto out_plan;
    }
    if (!c.quiet)
        fprintf(stderr, "gen: wrote %s (%s %s, %lld tokens, %.1f MB) in %.1f s\n", out, gen_arch_name(c.arch),
                c.preset, (long long)c.n_vocab, (double)plan.data_bytes / 1e6, moex_time_s() - t0);
    rc = 0;
out_plan:
    gen_plan_free(&plan);
out_vocab:
    moex_gguf_close(vocab);
    return rc;
}

int moex_tool_gen(int argc, char **argv) {
    gen_args a;
    int rc = collect_args(argc, argv, &a);
    if (rc) return rc;
    if (a.help) {
        usage(stdout);
        return 0;
    }
    gen_config cfg;
    if (config_from_args(&a, &cfg)) return 2;
    moex_error err = {{0}};
    if (generate(&cfg, a.vocab, a.out, &err)) {
        fprintf(stderr, "gen: %s\n", err.msg);
        return 1;
    }
    return 0;
}
