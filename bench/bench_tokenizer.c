/* Tokenizer speed: tokenizes a few MB of text (the fixture inputs repeated,
 * or a file you give) and prints MB/s for encoding and decoding.
 * usage: bench_tokenizer VOCAB.gguf [TEXT_FILE] [MB] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"

/* CPU time: the build machine is shared, so wall time alone misleads. */
static double cpu_s(void) { return (double)clock() / CLOCKS_PER_SEC; }

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s VOCAB.gguf [TEXT_FILE] [MB]\n", argv[0]);
        return 2;
    }
    char src_path[1024];
    snprintf(src_path, sizeof src_path, "%s", argc > 2 ? argv[2] : "");
    if (!src_path[0]) snprintf(src_path, sizeof src_path, "%s.inp", argv[1]);   /* "" or absent: the fixture inputs */
    double mb = argc > 3 ? atof(argv[3]) : 4.0;

    size_t src_len;
    char *src = read_file(src_path, &src_len);
    if (!src || !src_len) {
        fprintf(stderr, "cannot read %s\n", src_path);
        return 1;
    }
    size_t len = (size_t)(mb * 1024 * 1024);
    char *text = malloc(len);
    for (size_t i = 0; i < len; i++) text[i] = src[i % src_len];

    moex_error err = {{0}};
    double t0 = moex_time_s();
    moex_gguf *g = moex_gguf_open(argv[1], &err);
    moex_tokenizer *tok = g ? moex_tokenizer_load(g, &err) : NULL;
    if (g) moex_gguf_close(g);
    if (!tok) {
        fprintf(stderr, "%s: %s\n", argv[1], err.msg);
        return 1;
    }
    double t_load = moex_time_s() - t0;

    int32_t *ids = malloc(sizeof *ids * len);
    t0 = moex_time_s();
    double c0 = cpu_s();
    int64_t n = moex_tokenize(tok, text, len, false, true, ids, (int64_t)len, &err);
    double t_enc = moex_time_s() - t0, c_enc = cpu_s() - c0;
    if (n < 0) {
        fprintf(stderr, "tokenize: %s\n", err.msg);
        return 1;
    }
    char *back = malloc(len * 4 + 16);
    t0 = moex_time_s();
    int64_t m = moex_detokenize(tok, ids, n, true, back, (int64_t)len * 4 + 16, &err);
    double t_dec = moex_time_s() - t0;

    printf("%s: load %.0f ms; encode %.2f MB in %.3f s = %.2f MB/s wall, %.2f MB/s CPU (%lld tokens, %.2f bytes/token); "
           "decode %.1f MB/s%s\n",
           argv[1], t_load * 1e3, len / 1048576.0, t_enc, len / 1048576.0 / t_enc, len / 1048576.0 / c_enc, (long long)n, (double)len / n,
           m / 1048576.0 / t_dec, m == (int64_t)len && !memcmp(back, text, len) ? " (round trip exact)" : "");
    moex_tokenizer_free(tok);
    free(ids);
    free(back);
    free(text);
    free(src);
    return 0;
}
