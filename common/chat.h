/* Chat templates: a conversation (role, content) rendered as the prompt text
 * a chat model was trained on. The kind is recognised from the GGUF's
 * tokenizer.chat_template (a Jinja text) by the markers llama.cpp looks for
 * (llm_chat_detect_template); the renderings are llama.cpp's built-in ones.
 * Part of the common module's API (common/common.h). */
#ifndef MOEX_CHAT_H
#define MOEX_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/gguf.h"

typedef enum moex_chat_template {
    MOEX_CHAT_UNKNOWN = 0,
    MOEX_CHAT_CHATML,            /* <|im_start|>role\n...<|im_end|>\n: ChatML, Qwen2, Qwen3 */
    MOEX_CHAT_LLAMA3,            /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    MOEX_CHAT_LLAMA2,            /* [INST] ... [/INST]; a system message is prepended to the first turn */
    MOEX_CHAT_LLAMA2_SYS,        /* with <<SYS>> ... <</SYS>> */
    MOEX_CHAT_LLAMA2_SYS_BOS,    /* and <s> before each later [INST] */
    MOEX_CHAT_LLAMA2_SYS_STRIP,  /* and contents stripped of surrounding spaces */
    MOEX_CHAT_MISTRAL_V1,        /* " [INST] ... [/INST]" */
    MOEX_CHAT_MISTRAL_V3,        /* "[INST] ...[/INST]" */
    MOEX_CHAT_MISTRAL_V3_TEKKEN, /* "[INST]...[/INST]" */
    MOEX_CHAT_MISTRAL_V7,        /* [SYSTEM_PROMPT] ... [/SYSTEM_PROMPT][INST] ...[/INST] */
    MOEX_CHAT_TEMPLATE_COUNT
} moex_chat_template;

typedef struct moex_chat_msg {
    const char *role;      /* "system", "user" or "assistant" */
    const char *content;   /* NUL-terminated */
} moex_chat_msg;

/* The kind a Jinja template text stands for; MOEX_CHAT_UNKNOWN when it is
 * none of the kinds above (including ones llama.cpp knows that are not here). */
moex_chat_template moex_chat_detect(const char *text, size_t len);
/* "chatml", "llama3", "llama2", "llama2-sys", "llama2-sys-bos",
 * "llama2-sys-strip", "mistral-v1", "mistral-v3", "mistral-v3-tekken",
 * "mistral-v7" (llama.cpp's names); UNKNOWN for anything else. */
moex_chat_template moex_chat_from_name(const char *name);
const char *moex_chat_name(moex_chat_template t);
/* The names above, comma-separated (for messages). */
const char *moex_chat_names(void);

/* The template to use for a model: `name` when given (--chat-template),
 * else the one tokenizer.chat_template stands for; a file without a
 * template gets ChatML (llama.cpp's default). An unknown name or an
 * unrecognised template text is an error that says to pass --chat-template. */
int moex_chat_template_of(const moex_gguf *g, const char *name, moex_chat_template *out, moex_error *err);

/* Renders msgs[0..n) (and, with add_assistant, the opening of the
 * assistant's turn) into buf. Returns the length without the NUL; when it
 * is >= cap nothing useful is in buf and the caller retries with length + 1.
 * -1 (err set) for an unknown template or a message without role/content. */
int64_t moex_chat_apply(moex_chat_template t, const moex_chat_msg *msgs, int n, bool add_assistant, char *buf,
                        int64_t cap, moex_error *err);

#endif
