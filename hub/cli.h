/* Private to moex-hub's two commands (main.c: the one-shot hub, main_serve.c:
 * `moex-hub serve`): the flags they share, parsed and described in one place.
 * Those are the engine flags (--local, the backend, threads, the wire dtype,
 * sampling), the worker and network flags (where the hub listens, the token,
 * replication, hedging, verification, waiting for workers, the browser
 * worker page, TLS) and the checked number parsers both use. Messages start
 * with the command's name and go to stderr. */
#ifndef MOEX_HUB_CLI_H
#define MOEX_HUB_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/sampler.h"
#include "kernels/vk/vk.h"
#include "engine/engine.h"
#include "hub/hub.h"

/* Where and how the model runs: the same flags in both commands. */
typedef struct hub_cli_engine {
    bool local;                  /* --local: the whole model here, no workers */
    bool vulkan;                 /* --backend vulkan */
    bool cpu_moe;                /* --cpu-moe: with --local on Vulkan, the experts on this CPU (the CPU tier) */
    moex_vk_options vk;          /* --device N (-1: the best), --vk-tune KEY=VALUE,... */
    int threads;                 /* -t N; 0: every core */
    int wire_dtype;              /* --wire-dtype: a MOEX_DT_* or MOEX_WIRE_EXACT */
    moex_sampler_params sp;      /* --temp, --top-k, --top-p, --min-p, --seed */
    /* speculative decoding */
    bool lookup;                 /* --lookup: prompt-lookup drafts */
    const char *draft_model;     /* --draft-model FILE */
    int draft_max;               /* --draft-max N */
    int draft_min;               /* --draft-min N (0: the auto-off decides) */
} hub_cli_engine;

/* The defaults: CPU, every core, f16 on the wire, temperature 0.8, top-k 40,
 * top-p 0.95, min-p 0.05, a seed from the clock; no speculation, 8 drafts
 * at most when asked for. */
hub_cli_engine hub_cli_engine_default(void);

/* The engine these flags ask for (moex_engine_open's options): experts on the
 * hub's workers when hub is not NULL, else computed here on pool. */
moex_engine_options hub_cli_engine_options(const hub_cli_engine *e, moex_pool *pool, moex_hub *hub, int64_t n_ctx,
                                           int64_t n_batch);

typedef struct hub_cli {
    const char *prog;            /* "moex-hub" or "moex-hub serve" */
    hub_cli_engine eng;
    moex_hub_config *hub;        /* host, port, token, replicas, hedge, timeout_ms, verify_p,
                                    local_fallback, web_dir, tls, tls_cert, tls_key, tls_dir */
    int64_t min_workers;         /* --min-workers */
    int64_t min_workers_lo;      /* its smallest accepted value */
    double wait_s;               /* --wait-s */
    bool web_dir_given;          /* --web-dir: a missing page is then an error, not a note */
    char found_web_dir[4096];    /* the default page directory, when it exists */
} hub_cli;

/* How each command words the waiting flags in --help. */
typedef struct hub_cli_help {
    const char *min_workers;     /* what --min-workers N does */
    const char *wait_s;          /* what --wait-s S does */
} hub_cli_help;

/* Takes argv[*i] when it is one of the shared flags (and its value,
 * advancing *i). Returns 1 when taken, 0 when it is not one of them, -1
 * after printing why its value is wrong. */
int hub_cli_parse(hub_cli *c, int argc, char **argv, int *i);

/* After the last flag: checks --wire-dtype exact goes with --local and the
 * TLS flags go together, and finds the
 * browser worker page (--web-dir, else <dir of the executable>/../web),
 * leaving c->hub->web_dir NULL (and saying how to build it) when the page
 * is not built. 0, or -1 after printing why. */
int hub_cli_finish(hub_cli *c);

/* The shared flags' lines of --help, with c's defaults: the engine's, and
 * the workers' and network's. */
void hub_cli_engine_usage(FILE *f, const hub_cli *c);
void hub_cli_usage(FILE *f, const hub_cli *c, const hub_cli_help *help);

/* ---- speculative decoding's drafters (hub/cli_spec.c): --lookup, --draft-model ---- */

typedef struct hub_cli_drafts {
    const hub_cli_engine *e;
    moex_model *dm;              /* --draft-model's model, or NULL */
    moex_engine deng;            /* its engine: this process's backend, every expert here, n_seq slots */
} hub_cli_drafts;

/* Loads and opens the draft model (its vocabulary checked against m) when
 * e->draft_model is set; n_seq: the sequences drafting at once. 0, or -1
 * after printing why (prog first). */
int hub_cli_drafts_open(hub_cli_drafts *d, const hub_cli_engine *e, const char *prog, const moex_model *m,
                        moex_pool *pool, int64_t n_ctx, int n_seq);
/* A drafter for the sequence in slot (--lookup's, the draft model's, or the
 * lookup's with the model behind it); NULL when out of memory. */
moex_drafter *hub_cli_drafter(hub_cli_drafts *d, int slot, const moex_sampler_params *sp);
void hub_cli_drafts_close(hub_cli_drafts *d);

/* The context to allocate: want, at most the model's trained context
 * (n_ctx_train; <= 0: unknown), saying so when it cuts a --ctx given. */
int64_t hub_cli_cap_ctx(const char *prog, int64_t want, bool given, int64_t n_ctx_train);

/* Checked numbers: the whole string, in [lo, hi]; -1 after printing
 * "<prog>: <flag> expects ...". */
int hub_cli_i64(const char *prog, const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
int hub_cli_f64(const char *prog, const char *flag, const char *s, double lo, double hi, double *out);

/* SIGINT and SIGTERM to handler (which sets the program's stop flag), SIGPIPE
 * ignored (a peer gone mid-write is an error return, not a death). */
void hub_cli_install_signals(void (*handler)(int));

/* The one-shot hub and the --local CLI (hub/main.c): the program moex-hub
 * for every command but `serve` (serve/main_serve.c holds main). */
int moex_hub_main(int argc, char **argv);

#endif
