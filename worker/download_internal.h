/* Private to the expert download (worker/download*.c): the HTTP client, the
 * hub's model description and the progress display. The store itself
 * (download.c) is the public face, in worker.h. */
#ifndef MOEX_WORKER_DOWNLOAD_INTERNAL_H
#define MOEX_WORKER_DOWNLOAD_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "worker/worker.h"

/* ---- download_http.c: HTTP GETs to the hub through a libwebsockets client.
 * One request at a time, on the calling thread. ---- */

typedef struct dl_http dl_http;

/* What the response's head said. Numbers are -1 when the header was absent. */
typedef struct dl_response {
    int status;
    int64_t content_length;
    int64_t range_first, range_total;   /* Content-Range: bytes first-last/total */
    bool has_hash;
    uint64_t hash;                      /* X-MoEx-Hash */
    char text[256];                     /* body of an error status (>= 400), for messages */
} dl_response;

typedef struct dl_request {
    const char *path;                   /* "/v1/model", "/v1/expert/3/17" */
    int64_t range_first, range_last;    /* Range: bytes=first-[last]; first < 0: none, last < 0: open */
    /* Called once the head is in (not for error statuses); nonzero aborts. */
    int (*on_head)(void *ctx, const dl_response *r, moex_error *err);
    /* Body bytes of a successful status; nonzero aborts. */
    int (*on_body)(void *ctx, const void *data, size_t len, moex_error *err);
    /* Polled every 100 ms: true abandons the request (DL_STOPPED). */
    bool (*stop)(void *ctx);
    void *ctx;
} dl_request;

enum {
    DL_OK = 0,
    DL_FAILED = -1,     /* a callback refused, or out of memory: err says why; do not retry */
    DL_NETWORK = -2,    /* connection failed, closed early or stalled: err says why; worth a retry */
    DL_STOPPED = 1,     /* req->stop said so */
};

/* o->hub_url: the worker's ws[s]://HOST:PORT/... (HTTP goes to the same
 * host and port, http[s]://, with o's TLS checks); o->token: sent as
 * Authorization: Bearer. */
dl_http *dl_http_create(const moex_worker_options *o, moex_error *err);
void dl_http_free(dl_http *h);
/* The hub's address for messages: "http://HOST:PORT". */
const char *dl_http_base(const dl_http *h);
/* One GET. DL_OK means a complete response of any status (in *resp). */
int dl_http_get(dl_http *h, const dl_request *req, dl_response *resp, moex_error *err);

/* ---- download_model.c: GET /v1/model into a model skeleton ---- */

/* The hub's description of its model: hparams (shape fields only) and
 * layers whose experts have their matrices' type and shape set and data
 * NULL (bound once downloaded). */
typedef struct dl_model {
    moex_model m;
    uint64_t model_hash;
    char hash_hex[17];
    size_t *expert_bytes;               /* n_layers x n_experts */
} dl_model;

/* Parses the JSON of /v1/model, checking every number and that the matrices
 * fit together (gate/up: n_ff_exp x n_embd, down: n_embd x n_ff_exp). */
int dl_model_parse(dl_model *dm, const char *json, size_t len, moex_error *err);
void dl_model_free(dl_model *dm);
/* Only the model_hash of a /v1/model answer. */
int dl_model_hash(const char *json, size_t len, uint64_t *hash, moex_error *err);

/* ---- download_progress.c: bytes done / total, MB/s, ETA on stderr ----
 * A redrawn bar when stderr is a terminal, else a log line per 10 %. */

typedef struct dl_progress {
    uint64_t total, done;
    int n_items, n_done;
    double t0, last_draw_s;
    int last_decile;
    bool tty, drawn;
} dl_progress;

void dl_progress_start(dl_progress *p, uint64_t total, int n_items);
void dl_progress_add(dl_progress *p, uint64_t bytes);
/* A re-download after a hash mismatch: more to do than announced. */
void dl_progress_grow(dl_progress *p, uint64_t bytes);
void dl_progress_item_done(dl_progress *p);
/* Clears the bar (the caller logs the summary). */
void dl_progress_end(dl_progress *p);

#endif
