/* Shared by the worker's WebSocket session and its HTTP downloads (hub_link.h). */
#include <stdlib.h>
#include <string.h>

#include "worker/hub_link.h"

int worker_hub_addr_parse(worker_hub_addr *a, const moex_worker_options *o, moex_error *err) {
    const char *hub_url = o->hub_url, *token = o->token;
    if (strlen(hub_url) >= sizeof a->url_buf) return moex_fail(err, "--hub: URL too long");
    strcpy(a->url_buf, hub_url);
    const char *prot;
    if (lws_parse_uri(a->url_buf, &prot, &a->address, &a->port, &a->path) || !a->address[0])
        return moex_fail(err, "--hub: cannot parse '%s' (expected ws://HOST:PORT/PATH)", hub_url);
    a->tls = !strcmp(prot, "wss") || !strcmp(prot, "https");
    a->tcp = !strcmp(prot, "tcp");
    if (strcmp(prot, "ws") && strcmp(prot, "http") && !a->tls && !a->tcp)
        return moex_fail(err, "--hub: '%s' is not a ws://, wss:// or tcp:// URL", hub_url);
    if (a->tcp && !strstr(hub_url + 6, ":"))
        return moex_fail(err, "--hub: '%s' names no port: tcp://HOST:PORT, the hub's --tcp-port", hub_url);
    if (a->tcp && !*token)
        return moex_fail(err, "--hub tcp://: give the hub's --token (the TCP transport's AUTH frame carries it)");
    if (!a->path[0] || !strcmp(a->path, "/")) a->path = "ws"; /* no path: the hub's WebSocket */
    a->ca_file = o->ca_file;
    a->insecure = o->insecure;
    if (strlen(token) > MOEX_PROTO_AUTH_MAX_BYTES)
        return moex_fail(err, "--token: longer than %d bytes (the hub takes no longer one)", MOEX_PROTO_AUTH_MAX_BYTES);
    a->token = token;
    snprintf(a->host, sizeof a->host, "%s:%d", a->address, a->port);
    snprintf(a->auth, sizeof a->auth, "Bearer %s", token);
    return 0;
}

struct lws_context *worker_lws_client_context(const struct lws_protocols *protocols, void *user,
                                              const worker_hub_addr *a, int timeout_s, int connect_timeout_s,
                                              int fd_limit, int rx_bytes) {
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
    if (a->tls) {
        info.options |= LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
        /* --ca: that certificate alone; otherwise the system's authorities */
        if (a->ca_file) info.options |= LWS_SERVER_OPTION_DISABLE_OS_CA_CERTS;
        info.client_ssl_ca_filepath = a->ca_file;
    }
    return lws_create_context(&info);
}

const char *worker_tls_hint(const worker_hub_addr *a, const char *error, size_t len) {
    if (!a->tls || a->insecure || !error || !memmem(error, len, "SSL", 3)) return "";
    return a->ca_file ? " (the hub's certificate is not the one --ca names, or it does not name this host)"
                      : " (is the hub's certificate self-signed? trust it with --ca FILE, the file the hub printed)";
}

void worker_lws_connect_info(struct lws_client_connect_info *ci, struct lws_context *ctx, const worker_hub_addr *a) {
    memset(ci, 0, sizeof *ci);
    ci->context = ctx;
    ci->address = a->address;
    ci->port = a->port;
    ci->host = a->host;
    ci->origin = a->host;
    ci->ssl_connection = a->tls ? LCCSCF_USE_SSL : 0;
    if (a->tls && a->insecure)
        ci->ssl_connection |= LCCSCF_ALLOW_SELFSIGNED | LCCSCF_ALLOW_INSECURE | LCCSCF_ALLOW_EXPIRED |
                              LCCSCF_SKIP_SERVER_CERT_HOSTNAME_CHECK;
}
