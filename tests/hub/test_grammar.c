/* serve/grammar.c and serve/json_schema.c: parse errors with their line and
 * column, llama.cpp's sample grammars, random JSON texts fed byte by byte and
 * in random token splits, mask == allows on random states, UTF-8 split
 * across tokens and invalid UTF-8, the bound on ambiguous grammars, and JSON
 * schemas compiled, with unsupported keywords named.
 *   test_grammar                 the tests
 *   test_grammar --bench [VOCAB] times mask and allows on a vocabulary GGUF
 *                                (default tests/data/vocab/ggml-vocab-qwen2.gguf) */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "serve/grammar.h"
#include "tests/test_files.h"
#include "tests/test_util.h"

/* tests/ from this file's path (CMake compiles it by its absolute path). */
static void tests_dir(char *out, size_t cap) {
    const char *f = __FILE__, *hub = strstr(f, "hub/test_grammar.c");
    snprintf(out, cap, "%.*s", hub ? (int)(hub - f) : 0, f);
    if (!hub || !out[0]) snprintf(out, cap, "tests/");
}


/* ---- text buffers ---- */

typedef struct {
    char *s;
    size_t n, cap;
} buf;

static void put(buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->s = realloc(b->s, b->cap);
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

static size_t pick(rng *r, size_t n) { return (size_t)(rng_next(r) % n); }

/* ---- random JSON ---- */

static void random_ws(rng *r, buf *b) {
    static const char *const ws[] = {"", "", "", " ", "\n  ", "\t", "\n"};
    puts_(b, ws[pick(r, 7)]);
}

static void random_string(rng *r, buf *b) {
    static const char *const pieces[] = {"a",  "Z",      "0",      " ",      "~",      "\\\"",   "\\\\",   "\\/",
                                         "\\b", "\\f",   "\\n",    "\\r",    "\\t",    "\\u00e9", "\\uD83D\\uDE00",
                                         "é",  "日本",   "😀",     "\x7f",   "key",    "{",      "]",      ":"};
    puts_(b, "\"");
    for (size_t i = 0, n = pick(r, 8); i < n; i++) puts_(b, pieces[pick(r, sizeof pieces / sizeof pieces[0])]);
    puts_(b, "\"");
}

static void random_number(rng *r, buf *b) {
    char tmp[64];
    int n = 0;
    if (pick(r, 3) == 0) tmp[n++] = '-';
    if (pick(r, 4) == 0) tmp[n++] = '0';
    else {
        tmp[n++] = (char)('1' + pick(r, 9));
        for (size_t i = 0, k = pick(r, 9); i < k; i++) tmp[n++] = (char)('0' + pick(r, 10));
    }
    if (pick(r, 2)) {
        tmp[n++] = '.';
        for (size_t i = 0, k = 1 + pick(r, 8); i < k; i++) tmp[n++] = (char)('0' + pick(r, 10));
    }
    if (pick(r, 3) == 0) {
        tmp[n++] = "eE"[pick(r, 2)];
        if (pick(r, 2)) tmp[n++] = "+-"[pick(r, 2)];
        for (size_t i = 0, k = 1 + pick(r, 3); i < k; i++) tmp[n++] = (char)('0' + pick(r, 10));
    }
    put(b, tmp, (size_t)n);
}

static void random_value(rng *r, buf *b, int depth) {
    size_t kind = pick(r, depth > 3 ? 5 : 7);
    if (kind == 0) random_string(r, b);
    else if (kind == 1) random_number(r, b);
    else if (kind == 2) puts_(b, "true");
    else if (kind == 3) puts_(b, "false");
    else if (kind == 4) puts_(b, "null");
    else {
        bool obj = kind == 5;
        puts_(b, obj ? "{" : "[");
        size_t n = pick(r, 4);
        for (size_t i = 0; i < n; i++) {
            random_ws(r, b);
            if (i) puts_(b, ","), random_ws(r, b);
            if (obj) random_string(r, b), random_ws(r, b), puts_(b, ":"), random_ws(r, b);
            random_value(r, b, depth + 1);
        }
        random_ws(r, b);
        puts_(b, obj ? "}" : "]");
    }
}

/* ---- vocabularies ---- */

typedef struct {
    char **text;
    uint32_t *len;
    bool *eog;
    int32_t n, cap;
} vocab_list;

static int32_t vocab_add(vocab_list *v, const char *s, size_t n, bool eog) {
    for (int32_t i = 0; i < v->n; i++) /* small vocabularies only: keep pieces unique */
        if (v->len[i] == n && v->eog[i] == eog && !memcmp(v->text[i], s, n)) return i;
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 512;
        v->text = realloc(v->text, (size_t)v->cap * sizeof(char *));
        v->len = realloc(v->len, (size_t)v->cap * sizeof(uint32_t));
        v->eog = realloc(v->eog, (size_t)v->cap * sizeof(bool));
    }
    v->text[v->n] = malloc(n + 1);
    memcpy(v->text[v->n], s, n);
    v->len[v->n] = (uint32_t)n;
    v->eog[v->n] = eog;
    return v->n++;
}

static void vocab_list_free(vocab_list *v) {
    for (int32_t i = 0; i < v->n; i++) free(v->text[i]);
    free(v->text);
    free(v->len);
    free(v->eog);
}

static serve_grammar_vocab *make_vocab(vocab_list *v) {
    moex_error err = {{0}};
    serve_grammar_vocab *gv = serve_grammar_vocab_create(v->n, (const char *const *)v->text, v->len, v->eog, &err);
    CHECK(gv, "vocab: %s", err.msg);
    return gv;
}

/* A vocabulary of the 256 bytes, EOG, and JSON-like pieces (with split UTF-8 characters). */
static void json_vocab(vocab_list *v, rng *r) {
    for (int i = 0; i < 256; i++) {
        char c = (char)i;
        vocab_add(v, &c, 1, false);
    }
    vocab_add(v, "", 0, true);
    vocab_add(v, "", 0, false); /* an empty non-EOG token: never allowed */
    static const char *const pieces[] = {"{\"", "\":", "\": ", "\": \"", "\", \"", "\",", ", \"", "true", "false",
                                         "null", "nul", "\"}", "}]", "[{", "\n  ", "\n    \"", "  ", "123", "0.5", "e+1",
                                         "é", "\xC3", "\xA9\"", "日本", "\xE6\x97", "\xA5", "😀", "\xF0\x9F", "\x98\x80",
                                         "\\u00", "\\n", "\\\"", "\xC0\xAF", "\xED\xA0\x80", "key", "keys\":"};
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) vocab_add(v, pieces[i], strlen(pieces[i]), false);
    for (int k = 0; k < 60; k++) { /* pieces cut from random JSON */
        buf b = {0};
        random_value(r, &b, 0);
        size_t at = pick(r, b.n), n = 1 + pick(r, 6);
        if (at + n > b.n) n = b.n - at;
        vocab_add(v, b.s + at, n, false);
        free(b.s);
    }
}

/* ---- grammar helpers ---- */

static serve_grammar *parse_ok(const char *text) {
    moex_error err = {{0}};
    serve_grammar *g = serve_grammar_parse(text, NULL, &err);
    CHECK(g, "parse: %s\n%s", err.msg, text);
    return g;
}

static serve_grammar *schema_grammar(const char *schema_json) {
    moex_error err = {{0}};
    cJSON *schema = schema_json ? cJSON_Parse(schema_json) : NULL;
    char *gbnf = serve_json_schema_gbnf(schema, "root", &err);
    cJSON_Delete(schema);
    CHECK(gbnf, "schema %s: %s", schema_json ? schema_json : "NULL", err.msg);
    if (!gbnf) return NULL;
    serve_grammar *g = parse_ok(gbnf);
    free(gbnf);
    return g;
}

/* Feeds text in pieces cut at random (each piece a token of a vocabulary made
 * for it). Returns whether every piece was accepted and the grammar may end. */
static bool feed_split(const serve_grammar *g, const char *text, size_t n, rng *r, size_t max_piece) {
    vocab_list vl = {0};
    int32_t ids[4096];
    size_t n_ids = 0;
    for (size_t at = 0; at < n && n_ids < 4096;) {
        size_t k = 1 + pick(r, max_piece);
        if (at + k > n) k = n - at;
        ids[n_ids++] = vocab_add(&vl, text + at, k, false);
        at += k;
    }
    vocab_add(&vl, "", 0, true);
    serve_grammar_vocab *v = make_vocab(&vl);
    moex_error err = {{0}};
    serve_grammar_state *s = serve_grammar_state_create(g, &err);
    bool ok = v && s;
    for (size_t i = 0; i < n_ids && ok; i++) {
        ok = serve_grammar_allows(s, v, ids[i]);
        bool took = serve_grammar_accept(s, v, ids[i], &err) == 0;
        CHECK(ok == took, "allows %d != accept %d on piece %zu of %.*s", ok, took, i, (int)n, text);
        ok = took;
    }
    ok = ok && serve_grammar_can_end(s);
    serve_grammar_state_free(s);
    serve_grammar_vocab_free(v);
    vocab_list_free(&vl);
    return ok;
}

/* ---- tests ---- */

static void test_parse_errors(void) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"root ::= foo\n", "line 1, column 10: rule 'foo' is used but not defined"},
        {"root ::= \"a\"\nroot \"b\"\n", "line 2, column 6: expected ::="},
        {"root ::= \"abc\n", "line 1, column 10: unterminated literal"},
        {"root ::= [a-z\n", "line 1, column 10: unterminated character class"},
        {"root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n", "left-recursive"},
        {"root ::= a\na ::= b \"x\"\nb ::= \"\" | a \"y\"\n", "left-recursive"},
        {"root ::= \"\\q\"\n", "line 1, column 11: unknown escape '\\q'"},
        {"root ::= \"\\x4\"\n", "escape '\\x' needs 2 hex digits"},
        {"root ::= \"a\"{3,2}\n", "line 1, column 13: bad repetition bounds {3,2}"},
        {"root ::= \"a\"{x}\n", "expected a number after '{'"},
        {"root ::= \"a\"{1,2\n", "expected '}'"},
        {"root ::= ( \"a\"\n", "expected ')'"},
        {"root ::= \"a\" )\n", "unbalanced ')'"},
        {"root ::= * \"a\"\n", "'*' follows no symbol"},
        {"root ::= [z-a]\n", "bad range"},
        {"  ::= \"a\"\n", "line 1, column 3: expected a rule name"},
        {"root ::= \"a\"\nroot ::= \"b\"\n", "rule 'root' is defined twice"},
        {"other ::= \"a\"\n", "no rule 'root'"},
        {"root ::= <think>\n", "token references"},
        {"root ::= \"\\U00110000\"\n", "beyond U+10FFFF"},
        {NULL, "groups nested deeper than"}, /* 1000 '(' */
    };
    char deep[1100] = "root ::= "; /* then 1000 '(' */
    memset(deep + 9, '(', 1000);
    deep[1009] = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        moex_error err = {{0}};
        const char *text = cases[i].text ? cases[i].text : deep;
        serve_grammar *g = serve_grammar_parse(text, NULL, &err);
        CHECK(!g, "bad grammar %zu parsed: %.60s", i, text);
        CHECK(strstr(err.msg, cases[i].want), "grammar %zu: got \"%s\", want \"%s\"", i, err.msg, cases[i].want);
        serve_grammar_free(g);
    }
    /* what is fine: tail self-reference through a nullable prefix, empty alternatives, nested repetition */
    const char *fine[] = {"root ::= \"a\"? root | \"\"\n", "root ::= | \"x\"\n", "root ::= (\"a\"{2,3}){0,2} [^\\n]*\n",
                          "root ::= x\nx ::= (\n  \"a\" |\n  \"b\" # comment\n)+\n", "start ::= \"s\"\n"};
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        moex_error err = {{0}};
        serve_grammar *g = serve_grammar_parse(fine[i], i == 4 ? "start" : NULL, &err);
        CHECK(g, "good grammar %zu: %s", i, err.msg);
        serve_grammar_free(g);
    }
}

/* Every grammar in tests/data/grammars/ (llama.cpp's) parses, and for the
 * known ones a sample text matches and the sample with a stray byte does not. */
static void test_corpus(void) {
    static const struct {
        const char *file, *sample;
    } corpus[] = {
        {"arithmetic.gbnf", "x*2+1=(y)\n"},
        {"c.gbnf", "int main(){return 0;}"},
        {"chess.gbnf", "1. e4 e5\n2. Nf3 Nc6\n"},
        {"english.gbnf", "Hello, world!"},
        {"japanese.gbnf", "こんにちは 世界"},
        {"json.gbnf", "{\"a\": [1, 2.5, \"x\\u00e9\", true, null], \"b\": {}}"},
        {"json_arr.gbnf", "[\n{\"a\": 1}\n]"},
        {"list.gbnf", "- one\n- two\n"},
    };
    char dir[1024], path[1400];
    tests_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%sdata/grammars", dir);
    DIR *d = opendir(path);
    CHECK(d, "cannot open %s", path);
    rng r = {7};
    int parsed = 0, sampled = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        size_t n = strlen(de->d_name);
        if (n < 5 || strcmp(de->d_name + n - 5, ".gbnf")) continue;
        snprintf(path, sizeof path, "%sdata/grammars/%s", dir, de->d_name);
        char *text = test_read_file(path, NULL);
        CHECK(text, "cannot read %s", path);
        serve_grammar *g = text ? parse_ok(text) : NULL;
        parsed += g != NULL;
        for (size_t i = 0; g && i < sizeof corpus / sizeof corpus[0]; i++) {
            if (strcmp(corpus[i].file, de->d_name)) continue;
            sampled++;
            CHECK(feed_split(g, corpus[i].sample, strlen(corpus[i].sample), &r, 4), "%s: sample refused: %s",
                  corpus[i].file, corpus[i].sample);
            char bad[256];
            snprintf(bad, sizeof bad, "%s\x01", corpus[i].sample);
            CHECK(!feed_split(g, bad, strlen(bad), &r, 3), "%s: bad sample accepted", corpus[i].file);
        }
        serve_grammar_free(g);
        free(text);
    }
    if (d) closedir(d);
    CHECK(parsed >= 8 && sampled == 8, "%d grammars parsed, %d samples", parsed, sampled);
}

/* Random JSON texts through the any-value schema grammar, byte by byte and in random splits. */
static void test_random_json(rng *r) {
    serve_grammar *g = schema_grammar(NULL);
    if (!g) return;
    for (int k = 0; k < 400; k++) {
        buf b = {0};
        random_value(r, &b, 0);
        CHECK(feed_split(g, b.s, b.n, r, 1), "byte by byte refused: %s", b.s);
        CHECK(feed_split(g, b.s, b.n, r, 7), "split refused: %s", b.s);
        if (b.n > 1) CHECK(!feed_split(g, b.s, b.n - 1, r, 5) || strchr("0123456789", b.s[b.n - 2]) || b.s[b.n - 1] == ' ',
                           "a cut text ended: %s", b.s);
        free(b.s);
    }
    /* deep nesting: 3000 arrays */
    buf b = {0};
    for (int i = 0; i < 3000; i++) puts_(&b, "[");
    for (int i = 0; i < 3000; i++) puts_(&b, "]");
    CHECK(feed_split(g, b.s, b.n, r, 16), "deep nesting refused");
    free(b.s);
    serve_grammar_free(g);
}

/* For random states: mask[i] == allows(i) == (a clone accepts i), and counts agree. */
static void test_mask_consistency(rng *r) {
    vocab_list vl = {0};
    json_vocab(&vl, r);
    serve_grammar_vocab *v = make_vocab(&vl);
    serve_grammar *g = schema_grammar(NULL);
    uint8_t *mask = malloc((size_t)vl.n), *mask2 = malloc((size_t)vl.n);
    for (int k = 0; v && g && k < 100; k++) {
        buf b = {0};
        random_value(r, &b, 0);
        size_t cut = pick(r, b.n + 1);
        moex_error err = {{0}};
        serve_grammar_state *s = serve_grammar_state_create(g, &err);
        for (size_t i = 0; s && i < cut; i++) CHECK(serve_grammar_accept(s, v, (uint8_t)b.s[i], &err) == 0, "%s", err.msg);
        int32_t n = serve_grammar_mask(s, v, mask), count = 0;
        CHECK(serve_grammar_mask(s, v, mask2) == n && !memcmp(mask, mask2, (size_t)vl.n), "a second mask differs");
        for (int32_t i = 0; i < vl.n; i++) {
            bool a = serve_grammar_allows(s, v, i);
            count += mask[i];
            CHECK(mask[i] == a, "token %d (%.*s) after \"%.*s\": mask %d allows %d", i, (int)vl.len[i], vl.text[i],
                  (int)cut, b.s, mask[i], a);
            if (i % 7 == k % 7 || a) { /* a clone takes exactly what is allowed */
                serve_grammar_state *c = serve_grammar_state_clone(s, &err);
                bool took = serve_grammar_accept(c, v, i, &err) == 0;
                CHECK(took == a, "token %d: accept %d allows %d", i, took, a);
                serve_grammar_state_free(c);
            }
        }
        CHECK(n == count, "mask count %d, %d set", n, count);
        CHECK(n > 0, "nothing allowed after \"%.*s\"", (int)cut, b.s);
        if (cut == b.n) CHECK(serve_grammar_can_end(s) && mask[256], "complete text cannot end");
        serve_grammar_state_free(s);
        free(b.s);
    }
    free(mask);
    free(mask2);
    serve_grammar_free(g);
    serve_grammar_vocab_free(v);
    vocab_list_free(&vl);
}

/* A decode (mask, allows, accept per token) with the matcher's caches held to
 * a tiny budget, so they are rebuilt again and again, against one with the
 * normal budget; a clone goes its own way; a budget too small for anything
 * fails with err. */
static void test_cache_budget(rng *r) {
    vocab_list vl = {0};
    json_vocab(&vl, r);
    char run[160]; /* runs of x: one mask walks through many new positions of a bounded string */
    memset(run, 'x', sizeof run);
    for (size_t k = 2; k <= sizeof run; k += 3) vocab_add(&vl, run, k, false);
    serve_grammar_vocab *v = make_vocab(&vl);
    serve_grammar *g = schema_grammar("{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"k\":"
                                      "{\"type\":\"string\",\"maxLength\":200},\"n\":{\"type\":\"integer\",\"minimum\":-50,\"maximum\":5000}},"
                                      "\"required\":[\"k\"]}}");
    uint8_t *m1 = malloc((size_t)vl.n), *m2 = malloc((size_t)vl.n);
    moex_error err = {{0}};
    serve_grammar_state *normal = g ? serve_grammar_state_create(g, &err) : NULL;
    if (g) serve_grammar_set_cache_budget(g, 150000);
    serve_grammar_state *tight = g ? serve_grammar_state_create(g, &err) : NULL;
    if (g) serve_grammar_set_cache_budget(g, 0);
    buf b = {0};
    puts_(&b, "[");
    for (int i = 0; i < 40; i++) {
        char item[300], pad[160];
        size_t n_pad = pick(r, sizeof pad);
        memset(pad, 'x', n_pad);
        pad[n_pad] = 0;
        snprintf(item, sizeof item, "%s{\"k\": \"é%d%s日\", \"n\": %d}", i ? ", " : "", i, pad, (i * 137) % 5000 - 50);
        puts_(&b, item);
    }
    puts_(&b, "]");
    serve_grammar_state *clone = NULL;
    for (size_t i = 0; normal && tight && i < b.n; i++) {
        int32_t n1 = serve_grammar_mask(normal, v, m1), n2 = serve_grammar_mask(tight, v, m2);
        CHECK(n1 == n2 && !memcmp(m1, m2, (size_t)vl.n), "masks differ at byte %zu (%d vs %d)", i, n1, n2);
        int32_t probe = (int32_t)pick(r, (size_t)vl.n);
        CHECK(serve_grammar_allows(normal, v, probe) == serve_grammar_allows(tight, v, probe), "allows differ at %zu", i);
        int32_t id = (uint8_t)b.s[i];
        CHECK(serve_grammar_accept(normal, v, id, &err) == 0 && serve_grammar_accept(tight, v, id, &err) == 0,
              "byte %zu: %s", i, err.msg);
        if (i == 200) clone = serve_grammar_state_clone(tight, &err);
    }
    CHECK(serve_grammar_can_end(tight) && !serve_grammar_must_end(tight), "the tight decode cannot end (or must: blanks may follow)");
    if (clone) { /* the clone stands after byte 200 still: the rest of the text takes it to the end */
        CHECK(!serve_grammar_can_end(clone), "the clone moved with its original");
        for (size_t i = 201; i < b.n; i++)
            CHECK(serve_grammar_accept(clone, v, (uint8_t)b.s[i], &err) == 0, "clone at byte %zu: %s", i, err.msg);
        CHECK(serve_grammar_can_end(clone), "the clone cannot end");
    }
    serve_grammar_state_free(clone);
    serve_grammar_state_free(normal);
    serve_grammar_state_free(tight);
    if (g) serve_grammar_set_cache_budget(g, 1);
    serve_grammar_state *starved = g ? serve_grammar_state_create(g, &err) : NULL;
    if (g) serve_grammar_set_cache_budget(g, 0);
    if (starved) {
        CHECK(serve_grammar_mask(starved, v, m1) == 0, "a starved matcher allowed tokens");
        CHECK(serve_grammar_accept(starved, v, '[', &err) < 0 && strstr(err.msg, "memory bound"), "starved accept: %s", err.msg);
    }
    serve_grammar_state_free(starved);
    free(b.s);
    free(m1);
    free(m2);
    serve_grammar_free(g);
    serve_grammar_vocab_free(v);
    vocab_list_free(&vl);
}

/* A character split across tokens; invalid UTF-8 refused. */
static void test_utf8(rng *r) {
    serve_grammar *g = parse_ok("root ::= \"é\" [ぁ-ゟ]+ \"😀\"\n");
    vocab_list vl = {0};
    int32_t c3 = vocab_add(&vl, "\xC3", 1, false), a9 = vocab_add(&vl, "\xA9\xE3\x81", 3, false);
    int32_t x82 = vocab_add(&vl, "\x82", 1, false), emoji1 = vocab_add(&vl, "\xF0\x9F", 2, false);
    int32_t emoji2 = vocab_add(&vl, "\x98\x80", 2, false), bad = vocab_add(&vl, "\xC3\x28", 2, false);
    int32_t wrong = vocab_add(&vl, "\xE3\x82", 2, false); /* U+30xx with second byte 0x82: outside ぁ-ゟ (U+3041..U+309F)? */
    int32_t eog = vocab_add(&vl, "", 0, true);
    serve_grammar_vocab *v = make_vocab(&vl);
    moex_error err = {{0}};
    serve_grammar_state *s = g && v ? serve_grammar_state_create(g, &err) : NULL;
    if (s) {
        CHECK(serve_grammar_allows(s, v, c3), "a lead byte of é refused");
        CHECK(!serve_grammar_allows(s, v, bad), "invalid UTF-8 allowed");
        CHECK(!serve_grammar_allows(s, v, wrong), "a lead of a character outside the grammar allowed");
        CHECK(serve_grammar_accept(s, v, c3, &err) == 0, "%s", err.msg);
        CHECK(!serve_grammar_can_end(s), "ends mid-character");
        CHECK(!serve_grammar_allows(s, v, eog), "EOG mid-character");
        CHECK(serve_grammar_accept(s, v, a9, &err) == 0, "é completed + a started: %s", err.msg);
        CHECK(serve_grammar_accept(s, v, x82, &err) == 0, "ゟ-range char completed: %s", err.msg); /* U+3042 あ */
        CHECK(serve_grammar_accept(s, v, emoji1, &err) == 0 && serve_grammar_accept(s, v, emoji2, &err) == 0,
              "emoji across tokens: %s", err.msg);
        CHECK(serve_grammar_must_end(s), "must end after the emoji");
        CHECK(serve_grammar_accept(s, v, eog, &err) == 0, "EOG at the end: %s", err.msg);
    }
    serve_grammar_state_free(s);
    serve_grammar_vocab_free(v);
    vocab_list_free(&vl);
    serve_grammar_free(g);
    /* any character: overlong forms, surrogates, stray continuation bytes and beyond U+10FFFF are refused */
    g = parse_ok("root ::= .*\n");
    static const char *const invalid[] = {"\xC0\xAF", "\xED\xA0\x80", "\x80", "\xF4\x90\x80\x80", "\xE0\x80\x80", "\xFF", "a\xC3"};
    for (size_t i = 0; g && i < sizeof invalid / sizeof invalid[0]; i++)
        CHECK(!feed_split(g, invalid[i], strlen(invalid[i]), r, 2), "invalid UTF-8 %zu accepted", i);
    static const char *const valid[] = {"\xC2\x80", "\xED\x9F\xBF", "\xF4\x8F\xBF\xBF", "\xEF\xBF\xBF", "plain"};
    for (size_t i = 0; g && i < sizeof valid / sizeof valid[0]; i++)
        CHECK(feed_split(g, valid[i], strlen(valid[i]), r, 1), "valid UTF-8 %zu refused", i);
    serve_grammar_free(g);
}

/* An ambiguous grammar fails with err, not by growing without end. */
static void test_bounded(void) {
    serve_grammar *g = parse_ok("root ::= s\ns ::= \"a\" s \"b\" | \"a\" s \"c\" | \"\"\n");
    vocab_list vl = {0};
    int32_t a = vocab_add(&vl, "a", 1, false);
    serve_grammar_vocab *v = make_vocab(&vl);
    moex_error err = {{0}};
    serve_grammar_state *s = g && v ? serve_grammar_state_create(g, &err) : NULL;
    int i = 0, rc = 0;
    for (; s && i < 40 && (rc = serve_grammar_accept(s, v, a, &err)) == 0; i++) {}
    CHECK(rc < 0 && strstr(err.msg, "ambiguous"), "ambiguous grammar ran %d tokens: %s", i, err.msg);
    CHECK(i >= 10 && i < 20, "failed after %d tokens", i);
    serve_grammar_state_free(s);
    serve_grammar_vocab_free(v);
    vocab_list_free(&vl);
    serve_grammar_free(g);
}

/* Schemas: what compiles matches what it should; what is not supported says what and where. */
static void test_schemas(rng *r) {
    static const struct {
        const char *schema, *good, *bad;
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"a\"]}",
         "{\"a\": 1, \"b\": \"x\"}", "{\"b\": \"x\"}"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":true}",
         "{\"a\": 1, \"zz\": [1]}", "{\"zz\": 1, \"a\": 1, }"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"string\"}}",
         "{\"a\": 1, \"ab\": \"x\"}", "{\"a\": 1, \"a\": \"x\"}"}, /* a listed name again: a duplicate key */
        {"{\"type\":\"array\",\"items\":{\"enum\":[\"x\",2]},\"minItems\":2,\"maxItems\":3}", "[\"x\", 2]", "[\"x\"]"},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"null\"},{\"type\":\"boolean\"}],\"items\":false}", "[null, true]",
         "[null, true, 1]"},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"a\\nb\"", "\"abcd\""},
        {"{\"type\":\"string\",\"format\":\"uuid\"}", "\"123e4567-e89b-12d3-a456-426614174000\"", "\"123e4567\""},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-29\"", "\"2024-13-01\""},
        {"{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d+$\"}", "\"AB-12\"", "\"AB-\""},
        {"{\"type\":\"string\",\"pattern\":\"ab\"}", "\"xxaby\"", "\"xayb\""},
        {"{\"type\":\"integer\",\"minimum\":-20,\"exclusiveMaximum\":300}", "-20", "300"},
        {"{\"type\":\"integer\",\"minimum\":10}", "123456", "9"},
        {"{\"type\":[\"string\",\"null\"]}", "null", "1"},
        {"{\"const\":{\"k\":[1,\"é\"]}}", "{\"k\":[1,\"é\"]}", "{\"k\": [1,\"é\"]}"},
        {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"boolean\"}},\"required\":[\"x\"]}]}",
         "{\"x\": false}", "{}"},
        {"{\"$defs\":{\"T\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/T\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/T\"}",
         "{\"v\": 1, \"next\": {\"v\": 2, \"next\": null}}", "{\"v\": 1, \"next\": {\"v\": 2}}"},
        {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},{\"properties\":{\"b\":{\"type\":\"integer\"}},\"required\":[\"b\"]}]}",
         "{\"a\": 1, \"b\": 2}", "{\"a\": 1}"},
        {"{\"type\":\"number\",\"minimum\":0}", "0.5e3", "-1"},
        {"{}", "[{\"a\": null}]", "[{\"a\": nul}]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        serve_grammar *g = schema_grammar(cases[i].schema);
        if (!g) continue;
        CHECK(feed_split(g, cases[i].good, strlen(cases[i].good), r, 4), "schema %zu refused %s", i, cases[i].good);
        CHECK(!feed_split(g, cases[i].bad, strlen(cases[i].bad), r, 4), "schema %zu accepted %s", i, cases[i].bad);
        serve_grammar_free(g);
    }
    static const struct {
        const char *schema, *want;
    } errors[] = {
        {"{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integer\",\"if\":{}}}}", "properties.age: 'if' is not supported"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "'uniqueItems' is not supported"},
        {"{\"type\":\"string\",\"format\":\"email\"}", "format 'email' is not supported"},
        {"{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "lookaround"},
        {"{\"type\":\"string\",\"pattern\":\"a\\\\bc\"}", "unsupported escape"},
        {"{\"type\":\"number\",\"maximum\":3}", "'maximum' on a number"},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "'maximum' beside 'minimum' on a number"},
        {"{\"$ref\":\"#/$defs/Missing\"}", "points to nothing"},
        {"{\"$ref\":\"other.json#/x\"}", "only local references"},
        {"{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", "only object schemas"},
        {"{\"type\":\"object\",\"patternProperties\":{}}", "'patternProperties' is not supported"},
        {"{\"type\":\"object\",\"minProperties\":1}", "'minProperties' is not supported"},
        {"{\"not\":{}}", "'not' is not supported"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"],\"additionalProperties\":false}",
         "no object satisfies the schema"},
        {"{\"type\":\"integer\",\"multipleOf\":2}", "'multipleOf' is not supported"},
        {"false", "allows no value"},
        {"{\"type\":\"strin\"}", "not a JSON schema type"},
        {"{\"type\":\"string\",\"minLength\":2,\"pattern\":\"a\"}", "beside 'pattern'"},
        {"{\"type\":\"string\",\"pattern\":\"a$b\"}", "anchors are supported only"},
        {"{\"type\":\"string\",\"pattern\":\"a+?\"}", "lazy"},
        {"{\"type\":\"string\",\"pattern\":\"((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((a))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))\"}", "nested deeper"},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/A\",\"minimum\":1}}}", "beside '$ref'"},
    };
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
        moex_error err = {{0}};
        cJSON *schema = cJSON_Parse(errors[i].schema);
        char *gbnf = serve_json_schema_gbnf(schema, "root", &err);
        CHECK(!gbnf && strstr(err.msg, errors[i].want), "schema error %zu: got \"%s\", want \"%s\"", i,
              gbnf ? gbnf : err.msg, errors[i].want);
        free(gbnf);
        cJSON_Delete(schema);
    }
    /* several schemas in one grammar: names do not clash */
    moex_error err = {{0}};
    cJSON *s1 = cJSON_Parse("{\"type\":\"integer\"}"), *s2 = cJSON_Parse("{\"type\":\"string\"}");
    char *a = serve_json_schema_gbnf(s1, "tool-a", &err), *b = serve_json_schema_gbnf(s2, "tool-b", &err);
    buf all = {0};
    puts_(&all, "root ::= tool-a | tool-b\n");
    if (a && b) puts_(&all, a), puts_(&all, b);
    serve_grammar *g = a && b ? parse_ok(all.s) : NULL;
    CHECK(g && feed_split(g, "\"s\"", 3, r, 2) && feed_split(g, "12", 2, r, 2), "two schemas in one grammar");
    serve_grammar_free(g);
    free(all.s);
    free(a);
    free(b);
    cJSON_Delete(s1);
    cJSON_Delete(s2);
}

/* ---- the benchmark ---- */

static double now_us(void) { return moex_time_s() * 1e6; }

/* A decode of doc's tokens one by one: at each, allows(the token), then mask
 * (as a sampler does when its pick is refused), then accept; now and then the
 * mask against allows on every token, on a clone. Prints the times; -1 on a mismatch. */
static int decode(moex_tokenizer *tok, const serve_grammar_vocab *v, const serve_grammar *g, const char *label,
                  const char *doc) {
    moex_error err = {{0}};
    int32_t n = moex_tokenizer_n_vocab(tok);
    int32_t ids[1024];
    int64_t n_ids = moex_tokenize(tok, doc, strlen(doc), false, false, ids, 1024, &err);
    uint8_t *mask = malloc((size_t)n);
    serve_grammar_state *s = serve_grammar_state_create(g, &err);
    if (!s || n_ids < 0 || n_ids > 1024) {
        fprintf(stderr, "%s: %s\n", label, err.msg);
        goto fail;
    }
    double t_allow = 0, t_mask = 0, t_accept = 0, worst = 0;
    int64_t n_allow = 0, n_verified = 0;
    for (int64_t k = 0; s && k < n_ids; k++) {
        double tc = now_us();
        bool ok = serve_grammar_allows(s, v, ids[k]);
        t_allow += now_us() - tc;
        n_allow++;
        tc = now_us();
        int32_t allowed = serve_grammar_mask(s, v, mask);
        double dt = now_us() - tc;
        t_mask += dt;
        if (dt > worst) worst = dt;
        if (k % 10 == 3) { /* now and then, on a clone (its own caches): the mask against allows on every token */
            serve_grammar_state *c = serve_grammar_state_clone(s, &err);
            uint8_t *cm = malloc((size_t)n);
            bool same = c && cm;
            if (same) serve_grammar_mask(c, v, cm);
            for (int32_t i = 0; same && i < n; i++) {
                same = cm[i] == mask[i] && cm[i] == serve_grammar_allows(c, v, i);
                if (!same) fprintf(stderr, "%s: token %d: mask %d, clone's mask %d, allows %d\n", label, i, mask[i], cm[i], !cm[i]);
            }
            free(cm);
            serve_grammar_state_free(c);
            if (!same) goto fail;
            n_verified++;
        }
        if (!ok || !mask[ids[k]] || allowed <= 0) {
            fprintf(stderr, "%s: token %lld refused\n", label, (long long)k);
            goto fail;
        }
        tc = now_us();
        if (serve_grammar_accept(s, v, ids[k], &err) < 0) {
            fprintf(stderr, "%s: %s\n", label, err.msg);
            goto fail;
        }
        t_accept += now_us() - tc;
    }
    printf("%s: decode of a %zu-byte JSON document, %lld tokens: allows %.2f us, mask %.1f us (worst %.1f us), accept %.2f us "
           "per token (mask == allows checked at %lld positions)\n", label, strlen(doc), (long long)n_ids, t_allow / (double)n_allow,
           t_mask / (double)n_ids, worst, t_accept / (double)n_ids, (long long)n_verified);
    serve_grammar_state_free(s);
    free(mask);
    return 0;
fail:
    serve_grammar_state_free(s);
    free(mask);
    return -1;
}

static int bench(const char *path) {
    moex_error err = {{0}};
    moex_gguf *gg = moex_gguf_open(path, &err);
    moex_tokenizer *tok = gg ? moex_tokenizer_load(gg, &err) : NULL;
    if (gg) moex_gguf_close(gg);
    if (!tok) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        return 1;
    }
    int32_t n = moex_tokenizer_n_vocab(tok);
    char **text = calloc((size_t)n, sizeof(char *));
    uint32_t *len = calloc((size_t)n, sizeof(uint32_t));
    bool *eog = calloc((size_t)n, sizeof(bool));
    for (int32_t i = 0; i < n; i++) {
        char piece[512];
        int k = moex_token_to_piece(tok, i, false, piece, sizeof piece);
        if (k < 0 || k > (int)sizeof piece) k = 0;
        text[i] = malloc((size_t)k + 1);
        memcpy(text[i], piece, (size_t)k);
        len[i] = (uint32_t)k;
        eog[i] = moex_tokenizer_is_eog(tok, i);
    }
    double t0 = now_us();
    serve_grammar_vocab *v = serve_grammar_vocab_create(n, (const char *const *)text, len, eog, &err);
    double t_vocab = now_us() - t0;
    char dir[1024], gpath[1200];
    tests_dir(dir, sizeof dir);
    snprintf(gpath, sizeof gpath, "%sdata/grammars/json.gbnf", dir);
    char *gtext = test_read_file(gpath, NULL);
    serve_grammar *g = gtext ? serve_grammar_parse(gtext, NULL, &err) : NULL;
    free(gtext);
    if (!v || !g) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 1;
    }
    printf("vocab %d tokens, trie built in %.1f ms\n", n, t_vocab / 1000);
    static const char doc[] =
        "{\"name\": \"Alice Example\", \"age\": 42, \"email\": \"alice@example.com\", \"tags\": [\"admin\", \"ops\", "
        "\"on-call\"], \"address\": {\"street\": \"12 Rue de la Paix\", \"city\": \"Paris\", \"zip\": \"75002\"}, "
        "\"scores\": [98.5, 87.25, 1e3, -4], \"active\": true, \"manager\": null, \"notes\": \"Speaks French \\u00e9 and "
        "Japanese (日本語); likes \\\"quotes\\\".\", \"history\": [{\"year\": 2021, \"role\": \"dev\"}, {\"year\": "
        "2023, \"role\": \"lead\"}]}";
    if (decode(tok, v, g, "json.gbnf", doc) < 0) return 1;
    /* a schema with bounded strings and integers: positions that count rather than loop */
    serve_grammar *sg = schema_grammar(
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},\"age\":{\"type\":\"integer\","
        "\"minimum\":0,\"maximum\":150},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":1,"
        "\"maxLength\":12},\"maxItems\":5},\"bio\":{\"type\":\"string\"}},\"required\":[\"name\",\"age\"]}");
    static const char sdoc[] = "{\"name\": \"Alice Example\", \"age\": 42, \"tags\": [\"admin\", \"ops\", \"on-call\"], "
                               "\"bio\": \"Speaks French é and Japanese (日本語), 12345678901234567890 bytes.\"}";
    int rc = sg ? decode(tok, v, sg, "a schema", sdoc) : -1;
    serve_grammar_free(sg);
    if (rc < 0) return 1;
    int32_t ids[1024];
    uint8_t *mask = malloc((size_t)n);
    serve_grammar_state *s;
    /* masks from a fresh state at given positions (nothing cached: the worst case) */
    static const char *const prefixes[] = {"{\"name\": \"Al", "{\"name\": \"Alice\", ", "{\"name\": \"Alice\", \"age\": ",
                                           "{\"name\": \"Alice\", \"age\": 3", "{\"a\": [1, {\"b\": "};
    for (size_t p = 0; p < sizeof prefixes / sizeof prefixes[0]; p++) {
        s = serve_grammar_state_create(g, &err);
        int64_t np = moex_tokenize(tok, prefixes[p], strlen(prefixes[p]), false, false, ids, 1024, &err);
        for (int64_t k = 0; k < np; k++)
            if (serve_grammar_accept(s, v, ids[k], &err) < 0) {
                fprintf(stderr, "bench: %s\n", err.msg);
                return 1;
            }
        double tc = now_us();
        int32_t allowed = serve_grammar_mask(s, v, mask);
        double cold = now_us() - tc;
        int32_t probes = 100000;
        uint64_t seed = 1;
        int32_t yes = 0;
        tc = now_us();
        for (int32_t k = 0; k < probes; k++) yes += serve_grammar_allows(s, v, (int32_t)(moex_splitmix64(&seed) % (uint64_t)n));
        double allow = (now_us() - tc) / probes;
        printf("fresh state after %-32s allowed %6d/%d  mask %8.1f us  allows(random token) %.3f us (%d%% yes)\n",
               prefixes[p], allowed, n, cold, allow, yes * 100 / probes);
        serve_grammar_state_free(s);
    }
    free(mask);
    serve_grammar_free(g);
    serve_grammar_vocab_free(v);
    for (int32_t i = 0; i < n; i++) free(text[i]);
    free(text);
    free(len);
    free(eog);
    moex_tokenizer_free(tok);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
        char dir[1024], path[1200];
        tests_dir(dir, sizeof dir);
        snprintf(path, sizeof path, "%sdata/vocab/ggml-vocab-qwen2.gguf", dir);
        return bench(argc > 2 ? argv[2] : path);
    }
    rng r = test_rng("test_grammar");
    double t0 = moex_time_s();
    test_parse_errors();
    test_corpus();
    test_random_json(&r);
    test_mask_consistency(&r);
    test_cache_budget(&r);
    test_utf8(&r);
    test_bounded();
    test_schemas(&r);
    /* the real 152k vocabulary: mask == allows along a decode (and the timings, for the record) */
    char dir[1024], path[1200];
    tests_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%sdata/vocab/ggml-vocab-qwen2.gguf", dir);
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        CHECK(bench(path) == 0, "the decode on %s", path);
    }
    printf("test_grammar: %s (%.1f s)\n", g_failures ? "FAILED" : "ok", moex_time_s() - t0);
    return g_failures ? 1 : 0;
}
