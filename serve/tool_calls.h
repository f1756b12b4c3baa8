/* Tool calls in the text a model writes, per chat-template family: which
 * format a template uses, the calls parsed out of an answer (whole or as it
 * streams), and the grammar a forced call must follow (tool_choice
 * "required" or a named function). Private to the serve module. */
#ifndef MOEX_SERVE_TOOL_CALLS_H
#define MOEX_SERVE_TOOL_CALLS_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "common/error.h"

typedef enum serve_tool_format {
    SERVE_TOOLS_NONE = 0,     /* the template takes no tools: calls are never parsed */
    SERVE_TOOLS_HERMES,       /* Qwen2.5/Qwen3/Hermes: <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call> */
    SERVE_TOOLS_LLAMA3,       /* Llama 3.x: {"name": N, "parameters": {...}} (optionally after <|python_tag|>) */
    SERVE_TOOLS_HARMONY,      /* gpt-oss: <|start|>assistant<|channel|>commentary to=functions.N <|constrain|>json<|message|>{...}<|call|> */
    SERVE_TOOLS_DEEPSEEK_V3,  /* <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{...}\n```<｜tool▁call▁end｜>... */
    SERVE_TOOLS_KIMI_K2,      /* <|tool_calls_section_begin|><|tool_call_begin|>functions.N:i<|tool_call_argument_begin|>{...}<|tool_call_end|>... */
    SERVE_TOOLS_GLM45,        /* <tool_call>N\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call> */
    SERVE_TOOLS_QWEN3_CODER,  /* Qwen3-Coder, Qwen3.5: <tool_call>\n<function=N>\n<parameter=k>\nv\n</parameter>\n</function>\n</tool_call> */
    SERVE_TOOLS_DEEPSEEK_V31, /* DeepSeek V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
                               * (parsed like DEEPSEEK_V3, which takes both; only the grammar differs) */
    SERVE_TOOLS_DSML,         /* DeepSeek V3.2/V4: <｜DSML｜function_calls>\n<｜DSML｜invoke name="N">\n
                               * <｜DSML｜parameter name="k" string="true|false">v</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls> */
    SERVE_TOOLS_FORMAT_COUNT
} serve_tool_format;

/* The format a Jinja chat template's tool-call markup stands for (NONE when it has none). */
serve_tool_format serve_tool_format_detect(const char *template_text);
const char *serve_tool_format_name(serve_tool_format f);

/* Splits a whole answer into its plain text (*content, malloc'd, "" when
 * none) and its calls (*calls: a cJSON array, possibly empty, of OpenAI
 * tool_calls {"id": "call_<k>", "type": "function", "function": {"name": N,
 * "arguments": "<JSON text>"}}). ids are "call_" + id_prefix + index.
 * It is the stream below fed the whole answer at once, so the two agree:
 *  - a call is taken once its header is whole (marker, name, and the '{' of
 *    JSON arguments); text that looks like a call but whose header does not
 *    parse, or breaks off, stays in content as written;
 *  - JSON arguments are the text the model wrote, from '{' to its matching
 *    '}' (not re-serialised). If a byte JSON cannot have comes outside a
 *    string, the arguments end before it and the rest is read as text; a call
 *    cut off (max_tokens) keeps what it had: in both cases the arguments are
 *    not valid JSON (as OpenAI's are with finish_reason "length");
 *  - XML-style formats (GLM, Qwen3-Coder, DSML) get a compact JSON object
 *    built from their parameters (see serve_tool_calls_parse_ex);
 *  - blank space around calls is dropped; text before, between and after
 *    them is content. Harmony: the final channel and commentary preambles are
 *    content, the analysis channel is reasoning (serve_tool_calls_parse_ex).
 * The text must hold the special tokens' text (<|channel|>, <｜tool▁sep｜>...). */
int serve_tool_calls_parse(serve_tool_format f, const char *text, size_t len, const char *id_prefix, char **content,
                           cJSON **calls, moex_error *err);

/* The same as text streams in. Each feed returns what can be said now: plain
 * text (*content, malloc'd or NULL) and OpenAI delta tool_calls (*deltas: a
 * cJSON array or NULL; the first delta of call i carries index, id, type,
 * function.name and function.arguments "", later ones {index,
 * function.arguments} pieces). Text that may be the start of a call is held
 * back until it is known; pieces may be cut anywhere (inside a marker or a
 * UTF-8 character) and nothing returned ends inside a UTF-8 character.
 * JSON arguments stream as the model writes them; XML-style ones as the
 * object is built: string values (typed by DSML or the tools' schemas) as
 * they come, others whole as each closes. final: the answer ended (a last piece, possibly empty).
 * The concatenation of all content and of each call's deltas equals
 * serve_tool_calls_parse's answer, whatever the pieces. Memory: the bytes not
 * decided yet (a header, at most 4 KiB, or an XML parameter's value). */
typedef struct serve_tool_stream serve_tool_stream;
serve_tool_stream *serve_tool_stream_create(serve_tool_format f, const char *id_prefix);
int serve_tool_stream_feed(serve_tool_stream *s, const char *piece, size_t len, bool final, char **content,
                           cJSON **deltas, moex_error *err);
/* The number of calls begun so far (a finish_reason of "tool_calls" when > 0). */
int serve_tool_stream_calls(const serve_tool_stream *s);
void serve_tool_stream_free(serve_tool_stream *s);

/* The same with the request's tools (NULL: none known), which type the values
 * of XML-style formats (GLM, Qwen3-Coder, DSML: a parameter whose schema
 * allows strings stays the text written; others are JSON when they parse),
 * and the reasoning the format carries in its own markup (gpt-oss harmony's
 * analysis channel; "" for the others: <think> is serve/reasoning.h's). */
int serve_tool_calls_parse_ex(serve_tool_format f, const cJSON *tools, const char *text, size_t len,
                              const char *id_prefix, char **content, char **reasoning, cJSON **calls, moex_error *err);
serve_tool_stream *serve_tool_stream_create_ex(serve_tool_format f, const char *id_prefix, const cJSON *tools);
/* feed with the format's reasoning as a third output (*reasoning, malloc'd or NULL; reasoning may be NULL). */
int serve_tool_stream_feed_ex(serve_tool_stream *s, const char *piece, size_t len, bool final, char **content,
                              char **reasoning, cJSON **deltas, moex_error *err);

/* 1 when a parameter's JSON schema allows strings (or says nothing of its
 * type), 0 when it rules them out, -1 when only the value can tell (enum,
 * const, anyOf, oneOf). */
int serve_tool_param_is_string(const cJSON *schema);

/* GBNF (root rule "root") for an answer that is one or more calls in format f
 * (only_name: exactly one call of that function; NULL: any of tools, one or
 * more, or exactly one when `one`) with each call's arguments following its function's JSON schema
 * ("parameters"; none: any object). Uses serve_json_schema_gbnf
 * (serve/grammar.h); rules other than root are named tc-... and tool-<i>-...
 * Each format's calls are written as its template renders them, and parse
 * back with serve_tool_calls_parse. Harmony: an optional analysis message,
 * then one call, ending after its arguments (<|call|> is an end-of-generation
 * token). XML-style formats: parameters in the schema's order, required ones
 * always; a string value may not hold "</". malloc'd, or NULL with err. */
char *serve_tool_calls_gbnf(serve_tool_format f, const cJSON *tools, const char *only_name, bool one,
                            moex_error *err);

#endif
