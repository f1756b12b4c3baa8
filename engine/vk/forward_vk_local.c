/* The local forward pass on Vulkan (moex-hub --local, see
 * forward_vk_internal.h): the same ops in the same order as engine/forward.c,
 * recorded into one command buffer per batch shape. Decode reuses its
 * recording for every token: the token ids, positions (and a batch's slots)
 * go through the host-visible I/O buffer the kernels read, so a step is one
 * submit and no host round trip inside it. */
#include "engine/vk/forward_vk_internal.h"

static int record_forward(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, const rec_key *k, moex_error *err) {
    if (moex_vk_cmd_begin(c, err) || vk_record_embed(m, s, c, k->n, err)) return -1;
    for (int il = 0; il < m->hp.n_layer; il++)
        if (vk_record_attention(m, s, c, il, k, err) || vk_record_ffn(m, s, c, il, k, err)) return -1;
    if (vk_record_head(m, s, c, k, err)) return -1;
    if (k->copy_logits) vk_record_logits_copy(m, s, c, k);
    return moex_vk_cmd_end(c, err);
}

/* The recording for this batch shape: reused when it exists, else recorded in the least recently used slot. */
static moex_vk_cmd *get_recording(const moex_model *m, moex_vk_state *s, const rec_key *k, moex_error *err) {
    bool hit;
    const int i = vk_rec_find(&s->rec_lru, *k, &hit);
    if (hit) return s->rec[i];
    if (!s->rec[i] && !(s->rec[i] = moex_vk_cmd_create(s->vk, err))) return NULL;
    if (record_forward(m, s, s->rec[i], k, err)) return NULL;
    vk_rec_recorded(&s->rec_lru, i, *k);
    return s->rec[i];
}

int vk_local_forward(const moex_model *m, moex_vk_state *s, const int32_t *tokens, int64_t n, int64_t pos,
                     bool all_logits, float *logits, moex_error *err) {
    const rec_key k = {.n = n, .all_logits = all_logits, .copy_logits = logits != NULL};
    moex_vk_cmd *c = get_recording(m, s, &k, err);
    if (!c) return -1;
    const int32_t *io = vk_io_set(s, tokens, n, pos);
    if (moex_vk_cmd_run(c, err)) return -1;
    vk_take_outputs(m, s, io, all_logits ? n : 1, logits);
    return 0;
}

int vk_local_forward_batch(const moex_model *m, moex_vk_state *s, const rec_key *k, moex_error *err) {
    moex_vk_cmd *c = get_recording(m, s, k, err);
    return c && !moex_vk_cmd_run(c, err) ? 0 : -1;
}

void vk_local_invalidate(moex_vk_state *s) { vk_rec_invalidate(&s->rec_lru); }

void vk_local_free(moex_vk_state *s) {
    for (int i = 0; i < N_RECORDINGS; i++) moex_vk_cmd_free(s->rec[i]);
}

int vk_local_warm(const moex_model *m, moex_vk_state *s, bool batches, moex_error *err) {
    return vk_warm(m, s, batches, record_forward, err);
}
