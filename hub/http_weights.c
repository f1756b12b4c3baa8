/* HTTP on the hub's port. Placeholder: every request gets 404 until the
 * expert-download endpoints land. */
#include "hub/dist.h"

int hub_http_callback(moex_hub *hub, struct lws *wsi, enum lws_callback_reasons reason, void **state, void *in,
                      size_t len) {
    (void)hub; (void)state; (void)in; (void)len;
    if (reason == LWS_CALLBACK_HTTP) {
        lws_return_http_status(wsi, HTTP_STATUS_NOT_FOUND, NULL);
        return -1;
    }
    return 0;
}
