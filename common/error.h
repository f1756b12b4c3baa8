/* Explicit error reporting: functions that can fail take a moex_error* and
 * fill in a message that says what went wrong and, where it helps, what to do.
 * Part of the common module's API (common/common.h). */
#ifndef MOEX_ERROR_H
#define MOEX_ERROR_H

#include <stdarg.h>

typedef struct moex_error {
    char msg[512];
} moex_error;

/* Sets err->msg (printf-style) when err is not NULL; always returns -1 so
 * callers can write `return moex_fail(err, "...")`. */
int moex_fail(moex_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Says where a callee's error happened: err->msg becomes the printf-style
 * context, ": ", then the cause the callee wrote ("layer 3 attention: " +
 * "attention: head_dim 1024 exceeds ..."). No-op for NULL err; returns -1. */
int moex_error_prefix(moex_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Logging to stderr. Level from MOEX_LOG (error|warn|info|debug), default info. */
enum { MOEX_LOG_ERROR, MOEX_LOG_WARN, MOEX_LOG_INFO, MOEX_LOG_DEBUG };
void moex_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Monotonic wall clock in seconds. */
double moex_time_s(void);

#endif
