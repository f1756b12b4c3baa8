/* Private to the hub: how it is reached. The certificate it serves HTTPS
 * and WSS with (tls.c), the machine's addresses (netaddr.c), and the lines
 * at start that tell people where to point workers and browsers (announce.c). */
#ifndef MOEX_HUB_REACH_H
#define MOEX_HUB_REACH_H

#include <limits.h>
#include <stdbool.h>

#include "common/common.h"

typedef struct hub_tls_cert {
    char cert[PATH_MAX], key[PATH_MAX];   /* PEM files */
    char sha256[32 * 3];                  /* the certificate's SHA-256 fingerprint, "AB:CD:...:EF" */
    char spki[48];                        /* base64 SHA-256 of its public key (SubjectPublicKeyInfo), what
                                             Chromium's --ignore-certificate-errors-spki-list takes */
    bool self_signed;                     /* made by the hub (--tls without --tls-cert) */
    bool made_now;                        /* made at this start (not reused) */
} hub_tls_cert;

/* cert and key given (--tls-cert, --tls-key): checks that they load and
 * belong together. Both NULL (--tls alone): the self-signed pair in dir
 * (NULL: $XDG_CACHE_HOME/moex/tls, else ~/.cache/moex/tls), reused when it
 * names this machine (localhost, 127.0.0.1, ::1, the host name and the LAN
 * addresses) for at least another week, else made anew (a P-256 key, valid
 * 825 days). 0, or -1 with err. */
int hub_tls_prepare(const char *cert, const char *key, const char *dir, hub_tls_cert *out, moex_error *err);

/* The machine's IPv4 addresses on interfaces that are up, loopback and
 * link-local (169.254/16) left out, each once; how many (at most max). */
#define HUB_ADDR_LEN 16
int hub_lan_ipv4(char (*out)[HUB_ADDR_LEN], int max);

/* Logs the certificate's fingerprints (tls: NULL in the clear) and, when
 * the hub takes workers, where they connect (moex-worker --hub ...) and,
 * when the page is served (page), the URL a browser opens: for each LAN
 * address when host is 0.0.0.0, with the token in its query string. */
void hub_announce(const char *host, int port, const char *token, const hub_tls_cert *tls, bool workers, bool page);

#endif
