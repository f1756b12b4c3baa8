/* Control payloads: CANCEL, HEARTBEAT, WEIGHT_SYNC, JOIN, ASSIGN, ERROR.
 * Each has a fixed little-endian part; JOIN, ASSIGN and ERROR end with a
 * variable part whose length the fixed part states and the frame must match. */
#include "proto/wire.h"

#include <xxhash.h>

#include "common/types.h"

uint64_t moex_proto_hash64(const void *data, size_t len) {
    return XXH3_64bits(data, len);
}

moex_proto_expert moex_proto_expert_at(const moex_proto_expert_list *l, uint32_t i) {
    const uint8_t *p = l->bytes + 4 * (size_t)i;
    return (moex_proto_expert){moex_get_u16(p), moex_get_u16(p + 2)};
}

/* A control frame: header with the tensor fields zero except the ids. */
static int begin_control(uint16_t type, uint32_t seq, uint16_t layer, uint16_t expert, size_t payload,
                         uint8_t *out, size_t cap, size_t *out_len, moex_error *err) {
    if (payload > UINT32_MAX - MOEX_PROTO_HEADER_BYTES)
        return moex_proto_fail(err, MOEX_PROTO_E_ARG, "payload of %zu bytes does not fit a frame", payload);
    moex_proto_header h = {.version = MOEX_PROTO_VERSION, .type = type, .payload_len = (uint32_t)payload,
                           .seq = seq, .layer = layer, .expert = expert};
    int rc = moex_proto_begin_frame(&h, out, cap, err);
    if (!rc) *out_len = MOEX_PROTO_HEADER_BYTES + payload;
    return rc;
}

static void put_experts(uint8_t *p, const moex_proto_expert *e, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        moex_put_u16(p + 4 * (size_t)i, e[i].layer);
        moex_put_u16(p + 4 * (size_t)i + 2, e[i].expert);
    }
}

int moex_proto_encode_cancel(uint32_t seq, uint16_t layer, uint16_t expert, uint8_t *out, size_t cap,
                             size_t *out_len, moex_error *err) {
    return begin_control(MOEX_MSG_CANCEL, seq, layer, expert, 0, out, cap, out_len, err);
}

int moex_proto_encode_heartbeat(uint32_t seq, const moex_proto_heartbeat *hb, uint8_t *out, size_t cap,
                                size_t *out_len, moex_error *err) {
    if (hb->load_permille > 1000 || hb->state > MOEX_STATE_DRAINING)
        return moex_proto_fail(err, MOEX_PROTO_E_ARG, "heartbeat load %u (max 1000), state %u (max 3)",
                               hb->load_permille, hb->state);
    int rc = begin_control(MOEX_MSG_HEARTBEAT, seq, 0, 0, MOEX_PROTO_HEARTBEAT_BYTES, out, cap, out_len, err);
    if (rc) return rc;
    uint8_t *p = out + MOEX_PROTO_HEADER_BYTES;
    moex_put_u64(p, hb->timestamp_us);
    moex_put_u64(p + 8, hb->echo_us);
    moex_put_u32(p + 16, hb->queue_depth);
    moex_put_u16(p + 20, hb->load_permille);
    p[22] = hb->state;
    p[23] = 0;
    return MOEX_PROTO_OK;
}

static int is_weight_type(int t) {
    const moex_type_traits *tt = moex_type_get(t);
    return tt && tt->is_weight_type;
}

int moex_proto_encode_weight_chunk(uint32_t seq, uint16_t layer, uint16_t expert, const moex_proto_weight_chunk *c,
                                   uint8_t *out, size_t cap, size_t *out_len, moex_error *err) {
    if (c->kind > MOEX_TENSOR_DOWN || !is_weight_type(c->ggml_type) || c->len == 0 || !c->data ||
        c->offset > c->total || c->total - c->offset < c->len)
        return moex_proto_fail(err, MOEX_PROTO_E_ARG, "weight chunk kind %u type %u, %u bytes at %llu of %llu",
                               c->kind, c->ggml_type, c->len, (unsigned long long)c->offset,
                               (unsigned long long)c->total);
    int rc = begin_control(MOEX_MSG_WEIGHT_SYNC, seq, layer, expert,
                           MOEX_PROTO_WEIGHT_CHUNK_HEADER_BYTES + (size_t)c->len, out, cap, out_len, err);
    if (rc) return rc;
    uint8_t *p = out + MOEX_PROTO_HEADER_BYTES;
    p[0] = c->kind;
    p[1] = c->ggml_type;
    moex_put_u16(p + 2, 0);
    moex_put_u32(p + 4, 0);
    moex_put_u64(p + 8, c->offset);
    moex_put_u64(p + 16, c->total);
    moex_put_u64(p + 24, c->hash);
    memcpy(p + MOEX_PROTO_WEIGHT_CHUNK_HEADER_BYTES, c->data, c->len);
    return MOEX_PROTO_OK;
}

int moex_proto_encode_join(uint32_t seq, const moex_proto_join *j, const moex_proto_expert *held, uint32_t n_held,
                           uint8_t *out, size_t cap, size_t *out_len, moex_error *err) {
    if (j->proto_min == 0 || j->proto_min > j->proto_max || j->backend > MOEX_BACKEND_OTHER ||
        j->capacity_centi == 0 || (j->name_len && !j->name) || (n_held && !held))
        return moex_proto_fail(err, MOEX_PROTO_E_ARG, "join: versions %u..%u, backend %u, capacity %u",
                               j->proto_min, j->proto_max, j->backend, j->capacity_centi);
    size_t payload = MOEX_PROTO_JOIN_FIXED_BYTES + (size_t)j->name_len + 4 * (size_t)n_held;
    int rc = begin_control(MOEX_MSG_JOIN, seq, 0, 0, payload, out, cap, out_len, err);
    if (rc) return rc;
    uint8_t *p = out + MOEX_PROTO_HEADER_BYTES;
    moex_put_u16(p, j->proto_min);
    moex_put_u16(p + 2, j->proto_max);
    p[4] = j->backend;
    p[5] = j->name_len;
    moex_put_u16(p + 6, j->capacity_centi);
    moex_put_u64(p + 8, j->memory_budget);
    moex_put_u64(p + 16, j->model_hash);
    moex_put_u32(p + 24, n_held);
    moex_put_u64(p + 28, j->session);
    if (j->name_len) memcpy(p + MOEX_PROTO_JOIN_FIXED_BYTES, j->name, j->name_len);
    put_experts(p + MOEX_PROTO_JOIN_FIXED_BYTES + j->name_len, held, n_held);
    return MOEX_PROTO_OK;
}

int moex_proto_encode_assign(uint32_t seq, const moex_proto_assign *a, const moex_proto_expert *experts,
                             uint32_t n_experts, uint8_t *out, size_t cap, size_t *out_len, moex_error *err) {
    if (a->replicas == 0 || (n_experts && !experts))
        return moex_proto_fail(err, MOEX_PROTO_E_ARG, "assign: replicas %u, %u experts", a->replicas, n_experts);
    for (uint32_t i = 0; i < n_experts; i++)
        if (experts[i].layer >= a->n_layers || experts[i].expert >= a->n_experts)
            return moex_proto_fail(err, MOEX_PROTO_E_ARG, "assign: expert (%u, %u) outside %u layers x %u experts",
                                   experts[i].layer, experts[i].expert, a->n_layers, a->n_experts);
    size_t payload = MOEX_PROTO_ASSIGN_FIXED_BYTES + 4 * (size_t)n_experts;
    int rc = begin_control(MOEX_MSG_ASSIGN, seq, 0, 0, payload, out, cap, out_len, err);
    if (rc) return rc;
    uint8_t *p = out + MOEX_PROTO_HEADER_BYTES;
    moex_put_u64(p, a->model_hash);
    moex_put_u32(p + 8, a->worker_id);
    moex_put_u16(p + 12, a->n_layers);
    moex_put_u16(p + 14, a->n_experts);
    moex_put_u16(p + 16, a->replicas);
    moex_put_u16(p + 18, 0);
    moex_put_u32(p + 20, n_experts);
    moex_put_u64(p + 24, a->session);
    put_experts(p + MOEX_PROTO_ASSIGN_FIXED_BYTES, experts, n_experts);
    return MOEX_PROTO_OK;
}

int moex_proto_encode_error(uint32_t seq, int32_t code, const char *text, uint16_t text_len, uint8_t *out,
                            size_t cap, size_t *out_len, moex_error *err) {
    if (text_len && !text) return moex_proto_fail(err, MOEX_PROTO_E_ARG, "error text is NULL");
    int rc = begin_control(MOEX_MSG_ERROR, seq, 0, 0, MOEX_PROTO_ERROR_FIXED_BYTES + (size_t)text_len, out, cap,
                           out_len, err);
    if (rc) return rc;
    uint8_t *p = out + MOEX_PROTO_HEADER_BYTES;
    moex_put_u32(p, (uint32_t)code);
    moex_put_u16(p + 4, text_len);
    if (text_len) memcpy(p + MOEX_PROTO_ERROR_FIXED_BYTES, text, text_len);
    return MOEX_PROTO_OK;
}

int moex_proto_encode_auth(uint32_t seq, const char *token, size_t len, uint8_t *out, size_t cap, size_t *out_len,
                           moex_error *err) {
    if (!token || len < 1 || len > MOEX_PROTO_AUTH_MAX_BYTES)
        return moex_proto_fail(err, MOEX_PROTO_E_ARG, "a token of %zu bytes (1..%d)", len, MOEX_PROTO_AUTH_MAX_BYTES);
    int rc = begin_control(MOEX_MSG_AUTH, seq, 0, 0, len, out, cap, out_len, err);
    if (rc) return rc;
    memcpy(out + MOEX_PROTO_HEADER_BYTES, token, len);
    return MOEX_PROTO_OK;
}

/* ---- decoding ---- */

static int parse_heartbeat(moex_proto_msg *m, moex_error *err) {
    const uint8_t *p = m->payload;
    moex_proto_heartbeat *hb = &m->u.heartbeat;
    hb->timestamp_us = moex_get_u64(p);
    hb->echo_us = moex_get_u64(p + 8);
    hb->queue_depth = moex_get_u32(p + 16);
    hb->load_permille = moex_get_u16(p + 20);
    hb->state = p[22];
    if (hb->load_permille > 1000 || hb->state > MOEX_STATE_DRAINING || p[23])
        return moex_proto_fail(err, MOEX_PROTO_E_FIELD, "heartbeat load %u (max 1000), state %u (max 3), reserved %u",
                               hb->load_permille, hb->state, p[23]);
    return MOEX_PROTO_OK;
}

static int parse_weight_chunk(moex_proto_msg *m, const moex_proto_limits *lim, moex_error *err) {
    const uint8_t *p = m->payload;
    moex_proto_weight_chunk *c = &m->u.chunk;
    c->kind = p[0];
    c->ggml_type = p[1];
    c->offset = moex_get_u64(p + 8);
    c->total = moex_get_u64(p + 16);
    c->hash = moex_get_u64(p + 24);
    c->data = p + MOEX_PROTO_WEIGHT_CHUNK_HEADER_BYTES;
    c->len = m->payload_len - MOEX_PROTO_WEIGHT_CHUNK_HEADER_BYTES;
    if (c->kind > MOEX_TENSOR_DOWN || !is_weight_type(c->ggml_type) || moex_get_u16(p + 2) || moex_get_u32(p + 4))
        return moex_proto_fail(err, MOEX_PROTO_E_FIELD, "weight chunk kind %u (max 2), type %u, reserved bytes set?",
                               c->kind, c->ggml_type);
    if (c->total > lim->max_tensor_bytes)
        return moex_proto_fail(err, MOEX_PROTO_E_LIMIT, "tensor of %llu bytes, limit %llu",
                               (unsigned long long)c->total, (unsigned long long)lim->max_tensor_bytes);
    if (c->offset > c->total || c->total - c->offset < c->len)
        return moex_proto_fail(err, MOEX_PROTO_E_LENGTH, "chunk of %u bytes at %llu overruns the tensor's %llu",
                               c->len, (unsigned long long)c->offset, (unsigned long long)c->total);
    return MOEX_PROTO_OK;
}

/* n (layer, expert) pairs at p, each below the given bounds. */
static int parse_experts(const uint8_t *p, uint32_t n, uint32_t max_layer, uint32_t max_expert,
                         moex_proto_expert_list *out, moex_error *err) {
    out->count = n;
    out->bytes = p;
    for (uint32_t i = 0; i < n; i++) {
        moex_proto_expert e = moex_proto_expert_at(out, i);
        if (e.layer >= max_layer || e.expert >= max_expert)
            return moex_proto_fail(err, MOEX_PROTO_E_LIMIT, "expert #%u is (%u, %u), limits %u layers x %u experts", i,
                                   e.layer, e.expert, max_layer, max_expert);
    }
    return MOEX_PROTO_OK;
}

static int check_variable_length(const moex_proto_msg *m, const char *what, uint64_t expect, moex_error *err) {
    if (m->payload_len != expect)
        return moex_proto_fail(err, MOEX_PROTO_E_LENGTH, "%s payload is %u bytes, its fields say %llu", what,
                               m->payload_len, (unsigned long long)expect);
    return MOEX_PROTO_OK;
}

static int parse_join(moex_proto_msg *m, const moex_proto_limits *lim, moex_error *err) {
    const uint8_t *p = m->payload;
    moex_proto_join *j = &m->u.join.info;
    j->proto_min = moex_get_u16(p);
    j->proto_max = moex_get_u16(p + 2);
    j->backend = p[4];
    j->name_len = p[5];
    j->capacity_centi = moex_get_u16(p + 6);
    j->memory_budget = moex_get_u64(p + 8);
    j->model_hash = moex_get_u64(p + 16);
    uint32_t n_held = moex_get_u32(p + 24);
    j->session = moex_get_u64(p + 28);
    j->name = (const char *)p + MOEX_PROTO_JOIN_FIXED_BYTES;
    int rc = check_variable_length(m, "JOIN", MOEX_PROTO_JOIN_FIXED_BYTES + (uint64_t)j->name_len + 4ull * n_held, err);
    if (rc) return rc;
    if (j->proto_min == 0 || j->proto_min > j->proto_max || j->backend > MOEX_BACKEND_OTHER || j->capacity_centi == 0)
        return moex_proto_fail(err, MOEX_PROTO_E_FIELD, "join: versions %u..%u, backend %u (max 3), capacity %u",
                               j->proto_min, j->proto_max, j->backend, j->capacity_centi);
    for (int i = 0; i < j->name_len; i++)
        if ((unsigned char)j->name[i] < 0x20 || j->name[i] == 0x7f)
            return moex_proto_fail(err, MOEX_PROTO_E_FIELD, "join: control character in worker name at %d", i);
    return parse_experts(p + MOEX_PROTO_JOIN_FIXED_BYTES + j->name_len, n_held, lim->max_layers, lim->max_experts,
                         &m->u.join.held, err);
}

static int parse_assign(moex_proto_msg *m, const moex_proto_limits *lim, moex_error *err) {
    const uint8_t *p = m->payload;
    moex_proto_assign *a = &m->u.assign.info;
    a->model_hash = moex_get_u64(p);
    a->worker_id = moex_get_u32(p + 8);
    a->n_layers = moex_get_u16(p + 12);
    a->n_experts = moex_get_u16(p + 14);
    a->replicas = moex_get_u16(p + 16);
    uint32_t n = moex_get_u32(p + 20);
    a->session = moex_get_u64(p + 24);
    int rc = check_variable_length(m, "ASSIGN", MOEX_PROTO_ASSIGN_FIXED_BYTES + 4ull * n, err);
    if (rc) return rc;
    if (a->replicas == 0 || moex_get_u16(p + 18))
        return moex_proto_fail(err, MOEX_PROTO_E_FIELD, "assign: replicas %u, reserved %u", a->replicas,
                               moex_get_u16(p + 18));
    if (a->n_layers > lim->max_layers || a->n_experts > lim->max_experts)
        return moex_proto_fail(err, MOEX_PROTO_E_LIMIT, "assign: model of %u layers x %u experts, limits %u x %u",
                               a->n_layers, a->n_experts, lim->max_layers, lim->max_experts);
    return parse_experts(p + MOEX_PROTO_ASSIGN_FIXED_BYTES, n, a->n_layers, a->n_experts, &m->u.assign.experts, err);
}

static int parse_error(moex_proto_msg *m, moex_error *err) {
    const uint8_t *p = m->payload;
    m->u.error.code = (int32_t)moex_get_u32(p);
    m->u.error.text_len = moex_get_u16(p + 4);
    m->u.error.text = (const char *)p + MOEX_PROTO_ERROR_FIXED_BYTES;
    return check_variable_length(m, "ERROR", MOEX_PROTO_ERROR_FIXED_BYTES + (uint64_t)m->u.error.text_len, err);
}

int moex_proto_parse_control(moex_proto_msg *m, const moex_proto_limits *lim, moex_error *err) {
    switch (m->h.type) {
    case MOEX_MSG_CANCEL: return MOEX_PROTO_OK;
    case MOEX_MSG_HEARTBEAT: return parse_heartbeat(m, err);
    case MOEX_MSG_WEIGHT_SYNC: return parse_weight_chunk(m, lim, err);
    case MOEX_MSG_JOIN: return parse_join(m, lim, err);
    case MOEX_MSG_ASSIGN: return parse_assign(m, lim, err);
    case MOEX_MSG_ERROR: return parse_error(m, err);
    case MOEX_MSG_AUTH: /* its length was checked with the header */
        m->u.auth.token = (const char *)m->payload;
        m->u.auth.len = m->payload_len;
        return MOEX_PROTO_OK;
    default: return moex_proto_fail(err, MOEX_PROTO_E_TYPE, "message type %u", m->h.type);
    }
}
