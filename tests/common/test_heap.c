/* common/heap.h: random pushes and pops, interleaved, come out in the order a
 * linear scan of what is queued gives (ties broken by insertion number, so
 * the order is total), and free leaves an empty, reusable queue. */
#include <stdbool.h>
#include <string.h>

#include "common/common.h"

#include "tests/test_util.h"

typedef struct item {
    int key;        /* few distinct values: many ties */
    uint32_t seq;   /* insertion number: breaks them */
} item;

static bool item_before(const item *a, const item *b) { return a->key < b->key || (a->key == b->key && a->seq < b->seq); }

MOEX_HEAP_DEFINE(item_heap, item, item_before)

enum { OPS = 20000 };

/* Index of the item a correct heap pops next from ref[0..n). */
static size_t ref_first(const item *ref, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (item_before(&ref[i], &ref[best])) best = i;
    return best;
}

int main(void) {
    rng r = test_rng("test_heap");
    item_heap h = {0};
    item *ref = malloc(sizeof *ref * OPS);
    size_t n_ref = 0, pops = 0;
    uint32_t seq = 0;
    for (int op = 0; op < OPS; op++) {
        /* more pushes than pops early, more pops late: the heap grows, then drains */
        const bool push = n_ref == 0 || rng_uniform(&r) < (op < OPS / 2 ? 0.7 : 0.3);
        if (push) {
            const item x = {(int)(rng_next(&r) % 16), seq++};
            CHECK(item_heap_push(&h, x) == 0, "push %d failed", op);
            ref[n_ref++] = x;
        } else {
            const size_t i = ref_first(ref, n_ref);
            const item got = item_heap_pop(&h);
            CHECK(got.key == ref[i].key && got.seq == ref[i].seq, "pop %zu: got (%d, %u), want (%d, %u)", pops,
                  got.key, got.seq, ref[i].key, ref[i].seq);
            ref[i] = ref[--n_ref];
            pops++;
        }
        CHECK(h.n == n_ref, "op %d: heap holds %zu, want %zu", op, h.n, n_ref);
    }
    while (h.n) {
        const size_t i = ref_first(ref, n_ref);
        const item got = item_heap_pop(&h);
        CHECK(got.seq == ref[i].seq, "drain: got (%d, %u), want (%d, %u)", got.key, got.seq, ref[i].key, ref[i].seq);
        ref[i] = ref[--n_ref];
    }
    item_heap_free(&h);
    CHECK(h.v == NULL && h.n == 0 && h.cap == 0, "free leaves an empty queue");
    CHECK(item_heap_push(&h, (item){1, 0}) == 0 && item_heap_pop(&h).key == 1 && h.n == 0, "reuse after free");
    item_heap_free(&h);
    free(ref);
    if (g_failures) fprintf(stderr, "%d failure(s)\n", g_failures);
    return g_failures ? 1 : 0;
}
