/* The merge queue both tokenizers share: BPE and SPM merge the best adjacent
 * pair first, ties to the leftmost, as llama.cpp's llm_bigram_bpe and
 * llm_bigram_spm priority queues. A binary heap on "before"; static inline,
 * since tokenizing spends much of its time here. Private to tokenizer*.c. */
#ifndef MOEX_TOKENIZER_HEAP_H
#define MOEX_TOKENIZER_HEAP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

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

typedef struct moex_bigram_heap {
    moex_bigram *v;
    size_t n, cap;
} moex_bigram_heap;

/* a merges before b. */
static inline bool moex_bigram_before(const moex_bigram *a, const moex_bigram *b) {
    return a->priority > b->priority || (a->priority == b->priority && a->left < b->left);
}

/* -1 on out of memory. */
static inline int moex_bigram_push(moex_bigram_heap *h, moex_bigram b) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        moex_bigram *v = realloc(h->v, sizeof *v * cap);
        if (!v) return -1;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!moex_bigram_before(&b, &h->v[parent])) break;
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = b;
    return 0;
}

/* Removes and returns the pair to merge next; h->n must be > 0. */
static inline moex_bigram moex_bigram_pop(moex_bigram_heap *h) {
    moex_bigram top = h->v[0];
    moex_bigram last = h->v[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && moex_bigram_before(&h->v[c + 1], &h->v[c])) c++;
        if (!moex_bigram_before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (n) h->v[i] = last;
    return top;
}

static inline void moex_bigram_heap_free(moex_bigram_heap *h) {
    free(h->v);
    *h = (moex_bigram_heap){0};
}

#endif
