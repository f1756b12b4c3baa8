/* grammar_check: the matcher as a filter, for tests/hub/test_grammar.py.
 *   grammar_check gbnf FILE      texts against the GBNF grammar in FILE
 *   grammar_check schema FILE    texts against the JSON schema in FILE (compiled to GBNF)
 *   grammar_check print FILE     prints the GBNF the JSON schema in FILE compiles to
 * Texts come on stdin, one per line, each a JSON string literal ("..."), so
 * any bytes can be sent; for each, one line: 1 when the whole text is a
 * sentence of the grammar, 0 when not. A schema or grammar that fails to
 * compile prints "error: ..." on stdout and exits 3. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/grammar.h"
#include "tests/test_files.h"


/* A vocabulary of the 256 single bytes (token b is byte b), so texts go through byte by byte. */
static serve_grammar_vocab *byte_vocab(moex_error *err) {
    static char bytes[256];
    const char *text[256];
    uint32_t len[256];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        text[i] = &bytes[i];
        len[i] = 1;
    }
    return serve_grammar_vocab_create(256, text, len, NULL, err);
}

/* Whether the whole text is a sentence of g. */
static bool matches(const serve_grammar *g, const serve_grammar_vocab *v, const char *text, size_t n) {
    moex_error err = {{0}};
    serve_grammar_state *s = serve_grammar_state_create(g, &err);
    if (!s) return false;
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) ok = serve_grammar_accept(s, v, (uint8_t)text[i], &err) == 0;
    ok = ok && serve_grammar_can_end(s);
    serve_grammar_state_free(s);
    return ok;
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[1], "gbnf") && strcmp(argv[1], "schema") && strcmp(argv[1], "print"))) {
        fprintf(stderr, "usage: %s gbnf|schema|print FILE < texts\n", argv[0]);
        return 2;
    }
    char *src = test_read_file(argv[2], NULL);
    if (!src) {
        fprintf(stderr, "cannot read %s\n", argv[2]);
        return 2;
    }
    moex_error err = {{0}};
    char *gbnf = src;
    if (strcmp(argv[1], "gbnf")) {
        cJSON *schema = cJSON_Parse(src);
        if (!schema) {
            printf("error: %s is not JSON\n", argv[2]);
            return 3;
        }
        gbnf = serve_json_schema_gbnf(schema, "root", &err);
        cJSON_Delete(schema);
        free(src);
        if (!gbnf) {
            printf("error: %s\n", err.msg);
            return 3;
        }
        if (!strcmp(argv[1], "print")) {
            fputs(gbnf, stdout);
            free(gbnf);
            return 0;
        }
    }
    serve_grammar *g = serve_grammar_parse(gbnf, NULL, &err);
    free(gbnf);
    serve_grammar_vocab *v = g ? byte_vocab(&err) : NULL;
    if (!g || !v) {
        printf("error: %s\n", err.msg);
        serve_grammar_free(g);
        return 3;
    }
    size_t cap = 1 << 16;
    char *line = malloc(cap);
    int rc = 0;
    while (line && fgets(line, (int)cap, stdin)) {
        size_t n = strlen(line);
        while (n == cap - 1 && line[n - 1] != '\n') { /* a long line: read on */
            char *q = realloc(line, cap * 2);
            if (!q) break;
            line = q;
            if (!fgets(line + n, (int)(cap * 2 - n), stdin)) break;
            cap *= 2;
            n = strlen(line);
        }
        cJSON *s = cJSON_Parse(line);
        if (!cJSON_IsString(s)) {
            fprintf(stderr, "grammar_check: a line is not a JSON string\n");
            cJSON_Delete(s);
            rc = 2;
            break;
        }
        /* cJSON strings stop at a NUL: "\u0000" in a text ends it early (the tests send none) */
        printf("%d\n", matches(g, v, s->valuestring, strlen(s->valuestring)) ? 1 : 0);
        cJSON_Delete(s);
    }
    free(line);
    serve_grammar_vocab_free(v);
    serve_grammar_free(g);
    return rc;
}
