#include "common/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int moex_fail(moex_error *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Appends s to the string in buf[cap], cutting it where buf is full. */
static void append(char *buf, size_t cap, const char *s) {
    size_t n = strlen(buf);
    while (*s && n + 1 < cap) buf[n++] = *s++;
    buf[n] = 0;
}

int moex_error_prefix(moex_error *err, const char *fmt, ...) {
    if (!err) return -1;
    char cause[sizeof err->msg];
    memcpy(cause, err->msg, sizeof cause);
    cause[sizeof cause - 1] = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    append(err->msg, sizeof err->msg, ": ");
    append(err->msg, sizeof err->msg, cause);
    return -1;
}

static int log_threshold(void) {
    const char *s = getenv("MOEX_LOG");
    if (!s) return MOEX_LOG_INFO;
    if (!strcmp(s, "error")) return MOEX_LOG_ERROR;
    if (!strcmp(s, "warn")) return MOEX_LOG_WARN;
    if (!strcmp(s, "debug")) return MOEX_LOG_DEBUG;
    return MOEX_LOG_INFO;
}

void moex_log(int level, const char *fmt, ...) {
    if (level > log_threshold()) return;
    static const char *tags[] = {"error", "warn", "info", "debug"};
    char line[8192]; /* room for a printed worker command with a long token */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[moex %s] %s\n", tags[level], line);
}

double moex_time_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
