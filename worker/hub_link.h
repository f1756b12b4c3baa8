/* The worker's two libwebsockets clients (the WebSocket session, session.c,
 * and the HTTP downloads, download_http.c) reach the same hub: where it is
 * (--hub, --token), how its certificate is checked (--ca, --insecure), a
 * client-only context, and the connect fields they share. */
#ifndef MOEX_WORKER_HUB_LINK_H
#define MOEX_WORKER_HUB_LINK_H

#include <stdbool.h>

#include <libwebsockets.h>

#include "common/common.h"
#include "proto/proto.h"
#include "worker/worker.h"

typedef struct worker_hub_addr {
    char url_buf[1024];   /* lws_parse_uri cuts it up; address and path point into it */
    const char *address;
    const char *path;     /* without its leading '/' */
    int port;
    bool tls;             /* wss:// (https for downloads) */
    bool tcp;             /* tcp://: the TCP transport (the hub's --tcp-port), frames without WebSocket */
    const char *token;    /* --token as given (AUTH's payload on tcp://) */
    const char *ca_file;  /* --ca: the only certificate trusted (NULL: the system's CAs) */
    bool insecure;        /* --insecure: no verification */
    char host[300];       /* "HOST:PORT" */
    char auth[MOEX_PROTO_AUTH_MAX_BYTES + 16];   /* "Bearer TOKEN" */
} worker_hub_addr;

/* o's ws[s]://HOST[:PORT][/PATH] (or http[s]://; PATH defaults to ws) or
 * tcp://HOST:PORT, token and TLS checks into a; a clear error otherwise. */
int worker_hub_addr_parse(worker_hub_addr *a, const moex_worker_options *o, moex_error *err);

/* A client-only context (no listening port) able to reach a, lws logging at MOEX_LOG's level. */
struct lws_context *worker_lws_client_context(const struct lws_protocols *protocols, void *user,
                                              const worker_hub_addr *a, int timeout_s, int connect_timeout_s,
                                              int fd_limit, int rx_bytes);

/* What to add to a connection error's text: how to trust the hub's
 * certificate when the error is TLS's, else "". */
const char *worker_tls_hint(const worker_hub_addr *a, const char *error, size_t len);

/* The connect fields every client sets: context, address, port, host, origin, TLS. */
void worker_lws_connect_info(struct lws_client_connect_info *ci, struct lws_context *ctx, const worker_hub_addr *a);

#endif
