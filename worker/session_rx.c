/* Messages from the hub (the session's lws thread): fragments reassembled
 * into a bounded buffer (moex_proto_reasm), each message split into its
 * frames (moex_proto_next_frame) and each frame decoded once, in place.
 * DISPATCHes go to the backlog as views into the message, which stays
 * where it was received until its last dispatch is computed or dropped;
 * the compute thread takes a message's dispatches only once every frame of
 * it was read, and answers them in one message. A frame that does not
 * decode is answered with ERROR (its negative status) and the rest of its
 * message is dropped. The hub's ERRORs are acted on as proto's table says
 * (moex_proto_error_info_of). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/download_loader.h"
#include "worker/session_internal.h"

/* ---- frames ---- */

static void on_assign(session *s, const moex_proto_msg *msg) {
    const moex_proto_assign *a = &msg->u.assign.info;
    const moex_hparams *hp = &s->m->hp;
    if (a->model_hash != s->model_hash || a->n_layers != hp->n_layer || a->n_experts != hp->n_expert) {
        char why[400];
        snprintf(why, sizeof why,
                 "model mismatch: the hub serves model %016llx (%u layers x %u experts), this worker has %016llx "
                 "(%d x %d) from %s%s: %s",
                 (unsigned long long)a->model_hash, a->n_layers, a->n_experts, (unsigned long long)s->model_hash,
                 hp->n_layer, hp->n_expert, s->store ? "the hub at " : "",
                 s->store ? moex_worker_store_source(s->store) : s->o->model_path, worker_mismatch_advice(s));
        worker_send_error(s, msg->h.seq, MOEX_ERR_MODEL_MISMATCH, why);
        worker_model_mismatch(s, why);
        return;
    }
    s->accepted = true; /* the hub took this worker: the next reconnect starts from the shortest backoff */
    s->hub_session = a->session; /* a reconnect presents it: same worker, same experts */
    const uint32_t n = msg->u.assign.experts.count;
    moex_log(MOEX_LOG_INFO, "worker: assignment %u from the hub: worker id %u, %u experts, %u replicas", msg->h.seq,
             a->worker_id, n, a->replicas);
    pthread_mutex_lock(&s->mu);
    if (n > s->assign_cap) {
        moex_proto_expert *p = realloc(s->assign_list, n * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&s->mu);
            moex_log(MOEX_LOG_ERROR, "worker: out of memory for an assignment of %u experts", n);
            return;
        }
        s->assign_list = p;
        s->assign_cap = n;
    }
    for (uint32_t i = 0; i < n; i++) s->assign_list[i] = moex_proto_expert_at(&msg->u.assign.experts, i);
    s->assign_n = n;
    s->assign_g = msg->h.seq;
    if (s->loader) dl_loader_post(s); /* downloads first; the loader hands it on */
    else s->assign_pending = true;
    s->state = MOEX_STATE_LOADING;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void on_dispatch(session *s, rx_msg *m, const moex_proto_msg *msg) {
    const long exit_after = s->o->inject_exit_after;
    if (exit_after > 0 && ++s->n_dispatch_rx >= (uint64_t)exit_after) {
        moex_log(MOEX_LOG_WARN, "worker: inject: exiting abruptly on dispatch %ld", exit_after);
        _exit(3);
    }
    const moex_worker_item it = {
        .msg = *msg, .owner = m, .group = m->serial, .rx_s = m->rx_s, .rx_first_s = m->rx_first_s};
    int n_stale = 0;
    pthread_mutex_lock(&s->mu);
    s->stats.dispatches++;
    const int rc = moex_worker_backlog_push(s->backlog, &it, s->stale, &n_stale);
    if (rc == 0) m->refs++;
    for (int i = 0; i < n_stale; i++) worker_rx_release(s, s->stale[i].owner);
    pthread_mutex_unlock(&s->mu);
    char text[96];
    snprintf(text, sizeof text, "preempted by a dispatch for layer %u", msg->h.layer);
    for (int i = 0; i < n_stale; i++) worker_send_error(s, s->stale[i].msg.h.seq, MOEX_ERR_PREEMPTED, text);
    if (rc) worker_send_error(s, msg->h.seq, MOEX_ERR_BUSY, "busy: backlog full");
}

static void on_cancel(session *s, uint32_t seq) {
    moex_worker_item removed;
    pthread_mutex_lock(&s->mu);
    s->stats.cancels++;
    if (moex_worker_backlog_cancel(s->backlog, seq, &removed)) {
        s->stats.cancelled++;
        worker_rx_release(s, removed.owner);
    } else if (s->running) { /* counted when its result is discarded */
        for (int i = 0; i < s->batch_n; i++)
            if (s->batch_seqs[i] == seq) s->batch_cancelled[i] = true;
        pthread_cond_broadcast(&s->cv); /* an injected delay ends once its whole batch is cancelled */
    }
    pthread_mutex_unlock(&s->mu);
}

/* An ERROR from the hub whose code says retrying cannot help. */
static void hub_says_stop(session *s, int32_t code, const char *name, const char *text) {
    char why[sizeof s->fatal_err.msg];
    switch (code) {
    case MOEX_ERR_MODEL_MISMATCH:
        snprintf(why, sizeof why, "the hub %s serves another model than this worker's %016llx from %s (the hub says: "
                 "%s): %s", s->o->hub_url, (unsigned long long)s->model_hash,
                 s->store ? moex_worker_store_source(s->store) : s->o->model_path, text, worker_mismatch_advice(s));
        worker_model_mismatch(s, why);
        return;
    case MOEX_ERR_VERSION:
        snprintf(why, sizeof why,
                 "the hub %s speaks no protocol version this worker speaks (%d) (the hub says: %s); run a moex-worker "
                 "of the hub's release", s->o->hub_url, MOEX_PROTO_VERSION, text);
        break;
    case MOEX_ERR_UNAUTHORIZED:
        snprintf(why, sizeof why, "the hub %s refused this worker (%s): check --token, the hub's --token", s->o->hub_url,
                 text);
        break;
    case MOEX_ERR_EVICTED:
        snprintf(why, sizeof why,
                 "the hub %s evicted this worker (the hub says: %s): its results disagreed with the hub's own; check "
                 "this machine (memory errors, overclocking) and its model before starting it again", s->o->hub_url,
                 text);
        break;
    default:
        snprintf(why, sizeof why, "the hub %s stopped this worker: %s (code %d): %s", s->o->hub_url, name, code, text);
        break;
    }
    worker_go_fatal(s, why);
}

static void on_hub_error(session *s, const moex_proto_msg *msg) {
    const int32_t code = msg->u.error.code;
    const moex_proto_error_info *info = moex_proto_error_info_of(code);
    char text[300];
    snprintf(text, sizeof text, "%.*s", (int)msg->u.error.text_len, msg->u.error.text);
    for (char *p = text; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
    if (!info) {
        moex_log(MOEX_LOG_WARN, "worker: the hub sent error code %d, unknown to this worker (seq %u: %s); ignored", code,
                 msg->h.seq, text);
        return;
    }
    switch (info->on_worker) {
    case MOEX_ERR_ACT_EXIT: hub_says_stop(s, code, info->name, text); break;
    case MOEX_ERR_ACT_RECONNECT:
        moex_log(MOEX_LOG_WARN, "worker: the hub closes this connection: %s (code %d, seq %u): %s; reconnecting",
                 info->name, code, msg->h.seq, text);
        s->close_requested = true;
        worker_request_write(s);
        break;
    default:
        moex_log(MOEX_LOG_DEBUG, "worker: the hub reports '%s' (code %d) for seq %u: %s", info->name, code, msg->h.seq,
                 text);
        break;
    }
}

static void on_frame(session *s, rx_msg *m, const moex_proto_msg *msg) {
    switch (msg->h.type) {
    case MOEX_MSG_DISPATCH: on_dispatch(s, m, msg); break;
    case MOEX_MSG_CANCEL: on_cancel(s, msg->h.seq); break;
    case MOEX_MSG_HEARTBEAT: s->peer_ts_us = msg->u.heartbeat.timestamp_us; break;
    case MOEX_MSG_ASSIGN: on_assign(s, msg); break;
    case MOEX_MSG_ERROR: on_hub_error(s, msg); break;
    default: moex_log(MOEX_LOG_WARN, "worker: ignoring a %u frame from the hub", msg->h.type); break;
    }
}

/* ---- messages ---- */

/* A frame that does not decode: ERROR with its status; the rest of the message is dropped. */
static void bad_frame(session *s, const rx_msg *m, size_t off, int rc, const moex_error *err) {
    moex_proto_header h = {0};
    if (m->len - off >= MOEX_PROTO_HEADER_BYTES) moex_proto_header_read(m->bytes + off, &h);
    moex_log(MOEX_LOG_WARN, "worker: bad frame from the hub (seq %u, at byte %zu of a %zu-byte message): %s; the rest "
             "of the message is dropped", h.seq, off, m->len, err->msg);
    worker_send_error(s, h.seq, rc, err->msg);
}

/* Where the valid frames end (*end; a bad frame there, rc < 0, else m->len)
 * and the scratch their compressed payloads need, made room for. */
static int scan_frames(session *s, rx_msg *m, size_t *end, moex_error *err) {
    size_t off = 0, n, need = 0;
    int rc;
    while ((rc = moex_proto_next_frame(m->bytes, m->len, &off, &s->lim, &n, err)) == 1) {
        moex_proto_header h;
        moex_proto_header_read(m->bytes + off, &h);
        const size_t z = moex_proto_scratch_bytes(&h);
        if (z > RX_MESSAGE_MAX - need) {
            moex_fail(err, "the message's compressed frames decompress to more than %zu bytes", RX_MESSAGE_MAX);
            rc = MOEX_PROTO_E_TOO_BIG;
            break;
        }
        need += z;
        off += n;
    }
    *end = off;
    if (need > m->scratch_cap) {
        uint8_t *p = realloc(m->scratch, need);
        if (!p) {
            *end = 0;
            moex_fail(err, "out of memory for %zu bytes of decompressed payloads", need);
            return MOEX_PROTO_E_SCRATCH;
        }
        m->scratch = p;
        m->scratch_cap = need;
    }
    return rc < 0 ? rc : 0;
}

/* Decodes and handles each frame of the message, in order. */
static void read_frames(session *s, rx_msg *m) {
    moex_error scan_err = {{0}}, err = {{0}};
    size_t end;
    const int scan_rc = scan_frames(s, m, &end, &scan_err);
    size_t off = 0, used = 0, n;
    while (off < end && !s->fatal) {
        moex_proto_next_frame(m->bytes, m->len, &off, &s->lim, &n, &err); /* checked by the scan */
        moex_proto_header h;
        moex_proto_header_read(m->bytes + off, &h);
        const size_t z = moex_proto_scratch_bytes(&h);
        moex_proto_msg msg;
        const int rc = moex_proto_decode(m->bytes + off, n, &s->lim, z ? m->scratch + used : NULL, z, &msg, &err);
        if (rc) {
            bad_frame(s, m, off, rc, &err);
            return;
        }
        used += z;
        on_frame(s, m, &msg);
        off += n;
    }
    if (scan_rc && !s->fatal) bad_frame(s, m, end, scan_rc, &scan_err);
}

/* A whole message: its buffer moves into a pooled rx_msg (the reassembly
 * buffer gets that one's), its frames are read, then it is sealed. Returns
 * whether its dispatches were computed here (worker_compute_inline). */
static bool on_message(session *s) {
    pthread_mutex_lock(&s->mu);
    rx_msg *m = worker_rx_take(s);
    s->stats.messages_in++;
    pthread_mutex_unlock(&s->mu);
    if (!m) {
        moex_log(MOEX_LOG_ERROR, "worker: out of memory for a message from the hub; dropped");
        moex_proto_reasm_reset(&s->reasm);
        return false;
    }
    uint8_t *buf = m->bytes;
    const size_t cap = m->cap;
    m->bytes = s->reasm.buf;
    m->cap = s->reasm.cap;
    m->len = s->reasm.len;
    s->reasm.buf = buf;
    s->reasm.cap = cap;
    s->reasm.len = 0;
    m->refs = 1;
    m->sealed = false;
    m->serial = ++s->rx_serial;
    m->rx_s = s->last_rx_s;
    m->rx_first_s = s->msg_first_rx_s;
    read_frames(s, m);
    pthread_mutex_lock(&s->mu);
    m->sealed = true;
    const bool queued = m->refs > 1;
    worker_rx_release(s, m);
    const bool computed = queued && worker_compute_inline(s);
    if (queued && !computed) pthread_cond_broadcast(&s->cv); /* its dispatches may go */
    pthread_mutex_unlock(&s->mu);
    return computed;
}

/* The answers of a message computed on this thread: written at once when
 * the socket takes them (lws's rule: nothing partly sent, room to write),
 * else on the writable callback. */
static int write_answers(session *s, struct lws *wsi) {
    if (lws_send_pipe_choked(wsi)) {
        worker_request_write(s);
        return 0;
    }
    return worker_on_writeable(s, wsi);
}

int worker_on_receive(session *s, struct lws *wsi, const void *in, size_t len) {
    s->last_rx_s = moex_time_s();
    if (s->reasm.len == 0) s->msg_first_rx_s = s->last_rx_s;
    moex_error err;
    if (moex_proto_reasm_add(&s->reasm, in, len, &err)) {
        moex_log(MOEX_LOG_ERROR, "worker: message from the hub refused (%s); closing", err.msg);
        return -1;
    }
    if (!lws_is_final_fragment(wsi) || lws_remaining_packet_payload(wsi) != 0) return 0;
    if (!lws_frame_is_binary(wsi)) {
        moex_log(MOEX_LOG_WARN, "worker: ignoring a text message from the hub");
        moex_proto_reasm_reset(&s->reasm);
        return 0;
    }
    return on_message(s) ? write_answers(s, wsi) : 0;
}

/* tcp://: the bytes are a stream of frames. The hub marks every frame of a
 * message but its last with MOEX_FLAG_MORE, so that a layer's DISPATCHes
 * are computed together however the reads cut them; what has arrived of the
 * next message waits for the rest. */
int worker_on_receive_stream(session *s, struct lws *wsi, const void *in, size_t len) {
    s->last_rx_s = moex_time_s();
    if (s->reasm.len == 0) s->msg_first_rx_s = s->last_rx_s;
    moex_error err = {{0}};
    if (moex_proto_reasm_add(&s->reasm, in, len, &err)) {
        moex_log(MOEX_LOG_ERROR, "worker: bytes from the hub refused (%s); closing", err.msg);
        return -1;
    }
    size_t whole_frames = 0, whole = 0;   /* whole: the bytes of whole messages (their last frame without MORE) */
    if (moex_proto_stream_frames(s->reasm.buf, s->reasm.len, &s->lim, &whole_frames, &whole, &err)) {
        moex_log(MOEX_LOG_ERROR, "worker: a bad frame from the hub (%s); closing", err.msg);
        return -1;
    }
    if (!whole) return 0;
    const size_t tail = s->reasm.len - whole;
    if (tail > s->tail_cap) {
        uint8_t *p = realloc(s->tail, tail);
        if (!p) {
            moex_log(MOEX_LOG_ERROR, "worker: out of memory for %zu bytes from the hub; closing", tail);
            return -1;
        }
        s->tail = p;
        s->tail_cap = tail;
    }
    if (tail) memcpy(s->tail, s->reasm.buf + whole, tail);
    s->reasm.len = whole;
    const bool computed = on_message(s); /* takes the reassembly buffer, leaves an empty one */
    if (tail) {
        s->msg_first_rx_s = s->last_rx_s;
        if (moex_proto_reasm_add(&s->reasm, s->tail, tail, &err)) return -1;
    }
    return computed ? write_answers(s, wsi) : 0;
}
