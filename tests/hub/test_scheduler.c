/* The scheduler (serve/scheduler.c) over a scripted engine: the engine's
 * greedy next token at (slot, position) is a script chosen by the slot's
 * first prompt token, so every job's text is known in advance. Checked:
 * text, stop sequences across tokens, UTF-8 held back across tokens and
 * invalid bytes replaced; every forward carries one token of each decoding
 * sequence and prompt chunks within --prompt-chunk, positions in order per
 * slot; concurrent jobs equal their runs alone; a cancelled job frees its
 * slot and the next job rewrites it from position 0; the context's end; a
 * failing forward; a full queue; a grammar's rows read back only where it
 * refuses the engine's argmax. The rows are sampled on a thread pool.
 *
 * usage: test_scheduler QWEN2_VOCAB.gguf */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/scheduler.h"
#include "tests/test_util.h"

#define MAX_SLOTS 8
#define MAX_SCRIPTS 16
#define N_CTX 64

typedef struct script {
    int32_t first;               /* the prompt's first token selects it */
    int32_t next[64];            /* the token predicted for position p is next[p - prompt_len] */
    int n, prompt_len;
} script;

typedef struct fake_engine {
    pthread_mutex_t mu;
    int32_t n_vocab;
    script scripts[MAX_SCRIPTS];
    int n_scripts;
    int32_t first[MAX_SLOTS];    /* each slot's token at position 0 */
    int32_t last_pos[MAX_SLOTS]; /* the last position written, -1: none */
    /* what the forwards looked like */
    int calls, bad_order, fail_next, delay_ms;
    int64_t max_prompt_tokens_beside_decode;
    bool decoding[MAX_SLOTS];    /* the slot's prompt has ended: its tokens are decode tokens */
    int rewinds[MAX_SLOTS];      /* a job starting past position 0 over an earlier job's rows (the prompt cache) */
    /* batch_argmax: the engine gives each row's argmax and leaves argmax_only rows NaN */
    bool batch_argmax;
    int32_t broken_first;        /* a sequence starting with it has no finite maximum (argmax -1) */
    int argmax_only_rows;
    int zero_pos_writes[MAX_SLOTS];
    int32_t row_next[64];        /* the last forward's wanted rows: each one's scripted token (read_row rebuilds the row) */
    int64_t n_rows;
    int rows_read;               /* rows read afterwards (read_row) */
} fake_engine;

static fake_engine fk;

static const script *script_of(int32_t first) {
    for (int i = 0; i < fk.n_scripts; i++)
        if (fk.scripts[i].first == first) return &fk.scripts[i];
    return NULL;
}

static int fake_forward_batch(void *ctx, const moex_batch *b, float *logits, moex_error *err) {
    pthread_mutex_lock(&fk.mu);
    fk.calls++;
    if (fk.fail_next) {
        fk.fail_next = 0;
        pthread_mutex_unlock(&fk.mu);
        return moex_fail(err, "injected failure");
    }
    if (fk.delay_ms) {
        struct timespec ts = {0, fk.delay_ms * 1000000L};
        nanosleep(&ts, NULL);
    }
    bool any_decoding = false;
    int64_t prompt_tokens = 0;
    int64_t row = 0;
    for (int64_t t = 0; t < b->n; t++) {
        const int s = b->seq[t];
        if (b->pos[t] == 0) fk.first[s] = b->tokens[t], fk.zero_pos_writes[s]++, fk.decoding[s] = false;
        else if (b->pos[t] > fk.last_pos[s] + 1) fk.bad_order++;
        else if (b->pos[t] <= fk.last_pos[s]) fk.decoding[s] = false, fk.rewinds[s]++;   /* a prompt-cache restart */
        fk.last_pos[s] = b->pos[t];
        if (fk.decoding[s]) any_decoding = true;
        else prompt_tokens++;
        if (!b->want_logits[t]) continue;
        float *row_p = logits + row * fk.n_vocab;
        const script *sc = script_of(fk.first[s]);
        const int k = b->pos[t] + 1 - (sc ? sc->prompt_len : 0);
        const int32_t next = sc && k >= 0 && k < sc->n ? sc->next[k] : 220 /* a space */;
        if (b->argmax) b->argmax[row] = fk.first[s] == fk.broken_first ? -1 : next;
        fk.row_next[row] = next;
        row++;
        if (b->argmax && b->argmax_only && b->argmax_only[t]) {
            for (int32_t v = 0; v < fk.n_vocab; v++) row_p[v] = NAN;
            fk.argmax_only_rows++;
            continue;
        }
        for (int32_t v = 0; v < fk.n_vocab; v++) row_p[v] = -1.0f;
        row_p[next] = 1.0f;
    }
    fk.n_rows = row;
    if (any_decoding && prompt_tokens > fk.max_prompt_tokens_beside_decode)
        fk.max_prompt_tokens_beside_decode = prompt_tokens;
    /* a slot decodes from the forward after the one with its prompt's last token */
    for (int64_t t = 0; t < b->n; t++)
        if (b->want_logits[t]) fk.decoding[b->seq[t]] = true;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}

/* moex_engine.read_row: the row as the forward would have written it. */
static int fake_read_row(void *ctx, int64_t row, float *out, moex_error *err) {
    pthread_mutex_lock(&fk.mu);
    const bool ok = row >= 0 && row < fk.n_rows;
    if (ok) {
        for (int32_t v = 0; v < fk.n_vocab; v++) out[v] = -1.0f;
        out[fk.row_next[row]] = 1.0f;
        fk.rows_read++;
    }
    pthread_mutex_unlock(&fk.mu);
    return ok ? 0 : moex_fail(err, "row %lld of %lld", (long long)row, (long long)fk.n_rows);
}

static void set_delay(int ms) {
    pthread_mutex_lock(&fk.mu);
    fk.delay_ms = ms;
    pthread_mutex_unlock(&fk.mu);
}

static int fake_forward(void *ctx, const int32_t *tokens, int64_t n, int64_t pos, bool all, float *logits,
                        moex_error *err) {
    return moex_fail(err, "the scheduler must use forward_batch here");
}

/* ---- helpers ---- */

static moex_tokenizer *tok;
static moex_model model;
static moex_pool *g_pool;   /* the schedulers sample their rows on it (three threads) */

static void sleep_ms(int ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* A token whose piece is exactly these bytes, or -1. */
static int32_t token_of(const char *piece, size_t n) {
    char buf[64];
    for (int32_t id = 0; id < model.hp.n_vocab; id++) {
        const int k = moex_token_to_piece(tok, id, false, buf, sizeof buf);
        if (k == (int)n && !memcmp(buf, piece, n)) return id;
    }
    return -1;
}

static void add_script(int32_t first, int prompt_len, const int32_t *next, int n) {
    script *s = &fk.scripts[fk.n_scripts++];
    s->first = first;
    s->prompt_len = prompt_len;
    s->n = n;
    memcpy(s->next, next, (size_t)n * sizeof *next);
}

typedef struct result {
    char text[4096];
    size_t len;
    serve_job_state st;
} result;

/* Waits for the job, gathering its text. */
static void wait_job(serve_job *j, result *r, double timeout_s) {
    const double end = moex_time_s() + timeout_s;
    r->len = 0;
    for (;;) {
        char *t;
        const size_t n = serve_job_take(j, &t, &r->st);
        if (n && r->len + n < sizeof r->text) memcpy(r->text + r->len, t, n), r->len += n;
        free(t);
        r->text[r->len] = 0;
        if (r->st.done || moex_time_s() > end) return;
        sleep_ms(1);
    }
}

static serve_job *submit_grammar(serve_sched *s, const int32_t *prompt, int n, int64_t max_tokens, const char *stop,
                                 const char *grammar) {
    serve_job_params p = {.max_tokens = max_tokens, .sp = {.temp = 0}, .grammar = grammar ? strdup(grammar) : NULL};
    p.prompt_tokens = malloc((size_t)n * sizeof *p.prompt_tokens);
    memcpy(p.prompt_tokens, prompt, (size_t)n * sizeof *prompt);
    p.n_prompt_tokens = n;
    if (stop) p.stop[p.n_stop++] = strdup(stop);
    serve_job *j = serve_job_create(&p, NULL, NULL);
    moex_error err = {0};
    if (serve_sched_submit(s, j, &err)) {
        serve_job_unref(j);
        return NULL;
    }
    return j;
}

static serve_job *submit(serve_sched *s, const int32_t *prompt, int n, int64_t max_tokens, const char *stop) {
    return submit_grammar(s, prompt, n, max_tokens, stop, NULL);
}

static result run_one(serve_sched *s, const int32_t *prompt, int n, int64_t max_tokens, const char *stop) {
    result r = {0};
    serve_job *j = submit(s, prompt, n, max_tokens, stop);
    CHECK(j != NULL, "submit");
    if (j) {
        wait_job(j, &r, 10);
        serve_job_unref(j);
    }
    return r;
}

static void wait_idle(serve_sched_stats *st) {
    for (int i = 0; i < 5000 && (atomic_load(&st->active) || atomic_load(&st->queued)); i++) sleep_ms(1);
}

/* ---- the checks ---- */

static serve_sched *start(serve_sched_stats *st, int slots, int64_t n_ctx, int64_t chunk, int max_queue) {
    memset(st, 0, sizeof *st);
    moex_engine eng = {.ctx = &fk, .forward = fake_forward, .forward_batch = fake_forward_batch, .n_ctx = n_ctx,
                       .n_batch = 64, .n_seq = MAX_SLOTS, .batch_argmax = fk.batch_argmax,
                       .read_row = fk.batch_argmax ? fake_read_row : NULL};
    for (int i = 0; i < MAX_SLOTS; i++) fk.last_pos[i] = -1;
    serve_sched_config cfg = {.n_slots = slots, .n_ctx = n_ctx, .n_batch = 64, .prompt_chunk = chunk,
                            .max_queue = max_queue, .pool = g_pool};
    moex_error err = {0};
    serve_sched *s = serve_sched_start(&model, &eng, &cfg, st, &err);
    CHECK(s != NULL, "start: %s", err.msg);
    return s;
}

static void check_text(serve_sched *s, const int32_t *hello, int n_hello, const char *hello_text) {
    const int32_t prompt[4] = {1000, 11, 12, 13};
    result r = run_one(s, prompt, 4, n_hello, NULL);
    CHECK(r.st.done && r.st.finish == SERVE_FINISH_LENGTH && !strcmp(r.text, hello_text),
          "scripted text: got '%s' (finish %d), want '%s'", r.text, r.st.finish, hello_text);
    CHECK(r.st.n_prompt == 4 && r.st.n_completion == n_hello, "usage %lld + %lld", (long long)r.st.n_prompt,
          (long long)r.st.n_completion);
    /* "lo wor" spans tokens: the text ends before it */
    r = run_one(s, prompt, 4, n_hello, "lo wor");
    CHECK(r.st.finish == SERVE_FINISH_STOP && !strcmp(r.text, "Hel"), "stop across tokens: '%s' (%d)", r.text,
          r.st.finish);
    r = run_one(s, prompt, 4, n_hello, "zzz");
    CHECK(r.st.finish == SERVE_FINISH_LENGTH && !strcmp(r.text, hello_text), "a stop that never comes: '%s'", r.text);
    r = run_one(s, prompt, 4, 2, NULL);
    CHECK(r.st.finish == SERVE_FINISH_LENGTH && r.st.n_completion == 2, "max_tokens 2: %lld",
          (long long)r.st.n_completion);
}

static void check_utf8(serve_sched *s) {
    const int32_t c3 = token_of("\xC3", 1), a9 = token_of("\xA9", 1), ff = token_of("\xFF", 1), x = token_of("x", 1);
    CHECK(c3 >= 0 && a9 >= 0 && ff >= 0 && x >= 0, "byte tokens in the vocab (%d %d %d %d)", c3, a9, ff, x);
    if (c3 < 0 || a9 < 0 || ff < 0 || x < 0) return;
    const int32_t split[] = {x, c3, a9, x, ff, x, c3};
    add_script(2000, 2, split, 7);
    const int32_t prompt[2] = {2000, 5};
    /* é arrives in two tokens, FF is no UTF-8, a lone C3 at the end is cut short */
    result r = run_one(s, prompt, 2, 7, NULL);
    CHECK(!strcmp(r.text, "x\xC3\xA9x\xEF\xBF\xBDx\xEF\xBF\xBD"), "UTF-8 out: '%s'", r.text);
    /* a stop sequence after a split character still matches the bytes */
    r = run_one(s, prompt, 2, 7, "\xC3\xA9x");
    CHECK(!strcmp(r.text, "x") && r.st.finish == SERVE_FINISH_STOP, "a stop after a split character: '%s'", r.text);
}

/* Four jobs through 4 slots, three of them joining while the first
 * decodes (their prompts go in chunks beside its tokens), against each alone. */
static void check_batching(serve_sched *s, serve_sched_stats *st) {
    int32_t prompts[4][10];
    result alone[4], together[4];
    for (int i = 0; i < 4; i++) {
        int32_t next[24];
        for (int k = 0; k < 24; k++) next[k] = 300 + 50 * i + k;
        for (int k = 0; k < 10; k++) prompts[i][k] = k ? 20 + k : 3000 + i;
        add_script(3000 + i, 10, next, 24);
    }
    for (int i = 0; i < 4; i++) alone[i] = run_one(s, prompts[i], 10, 24, NULL);
    pthread_mutex_lock(&fk.mu);
    fk.max_prompt_tokens_beside_decode = 0;
    fk.bad_order = 0;
    const int calls0 = fk.calls;
    pthread_mutex_unlock(&fk.mu);
    set_delay(1);
    const uint64_t gen0 = atomic_load(&st->generated_tokens);
    serve_job *jobs[4];
    jobs[0] = submit(s, prompts[0], 10, 24, NULL);
    for (int i = 0; i < 5000 && atomic_load(&st->generated_tokens) == gen0; i++) sleep_ms(1);
    for (int i = 1; i < 4; i++) jobs[i] = submit(s, prompts[i], 10, 24, NULL);
    for (int i = 0; i < 4; i++) {
        wait_job(jobs[i], &together[i], 10);
        serve_job_unref(jobs[i]);
        CHECK(together[i].len == alone[i].len && !memcmp(together[i].text, alone[i].text, alone[i].len),
              "job %d together equals alone", i);
    }
    pthread_mutex_lock(&fk.mu);
    const int calls = fk.calls - calls0;
    CHECK(fk.bad_order == 0, "positions in order per slot (%d out of order)", fk.bad_order);
    CHECK(fk.max_prompt_tokens_beside_decode > 0 && fk.max_prompt_tokens_beside_decode <= 3,
          "prompt tokens beside decoding ones: %lld (chunks of at most 3)", (long long)fk.max_prompt_tokens_beside_decode);
    pthread_mutex_unlock(&fk.mu);
    set_delay(0);
    /* alone: 4 x (1 + 23) forwards; together the decode steps are shared */
    CHECK(calls < 4 * 24 / 2, "4 jobs together took %d forwards (one per step over all of them)", calls);
    CHECK(atomic_load(&st->active) == 0, "slots free after");
}

static void check_cancel_and_reuse(serve_sched *s, serve_sched_stats *st) {
    const int32_t prompt[3] = {4000, 1, 2};
    const uint64_t cancelled0 = atomic_load(&st->cancelled);
    set_delay(2);
    const uint64_t gen0 = atomic_load(&st->generated_tokens);
    serve_job *j = submit(s, prompt, 3, 100000, NULL);
    for (int i = 0; i < 5000 && atomic_load(&st->generated_tokens) == gen0; i++) sleep_ms(1);
    sleep_ms(5);
    CHECK(atomic_load(&st->active) == 1, "the long job holds a slot");
    serve_job_cancel(j);
    for (int i = 0; i < 5000 && atomic_load(&st->active); i++) sleep_ms(1);
    CHECK(atomic_load(&st->active) == 0 && atomic_load(&st->cancelled) == cancelled0 + 1,
          "a cancelled job frees its slot (active %d, cancelled %llu)", atomic_load(&st->active),
          (unsigned long long)atomic_load(&st->cancelled));
    serve_job_unref(j);
    set_delay(0);
    pthread_mutex_lock(&fk.mu);
    const int zero0 = fk.zero_pos_writes[0], rewind0 = fk.rewinds[0];
    pthread_mutex_unlock(&fk.mu);
    /* the same prompt again: the prompt cache gives it the slot's first two rows (the third, the prompt's last,
     * is evaluated: its logits are wanted) */
    result r = run_one(s, prompt, 3, 3, NULL);
    pthread_mutex_lock(&fk.mu);
    CHECK(fk.zero_pos_writes[0] == zero0 && fk.rewinds[0] == rewind0 + 1 && r.st.n_completion == 3 &&
              r.st.n_cached == 2,
          "the same prompt reuses the slot's prompt rows (cached %lld)", (long long)r.st.n_cached);
    pthread_mutex_unlock(&fk.mu);
    /* a prompt sharing nothing starts from position 0 */
    const int32_t other[3] = {4001, 1, 2};
    const int32_t next[4] = {300, 301, 302, 303};
    add_script(4001, 3, next, 4);
    r = run_one(s, other, 3, 3, NULL);
    pthread_mutex_lock(&fk.mu);
    CHECK(fk.zero_pos_writes[0] == zero0 + 1 && r.st.n_cached == 0, "a new prompt starts its slot at position 0");
    pthread_mutex_unlock(&fk.mu);
}

static void check_context(serve_sched *s) {
    int32_t prompt[N_CTX];
    for (int i = 0; i < N_CTX; i++) prompt[i] = 7 + i;
    result r = run_one(s, prompt, N_CTX, 8, NULL);
    CHECK(r.st.finish == SERVE_FINISH_ERROR && r.st.http_status == 400 && r.st.error_code &&
          !strcmp(r.st.error_code, "context_length_exceeded") && !r.st.accepted,
          "a prompt filling the context: 400 (%d %s)", r.st.http_status, r.st.error);
    r = run_one(s, prompt, N_CTX - 1, 8, NULL);
    CHECK(r.st.finish == SERVE_FINISH_LENGTH && r.st.n_completion == 2, "a prompt one short of the context: 2 tokens, then length (%lld)",
          (long long)r.st.n_completion);
    const int32_t bad[2] = {5, 1 << 30};
    r = run_one(s, bad, 2, 8, NULL);
    CHECK(r.st.finish == SERVE_FINISH_ERROR && r.st.http_status == 400, "a token id outside the vocabulary: 400");
}

static void check_failure_and_queue(serve_sched *s, serve_sched_stats *st) {
    const int32_t prompt[2] = {9, 9};
    pthread_mutex_lock(&fk.mu);
    fk.fail_next = 1;
    pthread_mutex_unlock(&fk.mu);
    result r = run_one(s, prompt, 2, 4, NULL);
    CHECK(r.st.finish == SERVE_FINISH_ERROR && r.st.http_status == 500 && strstr(r.st.error, "injected"),
          "a failing forward fails its jobs: %d %s", r.st.http_status, r.st.error);
    r = run_one(s, prompt, 2, 4, NULL);
    CHECK(r.st.finish == SERVE_FINISH_LENGTH, "and the next job is served");
    wait_idle(st);
}

/* An engine that takes the greedy rows' argmax where its logits are: the
 * same text, with those rows never read (the fake leaves them NaN); a row
 * with no finite maximum (argmax -1) fails its job alone, with 500, while
 * another job goes on. */
static void check_engine_argmax(const int32_t *hello, int n_hello, const char *hello_text) {
    serve_sched_stats st;
    fk.batch_argmax = true;
    fk.argmax_only_rows = 0;
    serve_sched *s = start(&st, 4, N_CTX, 3, 16);
    if (s) {
        check_text(s, hello, n_hello, hello_text);
        pthread_mutex_lock(&fk.mu);
        const int only = fk.argmax_only_rows;
        const int32_t next[3] = {300, 301, 302};
        add_script(4100, 2, next, 3);
        fk.broken_first = 4100;
        pthread_mutex_unlock(&fk.mu);
        CHECK(only > 0, "the greedy rows went as argmax alone (%d rows)", only);
        const int32_t bad[2] = {4100, 7}, good[4] = {1000, 11, 12, 13};
        set_delay(1);
        serve_job *jb = submit(s, bad, 2, 3, NULL), *jg = submit(s, good, 4, n_hello, NULL);
        result rb = {0}, rg = {0};
        if (jb) wait_job(jb, &rb, 10), serve_job_unref(jb);
        if (jg) wait_job(jg, &rg, 10), serve_job_unref(jg);
        set_delay(0);
        CHECK(rb.st.finish == SERVE_FINISH_ERROR && rb.st.http_status == 500 && strstr(rb.st.error, "finite"),
              "no finite maximum: the job fails with 500 (%d, %s)", rb.st.http_status, rb.st.error);
        CHECK(rg.st.finish == SERVE_FINISH_LENGTH && !strcmp(rg.text, hello_text),
              "and the job beside it completes: '%s'", rg.text);
        wait_idle(&st);
        pthread_mutex_lock(&fk.mu);
        fk.broken_first = -1;
        pthread_mutex_unlock(&fk.mu);
        serve_sched_stop(s);
        serve_sched_free(s);
    }
    fk.batch_argmax = false;
}

/* A greedy job under a grammar on an engine with batch_argmax and read_row:
 * while the grammar allows the engine's argmax, its rows stay where they are
 * (argmax only, none read back); where it refuses one, that row alone is read
 * back and the token comes from the tokens the grammar allows. */
static void check_grammar_rows(const char *hello_text) {
    serve_sched_stats st;
    fk.batch_argmax = true;
    serve_sched *s = start(&st, 2, N_CTX, 8, 16);
    if (!s) return;
    const int32_t prompt[4] = {1000, 11, 12, 13};   /* the script writes hello_text */
    char same[128], other[128];
    snprintf(same, sizeof same, "root ::= \"%s\"", hello_text);
    snprintf(other, sizeof other, "root ::= \"Hello world, this is a quiz\"");
    pthread_mutex_lock(&fk.mu);
    const int only0 = fk.argmax_only_rows;
    fk.rows_read = 0;
    pthread_mutex_unlock(&fk.mu);
    result r = {0};
    serve_job *j = submit_grammar(s, prompt, 4, 64, NULL, same);
    if (j) wait_job(j, &r, 10), serve_job_unref(j);
    pthread_mutex_lock(&fk.mu);
    const int only1 = fk.argmax_only_rows, read1 = fk.rows_read;
    pthread_mutex_unlock(&fk.mu);
    CHECK(r.st.finish == SERVE_FINISH_STOP && !strcmp(r.text, hello_text),
          "a grammar the script follows: '%s' (finish %d), ended where the grammar does", r.text, r.st.finish);
    CHECK(read1 == 0 && only1 > only0, "its rows stayed on the engine (%d argmax-only, %d read back)", only1 - only0,
          read1);
    memset(&r, 0, sizeof r);
    j = submit_grammar(s, prompt, 4, 64, NULL, other);
    if (j) wait_job(j, &r, 10), serve_job_unref(j);
    pthread_mutex_lock(&fk.mu);
    const int read2 = fk.rows_read;
    pthread_mutex_unlock(&fk.mu);
    CHECK(r.st.finish == SERVE_FINISH_STOP && !strcmp(r.text, "Hello world, this is a quiz"),
          "a grammar that departs from the script: '%s' (finish %d)", r.text, r.st.finish);
    CHECK(read2 > 0, "the refused rows were read back (%d)", read2);
    CHECK(atomic_load(&st.grammar_masks) > 0 && atomic_load(&st.grammar_tokens) >= (uint_fast64_t)read2,
          "grammar counters: %llu tokens, %llu masked", (unsigned long long)atomic_load(&st.grammar_tokens),
          (unsigned long long)atomic_load(&st.grammar_masks));
    wait_idle(&st);
    serve_sched_stop(s);
    serve_sched_free(s);
    fk.batch_argmax = false;
}

static void check_queue_limit(serve_sched_stats *st) {
    serve_sched *s = start(st, 1, 4096, 8, 1);
    if (!s) return;
    set_delay(2);
    const int32_t prompt[2] = {4000, 3};
    serve_job *a = submit(s, prompt, 2, 100000, NULL);
    for (int i = 0; i < 5000 && atomic_load(&st->active) == 0; i++) sleep_ms(1);
    serve_job *b = submit(s, prompt, 2, 4, NULL);
    serve_job *c = submit(s, prompt, 2, 4, NULL);
    CHECK(a && b && !c, "one slot busy, one waiting: a third is refused (%p %p %p)", (void *)a, (void *)b, (void *)c);
    CHECK(atomic_load(&st->queued) == 1, "queue length 1 (%d)", atomic_load(&st->queued));
    serve_sched_stop(s);
    result r;
    wait_job(a, &r, 5);
    CHECK(r.st.finish == SERVE_FINISH_ERROR && r.st.http_status == 503, "stopping fails the running job with 503");
    wait_job(b, &r, 5);
    CHECK(r.st.finish == SERVE_FINISH_ERROR && r.st.http_status == 503, "and the waiting one");
    serve_job_unref(a);
    serve_job_unref(b);
    serve_sched_free(s);
    set_delay(0);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s QWEN2_VOCAB.gguf\n", argv[0]);
        return 2;
    }
    moex_error err = {0};
    moex_gguf *g = moex_gguf_open(argv[1], &err);
    tok = g ? moex_tokenizer_load(g, &err) : NULL;
    if (!tok) {
        fprintf(stderr, "cannot load the tokenizer: %s\n", err.msg);
        return 1;
    }
    model.hp.n_vocab = moex_tokenizer_n_vocab(tok);
    model.tok = tok;
    pthread_mutex_init(&fk.mu, NULL);
    fk.n_vocab = model.hp.n_vocab;
    fk.broken_first = -1;
    g_pool = moex_pool_create(3);
    CHECK(g_pool != NULL, "a thread pool");
    for (int s = 0; s < MAX_SLOTS; s++) fk.last_pos[s] = -1;

    const char *hello_text = "Hello world, this is a test";
    int32_t hello[32];
    const int64_t n_hello = moex_tokenize(tok, hello_text, strlen(hello_text), false, false, hello, 32, &err);
    CHECK(n_hello > 4 && n_hello < 32, "tokenize the script");
    add_script(1000, 4, hello, (int)n_hello);

    serve_sched_stats st;
    serve_sched *s = start(&st, 4, N_CTX, 3, 16);
    if (s) {
        check_text(s, hello, (int)n_hello, hello_text);
        check_utf8(s);
        check_batching(s, &st);
        check_cancel_and_reuse(s, &st);
        check_context(s);
        check_failure_and_queue(s, &st);
        serve_sched_stop(s);
        serve_sched_free(s);
    }
    check_engine_argmax(hello, (int)n_hello, hello_text);
    check_grammar_rows(hello_text);
    serve_sched_stats st2;
    check_queue_limit(&st2);
    moex_tokenizer_free(tok);
    moex_gguf_close(g);
    moex_pool_destroy(g_pool);
    if (g_failures) {
        fprintf(stderr, "%d checks failed\n", g_failures);
        return 1;
    }
    printf("scheduler ok\n");
    return 0;
}
