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
    char line[2048];
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
