/* OpenAI's request and response JSON (api.h), through cJSON. A request's
 * fields become a job: the prompt (chat messages rendered with the model's
 * chat template, or a completion prompt as text or token ids), sampling,
 * stop sequences and the token limit. Every field of the body must be one this
 * server implements (checked for type and range), one that changes nothing
 * in the answer (user, metadata, ...), or one it does not implement at a
 * value that asks for nothing (presence_penalty 0, tools []); anything else is
 * a 400 naming it, never ignored (docs/API.md has the table). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/unicode.h"
#include "serve/api.h"
#include "serve/text_out.h"

#define MAX_PROMPT_TOKENS (1 << 22)

int serve_api_fail(serve_api_error *e, unsigned status, const char *type, const char *code, const char *param,
                 const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    e->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

#define BAD(e, param, ...) serve_api_fail(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

void serve_api_request_free(serve_api_request *r) {
    free(r->job.prompt_text);
    free(r->job.prompt_tokens);
    free((void *)r->job.rules.bias_id);
    free((void *)r->job.rules.bias);
    free(r->job.grammar);
    for (int i = 0; i < r->job.n_stop; i++) free(r->job.stop[i]);
    memset(&r->job, 0, sizeof r->job);
    cJSON_Delete(r->tools);
    r->tools = NULL;
}

/* ---- field checks: absent and null leave the default ---- */

static const cJSON *field(const cJSON *root, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

static int get_number(const cJSON *root, const char *name, double lo, double hi, float *out, serve_api_error *e) {
    const cJSON *f = field(root, name);
    if (!f) return 0;
    if (!cJSON_IsNumber(f)) return BAD(e, name, "'%s' must be a number", name);
    if (!(f->valuedouble >= lo && f->valuedouble <= hi))
        return BAD(e, name, "'%s' is %g; it must be between %g and %g", name, f->valuedouble, lo, hi);
    *out = (float)f->valuedouble;
    return 0;
}

static bool is_integer(const cJSON *f) {
    return cJSON_IsNumber(f) && f->valuedouble == floor(f->valuedouble) && fabs(f->valuedouble) < 9007199254740992.0;
}

static int get_integer(const cJSON *root, const char *name, double lo, double hi, int64_t *out, serve_api_error *e) {
    const cJSON *f = field(root, name);
    if (!f) return 0;
    if (!is_integer(f)) return BAD(e, name, "'%s' must be an integer", name);
    if (f->valuedouble < lo || f->valuedouble > hi)
        return BAD(e, name, "'%s' is %.0f; it must be between %.0f and %.0f", name, f->valuedouble, lo, hi);
    *out = (int64_t)f->valuedouble;
    return 0;
}

static int get_bool(const cJSON *root, const char *name, bool *out, serve_api_error *e) {
    const cJSON *f = field(root, name);
    if (!f) return 0;
    if (!cJSON_IsBool(f)) return BAD(e, name, "'%s' must be true or false", name);
    *out = cJSON_IsTrue(f);
    return 0;
}

/* ---- the prompt (a chat's: api_chat.c) ---- */

/* A string, an array of token ids, or an array holding one string. */
static int completion_prompt(const cJSON *root, serve_job_params *job, serve_api_error *e) {
    const cJSON *p = field(root, "prompt");
    if (!p) return BAD(e, "prompt", "'prompt' is required");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0);
    if (cJSON_IsString(p)) {
        job->prompt_len = strlen(p->valuestring);
        if (!(job->prompt_text = strdup(p->valuestring)))
            return serve_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return 0;
    }
    if (!cJSON_IsArray(p)) return BAD(e, "prompt", "'prompt' must be a string or an array of token ids");
    const int n = cJSON_GetArraySize(p);
    if (n < 1) return BAD(e, "prompt", "'prompt' is empty: nothing to continue from");
    if (n > MAX_PROMPT_TOKENS) return BAD(e, "prompt", "%d prompt tokens; at most %d", n, MAX_PROMPT_TOKENS);
    if (!(job->prompt_tokens = malloc((size_t)n * sizeof *job->prompt_tokens)))
        return serve_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, p) {
        if (!is_integer(t) || t->valuedouble < 0 || t->valuedouble > INT32_MAX)
            return BAD(e, "prompt", "'prompt' must be a string or an array of token ids (several prompts in one "
                       "request are not supported)");
        job->prompt_tokens[i++] = (int32_t)t->valuedouble;
    }
    job->n_prompt_tokens = n;
    return 0;
}

static int add_stop(serve_job_params *job, const cJSON *s, serve_api_error *e) {
    if (!cJSON_IsString(s)) return BAD(e, "stop", "'stop' must be a string or an array of strings");
    const size_t n = strlen(s->valuestring);
    if (n == 0) return 0; /* an empty stop sequence stops nothing */
    if (n > SERVE_STOP_MAX_BYTES) return BAD(e, "stop", "a stop sequence of %zu bytes; at most %d", n, SERVE_STOP_MAX_BYTES);
    if (job->n_stop == SERVE_MAX_STOPS) return BAD(e, "stop", "at most %d stop sequences", SERVE_MAX_STOPS);
    if (!(job->stop[job->n_stop] = strdup(s->valuestring)))
        return serve_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    job->n_stop++;
    return 0;
}

static int stops(const cJSON *root, serve_job_params *job, serve_api_error *e) {
    const cJSON *s = field(root, "stop");
    if (!s) return 0;
    if (!cJSON_IsArray(s)) return add_stop(job, s, e);
    const cJSON *x;
    cJSON_ArrayForEach(x, s) if (add_stop(job, x, e)) return -1;
    return 0;
}

/* ---- fields: which the server knows (docs/API.md, "Request fields") ---- */

/* Fields that shape the answer and are implemented, per endpoint. */
static const char *const common_fields[] = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p",
                                            "top_k", "min_p", "seed", "stop", "n", "logprobs", "ignore_eos",
                                            "presence_penalty", "frequency_penalty", "logit_bias", "repeat_penalty",
                                            "repeat_last_n", "response_format", "grammar", NULL};
static const char *const chat_fields[] = {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                                          "parallel_tool_calls", "chat_template_kwargs", NULL};
static const char *const completion_fields[] = {"prompt", "echo", "best_of", NULL};
/* Fields that change nothing in the answer: identifiers and bookkeeping. */
static const char *const inert_fields[] = {"user", "metadata", "store", "service_tier", NULL};

static bool in_list(const char *const *list, const char *name) {
    for (; *list; list++)
        if (!strcmp(*list, name)) return true;
    return false;
}

/* An unimplemented field at a value that asks for nothing: null (unset), the
 * legacy functions API with no function, an empty suffix. */
static bool asks_nothing(const cJSON *f) {
    const char *n = f->string;
    if (cJSON_IsNull(f)) return true;
    if (!strcmp(n, "functions")) return cJSON_IsArray(f) && !f->child;
    if (!strcmp(n, "function_call"))
        return cJSON_IsString(f) && (!strcmp(f->valuestring, "none") || !strcmp(f->valuestring, "auto"));
    if (!strcmp(n, "suffix")) return cJSON_IsString(f) && !*f->valuestring;
    return false;
}

/* Every field of the body known; else a 400 naming the first that is not. */
static int known_fields(const cJSON *root, bool chat, serve_api_error *e) {
    const cJSON *f;
    cJSON_ArrayForEach(f, root) {
        const char *n = f->string;
        if (in_list(common_fields, n) || in_list(chat ? chat_fields : completion_fields, n) ||
            in_list(inert_fields, n) || asks_nothing(f))
            continue;
        BAD(e, NULL, "'%.100s' is not supported by this server (docs/API.md lists the fields it implements); "
            "leave it out", n);
        snprintf(e->param_buf, sizeof e->param_buf, "%s", n);
        e->param = e->param_buf;
        return -1;
    }
    return 0;
}

/* What is asked for that this server does not do: refused rather than ignored. */
static int unsupported(const cJSON *root, serve_api_error *e) {
    bool echo = false;
    if (get_bool(root, "echo", &echo, e)) return -1;
    if (echo) return BAD(e, "echo", "'echo' is not supported");
    int64_t best_of = 1;
    if (get_integer(root, "best_of", 1, 128, &best_of, e)) return -1;
    if (best_of != 1) return BAD(e, "best_of", "'best_of' is not supported");
    return 0;
}

#define MAX_LOGIT_BIAS 1024

/* Penalties (OpenAI's presence and frequency, llama.cpp's repeat over the last repeat_last_n tokens) and
 * logit_bias ({"token id": bias}): moex_logit_rules, the bias arrays owned by the job. */
static int logit_rules(const serve_openai_ctx *ctx, const cJSON *root, serve_job_params *job, serve_api_error *e) {
    moex_logit_rules *r = &job->rules;
    r->repeat = 1.0f;
    int64_t last_n = 64;
    if (get_number(root, "presence_penalty", -2, 2, &r->presence, e) ||
        get_number(root, "frequency_penalty", -2, 2, &r->frequency, e) ||
        get_number(root, "repeat_penalty", 0.01, 10, &r->repeat, e) ||
        get_integer(root, "repeat_last_n", 0, 1 << 20, &last_n, e))
        return -1;
    job->repeat_last_n = (int)last_n;
    const cJSON *b = field(root, "logit_bias");
    if (!b) return 0;
    if (!cJSON_IsObject(b)) return BAD(e, "logit_bias", "'logit_bias' must be an object {\"token id\": bias}");
    const int n = cJSON_GetArraySize(b);
    if (n > MAX_LOGIT_BIAS) return BAD(e, "logit_bias", "%d biases; at most %d", n, MAX_LOGIT_BIAS);
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    float *bias = malloc((size_t)(n ? n : 1) * sizeof *bias);
    r->bias_id = ids, r->bias = bias;   /* the job owns them from here, whatever happens */
    if (!ids || !bias) return serve_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *x;
    cJSON_ArrayForEach(x, b) {
        char *end;
        const long id = strtol(x->string, &end, 10);
        if (!*x->string || *end || id < 0 || id >= ctx->n_vocab)
            return BAD(e, "logit_bias", "logit_bias key '%.40s' is not a token id (0..%d)", x->string, ctx->n_vocab - 1);
        if (!cJSON_IsNumber(x) || !(x->valuedouble >= -100 && x->valuedouble <= 100))
            return BAD(e, "logit_bias", "logit_bias['%.40s'] must be a number between -100 and 100", x->string);
        ids[r->n_bias] = (int32_t)id;
        bias[r->n_bias++] = (float)x->valuedouble;
    }
    return 0;
}

/* Chat: logprobs (bool) and top_logprobs (0..20); completions: logprobs (0..5 alternatives). */
static int log_probabilities(const cJSON *root, bool chat, serve_job_params *job, serve_api_error *e) {
    int64_t top = 0;
    if (chat) {
        if (get_bool(root, "logprobs", &job->logprobs, e) ||
            get_integer(root, "top_logprobs", 0, SERVE_MAX_TOP_LOGPROBS, &top, e))
            return -1;
        if (field(root, "top_logprobs") && !job->logprobs)
            return BAD(e, "top_logprobs", "'top_logprobs' needs \"logprobs\": true");
    } else if (field(root, "logprobs")) {
        if (get_integer(root, "logprobs", 0, 5, &top, e)) return -1;
        job->logprobs = true;
    }
    job->top_logprobs = (int)top;
    return 0;
}

static int sampling(const serve_openai_ctx *ctx, const cJSON *root, uint64_t request_no, moex_sampler_params *sp,
                    serve_api_error *e) {
    *sp = ctx->defaults;
    sp->seed = ctx->seed + request_no;
    int64_t top_k = sp->top_k, seed;
    if (get_number(root, "temperature", 0, 2, &sp->temp, e) || get_number(root, "top_p", 0, 1, &sp->top_p, e) ||
        get_number(root, "min_p", 0, 1, &sp->min_p, e) || get_integer(root, "top_k", 0, 1 << 24, &top_k, e))
        return -1;
    sp->top_k = (int)top_k;
    const cJSON *s = field(root, "seed");
    if (s) {
        if (!is_integer(s)) return BAD(e, "seed", "'seed' must be an integer");
        seed = (int64_t)s->valuedouble;
        sp->seed = (uint64_t)seed;
    }
    return 0;
}

static int check_model(const serve_openai_ctx *ctx, const cJSON *root, serve_api_error *e) {
    const cJSON *m = field(root, "model");
    if (!m) return 0; /* OpenAI requires it; one model here, so it may be left out */
    if (!cJSON_IsString(m)) return BAD(e, "model", "'model' must be a string");
    if (strcmp(m->valuestring, ctx->model_id))
        return serve_api_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                            "The model '%.200s' does not exist; this server serves '%.200s' (GET /v1/models)",
                            m->valuestring, ctx->model_id);
    return 0;
}

static int parse_root(const serve_openai_ctx *ctx, bool chat, const cJSON *root, uint64_t request_no,
                      serve_api_request *out, serve_api_error *e) {
    if (!cJSON_IsObject(root)) return BAD(e, NULL, "the request body must be a JSON object");
    if (known_fields(root, chat, e) || check_model(ctx, root, e) || unsupported(root, e)) return -1;
    int64_t n = 1;
    if (get_integer(root, "n", 1, SERVE_MAX_CHOICES, &n, e)) return -1;
    out->n = (int)n;
    if (get_bool(root, "stream", &out->stream, e)) return -1;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return BAD(e, "stream_options", "'stream_options' must be an object");
        if (get_bool(so, "include_usage", &out->include_usage, e)) return -1;
    }
    int64_t max_tokens = chat ? 0 : 16; /* OpenAI's defaults: chat until done, completions 16 */
    if (get_integer(root, "max_tokens", 1, 1 << 24, &max_tokens, e) ||
        (chat && get_integer(root, "max_completion_tokens", 1, 1 << 24, &max_tokens, e)))
        return -1;
    out->job.max_tokens = max_tokens;
    if (get_bool(root, "ignore_eos", &out->job.ignore_eos, e)) return -1; /* llama-server's extension */
    if (sampling(ctx, root, request_no, &out->job.sp, e) || stops(root, &out->job, e) ||
        log_probabilities(root, chat, &out->job, e) || logit_rules(ctx, root, &out->job, e) ||
        serve_answer_grammar(root, &out->job, e))
        return -1;
    return chat ? serve_chat_prompt(ctx, root, out, e) : completion_prompt(root, &out->job, e);
}

int serve_openai_parse(const serve_openai_ctx *ctx, bool chat, const char *body, size_t len, uint64_t request_no,
                     serve_api_request *out, serve_api_error *e) {
    memset(out, 0, sizeof *out);
    out->chat = chat;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    while (root && end < body + len && strchr(" \t\r\n", *end) && *end) end++;
    if (root && end != body + len) { /* a value, then something else: not one JSON document */
        cJSON_Delete(root);
        return BAD(e, NULL, "the request body has bytes after its JSON value (at byte %ld)", (long)(end - body));
    }
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        const long off = at && at >= body && at <= body + len ? (long)(at - body) : -1;
        return BAD(e, NULL, "the request body is not valid JSON (at byte %ld)", off);
    }
    const int rc = parse_root(ctx, chat, root, request_no, out, e);
    cJSON_Delete(root);
    if (rc) serve_api_request_free(out);
    return rc;
}

/* ---- responses ---- */

static char *print_and_free(cJSON *root) {
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

static void add_string_or_null(cJSON *o, const char *name, const char *v) {
    if (v) cJSON_AddStringToObject(o, name, v);
    else cJSON_AddNullToObject(o, name);
}

char *serve_openai_error_json(const serve_api_error *e) {
    /* a message may quote what the client sent (a model name, a path): valid UTF-8 only */
    char message[sizeof e->message];
    moex_utf8_sanitize(e->message, strnlen(e->message, sizeof e->message), message, sizeof message);
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    add_string_or_null(err, "param", e->param);
    add_string_or_null(err, "code", e->code);
    return print_and_free(root);
}

const char *serve_openai_finish_name(serve_finish f) {
    switch (f) {
    case SERVE_FINISH_STOP: return "stop";
    case SERVE_FINISH_LENGTH: return "length";
    default: return NULL;
    }
}

static cJSON *envelope(bool chat, bool chunk, const char *id, long long created, const char *model) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", id);
    cJSON_AddStringToObject(root, "object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                 : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)created);
    cJSON_AddStringToObject(root, "model", model);
    return root;
}

/* OpenAI's usage, with prompt_tokens_details.cached_tokens: the prompt tokens the prompt cache served. */
static void add_usage(cJSON *root, const serve_job_state *st) {
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)st->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)st->n_completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(st->n_prompt + st->n_completion));
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", (double)st->n_cached);
}

/* A token's text (its bytes as decoded; invalid UTF-8 shown as U+FFFD in "token", kept in "bytes"). */
static void add_token_text(cJSON *o, const moex_model *m, int32_t id, bool with_bytes, const char *key) {
    char buf[256], clean[3 * sizeof buf + 1];
    int n = m->tok ? moex_token_to_piece(m->tok, id, false, buf, sizeof buf) : 0;
    if (n < 0 || n > (int)sizeof buf) n = 0;   /* a longer piece: shown empty (none in real vocabularies) */
    const size_t nc = serve_text_out_sanitize(buf, (size_t)n, clean);
    clean[nc] = '\0';
    cJSON_AddStringToObject(o, key, clean);
    if (!with_bytes) return;
    cJSON *b = cJSON_AddArrayToObject(o, "bytes");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)buf[i]));
}

static int token_bytes(const moex_model *m, int32_t id) {
    char buf[256];
    const int n = m->tok ? moex_token_to_piece(m->tok, id, false, buf, sizeof buf) : 0;
    return n > 0 ? n : 0;
}

/* The choice's "logprobs": chat's {"content": [{token, logprob, bytes, top_logprobs}]}, or the completions'
 * legacy {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}. */
static void add_logprobs(cJSON *choice, bool chat, const serve_logprobs_out *lp) {
    if (!lp) {
        cJSON_AddNullToObject(choice, "logprobs");
        return;
    }
    cJSON *o = cJSON_AddObjectToObject(choice, "logprobs");
    if (chat) {
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        for (size_t i = 0; i < lp->n; i++) {
            const serve_logprob *e = &lp->lp[i];
            cJSON *t = cJSON_CreateObject();
            add_token_text(t, lp->m, e->id, true, "token");
            cJSON_AddNumberToObject(t, "logprob", e->logprob);
            cJSON *top = cJSON_AddArrayToObject(t, "top_logprobs");
            for (int k = 0; k < e->n_top; k++) {
                cJSON *a = cJSON_CreateObject();
                add_token_text(a, lp->m, e->top_id[k], true, "token");
                cJSON_AddNumberToObject(a, "logprob", e->top_logprob[k]);
                cJSON_AddItemToArray(top, a);
            }
            cJSON_AddItemToArray(content, t);
        }
        return;
    }
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    for (size_t i = 0; i < lp->n; i++) {
        const serve_logprob *e = &lp->lp[i];
        cJSON *holder = cJSON_CreateObject();
        add_token_text(holder, lp->m, e->id, false, "t");
        cJSON_AddItemToArray(tokens, cJSON_CreateString(cJSON_GetObjectItem(holder, "t")->valuestring));
        cJSON_Delete(holder);
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(e->logprob));
        cJSON *top = cJSON_CreateObject();
        for (int k = 0; k < e->n_top; k++) {
            cJSON *h = cJSON_CreateObject();
            add_token_text(h, lp->m, e->top_id[k], false, "t");
            cJSON_AddNumberToObject(top, cJSON_GetObjectItem(h, "t")->valuestring, e->top_logprob[k]);
            cJSON_Delete(h);
        }
        cJSON_AddItemToArray(tops, top);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*lp->text_offset));
        *lp->text_offset += (size_t)token_bytes(lp->m, e->id);
    }
}

static void add_finish(cJSON *choice, const serve_choice_out *c) {
    const char *f = c->called && c->finish == SERVE_FINISH_STOP ? "tool_calls" : serve_openai_finish_name(c->finish);
    add_string_or_null(choice, "finish_reason", f);
}

char *serve_openai_completion_json(bool chat, const char *id, long long created, const char *model,
                                 const serve_choice_out *choices, int n, const serve_job_state *usage) {
    cJSON *root = envelope(chat, false, id, created, model);
    cJSON *arr = cJSON_AddArrayToObject(root, "choices");
    for (int i = 0; i < n; i++) {
        const serve_choice_out *c = &choices[i];
        cJSON *choice = cJSON_CreateObject();
        cJSON_AddNumberToObject(choice, "index", i);
        if (chat) {
            cJSON *msg = cJSON_AddObjectToObject(choice, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            const bool calls = c->tool_calls && cJSON_GetArraySize(c->tool_calls) > 0;
            add_string_or_null(msg, "content", calls && !*c->text ? NULL : c->text);
            if (c->reasoning) cJSON_AddStringToObject(msg, "reasoning_content", c->reasoning);
            if (calls) cJSON_AddItemToObject(msg, "tool_calls", cJSON_Duplicate(c->tool_calls, true));
        } else {
            cJSON_AddStringToObject(choice, "text", c->text);
        }
        add_logprobs(choice, chat, c->lp);
        add_finish(choice, c);
        cJSON_AddItemToArray(arr, choice);
    }
    add_usage(root, usage);
    return print_and_free(root);
}

char *serve_openai_chunk_json(bool chat, const char *id, long long created, const char *model, int index, bool role,
                              const serve_choice_out *d) {
    cJSON *root = envelope(chat, true, id, created, model);
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddNumberToObject(choice, "index", index);
    if (chat) {
        cJSON *delta = cJSON_AddObjectToObject(choice, "delta");
        if (role) cJSON_AddStringToObject(delta, "role", "assistant");
        if (d->reasoning) cJSON_AddStringToObject(delta, "reasoning_content", d->reasoning);
        if (d->text || role) cJSON_AddStringToObject(delta, "content", d->text ? d->text : "");
        if (d->tool_calls) cJSON_AddItemToObject(delta, "tool_calls", cJSON_Duplicate(d->tool_calls, true));
    } else {
        cJSON_AddStringToObject(choice, "text", d->text ? d->text : "");
    }
    add_logprobs(choice, chat, d->lp);
    add_finish(choice, d);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "choices"), choice);
    return print_and_free(root);
}

char *serve_openai_usage_chunk_json(bool chat, const char *id, long long created, const char *model,
                                  const serve_job_state *st) {
    cJSON *root = envelope(chat, true, id, created, model);
    cJSON_AddArrayToObject(root, "choices");
    add_usage(root, st);
    return print_and_free(root);
}

char *serve_openai_models_json(const char *model, long long created, bool one) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "moex");
    if (one) return print_and_free(m);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), m);
    return print_and_free(root);
}

char *serve_apply_template_json(const serve_openai_ctx *ctx, const char *body, size_t len, serve_api_error *e) {
    serve_api_request req;
    if (serve_openai_parse(ctx, true, body, len, 0, &req, e)) return NULL;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "prompt", req.job.prompt_text ? req.job.prompt_text : "");
    if (req.job.grammar) cJSON_AddStringToObject(root, "grammar", req.job.grammar);
    serve_api_request_free(&req);
    return print_and_free(root);
}

/* ---- /tokenize, /detokenize ---- */

static cJSON *parse_object(const char *body, size_t len, serve_api_error *e) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        BAD(e, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* Only these fields; anything else a 400 naming it (as the completions' fields). */
static int only_fields(const cJSON *root, const char *const *names, serve_api_error *e) {
    const cJSON *f;
    cJSON_ArrayForEach(f, root) {
        if (in_list(names, f->string)) continue;
        BAD(e, NULL, "'%.100s' is not a field of this endpoint", f->string);
        snprintf(e->param_buf, sizeof e->param_buf, "%s", f->string);
        e->param = e->param_buf;
        return -1;
    }
    return 0;
}

char *serve_tokenize_json(const moex_model *m, const char *body, size_t len, serve_api_error *e) {
    static const char *const names[] = {"content", "add_special", "parse_special", NULL};
    cJSON *root = parse_object(body, len, e);
    if (!root) return NULL;
    char *out = NULL;
    int32_t *ids = NULL;
    const cJSON *c = field(root, "content");
    bool add_special = false, parse_special = true;
    if (only_fields(root, names, e) || get_bool(root, "add_special", &add_special, e) ||
        get_bool(root, "parse_special", &parse_special, e))
        goto done;
    if (!cJSON_IsString(c)) {
        BAD(e, "content", "'content' must be a string");
        goto done;
    }
    if (!m->tok) {
        serve_api_fail(e, 400, "invalid_request_error", NULL, NULL, "this model has no tokenizer");
        goto done;
    }
    const size_t n = strlen(c->valuestring);
    moex_error err = {0};
    int64_t cap = (int64_t)n + 8, got = -1;
    if ((ids = malloc((size_t)cap * sizeof *ids)))
        got = moex_tokenize(m->tok, c->valuestring, n, add_special, parse_special, ids, cap, &err);
    if (got < 0 || got > cap) {
        serve_api_fail(e, got < 0 && ids ? 400 : 500, "invalid_request_error", NULL, "content", "cannot tokenize: %s",
                       err.msg[0] ? err.msg : "out of memory");
        goto done;
    }
    cJSON *res = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(res, "tokens");
    for (int64_t i = 0; i < got; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    out = print_and_free(res);
done:
    free(ids);
    cJSON_Delete(root);
    return out;
}

char *serve_detokenize_json(const moex_model *m, const char *body, size_t len, serve_api_error *e) {
    static const char *const names[] = {"tokens", NULL};
    cJSON *root = parse_object(body, len, e);
    if (!root) return NULL;
    char *out = NULL, *text = NULL;
    int32_t *ids = NULL;
    const cJSON *t = field(root, "tokens");
    if (only_fields(root, names, e)) goto done;
    if (!cJSON_IsArray(t)) {
        BAD(e, "tokens", "'tokens' must be an array of token ids");
        goto done;
    }
    const int n = cJSON_GetArraySize(t);
    if (!(ids = malloc((size_t)(n ? n : 1) * sizeof *ids))) goto oom;
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, t) {
        if (!is_integer(x) || x->valuedouble < 0 || x->valuedouble >= m->hp.n_vocab) {
            BAD(e, "tokens", "tokens[%d] is not a token id (0..%d)", i, m->hp.n_vocab - 1);
            goto done;
        }
        ids[i++] = (int32_t)x->valuedouble;
    }
    if (!m->tok) {
        serve_api_fail(e, 400, "invalid_request_error", NULL, NULL, "this model has no tokenizer");
        goto done;
    }
    moex_error err = {0};
    int64_t cap = 16 * (int64_t)n + 16;
    if (!(text = malloc((size_t)cap))) goto oom;
    int64_t got = moex_detokenize(m->tok, ids, n, false, text, cap, &err);
    if (got > cap) {
        char *grown = realloc(text, (size_t)got);
        if (!grown) goto oom;
        text = grown;
        cap = got;
        got = moex_detokenize(m->tok, ids, n, false, text, cap, &err);
    }
    if (got < 0 || got > cap) {
        serve_api_fail(e, 400, "invalid_request_error", NULL, "tokens", "cannot detokenize: %s", err.msg);
        goto done;
    }
    /* the model can emit any bytes: invalid UTF-8 becomes U+FFFD, as in completions */
    char *clean = malloc(3 * (size_t)got + 1);
    if (!clean) goto oom;
    const size_t nc = serve_text_out_sanitize(text, (size_t)got, clean);
    clean[nc] = '\0';
    cJSON *res = cJSON_CreateObject();
    cJSON_AddStringToObject(res, "content", clean);
    free(clean);
    out = print_and_free(res);
    goto done;
oom:
    serve_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
done:
    free(ids);
    free(text);
    cJSON_Delete(root);
    return out;
}
