/* libFuzzer target for the frame decoder. Besides "no crash, no sanitizer
 * report", it checks two properties on every frame the decoder accepts:
 * re-encoding the decoded message reproduces the input bytes exactly (for
 * uncompressed frames), and every value of a tensor view can be read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"

static uint8_t scratch[1 << 20];
static uint8_t again[(1 << 20) + 64];
static float row[65536];

#define REQUIRE(cond)                                                              \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "fuzz_proto: property failed: %s (line %d)\n", #cond, __LINE__); \
            abort();                                                               \
        }                                                                          \
    } while (0)

static moex_proto_expert *list_to_array(const moex_proto_expert_list *l) {
    moex_proto_expert *a = malloc(sizeof *a * (l->count ? l->count : 1));
    REQUIRE(a != NULL);
    for (uint32_t i = 0; i < l->count; i++) a[i] = moex_proto_expert_at(l, i);
    return a;
}

/* Encodes the decoded message again into `again`; returns the length. */
static size_t reencode(const moex_proto_msg *m) {
    size_t n = 0;
    int rc = -1;
    const moex_proto_header *h = &m->h;
    switch (h->type) {
    case MOEX_MSG_DISPATCH:
    case MOEX_MSG_RESULT: {
        moex_proto_tensor_msg t = {h->type, h->seq, h->layer, h->expert, h->n_tokens, h->hidden, h->dtype};
        rc = moex_proto_encode_tensor_raw(&t, m->u.tensor.values, m->u.tensor.scales, m->u.tensor.gates, again,
                                          sizeof again, &n, NULL);
        break;
    }
    case MOEX_MSG_CANCEL: rc = moex_proto_encode_cancel(h->seq, h->layer, h->expert, again, sizeof again, &n, NULL); break;
    case MOEX_MSG_HEARTBEAT: rc = moex_proto_encode_heartbeat(h->seq, &m->u.heartbeat, again, sizeof again, &n, NULL); break;
    case MOEX_MSG_WEIGHT_SYNC:
        rc = moex_proto_encode_weight_chunk(h->seq, h->layer, h->expert, &m->u.chunk, again, sizeof again, &n, NULL);
        break;
    case MOEX_MSG_JOIN: {
        moex_proto_expert *a = list_to_array(&m->u.join.held);
        rc = moex_proto_encode_join(h->seq, &m->u.join.info, a, m->u.join.held.count, again, sizeof again, &n, NULL);
        free(a);
        break;
    }
    case MOEX_MSG_ASSIGN: {
        moex_proto_expert *a = list_to_array(&m->u.assign.experts);
        rc = moex_proto_encode_assign(h->seq, &m->u.assign.info, a, m->u.assign.experts.count, again, sizeof again,
                                      &n, NULL);
        free(a);
        break;
    }
    case MOEX_MSG_ERROR:
        rc = moex_proto_encode_error(h->seq, m->u.error.code, m->u.error.text, m->u.error.text_len, again,
                                     sizeof again, &n, NULL);
        break;
    case MOEX_MSG_AUTH:
        rc = moex_proto_encode_auth(h->seq, m->u.auth.token, m->u.auth.len, again, sizeof again, &n, NULL);
        break;
    }
    REQUIRE(rc == MOEX_PROTO_OK);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    moex_proto_limits lim = moex_proto_default_limits();
    lim.max_frame_bytes = 1 << 20;
    lim.max_tokens = 4096;
    lim.max_hidden = 8192;
    moex_proto_msg m;
    moex_error err;
    /* as a TCP stream: whole frames never run past the bytes there are */
    size_t whole = 0, ends = 0;
    const int stream_rc = moex_proto_stream_frames(data, size, &lim, &whole, &ends, NULL);
    REQUIRE(stream_rc <= 0 && ends <= whole && whole <= size);
    int rc = moex_proto_decode(data, size, &lim, scratch, sizeof scratch, &m, &err);
    REQUIRE(rc <= 0 && rc >= MOEX_PROTO_E_ARG);
    if (rc != MOEX_PROTO_OK) return 0;
    size_t frame_len = 0;
    REQUIRE(moex_proto_frame_size(data, size, &lim, &frame_len, NULL) == MOEX_PROTO_OK && frame_len == size);
    REQUIRE(stream_rc == MOEX_PROTO_OK && whole == size); /* one valid frame: the whole stream */

    size_t n = reencode(&m);
    if (m.h.flags & MOEX_FLAG_MORE) again[MOEX_PROTO_FLAGS_AT] |= MOEX_FLAG_MORE; /* a transport's mark, not the encoder's */
    if (!(m.h.flags & MOEX_FLAG_COMPRESSED)) {
        REQUIRE(n == size && memcmp(again, data, size) == 0);
    } else {
        /* the decompressed payload, re-sent uncompressed, decodes to the same payload */
        moex_proto_msg u;
        REQUIRE(n == 28 + (size_t)m.payload_len);
        REQUIRE(moex_proto_decode(again, n, &lim, NULL, 0, &u, NULL) == MOEX_PROTO_OK);
        REQUIRE(memcmp(u.payload, m.payload, m.payload_len) == 0);
    }
    if (m.h.type == MOEX_MSG_DISPATCH || m.h.type == MOEX_MSG_RESULT) {
        float sum = 0.0f;
        for (uint32_t t = 0; t < m.u.tensor.n_tokens; t++) {
            moex_proto_tensor_row_f32(&m.u.tensor, t, row);
            sum += row[0] + row[m.u.tensor.hidden - 1] + moex_proto_tensor_gate(&m.u.tensor, t);
        }
        (void)sum;
    }
    return 0;
}
