/* moex-sim argument parsing: strict numbers, ranges checked, clear errors. */
#include "sim/main.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int args_next_flag(args *a, const char **name, moex_error *err) {
    if (a->i >= a->argc) {
        *name = NULL;
        return 0;
    }
    const char *s = a->argv[a->i++];
    if (strncmp(s, "--", 2) != 0 || !s[2]) return moex_fail(err, "unexpected argument '%s' (flags start with --)", s);
    *name = s + 2;
    return 0;
}

int args_value(args *a, const char *flag, const char **out, moex_error *err) {
    if (a->i >= a->argc) return moex_fail(err, "--%s needs a value", flag);
    *out = a->argv[a->i++];
    return 0;
}

int parse_double_text(const char *s, const char *what, double lo, double hi, double *out, moex_error *err) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v)) return moex_fail(err, "%s: '%s' is not a number", what, s);
    if (v < lo || v > hi) return moex_fail(err, "%s: %g is out of range [%g, %g]", what, v, lo, hi);
    *out = v;
    return 0;
}

int parse_long_text(const char *s, const char *what, long lo, long hi, long *out, moex_error *err) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno) return moex_fail(err, "%s: '%s' is not an integer", what, s);
    if (v < lo || v > hi) return moex_fail(err, "%s: %ld is out of range [%ld, %ld]", what, v, lo, hi);
    *out = v;
    return 0;
}

int args_int(args *a, const char *flag, long lo, long hi, long *out, moex_error *err) {
    const char *v = NULL;
    char what[64];
    snprintf(what, sizeof what, "--%s", flag);
    if (args_value(a, flag, &v, err)) return -1;
    return parse_long_text(v, what, lo, hi, out, err);
}

int args_double(args *a, const char *flag, double lo, double hi, double *out, moex_error *err) {
    const char *v = NULL;
    char what[64];
    snprintf(what, sizeof what, "--%s", flag);
    if (args_value(a, flag, &v, err)) return -1;
    return parse_double_text(v, what, lo, hi, out, err);
}

/* Splits "a,b,c" into items of at most 63 characters; calls back per item. */
typedef int (*item_fn)(const char *item, int index, void *ctx, moex_error *err);

static int split_list(const char *s, const char *flag, item_fn fn, void *ctx, int *n, moex_error *err) {
    int count = 0;
    while (1) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        char item[64];
        if (len == 0 || len >= sizeof item) return moex_fail(err, "--%s: bad list item near '%s'", flag, s);
        if (count >= MOEX_SIM_MAX_LIST) return moex_fail(err, "--%s: more than %d items", flag, MOEX_SIM_MAX_LIST);
        memcpy(item, s, len);
        item[len] = 0;
        if (fn(item, count, ctx, err)) return -1;
        count++;
        if (!comma) break;
        s = comma + 1;
    }
    *n = count;
    return 0;
}

typedef struct list_ctx {
    const char *flag;
    double dlo, dhi;
    long llo, lhi;
    double *dout;
    long *lout;
} list_ctx;

static int double_item(const char *item, int i, void *p, moex_error *err) {
    list_ctx *c = p;
    char what[64];
    snprintf(what, sizeof what, "--%s", c->flag);
    return parse_double_text(item, what, c->dlo, c->dhi, &c->dout[i], err);
}

static int long_item(const char *item, int i, void *p, moex_error *err) {
    list_ctx *c = p;
    char what[64];
    snprintf(what, sizeof what, "--%s", c->flag);
    return parse_long_text(item, what, c->llo, c->lhi, &c->lout[i], err);
}

int args_int_list(args *a, const char *flag, long lo, long hi, long *out, int *n, moex_error *err) {
    const char *v = NULL;
    if (args_value(a, flag, &v, err)) return -1;
    list_ctx c = {.flag = flag, .llo = lo, .lhi = hi, .lout = out};
    return split_list(v, flag, long_item, &c, n, err);
}

int args_double_list(args *a, const char *flag, double lo, double hi, double *out, int *n, moex_error *err) {
    const char *v = NULL;
    if (args_value(a, flag, &v, err)) return -1;
    list_ctx c = {.flag = flag, .dlo = lo, .dhi = hi, .dout = out};
    return split_list(v, flag, double_item, &c, n, err);
}

int args_format(args *a, int *format, moex_error *err) {
    const char *v = NULL;
    if (args_value(a, "format", &v, err)) return -1;
    if (!strcmp(v, "csv")) *format = FORMAT_CSV;
    else if (!strcmp(v, "table")) *format = FORMAT_TABLE;
    else return moex_fail(err, "--format must be csv or table (got '%s')", v);
    return 0;
}

int sim_usage_error(const char *cmd, const moex_error *err) {
    fprintf(stderr, "moex-sim %s: %s\n(run 'moex-sim %s --help' for usage)\n", cmd, err->msg, cmd);
    return MOEX_SIM_USAGE_ERROR;
}
