/* Reading a whole file in the C tests and their helper programs. Header-only. */
#ifndef MOEX_TEST_FILES_H
#define MOEX_TEST_FILES_H

#include <stdio.h>
#include <stdlib.h>

/* The bytes of path (a file or a pipe), NUL-terminated (malloc'd); *len its length when len is not NULL. NULL when
 * it cannot be read or memory runs out. */
static inline char *test_read_file(const char *path, size_t *len) {
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n < cap) continue;
        char *grown = realloc(buf, cap * 2 + 1);
        if (!grown) free(buf);
        buf = grown;
        cap *= 2;
    }
    const int failed = ferror(f);
    fclose(f);
    if (buf && failed) free(buf), buf = NULL;
    if (buf) buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

#endif
