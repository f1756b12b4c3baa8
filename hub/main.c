/* moex-hub: loads a GGUF model and generates text. With --local it runs the
 * whole model in this process (the distributed hub arrives with the worker
 * protocol). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hub/hub.h"

typedef struct options {
    const char *model, *prompt, *prompt_tokens, *dump_logits;
    int64_t n_predict, n_ctx, n_batch;
    int threads;
    bool local, print_tokens, ignore_eos, parse_special;
    moex_sampler_params sp;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: moex-hub --local -m MODEL.gguf (-p TEXT | --prompt-tokens A,B,C) [options]\n"
            "  -m, --model FILE        GGUF model\n"
            "  -p, --prompt TEXT       prompt text (special tokens like <|im_start|> are parsed; --no-special to spell them)\n"
            "  --prompt-tokens LIST    prompt as comma-separated token ids (bypasses the tokenizer)\n"
            "  -n, --n-predict N       tokens to generate (default 128)\n"
            "  --temp T                temperature, 0 = greedy (default 0.8)\n"
            "  --top-k K               (default 40, 0 = off)\n"
            "  --top-p P               (default 0.95, 1 = off)\n"
            "  --min-p P               (default 0.05, 0 = off)\n"
            "  --seed S                sampling seed (default: from the clock, printed)\n"
            "  -t, --threads N         CPU threads (default: all cores)\n"
            "  --ctx N                 context positions (default: prompt + n, at most the model's)\n"
            "  --batch N               prompt tokens per forward pass (default 512)\n"
            "  --ignore-eos            keep generating past end-of-generation tokens\n"
            "  --print-tokens          print generated token ids instead of text\n"
            "  --dump-logits FILE      write float32 logits [positions][vocab] of every evaluated position\n"
            "  --local                 run the whole model in this process\n");
}

static int parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "moex-hub: %s expects an integer in [%lld, %lld], got '%s'\n", flag, (long long)lo,
                (long long)hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_f32(const char *flag, const char *s, float lo, float hi, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "moex-hub: %s expects a number in [%g, %g], got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* Returns 0 to run, 1 when help was printed, -1 on a bad flag. */
static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.n_predict = 128, .n_batch = 512, .parse_special = true,
                   .sp = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .seed = (uint64_t)time(NULL)}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
#define NEED_VALUE()                                                          \
    do {                                                                      \
        if (!v) {                                                             \
            fprintf(stderr, "moex-hub: %s needs a value\n", a);               \
            return -1;                                                        \
        }                                                                     \
        i++;                                                                  \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--local")) {
            o->local = true;
        } else if (!strcmp(a, "--print-tokens")) {
            o->print_tokens = true;
        } else if (!strcmp(a, "--ignore-eos")) {
            o->ignore_eos = true;
        } else if (!strcmp(a, "--no-special")) {
            o->parse_special = false;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            NEED_VALUE();
            o->model = v;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            NEED_VALUE();
            o->prompt = v;
        } else if (!strcmp(a, "--prompt-tokens")) {
            NEED_VALUE();
            o->prompt_tokens = v;
        } else if (!strcmp(a, "--dump-logits")) {
            NEED_VALUE();
            o->dump_logits = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            NEED_VALUE();
            if (parse_i64(a, v, 0, 1 << 24, &o->n_predict)) return -1;
        } else if (!strcmp(a, "--ctx")) {
            NEED_VALUE();
            if (parse_i64(a, v, 1, 1 << 24, &o->n_ctx)) return -1;
        } else if (!strcmp(a, "--batch")) {
            NEED_VALUE();
            if (parse_i64(a, v, 1, 1 << 16, &o->n_batch)) return -1;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            NEED_VALUE();
            if (parse_i64(a, v, 1, 1024, &n)) return -1;
            o->threads = (int)n;
        } else if (!strcmp(a, "--seed")) {
            NEED_VALUE();
            if (parse_i64(a, v, 0, INT64_MAX, &n)) return -1;
            o->sp.seed = (uint64_t)n;
        } else if (!strcmp(a, "--top-k")) {
            NEED_VALUE();
            if (parse_i64(a, v, 0, 1 << 24, &n)) return -1;
            o->sp.top_k = (int)n;
        } else if (!strcmp(a, "--temp")) {
            NEED_VALUE();
            if (parse_f32(a, v, 0, 100, &o->sp.temp)) return -1;
        } else if (!strcmp(a, "--top-p")) {
            NEED_VALUE();
            if (parse_f32(a, v, 0, 1, &o->sp.top_p)) return -1;
        } else if (!strcmp(a, "--min-p")) {
            NEED_VALUE();
            if (parse_f32(a, v, 0, 1, &o->sp.min_p)) return -1;
        } else {
            fprintf(stderr, "moex-hub: unknown option '%s' (see --help)\n", a);
            return -1;
        }
#undef NEED_VALUE
    }
    if (!o->model) {
        fprintf(stderr, "moex-hub: no model given: use -m MODEL.gguf\n");
        return -1;
    }
    if (!o->prompt == !o->prompt_tokens) {
        fprintf(stderr, "moex-hub: give exactly one of -p TEXT or --prompt-tokens A,B,C\n");
        return -1;
    }
    if (!o->local) {
        fprintf(stderr, "moex-hub: only --local is available in this build (distributed serving is not built yet)\n");
        return -1;
    }
    return 0;
}

/* "1,2, 3" -> ids; validated against the vocabulary later by the forward pass. */
static int64_t parse_token_list(const char *s, int32_t **out) {
    int64_t cap = 16, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    while (ids && *s) {
        while (*s == ' ' || *s == ',') s++;
        if (!*s) break;
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (errno || end == s || v < 0 || v > INT32_MAX || (*end && *end != ',' && *end != ' ')) {
            fprintf(stderr, "moex-hub: --prompt-tokens: '%s' is not a list of token ids\n", s);
            free(ids);
            return -1;
        }
        if (n == cap) {
            int32_t *grown = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!grown) break;
            ids = grown;
        }
        ids[n++] = (int32_t)v;
        s = end;
    }
    if (!ids) return -1;
    *out = ids;
    return n;
}

static int64_t tokenize_prompt(const moex_model *m, const options *o, int32_t **out) {
    if (o->prompt_tokens) return parse_token_list(o->prompt_tokens, out);
    if (!m->tok) {
        fprintf(stderr, "moex-hub: this model has no tokenizer: pass --prompt-tokens\n");
        return -1;
    }
    moex_error err = {0};
    size_t len = strlen(o->prompt);
    int64_t cap = (int64_t)len + 8;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int64_t n = ids ? moex_tokenize(m->tok, o->prompt, len, true, o->parse_special, ids, cap, &err) : -1;
    if (n < 0 || n > cap) {
        fprintf(stderr, "moex-hub: cannot tokenize the prompt: %s\n", err.msg[0] ? err.msg : "out of memory");
        free(ids);
        return -1;
    }
    *out = ids;
    return n;
}

typedef struct output_ctx {
    const moex_model *m;
    bool print_tokens;
    int64_t n_printed;
    FILE *logits;
} output_ctx;

static int on_token(void *ctx, int32_t id) {
    output_ctx *oc = ctx;
    if (oc->print_tokens) {
        printf(oc->n_printed++ ? " %d" : "%d", id);
    } else if (oc->m->tok) {
        char buf[256];
        int n = moex_token_to_piece(oc->m->tok, id, false, buf, sizeof buf);
        if (n > 0 && n <= (int)sizeof buf) fwrite(buf, 1, (size_t)n, stdout);
    }
    fflush(stdout);
    return 0;
}

static int on_logits(void *ctx, const float *logits, int64_t n_rows) {
    output_ctx *oc = ctx;
    size_t n = (size_t)n_rows * (size_t)oc->m->hp.n_vocab;
    return fwrite(logits, sizeof(float), n, oc->logits) == n ? 0 : -1;
}

static int run(const options *o) {
    moex_error err = {0};
    double t0 = moex_time_s();
    moex_model *m = moex_model_load(o->model, &err);
    if (!m) {
        fprintf(stderr, "moex-hub: cannot load %s: %s\n", o->model, err.msg);
        return 1;
    }
    double load_s = moex_time_s() - t0;
    char desc[512];
    moex_model_describe(m, desc, sizeof desc);
    moex_log(MOEX_LOG_INFO, "%s", desc);

    int rc = 1;
    int32_t *prompt = NULL;
    moex_pool *pool = NULL;
    moex_local_executor *le = NULL;
    moex_state *s = NULL;
    moex_sampler *smp = NULL;
    output_ctx oc = {.m = m, .print_tokens = o->print_tokens};
    int64_t n_prompt = tokenize_prompt(m, o, &prompt);
    if (n_prompt < 0) goto done;
    if (n_prompt == 0) {
        fprintf(stderr, "moex-hub: the prompt has no tokens\n");
        goto done;
    }
    int64_t n_ctx = o->n_ctx ? o->n_ctx : n_prompt + o->n_predict;
    if (!(pool = moex_pool_create(o->threads)) || !(le = moex_local_executor_create(m, pool)) ||
        !(smp = moex_sampler_create(&o->sp, m->hp.n_vocab))) {
        fprintf(stderr, "moex-hub: out of memory\n");
        goto done;
    }
    if (!(s = moex_state_create(m, n_ctx, o->n_batch, pool, moex_local_executor_iface(le), &err))) {
        fprintf(stderr, "moex-hub: %s\n", err.msg);
        goto done;
    }
    if (o->dump_logits && !(oc.logits = fopen(o->dump_logits, "wb"))) {
        fprintf(stderr, "moex-hub: cannot write %s: %s\n", o->dump_logits, strerror(errno));
        goto done;
    }
    if (o->sp.temp > 0) moex_log(MOEX_LOG_INFO, "sampling seed %llu", (unsigned long long)o->sp.seed);
    moex_gen_params gp = {.n_predict = o->n_predict, .ignore_eos = o->ignore_eos, .on_token = on_token,
                          .on_logits = o->dump_logits ? on_logits : NULL, .cb_ctx = &oc};
    moex_gen_stats st;
    if (moex_generate(m, s, smp, prompt, n_prompt, &gp, &st, &err)) {
        fprintf(stderr, "\nmoex-hub: generation failed: %s\n", err.msg);
        goto done;
    }
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "moex-hub: load %.2f s | prompt %lld tokens %.1f tok/s | decode %lld tokens %.1f tok/s | threads %d | %s\n",
            load_s, (long long)st.n_prompt, st.prompt_s > 0 ? st.n_prompt / st.prompt_s : 0.0,
            (long long)st.n_generated, st.decode_s > 0 ? st.n_decode_evals / st.decode_s : 0.0, moex_pool_size(pool),
            moex_kernels_simd_name());
    rc = 0;
done:
    if (oc.logits && fclose(oc.logits) && rc == 0) {
        fprintf(stderr, "moex-hub: writing %s failed\n", o->dump_logits);
        rc = 1;
    }
    moex_sampler_free(smp);
    moex_state_free(s);
    moex_local_executor_free(le);
    moex_pool_destroy(pool);
    free(prompt);
    moex_model_free(m);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    int r = parse_args(argc, argv, &o);
    if (r) return r > 0 ? 0 : 2;
    return run(&o);
}
