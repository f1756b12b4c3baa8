/* The browser worker's WASM module (moex_wasm.c): its exports, as
 * web/wasm_api.js calls them. Pointers are wasm32 heap addresses there;
 * natively (tests/web/test_wasm_api.c, under the sanitizers) ordinary ones.
 * Functions returning int give 0 or a frame's length on success, a negative
 * value on failure with the reason in moex_wasm_error(). */
#ifndef MOEX_WEB_WASM_H
#define MOEX_WEB_WASM_H

#include <stdint.h>
#include <stddef.h>

typedef struct moex_wasm moex_wasm;

/* A decoded frame as JavaScript reads it (web/wasm_api.js, MSG_FIELDS):
 * 21 little-endian u32 at these byte offsets. */
typedef struct moex_wasm_msg {
    uint32_t type, seq, layer, expert;         /*  0,  4,  8, 12 */
    uint32_t n_tokens, hidden, dtype, flags;   /* 16, 20, 24, 28 */
    int32_t code;                              /* 32: ERROR code */
    uint32_t text_off, text_len;               /* 36, 40: ERROR text (offset in the frame) */
    uint32_t list_off, list_count;             /* 44, 48: ASSIGN experts (offset in the frame), (u16 layer, u16 expert) each */
    uint32_t worker_id, n_layers, n_experts;   /* 52, 56, 60: ASSIGN */
    uint32_t replicas;                         /* 64 */
    uint32_t hash_lo, hash_hi;                 /* 68, 72: ASSIGN model hash */
    uint32_t ts_lo, ts_hi;                     /* 76, 80: HEARTBEAT timestamp_us */
} moex_wasm_msg;
_Static_assert(sizeof(moex_wasm_msg) == 84, "moex_wasm_msg: 21 u32 fields");

void *moex_wasm_malloc(size_t n);
void moex_wasm_free(void *p);
moex_wasm *moex_wasm_create(int n_layers, int n_experts, int hidden);
void moex_wasm_destroy(moex_wasm *w);
const char *moex_wasm_error(moex_wasm *w);
const uint8_t *moex_wasm_out(moex_wasm *w);
uint32_t moex_wasm_out_len(moex_wasm *w);
const moex_wasm_msg *moex_wasm_msg_ptr(moex_wasm *w);
int moex_wasm_next_frame(moex_wasm *w, const uint8_t *msg, uint32_t len, uint32_t off);
int moex_wasm_decode(moex_wasm *w, const uint8_t *frame, uint32_t len);
int moex_wasm_dispatch_f32(moex_wasm *w, const uint8_t *frame, uint32_t len, float *x, float *gates);
int moex_wasm_encode_result(moex_wasm *w, const uint8_t *header, const float *values);
int moex_wasm_encode_join(moex_wasm *w, int backend, int capacity_centi, double memory_budget, uint32_t hash_lo,
    uint32_t hash_hi, const char *name, int name_len);
int moex_wasm_encode_heartbeat(moex_wasm *w, uint32_t seq, double timestamp_us, double echo_us,
    uint32_t queue_depth, int load_permille, int state);
int moex_wasm_encode_error(moex_wasm *w, uint32_t seq, int code, const char *text, int text_len);
int moex_wasm_error_action(int code);
const char *moex_wasm_error_name(int code);
const char *moex_wasm_strerror(int status);
int moex_wasm_hold(moex_wasm *w, int layer, int expert, uint8_t *data, uint32_t len, int gate_type,
    int up_type, int down_type, int n_ff);
void moex_wasm_drop(moex_wasm *w, int layer, int expert);
int moex_wasm_holds(moex_wasm *w, int layer, int expert);
int moex_wasm_compute(moex_wasm *w, const uint8_t *frame, uint32_t len);
void moex_wasm_hash_reset(moex_wasm *w);
void moex_wasm_hash_update(moex_wasm *w, const void *data, uint32_t len);
void moex_wasm_hash_digest(moex_wasm *w, uint32_t out[2]);
uint32_t moex_wasm_row_bytes(int type, int n);
int moex_wasm_quantize_row(int type, const float *src, void *dst, int n);
int moex_wasm_dequantize_row(int type, const void *src, float *dst, int n);
const char *moex_wasm_simd_name(void);
int moex_wasm_vec_dot(int use_portable, int type, int n, const void *wrow, const float *x, float *out);
int moex_wasm_expert_ffn(moex_wasm *w, const uint8_t *data, int gate_type, int up_type, int down_type, int hidden,
    int n_ff, const float *x, const float *gates, int n_tokens, float *out);

#endif
