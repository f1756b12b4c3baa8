/* moex-gguf tokenize / detokenize: the tokenizer of a GGUF file from the
 * command line. Text and ids come from the arguments or, when absent, from
 * all of stdin, byte for byte; tokenize --batch takes many texts, one per
 * line (tests/peer/peer_tokenize.py compares them with llama.cpp). */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "tools/tool.h"

typedef struct tok_args {
    const char *vocab;
    const char *input;    /* NULL: read stdin */
    bool special;
    bool add_bos;
    bool batch;
} tok_args;

static void usage_tokenize(FILE *f) {
    fprintf(f, "usage: moex-gguf tokenize VOCAB.gguf [TEXT] [--special] [--add-bos]\n"
               "       moex-gguf tokenize VOCAB.gguf --batch < lines of \"FLAGS HEX\"\n"
               "  prints the token ids of TEXT (all of stdin when absent) on one line\n"
               "  --special   text like <|im_end|> becomes its special token\n"
               "  --add-bos   prepend BOS when the vocabulary asks for it (add_bos_token)\n"
               "  --batch     one text per stdin line, its bytes in hex after FLAGS (bit 0: --special,\n"
               "              bit 1: --add-bos); prints per line the ids, a tab and the hex of their\n"
               "              detokenization (special tokens rendered when bit 0 is set)\n");
}

static void usage_detokenize(FILE *f) {
    fprintf(f, "usage: moex-gguf detokenize VOCAB.gguf [IDS] [--special]\n"
               "  writes the text of IDS (separated by spaces or commas; all of stdin when absent)\n"
               "  --special   render control tokens such as <|im_end|> as their text\n");
}

/* Returns 0, 2 on bad usage, or -1 for --help (exit 0). */
static int parse_args(int argc, char **argv, bool allow_bos, tok_args *a) {
    memset(a, 0, sizeof *a);
    int n_pos = 0;
    bool only_pos = false;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!only_pos && !strcmp(s, "--")) only_pos = true;
        else if (!only_pos && (!strcmp(s, "-h") || !strcmp(s, "--help"))) return -1;
        else if (!only_pos && !strcmp(s, "--special")) a->special = true;
        else if (!only_pos && allow_bos && !strcmp(s, "--add-bos")) a->add_bos = true;
        else if (!only_pos && allow_bos && !strcmp(s, "--batch")) a->batch = true;
        else if (!only_pos && s[0] == '-' && s[1] == '-') {
            fprintf(stderr, "%s: unknown option '%s'\n", argv[0], s);
            return 2;
        } else if (n_pos == 0) { a->vocab = argv[i]; n_pos++; }
        else if (n_pos == 1) { a->input = argv[i]; n_pos++; }
        else {
            fprintf(stderr, "%s: unexpected argument '%s'\n", argv[0], s);
            return 2;
        }
    }
    if (!a->vocab) {
        fprintf(stderr, "%s: missing VOCAB.gguf\n", argv[0]);
        return 2;
    }
    return 0;
}

/* All of stdin into a malloc'd buffer (*len bytes, NUL-terminated). */
static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) break;
            buf = b;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, stdin);
        n += got;
        if (got == 0) {
            if (ferror(stdin)) break;
            buf[n] = 0;
            *len = n;
            return buf;
        }
    }
    free(buf);
    return NULL;
}

static moex_tokenizer *open_tokenizer(const char *cmd, const char *path) {
    moex_error err = {{0}};
    moex_gguf *g = moex_gguf_open(path, &err);
    if (!g) {
        fprintf(stderr, "%s: %s: %s\n", cmd, path, err.msg);
        return NULL;
    }
    moex_tokenizer *tok = moex_tokenizer_load(g, &err);
    moex_gguf_close(g);
    if (!tok) fprintf(stderr, "%s: %s: %s\n", cmd, path, err.msg);
    return tok;
}

/* The input text: the argument, or all of stdin. */
static char *get_input(const char *cmd, const tok_args *a, size_t *len) {
    if (a->input) {
        *len = strlen(a->input);
        char *s = malloc(*len + 1);
        if (s) memcpy(s, a->input, *len + 1);
        return s;
    }
    char *s = read_stdin(len);
    if (!s) fprintf(stderr, "%s: cannot read stdin: %s\n", cmd, strerror(errno));
    return s;
}

/* ---- tokenize --batch ---- */

static int hex_digit(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Decodes hex[0..n) in place: the byte count, -1 when it is not hex. */
static int64_t unhex(char *hex, size_t n) {
    if (n % 2) return -1;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hex_digit((unsigned char)hex[2 * i]), lo = hex_digit((unsigned char)hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        hex[i] = (char)(hi * 16 + lo);
    }
    return (int64_t)(n / 2);
}

/* One "FLAGS HEX" line (newline stripped) -> "IDS\tHEX" on stdout. */
static int batch_line(const moex_tokenizer *tok, char *line, moex_error *err) {
    char *sp = strchr(line, ' ');
    int flags = atoi(line);
    bool special = flags & 1, add_bos = (flags >> 1) & 1;
    int64_t len = sp ? unhex(sp + 1, strlen(sp + 1)) : 0;
    if (len < 0) return moex_fail(err, "bad --batch line '%.40s' (want FLAGS HEX)", line);
    const char *text = sp ? sp + 1 : "";
    int64_t cap = len + 16;
    int32_t *ids = malloc(sizeof *ids * (size_t)cap);
    int64_t n = ids ? moex_tokenize(tok, text, (size_t)len, add_bos, special, ids, cap, err) : -1;
    int64_t out_len = n >= 0 && n <= cap ? moex_detokenize(tok, ids, n, special, NULL, 0, err) : -1;
    char *out = out_len >= 0 ? malloc((size_t)out_len + 1) : NULL;
    int rc = !out || moex_detokenize(tok, ids, n, special, out, out_len, err) != out_len;
    for (int64_t i = 0; !rc && i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\t');
    for (int64_t i = 0; !rc && i < out_len; i++) printf("%02x", (unsigned char)out[i]);
    putchar('\n');
    free(ids);
    free(out);
    return rc ? (err->msg[0] ? -1 : moex_fail(err, "out of memory")) : 0;
}

static int run_batch(const char *cmd, const char *vocab) {
    moex_tokenizer *tok = open_tokenizer(cmd, vocab);
    if (!tok) return 1;
    moex_error err = {{0}};
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int rc = 0;
    while (!rc && (got = getline(&line, &cap, stdin)) >= 0) {
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        rc = batch_line(tok, line, &err);
    }
    if (rc) fprintf(stderr, "%s: %s\n", cmd, err.msg);
    free(line);
    moex_tokenizer_free(tok);
    return rc || fflush(stdout) ? 1 : 0;
}

int moex_tool_tokenize(int argc, char **argv) {
    tok_args a;
    int u = parse_args(argc, argv, true, &a);
    if (!u && a.batch && (a.input || a.special || a.add_bos)) {
        fprintf(stderr, "%s: --batch takes no TEXT, --special or --add-bos (they come per line)\n", argv[0]);
        u = 2;
    }
    if (u) {
        usage_tokenize(u < 0 ? stdout : stderr);
        return u < 0 ? 0 : 2;
    }
    if (a.batch) return run_batch(argv[0], a.vocab);
    size_t len = 0;
    char *text = get_input(argv[0], &a, &len);
    if (!text) return 1;
    moex_tokenizer *tok = open_tokenizer(argv[0], a.vocab);
    int rc = 1;
    int32_t *ids = NULL;
    if (!tok) goto done;
    moex_error err = {{0}};
    int64_t cap = (int64_t)len + 16;
    ids = malloc(sizeof *ids * (size_t)cap);
    int64_t n = ids ? moex_tokenize(tok, text, len, a.add_bos, a.special, ids, cap, &err) : -1;
    if (n > cap) {   /* cannot happen with one token per byte at most, but keep the contract */
        free(ids);
        cap = n;
        ids = malloc(sizeof *ids * (size_t)cap);
        n = ids ? moex_tokenize(tok, text, len, a.add_bos, a.special, ids, cap, &err) : -1;
    }
    if (n < 0) {
        fprintf(stderr, "%s: %s\n", argv[0], ids ? err.msg : "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    rc = fflush(stdout) ? 1 : 0;
done:
    free(ids);
    free(text);
    moex_tokenizer_free(tok);
    return rc;
}

/* Parses ids separated by spaces, commas or newlines. -1 with a message on a bad one. */
static int64_t parse_ids(const char *cmd, const char *s, int32_t **out) {
    size_t cap = 64, n = 0;
    int32_t *ids = malloc(sizeof *ids * cap);
    if (!ids) return -1;
    for (const char *p = s;;) {
        while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX ||
            (*end && *end != ' ' && *end != ',' && *end != '\n' && *end != '\t' && *end != '\r')) {
            const char *e = p;
            while (*e && *e != ' ' && *e != ',' && *e != '\n') e++;
            fprintf(stderr, "%s: '%.*s' is not a token id\n", cmd, (int)(e - p > 40 ? 40 : e - p), p);
            free(ids);
            return -1;
        }
        if (n == cap) {
            int32_t *b = realloc(ids, sizeof *ids * cap * 2);
            if (!b) {
                free(ids);
                return -1;
            }
            ids = b;
            cap *= 2;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    *out = ids;
    return (int64_t)n;
}

int moex_tool_detokenize(int argc, char **argv) {
    tok_args a;
    int u = parse_args(argc, argv, false, &a);
    if (u) {
        usage_detokenize(u < 0 ? stdout : stderr);
        return u < 0 ? 0 : 2;
    }
    size_t len = 0;
    char *input = get_input(argv[0], &a, &len);
    if (!input) return 1;
    if (memchr(input, 0, len)) {
        fprintf(stderr, "%s: the id list contains a NUL byte\n", argv[0]);
        free(input);
        return 1;
    }
    int32_t *ids = NULL;
    char *text = NULL;
    int rc = 1;
    moex_tokenizer *tok = NULL;
    int64_t n = parse_ids(argv[0], input, &ids);
    if (n < 0) goto done;
    tok = open_tokenizer(argv[0], a.vocab);
    if (!tok) goto done;
    moex_error err = {{0}};
    int64_t need = moex_detokenize(tok, ids, n, a.special, NULL, 0, &err);
    if (need < 0) {
        fprintf(stderr, "%s: %s\n", argv[0], err.msg);
        goto done;
    }
    text = malloc((size_t)need + 1);
    if (!text || moex_detokenize(tok, ids, n, a.special, text, need, &err) != need) {
        fprintf(stderr, "%s: %s\n", argv[0], text ? err.msg : "out of memory");
        goto done;
    }
    rc = (fwrite(text, 1, (size_t)need, stdout) != (size_t)need || fflush(stdout)) ? 1 : 0;
done:
    free(ids);
    free(text);
    free(input);
    moex_tokenizer_free(tok);
    return rc;
}
