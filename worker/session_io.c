/* What both sides of the session's lws thread use (session.c, which runs
 * the connection, and session_rx.c, which reads the hub's messages): queuing
 * a control frame or an ERROR for the hub, asking for a write, and ending
 * the session (fatal errors, a hub serving another model). */
#include <string.h>

#include "worker/session_internal.h"

void worker_request_write(session *s) {
    if (s->wsi && s->link == LINK_UP) lws_callback_on_writable(s->wsi);
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

