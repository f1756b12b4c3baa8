/* The worker module: computes experts for a distributed hub.
 *
 * Layers, from the bottom:
 *  - the core (core.c): transport-free and thread-free (it is also built for
 *    WASM): holds a set of experts and turns a DISPATCH frame into a RESULT
 *    frame, computing exactly what the hub's local executor computes;
 *  - the Vulkan core (core_vk.c): the same on a GPU (--backend vulkan), the
 *    experts resident in device memory, queued dispatches run as one batch;
 *  - the backlog (backlog.c) and outbox (outbox.c): plain data structures
 *    for the dispatches waiting to be computed and the frames waiting to be
 *    sent (the caller locks);
 *  - the session (session.c, session_rx.c, compute.c): one libwebsockets
 *    client thread that talks to the hub and one compute thread that owns
 *    the core; a message of DISPATCH frames from the hub is computed as one
 *    batch and answered with one message of RESULT frames; timing.c keeps
 *    the latency of each stage;
 *  - moex-worker (main.c): the command line.
 *
 * ERROR frames use proto's codes (moex_proto_error_code): a worker sends
 * MOEX_ERR_BUSY, MOEX_ERR_PREEMPTED, MOEX_ERR_COMPUTE, MOEX_ERR_MODEL_MISMATCH,
 * or the negative moex_proto_status of a frame it could not decode, and acts
 * on the hub's as moex_proto_error_info_of(code)->on_worker says. */
#ifndef MOEX_WORKER_H
#define MOEX_WORKER_H

#include <signal.h>
#include <stdio.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "model/model.h"
#include "kernels/kernels.h"
#include "kernels/vk/vk.h"
#include "proto/proto.h"

/* ---- core ----------------------------------------------------------------- */

typedef struct moex_worker_core moex_worker_core;

/* An empty core for a model of n_layers x n_experts experts of width hidden.
 * pool: the threads moex_experts_run uses (not owned). */
moex_worker_core *moex_worker_core_create(int n_layers, int n_experts, int hidden, moex_pool *pool,
                                          moex_error *err);
void moex_worker_core_free(moex_worker_core *c);

/* Binds an expert to weights that outlive the core's use of them. */
int moex_worker_core_hold(moex_worker_core *c, int layer, int expert, const moex_expert_weights *w,
                          moex_error *err);
/* Forgets an expert; a no-op when it was not held. */
void moex_worker_core_drop(moex_worker_core *c, int layer, int expert);
bool moex_worker_core_holds(const moex_worker_core *c, int layer, int expert);
int moex_worker_core_n_held(const moex_worker_core *c);

/* Bytes of the RESULT frame answering a decoded DISPATCH (0 if invalid). */
size_t moex_worker_result_bytes(const moex_proto_msg *dispatch);

/* Computes a DISPATCH: *values points at n_tokens x hidden f32 results
 * (gate-weighted), owned by the core and valid until the next call. */
int moex_worker_core_run(moex_worker_core *c, const moex_proto_msg *dispatch, float **values, moex_error *err);
/* Encodes values as the RESULT of dispatch (same seq, layer, expert,
 * n_tokens, hidden and dtype). */
int moex_worker_encode_result(const moex_proto_msg *dispatch, const float *values, uint8_t *out, size_t cap,
                              size_t *out_len, moex_error *err);
/* run + encode. */
int moex_worker_core_compute(moex_worker_core *c, const moex_proto_msg *dispatch, uint8_t *out, size_t cap,
                             size_t *out_len, moex_error *err);

/* A batch: the dispatches a hub sends one worker for one layer, computed
 * together in one moex_experts_run (one job per dispatch, sharing the pool).
 * Begin, add decoded DISPATCHes (their rows are converted to f32 at once),
 * run, then read each one's n_tokens x hidden gate-weighted values (valid
 * until the next begin; the caller may modify them). A dispatch add refuses
 * (expert not held, bad shape) is not part of the batch. Each dispatch's
 * values are bit-identical to moex_worker_core_run's on it alone. */
void moex_worker_core_batch_begin(moex_worker_core *c);
int moex_worker_core_batch_add(moex_worker_core *c, const moex_proto_msg *dispatch, moex_error *err);
int moex_worker_core_batch_run(moex_worker_core *c, moex_error *err);
int moex_worker_core_batch_count(const moex_worker_core *c);
float *moex_worker_core_batch_values(const moex_worker_core *c, int i);

/* ---- Vulkan core (core_vk.c): experts resident on the GPU -------------------
 *
 * The same DISPATCH -> values as the core, on a Vulkan device: held experts
 * are uploaded once into slots of one device-local allocation (each slot
 * sized for the model's largest expert), and a batch of dispatches (a
 * prefill sends several per layer) runs in one submission. Activation
 * rounding is on: most rows match the CPU core to ~3e-7, a few percent are
 * off by one rounding step of the down product's input (~5e-3; core_vk.c). */

typedef struct moex_worker_vk moex_worker_vk;

/* A GPU core for m's experts (shapes and types only: no weights are read
 * here, and no slots are allocated yet). opt: the device (NULL: the best).
 * each_rows: MOEX_WORKER_VK_EACH_ALWAYS (what the worker runs: every row on
 * one token's kernels, the same bits in any batch), or N >= 0: an op of
 * more than N rows an expert on the prompt's tiles (tests compare the two). */
#define MOEX_WORKER_VK_EACH_ALWAYS (-1)
moex_worker_vk *moex_worker_vk_create(const moex_model *m, const moex_vk_options *opt, int each_rows,
                                      moex_error *err);
void moex_worker_vk_free(moex_worker_vk *g);
const char *moex_worker_vk_device_name(const moex_worker_vk *g);
size_t moex_worker_vk_slot_bytes(const moex_worker_vk *g);
/* Grows the slot allocation to n_slots (one new allocation; held experts are
 * copied over on the GPU). A no-op when it already has that many. */
int moex_worker_vk_reserve(moex_worker_vk *g, int n_slots, moex_error *err);
int moex_worker_vk_capacity(const moex_worker_vk *g);
/* Uploads an expert into a free slot (a no-op when held). */
int moex_worker_vk_hold(moex_worker_vk *g, int layer, int expert, const moex_expert_weights *w, moex_error *err);
/* Frees the expert's slot; a no-op when it was not held. */
void moex_worker_vk_drop(moex_worker_vk *g, int layer, int expert);
bool moex_worker_vk_holds(const moex_worker_vk *g, int layer, int expert);
int moex_worker_vk_n_held(const moex_worker_vk *g);

/* A batch: begin, add decoded DISPATCHes, run once, then read each one's
 * n_tokens x hidden gate-weighted values (valid until the next run; the
 * caller may modify them). add keeps views of the dispatch's rows: its frame
 * must stay valid until batch_run returns, which converts the rows straight
 * into the GPU's mapped input buffer (no other copy). A dispatch add refuses
 * (expert not held, bad shape) is simply not part of the batch. Hold, drop
 * and reserve between batches, not inside one. */
void moex_worker_vk_batch_begin(moex_worker_vk *g);
int moex_worker_vk_batch_add(moex_worker_vk *g, const moex_proto_msg *dispatch, moex_error *err);
int moex_worker_vk_batch_run(moex_worker_vk *g, moex_error *err);
int moex_worker_vk_batch_count(const moex_worker_vk *g);
float *moex_worker_vk_batch_values(const moex_worker_vk *g, int i);
/* The last batch_run in two parts, seconds: staging (inputs converted into
 * the mapped buffer, ops planned and recorded) and the GPU (submit and wait;
 * the values are then read straight from host-visible memory, no readback copy). */
void moex_worker_vk_batch_times(const moex_worker_vk *g, double *stage_s, double *gpu_s);
/* Compiles every pipeline a batch of the held experts can pick (each kernel
 * set at every row count where the kernels change), runs a 1-row and a
 * 16-row batch of each, and sizes the batch buffers for a prompt's layer: the
 * first dispatches wait for none of it. */
int moex_worker_vk_warm_up(moex_worker_vk *g, moex_error *err);
/* Pipelines created so far (tests: none more after the warm-up). */
int moex_worker_vk_pipelines(const moex_worker_vk *g);
/* One dispatch: begin + add + run. */
int moex_worker_vk_run(moex_worker_vk *g, const moex_proto_msg *dispatch, float **values, moex_error *err);

/* ---- residency: page hints for the experts' slices of the mapped file ------ */

/* Asks the kernel to read an expert's pages ahead (MADV_WILLNEED). */
void moex_worker_prefault(const moex_expert_weights *w);
/* Lets the kernel reclaim the pages only this expert uses (MADV_DONTNEED on
 * the whole pages inside its slices; the file mapping refaults them if needed).
 * Only for weights inside a read-only file mapping (moex_model_load's):
 * on anonymous memory MADV_DONTNEED would zero them. */
void moex_worker_release(const moex_expert_weights *w);
/* Bytes of an expert's three matrices. */
size_t moex_worker_expert_bytes(const moex_expert_weights *w);

/* ---- backlog: the dispatches waiting for the compute thread ----------------
 *
 * FIFO, bounded. The rule (a variant of the paper's single-slot preemption):
 * the hub sends all dispatches of a MoE layer before it can move to the next
 * layer, and it moves on only once it holds a result for each (from this
 * worker or another replica). So when a DISPATCH for another layer arrives,
 * queued dispatches of a different layer are stale: they are dropped and
 * handed back (the session answers each with ERROR "preempted", so a hub that
 * still wanted one re-dispatches at once). Dispatches of the same layer (a
 * prefill batch sends several) are all kept, in order. When the backlog is
 * full the new dispatch is refused (ERROR "busy"). Items are decoded views;
 * the bytes they point into belong to their owner (the session's received
 * message), which the caller keeps alive while an item refers to it. */

typedef struct moex_worker_backlog moex_worker_backlog;

typedef struct moex_worker_item {
    moex_proto_msg msg;  /* the decoded DISPATCH (seq, layer, expert in msg.h): views into its message */
    void *owner;         /* the received message holding those bytes (the caller's reference) */
    uint64_t group;      /* the received message's serial: one message's results leave together */
    double rx_s;         /* when that message was received (moex_time_s) */
    double rx_first_s;   /* when its first fragment arrived */
} moex_worker_item;

moex_worker_backlog *moex_worker_backlog_create(int capacity);
void moex_worker_backlog_free(moex_worker_backlog *b);
int moex_worker_backlog_depth(const moex_worker_backlog *b);

/* Queues a copy of *it. First drops the queued items of another layer,
 * copying them to stale[] (up to the backlog's capacity, the count in
 * *n_stale). Returns 0 when queued, 1 when the backlog is full (nothing
 * queued). */
int moex_worker_backlog_push(moex_worker_backlog *b, const moex_worker_item *it, moex_worker_item *stale, int *n_stale);
/* The i-th oldest item (NULL when there are not that many); valid until the backlog changes. */
const moex_worker_item *moex_worker_backlog_at(const moex_worker_backlog *b, int i);
/* Takes the oldest item; false when empty. */
bool moex_worker_backlog_pop(moex_worker_backlog *b, moex_worker_item *into);
/* Removes the queued item with this seq into *removed; false when none has it. */
bool moex_worker_backlog_cancel(moex_worker_backlog *b, uint32_t seq, moex_worker_item *removed);

/* ---- outbox: messages waiting for the socket -----------------------------------
 *
 * Each entry is one WebSocket message: one frame, or several back to back
 * (the RESULTs of one received message). It sits `headroom` bytes into its
 * buffer (libwebsockets needs LWS_PRE bytes before the data) and carries the
 * connection id it was made for, so that nothing crosses into a later
 * connection. */

typedef struct moex_worker_outbox moex_worker_outbox;

typedef struct moex_worker_buf {
    uint8_t *buf;    /* message at buf + headroom */
    size_t len, cap;
    uint32_t conn;
    double ready_s;  /* when it was queued (moex_time_s), for the outbox wait; 0: not timed */
    bool large;      /* the answer to a batch of over MOEX_WORKER_SMALL_ROWS rows (timed apart) */
} moex_worker_buf;

moex_worker_outbox *moex_worker_outbox_create(size_t headroom);
void moex_worker_outbox_free(moex_worker_outbox *o);
size_t moex_worker_outbox_headroom(const moex_worker_outbox *o);
int moex_worker_outbox_count(const moex_worker_outbox *o);
/* Appends a copy of len frame bytes. 0 or -1 (out of memory). */
int moex_worker_outbox_push_copy(moex_worker_outbox *o, uint32_t conn, const uint8_t *frame, size_t len);
/* Appends the frame in *b (len bytes at b->buf + headroom) by swapping
 * buffers with a free slot: *b gets that slot's old buffer. 0 or -1. */
int moex_worker_outbox_push_swap(moex_worker_outbox *o, moex_worker_buf *b);
/* The oldest frame (NULL when empty); valid until the next pop or push. */
const moex_worker_buf *moex_worker_outbox_peek(const moex_worker_outbox *o);
void moex_worker_outbox_pop(moex_worker_outbox *o);
/* Pops the oldest message into *into by swapping buffers (*into's old
 * buffer goes to the free slot): the caller may write it without holding
 * the outbox's lock. False when empty. */
bool moex_worker_outbox_take(moex_worker_outbox *o, moex_worker_buf *into);
void moex_worker_outbox_clear(moex_worker_outbox *o);
/* Makes b->buf hold headroom + len bytes (grows, never shrinks). 0 or -1. */
int moex_worker_buf_reserve(moex_worker_buf *b, size_t headroom, size_t len);

/* ---- options and session ---------------------------------------------------- */

typedef struct moex_worker_options {
    const char *hub_url;        /* ws://HOST:PORT/PATH (wss:// with TLS; http(s):// taken as ws(s)://) */
    const char *token;
    const char *ca_file;        /* wss: trust this certificate (PEM) instead of the system's CAs */
    bool insecure;              /* wss: no certificate verification at all */
    const char *model_path;     /* NULL: download the assigned experts from the hub */
    bool download;              /* --download: same as leaving out --model */
    const char *cache_dir;      /* downloads: NULL = $XDG_CACHE_HOME/moex or ~/.cache/moex */
    const char *name;           /* NULL: worker-<hostname>-<pid> */
    int threads;                /* compute pool size; <= 0: all cores */
    double capacity;            /* placement weight, JOIN capacity_centi = round(100 x) */
    uint64_t memory_budget;     /* 0: all the model's experts; vulkan: also sizes the GPU's expert slots */
    int backend;                /* moex_proto_backend: CPU or VULKAN */
    moex_vk_options vk;         /* --backend vulkan: --device N (vk.device, -1: the best), --vk-tune */
    bool vk_tuned;              /* --vk-tune given */
    double reconnect_max_s;     /* <= 0: retry forever */
    int backlog;                /* queued dispatches at most */
    int inject_delay_ms;
    double inject_delay_prob;
    long inject_exit_after;     /* 0: off */
    double inject_corrupt_prob;
    double inject_corrupt_scale;  /* the noise's amplitude over the row's RMS (default 10) */
    uint64_t seed;
} moex_worker_options;

/* Parses the command line (argv[0] is the program). Returns 0 when the
 * options are usable, 1 when --help was asked, -1 with err on bad flags. */
int moex_worker_parse_args(int argc, char **argv, moex_worker_options *o, moex_error *err);
void moex_worker_usage(FILE *f);

/* Worker-side latency of the dispatch path, for the hub's per-layer
 * breakdown: the latest samples of each stage in a fixed ring (nothing is
 * allocated per dispatch). One sample per computed batch (the dispatches
 * taken together: one received message, or several of one layer), except
 * OUTBOX: one per message written. */
typedef enum moex_worker_timer {
    MOEX_WT_RECEIVE,   /* a message's first fragment -> its last (the batch's oldest message): the transfer and
                          libwebsockets' parsing of a message larger than one read */
    MOEX_WT_QUEUED,    /* message received -> its batch's compute starts (the batch's oldest message) */
    MOEX_WT_COMPUTE,   /* compute start -> every value of the batch ready (vulkan: stage + GPU + CPU fallback) */
    MOEX_WT_VK_STAGE,  /* vulkan: inputs converted into the mapped buffer, ops planned and recorded */
    MOEX_WT_VK_GPU,    /* vulkan: submit + wait (the encoder reads the values from mapped memory) */
    MOEX_WT_ENCODE,    /* values -> the RESULT frames of the batch's messages */
    MOEX_WT_OUTBOX,    /* a message queued for the socket -> written to it */
    MOEX_WT_COUNT
} moex_worker_timer;

#define MOEX_WORKER_TIMING_SAMPLES 1024
/* A decode layer's message has at most this many rows: larger batches (a
 * prompt's) are also timed on their own, since the few a prompt makes would
 * be lost among a decode's many small ones; smaller messages may be computed
 * on the socket thread (compute.c). */
#define MOEX_WORKER_SMALL_ROWS 16

typedef struct moex_worker_timing {
    float ms[MOEX_WORKER_TIMING_SAMPLES];  /* the latest samples (a ring), milliseconds */
    uint64_t n;                            /* samples recorded in all */
} moex_worker_timing;

void moex_worker_timing_add(moex_worker_timing *t, double seconds);
/* The q-quantile (0..1, nearest rank) of the samples held, in ms; 0 when none. */
double moex_worker_timing_quantile(const moex_worker_timing *t, double q);
const char *moex_worker_timer_name(moex_worker_timer k);

typedef struct moex_worker_stats {
    uint64_t dispatches;   /* DISPATCH frames received */
    uint64_t results;      /* RESULT frames sent to the hub */
    uint64_t cancels;      /* CANCEL frames received */
    uint64_t cancelled;    /* of which removed from the backlog or discarded after computing */
    uint64_t errors;       /* ERROR frames sent (busy, preempted, compute, decode) */
    uint64_t connects, disconnects;
    uint64_t computed;     /* dispatches computed */
    uint64_t batches;      /* compute batches they ran in */
    uint64_t inline_batches; /* of which computed on the socket thread (small messages, no hand-off) */
    uint64_t messages_in;  /* messages received from the hub (WebSocket messages; on tcp://, runs of frames) */
    uint64_t messages_out; /* messages written to the hub */
    double compute_s;      /* time spent computing them */
    uint64_t large_batches;  /* batches of over MOEX_WORKER_SMALL_ROWS rows */
    moex_worker_timing timing[MOEX_WT_COUNT];        /* every batch */
    moex_worker_timing timing_large[MOEX_WT_COUNT];  /* the large batches again */
} moex_worker_stats;

/* Adds one batch's (or, for OUTBOX, one message's) sample to the rings:
 * the large ones to both. */
void moex_worker_timing_record(moex_worker_stats *st, moex_worker_timer k, bool large, double seconds);

/* "worker timing: receive p50 0.004 p99 0.020 ms, queued ... (N batches, ...)":
 * p50/p99 of each stage with samples, on one line; then, when there were
 * large batches, "\nworker timing, batches over 16 rows: ..." (no final newline). */
void moex_worker_timing_line(const moex_worker_stats *st, char *buf, size_t cap);

/* Runs the session until *stop becomes nonzero (returns 0) or a fatal error:
 * the hub's ERROR says retrying cannot help (model mismatch, no common
 * protocol version, evicted), the hub refused the token, no connection
 * within reconnect_max_s (returns -1 with err). Signal handlers may set
 * *stop; the session notices within 100 ms. */
int moex_worker_run(const moex_worker_options *o, const moex_model *m, volatile sig_atomic_t *stop,
                    moex_worker_stats *stats, moex_error *err);

/* ---- expert download: a worker without its own copy of the model ---------
 *
 * (download*.c; the hub's endpoints are in docs/PROTOCOL.md, "Expert
 * download".) The store learns the model from the hub's GET /v1/model, and
 * for each assignment downloads the experts its cache lacks, resuming
 * partial files with a Range request and checking each against the hub's
 * XXH3, into <cache-dir>/<model_hash>/L-E.bin; the worker computes from
 * read-only mappings of those files. A download thread (download_loader.c)
 * fetches while the session keeps heartbeating, then hands the assignment
 * to the compute thread. */

typedef struct moex_worker_store moex_worker_store;

/* Asks the hub for its model (retrying while it is unreachable, up to
 * --reconnect-max-s; *stop abandons) and opens the cache directory. */
moex_worker_store *moex_worker_store_open(const moex_worker_options *o, volatile sig_atomic_t *stop, moex_error *err);
void moex_worker_store_close(moex_worker_store *st);
/* The model as the hub describes it: hparams (shape fields) and every
 * expert's matrices (type, shape; data bound once fetched). No GGUF, no
 * other weights. */
const moex_model *moex_worker_store_model(const moex_worker_store *st);
uint64_t moex_worker_store_model_hash(const moex_worker_store *st);
/* "http://HOST:PORT", for messages. */
const char *moex_worker_store_source(const moex_worker_store *st);
/* Binds the listed experts' weights in the store's model: checks cached
 * files against the hub's hash (once per process), downloads the others
 * with a progress display. stop is polled between and during requests.
 * 0 when all are bound, 1 when stopped, 2 when the hub stayed unreachable
 * over a few retries (err says why; partial files stay for the next try),
 * -1 with err on a lasting failure (refused, hash mismatch twice, disk). */
int moex_worker_store_fetch(moex_worker_store *st, const moex_proto_expert *list, uint32_t n, bool (*stop)(void *),
                            void *stop_ctx, moex_error *err);
/* Once nothing uses the experts outside list: unmaps them, and deletes the
 * least recently assigned files while the cache exceeds the memory budget
 * (--memory-budget; default: the model's experts, so nothing is evicted). */
void moex_worker_store_trim(moex_worker_store *st, const moex_proto_expert *list, uint32_t n);

/* Asks the hub for its model again (it now serves another one) and opens
 * the cache directory of the new model; st's model is replaced (nothing may
 * use it meanwhile). Fails when the hub still describes the same model. */
int moex_worker_store_reopen(moex_worker_store *st, const moex_worker_options *o, volatile sig_atomic_t *stop,
                             moex_error *err);

/* moex_worker_run for a store: the same session, with experts downloaded.
 * When the hub reports a model mismatch (it restarted with another model),
 * the store is reopened for the hub's new model and the worker joins again. */
int moex_worker_run_store(const moex_worker_options *o, moex_worker_store *st, volatile sig_atomic_t *stop,
                          moex_worker_stats *stats, moex_error *err);

#endif
