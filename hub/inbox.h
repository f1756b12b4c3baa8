/* Private to the hub: what the network thread and the registry hand to the
 * remote executor. Messages holding RESULT or ERROR frames arrive whole
 * (the buffer changes owner, no copy); a worker that leaves is an event too,
 * so the executor never polls for it. One consumer (the executor thread). */
#ifndef MOEX_HUB_INBOX_H
#define MOEX_HUB_INBOX_H

#include <stddef.h>
#include <stdint.h>

typedef enum hub_event_kind {
    HUB_EV_MESSAGE,      /* frames from a worker */
    HUB_EV_WORKER_GONE,  /* a worker left, was evicted or removed: its outstanding requests are lost */
    HUB_EV_WAKE,         /* nothing: re-check (the hub is stopping, placement changed) */
} hub_event_kind;

typedef struct hub_event {
    hub_event_kind kind;
    uint32_t worker;     /* the worker's id */
    uint8_t *data;       /* MESSAGE: owned by the receiver of the event, free() it */
    size_t len;
    double t_rx;         /* when the network thread had the whole message */
} hub_event;

typedef struct hub_inbox hub_inbox;

/* Holds at most max_messages messages and max_bytes of their data (a peer
 * that floods RESULTs while no layer runs cannot grow the hub); departures
 * and wakes have room of their own, so a flood never hides a departure. */
hub_inbox *hub_inbox_create(size_t max_messages, size_t max_bytes);
void hub_inbox_free(hub_inbox *b);
/* Any thread. A message over the bounds is dropped (a RESULT is then
 * re-dispatched at its deadline): returns -1 and frees data. */
int hub_inbox_push(hub_inbox *b, const hub_event *ev);
/* The executor: the oldest event, waiting until deadline (a moex_time_s
 * time; INFINITY waits for ever). 1 with an event, 0 at the deadline. */
int hub_inbox_pop(hub_inbox *b, hub_event *ev, double deadline);
/* Drops every queued event (frees their data). */
void hub_inbox_clear(hub_inbox *b);
/* The frame-sequence fuzzer's seam (hub/fuzz_hub.c), which plays the
 * network on the executor's own thread: hub_inbox_pop calls fn (outside the
 * lock) each time it finds the inbox empty, before it waits. */
void hub_inbox_set_wait_hook(hub_inbox *b, void (*fn)(void *ctx, double deadline), void *ctx);

#endif
