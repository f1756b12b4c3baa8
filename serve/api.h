/* Private to the hub: the OpenAI-compatible HTTP API of `moex-hub serve`
 * (api.c: routes, authentication, bodies, responses and SSE streams on the
 * network thread; api_openai.c: the request and response JSON).
 *
 *   POST /v1/chat/completions, /v1/completions   generation through the scheduler
 *   POST /tokenize, /detokenize, /apply-template the tokenizer and the chat template (llama-server's)
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

#include <cjson/cJSON.h>

#include "hub/http.h"
#include "serve/jinja.h"
#include "serve/scheduler.h"
#include "serve/status.h"
#include "serve/tool_calls.h"

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
    const moex_jinja *jinja;     /* the chat template that renders conversations (the GGUF's, --chat-template-file,
                                    or the built-in ChatML one), or NULL: `chat` renders them */
    moex_chat_template chat;     /* --chat-template NAME: a built-in rendering (no tools) */
    serve_tool_format tool_format; /* how the template's model writes tool calls (NONE: tools are refused) */
    const char *bos_token, *eos_token;   /* their text, for the template */
    bool strip_bos;              /* the tokenizer adds BOS itself: a rendering's leading bos_token is dropped */
    moex_sampler_params defaults;/* sampling fields a request leaves out (the seed: drawn per request) */
    uint64_t seed;               /* a request without a seed gets seed + its number */
    int32_t n_vocab;             /* logit_bias's ids are checked against it */
} serve_openai_ctx;

#define SERVE_MAX_CHOICES 8   /* n: choices a request asks for at most */

typedef struct serve_api_request {
    bool chat, stream, include_usage;
    int n;                         /* choices: n jobs of the same prompt (the scheduler shares its KV rows) */
    serve_tool_format tool_format; /* tools offered: calls are parsed out of the answer in this format (NONE: none) */
    bool one_call;                 /* parallel_tool_calls false or a named function: the first call only */
    cJSON *tools;                  /* the tools offered (their schemas type the calls' values), or NULL; owned */
    serve_job_params job;          /* owned: serve_job_create takes it, or serve_api_request_free */
} serve_api_request;

/* Parses and checks a /v1/chat/completions (chat) or /v1/completions body.
 * A field this server does not implement, or one of the wrong type, out of
 * range or asking for what it does not do (echo, best_of), is an error (400,
 * the field in param): none is ignored. */
int serve_openai_parse(const serve_openai_ctx *ctx, bool chat, const char *body, size_t len, uint64_t request_no,
                     serve_api_request *out, serve_api_error *e);
void serve_api_request_free(serve_api_request *r);
/* api_chat.c: a chat body's messages, tools, tool_choice, parallel_tool_calls and chat_template_kwargs into
 * out's prompt (and, for a forced tool call, its grammar); response_format / grammar (either endpoint) into
 * job->grammar. -1 with e filled (400 naming the field). */
int serve_chat_prompt(const serve_openai_ctx *ctx, const cJSON *root, serve_api_request *out, serve_api_error *e);
int serve_answer_grammar(const cJSON *root, serve_job_params *job, serve_api_error *e);

/* The chat template a server runs: --chat-template NAME (a built-in rendering), --chat-template-file FILE
 * (Jinja), else the GGUF's tokenizer.chat_template (Jinja; the built-in rendering of its family when the
 * interpreter cannot read it), else ChatML with Hermes tool calls. Fills ctx's jinja, chat, tool_format,
 * bos_token, eos_token and strip_bos; cs owns what they point at. */
typedef struct serve_chat_setup {
    moex_jinja *jinja;
    char bos[128], eos[128];     /* the special tokens' text */
    char name[192];              /* what the status page shows */
} serve_chat_setup;
int serve_chat_setup_open(serve_chat_setup *cs, const moex_model *m, const char *name, const char *file,
                          serve_openai_ctx *ctx, moex_error *err);
void serve_chat_setup_close(serve_chat_setup *cs);
/* The template a GGUF without one gets (ChatML, tools as Hermes writes them). */
const char *serve_default_chat_template(void);

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

/* One choice of a completion, or a streamed chunk's piece of it. */
typedef struct serve_choice_out {
    const char *text;               /* a chunk: NULL, no content in the delta */
    const char *reasoning;          /* chat: message.reasoning_content (NULL: none) */
    const cJSON *tool_calls;        /* chat: OpenAI tool_calls (a chunk: delta tool_calls), or NULL */
    bool called;                    /* the answer made tool calls: finish_reason "tool_calls" */
    serve_finish finish;
    const serve_logprobs_out *lp;   /* NULL: "logprobs": null */
} serve_choice_out;

/* A whole (non-streamed) completion of n choices; usage: the request's (its prompt once, every choice's tokens).
 * A chat choice with tool calls and no text has content null. */
char *serve_openai_completion_json(bool chat, const char *id, long long created, const char *model,
                                 const serve_choice_out *choices, int n, const serve_job_state *usage);
/* One SSE chunk's JSON for choice index: its text, reasoning and tool-call deltas and, at the end, the finish
 * reason; chat's first chunk carries the assistant role. */
char *serve_openai_chunk_json(bool chat, const char *id, long long created, const char *model, int index, bool role,
                              const serve_choice_out *delta);
/* The last chunk when stream_options.include_usage: no choices, the usage. */
char *serve_openai_usage_chunk_json(bool chat, const char *id, long long created, const char *model,
                                  const serve_job_state *st);
char *serve_openai_models_json(const char *model, long long created, bool one);
/* llama-server's POST /tokenize ({"content": TEXT, "add_special": bool, "parse_special": bool} -> {"tokens": [ids]})
 * and POST /detokenize ({"tokens": [ids]} -> {"content": TEXT}) with the model's tokenizer: the JSON answer, or
 * NULL with e filled (a 400 naming the field). */
char *serve_tokenize_json(const moex_model *m, const char *body, size_t len, serve_api_error *e);
char *serve_detokenize_json(const moex_model *m, const char *body, size_t len, serve_api_error *e);
/* llama-server's POST /apply-template: a chat request's body -> {"prompt": the text its messages and tools render
 * to, "grammar": the GBNF its answer would follow (absent: none)}; NULL with e filled as the chat endpoint's. */
char *serve_apply_template_json(const serve_openai_ctx *ctx, const char *body, size_t len, serve_api_error *e);

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
