/* Tool calls in a model's answer (serve/tool_calls.c, tool_calls_stream.c):
 * per format, answers with no call, one, two, text around them, markers
 * inside JSON strings, unicode, malformed and cut-off calls; each answer fed
 * whole and in random pieces of 1..7 bytes gives the same content, reasoning
 * and calls as the whole parse; format detection on template snippets (and
 * on the real templates when MOEX_TEMPLATES_DIR names a folder of them); the
 * forced-call grammar of each format parses, accepts a call byte by byte, and
 * that call parses back. */
#include <dirent.h>
#include <string.h>

#include "serve/grammar.h"
#include "serve/tool_calls.h"
#include "tests/test_files.h"
#include "tests/test_util.h"

/* ---- deltas folded into calls, checking their shape on the way ---- */

static cJSON *g_tools; /* the tools typed formats see */
static int g_arg_deltas; /* argument pieces folded so far */

typedef struct folded {
    char *content, *reasoning;
    cJSON *calls; /* [[name, arguments], ...] */
} folded;

static void add_text(char **acc, char *piece) {
    if (!piece) return;
    const size_t a = *acc ? strlen(*acc) : 0, b = strlen(piece);
    *acc = realloc(*acc, a + b + 1);
    memcpy(*acc + a, piece, b + 1);
    free(piece);
}

/* The calls being folded: names and growing arguments (no quadratic copying on long ones). */
typedef struct acc_call {
    char *name, *args;
    size_t n, cap;
} acc_call;

typedef struct acc {
    acc_call *c;
    int n;
} acc;

static void acc_args(acc_call *c, const char *s) {
    const size_t k = strlen(s);
    if (c->n + k + 1 > c->cap) {
        c->cap = (c->n + k + 1) * 2;
        c->args = realloc(c->args, c->cap);
    }
    memcpy(c->args + c->n, s, k + 1);
    c->n += k;
}

/* Whether s ends on a UTF-8 character's end (the texts given here are valid UTF-8). */
static bool utf8_whole(const char *s) {
    const size_t n = s ? strlen(s) : 0;
    size_t k = 0;
    while (k < n && k < 4 && ((unsigned char)s[n - 1 - k] & 0xC0) == 0x80) k++;
    if (k == n) return k == 0;
    const unsigned char c = (unsigned char)s[n - 1 - k];
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len == k + 1;
}

static void fold(acc *a, const cJSON *deltas, const char *what) {
    const cJSON *d;
    cJSON_ArrayForEach(d, deltas) {
        const int index = cJSON_GetObjectItem(d, "index")->valueint;
        const cJSON *fn = cJSON_GetObjectItem(d, "function");
        const cJSON *args = cJSON_GetObjectItem(fn, "arguments");
        CHECK(cJSON_IsString(args), "%s: a delta without function.arguments", what);
        if (!cJSON_IsString(args)) continue;
        CHECK(utf8_whole(args->valuestring), "%s: arguments piece '%s' ends inside a character", what, args->valuestring);
        if (cJSON_GetObjectItem(d, "id")) {
            CHECK(index == a->n, "%s: call %d begins as index %d", what, a->n, index);
            CHECK(!strcmp(cJSON_GetObjectItem(d, "type")->valuestring, "function"), "%s: type", what);
            CHECK(!*args->valuestring, "%s: the first delta's arguments are not \"\"", what);
            char id[64];
            snprintf(id, sizeof id, "call_t%d", index);
            CHECK(!strcmp(cJSON_GetObjectItem(d, "id")->valuestring, id), "%s: id %s", what,
                  cJSON_GetObjectItem(d, "id")->valuestring);
            a->c = realloc(a->c, (size_t)(a->n + 1) * sizeof *a->c);
            a->c[a->n++] = (acc_call){.name = strdup(cJSON_GetObjectItem(fn, "name")->valuestring), .args = strdup(""), .cap = 1};
            continue;
        }
        CHECK(index == a->n - 1 && !cJSON_GetObjectItem(fn, "name"), "%s: arguments for call %d after call %d", what,
              index, a->n - 1);
        if (index == a->n - 1) acc_args(&a->c[index], args->valuestring);
        g_arg_deltas++;
    }
}

static cJSON *acc_take(acc *a) {
    cJSON *calls = cJSON_CreateArray();
    for (int i = 0; i < a->n; i++) {
        cJSON *c = cJSON_CreateArray();
        cJSON_AddItemToArray(c, cJSON_CreateString(a->c[i].name));
        cJSON_AddItemToArray(c, cJSON_CreateString(a->c[i].args));
        cJSON_AddItemToArray(calls, c);
        free(a->c[i].name);
        free(a->c[i].args);
    }
    free(a->c);
    return calls;
}

/* The answer fed in pieces of 1..max_piece bytes (0: whole). */
static folded stream(serve_tool_format f, const char *text, size_t max_piece, rng *r) {
    serve_tool_stream *s = serve_tool_stream_create_ex(f, "t", g_tools);
    folded out = {0};
    acc a = {0};
    const size_t n = strlen(text);
    size_t at = 0;
    bool ended = false;
    while (!ended) {
        size_t k = max_piece ? 1 + (size_t)(rng_next(r) % max_piece) : n;
        if (k > n - at) k = n - at;
        /* now and then the end comes as an empty piece of its own */
        const bool final = at + k == n && (max_piece == 0 || k > 0 || rng_next(r) % 2);
        char *content = NULL, *reasoning = NULL;
        cJSON *deltas = NULL;
        moex_error err = {0};
        CHECK(serve_tool_stream_feed_ex(s, text + at, k, final, &content, &reasoning, &deltas, &err) == 0, "feed: %s",
              err.msg);
        CHECK(!content || *content, "an empty content piece");
        CHECK(utf8_whole(content) && utf8_whole(reasoning), "'%s': a piece ends inside a character", text);
        fold(&a, deltas, text);
        cJSON_Delete(deltas);
        add_text(&out.content, content);
        add_text(&out.reasoning, reasoning);
        at += k;
        ended = final;
    }
    out.calls = acc_take(&a);
    CHECK(serve_tool_stream_calls(s) == cJSON_GetArraySize(out.calls), "serve_tool_stream_calls");
    serve_tool_stream_free(s);
    if (!out.content) out.content = strdup("");
    if (!out.reasoning) out.reasoning = strdup("");
    return out;
}

static char *calls_text(const cJSON *calls) {
    char *t = cJSON_PrintUnformatted(calls);
    return t;
}

/* The whole parse's calls as [[name, arguments], ...], checking their shape. */
static cJSON *whole_calls(const cJSON *calls) {
    cJSON *out = cJSON_CreateArray();
    const cJSON *c;
    int i = 0;
    cJSON_ArrayForEach(c, calls) {
        char id[64];
        snprintf(id, sizeof id, "call_t%d", i++);
        CHECK(!strcmp(cJSON_GetObjectItem(c, "id")->valuestring, id), "whole: id");
        CHECK(!strcmp(cJSON_GetObjectItem(c, "type")->valuestring, "function"), "whole: type");
        const cJSON *fn = cJSON_GetObjectItem(c, "function");
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateString(cJSON_GetObjectItem(fn, "name")->valuestring));
        cJSON_AddItemToArray(pair, cJSON_CreateString(cJSON_GetObjectItem(fn, "arguments")->valuestring));
        cJSON_AddItemToArray(out, pair);
    }
    return out;
}

/* text in format f gives content, reasoning (NULL: not checked) and calls (JSON [[name, arguments], ...]). */
static void expect_r(serve_tool_format f, const char *text, const char *content, const char *reasoning,
                     const char *calls, rng *r) {
    char *c = NULL, *re = NULL;
    cJSON *got = NULL;
    moex_error err = {0};
    if (serve_tool_calls_parse_ex(f, g_tools, text, strlen(text), "t", &c, &re, &got, &err)) {
        CHECK(0, "parse '%s': %s", text, err.msg);
        return;
    }
    cJSON *pairs = whole_calls(got), *want = cJSON_Parse(calls);
    char *gt = calls_text(pairs), *wt = calls_text(want);
    CHECK(want && !strcmp(gt, wt), "%s '%s':\n  calls %s\n  want  %s", serve_tool_format_name(f), text, gt, wt);
    CHECK(!strcmp(c, content), "%s '%s':\n  content '%s'\n  want    '%s'", serve_tool_format_name(f), text, c, content);
    CHECK(!reasoning || !strcmp(re, reasoning), "%s '%s': reasoning '%s' (want '%s')", serve_tool_format_name(f), text,
          re, reasoning);
    /* the plain parse agrees when no tools type the values */
    if (!g_tools) {
        char *c2 = NULL;
        cJSON *got2 = NULL;
        CHECK(serve_tool_calls_parse(f, text, strlen(text), "t", &c2, &got2, &err) == 0 && !strcmp(c2, c) &&
                  cJSON_Compare(got, got2, true),
              "serve_tool_calls_parse differs from _ex");
        free(c2);
        cJSON_Delete(got2);
    }
    for (size_t piece = 0; piece <= 7; piece++) {
        for (int rep = 0; rep < (piece ? 12 : 1); rep++) {
            folded s = stream(f, text, piece, r);
            char *st = calls_text(s.calls);
            CHECK(!strcmp(st, gt) && !strcmp(s.content, c) && !strcmp(s.reasoning, re),
                  "%s '%s' in pieces of <= %zu:\n  calls %s\n  whole %s\n  content '%s' (whole '%s')\n  reasoning "
                  "'%s' (whole '%s')",
                  serve_tool_format_name(f), text, piece, st, gt, s.content, c, s.reasoning, re);
            free(st);
            free(s.content);
            free(s.reasoning);
            cJSON_Delete(s.calls);
        }
    }
    free(gt);
    free(wt);
    free(c);
    free(re);
    cJSON_Delete(got);
    cJSON_Delete(pairs);
    cJSON_Delete(want);
}

static void expect(serve_tool_format f, const char *text, const char *content, const char *calls, rng *r) {
    expect_r(f, text, content, NULL, calls, r);
}

/* ---- per format ---- */

#define WEATHER "[[\"get_weather\",\"{\\\"city\\\": \\\"Paris\\\"}\"]]"
#define WEATHER_COMPACT "[[\"get_weather\",\"{\\\"city\\\":\\\"Paris\\\"}\"]]"

static void test_hermes(rng *r) {
    const serve_tool_format f = SERVE_TOOLS_HERMES;
    const char *call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    expect(f, "Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", "[]", r);
    expect(f, call, "", WEATHER, r);
    expect(f, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>", "", WEATHER, r);
    expect(f, "Let me check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n",
           "Let me check.", WEATHER, r);
    expect(f,
           "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", "
           "\"arguments\": {}}\n</tool_call>",
           "", "[[\"a\",\"{\\\"x\\\": 1}\"],[\"b\",\"{}\"]]", r);
    /* the markers inside strings; nested arrays and objects; escapes */
    expect(f,
           "<tool_call>\n{\"name\": \"write\", \"arguments\": {\"text\": \"</tool_call> {\\\"x\\\": [1, {\\\"y\\\": "
           "\\\"}\\\"}]}\", \"n\": [1, -2.5e3, true, null, {\"k\": \"<tool_call>\"}]}}\n</tool_call>",
           "",
           "[[\"write\",\"{\\\"text\\\": \\\"</tool_call> {\\\\\\\"x\\\\\\\": [1, {\\\\\\\"y\\\\\\\": "
           "\\\\\\\"}\\\\\\\"}]}\\\", \\\"n\\\": [1, -2.5e3, true, null, {\\\"k\\\": \\\"<tool_call>\\\"}]}\"]]",
           r);
    expect(f, "Ça va? 🌍\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich 東京 🌍\"}}\n</tool_call>",
           "Ça va? 🌍", "[[\"get_weather\",\"{\\\"city\\\": \\\"Zürich 東京 🌍\\\"}\"]]", r);
    expect(f, "<tool_call>\n{\"name\": \"now\"}\n</tool_call>", "", "[[\"now\",\"{}\"]]", r);
    expect(f, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\nDone.",
           "Done.", WEATHER, r);
    /* not calls: stay content, as written */
    expect(f, "<tool_call>\n{name: get_weather}\n</tool_call>", "<tool_call>\n{name: get_weather}\n</tool_call>", "[]", r);
    expect(f, "Use the <tool_call> tag, a < b.", "Use the <tool_call> tag, a < b.", "[]", r);
    expect(f, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"x\"}</tool_call>",
           "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"x\"}</tool_call>", "[]", r);
    /* arguments written as a string holding the object: its text */
    expect(f, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}\n</tool_call>", "",
           WEATHER, r);
    expect(f, "<tool_call>\n{\"name\": \"get_wea", "<tool_call>\n{\"name\": \"get_wea", "[]", r);  /* cut before the arguments */
    expect(f, "Text <tool_ca", "Text <tool_ca", "[]", r);
    /* bad JSON after the header: the arguments end at the first byte JSON cannot have, the rest is content */
    expect(f, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": x}}\n</tool_call>", "x}}\n</tool_call>",
           "[[\"f\",\"{\\\"a\\\": \"]]", r);
    /* cut off mid-arguments (max_tokens): the call keeps what was written */
    expect(f, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"hel", "", "[[\"f\",\"{\\\"a\\\": \\\"hel\"]]", r);
    expect(f, "", "", "[]", r);
}

static void test_llama3(rng *r) {
    const serve_tool_format f = SERVE_TOOLS_LLAMA3;
    expect(f, "Hello, world!", "Hello, world!", "[]", r);
    expect(f, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", WEATHER, r);
    expect(f, "\n <|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", WEATHER, r);
    expect(f, "{\"type\": \"function\", \"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", WEATHER, r);
    expect(f, "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}", "",
           "[[\"a\",\"{}\"],[\"b\",\"{\\\"x\\\": 1}\"]]", r);
    expect(f, "Sure: {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
           "Sure: {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "[]", r);
    expect(f, "Let me look.<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "Let me look.",
           WEATHER, r);
    expect(f, "{\"name\": \"f\", \"parameters\": {\"s\": \"<|python_tag|>{\\\"name\\\": 1}; }\"}}", "",
           "[[\"f\",\"{\\\"s\\\": \\\"<|python_tag|>{\\\\\\\"name\\\\\\\": 1}; }\\\"}\"]]", r);
    expect(f, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Zürich 🌍\"}}\nIt is sunny.", "It is sunny.",
           "[[\"get_weather\",\"{\\\"city\\\": \\\"Zürich 🌍\\\"}\"]]", r);
    expect(f, "{\"name\": \"Bob\", \"age\": 3}", "{\"name\": \"Bob\", \"age\": 3}", "[]", r);
    expect(f, "{\"answer\": 42}", "{\"answer\": 42}", "[]", r);
    expect(f, "{\"name\": \"f\", \"parameters\": {\"a\": [1, 2", "", "[[\"f\",\"{\\\"a\\\": [1, 2\"]]", r);
}

static void test_harmony(rng *r) {
    const serve_tool_format f = SERVE_TOOLS_HARMONY;
    expect_r(f, "<|channel|>final<|message|>Hello!", "Hello!", "", "[]", r);
    expect_r(f,
             "<|channel|>analysis<|message|>User says hi.<|end|><|start|>assistant<|channel|>final<|message|>Hi 🌍<|return|>",
             "Hi 🌍", "User says hi.", "[]", r);
    expect_r(f,
             "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
             "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
             "", "Need weather.", WEATHER_COMPACT, r);
    expect_r(f, "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Paris\"}<|call|>",
             "", "", WEATHER_COMPACT, r);
    expect_r(f,
             "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.a "
             "<|constrain|>json<|message|>{\"s\":\"<|call|><|end|>}\"}<|call|><|start|>assistant<|channel|>commentary "
             "to=functions.b <|constrain|>json<|message|>{}<|call|>",
             "Checking.", "", "[[\"a\",\"{\\\"s\\\":\\\"<|call|><|end|>}\\\"}\"],[\"b\",\"{}\"]]", r);
    expect_r(f, "Just text, no markup.", "Just text, no markup.", "", "[]", r);
    expect_r(f, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": \"x", "", "",
             "[[\"f\",\"{\\\"a\\\": \\\"x\"]]", r);
    expect_r(f, "<|channel|>commentary to=functions.f", "<|channel|>commentary to=functions.f", "", "[]", r);
    expect_r(f, "<|channel|>analysis to=browser.search<|message|>{\"q\":\"x\"}<|call|>", "", "", "[]", r);
    expect_r(f, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": x}<|call|>", "x}", "",
             "[[\"f\",\"{\\\"a\\\": \"]]", r);
    expect_r(f, "<|channel|>analysis<|message|>Thinking about <|chan", "", "Thinking about <|chan", "[]", r);
}

static void test_deepseek(rng *r) {
    const serve_tool_format f = SERVE_TOOLS_DEEPSEEK_V3;
    const char *v3 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": "
                     "\"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    expect(f, "Hello.", "Hello.", "[]", r);
    expect(f, v3, "", WEATHER, r);
    expect(SERVE_TOOLS_DEEPSEEK_V31, v3, "", WEATHER, r);
    expect(f,
           "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>"
           "<｜tool▁calls▁end｜>",
           "", WEATHER, r);
    expect(f,
           "I'll check both.\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>a\n```json\n{\"x\": "
           "\"```<｜tool▁call▁end｜>\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>b\n```json\n{}"
           "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
           "I'll check both.", "[[\"a\",\"{\\\"x\\\": \\\"```<｜tool▁call▁end｜>\\\"}\"],[\"b\",\"{}\"]]", r);
    expect(f,
           "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{\"v\": \"東京\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>b"
           "<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
           "", "[[\"a\",\"{\\\"v\\\": \\\"東京\\\"}\"],[\"b\",\"{}\"]]", r);
    expect(f, "<｜tool▁calls▁begin｜>oops", "<｜tool▁calls▁begin｜>oops", "[]", r);
    expect(f, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Pa", "",
           "[[\"get_weather\",\"{\\\"city\\\": \\\"Pa\"]]", r);
}

static void test_kimi(rng *r) {
    const serve_tool_format f = SERVE_TOOLS_KIMI_K2;
    expect(f, "Hello.", "Hello.", "[]", r);
    expect(f,
           "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": "
           "\"Paris\"}<|tool_call_end|><|tool_calls_section_end|>",
           "", WEATHER, r);
    expect(f,
           "Checking 🌍 both.<|tool_calls_section_begin|>\n<|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{"
           "\"s\": \"<|tool_call_end|>\"}<|tool_call_end|>\n<|tool_call_begin|>functions.b:1<|tool_call_argument_begin|>{}"
           "<|tool_call_end|>\n<|tool_calls_section_end|>",
           "Checking 🌍 both.", "[[\"a\",\"{\\\"s\\\": \\\"<|tool_call_end|>\\\"}\"],[\"b\",\"{}\"]]", r);
    expect(f, "<|tool_calls_section_begin|>nothing", "<|tool_calls_section_begin|>nothing", "[]", r);
    expect(f, "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": [", "", "[[\"f\",\"{\\\"a\\\": [\"]]",
           r);
}

static void test_glm(rng *r) {
    const serve_tool_format f = SERVE_TOOLS_GLM45;
    expect(f, "Hello.", "Hello.", "[]", r);
    expect(f,
           "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
           "<arg_value>3</arg_value>\n</tool_call>",
           "", "[[\"get_weather\",\"{\\\"city\\\":\\\"Paris\\\",\\\"days\\\":3}\"]]", r);
    expect(f,
           "Two calls.\n<tool_call>a<arg_key>q</arg_key><arg_value>x </tool_call> \"y\"\n</arg_value></tool_call>"
           "<tool_call>b</tool_call>",
           "Two calls.", "[[\"a\",\"{\\\"q\\\":\\\"x </tool_call> \\\\\\\"y\\\\\\\"\\\\n\\\"}\"],[\"b\",\"{}\"]]", r);
    expect(f, "<tool_call>f\n<arg_key>o</arg_key>\n<arg_value>{\"a\": [1, \"</arg_key>\"]}</arg_value>\n</tool_call>", "",
           "[[\"f\",\"{\\\"o\\\":{\\\"a\\\": [1, \\\"</arg_key>\\\"]}}\"]]", r);
    expect(f, "I use <tool_call> tags here.\nOK", "I use <tool_call> tags here.\nOK", "[]", r);
    expect(f, "<tool_call>f\nrandom text</tool_call>", "random text</tool_call>", "[[\"f\",\"{}\"]]", r);
    expect(f, "<tool_call>f\n<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>b</arg_key><arg_value>Zür", "",
           "[[\"f\",\"{\\\"a\\\":1\"]]", r);
    /* the tool's schema types the values: "days" a string here */
    g_tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": "
                          "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": "
                          "\"string\"}}}}}]");
    expect(f,
           "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
           "<arg_value>3</arg_value>\n</tool_call>",
           "", "[[\"get_weather\",\"{\\\"city\\\":\\\"Paris\\\",\\\"days\\\":\\\"3\\\"}\"]]", r);
    cJSON_Delete(g_tools);
    g_tools = NULL;
}

static void test_qwen3_coder(rng *r) {
    const serve_tool_format f = SERVE_TOOLS_QWEN3_CODER;
    expect(f, "Hello.", "Hello.", "[]", r);
    expect(f,
           "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
           "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>",
           "Sure.", "[[\"get_weather\",\"{\\\"city\\\":\\\"Paris\\\",\\\"days\\\":3}\"],[\"now\",\"{}\"]]", r);
    expect(f, "<tool_call>\n<function=w>\n<parameter=code>\nif a < b:\n  print(\"</function>\")\n</parameter>\n</function>\n</tool_call>",
           "", "[[\"w\",\"{\\\"code\\\":\\\"if a < b:\\\\n  print(\\\\\\\"</function>\\\\\\\")\\\"}\"]]", r);
}

/* Values the tools type as strings stream (GLM, Qwen3-Coder): the same calls as when taken whole. */
static void test_xml_strings(rng *r) {
    g_tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"w\", \"parameters\": {\"type\": \"object\", "
                          "\"properties\": {\"path\": {\"type\": \"string\"}, \"code\": {\"type\": \"string\"}, \"n\": "
                          "{\"type\": \"integer\"}}}}}]");
    expect(SERVE_TOOLS_QWEN3_CODER,
           "<tool_call>\n<function=w>\n<parameter=path>\na.py\n</parameter>\n<parameter=code>\n\nif a < b:\n  print(\"</par\")"
           "\n\n</parameter>\n<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>",
           "", "[[\"w\",\"{\\\"path\\\":\\\"a.py\\\",\\\"code\\\":\\\"\\\\nif a < b:\\\\n  print(\\\\\\\"</par\\\\\\\")\\\\n\\\",\\\"n\\\":7}\"]]", r);
    /* fed byte by byte, the value comes in many pieces, not at its end */
    const char *code = "<tool_call>\n<function=w>\n<parameter=code>\n0123456789abcdefghijklmnopqrstuvwxyz\n</parameter>\n"
                       "</function>\n</tool_call>";
    g_arg_deltas = 0;
    folded one = stream(SERVE_TOOLS_QWEN3_CODER, code, 1, r);
    CHECK(g_arg_deltas > 30, "a string value in %d pieces", g_arg_deltas);
    free(one.content);
    free(one.reasoning);
    cJSON_Delete(one.calls);
    expect(SERVE_TOOLS_QWEN3_CODER, "<tool_call>\n<function=w>\n<parameter=code>\nline 1\nZür", "",
           "[[\"w\",\"{\\\"code\\\":\\\"line 1\\\\nZür\"]]", r); /* cut off: string and object open */
    expect(SERVE_TOOLS_GLM45, "<tool_call>w\n<arg_key>path</arg_key>\n<arg_value>{\"not\": \"json here\"}</arg_value>\n</tool_call>", "",
           "[[\"w\",\"{\\\"path\\\":\\\"{\\\\\\\"not\\\\\\\": \\\\\\\"json here\\\\\\\"}\\\"}\"]]", r);
    cJSON_Delete(g_tools);
    g_tools = NULL;
}

static void test_dsml(rng *r) {
    const serve_tool_format f = SERVE_TOOLS_DSML;
    expect(f, "Hello.", "Hello.", "[]", r);
    expect(f,
           "Checking.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
           "string=\"true\">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>"
           "\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
           "Checking.", "[[\"get_weather\",\"{\\\"city\\\":\\\"Paris\\\",\\\"days\\\":3}\"],[\"now\",\"{}\"]]", r);
    expect(f,
           "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" string=\"true\">42"
           "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
           "", "[[\"f\",\"{\\\"n\\\":\\\"42\\\"}\"]]", r);
}

/* Long answers: a 200 KB parameter value and 200 KB of JSON arguments in 3-byte pieces (no rescanning per
 * piece), and a header drowned in blank space past the window a header may take (not a call, either way). */
static void test_long(rng *r) {
    const size_t n = 200000;
    char *big = malloc(n + 1);
    for (size_t i = 0; i < n; i++) big[i] = "abc <def>\n"[i % 10];
    big[n] = 0;
    char *text = malloc(n + 512), *want = malloc(2 * n + 512);
    snprintf(text, n + 512, "<tool_call>\n<function=w>\n<parameter=t>\n%s\n</parameter>\n</function>\n</tool_call>", big);
    char *c = NULL;
    cJSON *calls = NULL;
    moex_error err = {0};
    CHECK(serve_tool_calls_parse(SERVE_TOOLS_QWEN3_CODER, text, strlen(text), "t", &c, &calls, &err) == 0, "parse");
    folded s = stream(SERVE_TOOLS_QWEN3_CODER, text, 3, r);
    const char *args = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "function"), "arguments")->valuestring;
    CHECK(cJSON_GetArraySize(s.calls) == 1 && !strcmp(cJSON_GetArrayItem(cJSON_GetArrayItem(s.calls, 0), 1)->valuestring, args),
          "a long value streamed");
    cJSON *parsed = cJSON_Parse(args);
    CHECK(parsed && !strcmp(cJSON_GetObjectItem(parsed, "t")->valuestring, big), "the long value");
    cJSON_Delete(parsed);
    free(c);
    cJSON_Delete(calls);
    free(s.content);
    free(s.reasoning);
    cJSON_Delete(s.calls);

    snprintf(text, n + 512, "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"t\": \"%s\"}}\n</tool_call>", big);
    for (char *p = strchr(text, '\n') + 1; *p; p++) if (*p == '\n' && p[1] != '<') *p = ' ';
    s = stream(SERVE_TOOLS_HERMES, text, 3, r);
    CHECK(cJSON_GetArraySize(s.calls) == 1 && strlen(cJSON_GetArrayItem(cJSON_GetArrayItem(s.calls, 0), 1)->valuestring) == n + 9,
          "long JSON arguments streamed");
    free(s.content);
    free(s.reasoning);
    cJSON_Delete(s.calls);

    memset(want, ' ', 5000);
    want[5000] = 0;
    snprintf(text, n + 512, "<tool_call>%s{\"name\": \"f\", \"arguments\": {}}</tool_call>", want);
    expect(SERVE_TOOLS_HERMES, text, text, "[]", r);
    free(big);
    free(text);
    free(want);
}

/* Whole and in pieces agree on random answers built of each format's fragments (markers whole and cut,
 * JSON bits, blank space, multi-byte text): no expected value, only the property. */
static void same_in_pieces(serve_tool_format f, const char *text, rng *r) {
    char *c = NULL, *re = NULL;
    cJSON *got = NULL;
    moex_error err = {0};
    CHECK(serve_tool_calls_parse_ex(f, g_tools, text, strlen(text), "t", &c, &re, &got, &err) == 0, "parse: %s", err.msg);
    cJSON *pairs = whole_calls(got);
    char *gt = calls_text(pairs);
    for (int rep = 0; rep < 3; rep++) {
        folded s = stream(f, text, 1 + rep * 3, r);
        char *st = calls_text(s.calls);
        CHECK(!strcmp(st, gt) && !strcmp(s.content, c) && !strcmp(s.reasoning, re),
              "%s random answer '%s':\n  calls %s\n  whole %s\n  content '%s' (whole '%s')", serve_tool_format_name(f),
              text, st, gt, s.content, c);
        free(st);
        free(s.content);
        free(s.reasoning);
        cJSON_Delete(s.calls);
    }
    free(gt);
    free(c);
    free(re);
    cJSON_Delete(got);
    cJSON_Delete(pairs);
}

static void test_random(rng *r) {
    static const char *const common[] = {
        " ", "\n", "text", "é", "東京", "🌍", "<", "{", "}", "[1, 2]", "\"", "\\", ":", ",", "\"s\"", "\"a\": 1",
        "true", "x", "```", "```json\n", "<|", "｜", "tru", "\"na",
    };
    static const char *const per[SERVE_TOOLS_FORMAT_COUNT][12] = {
        [SERVE_TOOLS_HERMES] = {"<tool_call>", "</tool_call>", "<tool_call>\n{\"name\": \"f\", \"arguments\": ",
                                "{\"name\": \"g\"}", "<tool_", "\"arguments\": \"{}\"", "</tool_"},
        [SERVE_TOOLS_LLAMA3] = {"<|python_tag|>", "{\"name\": \"f\", \"parameters\": ", "; ", "<|python",
                                "{\"type\": \"function\", ", "\"name\": \"g\", "},
        [SERVE_TOOLS_HARMONY] = {"<|channel|>", "<|message|>", "<|end|>", "<|start|>assistant", "<|call|>", "analysis",
                                 "final", "<|channel|>commentary to=functions.f <|constrain|>json<|message|>",
                                 "<|start|>assistant to=functions.g<|channel|>commentary json<|message|>", "<|return|>",
                                 "<|chan", "<|channel|>analysis to=browser.x<|message|>"},
        [SERVE_TOOLS_DEEPSEEK_V3] = {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "function<｜tool▁sep｜>f\n",
                                     "f<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "<｜tool▁",
                                     "<｜tool▁call▁begin｜>g<｜tool▁sep｜>{",
                                     "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{"},
        [SERVE_TOOLS_KIMI_K2] = {"<|tool_calls_section_begin|>", "<|tool_call_begin|>functions.f:0", "<|tool_call_begin|>",
                                 "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|tool_calls_section_end|>",
                                 "<|tool_call", "<|tool_call_begin|>functions.g:1<|tool_call_argument_begin|>{"},
        [SERVE_TOOLS_GLM45] = {"<tool_call>", "f\n", "<arg_key>", "k</arg_key>", "<arg_value>", "</arg_value>",
                               "</tool_call>", "<arg_"},
        [SERVE_TOOLS_QWEN3_CODER] = {"<tool_call>\n", "<function=f>\n", "<parameter=k>\n", "\n</parameter>\n",
                                     "</function>\n", "</tool_call>", "<param"},
        [SERVE_TOOLS_DSML] = {"<｜DSML｜function_calls>", "<｜DSML｜invoke name=\"f\">", "<｜DSML｜parameter name=\"k\" ",
                              "string=\"true\">", "string=\"false\">", "</｜DSML｜parameter>", "</｜DSML｜invoke>",
                              "</｜DSML｜function_calls>", "<｜DSML"},
    };
    const size_t n_common = sizeof common / sizeof *common;
    cJSON *string_k = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
                                  "\"object\", \"properties\": {\"k\": {\"type\": \"string\"}}}}}]");
    char text[2048];
    for (int f = 1; f < SERVE_TOOLS_FORMAT_COUNT; f++) {
        const int fi = f == SERVE_TOOLS_DEEPSEEK_V31 ? SERVE_TOOLS_DEEPSEEK_V3 : f;
        size_t n_per = 0;
        while (n_per < 12 && per[fi][n_per]) n_per++;
        for (int k = 0; k < 150; k++) {
            size_t at = 0;
            const int parts = 1 + (int)(rng_next(r) % 24);
            for (int j = 0; j < parts; j++) {
                const char *frag = rng_next(r) % 2 ? per[fi][rng_next(r) % n_per] : common[rng_next(r) % n_common];
                const size_t len = strlen(frag);
                if (at + len >= sizeof text) break;
                memcpy(text + at, frag, len);
                at += len;
            }
            text[at] = 0;
            /* half the time the tools say parameter k is a string: XML-style values then stream */
            g_tools = k % 2 ? string_k : NULL;
            same_in_pieces((serve_tool_format)f, text, r);
            g_tools = NULL;
        }
    }
    cJSON_Delete(string_k);
}

static void test_none(rng *r) {
    expect(SERVE_TOOLS_NONE, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
           "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", "[]", r);
}

/* ---- detection ---- */

typedef struct tmpl_case {
    const char *file, *snippet;
    serve_tool_format want;
} tmpl_case;

static const tmpl_case k_templates[] = {
    {"Qwen-Qwen3-0.6B.jinja", "{{- \"<tool_call>\\n{\\\"name\\\": \\\"\" }}", SERVE_TOOLS_HERMES},
    {"Qwen-Qwen2.5-7B-Instruct.jinja", "<tool_call>\\n{\"name\": <function-name>", SERVE_TOOLS_HERMES},
    {"Qwen-QwQ-32B.jinja", "<tool_call>", SERVE_TOOLS_HERMES},
    {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "<tool_call>\n{\"name\": ..., \"parameters\": ...", SERVE_TOOLS_HERMES},
    {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "{{- '<tool_call>\\n' }}", SERVE_TOOLS_HERMES},
    {"Qwen3-Coder.jinja", "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' -}}", SERVE_TOOLS_QWEN3_CODER},
    {"Qwen3.5-4B.jinja", "<tool_call>\n<function=example_function_name>", SERVE_TOOLS_QWEN3_CODER},
    {"meta-llama-Llama-3.1-8B-Instruct.jinja",
     "<|start_header_id|>{{- '<|python_tag|>' + tool_call.name }} {{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }}",
     SERVE_TOOLS_LLAMA3},
    {"meta-llama-Llama-3.2-3B-Instruct.jinja", "<|start_header_id|>{{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }}",
     SERVE_TOOLS_LLAMA3},
    {"meta-llama-Llama-3.3-70B-Instruct.jinja", "<|start_header_id|>{{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }}",
     SERVE_TOOLS_LLAMA3},
    {"openai-gpt-oss-120b.jinja", "{{- \"<|start|>assistant to=\" }}{{- \"<|channel|>commentary \" }}{{- \"<|call|>\" }}",
     SERVE_TOOLS_HARMONY},
    {"deepseek-ai-DeepSeek-V3.1.jinja", "'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>'",
     SERVE_TOOLS_DEEPSEEK_V31},
    {"deepseek-ai-DeepSeek-V3.2.jinja", "{%- set dsml_token = '｜DSML｜' -%}", SERVE_TOOLS_DSML},
    {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
     "'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json'",
     SERVE_TOOLS_DEEPSEEK_V3},
    {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "<｜tool▁call▁begin｜>function<｜tool▁sep｜>x\n```json\n",
     SERVE_TOOLS_DEEPSEEK_V3},
    {"llama-cpp-deepseek-r1.jinja", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>example\n```json",
     SERVE_TOOLS_DEEPSEEK_V3},
    {"moonshotai-Kimi-K2.jinja", "<|tool_calls_section_begin|>", SERVE_TOOLS_KIMI_K2},
    {"Kimi-K2-Instruct.jinja", "{{render_content(message)}}<|tool_calls_section_begin|>", SERVE_TOOLS_KIMI_K2},
    {"Kimi-K2-Thinking.jinja", "<|tool_call_begin|>", SERVE_TOOLS_KIMI_K2},
    {"GLM-4.6.jinja", "{{ '\\n<tool_call>' + tc.name }}\n<arg_key>{{ k }}</arg_key>", SERVE_TOOLS_GLM45},
    {"GLM-4.7-Flash.jinja", "{{- '<tool_call>' + tc.name -}}<arg_key>{{ k }}</arg_key>", SERVE_TOOLS_GLM45},
    {"google-gemma-2-2b-it.jinja", "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim }}", SERVE_TOOLS_NONE},
    {"microsoft-Phi-3.5-mini-instruct.jinja", "{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}", SERVE_TOOLS_NONE},
    {"llama-cpp-rwkv-world.jinja", "{{- 'User: ' + message['content'] }}", SERVE_TOOLS_NONE},
    {"mistralai-Mistral-Nemo-Instruct-2407.jinja", "[TOOL_CALLS]", SERVE_TOOLS_NONE},
    {"CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
     "{\"tool_call_id\": \"0\", \"tool_name\": \"{{ tc['function']['name'] }}\", \"parameters\": {{ x }}}", SERVE_TOOLS_NONE},
    {"MiniMax-M3.jinja", "{%- set toolcall_begin_token = ']<]minimax[>[' ~ '<tool_call>' -%}", SERVE_TOOLS_NONE},
};


static void test_detect(void) {
    const char *dir = getenv("MOEX_TEMPLATES_DIR");
    int real = 0;
    for (size_t i = 0; i < sizeof k_templates / sizeof *k_templates; i++) {
        const tmpl_case *c = &k_templates[i];
        const serve_tool_format got = serve_tool_format_detect(c->snippet);
        CHECK(got == c->want, "snippet of %s: %s (want %s)", c->file, serve_tool_format_name(got),
              serve_tool_format_name(c->want));
        if (!dir) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, c->file);
        char *t = test_read_file(path, NULL);
        if (!t) continue;
        const serve_tool_format g = serve_tool_format_detect(t);
        CHECK(g == c->want, "%s: %s (want %s)", c->file, serve_tool_format_name(g), serve_tool_format_name(c->want));
        real++;
        free(t);
    }
    CHECK(serve_tool_format_detect("{{ messages }}") == SERVE_TOOLS_NONE && serve_tool_format_detect(NULL) == SERVE_TOOLS_NONE,
          "plain template");
    if (dir) printf("test_tool_calls: %d real templates in %s checked\n", real, dir);
    for (int f = 0; f < SERVE_TOOLS_FORMAT_COUNT; f++)
        CHECK(strcmp(serve_tool_format_name((serve_tool_format)f), "unknown"), "format %d has no name", f);
}

/* ---- grammar ---- */

/* A call in the exact form the grammar writes, and what it parses to. */
typedef struct gcase {
    serve_tool_format f;
    const char *text, *calls;
} gcase;

static const char *k_gtools =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}, \"required\": [\"city\"]}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"now\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}]";

static const gcase k_gcases[] = {
    {SERVE_TOOLS_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
     "[[\"get_weather\",\"{\\\"city\\\": \\\"Paris\\\", \\\"days\\\": 3}\"]]"},
    {SERVE_TOOLS_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", WEATHER},
    {SERVE_TOOLS_HARMONY,
     "<|channel|>analysis<|message|>Weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
     "<|constrain|>json<|message|>{\"city\": \"Paris\"}",
     WEATHER},
    {SERVE_TOOLS_DEEPSEEK_V3,
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```"
     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     WEATHER},
    {SERVE_TOOLS_DEEPSEEK_V31,
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>"
     "<｜tool▁calls▁end｜>",
     WEATHER},
    {SERVE_TOOLS_KIMI_K2,
     "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": "
     "\"Paris\"}<|tool_call_end|><|tool_calls_section_end|>",
     WEATHER},
    {SERVE_TOOLS_GLM45,
     "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
     "<arg_value>3</arg_value>\n</tool_call>",
     "[[\"get_weather\",\"{\\\"city\\\":\\\"Paris\\\",\\\"days\\\":3}\"]]"},
    {SERVE_TOOLS_QWEN3_CODER,
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
     WEATHER_COMPACT},
    {SERVE_TOOLS_DSML,
     "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
     "string=\"true\">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>"
     "\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
     "[[\"get_weather\",\"{\\\"city\\\":\\\"Paris\\\",\\\"days\\\":3}\"]]"},
};

/* Whether the grammar takes text byte by byte (a vocabulary of the 256 bytes) and may end after it. */
static bool grammar_takes(const serve_grammar *g, const serve_grammar_vocab *v, const char *text, moex_error *err) {
    serve_grammar_state *s = serve_grammar_state_create(g, err);
    bool ok = s != NULL;
    for (const char *p = text; ok && *p; p++) {
        if (serve_grammar_accept(s, v, (unsigned char)*p, err)) {
            moex_error_prefix(err, "at byte %td ('%.20s')", p - text, p);
            ok = false;
        }
    }
    if (ok && !serve_grammar_can_end(s)) ok = moex_fail(err, "the grammar may not end after the call") == 0;
    serve_grammar_state_free(s);
    return ok;
}

static void test_gbnf(rng *r) {
    static char bytes[256][1];
    const char *ptrs[257];
    uint32_t lens[257];
    bool eog[257] = {0};
    for (int i = 0; i < 256; i++) {
        bytes[i][0] = (char)i;
        ptrs[i] = bytes[i];
        lens[i] = 1;
    }
    ptrs[256] = "";
    lens[256] = 0;
    eog[256] = true;
    moex_error err = {0};
    serve_grammar_vocab *v = serve_grammar_vocab_create(257, ptrs, lens, eog, &err);
    CHECK(v, "vocab: %s", err.msg);
    cJSON *tools = cJSON_Parse(k_gtools);
    for (size_t i = 0; i < sizeof k_gcases / sizeof *k_gcases && v; i++) {
        const gcase *c = &k_gcases[i];
        for (int only = 0; only < 3; only++) {   /* any calls; one of get_weather; one of any */
            char *text = serve_tool_calls_gbnf(c->f, tools, only == 1 ? "get_weather" : NULL, only == 2, &err);
            CHECK(text, "%s gbnf: %s", serve_tool_format_name(c->f), err.msg);
            if (!text) continue;
            serve_grammar *g = serve_grammar_parse(text, "root", &err);
            CHECK(g, "%s gbnf does not parse: %s\n%s", serve_tool_format_name(c->f), err.msg, text);
            if (g) CHECK(grammar_takes(g, v, c->text, &err), "%s grammar refuses '%s': %s\n%s",
                         serve_tool_format_name(c->f), c->text, err.msg, text);
            serve_grammar_free(g);
            free(text);
        }
        g_tools = tools;
        expect(c->f, c->text, "", c->calls, r); /* what the grammar makes parses back */
        g_tools = NULL;
    }
    /* one call (parallel_tool_calls false): a second call is refused, which the many-calls grammar takes */
    const char *two = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
                      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
    for (int one = 0; one < 2 && v; one++) {
        char *text = serve_tool_calls_gbnf(SERVE_TOOLS_HERMES, tools, NULL, one, &err);
        serve_grammar *g = text ? serve_grammar_parse(text, "root", &err) : NULL;
        CHECK(g && grammar_takes(g, v, two, &err) == !one, "two Hermes calls with one=%d: %s", one,
              one ? "taken" : "refused");
        serve_grammar_free(g);
        free(text);
    }
    CHECK(!serve_tool_calls_gbnf(SERVE_TOOLS_HERMES, tools, "nope", false, &err), "an unknown name");
    CHECK(!serve_tool_calls_gbnf(SERVE_TOOLS_NONE, tools, NULL, false, &err), "format none");
    cJSON_Delete(tools);
    serve_grammar_vocab_free(v);
}

int main(void) {
    rng r = test_rng("test_tool_calls");
    test_hermes(&r);
    test_llama3(&r);
    test_harmony(&r);
    test_deepseek(&r);
    test_kimi(&r);
    test_glm(&r);
    test_qwen3_coder(&r);
    test_dsml(&r);
    test_xml_strings(&r);
    test_none(&r);
    test_long(&r);
    test_random(&r);
    test_detect();
    test_gbnf(&r);
    if (g_failures) {
        fprintf(stderr, "test_tool_calls: %d failure(s)\n", g_failures);
        return 1;
    }
    printf("test_tool_calls: ok\n");
    return 0;
}
