/* A growing text buffer, and the Prometheus text exposition format (0.0.4)
 * written into it: what /metrics of the hub and of `moex-hub serve` share.
 * Part of the common module's API (common/common.h). */
#ifndef MOEX_TEXT_H
#define MOEX_TEXT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct moex_text {
    char *s;           /* NUL-terminated once anything was written; malloc'd, the caller frees it */
    size_t len, cap;
    bool oom;          /* a write failed: the text is incomplete */
} moex_text;

void moex_text_printf(moex_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s[0..n) (NUL-terminated after it). */
void moex_text_add(moex_text *t, const char *s, size_t n);
/* Room for `need` bytes in a growing byte buffer *buf of capacity *cap (doubled, from 64): 0, or -1 when out of
 * memory (the buffer unchanged). What every growing text of the project uses. */
int moex_grow_bytes(char **buf, size_t *cap, size_t need);

/* Prometheus: a label value (backslash, double quote and newline escaped);
 * a family's HELP and TYPE lines; a family of one unlabelled sample. */
void moex_prom_label(moex_text *t, const char *v);
void moex_prom_family(moex_text *t, const char *name, const char *type, const char *help);
void moex_prom_counter(moex_text *t, const char *name, const char *help, unsigned long long v);
void moex_prom_gauge(moex_text *t, const char *name, const char *help, double v);

#endif
