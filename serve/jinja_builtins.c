/* Jinja builtins (serve/jinja_eval.h): the filters, tests, Python str/dict/list
 * methods and global functions chat templates use, each with the semantics
 * of jinja2 3.1 and Python 3 (case mapping covers ASCII, Latin-1, Greek and
 * Cyrillic). Global functions are Hugging Face's: raise_exception and
 * strftime_now beside jinja2's range, namespace and dict. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/jinja_eval.h"

/* clang-format off */
#define FILTERS(X)                                                                                          \
    X(abs) X(attr) X(capitalize) X(count) X(d) X(default) X(dictsort) X(e) X(escape) X(first) X(float)      \
    X(indent) X(int) X(items) X(join) X(last) X(length) X(list) X(lower) X(map) X(max) X(min) X(reject)    \
    X(rejectattr) X(replace) X(reverse) X(round) X(safe) X(select) X(selectattr) X(sort) X(string) X(sum)  \
    X(title) X(tojson) X(trim) X(unique) X(upper) X(wordcount) X(format) X(center) X(truncate)
#define TESTS(X)                                                                                            \
    X(boolean) X(callable) X(defined) X(divisibleby) X(eq) X(equalto) X(escaped) X(even) X(false) X(float)  \
    X(ge) X(gt) X(greaterthan) X(in) X(integer) X(iterable) X(le) X(lessthan) X(lower) X(lt) X(mapping)     \
    X(ne) X(none) X(number) X(odd) X(sameas) X(sequence) X(string) X(true) X(undefined) X(upper)
/* clang-format on */

#define AS_ENUM_F(x) F_##x,
#define AS_ENUM_T(x) T_##x,
#define AS_NAME(x) #x,
enum { FILTERS(AS_ENUM_F) F_COUNT };
enum { TESTS(AS_ENUM_T) T_COUNT };
const char *const jinja_filter_names[] = {FILTERS(AS_NAME) NULL};
const char *const jinja_test_names[] = {TESTS(AS_NAME) NULL};

int jinja_lookup_name(const char *const *names, const char *name) {
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], name) == 0) return i;
    return -1;
}

/* ---- arguments ---- */

/* The argument at position pos or named name; NULL when not given. */
static jv *arg(const jargs *A, size_t pos, const char *name) {
    if (pos < A->n) return A->v[pos];
    for (size_t k = 0; k < A->nkw; k++)
        if (strcmp(A->kwnames[k], name) == 0) return A->kw[k];
    return NULL;
}

static int arg_bool(const jargs *A, size_t pos, const char *name, int def) {
    jv *v = arg(A, pos, name);
    return v ? jv_truthy(v) : def;
}

static long long arg_int(rctx *R, const jargs *A, size_t pos, const char *name, long long def) {
    jv *v = arg(A, pos, name);
    if (!v || v->t == JV_NONE) return def;
    if (v->t == JV_INT) return v->i;
    if (v->t == JV_BOOL) return v->b;
    rfail(R, A->line, "'%s' must be an integer, not '%s'", name, jv_type_name(v));
}

static jv *arg_str(rctx *R, const jargs *A, size_t pos, const char *name) {
    jv *v = arg(A, pos, name);
    if (!v || v->t == JV_NONE) return NULL;
    if (v->t != JV_STR) rfail(R, A->line, "%s must be str, not %s", name, jv_type_name(v));
    return v;
}

/* ---- strings ---- */

static uint32_t cp_lower(uint32_t c) {
    if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
    if ((c >= 0xC0 && c <= 0xDE && c != 0xD7) || (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) || (c >= 0x410 && c <= 0x42F))
        return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    return c;
}

static uint32_t cp_upper(uint32_t c) {
    if (c < 0x80) return c >= 'a' && c <= 'z' ? c - 32 : c;
    if ((c >= 0xE0 && c <= 0xFE && c != 0xF7) || (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) || (c >= 0x430 && c <= 0x44F))
        return c - 32;
    if (c == 0x3C2) return 0x3A3;
    if (c == 0xFF) return 0x178;
    if (c == 0xB5) return 0x39C;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    return c;
}

static int cp_cased(uint32_t c) { return cp_lower(c) != c || cp_upper(c) != c; }

static void put_cp(jbuf *b, uint32_t cp) {
    char u[4];
    int len = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (len == 1)
        u[0] = (char)cp;
    else {
        for (int k = len - 1; k > 0; k--, cp >>= 6) u[k] = (char)(0x80 | (cp & 0x3F));
        u[0] = (char)((len == 2 ? 0xC0 : len == 3 ? 0xE0 : 0xF0) | cp);
    }
    jb_put(b, u, (size_t)len);
}

enum { CASE_UPPER, CASE_LOWER, CASE_TITLE_PY, CASE_CAPITALIZE, CASE_TITLE_JINJA };

/* str.upper/lower/title/capitalize, and jinja2's title filter (words start
 * after '-', whitespace or an opening bracket). Bytes that are not valid UTF-8
 * pass through unchanged. */
static jv *change_case(rctx *R, const jv *s, int mode) {
    jbuf b;
    jb_init(&b, R->a, R->max_out);
    int prev_cased = 0, first = 1, word_start = 1;
    for (size_t i = 0, adv; i < s->s.n; i += adv) {
        uint32_t cp = ju_decode(s->s.p + i, s->s.n - i, &adv);
        if (cp >= 0xDC80 && cp <= 0xDCFF) {
            jb_put(&b, s->s.p + i, adv);
            prev_cased = 0;
            continue;
        }
        uint32_t out = cp;
        switch (mode) {
        case CASE_UPPER:
            if (cp == 0xDF) {
                jb_puts(&b, "SS");
                continue;
            }
            out = cp_upper(cp);
            break;
        case CASE_LOWER: out = cp_lower(cp); break;
        case CASE_TITLE_PY: out = prev_cased ? cp_lower(cp) : cp_upper(cp); break;
        case CASE_CAPITALIZE: out = first ? cp_upper(cp) : cp_lower(cp); break;
        case CASE_TITLE_JINJA: {
            int sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || ju_is_space(cp);
            out = sep ? cp : word_start ? cp_upper(cp) : cp_lower(cp);
            word_start = sep;
            break;
        }
        }
        prev_cased = cp_cased(cp);
        first = 0;
        put_cp(&b, out);
    }
    return jv_str(R->a, b.p, b.n);
}

/* Whether cp is among the code points of chars (NULL chars: whitespace). */
static int in_chars(uint32_t cp, const jv *chars) {
    if (!chars) return ju_is_space(cp);
    for (size_t i = 0, adv; i < chars->s.n; i += adv)
        if (ju_decode(chars->s.p + i, chars->s.n - i, &adv) == cp) return 1;
    return 0;
}

static jv *strip(rctx *R, const jv *s, const jv *chars, int left, int right) {
    size_t st = 0, en = s->s.n, adv;
    if (left)
        while (st < en) {
            uint32_t cp = ju_decode(s->s.p + st, en - st, &adv);
            if (!in_chars(cp, chars)) break;
            st += adv;
        }
    if (right)
        while (en > st) {
            size_t k = en - 1;
            while (k > st && ((unsigned char)s->s.p[k] & 0xC0) == 0x80 && en - k < 4) k--;
            uint32_t cp = ju_decode(s->s.p + k, en - k, &adv);
            if (k + adv != en) { /* not one sequence: treat the last byte alone */
                k = en - 1;
                cp = 0xDC00 + (unsigned char)s->s.p[k];
            }
            if (!in_chars(cp, chars)) break;
            en = k;
        }
    return jv_str(R->a, s->s.p + st, en - st);
}

static const char *find_sub(const char *h, size_t hn, const char *nd, size_t nn) {
    if (!nn) return h;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd[0] && memcmp(h + i, nd, nn) == 0) return h + i;
    return NULL;
}

static const char *rfind_sub(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn > hn) return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (memcmp(h + i, nd, nn) == 0) return h + i;
    return NULL;
}

static size_t ws_skip(const char *s, size_t i, size_t n) {
    size_t adv;
    while (i < n && ju_is_space(ju_decode(s + i, n - i, &adv))) i += adv;
    return i;
}

static size_t nonws_skip(const char *s, size_t i, size_t n) {
    size_t adv;
    while (i < n && !ju_is_space(ju_decode(s + i, n - i, &adv))) i += adv;
    return i;
}

/* str.split(sep=None, maxsplit=-1). */
static jv *split(rctx *R, int line, const jv *s, const jv *sep, long long maxsplit) {
    jv *out = jv_list(R->a, 0);
    const char *p = s->s.p;
    size_t n = s->s.n;
    if (!sep) {
        size_t i = ws_skip(p, 0, n);
        while (i < n) {
            if (maxsplit >= 0 && (long long)out->l.n == maxsplit) {
                jv_list_push(R->a, out, jv_str(R->a, p + i, n - i));
                break;
            }
            size_t e = nonws_skip(p, i, n);
            jv_list_push(R->a, out, jv_str(R->a, p + i, e - i));
            i = ws_skip(p, e, n);
        }
        return out;
    }
    if (!sep->s.n) rfail(R, line, "empty separator");
    size_t i = 0;
    for (;;) {
        const char *hit =
            maxsplit >= 0 && (long long)out->l.n == maxsplit ? NULL : find_sub(p + i, n - i, sep->s.p, sep->s.n);
        if (!hit) {
            jv_list_push(R->a, out, jv_str(R->a, p + i, n - i));
            return out;
        }
        jv_list_push(R->a, out, jv_str(R->a, p + i, (size_t)(hit - (p + i))));
        i = (size_t)(hit - p) + sep->s.n;
    }
}

/* str.rsplit(sep=None, maxsplit=-1): pieces found from the right. */
static jv *rsplit(rctx *R, int line, const jv *s, const jv *sep, long long maxsplit) {
    if (maxsplit < 0) return split(R, line, s, sep, maxsplit);
    jv *rev = jv_list(R->a, 0);
    const char *p = s->s.p;
    size_t n = s->s.n;
    if (!sep) {
        size_t e = n;
        for (;;) {
            while (e > 0 && ju_is_space((unsigned char)p[e - 1])) e--;
            if (!e) break;
            if ((long long)rev->l.n == maxsplit) {
                jv_list_push(R->a, rev, jv_str(R->a, p, e));
                break;
            }
            size_t st = e;
            while (st > 0 && !ju_is_space((unsigned char)p[st - 1])) st--;
            jv_list_push(R->a, rev, jv_str(R->a, p + st, e - st));
            e = st;
        }
    } else {
        if (!sep->s.n) rfail(R, line, "empty separator");
        size_t e = n;
        for (;;) {
            const char *hit = (long long)rev->l.n == maxsplit ? NULL : rfind_sub(p, e, sep->s.p, sep->s.n);
            if (!hit) {
                jv_list_push(R->a, rev, jv_str(R->a, p, e));
                break;
            }
            size_t at = (size_t)(hit - p);
            jv_list_push(R->a, rev, jv_str(R->a, p + at + sep->s.n, e - at - sep->s.n));
            e = at;
        }
    }
    jv *out = jv_list(R->a, rev->l.n + 1);
    for (size_t i = rev->l.n; i-- > 0;) jv_list_push(R->a, out, rev->l.a[i]);
    return out;
}

/* Length in bytes of a line break at p (Python's str.splitlines set), 0 if none. */
static size_t line_break_len(const char *p, size_t n) {
    unsigned char c = (unsigned char)p[0];
    if (c == '\r') return n > 1 && p[1] == '\n' ? 2 : 1;
    if (c == '\n' || c == '\v' || c == '\f' || c == 0x1C || c == 0x1D || c == 0x1E) return 1;
    if (n >= 2 && c == 0xC2 && (unsigned char)p[1] == 0x85) return 2;
    if (n >= 3 && c == 0xE2 && (unsigned char)p[1] == 0x80 &&
        ((unsigned char)p[2] == 0xA8 || (unsigned char)p[2] == 0xA9))
        return 3;
    return 0;
}

static jv *splitlines(rctx *R, const char *p, size_t n, int keepends) {
    jv *out = jv_list(R->a, 0);
    size_t st = 0;
    for (size_t i = 0; i < n;) {
        size_t br = line_break_len(p + i, n - i);
        if (!br) {
            i++;
            continue;
        }
        jv_list_push(R->a, out, jv_str(R->a, p + st, i - st + (keepends ? br : 0)));
        i += br;
        st = i;
    }
    if (st < n) jv_list_push(R->a, out, jv_str(R->a, p + st, n - st));
    return out;
}

/* str.replace(old, new, count=-1); an empty old inserts between code points. */
static jv *replace(rctx *R, int line, const jv *s, const jv *old, const jv *new_, long long count) {
    jbuf b;
    jb_init(&b, R->a, R->max_out);
    b.line = line;
    size_t i = 0;
    long long done = 0;
    if (!old->s.n) {
        for (size_t adv; i <= s->s.n; i += adv) {
            if (count < 0 || done < count) {
                jb_put(&b, new_->s.p, new_->s.n);
                done++;
            }
            if (i == s->s.n) break;
            ju_decode(s->s.p + i, s->s.n - i, &adv);
            jb_put(&b, s->s.p + i, adv);
        }
        return jv_str(R->a, b.p ? b.p : "", b.n);
    }
    for (;;) {
        const char *hit = count >= 0 && done >= count ? NULL : find_sub(s->s.p + i, s->s.n - i, old->s.p, old->s.n);
        if (!hit) break;
        jb_put(&b, s->s.p + i, (size_t)(hit - s->s.p) - i);
        jb_put(&b, new_->s.p, new_->s.n);
        i = (size_t)(hit - s->s.p) + old->s.n;
        done++;
    }
    jb_put(&b, s->s.p + i, s->s.n - i);
    return jv_str(R->a, b.p ? b.p : "", b.n);
}

static int starts_or_ends(rctx *R, int line, const jv *s, const jv *what, int ends) {
    if (what->t == JV_LIST && what->tuple) {
        for (size_t i = 0; i < what->l.n; i++)
            if (starts_or_ends(R, line, s, what->l.a[i], ends)) return 1;
        return 0;
    }
    if (what->t != JV_STR)
        rfail(R, line, "%s first arg must be str or a tuple of str, not %s", ends ? "endswith" : "startswith",
              jv_type_name(what));
    if (what->s.n > s->s.n) return 0;
    return memcmp(s->s.p + (ends ? s->s.n - what->s.n : 0), what->s.p, what->s.n) == 0;
}

/* str.format with {}, {0}, {name} and {{ }}; format specs are refused. */
static jv *format(rctx *R, const jv *fmt, const jargs *A) {
    jbuf b;
    jb_init(&b, R->a, R->max_out);
    b.line = A->line;
    size_t auto_idx = 0;
    const char *p = fmt->s.p, *end = p + fmt->s.n;
    while (p < end) {
        if (*p == '{' && p + 1 < end && p[1] == '{') {
            jb_putc(&b, '{');
            p += 2;
        } else if (*p == '}' && p + 1 < end && p[1] == '}') {
            jb_putc(&b, '}');
            p += 2;
        } else if (*p == '{') {
            const char *close = memchr(p, '}', (size_t)(end - p));
            if (!close) rfail(R, A->line, "Single '{' encountered in format string");
            const char *field = p + 1;
            size_t fl = (size_t)(close - field);
            int conv_repr = 0;
            if (fl >= 2 && field[fl - 2] == '!') {
                conv_repr = field[fl - 1] == 'r';
                fl -= 2;
            }
            if (memchr(field, ':', fl)) rfail(R, A->line, "format specs are not supported");
            jv *v = NULL;
            if (!fl) {
                if (auto_idx >= A->n)
                    rfail(R, A->line, "Replacement index %zu out of range for positional args tuple", auto_idx);
                v = A->v[auto_idx++];
            } else if (isdigit((unsigned char)field[0])) {
                size_t idx = (size_t)strtoul(field, NULL, 10);
                if (idx >= A->n) rfail(R, A->line, "Replacement index %zu out of range for positional args tuple", idx);
                v = A->v[idx];
            } else {
                for (size_t k = 0; k < A->nkw && !v; k++)
                    if (strlen(A->kwnames[k]) == fl && memcmp(A->kwnames[k], field, fl) == 0) v = A->kw[k];
                if (!v) rfail(R, A->line, "'%.*s'", (int)fl, field);
            }
            if (conv_repr)
                jv_write_repr(&b, v);
            else
                jv_write_str(&b, v);
            p = close + 1;
        } else if (*p == '}') {
            rfail(R, A->line, "Single '}' encountered in format string");
        } else
            jb_putc(&b, *p++);
    }
    return jv_str(R->a, b.p ? b.p : "", b.n);
}

static jv *join_values(rctx *R, int line, jv **items, size_t n, const char *sep, size_t sepn, int strict) {
    jbuf b;
    jb_init(&b, R->a, R->max_out);
    b.line = line;
    for (size_t i = 0; i < n; i++) {
        if (i) jb_put(&b, sep, sepn);
        if (strict && items[i]->t != JV_STR)
            rfail(R, line, "sequence item %zu: expected str instance, %s found", i, jv_type_name(items[i]));
        jv_write_str(&b, items[i]);
    }
    return jv_str(R->a, b.p ? b.p : "", b.n);
}

/* Python's printf-style str % args for %s %r %d %i %f (with a precision)
 * and %%; a tuple gives several arguments, a dict named ones (%(k)s). */
jv *percent_format(rctx *R, int line, const jv *fmt, jv *args) {
    jv *one[1] = {args};
    jv **argv = one;
    size_t argc = 1, used = 0;
    int mapping = args->t == JV_DICT;
    if (args->t == JV_LIST && args->tuple) {
        argv = args->l.a;
        argc = args->l.n;
    }
    jbuf b;
    jb_init(&b, R->a, R->max_out);
    b.line = line;
    const char *p = fmt->s.p, *end = p + fmt->s.n;
    while (p < end) {
        if (*p != '%') {
            jb_putc(&b, *p++);
            continue;
        }
        if (++p >= end) rfail(R, line, "incomplete format");
        if (*p == '%') {
            jb_putc(&b, *p++);
            continue;
        }
        jv *v;
        if (*p == '(') {
            const char *close = memchr(p, ')', (size_t)(end - p));
            if (!close || !mapping) rfail(R, line, "format requires a mapping");
            v = jv_dict_get(args, jv_str(R->a, p + 1, (size_t)(close - p - 1)));
            if (!v) rfail(R, line, "'%.*s'", (int)(close - p - 1), p + 1);
            p = close + 1;
        } else {
            if (used >= argc || (mapping && argc == 1 && argv[0] == args && 0))
                rfail(R, line, "not enough arguments for format string");
            v = argv[used++];
        }
        char flags[8];
        size_t nf = 0;
        while (p < end && strchr("-+ 0#", *p) && *p && nf < sizeof flags - 1) flags[nf++] = *p++;
        flags[nf] = 0;
        int width = 0, prec = -1;
        for (; p < end && isdigit((unsigned char)*p); p++) width = width < 1000 ? width * 10 + (*p - '0') : width;
        if (p < end && *p == '.') {
            prec = 0;
            for (p++; p < end && isdigit((unsigned char)*p); p++) prec = prec < 1000 ? prec * 10 + (*p - '0') : prec;
        }
        if (p >= end) rfail(R, line, "incomplete format");
        char conv = *p++, spec[32];
        switch (conv) {
        case 's':
        case 'r': { /* width and precision count code points, as Python's do */
            jbuf t;
            jb_init(&t, R->a, R->max_out);
            if (conv == 's')
                jv_write_str(&t, v);
            else
                jv_write_repr(&t, v);
            size_t n = t.n, cps = ju_len(t.p ? t.p : "", t.n);
            if (prec >= 0 && (size_t)prec < cps) {
                n = ju_offset(t.p, t.n, (size_t)prec);
                cps = (size_t)prec;
            }
            int left = strchr(flags, '-') != NULL;
            for (size_t k = cps; !left && k < (size_t)width; k++) jb_putc(&b, ' ');
            jb_put(&b, t.p ? t.p : "", n);
            for (size_t k = cps; left && k < (size_t)width; k++) jb_putc(&b, ' ');
            break;
        }
        case 'd':
        case 'i':
        case 'x':
        case 'X':
        case 'o':
            if (!jv_is_number(v))
                rfail(R, line, "%%%c format: a real number is required, not %s", conv, jv_type_name(v));
            snprintf(spec, sizeof spec, "%%%s%d%s%s", flags, width, "ll", conv == 'i' ? "d" : (char[]){conv, 0});
            jb_printf(&b, spec, v->t == JV_FLOAT ? (long long)v->f : v->t == JV_INT ? v->i : (long long)v->b);
            break;
        case 'f':
        case 'F':
        case 'e':
        case 'E':
        case 'g':
        case 'G':
            if (!jv_is_number(v)) rfail(R, line, "must be real number, not %s", jv_type_name(v));
            snprintf(spec, sizeof spec, "%%%s%d.%d%c", flags, width, prec < 0 ? 6 : prec > 50 ? 50 : prec, conv);
            jb_printf(&b, spec, jv_num(v));
            break;
        default: rfail(R, line, "unsupported format character '%c'", conv);
        }
    }
    /* leftover arguments: an error unless the argument is a mapping-like object */
    if (used < argc &&
        !(argc == 1 && argv[0] == args &&
          (args->t == JV_DICT || args->t == JV_UNDEF || (args->t == JV_LIST && !args->tuple && !args->view))))
        rfail(R, line, "not all arguments converted during string formatting");
    return jv_str(R->a, b.p ? b.p : "", b.n);
}

/* ---- sorting (stable merge sort with Python ordering) ---- */

typedef struct sort_item {
    jv *key, *val;
} sort_item;

static void merge_sort(rctx *R, int line, sort_item *a, sort_item *tmp, size_t n, int reverse) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(R, line, a, tmp, h, reverse);
    merge_sort(R, line, a + h, tmp, n - h, reverse);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c = compare_order(R, line, "<", a[j].key, a[i].key);
        int take_right = reverse ? c > 0 : c < 0;
        tmp[k++] = take_right ? a[j++] : a[i++];
    }
    while (i < h) tmp[k++] = a[i++];
    while (j < n) tmp[k++] = a[j++];
    memcpy(a, tmp, n * sizeof *a);
}

/* The key a sort, min, max or unique compares: the item or its attribute,
 * lowercased when it is a string and the comparison ignores case. */
static jv *sort_key(rctx *R, int line, jv *item, const jv *attribute, int case_sensitive) {
    jv *k = item;
    if (attribute && attribute->t == JV_STR) {
        /* dotted attribute paths, each part through item access as jinja2's make_attrgetter does */
        const char *p = attribute->s.p, *end = p + attribute->s.n;
        while (p <= end) {
            const char *dot = memchr(p, '.', (size_t)(end - p));
            size_t len = dot ? (size_t)(dot - p) : (size_t)(end - p);
            jv *key;
            if (len && isdigit((unsigned char)p[0]))
                key = jv_int(R->a, strtoll(p, NULL, 10));
            else
                key = jv_str(R->a, p, len);
            k = get_item(R, line, k, key);
            if (!dot) break;
            p = dot + 1;
        }
    } else if (attribute && attribute->t == JV_INT)
        k = get_item(R, line, k, (jv *)attribute);
    if (!case_sensitive && k->t == JV_STR) k = change_case(R, k, CASE_LOWER);
    return k;
}

static jv *sorted(rctx *R, int line, jv **items, size_t n, int reverse, int case_sensitive, const jv *attribute) {
    sort_item *a = ja_alloc(R->a, (n + 1) * sizeof *a), *tmp = ja_alloc(R->a, (n + 1) * sizeof *tmp);
    for (size_t i = 0; i < n; i++) {
        a[i].val = items[i];
        a[i].key = sort_key(R, line, items[i], attribute, case_sensitive);
    }
    merge_sort(R, line, a, tmp, n, reverse);
    jv *out = jv_list(R->a, n + 1);
    for (size_t i = 0; i < n; i++) jv_list_push(R->a, out, a[i].val);
    return out;
}

/* ---- filters ---- */

/* (key, value) tuples of a mapping; view: what Python object holds them
 * (for the items filter a generator, which raises only when it runs). */
static jv *items_of(rctx *R, int line, const jv *x, int view) {
    jv *out = jv_list(R->a, x->t == JV_DICT ? x->d.n + 1 : 1);
    out->view = (unsigned char)view;
    if (x->t == JV_UNDEF && view != JVIEW_GEN) undef_fail(R, line, x); /* dictsort: value.items() */
    if (x->t == JV_UNDEF) return out;
    if (x->t != JV_DICT) {
        if (view != JVIEW_GEN) rfail(R, line, "Can only get item pairs from a mapping.");
        out->gen_err = "Can only get item pairs from a mapping.";
        return out;
    }
    for (size_t i = 0; i < x->d.n; i++) {
        jv *pair = jv_list(R->a, 2);
        pair->tuple = 1;
        jv_list_push(R->a, pair, x->d.k[i]);
        jv_list_push(R->a, pair, x->d.v[i]);
        jv_list_push(R->a, out, pair);
    }
    return out;
}

static jv *filter_tojson(rctx *R, jv *x, const jargs *A) {
    int ascii = arg_bool(A, 0, "ensure_ascii", 0), sort_keys = arg_bool(A, 3, "sort_keys", 0);
    jv *ind = arg(A, 1, "indent"), *seps = arg(A, 2, "separators");
    int indent = -1;
    if (ind && ind->t != JV_NONE) {
        if (ind->t == JV_INT)
            indent = (int)(ind->i < 0 ? 0 : ind->i > 64 ? 64 : ind->i);
        else
            rfail(R, A->line, "tojson: indent must be an integer");
    }
    const char *item_sep = NULL, *key_sep = NULL;
    if (seps && seps->t != JV_NONE) {
        if (seps->t != JV_LIST || seps->l.n != 2 || seps->l.a[0]->t != JV_STR || seps->l.a[1]->t != JV_STR)
            rfail(R, A->line, "tojson: separators must be a pair of strings");
        item_sep = ja_strndup(R->a, seps->l.a[0]->s.p, seps->l.a[0]->s.n);
        key_sep = ja_strndup(R->a, seps->l.a[1]->s.p, seps->l.a[1]->s.n);
    }
    jbuf b;
    jb_init(&b, R->a, R->max_out);
    b.line = A->line;
    const char *why = NULL;
    if (jv_write_json(&b, x, indent, item_sep, key_sep, sort_keys, ascii, &why)) rfail(R, A->line, "%s", why);
    return jv_str(R->a, b.p ? b.p : "", b.n);
}

/* jinja2's indent: lines after the first (and the first with first=True)
 * get the indentation; blank lines only with blank=True. */
static jv *filter_indent(rctx *R, jv *x, const jargs *A) {
    jv *w = arg(A, 0, "width");
    int first = arg_bool(A, 1, "first", 0), blank = arg_bool(A, 2, "blank", 0);
    jbuf ind;
    jb_init(&ind, R->a, 4096);
    if (w && w->t == JV_STR)
        jb_put(&ind, w->s.p, w->s.n);
    else {
        long long n = arg_int(R, A, 0, "width", 4);
        for (long long i = 0; i < n && i < 4096; i++) jb_putc(&ind, ' ');
    }
    if (x->t == JV_UNDEF) undef_fail(R, A->line, x);
    if (x->t != JV_STR) rfail(R, A->line, "unsupported operand type(s) for +=: '%s' and 'str'", jv_type_name(x));
    size_t sn;
    const char *s = to_cstr(R, x, &sn);
    jbuf src;
    jb_init(&src, R->a, R->max_out);
    jb_put(&src, s, sn);
    jb_putc(&src, '\n');
    jv *lines = splitlines(R, src.p, src.n, 0);
    jbuf b;
    jb_init(&b, R->a, R->max_out);
    b.line = A->line;
    if (first) jb_put(&b, ind.p, ind.n);
    for (size_t i = 0; i < lines->l.n; i++) {
        const jv *l = lines->l.a[i];
        if (i) {
            jb_putc(&b, '\n');
            if (blank || l->s.n) jb_put(&b, ind.p, ind.n);
        }
        jb_put(&b, l->s.p, l->s.n);
    }
    return jv_str(R->a, b.p ? b.p : "", b.n);
}

static int run_named_test(rctx *R, int line, jv *x, const jv *name, jv **extra, size_t nextra);

/* The items a lazy jinja2 filter (map, select, unique) walks. Python raises
 * only when the generator runs, so a value that cannot be iterated gives an
 * error message for the generator to raise then. guard: the filter starts
 * with "if value:" (a false value gives nothing). */
static jv **lazy_items(rctx *R, int line, jv *x, int guard, size_t *n, const char **err) {
    *n = 0;
    *err = NULL;
    if (guard && !jv_truthy(x)) return NULL;
    if (x->t == JV_LIST && x->gen_err) {
        *err = x->gen_err;
        return NULL;
    }
    if (x->t != JV_LIST && x->t != JV_DICT && x->t != JV_STR && x->t != JV_UNDEF) {
        char *msg = ja_alloc(R->a, 64);
        snprintf(msg, 64, "'%s' object is not iterable", jv_type_name(x));
        *err = msg;
        return NULL;
    }
    return iterate(R, line, x, n);
}

/* select/reject/selectattr/rejectattr: keep items whose (attribute's) test passes or fails. */
static jv *filter_select(rctx *R, jv *x, const jargs *A, int by_attr, int keep_if) {
    size_t n;
    const char *err;
    jv **items = lazy_items(R, A->line, x, 1, &n, &err);
    size_t first = by_attr ? 1 : 0;
    jv *attr = by_attr ? arg(A, 0, "attribute") : NULL;
    if (by_attr && !attr) rfail(R, A->line, "Missing parameter for attribute name");
    jv *test = A->n > first ? A->v[first] : NULL;
    jv **extra = A->n > first + 1 ? A->v + first + 1 : NULL;
    size_t nextra = A->n > first + 1 ? A->n - first - 1 : 0;
    jv *out = jv_list(R->a, n + 1);
    for (size_t i = 0; i < n; i++) {
        jv *v = by_attr ? sort_key(R, A->line, items[i], attr, 1) : items[i];
        int ok = test ? run_named_test(R, A->line, v, test, extra, nextra) : jv_truthy(v);
        if (ok == keep_if) jv_list_push(R->a, out, items[i]);
    }
    out->view = JVIEW_GEN;
    out->gen_err = err;
    return out;
}

static jv *filter_map(rctx *R, jv *x, const jargs *A) {
    size_t n;
    const char *err;
    jv **items = lazy_items(R, A->line, x, 1, &n, &err);
    jv *out = jv_list(R->a, n + 1);
    out->view = JVIEW_GEN;
    out->gen_err = err;
    jv *attr = arg(A, (size_t)-1, "attribute");
    if (attr) {
        jv *def = arg(A, (size_t)-1, "default");
        for (size_t i = 0; i < n; i++) {
            jv *v = sort_key(R, A->line, items[i], attr, 1);
            jv_list_push(R->a, out, v->t == JV_UNDEF && def ? def : v);
        }
        return out;
    }
    if (!A->n || A->v[0]->t != JV_STR) rfail(R, A->line, "map requires a filter argument");
    char *name = ja_strndup(R->a, A->v[0]->s.p, A->v[0]->s.n);
    int id = jinja_lookup_name(jinja_filter_names, name);
    if (id < 0) rfail(R, A->line, "No filter named '%s'.", name);
    jargs rest = {.line = A->line, .n = A->n - 1, .v = A->v + 1, .nkw = A->nkw, .kw = A->kw, .kwnames = A->kwnames};
    for (size_t i = 0; i < n; i++) jv_list_push(R->a, out, apply_filter(R, id, items[i], &rest));
    return out;
}

static jv *filter_unique(rctx *R, jv *x, const jargs *A) {
    size_t n;
    const char *err;
    jv **items = lazy_items(R, A->line, x, 0, &n, &err);
    int cs = arg_bool(A, 0, "case_sensitive", 0);
    jv *attr = arg(A, 1, "attribute");
    jv *out = jv_list(R->a, n + 1), *seen = jv_list(R->a, n + 1);
    for (size_t i = 0; i < n; i++) {
        jv *k = sort_key(R, A->line, items[i], attr, cs);
        if (contains(R, A->line, seen, k)) continue;
        jv_list_push(R->a, seen, k);
        jv_list_push(R->a, out, items[i]);
    }
    out->view = JVIEW_GEN;
    out->gen_err = err;
    return out;
}

static jv *filter_min_max(rctx *R, jv *x, const jargs *A, int want_max) {
    size_t n;
    jv **items = iterate(R, A->line, x, &n);
    int cs = arg_bool(A, 0, "case_sensitive", 0);
    jv *attr = arg(A, 1, "attribute");
    if (!n) return jv_undef(R->a, JU_HINT, "No aggregated item, sequence was empty.", NULL);
    jv *best = items[0], *bk = sort_key(R, A->line, best, attr, cs);
    for (size_t i = 1; i < n; i++) {
        jv *k = sort_key(R, A->line, items[i], attr, cs);
        int c = compare_order(R, A->line, want_max ? ">" : "<", k, bk);
        if (want_max ? c > 0 : c < 0) {
            best = items[i];
            bk = k;
        }
    }
    return best;
}

static jv *filter_dictsort(rctx *R, jv *x, const jargs *A) {
    int cs = arg_bool(A, 0, "case_sensitive", 0), reverse = arg_bool(A, 2, "reverse", 0);
    jv *by = arg_str(R, A, 1, "by");
    int by_value = 0;
    if (by) {
        if (by->s.n == 5 && memcmp(by->s.p, "value", 5) == 0)
            by_value = 1;
        else if (!(by->s.n == 3 && memcmp(by->s.p, "key", 3) == 0))
            rfail(R, A->line, "You can only sort by either \"key\" or \"value\"");
    }
    jv *pairs = items_of(R, A->line, x, JVIEW_NONE);
    jv *pos = jv_int(R->a, by_value);
    return sorted(R, A->line, pairs->l.a, pairs->l.n, reverse, cs, pos);
}

static jv *to_int(rctx *R, jv *x, const jargs *A) {
    jv *def = arg(A, 0, "default");
    if (x->t == JV_UNDEF) undef_fail(R, A->line, x);
    long long base = arg_int(R, A, 1, "base", 10);
    if (x->t == JV_INT) return x;
    if (x->t == JV_BOOL) return jv_int(R->a, x->b);
    if (x->t == JV_FLOAT && isfinite(x->f) && fabs(x->f) < 9.2e18) return jv_int(R->a, (long long)x->f);
    if (x->t == JV_STR) {
        char *s = ja_strndup(R->a, x->s.p, x->s.n), *end;
        while (isspace((unsigned char)*s)) s++;
        long long v = strtoll(s, &end, (int)base);
        if (end != s) {
            while (isspace((unsigned char)*end)) end++;
            if (!*end) return jv_int(R->a, v);
        }
        double d = strtod(s, &end);
        if (end != s && isfinite(d)) {
            while (isspace((unsigned char)*end)) end++;
            if (!*end) return jv_int(R->a, (long long)d);
        }
    }
    return def ? def : jv_int(R->a, 0);
}

static jv *to_float(rctx *R, jv *x, const jargs *A) {
    jv *def = arg(A, 0, "default");
    if (x->t == JV_UNDEF) undef_fail(R, A->line, x);
    if (x->t == JV_FLOAT) return x;
    if (x->t == JV_INT || x->t == JV_BOOL) return jv_float(R->a, jv_num(x));
    if (x->t == JV_STR) {
        char *s = ja_strndup(R->a, x->s.p, x->s.n), *end;
        while (isspace((unsigned char)*s)) s++;
        double d = strtod(s, &end);
        if (end != s) {
            while (isspace((unsigned char)*end)) end++;
            if (!*end) return jv_float(R->a, d);
        }
    }
    return def ? def : jv_float(R->a, 0.0);
}

jv *keep_safe(jv *result, const jv *from) {
    if (result->t == JV_STR && from->t == JV_STR) result->safe = from->safe;
    return result;
}

jv *html_escape(rctx *R, jv *x) {
    if (x->t == JV_STR && x->safe) return x;
    size_t n;
    const char *s = to_cstr(R, x, &n);
    jbuf b;
    jb_init(&b, R->a, R->max_out);
    for (size_t i = 0; i < n; i++) {
        switch (s[i]) {
        case '&': jb_puts(&b, "&amp;"); break;
        case '<': jb_puts(&b, "&lt;"); break;
        case '>': jb_puts(&b, "&gt;"); break;
        case '"': jb_puts(&b, "&#34;"); break;
        case '\'': jb_puts(&b, "&#39;"); break;
        default: jb_putc(&b, s[i]);
        }
    }
    jv *r = jv_str(R->a, b.p ? b.p : "", b.n);
    r->safe = 1;
    return r;
}

static jv *first_or_last(rctx *R, jv *x, int line, int last) {
    size_t n;
    if (last && x->t == JV_LIST && x->view == JVIEW_GEN) rfail(R, line, "'generator' object is not reversible");
    jv **items = iterate(R, line, x, &n);
    if (!n)
        return jv_undef(R->a, JU_HINT,
                        last ? "No last item, sequence was empty." : "No first item, sequence was empty.", NULL);
    return items[last ? n - 1 : 0];
}

static jv *list_of(rctx *R, int line, jv *x) {
    size_t n;
    jv **items = iterate(R, line, x, &n);
    jv *out = jv_list(R->a, n + 1);
    for (size_t i = 0; i < n; i++) jv_list_push(R->a, out, items[i]);
    return out;
}

static jv *reversed(rctx *R, int line, jv *x) {
    if (x->t == JV_STR) {
        size_t n;
        jv **cps = iterate(R, line, x, &n);
        jbuf b;
        jb_init(&b, R->a, R->max_out);
        for (size_t i = n; i-- > 0;) jb_put(&b, cps[i]->s.p, cps[i]->s.n);
        return jv_str(R->a, b.p ? b.p : "", b.n);
    }
    size_t n; /* Python's reversed(): an iterator, like a generator */
    jv **items = iterate(R, line, x, &n);
    jv *out = jv_list(R->a, n + 1);
    for (size_t i = n; i-- > 0;) jv_list_push(R->a, out, items[i]);
    out->view = JVIEW_GEN;
    return out;
}

/* Python's round(): half to even, which is what printf's rounding of a double does. */
static jv *filter_round(rctx *R, jv *x, const jargs *A) {
    long long prec = arg_int(R, A, 0, "precision", 0);
    jv *method = arg_str(R, A, 1, "method");
    if (!jv_is_number(x)) rfail(R, A->line, "type %s doesn't define __round__ method", jv_type_name(x));
    int common = !method || (method->s.n == 6 && memcmp(method->s.p, "common", 6) == 0);
    if (common && x->t != JV_FLOAT && prec >= 0)
        return jv_int(R->a, x->t == JV_INT ? x->i : x->b); /* round(int) is int */
    double v = jv_num(x), scale = pow(10.0, (double)prec), r;
    if (method && method->s.n == 5 && memcmp(method->s.p, "floor", 5) == 0)
        r = floor(v * scale) / scale;
    else if (method && method->s.n == 4 && memcmp(method->s.p, "ceil", 4) == 0)
        r = ceil(v * scale) / scale;
    else if (method && !(method->s.n == 6 && memcmp(method->s.p, "common", 6) == 0))
        rfail(R, A->line, "method must be common, ceil or floor");
    else {
        char buf[64];
        snprintf(buf, sizeof buf, "%.*f", (int)(prec < 0 ? 0 : prec > 20 ? 20 : prec), v);
        r = strtod(buf, NULL);
    }
    return jv_float(R->a, r);
}

static jv *filter_sum(rctx *R, jv *x, const jargs *A) {
    size_t n;
    jv **items = iterate(R, A->line, x, &n);
    jv *attr = arg(A, 0, "attribute"), *acc = arg(A, 1, "start");
    if (!acc) acc = jv_int(R->a, 0);
    for (size_t i = 0; i < n; i++)
        acc = binop(R, A->line, '+', acc, attr ? sort_key(R, A->line, items[i], attr, 1) : items[i]);
    return acc;
}

static jv *filter_wordcount(rctx *R, jv *x) {
    size_t n;
    const char *s = to_cstr(R, x, &n);
    long long words = 0;
    int in_word = 0;
    for (size_t i = 0, adv; i < n; i += adv) {
        uint32_t cp = ju_decode(s + i, n - i, &adv);
        int w = cp == '_' || (cp < 0x80 ? isalnum((int)cp) : !ju_is_space(cp));
        if (w && !in_word) words++;
        in_word = w;
    }
    return jv_int(R->a, words);
}

jv *apply_filter(rctx *R, int id, jv *x, const jargs *A) {
    int line = A->line;
    switch (id) {
    case F_abs:
        if (x->t == JV_INT) return jv_int(R->a, x->i < 0 ? -x->i : x->i);
        if (x->t == JV_FLOAT) return jv_float(R->a, fabs(x->f));
        if (x->t == JV_BOOL) return jv_int(R->a, x->b);
        rfail(R, line, "bad operand type for abs(): '%s'", jv_type_name(x));
    case F_attr: {
        jv *name = arg_str(R, A, 0, "name");
        if (!name) rfail(R, line, "attr requires a name");
        char *nm = ja_strndup(R->a, name->s.p, name->s.n);
        jv *m = method_lookup(R, x, nm);
        if (m) return m;
        if (x->t == JV_NS) {
            jv *v = jv_dict_gets(x, nm);
            if (v) return v;
        }
        return undef_attr(R, x, nm);
    }
    case F_capitalize: return keep_safe(change_case(R, to_str(R, x), CASE_CAPITALIZE), x);
    case F_count:
    case F_length: return jv_int(R->a, (long long)value_len(R, line, x));
    case F_d:
    case F_default: {
        jv *def = arg(A, 0, "default_value");
        int boolean = arg_bool(A, 1, "boolean", 0);
        if (x->t == JV_UNDEF || (boolean && !jv_truthy(x))) return def ? def : jv_str(R->a, "", 0);
        return x;
    }
    case F_dictsort: return filter_dictsort(R, x, A);
    case F_e:
    case F_escape: return html_escape(R, x);
    case F_first: return first_or_last(R, x, line, 0);
    case F_last: return first_or_last(R, x, line, 1);
    case F_float: return to_float(R, x, A);
    case F_indent: return filter_indent(R, x, A);
    case F_int: return to_int(R, x, A);
    case F_items: return items_of(R, line, x, JVIEW_GEN);
    case F_join: {
        jv *sep = arg(A, 0, "d"), *attr = arg(A, 1, "attribute");
        size_t n, sn = 0;
        jv **items = iterate(R, line, x, &n);
        const char *sp = sep ? to_cstr(R, sep, &sn) : "";
        if (attr) {
            jv **vals = ja_alloc(R->a, (n + 1) * sizeof *vals);
            for (size_t i = 0; i < n; i++) vals[i] = sort_key(R, line, items[i], attr, 1);
            items = vals;
        }
        return join_values(R, line, items, n, sp, sn, 0);
    }
    case F_list: return list_of(R, line, x);
    case F_lower: return keep_safe(change_case(R, to_str(R, x), CASE_LOWER), x);
    case F_upper: return keep_safe(change_case(R, to_str(R, x), CASE_UPPER), x);
    case F_title: return change_case(R, to_str(R, x), CASE_TITLE_JINJA);
    case F_map: return filter_map(R, x, A);
    case F_max: return filter_min_max(R, x, A, 1);
    case F_min: return filter_min_max(R, x, A, 0);
    case F_reject: return filter_select(R, x, A, 0, 0);
    case F_select: return filter_select(R, x, A, 0, 1);
    case F_rejectattr: return filter_select(R, x, A, 1, 0);
    case F_selectattr: return filter_select(R, x, A, 1, 1);
    case F_replace: {
        jv *s = to_str(R, x), *old = arg(A, 0, "old"), *new_ = arg(A, 1, "new");
        if (!old || !new_) rfail(R, line, "replace needs old and new");
        return replace(R, line, s, to_str(R, old), to_str(R, new_), arg_int(R, A, 2, "count", -1));
    }
    case F_reverse: return reversed(R, line, x);
    case F_round: return filter_round(R, x, A);
    case F_safe: {
        jv *s = to_str(R, x);
        if (s->safe) return s;
        s = jv_str(R->a, s->s.p, s->s.n);
        s->safe = 1;
        return s;
    }
    case F_string: return to_str(R, x);
    case F_sort: {
        size_t n;
        jv **items = iterate(R, line, x, &n);
        return sorted(R, line, items, n, arg_bool(A, 0, "reverse", 0), arg_bool(A, 1, "case_sensitive", 0),
                      arg(A, 2, "attribute"));
    }
    case F_sum: return filter_sum(R, x, A);
    case F_tojson: return filter_tojson(R, x, A);
    case F_trim: return keep_safe(strip(R, to_str(R, x), arg_str(R, A, 0, "chars"), 1, 1), x);
    case F_unique: return filter_unique(R, x, A);
    case F_wordcount: return filter_wordcount(R, x);
    case F_format: { /* "%s and %s" | format(a, b): printf-style, keyword arguments as a mapping */
        jv *args;
        if (A->nkw) {
            if (A->n) rfail(R, line, "can't handle positional and keyword arguments at the same time");
            args = jv_dict(R->a, JV_DICT);
            for (size_t k = 0; k < A->nkw; k++) jv_dict_set(R->a, args, jv_cstr(R->a, A->kwnames[k]), A->kw[k]);
        } else {
            args = jv_list(R->a, A->n + 1);
            args->tuple = 1;
            for (size_t i = 0; i < A->n; i++) jv_list_push(R->a, args, A->v[i]);
        }
        return percent_format(R, line, to_str(R, x), args);
    }
    case F_center: { /* str.center(width): extra space goes right when odd, as Python does */
        jv *s = to_str(R, x);
        long long width = arg_int(R, A, 0, "width", 80);
        size_t cps = ju_len(s->s.p, s->s.n);
        if (width <= (long long)cps) return s;
        size_t pad = (size_t)width - cps, left = pad / 2 + (pad & (size_t)width & 1);
        jbuf b;
        jb_init(&b, R->a, R->max_out);
        for (size_t k = 0; k < left; k++) jb_putc(&b, ' ');
        jb_put(&b, s->s.p, s->s.n);
        for (size_t k = left; k < pad; k++) jb_putc(&b, ' ');
        return jv_str(R->a, b.p, b.n);
    }
    case F_truncate: { /* jinja2's truncate(length=255, killwords=False, end='...', leeway=5) */
        jv *s = x, *endv = arg(A, 2, "end");
        long long length = arg_int(R, A, 0, "length", 255), leeway = arg_int(R, A, 3, "leeway", 5);
        if (x->t != JV_STR) { /* jinja2 measures the value itself: short containers come back as they are */
            if ((long long)value_len(R, line, x) <= length + leeway) return x;
            rfail(R, line, "truncate needs a string, not %s", jv_type_name(x));
        }
        int killwords = arg_bool(A, 1, "killwords", 0);
        size_t en = 3;
        const char *ep = endv ? to_cstr(R, endv, &en) : "...";
        size_t cps = ju_len(s->s.p, s->s.n), ecp = ju_len(ep, en);
        if (length < (long long)ecp) rfail(R, line, "expected length >= %zu, got %lld", ecp, length);
        if (leeway < 0) rfail(R, line, "expected leeway >= 0, got %lld", leeway);
        if ((long long)cps <= length + leeway) return s;
        size_t keep = ju_offset(s->s.p, s->s.n, (size_t)(length - (long long)ecp));
        if (!killwords) { /* drop the last partial word: the text before its last space, if any */
            size_t k = keep;
            while (k > 0 && s->s.p[k - 1] != ' ') k--;
            if (k > 0) keep = k - 1;
        }
        jbuf b;
        jb_init(&b, R->a, R->max_out);
        jb_put(&b, s->s.p, keep);
        jb_put(&b, ep, en);
        return jv_str(R->a, b.p ? b.p : "", b.n);
    }
    default: rfail(R, line, "unknown filter");
    }
}

/* ---- tests ---- */

static int is_callable(const jv *x) { return x->t == JV_FUNC || x->t == JV_MACRO; }

int apply_test(rctx *R, int id, jv *x, const jargs *A) {
    jv *other = arg(A, 0, "other");
    int line = A->line;
    switch (id) {
    case T_boolean: return x->t == JV_BOOL;
    case T_callable: return is_callable(x);
    case T_defined: return x->t != JV_UNDEF;
    case T_undefined: return x->t == JV_UNDEF;
    case T_divisibleby: {
        jv *num = arg(A, 0, "num");
        if (!num) rfail(R, line, "divisibleby needs a number");
        jv *m = binop(R, line, '%', x, num);
        return !jv_truthy(m);
    }
    case T_eq:
    case T_equalto:
    case T_sameas:
        if (!other) rfail(R, line, "test needs an argument");
        return id == T_sameas && (x->t == JV_LIST || x->t == JV_DICT) ? x == other : jv_equal(x, other);
    case T_ne: return !jv_equal(x, other ? other : jv_none(R->a));
    case T_escaped: return 0;
    case T_even:
    case T_odd: { /* value % 2 == 1, value % 2 == 0 */
        jv *m = binop(R, line, '%', x, jv_int(R->a, 2));
        return jv_equal(m, jv_int(R->a, id == T_odd ? 1 : 0));
    }
    case T_false: return x->t == JV_BOOL && !x->b;
    case T_true: return x->t == JV_BOOL && x->b;
    case T_float: return x->t == JV_FLOAT;
    case T_integer: return x->t == JV_INT;
    case T_number: return jv_is_number(x);
    case T_none: return x->t == JV_NONE;
    case T_string: return x->t == JV_STR;
    case T_mapping: return x->t == JV_DICT;
    case T_iterable: return x->t == JV_STR || x->t == JV_LIST || x->t == JV_DICT || x->t == JV_UNDEF;
    case T_sequence: /* len() and __getitem__: not generators or dict views */
        return x->t == JV_STR || (x->t == JV_LIST && !x->view) || x->t == JV_DICT || x->t == JV_UNDEF;
    case T_ge:
    case T_gt:
    case T_greaterthan:
    case T_le:
    case T_lt:
    case T_lessthan: {
        if (!other) rfail(R, line, "test needs an argument");
        static const char *const ops[] = {
            [T_ge] = ">=", [T_gt] = ">", [T_greaterthan] = ">", [T_le] = "<=", [T_lt] = "<", [T_lessthan] = "<"};
        int c = compare_order(R, line, ops[id], x, other);
        return id == T_ge ? c >= 0 : (id == T_gt || id == T_greaterthan) ? c > 0 : id == T_le ? c <= 0 : c < 0;
    }
    case T_in: {
        jv *seq = arg(A, 0, "seq");
        if (!seq) rfail(R, line, "in needs a sequence");
        return contains(R, line, seq, x);
    }
    case T_lower:
    case T_upper: { /* str(value).islower() / isupper() */
        x = to_str(R, x);
        int cased = 0;
        for (size_t i = 0, adv; i < x->s.n; i += adv) {
            uint32_t cp = ju_decode(x->s.p + i, x->s.n - i, &adv);
            if (!cp_cased(cp)) continue;
            cased = 1;
            if (id == T_lower ? cp_lower(cp) != cp : cp_upper(cp) != cp) return 0;
        }
        return cased;
    }
    default: rfail(R, line, "unknown test");
    }
}

static int run_named_test(rctx *R, int line, jv *x, const jv *name, jv **extra, size_t nextra) {
    if (name->t != JV_STR) rfail(R, line, "a test name must be a string");
    char *nm = ja_strndup(R->a, name->s.p, name->s.n);
    static const struct {
        const char *op, *test;
    } aliases[] = {{"==", "eq"}, {"!=", "ne"}, {"<", "lt"}, {"<=", "le"}, {">", "gt"}, {">=", "ge"}};
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcmp(nm, aliases[i].op) == 0) nm = (char *)aliases[i].test;
    int id = jinja_lookup_name(jinja_test_names, nm);
    if (id < 0) rfail(R, line, "No test named '%s'.", nm);
    jargs A = {.line = line, .n = nextra, .v = extra};
    return apply_test(R, id, x, &A);
}

/* ---- methods ---- */

/* clang-format off */
#define STR_METHODS(X)                                                                                      \
    X(strip) X(lstrip) X(rstrip) X(split) X(rsplit) X(startswith) X(endswith) X(upper) X(lower) X(title)    \
    X(capitalize) X(replace) X(find) X(rfind) X(count) X(format) X(splitlines) X(join) X(isdigit)          \
    X(isalpha) X(isspace) X(isalnum) X(isupper) X(islower) X(index)
/* clang-format on */
#define DICT_METHODS(X) X(get) X(items) X(keys) X(values) X(copy)
#define LIST_METHODS(X) X(count) X(index) X(copy)

#define AS_ENUM_S(x) MS_##x,
#define AS_ENUM_D(x) MD_##x,
#define AS_ENUM_L(x) ML_##x,
enum { STR_METHODS(AS_ENUM_S) MS_END };
enum { MD_BASE = 100, DICT_METHODS(AS_ENUM_D) MD_END };
enum { ML_BASE = 200, LIST_METHODS(AS_ENUM_L) ML_END };
enum { G_range = 300, G_namespace, G_raise_exception, G_strftime_now, G_dict, G_loop_cycle };
static const char *const str_methods[] = {STR_METHODS(AS_NAME) NULL};
static const char *const dict_methods[] = {DICT_METHODS(AS_NAME) NULL};
static const char *const list_methods[] = {LIST_METHODS(AS_NAME) NULL};
static const char *const globals[] = {"range", "namespace", "raise_exception", "strftime_now", "dict", NULL};

/* Methods the immutable sandbox refuses: they would change a list or dict. */
static const char *const list_unsafe[] = {"append", "clear",  "pop",    "reverse", "insert",
                                          "sort",   "extend", "remove", NULL};
static const char *const dict_unsafe[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};

static jv *func(rctx *R, int id, jv *self) {
    jv *f = jv_new(R->a, JV_FUNC);
    f->fn.id = id;
    f->fn.self = self;
    return f;
}

jv *method_lookup(rctx *R, jv *obj, const char *name) {
    if (obj->t == JV_LIST && obj->view) return NULL;
    const char *const *unsafe = obj->t == JV_LIST && !obj->tuple ? list_unsafe : obj->t == JV_DICT ? dict_unsafe : NULL;
    if (unsafe && jinja_lookup_name(unsafe, name) >= 0) {
        char *hint = ja_alloc(R->a, strlen(name) + 64);
        sprintf(hint, "access to attribute '%s' of '%s' object is unsafe.", name, jv_type_name(obj));
        return jv_undef(R->a, JU_HINT, hint, NULL);
    }
    int id = -1;
    if (obj->t == JV_STR && (id = jinja_lookup_name(str_methods, name)) >= 0) return func(R, id, obj);
    if (obj->t == JV_DICT && (id = jinja_lookup_name(dict_methods, name)) >= 0) return func(R, MD_BASE + 1 + id, obj);
    if (obj->t == JV_LIST && (id = jinja_lookup_name(list_methods, name)) >= 0) return func(R, ML_BASE + 1 + id, obj);
    return NULL;
}

jv *loop_cycle_method(rctx *R, jv *loop) { return func(R, G_loop_cycle, loop); }

jv *global_lookup(rctx *R, const char *name) {
    int id = jinja_lookup_name(globals, name);
    return id < 0 ? NULL : func(R, G_range + id, NULL);
}

static jv *call_plain_str_method(rctx *R, int id, jv *s, const jargs *A);

static jv *str_arg(rctx *R, const jargs *A, size_t pos, const char *what) {
    jv *v = arg(A, pos, what);
    if (!v) rfail(R, A->line, "%s() missing required argument", what);
    if (v->t != JV_STR) rfail(R, A->line, "must be str, not %s", jv_type_name(v));
    return v;
}

static jv *opt_str(rctx *R, const jargs *A, size_t pos) {
    jv *v = pos < A->n ? A->v[pos] : NULL;
    if (!v || v->t == JV_NONE) return NULL;
    if (v->t != JV_STR) rfail(R, A->line, "must be str or None, not %s", jv_type_name(v));
    return v;
}

static int all_cp(const jv *s, int (*pred)(uint32_t)) {
    if (!s->s.n) return 0;
    for (size_t i = 0, adv; i < s->s.n; i += adv)
        if (!pred(ju_decode(s->s.p + i, s->s.n - i, &adv))) return 0;
    return 1;
}
static int cp_digit(uint32_t c) { return c >= '0' && c <= '9'; }
static int cp_alpha(uint32_t c) {
    return c < 0x80 ? isalpha((int)c) != 0 : cp_cased(c) || (c >= 0x3040 && c <= 0x9FFF);
}
static int cp_alnum(uint32_t c) { return cp_digit(c) || cp_alpha(c); }

static long long str_find(const jv *s, const jv *sub, int from_right) {
    const char *hit =
        from_right ? rfind_sub(s->s.p, s->s.n, sub->s.p, sub->s.n) : find_sub(s->s.p, s->s.n, sub->s.p, sub->s.n);
    return hit ? (long long)ju_len(s->s.p, (size_t)(hit - s->s.p)) : -1;
}

/* Markup's methods return Markup where str's return str (and Markup.replace
 * escapes its arguments). */
static jv *call_str_method(rctx *R, int id, jv *s, const jargs *A) {
    jv *r = call_plain_str_method(R, id, s, A);
    if (!s->safe) return r;
    if (r->t == JV_STR && id != MS_find && id != MS_rfind && id != MS_index && id != MS_count) r->safe = 1;
    if (r->t == JV_LIST && (id == MS_split || id == MS_rsplit || id == MS_splitlines))
        for (size_t i = 0; i < r->l.n; i++) r->l.a[i]->safe = 1;
    return r;
}

static jv *call_plain_str_method(rctx *R, int id, jv *s, const jargs *A) {
    int line = A->line;
    switch (id) {
    case MS_strip: return strip(R, s, opt_str(R, A, 0), 1, 1);
    case MS_lstrip: return strip(R, s, opt_str(R, A, 0), 1, 0);
    case MS_rstrip: return strip(R, s, opt_str(R, A, 0), 0, 1);
    case MS_split:
    case MS_rsplit: {
        jv *sep = arg(A, 0, "sep");
        if (sep && sep->t == JV_NONE) sep = NULL;
        if (sep && sep->t != JV_STR) rfail(R, line, "must be str or None, not %s", jv_type_name(sep));
        long long maxsplit = arg_int(R, A, 1, "maxsplit", -1);
        return id == MS_split ? split(R, line, s, sep, maxsplit) : rsplit(R, line, s, sep, maxsplit);
    }
    case MS_startswith:
    case MS_endswith: {
        jv *what = arg(A, 0, "prefix");
        if (!what) rfail(R, line, "startswith/endswith takes at least 1 argument");
        return jv_bool(R->a, starts_or_ends(R, line, s, what, id == MS_endswith));
    }
    case MS_upper: return change_case(R, s, CASE_UPPER);
    case MS_lower: return change_case(R, s, CASE_LOWER);
    case MS_title: return change_case(R, s, CASE_TITLE_PY);
    case MS_capitalize: return change_case(R, s, CASE_CAPITALIZE);
    case MS_replace: {
        jv *old = str_arg(R, A, 0, "old"), *new_ = str_arg(R, A, 1, "new");
        if (s->safe) {
            old = html_escape(R, old);
            new_ = html_escape(R, new_);
        }
        return replace(R, line, s, old, new_, arg_int(R, A, 2, "count", -1));
    }
    case MS_find:
    case MS_rfind:
    case MS_index: {
        long long at = str_find(s, str_arg(R, A, 0, "sub"), id == MS_rfind);
        if (id == MS_index && at < 0) rfail(R, line, "substring not found");
        return jv_int(R->a, at);
    }
    case MS_count: {
        jv *sub = str_arg(R, A, 0, "sub");
        if (!sub->s.n) return jv_int(R->a, (long long)ju_len(s->s.p, s->s.n) + 1);
        long long c = 0;
        for (const char *p = s->s.p, *end = p + s->s.n; (p = find_sub(p, (size_t)(end - p), sub->s.p, sub->s.n));
             p += sub->s.n)
            c++;
        return jv_int(R->a, c);
    }
    case MS_format: return format(R, s, A);
    case MS_splitlines: return splitlines(R, s->s.p, s->s.n, arg_bool(A, 0, "keepends", 0));
    case MS_join: {
        if (A->n != 1) rfail(R, line, "join() takes exactly one argument");
        size_t n;
        jv **items = iterate(R, line, A->v[0], &n);
        return join_values(R, line, items, n, s->s.p, s->s.n, 1);
    }
    case MS_isdigit: return jv_bool(R->a, all_cp(s, cp_digit));
    case MS_isalpha: return jv_bool(R->a, all_cp(s, cp_alpha));
    case MS_isalnum: return jv_bool(R->a, all_cp(s, cp_alnum));
    case MS_isspace: return jv_bool(R->a, all_cp(s, (int (*)(uint32_t))ju_is_space));
    case MS_isupper:
    case MS_islower: {
        jargs none = {.line = line};
        return jv_bool(R->a, apply_test(R, id == MS_isupper ? T_upper : T_lower, s, &none));
    }
    default: rfail(R, line, "unknown method");
    }
}

static jv *call_dict_method(rctx *R, int id, jv *d, const jargs *A) {
    switch (id) {
    case MD_get: {
        jv *key = arg(A, 0, "key"), *def = arg(A, 1, "default");
        if (!key) rfail(R, A->line, "get expected at least 1 argument, got 0");
        jv *v = jv_dict_get(d, key);
        return v ? v : def ? def : jv_none(R->a);
    }
    case MD_items: return items_of(R, A->line, d, JVIEW_ITEMS);
    case MD_keys: {
        jv *out = list_of(R, A->line, d);
        out->view = JVIEW_KEYS;
        return out;
    }
    case MD_values: {
        jv *out = jv_list(R->a, d->d.n + 1);
        out->view = JVIEW_VALUES;
        for (size_t i = 0; i < d->d.n; i++) jv_list_push(R->a, out, d->d.v[i]);
        return out;
    }
    case MD_copy: {
        jv *out = jv_dict(R->a, JV_DICT);
        for (size_t i = 0; i < d->d.n; i++) jv_dict_set(R->a, out, d->d.k[i], d->d.v[i]);
        return out;
    }
    default: rfail(R, A->line, "unknown method");
    }
}

static jv *call_list_method(rctx *R, int id, jv *l, const jargs *A) {
    switch (id) {
    case ML_count:
    case ML_index: {
        jv *x = arg(A, 0, "value");
        if (!x) rfail(R, A->line, "%s() takes exactly one argument (0 given)", id == ML_count ? "count" : "index");
        long long c = 0;
        for (size_t i = 0; i < l->l.n; i++)
            if (jv_equal(l->l.a[i], x)) {
                if (id == ML_index) return jv_int(R->a, (long long)i);
                c++;
            }
        if (id == ML_index) rfail(R, A->line, "list.index(x): x not in list");
        return jv_int(R->a, c);
    }
    case ML_copy: return list_of(R, A->line, l);
    default: rfail(R, A->line, "unknown method");
    }
}

static jv *range_fn(rctx *R, const jargs *A) {
    long long start = 0, stop, step = 1;
    if (A->n == 0 || A->n > 3) rfail(R, A->line, "range expected 1 to 3 arguments, got %zu", A->n);
    for (size_t i = 0; i < A->n; i++)
        if (A->v[i]->t != JV_INT && A->v[i]->t != JV_BOOL)
            rfail(R, A->line, "'%s' object cannot be interpreted as an integer", jv_type_name(A->v[i]));
    if (A->n == 1)
        stop = arg_int(R, A, 0, "stop", 0);
    else {
        start = arg_int(R, A, 0, "start", 0);
        stop = arg_int(R, A, 1, "stop", 0);
        if (A->n == 3) step = arg_int(R, A, 2, "step", 1);
    }
    if (!step) rfail(R, A->line, "range() arg 3 must not be zero");
    /* the length in unsigned 64-bit arithmetic: exact over all of int64 (stop - start may not fit a long long) */
    const int up = step > 0;
    const unsigned long long span = up ? (unsigned long long)stop - (unsigned long long)start
                                       : (unsigned long long)start - (unsigned long long)stop,
                             ustep = up ? (unsigned long long)step : 0ull - (unsigned long long)step;
    const unsigned long long count = (up ? start < stop : start > stop) ? (span - 1) / ustep + 1 : 0;
    if (count > MAX_RANGE)
        rfail(R, A->line, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
    jv *out = jv_list(R->a, (size_t)count + 1);
    const size_t n = (size_t)count;
    long long i = start;
    for (size_t k = 0; k < n; k++) {
        jv_list_push(R->a, out, jv_int(R->a, i));
        if (k + 1 < n) i += step;   /* never past the last element: a step beyond stop may overflow */
    }
    return out;
}

/* namespace(...) and dict(...): an optional mapping, then keyword arguments. */
static jv *mapping_fn(rctx *R, const jargs *A, jtype t) {
    jv *d = jv_dict(R->a, t);
    if (A->n > 1) rfail(R, A->line, "expected at most 1 positional argument, got %zu", A->n);
    if (A->n == 1) {
        if (A->v[0]->t != JV_DICT && A->v[0]->t != JV_NS)
            rfail(R, A->line, "cannot convert %s to a mapping", jv_type_name(A->v[0]));
        for (size_t i = 0; i < A->v[0]->d.n; i++) jv_dict_set(R->a, d, A->v[0]->d.k[i], A->v[0]->d.v[i]);
    }
    for (size_t k = 0; k < A->nkw; k++) jv_dict_set(R->a, d, jv_cstr(R->a, A->kwnames[k]), A->kw[k]);
    return d;
}

static jv *strftime_fn(rctx *R, const jargs *A) {
    jv *fmt = str_arg(R, A, 0, "format");
    time_t t = (time_t)R->now;
    struct tm tm;
    gmtime_r(&t, &tm);
    char *f = ja_strndup(R->a, fmt->s.p, fmt->s.n);
    char buf[1024];
    size_t n = strftime(buf, sizeof buf, f, &tm);
    if (!n && fmt->s.n) rfail(R, A->line, "strftime_now: format too long or empty result");
    return jv_str(R->a, ja_strndup(R->a, buf, n), n);
}

jv *call_function(rctx *R, jv *f, const jargs *A) {
    int id = f->fn.id;
    if (id < MS_END) return call_str_method(R, id, f->fn.self, A);
    if (id > MD_BASE && id < MD_END) return call_dict_method(R, id, f->fn.self, A);
    if (id > ML_BASE && id < ML_END) return call_list_method(R, id, f->fn.self, A);
    switch (id) {
    case G_range: return range_fn(R, A);
    case G_namespace: return mapping_fn(R, A, JV_NS);
    case G_dict: return mapping_fn(R, A, JV_DICT);
    case G_strftime_now: return strftime_fn(R, A);
    case G_loop_cycle:
        if (!A->n) rfail(R, A->line, "no items for cycling given");
        return A->v[f->fn.self->loop.i % A->n];
    case G_raise_exception: {
        jv *msg = arg(A, 0, "message");
        size_t n = 0;
        const char *p = msg ? to_cstr(R, msg, &n) : "";
        jthrow(R->e, 0, "%.*s", (int)(n > 500 ? 500 : n), p);
    }
    default: rfail(R, A->line, "unknown function");
    }
}
