/* The expert boundary's rounding: a distributed run sends expert inputs in
 * the wire dtype, gates as f16 and gets results back in the wire dtype. The
 * local executor rounds at the same places with the same conversions, so
 * `--local` and hub + workers compute the same function, token for token. */
#include "engine/engine.h"

#include "proto/proto.h"

void moex_wire_round_rows(int wire_dtype, float *rows, int64_t n_rows, int64_t dim, uint8_t *tmp) {
    if (wire_dtype == MOEX_WIRE_EXACT) return;
    uint8_t scale[4];
    for (int64_t r = 0; r < n_rows; r++) {
        float *x = rows + r * dim;
        if (moex_proto_row_from_f32(wire_dtype, x, (uint32_t)dim, tmp, scale)) continue; /* int8 of inf/nan: leave */
        moex_proto_row_to_f32(wire_dtype, tmp, scale, (uint32_t)dim, x);
    }
}

void moex_wire_round_gates(int wire_dtype, float *gates, int64_t n) {
    if (wire_dtype == MOEX_WIRE_EXACT) return;
    for (int64_t i = 0; i < n; i++) gates[i] = moex_f16_to_f32(moex_f32_to_f16(gates[i]));
}

size_t moex_wire_tmp_bytes(int64_t dim) { return (size_t)dim * 4 + 16; }
