/* The merge queue both tokenizers share: BPE and SPM merge the best adjacent
 * pair first, ties to the leftmost, as llama.cpp's llm_bigram_bpe and
 * llm_bigram_spm priority queues. Private to tokenizer*.c. */
#ifndef MOEX_TOKENIZER_HEAP_H
#define MOEX_TOKENIZER_HEAP_H

#include <stdbool.h>
#include <stdint.h>

#include "common/heap.h"

/* The pair of symbol `left` and the symbol after it. Its right partner is
 * not stored: a symbol's successor changes only when the symbol absorbs it,
 * which changes its size, so while `size` still matches, the partner is the
 * one the pair was queued with. 16 bytes: the heap moves these around a lot. */
typedef struct moex_bigram {
    float priority;   /* higher merges first: -rank (BPE, exact: ranks < 2^24), the merged token's score (SPM) */
    int32_t left;     /* symbol index; of equal priorities the smaller left merges first */
    uint32_t size;    /* bytes of left + its successor when queued: stale once either changed */
    int32_t result;   /* BPE: string id of the merged text */
} moex_bigram;

/* a merges before b. */
static inline bool moex_bigram_before(const moex_bigram *a, const moex_bigram *b) {
    return a->priority > b->priority || (a->priority == b->priority && a->left < b->left);
}

/* moex_bigram_heap, moex_bigram_heap_push, _pop and _free. */
MOEX_HEAP_DEFINE(moex_bigram_heap, moex_bigram, moex_bigram_before)

#endif
