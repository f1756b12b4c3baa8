/* Expert weights over plain HTTP on the hub's port, for workers without
 * their own copy of the model (worker/download*.c, docs/PROTOCOL.md):
 *
 *   GET /v1/model              JSON: identity, shape, per-layer matrix types and byte sizes
 *   GET /v1/expert/<L>/<E>     the expert's gate, up and down bytes concatenated, with
 *                              X-MoEx-Hash: XXH3-64 of them; "Range: bytes=N-[M]" gives 206
 *
 * Same token as the WebSocket (?token= or Authorization: Bearer): a wrong
 * one gets 403; a hub without workers (--local) serves no weights. Errors,
 * and any other path, get OpenAI's error JSON. libwebsockets does the HTTP;
 * this file only routes and writes bodies, one chunk per HTTP_WRITEABLE,
 * straight from the model's
 * mapping, so a slow client never holds the network thread. Runs on that
 * thread only: the model is read-only, the hash cache is the network thread's.
 *
 * A client that stops reading: libwebsockets 4.1 polls without waiting for
 * as long as a connection has pipelined requests buffered and the answer in
 * progress is unfinished, so one client that pipelines GETs and reads
 * nothing would pin the network thread. An answer that cannot progress for
 * STALL_AFTER_MS therefore waits with the connection's input switched off
 * (rx flow control: lws then leaves the connection alone) and a timer that
 * looks at the socket every STALL_POLL_MS, until it drains or CLIENT_IDLE_S. */
#include <errno.h>
#include <stdarg.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "common/unicode.h"
#include "hub/http.h"

#define BODY_CHUNK (256 * 1024)
#define CLIENT_IDLE_S 30      /* a client that reads nothing for this long is dropped */
#define STALL_AFTER_MS 20     /* no WRITEABLE for this long: the client is not reading */
#define STALL_POLL_MS 50      /* how often a stalled answer looks at its socket */

/* One request being answered. The body is up to three segments of the
 * mapping (an expert's matrices) or one owned buffer (JSON, error text). */
typedef struct http_req {
    const uint8_t *seg[3];
    size_t seg_len[3];
    int n_seg, cur;
    size_t off;            /* into seg[cur] */
    size_t left;           /* body bytes still to write */
    uint8_t *owned;        /* LWS_PRE headroom, then the body */
    bool stalled;          /* the connection's input is off until its socket has room */
} http_req;

/* XXH3 of each expert, computed on first request: workers probe their
 * cached files with a 1-byte range, which must not rehash every time.
 * Lives in lws's per-vhost storage for the protocol, freed with the vhost. */
typedef struct hash_cache {
    int n;
    struct { uint64_t hash; uint8_t known; } e[];
} hash_cache;

static void req_free(http_req *r) {
    if (!r) return;
    free(r->owned);
    free(r);
}

/* Asks for the next HTTP_WRITEABLE, with a timer in case it does not come. */
static void want_writable(struct lws *wsi) {
    lws_callback_on_writable(wsi);
    lws_set_timer_usecs(wsi, (lws_usec_t)STALL_AFTER_MS * LWS_US_PER_MS);
}

/* ---- request checks ---- */

/* Parses a decimal id of 1..9 digits ending at *end or '/'; advances *p. */
static bool parse_id(const char **p, int *out) {
    const char *s = *p;
    long v = 0;
    int n = 0;
    while (*s >= '0' && *s <= '9' && n < 9) v = v * 10 + (*s++ - '0'), n++;
    if (n == 0 || (*s >= '0' && *s <= '9')) return false;
    *out = (int)v;
    *p = s;
    return true;
}

/* "/v1/expert/L/E" -> 1 with ids, 0 for another path, -1 when malformed. */
static int parse_expert_path(const char *uri, int *layer, int *expert) {
    static const char prefix[] = "/v1/expert/";
    if (strncmp(uri, prefix, sizeof prefix - 1)) return 0;
    const char *p = uri + sizeof prefix - 1;
    if (!parse_id(&p, layer) || *p++ != '/' || !parse_id(&p, expert) || *p) return -1;
    return 1;
}

/* "bytes=N-" or "bytes=N-M" (one range). 0 ok, -1 malformed. to = -1: open. */
static int parse_range(const char *v, int64_t *from, int64_t *to) {
    if (strncmp(v, "bytes=", 6)) return -1;
    char *end;
    errno = 0;
    const char *s = v + 6;
    if (*s < '0' || *s > '9') return -1;
    unsigned long long a = strtoull(s, &end, 10);
    if (errno || *end != '-' || a > INT64_MAX) return -1;
    s = end + 1;
    *from = (int64_t)a;
    *to = -1;
    if (!*s) return 0;
    if (*s < '0' || *s > '9') return -1;
    unsigned long long b = strtoull(s, &end, 10);
    if (errno || *end || b > INT64_MAX || b < a) return -1; /* M < N is no range (RFC 9110 14.1.1) */
    *to = (int64_t)b;
    return 0;
}

/* ---- responses ---- */

/* Writes the status line and headers; the body follows on HTTP_WRITEABLE. */
static int send_head(struct lws *wsi, unsigned status, const char *ctype, size_t len, const char *hash_hex,
                     const char *content_range) {
    uint8_t buf[LWS_PRE + 1024], *start = buf + LWS_PRE, *p = start, *end = buf + sizeof buf - 1;
    if (lws_add_http_common_headers(wsi, status, ctype, (lws_filepos_t)len, &p, end)) return -1;
    if (hash_hex && lws_add_http_header_by_name(wsi, (const unsigned char *)"x-moex-hash:",
                                                (const unsigned char *)hash_hex, (int)strlen(hash_hex), &p, end))
        return -1;
    if (content_range && lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CONTENT_RANGE,
                                                      (const unsigned char *)content_range,
                                                      (int)strlen(content_range), &p, end))
        return -1;
    if (lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_ACCEPT_RANGES, (const unsigned char *)"bytes", 5, &p, end))
        return -1;
    if (lws_finalize_write_http_header(wsi, start, &p, end)) return -1;
    want_writable(wsi);
    return 0;
}

/* An owned body (JSON or text); takes text's bytes. */
static int respond_owned(struct lws *wsi, http_req *r, unsigned status, const char *ctype, const char *text,
                         const char *content_range) {
    const size_t n = strlen(text);
    if (!(r->owned = malloc(LWS_PRE + n + 1))) return -1;
    memcpy(r->owned + LWS_PRE, text, n);
    r->left = n;
    r->off = 0;
    r->n_seg = 0;
    return send_head(wsi, status, ctype, n, NULL, content_range);
}

/* An error (OpenAI's error JSON), logged at most a few times a second (a
 * flood of bad requests must not become a flood of log lines): refusals at
 * warn, the rest at info (bad requests are the client's problem). */
static int respond_error(hub_http *h, struct lws *wsi, http_req *r, unsigned status, const char *uri,
                         const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int respond_error(hub_http *h, struct lws *wsi, http_req *r, unsigned status, const char *uri,
                         const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    uint32_t suppressed = 0;
    hub_log_limit *limit = status == HTTP_STATUS_FORBIDDEN ? &h->refusals : &h->errors;
    if (hub_log_limit_take(limit, moex_time_s(), &suppressed)) {
        char peer[64] = "?", shown[256];
        lws_get_peer_simple(wsi, peer, sizeof peer);
        moex_utf8_sanitize(uri, strlen(uri), shown, sizeof shown);
        moex_log(status == HTTP_STATUS_FORBIDDEN ? MOEX_LOG_WARN : MOEX_LOG_INFO, "http: %s GET %s -> %u: %s%s", peer,
                 shown, status, msg, suppressed ? " (and more not logged)" : "");
    }
    char *json = hub_http_error_json(status, NULL, msg);
    if (!json) return -1;
    const int rc = respond_owned(wsi, r, status, "application/json", json, NULL);
    cJSON_free(json);
    return rc;
}

/* A wrong or missing token: 403. */
static int respond_refused(hub_http *h, struct lws *wsi, http_req *r, const char *uri) {
    HUB_COUNT(h->metrics, refused);
    return respond_error(h, wsi, r, HTTP_STATUS_FORBIDDEN, uri,
                         "wrong or missing token: pass the workers' token as ?token=T or Authorization: Bearer T");
}

/* ---- /v1/model ---- */

static cJSON *matrix_json(const moex_matrix *m) {
    const moex_type_traits *tt = moex_type_get(m->type);
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "type", tt ? tt->name : "?");
    cJSON_AddNumberToObject(o, "rows", (double)m->rows);
    cJSON_AddNumberToObject(o, "cols", (double)m->cols);
    cJSON_AddNumberToObject(o, "bytes", (double)((size_t)m->rows * m->row_bytes));
    return o;
}

static size_t matrix_bytes(const moex_matrix *m) { return (size_t)m->rows * m->row_bytes; }

static size_t expert_bytes(const moex_expert_weights *w) {
    return matrix_bytes(&w->gate) + matrix_bytes(&w->up) + matrix_bytes(&w->down);
}

static bool same_layout(const moex_matrix *a, const moex_matrix *b) {
    return a->type == b->type && a->rows == b->rows && a->cols == b->cols;
}

/* gate, up, down and their total; the caller adds it to a layer or an expert entry. */
static void add_expert_json(cJSON *o, const moex_expert_weights *w) {
    cJSON_AddItemToObject(o, "gate", matrix_json(&w->gate));
    cJSON_AddItemToObject(o, "up", matrix_json(&w->up));
    cJSON_AddItemToObject(o, "down", matrix_json(&w->down));
    cJSON_AddNumberToObject(o, "expert_bytes", (double)expert_bytes(w));
}

/* A layer: its experts' common layout, or (older files with a tensor per
 * expert, which may differ) one entry per expert under "experts". */
static cJSON *layer_json(const moex_layer *L, int n_experts) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    add_expert_json(o, &L->experts[0]);
    bool uniform = true;
    for (int e = 1; e < n_experts && uniform; e++)
        uniform = same_layout(&L->experts[e].gate, &L->experts[0].gate) &&
                  same_layout(&L->experts[e].up, &L->experts[0].up) &&
                  same_layout(&L->experts[e].down, &L->experts[0].down);
    if (!uniform) {
        cJSON *arr = cJSON_AddArrayToObject(o, "experts");
        for (int e = 0; e < n_experts; e++) {
            cJSON *x = cJSON_CreateObject();
            add_expert_json(x, &L->experts[e]);
            cJSON_AddItemToArray(arr, x);
        }
    }
    return o;
}

static char *model_json(const hub_http *h) {
    const moex_hparams *hp = &h->m->hp;
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h->model_hash);
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "model_hash", hex);
    cJSON_AddStringToObject(root, "arch", hp->arch_name);
    cJSON_AddNumberToObject(root, "n_layers", hp->n_layer);
    cJSON_AddNumberToObject(root, "n_experts", hp->n_expert);
    cJSON_AddNumberToObject(root, "n_expert_used", hp->n_expert_used);
    cJSON_AddNumberToObject(root, "n_embd", hp->n_embd);
    cJSON_AddNumberToObject(root, "n_ff_exp", hp->n_ff_exp);
    cJSON *layers = cJSON_AddArrayToObject(root, "layers");
    for (int l = 0; l < hp->n_layer; l++) cJSON_AddItemToArray(layers, layer_json(&h->m->layers[l], hp->n_expert));
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static int serve_model(hub_http *h, struct lws *wsi, http_req *r, const char *uri) {
    char *json = model_json(h);
    if (!json) return respond_error(h, wsi, r, HTTP_STATUS_INTERNAL_SERVER_ERROR, uri, "out of memory");
    int rc = respond_owned(wsi, r, HTTP_STATUS_OK, "application/json", json, NULL);
    cJSON_free(json);
    return rc;
}

/* ---- /v1/expert/L/E ---- */

static hash_cache *hashes(hub_http *h, struct lws *wsi) {
    struct lws_vhost *vh = lws_get_vhost(wsi);
    const struct lws_protocols *prot = lws_get_protocol(wsi);
    hash_cache *c = lws_protocol_vh_priv_get(vh, prot);
    if (c) return c;
    const int n = h->m->hp.n_layer * h->m->hp.n_expert;
    c = lws_protocol_vh_priv_zalloc(vh, prot, (int)(sizeof *c + (size_t)n * sizeof c->e[0]));
    if (c) c->n = n;
    return c;
}

static uint64_t expert_hash(hub_http *h, struct lws *wsi, int layer, int expert) {
    hash_cache *c = hashes(h, wsi);
    const size_t i = (size_t)layer * (size_t)h->m->hp.n_expert + (size_t)expert;
    if (c && c->e[i].known) return c->e[i].hash;
    const moex_expert_weights *w = &h->m->layers[layer].experts[expert];
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, w->gate.data, matrix_bytes(&w->gate));
    XXH3_64bits_update(&st, w->up.data, matrix_bytes(&w->up));
    XXH3_64bits_update(&st, w->down.data, matrix_bytes(&w->down));
    const uint64_t hash = XXH3_64bits_digest(&st);
    if (c) c->e[i].hash = hash, c->e[i].known = 1;
    return hash;
}

/* Points the body at bytes [from, from + len) of the three matrices. */
static void set_expert_body(http_req *r, const moex_expert_weights *w, size_t from, size_t len) {
    const moex_matrix *m[3] = {&w->gate, &w->up, &w->down};
    r->n_seg = 3;
    for (int i = 0; i < 3; i++) r->seg[i] = m[i]->data, r->seg_len[i] = matrix_bytes(m[i]);
    r->cur = 0;
    while (r->cur < 2 && from >= r->seg_len[r->cur]) from -= r->seg_len[r->cur++];
    r->off = from;
    r->left = len;
}

static int serve_expert(hub_http *h, struct lws *wsi, http_req *r, const char *uri, int layer, int expert) {
    if (layer >= h->m->hp.n_layer || expert >= h->m->hp.n_expert)
        return respond_error(h, wsi, r, HTTP_STATUS_NOT_FOUND, uri,
                             "no expert (%d, %d): the model has %d layers x %d experts", layer, expert,
                             h->m->hp.n_layer, h->m->hp.n_expert);
    const moex_expert_weights *w = &h->m->layers[layer].experts[expert];
    const size_t total = expert_bytes(w);
    int64_t from = 0, to = (int64_t)total - 1;
    char range[256] = "", crange[96];
    const bool ranged = lws_hdr_copy(wsi, range, sizeof range, WSI_TOKEN_HTTP_RANGE) > 0;
    if (ranged) {
        if (parse_range(range, &from, &to))
            return respond_error(h, wsi, r, HTTP_STATUS_BAD_REQUEST, uri,
                                 "bad Range '%.100s' (want bytes=N- or bytes=N-M, M >= N)", range);
        if (to < 0 || to >= (int64_t)total) to = (int64_t)total - 1;
        if (from >= (int64_t)total || to < from) {
            snprintf(crange, sizeof crange, "bytes */%zu", total);
            moex_log(MOEX_LOG_INFO, "http: GET %s: range %s not satisfiable (%zu bytes)", uri, range, total);
            return respond_owned(wsi, r, HTTP_STATUS_REQ_RANGE_NOT_SATISFIABLE, "text/plain", "range not satisfiable\n",
                                 crange);
        }
        snprintf(crange, sizeof crange, "bytes %lld-%lld/%zu", (long long)from, (long long)to, total);
    }
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)expert_hash(h, wsi, layer, expert));
    const size_t len = (size_t)(to - from + 1);
    set_expert_body(r, w, (size_t)from, len);
    char peer[64] = "?";
    lws_get_peer_simple(wsi, peer, sizeof peer);
    /* resumed downloads are worth a line; whole experts and hash probes (1 byte) are many */
    moex_log(from > 0 ? MOEX_LOG_INFO : MOEX_LOG_DEBUG, "http: %s GET %s%s%s -> %d (%zu bytes)", peer, uri,
             ranged ? " " : "", ranged ? range : "", ranged ? 206 : 200, len);
    return send_head(wsi, ranged ? HTTP_STATUS_PARTIAL_CONTENT : HTTP_STATUS_OK, "application/octet-stream", len, hex,
                     ranged ? crange : NULL);
}

/* ---- the callbacks ---- */

/* Every request no one else claimed comes here: the weights, for the
 * workers' token only, and JSON errors for anything else. */
static int on_request(hub_http *h, struct lws *wsi, http_req *r) {
    char uri[256] = "";
    char *p;
    int uri_len;
    const int method = lws_http_get_uri_and_method(wsi, &p, &uri_len);
    if (method < 0 || uri_len <= 0 || uri_len >= (int)sizeof uri)
        return respond_error(h, wsi, r, HTTP_STATUS_NOT_FOUND, "(long path)", "not found");
    memcpy(uri, p, (size_t)uri_len);
    uri[uri_len] = 0;
    int layer = 0, expert = 0;
    const int kind = !strcmp(uri, "/v1/model") ? 2 : parse_expert_path(uri, &layer, &expert);
    if (method != LWSHUMETH_GET) { /* a body may follow, which is not read: the connection closes after the answer */
        hub_http_answer_error(wsi, kind ? HTTP_STATUS_METHOD_NOT_ALLOWED : HTTP_STATUS_NOT_FOUND,
                              kind ? "method_not_allowed" : NULL, kind ? "this path takes GET only" : "no such path");
        return -1;
    }
    if (kind == 0)
        return respond_error(h, wsi, r, HTTP_STATUS_NOT_FOUND, uri, "no such path%s",
                             h->no_weights ? "" : " (workers use /ws, /v1/model, /v1/expert/<layer>/<expert>)");
    if (h->no_weights)
        return respond_error(h, wsi, r, HTTP_STATUS_NOT_FOUND, uri,
                             "this hub runs the whole model itself (--local): it serves no expert weights");
    if (!h->token || !*h->token || !hub_auth_ok(wsi, h->token)) return respond_refused(h, wsi, r, uri);
    if (kind == 2) return serve_model(h, wsi, r, uri);
    if (kind < 0)
        return respond_error(h, wsi, r, HTTP_STATUS_BAD_REQUEST, uri,
                             "bad expert path (want /v1/expert/<layer>/<expert>)");
    return serve_expert(h, wsi, r, uri, layer, expert);
}

/* Writes the next chunk of the body; at its end, completes the transaction. */
static int on_writeable(struct lws *wsi, http_req *r, void **state) {
    if (!r->left) return 0;
    const uint8_t *src;
    size_t n;
    if (r->owned) {
        src = r->owned + LWS_PRE + r->off;
        n = r->left;
    } else {
        while (r->off == r->seg_len[r->cur]) r->cur++, r->off = 0;
        src = r->seg[r->cur] + r->off;
        n = r->seg_len[r->cur] - r->off;
        if (n > r->left) n = r->left;
    }
    if (n > BODY_CHUNK) n = BODY_CHUNK;
    const bool last = n == r->left;
    /* HTTP/1 only (see hub_http_callback): lws_write reads the mapping, writes nothing in front of it */
    if (lws_write(wsi, (unsigned char *)(uintptr_t)src, n, last ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) < (int)n) return -1;
    r->off += n;
    r->left -= n;
    if (!last) {
        lws_set_timeout(wsi, PENDING_TIMEOUT_HTTP_CONTENT, CLIENT_IDLE_S);
        want_writable(wsi);
        return 0;
    }
    req_free(r);
    *state = NULL;
    lws_set_timer_usecs(wsi, LWS_SET_TIMER_USEC_CANCEL);
    return lws_http_transaction_completed(wsi) ? -1 : 0;
}

static bool socket_has_room(struct lws *wsi) {
    struct pollfd p = {.fd = lws_get_socket_fd(wsi), .events = POLLOUT};
    return p.fd < 0 || poll(&p, 1, 0) != 0;
}

/* The timer of an answer in progress: STALL_AFTER_MS without a WRITEABLE,
 * or a stalled answer's next look at its socket. */
static void on_timer(struct lws *wsi, http_req *r) {
    if (!socket_has_room(wsi)) {
        if (!r->stalled) lws_rx_flow_control(wsi, 0);
        r->stalled = true;
        lws_set_timer_usecs(wsi, (lws_usec_t)STALL_POLL_MS * LWS_US_PER_MS);
        return;
    }
    if (r->stalled) lws_rx_flow_control(wsi, 1);
    r->stalled = false;
    want_writable(wsi);
}

int hub_http_callback(hub_http *h, struct lws *wsi, enum lws_callback_reasons reason, void **state, void *in,
                      size_t len) {
    (void)in;
    (void)len;
    /* HTTP/2 (an h2c upgrade) would write frame headers in front of the
     * data, into the read-only mapping: refused, workers speak HTTP/1.1.
     * After such an upgrade the connection's wsi has no storage: *state is
     * not usable there. */
    if (!state || lws_get_network_wsi(wsi) != wsi || !lws_wsi_user(wsi)) {
        if (reason != LWS_CALLBACK_HTTP) return 0;
        hub_http_answer_error(wsi, HTTP_STATUS_HTTP_VERSION_NOT_SUPPORTED, "http_version_not_supported",
                              "this hub speaks HTTP/1.1 only");
        return -1;
    }
    switch (reason) {
    case LWS_CALLBACK_HTTP: {
        req_free(*state); /* a keep-alive connection's previous request */
        http_req *r = calloc(1, sizeof *r);
        *state = r;
        if (!r) return -1;
        return on_request(h, wsi, r) ? -1 : 0;
    }
    case LWS_CALLBACK_HTTP_WRITEABLE:
        return *state && !((http_req *)*state)->stalled ? on_writeable(wsi, *state, state) : 0;
    case LWS_CALLBACK_TIMER:
        if (*state) on_timer(wsi, *state);
        return 0;
    case LWS_CALLBACK_CLOSED_HTTP:
    case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
        lws_set_timer_usecs(wsi, LWS_SET_TIMER_USEC_CANCEL);
        req_free(*state);
        *state = NULL;
        return 0;
    default: /* request bodies are not expected (GET only): ignored */
        return 0;
    }
}
