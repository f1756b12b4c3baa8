/* A binary heap over an array of T, for the project's priority queues (the
 * tokenizers' merge queue, the simulator's event queue). Written once, as a
 * macro, so that each queue keeps its own element type and comparison and
 * both are inlined (the queues sit on hot paths): no function pointers, no
 * copies through void *. Part of the common module's API (common/common.h).
 *
 *   MOEX_HEAP_DEFINE(name, T, before)
 *
 * defines, static to the including file:
 *   typedef struct name { T *v; size_t n, cap; } name;   zero-initialised is empty; n = 0 empties it
 *   int name_push(name *h, T x);   -1 on out of memory (h unchanged)
 *   T name_pop(name *h);           the element that comes out first; h->n must be > 0
 *   void name_free(name *h);
 * where bool before(const T *a, const T *b) says a comes out before b (a
 * strict weak order; elements neither before the other leave in any order,
 * so a queue that needs a fixed order breaks every tie). */
#ifndef MOEX_HEAP_H
#define MOEX_HEAP_H

#include <stddef.h>
#include <stdlib.h>

#define MOEX_HEAP_DEFINE(name, T, before)                                                  \
    typedef struct name {                                                                  \
        T *v;                                                                              \
        size_t n, cap;                                                                     \
    } name;                                                                                \
                                                                                           \
    static inline int name##_push(name *h, T x) {                                          \
        if (h->n == h->cap) {                                                              \
            const size_t cap = h->cap ? 2 * h->cap : 64;                                   \
            T *v = realloc(h->v, cap * sizeof *v);                                         \
            if (!v) return -1;                                                             \
            h->v = v;                                                                      \
            h->cap = cap;                                                                  \
        }                                                                                  \
        size_t i = h->n++; /* the hole x sifts up from */                                  \
        while (i > 0 && before(&x, &h->v[(i - 1) / 2])) {                                  \
            h->v[i] = h->v[(i - 1) / 2];                                                   \
            i = (i - 1) / 2;                                                               \
        }                                                                                  \
        h->v[i] = x;                                                                       \
        return 0;                                                                          \
    }                                                                                      \
                                                                                           \
    static inline T name##_pop(name *h) {                                                  \
        const T top = h->v[0], last = h->v[--h->n];                                        \
        size_t i = 0; /* the hole `last` sifts down from */                                \
        for (;;) {                                                                         \
            size_t c = 2 * i + 1;                                                          \
            if (c >= h->n) break;                                                          \
            if (c + 1 < h->n && before(&h->v[c + 1], &h->v[c])) c++;                       \
            if (!before(&h->v[c], &last)) break;                                           \
            h->v[i] = h->v[c];                                                             \
            i = c;                                                                         \
        }                                                                                  \
        if (h->n) h->v[i] = last;                                                          \
        return top;                                                                        \
    }                                                                                      \
                                                                                           \
    static inline void name##_free(name *h) {                                              \
        free(h->v);                                                                        \
        h->v = NULL;                                                                       \
        h->n = h->cap = 0;                                                                 \
    }

#endif
