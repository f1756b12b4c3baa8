/* Tool calls per chat-template family (serve/tool_calls.h): which format a
 * template's markup stands for, and the GBNF a forced call follows. The
 * parsing, whole and streamed, is serve/tool_calls_stream.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/text.h"
#include "serve/grammar.h"
#include "serve/tool_calls.h"

/* ---- detection ---- */

static bool has(const char *t, const char *s) { return strstr(t, s) != NULL; }

/* Each family's own markup, most specific first: GLM and Qwen3-Coder write
 * <tool_call> too, and Hermes templates name "parameters" in their prompts. */
serve_tool_format serve_tool_format_detect(const char *t) {
    if (!t) return SERVE_TOOLS_NONE;
    if (has(t, "<|channel|>") && has(t, "<|call|>")) return SERVE_TOOLS_HARMONY;
    if (has(t, "｜DSML｜")) return SERVE_TOOLS_DSML;
    if (has(t, "<｜tool▁calls▁begin｜>") || has(t, "<｜tool▁call▁begin｜>"))
        return has(t, "```json") ? SERVE_TOOLS_DEEPSEEK_V3 : SERVE_TOOLS_DEEPSEEK_V31;
    if (has(t, "<|tool_calls_section_begin|>") || has(t, "<|tool_call_begin|>")) return SERVE_TOOLS_KIMI_K2;
    if (has(t, "<arg_key>")) return SERVE_TOOLS_GLM45;
    if (has(t, "<tool_call>") && has(t, "<function=")) return SERVE_TOOLS_QWEN3_CODER;
    if (has(t, "]<]minimax[>[")) return SERVE_TOOLS_NONE; /* MiniMax-M3's namespaced XML: not parsed */
    if (has(t, "<tool_call>")) return SERVE_TOOLS_HERMES;
    /* Llama 3.x: its header tokens, and calls rendered as {"name": ..., "parameters": ...}
     * (3.1 and 3.3 also name <|python_tag|>); Cohere's "tool_name" + "parameters" is not this */
    if (has(t, "<|start_header_id|>") && has(t, "\"parameters\": ") && has(t, "{\"name\": \"")) return SERVE_TOOLS_LLAMA3;
    return SERVE_TOOLS_NONE;
}

const char *serve_tool_format_name(serve_tool_format f) {
    static const char *const names[SERVE_TOOLS_FORMAT_COUNT] = {
        [SERVE_TOOLS_NONE] = "none",
        [SERVE_TOOLS_HERMES] = "hermes",
        [SERVE_TOOLS_LLAMA3] = "llama3",
        [SERVE_TOOLS_HARMONY] = "harmony",
        [SERVE_TOOLS_DEEPSEEK_V3] = "deepseek-v3",
        [SERVE_TOOLS_KIMI_K2] = "kimi-k2",
        [SERVE_TOOLS_GLM45] = "glm-4.5",
        [SERVE_TOOLS_QWEN3_CODER] = "qwen3-coder",
        [SERVE_TOOLS_DEEPSEEK_V31] = "deepseek-v3.1",
        [SERVE_TOOLS_DSML] = "deepseek-dsml",
    };
    return (unsigned)f < SERVE_TOOLS_FORMAT_COUNT && names[f] ? names[f] : "unknown";
}

int serve_tool_param_is_string(const cJSON *schema) {
    if (!schema) return -1;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(schema, "type");
    if (cJSON_IsString(type)) return !strcmp(type->valuestring, "string");
    if (cJSON_IsArray(type)) {
        const cJSON *t;
        cJSON_ArrayForEach(t, type) if (cJSON_IsString(t) && !strcmp(t->valuestring, "string")) return 1;
        return 0;
    }
    if (cJSON_GetObjectItemCaseSensitive(schema, "enum") || cJSON_GetObjectItemCaseSensitive(schema, "const") ||
        cJSON_GetObjectItemCaseSensitive(schema, "anyOf") || cJSON_GetObjectItemCaseSensitive(schema, "oneOf"))
        return -1;
    return 1;
}

/* ---- GBNF ---- */

typedef struct gb {
    char *p;
    size_t n, cap;
    bool oom;
} gb;

static void gb_add(gb *b, const char *s) {
    const size_t k = strlen(s);
    if (b->oom || (b->oom = moex_grow_bytes(&b->p, &b->cap, b->n + k + 1) != 0)) return;
    memcpy(b->p + b->n, s, k + 1);
    b->n += k;
}

/* s as the inside of a GBNF string literal. */
static void gb_lit_text(gb *b, const char *s) {
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        char e[8] = {(char)c, 0};
        if (c == '"' || c == '\\') snprintf(e, sizeof e, "\\%c", c);
        else if (c == '\n') snprintf(e, sizeof e, "\\n");
        else if (c == '\r') snprintf(e, sizeof e, "\\r");
        else if (c == '\t') snprintf(e, sizeof e, "\\t");
        else if (c < 0x20) snprintf(e, sizeof e, "\\x%02X", c);
        gb_add(b, e);
    }
}

/* " a quoted literal " */
static void gb_lit(gb *b, const char *s) {
    gb_add(b, " \"");
    gb_lit_text(b, s);
    gb_add(b, "\"");
}

/* " pre mid post " as one literal. */
static void gb_lit3(gb *b, const char *pre, const char *mid, const char *post) {
    gb_add(b, " \"");
    gb_lit_text(b, pre);
    gb_lit_text(b, mid);
    gb_lit_text(b, post);
    gb_add(b, "\"");
}

/* " <prefix>-<i>[-<j>]": a rule used; define: "<prefix>-<i> ::=" instead. */
static void gb_ref(gb *b, const char *prefix, int i, int j, bool define) {
    char r[80];
    if (j >= 0) snprintf(r, sizeof r, "%s%s-%d-%d%s", define ? "" : " ", prefix, i, j, define ? " ::=" : "");
    else snprintf(r, sizeof r, "%s%s-%d%s", define ? "" : " ", prefix, i, define ? " ::=" : "");
    gb_add(b, r);
}

/* Appends the JSON schema's rules (first rule `name`). */
static int gb_schema(gb *b, const cJSON *schema, const char *name, moex_error *err) {
    char *g = serve_json_schema_gbnf(schema, name, err);
    if (!g) return -1;
    gb_add(b, g);
    if (b->n && b->p[b->n - 1] != '\n') gb_add(b, "\n");
    free(g);
    return 0;
}

static const cJSON *tool_fn(const cJSON *tool) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
    return fn ? fn : tool;
}

static bool xml_format(serve_tool_format f) {
    return f == SERVE_TOOLS_GLM45 || f == SERVE_TOOLS_QWEN3_CODER || f == SERVE_TOOLS_DSML;
}

/* One parameter of an XML-style call: its key, its value (rule), its closing. */
static int gb_xml_param(gb *b, serve_tool_format f, const char *key, bool str, int i, int j) {
    if (f == SERVE_TOOLS_GLM45) gb_lit3(b, "<arg_key>", key, "</arg_key>\n<arg_value>");
    else if (f == SERVE_TOOLS_QWEN3_CODER) gb_lit3(b, "<parameter=", key, ">\n");
    else gb_lit3(b, "<｜DSML｜parameter name=\"", key, str ? "\" string=\"true\">" : "\" string=\"false\">");
    if (str) gb_add(b, " tc-text");
    else gb_ref(b, "tool", i, j, false); /* tool-i-j: the schema rule of parameter j */
    gb_lit(b, f == SERVE_TOOLS_GLM45 ? "</arg_value>\n" : f == SERVE_TOOLS_QWEN3_CODER ? "\n</parameter>\n"
                                                                                       : "</｜DSML｜parameter>\n");
    return 0;
}

static bool required(const cJSON *params, const char *key) {
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(params, "required")) if (cJSON_IsString(r) &&
                                                                                     !strcmp(r->valuestring, key)) return true;
    return false;
}

/* tc-args-i: an XML-style call's parameters, in the schema's order (required ones always, optional ones allowed). */
static int gb_xml_args(gb *b, serve_tool_format f, const cJSON *params, int i, moex_error *err) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties"), *p;
    int j = 0;
    gb_ref(b, "tc-args", i, -1, true);
    cJSON_ArrayForEach(p, props) {
        const bool req = required(params, p->string);
        if (!req) gb_add(b, " (");
        gb_xml_param(b, f, p->string, serve_tool_param_is_string(p) == 1, i, j++);
        if (!req) gb_add(b, " )?");
    }
    if (!j) gb_add(b, " \"\"");
    gb_add(b, "\n");
    j = 0;
    cJSON_ArrayForEach(p, props) {
        char name[64];
        snprintf(name, sizeof name, "tool-%d-%d", i, j++);
        if (serve_tool_param_is_string(p) != 1 && gb_schema(b, p, name, err)) return -1;
    }
    return 0;
}

/* tc-call-i ::= ... for function name with arguments rule args. */
static void gb_call(gb *b, serve_tool_format f, const char *name, int i) {
    char args[32];
    snprintf(args, sizeof args, " tool-%d-args", i);
    if (xml_format(f)) snprintf(args, sizeof args, " tc-args-%d", i);
    gb_ref(b, "tc-call", i, -1, true);
    switch (f) {
    case SERVE_TOOLS_HERMES:
        gb_lit3(b, "<tool_call>\n{\"name\": \"", name, "\", \"arguments\": ");
        gb_add(b, args);
        gb_lit(b, "}\n</tool_call>");
        break;
    case SERVE_TOOLS_LLAMA3:
        gb_lit3(b, "{\"name\": \"", name, "\", \"parameters\": ");
        gb_add(b, args);
        gb_lit(b, "}");
        break;
    case SERVE_TOOLS_HARMONY:
        gb_lit3(b, "<|channel|>commentary to=functions.", name, " <|constrain|>json<|message|>");
        gb_add(b, args);
        break;
    case SERVE_TOOLS_DEEPSEEK_V3:
        gb_lit3(b, "<｜tool▁call▁begin｜>function<｜tool▁sep｜>", name, "\n```json\n");
        gb_add(b, args);
        gb_lit(b, "\n```<｜tool▁call▁end｜>");
        break;
    case SERVE_TOOLS_DEEPSEEK_V31:
        gb_lit3(b, "<｜tool▁call▁begin｜>", name, "<｜tool▁sep｜>");
        gb_add(b, args);
        gb_lit(b, "<｜tool▁call▁end｜>");
        break;
    case SERVE_TOOLS_KIMI_K2:
        gb_lit3(b, "<|tool_call_begin|>functions.", name, ":");
        gb_add(b, " [0-9]+");
        gb_lit(b, "<|tool_call_argument_begin|>");
        gb_add(b, args);
        gb_lit(b, "<|tool_call_end|>");
        break;
    case SERVE_TOOLS_GLM45:
        gb_lit3(b, "<tool_call>", name, "\n");
        gb_add(b, args);
        gb_lit(b, "</tool_call>");
        break;
    case SERVE_TOOLS_QWEN3_CODER:
        gb_lit3(b, "<tool_call>\n<function=", name, ">\n");
        gb_add(b, args);
        gb_lit(b, "</function>\n</tool_call>");
        break;
    case SERVE_TOOLS_DSML:
        gb_lit3(b, "<｜DSML｜invoke name=\"", name, "\">\n");
        gb_add(b, args);
        gb_lit(b, "</｜DSML｜invoke>\n");
        break;
    default: break;
    }
    gb_add(b, "\n");
}

/* root: the calls, inside the format's section markers; `one`: exactly one. */
static void gb_root(gb *b, serve_tool_format f, bool one) {
    const char *sep = "", *open = "", *close = "";
    switch (f) {
    case SERVE_TOOLS_HERMES:
    case SERVE_TOOLS_QWEN3_CODER: sep = "\n"; break;
    case SERVE_TOOLS_GLM45: sep = "\n"; break;
    case SERVE_TOOLS_LLAMA3: sep = "; "; break;
    case SERVE_TOOLS_HARMONY: one = true; break; /* <|call|> ends the turn: one call per answer */
    case SERVE_TOOLS_DEEPSEEK_V3:
        open = "<｜tool▁calls▁begin｜>", close = "<｜tool▁calls▁end｜>", sep = "\n";
        break;
    case SERVE_TOOLS_DEEPSEEK_V31: open = "<｜tool▁calls▁begin｜>", close = "<｜tool▁calls▁end｜>"; break;
    case SERVE_TOOLS_KIMI_K2: open = "<|tool_calls_section_begin|>", close = "<|tool_calls_section_end|>"; break;
    case SERVE_TOOLS_DSML: open = "<｜DSML｜function_calls>\n", close = "</｜DSML｜function_calls>"; break;
    default: break;
    }
    gb_add(b, "root ::=");
    if (f == SERVE_TOOLS_HARMONY) gb_add(b, " tc-analysis?");
    if (*open) gb_lit(b, open);
    gb_add(b, " tc-call");
    if (!one) {
        gb_add(b, " (");
        if (*sep) gb_lit(b, sep);
        gb_add(b, " tc-call )*");
    }
    if (*close) gb_lit(b, close);
    gb_add(b, "\n");
    if (f == SERVE_TOOLS_HARMONY)
        gb_add(b, "tc-analysis ::= \"<|channel|>analysis<|message|>\" ( [^<] | \"<\" [^|] )* "
                  "\"<|end|><|start|>assistant\"\n");
    if (xml_format(f)) gb_add(b, "tc-text ::= ( [^<] | \"<\" [^/] )*\n");
}

char *serve_tool_calls_gbnf(serve_tool_format f, const cJSON *tools, const char *only_name, bool one,
                            moex_error *err) {
    if (f == SERVE_TOOLS_NONE || (unsigned)f >= SERVE_TOOLS_FORMAT_COUNT) {
        moex_fail(err, "tool calls: the chat template has no tool-call format");
        return NULL;
    }
    gb b = {0};
    gb_root(&b, f, one || only_name != NULL);
    gb_add(&b, "tc-call ::=");
    int n = 0, i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(tool_fn(t), "name");
        if (cJSON_IsString(name) && (!only_name || !strcmp(name->valuestring, only_name))) {
            gb_add(&b, n++ ? " |" : "");
            gb_ref(&b, "tc-call", i, -1, false);
        }
        i++;
    }
    gb_add(&b, "\n");
    if (!n) {
        free(b.p);
        if (only_name) moex_fail(err, "tool calls: no tool named '%s'", only_name);
        else moex_fail(err, "tool calls: no tools to call");
        return NULL;
    }
    i = 0;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = tool_fn(t), *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        const int k = i++;
        if (!cJSON_IsString(name) || (only_name && strcmp(name->valuestring, only_name))) continue;
        gb_call(&b, f, name->valuestring, k);
        char rule[32];
        snprintf(rule, sizeof rule, "tool-%d-args", k);
        cJSON *any_object = params ? NULL : cJSON_Parse("{\"type\": \"object\"}"); /* arguments are an object */
        const cJSON *schema = params ? params : any_object;
        const int rc = xml_format(f) ? gb_xml_args(&b, f, schema, k, err) : gb_schema(&b, schema, rule, err);
        cJSON_Delete(any_object);
        if (rc) {
            moex_error_prefix(err, "tool '%s' parameters", name->valuestring);
            free(b.p);
            return NULL;
        }
    }
    if (b.oom) {
        free(b.p);
        moex_fail(err, "tool calls: out of memory");
        return NULL;
    }
    return b.p;
}
