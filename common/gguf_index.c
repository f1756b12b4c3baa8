/* String -> entry number hash index (xxh3, linear probing, load <= 1/2). */
#include "common/gguf_index.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static size_t slot_of(const moex_name_index *ix, const char *s, uint64_t len) {
    return (size_t)XXH3_64bits(s, (size_t)len) & (ix->cap - 1);
}

static int grow(moex_name_index *ix, size_t cap) {
    moex_name_slot *slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    moex_name_index bigger = {slots, cap, ix->count};
    for (size_t i = 0; i < ix->cap; i++) {
        if (!ix->slots[i].s) continue;
        size_t j = slot_of(&bigger, ix->slots[i].s, ix->slots[i].len);
        while (slots[j].s) j = (j + 1) & (cap - 1);
        slots[j] = ix->slots[i];
    }
    free(ix->slots);
    *ix = bigger;
    return 0;
}

int moex_name_index_init(moex_name_index *ix, size_t expected) {
    *ix = (moex_name_index){0};
    size_t cap = 16;
    while (cap / 2 < expected) {
        if (cap > SIZE_MAX / 4 / sizeof(moex_name_slot)) return -1;
        cap *= 2;
    }
    return grow(ix, cap);
}

void moex_name_index_free(moex_name_index *ix) {
    free(ix->slots);
    *ix = (moex_name_index){0};
}

static int same(const moex_name_slot *slot, const char *s, uint64_t len) {
    return slot->len == len && memcmp(slot->s, s, (size_t)len) == 0;
}

int moex_name_index_add(moex_name_index *ix, const char *s, uint64_t len, uint64_t idx, uint64_t *prev) {
    if ((ix->count + 1) * 2 > ix->cap && grow(ix, ix->cap ? ix->cap * 2 : 16)) return -1;
    size_t j = slot_of(ix, s, len);
    for (; ix->slots[j].s; j = (j + 1) & (ix->cap - 1)) {
        if (same(&ix->slots[j], s, len)) {
            if (prev) *prev = ix->slots[j].idx;
            return 1;
        }
    }
    /* "" must still mark the slot as used: point it at a static byte. */
    ix->slots[j] = (moex_name_slot){len ? s : "", len, idx};
    ix->count++;
    return 0;
}

int64_t moex_name_index_get(const moex_name_index *ix, const char *s, uint64_t len) {
    if (!ix->cap) return -1;
    for (size_t j = slot_of(ix, s, len); ix->slots[j].s; j = (j + 1) & (ix->cap - 1))
        if (same(&ix->slots[j], s, len)) return (int64_t)ix->slots[j].idx;
    return -1;
}
