/* Building a tokenizer from GGUF metadata (tokenizer.ggml.*): vocabulary,
 * token types, merges or scores, special ids, end-of-generation tokens and
 * the decoded piece of every token. Defaults and heuristics follow
 * llama.cpp's llama_vocab::impl::load. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer_impl.h"
#include "common/unicode.h"

#define KEY(s) "tokenizer.ggml." s

/* ---- metadata helpers: absent keys keep the default, wrong types fail ---- */

static int opt_bool(const moex_gguf *g, const char *key, bool *v, moex_error *err) {
    if (!moex_gguf_find(g, key)) return 0;
    return moex_gguf_get_bool(g, key, v, err);
}

/* A token id key: kept only when it names a token (llama.cpp warns and keeps the default otherwise). */
static int opt_token_id(const moex_gguf *g, const char *key, int32_t n_vocab, int32_t *id, moex_error *err) {
    if (!moex_gguf_find(g, key)) return 0;
    int64_t v;
    if (moex_gguf_get_i64(g, key, &v, err)) return -1;
    if (v >= 0 && v < n_vocab) *id = (int32_t)v;
    else moex_log(MOEX_LOG_WARN, "tokenizer: %s = %lld is not a token id, ignored", key, (long long)v);
    return 0;
}

/* An optional per-token array: NULL when absent; error when of another type or too short. */
static const moex_gguf_value *opt_token_array(const moex_gguf *g, const char *key, moex_gguf_vtype t1,
                                              moex_gguf_vtype t2, int32_t n_vocab, int *failed, moex_error *err) {
    const moex_gguf_kv *kv = moex_gguf_find(g, key);
    if (!kv) return NULL;
    if (kv->value.type != MOEX_GGUF_ARRAY || (kv->value.v.arr.elem_type != t1 && kv->value.v.arr.elem_type != t2)) {
        *failed = moex_fail(err, "tokenizer: %s has the wrong type", key);
        return NULL;
    }
    if (kv->value.v.arr.n < (uint64_t)n_vocab) {
        *failed = moex_fail(err, "tokenizer: %s has %llu entries for %d tokens", key,
                            (unsigned long long)kv->value.v.arr.n, n_vocab);
        return NULL;
    }
    return &kv->value;
}

/* ---- model kind and pre-tokenizer ---- */

static int read_kind(const moex_gguf *g, moex_tokenizer *tok, moex_error *err) {
    char model[64];
    if (moex_gguf_get_str(g, KEY("model"), model, sizeof model, err)) return -1;
    if (!strcmp(model, "gpt2")) tok->kind = MOEX_TOK_BPE;
    else if (!strcmp(model, "llama")) tok->kind = MOEX_TOK_SPM;
    else return moex_fail(err, "tokenizer: model '%s' is not supported (supported: gpt2, llama)", model);
    return 0;
}

static int read_pre(const moex_gguf *g, moex_tokenizer *tok, moex_error *err) {
    tok->pre = MOEX_PRE_DEFAULT;
    if (tok->kind != MOEX_TOK_BPE || !moex_gguf_find(g, KEY("pre"))) return 0;
    char pre[64];
    if (moex_gguf_get_str(g, KEY("pre"), pre, sizeof pre, err)) return -1;
    if (moex_pre_kind_of(pre, &tok->pre))
        return moex_fail(err, "tokenizer: pre-tokenizer '%s' is not supported (supported: default, llama3 family, "
                              "qwen2 family, gpt-2 family, gpt-4o family)", pre);
    if (tok->pre == MOEX_PRE_LLAMA3) {
        tok->ignore_merges = strcmp(pre, "dbrx") && strcmp(pre, "smaug-bpe");
        tok->add_bos = tok->ignore_merges;   /* llama.cpp's llama3 default */
    }
    return 0;
}

/* ---- vocabulary ---- */

static uint8_t attr_of_type(int64_t type) {
    switch (type) {
    case 1: return MOEX_ATTR_NORMAL;
    case 2: return MOEX_ATTR_UNKNOWN;
    case 3: return MOEX_ATTR_CONTROL;
    case 4: return MOEX_ATTR_USER_DEFINED;
    case 5: return MOEX_ATTR_UNUSED;
    case 6: return MOEX_ATTR_BYTE;
    default: return 0;   /* undefined: decodes to nothing */
    }
}

static int read_vocab(const moex_gguf *g, moex_tokenizer *tok, moex_error *err) {
    const moex_gguf_value *tokens = moex_gguf_get_array(g, KEY("tokens"), MOEX_GGUF_STRING, err);
    if (!tokens) return -1;
    if (tokens->v.arr.n == 0 || tokens->v.arr.n > INT32_MAX / 2)
        return moex_fail(err, "tokenizer: %llu tokens is not a usable vocabulary", (unsigned long long)tokens->v.arr.n);
    int32_t n = tok->n_vocab = (int32_t)tokens->v.arr.n;

    int failed = 0;
    const moex_gguf_value *scores = opt_token_array(g, KEY("scores"), MOEX_GGUF_FLOAT32, MOEX_GGUF_INT32, n, &failed, err);
    const moex_gguf_value *types = failed ? NULL : opt_token_array(g, KEY("token_type"), MOEX_GGUF_INT32, MOEX_GGUF_INT32, n, &failed, err);
    if (failed) return -1;

    size_t bytes = 0;
    for (int32_t i = 0; i < n; i++) bytes += (size_t)tokens->v.arr.strs[i].len;
    if (moex_strtab_init(&tok->strs, n, bytes + 64, err)) return -1;
    tok->scores = calloc((size_t)n, sizeof *tok->scores);
    tok->attr = calloc((size_t)n, 1);
    if (!tok->scores || !tok->attr) return moex_fail(err, "tokenizer: out of memory for %d tokens", n);

    for (int32_t i = 0; i < n; i++) {
        const moex_gguf_str *s = &tokens->v.arr.strs[i];
        char empty_name[32];
        const char *text = s->data;
        size_t len = (size_t)s->len;
        if (len == 0) {   /* llama.cpp renames empty tokens so that they stay unique */
            len = (size_t)snprintf(empty_name, sizeof empty_name, "[EMPTY_%d]", i);
            text = empty_name;
        }
        int32_t id = moex_strtab_add(&tok->strs, text, len, err);
        if (id < 0) return -1;
        if (id != i) return moex_fail(err, "tokenizer: duplicate token %d '%.*s' (also token %d)", i, (int)(len > 64 ? 64 : len), text, id);
        tok->scores[i] = scores ? (float)moex_gguf_arr_f64(scores, (uint64_t)i) : 0.0f;
        tok->attr[i] = types ? attr_of_type(moex_gguf_arr_i64(types, (uint64_t)i)) : MOEX_ATTR_NORMAL;
    }
    return 0;
}

static int32_t find_text(const moex_tokenizer *tok, const char *s) {
    int32_t id = moex_strtab_find(&tok->strs, s, strlen(s));
    return id < tok->n_vocab ? id : -1;
}

static int read_merges(const moex_gguf *g, moex_tokenizer *tok, moex_error *err) {
    const moex_gguf_value *merges = moex_gguf_get_array(g, KEY("merges"), MOEX_GGUF_STRING, err);
    if (!merges) return -1;
    if (moex_bpe_load_merges(tok, merges, err)) return -1;
    for (int b = 0; b < 256; b++) {
        char u[4];
        int k = moex_utf8_encode(moex_gpt2_byte_to_cp((uint8_t)b), u);
        tok->byte_str[b] = moex_strtab_find(&tok->strs, u, (size_t)k);
    }
    return 0;
}

/* SPM: true when every token has U+2581 only in a leading run. */
static bool spm_spaces_lead_only(const moex_tokenizer *tok) {
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        size_t len;
        const char *t = moex_strtab_str(&tok->strs, id, &len);
        while (len >= 3 && !memcmp(t, "\xe2\x96\x81", 3)) t += 3, len -= 3;
        if (len >= 3 && memmem(t, len, "\xe2\x96\x81", 3)) return false;
    }
    return true;
}

/* ---- special tokens ---- */

static int read_special_ids(const moex_gguf *g, moex_tokenizer *tok, moex_error *err) {
    int32_t n = tok->n_vocab;
    bool spm = tok->kind == MOEX_TOK_SPM;
    tok->bos = spm && 1 < n ? 1 : -1;
    tok->eos = spm && 2 < n ? 2 : -1;
    tok->unk = spm ? 0 : -1;
    tok->eot = tok->eom = -1;
    if (opt_token_id(g, KEY("bos_token_id"), n, &tok->bos, err) || opt_token_id(g, KEY("eos_token_id"), n, &tok->eos, err) ||
        opt_token_id(g, KEY("eot_token_id"), n, &tok->eot, err) || opt_token_id(g, KEY("eom_token_id"), n, &tok->eom, err) ||
        opt_token_id(g, KEY("unknown_token_id"), n, &tok->unk, err))
        return -1;

    if (spm) {
        tok->add_bos = true;
        tok->add_space_prefix = true;
    }
    if (opt_bool(g, KEY("add_space_prefix"), &tok->add_space_prefix, err) || opt_bool(g, KEY("add_bos_token"), &tok->add_bos, err))
        return -1;
    if (tok->add_bos && tok->bos < 0)
        return moex_fail(err, "tokenizer: add_bos_token is true but there is no bos_token_id");
    return 0;
}

static void set_eog(moex_tokenizer *tok, int32_t id) {
    if (id >= 0 && id < tok->n_vocab) tok->eog_bits[id >> 3] |= (uint8_t)(1u << (id & 7));
}
static void clear_eog(moex_tokenizer *tok, int32_t id) {
    if (id >= 0 && id < tok->n_vocab) tok->eog_bits[id >> 3] &= (uint8_t)~(1u << (id & 7));
}
static bool has_eog(const moex_tokenizer *tok, int32_t id) { return (tok->eog_bits[id >> 3] >> (id & 7)) & 1; }

/* The first token among texts, or -1. */
static int32_t find_any(const moex_tokenizer *tok, const char *const *texts) {
    for (; *texts; texts++) {
        int32_t id = find_text(tok, *texts);
        if (id >= 0) return id;
    }
    return -1;
}

/* End-of-generation tokens: the eos/eot/eom ids, fill-in-the-middle pad/repo/
 * file-separator tokens, and every token spelled like an end marker (which
 * also becomes a control token), with llama.cpp's two exceptions. */
static int find_eog(const moex_gguf *g, moex_tokenizer *tok, moex_error *err) {
    static const char *const eog_texts[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
        "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
        "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
        "[e~[", NULL};
    static const char *const fim_pad[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
    static const char *const fim_rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL};
    static const char *const fim_sep[] = {"<|file_sep|>", NULL};
    static const char *const always_user[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};

    int32_t n = tok->n_vocab;
    tok->eog_bits = calloc(((size_t)n + 7) / 8, 1);
    if (!tok->eog_bits) return moex_fail(err, "tokenizer: out of memory");

    const char *const *fim_lists[3] = {fim_pad, fim_rep, fim_sep};
    const char *fim_keys[3] = {KEY("fim_pad_token_id"), KEY("fim_rep_token_id"), KEY("fim_sep_token_id")};
    for (int i = 0; i < 3; i++) {
        int32_t id = -1;
        if (opt_token_id(g, fim_keys[i], n, &id, err)) return -1;
        if (id < 0 && (id = find_any(tok, fim_lists[i])) >= 0) tok->attr[id] |= MOEX_ATTR_CONTROL;
        set_eog(tok, id);
    }
    for (const char *const *t = eog_texts; *t; t++) {
        int32_t id = find_text(tok, *t);
        if (id < 0) continue;
        set_eog(tok, id);
        tok->attr[id] |= MOEX_ATTR_CONTROL;
    }
    for (const char *const *t = always_user; *t; t++) {   /* gpt-oss: always rendered */
        int32_t id = find_text(tok, *t);
        if (id >= 0) tok->attr[id] = MOEX_ATTR_USER_DEFINED;
    }
    set_eog(tok, tok->eos);
    set_eog(tok, tok->eot);
    set_eog(tok, tok->eom);

    /* o200k_harmony / solar-open: "<|end|>" ends a message, not the generation. */
    int32_t end = find_text(tok, "<|end|>"), ret = find_text(tok, "<|return|>"), call = find_text(tok, "<|call|>");
    int32_t calls = find_text(tok, "<|calls|>"), flush = find_text(tok, "<|flush|>");
    bool has_call = (call >= 0 && has_eog(tok, call)) || (calls >= 0 && has_eog(tok, calls));
    if (end >= 0 && has_eog(tok, end) && has_call && ((ret >= 0 && has_eog(tok, ret)) || (flush >= 0 && has_eog(tok, flush)))) {
        clear_eog(tok, end);
        tok->attr[end] = MOEX_ATTR_USER_DEFINED;
    }
    /* gemma4 / paddleocr: "</s>" is not an end of generation there. */
    int32_t tool_resp = find_text(tok, "<|tool_response>"), s_end = find_text(tok, "</s>");
    if (tool_resp >= 0 && s_end >= 0 && has_eog(tok, tool_resp) && has_eog(tok, s_end)) {
        clear_eog(tok, s_end);
        tok->attr[s_end] = MOEX_ATTR_NORMAL;
    }
    return 0;
}

/* Special tokens (control, user-defined, unknown) sorted longest first, and bucketed by first byte. */
static int build_special_cache(moex_tokenizer *tok, moex_error *err) {
    int32_t n = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++)
        if (tok->attr[id] & (MOEX_ATTR_CONTROL | MOEX_ATTR_USER_DEFINED | MOEX_ATTR_UNKNOWN)) n++;
    tok->special_ids = malloc(sizeof *tok->special_ids * (size_t)(n ? n : 1));
    tok->special_by_byte = malloc(sizeof *tok->special_by_byte * (size_t)(n ? n : 1));
    if (!tok->special_ids || !tok->special_by_byte) return moex_fail(err, "tokenizer: out of memory");
    tok->n_special = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++)
        if (tok->attr[id] & (MOEX_ATTR_CONTROL | MOEX_ATTR_USER_DEFINED | MOEX_ATTR_UNKNOWN)) tok->special_ids[tok->n_special++] = id;
    /* Insertion sort by length, descending (stable: ties keep id order); few tokens. */
    for (int32_t i = 1; i < n; i++) {
        int32_t id = tok->special_ids[i];
        uint32_t len = tok->strs.len[id];
        int32_t j = i - 1;
        while (j >= 0 && tok->strs.len[tok->special_ids[j]] < len) {
            tok->special_ids[j + 1] = tok->special_ids[j];
            j--;
        }
        tok->special_ids[j + 1] = id;
    }
    /* Counting sort of the indices by first byte, keeping the length order. */
    int32_t count[257] = {0};
    for (int32_t i = 0; i < n; i++) count[(uint8_t)tok->strs.blob[tok->strs.off[tok->special_ids[i]]] + 1]++;
    for (int b = 0; b < 256; b++) count[b + 1] += count[b];
    memcpy(tok->special_first, count, sizeof count);
    for (int32_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)tok->strs.blob[tok->strs.off[tok->special_ids[i]]];
        tok->special_by_byte[count[b]++] = i;
    }
    memset(tok->special_second, 0, sizeof tok->special_second);
    for (int32_t i = 0; i < n; i++) {
        int32_t id = tok->special_ids[i];
        const uint8_t *s = (const uint8_t *)tok->strs.blob + tok->strs.off[id];
        if (tok->strs.len[id] == 1) memset(tok->special_second[s[0]], 0xff, sizeof tok->special_second[s[0]]);
        else tok->special_second[s[0]][s[1] >> 5] |= 1u << (s[1] & 31);
    }
    return 0;
}

/* ---- decoded pieces ---- */

/* Appends the piece of token id as rendered with special tokens shown. */
static int append_piece(const moex_tokenizer *tok, int32_t id, moex_bytebuf *out) {
    size_t len;
    const char *text = moex_strtab_str(&tok->strs, id, &len);
    uint8_t attr = tok->attr[id];
    if (attr & (MOEX_ATTR_UNKNOWN | MOEX_ATTR_CONTROL | MOEX_ATTR_USER_DEFINED)) return moex_bytebuf_append(out, text, len);
    if (attr & MOEX_ATTR_NORMAL) {
        if (tok->kind == MOEX_TOK_SPM) {   /* U+2581 -> space */
            for (size_t i = 0; i < len;) {
                if (i + 3 <= len && !memcmp(text + i, "\xe2\x96\x81", 3)) {
                    if (moex_bytebuf_append(out, " ", 1)) return -1;
                    i += 3;
                } else {
                    if (moex_bytebuf_append(out, text + i, 1)) return -1;
                    i++;
                }
            }
            return 0;
        }
        for (size_t i = 0; i < len;) {     /* GPT-2 characters -> bytes */
            size_t adv;
            uint32_t cp = moex_utf8_decode(text + i, len - i, &adv);
            int b = moex_gpt2_cp_to_byte(cp);
            if (b >= 0) {
                char c = (char)b;
                if (moex_bytebuf_append(out, &c, 1)) return -1;
            } else {   /* llama.cpp's marker for a character that is no byte */
                char u[4], tmp[64];
                int k = moex_utf8_encode(cp, u);
                int m = snprintf(tmp, sizeof tmp, "[UNK_BYTE_0x");
                for (int j = 0; j < k; j++) m += snprintf(tmp + m, sizeof tmp - (size_t)m, "%02x", (uint8_t)u[j]);
                if (moex_bytebuf_append(out, tmp, (size_t)m) || moex_bytebuf_append(out, text, len) || moex_bytebuf_append(out, "]", 1))
                    return -1;
            }
            i += adv;
        }
        return 0;
    }
    if (attr & MOEX_ATTR_BYTE) {   /* "<0xXX>" */
        char hex[3] = {0};
        if (len >= 5) memcpy(hex, text + 3, 2);
        char *end;
        unsigned long v = strtoul(hex, &end, 16);
        if (end != hex + 2) return 0;
        char c = (char)v;
        return moex_bytebuf_append(out, &c, 1);
    }
    return 0;   /* unused / undefined: nothing */
}

static int build_pieces(moex_tokenizer *tok, moex_error *err) {
    moex_bytebuf blob = {0};
    tok->piece_off = malloc(sizeof *tok->piece_off * ((size_t)tok->n_vocab + 1));
    if (!tok->piece_off) return moex_fail(err, "tokenizer: out of memory");
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        tok->piece_off[id] = blob.n;
        if (append_piece(tok, id, &blob)) {
            moex_bytebuf_free(&blob);
            return moex_fail(err, "tokenizer: out of memory");
        }
    }
    tok->piece_off[tok->n_vocab] = blob.n;
    tok->piece_blob = blob.v ? blob.v : calloc(1, 1);
    return tok->piece_blob ? 0 : moex_fail(err, "tokenizer: out of memory");
}

moex_tokenizer *moex_tokenizer_load(const moex_gguf *g, moex_error *err) {
    if (!g) {
        moex_fail(err, "tokenizer: no GGUF file");
        return NULL;
    }
    moex_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) {
        moex_fail(err, "tokenizer: out of memory");
        return NULL;
    }
    if (read_kind(g, tok, err) || read_pre(g, tok, err) || read_vocab(g, tok, err) ||
        (tok->kind == MOEX_TOK_BPE && read_merges(g, tok, err)) || read_special_ids(g, tok, err) ||
        find_eog(g, tok, err) || build_special_cache(tok, err) || build_pieces(tok, err)) {
        moex_tokenizer_free(tok);
        return NULL;
    }
    if (tok->kind == MOEX_TOK_SPM) tok->spm_word_cuts = spm_spaces_lead_only(tok);
    return tok;
}

void moex_tokenizer_free(moex_tokenizer *tok) {
    if (!tok) return;
    moex_strtab_free(&tok->strs);
    free(tok->scores);
    free(tok->attr);
    free(tok->merges);
    free(tok->special_ids);
    free(tok->special_by_byte);
    free(tok->eog_bits);
    free(tok->piece_blob);
    free(tok->piece_off);
    free(tok);
}
