/* moex-gguf quantize IN.gguf OUT.gguf --type T: rewrites a model's weights
 * in another type, as llama.cpp's llama-quantize does for these files.
 *
 * Every metadata key is copied (general.file_type is rewritten for the new
 * type); tensors keep their names, shapes and order. 1-D tensors (norms) and
 * routers (ffn_gate_inp) stay as they are, as llama.cpp keeps them. Each
 * other tensor is dequantized row by row (moex_dequantize_row) and quantized
 * to its new type (moex_quantize_row); a tensor already in its new type is
 * copied byte for byte. Types per tensor:
 *   uniform (f32 ... q6_K)  every weight in the type
 *   q4_K_M                  llama.cpp's mix, the rule of `gen --type q4_K_M`
 *                           (moex_tool_q4_k_m_type, tools/tool_types.c) plus
 *                           llama.cpp's tied output: without output.weight,
 *                           token_embd is the output and takes Q6_K
 * A type whose block does not divide a tensor's rows falls back as llama.cpp
 * does (q4_K->q5_0, q5_K->q5_1, q6_K->q8_0, else f16). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common/common.h"
#include "kernels/kernels.h"
#include "tools/tool.h"


typedef struct quant_args {
    const char *in, *out, *type;
    bool quiet;
} quant_args;

typedef struct quant_plan {
    bool q4_k_m;          /* the mix, else every weight in `type` */
    moex_type type;
    int64_t n_layer, n_expert;
    bool has_output;
} quant_plan;

static void usage(FILE *f) {
    fprintf(f, "usage: moex-gguf quantize IN.gguf OUT.gguf --type T [--quiet]\n"
               "  T: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_K q5_K q6_K mxfp4 (every weight), or q4_K_M\n"
               "     (llama.cpp's mix: output (or a tied token_embd) Q6_K, attn_v and ffn_down(_exps)\n"
               "     Q6_K on the layers llama.cpp picks, 8-expert models attn_k/v Q8_0 and attn_output\n"
               "     Q5_K, the rest Q4_K). Norms and routers stay as they are; metadata is copied.\n");
}

/* Returns 0, 2 on bad usage, or -1 for --help. */
static int parse_args(int argc, char **argv, quant_args *a) {
    memset(a, 0, sizeof *a);
    int n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) return -1;
        if (!strcmp(s, "--quiet") || !strcmp(s, "-q")) {
            a->quiet = true;
        } else if (!strcmp(s, "--type")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "quantize: --type needs a value\n");
                return 2;
            }
            a->type = argv[++i];
        } else if (s[0] == '-' && s[1]) {
            fprintf(stderr, "quantize: unknown option '%s' (see quantize --help)\n", s);
            return 2;
        } else if (n_pos < 2) {
            *(n_pos++ ? &a->out : &a->in) = s;
        } else {
            fprintf(stderr, "quantize: unexpected argument '%s'\n", s);
            return 2;
        }
    }
    if (!a->in || !a->out || !a->type) {
        fprintf(stderr, "quantize: IN.gguf, OUT.gguf and --type are required (see quantize --help)\n");
        return 2;
    }
    return 0;
}

static int parse_type(const char *s, quant_plan *p) {
    if (!strcasecmp(s, "q4_K_M")) {
        p->q4_k_m = true;
        p->type = MOEX_TYPE_Q4_K;
        return 0;
    }
    int t = moex_type_from_name(s);
    const moex_type_traits *tt = moex_type_get(t);
    if (!tt || !tt->is_weight_type) {
        fprintf(stderr, "quantize: unknown --type '%s' (see quantize --help)\n", s);
        return -1;
    }
    p->type = (moex_type)t;
    return 0;
}

/* llama_ftype of the output: MOSTLY_<type>, the K-quants as their _S mix. */
static int file_type_of(const quant_plan *p) {
    if (p->q4_k_m) return MOEX_GGUF_FTYPE_Q4_K_M;
    return moex_gguf_file_type_of(p->type);
}

/* ---- the type of each tensor ---- */

static bool name_has(const moex_gguf_str *n, const char *part) {
    size_t k = strlen(part);
    for (uint64_t i = 0; i + k <= n->len; i++)
        if (!memcmp(n->data + i, part, k)) return true;
    return false;
}

static bool name_is(const moex_gguf_str *n, const char *s) {
    return n->len == strlen(s) && !memcmp(n->data, s, n->len);
}

/* The layer of "blk.N.*", or -1. */
static int64_t layer_of(const moex_gguf_str *n) {
    if (n->len < 5 || memcmp(n->data, "blk.", 4)) return -1;
    int64_t v = 0;
    uint64_t i = 4;
    for (; i < n->len && n->data[i] >= '0' && n->data[i] <= '9' && v < 1 << 20; i++) v = v * 10 + (n->data[i] - '0');
    return i > 4 ? v : -1;
}

/* What the weight named n is for (tensor_role), from its GGUF name; an
 * untied model's token_embd is output's too. */
static tensor_role role_of(const quant_plan *p, const moex_gguf_str *n) {
    if (name_is(n, MOEX_T_OUTPUT) || (!p->has_output && name_is(n, MOEX_T_TOKEN_EMBD))) return ROLE_OUTPUT;
    if (name_is(n, MOEX_T_TOKEN_EMBD)) return ROLE_EMBD;
    if (name_has(n, ".attn_q.")) return ROLE_ATTN_Q;
    if (name_has(n, ".attn_k.")) return ROLE_ATTN_K;
    if (name_has(n, ".attn_v.")) return ROLE_ATTN_V;
    if (name_has(n, ".attn_output.")) return ROLE_ATTN_OUT;
    if (name_has(n, ".ffn_down")) return ROLE_FFN_DOWN;
    return ROLE_FFN_GATE_UP;
}

/* The new type of t: kept for norms and routers, else the plan's choice. */
static moex_type target_type(const quant_plan *p, const moex_gguf_tensor *t) {
    if (t->n_dims < 2 || name_has(&t->name, "ffn_gate_inp")) return t->type;
    moex_type want = p->q4_k_m ? moex_tool_q4_k_m_type(role_of(p, &t->name), layer_of(&t->name), p->n_layer,
                                                         p->n_expert == 8)
                               : p->type;
    return t->ne[0] % moex_type_get(want)->block_elems ? moex_tool_fallback_type(want, t->ne[0]) : want;
}

static int read_plan(const moex_gguf *g, quant_plan *p, moex_error *err) {
    moex_hparams hp;
    if (moex_hparams_read(g, &hp, err)) return -1;
    p->n_layer = hp.n_layer;
    p->n_expert = hp.n_expert;
    p->has_output = moex_gguf_find_tensor(g, MOEX_T_OUTPUT) != NULL;
    return 0;
}

/* ---- writing ---- */

static int copy_metadata(const moex_gguf *g, const quant_plan *p, moex_gguf_writer *w) {
    int ftype = file_type_of(p);
    bool wrote_ftype = false;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const moex_gguf_kv *kv = &g->kvs[i];
        if (name_is(&kv->key, "general.file_type")) {
            wrote_ftype = true;
            if (ftype >= 0 && moex_gguf_writer_kv_u32(w, "general.file_type", (uint32_t)ftype)) return -1;
        } else if (moex_gguf_writer_kv_copy(w, kv)) {
            return -1;
        }
    }
    if (!wrote_ftype && ftype >= 0 && moex_gguf_writer_kv_u32(w, "general.file_type", (uint32_t)ftype)) return -1;
    return 0;
}

/* One tensor's data in type `to`, row by row, into buf (its new size). */
static int convert_tensor(const moex_gguf_tensor *t, moex_type to, uint8_t *buf, float *row, moex_error *err) {
    const int64_t cols = t->ne[0], rows = t->n_elements / cols;
    if (to == t->type) {
        memcpy(buf, t->data, t->nbytes);
        return 0;
    }
    const size_t in_rb = moex_row_bytes(t->type, cols), out_rb = moex_row_bytes(to, cols);
    for (int64_t r = 0; r < rows; r++) {
        if (moex_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * in_rb, row, cols, err) ||
            moex_quantize_row(to, row, buf + (size_t)r * out_rb, cols, err))
            return moex_error_prefix(err, "%.*s row %lld", (int)t->name.len, t->name.data, (long long)r);
    }
    return 0;
}

static int write_tensors(const moex_gguf *g, const moex_type *types, moex_gguf_writer *w, moex_error *err) {
    size_t max_bytes = 0;
    int64_t max_cols = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const moex_gguf_tensor *t = &g->tensors[i];
        size_t nb = moex_row_bytes(types[i], t->ne[0]) * (size_t)(t->n_elements / t->ne[0]);
        if (nb > max_bytes) max_bytes = nb;
        if (t->ne[0] > max_cols) max_cols = t->ne[0];
    }
    uint8_t *buf = malloc(max_bytes ? max_bytes : 1);
    float *row = malloc((size_t)(max_cols ? max_cols : 1) * sizeof *row);
    int rc = 0;
    if (!buf || !row) rc = moex_fail(err, "out of memory for a tensor of %zu bytes", max_bytes);
    for (uint64_t i = 0; !rc && i < g->n_tensors; i++) {
        const moex_gguf_tensor *t = &g->tensors[i];
        size_t nb = moex_row_bytes(types[i], t->ne[0]) * (size_t)(t->n_elements / t->ne[0]);
        if (convert_tensor(t, types[i], buf, row, err)) rc = -1;
        else if (moex_gguf_writer_data(w, buf, nb)) rc = moex_fail(err, "writing tensor data failed");
    }
    free(buf);
    free(row);
    return rc;
}

static int write_model(const moex_gguf *g, const quant_plan *p, const moex_type *types, const char *path,
                       moex_error *err) {
    moex_gguf_writer *w = moex_gguf_writer_open(path, err);
    if (!w) return -1;
    int rc = copy_metadata(g, p, w);
    for (uint64_t i = 0; !rc && i < g->n_tensors; i++) {
        const moex_gguf_tensor *t = &g->tensors[i];
        char name[256];
        if (t->name.len >= sizeof name) {
            moex_error ignored;
            moex_gguf_writer_close(w, &ignored);
            return moex_fail(err, "tensor name of %llu bytes is too long", (unsigned long long)t->name.len);
        }
        memcpy(name, t->name.data, t->name.len);
        name[t->name.len] = 0;
        rc = moex_gguf_writer_tensor(w, name, types[i], t->n_dims, t->ne);
    }
    if (!rc) rc = moex_gguf_writer_begin_data(w);
    if (!rc && write_tensors(g, types, w, err)) {
        moex_error ignored;
        moex_gguf_writer_close(w, &ignored);   /* removes the partial file; err holds the cause */
        return -1;
    }
    return moex_gguf_writer_close(w, err);
}

static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return !stat(a, &sa) && !stat(b, &sb) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static void print_summary(const moex_gguf *g, const moex_type *types, const char *out) {
    uint64_t bytes[MOEX_TYPE_COUNT] = {0}, total_in = 0, total_out = 0;
    int count[MOEX_TYPE_COUNT] = {0};
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const moex_gguf_tensor *t = &g->tensors[i];
        uint64_t nb = moex_row_bytes(types[i], t->ne[0]) * (uint64_t)(t->n_elements / t->ne[0]);
        bytes[types[i]] += nb;
        count[types[i]]++;
        total_in += t->nbytes;
        total_out += nb;
    }
    fprintf(stderr, "quantize: wrote %s: %.2f MB of tensors (from %.2f MB):", out, total_out / 1e6, total_in / 1e6);
    for (int k = 0; k < MOEX_TYPE_COUNT; k++)
        if (count[k]) fprintf(stderr, " %s x%d (%.2f MB)", moex_type_get(k)->name, count[k], bytes[k] / 1e6);
    fprintf(stderr, "\n");
}

static int quantize(const quant_args *a, quant_plan *p, moex_error *err) {
    if (same_file(a->in, a->out)) return moex_fail(err, "OUT.gguf is IN.gguf: write to another file");
    moex_gguf *g = moex_gguf_open(a->in, err);
    if (!g) return -1;
    int rc = -1;
    moex_type *types = NULL;
    char tmp[4096];
    if (read_plan(g, p, err)) goto out;
    if (!(types = malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof *types))) {
        moex_fail(err, "out of memory");
        goto out;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) types[i] = target_type(p, &g->tensors[i]);
    /* Written beside the target and renamed when complete, as gen does. */
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.partial", a->out) >= sizeof tmp) {
        moex_fail(err, "output path too long");
        goto out;
    }
    if (write_model(g, p, types, tmp, err)) goto out;
    if (rename(tmp, a->out)) {
        moex_fail(err, "cannot rename %s to %s: %s", tmp, a->out, strerror(errno));
        remove(tmp);
        goto out;
    }
    if (!a->quiet) print_summary(g, types, a->out);
    rc = 0;
out:
    free(types);
    moex_gguf_close(g);
    return rc;
}

int moex_tool_quantize(int argc, char **argv) {
    quant_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc < 0) {
        usage(stdout);
        return 0;
    }
    if (rc) return rc;
    quant_plan p = {0};
    if (parse_type(a.type, &p)) return 2;
    moex_error err = {{0}};
    if (quantize(&a, &p, &err)) {
        fprintf(stderr, "quantize: %s\n", err.msg);
        return 1;
    }
    return 0;
}
