/* The worker's two libwebsockets clients (the WebSocket session, session.c,
 * and the HTTP downloads, download_http.c) reach the same hub: where it is
 * (--hub, --token), a client-only context, and the connect fields they share. */
#ifndef MOEX_WORKER_HUB_LINK_H
#define MOEX_WORKER_HUB_LINK_H

#include <stdbool.h>

#include <libwebsockets.h>

#include "common/common.h"

typedef struct worker_hub_addr {
    char url_buf[1024];   /* lws_parse_uri cuts it up; address and path point into it */
    const char *address;
    const char *path;     /* without its leading '/' */
    int port;
    bool tls;             /* wss:// (https for downloads) */
    char host[300];       /* "HOST:PORT" */
    char auth[600];       /* "Bearer TOKEN" */
} worker_hub_addr;

/* ws[s]://HOST[:PORT][/PATH] and the token into a; a clear error otherwise. */
int worker_hub_addr_parse(worker_hub_addr *a, const char *hub_url, const char *token, moex_error *err);

/* A client-only context (no listening port), lws logging at MOEX_LOG's level. */
struct lws_context *worker_lws_client_context(const struct lws_protocols *protocols, void *user, bool tls,
                                              int timeout_s, int connect_timeout_s, int fd_limit, int rx_bytes);

/* The connect fields every client sets: context, address, port, host, origin, TLS. */
void worker_lws_connect_info(struct lws_client_connect_info *ci, struct lws_context *ctx, const worker_hub_addr *a);

#endif
