/* Jinja values (serve/jinja_impl.h): the arena they live in, conversion from
 * cJSON, Python truthiness and equality, and printing exactly as Python does
 * (str, repr, float repr, json.dumps) so renders match jinja2 byte for byte. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/jinja_impl.h"

/* ---- failure ---- */

_Noreturn void jthrow(jerr *e, int line, const char *fmt, ...) {
    char msg[sizeof e->err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0)
        moex_fail(e->err, "line %d: %s", line, msg);
    else
        moex_fail(e->err, "%s", msg);
    longjmp(e->jb, 1);
}

/* ---- arena: 64 KiB blocks (bigger requests get their own), a total limit ---- */

struct jblk {
    jblk *next;
    size_t used, cap;
    _Alignas(max_align_t) char data[];
};

void *ja_alloc(jarena *a, size_t n) {
    if (n > a->limit) jthrow(a->fail, 0, "template needs more than %zu MiB of memory", a->limit >> 20);
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->total + cap > a->limit) jthrow(a->fail, 0, "template needs more than %zu MiB of memory", a->limit >> 20);
        jblk *b = malloc(sizeof *b + cap);
        if (!b) jthrow(a->fail, 0, "out of memory");
        b->cap = cap;
        b->used = 0;
        a->total += cap;
        if (a->head && n > 65536) { /* keep filling the current block */
            b->next = a->head->next;
            a->head->next = b;
            b->used = n;
            memset(b->data, 0, n);
            return b->data;
        }
        b->next = a->head;
        a->head = b;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}

void ja_free_all(jarena *a) {
    for (jblk *b = a->head, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    a->head = NULL;
    a->total = 0;
}

char *ja_strndup(jarena *a, const char *s, size_t n) {
    char *p = ja_alloc(a, n + 1);
    if (n) memcpy(p, s, n);
    return p;
}

/* ---- buffers ---- */

void jb_init(jbuf *b, jarena *a, size_t cap) {
    memset(b, 0, sizeof *b);
    b->a = a;
    b->cap = cap;
}

void jb_put(jbuf *b, const char *s, size_t n) {
    if (!n) return;
    if (n > b->cap - b->n) jthrow(b->a->fail, b->line, "output exceeds %zu bytes", b->cap);
    if (b->n + n + 1 > b->cap_alloc) {
        size_t want = b->cap_alloc ? b->cap_alloc * 2 : 256;
        while (want < b->n + n + 1) want *= 2;
        char *p = ja_alloc(b->a, want);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p;
        b->cap_alloc = want;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jb_puts(jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }
void jb_putc(jbuf *b, char c) { jb_put(b, &c, 1); }

void jb_printf(jbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    jb_put(b, tmp, n < 0 ? 0 : (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* ---- constructors ---- */

jv *jv_new(jarena *a, jtype t) {
    jv *v = ja_alloc(a, sizeof *v);
    v->t = t;
    return v;
}

jv *jv_str(jarena *a, const char *p, size_t n) {
    jv *v = jv_new(a, JV_STR);
    v->s.p = p ? p : "";
    v->s.n = n;
    return v;
}

jv *jv_cstr(jarena *a, const char *s) { return jv_str(a, s, strlen(s)); }

jv *jv_int(jarena *a, long long i) {
    int small = i >= JA_SMALL_INT_MIN && i < JA_SMALL_INT_MAX;
    if (small && a->small_int[i - JA_SMALL_INT_MIN]) return a->small_int[i - JA_SMALL_INT_MIN];
    jv *v = jv_new(a, JV_INT);
    v->i = i;
    if (small) a->small_int[i - JA_SMALL_INT_MIN] = v;
    return v;
}

jv *jv_float(jarena *a, double f) {
    jv *v = jv_new(a, JV_FLOAT);
    v->f = f;
    return v;
}

jv *jv_bool(jarena *a, int b) {
    b = !!b;
    if (!a->bools[b]) {
        a->bools[b] = jv_new(a, JV_BOOL);
        a->bools[b]->b = b;
    }
    return a->bools[b];
}

jv *jv_none(jarena *a) {
    if (!a->none) a->none = jv_new(a, JV_NONE);
    return a->none;
}

jv *jv_undef(jarena *a, int kind, const char *name, const char *objtype) {
    jv *v = jv_new(a, JV_UNDEF);
    v->u.kind = kind;
    v->u.name = name;
    v->u.objtype = objtype;
    return v;
}

jv *jv_list(jarena *a, size_t cap) {
    jv *v = jv_new(a, JV_LIST);
    v->l.cap = cap ? cap : 4;
    v->l.a = ja_alloc(a, v->l.cap * sizeof(jv *));
    return v;
}

void jv_list_push(jarena *a, jv *l, jv *x) {
    if (l->l.n == l->l.cap) {
        size_t cap = l->l.cap ? l->l.cap * 2 : 4;
        jv **p = ja_alloc(a, cap * sizeof(jv *));
        if (l->l.n) memcpy(p, l->l.a, l->l.n * sizeof(jv *));
        l->l.a = p;
        l->l.cap = cap;
    }
    l->l.a[l->l.n++] = x;
}

jv *jv_dict(jarena *a, jtype t) { return jv_new(a, t); }

jv *jv_dict_get(const jv *d, const jv *key) {
    for (size_t i = 0; i < d->d.n; i++)
        if (jv_equal(d->d.k[i], key)) return d->d.v[i];
    return NULL;
}

jv *jv_dict_gets(const jv *d, const char *key) {
    size_t n = strlen(key);
    for (size_t i = 0; i < d->d.n; i++) {
        const jv *k = d->d.k[i];
        if (k->t == JV_STR && k->s.n == n && memcmp(k->s.p, key, n) == 0) return d->d.v[i];
    }
    return NULL;
}

/* Appends key: val without looking for key first (the caller knows it is new). */
static void dict_append(jarena *a, jv *d, jv *key, jv *val) {
    if (d->d.n == d->d.cap) {
        size_t cap = d->d.cap ? d->d.cap * 2 : 4;
        jv **k = ja_alloc(a, cap * sizeof(jv *)), **v = ja_alloc(a, cap * sizeof(jv *));
        if (d->d.n) {
            memcpy(k, d->d.k, d->d.n * sizeof(jv *));
            memcpy(v, d->d.v, d->d.n * sizeof(jv *));
        }
        d->d.k = k;
        d->d.v = v;
        d->d.cap = cap;
    }
    d->d.k[d->d.n] = key;
    d->d.v[d->d.n++] = val;
}

void jv_dict_set(jarena *a, jv *d, jv *key, jv *val) {
    for (size_t i = 0; i < d->d.n; i++)
        if (jv_equal(d->d.k[i], key)) {
            d->d.v[i] = val;
            return;
        }
    dict_append(a, d, key, val);
}

/* JSON numbers: integral values that a double holds exactly become ints (as
 * Python's json.loads would for "3"); cJSON cannot tell "3.0" from "3". */
jv *jv_from_cjson(jarena *a, const cJSON *j, int depth) {
    if (depth > 512) jthrow(a->fail, 0, "context nests deeper than 512 levels");
    if (cJSON_IsString(j)) return jv_cstr(a, j->valuestring ? j->valuestring : "");
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (isfinite(d) && d == floor(d) && fabs(d) < 9007199254740992.0) return jv_int(a, (long long)d);
        return jv_float(a, d);
    }
    if (cJSON_IsBool(j)) return jv_bool(a, cJSON_IsTrue(j));
    if (cJSON_IsArray(j)) {
        jv *l = jv_list(a, (size_t)cJSON_GetArraySize(j));
        for (const cJSON *c = j->child; c; c = c->next) jv_list_push(a, l, jv_from_cjson(a, c, depth + 1));
        return l;
    }
    if (cJSON_IsObject(j)) {   /* appended, not searched: a request's object with 60k keys stays linear. A key
                                  written twice stays twice (found first where Python's json.loads keeps the last) */
        jv *d = jv_dict(a, JV_DICT);
        for (const cJSON *c = j->child; c; c = c->next)
            dict_append(a, d, jv_cstr(a, c->string ? c->string : ""), jv_from_cjson(a, c, depth + 1));
        return d;
    }
    return jv_none(a);
}

/* ---- Python semantics ---- */

int jv_truthy(const jv *v) {
    switch (v->t) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL: return v->b;
    case JV_INT: return v->i != 0;
    case JV_FLOAT: return v->f != 0;
    case JV_STR: return v->s.n != 0;
    case JV_LIST: return v->view == JVIEW_GEN || v->l.n != 0;
    case JV_DICT: return v->d.n != 0;
    default: return 1;
    }
}

int jv_is_number(const jv *v) { return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL; }

double jv_num(const jv *v) {
    return v->t == JV_FLOAT ? v->f : v->t == JV_INT ? (double)v->i : v->t == JV_BOOL ? v->b : 0;
}

/* Containers nest at most this deep where printing or comparing recurses
 * (a template can build deeper ones: {% set ns.x = [ns.x] %} in a loop). */
enum { MAX_VALUE_DEPTH = 512 };

static int equal_at(const jv *x, const jv *y, int depth);

int jv_equal(const jv *x, const jv *y) { return equal_at(x, y, 0); }

/* Python's ==; containers nested past MAX_VALUE_DEPTH compare unequal (Python
 * would raise RecursionError). */
static int equal_at(const jv *x, const jv *y, int depth) {
    if (depth > MAX_VALUE_DEPTH) return 0;
    /* one object equals itself, as Python's containers take it for their items: without this, values that share
     * parts (l = l + [l], sixty times) compare in exponential time */
    if (x == y && x->t != JV_FLOAT) return 1;
    if (jv_is_number(x) && jv_is_number(y)) {
        if (x->t != JV_FLOAT && y->t != JV_FLOAT) {
            long long a = x->t == JV_INT ? x->i : x->b, b = y->t == JV_INT ? y->i : y->b;
            return a == b;
        }
        return jv_num(x) == jv_num(y);
    }
    if (x->t != y->t) return 0;
    switch (x->t) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return x->s.n == y->s.n && memcmp(x->s.p, y->s.p, x->s.n) == 0;
    case JV_LIST:
        if (x->view == JVIEW_GEN || y->view == JVIEW_GEN) return x == y;
        if (x->l.n != y->l.n || x->tuple != y->tuple || x->view != y->view) return 0;
        for (size_t i = 0; i < x->l.n; i++)
            if (!equal_at(x->l.a[i], y->l.a[i], depth + 1)) return 0;
        return 1;
    case JV_DICT:
        if (x->d.n != y->d.n) return 0;
        for (size_t i = 0; i < x->d.n; i++) {
            const jv *o = jv_dict_get(y, x->d.k[i]);
            if (!o || !equal_at(x->d.v[i], o, depth + 1)) return 0;
        }
        return 1;
    case JV_FUNC: return x->fn.id == y->fn.id && x->fn.self == y->fn.self;
    default: return x == y;
    }
}

const char *jv_type_name(const jv *v) {
    switch (v->t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST:
        switch (v->view) {
        case JVIEW_GEN: return "generator";
        case JVIEW_ITEMS: return "dict_items";
        case JVIEW_KEYS: return "dict_keys";
        case JVIEW_VALUES: return "dict_values";
        default: return v->tuple ? "tuple" : "list";
        }
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_FUNC: return "builtin_function_or_method";
    case JV_LOOP: return "LoopContext";
    default: return "Macro";
    }
}

/* ---- UTF-8 ---- */

uint32_t ju_decode(const char *s, size_t n, size_t *adv) {
    const unsigned char *u = (const unsigned char *)s;
    uint32_t c = u[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len <= 1 || len > n) {
        *adv = 1;
        return len == 1 ? c : 0xDC00 + c; /* a lone byte: Python's surrogateescape slot */
    }
    uint32_t cp = c & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *adv = 1;
            return 0xDC00 + c;
        }
        cp = cp << 6 | (u[i] & 0x3F);
    }
    *adv = len;
    return cp;
}

size_t ju_len(const char *s, size_t n) {
    size_t count = 0;
    for (size_t i = 0, adv; i < n; i += adv, count++) ju_decode(s + i, n - i, &adv);
    return count;
}

size_t ju_offset(const char *s, size_t n, size_t cpi) {
    size_t i = 0, adv;
    for (size_t k = 0; k < cpi && i < n; k++, i += adv) ju_decode(s + i, n - i, &adv);
    return i < n ? i : n;
}

int ju_is_space(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* ---- printing ---- */

void jv_write_float(jbuf *b, double f) {
    if (isnan(f)) {
        jb_puts(b, "nan");
        return;
    }
    if (isinf(f)) {
        jb_puts(b, f < 0 ? "-inf" : "inf");
        return;
    }
    /* The shortest digits that read back as f, as Python's repr picks them. */
    char e[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    char digits[24];
    size_t nd = 0;
    const char *p = e;
    int neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) jb_putc(b, '-');
    if (exp >= -4 && exp < 16) {
        if (exp >= 0) {
            for (int i = 0; i <= exp; i++) jb_putc(b, (size_t)i < nd ? digits[i] : '0');
            jb_putc(b, '.');
            if ((size_t)exp + 1 < nd)
                jb_put(b, digits + exp + 1, nd - (size_t)exp - 1);
            else
                jb_putc(b, '0');
        } else {
            jb_puts(b, "0.");
            for (int i = 0; i < -exp - 1; i++) jb_putc(b, '0');
            jb_put(b, digits, nd);
        }
        return;
    }
    jb_putc(b, digits[0]);
    if (nd > 1) {
        jb_putc(b, '.');
        jb_put(b, digits + 1, nd - 1);
    }
    jb_printf(b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
}

/* Code points Python's repr escapes although they are not ASCII controls
 * (str.isprintable() is false): the C1 controls, NBSP, soft hyphen, line and
 * paragraph separators, other separators and format characters commonly met. */
static int repr_escapes(uint32_t cp) {
    return (cp >= 0x80 && cp <= 0xA0) || cp == 0xAD || (cp >= 0x2000 && cp <= 0x200F) ||
           (cp >= 0x2028 && cp <= 0x202F) || (cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF ||
           cp == 0x1680 || (cp >= 0xDC80 && cp <= 0xDCFF) || cp == 0xFFF9 || cp == 0xFFFA || cp == 0xFFFB;
}

static void write_str_repr(jbuf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jb_putc(b, q);
    for (size_t i = 0, adv; i < n; i += adv) {
        uint32_t cp = ju_decode(s + i, n - i, &adv);
        if (cp == (uint32_t)q || cp == '\\') {
            jb_putc(b, '\\');
            jb_putc(b, (char)cp);
        } else if (cp == '\n')
            jb_puts(b, "\\n");
        else if (cp == '\r')
            jb_puts(b, "\\r");
        else if (cp == '\t')
            jb_puts(b, "\\t");
        else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0xFF && repr_escapes(cp)))
            jb_printf(b, "\\x%02x", cp);
        else if (cp >= 0xDC80 && cp <= 0xDCFF)
            jb_put(b, s + i, adv); /* invalid UTF-8 passes through */
        else if (repr_escapes(cp))
            jb_printf(b, "\\u%04x", cp);
        else
            jb_put(b, s + i, adv);
    }
    jb_putc(b, q);
}

static void write_repr_at(jbuf *b, const jv *v, int depth);

void jv_write_repr(jbuf *b, const jv *v) { write_repr_at(b, v, 0); }

static void write_repr_at(jbuf *b, const jv *v, int depth) {
    if (depth > MAX_VALUE_DEPTH)
        jthrow(b->a->fail, b->line, "maximum recursion depth exceeded while getting the repr of an object");
    switch (v->t) {
    case JV_STR: write_str_repr(b, v->s.p, v->s.n); return;
    case JV_LIST:
        if (v->view == JVIEW_GEN) { /* Python prints a function name and an address here: no render can match it */
            jb_puts(b, "<generator object jinja at 0x0>");
            return;
        }
        if (v->view) {
            jb_puts(b, jv_type_name(v));
            jb_putc(b, '(');
        }
        jb_putc(b, v->tuple ? '(' : '[');
        for (size_t i = 0; i < v->l.n; i++) {
            if (i) jb_puts(b, ", ");
            write_repr_at(b, v->l.a[i], depth + 1);
        }
        if (v->tuple && v->l.n == 1) jb_putc(b, ',');
        jb_putc(b, v->tuple ? ')' : ']');
        if (v->view) jb_putc(b, ')');
        return;
    case JV_DICT:
        jb_putc(b, '{');
        for (size_t i = 0; i < v->d.n; i++) {
            if (i) jb_puts(b, ", ");
            write_repr_at(b, v->d.k[i], depth + 1);
            jb_puts(b, ": ");
            write_repr_at(b, v->d.v[i], depth + 1);
        }
        jb_putc(b, '}');
        return;
    default: jv_write_str(b, v);
    }
}

void jv_write_str(jbuf *b, const jv *v) {
    switch (v->t) {
    case JV_UNDEF: return;
    case JV_NONE: jb_puts(b, "None"); return;
    case JV_BOOL: jb_puts(b, v->b ? "True" : "False"); return;
    case JV_INT: jb_printf(b, "%lld", v->i); return;
    case JV_FLOAT: jv_write_float(b, v->f); return;
    case JV_STR: jb_put(b, v->s.p, v->s.n); return;
    case JV_LIST:
    case JV_DICT: jv_write_repr(b, v); return;
    case JV_NS:
        jb_puts(b, "<Namespace ");
        jb_putc(b, '{');
        for (size_t i = 0; i < v->d.n; i++) {
            if (i) jb_puts(b, ", ");
            jv_write_repr(b, v->d.k[i]);
            jb_puts(b, ": ");
            jv_write_repr(b, v->d.v[i]);
        }
        jb_puts(b, "}>");
        return;
    case JV_FUNC: jb_puts(b, "<built-in function>"); return;
    case JV_MACRO: jb_puts(b, "<Macro>"); return;
    case JV_LOOP: jb_puts(b, "<LoopContext>"); return;
    }
}

/* ---- json.dumps ---- */

/* A JSON string; ascii: json.dumps' ensure_ascii=True (\uXXXX, surrogate
 * pairs above U+FFFF). */
static void write_json_str(jbuf *b, const char *s, size_t n, int ascii) {
    jb_putc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (ascii && c >= 0x80) {
            size_t adv;
            uint32_t cp = ju_decode(s + i, n - i, &adv);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                jb_printf(b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else
                jb_printf(b, "\\u%04x", cp);
            i += adv - 1;
            continue;
        }
        switch (c) {
        case '"': jb_puts(b, "\\\""); break;
        case '\\': jb_puts(b, "\\\\"); break;
        case '\n': jb_puts(b, "\\n"); break;
        case '\r': jb_puts(b, "\\r"); break;
        case '\t': jb_puts(b, "\\t"); break;
        case '\b': jb_puts(b, "\\b"); break;
        case '\f': jb_puts(b, "\\f"); break;
        default:
            if (c < 0x20)
                jb_printf(b, "\\u%04x", c);
            else
                jb_putc(b, (char)c);
        }
    }
    jb_putc(b, '"');
}

typedef struct json_opts {
    int indent;
    const char *item_sep, *key_sep;
    int sort_keys, ascii;
    const char **why;
} json_opts;

static void json_newline(jbuf *b, const json_opts *o, int level) {
    jb_putc(b, '\n');
    for (int i = 0; i < o->indent * level; i++) jb_putc(b, ' ');
}

/* A dict key as json.dumps coerces it: str as is, numbers, bools and None to text. */
static int write_json_key(jbuf *b, const jv *k, const json_opts *o) {
    if (k->t == JV_STR) {
        write_json_str(b, k->s.p, k->s.n, o->ascii);
        return 0;
    }
    jbuf t;
    jb_init(&t, b->a, b->cap);
    if (k->t == JV_BOOL)
        jb_puts(&t, k->b ? "true" : "false");
    else if (k->t == JV_NONE)
        jb_puts(&t, "null");
    else if (k->t == JV_INT || k->t == JV_FLOAT)
        jv_write_str(&t, k);
    else {
        *o->why = "keys must be str, int, float, bool or None";
        return -1;
    }
    write_json_str(b, t.p, t.n, o->ascii);
    return 0;
}

static int key_less(const jv *x, const jv *y) {
    size_t n = x->s.n < y->s.n ? x->s.n : y->s.n;
    int c = memcmp(x->s.p, y->s.p, n);
    return c < 0 || (c == 0 && x->s.n < y->s.n);
}

static int write_json(jbuf *b, const jv *v, const json_opts *o, int level) {
    if (level > 512) {
        *o->why = "nesting too deep";
        return -1;
    }
    switch (v->t) {
    case JV_NONE: jb_puts(b, "null"); return 0;
    case JV_BOOL: jb_puts(b, v->b ? "true" : "false"); return 0;
    case JV_INT: jb_printf(b, "%lld", v->i); return 0;
    case JV_FLOAT:
        if (isnan(v->f))
            jb_puts(b, "NaN");
        else if (isinf(v->f))
            jb_puts(b, v->f < 0 ? "-Infinity" : "Infinity");
        else
            jv_write_float(b, v->f);
        return 0;
    case JV_STR: write_json_str(b, v->s.p, v->s.n, o->ascii); return 0;
    case JV_LIST:
        if (v->view) {
            *o->why = v->view == JVIEW_GEN     ? "Object of type generator is not JSON serializable"
                      : v->view == JVIEW_ITEMS ? "Object of type dict_items is not JSON serializable"
                      : v->view == JVIEW_KEYS  ? "Object of type dict_keys is not JSON serializable"
                                               : "Object of type dict_values is not JSON serializable";
            return -1;
        }
        if (!v->l.n) {
            jb_puts(b, "[]");
            return 0;
        }
        jb_putc(b, '[');
        for (size_t i = 0; i < v->l.n; i++) {
            if (i) jb_puts(b, o->item_sep);
            if (o->indent >= 0) json_newline(b, o, level + 1);
            if (write_json(b, v->l.a[i], o, level + 1)) return -1;
        }
        if (o->indent >= 0) json_newline(b, o, level);
        jb_putc(b, ']');
        return 0;
    case JV_DICT: {
        if (!v->d.n) {
            jb_puts(b, "{}");
            return 0;
        }
        size_t n = v->d.n, *order = ja_alloc(b->a, n * sizeof *order);
        for (size_t i = 0; i < n; i++) order[i] = i;
        if (o->sort_keys) { /* insertion sort: stable, and dicts here are small */
            for (size_t i = 1; i < n; i++) {
                size_t x = order[i], j = i;
                if (v->d.k[x]->t != JV_STR) {
                    *o->why = "sort_keys needs str keys";
                    return -1;
                }
                while (j > 0 && key_less(v->d.k[x], v->d.k[order[j - 1]])) {
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        jb_putc(b, '{');
        for (size_t i = 0; i < n; i++) {
            if (i) jb_puts(b, o->item_sep);
            if (o->indent >= 0) json_newline(b, o, level + 1);
            if (write_json_key(b, v->d.k[order[i]], o)) return -1;
            jb_puts(b, o->key_sep);
            if (write_json(b, v->d.v[order[i]], o, level + 1)) return -1;
        }
        if (o->indent >= 0) json_newline(b, o, level);
        jb_putc(b, '}');
        return 0;
    }
    case JV_UNDEF: *o->why = "Object of type Undefined is not JSON serializable"; return -1;
    case JV_NS: *o->why = "Object of type Namespace is not JSON serializable"; return -1;
    default: *o->why = "Object of type function is not JSON serializable"; return -1;
    }
}

int jv_write_json(jbuf *b, const jv *v, int indent, const char *item_sep, const char *key_sep, int sort_keys,
                  int ensure_ascii, const char **why) {
    json_opts o = {
        indent, item_sep ? item_sep : indent >= 0 ? "," : ", ", key_sep ? key_sep : ": ", sort_keys, ensure_ascii, why};
    return write_json(b, v, &o, 0);
}
