/* A batch of several sequences (moex_vk_forward_batch, one layer above the
 * memory plan; forward_vk_internal.h): its checks, the order its tokens run
 * in and the I/O words that carry each token's slot and position to the
 * kernels, so that one recording per batch shape serves every step.
 *
 * Order: the "each" tokens (logits wanted, their sequence's last in the
 * batch: decode tokens and prompts' last tokens) first, on one token's
 * kernels; then the tiled tokens whose logits are wanted (only when a
 * sequence wants several rows at once); then the other tiled tokens (prompt
 * chunks). Within each group batch order is kept, so a sequence's tokens stay
 * in position order and a prompt chunk stays one run.
 *
 * I/O words written per forward: the token ids (IO_TOKENS), a (pos, base)
 * pair per token (base = slot * n_ctx, the slot's first KV row), the prompt
 * attention's blocks over runs and the two indirect grids: the each tokens'
 * decode attention up to the furthest position, the blocks' count. */
#include <stdlib.h>
#include <string.h>

#include "engine/vk/forward_vk_internal.h"

struct vk_batch {
    int32_t *order;    /* [n_batch] run order -> batch index */
    int32_t *tokpos;   /* [2 n_batch] (pos, base) in run order: the host's copy of the I/O words */
    int32_t *row_of;   /* [n_batch] batch index -> its logits row, -1: none */
    int32_t *out_row;  /* [n_batch] the last batch's wanted rows, in the caller's order -> their logits row */
    int64_t n_out;     /* how many */
    int32_t *last;     /* [n_seq] each slot's last batch index (-1: none in the batch) */
    int32_t *at;       /* [n_seq] each slot's position so far while checking */
};

void vk_batch_free(moex_vk_state *s) {
    vk_batch *b = s->batch;
    if (!b) return;
    free(b->order);
    free(b->tokpos);
    free(b->row_of);
    free(b->out_row);
    free(b->last);
    free(b->at);
    free(b);
    s->batch = NULL;
}

static int batch_alloc(moex_vk_state *s, moex_error *err) {
    if (s->batch) return 0;
    vk_batch *b = calloc(1, sizeof *b);
    s->batch = b;
    const size_t nb = (size_t)s->n_batch, ns = (size_t)s->n_seq;
    if (!b || !(b->order = malloc(nb * sizeof *b->order)) || !(b->tokpos = malloc(2 * nb * sizeof *b->tokpos)) ||
        !(b->row_of = malloc(nb * sizeof *b->row_of)) || !(b->out_row = malloc(nb * sizeof *b->out_row)) ||
        !(b->last = malloc(ns * sizeof *b->last)) ||
        !(b->at = malloc(ns * sizeof *b->at))) {
        vk_batch_free(s);
        return moex_fail(err, "out of memory");
    }
    return 0;
}


/* moex_forward_batch's checks: size, slots, positions (in the context,
 * increasing within a slot), token ids; fills b->last. */
static int check_batch(const moex_model *m, const moex_vk_state *s, const moex_batch *bt, moex_error *err) {
    vk_batch *b = s->batch;
    if (bt->n <= 0 || bt->n > s->n_batch)
        return moex_fail(err, "batch of %lld tokens (limit %lld)", (long long)bt->n, (long long)s->n_batch);
    for (int i = 0; i < s->n_seq; i++) b->last[i] = b->at[i] = -1;
    for (int64_t t = 0; t < bt->n; t++) {
        const int32_t seq = bt->seq[t], pos = bt->pos[t];
        if (seq < 0 || seq >= s->n_seq)
            return moex_fail(err, "token %lld names slot %d; the state has %d", (long long)t, seq, s->n_seq);
        if (pos < 0 || pos >= s->n_ctx)
            return moex_fail(err, "token %lld is at position %d, outside the context of %lld (use a larger --ctx)",
                             (long long)t, pos, (long long)s->n_ctx);
        if (bt->tokens[t] < 0 || bt->tokens[t] >= m->hp.n_vocab)
            return moex_fail(err, "token id %d at index %lld is outside the vocabulary (0..%d)", bt->tokens[t],
                             (long long)t, m->hp.n_vocab - 1);
        if (pos <= b->at[seq])
            return moex_fail(err, "slot %d: position %d follows position %d (a slot's tokens come in position order)",
                             seq, pos, b->at[seq]);
        b->at[seq] = pos;
        b->last[seq] = (int32_t)t;
    }
    return 0;
}

/* Whether every wanted token can run on the one-token kernels (within
 * vk_each_cap), rather than only each slot's last; *same_seq: some slot then
 * has several. */
static bool all_wanted_each(const moex_vk_state *s, const moex_batch *bt, bool *same_seq) {
    const vk_batch *b = s->batch;
    int64_t wanted = 0, extra = 0;
    for (int64_t t = 0; t < bt->n; t++) {
        if (!bt->want_logits[t]) continue;
        wanted++;
        if (b->last[bt->seq[t]] != t) extra++;
    }
    *same_seq = extra > 0;
    return wanted <= vk_each_cap(s);
}

/* Appends the batch's tokens of one group (0 each, 1 wanted tiled, 2 other
 * tiled) to the run order; every_want: every wanted token is an each token. */
static int64_t add_group(vk_batch *b, const moex_batch *bt, int group, bool every_want, int64_t i) {
    for (int64_t t = 0; t < bt->n; t++) {
        const bool want = bt->want_logits[t], each = want && (every_want || b->last[bt->seq[t]] == t);
        if ((each ? 0 : want ? 1 : 2) == group) b->order[i++] = (int32_t)t;
    }
    return i;
}

/* The I/O words of the run order: ids, (pos, base) pairs, and the attention's blocks and grids. */
static void write_io(const moex_model *m, moex_vk_state *s, const moex_batch *bt, const rec_key *k) {
    vk_batch *b = s->batch;
    int32_t *io = moex_vk_buffer_map(s->io);
    int32_t max_pos = 0;
    for (int64_t i = 0; i < bt->n; i++) {
        const int64_t t = b->order[i];
        io[IO_TOKENS + i] = bt->tokens[t];
        b->tokpos[2 * i] = bt->pos[t];
        b->tokpos[2 * i + 1] = (int32_t)((int64_t)bt->seq[t] * s->n_ctx);
        if (i < k->each && bt->pos[t] > max_pos) max_pos = bt->pos[t];
    }
    memcpy(io + s->io_tokpos, b->tokpos, (size_t)bt->n * 2 * sizeof *b->tokpos);
    uint32_t grid[3] = {0, 1, 1};
    char *g = moex_vk_buffer_map(s->grid);
    moex_vk_attention_decode_grid_tokens(&s->sh, max_pos, k->each > 0 ? k->each : 1, grid);
    memcpy(g + GRID_EACH, grid, sizeof grid);
    moex_vk_attention_runs_plan(s->vk, &s->sh, vk_v_cache(m, s, 0), b->tokpos + 2 * k->each, bt->n - k->each,
                                io + s->io_blocks, grid);
    memcpy(g + GRID_RUNS, grid, sizeof grid);
}

int vk_batch_prepare(const moex_model *m, moex_vk_state *s, const moex_batch *bt, bool want_rows, rec_key *k,
                     moex_error *err) {
    if (batch_alloc(s, err) || check_batch(m, s, bt, err)) return -1;
    vk_batch *b = s->batch;
    bool same_seq;
    const bool every = all_wanted_each(s, bt, &same_seq);
    const int64_t each = add_group(b, bt, 0, every, 0), rows = add_group(b, bt, 1, every, each);
    add_group(b, bt, 2, every, rows);
    for (int64_t i = 0; i < bt->n; i++) b->row_of[b->order[i]] = i < rows ? (int32_t)i : -1;
    *k = (rec_key){.n = bt->n, .batch = true, .each = each, .rows = rows, .copy_logits = want_rows && rows > 0,
                   .each_same_seq = every && same_seq};
    write_io(m, s, bt, k);
    return 0;
}

void vk_batch_take_outputs(const moex_model *m, moex_vk_state *s, const moex_batch *bt, float *logits) {
    vk_batch *b = s->batch;
    const size_t row = (size_t)m->hp.n_vocab * sizeof *logits;
    const char *src = moex_vk_buffer_map(s->logits_host);
    const int32_t *io = moex_vk_buffer_map(s->io);
    int64_t out = 0;
    for (int64_t t = 0; t < bt->n; t++) {
        if (!bt->want_logits[t]) continue;
        b->out_row[out] = b->row_of[t];
        if (bt->argmax) bt->argmax[out] = io[s->io_rows_argmax + (size_t)b->row_of[t]];
        if (logits && !vk_argmax_only(bt, t)) {
            memcpy((char *)logits + (size_t)out * row, src + (size_t)b->row_of[t] * row, row);
            s->logits_rows_read++;
        }
        out++;
    }
    b->n_out = out;
}

int moex_vk_read_logits_row(const moex_model *m, moex_vk_state *s, int64_t row, float *out, moex_error *err) {
    const vk_batch *b = s->batch;
    if (!b || row < 0 || row >= b->n_out)
        return moex_fail(err, "logits row %lld: the last batch wanted %lld rows", (long long)row,
                         (long long)(b ? b->n_out : 0));
    const size_t bytes = (size_t)m->hp.n_vocab * sizeof *out;
    if (moex_vk_download(s->vk, s->logits_dev, (size_t)b->out_row[row] * bytes, out, bytes, err)) return -1;
    s->logits_rows_read++;
    return 0;
}
