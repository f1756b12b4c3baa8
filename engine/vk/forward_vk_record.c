/* Recording the pieces of a Vulkan forward pass, in engine/forward.c's order
 * (the layer above the memory plan, see forward_vk_internal.h): embedding,
 * per layer attention then FFN (router + experts, or dense), the output head.
 * Each piece but the head ends with a barrier, so the pieces compose into one
 * recording per token (--local) or one per layer segment (distributed hub).
 * Each piece records one sequence's tokens (kernels picked by n) or a batch
 * of several (rec_key.batch): its each tokens (rows [0, each)) on one
 * token's kernels, its tiled tokens (rows [each, n)) on the prompt kernels. */
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

/* Row r of the activation at p, whose rows are width floats. */
static moex_vk_ptr row_at(moex_vk_ptr p, int64_t r, int64_t width) { return p + (size_t)r * (size_t)width * 4; }

static int record_attention_one(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, int64_t n,
                                moex_error *err) {
    const moex_hparams *hp = &m->hp;
    const vk_layer *L = &s->layers[il];
    const moex_vk_ptr kc = vk_k_cache(m, s, il), vc = vk_v_cache(m, s, il);
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
                                        ACT(attn_scratch), ACT(sync) + SYNC_ATTN, IO(IO_PARAMS), s->grid, GRID_ONE,
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

/* A batch's q, k, v: the each tokens' with the norm fused where it stages
 * (else all rows normalised first), the tiled tokens' after their norm. */
static int record_qkv_batch(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, const vk_layer *L, const rec_key *k,
                            moex_error *err) {
    const moex_hparams *hp = &m->hp;
    const int64_t d = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    const int64_t ne = k->each, nt = k->n - k->each;
    const bool fused = moex_vk_norm_each(s->vk, d);
    const moex_vk_matrix *w[3] = {&L->wq, &L->wk, &L->wv};
    const moex_vk_ptr y[3] = {ACT(q), ACT(k), ACT(v)};
    const int64_t width[3] = {qd, kvd, kvd};
    moex_vk_cmd_label(c, "attn_norm_qkv");
    if (fused && ne && moex_vk_op_norm_matmul_multi_each(c, 3, w, y, ACT(x), L->attn_norm, hp->rms_eps, ne, err))
        return -1;
    const int64_t r0 = fused ? ne : 0;   /* the rows normalised apart */
    if (k->n > r0) {
        if (moex_vk_op_rmsnorm(c, row_at(ACT(xn), r0, d), row_at(ACT(x), r0, d), L->attn_norm, k->n - r0, d, hp->rms_eps,
                               err))
            return -1;
        moex_vk_barrier(c);
    }
    for (int i = 0; i < 3; i++)
        if ((!fused && ne && moex_vk_op_matmul_pick(c, MOEX_VK_EACH, w[i], ACT(xn), ne, y[i], 0, err)) ||
            (nt && moex_vk_op_matmul_pick(c, MOEX_VK_TILED, w[i], row_at(ACT(xn), ne, d), nt, row_at(y[i], ne, width[i]),
                                          0, err)))
            return -1;
    moex_vk_barrier(c);
    return 0;
}

/* A batch's attention: the tiled tokens' QK-norm, RoPE and KV append first
 * (the each tokens read what they append: a prompt's last token its earlier
 * ones), then the each tokens' fused decode step and the tiled tokens'
 * attention over their runs together, then Wo. */
static int record_attention_batch(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, const rec_key *k,
                                  moex_error *err) {
    const moex_hparams *hp = &m->hp;
    const vk_layer *L = &s->layers[il];
    const int64_t d = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    const int64_t ne = k->each, nt = k->n - k->each;
    const moex_vk_ptr kc = vk_k_cache(m, s, il), vc = vk_v_cache(m, s, il), tokpos = IO(s->io_tokpos);
    if (record_qkv_batch(m, s, c, L, k, err)) return -1;
    moex_vk_cmd_label(c, "attention");
    if (nt) {
        if (moex_vk_op_qk_rope_tokens(c, &s->sh, row_at(ACT(q), ne, qd), row_at(ACT(k), ne, kvd), row_at(ACT(v), ne, kvd),
                                      kc, vc, L->q_norm, L->k_norm, tokpos + (size_t)ne * 8, nt, err))
            return -1;
        moex_vk_barrier(c);
    }
    if (ne && moex_vk_op_attention_decode_tokens(c, &s->sh, ACT(q), ACT(k), ACT(v), kc, vc, L->q_norm, L->k_norm,
                                                 ACT(each_scratch), ACT(each_sync), tokpos, ne, k->each_same_seq, s->grid,
                                                 GRID_EACH, err))
        return -1;
    if (nt && moex_vk_op_attention_runs(c, &s->sh, row_at(ACT(q), ne, qd), kc, vc, row_at(ACT(att), ne, qd),
                                        ACT(attn_scratch), tokpos + (size_t)ne * 8, IO(s->io_blocks), s->grid, GRID_RUNS,
                                        nt, err))
        return -1;
    moex_vk_barrier(c);
    /* x += Wo att (the each tokens' result over q) */
    moex_vk_cmd_label(c, "attn_out");
    if ((ne && moex_vk_op_matmul_pick(c, MOEX_VK_EACH, &L->wo, ACT(q), ne, ACT(x), ACT(x), err)) ||
        (nt && moex_vk_op_matmul_pick(c, MOEX_VK_TILED, &L->wo, row_at(ACT(att), ne, qd), nt, row_at(ACT(x), ne, d),
                                      row_at(ACT(x), ne, d), err)))
        return -1;
    moex_vk_barrier(c);
    return 0;
}

int vk_record_attention(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, const rec_key *k,
                        moex_error *err) {
    return k->batch ? record_attention_batch(m, s, c, il, k, err) : record_attention_one(m, s, c, il, k->n, err);
}

/* A batch's router: the each tokens' with the norm fused where it stages
 * (writing their xn), the tiled tokens' on the tiles; the rows apart. */
static int record_router_batch(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, const vk_layer *L,
                               const rec_key *k, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    const int64_t d = hp->n_embd, E = hp->n_expert, ne = k->each, nt = k->n - k->each;
    const int kk = hp->n_expert_used;
    const bool fused = moex_vk_norm_each(s->vk, d);
    moex_vk_cmd_label(c, "ffn_norm_router");
    if (fused && ne &&
        moex_vk_op_norm_router_each(c, &L->router, ACT(x), L->ffn_norm, hp->rms_eps, ne, kk, hp->norm_topk,
                                    ACT(router_logits), ACT(counter), ACT(ids), ACT(gw), ACT(xn), err))
        return -1;
    const int64_t r0 = fused ? ne : 0;
    if (k->n > r0) {
        if (moex_vk_op_rmsnorm(c, row_at(ACT(xn), r0, d), row_at(ACT(x), r0, d), L->ffn_norm, k->n - r0, d, hp->rms_eps,
                               err))
            return -1;
        moex_vk_barrier(c);
    }
    if ((!fused && ne &&
         moex_vk_op_router_pick(c, MOEX_VK_EACH, &L->router, ACT(xn), ne, kk, hp->norm_topk, ACT(router_logits),
                                ACT(counter), ACT(ids), ACT(gw), err)) ||
        (nt && moex_vk_op_router_pick(c, MOEX_VK_TILED, &L->router, row_at(ACT(xn), ne, d), nt, kk, hp->norm_topk,
                                      row_at(ACT(router_logits), ne, E), ACT(counter), row_at(ACT(ids), ne, kk),
                                      row_at(ACT(gw), ne, kk), err)))
        return -1;
    moex_vk_barrier(c);
    return 0;
}

int vk_record_router(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, const rec_key *k, moex_error *err) {
    if (k->batch) return record_router_batch(m, s, c, &s->layers[il], k, err);
    const int64_t n = k->n;
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

/* A batch: the each tokens, then (the scratch is shared) the tiled ones. */
int vk_record_experts(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, const rec_key *k,
                      moex_error *err) {
    const moex_hparams *hp = &m->hp;
    const moex_vk_experts *e = &s->layers[il].experts;
    const int kk = hp->n_expert_used;
    const int64_t d = hp->n_embd, ne = k->batch ? k->each : 0, nt = k->n - ne;
    moex_vk_cmd_label(c, "experts");
    if (ne) {
        if (moex_vk_op_experts_pick(c, MOEX_VK_EACH, e, ACT(xn), ne, kk, ACT(ids), ACT(gw), ACT(x), ACT(x),
                                    ACT(ex_scratch), err))
            return -1;
        moex_vk_barrier(c);
    }
    if (nt) {
        if (moex_vk_op_experts_pick(c, k->batch ? MOEX_VK_TILED : MOEX_VK_BY_N, e, row_at(ACT(xn), ne, d), nt, kk,
                                    row_at(ACT(ids), ne, kk), row_at(ACT(gw), ne, kk), row_at(ACT(x), ne, d),
                                    row_at(ACT(x), ne, d), ACT(ex_scratch), err))
            return -1;
        moex_vk_barrier(c);
    }
    return 0;
}

/* y = W x (+ resid) over the shape's rows: by n, or a batch's each rows and tiled rows apart (xw, yw: row widths). */
static int matmul_rows(moex_vk_cmd *c, const rec_key *k, const moex_vk_matrix *w, moex_vk_ptr x, int64_t xw,
                       moex_vk_ptr y, moex_vk_ptr resid, int64_t yw, moex_error *err) {
    if (!k->batch) return moex_vk_op_matmul(c, w, x, k->n, y, resid, err);
    const int64_t ne = k->each, nt = k->n - ne;
    return (ne && moex_vk_op_matmul_pick(c, MOEX_VK_EACH, w, x, ne, y, resid, err)) ||
                   (nt && moex_vk_op_matmul_pick(c, MOEX_VK_TILED, w, row_at(x, ne, xw), nt, row_at(y, ne, yw),
                                                 resid ? row_at(resid, ne, yw) : 0, err))
               ? -1
               : 0;
}

static int record_dense_ffn(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, const rec_key *k,
                            moex_error *err) {
    const moex_hparams *hp = &m->hp;
    const vk_layer *L = &s->layers[il];
    const int64_t n = k->n, d = hp->n_embd, f = hp->n_ff;
    moex_vk_cmd_label(c, "ffn_norm");
    if (moex_vk_op_rmsnorm(c, ACT(xn), ACT(x), L->ffn_norm, n, d, hp->rms_eps, err)) return -1;
    moex_vk_barrier(c);
    moex_vk_cmd_label(c, "ffn");
    if (matmul_rows(c, k, &L->ffn_gate, ACT(xn), d, ACT(ff_g), 0, f, err) ||
        matmul_rows(c, k, &L->ffn_up, ACT(xn), d, ACT(ff_u), 0, f, err))
        return -1;
    moex_vk_barrier(c);
    if (moex_vk_op_eltwise(c, 1, ACT(ff_g), ACT(ff_u), ACT(ff_g), n * f, err)) return -1;
    moex_vk_barrier(c);
    if (matmul_rows(c, k, &L->ffn_down, ACT(ff_g), f, ACT(x), ACT(x), d, err)) return -1;
    moex_vk_barrier(c);
    return 0;
}

int vk_record_ffn(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, int il, const rec_key *k, moex_error *err) {
    if (!moex_hparams_is_moe(&m->hp)) return record_dense_ffn(m, s, c, il, k, err);
    return vk_record_router(m, s, c, il, k, err) || vk_record_experts(m, s, c, il, k, err) ? -1 : 0;
}

/* A batch's head: the each tokens' logits with the norm fused where it
 * stages, then the wanted tiled tokens' (rows each .. rows - 1). */
static int record_head_batch(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, const rec_key *k, moex_error *err) {
    const moex_hparams *hp = &m->hp;
    const int64_t d = hp->n_embd, V = hp->n_vocab, ne = k->each, nt = k->rows - k->each;
    const bool fused = moex_vk_norm_each(s->vk, d);
    const moex_vk_ptr logits = moex_vk_buffer_ptr(s->logits_dev);
    moex_vk_cmd_label(c, "output_head");
    if (fused && ne && moex_vk_op_norm_matmul_each(c, &s->output, ACT(x), s->output_norm, hp->rms_eps, ne, logits, 0, err))
        return -1;
    const int64_t r0 = fused ? ne : 0;
    if (k->rows > r0) {
        if (moex_vk_op_rmsnorm(c, row_at(ACT(xn), r0, d), row_at(ACT(x), r0, d), s->output_norm, k->rows - r0, d,
                               hp->rms_eps, err))
            return -1;
        moex_vk_barrier(c);
    }
    if ((!fused && ne && moex_vk_op_matmul_pick(c, MOEX_VK_EACH, &s->output, ACT(xn), ne, logits, 0, err)) ||
        (nt && moex_vk_op_matmul_pick(c, MOEX_VK_TILED, &s->output, row_at(ACT(xn), ne, d), nt, row_at(logits, ne, V), 0,
                                      err)))
        return -1;
    moex_vk_barrier(c);
    /* every row's argmax, so that a greedy row need not be read back (~10 us for 8 rows) */
    moex_vk_cmd_label(c, "rows_argmax");
    if (k->rows > 0) {
        if (moex_vk_op_argmax(c, logits, k->rows, V, V, IO(s->io_rows_argmax), err)) return -1;
        moex_vk_barrier(c);
    }
    return 0;
}

int64_t vk_rec_rows(const rec_key *k) { return k->batch ? k->rows : k->all_logits ? k->n : 1; }

int vk_record_head(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, const rec_key *k, moex_error *err) {
    if (k->batch) return record_head_batch(m, s, c, k, err);
    const int64_t n = k->n;
    const bool all_logits = k->all_logits;
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

void vk_record_logits_copy(const moex_model *m, moex_vk_state *s, moex_vk_cmd *c, const rec_key *k) {
    const int64_t rows = vk_rec_rows(k);
    if (rows <= 0) return;
    moex_vk_cmd_label(c, "logits_copy");
    moex_vk_copy(c, s->logits_host, 0, s->logits_dev, 0, (size_t)rows * (size_t)m->hp.n_vocab * 4);
}
