/* moex-hub: loads a GGUF model and generates text. With --local it runs the
 * whole model in this process; otherwise it serves workers on a WebSocket
 * port and sends them the experts (one-shot with a prompt, or serving). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hub/cli.h"
#include "hub/hub.h"
#include "proto/proto.h"
#if MOEX_HAVE_VULKAN
#include "engine/vk/engine_vk.h"
#endif

typedef struct options {
    const char *model, *prompt, *prompt_tokens, *dump_logits;
    const char *perplexity, *ppl_top1, *routing_trace;  /* --perplexity FILE and its companions */
    int64_t ppl_chunks;
    int64_t n_predict, n_ctx, n_batch;
    bool print_tokens, ignore_eos, parse_special;
    moex_hub_config hub;
    hub_cli cli;                 /* the flags shared with moex-hub serve (hub/cli.h): cli.eng, the engine's */
} options;

#define NO_VULKAN "this moex-hub was built without Vulkan (-DMOEX_VULKAN=OFF); rebuild with -DMOEX_VULKAN=ON"

static volatile sig_atomic_t interrupted;
static void on_signal(int sig) { interrupted = sig; }

static void usage(FILE *f, const options *o) {
    fprintf(f,
            "usage: moex-hub --local -m MODEL.gguf (-p TEXT | --prompt-tokens A,B,C) [options]\n"
            "       moex-hub -m MODEL.gguf [--backend vulkan] --port P --token T [-p TEXT] [options]  (distributed)\n"
            "       moex-hub serve -m MODEL.gguf ...  the OpenAI-compatible API server (moex-hub serve --help)\n"
            "  -m, --model FILE        GGUF model\n"
            "  -p, --prompt TEXT       prompt text (special tokens like <|im_start|> are parsed; --no-special to spell them)\n"
            "  --prompt-tokens LIST    prompt as comma-separated token ids (bypasses the tokenizer)\n"
            "  -n, --n-predict N       tokens to generate (default 128)\n"
            "  --ctx N                 context positions (default: prompt + n, at most the model's)\n"
            "  --batch N               prompt tokens per forward pass (default 512)\n"
            "  --ignore-eos            keep generating past end-of-generation tokens\n"
            "  --print-tokens          print generated token ids instead of text\n"
            "  --dump-logits FILE      write float32 logits [positions][vocab] of every evaluated position\n"
            "  --perplexity FILE       score FILE instead of generating: windows of --ctx tokens (default 512),\n"
            "                          the second half of each scored, as llama.cpp's perplexity does\n"
            "  --ppl-chunks N          score only the first N windows   --ppl-top1 FILE  write each window's\n"
            "                          top-1 ids at the scored positions (one line per window)\n"
            "  --routing-trace FILE    write the experts chosen for every evaluated token and layer (CPU backend)\n"
            "  --list-devices          list the Vulkan devices and exit\n");
    hub_cli_engine_usage(f, &o->cli);
    fprintf(f, "distributed (without --local): serve workers, and generate once --min-workers are ready\n");
    hub_cli_usage(f, &o->cli, &(hub_cli_help){.min_workers = "with a prompt: wait for N ready workers, generate, exit",
                                             .wait_s = "how long to wait for them"});
}

static int parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    return hub_cli_i64("moex-hub", flag, s, lo, hi, out);
}

/* Returns 0 to run, 1 when help was printed, -1 on a bad flag. */
static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.n_predict = 128, .n_batch = 512, .parse_special = true};
    moex_hub_config_default(&o->hub);
    o->cli = (hub_cli){.prog = "moex-hub", .eng = hub_cli_engine_default(), .hub = &o->hub, .min_workers = 1,
                       .min_workers_lo = 1, .wait_s = 120};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        const int shared = hub_cli_parse(&o->cli, argc, argv, &i);
        if (shared < 0) return -1;
        if (shared) continue;
#define NEED_VALUE()                                                          \
    do {                                                                      \
        if (!v) {                                                             \
            fprintf(stderr, "moex-hub: %s needs a value\n", a);               \
            return -1;                                                        \
        }                                                                     \
        i++;                                                                  \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout, o);
            return 1;
        } else if (!strcmp(a, "--list-devices")) {
#if MOEX_HAVE_VULKAN
            char buf[4096];
            moex_error err = {0};
            if (moex_vk_list_devices(buf, sizeof buf, &err) < 0) {
                fprintf(stderr, "moex-hub: no Vulkan devices: %s\n", err.msg);
                return -1;
            }
            fputs(buf, stdout);
            return 1;
#else
            fprintf(stderr, "moex-hub: %s\n", NO_VULKAN);
            return -1;
#endif
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
        } else if (!strcmp(a, "--perplexity")) {
            NEED_VALUE();
            o->perplexity = v;
        } else if (!strcmp(a, "--ppl-top1")) {
            NEED_VALUE();
            o->ppl_top1 = v;
        } else if (!strcmp(a, "--ppl-chunks")) {
            NEED_VALUE();
            if (parse_i64(a, v, 1, 1 << 24, &o->ppl_chunks)) return -1;
        } else if (!strcmp(a, "--routing-trace")) {
            NEED_VALUE();
            o->routing_trace = v;
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
    if (hub_cli_finish(&o->cli)) return -1;
    if (o->prompt && o->prompt_tokens) {
        fprintf(stderr, "moex-hub: give only one of -p TEXT or --prompt-tokens A,B,C\n");
        return -1;
    }
    if (o->perplexity && (o->prompt || o->prompt_tokens)) {
        fprintf(stderr, "moex-hub: --perplexity scores a file; give it without -p or --prompt-tokens\n");
        return -1;
    }
    if (o->routing_trace && o->cli.eng.vulkan) {
        fprintf(stderr, "moex-hub: --routing-trace records on the CPU backend; drop --backend vulkan\n");
        return -1;
    }
    if (o->cli.eng.local && !o->prompt && !o->prompt_tokens && !o->perplexity) {
        fprintf(stderr, "moex-hub: --local needs a prompt: -p TEXT or --prompt-tokens A,B,C (or --perplexity FILE)\n");
        return -1;
    }
    const hub_cli_engine *e = &o->cli.eng;
    if ((e->lookup || e->draft_model) && (o->perplexity || o->dump_logits)) {
        fprintf(stderr, "moex-hub: speculative decoding (--lookup, --draft-model) generates; drop it with %s\n",
                o->perplexity ? "--perplexity" : "--dump-logits");
        return -1;
    }
    if ((e->lookup || e->draft_model) && o->n_batch <= e->draft_max) {
        fprintf(stderr, "moex-hub: --draft-max %d needs --batch of at least %d (a verify is one forward)\n",
                e->draft_max, e->draft_max + 1);
        return -1;
    }
    o->hub.max_batch = o->n_batch;
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

#if MOEX_HAVE_VULKAN
/* The GPU's share of each layer, beside the executor's (workers, or this
 * CPU with --cpu-moe): the per-layer breakdown of docs/PERF.md. */
static void print_vk_dist_stats(moex_vk_state *vs) {
    moex_vk_dist_stats st;
    moex_vk_state_dist_stats(vs, &st, false);
    if (!st.forwards) return;
    fprintf(stderr, "hub gpu (us): per middle layer segment %.0f (submit -> ids/gates/xn readable) | first segment %.0f | "
                    "head %.0f | executor %.0f per layer | %lld forwards, %.0f us each\n",
            st.segments ? st.gpu_s / (double)st.segments * 1e6 : 0.0, st.first_s / (double)st.forwards * 1e6,
            st.head_s / (double)st.forwards * 1e6,
            st.segments ? st.exec_s / (double)(st.segments + st.forwards) * 1e6 : 0.0, (long long)st.forwards,
            st.total_s / (double)st.forwards * 1e6);
}

#endif

typedef struct output_ctx {
    const moex_model *m;
    bool print_tokens;
    int64_t n_printed;
    FILE *logits;
} output_ctx;

static int on_token(void *ctx, int32_t id) {
    output_ctx *oc = ctx;
    if (interrupted) return 1;
    if (oc->print_tokens) {
        printf(oc->n_printed++ ? " %d" : "%d", id);
    } else if (oc->m->tok) {
        char buf[256];
        int n = moex_token_to_piece(oc->m->tok, id, false, buf, sizeof buf);
        if (n > (int)sizeof buf) { /* a long piece (runs of spaces, code): ask again with room */
            char *big = malloc((size_t)n);
            if (big && moex_token_to_piece(oc->m->tok, id, false, big, n) == n) fwrite(big, 1, (size_t)n, stdout);
            free(big);
        } else if (n > 0) {
            fwrite(buf, 1, (size_t)n, stdout);
        }
    }
    fflush(stdout);
    return 0;
}

static int on_logits(void *ctx, const float *logits, int64_t n_rows) {
    output_ctx *oc = ctx;
    size_t n = (size_t)n_rows * (size_t)oc->m->hp.n_vocab;
    return fwrite(logits, sizeof(float), n, oc->logits) == n ? 0 : -1;
}

static void print_spec_stats(const moex_spec_stats *s) {
    fprintf(stderr, "moex-hub: speculative: %lld verifies, %lld drafted, %lld accepted (%.1f %%), %.2f tokens a verify "
                    "| accepted per verify:", (long long)s->verifies, (long long)s->drafted, (long long)s->accepted,
            s->drafted ? 100.0 * (double)s->accepted / (double)s->drafted : 0.0,
            s->verifies ? (double)(s->accepted + s->verifies) / (double)s->verifies : 0.0);
    for (int i = 0; i <= MOEX_SPEC_MAX_DRAFT; i++)
        if (s->hist[i]) fprintf(stderr, " %d:%lld", i, (long long)s->hist[i]);
    fprintf(stderr, " | one-token steps %lld, probes %lld\n", (long long)s->plain, (long long)s->probes);
}

/* --perplexity FILE: scores the file on the engine (engine/perplexity.c), then writes the routing trace. */
static int run_perplexity(const options *o, const moex_model *m, const moex_engine *eng, int64_t n_ctx,
                          const moex_route_recorder *routes) {
    moex_error err = {0};
    moex_ppl_file_params fp = {.path = o->perplexity, .n_ctx = n_ctx, .n_chunks = o->ppl_chunks,
                               .top1_path = o->ppl_top1};
    if (moex_perplexity_file(m, eng, &fp, stdout, &err) ||
        (routes && moex_route_recorder_write(routes, o->routing_trace, &err))) {
        fprintf(stderr, "\nmoex-hub: perplexity: %s\n", err.msg);
        return 1;
    }
    return interrupted ? 130 : 0;
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
    moex_hub *hub = NULL;
    moex_engine eng = {0};
    moex_sampler *smp = NULL;
    hub_cli_drafts drafts = {0};
    moex_drafter *drafter = NULL;
    output_ctx oc = {.m = m, .print_tokens = o->print_tokens};
    if (!(pool = moex_pool_create(o->cli.eng.threads))) {
        fprintf(stderr, "moex-hub: cannot start %d threads\n", o->cli.eng.threads);
        goto done;
    }
    if (!o->cli.eng.local && !(hub = moex_hub_start(m, pool, &o->hub, &err))) {
        fprintf(stderr, "moex-hub: %s\n", err.msg);
        goto done;
    }
    if (hub && !o->prompt && !o->prompt_tokens && !o->perplexity) {
        moex_log(MOEX_LOG_INFO, "serving workers on port %d; Ctrl-C stops", moex_hub_port(hub));
        while (!interrupted) {
            struct timespec ts = {0, 200 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        rc = 0;
        goto done;
    }
    int64_t n_prompt = o->perplexity ? 0 : tokenize_prompt(m, o, &prompt);
    if (n_prompt < 0) goto done;
    if (n_prompt == 0 && !o->perplexity) {
        fprintf(stderr, "moex-hub: the prompt has no tokens\n");
        goto done;
    }
    const int64_t want_ctx = o->n_ctx ? o->n_ctx : o->perplexity ? 512 : n_prompt + o->n_predict;
    const int64_t n_ctx = hub_cli_cap_ctx("moex-hub", want_ctx, o->n_ctx > 0, m->hp.n_ctx_train);
    if (!(smp = moex_sampler_create(&o->cli.eng.sp, m->hp.n_vocab))) {
        fprintf(stderr, "moex-hub: out of memory\n");
        goto done;
    }
    if (hub) {
        moex_log(MOEX_LOG_INFO, "waiting for %lld workers", (long long)o->cli.min_workers);
        if (moex_hub_wait_ready(hub, (int)o->cli.min_workers, o->cli.wait_s, &interrupted, &err)) {
            fprintf(stderr, "moex-hub: %s\n", err.msg);
            goto done;
        }
    }
    const bool speculate = o->cli.eng.lookup || o->cli.eng.draft_model;
    if (speculate && hub_cli_drafts_open(&drafts, &o->cli.eng, "moex-hub", m, pool, n_ctx, 1)) goto done;
    if (speculate && !(drafter = hub_cli_drafter(&drafts, 0, &o->cli.eng.sp))) {
        fprintf(stderr, "moex-hub: out of memory for speculative decoding\n");
        goto done;
    }
    const moex_spec_params spec = {.drafter = drafter, .draft_max = o->cli.eng.draft_max,
                                   .draft_min = o->cli.eng.draft_min};
    moex_engine_options eo = hub_cli_engine_options(&o->cli.eng, pool, hub, n_ctx, o->n_batch);
    eo.record_routes = o->routing_trace != NULL;
    eo.batched = eo.batched || speculate;   /* a verify is a batch of one slot, every row on the one-token kernels */
    eo.warm_verify = speculate ? o->cli.eng.draft_max : 0;
    if (moex_engine_open(m, &eo, &eng, &err)) {
        fprintf(stderr, "moex-hub: %s%s\n", o->cli.eng.vulkan ? "Vulkan: " : "", err.msg);
        goto done;
    }
    moex_route_recorder *routes = moex_engine_routes(&eng);
    if (o->perplexity) {
        rc = run_perplexity(o, m, &eng, n_ctx, routes);
        goto done;
    }
    if (o->dump_logits && !(oc.logits = fopen(o->dump_logits, "wb"))) {
        fprintf(stderr, "moex-hub: cannot write %s: %s\n", o->dump_logits, strerror(errno));
        goto done;
    }
    if (o->cli.eng.sp.temp > 0) moex_log(MOEX_LOG_INFO, "sampling seed %llu", (unsigned long long)o->cli.eng.sp.seed);
    moex_gen_params gp = {.n_predict = o->n_predict, .ignore_eos = o->ignore_eos, .on_token = on_token,
                          .on_logits = o->dump_logits ? on_logits : NULL, .cb_ctx = &oc,
                          .spec = speculate ? &spec : NULL};
    moex_gen_stats st;
    if (moex_generate(m, &eng, smp, prompt, n_prompt, &gp, &st, &err)) {
        fprintf(stderr, "\nmoex-hub: generation failed: %s\n", err.msg);
        goto done;
    }
    printf("\n");
    fflush(stdout);
    if (routes && moex_route_recorder_write(routes, o->routing_trace, &err)) {
        fprintf(stderr, "moex-hub: %s\n", err.msg);
        goto done;
    }
    char read_back[64] = "";
#if MOEX_HAVE_VULKAN
    if (moex_engine_vk_state(&eng))
        snprintf(read_back, sizeof read_back, " | logits rows read back %lld",
                 (long long)moex_vk_state_logits_rows_read(moex_engine_vk_state(&eng)));
#endif
    fprintf(stderr, "moex-hub: load %.2f s | prompt %lld tokens %.1f tok/s | decode %lld tokens %.1f tok/s | threads %d | "
                    "%s%s%s\n", load_s, (long long)st.n_prompt, st.prompt_s > 0 ? st.n_prompt / st.prompt_s : 0.0,
            (long long)st.n_generated, st.decode_s > 0 && st.n_generated > 1 ? (double)(st.n_generated - 1) / st.decode_s
                                                                              : 0.0, moex_pool_size(pool),
            o->cli.eng.vulkan ? moex_engine_backend_name(&eng) : moex_kernels_simd_name(), hub ? " | distributed" : "",
            read_back);
    if (speculate) print_spec_stats(&st.spec);
    rc = interrupted ? 130 : 0;
done:
    if (oc.logits && fclose(oc.logits) && rc == 0) {
        fprintf(stderr, "moex-hub: writing %s failed\n", o->dump_logits);
        rc = 1;
    }
    if (hub) moex_hub_metrics_print(hub, stderr);
#if MOEX_HAVE_VULKAN
    if ((hub || o->cli.eng.cpu_moe) && moex_engine_vk_state(&eng)) print_vk_dist_stats(moex_engine_vk_state(&eng));
#endif
    moex_hub_stop(hub);
    moex_sampler_free(smp);
    moex_engine_close(&eng);
    moex_drafter_free(drafter);
    hub_cli_drafts_close(&drafts);
    moex_pool_destroy(pool);
    free(prompt);
    moex_model_free(m);
    return rc;
}

int moex_hub_main(int argc, char **argv) {
    options o;
    int r = parse_args(argc, argv, &o);
    if (r) return r > 0 ? 0 : 2;
    hub_cli_install_signals(on_signal);
    return run(&o);
}
