/* What both sides of the session's lws thread use (session.c, which runs
 * the connection, and session_rx.c, which reads the hub's messages): queuing
 * a control frame or an ERROR for the hub, writing the outbox, and ending
 * the session (fatal errors, a hub serving another model). */
#include <string.h>

#include "worker/session_internal.h"

void worker_request_write(session *s) {
    if (s->wsi && s->link == LINK_UP) lws_callback_on_writable(s->wsi);
}

int worker_on_writeable(session *s, struct lws *wsi) {
    if (s->close_requested) {
        if (!s->hub.tcp) lws_close_reason(wsi, LWS_CLOSE_STATUS_GOINGAWAY, NULL, 0);
        return -1;
    }
    if (s->hub.tcp && lws_send_pipe_choked(wsi)) {
        /* a raw socket is called writeable while libwebsockets still holds
         * the rest of an earlier write (it sends tx_packet_size at a time):
         * that goes first */
        if (lws_write(wsi, NULL, 0, LWS_WRITE_RAW) < 0) return -1;
        lws_callback_on_writable(wsi);
        return 0;
    }
    pthread_mutex_lock(&s->mu);
    const moex_worker_buf *b;
    while ((b = moex_worker_outbox_peek(s->outbox)) && b->conn != s->conn) moex_worker_outbox_pop(s->outbox);
    const bool have = moex_worker_outbox_take(s->outbox, &s->tx);
    const int left = moex_worker_outbox_count(s->outbox);
    pthread_mutex_unlock(&s->mu);
    if (have) {
        const int n = lws_write(wsi, s->tx.buf + LWS_PRE, s->tx.len, s->hub.tcp ? LWS_WRITE_RAW : LWS_WRITE_BINARY);
        const double now = moex_time_s();
        pthread_mutex_lock(&s->mu);
        s->stats.messages_out++;
        if (s->tx.ready_s > 0) moex_worker_timing_record(&s->stats, MOEX_WT_OUTBOX, s->tx.large, now - s->tx.ready_s);
        pthread_mutex_unlock(&s->mu);
        if (n < (int)s->tx.len) {
            moex_log(MOEX_LOG_WARN, "worker: write to the hub failed");
            return -1;
        }
    }
    if (left) {
        lws_callback_on_writable(wsi);
    } else if (s->fatal) { /* the fatal ERROR has left */
        if (!s->hub.tcp) lws_close_reason(wsi, LWS_CLOSE_STATUS_GOINGAWAY, NULL, 0);
        return -1;
    }
    return 0;
}

/* Queues a control frame from s->ctl for the current connection. */
void worker_send_ctl(session *s, size_t len) {
    pthread_mutex_lock(&s->mu);
    int rc = moex_worker_outbox_push_copy(s->outbox, s->conn, s->ctl, len);
    pthread_mutex_unlock(&s->mu);
    if (rc) moex_log(MOEX_LOG_ERROR, "worker: out of memory queueing a frame");
    worker_request_write(s);
}

void worker_send_error(session *s, uint32_t seq, int32_t code, const char *text) {
    size_t n = strlen(text), len;
    if (n > sizeof s->ctl - MOEX_PROTO_HEADER_BYTES - MOEX_PROTO_ERROR_FIXED_BYTES)
        n = sizeof s->ctl - MOEX_PROTO_HEADER_BYTES - MOEX_PROTO_ERROR_FIXED_BYTES;
    if (moex_proto_encode_error(seq, code, text, (uint16_t)n, s->ctl, sizeof s->ctl, &len, NULL)) return;
    pthread_mutex_lock(&s->mu);
    s->stats.errors++;
    pthread_mutex_unlock(&s->mu);
    worker_send_ctl(s, len);
}

void worker_go_fatal(session *s, const char *why) {
    moex_fail(&s->fatal_err, "%s", why);
    s->fatal = true;
    s->fatal_since_s = moex_time_s();
    worker_request_write(s);
    if (s->link != LINK_UP) s->done = true;
}

const char *worker_mismatch_advice(const session *s) {
    return s->store ? "reading the hub's model again"
                    : "start the worker with the hub's GGUF (--model), or without --model to download the hub's experts";
}

void worker_model_mismatch(session *s, const char *why) {
    if (s->store) { /* download mode: learn the hub's model again and rejoin */
        moex_log(MOEX_LOG_WARN, "worker: %s", why);
        s->model_changed = true;
    }
    worker_go_fatal(s, why);
}

