/* Parallel generation, streamed in order through the GGUF writer.
 *
 * The tensor data is cut into chunks of whole rows (~4 MiB). Worker threads
 * claim chunks in order and fill them into a ring of slots; the calling
 * thread writes the slots out in chunk order. Chunk k uses slot k % n_slots
 * and waits until chunk k - n_slots has been written, so memory stays at
 * n_slots chunks whatever the model size. */
#include "tools/tool_gen.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK_BYTES ((size_t)4 << 20)

typedef struct gen_chunk {
    int tensor;
    int64_t row0, n_rows;
    size_t bytes;
} gen_chunk;

typedef struct gen_slot {
    void *buf;
    int64_t chunk;   /* the chunk this slot holds or will hold next */
    bool ready;      /* filled, waiting for the writer */
} gen_slot;

typedef struct gen_pipeline {
    const gen_config *cfg;
    const gen_plan *plan;
    bool blocks;
    gen_chunk *chunks;
    int64_t n_chunks;
    gen_slot *slots;
    int n_slots;
    size_t slot_bytes;
    int64_t max_ne0;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t next_claim;
    bool stop;            /* an error anywhere: everyone leaves */
    moex_error err;       /* the first worker error */
    bool worker_failed;
} gen_pipeline;

static size_t tensor_row_bytes(const gen_tensor *t) { return moex_row_bytes(t->type, t->ne[0]); }

/* A tensor's rows, and how many whole rows make a chunk of about CHUNK_BYTES. */
static int64_t tensor_rows(const gen_tensor *t, int64_t *per_chunk) {
    const size_t rb = tensor_row_bytes(t);
    *per_chunk = rb >= CHUNK_BYTES ? 1 : (int64_t)(CHUNK_BYTES / rb);
    return t->ne[1] * t->ne[2];
}

/* Whole rows per chunk, about CHUNK_BYTES each: counted, then listed. */
static int plan_chunks(gen_pipeline *p, moex_error *err) {
    int64_t n = 0, per;
    size_t biggest = 0;
    for (int i = 0; i < p->plan->n_tensors; i++) {
        const gen_tensor *t = &p->plan->tensors[i];
        const int64_t rows = tensor_rows(t, &per);
        n += (rows + per - 1) / per;
        if (t->ne[0] > p->max_ne0) p->max_ne0 = t->ne[0];
        size_t b = (size_t)(per < rows ? per : rows) * tensor_row_bytes(t);
        if (b > biggest) biggest = b;
    }
    p->chunks = calloc((size_t)n, sizeof *p->chunks);
    if (!p->chunks) return moex_fail(err, "out of memory for %lld chunks", (long long)n);
    int64_t k = 0;
    for (int i = 0; i < p->plan->n_tensors; i++) {
        const gen_tensor *t = &p->plan->tensors[i];
        const int64_t rows = tensor_rows(t, &per);
        const size_t rb = tensor_row_bytes(t);
        for (int64_t r = 0; r < rows; r += per) {
            int64_t nr = rows - r < per ? rows - r : per;
            p->chunks[k++] = (gen_chunk){.tensor = i, .row0 = r, .n_rows = nr, .bytes = (size_t)nr * rb};
        }
    }
    p->n_chunks = n;
    p->slot_bytes = biggest;
    return 0;
}

static void *worker_main(void *arg) {
    gen_pipeline *p = arg;
    float *scratch = malloc((size_t)p->max_ne0 * sizeof *scratch);
    pthread_mutex_lock(&p->mu);
    if (!scratch) {
        moex_fail(&p->err, "out of memory");
        p->worker_failed = p->stop = true;
        pthread_cond_broadcast(&p->cv);
    }
    while (!p->stop && p->next_claim < p->n_chunks) {
        int64_t k = p->next_claim++;
        gen_slot *s = &p->slots[k % p->n_slots];
        while (!p->stop && (s->chunk != k || s->ready)) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) break;
        pthread_mutex_unlock(&p->mu);
        const gen_chunk *c = &p->chunks[k];
        moex_error e = {{0}};
        int rc = gen_fill_rows(&p->plan->tensors[c->tensor], c->tensor, p->cfg->seed, p->blocks, c->row0, c->n_rows,
                               s->buf, scratch, &e);
        pthread_mutex_lock(&p->mu);
        if (rc) {
            if (!p->worker_failed) p->err = e;
            p->worker_failed = p->stop = true;
        }
        s->ready = true;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    free(scratch);
    return NULL;
}

typedef struct progress {
    double t0, last;
    uint64_t total, done;
    bool tty, quiet;
    int last_decile;
} progress;

static void progress_update(progress *pr, bool final) {
    if (pr->quiet) return;
    double now = moex_time_s();
    int pct = pr->total ? (int)(100.0 * (double)pr->done / (double)pr->total) : 100;
    if (!final) {
        if (pr->tty ? now - pr->last < 0.5 : pct / 10 == pr->last_decile) return;
    }
    pr->last = now;
    pr->last_decile = pct / 10;
    double mb = (double)pr->done / 1e6, dt = now - pr->t0;
    fprintf(stderr, "%sgen: %3d%%  %.0f / %.0f MB  %.0f MB/s%s", pr->tty ? "\r" : "", pct, mb, (double)pr->total / 1e6,
            dt > 0 ? mb / dt : 0.0, pr->tty && !final ? "" : "\n");
    fflush(stderr);
}

/* The writer side: chunks in order into the file. */
static int write_chunks(gen_pipeline *p, moex_gguf_writer *w, moex_error *err) {
    progress pr = {.t0 = moex_time_s(), .total = p->plan->data_bytes, .tty = isatty(2), .quiet = p->cfg->quiet,
                   .last_decile = 0};
    pr.last = pr.t0;
    int rc = 0;
    for (int64_t k = 0; k < p->n_chunks && !rc; k++) {
        gen_slot *s = &p->slots[k % p->n_slots];
        pthread_mutex_lock(&p->mu);
        while (!p->stop && !(s->chunk == k && s->ready)) pthread_cond_wait(&p->cv, &p->mu);
        bool failed = p->worker_failed;
        pthread_mutex_unlock(&p->mu);
        if (failed) {
            *err = p->err;
            rc = -1;
            break;
        }
        if (moex_gguf_writer_data(w, s->buf, p->chunks[k].bytes)) {
            rc = moex_fail(err, "writing tensor data failed (see the writer's message)");
            break;
        }
        pr.done += p->chunks[k].bytes;
        progress_update(&pr, k + 1 == p->n_chunks);
        pthread_mutex_lock(&p->mu);
        s->ready = false;
        s->chunk = k + p->n_slots;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    return rc;
}

static void pipeline_free(gen_pipeline *p) {
    if (p->slots)
        for (int i = 0; i < p->n_slots; i++) free(p->slots[i].buf);
    free(p->slots);
    free(p->chunks);
}

static bool use_blocks(const gen_config *cfg, const gen_plan *plan) {
    if (cfg->weights == GEN_WEIGHTS_AUTO) return plan->n_params > ((int64_t)1 << 27);
    return cfg->weights == GEN_WEIGHTS_BLOCKS;
}

int gen_write_tensors(const gen_config *cfg, const gen_plan *plan, moex_gguf_writer *w, moex_error *err) {
    gen_pipeline p = {.cfg = cfg, .plan = plan, .blocks = use_blocks(cfg, plan)};
    int n_workers = cfg->threads > 0 ? cfg->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_workers < 1) n_workers = 1;
    if (plan_chunks(&p, err)) return -1;
    if (n_workers > p.n_chunks) n_workers = (int)(p.n_chunks ? p.n_chunks : 1);
    p.n_slots = 2 * n_workers;
    p.slots = calloc((size_t)p.n_slots, sizeof *p.slots);
    if (!p.slots) {
        pipeline_free(&p);
        return moex_fail(err, "out of memory");
    }
    for (int i = 0; i < p.n_slots; i++) {
        p.slots[i].chunk = i;
        if (!(p.slots[i].buf = malloc(p.slot_bytes ? p.slot_bytes : 1))) {
            pipeline_free(&p);
            return moex_fail(err, "out of memory for %d buffers of %zu bytes", p.n_slots, p.slot_bytes);
        }
    }
    if (!cfg->quiet)
        fprintf(stderr, "gen: %d tensors, %.1f M params, %.1f MB of data, %s weights, %d threads\n", plan->n_tensors,
                (double)plan->n_params / 1e6, (double)plan->data_bytes / 1e6,
                p.blocks ? "random-block" : "quantized-float", n_workers);
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    pthread_t *th = calloc((size_t)n_workers, sizeof *th);
    int started = 0, rc = 0;
    if (!th) rc = moex_fail(err, "out of memory");
    for (; !rc && started < n_workers; started++)
        if (pthread_create(&th[started], NULL, worker_main, &p)) {
            rc = moex_fail(err, "cannot start a generator thread");
            break;
        }
    if (!rc && write_chunks(&p, w, err)) rc = -1;
    pthread_mutex_lock(&p.mu);
    p.stop = true;
    pthread_cond_broadcast(&p.cv);
    pthread_mutex_unlock(&p.mu);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    free(th);
    pthread_cond_destroy(&p.cv);
    pthread_mutex_destroy(&p.mu);
    pipeline_free(&p);
    return rc;
}
