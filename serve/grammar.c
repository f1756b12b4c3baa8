/* GBNF grammars: the parser (text -> rules of elements) and the matcher.
 *
 * Representation. A grammar is a flat array of elements. Each rule has one or
 * more alternatives; an alternative is a run of elements ended by EL_END. An
 * element is a terminal (EL_CHARS: one code point out of a character class)
 * or a reference to a rule (EL_REF). Groups, repetitions and optionals are
 * turned into helper rules while parsing, so the matcher only knows these
 * three kinds.
 *
 * Matcher. The matcher is a pushdown automaton run on all parses at once: a
 * parse is a stack of grammar positions (top: the terminal that must match
 * the next code point; below it: where to continue when the rule on top
 * ends). Stacks are hash-consed persistent lists (a node is (position,
 * parent node), interned), so equal stacks are equal ids, pushing and popping
 * are O(1) and parses share their common tails. A set of stacks (sorted node
 * ids) is interned too, and the step "set S reads code point c" is cached:
 * the automaton is determinised lazily, as far as the text seen so far and the
 * vocabulary walks go. A step is then one table look-up (ASCII: a 128-entry
 * row per set; above: per interval of code points the set's stacks read
 * alike), which is what makes serve_grammar_mask fast: the vocabulary is a
 * byte trie walked depth-first, one look-up per trie edge, pruning a subtree
 * as soon as no stack survives, and taking a subtree whole when every byte in
 * it keeps the parse alive (inside a JSON string, most of the vocabulary).
 * The last few masks are kept: a position often comes back. Input is UTF-8,
 * matched by code point; a token may stop inside a character (the walk keeps
 * the partial character and allows it when some completion fits).
 *
 * Everything the matcher builds lives in an engine owned by one state (so
 * states of one grammar never share mutable data). Its memory is bounded: past
 * ENGINE_BUDGET bytes the engine is rebuilt from the sets still in use, and a
 * step that would give more than MAX_STACKS parses fails instead of growing. */
#include "serve/grammar.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    MAX_STACKS = 4096,              /* parses one state may track (ambiguous grammars fail past it) */
    MAX_EXPAND_WORK = 1 << 20,      /* rule expansions in one step */
    MAX_ELEMS = 1 << 17,            /* grammar size (elements, after expanding repetitions): a request's
                                       grammar is parsed on the network thread and per choice, ~80 bytes each */
    MAX_REPEAT = 1 << 16,           /* the largest m and n of {m,n} */
    MAX_NESTING = 200,              /* groups inside groups (the parser recurses) */
    MAX_TOKEN_BYTES = (1 << 24) - 1 /* the longest token text the trie stores */
};
/* Bytes of matcher caches per state before a rebuild (serve_grammar_set_cache_budget changes it: the tests make
 * it tiny to exercise the rebuild). */
#define ENGINE_BUDGET ((size_t)64 << 20)

/* ------------------------------------------------------------------ */
/* Small containers                                                     */
/* ------------------------------------------------------------------ */

/* Grows *p (an array of elsize-byte items with capacity *cap) to hold need items. */
static int grow(void *pp, size_t *cap, size_t need, size_t elsize) {
    void **p = pp;
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    void *q = realloc(*p, n * elsize);
    if (!q) return -1;
    *p = q;
    *cap = n;
    return 0;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* Open-addressing map from 64-bit keys (never UINT64_MAX) to int32 values. */
typedef struct {
    uint64_t *keys;
    int32_t *vals;
    size_t cap, n; /* cap: a power of two or 0 */
} u64map;

#define MAP_EMPTY UINT64_MAX

static int32_t u64map_get(const u64map *m, uint64_t k) {
    if (!m->cap) return -1;
    size_t mask = m->cap - 1;
    for (size_t i = mix64(k) & mask;; i = (i + 1) & mask) {
        if (m->keys[i] == k) return m->vals[i];
        if (m->keys[i] == MAP_EMPTY) return -1;
    }
}

static int u64map_put(u64map *m, uint64_t k, int32_t v);

static int u64map_rehash(u64map *m, size_t cap) {
    u64map nm = {malloc(cap * sizeof(uint64_t)), malloc(cap * sizeof(int32_t)), cap, 0};
    if (!nm.keys || !nm.vals) {
        free(nm.keys);
        free(nm.vals);
        return -1;
    }
    memset(nm.keys, 0xff, cap * sizeof(uint64_t));
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i] != MAP_EMPTY) u64map_put(&nm, m->keys[i], m->vals[i]);
    free(m->keys);
    free(m->vals);
    *m = nm;
    return 0;
}

/* Inserts or overwrites. -1 when out of memory. */
static int u64map_put(u64map *m, uint64_t k, int32_t v) {
    if ((m->n + 1) * 2 > m->cap && u64map_rehash(m, m->cap ? m->cap * 2 : 64) < 0) return -1;
    size_t mask = m->cap - 1;
    for (size_t i = mix64(k) & mask;; i = (i + 1) & mask) {
        if (m->keys[i] == k) {
            m->vals[i] = v;
            return 0;
        }
        if (m->keys[i] == MAP_EMPTY) {
            m->keys[i] = k;
            m->vals[i] = v;
            m->n++;
            return 0;
        }
    }
}

static void u64map_free(u64map *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h & ~1ULL; /* never MAP_EMPTY */
}

/* ------------------------------------------------------------------ */
/* The grammar                                                          */
/* ------------------------------------------------------------------ */

enum { EL_END, EL_REF, EL_CHARS };

typedef struct {
    int32_t kind; /* EL_* */
    int32_t arg;  /* EL_REF: rule index; EL_CHARS: class index */
} elem;

/* A set of code points: a bitmap for ASCII, sorted disjoint ranges above. */
typedef struct {
    uint64_t ascii[2];
    uint32_t off, n; /* ranges g->ranges[2*off .. 2*(off+n)) as (lo, hi) pairs, lo >= 128 */
} charclass;

struct serve_grammar {
    elem *el;
    int32_t n_el;
    int32_t *alt_start; /* alternative k begins at el[alt_start[k]] */
    int32_t *rule_alt;  /* rule r's alternatives: alt_start[rule_alt[r] .. rule_alt[r+1]) */
    int32_t n_rules;
    char **names;
    charclass *cls;
    int32_t n_cls;
    uint32_t *ranges;
    int32_t root;
    size_t cache_budget;  /* 0: ENGINE_BUDGET */
};

static bool class_has(const serve_grammar *g, int32_t c, uint32_t cp) {
    const charclass *k = &g->cls[c];
    if (cp < 128) return (k->ascii[cp >> 6] >> (cp & 63)) & 1;
    const uint32_t *r = g->ranges + 2 * (size_t)k->off;
    uint32_t lo = 0, hi = k->n; /* first range whose hi >= cp */
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (r[2 * mid + 1] < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < k->n && r[2 * lo] <= cp;
}

void serve_grammar_free(serve_grammar *g) {
    if (!g) return;
    for (int32_t i = 0; i < g->n_rules; i++) free(g->names[i]);
    free(g->names);
    free(g->el);
    free(g->alt_start);
    free(g->rule_alt);
    free(g->cls);
    free(g->ranges);
    free(g);
}

/* ------------------------------------------------------------------ */
/* The parser                                                           */
/* ------------------------------------------------------------------ */

typedef struct {
    elem *el; /* alternatives, each ended by EL_END */
    size_t n, cap;
    char *name;
    bool defined;
    bool helper;          /* made by the parser for a group or repetition */
    const char *first_use; /* where an undefined rule was first referenced */
} prule;

typedef struct {
    const char *src, *p;
    moex_error *err;
    prule *rules;
    size_t n_rules, cap_rules;
    u64map names; /* hash of a user rule's name -> rule index */
    charclass *cls;
    size_t n_cls, cap_cls;
    uint32_t *ranges; /* pairs */
    size_t n_ranges, cap_ranges;
    uint32_t *tmp; /* a class being parsed: pairs */
    size_t n_tmp, cap_tmp;
    size_t total_elems;
    int depth; /* groups open */
} parser;

/* Fails with "line L, column C: ..." for the text position at. */
static int parse_fail(parser *ps, const char *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int parse_fail(parser *ps, const char *at, const char *fmt, ...) {
    int line = 1, col = 1;
    for (const char *q = ps->src; q < at && *q; q++) {
        if (*q == '\n') {
            line++;
            col = 1;
        } else if (((uint8_t)*q & 0xC0) != 0x80) {
            col++;
        }
    }
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return moex_fail(ps->err, "grammar line %d, column %d: %s", line, col, msg);
}

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skips blanks and comments; newlines too when newline_ok. */
static void skip_space(parser *ps, bool newline_ok) {
    for (;;) {
        char c = *ps->p;
        if (c == ' ' || c == '\t') {
            ps->p++;
        } else if (c == '#') {
            while (*ps->p && *ps->p != '\n') ps->p++;
        } else if ((c == '\n' || c == '\r') && newline_ok) {
            ps->p++;
        } else {
            return;
        }
    }
}

static int add_rule(parser *ps, const char *name, size_t len, bool helper) {
    if (grow(&ps->rules, &ps->cap_rules, ps->n_rules + 1, sizeof(prule)) < 0) return moex_fail(ps->err, "out of memory");
    prule *r = &ps->rules[ps->n_rules];
    memset(r, 0, sizeof *r);
    r->name = malloc(len + 1);
    if (!r->name) return moex_fail(ps->err, "out of memory");
    memcpy(r->name, name, len);
    r->name[len] = 0;
    r->helper = helper;
    return (int)ps->n_rules++;
}

/* The index of the user rule called name[0..len), declaring it (undefined) when new. */
static int find_or_add_rule(parser *ps, const char *name, size_t len) {
    uint64_t h = hash_bytes(name, len);
    int32_t i = u64map_get(&ps->names, h);
    if (i >= 0 && strlen(ps->rules[i].name) == len && !memcmp(ps->rules[i].name, name, len)) return i;
    if (i >= 0) { /* a 64-bit hash collision: look the slow way */
        for (size_t k = 0; k < ps->n_rules; k++)
            if (!ps->rules[k].helper && strlen(ps->rules[k].name) == len && !memcmp(ps->rules[k].name, name, len))
                return (int)k;
    }
    int r = add_rule(ps, name, len, false);
    if (r < 0) return -1;
    if (i < 0 && u64map_put(&ps->names, h, r) < 0) return moex_fail(ps->err, "out of memory");
    return r;
}

/* A helper rule for a group or repetition inside rule `parent`: "parent_N". */
static int add_helper_rule(parser *ps, int parent) {
    char name[300];
    int n = snprintf(name, sizeof name, "%.200s_%zu", ps->rules[parent].name, ps->n_rules);
    return add_rule(ps, name, (size_t)n, true);
}

static int emit(parser *ps, int r, int32_t kind, int32_t arg) {
    if (++ps->total_elems > MAX_ELEMS) return moex_fail(ps->err, "grammar too large (over %d elements)", MAX_ELEMS);
    prule *pr = &ps->rules[r];
    if (grow(&pr->el, &pr->cap, pr->n + 1, sizeof(elem)) < 0) return moex_fail(ps->err, "out of memory");
    pr->el[pr->n++] = (elem){kind, arg};
    return 0;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes one UTF-8 character at s; its length, 0 when invalid. */
static int utf8_decode(const uint8_t *s, uint32_t *cp) {
    uint8_t b = s[0];
    int n = b < 0x80 ? 1 : b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
    if (!n) return 0;
    uint32_t v = n == 1 ? b : (uint32_t)(b & (0x7F >> n));
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return n;
}

/* One character of a literal or class: an escape or a UTF-8 character.
 * `open` is where the literal or class began (for "unterminated" errors). */
static int parse_char(parser *ps, const char *open, const char *what, uint32_t *cp) {
    const char *at = ps->p;
    if (!*at || *at == '\n' || *at == '\r') return parse_fail(ps, open, "unterminated %s", what);
    if (*at != '\\') {
        int n = utf8_decode((const uint8_t *)at, cp);
        if (!n) return parse_fail(ps, at, "invalid UTF-8");
        ps->p += n;
        return 0;
    }
    char c = at[1];
    int digits = 0;
    switch (c) {
    case 'n': *cp = '\n'; break;
    case 't': *cp = '\t'; break;
    case 'r': *cp = '\r'; break;
    case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': *cp = (uint8_t)c; break;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    case 0: return parse_fail(ps, open, "unterminated %s", what);
    default: return parse_fail(ps, at, "unknown escape '\\%c'", c);
    }
    ps->p += 2;
    if (!digits) return 0;
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int h = hex_value(ps->p[i]);
        if (h < 0) return parse_fail(ps, at, "escape '\\%c' needs %d hex digits", c, digits);
        v = v * 16 + (uint32_t)h;
    }
    if (v > 0x10FFFF) return parse_fail(ps, at, "code point U+%X is beyond U+10FFFF", v);
    ps->p += digits;
    *cp = v;
    return 0;
}

static int cmp_range(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Turns the ranges in ps->tmp (negated when neg) into a class; its index. */
static int finish_class(parser *ps, bool neg) {
    qsort(ps->tmp, ps->n_tmp, 2 * sizeof(uint32_t), cmp_range);
    size_t n = 0; /* merge overlapping and adjacent ranges in place */
    for (size_t i = 0; i < ps->n_tmp; i++) {
        uint32_t lo = ps->tmp[2 * i], hi = ps->tmp[2 * i + 1];
        if (n && lo <= ps->tmp[2 * n - 1] + 1) {
            if (hi > ps->tmp[2 * n - 1]) ps->tmp[2 * n - 1] = hi;
        } else {
            ps->tmp[2 * n] = lo;
            ps->tmp[2 * n + 1] = hi;
            n++;
        }
    }
    if (neg) { /* complement over [0, 0x10FFFF]: n ranges leave at most n + 1 gaps */
        if (grow(&ps->tmp, &ps->cap_tmp, 2 * (2 * n + 1), sizeof(uint32_t)) < 0) return moex_fail(ps->err, "out of memory");
        uint32_t *gaps = ps->tmp + 2 * n, next = 0;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            if (ps->tmp[2 * i] > next) {
                gaps[2 * m] = next;
                gaps[2 * m + 1] = ps->tmp[2 * i] - 1;
                m++;
            }
            next = ps->tmp[2 * i + 1] + 1;
        }
        if (next <= 0x10FFFF) {
            gaps[2 * m] = next;
            gaps[2 * m + 1] = 0x10FFFF;
            m++;
        }
        memmove(ps->tmp, gaps, 2 * m * sizeof(uint32_t));
        n = m;
    }
    if (grow(&ps->cls, &ps->cap_cls, ps->n_cls + 1, sizeof(charclass)) < 0 ||
        grow(&ps->ranges, &ps->cap_ranges, 2 * (ps->n_ranges + n), sizeof(uint32_t)) < 0)
        return moex_fail(ps->err, "out of memory");
    charclass *k = &ps->cls[ps->n_cls];
    memset(k, 0, sizeof *k);
    k->off = (uint32_t)ps->n_ranges;
    for (size_t i = 0; i < n; i++) {
        uint32_t lo = ps->tmp[2 * i], hi = ps->tmp[2 * i + 1];
        for (uint32_t cp = lo; cp <= hi && cp < 128; cp++) k->ascii[cp >> 6] |= 1ULL << (cp & 63);
        if (hi >= 128) {
            ps->ranges[2 * ps->n_ranges] = lo < 128 ? 128 : lo;
            ps->ranges[2 * ps->n_ranges + 1] = hi;
            ps->n_ranges++;
            k->n++;
        }
    }
    ps->n_tmp = 0;
    return (int)ps->n_cls++;
}

static int add_tmp_range(parser *ps, uint32_t lo, uint32_t hi) {
    if (grow(&ps->tmp, &ps->cap_tmp, 2 * (ps->n_tmp + 1), sizeof(uint32_t)) < 0) return moex_fail(ps->err, "out of memory");
    ps->tmp[2 * ps->n_tmp] = lo;
    ps->tmp[2 * ps->n_tmp + 1] = hi;
    ps->n_tmp++;
    return 0;
}

/* [...] or [^...] at ps->p; emits the terminal into rule r. */
static int parse_class(parser *ps, int r) {
    const char *open = ps->p++;
    bool neg = *ps->p == '^';
    if (neg) ps->p++;
    ps->n_tmp = 0;
    while (*ps->p != ']') {
        uint32_t lo, hi;
        if (parse_char(ps, open, "character class", &lo) < 0) return -1;
        hi = lo;
        if (ps->p[0] == '-' && ps->p[1] && ps->p[1] != ']') {
            const char *dash = ps->p++;
            if (parse_char(ps, open, "character class", &hi) < 0) return -1;
            if (hi < lo) return parse_fail(ps, dash, "bad range: U+%04X-U+%04X is empty", lo, hi);
        }
        if (add_tmp_range(ps, lo, hi) < 0) return -1;
    }
    ps->p++;
    int c = finish_class(ps, neg);
    return c < 0 ? -1 : emit(ps, r, EL_CHARS, c);
}

/* "..." at ps->p: one terminal per character. */
static int parse_literal(parser *ps, int r) {
    const char *open = ps->p++;
    while (*ps->p != '"') {
        uint32_t cp;
        if (parse_char(ps, open, "literal", &cp) < 0 || add_tmp_range(ps, cp, cp) < 0) return -1;
        int c = finish_class(ps, false);
        if (c < 0 || emit(ps, r, EL_CHARS, c) < 0) return -1;
    }
    ps->p++;
    return 0;
}

/* A decimal number of a repetition bound; -1 when there is none. */
static long parse_bound(parser *ps) {
    if (*ps->p < '0' || *ps->p > '9') return -1;
    long v = 0;
    while (*ps->p >= '0' && *ps->p <= '9') {
        if (v <= MAX_REPEAT) v = v * 10 + (*ps->p - '0');
        ps->p++;
    }
    return v;
}

/* Rewrites the symbol at rule r's elements [start, n) as its repetition
 * {min,max} (max -1: unbounded), using helper rules:
 *   x{m,}  -> x..x R    with R ::= x R | ""
 *   x{m,n} -> x..x R1   with Ri ::= x R(i+1) | "" and the last Rk ::= x | "" */
static int apply_repetition(parser *ps, int r, size_t start, long min, long max) {
    elem sym;
    size_t n_sym = ps->rules[r].n - start;
    if (n_sym == 1) {
        sym = ps->rules[r].el[start];
    } else { /* several elements (a literal) or none: wrap them in a rule */
        int s = add_helper_rule(ps, r);
        if (s < 0) return -1;
        for (size_t i = 0; i < n_sym; i++)
            if (emit(ps, s, ps->rules[r].el[start + i].kind, ps->rules[r].el[start + i].arg) < 0) return -1;
        if (emit(ps, s, EL_END, 0) < 0) return -1;
        sym = (elem){EL_REF, s};
    }
    ps->rules[r].n = start;
    for (long i = 0; i < min; i++)
        if (emit(ps, r, sym.kind, sym.arg) < 0) return -1;
    if (max == min) return 0;
    if (max < 0) {
        int loop = add_helper_rule(ps, r);
        if (loop < 0 || emit(ps, loop, sym.kind, sym.arg) < 0 || emit(ps, loop, EL_REF, loop) < 0 ||
            emit(ps, loop, EL_END, 0) < 0 || emit(ps, loop, EL_END, 0) < 0)
            return -1;
        return emit(ps, r, EL_REF, loop);
    }
    int first = -1, prev = -1;
    for (long i = 0; i < max - min; i++) {
        int opt = add_helper_rule(ps, r);
        if (opt < 0) return -1;
        if (prev >= 0 && emit(ps, prev, EL_REF, opt) < 0) return -1;
        if (prev >= 0 && (emit(ps, prev, EL_END, 0) < 0 || emit(ps, prev, EL_END, 0) < 0)) return -1;
        if (emit(ps, opt, sym.kind, sym.arg) < 0) return -1;
        if (first < 0) first = opt;
        prev = opt;
    }
    if (emit(ps, prev, EL_END, 0) < 0 || emit(ps, prev, EL_END, 0) < 0) return -1;
    return emit(ps, r, EL_REF, first);
}

/* * + ? {m} {m,} {m,n} at ps->p, applied to the symbol at [start, n). */
static int parse_repetition(parser *ps, int r, size_t start) {
    const char *at = ps->p;
    char c = *ps->p++;
    long min = 0, max = -1;
    if (c == '+') min = 1;
    else if (c == '?') max = 1;
    else if (c == '{') {
        skip_space(ps, false);
        min = parse_bound(ps);
        if (min < 0) return parse_fail(ps, at, "expected a number after '{'");
        skip_space(ps, false);
        max = min;
        if (*ps->p == ',') {
            ps->p++;
            skip_space(ps, false);
            max = parse_bound(ps);
            skip_space(ps, false);
        }
        if (*ps->p != '}') return parse_fail(ps, at, "expected '}' to close the repetition");
        ps->p++;
        if (min > MAX_REPEAT || max > MAX_REPEAT)
            return parse_fail(ps, at, "repetition bound above %d", MAX_REPEAT);
        if (max >= 0 && max < min) return parse_fail(ps, at, "bad repetition bounds {%ld,%ld}: max < min", min, max);
    }
    return apply_repetition(ps, r, start, min, max);
}

static int parse_alternatives(parser *ps, int r, bool nested);

/* Symbols up to '|', ')' or the end of the rule, into rule r. */
static int parse_sequence(parser *ps, int r, bool nested) {
    size_t last = (size_t)-1; /* where the last symbol began (what a repetition applies to) */
    for (;;) {
        const char *at = ps->p;
        char c = *at;
        size_t start = ps->rules[r].n;
        if (c == '"') {
            if (parse_literal(ps, r) < 0) return -1;
        } else if (c == '[') {
            if (parse_class(ps, r) < 0) return -1;
        } else if (c == '.') {
            ps->p++;
            ps->n_tmp = 0;
            if (add_tmp_range(ps, 0, 0x10FFFF) < 0) return -1;
            int k = finish_class(ps, false);
            if (k < 0 || emit(ps, r, EL_CHARS, k) < 0) return -1;
        } else if (is_name_char(c)) {
            while (is_name_char(*ps->p)) ps->p++;
            int ref = find_or_add_rule(ps, at, (size_t)(ps->p - at));
            if (ref < 0) return -1;
            if (!ps->rules[ref].defined && !ps->rules[ref].first_use) ps->rules[ref].first_use = at;
            if (emit(ps, r, EL_REF, ref) < 0) return -1;
        } else if (c == '(') {
            if (ps->depth >= MAX_NESTING) return parse_fail(ps, at, "groups nested deeper than %d", MAX_NESTING);
            ps->p++;
            skip_space(ps, true);
            int sub = add_helper_rule(ps, r);
            ps->depth++;
            if (sub < 0 || parse_alternatives(ps, sub, true) < 0) return -1;
            ps->depth--;
            if (*ps->p != ')') return parse_fail(ps, ps->p, "expected ')' to close a group");
            ps->p++;
            if (emit(ps, r, EL_REF, sub) < 0) return -1;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last == (size_t)-1) return parse_fail(ps, at, "'%c' follows no symbol", c);
            if (parse_repetition(ps, r, last) < 0) return -1;
            start = last;
        } else if (c == '<' || (c == '!' && at[1] == '<')) {
            return parse_fail(ps, at, "token references (<...>) are not supported");
        } else {
            return 0;
        }
        last = start;
        skip_space(ps, nested);
    }
}

static int parse_alternatives(parser *ps, int r, bool nested) {
    for (;;) {
        if (parse_sequence(ps, r, nested) < 0 || emit(ps, r, EL_END, 0) < 0) return -1;
        if (*ps->p != '|') return 0;
        ps->p++;
        skip_space(ps, true);
    }
}

/* name ::= alternatives, ended by a newline or the end of the text. */
static int parse_rule(parser *ps) {
    const char *at = ps->p;
    while (is_name_char(*ps->p)) ps->p++;
    if (ps->p == at) return parse_fail(ps, at, "expected a rule name");
    int r = find_or_add_rule(ps, at, (size_t)(ps->p - at));
    if (r < 0) return -1;
    skip_space(ps, false);
    if (strncmp(ps->p, "::=", 3) != 0) return parse_fail(ps, ps->p, "expected ::=");
    if (ps->rules[r].defined) return parse_fail(ps, at, "rule '%s' is defined twice", ps->rules[r].name);
    ps->rules[r].defined = true;
    ps->p += 3;
    skip_space(ps, true);
    if (parse_alternatives(ps, r, false) < 0) return -1;
    if (*ps->p == '\r') ps->p++;
    if (*ps->p == '\n') ps->p++;
    else if (*ps->p == ')') return parse_fail(ps, ps->p, "unbalanced ')'");
    else if (*ps->p) return parse_fail(ps, ps->p, "unexpected '%c'", *ps->p);
    skip_space(ps, true);
    return 0;
}

/* Rules that can match the empty text: a worklist in linear time (an
 * alternative of rule references only becomes nullable when its count of
 * references to rules not yet known nullable drops to zero). */
static bool *nullable_rules(const serve_grammar *g) {
    int32_t n_alt = g->rule_alt[g->n_rules];
    bool *nul = calloc((size_t)g->n_rules + 1, 1);
    int32_t *pending = calloc((size_t)n_alt + 1, sizeof(int32_t)), *alt_rule = malloc(((size_t)n_alt + 1) * sizeof(int32_t));
    int32_t *occ_off = calloc((size_t)g->n_rules + 2, sizeof(int32_t)), *occ = NULL, *queue = malloc(((size_t)g->n_rules + 1) * sizeof(int32_t));
    int32_t n_queue = 0;
    bool ok = nul && pending && alt_rule && occ_off && queue;
    for (int32_t r = 0; ok && r < g->n_rules; r++) { /* count references per rule, in alternatives of references only */
        for (int32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            alt_rule[a] = r;
            const elem *e = &g->el[g->alt_start[a]];
            for (; e->kind == EL_REF; e++) pending[a]++;
            if (e->kind == EL_CHARS) pending[a] = -1; /* never nullable */
            for (e = &g->el[g->alt_start[a]]; pending[a] > 0 && e->kind == EL_REF; e++) occ_off[e->arg + 1]++;
        }
    }
    for (int32_t r = 0; ok && r < g->n_rules; r++) occ_off[r + 1] += occ_off[r];
    if (ok) ok = (occ = malloc(((size_t)occ_off[g->n_rules] + 1) * sizeof(int32_t))) != NULL;
    int32_t *fill = ok ? calloc((size_t)g->n_rules + 1, sizeof(int32_t)) : NULL;
    ok = ok && fill;
    for (int32_t a = 0; ok && a < n_alt; a++) {
        if (pending[a] <= 0) continue;
        for (const elem *e = &g->el[g->alt_start[a]]; e->kind == EL_REF; e++) occ[occ_off[e->arg] + fill[e->arg]++] = a;
    }
    for (int32_t a = 0; ok && a < n_alt; a++)
        if (pending[a] == 0 && !nul[alt_rule[a]]) nul[alt_rule[a]] = true, queue[n_queue++] = alt_rule[a];
    while (ok && n_queue) {
        int32_t r = queue[--n_queue];
        for (int32_t k = occ_off[r]; k < occ_off[r + 1]; k++) {
            int32_t a = occ[k];
            if (--pending[a] == 0 && !nul[alt_rule[a]]) nul[alt_rule[a]] = true, queue[n_queue++] = alt_rule[a];
        }
    }
    free(pending);
    free(alt_rule);
    free(occ_off);
    free(occ);
    free(queue);
    free(fill);
    if (!ok) {
        free(nul);
        return NULL;
    }
    return nul;
}

/* Left recursion: rule A can reach A again through rules referenced at the
 * start of an alternative (after nullable ones). The matcher expands rule
 * references before reading a character, so such a cycle grows stacks without
 * end, unless every reference on the cycle is the last element of its
 * alternative (a tail call reuses the caller's stack: `r ::= x? r | ""` is fine).
 * Finds strongly connected components of the "leftmost reference" graph
 * (Tarjan, iteratively) and fails on a non-tail edge inside one. */
static int check_left_recursion(const serve_grammar *g, moex_error *err) {
    int32_t n = g->n_rules;
    bool *nul = nullable_rules(g);
    int32_t *edge_off = calloc((size_t)n + 1, sizeof(int32_t));
    size_t n_edges = 0, cap_edges = 0;
    int32_t *to = NULL;
    bool *tail = NULL;
    size_t cap_tail = 0;
    int32_t *index = malloc((size_t)n * sizeof(int32_t)), *low = malloc((size_t)n * sizeof(int32_t));
    int32_t *stack = malloc((size_t)n * sizeof(int32_t)), *comp = malloc((size_t)n * sizeof(int32_t));
    int32_t *call = malloc((size_t)n * sizeof(int32_t)), *call_edge = malloc((size_t)n * sizeof(int32_t));
    bool *on_stack = calloc((size_t)n + 1, 1);
    int rc = -1;
    if (!nul || !edge_off || !index || !low || !stack || !comp || !call || !call_edge || !on_stack) {
        moex_fail(err, "out of memory");
        goto out;
    }
    for (int32_t r = 0; r < n; r++) {
        edge_off[r] = (int32_t)n_edges;
        for (int32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            for (const elem *e = &g->el[g->alt_start[a]]; e->kind == EL_REF; e++) {
                if (grow(&to, &cap_edges, n_edges + 1, sizeof(int32_t)) < 0 ||
                    grow(&tail, &cap_tail, n_edges + 1, sizeof(bool)) < 0) {
                    moex_fail(err, "out of memory");
                    goto out;
                }
                to[n_edges] = e->arg;
                tail[n_edges] = e[1].kind == EL_END;
                n_edges++;
                if (!nul[e->arg]) break;
            }
        }
    }
    edge_off[n] = (int32_t)n_edges;
    for (int32_t i = 0; i < n; i++) index[i] = -1;
    int32_t counter = 0, sp = 0, n_comp = 0;
    for (int32_t root = 0; root < n; root++) {
        if (index[root] >= 0) continue;
        int32_t depth = 0;
        call[0] = root;
        call_edge[0] = edge_off[root];
        index[root] = low[root] = counter++;
        stack[sp++] = root;
        on_stack[root] = true;
        while (depth >= 0) {
            int32_t v = call[depth];
            if (call_edge[depth] < edge_off[v + 1]) {
                int32_t w = to[call_edge[depth]++];
                if (index[w] < 0) {
                    index[w] = low[w] = counter++;
                    stack[sp++] = w;
                    on_stack[w] = true;
                    depth++;
                    call[depth] = w;
                    call_edge[depth] = edge_off[w];
                } else if (on_stack[w] && index[w] < low[v]) {
                    low[v] = index[w];
                }
                continue;
            }
            if (low[v] == index[v]) {
                int32_t w;
                do {
                    w = stack[--sp];
                    on_stack[w] = false;
                    comp[w] = n_comp;
                } while (w != v);
                n_comp++;
            }
            depth--;
            if (depth >= 0 && low[v] < low[call[depth]]) low[call[depth]] = low[v];
        }
    }
    for (int32_t r = 0; r < n; r++) {
        for (int32_t k = edge_off[r]; k < edge_off[r + 1]; k++) {
            if (!tail[k] && comp[to[k]] == comp[r]) {
                moex_fail(err, "grammar: rule '%s' is left-recursive (through '%s'): rewrite it with repetition",
                          g->names[r], g->names[to[k]]);
                goto out;
            }
        }
    }
    rc = 0;
out:
    free(nul);
    free(edge_off);
    free(to);
    free(tail);
    free(index);
    free(low);
    free(stack);
    free(comp);
    free(call);
    free(call_edge);
    free(on_stack);
    return rc;
}

/* The parsed rules as one flat grammar. */
static serve_grammar *flatten(parser *ps, moex_error *err) {
    serve_grammar *g = calloc(1, sizeof *g);
    if (!g) return moex_fail(err, "out of memory"), NULL;
    size_t n_el = 0, n_alt = 0;
    for (size_t r = 0; r < ps->n_rules; r++) {
        n_el += ps->rules[r].n;
        for (size_t i = 0; i < ps->rules[r].n; i++) n_alt += ps->rules[r].el[i].kind == EL_END;
    }
    g->n_rules = (int32_t)ps->n_rules;
    g->el = malloc((n_el + 1) * sizeof(elem));
    g->alt_start = malloc((n_alt + 1) * sizeof(int32_t));
    g->rule_alt = malloc((ps->n_rules + 1) * sizeof(int32_t));
    g->names = calloc(ps->n_rules + 1, sizeof(char *));
    if (!g->el || !g->alt_start || !g->rule_alt || !g->names) {
        serve_grammar_free(g);
        return moex_fail(err, "out of memory"), NULL;
    }
    int32_t k = 0, a = 0;
    for (size_t r = 0; r < ps->n_rules; r++) {
        prule *pr = &ps->rules[r];
        g->rule_alt[r] = a;
        g->names[r] = pr->name;
        pr->name = NULL;
        for (size_t i = 0; i < pr->n; i++) {
            if (i == 0 || pr->el[i - 1].kind == EL_END) g->alt_start[a++] = k;
            g->el[k++] = pr->el[i];
        }
    }
    g->rule_alt[ps->n_rules] = a;
    g->el[k] = (elem){EL_END, 0};
    g->n_el = k;
    g->cls = ps->cls;
    g->n_cls = (int32_t)ps->n_cls;
    g->ranges = ps->ranges;
    ps->cls = NULL;
    ps->ranges = NULL;
    return g;
}

static void parser_free(parser *ps) {
    for (size_t r = 0; r < ps->n_rules; r++) {
        free(ps->rules[r].el);
        free(ps->rules[r].name);
    }
    free(ps->rules);
    u64map_free(&ps->names);
    free(ps->cls);
    free(ps->ranges);
    free(ps->tmp);
}

serve_grammar *serve_grammar_parse(const char *gbnf, const char *root, moex_error *err) {
    if (!gbnf) return moex_fail(err, "grammar: no text"), NULL;
    if (!root) root = "root";
    parser ps = {.src = gbnf, .p = gbnf, .err = err};
    serve_grammar *g = NULL;
    skip_space(&ps, true);
    while (*ps.p)
        if (parse_rule(&ps) < 0) goto out;
    for (size_t r = 0; r < ps.n_rules; r++) {
        if (!ps.rules[r].defined && !ps.rules[r].helper) {
            parse_fail(&ps, ps.rules[r].first_use, "rule '%s' is used but not defined", ps.rules[r].name);
            goto out;
        }
    }
    int32_t root_idx = u64map_get(&ps.names, hash_bytes(root, strlen(root)));
    if (root_idx < 0 || strcmp(ps.rules[root_idx].name, root) != 0 || !ps.rules[root_idx].defined) {
        moex_fail(err, "grammar: no rule '%s' (the start rule)", root);
        goto out;
    }
    g = flatten(&ps, err);
    if (!g) goto out;
    g->root = root_idx;
    if (check_left_recursion(g, err) < 0) {
        serve_grammar_free(g);
        g = NULL;
    }
out:
    parser_free(&ps);
    return g;
}

/* ------------------------------------------------------------------ */
/* The matcher engine                                                   */
/* ------------------------------------------------------------------ */

enum { ACCEPT = 0 };                        /* node id of the empty stack: the text may end here */
enum { T_UNKNOWN = -2, T_DEAD = -1, T_OVERFLOW = -3 }; /* step results besides set ids */

typedef struct {
    int32_t pos;    /* grammar position: a terminal (top of a stack) or where to continue */
    int32_t parent; /* the node below; ACCEPT at the bottom */
} snode;

typedef struct {
    uint32_t off, n; /* node ids items[off .. off+n), ascending */
    uint64_t hash;
    int32_t ascii;   /* offset of this set's 128 cached ASCII steps in ascii[], or -1 */
    int32_t high;    /* offset of this set's intervals above ASCII in high[], or -1 (see high_table) */
    /* Where "most" characters lead (the next character of a JSON string, say):
     * uni_next, the set the first byte asked about leads to; uni_yes/uni_no,
     * the ASCII bytes known to lead there or not; high_uni, whether every
     * character above ASCII does (once high_known). */
    uint64_t uni_yes[2], uni_no[2];
    int32_t uni_next;
    bool high_known;
    bool high_uni;
} sset;

/* Where a walk through text stands: a set of stacks and a partly read UTF-8 character. */
typedef struct {
    int32_t set;     /* a set id (never T_DEAD: walks stop there) */
    uint32_t val : 24;   /* bits read so far of the current character */
    uint32_t remain : 4; /* continuation bytes still to come (0: between characters) */
    uint32_t len : 4;    /* the character's length in bytes */
} walk;                  /* 8 bytes: the vocabulary walk copies one per trie node */

/* A mask computed before: the masks of the last few positions are kept, since
 * a position often comes back (every character inside a JSON string leaves
 * the parse where it was). */
enum { MASK_CACHE = 4 };
typedef struct {
    const serve_grammar_vocab *v;
    walk at;
    int32_t n_vocab;
    uint8_t *bits; /* n_vocab bits */
    int32_t count;
    uint64_t used; /* for least-recently-used replacement */
} cached_mask;

typedef struct engine {
    const serve_grammar *g;
    snode *nodes;
    size_t n_nodes, cap_nodes;
    u64map node_ids;   /* (pos, parent) -> node id */
    uint32_t *stamp;   /* per node: the step that last output it (dedupe) */
    size_t cap_stamp;
    uint32_t gen;
    sset *sets;
    size_t n_sets, cap_sets;
    int32_t *items;
    size_t n_items, cap_items;
    int32_t *set_tab;  /* open addressing over set ids by hash; -1 empty */
    size_t cap_set_tab;
    int32_t *ascii;    /* 128-entry blocks of cached steps */
    size_t n_ascii, cap_ascii;
    int32_t *high;     /* per set: m, then m interval starts, m cached steps, m "some stack reads it" flags */
    size_t n_high, cap_high;
    uint32_t *bounds;  /* scratch for high_table */
    size_t cap_bounds;
    uint64_t *visit_key; /* (rule, continuation node) pairs expanded in this step */
    uint32_t *visit_gen;
    size_t cap_visit, n_visit;
    int32_t *out;      /* the step's result, before interning */
    size_t n_out, cap_out;
    int64_t *work;     /* positions still to expand: (pos << 32) | parent */
    size_t n_work, cap_work;
    walk cur;          /* the state's own position */
    walk *scratch;     /* per-depth walks of a vocabulary walk */
    size_t cap_scratch;
    bool broken;       /* memory bound hit with nothing left to drop */
    size_t budget;     /* ENGINE_BUDGET or the environment's */
    cached_mask masks[MASK_CACHE];
    uint64_t mask_clock;
} engine;

struct serve_grammar_state {
    engine *e;
};

static void engine_free(engine *e) {
    if (!e) return;
    free(e->nodes);
    u64map_free(&e->node_ids);
    free(e->stamp);
    free(e->sets);
    free(e->items);
    free(e->set_tab);
    free(e->ascii);
    free(e->high);
    free(e->bounds);
    free(e->visit_key);
    free(e->visit_gen);
    free(e->out);
    free(e->work);
    free(e->scratch);
    for (int i = 0; i < MASK_CACHE; i++) free(e->masks[i].bits);
    free(e);
}

static size_t engine_bytes(const engine *e) {
    return e->cap_nodes * (sizeof(snode) + sizeof(uint32_t)) + e->node_ids.cap * 12 + e->cap_sets * sizeof(sset) +
           e->cap_items * 4 + e->cap_set_tab * 4 + e->cap_ascii * 4 + e->cap_high * 4 + e->cap_bounds * 4 + e->cap_visit * 12;
}

static engine *engine_new(const serve_grammar *g) {
    engine *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->g = g;
    e->budget = g->cache_budget ? g->cache_budget : ENGINE_BUDGET;
    if (grow(&e->nodes, &e->cap_nodes, 1, sizeof(snode)) < 0 || grow(&e->stamp, &e->cap_stamp, e->cap_nodes, 4) < 0) {
        engine_free(e);
        return NULL;
    }
    e->nodes[0] = (snode){-1, -1};
    e->stamp[0] = 0;
    e->n_nodes = 1;
    return e;
}

/* The id of node (pos, parent), made when new; -1 when out of memory. */
static int32_t intern_node(engine *e, int32_t pos, int32_t parent) {
    uint64_t key = ((uint64_t)(uint32_t)pos << 32) | (uint32_t)parent;
    int32_t id = u64map_get(&e->node_ids, key);
    if (id >= 0) return id;
    if (e->n_nodes >= INT32_MAX / 2 || grow(&e->nodes, &e->cap_nodes, e->n_nodes + 1, sizeof(snode)) < 0 ||
        grow(&e->stamp, &e->cap_stamp, e->cap_nodes, sizeof(uint32_t)) < 0)
        return -1;
    id = (int32_t)e->n_nodes;
    if (u64map_put(&e->node_ids, key, id) < 0) return -1;
    e->nodes[id] = (snode){pos, parent};
    e->stamp[id] = 0;
    e->n_nodes++;
    return id;
}

static uint64_t hash_ids(const int32_t *ids, size_t n) {
    uint64_t h = n;
    for (size_t i = 0; i < n; i++) h = mix64(h ^ (uint32_t)ids[i]) + i;
    return h;
}

static int set_tab_rehash(engine *e, size_t cap) {
    int32_t *t = malloc(cap * sizeof(int32_t));
    if (!t) return -1;
    memset(t, 0xff, cap * sizeof(int32_t));
    for (size_t s = 0; s < e->n_sets; s++) {
        size_t i = e->sets[s].hash & (cap - 1);
        while (t[i] >= 0) i = (i + 1) & (cap - 1);
        t[i] = (int32_t)s;
    }
    free(e->set_tab);
    e->set_tab = t;
    e->cap_set_tab = cap;
    return 0;
}

/* The id of the set of node ids ids[0..n) (ascending), made when new; -1 when out of memory. */
static int32_t intern_set(engine *e, const int32_t *ids, size_t n) {
    uint64_t h = hash_ids(ids, n);
    if (e->cap_set_tab) {
        for (size_t i = h & (e->cap_set_tab - 1);; i = (i + 1) & (e->cap_set_tab - 1)) {
            int32_t s = e->set_tab[i];
            if (s < 0) break;
            const sset *ss = &e->sets[s];
            if (ss->hash == h && ss->n == n && !memcmp(e->items + ss->off, ids, n * sizeof(int32_t))) return s;
        }
    }
    if ((e->n_sets + 1) * 2 > e->cap_set_tab && set_tab_rehash(e, e->cap_set_tab ? e->cap_set_tab * 2 : 64) < 0) return -1;
    if (grow(&e->sets, &e->cap_sets, e->n_sets + 1, sizeof(sset)) < 0 ||
        grow(&e->items, &e->cap_items, e->n_items + n, sizeof(int32_t)) < 0)
        return -1;
    int32_t s = (int32_t)e->n_sets++;
    e->sets[s] = (sset){(uint32_t)e->n_items, (uint32_t)n, h, -1, -1, {0, 0}, {0, 0}, -1, false, false};
    memcpy(e->items + e->n_items, ids, n * sizeof(int32_t));
    e->n_items += n;
    size_t i = h & (e->cap_set_tab - 1);
    while (e->set_tab[i] >= 0) i = (i + 1) & (e->cap_set_tab - 1);
    e->set_tab[i] = s;
    return s;
}

/* Marks (rule, continuation) as expanded in this step; false when it already was. */
static int visit_once(engine *e, int32_t rule, int32_t cont) {
    if ((e->n_visit + 1) * 2 > e->cap_visit) { /* grow, keeping this step's entries */
        size_t cap = e->cap_visit ? e->cap_visit * 2 : 256;
        uint64_t *k = malloc(cap * sizeof(uint64_t));
        uint32_t *gn = calloc(cap, sizeof(uint32_t));
        if (!k || !gn) {
            free(k);
            free(gn);
            return -1;
        }
        for (size_t i = 0; i < e->cap_visit; i++) {
            if (e->visit_gen[i] != e->gen) continue;
            size_t j = mix64(e->visit_key[i]) & (cap - 1);
            while (gn[j] == e->gen) j = (j + 1) & (cap - 1);
            k[j] = e->visit_key[i];
            gn[j] = e->gen;
        }
        free(e->visit_key);
        free(e->visit_gen);
        e->visit_key = k;
        e->visit_gen = gn;
        e->cap_visit = cap;
    }
    uint64_t key = ((uint64_t)(uint32_t)rule << 32) | (uint32_t)cont;
    size_t mask = e->cap_visit - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
        if (e->visit_gen[i] != e->gen) {
            e->visit_gen[i] = e->gen;
            e->visit_key[i] = key;
            e->n_visit++;
            return 1;
        }
        if (e->visit_key[i] == key) return 0;
    }
}

/* Starts a step: fresh dedupe stamps, empty output. */
static void step_begin(engine *e) {
    if (++e->gen == 0) { /* wrapped: forget every old stamp */
        memset(e->stamp, 0, e->cap_nodes * sizeof(uint32_t));
        memset(e->visit_gen, 0, e->cap_visit * sizeof(uint32_t));
        e->gen = 1;
    }
    e->n_out = 0;
    e->n_visit = 0;
    e->n_work = 0;
}

static int push_work(engine *e, int32_t pos, int32_t parent) {
    if (grow(&e->work, &e->cap_work, e->n_work + 1, sizeof(int64_t)) < 0) return -1;
    e->work[e->n_work++] = ((int64_t)pos << 32) | (uint32_t)parent;
    return 0;
}

/* Queues the alternatives of rule r, to continue at node cont when r ends. */
static int expand_rule(engine *e, int32_t r, int32_t cont) {
    int v = visit_once(e, r, cont);
    if (v <= 0) return v;
    const serve_grammar *g = e->g;
    for (int32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
        if (push_work(e, g->alt_start[a], cont) < 0) return -1;
    return 0;
}

static int output_node(engine *e, int32_t id) {
    if (e->stamp[id] == e->gen) return 0;
    e->stamp[id] = e->gen;
    if (grow(&e->out, &e->cap_out, e->n_out + 1, sizeof(int32_t)) < 0) return -1;
    e->out[e->n_out++] = id;
    return 0;
}

/* Runs the queued expansions: every stack reachable without reading a
 * character, each ending on a terminal (or ACCEPT), goes to the output.
 * 0, -1 out of memory, -3 (T_OVERFLOW) too many stacks or too much work. */
static int expand_all(engine *e) {
    const elem *el = e->g->el;
    size_t work_done = 0;
    while (e->n_work) {
        int64_t w = e->work[--e->n_work];
        int32_t pos = (int32_t)(w >> 32), parent = (int32_t)(uint32_t)w;
        if (++work_done > MAX_EXPAND_WORK) return T_OVERFLOW;
        for (;;) {
            const elem *x = &el[pos];
            if (x->kind == EL_CHARS) {
                int32_t id = intern_node(e, pos, parent);
                if (id < 0 || output_node(e, id) < 0) return -1;
                break;
            }
            if (x->kind == EL_END) { /* the rule is done: pop */
                if (parent == ACCEPT) {
                    if (output_node(e, ACCEPT) < 0) return -1;
                    break;
                }
                pos = e->nodes[parent].pos;
                parent = e->nodes[parent].parent;
                continue;
            }
            /* a rule reference: push where to continue (a tail call pushes nothing) */
            int32_t cont = parent;
            if (x[1].kind != EL_END && (cont = intern_node(e, pos + 1, parent)) < 0) return -1;
            if (expand_rule(e, x->arg, cont) < 0) return -1;
            break;
        }
        if (e->n_out > MAX_STACKS) return T_OVERFLOW;
    }
    return 0;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* Interns the step's output: a set id, T_DEAD (no stack), T_OVERFLOW, or -4 out of memory. */
static int32_t finish_step(engine *e, int rc) {
    if (rc == T_OVERFLOW) return T_OVERFLOW;
    if (rc < 0) return -4;
    if (!e->n_out) return T_DEAD;
    if (e->n_out > 1) qsort(e->out, e->n_out, sizeof(int32_t), cmp_i32);
    int32_t s = intern_set(e, e->out, e->n_out);
    return s < 0 ? -4 : s;
}

/* The set of stacks at the start of the grammar. */
static int32_t start_set(engine *e) {
    step_begin(e);
    int rc = expand_rule(e, e->g->root, ACCEPT);
    if (rc == 0) rc = expand_all(e);
    return finish_step(e, rc);
}

/* Computes "set s reads code point cp" (not cached). */
static int32_t compute_step(engine *e, int32_t s, uint32_t cp) {
    step_begin(e);
    const serve_grammar *g = e->g;
    uint32_t off = e->sets[s].off, n = e->sets[s].n;
    int rc = 0;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        int32_t id = e->items[off + i];
        if (id == ACCEPT) continue;
        snode nd = e->nodes[id];
        if (class_has(g, g->el[nd.pos].arg, cp)) rc = push_work(e, nd.pos + 1, nd.parent);
        if (rc == 0) rc = expand_all(e);
    }
    return finish_step(e, rc);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Set s's code points above ASCII cut into intervals over which the same
 * stacks can read a character: the ends of its stacks' class ranges. Laid out
 * in high[] as m, the m interval starts (ascending, the first 128), the m
 * cached steps (T_UNKNOWN until needed) and m flags (some stack reads it).
 * A non-ASCII character is then a binary search, not a step per code point.
 * Returns its offset, -1 when out of memory. */
static int32_t high_table(engine *e, int32_t s) {
    const serve_grammar *g = e->g;
    uint32_t off = e->sets[s].off, n = e->sets[s].n;
    size_t nb = 0;
    if (grow(&e->bounds, &e->cap_bounds, 1, sizeof(uint32_t)) < 0) return -1;
    e->bounds[nb++] = 128;
    for (uint32_t i = 0; i < n; i++) {
        int32_t id = e->items[off + i];
        if (id == ACCEPT) continue;
        const charclass *k = &g->cls[g->el[e->nodes[id].pos].arg];
        if (grow(&e->bounds, &e->cap_bounds, nb + 2 * (size_t)k->n, sizeof(uint32_t)) < 0) return -1;
        for (uint32_t r = 0; r < k->n; r++) {
            e->bounds[nb++] = g->ranges[2 * (size_t)(k->off + r)];
            if (g->ranges[2 * (size_t)(k->off + r) + 1] < 0x10FFFF) e->bounds[nb++] = g->ranges[2 * (size_t)(k->off + r) + 1] + 1;
        }
    }
    qsort(e->bounds, nb, sizeof(uint32_t), cmp_u32);
    size_t m = 0;
    for (size_t i = 0; i < nb; i++)
        if (!m || e->bounds[i] != e->bounds[m - 1]) e->bounds[m++] = e->bounds[i];
    if (grow(&e->high, &e->cap_high, e->n_high + 1 + 3 * m, sizeof(int32_t)) < 0) return -1;
    int32_t t = (int32_t)e->n_high, *h = e->high + t;
    h[0] = (int32_t)m;
    for (size_t j = 0; j < m; j++) {
        h[1 + j] = (int32_t)e->bounds[j];
        h[1 + m + j] = T_UNKNOWN;
        bool any = false;
        for (uint32_t i = 0; i < n && !any; i++) {
            int32_t id = e->items[off + i];
            any = id != ACCEPT && class_has(g, g->el[e->nodes[id].pos].arg, e->bounds[j]);
        }
        h[1 + 2 * m + j] = any;
    }
    e->n_high += 1 + 3 * m;
    e->sets[s].high = t;
    return t;
}

/* The interval of starts[0..m) (ascending, starts[0] <= cp) holding cp. */
static int32_t high_interval(const int32_t *starts, int32_t m, uint32_t cp) {
    int32_t lo = 0, hi = m; /* the first start > cp, minus one */
    while (lo < hi) {
        int32_t mid = (lo + hi) / 2;
        if ((uint32_t)starts[mid] <= cp) lo = mid + 1;
        else hi = mid;
    }
    return lo - 1;
}

/* "set s reads code point cp", cached: a set id, T_DEAD or T_OVERFLOW.
 * Out of memory reads as T_OVERFLOW (the token is refused, never half-taken). */
static int32_t step(engine *e, int32_t s, uint32_t cp) {
    if (cp < 128) {
        int32_t t = e->sets[s].ascii;
        if (t >= 0 && e->ascii[t + (int32_t)cp] != T_UNKNOWN) return e->ascii[t + (int32_t)cp];
        int32_t r = compute_step(e, s, cp);
        if (r == -4) return T_OVERFLOW;
        if (e->sets[s].ascii < 0 && grow(&e->ascii, &e->cap_ascii, e->n_ascii + 128, sizeof(int32_t)) == 0) {
            e->sets[s].ascii = (int32_t)e->n_ascii;
            for (int i = 0; i < 128; i++) e->ascii[e->n_ascii + (size_t)i] = T_UNKNOWN;
            e->n_ascii += 128;
        }
        if (e->sets[s].ascii >= 0) e->ascii[e->sets[s].ascii + (int32_t)cp] = r;
        return r;
    }
    int32_t t = e->sets[s].high;
    if (t < 0 && (t = high_table(e, s)) < 0) return T_OVERFLOW;
    int32_t m = e->high[t], j = high_interval(e->high + t + 1, m, cp);
    int32_t r = e->high[t + 1 + m + j];
    if (r != T_UNKNOWN) return r;
    /* every code point of interval j is read by the same stacks: one step stands for all */
    r = e->high[t + 1 + 2 * m + j] ? compute_step(e, s, cp) : T_DEAD;
    if (r == -4) return T_OVERFLOW;
    e->high[t + 1 + m + j] = r;
    return r;
}

/* Whether some stack of set s could read a code point in [lo, hi] (lo >= 128: a partly read character). */
static int set_meets(engine *e, int32_t s, uint32_t lo, uint32_t hi) {
    int32_t t = e->sets[s].high;
    if (t < 0 && (t = high_table(e, s)) < 0) return T_OVERFLOW;
    const int32_t *h = e->high + t;
    int32_t m = h[0];
    for (int32_t j = high_interval(h + 1, m, lo); j < m && (uint32_t)h[1 + j] <= hi; j++)
        if (h[1 + 2 * m + j]) return 1;
    return 0;
}

/* The length of the UTF-8 sequence lead byte b starts (2-4), 0 when b starts none. */
static uint32_t utf8_lead_len(uint8_t b) {
    return b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
}

/* The code points [*lo, *hi] a UTF-8 sequence of len bytes can still become,
 * with bits val read and remain bytes to come; false when none is valid
 * (overlong, surrogate or beyond U+10FFFF). */
static bool utf8_range(uint32_t val, uint32_t remain, uint32_t len, uint32_t *lo, uint32_t *hi) {
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000}, max_cp[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    uint32_t a = val << (6 * remain), b = a | ((1u << (6 * remain)) - 1);
    if (a < min_cp[len]) a = min_cp[len];
    if (b > max_cp[len]) b = max_cp[len];
    *lo = a;
    *hi = b;
    return a <= b && !(a >= 0xD800 && b <= 0xDFFF);
}

/* Advances walk w by one byte: 1 alive, 0 no parse left (or invalid UTF-8), T_OVERFLOW. */
static int walk_byte(engine *e, walk *w, uint8_t b) {
    if (w->remain == 0) {
        if (b < 0x80) {
            int32_t r = step(e, w->set, b);
            if (r < 0) return r == T_OVERFLOW ? T_OVERFLOW : 0;
            w->set = r;
            return 1;
        }
        uint32_t n = utf8_lead_len(b);
        if (!n) return 0;
        w->val = b & (0x7Fu >> n);
        w->remain = n - 1;
        w->len = n;
    } else {
        if ((b & 0xC0) != 0x80) return 0;
        w->val = (w->val << 6) | (b & 0x3F);
        w->remain--;
    }
    uint32_t lo, hi;
    if (!utf8_range(w->val, w->remain, w->len, &lo, &hi)) return 0;
    if (w->remain) return set_meets(e, w->set, lo, hi);
    int32_t r = step(e, w->set, w->val);
    if (r < 0) return r == T_OVERFLOW ? T_OVERFLOW : 0;
    w->set = r;
    return 1;
}

/* Whether every character above ASCII leads set s to one live set (its uni_next). */
static bool set_high_uniform(engine *e, int32_t s) {
    if (e->sets[s].high_known) return e->sets[s].high_uni;
    int32_t t = e->sets[s].high;
    if (t < 0) t = high_table(e, s);
    bool uni = t >= 0;
    for (int32_t j = 0, m = t >= 0 ? e->high[t] : 0; uni && j < m; j++) {
        int32_t r = e->high[t + 1 + m + j];
        if (!e->high[t + 1 + 2 * m + j]) r = T_DEAD;
        else if (r == T_UNKNOWN) {
            r = compute_step(e, s, (uint32_t)e->high[t + 1 + j]);
            e->high[t + 1 + m + j] = r = r == -4 ? T_OVERFLOW : r;
        }
        if (r >= 0 && e->sets[s].uni_next < 0) e->sets[s].uni_next = r;
        uni = r >= 0 && r == e->sets[s].uni_next;
    }
    e->sets[s].high_uni = uni;
    e->sets[s].high_known = true;
    return uni;
}

/* The one live set that every byte in ascii (a 128-bit set) and, when high,
 * every character above ASCII lead set s to; -1 when they do not all lead to
 * one. Learns per byte, once per set. */
static int32_t set_uniform_next(engine *e, int32_t s, const uint64_t ascii[2], bool high) {
    if (high && !set_high_uniform(e, s)) return -1;
    for (int w = 0; w < 2; w++) {
        if (ascii[w] & e->sets[s].uni_no[w]) return -1;
        for (uint64_t todo = ascii[w] & ~e->sets[s].uni_yes[w]; todo; todo &= todo - 1) {
            uint32_t b = 64 * (uint32_t)w + (uint32_t)__builtin_ctzll(todo);
            int32_t r = step(e, s, (uint8_t)b);
            if (r >= 0 && e->sets[s].uni_next < 0) e->sets[s].uni_next = r;
            bool same = r >= 0 && r == e->sets[s].uni_next;
            if (same) e->sets[s].uni_yes[w] |= 1ULL << (b & 63);
            else e->sets[s].uni_no[w] |= 1ULL << (b & 63);
            if (!same) return -1;
        }
    }
    return e->sets[s].uni_next;
}

/* The id in engine dst of node id of engine src (with its whole stack). */
static int32_t import_node(engine *dst, const engine *src, int32_t id, u64map *done) {
    int32_t chain[64];
    int n = 0;
    int32_t base = ACCEPT; /* the deepest node already in dst */
    while (id != ACCEPT) {
        int32_t known = u64map_get(done, (uint64_t)id);
        if (known >= 0) {
            base = known;
            break;
        }
        if (n == 64) { /* a long stack: import its lower part first */
            base = import_node(dst, src, id, done);
            if (base < 0) return -1;
            break;
        }
        chain[n++] = id;
        id = src->nodes[id].parent;
    }
    while (n--) {
        int32_t nid = intern_node(dst, src->nodes[chain[n]].pos, base);
        if (nid < 0 || u64map_put(done, (uint64_t)chain[n], nid) < 0) return -1;
        base = nid;
    }
    return base;
}

/* The id in engine dst of set s of engine src. */
static int32_t import_set(engine *dst, const engine *src, int32_t s, u64map *done) {
    const sset *ss = &src->sets[s];
    int32_t *ids = malloc((ss->n ? ss->n : 1) * sizeof(int32_t));
    if (!ids) return -1;
    for (uint32_t i = 0; i < ss->n; i++) {
        ids[i] = import_node(dst, src, src->items[ss->off + i], done);
        if (ids[i] < 0) {
            free(ids);
            return -1;
        }
    }
    qsort(ids, ss->n, sizeof(int32_t), cmp_i32);
    int32_t r = intern_set(dst, ids, ss->n);
    free(ids);
    return r;
}

/* Rebuilds engine e from the sets still in use (e->cur and live[0..n_live)),
 * dropping every cache; marks e broken when even that is over the budget. */
static void engine_compact(engine *e, walk *live, size_t n_live) {
    engine *f = engine_new(e->g);
    u64map done = {0};
    bool ok = f != NULL;
    if (ok) {
        f->budget = e->budget;
        f->cur = e->cur;
        f->cur.set = import_set(f, e, e->cur.set, &done);
        ok = f->cur.set >= 0;
        for (size_t i = 0; ok && i < n_live; i++) ok = (live[i].set = import_set(f, e, live[i].set, &done)) >= 0;
    }
    u64map_free(&done);
    if (!ok || engine_bytes(f) > e->budget / 2) {
        e->broken = true;
        engine_free(f);
        return;
    }
    f->scratch = e->scratch;
    f->cap_scratch = e->cap_scratch;
    e->scratch = NULL;
    engine tmp = *e;
    *e = *f;
    *f = tmp;
    engine_free(f);
}

static void engine_keep_bounded(engine *e, walk *live, size_t n_live) {
    if (!e->broken && engine_bytes(e) > e->budget) engine_compact(e, live, n_live);
}

/* ------------------------------------------------------------------ */
/* States                                                               */
/* ------------------------------------------------------------------ */

void serve_grammar_set_cache_budget(serve_grammar *g, size_t bytes) { g->cache_budget = bytes; }

serve_grammar_state *serve_grammar_state_create(const serve_grammar *g, moex_error *err) {
    if (!g) return moex_fail(err, "grammar: no grammar"), NULL;
    serve_grammar_state *s = calloc(1, sizeof *s);
    engine *e = engine_new(g);
    if (!s || !e) {
        free(s);
        engine_free(e);
        return moex_fail(err, "out of memory"), NULL;
    }
    s->e = e;
    int32_t set = start_set(e);
    if (set < 0) {
        serve_grammar_state_free(s);
        if (set == T_OVERFLOW)
            return moex_fail(err, "grammar: too ambiguous (over %d parses at the start)", MAX_STACKS), NULL;
        if (set == T_DEAD) return moex_fail(err, "grammar: the start rule matches nothing"), NULL;
        return moex_fail(err, "out of memory"), NULL;
    }
    e->cur = (walk){set, 0, 0, 0};
    return s;
}

serve_grammar_state *serve_grammar_state_clone(const serve_grammar_state *s, moex_error *err) {
    serve_grammar_state *c = calloc(1, sizeof *c);
    engine *e = engine_new(s->e->g);
    u64map done = {0};
    if (c && e) {
        e->budget = s->e->budget;
        e->cur = s->e->cur;
        e->cur.set = import_set(e, s->e, s->e->cur.set, &done);
        e->broken = s->e->broken;
    }
    u64map_free(&done);
    if (!c || !e || e->cur.set < 0) {
        free(c);
        engine_free(e);
        return moex_fail(err, "out of memory"), NULL;
    }
    c->e = e;
    return c;
}

void serve_grammar_state_free(serve_grammar_state *s) {
    if (!s) return;
    engine_free(s->e);
    free(s);
}

static bool set_has_accept(const engine *e, int32_t s) {
    return e->sets[s].n && e->items[e->sets[s].off] == ACCEPT;
}

bool serve_grammar_can_end(const serve_grammar_state *s) {
    const engine *e = s->e;
    return !e->broken && e->cur.remain == 0 && set_has_accept(e, e->cur.set);
}

bool serve_grammar_must_end(const serve_grammar_state *s) {
    const engine *e = s->e;
    return serve_grammar_can_end(s) && e->sets[e->cur.set].n == 1;
}

/* ------------------------------------------------------------------ */
/* The vocabulary: token bytes and their trie                           */
/* ------------------------------------------------------------------ */

/* A trie node in depth-first (preorder) order: its subtree is [i, skip). */
typedef struct {
    uint32_t skip;
    uint32_t tok_begin;  /* tokens ending here: order[tok_begin .. next node's tok_begin) */
    uint32_t depth_byte; /* depth (1 for a first byte) << 8 | the byte */
} tnode;

struct serve_grammar_vocab {
    int32_t n_vocab;
    uint8_t *blob;
    uint64_t *off;
    uint32_t *len;
    uint8_t *eog;
    int32_t *eog_ids;
    int32_t n_eog;
    tnode *nodes; /* n_nodes + 1 (a sentinel) */
    uint32_t n_nodes;
    int32_t *order; /* tokens in the trie, by node */
    uint32_t max_depth;
    uint64_t *below;     /* per node, 2 words: the ASCII bytes anywhere below it */
    uint8_t *below_flags; /* per node: BELOW_HIGH, BELOW_VALID */
    uint32_t *height;     /* per node: the most bytes on a path below it */
};

enum {
    BELOW_HIGH = 1,  /* some byte >= 0x80 below the node */
    BELOW_VALID = 2, /* every path below is the start of valid UTF-8 (read from a character boundary at the root) */
    FAST_SUBTREE = 16 /* subtrees at least this big are checked for "all of it stays in the set" */
};

void serve_grammar_vocab_free(serve_grammar_vocab *v) {
    if (!v) return;
    free(v->blob);
    free(v->off);
    free(v->len);
    free(v->eog);
    free(v->eog_ids);
    free(v->nodes);
    free(v->order);
    free(v->below);
    free(v->below_flags);
    free(v->height);
    free(v);
}

/* A token for sorting by text (a prefix first, then by id). */
typedef struct {
    int32_t id;
    const uint8_t *bytes;
    uint32_t len;
} tok_ref;

static int cmp_token_text(const void *a, const void *b) {
    const tok_ref *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->bytes, y->bytes, n);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* For each trie node, what lies below it (so that a vocabulary walk can take
 * a whole subtree at once when every byte in it leads the parse back to where
 * it is): the ASCII bytes, whether any byte is not ASCII, and whether every
 * path is valid UTF-8 (a text may stop inside a character). */
static int summarize_trie(serve_grammar_vocab *v, moex_error *err) {
    uint32_t nn = v->n_nodes;
    v->below = calloc(2 * (size_t)nn + 2, sizeof(uint64_t));
    v->below_flags = calloc((size_t)nn + 1, 1);
    v->height = calloc((size_t)nn + 1, sizeof(uint32_t));
    uint8_t *valid = malloc((size_t)nn + 1);
    typedef struct {
        uint32_t val, remain, len;
        bool ok;
    } dec;
    dec *st = malloc(((size_t)v->max_depth + 1) * sizeof(dec));
    if (!v->below || !v->below_flags || !v->height || !valid || !st) {
        free(valid);
        free(st);
        return moex_fail(err, "out of memory");
    }
    st[0] = (dec){0, 0, 0, true};
    for (uint32_t i = 0; i < nn; i++) { /* each node's path from the root: a valid UTF-8 start? */
        uint32_t d = v->nodes[i].depth_byte >> 8;
        uint8_t b = (uint8_t)v->nodes[i].depth_byte;
        dec x = st[d - 1];
        if (x.ok && x.remain == 0) {
            if (b >= 0x80) {
                uint32_t n = utf8_lead_len(b);
                x = n ? (dec){b & (0x7Fu >> n), n - 1, n, true} : (dec){0, 0, 0, false};
            }
        } else if (x.ok) {
            x.ok = (b & 0xC0) == 0x80;
            x.val = (x.val << 6) | (b & 0x3F);
            x.remain--;
        }
        uint32_t lo, hi;
        if (x.ok && x.len && !utf8_range(x.val, x.remain, x.len, &lo, &hi)) x.ok = false;
        if (x.ok && x.remain == 0) x.len = 0;
        st[d] = x;
        valid[i] = x.ok;
    }
    for (uint32_t i = nn; i-- > 0;) { /* children before parents */
        uint64_t lo = 0, hi = 0;
        uint8_t f = BELOW_VALID;
        uint32_t height = 0;
        for (uint32_t c = i + 1; c < v->nodes[i].skip; c = v->nodes[c].skip) {
            if (v->height[c] + 1 > height) height = v->height[c] + 1;
            uint8_t b = (uint8_t)v->nodes[c].depth_byte;
            lo |= v->below[2 * (size_t)c];
            hi |= v->below[2 * (size_t)c + 1];
            if (b < 64) lo |= 1ULL << b;
            else if (b < 128) hi |= 1ULL << (b - 64);
            else f |= BELOW_HIGH;
            f |= v->below_flags[c] & BELOW_HIGH;
            if (!valid[c] || !(v->below_flags[c] & BELOW_VALID)) f &= (uint8_t)~BELOW_VALID;
        }
        v->below[2 * (size_t)i] = lo;
        v->below[2 * (size_t)i + 1] = hi;
        v->below_flags[i] = f;
        v->height[i] = height;
    }
    free(valid);
    free(st);
    return 0;
}

/* Builds the trie of the tokens (neither empty nor EOG) in preorder. */
static int build_trie(serve_grammar_vocab *v, moex_error *err) {
    size_t n_tok = 0, n_bytes = 0;
    for (int32_t i = 0; i < v->n_vocab; i++)
        if (v->len[i] && !v->eog[i]) n_tok++, n_bytes += v->len[i];
    tok_ref *refs = malloc((n_tok ? n_tok : 1) * sizeof(tok_ref));
    v->order = malloc((n_tok ? n_tok : 1) * sizeof(int32_t));
    v->nodes = malloc((n_bytes + 1) * sizeof(tnode));
    uint32_t *path = malloc(((size_t)v->max_depth + 1) * sizeof(uint32_t));
    uint32_t *term = malloc((n_tok ? n_tok : 1) * sizeof(uint32_t));
    if (!refs || !v->order || !v->nodes || !path || !term) {
        free(refs);
        free(path);
        free(term);
        return moex_fail(err, "out of memory");
    }
    size_t k = 0;
    for (int32_t i = 0; i < v->n_vocab; i++)
        if (v->len[i] && !v->eog[i]) refs[k++] = (tok_ref){i, v->blob + v->off[i], v->len[i]};
    qsort(refs, n_tok, sizeof(tok_ref), cmp_token_text);
    uint32_t nn = 0;
    for (size_t t = 0; t < n_tok; t++) {
        uint32_t lcp = 0;
        if (t) {
            uint32_t m = refs[t - 1].len < refs[t].len ? refs[t - 1].len : refs[t].len;
            while (lcp < m && refs[t - 1].bytes[lcp] == refs[t].bytes[lcp]) lcp++;
        }
        for (uint32_t d = lcp; d < refs[t].len; d++) {
            path[d] = nn;
            v->nodes[nn++] = (tnode){0, 0, ((d + 1) << 8) | refs[t].bytes[d]};
        }
        term[t] = path[refs[t].len - 1];
        v->order[t] = refs[t].id;
    }
    v->n_nodes = nn;
    /* tokens are sorted, so their end nodes ascend: tok_begin by a running count */
    size_t t = 0;
    for (uint32_t i = 0; i <= nn; i++) {
        v->nodes[i].tok_begin = (uint32_t)t;
        while (t < n_tok && term[t] == i) t++;
    }
    /* subtree ends: a node's subtree stops at the next node no deeper than it */
    uint32_t sp = 0;
    for (uint32_t i = 0; i < nn; i++) {
        uint32_t d = v->nodes[i].depth_byte >> 8;
        while (sp && (v->nodes[path[sp - 1]].depth_byte >> 8) >= d) v->nodes[path[--sp]].skip = i;
        path[sp++] = i;
    }
    while (sp) v->nodes[path[--sp]].skip = nn;
    v->nodes[nn] = (tnode){nn, (uint32_t)n_tok, 0};
    free(refs);
    free(path);
    free(term);
    return summarize_trie(v, err);
}

serve_grammar_vocab *serve_grammar_vocab_create(int32_t n_vocab, const char *const *bytes, const uint32_t *len,
                                                const bool *eog, moex_error *err) {
    if (n_vocab <= 0 || !bytes || !len) return moex_fail(err, "grammar vocab: no tokens"), NULL;
    serve_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return moex_fail(err, "out of memory"), NULL;
    v->n_vocab = n_vocab;
    size_t total = 0, n_eog = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        if (len[i] > MAX_TOKEN_BYTES) {
            serve_grammar_vocab_free(v);
            return moex_fail(err, "grammar vocab: token %d is %u bytes long (at most %d)", i, len[i], MAX_TOKEN_BYTES), NULL;
        }
        if (len[i] && !bytes[i]) {
            serve_grammar_vocab_free(v);
            return moex_fail(err, "grammar vocab: token %d has no bytes", i), NULL;
        }
        total += len[i];
        n_eog += eog && eog[i];
        if (len[i] > v->max_depth) v->max_depth = len[i];
    }
    v->blob = malloc(total ? total : 1);
    v->off = malloc((size_t)n_vocab * sizeof(uint64_t));
    v->len = malloc((size_t)n_vocab * sizeof(uint32_t));
    v->eog = calloc((size_t)n_vocab, 1);
    v->eog_ids = malloc((n_eog ? n_eog : 1) * sizeof(int32_t));
    if (!v->blob || !v->off || !v->len || !v->eog || !v->eog_ids) {
        serve_grammar_vocab_free(v);
        return moex_fail(err, "out of memory"), NULL;
    }
    size_t at = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        v->off[i] = at;
        v->len[i] = len[i];
        if (len[i]) memcpy(v->blob + at, bytes[i], len[i]);
        at += len[i];
        v->eog[i] = eog && eog[i];
        if (v->eog[i]) v->eog_ids[v->n_eog++] = i;
    }
    if (build_trie(v, err) < 0) {
        serve_grammar_vocab_free(v);
        return NULL;
    }
    return v;
}

/* ------------------------------------------------------------------ */
/* Allowing, masking and accepting tokens                               */
/* ------------------------------------------------------------------ */

/* Walks token id's bytes from the state: 1 allowed, 0 refused, T_OVERFLOW. */
static int walk_token(engine *e, const serve_grammar_vocab *v, int32_t id, walk *w) {
    const uint8_t *b = v->blob + v->off[id];
    for (uint32_t i = 0; i < v->len[id]; i++) {
        int r = walk_byte(e, w, b[i]);
        if (r <= 0) return r;
    }
    return 1;
}

bool serve_grammar_allows(const serve_grammar_state *s, const serve_grammar_vocab *v, int32_t id) {
    engine *e = s->e;
    if (id < 0 || id >= v->n_vocab || e->broken) return false;
    if (v->eog[id]) return serve_grammar_can_end(s);
    if (!v->len[id]) return false;
    engine_keep_bounded(e, NULL, 0);
    if (e->broken) return false;
    walk w = e->cur;
    return walk_token(e, v, id, &w) == 1;
}

/* Whether every token below trie node i is allowed, the walk having reached
 * i in set s at a character boundary: when every character that occurs below
 * leads s to one set S1, S1 likewise to S2, ... for as many characters as the
 * deepest path below has bytes, every path stays alive (inside a JSON string
 * the chain is s, s, ...: a loop; inside one of at most n characters it
 * counts up). Then the walk takes the subtree at once. */
static bool subtree_stays(engine *e, const serve_grammar_vocab *v, uint32_t i, int32_t s) {
    uint8_t f = v->below_flags[i];
    if ((f & BELOW_HIGH) && !(f & BELOW_VALID)) return false;
    const uint64_t *ascii = v->below + 2 * (size_t)i;
    for (uint32_t j = 0; j < v->height[i]; j++) {
        int32_t next = set_uniform_next(e, s, ascii, f & BELOW_HIGH);
        if (next < 0) return false;
        if (next == s) return true; /* a loop: it holds for any length */
        s = next;
    }
    return true;
}

static bool same_walk(const walk *a, const walk *b) {
    return a->set == b->set && a->remain == b->remain && (!a->remain || (a->val == b->val && a->len == b->len));
}

/* The cached mask of the state's position, or NULL. */
static cached_mask *find_mask(engine *e, const serve_grammar_vocab *v) {
    for (int i = 0; i < MASK_CACHE; i++)
        if (e->masks[i].bits && e->masks[i].v == v && e->masks[i].n_vocab == v->n_vocab && same_walk(&e->masks[i].at, &e->cur))
            return &e->masks[i];
    return NULL;
}

/* Spreads bits to one byte per token: byte j of the result is bit j of b
 * (little-endian stores, as on every target this builds for). */
static void bits_to_bytes(const uint8_t *bits, int32_t n, uint8_t *out) {
    int32_t full = n / 8;
    for (int32_t k = 0; k < full; k++) {
        uint64_t x = bits[k];
        x = (x | (x << 28)) & 0x0000000F0000000FULL;
        x = (x | (x << 14)) & 0x0003000300030003ULL;
        x = (x | (x << 7)) & 0x0101010101010101ULL;
        memcpy(out + 8 * (size_t)k, &x, 8);
    }
    for (int32_t i = 8 * full; i < n; i++) out[i] = (bits[i / 8] >> (i % 8)) & 1;
}

static void remember_mask(engine *e, const serve_grammar_vocab *v, const uint8_t *allowed, int32_t count) {
    cached_mask *m = &e->masks[0];
    for (int i = 1; i < MASK_CACHE; i++)
        if (e->masks[i].used < m->used) m = &e->masks[i];
    if (!m->bits || m->v != v || m->n_vocab != v->n_vocab) {
        free(m->bits);
        m->bits = calloc(((size_t)v->n_vocab + 7) / 8, 1);
        if (!m->bits) return;
    } else {
        memset(m->bits, 0, ((size_t)v->n_vocab + 7) / 8);
    }
    for (int32_t i = 0; i < v->n_vocab; i++)
        if (allowed[i]) m->bits[i / 8] |= (uint8_t)(1u << (i % 8));
    m->v = v;
    m->n_vocab = v->n_vocab;
    m->at = e->cur;
    m->count = count;
    m->used = ++e->mask_clock;
}

int32_t serve_grammar_mask(const serve_grammar_state *s, const serve_grammar_vocab *v, uint8_t *allowed) {
    engine *e = s->e;
    if (e->broken) return memset(allowed, 0, (size_t)v->n_vocab), 0;
    cached_mask *hit = find_mask(e, v);
    if (hit) {
        hit->used = ++e->mask_clock;
        bits_to_bytes(hit->bits, v->n_vocab, allowed);
        return hit->count;
    }
    memset(allowed, 0, (size_t)v->n_vocab);
    int32_t count = 0;
    if (serve_grammar_can_end(s))
        for (int32_t i = 0; i < v->n_eog; i++) allowed[v->eog_ids[i]] = 1, count++;
    if (grow(&e->scratch, &e->cap_scratch, (size_t)v->max_depth + 1, sizeof(walk)) < 0)
        return memset(allowed, 0, (size_t)v->n_vocab), 0;
    engine_keep_bounded(e, NULL, 0);
    if (e->broken) return memset(allowed, 0, (size_t)v->n_vocab), 0;
    walk *ws = e->scratch;
    ws[0] = e->cur;
    const tnode *nodes = v->nodes;
    const int32_t *order = v->order;
    size_t next_check = e->n_sets + 64;
    bool boundary = ws[0].remain == 0; /* the trie's UTF-8 summaries hold only from a character boundary */
    for (uint32_t i = 0; i < v->n_nodes;) {
        uint32_t d = nodes[i].depth_byte >> 8;
        uint8_t byte = (uint8_t)nodes[i].depth_byte;
        walk w = ws[d - 1];
        if (byte < 0x80 && !w.remain) { /* the common case, inline: one cached ASCII step */
            int32_t t = e->sets[w.set].ascii, r = t >= 0 ? e->ascii[t + byte] : T_UNKNOWN;
            if (r == T_UNKNOWN) r = step(e, w.set, byte);
            if (r < 0) {
                i = nodes[i].skip;
                continue;
            }
            w.set = r;
        } else if (walk_byte(e, &w, byte) <= 0) {
            i = nodes[i].skip; /* no parse survives: skip every token below */
            continue;
        }
        ws[d] = w;
        uint32_t end = nodes[i].skip;
        if (boundary && !w.remain && end - i >= FAST_SUBTREE && subtree_stays(e, v, i, w.set)) {
            /* every token from here down is allowed: no need to walk them */
            for (uint32_t k = nodes[i].tok_begin; k < nodes[end].tok_begin; k++) allowed[order[k]] = 1, count++;
            i = end;
            continue;
        }
        for (uint32_t k = nodes[i].tok_begin; k < nodes[i + 1].tok_begin; k++) allowed[order[k]] = 1, count++;
        i++;
        if (e->n_sets < next_check) continue; /* now and then: keep the caches within their budget */
        next_check = e->n_sets + 64;
        engine_keep_bounded(e, ws, d + 1);
        if (e->broken) return memset(allowed, 0, (size_t)v->n_vocab), 0;
    }
    remember_mask(e, v, allowed, count);
    return count;
}

int serve_grammar_accept(serve_grammar_state *s, const serve_grammar_vocab *v, int32_t id, moex_error *err) {
    engine *e = s->e;
    if (e->broken) return moex_fail(err, "grammar: the matcher ran out of its memory bound (%zu bytes)", e->budget);
    if (id < 0 || id >= v->n_vocab) return moex_fail(err, "grammar: token %d is out of the vocabulary", id);
    if (v->eog[id]) {
        if (!serve_grammar_can_end(s)) return moex_fail(err, "grammar: end of generation before the grammar is complete");
        step_begin(e);
        if (output_node(e, ACCEPT) < 0) return moex_fail(err, "out of memory");
        int32_t end = finish_step(e, 0);
        if (end < 0) return moex_fail(err, "out of memory");
        e->cur = (walk){end, 0, 0, 0};
        return 0;
    }
    if (!v->len[id]) return moex_fail(err, "grammar: token %d has no text", id);
    engine_keep_bounded(e, NULL, 0);
    walk w = e->cur;
    int r = e->broken ? T_OVERFLOW : walk_token(e, v, id, &w);
    if (r == T_OVERFLOW)
        return moex_fail(err, "grammar: too ambiguous or too large at token %d (over %d parses, or the memory bound)", id,
                         MAX_STACKS);
    if (r != 1) {
        uint32_t n = v->len[id] < 40 ? v->len[id] : 40;
        return moex_fail(err, "grammar: token %d (\"%.*s\") is not allowed here", id, (int)n, (const char *)v->blob + v->off[id]);
    }
    e->cur = w;
    return 0;
}
