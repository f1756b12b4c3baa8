/* Continuous batching (scheduler.h). One thread; per step:
 *
 *   drop      cancelled jobs free their slots
 *   tokenize  newly submitted prompts (a prompt that does not fit the context fails at once)
 *   admit     queued jobs into free slots, in arrival order
 *   batch     one token of every decoding sequence, then chunks of prompts (positions in order)
 *   forward   one engine call for all of them (so a distributed MoE layer is one round of dispatches)
 *   sample    each sequence's wanted row with its own sampler (a greedy one's: the engine's argmax, where it
 *             computes one, with nothing read back); text out, stop sequences, limits
 *
 * Jobs are shared with their submitter: the scheduler writes their output
 * under the job's lock and calls notify; the submitter takes it. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/grammar.h"
#include "serve/scheduler.h"
#include "serve/text_out.h"

#define MAX_PENDING_TEXT (4u << 20) /* text a client has not taken; past it the client is not reading */

struct serve_job {
    pthread_mutex_t mu;
    atomic_int refs;
    atomic_bool cancelled;
    serve_job_params p;
    serve_job_notify_fn notify;
    void *notify_ctx;
    void *user;                  /* network thread only */
    serve_job *next;               /* the scheduler's queue */
    /* scheduler thread only */
    int32_t *prompt;             /* the prompt, then the completion's tokens (n_ctx + 1): the sequence so far */
    int64_t n_prompt, n_fed;     /* prompt tokens, how many are in the KV slot */
    int64_t n_past;              /* positions filled */
    int64_t n_gen;               /* tokens sampled */
    int32_t last;                /* the token to feed next (decoding) */
    moex_sampler *smp;
    serve_grammar *gram;         /* p.grammar parsed, and the matcher at the completion's end; or NULL */
    serve_grammar_state *gs;
    moex_drafter *drafter;       /* speculative decoding (its slot's), or NULL */
    float *q;                    /* MOEX_SPEC_MAX_DRAFT x n_vocab: a sampling drafter's distributions, or NULL */
    int32_t draft[MOEX_SPEC_MAX_DRAFT];
    int n_draft, k_cur;          /* drafts in this step's batch (after the job's decode row); the adaptive length */
    bool draft_sampled;
    serve_text_out text;         /* text not yet released: may start a stop sequence or end mid-UTF-8 */
    double t_submit, t_last;
    /* shared, under mu */
    char *out;
    size_t out_len, out_cap;
    serve_logprob *lp;           /* log probabilities not yet taken (p.logprobs) */
    size_t n_lp, cap_lp;
    serve_job_state st;
};

/* ---- histograms ---- */

void serve_hist_observe(serve_hist *h, double v) {
    int b = 0;
    while (b < SERVE_HIST_BUCKETS && v > h->bounds[b]) b++;
    atomic_fetch_add_explicit(&h->count[b], 1, memory_order_relaxed);
    atomic_store_explicit(&h->sum, atomic_load_explicit(&h->sum, memory_order_relaxed) + v, memory_order_relaxed);
}

/* ---- jobs ---- */

static void *dup_bytes(const void *src, size_t n) {
    void *d = src ? malloc(n ? n : 1) : NULL;
    if (d && n) memcpy(d, src, n);
    return d;
}

int serve_job_params_clone(const serve_job_params *p, serve_job_params *out) {
    *out = *p;
    out->prompt_text = dup_bytes(p->prompt_text, p->prompt_text ? p->prompt_len + 1 : 0);
    out->prompt_tokens = dup_bytes(p->prompt_tokens, (size_t)p->n_prompt_tokens * sizeof *p->prompt_tokens);
    out->rules.bias_id = dup_bytes(p->rules.bias_id, (size_t)p->rules.n_bias * sizeof *p->rules.bias_id);
    out->rules.bias = dup_bytes(p->rules.bias, (size_t)p->rules.n_bias * sizeof *p->rules.bias);
    out->grammar = p->grammar ? strdup(p->grammar) : NULL;
    bool ok = (!p->prompt_text || out->prompt_text) && (!p->prompt_tokens || out->prompt_tokens) &&
              (!p->rules.bias_id || out->rules.bias_id) && (!p->rules.bias || out->rules.bias) &&
              (!p->grammar || out->grammar);
    for (int i = 0; i < p->n_stop; i++) ok = (out->stop[i] = p->stop[i] ? strdup(p->stop[i]) : NULL) && ok;
    if (ok) return 0;
    free(out->prompt_text);
    free(out->prompt_tokens);
    free((void *)out->rules.bias_id);
    free((void *)out->rules.bias);
    free(out->grammar);
    for (int i = 0; i < p->n_stop; i++) free(out->stop[i]);
    return -1;
}

serve_job *serve_job_create(serve_job_params *p, serve_job_notify_fn notify, void *notify_ctx) {
    serve_job *j = calloc(1, sizeof *j);
    if (!j) {
        free(p->prompt_text);
        free(p->prompt_tokens);
        for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
        free((void *)p->rules.bias_id);
        free((void *)p->rules.bias);
        free(p->grammar);
        return NULL;
    }
    pthread_mutex_init(&j->mu, NULL);
    atomic_init(&j->refs, 1);
    atomic_init(&j->cancelled, false);
    j->p = *p;
    j->text = (serve_text_out){.stop = j->p.stop, .n_stop = j->p.n_stop};
    j->notify = notify;
    j->notify_ctx = notify_ctx;
    j->t_submit = moex_time_s();
    return j;
}

void serve_job_ref(serve_job *j) { atomic_fetch_add(&j->refs, 1); }

void serve_job_unref(serve_job *j) {
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
    free(j->p.prompt_text);
    free(j->p.prompt_tokens);
    for (int i = 0; i < j->p.n_stop; i++) free(j->p.stop[i]);
    free((void *)j->p.rules.bias_id);
    free((void *)j->p.rules.bias);
    free(j->p.grammar);
    free(j->prompt);
    moex_sampler_free(j->smp);
    serve_grammar_state_free(j->gs);
    serve_grammar_free(j->gram);
    moex_drafter_free(j->drafter);
    free(j->q);
    serve_text_out_free(&j->text);
    free(j->out);
    free(j->lp);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

void serve_job_cancel(serve_job *j) { atomic_store(&j->cancelled, true); }

size_t serve_job_take(serve_job *j, char **text, serve_job_state *st) {
    pthread_mutex_lock(&j->mu);
    const size_t n = j->out_len;
    *text = n ? j->out : NULL;
    if (n) {
        j->out[n] = '\0';
        j->out = NULL;
        j->out_len = j->out_cap = 0;
    }
    *st = j->st;
    pthread_mutex_unlock(&j->mu);
    return n;
}

size_t serve_job_take_logprobs(serve_job *j, serve_logprob **out) {
    pthread_mutex_lock(&j->mu);
    const size_t n = j->n_lp;
    *out = n ? j->lp : NULL;
    if (n) j->lp = NULL, j->n_lp = j->cap_lp = 0;
    pthread_mutex_unlock(&j->mu);
    return n;
}

void serve_job_set_user(serve_job *j, void *user) { j->user = user; }
void *serve_job_user(const serve_job *j) { return j->user; }

/* ---- the scheduler ---- */

struct serve_sched {
    const moex_model *m;
    moex_engine eng;
    serve_sched_config cfg;
    serve_sched_stats *stats;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;          /* the queue and stop */
    pthread_cond_t cv;
    bool stop;
    serve_job *queue_head, *queue_tail;   /* submitted, not yet taken by the thread */
    int n_queue;
    /* thread only */
    serve_job **slot;              /* [n_slots] the job in each KV slot */
    serve_job **waiting;           /* tokenized, waiting for a slot, in arrival order */
    int n_waiting, cap_waiting;
    int32_t *b_tok, *b_seq, *b_pos;
    bool *b_want;
    bool *b_greedy;              /* [n_batch] wanted rows whose argmax is the token (engines with batch_argmax) */
    bool *b_spec;                /* [n_batch] rows of a speculating sequence: its job's acceptance rule takes them */
    int64_t max_rows;            /* wanted rows a step at most: a row a slot, plus the drafts */
    float *logits;               /* [max_rows x n_vocab] */
    int32_t *row_argmax;         /* [max_rows] each logits row's argmax, from the engine (batch_argmax) */
    int32_t *row_id;             /* [max_rows] the token sampled from each logits row */
    int64_t *row_tok;            /* [max_rows] each logits row's token in the batch */
    float *spec_scratch;         /* n_vocab: the acceptance rule's */
    int32_t *counts;             /* [pool threads x n_vocab] zeroed scratch of the logit rules (penalties) */
    serve_grammar_vocab *gvocab; /* every token's text for constrained sampling: made for the first grammar */
    uint8_t *gmask;              /* [pool threads x n_vocab] the tokens a grammar allows */
    int32_t *kept;               /* [n_slots x n_ctx] the prompt cache: the tokens whose KV rows each slot holds */
    int64_t *n_kept;             /* [n_slots] */
    double t_around;             /* seconds building batches and taking their tokens (the forwards: stats->step_s) */
};

/* Publishes a state change and tells the submitter. */
static void job_update(serve_job *j, const char *text, size_t len, void (*change)(serve_job_state *st, void *arg),
                       void *arg) {
    pthread_mutex_lock(&j->mu);
    bool overflow = false;
    if (len) {
        if (j->out_len + len + 1 > j->out_cap) {
            size_t cap = j->out_cap ? j->out_cap : 256;
            while (cap < j->out_len + len + 1) cap *= 2;
            char *grown = cap <= MAX_PENDING_TEXT ? realloc(j->out, cap) : NULL;
            if (grown) j->out = grown, j->out_cap = cap;
            else overflow = true;
        }
        if (!overflow) {
            memcpy(j->out + j->out_len, text, len);
            j->out_len += len;
        }
    }
    if (change) change(&j->st, arg);
    pthread_mutex_unlock(&j->mu);
    if (overflow) {
        moex_log(MOEX_LOG_INFO, "api: a client took none of %u bytes of text: cancelled", MAX_PENDING_TEXT);
        atomic_store(&j->cancelled, true);
    }
    if (j->notify) j->notify(j->notify_ctx, j);
}

typedef struct failure {
    int status;
    const char *code;
    const char *msg;
} failure;

static void set_failed(serve_job_state *st, void *arg) {
    const failure *f = arg;
    st->done = true;
    st->finish = SERVE_FINISH_ERROR;
    st->http_status = f->status;
    st->error_code = f->code;
    snprintf(st->error, sizeof st->error, "%s", f->msg);
}

static void set_accepted(serve_job_state *st, void *arg) {
    st->accepted = true;
    st->n_prompt = *(const int64_t *)arg;
}

typedef struct progress {
    int64_t n_completion;
    serve_finish finish;
} progress;

static void set_progress(serve_job_state *st, void *arg) {
    const progress *p = arg;
    st->n_completion = p->n_completion;
    if (p->finish) {
        st->done = true;
        st->finish = p->finish;
    }
}

static void fail_job(serve_sched *s, serve_job *j, int status, const char *code, const char *msg) {
    failure f = {status, code, msg};
    atomic_fetch_add(status == 400 ? &s->stats->rejected : &s->stats->failed, 1);
    job_update(j, NULL, 0, set_failed, &f);
}

/* The prompt rows a job's slot holds that another prompt may reuse: those
 * fed as prompt rows (its last prompt token wanted logits, so it ran on
 * other kernels on a GPU; generated tokens too). */
static int64_t prompt_rows_fed(const serve_job *j) {
    const int64_t k = j->n_fed < j->n_prompt ? j->n_fed : j->n_prompt - 1;
    return k > 0 ? k : 0;
}

/* The prompt cache: what a freed slot keeps. */
static void keep_prompt_rows(serve_sched *s, int slot, const serve_job *j) {
    const int64_t k = prompt_rows_fed(j);
    memcpy(s->kept + (size_t)slot * (size_t)s->cfg.n_ctx, j->prompt, (size_t)k * sizeof *j->prompt);
    s->n_kept[slot] = k;
}

static void free_slot(serve_sched *s, int slot) {
    serve_job *j = s->slot[slot];
    s->slot[slot] = NULL;
    keep_prompt_rows(s, slot, j);
    moex_drafter_free(j->drafter);   /* bound to the slot (a draft model's KV slot) */
    j->drafter = NULL;
    atomic_fetch_sub(&s->stats->active, 1);
    serve_job_unref(j);
}

static int piece_of(const moex_model *m, int32_t id, char *buf, int cap, char **big) {
    int n = moex_token_to_piece(m->tok, id, false, buf, cap);
    if (n <= cap) return n;
    *big = malloc((size_t)n);
    if (!*big || moex_token_to_piece(m->tok, id, false, *big, n) != n) return -1;
    return n;
}

/* A sampled token: text out, then whether the job is finished. */
static serve_finish on_token(serve_sched *s, serve_job *j, int32_t id, int64_t n_completion) {
    const moex_model *m = s->m;
    const bool eog = !j->p.ignore_eos && m->tok && moex_tokenizer_is_eog(m->tok, id);
    serve_finish finish = SERVE_FINISH_NONE;
    if (eog) {
        finish = SERVE_FINISH_STOP;
    } else if (m->tok) {
        char buf[256], *big = NULL;
        const int n = piece_of(m, id, buf, sizeof buf, &big);
        const bool oom = n < 0 || (n > 0 && serve_text_out_add(&j->text, big ? big : buf, (size_t)n));
        free(big);
        if (oom) {
            fail_job(s, j, 500, "server_error", "out of memory for the completion's text");
            return SERVE_FINISH_ERROR;
        }
    }
    if (!finish && j->gs && serve_grammar_must_end(j->gs)) finish = SERVE_FINISH_STOP;   /* nothing else may follow */
    if (!finish && j->p.max_tokens > 0 && n_completion >= j->p.max_tokens) finish = SERVE_FINISH_LENGTH;
    if (!finish && j->n_past + 1 > s->cfg.n_ctx) finish = SERVE_FINISH_LENGTH; /* no room to feed it */
    size_t n_out = 0;
    const bool stopped = serve_text_out_release(&j->text, finish != SERVE_FINISH_NONE, &n_out);
    if (stopped) finish = SERVE_FINISH_STOP;
    progress pr = {n_completion, finish};
    char *clean = n_out ? malloc(3 * n_out) : NULL;
    if (n_out && !clean) {
        fail_job(s, j, 500, "server_error", "out of memory for the completion's text");
        return SERVE_FINISH_ERROR;
    }
    job_update(j, clean, clean ? serve_text_out_sanitize(j->text.held, n_out, clean) : 0, set_progress, &pr);
    free(clean);
    serve_text_out_consume(&j->text, n_out);
    return finish;
}

/* ---- steps ---- */

static int64_t tokenize(const moex_model *m, const serve_job *j, int32_t **out, moex_error *err) {
    if (j->p.prompt_tokens) {
        *out = malloc((size_t)(j->p.n_prompt_tokens ? j->p.n_prompt_tokens : 1) * sizeof **out);
        if (!*out) return moex_fail(err, "out of memory");
        memcpy(*out, j->p.prompt_tokens, (size_t)j->p.n_prompt_tokens * sizeof **out);
        for (int64_t i = 0; i < j->p.n_prompt_tokens; i++)
            if ((*out)[i] < 0 || (*out)[i] >= m->hp.n_vocab)
                return moex_fail(err, "prompt token %lld is %d, outside the vocabulary (0..%d)", (long long)i,
                                 (*out)[i], m->hp.n_vocab - 1);
        return j->p.n_prompt_tokens;
    }
    if (!m->tok) return moex_fail(err, "this model has no tokenizer: send the prompt as token ids");
    int64_t cap = (int64_t)j->p.prompt_len + 8;
    *out = malloc((size_t)cap * sizeof **out);
    if (!*out) return moex_fail(err, "out of memory");
    const int64_t n = moex_tokenize(m->tok, j->p.prompt_text, j->p.prompt_len, true, true, *out, cap, err);
    if (n > cap) return moex_fail(err, "the prompt tokenized into more tokens than bytes");
    return n;
}

/* Every token's text as the completion shows it (special tokens: none, so a
 * grammar never allows them) and which end generation, for the matchers. */
static int make_grammar_vocab(serve_sched *s, moex_error *err) {
    const int32_t n = s->m->hp.n_vocab;
    const int nth = s->cfg.pool ? moex_pool_size(s->cfg.pool) : 1;
    char **bytes = calloc((size_t)n, sizeof *bytes);
    uint32_t *len = calloc((size_t)n, sizeof *len);
    bool *eog = calloc((size_t)n, sizeof *eog);
    if (!s->gmask) s->gmask = malloc((size_t)nth * (size_t)n);   /* kept across a failed attempt */
    int rc = bytes && len && eog && s->gmask ? 0 : moex_fail(err, "out of memory");
    for (int32_t i = 0; !rc && i < n; i++) {
        char buf[256], *big = NULL;
        const int k = piece_of(s->m, i, buf, sizeof buf, &big);
        if (k < 0) rc = moex_fail(err, "out of memory");
        else if (k > 0 && !(bytes[i] = big ? big : dup_bytes(buf, (size_t)k))) rc = moex_fail(err, "out of memory");
        len[i] = k > 0 ? (uint32_t)k : 0;
        eog[i] = moex_tokenizer_is_eog(s->m->tok, i);
    }
    if (!rc && !(s->gvocab = serve_grammar_vocab_create(n, (const char *const *)bytes, len, eog, err))) rc = -1;
    for (int32_t i = 0; bytes && i < n; i++) free(bytes[i]);
    free(bytes);
    free(len);
    free(eog);
    return rc;
}

/* The job's grammar parsed and its matcher made (a 400 when the grammar is bad). */
static bool start_grammar(serve_sched *s, serve_job *j) {
    moex_error err = {0};
    char msg[sizeof err.msg + 64];
    if (!s->m->tok) {
        fail_job(s, j, 400, "invalid_grammar", "constrained output needs the model's tokenizer (this model has none)");
        return false;
    }
    if (!s->gvocab && make_grammar_vocab(s, &err)) {
        snprintf(msg, sizeof msg, "constrained sampling: %s", err.msg);
        fail_job(s, j, 500, "server_error", msg);
        return false;
    }
    if (!(j->gram = serve_grammar_parse(j->p.grammar, NULL, &err)) || !(j->gs = serve_grammar_state_create(j->gram, &err))) {
        snprintf(msg, sizeof msg, "grammar: %s", err.msg);
        fail_job(s, j, 400, "invalid_grammar", msg);
        return false;
    }
    return true;
}

/* A new job: its prompt in tokens, checked against the context; its sampler. */
static bool prepare(serve_sched *s, serve_job *j) {
    moex_error err = {0};
    char msg[sizeof err.msg + 128];
    j->n_prompt = tokenize(s->m, j, &j->prompt, &err);
    if (j->n_prompt < 0) {
        fail_job(s, j, 400, "invalid_prompt", err.msg);
        return false;
    }
    if (j->n_prompt == 0) {
        fail_job(s, j, 400, "invalid_prompt", "the prompt has no tokens: nothing to continue from");
        return false;
    }
    if (j->n_prompt >= s->cfg.n_ctx) {
        snprintf(msg, sizeof msg,
                 "the prompt is %lld tokens; this server's context holds %lld per request (prompt and completion)",
                 (long long)j->n_prompt, (long long)s->cfg.n_ctx);
        fail_job(s, j, 400, "context_length_exceeded", msg);
        return false;
    }
    int32_t *seq = realloc(j->prompt, (size_t)(s->cfg.n_ctx + 1) * sizeof *seq);   /* room for the completion */
    if (!seq) {
        fail_job(s, j, 500, "server_error", "out of memory for the sequence");
        return false;
    }
    j->prompt = seq;
    if (!(j->smp = moex_sampler_create(&j->p.sp, s->m->hp.n_vocab))) {
        fail_job(s, j, 500, "server_error", "out of memory for a sampler");
        return false;
    }
    if (j->p.grammar && !start_grammar(s, j)) return false;
    job_update(j, NULL, 0, set_accepted, &j->n_prompt);
    return true;
}

/* Moves submitted jobs to the waiting list (tokenized). false: stopping. */
static bool take_submitted(serve_sched *s, bool block) {
    pthread_mutex_lock(&s->mu);
    while (block && !s->stop && !s->queue_head) pthread_cond_wait(&s->cv, &s->mu);
    serve_job *list = s->queue_head;
    s->queue_head = s->queue_tail = NULL;
    const bool stop = s->stop;
    pthread_mutex_unlock(&s->mu);
    for (serve_job *j = list, *next; j; j = next) {
        next = j->next;
        j->next = NULL;
        if (s->n_waiting == s->cap_waiting) {
            const int cap = s->cap_waiting ? 2 * s->cap_waiting : 16;
            serve_job **grown = realloc(s->waiting, (size_t)cap * sizeof *grown);
            if (!grown) {
                fail_job(s, j, 503, "server_error", "out of memory for the queue");
                serve_job_unref(j);
                continue;
            }
            s->waiting = grown;
            s->cap_waiting = cap;
        }
        if (atomic_load(&j->cancelled) || !prepare(s, j)) {
            if (atomic_load(&j->cancelled)) atomic_fetch_add(&s->stats->cancelled, 1);
            pthread_mutex_lock(&s->mu);
            s->n_queue--;
            atomic_store(&s->stats->queued, s->n_queue);
            pthread_mutex_unlock(&s->mu);
            serve_job_unref(j);
            continue;
        }
        s->waiting[s->n_waiting++] = j;
    }
    return !stop;
}

static void drop_cancelled(serve_sched *s) {
    for (int i = 0; i < s->cfg.n_slots; i++)
        if (s->slot[i] && atomic_load(&s->slot[i]->cancelled)) {
            atomic_fetch_add(&s->stats->cancelled, 1);
            free_slot(s, i);
        }
    int kept = 0;
    for (int i = 0; i < s->n_waiting; i++) {
        if (atomic_load(&s->waiting[i]->cancelled)) {
            atomic_fetch_add(&s->stats->cancelled, 1);
            serve_job_unref(s->waiting[i]);
        } else {
            s->waiting[kept++] = s->waiting[i];
        }
    }
    if (kept != s->n_waiting) {
        pthread_mutex_lock(&s->mu);
        s->n_queue -= s->n_waiting - kept;
        atomic_store(&s->stats->queued, s->n_queue);
        pthread_mutex_unlock(&s->mu);
        s->n_waiting = kept;
    }
}

/* Whether the job changes its logits before sampling (penalties, biases). */
static bool has_rules(const serve_job *j) {
    const moex_logit_rules *r = &j->p.rules;
    return r->presence != 0.0f || r->frequency != 0.0f || (r->repeat != 1.0f && r->repeat > 0.0f) || r->n_bias > 0;
}

/* A drafter for the job in slot i, when the server speculates (none: the job decodes one token a step). */
static void start_drafting(serve_sched *s, serve_job *j, int i) {
    if (!s->cfg.make_drafter || j->p.logprobs || has_rules(j) || j->gs) return;   /* one row a token: its own rules,
                                                                                    logprobs, grammar */
    j->drafter = s->cfg.make_drafter(s->cfg.drafter_ctx, i, &j->p.sp);
    j->k_cur = s->cfg.draft_max;
    if (j->drafter && s->cfg.drafts_sample && !moex_sampler_is_greedy(j->smp) &&
        !(j->q = malloc((size_t)MOEX_SPEC_MAX_DRAFT * (size_t)s->m->hp.n_vocab * sizeof *j->q))) {
        moex_drafter_free(j->drafter);
        j->drafter = NULL;
    }
}

static int64_t common_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    int64_t n = 0;
    while (n < na && n < nb && a[n] == b[n]) n++;
    return n;
}

/* Rows worth copying from another slot (below that a shared BOS or chat header, not worth a submission). */
#define COPY_MIN_ROWS 16

/* The free slot for j: the longest prefix of its prompt in a free slot's
 * kept rows, else the slot keeping the fewest (so that the others' stay); -1
 * when none is free. *reuse: the rows j may take (its last prompt token is
 * always evaluated: its logits are wanted). When a busy slot's job has fed a
 * longer prefix of it (COPY_MIN_ROWS at least: two requests with one long
 * system prompt), *copy_from names that slot: its rows are copied into the
 * free slot keeping the fewest (engines with copy_rows). */
static int pick_slot(const serve_sched *s, const serve_job *j, int64_t *reuse, int *copy_from) {
    int best = -1, least = -1;
    int64_t best_common = -1;
    for (int i = 0; i < s->cfg.n_slots; i++) {
        if (s->slot[i]) continue;
        const int64_t c = s->cfg.no_prompt_cache ? 0 : common_prefix(s->kept + (size_t)i * (size_t)s->cfg.n_ctx,
                                                                     s->n_kept[i], j->prompt, j->n_prompt);
        if (best < 0 || c > best_common || (c == best_common && c == 0 && s->n_kept[i] < s->n_kept[best]))
            best = i, best_common = c;
        if (least < 0 || s->n_kept[i] < s->n_kept[least]) least = i;
    }
    *copy_from = -1;
    for (int i = 0; best >= 0 && !s->cfg.no_prompt_cache && s->eng.copy_rows && i < s->cfg.n_slots; i++) {
        const serve_job *b = s->slot[i];
        const int64_t c = b ? common_prefix(b->prompt, prompt_rows_fed(b), j->prompt, j->n_prompt) : 0;
        if (c >= COPY_MIN_ROWS && c > best_common) *copy_from = i, best_common = c;
    }
    if (*copy_from >= 0) best = least;
    *reuse = best_common < j->n_prompt ? best_common : j->n_prompt - 1;
    return best;
}

static void set_cached(serve_job_state *st, void *arg) { st->n_cached = *(const int64_t *)arg; }

/* Whether j should wait for a running job still feeding a prompt that shares
 * a longer prefix with j's (COPY_MIN_ROWS at least): once fed, those rows are
 * copied instead of computed twice (n choices of one request, a burst of
 * calls with one system prompt). */
static bool wait_for_prefix(const serve_sched *s, const serve_job *j) {
    if (s->cfg.no_prompt_cache || !s->eng.copy_rows) return false;
    for (int i = 0; i < s->cfg.n_slots; i++) {
        const serve_job *b = s->slot[i];
        if (!b || b->n_fed >= b->n_prompt) continue;
        const int64_t c = common_prefix(b->prompt, b->n_prompt - 1, j->prompt, j->n_prompt);
        if (c >= COPY_MIN_ROWS && c > prompt_rows_fed(b)) return true;
    }
    return false;
}

/* Waiting jobs into free slots, in arrival order (a job waiting for a shared prefix stays in line). */
static void admit(serve_sched *s) {
    int taken = 0, kept = 0;
    for (int w = 0; w < s->n_waiting; w++) {
        serve_job *j = s->waiting[w];
        int64_t reuse = 0;
        int from = -1;
        const int i = wait_for_prefix(s, j) ? -1 : pick_slot(s, j, &reuse, &from);
        if (i < 0) {
            s->waiting[kept++] = j;
            continue;
        }
        taken++;
        moex_error err = {0};
        if (from >= 0 && reuse > 0 && s->eng.copy_rows(s->eng.ctx, from, i, reuse, &err)) {
            moex_log(MOEX_LOG_WARN, "api: copying a shared prefix failed (the prompt is evaluated whole): %s", err.msg);
            reuse = 0;
        }
        j->n_gen = 0;
        j->n_fed = j->n_past = reuse;   /* the slot's rows below reuse are this prompt's already */
        s->n_kept[i] = 0;               /* overwritten from reuse on */
        if (reuse > 0) {
            atomic_fetch_add(&s->stats->prompt_cached, (uint_fast64_t)reuse);
            job_update(j, NULL, 0, set_cached, &reuse);
        }
        s->slot[i] = j;
        start_drafting(s, j, i);
        atomic_fetch_add(&s->stats->active, 1);
        atomic_fetch_add(&s->stats->admitted, 1);
    }
    s->n_waiting = kept;
    if (!taken) return;
    pthread_mutex_lock(&s->mu);
    s->n_queue -= taken;
    atomic_store(&s->stats->queued, s->n_queue);
    pthread_mutex_unlock(&s->mu);
}

/* A greedy job's row needs only its argmax, which an engine with
 * batch_argmax computes where the logits are (152k floats not read back).
 * Under a grammar too, where the engine can read a row later (read_row): the
 * argmax is what the grammar checks first, and the row is read only when the
 * grammar refuses it (sample_wanted). */
static void add_token(serve_sched *s, int64_t *n, int32_t tok, int seq, int64_t pos, bool want) {
    s->b_tok[*n] = tok;
    s->b_seq[*n] = seq;
    s->b_pos[*n] = (int32_t)pos;
    s->b_want[*n] = want;
    s->b_greedy[*n] = want && s->eng.batch_argmax && moex_sampler_is_greedy(s->slot[seq]->smp) &&
                      !s->slot[seq]->p.logprobs && !has_rules(s->slot[seq]) &&
                      (!s->slot[seq]->gs || s->eng.read_row);   /* these need the row on the host */
    s->b_spec[*n] = false;
    (*n)++;
}

/* A decoding job's drafts (up to *budget, fewer where its completion or the
 * context ends), as rows after its decode row at n - 1, all wanted. */
static void add_drafts(serve_sched *s, serve_job *j, int slot, int64_t *n, int *budget) {
    int k = j->k_cur < *budget ? j->k_cur : *budget;
    if (j->p.max_tokens > 0 && k > j->p.max_tokens - j->n_gen - 1) k = (int)(j->p.max_tokens - j->n_gen - 1);
    if (k > s->cfg.n_ctx - 1 - j->n_past) k = (int)(s->cfg.n_ctx - 1 - j->n_past);
    if (k > s->cfg.n_batch - *n) k = (int)(s->cfg.n_batch - *n);
    moex_error err = {0};
    const int nd = k > 0 ? moex_drafter_propose(j->drafter, j->prompt, j->n_prompt + j->n_gen, k, j->draft, j->q,
                                                &j->draft_sampled, &err)
                         : 0;
    if (nd < 0) moex_log(MOEX_LOG_WARN, "api: drafting failed (the step goes on without): %s", err.msg);
    j->n_draft = nd > 0 ? nd : 0;
    if (!j->n_draft) return;
    s->b_spec[*n - 1] = true;
    for (int d = 0; d < j->n_draft; d++) {
        add_token(s, n, j->draft[d], slot, j->n_past + 1 + d, true);
        s->b_spec[*n - 1] = true;
    }
    *budget -= j->n_draft;
}

/* Decoding sequences first (one token each, and their drafts while few
 * decode), then prompt chunks in slot order. */
static int64_t build_batch(serve_sched *s) {
    int64_t n = 0, n_decoding = 0;
    for (int i = 0; i < s->cfg.n_slots; i++) {
        serve_job *j = s->slot[i];
        if (j) j->n_draft = 0;
        n_decoding += j && j->n_fed == j->n_prompt;
    }
    const bool speculate = s->cfg.make_drafter && s->eng.forward_batch && n_decoding <= s->cfg.spec_max_slots;
    int drafts_left = MOEX_SPEC_MAX_DRAFT;
    for (int i = 0; i < s->cfg.n_slots; i++) {
        serve_job *j = s->slot[i];
        if (j && j->n_fed == j->n_prompt) {
            add_token(s, &n, j->last, i, j->n_past, true);
            if (speculate && j->drafter && drafts_left > 0) add_drafts(s, j, i, &n, &drafts_left);
        }
    }
    int64_t budget = s->cfg.n_batch - n;
    if (n_decoding && budget > s->cfg.prompt_chunk) budget = s->cfg.prompt_chunk;
    for (int i = 0; i < s->cfg.n_slots && budget > 0; i++) {
        serve_job *j = s->slot[i];
        if (!j || j->n_fed == j->n_prompt) continue;
        /* without forward_batch, one sequence per forward */
        if (!s->eng.forward_batch && n) break;
        int64_t take = j->n_prompt - j->n_fed;
        if (take > budget) take = budget;
        for (int64_t k = 0; k < take; k++) {
            const bool last = j->n_fed + k + 1 == j->n_prompt;
            add_token(s, &n, j->prompt[j->n_fed + k], i, j->n_fed + k, last);
        }
        budget -= take;
    }
    return n;
}

static int run_forward(serve_sched *s, int64_t n, moex_error *err) {
    if (s->eng.forward_batch) {
        const moex_batch b = {.n = n, .tokens = s->b_tok, .seq = s->b_seq, .pos = s->b_pos, .want_logits = s->b_want,
                              .argmax = s->eng.batch_argmax ? s->row_argmax : NULL, .argmax_only = s->b_greedy};
        return s->eng.forward_batch(s->eng.ctx, &b, s->logits, err);
    }
    /* one slot: the batch is one run of positions; the last row is the only one that can be wanted */
    return s->eng.forward(s->eng.ctx, s->b_tok, n, s->b_pos[0], false, s->logits, err);
}

#define GRAMMAR_STUCK (-2)   /* a row's token when its grammar allows no token of the vocabulary */
#define ROW_UNREAD (-3)      /* a row's token when its grammar refused the GPU's argmax and the row could not be read */

/* The pick when the job's grammar allows it, else a pick among the tokens it
 * allows (the others' logits -inf): the first pick is refused with
 * probability 1 - A (A: the allowed tokens' share), the second then follows
 * the allowed tokens' distribution, so a token is picked with probability
 * p / A, as if the row had been masked first, for the cost of one token's
 * check on most steps. Exact for greedy and plain temperature sampling; with
 * top_k / top_p / min_p the first pick is among the filtered tokens, so an
 * allowed token the filters drop comes only from the second pick (llama.cpp's
 * order, filters then grammar, does the same). */
static int32_t constrain(serve_sched *s, const serve_job *j, float *row, int32_t pick, int ith) {
    atomic_fetch_add_explicit(&s->stats->grammar_tokens, 1, memory_order_relaxed);
    /* with logprobs every row is masked: they are always of the distribution the grammar leaves */
    if (pick >= 0 && !j->p.logprobs && serve_grammar_allows(j->gs, s->gvocab, pick)) return pick;
    atomic_fetch_add_explicit(&s->stats->grammar_masks, 1, memory_order_relaxed);
    uint8_t *allowed = s->gmask + (size_t)ith * (size_t)s->m->hp.n_vocab;
    if (serve_grammar_mask(j->gs, s->gvocab, allowed) == 0) return GRAMMAR_STUCK;
    for (int32_t i = 0; i < s->m->hp.n_vocab; i++)
        if (!allowed[i]) row[i] = -INFINITY;
    return moex_sampler_sample(j->smp, row);
}

/* Rows ith, ith + nth, ...: each row's job samples it with its own sampler
 * (a slot has one wanted row a step), so rows are independent. */
typedef struct sample_job {
    serve_sched *s;
    int64_t n_rows;
} sample_job;

static void sample_rows(void *ctx, int ith, int nth) {
    const sample_job *sj = ctx;
    serve_sched *s = sj->s;
    for (int64_t r = ith; r < sj->n_rows; r += nth) {
        const int64_t t = s->row_tok[r];
        if (s->b_spec[t]) continue;   /* the acceptance rule's (after_forward) */
        const serve_job *j = s->slot[s->b_seq[t]];
        if (!s->b_greedy[t] && has_rules(j)) {   /* the generated tokens so far; the repeat window over the sequence */
            const int64_t n_seq = j->n_prompt + j->n_gen, last = j->p.repeat_last_n < n_seq ? j->p.repeat_last_n : n_seq;
            moex_logits_apply(s->logits + r * s->m->hp.n_vocab, s->m->hp.n_vocab, &j->p.rules, j->prompt + j->n_prompt,
                              j->n_gen, j->prompt + n_seq - last, last, s->counts + (size_t)ith * s->m->hp.n_vocab);
        }
        s->row_id[r] = s->b_greedy[t] ? s->row_argmax[r]
                                      : moex_sampler_sample(s->slot[s->b_seq[t]]->smp, s->logits + r * s->m->hp.n_vocab);
        if (j->gs && !s->b_greedy[t])   /* a greedy row left on the GPU was checked by refused_argmax */
            s->row_id[r] = constrain(s, j, s->logits + r * s->m->hp.n_vocab, s->row_id[r], ith);
    }
}

/* A greedy job under a grammar whose row stayed on the device: when the
 * grammar refuses the row's argmax, the row is read back and sampled on the
 * host (masked). A row that cannot be read fails its job (ROW_UNREAD). */
static void refused_argmax(serve_sched *s, int64_t t, int64_t row) {
    const serve_job *j = s->slot[s->b_seq[t]];
    const int32_t pick = s->row_argmax[row];
    if (pick >= 0 && serve_grammar_allows(j->gs, s->gvocab, pick)) {
        atomic_fetch_add_explicit(&s->stats->grammar_tokens, 1, memory_order_relaxed);
        return;
    }
    moex_error err = {0};
    if (s->eng.read_row(s->eng.ctx, row, s->logits + row * s->m->hp.n_vocab, &err)) {
        moex_log(MOEX_LOG_WARN, "api: reading a logits row back failed: %s", err.msg);
        s->row_argmax[row] = ROW_UNREAD;
        return;
    }
    s->b_greedy[t] = false;   /* sampled on the host, under the grammar (constrain counts it) */
}

/* Every wanted row sampled, on the pool when several are read back (a
 * greedy row on the host is an argmax over the vocabulary: ~0.15 ms for
 * 152k entries; with batch_argmax the engine has taken it). */
static void sample_wanted(serve_sched *s, int64_t n) {
    int64_t rows = 0, on_host = 0;
    for (int64_t t = 0; t < n; t++) {
        if (!s->b_want[t] || !s->slot[s->b_seq[t]]) continue;
        if (s->b_greedy[t] && s->slot[s->b_seq[t]]->gs) refused_argmax(s, t, rows);
        on_host += !s->b_greedy[t] && !s->b_spec[t];
        s->row_tok[rows++] = t;
    }
    sample_job sj = {.s = s, .n_rows = rows};
    if (on_host > 1 && s->cfg.pool) moex_pool_run(s->cfg.pool, sample_rows, &sj);
    else sample_rows(&sj, 0, 1);
}

/* Token id's log probability in a logits row and the row's k best (log-softmax, in double). */
static void logprob_of(const float *row, int32_t n_vocab, int32_t id, int k, serve_logprob *out) {
    float max = row[0];
    for (int32_t i = 1; i < n_vocab; i++) max = row[i] > max ? row[i] : max;
    double z = 0.0;
    for (int32_t i = 0; i < n_vocab; i++) z += exp((double)row[i] - max);
    const double lse = max + log(z);
    out->id = id;
    out->logprob = (float)(row[id] - lse);
    out->n_top = 0;
    for (int32_t i = 0; i < n_vocab && k > 0; i++) {   /* insertion into the k best so far (ties: the lower id) */
        if (!(row[i] > -INFINITY)) continue;             /* a token a grammar refused is no alternative */
        if (out->n_top == k && !(row[i] > row[out->top_id[k - 1]])) continue;
        int at = out->n_top < k ? out->n_top++ : k - 1;
        while (at > 0 && row[i] > row[out->top_id[at - 1]]) {
            out->top_id[at] = out->top_id[at - 1];
            at--;
        }
        out->top_id[at] = i;
    }
    for (int t = 0; t < out->n_top; t++) out->top_logprob[t] = (float)(row[out->top_id[t]] - lse);
}

/* The token's log probabilities for its client (under the job's lock, before its text goes out). */
static void note_logprob(serve_sched *s, serve_job *j, int32_t id, const float *row) {
    serve_logprob e;
    logprob_of(row, s->m->hp.n_vocab, id, j->p.top_logprobs, &e);
    pthread_mutex_lock(&j->mu);
    if (j->n_lp == j->cap_lp) {
        const size_t cap = j->cap_lp ? 2 * j->cap_lp : 16;
        serve_logprob *grown = realloc(j->lp, cap * sizeof *grown);
        if (grown) j->lp = grown, j->cap_lp = cap;
    }
    if (j->n_lp < j->cap_lp) j->lp[j->n_lp++] = e;
    pthread_mutex_unlock(&j->mu);
}

/* A generated token of the job in slot: counted, timed, into the sequence,
 * its text out. true when the job ended with it (its slot is then free and
 * j may be gone). */
static bool take_token(serve_sched *s, serve_job *j, int slot, int32_t id, const float *row, double now,
                       int64_t *n_gen) {
    if (id == ROW_UNREAD) {
        fail_job(s, j, 500, "server_error", "constrained sampling: a logits row could not be read back from the GPU");
        free_slot(s, slot);
        return true;
    }
    if (id != GRAMMAR_STUCK && (id < 0 || id >= s->m->hp.n_vocab)) { /* the engine's argmax found no finite logit */
        moex_log(MOEX_LOG_WARN, "api: a sequence's logits have no finite maximum (a broken model?)");
        fail_job(s, j, 500, "server_error", "generation failed: the logits have no finite maximum (a broken model?)");
        free_slot(s, slot);
        return true;
    }
    moex_error err = {0};
    if (id == GRAMMAR_STUCK || (j->gs && serve_grammar_accept(j->gs, s->gvocab, id, &err))) {
        char msg[sizeof err.msg + 96];
        snprintf(msg, sizeof msg, "constrained sampling: %s", id == GRAMMAR_STUCK ? "the grammar allows no token of "
                 "this model's vocabulary here (it asks for text the vocabulary cannot write)" : err.msg);
        fail_job(s, j, 500, "server_error", msg);
        free_slot(s, slot);
        return true;
    }
    const int64_t n_completion = ++j->n_gen;
    (*n_gen)++;
    j->prompt[j->n_prompt + n_completion - 1] = id;
    if (j->p.logprobs && row) note_logprob(s, j, id, row);
    if (n_completion == 1) serve_hist_observe(&s->stats->ttft, now - j->t_submit);
    else serve_hist_observe(&s->stats->per_token, now - j->t_last);
    j->t_last = now;
    j->last = id;
    const serve_finish f = on_token(s, j, id, n_completion);
    if (!f) return false;
    if (f == SERVE_FINISH_STOP) atomic_fetch_add(&s->stats->finished_stop, 1);
    else if (f == SERVE_FINISH_LENGTH) atomic_fetch_add(&s->stats->finished_length, 1);
    free_slot(s, slot);
    return true;
}

/* A speculating job's rows (its decode row at logits row `row`, then its
 * drafts'): the acceptance rule keeps a prefix of the drafts, whose KV rows
 * stay, and picks the token after them; the rows past it are written over
 * by the next step. */
static void take_verify(serve_sched *s, serve_job *j, int slot, int64_t t, int64_t row, double now, int64_t *n_gen) {
    const int nd = j->n_draft;
    const bool on_device = s->b_greedy[t];
    int32_t next;
    const int a = moex_spec_accept(j->smp, s->m->hp.n_vocab, on_device ? NULL : s->logits + row * s->m->hp.n_vocab,
                                   s->row_argmax + row, j->draft, nd, j->draft_sampled ? j->q : NULL,
                                   s->spec_scratch, &next);
    atomic_fetch_add(&s->stats->spec_verifies, 1);
    atomic_fetch_add(&s->stats->spec_drafted, (uint_fast64_t)nd);
    atomic_fetch_add(&s->stats->spec_accepted, (uint_fast64_t)a);
    atomic_fetch_add(&s->stats->spec_hist[a], 1);
    j->k_cur = moex_spec_next_length(j->k_cur, nd, a, s->cfg.draft_max);
    const int64_t fed = j->n_past;   /* the decode row's position */
    for (int i = 0; i <= a; i++) {
        j->n_past = fed + 1 + i;     /* filled: through the decode row and the drafts before this token */
        if (take_token(s, j, slot, i < a ? j->draft[i] : next, NULL, now, n_gen)) return;
    }
}

/* After the forward: positions advance; wanted rows are sampled. */
static void after_forward(serve_sched *s, int64_t n) {
    sample_wanted(s, n);
    const double now = moex_time_s();
    int64_t row = 0, n_prompt = 0, n_gen = 0;
    for (int64_t t = 0; t < n; t++) {
        const int slot = s->b_seq[t];
        serve_job *j = s->slot[slot];
        if (!j) continue; /* cannot happen: a slot's wanted rows are its last tokens here */
        if (s->b_spec[t]) {   /* its decode row, then its drafts' */
            const int nd = j->n_draft;
            take_verify(s, j, slot, t, row, now, &n_gen);
            row += 1 + nd;
            t += nd;
            continue;
        }
        j->n_past++;
        if (j->n_fed < j->n_prompt) j->n_fed++, n_prompt++;
        if (!s->b_want[t]) continue;
        const int64_t r = row++;
        take_token(s, j, slot, s->row_id[r], s->b_greedy[t] ? NULL : s->logits + r * s->m->hp.n_vocab, now, &n_gen);
    }
    atomic_fetch_add(&s->stats->prompt_tokens, (uint_fast64_t)n_prompt);
    atomic_fetch_add(&s->stats->generated_tokens, (uint_fast64_t)n_gen);
}

/* The forward failed: every job in it fails (500), the others go on. */
static void fail_batch(serve_sched *s, int64_t n, const char *why) {
    char msg[600];
    snprintf(msg, sizeof msg, "generation failed: %s", why);
    moex_log(MOEX_LOG_WARN, "api: %s", msg);
    for (int64_t t = 0; t < n; t++) {
        serve_job *j = s->slot[s->b_seq[t]];
        if (!j) continue;
        fail_job(s, j, 500, "server_error", msg);
        free_slot(s, s->b_seq[t]);
    }
}

static void step(serve_sched *s) {
    const double t_build = moex_time_s();
    const int64_t n = build_batch(s);
    if (!n) return;
    moex_error err = {0};
    const double t0 = moex_time_s();
    if (run_forward(s, n, &err)) {
        fail_batch(s, n, err.msg);
        return;
    }
    const double t1 = moex_time_s();
    serve_hist_observe(&s->stats->step_s, t1 - t0);
    moex_log(MOEX_LOG_DEBUG, "api step: %lld tokens, forward %.1f ms", (long long)n, (t1 - t0) * 1e3);
    atomic_fetch_add(&s->stats->steps, 1);
    atomic_fetch_add(&s->stats->step_tokens, (uint_fast64_t)n);
    after_forward(s, n);
    s->t_around += (t0 - t_build) + (moex_time_s() - t1);
}

static bool any_active(const serve_sched *s) {
    for (int i = 0; i < s->cfg.n_slots; i++)
        if (s->slot[i]) return true;
    return false;
}

static void fail_everything(serve_sched *s) {
    take_submitted(s, false);
    for (int i = 0; i < s->n_waiting; i++) {
        fail_job(s, s->waiting[i], 503, "server_error", "the server is shutting down");
        serve_job_unref(s->waiting[i]);
    }
    s->n_waiting = 0;
    for (int i = 0; i < s->cfg.n_slots; i++)
        if (s->slot[i]) {
            fail_job(s, s->slot[i], 503, "server_error", "the server is shutting down");
            free_slot(s, i);
        }
}

static void *sched_main(void *arg) {
    serve_sched *s = arg;
    for (;;) {
        const bool idle = !any_active(s) && s->n_waiting == 0;
        if (!take_submitted(s, idle)) break;
        drop_cancelled(s);
        admit(s);
        step(s);
    }
    fail_everything(s);
    /* where the scheduler's time went: the host's share is what the GPU waits on between steps */
    moex_log(MOEX_LOG_INFO, "api scheduler: %llu steps, %.3f s in forwards, %.3f s building batches and taking tokens",
             (unsigned long long)atomic_load(&s->stats->steps), atomic_load(&s->stats->step_s.sum), s->t_around);
    return NULL;
}

static const double ttft_bounds[SERVE_HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                     1,     2.5,  5,     10,   30,  60,  120};
static const double token_bounds[SERVE_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06,
                                                      0.1,   0.15,   0.25,  0.5,  1,    2.5,  5};

void serve_sched_stop(serve_sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->started) pthread_join(s->thread, NULL);
    s->started = false;
}

void serve_sched_free(serve_sched *s) {
    if (!s) return;
    serve_sched_stop(s);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->slot);
    free(s->waiting);
    free(s->b_tok);
    free(s->b_seq);
    free(s->b_pos);
    free(s->b_want);
    free(s->b_greedy);
    free(s->b_spec);
    free(s->spec_scratch);
    free(s->counts);
    serve_grammar_vocab_free(s->gvocab);
    free(s->gmask);
    free(s->kept);
    free(s->n_kept);
    free(s->row_argmax);
    free(s->row_id);
    free(s->row_tok);
    free(s->logits);
    free(s);
}

serve_sched *serve_sched_start(const moex_model *m, const moex_engine *eng, const serve_sched_config *cfg,
                           serve_sched_stats *stats, moex_error *err) {
    const int max_slots = eng->forward_batch ? (eng->n_seq > 0 ? eng->n_seq : 1) : 1;
    if (cfg->n_slots < 1 || cfg->n_slots > max_slots) {
        moex_fail(err, "%d parallel sequences, but the engine has %d KV slot(s)%s", cfg->n_slots, max_slots,
                  eng->forward_batch ? "" : " (this backend decodes one sequence at a time: use --parallel 1)");
        return NULL;
    }
    if (cfg->n_ctx < 2 || cfg->n_ctx > eng->n_ctx || cfg->n_batch < cfg->n_slots || cfg->n_batch > eng->n_batch) {
        moex_fail(err, "context %lld (engine %lld) and batch %lld (engine %lld, at least one per slot) do not fit",
                  (long long)cfg->n_ctx, (long long)eng->n_ctx, (long long)cfg->n_batch, (long long)eng->n_batch);
        return NULL;
    }
    serve_sched *s = calloc(1, sizeof *s);
    if (!s) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    s->m = m;
    s->eng = *eng;
    s->cfg = *cfg;
    if (s->cfg.prompt_chunk < 1) s->cfg.prompt_chunk = 1;
    if (s->cfg.draft_max < 1 || s->cfg.draft_max > MOEX_SPEC_MAX_DRAFT) s->cfg.draft_max = MOEX_SPEC_MAX_DRAFT;
    s->stats = stats;
    stats->ttft.bounds = ttft_bounds;
    stats->per_token.bounds = token_bounds;
    stats->step_s.bounds = token_bounds;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    const size_t nb = (size_t)cfg->n_batch;
    s->slot = calloc((size_t)cfg->n_slots, sizeof *s->slot);
    s->b_tok = malloc(nb * sizeof *s->b_tok);
    s->b_seq = malloc(nb * sizeof *s->b_seq);
    s->b_pos = malloc(nb * sizeof *s->b_pos);
    s->b_want = malloc(nb * sizeof *s->b_want);
    s->b_greedy = malloc(nb * sizeof *s->b_greedy);
    s->b_spec = malloc(nb * sizeof *s->b_spec);
    s->max_rows = cfg->n_slots + (cfg->make_drafter ? MOEX_SPEC_MAX_DRAFT : 0);
    if (s->max_rows > cfg->n_batch) s->max_rows = cfg->n_batch;
    const size_t ns = (size_t)s->max_rows;
    s->logits = malloc(ns * (size_t)m->hp.n_vocab * sizeof *s->logits);
    s->row_argmax = malloc(ns * sizeof *s->row_argmax);
    s->row_id = malloc(ns * sizeof *s->row_id);
    s->row_tok = malloc(ns * sizeof *s->row_tok);
    s->spec_scratch = cfg->make_drafter ? malloc((size_t)m->hp.n_vocab * sizeof *s->spec_scratch) : NULL;
    s->kept = malloc((size_t)cfg->n_slots * (size_t)cfg->n_ctx * sizeof *s->kept);
    s->counts = calloc((size_t)(cfg->pool ? moex_pool_size(cfg->pool) : 1) * (size_t)m->hp.n_vocab, sizeof *s->counts);
    s->n_kept = calloc((size_t)cfg->n_slots, sizeof *s->n_kept);
    if (!s->slot || !s->b_tok || !s->b_seq || !s->b_pos || !s->b_want || !s->b_greedy || !s->b_spec || !s->logits ||
        !s->row_argmax || !s->row_id || !s->row_tok || (cfg->make_drafter && !s->spec_scratch) || !s->kept ||
        !s->n_kept || !s->counts) {
        moex_fail(err, "out of memory for %d slots", cfg->n_slots);
        serve_sched_free(s);
        return NULL;
    }
    if (pthread_create(&s->thread, NULL, sched_main, s)) {
        moex_fail(err, "cannot start the scheduler thread");
        serve_sched_free(s);
        return NULL;
    }
    s->started = true;
    return s;
}

int serve_sched_submit(serve_sched *s, serve_job *j, moex_error *err) {
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        return moex_fail(err, "the server is shutting down");
    }
    if (s->n_queue >= s->cfg.max_queue) {
        pthread_mutex_unlock(&s->mu);
        return moex_fail(err, "%d requests are waiting already: try again later", s->cfg.max_queue);
    }
    serve_job_ref(j);
    j->t_submit = moex_time_s();
    if (s->queue_tail) s->queue_tail->next = j;
    else s->queue_head = j;
    s->queue_tail = j;
    s->n_queue++;
    atomic_store(&s->stats->queued, s->n_queue);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

const serve_sched_config *serve_sched_config_of(const serve_sched *s) { return &s->cfg; }
