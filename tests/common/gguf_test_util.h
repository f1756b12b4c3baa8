/* Shared by the GGUF tests: a CHECK macro that counts failures and a byte
 * builder for hand-made (often deliberately broken) GGUF files. */
#ifndef MOEX_GGUF_TEST_UTIL_H
#define MOEX_GGUF_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_failures;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            g_failures++;                                                        \
        }                                                                        \
    } while (0)

typedef struct gbuf {
    uint8_t *p;
    size_t len, cap;
} gbuf;

static inline void gb_bytes(gbuf *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort();
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
}
static inline void gb_u8(gbuf *b, uint8_t v) { gb_bytes(b, &v, 1); }
static inline void gb_u32(gbuf *b, uint32_t v) { gb_bytes(b, &v, 4); }
static inline void gb_u64(gbuf *b, uint64_t v) { gb_bytes(b, &v, 8); }
static inline void gb_str(gbuf *b, const char *s) {
    gb_u64(b, strlen(s));
    gb_bytes(b, s, strlen(s));
}
static inline void gb_zeros(gbuf *b, size_t n) {
    for (size_t i = 0; i < n; i++) gb_u8(b, 0);
}
static inline void gb_pad(gbuf *b, size_t align) {
    while (b->len % align) gb_u8(b, 0);
}
static inline void gb_header(gbuf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    gb_bytes(b, "GGUF", 4);
    gb_u32(b, version);
    gb_u64(b, n_tensors);
    gb_u64(b, n_kv);
}
/* key, type tag: the value follows. */
static inline void gb_key(gbuf *b, const char *key, uint32_t type) {
    gb_str(b, key);
    gb_u32(b, type);
}
static inline void gb_tensor(gbuf *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset) {
    gb_str(b, name);
    gb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) gb_u64(b, ne[d]);
    gb_u32(b, type);
    gb_u64(b, offset);
}
static inline void gb_free(gbuf *b) {
    free(b->p);
    *b = (gbuf){0};
}

#endif
