/* Rows of f32 in the wire's element types, and the expert boundary's
 * rounding through them: the one definition the protocol (its payloads), the
 * engine (--local rounds as the wire would), the hub (experts computed here)
 * and the worker share. */
#ifndef MOEX_WIRE_ROWS_H
#define MOEX_WIRE_ROWS_H

#include <stddef.h>
#include <stdint.h>

/* Tensor element types on the wire (the protocol header's dtype byte). */
typedef enum moex_dtype {
    MOEX_DT_F16 = 1,
    MOEX_DT_BF16 = 2,
    MOEX_DT_INT8 = 3,  /* symmetric, one f32 scale per token: x = q * scale */
    /* 4 is the paper's int4: reserved, rejected with MOEX_PROTO_E_DTYPE. */
    MOEX_DT_F32 = 5,   /* extension: exact activations for testing and debugging */
} moex_dtype;

/* One row of n values to and from dtype. scale is the row's f32 scale bytes
 * (int8 only; written by from_f32, read by to_f32). from_f32 fails (-1) only
 * for int8 rows with non-finite values, or a dtype that is none of these. */
int moex_row_from_f32(int dtype, const float *x, uint32_t n, uint8_t *dst, uint8_t *scale);
void moex_row_to_f32(int dtype, const uint8_t *src, const uint8_t *scale, uint32_t n, float *dst);

/* The expert boundary's rounding. wire_dtype is a MOEX_DT_* or
 * MOEX_WIRE_EXACT (no rounding at all). Rows (expert inputs and results)
 * round through the wire dtype; gates travel as f16 whatever the dtype.
 * tmp holds moex_wire_tmp_bytes(dim). */
#define MOEX_WIRE_EXACT 0
#define MOEX_WIRE_DEFAULT MOEX_DT_F16 /* as in the paper */
void moex_wire_round_rows(int wire_dtype, float *rows, int64_t n_rows, int64_t dim, uint8_t *tmp);
void moex_wire_round_gates(int wire_dtype, float *gates, int64_t n);
size_t moex_wire_tmp_bytes(int64_t dim);

#endif
