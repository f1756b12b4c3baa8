/* The hub's TLS certificate (reach.h), through OpenSSL: a given pair checked,
 * or a self-signed one made on first start and kept for the next ones.
 *
 * A browser on another machine reaches the hub's page only over HTTPS (WebGPU
 * and storage exist only in secure contexts), so --tls must work without
 * anyone running openssl by hand: the hub makes a P-256 key and a
 * certificate for every name it can be reached at, stores them 0600 in a
 * 0700 directory, and prints the fingerprint that a person compares when
 * the browser asks them to accept it (once), and that a native worker
 * trusts with --ca cert.pem. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "hub/reach.h"

#define VALID_DAYS 825        /* the longest validity macOS and iOS accept for a server certificate */
#define RENEW_BEFORE_S (7 * 86400)
#define MAX_NAMES 32

/* The names a certificate must carry: DNS names and IP addresses. */
typedef struct names {
    char dns[4][300];
    int n_dns;
    char ip[MAX_NAMES][HUB_ADDR_LEN + 8];
    int n_ip;
} names;

static int ssl_fail(moex_error *err, const char *what) {
    char why[256] = "unknown error";
    const unsigned long e = ERR_get_error();
    if (e) ERR_error_string_n(e, why, sizeof why);
    ERR_clear_error();
    return moex_fail(err, "%s: %s", what, why);
}

static void names_of_this_machine(names *nm) {
    memset(nm, 0, sizeof *nm);
    snprintf(nm->dns[nm->n_dns++], sizeof nm->dns[0], "localhost");
    char host[256] = "";
    if (!gethostname(host, sizeof host - 1) && host[0] && strcmp(host, "localhost")) {
        snprintf(nm->dns[nm->n_dns++], sizeof nm->dns[0], "%s", host);
        if (!strchr(host, '.')) snprintf(nm->dns[nm->n_dns++], sizeof nm->dns[0], "%s.local", host);
    }
    snprintf(nm->ip[nm->n_ip++], sizeof nm->ip[0], "127.0.0.1");
    snprintf(nm->ip[nm->n_ip++], sizeof nm->ip[0], "::1");
    char lan[MAX_NAMES - 2][HUB_ADDR_LEN];
    const int n = hub_lan_ipv4(lan, MAX_NAMES - 2);
    for (int i = 0; i < n; i++) memcpy(nm->ip[nm->n_ip++], lan[i], HUB_ADDR_LEN);
}

/* "" when the certificate names them all, else the first it lacks. */
static const char *missing_name(X509 *x, const names *nm) {
    for (int i = 0; i < nm->n_dns; i++)
        if (X509_check_host(x, nm->dns[i], 0, 0, NULL) != 1) return nm->dns[i];
    for (int i = 0; i < nm->n_ip; i++)
        if (X509_check_ip_asc(x, nm->ip[i], 0) != 1) return nm->ip[i];
    return "";
}

static void fingerprints(X509 *x, hub_tls_cert *out) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    out->sha256[0] = 0;
    if (X509_digest(x, EVP_sha256(), md, &n))
        for (unsigned i = 0; i < n; i++) snprintf(out->sha256 + 3 * i, 4, i + 1 < n ? "%02X:" : "%02X", md[i]);
    out->spki[0] = 0;
    unsigned char *der = NULL;
    const int len = i2d_X509_PUBKEY(X509_get_X509_PUBKEY(x), &der);
    if (len > 0 && EVP_Digest(der, (size_t)len, md, &n, EVP_sha256(), NULL))
        EVP_EncodeBlock((unsigned char *)out->spki, md, (int)n);
    OPENSSL_free(der);
}

static X509 *read_cert(const char *path, moex_error *err) {
    FILE *f = fopen(path, "r");
    if (!f) {
        moex_fail(err, "cannot read the TLS certificate %s: %s", path, strerror(errno));
        return NULL;
    }
    X509 *x = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    if (!x) ssl_fail(err, "the TLS certificate is not a PEM certificate");
    return x;
}

static EVP_PKEY *read_key(const char *path, moex_error *err) {
    FILE *f = fopen(path, "r");
    if (!f) {
        moex_fail(err, "cannot read the TLS key %s: %s", path, strerror(errno));
        return NULL;
    }
    EVP_PKEY *k = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    if (!k) ssl_fail(err, "the TLS key is not an unencrypted PEM private key");
    return k;
}

/* The pair loads and belongs together; the certificate into *x. */
static int load_pair(const char *cert, const char *key, X509 **x, moex_error *err) {
    *x = read_cert(cert, err);
    EVP_PKEY *k = *x ? read_key(key, err) : NULL;
    const bool ok = k && X509_check_private_key(*x, k) == 1;
    if (k && !ok) moex_fail(err, "the TLS key %s does not belong to the certificate %s", key, cert);
    ERR_clear_error();
    EVP_PKEY_free(k);
    if (!ok) {
        X509_free(*x);
        *x = NULL;
        return -1;
    }
    return 0;
}

/* $XDG_CACHE_HOME/moex/tls or ~/.cache/moex/tls, made with its parents (0700). */
static int default_dir(char *out, size_t cap, moex_error *err) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && *xdg) n = snprintf(out, cap, "%s/moex/tls", xdg);
    else if (home && *home) n = snprintf(out, cap, "%s/.cache/moex/tls", home);
    else return moex_fail(err, "no $XDG_CACHE_HOME or $HOME for the TLS certificate: give --tls-dir DIR");
    return n < (int)cap ? 0 : moex_fail(err, "the TLS directory's path is too long");
}

static int make_dirs(const char *dir, moex_error *err) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return moex_fail(err, "--tls-dir: path too long");
    for (char *s = p + 1;; s++) {
        if (*s == '/' || !*s) {
            const char c = *s;
            *s = 0;
            if (mkdir(p, 0700) && errno != EEXIST) return moex_fail(err, "cannot create %s: %s", p, strerror(errno));
            if (!c) break;
            *s = c;
        }
    }
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) return moex_fail(err, "%s is not a directory", dir);
    return 0;
}

static int add_ext(X509 *x, int nid, const char *value) {
    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, x, x, NULL, NULL, 0);
    X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    const int ok = e && X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
    return ok ? 0 : -1;
}

static int set_subject(X509 *x, const names *nm) {
    X509_NAME *sub = X509_get_subject_name(x);
    const char *cn = nm->n_dns > 1 ? nm->dns[1] : nm->dns[0];
    if (!X509_NAME_add_entry_by_txt(sub, "O", MBSTRING_ASC, (const unsigned char *)"MoEx hub (self-signed)", -1, -1, 0) ||
        !X509_NAME_add_entry_by_txt(sub, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0))
        return -1;
    return X509_set_issuer_name(x, sub) ? 0 : -1;
}

static int set_serial(X509 *x) {
    unsigned char r[16];
    if (RAND_bytes(r, sizeof r) != 1) return -1;
    r[0] &= 0x7f; /* positive */
    BIGNUM *bn = BN_bin2bn(r, sizeof r, NULL);
    const int ok = bn && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x));
    BN_free(bn);
    return ok ? 0 : -1;
}

static int set_extensions(X509 *x, const names *nm) {
    char san[4096];
    size_t off = 0;
    for (int i = 0; i < nm->n_dns; i++) off += (size_t)snprintf(san + off, sizeof san - off, "%sDNS:%s", off ? "," : "", nm->dns[i]);
    for (int i = 0; i < nm->n_ip && off < sizeof san; i++)
        off += (size_t)snprintf(san + off, sizeof san - off, ",IP:%s", nm->ip[i]);
    if (off >= sizeof san) return -1;
    return add_ext(x, NID_basic_constraints, "critical,CA:FALSE") ||
           add_ext(x, NID_key_usage, "critical,digitalSignature") ||
           add_ext(x, NID_ext_key_usage, "serverAuth") || add_ext(x, NID_subject_key_identifier, "hash") ||
           add_ext(x, NID_subject_alt_name, san);
}

/* Writes a PEM file through a temporary one, renamed at the end: the key
 * readable by its owner only, the certificate (public) by anyone. */
static int write_pem(const char *path, X509 *x, EVP_PKEY *k, moex_error *err) {
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, x ? 0644 : 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        return moex_fail(err, "cannot write %s: %s", tmp, strerror(errno));
    }
    const int ok = x ? PEM_write_X509(f, x) : PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL);
    if (fclose(f) || !ok || rename(tmp, path)) {
        unlink(tmp);
        return moex_fail(err, "cannot write %s", path);
    }
    return 0;
}

/* A new key and self-signed certificate for nm, written to out's paths. */
static X509 *make_self_signed(const hub_tls_cert *out, const names *nm, moex_error *err) {
    EVP_PKEY *k = EVP_EC_gen("P-256");
    X509 *x = k ? X509_new() : NULL;
    if (!x || !X509_set_version(x, 2) || set_serial(x) || !X509_gmtime_adj(X509_getm_notBefore(x), -3600) ||
        !X509_gmtime_adj(X509_getm_notAfter(x), (long)VALID_DAYS * 86400) || !X509_set_pubkey(x, k) ||
        set_subject(x, nm) || set_extensions(x, nm) || !X509_sign(x, k, EVP_sha256())) {
        ssl_fail(err, "cannot make a self-signed TLS certificate");
        goto fail;
    }
    /* the key first: a certificate on disk always has its key beside it */
    if (write_pem(out->key, NULL, k, err) || write_pem(out->cert, x, NULL, err)) goto fail;
    EVP_PKEY_free(k);
    return x;
fail:
    X509_free(x);
    EVP_PKEY_free(k);
    return NULL;
}

/* Why a stored self-signed pair cannot be reused ("" when it can). */
static void reuse_problem(const hub_tls_cert *out, const names *nm, char *why, size_t cap) {
    struct stat st;
    why[0] = 0;
    if (stat(out->cert, &st) && stat(out->key, &st)) {
        snprintf(why, cap, "none yet");
        return;
    }
    moex_error e = {0};
    X509 *x;
    if (load_pair(out->cert, out->key, &x, &e)) {
        snprintf(why, cap, "%s", e.msg);
        return;
    }
    time_t soon = time(NULL) + RENEW_BEFORE_S;
    const char *lack = missing_name(x, nm);
    if (X509_cmp_time(X509_get0_notAfter(x), &soon) <= 0) snprintf(why, cap, "it expires within a week");
    else if (*lack) snprintf(why, cap, "it does not name %s", lack);
    X509_free(x);
}

int hub_tls_prepare(const char *cert, const char *key, const char *dir, hub_tls_cert *out, moex_error *err) {
    memset(out, 0, sizeof *out);
    X509 *x = NULL;
    if (cert) {
        if (snprintf(out->cert, sizeof out->cert, "%s", cert) >= (int)sizeof out->cert ||
            snprintf(out->key, sizeof out->key, "%s", key) >= (int)sizeof out->key)
            return moex_fail(err, "--tls-cert/--tls-key: path too long");
        if (load_pair(cert, key, &x, err)) return -1;
    } else {
        char d[PATH_MAX];
        if (dir) snprintf(d, sizeof d, "%s", dir);
        else if (default_dir(d, sizeof d, err)) return -1;
        if (make_dirs(d, err)) return -1;
        if (snprintf(out->cert, sizeof out->cert, "%s/cert.pem", d) >= (int)sizeof out->cert ||
            snprintf(out->key, sizeof out->key, "%s/key.pem", d) >= (int)sizeof out->key)
            return moex_fail(err, "the TLS directory's path is too long");
        out->self_signed = true;
        names nm;
        names_of_this_machine(&nm);
        char why[sizeof err->msg];
        reuse_problem(out, &nm, why, sizeof why);
        if (!why[0]) {
            if (load_pair(out->cert, out->key, &x, err)) return -1;
        } else {
            moex_log(MOEX_LOG_INFO, "tls: making a self-signed certificate in %s (%s)", d, why);
            if (!(x = make_self_signed(out, &nm, err))) return -1;
            out->made_now = true;
        }
    }
    fingerprints(x, out);
    X509_free(x);
    return 0;
}
