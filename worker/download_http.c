/* HTTP GETs to the hub through a libwebsockets client context of its own,
 * serviced on the calling thread (the compute thread, while the session's
 * thread keeps the WebSocket alive). One request at a time; a 100 ms tick
 * checks the caller's stop flag and the stall timeout. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <libwebsockets.h>

#include "worker/download_internal.h"
#include "worker/hub_link.h"

#define RX_BYTES (256 * 1024)
#define TICK_US (100 * LWS_US_PER_MS)
#define STALL_S 30.0          /* no byte from the hub for this long: give up (the caller may retry) */
#define CLOSE_WAIT_S 5.0      /* how long an abandoned connection may take to close */

struct dl_http {
    struct lws_context *ctx;
    worker_hub_addr hub;      /* --hub, --token */
    char base[340];           /* "http[s]://HOST:PORT", for messages */
    lws_sorted_usec_list_t tick;
    uint8_t *rx;              /* LWS_PRE + RX_BYTES */

    /* the request in flight */
    uintptr_t serial;         /* tags its wsi: late callbacks of an abandoned one are ignored */
    const dl_request *req;
    dl_response *resp;
    moex_error *err;
    struct lws *wsi;
    char range[64];
    bool finished;            /* rc is final */
    bool closed;              /* its connection is gone: the request is over */
    int rc;
    double last_rx_s, finished_at_s;
};

/* Settles the request's outcome once; later calls are no-ops. */
static void finish(dl_http *h, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void finish(dl_http *h, int rc, const char *fmt, ...) {
    if (h->finished) return;
    h->finished = true;
    h->finished_at_s = moex_time_s();
    h->rc = rc;
    if (fmt && h->err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(h->err->msg, sizeof h->err->msg, fmt, ap);
        va_end(ap);
    }
}

static void abandon(dl_http *h) {
    if (h->wsi) lws_set_timeout(h->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_ASYNC);
}

/* ---- the response head ---- */

static int64_t header_int(struct lws *wsi, enum lws_token_indexes tok) {
    char buf[64];
    if (lws_hdr_copy(wsi, buf, sizeof buf, tok) <= 0) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    return errno || end == buf || *end || v < 0 ? -1 : v;
}

/* Content-Range: bytes FIRST-LAST/TOTAL */
static void read_content_range(struct lws *wsi, dl_response *r) {
    char buf[128];
    long long first, last, total;
    if (lws_hdr_copy(wsi, buf, sizeof buf, WSI_TOKEN_HTTP_CONTENT_RANGE) > 0 &&
        sscanf(buf, "bytes %lld-%lld/%lld", &first, &last, &total) == 3 && first >= 0 && last >= first &&
        total > last) {
        r->range_first = first;
        r->range_total = total;
    }
}

static void read_hash(struct lws *wsi, dl_response *r) {
    char buf[64];
    if (lws_hdr_custom_copy(wsi, buf, sizeof buf, "x-moex-hash:", 12) != 16) return;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 16);
    if (!errno && end == buf + 16) r->has_hash = true, r->hash = v;
}

static int on_head(dl_http *h, struct lws *wsi) {
    dl_response *r = h->resp;
    r->status = (int)lws_http_client_http_response(wsi);
    r->content_length = header_int(wsi, WSI_TOKEN_HTTP_CONTENT_LENGTH);
    read_content_range(wsi, r);
    read_hash(wsi, r);
    h->last_rx_s = moex_time_s();
    if (r->status >= 400 || !h->req->on_head) return 0;
    if (h->req->on_head(h->req->ctx, r, h->err)) {
        finish(h, DL_FAILED, NULL);
        return -1;
    }
    return 0;
}

static int on_body(dl_http *h, const void *data, size_t len) {
    dl_response *r = h->resp;
    h->last_rx_s = moex_time_s();
    if (r->status >= 400) { /* an error's text, for the message */
        size_t have = strlen(r->text), room = sizeof r->text - 1 - have;
        memcpy(r->text + have, data, len < room ? len : room);
        r->text[have + (len < room ? len : room)] = 0;
        return 0;
    }
    if (h->req->on_body && h->req->on_body(h->req->ctx, data, len, h->err)) {
        finish(h, DL_FAILED, NULL);
        return -1;
    }
    return 0;
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len) {
    dl_http *h = lws_context_user(lws_get_context(wsi));
    if (!h || (uintptr_t)lws_get_opaque_user_data(wsi) != h->serial || h->closed) /* an abandoned request */
        return reason == LWS_CALLBACK_RECEIVE_CLIENT_HTTP || reason == LWS_CALLBACK_RECEIVE_CLIENT_HTTP_READ ? -1 : 0;
    switch (reason) {
    case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER: {
        unsigned char **p = (unsigned char **)in, *end = (*p) + len;
        if (lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_AUTHORIZATION, (const unsigned char *)h->hub.auth,
                                         (int)strlen(h->hub.auth), p, end))
            return -1;
        if (h->range[0] && lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_RANGE, (const unsigned char *)h->range,
                                                        (int)strlen(h->range), p, end))
            return -1;
        return 0;
    }
    case LWS_CALLBACK_ESTABLISHED_CLIENT_HTTP:
        return on_head(h, wsi);
    case LWS_CALLBACK_RECEIVE_CLIENT_HTTP: {
        char *px = (char *)h->rx + LWS_PRE;
        int n = RX_BYTES;
        return lws_http_client_read(wsi, &px, &n) < 0 ? -1 : 0;
    }
    case LWS_CALLBACK_RECEIVE_CLIENT_HTTP_READ:
        return on_body(h, in, len);
    case LWS_CALLBACK_COMPLETED_CLIENT_HTTP:
        finish(h, DL_OK, NULL);
        return -1; /* one request per connection */
    case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
        finish(h, DL_NETWORK, "cannot reach the hub at %s: %.*s%s", h->base, in ? (int)len : 7,
               in ? (const char *)in : "unknown", worker_tls_hint(&h->hub, in, len));
        h->closed = true;
        h->wsi = NULL;
        return 0;
    case LWS_CALLBACK_CLOSED_CLIENT_HTTP:
        finish(h, DL_NETWORK, "the hub at %s closed the connection before the response was complete", h->base);
        h->closed = true;
        h->wsi = NULL;
        return 0;
    default:
        return 0;
    }
}

static const struct lws_protocols protocols[] = {
    {"moex-download", callback, 0, RX_BYTES, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

static void on_tick(lws_sorted_usec_list_t *sul) {
    dl_http *h = lws_container_of(sul, dl_http, tick);
    if (h->closed) return;
    lws_sul_schedule(h->ctx, 0, &h->tick, on_tick, TICK_US);
    const double now = moex_time_s();
    if (h->finished) {
        if (now - h->finished_at_s > CLOSE_WAIT_S) h->closed = true; /* stop waiting; late callbacks are ignored */
        return;
    }
    if (h->req->stop && h->req->stop(h->req->ctx)) {
        finish(h, DL_STOPPED, NULL);
        abandon(h);
    } else if (now - h->last_rx_s > STALL_S) {
        finish(h, DL_NETWORK, "nothing from the hub at %s for %.0f s", h->base, STALL_S);
        abandon(h);
    }
}

int dl_http_get(dl_http *h, const dl_request *req, dl_response *resp, moex_error *err) {
    memset(resp, 0, sizeof *resp);
    resp->content_length = resp->range_first = resp->range_total = -1;
    h->serial++;
    h->req = req;
    h->resp = resp;
    h->err = err;
    h->wsi = NULL;
    h->finished = h->closed = false;
    h->rc = DL_NETWORK;
    h->last_rx_s = moex_time_s();
    h->range[0] = 0;
    if (req->range_first >= 0 && req->range_last >= 0)
        snprintf(h->range, sizeof h->range, "bytes=%lld-%lld", (long long)req->range_first, (long long)req->range_last);
    else if (req->range_first >= 0)
        snprintf(h->range, sizeof h->range, "bytes=%lld-", (long long)req->range_first);

    struct lws_client_connect_info ci;
    worker_lws_connect_info(&ci, h->ctx, &h->hub);
    ci.path = req->path;
    ci.method = "GET";
    ci.local_protocol_name = protocols[0].name;
    ci.alpn = "http/1.1";
    ci.opaque_user_data = (void *)h->serial;
    ci.pwsi = &h->wsi;
    if (!lws_client_connect_via_info(&ci)) {
        finish(h, DL_NETWORK, "cannot start a connection to the hub at %s", h->base);
        return h->rc;
    }
    lws_sul_schedule(h->ctx, 0, &h->tick, on_tick, TICK_US);
    while (!h->closed)
        if (lws_service(h->ctx, 0) < 0) {
            finish(h, DL_NETWORK, "the HTTP client failed");
            break;
        }
    lws_sul_cancel(&h->tick);
    h->req = NULL;
    return h->rc;
}

dl_http *dl_http_create(const moex_worker_options *o, moex_error *err) {
    dl_http *h = calloc(1, sizeof *h);
    if (!h || !(h->rx = malloc(LWS_PRE + RX_BYTES))) {
        if (h) free(h);
        moex_fail(err, "out of memory");
        return NULL;
    }
    if (worker_hub_addr_parse(&h->hub, o, err)) {   /* HTTP goes where the WebSocket goes */
        dl_http_free(h);
        return NULL;
    }
    if (h->hub.tcp) { /* the TCP transport's port speaks frames only */
        moex_fail(err, "--hub tcp:// needs --model: the experts download over HTTP, from the hub's ws:// port");
        dl_http_free(h);
        return NULL;
    }
    snprintf(h->base, sizeof h->base, "%s://%s", h->hub.tls ? "https" : "http", h->hub.host);
    if (!(h->ctx = worker_lws_client_context(protocols, h, &h->hub, 30, 10, 16, RX_BYTES))) {
        moex_fail(err, "cannot create the libwebsockets context for downloads");
        dl_http_free(h);
        return NULL;
    }
    return h;
}

void dl_http_free(dl_http *h) {
    if (!h) return;
    if (h->ctx) lws_context_destroy(h->ctx);
    free(h->rx);
    free(h);
}

const char *dl_http_base(const dl_http *h) { return h->base; }
