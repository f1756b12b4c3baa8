/* The bottom layer of the Vulkan forward pass (see forward_vk_internal.h):
 * the state's memory and what both forward paths share.
 *
 * Memory plan (allocated once at creation): weights in chunks of at most
 * 1 GiB (every device allows that allocation size), one KV cache (per layer
 * n_seq slots of n_ctx rows, K of every layer then V), one activation buffer
 * sub-allocated statically, one host-visible I/O buffer for the per-token
 * values the kernels read (token ids, positions, a batch's slots), and the
 * logit buffers, grown when a larger all-logits batch first appears. A state
 * for the distributed hub (experts_remote) skips the experts' weights and
 * scratch. Also here: the recording cache both paths keep their command
 * buffers in, and writing a forward's inputs and reading its outputs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/vk/forward_vk_internal.h"

#define CHUNK_BYTES ((size_t)1 << 30)
#define STAGE_BYTES ((size_t)64 << 20)
#define ALIGN 256

/* ---- weight upload: place every tensor, allocate the chunks, copy through a staging buffer ---- */

typedef struct upload {
    const void *src;
    size_t bytes;
    moex_vk_ptr *dst;
    bool in_ram;        /* goes to a chunk of host memory (experts_in_ram) */
    const void **host;  /* in_ram: set to where the copy sits for the CPU */
    int chunk;
    size_t off;
} upload;

typedef struct uploader {
    upload *items;
    int n, cap;
    bool oom;
} uploader;

static void add_upload(uploader *u, const void *src, size_t bytes, moex_vk_ptr *dst) {
    if (u->oom) return;
    if (u->n == u->cap) {
        int cap = u->cap ? u->cap * 2 : 256;
        upload *p = realloc(u->items, (size_t)cap * sizeof *p);
        if (!p) {
            u->oom = true;
            return;
        }
        u->items = p;
        u->cap = cap;
    }
    u->items[u->n++] = (upload){.src = src, .bytes = bytes, .dst = dst};
}

static size_t align_up(size_t x) { return (x + ALIGN - 1) & ~(size_t)(ALIGN - 1); }

/* Assigns chunk and offset to each upload, device-memory uploads first, then
 * those for host memory in chunks of their own; returns the chunk count,
 * their sizes and (in_ram[c]) which chunks are host memory. */
static int place_uploads(uploader *u, size_t **sizes, bool **in_ram) {
    int n_chunks = 0;
    *sizes = calloc((size_t)u->n + 1, sizeof **sizes);
    *in_ram = calloc((size_t)u->n + 1, sizeof **in_ram);
    if (!*sizes || !*in_ram) return -1;
    for (int pass = 0; pass < 2; pass++) {
        size_t used = 0;
        bool open = false;   /* a chunk of this pass has been started */
        for (int i = 0; i < u->n; i++) {
            if (u->items[i].in_ram != (pass == 1)) continue;
            const size_t b = align_up(u->items[i].bytes);
            if (!open || (used + b > CHUNK_BYTES && used > 0)) {
                n_chunks++;
                used = 0;
                open = true;
                (*in_ram)[n_chunks - 1] = pass == 1;
            }
            u->items[i].chunk = n_chunks - 1;
            u->items[i].off = used;
            used += b;
            (*sizes)[n_chunks - 1] = used;
        }
    }
    return n_chunks;
}

typedef struct mapped_copy {
    moex_vk_state *s;
    uploader *u;
} mapped_copy;

/* The uploads whose chunk the host can write (host memory: the experts in
 * RAM; host-visible device memory: lavapipe, ReBAR), split over the threads
 * by item: tens of GB of experts take one thread seconds. */
static void copy_mapped(void *ctx, int ith, int nth) {
    const mapped_copy *mc = ctx;
    for (int i = ith; i < mc->u->n; i += nth) {
        upload *it = &mc->u->items[i];
        char *map = moex_vk_buffer_map(mc->s->chunks[it->chunk]);
        if (!map) continue;
        memcpy(map + it->off, it->src, it->bytes);
        if (it->in_ram && it->host) *it->host = map + it->off;
    }
}

/* Copies everything to the GPU, batching many small tensors per staging flush. */
static int copy_uploads(moex_vk_state *s, uploader *u, moex_error *err) {
    moex_vk_buffer *stage = NULL;
    moex_vk_cmd *c = NULL;
    size_t fill = 0;
    int rc = -1;
    moex_pool *pool = moex_pool_create(0); /* NULL: one thread */
    moex_pool_run(pool, copy_mapped, &(mapped_copy){.s = s, .u = u});
    moex_pool_destroy(pool);
    for (int i = 0; i < u->n; i++) {
        upload *it = &u->items[i];
        moex_vk_buffer *dst = s->chunks[it->chunk];
        *it->dst = moex_vk_buffer_ptr(dst) + it->off;
        if (moex_vk_buffer_map(dst)) continue; /* copied above */
        if (!stage && (!(stage = moex_vk_buffer_create(s->vk, STAGE_BYTES, MOEX_VK_MEM_HOST, err)) ||
                       !(c = moex_vk_cmd_create(s->vk, err)) || moex_vk_cmd_begin(c, err)))
            goto done;
        for (size_t done = 0; done < it->bytes;) {
            if (fill == STAGE_BYTES) {
                if (moex_vk_cmd_run(c, err) || moex_vk_cmd_begin(c, err)) goto done;
                fill = 0;
            }
            size_t part = it->bytes - done < STAGE_BYTES - fill ? it->bytes - done : STAGE_BYTES - fill;
            memcpy((char *)moex_vk_buffer_map(stage) + fill, (const char *)it->src + done, part);
            moex_vk_copy(c, dst, it->off + done, stage, fill, part);
            fill += (part + 15) & ~(size_t)15;
            if (fill > STAGE_BYTES) fill = STAGE_BYTES;
            done += part;
        }
    }
    rc = c ? moex_vk_cmd_run(c, err) : 0;
done:
    moex_vk_cmd_free(c);
    moex_vk_buffer_free(stage);
    return rc;
}

static moex_vk_matrix gpu_matrix(const moex_matrix *w) {
    return (moex_vk_matrix){.type = w->type, .rows = w->rows, .cols = w->cols, .row_bytes = w->row_bytes};
}

static int check_matrix(const moex_matrix *w, const char *what, int il, moex_error *err) {
    char where[48] = "";
    if (il >= 0) snprintf(where, sizeof where, " of layer %d", il);
    if (!moex_vk_type_supported(w->type))
        return moex_fail(err, "vulkan: %s%s has type %s, which the GPU kernels do not read", what, where,
                         moex_type_get(w->type)->name);
    if (w->cols % 32)
        return moex_fail(err, "vulkan: %s%s has %lld columns (need a multiple of 32)", what, where, (long long)w->cols);
    return 0;
}

/* Registers one matrix for upload. */
static int add_matrix(uploader *u, moex_vk_matrix *dst, const moex_matrix *src, const char *what, int il,
                      moex_error *err) {
    if (check_matrix(src, what, il, err)) return -1;
    *dst = gpu_matrix(src);
    const size_t bytes = (size_t)src->rows * src->row_bytes;
    add_upload(u, src->data, bytes, &dst->data);
    return 0;
}

/* Expert tensors: one upload per tensor when the experts are contiguous in the file, else one per expert. */
static int add_experts(uploader *u, vk_layer *L, const moex_layer *ml, int n_expert, int il, bool in_ram,
                       moex_error *err) {
    const size_t off[3] = {offsetof(moex_expert_weights, gate), offsetof(moex_expert_weights, up),
                           offsetof(moex_expert_weights, down)};
    moex_vk_matrix *dst[3] = {&L->experts.gate, &L->experts.up, &L->experts.down};
    static const char *names[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    for (int w = 0; w < 3; w++) {
        const moex_matrix *m0 = (const moex_matrix *)((const char *)&ml->experts[0] + off[w]);
        if (check_matrix(m0, names[w], il, err)) return -1;
        const size_t stride = (size_t)m0->rows * m0->row_bytes;
        bool contiguous = true;
        for (int e = 1; e < n_expert && contiguous; e++) {
            const moex_matrix *me = (const moex_matrix *)((const char *)&ml->experts[e] + off[w]);
            contiguous = me->type == m0->type && (const char *)me->data == (const char *)m0->data + e * stride;
        }
        *dst[w] = gpu_matrix(m0);
        dst[w]->expert_stride = stride;
        if (contiguous) {
            add_upload(u, m0->data, stride * (size_t)n_expert, &dst[w]->data);
            if (!u->oom) u->items[u->n - 1].in_ram = in_ram, u->items[u->n - 1].host = &L->experts_host[w];
            continue;
        }
        return moex_fail(err, "vulkan: layer %d: experts stored as separate tensors are not supported yet", il);
    }
    L->experts.n_expert = n_expert;
    return 0;
}

static void add_vector(uploader *u, const float *v, int64_t n, moex_vk_ptr *dst) {
    add_upload(u, v, (size_t)n * sizeof(float), dst);
}

static int plan_weights(const moex_model *m, moex_vk_state *s, uploader *u, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    if (check_matrix(&m->tok_embd, "token_embd", -1, err)) return -1;
    s->tok_embd = gpu_matrix(&m->tok_embd);
    add_upload(u, m->tok_embd.data, (size_t)m->tok_embd.rows * m->tok_embd.row_bytes, &s->tok_embd.data);
    add_vector(u, m->output_norm, hp->n_embd, &s->output_norm);
    const bool tied = m->output.data == m->tok_embd.data;
    if (!tied && add_matrix(u, &s->output, &m->output, "output", -1, err)) return -1;
    for (int il = 0; il < hp->n_layer; il++) {
        const moex_layer *ml = &m->layers[il];
        vk_layer *L = &s->layers[il];
        add_vector(u, ml->attn_norm, hp->n_embd, &L->attn_norm);
        add_vector(u, ml->ffn_norm, hp->n_embd, &L->ffn_norm);
        if (hp->qk_norm) {
            add_vector(u, ml->q_norm, hp->head_dim, &L->q_norm);
            add_vector(u, ml->k_norm, hp->head_dim, &L->k_norm);
        }
        if (add_matrix(u, &L->wq, &ml->wq, "attn_q", il, err) || add_matrix(u, &L->wk, &ml->wk, "attn_k", il, err) ||
            add_matrix(u, &L->wv, &ml->wv, "attn_v", il, err) || add_matrix(u, &L->wo, &ml->wo, "attn_output", il, err))
            return -1;
        if (moex_hparams_is_moe(hp)) {
            if (add_matrix(u, &L->router, &ml->router, "ffn_gate_inp", il, err) ||
                (!s->experts_remote && add_experts(u, L, ml, hp->n_expert, il, s->experts_in_ram, err)))
                return -1;
        } else if (add_matrix(u, &L->ffn_gate, &ml->ffn_gate, "ffn_gate", il, err) ||
                   add_matrix(u, &L->ffn_up, &ml->ffn_up, "ffn_up", il, err) ||
                   add_matrix(u, &L->ffn_down, &ml->ffn_down, "ffn_down", il, err)) {
            return -1;
        }
    }
    return u->oom ? moex_fail(err, "out of memory") : 0;
}

static int upload_weights(const moex_model *m, moex_vk_state *s, moex_error *err) {
    uploader u = {0};
    size_t *sizes = NULL;
    bool *in_ram = NULL;
    int rc = -1;
    if (plan_weights(m, s, &u, err)) goto done;
    s->n_chunks = place_uploads(&u, &sizes, &in_ram);
    if (s->n_chunks < 0 || !(s->chunks = calloc((size_t)s->n_chunks, sizeof *s->chunks))) {
        moex_fail(err, "out of memory");
        goto done;
    }
    for (int i = 0; i < s->n_chunks; i++)
        if (!(s->chunks[i] =
                  moex_vk_buffer_create(s->vk, sizes[i], in_ram[i] ? MOEX_VK_MEM_HOST : MOEX_VK_MEM_DEVICE, err)))
            goto done;
    const double t0 = moex_time_s();
    if (copy_uploads(s, &u, err)) goto done;
    size_t bytes[2] = {0, 0};
    for (int i = 0; i < u.n; i++) bytes[u.items[i].in_ram] += u.items[i].bytes;
    s->weights_vram = bytes[0];
    s->experts_ram = bytes[1];
    moex_log(MOEX_LOG_INFO, "vulkan: %.2f GB of weights copied to the GPU, %.2f GB of experts to host memory it reads, "
             "in %.2f s", (double)bytes[0] / 1e9, (double)bytes[1] / 1e9, moex_time_s() - t0);
    if (m->output.data == m->tok_embd.data) s->output = s->tok_embd;
    rc = 0;
done:
    free(u.items);
    free(sizes);
    free(in_ram);
    return rc;
}

/* ---- activations ---- */

static size_t take(size_t *total, size_t bytes) {
    size_t off = *total;
    *total += align_up(bytes ? bytes : 4);
    return off;
}

static void plan_activations(const moex_model *m, moex_vk_state *s) {
    const moex_hparams *hp = &m->hp;
    const size_t nb = (size_t)s->n_batch, d = (size_t)hp->n_embd, qd = (size_t)hp->n_head * hp->head_dim,
                 kvd = (size_t)hp->n_head_kv * hp->head_dim, f = 4;
    act_plan *a = &s->a;
    size_t t = 0;
    a->x = take(&t, nb * d * f);
    a->xn = take(&t, nb * d * f);
    a->q = take(&t, nb * qd * f);
    a->k = take(&t, nb * kvd * f);
    a->v = take(&t, nb * kvd * f);
    a->att = take(&t, nb * qd * f);
    size_t as = moex_vk_attention_scratch(&s->sh, s->n_batch), as1 = moex_vk_attention_scratch(&s->sh, 1);
    a->attn_scratch = take(&t, (as > as1 ? as : as1) * f);
    a->argmax = take(&t, 4);
    a->sync = take(&t, SYNC_BYTES);
    /* a batch's each tokens: one per slot, plus a verify's rows */
    const int64_t each = vk_each_cap(s);
    a->each_scratch = take(&t, moex_vk_attention_decode_scratch(&s->sh, each) * f);
    a->each_sync = take(&t, (size_t)each * (size_t)hp->n_head * 4);
    if (moex_hparams_is_moe(hp)) {
        const int k = hp->n_expert_used;
        a->router_logits = take(&t, moex_vk_router_logits_bytes((int64_t)nb, hp->n_expert));
        a->counter = take(&t, 4);
        a->ids = take(&t, nb * (size_t)k * 4);   /* ids then gw: the distributed readback copies both at once */
        a->gw = take(&t, nb * (size_t)k * 4);
        const moex_vk_experts *ex = &s->layers[0].experts;
        size_t e = 0;
        if (!s->experts_remote) {   /* by n (1 or n_batch tokens), or a batch's tiled tokens, or its each tokens */
            const size_t sz[4] = {moex_vk_experts_scratch(ex, s->n_batch, k), moex_vk_experts_scratch(ex, 1, k),
                                  moex_vk_experts_scratch_pick(ex, MOEX_VK_TILED, s->n_batch, k),
                                  moex_vk_experts_scratch_pick(ex, MOEX_VK_EACH, each, k)};
            for (int i = 0; i < 4; i++) e = sz[i] > e ? sz[i] : e;
        }
        a->ex_scratch = take(&t, e);
    } else {
        a->ff_g = take(&t, nb * (size_t)hp->n_ff * f);
        a->ff_u = take(&t, nb * (size_t)hp->n_ff * f);
    }
    a->total = t;
}

/* Bytes of one layer's K (or V) cache: n_seq slots of n_ctx rows. */
static size_t layer_cache(const moex_model *m, const moex_vk_state *s) {
    return (size_t)s->n_seq * (size_t)s->n_ctx * (size_t)m->hp.n_head_kv * (size_t)m->hp.head_dim * 4;
}

int moex_vk_state_copy_rows(const moex_model *m, moex_vk_state *s, int from, int to, int64_t n, moex_error *err) {
    if (from < 0 || to < 0 || from >= s->n_seq || to >= s->n_seq || n < 0 || n > s->n_ctx)
        return moex_fail(err, "copying KV rows: slots %d -> %d of %d, %lld rows of %lld", from, to, s->n_seq,
                         (long long)n, (long long)s->n_ctx);
    if (from == to || n == 0) return 0;
    const size_t row = (size_t)m->hp.n_head_kv * (size_t)m->hp.head_dim * 4, slot = (size_t)s->n_ctx * row;
    moex_vk_cmd *c = moex_vk_cmd_create(s->vk, err);
    if (!c) return -1;
    int rc = moex_vk_cmd_begin(c, err);
    for (int kv = 0; kv < 2 && !rc; kv++)   /* K of every layer, then V of every layer */
        for (int il = 0; il < m->hp.n_layer; il++) {
            const size_t layer = ((size_t)kv * (size_t)m->hp.n_layer + (size_t)il) * layer_cache(m, s);
            moex_vk_copy(c, s->kv, layer + (size_t)to * slot, s->kv, layer + (size_t)from * slot, (size_t)n * row);
        }
    if (!rc) rc = moex_vk_cmd_end(c, err);
    if (!rc) rc = moex_vk_cmd_run(c, err);
    moex_vk_cmd_free(c);
    return rc;
}

moex_vk_ptr vk_k_cache(const moex_model *m, const moex_vk_state *s, int il) {
    return moex_vk_buffer_ptr(s->kv) + (size_t)il * layer_cache(m, s);
}

moex_vk_ptr vk_v_cache(const moex_model *m, const moex_vk_state *s, int il) {
    return vk_k_cache(m, s, il) + (size_t)m->hp.n_layer * layer_cache(m, s);
}

/* The I/O words batches need beyond the tokens: each token's slot and
 * position, each logits row's argmax, and the attention runs' block table
 * (forward_vk_batch.c). */
static size_t batch_io_words(const moex_model *m, const moex_vk_state *s) {
    return 3 * (size_t)s->n_batch + 4 * moex_vk_attention_runs_blocks(s->vk, &s->sh, vk_v_cache(m, s, 0), s->n_batch);
}

static int create_buffers(const moex_model *m, moex_vk_state *s, moex_error *err) {
    const size_t cache = (size_t)m->hp.n_layer * layer_cache(m, s);
    plan_activations(m, s);
    if (!(s->kv = moex_vk_buffer_create(s->vk, 2 * cache, MOEX_VK_MEM_DEVICE, err)) ||
        !(s->act = moex_vk_buffer_create(s->vk, s->a.total, MOEX_VK_MEM_DEVICE, err)))
        return -1;
    s->io_tokpos = IO_TOKENS + (size_t)s->n_batch;
    s->io_rows_argmax = s->io_tokpos + 2 * (size_t)s->n_batch;
    s->io_blocks = s->io_rows_argmax + (size_t)s->n_batch;
    const size_t io_words = IO_TOKENS + (size_t)s->n_batch + batch_io_words(m, s);
    if (!(s->io = moex_vk_buffer_create(s->vk, io_words * 4, MOEX_VK_MEM_HOST, err)) ||
        !(s->grid = moex_vk_buffer_create(s->vk, GRID_BYTES, MOEX_VK_MEM_UPLOAD, err)))
        return -1;
    memset(moex_vk_buffer_map(s->io), 0, io_words * 4);
    /* The router's completion counter must start at 0; the cache is zeroed so unwritten rows are finite. */
    moex_vk_cmd *c = moex_vk_cmd_create(s->vk, err);
    if (!c) return -1;
    int rc = moex_vk_cmd_begin(c, err);
    if (!rc) {
        moex_vk_fill(c, s->kv, 0, 2 * cache, 0);
        moex_vk_fill(c, s->act, 0, s->a.total, 0);
        rc = moex_vk_cmd_run(c, err);
    }
    moex_vk_cmd_free(c);
    return rc;
}

/* ---- the whole plan ---- */

int vk_memory_create(const moex_model *m, moex_vk_state *s, moex_error *err) {
    if (upload_weights(m, s, err) || create_buffers(m, s, err) || vk_logits_alloc(m, s, 1, err)) return -1;
    const size_t kv = moex_vk_buffer_size(s->kv), act = moex_vk_buffer_size(s->act);
    moex_log(MOEX_LOG_INFO, "vulkan: %.2f GB of device memory: weights %.2f, KV cache %.2f, activations %.2f%s",
             (double)(s->weights_vram + kv + act) / 1e9, (double)s->weights_vram / 1e9, (double)kv / 1e9,
             (double)act / 1e9, s->experts_remote ? " (the experts elsewhere)" : "");
    return 0;
}

int vk_logits_alloc(const moex_model *m, moex_vk_state *s, int64_t rows, moex_error *err) {
    moex_vk_buffer_free(s->logits_dev);
    moex_vk_buffer_free(s->logits_host);
    s->logits_dev = s->logits_host = NULL;
    s->logit_rows = 0;
    const size_t bytes = (size_t)rows * (size_t)m->hp.n_vocab * 4;
    if (!(s->logits_dev = moex_vk_buffer_create(s->vk, bytes, MOEX_VK_MEM_DEVICE, err)) ||
        !(s->logits_host = moex_vk_buffer_create(s->vk, bytes, MOEX_VK_MEM_HOST, err)))
        return -1;
    s->logit_rows = rows;
    return 0;
}

void vk_memory_free(moex_vk_state *s) {
    for (int i = 0; i < s->n_chunks; i++) moex_vk_buffer_free(s->chunks[i]);
    free(s->chunks);
    moex_vk_buffer_free(s->kv);
    moex_vk_buffer_free(s->act);
    moex_vk_buffer_free(s->io);
    moex_vk_buffer_free(s->grid);
    moex_vk_buffer_free(s->logits_dev);
    moex_vk_buffer_free(s->logits_host);
}

/* ---- a forward's inputs and outputs ---- */

int32_t *vk_io_set(moex_vk_state *s, const int32_t *tokens, int64_t n, int64_t pos) {
    int32_t *io = moex_vk_buffer_map(s->io);
    io[IO_PARAMS] = (int32_t)pos;
    io[IO_PARAMS + 1] = 0;   /* slot 0's rows */
    uint32_t grid[3];
    moex_vk_attention_decode_grid(&s->sh, pos, grid);
    memcpy((char *)moex_vk_buffer_map(s->grid) + GRID_ONE, grid, sizeof grid);
    memcpy(io + IO_TOKENS, tokens, (size_t)n * sizeof *tokens);
    return io;
}

void vk_take_outputs(const moex_model *m, moex_vk_state *s, const int32_t *io, int64_t rows, float *logits) {
    s->last_argmax = io[IO_ARGMAX];
    if (!logits) return;
    memcpy(logits, moex_vk_buffer_map(s->logits_host), (size_t)rows * (size_t)m->hp.n_vocab * 4);
    s->logits_rows_read += rows;
}

/* ---- the recording cache ---- */

static bool same_shape(const rec_key *a, const rec_key *b) {
    return a->n == b->n && a->all_logits == b->all_logits && a->copy_logits == b->copy_logits && a->batch == b->batch &&
           a->each == b->each && a->rows == b->rows && a->each_same_seq == b->each_same_seq;
}

int vk_rec_find(rec_lru *l, rec_key k, bool *hit) {
    int slot = 0;
    for (int i = 0; i < N_RECORDINGS; i++) {
        if (l->valid[i] && same_shape(&l->key[i], &k)) {
            l->last_use[i] = ++l->clock;
            *hit = true;
            return i;
        }
        if (!l->valid[i] || (l->valid[slot] && l->last_use[i] < l->last_use[slot])) slot = i;
    }
    l->valid[slot] = false;
    *hit = false;
    return slot;
}

void vk_rec_recorded(rec_lru *l, int slot, rec_key k) {
    l->key[slot] = k;
    l->valid[slot] = true;
    l->last_use[slot] = ++l->clock;
}

void vk_rec_invalidate(rec_lru *l) {
    for (int i = 0; i < N_RECORDINGS; i++) l->valid[i] = false;
}

/* One sequence: the sizes where the ops switch kernels. Batches: each token
 * kernels for one token and the tiled ones for those sizes less one (with one
 * wanted tiled row: the tiled head), and each tokens for every slot; without
 * the logits copy (it uses no pipeline, and these rows may not fit yet). */
static int warm_shapes(const moex_vk_state *s, bool batches, rec_key keys[16]) {
    int64_t sizes[8];
    const int n = moex_vk_warm_batch_sizes(s->n_batch, sizes);
    int nk = 0;
    for (int i = 0; i < n; i++) keys[nk++] = (rec_key){.n = sizes[i], .copy_logits = true};
    if (!batches) return nk;
    for (int i = 0; i < n && nk < 15; i++)
        keys[nk++] = (rec_key){.n = sizes[i], .batch = true, .each = 1, .rows = sizes[i] > 1 ? 2 : 1};
    const int64_t each = s->n_seq < s->n_batch ? s->n_seq : s->n_batch;
    keys[nk++] = (rec_key){.n = each, .batch = true, .each = each, .rows = each};
    if (s->n_batch > 1 && nk < 16)   /* a verify: one slot's rows, every one on the one-token kernels */
        keys[nk++] = (rec_key){.n = 2, .batch = true, .each = 2, .rows = 2, .each_same_seq = true};
    return nk;
}

int vk_warm(const moex_model *m, moex_vk_state *s, bool batches, vk_record_fn record, moex_error *err) {
    rec_key keys[16];
    const int n = warm_shapes(s, batches, keys);
    moex_vk_cmd *c = moex_vk_cmd_create(s->vk, err);
    if (!c) return -1;
    moex_vk_warm_begin(s->vk);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = record(m, s, c, &keys[i], err);
    moex_vk_cmd_free(c);
    const int rc_end = moex_vk_warm_end(s->vk, rc ? NULL : err);
    return rc || rc_end ? -1 : 0;
}
