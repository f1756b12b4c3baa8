/* Pre-tokenizers: split text (as code points) into the words BPE merges
 * within. Hand-written matchers for the few regexes llama.cpp uses for the
 * models we run, written after unicode.cpp's unicode_regex_split_custom_*
 * so that word boundaries (and so token ids) match llama.cpp exactly. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer_impl.h"
#include "common/tokenizer_testing.h"
#include "common/unicode.h"

#define OUT_OF_RANGE 0xFFFFFFFFu

/* A span [ini, end) of the code points being split, with accessors that
 * read past the span's end as "nothing" (flags 0), as llama.cpp does. */
typedef struct span {
    const uint32_t *cps;
    size_t ini, end;
    size_t prev_end;     /* end of the last word emitted */
    moex_i32vec *ends;
    int oom;
} span;

static uint32_t cpt_at(const span *s, size_t pos) { return pos < s->end ? s->cps[pos] : OUT_OF_RANGE; }
static uint8_t flags_at(const span *s, size_t pos) { return pos < s->end ? moex_unicode_flags(s->cps[pos]) : 0; }

/* Ends the current word at `end` (empty words are dropped); returns its length. */
static size_t emit(span *s, size_t end) {
    size_t len = end - s->prev_end;
    if (len > 0 && moex_i32vec_push(s->ends, (int32_t)end)) s->oom = 1;
    s->prev_end = end;
    return len;
}

static bool is_ws(uint8_t f) { return f & MOEX_UCF_WHITESPACE; }
static bool is_letter(uint8_t f) { return f & MOEX_UCF_LETTER; }
static bool is_number(uint8_t f) { return f & MOEX_UCF_NUMBER; }
static bool is_other(uint8_t f) { return f && !(f & (MOEX_UCF_WHITESPACE | MOEX_UCF_LETTER | MOEX_UCF_NUMBER)); }
static bool is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

/* Case foldings for the contractions: none (gpt2), Unicode lowercase (llama3's
 * (?i:...)), ASCII only (gpt-4o's '[sS]|'[tT]|...). */
typedef uint32_t (*fold_fn)(uint32_t c);
static uint32_t fold_none(uint32_t c) { return c; }
static uint32_t fold_ascii(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* 's|'t|'re|'ve|'m|'ll|'d at pos, compared after fold: the length matched (0 if none). */
static size_t contraction_len(const span *s, size_t pos, fold_fn fold) {
    if (cpt_at(s, pos) != '\'' || pos + 1 >= s->end) return 0;
    uint32_t c1 = fold(cpt_at(s, pos + 1));
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if (pos + 2 >= s->end) return 0;
    uint32_t c2 = fold(cpt_at(s, pos + 2));
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
    return 0;
}

/* Whitespace tail shared by the patterns: \s+(?!\S) then \s+ (gpt2), with
 * \s*[\r\n]+ first when crlf_rule (llama3). Returns the new position. */
static size_t match_whitespace(span *s, size_t pos, bool crlf_rule) {
    size_t n_ws = 0, last_crlf_end = 0;
    while (is_ws(flags_at(s, pos + n_ws))) {
        if (crlf_rule && is_crlf(cpt_at(s, pos + n_ws))) last_crlf_end = pos + n_ws + 1;
        n_ws++;
    }
    if (last_crlf_end > 0) pos = last_crlf_end;                                    /* \s*[\r\n]+ */
    else if (n_ws > 1 && cpt_at(s, pos + n_ws) != OUT_OF_RANGE) pos += n_ws - 1;  /* \s+(?!\S) */
    else if (n_ws > 0) pos += n_ws;                                                 /* \s+ */
    else pos += 1;                                                                  /* no match */
    emit(s, pos);
    return pos;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static void split_gpt2(span *s) {
    for (size_t pos = s->ini; pos < s->end && !s->oom;) {
        const uint32_t c = cpt_at(s, pos);
        size_t n = contraction_len(s, pos, fold_none);
        if (n) {
            pos += emit(s, pos + n);
            continue;
        }
        uint8_t f2 = c == ' ' ? flags_at(s, pos + 1) : flags_at(s, pos);
        if (is_letter(f2) || is_number(f2) || is_other(f2)) {
            /* <space>? then a run of the same class */
            bool (*same)(uint8_t) = is_letter(f2) ? is_letter : is_number(f2) ? is_number : is_other;
            pos += (c == ' ');
            while (same(f2)) f2 = flags_at(s, ++pos);
            emit(s, pos);
            continue;
        }
        pos = match_whitespace(s, pos, false);
    }
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static void split_llama3(span *s, size_t max_digits) {
    for (size_t pos = s->ini; pos < s->end && !s->oom;) {
        const uint32_t c = cpt_at(s, pos);
        const uint8_t f = flags_at(s, pos);
        size_t n = contraction_len(s, pos, moex_unicode_tolower);
        if (n) {
            pos += emit(s, pos + n);
            continue;
        }
        /* [^\r\n\p{L}\p{N}]?\p{L}+ */
        if (!is_crlf(c) && !is_number(f) && (is_letter(f) || is_letter(flags_at(s, pos + 1)))) {
            pos++;
            while (is_letter(flags_at(s, pos))) pos++;
            emit(s, pos);
            continue;
        }
        /* \p{N}{1,max_digits} */
        if (is_number(f)) {
            size_t ini = pos;
            while (is_number(flags_at(s, pos))) {
                if (++pos - ini >= max_digits) {
                    emit(s, pos);
                    ini = pos;
                }
            }
            emit(s, pos);
            continue;
        }
        /*  ?[^\s\p{L}\p{N}]+[\r\n]*  (llama.cpp tests the first code point's
         * flags for "is anything", which only matters past the end) */
        uint8_t f2 = c == ' ' ? flags_at(s, pos + 1) : f;
        if (!(is_ws(f2) || is_letter(f2) || is_number(f2)) && f) {
            pos += (c == ' ');
            while (is_other(f2)) f2 = flags_at(s, ++pos);
            while (is_crlf(cpt_at(s, pos))) pos++;
            emit(s, pos);
            continue;
        }
        pos = match_whitespace(s, pos, true);
    }
}

/* ---- gpt-4o (o200k: gpt-oss, llama4, ...) ----
 * llama.cpp runs this regex with std::regex over its "collapsed" text (each
 * code point above ASCII replaced by one byte standing for its category):
 *   [^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?
 *  |[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|...)?
 *  |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * So "upper" means a letter other than a-z and "lower" a letter other than
 * A-Z: a letter outside ASCII is both, and marks are not letters. The
 * matchers below give the match ECMAScript's backtracking picks first. */

enum { CASE_UPPER = 1, CASE_LOWER = 2 };

/* CASE_* bits of the letter at pos as the collapsed regex sees it; 0 if no letter. */
static int gpt4o_case(const span *s, size_t pos) {
    if (!is_letter(flags_at(s, pos))) return 0;
    uint32_t c = cpt_at(s, pos);
    if (c >= 'A' && c <= 'Z') return CASE_UPPER;
    if (c >= 'a' && c <= 'z') return CASE_LOWER;
    return CASE_UPPER | CASE_LOWER;
}

/* The two letter alternatives at pos: the end of the match, 0 if neither matches.
 * After the optional leading character, (upper)* takes the upper letters [q, j):
 *  - when a lower-only letter follows, (lower)+ runs from it over lower letters;
 *  - otherwise the letters [q, j) are all upper: (upper)* backs off to the
 *    last one that is also lower, which (lower)+ then takes; with none, the
 *    second alternative's (upper)+ takes them all.
 * The optional contraction follows wherever the letters ended. Each call
 * reads only as far as its word (and its trailing upper letters), so the
 * split stays linear. */
static size_t gpt4o_letters_end(const span *s, size_t pos) {
    const uint8_t f = flags_at(s, pos);
    size_t q = pos;
    if (!is_letter(f)) {   /* [^\r\n\p{L}\p{N}]? */
        if (!f || is_crlf(cpt_at(s, pos)) || is_number(f)) return 0;
        q++;
    }
    size_t j = q, end;
    while (gpt4o_case(s, j) & CASE_UPPER) j++;
    if (gpt4o_case(s, j)) {
        end = j + 1;
        while (gpt4o_case(s, end) & CASE_LOWER) end++;
    } else {
        if (j == q) return 0;
        end = j;
        while (end > q && gpt4o_case(s, end - 1) != (CASE_UPPER | CASE_LOWER)) end--;
        if (end == q) end = j;
    }
    return end + contraction_len(s, end, fold_ascii);
}

static void split_gpt4o(span *s) {
    for (size_t pos = s->ini; pos < s->end && !s->oom;) {
        const uint32_t c = cpt_at(s, pos);
        const uint8_t f = flags_at(s, pos);
        size_t end = gpt4o_letters_end(s, pos);
        if (end) {
            pos = end;
            emit(s, pos);
            continue;
        }
        /* \p{N}{1,3} */
        if (is_number(f)) {
            size_t ini = pos;
            while (pos - ini < 3 && is_number(flags_at(s, pos))) pos++;
            emit(s, pos);
            continue;
        }
        /*  ?[^\s\p{L}\p{N}]+[\r\n/]* */
        size_t q = pos + (c == ' ' && is_other(flags_at(s, pos + 1)));
        if (is_other(flags_at(s, q))) {
            while (is_other(flags_at(s, q))) q++;
            while (is_crlf(cpt_at(s, q)) || cpt_at(s, q) == '/') q++;
            pos = q;
            emit(s, pos);
            continue;
        }
        pos = match_whitespace(s, pos, true);   /* \s*[\r\n]+|\s+(?!\S)|\s+ */
    }
}

/* ---- the default pre-tokenizer: several regexes, each splitting the
 * previous pass's words further; unmatched gaps stay words of their own ---- */

/* One pass over the words in `in`, splitting each with fn into `out`. */
typedef void (*split_fn)(span *s);

static int run_pass(const uint32_t *cps, const moex_i32vec *in, moex_i32vec *out, split_fn fn) {
    size_t start = 0;
    for (size_t i = 0; i < in->n; i++) {
        span s = {.cps = cps, .ini = start, .end = (size_t)in->v[i], .prev_end = start, .ends = out};
        fn(&s);
        if (s.oom) return -1;
        start = (size_t)in->v[i];
    }
    return 0;
}

/* Splits the span into runs where pred holds (matches) and the gaps between. */
static void split_runs(span *s, bool (*pred)(uint32_t c)) {
    size_t pos = s->ini;
    while (pos < s->end) {
        bool in_run = pred(s->cps[pos]);
        while (pos < s->end && pred(s->cps[pos]) == in_run) pos++;
        emit(s, pos);
    }
}

/* [\p{P}\$\+<=>\^~\|] as llama.cpp evaluates it on its collapsed text:
 * ASCII by the character, others when punctuation and not whitespace. */
static bool is_default_punct(uint32_t c) {
    if (c < 128) {
        uint8_t f = moex_unicode_ascii_flags[c];
        return (f & MOEX_UCF_PUNCT) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
               c == '~' || c == '|';
    }
    uint8_t f = moex_unicode_flags(c);
    return (f & MOEX_UCF_PUNCT) && !(f & MOEX_UCF_WHITESPACE);
}
static bool is_any_number(uint32_t c) {
    uint8_t f = moex_unicode_flags(c);
    return (f & MOEX_UCF_NUMBER) && !(f & MOEX_UCF_WHITESPACE);
}
static bool is_ascii_digit(uint32_t c) { return c >= '0' && c <= '9'; }

static void split_punct_runs(span *s) { split_runs(s, is_default_punct); }
static void split_number_runs(span *s) { split_runs(s, is_any_number); }
/* [0-9][0-9][0-9]: successive three-digit matches from the left. */
static void split_digit_triples(span *s) {
    size_t pos = s->ini;
    while (pos + 3 <= s->end) {
        if (is_ascii_digit(s->cps[pos]) && is_ascii_digit(s->cps[pos + 1]) && is_ascii_digit(s->cps[pos + 2])) {
            emit(s, pos);
            emit(s, pos + 3);
            pos += 3;
        } else {
            pos++;
        }
    }
    emit(s, s->end);
}
static void split_gpt2_pass(span *s) { split_gpt2(s); }

static int pretokenize_default(const uint32_t *cps, size_t n, moex_i32vec *ends) {
    static const split_fn passes[] = {split_punct_runs, split_gpt2_pass, split_number_runs, split_digit_triples};
    moex_i32vec a = {0}, b = {0};
    int rc = moex_i32vec_push(&a, (int32_t)n);
    for (size_t i = 0; i < sizeof passes / sizeof passes[0] && !rc; i++) {
        b.n = 0;
        rc = run_pass(cps, &a, &b, passes[i]);
        moex_i32vec t = a;
        a = b;
        b = t;
    }
    for (size_t i = 0; i < a.n && !rc; i++) rc = moex_i32vec_push(ends, a.v[i]);
    moex_i32vec_free(&a);
    moex_i32vec_free(&b);
    return rc;
}

int moex_pretokenize(moex_pre_kind pre, const uint32_t *cps, size_t n, moex_i32vec *ends) {
    if (n == 0) return 0;
    if (pre == MOEX_PRE_DEFAULT) return pretokenize_default(cps, n, ends);
    span s = {.cps = cps, .ini = 0, .end = n, .prev_end = 0, .ends = ends};
    if (pre == MOEX_PRE_GPT2) split_gpt2(&s);
    else if (pre == MOEX_PRE_GPT4O) split_gpt4o(&s);
    else split_llama3(&s, pre == MOEX_PRE_QWEN2 ? 1 : 3);
    return s.oom ? -1 : 0;
}

/* ---- names: tokenizer.ggml.pre values and the regexes they stand for ---- */

static bool name_in(const char *name, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(name, *list)) return true;
    return false;
}

int moex_pre_kind_of(const char *name, moex_pre_kind *kind) {
    static const char *const llama3[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                                         "midm-2.0", "lfm2", "dbrx", "smaug-bpe", NULL};
    static const char *const qwen2[] = {"qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan", NULL};
    static const char *const gpt2[] = {"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
                                       "jina-v2-de", "a.x-4.0", "mellum", "mpt", "olmo", "jais", "trillion", NULL};
    static const char *const gpt4o[] = {"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2", NULL};
    if (!strcmp(name, "default")) *kind = MOEX_PRE_DEFAULT;
    else if (name_in(name, llama3)) *kind = MOEX_PRE_LLAMA3;
    else if (name_in(name, qwen2)) *kind = MOEX_PRE_QWEN2;
    else if (name_in(name, gpt2)) *kind = MOEX_PRE_GPT2;
    else if (name_in(name, gpt4o)) *kind = MOEX_PRE_GPT4O;
    else return -1;
    return 0;
}

int64_t moex_tokenizer_split_words(const char *pre, const char *text, size_t len, int32_t *ends, size_t cap,
                                   moex_error *err) {
    moex_pre_kind kind;
    if (!pre || moex_pre_kind_of(pre, &kind))
        return moex_fail(err, "pre-tokenizer '%s' is not supported (supported: default, llama3 family, qwen2 "
                              "family, gpt-2 family, gpt-4o family)", pre ? pre : "(null)");
    uint32_t *cps = malloc(sizeof *cps * (len ? len : 1));
    moex_i32vec words = {0};
    size_t n = 0;
    for (size_t i = 0, adv; cps && i < len; i += adv) cps[n++] = moex_utf8_decode(text + i, len - i, &adv);
    int64_t rc = !cps || moex_pretokenize(kind, cps, n, &words) ? moex_fail(err, "split_words: out of memory")
                                                               : (int64_t)words.n;
    for (size_t i = 0; rc >= 0 && i < words.n && i < cap; i++) ends[i] = words.v[i];
    free(cps);
    moex_i32vec_free(&words);
    return rc;
}
