/* Every error the hub's HTTP side answers is OpenAI's error JSON (http.h),
 * whoever answers it: the weights, the worker page, a refused WebSocket
 * upgrade, an unknown path. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/unicode.h"
#include "hub/http.h"

static const char *type_of(unsigned status) {
    switch (status) {
    case HTTP_STATUS_UNAUTHORIZED:
    case HTTP_STATUS_FORBIDDEN: return "authentication_error";
    case HTTP_STATUS_NOT_FOUND: return "not_found_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

char *hub_http_error_json(unsigned status, const char *code, const char *message) {
    char text[1024];
    moex_utf8_sanitize(message, strlen(message), text, sizeof text);
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", text);
    cJSON_AddStringToObject(e, "type", type_of(status));
    cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

int hub_http_answer_error(struct lws *wsi, unsigned status, const char *code, const char *fmt, ...) {
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    char *body = hub_http_error_json(status, code, message);
    if (!body) return -1;
    const size_t n = strlen(body);
    uint8_t buf[LWS_PRE + 2048], *start = buf + LWS_PRE, *p = start, *end = buf + sizeof buf - 1;
    int rc = -1;
    if (n < sizeof buf - LWS_PRE - 512 &&
        !lws_add_http_common_headers(wsi, status, "application/json", (lws_filepos_t)n, &p, end) &&
        !lws_finalize_write_http_header(wsi, start, &p, end)) {
        memcpy(start, body, n); /* the head is out: its buffer takes the body */
        rc = lws_write(wsi, start, n, LWS_WRITE_HTTP_FINAL) == (int)n ? 0 : -1;
    }
    cJSON_free(body);
    return rc;
}
