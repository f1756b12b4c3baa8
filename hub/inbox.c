/* The executor's inbox: a bounded FIFO ring under a mutex, with a condition
 * variable on the monotonic clock. Messages are bounded in number and bytes;
 * data-less events (departures, wakes) use a reserve on top, larger than the
 * registry can produce between two of the executor's waits. */
#include <math.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "common/common.h"
#include "hub/inbox.h"

#define EVENT_RESERVE 1024    /* ring slots for departures and wakes beyond the messages' */

struct hub_inbox {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    hub_event *ring;
    size_t cap, head, n;
    size_t messages, bytes;            /* queued HUB_EV_MESSAGEs and their data */
    size_t max_messages, max_bytes;
    void (*wait_hook)(void *ctx, double deadline);
    void *wait_ctx;
};

hub_inbox *hub_inbox_create(size_t max_messages, size_t max_bytes) {
    hub_inbox *b = calloc(1, sizeof *b);
    const size_t cap = max_messages + EVENT_RESERVE;
    if (!b || !(b->ring = calloc(cap, sizeof *b->ring))) {
        free(b);
        return NULL;
    }
    b->cap = cap;
    b->max_messages = max_messages;
    b->max_bytes = max_bytes;
    pthread_mutex_init(&b->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
    return b;
}

void hub_inbox_clear(hub_inbox *b) {
    pthread_mutex_lock(&b->mu);
    for (size_t i = 0; i < b->n; i++) free(b->ring[(b->head + i) % b->cap].data);
    b->n = b->messages = b->bytes = 0;
    pthread_mutex_unlock(&b->mu);
}

void hub_inbox_free(hub_inbox *b) {
    if (!b) return;
    hub_inbox_clear(b);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b->ring);
    free(b);
}

int hub_inbox_push(hub_inbox *b, const hub_event *ev) {
    pthread_mutex_lock(&b->mu);
    const bool message = ev->kind == HUB_EV_MESSAGE;
    if (b->n == b->cap ||
        (message && (b->messages == b->max_messages || ev->len > b->max_bytes - b->bytes))) {
        pthread_mutex_unlock(&b->mu);
        free(ev->data);
        return -1;
    }
    if (message) {
        b->messages++;
        b->bytes += ev->len;
    }
    b->ring[(b->head + b->n++) % b->cap] = *ev;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return 0;
}

void hub_inbox_set_wait_hook(hub_inbox *b, void (*fn)(void *ctx, double deadline), void *ctx) {
    pthread_mutex_lock(&b->mu);
    b->wait_hook = fn;
    b->wait_ctx = ctx;
    pthread_mutex_unlock(&b->mu);
}

int hub_inbox_pop(hub_inbox *b, hub_event *ev, double deadline) {
    pthread_mutex_lock(&b->mu);
    if (b->n == 0 && b->wait_hook) {
        pthread_mutex_unlock(&b->mu);
        b->wait_hook(b->wait_ctx, deadline);
        pthread_mutex_lock(&b->mu);
    }
    while (b->n == 0) {
        if (isinf(deadline)) {
            pthread_cond_wait(&b->cv, &b->mu);
            continue;
        }
        const double dt = deadline - moex_time_s();
        if (dt <= 0) break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        const double at = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + dt;
        ts.tv_sec = (time_t)at;
        ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    }
    const int got = b->n > 0;
    if (got) {
        *ev = b->ring[b->head];
        b->head = (b->head + 1) % b->cap;
        b->n--;
        if (ev->kind == HUB_EV_MESSAGE) {
            b->messages--;
            b->bytes -= ev->len;
        }
    }
    pthread_mutex_unlock(&b->mu);
    return got;
}
