/* The frame header's byte layout, the limits, status and dtype names, and
 * the helpers every encoder and decoder shares: the bottom of proto/. */
#include "proto/wire.h"

#include <stdarg.h>
#include <stdio.h>


const char *moex_proto_strerror(int status) {
    switch (status) {
    case MOEX_PROTO_OK: return "ok";
    case MOEX_PROTO_E_TRUNCATED: return "frame truncated";
    case MOEX_PROTO_E_MAGIC: return "bad magic (not a MoEx frame)";
    case MOEX_PROTO_E_VERSION: return "unsupported protocol version";
    case MOEX_PROTO_E_TYPE: return "unknown message type";
    case MOEX_PROTO_E_DTYPE: return "unknown or unsupported dtype";
    case MOEX_PROTO_E_FLAGS: return "invalid flags";
    case MOEX_PROTO_E_TOO_BIG: return "frame exceeds the size limit";
    case MOEX_PROTO_E_LIMIT: return "dimension or id outside the limits";
    case MOEX_PROTO_E_LENGTH: return "payload length disagrees with the fields";
    case MOEX_PROTO_E_TRAILING: return "bytes after the end of the frame";
    case MOEX_PROTO_E_FIELD: return "field holds a value not allowed here";
    case MOEX_PROTO_E_LZ4: return "corrupt LZ4 payload";
    case MOEX_PROTO_E_LZ4_SIZE: return "LZ4 payload decompresses to the wrong size";
    case MOEX_PROTO_E_SCRATCH: return "scratch buffer too small";
    case MOEX_PROTO_E_BUFFER: return "output buffer too small";
    case MOEX_PROTO_E_ARG: return "invalid argument";
    default: return "unknown status";
    }
}

int moex_proto_fail(moex_error *err, int status, const char *fmt, ...) {
    if (err) {
        char detail[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(detail, sizeof detail, fmt, ap);
        va_end(ap);
        snprintf(err->msg, sizeof err->msg, "%s: %s", moex_proto_strerror(status), detail);
    }
    return status;
}

moex_proto_limits moex_proto_default_limits(void) {
    return (moex_proto_limits){
        .max_hidden = 65535,
        .max_tokens = 65536,
        .max_layers = 1024,
        .max_experts = 4096,
        .max_frame_bytes = 64u << 20,
        .max_tensor_bytes = 4ull << 30,
    };
}

size_t moex_proto_dtype_size(int dtype) {
    switch (dtype) {
    case MOEX_DT_F16: return 2;
    case MOEX_DT_BF16: return 2;
    case MOEX_DT_INT8: return 1;
    case MOEX_DT_F32: return 4;
    default: return 0;
    }
}

const char *moex_proto_dtype_name(int dtype) {
    switch (dtype) {
    case MOEX_DT_F16: return "f16";
    case MOEX_DT_BF16: return "bf16";
    case MOEX_DT_INT8: return "int8";
    case MOEX_DT_F32: return "f32";
    default: return "?";
    }
}

void moex_proto_header_write(uint8_t out[MOEX_PROTO_HEADER_BYTES], const moex_proto_header *h) {
    memcpy(out, MOEX_PROTO_MAGIC, 4);
    moex_put_u16(out + 4, h->version);
    moex_put_u16(out + 6, h->type);
    moex_put_u32(out + 8, h->payload_len);
    moex_put_u32(out + 12, h->seq);
    moex_put_u16(out + 16, h->layer);
    moex_put_u16(out + 18, h->expert);
    moex_put_u32(out + 20, h->n_tokens);
    moex_put_u16(out + 24, h->hidden);
    out[26] = h->dtype;
    out[MOEX_PROTO_FLAGS_AT] = h->flags;
}

void moex_proto_header_read(const uint8_t in[MOEX_PROTO_HEADER_BYTES], moex_proto_header *h) {
    h->version = moex_get_u16(in + 4);
    h->type = moex_get_u16(in + 6);
    h->payload_len = moex_get_u32(in + 8);
    h->seq = moex_get_u32(in + 12);
    h->layer = moex_get_u16(in + 16);
    h->expert = moex_get_u16(in + 18);
    h->n_tokens = moex_get_u32(in + 20);
    h->hidden = moex_get_u16(in + 24);
    h->dtype = in[26];
    h->flags = in[MOEX_PROTO_FLAGS_AT];
}

int moex_proto_begin_frame(const moex_proto_header *h, uint8_t *out, size_t cap, moex_error *err) {
    size_t need = MOEX_PROTO_HEADER_BYTES + (size_t)h->payload_len;
    if (!out || cap < need)
        return moex_proto_fail(err, MOEX_PROTO_E_BUFFER, "frame needs %zu bytes, buffer has %zu", need, out ? cap : 0);
    moex_proto_header_write(out, h);
    return MOEX_PROTO_OK;
}

