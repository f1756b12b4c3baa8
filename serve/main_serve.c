/* moex-hub serve: one long-running process on one port that serves the
 * OpenAI-compatible API (serve/api.h), a status page and /metrics, and (unless
 * --local) accepts workers as the one-shot hub does. Its pieces:
 *
 *   network thread (hub server)  workers on /ws, the API and the page over HTTP
 *   scheduler thread             continuous batching: one forward per step over every active request
 *   the engine                   CPU or Vulkan state with --parallel KV slots, experts here (--local)
 *                                or on the workers through the hub's executor
 *   this thread                  starts them, waits for Ctrl-C, stops them in order */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve/api.h"
#include "hub/cli.h"
#include "hub/hub.h"
#include "proto/proto.h"

typedef struct serve_options {
    const char *model, *api_key, *chat_template, *chat_template_file, *alias;
    int parallel, max_queue, spec_slots;
    bool no_prompt_cache;
    int64_t n_ctx, n_batch, prompt_chunk, max_body;
    double client_timeout_s;
    moex_hub_config hub;
    hub_cli cli;                 /* the flags shared with the one-shot hub (hub/cli.h): cli.eng, the engine's */
} serve_options;

static volatile sig_atomic_t interrupted;
static void on_signal(int sig) { interrupted = sig; }

static void usage(FILE *f, const serve_options *o) {
    fprintf(f,
            "usage: moex-hub serve -m MODEL.gguf [--local | worker options] [--backend vulkan] --port P [--api-key K]\n"
            "One process serving the OpenAI-compatible API (POST /v1/chat/completions, /v1/completions,\n"
            "GET /v1/models, /health, /metrics) and a status page at /, workers on /ws of the same port.\n"
            "  -m, --model FILE        GGUF model\n"
            "  --api-key K             clients must send Authorization: Bearer K (default: none needed)\n"
            "  --alias NAME            the model's name in the API (default: the file name without .gguf)\n"
            "  --chat-template-file F  a Jinja chat template to run instead of the model's (tokenizer.chat_template;\n"
            "                          a model without one gets ChatML with Hermes-style tool calls)\n"
            "  --chat-template NAME    a built-in rendering instead (no tools): chatml, llama3, llama2, llama2-sys,\n"
            "                          llama2-sys-bos, llama2-sys-strip, mistral-v1, mistral-v3,\n"
            "                          mistral-v3-tekken, mistral-v7\n"
            "  --parallel N            requests decoding together, each in its own KV slot (default 4)\n"
            "  --ctx N                 positions per slot: prompt + completion (default min(4096, the model's))\n"
            "  --batch N               tokens per forward pass at most (default 512)\n"
            "  --prompt-chunk N        prompt tokens per forward while others decode (default 512;\n"
            "                          lower: running streams keep their pace, new ones wait longer)\n"
            "  --max-queue N           requests waiting for a slot at most; more get 503 (default 64)\n"
            "  --max-body BYTES        request bodies at most; more get 413 (default 1048576)\n"
            "  --client-timeout S      drop a client that reads nothing this long (default 30)\n"
            "  --no-prompt-cache       evaluate every prompt whole (default: a request goes to the free slot whose\n"
            "                          last prompt shares the longest prefix with its own, and evaluates the rest)\n"
            "  --spec-slots N          with --lookup or --draft-model: speculate while at most N requests decode\n"
            "                          (default 4; a larger step amortises the round trips speculation saves)\n"
            "the engine; the sampling flags are the defaults of requests that leave them out, and a request\n"
            "without a seed gets --seed S + its number\n");
    hub_cli_engine_usage(f, &o->cli);
    fprintf(f,
            "network and workers (without --local: workers on /ws; --token is separate from --api-key)\n");
    hub_cli_usage(f, &o->cli, &(hub_cli_help){.min_workers = "wait for N ready workers before serving requests",
                                             .wait_s = "how long to wait for them"});
}

static int parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    return hub_cli_i64("moex-hub serve", flag, s, lo, hi, out);
}

static int parse_f64(const char *flag, const char *s, double lo, double hi, double *out) {
    return hub_cli_f64("moex-hub serve", flag, s, lo, hi, out);
}

/* Flags that take a value: one place for each, in the order of --help. */
static int parse_value(serve_options *o, const char *a, const char *v) {
    int64_t n;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = v;
    else if (!strcmp(a, "--api-key")) o->api_key = v;
    else if (!strcmp(a, "--alias")) o->alias = v;
    else if (!strcmp(a, "--chat-template")) o->chat_template = v;
    else if (!strcmp(a, "--chat-template-file")) o->chat_template_file = v;
    else if (!strcmp(a, "--parallel")) {
        if (parse_i64(a, v, 1, 256, &n)) return -1;
        o->parallel = (int)n;
    } else if (!strcmp(a, "--ctx")) {
        if (parse_i64(a, v, 2, 1 << 24, &o->n_ctx)) return -1;
    } else if (!strcmp(a, "--batch")) {
        if (parse_i64(a, v, 1, 1 << 16, &o->n_batch)) return -1;
    } else if (!strcmp(a, "--prompt-chunk")) {
        if (parse_i64(a, v, 1, 1 << 16, &o->prompt_chunk)) return -1;
    } else if (!strcmp(a, "--max-queue")) {
        if (parse_i64(a, v, 0, 1 << 20, &n)) return -1;
        o->max_queue = (int)n;
    } else if (!strcmp(a, "--max-body")) {
        if (parse_i64(a, v, 1024, (int64_t)1 << 30, &o->max_body)) return -1;
    } else if (!strcmp(a, "--spec-slots")) {
        if (parse_i64(a, v, 1, 256, &n)) return -1;
        o->spec_slots = (int)n;
    } else if (!strcmp(a, "--client-timeout")) {
        if (parse_f64(a, v, 0.1, 86400, &o->client_timeout_s)) return -1;
    } else {
        return 1; /* not a flag with a value */
    }
    return 0;
}

/* 0 to run, 1 when help was printed, -1 on a bad flag. */
static int parse_args(int argc, char **argv, serve_options *o) {
    *o = (serve_options){.parallel = 4, .max_queue = 64, .spec_slots = 4, .n_batch = 512, .prompt_chunk = 512,
                         .max_body = 1 << 20, .client_timeout_s = 30};
    moex_hub_config_default(&o->hub);
    o->hub.port = 8080;
    o->cli = (hub_cli){.prog = "moex-hub serve", .eng = hub_cli_engine_default(), .hub = &o->hub, .min_workers = 0,
                       .min_workers_lo = 0, .wait_s = 600};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout, o);
            return 1;
        }
        if (!strcmp(a, "--no-prompt-cache")) {
            o->no_prompt_cache = true;
            continue;
        }
        const int shared = hub_cli_parse(&o->cli, argc, argv, &i);
        if (shared < 0) return -1;
        if (shared) continue;
        if (i + 1 == argc) {
            fprintf(stderr, "moex-hub serve: '%s' is not an option or needs a value (see moex-hub serve --help)\n", a);
            return -1;
        }
        const int rc = parse_value(o, a, argv[i + 1]);
        if (rc > 0) fprintf(stderr, "moex-hub serve: unknown option '%s' (see moex-hub serve --help)\n", a);
        if (rc) return -1;
        i++;
    }
    if (!o->model) {
        fprintf(stderr, "moex-hub serve: no model given: use -m MODEL.gguf\n");
        return -1;
    }
    if (hub_cli_finish(&o->cli)) return -1;
    if (o->cli.eng.draft_min) {
        fprintf(stderr, "moex-hub serve: --draft-min is the CLI's: serve drafts for every decoding request while at "
                        "most --spec-slots decode\n");
        return -1;
    }
    if (o->n_batch < o->parallel) {
        fprintf(stderr, "moex-hub serve: --batch %lld is below --parallel %d (each step feeds one token per slot)\n",
                (long long)o->n_batch, o->parallel);
        return -1;
    }
    if (o->api_key && strlen(o->api_key) > HUB_TOKEN_MAX) {
        fprintf(stderr, "moex-hub serve: the API key is %zu bytes; at most %d\n", strlen(o->api_key), HUB_TOKEN_MAX);
        return -1;
    }
    o->hub.max_batch = o->n_batch;
    o->hub.no_workers = o->cli.eng.local;
    return 0;
}

/* The API's name for the model: --alias, else the file name without .gguf. */
static void model_id_of(const serve_options *o, char *out, size_t cap) {
    if (o->alias) {
        snprintf(out, cap, "%s", o->alias);
        return;
    }
    const char *base = strrchr(o->model, '/');
    base = base ? base + 1 : o->model;
    size_t n = strlen(base);
    if (n > 5 && !strcmp(base + n - 5, ".gguf")) n -= 5;
    snprintf(out, cap, "%.*s", (int)n, base);
}

/* Everything serve starts, in the order it starts them. */
typedef struct serving {
    moex_model *m;
    moex_pool *pool;
    serve_status_src status;
    serve_sched_stats stats;
    serve_api *api;
    serve_chat_setup chat;   /* the chat template the API renders with */
    moex_hub *hub;
    moex_engine eng;     /* --parallel KV slots, experts here (--local) or on the workers */
    hub_cli_drafts drafts;   /* --lookup, --draft-model: a drafter a slot */
    serve_sched *sched;
    char model_id[256], backend[64];
} serving;

/* The scheduler's drafter for a slot (serve_sched_config.make_drafter). */
static moex_drafter *make_drafter(void *ctx, int slot, const moex_sampler_params *sp) {
    return hub_cli_drafter(ctx, slot, sp);
}

static int start_engine(const serve_options *o, serving *sv, int64_t n_ctx, moex_error *err) {
    moex_engine_options eo = hub_cli_engine_options(&o->cli.eng, sv->pool, o->cli.eng.local ? NULL : sv->hub, n_ctx,
                                                    o->n_batch);
    eo.n_seq = o->parallel;
    eo.batched = true;   /* the scheduler decodes every slot in one forward */
    if (moex_engine_open(sv->m, &eo, &sv->eng, err)) return -1;
    snprintf(sv->backend, sizeof sv->backend, "%s", moex_engine_backend_name(&sv->eng));
    return 0;
}

static int start(const serve_options *o, serving *sv) {
    moex_error err = {0};
    if (!(sv->m = moex_model_load(o->model, &err))) {
        fprintf(stderr, "moex-hub serve: cannot load %s: %s\n", o->model, err.msg);
        return -1;
    }
    char desc[512];
    moex_model_describe(sv->m, desc, sizeof desc);
    moex_log(MOEX_LOG_INFO, "%s", desc);
    serve_openai_ctx oc = {.model_id = sv->model_id, .defaults = o->cli.eng.sp, .seed = o->cli.eng.sp.seed,
                           .n_vocab = sv->m->hp.n_vocab};
    if (serve_chat_setup_open(&sv->chat, sv->m, o->chat_template, o->chat_template_file, &oc, &err)) {
        fprintf(stderr, "moex-hub serve: %s\n", err.msg);
        return -1;
    }
    if (!(sv->pool = moex_pool_create(o->cli.eng.threads))) {
        fprintf(stderr, "moex-hub serve: cannot start %d threads\n", o->cli.eng.threads);
        return -1;
    }
    const int64_t n_ctx = hub_cli_cap_ctx("moex-hub serve", o->n_ctx ? o->n_ctx : 4096, o->n_ctx > 0,
                                          sv->m->hp.n_ctx_train);
    model_id_of(o, sv->model_id, sizeof sv->model_id);
    sv->status = (serve_status_src){.m = sv->m, .model_id = sv->model_id, .backend = sv->backend,
                                  .chat_template = sv->chat.name, .distributed = !o->cli.eng.local,
                                  .sched = &sv->stats, .t_start = moex_time_s()};
    serve_api_config ac = {.api_key = o->api_key, .max_body = (size_t)o->max_body,
                         .client_timeout_s = o->client_timeout_s,
                         .openai = oc};
    if (!(sv->api = serve_api_create(&ac, &sv->status, &err))) {
        fprintf(stderr, "moex-hub serve: %s\n", err.msg);
        return -1;
    }
    moex_hub_config hc = o->hub;
    hc.http_handler = serve_api_handler(sv->api);
    if (!(sv->hub = moex_hub_start(sv->m, sv->pool, &hc, &err))) {
        fprintf(stderr, "moex-hub serve: %s\n", err.msg);
        return -1;
    }
    sv->status.hub = sv->hub;
    if (!o->cli.eng.local && o->cli.min_workers > 0) {
        moex_log(MOEX_LOG_INFO, "waiting for %lld workers", (long long)o->cli.min_workers);
        serve_api_set_phase(sv->api, "waiting for --min-workers workers to be ready");
        if (moex_hub_wait_ready(sv->hub, (int)o->cli.min_workers, o->cli.wait_s, &interrupted, &err)) {
            fprintf(stderr, "moex-hub serve: %s\n", err.msg);
            return -1;
        }
    }
    /* /health says 200 only once a request runs at full speed: the weights this
     * process computes with are read in first (the experts too with --local) */
    serve_api_set_phase(sv->api, "reading the weights");
    moex_model_page_in(sv->m, o->cli.eng.local);
    if (start_engine(o, sv, n_ctx, &err)) {
        fprintf(stderr, "moex-hub serve: %s\n", err.msg);
        return -1;
    }
    const int parallel = o->parallel;   /* both engines decode --parallel sequences in one forward */
    const bool speculate = o->cli.eng.lookup || o->cli.eng.draft_model;
    if (speculate && hub_cli_drafts_open(&sv->drafts, &o->cli.eng, "moex-hub serve", sv->m, sv->pool, sv->eng.n_ctx,
                                         parallel))
        return -1;
    sv->status.sched_cfg = (serve_sched_config){.n_slots = parallel, .n_ctx = sv->eng.n_ctx, .n_batch = sv->eng.n_batch,
                                              .prompt_chunk = o->prompt_chunk, .max_queue = o->max_queue,
                                              .pool = sv->pool, .make_drafter = speculate ? make_drafter : NULL,
                                              .drafter_ctx = &sv->drafts, .drafts_sample = o->cli.eng.draft_model,
                                              .draft_max = o->cli.eng.draft_max, .spec_max_slots = o->spec_slots,
                                              .no_prompt_cache = o->no_prompt_cache};
    if (!(sv->sched = serve_sched_start(sv->m, &sv->eng, &sv->status.sched_cfg, &sv->stats, &err))) {
        fprintf(stderr, "moex-hub serve: %s\n", err.msg);
        return -1;
    }
    serve_api_set_scheduler(sv->api, sv->sched);
    moex_log(MOEX_LOG_INFO, "serving '%s' on %s://%s:%d/ (OpenAI API under /v1, %d slots of %lld positions, %s, "
             "chat template %s%s)", sv->model_id, moex_hub_http_scheme(sv->hub), o->hub.host, moex_hub_port(sv->hub), parallel,
             (long long)sv->eng.n_ctx, sv->backend, sv->chat.name, o->api_key ? ", API key required" : "");
    return 0;
}

/* Requests fail (503) first, then the network stops, then the engine goes. */
static void stop(serving *sv) {
    serve_sched_stop(sv->sched);
    if (sv->hub && sv->status.distributed) moex_hub_metrics_print(sv->hub, stderr);
    moex_hub_stop(sv->hub);
    serve_sched_free(sv->sched);
    serve_api_free(sv->api);
    serve_chat_setup_close(&sv->chat);
    moex_engine_close(&sv->eng);
    hub_cli_drafts_close(&sv->drafts);
    moex_pool_destroy(sv->pool);
    moex_model_free(sv->m);
}

/* argv[0] is "serve". */
static int serve_main(int argc, char **argv) {
    serve_options o;
    const int r = parse_args(argc, argv, &o);
    if (r) return r > 0 ? 0 : 2;
    hub_cli_install_signals(on_signal);
    serving sv = {0};
    int rc = 1;
    if (start(&o, &sv) == 0) {
        while (!interrupted) {
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        moex_log(MOEX_LOG_INFO, "stopping (signal %d)", (int)interrupted);
        rc = 0;
    }
    stop(&sv);
    return rc;
}

/* The program moex-hub: `moex-hub serve ...` here, anything else the one-shot
 * hub and the --local CLI (hub/main.c). */
int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "serve")) return serve_main(argc - 1, argv + 1);
    return moex_hub_main(argc, argv);
}
