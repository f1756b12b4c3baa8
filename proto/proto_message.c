/* Messages as transports carry them: fragments reassembled into a bounded
 * buffer, and a message split into its frames (see proto.h, "Messages"). */
#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"

/* A reassembly buffer keeps up to this much memory between messages. */
#define REASM_KEEP_BYTES ((size_t)4 << 20)

int moex_proto_reasm_add(moex_proto_reasm *r, const void *data, size_t n, moex_error *err) {
    if (n > r->max_bytes || r->len > r->max_bytes - n) {
        moex_proto_reasm_reset(r);
        return moex_proto_fail(err, MOEX_PROTO_E_TOO_BIG, "message over %zu bytes", r->max_bytes);
    }
    if (r->len + n > r->cap) {
        size_t cap = r->cap ? r->cap : 64 * 1024;
        while (cap < r->len + n) cap *= 2;
        if (cap > r->max_bytes) cap = r->max_bytes;
        uint8_t *grown = realloc(r->buf, cap);
        if (!grown) return moex_proto_fail(err, MOEX_PROTO_E_ARG, "out of memory for a %zu-byte message", r->len + n);
        r->buf = grown;
        r->cap = cap;
    }
    if (n) memcpy(r->buf + r->len, data, n);
    r->len += n;
    return 0;
}

void moex_proto_reasm_reset(moex_proto_reasm *r) {
    r->len = 0;
    if (r->cap > REASM_KEEP_BYTES) {
        free(r->buf);
        r->buf = NULL;
        r->cap = 0;
    }
}

void moex_proto_reasm_free(moex_proto_reasm *r) {
    free(r->buf);
    r->buf = NULL;
    r->len = r->cap = 0;
}

int moex_proto_next_frame(const uint8_t *msg, size_t len, size_t *off, const moex_proto_limits *lim,
                          size_t *frame_len, moex_error *err) {
    if (*off >= len) return 0;
    size_t n = 0;
    int rc = moex_proto_frame_size(msg + *off, len - *off, lim, &n, err);
    if (rc) return rc;
    if (n > len - *off) return moex_proto_fail(err, MOEX_PROTO_E_TRUNCATED, "frame of %zu bytes, %zu left in the message",
                                                n, len - *off);
    *frame_len = n;
    return 1;
}

int moex_proto_stream_frames(const uint8_t *buf, size_t len, const moex_proto_limits *lim, size_t *whole,
                             size_t *messages, moex_error *err) {
    size_t off = 0, n = 0, ends = 0;
    int rc = MOEX_PROTO_OK;
    while (len - off >= MOEX_PROTO_HEADER_BYTES) {
        if ((rc = moex_proto_frame_size(buf + off, len - off, lim, &n, err))) break;
        if (n > len - off) break;
        const uint8_t flags = buf[off + MOEX_PROTO_FLAGS_AT];
        off += n;
        if (!(flags & MOEX_FLAG_MORE)) ends = off;
    }
    *whole = off;
    if (messages) *messages = ends;
    return rc;
}
