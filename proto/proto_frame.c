/* Frames as a receiver sees them: every check that needs only the header
 * (so that a stream reader can reject a frame before reading its payload),
 * the frame's size, and moex_proto_decode, which hands the payload to the
 * tensor or control parser (decompressing it first when flagged). The top
 * of proto/: it uses the header, tensor, control and LZ4 files, none of
 * which calls back here. */
#include "proto/wire.h"

#include <lz4.h>

static int is_tensor_type(int type) {
    return type == MOEX_MSG_DISPATCH || type == MOEX_MSG_RESULT;
}

static int check_ids(const moex_proto_header *h, const moex_proto_limits *lim, moex_error *err) {
    if (h->layer >= lim->max_layers)
        return moex_proto_fail(err, MOEX_PROTO_E_LIMIT, "layer %u >= limit %u", h->layer, lim->max_layers);
    if (h->expert >= lim->max_experts)
        return moex_proto_fail(err, MOEX_PROTO_E_LIMIT, "expert %u >= limit %u", h->expert, lim->max_experts);
    return MOEX_PROTO_OK;
}

/* DISPATCH / RESULT: dims within limits, payload length consistent with them. */
static int check_tensor_header(const moex_proto_header *h, const moex_proto_limits *lim, moex_error *err) {
    if (!moex_proto_dtype_size(h->dtype))
        return moex_proto_fail(err, MOEX_PROTO_E_DTYPE, "dtype %u (known: 1 f16, 2 bf16, 3 int8, 5 f32)", h->dtype);
    int rc = check_ids(h, lim, err);
    if (rc) return rc;
    if (h->n_tokens == 0 || h->n_tokens > lim->max_tokens)
        return moex_proto_fail(err, MOEX_PROTO_E_LIMIT, "tokens %u not in 1..%u", h->n_tokens, lim->max_tokens);
    if (h->hidden == 0 || h->hidden > lim->max_hidden)
        return moex_proto_fail(err, MOEX_PROTO_E_LIMIT, "hidden %u not in 1..%u", h->hidden, lim->max_hidden);
    moex_proto_tensor_layout lay;
    moex_proto_compute_layout(h->type, h->dtype, h->n_tokens, h->hidden, &lay);
    if (lay.bytes + MOEX_PROTO_HEADER_BYTES > lim->max_frame_bytes)
        return moex_proto_fail(err, MOEX_PROTO_E_TOO_BIG, "%u tokens x %u hidden %s need %zu payload bytes, limit %u",
                               h->n_tokens, h->hidden, moex_proto_dtype_name(h->dtype), lay.bytes,
                               lim->max_frame_bytes);
    if (h->flags & MOEX_FLAG_COMPRESSED) {
        if (lay.bytes > LZ4_MAX_INPUT_SIZE)
            return moex_proto_fail(err, MOEX_PROTO_E_TOO_BIG, "%zu bytes of data are beyond LZ4's block size", lay.bytes);
        if (h->payload_len == 0 || h->payload_len > (size_t)LZ4_compressBound((int)lay.bytes))
            return moex_proto_fail(err, MOEX_PROTO_E_LENGTH, "compressed payload of %u bytes for %zu bytes of data",
                                   h->payload_len, lay.bytes);
    } else if (h->payload_len != lay.bytes) {
        return moex_proto_fail(err, MOEX_PROTO_E_LENGTH, "payload %u bytes, but %u tokens x %u hidden %s%s = %zu",
                               h->payload_len, h->n_tokens, h->hidden, moex_proto_dtype_name(h->dtype),
                               h->type == MOEX_MSG_DISPATCH ? " + gates" : "", lay.bytes);
    }
    return MOEX_PROTO_OK;
}

/* Control messages: tensor fields unused (zero); fixed-size payloads exact. */
static int check_control_header(const moex_proto_header *h, const moex_proto_limits *lim, moex_error *err) {
    if (h->n_tokens || h->hidden || h->dtype)
        return moex_proto_fail(err, MOEX_PROTO_E_FIELD, "message type %u must have tokens, hidden and dtype 0", h->type);
    int uses_ids = h->type == MOEX_MSG_CANCEL || h->type == MOEX_MSG_WEIGHT_SYNC;
    if (uses_ids) {
        int rc = check_ids(h, lim, err);
        if (rc) return rc;
    } else if (h->layer || h->expert) {
        return moex_proto_fail(err, MOEX_PROTO_E_FIELD, "message type %u must have layer and expert 0", h->type);
    }
    uint32_t n = h->payload_len;
    switch (h->type) {
    case MOEX_MSG_CANCEL:
        if (n != 0) return moex_proto_fail(err, MOEX_PROTO_E_LENGTH, "CANCEL has no payload, got %u bytes", n);
        break;
    case MOEX_MSG_HEARTBEAT:
        if (n != MOEX_PROTO_HEARTBEAT_BYTES)
            return moex_proto_fail(err, MOEX_PROTO_E_LENGTH, "HEARTBEAT payload is %d bytes, got %u",
                                   MOEX_PROTO_HEARTBEAT_BYTES, n);
        break;
    case MOEX_MSG_WEIGHT_SYNC:
        if (n <= MOEX_PROTO_WEIGHT_CHUNK_HEADER_BYTES)
            return moex_proto_fail(err, MOEX_PROTO_E_LENGTH, "WEIGHT_SYNC payload of %u bytes has no data", n);
        break;
    case MOEX_MSG_JOIN:
        if (n < MOEX_PROTO_JOIN_FIXED_BYTES)
            return moex_proto_fail(err, MOEX_PROTO_E_LENGTH, "JOIN payload of %u bytes < %d", n, MOEX_PROTO_JOIN_FIXED_BYTES);
        break;
    case MOEX_MSG_ASSIGN:
        if (n < MOEX_PROTO_ASSIGN_FIXED_BYTES)
            return moex_proto_fail(err, MOEX_PROTO_E_LENGTH, "ASSIGN payload of %u bytes < %d", n,
                                   MOEX_PROTO_ASSIGN_FIXED_BYTES);
        break;
    case MOEX_MSG_ERROR:
        if (n < MOEX_PROTO_ERROR_FIXED_BYTES)
            return moex_proto_fail(err, MOEX_PROTO_E_LENGTH, "ERROR payload of %u bytes < %d", n, MOEX_PROTO_ERROR_FIXED_BYTES);
        break;
    case MOEX_MSG_AUTH:
        if (n < 1 || n > MOEX_PROTO_AUTH_MAX_BYTES)
            return moex_proto_fail(err, MOEX_PROTO_E_LENGTH, "AUTH payload of %u bytes (1..%d)", n,
                                   MOEX_PROTO_AUTH_MAX_BYTES);
        break;
    }
    return MOEX_PROTO_OK;
}

int moex_proto_header_check(const moex_proto_header *h, const moex_proto_limits *lim, moex_error *err) {
    if (h->version != MOEX_PROTO_VERSION)
        return moex_proto_fail(err, MOEX_PROTO_E_VERSION, "version %u, this build speaks %d", h->version,
                               MOEX_PROTO_VERSION);
    if (h->type < MOEX_MSG_DISPATCH || h->type > MOEX_MSG_AUTH)
        return moex_proto_fail(err, MOEX_PROTO_E_TYPE, "message type %u", h->type);
    if (h->flags & ~(MOEX_FLAG_COMPRESSED | MOEX_FLAG_MORE))
        return moex_proto_fail(err, MOEX_PROTO_E_FLAGS, "reserved flag bits set: 0x%02x", h->flags);
    if (h->flags && !is_tensor_type(h->type))
        return moex_proto_fail(err, MOEX_PROTO_E_FLAGS, "message type %u takes no flags (0x%02x)", h->type, h->flags);
    if ((uint64_t)h->payload_len + MOEX_PROTO_HEADER_BYTES > lim->max_frame_bytes)
        return moex_proto_fail(err, MOEX_PROTO_E_TOO_BIG, "payload of %u bytes, frame limit %u", h->payload_len,
                               lim->max_frame_bytes);
    return is_tensor_type(h->type) ? check_tensor_header(h, lim, err) : check_control_header(h, lim, err);
}

static int read_checked_header(const uint8_t *buf, size_t len, const moex_proto_limits *lim,
                               moex_proto_header *h, moex_error *err) {
    moex_proto_limits defaults = moex_proto_default_limits();
    if (!lim) lim = &defaults;
    if (!buf || len < MOEX_PROTO_HEADER_BYTES)
        return moex_proto_fail(err, MOEX_PROTO_E_TRUNCATED, "%zu bytes, the header alone is %d", buf ? len : 0,
                               MOEX_PROTO_HEADER_BYTES);
    if (memcmp(buf, MOEX_PROTO_MAGIC, 4) != 0)
        return moex_proto_fail(err, MOEX_PROTO_E_MAGIC, "first bytes %02x %02x %02x %02x", buf[0], buf[1], buf[2],
                               buf[3]);
    moex_proto_header_read(buf, h);
    return moex_proto_header_check(h, lim, err);
}

int moex_proto_frame_size(const uint8_t *buf, size_t len, const moex_proto_limits *lim, size_t *frame_bytes,
                          moex_error *err) {
    moex_proto_header h;
    int rc = read_checked_header(buf, len, lim, &h, err);
    if (rc) return rc;
    *frame_bytes = MOEX_PROTO_HEADER_BYTES + (size_t)h.payload_len;
    return MOEX_PROTO_OK;
}

size_t moex_proto_scratch_bytes(const moex_proto_header *h) {
    if (!(h->flags & MOEX_FLAG_COMPRESSED)) return 0;
    moex_proto_tensor_layout lay;
    if (moex_proto_compute_layout(h->type, h->dtype, h->n_tokens, h->hidden, &lay)) return 0;
    return lay.bytes;
}

int moex_proto_decode(const uint8_t *frame, size_t len, const moex_proto_limits *lim, void *scratch,
                      size_t scratch_cap, moex_proto_msg *out, moex_error *err) {
    moex_proto_limits defaults = moex_proto_default_limits();
    if (!lim) lim = &defaults;
    memset(out, 0, sizeof *out);
    int rc = read_checked_header(frame, len, lim, &out->h, err);
    if (rc) return rc;
    size_t frame_len = MOEX_PROTO_HEADER_BYTES + (size_t)out->h.payload_len;
    if (len < frame_len)
        return moex_proto_fail(err, MOEX_PROTO_E_TRUNCATED, "%zu bytes of a %zu-byte frame", len, frame_len);
    if (len > frame_len)
        return moex_proto_fail(err, MOEX_PROTO_E_TRAILING, "%zu bytes after a %zu-byte frame", len - frame_len,
                               frame_len);
    out->payload = frame + MOEX_PROTO_HEADER_BYTES;
    out->payload_len = out->h.payload_len;
    if (out->h.flags & MOEX_FLAG_COMPRESSED) {
        size_t need = moex_proto_scratch_bytes(&out->h);
        if (!scratch || scratch_cap < need)
            return moex_proto_fail(err, MOEX_PROTO_E_SCRATCH, "compressed frame needs %zu bytes of scratch, got %zu",
                                   need, scratch ? scratch_cap : 0);
        rc = moex_proto_lz4_decompress_exact(out->payload, out->payload_len, scratch, need, err);
        if (rc) return rc;
        out->payload = scratch;
        out->payload_len = (uint32_t)need;
    }
    if (out->h.type == MOEX_MSG_DISPATCH || out->h.type == MOEX_MSG_RESULT)
        return moex_proto_parse_tensor(out, lim, err);
    return moex_proto_parse_control(out, lim, err);
}
