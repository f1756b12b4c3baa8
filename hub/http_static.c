/* The browser worker page (docs/BROWSER.md) on the hub's port: the files of
 * <build>/web at /worker/, and /worker redirected there with its query
 * string (the token). The redirect is ours, not lws's mounts': theirs drops
 * the query. Without it the browser's preload scanner would fetch the
 * page's relative URLs (app.js, worker.css) from / before the page's
 * <base> took effect.
 *
 * No token is needed: the files hold no secret, and a browser fetching the
 * page's scripts and WebAssembly sends no Authorization header (the
 * WebSocket, the weights and the API still check theirs). libwebsockets
 * does the HTTP: lws_serve_http_file writes the head, then the file one
 * pt_serv_buf_size chunk per writeable callback (memory bounded, whatever
 * the file's size), and answers HEAD with the head alone. This file only
 * maps a path to a file and its type.
 *
 * Paths: lws has already decoded %xx and folded "/./", "/../" and "//"; a
 * path that still names a segment starting with '.' is refused, and the
 * file's real path (symbolic links resolved) must lie inside the directory. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hub/http.h"

struct hub_static {
    char root[PATH_MAX];        /* the directory's real path */
    size_t root_len;
};

#define MOUNT "/worker"

/* Types by extension; the .wasm type lets browsers compile while downloading. */
static const struct {
    const char *ext, *type;
} mime_types[] = {
    {".html", "text/html; charset=utf-8"},
    {".js", "text/javascript"},
    {".mjs", "text/javascript"},
    {".css", "text/css"},
    {".wasm", "application/wasm"},
    {".wgsl", "text/plain; charset=utf-8"},
    {".json", "application/json"},
    {".txt", "text/plain; charset=utf-8"},
    {".svg", "image/svg+xml"},
    {".png", "image/png"},
    {".ico", "image/x-icon"},
};

const char *hub_static_mime_type(const char *path) {
    const size_t n = strlen(path);
    for (size_t i = 0; i < sizeof mime_types / sizeof *mime_types; i++) {
        const size_t e = strlen(mime_types[i].ext);
        if (n > e && !strcmp(path + n - e, mime_types[i].ext)) return mime_types[i].type;
    }
    return "application/octet-stream";
}

hub_static *hub_static_create(const char *dir, moex_error *err) {
    hub_static *s = calloc(1, sizeof *s);
    if (!s) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    struct stat st;
    if (!realpath(dir, s->root) || stat(s->root, &st) || !S_ISDIR(st.st_mode)) {
        moex_fail(err, "the browser worker page's directory %s: %s", dir, errno ? strerror(errno) : "not a directory");
        free(s);
        return NULL;
    }
    s->root_len = strlen(s->root);
    return s;
}

void hub_static_free(hub_static *s) { free(s); }

const char *hub_static_dir(const hub_static *s) { return s->root; }

/* The request's path (GET or HEAD) into uri; false for other methods or a too long path. */
static bool request_path(struct lws *wsi, char *uri, size_t cap) {
    const enum lws_token_indexes tok[] = {WSI_TOKEN_GET_URI, WSI_TOKEN_HEAD_URI};
    for (size_t i = 0; i < 2; i++) {
        const int n = lws_hdr_total_length(wsi, tok[i]);
        if (n > 0) return n < (int)cap && lws_hdr_copy(wsi, uri, (int)cap, tok[i]) > 0;
    }
    return false;
}

bool hub_static_claims(struct lws *wsi) {
    char uri[PATH_MAX];
    if (!request_path(wsi, uri, sizeof uri)) return false;
    return !strncmp(uri, MOUNT, sizeof MOUNT - 1) && (uri[sizeof MOUNT - 1] == 0 || uri[sizeof MOUNT - 1] == '/');
}

/* Whether every segment of rel (a path below the mount) is a plain name. */
static bool plain_segments(const char *rel) {
    for (const char *p = rel; *p;) {
        while (*p == '/') p++;
        if (*p == '.') return false;       /* ".", "..", hidden files */
        while (*p && *p != '/') {
            if (*p == '\\' || (unsigned char)*p < 0x20) return false;
            p++;
        }
    }
    return true;
}

/* The file a path under the mount names, as its real path inside the root;
 * false when there is none (or it lies outside). */
static bool resolve(const hub_static *s, const char *rel, char *out) {
    char joined[PATH_MAX];
    if (!*rel || !strcmp(rel, "/")) rel = "/index.html";
    if (!plain_segments(rel) || snprintf(joined, sizeof joined, "%s%s", s->root, rel) >= (int)sizeof joined)
        return false;
    struct stat st;
    return realpath(joined, out) && !strncmp(out, s->root, s->root_len) && out[s->root_len] == '/' &&
           stat(out, &st) == 0 && S_ISREG(st.st_mode);
}

static bool unreserved(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || strchr("-._~", c);
}

/* The request's query string ("" or "?a=b&c=d"), encoded again: lws hands
 * its arguments over decoded, one per fragment. -1 when it does not fit. */
static int query_of(struct lws *wsi, char *out, size_t cap) {
    char frag[4096];
    size_t n = 0;
    out[0] = 0;
    for (int i = 0;; i++) {
        const int len = lws_hdr_copy_fragment(wsi, frag, sizeof frag, WSI_TOKEN_HTTP_URI_ARGS, i);
        if (len == -1) return 0; /* no more */
        if (len < 0 || n + 2 >= cap) return -1;
        out[n++] = i ? '&' : '?';
        bool named = false;
        for (const char *p = frag; *p; p++) {
            if (n + 4 >= cap) return -1;
            if (unreserved(*p) || (*p == '=' && !named)) out[n++] = *p;
            else n += (size_t)snprintf(out + n, cap - n, "%%%02X", (unsigned char)*p);
            named |= *p == '=';
        }
        out[n] = 0;
    }
}

/* /worker -> 302 /worker/, the query kept. */
static int redirect_to_dir(struct lws *wsi) {
    char loc[8192] = MOUNT "/";
    if (query_of(wsi, loc + sizeof MOUNT, sizeof loc - sizeof MOUNT)) {
        if (hub_http_answer_error(wsi, HTTP_STATUS_REQ_URI_TOO_LONG, NULL, "query string too long")) return -1;
        return lws_http_transaction_completed(wsi) ? -1 : 0;
    }
    uint8_t buf[LWS_PRE + sizeof loc + 512], *start = buf + LWS_PRE, *p = start, *end = buf + sizeof buf - 1;
    if (lws_http_redirect(wsi, HTTP_STATUS_FOUND, (const unsigned char *)loc, (int)strlen(loc), &p, end) < 0) return -1;
    return lws_http_transaction_completed(wsi) ? -1 : 0;
}

static int not_found(struct lws *wsi, const char *uri) {
    char peer[64] = "?";
    lws_get_peer_simple(wsi, peer, sizeof peer);
    moex_log(MOEX_LOG_INFO, "http: %s %s -> 404: no such file in the worker page", peer, uri);
    if (hub_http_answer_error(wsi, HTTP_STATUS_NOT_FOUND, NULL, "no such file in the worker page")) return -1;
    return lws_http_transaction_completed(wsi) ? -1 : 0;
}

int hub_static_serve(hub_static *s, struct lws *wsi) {
    char uri[PATH_MAX], path[PATH_MAX];
    if (!request_path(wsi, uri, sizeof uri)) return -1;
    if (!strcmp(uri, MOUNT)) return redirect_to_dir(wsi);
    if (!resolve(s, uri + sizeof MOUNT - 1, path)) return not_found(wsi, uri);
    uint8_t headers[256], *p = headers, *end = headers + sizeof headers;
    if (lws_add_http_header_by_name(wsi, (const unsigned char *)"x-content-type-options:",
                                    (const unsigned char *)"nosniff", 7, &p, end))
        return -1;
    moex_log(MOEX_LOG_DEBUG, "http: GET %s -> %s", uri, path);
    const int rc = lws_serve_http_file(wsi, path, hub_static_mime_type(path), (const char *)headers, (int)(p - headers));
    /* < 0: hang up; > 0: answered whole (HEAD, or an error status lws wrote) */
    if (rc < 0 || (rc > 0 && lws_http_transaction_completed(wsi))) return -1;
    return 0;
}
