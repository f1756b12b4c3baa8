/* The growing text buffer and Prometheus lines (common/text.h). */
#include "common/text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int moex_grow_bytes(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    char *grown = realloc(*buf, c);
    if (!grown) return -1;
    *buf = grown;
    *cap = c;
    return 0;
}

void moex_text_add(moex_text *t, const char *s, size_t n) {
    if (t->oom || (t->oom = moex_grow_bytes(&t->s, &t->cap, t->len + n + 1) != 0)) return;
    memcpy(t->s + t->len, s, n);
    t->len += n;
    t->s[t->len] = '\0';
}

void moex_text_printf(moex_text *t, const char *fmt, ...) {
    for (int attempt = 0; attempt < 2 && !t->oom; attempt++) {
        va_list ap;
        va_start(ap, fmt);
        const int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->oom = true;
            return;
        }
        if (t->s && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        t->oom = moex_grow_bytes(&t->s, &t->cap, t->len + (size_t)n + 1) != 0;
    }
}

void moex_prom_label(moex_text *t, const char *v) {
    for (; *v; v++) {
        if (*v == '\\') moex_text_printf(t, "\\\\");
        else if (*v == '"') moex_text_printf(t, "\\\"");
        else if (*v == '\n') moex_text_printf(t, "\\n");
        else moex_text_printf(t, "%c", *v);
    }
}

void moex_prom_family(moex_text *t, const char *name, const char *type, const char *help) {
    moex_text_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void moex_prom_counter(moex_text *t, const char *name, const char *help, unsigned long long v) {
    moex_prom_family(t, name, "counter", help);
    moex_text_printf(t, "%s %llu\n", name, v);
}

void moex_prom_gauge(moex_text *t, const char *name, const char *help, double v) {
    moex_prom_family(t, name, "gauge", help);
    moex_text_printf(t, "%s %.17g\n", name, v);
}
