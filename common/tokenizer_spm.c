/* SentencePiece BPE (tokenizer.ggml.model "llama"), as llama.cpp's
 * llm_tokenizer_spm_session: start from UTF-8 characters, repeatedly merge
 * the adjacent pair whose concatenation is the highest-scoring token (ties:
 * leftmost), then spell any leftover non-token piece as <0xXX> byte tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer_heap.h"
#include "common/tokenizer_impl.h"
#include "common/unicode.h"

typedef struct spm_symbol {
    int32_t prev, next;
    uint32_t start, n;   /* byte span; n == 0 once merged away */
} spm_symbol;

typedef struct spm_state {
    const moex_tokenizer *tok;
    const char *text;
    spm_symbol *syms;
    moex_bigram_heap heap;   /* highest score first */
} spm_state;

static int32_t vocab_find(const moex_tokenizer *tok, const char *s, size_t n) {
    int32_t id = moex_strtab_find(&tok->strs, s, n);
    return id < tok->n_vocab ? id : -1;
}

static int try_add_bigram(spm_state *st, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return 0;
    const spm_symbol *l = &st->syms[left], *r = &st->syms[right];
    int32_t id = vocab_find(st->tok, st->text + l->start, l->n + r->n);
    if (id < 0) return 0;
    moex_bigram b = {.priority = st->tok->scores[id], .left = left, .size = l->n + r->n};
    return moex_bigram_heap_push(&st->heap, b);
}

/* The token for one raw byte: <0xXX>, else the byte itself as a token, else unk. */
static int32_t byte_token(const moex_tokenizer *tok, uint8_t byte) {
    char hex[8];
    snprintf(hex, sizeof hex, "<0x%02X>", byte);
    int32_t id = vocab_find(tok, hex, 6);
    if (id < 0) id = vocab_find(tok, (const char *)&byte, 1);
    return id >= 0 ? id : tok->unk;
}

static int emit_symbol(spm_state *st, const spm_symbol *s, moex_i32vec *out) {
    int32_t id = vocab_find(st->tok, st->text + s->start, s->n);
    if (id >= 0) return moex_i32vec_push(out, id);
    for (uint32_t j = 0; j < s->n; j++) {
        int32_t b = byte_token(st->tok, (uint8_t)st->text[s->start + j]);
        if (b >= 0 && moex_i32vec_push(out, b)) return -1;
    }
    return 0;
}

/* Merges symbols [a, b) among themselves and emits their tokens. */
static int encode_chunk(spm_state *st, int32_t a, int32_t b, moex_i32vec *out) {
    for (int32_t i = a; i < b; i++) {
        st->syms[i].prev = i - 1 >= a ? i - 1 : -1;
        st->syms[i].next = i + 1 < b ? i + 1 : -1;
    }
    st->heap.n = 0;
    for (int32_t i = a + 1; i < b; i++)
        if (try_add_bigram(st, i - 1, i)) return -1;
    while (st->heap.n) {
        moex_bigram bg = moex_bigram_heap_pop(&st->heap);
        spm_symbol *l = &st->syms[bg.left];
        if (l->n == 0 || l->next < 0) continue;   /* stale */
        spm_symbol *r = &st->syms[l->next];
        if (l->n + r->n != bg.size) continue;      /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) st->syms[r->next].prev = bg.left;
        if (try_add_bigram(st, l->prev, bg.left) || try_add_bigram(st, bg.left, l->next)) return -1;
    }
    for (int32_t i = a; i != -1; i = st->syms[i].next)
        if (emit_symbol(st, &st->syms[i], out)) return -1;
    return 0;
}

static bool symbol_is_space(const spm_state *st, int32_t i) {
    const spm_symbol *s = &st->syms[i];
    return s->n == 3 && !memcmp(st->text + s->start, "\xe2\x96\x81", 3);
}

int moex_spm_encode(const moex_tokenizer *tok, const char *text, size_t len, moex_i32vec *out, moex_error *err) {
    if (len == 0) return 0;
    if (len > (size_t)INT32_MAX) return moex_fail(err, "tokenize: text of %zu bytes is too long", len);
    spm_state st = {.tok = tok, .text = text};
    st.syms = malloc(sizeof *st.syms * len);
    int rc = -1;
    if (!st.syms) goto done;
    /* One symbol per UTF-8 character (by its lead byte; a truncated one keeps what is left). */
    int32_t n = 0;
    for (size_t off = 0; off < len; n++) {
        size_t k = moex_utf8_seq_len((uint8_t)text[off]);
        if (k > len - off) k = len - off;
        st.syms[n] = (spm_symbol){.start = (uint32_t)off, .n = (uint32_t)k};
        off += k;
    }
    /* The merge order is global, but when no token has U+2581 after its
     * leading run of them (tok->spm_word_cuts), no merge can cross the start
     * of a run of spaces, so words merge independently: same result, and a
     * small heap instead of one the size of the text. */
    int32_t a = 0;
    for (int32_t i = 1; i < n; i++) {
        if (!tok->spm_word_cuts || !symbol_is_space(&st, i) || symbol_is_space(&st, i - 1)) continue;
        if (encode_chunk(&st, a, i, out)) goto done;
        a = i;
    }
    if (encode_chunk(&st, a, n, out)) goto done;
    rc = 0;
done:
    if (rc) moex_fail(err, "tokenize: out of memory");
    free(st.syms);
    moex_bigram_heap_free(&st.heap);
    return rc;
}
