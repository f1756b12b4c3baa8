/* Internal to the proto module: the little-endian loads and stores
 * (common/le.h) and the encoders' shared helpers. */
#ifndef MOEX_PROTO_WIRE_H
#define MOEX_PROTO_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/le.h"
#include "proto/proto.h"

/* Records a failure: fills err (when given) and returns the status. */
int moex_proto_fail(moex_error *err, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Writes a header for a message of this type and payload length, checking the room in out. */
int moex_proto_begin_frame(const moex_proto_header *h, uint8_t *out, size_t cap, moex_error *err);

/* Decoders of each payload, called once the frame is known to be complete
 * and its payload (decompressed) is at payload[0..h->payload_len or the
 * decompressed size). */
int moex_proto_parse_tensor(moex_proto_msg *m, const moex_proto_limits *lim, moex_error *err);
int moex_proto_parse_control(moex_proto_msg *m, const moex_proto_limits *lim, moex_error *err);

/* Decompresses an LZ4 block that must yield exactly dst_len bytes: the block's
 * sequences are walked first, so a well-formed block of the wrong size gives
 * MOEX_PROTO_E_LZ4_SIZE and a malformed one MOEX_PROTO_E_LZ4. */
int moex_proto_lz4_decompress_exact(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len,
                                    moex_error *err);

#endif
