/* The browser worker's WASM module API (web/wasm/moex_wasm.c), compiled
 * natively so that it runs under the sanitizers with the rest of the suite:
 * frames it encodes decode to what was asked (proto/ as the judge), frames
 * it decodes report every field web/wasm_api.js reads, a message splits
 * into its frames, a malformed frame gives its status, the CPU path turns a
 * DISPATCH into the RESULT of the same expert FFN (checked against float64
 * on fresh random weights), holding refuses bad sizes and changes nothing,
 * and the streaming XXH3 equals proto's. */
#include <string.h>

#include "kernels/kernels.h"
#include "proto/proto.h"
#include "tests/test_util.h"
#include "web/wasm/moex_wasm.h"

enum { L = 2, E = 4, H = 256, F = 256, NT = 3 };

static moex_proto_msg decode_out(moex_wasm *w, int n) {
    moex_proto_msg m;
    memset(&m, 0, sizeof m);
    CHECK(n > 0 && moex_proto_decode(moex_wasm_out(w), (size_t)n, NULL, NULL, 0, &m, NULL) == 0,
          "an encoded frame decodes (%d bytes: %s)", n, moex_wasm_error(w));
    return m;
}

static void test_control_frames(moex_wasm *w) {
    moex_proto_msg m = decode_out(w, moex_wasm_encode_join(w, MOEX_BACKEND_WEBGPU, 37, 12345678.0, 0x89abcdefu,
                                                           0x01234567u, "tab x", 5));
    CHECK(m.h.type == MOEX_MSG_JOIN && m.u.join.info.backend == MOEX_BACKEND_WEBGPU &&
          m.u.join.info.capacity_centi == 37 && m.u.join.info.memory_budget == 12345678u &&
          m.u.join.info.model_hash == 0x0123456789abcdefull && m.u.join.info.name_len == 5 &&
          !memcmp(m.u.join.info.name, "tab x", 5),
          "JOIN fields");
    m = decode_out(w, moex_wasm_encode_heartbeat(w, 9, 1e15, 5e14, 7, 1500, MOEX_STATE_READY));
    CHECK(m.h.type == MOEX_MSG_HEARTBEAT && m.h.seq == 9 && m.u.heartbeat.timestamp_us == 1000000000000000ull &&
          m.u.heartbeat.echo_us == 500000000000000ull && m.u.heartbeat.queue_depth == 7 &&
          m.u.heartbeat.load_permille == 1000 && m.u.heartbeat.state == MOEX_STATE_READY,
          "HEARTBEAT fields (load clamped to 1000)");
    m = decode_out(w, moex_wasm_encode_error(w, 44, MOEX_ERR_BUSY, "busy: backlog full", 18));
    CHECK(m.h.type == MOEX_MSG_ERROR && m.h.seq == 44 && m.u.error.code == MOEX_ERR_BUSY && m.u.error.text_len == 18 &&
          !memcmp(m.u.error.text, "busy: backlog full", 18),
          "ERROR fields");
    CHECK(moex_wasm_error_action(MOEX_ERR_MODEL_MISMATCH) == MOEX_ERR_ACT_EXIT &&
          moex_wasm_error_action(MOEX_ERR_REFUSED) == MOEX_ERR_ACT_RECONNECT &&
          moex_wasm_error_action(MOEX_ERR_BUSY) == MOEX_ERR_ACT_IGNORE && moex_wasm_error_action(-3) == MOEX_ERR_ACT_RECONNECT &&
          moex_wasm_error_action(99) == -1,
          "the worker's reactions come from proto's table");
}

static void test_decode(moex_wasm *w) {
    uint8_t msg[512];
    size_t a_len, e_len;
    const moex_proto_assign a = {.model_hash = 0x1122334455667788ull, .worker_id = 77, .n_layers = L, .n_experts = E,
                                 .replicas = 2};
    const moex_proto_expert list[3] = {{0, 1}, {1, 3}, {1, 0}};
    CHECK(moex_proto_encode_assign(12, &a, list, 3, msg, sizeof msg, &a_len, NULL) == 0, "encode ASSIGN");
    CHECK(moex_proto_encode_error(5, MOEX_ERR_EVICTED, "go", 2, msg + a_len, sizeof msg - a_len, &e_len, NULL) == 0,
          "encode ERROR");
    /* a message of two frames */
    const int n1 = moex_wasm_next_frame(w, msg, (uint32_t)(a_len + e_len), 0);
    const int n2 = moex_wasm_next_frame(w, msg, (uint32_t)(a_len + e_len), (uint32_t)a_len);
    const int n3 = moex_wasm_next_frame(w, msg, (uint32_t)(a_len + e_len), (uint32_t)(a_len + e_len));
    CHECK(n1 == (int)a_len && n2 == (int)e_len && n3 == 0, "a message splits into its frames (%d %d %d)", n1, n2, n3);
    CHECK(moex_wasm_next_frame(w, msg, (uint32_t)(a_len + e_len - 1), (uint32_t)a_len) < 0, "a cut frame is refused");

    CHECK(moex_wasm_decode(w, msg, (uint32_t)a_len) == 0, "decode ASSIGN: %s", moex_wasm_error(w));
    const moex_wasm_msg *o = moex_wasm_msg_ptr(w);
    const uint8_t *l = msg + o->list_off;
    CHECK(o->type == MOEX_MSG_ASSIGN && o->seq == 12 && o->worker_id == 77 && o->n_layers == L && o->n_experts == E &&
          o->replicas == 2 && o->hash_lo == 0x55667788u && o->hash_hi == 0x11223344u && o->list_count == 3 &&
          l[4] == 1 && l[6] == 3 && l[8] == 1 && l[10] == 0,
          "ASSIGN fields and expert list");
    CHECK(moex_wasm_decode(w, msg + a_len, (uint32_t)e_len) == 0, "decode ERROR");
    CHECK(o->type == MOEX_MSG_ERROR && o->code == MOEX_ERR_EVICTED && o->text_len == 2 &&
          !memcmp(msg + a_len + o->text_off, "go", 2), "ERROR fields");

    uint8_t bad[MOEX_PROTO_HEADER_BYTES];
    memcpy(bad, msg + a_len, sizeof bad);
    bad[6] = 99; /* type */
    bad[8] = bad[9] = bad[10] = bad[11] = 0;
    CHECK(moex_wasm_decode(w, bad, sizeof bad) == MOEX_PROTO_E_TYPE && o->seq == 5 && moex_wasm_error(w)[0],
          "a frame of an unknown type gives E_TYPE, with its seq and a message");
    CHECK(moex_wasm_decode(w, msg, 10) == MOEX_PROTO_E_TRUNCATED, "10 bytes are a truncated frame");
}

/* y = gate * down(silu(gate_w x) * up_w x) in float64 on dequantized weights. */
static void expert_ref(const float *wg, const float *wu, const float *wd, const float *x, double gate, double *y) {
    double h[F];
    for (int r = 0; r < F; r++) {
        double g = 0, u = 0;
        for (int c = 0; c < H; c++) g += (double)wg[r * H + c] * x[c], u += (double)wu[r * H + c] * x[c];
        h[r] = g / (1 + exp(-g)) * u;
    }
    for (int r = 0; r < H; r++) {
        double s = 0;
        for (int c = 0; c < F; c++) s += (double)wd[r * F + c] * h[c];
        y[r] = gate * s;
    }
}

static void test_cpu_path(moex_wasm *w, rng *r) {
    const int types[3] = {MOEX_TYPE_Q4_K, MOEX_TYPE_Q4_K, MOEX_TYPE_Q6_K};
    const size_t gb = moex_wasm_row_bytes(types[0], H) * F, ub = moex_wasm_row_bytes(types[1], H) * F,
                 db = moex_wasm_row_bytes(types[2], F) * H, total = gb + ub + db;
    static float f[H * F], deq[3][H * F];
    uint8_t *bytes = moex_wasm_malloc(total);
    const size_t off[3] = {0, gb, gb + ub};
    for (int m = 0; m < 3; m++) {
        for (int i = 0; i < H * F; i++) f[i] = rng_gauss(r) / 16.0f;
        CHECK(moex_wasm_quantize_row(types[m], f, bytes + off[m], H * F) == 0, "quantize");
        CHECK(moex_wasm_dequantize_row(types[m], bytes + off[m], deq[m], H * F) == 0, "dequantize");
    }
    uint8_t *copy = moex_wasm_malloc(total);
    memcpy(copy, bytes, total);
    CHECK(moex_wasm_hold(w, 1, 2, copy, (uint32_t)total - 1, types[0], types[1], types[2], F) < 0 &&
          !moex_wasm_holds(w, 1, 2), "a wrong size is refused and holds nothing");
    CHECK(moex_wasm_hold(w, 1, 2, copy, (uint32_t)total, types[0], types[1], types[2], F) == 0 && moex_wasm_holds(w, 1, 2),
          "hold: %s", moex_wasm_error(w));

    float x[NT * H], gates[NT], xd[NT * H], gd[NT];
    for (int i = 0; i < NT * H; i++) x[i] = rng_gauss(r);
    for (int t = 0; t < NT; t++) gates[t] = 0.25f + (float)rng_uniform(r);
    const moex_proto_tensor_msg dm = {.type = MOEX_MSG_DISPATCH, .seq = 31, .layer = 1, .expert = 2, .n_tokens = NT,
                                      .hidden = H, .dtype = MOEX_DT_F16};
    uint8_t frame[MOEX_PROTO_HEADER_BYTES + NT * H * 2 + NT * 2];
    size_t flen;
    CHECK(moex_proto_encode_tensor_f32(&dm, x, gates, frame, sizeof frame, &flen, NULL) == 0, "encode DISPATCH");
    CHECK(moex_wasm_dispatch_f32(w, frame, (uint32_t)flen, xd, gd) == 0, "dispatch rows as f32");
    int same = 1;
    for (int i = 0; i < NT * H; i++) same &= xd[i] == moex_f16_to_f32(moex_f32_to_f16(x[i]));
    for (int t = 0; t < NT; t++) same &= gd[t] == moex_f16_to_f32(moex_f32_to_f16(gates[t]));
    CHECK(same, "the rows and gates are the frame's f16 values");

    const int n = moex_wasm_compute(w, frame, (uint32_t)flen);
    const moex_proto_msg res = decode_out(w, n);
    CHECK(res.h.type == MOEX_MSG_RESULT && res.h.seq == 31 && res.h.layer == 1 && res.h.expert == 2 &&
          res.h.n_tokens == NT && res.h.hidden == H && res.h.dtype == MOEX_DT_F16, "RESULT header");
    float ffn[NT * H], got[H];
    CHECK(moex_wasm_expert_ffn(w, bytes, types[0], types[1], types[2], H, F, xd, gd, NT, ffn) == 0, "expert_ffn");
    double worst = 0;
    for (int t = 0; t < NT; t++) {
        double ref[H];
        moex_proto_tensor_row_f32(&res.u.tensor, (uint32_t)t, got);
        expert_ref(deq[0], deq[1], deq[2], xd + t * H, gd[t], ref);
        const double e = rel_l2(got, ref, H);
        worst = e > worst ? e : worst;
        for (int i = 0; i < H; i++) same &= got[i] == moex_f16_to_f32(moex_f32_to_f16(ffn[t * H + i]));
    }
    CHECK(same, "the RESULT carries the CPU expert FFN of the dispatch's rows, in f16");
    CHECK(worst < 3e-2, "the RESULT against float64 with exact activations: %.3g", worst);

    /* the RESULT encoder answers in the dispatch's dtype */
    moex_proto_msg r2 = decode_out(w, moex_wasm_encode_result(w, frame, ffn));
    CHECK(r2.h.type == MOEX_MSG_RESULT && r2.h.seq == 31 && r2.h.dtype == MOEX_DT_F16 && r2.h.n_tokens == NT,
          "encode_result answers the DISPATCH");

    moex_wasm_drop(w, 1, 2);
    CHECK(!moex_wasm_holds(w, 1, 2) && moex_wasm_compute(w, frame, (uint32_t)flen) < 0 &&
          strstr(moex_wasm_error(w), "not held"), "a dropped expert is not computed: %s", moex_wasm_error(w));
    moex_wasm_free(bytes);
}

static void test_hash(moex_wasm *w, rng *r) {
    enum { N = 100003 };
    uint8_t *b = malloc(N);
    for (int i = 0; i < N; i++) b[i] = (uint8_t)rng_next(r);
    moex_wasm_hash_reset(w);
    moex_wasm_hash_update(w, b, 7);
    moex_wasm_hash_update(w, b + 7, 50000);
    moex_wasm_hash_update(w, b + 50007, N - 50007);
    uint32_t h[2];
    moex_wasm_hash_digest(w, h);
    const uint64_t want = moex_proto_hash64(b, N);
    CHECK(h[0] == (uint32_t)want && h[1] == (uint32_t)(want >> 32), "streaming XXH3 equals proto's");
    free(b);
}

int main(void) {
    rng r = {(uint64_t)time(NULL)};
    printf("seed %llu\n", (unsigned long long)r.s);
    moex_wasm *w = moex_wasm_create(L, E, H);
    CHECK(w != NULL, "create");
    if (!w) return 1;
    test_control_frames(w);
    test_decode(w);
    test_cpu_path(w, &r);
    test_hash(w, &r);
    moex_wasm_destroy(w);
    moex_wasm *bare = moex_wasm_create(0, 0, 0);
    CHECK(bare != NULL && moex_wasm_hold(bare, 0, 0, NULL, 0, 0, 0, 0, 1) < 0,
          "a handle without a model shape does frames and hashes only");
    moex_wasm_destroy(bare);
    if (g_failures) printf("%d checks failed\n", g_failures);
    return g_failures != 0;
}
