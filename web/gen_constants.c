/* Writes web/moex_constants.js (at build time, into <build>/web): the
 * protocol's numbers the browser worker needs, taken from the C headers by
 * the C compiler, so that no JavaScript file spells one of them again:
 * message types, backends, worker states, every ERROR code with its name and
 * reactions (proto/proto.h), the session timing (proto/proto.h), the tensor
 * types and their names (common/types.h), the header size, the byte
 * offsets of moex_wasm_msg's fields (web/wasm/moex_wasm.h), and every block
 * layout's elements, bytes and field offsets (common/block_views.h), also as
 * WGSL constants the kernels are compiled with (MOEX.WGSL_BLOCKS).
 * usage: gen_constants > moex_constants.js */
#include <stddef.h>
#include <stdio.h>

#include "common/block_views.h"
#include "common/common.h"
#include "proto/proto.h"
#include "web/wasm/moex_wasm.h"

typedef struct named {
    const char *name;
    long value;
} named;

#define N(x) (sizeof(x) / sizeof((x)[0]))

static void object(const char *key, const named *v, size_t n) {
    printf("  %s: {", key);
    for (size_t i = 0; i < n; i++) printf("%s%s: %ld", i ? ", " : " ", v[i].name, v[i].value);
    printf(" },\n");
}

int main(void) {
    static const named msg[] = {{"DISPATCH", MOEX_MSG_DISPATCH}, {"RESULT", MOEX_MSG_RESULT},
                                {"CANCEL", MOEX_MSG_CANCEL},     {"HEARTBEAT", MOEX_MSG_HEARTBEAT},
                                {"WEIGHT_SYNC", MOEX_MSG_WEIGHT_SYNC}, {"JOIN", MOEX_MSG_JOIN},
                                {"ASSIGN", MOEX_MSG_ASSIGN},     {"ERROR", MOEX_MSG_ERROR}};
    static const named backend[] = {{"CPU", MOEX_BACKEND_CPU}, {"VULKAN", MOEX_BACKEND_VULKAN},
                                    {"WEBGPU", MOEX_BACKEND_WEBGPU}, {"OTHER", MOEX_BACKEND_OTHER}};
    static const named state[] = {{"STARTING", MOEX_STATE_STARTING}, {"LOADING", MOEX_STATE_LOADING},
                                  {"READY", MOEX_STATE_READY}, {"DRAINING", MOEX_STATE_DRAINING}};
    static const named err[] = {{"MODEL_MISMATCH", MOEX_ERR_MODEL_MISMATCH}, {"BUSY", MOEX_ERR_BUSY},
                                {"PREEMPTED", MOEX_ERR_PREEMPTED},         {"COMPUTE", MOEX_ERR_COMPUTE},
                                {"ALREADY_JOINED", MOEX_ERR_ALREADY_JOINED}, {"VERSION", MOEX_ERR_VERSION},
                                {"EVICTED", MOEX_ERR_EVICTED},             {"REFUSED", MOEX_ERR_REFUSED},
                                {"UNAUTHORIZED", MOEX_ERR_UNAUTHORIZED}};
    static const named act[] = {{"IGNORE", MOEX_ERR_ACT_IGNORE}, {"REDISPATCH", MOEX_ERR_ACT_REDISPATCH},
                                {"RECONNECT", MOEX_ERR_ACT_RECONNECT}, {"EXIT", MOEX_ERR_ACT_EXIT}};
    static const named session[] = {{"HEARTBEAT_MS", MOEX_PROTO_HEARTBEAT_MS},
                                    {"HUB_SILENCE_MS", MOEX_PROTO_HUB_SILENCE_MS},
                                    {"BACKOFF_MIN_MS", MOEX_PROTO_BACKOFF_MIN_MS},
                                    {"BACKOFF_MAX_MS", MOEX_PROTO_BACKOFF_MAX_MS}};
#define F(f) {#f, (long)offsetof(moex_wasm_msg, f)}
    static const named fields[] = {F(type), F(seq), F(layer), F(expert), F(n_tokens), F(hidden), F(dtype), F(flags),
                                   F(code), F(text_off), F(text_len), F(list_off), F(list_count), F(worker_id),
                                   F(n_layers), F(n_experts), F(replicas), F(hash_lo), F(hash_hi), F(ts_lo),
                                   F(ts_hi)};
#undef F
    /* the weight types a worker may hold, by the names /v1/model gives them */
    static const moex_type types[] = {MOEX_TYPE_F32, MOEX_TYPE_F16, MOEX_TYPE_Q4_0, MOEX_TYPE_Q4_1, MOEX_TYPE_Q5_0,
                                      MOEX_TYPE_Q5_1, MOEX_TYPE_Q8_0, MOEX_TYPE_Q4_K, MOEX_TYPE_Q5_K, MOEX_TYPE_Q6_K,
                                      MOEX_TYPE_BF16};
    named type[N(types)];
    for (size_t i = 0; i < N(types); i++) type[i] = (named){moex_type_get(types[i])->name, (long)types[i]};

    printf("// Generated at build time by web/gen_constants.c from proto/proto.h, common/types.h and\n"
           "// web/wasm/moex_wasm.h: edit those, not this file. A classic script: defines self.MOEX.\n"
           "'use strict';\n\nconst MOEX = Object.freeze({\n");
    object("MSG", msg, N(msg));
    object("BACKEND", backend, N(backend));
    object("STATE", state, N(state));
    object("ERR", err, N(err));
    object("ACT", act, N(act));
    object("SESSION", session, N(session));
    object("TYPE", type, N(type));
    object("MSG_FIELDS", fields, N(fields));
    /* BLOCK: type id -> [elements, bytes] of every type the GPU kernels read, floats included */
    static const moex_type floats[] = {MOEX_TYPE_F32, MOEX_TYPE_F16, MOEX_TYPE_BF16};
    printf("  BLOCK: {");
    for (size_t i = 0; i < N(floats); i++)
        printf(" %d: [1, %d],", (int)floats[i], moex_type_get(floats[i])->block_bytes);
    for (size_t i = 0; i < MOEX_N_BLOCK_VIEWS; i++)
        printf(" %d: [%d, %zu]%s", (int)moex_block_views[i].type, moex_block_views[i].elems, moex_block_views[i].bytes,
               i + 1 < MOEX_N_BLOCK_VIEWS ? "," : "");
    printf(" },\n  WGSL_BLOCKS: '");
    for (size_t i = 0; i < MOEX_N_BLOCK_VIEWS; i++) {
        const moex_block_view *v = &moex_block_views[i];
        printf("const %s_ELEMS = %du; const %s_BYTES = %zuu; ", v->name, v->elems, v->name, v->bytes);
        for (const moex_block_field *f = v->fields; f->name; f++) printf("const %s_%s = %zuu; ", v->name, f->name, f->offset);
    }
    printf("',\n");
    printf("  MSG_BYTES: %zu,\n  HEADER_BYTES: %d,\n});\nself.MOEX = MOEX;\n", sizeof(moex_wasm_msg),
           MOEX_PROTO_HEADER_BYTES);
    return 0;
}
