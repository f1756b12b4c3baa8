/* llama.cpp as a peer: reference logits and a speed benchmark on the same
 * GGUF files our engine runs. Built by setup_peer.sh against the prebuilt
 * llama.cpp of the node-llama-cpp npm package (not part of the CMake build).
 *
 *   llama_peer logits MODEL TOKENS_CSV N_GEN OUT.f32 [--threads T]
 *       Evaluates the prompt as one batch, then greedily generates N_GEN
 *       tokens one at a time. OUT.f32 gets float32 logits [position][vocab]
 *       for every evaluated position (prompt positions first; the last
 *       generated token is not evaluated). The generated ids go to stdout,
 *       space-separated. KV cache in f32 and no flash attention, so f32 models
 *       can be compared tightly.
 *   llama_peer bench MODEL [--threads T] [-p 512] [-n 128] [-r 3]
 *       llama-bench's pp/tg tests: prompt tok/s for one batch of -p tokens,
 *       decode tok/s for -n single tokens from an empty context; CPU only,
 *       one warm-up, median of -r repetitions. Prints "key value" lines.
 *   llama_peer perplexity MODEL TEXT --ctx N [--chunks C] [--top1 OUT] [--threads T]
 *       llama.cpp's perplexity (tools/perplexity, its default mode): TEXT
 *       tokenized by llama.cpp (BOS first when the vocab adds it), windows of
 *       N tokens from position 0 with the first token replaced by BOS, the
 *       second half scored. Prints the running estimate "[1]x,[2]y,..." and
 *       "Final estimate: PPL = P +/- E"; --top1 writes each window's argmax
 *       ids at the scored positions, one line per window. KV cache in f32.
 *   llama_peer info MODEL      loads the model and prints what llama.cpp sees.
 *   llama_peer dequant TYPE_ID IN.bin OUT.f32
 *       ggml's to_float (dequantize_row_*) of the whole blocks of type TYPE_ID
 *       (ggml's id) in IN.bin, as float32 to OUT.f32. No model.
 *   llama_peer quantize TYPE_ID IN.f32 OUT.bin [N_PER_ROW]
 *       ggml_quantize_chunk (quantize_row_*_ref, no imatrix) of the float32
 *       values of IN.f32 in rows of N_PER_ROW (default: one row of all).
 *   llama_peer tokenize VOCAB
 *       Loads only the vocabulary. Each stdin line is "FLAGS HEX": FLAGS bit 0
 *       parses special tokens, bit 1 adds BOS/EOS as the vocab asks; HEX is the
 *       text's bytes. Prints per line "IDS<tab>HEX": the token ids, space-
 *       separated, and the hex of llama_detokenize of them (special tokens
 *       rendered when bit 0 is set). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-backend.h"
#include "llama.h"
#include "../../bench/bench_util.h"

#ifndef PEER_BACKEND_DIR
#define PEER_BACKEND_DIR "."
#endif

static int verbose;
static int vocab_only;   /* tokenize: load the vocabulary alone */

static void quiet_log(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    if (verbose || level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool no_progress_dots(float progress, void *ud) {
    (void)progress, (void)ud;
    return true;
}

static struct llama_model *load_model(const char *path) {
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.vocab_only = vocab_only;
    if (!verbose) mp.progress_callback = no_progress_dots;
    struct llama_model *m = llama_model_load_from_file(path, mp);
    if (!m) fprintf(stderr, "llama_peer: llama.cpp could not load %s (run with LLAMA_PEER_VERBOSE=1 for its log)\n", path);
    return m;
}

static struct llama_context *new_context(struct llama_model *m, int n_ctx, int n_batch, int threads, int exact) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = cp.n_ubatch = (uint32_t)n_batch;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.no_perf = 1;
    if (exact) {   /* f32 KV cache and plain attention: nothing rounds what the model computes */
        cp.type_k = cp.type_v = GGML_TYPE_F32;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    struct llama_context *ctx = llama_init_from_model(m, cp);
    if (!ctx) fprintf(stderr, "llama_peer: cannot create a llama.cpp context\n");
    return ctx;
}

/* Decodes tokens at positions pos0.. in one batch; logits for all or only the last. */
static int decode(struct llama_context *ctx, const llama_token *toks, int n, int pos0, int all_logits) {
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = toks[i];
        b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = (int8_t)(all_logits || i == n - 1);
    }
    b.n_tokens = n;
    int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    if (rc) fprintf(stderr, "llama_peer: llama_decode failed (%d)\n", rc);
    return rc;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int parse_tokens(const char *csv, llama_token **out) {
    int cap = 16, n = 0;
    llama_token *t = malloc((size_t)cap * sizeof *t);
    const char *p = csv;
    while (t && *p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 0x7fffffff) {
            fprintf(stderr, "llama_peer: bad token list '%s'\n", csv);
            free(t);
            return -1;
        }
        if (n == cap && !(t = realloc(t, (size_t)(cap *= 2) * sizeof *t))) break;
        t[n++] = (llama_token)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            fprintf(stderr, "llama_peer: bad token list '%s'\n", csv);
            free(t);
            return -1;
        }
    }
    if (!t || !n) {
        free(t);
        return -1;
    }
    *out = t;
    return n;
}

static int write_rows(FILE *f, struct llama_context *ctx, int first, int n, int n_vocab) {
    for (int i = first; i < first + n; i++) {
        const float *row = llama_get_logits_ith(ctx, i);
        if (!row || fwrite(row, sizeof(float), (size_t)n_vocab, f) != (size_t)n_vocab) return -1;
    }
    return 0;
}

static int cmd_logits(struct llama_model *m, const char *csv, int n_gen, const char *out, int threads) {
    llama_token *prompt;
    int n_prompt = parse_tokens(csv, &prompt);
    if (n_prompt < 0) return 2;
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(m));
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= n_vocab) {
            fprintf(stderr, "llama_peer: token %d is outside the vocabulary of %d\n", prompt[i], n_vocab);
            return 2;
        }
    struct llama_context *ctx = new_context(m, n_prompt + n_gen + 8, n_prompt > 64 ? n_prompt : 64, threads, 1);
    FILE *f = fopen(out, "wb");
    int rc = !ctx || !f;
    if (f == NULL) fprintf(stderr, "llama_peer: cannot write %s\n", out);
    if (!rc) rc = decode(ctx, prompt, n_prompt, 0, 1) || write_rows(f, ctx, 0, n_prompt, n_vocab);
    int pos = n_prompt;
    for (int g = 0; !rc && g < n_gen; g++) {
        llama_token next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        printf(g ? " %d" : "%d", next);
        if (g + 1 < n_gen) rc = decode(ctx, &next, 1, pos++, 1) || write_rows(f, ctx, 0, 1, n_vocab);
    }
    printf("\n");
    if (f && fclose(f)) rc = 1;
    if (ctx) llama_free(ctx);
    free(prompt);
    return rc ? 1 : 0;
}

static char *read_text(const char *path, int *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "llama_peer: cannot open %s\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "llama_peer: cannot read %s\n", path);
        return NULL;
    }
    buf[n] = 0;
    *len = (int)n;
    return buf;
}

/* log p(tok), as perplexity.cpp's log_softmax computes it. */
static double log_softmax_at(const float *logits, int n_vocab, int tok) {
    float max = logits[0];
    for (int i = 1; i < n_vocab; i++) max = logits[i] > max ? logits[i] : max;
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += expf(logits[i] - max);
    return (double)(logits[tok] - max) - log(sum);
}

static int cmd_perplexity(struct llama_model *m, const char *path, int n_ctx, int n_chunks, const char *top1_path,
                          int threads) {
    const struct llama_vocab *vocab = llama_model_get_vocab(m);
    int len;
    char *text = read_text(path, &len);
    if (!text) return 1;
    llama_token *toks = malloc(((size_t)len + 8) * sizeof *toks);
    int n = toks ? llama_tokenize(vocab, text, len, toks, len + 8, true, false) : -1;
    free(text);
    if (n < 2 * n_ctx) {
        fprintf(stderr, "llama_peer: %d tokens; a context of %d needs at least %d\n", n, n_ctx, 2 * n_ctx);
        free(toks);
        return 1;
    }
    int max_chunks = n / n_ctx;
    if (n_chunks <= 0 || n_chunks > max_chunks) n_chunks = max_chunks;
    const int n_vocab = llama_vocab_n_tokens(vocab), first = n_ctx / 2, add_bos = llama_vocab_get_add_bos(vocab);
    struct llama_context *ctx = new_context(m, n_ctx, n_ctx, threads, 1);
    FILE *top1 = top1_path ? fopen(top1_path, "w") : NULL;
    int rc = !ctx || (top1_path && !top1);
    struct llama_batch b = llama_batch_init(n_ctx, 0, 1);
    double nll = 0, nll2 = 0;
    long count = 0;
    printf("perplexity: %d tokens, windows of %d, scoring the second half of each\n", n, n_ctx);
    for (int c = 0; !rc && c < n_chunks; c++) {
        llama_memory_clear(llama_get_memory(ctx), 1);
        for (int k = 0; k < n_ctx; k++) {
            b.token[k] = k == 0 && add_bos ? llama_vocab_bos(vocab) : toks[c * n_ctx + k];
            b.pos[k] = k;
            b.n_seq_id[k] = 1;
            b.seq_id[k][0] = 0;
            b.logits[k] = (int8_t)(k >= first);
        }
        b.n_tokens = n_ctx;
        if (llama_decode(ctx, b)) {
            fprintf(stderr, "llama_peer: llama_decode failed\n");
            rc = 1;
            break;
        }
        for (int k = first; k < n_ctx - 1; k++) {
            const float *row = llama_get_logits_ith(ctx, k);
            double v = -log_softmax_at(row, n_vocab, toks[c * n_ctx + k + 1]);
            nll += v;
            nll2 += v * v;
            count++;
            if (top1) fprintf(top1, k + 2 < n_ctx ? "%d " : "%d\n", argmax(row, n_vocab));
        }
        printf("[%d]%.4f,", c + 1, exp(nll / count));
        fflush(stdout);
    }
    if (!rc) {
        double mean = nll / count, var = nll2 / count - mean * mean, ppl = exp(mean);
        printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", ppl, var > 0 ? sqrt(var / (count - 1)) * ppl : 0.0);
    }
    if (top1 && fclose(top1)) rc = 1;
    llama_batch_free(b);
    if (ctx) llama_free(ctx);
    free(toks);
    return rc;
}

static int cmd_bench(struct llama_model *m, int threads, int n_p, int n_g, int reps) {
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(m));
    int n_batch = n_p > 1 ? n_p : 1;
    struct llama_context *ctx = new_context(m, n_p + n_g + 8, n_batch, threads, 0);
    if (!ctx) return 1;
    llama_token *toks = malloc((size_t)(n_p > 1 ? n_p : 1) * sizeof *toks);
    for (int i = 0; i < n_p; i++) toks[i] = (llama_token)((i * 7919 + 13) % n_vocab);  /* like llama-bench: arbitrary ids */
    double *pp = calloc((size_t)reps, sizeof *pp), *tg = calloc((size_t)reps, sizeof *tg);
    int rc = 0;
    llama_memory_t mem = llama_get_memory(ctx);
    /* Warm-up: a batch and a single token, as llama-bench does (graphs and buffers get allocated). */
    if (n_p > 0) rc |= decode(ctx, toks, n_p, 0, 0);
    llama_memory_clear(mem, 1);
    if (n_g > 0 && !rc) rc |= decode(ctx, toks, 1, 0, 0);
    llama_memory_clear(mem, 1);
    for (int r = 0; r < reps && !rc; r++) {
        if (n_p > 0) {
            llama_memory_clear(mem, 1);
            double t0 = now_s();
            rc |= decode(ctx, toks, n_p, 0, 0);
            llama_synchronize(ctx);
            pp[r] = n_p / (now_s() - t0);
        }
        if (n_g > 0) {
            llama_memory_clear(mem, 1);
            llama_token t = toks[0];
            double t0 = now_s();
            for (int i = 0; i < n_g && !rc; i++) {
                rc |= decode(ctx, &t, 1, i, 0);
                t = (llama_token)((t + 1) % n_vocab);
            }
            llama_synchronize(ctx);
            tg[r] = n_g / (now_s() - t0);
        }
        fprintf(stderr, "llama_peer: rep %d: pp%d %.2f tok/s, tg%d %.2f tok/s\n", r + 1, n_p, pp[r], n_g, tg[r]);
    }
    if (!rc) {
        printf("threads %d\n", threads);
        if (n_p > 0) printf("pp%d_tok_s %.3f\n", n_p, median(pp, reps));
        if (n_g > 0) printf("tg%d_tok_s %.3f\n", n_g, median(tg, reps));
    }
    free(pp);
    free(tg);
    free(toks);
    llama_free(ctx);
    return rc ? 1 : 0;
}

static int cmd_info(struct llama_model *m) {
    char desc[256];
    llama_model_desc(m, desc, sizeof desc);
    printf("desc %s\n", desc);
    printf("n_vocab %d\n", llama_vocab_n_tokens(llama_model_get_vocab(m)));
    printf("n_params %llu\n", (unsigned long long)llama_model_n_params(m));
    printf("size %llu\n", (unsigned long long)llama_model_size(m));
    printf("system %s\n", llama_print_system_info());
    return 0;
}

/* ---- tokenize: llama.cpp's tokenizer over hex-encoded lines ---- */

static int hex_val(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Decodes hex[0..n) in place; the byte count, or -1 when it is not hex. */
static int unhex(char *hex, int n) {
    if (n % 2) return -1;
    for (int i = 0; i < n / 2; i++) {
        int hi = hex_val((unsigned char)hex[2 * i]), lo = hex_val((unsigned char)hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        hex[i] = (char)(hi * 16 + lo);
    }
    return n / 2;
}

/* One "FLAGS HEX" line (newline stripped) -> "IDS\tHEX" on stdout. */
static int tokenize_line(const struct llama_vocab *vocab, char *line) {
    char *sp = strchr(line, ' ');
    int flags = atoi(line), special = flags & 1, add = (flags >> 1) & 1;
    int len = sp ? unhex(sp + 1, (int)strlen(sp + 1)) : 0;
    if (len < 0) {
        fprintf(stderr, "llama_peer: bad tokenize line '%.40s'\n", line);
        return 1;
    }
    const char *text = sp ? sp + 1 : "";
    int cap = len + 8;
    llama_token *ids = malloc((size_t)cap * sizeof *ids);
    int n = ids ? llama_tokenize(vocab, text, len, ids, cap, add, special) : -1;
    if (n < 0 && ids && (ids = realloc(ids, (size_t)(cap = -n) * sizeof *ids)))
        n = llama_tokenize(vocab, text, len, ids, cap, add, special);
    int out_cap = 4 * len + 64;
    char *out = malloc((size_t)out_cap);
    int m = out && n >= 0 ? llama_detokenize(vocab, ids, n, out, out_cap, 0, special) : 0;
    if (m < 0 && (out = realloc(out, (size_t)(out_cap = -m)))) m = llama_detokenize(vocab, ids, n, out, out_cap, 0, special);
    int rc = n < 0 || m < 0 || !out;
    for (int i = 0; !rc && i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\t');
    for (int i = 0; !rc && i < m; i++) printf("%02x", (unsigned char)out[i]);
    putchar('\n');
    free(ids);
    free(out);
    if (rc) fprintf(stderr, "llama_peer: tokenize failed\n");
    return rc;
}

static int cmd_tokenize(struct llama_model *m) {
    const struct llama_vocab *vocab = llama_model_get_vocab(m);
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int rc = 0;
    while (!rc && (got = getline(&line, &cap, stdin)) >= 0) {
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        rc = tokenize_line(vocab, line);
    }
    free(line);
    return rc || fflush(stdout) ? 1 : 0;
}

/* ---- row conversions (no model) ---- */

/* The whole file at path (its size in *len), or NULL with a message. */
static void *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "llama_peer: cannot open %s\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(n > 0 ? (size_t)n : 1);
    if (!p || n < 0 || fread(p, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "llama_peer: cannot read %s\n", path);
        free(p);
        p = NULL;
    }
    fclose(f);
    *len = n > 0 ? (size_t)n : 0;
    return p;
}

static int write_all(const char *path, const void *p, size_t len) {
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(p, 1, len, f) == len;
    if (f && fclose(f)) ok = 0;
    if (!ok) fprintf(stderr, "llama_peer: cannot write %s\n", path);
    return ok ? 0 : 1;
}

/* ggml's traits of a type id, or NULL with a message. */
static const struct ggml_type_traits *type_traits(const char *id, enum ggml_type *type) {
    const int t = atoi(id);
    const struct ggml_type_traits *tt = t >= 0 && t < GGML_TYPE_COUNT ? ggml_get_type_traits((enum ggml_type)t) : NULL;
    if (!tt || !tt->type_name || tt->blck_size <= 0 || tt->type_size == 0) {
        fprintf(stderr, "llama_peer: %s is not a ggml type id\n", id);
        return NULL;
    }
    *type = (enum ggml_type)t;
    return tt;
}

static int cmd_dequant(const char *type_id, const char *in, const char *out) {
    enum ggml_type type;
    const struct ggml_type_traits *tt = type_traits(type_id, &type);
    if (!tt) return 2;
    if (!tt->to_float) {
        fprintf(stderr, "llama_peer: ggml has no to_float for %s\n", tt->type_name);
        return 1;
    }
    size_t len;
    void *src = read_all(in, &len);
    if (!src) return 1;
    if (len % tt->type_size) {
        fprintf(stderr, "llama_peer: %s: %zu bytes are not whole %s blocks of %zu\n", in, len, tt->type_name,
                tt->type_size);
        free(src);
        return 1;
    }
    const int64_t n = (int64_t)(len / tt->type_size) * tt->blck_size;
    float *dst = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    int rc = 1;
    if (dst) {
        tt->to_float(src, dst, n);
        rc = write_all(out, dst, sizeof(float) * (size_t)n);
    }
    free(src);
    free(dst);
    return rc;
}

static int cmd_quantize(const char *type_id, const char *in, const char *out, const char *per_row) {
    enum ggml_type type;
    const struct ggml_type_traits *tt = type_traits(type_id, &type);
    if (!tt) return 2;
    size_t len;
    float *src = read_all(in, &len);
    if (!src) return 1;
    const int64_t n = (int64_t)(len / sizeof(float));
    const int64_t n_per_row = per_row ? atoll(per_row) : n;
    if (len % sizeof(float) || n_per_row <= 0 || n % n_per_row || n_per_row % tt->blck_size) {
        fprintf(stderr, "llama_peer: %s: %lld values are not rows of %lld in whole %s blocks\n", in, (long long)n,
                (long long)n_per_row, tt->type_name);
        free(src);
        return 1;
    }
    const int64_t nrows = n / n_per_row;
    const size_t bytes = ggml_row_size(type, n_per_row) * (size_t)nrows;
    void *dst = malloc(bytes ? bytes : 1);
    int rc = 1;
    if (dst) {
        ggml_quantize_chunk(type, src, dst, 0, nrows, n_per_row, NULL);
        rc = write_all(out, dst, bytes);
    }
    free(src);
    free(dst);
    return rc;
}

static void usage(void) {
    fprintf(stderr, "usage: llama_peer logits MODEL TOKENS_CSV N_GEN OUT.f32 [--threads T]\n"
                    "       llama_peer bench MODEL [--threads T] [-p 512] [-n 128] [-r 3]\n"
                    "       llama_peer perplexity MODEL TEXT --ctx N [--chunks C] [--top1 OUT] [--threads T]\n"
                    "       llama_peer info MODEL\n"
                    "       llama_peer dequant TYPE_ID IN.bin OUT.f32\n"
                    "       llama_peer quantize TYPE_ID IN.f32 OUT.bin [N_PER_ROW]\n"
                    "       llama_peer tokenize VOCAB < lines of \"FLAGS HEX\"\n");
}

int main(int argc, char **argv) {
    if (argc < 3) {
        usage();
        return 2;
    }
    const char *mode = argv[1], *model = argv[2];
    /* the row conversions need no model and no backend */
    if (!strcmp(mode, "dequant") && argc == 5) return cmd_dequant(argv[2], argv[3], argv[4]);
    if (!strcmp(mode, "quantize") && (argc == 5 || argc == 6))
        return cmd_quantize(argv[2], argv[3], argv[4], argc == 6 ? argv[5] : NULL);
    int threads = 2, n_p = 512, n_g = 128, reps = 3, n_pos = 0, n_ctx = 512, n_chunks = 0;
    const char *pos[3] = {0}, *top1 = NULL;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--threads") && has) threads = atoi(argv[++i]);
        else if (!strcmp(a, "-p") && has) n_p = atoi(argv[++i]);
        else if (!strcmp(a, "-n") && has) n_g = atoi(argv[++i]);
        else if (!strcmp(a, "-r") && has) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--ctx") && has) n_ctx = atoi(argv[++i]);
        else if (!strcmp(a, "--chunks") && has) n_chunks = atoi(argv[++i]);
        else if (!strcmp(a, "--top1") && has) top1 = argv[++i];
        else if (n_pos < 3) pos[n_pos++] = a;
        else {
            usage();
            return 2;
        }
    }
    if (threads < 1 || reps < 1 || n_p < 0 || n_g < 0 || n_ctx < 4) {
        usage();
        return 2;
    }
    verbose = getenv("LLAMA_PEER_VERBOSE") != NULL;
    llama_log_set(quiet_log, NULL);
    /* The CPU backends (one per ISA level) are plugins next to libllama. */
    const char *backends = getenv("LLAMA_PEER_BACKEND_DIR");
    ggml_backend_load_all_from_path(backends ? backends : PEER_BACKEND_DIR);
    llama_backend_init();
    vocab_only = !strcmp(mode, "tokenize");
    struct llama_model *m = load_model(model);
    if (!m) return 1;
    int rc;
    if (!strcmp(mode, "logits") && n_pos == 3) rc = cmd_logits(m, pos[0], atoi(pos[1]), pos[2], threads);
    else if (!strcmp(mode, "bench") && n_pos == 0) rc = cmd_bench(m, threads, n_p, n_g, reps);
    else if (!strcmp(mode, "info") && n_pos == 0) rc = cmd_info(m);
    else if (!strcmp(mode, "tokenize") && n_pos == 0) rc = cmd_tokenize(m);
    else if (!strcmp(mode, "perplexity") && n_pos == 1) rc = cmd_perplexity(m, pos[0], n_ctx, n_chunks, top1, threads);
    else {
        usage();
        rc = 2;
    }
    llama_model_free(m);
    llama_backend_free();
    return rc;
}
