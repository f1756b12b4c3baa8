/* The hub's network thread: one libwebsockets context serving workers on /ws
 * (and, with --tcp-port, on a second, plain TCP listener) and HTTP on
 * everything else, in the clear or, given a certificate, over TLS only
 * (HTTP/1.1: the answers write from read-only mappings, which HTTP/2's
 * framing cannot, so ALPN offers nothing else). It alone reads sockets.
 * A received message is split into frames: JOIN and HEARTBEAT go to the
 * registry; a message with RESULT or ERROR frames goes whole (no copy) to
 * the executor's inbox; any other frame closes the connection. Other
 * threads queue outgoing messages on the connections (conn.c) and wake this
 * one with lws_cancel_service, which writes them (on a TCP connection the
 * sender writes what the socket takes at once, this thread the rest). The
 * registry's heartbeat tick runs here too, as an lws timer. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "hub/server.h"

struct hub_server {
    lws_sorted_usec_list_t tick;  /* the heartbeat timer (lws finds the server through it) */
    hub_server_config cfg;
    hub_registry *reg;
    hub_inbox *inbox;
    hub_net *net;
    hub_http *http;
    hub_metrics *metrics;
    struct lws_context *ctx;
    pthread_t thread;
    bool thread_started;
    atomic_bool stop;
    int port, tcp_port;
    hub_log_limit refusals;
};

/* Per connection (lws allocates it zeroed). */
typedef struct conn_data {
    hub_conn *conn;
    hub_worker *w;
    moex_proto_reasm rx;          /* WebSocket: the message so far; TCP: bytes not yet whole frames */
    void *http;                   /* an HTTP request: owned by http_weights.c */
    void *handler_req;            /* one owned by the handler (cfg.handler) */
    enum { BY_WEIGHTS, BY_HANDLER, BY_PAGE } by;   /* who answers the current request */
} conn_data;

static hub_server *server_of(struct lws *wsi) { return lws_context_user(lws_get_context(wsi)); }

static void peer_name(struct lws *wsi, char *out, size_t cap) {
    char ip[64] = "?";
    lws_get_peer_simple(wsi, ip, sizeof ip);
    snprintf(out, cap, "%s", ip);
}

static void log_refusal(hub_server *s, struct lws *wsi, const char *why) {
    HUB_COUNT(s->metrics, refused);
    uint32_t suppressed = 0;
    if (!hub_log_limit_take(&s->refusals, moex_time_s(), &suppressed)) return;
    char peer[64];
    peer_name(wsi, peer, sizeof peer);
    moex_log(MOEX_LOG_WARN, "refused %s: %s%s", peer, why, suppressed ? " (and more refusals not logged)" : "");
}

/* Upgrades to /ws with the token only; a refused upgrade gets an HTTP
 * status saying why (404, 403) before the close. */
static int filter(hub_server *s, struct lws *wsi) {
    char uri[256] = "";
    lws_hdr_copy(wsi, uri, sizeof uri, WSI_TOKEN_GET_URI);
    if (strcmp(uri, "/ws") != 0) {
        log_refusal(s, wsi, "WebSocket path is not /ws");
        hub_http_answer_error(wsi, HTTP_STATUS_NOT_FOUND, NULL, "the hub's WebSocket is /ws");
        return 1;
    }
    if (s->cfg.refuse_workers) {
        log_refusal(s, wsi, "this hub runs the whole model itself (--local): no workers");
        hub_http_answer_error(wsi, HTTP_STATUS_FORBIDDEN, NULL, "this hub runs the whole model itself: no workers");
        return 1;
    }
    if (!hub_auth_ok(wsi, s->cfg.token)) {
        log_refusal(s, wsi, "wrong or missing token");
        hub_http_answer_error(wsi, HTTP_STATUS_FORBIDDEN, NULL, "wrong or missing token");
        return 1;
    }
    return 0;
}

/* An Upgrade header: WebSocket goes on to filter(); anything else (h2c:
 * HTTP/2 in the clear, also asked for inside TLS) is refused with a JSON
 * error, since the hub speaks HTTP/1.1 only (docs/API.md, PROTOCOL.md).
 * > 0: answered, the transaction ends. */
static int confirm_upgrade(hub_server *s, struct lws *wsi, const char *upgrade) {
    if (upgrade && !strcasecmp(upgrade, "websocket")) return 0;
    log_refusal(s, wsi, "an Upgrade other than websocket (HTTP/1.1 only)");
    return hub_http_answer_error(wsi, HTTP_STATUS_HTTP_VERSION_NOT_SUPPORTED, "http_version_not_supported",
                                 "this hub speaks HTTP/1.1 only: send the request without 'Upgrade: %.20s'",
                                 upgrade ? upgrade : "") ? -1 : 1;
}

static int established(hub_server *s, struct lws *wsi, conn_data *cd, bool raw) {
    char peer[64];
    peer_name(wsi, peer, sizeof peer);
    cd->rx.max_bytes = s->cfg.max_message;
    cd->conn = hub_conn_create(s->net, wsi, s->cfg.max_queued, peer);
    if (cd->conn && raw) hub_conn_set_raw(cd->conn, (int)lws_get_socket_fd(wsi));
    cd->w = cd->conn ? hub_registry_connect(s->reg, cd->conn) : NULL;
    if (!cd->w) {
        moex_log(MOEX_LOG_WARN, "refused %s: %d workers already", peer, HUB_MAX_WORKERS);
        return -1;
    }
    return 0;
}

void hub_route_message(hub_registry *reg, hub_inbox *inbox, const moex_proto_limits *lim, hub_worker *w,
                       uint8_t **buf, size_t len) {
    const uint8_t *msg = *buf;
    hub_registry_on_receive(reg, w, len);
    size_t off = 0, n = 0;
    bool results = false;
    int rc;
    moex_error err = {0};
    if (len == 0) {
        hub_registry_bad_frame(reg, w, 0, MOEX_PROTO_E_TRUNCATED, "an empty message");
        return;
    }
    while ((rc = moex_proto_next_frame(msg, len, &off, lim, &n, &err)) == 1) {
        moex_proto_header h;
        moex_proto_header_read(msg + off, &h);
        if (h.type == MOEX_MSG_RESULT || h.type == MOEX_MSG_ERROR) {
            results = true;
        } else if (h.type == MOEX_MSG_JOIN || h.type == MOEX_MSG_HEARTBEAT) {
            moex_proto_msg m;
            rc = moex_proto_decode(msg + off, n, lim, NULL, 0, &m, &err);
            if (rc) break;
            hub_registry_on_control(reg, w, &m);
        } else {
            rc = MOEX_PROTO_E_TYPE;
            snprintf(err.msg, sizeof err.msg, "a %u frame: workers send JOIN, HEARTBEAT, RESULT and ERROR", h.type);
            break;
        }
        off += n;
    }
    if (rc < 0) {
        moex_proto_header h = {0};
        if (len - off >= MOEX_PROTO_HEADER_BYTES) moex_proto_header_read(msg + off, &h);
        char why[sizeof err.msg + 64];
        snprintf(why, sizeof why, "bad frame (%s): %s", moex_proto_strerror(rc), err.msg);
        hub_registry_bad_frame(reg, w, h.seq, rc, why);
        return; /* closed after the ERROR is flushed */
    }
    uint32_t id;
    if (results && !hub_registry_accepts_results(reg, w, &id)) {
        hub_registry_bad_frame(reg, w, 0, MOEX_PROTO_E_FIELD, "RESULT or ERROR from a worker that has not joined");
        return;
    }
    if (results) { /* the buffer changes owner */
        hub_event ev = {.kind = HUB_EV_MESSAGE, .worker = id, .data = *buf, .len = len, .t_rx = moex_time_s()};
        *buf = NULL;
        hub_inbox_push(inbox, &ev);
    }
}

static int on_receive(hub_server *s, struct lws *wsi, conn_data *cd, const void *in, size_t len) {
    if (!lws_frame_is_binary(wsi)) {
        hub_registry_bad_frame(s->reg, cd->w, 0, MOEX_PROTO_E_TYPE, "a text message: the protocol is binary");
        return 0;
    }
    moex_error err = {0};
    if (moex_proto_reasm_add(&cd->rx, in, len, &err)) {
        hub_registry_bad_frame(s->reg, cd->w, 0, MOEX_PROTO_E_TOO_BIG, err.msg);
        return 0;
    }
    if (!lws_is_final_fragment(wsi) || lws_remaining_packet_payload(wsi)) return 0;
    hub_route_message(s->reg, s->inbox, &s->cfg.limits, cd->w, &cd->rx.buf, cd->rx.len);
    if (!cd->rx.buf) cd->rx.cap = 0; /* handed to the inbox: the next message gets a fresh buffer */
    moex_proto_reasm_reset(&cd->rx);
    return 0;
}

/* A writeable callback: the connection's next bytes, and another callback while more wait. */
static int write_more(struct lws *wsi, hub_conn *c) {
    const int rc = hub_conn_on_writeable(c);
    if (rc > 0) lws_callback_on_writable(wsi);
    return rc < 0 ? -1 : 0;
}

static int closed(hub_server *s, conn_data *cd) {
    if (cd->conn) hub_conn_closed(cd->conn);
    if (cd->w) hub_registry_disconnect(s->reg, cd->w, "connection closed");
    hub_conn_unref(cd->conn);
    moex_proto_reasm_free(&cd->rx);
    cd->w = NULL;
    cd->conn = NULL;
    return 0;
}

/* ---- the TCP transport (--tcp-port) ----
 *
 * Native workers may skip WebSocket: the same frames back to back on a plain
 * TCP stream (libwebsockets' raw sockets). A WebSocket client parses what it
 * receives one byte at a time and masks every byte it sends (libwebsockets
 * 4.1, RFC 6455): megabytes a prompt layer; a stream costs a copy. The first
 * frame must be AUTH with the hub's token, within TCP_AUTH_S; the connection
 * is then a worker's like any other, each run of whole frames received one
 * "message" (docs/PROTOCOL.md, "The TCP transport"). */
#define TCP_AUTH_S 5

/* ERROR "unauthorized", then the close. */
static int tcp_refuse(hub_server *s, struct lws *wsi, const char *why) {
    log_refusal(s, wsi, why);
    uint8_t f[LWS_PRE + MOEX_PROTO_HEADER_BYTES + MOEX_PROTO_ERROR_FIXED_BYTES + 128];
    size_t n = 0;
    const size_t len = strlen(why) < 128 ? strlen(why) : 128;
    if (!moex_proto_encode_error(0, MOEX_ERR_UNAUTHORIZED, why, (uint16_t)len, f + LWS_PRE, sizeof f - LWS_PRE, &n, NULL))
        lws_write(wsi, f + LWS_PRE, n, LWS_WRITE_RAW);
    return -1;
}

/* The connection's first frame: AUTH with the token makes it a worker's. */
static int tcp_authenticate(hub_server *s, struct lws *wsi, conn_data *cd, size_t *used) {
    *used = 0;
    const size_t magic = cd->rx.len < 4 ? cd->rx.len : 4;
    if (memcmp(cd->rx.buf, MOEX_PROTO_MAGIC, magic) != 0) /* HTTP, TLS, anything else: told at once */
        return tcp_refuse(s, wsi, "the first frame on the TCP port must be AUTH with the hub's token");
    if (cd->rx.len < MOEX_PROTO_HEADER_BYTES) return 0;
    moex_proto_header h;
    moex_proto_header_read(cd->rx.buf, &h);
    if (h.type != MOEX_MSG_AUTH)
        return tcp_refuse(s, wsi, "the first frame on the TCP port must be AUTH with the hub's token");
    size_t n;
    moex_error err = {0};
    if (moex_proto_frame_size(cd->rx.buf, cd->rx.len, &s->cfg.limits, &n, &err))
        return tcp_refuse(s, wsi, "a malformed AUTH frame");
    if (n > cd->rx.len) return 0; /* the rest of the token is on its way */
    moex_proto_msg m;
    if (moex_proto_decode(cd->rx.buf, n, &s->cfg.limits, NULL, 0, &m, &err))
        return tcp_refuse(s, wsi, "a malformed AUTH frame");
    if (!hub_auth_token_ok(m.u.auth.token, m.u.auth.len, s->cfg.token))
        return tcp_refuse(s, wsi, "wrong or missing token");
    if (established(s, wsi, cd, true)) return -1;
    lws_set_timeout(wsi, NO_PENDING_TIMEOUT, 0);
    *used = n;
    return 0;
}

/* Hands the whole frames at the start of cd->rx on as one message; the
 * incomplete rest stays. */
static void tcp_route_frames(hub_server *s, conn_data *cd) {
    size_t whole = 0;
    moex_error err = {0};
    const int rc = moex_proto_stream_frames(cd->rx.buf, cd->rx.len, &s->cfg.limits, &whole, NULL, &err);
    if (whole) {
        uint8_t *msg = cd->rx.buf;
        const size_t len = cd->rx.len;
        cd->rx.buf = NULL;
        cd->rx.len = cd->rx.cap = 0;
        if (whole < len && moex_proto_reasm_add(&cd->rx, msg + whole, len - whole, &err)) {
            free(msg);
            hub_registry_bad_frame(s->reg, cd->w, 0, MOEX_PROTO_E_TOO_BIG, err.msg);
            return;
        }
        hub_route_message(s->reg, s->inbox, &s->cfg.limits, cd->w, &msg, whole);
        free(msg); /* NULL when the inbox took it */
    }
    if (rc < 0) {
        char why[sizeof err.msg + 64];
        snprintf(why, sizeof why, "bad frame (%s): %s", moex_proto_strerror(rc), err.msg);
        hub_registry_bad_frame(s->reg, cd->w, 0, rc, why);
        moex_proto_reasm_reset(&cd->rx);
    }
}

static int tcp_receive(hub_server *s, struct lws *wsi, conn_data *cd, const void *in, size_t len) {
    if (cd->w && !hub_conn_open(cd->conn)) return 0; /* closing: what it sends is dropped */
    moex_error err = {0};
    if (moex_proto_reasm_add(&cd->rx, in, len, &err)) {
        if (!cd->w) return tcp_refuse(s, wsi, "more bytes than a frame before AUTH");
        hub_registry_bad_frame(s->reg, cd->w, 0, MOEX_PROTO_E_TOO_BIG, err.msg);
        return 0;
    }
    if (!cd->w) {
        size_t used;
        if (tcp_authenticate(s, wsi, cd, &used)) return -1;
        if (!used) return 0;
        memmove(cd->rx.buf, cd->rx.buf + used, cd->rx.len - used);
        cd->rx.len -= used;
    }
    tcp_route_frames(s, cd);
    return 0;
}

static int tcp_callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len) {
    hub_server *s = server_of(wsi);
    conn_data *cd = user;
    switch (reason) {
    case LWS_CALLBACK_RAW_ADOPT:
        if (s->cfg.refuse_workers) {
            log_refusal(s, wsi, "this hub runs the whole model itself (--local): no workers");
            return -1;
        }
        cd->rx.max_bytes = s->cfg.max_message;
        lws_set_timeout(wsi, PENDING_TIMEOUT_USER_OK, TCP_AUTH_S);
        return 0;
    case LWS_CALLBACK_RAW_RX: return tcp_receive(s, wsi, cd, in, len);
    case LWS_CALLBACK_RAW_WRITEABLE: return cd->conn ? write_more(wsi, cd->conn) : 0;
    case LWS_CALLBACK_RAW_CLOSE: return closed(s, cd);
    default: return 0; /* EVENT_WAIT_CANCELLED reaches every protocol: the WebSocket one services the queues */
    }
}

static const struct lws_protocols tcp_protocols[] = {
    /* 1 MiB a send: a prompt layer's megabytes in few system calls */
    {"moex-tcp", tcp_callback, sizeof(conn_data), 64 * 1024, 0, NULL, 1 << 20},
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

/* A second listener for the TCP transport, on the same network thread. */
static int start_tcp(hub_server *s, moex_error *err) {
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    info.vhost_name = "moex-tcp";
    info.port = s->cfg.tcp_port;
    info.iface = s->cfg.host;
    info.protocols = tcp_protocols;
    info.options = LWS_SERVER_OPTION_ADOPT_APPLY_LISTEN_ACCEPT_CONFIG;
    info.listen_accept_role = "raw-skt";
    info.listen_accept_protocol = "moex-tcp";
    struct lws_vhost *vh = lws_create_vhost(s->ctx, &info);
    if (!vh) return moex_fail(err, "cannot listen for TCP workers on %s:%d (port in use? try another --tcp-port)",
                              s->cfg.host ? s->cfg.host : "*", s->cfg.tcp_port);
    s->tcp_port = lws_get_vhost_listen_port(vh);
    return 0;
}

/* The worker page first (no token), then the API's routes, then the weights. */
static int route_of(hub_server *s, struct lws *wsi) {
    if (s->cfg.web && hub_static_claims(wsi)) return BY_PAGE;
    if (s->cfg.handler && s->cfg.handler->claims(s->cfg.handler->ctx, wsi)) return BY_HANDLER;
    return BY_WEIGHTS;
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len) {
    hub_server *s = server_of(wsi);
    conn_data *cd = user;
    switch (reason) {
    case LWS_CALLBACK_HTTP_CONFIRM_UPGRADE: return confirm_upgrade(s, wsi, in);
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION: return filter(s, wsi);
    case LWS_CALLBACK_ESTABLISHED: return established(s, wsi, cd, false);
    case LWS_CALLBACK_RECEIVE:
        if (!cd->w || !hub_conn_open(cd->conn)) return 0; /* closing: what it sends is dropped */
        return on_receive(s, wsi, cd, in, len);
    case LWS_CALLBACK_SERVER_WRITEABLE: return cd->conn ? write_more(wsi, cd->conn) : -1;
    case LWS_CALLBACK_CLOSED: return closed(s, cd);
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
        hub_net_service(s->net);
        if (s->cfg.handler) s->cfg.handler->service(s->cfg.handler->ctx);
        return 0;
    case LWS_CALLBACK_HTTP:
        if (cd) cd->by = route_of(s, wsi);
        if (cd && cd->by == BY_PAGE) return hub_static_serve(s->cfg.web, wsi);
        /* fall through */
    case LWS_CALLBACK_HTTP_WRITEABLE:
    case LWS_CALLBACK_HTTP_BODY:
    case LWS_CALLBACK_HTTP_BODY_COMPLETION:
        if (cd && cd->by == BY_PAGE) return 0; /* lws writes the file itself */
        if (cd && cd->by == BY_HANDLER)
            return s->cfg.handler->callback(s->cfg.handler->ctx, wsi, reason, &cd->handler_req, in, len);
        return hub_http_callback(s->http, wsi, reason, cd ? &cd->http : NULL, in, len);
    case LWS_CALLBACK_HTTP_FILE_COMPLETION: /* the page's file is sent: the connection may carry another request */
        return lws_http_transaction_completed(wsi) ? -1 : 0;
    case LWS_CALLBACK_CLOSED_HTTP:
    case LWS_CALLBACK_HTTP_DROP_PROTOCOL: /* both may hold a request of this connection */
        if (cd && cd->handler_req) s->cfg.handler->callback(s->cfg.handler->ctx, wsi, reason, &cd->handler_req, in, len);
        return hub_http_callback(s->http, wsi, reason, cd ? &cd->http : NULL, in, len);
    case LWS_CALLBACK_TIMER: /* only the weights' HTTP answers set timers */
        return hub_http_callback(s->http, wsi, reason, cd ? &cd->http : NULL, in, len);
    default: return 0;
    }
}

static const struct lws_protocols protocols[] = {
    {"moex", callback, sizeof(conn_data), 64 * 1024, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

static void on_tick(lws_sorted_usec_list_t *sul) {
    hub_server *s = (hub_server *)sul; /* tick is the first member */
    hub_registry_tick(s->reg, moex_time_s());
    lws_sul_schedule(s->ctx, 0, &s->tick, on_tick, (lws_usec_t)s->cfg.heartbeat_ms * LWS_US_PER_MS);
}

static void *net_main(void *arg) {
    hub_server *s = arg;
    while (!atomic_load(&s->stop))
        if (lws_service(s->ctx, 0) < 0) break;
    return NULL;
}

static void lws_log_to_moex(int level, const char *line) {
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
    moex_log(level == LLL_ERR ? MOEX_LOG_WARN : MOEX_LOG_DEBUG, "lws: %.*s", (int)n, line);
}

hub_server *hub_server_start(const hub_server_config *cfg, hub_registry *reg, hub_inbox *inbox, hub_net *net,
                             hub_http *http, hub_metrics *metrics, moex_error *err) {
    hub_server *s = calloc(1, sizeof *s);
    if (!s) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    s->reg = reg;
    s->inbox = inbox;
    s->net = net;
    s->http = http;
    s->metrics = metrics;
    atomic_init(&s->stop, false);
    lws_set_log_level(LLL_ERR | LLL_WARN, lws_log_to_moex);
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    info.port = cfg->port;
    info.iface = cfg->host;
    info.protocols = protocols;
    info.user = s;
    info.options = LWS_SERVER_OPTION_VALIDATE_UTF8;
    info.pt_serv_buf_size = 64 * 1024;
    info.max_http_header_data = 3 * HUB_TOKEN_MAX + 2048; /* a long token in the URL (%XX-encoded) or a header */
    /* descriptors lws polls: at the bound it stops accepting until one closes */
    info.fd_limit_per_thread = HUB_MAX_CONNECTIONS;
    if (cfg->tls_cert) {
        info.options |= LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
        info.ssl_cert_filepath = cfg->tls_cert;
        info.ssl_private_key_filepath = cfg->tls_key;
        info.alpn = "http/1.1";
    }
    s->ctx = lws_create_context(&info);
    if (!s->ctx) {
        moex_fail(err, "cannot listen on %s:%d (port in use? try another --port)%s", cfg->host, cfg->port,
                  cfg->tls_cert ? ", or TLS could not start with its certificate and key" : "");
        free(s);
        return NULL;
    }
    struct lws_vhost *vh = lws_get_vhost_by_name(s->ctx, "default");
    s->port = vh ? lws_get_vhost_listen_port(vh) : cfg->port;
    if (cfg->tcp_port > 0 && start_tcp(s, err)) {
        lws_context_destroy(s->ctx);
        free(s);
        return NULL;
    }
    hub_net_set_context(net, s->ctx);
    lws_sul_schedule(s->ctx, 0, &s->tick, on_tick, (lws_usec_t)cfg->heartbeat_ms * LWS_US_PER_MS);
    if (pthread_create(&s->thread, NULL, net_main, s)) {
        moex_fail(err, "cannot start the network thread");
        hub_server_stop(s);
        return NULL;
    }
    s->thread_started = true;
    return s;
}

int hub_server_port(const hub_server *s) { return s->port; }

int hub_server_tcp_port(const hub_server *s) { return s->tcp_port; }

void hub_server_stop(hub_server *s) {
    if (!s) return;
    atomic_store(&s->stop, true);
    if (s->thread_started) {
        lws_cancel_service(s->ctx);
        pthread_join(s->thread, NULL);
    }
    hub_net_set_context(s->net, NULL);
    lws_context_destroy(s->ctx); /* closes the connections: their CLOSED callbacks run here */
    free(s);
}
