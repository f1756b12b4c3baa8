/* Private to the hub: HTTP on the hub's port: expert weights for workers
 * without their own copy of the model (http_weights.c), the browser worker
 * page (http_static.c), and the hook another service plugs in (the API). */
#ifndef MOEX_HUB_HTTP_H
#define MOEX_HUB_HTTP_H

#include <libwebsockets.h>

#include "hub/auth.h"
#include "hub/metrics.h"
#include "model/model.h"

typedef struct hub_http {
    const moex_model *m;
    uint64_t model_hash;
    const char *token;        /* the workers' token: the only credential for the weights */
    bool no_weights;          /* --local: no workers, so no weights are served */
    hub_metrics *metrics;
    hub_log_limit refusals;   /* network thread only: 403s logged */
    hub_log_limit errors;     /* network thread only: other errors logged */
} hub_http;

/* Another HTTP service on the same port (the OpenAI API and status page,
 * serve/api.c): the server offers it each request first; the requests it
 * claims (by method and path) are its own to the end, the rest go to the
 * expert-weights handler below. Everything runs on the network thread. */
typedef struct hub_http_handler {
    void *ctx;
    bool (*claims)(void *ctx, struct lws *wsi);
    /* As hub_http_callback, for the requests it claimed. */
    int (*callback)(void *ctx, struct lws *wsi, enum lws_callback_reasons reason, void **state, void *in, size_t len);
    /* Each time another thread woke the network thread (lws_cancel_service). */
    void (*service)(void *ctx);
} hub_http_handler;

/* OpenAI's error JSON, {"error": {"message", "type", "param", "code"}}, for
 * any HTTP error of the hub: the type follows the status, the message is
 * made valid UTF-8 (malloc'd; NULL when out of memory). */
char *hub_http_error_json(unsigned status, const char *code, const char *message);
/* Answers the request with that error at once (a small body written with its
 * head). 0, or -1 when it could not be written; either way the caller then
 * ends the transaction or closes the connection. */
int hub_http_answer_error(struct lws *wsi, unsigned status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The HTTP callbacks of one connection; *state is per-request, owned here. */
int hub_http_callback(hub_http *h, struct lws *wsi, enum lws_callback_reasons reason, void **state, void *in,
                      size_t len);

/* The browser worker page: a directory's files at /worker/ (/worker
 * redirects there), for GET and HEAD, without a token. */
typedef struct hub_static hub_static;
hub_static *hub_static_create(const char *dir, moex_error *err);
void hub_static_free(hub_static *s);
const char *hub_static_dir(const hub_static *s);   /* its real path */
/* Whether the request is the page's: GET or HEAD on /worker or /worker/... */
bool hub_static_claims(struct lws *wsi);
/* Answers a claimed request (the file, or 404): an lws callback's return. */
int hub_static_serve(hub_static *s, struct lws *wsi);
/* The Content-Type of a file name, by its extension. */
const char *hub_static_mime_type(const char *path);

#endif
