/* Jinja evaluation (serve/jinja_impl.h): statements, expressions, scoping and
 * calls, with jinja2's semantics as Hugging Face's ImmutableSandboxedEnvironment
 * gives them (default Undefined, loop controls, list/dict mutation refused).
 * Filters, tests and methods live in jinja_builtins.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/jinja_eval.h"

/* ---- scopes ---- */

static jscope *scope_new(rctx *R, jscope *parent) {
    jscope *s = ja_alloc(R->a, sizeof *s);
    s->parent = parent;
    return s;
}

/* A scope for the next loop iteration: the previous one emptied, unless a
 * macro keeps it (then a new one). */
static jscope *scope_next(rctx *R, jscope *prev, jscope *parent) {
    if (!prev || prev->captured) return scope_new(R, parent);
    prev->n = 0;
    return prev;
}

static jv *loop_info(rctx *R, jv **items, size_t n, size_t i);

static jv *scope_lookup(rctx *R, jscope *s, const char *name) {
    for (; s; s = s->parent) {
        for (size_t i = s->n; i-- > 0;)
            if (strcmp(s->names[i], name) == 0) return s->vals[i];
        if (s->is_loop && strcmp(name, "loop") == 0) {
            jv *L = loop_info(R, s->loop_items, s->loop_n, s->loop_i);
            scope_set(R, s, "loop", L);
            return L;
        }
    }
    return NULL;
}

/* name must outlive the render (template text, the context, a literal). */
void scope_set(rctx *R, jscope *s, const char *name, jv *v) {
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4;
        const char **names = ja_alloc(R->a, cap * sizeof *names);
        jv **vals = ja_alloc(R->a, cap * sizeof *vals);
        if (s->n) {
            memcpy(names, s->names, s->n * sizeof *names);
            memcpy(vals, s->vals, s->n * sizeof *vals);
        }
        s->names = names;
        s->vals = vals;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n++] = v;
}

/* ---- errors ---- */

_Noreturn void rfail(rctx *R, int line, const char *fmt, ...) {
    char msg[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jthrow(R->e, line, "%s", msg);
}

/* The error jinja2's Undefined raises when an operation needs its value. */
_Noreturn void undef_fail(rctx *R, int line, const jv *u) {
    switch (u->u.kind) {
    case JU_NAME: rfail(R, line, "'%s' is undefined", u->u.name);
    case JU_ATTR: rfail(R, line, "'%s' has no attribute '%s'", u->u.objtype, u->u.name);
    case JU_ELEMENT: rfail(R, line, "%s has no element %s", u->u.objtype, u->u.name);
    default: rfail(R, line, "%s", u->u.name);
    }
}

/* object_type_repr as jinja2 words it: "None", or "<type> object". */
const char *obj_type_repr(rctx *R, const jv *v) {
    if (v->t == JV_NONE) return "None";
    if (v->t == JV_NS) return "jinja2.utils.Namespace object";
    const char *t = jv_type_name(v);
    char *s = ja_alloc(R->a, strlen(t) + 8);
    sprintf(s, "%s object", t);
    return s;
}

jv *undef_attr(rctx *R, const jv *obj, const char *name) {
    return jv_undef(R->a, JU_ATTR, name, obj_type_repr(R, obj));
}

jv *undef_element(rctx *R, const jv *obj, const jv *key) {
    jbuf b;
    jb_init(&b, R->a, R->max_out);
    jv_write_repr(&b, key);
    return jv_undef(R->a, JU_ELEMENT, b.p ? b.p : "", obj_type_repr(R, obj));
}

/* ---- helpers shared with the builtins ---- */

const char *to_cstr(rctx *R, const jv *v, size_t *n) {
    if (v->t == JV_STR) {
        *n = v->s.n;
        return v->s.p;
    }
    jbuf b;
    jb_init(&b, R->a, R->max_out);
    jv_write_str(&b, v);
    *n = b.n;
    return b.p ? b.p : "";
}

jv *to_str(rctx *R, const jv *v) {
    if (v->t == JV_STR) return (jv *)v;
    size_t n;
    const char *p = to_cstr(R, v, &n);
    return jv_str(R->a, p, n);
}

/* The items a for loop or a filter walks: list items, dict keys, string
 * characters; undefined is empty. */
jv **iterate(rctx *R, int line, const jv *v, size_t *n) {
    switch (v->t) {
    case JV_LIST:
        if (v->gen_err) rfail(R, line, "%s", v->gen_err);
        *n = v->l.n;
        if (v->view == JVIEW_GEN) ((jv *)v)->l.n = 0; /* a generator runs once */
        return v->l.a;
    case JV_DICT: *n = v->d.n; return v->d.k;
    case JV_UNDEF: *n = 0; return NULL;
    case JV_STR: {
        size_t count = ju_len(v->s.p, v->s.n), k = 0;
        jv **a = ja_alloc(R->a, (count ? count : 1) * sizeof *a);
        for (size_t i = 0, adv; i < v->s.n; i += adv) {
            ju_decode(v->s.p + i, v->s.n - i, &adv);
            a[k++] = jv_str(R->a, v->s.p + i, adv);
        }
        *n = count;
        return a;
    }
    default: rfail(R, line, "'%s' object is not iterable", jv_type_name(v));
    }
}

size_t value_len(rctx *R, int line, const jv *v) {
    switch (v->t) {
    case JV_STR: return ju_len(v->s.p, v->s.n);
    case JV_LIST:
        if (v->view == JVIEW_GEN) rfail(R, line, "object of type 'generator' has no len()");
        return v->l.n;
    case JV_DICT: return v->d.n;
    case JV_UNDEF: return 0;
    default: rfail(R, line, "object of type '%s' has no len()", jv_type_name(v));
    }
}

/* The loop variable of one iteration: a small record whose attributes
 * (index, first, previtem, ...) are computed when read (loop_attr), so a
 * long loop costs little memory. */
static jv *loop_info(rctx *R, jv **items, size_t n, size_t i) {
    jv *L = jv_new(R->a, JV_LOOP);
    L->loop.items = items;
    L->loop.n = n;
    L->loop.i = i;
    return L;
}

static jv *loop_attr(rctx *R, jv *L, const char *name) {
    size_t n = L->loop.n, i = L->loop.i;
    if (!strcmp(name, "index")) return jv_int(R->a, (long long)i + 1);
    if (!strcmp(name, "index0")) return jv_int(R->a, (long long)i);
    if (!strcmp(name, "revindex")) return jv_int(R->a, (long long)(n - i));
    if (!strcmp(name, "revindex0")) return jv_int(R->a, (long long)(n - i - 1));
    if (!strcmp(name, "first")) return jv_bool(R->a, i == 0);
    if (!strcmp(name, "last")) return jv_bool(R->a, i + 1 == n);
    if (!strcmp(name, "length")) return jv_int(R->a, (long long)n);
    if (!strcmp(name, "depth")) return jv_int(R->a, 1);
    if (!strcmp(name, "depth0")) return jv_int(R->a, 0);
    if (!strcmp(name, "cycle")) return loop_cycle_method(R, L);
    if (!strcmp(name, "previtem"))
        return i > 0 ? L->loop.items[i - 1] : jv_undef(R->a, JU_HINT, "there is no previous item", NULL);
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? L->loop.items[i + 1] : jv_undef(R->a, JU_HINT, "there is no next item", NULL);
    return jv_undef(R->a, JU_ATTR, name, "LoopContext");
}

/* ---- attribute and item access ---- */

jv *get_attr(rctx *R, int line, jv *obj, const char *name) {
    if (obj->t == JV_UNDEF) undef_fail(R, line, obj);
    if (obj->t == JV_LOOP) return loop_attr(R, obj, name);
    jv *m = method_lookup(R, obj, name);
    if (m) return m;
    if (obj->t == JV_DICT || obj->t == JV_NS) {
        jv *v = jv_dict_gets(obj, name);
        if (v) return v;
    }
    return undef_attr(R, obj, name);
}

static long long index_of(const jv *k) { return k->t == JV_BOOL ? k->b : k->i; }

jv *get_item(rctx *R, int line, jv *obj, jv *key) {
    if (obj->t == JV_UNDEF) undef_fail(R, line, obj);
    if (obj->t == JV_DICT) {
        jv *v = jv_dict_get(obj, key);
        if (v) return v;
    } else if (((obj->t == JV_LIST && !obj->view) || obj->t == JV_STR) && (key->t == JV_INT || key->t == JV_BOOL)) {
        long long i = index_of(key), n = (long long)value_len(R, line, obj);
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
            if (obj->t == JV_LIST) return obj->l.a[i];
            size_t off = ju_offset(obj->s.p, obj->s.n, (size_t)i), adv;
            ju_decode(obj->s.p + off, obj->s.n - off, &adv);
            return keep_safe(jv_str(R->a, obj->s.p + off, adv), obj);
        }
    }
    if (key->t == JV_STR) {
        char *nm = ja_strndup(R->a, key->s.p, key->s.n);
        if (obj->t == JV_LOOP) return loop_attr(R, obj, nm);
        jv *m = method_lookup(R, obj, nm);
        if (m) return m;
        if (obj->t == JV_NS) {
            jv *v = jv_dict_gets(obj, nm);
            if (v) return v;
        }
        return undef_attr(R, obj, nm);
    }
    return undef_element(R, obj, key);
}

/* Python slice indices for a sequence of length n. */
static void slice_bounds(long long n, const jv *st, const jv *sp, long long step, long long *start, long long *stop) {
    long long lo = step < 0 ? -1 : 0, hi = step < 0 ? n - 1 : n;
    if (!st || st->t == JV_NONE)
        *start = step < 0 ? hi : lo;
    else {
        *start = index_of(st);
        if (*start < 0) *start = *start + n < lo ? lo : *start + n;
        if (*start > hi) *start = hi;
    }
    if (!sp || sp->t == JV_NONE)
        *stop = step < 0 ? lo : hi;
    else {
        *stop = index_of(sp);
        if (*stop < 0) *stop = *stop + n < lo ? lo : *stop + n;
        if (*stop > hi) *stop = hi;
    }
}

static jv *eval_slice(rctx *R, const jnode *n, jscope *sc) {
    jv *obj = eval(R, n->a, sc);
    jv *st = n->b ? eval(R, n->b, sc) : NULL, *sp = n->c ? eval(R, n->c, sc) : NULL,
       *stp = n->d ? eval(R, n->d, sc) : NULL;
    if (obj->t == JV_UNDEF) undef_fail(R, n->line, obj);
    const jv *parts[3] = {st, sp, stp};
    for (int i = 0; i < 3; i++)
        if (parts[i] && parts[i]->t != JV_NONE && parts[i]->t != JV_INT && parts[i]->t != JV_BOOL)
            rfail(R, n->line, "slice indices must be integers or None or have an __index__ method");
    long long step = stp && stp->t != JV_NONE ? index_of(stp) : 1;
    if (step == 0) rfail(R, n->line, "slice step cannot be zero");
    if ((obj->t != JV_LIST || obj->view) && obj->t != JV_STR)
        rfail(R, n->line, "'%s' object is not subscriptable", jv_type_name(obj));
    long long len = (long long)value_len(R, n->line, obj), start, stop;
    slice_bounds(len, st, sp, step, &start, &stop);
    if (obj->t == JV_LIST) {
        jv *out = jv_list(R->a, 0);
        out->tuple = obj->tuple;
        for (long long i = start; step > 0 ? i < stop : i > stop; i += step) jv_list_push(R->a, out, obj->l.a[i]);
        return out;
    }
    /* strings: by code point, through an offset table when not ASCII */
    size_t *off = ja_alloc(R->a, ((size_t)len + 1) * sizeof *off), k = 0;
    for (size_t i = 0, adv; i < obj->s.n; i += adv) {
        off[k++] = i;
        ju_decode(obj->s.p + i, obj->s.n - i, &adv);
    }
    off[k] = obj->s.n;
    jbuf b;
    jb_init(&b, R->a, R->max_out);
    for (long long i = start; step > 0 ? i < stop : i > stop; i += step)
        jb_put(&b, obj->s.p + off[i], off[i + 1] - off[i]);
    return jv_str(R->a, b.p, b.n);
}

/* ---- operators ---- */

static int is_intlike(const jv *v) { return v->t == JV_INT || v->t == JV_BOOL; }
static long long as_int(const jv *v) { return v->t == JV_INT ? v->i : v->b; }

static _Noreturn void bad_operands(rctx *R, int line, const char *op, const jv *a, const jv *b) {
    rfail(R, line, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
}

static jv *repeat(rctx *R, int line, const jv *seq, long long times) {
    if (times < 0) times = 0;
    if (seq->t == JV_STR) {
        if (seq->s.n && (unsigned long long)times > R->max_out / seq->s.n)
            rfail(R, line, "string repetition too large");
        jbuf b;
        jb_init(&b, R->a, R->max_out);
        b.line = line;
        for (long long i = 0; i < times; i++) jb_put(&b, seq->s.p, seq->s.n);
        return jv_str(R->a, b.p, b.n);
    }
    if (seq->l.n && (unsigned long long)times > (1u << 20) / seq->l.n) rfail(R, line, "list repetition too large");
    jv *out = jv_list(R->a, seq->l.n * (size_t)times + 1);
    out->tuple = seq->tuple;
    for (long long i = 0; i < times; i++)
        for (size_t k = 0; k < seq->l.n; k++) jv_list_push(R->a, out, seq->l.a[k]);
    return out;
}

/* a's text followed by b's: in a's buffer when a is its tip and it has room
 * (or grows by doubling), else in a new buffer with room to grow. */
static jv *str_concat(rctx *R, int line, const jv *a, const char *pa, size_t na, const char *pb, size_t nb) {
    if (nb > R->max_out || na > R->max_out - nb) rfail(R, line, "output exceeds %zu bytes", R->max_out);
    size_t n = na + nb;
    jsb *sb = a && a->t == JV_STR ? a->sb : NULL;
    if (!sb || sb->p != pa || sb->used != na) {
        sb = ja_alloc(R->a, sizeof *sb);
        sb->cap = n + n / 2 + 16;
        sb->p = ja_alloc(R->a, sb->cap);
        memcpy(sb->p, pa, na);
        sb->used = na;
    } else if (sb->cap - sb->used < nb) {
        size_t cap = sb->cap * 2 > n + 16 ? sb->cap * 2 : n + 16;
        char *p = ja_alloc(R->a, cap); /* the old bytes stay for the strings that use them */
        memcpy(p, pa, na);
        sb->p = p;
        sb->cap = cap;
    }
    memcpy(sb->p + na, pb, nb);
    sb->used = n;
    jv *r = jv_str(R->a, sb->p, n);
    r->sb = sb;
    return r;
}

static jv *int_result(rctx *R, int line, int overflow, long long v) {
    if (overflow) rfail(R, line, "integer overflow (Python would switch to big integers; this renderer does not)");
    return jv_int(R->a, v);
}

static double py_fmod(double a, double b) {
    double m = fmod(a, b);
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return m;
}

jv *binop(rctx *R, int line, int op, jv *a, jv *b) {
    if (op == '~') {
        size_t na, nb;
        const char *pa = to_cstr(R, a, &na), *pb = to_cstr(R, b, &nb);
        return str_concat(R, line, a, pa, na, pb, nb);
    }
    if (op == '%' && a->t == JV_STR) return percent_format(R, line, a, b); /* str % Undefined prints it empty */
    if (a->t == JV_UNDEF) undef_fail(R, line, a);
    if (b->t == JV_UNDEF) undef_fail(R, line, b);
    static const char *const names[] = {
        ['+'] = "+", ['-'] = "-", ['*'] = "*", ['/'] = "/", ['f'] = "//", ['%'] = "%", ['p'] = "** or pow()"};
    const char *opname = names[op];
    long long r;
    if (is_intlike(a) && is_intlike(b)) {
        long long x = as_int(a), y = as_int(b);
        switch (op) {
        case '+': {
            int over = __builtin_add_overflow(x, y, &r);
            return int_result(R, line, over, r);
        }
        case '-': {
            int over = __builtin_sub_overflow(x, y, &r);
            return int_result(R, line, over, r);
        }
        case '*': {
            int over = __builtin_mul_overflow(x, y, &r);
            return int_result(R, line, over, r);
        }
        case '/':
            if (!y) rfail(R, line, "division by zero");
            return jv_float(R->a, (double)x / (double)y);
        case 'f':
        case '%': {
            if (!y) rfail(R, line, op == 'f' ? "integer division or modulo by zero" : "integer modulo by zero");
            if (x == (-9223372036854775807LL - 1) && y == -1) int_result(R, line, 1, 0);
            long long q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return jv_int(R->a, op == 'f' ? q : m);
        }
        case 'p':
            if (y < 0 && x == 0) rfail(R, line, "0.0 cannot be raised to a negative power");
            if (y < 0) return jv_float(R->a, pow((double)x, (double)y));
            r = 1;
            for (long long i = 0; i < y; i++)
                if (__builtin_mul_overflow(r, x, &r)) int_result(R, line, 1, 0);
            return jv_int(R->a, r);
        }
    }
    if (jv_is_number(a) && jv_is_number(b)) {
        double x = jv_num(a), y = jv_num(b);
        switch (op) {
        case '+': return jv_float(R->a, x + y);
        case '-': return jv_float(R->a, x - y);
        case '*': return jv_float(R->a, x * y);
        case '/':
            if (y == 0) rfail(R, line, "float division by zero");
            return jv_float(R->a, x / y);
        case 'f': { /* CPython's float floor division: from fmod, so 7 // 0.1 is 69.0 */
            if (y == 0) rfail(R, line, "float floor division by zero");
            double mod = fmod(x, y), div = (x - mod) / y;
            if (mod != 0 && ((y < 0) != (mod < 0))) div -= 1.0;
            double fl = floor(div);
            if (div - fl > 0.5) fl += 1.0;
            return jv_float(R->a, div == 0 ? copysign(0.0, x / y) : fl);
        }
        case '%':
            if (y == 0) rfail(R, line, "float modulo");
            return jv_float(R->a, py_fmod(x, y));
        case 'p':
            if (x == 0 && y < 0) rfail(R, line, "0.0 cannot be raised to a negative power");
            return jv_float(R->a, pow(x, y));
        }
    }
    if (op == '+' && a->t == JV_STR && b->t == JV_STR) {
        int safe = a->safe || b->safe; /* Markup + str escapes the str */
        if (safe) {
            a = html_escape(R, a);
            b = html_escape(R, b);
        }
        jv *r = str_concat(R, line, a, a->s.p, a->s.n, b->s.p, b->s.n);
        r->safe = (unsigned char)safe;
        return r;
    }
    if (op == '+' && a->t == JV_LIST && b->t == JV_LIST && a->tuple == b->tuple && !a->view && !b->view) {
        jv *out = jv_list(R->a, a->l.n + b->l.n + 1);
        out->tuple = a->tuple;
        for (size_t i = 0; i < a->l.n; i++) jv_list_push(R->a, out, a->l.a[i]);
        for (size_t i = 0; i < b->l.n; i++) jv_list_push(R->a, out, b->l.a[i]);
        return out;
    }
    if (op == '*' && (a->t == JV_STR || (a->t == JV_LIST && !a->view)) && is_intlike(b))
        return keep_safe(repeat(R, line, a, as_int(b)), a);
    if (op == '*' && (b->t == JV_STR || (b->t == JV_LIST && !b->view)) && is_intlike(a))
        return keep_safe(repeat(R, line, b, as_int(a)), b);
    if (op == '+' && a->t == JV_STR) rfail(R, line, "can only concatenate str (not \"%s\") to str", jv_type_name(b));
    if (op == '+' && a->t == JV_LIST) rfail(R, line, "can only concatenate list (not \"%s\") to list", jv_type_name(b));
    if (op == '%' && a->t == JV_STR) return percent_format(R, line, a, b);
    bad_operands(R, line, opname, a, b);
}

static int compare_inner(rctx *R, int line, const char *op, const jv *a, const jv *b);

/* Python's ordering for numbers, strings and lists: <0, 0, >0. */
int compare_order(rctx *R, int line, const char *op, const jv *a, const jv *b) {
    if (++R->depth > MAX_CALL_DEPTH + 400) rfail(R, line, "maximum recursion depth exceeded in comparison");
    int c = compare_inner(R, line, op, a, b);
    R->depth--;
    return c;
}

static int compare_inner(rctx *R, int line, const char *op, const jv *a, const jv *b) {
    if (a->t == JV_UNDEF) undef_fail(R, line, a);
    if (b->t == JV_UNDEF) undef_fail(R, line, b);
    if (jv_is_number(a) && jv_is_number(b)) {
        if (is_intlike(a) && is_intlike(b)) return as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b);
        double x = jv_num(a), y = jv_num(b);
        return x < y ? -1 : x > y;
    }
    if (a->t == JV_STR && b->t == JV_STR) {
        size_t n = a->s.n < b->s.n ? a->s.n : b->s.n;
        int c = memcmp(a->s.p, b->s.p, n);
        return c ? c : a->s.n < b->s.n ? -1 : a->s.n > b->s.n;
    }
    if (a->t == JV_LIST && b->t == JV_LIST && !a->view && !b->view && a->tuple == b->tuple) {
        for (size_t i = 0; i < a->l.n && i < b->l.n; i++) {
            if (jv_equal(a->l.a[i], b->l.a[i])) continue;
            return compare_order(R, line, op, a->l.a[i], b->l.a[i]);
        }
        return a->l.n < b->l.n ? -1 : a->l.n > b->l.n;
    }
    rfail(R, line, "'%s' not supported between instances of '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
}

int contains(rctx *R, int line, const jv *hay, const jv *needle) {
    switch (hay->t) {
    case JV_STR:
        if (needle->t == JV_UNDEF) undef_fail(R, line, needle);
        if (needle->t != JV_STR)
            rfail(R, line, "'in <string>' requires string as left operand, not %s", jv_type_name(needle));
        if (!needle->s.n) return 1;
        for (size_t i = 0; i + needle->s.n <= hay->s.n; i++)
            if (memcmp(hay->s.p + i, needle->s.p, needle->s.n) == 0) return 1;
        return 0;
    case JV_LIST: {
        size_t n;
        jv **items = iterate(R, line, hay, &n);
        for (size_t i = 0; i < n; i++)
            if (jv_equal(items[i], needle)) return 1;
        return 0;
    }
    case JV_DICT:
        if ((needle->t == JV_LIST && !needle->tuple) || needle->t == JV_DICT)
            rfail(R, line, "unhashable type: '%s'", jv_type_name(needle));
        return jv_dict_get(hay, needle) != NULL;
    case JV_UNDEF: return 0;
    default: rfail(R, line, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

static int eval_compare(rctx *R, const jnode *n, jscope *sc) {
    static const char *const opnames[] = {"==", "!=", "<", "<=", ">", ">=", "in", "not in"};
    jv *left = eval(R, n->a, sc);
    for (size_t i = 0; i < n->n; i++) {
        jv *right = eval(R, n->list[i], sc);
        int op = n->ops[i], ok;
        switch (op) {
        case CMP_EQ: ok = jv_equal(left, right); break;
        case CMP_NE: ok = !jv_equal(left, right); break;
        case CMP_IN: ok = contains(R, n->line, right, left); break;
        case CMP_NOTIN: ok = !contains(R, n->line, right, left); break;
        default: {
            int c = compare_order(R, n->line, opnames[op], left, right);
            ok = op == CMP_LT ? c < 0 : op == CMP_LE ? c <= 0 : op == CMP_GT ? c > 0 : c >= 0;
        }
        }
        if (!ok) return 0;
        left = right;
    }
    return 1;
}

/* ---- calls ---- */

static jv *eval_call(rctx *R, const jnode *n, jscope *sc, jv *caller) {
    jv *f = eval(R, n->a, sc);
    jargs A = {.line = n->line, .n = n->n, .nkw = n->n2, .kwnames = n->names};
    A.v = ja_alloc(R->a, (n->n + 1) * sizeof(jv *));
    A.kw = ja_alloc(R->a, (n->n2 + 1) * sizeof(jv *));
    for (size_t i = 0; i < n->n; i++) A.v[i] = eval(R, n->list[i], sc);
    for (size_t i = 0; i < n->n2; i++) A.kw[i] = eval(R, n->list2[i], sc);
    if (f->t == JV_MACRO) return call_macro(R, f, &A, caller);
    if (f->t == JV_FUNC) return call_function(R, f, &A);
    if (f->t == JV_UNDEF) undef_fail(R, n->line, f);
    rfail(R, n->line, "'%s' object is not callable", jv_type_name(f));
}

/* Renders a macro's (or a call block's caller's) body with its arguments bound. */
jv *call_macro(rctx *R, const jv *m, const jargs *A, jv *caller) {
    const jnode *def = m->mac.node;
    const char *name = def->k == N_MACRO ? def->name : "caller";
    if (A->n > def->nn) rfail(R, A->line, "macro '%s' takes not more than %zu argument(s)", name, def->nn);
    if (++R->depth > MAX_CALL_DEPTH) rfail(R, A->line, "macro calls nest deeper than %d", MAX_CALL_DEPTH);
    jscope *sc = scope_new(R, m->mac.env);
    for (size_t k = 0; k < A->nkw; k++) {
        size_t p = 0;
        while (p < def->nn && strcmp(def->names[p], A->kwnames[k]) != 0) p++;
        if (p == def->nn && strcmp(A->kwnames[k], "caller") != 0)
            rfail(R, A->line, "macro '%s' takes no keyword argument '%s'", name, A->kwnames[k]);
        if (p < A->n) rfail(R, A->line, "macro '%s' got multiple values for argument '%s'", name, A->kwnames[k]);
    }
    for (size_t p = 0; p < def->nn; p++) {
        jv *v = NULL;
        if (p < A->n) v = A->v[p];
        for (size_t k = 0; !v && k < A->nkw; k++)
            if (strcmp(def->names[p], A->kwnames[k]) == 0) v = A->kw[k];
        if (!v) v = def->list2[p] ? eval(R, def->list2[p], sc) : jv_undef(R->a, JU_NAME, def->names[p], NULL);
        scope_set(R, sc, def->names[p], v);
    }
    if (caller) scope_set(R, sc, "caller", caller);
    jbuf out;
    jb_init(&out, R->a, R->max_out);
    exec_body(R, def->list, def->n, sc, &out);
    R->depth--;
    return jv_str(R->a, out.p ? out.p : "", out.n);
}

/* ---- expressions ---- */

static jv *eval_filter_node(rctx *R, const jnode *n, jscope *sc, jv *input) {
    jv *x; /* the input: the chain's start in a filter block, else the expression */
    if (!n->a)
        x = input;
    else if (input && n->a->k == E_FILTER)
        x = eval_filter_node(R, n->a, sc, input);
    else
        x = eval(R, n->a, sc);
    jargs A = {.line = n->line, .n = n->n, .nkw = n->n2, .kwnames = n->names};
    A.v = ja_alloc(R->a, (n->n + 1) * sizeof(jv *));
    A.kw = ja_alloc(R->a, (n->n2 + 1) * sizeof(jv *));
    for (size_t i = 0; i < n->n; i++) A.v[i] = eval(R, n->list[i], sc);
    for (size_t i = 0; i < n->n2; i++) A.kw[i] = eval(R, n->list2[i], sc);
    if (n->flag & JF_UNKNOWN) rfail(R, n->line, "No filter named '%s' found.", n->name);
    return apply_filter(R, n->op, x, &A);
}

static jv *eval_test_node(rctx *R, const jnode *n, jscope *sc) {
    jv *x = eval(R, n->a, sc);
    jargs A = {.line = n->line, .n = n->n, .nkw = n->n2, .kwnames = n->names};
    A.v = ja_alloc(R->a, (n->n + 1) * sizeof(jv *));
    A.kw = ja_alloc(R->a, (n->n2 + 1) * sizeof(jv *));
    for (size_t i = 0; i < n->n; i++) A.v[i] = eval(R, n->list[i], sc);
    for (size_t i = 0; i < n->n2; i++) A.kw[i] = eval(R, n->list2[i], sc);
    if (n->flag & JF_UNKNOWN) rfail(R, n->line, "No test named '%s' found.", n->name);
    int r = apply_test(R, n->op, x, &A);
    return jv_bool(R->a, (n->flag & JF_NEGATED) ? !r : r);
}

jv *eval(rctx *R, const jnode *n, jscope *sc) {
    if (++R->depth > MAX_CALL_DEPTH + 400) rfail(R, n->line, "expression nests too deep");
    jv *v;
    switch (n->k) {
    case E_CONST: v = n->cval; break;
    case E_NAME:
        v = scope_lookup(R, sc, n->name);
        if (!v) v = global_lookup(R, n->name);
        if (!v) v = jv_undef(R->a, JU_NAME, n->name, NULL);
        break;
    case E_ATTR: v = get_attr(R, n->line, eval(R, n->a, sc), n->name); break;
    case E_ITEM: {
        jv *obj = eval(R, n->a, sc);
        v = get_item(R, n->line, obj, eval(R, n->b, sc));
        break;
    }
    case E_SLICE: v = eval_slice(R, n, sc); break;
    case E_CALL: v = eval_call(R, n, sc, NULL); break;
    case E_FILTER: v = eval_filter_node(R, n, sc, NULL); break;
    case E_TEST: v = eval_test_node(R, n, sc); break;
    case E_BIN: {
        jv *a = eval(R, n->a, sc);
        v = binop(R, n->line, n->op, a, eval(R, n->b, sc));
        break;
    }
    case E_NEG:
    case E_POS: {
        jv *a = eval(R, n->a, sc);
        if (a->t == JV_UNDEF) undef_fail(R, n->line, a);
        if (!jv_is_number(a))
            rfail(R, n->line, "bad operand type for unary %c: '%s'", n->k == E_NEG ? '-' : '+', jv_type_name(a));
        if (n->k == E_POS)
            v = a->t == JV_BOOL ? jv_int(R->a, a->b) : a;
        else if (a->t == JV_FLOAT)
            v = jv_float(R->a, -a->f);
        else
            v = int_result(R, n->line, as_int(a) == (-9223372036854775807LL - 1), -as_int(a));
        break;
    }
    case E_NOT: v = jv_bool(R->a, !jv_truthy(eval(R, n->a, sc))); break;
    case E_AND: {
        jv *a = eval(R, n->a, sc);
        v = jv_truthy(a) ? eval(R, n->b, sc) : a;
        break;
    }
    case E_OR: {
        jv *a = eval(R, n->a, sc);
        v = jv_truthy(a) ? a : eval(R, n->b, sc);
        break;
    }
    case E_COND:
        if (jv_truthy(eval(R, n->b, sc)))
            v = eval(R, n->a, sc);
        else
            v = n->c ? eval(R, n->c, sc)
                     : jv_undef(R->a, JU_HINT,
                                "the inline if-expression evaluated to false and no else section was defined.", NULL);
        break;
    case E_LIST:
    case E_TUPLE:
        v = jv_list(R->a, n->n + 1);
        v->tuple = n->k == E_TUPLE;
        for (size_t i = 0; i < n->n; i++) jv_list_push(R->a, v, eval(R, n->list[i], sc));
        break;
    case E_DICT:
        v = jv_dict(R->a, JV_DICT);
        for (size_t i = 0; i < n->n; i++) {
            jv *k = eval(R, n->list[i], sc);
            if (k->t == JV_LIST && !k->tuple) rfail(R, n->line, "unhashable type: 'list'");
            if (k->t == JV_DICT) rfail(R, n->line, "unhashable type: 'dict'");
            jv_dict_set(R->a, v, k, eval(R, n->list2[i], sc));
        }
        break;
    case E_CMP: v = jv_bool(R->a, eval_compare(R, n, sc)); break;
    default: rfail(R, n->line, "not an expression");
    }
    R->depth--;
    return v;
}

/* ---- statements ---- */

static void assign(rctx *R, const jnode *target, jv *v, jscope *sc) {
    if (target->k == E_NAME) {
        scope_set(R, sc, target->name, v);
        return;
    }
    if (target->k == E_ATTR) {
        jv *ns = eval(R, target->a, sc);
        if (ns->t != JV_NS) rfail(R, target->line, "cannot assign attribute on non-namespace object");
        jv_dict_set(R->a, ns, jv_cstr(R->a, target->name), v);
        return;
    }
    /* a, b = ... */
    size_t n;
    jv **items = iterate(R, target->line, v, &n);
    if (n < target->n) rfail(R, target->line, "not enough values to unpack (expected %zu, got %zu)", target->n, n);
    if (n > target->n) rfail(R, target->line, "too many values to unpack (expected %zu)", target->n);
    for (size_t i = 0; i < n; i++) assign(R, target->list[i], items[i], sc);
}

static void bind_targets(rctx *R, const jnode *n, jv *item, jscope *sc) {
    if (n->nn == 1) {
        scope_set(R, sc, n->names[0], item);
        return;
    }
    size_t k;
    jv **parts = iterate(R, n->line, item, &k);
    if (k < n->nn) rfail(R, n->line, "not enough values to unpack (expected %zu, got %zu)", n->nn, k);
    if (k > n->nn) rfail(R, n->line, "too many values to unpack (expected %zu)", n->nn);
    for (size_t i = 0; i < k; i++) scope_set(R, sc, n->names[i], parts[i]);
}

static void count_iteration(rctx *R, int line) {
    if (++R->iterations > MAX_ITERATIONS) rfail(R, line, "more than %d loop iterations", MAX_ITERATIONS);
}

/* Returns the flow its else block ends with: a break or continue there is the enclosing loop's. */
static int exec_for(rctx *R, const jnode *n, jscope *sc, jbuf *out) {
    size_t count;
    jv **all = iterate(R, n->line, eval(R, n->a, sc), &count);
    jv **items = all;
    if (n->b) { /* for x in y if cond: filter first, so loop.* counts what remains */
        items = ja_alloc(R->a, (count + 1) * sizeof *items);
        size_t kept = 0;
        jscope *t = NULL;
        for (size_t i = 0; i < count; i++) {
            count_iteration(R, n->line);
            t = scope_next(R, t, sc);
            bind_targets(R, n, all[i], t);
            if (jv_truthy(eval(R, n->b, t))) items[kept++] = all[i];
        }
        count = kept;
    }
    /* jinja2 runs the else block unless some iteration reached the end of the
     * body: an empty loop, but also one whose every pass broke or continued */
    int completed = 0;
    jscope *it = NULL;
    for (size_t i = 0; i < count; i++) {
        count_iteration(R, n->line);
        it = scope_next(R, it, sc); /* each iteration starts empty, as in jinja2 */
        it->is_loop = 1;
        it->loop_items = items;
        it->loop_n = count;
        it->loop_i = i;
        bind_targets(R, n, items[i], it);
        int st = exec_body(R, n->list, n->n, it, out);
        if (st == FLOW_NORMAL) completed = 1;
        if (st == FLOW_BREAK) break;
    }
    if (!completed && n->n2) return exec_body(R, n->list2, n->n2, scope_new(R, sc), out);
    return FLOW_NORMAL;
}

static jv *macro_value(rctx *R, const jnode *def, jscope *sc) {
    jv *m = jv_new(R->a, JV_MACRO);
    m->mac.node = def;
    m->mac.env = sc;
    for (jscope *s = sc; s; s = s->is_loop ? s->parent : NULL)
        s->captured = 1; /* the closure and the loops around it */
    return m;
}

int exec_body(rctx *R, jnode *const *body, size_t n, jscope *sc, jbuf *out) {
    for (size_t i = 0; i < n; i++) {
        const jnode *s = body[i];
        out->line = s->line;
        switch (s->k) {
        case N_TEXT: jb_put(out, s->cval->s.p, s->cval->s.n); break;
        case N_OUT: {
            jv *v = eval(R, s->a, sc);
            out->line = s->line;
            jv_write_str(out, v);
            break;
        }
        case N_IF: {
            int st = jv_truthy(eval(R, s->a, sc)) ? exec_body(R, s->list, s->n, sc, out)
                                                  : exec_body(R, s->list2, s->n2, sc, out);
            if (st != FLOW_NORMAL) return st;
            break;
        }
        case N_FOR: {
            int st = exec_for(R, s, sc, out);
            if (st != FLOW_NORMAL) return st;
            break;
        }
        case N_SET: assign(R, s->a, eval(R, s->b, sc), sc); break;
        case N_SETBLOCK: {
            jbuf cap; /* the body gets a scope of its own: its sets do not leak, as in jinja2 */
            jb_init(&cap, R->a, R->max_out);
            int st = exec_body(R, s->list, s->n, scope_new(R, sc), &cap);
            if (st != FLOW_NORMAL) return st; /* a break inside leaves the loop at once */
            jv *v = jv_str(R->a, cap.p ? cap.p : "", cap.n);
            if (s->c) v = eval_filter_node(R, s->c, sc, v);
            assign(R, s->a, v, sc);
            break;
        }
        case N_MACRO: scope_set(R, sc, s->name, macro_value(R, s, sc)); break;
        case N_CALLBLOCK: {
            jv *v = eval_call(R, s->a, sc, macro_value(R, s, sc));
            out->line = s->line;
            jv_write_str(out, v);
            break;
        }
        case N_FILTERBLOCK: {
            jbuf cap;
            jb_init(&cap, R->a, R->max_out);
            int st = exec_body(R, s->list, s->n, scope_new(R, sc), &cap);
            if (st != FLOW_NORMAL) return st;
            jv *v = eval_filter_node(R, s->a, sc, jv_str(R->a, cap.p ? cap.p : "", cap.n));
            out->line = s->line;
            jv_write_str(out, v);
            break;
        }
        case N_BODY: {
            int st = exec_body(R, s->list, s->n, sc, out);
            if (st != FLOW_NORMAL) return st;
            break;
        }
        case N_BREAK: return FLOW_BREAK;
        case N_CONTINUE: return FLOW_CONTINUE;
        default: rfail(R, s->line, "not a statement");
        }
    }
    return FLOW_NORMAL;
}

/* ---- entry points ---- */

/* The parse under its jump target: 0, or -1 after a failure (message in e->err). */
static int parse_guarded(moex_jinja *t, const char *src, size_t len, jerr *e) {
    if (setjmp(e->jb)) return -1;
    jparse(t, src, len, e);
    return 0;
}

moex_jinja *moex_jinja_parse(const char *src, size_t len, moex_error *err) {
    moex_jinja *t = calloc(1, sizeof *t);
    if (!t) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    jerr e = {.err = err};
    t->arena.limit = (size_t)256 << 20;
    t->arena.fail = &e;
    if (parse_guarded(t, src, len, &e)) {
        ja_free_all(&t->arena);
        free(t);
        return NULL;
    }
    t->arena.fail = NULL;
    return t;
}

void moex_jinja_free(moex_jinja *t) {
    if (!t) return;
    ja_free_all(&t->arena);
    free(t);
}

/* The render under its jump target: 0 with the text in *out, or -1. */
static int render_guarded(rctx *R, const moex_jinja *t, const cJSON *ctx, jbuf *out) {
    if (setjmp(R->e->jb)) return -1;
    jscope *root = scope_new(R, NULL);
    if (ctx && cJSON_IsObject(ctx))
        for (const cJSON *c = ctx->child; c; c = c->next)
            if (c->string) scope_set(R, root, c->string, jv_from_cjson(R->a, c, 0));
    jb_init(out, R->a, R->max_out);
    exec_body(R, t->root->list, t->root->n, root, out);
    return 0;
}

char *moex_jinja_render(const moex_jinja *t, const cJSON *ctx, long long now, size_t max_out, size_t *len,
                        moex_error *err) {
    if (!max_out) max_out = (size_t)16 << 20;
    if (max_out > (size_t)1 << 40) max_out = (size_t)1 << 40; /* keeps the memory bound below from wrapping */
    jerr e = {.err = err};
    jarena arena = {.limit = max_out * 8 + ((size_t)64 << 20), .fail = &e};
    rctx R = {.a = &arena, .e = &e, .now = now, .max_out = max_out};
    jbuf out;
    char *text = NULL;
    if (render_guarded(&R, t, ctx, &out) == 0) {
        text = malloc(out.n + 1);
        if (!text)
            moex_fail(err, "out of memory");
        else {
            if (out.n) memcpy(text, out.p, out.n);
            text[out.n] = 0;
            if (len) *len = out.n;
        }
    }
    ja_free_all(&arena);
    return text;
}
