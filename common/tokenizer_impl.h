/* Private to the tokenizer files (tokenizer*.c): the tokenizer's state and
 * the helpers its parts share. The model follows llama.cpp's llama-vocab.cpp
 * so that token ids match it exactly. */
#ifndef MOEX_TOKENIZER_IMPL_H
#define MOEX_TOKENIZER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/tokenizer.h"

/* ---- string table: byte strings <-> dense ids, hashed ---- */
typedef struct moex_strtab_slot {
    int32_t id;     /* -1: empty */
    uint32_t tag;   /* high hash bits: most misses never touch the string */
} moex_strtab_slot;

typedef struct moex_strtab {
    char *blob;             /* all strings, back to back */
    size_t blob_len, blob_cap;
    uint64_t *off;          /* per id: offset in blob */
    uint32_t *len;          /* per id: length */
    int32_t n, cap;
    moex_strtab_slot *slots;   /* open addressing; n_slots a power of two */
    size_t n_slots;
} moex_strtab;

int moex_strtab_init(moex_strtab *t, int32_t expected, size_t expected_bytes, moex_error *err);
void moex_strtab_free(moex_strtab *t);
/* id of s, or -1. */
int32_t moex_strtab_find(const moex_strtab *t, const char *s, size_t len);
/* Adds s when absent; returns its id (new or existing), -1 on out of memory. */
int32_t moex_strtab_add(moex_strtab *t, const char *s, size_t len, moex_error *err);
static inline const char *moex_strtab_str(const moex_strtab *t, int32_t id, size_t *len) {
    *len = t->len[id];
    return t->blob + t->off[id];
}

/* ---- growable arrays ---- */
typedef struct moex_i32vec {
    int32_t *v;
    size_t n, cap;
} moex_i32vec;
int moex_i32vec_push(moex_i32vec *a, int32_t x);
void moex_i32vec_free(moex_i32vec *a);

typedef struct moex_bytebuf {
    char *v;
    size_t n, cap;
} moex_bytebuf;
int moex_bytebuf_append(moex_bytebuf *b, const void *p, size_t n);
void moex_bytebuf_free(moex_bytebuf *b);

/* ---- tokenizer ---- */
typedef enum { MOEX_TOK_BPE, MOEX_TOK_SPM } moex_tok_kind;

/* Pre-tokenizers (the regex llama.cpp uses for tokenizer.ggml.pre). */
typedef enum {
    MOEX_PRE_DEFAULT,   /* missing or "default": the multi-pass default split */
    MOEX_PRE_GPT2,      /* 's|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    MOEX_PRE_LLAMA3,    /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    MOEX_PRE_QWEN2,     /* as LLAMA3 with \p{N} (one digit per word) */
    MOEX_PRE_GPT4O,     /* o200k: letters split by case, \p{N}{1,3}, punctuation takes [\r\n/]* (tokenizer_pretok.c) */
} moex_pre_kind;

/* Token attributes, as llama.cpp's llama_token_attr (a token may have several). */
enum {
    MOEX_ATTR_UNKNOWN = 1 << 0,
    MOEX_ATTR_UNUSED = 1 << 1,
    MOEX_ATTR_NORMAL = 1 << 2,
    MOEX_ATTR_CONTROL = 1 << 3,
    MOEX_ATTR_USER_DEFINED = 1 << 4,
    MOEX_ATTR_BYTE = 1 << 5,
};

/* A BPE merge: (left, right) string ids -> rank and the merged string's id. */
typedef struct moex_merge_slot {
    uint64_t key;      /* (left << 32) | right; UINT64_MAX when empty */
    int32_t rank;
    int32_t result;
} moex_merge_slot;

struct moex_tokenizer {
    moex_tok_kind kind;
    moex_pre_kind pre;
    int32_t n_vocab;
    /* Token texts are ids 0..n_vocab-1; BPE adds after them the merge parts
     * and results that are not tokens, so merging works on ids alone. */
    moex_strtab strs;
    float *scores;       /* n_vocab (SPM merge priority) */
    uint8_t *attr;       /* n_vocab, MOEX_ATTR_* */

    /* BPE */
    moex_merge_slot *merges;
    size_t n_merge_slots;          /* power of two */
    int32_t byte_str[256];         /* string id of each byte's GPT-2 character, -1 if none */
    bool ignore_merges;            /* a word that is a whole token skips merging (llama3) */

    /* SPM: no token has U+2581 after its leading run of them, so the text
     * can be merged word by word (see tokenizer_spm.c). */
    bool spm_word_cuts;

    /* Special tokens tried before the text is split, longest first, and
     * the same indices (into special_ids) bucketed by first byte:
     * special_by_byte[special_first[b] .. special_first[b + 1]). */
    int32_t *special_ids;
    int32_t n_special;
    int32_t special_first[257];
    int32_t *special_by_byte;
    /* Bit b2 of special_second[b1]: some special token starts with bytes b1 b2
     * (all bits when one is the single byte b1), so most text positions are
     * ruled out before any comparison (200k-token vocabularies have ~1000
     * specials, all starting "<|"). */
    uint32_t special_second[256][8];

    bool add_bos, add_space_prefix;
    int32_t bos, eos, eot, eom, unk;
    uint8_t *eog_bits;   /* n_vocab bits */

    /* Decoded text of every token (special ones as their text), for token_to_piece. */
    char *piece_blob;
    uint64_t *piece_off;   /* n_vocab + 1 */
};

/* The pre-tokenizer that tokenizer.ggml.pre names ("default", a llama3,
 * qwen2, gpt-2 or gpt-4o family name); -1 when it is none of those (tokenizer_pretok.c). */
int moex_pre_kind_of(const char *name, moex_pre_kind *kind);

/* Pre-tokenizer: splits cps[0..n) into words; appends each word's end index
 * (in code points) to ends. -1 on out of memory. */
int moex_pretokenize(moex_pre_kind pre, const uint32_t *cps, size_t n, moex_i32vec *ends);

/* BPE-encodes one fragment of raw text (no special tokens inside). */
int moex_bpe_encode(const moex_tokenizer *tok, const char *text, size_t len, moex_i32vec *out, moex_error *err);
/* SPM-encodes text (already prefixed and with spaces escaped as U+2581). */
int moex_spm_encode(const moex_tokenizer *tok, const char *text, size_t len, moex_i32vec *out, moex_error *err);

/* Merge lookup: rank (-1 if none) and the result's string id. */
int32_t moex_bpe_merge_rank(const moex_tokenizer *tok, int32_t left, int32_t right, int32_t *result);

/* Loads the BPE merges (array of "left right" strings) into tok. */
int moex_bpe_load_merges(moex_tokenizer *tok, const moex_gguf_value *merges, moex_error *err);

#endif
