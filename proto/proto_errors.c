/* ERROR codes: their names and what each side does on receiving one. The
 * table is the one definition; the hub, the worker and docs/PROTOCOL.md all
 * follow it (tests/proto checks the document's table against it). */
#include "proto/proto.h"

static const moex_proto_error_info errors[] = {
    /* code                    name                          hub receives             worker receives */
    {MOEX_ERR_MODEL_MISMATCH, "model mismatch",             MOEX_ERR_ACT_IGNORE,     MOEX_ERR_ACT_EXIT},
    {MOEX_ERR_BUSY,           "busy",                       MOEX_ERR_ACT_REDISPATCH, MOEX_ERR_ACT_IGNORE},
    {MOEX_ERR_PREEMPTED,      "preempted",                  MOEX_ERR_ACT_REDISPATCH, MOEX_ERR_ACT_IGNORE},
    {MOEX_ERR_COMPUTE,        "cannot compute",             MOEX_ERR_ACT_REDISPATCH, MOEX_ERR_ACT_IGNORE},
    {MOEX_ERR_ALREADY_JOINED, "already joined",             MOEX_ERR_ACT_IGNORE,     MOEX_ERR_ACT_IGNORE},
    {MOEX_ERR_VERSION,        "no common protocol version", MOEX_ERR_ACT_IGNORE,     MOEX_ERR_ACT_EXIT},
    {MOEX_ERR_EVICTED,        "evicted",                    MOEX_ERR_ACT_IGNORE,     MOEX_ERR_ACT_EXIT},
    {MOEX_ERR_REFUSED,        "refused",                    MOEX_ERR_ACT_IGNORE,     MOEX_ERR_ACT_RECONNECT},
    {MOEX_ERR_UNAUTHORIZED,   "unauthorized",               MOEX_ERR_ACT_IGNORE,     MOEX_ERR_ACT_EXIT},
};

/* A negative code: the receiver's frame was malformed. A hub re-sends the
 * request elsewhere; a worker's connection is closed by the hub. */
static const moex_proto_error_info bad_frame = {-1, "bad frame", MOEX_ERR_ACT_REDISPATCH, MOEX_ERR_ACT_RECONNECT};

const moex_proto_error_info *moex_proto_error_info_of(int32_t code) {
    if (code < 0) return &bad_frame;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == code) return &errors[i];
    return NULL;
}
