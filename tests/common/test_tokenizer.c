/* Tokenizer tests against llama.cpp's vectors (fixtures/vocab) and its
 * properties: exact ids for every case of the four vocabularies, decode
 * round trips, special-token parsing (qwen2, gpt-oss's harmony tokens),
 * robustness to invalid UTF-8.
 * usage: test_tokenizer FIXTURES_VOCAB_DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/tokenizer_testing.h"

#include "tests/test_files.h"
#include "tests/test_util.h"


/* ---- fixture parsing ---- */

typedef struct cases {
    int n;
    const char *text[128];
    size_t len[128];
    int32_t *ids[128];
    int n_ids[128];
    char *inp, *out;
} cases;

/* Inputs are separated by "\n__ggml_vocab_test__\n" (the file ends with one). */
static int split_inputs(cases *c, char *inp, size_t len) {
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sl = sizeof sep - 1;
    size_t pos = 0;
    while (pos < len && c->n < 128) {
        char *m = memmem(inp + pos, len - pos, sep, sl);
        if (!m) break;
        c->text[c->n] = inp + pos;
        c->len[c->n] = (size_t)(m - (inp + pos));
        c->n++;
        pos = (size_t)(m - inp) + sl;
    }
    return pos == len ? 0 : -1;
}

static int parse_outputs(cases *c, char *out) {
    int line = 0;
    for (char *p = out; *p && line < c->n; line++) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = 0;
        c->ids[line] = malloc(sizeof(int32_t) * (strlen(p) / 2 + 1));
        c->n_ids[line] = 0;
        for (char *q = p; *q;) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q) break;
            c->ids[line][c->n_ids[line]++] = (int32_t)v;
            q = end;
        }
        p = nl ? nl + 1 : p + strlen(p);
    }
    return line == c->n ? 0 : -1;
}

static int load_cases(const char *dir, const char *name, cases *c) {
    char path[1024];
    size_t li, lo;
    memset(c, 0, sizeof *c);
    snprintf(path, sizeof path, "%s/%s.inp", dir, name);
    c->inp = test_read_file(path, &li);
    snprintf(path, sizeof path, "%s/%s.out", dir, name);
    c->out = test_read_file(path, &lo);
    if (!c->inp || !c->out) return -1;
    if (split_inputs(c, c->inp, li) || parse_outputs(c, c->out)) return -1;
    return 0;
}

static void free_cases(cases *c) {
    for (int i = 0; i < c->n; i++) free(c->ids[i]);
    free(c->inp);
    free(c->out);
}

static moex_tokenizer *load_tok(const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    moex_error err = {{0}};
    moex_gguf *g = moex_gguf_open(path, &err);
    if (!g) {
        fprintf(stderr, "cannot open %s: %s\n", path, err.msg);
        return NULL;
    }
    moex_tokenizer *tok = moex_tokenizer_load(g, &err);
    moex_gguf_close(g);
    if (!tok) fprintf(stderr, "cannot load tokenizer of %s: %s\n", path, err.msg);
    return tok;
}

/* Tokenizes into a malloc'd array (growing the buffer when asked to). */
static int64_t tokenize_all(const moex_tokenizer *tok, const char *s, size_t len, bool bos, bool special, int32_t **ids) {
    moex_error err = {{0}};
    int64_t cap = 4;
    *ids = malloc(sizeof(int32_t) * (size_t)cap);
    int64_t n = moex_tokenize(tok, s, len, bos, special, *ids, cap, &err);
    if (n > cap) {
        *ids = realloc(*ids, sizeof(int32_t) * (size_t)n);
        int64_t n2 = moex_tokenize(tok, s, len, bos, special, *ids, n, &err);
        CHECK(n2 == n, "second tokenize call gave %lld tokens, first %lld", (long long)n2, (long long)n);
    }
    if (n < 0) fprintf(stderr, "tokenize failed: %s\n", err.msg);
    return n;
}

static char *detokenize_all(const moex_tokenizer *tok, const int32_t *ids, int64_t n, bool special, int64_t *len) {
    moex_error err = {{0}};
    *len = moex_detokenize(tok, ids, n, special, NULL, 0, &err);
    if (*len < 0) return NULL;
    char *s = malloc((size_t)*len + 1);
    int64_t len2 = moex_detokenize(tok, ids, n, special, s, *len, &err);
    CHECK(len2 == *len, "detokenize length changed between calls");
    s[*len] = 0;
    return s;
}

static void print_ids(const char *label, const int32_t *ids, int64_t n) {
    fprintf(stderr, "  %s:", label);
    for (int64_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

/* Every fixture case gives exactly llama.cpp's ids (no BOS, no special parsing). */
static void test_vectors(const moex_tokenizer *tok, const cases *c, const char *name) {
    int bad = 0;
    for (int i = 0; i < c->n; i++) {
        int32_t *ids;
        int64_t n = tokenize_all(tok, c->text[i], c->len[i], false, false, &ids);
        bool ok = n == c->n_ids[i] && !memcmp(ids, c->ids[i], sizeof(int32_t) * (size_t)n);
        if (!ok) {
            bad++;
            fprintf(stderr, "FAIL %s case %d: '%.*s'\n", name, i, (int)c->len[i], c->text[i]);
            print_ids("expected", c->ids[i], c->n_ids[i]);
            print_ids("got     ", ids, n);
        }
        free(ids);
    }
    CHECK(bad == 0, "%s: %d of %d cases differ", name, bad, c->n);
    printf("%s: %d/%d cases exact\n", name, c->n - bad, c->n);
}

/* decode(encode(x)) == x for every case (SPM too: its added space prefix is
 * removed again, and the inputs hold no U+2581, which SPM decodes as a space). */
static void test_round_trip(const moex_tokenizer *tok, const cases *c, const char *name) {
    int bad = 0;
    for (int i = 0; i < c->n; i++) {
        int32_t *ids;
        int64_t n = tokenize_all(tok, c->text[i], c->len[i], false, false, &ids), len;
        char *s = detokenize_all(tok, ids, n, false, &len);
        if (!s || (size_t)len != c->len[i] || memcmp(s, c->text[i], c->len[i])) {
            bad++;
            fprintf(stderr, "FAIL %s round trip case %d: '%.*s' -> '%s'\n", name, i, (int)c->len[i], c->text[i], s ? s : "(error)");
        }
        free(s);
        free(ids);
    }
    CHECK(bad == 0, "%s: %d round trips differ", name, bad);
}

static int contains_id(const int32_t *ids, int64_t n, int32_t id) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] == id) return 1;
    return 0;
}

static void test_qwen2_special(const moex_tokenizer *tok) {
    const int32_t im_end = 151645, im_start = 151644;
    const char *s = "<|im_end|>";
    int32_t *ids;
    int64_t n = tokenize_all(tok, s, strlen(s), false, true, &ids);
    CHECK(n == 1 && ids[0] == im_end, "parse_special: '<|im_end|>' gave %lld tokens (first %d)", (long long)n, n > 0 ? ids[0] : -1);
    free(ids);

    n = tokenize_all(tok, s, strlen(s), false, false, &ids);
    CHECK(n > 1 && !contains_id(ids, n, im_end), "without parse_special '<|im_end|>' must be spelled out (%lld tokens)", (long long)n);
    int64_t len;
    char *back = detokenize_all(tok, ids, n, false, &len);
    CHECK(back && !strcmp(back, s), "spelled-out '<|im_end|>' decodes to '%s'", back ? back : "(error)");
    free(back);
    free(ids);

    const char *chat = "<|im_start|>user\nHi<|im_end|>\n";
    n = tokenize_all(tok, chat, strlen(chat), false, true, &ids);
    CHECK(n >= 4 && ids[0] == im_start && contains_id(ids, n, im_end), "chat text special tokens");
    back = detokenize_all(tok, ids, n, true, &len);
    CHECK(back && !strcmp(back, chat), "render_special decode gives '%s'", back ? back : "(error)");
    free(back);
    back = detokenize_all(tok, ids, n, false, &len);
    CHECK(back && !strcmp(back, "user\nHi\n"), "decode without specials gives '%s'", back ? back : "(error)");
    free(back);
    free(ids);

    CHECK(moex_tokenizer_is_eog(tok, im_end), "<|im_end|> is end of generation");
    CHECK(moex_tokenizer_is_eog(tok, 151643), "<|endoftext|> is end of generation");
    CHECK(!moex_tokenizer_is_eog(tok, im_start), "<|im_start|> is not end of generation");
    CHECK(!moex_tokenizer_is_eog(tok, 9707), "a word is not end of generation");

    /* A user-defined token is split out even without parse_special (llama.cpp). */
    const char *pad = "a[PAD151646]b";
    n = tokenize_all(tok, pad, strlen(pad), false, false, &ids);
    CHECK(contains_id(ids, n, 151646), "user-defined [PAD151646] is always matched");
    free(ids);

    /* No BOS for qwen2 (no add_bos_token key: gpt2 default false). */
    n = tokenize_all(tok, "Hi", 2, true, false, &ids);
    CHECK(n == 1 && ids[0] != 151643, "qwen2 adds no BOS");
    free(ids);
}

/* gpt-oss (o200k_harmony): 201088 tokens, the harmony tokens at their ids,
 * <|start|> <|channel|> <|message|> <|constrain|> <|end|> user-defined (always
 * split out and shown, as llama.cpp makes them), <|return|> and <|call|> end
 * a generation, <|end|> only a message. */
static void test_gpt_oss_special(const moex_tokenizer *tok) {
    enum { START_OF_TEXT = 199998, END_OF_TEXT = 199999, RETURN = 200002, CHANNEL = 200005, START = 200006,
           END = 200007, MESSAGE = 200008, CALL = 200012 };
    CHECK(moex_tokenizer_n_vocab(tok) == 201088, "gpt-oss n_vocab %d", moex_tokenizer_n_vocab(tok));
    CHECK(moex_tokenizer_bos(tok) == START_OF_TEXT && moex_tokenizer_eos(tok) == RETURN, "gpt-oss bos/eos");
    const char *chat = "<|start|>assistant<|channel|>final<|message|>Hi!<|end|><|return|>";
    int32_t *ids;
    int64_t len, n = tokenize_all(tok, chat, strlen(chat), true, true, &ids);
    CHECK(n >= 8 && ids[0] == START && contains_id(ids, n, CHANNEL) && contains_id(ids, n, MESSAGE) &&
          ids[n - 2] == END && ids[n - 1] == RETURN, "gpt-oss chat special tokens (and no BOS)");
    char *back = detokenize_all(tok, ids, n, true, &len);
    CHECK(back && !strcmp(back, chat), "gpt-oss render_special decode gives '%s'", back ? back : "(error)");
    free(back);
    back = detokenize_all(tok, ids, n, false, &len);   /* user-defined shown, control hidden */
    CHECK(back && !strcmp(back, "<|start|>assistant<|channel|>final<|message|>Hi!<|end|>"),
          "gpt-oss decode without specials gives '%s'", back ? back : "(error)");
    free(back);
    free(ids);

    /* Without parse_special the user-defined ones are still tokens; <|return|> is spelled out. */
    n = tokenize_all(tok, chat, strlen(chat), false, false, &ids);
    CHECK(ids[0] == START && contains_id(ids, n, END) && !contains_id(ids, n, RETURN),
          "gpt-oss without parse_special: user-defined tokens only");
    back = detokenize_all(tok, ids, n, false, &len);
    CHECK(back && !strcmp(back, chat), "gpt-oss spelled-out text decodes to '%s'", back ? back : "(error)");
    free(back);
    free(ids);

    CHECK(moex_tokenizer_is_eog(tok, RETURN) && moex_tokenizer_is_eog(tok, CALL) && moex_tokenizer_is_eog(tok, END_OF_TEXT),
          "gpt-oss <|return|> <|call|> <|endoftext|> end a generation");
    CHECK(!moex_tokenizer_is_eog(tok, END) && !moex_tokenizer_is_eog(tok, START), "gpt-oss <|end|> <|start|> do not");

    /* Long letter runs split into many words stay linear: camel case, then one
     * both-case letter before 200k upper ones (quadratic would take minutes). */
    size_t big = 600000;
    char *text = malloc(big + 2);
    for (size_t i = 0; i < 400000; i++) text[i] = i % 2 ? 'B' : 'a';
    memcpy(text + 400000, "\xc3\x89", 2);
    memset(text + 400002, 'A', big - 400000);
    double t0 = moex_time_s();
    n = tokenize_all(tok, text, big + 2, false, false, &ids);
    CHECK(n > 200000, "gpt-oss long camel-case text gives %lld tokens", (long long)n);
    printf("gpt-oss: %zu bytes of letter runs tokenized in %.0f ms\n", big + 2, (moex_time_s() - t0) * 1e3);
    free(ids);
    free(text);
}

static void test_piece_api(const moex_tokenizer *tok) {
    char buf[64];
    CHECK(moex_token_to_piece(tok, -1, false, buf, sizeof buf) == -1, "negative id rejected");
    CHECK(moex_token_to_piece(tok, moex_tokenizer_n_vocab(tok), false, buf, sizeof buf) == -1, "id past the vocab rejected");
    int n = moex_token_to_piece(tok, 151645, false, buf, sizeof buf);
    CHECK(n == 0, "control token hidden without render_special (got %d)", n);
    n = moex_token_to_piece(tok, 151645, true, buf, sizeof buf);
    CHECK(n == 10 && !memcmp(buf, "<|im_end|>", 10), "control token rendered");
    n = moex_token_to_piece(tok, 151645, true, buf, 3);
    CHECK(n == 10, "short buffer reports the needed length");
    int32_t bad[2] = {9707, 999999999};
    moex_error err = {{0}};
    CHECK(moex_detokenize(tok, bad, 2, false, buf, sizeof buf, &err) == -1 && err.msg[0], "bad id in detokenize is an error");
}

/* Garbage never crashes, gives ids in range, and decodes back sensibly:
 * BPE to the input with each invalid byte replaced by U+FFFD (as llama.cpp),
 * SPM to the input exactly (byte fallback tokens). */
static void test_invalid_utf8(const moex_tokenizer *bpe, const moex_tokenizer *spm) {
    const char in[] = "ok\xff\xfe caf\xc3\xa9 \xc3(\xe2\x82 end\x80";
    const char want_bpe[] = "ok\xef\xbf\xbd\xef\xbf\xbd caf\xc3\xa9 \xef\xbf\xbd(\xef\xbf\xbd\xef\xbf\xbd end\xef\xbf\xbd";
    int32_t *ids;
    int64_t len, n = tokenize_all(bpe, in, sizeof in - 1, false, false, &ids);
    char *back = detokenize_all(bpe, ids, n, false, &len);
    CHECK(back && (size_t)len == sizeof want_bpe - 1 && !memcmp(back, want_bpe, (size_t)len), "BPE invalid UTF-8 becomes U+FFFD");
    free(back);
    free(ids);
    const char in_spm[] = "ok\x80\xbfx caf\xc3\xa9 (\xc3x) end\xff";
    n = tokenize_all(spm, in_spm, sizeof in_spm - 1, false, false, &ids);
    back = detokenize_all(spm, ids, n, false, &len);
    CHECK(back && (size_t)len == sizeof in_spm - 1 && !memcmp(back, in_spm, (size_t)len), "SPM invalid UTF-8 round trips via byte tokens");
    free(back);
    free(ids);
    /* llama.cpp's SPM quirk: a truncated sequence takes the next bytes by its
     * lead byte's length, here two of the U+2581 that stands for the space,
     * so the space comes back spelled as U+2581. */
    const char trunc[] = "a\xe2 b", trunc_back[] = "a\xe2\xe2\x96\x81" "b";
    n = tokenize_all(spm, trunc, sizeof trunc - 1, false, false, &ids);
    back = detokenize_all(spm, ids, n, false, &len);
    CHECK(back && (size_t)len == sizeof trunc_back - 1 && !memcmp(back, trunc_back, (size_t)len), "SPM truncated-sequence quirk");
    free(back);
    free(ids);

    /* Random bytes, biased towards UTF-8 lead/continuation bytes and specials' characters. */
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    const moex_tokenizer *toks[2] = {bpe, spm};
    for (int iter = 0; iter < 400; iter++) {
        char s[64];
        size_t l = (size_t)(iter % 64);
        for (size_t i = 0; i < l; i++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            static const char pool[] = " \n\t<|>'sS0123aZ\xc3\xa9\xe2\x96\x81\xf0\x9f\x98\x81\x80\xbf\xff";
            s[i] = (rng >> 32) % 3 ? pool[(rng >> 40) % (sizeof pool - 1)] : (char)(rng >> 24);
        }
        for (int t = 0; t < 2; t++) {
            for (int special = 0; special < 2; special++) {
                n = tokenize_all(toks[t], s, l, special, special, &ids);
                CHECK(n >= 0, "random input %d tokenizes", iter);
                for (int64_t i = 0; i < n; i++)
                    CHECK(ids[i] >= 0 && ids[i] < moex_tokenizer_n_vocab(toks[t]), "id in range");
                back = detokenize_all(toks[t], ids, n, true, &len);
                CHECK(back != NULL, "random input %d decodes", iter);
                free(back);
                free(ids);
            }
        }
    }
}

static void test_empty(const moex_tokenizer *bpe, const moex_tokenizer *spm) {
    moex_error err = {{0}};
    int32_t id = -7;
    CHECK(moex_tokenize(bpe, "", 0, false, true, &id, 1, &err) == 0, "BPE empty input gives no tokens");
    CHECK(moex_tokenize(spm, "", 0, false, true, &id, 1, &err) == 0, "SPM empty input gives no tokens");
    CHECK(moex_tokenize(spm, NULL, 0, true, false, &id, 1, &err) == 1 && id == 1, "SPM empty input with BOS gives [1]");
    CHECK(moex_tokenize(spm, "x", 1, false, false, NULL, 0, &err) > 0, "size query with cap 0");
    char c;
    CHECK(moex_detokenize(spm, NULL, 0, false, &c, 1, &err) == 0, "empty detokenize");
}

/* SPM BOS and the leading-space rule; llama-bpe (llama3) adds BOS by default. */
static void test_bos(const moex_tokenizer *spm, const moex_tokenizer *llama_bpe) {
    int32_t *ids;
    int64_t n = tokenize_all(spm, "Hello", 5, true, false, &ids), len;
    CHECK(n >= 2 && ids[0] == 1 && moex_tokenizer_bos(spm) == 1, "SPM adds BOS 1");
    free(ids);
    n = tokenize_all(llama_bpe, "Hello", 5, true, false, &ids);
    CHECK(n == 2 && ids[0] == 128000, "llama-bpe adds BOS 128000");
    char *s = detokenize_all(llama_bpe, ids, n, false, &len);
    CHECK(s && !strcmp(s, "Hello"), "BOS not rendered: '%s'", s ? s : "");
    free(s);
    s = detokenize_all(llama_bpe, ids, n, true, &len);
    CHECK(s && !strcmp(s, "<|begin_of_text|>Hello"), "BOS rendered: '%s'", s ? s : "");
    free(s);
    free(ids);
    CHECK(moex_tokenizer_is_eog(llama_bpe, 128001) && moex_tokenizer_is_eog(llama_bpe, 128009), "llama3 eos and eot_id are EOG");
    CHECK(moex_tokenizer_is_eog(spm, 2) && !moex_tokenizer_is_eog(spm, 1), "SPM </s> is EOG, <s> is not");
}

/* Word boundaries of the pre-tokenizers, worked out by hand from the regexes. */
static void check_split(const char *pre, const char *utf8, const int32_t *want, size_t n_want, const char *label) {
    int32_t ends[64];
    moex_error err = {{0}};
    const int64_t n = moex_tokenizer_split_words(pre, utf8, strlen(utf8), ends, 64, &err);
    CHECK(n >= 0, "%s: split_words: %s", label, err.msg);
    bool ok = n == (int64_t)n_want && !memcmp(ends, want, sizeof *want * n_want);
    CHECK(ok, "%s: word ends differ", label);
    if (!ok && n >= 0) print_ids("got word ends", ends, n < 64 ? n : 64);
}

static void test_pretokenizer(void) {
#define SPLIT(pre, s, ...) do { static const int32_t w[] = {__VA_ARGS__}; check_split(pre, s, w, sizeof w / sizeof w[0], pre " " #s); } while (0)
    SPLIT("qwen2", "abc 12345", 3, 4, 5, 6, 7, 8, 9);          /* \p{N}: one digit each */
    SPLIT("llama3", "abc 12345", 3, 4, 7, 9);                 /* \p{N}{1,3} */
    SPLIT("llama3", "'Sfoo", 2, 5);                           /* (?i:'s) */
    SPLIT("gpt-2", "'Sfoo", 1, 5);                            /* 's is case-sensitive */
    SPLIT("gpt-2", "Hello  world", 5, 6, 12);                 /* \s+(?!\S) leaves one space */
    SPLIT("llama3", "a\n\n b", 1, 3, 5);                      /* \s*[\r\n]+ then " b" */
    SPLIT("llama3", "x!!\n\ny", 1, 5, 6);                     /* punctuation takes trailing newlines */
    SPLIT("qwen2", "caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd", 4, 7);  /* non-ASCII letters */
    SPLIT("default", "a+=1234!", 1, 3, 6, 7, 8);              /* punct runs, then 3-digit groups */
    SPLIT("llama-bpe", "ok\xff!", 2, 4);                      /* an invalid byte is one code point (U+FFFD) */
    /* gpt-4o: "upper" is a letter but a-z, "lower" a letter but A-Z (llama.cpp's collapsed regex). */
    SPLIT("gpt-4o", "HelloWorld ABCdef", 5, 10, 17);          /* (upper)*(lower)+ */
    SPLIT("gpt-4o", "\xd0\x9f\xd1\x80\xd0\xb8World", 8);     /* non-ASCII letters are both cases */
    SPLIT("gpt-4o", "\xc3\xa9" "AB", 1, 3);                  /* ends after the last both-case letter */
    SPLIT("gpt-4o", "I'M fine", 3, 8);                        /* (upper)+ then '[mM] */
    SPLIT("gpt-4o", "x/\n/y", 1, 4, 5);                       /* punctuation takes [\r\n/]* */
    SPLIT("gpt-4o", "12345 12", 3, 5, 6, 8);                  /* \p{N}{1,3}; a space is no prefix of digits */
    SPLIT("gpt-4o", "..Hi a  b", 2, 4, 6, 7, 9);              /* [^\r\n\p{L}\p{N}]? takes one character */
    SPLIT("gpt-4o", "e\xcc\x81", 1, 2);                       /* a mark is no letter */
    SPLIT("llama4", "a\r\n\r\n b", 1, 5, 7);                 /* \s*[\r\n]+ then " b" */
#undef SPLIT
    moex_error err = {{0}};
    int32_t ends[4];
    CHECK(moex_tokenizer_split_words("no-such-pre", "a b", 3, ends, 4, &err) == -1 && strstr(err.msg, "no-such-pre"),
          "an unknown pre-tokenizer is an error naming it: '%s'", err.msg);
}

/* gpt-oss's vocabulary is made from the o200k ranks of the npm package js-tiktoken (tools/make_o200k_vocab.py, run
 * by tests/peer/setup_peer.sh into .peer/vocab; its test vectors are in FIXTURES_VOCAB_DIR), not kept in the repository (8 MB):
 * without it the gpt-oss checks are skipped, unless MOEX_REQUIRE_PEER=1 (CI). */
static bool have_gpt_oss(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/ggml-vocab-gpt-oss.gguf", dir ? dir : "");
    FILE *f = dir ? fopen(path, "rb") : NULL;
    if (f) fclose(f);
    if (!f) {
        const char *req = getenv("MOEX_REQUIRE_PEER");
        fprintf(stderr, "%s: %s (run tests/peer/setup_peer.sh)\n", req && !strcmp(req, "1") ? "FAIL" : "skipped gpt-oss",
                dir ? path : "no gpt-oss vocab dir given");
        if (req && !strcmp(req, "1")) g_failures++;
    }
    return f != NULL;
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s FIXTURES_VOCAB_DIR [GPT_OSS_VOCAB_DIR]\n", argv[0]);
        return 2;
    }
    const char *names[4] = {"ggml-vocab-qwen2.gguf", "ggml-vocab-llama-bpe.gguf", "ggml-vocab-llama-spm.gguf",
                            "ggml-vocab-gpt-oss.gguf"};
    const char *dirs[4] = {argv[1], argv[1], argv[1], argc == 3 ? argv[2] : NULL};
    const int n_tok = have_gpt_oss(dirs[3]) ? 4 : 3;
    moex_tokenizer *toks[4] = {0};
    for (int i = 0; i < n_tok; i++) {
        const char *dir = dirs[i];
        double t0 = moex_time_s();
        toks[i] = load_tok(dir, names[i]);
        if (!toks[i]) return 1;
        printf("%s: loaded in %.0f ms\n", names[i], (moex_time_s() - t0) * 1e3);
        cases c;
        if (load_cases(argv[1], names[i], &c)) {   /* every vocabulary's test vectors are in the repository */
            fprintf(stderr, "cannot read the test vectors of %s\n", names[i]);
            return 1;
        }
        test_vectors(toks[i], &c, names[i]);
        test_round_trip(toks[i], &c, names[i]);
        free_cases(&c);
    }
    test_pretokenizer();
    test_qwen2_special(toks[0]);
    test_piece_api(toks[0]);
    test_invalid_utf8(toks[0], toks[2]);
    test_invalid_utf8(toks[1], toks[2]);
    if (toks[3]) {
        test_invalid_utf8(toks[3], toks[2]);
        test_gpt_oss_special(toks[3]);
    }
    test_empty(toks[0], toks[2]);
    test_bos(toks[2], toks[1]);
    for (int i = 0; i < n_tok; i++) moex_tokenizer_free(toks[i]);
    if (g_failures) {
        fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    printf("all tokenizer checks passed\n");
    return 0;
}
