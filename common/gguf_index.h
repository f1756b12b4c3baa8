/* Private to the GGUF reader and writer: an open-addressing hash index from
 * byte strings (not NUL-terminated) to entry numbers, so tensor lookups stay
 * O(1) for files with tens of thousands of tensors and duplicate checks stay
 * linear on hostile files. The index points at the caller's strings. */
#ifndef MOEX_GGUF_INDEX_H
#define MOEX_GGUF_INDEX_H

#include <stddef.h>
#include <stdint.h>

typedef struct moex_name_slot {
    const char *s;     /* NULL: empty slot */
    uint64_t len;
    uint64_t idx;
} moex_name_slot;

typedef struct moex_name_index {
    moex_name_slot *slots;
    size_t cap;        /* power of two, or 0 */
    size_t count;
} moex_name_index;

/* Sizes the index for `expected` names (it grows past that as needed). 0 or -1 (out of memory). */
int moex_name_index_init(moex_name_index *ix, size_t expected);
void moex_name_index_free(moex_name_index *ix);
/* Adds s -> idx. Returns 0, 1 when s is already present (*prev gets its idx), -1 on out of memory. */
int moex_name_index_add(moex_name_index *ix, const char *s, uint64_t len, uint64_t idx, uint64_t *prev);
/* idx of s, or -1 when absent. */
int64_t moex_name_index_get(const moex_name_index *ix, const char *s, uint64_t len);

#endif
