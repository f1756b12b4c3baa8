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
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hub/scheduler.h"

#define MAX_PENDING_TEXT (4u << 20) /* text a client has not taken; past it the client is not reading */

struct hub_job {
    pthread_mutex_t mu;
    atomic_int refs;
    atomic_bool cancelled;
    hub_job_params p;
    hub_job_notify_fn notify;
    void *notify_ctx;
    void *user;                  /* network thread only */
    hub_job *next;               /* the scheduler's queue */
    /* scheduler thread only */
    int32_t *prompt;
    int64_t n_prompt, n_fed;     /* prompt tokens, how many are in the KV slot */
    int64_t n_past;              /* positions filled */
    int64_t n_gen;               /* tokens sampled */
    int32_t last;                /* the token to feed next (decoding) */
    moex_sampler *smp;
    char *held;                  /* text not yet released: may start a stop sequence or end mid-UTF-8 */
    size_t held_len, held_cap;
    double t_submit, t_last;
    /* shared, under mu */
    char *out;
    size_t out_len, out_cap;
    hub_job_state st;
};

/* ---- histograms ---- */

void hub_hist_observe(hub_hist *h, double v) {
    int b = 0;
    while (b < HUB_HIST_BUCKETS && v > h->bounds[b]) b++;
    atomic_fetch_add_explicit(&h->count[b], 1, memory_order_relaxed);
    atomic_store_explicit(&h->sum, atomic_load_explicit(&h->sum, memory_order_relaxed) + v, memory_order_relaxed);
}

/* ---- jobs ---- */

hub_job *hub_job_create(hub_job_params *p, hub_job_notify_fn notify, void *notify_ctx) {
    hub_job *j = calloc(1, sizeof *j);
    if (!j) {
        free(p->prompt_text);
        free(p->prompt_tokens);
        for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
        return NULL;
    }
    pthread_mutex_init(&j->mu, NULL);
    atomic_init(&j->refs, 1);
    atomic_init(&j->cancelled, false);
    j->p = *p;
    j->notify = notify;
    j->notify_ctx = notify_ctx;
    j->t_submit = moex_time_s();
    return j;
}

void hub_job_ref(hub_job *j) { atomic_fetch_add(&j->refs, 1); }

void hub_job_unref(hub_job *j) {
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
    free(j->p.prompt_text);
    free(j->p.prompt_tokens);
    for (int i = 0; i < j->p.n_stop; i++) free(j->p.stop[i]);
    free(j->prompt);
    moex_sampler_free(j->smp);
    free(j->held);
    free(j->out);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

void hub_job_cancel(hub_job *j) { atomic_store(&j->cancelled, true); }

size_t hub_job_take(hub_job *j, char **text, hub_job_state *st) {
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

void hub_job_set_user(hub_job *j, void *user) { j->user = user; }
void *hub_job_user(const hub_job *j) { return j->user; }

/* ---- the scheduler ---- */

struct hub_sched {
    const moex_model *m;
    moex_engine eng;
    hub_sched_config cfg;
    hub_sched_stats *stats;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;          /* the queue and stop */
    pthread_cond_t cv;
    bool stop;
    hub_job *queue_head, *queue_tail;   /* submitted, not yet taken by the thread */
    int n_queue;
    /* thread only */
    hub_job **slot;              /* [n_slots] the job in each KV slot */
    hub_job **waiting;           /* tokenized, waiting for a slot, in arrival order */
    int n_waiting, cap_waiting;
    int32_t *b_tok, *b_seq, *b_pos;
    bool *b_want;
    bool *b_greedy;              /* [n_batch] wanted rows whose argmax is the token (engines with batch_argmax) */
    float *logits;               /* [n_slots x n_vocab] */
    int32_t *row_argmax;         /* [n_slots] each logits row's argmax, from the engine (batch_argmax) */
    int32_t *row_id;             /* [n_slots] the token sampled from each logits row */
    int64_t *row_tok;            /* [n_slots] each logits row's token in the batch */
    double t_around;             /* seconds building batches and taking their tokens (the forwards: stats->step_s) */
};

/* Publishes a state change and tells the submitter. */
static void job_update(hub_job *j, const char *text, size_t len, void (*change)(hub_job_state *st, void *arg),
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

static void set_failed(hub_job_state *st, void *arg) {
    const failure *f = arg;
    st->done = true;
    st->finish = HUB_FINISH_ERROR;
    st->http_status = f->status;
    st->error_code = f->code;
    snprintf(st->error, sizeof st->error, "%s", f->msg);
}

static void set_accepted(hub_job_state *st, void *arg) {
    st->accepted = true;
    st->n_prompt = *(const int64_t *)arg;
}

typedef struct progress {
    int64_t n_completion;
    hub_finish finish;
} progress;

static void set_progress(hub_job_state *st, void *arg) {
    const progress *p = arg;
    st->n_completion = p->n_completion;
    if (p->finish) {
        st->done = true;
        st->finish = p->finish;
    }
}

static void fail_job(hub_sched *s, hub_job *j, int status, const char *code, const char *msg) {
    failure f = {status, code, msg};
    atomic_fetch_add(status == 400 ? &s->stats->rejected : &s->stats->failed, 1);
    job_update(j, NULL, 0, set_failed, &f);
}

static void free_slot(hub_sched *s, int slot) {
    hub_job *j = s->slot[slot];
    s->slot[slot] = NULL;
    atomic_fetch_sub(&s->stats->active, 1);
    hub_job_unref(j);
}

/* ---- text out ---- */

/* Bytes at the end of s[0..n) that begin a UTF-8 sequence not yet complete. */
static size_t utf8_incomplete_tail(const char *s, size_t n) {
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        const unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation: look further back */
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

/* The longest suffix of s[0..n) that is a proper prefix of a stop sequence. */
static size_t stop_prefix_tail(const hub_job *j, const char *s, size_t n) {
    size_t keep = 0;
    for (int i = 0; i < j->p.n_stop; i++) {
        const size_t k = strlen(j->p.stop[i]);
        for (size_t len = k - 1 < n ? k - 1 : n; len > keep; len--)
            if (!memcmp(s + n - len, j->p.stop[i], len)) {
                keep = len;
                break;
            }
    }
    return keep;
}

/* The first stop sequence in s[0..n): its offset, or -1. */
static long find_stop(const hub_job *j, const char *s, size_t n) {
    long best = -1;
    for (int i = 0; i < j->p.n_stop; i++) {
        const size_t k = strlen(j->p.stop[i]);
        for (size_t at = 0; at + k <= n; at++)
            if (!memcmp(s + at, j->p.stop[i], k)) {
                if (best < 0 || (long)at < best) best = (long)at;
                break;
            }
    }
    return best;
}

/* The bytes at s[0..n) that begin a UTF-8 sequence: *valid says whether
 * they are a whole, valid one; otherwise they are its longest valid prefix
 * (at least one byte), which one U+FFFD replaces, as the Unicode standard
 * recommends (browsers, Python and TextDecoder do the same). */
static size_t utf8_span(const unsigned char *s, size_t n, bool *valid) {
    const unsigned char c = s[0];
    *valid = c < 0x80;
    if (c < 0x80) return 1;
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) need = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) need = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return 1;
    size_t k = 1;
    for (; k < need && k < n; k++) {
        const unsigned char b = s[k];
        if (k == 1 ? b < lo || b > hi : (b & 0xC0) != 0x80) break;
    }
    *valid = k == need;
    return k;
}

/* s[0..n) with each invalid part replaced by U+FFFD (clients parse the text
 * as JSON strings). out holds 3 * n bytes. */
static size_t utf8_sanitize(const char *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        bool valid;
        const size_t k = utf8_span((const unsigned char *)s + i, n - i, &valid);
        if (valid) {
            memcpy(out + o, s + i, k);
            o += k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
        }
        i += k;
    }
    return o;
}

static int held_append(hub_job *j, const char *piece, size_t n) {
    if (j->held_len + n > j->held_cap) {
        size_t cap = j->held_cap ? j->held_cap : 64;
        while (cap < j->held_len + n) cap *= 2;
        char *grown = realloc(j->held, cap);
        if (!grown) return -1;
        j->held = grown;
        j->held_cap = cap;
    }
    memcpy(j->held + j->held_len, piece, n);
    j->held_len += n;
    return 0;
}

/* Releases what can no longer be part of a stop sequence (or, at the end,
 * everything); returns true when a stop sequence was found (the text ends
 * before it). */
static bool release_text(hub_job *j, bool final, size_t *n_out) {
    const long at = find_stop(j, j->held, j->held_len);
    if (at >= 0) {
        *n_out = (size_t)at;
        return true;
    }
    size_t keep = final ? 0 : stop_prefix_tail(j, j->held, j->held_len);
    if (!final) {
        const size_t partial = utf8_incomplete_tail(j->held, j->held_len - keep);
        keep += partial;
    }
    *n_out = j->held_len - keep;
    return false;
}

static int piece_of(const moex_model *m, int32_t id, char *buf, int cap, char **big) {
    int n = moex_token_to_piece(m->tok, id, false, buf, cap);
    if (n <= cap) return n;
    *big = malloc((size_t)n);
    if (!*big || moex_token_to_piece(m->tok, id, false, *big, n) != n) return -1;
    return n;
}

/* A sampled token: text out, then whether the job is finished. */
static hub_finish on_token(hub_sched *s, hub_job *j, int32_t id, int64_t n_completion) {
    const moex_model *m = s->m;
    const bool eog = !j->p.ignore_eos && m->tok && moex_tokenizer_is_eog(m->tok, id);
    hub_finish finish = HUB_FINISH_NONE;
    if (eog) {
        finish = HUB_FINISH_STOP;
    } else if (m->tok) {
        char buf[256], *big = NULL;
        const int n = piece_of(m, id, buf, sizeof buf, &big);
        const bool oom = n < 0 || (n > 0 && held_append(j, big ? big : buf, (size_t)n));
        free(big);
        if (oom) {
            fail_job(s, j, 500, "server_error", "out of memory for the completion's text");
            return HUB_FINISH_ERROR;
        }
    }
    if (!finish && j->p.max_tokens > 0 && n_completion >= j->p.max_tokens) finish = HUB_FINISH_LENGTH;
    if (!finish && j->n_past + 1 > s->cfg.n_ctx) finish = HUB_FINISH_LENGTH; /* no room to feed it */
    size_t n_out = 0;
    const bool stopped = release_text(j, finish != HUB_FINISH_NONE, &n_out);
    if (stopped) finish = HUB_FINISH_STOP;
    progress pr = {n_completion, finish};
    char *clean = n_out ? malloc(3 * n_out) : NULL;
    if (n_out && !clean) {
        fail_job(s, j, 500, "server_error", "out of memory for the completion's text");
        return HUB_FINISH_ERROR;
    }
    job_update(j, clean, clean ? utf8_sanitize(j->held, n_out, clean) : 0, set_progress, &pr);
    free(clean);
    memmove(j->held, j->held + n_out, j->held_len - n_out);
    j->held_len -= n_out;
    return finish;
}

/* ---- steps ---- */

static int64_t tokenize(const moex_model *m, const hub_job *j, int32_t **out, moex_error *err) {
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

/* A new job: its prompt in tokens, checked against the context; its sampler. */
static bool prepare(hub_sched *s, hub_job *j) {
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
    if (!(j->smp = moex_sampler_create(&j->p.sp, s->m->hp.n_vocab))) {
        fail_job(s, j, 500, "server_error", "out of memory for a sampler");
        return false;
    }
    job_update(j, NULL, 0, set_accepted, &j->n_prompt);
    return true;
}

/* Moves submitted jobs to the waiting list (tokenized). false: stopping. */
static bool take_submitted(hub_sched *s, bool block) {
    pthread_mutex_lock(&s->mu);
    while (block && !s->stop && !s->queue_head) pthread_cond_wait(&s->cv, &s->mu);
    hub_job *list = s->queue_head;
    s->queue_head = s->queue_tail = NULL;
    const bool stop = s->stop;
    pthread_mutex_unlock(&s->mu);
    for (hub_job *j = list, *next; j; j = next) {
        next = j->next;
        j->next = NULL;
        if (s->n_waiting == s->cap_waiting) {
            const int cap = s->cap_waiting ? 2 * s->cap_waiting : 16;
            hub_job **grown = realloc(s->waiting, (size_t)cap * sizeof *grown);
            if (!grown) {
                fail_job(s, j, 503, "server_error", "out of memory for the queue");
                hub_job_unref(j);
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
            hub_job_unref(j);
            continue;
        }
        s->waiting[s->n_waiting++] = j;
    }
    return !stop;
}

static void drop_cancelled(hub_sched *s) {
    for (int i = 0; i < s->cfg.n_slots; i++)
        if (s->slot[i] && atomic_load(&s->slot[i]->cancelled)) {
            atomic_fetch_add(&s->stats->cancelled, 1);
            free_slot(s, i);
        }
    int kept = 0;
    for (int i = 0; i < s->n_waiting; i++) {
        if (atomic_load(&s->waiting[i]->cancelled)) {
            atomic_fetch_add(&s->stats->cancelled, 1);
            hub_job_unref(s->waiting[i]);
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

static void admit(hub_sched *s) {
    int taken = 0;
    for (int i = 0; i < s->cfg.n_slots && taken < s->n_waiting; i++) {
        if (s->slot[i]) continue;
        hub_job *j = s->waiting[taken++];
        j->n_fed = j->n_past = j->n_gen = 0;
        s->slot[i] = j;
        atomic_fetch_add(&s->stats->active, 1);
        atomic_fetch_add(&s->stats->admitted, 1);
    }
    if (!taken) return;
    memmove(s->waiting, s->waiting + taken, (size_t)(s->n_waiting - taken) * sizeof *s->waiting);
    s->n_waiting -= taken;
    pthread_mutex_lock(&s->mu);
    s->n_queue -= taken;
    atomic_store(&s->stats->queued, s->n_queue);
    pthread_mutex_unlock(&s->mu);
}

/* A greedy job's row needs only its argmax, which an engine with
 * batch_argmax computes where the logits are (152k floats not read back). */
static void add_token(hub_sched *s, int64_t *n, int32_t tok, int seq, int64_t pos, bool want) {
    s->b_tok[*n] = tok;
    s->b_seq[*n] = seq;
    s->b_pos[*n] = (int32_t)pos;
    s->b_want[*n] = want;
    s->b_greedy[*n] = want && s->eng.batch_argmax && moex_sampler_is_greedy(s->slot[seq]->smp);
    (*n)++;
}

/* Decoding sequences first (one token each), then prompt chunks in slot order. */
static int64_t build_batch(hub_sched *s) {
    int64_t n = 0, n_decoding = 0;
    for (int i = 0; i < s->cfg.n_slots; i++) {
        hub_job *j = s->slot[i];
        if (j && j->n_fed == j->n_prompt) {
            add_token(s, &n, j->last, i, j->n_past, true);
            n_decoding++;
        }
    }
    int64_t budget = s->cfg.n_batch - n;
    if (n_decoding && budget > s->cfg.prompt_chunk) budget = s->cfg.prompt_chunk;
    for (int i = 0; i < s->cfg.n_slots && budget > 0; i++) {
        hub_job *j = s->slot[i];
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

static int run_forward(hub_sched *s, int64_t n, moex_error *err) {
    if (s->eng.forward_batch) {
        const moex_batch b = {.n = n, .tokens = s->b_tok, .seq = s->b_seq, .pos = s->b_pos, .want_logits = s->b_want,
                              .argmax = s->eng.batch_argmax ? s->row_argmax : NULL, .argmax_only = s->b_greedy};
        return s->eng.forward_batch(s->eng.ctx, &b, s->logits, err);
    }
    /* one slot: the batch is one run of positions; the last row is the only one that can be wanted */
    return s->eng.forward(s->eng.ctx, s->b_tok, n, s->b_pos[0], false, s->logits, err);
}

static int slot_of(const hub_sched *s, const hub_job *j) {
    for (int i = 0; i < s->cfg.n_slots; i++)
        if (s->slot[i] == j) return i;
    return -1;
}

/* Rows ith, ith + nth, ...: each row's job samples it with its own sampler
 * (a slot has one wanted row a step), so rows are independent. */
typedef struct sample_job {
    hub_sched *s;
    int64_t n_rows;
} sample_job;

static void sample_rows(void *ctx, int ith, int nth) {
    const sample_job *sj = ctx;
    hub_sched *s = sj->s;
    for (int64_t r = ith; r < sj->n_rows; r += nth) {
        const int64_t t = s->row_tok[r];
        s->row_id[r] = s->b_greedy[t] ? s->row_argmax[r]
                                      : moex_sampler_sample(s->slot[s->b_seq[t]]->smp, s->logits + r * s->m->hp.n_vocab);
    }
}

/* Every wanted row sampled, on the pool when several are read back (a
 * greedy row on the host is an argmax over the vocabulary: ~0.15 ms for
 * 152k entries; with batch_argmax the engine has taken it). */
static void sample_wanted(hub_sched *s, int64_t n) {
    int64_t rows = 0, on_host = 0;
    for (int64_t t = 0; t < n; t++) {
        if (!s->b_want[t] || !s->slot[s->b_seq[t]]) continue;
        on_host += !s->b_greedy[t];
        s->row_tok[rows++] = t;
    }
    sample_job sj = {.s = s, .n_rows = rows};
    if (on_host > 1 && s->cfg.pool) moex_pool_run(s->cfg.pool, sample_rows, &sj);
    else sample_rows(&sj, 0, 1);
}

/* After the forward: positions advance; wanted rows are sampled. */
static void after_forward(hub_sched *s, int64_t n) {
    sample_wanted(s, n);
    const double now = moex_time_s();
    int64_t row = 0, n_prompt = 0, n_gen = 0;
    for (int64_t t = 0; t < n; t++) {
        hub_job *j = s->slot[s->b_seq[t]];
        if (!j) continue; /* cannot happen: a slot's wanted row is its last token here */
        j->n_past++;
        if (j->n_fed < j->n_prompt) j->n_fed++, n_prompt++;
        if (!s->b_want[t]) continue;
        const int32_t id = s->row_id[row++];
        if (id < 0 || id >= s->m->hp.n_vocab) { /* the engine's argmax found no finite logit */
            moex_log(MOEX_LOG_WARN, "api: a sequence's logits have no finite maximum (a broken model?)");
            fail_job(s, j, 500, "server_error", "generation failed: the logits have no finite maximum (a broken model?)");
            free_slot(s, s->b_seq[t]);
            continue;
        }
        const int64_t n_completion = ++j->n_gen;
        n_gen++;
        if (n_completion == 1) hub_hist_observe(&s->stats->ttft, now - j->t_submit);
        else hub_hist_observe(&s->stats->per_token, now - j->t_last);
        j->t_last = now;
        j->last = id;
        const hub_finish f = on_token(s, j, id, n_completion);
        if (f) {
            if (f == HUB_FINISH_STOP) atomic_fetch_add(&s->stats->finished_stop, 1);
            else if (f == HUB_FINISH_LENGTH) atomic_fetch_add(&s->stats->finished_length, 1);
            free_slot(s, slot_of(s, j));
        }
    }
    atomic_fetch_add(&s->stats->prompt_tokens, (uint_fast64_t)n_prompt);
    atomic_fetch_add(&s->stats->generated_tokens, (uint_fast64_t)n_gen);
}

/* The forward failed: every job in it fails (500), the others go on. */
static void fail_batch(hub_sched *s, int64_t n, const char *why) {
    char msg[600];
    snprintf(msg, sizeof msg, "generation failed: %s", why);
    moex_log(MOEX_LOG_WARN, "api: %s", msg);
    for (int64_t t = 0; t < n; t++) {
        hub_job *j = s->slot[s->b_seq[t]];
        if (!j) continue;
        fail_job(s, j, 500, "server_error", msg);
        free_slot(s, s->b_seq[t]);
    }
}

static void step(hub_sched *s) {
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
    hub_hist_observe(&s->stats->step_s, t1 - t0);
    moex_log(MOEX_LOG_DEBUG, "api step: %lld tokens, forward %.1f ms", (long long)n, (t1 - t0) * 1e3);
    atomic_fetch_add(&s->stats->steps, 1);
    atomic_fetch_add(&s->stats->step_tokens, (uint_fast64_t)n);
    after_forward(s, n);
    s->t_around += (t0 - t_build) + (moex_time_s() - t1);
}

static bool any_active(const hub_sched *s) {
    for (int i = 0; i < s->cfg.n_slots; i++)
        if (s->slot[i]) return true;
    return false;
}

static void fail_everything(hub_sched *s) {
    take_submitted(s, false);
    for (int i = 0; i < s->n_waiting; i++) {
        fail_job(s, s->waiting[i], 503, "server_error", "the server is shutting down");
        hub_job_unref(s->waiting[i]);
    }
    s->n_waiting = 0;
    for (int i = 0; i < s->cfg.n_slots; i++)
        if (s->slot[i]) {
            fail_job(s, s->slot[i], 503, "server_error", "the server is shutting down");
            free_slot(s, i);
        }
}

static void *sched_main(void *arg) {
    hub_sched *s = arg;
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

static const double ttft_bounds[HUB_HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                     1,     2.5,  5,     10,   30,  60,  120};
static const double token_bounds[HUB_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06,
                                                      0.1,   0.15,   0.25,  0.5,  1,    2.5,  5};

void hub_sched_stop(hub_sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->started) pthread_join(s->thread, NULL);
    s->started = false;
}

void hub_sched_free(hub_sched *s) {
    if (!s) return;
    hub_sched_stop(s);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->slot);
    free(s->waiting);
    free(s->b_tok);
    free(s->b_seq);
    free(s->b_pos);
    free(s->b_want);
    free(s->b_greedy);
    free(s->row_argmax);
    free(s->row_id);
    free(s->row_tok);
    free(s->logits);
    free(s);
}

hub_sched *hub_sched_start(const moex_model *m, const moex_engine *eng, const hub_sched_config *cfg,
                           hub_sched_stats *stats, moex_error *err) {
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
    hub_sched *s = calloc(1, sizeof *s);
    if (!s) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    s->m = m;
    s->eng = *eng;
    s->cfg = *cfg;
    if (s->cfg.prompt_chunk < 1) s->cfg.prompt_chunk = 1;
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
    s->logits = malloc((size_t)cfg->n_slots * (size_t)m->hp.n_vocab * sizeof *s->logits);
    const size_t ns = (size_t)cfg->n_slots;
    s->row_argmax = malloc(ns * sizeof *s->row_argmax);
    s->row_id = malloc(ns * sizeof *s->row_id);
    s->row_tok = malloc(ns * sizeof *s->row_tok);
    if (!s->slot || !s->b_tok || !s->b_seq || !s->b_pos || !s->b_want || !s->b_greedy || !s->logits ||
        !s->row_argmax || !s->row_id || !s->row_tok) {
        moex_fail(err, "out of memory for %d slots", cfg->n_slots);
        hub_sched_free(s);
        return NULL;
    }
    if (pthread_create(&s->thread, NULL, sched_main, s)) {
        moex_fail(err, "cannot start the scheduler thread");
        hub_sched_free(s);
        return NULL;
    }
    s->started = true;
    return s;
}

int hub_sched_submit(hub_sched *s, hub_job *j, moex_error *err) {
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        return moex_fail(err, "the server is shutting down");
    }
    if (s->n_queue >= s->cfg.max_queue) {
        pthread_mutex_unlock(&s->mu);
        return moex_fail(err, "%d requests are waiting already: try again later", s->cfg.max_queue);
    }
    hub_job_ref(j);
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

const hub_sched_config *hub_sched_config_of(const hub_sched *s) { return &s->cfg; }
