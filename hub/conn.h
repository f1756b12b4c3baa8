/* Private to the hub: one peer connection's outgoing side, shared between the
 * network thread, which owns the libwebsockets handle, and any other thread,
 * which queues whole messages and may ask for the connection to close. On a
 * WebSocket only the network thread writes; on a plain TCP stream (the TCP
 * transport) the sending thread writes what the socket takes at once, and the
 * network thread the rest when the socket is writable again, so that a
 * decode layer's messages leave without waking the network thread.
 *
 * Messages are queued whole and bounded in bytes per connection: a peer that
 * stops reading is closed instead of growing the hub. A connection is freed
 * when its last reference goes (the network thread holds one while the
 * socket lives; the registry one while a worker record points at it; a
 * sender one while it uses it). */
#ifndef MOEX_HUB_CONN_H
#define MOEX_HUB_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libwebsockets.h>

typedef struct hub_conn hub_conn;
typedef struct hub_net hub_net;

/* The set of connections with something for the network thread to do, and
 * the libwebsockets context to wake for them. */
hub_net *hub_net_create(void);
void hub_net_set_context(hub_net *n, struct lws_context *ctx);
void hub_net_free(hub_net *n);
/* Wakes the network thread (lws_cancel_service) when a connection waits for
 * it: queued bytes (on TCP: what did not leave at once), a close; any thread,
 * after a batch of sends. */
void hub_net_wake(hub_net *n);

/* Network thread: a new connection (one reference, the network thread's). */
hub_conn *hub_conn_create(hub_net *n, struct lws *wsi, size_t max_queued_bytes, const char *peer);
/* Network thread: the connection is a plain TCP stream (the TCP transport)
 * on socket fd, not a WebSocket: its messages are written as raw bytes, what
 * the socket takes at once by their senders, the rest by the network thread. */
void hub_conn_set_raw(hub_conn *c, int fd);
/* Whether it is (any thread: fixed before the connection is shared). */
bool hub_conn_is_raw(const hub_conn *c);
/* Tests and the frame-sequence fuzzer: a connection without a socket that
 * stays open; what is sent to it waits (bounded like any other) until
 * hub_conn_pop takes it. */
hub_conn *hub_conn_create_detached(hub_net *n, size_t max_queued_bytes, const char *peer);
/* The oldest message queued on a detached connection (*len bytes at the
 * returned pointer + LWS_PRE; free() the returned pointer), or NULL. */
uint8_t *hub_conn_pop(hub_conn *c, size_t *len);
void hub_conn_ref(hub_conn *c);
void hub_conn_unref(hub_conn *c);
const char *hub_conn_peer(const hub_conn *c);

/* Any thread. Queues a copy of one message (one or more frames); false when
 * the connection is closing or gone (on TCP also when its socket failed: it
 * then closes). Over the byte bound the connection is closed at once (the
 * message is dropped: the peer is not reading). Call hub_net_wake after a
 * batch of sends. */
bool hub_conn_send(hub_conn *c, const uint8_t *msg, size_t len);
/* Same, taking ownership of buf (from hub_conn_buffer: LWS_PRE bytes of
 * headroom, then len message bytes). */
bool hub_conn_send_owned(hub_conn *c, uint8_t *buf, size_t len);
/* A buffer for hub_conn_send_owned with room for len message bytes. */
uint8_t *hub_conn_buffer(size_t len);
/* Sends what is queued, then closes with this reason (a rejection must
 * arrive before the close); a peer that reads nothing is dropped after a few
 * seconds anyway. */
void hub_conn_close_after_flush(hub_conn *c, const char *why);
/* Closes now, whatever is queued, even when the peer reads nothing. */
void hub_conn_kill(hub_conn *c, const char *why);
/* Not closing and not gone. */
bool hub_conn_open(hub_conn *c);
size_t hub_conn_queued_bytes(hub_conn *c);

/* Network thread only. */
/* Acts on what other threads asked since the last call (writes, closes). */
void hub_net_service(hub_net *n);
/* LWS_CALLBACK_SERVER_WRITEABLE (RAW_WRITEABLE): writes the next message
 * (on TCP: what the socket takes of the queue). 1: more is queued (ask for
 * another writeable callback), 0: nothing more, -1: close. */
int hub_conn_on_writeable(hub_conn *c);
/* The socket is gone (LWS_CALLBACK_CLOSED): later sends are dropped. */
void hub_conn_closed(hub_conn *c);

#endif
