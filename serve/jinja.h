/* Jinja chat templates: the subset of Jinja2 that real chat templates use
 * (the GGUF's tokenizer.chat_template, Hugging Face's rendering rules:
 * trim_blocks, lstrip_blocks, loop controls, raise_exception, strftime_now,
 * tojson as transformers defines it), parsed once and rendered per request
 * with a JSON context. Python's jinja2 is the reference (tests/hub/test_templates.py).
 * Implemented in jinja_parse.c (lexer, parser), jinja_eval.c (statements,
 * expressions), jinja_builtins.c (filters, tests, methods, globals) and
 * jinja_value.c (values, Python printing, JSON); docs/API.md, "Chat templates".
 * Private to the serve module. */
#ifndef MOEX_SERVE_JINJA_H
#define MOEX_SERVE_JINJA_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "common/error.h"

typedef struct moex_jinja moex_jinja; /* a parsed template: immutable, shareable between threads */

/* Parses template text (len bytes, need not be NUL-terminated; bytes that are
 * not UTF-8 pass through). NULL with err ("line 12: Encountered unknown tag
 * 'foo'.") when it is not a template this subset reads. jinja2's rule for
 * unknown filters and tests holds: outside an if they fail the parse, inside
 * one only the render that reaches them. */
moex_jinja *moex_jinja_parse(const char *src, size_t len, moex_error *err);
void moex_jinja_free(moex_jinja *t);

/* Renders t with the members of ctx (a JSON object, or NULL: messages, tools,
 * add_generation_prompt, bos_token, eos_token, enable_thinking, ...) as its
 * variables; ctx must stay unchanged until it returns. JSON numbers with an
 * integral value become ints. now: the time strftime_now formats (seconds
 * since the epoch, UTC; lets tests pin it). Returns the text (malloc'd,
 * NUL-terminated; *len its length when len is not NULL), or NULL with err: a
 * runtime error ("line 40: 'foo' is undefined", jinja2's wording after the
 * line) or the template's own raise_exception("...") message, as it is.
 * Bounded: the output and every captured string at max_out bytes (0: 16 MiB),
 * the render's memory at 8 * max_out + 64 MiB, loops at 10 million iterations,
 * macro and expression nesting; a template that loops without end fails
 * instead of eating memory or time. */
char *moex_jinja_render(const moex_jinja *t, const cJSON *ctx, long long now, size_t max_out, size_t *len,
                        moex_error *err);

#endif
