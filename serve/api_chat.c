/* A chat request's prompt and the shape of its answer (api.h):
 *
 *   messages, tools, chat_template_kwargs -> the model's Jinja chat template -> prompt text
 *   tool_choice "required" / a named function -> a grammar of the template's tool-call format
 *   response_format json_object / json_schema, grammar (GBNF) -> a grammar of the answer
 *
 * Messages reach the template as llama.cpp passes them: a tool call's
 * arguments as a JSON object (OpenAI sends them as a string), content as one
 * string (text parts joined; "" where the client sent null), no "tools" key
 * without tools (some templates fail on a null one).
 * Servers without a Jinja template (--chat-template NAME) render plain
 * conversations with the built-in renderings (common/chat.h) and refuse tools. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "serve/api.h"
#include "serve/grammar.h"
#include "serve/jinja.h"
#include "serve/tool_calls.h"

#define BAD(e, param, ...) serve_api_fail(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)
#define OOM(e) serve_api_fail(e, 500, "server_error", NULL, NULL, "out of memory")

#define MAX_MESSAGES 4096
#define MAX_TOOLS 128
#define MAX_KWARGS 64

static const cJSON *field(const cJSON *root, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

/* ---- messages as the template sees them ---- */

/* content: a string, an array of text parts (joined), or null/absent: "" (a tool-only assistant turn's; templates
 * such as Phi-3.5's and Granite's concatenate it, which null would break). */
static int template_content(const cJSON *msg, int i, cJSON *out, serve_api_error *e) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (!c || cJSON_IsNull(c)) return cJSON_AddStringToObject(out, "content", "") ? 0 : OOM(e);
    if (cJSON_IsString(c)) return cJSON_AddStringToObject(out, "content", c->valuestring) ? 0 : OOM(e);
    if (!cJSON_IsArray(c)) return BAD(e, "messages", "messages[%d].content must be a string or an array of parts", i);
    size_t total = 1, at = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(t))
            return BAD(e, "messages", "messages[%d].content: only text parts ({\"type\": \"text\", \"text\": ...}) "
                       "are supported", i);
        total += strlen(t->valuestring);
    }
    char *joined = malloc(total);
    if (!joined) return OOM(e);
    cJSON_ArrayForEach(part, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        memcpy(joined + at, t, strlen(t));
        at += strlen(t);
    }
    joined[at] = '\0';
    const int rc = cJSON_AddStringToObject(out, "content", joined) ? 0 : OOM(e);
    free(joined);
    return rc;
}

/* An assistant message's tool_calls: {id, type: "function", function: {name, arguments}} with the arguments
 * (a JSON text) parsed into the object templates print with tojson. */
static int template_tool_calls(const cJSON *calls, int i, cJSON *out, serve_api_error *e) {
    if (!cJSON_IsArray(calls)) return BAD(e, "messages", "messages[%d].tool_calls must be an array", i);
    cJSON *arr = cJSON_AddArrayToObject(out, "tool_calls");
    if (!arr) return OOM(e);
    int k = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
        if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !(cJSON_IsString(args) || cJSON_IsObject(args)))
            return BAD(e, "messages", "messages[%d].tool_calls[%d] must be {\"id\", \"type\": \"function\", \"function\": "
                       "{\"name\": string, \"arguments\": JSON text}}", i, k);
        cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : cJSON_Duplicate(args, true);
        if (!parsed) return BAD(e, "messages", "messages[%d].tool_calls[%d].function.arguments is not JSON", i, k);
        cJSON *tc = cJSON_CreateObject(), *f = cJSON_CreateObject();
        if (!tc || !f) {
            cJSON_Delete(tc), cJSON_Delete(f), cJSON_Delete(parsed);
            return OOM(e);
        }
        if (cJSON_IsString(id)) cJSON_AddStringToObject(tc, "id", id->valuestring);
        cJSON_AddStringToObject(tc, "type", "function");
        cJSON_AddStringToObject(f, "name", name->valuestring);
        cJSON_AddItemToObject(f, "arguments", parsed);
        cJSON_AddItemToObject(tc, "function", f);
        cJSON_AddItemToArray(arr, tc);
        k++;
    }
    return 0;
}

/* The keys a message may carry; a key outside them is a 400 unless null (clients echo a response's message
 * back with "refusal": null, "audio": null, ...). */
static bool message_key_known(const char *k) {
    static const char *const keys[] = {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content",
                                       NULL};
    for (const char *const *p = keys; *p; p++)
        if (!strcmp(*p, k)) return true;
    return false;
}

static int template_message(const cJSON *m, int i, bool jinja, cJSON *out, serve_api_error *e) {
    if (!cJSON_IsObject(m)) return BAD(e, "messages", "messages[%d] must be an object {role, content}", i);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
    const char *role = cJSON_IsString(r) ? r->valuestring : "";
    if (!strcmp(role, "developer")) role = "system";   /* OpenAI's newer name for it */
    const bool tool_role = !strcmp(role, "tool");
    if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && !tool_role)
        return BAD(e, "messages", "messages[%d].role must be \"system\", \"developer\", \"user\", \"assistant\" or "
                   "\"tool\"", i);
    const cJSON *x;
    cJSON_ArrayForEach(x, m) if (!message_key_known(x->string) && !cJSON_IsNull(x))
        return BAD(e, "messages", "messages[%d].%.60s is not supported; leave it out", i, x->string);
    const cJSON *calls = field(m, "tool_calls"), *call_id = field(m, "tool_call_id");
    if ((calls || tool_role) && !jinja)
        return BAD(e, "messages", "messages[%d]: tool calls need a Jinja chat template, and this server renders "
                   "chats with a built-in one (--chat-template): start it without, or with --chat-template-file", i);
    if (calls && strcmp(role, "assistant")) return BAD(e, "messages", "messages[%d]: only an assistant message has "
                                                       "tool_calls", i);
    if (tool_role && !cJSON_IsString(call_id))
        return BAD(e, "messages", "messages[%d]: a tool message needs \"tool_call_id\" (the call it answers)", i);
    if (!cJSON_AddStringToObject(out, "role", role) || template_content(m, i, out, e)) return -1;
    const char *const strings[] = {"name", "tool_call_id", "reasoning_content"};
    for (int k = 0; k < 3; k++) {
        const cJSON *s = field(m, strings[k]);
        if (!s) continue;
        if (!cJSON_IsString(s)) return BAD(e, "messages", "messages[%d].%s must be a string", i, strings[k]);
        if (!cJSON_AddStringToObject(out, strings[k], s->valuestring)) return OOM(e);
    }
    return calls ? template_tool_calls(calls, i, out, e) : 0;
}

/* ---- tools and tool_choice ---- */

/* OpenAI's rule for a function's name (^[a-zA-Z0-9_-]{1,64}$): it is written into grammars and call syntax as is. */
static bool tool_name_ok(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (!((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') || (s[n] >= '0' && s[n] <= '9') ||
              s[n] == '_' || s[n] == '-'))
            return false;
    return n >= 1 && n <= 64;
}

static int check_tools(const cJSON *tools, serve_api_error *e) {
    if (!cJSON_IsArray(tools)) return BAD(e, "tools", "'tools' must be an array of {\"type\": \"function\", ...}");
    if (cJSON_GetArraySize(tools) > MAX_TOOLS) return BAD(e, "tools", "at most %d tools", MAX_TOOLS);
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *params = field(fn, "parameters");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsObject(fn) ||
            !cJSON_IsString(name) || !*name->valuestring)
            return BAD(e, "tools", "tools[%d] must be {\"type\": \"function\", \"function\": {\"name\": ..., "
                       "\"parameters\": JSON schema}}", i);
        if (params && !cJSON_IsObject(params)) return BAD(e, "tools", "tools[%d].function.parameters must be a JSON "
                                                          "schema (an object)", i);
        if (!tool_name_ok(name->valuestring))
            return BAD(e, "tools", "tools[%d].function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -", i);
        i++;
    }
    return 0;
}

/* tool_choice: "none", "auto", "required" or {"type": "function", "function": {"name": N}}.
 * *mode: 0 none, 1 auto, 2 required; *name: the named function (mode 2). */
static int tool_choice(const cJSON *root, const cJSON *tools, int *mode, const char **name, serve_api_error *e) {
    const cJSON *c = field(root, "tool_choice");
    *mode = tools && cJSON_GetArraySize(tools) > 0 ? 1 : 0;
    *name = NULL;
    if (!c) return 0;
    if (cJSON_IsString(c)) {
        if (!strcmp(c->valuestring, "none")) *mode = 0;
        else if (!strcmp(c->valuestring, "auto")) ;
        else if (!strcmp(c->valuestring, "required")) *mode = 2;
        else return BAD(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                        "\"function\", \"function\": {\"name\": ...}}");
    } else {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(c) || !cJSON_IsString(n))
            return BAD(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                       "\"function\", \"function\": {\"name\": ...}}");
        *mode = 2;
        *name = n->valuestring;
    }
    if (*mode == 2 && !(tools && cJSON_GetArraySize(tools) > 0))
        return BAD(e, "tool_choice", "'tool_choice' asks for a call, but 'tools' offers none");
    if (*name) {
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *tn = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
            if (!strcmp(tn->valuestring, *name)) return 0;
        }
        return BAD(e, "tool_choice", "'tool_choice' names '%.100s', which is not among 'tools'", *name);
    }
    return 0;
}

/* ---- rendering ---- */

/* Drops the template's leading BOS text when the tokenizer adds BOS itself (else the prompt would start with two). */
static void strip_bos(const serve_openai_ctx *ctx, serve_job_params *job) {
    const size_t n = ctx->bos_token ? strlen(ctx->bos_token) : 0;
    if (!ctx->strip_bos || !n || job->prompt_len < n || memcmp(job->prompt_text, ctx->bos_token, n)) return;
    memmove(job->prompt_text, job->prompt_text + n, job->prompt_len - n + 1);
    job->prompt_len -= n;
}

/* Members of chat_template_kwargs become the template's variables (enable_thinking, ...), except the ones the
 * server sets. */
static int template_kwargs(const cJSON *root, cJSON *vars, serve_api_error *e) {
    const cJSON *kw = field(root, "chat_template_kwargs");
    if (!kw) return 0;
    if (!cJSON_IsObject(kw)) return BAD(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (cJSON_GetArraySize(kw) > MAX_KWARGS)
        return BAD(e, "chat_template_kwargs", "'chat_template_kwargs' has %d members; at most %d",
                   cJSON_GetArraySize(kw), MAX_KWARGS);
    const cJSON *x;
    cJSON_ArrayForEach(x, kw) {
        if (cJSON_GetObjectItemCaseSensitive(vars, x->string))
            return BAD(e, "chat_template_kwargs", "chat_template_kwargs.%.60s is set by the server", x->string);
        cJSON *dup = cJSON_Duplicate(x, true);
        if (!dup) return OOM(e);
        cJSON_AddItemToObject(vars, x->string, dup);
    }
    return 0;
}

static int render_jinja(const serve_openai_ctx *ctx, const cJSON *root, cJSON *vars, serve_job_params *job,
                        serve_api_error *e) {
    cJSON_AddBoolToObject(vars, "add_generation_prompt", true);
    cJSON_AddStringToObject(vars, "bos_token", ctx->bos_token ? ctx->bos_token : "");
    cJSON_AddStringToObject(vars, "eos_token", ctx->eos_token ? ctx->eos_token : "");
    if (template_kwargs(root, vars, e)) return -1;
    moex_error err = {0};
    size_t len = 0;
    job->prompt_text = moex_jinja_render(ctx->jinja, vars, (long long)time(NULL), 0, &len, &err);
    if (!job->prompt_text)   /* the template's raise_exception: what the conversation breaks (roles, order) */
        return BAD(e, "messages", "the model's chat template refused this conversation: %s", err.msg);
    job->prompt_len = len;
    strip_bos(ctx, job);
    return 0;
}

/* The built-in renderings: role and content only. */
static int render_builtin(const serve_openai_ctx *ctx, const cJSON *msgs, serve_job_params *job, serve_api_error *e) {
    const int n = cJSON_GetArraySize(msgs);
    moex_chat_msg *m = calloc((size_t)n, sizeof *m);
    if (!m) return OOM(e);
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, msgs) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(x, "content");
        m[i].role = cJSON_GetObjectItemCaseSensitive(x, "role")->valuestring;
        m[i++].content = cJSON_IsString(c) ? c->valuestring : "";
    }
    moex_error err = {0};
    int rc = 0;
    const int64_t len = moex_chat_apply(ctx->chat, m, n, true, NULL, 0, &err);
    if (len < 0) rc = serve_api_fail(e, 500, "server_error", NULL, NULL, "chat template: %s", err.msg);
    else if (!(job->prompt_text = malloc((size_t)len + 1))) rc = OOM(e);
    else {
        moex_chat_apply(ctx->chat, m, n, true, job->prompt_text, len + 1, &err);
        job->prompt_len = (size_t)len;
    }
    free(m);
    return rc;
}

/* The grammar of a forced call: tool_choice "required" (one or more calls; one with parallel_tool_calls false)
 * or a named function (one call of it). */
static int forced_call(const serve_openai_ctx *ctx, const cJSON *tools, const char *name, bool one,
                       serve_job_params *job, serve_api_error *e) {
    moex_error err = {0};
    serve_grammar *parsed = NULL;
    if (!(job->grammar = serve_tool_calls_gbnf(ctx->tool_format, tools, name, one, &err)) ||
        !(parsed = serve_grammar_parse(job->grammar, NULL, &err)))
        return BAD(e, "tools", "cannot force a tool call: %s", err.msg);
    serve_grammar_free(parsed);
    return 0;
}

int serve_chat_prompt(const serve_openai_ctx *ctx, const cJSON *root, serve_api_request *out, serve_api_error *e) {
    const cJSON *msgs = field(root, "messages");
    if (!msgs) return BAD(e, "messages", "'messages' is required");
    if (!cJSON_IsArray(msgs)) return BAD(e, "messages", "'messages' must be an array of {role, content}");
    const int n = cJSON_GetArraySize(msgs);
    if (n < 1) return BAD(e, "messages", "'messages' is empty: nothing to answer");
    if (n > MAX_MESSAGES) return BAD(e, "messages", "%d messages; at most %d", n, MAX_MESSAGES);
    const cJSON *tools = field(root, "tools");
    if (tools && check_tools(tools, e)) return -1;
    int mode;
    const char *name;
    if (tool_choice(root, tools, &mode, &name, e)) return -1;
    const cJSON *ptc = field(root, "parallel_tool_calls");
    if (ptc && !cJSON_IsBool(ptc)) return BAD(e, "parallel_tool_calls", "'parallel_tool_calls' must be true or false");
    if (mode && (!ctx->jinja || ctx->tool_format == SERVE_TOOLS_NONE))
        return BAD(e, "tools", "this model's chat template %s: tools cannot be offered (serve it with "
                   "--chat-template-file TEMPLATE.jinja of a tool-calling family)",
                   ctx->jinja ? "writes no tool calls MoEx knows" : "is a built-in one (--chat-template)");
    cJSON *vars = cJSON_CreateObject(), *tm = cJSON_AddArrayToObject(vars, "messages");
    int rc = vars && tm ? 0 : OOM(e);
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        if (rc) break;
        cJSON *x = cJSON_CreateObject();
        if (!x) rc = OOM(e);
        else cJSON_AddItemToArray(tm, x), rc = template_message(m, i++, ctx->jinja != NULL, x, e);
    }
    if (!rc && mode && !cJSON_AddItemToObject(vars, "tools", cJSON_Duplicate(tools, true))) rc = OOM(e);
    if (!rc) rc = ctx->jinja ? render_jinja(ctx, root, vars, &out->job, e) : render_builtin(ctx, tm, &out->job, e);
    if (!rc && field(root, "chat_template_kwargs") && !ctx->jinja)
        rc = BAD(e, "chat_template_kwargs", "'chat_template_kwargs' needs a Jinja chat template; this server renders "
                 "with a built-in one (--chat-template)");
    if (!rc && mode == 2) {
        if (out->job.grammar) rc = BAD(e, "tool_choice", "a forced tool call cannot be combined with "
                                       "'response_format' or 'grammar'");
        else rc = forced_call(ctx, tools, name, ptc && cJSON_IsFalse(ptc), &out->job, e);
    }
    if (!rc && mode) {
        out->tool_format = ctx->tool_format;
        out->one_call = name || (ptc && cJSON_IsFalse(ptc));
        if (!(out->tools = cJSON_Duplicate(tools, true))) rc = OOM(e);
    }
    cJSON_Delete(vars);
    return rc;
}

/* ---- response_format and grammar: the answer's shape, both endpoints ---- */

static int schema_grammar(const cJSON *schema, serve_job_params *job, serve_api_error *e) {
    moex_error err = {0};
    if (!(job->grammar = serve_json_schema_gbnf(schema, "root", &err)))
        return BAD(e, "response_format", "response_format's schema: %s", err.msg);
    return 0;
}

int serve_answer_grammar(const cJSON *root, serve_job_params *job, serve_api_error *e) {
    const cJSON *rf = field(root, "response_format"), *g = field(root, "grammar");
    if (rf && g) return BAD(e, "grammar", "'grammar' and 'response_format' both shape the answer: send one");
    if (g) {
        if (!cJSON_IsString(g)) return BAD(e, "grammar", "'grammar' must be GBNF text");
        if (!(job->grammar = strdup(g->valuestring))) return OOM(e);
    } else if (rf) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
        if (!cJSON_IsObject(rf) || !cJSON_IsString(type))
            return BAD(e, "response_format", "'response_format' must be {\"type\": \"text\" | \"json_object\" | "
                       "\"json_schema\", ...}");
        if (!strcmp(type->valuestring, "text")) return 0;
        if (!strcmp(type->valuestring, "json_object")) {
            cJSON *object = cJSON_Parse("{\"type\": \"object\"}");
            const int rc = object ? schema_grammar(object, job, e) : OOM(e);
            cJSON_Delete(object);
            if (rc) return -1;
        } else if (!strcmp(type->valuestring, "json_schema")) {
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
            const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
            if (!cJSON_IsObject(js) || (schema && !cJSON_IsObject(schema)))
                return BAD(e, "response_format", "'response_format' json_schema must be {\"name\": ..., \"schema\": "
                           "{...}, \"strict\": bool}");
            if (schema_grammar(schema, job, e)) return -1;   /* no schema: any JSON value */
        } else {
            return BAD(e, "response_format", "response_format type '%.40s' is not one of \"text\", \"json_object\", "
                       "\"json_schema\"", type->valuestring);
        }
    }
    if (!job->grammar) return 0;
    moex_error err = {0};   /* a grammar that does not parse is the request's fault: say so now, not mid-stream */
    serve_grammar *parsed = serve_grammar_parse(job->grammar, NULL, &err);
    if (!parsed) return BAD(e, g ? "grammar" : "response_format", "grammar: %s", err.msg);
    serve_grammar_free(parsed);
    return 0;
}

/* ---- the server's template ---- */

/* The template of a model whose GGUF has none: ChatML (llama.cpp's default), with tools and calls written the
 * way Qwen2.5 and Hermes do (<tools> in the system turn, <tool_call> JSON in the answer). Without tools it renders
 * exactly the built-in ChatML. */
static const char default_template[] =
    "{%- if tools %}\n"
    "{{- '<|im_start|>system\\n' }}\n"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}\n"
    "{{- '# Tools\\n\\nYou may call one or more functions. Their signatures are within <tools></tools>:\\n<tools>' }}\n"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}\n"
    "{{- '\\n</tools>\\n\\nFor each call, return a JSON object with the function name and arguments within "
    "<tool_call></tool_call> tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n"
    "</tool_call><|im_end|>\\n' }}\n"
    "{%- elif messages[0].role == 'system' %}\n"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "{%- if message.role == 'system' and loop.first %}\n"
    "{%- elif message.role == 'assistant' and message.tool_calls %}\n"
    "{{- '<|im_start|>assistant' }}{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}\n"
    "{%- for tc in message.tool_calls %}{{- '\\n<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' + "
    "(tc.function.arguments | tojson) + '}\\n</tool_call>' }}{%- endfor %}\n"
    "{{- '<|im_end|>\\n' }}\n"
    "{%- elif message.role == 'tool' %}\n"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n";

const char *serve_default_chat_template(void) { return default_template; }

static char *read_text_file(const char *path, size_t *len, moex_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        moex_fail(err, "cannot open chat template %s", path);
        return NULL;
    }
    char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    for (;;) {
        if (*len + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 65536;
            char *grown = cap <= (64u << 20) ? realloc(buf, cap) : NULL;
            if (!grown) {
                free(buf), fclose(f);
                moex_fail(err, "chat template %s: too large or out of memory", path);
                return NULL;
            }
            buf = grown;
        }
        const size_t got = fread(buf + *len, 1, 4096, f);
        *len += got;
        if (got < 4096) break;
    }
    fclose(f);
    buf[*len] = '\0';
    return buf;
}

/* A special token's text as templates print it (bos_token, eos_token). */
static void token_text(const moex_model *m, int32_t id, char *buf, size_t cap) {
    const int n = id >= 0 && m->tok ? moex_token_to_piece(m->tok, id, true, buf, (int)cap - 1) : 0;
    buf[n > 0 && n < (int)cap ? n : 0] = '\0';
}

static int use_jinja(serve_chat_setup *cs, const char *text, size_t len, const char *source, serve_openai_ctx *ctx,
                     moex_error *err) {
    if (!(cs->jinja = moex_jinja_parse(text, len, err))) return moex_error_prefix(err, "%s", source);
    ctx->jinja = cs->jinja;
    ctx->tool_format = serve_tool_format_detect(text);
    if (text == default_template) ctx->tool_format = SERVE_TOOLS_HERMES;
    snprintf(cs->name, sizeof cs->name, "%s (jinja; tool calls: %s)", source,
             serve_tool_format_name(ctx->tool_format));
    return 0;
}

int serve_chat_setup_open(serve_chat_setup *cs, const moex_model *m, const char *name, const char *file,
                          serve_openai_ctx *ctx, moex_error *err) {
    memset(cs, 0, sizeof *cs);
    token_text(m, m->tok ? moex_tokenizer_bos(m->tok) : -1, cs->bos, sizeof cs->bos);
    token_text(m, m->tok ? moex_tokenizer_eos(m->tok) : -1, cs->eos, sizeof cs->eos);
    ctx->bos_token = cs->bos;
    ctx->eos_token = cs->eos;
    ctx->strip_bos = m->tok && moex_tokenizer_adds_bos(m->tok);
    ctx->jinja = NULL;
    ctx->tool_format = SERVE_TOOLS_NONE;
    if (name && file) return moex_fail(err, "--chat-template and --chat-template-file: pass one");
    if (name) {   /* a built-in rendering, by llama.cpp's name */
        if (moex_chat_template_of(m->gguf, name, &ctx->chat, err)) return -1;
        snprintf(cs->name, sizeof cs->name, "%s (built-in)", moex_chat_name(ctx->chat));
        return 0;
    }
    if (file) {
        size_t len;
        char *text = read_text_file(file, &len, err);
        const int rc = text ? use_jinja(cs, text, len, file, ctx, err) : -1;
        free(text);
        return rc;
    }
    const moex_gguf_kv *kv = m->gguf ? moex_gguf_find(m->gguf, "tokenizer.chat_template") : NULL;
    if (!kv) return use_jinja(cs, default_template, strlen(default_template), "chatml", ctx, err);
    if (kv->value.type != MOEX_GGUF_STRING)
        return moex_fail(err, "tokenizer.chat_template is not a string: pass --chat-template-file or --chat-template");
    moex_error why = {0};
    if (!use_jinja(cs, kv->value.v.str.data, kv->value.v.str.len, "the model's template", ctx, &why)) return 0;
    /* a template this interpreter cannot read: the built-in rendering of its family, if it is a known one */
    if (moex_chat_template_of(m->gguf, NULL, &ctx->chat, err))
        return moex_fail(err, "the model's chat template: %s; and it is none of the built-in ones: pass "
                         "--chat-template-file FILE or --chat-template NAME", why.msg);
    moex_log(MOEX_LOG_WARN, "the model's chat template: %s; rendering chats with the built-in %s (no tools)", why.msg,
             moex_chat_name(ctx->chat));
    snprintf(cs->name, sizeof cs->name, "%s (built-in)", moex_chat_name(ctx->chat));
    return 0;
}

void serve_chat_setup_close(serve_chat_setup *cs) {
    moex_jinja_free(cs->jinja);
    cs->jinja = NULL;
}
