/* State shared by the session's threads: the libwebsockets thread
 * (session.c, session_rx.c) and the compute thread (compute.c). Fields under
 * "lws thread" are touched by that thread only; fields under "shared" only
 * with mu held.
 *
 * The hot path, DISPATCH to RESULT, has no polling: the lws thread decodes a
 * received message's frames once, in place, and queues its DISPATCHes as
 * views into it. A small message (a decode layer's) it then computes itself
 * when the compute thread is idle, and writes its RESULTs as soon as the
 * socket is writable: no hand-off. Otherwise it signals cv; the compute
 * thread computes them, queues each received message's RESULTs as one
 * message in the outbox and wakes the lws thread with lws_cancel_service(). */
#ifndef MOEX_WORKER_SESSION_INTERNAL_H
#define MOEX_WORKER_SESSION_INTERNAL_H

#include <pthread.h>

#include <libwebsockets.h>

#include "worker/hub_link.h"
#include "worker/worker.h"

typedef enum { LINK_DOWN, LINK_CONNECTING, LINK_UP } link_state;

/* A received WebSocket message (one frame, or several back to back). Its
 * bytes stay where they were reassembled until its last queued DISPATCH is
 * computed or dropped: the backlog's items are views into it. */
typedef struct rx_msg {
    uint8_t *bytes;             /* the message: the reassembly buffer it filled (swapped, not copied) */
    size_t len, cap;
    uint8_t *scratch;           /* the decompressed payloads of its compressed frames */
    size_t scratch_cap;
    int refs;                   /* the lws thread while it reads the message + its queued or running dispatches */
    bool sealed;                /* every frame read: its dispatches may be taken, all together */
    uint64_t serial;
    double rx_s;                /* when its last fragment arrived */
    double rx_first_s;          /* when its first fragment arrived */
    struct rx_msg *next_free;
} rx_msg;

typedef struct session {
    const moex_worker_options *o;
    const moex_model *m;
    volatile sig_atomic_t *stop;
    moex_proto_limits lim;
    uint64_t model_hash;
    uint64_t hub_session;            /* lws thread: the key of the hub's last ASSIGN, presented in JOIN */
    uint64_t budget_given;           /* --memory-budget as given, 0 when left out (o's is then the model's) */
    char name[256];

    /* ---- lws thread ---- */
    struct lws_context *ctx;
    struct lws *wsi;
    lws_sorted_usec_list_t tick;
    link_state link;
    worker_hub_addr hub;             /* --hub, --token */
    char path[2048];                 /* hub.path with ?token=... */
    double backoff_s, next_attempt_s, down_since_s;
    double last_rx_s, next_hb_s, last_hb_s;
    double msg_first_rx_s;           /* when the message being reassembled began */
    uint8_t *tail;                   /* tcp://: an incomplete frame's bytes, kept across a message's hand-off */
    size_t tail_cap;
    bool handshake_sent;             /* this attempt reached the HTTP upgrade */
    bool check_hub;                  /* a refused upgrade or JOIN: ask the hub's HTTP side why (token, model) */
    bool accepted;                   /* this connection got an ASSIGN */
    bool close_requested;
    bool done;                       /* leave the service loop */
    bool fatal;                      /* err holds why; exit once the outbox is flushed */
    bool model_changed;              /* download mode: the hub serves another model; read it again */
    double fatal_since_s;
    moex_error fatal_err;
    uint64_t peer_ts_us;             /* hub's last heartbeat timestamp, echoed */
    uint64_t n_dispatch_rx;          /* for --inject-exit-after */
    uint64_t jitter_rng;
    moex_proto_reasm reasm;          /* the message being received */
    uint64_t rx_serial;
    uint8_t ctl[1024];               /* control frames are encoded here */
    moex_worker_item *stale;         /* backlog capacity items */
    moex_worker_buf tx;              /* the message being written (swapped out of the outbox) */
    struct dl_http *probe;           /* the token probe's HTTP client, made on first use */

    /* ---- shared, under mu ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    moex_worker_backlog *backlog;
    moex_worker_outbox *outbox;
    rx_msg *rx_free;                 /* received messages no longer referenced, buffers kept */
    rx_msg **rx_all;                 /* every one allocated, for the end */
    int rx_n_all, rx_cap_all;
    uint32_t conn;                   /* id of the current connection; bumped on connect and disconnect */
    bool quit;                       /* compute thread: exit */
    bool running;                    /* a batch, batch_seqs[0 .. batch_n), is being computed (either thread) */
    struct compute *compute;         /* the compute thread's context, for worker_compute_inline; NULL once it stops */
    bool compute_parked;             /* the compute thread waits for work (not applying an assignment, not computing) */
    int inline_rows;                 /* worker_compute_inline takes messages of at most this many rows */
    const uint32_t *batch_seqs;
    bool *batch_cancelled;           /* CANCEL marks them here */
    int batch_n;
    bool assign_pending;
    uint32_t assign_g, assign_n, assign_cap;
    moex_proto_expert *assign_list;
    uint32_t g;                      /* assignment generation the worker is ready for */
    uint8_t state;                   /* moex_proto_worker_state */
    bool hb_now;                     /* send a heartbeat at once (READY) */
    double busy_s;                   /* compute time since the last heartbeat */
    moex_worker_stats stats;

    /* ---- download mode (download_loader.c) ---- */
    moex_worker_store *store;        /* NULL: experts come from the worker's own model file */
    struct dl_loader *loader;        /* its thread; fields under mu */
} session;

/* The files below depend on each other in this order only (no cycles):
 * session.c -> session_rx.c -> session_io.c, rx_pool.c; compute.c -> rx_pool.c. */

/* session_io.c: the lws thread's outgoing side and the session's end. */
void worker_request_write(session *s);
/* Writes the oldest message of the current connection (the socket is
 * writable), asking for another callback if more wait. -1: close. */
int worker_on_writeable(session *s, struct lws *wsi);
/* Queues the control frame in s->ctl (len bytes) for the current connection. */
void worker_send_ctl(session *s, size_t len);
void worker_send_error(session *s, uint32_t seq, int32_t code, const char *text);
/* Ends the session once the outbox is flushed: moex_worker_run fails with why. */
void worker_go_fatal(session *s, const char *why);
/* The hub serves another model. Ends the session: a worker with its own
 * model file fails with why, a downloading one rejoins. */
void worker_model_mismatch(session *s, const char *why);
/* What a mismatch makes this worker do, for its message. */
const char *worker_mismatch_advice(const session *s);

/* A message (and the decompressed payloads of its frames) may take this
 * much: a hub sends a worker one layer's dispatches in one message. */
#define RX_MESSAGE_MAX ((size_t)256 << 20)

/* rx_pool.c: received messages' buffers. Called with mu held but init/free. */
void worker_rx_init(session *s);
/* A free message to receive into (its buffer swapped with the reassembly buffer's). */
rx_msg *worker_rx_take(session *s);
/* Drops a reference to a received message. */
void worker_rx_release(session *s, rx_msg *m);
/* Drops every queued dispatch (the connection that sent them is gone). */
void worker_backlog_drop_all(session *s);
void worker_rx_free_all(session *s);

/* session_rx.c: messages from the hub (lws thread). A fragment of a
 * message; -1: close the connection. */
int worker_on_receive(session *s, struct lws *wsi, const void *in, size_t len);
/* The same for tcp://'s stream of frames (no message boundaries). */
int worker_on_receive_stream(session *s, struct lws *wsi, const void *in, size_t len);

/* compute.c: the compute thread. */
int moex_worker_compute_start(session *s, pthread_t *th, moex_error *err);
/* Called by the lws thread with mu held, once a message is sealed: if the
 * compute thread is parked and the queued work is small (a decode layer's
 * message), computes it on the calling thread and queues its answers in the
 * outbox (mu is released meanwhile). Returns whether it did; the caller then
 * writes them (or asks for a write) instead of waking the compute thread. */
bool worker_compute_inline(session *s);
void moex_worker_compute_stop(session *s, pthread_t th);

#endif
