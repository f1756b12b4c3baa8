/* The API's HTTP side (api.h), on the network thread: routes, the API key,
 * request bodies (bounded), and responses written one piece per
 * HTTP_WRITEABLE: whole JSON/HTML/text bodies, or an SSE stream (a
 * text/event-stream response without a length, closed at its end) fed
 * by the job's text as the scheduler produces it.
 *
 * The scheduler's thread tells us of new text through notify: the job goes
 * on a ready list and the network thread is woken (lws_cancel_service);
 * service() then asks for a writeable callback on each ready job's
 * connection. A client that disconnects cancels its job (its KV slot is
 * freed at the next step); one that reads nothing for client_timeout_s
 * while text waits is dropped the same way. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "common/text.h"
#include "serve/api.h"
#include "serve/reasoning.h"

typedef enum route {
    R_PAGE, R_HEALTH, R_METRICS, R_STATUS, R_MODELS, R_MODEL, R_CHAT, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE,
    R_APPLY_TEMPLATE, R_V1_OTHER, /* any other path under /v1/: a JSON 404 (last: the routes before it match first) */
    R_COUNT
} route;

static const struct {
    const char *path;
    int method;          /* LWSHUMETH_GET or _POST */
    bool auth;
    int endpoint;        /* serve_api_counters */
} routes[R_COUNT] = {
    [R_PAGE] = {"/", LWSHUMETH_GET, false, SERVE_EP_STATUS},
    [R_HEALTH] = {"/health", LWSHUMETH_GET, false, SERVE_EP_OTHER},
    [R_METRICS] = {"/metrics", LWSHUMETH_GET, true, SERVE_EP_METRICS},
    [R_STATUS] = {"/status.json", LWSHUMETH_GET, true, SERVE_EP_STATUS},
    [R_MODELS] = {"/v1/models", LWSHUMETH_GET, true, SERVE_EP_MODELS},
    [R_MODEL] = {"/v1/models/", LWSHUMETH_GET, true, SERVE_EP_MODELS}, /* a prefix: /v1/models/<id> */
    [R_CHAT] = {"/v1/chat/completions", LWSHUMETH_POST, true, SERVE_EP_CHAT},
    [R_COMPLETIONS] = {"/v1/completions", LWSHUMETH_POST, true, SERVE_EP_COMPLETIONS},
    [R_TOKENIZE] = {"/tokenize", LWSHUMETH_POST, true, SERVE_EP_OTHER},
    [R_DETOKENIZE] = {"/detokenize", LWSHUMETH_POST, true, SERVE_EP_OTHER},
    [R_APPLY_TEMPLATE] = {"/apply-template", LWSHUMETH_POST, true, SERVE_EP_OTHER},
    [R_V1_OTHER] = {"/v1/", -1, true, SERVE_EP_OTHER}, /* a prefix; any method */
};

struct serve_api {
    serve_api_config cfg;
    _Atomic(serve_sched *) sched;  /* NULL while the server starts */
    serve_status_src *status;
    hub_http_handler handler;
    uint64_t n_requests;         /* network thread: numbers ids and default seeds */
    hub_log_limit refusals;      /* network thread */
    hub_log_limit client_errors; /* network thread: 4xx answers logged, rate-limited */
    _Atomic(const char *) phase; /* what /health says while there is no scheduler (static text) */
    pthread_mutex_t mu;          /* ctx and the ready list */
    struct lws_context *ctx;
    serve_job **ready;
    int n_ready, cap_ready;
};

/* One choice of a generation: its job, and what the response has of it so far. */
typedef struct api_choice {
    serve_job *job;
    serve_job_state st;          /* the last state taken */
    bool role_sent, finished;    /* streams: the role chunk, the finish chunk went out */
    serve_reasoning think;       /* chat: the answer's <think> part into reasoning_content */
    serve_tool_stream *tools;    /* a streamed chat with tools: its content's tool calls as deltas */
    char *text;                  /* a whole response's text so far */
    size_t text_len, text_cap;
    serve_logprob *lp;           /* a whole response's log probabilities so far */
    size_t n_lp, cap_lp;
    size_t text_offset;          /* the completions' legacy text_offset of the next token */
} api_choice;

/* One request and its response. */
typedef struct api_req {
    serve_api *a;
    struct lws *wsi;
    route route;
    char *body;
    size_t body_len;
    /* the response: status decided, head written, bytes waiting (after LWS_PRE), the end queued */
    unsigned status;
    const char *ctype;
    int64_t length;              /* -1: none (SSE: the connection closes at the end) */
    bool head_sent, final;
    bool close_after;            /* answered before its body was read: the connection cannot go on */
    bool body_done;              /* the body was taken: anything more on this request is dropped */
    uint8_t *out;
    size_t out_len, out_cap;
    double waiting_since;        /* a writeable callback asked for and not yet had (0: none) */
    /* a generation: n choices, a job each */
    api_choice ch[SERVE_MAX_CHOICES];
    int n_ch;
    bool chat, stream, include_usage, ended;
    char id[48];
    long long created;
    bool logprobs;               /* the request asked for log probabilities */
    serve_tool_format tool_format; /* tools offered: calls parsed out of the content in this format */
    bool one_call;               /* only the first call is the answer's (parallel_tool_calls false) */
    cJSON *tools;                /* the tools offered: their schemas type the calls' values */
} api_req;

/* ---- writing ---- */

static int append(uint8_t **buf, size_t *len, size_t *cap, size_t headroom, const char *s, size_t n) {
    if (moex_grow_bytes((char **)buf, cap, headroom + *len + n + 1)) return -1;
    memcpy(*buf + headroom + *len, s, n);
    *len += n;
    (*buf)[headroom + *len] = 0;
    return 0;
}

static int out_add(api_req *r, const char *s, size_t n) { return append(&r->out, &r->out_len, &r->out_cap, LWS_PRE, s, n); }

static void want_writeable(api_req *r) {
    if (!r->waiting_since) r->waiting_since = moex_time_s();
    lws_callback_on_writable(r->wsi);
}

/* A whole response: status, type and body (copied). */
static int respond(api_req *r, unsigned status, const char *ctype, const char *body, size_t len) {
    r->status = status;
    r->ctype = ctype;
    r->length = (int64_t)len;
    r->final = true;
    r->out_len = 0;
    serve_api_count(&r->a->status->api, routes[r->route].endpoint, status);
    if (out_add(r, body, len)) return -1;
    want_writeable(r);
    return 0;
}

static int respond_json(api_req *r, unsigned status, char *json) {
    if (!json) return respond(r, 500, "text/plain", "out of memory\n", 14);
    const int rc = respond(r, status, "application/json", json, strlen(json));
    free(json);
    return rc;
}

/* Server errors are always logged; a client's mistakes a few times a second
 * (a flood of bad requests must not become a flood of log lines). */
static int respond_error(api_req *r, const serve_api_error *e) {
    uint32_t suppressed = 0;
    if (e->status >= 500 || hub_log_limit_take(&r->a->client_errors, moex_time_s(), &suppressed)) {
        char peer[64] = "?";
        lws_get_peer_simple(r->wsi, peer, sizeof peer);
        moex_log(e->status >= 500 ? MOEX_LOG_WARN : MOEX_LOG_INFO, "api: %s %s -> %u: %s%s", peer,
                 routes[r->route].path, e->status, e->message, suppressed ? " (and more not logged)" : "");
    }
    return respond_json(r, e->status, serve_openai_error_json(e));
}

static int add_header(struct lws *wsi, const char *name, const char *value, uint8_t **p, uint8_t *end) {
    return lws_add_http_header_by_name(wsi, (const unsigned char *)name, (const unsigned char *)value,
                                       (int)strlen(value), p, end);
}

static int send_head(api_req *r) {
    uint8_t buf[LWS_PRE + 1024], *start = buf + LWS_PRE, *p = start, *end = buf + sizeof buf - 1;
    const lws_filepos_t len = r->length < 0 ? LWS_ILLEGAL_HTTP_CONTENT_LEN : (lws_filepos_t)r->length;
    if (lws_add_http_common_headers(r->wsi, r->status, r->ctype, len, &p, end) ||
        add_header(r->wsi, "access-control-allow-origin:", "*", &p, end))
        return -1;
    if (r->length < 0 && (add_header(r->wsi, "cache-control:", "no-cache", &p, end) ||
                          add_header(r->wsi, "x-accel-buffering:", "no", &p, end)))
        return -1;
    if (r->status == HTTP_STATUS_NO_CONTENT &&
        (add_header(r->wsi, "access-control-allow-methods:", "GET, POST, OPTIONS", &p, end) ||
         add_header(r->wsi, "access-control-allow-headers:", "authorization, content-type, *", &p, end) ||
         add_header(r->wsi, "access-control-max-age:", "86400", &p, end)))
        return -1;
    return lws_finalize_write_http_header(r->wsi, start, &p, end);
}

/* ---- the job's progress into the response ---- */

static int sse_event(api_req *r, char *json) {
    if (!json) return -1;
    const int rc = out_add(r, "data: ", 6) || out_add(r, json, strlen(json)) || out_add(r, "\n\n", 2);
    free(json);
    return rc;
}

/* The log probabilities to send with some text (NULL when the request asked for none). */
static const serve_logprobs_out *logprobs_out(api_req *r, api_choice *c, const serve_logprob *lp, size_t n,
                                              serve_logprobs_out *o) {
    if (!r->logprobs) return NULL;
    *o = (serve_logprobs_out){.m = r->a->status->m, .lp = lp, .n = n, .text_offset = &c->text_offset};
    return o;
}

/* A call's id prefix: unique per request and choice ("call_" + prefix + the call's index). */
static void call_id_prefix(const api_req *r, int i, char *buf, size_t cap) {
    snprintf(buf, cap, "%s_%d_", strchr(r->id, '-') ? strchr(r->id, '-') + 1 : r->id, i);
}

/* Calls past the first dropped (one_call): a delta array's entries of index >= 1, a whole answer's calls. */
static void keep_first_call(cJSON *calls, bool deltas) {
    for (int k = cJSON_GetArraySize(calls) - 1; k >= 0; k--) {
        const cJSON *idx = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, k), "index");
        if (deltas ? cJSON_IsNumber(idx) && idx->valuedouble >= 1 : k >= 1) cJSON_DeleteItemFromArray(calls, k);
    }
}

/* Choice i's new text as SSE chunks (the role first on a chat), and its finish chunk once done. A chat's text
 * goes through the reasoning split, then (tools offered) the tool-call parser. */
static int stream_choice(api_req *r, int i, const char *text, const serve_logprob *lp, size_t n_lp) {
    api_choice *c = &r->ch[i];
    const char *model = r->a->cfg.openai.model_id;
    serve_logprobs_out o;
    if (c->finished) return 0;
    if (r->chat && !c->role_sent) {
        c->role_sent = true;
        const serve_choice_out role = {.lp = logprobs_out(r, c, NULL, 0, &o)};
        if (sse_event(r, serve_openai_chunk_json(true, r->id, r->created, model, i, true, &role))) return -1;
    }
    char *reasoning = NULL, *content = NULL, *plain = NULL, *own = NULL;   /* chat: <think> part (or the format's
                                                                             own, harmony's analysis) as reasoning */
    cJSON *deltas = NULL;
    size_t rl = 0, cl = 0;
    moex_error err = {0};
    int rc = r->chat && serve_reasoning_feed(&c->think, text ? text : "", text ? strlen(text) : 0, c->st.done,
                                             &reasoning, &rl, &content, &cl);
    if (!rc && c->tools && (content || c->st.done))
        rc = serve_tool_stream_feed_ex(c->tools, content ? content : "", cl, c->st.done, &plain, &own, &deltas, &err);
    if (own && *own && !reasoning) reasoning = own, own = NULL;
    if (deltas && r->one_call) keep_first_call(deltas, true);
    if (deltas && !cJSON_GetArraySize(deltas)) cJSON_Delete(deltas), deltas = NULL;
    const char *out = !r->chat ? text : c->tools ? plain : content;
    const serve_choice_out d = {.text = out ? out : (deltas ? NULL : ""), .reasoning = reasoning,
                                .tool_calls = deltas, .lp = logprobs_out(r, c, lp, n_lp, &o)};
    if (!rc && (out || reasoning || deltas || n_lp))
        rc = sse_event(r, serve_openai_chunk_json(r->chat, r->id, r->created, model, i, false, &d));
    free(reasoning);
    free(content);
    free(plain);
    free(own);
    cJSON_Delete(deltas);
    if (rc) return -1;
    if (!c->st.done || c->finished) return 0;
    c->finished = true;
    const serve_choice_out end = {.finish = c->st.finish, .called = c->tools && serve_tool_stream_calls(c->tools) > 0,
                                  .lp = logprobs_out(r, c, NULL, 0, &o)};
    return sse_event(r, serve_openai_chunk_json(r->chat, r->id, r->created, model, i, false, &end));
}

/* Choice i's new text and log probabilities kept for the whole response. */
static int keep_choice(api_choice *c, const char *text, size_t n, const serve_logprob *lp, size_t n_lp) {
    if (n && append((uint8_t **)&c->text, &c->text_len, &c->text_cap, 0, text, n)) return -1;
    if (!n_lp) return 0;
    if (c->n_lp + n_lp > c->cap_lp) {
        size_t cap = c->cap_lp ? c->cap_lp : 64;
        while (cap < c->n_lp + n_lp) cap *= 2;
        serve_logprob *grown = realloc(c->lp, cap * sizeof *grown);
        if (!grown) return -1;
        c->lp = grown, c->cap_lp = cap;
    }
    memcpy(c->lp + c->n_lp, lp, n_lp * sizeof *lp);
    c->n_lp += n_lp;
    return 0;
}

/* The request's usage: its prompt once, every choice's tokens. */
static serve_job_state usage_of(const api_req *r) {
    serve_job_state u = r->ch[0].st;
    for (int i = 1; i < r->n_ch; i++) u.n_completion += r->ch[i].st.n_completion;
    return u;
}

/* Every choice done: the whole response, or the stream's usage and end. */
static int finish_response(api_req *r) {
    r->ended = true;
    const serve_job_state u = usage_of(r);
    if (r->stream) {
        if (r->include_usage &&
            sse_event(r, serve_openai_usage_chunk_json(r->chat, r->id, r->created, r->a->cfg.openai.model_id, &u)))
            return -1;
        r->final = true;
        return out_add(r, "data: [DONE]\n\n", 14);
    }
    serve_choice_out out[SERVE_MAX_CHOICES];
    serve_logprobs_out lp[SERVE_MAX_CHOICES];
    char *reasoning[SERVE_MAX_CHOICES] = {0}, *content[SERVE_MAX_CHOICES] = {0}, *plain[SERVE_MAX_CHOICES] = {0};
    cJSON *calls[SERVE_MAX_CHOICES] = {0};
    int rc = 0;
    for (int i = 0; i < r->n_ch; i++) {
        api_choice *c = &r->ch[i];
        size_t rl = 0, cl = 0;
        if (r->chat && serve_reasoning_feed(&c->think, c->text ? c->text : "", c->text_len, true, &reasoning[i], &rl,
                                            &content[i], &cl))
            rc = -1;
        while (rl && (reasoning[i][rl - 1] == '\n' || reasoning[i][rl - 1] == ' ')) reasoning[i][--rl] = '\0';
        if (!rc && r->chat && r->tool_format != SERVE_TOOLS_NONE) {   /* the content's tool calls */
            char prefix[64];
            moex_error err = {0};
            call_id_prefix(r, i, prefix, sizeof prefix);
            char *own = NULL;   /* reasoning in the format's own markup (harmony's analysis channel) */
            if (serve_tool_calls_parse_ex(r->tool_format, r->tools, content[i] ? content[i] : "", cl, prefix,
                                          &plain[i], &own, &calls[i], &err))
                rc = -1;
            else if (r->one_call) keep_first_call(calls[i], false);
            if (own && *own && !reasoning[i]) reasoning[i] = own, own = NULL;
            free(own);
        }
        const char *text = plain[i] ? plain[i] : content[i];
        out[i] = (serve_choice_out){.text = r->chat ? (text ? text : "") : (c->text ? c->text : ""),
                                    .reasoning = reasoning[i], .tool_calls = calls[i],
                                    .called = calls[i] && cJSON_GetArraySize(calls[i]) > 0, .finish = c->st.finish,
                                    .lp = logprobs_out(r, c, c->lp, c->n_lp, &lp[i])};
    }
    if (!rc) rc = respond_json(r, 200, serve_openai_completion_json(r->chat, r->id, r->created,
                                                                    r->a->cfg.openai.model_id, out, r->n_ch, &u));
    for (int i = 0; i < r->n_ch; i++) free(reasoning[i]), free(content[i]), free(plain[i]), cJSON_Delete(calls[i]);
    return rc;
}

/* A choice failed (the engine, a bad prompt, shutting down): every choice
 * stops; before any byte went out a plain error, else an error event. */
static int fail_response(api_req *r, const serve_job_state *st) {
    for (int i = 0; i < r->n_ch; i++) serve_job_cancel(r->ch[i].job);
    r->ended = true;
    serve_api_error e;
    if (!r->status) {
        serve_api_fail(&e, st->http_status, st->http_status < 500 ? "invalid_request_error" : "server_error",
                       st->error_code, st->http_status == 400 ? (r->chat ? "messages" : "prompt") : NULL, "%s",
                       st->error);
        return respond_error(r, &e);
    }
    serve_api_fail(&e, st->http_status, "server_error", st->error_code, NULL, "%s", st->error);
    if (sse_event(r, serve_openai_error_json(&e))) return -1;
    r->final = true;
    return out_add(r, "data: [DONE]\n\n", 14);
}

/* Takes the jobs' new text into the response. */
static int pull_job(api_req *r) {
    int rc = 0;
    bool all_done = true;
    const serve_job_state *failed = NULL;
    for (int i = 0; i < r->n_ch && !rc; i++) {
        api_choice *c = &r->ch[i];
        char *text;
        serve_logprob *lp = NULL;
        /* the log probabilities first: a token's entry is there before its text is */
        const size_t n_lp = serve_job_take_logprobs(c->job, &lp);
        const size_t n = serve_job_take(c->job, &text, &c->st);
        if (c->st.done && c->st.finish == SERVE_FINISH_ERROR) {
            if (!failed) failed = &c->st;
        } else if (!r->stream) {
            rc = keep_choice(c, text, n, lp, n_lp);
        } else if (r->status || c->st.accepted) {
            if (!r->status) {
                r->status = 200;
                r->ctype = "text/event-stream";
                r->length = -1;
                serve_api_count(&r->a->status->api, routes[r->route].endpoint, 200);
            }
            rc = stream_choice(r, i, text, lp, n_lp);
        }
        all_done = all_done && c->st.done;
        free(text);
        free(lp);
    }
    if (rc) return rc;
    if (failed) return fail_response(r, failed);
    return all_done ? finish_response(r) : 0;
}

/* ---- requests ---- */

static void req_free(api_req *r) {
    if (!r) return;
    if (r->n_ch && !r->ended) {
        atomic_fetch_add(&r->a->status->api.disconnects, 1);
        moex_log(MOEX_LOG_INFO, "api: %s: the client left before the end: its slot is freed", r->id);
    }
    for (int i = 0; i < r->n_ch; i++) {
        serve_job_set_user(r->ch[i].job, NULL);
        if (!r->ended) serve_job_cancel(r->ch[i].job);
        serve_job_unref(r->ch[i].job);
        serve_tool_stream_free(r->ch[i].tools);
        free(r->ch[i].text);
        free(r->ch[i].lp);
    }
    cJSON_Delete(r->tools);
    free(r->body);
    free(r->out);
    free(r);
}

static int on_writeable(api_req *r, void **state) {
    r->waiting_since = 0;
    if (r->n_ch && !r->ended && pull_job(r)) return -1;
    if (!r->status) return 0; /* nothing to say yet */
    if (!r->head_sent) {
        if (send_head(r)) return -1;
        r->head_sent = true;
        if (r->out_len || r->final) want_writeable(r);
        return 0;
    }
    if (r->out_len) {
        const size_t n = r->out_len;
        r->out_len = 0;
        if (lws_write(r->wsi, r->out + LWS_PRE, n, r->final ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) < (int)n)
            return -1;
    }
    if (!r->final) return 0;
    /* the response is out: the next request on this connection starts afresh */
    struct lws *wsi = r->wsi;
    const bool close = r->close_after;
    req_free(r);
    *state = NULL;
    return close || lws_http_transaction_completed(wsi) ? -1 : 0;
}

static void notify(void *ctx, serve_job *j) {
    serve_api *a = ctx;
    pthread_mutex_lock(&a->mu);
    bool listed = false;
    for (int i = 0; i < a->n_ready && !listed; i++) listed = a->ready[i] == j;
    if (!listed && a->n_ready == a->cap_ready) {
        const int cap = a->cap_ready ? 2 * a->cap_ready : 16;
        serve_job **grown = realloc(a->ready, (size_t)cap * sizeof *grown);
        if (grown) a->ready = grown, a->cap_ready = cap;
    }
    if (!listed && a->n_ready < a->cap_ready) {
        serve_job_ref(j);
        a->ready[a->n_ready++] = j;
    }
    struct lws_context *lc = a->ctx;
    pthread_mutex_unlock(&a->mu);
    if (lc) lws_cancel_service(lc);
}

/* Network thread, after a wake-up: the ready jobs' connections get a
 * writeable callback; a client that has not been writeable for too long is
 * not reading, and is dropped. */
static void service(void *ctx) {
    serve_api *a = ctx;
    pthread_mutex_lock(&a->mu);
    serve_job **ready = a->ready;
    const int n = a->n_ready;
    a->ready = NULL;
    a->n_ready = a->cap_ready = 0;
    pthread_mutex_unlock(&a->mu);
    const double now = moex_time_s();
    for (int i = 0; i < n; i++) {
        api_req *r = serve_job_user(ready[i]);
        if (r && r->waiting_since && now - r->waiting_since > a->cfg.client_timeout_s) {
            moex_log(MOEX_LOG_INFO, "api: %s: the client read nothing for %.0f s: dropped", r->id,
                     now - r->waiting_since);
            for (int k = 0; k < r->n_ch; k++) serve_job_cancel(r->ch[k].job);
            lws_set_timeout(r->wsi, PENDING_TIMEOUT_HTTP_CONTENT, LWS_TO_KILL_ASYNC);
        } else if (r) {
            want_writeable(r);
        }
        serve_job_unref(ready[i]);
    }
    free(ready);
}

static int bad_method(api_req *r) {
    serve_api_error e;
    serve_api_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s takes %s", routes[r->route].path,
                 routes[r->route].method == LWSHUMETH_POST ? "POST" : "GET");
    return respond_error(r, &e);
}

static int refuse(api_req *r) {
    uint32_t suppressed = 0;
    if (hub_log_limit_take(&r->a->refusals, moex_time_s(), &suppressed)) {
        char peer[64] = "?";
        lws_get_peer_simple(r->wsi, peer, sizeof peer);
        moex_log(MOEX_LOG_WARN, "api: %s %s -> 401: wrong or missing API key%s", peer, routes[r->route].path,
                 suppressed ? " (and more refusals not logged)" : "");
    }
    serve_api_error e;
    serve_api_fail(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
                 "Incorrect or missing API key: send it as 'Authorization: Bearer KEY'");
    return respond_json(r, 401, serve_openai_error_json(&e));
}

/* POST /tokenize, /detokenize (the model's tokenizer) and /apply-template (the chat template): answered on this
 * thread. */
static int respond_tokens(api_req *r) {
    serve_api_error e;
    const moex_model *m = r->a->status->m;
    const char *body = r->body ? r->body : "";
    char *json = r->route == R_TOKENIZE     ? serve_tokenize_json(m, body, r->body_len, &e)
                 : r->route == R_DETOKENIZE ? serve_detokenize_json(m, body, r->body_len, &e)
                                            : serve_apply_template_json(&r->a->cfg.openai, body, r->body_len, &e);
    return json ? respond_json(r, 200, json) : respond_error(r, &e);
}

/* The request's n choices, a job each (the later ones get their own copies and the next seeds), submitted. */
static int start_generation(api_req *r) {
    serve_api *a = r->a;
    if (r->route == R_TOKENIZE || r->route == R_DETOKENIZE || r->route == R_APPLY_TEMPLATE) return respond_tokens(r);
    if (r->n_ch) return 0; /* one generation a request */
    const bool chat = r->route == R_CHAT;
    serve_api_request req;
    serve_api_error e;
    const uint64_t no = ++a->n_requests;
    if (serve_openai_parse(&a->cfg.openai, chat, r->body ? r->body : "", r->body_len, no, &req, &e))
        return respond_error(r, &e);
    r->chat = chat;
    r->stream = req.stream;
    r->include_usage = req.include_usage;
    r->logprobs = req.job.logprobs;
    r->tool_format = req.tool_format;
    r->one_call = req.one_call;
    r->tools = req.tools;   /* the request's from here */
    req.tools = NULL;
    r->created = (long long)time(NULL);
    snprintf(r->id, sizeof r->id, "%s-%llx%04llx", chat ? "chatcmpl" : "cmpl", r->created, (unsigned long long)no);
    serve_job_params params[SERVE_MAX_CHOICES];
    params[0] = req.job;
    int n = 1;
    for (; n < req.n && !serve_job_params_clone(&req.job, &params[n]); n++) params[n].sp.seed = req.job.sp.seed + n;
    bool oom = n < req.n;
    for (int i = 0; i < n; i++) {   /* every params' buffers go to a job, or are freed by serve_job_create */
        serve_job *job = serve_job_create(&params[i], notify, a);
        if (!job) oom = true;
        else r->ch[r->n_ch++].job = job, serve_job_set_user(job, r);
    }
    for (int i = 0; i < r->n_ch && r->stream && r->tool_format != SERVE_TOOLS_NONE; i++) {
        char prefix[64];
        call_id_prefix(r, i, prefix, sizeof prefix);
        if (!(r->ch[i].tools = serve_tool_stream_create_ex(r->tool_format, prefix, r->tools))) oom = true;
    }
    if (oom) {
        r->ended = true;
        return respond_error(r, (serve_api_fail(&e, 500, "server_error", NULL, NULL, "out of memory"), &e));
    }
    moex_error err = {0};
    serve_sched *sched = atomic_load(&a->sched);
    if (!sched) moex_fail(&err, "the server is starting (waiting for workers): try again shortly");
    for (int i = 0; i < r->n_ch && sched; i++)
        if (serve_sched_submit(sched, r->ch[i].job, &err)) sched = NULL;
    if (!sched) {
        r->ended = true;   /* the submitted ones are cancelled with the request */
        for (int i = 0; i < r->n_ch; i++) serve_job_cancel(r->ch[i].job);
        serve_api_fail(&e, 503, "server_error", "server_busy", NULL, "%s", err.msg);
        return respond_error(r, &e);
    }
    return 0;
}

/* 200 only when a request would be served now: 503 with the reason while
 * the weights are read or workers awaited, and while some expert has no
 * live replica and the hub may not compute it itself. */
static int respond_health(api_req *r) {
    serve_api *a = r->a;
    char why[256];
    const char *status = "ok";
    if (!atomic_load(&a->sched)) {
        const char *phase = atomic_load(&a->phase);
        status = "loading";
        snprintf(why, sizeof why, "%s", phase ? phase : "starting");
    } else if (a->status->hub && !moex_hub_can_serve(a->status->hub, why, sizeof why)) {
        status = "unavailable";
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", status);
    if (strcmp(status, "ok")) cJSON_AddStringToObject(root, "reason", why);
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return respond_json(r, strcmp(status, "ok") ? 503 : 200, json); /* cJSON allocates with malloc */
}

static int respond_static(api_req *r) {
    serve_status_src *st = r->a->status;
    char *s;
    size_t n;
    switch (r->route) {
    case R_PAGE: {
        const char *page = serve_status_page(&n);
        return respond(r, 200, "text/html; charset=utf-8", page, n);
    }
    case R_HEALTH: return respond_health(r);
    case R_METRICS: {
        if (!(s = serve_status_metrics(st, &n))) return respond(r, 500, "text/plain", "out of memory\n", 14);
        const int rc = respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", s, n);
        free(s);
        return rc;
    }
    case R_STATUS: return respond_json(r, 200, serve_status_json(st));
    case R_MODELS:
        return respond_json(r, 200, serve_openai_models_json(r->a->cfg.openai.model_id, (long long)time(NULL), false));
    default: return -1;
    }
}

static int model_by_id(api_req *r, const char *uri) {
    const char *id = uri + strlen(routes[R_MODEL].path);
    if (strcmp(id, r->a->cfg.openai.model_id)) {
        serve_api_error e;
        serve_api_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
                     "The model '%.200s' does not exist; this server serves '%.200s'", id, r->a->cfg.openai.model_id);
        return respond_error(r, &e);
    }
    return respond_json(r, 200, serve_openai_models_json(id, (long long)time(NULL), true));
}

/* The path of a request and its method (LWSHUMETH_*), or -1. */
static int method_and_path(struct lws *wsi, char *path, size_t cap) {
    char *uri;
    int len;
    const int m = lws_http_get_uri_and_method(wsi, &uri, &len);
    if (m < 0 || len <= 0 || (size_t)len >= cap) return -1;
    memcpy(path, uri, (size_t)len);
    path[len] = '\0';
    return m;
}

/* The hub's own paths under /v1/ (expert weights for workers, hub/http_weights.c): never the API's. */
static bool hub_path(const char *path) { return !strcmp(path, "/v1/model") || !strncmp(path, "/v1/expert/", 11); }

static int route_of(const char *path) {
    if (hub_path(path)) return -1;
    for (int i = 0; i < R_COUNT; i++)
        if (i == R_MODEL || i == R_V1_OTHER
                ? !strncmp(path, routes[i].path, strlen(routes[i].path)) && path[strlen(routes[i].path)]
                : !strcmp(path, routes[i].path))
            return i;
    return -1;
}

/* A path under /v1/ this server does not serve (/v1/embeddings, ...): OpenAI's error JSON, 404. */
static int unknown_v1(api_req *r, const char *path) {
    serve_api_error e;
    serve_api_fail(&e, 404, "invalid_request_error", "unknown_url", NULL,
                   "%.200s is not served here: this server has /v1/chat/completions, /v1/completions and /v1/models "
                   "(docs/API.md)", path);
    return respond_error(r, &e);
}

static bool claims(void *ctx, struct lws *wsi) {
    char path[512];
    return method_and_path(wsi, path, sizeof path) >= 0 && route_of(path) >= 0;
}

static size_t content_length(struct lws *wsi, bool *known) {
    char v[32];
    *known = lws_hdr_copy(wsi, v, sizeof v, WSI_TOKEN_HTTP_CONTENT_LENGTH) > 0;
    return *known ? (size_t)strtoull(v, NULL, 10) : 0;
}

/* A POST's framing: a Content-Length within the limit and no
 * Transfer-Encoding (libwebsockets does not decode chunked request bodies,
 * and a request with both is ambiguous: RFC 9112 6.3 lets a server refuse
 * it). 0, or the error to answer (the connection then closes). */
static int check_body_framing(serve_api *a, struct lws *wsi, serve_api_error *e) {
    bool known;
    const size_t n = content_length(wsi, &known);
    const bool chunked = lws_hdr_total_length(wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING) > 0;
    if (chunked && known)
        return serve_api_fail(e, 400, "invalid_request_error", "bad_framing", NULL,
                            "the request has both Content-Length and Transfer-Encoding: send only Content-Length");
    if (!known)
        return serve_api_fail(e, 411, "invalid_request_error", "length_required", NULL,
                            "send the body with a Content-Length (chunked request bodies are not supported)");
    if (n > a->cfg.max_body)
        return serve_api_fail(e, 413, "invalid_request_error", "request_too_large", NULL,
                            "the request body is %zu bytes; this server takes at most %zu", n, a->cfg.max_body);
    return 0;
}

/* The key is checked on the headers, before anything else is looked at or
 * read: a client without it costs no body buffer and no log line beyond the
 * rate-limited refusal. CORS preflights carry no credentials. */
static int on_request(serve_api *a, struct lws *wsi, api_req *r) {
    char path[512];
    const int method = method_and_path(wsi, path, sizeof path);
    r->route = (route)route_of(path);
    if (method == LWSHUMETH_OPTIONS) return respond(r, HTTP_STATUS_NO_CONTENT, "text/plain", "", 0);
    const bool body = method == LWSHUMETH_POST || lws_hdr_total_length(wsi, WSI_TOKEN_HTTP_CONTENT_LENGTH) > 0 ||
                      lws_hdr_total_length(wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING) > 0;
    if (routes[r->route].auth && !hub_auth_ok(wsi, a->cfg.api_key)) {
        r->close_after = body; /* its body stays unread */
        return refuse(r);
    }
    if (r->route == R_V1_OTHER) {
        r->close_after = body; /* its body stays unread */
        return unknown_v1(r, path);
    }
    if (method != routes[r->route].method) {
        r->close_after = body;
        return bad_method(r);
    }
    if (method == LWSHUMETH_POST) {
        serve_api_error e;
        if (check_body_framing(a, wsi, &e)) {
            r->close_after = true;
            return respond_error(r, &e);
        }
        bool known;
        if (content_length(wsi, &known) > 0) return 0; /* the body follows */
        r->body_done = true;
        return start_generation(r);
    }
    if (r->route == R_MODEL) return model_by_id(r, path);
    return respond_static(r);
}

/* A body that grows past its Content-Length's check (it cannot: lws stops
 * at the length) or the limit is answered at once and the connection closed. */
static int on_body(serve_api *a, api_req *r, const void *in, size_t len) {
    if (r->status || r->body_done) return 0; /* answered already (413), or bytes after the body: dropped */
    if (r->body_len + len > a->cfg.max_body) {
        free(r->body);
        r->body = NULL;
        serve_api_error e;
        serve_api_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
                     "the request body is over %zu bytes, this server's limit", a->cfg.max_body);
        r->close_after = true;
        return respond_error(r, &e);
    }
    char *grown = realloc(r->body, r->body_len + len + 1);
    if (!grown) return -1;
    memcpy(grown + r->body_len, in, len);
    r->body = grown;
    r->body_len += len;
    r->body[r->body_len] = '\0';
    return 0;
}

/* libwebsockets may report the end of the body again when more bytes follow
 * it in the same read (a stray CRLF, a pipelined request): the request is
 * started once. */
static int on_body_done(serve_api *a, api_req *r) {
    (void)a;
    if (r->status || r->body_done) return 0;
    r->body_done = true;
    return start_generation(r);
}

static int callback(void *ctx, struct lws *wsi, enum lws_callback_reasons reason, void **state, void *in,
                    size_t len) {
    serve_api *a = ctx;
    api_req *r = *state;
    switch (reason) {
    case LWS_CALLBACK_HTTP:
        req_free(r); /* a keep-alive connection's previous request, if it never ended */
        if (!(r = *state = calloc(1, sizeof *r))) return -1;
        r->a = a;
        r->wsi = wsi;
        pthread_mutex_lock(&a->mu);
        a->ctx = lws_get_context(wsi);
        pthread_mutex_unlock(&a->mu);
        return on_request(a, wsi, r) ? -1 : 0;
    case LWS_CALLBACK_HTTP_BODY: return r && on_body(a, r, in, len) ? -1 : 0;
    case LWS_CALLBACK_HTTP_BODY_COMPLETION: return r && on_body_done(a, r) ? -1 : 0;
    case LWS_CALLBACK_HTTP_WRITEABLE: return r ? on_writeable(r, state) : 0;
    case LWS_CALLBACK_CLOSED_HTTP:
    case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
        req_free(r);
        *state = NULL;
        return 0;
    default: return 0;
    }
}

serve_api *serve_api_create(const serve_api_config *cfg, serve_status_src *status, moex_error *err) {
    serve_api *a = calloc(1, sizeof *a);
    if (!a) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    a->cfg = *cfg;
    if (a->cfg.api_key && !*a->cfg.api_key) a->cfg.api_key = NULL;
    if (a->cfg.client_timeout_s <= 0) a->cfg.client_timeout_s = 30;
    atomic_init(&a->sched, NULL);
    atomic_init(&a->phase, NULL);
    a->status = status;
    pthread_mutex_init(&a->mu, NULL);
    a->handler = (hub_http_handler){.ctx = a, .claims = claims, .callback = callback, .service = service};
    return a;
}

const hub_http_handler *serve_api_handler(serve_api *a) { return &a->handler; }

void serve_api_set_scheduler(serve_api *a, serve_sched *sched) { atomic_store(&a->sched, sched); }

void serve_api_set_phase(serve_api *a, const char *phase) { atomic_store(&a->phase, phase); }

void serve_api_free(serve_api *a) {
    if (!a) return;
    for (int i = 0; i < a->n_ready; i++) serve_job_unref(a->ready[i]);
    free(a->ready);
    pthread_mutex_destroy(&a->mu);
    free(a);
}
