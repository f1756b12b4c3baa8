/* Internals of the Jinja chat-template interpreter (serve/jinja.h), shared by
 * jinja_value.c (values, Python-compatible printing, JSON), jinja_parse.c
 * (lexer and parser) and jinja_eval.c (evaluation, filters, tests, methods).
 *
 * Memory: everything a parse or a render allocates lives in one arena that is
 * freed as a whole, and the arena has a byte limit. Errors: a failing parse or
 * render longjmps to its entry point (jthrow) with the message already in the
 * caller's moex_error; nothing needs unwinding because the arena owns it all.
 * Private to the serve module. */
#ifndef MOEX_SERVE_JINJA_IMPL_H
#define MOEX_SERVE_JINJA_IMPL_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "serve/jinja.h"

/* ---- failure: one jump target per parse or render ---- */
typedef struct jerr {
    jmp_buf jb;
    moex_error *err;
} jerr;

/* Fails the parse or render: err->msg becomes "line N: <msg>" (line > 0) or
 * "<msg>" (line 0), then jumps back to the entry point. */
_Noreturn void jthrow(jerr *e, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- arena ---- */
typedef struct jblk jblk;
enum { JA_SMALL_INT_MIN = -16, JA_SMALL_INT_MAX = 1024 };

typedef struct jv jv;

typedef struct jarena {
    jblk *head;
    size_t total, limit; /* bytes taken from malloc, and the most allowed */
    jerr *fail;          /* where running out of room jumps */
    /* Values that are never changed once made, shared instead of allocated
     * again (loops make many): small ints, the two bools, None. */
    jv *small_int[JA_SMALL_INT_MAX - JA_SMALL_INT_MIN];
    jv *bools[2], *none;
} jarena;

void *ja_alloc(jarena *a, size_t n); /* zeroed; never NULL (jumps instead) */
void ja_free_all(jarena *a);
char *ja_strndup(jarena *a, const char *s, size_t n);

/* ---- values ---- */
typedef enum {
    JV_UNDEF, /* jinja2's default Undefined: prints "", fails when used */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,  /* bytes, normally UTF-8 */
    JV_LIST, /* list, tuple, generator or dict view (jv.tuple, jv.view) */
    JV_DICT,
    JV_NS,    /* namespace(...): a dict whose attributes "set" may change */
    JV_FUNC,  /* a global function or a bound method */
    JV_MACRO, /* a macro, or a call block's caller */
    JV_LOOP   /* a for loop's "loop" */
} jtype;

typedef struct jnode jnode;

/* The buffer behind strings built by concatenation. The string whose bytes
 * end at `used` may be extended in place: "{% set ns.out = ns.out ~ x %}" in a
 * loop then costs amortized O(len(x)) instead of a copy of ns.out each time
 * (the arena frees nothing, so copies would be quadratic memory). Strings
 * made earlier keep their shorter length over the same bytes. */
typedef struct jsb {
    char *p;
    size_t used, cap;
} jsb;

/* How an undefined value came about: it decides the message an operation on
 * it fails with, exactly as jinja2's Undefined words it. */
enum { JU_NAME, JU_ATTR, JU_ELEMENT, JU_HINT };

/* What Python object a JV_LIST stands for beyond list and tuple: a
 * generator (what jinja2's map/select/items filters return: always true,
 * no len(), one pass only) or a dict view (dict.items()/keys()/values()). */
enum { JVIEW_NONE, JVIEW_GEN, JVIEW_ITEMS, JVIEW_KEYS, JVIEW_VALUES };

struct jv {
    jtype t;
    unsigned char tuple; /* JV_LIST that Python would print as a tuple */
    unsigned char view;  /* JV_LIST: JVIEW_* */
    unsigned char safe;  /* JV_STR: a markupsafe.Markup (from |safe or |e): adding a plain
                          * string to it HTML-escapes that string, as Python does */
    const char *gen_err; /* JVIEW_GEN: the error iterating it raises (jinja2 filters are lazy) */
    jsb *sb;             /* JV_STR made by concatenation: its buffer */
    union {
        int b;
        long long i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        struct {
            jv **a;
            size_t n, cap;
        } l;
        struct {
            jv **k, **v;
            size_t n, cap;
        } d; /* JV_DICT and JV_NS (namespace): insertion-ordered */
        struct {
            int id;
            jv *self; /* bound object of a method, NULL for a global function */
        } fn;
        struct {
            const jnode *node;  /* N_MACRO, or N_CALLBLOCK for a call block's caller */
            struct jscope *env; /* the scope it was defined in */
        } mac;
        struct {
            jv **items; /* what the loop walks (after its if filter) */
            size_t n, i;
        } loop; /* JV_LOOP: one iteration's loop variable; attributes computed on access */
        struct {
            int kind;         /* JU_* */
            const char *name; /* variable, attribute, element (as Python repr) or the hint */
            const char *objtype;
        } u;
    };
};

/* A growable byte buffer in the arena, bounded by cap. */
typedef struct jbuf {
    char *p;
    size_t n, cap_alloc, cap; /* cap: the most bytes it may hold */
    jarena *a;
    int line; /* where to blame an overflow */
} jbuf;

void jb_init(jbuf *b, jarena *a, size_t cap);
void jb_put(jbuf *b, const char *s, size_t n);
void jb_puts(jbuf *b, const char *s);
void jb_putc(jbuf *b, char c);
void jb_printf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

jv *jv_new(jarena *a, jtype t);
jv *jv_str(jarena *a, const char *p, size_t n); /* shares p */
jv *jv_cstr(jarena *a, const char *s);
jv *jv_int(jarena *a, long long i);
jv *jv_float(jarena *a, double f);
jv *jv_bool(jarena *a, int b);
jv *jv_none(jarena *a);
jv *jv_undef(jarena *a, int kind, const char *name, const char *objtype);
jv *jv_list(jarena *a, size_t cap);
void jv_list_push(jarena *a, jv *l, jv *x);
jv *jv_dict(jarena *a, jtype t); /* JV_DICT or JV_NS */
jv *jv_dict_get(const jv *d, const jv *key);
jv *jv_dict_gets(const jv *d, const char *key);
void jv_dict_set(jarena *a, jv *d, jv *key, jv *val);
jv *jv_from_cjson(jarena *a, const cJSON *j, int depth);

int jv_truthy(const jv *v);
int jv_equal(const jv *x, const jv *y);
const char *jv_type_name(const jv *v); /* Python's type name: "str", "int", "NoneType", ... */
int jv_is_number(const jv *v);         /* int, float or bool */
double jv_num(const jv *v);

/* Python str(v) and repr(v) appended to b; str of undefined is "". */
void jv_write_str(jbuf *b, const jv *v);
void jv_write_repr(jbuf *b, const jv *v);
void jv_write_float(jbuf *b, double f); /* Python's float repr: 1.0, 1e-05, 1e+16 */
/* json.dumps(v, ensure_ascii, indent, separators, sort_keys). indent < 0:
 * none. item_sep/key_sep NULL: Python's defaults for that indent. Returns -1
 * (message in *why) when v holds something JSON cannot (undefined, a macro). */
int jv_write_json(jbuf *b, const jv *v, int indent, const char *item_sep, const char *key_sep, int sort_keys,
                  int ensure_ascii, const char **why);

/* ---- UTF-8 helpers (Python str semantics on code points) ---- */
size_t ju_len(const char *s, size_t n);                /* code points; bytes of invalid UTF-8 count one each */
size_t ju_offset(const char *s, size_t n, size_t cpi); /* byte offset of code point cpi (n when past the end) */
uint32_t ju_decode(const char *s, size_t n, size_t *adv);
int ju_is_space(uint32_t cp); /* Python str.isspace() */

/* ---- AST ---- */
/* Statements (N_*) and expressions (E_*); struct jnode says which fields each uses. */
typedef enum {
    N_TEXT,        /* cval: template data */
    N_OUT,         /* {{ a }} */
    N_IF,          /* a: test, list: body, list2: else (an elif is an N_IF there) */
    N_FOR,         /* names: targets, a: iterable, b: "if" filter, list: body, list2: else */
    N_SET,         /* a: target (E_NAME, E_ATTR on a namespace, E_TUPLE), b: value */
    N_SETBLOCK,    /* a: target, c: filter chain or NULL, list: body */
    N_MACRO,       /* name, names: parameters, list2: defaults (NULL: none), list: body */
    N_CALLBLOCK,   /* a: the call, names/list2: caller's parameters, list: caller's body */
    N_FILTERBLOCK, /* a: filter chain (its innermost input NULL: the body), list: body */
    N_BREAK,
    N_CONTINUE,
    N_BODY,   /* list: statements (a template, a generation block) */
    E_CONST,  /* cval */
    E_NAME,   /* name */
    E_ATTR,   /* a.name */
    E_ITEM,   /* a[b] */
    E_SLICE,  /* a[b:c:d], each of b, c, d may be NULL */
    E_CALL,   /* a(list..., names=list2...) */
    E_FILTER, /* a | name(list..., names=list2...); op: filter id */
    E_TEST,   /* a is [not] name(list...); op: test id */
    E_BIN,    /* a op b */
    E_NEG,    /* -a */
    E_POS,    /* +a */
    E_NOT,    /* not a */
    E_AND,    /* a and b */
    E_OR,     /* a or b */
    E_COND,   /* a if b else c (c NULL: undefined) */
    E_LIST,   /* [list...] */
    E_TUPLE,  /* (list...) */
    E_DICT,   /* {list: list2, ...} */
    E_CMP     /* a ops[0] list[0] ops[1] list[1] ...: chained comparisons */
} jkind;

/* jnode.flag bits: a negated test ("is not"); a filter or test name jinja2
 * does not know, inside an if, where jinja2 fails only when it runs. */
enum { JF_NEGATED = 1, JF_UNKNOWN = 2 };

/* Comparison operators of E_CMP. */
enum { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

struct jnode {
    jkind k;
    int line;
    int op;   /* E_BIN: operator char ('+', '-', '*', '/', 'f' floordiv, '%', 'p' pow, '~'); filter/test id; */
    int flag; /* JF_* */
    const char *name;
    jv *cval;
    jnode *a, *b, *c, *d;
    jnode **list; /* body, args, items, dict keys */
    size_t n;
    jnode **list2; /* else body, kwarg values, dict values, macro defaults */
    size_t n2;
    const char **names; /* kwarg names, macro params, for targets */
    size_t nn;
    int *ops; /* E_CMP operators */
};

struct moex_jinja {
    jarena arena;
    jnode *root; /* N_BODY */
};

/* Parses into t->root (the arena is t->arena); jumps through e on error. */
void jparse(moex_jinja *t, const char *src, size_t len, jerr *e);

/* Filter and test names the parser resolves to ids (index into these lists). */
extern const char *const jinja_filter_names[];
extern const char *const jinja_test_names[];
int jinja_lookup_name(const char *const *names, const char *name);

#endif
