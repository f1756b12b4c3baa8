/* Private to the hub: continuous batching over the engine (scheduler.c).
 *
 * One thread owns the engine. Jobs (a prompt, sampling settings, limits)
 * are submitted from any thread; each step the scheduler tokenizes newly
 * submitted prompts, admits queued jobs into free KV slots, and runs ONE
 * forward over every active sequence: one token for each sequence that is
 * decoding, plus a chunk of each new prompt (bounded, so that the running
 * streams keep their pace). A finished, failed or cancelled job frees its
 * slot at once. Whoever submitted a job is told (notify) when it has new
 * text or is done, and takes the text from the job.
 *
 * With a drafter (config.make_drafter), a decoding sequence may also carry
 * drafted tokens into the step (speculative decoding, engine/speculate.c):
 * all its rows are wanted, the acceptance rule keeps a prefix, and the
 * sequence advances by several tokens. Only while few sequences decode
 * (config.spec_max_slots): a large step's forward already amortises the
 * round trips speculation saves. At most MOEX_SPEC_MAX_DRAFT drafts a step in
 * all, so that every wanted row runs on the one-token kernels.
 *
 * The prompt cache: a freed slot keeps its KV rows, and a new job goes to the
 * free slot whose last job's prompt shares the longest prefix with its own
 * (a chat's next turn, an agent's next call), and evaluates only the rest; a
 * running job's longer shared prefix is copied over (engine copy_rows).
 * Only rows computed as prompt rows are reused (not the prompt's last token,
 * whose logits were wanted, nor generated tokens): those are the bits the new
 * prompt would compute there, whatever the backend, so the tokens are those
 * without the cache. */
#ifndef MOEX_SERVE_SCHEDULER_H
#define MOEX_SERVE_SCHEDULER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

#define SERVE_MAX_STOPS 4          /* stop sequences per request (OpenAI's limit) */
#define SERVE_STOP_MAX_BYTES 256   /* bytes per stop sequence */

/* ---- counters and histograms, written by the scheduler thread, read by anyone ---- */

#define SERVE_HIST_BUCKETS 14
typedef struct serve_hist {
    const double *bounds;                       /* SERVE_HIST_BUCKETS upper bounds (seconds), ascending */
    atomic_uint_fast64_t count[SERVE_HIST_BUCKETS + 1];   /* per bucket, the last is +Inf */
    _Atomic double sum;
} serve_hist;
void serve_hist_observe(serve_hist *h, double v);

typedef struct serve_sched_stats {
    atomic_uint_fast64_t prompt_tokens, generated_tokens, steps, step_tokens, admitted, finished_stop,
        finished_length, cancelled, failed, rejected;
    atomic_int active, queued;                  /* gauges */
    serve_hist ttft, per_token, step_s;           /* time to first token, between tokens, one forward */
    /* speculative decoding: verifies (a sequence's rows with drafts), drafts, those accepted, and
     * verifies by how many drafts they accepted */
    atomic_uint_fast64_t spec_verifies, spec_drafted, spec_accepted, spec_hist[MOEX_SPEC_MAX_DRAFT + 1];
    atomic_uint_fast64_t prompt_cached;         /* prompt tokens the prompt cache served (not evaluated) */
    atomic_uint_fast64_t grammar_tokens, grammar_masks;   /* tokens sampled under a grammar; those whose first
                                                             pick it refused (the whole vocabulary masked) */
} serve_sched_stats;

/* ---- jobs ---- */

/* A generated token's log probability under the model (log-softmax of its
 * logits row, whatever the sampling settings) and the best alternatives. */
#define SERVE_MAX_TOP_LOGPROBS 20
typedef struct serve_logprob {
    int32_t id;
    float logprob;
    int n_top;                   /* best first */
    int32_t top_id[SERVE_MAX_TOP_LOGPROBS];
    float top_logprob[SERVE_MAX_TOP_LOGPROBS];
} serve_logprob;

typedef struct serve_job_params {
    char *prompt_text;           /* tokenized by the scheduler (special tokens parsed, BOS as the vocab asks) */
    size_t prompt_len;
    int32_t *prompt_tokens;      /* or ids (OpenAI's token-array prompt) */
    int64_t n_prompt_tokens;
    int64_t max_tokens;          /* <= 0: until an end-of-generation token or the context's end */
    moex_sampler_params sp;
    char *stop[SERVE_MAX_STOPS];   /* the text ends before the first occurrence of any */
    int n_stop;
    bool ignore_eos;
    moex_logit_rules rules;      /* penalties and biases (common/sampler.h); its bias arrays are the job's */
    int repeat_last_n;           /* the repeat penalty's window: the sequence's last tokens */
    bool logprobs;               /* each token's log probability ... */
    int top_logprobs;            /* ... and this many alternatives' (0 .. SERVE_MAX_TOP_LOGPROBS) */
    char *grammar;               /* GBNF the completion must follow (root rule "root"), or NULL: constrained
                                    sampling, serve/grammar.h. The job ends when the grammar can go no further */
} serve_job_params;

typedef enum serve_finish {
    SERVE_FINISH_NONE = 0,
    SERVE_FINISH_STOP,             /* end-of-generation token or a stop sequence */
    SERVE_FINISH_LENGTH,           /* max_tokens or the context's end */
    SERVE_FINISH_ERROR,            /* see status and error */
} serve_finish;

/* What the submitter reads (serve_job_take). */
typedef struct serve_job_state {
    bool accepted;               /* the prompt was tokenized and fits: a response may start */
    bool done;
    serve_finish finish;
    int http_status;             /* FINISH_ERROR: 400 (the request), 500 (the engine), 503 (shutting down) */
    const char *error_code;      /* FINISH_ERROR: OpenAI's code, e.g. "context_length_exceeded" */
    char error[768];
    int64_t n_prompt, n_completion;
    int64_t n_cached;            /* prompt tokens whose KV the slot held already (the prompt cache) */
} serve_job_state;

typedef struct serve_job serve_job;
typedef void (*serve_job_notify_fn)(void *ctx, serve_job *j);

/* A deep copy of p (another choice of the same request: its own buffers); -1 when out of memory, nothing owned. */
int serve_job_params_clone(const serve_job_params *p, serve_job_params *out);
/* Takes ownership of p's buffers (prompt, stops) whatever happens; one reference, the caller's. */
serve_job *serve_job_create(serve_job_params *p, serve_job_notify_fn notify, void *notify_ctx);
void serve_job_ref(serve_job *j);
void serve_job_unref(serve_job *j);
/* The client is gone: the scheduler frees its slot at the next step. Any thread. */
void serve_job_cancel(serve_job *j);
/* Moves the text produced since the last call into *text (malloc'd, NUL-
 * terminated; NULL when none) and fills st. Any thread. */
size_t serve_job_take(serve_job *j, char **text, serve_job_state *st);
/* Moves the log probabilities of the tokens produced since the last call into
 * *out (malloc'd; NULL when none). Any thread. */
size_t serve_job_take_logprobs(serve_job *j, serve_logprob **out);
/* A pointer for the submitter (its request), network thread only. */
void serve_job_set_user(serve_job *j, void *user);
void *serve_job_user(const serve_job *j);

/* ---- the scheduler ---- */

typedef struct serve_sched_config {
    int n_slots;                 /* sequences decoding together (--parallel); the engine's n_seq at most */
    int64_t n_ctx;               /* positions per slot */
    int64_t n_batch;             /* tokens per forward at most */
    int64_t prompt_chunk;        /* prompt tokens per forward while other sequences decode */
    int max_queue;               /* jobs waiting for a slot at most; more are refused */
    moex_pool *pool;             /* samples the step's rows in parallel (each its own sampler); NULL: one by one.
                                    Used between forwards only, so it may be the engine's */
    /* Speculative decoding, when set: a drafter for the sequence in `slot` with these sampling settings
     * (freed with moex_drafter_free when the slot is), or NULL (that sequence does not speculate) */
    moex_drafter *(*make_drafter)(void *ctx, int slot, const moex_sampler_params *sp);
    void *drafter_ctx;
    bool drafts_sample;          /* the drafter may sample (a draft model): sampling sequences get room for q */
    int draft_max;               /* drafts a sequence a step at most, 1 .. MOEX_SPEC_MAX_DRAFT */
    int spec_max_slots;          /* speculate only while at most this many sequences decode */
    bool no_prompt_cache;        /* every prompt evaluated whole (--no-prompt-cache) */
} serve_sched_config;

typedef struct serve_sched serve_sched;

/* Starts the thread. m and eng must outlive it; eng without forward_batch
 * serves one slot only. */
serve_sched *serve_sched_start(const moex_model *m, const moex_engine *eng, const serve_sched_config *cfg,
                           serve_sched_stats *stats, moex_error *err);
/* Queues a job (takes a reference). -1 when the queue is full or the
 * scheduler stops: err says so, the caller answers 503. */
int serve_sched_submit(serve_sched *s, serve_job *j, moex_error *err);
const serve_sched_config *serve_sched_config_of(const serve_sched *s);
/* Fails what is queued or running (503) and stops the thread; later
 * submits are refused. */
void serve_sched_stop(serve_sched *s);
/* After serve_sched_stop, once nothing submits any more. */
void serve_sched_free(serve_sched *s);

#endif
