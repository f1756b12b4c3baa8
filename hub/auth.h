/* Private to the hub: who may talk to it. */
#ifndef MOEX_HUB_AUTH_H
#define MOEX_HUB_AUTH_H

#include <stdbool.h>
#include <stdint.h>

#include <libwebsockets.h>

#include "proto/proto.h"

/* The longest token accepted (longer ones are refused at start-up): the
 * protocol's, which the worker takes too. */
#define HUB_TOKEN_MAX MOEX_PROTO_AUTH_MAX_BYTES

/* Whether the request (an HTTP request or a WebSocket upgrade) presents the
 * token, as `?token=T` (browsers cannot set headers on a WebSocket) or
 * `Authorization: Bearer T`. An empty want accepts everyone. The comparison
 * takes the same time wherever the strings differ. */
bool hub_auth_ok(struct lws *wsi, const char *want);
/* The same for a token as bytes (the TCP transport's AUTH frame). */
bool hub_auth_token_ok(const char *got, size_t n, const char *want);

/* Rate-limited logging of refusals: returns true when this refusal should
 * be logged (the first few of each second; the rest are only counted and
 * summed up in the next logged line's *suppressed). */
typedef struct hub_log_limit {
    double window_start;
    uint32_t in_window, suppressed;
} hub_log_limit;
bool hub_log_limit_take(hub_log_limit *l, double now, uint32_t *suppressed);

#endif
