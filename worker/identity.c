/* Model identity: what hub and worker compare before the worker computes.
 * Hashing the header, metadata and tensor infos (not the data) identifies a
 * file's architecture, tokenizer, shapes, types and layout in a few
 * milliseconds, even for a 100 GB model. */
#include "worker/worker.h"

uint64_t moex_gguf_identity(const moex_gguf *g) {
    size_t n = g->data_offset <= g->size ? g->data_offset : g->size;
    return moex_proto_hash64(g->base, n);
}
