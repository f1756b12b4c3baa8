/* DISPATCH and RESULT payloads: section layout, encoding and the zero-copy
 * view (row conversions are in common/wire_rows.c). */
#include "proto/wire.h"

#include <math.h>

#include "common/types.h"

int moex_proto_compute_layout(int type, int dtype, uint32_t n_tokens, uint32_t hidden,
                              moex_proto_tensor_layout *out) {
    size_t elem = moex_proto_dtype_size(dtype);
    if (!elem) return MOEX_PROTO_E_DTYPE;
    if (type != MOEX_MSG_DISPATCH && type != MOEX_MSG_RESULT) return MOEX_PROTO_E_TYPE;
    if (n_tokens == 0 || hidden == 0) return MOEX_PROTO_E_ARG;
    out->scales_off = 0;
    out->values_off = dtype == MOEX_DT_INT8 ? 4 * (size_t)n_tokens : 0;
    out->gates_off = out->values_off + (size_t)n_tokens * hidden * elem;
    out->bytes = out->gates_off + (type == MOEX_MSG_DISPATCH ? 2 * (size_t)n_tokens : 0);
    return MOEX_PROTO_OK;
}

size_t moex_proto_tensor_frame_bytes(const moex_proto_tensor_msg *m) {
    moex_proto_tensor_layout lay;
    if (moex_proto_compute_layout(m->type, m->dtype, m->n_tokens, m->hidden, &lay)) return 0;
    return MOEX_PROTO_HEADER_BYTES + lay.bytes;
}

void moex_proto_tensor_row_f32(const moex_proto_tensor_view *v, uint32_t token, float *dst) {
    size_t row = (size_t)v->hidden * moex_proto_dtype_size(v->dtype);
    const uint8_t *scale = v->scales ? v->scales + 4 * (size_t)token : NULL;
    moex_row_to_f32(v->dtype, v->values + token * row, scale, v->hidden, dst);
}

float moex_proto_tensor_gate(const moex_proto_tensor_view *v, uint32_t token) {
    if (!v->gates || token >= v->n_tokens) return 0.0f;
    return moex_f16_to_f32(moex_get_u16(v->gates + 2 * (size_t)token));
}

/* Checks the message fields, lays out the payload and writes the header. */
static int begin_tensor_frame(const moex_proto_tensor_msg *m, uint8_t *out, size_t cap,
                              moex_proto_tensor_layout *lay, moex_error *err) {
    int rc = moex_proto_compute_layout(m->type, m->dtype, m->n_tokens, m->hidden, lay);
    if (rc)
        return moex_proto_fail(err, MOEX_PROTO_E_ARG, "tensor message type %u, dtype %u, %u tokens x %u hidden",
                               m->type, m->dtype, m->n_tokens, m->hidden);
    if (lay->bytes > UINT32_MAX - MOEX_PROTO_HEADER_BYTES)
        return moex_proto_fail(err, MOEX_PROTO_E_ARG, "payload of %zu bytes does not fit a frame", lay->bytes);
    moex_proto_header h = {
        .version = MOEX_PROTO_VERSION, .type = m->type, .payload_len = (uint32_t)lay->bytes, .seq = m->seq,
        .layer = m->layer, .expert = m->expert, .n_tokens = m->n_tokens, .hidden = m->hidden, .dtype = m->dtype,
    };
    return moex_proto_begin_frame(&h, out, cap, err);
}

static int check_gates_arg(const moex_proto_tensor_msg *m, const void *gates, moex_error *err) {
    int want = m->type == MOEX_MSG_DISPATCH;
    if (want != (gates != NULL))
        return moex_proto_fail(err, MOEX_PROTO_E_ARG, want ? "DISPATCH needs gates" : "RESULT carries no gates");
    return MOEX_PROTO_OK;
}

int moex_proto_encode_tensor_f32(const moex_proto_tensor_msg *m, const float *x, const float *gates,
                                 uint8_t *out, size_t cap, size_t *out_len, moex_error *err) {
    moex_proto_tensor_layout lay;
    int rc = check_gates_arg(m, gates, err);
    if (!rc) rc = begin_tensor_frame(m, out, cap, &lay, err);
    if (rc) return rc;
    uint8_t *p = out + MOEX_PROTO_HEADER_BYTES;
    size_t row = (size_t)m->hidden * moex_proto_dtype_size(m->dtype);
    for (uint32_t t = 0; t < m->n_tokens; t++) {
        if (moex_row_from_f32(m->dtype, x + (size_t)t * m->hidden, m->hidden, p + lay.values_off + t * row,
                              p + lay.scales_off + 4 * (size_t)t))
            return moex_proto_fail(err, MOEX_PROTO_E_ARG, "token %u has a non-finite value; int8 cannot carry it", t);
    }
    if (gates)
        for (uint32_t t = 0; t < m->n_tokens; t++) moex_put_u16(p + lay.gates_off + 2 * (size_t)t, moex_f32_to_f16(gates[t]));
    *out_len = MOEX_PROTO_HEADER_BYTES + lay.bytes;
    return MOEX_PROTO_OK;
}

int moex_proto_encode_tensor_raw(const moex_proto_tensor_msg *m, const void *values, const void *scales,
                                 const void *gates, uint8_t *out, size_t cap, size_t *out_len, moex_error *err) {
    moex_proto_tensor_layout lay;
    int rc = check_gates_arg(m, gates, err);
    if (rc) return rc;
    if ((m->dtype == MOEX_DT_INT8) != (scales != NULL))
        return moex_proto_fail(err, MOEX_PROTO_E_ARG, "scales are needed for int8 and only for int8");
    if (!values) return moex_proto_fail(err, MOEX_PROTO_E_ARG, "no values");
    rc = begin_tensor_frame(m, out, cap, &lay, err);
    if (rc) return rc;
    uint8_t *p = out + MOEX_PROTO_HEADER_BYTES;
    if (scales) memcpy(p + lay.scales_off, scales, 4 * (size_t)m->n_tokens);
    memcpy(p + lay.values_off, values, lay.gates_off - lay.values_off);
    if (gates) memcpy(p + lay.gates_off, gates, 2 * (size_t)m->n_tokens);
    *out_len = MOEX_PROTO_HEADER_BYTES + lay.bytes;
    return MOEX_PROTO_OK;
}

int moex_proto_parse_tensor(moex_proto_msg *m, const moex_proto_limits *lim, moex_error *err) {
    const moex_proto_header *h = &m->h;
    moex_proto_tensor_layout lay;
    moex_proto_compute_layout(h->type, h->dtype, h->n_tokens, h->hidden, &lay);
    if (m->payload_len != lay.bytes) /* the header check and the decompression already ensure it */
        return moex_proto_fail(err, MOEX_PROTO_E_LENGTH, "payload %u bytes, expected %zu", m->payload_len, lay.bytes);
    moex_proto_tensor_view *v = &m->u.tensor;
    v->dtype = h->dtype;
    v->n_tokens = h->n_tokens;
    v->hidden = h->hidden;
    v->values = m->payload + lay.values_off;
    v->scales = h->dtype == MOEX_DT_INT8 ? m->payload + lay.scales_off : NULL;
    v->gates = h->type == MOEX_MSG_DISPATCH ? m->payload + lay.gates_off : NULL;
    for (uint32_t t = 0; v->scales && t < h->n_tokens; t++) {
        float s = moex_get_f32(v->scales + 4 * (size_t)t);
        if (!(s >= 0.0f && isfinite(s)))
            return moex_proto_fail(err, MOEX_PROTO_E_FIELD, "int8 scale of token %u is %g", t, (double)s);
    }
    return MOEX_PROTO_OK;
}
