/* Private to the hub: the OpenAI-compatible HTTP API of `moex-hub serve`
 * (api.c: routes, authentication, bodies, responses and SSE streams on the
 * network thread; api_openai.c: the request and response JSON).
 *
 *   POST /v1/chat/completions, /v1/completions   generation through the scheduler
 *   GET  /v1/models, /v1/models/<id>             the one model served
 *   GET  /health                                 200 when a request would be served now, else
 *                                                503 and the reason (no key)
 *   GET  /metrics                                Prometheus text (status.c)
 *   GET  /status.json, /                         the status page and its data (status.c)
 *
 * Requests carry the API key as Authorization: Bearer K (not the workers'
 * token); / and /health need none. Errors are OpenAI's error JSON. */
#ifndef MOEX_SERVE_API_H
#define MOEX_SERVE_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hub/http.h"
#include "serve/scheduler.h"
#include "serve/status.h"

/* ---- the request and response JSON (api_openai.c) ---- */

typedef struct serve_api_error {
    unsigned status;             /* HTTP status */
    const char *type;            /* "invalid_request_error", "authentication_error", "server_error", ... */
    const char *code;            /* NULL: null */
    const char *param;           /* the offending field; NULL: null */
    char message[640];
    char param_buf[64];          /* param when it names a field of the request (the body is freed before the answer) */
} serve_api_error;

/* What requests are checked against and filled in from. */
typedef struct serve_openai_ctx {
    const char *model_id;
    moex_chat_template chat;     /* how chat messages become a prompt */
    moex_sampler_params defaults;/* sampling fields a request leaves out (the seed: drawn per request) */
    uint64_t seed;               /* a request without a seed gets seed + its number */
    int32_t n_vocab;             /* logit_bias's ids are checked against it */
} serve_openai_ctx;

#define SERVE_MAX_CHOICES 8   /* n: choices a request asks for at most */

typedef struct serve_api_request {
    bool chat, stream, include_usage;
    int n;                         /* choices: n jobs of the same prompt (the scheduler shares its KV rows) */
    serve_job_params job;          /* owned: serve_job_create takes it, or serve_api_request_free */
} serve_api_request;

/* Parses and checks a /v1/chat/completions (chat) or /v1/completions body.
 * Unknown fields are ignored; known ones of the wrong type, out of range or
 * asking for what this server does not do (n > 1, logprobs, echo, best_of)
 * are errors (400, the field in param). */
int serve_openai_parse(const serve_openai_ctx *ctx, bool chat, const char *body, size_t len, uint64_t request_no,
                     serve_api_request *out, serve_api_error *e);
void serve_api_request_free(serve_api_request *r);

/* Fills e (printf-style message). Returns -1. */
int serve_api_fail(serve_api_error *e, unsigned status, const char *type, const char *code, const char *param,
                 const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Response bodies (malloc'd, NULL when out of memory). */
char *serve_openai_error_json(const serve_api_error *e);
const char *serve_openai_finish_name(serve_finish f);
/* Log probabilities to put in a choice (NULL: "logprobs": null): the
 * tokens' entries, their text through the model's tokenizer, and (the
 * completions' legacy format) the byte offset of the first one's text in
 * the completion, advanced past them. */
typedef struct serve_logprobs_out {
    const moex_model *m;
    const serve_logprob *lp;
    size_t n;
    size_t *text_offset;
} serve_logprobs_out;

/* One choice of a completion. */
typedef struct serve_choice_out {
    const char *text;
    const char *reasoning;          /* chat: message.reasoning_content (NULL: none) */
    serve_finish finish;
    const serve_logprobs_out *lp;   /* NULL: "logprobs": null */
} serve_choice_out;

/* A whole (non-streamed) completion of n choices; usage: the request's (its prompt once, every choice's tokens). */
char *serve_openai_completion_json(bool chat, const char *id, long long created, const char *model,
                                 const serve_choice_out *choices, int n, const serve_job_state *usage);
/* One SSE chunk's JSON for choice index: text (may be NULL) and, at the
 * end, the finish reason; chat's first chunk carries the assistant role. */
char *serve_openai_chunk_json(bool chat, const char *id, long long created, const char *model, int index,
                            const char *text, const char *reasoning, bool role, serve_finish finish,
                            const serve_logprobs_out *lp);
/* The last chunk when stream_options.include_usage: no choices, the usage. */
char *serve_openai_usage_chunk_json(bool chat, const char *id, long long created, const char *model,
                                  const serve_job_state *st);
char *serve_openai_models_json(const char *model, long long created, bool one);
/* llama-server's POST /tokenize ({"content": TEXT, "add_special": bool, "parse_special": bool} -> {"tokens": [ids]})
 * and POST /detokenize ({"tokens": [ids]} -> {"content": TEXT}) with the model's tokenizer: the JSON answer, or
 * NULL with e filled (a 400 naming the field). */
char *serve_tokenize_json(const moex_model *m, const char *body, size_t len, serve_api_error *e);
char *serve_detokenize_json(const moex_model *m, const char *body, size_t len, serve_api_error *e);

/* ---- the HTTP side (api.c) ---- */

typedef struct serve_api_config {
    const char *api_key;         /* NULL or "": no key needed */
    size_t max_body;             /* request bodies at most (bytes): more gets 413 */
    double client_timeout_s;     /* a client that reads nothing this long while text waits is dropped */
    serve_openai_ctx openai;
} serve_api_config;

typedef struct serve_api serve_api;

/* status: what /metrics, /status.json and / show (the API fills in its
 * request counters there). Until a scheduler is set, generation requests
 * get 503 and /health says "loading". */
serve_api *serve_api_create(const serve_api_config *cfg, serve_status_src *status, moex_error *err);
void serve_api_set_scheduler(serve_api *a, serve_sched *sched);
/* What /health gives as the reason for its 503 until the scheduler is set
 * ("reading the weights", "waiting for 3 workers"): static text. */
void serve_api_set_phase(serve_api *a, const char *phase);
/* The handler to give the hub's server (moex_hub_config.http_handler). */
const hub_http_handler *serve_api_handler(serve_api *a);
/* After the server stopped. */
void serve_api_free(serve_api *a);

#endif
