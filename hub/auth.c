/* Token checks for WebSocket upgrades and HTTP requests alike, and the rate
 * limit on logging refusals (a flood of bad requests must not become a flood
 * of log lines). */
#include <string.h>

#include "hub/auth.h"

/* Equal strings of the same length, in time independent of where they differ. */
static bool equal_const_time(const char *a, size_t na, const char *b, size_t nb) {
    unsigned diff = (unsigned)(na != nb);
    const size_t n = na < nb ? na : nb;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)a[i] ^ (unsigned char)b[i];
    return diff == 0;
}

bool hub_auth_ok(struct lws *wsi, const char *want) {
    if (!want || !*want) return true;
    const size_t nw = strlen(want);
    char buf[HUB_TOKEN_MAX + 64];
    /* lws_get_urlarg_by_name returns a pointer just past "token=" */
    const char *v = lws_get_urlarg_by_name(wsi, "token=", buf, sizeof buf);
    if (v && equal_const_time(v, strlen(v), want, nw)) return true;
    const int n = lws_hdr_copy(wsi, buf, sizeof buf, WSI_TOKEN_HTTP_AUTHORIZATION);
    return n > 7 && !strncmp(buf, "Bearer ", 7) && equal_const_time(buf + 7, (size_t)n - 7, want, nw);
}

bool hub_auth_token_ok(const char *got, size_t n, const char *want) {
    return !want || !*want || equal_const_time(got, n, want, strlen(want));
}

#define LOG_PER_SECOND 5

bool hub_log_limit_take(hub_log_limit *l, double now, uint32_t *suppressed) {
    if (now - l->window_start >= 1.0) {
        l->window_start = now;
        l->in_window = 0;
    }
    if (l->in_window >= LOG_PER_SECOND) {
        l->suppressed++;
        return false;
    }
    l->in_window++;
    *suppressed = l->suppressed;
    l->suppressed = 0;
    return true;
}
