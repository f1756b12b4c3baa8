/* Private to the hub: the network thread (server.c). One libwebsockets port,
 * plain or TLS: workers on /ws, HTTP (the worker page, expert weights, the
 * API) on the rest; optionally a second, plain one for workers on the TCP
 * transport (tcp_port). It owns every socket;
 * decoded control frames go to the registry, messages holding results go to
 * the executor's inbox, outgoing messages come from the connections' queues. */
#ifndef MOEX_HUB_SERVER_H
#define MOEX_HUB_SERVER_H

#include "hub/conn.h"
#include "hub/http.h"
#include "hub/inbox.h"
#include "hub/metrics.h"
#include "hub/registry.h"

typedef struct hub_server_config {
    const char *host;
    int port;                      /* 0: any free port */
    const char *token;
    int heartbeat_ms;
    moex_proto_limits limits;      /* what a worker's frames may be */
    size_t max_message;            /* a worker's message (all its frames) at most */
    size_t max_queued;             /* bytes queued for one connection at most */
    const hub_http_handler *handler;   /* claims HTTP requests after the page (NULL: none) */
    hub_static *web;               /* the browser worker page at /worker (NULL: none) */
    bool refuse_workers;           /* no /ws: the model runs in this process */
    const char *tls_cert, *tls_key;    /* PEM files: HTTPS and WSS only (NULL: plain) */
    int tcp_port;                  /* > 0: native workers may also connect over plain TCP there (--tcp-port) */
} hub_server_config;

/* Connections open at once, WebSocket and HTTP together (HUB_MAX_WORKERS
 * of them workers at most; the listener counts too); past it the hub
 * accepts nothing until one closes. Idle ones close by themselves: no
 * request within lws's timeout (HTTP), no frame for dead_after_ms (WebSocket). */
#define HUB_MAX_CONNECTIONS 1024

typedef struct hub_server hub_server;

hub_server *hub_server_start(const hub_server_config *cfg, hub_registry *reg, hub_inbox *inbox, hub_net *net,
                             hub_http *http, hub_metrics *metrics, moex_error *err);
int hub_server_port(const hub_server *s);
/* The TCP transport's port (cfg.tcp_port), 0 when off. */
int hub_server_tcp_port(const hub_server *s);
/* What the network thread does with one whole message from a worker's
 * connection (exposed for the frame-sequence fuzzer, hub/fuzz_hub.c):
 * JOIN and HEARTBEAT go to the registry, a message with RESULT or ERROR
 * frames to the inbox (taking *buf: NULL afterwards), anything else, an
 * empty or undecodable message, an ERROR and a close. */
void hub_route_message(hub_registry *reg, hub_inbox *inbox, const moex_proto_limits *lim, hub_worker *w,
                       uint8_t **buf, size_t len);
/* Stops the thread and closes every connection. */
void hub_server_stop(hub_server *s);

#endif
