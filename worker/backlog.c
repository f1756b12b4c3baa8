/* The backlog: a bounded FIFO of decoded DISPATCHes (rule in worker.h).
 * Items are small views copied by value: nothing is allocated after create. */
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
    free(b->slots);
    free(b);
}

int moex_worker_backlog_depth(const moex_worker_backlog *b) { return b->count; }

static moex_worker_item *at(const moex_worker_backlog *b, int i) {
    return &b->slots[(b->head + i) % b->capacity];
}

/* Removes the item at queue position i into *out, keeping the others in order. */
static void remove_at(moex_worker_backlog *b, int i, moex_worker_item *out) {
    *out = *at(b, i);
    for (int j = i; j + 1 < b->count; j++) *at(b, j) = *at(b, j + 1);
    b->count--;
}

int moex_worker_backlog_push(moex_worker_backlog *b, const moex_worker_item *it, moex_worker_item *stale, int *n_stale) {
    *n_stale = 0;
    for (int i = 0; i < b->count;) {
        if (at(b, i)->msg.h.layer != it->msg.h.layer) remove_at(b, i, &stale[(*n_stale)++]);
        else i++;
    }
    if (b->count == b->capacity) return 1;
    *at(b, b->count) = *it;
    b->count++;
    return 0;
}

const moex_worker_item *moex_worker_backlog_at(const moex_worker_backlog *b, int i) {
    return i >= 0 && i < b->count ? at(b, i) : NULL;
}

bool moex_worker_backlog_pop(moex_worker_backlog *b, moex_worker_item *into) {
    if (b->count == 0) return false;
    *into = *at(b, 0);
    b->head = (b->head + 1) % b->capacity;
    b->count--;
    return true;
}

bool moex_worker_backlog_cancel(moex_worker_backlog *b, uint32_t seq, moex_worker_item *removed) {
    for (int i = 0; i < b->count; i++) {
        if (at(b, i)->msg.h.seq == seq) {
            remove_at(b, i, removed);
            return true;
        }
    }
    return false;
}
