/* Shared by the worker's WebSocket session and its HTTP downloads (hub_link.h). */
#include <stdlib.h>
#include <string.h>

#include "worker/hub_link.h"

int worker_hub_addr_parse(worker_hub_addr *a, const char *hub_url, const char *token, moex_error *err) {
    if (strlen(hub_url) >= sizeof a->url_buf) return moex_fail(err, "--hub: URL too long");
    strcpy(a->url_buf, hub_url);
    const char *prot;
    if (lws_parse_uri(a->url_buf, &prot, &a->address, &a->port, &a->path) || !a->address[0])
        return moex_fail(err, "--hub: cannot parse '%s' (expected ws://HOST:PORT/PATH)", hub_url);
    a->tls = !strcmp(prot, "wss");
    if (strcmp(prot, "ws") && !a->tls) return moex_fail(err, "--hub: '%s' is not a ws:// or wss:// URL", hub_url);
    if (strlen(token) > 400) return moex_fail(err, "--token: longer than 400 bytes");
    snprintf(a->host, sizeof a->host, "%s:%d", a->address, a->port);
    snprintf(a->auth, sizeof a->auth, "Bearer %s", token);
    return 0;
}

struct lws_context *worker_lws_client_context(const struct lws_protocols *protocols, void *user, bool tls,
                                              int timeout_s, int connect_timeout_s, int fd_limit, int rx_bytes) {
    const char *lvl = getenv("MOEX_LOG");
    lws_set_log_level(lvl && !strcmp(lvl, "debug") ? LLL_ERR | LLL_WARN | LLL_NOTICE : LLL_ERR, NULL);
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    info.port = CONTEXT_PORT_NO_LISTEN;
    info.protocols = protocols;
    info.user = user;
    info.timeout_secs = (unsigned)timeout_s;
    info.connect_timeout_secs = (unsigned)connect_timeout_s;
    info.fd_limit_per_thread = (unsigned)fd_limit;
    info.pt_serv_buf_size = (unsigned)rx_bytes;   /* 0: lws's default */
    if (tls) info.options |= LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
    return lws_create_context(&info);
}

void worker_lws_connect_info(struct lws_client_connect_info *ci, struct lws_context *ctx, const worker_hub_addr *a) {
    memset(ci, 0, sizeof *ci);
    ci->context = ctx;
    ci->address = a->address;
    ci->port = a->port;
    ci->host = a->host;
    ci->origin = a->host;
    ci->ssl_connection = a->tls ? LCCSCF_USE_SSL : 0;
}
