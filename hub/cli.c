/* The flags moex-hub and moex-hub serve share (cli.h): one table of names,
 * one parser per flag, one help text. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "hub/cli.h"
#include "proto/proto.h"

hub_cli_engine hub_cli_engine_default(void) {
    return (hub_cli_engine){.vk = {.device = -1}, .wire_dtype = MOEX_WIRE_DEFAULT,
                            .sp = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                                   .seed = (uint64_t)time(NULL)},
                            .draft_max = 8};
}

moex_engine_options hub_cli_engine_options(const hub_cli_engine *e, moex_pool *pool, moex_hub *hub, int64_t n_ctx,
                                           int64_t n_batch) {
    return (moex_engine_options){.backend = e->vulkan ? MOEX_ENGINE_VULKAN : MOEX_ENGINE_CPU,
                                 .vk = e->vk, .n_ctx = n_ctx, .n_batch = n_batch, .pool = pool,
                                 .wire_dtype = e->wire_dtype, .cpu_moe = e->cpu_moe, .warm_up = true,
                                 .experts = hub ? moex_hub_executor(hub) : (moex_expert_executor){0}};
}

int hub_cli_i64(const char *prog, const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s expects an integer in [%lld, %lld], got '%s'\n", prog, flag, (long long)lo,
                (long long)hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int hub_cli_f64(const char *prog, const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "%s: %s expects a number in [%g, %g], got '%s'\n", prog, flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int nonempty(const hub_cli *c, const char *flag, const char *v) {
    if (*v) return 0;
    fprintf(stderr, "%s: %s expects a path, got an empty string\n", c->prog, flag);
    return -1;
}

static int parse_backend(hub_cli *c, const char *a, const char *v) {
    if (strcmp(v, "cpu") && strcmp(v, "vulkan")) {
        fprintf(stderr, "%s: %s expects cpu or vulkan, got '%s'\n", c->prog, a, v);
        return -1;
    }
    c->eng.vulkan = !strcmp(v, "vulkan");
#if !MOEX_HAVE_VULKAN
    if (c->eng.vulkan) {
        fprintf(stderr, "%s: --backend vulkan: this moex-hub was built without Vulkan (-DMOEX_VULKAN=OFF); rebuild "
                        "with -DMOEX_VULKAN=ON\n", c->prog);
        return -1;
    }
#endif
    return 0;
}

static int parse_vk_tune(hub_cli *c, const char *a, const char *v) {
#if MOEX_HAVE_VULKAN
    moex_error err = {0};
    (void)a;
    if (moex_vk_options_tune(&c->eng.vk, v, &err) == 0) return 0;
    fprintf(stderr, "%s: %s\n", c->prog, err.msg);
#else
    fprintf(stderr, "%s: %s: this moex-hub was built without Vulkan (-DMOEX_VULKAN=OFF)\n", c->prog, a);
    (void)v;
#endif
    return -1;
}

static int parse_simd(hub_cli *c, const char *v) {
    moex_error err = {0};
    if (moex_kernels_use_simd(v, &err) == 0) return 0;
    fprintf(stderr, "%s: %s\n", c->prog, err.msg);
    return -1;
}

static int parse_wire_dtype(hub_cli *c, const char *a, const char *v) {
    static const struct {
        const char *name;
        int dtype;
    } t[] = {{"exact", MOEX_WIRE_EXACT}, {"f16", MOEX_DT_F16}, {"bf16", MOEX_DT_BF16},
             {"int8", MOEX_DT_INT8},     {"f32", MOEX_DT_F32}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(v, t[i].name)) return c->eng.wire_dtype = t[i].dtype, 0;
    fprintf(stderr, "%s: %s expects f16, bf16, int8, f32 or exact, got '%s'\n", c->prog, a, v);
    return -1;
}

/* One engine flag with a value; 1 when it is not one of them. */
static int parse_engine_value(hub_cli *c, const char *a, const char *v) {
    hub_cli_engine *e = &c->eng;
    int64_t n;
    double d;
    if (!strcmp(a, "--backend")) return parse_backend(c, a, v);
    if (!strcmp(a, "--wire-dtype")) return parse_wire_dtype(c, a, v);
    if (!strcmp(a, "--vk-tune")) return parse_vk_tune(c, a, v);
    if (!strcmp(a, "--simd")) return parse_simd(c, v);
    if (!strcmp(a, "--device")) {
        if (hub_cli_i64(c->prog, a, v, 0, 64, &n)) return -1;
        e->vk.device = (int)n;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        if (hub_cli_i64(c->prog, a, v, 1, 1024, &n)) return -1;
        e->threads = (int)n;
    } else if (!strcmp(a, "--temp")) {
        if (hub_cli_f64(c->prog, a, v, 0, 100, &d)) return -1;
        e->sp.temp = (float)d;
    } else if (!strcmp(a, "--top-k")) {
        if (hub_cli_i64(c->prog, a, v, 0, 1 << 24, &n)) return -1;
        e->sp.top_k = (int)n;
    } else if (!strcmp(a, "--top-p")) {
        if (hub_cli_f64(c->prog, a, v, 0, 1, &d)) return -1;
        e->sp.top_p = (float)d;
    } else if (!strcmp(a, "--min-p")) {
        if (hub_cli_f64(c->prog, a, v, 0, 1, &d)) return -1;
        e->sp.min_p = (float)d;
    } else if (!strcmp(a, "--seed")) {
        if (hub_cli_i64(c->prog, a, v, 0, INT64_MAX, &n)) return -1;
        e->sp.seed = (uint64_t)n;
    } else if (!strcmp(a, "--draft-model")) {
        if (nonempty(c, a, v)) return -1;
        e->draft_model = v;
    } else if (!strcmp(a, "--draft-max")) {
        if (hub_cli_i64(c->prog, a, v, 1, MOEX_SPEC_MAX_DRAFT, &n)) return -1;
        e->draft_max = (int)n;
    } else if (!strcmp(a, "--draft-min")) {
        if (hub_cli_i64(c->prog, a, v, 0, MOEX_SPEC_MAX_DRAFT, &n)) return -1;
        e->draft_min = (int)n;
    } else {
        return 1;
    }
    return 0;
}

/* One flag with a value; 1 when it is not one of the shared flags. */
static int parse_value(hub_cli *c, const char *a, const char *v) {
    moex_hub_config *h = c->hub;
    int64_t n;
    double d;
    if (!strcmp(a, "--host")) h->host = v;
    else if (!strcmp(a, "--token")) h->token = v;
    else if (!strcmp(a, "--port")) {
        if (hub_cli_i64(c->prog, a, v, 0, 65535, &n)) return -1;
        h->port = (int)n;
    } else if (!strcmp(a, "--tcp-port")) {
        if (hub_cli_i64(c->prog, a, v, 1, 65535, &n)) return -1;
        h->tcp_port = (int)n;
    } else if (!strcmp(a, "--replicas")) {
        if (hub_cli_i64(c->prog, a, v, 1, 16, &n)) return -1;
        h->replicas = (int)n;
    } else if (!strcmp(a, "--hedge")) {
        if (!strcmp(v, "auto")) h->hedge = 0;
        else if (hub_cli_i64(c->prog, a, v, 1, 8, &n)) return -1;
        else h->hedge = (int)n;
    } else if (!strcmp(a, "--timeout-ms")) {
        if (hub_cli_i64(c->prog, a, v, 1, 600000, &n)) return -1;
        h->timeout_ms = (int)n;
    } else if (!strcmp(a, "--split-bytes")) {
        if (hub_cli_i64(c->prog, a, v, 1, 1 << 30, &n)) return -1;
        h->split_bytes = (int)n;
    } else if (!strcmp(a, "--verify")) {
        if (hub_cli_f64(c->prog, a, v, 0, 1, &d)) return -1;
        h->verify_p = d;
    } else if (!strcmp(a, "--min-workers")) {
        if (hub_cli_i64(c->prog, a, v, c->min_workers_lo, 256, &c->min_workers)) return -1;
    } else if (!strcmp(a, "--wait-s")) {
        if (hub_cli_f64(c->prog, a, v, 0, 86400, &c->wait_s)) return -1;
    } else if (!strcmp(a, "--web-dir")) {
        if (nonempty(c, a, v)) return -1;
        h->web_dir = v;
        c->web_dir_given = true;
    } else if (!strcmp(a, "--tls-cert")) {
        if (nonempty(c, a, v)) return -1;
        h->tls_cert = v;
        h->tls = true;
    } else if (!strcmp(a, "--tls-key")) {
        if (nonempty(c, a, v)) return -1;
        h->tls_key = v;
        h->tls = true;
    } else if (!strcmp(a, "--tls-dir")) {
        if (nonempty(c, a, v)) return -1;
        h->tls_dir = v;
    } else {
        return parse_engine_value(c, a, v);
    }
    return 0;
}

static const char *const value_flags[] = {
    "--host", "--token", "--port", "--tcp-port", "--replicas", "--hedge", "--timeout-ms", "--split-bytes", "--verify",
    "--min-workers", "--wait-s", "--web-dir", "--tls-cert", "--tls-key", "--tls-dir",
    "--backend", "--device", "--vk-tune", "--simd", "-t", "--threads", "--wire-dtype", "--temp", "--top-k", "--top-p",
    "--min-p", "--seed", "--draft-model", "--draft-max", "--draft-min",
};

static bool takes_value(const char *a) {
    for (size_t i = 0; i < sizeof value_flags / sizeof *value_flags; i++)
        if (!strcmp(a, value_flags[i])) return true;
    return false;
}

int hub_cli_parse(hub_cli *c, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (!strcmp(a, "--no-local-fallback")) {
        c->hub->local_fallback = false;
        return 1;
    }
    if (!strcmp(a, "--tls")) {
        c->hub->tls = true;
        return 1;
    }
    if (!strcmp(a, "--local")) {
        c->eng.local = true;
        return 1;
    }
    if (!strcmp(a, "--cpu-moe")) {
        c->eng.cpu_moe = true;
        return 1;
    }
    if (!strcmp(a, "--lookup")) {
        c->eng.lookup = true;
        return 1;
    }
    if (!takes_value(a)) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "%s: %s needs a value\n", c->prog, a);
        return -1;
    }
    if (parse_value(c, a, argv[*i + 1])) return -1;
    (*i)++;
    return 1;
}

static bool has_index(const char *dir) {
    char path[PATH_MAX];
    struct stat st;
    return snprintf(path, sizeof path, "%s/index.html", dir) < (int)sizeof path && stat(path, &st) == 0 &&
           S_ISREG(st.st_mode);
}

/* <directory of this executable>/../web into out (the build tree's layout:
 * build/bin/moex-hub beside build/web); false when it cannot be named. */
static bool default_web_dir(char *out, size_t cap) {
    char exe[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return false;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return false;
    *slash = 0;
    return snprintf(out, cap, "%s/../web", exe) < (int)cap;
}

int hub_cli_finish(hub_cli *c) {
    moex_hub_config *h = c->hub;
    if (!c->eng.local && c->eng.wire_dtype == MOEX_WIRE_EXACT) {
        fprintf(stderr, "%s: --wire-dtype exact exists only with --local; workers need a wire dtype\n", c->prog);
        return -1;
    }
    h->wire_dtype = c->eng.wire_dtype;
    if (c->eng.cpu_moe && (!c->eng.local || !c->eng.vulkan)) {
        fprintf(stderr, "%s: --cpu-moe keeps the experts in this machine's RAM beside a GPU: use it with --local "
                        "--backend vulkan (--backend cpu computes everything on the CPU already; without --local the "
                        "workers compute the experts)\n", c->prog);
        return -1;
    }
    if ((h->tls_cert != NULL) != (h->tls_key != NULL)) {
        fprintf(stderr, "%s: give --tls-cert FILE and --tls-key FILE together (or --tls alone for a self-signed "
                        "certificate)\n", c->prog);
        return -1;
    }
    if (h->tls_dir && h->tls_cert) {
        fprintf(stderr, "%s: --tls-dir is where --tls keeps the certificate it makes; leave it out with --tls-cert\n",
                c->prog);
        return -1;
    }
    if (h->tls_dir) h->tls = true;
    if (h->tcp_port && h->tls) {
        fprintf(stderr, "%s: --tcp-port carries the workers' frames in the clear; with TLS, workers join over wss:// "
                        "only (leave out --tcp-port)\n", c->prog);
        return -1;
    }
    if (h->tcp_port && h->tcp_port == h->port) {
        fprintf(stderr, "%s: --tcp-port %d is also --port: give the TCP transport a port of its own\n", c->prog,
                h->tcp_port);
        return -1;
    }
    if (c->web_dir_given) {
        if (!has_index(h->web_dir)) {
            fprintf(stderr, "%s: --web-dir %s has no index.html: give the build's web directory (<build>/web, made by "
                            "cmake --build when emscripten is installed: web/setup_web.sh)\n", c->prog, h->web_dir);
            return -1;
        }
    } else {
        h->web_dir = NULL;
        if (default_web_dir(c->found_web_dir, sizeof c->found_web_dir) && has_index(c->found_web_dir))
            h->web_dir = c->found_web_dir;
    }
    if (!c->eng.local && (!h->token || !*h->token)) {
        fprintf(stderr, "%s: a hub that takes workers needs --token T (workers present it, and it guards the expert "
                        "weights they may download); or run the whole model here with --local\n", c->prog);
        return -1;
    }
    return 0;
}

void hub_cli_engine_usage(FILE *f, const hub_cli *c) {
    const moex_sampler_params *sp = &c->eng.sp;
    fprintf(f,
            "  --local                 run the whole model in this process (no workers)\n"
            "  --backend cpu|vulkan    where the hub's part runs (default cpu); --device N picks the GPU (default: best).\n"
            "                          vulkan with --local: the whole model on the GPU; without --local: embeddings,\n"
            "                          attention, norms, router and head on the GPU, the experts on the workers\n"
            "  --cpu-moe               with --local --backend vulkan: the experts stay in RAM and this process's\n"
            "                          CPU threads compute them while the GPU runs the rest (a model whose experts\n"
            "                          do not fit the GPU; as llama.cpp's --cpu-moe)\n"
            "  --vk-tune K=V,...       Vulkan kernel choices for a new GPU (keys: docs/ARCHITECTURE.md \"Settings\")\n"
            "  -t, --threads N         CPU threads (default: all cores)\n"
            "  --simd P                the CPU kernels on portable, avx2 or avx512vnni (default: the CPU's best)\n"
            "  --wire-dtype T          expert inputs/outputs as f16 (default), bf16, int8, f32, or exact (--local only);\n"
            "                          --local rounds at the expert boundary the same way, so both give the same tokens\n"
            "  --temp T                temperature, 0 = greedy (default %g)\n"
            "  --top-k K               (default %d, 0 = off)   --top-p P  (default %g, 1 = off)\n"
            "  --min-p P               (default %g, 0 = off)\n"
            "  --seed S                sampling seed (default: from the clock, printed)\n"
            "speculative decoding (greedy: the same tokens; sampling: the same distribution; docs/ARCHITECTURE.md):\n"
            "  --lookup                draft the tokens that followed the last 1-3 tokens' latest earlier occurrence\n"
            "  --draft-model FILE      draft with a small GGUF of the same vocabulary (after --lookup's, with both)\n"
            "  --draft-max N           tokens drafted a step at most, 1-%d (default %d; adapts below it)\n"
            "  --draft-min N           draft N at least every step (default 0: only where a token costs less so,\n"
            "                          measured as it runs; the CLI only)\n",
            sp->temp, sp->top_k, sp->top_p, sp->min_p, MOEX_SPEC_MAX_DRAFT, c->eng.draft_max);
}

void hub_cli_usage(FILE *f, const hub_cli *c, const hub_cli_help *help) {
    const moex_hub_config *h = c->hub;
    fprintf(f,
            "  --host ADDR             listen address (default %s; 0.0.0.0: every interface)\n"
            "  --port N                listen port (default %d)\n"
            "  --token T               workers must present it (?token=T or Authorization: Bearer T)\n"
            "  --tcp-port N            native workers may also join over plain TCP on port N (moex-worker --hub\n"
            "                          tcp://HOST:N): no WebSocket framing, much faster for prompts; in the clear\n"
            "  --replicas R            replicas of every expert (default %d)\n"
            "  --hedge N|auto          send each expert to N replicas, or adapt (default %d)\n"
            "  --timeout-ms MS         per-expert deadline before re-dispatch (default %d)\n"
            "  --verify P              recompute a fraction P of results here; evict workers that disagree\n"
            "  --split-bytes N         cut a message to a worker after N bytes of frames (default 256 KiB; tests)\n"
            "  --no-local-fallback     fail instead of computing experts that have no live replica\n"
            "  --min-workers N         %s (default %lld)\n"
            "  --wait-s S              %s (default %g)\n"
            "browser workers and TLS\n"
            "  --web-dir DIR           the browser worker page, served at /worker (default: ../web beside this\n"
            "                          executable, i.e. <build>/web, when emscripten built it)\n"
            "  --tls                   HTTPS and WSS with a self-signed certificate made on first start and reused\n"
            "                          (its SHA-256 fingerprint is printed; browsers on other machines need HTTPS)\n"
            "  --tls-cert FILE         HTTPS and WSS with this certificate (PEM), instead of --tls's own\n"
            "  --tls-key FILE          the certificate's private key (PEM, unencrypted)\n"
            "  --tls-dir DIR           where --tls keeps its certificate (default $XDG_CACHE_HOME/moex/tls\n"
            "                          or ~/.cache/moex/tls)\n",
            h->host, h->port, h->replicas, h->hedge, h->timeout_ms, help->min_workers, (long long)c->min_workers,
            help->wait_s, c->wait_s);
}

int64_t hub_cli_cap_ctx(const char *prog, int64_t want, bool given, int64_t n_ctx_train) {
    if (n_ctx_train <= 0 || want <= n_ctx_train) return want;
    if (given)
        moex_log(MOEX_LOG_WARN, "%s: --ctx %lld is above the model's trained context: using %lld (positions past it "
                                "are outside what the model learned)", prog, (long long)want, (long long)n_ctx_train);
    return n_ctx_train;
}

void hub_cli_install_signals(void (*handler)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}
