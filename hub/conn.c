/* Connections' send queues and close requests (see conn.h). Lock order: a
 * connection's mutex, then the net's; never the other way round. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/common.h"
#include "hub/conn.h"

/* A peer that takes longer than this to read a rejection is dropped. */
#define CLOSE_FLUSH_S 3

typedef struct tx_msg {
    struct tx_msg *next;
    uint8_t *buf;   /* LWS_PRE headroom, then len bytes */
    size_t len;
} tx_msg;

struct hub_conn {
    hub_net *net;
    atomic_int refs;
    char peer[64];
    pthread_mutex_t mu;
    /* under mu */
    struct lws *wsi;         /* NULL once the socket is gone */
    bool detached;           /* no socket ever (tests): open until closed, drained by hub_conn_pop */
    tx_msg *head, *tail;
    size_t queued, max_queued;
    bool pending;            /* in the net's pending list */
    bool flush_close, kill, close_started;
    bool raw;                /* TCP transport: no WebSocket framing; written by raw_write */
    int fd;                  /* raw: the socket (-1 once gone) */
    size_t head_off;         /* raw: bytes of the head message already written */
    char why[96];
};

struct hub_net {
    pthread_mutex_t mu;
    struct lws_context *ctx;
    hub_conn **pending;      /* connections with output or a close to act on (each holds a reference) */
    int n_pending, cap_pending;
};

hub_net *hub_net_create(void) {
    hub_net *n = calloc(1, sizeof *n);
    if (n) pthread_mutex_init(&n->mu, NULL);
    return n;
}

void hub_net_set_context(hub_net *n, struct lws_context *ctx) {
    pthread_mutex_lock(&n->mu);
    n->ctx = ctx;
    pthread_mutex_unlock(&n->mu);
}

void hub_net_free(hub_net *n) {
    if (!n) return;
    for (int i = 0; i < n->n_pending; i++) hub_conn_unref(n->pending[i]);
    free(n->pending);
    pthread_mutex_destroy(&n->mu);
    free(n);
}

void hub_net_wake(hub_net *n) {
    pthread_mutex_lock(&n->mu);
    if (n->ctx && n->n_pending) lws_cancel_service(n->ctx);
    pthread_mutex_unlock(&n->mu);
}

/* Puts c on the pending list (under c->mu). */
static void mark_pending(hub_conn *c) {
    if (c->pending || !c->wsi) return;
    hub_net *n = c->net;
    pthread_mutex_lock(&n->mu);
    if (n->n_pending == n->cap_pending) {
        int cap = n->cap_pending ? 2 * n->cap_pending : 16;
        hub_conn **grown = realloc(n->pending, (size_t)cap * sizeof *grown);
        if (!grown) { /* the write is still queued: the next successful mark or the close flushes it */
            pthread_mutex_unlock(&n->mu);
            return;
        }
        n->pending = grown;
        n->cap_pending = cap;
    }
    atomic_fetch_add(&c->refs, 1);
    n->pending[n->n_pending++] = c;
    c->pending = true;
    pthread_mutex_unlock(&n->mu);
}

static bool is_open(const hub_conn *c) { return (c->wsi || c->detached) && !c->flush_close && !c->kill; }

hub_conn *hub_conn_create(hub_net *n, struct lws *wsi, size_t max_queued_bytes, const char *peer) {
    hub_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->net = n;
    atomic_init(&c->refs, 1);
    c->wsi = wsi;
    c->fd = -1;
    c->max_queued = max_queued_bytes;
    snprintf(c->peer, sizeof c->peer, "%s", peer ? peer : "?");
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

hub_conn *hub_conn_create_detached(hub_net *n, size_t max_queued_bytes, const char *peer) {
    hub_conn *c = hub_conn_create(n, NULL, max_queued_bytes, peer);
    if (c) c->detached = true;
    return c;
}

uint8_t *hub_conn_pop(hub_conn *c, size_t *len) {
    pthread_mutex_lock(&c->mu);
    tx_msg *m = c->head;
    if (m) {
        c->head = m->next;
        if (!c->head) c->tail = NULL;
        c->queued -= m->len;
    }
    pthread_mutex_unlock(&c->mu);
    if (!m) return NULL;
    uint8_t *buf = m->buf;
    *len = m->len;
    free(m);
    return buf;
}

void hub_conn_ref(hub_conn *c) { atomic_fetch_add(&c->refs, 1); }

static void drop_queue(hub_conn *c) {
    for (tx_msg *m = c->head, *next; m; m = next) {
        next = m->next;
        free(m->buf);
        free(m);
    }
    c->head = c->tail = NULL;
    c->queued = 0;
    c->head_off = 0;
}

/* Raw connections (under c->mu): writes queued messages until the socket
 * would block, keeping a partly written head for the next call (the network
 * thread's, once the socket is writable). libwebsockets never holds a raw
 * connection's bytes, so whichever thread writes, they leave in order. -1 on
 * a socket error. */
static int raw_write(hub_conn *c) {
    while (c->head && c->fd >= 0) {
        tx_msg *m = c->head;
        const ssize_t w = send(c->fd, m->buf + LWS_PRE + c->head_off, m->len - c->head_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        c->head_off += (size_t)w;
        if (c->head_off < m->len) return 0;
        c->head = m->next;
        if (!c->head) c->tail = NULL;
        c->queued -= m->len;
        c->head_off = 0;
        free(m->buf);
        free(m);
    }
    return 0;
}

void hub_conn_unref(hub_conn *c) {
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1) return;
    drop_queue(c);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

const char *hub_conn_peer(const hub_conn *c) { return c->peer; }

uint8_t *hub_conn_buffer(size_t len) { return malloc(LWS_PRE + len); }

bool hub_conn_send_owned(hub_conn *c, uint8_t *buf, size_t len) {
    tx_msg *m = malloc(sizeof *m);
    pthread_mutex_lock(&c->mu);
    if (!is_open(c) || !m) {
        pthread_mutex_unlock(&c->mu);
        free(m);
        free(buf);
        return false;
    }
    if (c->queued + len > c->max_queued) {
        moex_log(MOEX_LOG_WARN, "connection %s: %zu bytes queued and it reads nothing: closing", c->peer, c->queued);
        snprintf(c->why, sizeof c->why, "send queue over %zu bytes", c->max_queued);
        c->kill = true;
        drop_queue(c);
        mark_pending(c);
        pthread_mutex_unlock(&c->mu);
        free(m);
        free(buf);
        return false;
    }
    *m = (tx_msg){.buf = buf, .len = len};
    if (c->tail) c->tail->next = m;
    else c->head = m;
    c->tail = m;
    c->queued += len;
    if (c->raw && c->wsi && raw_write(c)) {   /* what the socket takes now leaves from this thread */
        snprintf(c->why, sizeof c->why, "write failed: %s", strerror(errno));
        c->kill = true;
        drop_queue(c);
    }
    if (c->head || c->kill) mark_pending(c);   /* the rest when writable; a failed socket closes */
    const bool sent = !c->kill;
    pthread_mutex_unlock(&c->mu);
    return sent;
}

bool hub_conn_send(hub_conn *c, const uint8_t *msg, size_t len) {
    uint8_t *buf = hub_conn_buffer(len);
    if (!buf) return false;
    memcpy(buf + LWS_PRE, msg, len);
    return hub_conn_send_owned(c, buf, len);
}

void hub_conn_close_after_flush(hub_conn *c, const char *why) {
    pthread_mutex_lock(&c->mu);
    if (!c->flush_close && !c->kill) {
        c->flush_close = true;
        snprintf(c->why, sizeof c->why, "%s", why);
        mark_pending(c);
    }
    pthread_mutex_unlock(&c->mu);
}

void hub_conn_kill(hub_conn *c, const char *why) {
    pthread_mutex_lock(&c->mu);
    if (!c->kill) {
        c->kill = true;
        snprintf(c->why, sizeof c->why, "%s", why);
        drop_queue(c);
        mark_pending(c);
    }
    pthread_mutex_unlock(&c->mu);
}

bool hub_conn_open(hub_conn *c) {
    pthread_mutex_lock(&c->mu);
    const bool open = is_open(c);
    pthread_mutex_unlock(&c->mu);
    return open;
}

size_t hub_conn_queued_bytes(hub_conn *c) {
    pthread_mutex_lock(&c->mu);
    const size_t n = c->queued;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* ---- network thread ---- */

static void act_on(hub_conn *c) {
    pthread_mutex_lock(&c->mu);
    c->pending = false;
    struct lws *wsi = c->wsi;
    if (wsi && c->kill && !c->close_started) {
        c->close_started = true;
        /* closes on the next service pass even when the peer's window is full */
        lws_set_timeout(wsi, PENDING_TIMEOUT_KILLED_BY_PARENT, LWS_TO_KILL_ASYNC);
    } else if (wsi && (c->head || c->flush_close)) {
        if (c->flush_close && !c->close_started) {
            c->close_started = true;
            lws_set_timeout(wsi, PENDING_TIMEOUT_CLOSE_SEND, CLOSE_FLUSH_S);
        }
        lws_callback_on_writable(wsi);
    }
    pthread_mutex_unlock(&c->mu);
}

void hub_net_service(hub_net *n) {
    for (;;) {
        pthread_mutex_lock(&n->mu);
        hub_conn *c = n->n_pending ? n->pending[--n->n_pending] : NULL;
        pthread_mutex_unlock(&n->mu);
        if (!c) return;
        act_on(c);
        hub_conn_unref(c);
    }
}

int hub_conn_on_writeable(hub_conn *c) {
    pthread_mutex_lock(&c->mu);
    if (c->kill || !c->wsi) {
        pthread_mutex_unlock(&c->mu);
        return -1;
    }
    if (c->raw) {
        const int rc = raw_write(c);
        const bool more = c->head != NULL, close_now = !more && c->flush_close;
        pthread_mutex_unlock(&c->mu);
        return rc < 0 || close_now ? -1 : more;
    }
    tx_msg *m = c->head;
    if (m) {
        c->head = m->next;
        if (!c->head) c->tail = NULL;
        c->queued -= m->len;
    }
    const bool more = c->head != NULL, close_now = !more && c->flush_close;
    struct lws *wsi = c->wsi;
    pthread_mutex_unlock(&c->mu);
    if (m) {
        const int w = lws_write(wsi, m->buf + LWS_PRE, m->len, LWS_WRITE_BINARY);
        free(m->buf);
        free(m);
        if (w < 0) return -1;
    }
    if (close_now) {
        lws_close_reason(wsi, LWS_CLOSE_STATUS_POLICY_VIOLATION, (unsigned char *)c->why, strlen(c->why));
        return -1;
    }
    return more;
}

void hub_conn_set_raw(hub_conn *c, int fd) {
    c->raw = true;
    c->fd = fd;
}

bool hub_conn_is_raw(const hub_conn *c) { return c->raw; }

void hub_conn_closed(hub_conn *c) {
    pthread_mutex_lock(&c->mu);
    c->wsi = NULL;
    c->fd = -1;   /* libwebsockets closes it after this callback */
    c->detached = false;
    drop_queue(c);
    pthread_mutex_unlock(&c->mu);
}
