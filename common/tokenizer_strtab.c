/* The tokenizer's string table (byte strings <-> ids, xxHash-indexed) and
 * small growable arrays. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/tokenizer_impl.h"

static uint64_t hash_bytes(const char *s, size_t len) { return XXH3_64bits(s, len); }

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

int moex_strtab_init(moex_strtab *t, int32_t expected, size_t expected_bytes, moex_error *err) {
    memset(t, 0, sizeof *t);
    t->cap = expected > 16 ? expected : 16;
    t->blob_cap = expected_bytes > 64 ? expected_bytes : 64;
    t->n_slots = pow2_at_least((size_t)t->cap * 2);
    t->off = malloc(sizeof *t->off * (size_t)t->cap);
    t->len = malloc(sizeof *t->len * (size_t)t->cap);
    t->blob = malloc(t->blob_cap);
    t->slots = malloc(sizeof *t->slots * t->n_slots);
    if (!t->off || !t->len || !t->blob || !t->slots) {
        moex_strtab_free(t);
        return moex_fail(err, "tokenizer: out of memory for the string table");
    }
    memset(t->slots, 0xff, sizeof *t->slots * t->n_slots);
    return 0;
}

void moex_strtab_free(moex_strtab *t) {
    free(t->blob);
    free(t->off);
    free(t->len);
    free(t->slots);
    memset(t, 0, sizeof *t);
}

static bool slot_holds(const moex_strtab *t, moex_strtab_slot slot, uint32_t tag, const char *s, size_t len) {
    return slot.tag == tag && t->len[slot.id] == len && memcmp(t->blob + t->off[slot.id], s, len) == 0;
}

static uint32_t tag_of(uint64_t h) { return (uint32_t)(h >> 32); }

int32_t moex_strtab_find(const moex_strtab *t, const char *s, size_t len) {
    size_t mask = t->n_slots - 1;
    uint64_t h = hash_bytes(s, len);
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        moex_strtab_slot slot = t->slots[i];
        if (slot.id < 0) return -1;
        if (slot_holds(t, slot, tag_of(h), s, len)) return slot.id;
    }
}

/* Puts id (whose hash is h) into the first free slot of its chain. */
static void slot_insert(moex_strtab_slot *slots, size_t n_slots, uint64_t h, int32_t id) {
    size_t mask = n_slots - 1;
    size_t i = h & mask;
    while (slots[i].id >= 0) i = (i + 1) & mask;
    slots[i] = (moex_strtab_slot){.id = id, .tag = tag_of(h)};
}

static int rehash(moex_strtab *t, size_t n_slots) {
    moex_strtab_slot *slots = malloc(sizeof *slots * n_slots);
    if (!slots) return -1;
    memset(slots, 0xff, sizeof *slots * n_slots);
    for (int32_t id = 0; id < t->n; id++) slot_insert(slots, n_slots, hash_bytes(t->blob + t->off[id], t->len[id]), id);
    free(t->slots);
    t->slots = slots;
    t->n_slots = n_slots;
    return 0;
}

static int grow_arrays(moex_strtab *t, size_t more_bytes) {
    if (t->n == t->cap) {
        int32_t cap = t->cap * 2;
        uint64_t *off = realloc(t->off, sizeof *off * (size_t)cap);
        if (!off) return -1;
        t->off = off;
        uint32_t *len = realloc(t->len, sizeof *len * (size_t)cap);
        if (!len) return -1;
        t->len = len;
        t->cap = cap;
    }
    if (t->blob_len + more_bytes > t->blob_cap) {
        size_t cap = t->blob_cap * 2;
        while (cap < t->blob_len + more_bytes) cap *= 2;
        char *blob = realloc(t->blob, cap);
        if (!blob) return -1;
        t->blob = blob;
        t->blob_cap = cap;
    }
    if ((size_t)(t->n + 1) * 2 > t->n_slots && rehash(t, t->n_slots * 2)) return -1;
    return 0;
}

int32_t moex_strtab_add(moex_strtab *t, const char *s, size_t len, moex_error *err) {
    int32_t id = moex_strtab_find(t, s, len);
    if (id >= 0) return id;
    if (len > UINT32_MAX || t->n == INT32_MAX || grow_arrays(t, len)) {
        moex_fail(err, "tokenizer: out of memory for the string table");
        return -1;
    }
    id = t->n++;
    t->off[id] = t->blob_len;
    t->len[id] = (uint32_t)len;
    if (len) memcpy(t->blob + t->blob_len, s, len);
    t->blob_len += len;
    slot_insert(t->slots, t->n_slots, hash_bytes(s, len), id);
    return id;
}

int moex_i32vec_push(moex_i32vec *a, int32_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, sizeof *v * cap);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

void moex_i32vec_free(moex_i32vec *a) {
    free(a->v);
    memset(a, 0, sizeof *a);
}

int moex_bytebuf_append(moex_bytebuf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        char *v = realloc(b->v, cap);
        if (!v) return -1;
        b->v = v;
        b->cap = cap;
    }
    if (n) memcpy(b->v + b->n, p, n);
    b->n += n;
    return 0;
}

void moex_bytebuf_free(moex_bytebuf *b) {
    free(b->v);
    memset(b, 0, sizeof *b);
}
