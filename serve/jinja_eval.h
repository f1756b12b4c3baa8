/* Shared by jinja_eval.c (statements, expressions, calls) and
 * jinja_builtins.c (filters, tests, methods, global functions): the render
 * state and the helpers both sides use. Private to the serve module. */
#ifndef MOEX_SERVE_JINJA_EVAL_H
#define MOEX_SERVE_JINJA_EVAL_H

#include <stdarg.h>

#include "serve/jinja_impl.h"

enum {
    MAX_CALL_DEPTH = 200,      /* nested macro calls */
    MAX_ITERATIONS = 10000000, /* loop iterations in one render */
    MAX_RANGE = 100000,        /* the sandbox's range() limit */
};

enum { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE };

/* Variables of a template, a loop iteration or a macro call; lookups walk up.
 * A loop reuses one scope for all its iterations (emptied each time) unless a
 * macro defined in it holds on to it; its `loop` variable is made only when
 * the body reads it. */
typedef struct jscope {
    struct jscope *parent;
    const char **names;
    jv **vals;
    size_t n, cap;
    int captured; /* a macro or call block defined here keeps it as its closure */
    int is_loop;
    jv **loop_items; /* the iteration this scope is: what loop.* describes */
    size_t loop_n, loop_i;
} jscope;

typedef struct rctx {
    jarena *a;
    jerr *e;
    long long now;  /* what strftime_now formats */
    size_t max_out; /* the bound on the output and on every captured string */
    long long iterations;
    int depth; /* expression and macro nesting */
} rctx;

/* Arguments of a call, filter or test (after the filtered value). */
typedef struct jargs {
    int line;
    size_t n, nkw;
    jv **v, **kw;
    const char *const *kwnames;
} jargs;

_Noreturn void rfail(rctx *R, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
_Noreturn void undef_fail(rctx *R, int line, const jv *u);
const char *obj_type_repr(rctx *R, const jv *v);
jv *undef_attr(rctx *R, const jv *obj, const char *name);
jv *undef_element(rctx *R, const jv *obj, const jv *key);

jv *eval(rctx *R, const jnode *n, jscope *sc);
int exec_body(rctx *R, jnode *const *body, size_t n, jscope *sc, jbuf *out);
void scope_set(rctx *R, jscope *s, const char *name, jv *v);
jv *call_macro(rctx *R, const jv *m, const jargs *A, jv *caller);

const char *to_cstr(rctx *R, const jv *v, size_t *n); /* Python str() */
jv *to_str(rctx *R, const jv *v);
jv **iterate(rctx *R, int line, const jv *v, size_t *n);
size_t value_len(rctx *R, int line, const jv *v);
jv *get_attr(rctx *R, int line, jv *obj, const char *name);
jv *get_item(rctx *R, int line, jv *obj, jv *key);
jv *binop(rctx *R, int line, int op, jv *a, jv *b);
int compare_order(rctx *R, int line, const char *op, const jv *a, const jv *b);
int contains(rctx *R, int line, const jv *hay, const jv *needle);

/* jinja_builtins.c */
jv *percent_format(rctx *R, int line, const jv *fmt, jv *args); /* str % args */
jv *html_escape(rctx *R, jv *x);                                /* markupsafe.escape: a Markup string unchanged */
jv *keep_safe(jv *result, const jv *from);                      /* result is Markup when from is */
jv *apply_filter(rctx *R, int id, jv *x, const jargs *A);
int apply_test(rctx *R, int id, jv *x, const jargs *A);
jv *method_lookup(rctx *R, jv *obj, const char *name); /* a bound method, an unsafe-method undefined, or NULL */
jv *loop_cycle_method(rctx *R, jv *loop);              /* loop.cycle(a, b, ...) */
jv *global_lookup(rctx *R, const char *name);          /* range, namespace, raise_exception, ... or NULL */
jv *call_function(rctx *R, jv *f, const jargs *A);

#endif
