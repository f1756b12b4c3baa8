/* Recording the pieces of a Vulkan forward pass, in engine/forward.c's order
 * (the layer above the memory plan, see forward_vk_internal.h): embedding,
 * per layer attention then FFN (router + experts, or dense), the output head.
 * Each piece but the head ends with a barrier, so the pieces compose into one
 * recording per token (--local) or one per layer segment (distributed hub). */
#include "engine/vk/forward_vk_internal.h"

/* Completion counters of the decode kernels in the zeroed sync region: the
 * upper half (the lower is left to the other kernels' counters). Attention
 * and the head never run at once, but each keeps its own words anyway. */
#define SYNC_ATTN (SYNC_BYTES / 2)
#define SYNC_HEAD (SYNC_BYTES / 2 + 4096)

int vk_record_embed(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int64_t n, moex_error *err) {
    (void)m;
    moex_vk_cmd_label(c, "embed");
    if (moex_vk_op_dequant(c, &s->tok_embd, IO(IO_TOKENS), n, ACT(x), err)) return -1;
    moex_vk_barrier(c);
    return 0;
}

int vk_record_attention(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, int64_t n, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    const vk_layer *L = &s->layers[il];
    const size_t layer_cache = (size_t)s->n_ctx * (size_t)hp->n_head_kv * hp->head_dim * 4;
    const moex_vk_ptr kc = moex_vk_buffer_ptr(s->kv) + (size_t)il * layer_cache,
                      vc = kc + (size_t)hp->n_layer * layer_cache;
    moex_vk_cmd_label(c, "attn_norm_qkv");
    if (moex_vk_norm_fusable(s->vk, n, hp->n_embd) && hp->n_embd <= moex_vk_mv_staged_cols(s->vk)) {
        /* decode: q, k, v (those of one type) in one dispatch, each workgroup
         * staging rmsnorm(x) * nw once in shared memory: no norm pass */
        const moex_vk_matrix *w[3] = {&L->wq, &L->wk, &L->wv};
        const moex_vk_ptr y[3] = {ACT(q), ACT(k), ACT(v)};
        if (moex_vk_op_norm_matmul_multi(c, 3, w, y, ACT(x), L->attn_norm, hp->rms_eps, err)) return -1;
    } else {
        if (moex_vk_op_rmsnorm(c, ACT(xn), ACT(x), L->attn_norm, n, hp->n_embd, hp->rms_eps, err)) return -1;
        moex_vk_barrier(c);
        if (moex_vk_op_matmul(c, &L->wq, ACT(xn), n, ACT(q), 0, err) ||
            moex_vk_op_matmul(c, &L->wk, ACT(xn), n, ACT(k), 0, err) ||
            moex_vk_op_matmul(c, &L->wv, ACT(xn), n, ACT(v), 0, err))
            return -1;
    }
    moex_vk_barrier(c);
    if (n == 1 && (size_t)s->sh.n_head * 4 <= SYNC_HEAD - SYNC_ATTN) {
        /* decode: QK-norm, RoPE, KV append, attention and merge in one dispatch, the result over q */
        moex_vk_cmd_label(c, "attention");
        if (moex_vk_op_attention_decode(c, &s->sh, ACT(q), ACT(k), ACT(v), kc, vc, L->q_norm, L->k_norm,
                                        ACT(attn_scratch), ACT(sync) + SYNC_ATTN, IO(IO_PARAMS), s->grid, 0,
                                        err))
            return -1;
        moex_vk_barrier(c);
        moex_vk_cmd_label(c, "attn_out");
        if (moex_vk_op_matmul(c, &L->wo, ACT(q), n, ACT(x), ACT(x), err)) return -1;
        moex_vk_barrier(c);
        return 0;
    }
    moex_vk_cmd_label(c, "qk_norm_rope");
    if (moex_vk_op_qk_rope(c, &s->sh, ACT(q), ACT(k), ACT(v), kc, vc, L->q_norm, L->k_norm, IO(IO_PARAMS), n, err))
        return -1;
    moex_vk_barrier(c);
    moex_vk_cmd_label(c, "attention");
    if (moex_vk_op_attention(c, &s->sh, ACT(q), kc, vc, ACT(att), ACT(attn_scratch), IO(IO_PARAMS), n, err)) return -1;
    moex_vk_barrier(c);
    /* x += Wo att: the residual add is fused into the product */
    moex_vk_cmd_label(c, "attn_out");
    if (moex_vk_op_matmul(c, &L->wo, ACT(att), n, ACT(x), ACT(x), err)) return -1;
    moex_vk_barrier(c);
    return 0;
}

int vk_record_router(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, int64_t n, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    const vk_layer *L = &s->layers[il];
    moex_vk_cmd_label(c, "ffn_norm_router");
    if (moex_vk_norm_fusable(s->vk, n, hp->n_embd)) {   /* decode: the router normalises x and writes xn */
        if (moex_vk_op_norm_router(c, &L->router, ACT(x), L->ffn_norm, hp->rms_eps, hp->n_expert_used, hp->norm_topk,
                                   ACT(router_logits), ACT(counter), ACT(ids), ACT(gw), ACT(xn), err))
            return -1;
    } else {
        if (moex_vk_op_rmsnorm(c, ACT(xn), ACT(x), L->ffn_norm, n, hp->n_embd, hp->rms_eps, err)) return -1;
        moex_vk_barrier(c);
        if (moex_vk_op_router(c, &L->router, ACT(xn), n, hp->n_expert_used, hp->norm_topk, ACT(router_logits),
                              ACT(counter), ACT(ids), ACT(gw), err))
            return -1;
    }
    moex_vk_barrier(c);
    return 0;
}

int vk_record_experts(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, int64_t n, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    moex_vk_cmd_label(c, "experts");
    if (moex_vk_op_experts(c, &s->layers[il].experts, ACT(xn), n, hp->n_expert_used, ACT(ids), ACT(gw), ACT(x), ACT(x),
                           ACT(ex_scratch), err))
        return -1;
    moex_vk_barrier(c);
    return 0;
}

static int record_dense_ffn(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, int64_t n,
                            moex_error *err) {
    const moex_hparams *hp = &m->hp;
    const vk_layer *L = &s->layers[il];
    moex_vk_cmd_label(c, "ffn_norm");
    if (moex_vk_op_rmsnorm(c, ACT(xn), ACT(x), L->ffn_norm, n, hp->n_embd, hp->rms_eps, err)) return -1;
    moex_vk_barrier(c);
    moex_vk_cmd_label(c, "ffn");
    if (moex_vk_op_matmul(c, &L->ffn_gate, ACT(xn), n, ACT(ff_g), 0, err) ||
        moex_vk_op_matmul(c, &L->ffn_up, ACT(xn), n, ACT(ff_u), 0, err))
        return -1;
    moex_vk_barrier(c);
    if (moex_vk_op_eltwise(c, 1, ACT(ff_g), ACT(ff_u), ACT(ff_g), n * hp->n_ff, err)) return -1;
    moex_vk_barrier(c);
    if (moex_vk_op_matmul(c, &L->ffn_down, ACT(ff_g), n, ACT(x), ACT(x), err)) return -1;
    moex_vk_barrier(c);
    return 0;
}

int vk_record_ffn(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, int64_t n, moex_error *err) {
    if (!moex_hparams_is_moe(&m->hp)) return record_dense_ffn(m, s, c, il, n, err);
    return vk_record_router(m, s, c, il, n, err) || vk_record_experts(m, s, c, il, n, err) ? -1 : 0;
}

int vk_record_head(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int64_t n, bool all_logits, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    const int64_t rows = all_logits ? n : 1, d = hp->n_embd;
    moex_vk_cmd_label(c, "output_head");
    const moex_vk_ptr last = ACT(x) + (size_t)(all_logits ? 0 : n - 1) * (size_t)d * 4;
    const size_t head_sync = SYNC_BYTES - SYNC_HEAD;
    const bool one = rows == 1 && moex_vk_argmax_sync_bytes(s->output.rows) <= head_sync;
    /* one row of logits: the argmax rides on the head (its last workgroups
     * reduce the maxima), and where x can be staged the norm too, each of the
     * persistent workgroups normalising x once instead of a separate pass */
    const bool norm = one && moex_vk_norm_fusable(s->vk, 1, d) && d <= moex_vk_mv_staged_cols(s->vk) && last % 16 == 0;
    if (!norm) {
        if (moex_vk_op_rmsnorm(c, ACT(xn), last, s->output_norm, rows, d, hp->rms_eps, err)) return -1;
        moex_vk_barrier(c);
    }
    if (one) {
        if (moex_vk_op_matmul_argmax(c, &s->output, norm ? last : ACT(xn), norm ? s->output_norm : 0, hp->rms_eps,
                                     moex_vk_buffer_ptr(s->logits_dev), IO(IO_ARGMAX), ACT(sync) + SYNC_HEAD, head_sync,
                                     err))
            return -1;
        moex_vk_barrier(c);
        return 0;
    }
    if (moex_vk_op_matmul(c, &s->output, ACT(xn), rows, moex_vk_buffer_ptr(s->logits_dev), 0, err)) return -1;
    moex_vk_barrier(c);
    const moex_vk_ptr last_row = moex_vk_buffer_ptr(s->logits_dev) + (size_t)(rows - 1) * (size_t)hp->n_vocab * 4;
    moex_vk_cmd_label(c, "argmax");
    return moex_vk_op_argmax(c, last_row, 1, hp->n_vocab, hp->n_vocab, IO(IO_ARGMAX), err);
}

void vk_record_logits_copy(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int64_t n, bool all_logits) {
    moex_vk_cmd_label(c, "logits_copy");
    moex_vk_copy(c, s->logits_host, 0, s->logits_dev, 0, (size_t)(all_logits ? n : 1) * (size_t)m->hp.n_vocab * 4);
}
