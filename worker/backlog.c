/* The backlog: a bounded FIFO of DISPATCH frames (rule in worker.h). Slots
 * keep their buffers between uses, so a warm backlog never allocates. */
#include <stdlib.h>
#include <string.h>

#include "worker/worker.h"

struct moex_worker_backlog {
    int capacity, head, count;   /* ring: items head .. head+count-1 (mod capacity) */
    moex_worker_item *slots;
};

moex_worker_backlog *moex_worker_backlog_create(int capacity) {
    if (capacity <= 0) return NULL;
    moex_worker_backlog *b = calloc(1, sizeof *b);
    if (b) b->slots = calloc((size_t)capacity, sizeof *b->slots);
    if (!b || !b->slots) {
        free(b);
        return NULL;
    }
    b->capacity = capacity;
    return b;
}

void moex_worker_backlog_free(moex_worker_backlog *b) {
    if (!b) return;
    for (int i = 0; i < b->capacity; i++) free(b->slots[i].frame);
    free(b->slots);
    free(b);
}

int moex_worker_backlog_depth(const moex_worker_backlog *b) { return b->count; }

static moex_worker_item *at(const moex_worker_backlog *b, int i) {
    return &b->slots[(b->head + i) % b->capacity];
}

static void swap_items(moex_worker_item *a, moex_worker_item *c) {
    moex_worker_item t = *a;
    *a = *c;
    *c = t;
}

/* Removes the item at queue position i, keeping the others in order; its
 * slot (and buffer) moves to the free end of the ring. */
static void remove_at(moex_worker_backlog *b, int i) {
    for (int j = i; j + 1 < b->count; j++) swap_items(at(b, j), at(b, j + 1));
    b->count--;
}

int moex_worker_backlog_push(moex_worker_backlog *b, uint32_t seq, uint16_t layer, uint16_t expert,
                             const uint8_t *frame, size_t len, uint32_t *stale, int *n_stale) {
    *n_stale = 0;
    for (int i = 0; i < b->count;) {
        if (at(b, i)->layer != layer) {
            stale[(*n_stale)++] = at(b, i)->seq;
            remove_at(b, i);
        } else {
            i++;
        }
    }
    if (b->count == b->capacity) return 1;
    moex_worker_item *it = at(b, b->count);
    if (it->cap < len) {
        uint8_t *p = realloc(it->frame, len);
        if (!p) return -1;
        it->frame = p;
        it->cap = len;
    }
    memcpy(it->frame, frame, len);
    it->len = len;
    it->seq = seq;
    it->layer = layer;
    it->expert = expert;
    b->count++;
    return 0;
}

bool moex_worker_backlog_pop(moex_worker_backlog *b, moex_worker_item *into) {
    if (b->count == 0) return false;
    swap_items(at(b, 0), into);
    b->head = (b->head + 1) % b->capacity;
    b->count--;
    return true;
}

bool moex_worker_backlog_cancel(moex_worker_backlog *b, uint32_t seq) {
    for (int i = 0; i < b->count; i++) {
        if (at(b, i)->seq == seq) {
            remove_at(b, i);
            return true;
        }
    }
    return false;
}

int moex_worker_backlog_clear(moex_worker_backlog *b) {
    int n = b->count;
    b->count = 0;
    return n;
}
