/* Jinja lexer and parser (serve/jinja_impl.h): template text to an AST.
 *
 * The lexer follows jinja2's rules as Hugging Face configures them:
 * newlines normalized to "\n", one trailing newline dropped
 * (keep_trailing_newline=False), "{%-"/"-%}" strip whitespace, trim_blocks
 * drops the newline after a block or comment tag, lstrip_blocks drops the
 * spaces before one when only whitespace precedes it on its line ("{%+" and
 * "+%}" turn those off). The parser follows jinja2's precedence: condexpr,
 * or, and, not, comparisons, + -, ~, * / // %, **, unary, then postfix
 * (. [] ()) with filters (|) and tests (is) binding tightest. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/jinja_impl.h"

enum { MAX_NESTING = 200 }; /* parser recursion: expressions and blocks */

typedef enum {
    T_DATA,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,
    T_EOF
} ttype;

typedef struct jtok {
    ttype t;
    int line;
    const char *p; /* text (T_STRING: decoded) */
    size_t n;
    long long i;
    double f;
} jtok;

typedef struct parser {
    jarena *a;
    jerr *e;
    jtok *tok;
    size_t ntok, captok, pos;
    int soft;    /* inside an if (where jinja2 defers unknown filters/tests to run time) */
    int in_loop; /* inside a for body (not in a macro in it): where break and continue may go */
    int depth;   /* recursion depth */
} parser;

/* ---- lexer ---- */

static void push_tok(parser *P, ttype t, int line, const char *p, size_t n) {
    if (P->ntok == P->captok) {
        size_t cap = P->captok ? P->captok * 2 : 256;
        jtok *a = ja_alloc(P->a, cap * sizeof *a);
        if (P->ntok) memcpy(a, P->tok, P->ntok * sizeof *a);
        P->tok = a;
        P->captok = cap;
    }
    jtok *k = &P->tok[P->ntok++];
    memset(k, 0, sizeof *k);
    k->t = t;
    k->line = line;
    k->p = p;
    k->n = n;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static int count_nl(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++) c += s[i] == '\n';
    return c;
}

/* A string literal's body with Python's escapes decoded. */
static void lex_string(parser *P, const char *s, size_t n, size_t *pos, int line) {
    char q = s[*pos];
    size_t i = *pos + 1;
    jbuf b;
    jb_init(&b, P->a, (size_t)-1);
    for (;;) {
        if (i >= n) jthrow(P->e, line, "unexpected end of string");
        char c = s[i];
        if (c == q) break;
        if (c != '\\') {
            jb_putc(&b, c);
            i++;
            continue;
        }
        if (i + 1 >= n) jthrow(P->e, line, "unexpected end of string");
        char x = s[i + 1];
        i += 2;
        static const char esc_in[] = "nrtabfv0\\'\"\n", esc_out[] = "\n\r\t\a\b\f\v\0\\'\"";
        const char *simple = x ? strchr(esc_in, x) : NULL;
        if (simple) {
            if (x != '\n') jb_putc(&b, esc_out[simple - esc_in]); /* backslash-newline: a continuation */
            continue;
        }
        int hex = x == 'x' ? 2 : x == 'u' ? 4 : x == 'U' ? 8 : 0;
        if (hex) {
            unsigned long cp = 0;
            for (int k = 0; k < hex; k++, i++) {
                if (i >= n || !isxdigit((unsigned char)s[i])) jthrow(P->e, line, "truncated \\%c escape", x);
                cp =
                    cp * 16 + (unsigned long)(isdigit((unsigned char)s[i]) ? s[i] - '0'
                                                                           : (tolower((unsigned char)s[i]) - 'a' + 10));
            }
            if (cp > 0x10FFFF) jthrow(P->e, line, "illegal Unicode character");
            char u[4];
            int len = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
            if (len == 1)
                u[0] = (char)cp;
            else {
                for (int k = len - 1; k > 0; k--, cp >>= 6) u[k] = (char)(0x80 | (cp & 0x3F));
                u[0] = (char)((len == 2 ? 0xC0 : len == 3 ? 0xE0 : 0xF0) | cp);
            }
            jb_put(&b, u, (size_t)len);
            continue;
        }
        jb_putc(&b, '\\'); /* unknown escapes stay as written */
        jb_putc(&b, x);
    }
    push_tok(P, T_STRING, line, b.p ? b.p : "", b.n);
    *pos = i + 1;
}

static void lex_number(parser *P, const char *s, size_t n, size_t *pos, int line) {
    size_t i = *pos;
    int is_float = 0;
    char num[64];
    size_t k = 0;
    while (i < n && (isdigit((unsigned char)s[i]) || (s[i] == '_' && i + 1 < n && isdigit((unsigned char)s[i + 1])))) {
        if (s[i] != '_' && k < sizeof num - 1) num[k++] = s[i];
        i++;
    }
    if (i + 1 < n && s[i] == '.' && isdigit((unsigned char)s[i + 1])) {
        is_float = 1;
        if (k < sizeof num - 1) num[k++] = s[i];
        i++;
        while (i < n && (isdigit((unsigned char)s[i]) || s[i] == '_')) {
            if (s[i] != '_' && k < sizeof num - 1) num[k++] = s[i];
            i++;
        }
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < n && (s[j] == '+' || s[j] == '-')) j++;
        if (j < n && isdigit((unsigned char)s[j])) {
            is_float = 1;
            while (i < j && k < sizeof num - 1) num[k++] = s[i++];
            while (i < n && isdigit((unsigned char)s[i]) && k < sizeof num - 1) num[k++] = s[i++];
        }
    }
    num[k] = 0;
    push_tok(P, is_float ? T_FLOAT : T_INT, line, s + *pos, i - *pos);
    jtok *t = &P->tok[P->ntok - 1];
    if (is_float)
        t->f = strtod(num, NULL);
    else {
        char *end;
        unsigned long long v = strtoull(num, &end, 10);
        if (k > 18 && (k > 19 || v > 9223372036854775807ULL)) jthrow(P->e, line, "integer literal too large");
        t->i = (long long)v;
    }
    *pos = i;
}

static const char *const OPS2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
static const char OPS1[] = "+-/*%~[](){}<>=.:|,;";

/* The expression tokens of one {{ }} or {% %}, through its end marker. */
static size_t lex_tag(parser *P, const char *s, size_t n, size_t pos, int *line, int is_block) {
    int open_line = *line;
    char stack[MAX_NESTING];
    int depth = 0;
    for (;;) {
        while (pos < n && is_ws(s[pos])) *line += s[pos++] == '\n';
        if (pos >= n) jthrow(P->e, open_line, "unexpected end of template inside a tag that opened here");
        if (depth == 0) {
            const char *close = is_block ? "%}" : "}}";
            if ((s[pos] == '-' || (is_block && s[pos] == '+')) && pos + 2 < n && memcmp(s + pos + 1, close, 2) == 0) {
                push_tok(P, is_block ? T_BLOCK_END : T_VAR_END, *line, s + pos, 3);
                int strip = s[pos] == '-';
                pos += 3;
                if (strip)
                    while (pos < n && is_ws(s[pos])) *line += s[pos++] == '\n';
                return pos;
            }
            if (pos + 1 < n && memcmp(s + pos, close, 2) == 0) {
                push_tok(P, is_block ? T_BLOCK_END : T_VAR_END, *line, s + pos, 2);
                pos += 2;
                if (is_block && pos < n && s[pos] == '\n') { /* trim_blocks */
                    pos++;
                    (*line)++;
                }
                return pos;
            }
        }
        char c = s[pos];
        if (isalpha((unsigned char)c) || c == '_') {
            size_t st = pos;
            while (pos < n && (isalnum((unsigned char)s[pos]) || s[pos] == '_')) pos++;
            push_tok(P, T_NAME, *line, s + st, pos - st);
        } else if (isdigit((unsigned char)c)) {
            lex_number(P, s, n, &pos, *line);
        } else if (c == '\'' || c == '"') {
            int l0 = *line;
            size_t st = pos;
            lex_string(P, s, n, &pos, l0);
            *line += count_nl(s + st, pos - st);
        } else {
            size_t len = 0;
            for (int k = 0; OPS2[k]; k++)
                if (pos + 1 < n && memcmp(s + pos, OPS2[k], 2) == 0) len = 2;
            if (!len && strchr(OPS1, c) && c) len = 1;
            if (!len) jthrow(P->e, *line, "unexpected char '%c'", c);
            if (c == '(' || c == '[' || c == '{') {
                if (depth == MAX_NESTING) jthrow(P->e, *line, "brackets nest too deep");
                stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
            } else if (c == ')' || c == ']' || c == '}') {
                if (!depth) jthrow(P->e, *line, "unexpected '%c'", c);
                if (stack[depth - 1] != c) jthrow(P->e, *line, "unexpected '%c', expected '%c'", c, stack[depth - 1]);
                depth--;
            }
            push_tok(P, T_OP, *line, s + pos, len);
            pos += len;
        }
    }
}

/* {% raw %}...{% endraw %}: the body is data. Returns the position after the
 * end tag, or 0 when the block at pos is not a raw block. */
static size_t lex_raw(parser *P, const char *s, size_t n, size_t pos, int *line) {
    size_t i = pos;
    while (i < n && is_ws(s[i])) i++;
    if (n - i < 3 || memcmp(s + i, "raw", 3) != 0) return 0;
    i += 3;
    while (i < n && is_ws(s[i])) i++;
    int strip_after = 0;
    if (i < n && s[i] == '-') {
        strip_after = 1;
        i++;
    }
    if (n - i < 2 || memcmp(s + i, "%}", 2) != 0) return 0;
    i += 2;
    if (strip_after)
        while (i < n && is_ws(s[i])) i++;
    /* find {%[-+]? endraw [-+]?%} */
    for (size_t q = i; q + 1 < n; q++) {
        if (s[q] != '{' || s[q + 1] != '%') continue;
        size_t j = q + 2;
        char sign = j < n && (s[j] == '-' || s[j] == '+') ? s[j] : 0;
        if (sign) j++;
        while (j < n && is_ws(s[j])) j++;
        if (n - j < 6 || memcmp(s + j, "endraw", 6) != 0) continue;
        j += 6;
        while (j < n && is_ws(s[j])) j++;
        char esign = j < n && (s[j] == '-' || s[j] == '+') ? s[j] : 0;
        if (esign) j++;
        if (n - j < 2 || memcmp(s + j, "%}", 2) != 0) continue;
        j += 2;
        size_t tlen = q - i;
        if (sign == '-')
            while (tlen && is_ws(s[i + tlen - 1])) tlen--;
        if (tlen) push_tok(P, T_DATA, *line, s + i, tlen);
        if (esign == '-')
            while (j < n && is_ws(s[j])) j++;
        else if (esign != '+' && j < n && s[j] == '\n')
            j++;
        *line += count_nl(s + pos, j - pos);
        return j;
    }
    jthrow(P->e, *line, "Missing end of raw directive");
}

static void lex(parser *P, const char *s, size_t n) {
    size_t pos = 0;
    int line = 1, line_starting = 1;
    while (pos < n) {
        size_t q = pos;
        char kind = 0;
        for (; q + 1 < n; q++)
            if (s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#')) {
                kind = s[q + 1];
                break;
            }
        if (!kind) {
            push_tok(P, T_DATA, line, s + pos, n - pos);
            break;
        }
        char sign = q + 2 < n && (s[q + 2] == '-' || s[q + 2] == '+') ? s[q + 2] : 0;
        size_t tlen = q - pos;
        if (sign == '-') {
            while (tlen && is_ws(s[pos + tlen - 1])) tlen--;
        } else if (sign != '+' && kind != '{') { /* lstrip_blocks */
            size_t lp = tlen;
            while (lp && s[pos + lp - 1] != '\n') lp--;
            if ((lp > 0 || line_starting) && lp < tlen) {
                size_t k = lp;
                while (k < tlen && is_ws(s[pos + k])) k++;
                if (k == tlen) tlen = lp;
            }
        }
        if (tlen) push_tok(P, T_DATA, line, s + pos, tlen);
        line += count_nl(s + pos, q - pos);
        pos = q + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t end = pos;
            while (end + 1 < n && !(s[end] == '#' && s[end + 1] == '}')) end++;
            if (end + 1 >= n) jthrow(P->e, line, "Missing end of comment tag");
            size_t after = end + 2;
            if (end > pos && s[end - 1] == '-') {
                while (after < n && is_ws(s[after])) after++;
            } else if (!(end > pos && s[end - 1] == '+') && after < n && s[after] == '\n')
                after++;
            line += count_nl(s + pos, after - pos);
            pos = after;
        } else if (kind == '%' && (q = lex_raw(P, s, n, pos, &line)) != 0) {
            pos = q;
        } else {
            push_tok(P, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, line, s + pos, 0);
            pos = lex_tag(P, s, n, pos, &line, kind == '%');
        }
        line_starting = pos > 0 && s[pos - 1] == '\n';
    }
    push_tok(P, T_EOF, line, "", 0);
}

/* ---- token helpers ---- */

static jtok *cur(parser *P) { return &P->tok[P->pos]; }
static jtok *peek(parser *P, size_t k) { return P->pos + k < P->ntok ? &P->tok[P->pos + k] : &P->tok[P->ntok - 1]; }
static int tok_is(const jtok *t, ttype ty, const char *text) {
    return t->t == ty && (!text || (t->n == strlen(text) && memcmp(t->p, text, t->n) == 0));
}
static int is_op(parser *P, const char *op) { return tok_is(cur(P), T_OP, op); }
static int is_name(parser *P, const char *nm) { return tok_is(cur(P), T_NAME, nm); }
static int skip_op(parser *P, const char *op) {
    if (!is_op(P, op)) return 0;
    P->pos++;
    return 1;
}
static int skip_name(parser *P, const char *nm) {
    if (!is_name(P, nm)) return 0;
    P->pos++;
    return 1;
}

static const char *tok_desc(const jtok *t) {
    switch (t->t) {
    case T_BLOCK_END: return "end of statement block";
    case T_VAR_END: return "end of print statement";
    case T_EOF: return "end of template";
    default: return NULL;
    }
}

static _Noreturn void unexpected(parser *P, const char *wanted) {
    jtok *t = cur(P);
    const char *d = tok_desc(t);
    if (d) jthrow(P->e, t->line, "expected %s, got '%s'", wanted, d);
    jthrow(P->e, t->line, "expected %s, got '%.*s'", wanted, (int)(t->n > 40 ? 40 : t->n), t->p);
}

static void expect_op(parser *P, const char *op) {
    if (!skip_op(P, op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        unexpected(P, w);
    }
}

static const char *expect_name(parser *P) {
    if (cur(P)->t != T_NAME) unexpected(P, "a name");
    jtok *t = &P->tok[P->pos++];
    return ja_strndup(P->a, t->p, t->n);
}

static void expect_block_end(parser *P) {
    if (cur(P)->t != T_BLOCK_END) unexpected(P, "end of statement block");
    P->pos++;
}

static jnode *node(parser *P, jkind k, int line) {
    jnode *n = ja_alloc(P->a, sizeof *n);
    n->k = k;
    n->line = line;
    return n;
}

/* A growable array of node pointers during parsing. */
typedef struct nlist {
    jnode **a;
    size_t n, cap;
} nlist;

static void nl_push(parser *P, nlist *l, jnode *x) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        jnode **a = ja_alloc(P->a, cap * sizeof *a);
        if (l->n) memcpy(a, l->a, l->n * sizeof *a);
        l->a = a;
        l->cap = cap;
    }
    l->a[l->n++] = x;
}

static void enter(parser *P) {
    if (++P->depth > MAX_NESTING) jthrow(P->e, cur(P)->line, "template nests deeper than %d levels", MAX_NESTING);
}

/* ---- expressions ---- */

static jnode *parse_expr(parser *P);
static jnode *parse_or(parser *P);
static jnode *parse_unary(parser *P, int with_filter);
static jnode *parse_primary(parser *P);
static jnode *parse_postfix(parser *P, jnode *n);

static jnode *constant(parser *P, int line, jv *v) {
    jnode *n = node(P, E_CONST, line);
    n->cval = v;
    return n;
}

/* Call arguments after '(': positional, then name=value; fills list/names/list2. */
static void parse_call_args(parser *P, jnode *n) {
    nlist args = {0}, kwv = {0};
    const char **names = NULL;
    size_t nn = 0, cap = 0;
    while (!is_op(P, ")")) {
        if (args.n + kwv.n) expect_op(P, ",");
        if (is_op(P, ")")) break;
        if (cur(P)->t == T_NAME && tok_is(peek(P, 1), T_OP, "=")) {
            const char *nm = expect_name(P);
            P->pos++;
            if (nn == cap) {
                cap = cap ? cap * 2 : 4;
                const char **a = ja_alloc(P->a, cap * sizeof *a);
                if (nn) memcpy(a, names, nn * sizeof *a);
                names = a;
            }
            names[nn++] = nm;
            nl_push(P, &kwv, parse_expr(P));
        } else {
            if (kwv.n) jthrow(P->e, cur(P)->line, "positional argument follows keyword argument");
            nl_push(P, &args, parse_expr(P));
        }
    }
    expect_op(P, ")");
    n->list = args.a;
    n->n = args.n;
    n->list2 = kwv.a;
    n->n2 = kwv.n;
    n->names = names;
    n->nn = nn;
}

/* A dotted filter or test name, for "|name" and "is name". */
static const char *dotted_name(parser *P) {
    const char *nm = expect_name(P);
    while (is_op(P, ".") && peek(P, 1)->t == T_NAME) {
        P->pos++;
        const char *more = expect_name(P);
        size_t a = strlen(nm), b = strlen(more);
        char *j = ja_alloc(P->a, a + b + 2);
        memcpy(j, nm, a);
        j[a] = '.';
        memcpy(j + a + 1, more, b);
        nm = j;
    }
    return nm;
}

static jnode *parse_filter(parser *P, jnode *input, int line) {
    jnode *f = node(P, E_FILTER, line);
    f->a = input;
    f->name = dotted_name(P);
    f->op = jinja_lookup_name(jinja_filter_names, f->name);
    if (f->op < 0) {
        if (!P->soft) jthrow(P->e, line, "No filter named '%s'.", f->name);
        f->flag |= JF_UNKNOWN;
    }
    if (skip_op(P, "(")) parse_call_args(P, f);
    return f;
}

static jnode *parse_test(parser *P, jnode *input, int line) {
    jnode *t = node(P, E_TEST, line);
    t->a = input;
    if (skip_name(P, "not")) t->flag |= JF_NEGATED;
    t->name = dotted_name(P);
    t->op = jinja_lookup_name(jinja_test_names, t->name);
    if (t->op < 0) {
        if (!P->soft) jthrow(P->e, line, "No test named '%s'.", t->name);
        t->flag |= JF_UNKNOWN;
    }
    jtok *c = cur(P);
    if (skip_op(P, "(")) {
        parse_call_args(P, t);
    } else if ((c->t == T_NAME || c->t == T_STRING || c->t == T_INT || c->t == T_FLOAT || tok_is(c, T_OP, "(") ||
                tok_is(c, T_OP, "[") || tok_is(c, T_OP, "{")) &&
               !tok_is(c, T_NAME, "else") && !tok_is(c, T_NAME, "or") && !tok_is(c, T_NAME, "and")) {
        if (tok_is(c, T_NAME, "is")) jthrow(P->e, c->line, "You cannot chain multiple tests with is");
        jnode *arg = parse_postfix(P, parse_primary(P));
        t->list = ja_alloc(P->a, sizeof(jnode *));
        t->list[0] = arg;
        t->n = 1;
    }
    return t;
}

/* Filters, tests and calls after a unary expression. */
static jnode *parse_filter_expr(parser *P, jnode *n) {
    for (;;) {
        int line = cur(P)->line;
        if (skip_op(P, "|"))
            n = parse_filter(P, n, line);
        else if (skip_name(P, "is"))
            n = parse_test(P, n, line);
        else if (skip_op(P, "(")) {
            jnode *c = node(P, E_CALL, line);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else
            return n;
    }
}

static jnode *parse_subscript(parser *P, jnode *obj, int line) {
    jnode *parts[3] = {NULL, NULL, NULL};
    int k = 0, sliced = 0;
    for (;;) {
        if (is_op(P, ":")) {
            P->pos++;
            if (++k > 2) jthrow(P->e, line, "too many ':' in a slice");
            sliced = 1;
            continue;
        }
        if (is_op(P, "]")) break;
        if (parts[k]) unexpected(P, "']'");
        parts[k] = parse_expr(P);
        if (!sliced && is_op(P, ",")) { /* x[a, b]: a tuple key */
            jnode *tup = node(P, E_TUPLE, line);
            nlist items = {0};
            nl_push(P, &items, parts[0]);
            while (skip_op(P, ",") && !is_op(P, "]")) nl_push(P, &items, parse_expr(P));
            tup->list = items.a;
            tup->n = items.n;
            parts[0] = tup;
        }
    }
    if (!sliced && !parts[0]) unexpected(P, "an expression");
    expect_op(P, "]");
    jnode *n = node(P, sliced ? E_SLICE : E_ITEM, line);
    n->a = obj;
    n->b = parts[0];
    if (sliced) {
        n->c = parts[1];
        n->d = parts[2];
    }
    return n;
}

static jnode *parse_postfix(parser *P, jnode *n) {
    for (;;) {
        int line = cur(P)->line;
        if (skip_op(P, ".")) {
            jtok *t = cur(P);
            if (t->t == T_NAME) {
                jnode *a = node(P, E_ATTR, line);
                a->a = n;
                a->name = expect_name(P);
                n = a;
            } else if (t->t == T_INT) {
                jnode *a = node(P, E_ITEM, line);
                a->a = n;
                a->b = constant(P, line, jv_int(P->a, t->i));
                P->pos++;
                n = a;
            } else
                unexpected(P, "a name or number after '.'");
        } else if (skip_op(P, "[")) {
            n = parse_subscript(P, n, line);
        } else if (skip_op(P, "(")) {
            jnode *c = node(P, E_CALL, line);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else
            return n;
    }
}

/* Items up to a closing bracket: [a, b], (a, b), {k: v}. */
static jnode *parse_list_like(parser *P, jkind k, const char *close, int line) {
    jnode *n = node(P, k, line);
    nlist items = {0}, vals = {0};
    while (!is_op(P, close)) {
        if (items.n) expect_op(P, ",");
        if (is_op(P, close)) break;
        nl_push(P, &items, parse_expr(P));
        if (k == E_DICT) {
            expect_op(P, ":");
            nl_push(P, &vals, parse_expr(P));
        }
    }
    expect_op(P, close);
    n->list = items.a;
    n->n = items.n;
    n->list2 = vals.a;
    n->n2 = vals.n;
    return n;
}

static jnode *parse_primary(parser *P) {
    enter(P);
    jtok *t = cur(P);
    int line = t->line;
    jnode *n;
    if (t->t == T_NAME) {
        P->pos++;
        if (tok_is(t, T_NAME, "true") || tok_is(t, T_NAME, "True"))
            n = constant(P, line, jv_bool(P->a, 1));
        else if (tok_is(t, T_NAME, "false") || tok_is(t, T_NAME, "False"))
            n = constant(P, line, jv_bool(P->a, 0));
        else if (tok_is(t, T_NAME, "none") || tok_is(t, T_NAME, "None"))
            n = constant(P, line, jv_none(P->a));
        else {
            n = node(P, E_NAME, line);
            n->name = ja_strndup(P->a, t->p, t->n);
        }
    } else if (t->t == T_STRING) {
        jbuf b; /* adjacent literals concatenate */
        jb_init(&b, P->a, (size_t)-1);
        while (cur(P)->t == T_STRING) {
            jb_put(&b, cur(P)->p, cur(P)->n);
            P->pos++;
        }
        n = constant(P, line, jv_str(P->a, b.p ? b.p : "", b.n));
    } else if (t->t == T_INT) {
        P->pos++;
        n = constant(P, line, jv_int(P->a, t->i));
    } else if (t->t == T_FLOAT) {
        P->pos++;
        n = constant(P, line, jv_float(P->a, t->f));
    } else if (skip_op(P, "(")) {
        if (skip_op(P, ")")) {
            n = node(P, E_TUPLE, line);
        } else {
            n = parse_expr(P);
            if (is_op(P, ",")) {
                jnode *tup = node(P, E_TUPLE, line);
                nlist items = {0};
                nl_push(P, &items, n);
                while (skip_op(P, ",") && !is_op(P, ")")) nl_push(P, &items, parse_expr(P));
                tup->list = items.a;
                tup->n = items.n;
                n = tup;
            }
            expect_op(P, ")");
        }
    } else if (skip_op(P, "[")) {
        n = parse_list_like(P, E_LIST, "]", line);
    } else if (skip_op(P, "{")) {
        n = parse_list_like(P, E_DICT, "}", line);
    } else
        unexpected(P, "an expression");
    P->depth--;
    return n;
}

static jnode *parse_unary(parser *P, int with_filter) {
    enter(P);
    int line = cur(P)->line;
    jnode *n;
    if (skip_op(P, "-")) {
        n = node(P, E_NEG, line);
        n->a = parse_unary(P, 0);
    } else if (skip_op(P, "+")) {
        n = node(P, E_POS, line);
        n->a = parse_unary(P, 0);
    } else
        n = parse_postfix(P, parse_primary(P));
    if (with_filter) n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static jnode *binop(parser *P, int op, int line, jnode *a, jnode *b) {
    jnode *n = node(P, E_BIN, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(parser *P) {
    jnode *n = parse_unary(P, 1);
    while (is_op(P, "**")) {
        int line = cur(P)->line;
        P->pos++;
        n = binop(P, 'p', line, n, parse_unary(P, 1));
    }
    return n;
}

static jnode *parse_math2(parser *P) {
    jnode *n = parse_pow(P);
    for (;;) {
        int line = cur(P)->line, op;
        if (is_op(P, "*"))
            op = '*';
        else if (is_op(P, "/"))
            op = '/';
        else if (is_op(P, "//"))
            op = 'f';
        else if (is_op(P, "%"))
            op = '%';
        else
            return n;
        P->pos++;
        n = binop(P, op, line, n, parse_pow(P));
    }
}

static jnode *parse_concat(parser *P) {
    jnode *n = parse_math2(P);
    while (is_op(P, "~")) {
        int line = cur(P)->line;
        P->pos++;
        n = binop(P, '~', line, n, parse_math2(P));
    }
    return n;
}

static jnode *parse_math1(parser *P) {
    jnode *n = parse_concat(P);
    for (;;) {
        int line = cur(P)->line, op;
        if (is_op(P, "+"))
            op = '+';
        else if (is_op(P, "-"))
            op = '-';
        else
            return n;
        P->pos++;
        n = binop(P, op, line, n, parse_concat(P));
    }
}

static jnode *parse_compare(parser *P) {
    int line = cur(P)->line;
    jnode *first = parse_math1(P);
    nlist operands = {0};
    int *ops = NULL;
    size_t cap = 0;
    for (;;) {
        int op;
        if (is_op(P, "=="))
            op = CMP_EQ;
        else if (is_op(P, "!="))
            op = CMP_NE;
        else if (is_op(P, "<"))
            op = CMP_LT;
        else if (is_op(P, "<="))
            op = CMP_LE;
        else if (is_op(P, ">"))
            op = CMP_GT;
        else if (is_op(P, ">="))
            op = CMP_GE;
        else if (is_name(P, "in"))
            op = CMP_IN;
        else if (is_name(P, "not") && tok_is(peek(P, 1), T_NAME, "in")) {
            op = CMP_NOTIN;
            P->pos++;
        } else
            break;
        P->pos++;
        if (operands.n == cap) {
            cap = cap ? cap * 2 : 4;
            int *a = ja_alloc(P->a, cap * sizeof *a);
            if (operands.n) memcpy(a, ops, operands.n * sizeof *a);
            ops = a;
        }
        ops[operands.n] = op;
        nl_push(P, &operands, parse_math1(P));
    }
    if (!operands.n) return first;
    jnode *n = node(P, E_CMP, line);
    n->a = first;
    n->list = operands.a;
    n->n = operands.n;
    n->ops = ops;
    return n;
}

static jnode *parse_not(parser *P) {
    if (is_name(P, "not")) {
        int line = cur(P)->line;
        P->pos++;
        enter(P);
        jnode *n = node(P, E_NOT, line);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static jnode *parse_and(parser *P) {
    jnode *n = parse_not(P);
    while (is_name(P, "and")) {
        jnode *x = node(P, E_AND, cur(P)->line);
        P->pos++;
        x->a = n;
        x->b = parse_not(P);
        n = x;
    }
    return n;
}

static jnode *parse_or(parser *P) {
    jnode *n = parse_and(P);
    while (is_name(P, "or")) {
        jnode *x = node(P, E_OR, cur(P)->line);
        P->pos++;
        x->a = n;
        x->b = parse_and(P);
        n = x;
    }
    return n;
}

/* a if cond else b (else optional: undefined). */
static jnode *parse_expr(parser *P) {
    enter(P);
    jnode *n = parse_or(P);
    while (is_name(P, "if")) {
        jnode *c = node(P, E_COND, cur(P)->line);
        P->pos++;
        P->soft++;
        c->a = n;
        c->b = parse_or(P);
        if (skip_name(P, "else")) c->c = parse_expr(P);
        P->soft--;
        n = c;
    }
    P->depth--;
    return n;
}

/* An expression that may be a bare tuple: "a, b" (set values, for iterables). */
static jnode *parse_tuple_expr(parser *P, int with_cond) {
    int line = cur(P)->line;
    jnode *n = with_cond ? parse_expr(P) : parse_or(P);
    if (!is_op(P, ",")) return n;
    jnode *tup = node(P, E_TUPLE, line);
    nlist items = {0};
    nl_push(P, &items, n);
    while (skip_op(P, ",")) {
        if (cur(P)->t == T_BLOCK_END || cur(P)->t == T_VAR_END || is_name(P, "if")) break;
        nl_push(P, &items, with_cond ? parse_expr(P) : parse_or(P));
    }
    tup->list = items.a;
    tup->n = items.n;
    return tup;
}

/* ---- statements ---- */

static jnode *parse_body(parser *P, const char *const *ends, const char *innermost, const char **which);

/* Names for for-loop targets and "set a, b = ...": one, or several split by commas. */
static void parse_targets(parser *P, jnode *n) {
    const char **names = ja_alloc(P->a, 16 * sizeof *names);
    size_t nn = 0;
    int paren = skip_op(P, "(");
    do {
        if (nn == 16) jthrow(P->e, cur(P)->line, "too many targets");
        names[nn++] = expect_name(P);
    } while (skip_op(P, ","));
    if (paren) expect_op(P, ")");
    n->names = names;
    n->nn = nn;
}

static jnode *parse_if(parser *P, int line) {
    jnode *n = node(P, N_IF, line);
    P->soft++;
    n->a = parse_tuple_expr(P, 1);
    expect_block_end(P);
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    const char *which;
    jnode *body = parse_body(P, ends, "if", &which);
    n->list = body->list;
    n->n = body->n;
    if (strcmp(which, "elif") == 0) {
        n->list2 = ja_alloc(P->a, sizeof(jnode *));
        n->list2[0] = parse_if(P, cur(P)->line);
        n->n2 = 1;
    } else {
        if (strcmp(which, "else") == 0) {
            expect_block_end(P);
            static const char *const end2[] = {"endif", NULL};
            jnode *els = parse_body(P, end2, "if", &which);
            n->list2 = els->list;
            n->n2 = els->n;
        }
        expect_block_end(P);
    }
    P->soft--;
    return n;
}

static jnode *parse_for(parser *P, int line) {
    jnode *n = node(P, N_FOR, line);
    parse_targets(P, n);
    if (!skip_name(P, "in")) unexpected(P, "'in'");
    n->a = parse_tuple_expr(P, 0);
    int soft = P->soft;
    P->soft = 0; /* jinja2 gives loop bodies a frame of their own */
    if (skip_name(P, "if")) n->b = parse_expr(P);
    if (skip_name(P, "recursive")) jthrow(P->e, line, "recursive loops are not supported");
    expect_block_end(P);
    static const char *const ends[] = {"endfor", "else", NULL};
    const char *which;
    int in_loop = P->in_loop;
    P->in_loop = 1;
    jnode *body = parse_body(P, ends, "for", &which);
    P->in_loop = in_loop;
    n->list = body->list;
    n->n = body->n;
    if (strcmp(which, "else") == 0) {
        expect_block_end(P);
        static const char *const end2[] = {"endfor", NULL};
        jnode *els = parse_body(P, end2, "for", &which);
        n->list2 = els->list;
        n->n2 = els->n;
    }
    expect_block_end(P);
    P->soft = soft;
    return n;
}

static jnode *parse_set(parser *P, int line) {
    jnode *target = node(P, E_NAME, line);
    target->name = expect_name(P);
    if (skip_op(P, ".")) { /* ns.attr */
        jnode *attr = node(P, E_ATTR, line);
        attr->a = target;
        attr->name = expect_name(P);
        target = attr;
    } else if (is_op(P, ",")) {
        jnode *tup = node(P, E_TUPLE, line);
        nlist items = {0};
        nl_push(P, &items, target);
        while (skip_op(P, ",")) {
            jnode *t = node(P, E_NAME, cur(P)->line);
            t->name = expect_name(P);
            nl_push(P, &items, t);
        }
        tup->list = items.a;
        tup->n = items.n;
        target = tup;
    }
    if (skip_op(P, "=")) {
        jnode *n = node(P, N_SET, line);
        n->a = target;
        n->b = parse_tuple_expr(P, 1);
        expect_block_end(P);
        return n;
    }
    if (target->k != E_NAME) unexpected(P, "'='");
    jnode *n = node(P, N_SETBLOCK, line);
    n->a = target;
    int l2 = cur(P)->line;
    if (skip_op(P, "|")) { /* {% set x | filter %}: the filter chain runs on the body */
        jnode *f = parse_filter(P, NULL, l2);
        while (skip_op(P, "|")) f = parse_filter(P, f, cur(P)->line);
        n->c = f;
    }
    expect_block_end(P);
    static const char *const ends[] = {"endset", NULL};
    const char *which;
    jnode *body = parse_body(P, ends, "set", &which);
    n->list = body->list;
    n->n = body->n;
    expect_block_end(P);
    return n;
}

/* Parameters of a macro or call block: (a, b=default, ...). */
static void parse_params(parser *P, jnode *n) {
    nlist defs = {0};
    const char **names = NULL;
    size_t cap = 0;
    expect_op(P, "(");
    while (!is_op(P, ")")) {
        if (n->nn) expect_op(P, ",");
        if (is_op(P, ")")) break;
        if (n->nn == cap) {
            cap = cap ? cap * 2 : 4;
            const char **a = ja_alloc(P->a, cap * sizeof *a);
            if (n->nn) memcpy(a, names, n->nn * sizeof *a);
            names = a;
        }
        names[n->nn++] = expect_name(P);
        jnode *def = NULL;
        if (skip_op(P, "="))
            def = parse_expr(P);
        else if (defs.n && defs.a[defs.n - 1])
            jthrow(P->e, cur(P)->line, "non-default argument follows default argument");
        nl_push(P, &defs, def);
    }
    expect_op(P, ")");
    n->names = names;
    n->list2 = defs.a;
    n->n2 = defs.n;
}

static jnode *parse_macro(parser *P, int line) {
    jnode *n = node(P, N_MACRO, line);
    n->name = expect_name(P);
    int soft = P->soft, in_loop = P->in_loop;
    P->soft = P->in_loop = 0;
    parse_params(P, n);
    expect_block_end(P);
    static const char *const ends[] = {"endmacro", NULL};
    const char *which;
    jnode *body = parse_body(P, ends, "macro", &which);
    P->in_loop = in_loop;
    n->list = body->list;
    n->n = body->n;
    if (cur(P)->t == T_NAME) P->pos++; /* {% endmacro name %} */
    expect_block_end(P);
    P->soft = soft;
    return n;
}

/* {% call(params) macro(args) %}body{% endcall %}: the body becomes caller(). */
static jnode *parse_call_block(parser *P, int line) {
    jnode *n = node(P, N_CALLBLOCK, line);
    if (is_op(P, "(")) parse_params(P, n);
    int soft = P->soft, in_loop = P->in_loop;
    P->soft = P->in_loop = 0;
    n->a = parse_expr(P);
    if (n->a->k != E_CALL) jthrow(P->e, line, "expected call");
    expect_block_end(P);
    static const char *const ends[] = {"endcall", NULL};
    const char *which;
    jnode *body = parse_body(P, ends, "call", &which);
    P->in_loop = in_loop;
    n->list = body->list;
    n->n = body->n;
    expect_block_end(P);
    P->soft = soft;
    return n;
}

static jnode *parse_filter_block(parser *P, int line) {
    jnode *n = node(P, N_FILTERBLOCK, line);
    jnode *f = parse_filter(P, NULL, line);
    while (skip_op(P, "|")) f = parse_filter(P, f, cur(P)->line);
    n->a = f;
    expect_block_end(P);
    static const char *const ends[] = {"endfilter", NULL};
    const char *which;
    jnode *body = parse_body(P, ends, "filter", &which);
    n->list = body->list;
    n->n = body->n;
    expect_block_end(P);
    return n;
}

static jnode *parse_statement(parser *P) {
    jtok *t = cur(P);
    int line = t->line;
    if (t->t != T_NAME) unexpected(P, "a tag name");
    enter(P);
    jnode *n;
    if (skip_name(P, "if"))
        n = parse_if(P, line);
    else if (skip_name(P, "for"))
        n = parse_for(P, line);
    else if (skip_name(P, "set"))
        n = parse_set(P, line);
    else if (skip_name(P, "macro"))
        n = parse_macro(P, line);
    else if (skip_name(P, "call"))
        n = parse_call_block(P, line);
    else if (skip_name(P, "filter"))
        n = parse_filter_block(P, line);
    else if (skip_name(P, "break") || skip_name(P, "continue")) {
        int is_break = tok_is(t, T_NAME, "break");
        if (!P->in_loop) jthrow(P->e, line, "'%s' outside loop", is_break ? "break" : "continue");
        n = node(P, is_break ? N_BREAK : N_CONTINUE, line);
        expect_block_end(P);
    } else if (skip_name(P, "generation")) { /* transformers' assistant-mask marker: renders its body */
        expect_block_end(P);
        static const char *const ends[] = {"endgeneration", NULL};
        const char *which;
        int in_loop = P->in_loop;
        P->in_loop = 0; /* transformers runs the body as a caller(): a function of its own */
        n = parse_body(P, ends, "generation", &which);
        P->in_loop = in_loop;
        expect_block_end(P);
    } else
        jthrow(P->e, line, "Encountered unknown tag '%.*s'.", (int)(t->n > 40 ? 40 : t->n), t->p);
    P->depth--;
    return n;
}

/* Nodes up to one of the end tags (NULL ends: the template's end). On
 * return the end tag's name has been read and *which names it; the caller
 * reads the rest of that tag. */
static jnode *parse_body(parser *P, const char *const *ends, const char *innermost, const char **which) {
    nlist items = {0};
    int line0 = cur(P)->line;
    for (;;) {
        jtok *t = cur(P);
        if (t->t == T_EOF) {
            if (!ends) break;
            jthrow(P->e, t->line,
                   "Unexpected end of template. Jinja was looking for the following tags: '%s'. The innermost "
                   "block that needs to be closed is '%s'.",
                   ends[0], innermost);
        }
        if (t->t == T_DATA) {
            jnode *n = node(P, N_TEXT, t->line);
            n->cval = jv_str(P->a, t->p, t->n);
            nl_push(P, &items, n);
            P->pos++;
        } else if (t->t == T_VAR_BEGIN) {
            P->pos++;
            jnode *n = node(P, N_OUT, t->line);
            n->a = parse_tuple_expr(P, 1);
            if (cur(P)->t != T_VAR_END) unexpected(P, "end of print statement");
            P->pos++;
            nl_push(P, &items, n);
        } else if (t->t == T_BLOCK_BEGIN) {
            P->pos++;
            jtok *nm = cur(P);
            int ended = 0;
            for (size_t k = 0; ends && ends[k]; k++)
                if (tok_is(nm, T_NAME, ends[k])) {
                    *which = ends[k];
                    P->pos++;
                    ended = 1;
                    break;
                }
            if (ended) break;
            if (nm->t == T_NAME && nm->n > 3 &&
                (memcmp(nm->p, "end", 3) == 0 || tok_is(nm, T_NAME, "elif") || tok_is(nm, T_NAME, "else")))
                jthrow(P->e, nm->line, "Encountered unknown tag '%.*s'.%s%s%s", (int)(nm->n > 40 ? 40 : nm->n), nm->p,
                       ends ? " Jinja was looking for the following tags: '" : "", ends ? ends[0] : "",
                       ends ? "'." : "");
            nl_push(P, &items, parse_statement(P));
        } else
            unexpected(P, "template data");
    }
    jnode *body = node(P, N_BODY, line0);
    body->list = items.a;
    body->n = items.n;
    return body;
}

/* Newlines normalized to "\n" and one trailing newline dropped, as jinja2's lexer does. */
static char *normalize(jarena *a, const char *src, size_t len, size_t *out_len) {
    char *s = ja_alloc(a, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else
            s[n++] = src[i];
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    *out_len = n;
    return s;
}

void jparse(moex_jinja *t, const char *src, size_t len, jerr *e) {
    parser P = {.a = &t->arena, .e = e};
    size_t n;
    char *s = normalize(&t->arena, src, len, &n);
    lex(&P, s, n);
    const char *which = NULL;
    t->root = parse_body(&P, NULL, NULL, &which);
}
