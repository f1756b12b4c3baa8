/* Tool calls out of a model's answer as it streams (serve/tool_calls.h), and
 * the whole-answer parse, which is the same machine fed the whole text at
 * once: the two agree by construction, whatever the pieces.
 *
 * The machine keeps the bytes it has not decided yet and decides only what
 * more bytes cannot change (a marker cut anywhere, even inside a UTF-8
 * character, is held until it is whole or cannot be one). Choices:
 *  - A call is taken once its header is whole: the opening marker, the name
 *    and the first byte of the arguments ('{' in JSON formats, the name's end
 *    in XML-style ones). Before that, text that is not a call header (or
 *    breaks off) stays content, as it is.
 *  - JSON arguments go out verbatim, as the model wrote them, from their '{'
 *    to the matching '}' (the whole parse returns the same text). When a byte
 *    that cannot be JSON comes outside a string, the arguments end there (they
 *    are then not valid JSON) and what follows is read as text again; a call
 *    cut off (max_tokens) keeps the arguments written so far, not valid JSON,
 *    as OpenAI does with finish_reason "length". A server that wants to refuse
 *    such calls checks the arguments with a JSON parser.
 *  - XML-style formats (GLM, Qwen3-Coder, DSML) build the arguments object,
 *    compact: a value known to be a string before it starts (DSML's
 *    string="true", or the tool's schema) streams as it comes, escaped; any
 *    other goes out whole when it closes. A value is a string or
 *    JSON as the tool's schema says (a string unless the schema rules strings
 *    out; DSML's string="true" says it itself); without the tool's schema,
 *    JSON when it parses as JSON other than a string, else the string (as
 *    llama.cpp types them by schema). Where a parameter should come and
 *    something else does, the object is closed and the rest is text; a call
 *    cut off leaves the object unclosed.
 *  - Hermes/Llama 3: the name must come first; arguments written as a JSON
 *    string holding an object are taken whole, decoded. Llama 3's bare JSON
 *    call counts only as the answer's start (or right after a call, ';'
 *    between calls), anywhere after <|python_tag|>.
 *  - A header is looked at through a window of HEADER_MAX bytes: one not
 *    decided within it is text, whole or in pieces alike.
 *  - Blank space next to a call (before it, between calls, after the last)
 *    is dropped; other text around calls is content.
 *  - gpt-oss harmony: final-channel and commentary preamble messages are
 *    content, the analysis channel is reasoning, a message to=functions.N is
 *    a call, a message to any other recipient is dropped.
 *  - Content and argument pieces never end inside a UTF-8 character
 *    (until the answer ends). */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/text.h"
#include "serve/tool_calls.h"

#define HEADER_MAX 4096 /* bytes a call header may take before it is not one */

/* ---- growable byte strings ---- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom || !n || (b->oom = moex_grow_bytes(&b->p, &b->cap, b->n + n + 1) != 0)) return;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* Appends s escaped for the inside of a JSON string (UTF-8 kept as is): byte
 * by byte, so pieces escaped one by one make the whole escaped. */
static void sb_json_escaped(sbuf *b, const char *s, size_t n) {
    size_t from = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        sb_add(b, s + from, i - from);
        char esc[8];
        switch (c) {
        case '"': sb_add(b, "\\\"", 2); break;
        case '\\': sb_add(b, "\\\\", 2); break;
        case '\n': sb_add(b, "\\n", 2); break;
        case '\r': sb_add(b, "\\r", 2); break;
        case '\t': sb_add(b, "\\t", 2); break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_add(b, esc, 6);
        }
        from = i + 1;
    }
    sb_add(b, s + from, n - from);
}

/* Appends s as a JSON string literal. */
static void sb_json_string(sbuf *b, const char *s, size_t n) {
    sb_add(b, "\"", 1);
    sb_json_escaped(b, s, n);
    sb_add(b, "\"", 1);
}

/* Malloc'd copy of b's text (NULL when empty), b emptied. */
static char *sb_take(sbuf *b) {
    char *p = b->n ? b->p : NULL;
    if (!p) free(b->p);
    *b = (sbuf){0};
    return p;
}

/* ---- the format's markers ---- */

#define DS_CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define DS_CALLS_END "<｜tool▁calls▁end｜>"
#define DS_CALL_BEGIN "<｜tool▁call▁begin｜>"
#define DS_CALL_END "<｜tool▁call▁end｜>"
#define DS_SEP "<｜tool▁sep｜>"
#define KIMI_SECTION_BEGIN "<|tool_calls_section_begin|>"
#define KIMI_SECTION_END "<|tool_calls_section_end|>"
#define KIMI_CALL_BEGIN "<|tool_call_begin|>"
#define KIMI_ARGS_BEGIN "<|tool_call_argument_begin|>"
#define KIMI_CALL_END "<|tool_call_end|>"
#define DSML "｜DSML｜"
#define DSML_CALLS_BEGIN "<" DSML "function_calls>"
#define DSML_CALLS_END "</" DSML "function_calls>"
#define DSML_INVOKE "<" DSML "invoke name=\""
#define DSML_INVOKE_END "</" DSML "invoke>"
#define DSML_PARAM "<" DSML "parameter name=\""
#define DSML_PARAM_END "</" DSML "parameter>"

/* Every call marker starts with '<' (and Llama 3's bare call with '{'): text is
 * released up to the next '<' at once. */

/* XML-style formats: parameters as tags, the arguments object built here. */
static bool xml_format(serve_tool_format f) {
    return f == SERVE_TOOLS_GLM45 || f == SERVE_TOOLS_QWEN3_CODER || f == SERVE_TOOLS_DSML;
}

/* 2: b starts with m; 1: b (n bytes) is a proper prefix of m; 0: neither. */
static int match(const char *b, size_t n, const char *m) {
    const size_t k = strlen(m);
    if (n >= k) return memcmp(b, m, k) == 0 ? 2 : 0;
    return memcmp(b, m, n) == 0 ? 1 : 0;
}

/* ---- a cursor over the undecided bytes, for headers ---- */

typedef struct cur {
    const char *p;
    size_t n, i;
    bool need, bad; /* more bytes are needed to decide / this is not what was expected */
} cur;

static bool c_ok(const cur *c) { return !c->need && !c->bad; }

static void c_ws(cur *c) {
    if (!c_ok(c)) return;
    while (c->i < c->n && isspace((unsigned char)c->p[c->i])) c->i++;
    if (c->i == c->n) c->need = true;
}

static void c_lit(cur *c, const char *m) {
    if (!c_ok(c)) return;
    const int r = match(c->p + c->i, c->n - c->i, m);
    if (r == 2) c->i += strlen(m);
    else if (r == 1) c->need = true;
    else c->bad = true;
}

/* Takes m when it comes next; false (nothing taken) when it does not. */
static bool c_opt(cur *c, const char *m) {
    if (!c_ok(c)) return false;
    const int r = match(c->p + c->i, c->n - c->i, m);
    if (r == 1) c->need = true;
    if (r != 2) return false;
    c->i += strlen(m);
    return true;
}

/* The bytes before the next `end` (taken too), at most max of them: [*at, *at + *len).
 * *from (NULL: none): where the search may start, no `end` before it; set where it stopped when more is needed. */
static void c_until_from(cur *c, const char *end, size_t max, size_t *at, size_t *len, size_t *from) {
    if (!c_ok(c)) return;
    const size_t k = strlen(end);
    for (size_t j = from && *from > c->i ? *from : c->i; j < c->n; j++) {
        if (j - c->i > max) break;
        const int r = match(c->p + j, c->n - j, end);
        if (r == 2) {
            *at = c->i;
            *len = j - c->i;
            c->i = j + k;
            return;
        }
        if (r == 1) {
            c->need = true;
            if (from) *from = j;
            return;
        }
    }
    if (c->n - c->i > max) c->bad = true;
    else c->need = true;
    if (from) *from = c->n;
}

static void c_until(cur *c, const char *end, size_t max, size_t *at, size_t *len) {
    c_until_from(c, end, max, at, len, NULL);
}

/* A JSON string literal, decoded into out (malloc'd). */
static void c_json_string(cur *c, char **out) {
    if (!c_ok(c)) return;
    if (c->i == c->n) {
        c->need = true;
        return;
    }
    if (c->p[c->i] != '"') {
        c->bad = true;
        return;
    }
    size_t j = c->i + 1;
    for (; j < c->n && c->p[j] != '"'; j++)
        if (c->p[j] == '\\') j++;
    if (j >= c->n) {
        if (j - c->i > HEADER_MAX) c->bad = true;
        else c->need = true;
        return;
    }
    cJSON *s = cJSON_ParseWithLength(c->p + c->i, j + 1 - c->i);
    if (!cJSON_IsString(s) || !*s->valuestring) c->bad = true;
    else if (!(*out = strdup(s->valuestring))) c->bad = true;
    cJSON_Delete(s);
    c->i = j + 1;
}

/* ---- the stream ---- */

typedef enum st {
    ST_TEXT,      /* plain text, watching for a call's marker */
    ST_ARGS,      /* inside a call's JSON arguments */
    ST_TAIL,      /* after a call's arguments: its closing markers, skipped */
    ST_PARAMS,    /* inside an XML-style call: parameters until the call's end */
    ST_STR,       /* inside an XML-style parameter's string value, streaming */
    ST_H_BODY,    /* harmony: a message's body (kind in body) */
} st;

enum body_kind { BODY_CONTENT, BODY_REASONING, BODY_DROP };

struct serve_tool_stream {
    serve_tool_format f;
    char id_prefix[96];
    cJSON *tools; /* the request's tools (a copy) or NULL: types XML-style values */
    sbuf in;      /* bytes not decided yet: in.p[at .. in.n) */
    size_t at;
    st state;
    bool fresh;        /* nothing but blank space since the start or the last call (Llama 3's bare JSON) */
    int n_calls;
    char *name;        /* the open call's function name */
    /* JSON arguments */
    int depth;
    bool in_str, esc;
    /* XML-style parameters */
    int n_params;
    bool lead; /* Qwen3-Coder: the newline that opens a value is still to skip */
    size_t vscan; /* where the open parameter's value may hold its end marker, from at: no rescan of long values */
    /* harmony */
    enum body_kind body;
    /* this feed's output */
    sbuf content, reasoning, args;
    cJSON *deltas;
    bool oom;
};

serve_tool_stream *serve_tool_stream_create_ex(serve_tool_format f, const char *id_prefix, const cJSON *tools) {
    serve_tool_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->f = f;
    snprintf(s->id_prefix, sizeof s->id_prefix, "%s", id_prefix ? id_prefix : "");
    s->fresh = true;
    if (tools && !(s->tools = cJSON_Duplicate(tools, true))) {
        free(s);
        return NULL;
    }
    return s;
}

serve_tool_stream *serve_tool_stream_create(serve_tool_format f, const char *id_prefix) {
    return serve_tool_stream_create_ex(f, id_prefix, NULL);
}

void serve_tool_stream_free(serve_tool_stream *s) {
    if (!s) return;
    free(s->in.p);
    free(s->name);
    free(s->content.p);
    free(s->reasoning.p);
    free(s->args.p);
    cJSON_Delete(s->deltas);
    cJSON_Delete(s->tools);
    free(s);
}

int serve_tool_stream_calls(const serve_tool_stream *s) { return s ? s->n_calls : 0; }

/* ---- output ---- */

static void emit_content(serve_tool_stream *s, const char *p, size_t n) {
    sb_add(&s->content, p, n);
    for (size_t i = 0; i < n && s->fresh; i++)
        if (!isspace((unsigned char)p[i])) s->fresh = false;
}

static cJSON *delta_add(serve_tool_stream *s) {
    if (!s->deltas && !(s->deltas = cJSON_CreateArray())) return NULL;
    cJSON *d = cJSON_CreateObject();
    if (!d || !cJSON_AddItemToArray(s->deltas, d)) {
        cJSON_Delete(d);
        return NULL;
    }
    return cJSON_AddNumberToObject(d, "index", s->n_calls - 1) ? d : NULL;
}

/* The argument text gathered for the open call, as one delta. */
static void flush_args(serve_tool_stream *s) {
    if (!s->args.n) return;
    cJSON *d = delta_add(s), *fn = d ? cJSON_AddObjectToObject(d, "function") : NULL;
    if (!fn || !cJSON_AddStringToObject(fn, "arguments", s->args.p)) s->oom = true;
    s->args.n = 0;
}

static void emit_args(serve_tool_stream *s, const char *p, size_t n) { sb_add(&s->args, p, n); }

/* A call begins: its first delta (index, id, type, name, arguments ""). Takes name. */
static void begin_call(serve_tool_stream *s, char *name) {
    flush_args(s);
    free(s->name);
    s->name = name;
    s->n_calls++;
    s->fresh = false;
    s->n_params = 0;
    s->depth = 0;
    s->in_str = s->esc = false;
    char id[160];
    snprintf(id, sizeof id, "call_%s%d", s->id_prefix, s->n_calls - 1);
    cJSON *d = delta_add(s), *fn = NULL;
    if (!d || !cJSON_AddStringToObject(d, "id", id) || !cJSON_AddStringToObject(d, "type", "function") ||
        !(fn = cJSON_AddObjectToObject(d, "function")) || !cJSON_AddStringToObject(fn, "name", name) ||
        !cJSON_AddStringToObject(fn, "arguments", ""))
        s->oom = true;
}

/* A call ended: text again; Llama 3 may take a further bare JSON call. */
static void end_call(serve_tool_stream *s) {
    flush_args(s);
    s->fresh = true;
}

/* ---- helpers on the undecided bytes ---- */

static const char *in_p(const serve_tool_stream *s) { return s->in.p ? s->in.p + s->at : ""; }
static size_t in_n(const serve_tool_stream *s) { return s->in.n - s->at; }

/* Bytes at the end of p[0..n) that begin a UTF-8 character not yet whole. */
static size_t utf8_tail(const char *p, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        const unsigned char c = (unsigned char)p[n - k];
        if ((c & 0xC0) == 0x80) continue;                /* continuation byte: look further back */
        const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return len > k ? k : 0;
    }
    return 0;
}

/* Whether a trigger may start at p[i] (first byte of one of them). */
static bool trigger_byte(const serve_tool_stream *s, const char *p, size_t i) {
    if (p[i] == '<') return true;
    /* Llama 3: a bare JSON object as the answer (or after a call), blank space before it */
    if (s->f == SERVE_TOOLS_LLAMA3 && p[i] == '{' && s->fresh) {
        for (size_t j = 0; j < i; j++)
            if (!isspace((unsigned char)p[j])) return false;
        return true;
    }
    return false;
}

/* ---- call headers: NEED (more bytes), NO (not a call here), or the bytes taken ---- */

enum { H_NEED = -1, H_NO = -2 };

static long header_result(const cur *c, char *name, serve_tool_stream *s) {
    if (!c_ok(c) || !name) {
        free(name);
        return c_ok(c) || c->bad ? H_NO : H_NEED;
    }
    begin_call(s, name);
    return (long)c->i;
}

/* The arguments' first '{' follows (not taken: the JSON scanner takes it). */
static void c_peek_brace(cur *c) {
    c_ws(c);
    if (!c_ok(c)) return;
    if (c->p[c->i] != '{') c->bad = true;
}

/* Whether s is one JSON object (blank space around it allowed). */
static bool is_json_object(const char *s) {
    cJSON *j = cJSON_ParseWithOpts(s, NULL, true);
    const bool ok = cJSON_IsObject(j);
    cJSON_Delete(j);
    return ok;
}

/* Hermes <tool_call>{"name": N, "arguments": {...}} and Llama 3 [<|python_tag|>]{"name": N, "parameters": {...}}. */
static long header_json_wrapped(serve_tool_stream *s, cur *c) {
    char *name = NULL;
    if (s->f == SERVE_TOOLS_HERMES) c_lit(c, "<tool_call>");
    else (void)c_opt(c, "<|python_tag|>");
    c_ws(c);
    c_lit(c, "{");
    c_ws(c);
    if (c_opt(c, "\"type\"")) { /* {"type": "function", "name": ...} */
        c_ws(c);
        c_lit(c, ":");
        c_ws(c);
        c_lit(c, "\"function\"");
        c_ws(c);
        c_lit(c, ",");
        c_ws(c);
    }
    c_lit(c, "\"name\"");
    c_ws(c);
    c_lit(c, ":");
    c_ws(c);
    c_json_string(c, &name);
    c_ws(c);
    if (c_ok(c) && c->p[c->i] == '}') { /* no arguments: {} */
        c->i++;
        const long r = header_result(c, name, s);
        if (r >= 0) {
            emit_args(s, "{}", 2);
            s->depth = -1; /* arguments done */
        }
        return r;
    }
    c_lit(c, ",");
    c_ws(c);
    if (!c_opt(c, "\"arguments\"")) c_lit(c, "\"parameters\"");
    c_ws(c);
    c_lit(c, ":");
    c_ws(c);
    if (c_ok(c) && c->p[c->i] == '"') { /* arguments written as a JSON string holding the object: taken whole */
        char *args = NULL;
        c_json_string(c, &args);
        if (c_ok(c) && !is_json_object(args)) c->bad = true;
        const long r = header_result(c, name, s);
        if (r >= 0) {
            emit_args(s, args, strlen(args));
            s->depth = -1; /* arguments done */
        }
        free(args);
        return r;
    }
    c_peek_brace(c);
    return header_result(c, name, s);
}

static char *dup_n(const char *p, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, p, n);
        d[n] = 0;
    }
    return d;
}

/* Trims blank space at both ends of [*at, *at + *n). */
static void trim(const char *p, size_t *at, size_t *n) {
    while (*n && isspace((unsigned char)p[*at])) (*at)++, (*n)--;
    while (*n && isspace((unsigned char)p[*at + *n - 1])) (*n)--;
}

/* A name: non-empty, no blank space or markup inside. */
static char *name_of(const char *p, size_t at, size_t n) {
    trim(p, &at, &n);
    if (!n || n > 256) return NULL;
    for (size_t i = 0; i < n; i++)
        if (isspace((unsigned char)p[at + i]) || p[at + i] == '<' || p[at + i] == '>' || p[at + i] == '"') return NULL;
    return dup_n(p + at, n);
}

/* DeepSeek: [<｜tool▁calls▁begin｜>] <｜tool▁call▁begin｜> then V3's "function<｜tool▁sep｜>N\n```json\n{" or V3.1's "N<｜tool▁sep｜>{". */
static long header_deepseek(serve_tool_stream *s, cur *c) {
    if (c_opt(c, DS_CALLS_BEGIN)) c_ws(c);
    c_lit(c, DS_CALL_BEGIN);
    size_t at = 0, n = 0;
    c_until(c, DS_SEP, 256, &at, &n);
    c_ws(c);
    if (!c_ok(c)) return header_result(c, NULL, s);
    char *name = NULL;
    if (c->p[c->i] == '{') { /* V3.1 */
        if (!(name = name_of(c->p, at, n))) c->bad = true;
        return header_result(c, name, s);
    }
    size_t nat = 0, nn = 0;
    c_until(c, "\n", 256, &nat, &nn);
    if (c_ok(c) && !(name = name_of(c->p, nat, nn))) c->bad = true;
    c_ws(c);
    if (c_opt(c, "```")) {
        c_opt(c, "json");
    }
    c_peek_brace(c);
    return header_result(c, name, s);
}

/* Kimi K2: [<|tool_calls_section_begin|>] <|tool_call_begin|>functions.N:i<|tool_call_argument_begin|>{ */
static long header_kimi(serve_tool_stream *s, cur *c) {
    if (c_opt(c, KIMI_SECTION_BEGIN)) c_ws(c);
    c_lit(c, KIMI_CALL_BEGIN);
    size_t at = 0, n = 0;
    c_until(c, KIMI_ARGS_BEGIN, 300, &at, &n);
    char *name = NULL;
    if (c_ok(c)) {
        trim(c->p, &at, &n);
        if (n > 10 && !memcmp(c->p + at, "functions.", 10)) at += 10, n -= 10;
        size_t k = n; /* the ":i" index after the name */
        while (k && isdigit((unsigned char)c->p[at + k - 1])) k--;
        if (k && k < n && c->p[at + k - 1] == ':') n = k - 1;
        if (!(name = name_of(c->p, at, n))) c->bad = true;
    }
    c_peek_brace(c);
    return header_result(c, name, s);
}

/* XML-style calls: GLM's <tool_call>N, Qwen3-Coder's <tool_call><function=N>, DSML's [<｜DSML｜function_calls>]<｜DSML｜invoke name="N">. */
static long header_xml(serve_tool_stream *s, cur *c) {
    size_t at = 0, n = 0;
    if (s->f == SERVE_TOOLS_GLM45) {
        c_lit(c, "<tool_call>");
        /* the name runs to the line's end or the first <arg_key> / </tool_call> */
        if (c_ok(c)) {
            size_t j = c->i;
            for (; j < c->n && c->p[j] != '\n' && c->p[j] != '<'; j++)
                if (j - c->i > 256) break;
            if (j - c->i > 256) c->bad = true;
            else if (j == c->n) c->need = true;
            else at = c->i, n = j - c->i, c->i = j;
        }
    } else if (s->f == SERVE_TOOLS_QWEN3_CODER) {
        c_lit(c, "<tool_call>");
        c_ws(c);
        c_lit(c, "<function=");
        c_until(c, ">", 256, &at, &n);
    } else {
        if (c_opt(c, DSML_CALLS_BEGIN)) c_ws(c);
        c_lit(c, DSML_INVOKE);
        c_until(c, "\">", 256, &at, &n);
    }
    char *name = NULL;
    if (c_ok(c) && !(name = name_of(c->p, at, n))) c->bad = true;
    return header_result(c, name, s);
}

static long header_at(serve_tool_stream *s, const char *p, size_t n) {
    cur c = {.p = p, .n = n};
    switch (s->f) {
    case SERVE_TOOLS_HERMES:
    case SERVE_TOOLS_LLAMA3: return header_json_wrapped(s, &c);
    case SERVE_TOOLS_DEEPSEEK_V3:
    case SERVE_TOOLS_DEEPSEEK_V31: return header_deepseek(s, &c);
    case SERVE_TOOLS_KIMI_K2: return header_kimi(s, &c);
    case SERVE_TOOLS_GLM45:
    case SERVE_TOOLS_QWEN3_CODER:
    case SERVE_TOOLS_DSML: return header_xml(s, &c);
    default: return H_NO;
    }
}

/* ---- states ---- */

/* Plain text: release what cannot start a call; a whole header begins one.
 * Returns 1 after progress, 0 when more bytes are needed. */
static int step_text(serve_tool_stream *s, bool final) {
    const char *p = in_p(s);
    const size_t n = in_n(s);
    size_t i = 0;
    for (; i < n; i++)
        if (trigger_byte(s, p, i)) break;
    size_t ws = i; /* blank space just before i: dropped if a call follows */
    while (ws > 0 && isspace((unsigned char)p[ws - 1])) ws--;
    if (i == n) {
        if (final) {
            emit_content(s, p, n);
            s->at += n;
            return 1;
        }
        const size_t keep = n - ws > 0 ? n - ws : utf8_tail(p, n);
        emit_content(s, p, n - keep);
        s->at += n - keep;
        return n - keep > 0;
    }
    if (ws > 0) { /* text before: out now */
        emit_content(s, p, ws);
        s->at += ws;
        return 1;
    }
    long r = header_at(s, p + i, n - i < HEADER_MAX ? n - i : HEADER_MAX);
    if (r == H_NEED && n - i >= HEADER_MAX) r = H_NO; /* seen only through a window: whole or in pieces alike */
    if (r == H_NEED && !final) return 0;
    if (r < 0) { /* not a call: the marker's first byte is text, and on */
        emit_content(s, p, i + 1);
        s->at += i + 1;
        return 1;
    }
    s->at += i + (size_t)r; /* blank space before the call dropped */
    if (xml_format(s->f)) s->state = ST_PARAMS;
    else s->state = s->depth < 0 ? ST_TAIL : ST_ARGS; /* depth -1: the header took the arguments too */
    return 1;
}

/* A byte JSON allows outside strings. */
static bool json_outside_byte(unsigned char c) {
    return isspace(c) || (c && strchr("{}[]:,-+.0123456789eEtrufalsn", c) != NULL);
}

/* JSON arguments: verbatim to the matching '}'. */
static int step_args(serve_tool_stream *s, bool final) {
    const char *p = in_p(s);
    size_t n = in_n(s);
    if (!final) n -= utf8_tail(p, n);
    size_t i = 0;
    bool done = false, broken = false;
    for (; i < n && !done && !broken; i++) {
        const char c = p[i];
        if (s->in_str) {
            if (s->esc) s->esc = false;
            else if (c == '\\') s->esc = true;
            else if (c == '"') s->in_str = false;
        } else if (c == '"') {
            s->in_str = true;
        } else if (c == '{' || c == '[') {
            s->depth++;
        } else if (c == '}' || c == ']') {
            if (--s->depth == 0) done = true;
        } else if (!json_outside_byte((unsigned char)c)) {
            broken = true;
            i--; /* that byte is not the arguments' */
        }
    }
    emit_args(s, p, i);
    s->at += i;
    if (done || broken) s->state = ST_TAIL;
    else if (final && s->at == s->in.n) end_call(s); /* cut off: the arguments stay as written */
    return i > 0 || done || broken || final;
}

/* The markers that close a call, each optional, in order, blank space around them dropped. */
static const char *const *tail_markers(serve_tool_format f) {
    static const char *const hermes[] = {"}", "</tool_call>", NULL};
    static const char *const llama3[] = {"}", ";", NULL};
    static const char *const ds[] = {"```", DS_CALL_END, DS_CALLS_END, NULL};
    static const char *const kimi[] = {KIMI_CALL_END, KIMI_SECTION_END, NULL};
    static const char *const qc[] = {"</tool_call>", NULL};
    static const char *const dsml[] = {DSML_CALLS_END, NULL};
    static const char *const harmony[] = {"<|call|>", NULL};
    static const char *const none[] = {NULL};
    switch (f) {
    case SERVE_TOOLS_HERMES: return hermes;
    case SERVE_TOOLS_LLAMA3: return llama3;
    case SERVE_TOOLS_DEEPSEEK_V3:
    case SERVE_TOOLS_DEEPSEEK_V31: return ds;
    case SERVE_TOOLS_KIMI_K2: return kimi;
    case SERVE_TOOLS_QWEN3_CODER: return qc;
    case SERVE_TOOLS_DSML: return dsml;
    case SERVE_TOOLS_HARMONY: return harmony;
    default: return none;
    }
}

static int step_tail(serve_tool_stream *s, bool final) {
    cur c = {.p = in_p(s), .n = in_n(s)};
    for (const char *const *m = tail_markers(s->f); *m; m++) {
        c_ws(&c);
        c_opt(&c, *m);
    }
    c_ws(&c);
    if (c.need && !final) return 0;
    s->at += c.i;
    s->state = ST_TEXT;
    end_call(s);
    return 1;
}

/* The tool's schema for parameter key of the open call (NULL: unknown). */
static const cJSON *param_schema(const serve_tool_stream *s, const char *key) {
    const cJSON *t;
    cJSON_ArrayForEach(t, s->tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn ? fn : t, "name");
        if (!cJSON_IsString(name) || strcmp(name->valuestring, s->name)) continue;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn ? fn : t, "parameters");
        return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(params, "properties"), key);
    }
    return NULL;
}

/* Whether v[0..n) is one JSON value other than a string. */
static bool is_json_nonstring(const char *v, size_t n) {
    size_t at = 0;
    trim(v, &at, &n);
    if (!n || v[at] == '"') return false;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(v + at, n, &end, false);
    const bool ok = j && end == v + at + n; /* the whole text, not a prefix of it */
    cJSON_Delete(j);
    return ok;
}

/* One parameter of an XML-style call into the arguments: ,"key":value. as_json: 1 JSON, 0 string, -1 decide. */
static void emit_param(serve_tool_stream *s, const char *key, size_t kn, const char *v, size_t vn, int as_json) {
    char *k = dup_n(key, kn);
    if (!k) {
        s->oom = true;
        return;
    }
    if (as_json < 0) {
        const int str = serve_tool_param_is_string(param_schema(s, k));
        as_json = str == 1 ? 0 : is_json_nonstring(v, vn);
    }
    sbuf b = {0};
    sb_add(&b, s->n_params++ ? "," : "{", 1);
    sb_json_string(&b, key, kn);
    sb_add(&b, ":", 1);
    if (as_json) {
        size_t at = 0;
        trim(v, &at, &vn);
        sb_add(&b, v + at, vn);
    } else {
        sb_json_string(&b, v, vn);
    }
    if (b.oom) s->oom = true;
    emit_args(s, b.p ? b.p : "", b.n);
    free(b.p);
    free(k);
}

/* The closing marker of an XML-style call. */
static const char *xml_call_end(serve_tool_format f) {
    return f == SERVE_TOOLS_GLM45 ? "</tool_call>" : f == SERVE_TOOLS_QWEN3_CODER ? "</function>" : DSML_INVOKE_END;
}

/* The marker that ends a parameter's value. */
static const char *xml_value_end(serve_tool_format f) {
    return f == SERVE_TOOLS_GLM45 ? "</arg_value>" : f == SERVE_TOOLS_QWEN3_CODER ? "</parameter>" : DSML_PARAM_END;
}

/* A parameter's head, up to its value: the key at [*ka, *ka + *kn) and how the
 * value reads (0: a string, -1: not said; DSML's string="true" says it). */
static void param_head(serve_tool_stream *s, cur *c, size_t *ka, size_t *kn, int *as_json) {
    *as_json = -1;
    if (s->f == SERVE_TOOLS_GLM45) {
        c_lit(c, "<arg_key>");
        c_until(c, "</arg_key>", 256, ka, kn);
        c_ws(c);
        c_lit(c, "<arg_value>");
    } else if (s->f == SERVE_TOOLS_QWEN3_CODER) {
        c_lit(c, "<parameter=");
        c_until(c, ">", 256, ka, kn);
    } else {
        size_t aa = 0, an = 0;
        c_lit(c, DSML_PARAM);
        c_until(c, "\"", 256, ka, kn);
        c_until(c, ">", 64, &aa, &an);
        if (c_ok(c)) *as_json = memmem(c->p + aa, an, "\"false\"", 7) ? -1 : 0;
    }
    if (c_ok(c)) trim(c->p, ka, kn);
}

/* Whether the open call's tool says parameter key[0..kn) is a string. */
static bool schema_says_string(serve_tool_stream *s, const char *key, size_t kn) {
    if (!s->tools) return false;
    char *k = dup_n(key, kn);
    if (!k) {
        s->oom = true;
        return false;
    }
    const bool str = serve_tool_param_is_string(param_schema(s, k)) == 1;
    free(k);
    return str;
}

/* One parameter, or the call's end, in an XML-style call. A value known to be
 * a string streams (ST_STR); any other is taken whole, then typed. */
static int step_params(serve_tool_stream *s, bool final) {
    cur c = {.p = in_p(s), .n = in_n(s)};
    c_ws(&c);
    if (c_opt(&c, xml_call_end(s->f))) {
        emit_args(s, s->n_params ? "}" : "{}", s->n_params ? 1 : 2);
        s->at += c.i;
        s->state = ST_TAIL;
        return 1;
    }
    size_t ka = 0, kn = 0, va = 0, vn = 0;
    int as_json = -1;
    param_head(s, &c, &ka, &kn, &as_json);
    if (c_ok(&c) && (as_json == 0 || schema_says_string(s, c.p + ka, kn))) {
        sbuf b = {0};
        sb_add(&b, s->n_params++ ? "," : "{", 1);
        sb_json_string(&b, c.p + ka, kn);
        sb_add(&b, ":\"", 2);
        if (b.oom) s->oom = true;
        emit_args(s, b.p ? b.p : "", b.n);
        free(b.p);
        s->at += c.i;
        s->lead = s->f == SERVE_TOOLS_QWEN3_CODER;
        s->state = ST_STR;
        return 1;
    }
    c_until_from(&c, xml_value_end(s->f), SIZE_MAX / 2, &va, &vn, &s->vscan);
    if (s->f == SERVE_TOOLS_QWEN3_CODER && c_ok(&c)) { /* the newlines after the tag and before the close are theirs */
        if (vn && c.p[va] == '\n') va++, vn--;
        if (vn && c.p[va + vn - 1] == '\n') vn--;
    }
    if (c.need && !final) return 0;
    s->vscan = 0;
    if (c.need) { /* cut off: the call keeps what it has */
        s->at += in_n(s);
        end_call(s);
        s->state = ST_TEXT;
        return 1;
    }
    if (c.bad) { /* not a parameter: the call ends (its object closed), what follows is read as text */
        emit_args(s, s->n_params ? "}" : "{}", s->n_params ? 1 : 2);
        cur w = {.p = in_p(s), .n = in_n(s)};
        c_ws(&w);
        s->at += w.i;
        s->state = ST_TEXT;
        end_call(s);
        return 1;
    }
    emit_param(s, c.p + ka, kn, c.p + va, vn, as_json);
    s->at += c.i;
    return 1;
}

/* A string value as it comes, escaped, up to its end marker (held back while
 * cut; so are a UTF-8 character not yet whole and Qwen3-Coder's newline that
 * may be the one before </parameter>). Cut off: the string and object stay open. */
static int step_str(serve_tool_stream *s, bool final) {
    const char *p = in_p(s);
    const size_t n = in_n(s);
    if (s->lead) {
        if (p[0] == '\n') s->at++;
        s->lead = false;
        return 1;
    }
    const char *m = xml_value_end(s->f);
    size_t i = 0;
    int r = 0;
    for (; i < n; i++)
        if (p[i] == '<' && (r = match(p + i, n - i, m)) != 0) break;
    if (r == 1 && final) r = 0, i = n; /* a cut marker at the very end is the value's text */
    const bool closed = r == 2;
    size_t text = i; /* value bytes here */
    if (!closed && !final) {
        if (r == 0) text -= utf8_tail(p, text);
        if (s->f == SERVE_TOOLS_QWEN3_CODER && text && p[text - 1] == '\n') text--;
    }
    size_t take = text;
    if (closed && s->f == SERVE_TOOLS_QWEN3_CODER && text && p[text - 1] == '\n') text--;
    sbuf b = {0};
    sb_json_escaped(&b, p, text);
    if (closed) sb_add(&b, "\"", 1);
    if (b.oom) s->oom = true;
    emit_args(s, b.p ? b.p : "", b.n);
    free(b.p);
    if (closed) {
        take = i + strlen(m);
        s->state = ST_PARAMS;
    }
    s->at += take;
    if (!closed && final) {
        end_call(s);
        s->state = ST_TEXT;
    }
    return take > 0 || closed || final;
}

/* ---- harmony ---- */

/* The recipient after "to=" in h[0..n) (at, len), or false. */
static bool recipient(const char *h, size_t n, size_t *at, size_t *len) {
    const char *t = memmem(h, n, "to=", 3);
    if (!t) return false;
    *at = (size_t)(t - h) + 3;
    size_t e = *at;
    while (e < n && !isspace((unsigned char)h[e]) && h[e] != '<') e++;
    *len = e - *at;
    return *len > 0;
}

/* A message's header: [<|start|>ROLE] <|channel|>CHANNEL ... <|message|>. */
static long header_harmony(serve_tool_stream *s, const char *p, size_t n) {
    cur c = {.p = p, .n = n};
    size_t ra = 0, rn = 0, ca = 0, cn = 0;
    if (c_opt(&c, "<|start|>")) { /* role text up to the channel (or message) */
        size_t j = c.i;
        for (; j < n && match(p + j, n - j, "<|channel|>") == 0 && match(p + j, n - j, "<|message|>") == 0; j++)
            if (j - c.i > 256) break;
        if (j - c.i > 256) c.bad = true;
        else if (j == n || match(p + j, n - j, "<|channel|>") == 1 || match(p + j, n - j, "<|message|>") == 1) c.need = true;
        else ra = c.i, rn = j - c.i, c.i = j;
    }
    while (c_opt(&c, "<|channel|>")) { /* the last channel counts (gpt-oss writes a stray one at times) */
        size_t j = c.i;
        for (; j < n && match(p + j, n - j, "<|channel|>") == 0 && match(p + j, n - j, "<|message|>") == 0; j++)
            if (j - c.i > 256) break;
        if (j - c.i > 256) c.bad = true;
        else if (j == n || match(p + j, n - j, "<|channel|>") == 1 || match(p + j, n - j, "<|message|>") == 1) c.need = true;
        else ca = c.i, cn = j - c.i, c.i = j;
    }
    c_lit(&c, "<|message|>");
    if (!c_ok(&c)) return c.bad ? H_NO : H_NEED;
    size_t ta = 0, tn = 0; /* the recipient: in the channel, else in the role */
    bool to = recipient(p + ca, cn, &ta, &tn);
    if (to) ta += ca;
    else if ((to = recipient(p + ra, rn, &ta, &tn))) ta += ra;
    if (to && tn > 10 && !memcmp(p + ta, "functions.", 10)) {
        cur a = c;
        c_peek_brace(&a);
        if (a.need) return H_NEED;
        if (!a.bad) {
            char *name = name_of(p, ta + 10, tn - 10);
            if (name) {
                c.i = a.i;
                begin_call(s, name);
                s->state = ST_ARGS;
                return (long)c.i;
            }
        }
        s->body = BODY_DROP;
    } else if (to && !(tn == 9 && !memcmp(p + ta, "assistant", 9))) {
        s->body = BODY_DROP; /* a tool the server did not offer (browser, python) */
    } else {
        size_t k = 0;
        while (k < cn && !isspace((unsigned char)p[ca + k]) && p[ca + k] != '<') k++;
        s->body = k == 8 && !memcmp(p + ca, "analysis", 8) ? BODY_REASONING : BODY_CONTENT;
    }
    s->state = ST_H_BODY;
    return (long)c.i;
}

static const char *const harmony_body_ends[] = {"<|end|>", "<|return|>", "<|call|>", "<|start|>", "<|channel|>", NULL};

static void emit_body(serve_tool_stream *s, const char *p, size_t n) {
    if (s->body == BODY_CONTENT) emit_content(s, p, n);
    else if (s->body == BODY_REASONING) sb_add(&s->reasoning, p, n);
}

/* A message's body up to its end marker. */
static int step_h_body(serve_tool_stream *s, bool final) {
    const char *p = in_p(s);
    const size_t n = in_n(s);
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '<') continue;
        for (const char *const *m = harmony_body_ends; *m; m++) {
            const int r = match(p + i, n - i, *m);
            if (r == 0) continue;
            if (r == 1 && final) continue;
            emit_body(s, p, i);
            s->at += i;
            if (r == 1) return i > 0;
            if (m - harmony_body_ends < 3) s->at += strlen(*m); /* the end markers are the message's */
            s->state = ST_TEXT;
            return 1;
        }
    }
    const size_t keep = final ? 0 : utf8_tail(p, n);
    emit_body(s, p, n - keep);
    s->at += n - keep;
    return n - keep > 0 || final;
}

/* Harmony between messages: a header starts one; stray end markers go; other text is content. */
static int step_h_text(serve_tool_stream *s, bool final) {
    const char *p = in_p(s);
    const size_t n = in_n(s);
    size_t i = 0;
    while (i < n && p[i] != '<') i++;
    if (i > 0 || n == 0) {
        const size_t keep = i == n && !final ? utf8_tail(p, n) : 0;
        emit_content(s, p, i - keep);
        s->at += i - keep;
        return i - keep > 0;
    }
    static const char *const stray[] = {"<|end|>", "<|return|>", "<|call|>", NULL}; /* ends of no message: dropped */
    for (const char *const *m = stray; *m; m++) {
        const int r = match(p, n, *m);
        if (r == 2) {
            s->at += strlen(*m);
            return 1;
        }
        if (r == 1 && !final) return 0;
    }
    long r = H_NO;
    if (match(p, n, "<|start|>") || match(p, n, "<|channel|>")) {
        r = header_harmony(s, p, n < HEADER_MAX ? n : HEADER_MAX);
        if (r == H_NEED && n >= HEADER_MAX) r = H_NO;
    }
    if (r == H_NEED && !final) return 0;
    if (r < 0) {
        emit_content(s, p, 1);
        s->at += 1;
        return 1;
    }
    s->at += (size_t)r;
    return 1;
}

static int step(serve_tool_stream *s, bool final) {
    if (s->f == SERVE_TOOLS_HARMONY) {
        switch (s->state) {
        case ST_TEXT: return step_h_text(s, final);
        case ST_H_BODY: return step_h_body(s, final);
        case ST_ARGS: return step_args(s, final);
        default: return step_tail(s, final);
        }
    }
    switch (s->state) {
    case ST_TEXT: return step_text(s, final);
    case ST_ARGS: return step_args(s, final);
    case ST_TAIL: return step_tail(s, final);
    case ST_PARAMS: return step_params(s, final);
    case ST_STR: return step_str(s, final);
    default: return 0;
    }
}

int serve_tool_stream_feed_ex(serve_tool_stream *s, const char *piece, size_t len, bool final, char **content,
                              char **reasoning, cJSON **deltas, moex_error *err) {
    *content = NULL;
    if (reasoning) *reasoning = NULL;
    *deltas = NULL;
    if (s->f == SERVE_TOOLS_NONE) {
        if (len && !(*content = dup_n(piece, len))) return moex_fail(err, "tool calls: out of memory");
        return 0;
    }
    sb_add(&s->in, piece, len);
    while (s->at < s->in.n && !s->oom && !s->in.oom && step(s, final)) {
    }
    if (final && s->at < s->in.n) { /* cannot happen: every state decides at the end; kept as text */
        emit_content(s, in_p(s), in_n(s));
        s->at = s->in.n;
    }
    if (final && (s->state == ST_ARGS || s->state == ST_PARAMS || s->state == ST_STR)) end_call(s);
    flush_args(s);
    if (s->at && s->in.p) { /* keep only the undecided bytes */
        memmove(s->in.p, in_p(s), in_n(s));
        s->in.n -= s->at;
        s->at = 0;
    }
    if (s->oom || s->in.oom || s->content.oom || s->reasoning.oom || s->args.oom) {
        cJSON_Delete(s->deltas);
        s->deltas = NULL;
        return moex_fail(err, "tool calls: out of memory");
    }
    *content = sb_take(&s->content);
    char *r = sb_take(&s->reasoning);
    if (reasoning) *reasoning = r;
    else free(r);
    *deltas = s->deltas;
    s->deltas = NULL;
    return 0;
}

int serve_tool_stream_feed(serve_tool_stream *s, const char *piece, size_t len, bool final, char **content,
                           cJSON **deltas, moex_error *err) {
    return serve_tool_stream_feed_ex(s, piece, len, final, content, NULL, deltas, err);
}

/* ---- the whole answer ---- */

/* Folds deltas into calls: a delta with an id starts one, others add to its arguments. */
static int fold_deltas(const cJSON *deltas, cJSON *calls) {
    const cJSON *d;
    cJSON_ArrayForEach(d, deltas) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(d, "function");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (cJSON_GetObjectItemCaseSensitive(d, "id")) {
            cJSON *c = cJSON_CreateObject(), *cf = NULL;
            if (!c || !cJSON_AddItemToArray(calls, c)) {
                cJSON_Delete(c);
                return -1;
            }
            if (!cJSON_AddStringToObject(c, "id", cJSON_GetObjectItemCaseSensitive(d, "id")->valuestring) ||
                !cJSON_AddStringToObject(c, "type", "function") || !(cf = cJSON_AddObjectToObject(c, "function")) ||
                !cJSON_AddStringToObject(cf, "name", cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring) ||
                !cJSON_AddStringToObject(cf, "arguments", args->valuestring))
                return -1;
            continue;
        }
        cJSON *last = cJSON_GetArrayItem(calls, cJSON_GetArraySize(calls) - 1);
        cJSON *cf = cJSON_GetObjectItemCaseSensitive(last, "function");
        const cJSON *prev = cJSON_GetObjectItemCaseSensitive(cf, "arguments");
        if (!prev || !args) return -1;
        const size_t a = strlen(prev->valuestring), b = strlen(args->valuestring);
        char *joined = malloc(a + b + 1);
        if (!joined) return -1;
        memcpy(joined, prev->valuestring, a);
        memcpy(joined + a, args->valuestring, b + 1);
        cJSON *v = cJSON_CreateString(joined);
        free(joined);
        if (!v || !cJSON_ReplaceItemInObjectCaseSensitive(cf, "arguments", v)) {
            cJSON_Delete(v);
            return -1;
        }
    }
    return 0;
}

int serve_tool_calls_parse_ex(serve_tool_format f, const cJSON *tools, const char *text, size_t len,
                              const char *id_prefix, char **content, char **reasoning, cJSON **calls, moex_error *err) {
    *content = NULL;
    if (reasoning) *reasoning = NULL;
    *calls = NULL;
    serve_tool_stream *s = serve_tool_stream_create_ex(f, id_prefix, tools);
    cJSON *deltas = NULL, *out = cJSON_CreateArray();
    char *c = NULL, *r = NULL;
    if (!s || !out) {
        serve_tool_stream_free(s);
        cJSON_Delete(out);
        return moex_fail(err, "tool calls: out of memory");
    }
    int rc = serve_tool_stream_feed_ex(s, text, len, true, &c, &r, &deltas, err);
    serve_tool_stream_free(s);
    if (!rc && fold_deltas(deltas, out)) rc = moex_fail(err, "tool calls: out of memory");
    cJSON_Delete(deltas);
    if (!rc && !c && !(c = strdup(""))) rc = moex_fail(err, "tool calls: out of memory");
    if (!rc && reasoning && !r && !(r = strdup(""))) rc = moex_fail(err, "tool calls: out of memory");
    if (rc) {
        free(c);
        free(r);
        cJSON_Delete(out);
        return -1;
    }
    *content = c;
    if (reasoning) *reasoning = r;
    else free(r);
    *calls = out;
    return 0;
}

int serve_tool_calls_parse(serve_tool_format f, const char *text, size_t len, const char *id_prefix, char **content,
                           cJSON **calls, moex_error *err) {
    return serve_tool_calls_parse_ex(f, NULL, text, len, id_prefix, content, NULL, calls, err);
}
