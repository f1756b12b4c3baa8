/* JSON schema -> GBNF: the grammar of the JSON texts a schema allows, for
 * response_format json_schema and tool-call arguments.
 *
 * Every schema node becomes one rule (`name-N-hint`); shared pieces (any
 * value, strings, numbers, whitespace) are emitted once, on demand. The output
 * is never looser than the schema: a keyword that constrains values and is not
 * turned into grammar is an error naming it and where it is. Where the grammar
 * is stricter than the schema it is on purpose and says so below (canonical
 * spellings of const values and pattern characters, bounded whitespace and
 * number lengths, no additional properties unless the schema asks for them,
 * and then with plain keys that repeat no listed name). Regular expressions
 * ("pattern"): literals, classes, ., \d \w \s and negations, groups, |,
 * * + ? {m,n}, ^ and $ at the ends of top-level alternatives; else an error. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/text.h"
#include "serve/grammar.h"

enum {
    MAX_DEPTH = 128,        /* nesting of schemas (refs excluded: they become rules) */
    MAX_PATH = 400,
    MAX_BOUND_COUNT = 4096, /* the largest minLength/maxLength/minItems/maxItems turned into grammar */
    MAX_NAME = 100,         /* the longest `name` */
    RULE_NAME_CAP = MAX_NAME + 32, /* a shared rule's name: name-integer */
};

/* Shared rules, emitted once when some rule uses them. */
enum {
    NEED_WS = 1 << 0,
    NEED_VALUE = 1 << 1,
    NEED_STRING = 1 << 2,
    NEED_CHAR = 1 << 3,
    NEED_NUMBER = 1 << 4,
    NEED_INTEGER = 1 << 5,
    NEED_CHAR1 = 1 << 6, /* one character exactly: no \u escape of half a surrogate pair */
};

typedef struct {
    char *s;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom || (b->oom = moex_grow_bytes(&b->s, &b->cap, b->n + n + 1) != 0)) return;
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_puts(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        sb_add(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_add(b, big, (size_t)n);
    free(big);
}

/* A GBNF literal "..." matching exactly the bytes s[0..n). */
static void sb_literal(sbuf *b, const char *s, size_t n) {
    sb_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        if (c == '"') sb_puts(b, "\\\"");
        else if (c == '\\') sb_puts(b, "\\\\");
        else if (c == '\n') sb_puts(b, "\\n");
        else if (c == '\r') sb_puts(b, "\\r");
        else if (c == '\t') sb_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7F) sb_printf(b, "\\x%02X", c);
        else sb_add(b, (const char *)&c, 1);
    }
    sb_puts(b, "\"");
}

typedef struct {
    char *ref;  /* "#/$defs/X" */
    char *rule; /* its rule's name */
} ref_rule;

typedef struct {
    const char *name; /* the grammar's first rule; helpers are name-... */
    const cJSON *root;
    sbuf out;         /* the rules so far */
    unsigned need;    /* NEED_* */
    int counter;
    int depth;
    char path[MAX_PATH]; /* where we are, for errors: "properties.tags.items" */
    ref_rule *refs;
    size_t n_refs, cap_refs;
    moex_error *err;
} builder;

/* Fails with the current path: "properties.age: 'if' is not supported". */
static int fail_at(builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail_at(builder *b, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return moex_fail(b->err, "json schema %s: %s", b->path[0] ? b->path : "(root)", msg);
}

/* Appends ".seg" to the path; returns the old length for path_pop. */
static size_t path_push(builder *b, const char *seg) {
    size_t n = strlen(b->path);
    snprintf(b->path + n, sizeof b->path - n, "%s%s", n ? "." : "", seg);
    return n;
}

static void path_pop(builder *b, size_t n) { b->path[n] = 0; }

/* A fresh rule name: name-N or name-N-hint (hint reduced to [a-z0-9-]). */
static char *new_rule_name(builder *b, const char *hint) {
    char clean[24];
    size_t k = 0;
    for (const char *p = hint ? hint : ""; *p && k < sizeof clean - 1; p++) {
        char c = *p;
        if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
        if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) clean[k++] = c;
        else if (k && clean[k - 1] != '-') clean[k++] = '-';
    }
    clean[k] = 0;
    char buf[300];
    snprintf(buf, sizeof buf, "%s-%d%s%s", b->name, ++b->counter, k ? "-" : "", clean);
    return strdup(buf);
}

/* Adds "rule ::= body\n" to the output. */
static void add_rule(builder *b, const char *rule, const sbuf *body) {
    sb_printf(&b->out, "%s ::= %s\n", rule, body->s ? body->s : "\"\"");
}

/* The name of a shared rule, marking it needed. */
static const char *shared(builder *b, unsigned what, char *buf, size_t cap) {
    static const struct {
        unsigned bit;
        const char *suffix;
    } names[] = {{NEED_WS, "ws"},         {NEED_VALUE, "value"},     {NEED_STRING, "string"},
                 {NEED_CHAR, "char"},     {NEED_NUMBER, "number"},   {NEED_INTEGER, "integer"},
                 {NEED_CHAR1, "char1"}};
    b->need |= what;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].bit == what) snprintf(buf, cap, "%s-%s", b->name, names[i].suffix);
    return buf;
}

/* The shared rules. Whitespace is bounded (up to 2 blanks, then at most one
 * newline and an indentation of 20, as llama.cpp bounds it): with an unbounded
 * `ws` a model that starts emitting spaces can go on forever without ever
 * leaving the grammar, and a small model spends its tokens on it. Numbers
 * are bounded the same way (20 integer digits, 20 fraction digits, 4 exponent
 * digits). */
static void emit_shared(builder *b) {
    const char *n = b->name;
    if (b->need & NEED_VALUE) b->need |= NEED_STRING | NEED_NUMBER | NEED_WS;
    if (b->need & NEED_STRING) b->need |= NEED_CHAR;
    if (b->need & NEED_NUMBER) b->need |= NEED_INTEGER;
    if (b->need & NEED_WS) sb_printf(&b->out, "%s-ws ::= [ \\t\\r]{0,2} (\"\\n\" [ \\t]{0,20})?\n", n);
    if (b->need & NEED_VALUE) {
        sb_printf(&b->out, "%s-value ::= %s-object | %s-array | %s-string | %s-number | \"true\" | \"false\" | \"null\"\n",
                  n, n, n, n, n);
        sb_printf(&b->out,
                  "%s-object ::= \"{\" %s-ws (%s-string %s-ws \":\" %s-ws %s-value (%s-ws \",\" %s-ws %s-string %s-ws "
                  "\":\" %s-ws %s-value)* %s-ws)? \"}\"\n",
                  n, n, n, n, n, n, n, n, n, n, n, n, n);
        sb_printf(&b->out, "%s-array ::= \"[\" %s-ws (%s-value (%s-ws \",\" %s-ws %s-value)* %s-ws)? \"]\"\n", n, n, n,
                  n, n, n, n);
    }
    if (b->need & NEED_STRING) sb_printf(&b->out, "%s-string ::= \"\\\"\" %s-char* \"\\\"\"\n", n, n);
    if (b->need & NEED_CHAR1) /* as char, but \uD800-\uDFFF (halves of a character) are refused */
        sb_printf(&b->out,
                  "%s-char1 ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-CefEF] [0-9a-fA-F]{3} | "
                  "[dD] [0-7] [0-9a-fA-F]{2}))\n",
                  n);
    if (b->need & NEED_CHAR)
        sb_printf(&b->out, "%s-char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n", n);
    if (b->need & NEED_INTEGER) sb_printf(&b->out, "%s-integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,19})\n", n);
    if (b->need & NEED_NUMBER)
        sb_printf(&b->out, "%s-number ::= %s-integer (\".\" [0-9]{1,20})? ([eE] [-+]? [0-9]{1,4})?\n", n, n);
}

/* ------------------------------------------------------------------ */
/* Keywords                                                             */
/* ------------------------------------------------------------------ */

/* Keywords that say nothing about which values are valid. */
static bool is_annotation(const char *k) {
    static const char *const a[] = {"title",    "description", "examples",  "example",  "default",
                                    "$schema",  "$id",         "$comment",  "deprecated", "readOnly",
                                    "writeOnly", "$defs",      "definitions", "discriminator", "strict",
                                    "contentMediaType", "contentEncoding", "$anchor"};
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
        if (!strcmp(k, a[i])) return true;
    return false;
}

static bool is_supported(const char *k) {
    static const char *const s[] = {"type",      "enum",       "const",     "anyOf",       "oneOf",
                                    "allOf",     "$ref",       "properties", "required",    "additionalProperties",
                                    "items",     "prefixItems", "additionalItems", "minItems", "maxItems",
                                    "minLength", "maxLength",  "pattern",   "format",      "minimum",
                                    "maximum",   "exclusiveMinimum", "exclusiveMaximum", "uniqueItems", "nullable"};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
        if (!strcmp(k, s[i])) return true;
    return false;
}

/* Whether schema has a constraining keyword other than those listed (NULL-terminated). */
static const char *other_constraint(const cJSON *schema, const char *const *allowed) {
    for (const cJSON *it = schema->child; it; it = it->next) {
        if (is_annotation(it->string)) continue;
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++) ok = !strcmp(*a, it->string);
        if (!ok) return it->string;
    }
    return NULL;
}

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

/* Whether JSON value v is of JSON-schema type t. */
static bool value_has_type(const cJSON *v, const char *t) {
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) < 9e15;
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    return false;
}

static bool known_type(const char *t) {
    static const char *const t7[] = {"string", "number", "integer", "boolean", "null", "object", "array"};
    for (size_t i = 0; i < 7; i++)
        if (!strcmp(t, t7[i])) return true;
    return false;
}

/* Whether v satisfies the schema's "type" (absent: any). */
static bool value_fits_type(const cJSON *schema, const cJSON *v) {
    const cJSON *type = get(schema, "type");
    if (!type) return true;
    if (cJSON_IsString(type)) return value_has_type(v, type->valuestring);
    for (const cJSON *t = type ? type->child : NULL; t; t = t->next)
        if (cJSON_IsString(t) && value_has_type(v, t->valuestring)) return true;
    return false;
}

/* A non-negative integer keyword (minLength...): its value, -1 when absent, -2 when bad. */
static long count_keyword(builder *b, const cJSON *schema, const char *k) {
    const cJSON *v = get(schema, k);
    if (!v) return -1;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
        return fail_at(b, "'%s' must be a non-negative integer", k), -2;
    if (v->valuedouble > MAX_BOUND_COUNT) return fail_at(b, "'%s' %.0f is above %d", k, v->valuedouble, MAX_BOUND_COUNT), -2;
    return (long)v->valuedouble;
}

static char *gen(builder *b, const cJSON *schema, const char *hint);

/* gen for a sub-schema at path segment seg. */
static char *gen_at(builder *b, const cJSON *schema, const char *seg, const char *hint) {
    size_t mark = path_push(b, seg);
    char *r = gen(b, schema, hint);
    path_pop(b, mark);
    return r;
}

/* ------------------------------------------------------------------ */
/* Strings                                                              */
/* ------------------------------------------------------------------ */

/* The JSON-string spelling of the characters in code point ranges r[0..n)
 * (pairs): raw characters where JSON allows them, the canonical escape for
 * '"', '\\' and control characters. Appended as one GBNF alternation. */
static void string_chars_of_ranges(sbuf *o, const uint32_t *r, size_t n) {
    sbuf raw = {0};
    bool any_alt = false;
    sb_puts(o, "(");
    for (size_t i = 0; i < n; i++) {
        uint32_t lo = r[2 * i], hi = r[2 * i + 1];
        for (uint32_t c = lo; c <= hi && c < 0x20; c++) { /* controls: one escape each */
            const char *esc = c == '\n' ? "\\\\n" : c == '\t' ? "\\\\t" : c == '\r' ? "\\\\r" : c == 8 ? "\\\\b" : c == 12 ? "\\\\f" : NULL;
            if (any_alt) sb_puts(o, " | ");
            if (esc) sb_printf(o, "\"%s\"", esc);
            else sb_printf(o, "\"\\\\u00%02X\"", c);
            any_alt = true;
        }
        if (lo <= '"' && hi >= '"') {
            if (any_alt) sb_puts(o, " | ");
            sb_puts(o, "\"\\\\\\\"\"");
            any_alt = true;
        }
        if (lo <= '\\' && hi >= '\\') {
            if (any_alt) sb_puts(o, " | ");
            sb_puts(o, "\"\\\\\\\\\"");
            any_alt = true;
        }
        /* the raw part: [max(lo,0x20), hi] minus '"' and '\\' */
        uint32_t a = lo < 0x20 ? 0x20 : lo;
        while (a <= hi) {
            uint32_t e = hi;
            if (a <= '"' && e >= '"') e = a == '"' ? a : (uint32_t)'"' - 1;
            else if (a <= '\\' && e >= '\\') e = a == '\\' ? a : (uint32_t)'\\' - 1;
            if (a != '"' && a != '\\') sb_printf(&raw, "\\U%08X-\\U%08X", a, e);
            a = e + 1;
            if (e == 0x10FFFF) break;
        }
    }
    if (raw.n) {
        if (any_alt) sb_puts(o, " | ");
        sb_printf(o, "[%s]", raw.s);
        any_alt = true;
    }
    if (!any_alt) sb_puts(o, "[^\\x00-\\U0010FFFF]"); /* matches nothing */
    sb_puts(o, ")");
    free(raw.s);
}

/* The regular-expression subset of "pattern", translated to GBNF over the
 * JSON spelling of the string's characters. */
typedef struct {
    const char *p, *src;
    builder *b;
    sbuf *o;
    int depth;     /* groups open (the parser recurses) */
    bool saw_end;  /* the branch just read ended with '$' */
} regex;

static int rx_alt(regex *x);

static int rx_fail(regex *x, const char *what) {
    return fail_at(x->b, "pattern \"%s\": %s at offset %d (supported: literals, classes, ., groups, |, * + ? {m,n}, ^ $)",
                   x->src, what, (int)(x->p - x->src));
}

/* Adds the ranges of escape \c (d w s D W S) or a single escaped char to r. */
static int rx_escape_ranges(regex *x, uint32_t *r, size_t *n, size_t cap) {
    char c = *x->p++;
    static const uint32_t d[] = {'0', '9'}, w[] = {'0', '9', 'A', 'Z', '_', '_', 'a', 'z'}, s[] = {'\t', '\r', ' ', ' '};
    const uint32_t *set = NULL;
    size_t m = 0;
    bool neg = false;
    switch (c) {
    case 'd': set = d, m = 1; break;
    case 'w': set = w, m = 4; break;
    case 's': set = s, m = 2; break;
    case 'D': set = d, m = 1, neg = true; break;
    case 'W': set = w, m = 4, neg = true; break;
    case 'S': set = s, m = 2, neg = true; break;
    default: break;
    }
    if (set && !neg) {
        if (*n + m > cap) return rx_fail(x, "class too large");
        for (size_t i = 0; i < m; i++) r[2 * (*n + i)] = set[2 * i], r[2 * (*n + i) + 1] = set[2 * i + 1];
        *n += m;
        return 0;
    }
    if (set) { /* complement */
        uint32_t next = 0;
        for (size_t i = 0; i < m; i++) {
            if (set[2 * i] > next) {
                if (*n + 1 > cap) return rx_fail(x, "class too large");
                r[2 * *n] = next, r[2 * *n + 1] = set[2 * i] - 1, (*n)++;
            }
            next = set[2 * i + 1] + 1;
        }
        if (*n + 1 > cap) return rx_fail(x, "class too large");
        r[2 * *n] = next, r[2 * *n + 1] = 0x10FFFF, (*n)++;
        return 0;
    }
    uint32_t v;
    if (c == 'n') v = '\n';
    else if (c == 't') v = '\t';
    else if (c == 'r') v = '\r';
    else if (c && strchr(".\\/^$|?*+()[]{}-\"' ", c)) v = (uint8_t)c;
    else return x->p--, rx_fail(x, "unsupported escape");
    if (*n + 1 > cap) return rx_fail(x, "class too large");
    r[2 * *n] = r[2 * *n + 1] = v, (*n)++;
    return 0;
}

/* One character (UTF-8) of the pattern as a code point. */
static int rx_char(regex *x, uint32_t *cp) {
    const uint8_t *s = (const uint8_t *)x->p;
    int n = s[0] < 0x80 ? 1 : s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : 2;
    uint32_t v = n == 1 ? s[0] : (uint32_t)(s[0] & (0x7F >> n));
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return rx_fail(x, "invalid UTF-8");
        v = (v << 6) | (s[i] & 0x3F);
    }
    x->p += n;
    *cp = v;
    return 0;
}

static int cmp_u32pair(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorts and merges ranges; complements them when neg. Returns the new count. */
static size_t normalize_ranges(uint32_t *r, size_t n, bool neg, size_t cap) {
    qsort(r, n, 2 * sizeof(uint32_t), cmp_u32pair);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && r[2 * i] <= r[2 * m - 1] + 1) {
            if (r[2 * i + 1] > r[2 * m - 1]) r[2 * m - 1] = r[2 * i + 1];
        } else {
            r[2 * m] = r[2 * i], r[2 * m + 1] = r[2 * i + 1], m++;
        }
    }
    if (!neg) return m;
    uint32_t tmp[2 * 70];
    size_t k = 0;
    uint32_t next = 0;
    for (size_t i = 0; i < m && k < 69; i++) {
        if (r[2 * i] > next) tmp[2 * k] = next, tmp[2 * k + 1] = r[2 * i] - 1, k++;
        next = r[2 * i + 1] + 1;
    }
    if (next <= 0x10FFFF) tmp[2 * k] = next, tmp[2 * k + 1] = 0x10FFFF, k++;
    if (k > cap) k = cap;
    memcpy(r, tmp, 2 * k * sizeof(uint32_t));
    return k;
}

/* An atom: a literal character, escape, class, '.', or group. */
static int rx_atom(regex *x) {
    enum { CAP = 64 };
    uint32_t r[2 * CAP + 2];
    size_t n = 0;
    char c = *x->p;
    if (c == '(') {
        if (x->depth >= 64) return rx_fail(x, "groups nested deeper than 64");
        x->depth++;
        x->p++;
        if (x->p[0] == '?') {
            if (x->p[1] != ':') return rx_fail(x, "lookaround and named groups are not supported");
            x->p += 2;
        }
        sb_puts(x->o, "(");
        if (rx_alt(x) < 0) return -1;
        if (*x->p != ')') return rx_fail(x, "expected ')'");
        x->p++;
        x->depth--;
        sb_puts(x->o, ")");
        return 0;
    }
    if (c == '[') {
        x->p++;
        bool neg = *x->p == '^';
        if (neg) x->p++;
        bool first = true;
        while (*x->p != ']' || first) {
            first = false;
            if (!*x->p) return rx_fail(x, "unterminated class");
            uint32_t lo = 0, hi;
            if (*x->p == '\\') {
                x->p++;
                size_t before = n;
                if (rx_escape_ranges(x, r, &n, CAP) < 0) return -1;
                if (n != before + 1 || r[2 * before] != r[2 * before + 1]) continue; /* a class escape */
                lo = r[2 * before];
                n = before;
            } else if (rx_char(x, &lo) < 0) {
                return -1;
            }
            hi = lo;
            if (x->p[0] == '-' && x->p[1] && x->p[1] != ']') {
                x->p++;
                if (*x->p == '\\') {
                    x->p++;
                    size_t before = n;
                    if (rx_escape_ranges(x, r, &n, CAP) < 0) return -1;
                    if (n != before + 1 || r[2 * before] != r[2 * before + 1]) return rx_fail(x, "bad range");
                    hi = r[2 * before];
                    n = before;
                } else if (rx_char(x, &hi) < 0) {
                    return -1;
                }
                if (hi < lo) return rx_fail(x, "bad range");
            }
            if (n >= CAP) return rx_fail(x, "class too large");
            r[2 * n] = lo, r[2 * n + 1] = hi, n++;
        }
        x->p++;
        n = normalize_ranges(r, n, neg, CAP);
        string_chars_of_ranges(x->o, r, n);
        return 0;
    }
    if (c == '.') { /* any character but a newline */
        x->p++;
        r[0] = 0, r[1] = '\n' - 1, r[2] = '\n' + 1, r[3] = 0x10FFFF;
        string_chars_of_ranges(x->o, r, 2);
        return 0;
    }
    if (c == '\\') {
        x->p++;
        if (rx_escape_ranges(x, r, &n, CAP) < 0) return -1;
        string_chars_of_ranges(x->o, r, n);
        return 0;
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') return rx_fail(x, "quantifier without an atom");
    uint32_t cp = 0;
    if (rx_char(x, &cp) < 0) return -1;
    r[0] = r[1] = cp;
    string_chars_of_ranges(x->o, r, 1);
    return 0;
}

/* atom quantifier? ... up to '|', ')' or the end. */
static int rx_seq(regex *x) {
    sb_puts(x->o, "(\"\"");
    while (*x->p && *x->p != '|' && *x->p != ')') {
        if (*x->p == '$' && x->depth == 0 && (!x->p[1] || x->p[1] == '|')) { /* the end of a top-level branch */
            x->p++;
            x->saw_end = true;
            continue;
        }
        if (*x->p == '^' || *x->p == '$')
            return rx_fail(x, "anchors are supported only at the start and the end of top-level alternatives");
        sb_puts(x->o, " ");
        if (rx_atom(x) < 0) return -1;
        char q = *x->p;
        if (q == '*' || q == '+' || q == '?') {
            sb_add(x->o, &q, 1);
            x->p++;
        } else if (q == '{') {
            char *end;
            long m = strtol(x->p + 1, &end, 10), n = m;
            if (end == x->p + 1) return rx_fail(x, "bad {m,n}");
            if (*end == ',') {
                const char *s = end + 1;
                n = strtol(s, &end, 10);
                if (end == s) n = -1;
            }
            if (*end != '}' || (n >= 0 && n < m) || m > MAX_BOUND_COUNT || n > MAX_BOUND_COUNT) return rx_fail(x, "bad {m,n}");
            if (n < 0) sb_printf(x->o, "{%ld,}", m);
            else sb_printf(x->o, "{%ld,%ld}", m, n);
            x->p = end + 1;
        }
        q = *x->p;
        if (q == '*' || q == '+' || q == '?' || q == '{') return rx_fail(x, "lazy, possessive or stacked quantifiers are not supported");
    }
    sb_puts(x->o, ")");
    return 0;
}

static int rx_alt(regex *x) {
    sb_puts(x->o, "(");
    for (;;) {
        if (rx_seq(x) < 0) return -1;
        if (*x->p != '|') break;
        x->p++;
        sb_puts(x->o, " | ");
    }
    sb_puts(x->o, ")");
    return 0;
}

/* A string matching pattern: a search, so each top-level alternative not
 * anchored by ^ (at its start) or $ (at its end) may have anything there. */
static int string_pattern(builder *b, const char *pattern, sbuf *o) {
    char chr[RULE_NAME_CAP];
    const char *any = shared(b, NEED_CHAR, chr, sizeof chr);
    sbuf body = {0};
    regex x = {pattern, pattern, b, &body, 0, false};
    int rc = 0;
    for (bool first = true; rc == 0; first = false) {
        if (!first) sb_puts(&body, " | ");
        bool start = *x.p == '^';
        if (start) x.p++;
        x.saw_end = false;
        sb_printf(&body, "(%s%s", start ? "" : any, start ? "" : "* ");
        rc = rx_seq(&x);
        if (!x.saw_end) sb_printf(&body, " %s*", any);
        sb_puts(&body, ")");
        if (rc < 0 || *x.p != '|') break;
        x.p++;
    }
    if (rc == 0 && *x.p) rc = rx_fail(&x, "unbalanced ')'");
    if (rc == 0) sb_printf(o, "\"\\\"\" (%s) \"\\\"\"", body.s);
    free(body.s);
    return rc;
}

/* Strings: length bounds, format or pattern. */
static int gen_string(builder *b, const cJSON *s, sbuf *o) {
    char chr[RULE_NAME_CAP];
    long min = count_keyword(b, s, "minLength"), max = count_keyword(b, s, "maxLength");
    if (min == -2 || max == -2) return -1;
    const cJSON *format = get(s, "format"), *pattern = get(s, "pattern");
    if (pattern && (!cJSON_IsString(pattern))) return fail_at(b, "'pattern' must be a string");
    if (format && (!cJSON_IsString(format))) return fail_at(b, "'format' must be a string");
    if ((format || pattern) && (min >= 0 || max >= 0))
        return fail_at(b, "'minLength'/'maxLength' beside '%s' are not supported", format ? "format" : "pattern");
    if (format && pattern) return fail_at(b, "'pattern' beside 'format' is not supported");
    if (pattern) return string_pattern(b, pattern->valuestring, o);
    if (format) {
        static const char date[] = "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])";
        static const char time[] = "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,9})? "
                                   "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])";
        const char *f = format->valuestring;
        if (!strcmp(f, "date")) sb_printf(o, "\"\\\"\" %s \"\\\"\"", date);
        else if (!strcmp(f, "time")) sb_printf(o, "\"\\\"\" %s \"\\\"\"", time);
        else if (!strcmp(f, "date-time")) sb_printf(o, "\"\\\"\" %s \"T\" %s \"\\\"\"", date, time);
        else if (!strcmp(f, "uuid"))
            sb_puts(o, "\"\\\"\" [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
                       "[0-9a-fA-F]{12} \"\\\"\"");
        else return fail_at(b, "format '%s' is not supported (date, time, date-time, uuid are)", f);
        return 0;
    }
    /* with a length bound a character must be one: an escaped surrogate pair would count twice */
    const char *c = shared(b, min > 0 || max >= 0 ? NEED_CHAR1 : NEED_CHAR, chr, sizeof chr);
    if (min < 0) min = 0;
    if (max >= 0 && max < min) return fail_at(b, "maxLength < minLength");
    if (max < 0 && min == 0) sb_printf(o, "\"\\\"\" %s* \"\\\"\"", c);
    else if (max < 0) sb_printf(o, "\"\\\"\" %s{%ld,} \"\\\"\"", c, min);
    else sb_printf(o, "\"\\\"\" %s{%ld,%ld} \"\\\"\"", c, min, max);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Numbers                                                              */
/* ------------------------------------------------------------------ */

/* Digits of the integers in [x, y] written with the same number of digits n. */
static void same_len_range(sbuf *o, const char *x, const char *y, int n) {
    if (n == 0) {
        sb_puts(o, "\"\"");
        return;
    }
    if (x[0] == y[0]) {
        sb_printf(o, "\"%c\" ", x[0]);
        same_len_range(o, x + 1, y + 1, n - 1);
        return;
    }
    bool x_rest_zero = true, y_rest_nine = true;
    for (int i = 1; i < n; i++) x_rest_zero &= x[i] == '0', y_rest_nine &= y[i] == '9';
    char lo_d = x_rest_zero ? x[0] : (char)(x[0] + 1), hi_d = y_rest_nine ? y[0] : (char)(y[0] - 1);
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    bool first = true;
    sb_puts(o, "(");
    if (!x_rest_zero) {
        sb_printf(o, "\"%c\" ", x[0]);
        same_len_range(o, x + 1, nines, n - 1);
        first = false;
    }
    if (lo_d <= hi_d) {
        sb_printf(o, "%s[%c-%c]", first ? "" : " | ", lo_d, hi_d);
        if (n > 1) sb_printf(o, " [0-9]{%d}", n - 1);
        first = false;
    }
    if (!y_rest_nine) {
        sb_printf(o, "%s\"%c\" ", first ? "" : " | ", y[0]);
        same_len_range(o, zeros, y + 1, n - 1);
    }
    sb_puts(o, ")");
}

static int n_digits(uint64_t v) {
    int n = 1;
    while (v >= 10) v /= 10, n++;
    return n;
}

/* Decimal spellings (no leading zero) of the integers in [lo, hi]; hi UINT64_MAX: no upper bound (20 digits at most). */
static void digits_range(sbuf *o, uint64_t lo, uint64_t hi) {
    bool unbounded = hi == UINT64_MAX;
    int dl = n_digits(lo), dh = unbounded ? 20 : n_digits(hi);
    sb_puts(o, "(");
    for (int L = dl; L <= dh; L++) {
        if (L > dl) sb_puts(o, " | ");
        if (unbounded && L > dl) { /* every longer number */
            sb_printf(o, "[1-9] [0-9]{%d,19}", L - 1);
            break;
        }
        uint64_t p = 1;
        for (int i = 1; i < L; i++) p *= 10;
        uint64_t a = L == 1 ? 0 : p, bmax = L == 20 ? UINT64_MAX : p * 10 - 1;
        if (a < lo) a = lo;
        if (bmax > hi) bmax = hi;
        char xs[24], ys[24];
        snprintf(xs, sizeof xs, "%0*llu", L, (unsigned long long)a);
        snprintf(ys, sizeof ys, "%0*llu", L, (unsigned long long)bmax);
        same_len_range(o, xs, ys, L);
    }
    sb_puts(o, ")");
}

/* An inclusive integer bound from minimum/maximum and their exclusive forms
 * (draft 4 booleans or draft 6 numbers). *set false when there is none. */
static int integer_bound(builder *b, const cJSON *s, bool lower, int64_t *v, bool *set) {
    const cJSON *inc = get(s, lower ? "minimum" : "maximum"), *exc = get(s, lower ? "exclusiveMinimum" : "exclusiveMaximum");
    *set = false;
    double best = 0;
    bool have = false;
    if (inc) {
        if (!cJSON_IsNumber(inc)) return fail_at(b, "'%s' must be a number", inc->string);
        double d = lower ? ceil(inc->valuedouble) : floor(inc->valuedouble);
        if (exc && cJSON_IsTrue(exc) && d == inc->valuedouble) d += lower ? 1 : -1;
        best = d, have = true;
    }
    if (exc && cJSON_IsNumber(exc)) {
        double d = lower ? floor(exc->valuedouble) + 1 : ceil(exc->valuedouble) - 1;
        if (!have || (lower ? d > best : d < best)) best = d;
        have = true;
    } else if (exc && !cJSON_IsBool(exc)) {
        return fail_at(b, "'%s' must be a number", exc->string);
    }
    if (!have) return 0;
    if (fabs(best) > 1e18) return fail_at(b, "'%s' %.0f is too large", lower ? "minimum" : "maximum", best);
    *v = (int64_t)best;
    *set = true;
    return 0;
}

static int gen_integer(builder *b, const cJSON *s, sbuf *o) {
    int64_t lo = 0, hi = 0;
    bool has_lo, has_hi;
    if (integer_bound(b, s, true, &lo, &has_lo) < 0 || integer_bound(b, s, false, &hi, &has_hi) < 0) return -1;
    if (!has_lo && !has_hi) {
        char buf[RULE_NAME_CAP];
        sb_puts(o, shared(b, NEED_INTEGER, buf, sizeof buf));
        return 0;
    }
    if (has_lo && has_hi && hi < lo) return fail_at(b, "no integer lies between the bounds");
    bool first = true;
    sb_puts(o, "(");
    if (!has_hi || hi >= 0) { /* the non-negative part [max(lo,0), hi] */
        digits_range(o, has_lo && lo > 0 ? (uint64_t)lo : 0, has_hi ? (uint64_t)hi : UINT64_MAX);
        first = false;
    }
    if (!has_lo || lo < 0) { /* the negative part: "-" [max(1,-hi), -lo] */
        sb_printf(o, "%s\"-\" ", first ? "" : " | ");
        digits_range(o, has_hi && hi < 0 ? (uint64_t)(-hi) : 1, has_lo ? (uint64_t)(-lo) : UINT64_MAX);
    }
    sb_puts(o, ")");
    return 0;
}

/* Numbers: unbounded, or one bound at zero (Pydantic's NonNegativeFloat,
 * PositiveFloat, NonPositiveFloat, NegativeFloat): >= 0, > 0, <= 0, < 0.
 * Zero is spelled without a sign. Other bounds on numbers are refused. */
static int gen_number(builder *b, const cJSON *s, sbuf *o) {
    static const char *const keys[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    const cJSON *bound = NULL;
    int which = -1;
    for (int k = 0; k < 4; k++) {
        const cJSON *v = get(s, keys[k]);
        if (!v || cJSON_IsFalse(v)) continue;
        if (bound) return fail_at(b, "'%s' beside '%s' on a number is not supported (integers take any bounds)", keys[k], keys[which]);
        bound = v, which = k;
    }
    if (bound && cJSON_IsTrue(bound)) return fail_at(b, "'%s': true (draft 4) on a number is not supported", keys[which]);
    if (bound && (!cJSON_IsNumber(bound) || bound->valuedouble != 0))
        return fail_at(b, "'%s' on a number is supported only as 0 (integers take any bounds)", keys[which]);
    if (!bound) {
        char buf[RULE_NAME_CAP];
        sb_puts(o, shared(b, NEED_NUMBER, buf, sizeof buf));
        return 0;
    }
    static const char exp[] = "([eE] [-+]? [0-9]{1,4})?";
    /* positive: a non-zero integer part, or "0." and 1-20 digits not all zero
     * (by the place of the first non-zero one, to keep the 20-digit bound) */
    sbuf pos_buf = {0};
    sb_puts(&pos_buf, "([1-9] [0-9]{0,19} (\".\" [0-9]{1,20})? | \"0\" \".\" (");
    for (int k = 0; k < 20; k++) sb_printf(&pos_buf, "%s\"0\"{%d} [1-9] [0-9]{0,%d}", k ? " | " : "", k, 19 - k);
    sb_puts(&pos_buf, "))");
    if (pos_buf.oom) return free(pos_buf.s), fail_at(b, "out of memory");
    const char *pos = pos_buf.s;
    static const char zero[] = "\"0\" (\".\" \"0\"{1,20})?";
    if (which == 0) sb_printf(o, "(%s | %s) %s", zero, pos, exp);
    else if (which == 1) sb_printf(o, "%s %s", pos, exp);
    else if (which == 2) sb_printf(o, "(%s | \"-\" %s) %s", zero, pos, exp);
    else sb_printf(o, "\"-\" %s %s", pos, exp);
    free(pos_buf.s);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Arrays and objects                                                   */
/* ------------------------------------------------------------------ */

static int gen_array(builder *b, const cJSON *s, sbuf *o) {
    char ws[RULE_NAME_CAP];
    shared(b, NEED_WS, ws, sizeof ws);
    const cJSON *items = get(s, "items"), *prefix = get(s, "prefixItems"), *extra = get(s, "additionalItems");
    const cJSON *unique = get(s, "uniqueItems");
    if (unique && !cJSON_IsFalse(unique)) return fail_at(b, "'uniqueItems' is not supported");
    if (cJSON_IsArray(items)) { /* draft 4: items as a list is prefixItems, additionalItems the rest */
        if (prefix) return fail_at(b, "'items' as a list beside 'prefixItems'");
        prefix = items;
        items = extra;
    } else if (extra) {
        return fail_at(b, "'additionalItems' needs 'items' as a list");
    }
    if (prefix && !cJSON_IsArray(prefix)) return fail_at(b, "'prefixItems' must be a list");
    long min = count_keyword(b, s, "minItems"), max = count_keyword(b, s, "maxItems");
    if (min == -2 || max == -2) return -1;
    if (min < 0) min = 0;
    int k = prefix ? cJSON_GetArraySize(prefix) : 0;
    if (items && cJSON_IsFalse(items) && (max < 0 || max > k)) max = k;
    if (max >= 0 && max < min) return fail_at(b, "maxItems < minItems");
    char **el = calloc((size_t)k + 2, sizeof(char *));
    if (!el) return fail_at(b, "out of memory");
    int rc = 0;
    for (int i = 0; i < k && rc == 0 && (max < 0 || i < max); i++) {
        char seg[32];
        snprintf(seg, sizeof seg, "prefixItems.%d", i);
        el[i] = gen_at(b, cJSON_GetArrayItem(prefix, i), seg, "item");
        if (!el[i]) rc = -1;
    }
    bool rest = (max < 0 || max > k) && !(items && cJSON_IsFalse(items));
    if (rc == 0 && rest) {
        el[k] = gen_at(b, items && !cJSON_IsTrue(items) ? items : NULL, "items", "item");
        if (!el[k]) rc = -1;
    }
    if (rc == 0) {
        /* element i (0-based) is el[i] for i < k, el[k] beyond; the first has no comma before it.
         * Nested optionals close at the end: ( e0 ( sep e1 ( sep e2 ... )? )? )? */
        int fixed = max >= 0 && max < k ? (int)max : k;
        int opened = 0;
        sb_printf(o, "\"[\" %s ", ws);
        for (int i = 0; i < fixed; i++) {
            if (i >= min) sb_puts(o, "("), opened++;
            if (i) sb_printf(o, "%s \",\" %s ", ws, ws);
            sb_printf(o, "%s ", el[i]);
        }
        if (rest) {
            long need = min > k ? min - k : 0, more = max < 0 ? -1 : max - k;
            if (k == 0) { /* first element has no comma */
                if (need == 0) sb_puts(o, "("), opened++;
                sb_printf(o, "%s ", el[k]);
                need = need ? need - 1 : 0;
                more = more < 0 ? -1 : more - 1;
            }
            if (more < 0) sb_printf(o, "(%s \",\" %s %s){%ld,} ", ws, ws, el[k], need);
            else if (more > 0) sb_printf(o, "(%s \",\" %s %s){%ld,%ld} ", ws, ws, el[k], need, more);
        }
        /* the blank before ']': inside the outermost group when it holds everything (min 0) */
        for (int i = 0; i < opened; i++) sb_printf(o, "%s)? ", i == opened - 1 && min == 0 ? ws : "");
        if ((fixed || rest) && !(opened && min == 0)) sb_printf(o, "%s ", ws);
        sb_puts(o, "\"]\"");
    }
    for (int i = 0; i <= k; i++) free(el[i]);
    free(el);
    return rc;
}

typedef struct {
    const char *key;
    const cJSON *schema;
    bool required;
    char *kv; /* rule: "key" ws ":" ws value */
} prop;

static bool is_required(const cJSON *required, const char *key) {
    for (const cJSON *r = required ? required->child : NULL; r; r = r->next)
        if (cJSON_IsString(r) && !strcmp(r->valuestring, key)) return true;
    return false;
}

/* A rule for `"key" ws ":" ws value`. */
static char *key_value_rule(builder *b, const char *key, const char *key_rule, const char *value_rule) {
    char ws[RULE_NAME_CAP];
    shared(b, NEED_WS, ws, sizeof ws);
    char *rule = new_rule_name(b, key ? key : "kv");
    if (!rule) return NULL;
    sbuf body = {0};
    if (key) {
        cJSON *k = cJSON_CreateString(key);
        char *quoted = k ? cJSON_PrintUnformatted(k) : NULL;
        cJSON_Delete(k);
        if (!quoted) {
            free(rule);
            return NULL;
        }
        sb_literal(&body, quoted, strlen(quoted));
        cJSON_free(quoted);
    } else {
        sb_puts(&body, key_rule);
    }
    sb_printf(&body, " %s \":\" %s %s", ws, ws, value_rule);
    add_rule(b, rule, &body);
    free(body.s);
    return rule;
}

/* A trie of the listed property names, by code point, for other_key_rule. */
typedef struct {
    uint32_t cp;    /* the character into this node */
    int32_t child;  /* first child, -1 none */
    int32_t next;   /* next sibling, -1 none */
    bool name_ends; /* a listed name ends here */
} key_node;

/* Adds the name (UTF-8) to the trie in nodes[0..*n) (node 0: the root). */
static int key_trie_add(key_node **nodes, size_t *n, size_t *cap, const char *name) {
    int32_t at = 0;
    for (const uint8_t *p = (const uint8_t *)name; *p;) {
        uint32_t cp = *p, len = 1;
        if (*p >= 0xF0) cp = *p & 7, len = 4;
        else if (*p >= 0xE0) cp = *p & 15, len = 3;
        else if (*p >= 0xC0) cp = *p & 31, len = 2;
        for (uint32_t i = 1; i < len && p[i]; i++) cp = (cp << 6) | (p[i] & 0x3F);
        for (uint32_t i = 0; i < len && *p; i++) p++;
        int32_t c = (*nodes)[at].child;
        while (c >= 0 && (*nodes)[c].cp != cp) c = (*nodes)[c].next;
        if (c < 0) {
            if (*n == *cap) {
                size_t nc = *cap ? *cap * 2 : 64;
                key_node *q = realloc(*nodes, nc * sizeof *q);
                if (!q) return -1;
                *nodes = q;
                *cap = nc;
            }
            c = (int32_t)(*n)++;
            (*nodes)[c] = (key_node){cp, -1, (*nodes)[at].child, false};
            (*nodes)[at].child = c;
        }
        at = c;
    }
    (*nodes)[at].name_ends = true;
    return 0;
}

/* A rule for the key of an additional property: a JSON string spelled
 * without escapes that is none of the listed names (a listed name again
 * would be a duplicate key, whose last value wins in most parsers and would
 * escape its schema). One rule per trie node of the names: end here (unless
 * a name ends here), go on along a name, or leave the names for any rest. */
static char *other_key_rule(builder *b, const prop *ps, int n) {
    key_node *nodes = malloc(64 * sizeof *nodes);
    size_t n_nodes = 1, cap = 64;
    if (!nodes) return fail_at(b, "out of memory"), NULL;
    nodes[0] = (key_node){0, -1, -1, false};
    for (int i = 0; i < n; i++) {
        bool plain = true; /* a name that needs escapes cannot be spelled without: no need to exclude it */
        for (const uint8_t *p = (const uint8_t *)ps[i].key; *p && plain; p++) plain = *p >= 0x20 && *p != '"' && *p != '\\';
        if (plain && key_trie_add(&nodes, &n_nodes, &cap, ps[i].key) < 0) {
            free(nodes);
            return fail_at(b, "out of memory"), NULL;
        }
    }
    char *first = NULL, *tail = new_rule_name(b, "key-tail");
    char **names = calloc(n_nodes, sizeof(char *));
    bool ok = tail && names;
    for (size_t k = 0; ok && k < n_nodes; k++) ok = (names[k] = new_rule_name(b, "key")) != NULL;
    if (ok) { /* the tail: any plain characters, then the closing quote */
        sbuf t = {0};
        sb_puts(&t, "[^\"\\\\\\x00-\\x1F]* \"\\\"\"");
        add_rule(b, tail, &t);
        free(t.s);
    }
    for (size_t k = 0; ok && k < n_nodes; k++) {
        sbuf r = {0};
        bool alt = false;
        if (!nodes[k].name_ends) sb_puts(&r, "\"\\\"\""), alt = true;
        sb_printf(&r, "%s[^\"\\\\\\x00-\\x1F", alt ? " | " : "");
        for (int32_t c = nodes[k].child; c >= 0; c = nodes[c].next) sb_printf(&r, "\\U%08X", nodes[c].cp);
        sb_printf(&r, "] %s", tail);
        for (int32_t c = nodes[k].child; c >= 0; c = nodes[c].next)
            sb_printf(&r, " | [\\U%08X] %s", nodes[c].cp, names[c]);
        add_rule(b, names[k], &r);
        free(r.s);
    }
    if (ok) {
        sbuf r = {0};
        first = new_rule_name(b, "other-key");
        sb_printf(&r, "\"\\\"\" %s", names[0]);
        if (first) add_rule(b, first, &r);
        free(r.s);
    }
    for (size_t k = 0; names && k < n_nodes; k++) free(names[k]);
    free(names);
    free(tail);
    free(nodes);
    if (!first) fail_at(b, "out of memory");
    return first;
}

/* Objects: the listed properties in the schema's order (required ones always,
 * optional ones when present), then additional ones when the schema allows
 * them. With "something was already written" the rest is a linear chain:
 *   rest(i) = ("," kv_i)? rest(i+1)      (required: "," kv_i rest(i+1))
 * and with nothing written yet:
 *   first(i) = kv_i rest(i+1) | first(i+1)   (required: kv_i rest(i+1))
 * An absent additionalProperties allows none when properties are listed (the
 * schema's own default is "any": the grammar is stricter on purpose, what a
 * model should write), and any when none are ({"type": "object"}). */
static int gen_object(builder *b, const cJSON *s, sbuf *o) {
    char ws[RULE_NAME_CAP];
    shared(b, NEED_WS, ws, sizeof ws);
    const cJSON *props = get(s, "properties"), *required = get(s, "required"), *addl = get(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail_at(b, "'properties' must be an object");
    if (required && !cJSON_IsArray(required)) return fail_at(b, "'required' must be a list");
    int n = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) n++;
    for (const cJSON *r = required ? required->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r)) return fail_at(b, "'required' must list strings");
        if (props && get(props, r->valuestring)) continue;
        if (cJSON_IsFalse(addl))   /* the key must be there and may not be: nothing satisfies the schema */
            return fail_at(b, "'required' names '%.60s', which 'properties' does not list while "
                              "'additionalProperties' is false: no object satisfies the schema", r->valuestring);
        n++;
    }
    prop *ps = calloc((size_t)n + 1, sizeof(prop));
    char **rest = calloc((size_t)n + 2, sizeof(char *)), **first = calloc((size_t)n + 2, sizeof(char *));
    char *extra_kv = NULL, *extra_value = NULL;
    int rc = -1;
    if (!ps || !rest || !first) {
        fail_at(b, "out of memory");
        goto out;
    }
    int k = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) ps[k++] = (prop){p->string, p, is_required(required, p->string), NULL};
    for (const cJSON *r = required ? required->child : NULL; r; r = r->next)
        if (!props || !get(props, r->valuestring)) ps[k++] = (prop){r->valuestring, NULL, true, NULL};
    for (int i = 0; i < n; i++) {
        char seg[MAX_PATH];
        snprintf(seg, sizeof seg, "properties.%s", ps[i].key);
        char *value = gen_at(b, ps[i].schema, seg, ps[i].key);
        if (!value) goto out;
        ps[i].kv = key_value_rule(b, ps[i].key, NULL, value);
        free(value);
        if (!ps[i].kv) goto out;
    }
    /* absent additionalProperties: none beside listed properties, any when none is listed ({"type": "object"}) */
    bool extras = addl ? !cJSON_IsFalse(addl) : !props && !required;
    if (addl && !cJSON_IsBool(addl) && !cJSON_IsObject(addl)) {
        fail_at(b, "'additionalProperties' must be a boolean or a schema");
        goto out;
    }
    if (extras) {
        extra_value = gen_at(b, !addl || cJSON_IsTrue(addl) ? NULL : addl, "additionalProperties", "extra");
        char *key_rule = extra_value ? other_key_rule(b, ps, n) : NULL;
        if (!key_rule || !(extra_kv = key_value_rule(b, NULL, key_rule, extra_value))) {
            free(key_rule);
            goto out;
        }
        free(key_rule);
    }
    /* rest(n), first(n): the additional properties (or nothing) */
    for (int i = n; i >= 0; i--) {
        sbuf rb = {0}, fb = {0};
        rest[i] = new_rule_name(b, "rest");
        first[i] = new_rule_name(b, "first");
        if (!rest[i] || !first[i]) goto out;
        if (i == n) {
            if (extras) {
                sb_printf(&rb, "(%s \",\" %s %s)*", ws, ws, extra_kv);
                sb_printf(&fb, "%s %s | \"\"", extra_kv, rest[i]);
            } else {
                sb_puts(&rb, "\"\"");
                sb_puts(&fb, "\"\"");
            }
        } else if (ps[i].required) {
            sb_printf(&rb, "%s \",\" %s %s %s", ws, ws, ps[i].kv, rest[i + 1]);
            sb_printf(&fb, "%s %s", ps[i].kv, rest[i + 1]);
        } else {
            sb_printf(&rb, "(%s \",\" %s %s)? %s", ws, ws, ps[i].kv, rest[i + 1]);
            sb_printf(&fb, "%s %s | %s", ps[i].kv, rest[i + 1], first[i + 1]);
        }
        add_rule(b, rest[i], &rb);
        add_rule(b, first[i], &fb);
        free(rb.s);
        free(fb.s);
    }
    sb_printf(o, "\"{\" %s %s %s \"}\"", ws, first[0], ws);
    rc = 0;
out:
    for (int i = 0; ps && i < n; i++) free(ps[i].kv);
    for (int i = 0; rest && first && i <= n; i++) free(rest[i]), free(first[i]);
    free(ps);
    free(rest);
    free(first);
    free(extra_kv);
    free(extra_value);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Combinators, references, enums                                       */
/* ------------------------------------------------------------------ */

/* The schema a local reference points to ("#", "#/$defs/X", any JSON pointer into the root). */
static const cJSON *resolve_ref(builder *b, const char *ref) {
    if (ref[0] != '#') return fail_at(b, "$ref '%s': only local references (#/...) are supported", ref), NULL;
    const cJSON *at = b->root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char seg[256];
        size_t n = 0;
        for (; *p && *p != '/'; p++) {
            char c = *p;
            if (c == '~' && p[1] == '1') c = '/', p++;
            else if (c == '~' && p[1] == '0') c = '~', p++;
            if (n + 1 < sizeof seg) seg[n++] = c;
        }
        seg[n] = 0;
        at = cJSON_IsArray(at) ? cJSON_GetArrayItem(at, atoi(seg)) : get(at, seg);
        if (!at) return fail_at(b, "$ref '%s' points to nothing", ref), NULL;
    }
    if (*p) return fail_at(b, "$ref '%s' is not a JSON pointer", ref), NULL;
    return at;
}

/* The rule of a reference; made once, so recursive schemas become recursive rules. */
static char *gen_ref(builder *b, const char *ref) {
    for (size_t i = 0; i < b->n_refs; i++)
        if (!strcmp(b->refs[i].ref, ref)) return strdup(b->refs[i].rule);
    const cJSON *target = resolve_ref(b, ref);
    if (!target) return NULL;
    const char *slash = strrchr(ref, '/');
    char *rule = new_rule_name(b, slash ? slash + 1 : "root");
    if (!rule) return NULL;
    if (b->n_refs == b->cap_refs) {
        size_t cap = b->cap_refs ? b->cap_refs * 2 : 8;
        ref_rule *q = realloc(b->refs, cap * sizeof *q);
        if (!q) return free(rule), fail_at(b, "out of memory"), NULL;
        b->refs = q;
        b->cap_refs = cap;
    }
    b->refs[b->n_refs++] = (ref_rule){strdup(ref), strdup(rule)};
    /* the body goes through a fresh path and depth: a ref is a new root */
    char saved[MAX_PATH];
    memcpy(saved, b->path, sizeof saved);
    int depth = b->depth;
    snprintf(b->path, sizeof b->path, "%s", ref);
    b->depth = 0;
    char *body = gen(b, target, slash ? slash + 1 : "root");
    memcpy(b->path, saved, sizeof saved);
    b->depth = depth;
    if (!body) return free(rule), NULL;
    sbuf rb = {0};
    sb_puts(&rb, body);
    add_rule(b, rule, &rb);
    free(rb.s);
    free(body);
    return rule;
}

/* Alternatives: anyOf / oneOf (oneOf's "exactly one" is not checked: as alternatives). */
static int gen_alternatives(builder *b, const cJSON *list, const char *key, sbuf *o) {
    if (!cJSON_IsArray(list) || !list->child) return fail_at(b, "'%s' must be a non-empty list", key);
    int i = 0;
    for (const cJSON *sub = list->child; sub; sub = sub->next, i++) {
        char seg[40];
        snprintf(seg, sizeof seg, "%s.%d", key, i);
        char *r = gen_at(b, sub, seg, key);
        if (!r) return -1;
        sb_printf(o, "%s%s", i ? " | " : "", r);
        free(r);
    }
    return 0;
}

/* allOf of object schemas (and the schema's own object keywords) merged into
 * one: properties in order, required united, additionalProperties false when
 * any says false. Anything else in allOf is an error. */
static char *gen_all_of(builder *b, const cJSON *s, const char *hint) {
    const cJSON *all = get(s, "allOf");
    if (!cJSON_IsArray(all) || !all->child) return fail_at(b, "'allOf' must be a non-empty list"), NULL;
    static const char *const object_keys[] = {"type", "properties", "required", "additionalProperties", "allOf", NULL};
    const char *other = other_constraint(s, object_keys);
    if (!all->child->next && !other && !get(s, "properties") && !get(s, "required") && !get(s, "type"))
        return gen_at(b, all->child, "allOf.0", hint); /* a lone wrapper (Pydantic v1's description on a ref) */
    if (other) return fail_at(b, "'%s' beside 'allOf' is not supported", other), NULL;
    cJSON *merged = cJSON_CreateObject(), *props = cJSON_CreateObject(), *req = cJSON_CreateArray();
    if (!merged || !props || !req) {
        cJSON_Delete(merged), cJSON_Delete(props), cJSON_Delete(req);
        return fail_at(b, "out of memory"), NULL;
    }
    cJSON_AddItemToObject(merged, "properties", props);
    cJSON_AddItemToObject(merged, "required", req);
    cJSON_AddStringToObject(merged, "type", "object");
    bool closed = false, open = false;
    const cJSON *parts[64];
    int n = 0;
    parts[n++] = s;
    for (const cJSON *sub = all->child; sub; sub = sub->next) {
        if (n == 64) return cJSON_Delete(merged), fail_at(b, "'allOf' with more than 63 schemas"), NULL;
        const cJSON *t = sub;
        for (int hops = 0; cJSON_IsObject(t) && get(t, "$ref") && !other_constraint(t, (const char *const[]){"$ref", NULL});
             hops++) {
            const cJSON *ref = get(t, "$ref");
            if (!cJSON_IsString(ref) || hops == 32)
                return cJSON_Delete(merged), fail_at(b, "allOf.%d: a bad or circular '$ref'", n - 1), NULL;
            t = resolve_ref(b, ref->valuestring);
            if (!t) return cJSON_Delete(merged), NULL;
        }
        parts[n++] = t;
    }
    for (int i = 0; i < n; i++) {
        const cJSON *t = parts[i];
        if (!cJSON_IsObject(t)) return cJSON_Delete(merged), fail_at(b, "allOf.%d: only object schemas merge", i - 1), NULL;
        const char *bad = other_constraint(t, object_keys);
        const cJSON *type = get(t, "type");
        if (bad || (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "object"))) || (i && get(t, "allOf")))
            return cJSON_Delete(merged), fail_at(b, "allOf.%d: only object schemas (properties, required) merge", i - 1), NULL;
        if ((get(t, "properties") && !cJSON_IsObject(get(t, "properties"))) || (get(t, "required") && !cJSON_IsArray(get(t, "required"))))
            return cJSON_Delete(merged), fail_at(b, "allOf.%d: 'properties' must be an object, 'required' a list", i - 1), NULL;
        for (const cJSON *p = get(t, "properties") ? get(t, "properties")->child : NULL; p; p = p->next) {
            if (get(props, p->string))
                return cJSON_Delete(merged), fail_at(b, "allOf: property '%s' appears twice", p->string), NULL;
            cJSON_AddItemToObject(props, p->string, cJSON_Duplicate(p, true));
        }
        for (const cJSON *r = get(t, "required") ? get(t, "required")->child : NULL; r; r = r->next)
            if (cJSON_IsString(r) && !is_required(req, r->valuestring)) cJSON_AddItemToArray(req, cJSON_CreateString(r->valuestring));
        const cJSON *a = get(t, "additionalProperties");
        if (a && cJSON_IsFalse(a)) closed = true;
        else if (a && cJSON_IsTrue(a)) open = true;
        else if (a) return cJSON_Delete(merged), fail_at(b, "allOf: an 'additionalProperties' schema does not merge"), NULL;
    }
    /* additionalProperties false anywhere wins; true only when none says false */
    if (closed || !open) cJSON_AddFalseToObject(merged, "additionalProperties");
    else cJSON_AddTrueToObject(merged, "additionalProperties");
    size_t mark = path_push(b, "allOf");
    char *r = gen(b, merged, hint);
    path_pop(b, mark);
    cJSON_Delete(merged);
    return r;
}

/* enum / const: the canonical (compact) JSON spelling of each value that fits "type". */
static int gen_enum(builder *b, const cJSON *s, sbuf *o) {
    static const char *const allowed[] = {"enum", "const", "type", NULL};
    const char *other = other_constraint(s, allowed);
    if (other) return fail_at(b, "'%s' beside 'enum'/'const' is not supported", other);
    const cJSON *c = get(s, "const"), *e = get(s, "enum");
    if (e && !cJSON_IsArray(e)) return fail_at(b, "'enum' must be a list");
    if (c && e) return fail_at(b, "'const' beside 'enum' is not supported");
    int n = 0;
    for (const cJSON *v = c ? c : e->child; v; v = c ? NULL : v->next) {
        if (!value_fits_type(s, v)) continue;
        char *text = cJSON_PrintUnformatted(v);
        if (!text) return fail_at(b, "out of memory");
        sb_printf(o, "%s", n++ ? " | " : "");
        sb_literal(o, text, strlen(text));
        cJSON_free(text);
    }
    if (!n) return fail_at(b, "no value of '%s' fits its type", c ? "const" : "enum");
    return 0;
}

/* The keywords each type uses (besides "type" and annotations). */
static int gen_typed(builder *b, const cJSON *s, const char *t, sbuf *o) {
    if (!strcmp(t, "string")) return gen_string(b, s, o);
    if (!strcmp(t, "integer")) return gen_integer(b, s, o);
    if (!strcmp(t, "number")) return gen_number(b, s, o);
    if (!strcmp(t, "boolean")) return sb_puts(o, "(\"true\" | \"false\")"), 0;
    if (!strcmp(t, "null")) return sb_puts(o, "\"null\""), 0;
    if (!strcmp(t, "object")) return gen_object(b, s, o);
    if (!strcmp(t, "array")) return gen_array(b, s, o);
    return fail_at(b, "type '%s' is not a JSON schema type", t);
}

/* The type a schema without "type" means from its keywords (NULL: any value). */
static const char *implied_type(const cJSON *s) {
    static const struct {
        const char *key, *type;
    } k[] = {{"properties", "object"}, {"required", "object"}, {"additionalProperties", "object"},
             {"items", "array"},       {"prefixItems", "array"}, {"minItems", "array"},
             {"maxItems", "array"},    {"minLength", "string"},  {"maxLength", "string"},
             {"pattern", "string"},    {"format", "string"},     {"minimum", "number"},
             {"maximum", "number"},    {"exclusiveMinimum", "number"}, {"exclusiveMaximum", "number"}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (get(s, k[i].key)) return k[i].type;
    return NULL;
}

/* The body of the rule for schema s (its alternatives), into o. */
static int gen_body(builder *b, const cJSON *s, const char *hint, sbuf *o) {
    char buf[RULE_NAME_CAP];
    if (!s || cJSON_IsTrue(s) || (cJSON_IsObject(s) && !s->child)) {
        sb_puts(o, shared(b, NEED_VALUE, buf, sizeof buf));
        return 0;
    }
    if (cJSON_IsFalse(s)) return fail_at(b, "the schema false allows no value");
    if (!cJSON_IsObject(s)) return fail_at(b, "a schema must be an object or a boolean");
    for (const cJSON *it = s->child; it; it = it->next)
        if (!is_annotation(it->string) && !is_supported(it->string)) return fail_at(b, "'%s' is not supported", it->string);
    const cJSON *nullable = get(s, "nullable");
    if (nullable && cJSON_IsTrue(nullable)) { /* OpenAPI's nullable: the schema or null */
        cJSON *copy = cJSON_Duplicate(s, true);
        if (!copy) return fail_at(b, "out of memory");
        cJSON_DeleteItemFromObjectCaseSensitive(copy, "nullable");
        char *r = gen(b, copy, hint);
        cJSON_Delete(copy);
        if (!r) return -1;
        sb_printf(o, "%s | \"null\"", r);
        free(r);
        return 0;
    }
    const cJSON *ref = get(s, "$ref");
    if (ref) {
        const char *other = other_constraint(s, (const char *const[]){"$ref", "nullable", NULL});
        if (other) return fail_at(b, "'%s' beside '$ref' is not supported (use allOf)", other);
        if (!cJSON_IsString(ref)) return fail_at(b, "'$ref' must be a string");
        char *r = gen_ref(b, ref->valuestring);
        if (!r) return -1;
        sb_puts(o, r);
        free(r);
        return 0;
    }
    if (get(s, "allOf")) {
        char *r = gen_all_of(b, s, hint);
        if (!r) return -1;
        sb_puts(o, r);
        free(r);
        return 0;
    }
    const char *alt = get(s, "anyOf") ? "anyOf" : get(s, "oneOf") ? "oneOf" : NULL;
    if (alt) {
        const char *other = other_constraint(s, (const char *const[]){alt, "nullable", NULL});
        if (other) return fail_at(b, "'%s' beside '%s' is not supported", other, alt);
        return gen_alternatives(b, get(s, alt), alt, o);
    }
    if (get(s, "enum") || get(s, "const")) return gen_enum(b, s, o);
    const cJSON *type = get(s, "type");
    if (!type) {
        const char *t = implied_type(s);
        if (!t) return sb_puts(o, shared(b, NEED_VALUE, buf, sizeof buf)), 0;
        return gen_typed(b, s, t, o);
    }
    if (cJSON_IsString(type)) {
        if (!known_type(type->valuestring)) return fail_at(b, "type '%s' is not a JSON schema type", type->valuestring);
        return gen_typed(b, s, type->valuestring, o);
    }
    if (!cJSON_IsArray(type) || !type->child) return fail_at(b, "'type' must be a string or a non-empty list");
    int i = 0;
    for (const cJSON *t = type->child; t; t = t->next, i++) {
        if (!cJSON_IsString(t) || !known_type(t->valuestring)) return fail_at(b, "'type' lists an unknown type");
        if (i) sb_puts(o, " | ");
        sb_puts(o, "(");
        if (gen_typed(b, s, t->valuestring, o) < 0) return -1;
        sb_puts(o, ")");
    }
    return 0;
}

/* A rule for schema s; its name (malloc'd), or NULL with err. */
static char *gen(builder *b, const cJSON *s, const char *hint) {
    if (++b->depth > MAX_DEPTH) {
        b->depth--;
        return fail_at(b, "schema nested deeper than %d", MAX_DEPTH), NULL;
    }
    sbuf body = {0};
    char *rule = NULL;
    if (gen_body(b, s, hint, &body) == 0) {
        if (body.oom) {
            fail_at(b, "out of memory");
        } else if ((rule = new_rule_name(b, hint))) {
            add_rule(b, rule, &body);
        }
    }
    free(body.s);
    b->depth--;
    return rule;
}

static bool valid_rule_name(const char *n) {
    if (!*n) return false;
    for (; *n; n++)
        if (!((*n >= 'a' && *n <= 'z') || (*n >= 'A' && *n <= 'Z') || (*n >= '0' && *n <= '9') || *n == '-' || *n == '_'))
            return false;
    return true;
}

char *serve_json_schema_gbnf(const cJSON *schema, const char *name, moex_error *err) {
    if (!name) name = "root";
    if (!valid_rule_name(name) || strlen(name) > MAX_NAME)
        return moex_fail(err, "json schema: rule name '%.100s' must be 1-%d letters, digits, '-' or '_'", name, MAX_NAME), NULL;
    builder b = {.name = name, .root = schema, .err = err};
    char ws[RULE_NAME_CAP];
    shared(&b, NEED_WS, ws, sizeof ws);
    char *top = gen(&b, schema, "");
    char *result = NULL;
    if (top) {
        sbuf out = {0};
        sb_printf(&out, "%s ::= %s %s %s\n", name, ws, top, ws);
        emit_shared(&b);
        sb_add(&out, b.out.s ? b.out.s : "", b.out.n);
        if (out.oom || b.out.oom) {
            moex_fail(err, "json schema: out of memory");
            free(out.s);
        } else {
            result = out.s;
        }
    }
    free(top);
    free(b.out.s);
    for (size_t i = 0; i < b.n_refs; i++) free(b.refs[i].ref), free(b.refs[i].rule);
    free(b.refs);
    return result;
}
