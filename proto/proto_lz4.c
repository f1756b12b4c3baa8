/* LZ4 compression of tensor payloads. The whole payload (scales, values,
 * gates) is one LZ4 block; its decompressed size is implied by the header, so
 * the receiver decompresses into a buffer of exactly that size. */
#include "proto/wire.h"

#include <lz4.h>

size_t moex_proto_compress_bound(size_t frame_bytes) {
    if (frame_bytes < MOEX_PROTO_HEADER_BYTES || frame_bytes - MOEX_PROTO_HEADER_BYTES > LZ4_MAX_INPUT_SIZE) return 0;
    return MOEX_PROTO_HEADER_BYTES + (size_t)LZ4_compressBound((int)(frame_bytes - MOEX_PROTO_HEADER_BYTES));
}

int moex_proto_compress(const uint8_t *frame, size_t frame_len, uint8_t *out, size_t cap, size_t *out_len,
                        moex_error *err) {
    moex_proto_header h;
    if (!frame || frame_len < MOEX_PROTO_HEADER_BYTES || memcmp(frame, MOEX_PROTO_MAGIC, 4) != 0)
        return moex_proto_fail(err, MOEX_PROTO_E_ARG, "compress: input is not a MoEx frame");
    moex_proto_header_read(frame, &h);
    if ((h.type != MOEX_MSG_DISPATCH && h.type != MOEX_MSG_RESULT) || h.flags != 0 ||
        frame_len != MOEX_PROTO_HEADER_BYTES + (size_t)h.payload_len || h.payload_len > LZ4_MAX_INPUT_SIZE)
        return moex_proto_fail(err, MOEX_PROTO_E_ARG, "compress: need one uncompressed DISPATCH or RESULT frame");
    if (!out || cap <= MOEX_PROTO_HEADER_BYTES)
        return moex_proto_fail(err, MOEX_PROTO_E_BUFFER, "compress: no room for the header");
    size_t room = cap - MOEX_PROTO_HEADER_BYTES;
    int n = LZ4_compress_default((const char *)frame + MOEX_PROTO_HEADER_BYTES, (char *)out + MOEX_PROTO_HEADER_BYTES,
                                 (int)h.payload_len, room > LZ4_MAX_INPUT_SIZE ? LZ4_MAX_INPUT_SIZE : (int)room);
    if (n <= 0)
        return moex_proto_fail(err, MOEX_PROTO_E_BUFFER, "compress: %zu bytes are not enough (bound %zu)", cap,
                               moex_proto_compress_bound(frame_len));
    h.flags |= MOEX_FLAG_COMPRESSED;
    h.payload_len = (uint32_t)n;
    moex_proto_header_write(out, &h);
    *out_len = MOEX_PROTO_HEADER_BYTES + (size_t)n;
    return MOEX_PROTO_OK;
}

/* Reads an LZ4 length extension (bytes of 255 continue it) onto *len. */
static int read_length_ext(const uint8_t **ip, const uint8_t *end, uint64_t *len) {
    uint8_t b;
    do {
        if (*ip >= end) return -1;
        b = *(*ip)++;
        *len += b;
    } while (b == 255);
    return 0;
}

/* Walks the block's sequences (token, literals, offset, match) and returns
 * its decompressed size, stopping once it passes limit; -1 when malformed. */
static int64_t lz4_block_size(const uint8_t *ip, size_t n, uint64_t limit) {
    const uint8_t *end = ip + n;
    uint64_t out = 0;
    if (n == 0) return -1;
    for (;;) {
        if (ip >= end) return -1;
        uint8_t token = *ip++;
        uint64_t lit = token >> 4;
        if (lit == 15 && read_length_ext(&ip, end, &lit)) return -1;
        if ((uint64_t)(end - ip) < lit) return -1;
        ip += lit;
        out += lit;
        if (ip == end) return (int64_t)out; /* the last sequence has literals only */
        if (end - ip < 2) return -1;
        uint16_t offset = moex_get_u16(ip);
        ip += 2;
        if (offset == 0 || offset > out) return -1;
        uint64_t match = token & 15;
        if (match == 15 && read_length_ext(&ip, end, &match)) return -1;
        out += match + 4;
        if (out > limit) return (int64_t)out;
    }
}

int moex_proto_lz4_decompress_exact(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len,
                                    moex_error *err) {
    int64_t size = lz4_block_size(src, src_len, dst_len);
    if (size < 0) return moex_proto_fail(err, MOEX_PROTO_E_LZ4, "malformed LZ4 block of %zu bytes", src_len);
    if ((uint64_t)size != dst_len)
        return moex_proto_fail(err, MOEX_PROTO_E_LZ4_SIZE, "LZ4 block yields %s%lld bytes, the header implies %zu",
                               (uint64_t)size > dst_len ? "at least " : "", (long long)size, dst_len);
    int n = LZ4_decompress_safe((const char *)src, (char *)dst, (int)src_len, (int)dst_len);
    if (n < 0 || (size_t)n != dst_len)
        return moex_proto_fail(err, MOEX_PROTO_E_LZ4, "LZ4 block rejected by the decoder (%d)", n);
    return MOEX_PROTO_OK;
}
