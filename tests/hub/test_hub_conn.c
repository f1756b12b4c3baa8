/* hub/conn.c: the per-connection bound on queued bytes (a peer that reads
 * nothing is closed instead of growing the hub), close-after-flush keeping
 * what is queued, kill dropping it, sends to a closed connection refused.
 * On detached connections (no socket), whose queue the test drains itself.
 * A TCP-transport connection on a real socket pair: the sender writes what
 * the socket takes, the writeable callbacks the rest, every byte in order;
 * a failed socket closes the connection.
 * And hub/inbox.c's bound: an event past it is dropped, its data freed. */
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hub/conn.h"
#include "hub/inbox.h"
#include "tests/test_util.h"

static size_t drain(hub_conn *c, size_t *n_msgs) {
    size_t total = 0, len;
    uint8_t *buf;
    *n_msgs = 0;
    while ((buf = hub_conn_pop(c, &len))) {
        total += len;
        (*n_msgs)++;
        free(buf);
    }
    return total;
}

static void test_queue_bound(void) {
    hub_net *net = hub_net_create();
    hub_conn *c = hub_conn_create_detached(net, 1000, "bounded");
    uint8_t msg[600];
    memset(msg, 7, sizeof msg);
    CHECK(hub_conn_send(c, msg, 600), "the first 600 bytes fit in 1000");
    CHECK(hub_conn_queued_bytes(c) == 600, "600 queued, got %zu", hub_conn_queued_bytes(c));
    CHECK(hub_conn_send(c, msg, 400), "exactly the bound fits");
    CHECK(!hub_conn_send(c, msg, 1), "one byte over the bound is refused");
    CHECK(!hub_conn_open(c), "a connection over its bound is closed");
    CHECK(hub_conn_queued_bytes(c) == 0, "and its queue dropped (%zu left)", hub_conn_queued_bytes(c));
    CHECK(!hub_conn_send(c, msg, 1), "nothing is queued on a closed connection");
    size_t n;
    CHECK(drain(c, &n) == 0 && n == 0, "nothing left to send");
    hub_conn_unref(c);
    hub_net_free(net);
}

static void test_flush_then_close(void) {
    hub_net *net = hub_net_create();
    hub_conn *c = hub_conn_create_detached(net, 1 << 20, "rejected");
    const uint8_t error_frame[40] = {'M', 'o', 'E', 'x'};
    CHECK(hub_conn_send(c, error_frame, sizeof error_frame), "queued");
    hub_conn_close_after_flush(c, "refused");
    CHECK(!hub_conn_open(c), "closing: not open");
    CHECK(!hub_conn_send(c, error_frame, sizeof error_frame), "no more sends once closing");
    size_t n, bytes = drain(c, &n);
    CHECK(n == 1 && bytes == sizeof error_frame, "the rejection queued before the close is still sent (%zu msgs)", n);
    hub_conn_unref(c);

    c = hub_conn_create_detached(net, 1 << 20, "killed");
    CHECK(hub_conn_send(c, error_frame, sizeof error_frame), "queued");
    hub_conn_kill(c, "silent");
    CHECK(!hub_conn_open(c) && hub_conn_queued_bytes(c) == 0, "a kill drops what is queued");
    hub_conn_unref(c);
    hub_net_free(net);
}

/* References: the network thread's, a sender's; the last one frees it (ASan checks). */
static void test_references(void) {
    hub_net *net = hub_net_create();
    hub_conn *c = hub_conn_create_detached(net, 1 << 20, "shared");
    hub_conn_ref(c);
    uint8_t m[8] = {0};
    CHECK(hub_conn_send(c, m, sizeof m), "queued");
    hub_conn_closed(c); /* the socket goes, and what was queued with it */
    CHECK(!hub_conn_open(c) && hub_conn_queued_bytes(c) == 0, "closed, queue dropped");
    CHECK(!hub_conn_send(c, m, sizeof m), "later sends are dropped");
    hub_conn_unref(c);
    CHECK(strcmp(hub_conn_peer(c), "shared") == 0, "alive while referenced");
    hub_conn_unref(c);
    hub_net_free(net);
}

typedef struct reader {
    int fd;
    uint8_t *buf;
    size_t want, got;
} reader;

static void *read_all(void *arg) {
    reader *r = arg;
    while (r->got < r->want) {
        usleep(200); /* a slow peer: the sender's socket fills */
        const ssize_t n = read(r->fd, r->buf + r->got, r->want - r->got < 4096 ? r->want - r->got : 4096);
        if (n <= 0) break;
        r->got += (size_t)n;
    }
    return NULL;
}

static void test_raw_socket(void) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
        CHECK(0, "socketpair failed");
        return;
    }
    const int small = 4096;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    hub_net *net = hub_net_create();
    static char not_a_wsi; /* stands for the socket's handle: no libwebsockets call takes it here */
    hub_conn *c = hub_conn_create(net, (struct lws *)&not_a_wsi, 8 << 20, "tcp");
    hub_conn_set_raw(c, sv[0]);
    const size_t lens[3] = {300000, 10, 700001};
    size_t total = 0;
    for (int i = 0; i < 3; i++) total += lens[i];
    uint8_t *sent = malloc(total), *got = malloc(total);
    if (!sent || !got) abort();
    for (size_t i = 0; i < total; i++) sent[i] = (uint8_t)(i * 131 + i / 977);
    reader r = {.fd = sv[1], .buf = got, .want = total};
    pthread_t th;
    if (pthread_create(&th, NULL, read_all, &r)) abort();
    size_t off = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(hub_conn_send(c, sent + off, lens[i]), "TCP message %d queued", i);
        off += lens[i];
    }
    CHECK(hub_conn_queued_bytes(c) > 0, "a slow peer's socket cannot take a megabyte at once");
    int rc, calls = 0;
    while ((rc = hub_conn_on_writeable(c)) == 1) { /* the network thread's part, as the socket drains */
        calls++;
        usleep(100);
    }
    CHECK(rc == 0 && hub_conn_queued_bytes(c) == 0, "the writeable callbacks wrote the rest (rc %d, %zu queued)", rc,
          hub_conn_queued_bytes(c));
    CHECK(calls > 0, "some of it waited for a writeable callback");
    pthread_join(th, NULL);
    CHECK(r.got == total && !memcmp(got, sent, total), "the peer read %zu of %zu bytes, in order: %s", r.got, total,
          r.got == total && !memcmp(got, sent, total) ? "yes" : "no");
    close(sv[1]); /* the peer goes: the next write fails and closes the connection */
    CHECK(!hub_conn_send(c, sent, 1000), "a send to a peer that has gone fails");
    CHECK(!hub_conn_open(c) && hub_conn_queued_bytes(c) == 0, "and closes the connection, dropping its queue");
    hub_conn_closed(c);
    hub_conn_unref(c);
    hub_net_free(net);
    close(sv[0]);
    free(sent);
    free(got);
}

static int push_message(hub_inbox *b, uint32_t worker, size_t len) {
    hub_event ev = {.kind = HUB_EV_MESSAGE, .worker = worker, .data = malloc(len), .len = len};
    return hub_inbox_push(b, &ev); /* refused: its data is freed (ASan would see a leak) */
}

static void test_inbox_bound(void) {
    hub_inbox *b = hub_inbox_create(4, 1000);
    int accepted = 0;
    for (int i = 0; i < 6; i++) accepted += push_message(b, (uint32_t)i, 16) == 0;
    CHECK(accepted == 4, "an inbox of 4 messages takes 4, took %d", accepted);
    int departures = 0; /* departures are not refused for want of room for messages */
    for (int i = 0; i < 1000; i++) departures += hub_inbox_push(b, &(hub_event){.kind = HUB_EV_WORKER_GONE}) == 0;
    CHECK(departures == 1000, "1000 departures behind a full set of messages, %d taken", departures);
    hub_event ev;
    CHECK(hub_inbox_pop(b, &ev, 0) == 1 && ev.worker == 0, "oldest first");
    free(ev.data);
    CHECK(push_message(b, 7, 16) == 0, "room for a message again after a pop");
    hub_inbox_clear(b);

    /* the byte bound: 1000 bytes */
    CHECK(push_message(b, 1, 600) == 0 && push_message(b, 2, 400) == 0, "1000 bytes fit");
    CHECK(push_message(b, 3, 1) != 0, "one byte more does not");
    CHECK(hub_inbox_pop(b, &ev, 0) == 1 && ev.worker == 1, "oldest first");
    free(ev.data);
    CHECK(push_message(b, 4, 600) == 0, "the popped message's bytes are free again");
    CHECK(push_message(b, 5, 1001) != 0, "a message larger than the bound never fits");
    hub_inbox_free(b); /* frees what is still queued */
}

int main(void) {
    test_queue_bound();
    test_inbox_bound();
    test_flush_then_close();
    test_references();
    test_raw_socket();
    if (g_failures) fprintf(stderr, "%d failures\n", g_failures);
    else printf("test_hub_conn: all passed\n");
    return g_failures ? 1 : 0;
}
