/* The distributed hub's forward pass on Vulkan (one of the two paths over
 * the recording layer, see forward_vk_internal.h): the GPU runs everything
 * but the experts, which go to an executor (workers, or the CPU) between
 * layer segments.
 *
 * Segment l (recorded once per batch shape, like the local path's token; a
 * batch of several sequences the same way, its tokens in their run order):
 *   l == 0: embed; else x += result (the host-visible buffer the host wrote
 *   layer l-1's expert sum into); then for l < n_layer attention of layer l,
 *   FFN norm + router, and two small copies (xn; ids and gates) into a
 *   host-visible readback buffer; segment n_layer runs the head instead.
 * Each segment is one submit and fence wait: the host's result write precedes
 * the submit that reads it. (Submitting a token's segments at once on a
 * timeline semaphore, the host signalling between layers, was tried and
 * dropped: no faster, and wrong logits on one driver; docs/PERF.md.)
 *
 * A failing exec.run stops the forward before the next segment is submitted:
 * the layers already run wrote KV rows for these positions, but every forward
 * writes its own rows before attention reads them, so a retry at the same
 * position sees none of it (the CPU path's contract). */
#include <stdlib.h>
#include <string.h>

#include "engine/vk/forward_vk_internal.h"

struct vk_dist {
    moex_expert_executor exec;
    int n_seg;                  /* n_layer + 1 */
    int n_used;                 /* experts per token */
    moex_vk_buffer *readback;   /* host-visible: xn [n_batch x n_embd] | ids [n_batch x k] | gates [n_batch x k] */
    moex_vk_buffer *result;     /* host-visible: the executor's out, n_batch x n_embd */
    size_t off_ids, off_gw;
    moex_vk_cmd **seg[N_RECORDINGS];   /* per slot of rec_lru: the n_layer + 1 segments of one batch shape */
    rec_lru rec_lru;
    moex_vk_dist_stats st;
};

bool vk_dist_active(const moex_vk_state *s) { return s->dist && s->dist->exec.run; }

static bool state_is_moe(const moex_vk_state *s) { return s->layers[0].router.data != 0; }

static void free_segments(vk_dist *d, moex_vk_cmd **seg) {
    if (seg)
        for (int i = 0; i < d->n_seg; i++) moex_vk_cmd_free(seg[i]);
    free(seg);
}

void vk_dist_free(moex_vk_state *s) {
    vk_dist *d = s->dist;
    if (!d) return;
    for (int i = 0; i < N_RECORDINGS; i++) free_segments(d, d->seg[i]);
    moex_vk_buffer_free(d->readback);
    moex_vk_buffer_free(d->result);
    free(d);
    s->dist = NULL;
}

void vk_dist_invalidate(moex_vk_state *s) {
    if (!s->dist) return;
    vk_rec_invalidate(&s->dist->rec_lru);
}

static vk_dist *dist_create(const moex_model *m, moex_vk_state *s, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    vk_dist *d = calloc(1, sizeof *d);
    if (!d) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    s->dist = d;   /* vk_dist_free cleans up a half-made one */
    d->n_seg = hp->n_layer + 1;
    d->n_used = hp->n_expert_used;
    const size_t nb = (size_t)s->n_batch, xn_bytes = nb * (size_t)hp->n_embd * 4, kb = nb * (size_t)d->n_used * 4;
    /* ids and gates sit next to each other in the activation plan: one copy takes both */
    const size_t ids_to_gw = s->a.gw - s->a.ids;
    d->off_ids = xn_bytes;
    d->off_gw = xn_bytes + ids_to_gw;
    if (!(d->readback = moex_vk_buffer_create(s->vk, xn_bytes + ids_to_gw + kb, MOEX_VK_MEM_HOST, err)) ||
        !(d->result = moex_vk_buffer_create(s->vk, xn_bytes, MOEX_VK_MEM_HOST, err)))
        goto fail;
    if (!moex_vk_buffer_map(d->readback) || !moex_vk_buffer_map(d->result)) {
        moex_fail(err, "vulkan: %s gives no mappable host-visible memory for the per-layer hand-off; "
                  "pick another device (--device) or run the hub on the CPU", moex_vk_get_info(s->vk)->name);
        goto fail;
    }
    memset(moex_vk_buffer_map(d->result), 0, xn_bytes);
    return d;
fail:
    vk_dist_free(s);
    return NULL;
}

int moex_vk_state_set_executor(const moex_model *m, moex_vk_state *s, moex_expert_executor exec, moex_error *err) {
    if (!state_is_moe(s)) return 0;   /* dense: no experts to send anywhere */
    if (!exec.run) {
        if (s->experts_remote)
            return moex_fail(err, "vulkan: this state was created without the experts: it needs an executor");
        if (s->dist) s->dist->exec = exec;
        return 0;
    }
    if (!s->dist && !dist_create(m, s, err)) return -1;
    s->dist->exec = exec;
    return 0;
}

void moex_vk_state_dist_stats(moex_vk_state *s, moex_vk_dist_stats *st, bool reset) {
    if (!s->dist) {
        *st = (moex_vk_dist_stats){0};
        return;
    }
    *st = s->dist->st;
    if (reset) s->dist->st = (moex_vk_dist_stats){0};
}

/* ---- recording ---- */

/* Segment il: the previous layer's result into x, then layer il up to its
 * router and the readback (il < n_layer), or the head (il == n_layer). */
static int record_segment(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, const rec_key *k,
                          moex_error *err) {
    const moex_hparams *hp = &m->hp;
    vk_dist *d = s->dist;
    const int64_t n = k->n;
    const size_t nd = (size_t)n * (size_t)hp->n_embd, nk = (size_t)n * (size_t)hp->n_expert_used;
    if (moex_vk_cmd_begin(c, err)) return -1;
    if (il == 0) {
        if (vk_record_embed(m, s, c, n, err)) return -1;
    } else {
        /* x += result, read straight from host-visible memory (n x n_embd floats: small) */
        moex_vk_cmd_label(c, "expert_add");
        if (moex_vk_op_eltwise(c, 0, ACT(x), moex_vk_buffer_ptr(d->result), ACT(x), (int64_t)nd, err)) return -1;
        moex_vk_barrier(c);
    }
    if (il < hp->n_layer) {
        if (vk_record_attention(m, s, c, il, k, err) || vk_record_router(m, s, c, il, k, err)) return -1;
        moex_vk_cmd_label(c, "readback");
        moex_vk_copy(c, d->readback, 0, s->act, s->a.xn, nd * 4);
        moex_vk_copy(c, d->readback, d->off_ids, s->act, s->a.ids, (d->off_gw - d->off_ids) + nk * 4);
    } else {
        if (vk_record_head(m, s, c, k, err)) return -1;
        if (k->copy_logits) vk_record_logits_copy(m, s, c, k);
    }
    return moex_vk_cmd_end(c, err);   /* ends with a barrier that makes the copies visible to the host */
}

/* The segments for this batch shape: reused when recorded, else recorded into the least recently used slot. */
static moex_vk_cmd **get_segments(const moex_model *m, moex_vk_state *s, const rec_key *k, moex_error *err) {
    vk_dist *d = s->dist;
    bool hit;
    const int i = vk_rec_find(&d->rec_lru, *k, &hit);
    if (hit) return d->seg[i];
    if (!d->seg[i] && !(d->seg[i] = calloc((size_t)d->n_seg, sizeof *d->seg[i]))) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    moex_vk_cmd **seg = d->seg[i];
    for (int il = 0; il < d->n_seg; il++) {
        if (!seg[il] && !(seg[il] = moex_vk_cmd_create(s->vk, err))) return NULL;
        if (record_segment(m, s, seg[il], il, k, err)) return NULL;
    }
    vk_rec_recorded(&d->rec_lru, i, *k);
    return seg;
}

/* Every segment of one forward of shape k into c (vk_warm's recording). */
static int record_segments(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, const rec_key *k, moex_error *err) {
    for (int il = 0; il < s->dist->n_seg; il++)
        if (record_segment(m, s, c, il, k, err)) return -1;
    return 0;
}

int vk_dist_warm(const moex_model *m, moex_vk_state *s, bool batches, moex_error *err) {
    return vk_warm(m, s, batches, record_segments, err);
}

/* ---- running ---- */

/* exec.run on layer il's readback, the sum into the result buffer. */
static int run_experts(vk_dist *d, int il, int64_t n, moex_error *err) {
    const char *rb = moex_vk_buffer_map(d->readback);
    const moex_moe_request req = {.layer = il, .n_tokens = n, .n_used = d->n_used,
                                  .expert_ids = (const int32_t *)(rb + d->off_ids),
                                  .gate_weights = (const float *)(rb + d->off_gw), .x = (const float *)rb,
                                  .out = moex_vk_buffer_map(d->result)};
    const double t0 = moex_time_s();
    const int rc = d->exec.run(d->exec.ctx, &req, err);
    d->st.exec_s += moex_time_s() - t0;
    return rc ? -1 : 0;
}

/* Adds the host's wait for one segment to the stats: layer 0 and the head apart from the middle layers. */
static void time_segment(vk_dist *d, int il, double since) {
    const double dt = moex_time_s() - since;
    if (il == 0) {
        d->st.first_s += dt;
    } else if (il == d->n_seg - 1) {
        d->st.head_s += dt;
    } else {
        d->st.gpu_s += dt;
        d->st.segments++;
    }
}

static int run_segments(vk_dist *d, moex_vk_cmd **seg, int64_t n, moex_error *err) {
    for (int il = 0; il < d->n_seg; il++) {
        const double t0 = moex_time_s();
        if (moex_vk_cmd_run(seg[il], err)) return -1;
        time_segment(d, il, t0);
        if (il < d->n_seg - 1 && run_experts(d, il, n, err)) return -1;   /* nothing queued: just stop */
    }
    return 0;
}

int vk_dist_forward(const moex_model *m, moex_vk_state *s, const int32_t *tokens, int64_t n, int64_t pos,
                    bool all_logits, float *logits, moex_error *err) {
    vk_dist *d = s->dist;
    const double t0 = moex_time_s();
    const rec_key k = {.n = n, .all_logits = all_logits, .copy_logits = logits != NULL};
    moex_vk_cmd **seg = get_segments(m, s, &k, err);
    if (!seg) return -1;
    const int32_t *io = vk_io_set(s, tokens, n, pos);
    if (run_segments(d, seg, n, err)) return -1;
    vk_take_outputs(m, s, io, all_logits ? n : 1, logits);
    d->st.forwards++;
    d->st.total_s += moex_time_s() - t0;
    return 0;
}

/* A batch (its I/O words written): the executor gets its tokens in their run order, one request per layer. */
int vk_dist_forward_batch(const moex_model *m, moex_vk_state *s, const rec_key *k, moex_error *err) {
    vk_dist *d = s->dist;
    const double t0 = moex_time_s();
    moex_vk_cmd **seg = get_segments(m, s, k, err);
    if (!seg || run_segments(d, seg, k->n, err)) return -1;
    d->st.forwards++;
    d->st.total_s += moex_time_s() - t0;
    return 0;
}
