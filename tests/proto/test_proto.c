/* The wire protocol: golden header bytes, round trips of every message type
 * and dtype (plain and LZ4), and one specific error code for each kind of
 * malformed frame. `test_proto --write-corpus DIR` writes one valid frame of
 * each kind as seeds for fuzz_proto. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lz4.h>

#include "common/types.h"
#include "proto/proto.h"

#include "tests/test_util.h"

/* ---- helpers ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rng_normal(void) {
    float u1 = (rng_u32() + 1.0f) / 4294967297.0f, u2 = rng_u32() / 4294967296.0f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }

static moex_proto_limits lim;
static uint8_t scratch[1 << 20];

/* Decodes and checks the expected status; on failure the error message must say something. */
static int decode_expect(const uint8_t *f, size_t n, int want, moex_proto_msg *m, const char *what) {
    moex_error err = {{0}};
    moex_proto_msg local;
    int rc = moex_proto_decode(f, n, &lim, scratch, sizeof scratch, m ? m : &local, &err);
    CHECK(rc == want, "%s: got %d (%s), want %d (%s); %s", what, rc, moex_proto_strerror(rc), want,
          moex_proto_strerror(want), err.msg);
    if (rc != MOEX_PROTO_OK) CHECK(err.msg[0] != 0, "%s: no error message", what);
    return rc;
}

/* ---- golden bytes ---- */

static void test_golden_header(void) {
    /* DISPATCH, seq 0x01020304, layer 5, expert 0x0102, 1 token x 4 hidden f16,
     * values {1, -2, 0.5, 0}, gate 0.25. Written out by hand from the spec. */
    static const uint8_t golden[] = {
        'M', 'o', 'E', 'x',     /* magic */
        0x01, 0x00,             /* version 1 */
        0x01, 0x00,             /* type DISPATCH */
        0x0a, 0x00, 0x00, 0x00, /* payload length 10 = 4 x f16 + 1 gate */
        0x04, 0x03, 0x02, 0x01, /* sequence id 0x01020304 */
        0x05, 0x00,             /* layer 5 */
        0x02, 0x01,             /* expert 0x0102 */
        0x01, 0x00, 0x00, 0x00, /* tokens 1 */
        0x04, 0x00,             /* hidden 4 */
        0x01,                   /* dtype f16 */
        0x00,                   /* flags */
        0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38, 0x00, 0x00, /* 1.0, -2.0, 0.5, 0.0 */
        0x00, 0x34,                                     /* gate 0.25 */
    };
    moex_proto_tensor_msg m = {.type = MOEX_MSG_DISPATCH, .seq = 0x01020304, .layer = 5, .expert = 0x0102,
                               .n_tokens = 1, .hidden = 4, .dtype = MOEX_DT_F16};
    float x[4] = {1.0f, -2.0f, 0.5f, 0.0f}, gate = 0.25f;
    uint8_t buf[64];
    size_t n = 0;
    CHECK(moex_proto_encode_tensor_f32(&m, x, &gate, buf, sizeof buf, &n, NULL) == 0, "encode");
    CHECK(n == sizeof golden && memcmp(buf, golden, n) == 0, "encoded bytes differ from the golden frame");
    CHECK(moex_proto_tensor_frame_bytes(&m) == sizeof golden, "frame size");

    moex_proto_msg msg;
    if (decode_expect(golden, sizeof golden, MOEX_PROTO_OK, &msg, "golden") == 0) {
        CHECK(msg.h.version == 1 && msg.h.type == MOEX_MSG_DISPATCH && msg.h.payload_len == 10, "header");
        CHECK(msg.h.seq == 0x01020304 && msg.h.layer == 5 && msg.h.expert == 0x0102, "ids");
        CHECK(msg.h.n_tokens == 1 && msg.h.hidden == 4 && msg.h.dtype == 1 && msg.h.flags == 0, "dims");
        CHECK(msg.u.tensor.values == golden + 28 && msg.u.tensor.gates == golden + 36, "view is not zero-copy");
        float y[4];
        moex_proto_tensor_row_f32(&msg.u.tensor, 0, y);
        CHECK(y[0] == 1.0f && y[1] == -2.0f && y[2] == 0.5f && y[3] == 0.0f, "values");
        CHECK(moex_proto_tensor_gate(&msg.u.tensor, 0) == 0.25f, "gate");
    }

    /* HEARTBEAT, seq 7: ts 0x1122334455667788, echo 1, queue 3, load 500, state READY. */
    static const uint8_t golden_hb[] = {
        'M', 'o', 'E', 'x', 0x01, 0x00, 0x04, 0x00, 0x18, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, /* timestamp_us */
        0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* echo_us */
        0x03, 0x00, 0x00, 0x00,                         /* queue depth */
        0xf4, 0x01,                                     /* load 500 permille */
        0x02, 0x00,                                     /* state READY, reserved */
    };
    moex_proto_heartbeat hb = {.timestamp_us = 0x1122334455667788ull, .echo_us = 1, .queue_depth = 3,
                               .load_permille = 500, .state = MOEX_STATE_READY};
    CHECK(moex_proto_encode_heartbeat(7, &hb, buf, sizeof buf, &n, NULL) == 0, "encode heartbeat");
    CHECK(n == sizeof golden_hb && memcmp(buf, golden_hb, n) == 0, "heartbeat bytes differ from the golden frame");

    /* int8 RESULT, 1 token x 2: scale first (f32 0.5 = 00 00 00 3f), then values {2, -4} -> q {4, -8}... */
    static const uint8_t golden_i8[] = {
        'M', 'o', 'E', 'x', 0x01, 0x00, 0x02, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x03, 0x00,
        0x00, 0x00, 0x00, 0x3f, /* scale 0.5 */
        0x04, 0xf8,             /* 4, -8 */
    };
    if (decode_expect(golden_i8, sizeof golden_i8, MOEX_PROTO_OK, &msg, "golden int8") == 0) {
        float y[2];
        moex_proto_tensor_row_f32(&msg.u.tensor, 0, y);
        CHECK(y[0] == 2.0f && y[1] == -4.0f, "int8 values %g %g", y[0], y[1]);
        CHECK(msg.u.tensor.gates == NULL, "RESULT has no gates");
    }
}

/* ---- tensor round trips ---- */

static float tolerance(int dtype, float x, float row_amax) {
    switch (dtype) {
    case MOEX_DT_F32: return 0.0f;
    case MOEX_DT_F16: return fabsf(x) * (1.0f / 2048) + 6e-8f;  /* half an ulp + subnormal step */
    case MOEX_DT_BF16: return fabsf(x) * (1.0f / 256);
    case MOEX_DT_INT8: return row_amax / 127.0f * 0.5f * 1.0001f;
    }
    return 0.0f;
}

static void roundtrip_tensor(int type, int dtype, uint32_t tokens, uint32_t hidden, int compress) {
    char what[96];
    snprintf(what, sizeof what, "%s %s %ux%u%s", type == MOEX_MSG_DISPATCH ? "DISPATCH" : "RESULT",
             moex_proto_dtype_name(dtype), tokens, hidden, compress ? " lz4" : "");
    size_t nx = (size_t)tokens * hidden;
    float *x = malloc(nx * sizeof *x), *y = malloc(hidden * sizeof *y), gates[64];
    for (size_t i = 0; i < nx; i++) x[i] = rng_normal() * (i % 97 == 0 ? 40.0f : 1.0f);
    if (nx > 3) x[1] = 0.0f, x[2] = -0.0f;
    for (uint32_t t = 0; t < tokens; t++) gates[t] = (rng_u32() % 1000) / 1000.0f;
    moex_proto_tensor_msg m = {.type = (uint16_t)type, .seq = rng_u32(), .layer = 47, .expert = 127,
                               .n_tokens = tokens, .hidden = (uint16_t)hidden, .dtype = (uint8_t)dtype};
    size_t cap = moex_proto_tensor_frame_bytes(&m), n = 0;
    uint8_t *frame = malloc(cap), *z = malloc(moex_proto_compress_bound(cap));
    moex_error err = {{0}};
    int rc = moex_proto_encode_tensor_f32(&m, x, type == MOEX_MSG_DISPATCH ? gates : NULL, frame, cap, &n, &err);
    CHECK(rc == 0 && n == cap, "%s: encode %d %s", what, rc, err.msg);
    const uint8_t *sent = frame;
    size_t sent_len = n;
    if (compress) {
        rc = moex_proto_compress(frame, n, z, moex_proto_compress_bound(cap), &sent_len, &err);
        CHECK(rc == 0, "%s: compress %s", what, err.msg);
        sent = z;
    }
    moex_proto_msg msg;
    if (decode_expect(sent, sent_len, MOEX_PROTO_OK, &msg, what) == 0) {
        CHECK(msg.h.type == type && msg.h.seq == m.seq && msg.h.layer == 47 && msg.h.expert == 127, "%s: ids", what);
        CHECK(msg.h.n_tokens == tokens && msg.h.hidden == hidden && msg.h.dtype == dtype, "%s: dims", what);
        CHECK(!!(msg.h.flags & MOEX_FLAG_COMPRESSED) == compress, "%s: flag", what);
        CHECK(msg.payload_len == cap - 28 && memcmp(msg.payload, frame + 28, cap - 28) == 0, "%s: payload", what);
        if (compress) CHECK(msg.payload == scratch, "%s: decompressed elsewhere", what);
        else CHECK(msg.payload == frame + 28, "%s: not zero-copy", what);
        int worst_ok = 1;
        for (uint32_t t = 0; t < tokens; t++) {
            float amax = 0;
            for (uint32_t i = 0; i < hidden; i++) amax = fmaxf(amax, fabsf(x[(size_t)t * hidden + i]));
            moex_proto_tensor_row_f32(&msg.u.tensor, t, y);
            for (uint32_t i = 0; i < hidden; i++) {
                float a = x[(size_t)t * hidden + i];
                if (!(fabsf(y[i] - a) <= tolerance(dtype, a, amax))) worst_ok = 0;
            }
            if (type == MOEX_MSG_DISPATCH) {
                float g = moex_proto_tensor_gate(&msg.u.tensor, t);
                CHECK(fabsf(g - gates[t]) <= gates[t] / 2048 + 6e-8f, "%s: gate %u %g vs %g", what, t, g, gates[t]);
            }
        }
        CHECK(worst_ok, "%s: a value is outside the dtype's tolerance", what);
        if (type == MOEX_MSG_RESULT) CHECK(msg.u.tensor.gates == NULL, "%s: gates", what);
    }
    free(x);
    free(y);
    free(frame);
    free(z);
}

static void test_tensor_roundtrips(void) {
    const int types[] = {MOEX_MSG_DISPATCH, MOEX_MSG_RESULT};
    const int dtypes[] = {MOEX_DT_F16, MOEX_DT_BF16, MOEX_DT_INT8, MOEX_DT_F32};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 2; c++) {
                roundtrip_tensor(types[a], dtypes[b], 1, 2048, c);
                roundtrip_tensor(types[a], dtypes[b], 5, 33, c);
                roundtrip_tensor(types[a], dtypes[b], 1, 1, c);
            }
    /* raw sections in wire form encode to the same bytes as from f32 */
    moex_proto_tensor_msg m = {.type = MOEX_MSG_DISPATCH, .seq = 9, .n_tokens = 2, .hidden = 8, .dtype = MOEX_DT_INT8};
    float x[16], g[2] = {0.5f, 0.25f};
    for (int i = 0; i < 16; i++) x[i] = rng_normal();
    uint8_t a[256], b[256];
    size_t na, nb;
    CHECK(moex_proto_encode_tensor_f32(&m, x, g, a, sizeof a, &na, NULL) == 0, "encode f32");
    moex_proto_tensor_layout lay;
    CHECK(moex_proto_compute_layout(m.type, m.dtype, 2, 8, &lay) == 0, "layout");
    CHECK(lay.scales_off == 0 && lay.values_off == 8 && lay.gates_off == 24 && lay.bytes == 28, "int8 layout");
    const uint8_t *p = a + 28;
    CHECK(moex_proto_encode_tensor_raw(&m, p + lay.values_off, p, p + lay.gates_off, b, sizeof b, &nb, NULL) == 0,
          "encode raw");
    CHECK(na == nb && memcmp(a, b, na) == 0, "raw and f32 encodings differ");
    /* an all-zero int8 row has scale 0 and decodes to zeros */
    float zero[8] = {0}, out[8];
    uint8_t q[8], s[4];
    CHECK(moex_row_from_f32(MOEX_DT_INT8, zero, 8, q, s) == 0, "zero row");
    moex_row_to_f32(MOEX_DT_INT8, q, s, 8, out);
    for (int i = 0; i < 8; i++) CHECK(out[i] == 0.0f, "zero row decodes to %g", out[i]);
    /* f16 saturates to inf, keeps NaN; int8 refuses non-finite rows */
    float odd[3] = {1e6f, NAN, -INFINITY};
    uint8_t h[6];
    CHECK(moex_row_from_f32(MOEX_DT_F16, odd, 3, h, NULL) == 0, "f16 odd");
    moex_row_to_f32(MOEX_DT_F16, h, NULL, 3, out);
    CHECK(isinf(out[0]) && out[0] > 0 && isnan(out[1]) && isinf(out[2]) && out[2] < 0, "f16 specials");
    CHECK(moex_row_from_f32(MOEX_DT_INT8, odd, 3, q, s) == -1, "int8 NaN accepted");
    x[3] = NAN;
    CHECK(moex_proto_encode_tensor_f32(&m, x, g, a, sizeof a, &na, NULL) == MOEX_PROTO_E_ARG, "int8 frame with NaN");
    x[3] = 0.0f, x[12] = INFINITY;
    CHECK(moex_proto_encode_tensor_f32(&m, x, g, a, sizeof a, &na, NULL) == MOEX_PROTO_E_ARG, "int8 frame with inf");
}

/* ---- conversion paths ---- */

static uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float float_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* The vectorised / F16C row conversions give the scalar reference's results
 * (common/types.h) for every class of value; rows of 19 cover SIMD body and tail. */
static void test_conversion_paths(void) {
    enum { N = 19 };
    float x[N], back[N];
    uint8_t w[4 * N], sc[4];
    int bad_f16 = 0, bad_bf16 = 0, bad_i8 = 0;
    for (int rep = 0; rep < 20000; rep++) {
        for (int i = 0; i < N; i++) {
            uint32_t u = rng_u32() ^ (rng_u32() << 16);
            /* bias towards the f16 range and its edges */
            if (rep % 3 == 0) u = (u & 0x807fffffu) | ((uint32_t)(100 + rng_u32() % 60) << 23);
            if (rep % 7 == 1 && i == 3) u = 0x7fc00001u;
            x[i] = float_of(u);
        }
        moex_row_from_f32(MOEX_DT_F16, x, N, w, NULL);
        for (int i = 0; i < N; i++) {
            uint16_t got = (uint16_t)(w[2 * i] | (w[2 * i + 1] << 8)), want = moex_f32_to_f16(x[i]);
            int both_nan = isnan(x[i]) && (got & 0x7c00) == 0x7c00 && (got & 0x3ff);
            bad_f16 += got != want && !both_nan;
        }
        moex_row_from_f32(MOEX_DT_BF16, x, N, w, NULL);
        for (int i = 0; i < N; i++) bad_bf16 += (uint16_t)(w[2 * i] | (w[2 * i + 1] << 8)) != moex_f32_to_bf16(x[i]);
    }
    CHECK(bad_f16 == 0, "%d f32->f16 conversions differ from moex_f32_to_f16", bad_f16);
    CHECK(bad_bf16 == 0, "%d f32->bf16 conversions differ from moex_f32_to_bf16", bad_bf16);
    /* every f16 and bf16 value decodes as the reference does */
    int bad_dec = 0;
    for (uint32_t h = 0; h < 65536; h += N) {
        for (int i = 0; i < N; i++) put16(w + 2 * i, (uint16_t)(h + i));
        moex_row_to_f32(MOEX_DT_F16, w, NULL, N, back);
        for (int i = 0; i < N && h + i < 65536; i++) {
            float want = moex_f16_to_f32((uint16_t)(h + i));
            bad_dec += bits_of(back[i]) != bits_of(want) && !(isnan(back[i]) && isnan(want));
        }
        moex_row_to_f32(MOEX_DT_BF16, w, NULL, N, back);
        for (int i = 0; i < N && h + i < 65536; i++)
            bad_dec += bits_of(back[i]) != bits_of(moex_bf16_to_f32((uint16_t)(h + i)));
    }
    CHECK(bad_dec == 0, "%d f16/bf16 decodes differ from the reference", bad_dec);
    /* int8: q = round-to-nearest-even(x * 127 / max|x|), as lrintf computes it */
    for (int rep = 0; rep < 2000; rep++) {
        float scale = ldexpf(1.0f, (int)(rng_u32() % 40) - 20);
        for (int i = 0; i < N; i++) x[i] = rng_normal() * scale;
        if (rep % 5 == 0) x[rep % N] = 0.5f * 127.0f / 127.0f;
        moex_row_from_f32(MOEX_DT_INT8, x, N, w, sc);
        float amax = 0;
        for (int i = 0; i < N; i++) amax = fmaxf(amax, fabsf(x[i]));
        for (int i = 0; i < N; i++) bad_i8 += (int8_t)w[i] != (int8_t)lrintf(x[i] * (127.0f / amax));
        bad_i8 += bits_of(float_of((uint32_t)(sc[0] | sc[1] << 8 | sc[2] << 16 | (uint32_t)sc[3] << 24))) !=
                  bits_of(amax / 127.0f);
    }
    CHECK(bad_i8 == 0, "%d int8 quantisations differ from lrintf", bad_i8);
}

/* ---- control round trips ---- */

static void test_control_roundtrips(void) {
    uint8_t f[1024];
    size_t n;
    moex_proto_msg m;

    CHECK(moex_proto_encode_cancel(77, 3, 9, f, sizeof f, &n, NULL) == 0 && n == 28, "cancel");
    if (decode_expect(f, n, 0, &m, "cancel") == 0)
        CHECK(m.h.type == MOEX_MSG_CANCEL && m.h.seq == 77 && m.h.layer == 3 && m.h.expert == 9, "cancel fields");

    moex_proto_heartbeat hb = {.timestamp_us = 123456789012345ull, .echo_us = 42, .queue_depth = 17,
                               .load_permille = 1000, .state = MOEX_STATE_DRAINING};
    CHECK(moex_proto_encode_heartbeat(5, &hb, f, sizeof f, &n, NULL) == 0, "heartbeat");
    if (decode_expect(f, n, 0, &m, "heartbeat") == 0)
        CHECK(m.u.heartbeat.timestamp_us == hb.timestamp_us && m.u.heartbeat.echo_us == 42 &&
                  m.u.heartbeat.queue_depth == 17 && m.u.heartbeat.load_permille == 1000 &&
                  m.u.heartbeat.state == MOEX_STATE_DRAINING,
              "heartbeat fields");

    uint8_t data[300];
    for (int i = 0; i < 300; i++) data[i] = (uint8_t)(i * 31);
    moex_proto_weight_chunk c = {.kind = MOEX_TENSOR_DOWN, .ggml_type = 12 /* q4_K */, .offset = 1000,
                                 .total = 1300, .hash = moex_proto_hash64(data, 300), .data = data, .len = 300};
    CHECK(moex_proto_encode_weight_chunk(6, 40, 100, &c, f, sizeof f, &n, NULL) == 0 && n == 28 + 32 + 300, "chunk");
    if (decode_expect(f, n, 0, &m, "weight chunk") == 0) {
        const moex_proto_weight_chunk *d = &m.u.chunk;
        CHECK(m.h.layer == 40 && m.h.expert == 100 && d->kind == MOEX_TENSOR_DOWN && d->ggml_type == 12, "chunk ids");
        CHECK(d->offset == 1000 && d->total == 1300 && d->len == 300 && memcmp(d->data, data, 300) == 0, "chunk data");
        CHECK(d->hash == moex_proto_hash64(d->data, d->len) && d->hash != moex_proto_hash64(data, 299), "chunk hash");
    }

    moex_proto_expert held[3] = {{0, 1}, {47, 127}, {12, 64}};
    moex_proto_join j = {.proto_min = 1, .proto_max = 1, .backend = MOEX_BACKEND_VULKAN, .capacity_centi = 250,
                         .memory_budget = 8ull << 30, .model_hash = 0xfeedfacecafebeefull,
                         .session = 0x8877665544332211ull, .name = "gpu-box", .name_len = 7};
    CHECK(moex_proto_encode_join(1, &j, held, 3, f, sizeof f, &n, NULL) == 0 && n == 28 + 36 + 7 + 12, "join");
    if (decode_expect(f, n, 0, &m, "join") == 0) {
        const moex_proto_join *d = &m.u.join.info;
        CHECK(d->proto_min == 1 && d->proto_max == 1 && d->backend == MOEX_BACKEND_VULKAN && d->capacity_centi == 250,
              "join caps");
        CHECK(d->memory_budget == (8ull << 30) && d->model_hash == j.model_hash, "join sizes");
        CHECK(d->session == j.session, "join session key");
        CHECK(d->name_len == 7 && memcmp(d->name, "gpu-box", 7) == 0, "join name");
        CHECK(m.u.join.held.count == 3, "join held count");
        for (uint32_t i = 0; i < 3 && m.u.join.held.count == 3; i++) {
            moex_proto_expert e = moex_proto_expert_at(&m.u.join.held, i);
            CHECK(e.layer == held[i].layer && e.expert == held[i].expert, "held %u", i);
        }
    }
    CHECK(moex_proto_encode_join(1, &(moex_proto_join){.proto_min = 1, .proto_max = 1, .capacity_centi = 1}, NULL, 0,
                                 f, sizeof f, &n, NULL) == 0 && n == 64, "empty join");
    decode_expect(f, n, 0, &m, "empty join");

    moex_proto_assign a = {.model_hash = 0x0123456789abcdefull, .worker_id = 12, .n_layers = 48, .n_experts = 128,
                           .replicas = 2, .session = 0xa5a5a5a5deadbeefull};
    CHECK(moex_proto_encode_assign(2, &a, held, 3, f, sizeof f, &n, NULL) == 0 && n == 28 + 32 + 12, "assign");
    if (decode_expect(f, n, 0, &m, "assign") == 0) {
        const moex_proto_assign *d = &m.u.assign.info;
        CHECK(d->model_hash == a.model_hash && d->worker_id == 12 && d->n_layers == 48 && d->n_experts == 128 &&
                  d->replicas == 2 && d->session == a.session,
              "assign fields");
        CHECK(m.u.assign.experts.count == 3 && moex_proto_expert_at(&m.u.assign.experts, 2).expert == 64, "assign list");
    }

    CHECK(moex_proto_encode_error(99, MOEX_PROTO_E_LENGTH, "bad frame", 9, f, sizeof f, &n, NULL) == 0, "error");
    if (decode_expect(f, n, 0, &m, "error") == 0)
        CHECK(m.h.seq == 99 && m.u.error.code == MOEX_PROTO_E_LENGTH && m.u.error.text_len == 9 &&
                  memcmp(m.u.error.text, "bad frame", 9) == 0,
              "error fields");

    CHECK(moex_proto_encode_auth(0, "s3cret", 6, f, sizeof f, &n, NULL) == 0 && n == 28 + 6, "auth");
    if (decode_expect(f, n, 0, &m, "auth") == 0)
        CHECK(m.h.type == MOEX_MSG_AUTH && m.u.auth.len == 6 && memcmp(m.u.auth.token, "s3cret", 6) == 0, "auth token");
    CHECK(moex_proto_encode_auth(0, "", 0, f, sizeof f, &n, NULL) == MOEX_PROTO_E_ARG, "auth: an empty token refused");
}

/* ---- malformed frames ---- */

static size_t make_dispatch(uint8_t *f, size_t cap, int dtype) {
    float x[2 * 16], g[2] = {0.5f, 0.5f};
    for (int i = 0; i < 32; i++) x[i] = (float)i - 7.5f;
    moex_proto_tensor_msg m = {.type = MOEX_MSG_DISPATCH, .seq = 1, .layer = 2, .expert = 3, .n_tokens = 2,
                               .hidden = 16, .dtype = (uint8_t)dtype};
    size_t n = 0;
    moex_proto_encode_tensor_f32(&m, x, g, f, cap, &n, NULL);
    return n;
}

static void test_every_truncation(void) {
    uint8_t frames[6][512];
    size_t lens[6];
    lens[0] = make_dispatch(frames[0], 512, MOEX_DT_INT8);
    moex_proto_heartbeat hb = {.state = 2};
    moex_proto_encode_heartbeat(1, &hb, frames[1], 512, &lens[1], NULL);
    moex_proto_encode_cancel(1, 0, 0, frames[2], 512, &lens[2], NULL);
    moex_proto_expert e = {1, 1};
    moex_proto_join j = {.proto_min = 1, .proto_max = 1, .capacity_centi = 100, .name = "w", .name_len = 1};
    moex_proto_encode_join(1, &j, &e, 1, frames[3], 512, &lens[3], NULL);
    uint8_t raw[512];
    lens[4] = make_dispatch(raw, 512, MOEX_DT_F16);
    moex_proto_compress(raw, lens[4], frames[4], 512, &lens[4], NULL);
    moex_proto_encode_error(1, 5, "x", 1, frames[5], 512, &lens[5], NULL);
    for (int k = 0; k < 6; k++) {
        decode_expect(frames[k], lens[k], MOEX_PROTO_OK, NULL, "untruncated");
        int bad = 0;
        for (size_t n = 0; n < lens[k]; n++) {
            moex_proto_msg m;
            bad += moex_proto_decode(frames[k], n, &lim, scratch, sizeof scratch, &m, NULL) != MOEX_PROTO_E_TRUNCATED;
        }
        CHECK(bad == 0, "frame %d: %d truncations not reported as truncated", k, bad);
        size_t need = 0;
        CHECK(moex_proto_frame_size(frames[k], 28, &lim, &need, NULL) == 0 && need == lens[k], "frame_size");
    }
}

static void test_malformed_header(void) {
    uint8_t good[512], f[512];
    size_t n = make_dispatch(good, sizeof good, MOEX_DT_F16);
#define MUTATE(stmt, want, what) do { memcpy(f, good, n); stmt; decode_expect(f, n, want, NULL, what); } while (0)
    for (int i = 0; i < 4; i++) MUTATE(f[i] ^= 0x20, MOEX_PROTO_E_MAGIC, "magic");
    MUTATE(memcpy(f, "xEoM", 4), MOEX_PROTO_E_MAGIC, "reversed magic");
    MUTATE(put16(f + 4, 0), MOEX_PROTO_E_VERSION, "version 0");
    MUTATE(put16(f + 4, 2), MOEX_PROTO_E_VERSION, "version 2");
    MUTATE(put16(f + 4, 0x0100), MOEX_PROTO_E_VERSION, "big-endian version");
    MUTATE(put16(f + 6, 0), MOEX_PROTO_E_TYPE, "type 0");
    MUTATE(put16(f + 6, 10), MOEX_PROTO_E_TYPE, "type 10");
    MUTATE(put16(f + 6, 0xffff), MOEX_PROTO_E_TYPE, "type 0xffff");
    MUTATE(f[26] = 0, MOEX_PROTO_E_DTYPE, "dtype 0");
    MUTATE(f[26] = 4, MOEX_PROTO_E_DTYPE, "dtype int4");
    MUTATE(f[26] = 6, MOEX_PROTO_E_DTYPE, "dtype 6");
    MUTATE(f[26] = 255, MOEX_PROTO_E_DTYPE, "dtype 255");
    MUTATE(f[27] = 0x04, MOEX_PROTO_E_FLAGS, "flag bit 2");
    MUTATE(f[27] = 0x80, MOEX_PROTO_E_FLAGS, "flag bit 7");
    /* dims that disagree with the payload length */
    MUTATE(put32(f + 20, 3), MOEX_PROTO_E_LENGTH, "tokens 3 for a 2-token payload");
    MUTATE(put16(f + 24, 15), MOEX_PROTO_E_LENGTH, "hidden 15 for 16");
    MUTATE(f[26] = MOEX_DT_F32, MOEX_PROTO_E_LENGTH, "f32 dtype on an f16 payload");
    MUTATE(f[26] = MOEX_DT_INT8, MOEX_PROTO_E_LENGTH, "int8 dtype on an f16 payload");
    MUTATE(put16(f + 6, MOEX_MSG_RESULT), MOEX_PROTO_E_LENGTH, "RESULT with gates");
    MUTATE(put32(f + 8, (uint32_t)n - 28 - 1), MOEX_PROTO_E_LENGTH, "length one short");
    memcpy(f, good, n);
    put32(f + 8, (uint32_t)n - 28 + 1);
    f[n] = 0;
    decode_expect(f, n + 1, MOEX_PROTO_E_LENGTH, NULL, "length one long");
    /* limits */
    MUTATE(put32(f + 20, 0), MOEX_PROTO_E_LIMIT, "zero tokens");
    MUTATE(put16(f + 24, 0), MOEX_PROTO_E_LIMIT, "zero hidden");
    MUTATE(put16(f + 16, (uint16_t)lim.max_layers), MOEX_PROTO_E_LIMIT, "layer at the limit");
    MUTATE(put16(f + 18, (uint16_t)lim.max_experts), MOEX_PROTO_E_LIMIT, "expert at the limit");
    MUTATE(put32(f + 20, lim.max_tokens + 1), MOEX_PROTO_E_LIMIT, "tokens over the limit");
    MUTATE(put16(f + 24, (uint16_t)(lim.max_hidden + 1)), MOEX_PROTO_E_LIMIT, "hidden over the limit");
    /* oversized: rejected from the header alone, before the payload is read */
    MUTATE(put32(f + 8, 0xffffffffu), MOEX_PROTO_E_TOO_BIG, "4 GiB payload length");
    decode_expect(f, 28, MOEX_PROTO_E_TOO_BIG, NULL, "4 GiB payload length, header only");
    size_t need = 0;
    CHECK(moex_proto_frame_size(f, 28, &lim, &need, NULL) == MOEX_PROTO_E_TOO_BIG, "frame_size of a huge frame");
    MUTATE((put32(f + 20, 60000), put16(f + 24, 60000), put32(f + 8, 16)), MOEX_PROTO_E_TOO_BIG,
           "dims implying 7 GB");
    /* trailing bytes */
    memcpy(f, good, n);
    decode_expect(f, n + 1, MOEX_PROTO_E_TRAILING, NULL, "one trailing byte");
    /* the flag and limits checks do not depend on the payload arriving */
    CHECK(moex_proto_frame_size(good, 27, &lim, &need, NULL) == MOEX_PROTO_E_TRUNCATED, "frame_size of 27 bytes");
    moex_proto_msg m;
    CHECK(moex_proto_decode(good, n, &lim, NULL, 0, &m, NULL) == 0, "uncompressed frames need no scratch");
    CHECK(moex_proto_decode(good, n, NULL, NULL, 0, &m, NULL) == 0, "NULL limits are the defaults");
    CHECK(moex_proto_decode(NULL, 100, &lim, NULL, 0, &m, NULL) == MOEX_PROTO_E_TRUNCATED, "NULL frame");
#undef MUTATE
}

static void test_malformed_lz4(void) {
    uint8_t raw[512], z[1024], f[1024];
    size_t n = make_dispatch(raw, sizeof raw, MOEX_DT_F16), zn = 0;  /* payload 2*16*2 + 4 = 68 bytes */
    CHECK(moex_proto_compress(raw, n, z, sizeof z, &zn, NULL) == 0, "compress");
    decode_expect(z, zn, MOEX_PROTO_OK, NULL, "compressed");
    moex_proto_msg m;
    moex_error err = {{0}};
    CHECK(moex_proto_decode(z, zn, &lim, scratch, 67, &m, &err) == MOEX_PROTO_E_SCRATCH, "small scratch: %s", err.msg);
    CHECK(moex_proto_decode(z, zn, &lim, NULL, 0, &m, NULL) == MOEX_PROTO_E_SCRATCH, "no scratch");

    /* frame with a hand-made LZ4 block as payload */
#define WITH_BLOCK(block, len, want, what)                                   \
    do {                                                                    \
        memcpy(f, z, 28);                                                   \
        put32(f + 8, (uint32_t)(len));                                      \
        memcpy(f + 28, block, len);                                         \
        decode_expect(f, 28 + (len), want, NULL, what);                     \
    } while (0)
    uint8_t blk[256];
    /* literals only, 5 bytes: well formed but 63 short */
    blk[0] = 0x50;
    memset(blk + 1, 7, 5);
    WITH_BLOCK(blk, 6, MOEX_PROTO_E_LZ4_SIZE, "block of 5 bytes for 68");
    /* a valid block of 100 bytes where 68 are expected */
    uint8_t big[100];
    memset(big, 1, sizeof big);
    int bn = LZ4_compress_default((const char *)big, (char *)blk, 100, sizeof blk);
    WITH_BLOCK(blk, (size_t)bn, MOEX_PROTO_E_LZ4_SIZE, "block of 100 bytes for 68");
    /* a valid block of 67 bytes */
    bn = LZ4_compress_default((const char *)big, (char *)blk, 67, sizeof blk);
    WITH_BLOCK(blk, (size_t)bn, MOEX_PROTO_E_LZ4_SIZE, "block of 67 bytes for 68");
    /* literal length running past the end */
    blk[0] = 0xf0, blk[1] = 255, blk[2] = 255;
    WITH_BLOCK(blk, 3, MOEX_PROTO_E_LZ4, "literal length past the end");
    /* literals claimed but missing */
    blk[0] = 0x40, blk[1] = 1;
    WITH_BLOCK(blk, 2, MOEX_PROTO_E_LZ4, "missing literals");
    /* match offset 0, and offset reaching before the start */
    blk[0] = 0x1f, blk[1] = 9, blk[2] = 0, blk[3] = 0, blk[4] = 40, blk[5] = 0x10, blk[6] = 9;
    WITH_BLOCK(blk, 7, MOEX_PROTO_E_LZ4, "offset 0");
    blk[2] = 2;
    WITH_BLOCK(blk, 7, MOEX_PROTO_E_LZ4, "offset before the start");
    /* offset cut short */
    blk[0] = 0x14, blk[1] = 9, blk[2] = 1;
    WITH_BLOCK(blk, 3, MOEX_PROTO_E_LZ4, "offset cut short");
    /* size right (1 + 67 = 68) but the block ends with a match, not literals: corrupt */
    blk[0] = 0x1f, blk[1] = 9, blk[2] = 1, blk[3] = 0, blk[4] = 48;
    WITH_BLOCK(blk, 5, MOEX_PROTO_E_LZ4, "ends with a match");
    /* empty compressed payload */
    memcpy(f, z, 28);
    put32(f + 8, 0);
    decode_expect(f, 28, MOEX_PROTO_E_LENGTH, NULL, "empty compressed payload");
    /* compressed payload larger than LZ4's bound for 68 bytes */
    put32(f + 8, 200);
    memset(f + 28, 0, 200);
    decode_expect(f, 228, MOEX_PROTO_E_LENGTH, NULL, "compressed payload beyond the bound");
    /* compression is only for tensors */
    uint8_t hb[64];
    size_t hn;
    moex_proto_encode_heartbeat(1, &(moex_proto_heartbeat){0}, hb, sizeof hb, &hn, NULL);
    hb[27] = MOEX_FLAG_COMPRESSED;
    decode_expect(hb, hn, MOEX_PROTO_E_FLAGS, NULL, "compressed heartbeat");
    CHECK(moex_proto_compress(z, zn, f, sizeof f, &hn, NULL) == MOEX_PROTO_E_ARG, "compressing twice");
    CHECK(moex_proto_compress(raw, n, f, 40, &hn, NULL) == MOEX_PROTO_E_BUFFER, "compress into 40 bytes");
#undef WITH_BLOCK
}

static void test_malformed_control(void) {
    uint8_t f[2048];
    size_t n;
#define CTRL(encode, stmt, want, what) do { encode; stmt; decode_expect(f, n, want, NULL, what); } while (0)
    moex_proto_heartbeat hb = {.state = 1};
#define HB moex_proto_encode_heartbeat(1, &hb, f, sizeof f, &n, NULL)
    CTRL(HB, f[28 + 22] = 4, MOEX_PROTO_E_FIELD, "heartbeat state 4");
    CTRL(HB, put16(f + 28 + 20, 1001), MOEX_PROTO_E_FIELD, "heartbeat load 1001");
    CTRL(HB, f[28 + 23] = 1, MOEX_PROTO_E_FIELD, "heartbeat reserved byte");
    CTRL(HB, f[26] = 1, MOEX_PROTO_E_FIELD, "heartbeat with a dtype");
    CTRL(HB, put32(f + 20, 1), MOEX_PROTO_E_FIELD, "heartbeat with tokens");
    CTRL(HB, put16(f + 16, 1), MOEX_PROTO_E_FIELD, "heartbeat with a layer");
    CTRL(HB, (put32(f + 8, 23), n--), MOEX_PROTO_E_LENGTH, "heartbeat of 23 bytes");
    CTRL(moex_proto_encode_cancel(1, 0, 0, f, sizeof f, &n, NULL), (put32(f + 8, 1), f[28] = 0, n++),
         MOEX_PROTO_E_LENGTH, "cancel with a payload");
    CTRL(moex_proto_encode_cancel(1, 0, 0, f, sizeof f, &n, NULL), put16(f + 18, 60000), MOEX_PROTO_E_LIMIT,
         "cancel of expert 60000");
#define AUTH moex_proto_encode_auth(0, "tok", 3, f, sizeof f, &n, NULL)
    CTRL(AUTH, (put32(f + 8, 0), n = 28), MOEX_PROTO_E_LENGTH, "auth without a token");
    CTRL(AUTH, (put32(f + 8, MOEX_PROTO_AUTH_MAX_BYTES + 1), n = 28 + MOEX_PROTO_AUTH_MAX_BYTES + 1), MOEX_PROTO_E_LENGTH,
         "auth of 1025 bytes");
    CTRL(AUTH, put16(f + 16, 1), MOEX_PROTO_E_FIELD, "auth with a layer");

    uint8_t data[64] = {0};
    moex_proto_weight_chunk c = {.kind = 0, .ggml_type = 1, .offset = 0, .total = 64, .data = data, .len = 64};
#define WS moex_proto_encode_weight_chunk(1, 1, 1, &c, f, sizeof f, &n, NULL)
    CTRL(WS, f[28] = 3, MOEX_PROTO_E_FIELD, "tensor kind 3");
    CTRL(WS, f[29] = 4, MOEX_PROTO_E_FIELD, "ggml type 4 (unknown)");
    CTRL(WS, f[29] = 15, MOEX_PROTO_E_FIELD, "ggml type q8_K (not a weight type)");
    CTRL(WS, f[28 + 5] = 1, MOEX_PROTO_E_FIELD, "chunk reserved bytes");
    CTRL(WS, put32(f + 28 + 16, 63), MOEX_PROTO_E_LENGTH, "chunk larger than the tensor");
    CTRL(WS, put32(f + 28 + 8, 1), MOEX_PROTO_E_LENGTH, "chunk past the tensor's end");
    CTRL(WS, (put32(f + 28 + 8, 0xffffffffu), put32(f + 28 + 12, 0xffffffffu)), MOEX_PROTO_E_LENGTH,
         "offset near 2^64");
    CTRL(WS, (put32(f + 28 + 16, 0), put32(f + 28 + 20, 0x100)), MOEX_PROTO_E_LIMIT, "tensor of 1 TiB");
    CTRL(WS, (put32(f + 8, 32), n = 60), MOEX_PROTO_E_LENGTH, "chunk without data");
    CTRL(WS, put16(f + 16, 2000), MOEX_PROTO_E_LIMIT, "chunk of layer 2000");

    moex_proto_expert e[2] = {{1, 2}, {3, 4}};
    moex_proto_join j = {.proto_min = 1, .proto_max = 2, .capacity_centi = 100, .name = "ab", .name_len = 2};
#define JOIN moex_proto_encode_join(1, &j, e, 2, f, sizeof f, &n, NULL)
    CTRL(JOIN, (void)0, MOEX_PROTO_OK, "join");
    CTRL(JOIN, put32(f + 28 + 24, 3), MOEX_PROTO_E_LENGTH, "join claims 3 experts, carries 2");
    CTRL(JOIN, put32(f + 28 + 24, 0x40000000), MOEX_PROTO_E_LENGTH, "join claims 2^30 experts");
    CTRL(JOIN, f[28 + 5] = 3, MOEX_PROTO_E_LENGTH, "join name longer than sent");
    CTRL(JOIN, (put32(f + 8, 35), n = 63), MOEX_PROTO_E_LENGTH, "join shorter than its fixed part");
    CTRL(JOIN, put16(f + 28, 0), MOEX_PROTO_E_FIELD, "join min version 0");
    CTRL(JOIN, put16(f + 28, 3), MOEX_PROTO_E_FIELD, "join min > max");
    CTRL(JOIN, f[28 + 4] = 4, MOEX_PROTO_E_FIELD, "join backend 4");
    CTRL(JOIN, put16(f + 28 + 6, 0), MOEX_PROTO_E_FIELD, "join capacity 0");
    CTRL(JOIN, f[28 + 36] = '\n', MOEX_PROTO_E_FIELD, "join name with a newline");
    CTRL(JOIN, put16(f + 28 + 38 + 4, 5000), MOEX_PROTO_E_LIMIT, "join holds expert 5000");
    CTRL(JOIN, put16(f + 28 + 38, 1024), MOEX_PROTO_E_LIMIT, "join holds layer 1024");

    moex_proto_assign a = {.worker_id = 1, .n_layers = 4, .n_experts = 8, .replicas = 2};
#define ASSIGN moex_proto_encode_assign(1, &a, e, 2, f, sizeof f, &n, NULL)
    CTRL(ASSIGN, (void)0, MOEX_PROTO_OK, "assign");
    CTRL(ASSIGN, put16(f + 28 + 16, 0), MOEX_PROTO_E_FIELD, "assign replicas 0");
    CTRL(ASSIGN, put16(f + 28 + 18, 1), MOEX_PROTO_E_FIELD, "assign reserved");
    CTRL(ASSIGN, put32(f + 28 + 20, 1), MOEX_PROTO_E_LENGTH, "assign count 1 for 2");
    CTRL(ASSIGN, put16(f + 28 + 32 + 4, 4), MOEX_PROTO_E_LIMIT, "assign layer 4 of 4");
    CTRL(ASSIGN, put16(f + 28 + 14, 5000), MOEX_PROTO_E_LIMIT, "assign model of 5000 experts");
    CTRL(ASSIGN, put16(f + 6, MOEX_MSG_JOIN), MOEX_PROTO_E_LENGTH, "assign payload read as a join");

    CTRL(moex_proto_encode_error(1, 1, "abc", 3, f, sizeof f, &n, NULL), put16(f + 28 + 4, 4), MOEX_PROTO_E_LENGTH,
         "error text length 4 for 3");
    CTRL(moex_proto_encode_error(1, 1, "abc", 3, f, sizeof f, &n, NULL), (put32(f + 8, 5), n = 33),
         MOEX_PROTO_E_LENGTH, "error shorter than its fixed part");

    /* int8 scales must be finite and non-negative */
    uint8_t d[512];
    size_t dn = make_dispatch(d, sizeof d, MOEX_DT_INT8);
    memcpy(f, d, dn), n = dn;
    put32(f + 28, 0xbf800000u); /* -1.0f */
    decode_expect(f, n, MOEX_PROTO_E_FIELD, NULL, "negative int8 scale");
    put32(f + 28 + 4, 0x7fc00000u); /* NaN */
    put32(f + 28, 0x3f800000u);
    decode_expect(f, n, MOEX_PROTO_E_FIELD, NULL, "NaN int8 scale");
#undef CTRL
#undef HB
#undef WS
#undef JOIN
#undef ASSIGN
}

static void test_encoder_errors(void) {
    uint8_t f[256];
    size_t n;
    float x[64] = {0}, g[4] = {0};
    moex_proto_tensor_msg m = {.type = MOEX_MSG_DISPATCH, .n_tokens = 2, .hidden = 16, .dtype = MOEX_DT_F16};
    CHECK(moex_proto_encode_tensor_f32(&m, x, g, f, 95, &n, NULL) == MOEX_PROTO_E_BUFFER, "small buffer");
    CHECK(moex_proto_encode_tensor_f32(&m, x, g, NULL, 0, &n, NULL) == MOEX_PROTO_E_BUFFER, "NULL buffer");
    CHECK(moex_proto_encode_tensor_f32(&m, x, NULL, f, sizeof f, &n, NULL) == MOEX_PROTO_E_ARG, "dispatch, no gates");
    m.type = MOEX_MSG_RESULT;
    CHECK(moex_proto_encode_tensor_f32(&m, x, g, f, sizeof f, &n, NULL) == MOEX_PROTO_E_ARG, "result with gates");
    m.dtype = 4;
    CHECK(moex_proto_encode_tensor_f32(&m, x, NULL, f, sizeof f, &n, NULL) == MOEX_PROTO_E_ARG, "int4");
    m.dtype = MOEX_DT_F16, m.n_tokens = 0;
    CHECK(moex_proto_encode_tensor_f32(&m, x, NULL, f, sizeof f, &n, NULL) == MOEX_PROTO_E_ARG, "no tokens");
    m.n_tokens = 2, m.type = MOEX_MSG_HEARTBEAT;
    CHECK(moex_proto_encode_tensor_f32(&m, x, NULL, f, sizeof f, &n, NULL) == MOEX_PROTO_E_ARG, "tensor heartbeat");
    m.type = MOEX_MSG_RESULT, m.dtype = MOEX_DT_INT8;
    CHECK(moex_proto_encode_tensor_raw(&m, x, NULL, NULL, f, sizeof f, &n, NULL) == MOEX_PROTO_E_ARG, "int8, no scales");
    moex_proto_heartbeat hb = {.state = 9};
    CHECK(moex_proto_encode_heartbeat(1, &hb, f, sizeof f, &n, NULL) == MOEX_PROTO_E_ARG, "state 9");
    hb.state = 0;
    CHECK(moex_proto_encode_heartbeat(1, &hb, f, 51, &n, NULL) == MOEX_PROTO_E_BUFFER, "heartbeat in 51 bytes");
    CHECK(moex_proto_encode_cancel(1, 0, 0, f, 27, &n, NULL) == MOEX_PROTO_E_BUFFER, "cancel in 27 bytes");
    moex_proto_weight_chunk c = {.kind = 0, .ggml_type = 1, .offset = 10, .total = 20, .data = f, .len = 11};
    CHECK(moex_proto_encode_weight_chunk(1, 0, 0, &c, f + 64, 100, &n, NULL) == MOEX_PROTO_E_ARG, "chunk overrun");
    moex_proto_join j = {.proto_min = 1, .proto_max = 1, .capacity_centi = 0};
    CHECK(moex_proto_encode_join(1, &j, NULL, 0, f, sizeof f, &n, NULL) == MOEX_PROTO_E_ARG, "capacity 0");
    moex_proto_assign a = {.n_layers = 2, .n_experts = 2, .replicas = 1};
    moex_proto_expert e = {2, 0};
    CHECK(moex_proto_encode_assign(1, &a, &e, 1, f, sizeof f, &n, NULL) == MOEX_PROTO_E_ARG, "expert beyond model");
    CHECK(moex_proto_encode_error(1, 1, "abc", 3, f, 30, &n, NULL) == MOEX_PROTO_E_BUFFER, "error in 30 bytes");
    for (int s = 0; s >= -16; s--) CHECK(strcmp(moex_proto_strerror(s), "unknown status") != 0, "strerror(%d)", s);
    CHECK(strcmp(moex_proto_strerror(-17), "unknown status") == 0, "strerror(-17)");
}

/* ---- corpus for the fuzzer ---- */

static int write_file(const char *dir, const char *name, const uint8_t *b, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    fwrite(b, 1, n, fp);
    return fclose(fp);
}

static int write_corpus(const char *dir) {
    uint8_t f[4096], z[4096];
    size_t n, zn;
    static const int dtypes[] = {MOEX_DT_F16, MOEX_DT_BF16, MOEX_DT_INT8, MOEX_DT_F32};
    for (int d = 0; d < 4; d++) {
        char name[64];
        n = make_dispatch(f, sizeof f, dtypes[d]);
        snprintf(name, sizeof name, "dispatch_%s", moex_proto_dtype_name(dtypes[d]));
        write_file(dir, name, f, n);
        moex_proto_compress(f, n, z, sizeof z, &zn, NULL);
        snprintf(name, sizeof name, "dispatch_%s_lz4", moex_proto_dtype_name(dtypes[d]));
        write_file(dir, name, z, zn);
        float x[3 * 8];
        for (int i = 0; i < 24; i++) x[i] = rng_normal();
        moex_proto_tensor_msg m = {.type = MOEX_MSG_RESULT, .seq = 3, .n_tokens = 3, .hidden = 8, .dtype = (uint8_t)dtypes[d]};
        moex_proto_encode_tensor_f32(&m, x, NULL, f, sizeof f, &n, NULL);
        snprintf(name, sizeof name, "result_%s", moex_proto_dtype_name(dtypes[d]));
        write_file(dir, name, f, n);
    }
    moex_proto_encode_cancel(1, 2, 3, f, sizeof f, &n, NULL);
    write_file(dir, "cancel", f, n);
    moex_proto_encode_heartbeat(1, &(moex_proto_heartbeat){.timestamp_us = 5, .state = 2}, f, sizeof f, &n, NULL);
    write_file(dir, "heartbeat", f, n);
    uint8_t data[40] = {1, 2, 3};
    moex_proto_weight_chunk c = {.kind = 1, .ggml_type = 12, .offset = 8, .total = 100, .data = data, .len = 40};
    moex_proto_encode_weight_chunk(1, 1, 1, &c, f, sizeof f, &n, NULL);
    write_file(dir, "weight_sync", f, n);
    moex_proto_expert e[2] = {{1, 2}, {3, 4}};
    moex_proto_join j = {.proto_min = 1, .proto_max = 1, .capacity_centi = 100, .name = "w0", .name_len = 2};
    moex_proto_encode_join(1, &j, e, 2, f, sizeof f, &n, NULL);
    write_file(dir, "join", f, n);
    moex_proto_assign a = {.n_layers = 4, .n_experts = 8, .replicas = 2};
    moex_proto_encode_assign(1, &a, e, 2, f, sizeof f, &n, NULL);
    write_file(dir, "assign", f, n);
    moex_proto_encode_error(1, -9, "oops", 4, f, sizeof f, &n, NULL);
    return write_file(dir, "error", f, n);
}


/* A message of several frames splits back into them; a truncated or corrupt
 * frame stops the split with an error; reassembly is bounded. */
/* The TCP transport's stream: whole frames first, an incomplete one waits, a bad header stops it. */
static void test_stream_frames(void) {
    uint8_t st[256];
    size_t n1 = 0, n2 = 0, whole = 9;
    CHECK(moex_proto_encode_cancel(1, 0, 0, st, sizeof st, &n1, NULL) == 0, "cancel");
    moex_proto_heartbeat h = {.state = MOEX_STATE_READY};
    CHECK(moex_proto_encode_heartbeat(2, &h, st + n1, sizeof st - n1, &n2, NULL) == 0, "heartbeat");
    size_t ends = 9;
    for (size_t len = 0; len <= n1 + n2; len++) {
        CHECK(moex_proto_stream_frames(st, len, &lim, &whole, &ends, NULL) == 0, "stream of %zu bytes", len);
        CHECK(whole == (len < n1 ? 0 : len < n1 + n2 ? n1 : n1 + n2) && ends == whole, "%zu bytes: %zu whole, %zu ends",
              len, whole, ends);
    }
    memcpy(st + n1 + n2, "MOEX", 4);
    memset(st + n1 + n2 + 4, 0, 24);
    CHECK(moex_proto_stream_frames(st, n1 + n2 + 28, &lim, &whole, NULL, NULL) == MOEX_PROTO_E_MAGIC && whole == n1 + n2,
          "a bad magic after two frames: E_MAGIC, the two frames whole (%zu)", whole);

    /* a message of two DISPATCHes, the first marked MORE: it ends with the second */
    uint8_t msg[512];
    size_t d1 = make_dispatch(msg, sizeof msg, MOEX_DT_F16), d2 = make_dispatch(msg + d1, sizeof msg - d1, MOEX_DT_F16);
    msg[27] |= MOEX_FLAG_MORE;
    CHECK(moex_proto_stream_frames(msg, d1, &lim, &whole, &ends, NULL) == 0 && whole == d1 && ends == 0,
          "the first frame alone: whole, no message yet (%zu, %zu)", whole, ends);
    CHECK(moex_proto_stream_frames(msg, d1 + d2, &lim, &whole, &ends, NULL) == 0 && whole == d1 + d2 && ends == d1 + d2,
          "both frames: one message (%zu, %zu)", whole, ends);
    moex_proto_msg m;
    CHECK(moex_proto_decode(msg, d1, &lim, NULL, 0, &m, NULL) == 0 && (m.h.flags & MOEX_FLAG_MORE), "MORE decodes");
    uint8_t hb2[64];
    size_t nh = 0;
    moex_proto_encode_heartbeat(3, &h, hb2, sizeof hb2, &nh, NULL);
    hb2[27] = MOEX_FLAG_MORE;
    CHECK(moex_proto_decode(hb2, nh, &lim, NULL, 0, &m, NULL) == MOEX_PROTO_E_FLAGS, "MORE on a control frame refused");
}

static void test_messages(void) {
    uint8_t msg[512];
    size_t off = 0, n = 0;
    for (uint32_t seq = 1; seq <= 3; seq++) {
        CHECK(moex_proto_encode_cancel(seq, 2, (uint16_t)seq, msg + off, sizeof msg - off, &n, NULL) == 0, "cancel");
        off += n;
    }
    uint8_t hb[64];
    moex_proto_heartbeat h = {.timestamp_us = 7, .state = MOEX_STATE_READY};
    CHECK(moex_proto_encode_heartbeat(9, &h, hb, sizeof hb, &n, NULL) == 0, "heartbeat");
    memcpy(msg + off, hb, n);
    const size_t len = off + n;
    size_t at = 0, fl = 0;
    uint32_t seqs[8];
    int count = 0, rc;
    while ((rc = moex_proto_next_frame(msg, len, &at, NULL, &fl, NULL)) == 1 && count < 8) {
        moex_proto_msg m;
        CHECK(moex_proto_decode(msg + at, fl, NULL, NULL, 0, &m, NULL) == 0, "frame %d decodes", count);
        seqs[count++] = m.h.seq;
        at += fl;
    }
    CHECK(rc == 0 && count == 4 && at == len, "4 frames in the message (got %d, rc %d)", count, rc);
    CHECK(count == 4 && seqs[0] == 1 && seqs[2] == 3 && seqs[3] == 9, "frames in order");
    at = 0;
    int frames = 0;
    while ((rc = moex_proto_next_frame(msg, len - 3, &at, NULL, &fl, NULL)) == 1) at += fl, frames++;
    CHECK(frames == 3 && rc == MOEX_PROTO_E_TRUNCATED, "a cut last frame is an error after 3 good ones (%d, %d)",
          frames, rc);
    msg[off] ^= 0xff; /* the heartbeat's magic */
    at = 0, frames = 0;
    while ((rc = moex_proto_next_frame(msg, len, &at, NULL, &fl, NULL)) == 1) at += fl, frames++;
    CHECK(frames == 3 && rc == MOEX_PROTO_E_MAGIC, "a corrupt frame stops the split (%d, %d)", frames, rc);

    moex_proto_reasm r = {.max_bytes = 100};
    CHECK(moex_proto_reasm_add(&r, msg, 60, NULL) == 0 && r.len == 60, "first fragment");
    CHECK(moex_proto_reasm_add(&r, msg, 40, NULL) == 0 && r.len == 100, "up to the bound");
    CHECK(moex_proto_reasm_add(&r, msg, 1, NULL) == MOEX_PROTO_E_TOO_BIG && r.len == 0, "over the bound: refused, emptied");
    CHECK(moex_proto_reasm_add(&r, msg, 0, NULL) == 0 && r.len == 0, "an empty fragment");
    CHECK(moex_proto_reasm_add(&r, msg, (size_t)-1, NULL) == MOEX_PROTO_E_TOO_BIG, "no overflow on a huge size");
    moex_proto_reasm_reset(&r);
    moex_proto_reasm_free(&r);
}

/* Every code from MOEX_ERR_FIRST to MOEX_ERR_LAST has a name and reactions;
 * others have none; negative codes are bad frames. */
static void test_error_codes(void) {
    for (int32_t c = MOEX_ERR_FIRST; c <= MOEX_ERR_LAST; c++) {
        const moex_proto_error_info *e = moex_proto_error_info_of(c);
        CHECK(e && e->code == c && e->name && e->name[0], "code %d defined", c);
    }
    CHECK(!moex_proto_error_info_of(0) && !moex_proto_error_info_of(MOEX_ERR_LAST + 1), "undefined codes");
    const moex_proto_error_info *bad = moex_proto_error_info_of(MOEX_PROTO_E_MAGIC);
    CHECK(bad && bad->on_worker == MOEX_ERR_ACT_RECONNECT, "a negative code is a bad frame");
    CHECK(moex_proto_error_info_of(MOEX_ERR_MODEL_MISMATCH)->on_worker == MOEX_ERR_ACT_EXIT, "mismatch: exit");
    CHECK(moex_proto_error_info_of(MOEX_ERR_BUSY)->on_hub == MOEX_ERR_ACT_REDISPATCH, "busy: re-dispatch");
}

/* --error-table: the ERROR codes as docs/PROTOCOL.md's table rows
 * (tests/proto/check_error_table.py compares the two). */
static void print_error_table(void) {
    static const char *const act[] = {"ignore", "re-dispatch", "reconnect", "exit"};
    for (int32_t c = MOEX_ERR_FIRST; c <= MOEX_ERR_LAST; c++) {
        const moex_proto_error_info *e = moex_proto_error_info_of(c);
        printf("| %d | %s | %s | %s |\n", (int)c, e->name, act[e->on_hub], act[e->on_worker]);
    }
    const moex_proto_error_info *b = moex_proto_error_info_of(-1);
    printf("| < 0 | %s | %s | %s |\n", b->name, act[b->on_hub], act[b->on_worker]);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-corpus")) return write_corpus(argv[2]) != 0;
    if (argc == 2 && !strcmp(argv[1], "--error-table")) {
        print_error_table();
        return 0;
    }
    lim = moex_proto_default_limits();
    test_golden_header();
    test_tensor_roundtrips();
    test_conversion_paths();
    test_control_roundtrips();
    test_every_truncation();
    test_malformed_header();
    test_malformed_lz4();
    test_malformed_control();
    test_encoder_errors();
    test_messages();
    test_stream_frames();
    test_error_codes();
    if (g_failures) fprintf(stderr, "%d check(s) failed\n", g_failures);
    else printf("all proto checks passed\n");
    return g_failures != 0;
}
