/* Private to the hub: continuous batching over the engine (scheduler.c).
 *
 * One thread owns the engine. Jobs (a prompt, sampling settings, limits)
 * are submitted from any thread; each step the scheduler tokenizes newly
 * submitted prompts, admits queued jobs into free KV slots, and runs ONE
 * forward over every active sequence: one token for each sequence that is
 * decoding, plus a chunk of each new prompt (bounded, so that the running
 * streams keep their pace). A finished, failed or cancelled job frees its
 * slot at once. Whoever submitted a job is told (notify) when it has new
 * text or is done, and takes the text from the job. */
#ifndef MOEX_HUB_SCHEDULER_H
#define MOEX_HUB_SCHEDULER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

#define HUB_MAX_STOPS 4          /* stop sequences per request (OpenAI's limit) */
#define HUB_STOP_MAX_BYTES 256   /* bytes per stop sequence */

/* ---- counters and histograms, written by the scheduler thread, read by anyone ---- */

#define HUB_HIST_BUCKETS 14
typedef struct hub_hist {
    const double *bounds;                       /* HUB_HIST_BUCKETS upper bounds (seconds), ascending */
    atomic_uint_fast64_t count[HUB_HIST_BUCKETS + 1];   /* per bucket, the last is +Inf */
    _Atomic double sum;
} hub_hist;
void hub_hist_observe(hub_hist *h, double v);

typedef struct hub_sched_stats {
    atomic_uint_fast64_t prompt_tokens, generated_tokens, steps, step_tokens, admitted, finished_stop,
        finished_length, cancelled, failed, rejected;
    atomic_int active, queued;                  /* gauges */
    hub_hist ttft, per_token, step_s;           /* time to first token, between tokens, one forward */
} hub_sched_stats;

/* ---- jobs ---- */

typedef struct hub_job_params {
    char *prompt_text;           /* tokenized by the scheduler (special tokens parsed, BOS as the vocab asks) */
    size_t prompt_len;
    int32_t *prompt_tokens;      /* or ids (OpenAI's token-array prompt) */
    int64_t n_prompt_tokens;
    int64_t max_tokens;          /* <= 0: until an end-of-generation token or the context's end */
    moex_sampler_params sp;
    char *stop[HUB_MAX_STOPS];   /* the text ends before the first occurrence of any */
    int n_stop;
    bool ignore_eos;
} hub_job_params;

typedef enum hub_finish {
    HUB_FINISH_NONE = 0,
    HUB_FINISH_STOP,             /* end-of-generation token or a stop sequence */
    HUB_FINISH_LENGTH,           /* max_tokens or the context's end */
    HUB_FINISH_ERROR,            /* see status and error */
} hub_finish;

/* What the submitter reads (hub_job_take). */
typedef struct hub_job_state {
    bool accepted;               /* the prompt was tokenized and fits: a response may start */
    bool done;
    hub_finish finish;
    int http_status;             /* FINISH_ERROR: 400 (the request), 500 (the engine), 503 (shutting down) */
    const char *error_code;      /* FINISH_ERROR: OpenAI's code, e.g. "context_length_exceeded" */
    char error[768];
    int64_t n_prompt, n_completion;
} hub_job_state;

typedef struct hub_job hub_job;
typedef void (*hub_job_notify_fn)(void *ctx, hub_job *j);

/* Takes ownership of p's buffers (prompt, stops) whatever happens; one reference, the caller's. */
hub_job *hub_job_create(hub_job_params *p, hub_job_notify_fn notify, void *notify_ctx);
void hub_job_ref(hub_job *j);
void hub_job_unref(hub_job *j);
/* The client is gone: the scheduler frees its slot at the next step. Any thread. */
void hub_job_cancel(hub_job *j);
/* Moves the text produced since the last call into *text (malloc'd, NUL-
 * terminated; NULL when none) and fills st. Any thread. */
size_t hub_job_take(hub_job *j, char **text, hub_job_state *st);
/* A pointer for the submitter (its request), network thread only. */
void hub_job_set_user(hub_job *j, void *user);
void *hub_job_user(const hub_job *j);

/* ---- the scheduler ---- */

typedef struct hub_sched_config {
    int n_slots;                 /* sequences decoding together (--parallel); the engine's n_seq at most */
    int64_t n_ctx;               /* positions per slot */
    int64_t n_batch;             /* tokens per forward at most */
    int64_t prompt_chunk;        /* prompt tokens per forward while other sequences decode */
    int max_queue;               /* jobs waiting for a slot at most; more are refused */
    moex_pool *pool;             /* samples the step's rows in parallel (each its own sampler); NULL: one by one.
                                    Used between forwards only, so it may be the engine's */
} hub_sched_config;

typedef struct hub_sched hub_sched;

/* Starts the thread. m and eng must outlive it; eng without forward_batch
 * serves one slot only. */
hub_sched *hub_sched_start(const moex_model *m, const moex_engine *eng, const hub_sched_config *cfg,
                           hub_sched_stats *stats, moex_error *err);
/* Queues a job (takes a reference). -1 when the queue is full or the
 * scheduler stops: err says so, the caller answers 503. */
int hub_sched_submit(hub_sched *s, hub_job *j, moex_error *err);
const hub_sched_config *hub_sched_config_of(const hub_sched *s);
/* Fails what is queued or running (503) and stops the thread; later
 * submits are refused. */
void hub_sched_stop(hub_sched *s);
/* After hub_sched_stop, once nothing submits any more. */
void hub_sched_free(hub_sched *s);

#endif
