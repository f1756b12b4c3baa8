/* The MoEx wire protocol: frames exchanged between hub and workers.
 *
 * A frame is a 28-byte header (the paper's Listing 1) followed by a payload.
 * The magic is the four ASCII bytes "MoEx"; every other multi-byte field and
 * every payload value is little-endian. docs/PROTOCOL.md is the reference
 * for every field and message; this header is its C binding.
 *
 * Decoding never allocates and never trusts the length field: a frame is
 * checked against a moex_proto_limits before anything is read from its
 * payload, and a decoded message is a view pointing into the caller's buffer
 * (or, for LZ4-compressed frames, into the caller's scratch buffer).
 *
 * Every function that can fail returns a moex_proto_status (0 = OK, negative
 * = error) and, when err is not NULL, a message with the details. */
#ifndef MOEX_PROTO_H
#define MOEX_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/wire_rows.h"

#define MOEX_PROTO_MAGIC "MoEx"
#define MOEX_PROTO_VERSION 1
#define MOEX_PROTO_HEADER_BYTES 28
#define MOEX_PROTO_FLAGS_AT 27   /* the header's flags byte (MOEX_FLAG_*), which a transport may set in place */

/* ---- Codes ---------------------------------------------------------------- */

typedef enum moex_proto_status {
    MOEX_PROTO_OK = 0,
    MOEX_PROTO_E_TRUNCATED = -1,  /* fewer bytes than the header, or than header + payload length */
    MOEX_PROTO_E_MAGIC = -2,      /* first four bytes are not "MoEx" */
    MOEX_PROTO_E_VERSION = -3,    /* version is not MOEX_PROTO_VERSION */
    MOEX_PROTO_E_TYPE = -4,       /* unknown message type */
    MOEX_PROTO_E_DTYPE = -5,      /* unknown or unsupported tensor dtype */
    MOEX_PROTO_E_FLAGS = -6,      /* reserved flag bits set, or compression on a type that has none */
    MOEX_PROTO_E_TOO_BIG = -7,    /* frame (or its decompressed payload) exceeds limits.max_frame_bytes */
    MOEX_PROTO_E_LIMIT = -8,      /* layer, expert, tokens or hidden outside the limits */
    MOEX_PROTO_E_LENGTH = -9,     /* payload length disagrees with what the fields imply */
    MOEX_PROTO_E_TRAILING = -10,  /* buffer holds bytes after the frame */
    MOEX_PROTO_E_FIELD = -11,     /* a field holds a value not allowed here (reserved != 0, bad enum...) */
    MOEX_PROTO_E_LZ4 = -12,       /* compressed payload is not a valid LZ4 block */
    MOEX_PROTO_E_LZ4_SIZE = -13,  /* LZ4 block decompresses to a size other than the fields imply */
    MOEX_PROTO_E_SCRATCH = -14,   /* decode: scratch buffer smaller than moex_proto_scratch_bytes() */
    MOEX_PROTO_E_BUFFER = -15,    /* encode: output buffer too small */
    MOEX_PROTO_E_ARG = -16,       /* encode: caller passed an invalid value */
} moex_proto_status;

/* Short constant description of a status ("frame truncated", ...). */
const char *moex_proto_strerror(int status);

typedef enum moex_proto_msg_type {
    MOEX_MSG_DISPATCH = 1,    /* hub -> worker: tokens x hidden activations + one f16 gate per token */
    MOEX_MSG_RESULT = 2,      /* worker -> hub: tokens x hidden gate-weighted expert output */
    MOEX_MSG_CANCEL = 3,      /* hub -> worker: drop the DISPATCH with this sequence id */
    MOEX_MSG_HEARTBEAT = 4,   /* both ways: liveness, clock, load */
    MOEX_MSG_WEIGHT_SYNC = 5, /* one chunk of one expert tensor */
    MOEX_MSG_JOIN = 6,        /* worker -> hub: capabilities and experts already held */
    MOEX_MSG_ASSIGN = 7,      /* hub -> worker: model identity and the experts to hold */
    MOEX_MSG_ERROR = 8,       /* both ways: a request (by sequence id) failed */
    MOEX_MSG_AUTH = 9,        /* worker -> hub, TCP transport only: the hub's token, the connection's first frame */
} moex_proto_msg_type;

/* Tensor element types on the wire (the header's dtype byte): MOEX_DT_* of
 * common/wire_rows.h, which also converts rows to and from them. */

/* ERROR frame codes (positive; a negative code is the moex_proto_status of a
 * frame the sender could not decode). The one definition both sides use;
 * docs/PROTOCOL.md's table is checked against moex_proto_error_info by
 * tests/proto. What the receiver does is part of the code's meaning. */
typedef enum moex_proto_error_code {
    MOEX_ERR_MODEL_MISMATCH = 1,  /* either way: the peer serves another model */
    MOEX_ERR_BUSY = 2,            /* worker -> hub: backlog full; the hub re-dispatches elsewhere now */
    MOEX_ERR_PREEMPTED = 3,       /* worker -> hub: dropped for a newer layer's dispatch; re-dispatch if still wanted */
    MOEX_ERR_COMPUTE = 4,         /* worker -> hub: expert not held, wrong shape, kernel failure; re-dispatch */
    MOEX_ERR_ALREADY_JOINED = 5,  /* hub -> worker: a second JOIN on one connection, ignored */
    MOEX_ERR_VERSION = 6,         /* hub -> worker: no common protocol version */
    MOEX_ERR_EVICTED = 7,         /* hub -> worker: this worker returned wrong results and is refused */
    MOEX_ERR_REFUSED = 8,         /* hub -> worker: a limit (capacity, JOIN rate, workers) refused the JOIN */
    MOEX_ERR_UNAUTHORIZED = 9,    /* hub -> worker (TCP transport): no AUTH first, or a wrong token */
} moex_proto_error_code;
#define MOEX_ERR_FIRST MOEX_ERR_MODEL_MISMATCH
#define MOEX_ERR_LAST MOEX_ERR_UNAUTHORIZED

/* What the receiver of an ERROR does. */
typedef enum moex_proto_error_action {
    MOEX_ERR_ACT_IGNORE,      /* log it; nothing else changes */
    MOEX_ERR_ACT_REDISPATCH,  /* hub: the request (seq) goes to another replica, or is computed here, at once */
    MOEX_ERR_ACT_RECONNECT,   /* worker: the hub closes this connection; reconnect with backoff */
    MOEX_ERR_ACT_EXIT,        /* worker: stop for good and say why, since retrying cannot help (a worker
                               * without its own model file re-reads the hub's model instead) */
} moex_proto_error_action;

typedef struct moex_proto_error_info {
    int32_t code;
    const char *name;          /* "model mismatch", ... */
    moex_proto_error_action on_hub, on_worker;  /* the reaction of a hub / a worker that receives it */
} moex_proto_error_info;

/* The code's entry; NULL for codes this version does not define (a receiver
 * logs those and otherwise ignores them). Negative codes get a shared entry
 * ("bad frame", close). */
const moex_proto_error_info *moex_proto_error_info_of(int32_t code);

#define MOEX_FLAG_COMPRESSED 0x01u /* payload is one LZ4 block (DISPATCH and RESULT only) */
#define MOEX_FLAG_MORE 0x02u       /* TCP transport: more frames of this message follow (DISPATCH and RESULT only) */

typedef enum moex_proto_backend {
    MOEX_BACKEND_CPU = 0, MOEX_BACKEND_VULKAN = 1, MOEX_BACKEND_WEBGPU = 2, MOEX_BACKEND_OTHER = 3
} moex_proto_backend;

typedef enum moex_proto_worker_state {
    MOEX_STATE_STARTING = 0, MOEX_STATE_LOADING = 1, MOEX_STATE_READY = 2, MOEX_STATE_DRAINING = 3
} moex_proto_worker_state;

/* Which matrix of an expert a WEIGHT_SYNC chunk belongs to. */
typedef enum moex_proto_tensor_kind {
    MOEX_TENSOR_GATE = 0, MOEX_TENSOR_UP = 1, MOEX_TENSOR_DOWN = 2
} moex_proto_tensor_kind;

/* ---- Header and limits ----------------------------------------------------- */

typedef struct moex_proto_header {
    uint16_t version;
    uint16_t type;
    uint32_t payload_len;  /* bytes after the header, as sent (compressed size if compressed) */
    uint32_t seq;          /* ties RESULT / CANCEL / ERROR to their DISPATCH */
    uint16_t layer, expert;
    uint32_t n_tokens;
    uint16_t hidden;
    uint8_t dtype, flags;
} moex_proto_header;

/* What the decoder accepts; a frame outside them is rejected before any
 * payload byte is read. Set them from the model (hidden = n_embd, layers,
 * experts) so that a peer cannot make the receiver allocate arbitrarily. */
typedef struct moex_proto_limits {
    uint32_t max_hidden;       /* hidden in 1..max_hidden (the field is 16-bit) */
    uint32_t max_tokens;       /* tokens in 1..max_tokens per tensor frame */
    uint32_t max_layers;       /* layer ids < max_layers */
    uint32_t max_experts;      /* expert ids < max_experts */
    uint32_t max_frame_bytes;  /* header + payload, and header + decompressed payload */
    uint64_t max_tensor_bytes; /* WEIGHT_SYNC: total size of one expert tensor */
} moex_proto_limits;

/* hidden 65535, tokens 65536, layers 1024, experts 4096, frames 64 MiB, tensors 4 GiB. */
moex_proto_limits moex_proto_default_limits(void);

/* Writes the 28 header bytes; no checks (the encoders below check). */
void moex_proto_header_write(uint8_t out[MOEX_PROTO_HEADER_BYTES], const moex_proto_header *h);
/* Reads the 28 header bytes as they are; no checks. */
void moex_proto_header_read(const uint8_t in[MOEX_PROTO_HEADER_BYTES], moex_proto_header *h);
/* Everything that can be checked from the header alone. */
int moex_proto_header_check(const moex_proto_header *h, const moex_proto_limits *lim, moex_error *err);
/* For stream readers: given at least the header bytes, checks the header and
 * returns in *frame_bytes the size of the whole frame to read. */
int moex_proto_frame_size(const uint8_t *buf, size_t len, const moex_proto_limits *lim,
                          size_t *frame_bytes, moex_error *err);

/* ---- Tensor payloads (DISPATCH, RESULT) ------------------------------------ */

/* Bytes per element of a wire dtype; 0 for unknown ones. */
size_t moex_proto_dtype_size(int dtype);
const char *moex_proto_dtype_name(int dtype);

/* Where each section sits in an (uncompressed) tensor payload:
 * [int8 only: n_tokens f32 scales][n_tokens x hidden values][DISPATCH only: n_tokens f16 gates] */
typedef struct moex_proto_tensor_layout {
    size_t scales_off, values_off, gates_off, bytes;
} moex_proto_tensor_layout;
int moex_proto_compute_layout(int type, int dtype, uint32_t n_tokens, uint32_t hidden,
                              moex_proto_tensor_layout *out);

/* The fields of a DISPATCH or RESULT frame. */
typedef struct moex_proto_tensor_msg {
    uint16_t type;  /* MOEX_MSG_DISPATCH or MOEX_MSG_RESULT */
    uint32_t seq;
    uint16_t layer, expert;
    uint32_t n_tokens;
    uint16_t hidden;
    uint8_t dtype;
} moex_proto_tensor_msg;

/* Bytes of the uncompressed frame. 0 when the fields are invalid. */
size_t moex_proto_tensor_frame_bytes(const moex_proto_tensor_msg *m);

/* Encodes x (n_tokens x hidden f32, row-major) converted to the wire dtype
 * straight into out, with gates (n_tokens f32; DISPATCH only, NULL for
 * RESULT) as f16. int8 rows need finite values. */
int moex_proto_encode_tensor_f32(const moex_proto_tensor_msg *m, const float *x, const float *gates,
                                 uint8_t *out, size_t cap, size_t *out_len, moex_error *err);
/* Same from sections already in wire form (little-endian byte images):
 * values (n_tokens x hidden elements), scales (int8: n_tokens f32, else
 * NULL), gates (DISPATCH: n_tokens f16, else NULL). One copy each. */
int moex_proto_encode_tensor_raw(const moex_proto_tensor_msg *m, const void *values, const void *scales,
                                 const void *gates, uint8_t *out, size_t cap, size_t *out_len,
                                 moex_error *err);

/* Upper bound of moex_proto_compress()'s output for an input frame of n bytes. */
size_t moex_proto_compress_bound(size_t frame_bytes);
/* Rewrites an uncompressed DISPATCH/RESULT frame as a compressed one in out
 * (a different buffer). The caller may send whichever is smaller. */
int moex_proto_compress(const uint8_t *frame, size_t frame_len, uint8_t *out, size_t cap,
                        size_t *out_len, moex_error *err);

/* A decoded tensor: pointers into the frame (or scratch), little-endian, any alignment. */
typedef struct moex_proto_tensor_view {
    uint8_t dtype;
    uint32_t n_tokens;
    uint16_t hidden;
    const uint8_t *values;  /* n_tokens x hidden elements */
    const uint8_t *scales;  /* int8: n_tokens f32; else NULL */
    const uint8_t *gates;   /* DISPATCH: n_tokens f16; else NULL */
} moex_proto_tensor_view;

/* One row (token < n_tokens) as f32 into dst[hidden]. */
void moex_proto_tensor_row_f32(const moex_proto_tensor_view *v, uint32_t token, float *dst);
/* The gate weight of one token (DISPATCH); 0 when the view has no gates. */
float moex_proto_tensor_gate(const moex_proto_tensor_view *v, uint32_t token);

/* ---- Control payloads -------------------------------------------------------- */

typedef struct moex_proto_heartbeat {
    uint64_t timestamp_us;  /* sender's clock */
    uint64_t echo_us;       /* the peer's last timestamp_us, 0 if none: RTT = now - echo */
    uint32_t queue_depth;   /* dispatches waiting or running */
    uint16_t load_permille; /* 0..1000 busy fraction */
    uint8_t state;          /* moex_proto_worker_state */
} moex_proto_heartbeat;
#define MOEX_PROTO_HEARTBEAT_BYTES 24

/* A worker's session timing (native and browser workers alike): a HEARTBEAT
 * every HEARTBEAT_MS; nothing from the hub for HUB_SILENCE_MS and it
 * reconnects; reconnects back off from BACKOFF_MIN_MS, doubling up to
 * BACKOFF_MAX_MS, with jitter, and start over once a hub answers a JOIN. */
#define MOEX_PROTO_HEARTBEAT_MS 1000
#define MOEX_PROTO_HUB_SILENCE_MS 5000
#define MOEX_PROTO_BACKOFF_MIN_MS 200
#define MOEX_PROTO_BACKOFF_MAX_MS 5000

typedef struct moex_proto_weight_chunk {
    uint8_t kind;        /* moex_proto_tensor_kind */
    uint8_t ggml_type;   /* moex_type of the tensor (q4_K, f16, ...) */
    uint64_t offset;     /* of this chunk in the tensor's bytes */
    uint64_t total;      /* bytes of the whole tensor */
    uint64_t hash;       /* moex_proto_hash64() of the whole tensor */
    const uint8_t *data; /* decode: the chunk's bytes */
    uint32_t len;
} moex_proto_weight_chunk;
#define MOEX_PROTO_WEIGHT_CHUNK_HEADER_BYTES 32

/* XXH3-64 (seed 0): the checksum of WEIGHT_SYNC tensors. */
uint64_t moex_proto_hash64(const void *data, size_t len);

typedef struct moex_proto_expert {
    uint16_t layer, expert;
} moex_proto_expert;

/* A list of (layer, expert) on the wire, read with moex_proto_expert_at(). */
typedef struct moex_proto_expert_list {
    uint32_t count;
    const uint8_t *bytes;
} moex_proto_expert_list;
moex_proto_expert moex_proto_expert_at(const moex_proto_expert_list *l, uint32_t i);

typedef struct moex_proto_join {
    uint16_t proto_min, proto_max; /* versions the worker speaks */
    uint8_t backend;               /* moex_proto_backend */
    uint16_t capacity_centi;       /* capacity weight x 100 (100 = weight 1.0), >= 1 */
    uint64_t memory_budget;        /* bytes the worker may use for experts */
    uint64_t model_hash;           /* model the held experts come from, 0 if none */
    uint64_t session;              /* the key of an earlier ASSIGN to this worker, 0 when it has none */
    const char *name;              /* not NUL-terminated; <= 255 bytes */
    uint8_t name_len;
} moex_proto_join;
#define MOEX_PROTO_JOIN_FIXED_BYTES 36

typedef struct moex_proto_assign {
    uint64_t model_hash;  /* identity of the model the hub serves */
    uint32_t worker_id;   /* the hub's id for this worker */
    uint16_t n_layers, n_experts, replicas;
    uint64_t session;     /* secret key naming this worker to the hub: a reconnect that presents it in JOIN
                           * is the same worker (same id, same experts, same record) */
} moex_proto_assign;
#define MOEX_PROTO_ASSIGN_FIXED_BYTES 32

#define MOEX_PROTO_ERROR_FIXED_BYTES 6
/* AUTH's payload is the token itself: 1 to this many bytes. */
#define MOEX_PROTO_AUTH_MAX_BYTES 1024

int moex_proto_encode_cancel(uint32_t seq, uint16_t layer, uint16_t expert, uint8_t *out, size_t cap,
                             size_t *out_len, moex_error *err);
int moex_proto_encode_heartbeat(uint32_t seq, const moex_proto_heartbeat *hb, uint8_t *out, size_t cap,
                                size_t *out_len, moex_error *err);
/* c->data / c->len are the chunk's bytes. */
int moex_proto_encode_weight_chunk(uint32_t seq, uint16_t layer, uint16_t expert,
                                   const moex_proto_weight_chunk *c, uint8_t *out, size_t cap,
                                   size_t *out_len, moex_error *err);
int moex_proto_encode_join(uint32_t seq, const moex_proto_join *j, const moex_proto_expert *held,
                           uint32_t n_held, uint8_t *out, size_t cap, size_t *out_len, moex_error *err);
int moex_proto_encode_assign(uint32_t seq, const moex_proto_assign *a, const moex_proto_expert *experts,
                             uint32_t n_experts, uint8_t *out, size_t cap, size_t *out_len,
                             moex_error *err);
/* token: 1..MOEX_PROTO_AUTH_MAX_BYTES bytes (a worker sends seq 0). */
int moex_proto_encode_auth(uint32_t seq, const char *token, size_t len, uint8_t *out, size_t cap, size_t *out_len,
                           moex_error *err);
/* text: UTF-8, not NUL-terminated, <= 65535 bytes. */
int moex_proto_encode_error(uint32_t seq, int32_t code, const char *text, uint16_t text_len,
                            uint8_t *out, size_t cap, size_t *out_len, moex_error *err);

/* ---- Messages: transport framing -------------------------------------------
 *
 * A WebSocket message carries one or more frames back to back (a hub sends a
 * worker all its experts of a layer in one message; a worker may answer with
 * several RESULTs in one). Transports deliver a message in fragments; the
 * reassembly buffer below collects them, bounded, so that a peer cannot make
 * the receiver buffer more than `max_bytes`. */

typedef struct moex_proto_reasm {
    uint8_t *buf;
    size_t len, cap;
    size_t max_bytes;   /* a message over this is refused */
} moex_proto_reasm;

/* Appends a fragment. 0, or MOEX_PROTO_E_TOO_BIG (the message would exceed
 * max_bytes; the buffer is emptied), or MOEX_PROTO_E_ARG (out of memory). */
int moex_proto_reasm_add(moex_proto_reasm *r, const void *data, size_t n, moex_error *err);
/* Empties the buffer for the next message (keeps its memory, up to a
 * modest size, so a steady stream does not reallocate). */
void moex_proto_reasm_reset(moex_proto_reasm *r);
void moex_proto_reasm_free(moex_proto_reasm *r);

/* Splits a message into frames: *frame_len is the length of the frame at
 * msg[*off]; the caller decodes it and advances *off by it. Returns 1 while
 * a frame is there, 0 at the end, a negative status when the bytes at *off
 * are not a whole valid header + payload (the rest of the message is then
 * unusable). */
int moex_proto_next_frame(const uint8_t *msg, size_t len, size_t *off, const moex_proto_limits *lim,
                          size_t *frame_len, moex_error *err);

/* Stream transports (TCP, no message boundaries): *whole is how many bytes
 * at the start of buf are complete frames (0 while the first is still
 * arriving), *messages (may be NULL) how many of those end a message: up to
 * the last whole frame without MOEX_FLAG_MORE. A negative status when a
 * header is invalid: the stream is then unusable. Each frame is bounded by
 * lim, so a reader holds at most one incomplete frame beyond what it hands on. */
int moex_proto_stream_frames(const uint8_t *buf, size_t len, const moex_proto_limits *lim, size_t *whole,
                             size_t *messages, moex_error *err);

/* ---- Decoding ----------------------------------------------------------------- */

typedef struct moex_proto_msg {
    moex_proto_header h;
    const uint8_t *payload;  /* decompressed payload (into scratch when compressed) */
    uint32_t payload_len;
    union {
        moex_proto_tensor_view tensor;  /* DISPATCH, RESULT */
        moex_proto_heartbeat heartbeat;
        moex_proto_weight_chunk chunk;  /* WEIGHT_SYNC; layer/expert in h */
        struct { moex_proto_join info; moex_proto_expert_list held; } join;
        struct { moex_proto_assign info; moex_proto_expert_list experts; } assign;
        struct { int32_t code; const char *text; uint16_t text_len; } error;
        struct { const char *token; uint32_t len; } auth;  /* the payload itself */
    } u;
} moex_proto_msg;

/* Bytes of scratch a frame with this (checked) header needs: its
 * decompressed payload size when compressed, else 0. */
size_t moex_proto_scratch_bytes(const moex_proto_header *h);

/* Decodes exactly one frame of len bytes. The message points into frame (and
 * scratch, when compressed); keep both alive while using it. lim NULL means
 * moex_proto_default_limits() (here and in moex_proto_frame_size). */
int moex_proto_decode(const uint8_t *frame, size_t len, const moex_proto_limits *lim, void *scratch,
                      size_t scratch_cap, moex_proto_msg *out, moex_error *err);

#endif
