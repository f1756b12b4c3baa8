/* Byte-level BPE (tokenizer.ggml.model "gpt2"): pre-tokenize into words,
 * map each byte to its GPT-2 character, then apply merges lowest rank first
 * (ties: leftmost), as llama.cpp's llm_tokenizer_bpe_session. Symbols carry
 * string ids, so a merge is one hash lookup on a pair of ints. */
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer_heap.h"
#include "common/tokenizer_impl.h"
#include "common/unicode.h"

#define EMPTY_KEY UINT64_MAX

static uint64_t pair_key(int32_t left, int32_t right) { return ((uint64_t)(uint32_t)left << 32) | (uint32_t)right; }
static size_t key_slot(uint64_t key, size_t mask) { return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & mask; }

int32_t moex_bpe_merge_rank(const moex_tokenizer *tok, int32_t left, int32_t right, int32_t *result) {
    if (left < 0 || right < 0 || !tok->n_merge_slots) return -1;
    uint64_t key = pair_key(left, right);
    size_t mask = tok->n_merge_slots - 1;
    for (size_t i = key_slot(key, mask);; i = (i + 1) & mask) {
        const moex_merge_slot *m = &tok->merges[i];
        if (m->key == EMPTY_KEY) return -1;
        if (m->key == key) {
            *result = m->result;
            return m->rank;
        }
    }
}

/* Inserts unless present: llama.cpp keeps the first (lowest) rank of a duplicate. */
static void merge_insert(moex_tokenizer *tok, int32_t left, int32_t right, int32_t rank, int32_t result) {
    uint64_t key = pair_key(left, right);
    size_t mask = tok->n_merge_slots - 1;
    size_t i = key_slot(key, mask);
    while (tok->merges[i].key != EMPTY_KEY) {
        if (tok->merges[i].key == key) return;
        i = (i + 1) & mask;
    }
    tok->merges[i] = (moex_merge_slot){.key = key, .rank = rank, .result = result};
}

int moex_bpe_load_merges(moex_tokenizer *tok, const moex_gguf_value *merges, moex_error *err) {
    uint64_t n = merges->v.arr.n;
    /* Ranks are merge priorities as floats (tokenizer_heap.h): exact below 2^24. */
    if (n > (1u << 24))
        return moex_fail(err, "tokenizer: %llu merges is too many (at most %u)", (unsigned long long)n, 1u << 24);
    size_t slots = 16;
    while (slots < n * 2) slots <<= 1;
    tok->merges = malloc(sizeof *tok->merges * slots);
    if (!tok->merges) return moex_fail(err, "tokenizer: out of memory for %llu merges", (unsigned long long)n);
    for (size_t i = 0; i < slots; i++) tok->merges[i].key = EMPTY_KEY;
    tok->n_merge_slots = slots;

    moex_bytebuf joined = {0};
    int rc = 0;
    for (uint64_t i = 0; i < n && !rc; i++) {
        const char *s = merges->v.arr.strs[i].data;
        size_t len = (size_t)merges->v.arr.strs[i].len;
        /* "left right", split at the first space after the first byte (a
         * left part may itself be a space); a line without one never matches. */
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp) continue;
        size_t nl = (size_t)(sp - s), nr = len - nl - 1;
        joined.n = 0;
        if (moex_bytebuf_append(&joined, s, nl) || moex_bytebuf_append(&joined, sp + 1, nr)) {
            rc = moex_fail(err, "tokenizer: out of memory loading merges");
            break;
        }
        int32_t left = moex_strtab_add(&tok->strs, s, nl, err);
        int32_t right = left < 0 ? -1 : moex_strtab_add(&tok->strs, sp + 1, nr, err);
        int32_t result = right < 0 ? -1 : moex_strtab_add(&tok->strs, joined.v, joined.n, err);
        if (result < 0) rc = -1;
        else merge_insert(tok, left, right, (int32_t)i, result);
    }
    moex_bytebuf_free(&joined);
    return rc;
}

/* ---- encoding ---- */

typedef struct symbol {
    int32_t str;        /* string id of the symbol's text, -1 if not in the table */
    int32_t prev, next; /* linked list of live symbols */
    uint32_t start, n;  /* byte span in the word; n == 0 once merged away */
} symbol;

typedef struct bpe_scratch {
    symbol *syms;
    size_t syms_cap;
    moex_bigram_heap heap;   /* lowest rank first */
    moex_bytebuf enc;   /* GPT-2 encoding of a word */
} bpe_scratch;

static int try_add_bigram(const moex_tokenizer *tok, bpe_scratch *sc, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return 0;
    int32_t result;
    int32_t rank = moex_bpe_merge_rank(tok, sc->syms[left].str, sc->syms[right].str, &result);
    if (rank < 0) return 0;
    moex_bigram b = {.priority = -(float)rank, .left = left, .result = result,
                     .size = sc->syms[left].n + sc->syms[right].n};
    return moex_bigram_heap_push(&sc->heap, b);
}

/* GPT-2 encoding of bytes w[0..n) into sc->enc. */
static int encode_bytes(bpe_scratch *sc, const char *w, size_t n) {
    sc->enc.n = 0;
    for (size_t i = 0; i < n; i++) {
        char u[4];
        int k = moex_utf8_encode(moex_gpt2_byte_to_cp((uint8_t)w[i]), u);
        if (moex_bytebuf_append(&sc->enc, u, (size_t)k)) return -1;
    }
    return 0;
}

/* A symbol that is no token: llama.cpp then looks up each byte of its
 * encoded text as a one-byte token and drops the ones that are not. */
static int emit_fallback(const moex_tokenizer *tok, bpe_scratch *sc, const char *w, const symbol *s, moex_i32vec *out) {
    if (encode_bytes(sc, w + s->start, s->n)) return -1;
    for (size_t i = 0; i < sc->enc.n; i++) {
        int32_t id = moex_strtab_find(&tok->strs, sc->enc.v + i, 1);
        if (id >= 0 && id < tok->n_vocab && moex_i32vec_push(out, id)) return -1;
    }
    return 0;
}

static int encode_word(const moex_tokenizer *tok, bpe_scratch *sc, const char *w, size_t n, moex_i32vec *out) {
    if (tok->ignore_merges) {
        if (encode_bytes(sc, w, n)) return -1;
        int32_t id = moex_strtab_find(&tok->strs, sc->enc.v, sc->enc.n);
        if (id >= 0 && id < tok->n_vocab) return moex_i32vec_push(out, id);
    }
    if (n > sc->syms_cap) {
        symbol *s = realloc(sc->syms, sizeof *s * n);
        if (!s) return -1;
        sc->syms = s;
        sc->syms_cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        sc->syms[i] = (symbol){.str = tok->byte_str[(uint8_t)w[i]], .prev = (int32_t)i - 1,
                               .next = i + 1 < n ? (int32_t)i + 1 : -1, .start = (uint32_t)i, .n = 1};
    }
    sc->heap.n = 0;
    for (size_t i = 1; i < n; i++)
        if (try_add_bigram(tok, sc, (int32_t)i - 1, (int32_t)i)) return -1;

    while (sc->heap.n) {
        moex_bigram b = moex_bigram_heap_pop(&sc->heap);
        symbol *l = &sc->syms[b.left];
        /* Stale when either side has changed since the pair was queued. */
        if (l->n == 0 || l->next < 0) continue;
        symbol *r = &sc->syms[l->next];
        if (l->n + r->n != b.size) continue;
        l->n += r->n;
        l->str = b.result;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sc->syms[r->next].prev = b.left;
        if (try_add_bigram(tok, sc, l->prev, b.left) || try_add_bigram(tok, sc, b.left, l->next)) return -1;
    }

    for (int32_t i = n ? 0 : -1; i >= 0; i = sc->syms[i].next) {
        const symbol *s = &sc->syms[i];
        if (s->str >= 0 && s->str < tok->n_vocab) {
            if (moex_i32vec_push(out, s->str)) return -1;
        } else if (emit_fallback(tok, sc, w, s, out)) {
            return -1;
        }
    }
    return 0;
}

/* Decodes text into code points (invalid bytes become U+FFFD) and the UTF-8
 * re-encoding of them that BPE then works on, as llama.cpp does. */
static int decode_text(const char *text, size_t len, uint32_t *cps, size_t *n_cps, moex_bytebuf *utf8, uint32_t *byte_pos) {
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t adv;
        uint32_t cp = moex_utf8_decode(text + i, len - i, &adv);
        char u[4];
        int k = moex_utf8_encode(cp, u);
        byte_pos[n] = (uint32_t)utf8->n;
        if (moex_bytebuf_append(utf8, u, (size_t)k)) return -1;
        cps[n++] = cp;
        i += adv;
    }
    byte_pos[n] = (uint32_t)utf8->n;
    *n_cps = n;
    return 0;
}

int moex_bpe_encode(const moex_tokenizer *tok, const char *text, size_t len, moex_i32vec *out, moex_error *err) {
    if (len == 0) return 0;
    if (len > (size_t)INT32_MAX / 4) return moex_fail(err, "tokenize: text of %zu bytes is too long", len);
    uint32_t *cps = malloc(sizeof *cps * len);
    uint32_t *byte_pos = malloc(sizeof *byte_pos * (len + 1));
    moex_bytebuf utf8 = {0};
    moex_i32vec ends = {0};
    bpe_scratch sc = {0};
    size_t n_cps = 0;
    int rc = -1;
    if (!cps || !byte_pos || decode_text(text, len, cps, &n_cps, &utf8, byte_pos) ||
        moex_pretokenize(tok->pre, cps, n_cps, &ends))
        goto done;
    size_t start = 0;
    for (size_t i = 0; i < ends.n; i++) {
        size_t end = (size_t)ends.v[i];
        size_t b0 = byte_pos[start], b1 = byte_pos[end];
        if (encode_word(tok, &sc, utf8.v + b0, b1 - b0, out)) goto done;
        start = end;
    }
    rc = 0;
done:
    if (rc) moex_fail(err, "tokenize: out of memory");
    free(cps);
    free(byte_pos);
    moex_bytebuf_free(&utf8);
    moex_i32vec_free(&ends);
    free(sc.syms);
    moex_bigram_heap_free(&sc.heap);
    moex_bytebuf_free(&sc.enc);
    return rc;
}
