/* The lines a hub logs at start to tell people how to reach it (reach.h):
 * the native worker's --hub, the certificate to compare or trust, and the
 * URL that makes a browser tab a worker. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "hub/auth.h"
#include "hub/reach.h"

/* The token as a query value: unreserved characters stay, the rest %XX. */
static void urlencode(const char *s, char *out, size_t cap) {
    size_t n = 0;
    for (; *s && n + 4 < cap; s++) {
        const unsigned char c = (unsigned char)*s;
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || strchr("-._~", c))
            out[n++] = (char)c;
        else
            n += (size_t)snprintf(out + n, cap - n, "%%%02X", c);
    }
    out[n] = 0;
}

/* " --token T" as a shell word: plain when every character is safe, else
 * in single quotes (a quote inside as '\''), so the printed line runs. */
static void token_arg(const char *token, char *out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, " --token ");
    bool plain = *token != 0;
    for (const char *p = token; *p; p++) plain &= (bool)(isalnum((unsigned char)*p) || strchr("-._+=:/@%,", *p));
    if (plain) {
        snprintf(out + n, cap - n, "%s", token);
        return;
    }
    if (n + 1 < cap) out[n++] = '\'';
    for (const char *p = token; *p && n + 6 < cap; p++) {
        if (*p == '\'') n += (size_t)snprintf(out + n, cap - n, "'\\''");
        else out[n++] = *p;
    }
    if (n + 1 < cap) out[n++] = '\'';
    out[n] = 0;
}

static bool every_interface(const char *host) { return !*host || !strcmp(host, "0.0.0.0") || !strcmp(host, "::"); }

static bool loopback(const char *host) {
    return !strcmp(host, "localhost") || !strncmp(host, "127.", 4) || !strcmp(host, "::1");
}

static void page_url(const char *scheme, const char *host, int port, const char *query) {
    const bool v6 = strchr(host, ':') != NULL;
    moex_log(MOEX_LOG_INFO, "browser workers: open %s://%s%s%s:%d/worker%s", scheme, v6 ? "[" : "", host, v6 ? "]" : "",
             port, query);
}

void hub_announce(const char *host, int port, const char *token, const hub_tls_cert *tls, bool workers, bool page) {
    const char *ws = tls ? "wss" : "ws", *http = tls ? "https" : "http";
    const char *shown = every_interface(host) ? "HOST" : host;
    if (tls)
        moex_log(MOEX_LOG_INFO, "tls: certificate %s (%s), SHA-256 fingerprint %s, public key sha256/%s", tls->cert,
                 !tls->self_signed ? "given" : tls->made_now ? "self-signed, made now" : "self-signed, reused",
                 tls->sha256, tls->spki);
    if (!workers) return;
    char targ[4 * HUB_TOKEN_MAX + 16] = "";
    if (token && *token) token_arg(token, targ, sizeof targ);
    moex_log(MOEX_LOG_INFO, "native workers: moex-worker --hub %s://%s:%d/ws%s%s%s", ws, shown, port, targ,
             tls && tls->self_signed ? " --ca " : "", tls && tls->self_signed ? tls->cert : "");
    if (!page) {
        moex_log(MOEX_LOG_INFO, "browser workers: no worker page to serve (emscripten builds it into <build>/web: "
                                "web/setup_web.sh, then cmake; or give --web-dir DIR)");
        return;
    }
    char query[3 * 1024 + 16] = "";
    if (token && *token) {
        strcpy(query, "?token=");
        urlencode(token, query + 7, sizeof query - 7);
    }
    if (!every_interface(host)) {
        page_url(http, host, port, query);
    } else {
        char lan[16][HUB_ADDR_LEN];
        const int n = hub_lan_ipv4(lan, 16);
        for (int i = 0; i < n; i++) page_url(http, lan[i], port, query);
        if (!n) page_url(http, "localhost", port, query);
    }
    if (!tls && !loopback(host))
        moex_log(MOEX_LOG_INFO, "browser workers: over plain HTTP a browser on another machine has no WebGPU and no "
                                "storage (secure contexts only): start the hub with --tls");
    if (tls && tls->self_signed)
        moex_log(MOEX_LOG_INFO, "browser workers: the browser warns once about the self-signed certificate: check "
                                "that its SHA-256 fingerprint is the one above, then accept it");
}
