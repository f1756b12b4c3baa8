/* The outbox: a FIFO of messages for the socket thread. It grows when full
 * (results are bounded by the backlog, control frames are few) and keeps
 * every slot's buffer, so a warm outbox never allocates. */
#include <stdlib.h>
#include <string.h>

#include "worker/worker.h"

struct moex_worker_outbox {
    size_t headroom;
    int capacity, head, count;
    moex_worker_buf *slots;
};

moex_worker_outbox *moex_worker_outbox_create(size_t headroom) {
    moex_worker_outbox *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->headroom = headroom;
    return o;
}

void moex_worker_outbox_free(moex_worker_outbox *o) {
    if (!o) return;
    for (int i = 0; i < o->capacity; i++) free(o->slots[i].buf);
    free(o->slots);
    free(o);
}

size_t moex_worker_outbox_headroom(const moex_worker_outbox *o) { return o->headroom; }
int moex_worker_outbox_count(const moex_worker_outbox *o) { return o->count; }

int moex_worker_buf_reserve(moex_worker_buf *b, size_t headroom, size_t len) {
    if (b->cap >= headroom + len) return 0;
    uint8_t *p = realloc(b->buf, headroom + len);
    if (!p) return -1;
    b->buf = p;
    b->cap = headroom + len;
    return 0;
}

/* Doubles the ring, unrolling it so that the items start at slot 0. */
static int grow(moex_worker_outbox *o) {
    int cap = o->capacity ? 2 * o->capacity : 16;
    moex_worker_buf *s = calloc((size_t)cap, sizeof *s);
    if (!s) return -1;
    for (int i = 0; i < o->capacity; i++) s[i] = o->slots[(o->head + i) % o->capacity];
    free(o->slots);
    o->slots = s;
    o->head = 0;
    o->capacity = cap;
    return 0;
}

/* The free slot at the tail, growing the ring when needed. */
static moex_worker_buf *tail_slot(moex_worker_outbox *o) {
    if (o->count == o->capacity && grow(o)) return NULL;
    return &o->slots[(o->head + o->count) % o->capacity];
}

int moex_worker_outbox_push_copy(moex_worker_outbox *o, uint32_t conn, const uint8_t *frame, size_t len) {
    moex_worker_buf *s = tail_slot(o);
    if (!s || moex_worker_buf_reserve(s, o->headroom, len)) return -1;
    memcpy(s->buf + o->headroom, frame, len);
    s->len = len;
    s->conn = conn;
    s->ready_s = 0;
    o->count++;
    return 0;
}

int moex_worker_outbox_push_swap(moex_worker_outbox *o, moex_worker_buf *b) {
    moex_worker_buf *s = tail_slot(o);
    if (!s) return -1;
    moex_worker_buf t = *s;
    *s = *b;
    *b = t;
    b->len = 0;
    o->count++;
    return 0;
}

const moex_worker_buf *moex_worker_outbox_peek(const moex_worker_outbox *o) {
    return o->count ? &o->slots[o->head] : NULL;
}

void moex_worker_outbox_pop(moex_worker_outbox *o) {
    if (!o->count) return;
    o->head = (o->head + 1) % o->capacity;
    o->count--;
}

bool moex_worker_outbox_take(moex_worker_outbox *o, moex_worker_buf *into) {
    if (!o->count) return false;
    moex_worker_buf *s = &o->slots[o->head], t = *s;
    *s = *into;
    s->len = 0;
    *into = t;
    moex_worker_outbox_pop(o);
    return true;
}

void moex_worker_outbox_clear(moex_worker_outbox *o) { o->count = 0; }
