/* State shared by the session's two threads: the libwebsockets thread
 * (session.c) and the compute thread (compute.c). Fields under "lws thread"
 * are touched by that thread only; fields under "shared" only with mu held. */
#ifndef MOEX_WORKER_SESSION_INTERNAL_H
#define MOEX_WORKER_SESSION_INTERNAL_H

#include <pthread.h>

#include <libwebsockets.h>

#include "worker/hub_link.h"
#include "worker/worker.h"

typedef enum { LINK_DOWN, LINK_CONNECTING, LINK_UP } link_state;

typedef struct session {
    const moex_worker_options *o;
    const moex_model *m;
    volatile sig_atomic_t *stop;
    moex_proto_limits lim;
    uint64_t model_hash;
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
    bool close_requested;
    bool done;                       /* leave the service loop */
    bool fatal;                      /* err holds why; exit once the outbox is flushed */
    double fatal_since_s;
    moex_error fatal_err;
    uint64_t peer_ts_us;             /* hub's last heartbeat timestamp, echoed */
    uint64_t n_dispatch_rx;          /* for --inject-exit-after */
    uint64_t jitter_rng;
    uint8_t *rx;                     /* message being reassembled */
    size_t rx_len, rx_cap;
    uint8_t *scratch;                /* decompression for decode */
    size_t scratch_cap;
    uint8_t ctl[1024];               /* control frames are encoded here */
    uint32_t *stale;                 /* backlog capacity seqs */

    /* ---- shared, under mu ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    moex_worker_backlog *backlog;
    moex_worker_outbox *outbox;
    uint32_t conn;                   /* id of the current connection; bumped on connect and disconnect */
    bool quit;                       /* compute thread: exit */
    bool running, running_cancelled;
    uint32_t running_seq;
    const uint32_t *batch_seqs;      /* --backend vulkan: the dispatches running together (batch_n, */
    bool *batch_cancelled;           /* the first is running_seq); CANCEL marks them here */
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

/* compute.c: the compute thread. */
int moex_worker_compute_start(session *s, pthread_t *th, moex_error *err);
void moex_worker_compute_stop(session *s, pthread_t th);

/* A splitmix64 step: uniform double in [0, 1). */
static inline double moex_worker_rand01(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

#endif
