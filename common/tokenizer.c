/* The tokenizer API: special-token splitting, dispatch to BPE or SPM, and
 * decoding. Loading lives in tokenizer_load.c; the algorithms in
 * tokenizer_bpe.c, tokenizer_spm.c and tokenizer_pretok.c. */
#include <stdlib.h>
#include <string.h>   /* memmem: _GNU_SOURCE comes from the build */

#include "common/tokenizer_impl.h"

int32_t moex_tokenizer_n_vocab(const moex_tokenizer *tok) { return tok ? tok->n_vocab : 0; }
int32_t moex_tokenizer_bos(const moex_tokenizer *tok) { return tok ? tok->bos : -1; }
int32_t moex_tokenizer_eos(const moex_tokenizer *tok) { return tok ? tok->eos : -1; }
bool moex_tokenizer_adds_bos(const moex_tokenizer *tok) { return tok && tok->add_bos; }

bool moex_tokenizer_is_eog(const moex_tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_vocab) return false;
    return (tok->eog_bits[id >> 3] >> (id & 7)) & 1;
}

/* ---- special-token partition (llama.cpp's tokenizer_st_partition) ---- */

/* A piece of the input: raw text [off, off+len) or a special token. */
typedef struct fragment {
    int32_t token;   /* -1: raw text */
    size_t off, len;
} fragment;

typedef struct fragvec {
    fragment *v;
    size_t n, cap;
} fragvec;

static int frag_push(fragvec *f, fragment x) {
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        fragment *v = realloc(f->v, sizeof *v * cap);
        if (!v) return -1;
        f->v = v;
        f->cap = cap;
    }
    f->v[f->n++] = x;
    return 0;
}

/* Special tokens are matched only when parse_special, except user-defined
 * ones, which are always split out first (as Hugging Face does). */
static bool special_active(const moex_tokenizer *tok, int32_t id, bool parse_special) {
    return parse_special || !(tok->attr[id] & (MOEX_ATTR_CONTROL | MOEX_ATTR_UNKNOWN));
}

/* Marks in found[] (indices into special_ids) the active special tokens that
 * occur anywhere in text: one pass, filtered on the first two bytes, with
 * first-byte buckets, so the exact partition below only runs for tokens that
 * are there. */
static void find_present_specials(const moex_tokenizer *tok, const char *text, size_t len, bool parse_special, bool *found) {
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)text[i], b2 = i + 1 < len ? (uint8_t)text[i + 1] : 0;
        /* At the last byte only one-byte tokens fit: those set every bit, b2 = 0 among them. */
        if (!((tok->special_second[b][b2 >> 5] >> (b2 & 31)) & 1)) continue;
        for (int32_t k = tok->special_first[b]; k < tok->special_first[b + 1]; k++) {
            int32_t si = tok->special_by_byte[k];
            if (found[si]) continue;
            int32_t id = tok->special_ids[si];
            size_t n;
            const char *s = moex_strtab_str(&tok->strs, id, &n);
            if (n <= len - i && !memcmp(text + i, s, n) && special_active(tok, id, parse_special)) found[si] = true;
        }
    }
}

/* Splits every raw fragment of in at each occurrence of token id, into out. */
static int split_on_token(const moex_tokenizer *tok, const char *text, int32_t id, const fragvec *in, fragvec *out) {
    size_t n;
    const char *s = moex_strtab_str(&tok->strs, id, &n);
    out->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        fragment f = in->v[i];
        if (f.token >= 0) {
            if (frag_push(out, f)) return -1;
            continue;
        }
        size_t pos = f.off, end = f.off + f.len;
        for (;;) {
            const char *m = memmem(text + pos, end - pos, s, n);
            if (!m) break;
            size_t at = (size_t)(m - text);
            if (at > pos && frag_push(out, (fragment){-1, pos, at - pos})) return -1;
            if (frag_push(out, (fragment){id, at, n})) return -1;
            pos = at + n;
        }
        if (pos < end && frag_push(out, (fragment){-1, pos, end - pos})) return -1;
    }
    return 0;
}

static int partition(const moex_tokenizer *tok, const char *text, size_t len, bool parse_special, fragvec *frags) {
    frags->n = 0;
    if (len == 0) return 0;
    if (frag_push(frags, (fragment){-1, 0, len})) return -1;
    if (tok->n_special == 0) return 0;
    bool *found = calloc((size_t)tok->n_special, sizeof *found);
    if (!found) return -1;
    find_present_specials(tok, text, len, parse_special, found);
    fragvec tmp = {0};
    int rc = 0;
    for (int32_t si = 0; si < tok->n_special && !rc; si++) {
        if (!found[si]) continue;
        rc = split_on_token(tok, text, tok->special_ids[si], frags, &tmp);
        fragvec t = *frags;
        *frags = tmp;
        tmp = t;
    }
    free(tmp.v);
    free(found);
    return rc;
}

/* ---- encoding ---- */

/* SPM input for one fragment: optional leading space, spaces as U+2581. */
static int spm_escape(const char *s, size_t len, bool prefix_space, moex_bytebuf *out) {
    out->n = 0;
    if (prefix_space && moex_bytebuf_append(out, "\xe2\x96\x81", 3)) return -1;
    for (size_t i = 0; i < len; i++) {
        int rc = s[i] == ' ' ? moex_bytebuf_append(out, "\xe2\x96\x81", 3) : moex_bytebuf_append(out, s + i, 1);
        if (rc) return -1;
    }
    return 0;
}

static int encode_fragments(const moex_tokenizer *tok, const char *text, const fragvec *frags, moex_i32vec *out, moex_error *err) {
    moex_bytebuf esc = {0};
    bool prev_special = true;   /* SPM: a space prefix for the text at the start and after specials */
    int rc = 0;
    for (size_t i = 0; i < frags->n && !rc; i++) {
        const fragment *f = &frags->v[i];
        if (f->token >= 0) {
            rc = moex_i32vec_push(out, f->token) ? moex_fail(err, "tokenize: out of memory") : 0;
            prev_special = true;
        } else if (tok->kind == MOEX_TOK_BPE) {
            rc = moex_bpe_encode(tok, text + f->off, f->len, out, err);
        } else {
            if (spm_escape(text + f->off, f->len, tok->add_space_prefix && prev_special, &esc))
                rc = moex_fail(err, "tokenize: out of memory");
            else
                rc = moex_spm_encode(tok, esc.v, esc.n, out, err);
            prev_special = false;
        }
    }
    moex_bytebuf_free(&esc);
    return rc;
}

int64_t moex_tokenize(const moex_tokenizer *tok, const char *text, size_t len, bool add_bos, bool parse_special,
                      int32_t *out, int64_t cap, moex_error *err) {
    if (!tok) return moex_fail(err, "tokenize: no tokenizer");
    if (!text && len) return moex_fail(err, "tokenize: no text");
    if (cap < 0 || (cap > 0 && !out)) return moex_fail(err, "tokenize: bad output buffer");
    moex_i32vec ids = {0};
    fragvec frags = {0};
    int64_t rc = -1;
    if (add_bos && tok->add_bos && moex_i32vec_push(&ids, tok->bos)) {
        moex_fail(err, "tokenize: out of memory");
        goto done;
    }
    if (partition(tok, text, len, parse_special, &frags)) {
        moex_fail(err, "tokenize: out of memory");
        goto done;
    }
    if (encode_fragments(tok, text, &frags, &ids, err)) goto done;
    if (cap > 0 && ids.n > 0) memcpy(out, ids.v, sizeof *out * (size_t)((int64_t)ids.n < cap ? (int64_t)ids.n : cap));
    rc = (int64_t)ids.n;
done:
    moex_i32vec_free(&ids);
    free(frags.v);
    return rc;
}

/* ---- decoding ---- */

/* The stored piece of id, or NULL (length 0) when it is not shown. */
static const char *piece_of(const moex_tokenizer *tok, int32_t id, bool render_special, size_t *len) {
    *len = 0;
    if (!render_special && (tok->attr[id] & (MOEX_ATTR_UNKNOWN | MOEX_ATTR_CONTROL))) return NULL;
    *len = (size_t)(tok->piece_off[id + 1] - tok->piece_off[id]);
    return tok->piece_blob + tok->piece_off[id];
}

int moex_token_to_piece(const moex_tokenizer *tok, int32_t id, bool render_special, char *buf, int cap) {
    if (!tok || id < 0 || id >= tok->n_vocab) return -1;
    size_t len;
    const char *p = piece_of(tok, id, render_special, &len);
    if (len > (size_t)INT32_MAX) return -1;
    if (cap >= 0 && len <= (size_t)cap && len) memcpy(buf, p, len);
    return (int)len;
}

int64_t moex_detokenize(const moex_tokenizer *tok, const int32_t *ids, int64_t n, bool render_special, char *buf,
                        int64_t cap, moex_error *err) {
    if (!tok) return moex_fail(err, "detokenize: no tokenizer");
    if (n < 0 || (n > 0 && !ids)) return moex_fail(err, "detokenize: bad token list");
    if (cap < 0 || (cap > 0 && !buf)) return moex_fail(err, "detokenize: bad output buffer");
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok->n_vocab)
            return moex_fail(err, "detokenize: token id %d at position %lld is out of range (vocabulary has %d tokens)",
                             ids[i], (long long)i, tok->n_vocab);
        size_t len;
        const char *p = piece_of(tok, ids[i], render_special, &len);
        /* llama.cpp drops one leading space of the first token (the space SPM added). */
        if (i == 0 && tok->add_space_prefix && len > 0 && p[0] == ' ') {
            p++;
            len--;
        }
        if (len > 0 && total < cap) memcpy(buf + total, p, (size_t)((int64_t)len < cap - total ? (int64_t)len : cap - total));
        total += (int64_t)len;
    }
    return total;
}
