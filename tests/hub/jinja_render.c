/* jinja_render: renders a chat template (serve/jinja.c) with JSON contexts,
 * for tests/hub/test_templates.py, which compares the bytes with Python's
 * jinja2.
 *
 *   jinja_render [--now SECONDS] TEMPLATE CONTEXT.json
 *       prints the render; exit 1 with the error on stderr.
 *   jinja_render [--now SECONDS] --multi TEMPLATE CONTEXT.json...
 *       one record per context on stdout: "OK <n>\n" or "ERR <n>\n", then n
 *       bytes (the render or the error message) and "\n". Exit 0 unless a
 *       file cannot be read (1) or the template does not parse (2, with the
 *       error on stderr).
 *
 * Contexts render with max_out 1 MiB. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/jinja.h"
#include "tests/test_files.h"

/* Renders t with the context in path; 0 and the text, or -1 and err. */
static char *render_file(const moex_jinja *t, const char *path, long long now, size_t *len, moex_error *err) {
    size_t n;
    char *text = test_read_file(path, &n);
    if (!text) {
        snprintf(err->msg, sizeof err->msg, "cannot read %s", path);
        return NULL;
    }
    cJSON *ctx = cJSON_ParseWithLength(text, n);
    free(text);
    if (!ctx) {
        snprintf(err->msg, sizeof err->msg, "%s is not JSON", path);
        return NULL;
    }
    char *out = moex_jinja_render(t, ctx, now, (size_t)1 << 20, len, err);
    cJSON_Delete(ctx);
    return out;
}

int main(int argc, char **argv) {
    long long now = 1700000000;
    int multi = 0, i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strcmp(argv[i], "--now") == 0 && i + 1 < argc)
            now = atoll(argv[++i]);
        else if (strcmp(argv[i], "--multi") == 0)
            multi = 1;
        else
            break;
    }
    if (argc - i < 2) {
        fprintf(stderr, "usage: %s [--now SECONDS] [--multi] TEMPLATE CONTEXT.json...\n", argv[0]);
        return 1;
    }
    size_t n;
    char *src = test_read_file(argv[i], &n);
    if (!src) {
        fprintf(stderr, "cannot read %s\n", argv[i]);
        return 1;
    }
    moex_error err = {{0}};
    moex_jinja *t = moex_jinja_parse(src, n, &err);
    free(src);
    if (!t) {
        fprintf(stderr, "%s\n", err.msg);
        return multi ? 2 : 1;
    }
    int rc = 0;
    for (int k = i + 1; k < argc; k++) {
        size_t len = 0;
        char *out = render_file(t, argv[k], now, &len, &err);
        if (multi) {
            const char *body = out ? out : err.msg;
            size_t bn = out ? len : strlen(err.msg);
            printf("%s %zu\n", out ? "OK" : "ERR", bn);
            fwrite(body, 1, bn, stdout);
            putchar('\n');
        } else if (out) {
            fwrite(out, 1, len, stdout);
        } else {
            fprintf(stderr, "%s\n", err.msg);
            rc = 1;
        }
        free(out);
    }
    moex_jinja_free(t);
    return rc;
}
